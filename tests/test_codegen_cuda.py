"""CUDA code generation, compile-tested without a GPU.

- Numerics: the generated CUDA of every operator, of block graphs (grid x/y/z, replicated
  inputs, hoisting, body savers with fdim, every accumulator, online softmax, matmuls on the
  tensor-core and FMA paths with padded and batched tiles) and of the hand-built fused
  μGraphs of ``tests/graphs.py`` runs on emulated thread blocks (``-DMJ_EMU``, a host build
  of the same source; ``csrc/runtime/cuda/emu.h``) and must equal the float64 reference
  interpreter on fresh random inputs.
- Compilation: the same sources compile with nvcc for sm_90a and sm_80 (kernel-only
  translation units, grouped so nvcc runs a few times); one full XLA FFI build exports its
  handler; PTX of the f16 fused RMSNorm+matmul uses mma.sync and cp.async.
- Golden structure of the generated source, the GPU cost model, backend choice, errors.
- ``gpu``-marked tests run the kernels through XLA on a CUDA device; skipped without one.

Builds run concurrently in one module fixture and are cached by content, so a rerun is fast.
"""

from __future__ import annotations

import ctypes
import itertools
import os
import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import graphs as G
import numpy as np
import pytest
from tolerance import bad_elements, product_scale, rtol_for, typical

from mirage_jax.backend.cuda import cost as gpu_cost
from mirage_jax.backend.cuda.backend import CudaBackend
from mirage_jax.backend.cuda.build import build_cuda, find_nvcc, nvcc_command
from mirage_jax.backend.cuda.emit import TABLE, emit_cuda, plan_block
from mirage_jax.backend.cuda.emulate import emulate
from mirage_jax.errors import CompileError, RuntimeLoadError
from mirage_jax.interpret import evaluate
from mirage_jax.ir import (
    BF16,
    BOOL,
    F16,
    F32,
    F64,
    MASKED,
    BlockBuilder,
    DType,
    KernelBuilder,
    KernelGraph,
    Op,
    TensorType,
    ThreadBuilder,
    copy_into,
)
from mirage_jax.runtime import cuda as rt

N = -1  # "not mapped" in imap / omap / fdim
NVCC = find_nvcc()
# nvcc is part of the machine this project builds on: under CI its absence fails the compile
# tests (the builds raise CompileError naming nvcc) instead of skipping them
NO_NVCC = "nvcc not found: CUDA compile tests need the CUDA toolkit (nvcc 12+)"
needs_nvcc = pytest.mark.skipif(NVCC is None and not os.environ.get("CI"), reason=NO_NVCC)
needs_gpu = pytest.mark.skipif(not rt.gpu_available(), reason="no CUDA GPU backend in jax")




def T(*shape: int, dtype: DType = F32) -> TensorType:
    return TensorType(shape, dtype)


# ---------------------------------------------------------------------------- test graphs

UNARY_CASES = [
    (Op.EXP, {}, False), (Op.LOG, {}, True), (Op.SQUARE, {}, False), (Op.SQRT, {}, True),
    (Op.RSQRT, {}, True), (Op.SIGMOID, {}, False), (Op.SILU, {}, False), (Op.GELU, {}, False),
    (Op.TANH, {}, False), (Op.ERF, {}, False), (Op.ERFC, {}, False), (Op.RELU, {}, False),
    (Op.SIN, {}, False), (Op.COS, {}, False), (Op.SIGN, {}, False),
    (Op.NEG, {}, False),
    (Op.RECIPROCAL, {}, True), (Op.MUL_SCALAR, {"scalar": -1.75}, False),
    (Op.ADD_SCALAR, {"scalar": 0.3}, False), (Op.POW_SCALAR, {"exponent": 3.0}, False),
    (Op.POW_SCALAR, {"exponent": 1.7}, True), (Op.FINITE_OR, {"fill": -3.0}, False),
]  # fmt: skip
BINARY_OPS = [Op.ADD, Op.SUB, Op.MUL, Op.DIV, Op.MAX, Op.REM]
REDUCE_OPS = [Op.REDUCE_SUM, Op.REDUCE_MAX, Op.REDUCE_MEAN, Op.REDUCE_RMS]


def kernel_ops_graph() -> KernelGraph:
    """Every kernel-level op in f32: unary, broadcasting binary, reductions on every dim,
    concat, transpose, slices, reshape (an alias, copied out), cast, batched matmul with tails, and
    outputs that are an input or repeat another output."""
    kb = KernelBuilder()
    x, p = kb.input(T(3, 5, 7)), kb.input(T(3, 5, 7))
    row, col = kb.input(T(1, 5, 7)), kb.input(T(3, 5, 1))
    a, b = kb.input(T(2, 5, 9)), kb.input(T(2, 9, 70))
    c, d = kb.input(T(70, 33)), kb.input(T(33, 65))
    for op, attrs, positive in UNARY_CASES:
        kb.output(kb.apply(op, p if positive else x, **attrs))
    kb.output(kb.apply(Op.ERF_INV, kb.apply(Op.TANH, x)))  # its domain, (-1, 1)
    for op in BINARY_OPS:
        kb.output(kb.apply(op, x, row))
        kb.output(kb.apply(op, col, row))
    for op in REDUCE_OPS:
        for dim in range(3):
            kb.output(kb.apply(op, x, dim=dim))
    for dim in range(3):
        kb.output(kb.apply(Op.CONCAT, x, p, dim=dim))
    mask = kb.input(T(1, 5, 7, dtype=BOOL))
    for op in sorted(MASKED, key=lambda o: o.value):
        kb.output(kb.apply(op, mask, x, fill=-1.5))
    kb.output(kb.apply(Op.TRANSPOSE, x, perm=(2, 0, 1)))
    for dim in range(3):
        kb.output(kb.apply(Op.SLICE, x, dim=dim, start=1, size=2))
    kb.output(kb.apply(Op.RESHAPE, kb.apply(Op.EXP, x), shape=(15, 7)))
    kb.output(kb.apply(Op.CAST, kb.apply(Op.CAST, x, dtype=F16), dtype=F32))
    kb.output(kb.matmul(a, b))
    mm = kb.matmul(c, d)
    kb.output(mm)
    kb.output(mm)
    kb.output(x)
    return kb.build()


