"""The superoptimizer on Mirage's six benchmark programs: one table row per (program, bs).

For every program of ``programs.programs(bs)``: trace it, superoptimize its region
cold (a fresh process pool, empty caches except the compiler's disk cache) with the default
``SearchConfig`` (time budget 60 s, 2 workers), and print what the search did: states
enumerated, pruned (by abstract expressions, by the index analysis, as duplicates or dead
ends, as unsafe exps), block tasks run / total, states per second per worker, coverage (the
share of tasks run to their end) and the stop reason ("exhausted": the best within bounds),
candidates verified / rejected, the best μGraph, and the search time.
Unless ``--no-time``, the best ``--top-k`` verified candidates are compiled and timed, and
compared with ``jax.jit`` of the same region measured in the same process; the "rank rho"
column is the Spearman rank correlation between the cost model's estimates and those
measurements (how well the model orders what it is asked to order), and "pick/best" the
measured time of the model's first choice over the fastest one's. "mirage form" says
whether a verified candidate is the single graph-defined kernel Mirage finds for the program
(``programs.MIRAGE_FORMS``), whether or not it ranks best.

    python benchmarks/search_table.py                 # bs 1 and 8, all six programs
    python benchmarks/search_table.py --bs 1 --programs gqa_decode,lora --no-time
    python benchmarks/search_table.py --top-k 8       # rank correlation over 8 candidates
    python benchmarks/search_table.py --rerank overlap=0,0.5,1
    MIRAGE_JAX_CACHE_DIR=$(mktemp -d) python benchmarks/search_table.py --no-time --reuse-skeletons

``--rerank FIELD=V1,V2,...`` also ranks each search's timed candidates again with the host's
cost model at every value of one ``CpuModel`` field, and prints rho and pick/best per value:
the same measurements under each model, so a change to the model is compared without the
timing noise of two runs.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the source tree, not an older installed copy


def _baseline(program, index: int, target):
    """jax.jit of the region, timed on the inputs the candidates are timed on."""
    import jax

    from mirage_jax.interpret.numerics import sample_inputs
    from mirage_jax.timing import median_seconds

    fn = jax.jit(program.region_callable(index))
    args = sample_inputs(target.input_types)
    return lambda: median_seconds(fn, args, budget_s=0.3)


def _ranks(xs: list[float]) -> list[float]:
    order = sorted(range(len(xs)), key=lambda k: xs[k])
    out = [0.0] * len(xs)
    k = 0
    while k < len(order):  # ties share their mean rank
        j = k
        while j + 1 < len(order) and xs[order[j + 1]] == xs[order[k]]:
            j += 1
        for i in range(k, j + 1):
            out[order[i]] = (k + j) / 2
        k = j + 1
    return out


def spearman(a: list[float], b: list[float]) -> float | None:
    """Spearman's rho of two samples (None below three points or without spread)."""
    if len(a) < 3:
        return None
    ra, rb = _ranks(a), _ranks(b)
    ma, mb = sum(ra) / len(ra), sum(rb) / len(rb)
    cov = sum((x - ma) * (y - mb) for x, y in zip(ra, rb))
    va = sum((x - ma) ** 2 for x in ra) ** 0.5
    vb = sum((y - mb) ** 2 for y in rb) ** 0.5
    return None if va == 0 or vb == 0 else cov / (va * vb)


def pick_regret(timed: list[tuple[str, float, float]]) -> float | None:
    """Measured time of the candidate the cost model ranks first over the fastest measured
    one (1.0: the model alone would have picked the winner). Unlike rank correlation this
    does not swing on candidates that tie within the timing noise."""
    if len(timed) < 2:
        return None
    pick = min(timed, key=lambda c: c[1])
    return pick[2] / min(m for _, _, m in timed)


