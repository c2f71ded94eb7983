"""The superoptimizer's driver: ``superoptimize(kernel_graph, config) -> SearchResult``.

The pipeline, top to bottom (each stage timed and counted in the ``SearchReport``):

1. derive the search space from the target (``SearchConfig.space``), saturate the target's
   e-graph (``SubexprOracle``) and analyse its indices (``IndexAnalysis``);
2. kernel level: grow prefixes of pre-defined ops and collect graph_def *sites* (a prefix and
   the operands chosen for one graph-defined kernel); prefixes that already compute the
   target are candidates too;
3. block level: one enumeration task per (site, loop structure, seeding), in priority order,
   run on an ``concurrent.futures.Executor`` (by default ``workers.LocalPool``: here, then a
   pool of ``workers``; any executor works - tasks and results are picklable, the functions
   are module-level, e.g. a Dask cluster's) until they are exhausted or the enumeration share of
   the time budget ends. A task lost with its worker is sent again (``TASK_RETRIES``); one
   still lost is reported as not run: the stop reason then begins with ``INCOMPLETE``;
4. instantiate every distinct skeleton at every concrete tiling, rank the candidates with the
   target backend's analytic cost model (``cost_model``), fuse elementwise chains into
   thread graphs by rule;
5. verify in rank order until ``max_verify`` candidates are verified (and the best of every
   structure class checked) or ``verify_elements`` is spent: the float check against the
   float64 target on wide random inputs (cheap at real shapes, and it catches what the field
   cannot: overflow, cancellation), then finite-field fingerprints
   (``equivalence.ff_check_many``); a skeleton rejected once is skipped at its other tilings;
6. time the best ``top_k_timed`` verified candidates for real (``timer``: the backend's, which
   compiles and takes medians) in ``timing_rounds`` interleaved rounds, each candidate
   keeping its best, and keep the winner only if it beats the ``baseline`` (e.g. ``jax.jit``
   of the same region, measured in the same process); without a baseline the report says
   "not compared".

Determinism: tasks run in a fixed order, results are merged in task order and ties are broken
by canonical text, and all random inputs derive from ``seed``: the same config gives the same
result whichever executor runs the tasks, unless a *time* budget cuts the enumeration. The
deterministic bounds are ``max_states`` per task and ``max_total_states`` over the tasks in
task order (a task finished past that cut is dropped, whichever worker finished first), and
``verify_elements`` for the verification (its candidates taken as if one by one); the
stop reason names what ended the enumeration, and only "exhausted" means the result is the
best within the bounds (``SearchReport.coverage_text``). ``explore`` runs stages 1-5 alone, so
that several searches can share a cluster and then time their candidates one after another on
a quiet machine.
"""

from __future__ import annotations

import concurrent.futures as cf
import dataclasses
import hashlib
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from mirage_jax.errors import MirageError, SearchError
from mirage_jax.ir.fuse import fuse_elementwise
from mirage_jax.ir.graph import KernelGraph, map_blocks
from mirage_jax.ir.ops import Op
from mirage_jax.ir.text import to_text
from mirage_jax.search import enumeration as en
from mirage_jax.search import output_shapes, ranking, skeletons
from mirage_jax.search.config import SearchConfig, SearchSpace
from mirage_jax.search.equivalence import (
    FFSpec,
    evaluation_size,
    false_acceptance_bound,
    pair_degree_bound,
)
from mirage_jax.search.report import Candidate, SearchReport, SearchResult, summarize
from mirage_jax.search.workers import (
    InlineExecutor,
    TaskChunker,
    TaskLost,
    block_worker,
    default_executor,
    make_oracle,
    prime,
    target_digest_worker,
    verify_worker,
)

log = logging.getLogger("mirage_jax.search")

# shares of the time budget: enumeration ends at 45%, ranking at 55%; verification, bounded by
# its work (``verify_elements``), may take the rest (once one candidate is verified): at 85%
# a single-worker search on this 2-core host stopped gqa_decode bs=8 one full-shape check
# (~12 s) short of its bound where two workers did not, so the verified set depended on the
# workers. Timing then has what is left, and always times the best candidate.
ENUMERATION_SHARE, RANKING_SHARE, VERIFY_SHARE = 0.45, 0.55, 1.0
# the enumeration counters that add up into the report (the rest are per task)
_REPORTED_COUNTERS = ("states", "proposed", "pruned_abstract", "pruned_index", "pruned_duplicate",
                      "pruned_dead", "pruned_numeric")  # fmt: skip
