"""The superoptimizer's driver: ``superoptimize(kernel_graph, config) -> SearchResult``.

The pipeline, top to bottom (each stage timed and counted in the ``SearchReport``):

1. derive the search space from the target (``SearchConfig.space``), saturate the target's
   e-graph (``SubexprOracle``) and analyse its indices (``IndexAnalysis``);
2. kernel level: grow prefixes of pre-defined ops and collect graph_def *sites* (a prefix and
   the operands chosen for one graph-defined kernel); prefixes that already compute the
   target are candidates too;
3. block level: one enumeration task per (site, loop structure, seeding), in priority order,
   run on an ``concurrent.futures.Executor`` (a spawn-safe process pool of ``workers`` by
   default; any executor works - tasks and results are picklable and the worker functions are
   module-level) until they are exhausted or the enumeration share of the time budget ends;
4. instantiate every distinct skeleton at every concrete tiling, rank the candidates with the
   analytic CPU cost model (``cost``), fuse elementwise chains into thread graphs by rule;
5. verify in rank order until ``max_verify`` candidates are verified: the float check against
   the float64 target on wide random inputs (cheap at real shapes, and it catches what the
   field cannot: overflow, cancellation), then finite-field fingerprints
   (``equivalence.ff_check_many``); a skeleton rejected once is skipped at its other tilings;
6. time the best ``top_k_timed`` verified candidates for real (``timer``; by default: compile
   for the CPU and take medians) in ``timing_rounds`` interleaved rounds, each candidate
   keeping its best, and keep the winner only if it beats the ``baseline`` (e.g. ``jax.jit``
   of the same region, measured in the same process); without a baseline the report says
   "not compared".

Determinism: tasks run in a fixed order, results are merged in task order and ties are broken
by canonical text, and all random inputs derive from ``seed``: the same config gives the same
result unless a *time* budget cuts the enumeration (``max_states`` is the deterministic bound).
"""

from __future__ import annotations

import concurrent.futures as cf
import hashlib
import logging
import math
import multiprocessing
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from mirage_jax.config import SearchConfig, SearchSpace
from mirage_jax.errors import MirageError, SearchError
from mirage_jax.ir.fuse import fuse_elementwise
from mirage_jax.ir.graph import BlockGraph, KernelGraph, map_blocks
from mirage_jax.ir.ops import ACCUMULATORS, Op
from mirage_jax.ir.text import parse, to_text
from mirage_jax.search import cost as cost_model
from mirage_jax.search import enumerate as en
from mirage_jax.search.calibrate import host_model
from mirage_jax.search.equivalence import (
    FFSpec,
    FFVerdict,
    FloatVerdict,
    false_acceptance_bound,
    ff_check_many,
    float_check,
    pair_degree_bound,
    target_digest,
)

log = logging.getLogger("mirage_jax.search")

# shares of the time budget: enumeration ends at 45%, ranking at 55%, verification at 85%
# (once one candidate is verified); timing the best few takes the rest
ENUMERATION_SHARE, RANKING_SHARE, VERIFY_SHARE = 0.45, 0.55, 0.85


class Timer(Protocol):
    """Measures one candidate: seconds per call, or None when it cannot be run here."""

    def __call__(self, graph: KernelGraph) -> float | None: ...


@dataclass(frozen=True)
class Candidate:
    """A candidate μGraph with what the search learnt about it."""

    graph: KernelGraph
    estimate_s: float
    skeleton: str  # canonical fingerprint of its block skeleton(s)
    ff: FFVerdict | None = None
    float: FloatVerdict | None = None
    measured_s: float | None = None

    @property
    def verified(self) -> bool:
        return bool(self.ff and self.ff.ok and (self.float is None or self.float.ok))

    def summary(self) -> str:
        return summarize(self.graph)


