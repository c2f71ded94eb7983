"""The μGraph IR: one op vocabulary, typed frozen graphs at three levels, canonical text."""

from __future__ import annotations

from mirage_jax.ir.graph import (
    BlockBuilder,
    BlockGraph,
    Graph,
    KernelBuilder,
    KernelGraph,
    Node,
    Phase,
    ThreadBuilder,
    ThreadGraph,
    Value,
    copy_into,
    map_blocks,
    node_phase,
)
from mirage_jax.ir.ops import (
    ACCUMULATORS,
    BINARY,
    ELEMENTWISE,
    LAYOUT,
    MASKED,
    NONE_DIM,
    OP_INFO,
    REDUCTIONS,
    SCALAR_UNARY,
    UNARY,
    Level,
    Op,
)
from mirage_jax.ir.shapes import BlockContext
from mirage_jax.ir.text import fingerprint, parse, rebuild, to_text
from mirage_jax.ir.types import BF16, BOOL, F16, F32, F64, DType, TensorType

__all__ = [
    "ACCUMULATORS", "BF16", "BINARY", "BOOL", "ELEMENTWISE", "F16", "F32", "F64", "LAYOUT",
    "MASKED", "NONE_DIM",
    "OP_INFO", "REDUCTIONS", "SCALAR_UNARY", "UNARY", "BlockBuilder", "BlockContext",
    "BlockGraph", "DType", "Graph", "KernelBuilder", "KernelGraph", "Level", "Node", "Op",
    "Phase", "TensorType", "ThreadBuilder", "ThreadGraph", "Value", "copy_into", "fingerprint",
    "map_blocks", "node_phase", "parse", "rebuild", "to_text",
]  # fmt: skip
