"""mirage_jax: the Mirage multi-level tensor superoptimizer for JAX.

Importing this package needs neither a compiler nor CUDA: native code is built lazily.
"""

from __future__ import annotations

from mirage_jax import ir
from mirage_jax.api import Optimized, explain, optimize, precompile
from mirage_jax.errors import MirageError
from mirage_jax.frontend import Cut, Region, TracedProgram, trace
from mirage_jax.planner.library import load_library
from mirage_jax.planner.search import superoptimize
from mirage_jax.search import SearchConfig, SearchReport, SearchResult
from mirage_jax.version import __version__


__all__ = [
    "Cut", "MirageError", "Optimized", "Region", "SearchConfig", "SearchReport", "SearchResult",
    "TracedProgram", "__version__", "explain", "ir", "load_library", "optimize", "precompile",
    "superoptimize", "trace",
]  # fmt: skip
