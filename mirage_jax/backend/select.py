"""Which backend compiles a region: the jax device its inputs live on decides.

``platform_for(x)`` takes jax arrays, numpy arrays, ``jax.Device``s or a sequence of them and
returns ``"cuda"`` when they are on NVIDIA GPUs and ``"cpu"`` when they are on the host;
``backend_for(x)`` returns that platform's ``Backend``, ``get_backend(name)`` one by name.
Values that carry no device (numpy arrays, Python scalars, tracers, ``ShapeDtypeStruct``)
follow ``jax.default_backend()``. Mixing CPU and GPU inputs, or inputs on a platform neither
backend serves (TPU, ROCm), raises ``MirageError``: the region then stays with XLA.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Literal

import jax

from mirage_jax.backend.base import Backend
from mirage_jax.backend.cpu.backend import cpu_backend
from mirage_jax.backend.cuda.backend import cuda_backend
from mirage_jax.errors import MirageError

Platform = Literal["cpu", "cuda"]
_BACKENDS = {"cpu": cpu_backend, "cuda": cuda_backend}


def get_backend(name: str) -> Backend:
    """The backend called ``name`` (``"cpu"`` or ``"cuda"``)."""
    if name not in _BACKENDS:
        raise MirageError(f"mirage_jax has no {name!r} backend",
                          remedy=f"use one of {', '.join(_BACKENDS)}")  # fmt: skip
    return _BACKENDS[name]()


def backend_for(arrays_or_devices: Any) -> Backend:
    """The backend for inputs on the given arrays' (or devices') platform."""
    return get_backend(platform_for(arrays_or_devices))


def platform_for(arrays_or_devices: Any) -> Platform:
    """``"cpu"`` or ``"cuda"`` for inputs on the given arrays' (or devices') platform."""
    items = _as_list(arrays_or_devices)
    found: set[str] = set()
    for item in items:
        for device in _devices_of(item):
            found.add(_platform_of(device))
    if not found:
        found.add(_default_platform())
    if len(found) > 1:
        raise MirageError(
            f"the inputs live on different platforms ({', '.join(sorted(found))})",
            remedy="put every input of the optimized function on one device (jax.device_put)",
        )
    platform = found.pop()
    if platform not in ("cpu", "cuda"):
        raise MirageError(
            f"mirage_jax has no backend for the {platform} platform",
            remedy="run on a CPU or an NVIDIA GPU; on other platforms the function runs "
            "unchanged with XLA",
        )
    return platform  # type: ignore[return-value]


def _as_list(x: Any) -> list[Any]:
    if isinstance(x, (list, tuple)):
        return list(x)
    if isinstance(x, Iterable) and not hasattr(x, "shape") and not isinstance(x, (str, bytes)):
        return list(x)
    return [x]


def _devices_of(item: Any) -> list[Any]:
    if isinstance(item, jax.Device) or (hasattr(item, "platform") and hasattr(item, "id")):
        return [item]  # a jax Device (or an object standing in for one)
    if isinstance(item, jax.core.Tracer):
        return []
    devices = getattr(item, "devices", None)
    if callable(devices) and isinstance(item, jax.Array):
        try:
            return list(devices())
        except Exception:  # noqa: BLE001 - deleted or abstract arrays have no devices
            return []
    return []


def _platform_of(device: Any) -> str:
    platform = str(getattr(device, "platform", "")).lower()
    if platform in ("gpu", "cuda"):
        version = str(getattr(getattr(device, "client", None), "platform_version", "")).lower()
        return "rocm" if "rocm" in version else "cuda"
    return platform or "unknown"


def _default_platform() -> str:
    backend = jax.default_backend().lower()
    if backend in ("gpu", "cuda"):
        return _platform_of(jax.devices()[0])
    return backend


__all__ = ["Platform", "backend_for", "get_backend", "platform_for"]
