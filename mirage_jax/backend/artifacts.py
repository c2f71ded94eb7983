"""Compiled artifacts in the store, for every backend: built once, published atomically, and
an error a user can act on when the cache directory cannot take them."""

from __future__ import annotations

import errno
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from mirage_jax.errors import CompileError
from mirage_jax.store import CACHE_ENV, Namespace


def get_or_build(space: Namespace, path: Path, build: Callable[[Path], None],
                 record: Callable[[], Mapping[str, Any]]) -> tuple[Path, bool]:  # fmt: skip
    """``space.get_or_build``, with a cache that cannot be written (read-only, full disk)
    turned into a ``CompileError`` naming the directory and the remedy; the store publishes
    atomically, so nothing half-written is left behind."""
    try:
        return space.get_or_build(path, build, record)
    except OSError as err:
        raise cache_write_error(err, space.directory) from err


def cache_write_error(err: OSError, directory: Path) -> CompileError:
    """The error for a kernel that could not be stored in the cache (read-only, full, ...)."""
    where = f"{err.filename}" if err.filename else str(directory)
    if err.errno == errno.ENOSPC:
        remedy = (f"free space on the disk holding {directory}, or set {CACHE_ENV} to a "
                  "directory on another disk")  # fmt: skip
    else:
        remedy = f"make {directory} writable, or set {CACHE_ENV} to a writable directory"
    return CompileError(f"the kernel cache at {directory} cannot be written: "
                        f"{err.strerror or err} ({where})", remedy=remedy)  # fmt: skip
