"""Where the hand-written runtime headers (``csrc/runtime``) are: in the installed wheel, or
in the source tree when the package runs from a checkout."""

from __future__ import annotations

from pathlib import Path

from mirage_jax.errors import CompileError

_PACKAGE_DIR = Path(__file__).resolve().parents[1]  # mirage_jax/
_HEADER_DIRS = (_PACKAGE_DIR / "_runtime_headers", _PACKAGE_DIR.parent / "csrc" / "runtime")


def runtime_include_dir(marker: str) -> Path:
    """The include root that holds ``marker`` (e.g. ``"cpu/abi.h"``): generated code includes
    the runtime relative to it."""
    for candidate in _HEADER_DIRS:
        if (candidate / marker).is_file():
            return candidate
    raise CompileError(
        f"the mirage_jax runtime headers ({marker}) are missing from "
        + " and ".join(str(d) for d in _HEADER_DIRS),
        remedy="reinstall mirage_jax with `pip install .` so the wheel carries its headers",
    )


__all__ = ["runtime_include_dir"]
