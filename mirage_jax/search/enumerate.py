"""Enumerating μGraphs: kernel graphs grown op by op, block graphs for graph-defined kernels.

The search space (bounds in ``SearchConfig``, concrete candidates in ``SearchSpace``):

**Kernel level.** Graphs are grown from the target's inputs one op at a time: pre-defined ops
from the target's vocabulary, and one graph-defined kernel whose operands the search chooses
among the existing tensors (any sorted subset, up to ``max_graph_def_inputs``). A graph is
complete when its outputs are the target's outputs and every other tensor is used.

**Block level** (one graph_def). An enumeration *task* fixes the operands and the loop
structure: which dim of each operand the for-loop splits (``fdim``, or none), and a
representative loop range. The DFS then adds block ops one at a time: compute ops on tiles and
for-loop accumulators, then epilogue ops, and completes when output savers can save exactly
the target's outputs. The DFS runs on a *representative tiling*: grid (1,1,1), so the
abstract terms (which do not depend on the grid, see ``abstract``) and the op skeleton are
found once; ``instantiate`` then derives every concrete (grid, imap, omap, forloop range)
for a found skeleton by propagating grid splits through its ops (a split must follow a
non-reduced dim from operands to every saved output), and rebuilds each one with the IR's
checking builders. Skeletons valid only at some concrete tiling but not at the representative
one (e.g. a broadcast that needs a tile dim of 1) are outside this space.

**Canonical order.** Each new op gets a key ``(stage, op, attrs, operands)`` where the stage is
0 for loop-invariant ops, 1 for loop-body ops, 2 for accumulators, 3 for epilogue ops. A new op
is accepted only if its key is greater than the previous op's key or it uses the previous op's
result, and it is not a copy of an existing op. Every dataflow graph has such an order (sort
any topological order by swapping adjacent independent ops whose keys are inverted: the
sequence of keys decreases lexicographically, so this ends), so nothing is lost; and most
graphs are generated once (duplicates that slip through are removed by fingerprint).

**Pruning** (each sound with respect to the space above):
- abstract expressions: a new tensor whose term is not a subexpression of the target modulo
  the axioms (``SubexprOracle.contains``) is dropped (``prune=False`` turns this off);
- dead code: a graph needs every tensor used; with ``d`` unused tensors, ``r`` ops left and
  ``m`` outputs, a branch with ``d - r > m`` cannot finish (an op uses at most one more unused
  tensor than it creates); loop-body tensors still unused when the epilogue begins are dead;
- phases: accumulators take loop-body values only; body and epilogue values never mix.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from mirage_jax.errors import GraphError, SearchError
from mirage_jax.ir.graph import BlockBuilder, BlockGraph, KernelBuilder, KernelGraph
from mirage_jax.ir.ops import (
    ACCUMULATORS,
    BINARY,
    NONE_DIM,
    REDUCTIONS,
    SCALAR_UNARY,
    UNARY,
    Op,
)
from mirage_jax.ir.shapes import BlockContext
from mirage_jax.ir.types import TensorType

OP_RANK: dict[Op, int] = {op: i for i, op in enumerate(Op)}
COMMUTATIVE = frozenset({Op.ADD, Op.MUL, Op.MAX})
INV, BODY, EPI = 0, 1, 2  # value phases (ir.graph.Phase values)
N = NONE_DIM


class _Stop(Exception):
    """Raised inside a DFS when its state or time budget is spent."""


@dataclass
class Counters:
    """What one enumeration did (summed over tasks into the SearchReport)."""

    states: int = 0  # partial graphs visited
    proposed: int = 0  # op applications that type-checked
    pruned_abstract: int = 0  # dropped: term not a subexpression of the target
    pruned_dead: int = 0  # dropped: could not use every tensor within the op bound
    pruned_index: int = 0  # dropped: aligns index classes the target keeps apart
    pruned_duplicate: int = 0  # dropped: recomputes an existing tensor or a constant
    pruned_numeric: int = 0  # dropped: an exp of an unshifted value (see shifted_exps)
    complete: int = 0  # complete skeletons found
    truncated: bool = False  # stopped by max_states or the deadline

    def add(self, other: Counters) -> None:
        self.states += other.states
        self.proposed += other.proposed
        self.pruned_abstract += other.pruned_abstract
        self.pruned_dead += other.pruned_dead
        self.pruned_index += other.pruned_index
        self.pruned_duplicate += other.pruned_duplicate
        self.pruned_numeric += other.pruned_numeric
        self.complete += other.complete
        self.truncated |= other.truncated


# ---------------------------------------------------------------------------------------------
# fast shape rules (None when the op does not apply); the IR's builders re-check every graph


_BCAST: dict[tuple[Any, Any], Any] = {}


def _bcast(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...] | None:
    key = (a, b)
    try:
        return _BCAST[key]
    except KeyError:
        pass
    out = _BCAST[key] = _bcast_fresh(a, b)
    return out


def _bcast_fresh(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...] | None:
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


def _matmul_shape(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...] | None:
    if len(a) < 2 or len(a) != len(b) or a[:-2] != b[:-2] or a[-1] != b[-2]:
        return None
    return a[:-1] + (b[-1],)


def _reduced(a: tuple[int, ...], dim: int) -> tuple[int, ...]:
    return a[:dim] + (1,) + a[dim + 1 :]


def _concat_shape(a: tuple[int, ...], b: tuple[int, ...], dim: int) -> tuple[int, ...] | None:
    if len(a) != len(b) or any(x != y for i, (x, y) in enumerate(zip(a, b)) if i != dim):
        return None
    return a[:dim] + (a[dim] + b[dim],) + a[dim + 1 :]


_ATTR_KEYS: dict[Any, tuple[Any, ...]] = {}


def _attr_key(attrs: tuple[tuple[str, Any], ...]) -> tuple[Any, ...]:
    try:
        return _ATTR_KEYS[attrs]
    except KeyError:
        out = _ATTR_KEYS[attrs] = tuple(v for _, v in attrs)
        return out


# ---------------------------------------------------------------------------------------------
# the term machinery (abstract expressions), imported lazily so this module loads without egglog


def _abstract() -> Any:
    from mirage_jax.search import abstract

    return abstract


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
    constants apart. exp, sqrt, rmax, max, concat and named functions are uninterpreted (a
    hash of their argument's value): equal terms still get equal values, which is all the
    numbering needs.
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
        if h == "sum":
            return int(t.param) * args[0] % P
        tag = zlib_crc(f"{h}:{t.param}")
        if h == "max":
            args = sorted(args)
        acc = tag
        for a in args:
            acc = _mix64(acc ^ a)
        return acc % P


def zlib_crc(text: str) -> int:
    import zlib

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
    ab = _abstract()
    terms = ab.kernel_terms(target)
    exps = target.nodes_of(Op.EXP)
    return bool(exps) and all(is_max_shifted(terms[n.ins[0]]) for n in exps)


# ---------------------------------------------------------------------------------------------
# index analysis: a second, index-aware abstraction


class _Conflict(Exception):
    """An op that the index analysis rules out (see ``IndexAnalysis``)."""


_NONLINEAR = frozenset(UNARY - {Op.NEG, Op.MUL_SCALAR}) | {Op.MAX, Op.REDUCE_MAX, Op.ACC_MAX}
_MAXES = frozenset({Op.REDUCE_MAX, Op.ACC_MAX})
_SUM_ACCS = frozenset({Op.ACC_SUM, Op.ACC_MEAN, Op.ACC_RMS, Op.ACC_RESCALE_SUM})


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
            out = index_step(n.op, n.attr_dict, ins, shapes, target.types[n.outs[0]].shape,
                             self._union, self._record)  # fmt: skip
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
    """The candidate side of ``IndexAnalysis``: ``step`` raises ``_Conflict`` or returns the
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
                raise _Conflict
            return out
        try:
            out = index_step(op, dict(attrs), list(infos), list(shapes), out_shape,
                             _check_unify, self._event, self.loop_class if body else None)  # fmt: skip
        except _Conflict:
            self._memo[key] = None
            raise
        if out is None:  # outside the analysed fragment: no constraint on its users
            out = IndexInfo((None,) * len(out_shape))
        self._memo[key] = out
        return out

    def _event(self, kind: str, cls: Any, carry: Any) -> None:
        if cls is not None and (kind, cls, _carry_of(carry, cls)) not in self.events:
            raise _Conflict


