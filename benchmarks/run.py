"""Mirage's benchmark suite against XLA fusion (jax.jit), measured in one process.

    python benchmarks/run.py [--bs 1 8] [--programs rmsnorm_linear lora] [--json out.json]
                             [--chart speedups.png] [--strategy search]
                             [--dtype float32 bfloat16]

With ``--dtype float32 bfloat16`` every case also runs with bfloat16 inputs and weights (the
same program: jax computes it in bfloat16); its row's speedup is over ``jax.jit`` of the
bfloat16 program, and ``vs f32`` is our float32 plan's time over our bfloat16 plan's.

For every program and batch size: jax.jit median time, mirage_jax.optimize median time, the
speedup, this machine's roofline floor (max of bytes / memory bandwidth and flops / matmul
rate, both measured right before and after the case is timed), the fraction of the floor
each reaches, and mirage's fraction of a second floor ("mj/fl~") whose bandwidth and rate
were measured between the rounds of the two programs' timing (the memory bus of a shared
host drifts within seconds, so the floor around the timing can be faster than the bus the
programs met), the cold planning time (trace, search, compile, verify, time; empty cache) with
the search's and the C++ compiler's share of it, the planning time from the on-disk cache
(which searches and compiles nothing), the time of a no-op jitted call on the same arguments
(the fixed cost of any call from Python, which bounds the smallest cases), and the share of
CPU time the hypervisor stole while the case was timed (a noisy-neighbour flag), and the
A/A ratio: jax.jit timed against a second jax.jit of the same program by the same harness,
the noise floor of that row's speedup (1.00 for a harness without bias). For every
memory-bound case over its floor target the summary also gives its ratio to memory time +
compute time + that call: the floor of a host whose cores do not overlap reads from memory
with FMAs (the probe's stream_overlap near 0, as on an Ice Lake Xeon).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

import mirage_jax as mj
import programs
from mirage_jax.backend.cpu.build import build_stats, reset_build_stats
from mirage_jax.ir import Op
from mirage_jax.timing import compare, median_seconds


class Ceilings:
    """This machine's streaming-read bandwidth and matmul rate, measured on demand.

    The memory bus of these shared hosts drifts by up to 2x within minutes (17-37 GB/s seen
    on one host in one session), so a floor measured at the start of a run says little about
    a case timed ten minutes later: each case takes its floor from measurements right before
    and right after its own timing, the better of the two (the stricter floor), and a second
    one from the same probes timed between the rounds of the case's (``probes``, ``rates``).

    Bandwidth: a row reduction over 128 MiB reads without allocating an output, so page faults
    on fresh output buffers do not pollute the figure; the better of XLA's reduction and the
    same reduction compiled by mirage_jax as is (XLA's alone leaves bandwidth unused here,
    which would put the floor too low). Matmul: XLA's 2048^3 product.
    """

    def __init__(self) -> None:
        self.x = jnp.ones((64, 512 * 1024), jnp.float32)

        def rows(a):
            return jnp.sum(a, axis=1)

        self.readers = [jax.jit(rows), mj.optimize(rows, strategy="as_is",
                                                   require_speedup=False, cache=False)]
        self.a = jnp.ones((2048, 2048), jnp.float32)
        self.matmul = jax.jit(lambda x, y: x @ y)

    def measure(self, budget_s: float = 0.5) -> tuple[float, float]:
        """(bytes/s, flop/s) now."""
        return self.rates([median_seconds(f, a, budget_s=budget_s) for f, a in self.probes()])

    def probes(self) -> list[tuple[Callable[..., Any], tuple[Any, ...]]]:
        """The timed calls behind ``measure``, for timing interleaved with a case's own."""
        return [(f, (self.x,)) for f in self.readers] + [(self.matmul, (self.a, self.a))]

    def rates(self, seconds: list[float]) -> tuple[float, float]:
        """(bytes/s, flop/s) from the median seconds of ``probes()``."""
        *reads, product = seconds
        return self.x.nbytes / min(reads), 2 * 2048**3 / product


