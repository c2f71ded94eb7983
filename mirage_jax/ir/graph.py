"""μGraphs: kernel graphs, block graphs and thread graphs as frozen SSA values.

A graph is a tuple of ``Node``s in a topological order over dense value ids: node outputs are
numbered 0, 1, 2, ... in order of definition, so every value id indexes ``graph.types``.
Graphs are immutable and hashable; build them with ``KernelBuilder`` / ``BlockBuilder`` /
``ThreadBuilder``, which check shapes, dtypes, op levels and loop phases as each node is added.

- ``KernelGraph``: device tensors. INPUT nodes (in order) are its inputs, OUTPUT nodes (in order)
  its outputs; GRAPH_DEF nodes hold a ``BlockGraph``.
- ``BlockGraph``: a grid of blocks, each running ``forloop_range`` iterations of the body and then
  the epilogue. INPUT_ITER nodes read tiles of the graph_def operands (``arg_types``), OUTPUT_SAVER
  nodes (in order) write the graph_def results. Accumulators separate body from epilogue.
- ``ThreadGraph``: a fused chain of elementwise ops over its INPUTs with one OUTPUT.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from mirage_jax.errors import GraphError
from mirage_jax.ir.ops import (
    ACCUMULATORS,
    ELEMENTWISE,
    NONE_DIM,
    REQUIRED,
    Level,
    Op,
)
from mirage_jax.ir.printer import fingerprint, to_text
from mirage_jax.ir.shapes import BlockContext, infer, saved_output
from mirage_jax.ir.types import TensorType

Attrs = tuple[tuple[str, Any], ...]


@dataclass(frozen=True)
class Node:
    """One operator application: ``outs = op[attrs](ins)`` over value ids."""

    op: Op
    ins: tuple[int, ...]
    outs: tuple[int, ...]
    attrs: Attrs = ()

    def attr(self, name: str) -> Any:
        for key, value in self.attrs:
            if key == name:
                return value
        raise KeyError(f"{self.op.value} has no attribute {name!r}")

    @property
    def attr_dict(self) -> dict[str, Any]:
        return dict(self.attrs)


@dataclass(frozen=True)
class Value:
    """A builder's handle on one SSA value."""

    id: int
    type: TensorType

    @property
    def shape(self) -> tuple[int, ...]:
        return self.type.shape


@dataclass(frozen=True)
class Graph:
    nodes: tuple[Node, ...]
    types: tuple[TensorType, ...]

    level = Level.KERNEL

    def producer(self, value: int) -> Node:
        return self._producers()[value]

    def _producers(self) -> dict[int, Node]:
        cache = self.__dict__.get("_producer_cache")
        if cache is None:
            cache = {v: n for n in self.nodes for v in n.outs}
            object.__setattr__(self, "_producer_cache", cache)
        return cache

    def users(self, value: int) -> tuple[Node, ...]:
        return tuple(n for n in self.nodes if value in n.ins)

    def nodes_of(self, *ops: Op) -> tuple[Node, ...]:
        return tuple(n for n in self.nodes if n.op in ops)

    @property
    def inputs(self) -> tuple[Node, ...]:
        return self.nodes_of(Op.INPUT)

    @property
    def outputs(self) -> tuple[Node, ...]:
        return self.nodes_of(Op.OUTPUT)

    @property
    def input_types(self) -> tuple[TensorType, ...]:
        return tuple(self.types[n.outs[0]] for n in self.inputs)

    @property
    def output_types(self) -> tuple[TensorType, ...]:
        return tuple(self.types[n.ins[0]] for n in self.outputs)

    def __str__(self) -> str:
        return to_text(self)

    def fingerprint(self) -> str:
        """sha256 of the canonical text: stable across processes and machines."""
        return fingerprint(self)


@dataclass(frozen=True)
class KernelGraph(Graph):
    level = Level.KERNEL

    @property
    def block_graphs(self) -> tuple[BlockGraph, ...]:
        return tuple(n.attr("block") for n in self.nodes_of(Op.GRAPH_DEF))


@dataclass(frozen=True)
class ThreadGraph(Graph):
    level = Level.THREAD


