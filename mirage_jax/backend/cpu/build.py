"""Compiling generated C++ into shared libraries, behind a content-addressed disk cache.

``compile_shared_library(source)`` returns a ``CompiledLibrary`` whose ``key`` is the sha256 of
everything that decides the machine code: the source, the compiler's identity, the flags, the
ISA level, the runtime headers' contents and the mirage_jax version. The library lives in the
store's ``cpu`` namespace at ``<cache>/cpu/<key[:2]>/<key>.so`` beside its source (``.cpp``)
and a metadata file (``.json``) that also holds the library's digest, checked on every hit (see
``mirage_jax.store`` for the cache root, the per-key lock and the atomic publish). Whoever gets
a key's lock second finds the finished library and does not compile again. Nothing here runs
at import time, so importing mirage_jax needs no compiler.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from mirage_jax.backend.artifacts import get_or_build
from mirage_jax.backend.cpu.isa import host_isa, isa_flags
from mirage_jax.backend.headers import runtime_include_dir as include_dir_with
from mirage_jax.errors import CompileError
from mirage_jax.runtime.loader import CompiledLibrary
from mirage_jax.store import CACHE_ENV, cache_root, namespace, write_text_atomic
from mirage_jax.version import __version__

CXX_ENV = "CXX"
BASE_FLAGS: tuple[str, ...] = ("-O3", "-std=c++17", "-fPIC", "-shared")
# Unresolved symbols fail the link with a readable message instead of failing dlopen later.
LINK_FLAGS: tuple[str, ...] = ("-Wl,-z,defs",)
COMPILE_TIMEOUT_S = 600.0
_STDERR_LIMIT = 4000
_LIBRARIES = namespace("cpu")


@dataclass
class BuildStats:
    """What ``compile_shared_library`` did in this process."""

    compiles: int = 0
    cache_hits: int = 0
    compile_s: float = 0.0  # wall time spent in the compiler (a benchmark's compile column)


_stats = BuildStats()
_stats_lock = threading.Lock()


def build_stats() -> BuildStats:
    """A snapshot of this process's compile and cache-hit counts."""
    with _stats_lock:
        return dataclasses.replace(_stats)


def reset_build_stats() -> None:
    """Zero the counters (tests)."""
    with _stats_lock:
        _stats.compiles = _stats.cache_hits = 0
        _stats.compile_s = 0.0


def _count(field: str, amount: float = 1) -> None:
    with _stats_lock:
        setattr(_stats, field, getattr(_stats, field) + amount)


def library_cache_dir() -> Path:
    """Where compiled CPU libraries are cached."""
    return _LIBRARIES.directory


def runtime_include_dir() -> Path:
    """The include root of the header-only runtime (generated code says ``#include "cpu/..."``)."""
    return include_dir_with("cpu/abi.h")


def compile_shared_library(
    source: str, *, name_hint: str = "", extra_flags: Sequence[str] = ()
) -> CompiledLibrary:
    """Compile C++ ``source`` into a cached shared library, or return the cached one."""
    compiler = _compiler_argv()
    isa = host_isa()
    flags = (*BASE_FLAGS, *isa_flags(isa), *extra_flags)
    include_dir = runtime_include_dir()
    key = _cache_key(source, compiler, flags, isa, include_dir)
    lib_path = _LIBRARIES.entry(f"{key[:2]}/{key}.so")

    def build(tmp: Path) -> None:
        start = time.perf_counter()
        _compile(source, compiler, (*flags, "-I", str(include_dir), *LINK_FLAGS), lib_path, tmp)
        _count("compile_s", time.perf_counter() - start)

    def metadata() -> dict[str, object]:
        return _metadata(key, name_hint, compiler, flags, isa)

    _, built = get_or_build(_LIBRARIES, lib_path, build, metadata)
    _count("compiles" if built else "cache_hits")
    return CompiledLibrary(lib_path, key)


# --- the compiler ---------------------------------------------------------------------------


def _compiler_argv() -> tuple[str, ...]:
    """``$CXX`` (which may carry arguments, e.g. ``ccache g++``) or ``g++``, resolved."""
    raw = os.environ.get(CXX_ENV, "").strip() or "g++"
    argv = shlex.split(raw)
    resolved = shutil.which(argv[0])
    if resolved is None:
        raise CompileError(
            f"no C++ compiler: {argv[0]!r} (from {CXX_ENV}={raw!r}"
            + ("" if os.environ.get(CXX_ENV) else ", the default")
            + ") was not found",
            remedy=f"install g++ (e.g. `apt-get install g++`), or set {CXX_ENV} to a C++17 "
            "compiler",
        )
    return (resolved, *argv[1:])