@dataclass
class SearchReport:
    """What one search did, stage by stage (``str()`` gives a readable summary)."""

    target: str = ""
    states: int = 0  # partial μGraphs enumerated (kernel and block level)
    proposed: int = 0
    pruned_abstract: int = 0  # by the abstract-expression oracle
    pruned_index: int = 0  # by the index analysis
    pruned_duplicate: int = 0
    pruned_dead: int = 0
    pruned_numeric: int = 0  # exps of unshifted values (numerically unsafe)
    sites: int = 0
    tasks: int = 0
    tasks_run: int = 0
    tasks_truncated: int = 0
    skeletons: int = 0  # distinct complete block skeletons
    candidates: int = 0  # concrete μGraphs (skeleton x tiling) ranked by the cost model
    ff_checked: int = 0
    ff_rejected: int = 0  # rejected by verification (finite field)
    skipped_rejected_skeleton: int = 0
    float_rejected: int = 0
    verified: int = 0
    timed: int = 0
    # (summary, estimated s, measured s) of every timed candidate: how the cost model ranks
    timed_candidates: list[tuple[str, float, float]] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)
    stop_reason: str = ""
    trials: int = 0
    degree: int = 0
    false_acceptance_bound: float = 0.0
    oracle_saturated: bool = False
    oracle_enodes: int = 0
    best_summary: str = ""
    best_text: str = ""
    best_estimate_s: float | None = None
    best_measured_s: float | None = None
    baseline_s: float | None = None
    comparison: str = "not compared"
    notes: list[str] = field(default_factory=list)

    @property
    def total_s(self) -> float:
        return self.timings.get("total", 0.0)

    def __str__(self) -> str:
        t = self.timings
        lines = [
            f"search of {self.target}: {self.stop_reason} after {self.total_s:.1f}s",
            f"  enumerated {self.states} states ({self.proposed} ops proposed); pruned: "
            f"{self.pruned_abstract} abstract, {self.pruned_index} index, "
            f"{self.pruned_duplicate} duplicate, {self.pruned_dead} dead-end, "
            f"{self.pruned_numeric} unsafe exp",
            f"  {self.sites} graph_def sites, {self.tasks_run}/{self.tasks} block tasks run "
            f"({self.tasks_truncated} cut by a budget), {self.skeletons} skeletons, "
            f"{self.candidates} candidates",
            f"  verification: {self.ff_checked} checked, {self.ff_rejected} rejected (finite "
            f"field, {self.trials} trials), {self.float_rejected} rejected (float), "
            f"{self.verified} verified; false acceptance <= {self.false_acceptance_bound:.2g} "
            f"per candidate (degree <= {self.degree})",
            f"  oracle: {'saturated' if self.oracle_saturated else 'NOT saturated'}, "
            f"{self.oracle_enodes} e-nodes",
            "  timings: " + ", ".join(f"{k} {v:.2f}s" for k, v in t.items()),
            f"  best: {self.best_summary or '(the target itself)'}",
        ]
        if self.best_estimate_s is not None:
            lines.append(f"  estimate {self.best_estimate_s * 1e6:.1f}us; measured "
                         + (f"{self.best_measured_s * 1e6:.1f}us"
                            if self.best_measured_s is not None else "-")
                         + f"; {self.comparison}")  # fmt: skip
        lines.extend(f"  timed: estimate {e * 1e6:.1f}us, measured {m * 1e6:.1f}us: {what}"
                     for what, e, m in self.timed_candidates)
        lines.extend(f"  note: {n}" for n in self.notes)
        return "\n".join(lines)


@dataclass(frozen=True)
class SearchResult:
    """The winner (the target itself when nothing verified beats it), every verified
    candidate (best first) and the report."""

    best: KernelGraph
    verified: tuple[Candidate, ...]
    report: SearchReport


# ---------------------------------------------------------------------------------------------
# executors


class InlineExecutor(cf.Executor):
    """Runs each task when submitted, in this thread (``workers=1``, or for tests)."""

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> cf.Future:
        fut: cf.Future = cf.Future()
        try:
            fut.set_result(fn(*args, **kwargs))
        except BaseException as err:  # noqa: BLE001 - handed to the caller via the future
            fut.set_exception(err)
        return fut


def default_executor(workers: int) -> cf.Executor:
    if workers <= 1:
        return InlineExecutor()
    return cf.ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"))


# ---------------------------------------------------------------------------------------------
# worker side (module-level, picklable, with per-process caches)


_STATE: dict[Any, Any] = {}


def _worker_context(target_text: str, config: SearchConfig) -> tuple[KernelGraph, Any, Any]:
    key = (target_text, config)
    hit = _STATE.get(key)
    if hit is None:
        target = parse(target_text)
        space = config.space(target)  # type: ignore[arg-type]
        oracle = _make_oracle(target, config) if config.prune else None
        hit = _STATE[key] = (target, space, oracle)
    return hit