def _check_unify(a: Any, b: Any) -> Any:
    if a is None or b is None:
        return a if b is None else b
    if a != b:
        raise _Conflict
    return a


def index_step(
    op, attrs, infos, shapes, out_shape, unify, event, loop_class=None
) -> IndexInfo | None:
    """The IndexInfo of an op's result. ``unify`` merges (target) or checks (candidate) aligned
    classes, ``event(kind, class, carry)`` records or checks a reduction; ``loop_class`` is
    the class a block's for-loop splits when the op is in the loop body. None: the op is
    outside the analysed fragment."""
    if op in (Op.CONCAT, Op.GRAPH_DEF, Op.THREAD):
        return None
    pend = frozenset().union(*(i.pending for i in infos)) if infos else frozenset()
    if pend and op in _NONLINEAR:
        raise _Conflict  # a partial sum must reach its accumulator linearly
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
        raise _Conflict  # adding a constant to every partial sum adds it R times
    if op in (Op.ADD, Op.SUB) and len({i.pending for i in infos}) > 1:
        raise _Conflict  # a partial sum plus a complete value
    if op in (Op.MUL, Op.DIV) and (
        sum(bool(i.pending) for i in infos) > 1 or (op is Op.DIV and infos[1].pending)
    ):
        raise _Conflict  # a product of partial sums, or a division by one
    labels = _elementwise_labels(infos, shapes, out_shape, unify)
    how = "add" if op in (Op.MUL, Op.DIV) or op is Op.SQUARE else "max"
    if op is Op.SQUARE:
        infos = [infos[0], infos[0]]
    return IndexInfo(labels, _carry_merge(infos, how), pend, _maxpend(infos))


def _maxpend(infos: Sequence[IndexInfo]) -> frozenset[Any]:
    return frozenset().union(*(i.maxpend for i in infos)) if infos else frozenset()


def _elementwise_labels(infos, shapes, out_shape, unify) -> tuple[Any, ...]:
    if len(infos) == 1:
        return infos[0].labels
    out = []
    for d, s in enumerate(out_shape):
        lab = None
        for info, sh in zip(infos, shapes):
            if sh[d] > 1:
                x = info.labels[d]
                lab = x if lab is None else unify(lab, x)
        out.append(lab if s > 1 else None)
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
        raise _Conflict
    if info.pending and kind == "max":
        raise _Conflict
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
        raise _Conflict
    batch = tuple(
        unify(x, y) if sa[d] > 1 and sb[d] > 1 else (x if sa[d] > 1 else y)
        for d, (x, y) in enumerate(zip(a.labels[:-2], b.labels[:-2]))
    )  # fmt: skip
    carry = _carry_merge(infos, "add")
    pending = a.pending | b.pending
    maxpend = a.maxpend | b.maxpend
    cls = None
    if sa[-1] > 1 and sb[-2] > 1:
        cls = unify(a.labels[-1], b.labels[-2])
        c, folded = _class_of(cls)
        if folded:
            raise _Conflict
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
        raise _Conflict  # a per-tile max shift summed without rescaling
    if op is Op.ACC_RESCALE_SUM:
        if loop_class is not None and loop_class not in infos[1].maxpend:
            raise _Conflict  # the rescale operand must be the tile's share of the loop max
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
            raise _Conflict
        if cls == loop_class:  # the tile share and the loop together: one reduction
            event(kind, cls, carry)
        else:
            event(kind, cls, carry)
            if loop_class is not None and loop_class not in pending and kind == "sum":
                raise _Conflict
        carry = _carry_drop(carry, cls)
        labels[dim] = None
        pending.discard(loop_class)
        return IndexInfo(tuple(labels), carry, frozenset(pending))
    if kind == "sum" and loop_class in pending:
        pending.discard(loop_class)
        return IndexInfo(tuple(labels), carry, frozenset(pending))
    if loop_class is not None and loop_class in labels:
        d = labels.index(loop_class)
        if kind == "max":
            event("max", loop_class, carry)
            labels[d] = None  # an elementwise max over chunks, then reduced: the same max
            return IndexInfo(tuple(labels), _carry_drop(carry, loop_class), frozenset(pending))
        labels[d] = ("fold", loop_class)
        return IndexInfo(tuple(labels), carry, frozenset(pending))
    if kind == "max" and loop_class is not None:
        return IndexInfo(tuple(labels), carry, frozenset(pending))  # a max of tile maxima
    if loop_class is None:
        return IndexInfo(tuple(labels), carry, frozenset(pending))
    raise _Conflict  # summing over iterations something the loop index does not reach


def _labels_match(have: IndexInfo | None, want: tuple[Any, ...] | None) -> bool:
    if have is None or want is None:
        return True
    if have.pending or have.maxpend:
        return False
    return all(a is None or b is None or a == b for a, b in zip(have.labels, want))


# ---------------------------------------------------------------------------------------------
# block level


@dataclass(frozen=True)
class Macro:
    """A fragment of the target (its ops back to the graph_def operands): ``nodes`` are
    (op, refs, attrs), a ref being ``("arg", j)`` for operand j's tile or ``("node", k)`` for
    the fragment's k-th node. A *seeded* block task applies its seeds first - each op through
    the same checks as single ops (shapes, phases, terms, indices, duplicates) - and searches
    op by op from there: a sub-search of the unseeded task that reaches large graphs (the
    per-row normalisations of QK-norm attention) without enumerating every way to build
    their prologues."""

    nodes: tuple[tuple[Op, tuple[tuple[str, int], ...], tuple[tuple[str, Any], ...]], ...]


