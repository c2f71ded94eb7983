"""Plan one region: pick a μGraph, compile it, verify it against XLA, time it, keep or fall back.

A region becomes a custom call only when every step succeeds: the μGraph was found (or taken
as is), it compiled on the region's backend, its outputs match XLA's on fresh random inputs,
and, unless the user opted out, it ran faster than XLA's fusion of the same region in this
process: as programs of their own when the region is the whole program, else a call of each
inside a loop over copies of its inputs as large as the program's working set (a piece of a
program timed as a program pays a program call, more for XLA's than for a custom call's, and
finds its weights in a cache the program would have evicted: ``timing.compare_in_loop``).
Every other outcome keeps the region with XLA and records the reason for ``explain``.
Decisions are reused from a loaded kernel library or the on-disk cache.
"""

from __future__ import annotations

import concurrent.futures as cf
import dataclasses
import functools
import logging
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jax
import numpy as np

from mirage_jax.backend import Backend
from mirage_jax.errors import MirageError
from mirage_jax.frontend.partition import pass_label
from mirage_jax.interpret import evaluate
from mirage_jax.interpret.numerics import as_accurate_error, dtype_name, output_error
from mirage_jax.ir import KernelGraph, Op
from mirage_jax.planner import library
from mirage_jax.planner.cluster import as_executor
from mirage_jax.planner.decisions import Decision, decision_key, load, store
from mirage_jax.planner.search import candidate_timer, choose_on, explore_on, superoptimize
from mirage_jax.search.config import SearchConfig
from mirage_jax.search.runner import INCOMPLETE
from mirage_jax.search.workers import default_executor
from mirage_jax.timing import compare, compare_in_loop, device_args

log = logging.getLogger("mirage_jax")


@dataclass
class RegionPlan:
    """The fate of one region: a custom call (``impl``) or XLA, and why."""

    index: int
    target: KernelGraph
    backward: bool = False  # the region holds a reverse-mode derivative's equations
    forward: bool = True  # and other equations
    graph: KernelGraph | None = None
    impl: Callable[..., Any] | None = None
    reason: str = ""
    mirage_s: float | None = None
    xla_s: float | None = None
    search_report: Any = None
    key: str = ""
    source: str = "search"  # where the decision came from: search, cache or library
    same_as: int | None = None  # an identical region planned before this one
    search: str = ""  # how far its search got (``SearchReport.coverage_text``)
    in_a_loop: bool = False  # timed per call in a loop (a piece of a program), not alone

    @property
    def speedup(self) -> float | None:
        if self.mirage_s and self.xla_s:
            return self.xla_s / self.mirage_s
        return None

    def describe(self) -> str:
        where = "mirage custom call" if self.impl is not None else "XLA"
        head = f"region {self.index}{pass_label(self.forward, self.backward)}: {where}"
        if self.same_as is not None:
            return f"{head} - same as region {self.same_as}"
        if self.speedup is not None:
            against = "XLA, per call in a loop" if self.in_a_loop else "jax.jit"
            head += f" ({self.speedup:.2f}x vs {against}: {_us(self.mirage_s)} vs "
            head += f"{_us(self.xla_s)})"
        if self.reason:
            head += f" - {self.reason}"
        if self.search:
            head += f"; search {self.search}"
        if self.source != "search":
            head += f" [from {self.source}]"
        return head


def _us(seconds: float) -> str:
    """Microseconds to two or three significant digits: a decode region in a loop takes
    fractions of one."""
    us = seconds * 1e6
    return f"{us:.0f} us" if us >= 100 else f"{us:.3g} us"


# A region replaces XLA only when it is this much faster: timings on small shared machines
# scatter by a few percent, and a tie is not worth a custom call.
WIN_MARGIN = 1.05
# A win by less than this is measured once more and judged by the less favourable of the two
# comparisons: two programs that tie scatter by +-5% per comparison on these hosts, and a tie
# kept on one comparison (lora bs=8, 1.06x at plan time) measured 0.98x minutes later.
CLOSE_CALL = 1.15


