"""One error tree for mirage_jax.

Every message names the cause, the user's source line where one is known, and a remedy.
Catch ``MirageError`` to catch everything this package raises on purpose.
"""

from __future__ import annotations


class MirageError(Exception):
    """Base of every error mirage_jax raises on purpose."""

    def __init__(self, cause: str, *, remedy: str | None = None, source: str | None = None):
        self.cause = cause
        self.remedy = remedy
        self.source = source
        parts = [cause]
        if source:
            parts.append(f"  at {source}")
        if remedy:
            parts.append(f"  remedy: {remedy}")
        super().__init__("\n".join(parts))


class GraphError(MirageError):
    """A μGraph is malformed: wrong shapes, dtypes, maps or structure."""


class ParseError(MirageError):
    """The canonical text form of a μGraph could not be parsed."""


class TraceError(MirageError):
    """A function could not be traced into regions."""


class CompileError(MirageError):
    """Generated code failed to compile, or no compiler is available."""


class RuntimeLoadError(MirageError):
    """A compiled kernel library could not be loaded or registered with XLA."""


class SearchError(MirageError):
    """The superoptimizer was misconfigured or could not run."""


class LibraryError(MirageError):
    """A kernel library is missing, corrupt, or built for another machine or version."""
