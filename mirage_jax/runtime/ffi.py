"""The XLA side: registering the generic dispatcher and emitting calls to it."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import jax

from mirage_jax.errors import RuntimeLoadError
from mirage_jax.runtime.native import native

DISPATCH_TARGET = "mirage_jax_dispatch"

_registered = False
_lock = threading.Lock()


def ensure_dispatcher_registered() -> None:
    """Register the native dispatcher as the CPU FFI target ``mirage_jax_dispatch``, once."""
    global _registered
    if _registered:
        return
    with _lock:
        if not _registered:
            jax.ffi.register_ffi_target(
                DISPATCH_TARGET, native().dispatch_capsule(), platform="cpu"
            )
            _registered = True


def kernel_call(
    kernel_name: str,
    out_avals: Sequence[jax.ShapeDtypeStruct],
    *args: Any,
    check_loaded: bool = True,
) -> tuple[jax.Array, ...]:
    """Call the registered kernel ``kernel_name`` on ``args``; one array per ``out_avals``.

    Works eagerly and inside ``jax.jit``. Kernels are generated for fixed shapes, so ``vmap``
    of this call alone runs it once per batch element (``vmap_method="sequential"``); the
    planner's regions batch by planning the batched region instead (``planner.batching``). Inputs are passed
    as dense row-major buffers. ``check_loaded`` fails at trace time when the name is not
    registered in this process, rather than when the program runs.
    """
    ensure_dispatcher_registered()
    if check_loaded and not native().has_kernel(kernel_name):
        raise RuntimeLoadError(
            f"kernel {kernel_name!r} is not registered in this process",
            remedy="load its library first with mirage_jax.runtime.load_kernel(lib, symbol)",
        )
    avals = tuple(jax.ShapeDtypeStruct(a.shape, a.dtype) for a in out_avals)
    call = jax.ffi.ffi_call(DISPATCH_TARGET, avals, vmap_method="sequential")
    return tuple(call(*args, kernel=kernel_name))
