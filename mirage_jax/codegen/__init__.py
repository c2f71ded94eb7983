"""Code generation: μGraph -> C++ (CPU) source, and building it into a loadable library.

``emit_cpu`` is pure Python and needs no compiler; compiling lives in ``codegen.build``.
"""

from __future__ import annotations

from mirage_jax.codegen.cpu import TABLE, Template, emit_cpu

__all__ = ["TABLE", "Template", "emit_cpu"]
