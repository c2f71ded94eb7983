"""The values of a partial block graph (``BlockValues``): per value id its type, term, phase,
uses and index info, pushed and popped as the block DFS applies and undoes ops, with the value
numbering that recognises a recomputed value or a constant."""

from __future__ import annotations

from typing import Any

from mirage_jax.ir.types import TensorType
from mirage_jax.search.enumeration.terms import TermHasher

# what a value is, exactly: (type, term, phase, index info)
Ident = tuple[TensorType, Any, int, Any]


class Identities:
    """Interned value identities: ``sid`` numbers a value's exact identity (type, term, phase,
    index info), ``sig_id`` its signature (term hash, shape, phase, index info: two values with
    one signature compute the same thing). The tasks of one search may share one table, so
    that their op checks, memoized by operand sids, are shared too (``block.SearchShare``)."""

    def __init__(self) -> None:
        self.ident: list[Ident] = []  # sid -> identity
        self.sig_id: list[int] = []  # sid -> interned signature
        self.hasher = TermHasher()
        self._interned: dict[Any, int] = {}
        self._sigs: dict[Any, int] = {}

    def __len__(self) -> int:
        return len(self.ident)

    def intern(self, t: TensorType, term: Any, phase: int, labels: Any) -> int:
        """The sid of a value with this identity (a new one the first time)."""
        key = (term, t.shape, t.dtype, phase, labels)
        sid = self._interned.get(key)
        if sid is None:
            sid = self._interned[key] = len(self.ident)
            self.ident.append((t, term, phase, labels))
            sig = self.sig(t, term, phase, labels)
            self.sig_id.append(self._sigs.setdefault(sig, len(self._sigs)))
        return sid

    def sig(self, t: TensorType, term: Any, phase: int, labels: Any) -> Any:
        # the index info less its carry: the carry is structural (``h + (x - h)`` carries h)
        # and would keep a recomputation of ``x`` apart from ``x`` itself
        index = None if labels is None else (labels.labels, labels.pending, labels.maxpend)
        return (self.hasher(term)[0], t.shape, phase, index)


class BlockValues:
    """Per-value state of a partial block graph, a stack indexed by value id.

    Each value has a sid (``Identities``): every check the DFS applies to an op is a function
    of its operands' sids, so sids key its memo and the native DFS knows values by them.
    """

    def __init__(self, ids: Identities | None = None) -> None:
        self.types: list[TensorType] = []
        self.terms: list[Any] = []
        self.phase: list[int] = []
        self.uses: list[int] = []
        self.index: list[Any] = []
        self.sid: list[int] = []
        self.ids = ids if ids is not None else Identities()
        self.ident = self.ids.ident
        self.sig_id = self.ids.sig_id
        self.hasher = self.ids.hasher
        self.intern = self.ids.intern
        self.sig = self.ids.sig
        self._sig: list[Any] = []
        self._sig_count: dict[Any, int] = {}

    def __len__(self) -> int:
        return len(self.types)

    def push(self, t: TensorType, term: Any, phase: int, labels: Any = None) -> int:
        """Add a value; its id."""
        self.types.append(t)
        self.terms.append(term)
        self.phase.append(phase)
        self.uses.append(0)
        self.index.append(labels)
        sig = self.sig(t, term, phase, labels)
        self._sig.append(sig)
        self._sig_count[sig] = self._sig_count.get(sig, 0) + 1
        self.sid.append(self.intern(t, term, phase, labels))
        return len(self.types) - 1

    def pop(self) -> None:
        """Drop the last value (the interned identities stay: they are keys, not state)."""
        sig = self._sig.pop()
        self._sig_count[sig] -= 1
        for lst in (self.types, self.terms, self.phase, self.uses, self.index, self.sid):
            lst.pop()

    def computed(self, sig: Any) -> bool:
        """Does a value with this signature exist?"""
        return self._sig_count.get(sig, 0) > 0

    def is_constant(self, term: Any) -> bool:
        """A term without inputs in effect (``x - x``): both evaluations agree."""
        h0, h1 = self.hasher(term)
        return h0 == h1 and term.head != "var"

    def redundant(self, t: TensorType, term: Any, phase: int, labels: Any) -> bool:
        """A value already computed, or a constant (see ``TermHasher``)."""
        return self.is_constant(term) or self.computed(self.sig(t, term, phase, labels))

    def dangling(self) -> list[int]:
        """The values nothing uses yet."""
        return [v for v, u in enumerate(self.uses) if u == 0]
