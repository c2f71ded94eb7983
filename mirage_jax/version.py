"""The one place the package version is written (pyproject.toml reads the same number)."""

from __future__ import annotations

__version__ = "0.1.0"
