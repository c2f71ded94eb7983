"""The one μGraph walker, parametrised by a number system.

``NumberSystem`` supplies every operator on its own kind of value (float arrays for the
reference, residue pairs for the finite field); this module owns everything structural and is
written once: the op table, kernel-graph traversal, block-graph grid / for-loop / accumulator
semantics, input iterators, output savers and inlined thread graphs.

Block graphs run vectorised over blocks. Every block-level value is an array whose first three
axes are the grid axes (x, y, z), each of size ``grid[a]`` or 1 where the value is the same for
every block along that axis (numpy broadcasting does the rest). An input iterator reshapes its
operand once into ``[bx, by, bz, (R), tile...]`` views; iteration ``i`` indexes the ``R`` axis.
The for-loop runs in Python, so accumulators see the iterations in order, exactly as a kernel
does; output savers scatter the block axes (and, for body values, the iteration axis) back into
the output dims named by ``omap`` / ``fdim``.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from fractions import Fraction
from typing import Any

import numpy as np

from mirage_jax.errors import GraphError
from mirage_jax.ir.graph import BlockGraph, Graph, KernelGraph, Node, Phase, ThreadGraph
from mirage_jax.ir.ops import (
    ACCUMULATORS,
    BINARY,
    GELU_C,
    GELU_K,
    MASKED,
    NONE_DIM,
    REDUCTIONS,
    SCALAR_UNARY,
    STRUCTURE,
    UNARY,
    Op,
)
from mirage_jax.ir.precision import materialised
from mirage_jax.ir.types import DType, TensorType

LEAD = 3  # leading block axes (x, y, z) on every block-level value


class NumberSystem(ABC):
    """The operators of one number system; the walker never looks inside a value.

    Axes passed in are absolute (the walker adds the leading block axes). Composite ops have
    default definitions in terms of the primitives, which is what the finite field uses; the
    float reference overrides them with the direct numpy formulas.
    """

    # -- structure ------------------------------------------------------------------------
    @abstractmethod
    def layout(self, x: Any, fn: Callable[[np.ndarray], np.ndarray]) -> Any:
        """Apply a pure numpy layout function (reshape, slice, ...) to every component."""

    @abstractmethod
    def shape(self, x: Any) -> tuple[int, ...]: ...

    @abstractmethod
    def where(self, m: Any, x: Any, fill: float, keep: bool) -> Any:
        """``x`` where the mask ``m`` holds (``keep``) or does not (not ``keep``), else
        ``fill`` (broadcasting)."""

    @abstractmethod
    def stack(self, xs: Sequence[Any], axis: int) -> Any: ...

    @abstractmethod
    def concat(self, xs: Sequence[Any], axis: int) -> Any: ...

    @abstractmethod
    def input(self, x: Any, type_: TensorType, what: str) -> Any:
        """Check and convert one graph input."""

    def finish(self, x: Any, dtype: DType) -> Any:
        """Bring one node result to the value's declared dtype (rounding, for floats)."""
        return x

    def store(self, x: Any, dtype: DType) -> Any:
        """A value written out in its declared dtype (half-precision floats rounded; see the
        float system): a graph output, or a result XLA would write out (``_materialised``)."""
        return x

    def broadcast_to(self, x: Any, shape: tuple[int, ...]) -> Any:
        return self.layout(x, lambda v: np.broadcast_to(v, shape))

    # -- primitives -----------------------------------------------------------------------
    @abstractmethod
    def add(self, x: Any, y: Any) -> Any: ...

    @abstractmethod
    def sub(self, x: Any, y: Any) -> Any: ...

    @abstractmethod
    def mul(self, x: Any, y: Any) -> Any: ...

    @abstractmethod
    def maximum(self, x: Any, y: Any) -> Any: ...

    @abstractmethod
    def neg(self, x: Any) -> Any: ...

    @abstractmethod
    def reciprocal(self, x: Any) -> Any: ...

    @abstractmethod
    def exp(self, x: Any) -> Any: ...

    @abstractmethod
    def log(self, x: Any) -> Any: ...

    @abstractmethod
    def sqrt(self, x: Any) -> Any: ...

    @abstractmethod
    def erf(self, x: Any) -> Any: ...

    @abstractmethod
    def erfc(self, x: Any) -> Any: ...

    @abstractmethod
    def sin(self, x: Any) -> Any: ...

    @abstractmethod
    def cos(self, x: Any) -> Any: ...

    @abstractmethod
    def sign(self, x: Any) -> Any: ...

    @abstractmethod
    def erf_inv(self, x: Any) -> Any: ...

    @abstractmethod
    def rem(self, x: Any, y: Any) -> Any:
        """x - y * trunc(x / y), the sign of x's (C's fmod)."""

    @abstractmethod
    def scale(self, x: Any, c: float | Fraction) -> Any:
        """x * c for a constant c."""

    @abstractmethod
    def shift(self, x: Any, c: float | Fraction) -> Any:
        """x + c for a constant c."""

    @abstractmethod
    def pow_scalar(self, x: Any, e: float) -> Any: ...

    @abstractmethod
    def matmul(self, x: Any, y: Any) -> Any: ...

    @abstractmethod
    def reduce_sum(self, x: Any, axis: int) -> Any: ...

    @abstractmethod
    def reduce_max(self, x: Any, axis: int) -> Any: ...

    @abstractmethod
    def cast(self, x: Any, dtype: DType) -> Any: ...

    # -- composites (definitions in terms of the primitives) ------------------------------
    def div(self, x: Any, y: Any) -> Any:
        return self.mul(x, self.reciprocal(y))

    def square(self, x: Any) -> Any:
        return self.mul(x, x)

    def rsqrt(self, x: Any) -> Any:
        return self.reciprocal(self.sqrt(x))

    def sigmoid(self, x: Any) -> Any:
        return self.reciprocal(self.shift(self.exp(self.neg(x)), 1))

    def silu(self, x: Any) -> Any:
        return self.mul(x, self.sigmoid(x))

    def tanh(self, x: Any) -> Any:
        e = self.exp(self.scale(x, 2))
        return self.div(self.shift(e, -1), self.shift(e, 1))

    def gelu(self, x: Any) -> Any:
        inner = self.add(x, self.scale(self.mul(self.square(x), x), GELU_K))
        t = self.tanh(self.scale(inner, GELU_C))
        return self.mul(self.scale(x, 0.5), self.shift(t, 1))

    def relu(self, x: Any) -> Any:
        return self.maximum(x, self.scale(x, 0))

    def reduce_mean(self, x: Any, axis: int) -> Any:
        return self.scale(self.reduce_sum(x, axis), Fraction(1, self.shape(x)[axis]))

    def reduce_rms(self, x: Any, axis: int) -> Any:
        return self.sqrt(self.reduce_mean(self.square(x), axis))

    def exp_diff(self, a: Any, b: Any) -> Any:
        """exp(a - b); the float system defines exp(-inf - -inf) as 1 (online softmax)."""
        return self.exp(self.sub(a, b))

    def rescaled(self, x: Any, m: Any, top: Any) -> Any:
        """x * exp(m - top), one term of acc_rescale_sum; the float system drops terms whose
        max m is -inf (a fully masked tile), as the kernels do."""
        return self.mul(x, self.exp_diff(m, top))


