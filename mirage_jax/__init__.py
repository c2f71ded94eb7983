"""mirage_jax: the Mirage multi-level tensor superoptimizer for JAX.

Importing this package needs neither a compiler nor CUDA: native code is built lazily.
"""

from __future__ import annotations

__version__ = "0.1.0"

from mirage_jax import ir
from mirage_jax.api import Optimized, explain, optimize
from mirage_jax.config import SearchConfig
from mirage_jax.errors import MirageError
from mirage_jax.frontend import Cut, Region, TracedProgram, trace
from mirage_jax.library import load_library, precompile


def __getattr__(name: str):
    # the search (and egglog behind it) loads on first use, not on import
    if name in ("superoptimize", "SearchResult", "SearchReport"):
        from mirage_jax import search

        return getattr(search, name)
    raise AttributeError(f"module 'mirage_jax' has no attribute {name!r}")


__all__ = [
    "Cut", "MirageError", "Optimized", "Region", "SearchConfig", "SearchReport", "SearchResult",
    "TracedProgram", "__version__", "explain", "ir", "load_library", "optimize", "precompile",
    "superoptimize", "trace",
]  # fmt: skip
