"""Memory safety of the native code: generated kernels under AddressSanitizer and UBSan.

A sample of generated kernels - every kernel-level operator (f32, f64, bf16, f16, odd sizes so SIMD
bodies and scalar tails both run, broadcasting, batched matmuls, layout ops, casts), every
for-loop accumulator over no dim and each tile dim (also in loops split across threads, and
the online-softmax pair), and the fused graphs of ``tests/graphs.py`` (RMSNorm+linear, gated
MLP, FlashAttention, FlashDecoding) - is emitted as C++, built with ``-fsanitize=address,
undefined`` into one executable (a few translation units of several kernels each, so the slow
sanitized build runs a handful of times) and run on exact-size heap buffers with a 3-thread
pool standing in for XLA's. Any sanitizer report fails the run; the outputs must also equal
the float reference interpreter, so the sanitized build is the same code computing the same
numbers. Marked ``sanitize`` (CI runs it with the rest: ``python -m pytest``).
"""

from __future__ import annotations

import re
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import graphs as G
import numpy as np
import pytest
from graphs import T
from tolerance import rtol_for

from mirage_jax.backend.cpu.build import runtime_include_dir
from mirage_jax.backend.cpu.emit import emit_cpu, splits_loop
from mirage_jax.backend.cpu.isa import host_isa, isa_flags
from mirage_jax.interpret import evaluate
from mirage_jax.ir import (
    BF16,
    BOOL,
    F16,
    F32,
    F64,
    BlockBuilder,
    DType,
    KernelBuilder,
    KernelGraph,
    Op,
)
from mirage_jax.ir.ops import BINARY, MASKED, REDUCTIONS, UNARY

pytestmark = pytest.mark.sanitize

N = -1  # "not mapped" in imap / omap / fdim
CXX = shutil.which("g++")
SANITIZE = ("-fsanitize=address,undefined", "-fno-sanitize-recover=all",
            "-fno-omit-frame-pointer")  # fmt: skip
_SCALARS = {Op.MUL_SCALAR: {"scalar": 1.5}, Op.ADD_SCALAR: {"scalar": -0.25},
            Op.POW_SCALAR: {"exponent": 1.5}, Op.FINITE_OR: {"fill": 0.0}}  # fmt: skip


def every_operator(dtype: DType) -> KernelGraph:
    """Each kernel-level op once, on odd shapes: unary, scalar, binary (broadcast), reductions
    over each dim, matmuls (batched, broadcast), transpose, slices, reshape, concat, casts,
    masks."""
    kb = KernelBuilder()
    a = kb.input(T(5, 37, dtype=dtype))
    row = kb.input(T(1, 37, dtype=dtype))
    w = kb.input(T(37, 19, dtype=dtype))
    batch = kb.input(T(3, 5, 37, dtype=dtype))
    batch_w = kb.input(T(3, 37, 19, dtype=dtype))
    for op in sorted(UNARY, key=lambda o: o.value):
        kb.output(kb.apply(op, a, **_SCALARS.get(op, {})))
    for op in sorted(BINARY - MASKED, key=lambda o: o.value):
        kb.output(kb.apply(op, a, row))
    mask = kb.input(T(1, 37, dtype=BOOL))
    for op in sorted(MASKED, key=lambda o: o.value):
        kb.output(kb.apply(op, mask, a, fill=-np.inf))
    for op in sorted(REDUCTIONS, key=lambda o: o.value):
        for dim in (0, 1):
            kb.output(kb.apply(op, a, dim=dim))
    kb.output(kb.matmul(a, w))
    kb.output(kb.matmul(batch, batch_w))
    kb.output(kb.apply(Op.TRANSPOSE, batch, perm=(2, 0, 1)))
    for dim in (0, 1, 2):
        kb.output(kb.apply(Op.SLICE, batch, dim=dim, start=1, size=2))
    kb.output(kb.apply(Op.CONCAT, a, row, dim=0))
    kb.output(kb.apply(Op.CONCAT, batch, batch, dim=2))
    kb.output(kb.apply(Op.EXP, kb.apply(Op.RESHAPE, batch, shape=(15, 37))))
    other = F64 if dtype is F32 else F32
    kb.output(kb.apply(Op.CAST, kb.apply(Op.CAST, a, dtype=other), dtype=dtype))
    return kb.build()


def every_accumulator(grid: int, loop: int) -> KernelGraph:
    """acc_sum / mean / max / rms over no dim and each tile dim, the online-softmax pair and a
    matmul accumulated in the loop; ``grid`` 1 splits the loop across threads."""
    args = (T(6, 5 * loop), T(5 * loop, 7)) + ((T(6, loop),) if grid > 1 else ())
    bb = BlockBuilder((grid, 1, 1), loop, args)
    x = bb.input_iter(0, (0 if grid > 1 else N, N, N), 1)
    w = bb.input_iter(1, (N, N, N), 0)
    for op in (Op.ACC_SUM, Op.ACC_MEAN, Op.ACC_MAX, Op.ACC_RMS):
        for dim in (N, 0, 1):
            bb.output_saver(bb.apply(op, x, dim=dim), (0 if grid > 1 else N, N, N))
    omap = (0 if grid > 1 else N, N, N)
    bb.output_saver(bb.apply(Op.ACC_SUM, bb.matmul(x, w)), omap)
    if grid > 1:  # rescaled sums keep the loop whole
        m = bb.input_iter(2, (0, N, N), 1)
        bb.output_saver(bb.apply(Op.ACC_RESCALE_SUM, x, m), omap)
        bb.output_saver(bb.apply(Op.ACC_MAX, m), omap)
    kb = KernelBuilder()
    ins = [kb.input(t) for t in bb.build().arg_types]
    for y in kb.graph_def(bb.build(), *ins):
        kb.output(y)
    return kb.build()