def plan_regions(program: Any, options: Any, backend: Backend) -> tuple[RegionPlan, ...]:
    """The fate of every region of ``program``. Regions with the same decision key (same
    canonical text, shapes and dtypes, as the repeated layers of a model give) are planned
    once: the others take the first one's kernel and say "same as region N". With an executor
    in ``options`` (e.g. a Dask cluster) the searches of all distinct regions that need one
    run at once, each spreading its tasks over the executor; then, once the cluster is quiet,
    each region's candidates are timed, compiled and checked against XLA one after another in
    this process. Without one, the regions are searched one after another on one process
    pool for the whole plan."""
    keys = {r.index: _region_key(program, r, options, backend) for r in program.regions}
    distinct = {key: index for index, key in reversed(keys.items()) if key is not None}
    todo = [r for r in program.regions if r.index in distinct.values()]
    if options.executor is not None and options.strategy == "search":
        explored = _explore_all(todo, keys, options, backend)
        return _plan_all(program, keys, options, backend, explored)
    if options.strategy != "search" or len(todo) < 2:
        return _plan_all(program, keys, options, backend, {})
    # the searches, one after another, share one pool: its processes (if it needs any) start,
    # import and keep their per-search caches once per plan rather than once per region
    pool = default_executor((options.config or SearchConfig()).workers)
    try:
        return _plan_all(program, keys, dataclasses.replace(options, executor=pool), backend, {})
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def _plan_all(program: Any, keys: dict[int, str | None], options: Any, backend: Backend,
              found: dict[int, cf.Future]) -> tuple[RegionPlan, ...]:  # fmt: skip
    first: dict[str, RegionPlan] = {}
    plans = []
    for region in program.regions:
        key = keys[region.index]
        if key in first:
            plans.append(_same_as(region, first[key]))
            continue
        plan = plan_region(program, region, options, backend, found.get(region.index))
        if key is not None:
            first[key] = plan
        plans.append(plan)
    return tuple(plans)


def _region_key(program: Any, region: Any, options: Any, backend: Backend) -> str | None:
    """The decision key of a region that gets planned (None for one that stays with XLA
    without a plan)."""
    if options.strategy == "xla" or not _has_compute(region.graph):
        return None
    return decision_key(region.graph, **_decision_context(program, options, backend))


def _same_as(region: Any, first: RegionPlan) -> RegionPlan:
    """``region``'s plan taken from the identical region ``first`` planned before it."""
    return RegionPlan(region.index, region.graph, region.backward, region.forward,
                      graph=first.graph, impl=first.impl, reason=first.reason,
                      mirage_s=first.mirage_s, xla_s=first.xla_s, key=first.key,
                      source=first.source, same_as=first.index, search=first.search,
                      in_a_loop=first.in_a_loop)  # fmt: skip


def _explore_all(regions: list[Any], keys: dict[int, str | None], options: Any,
                 backend: Backend) -> dict[int, cf.Future]:  # fmt: skip
    todo = [r for r in regions if _needs_search(keys[r.index], options)]
    if not todo:
        return {}
    executor = as_executor(options.executor)
    cost = backend.cost_model()  # once: the first call may calibrate the host
    with cf.ThreadPoolExecutor(len(todo), thread_name_prefix="mirage-region") as pool:
        found = {r.index: pool.submit(explore_on, r.graph, options.config, backend, executor,
                                      cost) for r in todo}  # fmt: skip
        cf.wait(found.values())
    return found


def _needs_search(key: str | None, options: Any) -> bool:
    if key is None:
        return False
    return library.lookup(key) is None and not (options.cache and load(key) is not None)


def plan_region(program: Any, region: Any, options: Any, backend: Backend,
                explored: cf.Future | None = None) -> RegionPlan:  # fmt: skip
    """The fate of ``region`` of ``program`` on ``backend`` under ``options`` (the api's
    ``OptimizeOptions``); ``explored``: its search, already run up to the timing stage."""
    plan = RegionPlan(region.index, region.graph, region.backward, region.forward)
    if options.strategy == "xla":
        plan.reason = "strategy 'xla' keeps every region with XLA"
        return plan
    if not _has_compute(region.graph):
        plan.reason = "no compute ops"
        return plan
    plan.key = decision_key(region.graph, **_decision_context(program, options, backend))
    plan.in_a_loop = _piece(program)
    try:
        if not _reuse(plan, options, backend):
            _decide(plan, program, region, options, backend, explored)
            # a search that lost tasks with its workers is not the search the key names
            if options.cache and not _incomplete(plan.search_report):
                store(plan.key, Decision(plan.graph if plan.impl else None, plan.reason,
                                         plan.mirage_s, plan.xla_s,
                                         {"search": plan.search}))  # fmt: skip
    except Exception as err:
        _reraise_interruption(err)
        _fall_back(plan, region, err)
    return plan


