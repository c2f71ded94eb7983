"""A target's output reshapes: peeled off before the search, put back on what it finds.

A region's outputs often drop the reduced dims (``jnp.sum(x, axis=-1)`` keeps no ``[n, 1]``),
so its graph ends in kernel-level reshapes. A graph-defined kernel's results are outputs as
they are, so no candidate with a graph-defined kernel could end in that reshape: the search
found no fused form of such a region at all. A reshape is free (a view of the same elements in
the same order), so the search runs on the target without its trailing reshapes and every
graph it returns gets them back.
"""

from __future__ import annotations

from mirage_jax.ir.graph import KernelBuilder, KernelGraph, Value, copy_into
from mirage_jax.ir.ops import Op
from mirage_jax.ir.types import TensorType


def peel(target: KernelGraph) -> KernelGraph:
    """``target`` with every output read before its chain of reshapes (``target`` itself if
    none ends in one); nodes left unused are dropped."""
    outs = [_before_reshapes(target, n.ins[0]) for n in target.outputs]
    if outs == [n.ins[0] for n in target.outputs]:
        return target
    live, stack = set(), list(outs)
    while stack:
        v = stack.pop()
        if v not in live:
            live.add(v)
            stack.extend(target.producer(v).ins)
    kb = KernelBuilder()
    vals: dict[int, Value] = {}
    for node in target.nodes:
        if node.op is Op.INPUT:  # every input stays: the search target takes the same arguments
            vals[node.outs[0]] = kb.input(target.types[node.outs[0]])
        elif node.op is not Op.OUTPUT and node.outs[0] in live:
            made = kb.add_node(node.op, tuple(vals[i] for i in node.ins), node.attr_dict)
            vals.update(zip(node.outs, made))
    for v in outs:
        kb.output(vals[v])
    return kb.build()


def restore(graph: KernelGraph, types: tuple[TensorType, ...]) -> KernelGraph:
    """``graph`` with its outputs reshaped to ``types`` where their shapes differ."""
    if graph.output_types == types:
        return graph

    def reshaped(kb: KernelBuilder, k: int, y: Value) -> Value:
        want = types[k].shape
        return y if y.type.shape == want else kb.apply(Op.RESHAPE, y, shape=want)

    kb = KernelBuilder()
    copy_into(kb, graph, output_fn=reshaped)
    return kb.build()


def _before_reshapes(graph: KernelGraph, v: int) -> int:
    node = graph.producer(v)
    while node.op is Op.RESHAPE:
        v = node.ins[0]
        node = graph.producer(v)
    return v


__all__ = ["peel", "restore"]