# what a future raises when its task did not run (see ``workers.TaskLost``): the task is sent
# again up to TASK_RETRIES times; then a verification task runs here (a candidate is never
# reported verified or rejected unchecked) and a block task is reported as not run
LOST = (TaskLost, cf.CancelledError, cf.BrokenExecutor)
TASK_RETRIES = 2
# how ``SearchReport.stop_reason`` begins when tasks were lost: such a search is not complete
INCOMPLETE = "incomplete"
# the stop reason of a search that ran every block task to its end: its result is the best
# μGraph within its bounds (``explain`` says "optimal within bounds" only then)
EXHAUSTED = "exhausted"
# the stop reason of a search that replayed the skeletons a search at other shapes found
# (``SearchConfig.reuse_skeletons``): its candidates were not enumerated at these shapes
REUSED = "reused the skeletons found"


class CostModel(Protocol):
    """Ranks candidates: a backend's analytic estimate of a μGraph's run time (seconds)."""

    def estimate_s(self, graph: KernelGraph) -> float: ...


class Timer(Protocol):
    """Measures one candidate: seconds per call, or None when it cannot be run here."""

    def __call__(self, graph: KernelGraph) -> float | None: ...


# ---------------------------------------------------------------------------------------------
# the driver


def superoptimize(
    kernel_graph: KernelGraph,
    config: SearchConfig | None = None,
    *,
    cost_model: CostModel,
    executor: cf.Executor | None = None,
    timer: Timer | None = None,
    baseline: Callable[[], float] | None = None,
) -> SearchResult:
    """Search for a faster μGraph equivalent to ``kernel_graph`` (see the module docstring).

    ``cost_model``: ranks the candidates (the target backend's, e.g. ``Backend.cost_model()``).
    ``executor``: where enumeration and verification tasks run (default: a ``LocalPool`` of
    ``config.workers``). ``timer``: measures a candidate on the target backend (e.g.
    ``Backend.timer()``); without one nothing is timed and the cost model alone picks.
    ``baseline``: seconds of the reference (e.g. ``jax.jit`` of the region), measured in this
    process; the winner replaces the target only if it is faster.
    ``mirage_jax.superoptimize`` fills these in from a backend.
    """
    _check_target(kernel_graph)
    config = config or SearchConfig()
    own = executor is None
    executor = executor or default_executor(config.workers)
    try:
        found = explore(kernel_graph, config, cost_model=cost_model, executor=executor)
    finally:
        if own:
            executor.shutdown(wait=True, cancel_futures=True)
    return found.choose(timer, baseline)


def explore(kernel_graph: KernelGraph, config: SearchConfig, *, cost_model: CostModel,
            executor: cf.Executor) -> Exploration:  # fmt: skip
    """Stages 1-5 of ``superoptimize`` (everything but timing) on ``executor``;
    ``.choose(timer, baseline)`` on the result runs stage 6. Several searches can explore at
    once (one thread each, sharing a cluster) and time their candidates one after another on
    a quiet machine; the timing stage keeps the share of the budget it had left."""
    _check_target(kernel_graph)
    # workers on other machines derive the search space from the config: it must name the
    # cores of this one, where the kernels will run
    if config.cores is None:
        config = config.with_(cores=config.num_cores)
    return Exploration(kernel_graph, config, executor, cost_model).explore()


def _check_target(kernel_graph: Any) -> None:
    if not isinstance(kernel_graph, KernelGraph):
        raise SearchError(f"superoptimize takes a KernelGraph, got {type(kernel_graph).__name__}",
                          remedy="trace a function with mirage_jax.trace and pass "
                          "region.graph")  # fmt: skip