def sample() -> dict[str, KernelGraph]:
    graphs = {
        "ops_f32": every_operator(F32), "ops_f64": every_operator(F64),
        "ops_bf16": every_operator(BF16), "ops_f16": every_operator(F16),
        "accumulators": every_accumulator(2, 4), "accumulators_split": every_accumulator(1, 5),
        "rmsnorm_linear": G.rmsnorm_linear_fused(8, 256, 96, grid=(2, 2), loop=4),
        "rmsnorm_linear_split": G.rmsnorm_linear_fused(2, 256, 96, grid=(1, 1), loop=8),
        "rmsnorm_linear_plain": G.rmsnorm_linear_plain(7, 33, 19),
        "gated_mlp": G.gated_mlp_fused(8, 128, 64, grid=(2, 2), loop=4),
        "gated_mlp_thread": G.gated_mlp_fused(8, 128, 64, grid=(4, 1), loop=2, thread=True),
        "gated_mlp_plain": G.gated_mlp_plain(5, 33, 17),
        "flash_attention": G.attention_fused(2, 8, 16, 128, row_blocks=2, loop=4),
        "flash_decoding": G.flash_decoding_split(2, 4, 16, 128, splits=2, loop=4),
        "attention_plain": G.attention_plain(2, 3, 9, 31),
        "masked_attention": G.masked_attention_fused(2, 8, 16, 128, loop=4),
    }  # fmt: skip
    block = graphs["accumulators_split"].nodes_of(Op.GRAPH_DEF)[0].attr("block")
    assert splits_loop(block), "the split-loop sample must run split"
    return graphs


# --- the harness ---------------------------------------------------------------------------

_MAIN = r"""
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <string>
#include <thread>
#include <vector>
#include "cpu/abi.h"

// XLA's intra-op pool, stood in for by fresh threads per call (nested calls allowed).
static void parallel_for(void*, int64_t n, void (*fn)(void*, int64_t), void* arg) {
  std::atomic<int64_t> next{0};
  auto work = [&] { for (int64_t i; (i = next.fetch_add(1)) < n;) fn(arg, i); };
  std::vector<std::thread> threads;
  for (int t = 1; t < 3; ++t) threads.emplace_back(work);
  work();
  for (auto& t : threads) t.join();
}

// One exact-size heap buffer per operand, so a read or write past its end is reported.
static std::vector<char*> load(const std::string& dir, const char* kind,
                               const std::vector<long>& bytes) {
  std::vector<char*> out;
  for (size_t k = 0; k < bytes.size(); ++k) {
    char* p = new char[bytes[k]];
    std::ifstream(dir + "/" + kind + std::to_string(k), std::ios::binary).read(p, bytes[k]);
    out.push_back(p);
  }
  return out;
}

static int run(const std::string& dir, mj_kernel_fn fn, const std::vector<long>& in_bytes,
               const std::vector<long>& out_bytes) {
  const mj_pool pool{nullptr, 3, parallel_for};
  auto ins = load(dir, "in", in_bytes);
  auto outs = load(dir, "in", {});
  for (long b : out_bytes) outs.push_back(new char[b]);
  const int err = fn(reinterpret_cast<const void* const*>(ins.data()),
                     reinterpret_cast<void* const*>(outs.data()), &pool);
  for (size_t k = 0; k < outs.size(); ++k)
    std::ofstream(dir + "/out" + std::to_string(k), std::ios::binary).write(outs[k], out_bytes[k]);
  for (char* p : ins) delete[] p;
  for (char* p : outs) delete[] p;
  return err;
}
"""


def _prototype(symbol: str) -> str:
    return (f'extern "C" int {symbol}(const void* const*, void* const*, const mj_pool*);')


def _unit(sources: dict[str, str]) -> str:
    """Several generated kernels in one translation unit, each in a namespace of its own (their
    block functions share names); the exported symbols differ."""
    parts = ['#include "cpu/mirage.h"']
    for name, source in sources.items():
        body = source.replace('#include "cpu/mirage.h"', "")
        parts.append(f"namespace unit_{name} {{\n{body}\n}}  // namespace unit_{name}")
    return "\n".join(parts)


def _bytes(types) -> str:
    return "{" + ", ".join(str(int(np.prod(t.shape)) * t.dtype.itemsize) for t in types) + "}"


