"""Is a search's result a function of the target, the config and the seed alone?

For each suite program (``programs.programs(bs)``), its region is searched cold (fresh caches,
a fresh process pool) once per setting: ``workers=2``, ``workers=1``, and each of those pinned
to one core (``--pin``: this process and its pool run on CPU 0, as ``taskset -c 0`` would).
Candidate timing is off, so the cost model picks the best μGraph. A row per (program, bs,
setting) gives the stop reason, states, the number of verified candidates, a digest of the
verified set and of the best μGraph, and whether both equal the first setting's. Notes say
where a clock cut the search (the result then depends on the host and is not expected to
match).

    python benchmarks/determinism.py                           # bs 1, all six programs
    python benchmarks/determinism.py --bs 1 8 --programs ntrans,lora --pin
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the source tree, not an older installed copy


def _digest(texts: list[str]) -> str:
    return hashlib.sha1("\n\n".join(texts).encode()).hexdigest()[:10]


def search_once(graph, workers: int, pinned: bool) -> dict:
    """One cold search of ``graph`` (timing off): what decides whether two runs agree."""
    from mirage_jax.backend.select import get_backend
    from mirage_jax.search.config import SearchConfig
    from mirage_jax.search.runner import superoptimize

    affinity = os.sched_getaffinity(0)
    if pinned:
        os.sched_setaffinity(0, {min(affinity)})  # the pool's processes inherit it
    try:
        config = SearchConfig(workers=workers, time_candidates=False, progress=False)
        start = time.perf_counter()
        res = superoptimize(graph, config, cost_model=get_backend("cpu").cost_model())
        seconds = time.perf_counter() - start
    finally:
        os.sched_setaffinity(0, affinity)
    rep = res.report
    return {
        "stop": rep.stop_reason, "states": rep.states, "verified": len(res.verified),
        "set": _digest(sorted(str(c.graph) for c in res.verified)),
        "best": _digest([str(res.best)]), "seconds": seconds,
        "clock": [n for n in rep.notes if "time budget" in n],
    }  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bs", type=int, nargs="+", default=[1])
    parser.add_argument("--programs", default="", help="comma-separated names (default: all)")
    parser.add_argument("--pin", action="store_true", help="also run each setting on one core")
    args = parser.parse_args(argv)
    os.environ.setdefault("MIRAGE_JAX_CACHE_DIR", tempfile.mkdtemp(prefix="mj-determinism-"))

    sys.path.insert(0, str(ROOT / "benchmarks"))
    import programs

    from mirage_jax.frontend import trace

    settings = [(2, False), (1, False)] + ([(2, True), (1, True)] if args.pin else [])
    wanted = [p for p in args.programs.split(",") if p]
    print(f"{'program':14} {'bs':>2} {'setting':18} {'stop':20} {'states':>9} {'verified':>8} "
          f"{'set':10} {'best':10} {'same':5} {'s':>6}")  # fmt: skip
    agree = total = 0
    for bs in args.bs:
        for program in programs.programs(bs):
            if wanted and program.name not in wanted:
                continue
            traced = trace(program.fn, *program.call_args(programs.make_inputs(program)))
            graph = traced.regions[0].graph
            first = None
            for workers, pinned in settings:
                row = search_once(graph, workers, pinned)
                first = first or row
                same = (row["set"], row["best"]) == (first["set"], first["best"])
                agree, total = agree + same, total + 1
                setting = f"workers={workers}" + (" pinned" if pinned else "")
                print(f"{program.name:14} {bs:>2} {setting:18} {row['stop']:20} "
                      f"{row['states']:>9} {row['verified']:>8} {row['set']:10} "
                      f"{row['best']:10} {'yes' if same else 'NO':5} {row['seconds']:>6.1f}",
                      flush=True)  # fmt: skip
                for note in row["clock"]:
                    print(f"    note: {note}")
    print(f"{agree}/{total} runs agree with their program's first setting")
    return 0


if __name__ == "__main__":
    sys.exit(main())
