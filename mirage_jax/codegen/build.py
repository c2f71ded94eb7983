"""Compiling generated C++ into shared libraries, behind a content-addressed disk cache.

``compile_shared_library(source)`` returns a ``CompiledLibrary`` whose ``key`` is the sha256 of
everything that decides the machine code: the source, the compiler's identity, the flags, the
ISA level, the runtime headers' contents and the mirage_jax version. The library lives at
``<cache>/cpu/<key[:2]>/<key>.so`` beside its source (``.cpp``) and a metadata file
(``.json``). The cache root is ``$MIRAGE_JAX_CACHE_DIR``, else ``$XDG_CACHE_HOME/mirage_jax``,
else ``~/.cache/mirage_jax``.

Several processes may build the same key at once: each key has a lock file (``fcntl.flock``),
the compiler writes a temporary name that ``os.replace`` publishes atomically, and whoever gets
the lock second finds the finished library and does not compile again. Nothing here runs at
import time, so importing mirage_jax needs no compiler.
"""

from __future__ import annotations

import contextlib
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
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from mirage_jax.codegen.isa import host_isa, isa_flags
from mirage_jax.errors import CompileError

CACHE_ENV = "MIRAGE_JAX_CACHE_DIR"
CXX_ENV = "CXX"
BASE_FLAGS: tuple[str, ...] = ("-O3", "-std=c++17", "-fPIC", "-shared")
# Unresolved symbols fail the link with a readable message instead of failing dlopen later.
LINK_FLAGS: tuple[str, ...] = ("-Wl,-z,defs",)
COMPILE_TIMEOUT_S = 600.0
_STDERR_LIMIT = 4000
_PACKAGE_DIR = Path(__file__).resolve().parents[1]
# An installed wheel carries the headers inside the package; a source checkout has csrc/.
_HEADER_DIRS = (_PACKAGE_DIR / "_runtime_headers", _PACKAGE_DIR.parent / "csrc" / "runtime")


@dataclass(frozen=True)
class CompiledLibrary:
    """A compiled shared library: where it is, and the content key it is cached under."""

    path: Path
    key: str


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


def cache_root() -> Path:
    """The mirage_jax cache root (libraries go under ``cpu/``; others may use siblings)."""
    override = os.environ.get(CACHE_ENV)
    if override:
        return Path(override).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "mirage_jax"


def library_cache_dir() -> Path:
    """Where compiled CPU libraries are cached."""
    return cache_root() / "cpu"


def runtime_include_dir() -> Path:
    """The include root of the header-only runtime (generated code says ``#include "cpu/..."``)."""
    for candidate in _HEADER_DIRS:
        if (candidate / "cpu" / "abi.h").is_file():
            return candidate
    raise CompileError(
        "the mirage_jax runtime headers (cpu/abi.h) are missing from "
        + " and ".join(str(d) for d in _HEADER_DIRS),
        remedy="reinstall mirage_jax with `pip install .` so the wheel carries its headers",
    )


def compile_shared_library(
    source: str, *, name_hint: str = "", extra_flags: Sequence[str] = ()
) -> CompiledLibrary:
    """Compile C++ ``source`` into a cached shared library, or return the cached one."""
    compiler = _compiler_argv()
    isa = host_isa()
    flags = (*BASE_FLAGS, *isa_flags(isa), *extra_flags)
    include_dir = runtime_include_dir()
    key = _cache_key(source, compiler, flags, isa, include_dir)
    lib_path = library_cache_dir() / key[:2] / f"{key}.so"
    if lib_path.is_file():  # published by os.replace, so existence means complete
        _count("cache_hits")
        return CompiledLibrary(lib_path, key)
    lib_path.parent.mkdir(parents=True, exist_ok=True)
    with key_lock(lib_path.with_suffix(".lock")):
        if lib_path.is_file():  # another process built it while we waited
            _count("cache_hits")
            return CompiledLibrary(lib_path, key)
        start = time.perf_counter()
        _compile(source, compiler, (*flags, "-I", str(include_dir), *LINK_FLAGS), lib_path)
        _count("compile_s", time.perf_counter() - start)
        _write_metadata(lib_path, key, name_hint, compiler, flags, isa)
    _count("compiles")
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


def _compile(source: str, compiler: tuple[str, ...], flags: Sequence[str], lib_path: Path) -> None:
    """Write the source beside the library and compile it to a temporary name, then publish."""
    src_path = lib_path.with_suffix(".cpp")
    atomic_write(src_path, source)
    tmp = lib_path.with_name(f"{lib_path.stem}.tmp-{os.getpid()}-{threading.get_ident()}.so")
    cmd = [*compiler, *flags, str(src_path), "-o", str(tmp)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=COMPILE_TIMEOUT_S)
    except subprocess.TimeoutExpired as exc:
        raise CompileError(
            f"compiling {src_path} took longer than {COMPILE_TIMEOUT_S:.0f} s",
            remedy="simplify the generated kernel or raise codegen.build.COMPILE_TIMEOUT_S",
        ) from exc
    if proc.returncode != 0:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise CompileError(
            f"compiling {src_path} failed (exit {proc.returncode}):\n"
            f"$ {shlex.join(cmd)}\n{_trim(proc.stderr)}",
            remedy=f"fix the generated source kept at {src_path}; this is a mirage_jax bug "
            "when the source was generated, please report it with that file",
        )
    os.replace(tmp, lib_path)


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
    from mirage_jax import __version__

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


# --- files ----------------------------------------------------------------------------------


@contextlib.contextmanager
def key_lock(lock_path: Path) -> Iterator[None]:
    """An exclusive per-key lock across processes and threads (flock is per open file)."""
    import fcntl  # POSIX only, and only needed when actually compiling

    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the lock


def atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(f"{path.name}.tmp-{os.getpid()}-{threading.get_ident()}")
    tmp.write_text(text)
    os.replace(tmp, path)


def _write_metadata(
    lib_path: Path,
    key: str,
    name_hint: str,
    compiler: tuple[str, ...],
    flags: Sequence[str],
    isa: str,
) -> None:
    """A human-readable record beside the library (for `mirage_jax show` and debugging)."""
    meta = {
        "key": key,
        "name_hint": re.sub(r"[^A-Za-z0-9_.-]", "_", name_hint),
        "compiler": compiler_identity(compiler),
        "flags": list(flags),
        "isa": isa,
        "built_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    atomic_write(lib_path.with_suffix(".json"), json.dumps(meta, indent=2) + "\n")
