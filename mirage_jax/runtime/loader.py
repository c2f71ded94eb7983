"""Opening compiled libraries and registering their kernels with the native dispatcher."""

from __future__ import annotations

import ctypes
import re
import struct
import threading
from dataclasses import dataclass
from pathlib import Path

from mirage_jax.errors import RuntimeLoadError
from mirage_jax.runtime.native import native


@dataclass(frozen=True)
class CompiledLibrary:
    """A compiled shared library: where it is, and the content key it is cached under."""

    path: Path
    key: str


# Opened libraries stay referenced for the life of the process: XLA programs may call their
# kernels at any time, so they must never be unloaded.
_libraries: dict[Path, ctypes.CDLL] = {}
_loaded: dict[tuple[str, str], str] = {}
_lock = threading.Lock()
_SYMBOL = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
# 128 bits of the content key keep names unique and the HLO readable.
_KEY_CHARS = 32


def kernel_name(key: str, symbol: str) -> str:
    """The registry name of ``symbol`` in the library with content key ``key``.

    It depends only on content, so the same kernel has the same name in every process, which
    keeps HLO (and any persistent compilation cache keyed on it) stable.
    """
    return f"mj_{key[:_KEY_CHARS]}_{symbol}"


def load_kernel(lib: CompiledLibrary, symbol: str) -> str:
    """Open ``lib``, register its function ``symbol`` with the dispatcher, return its name.

    Idempotent: loading the same kernel again returns the same name without reopening.
    """
    if not _SYMBOL.match(symbol):
        raise RuntimeLoadError(
            f"{symbol!r} is not a C symbol name", remedy='pass the kernel\'s extern "C" name'
        )
    name = kernel_name(lib.key, symbol)
    with _lock:
        if (lib.key, symbol) in _loaded:
            return _loaded[(lib.key, symbol)]
        address = _symbol_address(_open(lib.path), lib.path, symbol)
        native().register_kernel(name, address)
        _loaded[(lib.key, symbol)] = name
    return name


def check_shared_object(path: Path) -> None:
    """Refuse a 64-bit ELF file whose loadable segments end past the end of the file.

    The dynamic loader maps such a file (a truncated copy, an interrupted download) without
    complaint, and the process dies of SIGBUS at the first touch of a missing page; this turns
    that into an error. Files that are not little-endian ELF64 are left to the loader."""
    try:
        with open(path, "rb") as f:
            data = f.read(1 << 16)
        size = path.stat().st_size
    except OSError as exc:
        raise RuntimeLoadError(f"cannot read the kernel library {path}: {exc}",
                               remedy=_REBUILD) from exc  # fmt: skip
    if len(data) < 64 or data[:6] != b"\x7fELF\x02\x01":
        return
    phoff, = struct.unpack_from("<Q", data, 0x20)
    shoff, = struct.unpack_from("<Q", data, 0x28)
    phentsize, phnum, shentsize, shnum = struct.unpack_from("<4H", data, 0x36)
    end = max(phoff + phentsize * phnum, shoff + shentsize * shnum)
    for i in range(phnum):
        at = phoff + i * phentsize
        if at + 40 > len(data):
            break
        p_type, = struct.unpack_from("<I", data, at)
        p_offset, = struct.unpack_from("<Q", data, at + 8)
        p_filesz, = struct.unpack_from("<Q", data, at + 32)
        if p_type == 1:  # PT_LOAD
            end = max(end, p_offset + p_filesz)
    if end > size:
        raise RuntimeLoadError(
            f"the kernel library {path} is truncated: {size} bytes where its ELF headers "
            f"need {end}", remedy=_REBUILD)  # fmt: skip


_REBUILD = ("delete it so it is rebuilt (it may be truncated or built for another machine), "
            "or clear the cache directory ($MIRAGE_JAX_CACHE_DIR)")


def _open(path: Path) -> ctypes.CDLL:
    lib = _libraries.get(path)
    if lib is None:
        check_shared_object(path)
        try:
            lib = ctypes.CDLL(str(path))
        except OSError as exc:
            raise RuntimeLoadError(
                f"could not load the kernel library {path}: {exc}", remedy=_REBUILD
            ) from exc
        _libraries[path] = lib
    return lib


def _symbol_address(lib: ctypes.CDLL, path: Path, symbol: str) -> int:
    try:
        fn = getattr(lib, symbol)
    except AttributeError as exc:
        raise RuntimeLoadError(
            f"the kernel library {path} has no symbol {symbol!r}",
            remedy='define the kernel as extern "C" (or MJ_EXPORT from cpu/abi.h) with that name',
        ) from exc
    address = ctypes.cast(fn, ctypes.c_void_p).value
    if not address:
        raise RuntimeLoadError(f"symbol {symbol!r} in {path} resolved to NULL")
    return address