def _make_oracle(target: KernelGraph, config: SearchConfig) -> Any:
    from mirage_jax.search.abstract import SaturationBudget, SubexprOracle

    budget = SaturationBudget(config.saturation_iterations, config.saturation_node_limit,
                              config.saturation_time_s)  # fmt: skip
    return SubexprOracle(target, budget=budget)


def block_worker(target_text: str, config: SearchConfig, task: en.BlockTask,
                 deadline: float) -> en.BlockResult:  # fmt: skip
    """Run one block task (in any process)."""
    _, space, oracle = _worker_context(target_text, config)
    if time.time() > deadline:
        res = en.BlockResult(task)
        res.counters.truncated = True
        return res
    return en.run_block_task(task, space, oracle, deadline)


def target_digest_worker(target_text: str, spec: FFSpec, trial: int) -> str:
    """The target's fingerprint on one trial (computed once per search, in any process)."""
    return target_digest(_parse_cached(target_text), spec, trial)  # type: ignore[arg-type]


def verify_worker(target_text: str, candidate_texts: Sequence[str], spec: FFSpec,
                  float_seed: int | None, target_digests: Sequence[str] | None = None,
                  ) -> list[tuple[FFVerdict, FloatVerdict | None]]:  # fmt: skip
    """Verify a batch: the float check (when ``float_seed`` is given; at real shapes it is
    the cheaper check, so it runs first), then finite-field fingerprints of the survivors,
    trial by trial. A candidate rejected by the float check has ``FFVerdict.trials == 0``."""
    target = _parse_cached(target_text)
    cands = [parse(t) for t in candidate_texts]
    floats = [float_check(target, c, float_seed) if float_seed is not None else None  # type: ignore[arg-type]
              for c in cands]  # fmt: skip
    alive = [k for k, f in enumerate(floats) if f is None or f.ok]
    ffs = ff_check_many(target, [cands[k] for k in alive], spec, target_digests)  # type: ignore[arg-type]
    out: list[tuple[FFVerdict, FloatVerdict | None]] = [
        (FFVerdict(False, 0, 0.0, "rejected by the float check"), f) for f in floats
    ]  # fmt: skip
    for k, ff in zip(alive, ffs):
        out[k] = (ff, floats[k])
    return out


def _parse_cached(text: str) -> KernelGraph:
    key = ("parsed", text)
    if key not in _STATE:
        _STATE[key] = parse(text)
    return _STATE[key]


# ---------------------------------------------------------------------------------------------
# the driver


def superoptimize(
    kernel_graph: KernelGraph,
    config: SearchConfig | None = None,
    *,
    executor: cf.Executor | None = None,
    timer: Timer | None = None,
    baseline: Callable[[], float] | None = None,
) -> SearchResult:
    """Search for a faster μGraph equivalent to ``kernel_graph`` (see the module docstring).

    ``executor``: where enumeration and verification tasks run (default: a process pool of
    ``config.workers``). ``timer``: measures a candidate (default: compile and time it on
    this CPU when ``config.time_candidates``; pass ``lambda g: None`` to skip timing).
    ``baseline``: seconds of the reference (e.g. ``jax.jit`` of the region), measured in this
    process; the winner replaces the target only if it is faster.
    """
    if not isinstance(kernel_graph, KernelGraph):
        raise SearchError(f"superoptimize takes a KernelGraph, got {type(kernel_graph).__name__}",
                          remedy="trace a function with mirage_jax.trace and pass "
                          "region.graph")  # fmt: skip
    config = config or SearchConfig()
    # calibrate (once per host, cached) before any worker runs: a loaded machine measures low
    model = host_model()
    own = executor is None
    executor = executor or default_executor(config.workers)
    try:
        return _Search(kernel_graph, config, executor, timer, baseline, model).run()
    finally:
        if own:
            executor.shutdown(wait=True, cancel_futures=True)