@dataclass(frozen=True)
class BlockGraph(Graph):
    grid: tuple[int, int, int] = (1, 1, 1)
    forloop_range: int = 1
    arg_types: tuple[TensorType, ...] = ()

    level = Level.BLOCK

    @property
    def context(self) -> BlockContext:
        return BlockContext(self.grid, self.forloop_range, self.arg_types)

    @property
    def input_types(self) -> tuple[TensorType, ...]:
        """A block graph reads its operands through input iterators: these are their types."""
        return self.arg_types

    @property
    def outputs(self) -> tuple[Node, ...]:
        return self.nodes_of(Op.OUTPUT_SAVER)

    @property
    def output_types(self) -> tuple[TensorType, ...]:
        ctx = self.context
        return tuple(
            saved_output(self.types[n.ins[0]], n.attr("omap"), n.attr("fdim"), ctx)
            for n in self.outputs
        )

    @property
    def num_blocks(self) -> int:
        gx, gy, gz = self.grid
        return gx * gy * gz

    def phases(self) -> dict[int, Phase]:
        """The loop phase of every value (computed when built, so always consistent)."""
        return _phases(self.nodes)


class Phase(enum.Enum):
    """Where a block-graph value lives relative to the for-loop."""

    INVARIANT = 0  # the same every iteration (loop-invariant tiles and what follows from them)
    BODY = 1  # changes every iteration
    EPILOGUE = 2  # after the loop: derived from an accumulator


def node_phase(node: Node, in_phases: list[Phase]) -> Phase:
    """The phase of a node's outputs given the phases of its operands."""
    if node.op is Op.INPUT_ITER:
        return Phase.BODY if node.attr("fdim") != NONE_DIM else Phase.INVARIANT
    if node.op in ACCUMULATORS:
        return Phase.EPILOGUE
    return max(in_phases, default=Phase.INVARIANT, key=lambda p: p.value)


def _phases(nodes: tuple[Node, ...]) -> dict[int, Phase]:
    phase: dict[int, Phase] = {}
    for n in nodes:
        p = node_phase(n, [phase[i] for i in n.ins])
        phase.update((o, p) for o in n.outs)
    return phase


# ---------------------------------------------------------------------------------------------
# builders


def _normalize_attrs(op: Op, attrs: dict[str, Any]) -> Attrs:
    schema = op.info.attrs
    unknown = set(attrs) - set(schema)
    if unknown:
        raise GraphError(f"{op.value}: unknown attribute(s) {sorted(unknown)}",
                         remedy=f"{op.value} takes {sorted(schema) or 'no attributes'}")  # fmt: skip
    out = []
    for name, default in schema.items():
        value = attrs.get(name, default)
        if value is REQUIRED:
            raise GraphError(f"{op.value}: missing attribute {name!r}")
        if isinstance(value, list):
            value = tuple(value)
        if name in ("scalar", "exponent"):
            value = float(value)
        out.append((name, value))
    return tuple(sorted(out))