class Exploration:
    """One search between its stages: ``explore()`` runs stages 1-5, ``choose()`` stage 6."""

    def __init__(self, target: KernelGraph, config: SearchConfig, executor: cf.Executor,
                 cost_model: CostModel) -> None:  # fmt: skip
        # the search runs on the target without its output reshapes (``output_shapes``)
        self.original, self.target = target, output_shapes.peel(target)
        self.config, self.executor = config, executor
        self.cost = cost_model
        self.timer: Timer | None = None
        self.baseline: Callable[[], float] | None = None
        # the processes that run tasks: one when they run here (``default_executor`` runs
        # them here on a single usable CPU, whatever ``workers`` says)
        self.workers = 1 if isinstance(executor, InlineExecutor) else max(1, config.workers)
        self.report = SearchReport(target=summarize(target), cost_model=repr(cost_model),
                                   workers=self.workers)  # fmt: skip
        self.lost = 0  # task losses (each retry that was lost again counts)
        self.start = time.time()
        self.deadline = self.start + config.time_budget_s
        self.text = to_text(self.target)
        self.spec = FFSpec(seed=config.seed, trials=config.trials)

    def _stage(self, name: str, since: float) -> float:
        now = time.perf_counter()
        self.report.timings[name] = self.report.timings.get(name, 0.0) + now - since
        return now

    def explore(self) -> Exploration:
        t = t0 = time.perf_counter()
        space = self.space = self.config.space(self.target)
        oracle = make_oracle(self.target, self.config) if self.config.prune else None
        if oracle is not None:
            prime(self.text, self.config, self.target, space, oracle)
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
            [(self._submit(target_digest_worker, self.text, self.spec, trial),
              (self.text, self.spec, trial))
             for trial in range(self.spec.trials)] if self.config.max_graph_defs else []
        )  # fmt: skip
        skeletons = self._enumerate_blocks(space, oracle, kernel.sites)
        t = self._stage("block", t)
        ranked = self._instantiate(space, kernel, skeletons)
        t = self._stage("instantiate", t)
        self._verified = self._verify(ranked)
        self._stage("verify", t)
        if self.lost:
            self.report.notes.append(
                f"{self.lost} task(s) were lost with their workers and sent again (see the "
                "block task count and stop reason for what was not run)")  # fmt: skip
        self._explored_s = time.perf_counter() - t0
        self._left_s = self.deadline - time.time()
        return self

    def choose(self, timer: Timer | None = None,
               baseline: Callable[[], float] | None = None) -> SearchResult:  # fmt: skip
        """Stage 6: time the best verified candidates with ``timer`` (in this process, where
        the kernels will run) and compare the winner with ``baseline``."""
        self.timer, self.baseline = timer, baseline
        self.deadline = time.time() + self._left_s
        t = time.perf_counter()
        best, verified = self._choose(self._verified)
        self.report.timings["total"] = self._explored_s + self._stage("timing", t) - t
        shapes = self.original.output_types
        best = self.original if best is self.target else output_shapes.restore(best, shapes)
        verified = [dataclasses.replace(c, graph=output_shapes.restore(c.graph, shapes))
                    for c in verified]  # fmt: skip
        self._finish(best, verified)
        return SearchResult(best, tuple(verified), self.report)

    def _submit(self, fn: Callable[..., Any], *args: Any) -> cf.Future:
        """``executor.submit``, with a pool that broke (or a cluster with no worker left)
        answered by a lost future rather than an exception here."""
        try:
            return self.executor.submit(fn, *args)
        except LOST as err:
            fut: cf.Future = cf.Future()
            fut.set_exception(err)
            return fut

    def _collect(self, fut: cf.Future, fn: Callable[..., Any], args: tuple[Any, ...]) -> Any:
        """The result of ``fut`` (``fn(*args)`` on the executor). A lost task is sent again,
        and after TASK_RETRIES losses it runs in this process: it is a verification task,
        and identical wherever it runs."""
        for attempt in range(TASK_RETRIES + 1):
            try:
                return fut.result()
            except LOST as err:
                self.lost += 1
                log.warning("a %s task was lost (%s); %s", fn.__name__, _why(err),
                            "sending it again" if attempt < TASK_RETRIES else "running it here")
                if attempt < TASK_RETRIES:
                    fut = self._submit(fn, *args)
        self.report.notes.append(f"a {fn.__name__} task ran on the client: it was lost "
                                 f"{TASK_RETRIES + 1} times with its workers")  # fmt: skip
        return fn(*args)

    def _count(self, c: en.Counters) -> None:
        for name in _REPORTED_COUNTERS:
            setattr(self.report, name, getattr(self.report, name) + getattr(c, name))

    # -- block level ---------------------------------------------------------------------
    def _tasks(self, space: SearchSpace, oracle: Any, sites: Sequence[en.Site],
               reuse: dict[str, list[tuple[tuple[int, ...], Any]]] | None = None,
               ) -> list[tuple[en.Site, en.BlockTask]]:  # fmt: skip
        """The block tasks of ``sites`` in priority order; with ``reuse`` (stored skeletons by
        site signature, see ``skeletons``) one replay task per stored skeleton instead."""
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
            site_cost = ranking.site_cost(site)
            structures = en.loop_structures(site.arg_types, space, extents, arg_index)

            def task(fdims, forloop, loop_class, seeds, max_ops=space.max_block_ops,
                     replay=False, site=site, arg_index=arg_index):  # fmt: skip
                return en.BlockTask(
                    site.arg_types, site.arg_terms, fdims, forloop, self.target.output_types,
                    max_ops, cfg.max_states, cfg.prune, priority=0, arg_index=arg_index,
                    out_index=tuple(index.outputs) if index is not None else None,
                    events=index.events if index is not None else frozenset(),
                    loop_class=loop_class, seeds=seeds, shifted_exp=shifted, replay=replay,
                )  # fmt: skip

            if reuse is not None:
                by_fdims = {fdims: (forloop, cls) for fdims, forloop, _, cls in structures}
                for fdims, macro in reuse.get(skeletons.site_signature(site), ()):
                    if fdims in by_fdims:
                        out.append(((site_cost, 0, 0, rank), site,
                                    task(fdims, *by_fdims[fdims], (macro,), len(macro.nodes),
                                         replay=True)))  # fmt: skip
                continue
            seeds = en.target_macros(self.target, site.arg_terms, space.block_ops,
                                     single_leaf=True) if cfg.prune else ()  # fmt: skip
            for fdims, forloop, prio, loop_class in structures:
                for seeded in ((seeds, ()) if seeds else ((),)):
                    order = (site_cost, 0 if seeded else 1, prio, rank)
                    out.append((order, site, task(fdims, forloop, loop_class, seeded)))
        out.sort(key=lambda x: x[0])
        self.report.sites = len(seen)
        return [(s, t) for _, s, t in out]

    def _enumerate_blocks(self, space: SearchSpace, oracle: Any, sites: Sequence[en.Site]
                          ) -> list[tuple[en.Site, en.Skeleton]]:  # fmt: skip
        cfg = self.config
        if cfg.max_graph_defs < 1:
            return []
        key = skeletons.shape_class(self.target, cfg) if cfg.reuse_skeletons else None
        reuse = skeletons.load(key, self.target) if key is not None else None
        tasks = self._tasks(space, oracle, sites, reuse[0] if reuse else None)
        self.report.tasks = len(tasks)
        capped = cfg.max_tasks is not None and cfg.max_tasks < len(tasks)
        if capped:
            tasks = tasks[: cfg.max_tasks]
        start = time.perf_counter()
        results, lost = self._run_tasks([t for _, t in tasks])
        self.report.block_s = time.perf_counter() - start
        # a ``LocalPool`` starts its processes only for a long enumeration
        self.report.workers = getattr(self.executor, "processes", self.workers)
        # the deterministic cut: the tasks whose states, added in task order, reach the
        # total budget (whichever worker finished first); those after it are dropped
        results = results[: _state_cut(results, cfg.max_total_states)]
        found = self._merge(tasks, results)
        self._stop_reason(results, lost, capped)
        if reuse is not None:
            self.report.stop_reason = f"{REUSED} at other shapes ({reuse[1]} there)"
        elif key is not None and not lost:
            skeletons.store(key, self.target, found, self.report.stop_reason)
        log.debug("block enumeration: %d tasks, %d skeletons (%s)", len(tasks), len(found),
                  self.report.stop_reason)  # fmt: skip
        return found

    def _run_tasks(self, tasks: Sequence[en.BlockTask]
                   ) -> tuple[list[en.BlockResult | None], list[int]]:  # fmt: skip
        """Every task's result (None: not sent) and the tasks lost with their workers.

        Tasks are sent in priority order, in chunks (``workers.TaskChunker``), a window at a
        time, until the enumeration's share of the time budget ends or the finished tasks'
        states reach ``max_total_states`` (tasks past either are never sent: sending
        thousands of no-op tasks costs seconds)."""
        cfg = self.config
        deadline = self.start + cfg.time_budget_s * ENUMERATION_SHARE
        budget = cfg.max_total_states
        results: list[en.BlockResult | None] = [None] * len(tasks)
        window = max(2, 4 * self.workers)
        chunker = TaskChunker(self.workers, isinstance(self.executor, InlineExecutor))
        # future -> (its first task's index, its tasks, attempt)
        pending: dict[cf.Future, tuple[int, list[en.BlockTask], int]] = {}
        lost: list[int] = []
        nxt = states = 0
        bar = _progress(cfg, len(tasks), "enumerate")
        try:
            while nxt < len(tasks) or pending:
                while (nxt < len(tasks) and len(pending) < window and time.time() < deadline
                       and (budget is None or states < budget)):  # fmt: skip
                    sent = list(tasks[nxt:nxt + chunker.size(len(tasks) - nxt)])
                    fut = self._submit(block_worker, self.text, cfg, sent, deadline)
                    pending[fut] = (nxt, sent, 0)
                    nxt += len(sent)
                if not pending:
                    break
                done, _ = cf.wait(pending, return_when=cf.FIRST_COMPLETED)
                for fut in done:
                    k, sent, attempt = pending.pop(fut)
                    n = len(sent)
                    try:
                        chunk = fut.result()
                    except LOST as err:
                        self.lost += 1
                        log.warning("block tasks %d-%d were lost (%s)", k, k + n - 1, _why(err))
                        if attempt < TASK_RETRIES and time.time() < deadline:
                            again = self._submit(block_worker, self.text, cfg, sent, deadline)
                            pending[again] = (k, sent, attempt + 1)
                        else:
                            lost.extend(range(k, k + n))
                        continue
                    results[k:k + n] = chunk
                    states += sum(res.counters.states for res in chunk)
                    chunker.observe(chunk)
                    if bar is not None:
                        bar.update(n)
        finally:
            if bar is not None:
                bar.close()
        return results, lost

    def _merge(self, tasks: Sequence[tuple[en.Site, en.BlockTask]],
               results: Sequence[en.BlockResult | None]) -> list[tuple[en.Site, en.Skeleton]]:  # fmt: skip
        """The distinct skeletons of ``results``, in task order (so whichever worker ran a
        task, the merge is the same), with their counters added to the report."""
        found: list[tuple[en.Site, en.Skeleton]] = []
        seen: set[Any] = set()
        for (site, task), res in zip(tasks, results):
            if res is None:  # never sent, or lost
                continue
            self._count(res.counters)
            if res.counters.states:
                self.report.tasks_run += 1
                self.report.tasks_exhausted += not res.counters.truncated
            self.report.tasks_truncated += int(res.counters.truncated)
            for skel in res.skeletons:
                canon = en.canonical_block(skel.block)
                key = (site.prefix.nodes, site.operands, canon.fingerprint())
                if key not in seen:
                    seen.add(key)
                    found.append((site, en.Skeleton(canon, skel.fdims)))
            log.debug("task %s: %s", task.label, res.counters)
        self.report.skeletons = len(found)
        return found

    def _stop_reason(self, results: Sequence[en.BlockResult | None], lost: Sequence[int],
                     capped: bool) -> None:  # fmt: skip
        """Why the enumeration ended: ``EXHAUSTED`` only when every task ran to its end; a
        time budget (host-dependent) is named before the deterministic bounds."""
        r = self.report
        timed_out = any(res is None or res.counters.timed_out for k, res in enumerate(results)
                        if k not in lost)  # fmt: skip
        if lost:
            # never presented as complete: the skeletons of these tasks were not searched
            r.stop_reason = (f"{INCOMPLETE}: {len(lost)} of {r.tasks} block tasks not run "
                             "(lost with their workers)")  # fmt: skip
            r.notes.append(
                f"block tasks not run: {sorted(lost)} (each lost {TASK_RETRIES + 1} times or "
                "after the enumeration deadline); the best μGraph is verified but was chosen "
                "from the tasks that ran - search again to cover them")  # fmt: skip
        elif r.tasks_exhausted == r.tasks:
            r.stop_reason = EXHAUSTED
        elif timed_out:
            r.stop_reason = "time budget"
        elif len(results) < r.tasks and not capped:
            r.stop_reason = "total state budget"
        elif r.tasks_truncated:
            r.stop_reason = "state budget"
        else:
            r.stop_reason = "task budget"

    # -- instantiation and ranking ---------------------------------------------------------
    def _instantiate(self, space: SearchSpace, kernel: en.KernelEnumeration,
                     skeletons: Sequence[tuple[en.Site, en.Skeleton]]) -> list[Candidate]:  # fmt: skip
        cands: list[Candidate] = []
        for graph in kernel.complete:
            est = self.cost.estimate_s(graph)
            cands.append(Candidate(graph, est, "kernel:" + graph.fingerprint()[:16]))
        # rank skeletons by one representative tiling each, then expand the best ones fully
        scored = []
        deadline = self.start + self.config.time_budget_s * RANKING_SHARE
        classes: set[tuple[int, bool]] = set()  # structure classes with a skeleton scored
        late = 0
        for k, (site, skel) in enumerate(skeletons):
            cls = ranking.site_structure(site, skel)
            # past the deadline only a skeleton of a class not yet seen is scored: every
            # class then reaches verification, whatever the host's speed
            if k >= 8 and cls in classes and time.time() > deadline:
                late += 1
                continue
            tilings = en.tilings(skel, space)
            rep = ranking.representative(tilings, space)
            c = self._candidate(site, skel, rep) if rep is not None else None
            if c is not None:
                classes.add(cls)
                scored.append((c.estimate_s, k, site, skel, tilings, c))
        if late:
            self.report.notes.append(f"ranking stopped by the time budget: {late} of "
                                     f"{len(skeletons)} skeletons not scored (their structure "
                                     "classes were)")  # fmt: skip
        scored.sort(key=lambda x: x[:2])
        expand = ranking.round_robin(scored, self.config.max_skeletons_ranked)
        for k, (_, _, site, skel, tilings, rep_c) in enumerate(scored):
            # every scored skeleton keeps its representative whatever the clock says: dropping
            # it could drop the only member of a structure class that verification must see
            if k not in expand:
                cands.append(rep_c)
                continue
            for tiling in tilings:
                c = self._candidate(site, skel, tiling)
                if c is not None:
                    cands.append(c)
        cands.sort(key=ranking.rank_key)
        self.report.candidates = len(cands)
        # the best tiling of every skeleton first, so verification and timing see variety
        firsts, rest, seen = [], [], set()
        for c in cands:
            (rest if c.skeleton in seen else firsts).append(c)
            seen.add(c.skeleton)
        return ranking.diversify(firsts) + rest

    def _candidate(self, site: en.Site, skel: en.Skeleton, tiling: en.Tiling) -> Candidate | None:
        block = en.instantiate(skel, tiling, self.space)
        graph = en.build_kernel(site.prefix, block, site.operands) if block is not None else None
        if graph is None:
            return None
        # a skeleton is a block graph *at a site*: the same block on other operands is another
        key = hashlib.sha1(repr((site.prefix.nodes, site.operands)).encode()).hexdigest()[:8]
        return Candidate(graph, self.cost.estimate_s(graph),
                         key + ":" + skel.block.fingerprint()[:16])  # fmt: skip

    # -- verification ------------------------------------------------------------------------
    def _verify(self, ranked: Sequence[Candidate]) -> list[Candidate]:
        """Check candidates in rank order until ``max_verify`` are verified (and every
        structure class's best is checked) or the work bound ends it. Chunks of them run on
        the workers at once, but their results are taken as if one by one in rank order (a
        candidate whose skeleton an earlier one failed is skipped, even in the same chunk, and
        the bound counts what a one-by-one run would check): the verified set is the same
        with any number of workers. The time budget is the safety net behind the bound."""
        cfg = self.config
        seed = cfg.seed if cfg.float_check else None
        workers = self.workers
        futs = getattr(self, "_digest_futures", None) or []
        digests = [self._collect(f, target_digest_worker, a) for f, a in futs] if futs else None
        deadline = self.start + cfg.time_budget_s * VERIFY_SHARE
        # every structure class's best is verified, beyond max_verify if need be: an exhausted
        # search offers more classes than a truncated one, and the cost model orders classes
        # least reliably; ``diversify`` ranked the best of each class first
        run = _Verification(cfg, len({ranking.structure(c.graph) for c in ranked}))
        bar = _progress(cfg, min(len(ranked), cfg.max_verify), "verify")
        chunk_s = 0.0  # the last chunk's wall time: the next one takes about as long
        try:
            while run.wants_more(len(ranked)):
                ranks = run.next_chunk(ranked, workers, self.cost, self.report)
                if not ranks:  # past the bound, or nothing more wanted
                    break
                # the clock only where the bound would go on: then the host decides
                if run.verified and time.time() + chunk_s > deadline:
                    self.report.notes.append(
                        "verification stopped by the time budget (the next candidates would "
                        f"have taken about {chunk_s:.0f}s more)")  # fmt: skip
                    break
                started = time.time()
                chunk = [c for _, c, _ in ranks]
                groups = [chunk[k::workers] for k in range(workers) if chunk[k::workers]]
                batches = [(self.text, [str(c.graph) for c in grp], self.spec, seed, digests)
                           for grp in groups]  # fmt: skip
                futs = [self._submit(verify_worker, *args) for args in batches]
                results = {id(c): v for grp, fut, args in zip(groups, futs, batches)
                           for c, v in zip(grp, self._collect(fut, verify_worker, args))}  # fmt: skip
                chunk_s = time.time() - started
                for k, c, cost in ranks:
                    before = len(run.verified)
                    if not run.take(k, c, cost, results[id(c)], len(ranked), self.report,
                                    self.target):  # fmt: skip
                        break
                    if bar is not None and len(run.verified) > before:
                        bar.update(1)
        finally:
            if bar is not None:
                bar.close()
        if run.bounded:
            self.report.notes.append(
                f"verification stopped by its work bound (SearchConfig.verify_elements = "
                f"{cfg.verify_elements:,} tensor elements) after {run.checked} candidate(s)")
        self.report.verified = len(run.verified)
        self.report.trials = cfg.trials
        self.report.degree = run.degree
        self.report.false_acceptance_bound = false_acceptance_bound(run.degree, self.spec)
        return run.verified

    # -- timing and the choice ------------------------------------------------------------------
    def _choose(self, verified: list[Candidate]) -> tuple[KernelGraph, list[Candidate]]:
        cfg = self.config
        if not verified:
            return self.target, []
        timer = self.timer
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
        if best is self.original:
            r.best_summary = ""
            r.best_text = str(self.original)
            if not verified:
                r.notes.append("no verified candidate: the target is kept")
            return
        top = verified[0]
        r.best_summary = top.summary()
        r.best_text = str(best)
        r.best_estimate_s = top.estimate_s
        r.best_measured_s = top.measured_s
        log.debug("best: %s", r.best_summary)