def _fall_back(plan: RegionPlan, region: Any, err: Exception) -> None:
    """``plan`` stays with XLA after ``err``, with the reason for explain and the log."""
    if isinstance(err, MirageError):
        plan.impl = None
        # the remedy too: explain and the log are where a user learns what to do about it
        remedy = f" (remedy: {err.remedy})" if err.remedy else ""
        plan.reason = f"fell back to XLA: {err.cause}{remedy}"
        log.warning("region %d: %s", region.index, plan.reason)
        return
    # our bug (or a library's) must cost one region, not the program
    plan.impl = None
    where = traceback.extract_tb(err.__traceback__)[-1]
    error = f"{type(err).__name__}: {err}, at {Path(where.filename).name}:{where.lineno}"
    plan.reason = f"fell back to XLA: internal error ({error}); {_BUG_REMEDY}"
    log.warning("region %d: %s", region.index, plan.reason,
                exc_info=log.isEnabledFor(logging.DEBUG))


def _reraise_interruption(err: BaseException) -> None:
    """Raise the Ctrl-C (or exit) that ``err`` was raised while handling, if any: cleaning up
    after an interrupt can fail in turn (a process pool whose start was interrupted raises
    "cannot join thread before it is started" on shutdown), and that error must not turn the
    user's Ctrl-C into a region that quietly fell back while the program ran on."""
    seen: set[int] = set()
    cause: BaseException | None = err
    while cause is not None and id(cause) not in seen:
        if isinstance(cause, (KeyboardInterrupt, SystemExit)):
            raise cause
        seen.add(id(cause))
        cause = cause.__cause__ or cause.__context__


def _decision_context(program: Any, options: Any, backend: Backend) -> dict[str, Any]:
    return {**backend.cache_facts(), "strategy": options.strategy,
            "config": repr(options.config), "require_speedup": options.require_speedup,
            "numpy": np.__version__, "in_a_loop": _piece(program)}  # fmt: skip


def _working_set(program: Any) -> int:
    """Bytes one call of ``program`` reads and writes at least: its arguments, constants and
    results (its weights among them)."""
    jaxpr = program.jaxpr.jaxpr
    avals = [v.aval for v in (*jaxpr.invars, *jaxpr.constvars, *jaxpr.outvars)
             if hasattr(v, "aval")]  # fmt: skip
    return sum(int(np.prod(a.shape)) * np.dtype(a.dtype).itemsize for a in avals)


def _piece(program: Any) -> bool:
    """Whether the program's regions are pieces of it (cut apart or split), timed as they run
    inside it (``timing.compare_in_loop``) rather than as programs of their own."""
    return len(program.regions) > 1 or bool(program.cuts)


def _reuse(plan: RegionPlan, options: Any, backend: Backend) -> bool:
    """Take the decision from a loaded kernel library or the on-disk cache: no search."""
    entry = library.lookup(plan.key)
    decision = entry.decision if entry else (load(plan.key) if options.cache else None)
    if decision is None:
        return False
    plan.graph, plan.mirage_s, plan.xla_s = decision.graph, decision.mirage_s, decision.xla_s
    plan.source = "library" if entry else "cache"
    plan.reason = decision.reason
    plan.search = decision.summary.get("search", "")
    if decision.graph is not None:
        kernel = entry.kernel if entry and entry.kernel else None
        plan.impl = kernel or backend.compile(decision.graph)
    return True


def _decide(plan: RegionPlan, program: Any, region: Any, options: Any, backend: Backend,
            explored: cf.Future | None = None) -> None:  # fmt: skip
    working_set = _working_set(program) if plan.in_a_loop else 0
    plan.graph, plan.search_report = _choose_graph(region.graph, options, backend, explored,
                                                   working_set)  # fmt: skip
    if plan.search_report is not None:
        plan.search = plan.search_report.coverage_text()
    impl = backend.compile(plan.graph)
    xla = program.region_callable(region.index)
    # on the device: timing numpy arguments would time the host-to-device copy
    args = device_args(region.sample_inputs(seed=region.index))
    if options.verify:
        _verify(impl, xla, region.graph, args)
    # Timed even when speed is not required, so explain can report the ratio.
    plan.mirage_s, plan.xla_s = _compare(impl, xla, args, confirm=options.require_speedup,
                                         in_a_loop=plan.in_a_loop,
                                         working_set=working_set)  # fmt: skip
    if options.require_speedup and plan.mirage_s * WIN_MARGIN >= plan.xla_s:
        ratio = plan.xla_s / plan.mirage_s
        plan.reason = (f"slower than XLA ({ratio:.2f}x), kept with XLA" if ratio < 1 else
                       f"not clearly faster than XLA ({ratio:.2f}x < {WIN_MARGIN:.2f}x), "
                       "kept with XLA")  # fmt: skip
        return
    plan.impl = impl


