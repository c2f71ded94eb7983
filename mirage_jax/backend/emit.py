"""What the C++ and CUDA emitters do the same way: plan where kernel values live, walk a kernel
graph, and spell what both runtimes spell alike.

Storage (``plan_storage``): each kernel-graph value lives in an input buffer, an output buffer,
a byte offset of one scratch area, or - a reshape - in the memory of the value it reshapes (its
root). An output is computed in place by its root's producer; it is copied into its output
buffer only when its root is an input or already fills an earlier output. ``KernelEmitter``
walks the graph in order on that plan and leaves each backend to spell the steps.

Each backend keeps its own ``TABLE`` (op -> runtime ``Template``): that is its vocabulary. The
elementwise functors both runtimes share are named by each op's ``OpInfo.functor``.
"""

from __future__ import annotations

import abc
import math
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TypeVar

from mirage_jax.errors import CompileError
from mirage_jax.ir.graph import BlockGraph, KernelGraph, Node, Phase, ThreadGraph
from mirage_jax.ir.ops import ACCUMULATORS, BINARY, NONE_DIM, REDUCTIONS, UNARY, Op
from mirage_jax.ir.types import TensorType

_SYMBOL = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@dataclass(frozen=True)
class Template:
    """What an op instantiates in a backend's runtime: the entry point ``fn`` and, where it
    takes one, the ``functor`` (op functor, reducer or accumulator type) it is instantiated
    with. Each backend's ``TABLE`` documents how its runtime spells them."""

    fn: str
    functor: str = ""


def op_functor(op: Op) -> str:
    """The elementwise functor both runtimes define for ``op``: ``mj::op::<OpInfo.functor>``."""
    return f"mj::op::{op.info.functor}"


def check_table(table: Mapping[Op, Template], backend: str) -> None:
    """Guards a backend's table against a new ``Op`` without a template."""
    missing = set(Op) - set(table)
    if missing:  # pragma: no cover - only a new Op can trip it
        raise RuntimeError(f"ops without a {backend} template: {missing}")


def check_request(graph: object, symbol: str, emitter: str) -> None:
    """The arguments of ``emit_<backend>``: a kernel graph and a C identifier."""
    if not isinstance(graph, KernelGraph):
        raise CompileError(f"{emitter} needs a KernelGraph, got {type(graph).__name__}")
    if not _SYMBOL.fullmatch(symbol):
        raise CompileError(
            f"kernel symbol {symbol!r} is not a C identifier",
            remedy="use letters, digits and underscores, not starting with a digit",
        )


# ------------------------------------------------------------------------------ C++ spelling


def op_group(op: Op) -> str:
    """The emitter entry an op is spelled by: its kind for elementwise ops, reductions and
    accumulators, else its own name."""
    if op in UNARY or op is Op.CAST:
        return "unary"
    if op in BINARY:
        return "binary"
    if op in REDUCTIONS:
        return "reduce"
    if op in ACCUMULATORS:
        return "acc"
    return op.value


_Emit = TypeVar("_Emit")


def lookup(table: Mapping[str, _Emit], op: Op, backend: str, level: str) -> _Emit:
    """The entry of a backend's emitter table for ``op`` (by ``op_group``), or a CompileError."""
    emit = table.get(op_group(op))
    if emit is None:
        raise CompileError(f"{backend} backend: {op.value} is not supported in a {level} graph")
    return emit


def shape_type(shape: Iterable[int]) -> str:
    return f"mj::Shape<{','.join(map(str, shape))}>"


def literal(x: float, nan: str, inf: str) -> str:
    """A C++ floating-point literal for ``x``; ``nan`` and ``inf`` spell the special values."""
    if math.isnan(x):
        return nan
    if math.isinf(x):
        return inf if x > 0 else f"-{inf}"
    text = repr(float(x))
    return text if any(c in text for c in ".en") else text + ".0"


def node_text(node: Node, attrs: bool = False) -> str:
    """A node as the comment beside its code: ``%3 = exp(%1)``, with ``[k=v, ...]`` if asked."""
    outs = ", ".join(f"%{o}" for o in node.outs)
    ins = ", ".join(f"%{i}" for i in node.ins)
    head = f"{outs} = " if outs else ""
    shown = ", ".join(f"{k}={v}" for k, v in node.attrs if k not in ("block", "graph"))
    return f"{head}{node.op.value}{f'[{shown}]' if attrs and shown else ''}({ins})"


def indent(stmts: Iterable[str], prefix: str) -> list[str]:
    return [prefix + line for stmt in stmts for line in stmt.split("\n")]


# ------------------------------------------------------------------------- block and thread


# The part of a block kernel a value of each phase is computed in: before, in or after the loop.
SECTION = {Phase.INVARIANT: "pre", Phase.BODY: "loop", Phase.EPILOGUE: "post"}


def fusable_matmuls(g: BlockGraph, phases: Mapping[int, Phase]) -> dict[int, int]:
    """Body matmuls whose only use is an acc_sum over no dim, which both backends accumulate in
    place: matmul value -> acc value."""
    fused = {}
    for n in g.nodes_of(Op.MATMUL):
        users = g.users(n.outs[0])
        if (
            len(users) == 1
            and users[0].op is Op.ACC_SUM
            and users[0].attr("dim") == NONE_DIM
            and phases[n.outs[0]] is Phase.BODY
        ):
            fused[n.outs[0]] = users[0].outs[0]
    return fused


