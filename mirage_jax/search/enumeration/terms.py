"""What the enumeration reads off abstract terms: value numbering (``TermHasher``), max-shifted
exps (``is_max_shifted``, ``shifted_exps``) and the inputs a term needs (``vars_needed``)."""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from typing import Any

from mirage_jax.ir.graph import KernelGraph
from mirage_jax.ir.ops import Op
from mirage_jax.search import abstract

# ---------------------------------------------------------------------------------------------
# value numbering of abstract terms


_HASH_P = (1 << 61) - 1  # a Mersenne prime: exact modular arithmetic on Python ints


def _mix64(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & ((1 << 64) - 1)
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & ((1 << 64) - 1)
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & ((1 << 64) - 1)
    return x ^ (x >> 31)


class TermHasher:
    """The value of an abstract term at a random point mod a large prime (Schwartz-Zippel).

    Terms with equal values are equal as functions with high probability: this numbers
    values, so that the enumeration can drop a new tensor that recomputes an existing one
    (``h + (x - h)``) or a constant (``x - x``). Two evaluations with independent inputs tell
    constants apart. exp, sqrt, rmax, max, sum, concat and named functions are uninterpreted
    (a hash of their argument's value): equal terms still get equal values, which is all the
    numbering needs. A sum must be: as ``n * x`` it would make ``x / sum(x)`` (softmax, an
    L1 normalisation) the constant ``1/n``, which it is only on rows of equal values.
    """

    def __init__(self, seed: int = 0x5EED) -> None:
        self.seed = seed
        self._memo: dict[Any, tuple[int, int]] = {}

    def __call__(self, term: Any) -> tuple[int, int]:
        memo = self._memo
        got = memo.get(term)
        if got is not None:
            return got
        stack = [term]
        while stack:
            t = stack[-1]
            if t in memo:
                stack.pop()
                continue
            todo = [a for a in t.args if a not in memo]
            if todo:
                stack.extend(todo)
                continue
            stack.pop()
            memo[t] = tuple(self._node(t, [memo[a][k] for a in t.args], k) for k in (0, 1))
        return memo[term]

    def _node(self, t: Any, args: list[int], k: int) -> int:
        P, h = _HASH_P, t.head
        if h == "var":
            return _mix64(self.seed * 1_000_003 + int(t.param) * 2 + k) % P
        if h == "const":
            q = t.param
            return q.numerator % P * pow(q.denominator % P, -1, P) % P
        if h == "add":
            return sum(args) % P
        if h == "mul":
            out = 1
            for a in args:
                out = out * a % P
            return out
        if h == "inv":
            return pow(args[0], -1, P) if args[0] else 0
        tag = zlib_crc(f"{h}:{t.param}")
        if h == "max":
            args = sorted(args)
        acc = tag
        for a in args:
            acc = _mix64(acc ^ a)
        return acc % P


def zlib_crc(text: str) -> int:
    return zlib.crc32(text.encode())


# ---------------------------------------------------------------------------------------------
# numerical safety of exp


def is_max_shifted(term: Any) -> bool:
    """Is ``term`` of the form ``x - max(x)`` (bounded above by 0, so its exp cannot overflow)?

    The field sees ``exp(s) / exp(max s)`` and ``exp(s - max s)`` as equal (they are); floats
    do not. When every exp of the target is max-shifted, the enumeration only allows exps of
    max-shifted values, rather than finding and then float-rejecting the unshifted forms.
    A tile's max, the loop's max and the row max share one abstract term (``rmax``), so the
    online-softmax ``exp(s_tile - max_tile)`` passes."""
    if term.head != "add":
        return False
    for k, a in enumerate(term.args):
        if (a.head == "mul" and len(a.args) == 2 and a.args[0].head == "rmax"
                and a.args[1].head == "const" and a.args[1].param == -1):  # fmt: skip
            rest = term.args[:k] + term.args[k + 1 :]
            inner = a.args[0].args[0]
            if len(rest) == 1 and rest[0] == inner:
                return True
            if len(rest) > 1 and inner.head == "add" and tuple(sorted(rest, key=str)) == tuple(
                sorted(inner.args, key=str)
            ):
                return True
    return False


def shifted_exps(target: KernelGraph) -> bool:
    """True when the target has exps and every one of them takes a max-shifted value."""
    terms = abstract.kernel_terms(target)
    exps = target.nodes_of(Op.EXP)
    return bool(exps) and all(is_max_shifted(terms[n.ins[0]]) for n in exps)


# ---------------------------------------------------------------------------------------------
# inputs


def vars_needed(terms: Sequence[Any]) -> set[int]:
    """The kernel inputs (``var`` indices) the terms read."""
    found: set[int] = set()
    for t in terms:
        found.update(int(s.param) for s in t.subterms() if s.head == "var")
    return found
