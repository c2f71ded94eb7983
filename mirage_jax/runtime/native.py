"""Finding the native module ``mirage_jax._C``, lazily.

``_C`` holds the generic XLA FFI dispatcher and the kernel registry. It is imported only when
something needs it, so ``import mirage_jax`` works without it.

Running from a source checkout (``python -m pytest`` in the repo root puts the checkout first on
``sys.path``) imports the pure-Python package from the source tree, which has no built ``_C``.
Then the ``_C`` of the installed ``mirage-jax`` distribution is used if its ABI version and
package version match this source tree, so ``pip install .`` followed by ``python -m pytest``
works without an in-place build.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.metadata
import importlib.util
import re
import sys
import threading
from pathlib import Path
from types import ModuleType

from mirage_jax.errors import RuntimeLoadError
from mirage_jax.version import __version__

_MODULE = "mirage_jax._C"
_DIST = "mirage-jax"
_ABI_HEADER = Path(__file__).resolve().parents[2] / "csrc" / "runtime" / "cpu" / "abi.h"
# Used when the ABI header is not beside the package (an installed wheel): the wheel's _C and
# its Python files come from one build, so only the package version matters there.
_FALLBACK_ABI_VERSION = 1

_lock = threading.Lock()
_native: ModuleType | None = None
_REMEDY = (
    "reinstall the native core with `pip install .` from the mirage_jax source tree "
    "(or `pip install -e . --no-build-isolation` for development); it needs g++ and cmake"
)


def native() -> ModuleType:
    """``mirage_jax._C``, imported on first use; ``RuntimeLoadError`` with a remedy if absent."""
    global _native
    if _native is not None:
        return _native
    with _lock:
        if _native is None:
            _native = _import_native()
    return _native


def try_native() -> ModuleType | None:
    """``mirage_jax._C`` if it can be loaded, else None (for optional uses such as ISA probing)."""
    try:
        return native()
    except RuntimeLoadError:
        return None


def _import_native() -> ModuleType:
    try:
        return importlib.import_module(_MODULE)
    except ModuleNotFoundError as exc:
        if exc.name != _MODULE:
            raise
        missing: BaseException = exc
    except ImportError as exc:  # present but unloadable: report the loader's message
        raise RuntimeLoadError(
            f"the native module {_MODULE} failed to load: {exc}", remedy=_REMEDY
        ) from exc
    module = _import_installed_native()
    if module is None:
        where = Path(importlib.import_module("mirage_jax").__file__ or "?").parent
        raise RuntimeLoadError(
            f"the native module {_MODULE} is missing (mirage_jax imported from {where}, "
            "and no matching installed mirage-jax distribution has one)",
            remedy=_REMEDY,
        ) from missing
    return module


def _import_installed_native() -> ModuleType | None:
    """The installed distribution's ``_C``, when this package runs from a source tree."""
    path = _installed_native_path()
    if path is None:
        return None
    spec = importlib.util.spec_from_file_location(_MODULE, path)
    if spec is None or spec.loader is None:
        return None
    module = importlib.util.module_from_spec(spec)
    sys.modules[_MODULE] = module
    try:
        spec.loader.exec_module(module)
    except ImportError as exc:
        del sys.modules[_MODULE]
        raise RuntimeLoadError(
            f"the installed {_MODULE} at {path} failed to load: {exc}", remedy=_REMEDY
        ) from exc
    found, expected = getattr(module, "ABI_VERSION", None), _expected_abi_version()
    if found != expected:
        del sys.modules[_MODULE]
        raise RuntimeLoadError(
            f"the installed {_MODULE} at {path} has ABI version {found}, "
            f"this source tree expects {expected}",
            remedy=_REMEDY,
        )
    importlib.import_module("mirage_jax")._C = module  # make `from mirage_jax import _C` work too
    return module


def _installed_native_path() -> Path | None:
    try:
        dist = importlib.metadata.distribution(_DIST)
    except importlib.metadata.PackageNotFoundError:
        return None
    if dist.version != __version__:
        return None
    suffixes = tuple(importlib.machinery.EXTENSION_SUFFIXES)
    for file in dist.files or ():
        if (
            file.parts[:1] == ("mirage_jax",)
            and file.name.startswith("_C.")
            and file.name.endswith(suffixes)
        ):
            path = Path(str(dist.locate_file(file)))
            if path.is_file():
                return path
    return None


def _expected_abi_version() -> int:
    """MJ_ABI_VERSION from the source tree's abi.h when there is one."""
    try:
        text = _ABI_HEADER.read_text()
    except OSError:
        return _FALLBACK_ABI_VERSION
    match = re.search(r"#define\s+MJ_ABI_VERSION\s+(\d+)", text)
    return int(match.group(1)) if match else _FALLBACK_ABI_VERSION
