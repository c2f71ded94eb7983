"""mirage_jax: the Mirage multi-level tensor superoptimizer for JAX.

Importing this package needs neither a compiler nor CUDA: native code is built lazily.
"""

from __future__ import annotations

from mirage_jax import ir
from mirage_jax.errors import MirageError

__version__ = "0.1.0"

__all__ = ["MirageError", "__version__", "ir"]
