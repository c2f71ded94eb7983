"""Running the search for one backend: its cost model ranks, its timer times.

``superoptimize`` is the search as users call it (``mirage_jax.superoptimize``): the search
itself (``mirage_jax.search``) knows no backend and is handed both.
"""

from __future__ import annotations

import concurrent.futures as cf
from collections.abc import Callable

from mirage_jax.backend import Backend, CostModel, get_backend
from mirage_jax.backend.select import platform_for
from mirage_jax.frontend import TracedProgram
from mirage_jax.frontend.split import SplitPolicy, split_regions
from mirage_jax.ir import KernelGraph
from mirage_jax.planner.cluster import as_executor
from mirage_jax.search import SearchConfig, SearchResult, Timer
from mirage_jax.search import superoptimize as run_search
from mirage_jax.search.runner import Exploration, explore


def superoptimize(
    kernel_graph: KernelGraph,
    config: SearchConfig | None = None,
    *,
    backend: Backend | None = None,
    executor: cf.Executor | None = None,
    timer: Timer | None = None,
    baseline: Callable[[], float] | None = None,
) -> SearchResult:
    """Search for a faster μGraph equivalent to ``kernel_graph`` on ``backend``.

    ``backend``: the target (default: the platform jax places arrays on). Its cost model ranks
    the candidates and, when ``config.time_candidates``, its timer measures the best few
    (``timer`` overrides it; pass ``lambda g: None`` to time nothing). ``executor`` and
    ``baseline``: see ``mirage_jax.search.superoptimize``; ``executor`` may also be a Dask
    ``distributed.Client`` or its ``get_executor()`` (``mirage_jax.planner.cluster``).
    """
    config = config or SearchConfig()
    backend = backend or get_backend(platform_for(()))
    if timer is None:
        timer = candidate_timer(config, backend)
    return run_search(kernel_graph, config, cost_model=backend.cost_model(),
                      executor=as_executor(executor), timer=timer, baseline=baseline)  # fmt: skip


def candidate_timer(config: SearchConfig, backend: Backend, working_set_bytes: int = 0
                    ) -> Timer | None:  # fmt: skip
    """``backend``'s timer when ``config.time_candidates`` (inputs in turns from copies as
    large as ``working_set_bytes``: ``Backend.timer``), else None: the cost model alone picks."""
    if not config.time_candidates:
        return None
    return backend.timer(working_set_bytes=working_set_bytes)


def explore_on(kernel_graph: KernelGraph, config: SearchConfig | None, backend: Backend,
               executor: cf.Executor, cost_model: object = None) -> Exploration:  # fmt: skip
    """The search of ``kernel_graph`` up to its timing stage, on ``executor`` (see
    ``mirage_jax.search.runner.explore``); ``choose_on`` finishes it."""
    return explore(kernel_graph, config or SearchConfig(),
                   cost_model=cost_model or backend.cost_model(), executor=executor)  # fmt: skip


def choose_on(found: Exploration, config: SearchConfig | None, backend: Backend,
              working_set_bytes: int = 0) -> SearchResult:  # fmt: skip
    """The timing stage of an explored search, in this process, with ``backend``'s timer
    (``candidate_timer``)."""
    return found.choose(candidate_timer(config or SearchConfig(), backend, working_set_bytes))


def split_for_search(program: TracedProgram, config: SearchConfig | None, backend: Backend
                     ) -> TracedProgram:  # fmt: skip
    """``program`` with the regions too large for one search split into pieces the search
    covers (``SearchConfig.max_region_ops`` compute ops, ``max_graph_def_inputs`` inputs), cut
    where ``backend``'s cost model prices the pieces lowest."""
    models: list[CostModel] = []  # made when a region needs splitting: it may calibrate

    def kernel_s(nbytes: float, matmul_flops: float, element_ops: float) -> float:
        if not models:
            models.append(backend.cost_model())
        return models[0].fused_s(nbytes, matmul_flops, element_ops)

    config = config or SearchConfig()
    policy = SplitPolicy(config.max_region_ops, config.max_graph_def_inputs, kernel_s)
    return split_regions(program, policy)


__all__ = ["candidate_timer", "choose_on", "explore_on", "split_for_search", "superoptimize"]
