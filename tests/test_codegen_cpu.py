"""CPU code generation: μGraph -> C++ -> shared library -> XLA FFI custom call inside jax.jit.

Every op and accumulator is emitted, compiled, run and compared with the float64 reference
interpreter (``mirage_jax.interpret.evaluate``) on fresh random inputs with odd shapes; block
graphs cover grids on x/y/z, for-loops, replicated inputs, hoisting and body savers with fdim;
the hand-built fused μGraphs of ``tests/graphs.py`` must equal ``jax.jit`` of the plain jnp
function. Ops are grouped into one kernel graph per test to keep the compile count low.
"""

from __future__ import annotations

import ctypes
import re
import shutil
import subprocess

import graphs as G
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from tolerance import assert_array_close, bad_elements, product_scale, typical

from mirage_jax.backend.cpu import isa
from mirage_jax.backend.cpu.emit import TABLE, emit_cpu, splits_loop
from mirage_jax.errors import CompileError
from mirage_jax.interpret import evaluate
from mirage_jax.ir import (
    BF16,
    BOOL,
    F16,
    F32,
    F64,
    BlockBuilder,
    BlockGraph,
    DType,
    KernelBuilder,
    KernelGraph,
    Op,
    Phase,
    TensorType,
    ThreadBuilder,
)
from mirage_jax.ir.fuse import fuse_elementwise
from mirage_jax.ir.ops import ACCUMULATORS

N = -1  # "not mapped" in imap / omap / fdim




def T(*shape: int, dtype: DType = F32) -> TensorType:
    return TensorType(shape, dtype)


# ---------------------------------------------------------------------------------- harness


def run_cpu(graph: KernelGraph, inputs: list[np.ndarray], flags: tuple[str, ...] = ()
            ) -> list[np.ndarray]:  # fmt: skip
    """Emit, compile (build.py), register (runtime) and call ``graph`` inside jax.jit."""
    from mirage_jax.backend.cpu.build import compile_shared_library
    from mirage_jax.backend.cpu.isa import host_isa
    from mirage_jax.runtime import kernel_call, load_kernel

    symbol = f"mj_test_{host_isa()}_{graph.fingerprint()[:20]}"  # one kernel per ISA level
    lib = compile_shared_library(emit_cpu(graph, symbol), name_hint=symbol, extra_flags=flags)
    name = load_kernel(lib, symbol)
    avals = [jax.ShapeDtypeStruct(t.shape, t.dtype.numpy) for t in graph.output_types]
    call = jax.jit(lambda *args: tuple(kernel_call(name, avals, *args)))
    return [np.asarray(y) for y in call(*inputs)]


# Relative tolerance per element, of |want| + the output's typical magnitude (tests/tolerance.py)
TOL = {F32: 2e-6, F64: 1e-13}


def check(graph: KernelGraph, inputs: list[np.ndarray], tol: float | None = None,
          flags: tuple[str, ...] = (), scales: dict[int, np.ndarray] | None = None
          ) -> None:  # fmt: skip
    """The compiled graph's outputs equal the float64 reference, output by output, element by
    element (an output spanning magnitudes is checked at each one's own scale; ``scales``
    replaces the default error scale of some outputs, see tests/tolerance.py)."""
    got = run_cpu(graph, inputs, flags)
    want = evaluate(graph, inputs, precision="float64")
    assert len(got) == len(want) == len(graph.output_types)
    for i, (g, w, t) in enumerate(zip(got, want, graph.output_types)):
        assert g.shape == t.shape and g.dtype == t.dtype.numpy, f"output {i}"
        rtol = tol or TOL[t.dtype]
        scale = (scales or {}).get(i)
        bad = bad_elements(g, w, rtol, scale)
        assert not bad.any(), (
            f"output {i} {t}: {int(bad.sum())} elements off by more than {rtol:g} of the error "
            f"scale (typical |want| {typical(w):.3g}), first at {np.argwhere(bad)[0].tolist()}: "
            f"got {g[bad][0]!r}, want {w[bad][0]!r}"
        )


def rand(rng: np.random.Generator, t: TensorType, positive: bool = False) -> np.ndarray:
    if t.dtype is BOOL:
        return rng.random(t.shape) < 0.5  # a mask
    x = rng.standard_normal(t.shape)
    if positive:
        x = np.abs(x) + 0.1
    return x.astype(t.dtype.numpy)


@pytest.fixture
def rng() -> np.random.Generator:
    seed = int(np.random.SeedSequence().entropy % 2**32)
    print(f"random inputs from seed {seed}")  # shown by pytest when a test fails
    return np.random.default_rng(seed)


def _x64(dtype: DType):
    return jax.enable_x64(dtype is F64)


def test_check_fails_a_kernel_that_returns_small_outputs_as_zero(rng, monkeypatch) -> None:
    """A control: the harness itself must reject a kernel whose small results read as 0
    (exp(3 x) spans 1e-4 to 1e4; a check scaled by the largest element passed them)."""
    kb = KernelBuilder()
    kb.output(kb.apply(Op.EXP, kb.input(T(16, 16))))
    g = kb.build()
    x = 3 * rand(rng, g.input_types[0])
    check(g, [x])  # the real kernel passes
    real = run_cpu

    def small_as_zero(graph, inputs, flags=()):  # the five smallest (about 2e-3 and less)
        outs = real(graph, inputs, flags)
        return [np.where(np.abs(y) <= np.sort(np.abs(y), axis=None)[4], np.float32(0), y)
                for y in outs]  # fmt: skip

    monkeypatch.setitem(globals(), "run_cpu", small_as_zero)
    with pytest.raises(AssertionError, match="elements off"):
        check(g, [x])


# ------------------------------------------------------------------------ kernel-level ops

# (op, attrs, needs a positive operand)
UNARY_CASES = [
    (Op.EXP, {}, False), (Op.LOG, {}, True), (Op.SQUARE, {}, False), (Op.SQRT, {}, True),
    (Op.RSQRT, {}, True), (Op.SIGMOID, {}, False), (Op.SILU, {}, False), (Op.GELU, {}, False),
    (Op.TANH, {}, False), (Op.ERF, {}, False), (Op.ERFC, {}, False), (Op.RELU, {}, False),
    (Op.SIN, {}, False), (Op.COS, {}, False), (Op.SIGN, {}, False),
    (Op.NEG, {}, False), (Op.RECIPROCAL, {}, True), (Op.MUL_SCALAR, {"scalar": -1.75}, False),
    (Op.ADD_SCALAR, {"scalar": 0.3}, False), (Op.POW_SCALAR, {"exponent": 3.0}, False),
    (Op.POW_SCALAR, {"exponent": -2.0}, True), (Op.POW_SCALAR, {"exponent": 0.5}, True),
    (Op.POW_SCALAR, {"exponent": -0.5}, True), (Op.POW_SCALAR, {"exponent": 1.7}, True),
    (Op.FINITE_OR, {"fill": -3.0}, False),
]  # fmt: skip


@pytest.mark.parametrize("dtype", [F32, F64])
def test_unary_ops(dtype: DType, rng: np.random.Generator) -> None:
    kb = KernelBuilder()
    x, p = kb.input(T(3, 5, 7, dtype=dtype)), kb.input(T(3, 5, 7, dtype=dtype))
    for op, attrs, positive in UNARY_CASES:
        kb.output(kb.apply(op, p if positive else x, **attrs))
    u = kb.input(T(3, 5, 7, dtype=dtype))
    kb.output(kb.apply(Op.ERF_INV, u))
    g = kb.build()
    inside = np.tanh(rand(rng, g.input_types[2]))  # erf_inv's domain, (-1, 1)
    with _x64(dtype):
        x_in, p_in = 3 * rand(rng, g.input_types[0]), rand(rng, g.input_types[1], positive=True)
        check(g, [x_in, p_in, inside])


