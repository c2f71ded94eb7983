"""Running the search for one backend: its cost model ranks, its timer times.

``superoptimize`` is the search as users call it (``mirage_jax.superoptimize``): the search
itself (``mirage_jax.search``) knows no backend and is handed both.
"""

from __future__ import annotations

import concurrent.futures as cf
from collections.abc import Callable

from mirage_jax.backend import Backend, get_backend
from mirage_jax.backend.select import platform_for
from mirage_jax.ir import KernelGraph
from mirage_jax.search import SearchConfig, SearchResult, Timer
from mirage_jax.search import superoptimize as run_search


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
    ``baseline``: see ``mirage_jax.search.superoptimize``.
    """
    config = config or SearchConfig()
    backend = backend or get_backend(platform_for(()))
    if timer is None and config.time_candidates:
        timer = backend.timer()
    return run_search(kernel_graph, config, cost_model=backend.cost_model(), executor=executor,
                      timer=timer, baseline=baseline)  # fmt: skip


__all__ = ["superoptimize"]
