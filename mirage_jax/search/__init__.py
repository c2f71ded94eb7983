"""The superoptimizer: μGraph enumeration, abstract-expression pruning, probabilistic
equivalence, a CPU cost model, and the runner that ties them together.

``superoptimize(kernel_graph, config) -> SearchResult`` is the entry point (``runner``);
``SearchConfig`` (``mirage_jax.config``) bounds the search. Importing this package loads
neither egglog nor a compiler: they are imported when a search runs.
"""

from __future__ import annotations

from mirage_jax.config import SearchConfig
from mirage_jax.search.runner import (
    Candidate,
    InlineExecutor,
    SearchReport,
    SearchResult,
    Timer,
    compiled_timer,
    summarize,
    superoptimize,
)

__all__ = [
    "Candidate", "InlineExecutor", "SearchConfig", "SearchReport", "SearchResult", "Timer",
    "compiled_timer", "summarize", "superoptimize",
]  # fmt: skip