def test_unary_special_values() -> None:
    """Vectorised float32 approximations keep IEEE edge cases: inf, nan, 0, overflow, huge.

    XLA runs kernels with denormals flushed to zero, so denormal results may read as 0."""
    specials = [0.0, -0.0, np.inf, -np.inf, np.nan, 1e-37, 88.7, 89.0, -87.0, -104.0, -200.0,
                30.0, -30.0, 4.5, -4.5, 0.6, -0.63, 1e-4, -1e-4, 3e38, -1.0, 2.0, 1.0, 7.07, -7.07,
                9.0, 1.9999]  # fmt: skip
    x = np.array(specials * 3, np.float32)  # vector lanes and scalar tail both see them
    ops = [Op.EXP, Op.LOG, Op.TANH, Op.ERF, Op.ERFC, Op.SIGMOID, Op.SQRT, Op.RSQRT, Op.RELU,
           Op.SIGN]  # fmt: skip
    kb = KernelBuilder()
    xi = kb.input(T(x.size))
    for op in ops:
        kb.output(kb.apply(op, xi))
    got = run_cpu(kb.build(), [x])
    x64 = x.astype(np.float64)
    with np.errstate(all="ignore"):
        from scipy.special import erf, erfc, expit

        want = [np.exp(x64), np.log(x64), np.tanh(x64), erf(x64), erfc(x64), expit(x64),
                np.sqrt(x64), 1 / np.sqrt(x64), np.maximum(x64, 0),
                np.where(x64 == 0, x64, np.sign(x64))]  # fmt: skip
        for op, g, w in zip(ops, got, want):
            w32 = np.where(np.abs(w) < np.finfo(np.float32).tiny, 0.0, w).astype(np.float32)
            ok = (g == w32) | (np.isnan(g) & np.isnan(w)) | (np.abs(g - w) <= 4e-7 * np.abs(w))
            assert ok.all(), f"{op.value}: x={x[~ok]} got {g[~ok]} want {w[~ok]}"


def test_finite_or_replaces_exactly_the_infinite_and_nan_elements() -> None:
    """Vector lanes and the scalar tail: finite values (huge, tiny, -0) pass unchanged, inf,
    -inf and NaN become the fill."""
    specials = [0.0, -0.0, np.inf, -np.inf, np.nan, 3.4e38, -3.4e38, 1e-45, -2.5, 7.0]
    x = np.array(specials * 5, np.float32)
    kb = KernelBuilder()
    xi = kb.input(T(x.size))
    kb.output(kb.apply(Op.FINITE_OR, xi, fill=-1.5))
    (got,) = run_cpu(kb.build(), [x])
    want = np.where(np.isfinite(x), x, np.float32(-1.5))
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(np.signbit(got), np.signbit(want))


def test_sin_and_cos_reduce_the_argument_accurately() -> None:
    """float32 sin / cos against float64 of the same inputs: within 2 float32 ulps relative
    below pi/4 (no reduction), within 2 ulps of 1 absolute after it (as Cephes' reduction;
    RoPE angles reach thousands of radians), std:: in double beyond 12800 and for inf / nan."""
    sweep = np.linspace(-13000.0, 13000.0, 40001, dtype=np.float32)
    specials = [0.0, -0.0, 1e-30, -1e-30, 1e-4, 0.78539816, -0.78539816, 1.5707964, 3.1415927,
                -3.1415927, 12799.9, 12800.1, 1e5, -3e38, np.inf, -np.inf, np.nan]  # fmt: skip
    x = np.concatenate([sweep, np.array(specials * 3, np.float32)])
    kb = KernelBuilder()
    xi = kb.input(T(x.size))
    kb.output(kb.apply(Op.SIN, xi))
    kb.output(kb.apply(Op.COS, xi))
    got = run_cpu(kb.build(), [x])
    x64 = x.astype(np.float64)
    eps = float(np.finfo(np.float32).eps)
    with np.errstate(invalid="ignore"):
        for name, g, w in zip(("sin", "cos"), got, (np.sin(x64), np.cos(x64))):
            tol = 2 * eps * np.where(np.abs(x64) < 0.785, np.abs(w), 1.0)
            ok = (np.isnan(g) & np.isnan(w)) | (np.abs(g - w) <= tol)
            assert ok.all(), f"{name}: x={x[~ok][:4]} got {g[~ok][:4]} want {w[~ok][:4]}"
    assert np.signbit(got[0][sweep.size + 1])  # sin(-0) = -0


@pytest.mark.parametrize("dtype", [F32, F64])
def test_erf_inv_across_its_domain(dtype: DType) -> None:
    """erf_inv against scipy in float64 on a sweep of (-1, 1) dense near +-1 (the tail
    branch, where w = -log(1 - x^2) >= 5), and its edges: +-1 -> +-inf, beyond and NaN ->
    NaN, +-0 kept. Within 4 ulps in float32 (Giles' polynomials, as XLA's) and float64
    (Newton steps from them); both measured at about 2.1 on dense sweeps."""
    from scipy.special import erfinv

    eps = np.finfo(dtype.numpy).eps
    near_one = 1.0 - np.geomspace(eps / 2, 0.5, 300)
    sweep = np.concatenate([np.linspace(-0.999, 0.999, 1001), near_one, -near_one])
    specials = [0.0, -0.0, 1.0, -1.0, 1.5, -2.0, np.inf, np.nan, 1e-30, -1e-30]
    x = np.concatenate([sweep, np.array(specials * 3)]).astype(dtype.numpy)
    kb = KernelBuilder()
    kb.output(kb.apply(Op.ERF_INV, kb.input(T(x.size, dtype=dtype))))
    with _x64(dtype):
        (got,) = run_cpu(kb.build(), [x])
    ulps = 4
    with np.errstate(all="ignore"):
        want = erfinv(x.astype(np.float64))
        close = np.abs(got - want) <= ulps * eps * np.abs(want)
        ok = (got == want) | (np.isnan(got) & np.isnan(want)) | close
    assert ok.all(), f"x={x[~ok][:4]} got {got[~ok][:4]} want {want[~ok][:4]}"
    zeros = x == 0
    np.testing.assert_array_equal(np.signbit(got[zeros]), np.signbit(x[zeros]))


def test_rem_is_exact_with_the_sign_of_the_dividend(rng: np.random.Generator) -> None:
    """rem is C's fmod (jax.lax.rem, jnp.fmod): exact where x - y * trunc(x / y) would round
    (large quotients), the dividend's sign, NaN for y = 0 or x infinite, x for y infinite."""
    x = np.concatenate([rng.standard_normal(200) * 1e4, [5.5, -5.5, 0.0, -0.0, np.inf, 3.0,
                                                         1e30, -7.25, np.nan, 2.0]])
    y = np.concatenate([rng.standard_normal(200), [2.0, 2.0, 3.0, 3.0, 2.0, 0.0, 1.1, np.inf,
                                                   1.0, np.nan]])  # fmt: skip
    x, y = x.astype(np.float32), y.astype(np.float32)
    kb = KernelBuilder()
    kb.output(kb.apply(Op.REM, kb.input(T(x.size)), kb.input(T(y.size))))
    (got,) = run_cpu(kb.build(), [x, y])
    with np.errstate(all="ignore"):
        want = np.fmod(x, y)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(np.signbit(got), np.signbit(want))
    np.testing.assert_array_equal(got, np.asarray(jax.lax.rem(jnp.asarray(x), jnp.asarray(y))))


BINARY = [Op.ADD, Op.SUB, Op.MUL, Op.DIV, Op.MAX, Op.REM]


