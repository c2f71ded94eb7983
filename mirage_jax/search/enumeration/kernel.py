"""The kernel-level DFS: prefixes of pre-defined ops grown from the target's inputs, the
graph_def *sites* they offer (``Site``), and the kernel graphs built from them."""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from mirage_jax.errors import GraphError
from mirage_jax.ir.graph import BlockGraph, KernelBuilder, KernelGraph
from mirage_jax.ir.ops import ACCUMULATORS, REDUCTIONS, Op
from mirage_jax.ir.shapes import masked_dtype
from mirage_jax.ir.types import TensorType
from mirage_jax.search import abstract
from mirage_jax.search.enumeration.counters import Counters, Stop
from mirage_jax.search.enumeration.index import (
    Conflict,
    IndexAnalysis,
    IndexInfo,
    labels_match,
)
from mirage_jax.search.enumeration.rules import (
    COMMUTATIVE,
    OP_RANK,
    TRIVIAL_ON_ITSELF,
    Shape,
    attr_key,
    bcast,
    binary_vocabulary,
    matmul_shape,
    prod,
    reduced,
    unary_vocabulary,
)
from mirage_jax.search.enumeration.terms import (
    is_max_shifted,
    shifted_exps,
    vars_needed,
)


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
    """What the kernel-level DFS found: graph_def sites, and graphs of pre-defined ops only."""

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
        self.terms: list[Any] = [abstract.var(i) for i in range(len(self.input_types))]
        self.uses: list[int] = [0] * len(self.types)
        self.nodes: list[tuple[Op, tuple[int, ...], tuple, tuple]] = []
        self.sigs: set[tuple[Any, ...]] = set()
        self.needed = vars_needed(abstract.output_terms(target))
        # (by the graph, not the terms: a mask is read, though no term names it)
        read = {i for n in target.nodes for i in n.ins}
        self.unread = {k for k, n in enumerate(target.inputs) if n.outs[0] not in read}
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
        except Stop:
            self.result.counters.truncated = True
        return self.result

    # -- the search ------------------------------------------------------------------------
    def _dfs(self) -> None:
        c = self.result.counters
        c.states += 1
        if c.states > self.space.config.max_states:
            raise Stop
        self._collect()
        if len(self.nodes) >= self.max_ops - (1 if self.space.config.max_graph_defs else 0):
            return
        for op, ins, attrs, key, t, lab in list(self._moves()):
            term = self._screen(op, ins, attrs, t)
            if term is None:
                continue
            self._push(op, ins, attrs, key, t, term, lab)
            self._dfs()
            self._pop(op, ins, attrs)

    def _screen(self, op: Op, ins: tuple[int, ...], attrs: tuple, t: TensorType) -> Any | None:
        """The term of a proposed op, or None (counted) when pruning drops it."""
        term = abstract.abstract_op(op, dict(attrs), [self.terms[i] for i in ins],
                                    [self.types[i] for i in ins], [t])[0]  # fmt: skip
        c = self.result.counters
        if self.prune and not self.oracle.contains(term):
            c.pruned_abstract += 1
            return None
        if op is Op.EXP and self.shifted and not is_max_shifted(self.terms[ins[0]]):
            c.pruned_numeric += 1
            return None
        return term

    def _push(self, op, ins, attrs, key, t: TensorType, term: Any, lab: Any) -> None:
        self.types.append(t)
        self.terms.append(term)
        self.uses.append(0)
        if self.index is not None:
            self.labels.append(lab)
        for i in ins:
            self.uses[i] += 1
        self.nodes.append((op, ins, attrs, key))
        self.sigs.add((op, attrs, ins))

    def _pop(self, op, ins, attrs) -> None:
        self.nodes.pop()
        self.sigs.discard((op, attrs, ins))
        for i in ins:
            self.uses[i] -= 1
        self.types.pop()
        self.terms.pop()
        self.uses.pop()
        if self.index is not None:
            self.labels.pop()

    # -- what a prefix offers --------------------------------------------------------------
    def _prefix(self) -> KernelPrefix:
        return KernelPrefix(
            self.input_types, tuple((op, ins, attrs) for op, ins, attrs, _ in self.nodes),
            tuple(self.types), tuple(self.terms),
            tuple(self.labels) if self.index is not None else None,
        )  # fmt: skip

    def _collect(self) -> None:
        # an input no output reads (a literal a region keeps for XLA's replay) may stay unused
        dangling = [v for v, u in enumerate(self.uses) if u == 0 and v not in self.unread]
        if self.space.config.max_graph_defs >= 1:
            self._collect_sites(dangling)
        self._complete_plain(dangling)

    def _collect_sites(self, dangling: list[int]) -> None:
        """A site per operand set that uses every dangling value and reads every input the
        target needs."""
        for size in range(1, self.space.config.max_graph_def_inputs + 1):
            for ops in itertools.combinations(range(len(self.types)), size):
                if not set(dangling) <= set(ops) or self.unread.intersection(ops):
                    continue
                covered = set().union(*(vars_needed([self.terms[i]]) for i in ops))
                if not self.needed <= covered:
                    continue
                self.result.sites.append(Site(self._prefix(), ops))

    def _complete_plain(self, dangling: list[int]) -> None:
        if not self.nodes or len(dangling) > len(self.out_types):
            return
        choice = []
        for i, want in enumerate(self.out_types):
            opts = [v for v in range(len(self.input_types), len(self.types))
                    if self._can_output(v, i, want)]  # fmt: skip
            if not opts:
                return
            choice.append(opts)
        for pick in itertools.product(*choice):
            if set(dangling) <= set(pick):
                graph = build_kernel(self._prefix(), None, None, pick)
                if graph is not None:
                    self.result.complete.append(graph)

    def _can_output(self, v: int, i: int, want: TensorType) -> bool:
        return (self.types[v] == want
                and (self.index is None or labels_match(self.labels[v], self.index.outputs[i]))
                and (not self.prune or self.oracle.equals_output(self.terms[v], i)))  # fmt: skip

    # -- moves -----------------------------------------------------------------------------
    def _moves(self) -> Iterator[tuple]:
        last_key = self.nodes[-1][3] if self.nodes else (-1,)
        last_out = len(self.types) - 1 if self.nodes else -1
        vals = range(len(self.types))
        shapes = [t.shape for t in self.types]
        for op, ins, attrs, shape in _candidates(self._ops, shapes, vals):
            key = (OP_RANK[op], attr_key(attrs), ins)
            if not (key > last_key or last_out in ins) or (op, attrs, ins) in self.sigs:
                continue
            dtype = masked_dtype(op, tuple(self.types[i].dtype for i in ins))
            if dtype is None:
                continue
            lab = None
            if self.index is not None:
                try:
                    lab = self.checker.step(op, attrs, [self.labels[i] for i in ins],
                                            [self.types[i].shape for i in ins], shape)  # fmt: skip
                except Conflict:
                    self.result.counters.pruned_index += 1
                    continue
            self.result.counters.proposed += 1
            yield op, ins, attrs, key, TensorType(shape, dtype), lab


