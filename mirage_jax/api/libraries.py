"""Writing kernel libraries: ``precompile`` a function and ship its kernels as a directory.

The directory's format (``manifest.json``, ``sources/``, ``include/``, ``CMakeLists.txt``,
``lib/``) is the one ``mirage_jax.planner.library.load_library`` reads back.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from mirage_jax.api.optimized import optimize
from mirage_jax.backend import Backend
from mirage_jax.errors import LibraryError
from mirage_jax.planner.library import FORMAT
from mirage_jax.version import __version__


def precompile(
    fn: Callable[..., Any], example_args: Sequence[Any], out_dir: str | Path, **options: Any
) -> Path:
    """Optimize ``fn`` at ``example_args`` and write a kernel library to ``out_dir``."""
    plan = optimize(fn, **options).plan(*example_args)
    return write_library(plan.regions, out_dir, plan.backend)


def write_library(regions: Sequence[Any], out_dir: str | Path, backend: Backend) -> Path:
    """Write and build a kernel library of ``regions`` (``RegionPlan``s searched for
    ``backend``): the kept regions' kernels and every region's decision."""
    out = Path(out_dir)
    (out / "sources").mkdir(parents=True, exist_ok=True)
    shutil.copytree(backend.include_dir(), out / "include", dirs_exist_ok=True)
    entries = [_entry(plan, out, backend) for plan in regions]
    manifest = {"format": FORMAT, "version": __version__, "backend": backend.name,
                "isa": backend.target(), "regions": entries}  # fmt: skip
    (out / "CMakeLists.txt").write_text(backend.library_cmake())
    _build(out)
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1, sort_keys=True))
    return out


def _entry(plan: Any, out: Path, backend: Backend) -> dict[str, Any]:
    entry = {"key": plan.key, "reason": plan.reason, "mirage_s": plan.mirage_s,
             "xla_s": plan.xla_s, "graph": None, "symbol": None}  # fmt: skip
    if plan.impl is not None and plan.graph is not None:
        symbol = backend.symbol(plan.graph)
        source = out / "sources" / f"{symbol}{backend.source_suffix}"
        source.write_text(backend.emit(plan.graph, symbol))
        entry.update(graph=str(plan.graph), symbol=symbol, fingerprint=plan.graph.fingerprint())
    entry["target"] = str(plan.target)
    return entry


def _build(out: Path) -> None:
    cmake = shutil.which("cmake")
    if cmake is None:
        raise LibraryError("cmake is not on PATH", remedy="install cmake (pip install cmake)")
    build = out / "build"
    for argv in (
        [cmake, "-S", str(out), "-B", str(build), "-DCMAKE_BUILD_TYPE=Release"],
        [cmake, "--build", str(build), "--parallel"],
    ):
        done = subprocess.run(argv, check=False, capture_output=True, text=True)
        if done.returncode != 0:
            raise LibraryError(
                f"building the kernel library in {out} failed:\n{done.stdout[-2000:]}"
                f"{done.stderr[-2000:]}",
                remedy="check the compiler output above; the sources are kept in sources/",
            )


__all__ = ["precompile", "write_library"]