def program_cost(program: programs.Program, args: list) -> tuple[float, float]:
    """Minimal bytes (inputs once, outputs once) and flops of the traced program."""
    traced = mj.trace(program.fn, *args)
    nbytes = sum(a.nbytes for a in args)
    out = jax.eval_shape(program.fn, *args)
    nbytes += sum(np.prod(o.shape) * np.dtype(o.dtype).itemsize for o in jax.tree.leaves(out))
    flops = 0.0
    for region in traced.regions:
        g = region.graph
        for node in g.nodes:
            t = g.types[node.outs[0]] if node.outs else None
            if node.op is Op.MATMUL:
                k = g.types[node.ins[0]].shape[-1]
                flops += 2 * t.size * k
            elif t is not None:
                flops += t.size
    return float(nbytes), flops


def dispatch_seconds(args: tuple) -> float:
    """Median time of a jitted call on the same arguments that does almost no work: what any
    program pays per call from Python (dispatch, launching the executable, waiting for its
    result) before its first byte is read. For sub-100 us cases this fixed cost, not the
    memory bus, is what keeps a kernel from its floor."""
    leaves = jax.tree.leaves(args)
    noop = jax.jit(lambda *a: a[0].ravel()[:1] + 1)
    return median_seconds(noop, leaves, budget_s=0.3)


def cpu_ticks() -> tuple[int, int] | None:
    """(steal, total) jiffies of all CPUs from /proc/stat, or None off Linux.

    On a shared virtual machine another tenant can take the cores for a while: the steal
    share during a case's timing says whether its ratio was measured on a quiet machine.
    """
    try:
        fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    except OSError:
        return None
    ticks = [int(f) for f in fields]
    return (ticks[7] if len(ticks) > 7 else 0), sum(ticks[:8])


def steal_share(before: tuple[int, int] | None, after: tuple[int, int] | None) -> float | None:
    if before is None or after is None or after[1] <= before[1]:
        return None
    return (after[0] - before[0]) / (after[1] - before[1])


def timed_with_probes(fast: Callable[..., Any], xla: Callable[..., Any], args: tuple,
                      ceilings: Ceilings, rounds: int) -> tuple[float, float, list[float]]:  # fmt: skip
    """Median times of the two programs (``compare``, half a second per round) and of the
    ceilings' probes, which run between the rounds: a floor from the memory bus and cores as
    the programs found them. Between rounds, not between blocks of calls: a probe's 128 MiB
    read evicts a small case's inputs from cache and its product leaves the cores busy for a
    while, which would slow the first calls of every block after it."""
    rows = []
    for _ in range(rounds):
        t_mj, t_xla = compare(fast, xla, args, rounds=1, budget_s=0.5)
        probes = [median_seconds(f, a, warmup=1, min_reps=3, budget_s=0.05)
                  for f, a in ceilings.probes()]  # fmt: skip
        rows.append([t_mj, t_xla, *probes])
    t_mj, t_xla, *probe_s = (statistics.median(col) for col in zip(*rows))
    return t_mj, t_xla, probe_s