class _Builder:
    level: Level
    graph_cls: type[Graph]

    def __init__(self) -> None:
        self._nodes: list[Node] = []
        self._types: list[TensorType] = []

    def _context(self) -> BlockContext | None:
        return None

    def _check(self, op: Op, ins: tuple[Value, ...]) -> None:
        if self.level not in op.info.levels:
            raise GraphError(
                f"{op.value} is not allowed in a {self.level.value} graph",
                remedy=f"{op.value} may appear in: "
                + ", ".join(sorted(lv.value for lv in op.info.levels)),
            )
        for v in ins:
            if not isinstance(v, Value) or v.id >= len(self._types) or self._types[v.id] != v.type:
                raise GraphError(f"{op.value}: operand {v!r} is not a value of this graph")

    def _add(
        self, op: Op, ins: tuple[Value, ...], attrs: dict[str, Any],
        declared: tuple[TensorType, ...] | None = None,
    ) -> tuple[Value, ...]:  # fmt: skip
        self._check(op, ins)
        norm = _normalize_attrs(op, attrs)
        if op is Op.INPUT:
            if declared is None or len(declared) != 1:
                raise GraphError("input: needs exactly one declared type")
            outs = declared
        else:
            outs = infer(op, tuple(v.type for v in ins), dict(norm), self._context())
            if declared is not None and tuple(declared) != outs:
                raise GraphError(
                    f"{op.value}: declared type(s) {', '.join(map(str, declared))} differ from "
                    f"the inferred {', '.join(map(str, outs))}"
                )
        first = len(self._types)
        ids = tuple(range(first, first + len(outs)))
        node = Node(op, tuple(v.id for v in ins), ids, norm)
        self._validate_node(node, outs)
        self._nodes.append(node)
        self._types.extend(outs)
        return tuple(Value(i, t) for i, t in zip(ids, outs))

    def _validate_node(self, node: Node, outs: tuple[TensorType, ...]) -> None:
        pass

    def apply(self, op: Op, *ins: Value, **attrs: Any) -> Value:
        """Add a single-output op and return its value."""
        outs = self._add(op, ins, attrs)
        if len(outs) != 1:
            raise GraphError(f"{op.value} has {len(outs)} outputs; use apply_multi")
        return outs[0]

    def apply_multi(self, op: Op, *ins: Value, **attrs: Any) -> tuple[Value, ...]:
        return self._add(op, ins, attrs)

    def add_node(
        self, op: Op, ins: tuple[Value, ...], attrs: dict[str, Any],
        declared: tuple[TensorType, ...] | None = None,
    ) -> tuple[Value, ...]:  # fmt: skip
        """Generic entry used by the parser and by graph rewriters."""
        return self._add(op, ins, attrs, declared)

    def value(self, vid: int) -> Value:
        return Value(vid, self._types[vid])

    # conveniences for the common ops
    def input(self, type_: TensorType) -> Value:
        return self._add(Op.INPUT, (), {}, (type_,))[0]

    def output(self, v: Value) -> None:
        self._add(Op.OUTPUT, (v,), {})

    def matmul(self, a: Value, b: Value) -> Value:
        return self.apply(Op.MATMUL, a, b)

    def _graph_kwargs(self) -> dict[str, Any]:
        return {}

    def build(self) -> Graph:
        graph = self.graph_cls(tuple(self._nodes), tuple(self._types), **self._graph_kwargs())
        self._validate_graph(graph)
        return graph

    def _validate_graph(self, graph: Graph) -> None:
        if not graph.outputs:
            raise GraphError(f"a {self.level.value} graph needs at least one output")


class KernelBuilder(_Builder):
    level = Level.KERNEL
    graph_cls = KernelGraph

    def graph_def(self, block: BlockGraph, *ins: Value) -> tuple[Value, ...]:
        return self._add(Op.GRAPH_DEF, ins, {"block": block})

    def build(self) -> KernelGraph:
        return super().build()  # type: ignore[return-value]


class ThreadBuilder(_Builder):
    level = Level.THREAD
    graph_cls = ThreadGraph

    def _validate_node(self, node: Node, outs: tuple[TensorType, ...]) -> None:
        if node.op not in ELEMENTWISE | {Op.INPUT, Op.OUTPUT, Op.CAST}:
            raise GraphError(f"{node.op.value} is not elementwise: thread graphs fuse "
                             "elementwise chains only")  # fmt: skip

    def _validate_graph(self, graph: Graph) -> None:
        if len(graph.outputs) != 1:
            raise GraphError("a thread graph has exactly one output")

    def build(self) -> ThreadGraph:
        return super().build()  # type: ignore[return-value]


