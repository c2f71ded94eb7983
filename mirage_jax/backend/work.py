"""What a μGraph's kernels read, write and compute, independent of the hardware they run on.

The analytic cost models (``backend.cpu.cost``, ``backend.cuda.cost``) price the same facts
of a kernel graph with different rates and rules. This module derives those facts once:

- ``block_work(block)``: one graph-defined kernel as a ``BlockWork`` - its grid, blocks and
  for-loop iterations, every input tile a block loads (``TileRead``: how often, how much of
  that is a re-read of bytes some block already read, its contiguous runs), the bytes it
  writes, each computing node (``NodeWork``: a tile matmul's shape and flops, the elementwise
  ops applied per element, how many elements it reads and produces, its loop phase), the live
  tiles of one block (``working_set``) and the nodes that run every iteration;
- ``op_work(graph, node)``: one pre-defined (kernel-level) op as an ``OpWork``;
- ``kernel_costs(graph, block_cost, op_cost)``: the one walk over a kernel graph that prices
  every kernel with a backend's functions, and ``totals`` that sums their times, bytes and
  flops.

A backend that rewrites a block before it runs it (the CUDA emitter fuses elementwise chains
into thread graphs) analyses the graph it runs, which is why ``kernel_costs`` hands the block
graph itself to the backend's ``block_cost``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Protocol, TypeVar

from mirage_jax.ir.graph import BlockGraph, KernelGraph, Node, Phase
from mirage_jax.ir.ops import ACCUMULATORS, ELEMENTWISE, REDUCTIONS, Op
from mirage_jax.ir.types import DType, TensorType

# kernel-graph nodes that launch nothing
_NO_KERNEL = frozenset({Op.INPUT, Op.OUTPUT, Op.RESHAPE})


@dataclass(frozen=True)
class MatmulShape:
    """An ``[..., m, k] @ [..., k, n]`` product."""

    m: int
    k: int
    n: int
    flops: float  # 2 m n k per batch element, over the whole product


@dataclass(frozen=True)
class TileRead:
    """One input iterator: the tile of kernel input ``arg`` that every block loads."""

    value: int  # the tile's value in the block graph
    arg: int
    tile: TensorType
    tensor: TensorType  # the whole input
    loads: int  # per block: the loop's iterations for a loop-varying tile, else 1
    blocks: int
    used_in_loop: bool  # a node of the loop body reads it

    @cached_property
    def total(self) -> int:
        """Bytes loaded by all blocks over all iterations."""
        return self.tile.nbytes * self.loads * self.blocks

    @cached_property
    def unique(self) -> int:
        """Bytes of the tensor: what the loads cover at least once."""
        return self.tensor.nbytes

    @property
    def rereads(self) -> float:
        """Bytes loaded beyond one pass over the tensor (replicated tiles, repeated loads)."""
        return max(0.0, self.total - self.unique)

    @property
    def run_bytes(self) -> int:
        """Contiguous bytes per run of the tile in its tensor."""
        return contiguous_run(self.tile.shape, self.tensor.shape, self.tile.dtype.itemsize)


@dataclass(frozen=True)
class NodeWork:
    """One computing node of a block graph, for one execution on its tiles."""

    node: Node
    phase: Phase  # of its output: BODY nodes run every iteration
    out_bytes: int
    out_elems: int
    in_elems: int  # elements of its largest operand
    matmul: MatmulShape | None
    # the elementwise ops applied per element: a thread graph's, or the node's own op for an
    # elementwise op, a reduction or an accumulator; () for anything else
    element_ops: tuple[Op, ...]

    @property
    def op(self) -> Op:
        return self.node.op

    @property
    def value(self) -> int:
        return self.node.outs[0]


@dataclass(frozen=True)
class BlockWork:
    """One graph-defined kernel: its tile loads, stores and computation (each derived when a
    cost model first asks for it: the models read different parts)."""

    block: BlockGraph
    phases: Mapping[int, Phase]  # of every value

    @property
    def grid(self) -> tuple[int, int, int]:
        return self.block.grid

    @property
    def blocks(self) -> int:
        return self.block.num_blocks

    @property
    def iterations(self) -> int:
        """Of the for-loop."""
        return self.block.forloop_range

    @cached_property
    def reads(self) -> tuple[TileRead, ...]:
        """Every input iterator's tile, in node order."""
        loop_inputs = {i for n in self.block.nodes for i in n.ins
                       if n.outs and self.phases[n.outs[0]] is Phase.BODY}  # fmt: skip
        return tuple(self._tile_read(n, loop_inputs) for n in self.block.nodes_of(Op.INPUT_ITER))

    def _tile_read(self, node: Node, loop_inputs: set[int]) -> TileRead:
        block, v, arg = self.block, node.outs[0], node.attr("arg")
        loads = block.forloop_range if self.phases[v] is Phase.BODY else 1
        return TileRead(v, arg, block.types[v], block.arg_types[arg], loads, block.num_blocks,
                        v in loop_inputs)  # fmt: skip

    @cached_property
    def written(self) -> int:
        """Bytes of the kernel's outputs, each stored once."""
        return sum(t.nbytes for t in self.block.output_types)

    @cached_property
    def nodes(self) -> tuple[NodeWork, ...]:
        """Every node but the input iterators and output savers, in order."""
        return tuple(_node_work(self.block, n, self.phases) for n in self.block.nodes
                     if n.op not in (Op.INPUT_ITER, Op.OUTPUT_SAVER))  # fmt: skip

    @cached_property
    def working_set(self) -> int:
        """Bytes of the tiles one block holds at once."""
        return working_set(self.block)

    @cached_property
    def accumulator_bytes(self) -> int:
        """Bytes of one block's accumulators."""
        types = self.block.types
        return sum(types[n.outs[0]].nbytes for n in self.block.nodes if n.op in ACCUMULATORS)

    @cached_property
    def loop_ops(self) -> tuple[Op, ...]:
        """The nodes that run every iteration (input iterators and accumulators included)."""
        return tuple(n.op for n in self.block.nodes if n.op in ACCUMULATORS
                     or (n.outs and self.phases[n.outs[0]] is Phase.BODY))  # fmt: skip

    @cached_property
    def has_f64(self) -> bool:
        """Some tile is float64."""
        return any(t.dtype is DType.F64 for t in self.block.types)

    def reads_by_input(self) -> dict[int, float]:
        """Bytes loaded from each kernel input by all blocks over all iterations."""
        reads: dict[int, float] = {}
        for r in self.reads:
            reads[r.arg] = reads.get(r.arg, 0.0) + r.total
        return reads