def kernel_dtypes_graph() -> KernelGraph:
    """f64, f16 and bf16 kernel-level ops (half types compute in float, round per op)."""
    kb = KernelBuilder()
    x64, w64 = kb.input(T(4, 33, dtype=F64)), kb.input(T(33, 6, dtype=F64))
    x16, w16 = kb.input(T(4, 24, dtype=F16)), kb.input(T(24, 8, dtype=F16))
    xb = kb.input(T(4, 24, dtype=BF16))
    kb.output(kb.apply(Op.GELU, kb.apply(Op.MUL_SCALAR, x64, scalar=0.1)))
    kb.output(kb.matmul(x64, w64))
    kb.output(kb.apply(Op.REDUCE_RMS, x64, dim=1))
    kb.output(kb.apply(Op.SILU, kb.apply(Op.MUL, x16, x16)))
    kb.output(kb.matmul(x16, w16))
    kb.output(kb.apply(Op.REDUCE_SUM, x16, dim=1))
    kb.output(kb.apply(Op.CAST, kb.apply(Op.ADD, xb, xb), dtype=F32))
    kb.output(kb.apply(Op.REDUCE_MAX, xb, dim=0))
    return kb.build()


def _block_elementwise() -> tuple[object, tuple[TensorType, ...]]:
    """Grid (2, 3, 2) over all three dims, broadcast operands replicated along grid axes,
    every unary and binary op, a cast to f16, an auto-fused chain and a thread graph."""
    args = (T(4, 6, 8), T(4, 6, 8), T(1, 6, 8), T(4, 1, 8))
    bb = BlockBuilder((2, 3, 2), 1, args)
    a = bb.input_iter(0, (0, 1, 2))
    p = bb.input_iter(1, (0, 1, 2))
    row = bb.input_iter(2, (N, 1, 2))
    col = bb.input_iter(3, (0, N, 2))
    full = (0, 1, 2)
    for op, attrs, positive in UNARY_CASES:
        bb.output_saver(bb.apply(op, p if positive else a, **attrs), full)
    for op in BINARY_OPS:
        bb.output_saver(bb.apply(op, a, row), full)
        bb.output_saver(bb.apply(op, col, row), full)  # both operands broadcast
    bb.output_saver(bb.apply(Op.CAST, a, dtype=F16), full)
    chain = bb.apply(Op.ADD, bb.apply(Op.SILU, bb.apply(Op.MUL, a, row)), col)
    bb.output_saver(chain, full)
    tb = ThreadBuilder()
    u, v = tb.input(a.type), tb.input(row.type)
    half = tb.apply(Op.CAST, tb.apply(Op.MUL, u, v), dtype=F16)
    tb.output(tb.apply(Op.CAST, tb.apply(Op.EXP, half), dtype=F32))
    bb.output_saver(bb.apply(Op.THREAD, a, row, graph=tb.build()), full)
    return bb.build(), args


def _block_loop_savers() -> tuple[object, tuple[TensorType, ...]]:
    """A for-loop over x's columns: reductions on both dims and concats saved every iteration
    (fdim), an invariant tile hoisted and saved once, and an invariant value used in the body."""
    args = (T(8, 32), T(8, 16))
    bb = BlockBuilder((2, 1, 1), 4, args)
    x = bb.input_iter(0, (0, N, N), 1)  # [4, 8] per iteration
    y = bb.input_iter(1, (0, N, N))  # [4, 16], invariant
    for op in REDUCE_OPS:
        bb.output_saver(bb.apply(op, x, dim=1), (0, N, N), 1)  # -> [8, 4]
        bb.output_saver(bb.apply(op, x, dim=0), (0, N, N), 1)  # -> [2, 32]
    bb.output_saver(bb.apply(Op.CONCAT, x, x, dim=1), (0, N, N), 1)
    bb.output_saver(bb.apply(Op.CONCAT, x, x, dim=0), (0, N, N), 1)
    ys = bb.apply(Op.REDUCE_SUM, bb.apply(Op.EXP, y), dim=1)  # invariant [4, 1]
    bb.output_saver(bb.apply(Op.TANH, y), (0, N, N))
    bb.output_saver(bb.apply(Op.SUB, x, ys), (0, N, N), 1)
    return bb.build(), args


