"""Searching on a cluster: the suite's searches on the local process pool and on a Dask
``LocalCluster`` of this machine, and a projection of the same searches onto 8, 32 and 128
workers.

Measured: for every case of ``programs.programs(bs)`` (one region each), the search with the
default local pool, then on a ``LocalCluster`` of ``--workers`` single-threaded worker
processes (started once; its start-up and handshake are printed apart), with one
``SearchConfig``: ``--max-tasks`` block tasks and no time limit that could cut them, so the two
are the same search and the table says whether their winners, verified lists and counters are
identical. Candidates are not timed (``--time`` times them, in this process, in both runs).

Projected: every task's run time on its worker is recorded (``DaskExecutor.records``), and
each search becomes a chain of stages: on the client (e-graph saturation and kernel-level
enumeration; instantiation and ranking; timing), and on the workers (block tasks and the
target's fingerprints, all ready at once; verification in rounds of ``min(W, max_verify)``
candidates, each round waiting for its slowest). A worker's first block task of a search also
builds its search context (its own saturation of the target's e-graph, taken as the client's).
List scheduling then runs the stages of all searches at once on W workers and one client
process (its Python stages of different searches do not overlap: one interpreter), tasks in
the order they become ready. The table gives the makespan of each search alone and of the
suite, the speedup over the recorded 2-worker run's projection, and the bound it saturates at
(infinitely many workers: the serial client stages and each search's longest chain).

``--max-tasks 0`` records the searches as a default ``precompile`` runs them (every block task
in priority order until the 60 s budget ends): the projection is then of that work, the same
search on more workers, and the pool is not run (a time budget makes two runs different
searches).

    python benchmarks/cluster.py                              # 12 cases: bs 1 and 8
    python benchmarks/cluster.py --bs 1 --programs lora,gqa_decode --max-tasks 8
    python benchmarks/cluster.py --max-tasks 0 --time         # the default precompile's work
    python benchmarks/cluster.py --json out.json              # keep the records
    python benchmarks/cluster.py --from-json out.json         # project again, no search
"""

from __future__ import annotations

import argparse
import heapq
import json
import sys
import time
from collections import deque
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the source tree, not an older installed copy
sys.path.insert(0, str(ROOT / "benchmarks"))

WORKERS = (8, 32, 128)


@dataclass
class Work:
    """One search as the projection sees it (seconds)."""

    name: str
    before: float  # client: saturation and kernel-level enumeration
    context: float  # a worker's search context (its saturation), once per worker and search
    blocks: list[float]  # block tasks in priority order, less the context cost
    digests: list[float]  # the target's fingerprints, beside the block tasks
    between: float  # client: instantiation and ranking
    verifies: list[float]  # one per candidate, in rank order
    after: float  # client: timing (0 when not timed)
    max_verify: int = 6
    tasks_total: int = 0  # every block task of the search (the recorded ones are the first)

    def stages(self, w: int) -> list[tuple[str, list[tuple[float, bool]]]]:
        """(where, [(seconds, needs the search context)]) in order; "tasks" stages run on
        the workers at once, a "client" stage has one item."""
        out = [("client", [(self.before, False)]),
               ("tasks", [(b, True) for b in self.blocks] + [(d, False) for d in self.digests]),
               ("client", [(self.between, False)])]  # fmt: skip
        size = max(1, min(w, self.max_verify))
        out += [("tasks", [(v, False) for v in self.verifies[k:k + size]])
                for k in range(0, len(self.verifies), size)]  # fmt: skip
        out.append(("client", [(self.after, False)]))
        return [(where, items) for where, items in out if items]

    def bound(self) -> float:
        """Its makespan on infinitely many workers: the longest chain."""
        tasks = [b + self.context for b in self.blocks] + self.digests
        rounds = [max(self.verifies[k:k + self.max_verify])
                  for k in range(0, len(self.verifies), self.max_verify)]  # fmt: skip
        return self.before + max(tasks, default=0.0) + self.between + sum(rounds) + self.after


