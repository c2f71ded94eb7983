"""Thread graphs by rule: fuse elementwise fragments of a block graph into THREAD nodes.

Mirage derives thread graphs by a rule rather than by search, and so do we. An elementwise node
(unary or binary op) joins the fragment of its consumers when

- every use of its value is by elementwise nodes of one fragment (so the value never needs a
  tile of its own: it lives in registers inside the fused loop),
- it is in the same loop phase as those consumers (an invariant or per-iteration value is not
  recomputed in a more frequent phase: hoisting stays intact), and
- its shape equals the consumers' output shape (a broadcast operand, e.g. a [16,1] norm
  factor against a [16,64] tile, is computed once rather than once per broadcast element).

Every maximal fragment of two or more nodes becomes one THREAD node at the position of its
root (its last node), holding a ``ThreadGraph`` whose INPUTs are the fragment's external
operands in order of first use. Inside a fragment a value may be used several times (a DAG),
which the fused loop evaluates once. The rewrite is pure and deterministic, evaluates exactly
as the original graph, and is idempotent.
"""

from __future__ import annotations

from mirage_jax.ir.graph import (
    BlockBuilder,
    BlockGraph,
    Node,
    Phase,
    ThreadBuilder,
    ThreadGraph,
    Value,
)
from mirage_jax.ir.ops import ELEMENTWISE, Op


def fuse_elementwise(block: BlockGraph) -> BlockGraph:
    """``block`` with its fusable elementwise fragments replaced by THREAD nodes."""
    groups = _fragments(block)
    if not any(len(members) > 1 for members in groups.values()):
        return block
    return _rebuild(block, groups)


def _fragments(block: BlockGraph) -> dict[int, list[int]]:
    """Fragment root node index -> member node indices in graph order (roots included)."""
    users: dict[int, list[int]] = {}
    for i, n in enumerate(block.nodes):
        for v in dict.fromkeys(n.ins):
            users.setdefault(v, []).append(i)
    phases = block.phases()
    root_of: dict[int, int] = {}
    # Consumers come later in graph order, so walking backwards sees each node's consumers'
    # fragments already settled.
    for i in reversed(range(len(block.nodes))):
        if block.nodes[i].op in ELEMENTWISE:
            root_of[i] = _join(block, i, users.get(block.nodes[i].outs[0], []), root_of, phases)
    groups: dict[int, list[int]] = {}
    for i in sorted(root_of):
        groups.setdefault(root_of[i], []).append(i)
    return groups


def _join(
    block: BlockGraph, i: int, users: list[int], root_of: dict[int, int],
    phases: dict[int, Phase],
) -> int:  # fmt: skip
    """The root of the fragment node ``i`` joins, or ``i`` itself if it starts one."""
    value = block.nodes[i].outs[0]
    roots = {root_of.get(u) for u in users}
    if not users or None in roots or len(roots) != 1:
        return i
    for u in users:
        out = block.nodes[u].outs[0]
        if phases[out] != phases[value] or block.types[out] != block.types[value]:
            return i
    return roots.pop()  # type: ignore[return-value]


def _rebuild(block: BlockGraph, groups: dict[int, list[int]]) -> BlockGraph:
    builder = BlockBuilder(block.grid, block.forloop_range, block.arg_types)
    new: dict[int, Value] = {}
    member_of = {m: root for root, members in groups.items() for m in members}
    for i, node in enumerate(block.nodes):
        root = member_of.get(i)
        if root is not None and len(groups[root]) > 1:
            if i == root:
                members = [block.nodes[m] for m in groups[root]]
                graph, external = _thread_graph(block, members)
                (out,) = builder.add_node(
                    Op.THREAD, tuple(new[v] for v in external), {"graph": graph}
                )
                new[node.outs[0]] = out
            continue
        outs = builder.add_node(node.op, tuple(new[v] for v in node.ins), node.attr_dict)
        new.update(zip(node.outs, outs))
    return builder.build()


def _thread_graph(block: BlockGraph, members: list[Node]) -> tuple[ThreadGraph, list[int]]:
    """The fused fragment as a ThreadGraph, and its external operands (block value ids)."""
    inside = {v for n in members for v in n.outs}
    external: list[int] = []
    for n in members:
        for v in n.ins:
            if v not in inside and v not in external:
                external.append(v)
    tb = ThreadBuilder()
    local = {v: tb.input(block.types[v]) for v in external}
    for n in members:
        local[n.outs[0]] = tb.apply(n.op, *(local[v] for v in n.ins), **n.attr_dict)
    tb.output(local[members[-1].outs[0]])
    return tb.build(), external


__all__ = ["fuse_elementwise"]