def parse_rerank(text: str) -> tuple[str, tuple[float, ...]]:
    """``"overlap=0,0.5,1"`` -> ("overlap", (0.0, 0.5, 1.0)): a scalar ``CpuModel`` field and
    values of its type."""
    import dataclasses

    from mirage_jax.backend.cpu.cost import DEFAULT_MODEL

    field, _, values = text.partition("=")
    fields = dataclasses.fields(DEFAULT_MODEL)
    kinds = {f.name: type(getattr(DEFAULT_MODEL, f.name)) for f in fields}
    scalar = sorted(name for name, kind in kinds.items() if kind in (int, float))
    if field not in scalar or not values:
        raise argparse.ArgumentTypeError(
            f"--rerank {text!r}: expected FIELD=V1,V2,... with FIELD one of {scalar}")
    try:
        return field, tuple(kinds[field](v) for v in values.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--rerank {text!r}: {field} takes {kinds[field].__name__} values") from None


def rerank(result, field: str, values: tuple[float, ...]) -> dict[float, tuple]:
    """value -> (rho, pick/best) of the cost model with ``field = value`` on the search's
    timed candidates (None where fewer than two were timed)."""
    import dataclasses

    from mirage_jax.backend.cpu.calibrate import host_model
    from mirage_jax.backend.cpu.cost import estimate

    timed = [c for c in result.verified if c.measured_s is not None]
    out = {}
    for v in values:
        model = dataclasses.replace(host_model(), **{field: v})
        est = [estimate(c.graph, model).time_s for c in timed]
        trio = [(c.summary(), e, c.measured_s) for c, e in zip(timed, est)]
        out[v] = (spearman(est, [c.measured_s for c in timed]), pick_regret(trio))
    return out


def _rerank_summary(field: str, per_search: list[dict[float, tuple]]) -> None:
    for v in per_search[0] if per_search else ():
        rhos = [r[v][0] for r in per_search if r[v][0] is not None]
        picks = [r[v][1] for r in per_search if r[v][1] is not None]
        if not picks:
            continue
        geo = math.exp(sum(map(math.log, picks)) / len(picks))
        rho = f"{sum(rhos) / len(rhos):+.2f} over {len(rhos)}" if rhos else "-"
        print(f"{field}={v:g}: mean rho {rho}, pick/best geomean {geo:.2f}x, worst "
              f"{max(picks):.2f}x over {len(picks)} searches")


def _row(name: str, bs: int, result, wall: float) -> list[str]:
    r = result.report
    import programs

    # a verified μGraph of the form Mirage finds (one graph-defined kernel), best or not
    single = any(programs.has_mirage_form(name, c.graph) for c in result.verified)
    pruned = r.pruned_abstract + r.pruned_index + r.pruned_duplicate + r.pruned_dead
    pruned += r.pruned_numeric
    summary = r.best_summary or "(target kept)"
    us = lambda s: "-" if s is None else f"{s * 1e6:.0f}"  # noqa: E731
    speed = "-"
    if r.baseline_s and r.best_measured_s:
        speed = f"{r.baseline_s / r.best_measured_s:.2f}x"
    rho = spearman([e for _, e, _ in r.timed_candidates], [m for _, _, m in r.timed_candidates])
    regret = pick_regret(r.timed_candidates)
    return [
        name, str(bs), f"{r.tasks_run}/{r.tasks}", str(r.states), f"{r.states_per_s:.0f}",
        f"{100 * r.coverage:.1f}%", str(pruned), f"{r.verified}/{r.ff_checked}",
        str(r.ff_rejected), str(r.float_rejected), "yes" if single else "no",
        us(r.best_estimate_s), us(r.best_measured_s), us(r.baseline_s), speed,
        "-" if rho is None else f"{rho:+.2f} ({len(r.timed_candidates)})",
        "-" if regret is None else f"{regret:.2f}x",
        f"{wall:.1f}", r.stop_reason, summary[:90],
    ]  # fmt: skip


HEADER = ["program", "bs", "tasks", "states", "states/s", "coverage", "pruned", "verified", "ff-rej", "float-rej", "mirage form",
          "est us", "meas us", "jit us", "speedup", "rank rho", "pick/best", "search s", "stop",
          "best μGraph"]  # fmt: skip


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
    parser.add_argument("--top-k", type=int, default=4,
                        help="verified candidates to time (and to correlate with the model)")
    parser.add_argument("--verbose", action="store_true", help="print every search report")
    parser.add_argument("--reuse-skeletons", action="store_true",
                        help="replay the skeletons of an earlier batch size (bs 8 after bs 1) "
                        "instead of enumerating again (SearchConfig.reuse_skeletons)")
    parser.add_argument("--rerank", type=parse_rerank, metavar="FIELD=V1,V2,...",
                        help="also rank the timed candidates with a CpuModel field at each value")
    args = parser.parse_args(argv)

    import programs
    from mirage_jax.search.config import SearchConfig
    from mirage_jax.frontend import trace
    from mirage_jax import superoptimize

    wanted = {p for p in args.programs.split(",") if p}
    config = SearchConfig(time_budget_s=args.time_budget, workers=args.workers,
                          time_candidates=not args.no_time, progress=False,
                          max_verify=max(SearchConfig.max_verify, args.top_k),
                          top_k_timed=args.top_k,
                          reuse_skeletons=args.reuse_skeletons)  # fmt: skip
    rows, reranked = [], []
    for bs in args.bs:
        for program in programs.programs(bs):
            if wanted and program.name not in wanted:
                continue
            traced = trace(program.fn, *program.call_args(programs.make_inputs(program)))
            for region in traced.regions:
                baseline = None if args.no_time else _baseline(traced, region.index, region.graph)
                start = time.time()
                result = superoptimize(region.graph, config, baseline=baseline)
                wall = time.time() - start
                rows.append(_row(program.name, bs, result, wall))
                if args.verbose:
                    print(result.report, "\n", flush=True)
                print("  ".join(rows[-1][:2] + rows[-1][-3:]), flush=True)
                if args.rerank and not args.no_time:
                    reranked.append(rerank(result, *args.rerank))
                    print("  " + "  ".join(
                        f"{args.rerank[0]}={v:g}: rho {'-' if r is None else f'{r:+.2f}'}, "
                        f"pick {'-' if p is None else f'{p:.2f}x'}"
                        for v, (r, p) in reranked[-1].items()), flush=True)  # fmt: skip
    print()
    _print_table(rows)
    col = {name: k for k, name in enumerate(HEADER)}
    rhos = [float(r[col["rank rho"]].split()[0]) for r in rows if r[col["rank rho"]] != "-"]
    if rhos:
        print(f"\nmean rank correlation (cost model vs measured): {sum(rhos) / len(rhos):+.2f} "
              f"over {len(rhos)} searches")
    regrets = [float(r[col["pick/best"]].rstrip("x")) for r in rows if r[col["pick/best"]] != "-"]
    if regrets:
        geo = math.exp(sum(math.log(x) for x in regrets) / len(regrets))
        print(f"the model's first pick over the fastest measured: geomean {geo:.2f}x, worst "
              f"{max(regrets):.2f}x over {len(regrets)} searches")
    if reranked:
        print()
        _rerank_summary(args.rerank[0], reranked)
    return 0


if __name__ == "__main__":
    sys.exit(main())