def simulate(works: list[Work], w: int) -> float:
    """The makespan of ``works`` run at once on ``w`` workers and one client (list
    scheduling: whatever is ready goes to the first free worker, in the order it became
    ready)."""
    stages = [work.stages(w) for work in works]
    phase = [0] * len(works)
    left = [0] * len(works)
    ready_tasks: deque[tuple[int, float, bool]] = deque()
    ready_client: deque[tuple[int, float]] = deque()
    free = list(range(w))
    has_context: set[tuple[int, int]] = set()
    client_free = True
    events: list[tuple[float, int, str, int, int]] = []  # (end, tie, what, search, worker)
    tie = 0
    now = 0.0

    def start(s: int) -> None:
        if phase[s] >= len(stages[s]):
            return
        where, items = stages[s][phase[s]]
        left[s] = len(items)
        if where == "client":
            ready_client.append((s, items[0][0]))
        else:
            ready_tasks.extend((s, sec, ctx) for sec, ctx in items)

    for s in range(len(works)):
        start(s)
    while True:
        while free and ready_tasks:
            s, sec, ctx = ready_tasks.popleft()
            worker = heapq.heappop(free)
            if ctx and (worker, s) not in has_context:
                has_context.add((worker, s))
                sec += works[s].context
            tie += 1
            heapq.heappush(events, (now + sec, tie, "task", s, worker))
        if client_free and ready_client:
            s, sec = ready_client.popleft()
            client_free = False
            tie += 1
            heapq.heappush(events, (now + sec, tie, "client", s, -1))
        if not events:
            return now
        now, _, what, s, worker = heapq.heappop(events)
        if what == "task":
            heapq.heappush(free, worker)
        else:
            client_free = True
        left[s] -= 1
        if left[s] == 0:
            phase[s] += 1
            start(s)


# ---------------------------------------------------------------------------------------------
# measuring


def work_of(name: str, result, records: list, config) -> Work:
    """A search's ``Work`` from its report and its tasks' records (in the order sent)."""
    r = result.report
    t = r.timings
    records = sorted(records, key=lambda rec: rec.seq)
    blocks = [rec for rec in records if rec.name == "block_worker"]
    context = t.get("saturation", 0.0)
    first: set[str] = set()
    block_s = []
    for rec in blocks:  # the first block task on each worker built its context
        sec = rec.seconds
        if rec.worker not in first:
            first.add(rec.worker)
            sec = max(0.0, sec - context)
        block_s.append(sec)
    return Work(
        name=name, before=t.get("saturation", 0.0) + t.get("kernel", 0.0), context=context,
        blocks=block_s,
        digests=[rec.seconds for rec in records if rec.name == "target_digest_worker"],
        between=t.get("instantiate", 0.0),
        verifies=[rec.seconds for rec in records if rec.name == "verify_worker"],
        after=t.get("timing", 0.0), max_verify=config.max_verify, tasks_total=r.tasks,
    )  # fmt: skip


def differences(a, b) -> list[str]:
    """What differs between two search results (empty: the same search)."""
    fields = ("tasks", "tasks_run", "skeletons", "candidates", "ff_checked", "verified",
              "states", "stop_reason")  # fmt: skip
    out = [f for f in fields if getattr(a.report, f) != getattr(b.report, f)]
    if str(a.best) != str(b.best):
        out.append("best")
    if [str(c.graph) for c in a.verified] != [str(c.graph) for c in b.verified]:
        out.append("verified list")
    return out


def measure(args: argparse.Namespace) -> tuple[list[dict], list[Work], float]:
    import distributed
    import programs

    from mirage_jax import trace
    from mirage_jax.backend import get_backend
    from mirage_jax.planner.cluster import DaskExecutor
    from mirage_jax.search import SearchConfig
    from mirage_jax.search.runner import superoptimize

    # one cost model for every search: the host's calibration is read once, so that nothing
    # but the executor differs between a case's two searches
    backend = get_backend("cpu")
    cost = backend.cost_model()

    bounded = args.max_tasks > 0
    config = SearchConfig(workers=args.workers, progress=False, time_candidates=args.time)
    if bounded:
        config = config.with_(max_tasks=args.max_tasks, time_budget_s=3600)
    timer = backend.timer() if args.time else None
    wanted = {p for p in args.programs.split(",") if p}
    cases = [(p, bs) for bs in args.bs for p in programs.programs(bs)
             if not wanted or p.name in wanted]  # fmt: skip
    start = time.perf_counter()
    cluster = distributed.LocalCluster(n_workers=args.workers, threads_per_worker=1,
                                       processes=True, dashboard_address=":0")  # fmt: skip
    client = distributed.Client(cluster)
    executor = DaskExecutor(client)
    startup = time.perf_counter() - start
    print(f"LocalCluster of {args.workers} worker processes up and shaken hands with in "
          f"{startup:.1f}s (once per run)", flush=True)
    rows, works = [], []
    try:
        for program, bs in cases:
            traced = trace(program.fn, *program.call_args(programs.make_inputs(program)))
            for region in traced.regions:
                label = program.name + (f"#{region.index}" if len(traced.regions) > 1 else "")
                t = time.perf_counter()
                local = (superoptimize(region.graph, config, cost_model=cost, timer=timer)
                         if bounded else None)  # fmt: skip
                pool_s = time.perf_counter() - t if bounded else None
                seen = len(executor.records)
                t = time.perf_counter()
                remote = superoptimize(region.graph, config, cost_model=cost,
                                       executor=executor, timer=timer)  # fmt: skip
                cluster_s = time.perf_counter() - t
                work = work_of(f"{label} bs={bs}", remote, executor.records[seen:], config)
                works.append(work)
                rows.append({"case": work.name, "pool_s": pool_s, "cluster_s": cluster_s,
                             "differs": differences(local, remote) if bounded else None,
                             "run": f"{remote.report.tasks_run}/{remote.report.tasks}",
                             "stop": remote.report.stop_reason,
                             "task_s": sum(rec.seconds for rec in executor.records[seen:]),
                             "best": remote.report.best_summary or "(target kept)"})  # fmt: skip
                _print_row(rows[-1])
    finally:
        client.close()
        cluster.close()
    return rows, works, startup


