"""The content-addressed artifact store: key -> file on disk, shared safely between processes.

Every on-disk cache of mirage_jax (compiled kernels, CUDA builds, planning decisions, host
calibration) lives in a ``Namespace``: a directory under the cache root (``$MIRAGE_JAX_CACHE_DIR``,
else ``$XDG_CACHE_HOME/mirage_jax``, else ``~/.cache/mirage_jax``) whose entries are files named
by their content key. The namespace gives

- atomic publish: an entry is written to a temporary name in its own directory and renamed into
  place, so a reader sees a whole entry or none, and a writer that fails leaves nothing behind;
- a per-key lock (``fcntl.flock`` on ``<entry>.lock``), so processes that want the same missing
  entry create it once: the others wait, then find it;
- a check on every read: the caller's reader parses and validates the entry (JSON entries carry
  their own structure), and opaque binary artifacts get a digest record ``<entry>.json`` (sha256
  and size) written before the artifact. An entry that fails its check is counted, logged,
  removed under its lock and treated as a miss;
- hit / miss / corrupt / write counters per namespace.

The cache root is read from the environment on every call, so a changed variable takes effect
at once. Nothing here runs at import time.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import logging
import os
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

CACHE_ENV = "MIRAGE_JAX_CACHE_DIR"
RECORD_SUFFIX = ".json"
LOCK_SUFFIX = ".lock"

log = logging.getLogger("mirage_jax.store")

T = TypeVar("T")


class CorruptEntry(ValueError):
    """An entry exists but fails its check (truncated, edited, or of an unknown format)."""


@dataclass
class StoreStats:
    """What one namespace did in this process. Every read counts one hit or one miss; a
    corrupt entry also counts as a miss; ``writes`` counts entries published."""

    hits: int = 0
    misses: int = 0
    corrupt: int = 0
    writes: int = 0


def cache_root() -> Path:
    """The mirage_jax cache root: every namespace is a directory under it."""
    override = os.environ.get(CACHE_ENV)
    if override:
        return Path(override).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "mirage_jax"


class Namespace:
    """One kind of artifact: a directory of entries under the cache root (or a fixed one)."""

    def __init__(self, name: str, directory: Path | None = None) -> None:
        self.name = name
        self._directory = directory
        self._stats = StoreStats()
        self._stats_lock = threading.Lock()

    @property
    def directory(self) -> Path:
        return self._directory if self._directory is not None else cache_root() / self.name

    def at(self, directory: Path) -> Namespace:
        """The same namespace (sharing its counters) over an explicit directory."""
        other = Namespace(self.name, directory)
        other._stats, other._stats_lock = self._stats, self._stats_lock
        return other

    def entry(self, relative: str) -> Path:
        """The path of the entry ``relative`` (e.g. ``"ab/abcd....so"``) in this namespace."""
        return self.directory / relative

    # --- counters ---------------------------------------------------------------------------

    def stats(self) -> StoreStats:
        """A snapshot of this namespace's counters."""
        with self._stats_lock:
            return dataclasses.replace(self._stats)

    def _count(self, field: str) -> None:
        with self._stats_lock:
            setattr(self._stats, field, getattr(self._stats, field) + 1)

    # --- writing ----------------------------------------------------------------------------

    def publish(
        self, path: Path, write: Callable[[Path], None], *, record: Mapping[str, Any] | None = None
    ) -> None:
        """Publish the entry ``path``: ``write(tmp)`` creates it under a temporary name in the
        same directory, which is then renamed into place. If ``write`` raises, nothing is
        published and the temporary file is removed. With ``record``, the entry is an opaque
        artifact: its digest record (``record`` plus the sha256 and size) is published first,
        so whoever sees the artifact also sees the record that checks it."""
        _publish(path, write, record)
        self._count("writes")

    def publish_text(self, path: Path, text: str) -> None:
        """Publish a text entry atomically."""
        self.publish(path, lambda tmp: tmp.write_text(text))

    @contextlib.contextmanager
    def lock(self, path: Path) -> Iterator[None]:
        """Hold the inter-process lock of entry ``path`` (threads of one process exclude each
        other too: flock belongs to the open file, and each holder opens its own)."""
        import fcntl  # POSIX only: imported when first locking, so importing works anywhere

        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path.with_suffix(LOCK_SUFFIX), os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # closing releases the lock; lock files stay (unlinking one races)

    # --- reading ----------------------------------------------------------------------------

    def load(self, path: Path, read: Callable[[Path], T]) -> T | None:
        """``read(path)``, or None when the entry is missing or corrupt (a corrupt one is
        removed). ``read`` raises ``FileNotFoundError`` for a missing entry and any other
        exception for one that fails its check."""
        value = _attempt(path, read)
        if isinstance(value, _Corrupt):
            with self.lock(path):
                value = _attempt(path, read)  # another process may have replaced it meanwhile
                if isinstance(value, _Corrupt):
                    self._discard(path, value.error)
        if isinstance(value, _Bad):
            self._count("misses")
            return None
        self._count("hits")
        return value

    def get_or_create(
        self, path: Path, read: Callable[[Path], T], create: Callable[[], None]
    ) -> tuple[T, bool]:
        """The entry's value, and whether this call created it. A missing or corrupt entry is
        created by ``create()`` (which publishes ``path``) under the key's lock, so concurrent
        callers create it once; the others wait and read it."""
        value = _attempt(path, read)
        if not isinstance(value, _Bad):
            self._count("hits")
            return value, False
        with self.lock(path):
            value = _attempt(path, read)  # another process may have created it meanwhile
            if not isinstance(value, _Bad):
                self._count("hits")
                return value, False
            if isinstance(value, _Corrupt):
                self._discard(path, value.error)
            create()
            fresh = read(path)  # a fresh entry that fails its own check is a bug: raise
        self._count("misses")
        return fresh, True

    def get_or_build(self, path: Path, build: Callable[[Path], None],
                     record: Callable[[], Mapping[str, Any]]) -> tuple[Path, bool]:  # fmt: skip
        """An opaque artifact (a compiled library, a cubin): its path once its digest record
        checks, or built now by ``build(tmp)`` and published with ``record()`` and its digest.
        Returns the path and whether this call built it."""
        def create() -> None:
            self.publish(path, build, record=record())

        return self.get_or_create(path, verified, create)

    def _discard(self, path: Path, error: BaseException) -> None:
        self._count("corrupt")
        log.warning("cache entry %s is corrupt (%s); it is deleted and will be rebuilt",
                    path, error)  # fmt: skip
        path.unlink(missing_ok=True)


