"""The user's source line of a jaxpr equation, found through public traceback attributes.

An equation's ``source_info.traceback`` lists frames innermost first. The user's line is the
first frame outside jax, jaxlib and mirage_jax's own package. Anything unexpected yields
``None``.
"""

from __future__ import annotations

import os
from typing import Any

import jax
import jaxlib

# this file is mirage_jax/frontend/source.py
_MIRAGE_JAX_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


def _package_dir(module: Any) -> str | None:
    path = getattr(module, "__file__", None)
    return os.path.dirname(os.path.abspath(path)) + os.sep if path else None


def _internal_dirs() -> tuple[str, ...]:
    dirs = (_package_dir(jax), _package_dir(jaxlib), _MIRAGE_JAX_DIR)
    return tuple(d for d in dirs if d)


_INTERNAL: tuple[str, ...] | None = None


def _is_internal(file_name: str) -> bool:
    global _INTERNAL
    if _INTERNAL is None:
        _INTERNAL = _internal_dirs()
    path = os.path.abspath(file_name) if not file_name.startswith("<") else file_name
    return path.startswith(_INTERNAL)


def user_source(source_info: Any) -> str | None:
    """``"file:line (function)"`` of the user's frame for an equation, or ``None``."""
    try:
        frames = source_info.traceback.frames
    except AttributeError:
        return None
    for frame in frames or ():
        file_name = getattr(frame, "file_name", None)
        if not file_name or _is_internal(file_name):
            continue
        line, function = getattr(frame, "line_num", "?"), getattr(frame, "function_name", "?")
        return f"{file_name}:{line} ({function})"
    return None