def target_macros(
    target: KernelGraph, arg_terms: Sequence[Any], block_ops: Sequence[Op], max_size: int = 6,
    single_leaf: bool = False,
) -> tuple[Macro, ...]:
    """Every fragment of the target of 2..max_size ops ending at one target value whose
    leaves are graph_def operands (matched by term) and whose ops are block ops; with
    ``single_leaf``, only the maximal fragments that read one operand (prologues)."""
    ab = _abstract()
    terms = ab.kernel_terms(target)
    leaf = {}
    for v, t in terms.items():
        for j, at in enumerate(arg_terms):
            if t == at and v not in leaf:
                leaf[v] = j
    allowed = set(block_ops)
    out: list[Macro] = []
    seen: set[Any] = set()
    for root in target.nodes:
        if root.op in (Op.INPUT, Op.OUTPUT) or root.outs[0] in leaf:
            continue
        order: list[Any] = []
        ok = _collect(target, root.outs[0], leaf, allowed, order, set())
        if not ok or not 2 <= len(order) <= max_size:
            continue
        index = {n.outs[0]: k for k, n in enumerate(order)}
        nodes = tuple(
            (n.op, tuple(("arg", leaf[i]) if i in leaf else ("node", index[i]) for i in n.ins),
             n.attrs)
            for n in order
        )  # fmt: skip
        leaves = {r for _, refs, _ in nodes for kind, r in refs if kind == "arg"}
        if single_leaf and len(leaves) != 1:
            continue
        if nodes not in seen:
            seen.add(nodes)
            out.append(Macro(nodes))
    if single_leaf:  # keep the maximal ones: not the tail of another fragment
        keys = [set(m.nodes) for m in out]
        out = [m for m, k in zip(out, keys) if not any(k < other for other in keys)]
    return tuple(out)


def _collect(target: KernelGraph, v: int, leaf: dict, allowed: set, order: list, done: set) -> bool:
    if v in leaf or v in done:
        return True
    node = target.producer(v)
    if node.op is Op.INPUT or node.op not in allowed:
        return False
    for i in node.ins:
        if not _collect(target, i, leaf, allowed, order, done):
            return False
    done.add(v)
    order.append(node)
    return True


@dataclass(frozen=True)
class BlockTask:
    """One block-level enumeration: operands, loop structure and what the savers must produce.

    ``fdims[i]`` is the dim of operand i the for-loop splits (-1: loop-invariant);
    ``forloop`` the representative loop range (1 when no operand is split).
    """

    arg_types: tuple[TensorType, ...]
    arg_terms: tuple[Any, ...]
    fdims: tuple[int, ...]
    forloop: int
    out_types: tuple[TensorType, ...]
    max_ops: int
    max_states: int
    prune: bool = True
    priority: int = 0
    # the index analysis (None: off): operand infos, target output classes, target events
    arg_index: tuple[IndexInfo, ...] | None = None
    out_index: tuple[tuple[Any, ...], ...] | None = None
    events: frozenset[Any] = frozenset()
    loop_class: Any = None  # the index class of the loop-split dims
    seeds: tuple[Macro, ...] = ()  # target fragments applied before the op-by-op search
    shifted_exp: bool = False  # every exp must take a max-shifted value (see shifted_exps)

    @property
    def label(self) -> str:
        loops = ",".join("-" if f == N else str(f) for f in self.fdims)
        return f"args={len(self.arg_types)} fdims=({loops}) R={self.forloop}"


@dataclass(frozen=True)
class Skeleton:
    """A complete block graph at the representative tiling (grid (1,1,1), ``task.forloop``)."""

    block: BlockGraph
    fdims: tuple[int, ...]


@dataclass
class BlockResult:
    task: BlockTask
    skeletons: list[Skeleton] = field(default_factory=list)
    counters: Counters = field(default_factory=Counters)
    seconds: float = 0.0