@functools.cache
def compiler_identity(compiler: tuple[str, ...]) -> str:
    """First line of ``<compiler> --version``: part of every cache key."""
    try:
        proc = subprocess.run(
            [*compiler, "--version"], capture_output=True, text=True, timeout=60, check=False
        )
    except OSError as exc:
        raise CompileError(
            f"the C++ compiler {compiler[0]} could not be run: {exc}",
            remedy=f"install g++, or set {CXX_ENV} to a working C++17 compiler",
        ) from exc
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        raise CompileError(
            f"`{shlex.join([*compiler, '--version'])}` failed: {proc.stderr.strip()[:500]}",
            remedy=f"install g++, or set {CXX_ENV} to a working C++17 compiler",
        )
    return lines[0].strip()


def _compile(
    source: str, compiler: tuple[str, ...], flags: Sequence[str], lib_path: Path, out: Path
) -> None:
    """Write the source beside the library and compile it to ``out`` (the store publishes it)."""
    src_path = lib_path.with_suffix(".cpp")
    write_text_atomic(src_path, source)
    cmd = [*compiler, *flags, str(src_path), "-o", str(out)]
    try:
        proc = subprocess.run(
            cmd, capture_output=True, text=True, timeout=COMPILE_TIMEOUT_S, check=False
        )
    except subprocess.TimeoutExpired as exc:
        raise CompileError(
            f"compiling {src_path} took longer than {COMPILE_TIMEOUT_S:.0f} s",
            remedy="simplify the generated kernel or raise "
            "mirage_jax.backend.cpu.build.COMPILE_TIMEOUT_S",
        ) from exc
    if proc.returncode != 0:
        raise CompileError(
            f"compiling {src_path} failed (exit {proc.returncode}):\n"
            f"$ {shlex.join(cmd)}\n{_trim(proc.stderr)}",
            remedy=f"fix the generated source kept at {src_path}; this is a mirage_jax bug "
            "when the source was generated, please report it with that file",
        )


def _trim(text: str) -> str:
    text = text.strip()
    if len(text) <= _STDERR_LIMIT:
        return text
    return f"{text[:_STDERR_LIMIT]}\n... ({len(text) - _STDERR_LIMIT} more characters)"


# --- the cache key --------------------------------------------------------------------------


def _cache_key(
    source: str, compiler: tuple[str, ...], flags: Sequence[str], isa: str, include_dir: Path
) -> str:
    """sha256 over everything that decides the machine code (paths excluded: keys travel)."""
    material = {
        "mirage_jax": __version__,
        "compiler": compiler_identity(compiler),
        "compiler_args": list(compiler[1:]),
        "flags": list(flags),
        "link_flags": list(LINK_FLAGS),
        "isa": isa,
        "headers": headers_hash(include_dir),
    }
    digest = hashlib.sha256(json.dumps(material, sort_keys=True).encode())
    digest.update(b"\0")
    digest.update(source.encode())
    return digest.hexdigest()


def headers_hash(include_dir: Path | None = None) -> str:
    """sha256 of every runtime header's relative path and contents."""
    root = include_dir or runtime_include_dir()
    files = sorted(p for p in root.rglob("*") if p.is_file())
    signature = tuple(
        (str(p.relative_to(root)), p.stat().st_mtime_ns, p.stat().st_size) for p in files
    )
    return _hash_files(root, signature)


@functools.lru_cache(maxsize=8)
def _hash_files(root: Path, signature: tuple[tuple[str, int, int], ...]) -> str:
    """Cached by (path, mtime, size), so a cache hit does not reread the headers."""
    digest = hashlib.sha256()
    for rel, _, _ in signature:
        digest.update(rel.encode() + b"\0")
        digest.update((root / rel).read_bytes() + b"\0")
    return digest.hexdigest()


# --- metadata -------------------------------------------------------------------------------


def _metadata(
    key: str, name_hint: str, compiler: tuple[str, ...], flags: Sequence[str], isa: str
) -> dict[str, object]:
    """A human-readable record beside the library (for `mirage_jax show` and debugging); the
    store adds the library's digest to it."""
    return {
        "key": key,
        "name_hint": re.sub(r"[^A-Za-z0-9_.-]", "_", name_hint),
        "compiler": compiler_identity(compiler),
        "flags": list(flags),
        "isa": isa,
        "built_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


__all__ = ["BASE_FLAGS", "CACHE_ENV", "COMPILE_TIMEOUT_S", "CXX_ENV", "LINK_FLAGS",
           "BuildStats", "CompiledLibrary", "build_stats", "cache_root", "compile_shared_library",
           "compiler_identity", "headers_hash", "library_cache_dir", "reset_build_stats",
           "runtime_include_dir"]  # fmt: skip