class _Search:
    def __init__(self, target: KernelGraph, config: SearchConfig, executor: cf.Executor,
                 timer: Timer | None, baseline: Callable[[], float] | None,
                 model: cost_model.CpuModel) -> None:  # fmt: skip
        self.target, self.config, self.executor = target, config, executor
        self.model = model
        self.timer, self.baseline = timer, baseline
        self.report = SearchReport(target=summarize(target))
        self.start = time.time()
        self.deadline = self.start + config.time_budget_s
        self.text = to_text(target)
        self.spec = FFSpec(seed=config.seed, trials=config.trials)

    def _stage(self, name: str, since: float) -> float:
        now = time.perf_counter()
        self.report.timings[name] = self.report.timings.get(name, 0.0) + now - since
        return now

    def run(self) -> SearchResult:
        t = t0 = time.perf_counter()
        space = self.space = self.config.space(self.target)
        oracle = _make_oracle(self.target, self.config) if self.config.prune else None
        if oracle is not None:
            _STATE[(self.text, self.config)] = (self.target, space, oracle)
            self.report.oracle_saturated = oracle.stats.saturated
            self.report.oracle_enodes = oracle.stats.enodes
            if not oracle.stats.saturated:
                self.report.notes.append(
                    f"the e-graph saturation stopped at its {oracle.stats.stop_reason}: pruning "
                    "may drop terms the axioms would accept (raise the saturation budget)")
        t = self._stage("saturation", t)
        kernel = en.KernelDFS(self.target, space, oracle).run()
        self._count(kernel.counters)
        t = self._stage("kernel", t)
        # the target's fingerprints are needed by every verification: start them now, beside
        # the enumeration (one trial per task)
        self._digest_futures = (
            [self.executor.submit(target_digest_worker, self.text, self.spec, trial)
             for trial in range(self.spec.trials)] if self.config.max_graph_defs else []
        )  # fmt: skip
        skeletons = self._enumerate_blocks(space, oracle, kernel.sites)
        t = self._stage("block", t)
        ranked = self._instantiate(space, kernel, skeletons)
        t = self._stage("instantiate", t)
        verified = self._verify(ranked)
        t = self._stage("verify", t)
        best, verified = self._choose(verified)
        self._stage("timing", t)
        self.report.timings["total"] = time.perf_counter() - t0
        self._finish(best, verified)
        return SearchResult(best, tuple(verified), self.report)

    def _count(self, c: en.Counters) -> None:
        r = self.report
        r.states += c.states
        r.proposed += c.proposed
        r.pruned_abstract += c.pruned_abstract
        r.pruned_index += c.pruned_index
        r.pruned_duplicate += c.pruned_duplicate
        r.pruned_dead += c.pruned_dead
        r.pruned_numeric += c.pruned_numeric

    # -- block level ---------------------------------------------------------------------
    def _tasks(self, space: SearchSpace, oracle: Any, sites: Sequence[en.Site]
               ) -> list[tuple[en.Site, en.BlockTask]]:  # fmt: skip
        cfg = self.config
        index = en.IndexAnalysis(self.target) if cfg.prune else None
        if index is not None and not index.enabled:
            index = None
        extents = en.reduce_extents(self.target)
        shifted = cfg.prune and en.shifted_exps(self.target)
        seen: set[Any] = set()
        out = []
        for rank, site in enumerate(sites):
            key = (site.arg_types, site.arg_terms)
            if key in seen:
                continue
            seen.add(key)
            arg_index = site.arg_index if index is not None else None
            seeds = en.target_macros(self.target, site.arg_terms, space.block_ops,
                                     single_leaf=True) if cfg.prune else ()  # fmt: skip
            site_cost = _site_cost(site)
            for fdims, forloop, prio, loop_class in en.loop_structures(
                site.arg_types, space, extents, arg_index
            ):
                for seeded in ((seeds, ()) if seeds else ((),)):
                    task = en.BlockTask(
                        site.arg_types, site.arg_terms, fdims, forloop, self.target.output_types,
                        space.max_block_ops, cfg.max_states, cfg.prune,
                        priority=0, arg_index=arg_index,
                        out_index=tuple(index.outputs) if index is not None else None,
                        events=index.events if index is not None else frozenset(),
                        loop_class=loop_class, seeds=seeded, shifted_exp=shifted,
                    )  # fmt: skip
                    order = (site_cost, 0 if seeded else 1, prio, rank)
                    out.append((order, site, task))
        out.sort(key=lambda x: x[0])
        self.report.sites = len(seen)
        return [(s, t) for _, s, t in out]

    def _enumerate_blocks(self, space: SearchSpace, oracle: Any, sites: Sequence[en.Site]
                          ) -> list[tuple[en.Site, en.Skeleton]]:  # fmt: skip
        cfg = self.config
        if cfg.max_graph_defs < 1:
            return []
        tasks = self._tasks(space, oracle, sites)
        self.report.tasks = len(tasks)
        capped = cfg.max_tasks is not None and cfg.max_tasks < len(tasks)
        if capped:
            tasks = tasks[: cfg.max_tasks]
        deadline = self.start + cfg.time_budget_s * ENUMERATION_SHARE
        results: list[en.BlockResult | None] = [None] * len(tasks)
        # a window of tasks in flight, refilled in priority order until the deadline: tasks
        # past it are never sent (sending thousands of no-op tasks costs seconds)
        window = max(2, 4 * max(1, cfg.workers))
        pending: dict[cf.Future, int] = {}
        nxt = 0
        bar = _progress(cfg, len(tasks), "enumerate")
        try:
            while nxt < len(tasks) or pending:
                while nxt < len(tasks) and len(pending) < window and time.time() < deadline:
                    fut = self.executor.submit(block_worker, self.text, cfg, tasks[nxt][1],
                                               deadline)  # fmt: skip
                    pending[fut] = nxt
                    nxt += 1
                if not pending:
                    break
                done, _ = cf.wait(pending, return_when=cf.FIRST_COMPLETED)
                for fut in done:
                    results[pending.pop(fut)] = fut.result()
                    if bar is not None:
                        bar.update(1)
        finally:
            if bar is not None:
                bar.close()
        found: list[tuple[en.Site, en.Skeleton]] = []
        seen: set[Any] = set()
        for (site, task), res in zip(tasks, results):
            if res is None:  # never sent: the time budget ended first
                continue
            self._count(res.counters)
            if res.counters.states:
                self.report.tasks_run += 1
            self.report.tasks_truncated += int(res.counters.truncated)
            for skel in res.skeletons:
                canon = en.canonical_block(skel.block)
                key = (site.prefix.nodes, site.operands, canon.fingerprint())
                if key not in seen:
                    seen.add(key)
                    found.append((site, en.Skeleton(canon, skel.fdims)))
            log.debug("task %s: %s", task.label, res.counters)
        self.report.skeletons = len(found)
        if time.time() > deadline and (self.report.tasks_truncated
                                       or self.report.tasks_run < len(tasks)):  # fmt: skip
            self.report.stop_reason = "time budget"
        elif self.report.tasks_truncated:
            self.report.stop_reason = "state budget"
        elif capped:
            self.report.stop_reason = "task budget"
        else:
            self.report.stop_reason = "exhausted"
        log.info("block enumeration: %d tasks, %d skeletons (%s)", len(tasks), len(found),
                 self.report.stop_reason)  # fmt: skip
        return found

    # -- instantiation and ranking ---------------------------------------------------------
    def _instantiate(self, space: SearchSpace, kernel: en.KernelEnumeration,
                     skeletons: Sequence[tuple[en.Site, en.Skeleton]]) -> list[Candidate]:  # fmt: skip
        cands: list[Candidate] = []
        for graph in kernel.complete:
            est = cost_model.estimate(graph, self.model).time_s
            cands.append(Candidate(graph, est, "kernel:" + graph.fingerprint()[:16]))
        # rank skeletons by one representative tiling each, then expand the best ones fully
        scored = []
        deadline = self.start + self.config.time_budget_s * RANKING_SHARE
        for k, (site, skel) in enumerate(skeletons):
            if k >= 8 and time.time() > deadline:  # the first few are ranked in any case
                self.report.notes.append(f"ranking stopped by the time budget after {k} of "
                                         f"{len(skeletons)} skeletons")  # fmt: skip
                break
            tilings = en.tilings(skel, space)
            rep = _representative(tilings, space)
            c = self._candidate(site, skel, rep) if rep is not None else None
            if c is not None:
                scored.append((c.estimate_s, k, site, skel, tilings))
        scored.sort(key=lambda x: x[:2])
        expand = _round_robin(scored, self.config.max_skeletons_ranked)
        for k, (_, _, site, skel, tilings) in enumerate(scored):
            if k not in expand and time.time() > deadline:
                continue
            if k in expand:
                todo = tilings
            else:
                rep = _representative(tilings, space)
                todo = [rep] if rep is not None else []
            for tiling in todo:
                c = self._candidate(site, skel, tiling)
                if c is not None:
                    cands.append(c)
        cands.sort(key=_rank_key)
        self.report.candidates = len(cands)
        # the best tiling of every skeleton first, so verification and timing see variety
        firsts, rest, seen = [], [], set()
        for c in cands:
            (rest if c.skeleton in seen else firsts).append(c)
            seen.add(c.skeleton)
        return _diversify(firsts) + rest

    def _candidate(self, site: en.Site, skel: en.Skeleton, tiling: en.Tiling) -> Candidate | None:
        block = en.instantiate(skel, tiling, self.space)
        graph = en.build_kernel(site.prefix, block, site.operands) if block is not None else None
        if graph is None:
            return None
        # a skeleton is a block graph *at a site*: the same block on other operands is another
        key = hashlib.sha1(repr((site.prefix.nodes, site.operands)).encode()).hexdigest()[:8]
        return Candidate(graph, cost_model.estimate(graph, self.model).time_s,
                         key + ":" + skel.block.fingerprint()[:16])  # fmt: skip

    # -- verification ------------------------------------------------------------------------
    def _verify(self, ranked: Sequence[Candidate]) -> list[Candidate]:
        cfg = self.config
        rejected: set[str] = set()
        verified: list[Candidate] = []
        seed = cfg.seed if cfg.float_check else None
        workers = max(1, cfg.workers)
        per_worker = 1
        pos = 0
        bar = _progress(cfg, min(len(ranked), cfg.max_verify), "verify")
        degree = 1
        futs = getattr(self, "_digest_futures", None) or []
        digests = [f.result() for f in futs] if futs else None
        deadline = self.start + cfg.time_budget_s * VERIFY_SHARE
        try:
            while pos < len(ranked) and len(verified) < cfg.max_verify:
                if verified and time.time() > deadline:
                    self.report.notes.append("verification stopped by the time budget")
                    break
                want = min(workers * per_worker, cfg.max_verify - len(verified))
                chunk: list[Candidate] = []
                while pos < len(ranked) and len(chunk) < want:
                    c = ranked[pos]
                    pos += 1
                    if c.skeleton in rejected:
                        self.report.skipped_rejected_skeleton += 1
                        continue
                    chunk.append(_fused(c, self.model))
                groups = [chunk[k::workers] for k in range(workers) if chunk[k::workers]]
                futs = [self.executor.submit(verify_worker, self.text,
                                             [str(c.graph) for c in grp], self.spec, seed,
                                             digests)
                        for grp in groups]  # fmt: skip
                pairs = [(c, v) for grp, fut in zip(groups, futs)
                         for c, v in zip(grp, fut.result())]  # fmt: skip
                rank = {id(c): k for k, c in enumerate(chunk)}
                pairs.sort(key=lambda cv: rank[id(cv[0])])
                for c, (ff, fl) in pairs:
                    self.report.ff_checked += 1
                    degree = max(degree, pair_degree_bound(self.target, c.graph))
                    c = Candidate(c.graph, c.estimate_s, c.skeleton, ff, fl)
                    if fl is not None and not fl.ok:
                        self.report.float_rejected += 1
                        rejected.add(c.skeleton)
                        log.info("float check rejected %s: %s", c.summary(), fl)
                    elif not ff.ok:
                        self.report.ff_rejected += 1
                        rejected.add(c.skeleton)
                        log.debug("finite field rejected %s:\n%s", c.summary(), c.graph)
                    else:
                        verified.append(c)
                        if bar is not None:
                            bar.update(1)
        finally:
            if bar is not None:
                bar.close()
        self.report.verified = len(verified)
        self.report.trials = cfg.trials
        self.report.degree = degree
        self.report.false_acceptance_bound = false_acceptance_bound(degree, self.spec)
        return verified

    # -- timing and the choice ------------------------------------------------------------------
    def _choose(self, verified: list[Candidate]) -> tuple[KernelGraph, list[Candidate]]:
        cfg = self.config
        if not verified:
            return self.target, []
        timer = self.timer
        if timer is None and cfg.time_candidates:
            timer = compiled_timer()
        timed = []
        if timer is not None:
            timed = self._time(timer, verified[: cfg.top_k_timed])
            self.report.timed = sum(c.measured_s is not None for c in timed)
            self.report.timed_candidates = [(c.summary(), c.estimate_s, c.measured_s)
                                            for c in timed if c.measured_s is not None]  # fmt: skip
        # measured candidates first (fastest first), then the rest in cost-model order
        measured = sorted((c for c in timed if c.measured_s is not None),
                          key=lambda c: c.measured_s)  # type: ignore[arg-type, return-value]
        unmeasured = [c for c in timed if c.measured_s is None] + verified[len(timed):]
        order = measured + unmeasured
        best = order[0]
        if self.baseline is not None and best.measured_s is not None:
            base = self.baseline()
            self.report.baseline_s = base
            if best.measured_s < base:
                self.report.comparison = f"{base / best.measured_s:.2f}x faster than the baseline"
            else:
                self.report.comparison = (f"not faster than the baseline ({base * 1e6:.1f}us): "
                                          "the target is kept")  # fmt: skip
                return self.target, order
        elif self.baseline is not None:
            self.report.comparison = "not compared (the candidate could not be timed)"
        return best.graph, order

    def _time(self, timer: Timer, shortlist: Sequence[Candidate]) -> list[Candidate]:
        """``shortlist`` with measured times: ``timing_rounds`` rounds over all candidates in
        turn, each keeping its best round, so that a slow spell of the machine (frequency,
        other tenants) cannot rank one candidate against another measured at a better time.
        A candidate that fails or cannot run is not timed again."""
        best: list[float | None] = [None] * len(shortlist)
        for rnd in range(self.config.timing_rounds):
            for i, c in enumerate(shortlist):
                if rnd and best[i] is None:  # failed or could not run in the first round
                    continue
                if (rnd or i) and time.time() > self.deadline:
                    self.report.notes.append("timing stopped by the time budget")
                    return self._timed(shortlist, best)
                try:
                    s = timer(c.graph)
                except MirageError as err:
                    self.report.notes.append(f"timing failed: {err.cause}")
                    s = None
                if s is not None:
                    best[i] = s if best[i] is None else min(best[i], s)
        return self._timed(shortlist, best)

    @staticmethod
    def _timed(shortlist: Sequence[Candidate], best: Sequence[float | None]) -> list[Candidate]:
        return [Candidate(c.graph, c.estimate_s, c.skeleton, c.ff, c.float, s)
                for c, s in zip(shortlist, best)]  # fmt: skip

    def _finish(self, best: KernelGraph, verified: Sequence[Candidate]) -> None:
        r = self.report
        if best is self.target:
            r.best_summary = ""
            r.best_text = str(self.target)
            if not verified:
                r.notes.append("no verified candidate: the target is kept")
            return
        top = verified[0]
        r.best_summary = top.summary()
        r.best_text = str(best)
        r.best_estimate_s = top.estimate_s
        r.best_measured_s = top.measured_s
        log.info("best: %s", r.best_summary)


