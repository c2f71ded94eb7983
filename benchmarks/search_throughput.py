"""Block enumeration throughput: the same tasks on the Python reference DFS and the native one.

For every suite program: trace it, build its block tasks as the search does (pruning on, the
default bounds), take ``--tasks`` of them spread evenly over the priority order, and run each
on one core with both engines (``engine="python"`` without what the tasks of a search now
share, ``SearchShare``, is the search as it was before the native core; ``engine="native"``
with it is the search now). Both must report the same skeletons and counters (checked); the
table gives states, seconds and states per second per engine, and the ratio.

    python benchmarks/search_throughput.py                       # bs 1, 24 tasks per program
    python benchmarks/search_throughput.py --bs 8 --tasks 48 --max-states 20000
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the source tree, not an older installed copy


def block_tasks(target, config):
    """(space, oracle, tasks in the search's priority order) of ``target``."""
    from mirage_jax.search import enumeration as en
    from mirage_jax.search.runner import Exploration
    from mirage_jax.search.workers import InlineExecutor, make_oracle

    config = config.with_(cores=config.num_cores)
    space = config.space(target)
    oracle = make_oracle(target, config)
    sites = en.KernelDFS(target, space, oracle).run().sites
    tasks = Exploration(target, config, InlineExecutor(), None)._tasks(space, oracle, sites)
    return space, oracle, [task for _, task in tasks]


def measure(tasks, space, oracle, engine: str, shared: bool) -> tuple[int, float, list]:
    """Run ``tasks`` as one search's worker does: with a check cache they share, or (the
    search before the native core) without."""
    from mirage_jax.search.enumeration import SearchShare, run_block_task

    states, seconds, found = 0, 0.0, []
    checks = SearchShare() if shared else None
    for task in tasks:
        start = time.perf_counter()
        res = run_block_task(task, space, oracle, engine=engine, shared=checks)
        seconds += time.perf_counter() - start
        states += res.counters.states
        found.append(([str(s.block) for s in res.skeletons], res.counters))
    return states, seconds, found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bs", type=int, default=1)
    parser.add_argument("--programs", nargs="*", default=[])
    parser.add_argument("--tasks", type=int, default=24, help="tasks per program")
    parser.add_argument("--max-states", type=int, default=50_000, help="per task")
    args = parser.parse_args(argv)

    sys.path.insert(0, str(ROOT / "benchmarks"))
    import programs

    from mirage_jax.frontend import trace
    from mirage_jax.search.config import SearchConfig

    config = SearchConfig(max_states=args.max_states, progress=False)
    print(f"{'program':16} {'tasks':>11} {'states':>9} {'python s':>9} {'native s':>9} "
          f"{'python/s':>9} {'native/s':>9} {'ratio':>6}")  # fmt: skip
    ratios, totals = [], [0, 0.0, 0.0]
    for program in programs.programs(args.bs):
        if args.programs and program.name not in args.programs:
            continue
        traced = trace(program.fn, *program.call_args(programs.make_inputs(program)))
        space, oracle, tasks = block_tasks(traced.regions[0].graph, config)
        sample = tasks[:: max(1, len(tasks) // args.tasks)][: args.tasks]
        states, py_s, py_found = measure(sample, space, oracle, "python", shared=False)
        _, na_s, na_found = measure(sample, space, oracle, "native", shared=True)
        if py_found != na_found:
            print(f"{program.name}: the engines disagree", file=sys.stderr)
            return 1
        ratio = py_s / na_s
        ratios.append(ratio)
        totals = [totals[0] + states, totals[1] + py_s, totals[2] + na_s]
        print(f"{program.name:16} {len(sample):>5}/{len(tasks):<5} {states:>9} {py_s:>9.2f} "
              f"{na_s:>9.2f} {states / py_s:>9.0f} {states / na_s:>9.0f} {ratio:>5.1f}x",
              flush=True)  # fmt: skip
    if ratios:
        geo = math.exp(sum(map(math.log, ratios)) / len(ratios))
        print(f"geomean native/python states per second: {geo:.1f}x (min {min(ratios):.1f}x)")
        states, py_s, na_s = totals
        print(f"all tasks together: {states / py_s:.0f} vs {states / na_s:.0f} states/s, "
              f"{py_s / na_s:.1f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