class BlockDFS:
    """Depth-first enumeration of one ``BlockTask`` (see the module docstring)."""

    def __init__(
        self, task: BlockTask, space: Any, oracle: Any | None, deadline: float | None = None
    ) -> None:
        self.task, self.space, self.oracle = task, space, oracle
        self.prune = task.prune and oracle is not None
        self.deadline = deadline
        self.ctx = BlockContext((1, 1, 1), task.forloop, task.arg_types)
        self.R = task.forloop
        self.counters = Counters()
        self.found: list[Skeleton] = []
        self.m = len(task.out_types)
        self._ops = _block_vocabulary(space)
        # per value
        self.types: list[TensorType] = []
        self.terms: list[Any] = []
        self.phase: list[int] = []
        self.uses: list[int] = []
        self.index: list[IndexInfo | None] = []
        self.vsig: list[Any] = []
        self.vsigs: dict[Any, int] = {}
        self.hasher = TermHasher()
        self.use_index = self.prune and task.arg_index is not None
        self.checker = IndexChecker(task.events, task.loop_class)
        # per node: (op, ins, attrs, key)
        self.nodes: list[tuple[Op, tuple[int, ...], tuple[tuple[str, Any], ...], tuple]] = []
        self.sigs: set[tuple[Any, ...]] = set()
        self.n_ops = 0
        self._fits: list[dict[int, int | None]] = []
        self.sig_vid: dict[tuple[Any, ...], int] = {}
        self.sid: list[int] = []  # interned exact identity of each value (memo keys)
        self._interned: dict[Any, int] = {}
        self._memo: dict[Any, Any] = {}
        self._tt: dict[Any, TensorType] = {}
        self.sealed: set[int] = set()
        self._eq_cache: dict[tuple[Any, int], bool] = {}

    # -- driver ----------------------------------------------------------------------------
    def run(self) -> BlockResult:
        start = time.perf_counter()
        try:
            self._init_iterators()
            stage = -1
            for seed in self.task.seeds:
                pushed = self._push_macro(seed)
                if pushed:
                    stage = max([stage] + [self.nodes[-1 - k][3][0] for k in range(len(pushed))])
                    # the search continues from the seed's result only: its inner values
                    # and the tiles it read are sealed (the unseeded task covers the rest)
                    self.sealed.update(vid for vid, _ in pushed[:-1])
                    self.sealed.update(i for _, ins in pushed for i in ins
                                       if i < len(self.task.arg_types))  # fmt: skip
            self._dfs(stage=stage)
        except _Stop:
            self.counters.truncated = True
        self.counters.complete = len(self.found)
        return BlockResult(self.task, self.found, self.counters, time.perf_counter() - start)

    def _init_iterators(self) -> None:
        for arg, (t, term, f) in enumerate(
            zip(self.task.arg_types, self.task.arg_terms, self.task.fdims)
        ):
            shape = list(t.shape)
            if f != N:
                if shape[f] % self.R:
                    raise SearchError(f"loop range {self.R} does not divide {t} along dim {f}")
                shape[f] //= self.R
            lab = self.task.arg_index[arg] if self.use_index else None
            self._push_value(t.with_shape(tuple(shape)), term, BODY if f != N else INV, lab)
            attrs = (("arg", arg), ("fdim", f), ("imap", (N, N, N)))
            self.nodes.append((Op.INPUT_ITER, (), attrs, (-1,)))

    def _push_value(self, t: TensorType, term: Any, phase: int, labels: Any = None) -> int:
        self.types.append(t)
        self.terms.append(term)
        self.phase.append(phase)
        self.uses.append(0)
        self.index.append(labels)
        sig = self._sig(t, term, phase, labels)
        self.vsig.append(sig)
        self.vsigs[sig] = self.vsigs.get(sig, 0) + 1
        self._fits.append({})
        ident = (term, t.shape, t.dtype, phase, labels)
        sid = self._interned.get(ident)
        if sid is None:
            sid = self._interned[ident] = len(self._interned)
        self.sid.append(sid)
        return len(self.types) - 1

    def _sig(self, t: TensorType, term: Any, phase: int, labels: Any) -> Any:
        return (self.hasher(term)[0], t.shape, phase, labels)

    def _redundant(self, t: TensorType, term: Any, phase: int, labels: Any) -> bool:
        """A value already computed, or a constant (see ``TermHasher``)."""
        h0, h1 = self.hasher(term)
        if h0 == h1 and term.head != "var":
            return True
        return self.vsigs.get(self._sig(t, term, phase, labels), 0) > 0

    def _tick(self) -> None:
        c = self.counters
        c.states += 1
        if c.states > self.task.max_states:
            raise _Stop
        if self.deadline is not None and c.states % 256 == 0 and time.time() > self.deadline:
            raise _Stop

    def _dfs(self, stage: int) -> None:
        self._tick()
        self._check_complete()
        if self.n_ops >= self.task.max_ops:
            return
        for op, ins, attrs, key, shape, st in list(self._moves(stage)):
            res = self._evaluate(op, ins, attrs, shape, st)
            if res is None:
                continue
            t, term, phase, lab, sig = res
            if self.prune and self.vsigs.get(sig, 0) > 0:
                self.counters.pruned_duplicate += 1
                continue
            vid = self._apply(op, ins, attrs, key, t, term, phase, lab)
            if self._can_finish(key[0]):
                self._dfs(key[0])
            else:
                self.counters.pruned_dead += 1
            self._undo(vid, ins)

    def _push_macro(self, macro: Macro) -> list[tuple[int, tuple[int, ...]]] | None:
        """Apply a macro's new ops (None, with nothing applied, if one of them fails)."""
        from mirage_jax.ir.shapes import infer

        local: list[int] = []
        pushed: list[tuple[int, tuple[int, ...]]] = []
        fresh = [n for n in macro.nodes]
        for k, (op, refs, attrs) in enumerate(fresh):
            ins = tuple(r if kind == "arg" else local[r] for kind, r in refs)
            existing = self.sig_vid.get((op, attrs, ins))
            if existing is not None:
                local.append(existing)
                continue
            result = None
            if self.n_ops < self.task.max_ops:
                result = self._macro_node(op, ins, attrs, infer)
            if result is None:
                for vid, vins in reversed(pushed):
                    self._undo(vid, vins)
                return None
            key, t, term, phase, lab = result
            vid = self._apply(op, ins, attrs, key, t, term, phase, lab)
            local.append(vid)
            pushed.append((vid, ins))
        if not pushed:
            return None
        # after a macro any op of a later-or-equal stage may follow (see Macro)
        op, ins, attrs, key = self.nodes[-1]
        self.nodes[-1] = (op, ins, attrs, (key[0], -1))
        return pushed

    def _macro_node(self, op, ins, attrs, infer) -> tuple | None:
        phases = {self.phase[i] for i in ins}
        if BODY in phases and EPI in phases:
            return None
        st = 3 if EPI in phases else 1 if BODY in phases else 0
        try:
            (t,) = infer(op, tuple(self.types[i] for i in ins), dict(attrs), self.ctx)
        except GraphError:
            return None
        lab = None
        if self.use_index:
            try:
                lab = self.checker.step(op, attrs, [self.index[i] for i in ins],
                                        [self.types[i].shape for i in ins], t.shape,
                                        body=st == 1)  # fmt: skip
            except _Conflict:
                return None
        phase = {0: INV, 1: BODY, 3: EPI}[st]
        term = self._term(op, ins, attrs, t)
        if term is None or (self.prune and self._redundant(t, term, phase, lab)):
            return None
        key = (st, OP_RANK[op], _attr_key(attrs), ins)
        return key, t, term, phase, lab

    def _apply(self, op, ins, attrs, key, t, term, phase, lab) -> int:
        vid = self._push_value(t, term, phase, lab)
        for i in ins:
            self.uses[i] += 1
        self.nodes.append((op, ins, attrs, key))
        self.sigs.add((op, attrs, ins))
        self.sig_vid[(op, attrs, ins)] = vid
        self.n_ops += 1
        return vid

    def _undo(self, vid: int, ins: tuple[int, ...]) -> None:
        op, _, attrs, _ = self.nodes.pop()
        self.sigs.discard((op, attrs, ins))
        self.sig_vid.pop((op, attrs, ins), None)
        for i in ins:
            self.uses[i] -= 1
        sig = self.vsig.pop()
        self.vsigs[sig] -= 1
        for lst in (self.types, self.terms, self.phase, self.uses, self.index, self.sid):
            lst.pop()
        self.n_ops -= 1
        self._fits.pop()

    def _can_finish(self, stage: int) -> bool:
        dangling = [v for v, u in enumerate(self.uses) if u == 0]
        left = self.task.max_ops - self.n_ops
        if len(dangling) - left > self.m:
            return False
        if stage >= 3:  # body values unused once the epilogue begins can only be saved
            dead = [v for v in dangling if self.phase[v] == BODY]
            if len(dead) > self.m:
                return False
        return True

    # -- terms -----------------------------------------------------------------------------
    def _term(self, op: Op, ins, attrs, t: TensorType, count: bool = True) -> Any | None:
        ab = _abstract()
        term = ab.abstract_op(
            op, dict(attrs), [self.terms[i] for i in ins], [self.types[i] for i in ins], [t],
            self.ctx,
        )[0]  # fmt: skip
        if self.prune and not self.oracle.contains(term):
            if count:
                self.counters.pruned_abstract += 1
            return None
        return term

    # -- moves -----------------------------------------------------------------------------
    def _moves(self, stage: int) -> Iterator[tuple]:
        """Candidate ops in canonical order whose stage is >= ``stage``."""
        last = self.nodes[-1]
        last_key = last[3] if last[0] is not Op.INPUT_ITER else (-1,)
        last_out = len(self.types) - 1 if last[0] is not Op.INPUT_ITER else -1
        sealed = self.sealed
        inv = [v for v, p in enumerate(self.phase) if p == INV and v not in sealed]
        body = [v for v, p in enumerate(self.phase) if p == BODY and v not in sealed]
        epi = [v for v, p in enumerate(self.phase) if p == EPI]
        groups = []
        if stage <= 0:
            groups.append((0, inv, inv))
        if stage <= 1 and body:
            groups.append((1, inv + body, body))
        if stage <= 2 and body and self.R > 1:
            groups.append((2, body, body))
        if epi:
            groups.append((3, inv + epi, epi))
        for st, pool, must in groups:
            gen = self._acc_moves(pool) if st == 2 else self._compute_moves(pool, set(must))
            for op, ins, attrs, shape in gen:
                key = (st, OP_RANK[op], _attr_key(attrs), ins)
                if not (key > last_key or last_out in ins):
                    continue
                if (op, attrs, ins) in self.sigs:
                    continue
                yield op, ins, attrs, key, shape, st

    def _evaluate(self, op, ins, attrs, shape, st) -> tuple | None:
        """(type, term, phase, index info) of a proposed op, or None if a check drops it.
        Memoized on the operands' exact (term, shape, phase, index) identities."""
        mkey = (op, attrs, tuple(self.sid[i] for i in ins), st)
        hit = self._memo.get(mkey)
        if hit is None:
            hit = self._evaluate_fresh(op, ins, attrs, shape, st)
            self._memo[mkey] = hit
        if isinstance(hit, str):
            c = self.counters
            setattr(c, hit, getattr(c, hit) + 1)
            return None
        self.counters.proposed += 1
        return hit

    def _evaluate_fresh(self, op, ins, attrs, shape, st) -> tuple | str:
        dtype = self.types[ins[0]].dtype
        if any(self.types[i].dtype != dtype for i in ins):
            return "pruned_index"
        lab = None
        if self.use_index:
            try:
                lab = self.checker.step(op, attrs, [self.index[i] for i in ins],
                                        [self.types[i].shape for i in ins], shape,
                                        body=st in (1, 2))  # fmt: skip
            except _Conflict:
                return "pruned_index"
        if op is Op.EXP and self.task.shifted_exp and not is_max_shifted(self.terms[ins[0]]):
            return "pruned_numeric"
        if op is Op.ACC_RESCALE_SUM and self.prune and self.terms[ins[1]].head != "rmax":
            return "pruned_index"  # the rescale operand must be a max (online softmax)
        t = self._tt.get((shape, dtype))
        if t is None:
            t = self._tt[(shape, dtype)] = TensorType(shape, dtype)
        phase = {0: INV, 1: BODY, 2: EPI, 3: EPI}[st]
        term = self._term(op, ins, attrs, t, count=False)
        if term is None:
            return "pruned_abstract"
        if self.prune:
            h0, h1 = self.hasher(term)
            if h0 == h1 and term.head != "var":
                return "pruned_duplicate"
        return (t, term, phase, lab, self._sig(t, term, phase, lab))

    def _compute_moves(self, pool: list[int], must: set[int]) -> Iterator[tuple]:
        shapes = self.types
        for op, attr_sets in self._ops["unary"]:
            for v in must:
                for attrs in attr_sets:
                    yield op, (v,), attrs, shapes[v].shape
        for op in self._ops["reduce"]:
            for v in must:
                s = shapes[v].shape
                for d, size in enumerate(s):
                    if size > 1:
                        yield op, (v,), (("dim", d),), _reduced(s, d)
        for op in self._ops["binary"]:
            comm = op in COMMUTATIVE
            for u in pool:
                for v in pool:
                    if (comm and u > v) or (u == v and op is not Op.MUL and op is not Op.ADD):
                        continue
                    if u not in must and v not in must:
                        continue
                    s = _bcast(shapes[u].shape, shapes[v].shape)
                    if s is not None:
                        yield op, (u, v), (), s
        if self._ops["matmul"]:
            for u in pool:
                for v in pool:
                    if u not in must and v not in must:
                        continue
                    s = _matmul_shape(shapes[u].shape, shapes[v].shape)
                    if s is not None:
                        yield Op.MATMUL, (u, v), (), s
        if self._ops["concat"]:
            for u in pool:
                for v in pool:
                    if u == v or (u not in must and v not in must):
                        continue
                    for d in range(len(shapes[u].shape)):
                        s = _concat_shape(shapes[u].shape, shapes[v].shape, d)
                        if s is not None:
                            yield Op.CONCAT, (u, v), (("dim", d),), s

    def _acc_moves(self, body: list[int]) -> Iterator[tuple]:
        shapes = self.types
        for op in self._ops["acc"]:
            if op is Op.ACC_RESCALE_SUM:
                for x in body:
                    for mv in body:
                        if x != mv and _bcast(shapes[x].shape, shapes[mv].shape) == shapes[x].shape:
                            yield op, (x, mv), (), shapes[x].shape
                continue
            for v in body:
                s = shapes[v].shape
                yield op, (v,), (("dim", N),), s
                for d, size in enumerate(s):
                    if size > 1:
                        yield op, (v,), (("dim", d),), _reduced(s, d)

    # -- completion ------------------------------------------------------------------------
    def _fit(self, v: int, i: int) -> int | None:
        """The saver fdim with which value v becomes target output i (N: none needed), or
        None if it cannot; abstract equality is part of the test when pruning."""
        cache = self._fits[v]
        if i in cache:
            return cache[i]
        want, t, result = self.task.out_types[i], self.types[v], None
        if t.dtype == want.dtype and len(t.shape) == len(want.shape):
            if self.phase[v] != BODY or self.R == 1:
                result = N if t.shape == want.shape else None
            else:
                for f, (a, b) in enumerate(zip(t.shape, want.shape)):
                    rest = all(x == y for j, (x, y) in enumerate(zip(t.shape, want.shape)) if j != f)
                    if a * self.R == b and rest:
                        result = f
                        break
        if result is not None and self.use_index and not _labels_match(
            self.index[v], self.task.out_index[i]
        ):
            result = None
        if result is not None and self.prune and not self._equals(self.terms[v], i):
            result = None
        cache[i] = result
        return result

    def _equals(self, term: Any, i: int) -> bool:
        key = (term, i)
        if key not in self._eq_cache:
            self._eq_cache[key] = self.oracle.equals_output(term, i)
        return self._eq_cache[key]

    def _check_complete(self) -> None:
        if self.n_ops == 0:
            return
        dangling = [v for v, u in enumerate(self.uses) if u == 0]
        if len(dangling) > self.m:
            return
        options = []
        for i in range(self.m):
            opts = [(v, f) for v in range(len(self.types)) if (f := self._fit(v, i)) is not None]
            if not opts:
                return
            options.append(opts)
        for choice in itertools.product(*options):
            saved = {v for v, _ in choice}
            if all(v in saved for v in dangling):
                self.found.append(self._skeleton(choice))

    def _skeleton(self, savers: Sequence[tuple[int, int]]) -> Skeleton:
        bb = BlockBuilder((1, 1, 1), self.R, self.task.arg_types)
        vals = []
        for op, ins, attrs, _ in self.nodes:
            (out,) = bb.add_node(op, tuple(vals[i] for i in ins), dict(attrs))
            vals.append(out)
        for v, f in savers:
            bb.output_saver(vals[v], (N, N, N), f)
        return Skeleton(bb.build(), self.task.fdims)


