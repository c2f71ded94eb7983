"""mirage_jax: the Mirage multi-level tensor superoptimizer for JAX.

Importing this package needs neither a compiler nor CUDA: native code is built lazily.
"""

from __future__ import annotations

__version__ = "0.1.0"

from mirage_jax import ir
from mirage_jax.api import Optimized, explain, optimize
from mirage_jax.errors import MirageError
from mirage_jax.frontend import Cut, Region, TracedProgram, trace
from mirage_jax.library import load_library, precompile

__all__ = [
    "Cut", "MirageError", "Optimized", "Region", "TracedProgram", "__version__", "explain",
    "ir", "load_library", "optimize", "precompile", "trace",
]  # fmt: skip
