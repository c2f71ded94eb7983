"""Kernel libraries: search once, ship a directory, run anywhere with the same ISA and version.

A library directory holds (``mirage_jax.api.libraries`` writes it)

- ``manifest.json``: format, mirage_jax version, backend, its ISA (or GPU arch), and per region its decision key, μGraph
  text, fingerprint, C symbol, input/output types and the measured times (or the reason the
  region stays with XLA);
- ``sources/*.cpp`` (or ``*.cu`` for the CUDA backend) and ``include/`` (the runtime
  headers), with a ``CMakeLists.txt`` that builds them into one shared library
  ``lib/libmirage_kernels.so``;
- the built library.

``load_library(path)`` (or ``$MIRAGE_JAX_LIBRARY``, paths separated by ``:``) registers its
kernels and decisions, so ``@optimize`` uses them with no search and no compile. A library
built for another backend, ISA or version is refused with a message naming both.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mirage_jax.backend import KernelCall, get_backend
from mirage_jax.errors import LibraryError, MirageError, RuntimeLoadError
from mirage_jax.ir import parse
from mirage_jax.planner.decisions import Decision
from mirage_jax.version import __version__

log = logging.getLogger("mirage_jax.planner.library")

FORMAT = 1
LIBRARY_ENV = "MIRAGE_JAX_LIBRARY"
LIB_NAME = "libmirage_kernels.so"


@dataclass(frozen=True)
class LibraryEntry:
    decision: Decision
    kernel: KernelCall | None  # the loaded kernel; None for regions that stay with XLA


_ENTRIES: dict[str, LibraryEntry] = {}
_ENV_LOADED = False


def lookup(key: str) -> LibraryEntry | None:
    """The loaded library entry for a decision key (loads ``$MIRAGE_JAX_LIBRARY`` once)."""
    global _ENV_LOADED
    if not _ENV_LOADED:
        _ENV_LOADED = True
        for path in filter(None, os.environ.get(LIBRARY_ENV, "").split(":")):
            try:
                load_library(path)
            except LibraryError as err:
                log.warning("%s=%s not used: %s", LIBRARY_ENV, path, err)
    return _ENTRIES.get(key)


def loaded_keys() -> tuple[str, ...]:
    return tuple(_ENTRIES)



def load_library(path: str | Path) -> int:
    """Register a library's kernels and decisions; returns how many regions it covers."""
    root = Path(path)
    manifest = _read_manifest(root)
    if manifest.get("version") != __version__:
        raise LibraryError(
            f"kernel library {root} was built by mirage_jax {manifest.get('version')}, "
            f"this is {__version__}",
            remedy="precompile it again with this version (python -m mirage_jax precompile)",
        )
    try:  # libraries written before backends were named are CPU libraries
        backend = get_backend(manifest.get("backend", "cpu"))
        here = backend.target()
    except MirageError as err:
        raise LibraryError(f"kernel library {root} cannot be used here: {err.cause}",
                           remedy=err.remedy or "precompile it for this machine") from None  # fmt: skip
    if manifest.get("isa") != here:
        raise LibraryError(
            f"kernel library {root} was built for ISA {manifest.get('isa')}, "
            f"this machine runs {here}",
            remedy="precompile it on (or for) this kind of machine",
        )
    lib_path, key = root / "lib" / LIB_NAME, _library_key(manifest)
    entries = {}  # registered only once every region of the manifest reads back
    try:
        for region in manifest["regions"]:
            graph = parse(region["graph"]) if region["graph"] else None
            kernel = (backend.load_library_kernel(lib_path, key, graph, region["symbol"])
                      if graph is not None else None)  # fmt: skip
            decision = Decision(graph, region["reason"], region["mirage_s"], region["xla_s"])
            entries[region["key"]] = LibraryEntry(decision, kernel)
    except LibraryError:
        raise
    except RuntimeLoadError as err:  # the built library itself: truncated, or not loadable
        raise LibraryError(f"kernel library {root} cannot be loaded: {err.cause}",
                           remedy="build it again (cmake in the library directory) or "
                           "precompile it again") from None  # fmt: skip
    # a manifest that parses as JSON but not as a library: fields missing, of the wrong type,
    # or a μGraph text that does not parse
    except (KeyError, TypeError, ValueError, AttributeError, MirageError) as err:
        cause = err.cause if isinstance(err, MirageError) else f"{type(err).__name__}: {err}"
        raise LibraryError(f"{root}/manifest.json is corrupt ({cause})",
                           remedy="precompile the library again") from None  # fmt: skip
    _ENTRIES.update(entries)
    return len(entries)


def _read_manifest(root: Path) -> dict[str, Any]:
    try:
        manifest = json.loads((root / "manifest.json").read_text())
    except FileNotFoundError:
        raise LibraryError(f"{root} has no manifest.json: it is not a kernel library",
                           remedy="pass the directory written by precompile") from None  # fmt: skip
    except json.JSONDecodeError as err:
        raise LibraryError(f"{root}/manifest.json is corrupt: {err}",
                           remedy="precompile the library again") from None  # fmt: skip
    if manifest.get("format") != FORMAT:
        raise LibraryError(f"{root}: manifest format {manifest.get('format')}, expected {FORMAT}",
                           remedy="precompile the library again")  # fmt: skip
    if not (root / "lib" / LIB_NAME).exists():
        raise LibraryError(f"{root}/lib/{LIB_NAME} is missing", remedy="rebuild with cmake")
    return manifest


def _library_key(manifest: dict[str, Any]) -> str:
    import hashlib

    return hashlib.sha256(json.dumps(manifest, sort_keys=True).encode()).hexdigest()