def _block_accumulators() -> tuple[object, tuple[TensorType, ...]]:
    """Every accumulator with and without an in-tile dim, online softmax, an invariant
    accumulated R times, and an epilogue combining accumulators."""
    args = (T(8, 32), T(8, 4))
    bb = BlockBuilder((2, 1, 1), 4, args)
    x = bb.input_iter(0, (0, N, N), 1)  # [4, 8]
    y = bb.input_iter(1, (0, N, N))  # invariant [4, 4]
    outs = [
        bb.apply(Op.ACC_SUM, x), bb.apply(Op.ACC_SUM, x, dim=0), bb.apply(Op.ACC_SUM, x, dim=1),
        bb.apply(Op.ACC_MEAN, x), bb.apply(Op.ACC_MEAN, x, dim=1),
        bb.apply(Op.ACC_MAX, x), bb.apply(Op.ACC_MAX, x, dim=0), bb.apply(Op.ACC_MAX, x, dim=1),
        bb.apply(Op.ACC_RMS, x), bb.apply(Op.ACC_RMS, x, dim=1), bb.apply(Op.ACC_SUM, y),
    ]  # fmt: skip
    m = bb.apply(Op.REDUCE_MAX, x, dim=1)
    num = bb.apply(Op.ACC_RESCALE_SUM, bb.apply(Op.EXP, bb.apply(Op.SUB, x, m)), m)
    mx = bb.apply(Op.ACC_MAX, m)
    outs += [num, mx, bb.apply(Op.DIV, num, bb.apply(Op.ADD_SCALAR, mx, scalar=100.0))]
    for v in outs:
        bb.output_saver(v, (0, N, N))
    return bb.build(), args


def _block_matmuls() -> list[tuple[object, tuple[TensorType, ...]]]:
    out = []
    # f32, batch dims, one-shot (FMA path), relu epilogue on a body value saved per iteration
    args = (T(2, 6, 12), T(2, 12, 10))
    bb = BlockBuilder((2, 1, 1), 1, args)
    a, b = bb.input_iter(0, (0, N, N)), bb.input_iter(1, (0, N, N))
    bb.output_saver(bb.apply(Op.RELU, bb.matmul(a, b)), (0, N, N))
    out.append((bb.build(), args))
    # f16 on tensor cores, M=5, K=20, N=8 per block: every fragment dim padded; fused acc_sum
    args = (T(5, 40, dtype=F16), T(40, 24, dtype=F16))
    bb = BlockBuilder((3, 1, 1), 2, args)
    a, b = bb.input_iter(0, (N, N, N), 1), bb.input_iter(1, (1, N, N), 0)
    bb.output_saver(bb.apply(Op.ACC_SUM, bb.matmul(a, b)), (1, N, N))
    out.append((bb.build(), args))
    # bf16 batched tensor-core tiles with exact sizes, two fused accumulators sharing x
    args = (T(2, 16, 64, dtype=BF16), T(2, 64, 16, dtype=BF16), T(2, 64, 16, dtype=BF16))
    bb = BlockBuilder((2, 1, 1), 2, args)
    x = bb.input_iter(0, (0, N, N), 2)
    w1, w2 = bb.input_iter(1, (0, N, N), 1), bb.input_iter(2, (0, N, N), 1)
    a1 = bb.apply(Op.ACC_SUM, bb.matmul(x, w1))
    a2 = bb.apply(Op.ACC_SUM, bb.matmul(x, w2))
    bb.output_saver(bb.apply(Op.MUL, bb.apply(Op.SILU, a1), a2), (0, N, N))
    out.append((bb.build(), args))
    # f64 fused accumulator (FMA in double), and a one-shot f16 matmul in the body
    args = (T(4, 16, dtype=F64), T(16, 6, dtype=F64))
    bb = BlockBuilder((1, 1, 1), 4, args)
    a, b = bb.input_iter(0, (N, N, N), 1), bb.input_iter(1, (N, N, N), 0)
    bb.output_saver(bb.apply(Op.ACC_SUM, bb.matmul(a, b)), (N, N, N))
    out.append((bb.build(), args))
    args = (T(4, 32, dtype=F16), T(32, 16, dtype=F16))
    bb = BlockBuilder((2, 1, 1), 2, args)
    a, b = bb.input_iter(0, (N, N, N), 1), bb.input_iter(1, (1, N, N), 0)
    mm = bb.matmul(bb.apply(Op.MUL_SCALAR, a, scalar=0.5), b)  # f16 operand computed in-block
    bb.output_saver(bb.apply(Op.ACC_MAX, mm), (1, N, N))
    out.append((bb.build(), args))
    return out


def block_graph(blocks: list[tuple[object, tuple[TensorType, ...]]]) -> KernelGraph:
    """One kernel graph running several block graphs side by side (one translation unit)."""
    kb = KernelBuilder()
    for block, args in blocks:
        ins = [kb.input(t) for t in args]
        for y in kb.graph_def(block, *ins):
            kb.output(y)
    return kb.build()


def combine(graphs: list[KernelGraph]) -> KernelGraph:
    """Several kernel graphs as one: their inputs and outputs concatenated in order."""
    kb = KernelBuilder()
    for g in graphs:
        copy_into(kb, g)
    return kb.build()