class BlockBuilder(_Builder):
    level = Level.BLOCK
    graph_cls = BlockGraph

    def __init__(
        self, grid: tuple[int, ...], forloop_range: int, arg_types: tuple[TensorType, ...]
    ) -> None:
        super().__init__()
        grid = tuple(grid) + (1,) * (3 - len(tuple(grid)))
        if len(grid) != 3 or not all(isinstance(g, int) and g >= 1 for g in grid):
            raise GraphError(f"grid {grid} must be up to 3 positive ints (x, y, z)")
        if not isinstance(forloop_range, int) or forloop_range < 1:
            raise GraphError(f"forloop_range {forloop_range} must be a positive int")
        self._ctx = BlockContext(grid, forloop_range, tuple(arg_types))  # type: ignore[arg-type]
        self._phase: dict[int, Phase] = {}

    def _context(self) -> BlockContext:
        return self._ctx

    def _validate_node(self, node: Node, outs: tuple[TensorType, ...]) -> None:
        phases = [self._phase[i] for i in node.ins]
        if node.op in ACCUMULATORS and Phase.EPILOGUE in phases:
            raise GraphError(
                f"{node.op.value}: accumulates a value computed after the loop",
                remedy="accumulators take values from the loop body",
            )
        if Phase.BODY in phases and Phase.EPILOGUE in phases:
            raise GraphError(
                f"{node.op.value}: mixes a loop-body value with a post-loop (accumulated) value",
                remedy="accumulate the body value first, or move the op into the body",
            )
        if node.op is Op.OUTPUT_SAVER:
            self._validate_saver(node, phases[0])
        p = node_phase(node, phases)
        self._phase.update((o, p) for o in node.outs)

    def _validate_saver(self, node: Node, phase: Phase) -> None:
        fdim, loops = node.attr("fdim"), self._ctx.forloop_range > 1
        if phase is Phase.BODY and loops and fdim == NONE_DIM:
            raise GraphError(
                "output_saver: saves a loop-body value without a forloop dim, so each "
                "iteration would overwrite the last",
                remedy="accumulate the value first, or give the saver an fdim",
            )
        if phase is not Phase.BODY and fdim != NONE_DIM:
            raise GraphError("output_saver: fdim is only meaningful for loop-body values")

    def input_iter(self, arg: int, imap: tuple[int, int, int], fdim: int = NONE_DIM) -> Value:
        return self.apply(Op.INPUT_ITER, arg=arg, imap=tuple(imap), fdim=fdim)

    def output_saver(self, v: Value, omap: tuple[int, int, int], fdim: int = NONE_DIM) -> None:
        self._add(Op.OUTPUT_SAVER, (v,), {"omap": tuple(omap), "fdim": fdim})

    def input(self, type_: TensorType) -> Value:  # pragma: no cover - guarded for clarity
        raise GraphError("block graphs read inputs through input_iter, not input")

    def _graph_kwargs(self) -> dict[str, Any]:
        return {"grid": self._ctx.grid, "forloop_range": self._ctx.forloop_range,
                "arg_types": self._ctx.arg_types}  # fmt: skip

    def _validate_graph(self, graph: Graph) -> None:
        super()._validate_graph(graph)
        read = {n.attr("arg") for n in graph.nodes_of(Op.INPUT_ITER)}
        unread = set(range(len(self._ctx.arg_types))) - read
        if unread:
            raise GraphError(f"block graph inputs {sorted(unread)} are never read by an input_iter")

    def build(self) -> BlockGraph:
        return super().build()  # type: ignore[return-value]


def copy_into(
    kb: KernelBuilder, graph: KernelGraph,
    block_fn: Callable[[BlockGraph], BlockGraph] | None = None,
    output_fn: Callable[[KernelBuilder, int, Value], Value] | None = None,
) -> None:  # fmt: skip
    """Append ``graph`` to ``kb``: its inputs and outputs after those already there, the block
    graph of every graph-defined kernel replaced by ``block_fn`` of it and output k's value
    ``y`` by ``output_fn(kb, k, y)`` when given."""
    vals: dict[int, Value] = {}
    k = 0
    for node in graph.nodes:
        if node.op is Op.INPUT:
            vals[node.outs[0]] = kb.input(graph.types[node.outs[0]])
        elif node.op is Op.OUTPUT:
            y = vals[node.ins[0]]
            kb.output(output_fn(kb, k, y) if output_fn is not None else y)
            k += 1
        else:
            attrs = node.attr_dict
            if node.op is Op.GRAPH_DEF and block_fn is not None:
                attrs["block"] = block_fn(attrs["block"])
            outs = kb.add_node(node.op, tuple(vals[i] for i in node.ins), attrs)
            vals.update(zip(node.outs, outs))


def map_blocks(graph: KernelGraph, fn: Callable[[BlockGraph], BlockGraph]) -> KernelGraph:
    """``graph`` with the block graph of every graph-defined kernel replaced by ``fn`` of it
    (rebuilt, so every check runs on the result)."""
    kb = KernelBuilder()
    copy_into(kb, graph, fn)
    return kb.build()


__all__ = [
    "Attrs", "BlockBuilder", "BlockGraph", "Graph", "KernelBuilder", "KernelGraph", "Node",
    "Phase", "ThreadBuilder", "ThreadGraph", "Value", "copy_into", "map_blocks", "node_phase",
]  # fmt: skip
