"""The frontend: trace a JAX function, inline nested calls, cut it into μGraph regions.

- ``flatten``: nested ``jit`` / ``custom_jvp_call`` / ``custom_vjp_call`` inlined.
- ``rules``: the primitive -> rule table turning equations into kernel-graph nodes.
- ``partition``: maximal contiguous runs of supported equations become ``Region``s; each
  unsupported equation is a ``Cut`` with its reason and the user's source line.
- ``split``: a region too large for one search is cut into pieces at the points a cost model
  prices lowest (dynamic programming over its equation boundaries).
- ``program``: ``trace`` and ``TracedProgram`` (``run`` re-executes with region
  implementations; ``describe`` reports).
"""

from __future__ import annotations

from mirage_jax.frontend.partition import Cut, Region
from mirage_jax.frontend.program import TracedProgram, trace
from mirage_jax.frontend.rules import RULES

__all__ = ["RULES", "Cut", "Region", "TracedProgram", "trace"]