def fused_graphs() -> dict[str, KernelGraph]:
    return {
        "rmsnorm_linear": G.rmsnorm_linear_fused(8, 256, 128, grid=(2, 2), loop=4),
        "rmsnorm_linear_f16": G.rmsnorm_linear_fused(
            8, 256, 128, grid=(2, 1), loop=4, dtype=F16
        ),
        "rmsnorm_linear_mean": G.rmsnorm_linear_fused(
            16, 128, 64, grid=(2, 1), loop=2, use_acc_mean=True
        ),
        "gated_mlp": G.gated_mlp_fused(16, 128, 64, grid=(2, 1), loop=4),
        "gated_mlp_bf16": G.gated_mlp_fused(
            16, 128, 64, grid=(2, 2), loop=2, thread=True, dtype=BF16
        ),
        "attention": G.attention_fused(2, 16, 32, 128, row_blocks=2, loop=4),
        "attention_f16": G.attention_fused(2, 16, 32, 128, loop=4, dtype=F16),
        "flash_decoding": G.flash_decoding_split(2, 8, 32, 128, splits=2, loop=2),
        "masked_attention": G.masked_attention_fused(2, 16, 32, 128, loop=4),
        "masked_attention_plain": G.masked_attention_plain(2, 8, 16, 64, fill=-1e9),
    }


def coverage_tols(name: str, g: KernelGraph) -> dict[int, float]:
    """The op-coverage outputs that pass through an f16 cast the reference ignores: the
    kernel-level cast round trip, and the block graph's thread graph with a cast inside."""
    if name == "kernel_ops":
        casts = [i for i, n in enumerate(g.outputs) if g.producer(n.ins[0]).op is Op.CAST]
        return {i: TOL[F16] for i in casts}  # one rounding to f16 and back
    if name == "block_ops":
        return {len(UNARY_CASES) + 2 * len(BINARY_OPS) + 2: LOOSE}
    return {}


def fused_scales(xs: list[np.ndarray], only: str | None = None) -> dict[int, np.ndarray]:
    """Per-output error scales of the fused graphs combined (or of graph ``only``) on inputs
    ``xs``: a gated product's is its factors' (x w1 and x w2; tests/tolerance.py)."""
    graphs = fused_graphs()
    names = [only] if only else list(graphs)
    scales, arg, out = {}, 0, 0
    for name in names:
        g = graphs[name]
        if name.startswith("gated_mlp"):
            x, w1, w2 = (a.astype(np.float64) for a in xs[arg : arg + 3])
            scales[out] = product_scale(x @ w1, x @ w2)
        arg, out = arg + len(g.input_types), out + len(g.output_types)
    return scales


def all_graphs() -> dict[str, KernelGraph]:
    return {
        "kernel_ops": kernel_ops_graph(),
        "kernel_dtypes": kernel_dtypes_graph(),
        "block_ops": block_graph(
            [_block_elementwise(), _block_loop_savers(), _block_accumulators()]
        ),
        "block_matmuls": block_graph(_block_matmuls()),
        "fused": combine(list(fused_graphs().values())),
    }


# ---------------------------------------------------------------------------------- builds

EMU_SYMBOL = "mjt_{}"


@pytest.fixture(scope="module")
def builds() -> dict[str, object]:
    """Every emulation library and the nvcc kernel-only builds, compiled concurrently."""
    if NVCC is None:
        if os.environ.get("CI"):
            pytest.fail(f"{NO_NVCC}; CI machines have it (set MIRAGE_JAX_NVCC or PATH)")
        pytest.skip(NO_NVCC)
    graphs = all_graphs()
    jobs = {f"emu:{name}": (emit_cuda(g, EMU_SYMBOL.format(name)), "emu", "sm_90a")
            for name, g in graphs.items()}  # fmt: skip
    # sm_90a: kernels and the host code launching them (referenced, so nvcc compiles it)
    host = [name for name in graphs if name != "block_ops"]
    refs = ", ".join(f"(void*)&mjk_{name}_run" for name in host)
    together = "\n".join(emit_cuda(graphs[name], f"mjk_{name}") for name in host)
    together += f'extern "C" {{ void* mjk_runs[] = {{{refs}}}; }}\n'
    jobs["obj:sm_90a"] = (together, "obj", "sm_90a")
    # sm_80: the block kernels, where cp.async and mma.sync depend on the arch
    blocks = ("block_ops", "block_matmuls", "fused")
    jobs["cubin:sm_80"] = ("\n".join(emit_cuda(graphs[n], f"mjk_{n}") for n in blocks), "cubin",
                           "sm_80")  # fmt: skip
    ffi_graph = G.gated_mlp_fused(16, 128, 64, grid=(2, 1), loop=4, dtype=F16)
    jobs["shared:ffi"] = (emit_cuda(ffi_graph, "mjt_ffi_handler"), "shared", "sm_90a")
    jobs["ptx:rmsnorm_f16"] = (
        emit_cuda(fused_graphs()["rmsnorm_linear_f16"], "mjp_rms"), "ptx", "sm_90a")
    with ThreadPoolExecutor(max_workers=2) as pool:
        futures = {key: pool.submit(build_cuda, src, kind=kind, arch=arch, name_hint=key)
                   for key, (src, kind, arch) in jobs.items()}  # fmt: skip
        return {"graphs": graphs, **{key: f.result() for key, f in futures.items()}}