def _block_vocabulary(space: Any) -> dict[str, Any]:
    ops = space.block_ops
    unary = []
    for op in ops:
        if op in SCALAR_UNARY:
            name = "exponent" if op is Op.POW_SCALAR else "scalar"
            vals = space.scalars.get(op, ())
            if vals:
                unary.append((op, [((name, v),) for v in vals]))
        elif op in UNARY:
            unary.append((op, [()]))
    return {
        "unary": unary,
        "reduce": [op for op in ops if op in REDUCTIONS],
        "binary": [op for op in ops if op in BINARY],
        "matmul": Op.MATMUL in ops,
        "concat": Op.CONCAT in ops,
        "acc": [op for op in ops if op in ACCUMULATORS],
    }


def _stage(node_op: Op, phase: int) -> int:
    if node_op in ACCUMULATORS:
        return 2
    return {INV: 0, BODY: 1, EPI: 3}[phase]


def canonical_block(block: BlockGraph) -> BlockGraph:
    """``block`` with its compute nodes in the canonical order of the enumeration.

    Adjacent independent nodes whose keys are out of order are swapped until none are (this
    ends: see the module docstring). Iterators stay first in operand order, savers last.
    Two skeletons are the same dataflow graph exactly when their canonical forms are equal.
    """
    phases = {v: p.value for v, p in block.phases().items()}
    iters = [n for n in block.nodes if n.op is Op.INPUT_ITER]
    savers = [n for n in block.nodes if n.op is Op.OUTPUT_SAVER]
    body = [n for n in block.nodes if n.op not in (Op.INPUT_ITER, Op.OUTPUT_SAVER)]
    changed = True
    while changed:
        changed = False
        pos = {n.outs[0]: k for k, n in enumerate(iters)}
        for k, n in enumerate(body):
            pos[n.outs[0]] = len(iters) + k

        def key(n: Any) -> tuple:
            return (_stage(n.op, phases[n.outs[0]]), OP_RANK[n.op], _attr_key(n.attrs),
                    tuple(pos[i] for i in n.ins))  # fmt: skip

        for k in range(len(body) - 1):
            a, b = body[k], body[k + 1]
            if a.outs[0] not in b.ins and key(a) > key(b):
                body[k], body[k + 1] = b, a
                changed = True
                break
    bb = BlockBuilder(block.grid, block.forloop_range, block.arg_types)
    vals: dict[int, Any] = {}
    for n in iters:
        vals[n.outs[0]] = bb.input_iter(n.attr("arg"), n.attr("imap"), n.attr("fdim"))
    for n in body:
        (vals[n.outs[0]],) = bb.add_node(n.op, tuple(vals[i] for i in n.ins), n.attr_dict)
    for n in savers:
        bb.output_saver(vals[n.ins[0]], n.attr("omap"), n.attr("fdim"))
    return bb.build()


