"""Kernel libraries: search once, ship a directory, run anywhere with the same ISA and version.

A library directory holds

- ``manifest.json``: format, mirage_jax version, ISA, and per region its decision key, μGraph
  text, fingerprint, C symbol, input/output types and the measured times (or the reason the
  region stays with XLA);
- ``sources/*.cpp`` and ``include/`` (the runtime headers), with a ``CMakeLists.txt`` that
  builds them into one shared library ``lib/libmirage_kernels.so``;
- the built library.

``load_library(path)`` (or ``$MIRAGE_JAX_LIBRARY``, paths separated by ``:``) registers its
kernels and decisions, so ``@optimize`` uses them with no search and no compile. A library
built for another ISA or version is refused with a message naming both.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mirage_jax.cache import Decision
from mirage_jax.errors import LibraryError
from mirage_jax.ir import parse

log = logging.getLogger("mirage_jax.library")

FORMAT = 1
LIBRARY_ENV = "MIRAGE_JAX_LIBRARY"
_LIB_NAME = "libmirage_kernels.so"


@dataclass(frozen=True)
class LibraryEntry:
    decision: Decision
    kernel: str | None  # registered kernel name, None for regions that stay with XLA


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


# ------------------------------------------------------------------------------------ writing


def precompile(
    fn: Callable[..., Any], example_args: Sequence[Any], out_dir: str | Path, **options: Any
) -> Path:
    """Optimize ``fn`` at ``example_args`` and write a kernel library to ``out_dir``."""
    from mirage_jax.api import optimize

    plan = optimize(fn, **options).plan(*example_args)
    return write_library(plan.regions, out_dir)


def write_library(regions: Sequence[Any], out_dir: str | Path) -> Path:
    from mirage_jax import __version__
    from mirage_jax.codegen.build import runtime_include_dir
    from mirage_jax.codegen.cpu import emit_cpu
    from mirage_jax.codegen.isa import host_isa

    out = Path(out_dir)
    (out / "sources").mkdir(parents=True, exist_ok=True)
    shutil.copytree(runtime_include_dir(), out / "include", dirs_exist_ok=True)
    entries = []
    for plan in regions:
        entry = {"key": plan.key, "reason": plan.reason, "mirage_s": plan.mirage_s,
                 "xla_s": plan.xla_s, "graph": None, "symbol": None}  # fmt: skip
        if plan.impl is not None and plan.graph is not None:
            symbol = "mj_" + plan.graph.fingerprint()[:24]
            (out / "sources" / f"{symbol}.cpp").write_text(emit_cpu(plan.graph, symbol))
            entry.update(graph=str(plan.graph), symbol=symbol,
                         fingerprint=plan.graph.fingerprint())  # fmt: skip
        entry["target"] = str(plan.target)
        entries.append(entry)
    isa = host_isa()
    manifest = {"format": FORMAT, "version": __version__, "isa": isa, "regions": entries}
    (out / "CMakeLists.txt").write_text(_cmakelists(isa))
    _build(out)
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1, sort_keys=True))
    return out


def _cmakelists(isa: str) -> str:
    from mirage_jax.codegen.isa import isa_flags
    from mirage_jax.search.calibrate import kernel_flags

    flags = " ".join(("-O3", *isa_flags(isa), *kernel_flags()))
    return f"""cmake_minimum_required(VERSION 3.18)
project(mirage_kernels CXX)
file(GLOB MJ_SOURCES CONFIGURE_DEPENDS ${{CMAKE_CURRENT_SOURCE_DIR}}/sources/*.cpp)
if(NOT MJ_SOURCES)
  # A library whose every region stays with XLA still ships a (trivial) shared object.
  file(WRITE ${{CMAKE_CURRENT_BINARY_DIR}}/empty.cpp "extern \\"C\\" int mj_empty() {{ return 0; }}\\n")
  set(MJ_SOURCES ${{CMAKE_CURRENT_BINARY_DIR}}/empty.cpp)
endif()
add_library(mirage_kernels SHARED ${{MJ_SOURCES}})
target_include_directories(mirage_kernels PRIVATE ${{CMAKE_CURRENT_SOURCE_DIR}}/include)
separate_arguments(MJ_FLAGS UNIX_COMMAND "{flags}")
target_compile_options(mirage_kernels PRIVATE ${{MJ_FLAGS}})
set_target_properties(mirage_kernels PROPERTIES CXX_STANDARD 17 CXX_STANDARD_REQUIRED ON
  LIBRARY_OUTPUT_DIRECTORY ${{CMAKE_CURRENT_SOURCE_DIR}}/lib)
"""


def _build(out: Path) -> None:
    cmake = shutil.which("cmake")
    if cmake is None:
        raise LibraryError("cmake is not on PATH", remedy="install cmake (pip install cmake)")
    build = out / "build"
    for argv in (
        [cmake, "-S", str(out), "-B", str(build), "-DCMAKE_BUILD_TYPE=Release"],
        [cmake, "--build", str(build), "--parallel"],
    ):
        done = subprocess.run(argv, capture_output=True, text=True)
        if done.returncode != 0:
            raise LibraryError(
                f"building the kernel library in {out} failed:\n{done.stdout[-2000:]}"
                f"{done.stderr[-2000:]}",
                remedy="check the compiler output above; the sources are kept in sources/",
            )


# ------------------------------------------------------------------------------------ loading


def load_library(path: str | Path) -> int:
    """Register a library's kernels and decisions; returns how many regions it covers."""
    from mirage_jax import __version__
    from mirage_jax.codegen.build import CompiledLibrary
    from mirage_jax.codegen.isa import host_isa
    from mirage_jax.runtime import load_kernel

    root = Path(path)
    manifest = _read_manifest(root)
    if manifest.get("version") != __version__:
        raise LibraryError(
            f"kernel library {root} was built by mirage_jax {manifest.get('version')}, "
            f"this is {__version__}",
            remedy="precompile it again with this version (python -m mirage_jax precompile)",
        )
    if manifest.get("isa") != host_isa():
        raise LibraryError(
            f"kernel library {root} was built for ISA {manifest.get('isa')}, "
            f"this machine runs {host_isa()}",
            remedy="precompile it on (or for) this kind of machine",
        )
    lib = CompiledLibrary(path=root / "lib" / _LIB_NAME, key=_library_key(manifest))
    for region in manifest["regions"]:
        graph = parse(region["graph"]) if region["graph"] else None
        kernel = load_kernel(lib, region["symbol"]) if graph is not None else None
        decision = Decision(graph, region["reason"], region["mirage_s"], region["xla_s"])
        _ENTRIES[region["key"]] = LibraryEntry(decision, kernel)
    return len(manifest["regions"])


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
    if not (root / "lib" / _LIB_NAME).exists():
        raise LibraryError(f"{root}/lib/{_LIB_NAME} is missing", remedy="rebuild with cmake")
    return manifest


def _library_key(manifest: dict[str, Any]) -> str:
    import hashlib

    return hashlib.sha256(json.dumps(manifest, sort_keys=True).encode()).hexdigest()