def _structure(graph: KernelGraph) -> tuple[int, bool]:
    """(kernels, whether a graph-defined kernel accumulates over a for-loop): the classes
    the shortlist mixes."""
    kernels = [n for n in graph.nodes if n.op not in (Op.INPUT, Op.OUTPUT, Op.RESHAPE)]
    accumulates = any(m.op in ACCUMULATORS for n in kernels if n.op is Op.GRAPH_DEF
                      for m in n.attr("block").nodes)  # fmt: skip
    return len(kernels), accumulates


def _diversify(ranked: Sequence[Candidate]) -> list[Candidate]:
    """Candidates round-robin over their structure classes, each class in rank order, the
    classes in the order of their best: the first few verified and timed then differ in
    kind (fused or not, accumulating or not), which the cost model orders least reliably."""
    classes: dict[tuple[int, bool], list[Candidate]] = {}
    for c in ranked:
        classes.setdefault(_structure(c.graph), []).append(c)
    queues = list(classes.values())  # dicts keep insertion order: the order of each best
    out: list[Candidate] = []
    depth = 0
    while len(out) < len(ranked):
        out += [q[depth] for q in queues if depth < len(q)]
        depth += 1
    return out


def _rank_key(c: Candidate) -> tuple:
    """Estimated time, in buckets of 2% (the model cannot tell such times apart), then fewer
    kernels, then the canonical text for determinism."""
    bucket = math.floor(math.log(max(c.estimate_s, 1e-9)) / math.log(1.02))
    kernels = sum(n.op not in (Op.INPUT, Op.OUTPUT, Op.RESHAPE) for n in c.graph.nodes)
    return (bucket, kernels, c.estimate_s, c.graph.fingerprint())