def _compare(impl: Callable[..., Any], xla: Callable[..., Any], args: Sequence[Any],
             confirm: bool, in_a_loop: bool, working_set: int) -> tuple[float, float]:  # fmt: skip
    """(mirage, xla) seconds, confirmed (``confirmed``) when ``confirm``: of a call each
    inside a loop for a piece of a program (touching ``working_set`` bytes an iteration, as
    the program does), else of the programs."""
    if in_a_loop:
        measure = functools.partial(compare_in_loop, impl, xla, args,
                                    working_set_bytes=working_set)  # fmt: skip
    else:
        measure = functools.partial(compare, jax.jit(impl), jax.jit(xla), args)
    return confirmed(measure) if confirm else measure()


def confirmed(measure: Callable[[], tuple[float, float]]) -> tuple[float, float]:
    """(mirage, xla) seconds from ``measure``; a close win (see CLOSE_CALL) is measured again
    and the less favourable reading is the one returned."""
    first = measure()
    if not WIN_MARGIN <= first[1] / first[0] < CLOSE_CALL:
        return first
    return min(first, measure(), key=lambda t: t[1] / t[0])


def _has_compute(graph: KernelGraph) -> bool:
    # slices alone are copies XLA folds into their readers: not worth a call of their own
    return any(n.op not in (Op.INPUT, Op.OUTPUT, Op.RESHAPE, Op.CAST, Op.SLICE)
               for n in graph.nodes)  # fmt: skip


def _choose_graph(target: KernelGraph, options: Any, backend: Backend,
                  explored: cf.Future | None, working_set: int
                  ) -> tuple[KernelGraph, Any]:  # fmt: skip
    """The searched graph and its report; candidates are timed on inputs taken in turns from
    copies as large as ``working_set`` (0: the same inputs every call)."""
    if options.strategy == "as_is":
        return target, None
    if explored is not None:
        result = choose_on(explored.result(), options.config, backend, working_set)
    else:
        config = options.config or SearchConfig()
        result = superoptimize(target, config, backend=backend, executor=options.executor,
                               timer=candidate_timer(config, backend, working_set))  # fmt: skip
    return result.best, result.report


def _incomplete(report: Any) -> bool:
    return report is not None and report.stop_reason.startswith(INCOMPLETE)


_BUG_REMEDY = ("this is a mirage_jax bug; the region stays with XLA. Please report it with "
               "mirage_jax.explain output")


def _verify(impl: Callable[..., Any], xla: Callable[..., Any], graph: KernelGraph,
            args: Sequence[Any]) -> None:  # fmt: skip
    """The compiled region against XLA on ``args``: each output within the float tolerance
    of XLA's, or else as accurate as XLA's against ``graph`` (the region) in float64. Half
    precision rounds intermediates where each implementation writes them, and a backward
    pass may cancel: two answers can differ by more than either differs from the truth."""
    got = jax.jit(impl)(*args)
    want = jax.jit(xla)(*args)
    truth: list[np.ndarray] | None = None
    if len(got) != len(want):
        raise MirageError(f"compiled region returns {len(got)} outputs, which differs from "
                          f"XLA's {len(want)}", remedy=_BUG_REMEDY)  # fmt: skip
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        if np.shape(g) != np.shape(w):
            raise MirageError(f"compiled region output {i} differs from XLA in shape: "
                              f"{np.shape(g)} against {np.shape(w)}", remedy=_BUG_REMEDY)
        err, tol, _ = output_error(g, w, dtype_name(w))
        if np.isfinite(err) and err <= tol:
            continue
        if truth is None:
            truth = evaluate(graph, [np.asarray(a) for a in args], precision="float64")
        off, allowed = as_accurate_error(g, w, truth[i], dtype_name(w), relative=True)
        if not off <= allowed:
            raise MirageError(f"compiled region output {i} differs from XLA by {err:.3g} "
                              f"(tolerance {tol:.3g}) and from the float64 result by "
                              f"{off:.3g}, more than XLA does (allowed {allowed:.3g})",
                              remedy=_BUG_REMEDY)  # fmt: skip