def bench_case(program: programs.Program, bs: int, args_ns: argparse.Namespace,
               ceilings: Ceilings) -> dict:  # fmt: skip
    inputs = [jax.device_put(x) for x in programs.make_inputs(program, seed=0)]
    args = program.call_args(inputs)
    nbytes, flops = program_cost(program, args)

    with tempfile.TemporaryDirectory() as cache_dir:
        os.environ["MIRAGE_JAX_CACHE_DIR"] = cache_dir
        fast = mj.optimize(program.fn, strategy=args_ns.strategy)
        reset_build_stats()
        t0 = time.perf_counter()
        plan = fast.plan(*args)
        cold = time.perf_counter() - t0
        built = build_stats()
        warm_fn = mj.optimize(program.fn, strategy=args_ns.strategy)
        t0 = time.perf_counter()
        warm_plan = warm_fn.plan(*args)
        warm = time.perf_counter() - t0
    os.environ.pop("MIRAGE_JAX_CACHE_DIR")

    xla = jax.jit(program.fn)
    got = np.asarray(fast(*args), np.float64)
    want = np.asarray(xla(*args), np.float64)
    err = float(np.max(np.abs(got - want)) / max(np.max(np.abs(want)), 1e-30))
    before = ceilings.measure()
    dispatch = dispatch_seconds(args)
    ticks = cpu_ticks()
    t_mj, t_xla, probe_s = timed_with_probes(fast, xla, args, ceilings, args_ns.rounds)
    steal = steal_share(ticks, cpu_ticks())
    # the harness's own noise floor: jax.jit against a second jax.jit of the same program
    again = jax.jit(lambda *a: program.fn(*a))
    t_again, t_first = compare(again, xla, args, rounds=args_ns.rounds, budget_s=0.5)
    after = ceilings.measure()
    bw, rate = max(before[0], after[0]), max(before[1], after[1])
    memory_s, compute_s = nbytes / bw, flops / rate
    floor = max(memory_s, compute_s)
    bound = "memory" if memory_s >= compute_s else "compute"
    bw_during, rate_during = ceilings.rates(probe_s)
    floor_during = max(nbytes / bw_during, flops / rate_during)
    search_s = sum(p.search_report.total_s for p in plan.regions if p.search_report)
    searched_again = sum(p.search_report is not None for p in warm_plan.regions)
    return {
        "program": program.name, "bs": bs, "bound": bound, "xla_s": t_xla, "mirage_s": t_mj,
        "speedup": t_xla / t_mj, "floor_s": floor, "bandwidth": bw, "matmul_rate": rate,
        "xla_of_floor": t_xla / floor,
        "mirage_of_floor": t_mj / floor, "dispatch_s": dispatch,
        "mirage_of_floor_dispatch": t_mj / (floor + dispatch),
        # the floor from the ceilings measured between the rounds of the two programs' timing
        "bandwidth_during": bw_during, "matmul_rate_during": rate_during,
        "floor_during_s": floor_during, "mirage_of_floor_during": t_mj / floor_during,
        # the floor of a host that cannot overlap reads with FMAs (calibrate.h, stream_overlap)
        "memory_s": memory_s, "compute_s": compute_s,
        "mirage_of_sum": t_mj / (memory_s + compute_s + dispatch),
        "plan_cold_s": cold, "plan_cached_s": warm,
        "search_s": search_s, "searches_from_cache": searched_again,
        "compile_s": built.compile_s, "compiles": built.compiles, "max_rel_err": err,
        "steal": steal, "aa": t_first / t_again,
        "regions": [p.describe() for p in plan.regions],
    }  # fmt: skip


FLOOR_TARGET = 1.25  # issue 5: memory-bound cases within 1.25x of their floor