def test_binary_broadcasting(rng: np.random.Generator) -> None:
    kb = KernelBuilder()
    a, b = kb.input(T(3, 5, 7)), kb.input(T(3, 1, 7))
    c, d = kb.input(T(1, 5, 1)), kb.input(T(3, 5, 1))
    for op in BINARY:
        for lhs, rhs in ((a, b), (c, a), (a, d), (b, c), (a, a), (d, d)):
            kb.output(kb.apply(op, lhs, rhs))
    g = kb.build()
    # |x| + 0.5 keeps every divisor away from zero; random signs keep max() honest
    ins = [(np.abs(rand(rng, t)) + 0.5) * rng.choice([-1, 1], t.shape) for t in g.input_types]
    check(g, [x.astype(np.float32) for x in ins], tol=4e-7)


@pytest.mark.parametrize("dtype", [F32, F64])
def test_reductions_every_dim(dtype: DType, rng: np.random.Generator) -> None:
    kb = KernelBuilder()
    x, y = kb.input(T(3, 5, 7, dtype=dtype)), kb.input(T(13, 257, dtype=dtype))
    for op in (Op.REDUCE_SUM, Op.REDUCE_MAX, Op.REDUCE_MEAN, Op.REDUCE_RMS):
        for v in (x, y):
            for dim in range(len(v.shape)):
                kb.output(kb.apply(op, v, dim=dim))
    g = kb.build()
    with _x64(dtype):
        check(g, [rand(rng, t) for t in g.input_types], tol={F32: 1e-5, F64: 1e-13}[dtype])


def test_layout_ops(rng: np.random.Generator) -> None:
    kb = KernelBuilder()
    x, y = kb.input(T(3, 5, 7)), kb.input(T(3, 2, 7))
    e = kb.apply(Op.EXP, x)
    kb.output(kb.apply(Op.RESHAPE, e, shape=(15, 7)))  # alias: exp writes the output directly
    kb.output(kb.apply(Op.RESHAPE, kb.apply(Op.RESHAPE, x, shape=(105,)), shape=(7, 15)))
    for perm in ((1, 0, 2), (2, 0, 1), (0, 2, 1), (2, 1, 0)):
        kb.output(kb.apply(Op.TRANSPOSE, e, perm=perm))
    kb.output(kb.apply(Op.CONCAT, x, y, dim=1))
    kb.output(kb.apply(Op.CONCAT, x, x, dim=0))
    kb.output(kb.apply(Op.CONCAT, x, kb.apply(Op.NEG, x), dim=2))
    up = kb.apply(Op.CAST, e, dtype=F64)
    kb.output(up)
    kb.output(kb.apply(Op.CAST, kb.apply(Op.MUL_SCALAR, up, scalar=1 / 3), dtype=F32))
    kb.output(e)  # the same value as a reshape output above: copied
    kb.output(x)  # an input straight through: copied
    g = kb.build()
    with _x64(F64):  # float32 tolerance: the float64 outputs come from float32 values
        check(g, [rand(rng, t) for t in g.input_types], tol=TOL[F32])


def test_aliased_outputs_are_written_in_place_or_copied(rng: np.random.Generator) -> None:
    g, copied = G.aliasing_graph()
    source = emit_cpu(g, "k")
    assert {int(k) for k in re.findall(r"mj::k::copy\(pool, o(\d+),", source)} == copied
    # exp computes straight into the view of output 0
    (view,) = re.findall(r"View<float, mj::Shape<4,6>> (\w+)\(outputs\[0\]\);", source)
    assert re.search(rf"mj::op::Exp\{{\}}, {view}, ", source), source
    check(g, [rand(rng, t) for t in g.input_types])


@pytest.mark.parametrize("dtype", [F32, F64])
def test_matmul_batched(dtype: DType, rng: np.random.Generator) -> None:
    """Batch dims, M/N tails of the register blocking, K split into cache-sized chunks, B
    panels packed for 3+ row panels (M = 37, 20), a decode product (M = 8) streaming B
    in passes across chunks, and M a multiple of 8 whose N the default blocking's vectors
    tile exactly (40 x 64, 64 x 128: 6 x 4 with a row tail instead of 8 x 3 with a column
    tail). Kernel-level M blocks (k::matmul's kernel_block_rows): one of 128 rows (8 N blocks),
    two of 64 and four of 32 (fewer N blocks), 56 x 3 + 32 and 72 + 58."""
    kb = KernelBuilder()
    pairs = [((2, 3, 13, 17), (2, 3, 17, 19)), ((37, 129), (129, 65)), ((20, 300), (300, 70)),
             ((1, 5), (5, 1)), ((8, 600), (600, 300)), ((40, 70), (70, 64)),
             ((64, 33), (33, 128)), ((128, 24), (24, 2048)), ((128, 16), (16, 1024)),
             ((128, 9), (9, 512)), ((200, 40), (40, 300)), ((130, 20), (20, 1100))]  # fmt: skip
    for sa, sb in pairs:
        kb.output(kb.matmul(kb.input(T(*sa, dtype=dtype)), kb.input(T(*sb, dtype=dtype))))
    g = kb.build()
    ins = [rand(rng, t) for t in g.input_types]
    # a product's rounding is relative to its terms, |A| @ |B|, not to its value: the 5-term
    # dot of (1, 5) @ (5, 1) cancels to ~1e-3 now and then
    scales = {i: np.abs(a.astype(np.float64)) @ np.abs(b.astype(np.float64))
              for i, (a, b) in enumerate(zip(ins[::2], ins[1::2]))}  # fmt: skip
    with _x64(dtype):
        check(g, ins, tol={F32: 1e-5, F64: 1e-13}[dtype], scales=scales)


class _Pool(ctypes.Structure):
    """``mj_pool`` of csrc/runtime/cpu/abi.h."""

    TASK = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int64)
    FOR = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int64, TASK, ctypes.c_void_p)
    _fields_ = [("ctx", ctypes.c_void_p), ("num_threads", ctypes.c_int), ("parallel_for", FOR)]


def run_on_a_recording_pool(graph: KernelGraph, inputs: list[np.ndarray], threads: int
                            ) -> tuple[list[np.ndarray], list[int]]:  # fmt: skip
    """Call the compiled kernel directly with a pool of ``threads`` that records every
    parallel_for's task count and runs the tasks last to first (a kernel whose tasks depend on
    their order fails)."""
    from mirage_jax.backend.cpu.build import compile_shared_library

    lib = compile_shared_library(emit_cpu(graph, "k"), name_hint="recording_pool")
    kernel = ctypes.CDLL(str(lib.path)).k
    kernel.restype = ctypes.c_int
    counts: list[int] = []

    def parallel_for(ctx, n, fn, arg):
        counts.append(n)
        for i in reversed(range(n)):
            fn(arg, i)

    pool = _Pool(None, threads, _Pool.FOR(parallel_for))
    outs = [np.empty(t.shape, t.dtype.numpy) for t in graph.output_types]
    ins = [np.ascontiguousarray(x) for x in inputs]
    ptrs = lambda xs: (ctypes.c_void_p * len(xs))(*[x.ctypes.data for x in xs])
    assert kernel(ptrs(ins), ptrs(outs), ctypes.byref(pool)) == 0
    return outs, counts


