"""Backends: a μGraph becomes code for one target (C++ for the CPU, CUDA for NVIDIA GPUs).

A ``Backend`` (``base``) emits, builds, loads and calls kernels, and carries its cost model
and candidate timer; ``backend_for(inputs)`` picks one from the device the inputs live on.
``work`` analyses a μGraph into bytes, flops and iterations for every backend's cost model.
Importing a backend needs no compiler: building happens on first use.
"""

from __future__ import annotations

from mirage_jax.backend.base import Backend, CostModel, KernelCall
from mirage_jax.backend.select import Platform, backend_for, get_backend, platform_for

__all__ = [
    "Backend", "CostModel", "KernelCall", "Platform", "backend_for", "get_backend", "platform_for",
]  # fmt: skip