def _round_robin(scored: Sequence[tuple], n: int) -> set[int]:
    """Indices of the ``n`` skeletons to expand at every tiling: the best of each (site,
    loop structure) group first, then the second best of each, ... (variety for ranking)."""
    groups: dict[Any, list[int]] = {}
    for k, (_, _, site, skel, _) in enumerate(scored):
        groups.setdefault((site.prefix.nodes, site.operands, skel.fdims), []).append(k)
    chosen: set[int] = set()
    depth = 0
    while len(chosen) < n and any(len(g) > depth for g in groups.values()):
        for g in groups.values():
            if depth < len(g) and len(chosen) < n:
                chosen.add(g[depth])
        depth += 1
    return chosen


def _representative(tilings: Sequence[en.Tiling], space: SearchSpace) -> en.Tiling | None:
    """A middle-of-the-road tiling: blocks nearest 4 per core, then the middle loop range."""
    if not tilings:
        return None
    want = 4 * space.cores

    def blocks(t: en.Tiling) -> int:
        return t.grid[0] * t.grid[1] * t.grid[2]

    best = min(tilings, key=lambda t: (abs(blocks(t) - want), t.forloop))
    ranges = sorted({t.forloop for t in tilings if t.axes == best.axes})
    mid = ranges[len(ranges) // 2]
    return next(t for t in tilings if t.axes == best.axes and t.forloop == mid)


def _site_cost(site: en.Site) -> int:
    """Sites in order: fewer compute ops before the graph_def, then fewer layout ops; operands
    of different ranks (which block ops cannot combine) last among their peers."""
    compute = sum(op not in (Op.RESHAPE, Op.TRANSPOSE, Op.CAST) for op, _, _ in site.prefix.nodes)
    mixed = len({t.rank for t in site.arg_types}) > 1
    return 10 * compute + site.prefix.num_ops + 5 * mixed


def _fused(c: Candidate, model: cost_model.CpuModel) -> Candidate:
    """Thread graphs by rule: the candidate with its elementwise chains fused."""
    graph = fuse_kernel(c.graph)
    if graph is c.graph:
        return c
    return Candidate(graph, cost_model.estimate(graph, model).time_s, c.skeleton)


def fuse_kernel(graph: KernelGraph) -> KernelGraph:
    """``graph`` with ``fuse_elementwise`` applied to every block graph."""
    return map_blocks(graph, fuse_elementwise) if graph.nodes_of(Op.GRAPH_DEF) else graph


def summarize(graph: KernelGraph) -> str:
    """One line: the kernels of a μGraph, with each graph_def's grid, loop and ops."""
    parts = []
    for node in graph.nodes:
        if node.op in (Op.INPUT, Op.OUTPUT):
            continue
        if node.op is Op.GRAPH_DEF:
            b: BlockGraph = node.attr("block")
            ops = [n.op.value for n in b.nodes if n.op not in (Op.INPUT_ITER, Op.OUTPUT_SAVER)]
            parts.append(f"graph_def[grid={b.grid} R={b.forloop_range}: {' '.join(ops)}]")
        else:
            parts.append(node.op.value)
    return "; ".join(parts)


def compiled_timer(budget_s: float = 0.15) -> Timer:
    """The default timer: compile the candidate for this CPU and take the median call time.

    Compiled callables and their inputs are kept per graph, so the rounds of ``_Search._time``
    re-time a candidate without compiling it again."""
    prepared: dict[str, tuple[Any, Any]] = {}

    def measure(graph: KernelGraph) -> float | None:
        import jax

        from mirage_jax.lowering import compile_graph
        from mirage_jax.search.equivalence import realistic_inputs
        from mirage_jax.timing import device_args, median_seconds

        key = graph.fingerprint()
        if key not in prepared:
            fn = jax.jit(compile_graph(graph))
            prepared[key] = fn, device_args(realistic_inputs(graph.input_types))
        fn, args = prepared[key]
        return median_seconds(fn, args, budget_s=budget_s)

    return measure


def _progress(config: SearchConfig, total: int, what: str) -> Any:
    if config.progress is False or total == 0:
        return None
    try:
        from tqdm.auto import tqdm
    except ImportError:  # pragma: no cover - tqdm is a dependency
        return None
    delay = 0.0 if config.progress else 1.0  # None: only for searches longer than a second
    return tqdm(total=total, desc=f"mirage search: {what}", delay=delay, leave=False)


__all__ = [
    "Candidate", "InlineExecutor", "SearchReport", "SearchResult", "Timer", "block_worker",
    "compiled_timer", "default_executor", "fuse_kernel", "summarize", "superoptimize",
    "verify_worker",
]  # fmt: skip
