"""``vmap`` of a custom-call region: the batched region is planned as a region of its own.

An FFI call batches only by running once per batch element. Instead, each kernel is wrapped in
``jax.custom_batching.custom_vmap`` whose rule hands the region, as XLA computes it and
vmapped over the batched inputs, to ``optimize`` (the API's ``Optimized``, created once per
pattern of batched inputs): it is traced, searched, verified and timed at the batched shape
like any region, so a batch runs as one custom call where that wins and as XLA's own batched
computation where it does not - never as a loop over the batch.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax


def with_batching(kernel: Callable[..., tuple[Any, ...]],
                  reference: Callable[..., tuple[Any, ...]],
                  optimize: Callable[[Callable[..., Any]], Callable[..., Any]],
                  ) -> Callable[..., tuple[Any, ...]]:  # fmt: skip
    """``kernel`` (a region's custom call) whose ``vmap`` runs ``optimize`` of the vmapped
    ``reference`` (the same region as XLA computes it)."""
    batched: dict[tuple[bool, ...], Callable[..., Any]] = {}

    @jax.custom_batching.custom_vmap
    def call(*inputs: Any) -> tuple[Any, ...]:
        return tuple(kernel(*inputs))

    @call.def_vmap
    def rule(axis_size: int, in_batched: Any, *inputs: Any) -> tuple[tuple[Any, ...], Any]:
        del axis_size  # the inputs carry it
        key = tuple(bool(b) for b in in_batched)
        if key not in batched:
            in_axes = tuple(0 if b else None for b in key)
            batched[key] = optimize(jax.vmap(reference, in_axes=in_axes))
        outs = tuple(batched[key](*inputs))
        return outs, tuple(True for _ in outs)

    return call


__all__ = ["with_batching"]