def run_block_task(
    task: BlockTask, space: Any, oracle: Any | None, deadline: float | None = None
) -> BlockResult:
    """Enumerate one block task (the unit of work the runner hands to executors)."""
    return BlockDFS(task, space, oracle, deadline).run()


# ---------------------------------------------------------------------------------------------
# loop structures of a graph_def site


def loop_structures(
    arg_types: Sequence[TensorType], space: Any, reduce_extents: frozenset[int],
    arg_index: Sequence[IndexInfo] | None = None,
) -> list[tuple[tuple[int, ...], int, int, Any]]:
    """(fdims, representative forloop range, priority, loop class) for every loop structure.

    The no-loop structure comes first; then structures whose split dims all have extents the
    target reduces over (``reduce_extents``), then the rest (lower priority value = sooner).
    ``SearchConfig.fmaps`` restricts the dims a loop may split. With index labels, the split
    dims must share one index class (the loop couples them; see ``IndexAnalysis``).
    """
    allowed = space.config.fmaps
    options = []
    for t in arg_types:
        dims = [N] + [d for d, s in enumerate(t.shape) if s > 1]
        if allowed is not None:
            dims = [d for d in dims if d in allowed or d == N]
        options.append(dims)
    out = [(tuple(N for _ in arg_types), 1, 0, None)]
    for fdims in itertools.product(*options):
        split = [(t.shape[f]) for t, f in zip(arg_types, fdims) if f != N]
        if not split:
            continue
        loop_class = None
        if arg_index is not None:
            classes = {info.labels[f] for info, f in zip(arg_index, fdims) if f != N}
            if len(classes) != 1 or None in classes:
                continue
            loop_class = classes.pop()
        ranges = space.forloop_ranges(tuple(split))
        if not ranges:
            continue
        plausible = all(e in reduce_extents for e in split)
        prio = (1 if plausible else 3) * 100 - len(split)
        out.append((tuple(fdims), ranges[0], prio, loop_class))
    out.sort(key=lambda x: (x[2], x[0]))
    return out


def reduce_extents(target: KernelGraph) -> frozenset[int]:
    """The extents the target reduces over (reduction dims, matmul k)."""
    found = set()
    for n in target.nodes:
        if n.op in REDUCTIONS:
            found.add(target.types[n.ins[0]].shape[n.attr("dim")])
        elif n.op is Op.MATMUL:
            found.add(target.types[n.ins[0]].shape[-1])
    return frozenset(found)


# ---------------------------------------------------------------------------------------------
# instantiation: concrete grids, maps and loop ranges for a skeleton


@dataclass(frozen=True)
class SplitPattern:
    """How one grid axis partitions a skeleton: a dim per operand (-1: replicated) and per saver."""

    imap: tuple[int, ...]
    omap: tuple[int, ...]


def split_patterns(skel: Skeleton) -> list[SplitPattern]:
    """Every consistent way one grid axis can partition the skeleton's tensors.

    A split follows a dim through the ops: elementwise ops keep it (an unsplit operand must be
    broadcast along it), reductions and accumulators over it are invalid (they would leave
    partial results), matmul keeps batch dims and the free dims of each side (a split
    contraction dim is invalid). Every saved value must be split (its grid axis must be mapped).
    """
    block = skel.block
    iters = block.nodes_of(Op.INPUT_ITER)
    options = []
    for n in iters:
        t = block.types[n.outs[0]]
        f = n.attr("fdim")
        options.append([N] + [d for d, s in enumerate(t.shape) if s > 1 and d != f])
    out = []
    for choice in itertools.product(*options):
        if all(c == N for c in choice):
            continue
        omap = _propagate(block, dict(zip((n.outs[0] for n in iters), choice)))
        if omap is not None:
            out.append(SplitPattern(tuple(choice), omap))
    return out


def _propagate(block: BlockGraph, split: dict[int, int]) -> tuple[int, ...] | None:
    types = block.types
    for node in block.nodes:
        if node.op is Op.INPUT_ITER:
            continue
        if node.op is Op.OUTPUT_SAVER:
            continue
        s = _split_of(node, split, types)
        if s is False:
            return None
        split[node.outs[0]] = s  # type: ignore[assignment]
    omap = []
    for saver in block.outputs:
        s = split[saver.ins[0]]
        if s == N or s == saver.attr("fdim"):
            return None
        omap.append(s)
    return tuple(omap)


def _split_of(node, split: dict[int, int], types) -> int | bool:
    """The split dim of a node's result (N: unsplit), or False if the split is invalid."""
    op, ins = node.op, node.ins
    sp = [split[i] for i in ins]
    if op in REDUCTIONS or (op in ACCUMULATORS and op is not Op.ACC_RESCALE_SUM):
        dim = node.attr("dim")
        return False if sp[0] != N and sp[0] == dim else sp[0]
    if op is Op.MATMUL:
        rank = len(types[ins[0]].shape)
        a, b = sp
        if a == rank - 1 or b == rank - 2:
            return False
        outs = set()
        if a != N:
            outs.add(a)
        if b != N:
            outs.add(b)
        if len(outs) > 1:
            return False
        s = outs.pop() if outs else N
        if s != N and s < rank - 2 and (a != s or b != s):
            return False  # a batch dim split on one side only
        return s
    if op is Op.CONCAT:
        dim = node.attr("dim")
        if sp[0] != sp[1] or sp[0] == dim:
            return False
        return sp[0]
    # elementwise (unary, binary, rescale_sum): one split dim; unsplit operands broadcast on it
    splits = {s for s in sp if s != N}
    if not splits:
        return N
    if len(splits) > 1:
        return False
    s = splits.pop()
    for i, si in zip(ins, sp):
        if si == N and types[i].shape[s] != 1:
            return False
    return s


@dataclass(frozen=True)
class Tiling:
    """A concrete grid for a skeleton: per used grid axis, a pattern and a size."""

    axes: tuple[tuple[SplitPattern, int], ...]
    forloop: int

    @property
    def grid(self) -> tuple[int, int, int]:
        g = [size for _, size in self.axes] + [1] * (3 - len(self.axes))
        return (g[0], g[1], g[2])