_NAMESPACES: dict[str, Namespace] = {}
_NAMESPACES_LOCK = threading.Lock()


def namespace(name: str) -> Namespace:
    """The process-wide namespace ``name`` (a directory ``<cache root>/<name>``)."""
    with _NAMESPACES_LOCK:
        return _NAMESPACES.setdefault(name, Namespace(name))


# --- digest records of opaque artifacts -------------------------------------------------------


def record_path(path: Path) -> Path:
    """Where the digest record of artifact ``path`` lives."""
    if path.suffix == RECORD_SUFFIX:
        raise ValueError(f"{path}: an artifact with a record cannot itself be a {RECORD_SUFFIX}")
    return path.with_suffix(RECORD_SUFFIX)


def verified(path: Path) -> Path:
    """``path`` when its bytes match its digest record; ``CorruptEntry`` when they do not."""
    record = json.loads(record_path(path).read_text())
    if "sha256" not in record:
        # written before records carried digests: cannot be checked, so rebuilt like a miss
        raise FileNotFoundError(f"{record_path(path)} records no digest")
    size = path.stat().st_size
    if size != record["size"]:
        raise CorruptEntry(f"{size} bytes, recorded {record['size']}")
    if file_digest(path) != record["sha256"]:
        raise CorruptEntry("sha256 differs from its record")
    return path


def file_digest(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


# --- files ----------------------------------------------------------------------------------


def write_text_atomic(path: Path, text: str) -> None:
    """Write a side file (e.g. the source kept beside a library) atomically; not an entry."""
    _publish(path, lambda tmp: tmp.write_text(text), None)


def _publish(path: Path, write: Callable[[Path], None], record: Mapping[str, Any] | None) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _temporary(path)
    try:
        write(tmp)
        if record is not None:
            stamped = {**record, "sha256": file_digest(tmp), "size": tmp.stat().st_size}
            write_text_atomic(record_path(path), json.dumps(stamped, indent=2) + "\n")
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _temporary(path: Path) -> Path:
    """A name beside ``path`` that no other writer uses (one writer per thread at a time); it
    keeps the suffix, which compilers may read to pick the output format."""
    return path.with_name(f"{path.stem}.tmp-{os.getpid()}-{threading.get_ident()}{path.suffix}")


class _Bad:
    pass


class _Missing(_Bad):
    pass


@dataclass
class _Corrupt(_Bad):
    error: BaseException


def _attempt(path: Path, read: Callable[[Path], T]) -> T | _Bad:
    try:
        return read(path)
    except FileNotFoundError:
        return _Missing()
    # any failure to read or check (parse errors, missing fields, wrong types) means the entry
    # cannot be trusted, whatever the reader raised
    except Exception as err:  # noqa: BLE001
        return _Corrupt(err)


__all__ = ["CACHE_ENV", "CorruptEntry", "Namespace", "StoreStats", "cache_root", "file_digest",
           "namespace", "record_path", "verified", "write_text_atomic"]  # fmt: skip
