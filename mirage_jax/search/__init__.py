"""The superoptimizer: μGraph enumeration, abstract-expression pruning, probabilistic
equivalence, and the runner that ties them together. It ranks with the cost model and times
with the timer it is given (a backend's): it never compiles code itself.

``superoptimize(kernel_graph, config, cost_model=...) -> SearchResult`` is the entry point
(``runner``; ``report`` holds what it returns, ``workers`` the tasks it farms out, ``ranking``
the order it verifies and times in, ``skeletons`` the shape-generic cache it may replay);
``SearchConfig`` (``mirage_jax.search.config``) bounds the search. Importing this package loads
neither egglog nor a compiler: they are imported when a search runs.
"""

from __future__ import annotations

from mirage_jax.search.config import SearchConfig
from mirage_jax.search.report import Candidate, SearchReport, SearchResult, summarize
from mirage_jax.search.runner import CostModel, Timer, superoptimize
from mirage_jax.search.workers import InlineExecutor

__all__ = [
    "Candidate", "CostModel", "InlineExecutor", "SearchConfig", "SearchReport", "SearchResult",
    "Timer", "summarize", "superoptimize",
]  # fmt: skip