def _candidates(ops: dict[str, Any], shp: list[Shape], vals: range) -> Iterator[tuple]:
    """(op, ins, attrs, result shape) of every pre-defined op over the values, by family."""
    yield from _unary_candidates(ops, shp, vals)
    yield from _binary_candidates(ops, shp, vals)
    yield from _layout_candidates(ops, shp, vals)


def _unary_candidates(ops: dict[str, Any], shp: list[Shape], vals: range) -> Iterator[tuple]:
    for op, attr_sets in ops["unary"]:
        for v in vals:
            for attrs in attr_sets:
                yield op, (v,), attrs, shp[v]
    for op in ops["reduce"]:
        for v in vals:
            for d, size in enumerate(shp[v]):
                if size > 1:
                    yield op, (v,), (("dim", d),), reduced(shp[v], d)


def _binary_candidates(ops: dict[str, Any], shp: list[Shape], vals: range) -> Iterator[tuple]:
    for op, attr_sets in ops["binary"]:
        comm = op in COMMUTATIVE
        for u in vals:
            for v in vals:
                if (comm and u > v) or (u == v and op in TRIVIAL_ON_ITSELF):
                    continue
                s = bcast(shp[u], shp[v])
                if s is not None:
                    for attrs in attr_sets:
                        yield op, (u, v), attrs, s
    if ops["matmul"]:
        for u in vals:
            for v in vals:
                s = matmul_shape(shp[u], shp[v])
                if s is not None:
                    yield Op.MATMUL, (u, v), (), s


def _layout_candidates(ops: dict[str, Any], shp: list[Shape], vals: range) -> Iterator[tuple]:
    for shape in ops["reshape"]:
        for v in vals:
            if shp[v] != shape and prod(shp[v]) == prod(shape):
                yield Op.RESHAPE, (v,), (("shape", shape),), shape
    for perm in ops["transpose"]:
        for v in vals:
            if len(perm) == len(shp[v]):
                yield Op.TRANSPOSE, (v,), (("perm", perm),), tuple(shp[v][p] for p in perm)
    for shape, dim, start, size in ops["slice"]:
        for v in vals:
            if shp[v] == shape:
                attrs = (("dim", dim), ("size", size), ("start", start))
                yield Op.SLICE, (v,), attrs, shape[:dim] + (size,) + shape[dim + 1:]


def _kernel_vocabulary(space: Any) -> dict[str, Any]:
    ops = [op for op in space.kernel_ops if op not in ACCUMULATORS]
    return {
        "unary": unary_vocabulary(ops, space.scalars),
        "reduce": [op for op in ops if op in REDUCTIONS],
        "binary": binary_vocabulary(ops, space.scalars),
        "matmul": Op.MATMUL in ops,
        "reshape": space.reshapes if Op.RESHAPE in ops else (),
        "transpose": space.perms if Op.TRANSPOSE in ops else (),
        "slice": space.slices if Op.SLICE in ops else (),
    }


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
