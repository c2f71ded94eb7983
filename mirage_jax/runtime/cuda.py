"""Running generated CUDA: XLA FFI registration on GPUs, and host emulation without one.

- ``gpu_available()``: whether jax has a CUDA GPU backend in this process (never raises).
- ``load_cuda_kernel(lib, symbol)``: loads a library built by ``build_cuda(kind="shared")``
  with ctypes and registers its handler ``symbol`` with
  ``jax.ffi.register_ffi_target(name, jax.ffi.pycapsule(fn), platform="CUDA")``. Only done
  when a GPU backend exists: registering for a platform jax cannot run is refused with a
  ``RuntimeLoadError`` that says so.
- ``compile_graph_cuda(graph)``: emit, build (cached), register; returns a jax-traceable
  callable, the CUDA twin of ``lowering.compile_graph``.
- ``emulate(graph, inputs)``: runs the generated CUDA of ``graph`` on emulated thread blocks
  on the host (``build_cuda(kind="emu")``); slow, for checking generated code without a GPU.
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from mirage_jax.errors import RuntimeLoadError
from mirage_jax.ir import KernelGraph

_lock = threading.Lock()
_libs: dict[str, ctypes.CDLL] = {}  # keeps loaded libraries (and their handlers) alive
_registered: dict[str, str] = {}  # target name -> library path


def gpu_available() -> bool:
    """Whether jax sees a CUDA GPU here (False on CPU-only jaxlib, never raises)."""
    try:
        import jax

        devices = jax.devices("gpu")
    except Exception:  # noqa: BLE001 - no GPU backend raises RuntimeError (varies by version)
        return False
    return any("rocm" not in str(getattr(d.client, "platform_version", "")).lower()
               for d in devices)  # fmt: skip


def _load(path: Path) -> ctypes.CDLL:
    key = str(path)
    lib = _libs.get(key)
    if lib is None:
        try:
            lib = ctypes.CDLL(key)
        except OSError as err:
            raise RuntimeLoadError(
                f"cannot load compiled CUDA library {path}: {err}",
                remedy="delete it from the mirage_jax cache (it is rebuilt) and check that the "
                "CUDA runtime libraries are on the loader path",
            ) from err
        _libs[key] = lib
    return lib


def load_cuda_kernel(lib_path: str | Path, symbol: str) -> str:
    """Register handler ``symbol`` of ``lib_path`` for the CUDA platform; return its name.

    Names are content hashes, so loading the same kernel twice is a no-op.
    """
    if not gpu_available():
        raise RuntimeLoadError(
            "no CUDA GPU backend in this process: a CUDA kernel cannot be registered",
            remedy="install jax with the CUDA plugin (pip install 'jax[cuda12]') on a machine "
            "with an NVIDIA GPU, or use the CPU backend",
        )
    import jax

    path = Path(lib_path)
    with _lock:
        if symbol in _registered:
            return symbol
        lib = _load(path)
        try:
            fn = getattr(lib, symbol)
        except AttributeError as err:
            raise RuntimeLoadError(f"{path} has no handler {symbol!r}",
                                   remedy="rebuild it with build_cuda") from err  # fmt: skip
        jax.ffi.register_ffi_target(symbol, jax.ffi.pycapsule(fn), platform="CUDA")
        _registered[symbol] = str(path)
    return symbol


def cuda_kernel_call(name: str, out_avals: Sequence[Any], *args: Any) -> list[Any]:
    """Call a registered CUDA kernel inside jax (``jax.jit``-traceable)."""
    import jax

    call = jax.ffi.ffi_call(name, list(out_avals), vmap_method="sequential")
    return list(call(*args))


def device_arch() -> str:
    """The nvcc arch for this process's first GPU: sm_90a from compute capability 9.0 up
    (H100/H200), sm_80 below (A100)."""
    import jax

    cc = str(getattr(jax.devices("gpu")[0], "compute_capability", "9.0"))
    major = int(cc.split(".")[0]) if cc.split(".")[0].isdigit() else 9
    return "sm_90a" if major >= 9 else "sm_80"


def compile_graph_cuda(graph: KernelGraph, arch: str | None = None) -> Callable[..., Any]:
    """Emit, compile (cached by content) and register ``graph``; return a jax-traceable call.

    ``arch`` defaults to the one of this process's GPU (``device_arch``)."""
    import jax

    from mirage_jax.codegen.cuda import emit_cuda
    from mirage_jax.codegen.cuda_build import build_cuda

    symbol = "mjc_" + graph.fingerprint()[:24]
    arch = arch or device_arch()
    lib = build_cuda(emit_cuda(graph, symbol), arch=arch, kind="shared", name_hint=symbol)
    name = load_cuda_kernel(lib, symbol)
    out_avals = [jax.ShapeDtypeStruct(t.shape, t.dtype.numpy) for t in graph.output_types]

    def call(*args: Any) -> tuple[Any, ...]:
        return tuple(cuda_kernel_call(name, out_avals, *args))

    return call


def emulate(graph: KernelGraph, inputs: Sequence[Any]) -> list[np.ndarray]:
    """Outputs of ``graph``'s generated CUDA run on emulated thread blocks on the host."""
    from mirage_jax.codegen.cuda import emit_cuda
    from mirage_jax.codegen.cuda_build import build_cuda

    types = graph.input_types
    if len(inputs) != len(types):
        raise RuntimeLoadError(f"the graph takes {len(types)} inputs, got {len(inputs)}")
    symbol = "mje_" + graph.fingerprint()[:24]
    lib = _load(build_cuda(emit_cuda(graph, symbol), kind="emu", name_hint=symbol))
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


__all__ = [
    "compile_graph_cuda", "cuda_kernel_call", "device_arch", "emulate", "gpu_available",
    "load_cuda_kernel",
]  # fmt: skip
