"""Canonical forms of block graphs: compute nodes in the enumeration's canonical order, so that
two skeletons are the same dataflow graph exactly when their canonical forms are equal."""

from __future__ import annotations

from typing import Any

from mirage_jax.ir.graph import BlockBuilder, BlockGraph
from mirage_jax.ir.ops import ACCUMULATORS, Op
from mirage_jax.search.enumeration.rules import BODY, EPI, INV, OP_RANK, attr_key


def _stage(node_op: Op, phase: int) -> int:
    if node_op in ACCUMULATORS:
        return 2
    return {INV: 0, BODY: 1, EPI: 3}[phase]


def canonical_block(block: BlockGraph) -> BlockGraph:
    """``block`` with its compute nodes in the canonical order of the enumeration.

    Adjacent independent nodes whose keys are out of order are swapped until none are (this
    ends: see the package docstring). Iterators stay first in operand order, savers last.
    Two skeletons are the same dataflow graph exactly when their canonical forms are equal.
    """
    phases = {v: p.value for v, p in block.phases().items()}
    iters = [n for n in block.nodes if n.op is Op.INPUT_ITER]
    savers = [n for n in block.nodes if n.op is Op.OUTPUT_SAVER]
    body = [n for n in block.nodes if n.op not in (Op.INPUT_ITER, Op.OUTPUT_SAVER)]
    while _swap_one(body, iters, phases):
        pass
    bb = BlockBuilder(block.grid, block.forloop_range, block.arg_types)
    vals: dict[int, Any] = {}
    for n in iters:
        vals[n.outs[0]] = bb.input_iter(n.attr("arg"), n.attr("imap"), n.attr("fdim"))
    for n in body:
        (vals[n.outs[0]],) = bb.add_node(n.op, tuple(vals[i] for i in n.ins), n.attr_dict)
    for n in savers:
        bb.output_saver(vals[n.ins[0]], n.attr("omap"), n.attr("fdim"))
    return bb.build()


def _swap_one(body: list[Any], iters: list[Any], phases: dict[int, int]) -> bool:
    """Swap the first adjacent independent pair of ``body`` whose keys are out of order
    (False: there is none). Operands are keyed by their position in the current order."""
    pos = {n.outs[0]: k for k, n in enumerate(iters)}
    for k, n in enumerate(body):
        pos[n.outs[0]] = len(iters) + k
    for k in range(len(body) - 1):
        a, b = body[k], body[k + 1]
        if a.outs[0] not in b.ins and _key(a, pos, phases) > _key(b, pos, phases):
            body[k], body[k + 1] = b, a
            return True
    return False


def _key(n: Any, pos: dict[int, int], phases: dict[int, int]) -> tuple:
    return (_stage(n.op, phases[n.outs[0]]), OP_RANK[n.op], attr_key(n.attrs),
            tuple(pos[i] for i in n.ins))  # fmt: skip