class _Verification:
    """The one-by-one semantics of ``Exploration._verify``: which candidates come next, and
    what a checked one's result does (verified, or rejected with its skeleton), until the
    wanted number is verified or the next check would pass the work bound."""

    def __init__(self, config: SearchConfig, classes: int) -> None:
        self.config, self.classes = config, classes
        self.pos = 0  # the rank of the next candidate (those before it checked or skipped)
        self.checked = 0
        self.spent = 0  # tensor elements the checks evaluated
        self.degree = 1
        self.bounded = False
        self.verified: list[Candidate] = []
        self.rejected: set[str] = set()

    def wants_more(self, n: int) -> bool:
        """Whether a one-by-one run at ``pos`` of ``n`` candidates looks at the next."""
        need = len(self.verified) < self.config.max_verify or self.pos < self.classes
        return not self.bounded and self.pos < n and need

    def _over(self, cost: int, spent: int, assume_verified: bool = False) -> bool:
        # as the time budget, the bound stops nothing before a candidate is verified
        bound = self.config.verify_elements
        return (bound is not None and (assume_verified or bool(self.verified))
                and spent + cost > bound)  # fmt: skip

    def next_chunk(self, ranked: Sequence[Candidate], workers: int, cost_model: CostModel,
                   report: SearchReport) -> list[tuple[int, Candidate, int]]:  # fmt: skip
        """The next (rank, candidate, cost) triples to check at once, each candidate fused as
        it will run: as many as are still wanted, one per worker at most, skipping failed
        skeletons, none past the bound."""
        while self.wants_more(len(ranked)) and ranked[self.pos].skeleton in self.rejected:
            report.skipped_rejected_skeleton += 1
            self.pos += 1
        if not self.wants_more(len(ranked)):
            return []
        cfg = self.config
        want = min(workers, max(cfg.max_verify - len(self.verified), self.classes - self.pos))
        chunk: list[tuple[int, Candidate, int]] = []
        spent = self.spent
        for k in range(self.pos, len(ranked)):
            if len(chunk) == want:
                break
            if ranked[k].skeleton in self.rejected:
                continue
            c = _fused(ranked[k], cost_model)
            cost = evaluation_size(c.graph) * (cfg.trials + 1)
            # past the bound, or past it once the chunk's earlier candidates are verified:
            # then it is checked only if they all fail, not worth a worker beside them
            if self._over(cost, spent, assume_verified=bool(chunk)):
                self.bounded = not chunk  # else the chunk's results decide
                break
            spent += cost
            chunk.append((k, c, cost))
        return chunk

    def take(self, k: int, c: Candidate, cost: int, result: tuple[Any, Any], n: int,
             report: SearchReport, target: KernelGraph) -> bool:  # fmt: skip
        """Account the check of ``ranked[k]`` (of ``n``; ``cost``: its tensor elements) as a
        one-by-one run would: False when the verification ends before it."""
        report.skipped_rejected_skeleton += k - self.pos  # skipped while the chunk was chosen
        self.pos = k
        if not self.wants_more(n):
            return False
        if c.skeleton in self.rejected:  # an earlier candidate of its chunk failed
            report.skipped_rejected_skeleton += 1
            self.pos = k + 1
            return True
        if self._over(cost, self.spent):
            self.bounded = True
            return False
        self.pos, self.checked, self.spent = k + 1, self.checked + 1, self.spent + cost
        ff, fl = result
        report.ff_checked += 1
        self.degree = max(self.degree, pair_degree_bound(target, c.graph))
        c = Candidate(c.graph, c.estimate_s, c.skeleton, ff, fl)
        if fl is not None and not fl.ok:
            report.float_rejected += 1
            self.rejected.add(c.skeleton)
            log.debug("float check rejected %s: %s", c.summary(), fl)
        elif not ff.ok:
            report.ff_rejected += 1
            self.rejected.add(c.skeleton)
            log.debug("finite field rejected %s:\n%s", c.summary(), c.graph)
        else:
            self.verified.append(c)
        return True