def tilings(skel: Skeleton, space: Any) -> list[Tiling]:
    """Every concrete tiling of a skeleton within the space's grid and loop candidates."""
    block = skel.block
    cfg = space.config
    patterns = split_patterns(skel)
    if cfg.imaps is not None or cfg.omaps is not None:
        patterns = patterns  # per-axis filtering happens on the built maps (see instantiate)
    arg_shapes = [t.shape for t in block.arg_types]
    iters = block.nodes_of(Op.INPUT_ITER)
    out_shapes = [t.shape for t in block.output_types]
    sized: list[tuple[int, SplitPattern, int]] = []
    for pi, pat in enumerate(patterns):
        for g in space.grid_sizes:
            ok = all(
                d == N or arg_shapes[n.attr("arg")][d] % g == 0 for n, d in zip(iters, pat.imap)
            ) and all(out_shapes[k][d] % g == 0 for k, d in enumerate(pat.omap))
            if ok:
                sized.append((pi, pat, g))
    extents = tuple(
        block.arg_types[n.attr("arg")].shape[n.attr("fdim")]
        for n in iters if n.attr("fdim") != N
    )  # fmt: skip
    ranges = space.forloop_ranges(extents) if extents else (1,)
    lo_blocks, hi_blocks = space.cores, cfg.max_blocks
    combos: list[tuple[tuple[SplitPattern, int], ...]] = [()]
    for n_axes in range(1, cfg.max_grid_axes + 1):
        for chosen in itertools.combinations(sized, n_axes):
            if len({pi for pi, _, _ in chosen}) < n_axes or not _disjoint(chosen):
                continue
            combos.append(tuple((pat, g) for _, pat, g in chosen))
    out = []
    for axes in combos:
        blocks = 1
        for _, g in axes:
            blocks *= g
        if blocks != 1 and not lo_blocks <= blocks <= hi_blocks:
            continue
        for r in ranges:
            out.append(Tiling(axes, r))
    return out


def _disjoint(chosen: Sequence[tuple[int, SplitPattern, int]]) -> bool:
    pats = [p for _, p, _ in chosen]
    for k in range(len(pats[0].imap)):
        used = [p.imap[k] for p in pats if p.imap[k] != N]
        if len(used) != len(set(used)):
            return False
    for k in range(len(pats[0].omap)):
        used = [p.omap[k] for p in pats]
        if len(used) != len(set(used)):
            return False
    return True


def instantiate(skel: Skeleton, tiling: Tiling, space: Any | None = None) -> BlockGraph | None:
    """The skeleton rebuilt at a concrete tiling (None if the IR rejects it)."""
    block = skel.block
    grid = tiling.grid
    imaps: dict[int, list[int]] = {}
    iters = block.nodes_of(Op.INPUT_ITER)
    for k, n in enumerate(iters):
        imaps[n.outs[0]] = [pat.imap[k] for pat, _ in tiling.axes] + [N] * (3 - len(tiling.axes))
    omaps = [
        [pat.omap[k] for pat, _ in tiling.axes] + [N] * (3 - len(tiling.axes))
        for k in range(len(block.outputs))
    ]
    cfg = space.config if space is not None else None
    if cfg is not None and cfg.imaps is not None:
        if any(tuple(m) not in cfg.imaps for m in imaps.values()):
            return None
    if cfg is not None and cfg.omaps is not None:
        if any(tuple(m) not in cfg.omaps for m in omaps):
            return None
    try:
        bb = BlockBuilder(grid, tiling.forloop, block.arg_types)
        vals: dict[int, Any] = {}
        saver = 0
        for node in block.nodes:
            if node.op is Op.INPUT_ITER:
                vals[node.outs[0]] = bb.input_iter(
                    node.attr("arg"), tuple(imaps[node.outs[0]]), node.attr("fdim")
                )
            elif node.op is Op.OUTPUT_SAVER:
                bb.output_saver(vals[node.ins[0]], tuple(omaps[saver]), node.attr("fdim"))
                saver += 1
            else:
                (out,) = bb.add_node(node.op, tuple(vals[i] for i in node.ins), node.attr_dict)
                vals[node.outs[0]] = out
        return bb.build()
    except GraphError:
        return None


# ---------------------------------------------------------------------------------------------
# kernel level


@dataclass(frozen=True)
class KernelPrefix:
    """Pre-defined kernel ops grown from the inputs: (op, ins, attrs) over dense value ids."""

    input_types: tuple[TensorType, ...]
    nodes: tuple[tuple[Op, tuple[int, ...], tuple[tuple[str, Any], ...]], ...]
    types: tuple[TensorType, ...]
    terms: tuple[Any, ...]
    index: tuple[IndexInfo, ...] | None = None

    @property
    def num_ops(self) -> int:
        return len(self.nodes)


@dataclass(frozen=True)
class Site:
    """A place for one graph-defined kernel: a kernel prefix and the operands chosen for it."""

    prefix: KernelPrefix
    operands: tuple[int, ...]

    @property
    def arg_types(self) -> tuple[TensorType, ...]:
        return tuple(self.prefix.types[i] for i in self.operands)

    @property
    def arg_terms(self) -> tuple[Any, ...]:
        return tuple(self.prefix.terms[i] for i in self.operands)

    @property
    def arg_index(self) -> tuple[IndexInfo, ...] | None:
        if self.prefix.index is None:
            return None
        return tuple(self.prefix.index[i] for i in self.operands)


@dataclass
class KernelEnumeration:
    sites: list[Site] = field(default_factory=list)
    complete: list[KernelGraph] = field(default_factory=list)  # pre-defined ops only
    counters: Counters = field(default_factory=Counters)


