"""Derivatives of a custom-call region: the kernel computes the values, XLA the derivatives.

An XLA FFI call has no derivative rule, so a region that became a custom call would make
``jax.grad`` raise, and whether it became one depends on a timing. Every kernel is therefore
wrapped in ``jax.custom_jvp`` whose rule differentiates the region as XLA runs it
(``TracedProgram.region_callable``): forward mode (``jvp``, ``jacfwd``) uses the rule as is,
and reverse mode (``grad``, ``vjp``, ``jacrev``) transposes its linear part, which jax can do
because that part consists of XLA's own primitives. The kernel still computes the primal
outputs; the tangent computation recomputes from the primal inputs whatever XLA's
derivative needs (the residuals), which is what ``jax.checkpoint`` would do for the region.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax


def with_derivatives(kernel: Callable[..., tuple[Any, ...]],
                     reference: Callable[..., tuple[Any, ...]]) -> Callable[..., tuple[Any, ...]]:  # fmt: skip
    """``kernel`` (a region's custom call) differentiable like ``reference``, the same region
    as XLA computes it; both take the region's inputs and return its outputs as a tuple."""

    @jax.custom_jvp
    def call(*inputs: Any) -> tuple[Any, ...]:
        return tuple(kernel(*inputs))

    @call.defjvp
    def call_jvp(primals: tuple[Any, ...], tangents: tuple[Any, ...]
                 ) -> tuple[tuple[Any, ...], tuple[Any, ...]]:  # fmt: skip
        _, tangents_out = jax.jvp(reference, primals, tangents)
        return tuple(kernel(*primals)), tuple(tangents_out)

    return call


__all__ = ["with_derivatives"]