def _print_row(row: dict) -> None:
    if row["pool_s"] is None:
        pool = "pool      -   overhead     -   identical  -"
    else:
        same = "yes" if not row["differs"] else "NO (" + ", ".join(row["differs"]) + ")"
        pool = (f"pool {row['pool_s']:6.1f}s  overhead {row['cluster_s'] - row['pool_s']:+5.1f}s"
                f"  identical {same}")  # fmt: skip
    print(f"{row['case']:<22} cluster {row['cluster_s']:6.1f}s  {pool}  block tasks "
          f"{row['run']:<11} worker task-s {row['task_s']:6.1f}  {row['stop']}", flush=True)


# ---------------------------------------------------------------------------------------------
# projecting


def project(works: list[Work], title: str) -> None:
    print(f"\n{title}")
    base = {id(w): simulate([w], 2) for w in works}
    head = f"{'case':<22} {'W=2':>8}" + "".join(f" {'W=' + str(n):>8}" for n in WORKERS)
    print(head + f" {'bound':>8}  saturates at")
    for w in works:
        cells = [simulate([w], n) for n in WORKERS]
        longest = max([b + w.context for b in w.blocks] + w.digests, default=0.0)
        why = _saturation(w, longest)
        print(f"{w.name:<22} {base[id(w)]:8.1f}" + "".join(f" {c:8.1f}" for c in cells)
              + f" {w.bound():8.1f}  {why}")
    suite2 = simulate(works, 2)
    cells = [simulate(works, n) for n in WORKERS]
    client = sum(w.before + w.between + w.after for w in works)
    bound = max(client, max((w.bound() for w in works), default=0.0))
    print(f"{'suite (all at once)':<22} {suite2:8.1f}" + "".join(f" {c:8.1f}" for c in cells)
          + f" {bound:8.1f}  client stages {client:.1f}s in one process")
    print("speedup over 2 workers: " + ", ".join(
        f"W={n}: {suite2 / c:.1f}x" for n, c in zip(WORKERS, cells)))  # fmt: skip
    work = sum(sum(w.blocks) + sum(w.digests) + sum(w.verifies) for w in works)
    print(f"worker task-seconds {work:.0f}s; the suite's makespan cannot go below {bound:.1f}s")


def _saturation(w: Work, longest: float) -> str:
    parts = {"client stages": w.before + w.between + w.after, "longest task": longest,
             "verify rounds": w.bound() - w.before - w.between - w.after - longest}  # fmt: skip
    top = max(parts, key=parts.get)
    return f"{top} ({parts[top]:.1f}s; saturation {w.before:.1f}s)"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bs", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--programs", default="", help="comma-separated names (default: all)")
    parser.add_argument("--workers", type=int, default=2, help="LocalCluster worker processes")
    parser.add_argument("--max-tasks", type=int, default=16,
                        help="block tasks per search (the deterministic bound)")
    parser.add_argument("--time", action="store_true", help="time candidates (client side)")
    parser.add_argument("--json", help="write the measurements and records here")
    parser.add_argument("--from-json", help="project from a file --json wrote; no search")
    args = parser.parse_args(argv)
    if args.from_json:
        data = json.loads(Path(args.from_json).read_text())
        rows, works, startup = data["rows"], [Work(**w) for w in data["works"]], data["startup_s"]
        for row in rows:  # files of the first version said only whether the runs were the same
            row.setdefault("differs", None if row["pool_s"] is None
                           else [] if row.pop("identical", True) else ["?"])  # fmt: skip
        print(f"LocalCluster start-up and handshake: {startup:.1f}s")
        for row in rows:
            _print_row(row)
    else:
        rows, works, startup = measure(args)
        if args.json:
            Path(args.json).write_text(json.dumps(
                {"rows": rows, "works": [asdict(w) for w in works], "startup_s": startup},
                indent=1))  # fmt: skip
    over = [r["cluster_s"] - r["pool_s"] for r in rows if r["pool_s"] is not None]
    if over:
        print(f"\ncluster overhead per search: mean {sum(over) / len(over):+.2f}s, worst "
              f"{max(over):+.2f}s; identical results: "
              f"{sum(not r['differs'] for r in rows if r['pool_s'] is not None)}/{len(over)}")
    project(works, "projected makespan (s) of the recorded searches, list scheduling")
    return 0


if __name__ == "__main__":
    sys.exit(main())