def batched_matmul(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """``np.matmul`` of equal-rank float arrays, as one large GEMM where one operand is the
    same for every batch entry (a replicated tile against per-block tiles): hundreds of tiny
    GEMMs are slow, and multi-threaded BLAS stalls on them when the machine is busy."""
    bx, by = x.shape[:-2], y.shape[:-2]
    if len(bx) != len(by) or not bx:
        return np.matmul(x, y)
    (m, k), n = x.shape[-2:], y.shape[-1]
    if math.prod(bx) == 1 < math.prod(by):  # [m, k] @ [k, B*n]
        out = x.reshape(m, k) @ np.moveaxis(y, -2, 0).reshape(k, -1)
        return np.moveaxis(out.reshape((m,) + by + (n,)), 0, -2)
    if math.prod(by) == 1 < math.prod(bx):  # [B*m, k] @ [k, n]
        return (x.reshape(-1, k) @ y.reshape(k, n)).reshape(bx + (m, n))
    return np.matmul(x, y)


# ---------------------------------------------------------------------------------------------
# the op table: the one place that says which number-system operator each IR op is

OpFn = Callable[[NumberSystem, list[Any], dict[str, Any], int], Any]


def _unary(name: str) -> OpFn:
    return lambda ns, xs, attrs, lead: getattr(ns, name)(xs[0])


def _binary(name: str) -> OpFn:
    return lambda ns, xs, attrs, lead: getattr(ns, name)(xs[0], xs[1])


def _reduction(name: str) -> OpFn:
    return lambda ns, xs, attrs, lead: getattr(ns, name)(xs[0], attrs["dim"] + lead)


def _scalar(name: str, op: Op) -> OpFn:
    attr = op.info.scalar_attr
    return lambda ns, xs, attrs, lead: getattr(ns, name)(xs[0], attrs[attr])


def _where(keep: bool) -> OpFn:
    return lambda ns, xs, attrs, lead: ns.where(xs[0], xs[1], attrs["fill"], keep)


def _concat(ns: NumberSystem, xs: list[Any], attrs: dict[str, Any], lead: int) -> Any:
    # block-level operands may be replicated (size 1) along different block axes
    sa, sb = ns.shape(xs[0]), ns.shape(xs[1])
    blocks = np.broadcast_shapes(sa[:lead], sb[:lead])
    parts = [ns.broadcast_to(x, blocks + s[lead:]) for x, s in zip(xs, (sa, sb))]
    return ns.concat(parts, attrs["dim"] + lead)


def _reshape(ns: NumberSystem, xs: list[Any], attrs: dict[str, Any], lead: int) -> Any:
    head = ns.shape(xs[0])[:lead]
    return ns.layout(xs[0], lambda v: v.reshape(head + tuple(attrs["shape"])))


def _transpose(ns: NumberSystem, xs: list[Any], attrs: dict[str, Any], lead: int) -> Any:
    perm = tuple(range(lead)) + tuple(p + lead for p in attrs["perm"])
    return ns.layout(xs[0], lambda v: v.transpose(perm))


def _slice(ns: NumberSystem, xs: list[Any], attrs: dict[str, Any], lead: int) -> Any:
    dim, start, size = attrs["dim"] + lead, attrs["start"], attrs["size"]
    index = (slice(None),) * dim + (slice(start, start + size),)
    return ns.layout(xs[0], lambda v: v[index])


# The number-system operator of each op is named like the op, except for these.
_OPERATOR = {Op.MAX: "maximum", Op.MUL_SCALAR: "scale", Op.ADD_SCALAR: "shift"}

OP_TABLE: dict[Op, OpFn] = {
    **{op: _unary(op.value) for op in Op if op in UNARY - SCALAR_UNARY},
    **{op: _scalar(_OPERATOR.get(op, op.value), op) for op in Op if op in SCALAR_UNARY},
    **{op: _binary(_OPERATOR.get(op, op.value)) for op in Op if op in BINARY - MASKED},
    Op.WHERE: _where(True),
    Op.WHERE_NOT: _where(False),
    **{op: _reduction(op.value) for op in Op if op in REDUCTIONS},
    Op.MATMUL: _binary("matmul"),
    Op.CONCAT: _concat,
    Op.RESHAPE: _reshape,
    Op.TRANSPOSE: _transpose,
    Op.SLICE: _slice,
    Op.CAST: lambda ns, xs, attrs, lead: ns.cast(xs[0], attrs["dtype"]),
}  # fmt: skip

# structural ops are walked, accumulators run by the block loop: neither is in OP_TABLE
_UNDEFINED = set(Op) - set(OP_TABLE) - STRUCTURE - ACCUMULATORS
if _UNDEFINED:  # pragma: no cover - guards the table against a new Op without semantics
    raise RuntimeError(f"ops without interpreter semantics: {_UNDEFINED}")


# ---------------------------------------------------------------------------------------------
# graph walking


def graph_input_types(graph: Graph) -> tuple[TensorType, ...]:
    """The operand types a graph takes: INPUT nodes, or a block graph's graph_def operands."""
    return graph.arg_types if isinstance(graph, BlockGraph) else graph.input_types


def check_arity(graph: Graph, inputs: Sequence[Any]) -> None:
    n = len(graph_input_types(graph))
    if len(inputs) != n:
        raise GraphError(
            f"the {graph.level.value} graph takes {n} input(s), got {len(inputs)}",
            remedy="pass one array per graph input, in the order of the graph's inputs",
        )


def evaluate_graph(graph: Graph, inputs: Sequence[Any], ns: NumberSystem) -> list[Any]:
    """The outputs of any-level ``graph`` on ``inputs`` in number system ``ns``."""
    check_arity(graph, inputs)
    types = graph_input_types(graph)
    values = [ns.input(x, t, f"input {i}") for i, (x, t) in enumerate(zip(inputs, types))]
    if isinstance(graph, BlockGraph):
        return run_block(graph, values, ns)
    env = kernel_values(graph, values, ns)
    return [ns.store(env[n.ins[0]], graph.types[n.ins[0]].dtype) for n in graph.outputs]


def kernel_values(
    graph: KernelGraph | ThreadGraph,
    inputs: Sequence[Any],
    ns: NumberSystem,
    known: Mapping[int, Any] | None = None,
) -> dict[int, Any]:
    """Every value of a kernel (or thread) graph; ``known`` values are reused, not recomputed."""
    env: dict[int, Any] = dict(known or {})
    for k, node in enumerate(graph.inputs):
        env[node.outs[0]] = inputs[k]
    for node in graph.nodes:
        if node.op in (Op.INPUT, Op.OUTPUT) or all(o in env for o in node.outs):
            continue
        if node.op is Op.GRAPH_DEF:
            results = run_block(node.attr("block"), [env[i] for i in node.ins], ns)
            env.update(zip(node.outs, results))
        else:
            env[node.outs[0]] = apply_node(graph, node, env, ns, 0)
    return env


def apply_node(graph: Graph, node: Node, env: dict[int, Any], ns: NumberSystem, lead: int) -> Any:
    """One compute node (or an inlined thread graph) on values carrying ``lead`` block axes."""
    xs = [env[i] for i in node.ins]
    dtype = graph.types[node.outs[0]].dtype
    if node.op is Op.THREAD:
        inner: ThreadGraph = node.attr("graph")
        inner_env = _thread_values(inner, xs, ns, lead)
        result = inner_env[inner.outputs[0].ins[0]]
    else:
        result = ns.finish(OP_TABLE[node.op](ns, xs, node.attr_dict, lead), dtype)
    return ns.store(result, dtype) if materialised(graph, node) else result


def _thread_values(graph: ThreadGraph, xs: list[Any], ns: NumberSystem, lead: int) -> dict:
    env = {n.outs[0]: x for n, x in zip(graph.inputs, xs)}
    for node in graph.nodes:
        if node.op not in (Op.INPUT, Op.OUTPUT):
            env[node.outs[0]] = apply_node(graph, node, env, ns, lead)
    return env


# ---------------------------------------------------------------------------------------------
# block graphs


def run_block(block: BlockGraph, operands: Sequence[Any], ns: NumberSystem) -> list[Any]:
    """Run every block of ``block`` (vectorised) and assemble the graph_def results."""
    phases = block.phases()
    by_phase: dict[Phase, list[Node]] = {p: [] for p in Phase}
    for node in block.nodes:
        if node.op is not Op.OUTPUT_SAVER and node.op not in ACCUMULATORS:
            by_phase[phases[node.outs[0]]].append(node)
    views = {
        n.outs[0]: ns.layout(operands[n.attr("arg")], _tiler(block, n))
        for n in block.nodes_of(Op.INPUT_ITER)
    }
    accs = [_Accumulator(block, n, ns) for n in block.nodes if n.op in ACCUMULATORS]
    savers = block.outputs
    looped = [s for s in savers if s.attr("fdim") != NONE_DIM]
    saved: dict[int, list[Any]] = {id(s): [] for s in looped}

    env: dict[int, Any] = {}
    _run(block, by_phase[Phase.INVARIANT], env, views, ns, None)
    for i in range(block.forloop_range):
        _run(block, by_phase[Phase.BODY], env, views, ns, i)
        for acc in accs:
            acc.update(env)
        for s in looped:
            saved[id(s)].append(env[s.ins[0]])
    for acc in accs:
        env[acc.node.outs[0]] = acc.result()
    _run(block, by_phase[Phase.EPILOGUE], env, views, ns, None)

    results = []
    for s in savers:
        if s.attr("fdim") != NONE_DIM:
            tile = ns.stack(saved[id(s)], LEAD)  # the iteration axis sits after the block axes
        else:
            tile = env[s.ins[0]]
        results.append(ns.layout(tile, _scatterer(block, s, s.attr("fdim") != NONE_DIM)))
    return results


def _run(
    block: BlockGraph, nodes: list[Node], env: dict[int, Any], views: dict[int, Any],
    ns: NumberSystem, iteration: int | None,
) -> None:  # fmt: skip
    for node in nodes:
        out = node.outs[0]
        if node.op is Op.INPUT_ITER:
            view = views[out]
            if iteration is None:
                env[out] = view
            else:
                env[out] = ns.layout(view, lambda v, i=iteration: v[:, :, :, i])
        else:
            env[out] = apply_node(block, node, env, ns, LEAD)


def _tiler(block: BlockGraph, node: Node) -> Callable[[np.ndarray], np.ndarray]:
    """operand -> [bx|1, by|1, bz|1, (R), tile...] view for one input iterator."""
    imap, fdim = node.attr("imap"), node.attr("fdim")
    shape = block.arg_types[node.attr("arg")].shape
    split: list[int] = []
    axis_pos: dict[int, int] = {}
    loop_pos: list[int] = []
    tile_pos: list[int] = []
    for d, size in enumerate(shape):
        axes = [a for a in range(3) if imap[a] == d]
        if axes:
            axis_pos[axes[0]] = len(split)
            split.append(block.grid[axes[0]])
            size //= block.grid[axes[0]]
        if d == fdim:  # after the grid split: the IR forbids both today; this is ready for it
            loop_pos.append(len(split))
            split.append(block.forloop_range)
            size //= block.forloop_range
        tile_pos.append(len(split))
        split.append(size)
    perm = [axis_pos[a] for a in sorted(axis_pos)] + loop_pos + tile_pos
    missing = [a for a in range(3) if a not in axis_pos]

    def tile(v: np.ndarray) -> np.ndarray:
        v = v.reshape(split).transpose(perm)
        for a in missing:  # ascending, so each lands at its own grid position
            v = np.expand_dims(v, a)
        return v

    return tile


def _scatterer(block: BlockGraph, node: Node, looped: bool) -> Callable[[np.ndarray], np.ndarray]:
    """[bx|1, by|1, bz|1, (R), tile...] -> the assembled output, per omap and fdim."""
    omap, fdim = node.attr("omap"), node.attr("fdim")
    tile = block.types[node.ins[0]].shape
    off = LEAD + int(looped)
    full = tuple(block.grid) + ((block.forloop_range,) if looped else ()) + tile
    order: list[int] = []
    out_shape: list[int] = []
    for d, size in enumerate(tile):
        axes = [a for a in range(3) if omap[a] == d]
        if axes:
            order.append(axes[0])
            size *= block.grid[axes[0]]
        if d == fdim:
            order.append(LEAD)
            size *= block.forloop_range
        order.append(off + d)
        out_shape.append(size)
    unmapped = [a for a in range(3) if omap[a] == NONE_DIM]  # size 1: dropped by reshape

    def scatter(v: np.ndarray) -> np.ndarray:
        v = np.broadcast_to(v, full)
        return v.transpose(unmapped + order).reshape(out_shape)

    return scatter


class _Accumulator:
    """One for-loop accumulator: the contract's definitions, folded iteration by iteration."""

    def __init__(self, block: BlockGraph, node: Node, ns: NumberSystem) -> None:
        self.node, self.ns = node, ns
        self.op = node.op
        dim = node.attr("dim") if self.op is not Op.ACC_RESCALE_SUM else NONE_DIM
        self.axis = None if dim == NONE_DIM else dim + LEAD
        n = 1 if dim == NONE_DIM else block.types[node.ins[0]].shape[dim]
        self.count = block.forloop_range * n
        self.dtype = block.types[node.outs[0]].dtype
        self.state: Any = None
        self.running_max: Any = None

    def _contribution(self, x: Any) -> Any:
        ns = self.ns
        if self.op is Op.ACC_RMS:
            x = ns.square(x)
        if self.axis is None:
            return x
        if self.op is Op.ACC_MAX:
            return ns.reduce_max(x, self.axis)
        return ns.reduce_sum(x, self.axis)

    def update(self, env: dict[int, Any]) -> None:
        ns = self.ns
        xs = [env[i] for i in self.node.ins]
        if self.op is Op.ACC_RESCALE_SUM:
            x, m = xs
            if self.state is None:
                self.state, self.running_max = ns.rescaled(x, m, m), m
                return
            new_max = ns.maximum(self.running_max, m)
            self.state = ns.add(
                ns.mul(self.state, ns.exp_diff(self.running_max, new_max)),
                ns.rescaled(x, m, new_max),
            )
            self.running_max = new_max
            return
        c = self._contribution(xs[0])
        if self.state is None:
            self.state = c
        elif self.op is Op.ACC_MAX:
            self.state = ns.maximum(self.state, c)
        else:
            self.state = ns.add(self.state, c)

    def result(self) -> Any:
        ns, out = self.ns, self.state
        if self.op is Op.ACC_MEAN:
            out = ns.scale(out, Fraction(1, self.count))
        elif self.op is Op.ACC_RMS:
            out = ns.sqrt(ns.scale(out, Fraction(1, self.count)))
        return ns.store(ns.finish(out, self.dtype), self.dtype)