def test_parallel_kernel_ops(rng: np.random.Generator) -> None:
    """Sizes above the parallel threshold: every op splits its work over the pool it is given
    (a few tasks per thread), the result independent of the tasks' order; with one thread
    nothing is handed to the pool."""
    kb = KernelBuilder()
    x, w = kb.input(T(256, 257)), kb.input(T(257, 96))
    s = kb.apply(Op.SILU, x)
    kb.output(kb.apply(Op.REDUCE_SUM, s, dim=1))
    kb.output(kb.apply(Op.REDUCE_MAX, s, dim=0))
    kb.output(kb.matmul(s, w))
    kb.output(kb.apply(Op.TRANSPOSE, s, perm=(1, 0)))
    g = kb.build()
    ins = [rand(rng, t) for t in g.input_types]
    check(g, ins, tol=1e-5)
    want = evaluate(g, ins, precision="float64")
    outs, counts = run_on_a_recording_pool(g, ins, threads=4)
    ops = len(g.nodes) - len(g.inputs) - len(g.outputs)
    assert len([n for n in counts if n > 1]) >= ops, counts  # every op split
    assert all(n <= 4 * 4 for n in counts), counts  # at most four tasks per thread
    for i, (o, w) in enumerate(zip(outs, want)):
        assert not bad_elements(o, w, 1e-5).any(), f"output {i} on the recording pool"
    _, serial = run_on_a_recording_pool(g, ins, threads=1)
    assert serial == [], serial


# ------------------------------------------------------------------------------ block graphs


def _kernel(block: BlockGraph) -> KernelGraph:
    kb = KernelBuilder()
    ins = [kb.input(t) for t in block.arg_types]
    for y in kb.graph_def(block, *ins):
        kb.output(y)
    return kb.build()


def test_block_grid_xyz_replicated(rng: np.random.Generator) -> None:
    """Grid on x, y and z, a replicated operand, a fused chain with broadcasting, reductions
    of a tile over each dim and a block-level concat and cast."""
    bb = BlockBuilder((2, 3, 5), 1, (T(4, 6, 10), T(1, 6, 1)))
    a = bb.input_iter(0, (0, 1, 2))  # tile [2, 2, 2]
    s = bb.input_iter(1, (N, 1, N))  # tile [1, 2, 1], the same for every x and z block
    chain = bb.apply(Op.ADD, bb.apply(Op.MUL, bb.apply(Op.SILU, a), s), bb.apply(Op.EXP, a))
    bb.output_saver(chain, (0, 1, 2))
    for op in (Op.REDUCE_SUM, Op.REDUCE_MAX, Op.REDUCE_MEAN, Op.REDUCE_RMS):
        for dim in range(3):
            bb.output_saver(bb.apply(op, a, dim=dim), (0, 1, 2))
    bb.output_saver(bb.apply(Op.CONCAT, a, chain, dim=2), (0, 1, 2))
    bb.output_saver(bb.apply(Op.CAST, a, dtype=F64), (0, 1, 2))
    # a given thread graph that changes dtype inside (its fused loop runs on scalars)
    tb = ThreadBuilder()
    u, v = tb.input(a.type), tb.input(s.type)
    wide = tb.apply(Op.MUL_SCALAR, tb.apply(Op.CAST, tb.apply(Op.MUL, u, v), dtype=F64), scalar=3.0)
    tb.output(tb.apply(Op.CAST, tb.apply(Op.TANH, wide), dtype=F32))
    bb.output_saver(bb.apply(Op.THREAD, a, s, graph=tb.build()), (0, 1, 2))
    g = _kernel(bb.build())
    assert g.block_graphs[0].num_blocks == 30
    with _x64(F64):
        check(g, [rand(rng, t) for t in g.input_types])


def test_block_elementwise_ops(rng: np.random.Generator) -> None:
    """Every unary and binary op on tiles (saved per iteration along fdim), with broadcasting."""
    bb = BlockBuilder((2, 1, 1), 3, (T(6, 48), T(6, 48), T(6, 3)))
    x = bb.input_iter(0, (0, N, N), 1)  # [3, 16]
    p = bb.apply(Op.ADD_SCALAR, bb.apply(Op.SQUARE, bb.input_iter(1, (0, N, N), 1)), scalar=0.1)
    c = bb.input_iter(2, (0, N, N), 1)  # [3, 1]: broadcasts over the tile's columns
    for op, attrs, positive in UNARY_CASES:
        bb.output_saver(bb.apply(op, p if positive else x, **attrs), (0, N, N), fdim=1)
    for op in BINARY:
        bb.output_saver(bb.apply(op, x, p), (0, N, N), fdim=1)
        bb.output_saver(bb.apply(op, c, p), (0, N, N), fdim=1)
    g = _kernel(bb.build())
    check(g, [rand(rng, t) for t in g.input_types], tol=4e-6)


def test_block_forloop_hoisting_and_body_savers(rng: np.random.Generator) -> None:
    """Loop-invariant tiles and ops are hoisted; body values are saved per iteration."""
    bb = BlockBuilder((2, 1, 1), 3, (T(4, 12), T(1, 4), T(8, 5)))
    x = bb.input_iter(0, (0, N, N), 1)  # [2, 4], varies with the loop
    gain = bb.apply(Op.EXP, bb.input_iter(1, (N, N, N)))  # [1, 4], invariant
    w = bb.input_iter(2, (N, N, N))  # [8, 5], invariant
    y = bb.apply(Op.TANH, bb.apply(Op.MUL, x, gain))
    bb.output_saver(y, (0, N, N), fdim=1)
    both = bb.apply(Op.CONCAT, y, x, dim=1)  # [2, 8]
    bb.output_saver(both, (1, N, N), fdim=0)  # blocks side by side, iterations stacked
    acc = bb.apply(Op.ACC_SUM, bb.matmul(both, w))  # [2, 5]
    bb.output_saver(bb.apply(Op.SIGMOID, acc), (0, N, N))
    bb.output_saver(gain, (0, N, N))  # an invariant value, saved once per block
    block = bb.build()
    g = _kernel(block)
    source = emit_cpu(g, "k")
    loop_at = source.index("for (mj::i64 i = 0; i < 3; ++i)")
    assert (
        source.index("tile_view<mj::Shape<1,4>")  # the whole tensor: viewed, not copied
        < loop_at
        < source.index("load_tile<mj::Shape<4,12>")
    )
    assert source.index("mj::op::Exp{}") < loop_at  # the invariant exp is hoisted
    check(g, [rand(rng, t) for t in g.input_types], tol=4e-6)


def test_accumulators(rng: np.random.Generator) -> None:
    """acc_sum / mean / max / rms over no dim and each tile dim, and acc_rescale_sum with a
    broadcast and a full-shape max, paired with acc_max as in online softmax."""
    bb = BlockBuilder((2, 1, 1), 4, (T(6, 20), T(6, 4), T(6, 20)))
    x = bb.input_iter(0, (0, N, N), 1)  # [3, 5]
    for op in (Op.ACC_SUM, Op.ACC_MEAN, Op.ACC_MAX, Op.ACC_RMS):
        for dim in (N, 0, 1):
            bb.output_saver(bb.apply(op, x, dim=dim), (0, N, N))
    m = bb.input_iter(1, (0, N, N), 1)  # [3, 1]
    m_full = bb.input_iter(2, (0, N, N), 1)  # [3, 5]
    bb.output_saver(bb.apply(Op.ACC_RESCALE_SUM, x, m), (0, N, N))
    bb.output_saver(bb.apply(Op.ACC_MAX, m), (0, N, N))
    bb.output_saver(bb.apply(Op.ACC_RESCALE_SUM, x, m_full), (0, N, N))
    # an accumulator of a loop-invariant tile: R times the tile
    bb.output_saver(bb.apply(Op.ACC_SUM, bb.input_iter(1, (0, N, N))), (0, N, N))
    g = _kernel(bb.build())
    ins = [rand(rng, t) for t in g.input_types]
    ins[1] *= 4  # widely spread maxima: the rescaling matters
    check(g, ins, tol=4e-6)


