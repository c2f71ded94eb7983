"""Where a half-precision value is rounded to its dtype: the contract's precision rule.

bfloat16 and float16 values are computed in float32 and rounded to their type where XLA writes
them out (the reference interpreter's semantics, which the CPU and CUDA kernels follow):

- graph inputs and outputs, and casts (they round by definition);
- the results of matmuls and reductions, which end XLA's fusions (but not a partial result an
  accumulator folds further: accumulators hold float32 until the loop ends);
- an elementwise result that a matmul reads, when only matmuls and reductions read it: XLA
  writes a dot's operand out in its type, and tensor cores and AVX512_BF16 multiply it in
  that type. (Read by other elementwise ops too, it stays in float32 as in XLA's fusions.)

Elementwise chains otherwise stay in float32 unrounded (XLA's excess precision).
"""

from __future__ import annotations

from mirage_jax.ir.graph import Graph, Node
from mirage_jax.ir.ops import ACCUMULATORS, ELEMENTWISE, REDUCTIONS, Op
from mirage_jax.ir.types import DType

HALF = frozenset({DType.BF16, DType.F16})


def materialised(graph: Graph, node: Node) -> bool:
    """Whether ``node``'s result is written out in its dtype (rounded, for a half type)."""
    users = graph.users(node.outs[0])
    if node.op is Op.MATMUL or node.op in REDUCTIONS:
        return not any(u.op in ACCUMULATORS for u in users)
    if node.op not in ELEMENTWISE and node.op is not Op.THREAD:
        return False
    return (graph.types[node.outs[0]].dtype in HALF
            and any(u.op is Op.MATMUL for u in users)
            and all(u.op is Op.MATMUL or u.op in REDUCTIONS for u in users))  # fmt: skip


__all__ = ["HALF", "materialised"]
