"""Index analysis: a second, index-aware abstraction of the target that rules out candidate ops.

``IndexAnalysis`` finds the target's index classes and reduction events; ``IndexChecker`` is
its candidate side, which both DFS levels call for every proposed op (see ``IndexAnalysis``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from mirage_jax.ir.graph import KernelGraph
from mirage_jax.ir.ops import ACCUMULATORS, REDUCTIONS, UNARY, Op
from mirage_jax.ir.types import TensorType
from mirage_jax.search.enumeration.rules import N


class Conflict(Exception):
    """An op that the index analysis rules out (see ``IndexAnalysis``)."""


_NONLINEAR = frozenset(UNARY - {Op.NEG, Op.MUL_SCALAR}) | {Op.MAX, Op.REDUCE_MAX, Op.ACC_MAX}
_MAXES = frozenset({Op.REDUCE_MAX, Op.ACC_MAX})


@dataclass(frozen=True)
class IndexInfo:
    """What the index analysis knows about one tensor.

    ``labels``: per dim, the index class it ranges over (None for size-1 dims), or
    ``("fold", C)``: a loop accumulator summed the loop part of class C, the in-tile part is
    still to be summed. ``carry``: ((class, input var), multiplicity) - how often each input
    occurs with an index of that class not yet reduced (x*x carries x's row class twice).
    ``pending``: classes of partial sums (a tile's share of a loop-split reduction) that a
    loop accumulator must still complete. ``maxpend``: classes of partial maxima (a tile's
    max over a loop-split class) the value depends on: only ``acc_rescale_sum`` (online
    softmax) may accumulate such a value over the loop, since the per-tile shift does not
    cancel in a plain sum.
    """

    labels: tuple[Any, ...]
    carry: tuple[tuple[tuple[Any, int], int], ...] = ()
    pending: frozenset[Any] = frozenset()
    maxpend: frozenset[Any] = frozenset()


def _carry_of(carry: tuple, cls: Any) -> tuple[tuple[int, int], ...]:
    """The multiset of input vars carrying class ``cls`` (labels already canonical)."""
    return tuple(sorted((var, m) for (c, var), m in carry if c == cls))


def _carry_merge(infos: Sequence[IndexInfo], how: str) -> tuple:
    acc: dict[tuple[Any, int], int] = {}
    for info in infos:
        for key, m in info.carry:
            acc[key] = acc.get(key, 0) + m if how == "add" else max(acc.get(key, 0), m)
    return tuple(sorted(acc.items(), key=repr))


def _carry_drop(carry: tuple, cls: Any) -> tuple:
    return tuple(item for item in carry if item[0][0] != cls)


class IndexAnalysis:
    """Index classes of the target, and the checks a candidate's ops must pass.

    Every input dim of size > 1 is an index. Walking the target, elementwise ops identify the
    indices of aligned dims, matmul identifies its contraction dims and its batch dims: the
    classes of that union-find are the target's index classes. The size-only abstract
    expressions cannot see indices (``sum-pull`` holds there without its side condition), so
    they accept e.g. ``x * sum_k(w)`` for ``sum_k(x * w)``; this analysis rejects

    - an elementwise op or contraction that aligns two different classes;
    - a reduction *event* the target does not have: an event is (sum or max, class, the
      multiset of inputs carrying that class in the reduced tensor): ``sum_k(x)`` is not an
      event of ``sum_k(x * g * w)``; a tile's share of a loop-split reduction is checked the
      same way, and the loop accumulator then completes it;
    - a loop whose split dims are of different classes (the loop couples them);
    - a partial sum used non-linearly before its accumulator completes it (``silu`` of a
      tile's share of a matmul), or two partial sums multiplied;
    - a saved value whose dims do not carry the target output's classes, or that is partial.

    This is a pruning heuristic grounded in index semantics, not a theorem: a candidate that
    equals the target only through distributing a sum over an addition
    (``sum(a + b) -> sum(a) + sum(b)``) has events the target lacks and is pruned. It is on
    with ``prune`` and checked by the pruning-soundness test against the unpruned search.
    ``enabled`` is False (no checks) for targets with concat, graph_def or thread nodes, or a
    reshape other than adding/removing size-1 dims.
    """

    def __init__(self, target: KernelGraph) -> None:
        self.parent: dict[Any, Any] = {}
        self.enabled = True
        self._events: list[tuple[str, Any, Any]] = []
        infos: dict[int, IndexInfo] = {}
        for k, n in enumerate(target.inputs):
            infos[n.outs[0]] = self._input_info(k, target.types[n.outs[0]])
        self._walk_target(target, infos)
        if not self.enabled:
            return
        self.inputs = [self._canon(infos[n.outs[0]]) for n in target.inputs]
        self.outputs = [self._canon(infos[n.ins[0]]).labels for n in target.outputs]
        # classes may merge after an event was recorded: name each by its final root
        self.events = frozenset((kind, self._find(c), carry) for kind, c, carry in self._events)

    def _input_info(self, k: int, t: TensorType) -> IndexInfo:
        labels = tuple((k, d) if s > 1 else None for d, s in enumerate(t.shape))
        for lab in labels:
            if lab is not None:
                self.parent[lab] = lab
        carry = tuple(((lab, k), 1) for lab in labels if lab is not None)
        return IndexInfo(labels, carry)

    def _walk_target(self, target: KernelGraph, infos: dict[int, IndexInfo]) -> None:
        for n in target.nodes:
            if n.op in (Op.INPUT, Op.OUTPUT):
                continue
            shapes = [target.types[i].shape for i in n.ins]
            ins = [self._canon(infos[i]) for i in n.ins]
            try:
                out = index_step(n.op, n.attr_dict, ins, shapes,
                                 target.types[n.outs[0]].shape, self._union, self._record)
            except Conflict:  # not expected of a target: analyse nothing rather than guess
                out = None
            if out is None:
                self.enabled = False
                return
            infos[n.outs[0]] = self._canon(out)

    def _record(self, kind: str, cls: Any, carry: Any) -> None:
        if cls is not None:
            root = self._find(cls)
            self._events.append((kind, root, _carry_of(self._canon_carry(carry), root)))

    def _find(self, a: Any) -> Any:
        while self.parent[a] != a:
            a = self.parent[a]
        return a

    def _union(self, a: Any, b: Any) -> Any:
        if a is None or b is None:
            return a if b is None else b
        ra, rb = self._find(a), self._find(b)
        if ra != rb:
            self.parent[max(ra, rb)] = min(ra, rb)
        return min(ra, rb)

    def _canon(self, info: IndexInfo) -> IndexInfo:
        labels = tuple(None if x is None else self._find(x) for x in info.labels)
        return IndexInfo(labels, self._canon_carry(info.carry), info.pending)

    def _canon_carry(self, carry: tuple) -> tuple:
        out: dict[tuple[Any, int], int] = {}
        for (c, var), m in carry:
            key = (self._find(c), var)
            out[key] = max(out.get(key, 0), m)
        return tuple(sorted(out.items(), key=repr))

    def checker(self, loop_class: Any = None) -> IndexChecker:
        return IndexChecker(self.events, loop_class)


class IndexChecker:
    """The candidate side of ``IndexAnalysis``: ``step`` raises ``Conflict`` or returns the
    result's ``IndexInfo``; memoized, since the same op on the same infos recurs constantly."""

    def __init__(self, events: frozenset, loop_class: Any = None) -> None:
        self.events = events
        self.loop_class = loop_class
        self._memo: dict[Any, IndexInfo | None] = {}

    def step(self, op, attrs, infos, shapes, out_shape, body: bool = False) -> IndexInfo:
        key = (op, attrs, tuple(infos), tuple(shapes), body)
        if key in self._memo:
            out = self._memo[key]
            if out is None:
                raise Conflict
            return out
        loop_class = self.loop_class if body else None
        try:
            out = index_step(op, dict(attrs), list(infos), list(shapes), out_shape,
                             _check_unify, self._event, loop_class)  # fmt: skip
        except Conflict:
            self._memo[key] = None
            raise
        if out is None:  # outside the analysed fragment: no constraint on its users
            out = IndexInfo((None,) * len(out_shape))
        self._memo[key] = out
        return out

    def _event(self, kind: str, cls: Any, carry: Any) -> None:
        if cls is not None and (kind, cls, _carry_of(carry, cls)) not in self.events:
            raise Conflict


def _check_unify(a: Any, b: Any) -> Any:
    if a is None or b is None:
        return a if b is None else b
    if a != b:
        raise Conflict
    return a


def index_step(
    op, attrs, infos, shapes, out_shape, unify, event, loop_class=None
) -> IndexInfo | None:
    """The IndexInfo of an op's result. ``unify`` merges (target) or checks (candidate) aligned
    classes, ``event(kind, class, carry)`` records or checks a reduction; ``loop_class`` is
    the class a block's for-loop splits when the op is in the loop body. None: the op is
    outside the analysed fragment."""
    if op in (Op.CONCAT, Op.SLICE, Op.GRAPH_DEF, Op.THREAD):
        return None
    pend = frozenset().union(*(i.pending for i in infos)) if infos else frozenset()
    if pend and op in _NONLINEAR:
        raise Conflict  # a partial sum must reach its accumulator linearly
    if op in REDUCTIONS:
        return _reduce(op, attrs, infos[0], shapes[0], event, loop_class)
    if op in ACCUMULATORS:
        return _accumulate(op, attrs, infos, shapes, out_shape, unify, event, loop_class)
    if op is Op.MATMUL:
        return _matmul_info(infos, shapes, unify, event, loop_class)
    if op is Op.TRANSPOSE:
        info = infos[0]
        return IndexInfo(tuple(info.labels[p] for p in attrs["perm"]), info.carry, info.pending,
                         info.maxpend)
    if op is Op.RESHAPE:
        info = infos[0]
        if [s for s in shapes[0] if s > 1] != [s for s in out_shape if s > 1]:
            return None
        it = iter([x for x, s in zip(info.labels, shapes[0]) if s > 1])
        labels = tuple(next(it) if s > 1 else None for s in out_shape)
        return IndexInfo(labels, info.carry, info.pending, info.maxpend)
    if op is Op.ADD_SCALAR and pend:
        raise Conflict  # adding a constant to every partial sum adds it R times
    if op in (Op.ADD, Op.SUB) and len({i.pending for i in infos}) > 1:
        raise Conflict  # a partial sum plus a complete value
    if op in (Op.MUL, Op.DIV) and (
        sum(bool(i.pending) for i in infos) > 1 or (op is Op.DIV and infos[1].pending)
    ):
        raise Conflict  # a product of partial sums, or a division by one
    labels = _elementwise_labels(infos, shapes, out_shape, unify)
    how = "add" if op in (Op.MUL, Op.DIV) or op is Op.SQUARE else "max"
    if op is Op.SQUARE:
        infos = [infos[0], infos[0]]
    return IndexInfo(labels, _carry_merge(infos, how), pend, _maxpend(infos))


def _maxpend(infos: Sequence[IndexInfo]) -> frozenset[Any]:
    return frozenset().union(*(i.maxpend for i in infos)) if infos else frozenset()


def _elementwise_labels(infos, shapes, out_shape, unify) -> tuple[Any, ...]:
    """The labels of an elementwise result. A size-1 dim with a class is a tile holding one
    index of it (a loop split as fine as the extent): broadcast against a range of that
    class it pairs one index with all of them, which no target has (its size-1 dims carry
    no class), and its class stays on the result so that a later op still sees it."""
    if len(infos) == 1:
        return infos[0].labels
    out = []
    for d, s in enumerate(out_shape):
        lab = None
        for info, sh in zip(infos, shapes):
            x = info.labels[d]
            if x is not None and (sh[d] > 1) == (s > 1):
                lab = x if lab is None else unify(lab, x)
        if s > 1 and any(sh[d] == 1 and i.labels[d] is not None for i, sh in zip(infos, shapes)):
            raise Conflict
        out.append(lab)
    return tuple(out)


def _class_of(label: Any) -> tuple[Any, bool]:
    """(class, folded) of a label."""
    if isinstance(label, tuple) and len(label) == 2 and label[0] == "fold":
        return label[1], True
    return label, False


def _reduce(op, attrs, info: IndexInfo, shape, event, loop_class) -> IndexInfo:
    kind = "max" if op in _MAXES else "sum"
    dim = attrs["dim"]
    cls, folded = _class_of(info.labels[dim])
    if folded and kind == "max":
        raise Conflict
    if info.pending and kind == "max":
        raise Conflict
    mult = 2 if op is Op.REDUCE_RMS else 1
    carry = tuple((k, m * mult) for k, m in info.carry)
    event(kind, cls, carry)
    labels = tuple(None if d == dim else x for d, x in enumerate(info.labels))
    pending, maxpend = info.pending, info.maxpend
    if cls is not None and cls == loop_class and not folded:
        if kind == "sum":
            pending = pending | {cls}  # a tile's share of a loop-split sum
        else:
            maxpend = maxpend | {cls}  # a tile's share of a loop-split max
    return IndexInfo(labels, _carry_drop(carry, cls), pending, maxpend)


def _matmul_info(infos, shapes, unify, event, loop_class) -> IndexInfo:
    a, b = infos
    sa, sb = shapes
    if a.pending and b.pending:
        raise Conflict
    # batch dims broadcast as an elementwise op's do (one loop index against a range: Conflict)
    batch = _elementwise_labels(
        [IndexInfo(a.labels[:-2]), IndexInfo(b.labels[:-2])], [sa[:-2], sb[:-2]],
        tuple(max(x, y) for x, y in zip(sa[:-2], sb[:-2])), unify,
    )  # fmt: skip
    carry = _carry_merge(infos, "add")
    pending = a.pending | b.pending
    maxpend = a.maxpend | b.maxpend
    cls = None
    if sa[-1] > 1 and sb[-2] > 1:
        cls = unify(a.labels[-1], b.labels[-2])
        c, folded = _class_of(cls)
        if folded:
            raise Conflict
        event("sum", c, carry)
        carry = _carry_drop(carry, c)
        if c is not None and c == loop_class:
            pending = pending | {c}
    return IndexInfo(batch + (a.labels[-2], b.labels[-1]), carry, pending, maxpend)


def _accumulate(op, attrs, infos, shapes, out_shape, unify, event, loop_class) -> IndexInfo:
    """A loop accumulator: completes a partial sum over the loop class, or folds it."""
    kind = "max" if op in _MAXES else "sum"
    x = infos[0]
    if loop_class is not None and loop_class in x.maxpend and op not in (
        Op.ACC_RESCALE_SUM, Op.ACC_MAX
    ):
        raise Conflict  # a per-tile max shift summed without rescaling
    if op is Op.ACC_RESCALE_SUM:
        if loop_class is not None and loop_class not in infos[1].maxpend:
            raise Conflict  # the rescale operand must be the tile's share of the loop max
        labels = _elementwise_labels(infos, shapes, out_shape, unify)
        info = IndexInfo(labels, x.carry, x.pending)
    else:
        info = x  # acc_max completes the partial max: maxpend is dropped below
    mult = 2 if op is Op.ACC_RMS else 1
    carry = tuple((k, m * mult) for k, m in info.carry)
    labels, pending = list(info.labels), set(info.pending)
    dim = attrs.get("dim", N)
    if dim != N:
        cls, folded = _class_of(labels[dim])
        if folded:
            raise Conflict
        if cls == loop_class:  # the tile share and the loop together: one reduction
            event(kind, cls, carry)
        else:
            event(kind, cls, carry)
            if loop_class is not None and loop_class not in pending and kind == "sum":
                raise Conflict
        carry = _carry_drop(carry, cls)
        labels[dim] = None
        pending.discard(loop_class)
        return IndexInfo(tuple(labels), carry, frozenset(pending))
    if kind == "sum" and loop_class in pending:
        pending.discard(loop_class)
        return IndexInfo(tuple(labels), carry, frozenset(pending))
    if loop_class is not None and loop_class in labels:
        d = labels.index(loop_class)
        if kind == "max" or shapes[0][d] == 1:  # a one-index tile: the loop sums them all
            event(kind, loop_class, carry)
            labels[d] = None  # an elementwise max over chunks, then reduced: the same max
            return IndexInfo(tuple(labels), _carry_drop(carry, loop_class), frozenset(pending))
        labels[d] = ("fold", loop_class)
        return IndexInfo(tuple(labels), carry, frozenset(pending))
    if kind == "max" and loop_class is not None:
        return IndexInfo(tuple(labels), carry, frozenset(pending))  # a max of tile maxima
    if loop_class is None:
        return IndexInfo(tuple(labels), carry, frozenset(pending))
    raise Conflict  # summing over iterations something the loop index does not reach


def labels_match(have: IndexInfo | None, want: tuple[Any, ...] | None) -> bool:
    """Can a value with index info ``have`` be saved as an output of classes ``want``? (It
    must be complete, and no dim may carry another class; None on either side: no check.)"""
    if have is None or want is None:
        return True
    if have.pending or have.maxpend:
        return False
    return all(a is None or b is None or a == b for a, b in zip(have.labels, want))