def test_split_loops_merge_every_accumulator(rng: np.random.Generator) -> None:
    """A grid with fewer blocks than threads runs its for-loop in parts, one per thread, and
    merges the parts' accumulators (sum, mean, max, rms over no dim and each tile dim, and a
    fused matmul_acc) before the epilogue; 5 iterations do not split evenly over 2 threads."""
    bb = BlockBuilder((1, 1, 1), 5, (T(6, 20), T(20, 7)))
    x = bb.input_iter(0, (N, N, N), 1)  # [6, 4]
    w = bb.input_iter(1, (N, N, N), 0)  # [4, 7]
    for op in (Op.ACC_SUM, Op.ACC_MEAN, Op.ACC_MAX, Op.ACC_RMS):
        for dim in (N, 0, 1):
            bb.output_saver(bb.apply(Op.EXP, bb.apply(op, x, dim=dim)), (N, N, N))
    bb.output_saver(bb.apply(Op.ACC_SUM, bb.matmul(x, w)), (N, N, N))
    g = _kernel(bb.build())
    assert splits_loop(g.nodes_of(Op.GRAPH_DEF)[0].attr("block"))
    source = emit_cpu(g, "k")
    assert re.search(r"mj::for_each_block_split<1, 1, 1, 5, \w+>\(pool", source), source
    # every accumulator of the block is part of the split state and merged once, the matmul's
    # fused accumulator too
    block = g.nodes_of(Op.GRAPH_DEF)[0].attr("block")
    state = re.findall(r"mj::Acc\w+<[^;]*> (\w+);", source)
    assert len(state) == len(set(state)) == sum(n.op in ACCUMULATORS for n in block.nodes) == 13
    merged = re.findall(r"s\.(\w+)\.merge\(o\.(\w+)\);", source)
    assert sorted(merged) == sorted((a, a) for a in state)
    (into,) = re.findall(r"mj::matmul_acc\((\w+)\.out,", source)
    assert into in state
    check(g, [rand(rng, t) for t in g.input_types], tol=4e-6)


def test_loops_that_cannot_be_split() -> None:
    """Online softmax (rescaled sums), a saver inside the loop, a saver of a loop-invariant
    value, loop-invariant compute, a one-iteration loop and accumulators past 256 KiB keep the
    plain per-block loop."""
    attention = G.attention_fused(2, 8, 16, 128, row_blocks=2, loop=4)
    assert not splits_loop(attention.nodes_of(Op.GRAPH_DEF)[0].attr("block"))
    bb = BlockBuilder((1, 1, 1), 2, (T(4, 8),))
    x = bb.input_iter(0, (N, N, N), 1)
    bb.output_saver(bb.apply(Op.ACC_SUM, x), (N, N, N))
    bb.output_saver(bb.apply(Op.EXP, x), (N, N, N), 1)  # saved every iteration
    assert not splits_loop(bb.build())
    bb = BlockBuilder((1, 1, 1), 2, (T(4, 8), T(4, 8)))
    x = bb.input_iter(0, (N, N, N), 1)
    bb.output_saver(bb.apply(Op.ACC_SUM, x), (N, N, N))
    bb.output_saver(bb.input_iter(1, (N, N, N)), (N, N, N))  # loop-invariant
    assert not splits_loop(bb.build())
    one = G.rmsnorm_linear_fused(8, 256, 96, grid=(1, 1), loop=1)
    assert not splits_loop(one.nodes_of(Op.GRAPH_DEF)[0].attr("block"))
    bb = BlockBuilder((1, 1, 1), 2, (T(4, 8), T(8, 8), T(4, 16)))
    x, w = bb.input_iter(0, (N, N, N)), bb.input_iter(1, (N, N, N))
    hoisted = bb.matmul(x, w)  # loop-invariant: each part would compute it again
    bb.output_saver(bb.apply(Op.ADD, hoisted, bb.apply(Op.ACC_SUM, bb.input_iter(2, (N, N, N), 1))),
                    (N, N, N))  # fmt: skip
    assert not splits_loop(bb.build())
    for m, split in ((2, True), (16, False)):  # 48 KiB of accumulators split, 384 KiB not
        big = G.rmsnorm_linear_fused(m, 4096, 6144, grid=(1, 1), loop=8)
        assert splits_loop(big.nodes_of(Op.GRAPH_DEF)[0].attr("block")) is split
    assert "for_each_block_split" not in emit_cpu(attention, "k")


def test_block_matmul_batch_dims(rng: np.random.Generator) -> None:
    """Tile matmul with a batch dim, accumulated over the loop (fused into matmul_acc) and not."""
    bb = BlockBuilder((2, 1, 1), 2, (T(2, 6, 8), T(2, 8, 10)))
    a = bb.input_iter(0, (0, N, N), 2)  # [1, 6, 4]
    b = bb.input_iter(1, (0, N, N), 1)  # [1, 4, 10]
    mm = bb.matmul(a, b)
    bb.output_saver(bb.apply(Op.ACC_SUM, mm), (0, N, N))
    bb.output_saver(bb.apply(Op.ACC_MAX, mm), (0, N, N))
    g = _kernel(bb.build())
    assert "matmul_acc" not in emit_cpu(g, "k")  # mm has two uses: it needs its own tile
    check(g, [rand(rng, t) for t in g.input_types], tol=4e-6)


def _in_place_matmul(m: int) -> KernelGraph:
    bb = BlockBuilder((3, 2, 1), 2, (T(2, m, 2 * 150), T(2, 2 * 150, 3 * 37)))
    a = bb.input_iter(0, (N, 0, N), 2)  # [1, m, 150]: batch from grid y, K from the loop
    b = bb.input_iter(1, (2, 0, N), 1)  # [1, 150, 37]: columns from grid x
    bb.output_saver(bb.apply(Op.ACC_SUM, bb.matmul(a, b)), (2, 0, N))
    return _kernel(bb.build())


@pytest.mark.parametrize("m", [1, 2, 3, 5, 8, 12, 16, 19, 40])
def test_block_matmul_reads_tiles_in_place(m: int, rng: np.random.Generator) -> None:
    """Matmul operands are read where they lie (strided tiles of the kernel tensors, batch
    dims split by the grid), for every register blocking of M, a ragged N and a K long
    enough to be cut into passes with a remainder; from 3 row panels on (m = 19, 40) each
    strided B panel is first copied to a dense buffer that all row panels read."""
    g = _in_place_matmul(m)
    source = emit_cpu(g, "k")
    assert source.count("mj::tile_ref<") == 2 and "load_tile" not in source
    check(g, [rand(rng, t) for t in g.input_types], tol=4e-6)


def _prefetches(graph: KernelGraph, flags: tuple[str, ...]) -> int:
    from mirage_jax.backend.cpu.build import compile_shared_library

    lib = compile_shared_library(emit_cpu(graph, "k"), extra_flags=flags)
    # binutils (as, ld, objdump) comes with the g++ the project requires: no skip
    objdump = shutil.which("objdump")
    assert objdump is not None, "objdump not found: install binutils (g++ needs it too)"
    text = subprocess.run([objdump, "-d", str(lib.path)], capture_output=True, text=True,
                          check=True).stdout  # fmt: skip
    return text.count("prefetch")


@pytest.mark.parametrize("m", [2, 16])
def test_streamed_matmul_without_software_prefetch(m: int, rng: np.random.Generator) -> None:
    """-DMJ_STREAM_PREFETCH=0 (what calibrate.kernel_flags gives a host whose hardware
    prefetchers stream better alone) drops every prefetch instruction of an in-place matmul
    and computes the same products."""
    g = _in_place_matmul(m)
    off = ("-DMJ_STREAM_PREFETCH=0",)
    check(g, [rand(rng, t) for t in g.input_types], tol=4e-6, flags=off)
    assert _prefetches(g, ()) > 0 and _prefetches(g, off) == 0


