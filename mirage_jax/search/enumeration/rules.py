"""The op rules both DFS levels share: canonical-order keys, value phases, fast shape rules.

The shape rules return None when an op does not apply; they only steer the enumeration, the
IR's checking builders re-check every graph it produces.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from mirage_jax.ir.ops import BINARY, MASKED, NONE_DIM, SCALAR_UNARY, UNARY, Op

OP_RANK: dict[Op, int] = {op: i for i, op in enumerate(Op)}
COMMUTATIVE = frozenset(op for op in Op if op.info.commutative)
# binary ops whose application to one value twice is that value or a constant (x - x, x / x,
# max(x, x)): the enumeration never proposes them
TRIVIAL_ON_ITSELF = frozenset(op for op in Op if op.info.trivial_on_itself)
INV, BODY, EPI = 0, 1, 2  # value phases (ir.graph.Phase values)
N = NONE_DIM

Shape = tuple[int, ...]
Attrs = tuple[tuple[str, Any], ...]


_BCAST: dict[tuple[Any, Any], Any] = {}


def bcast(a: Shape, b: Shape) -> Shape | None:
    """The broadcast of two shapes of one rank (memoized: the same pairs recur constantly)."""
    key = (a, b)
    try:
        return _BCAST[key]
    except KeyError:
        pass
    out = _BCAST[key] = _bcast_fresh(a, b)
    return out


def _bcast_fresh(a: Shape, b: Shape) -> Shape | None:
    if len(a) != len(b):
        return None
    out = []
    for x, y in zip(a, b):
        if x == y or y == 1:
            out.append(x)
        elif x == 1:
            out.append(y)
        else:
            return None
    return tuple(out)


def matmul_shape(a: Shape, b: Shape) -> Shape | None:
    if len(a) < 2 or len(a) != len(b) or a[:-2] != b[:-2] or a[-1] != b[-2]:
        return None
    return a[:-1] + (b[-1],)


def reduced(a: Shape, dim: int) -> Shape:
    return a[:dim] + (1,) + a[dim + 1 :]


def concat_shape(a: Shape, b: Shape, dim: int) -> Shape | None:
    if len(a) != len(b) or any(x != y for i, (x, y) in enumerate(zip(a, b)) if i != dim):
        return None
    return a[:dim] + (a[dim] + b[dim],) + a[dim + 1 :]


def prod(shape: Shape) -> int:
    out = 1
    for s in shape:
        out *= s
    return out


_ATTR_KEYS: dict[Any, tuple[Any, ...]] = {}


def attr_key(attrs: Attrs) -> tuple[Any, ...]:
    """The attribute values of an op, as the canonical-order key compares them (memoized)."""
    try:
        return _ATTR_KEYS[attrs]
    except KeyError:
        out = _ATTR_KEYS[attrs] = tuple(v for _, v in attrs)
        return out


def unary_vocabulary(
    ops: Iterable[Op], scalars: Mapping[Op, tuple[float, ...]]
) -> list[tuple[Op, list[Attrs]]]:
    """(op, attribute sets) for every unary op of ``ops``: a scalar op once per candidate
    scalar (none: left out), any other unary op once without attributes."""
    unary = []
    for op in ops:
        if op in SCALAR_UNARY:
            name = op.info.scalar_attr
            vals = scalars.get(op, ())
            if vals:
                unary.append((op, [((name, v),) for v in vals]))
        elif op in UNARY:
            unary.append((op, [()]))
    return unary


def binary_vocabulary(
    ops: Iterable[Op], scalars: Mapping[Op, tuple[float, ...]]
) -> list[tuple[Op, list[Attrs]]]:
    """(op, attribute sets) for every binary op of ``ops``: a mask op once per fill the target
    uses (none: left out), any other once without attributes."""
    binary = []
    for op in ops:
        if op in MASKED:
            fills = scalars.get(op, ())
            if fills:
                binary.append((op, [(("fill", v),) for v in fills]))
        elif op in BINARY:
            binary.append((op, [()]))
    return binary
