"""Loading compiled kernel libraries and calling their kernels from JAX.

A generated kernel is a plain C function with the ABI of ``csrc/runtime/cpu/abi.h``.
``load_kernel`` opens its library and registers the function under a content-derived name in
the native registry; ``kernel_call`` emits an XLA FFI custom call to the one generic dispatcher
(``mirage_jax_dispatch``) carrying that name, so it works inside ``jax.jit`` and the HLO never
holds a process-specific address. The native module ``_C`` is imported on first use only.
"""

from __future__ import annotations

from mirage_jax.runtime.ffi import DISPATCH_TARGET, ensure_dispatcher_registered, kernel_call
from mirage_jax.runtime.loader import kernel_name, load_kernel

__all__ = [
    "DISPATCH_TARGET",
    "ensure_dispatcher_registered",
    "kernel_call",
    "kernel_name",
    "load_kernel",
]
