"""The value types shared by the abstraction and its e-graph: ``Term``, ``SaturationBudget``,
``OracleStats``.

``mirage_jax.search.abstract`` builds terms and answers oracle queries, and
``mirage_jax.search.egraph`` saturates them with egglog; both import these types from here, so
neither imports the other at module level (``abstract`` reaches egglog only when an oracle is
built). ``abstract`` re-exports all three.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

Param = int | Fraction | str | None

# every live term by (head, args, param): see ``Term``; weak, so a finished search's terms go
_INTERNED: weakref.WeakValueDictionary[tuple[Any, ...], Term] = weakref.WeakValueDictionary()


class Term:
    """An immutable, hashable abstract expression: ``head(param)(args...)``.

    Build terms with the normalizing constructors (``var``, ``const``, ``add``, ``mul``, ...),
    not with ``Term(...)`` directly, so equal expressions compare equal. Terms are hash-consed:
    building an expression that exists already returns the existing object, so comparing two
    terms (as every memo and the oracle's caches do) costs an identity test instead of a walk
    of both trees; a structural comparison remains the fallback (terms built by two threads
    at once, or kept across the interning of their children).
    """

    __slots__ = ("__weakref__", "_hash", "_str", "args", "head", "param")

    head: str
    args: tuple[Term, ...]
    param: Param

    def __new__(cls, head: str, args: tuple[Term, ...] = (), param: Param = None) -> Term:
        args = tuple(args)
        key = (head, args, param)
        got = _INTERNED.get(key)
        if got is not None and type(got.param) is type(param):
            return got
        self = object.__new__(cls)
        object.__setattr__(self, "head", head)
        object.__setattr__(self, "args", args)
        object.__setattr__(self, "param", param)
        object.__setattr__(self, "_hash", hash(key))
        object.__setattr__(self, "_str", None)
        if got is None:
            _INTERNED[key] = self
        return self

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("Term is immutable")

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        if self is other:
            return True
        if not isinstance(other, Term) or self._hash != other._hash:
            return False
        return self.head == other.head and self.param == other.param and self.args == other.args

    def __reduce__(self) -> tuple[Any, ...]:
        # rebuild (and rehash) on unpickling: str hashes differ between processes
        return (Term, (self.head, self.args, self.param))

    def __str__(self) -> str:
        if self._str is None:
            object.__setattr__(self, "_str", _render(self))
        return self._str  # type: ignore[return-value]

    def __repr__(self) -> str:
        return f"Term<{self}>"

    def subterms(self) -> list[Term]:
        """Every distinct subterm, children before parents (self last)."""
        seen: dict[Term, None] = {}

        def visit(t: Term) -> None:
            if t in seen:
                return
            for a in t.args:
                visit(a)
            seen[t] = None

        visit(self)
        return list(seen)

    @property
    def size(self) -> int:
        """Number of distinct subterms (DAG size)."""
        return len(self.subterms())


def _render(t: Term) -> str:
    if t.head == "var":
        return f"x{t.param}"
    if t.head == "const":
        return str(t.param)
    inner = [str(a) for a in t.args]
    if t.head in ("sum", "fn"):
        inner.insert(0, str(t.param))
    return f"{t.head}({', '.join(inner)})"


# ---------------------------------------------------------------------------------------------
# the oracle's budget and counters


@dataclass(frozen=True)
class SaturationBudget:
    """Limits on saturating the target's e-graph (checked after each egglog iteration)."""

    iterations: int = 64
    node_limit: int = 200_000
    time_limit_s: float = 30.0


@dataclass
class OracleStats:
    """Counters of one oracle: queries (cache hits among them, accepted = distinct accepted
    terms) and how the saturation went."""

    queries: int = 0
    cache_hits: int = 0
    accepted: int = 0
    saturation_s: float = 0.0
    iterations: int = 0
    saturated: bool = False
    stop_reason: str = ""
    enodes: int = 0
    eclasses: int = 0
    # one entry per egglog iteration: (schedule stage, e-graph size, seconds since start)
    per_iteration: list[tuple[str, int, float]] = field(default_factory=list)


__all__ = ["OracleStats", "Param", "SaturationBudget", "Term"]