def _state_cut(results: Sequence[en.BlockResult | None], budget: int | None) -> int:
    """How many tasks, in task order, it takes for their states to reach ``budget`` (all of
    them when it is never reached)."""
    states = 0
    for k, res in enumerate(results):
        states += res.counters.states if res is not None else 0
        if budget is not None and states >= budget:
            return k + 1
    return len(results)


def _why(err: BaseException) -> str:
    return f"{type(err).__name__}: {err}" if str(err) else type(err).__name__


def _fused(c: Candidate, cost: CostModel) -> Candidate:
    """Thread graphs by rule: the candidate with its elementwise chains fused."""
    graph = fuse_kernel(c.graph)
    if graph is c.graph:
        return c
    return Candidate(graph, cost.estimate_s(graph), c.skeleton)


def fuse_kernel(graph: KernelGraph) -> KernelGraph:
    """``graph`` with ``fuse_elementwise`` applied to every block graph."""
    return map_blocks(graph, fuse_elementwise) if graph.nodes_of(Op.GRAPH_DEF) else graph


def _progress(config: SearchConfig, total: int, what: str) -> Any:
    if config.progress is False or total == 0:
        return None
    # deferred: tqdm.auto probes for notebook widgets, a cost only a progress bar pays
    from tqdm.auto import tqdm

    delay = 0.0 if config.progress else 1.0  # None: only for searches longer than a second
    return tqdm(total=total, desc=f"mirage search: {what}", delay=delay, leave=False)


__all__ = [
    "EXHAUSTED", "INCOMPLETE", "REUSED", "Candidate", "CostModel", "Exploration",
    "SearchReport", "SearchResult", "Timer", "explore", "fuse_kernel", "summarize",
    "superoptimize",
]  # fmt: skip