def print_table(rows: list[dict]) -> None:
    head = (f"{'program':16} {'bs':>2} {'dtype':>8} {'vs f32':>6} {'jax.jit':>10} {'mirage':>10} {'speedup':>8} "
            f"{'floor':>10} {'bound':>7} {'GB/s':>5} {'disp':>6} {'xla/fl':>7} {'mj/fl':>7} "
            f"{'mj/fl~':>7} {'cold':>7} "
            f"{'search':>7} "
            f"{'compile':>8} {'cached':>7} {'steal':>6} {'A/A':>5}")  # fmt: skip
    print(head)
    print("-" * len(head))
    for r in rows:
        vs = f"{r['vs_f32']:.2f}x" if "vs_f32" in r else "-"
        print(f"{r['program']:16} {r['bs']:>2} {r.get('dtype', 'float32'):>8} {vs:>6} "
              f"{r['xla_s']*1e3:>8.3f}ms "
              f"{r['mirage_s']*1e3:>8.3f}ms {r['speedup']:>7.2f}x {r['floor_s']*1e3:>8.3f}ms "
              f"{r['bound']:>7} {r['bandwidth'] / 1e9:>5.1f} {r['dispatch_s'] * 1e6:>4.0f}us "
              f"{r['xla_of_floor']:>7.2f} "
              f"{r['mirage_of_floor']:>7.2f} {r['mirage_of_floor_during']:>7.2f} "
              f"{r['plan_cold_s']:>6.1f}s {r['search_s']:>6.1f}s {r['compile_s']:>7.1f}s "
              f"{r['plan_cached_s']:>6.2f}s "
              f"{_percent(r.get('steal')):>6} {r['aa']:>5.3f}")
    print()
    aa = [r["aa"] for r in rows]
    print(f"A/A (jax.jit against itself, the noise floor of these speedups): "
          f"{min(aa):.3f} to {max(aa):.3f}, median {statistics.median(aa):.3f}")
    for dtype in dict.fromkeys(r.get("dtype", "float32") for r in rows):
        speedups = [r["speedup"] for r in rows if r.get("dtype", "float32") == dtype]
        geo = math.exp(statistics.mean(math.log(s) for s in speedups))
        print(f"geomean speedup over jax.jit, {dtype}: {geo:.2f}x; min {min(speedups):.2f}x")
        vs = [r["vs_f32"] for r in rows if r.get("dtype") == dtype and "vs_f32" in r]
        if vs:
            geo = math.exp(statistics.mean(math.log(s) for s in vs))
            print(f"  over our float32 plan: geomean {geo:.2f}x; min {min(vs):.2f}x")
    memory = [r for r in rows if r["bound"] == "memory"]
    if memory:
        worst = max(memory, key=lambda r: r["mirage_of_floor"])
        print(f"memory-bound cases: {len(memory)}; worst mirage/floor "
              f"{worst['mirage_of_floor']:.2f} ({worst['program']} bs={worst['bs']})")
        for key, what in (("mirage_of_floor", "the floor around the timing"),
                          ("mirage_of_floor_during", "the floor measured between its rounds")):
            met = sum(r[key] <= FLOOR_TARGET for r in memory)
            print(f"  within {FLOOR_TARGET}x of {what}: {met} of {len(memory)}")
        for r in memory:
            if r["mirage_of_floor"] > FLOOR_TARGET:
                print(f"  {r['program']} bs={r['bs']}: {r['mirage_of_floor']:.2f}x its floor; "
                      f"{r['mirage_of_floor_dispatch']:.2f}x of floor + a no-op call's "
                      f"{r['dispatch_s'] * 1e6:.0f} us; {r['mirage_of_sum']:.2f}x of memory + "
                      f"compute ({r['compute_s'] * 1e3:.3f} ms) + that call, the floor where "
                      "reads and FMAs do not overlap")


def _percent(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def draw_chart(rows: list[dict], path: str) -> None:
    try:
        import matplotlib
    except ImportError:
        print(f"no chart: matplotlib is not installed (pip install matplotlib), not writing {path}")
        return

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [f"{r['program']}\nbs={r['bs']}" for r in rows]
    fig, ax = plt.subplots(figsize=(max(6, len(rows)), 4))
    ax.bar(labels, [r["speedup"] for r in rows])
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_ylabel("speedup over jax.jit")
    fig.tight_layout()
    fig.savefig(path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bs", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--programs", nargs="*")
    parser.add_argument("--strategy", default="search", choices=("search", "as_is"))
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", default="benchmarks/results.json")
    parser.add_argument("--chart")
    parser.add_argument("--dtype", nargs="+", default=["float32"],
                        choices=("float32", "bfloat16", "float16"))  # fmt: skip
    ns = parser.parse_args()
    ceilings = Ceilings()
    floors = ceilings.measure(budget_s=1.0)
    print(f"measured at the start: memory bandwidth {floors[0]/1e9:.1f} GB/s, "
          f"matmul {floors[1]/1e9:.1f} GFLOP/s, jax {jax.__version__} (each case's floor "
          "is measured again around its timing)\n")  # fmt: skip
    rows = []
    for bs in ns.bs:
        for program in programs.programs(bs):
            if ns.programs and program.name not in ns.programs:
                continue
            f32_time = None
            for dtype in ns.dtype:
                row = bench_case(dataclasses.replace(program, dtype=dtype), bs, ns, ceilings)
                row["dtype"] = dtype
                if dtype == "float32":
                    f32_time = row["mirage_s"]
                elif f32_time is not None:
                    row["vs_f32"] = f32_time / row["mirage_s"]
                rows.append(row)
                print(f"  {program.name} bs={bs} {dtype}: {row['speedup']:.2f}x", file=sys.stderr)
    print_table(rows)
    Path(ns.json).write_text(json.dumps({"bandwidth": floors[0], "matmul_rate": floors[1],
                                         "rows": rows}, indent=1))  # fmt: skip
    if ns.chart:
        draw_chart(rows, ns.chart)


if __name__ == "__main__":
    main()