class KernelDFS:
    """Kernel-level prefixes of pre-defined ops, with graph_def sites and complete graphs."""

    def __init__(self, target: KernelGraph, space: Any, oracle: Any | None) -> None:
        self.target, self.space, self.oracle = target, space, oracle
        self.prune = space.config.prune and oracle is not None
        cfg = space.config
        self.max_ops = cfg.max_kernel_ops
        self.input_types = target.input_types
        self.out_types = target.output_types
        self.result = KernelEnumeration()
        self.types: list[TensorType] = list(self.input_types)
        ab = _abstract()
        self.terms: list[Any] = [ab.var(i) for i in range(len(self.input_types))]
        self.uses: list[int] = [0] * len(self.types)
        self.nodes: list[tuple[Op, tuple[int, ...], tuple, tuple]] = []
        self.sigs: set[tuple[Any, ...]] = set()
        self.needed = _vars_needed(ab.output_terms(target))
        self._ops = _kernel_vocabulary(space)
        self.index = IndexAnalysis(target) if self.prune else None
        if self.index is not None and not self.index.enabled:
            self.index = None
        self.labels: list[Any] = list(self.index.inputs) if self.index is not None else []
        self.checker = self.index.checker() if self.index is not None else None
        self.shifted = self.prune and shifted_exps(target)

    def run(self) -> KernelEnumeration:
        try:
            self._dfs()
        except _Stop:
            self.result.counters.truncated = True
        return self.result

    def _dfs(self) -> None:
        c = self.result.counters
        c.states += 1
        if c.states > self.space.config.max_states:
            raise _Stop
        self._collect()
        if len(self.nodes) >= self.max_ops - (1 if self.space.config.max_graph_defs else 0):
            return
        for op, ins, attrs, key, t, lab in list(self._moves()):
            ab = _abstract()
            term = ab.abstract_op(op, dict(attrs), [self.terms[i] for i in ins],
                                  [self.types[i] for i in ins], [t])[0]  # fmt: skip
            if self.prune and not self.oracle.contains(term):
                c.pruned_abstract += 1
                continue
            if op is Op.EXP and self.shifted and not is_max_shifted(self.terms[ins[0]]):
                c.pruned_numeric += 1
                continue
            self.types.append(t)
            self.terms.append(term)
            self.uses.append(0)
            if self.index is not None:
                self.labels.append(lab)
            for i in ins:
                self.uses[i] += 1
            self.nodes.append((op, ins, attrs, key))
            self.sigs.add((op, attrs, ins))
            self._dfs()
            self.nodes.pop()
            self.sigs.discard((op, attrs, ins))
            for i in ins:
                self.uses[i] -= 1
            self.types.pop()
            self.terms.pop()
            self.uses.pop()
            if self.index is not None:
                self.labels.pop()

    def _prefix(self) -> KernelPrefix:
        return KernelPrefix(
            self.input_types, tuple((op, ins, attrs) for op, ins, attrs, _ in self.nodes),
            tuple(self.types), tuple(self.terms),
            tuple(self.labels) if self.index is not None else None,
        )  # fmt: skip

    def _collect(self) -> None:
        dangling = [v for v, u in enumerate(self.uses) if u == 0]
        cfg = self.space.config
        if cfg.max_graph_defs >= 1:
            for size in range(1, cfg.max_graph_def_inputs + 1):
                for ops in itertools.combinations(range(len(self.types)), size):
                    if not set(dangling) <= set(ops):
                        continue
                    covered = set().union(*(_vars_needed([self.terms[i]]) for i in ops))
                    if not self.needed <= covered:
                        continue
                    self.result.sites.append(Site(self._prefix(), ops))
        self._complete_plain(dangling)

    def _complete_plain(self, dangling: list[int]) -> None:
        if not self.nodes or len(dangling) > len(self.out_types):
            return
        choice = []
        for i, want in enumerate(self.out_types):
            opts = [v for v in range(len(self.input_types), len(self.types))
                    if self.types[v] == want
                    and (self.index is None
                         or _labels_match(self.labels[v], self.index.outputs[i]))
                    and (not self.prune or self.oracle.equals_output(self.terms[v], i))]  # fmt: skip
            if not opts:
                return
            choice.append(opts)
        for pick in itertools.product(*choice):
            if set(dangling) <= set(pick):
                graph = build_kernel(self._prefix(), None, None, pick)
                if graph is not None:
                    self.result.complete.append(graph)

    def _moves(self) -> Iterator[tuple]:
        last_key = self.nodes[-1][3] if self.nodes else (-1,)
        last_out = len(self.types) - 1 if self.nodes else -1
        vals = range(len(self.types))
        for op, ins, attrs, shape in self._candidates(vals):
            key = (OP_RANK[op], _attr_key(attrs), ins)
            if not (key > last_key or last_out in ins) or (op, attrs, ins) in self.sigs:
                continue
            dtype = self.types[ins[0]].dtype
            if any(self.types[i].dtype != dtype for i in ins):
                continue
            lab = None
            if self.index is not None:
                try:
                    lab = self.checker.step(op, attrs, [self.labels[i] for i in ins],
                                            [self.types[i].shape for i in ins], shape)  # fmt: skip
                except _Conflict:
                    self.result.counters.pruned_index += 1
                    continue
            self.result.counters.proposed += 1
            yield op, ins, attrs, key, TensorType(shape, dtype), lab

    def _candidates(self, vals: range) -> Iterator[tuple]:
        shp = [t.shape for t in self.types]
        for op, attr_sets in self._ops["unary"]:
            for v in vals:
                for attrs in attr_sets:
                    yield op, (v,), attrs, shp[v]
        for op in self._ops["reduce"]:
            for v in vals:
                for d, size in enumerate(shp[v]):
                    if size > 1:
                        yield op, (v,), (("dim", d),), _reduced(shp[v], d)
        for op in self._ops["binary"]:
            comm = op in COMMUTATIVE
            for u in vals:
                for v in vals:
                    if (comm and u > v) or (u == v and op not in (Op.MUL, Op.ADD)):
                        continue
                    s = _bcast(shp[u], shp[v])
                    if s is not None:
                        yield op, (u, v), (), s
        if self._ops["matmul"]:
            for u in vals:
                for v in vals:
                    s = _matmul_shape(shp[u], shp[v])
                    if s is not None:
                        yield Op.MATMUL, (u, v), (), s
        for shape in self._ops["reshape"]:
            for v in vals:
                if shp[v] != shape and _prod(shp[v]) == _prod(shape):
                    yield Op.RESHAPE, (v,), (("shape", shape),), shape
        for perm in self._ops["transpose"]:
            for v in vals:
                if len(perm) == len(shp[v]):
                    yield Op.TRANSPOSE, (v,), (("perm", perm),), tuple(shp[v][p] for p in perm)


def _prod(shape: tuple[int, ...]) -> int:
    out = 1
    for s in shape:
        out *= s
    return out


def _kernel_vocabulary(space: Any) -> dict[str, Any]:
    ops = [op for op in space.kernel_ops if op not in ACCUMULATORS]
    unary = []
    for op in ops:
        if op in SCALAR_UNARY:
            name = "exponent" if op is Op.POW_SCALAR else "scalar"
            vals = space.scalars.get(op, ())
            if vals:
                unary.append((op, [((name, v),) for v in vals]))
        elif op in UNARY:
            unary.append((op, [()]))
    return {
        "unary": unary,
        "reduce": [op for op in ops if op in REDUCTIONS],
        "binary": [op for op in ops if op in BINARY],
        "matmul": Op.MATMUL in ops,
        "reshape": space.reshapes if Op.RESHAPE in ops else (),
        "transpose": space.perms if Op.TRANSPOSE in ops else (),
    }


def _vars_needed(terms: Sequence[Any]) -> set[int]:
    found: set[int] = set()
    for t in terms:
        found.update(int(s.param) for s in t.subterms() if s.head == "var")
    return found


def build_kernel(
    prefix: KernelPrefix,
    block: BlockGraph | None,
    operands: tuple[int, ...] | None,
    outputs: Sequence[int] | None = None,
) -> KernelGraph | None:
    """The kernel graph: prefix ops, then (optionally) graph_def(block) on ``operands`` whose
    results are the outputs, else the prefix values ``outputs``. None if the IR rejects it."""
    try:
        kb = KernelBuilder()
        vals = [kb.input(t) for t in prefix.input_types]
        for op, ins, attrs in prefix.nodes:
            (out,) = kb.add_node(op, tuple(vals[i] for i in ins), dict(attrs))
            vals.append(out)
        if block is not None and operands is not None:
            for y in kb.graph_def(block, *(vals[i] for i in operands)):
                kb.output(y)
        else:
            for v in outputs or ():
                kb.output(vals[v])
        return kb.build()
    except GraphError:
        return None


__all__ = [
    "BlockDFS", "BlockResult", "BlockTask", "Counters", "KernelDFS", "KernelEnumeration",
    "KernelPrefix", "Site", "Skeleton", "SplitPattern", "Tiling", "build_kernel", "instantiate",
    "loop_structures", "reduce_extents", "run_block_task", "split_patterns", "tilings",
]  # fmt: skip