def test_streamed_matmul_prefetches_only_strips_of_short_rows(rng: np.random.Generator) -> None:
    """-DMJ_STREAM_PREFETCH_MAX_RUN=<bytes> keeps the software prefetch for strips whose rows
    run shorter than that (B here: 37 of 111 floats per row, 148 bytes) and drops it above."""
    g = _in_place_matmul(8)
    long_only = ("-DMJ_STREAM_PREFETCH_MAX_RUN=5120",)
    check(g, [rand(rng, t) for t in g.input_types], tol=4e-6, flags=long_only)
    assert _prefetches(g, long_only) > 0
    assert _prefetches(g, ("-DMJ_STREAM_PREFETCH_MAX_RUN=128",)) == 0


# ------------------------------------------------------- the fused μGraphs of tests/graphs.py


def _rmsnorm_linear(x, g, w, eps=1e-6):
    return (x * jax.lax.rsqrt(jnp.mean(x * x, -1, keepdims=True) + eps) * g) @ w


def _gated_mlp(x, w1, w2):
    return jax.nn.silu(x @ w1) * (x @ w2)


def _attention(q, k, v):
    return jax.nn.softmax(q @ k, axis=-1) @ v


def _masked_attention(q, k, v, mask):
    return jax.nn.softmax(jnp.where(mask, q @ k, -1e9), axis=-1) @ v


FUSED = {
    "rmsnorm_linear": (lambda: G.rmsnorm_linear_fused(8, 256, 96, grid=(3, 2), loop=4),
                       _rmsnorm_linear),
    "gated_mlp": (lambda: G.gated_mlp_fused(8, 128, 64, grid=(2, 2), loop=4), _gated_mlp),
    # one block: the loop runs split over the threads (mj::for_each_block_split)
    "rmsnorm_linear_split": (lambda: G.rmsnorm_linear_fused(2, 256, 96, grid=(1, 1), loop=8),
                             _rmsnorm_linear),
    "gated_mlp_split": (lambda: G.gated_mlp_fused(8, 128, 64, grid=(1, 1), loop=4), _gated_mlp),
    "gated_mlp_thread": (lambda: G.gated_mlp_fused(8, 128, 64, grid=(4, 1), loop=2, thread=True),
                         _gated_mlp),
    "flash_attention": (lambda: G.attention_fused(2, 8, 16, 128, row_blocks=2, loop=4),
                        _attention),
    "flash_decoding": (lambda: G.flash_decoding_split(2, 4, 16, 128, splits=2, loop=4),
                       _attention),
    "masked_attention": (lambda: G.masked_attention_fused(2, 8, 16, 128, loop=4),
                         _masked_attention),
    "masked_attention_plain": (lambda: G.masked_attention_plain(2, 8, 16, 64, fill=-1e9),
                               _masked_attention),
}  # fmt: skip


def _fused_case(name: str, rng: np.random.Generator):
    build, reference = FUSED[name]
    g = build()
    ins = [rand(rng, t) for t in g.input_types]
    return g, ins, reference


def _fused_scale(name: str, ins: list[np.ndarray]) -> np.ndarray | None:
    """A gated product's error scale is its factors' (x w1 and x w2; tests/tolerance.py)."""
    if not name.startswith("gated"):
        return None
    x, w1, w2 = (a.astype(np.float64) for a in ins)
    return product_scale(x @ w1, x @ w2)


def test_masks_follow_jnp_where_and_softmax_on_fully_masked_rows(rng: np.random.Generator
                                                                ) -> None:  # fmt: skip
    """where / where_not keep x where the mask holds / does not, else the fill (-inf, NaN, -0
    and a number); a row masked whole gives softmax's NaN with fill -inf and a uniform row
    with a finite fill, as jax.jit gives, at kernel level and through the online softmax."""
    kb = KernelBuilder()
    mask, x = kb.input(T(1, 37, dtype=BOOL)), kb.input(T(5, 37))
    for op in (Op.WHERE, Op.WHERE_NOT):
        for fill in (-np.inf, np.nan, -0.0, 2.5):
            kb.output(kb.apply(op, mask, x, fill=fill))
    g = kb.build()
    ins = [rand(rng, t) for t in g.input_types]
    got, want = run_cpu(g, ins), evaluate(g, ins)
    for i, (a, b) in enumerate(zip(got, want, strict=True)):
        np.testing.assert_array_equal(a, b, err_msg=f"output {i}")
        assert np.array_equal(np.signbit(a), np.signbit(b)), f"output {i}: signs of zeros"
    for fill, graph in ((-np.inf, G.masked_attention_plain(2, 8, 16, 64, fill=-np.inf)),
                        (-1e9, G.masked_attention_fused(2, 8, 16, 128, loop=4))):  # fmt: skip
        q, k, v, m = (rand(rng, t) for t in graph.input_types)
        m[0, 3] = False  # row 3 masked whole
        want = np.asarray(jax.jit(lambda q, k, v, m, f=fill: jax.nn.softmax(
            jnp.where(m, q @ k, f), axis=-1) @ v)(q, k, v, m))  # fmt: skip
        got = run_cpu(graph, [q, k, v, m])[0]
        assert np.isnan(want[:, 3]).all() == (fill == -np.inf)
        assert_array_close(got, want, rtol=2e-5, what=f"fill {fill}")


@pytest.mark.parametrize("name", sorted(FUSED))
def test_fused_graphs_equal_the_interpreter(name: str, rng: np.random.Generator) -> None:
    g, ins, _ = _fused_case(name, rng)
    scale = _fused_scale(name, ins)
    check(g, ins, tol=1e-5, scales=None if scale is None else {0: scale})


@pytest.mark.parametrize("name", sorted(FUSED))
def test_fused_graphs_equal_jax(name: str, rng: np.random.Generator) -> None:
    """The compiled fused μGraph computes the user's program (same library: a cache hit)."""
    g, ins, reference = _fused_case(name, rng)
    got = run_cpu(g, ins)[0]
    want = np.asarray(jax.jit(reference)(*ins))
    # both in float32: twice the drift from the float64 reference
    assert_array_close(got, want, rtol=2e-5, scale=_fused_scale(name, ins), what=name)


# ------------------------------------------------------------------------ thread-graph rule


def _chain_block() -> BlockGraph:
    bb = BlockBuilder((2, 1, 1), 2, (T(4, 8), T(4, 1)))
    x = bb.input_iter(0, (0, N, N), 1)  # [2, 4], body
    s = bb.input_iter(1, (0, N, N))  # [2, 1], invariant
    r = bb.apply(Op.RSQRT, bb.apply(Op.ADD_SCALAR, s, scalar=1e-6))  # invariant, [2, 1]
    e = bb.apply(Op.EXP, x)
    y = bb.apply(Op.MUL, bb.apply(Op.SILU, e), e)  # e used twice, inside one fragment
    z = bb.apply(Op.MUL, y, r)  # r broadcasts: not fused into z's fragment
    acc = bb.apply(Op.ACC_SUM, z)
    bb.output_saver(bb.apply(Op.NEG, bb.apply(Op.SQRT, acc)), (0, N, N))
    bb.output_saver(bb.apply(Op.TANH, x), (0, N, N), fdim=1)  # saved: a fragment of one
    return bb.build()


def _ops_of(block: BlockGraph) -> list[str]:
    return [n.op.value for n in block.nodes]


