"""The user-facing API: ``optimize``/``explain`` and kernel-library ``precompile``.

The top of the pipeline: it traces (``frontend``), hands each region to the ``planner`` and
stages the result into one jitted program.
"""

from __future__ import annotations

from mirage_jax.api.optimized import Optimized, OptimizeOptions, explain, optimize
from mirage_jax.api.libraries import precompile, write_library

__all__ = ["OptimizeOptions", "Optimized", "explain", "optimize", "precompile", "write_library"]