def run_emulated(lib_path: Path, symbol: str, graph: KernelGraph, inputs) -> list[np.ndarray]:
    lib = ctypes.CDLL(str(lib_path))
    outs = [np.empty(t.shape, t.dtype.numpy) for t in graph.output_types]
    ins = (ctypes.c_void_p * len(inputs))(*[x.ctypes.data for x in inputs])
    ptrs = (ctypes.c_void_p * len(outs))(*[y.ctypes.data for y in outs])
    fn = getattr(lib, f"{symbol}_emu")
    fn.restype = ctypes.c_int
    assert fn(ins, ptrs) == 0
    return outs


# Per element, of |want| + the output's typical magnitude (tests/tolerance.py): float32 1e-5,
# float64 1e-12, half types a few units of their rounding (f16 2.5e-3, bf16 1.6e-2), which
# half-precision accumulation exceeds (test_the_tolerance_rejects_half_precision_accumulation).
TOL = {t: rtol_for(t.numpy) for t in (F32, F64, F16, BF16)}
# f32 results of an exp of a product rounded to f16 on the way (the reference rounds nothing):
# the product's rounding, |u v| (up to ~10) units of f16, becomes the result's relative error
LOOSE = 1e-2


def compare(g: np.ndarray, w: np.ndarray, t: TensorType, tol: float, what: str,
            scale: np.ndarray | None = None) -> None:  # fmt: skip
    """One output against its float64 reference, element by element."""
    assert g.shape == t.shape and g.dtype == t.dtype.numpy, what
    bad = bad_elements(g, w, tol, scale)
    assert not bad.any(), (
        f"{what} {t}: {int(bad.sum())} elements off by more than {tol:g} of the error scale "
        f"(typical |want| {typical(w):.3g}), first at {np.argwhere(bad)[0].tolist()}: got "
        f"{g.astype(np.float64)[bad][0]!r}, want {w[bad][0]!r}"
    )


def check(got: list[np.ndarray], graph: KernelGraph, inputs, what: str = "",
          tols: dict[int, float] | None = None,
          scales: dict[int, np.ndarray] | None = None) -> None:  # fmt: skip
    """Outputs equal the float64 reference within their dtype's tolerance, or the one ``tols``
    gives them by output index, at the default error scale or the one ``scales`` gives."""
    want = evaluate(graph, inputs, precision="float64")
    assert len(got) == len(want) == len(graph.output_types)
    for i, (g, w, t) in enumerate(zip(got, want, graph.output_types)):
        compare(g, w, t, (tols or {}).get(i, TOL[t.dtype]), f"{what} output {i}",
                (scales or {}).get(i))  # fmt: skip


@pytest.fixture
def rng() -> np.random.Generator:
    seed = int(np.random.SeedSequence().entropy % 2**32)
    print(f"random inputs from seed {seed}")  # shown by pytest when a test fails
    return np.random.default_rng(seed)


def inputs_for(graph: KernelGraph, rng: np.random.Generator, scale: float = 1.0):
    """Unit normals (masks: random, about half kept); inputs named positive by the graphs (p,
    lengths) are made positive by taking abs + 0.1 of every second input of the op-coverage
    graphs."""
    return [rng.random(t.shape) < 0.5 if t.dtype is BOOL else
            (scale * rng.standard_normal(t.shape)).astype(t.dtype.numpy)
            for t in graph.input_types]  # fmt: skip


def _positive(xs, which):
    for i in which:
        xs[i] = (np.abs(xs[i].astype(np.float64)) + 0.1).astype(xs[i].dtype)
    return xs


# ------------------------------------------------------------------------------- numerics


@needs_nvcc
def test_kernel_level_ops_match_the_reference(builds, rng) -> None:
    g = builds["graphs"]["kernel_ops"]
    xs = _positive(inputs_for(g, rng), [1])
    got = run_emulated(builds["emu:kernel_ops"], "mjt_kernel_ops", g, xs)
    got = run_emulated(builds["emu:kernel_ops"], "mjt_kernel_ops", g, xs)
    check(got, g, xs, "kernel ops", coverage_tols("kernel_ops", g))


@needs_nvcc
def test_kernel_level_half_and_double(builds, rng) -> None:
    g = builds["graphs"]["kernel_dtypes"]
    xs = inputs_for(g, rng)
    got = run_emulated(builds["emu:kernel_dtypes"], "mjt_kernel_dtypes", g, xs)
    check(got, g, xs, "dtypes")


@needs_nvcc
def test_block_ops_grid_loop_and_accumulators(builds, rng) -> None:
    g = builds["graphs"]["block_ops"]
    xs = _positive(inputs_for(g, rng), [1])
    got = run_emulated(builds["emu:block_ops"], "mjt_block_ops", g, xs)
    check(got, g, xs, "block ops", coverage_tols("block_ops", g))


@needs_nvcc
def test_block_matmuls_tensor_core_and_fma(builds, rng) -> None:
    g = builds["graphs"]["block_matmuls"]
    xs = inputs_for(g, rng, scale=0.5)
    check(run_emulated(builds["emu:block_matmuls"], "mjt_block_matmuls", g, xs), g, xs, "mm")


@needs_nvcc
def test_fused_graphs_match_the_reference(builds, rng) -> None:
    """FlashAttention / FlashDecoding online softmax, RMSNorm+matmul and gated MLP in f32,
    f16 and bf16, each as the CUDA the emitter generates for it."""
    g = builds["graphs"]["fused"]
    xs = inputs_for(g, rng, scale=0.5)
    got = run_emulated(builds["emu:fused"], "mjt_fused", g, xs)
    check(got, g, xs, "fused", scales=fused_scales(xs))