def test_fuse_elementwise_fragments() -> None:
    block = _chain_block()
    fused = fuse_elementwise(block)
    threads = fused.nodes_of(Op.THREAD)
    inner = [[n.op.value for n in t.attr("graph").nodes] for t in threads]
    assert inner == [
        ["input", "add_scalar", "rsqrt", "output"],  # invariant [2,1] fragment
        ["input", "input", "exp", "silu", "mul", "mul", "output"],  # body DAG with r as input
        ["input", "sqrt", "neg", "output"],  # epilogue fragment
    ]
    assert _ops_of(fused).count("tanh") == 1  # a single op stays a plain node
    phases = fused.phases()
    assert [phases[t.outs[0]] for t in threads] == [Phase.INVARIANT, Phase.BODY, Phase.EPILOGUE]
    assert fuse_elementwise(fused) == fused  # idempotent


def test_fuse_elementwise_preserves_results(rng: np.random.Generator) -> None:
    block = _chain_block()
    fused = fuse_elementwise(block)
    ins = [rand(rng, t) for t in block.arg_types]
    ins[1] = np.abs(ins[1])
    for a, b in zip(evaluate(block, ins), evaluate(fused, ins)):
        np.testing.assert_array_equal(a, b)
    check(_kernel(block), ins, tol=4e-6)


def test_fuse_keeps_multi_use_and_cross_phase_values() -> None:
    bb = BlockBuilder((1, 1, 1), 2, (T(2, 4),))
    x = bb.input_iter(0, (N, N, N), 1)
    e = bb.apply(Op.EXP, x)
    bb.output_saver(e, (N, N, N), fdim=1)  # e is saved: it must stay a tile
    acc = bb.apply(Op.ACC_SUM, bb.apply(Op.NEG, e))
    bb.output_saver(acc, (N, N, N))
    block = bb.build()
    assert fuse_elementwise(block) is block  # nothing to fuse: the same object back


# ------------------------------------------------------------------------- emitter contract


def test_table_covers_every_op() -> None:
    assert set(TABLE) == set(Op)
    assert all(t.fn for t in TABLE.values())


# ------------------------------------------------------------------------- half precision


def _half_close(got: np.ndarray, graph: KernelGraph, inputs: list[np.ndarray]) -> None:
    """Each output equals the reference interpreter in the graph's own dtypes (float32
    compute, rounded where it rounds) to one unit of the half type's rounding: only float32
    ulps of exp and of sums in another order can flip a rounding."""
    want = evaluate(graph, inputs)
    for i, (g, w, t) in enumerate(zip(got, want, graph.output_types)):
        assert g.dtype == t.dtype.numpy, f"output {i}: {g.dtype}"
        g64, w64 = g.astype(np.float64), w.astype(np.float64)
        unit = float(np.finfo(t.dtype.numpy).eps)  # two units of rounding at |w|
        bad = ~((g64 == w64) | (np.abs(g64 - w64) <= unit * (np.abs(w64) + typical(w64))))
        assert not bad.any(), f"output {i}: got {g64[bad][:4]}, want {w64[bad][:4]}"


@pytest.mark.parametrize("dtype", [F16, BF16], ids=lambda d: d.value)
def test_half_types_at_kernel_level(rng: np.random.Generator, dtype: DType) -> None:
    """bf16 / f16 buffers with float32 compute: an elementwise chain, a matmul, a reduction,
    casts both ways and a transpose, on kernel-level ops."""
    kb = KernelBuilder()
    x, w = kb.input(T(5, 33, dtype=dtype)), kb.input(T(33, 17, dtype=dtype))
    e = kb.apply(Op.TANH, kb.apply(Op.MUL_SCALAR, x, scalar=1.5))
    y = kb.apply(Op.MATMUL, e, w)
    kb.output(y)
    kb.output(kb.apply(Op.REDUCE_SUM, kb.apply(Op.EXP, x), dim=1))
    wide = kb.apply(Op.CAST, y, dtype=F32)
    kb.output(kb.apply(Op.CAST, kb.apply(Op.SQUARE, wide), dtype=dtype))
    kb.output(kb.apply(Op.TRANSPOSE, x, perm=(1, 0)))
    kb.output(kb.apply(Op.SLICE, x, dim=1, start=3, size=17))
    g = kb.build()
    inputs = [rand(rng, t) for t in g.input_types]
    _half_close(run_cpu(g, inputs), g, inputs)


@pytest.mark.parametrize("dtype", [F16, BF16], ids=lambda d: d.value)
def test_half_types_in_a_block(rng: np.random.Generator, dtype: DType) -> None:
    """A graph-defined kernel over bf16 / f16 tensors: tiles loaded into float, a matmul
    accumulated over the loop in float, an rms over the loop, an epilogue, savers rounding."""
    bb = BlockBuilder((2, 1, 1), 4, (T(8, 64, dtype=dtype), T(64, 24, dtype=dtype)))
    xt = bb.input_iter(0, (0, N, N), fdim=1)  # [4, 16]
    wt = bb.input_iter(1, (N, N, N), fdim=0)  # [16, 24]
    acc = bb.apply(Op.ACC_SUM, bb.apply(Op.MATMUL, xt, wt))
    rms = bb.apply(Op.ACC_RMS, xt, dim=1)
    y = bb.apply(Op.DIV, acc, bb.apply(Op.ADD_SCALAR, rms, scalar=1e-3))
    bb.output_saver(bb.apply(Op.SILU, y), (0, N, N))
    bb.output_saver(rms, (0, N, N))
    g = _kernel(bb.build())
    inputs = [rand(rng, t) for t in g.input_types]
    _half_close(run_cpu(g, inputs), g, inputs)


