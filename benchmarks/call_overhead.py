"""What one custom call costs inside a program, beyond its own work.

A kernel that wins alone can lose in a program (``planner/whole.py``). This probe separates
the costs: hand-written kernels with the generated kernels' ABI (a copy, then a busy wait of
``--work-us`` on the calling thread, or split over XLA's pool as generated kernels split their
grid) run alone, before and after an XLA fusion, and inside the kernel the calling thread and
each chunk record when they start and end. It prints, per shape and program, the median time of
a call and these moments relative to the kernel's entry:

- ``enter``: from the Python call to the kernel's entry (PjRt runs a program of fewer than
  ~1000 flops inline on the caller, any other on a pool thread, which may be asleep);
- ``kernel``, ``after``: the kernel's own time, and from its return to the Python caller's;
- ``helper``: when the last chunk started (a pool thread woken for it starts late);
- ``exit - last``: from the last chunk's end to the kernel's return (the caller's wait);
- ``excess``: program time minus the kernel alone minus the fusion alone plus one empty call.

    python benchmarks/call_overhead.py [--shapes 8x64 64x512 256x1024] [--work-us 16]
"""

from __future__ import annotations

import argparse
import ctypes
import statistics
import sys

SOURCE = r"""
#include <chrono>
#include <cstring>
#include <time.h>
#include "cpu/abi.h"

static int64_t g_n = 0, g_work_ns = 0, g_chunks = 1;
static double g_times[2 + 2 * 64];  // entry, exit, then (start, end) per chunk

static double now_us() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e6 + ts.tv_nsec * 1e-3;
}
static void busy(int64_t ns) {
  const auto t0 = std::chrono::steady_clock::now();
  while (std::chrono::steady_clock::now() - t0 < std::chrono::nanoseconds(ns)) {}
}
struct Args { const float* x; float* y; int64_t chunks; };
static void chunk(void* p, int64_t i) {
  Args* a = static_cast<Args*>(p);
  g_times[2 + 2 * i] = now_us();
  const int64_t lo = g_n * i / a->chunks, hi = g_n * (i + 1) / a->chunks;
  std::memcpy(a->y + lo, a->x + lo, (hi - lo) * sizeof(float));
  busy(g_work_ns / a->chunks);
  g_times[3 + 2 * i] = now_us();
}
static int run(const void* const* in, void* const* out, const mj_pool* pool, int64_t chunks) {
  g_times[0] = now_us();
  g_chunks = chunks;
  Args a{static_cast<const float*>(in[0]), static_cast<float*>(out[0]), chunks};
  if (chunks == 1) chunk(&a, 0);
  else pool->parallel_for(pool->ctx, chunks, chunk, &a);
  g_times[1] = now_us();
  return 0;
}
MJ_EXPORT int probe_serial(const void* const* in, void* const* out, const mj_pool* pool) {
  return run(in, out, pool, 1);
}
MJ_EXPORT int probe_pool(const void* const* in, void* const* out, const mj_pool* pool) {
  return run(in, out, pool, pool->num_threads > 1 ? 2 * pool->num_threads : 1);
}
MJ_EXPORT void probe_set(int64_t n, int64_t work_ns) { g_n = n; g_work_ns = work_ns; }
MJ_EXPORT double probe_time(int k) { return g_times[k]; }
MJ_EXPORT double probe_now() { return now_us(); }
MJ_EXPORT int64_t probe_chunks() { return g_chunks; }
"""


def _library():
    from mirage_jax.backend.cpu.build import compile_shared_library
    from mirage_jax.runtime import load_kernel

    lib = compile_shared_library(SOURCE, name_hint="call_overhead")
    so = ctypes.CDLL(str(lib.path))
    for fn in ("probe_time", "probe_now"):
        getattr(so, fn).restype = ctypes.c_double
    so.probe_chunks.restype = ctypes.c_int64
    return so, {kind: load_kernel(lib, f"probe_{kind}") for kind in ("serial", "pool")}


def _programs(names, shape):
    import jax
    import jax.numpy as jnp

    from mirage_jax.runtime import kernel_call

    aval = [jax.ShapeDtypeStruct(shape, jnp.float32)]

    def fusion(x):
        return jnp.tanh(x) * x + 1.0

    progs = {"empty": jax.jit(lambda x: x[:1, :1] * 2.0), "fusion": jax.jit(fusion)}
    for kind, name in names.items():
        def call(x, name=name):
            return kernel_call(name, aval, x)[0]
        progs[kind] = jax.jit(call)
        progs[f"{kind};fusion"] = jax.jit(lambda x, call=call: fusion(call(x)))
        progs[f"fusion;{kind}"] = jax.jit(lambda x, call=call: call(fusion(x)))
    return progs


def _measure(so, fn, x, calls: int) -> dict[str, float]:
    fn(x).block_until_ready()
    chunks = so.probe_chunks()
    rows = []
    for _ in range(calls):
        t0 = so.probe_now()
        fn(x).block_until_ready()
        t1 = so.probe_now()
        entry, exit_ = so.probe_time(0), so.probe_time(1)
        starts = [so.probe_time(2 + 2 * i) for i in range(chunks)]
        ends = [so.probe_time(3 + 2 * i) for i in range(chunks)]
        rows.append((t1 - t0, entry - t0, max(starts) - entry, exit_ - max(ends),
                     exit_ - entry, t1 - exit_))  # fmt: skip
    med = [statistics.median(c) for c in zip(*rows)]
    return dict(zip(("total", "enter", "helper", "exit - last", "kernel", "after"), med))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", nargs="+", default=["8x64", "64x512", "256x1024"])
    parser.add_argument("--work-us", type=float, default=16.0)
    parser.add_argument("--calls", type=int, default=400)
    args = parser.parse_args(argv)

    import jax
    import numpy as np

    so, names = _library()
    for text in args.shapes:
        shape = tuple(int(d) for d in text.split("x"))
        so.probe_set(ctypes.c_int64(int(np.prod(shape))), ctypes.c_int64(int(args.work_us * 1e3)))
        x = jax.numpy.asarray(np.random.default_rng(0).standard_normal(shape, np.float32))
        progs = _programs(names, shape)
        alone: dict[str, float] = {}
        print(f"\n{text}: kernel work {args.work_us:g} us")
        for label, fn in progs.items():
            m = min((_measure(so, fn, x, args.calls) for _ in range(3)), key=lambda r: r["total"])
            if label in ("empty", "fusion"):
                alone[label] = m["total"]
                print(f"  {label:16s} total {m['total']:7.1f} us")
                continue
            kind = "serial" if "serial" in label else "pool"
            alone.setdefault(kind, m["total"])
            excess = m["total"] - alone[kind] - alone["fusion"] + alone["empty"]
            print(f"  {label:16s} total {m['total']:7.1f} us  enter {m['enter']:6.1f}  kernel "
                  f"{m['kernel']:6.1f}  after {m['after']:6.1f}  helper {m['helper']:6.1f}  "
                  f"exit - last {m['exit - last']:6.1f}"
                  + (f"  excess {excess:6.1f}" if ";" in label else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