def _accumulated_in(x: np.ndarray, w: np.ndarray, acc_dtype) -> np.ndarray:
    """x @ w with products in float32 summed one k at a time in ``acc_dtype``."""
    acc = np.zeros((x.shape[0], w.shape[1]), acc_dtype)
    for k in range(x.shape[1]):
        term = x[:, k : k + 1].astype(np.float32) * w[k : k + 1, :].astype(np.float32)
        acc = (acc.astype(np.float32) + term).astype(acc_dtype)
    return acc.astype(x.dtype)


@pytest.mark.parametrize("dtype", [F16, BF16])
def test_the_tolerance_rejects_half_precision_accumulation(dtype: DType, rng) -> None:
    """A control: a 256-term product accumulated in float32 and rounded once passes its
    dtype's tolerance; accumulated in the half type itself (what the old tolerances, f16 8e-3
    and bf16 4e-2 of the largest element, accepted) it must not."""
    t = T(8, 64, dtype=dtype)
    x = (0.5 * rng.standard_normal((8, 256))).astype(dtype.numpy)
    w = (0.5 * rng.standard_normal((256, 64))).astype(dtype.numpy)
    want = x.astype(np.float64) @ w.astype(np.float64)
    compare(_accumulated_in(x, w, np.float32), want, t, TOL[dtype], "float32 accumulator")
    with pytest.raises(AssertionError, match="elements off"):
        compare(_accumulated_in(x, w, dtype.numpy), want, t, TOL[dtype], "half accumulator")


@needs_nvcc
def test_emulation_catches_a_broken_kernel(rng) -> None:
    """The harness can fail: a wrong μGraph variant (matmul accumulated with max) differs."""
    bad = G.rmsnorm_linear_fused(8, 256, 128, grid=(2, 2), loop=4, variant="acc_max")
    xs = inputs_for(bad, rng)
    got = emulate(bad, xs)
    ref = evaluate(G.rmsnorm_linear_fused(8, 256, 128, grid=(2, 2), loop=4), xs,
                   precision="float64")  # fmt: skip
    assert np.max(np.abs(got[0] - ref[0])) > 1e-2 * np.max(np.abs(ref[0]))


@needs_nvcc
def test_aliased_outputs_are_written_in_place_or_copied(rng) -> None:
    g, copied = G.aliasing_graph()
    source = emit_cuda(g, "k")
    assert {int(k) for k in re.findall(r"MJ_MEMCPY\(outputs\[(\d+)\]", source)} == copied
    # exp's launch writes straight into output 0
    (out0,) = re.findall(r"(\w+) = reinterpret_cast<float\*>\(outputs\[0\]\);", source)
    (dest,) = re.findall(r"k_unary<mj::op::Exp,[^\n]*stream, (\w+), ", source)
    assert dest == out0
    xs = inputs_for(g, rng)
    check(emulate(g, xs), g, xs, "aliasing")


@needs_nvcc
def test_emulated_shared_memory_starts_as_nan() -> None:
    """Reading a tile nobody wrote gives NaN in emulation, so missing loads cannot hide."""
    src = emit_cuda(block_graph([_block_accumulators()]), "mjt_poison")
    # remove the accumulator initialisation: the results must turn NaN
    broken = re.sub(r"mj::fill<NT, [^;]*;", "", src)
    assert broken != src
    g = block_graph([_block_accumulators()])
    lib = build_cuda(broken, kind="emu", name_hint="poison")
    xs = [np.ones(t.shape, np.float32) for t in g.input_types]
    got = run_emulated(lib, "mjt_poison", g, xs)
    assert np.isnan(got[0]).all()


# --------------------------------------------------------------------------- compilation


@needs_nvcc
def test_every_test_graph_compiles_for_sm90a_and_sm80(builds) -> None:
    """Kernels and launch code for sm_90a (an object file), block kernels for sm_80."""
    for key in ("obj:sm_90a", "cubin:sm_80"):
        binary = Path(builds[key]).read_bytes()
        assert len(binary) > 10_000
        assert b"mjk_fused_b" in binary  # the fused kernels are in it
    assert b"mjk_runs" in Path(builds["obj:sm_90a"]).read_bytes()


@needs_nvcc
def test_f16_fused_rmsnorm_uses_tensor_cores_and_cp_async(builds) -> None:
    ptx = Path(builds["ptx:rmsnorm_f16"]).read_text()
    assert "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32" in ptx
    assert "cp.async.cg.shared.global" in ptx and "cp.async.wait_group 1" in ptx


@needs_nvcc
def test_full_ffi_build_exports_the_handler(builds) -> None:
    """The one full build: nvcc with the XLA FFI headers, loadable without a GPU."""
    handle = ctypes.CDLL(str(builds["shared:ffi"]))
    assert handle.mjt_ffi_handler  # the XLA_FFI_DEFINE_HANDLER_SYMBOL symbol
    assert not hasattr(handle, "mjt_ffi_handler_emu")


