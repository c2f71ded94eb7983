"""Macros: fragments of the target that seed a block task (applied before the op-by-op search)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from mirage_jax.ir.graph import KernelGraph
from mirage_jax.ir.ops import Op
from mirage_jax.search import abstract


@dataclass(frozen=True)
class Macro:
    """A fragment of the target (its ops back to the graph_def operands): ``nodes`` are
    (op, refs, attrs), a ref being ``("arg", j)`` for operand j's tile or ``("node", k)`` for
    the fragment's k-th node. A *seeded* block task applies its seeds first - each op through
    the same checks as single ops (shapes, phases, terms, indices, duplicates) - and searches
    op by op from there: a sub-search of the unseeded task that reaches large graphs (the
    per-row normalisations of QK-norm attention) without enumerating every way to build
    their prologues."""

    nodes: tuple[tuple[Op, tuple[tuple[str, int], ...], tuple[tuple[str, Any], ...]], ...]


def target_macros(
    target: KernelGraph, arg_terms: Sequence[Any], block_ops: Sequence[Op], max_size: int = 6,
    single_leaf: bool = False,
) -> tuple[Macro, ...]:
    """Every fragment of the target of 2..max_size ops ending at one target value whose
    leaves are graph_def operands (matched by term) and whose ops are block ops; with
    ``single_leaf``, only the maximal fragments that read one operand (prologues)."""
    terms = abstract.kernel_terms(target)
    leaf = {}
    for v, t in terms.items():
        for j, at in enumerate(arg_terms):
            if t == at and v not in leaf:
                leaf[v] = j
    allowed = set(block_ops)
    out: list[Macro] = []
    seen: set[Any] = set()
    for root in target.nodes:
        if root.op in (Op.INPUT, Op.OUTPUT) or root.outs[0] in leaf:
            continue
        order: list[Any] = []
        ok = _collect_fragment(target, root.outs[0], leaf, allowed, order, set())
        if not ok or not 2 <= len(order) <= max_size:
            continue
        index = {n.outs[0]: k for k, n in enumerate(order)}
        nodes = tuple(
            (n.op, tuple(("arg", leaf[i]) if i in leaf else ("node", index[i]) for i in n.ins),
             n.attrs)
            for n in order
        )  # fmt: skip
        leaves = {r for _, refs, _ in nodes for kind, r in refs if kind == "arg"}
        if single_leaf and len(leaves) != 1:
            continue
        if nodes not in seen:
            seen.add(nodes)
            out.append(Macro(nodes))
    if single_leaf:  # keep the maximal ones: not the tail of another fragment
        keys = [set(m.nodes) for m in out]
        out = [m for m, k in zip(out, keys) if not any(k < other for other in keys)]
    return tuple(out)


def _collect_fragment(
    target: KernelGraph, v: int, leaf: dict, allowed: set, order: list, done: set
) -> bool:
    """Append the ops computing ``v`` from the leaves to ``order`` (False: an input or an op
    that is not a block op is reached first)."""
    if v in leaf or v in done:
        return True
    node = target.producer(v)
    if node.op is Op.INPUT or node.op not in allowed:
        return False
    for i in node.ins:
        if not _collect_fragment(target, i, leaf, allowed, order, done):
            return False
    done.add(v)
    order.append(node)
    return True