def _main(graphs: dict[str, KernelGraph], workdir: Path) -> str:
    lines = [_MAIN, *(_prototype(f"mjs_{name}") for name in graphs), "int main() {", "  int bad = 0;"]
    for name, g in graphs.items():
        lines.append(f'  bad |= run("{workdir / name}", mjs_{name}, {_bytes(g.input_types)}, '
                     f"{_bytes(g.output_types)});")
    lines += ['  std::printf("done %d\\n", bad);', "  return bad;", "}"]
    return "\n".join(lines)


def _compile(args: list[str]) -> None:
    proc = subprocess.run(args, capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, f"$ {' '.join(args)}\n{proc.stderr[-4000:]}"


@pytest.mark.skipif(CXX is None, reason="g++ not found")
def test_generated_kernels_run_clean_under_asan_and_ubsan(tmp_path: Path) -> None:
    graphs = sample()
    rng = np.random.default_rng(0)
    inputs = {}
    for name, g in graphs.items():
        (tmp_path / name).mkdir()
        inputs[name] = [rng.random(t.shape) < 0.5 if t.dtype is BOOL else
                        rng.standard_normal(t.shape).astype(t.dtype.numpy)
                        for t in g.input_types]  # fmt: skip
        for k, x in enumerate(inputs[name]):
            (tmp_path / name / f"in{k}").write_bytes(x.tobytes())
    names = list(graphs)
    units = [names[i::3] for i in range(3)]  # three translation units, built side by side
    flags = ["-O1", "-g", "-std=c++17", *SANITIZE, *isa_flags(host_isa()),
             "-I", str(runtime_include_dir())]  # fmt: skip
    jobs = []
    for i, unit in enumerate(units):
        src = tmp_path / f"unit{i}.cpp"
        src.write_text(_unit({n: emit_cpu(graphs[n], f"mjs_{n}") for n in unit}))
        jobs.append([CXX, *flags, "-c", str(src), "-o", str(src.with_suffix(".o"))])
    main = tmp_path / "main.cpp"
    main.write_text(_main(graphs, tmp_path))
    jobs.append([CXX, *flags, "-c", str(main), "-o", str(main.with_suffix(".o"))])
    with ThreadPoolExecutor(2) as pool:
        list(pool.map(_compile, jobs))
    exe = tmp_path / "kernels"
    _compile([CXX, *SANITIZE, *(str(p) for p in sorted(tmp_path.glob("*.o"))), "-o", str(exe),
              "-pthread"])  # fmt: skip

    env = {"ASAN_OPTIONS": "detect_leaks=1:halt_on_error=1:detect_stack_use_after_return=1",
           "UBSAN_OPTIONS": "print_stacktrace=1:halt_on_error=1", "PATH": "/usr/bin:/bin"}
    proc = subprocess.run([str(exe)], capture_output=True, text=True, timeout=600, env=env,
                          check=False)  # fmt: skip
    report = re.search(r"(ERROR: \w+Sanitizer|runtime error:|LeakSanitizer)", proc.stderr)
    assert proc.returncode == 0 and not report, proc.stderr[-6000:]
    assert proc.stdout.strip() == "done 0", proc.stdout

    for name, g in graphs.items():
        half = any(t.dtype in (BF16, F16) for t in g.input_types)
        # half-precision graphs: the reference in their own dtypes (rounded where the kernels
        # round, overflowing f16 where they overflow it), at the dtype's tolerance
        want = evaluate(g, inputs[name], precision=None if half else "float64")
        for k, (t, w) in enumerate(zip(g.output_types, want)):
            w = w.astype(np.float64)
            rtol = max(1e-4, rtol_for(t.dtype.numpy))
            got = np.frombuffer((tmp_path / name / f"out{k}").read_bytes(), t.dtype.numpy)
            got = got.reshape(t.shape).astype(np.float64)
            finite = np.isfinite(w)
            assert (np.isnan(got) == np.isnan(w)).all(), f"{name} output {k}: NaNs differ"
            scale = max(1.0, float(np.max(np.abs(w[finite]), initial=0.0)))
            np.testing.assert_allclose(got[finite], w[finite], rtol=rtol, atol=rtol * scale,
                                       err_msg=f"{name} output {k}")  # fmt: skip


def test_the_harness_reports_an_overflow(tmp_path: Path) -> None:
    """The same build and run catch a kernel that writes one element past its output."""
    if CXX is None:
        pytest.skip("g++ not found")
    src = tmp_path / "bad.cpp"
    src.write_text(_MAIN + '\nextern "C" int bad(const void* const*, void* const* out, '
                   "const mj_pool*) { static_cast<float*>(out[0])[4] = 1; return 0; }\n"
                   f'int main() {{ return run("{tmp_path}", bad, {{}}, {{16}}); }}\n')
    exe = tmp_path / "bad"
    _compile([CXX, "-O1", "-g", "-std=c++17", *SANITIZE, "-I", str(runtime_include_dir()),
              str(src), "-o", str(exe), "-pthread"])  # fmt: skip
    proc = subprocess.run([str(exe)], capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode != 0 and "heap-buffer-overflow" in proc.stderr, proc.stderr[-2000:]