def thread_steps(graph: ThreadGraph) -> tuple[list[Node], int]:
    """The computing nodes of a thread graph in order, and the value it returns."""
    steps = [n for n in graph.nodes if n.op not in (Op.INPUT, Op.OUTPUT)]
    return steps, graph.outputs[0].ins[0]


# ---------------------------------------------------------------------------- kernel level


@dataclass(frozen=True)
class StoragePlan:
    """Where every kernel-graph value lives (see the module docstring)."""

    alias: Mapping[int, int]  # reshape result -> its root, the value whose memory it is
    input_index: Mapping[int, int]  # input value -> input buffer number
    output_of: Mapping[int, int]  # value computed in place -> output buffer number
    copy_to: Mapping[int, int]  # position of an OUTPUT node -> output number to copy into
    offset: Mapping[int, int]  # other computed value -> scratch byte offset
    scratch_bytes: int

    def root(self, v: int) -> int:
        return self.alias.get(v, v)


def plan_storage(
    graph: KernelGraph,
    align: int,
    nbytes: Callable[[TensorType], int] = lambda t: t.nbytes,
    in_place: Callable[[int], bool] = lambda v: True,
) -> StoragePlan:
    """Buffers for ``graph``'s values; scratch offsets are multiples of ``align`` bytes and a
    scratch value takes ``nbytes(type)`` (a backend may hold some dtypes wider); a value may
    be computed in its output buffer where ``in_place(value)``, else it is copied there."""
    alias: dict[int, int] = {}
    for n in graph.nodes_of(Op.RESHAPE):
        alias[n.outs[0]] = alias.get(n.ins[0], n.ins[0])
    input_index = {n.outs[0]: i for i, n in enumerate(graph.inputs)}
    output_of: dict[int, int] = {}
    copy_to: dict[int, int] = {}
    outputs = [pos for pos, n in enumerate(graph.nodes) if n.op is Op.OUTPUT]
    for k, pos in enumerate(outputs):
        root = alias.get(graph.nodes[pos].ins[0], graph.nodes[pos].ins[0])
        # an input is read-only and a value fills one buffer: those outputs are copies
        if root in input_index or root in output_of or not in_place(root):
            copy_to[pos] = k
        else:
            output_of[root] = k
    offset: dict[int, int] = {}
    scratch = 0
    for n in graph.nodes:
        if n.op in (Op.INPUT, Op.OUTPUT, Op.RESHAPE):
            continue
        for v in n.outs:
            if v not in output_of:
                offset[v] = scratch
                scratch += -(-nbytes(graph.types[v]) // align) * align
    return StoragePlan(alias, input_index, output_of, copy_to, offset, scratch)


class KernelEmitter(abc.ABC):
    """Walks a kernel graph in order on its storage plan; a backend spells each step.

    Subclasses set ``scratch_align`` and ``prefix`` (kernel values are named ``<prefix><id>``)
    and implement the ``input``, ``copy_output``, ``reshape``, ``declare`` and ``compute``
    steps, appending to ``lines`` (the kernel's body) and ``blocks`` (the source of each
    graph-defined kernel, placed before it).
    """

    scratch_align = 1
    prefix = "v"

    def __init__(self, graph: KernelGraph, symbol: str) -> None:
        self.g = graph
        self.symbol = symbol
        self.lines: list[str] = []
        self.blocks: list[str] = []
        self.storage = plan_storage(
            graph, self.scratch_align, self.scratch_nbytes, self.computed_in_output
        )

    def scratch_nbytes(self, t: TensorType) -> int:
        """Bytes of a scratch value of type ``t`` (its own dtype's, unless a backend widens)."""
        return t.nbytes

    def computed_in_output(self, v: int) -> bool:
        """Whether value ``v``, a kernel output, may be computed in its output buffer."""
        return True

    def var(self, v: int) -> str:
        return f"{self.prefix}{v}"

    def walk(self) -> None:
        st = self.storage
        for pos, node in enumerate(self.g.nodes):
            if node.op is Op.INPUT:
                self.input(node.outs[0], st.input_index[node.outs[0]])
            elif node.op is Op.OUTPUT:
                if pos in st.copy_to:
                    self.copy_output(st.copy_to[pos], node.ins[0])
            elif node.op is Op.RESHAPE:
                self.reshape(node)
            else:
                for v in node.outs:
                    self.declare(v)
                self.compute(node)

    @abc.abstractmethod
    def input(self, v: int, index: int) -> None:
        """Names input value ``v``: input buffer ``index`` (read-only)."""

    @abc.abstractmethod
    def copy_output(self, k: int, v: int) -> None:
        """Copies ``v`` into output buffer ``k`` (the plan's ``copy_to``)."""

    @abc.abstractmethod
    def reshape(self, node: Node) -> None:
        """Names a reshape's result as a view of its operand's memory."""

    @abc.abstractmethod
    def declare(self, v: int) -> None:
        """Names ``v`` where the plan puts it: output ``output_of[v]`` or scratch ``offset[v]``."""

    @abc.abstractmethod
    def compute(self, node: Node) -> None:
        """Emits a computing node whose results are declared."""

    def banner(self, module: str) -> str:
        return f"// Generated by {module} for kernel graph {self.g.fingerprint()[:16]}."


__all__ = [
    "SECTION", "KernelEmitter", "StoragePlan", "Template", "check_request", "check_table",
    "fusable_matmuls", "indent", "literal", "lookup", "node_text", "op_functor", "op_group",
    "plan_storage", "shape_type", "thread_steps",
]  # fmt: skip
