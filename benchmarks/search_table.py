"""The superoptimizer on Mirage's six benchmark programs: one table row per (program, bs).

For every program of ``mirage_jax.suite.programs(bs)``: trace it, superoptimize its region
cold (a fresh process pool, empty caches except the compiler's disk cache) with the default
``SearchConfig`` (time budget 60 s, 2 workers), and print what the search did: states
enumerated, pruned (by abstract expressions, by the index analysis, as duplicates or dead
ends, as unsafe exps), candidates verified / rejected, the best μGraph, and the search time.
With ``--time`` (the default) the best few verified candidates are compiled and timed, and
compared with ``jax.jit`` of the same region measured in the same process.

    python benchmarks/search_table.py                 # bs 1 and 8, all six programs
    python benchmarks/search_table.py --bs 1 --programs gqa_decode,lora --no-time
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the source tree, not an older installed copy


def _baseline(program, index: int, target):
    """jax.jit of the region, timed on the inputs the candidates are timed on."""
    import jax

    from mirage_jax.search.equivalence import realistic_inputs
    from mirage_jax.timing import median_seconds

    fn = jax.jit(program.region_callable(index))
    args = realistic_inputs(target.input_types)
    return lambda: median_seconds(fn, args, budget_s=0.3)


def _row(name: str, bs: int, result, wall: float) -> list[str]:
    from mirage_jax.ir import Op

    r = result.report
    best = result.best
    kernels = [n.op for n in best.nodes if n.op not in (Op.INPUT, Op.OUTPUT, Op.RESHAPE)]
    single = kernels == [Op.GRAPH_DEF]  # one graph-defined kernel and nothing else
    pruned = r.pruned_abstract + r.pruned_index + r.pruned_duplicate + r.pruned_dead
    pruned += r.pruned_numeric
    summary = r.best_summary or "(target kept)"
    us = lambda s: "-" if s is None else f"{s * 1e6:.0f}"  # noqa: E731
    speed = "-"
    if r.baseline_s and r.best_measured_s:
        speed = f"{r.baseline_s / r.best_measured_s:.2f}x"
    return [
        name, str(bs), str(r.states), str(pruned), f"{r.verified}/{r.ff_checked}",
        str(r.ff_rejected), str(r.float_rejected), "yes" if single else "no",
        us(r.best_estimate_s), us(r.best_measured_s), us(r.baseline_s), speed,
        f"{wall:.1f}", r.stop_reason, summary[:90],
    ]  # fmt: skip


HEADER = ["program", "bs", "states", "pruned", "verified", "ff-rej", "float-rej", "1 kernel",
          "est us", "meas us", "jit us", "speedup", "search s", "stop", "best μGraph"]  # fmt: skip


def _print_table(rows: list[list[str]]) -> None:
    widths = [max(len(r[i]) for r in [HEADER, *rows]) for i in range(len(HEADER))]
    line = lambda r: "  ".join(c.ljust(w) for c, w in zip(r, widths))  # noqa: E731
    print(line(HEADER))
    print("  ".join("-" * w for w in widths))
    for r in rows:
        print(line(r))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bs", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--programs", default="", help="comma-separated names (default: all)")
    parser.add_argument("--time-budget", type=float, default=60.0)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--no-time", action="store_true", help="skip compiling and timing")
    parser.add_argument("--verbose", action="store_true", help="print every search report")
    args = parser.parse_args(argv)

    from mirage_jax import suite
    from mirage_jax.config import SearchConfig
    from mirage_jax.frontend import trace
    from mirage_jax.search import superoptimize

    wanted = {p for p in args.programs.split(",") if p}
    config = SearchConfig(time_budget_s=args.time_budget, workers=args.workers,
                          time_candidates=not args.no_time, progress=False)  # fmt: skip
    rows = []
    for bs in args.bs:
        for program in suite.programs(bs):
            if wanted and program.name not in wanted:
                continue
            traced = trace(program.fn, *program.call_args(suite.make_inputs(program)))
            for region in traced.regions:
                baseline = None if args.no_time else _baseline(traced, region.index, region.graph)
                start = time.time()
                result = superoptimize(region.graph, config, baseline=baseline)
                wall = time.time() - start
                rows.append(_row(program.name, bs, result, wall))
                if args.verbose:
                    print(result.report, "\n", flush=True)
                print("  ".join(rows[-1][:2] + rows[-1][-3:]), flush=True)
    print()
    _print_table(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
