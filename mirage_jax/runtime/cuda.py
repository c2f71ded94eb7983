"""Running built CUDA libraries: XLA FFI registration of their handlers on GPUs.

- ``gpu_available()``: whether jax has a CUDA GPU backend in this process (never raises).
- ``load_cuda_kernel(lib, symbol)``: loads a library built by ``build_cuda(kind="shared")``
  with ctypes and registers its handler ``symbol`` with
  ``jax.ffi.register_ffi_target(name, jax.ffi.pycapsule(fn), platform="CUDA")``. Only done
  when a GPU backend exists: registering for a platform jax cannot run is refused with a
  ``RuntimeLoadError`` that says so.
- ``open_library(path)``: a ctypes handle on a built library, kept open for the process
  (the host emulation in ``backend.cuda.emulate`` calls its entry points directly).
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import jax

from mirage_jax.errors import RuntimeLoadError
from mirage_jax.runtime.loader import check_shared_object

_lock = threading.Lock()
_libs: dict[str, ctypes.CDLL] = {}  # keeps loaded libraries (and their handlers) alive
_registered: dict[str, str] = {}  # target name -> library path


def gpu_available() -> bool:
    """Whether jax sees a CUDA GPU here (False on CPU-only jaxlib, never raises)."""
    try:
        devices = jax.devices("gpu")
    except Exception:  # noqa: BLE001 - no GPU backend raises RuntimeError (varies by version)
        return False
    return any("rocm" not in str(getattr(d.client, "platform_version", "")).lower()
               for d in devices)  # fmt: skip


def open_library(path: Path) -> ctypes.CDLL:
    key = str(path)
    lib = _libs.get(key)
    if lib is None:
        check_shared_object(path)
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
    path = Path(lib_path)
    with _lock:
        if symbol in _registered:
            return symbol
        lib = open_library(path)
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
    call = jax.ffi.ffi_call(name, list(out_avals), vmap_method="sequential")
    return list(call(*args))


def device_arch() -> str:
    """The nvcc arch for this process's first GPU: sm_90a from compute capability 9.0 up
    (H100/H200), sm_80 below (A100)."""
    cc = str(getattr(jax.devices("gpu")[0], "compute_capability", "9.0"))
    major = int(cc.split(".")[0]) if cc.split(".")[0].isdigit() else 9
    return "sm_90a" if major >= 9 else "sm_80"


__all__ = [
    "cuda_kernel_call", "device_arch", "gpu_available", "load_cuda_kernel", "open_library",
]  # fmt: skip