@needs_nvcc
def test_compile_error_carries_the_log_and_source() -> None:
    with pytest.raises(CompileError) as err:
        build_cuda('#include "cuda/mj_cuda.cuh"\nthis is not cuda;\n', kind="cubin",
                   name_hint="broken")  # fmt: skip
    cause = err.value.cause
    # nvcc's own diagnostic, naming the broken line (2) and quoting it
    assert "nvcc exit 1" in cause and re.search(r"\.cu\(2\): error: ", cause), cause
    assert "this is not cuda;" in cause, cause
    kept = Path(re.search(r"source: (\S+)", err.value.cause).group(1))
    assert kept.read_text().startswith('#include "cuda/mj_cuda.cuh"')


def test_missing_nvcc_is_a_clear_compile_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MIRAGE_JAX_NVCC", "/nonexistent/nvcc")
    with pytest.raises(CompileError, match="nvcc") as err:
        build_cuda(emit_cuda(G.gated_mlp_plain(2, 8, 8), "mjt_x"))
    assert "CUDA toolkit" in err.value.remedy


def test_unknown_arch_and_kind_are_rejected(monkeypatch: pytest.MonkeyPatch) -> None:
    """Both are refused before nvcc runs (or is even looked for)."""
    monkeypatch.setenv("MIRAGE_JAX_NVCC", "/nonexistent/nvcc")
    with pytest.raises(CompileError, match="unknown CUDA build kind 'fatbin'") as err:
        build_cuda("", kind="fatbin")
    assert "shared" in err.value.remedy
    with pytest.raises(CompileError, match="unknown CUDA arch 'sm_70'") as err:
        nvcc_command("cubin", "sm_70", Path("k.cu"), Path("k.cubin"), "/nonexistent/nvcc")
    assert "sm_90a" in err.value.remedy and "sm_80" in err.value.remedy


@needs_nvcc
def test_build_cuda_rejects_an_unknown_arch() -> None:
    with pytest.raises(CompileError, match="unknown CUDA arch 'sm_70'"):
        build_cuda("", arch="sm_70")


# --------------------------------------------------------------------- generated source


def test_table_covers_every_op() -> None:
    assert set(TABLE) == set(Op)


def test_fused_rmsnorm_linear_source_structure() -> None:
    """One __global__ kernel; the matmul accumulates in registers through the mma template;
    the loop-varying tiles are double-buffered and prefetched one iteration ahead."""
    g = G.rmsnorm_linear_fused(16, 4096, 6144, grid=(96, 1), loop=64, dtype=F16)
    src = emit_cuda(g, "mj_rms")
    assert src.count("__global__") == 1
    assert re.search(r"mj::Accumulator<NT, mj::Shape<16,64>, mj::Shape<64,64>, mj::half, "
                     r"mj::half> r\d+;", src)  # fmt: skip
    assert re.search(r"r\d+\.mma\(v\d+, v\d+\);", src) and re.search(r"r\d+\.store\(v\d+\);", src)
    loop = src[src.index("for (int it = 0; it < 64; ++it)") :]
    prefetch = loop[loop.index("if (it + 1 < 64)") : loop.index("mj::cp_async_wait<1>();")]
    assert prefetch.count("mj::load_tile_async<") == 3
    assert "(st ^ 1)" in prefetch and "in2 + bx * 64 + (it + 1) * 393216" in prefetch
    assert re.search(r"MJ_LAUNCH\(\(mj_rms_b\w+\), dim3\(96, 1, 1\), dim3\(128\)", src)
    assert "XLA_FFI_DEFINE_HANDLER_SYMBOL(mj_rms, mj_rms_ffi," in src
    assert ".Ctx<ffi::PlatformStream<cudaStream_t>>()" in src
    assert src.count(".Arg<ffi::Buffer<ffi::F16>>()") == 3
    plan = plan_block(g.block_graphs[0])
    assert plan.smem_bytes < 48 * 1024 and "MJ_SET_SMEM" not in src
    assert len(plan.double_buffered) == 3 and all(
        plan.buffers[f"v{v}"].stages == 2 for v in plan.double_buffered
    )


def test_shared_memory_is_reused_across_live_ranges() -> None:
    plan = plan_block(G.rmsnorm_linear_fused(8, 256, 128, grid=(2, 1), loop=4).block_graphs[0])
    total = sum(b.nbytes * b.stages for b in plan.buffers.values())
    assert plan.smem_bytes < total  # epilogue tiles reuse the loop's buffers
    # buffers live at the same time never overlap: the loop's tiles are all disjoint
    loop = [b for k, b in plan.buffers.items() if b.stages == 2]
    spans = sorted((b.offset, b.end) for b in loop)
    assert all(e <= s for (_, e), (s, _) in itertools.pairwise(spans))


def test_large_tiles_opt_into_more_shared_memory() -> None:
    g = G.rmsnorm_linear_fused(16, 4096, 6144, grid=(48, 1), loop=32)
    src = emit_cuda(g, "mj_big")
    smem = plan_block(g.block_graphs[0]).smem_bytes
    assert smem > 48 * 1024 and re.search(rf"MJ_SET_SMEM\(\(mj_big_b\w+\), {smem}\);", src)


def test_too_much_shared_memory_is_a_compile_error() -> None:
    g = G.rmsnorm_linear_fused(16, 4096, 6144, grid=(6, 1), loop=1)
    with pytest.raises(CompileError, match="shared memory") as err:
        emit_cuda(g, "mj_huge")
    assert "forloop range" in err.value.remedy