@dataclass(frozen=True)
class OpWork:
    """One pre-defined kernel-level op over whole tensors."""

    op: Op
    ins: tuple[TensorType, ...]
    outs: tuple[TensorType, ...]
    matmul: MatmulShape | None

    @property
    def bytes(self) -> float:
        """Every operand read once and every result written once."""
        return float(sum(t.nbytes for t in self.ins) + sum(t.nbytes for t in self.outs))

    @property
    def largest(self) -> int:
        """Elements of its largest operand or result."""
        return max(t.size for t in self.ins + self.outs)

    @property
    def in_elems(self) -> int:
        """Elements of all its operands."""
        return sum(t.size for t in self.ins)


def contiguous_run(tile: tuple[int, ...], full: tuple[int, ...], itemsize: int) -> int:
    """Contiguous bytes per run of a ``tile`` of a row-major ``full`` tensor: its rows, merged
    where the tile spans whole rows."""
    run = itemsize
    for t, f in zip(reversed(tile), reversed(full)):
        run *= t
        if t != f:
            break
    return run


def working_set(block: BlockGraph) -> int:
    """Bytes of the tiles one block holds at once: every non-fused value of the block."""
    total = 0
    for node in block.nodes:
        if node.op is Op.OUTPUT_SAVER:
            continue
        for o in node.outs:
            total += block.types[o].nbytes
    return total


def block_work(block: BlockGraph) -> BlockWork:
    """The work of one graph-defined kernel (see the module docstring)."""
    return BlockWork(block, block.phases())


def _node_work(block: BlockGraph, node: Node, phases: Mapping[int, Phase]) -> NodeWork:
    types = block.types
    out = types[node.outs[0]]
    widest = max((types[i].size for i in node.ins), default=0)
    mm = None
    ops: tuple[Op, ...] = ()
    if node.op is Op.MATMUL:
        mm = _matmul_shape(types[node.ins[0]], types[node.ins[1]], out)
    elif node.op is Op.THREAD:
        ops = tuple(n.op for n in node.attr("graph").nodes if n.op in ELEMENTWISE)
    elif node.op in ELEMENTWISE or node.op in REDUCTIONS or node.op in ACCUMULATORS:
        ops = (node.op,)
    return NodeWork(node, phases[node.outs[0]], out.nbytes, out.size, widest, mm, ops)


def _matmul_shape(a: TensorType, b: TensorType, out: TensorType) -> MatmulShape:
    m, k, n = a.shape[-2], a.shape[-1], b.shape[-1]
    return MatmulShape(m, k, n, 2.0 * out.size * k)


def op_work(graph: KernelGraph, node: Node) -> OpWork:
    """The work of one pre-defined op of ``graph``."""
    ins = tuple(graph.types[i] for i in node.ins)
    outs = tuple(graph.types[o] for o in node.outs)
    mm = _matmul_shape(ins[0], ins[1], outs[0]) if node.op is Op.MATMUL else None
    return OpWork(node.op, ins, outs, mm)


class KernelEstimate(Protocol):
    """What every backend's per-kernel estimate reports."""

    @property
    def time_s(self) -> float: ...

    @property
    def bytes(self) -> float: ...

    @property
    def flops(self) -> float: ...


K = TypeVar("K", bound=KernelEstimate)


def kernel_costs(graph: KernelGraph, block_cost: Callable[[BlockGraph, str], K],
                 op_cost: Callable[[OpWork], K]) -> tuple[K, ...]:  # fmt: skip
    """Every kernel of ``graph`` in order, priced by a backend: ``block_cost(block, what)`` for
    graph-defined kernels (``what`` is ``"graph_def #k"``), ``op_cost`` for pre-defined ops."""
    kernels: list[K] = []
    k = 0
    for node in graph.nodes:
        if node.op is Op.GRAPH_DEF:
            kernels.append(block_cost(node.attr("block"), f"graph_def #{k}"))
            k += 1
        elif node.op not in _NO_KERNEL:
            kernels.append(op_cost(op_work(graph, node)))
    return tuple(kernels)


def totals(kernels: Iterable[KernelEstimate]) -> tuple[float, float, float]:
    """(seconds, bytes, flops) of kernels run one after the other."""
    kernels = tuple(kernels)
    return (sum(k.time_s for k in kernels), sum(k.bytes for k in kernels),
            sum(k.flops for k in kernels))  # fmt: skip


__all__ = [
    "BlockWork", "KernelEstimate", "MatmulShape", "NodeWork", "OpWork", "TileRead", "block_work",
    "contiguous_run", "kernel_costs", "op_work", "totals", "working_set",
]  # fmt: skip