@pytest.mark.parametrize("dtype", [F16, BF16], ids=lambda d: d.value)
def test_half_matmul_operands_read_in_place_at_every_isa(
    rng: np.random.Generator, dtype: DType, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Half-precision tiles that only matmuls read are read in place and widened in registers
    (with AVX512_BF16, two bf16 operands multiply as pairs): odd K (the pair tail), a column
    tail, accumulated over the loop, at every ISA level this host runs."""
    bb = BlockBuilder((2, 1, 1), 3, (T(12, 63, dtype=dtype), T(63, 37, dtype=dtype)))
    xt = bb.input_iter(0, (0, N, N), fdim=1)  # [6, 21]
    wt = bb.input_iter(1, (N, N, N), fdim=0)  # [21, 37]
    bb.output_saver(bb.apply(Op.ACC_SUM, bb.apply(Op.MATMUL, xt, wt)), (0, N, N))
    g = _kernel(bb.build())
    assert emit_cpu(g, "mj_probe").count("mj::tile_ref") == 2
    inputs = [rand(rng, t) for t in g.input_types]
    for level in isa.ISAS[: isa.ISAS.index(isa.detected_isa()) + 1]:
        monkeypatch.setenv(isa.ISA_ENV, level)
        _half_close(run_cpu(g, inputs), g, inputs)


@pytest.mark.parametrize("dtype", [F16, BF16], ids=lambda d: d.value)
def test_half_attention_rounds_where_the_reference_does_at_every_isa(
    rng: np.random.Generator, dtype: DType, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Attention in a half type: the kernel-level product and its max are held in the half type
    (rounded by each task, read half as many bytes), the block reads its contiguous logits
    tile where it lies, and exp's tile, which a matmul and a sum read, is rounded to the half
    type and held in it (``ir.precision``): with AVX512_BF16 both matmuls multiply pairs."""
    q_t, k_t, v_t = T(2, 8, 10, dtype=dtype), T(2, 10, 96, dtype=dtype), T(2, 96, 24, dtype=dtype)
    bb = BlockBuilder((4, 2, 1), 1, (T(2, 8, 96, dtype=dtype), T(2, 8, 1, dtype=dtype), v_t))
    s_tile = bb.input_iter(0, (1, 0, N))  # [1, 2, 96]: contiguous rows
    m_tile = bb.input_iter(1, (1, 0, N))
    v_tile = bb.input_iter(2, (N, 0, N))
    e = bb.apply(Op.EXP, bb.apply(Op.SUB, s_tile, m_tile))
    total = bb.apply(Op.REDUCE_SUM, e, dim=2)
    bb.output_saver(bb.apply(Op.DIV, bb.apply(Op.MATMUL, e, v_tile), total), (1, 0, N))
    kb = KernelBuilder()
    q, k, v = kb.input(q_t), kb.input(k_t), kb.input(v_t)
    s = kb.apply(Op.MATMUL, q, k)
    (y,) = kb.graph_def(bb.build(), s, kb.apply(Op.REDUCE_MAX, s, dim=2), v)
    kb.output(y)
    g = kb.build()
    source = emit_cpu(g, "mj_probe")
    ctype = "mj::bf16" if dtype is BF16 else "mj::f16"
    assert f"mj::View<{ctype}, mj::Shape<2,8,96>>" in source  # the product, rounded by tasks
    assert "mj::k::map(pool, mj::op::Round" not in source  # no pass over a float copy
    assert f"mj::Tile<{ctype}, mj::Shape<1,2,96>>" in source  # exp's tile
    assert "mj::tile_view" in source  # the logits, where they lie
    inputs = [rand(rng, t) for t in g.input_types]
    for level in isa.ISAS[: isa.ISAS.index(isa.detected_isa()) + 1]:
        monkeypatch.setenv(isa.ISA_ENV, level)
        _half_close(run_cpu(g, inputs), g, inputs)


def test_mixed_precision_bf16_weights_f32_activations(rng: np.random.Generator) -> None:
    """bf16 weights cast up inside the block, f32 activations and output (the way a model
    keeps its weights in bf16): checked against float64 at float32's tolerance of the
    product of the bf16-rounded weights."""
    bb = BlockBuilder((3, 1, 1), 2, (T(6, 40), T(40, 30, dtype=BF16)))
    xt = bb.input_iter(0, (0, N, N), fdim=1)
    wt = bb.apply(Op.CAST, bb.input_iter(1, (N, N, N), fdim=0), dtype=F32)
    bb.output_saver(bb.apply(Op.ACC_SUM, bb.apply(Op.MATMUL, xt, wt)), (0, N, N))
    g = _kernel(bb.build())
    check(g, [rand(rng, t) for t in g.input_types], tol=1e-5)


def test_half_results_of_matmuls_round_as_xla_writes_them(rng: np.random.Generator) -> None:
    """An f16 matmul whose products overflow f16 is inf, also when scaled down after it (XLA
    writes a dot out in its dtype; the fused float tile alone would stay finite)."""
    kb = KernelBuilder()
    a, b = kb.input(T(4, 8, dtype=F16)), kb.input(T(8, 4, dtype=F16))
    kb.output(kb.apply(Op.MUL_SCALAR, kb.apply(Op.MATMUL, a, b), scalar=1e-3))
    g = kb.build()
    big = np.full((4, 8), 200.0, np.float16), np.full((8, 4), 100.0, np.float16)  # 160000
    (y,) = run_cpu(g, list(big))
    assert np.isinf(y).all() and (y > 0).all(), y
    want = jax.jit(lambda p, q: (p @ q) * 1e-3)(*big)
    np.testing.assert_array_equal(y, np.asarray(want))


def test_symbol_must_be_a_c_identifier() -> None:
    kb = KernelBuilder()
    kb.output(kb.apply(Op.EXP, kb.input(T(4))))
    with pytest.raises(CompileError, match="not a C identifier"):
        emit_cpu(kb.build(), "9-lives")


def test_large_block_frames_use_thread_local_storage() -> None:
    bb = BlockBuilder((2, 1, 1), 1, (T(256, 512),))
    x = bb.input_iter(0, (1, N, N))  # a 256 KiB column block (strided: copied), plus exp's
    bb.output_saver(bb.apply(Op.EXP, x), (1, N, N))
    source = emit_cpu(_kernel(bb.build()), "k")
    assert re.search(r"static thread_local mj::Tile<float, mj::Shape<256,256>> \w+;", source)


def test_generated_source_is_deterministic_and_short() -> None:
    g = G.rmsnorm_linear_fused(16, 4096, 4096, grid=(64, 1), loop=64)
    a, b = emit_cpu(g, "k"), emit_cpu(g, "k")
    assert a == b
    assert len(a.splitlines()) < 70 and "mj::matmul_acc(" in a


@pytest.mark.parametrize("dtype", [F32, F64])
def test_reductions_fold_their_elementwise_producer(dtype: DType, rng: np.random.Generator) -> None:
    """A last-dim reduction of a single-use elementwise value folds it as it is computed (no
    tile for it), with full, row-broadcast and column-broadcast operands; a value with a
    second user, or reduced over another dim, is still stored."""
    bb = BlockBuilder((2, 1, 1), 1, (T(6, 37, dtype=dtype), T(6, 1, dtype=dtype),
                                     T(1, 37, dtype=dtype)))  # fmt: skip
    x = bb.input_iter(0, (0, N, N))  # [3, 37]: odd, so vector body and scalar tail both run
    c = bb.input_iter(1, (0, N, N))  # [3, 1]
    r = bb.input_iter(2, (N, N, N))  # [1, 37]
    for op in (Op.REDUCE_SUM, Op.REDUCE_MAX, Op.REDUCE_MEAN, Op.REDUCE_RMS):
        bb.output_saver(bb.apply(op, bb.apply(Op.MUL, x, x), dim=1), (0, N, N))
    bb.output_saver(bb.apply(Op.REDUCE_SUM, bb.apply(Op.EXP, bb.apply(Op.SUB, x, c)), dim=1),
                    (0, N, N))  # fmt: skip
    shared = bb.apply(Op.MUL, x, r)
    bb.output_saver(bb.apply(Op.REDUCE_SUM, shared, dim=1), (0, N, N))
    bb.output_saver(shared, (0, N, N))
    bb.output_saver(bb.apply(Op.REDUCE_SUM, bb.apply(Op.ADD, x, r), dim=0), (0, N, N))
    g = _kernel(bb.build())
    source = emit_cpu(g, "k")
    assert source.count("mj::map_reduce<") == 5
    assert "mj::map_reduce<mj::RmsR, mj::Shape<3,37>>" in source
    assert source.count("mj::reduce<mj::SumR") == 2  # the shared value and the dim-0 sum
    with _x64(dtype):
        check(g, [rand(rng, t) for t in g.input_types], tol=4e-6 if dtype is F32 else None)


def test_contiguous_tiles_are_views_and_outputs_are_written_in_place(
    rng: np.random.Generator,
) -> None:
    """Row blocks of a row-major tensor are read and written where they lie; column blocks
    are copied in and stored out."""
    bb = BlockBuilder((2, 1, 1), 2, (T(2, 6, 10), T(4, 12)))
    rows = bb.input_iter(0, (0, N, N), 1)  # [1, 3, 10]: contiguous rows of one matrix
    cols = bb.input_iter(1, (N, N, N), 1)  # [4, 6]: a column block of each row
    y = bb.apply(Op.TANH, rows)
    bb.output_saver(y, (0, N, N), fdim=1)
    bb.output_saver(bb.apply(Op.EXP, cols), (1, N, N), fdim=0)
    g = _kernel(bb.build())
    source = emit_cpu(g, "k")
    view = "tile_view<mj::Shape<2,6,10>, mj::Map<0,-1,-1>, 1, mj::Shape<1,3,10>>"
    assert f"{view}(in0, b, i)" in source and f"{view}(out0, b, i)" in source
    assert "load_tile<mj::Shape<4,12>" in source and source.count("store_tile<") == 1
    check(g, [rand(rng, t) for t in g.input_types], tol=4e-6)