def test_symbol_must_be_a_c_identifier() -> None:
    with pytest.raises(CompileError, match="C identifier"):
        emit_cuda(G.gated_mlp_plain(2, 8, 8), "9bad-name")


def test_source_is_deterministic() -> None:
    a = emit_cuda(G.attention_fused(2, 16, 32, 128, loop=4), "mj_a")
    b = emit_cuda(G.attention_fused(2, 16, 32, 128, loop=4), "mj_a")
    assert a == b and len(a.splitlines()) < 300


# ----------------------------------------------------------------------------- cost model


def test_cost_model_rejects_shared_memory_over_the_limit_with_a_reason() -> None:
    g = G.rmsnorm_linear_fused(16, 4096, 6144, grid=(6, 1), loop=1)
    cost = gpu_cost.estimate(g)
    assert not cost.feasible and cost.time_s == float("inf")
    assert "KiB of shared memory per block" in cost.reason and "227 KiB" in cost.reason
    assert gpu_cost.reject_reason(g.block_graphs[0]) is not None


def test_cost_model_rejects_too_many_registers() -> None:
    """A 32x512 f32 accumulator per block: 64 accumulator registers per thread at 256
    threads; fine on an H200, rejected where a thread may hold only 64 registers."""
    args = (T(32, 64), T(64, 512))
    bb = BlockBuilder((1, 1, 1), 8, args)
    a, b = bb.input_iter(0, (N, N, N), 1), bb.input_iter(1, (N, N, N), 0)
    bb.output_saver(bb.apply(Op.ACC_SUM, bb.matmul(a, b)), (N, N, N))
    block = bb.build()
    plan = plan_block(block)
    assert plan.threads == 256 and plan.acc_registers == 64
    assert gpu_cost.reject_reason(block, gpu_cost.H200) is None
    small = gpu_cost.GpuSpec(name="small", max_regs_per_thread=64)
    reason = gpu_cost.reject_reason(block, small)
    assert reason is not None and "registers per thread" in reason


def test_cost_model_is_above_the_roofline_and_prefers_parallel_grids() -> None:
    spec = gpu_cost.H200
    fine = gpu_cost.estimate(G.rmsnorm_linear_fused(16, 4096, 6144, grid=(96, 1), loop=64))
    coarse = gpu_cost.estimate(G.rmsnorm_linear_fused(16, 4096, 6144, grid=(12, 1), loop=256))
    assert fine.feasible and coarse.feasible
    floor = (4096 * 6144 + 16 * 4096 + 16 * 6144) * 4 / spec.hbm_bytes_per_s
    assert floor < fine.time_s < coarse.time_s
    assert fine.bytes >= 4096 * 6144 * 4


def test_cost_model_tensor_cores_and_bandwidth() -> None:
    f32 = gpu_cost.estimate(G.gated_mlp_fused(256, 1024, 1024, grid=(16, 4), loop=16))
    f16 = gpu_cost.estimate(G.gated_mlp_fused(256, 1024, 1024, grid=(16, 4), loop=16,
                                              dtype=F16))  # fmt: skip
    assert f16.time_s < f32.time_s
    g = G.rmsnorm_linear_fused(16, 4096, 6144, grid=(192, 1), loop=16)  # memory-bound
    assert gpu_cost.estimate(g, gpu_cost.H100).time_s > 1.3 * gpu_cost.estimate(g).time_s


def test_cost_model_counts_kernel_level_launches() -> None:
    cost = gpu_cost.estimate(G.gated_mlp_plain(8, 4096, 4096))
    assert [k.what for k in cost.kernels] == ["matmul", "silu", "matmul", "mul"]
    assert cost.time_s > 2 * 4096 * 4096 * 4 / gpu_cost.H200.hbm_bytes_per_s


# ------------------------------------------------------------------------ registration


def test_registering_without_a_gpu_is_refused(tmp_path: Path) -> None:
    if rt.gpu_available():
        pytest.skip("a GPU is present")
    with pytest.raises(RuntimeLoadError, match="no CUDA GPU") as err:
        rt.load_cuda_kernel(tmp_path / "missing.so", "mj_nothing")
    assert "cuda" in err.value.remedy.lower()


# ------------------------------------------------------------------------------ on a GPU


@pytest.mark.gpu
@needs_gpu
@needs_nvcc
@pytest.mark.parametrize("name", sorted(fused_graphs()))
def test_fused_graphs_on_the_gpu(name: str, rng) -> None:
    import jax

    g = fused_graphs()[name]
    xs = inputs_for(g, rng, scale=0.5)
    call = jax.jit(CudaBackend().compile(g))
    got = [np.asarray(y) for y in call(*[jax.device_put(x, jax.devices("gpu")[0]) for x in xs])]
    check(got, g, xs, name, scales=fused_scales(xs, name))


@pytest.mark.gpu
@needs_gpu
@needs_nvcc
def test_op_coverage_on_the_gpu(rng) -> None:
    import jax

    for name in ("kernel_ops", "kernel_dtypes", "block_ops", "block_matmuls"):
        g = all_graphs()[name]
        xs = _positive(inputs_for(g, rng), [1]) if name in ("kernel_ops", "block_ops") else \
            inputs_for(g, rng, 0.5)  # fmt: skip
        got = [np.asarray(y) for y in jax.jit(CudaBackend().compile(g))(*xs)]
        check(got, g, xs, name, coverage_tols(name, g))
