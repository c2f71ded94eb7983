"""Host emulation of generated CUDA: thread blocks run as host threads, for checking the
emitted code numerically on a machine without a GPU (slow; a test and debugging aid)."""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from typing import Any

import numpy as np

from mirage_jax.backend.cuda.build import build_cuda
from mirage_jax.backend.cuda.emit import emit_cuda
from mirage_jax.errors import RuntimeLoadError
from mirage_jax.ir import KernelGraph
from mirage_jax.runtime.cuda import open_library


def emulate(graph: KernelGraph, inputs: Sequence[Any]) -> list[np.ndarray]:
    """Outputs of ``graph``'s generated CUDA run on emulated thread blocks on the host."""
    types = graph.input_types
    if len(inputs) != len(types):
        raise RuntimeLoadError(f"the graph takes {len(types)} inputs, got {len(inputs)}")
    symbol = "mje_" + graph.fingerprint()[:24]
    lib = open_library(build_cuda(emit_cuda(graph, symbol), kind="emu", name_hint=symbol))
    ins = [np.ascontiguousarray(np.asarray(x, dtype=t.dtype.numpy).reshape(t.shape))
           for x, t in zip(inputs, types)]  # fmt: skip
    outs = [np.empty(t.shape, t.dtype.numpy) for t in graph.output_types]
    in_ptrs = (ctypes.c_void_p * max(1, len(ins)))(*[x.ctypes.data for x in ins])
    out_ptrs = (ctypes.c_void_p * len(outs))(*[y.ctypes.data for y in outs])
    fn = getattr(lib, f"{symbol}_emu")
    fn.restype = ctypes.c_int
    fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    err = fn(in_ptrs, out_ptrs)
    if err != 0:
        raise RuntimeLoadError(f"emulated CUDA kernel {symbol} returned {err}")
    return outs


__all__ = ["emulate"]
