"""Ordering candidates for verification and timing: rank keys, representative tilings,
site priorities and the round-robin over structure classes that keeps the shortlist varied."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from mirage_jax.ir.graph import KernelGraph
from mirage_jax.ir.ops import ACCUMULATORS, Op
from mirage_jax.search import enumeration as en
from mirage_jax.search.config import SearchSpace
from mirage_jax.search.report import Candidate


def structure(graph: KernelGraph) -> tuple[int, bool]:
    """(kernels, whether a graph-defined kernel accumulates over a for-loop): the classes
    the shortlist mixes."""
    kernels = [n for n in graph.nodes if n.op not in (Op.INPUT, Op.OUTPUT, Op.RESHAPE)]
    accumulates = any(m.op in ACCUMULATORS for n in kernels if n.op is Op.GRAPH_DEF
                      for m in n.attr("block").nodes)  # fmt: skip
    return len(kernels), accumulates


def site_structure(site: en.Site, skel: en.Skeleton) -> tuple[int, bool]:
    """``structure`` of every graph that instantiates ``skel`` at ``site``, known before any
    tiling is chosen: the prefix's kernels and the graph-defined one."""
    kernels = sum(op is not Op.RESHAPE for op, _, _ in site.prefix.nodes) + 1
    return kernels, any(n.op in ACCUMULATORS for n in skel.block.nodes)


def diversify(ranked: Sequence[Candidate]) -> list[Candidate]:
    """Candidates round-robin over their structure classes, each class in rank order, the
    classes in the order of their best: the first few verified and timed then differ in
    kind (fused or not, accumulating or not), which the cost model orders least reliably."""
    classes: dict[tuple[int, bool], list[Candidate]] = {}
    for c in ranked:
        classes.setdefault(structure(c.graph), []).append(c)
    queues = list(classes.values())  # dicts keep insertion order: the order of each best
    out: list[Candidate] = []
    depth = 0
    while len(out) < len(ranked):
        out += [q[depth] for q in queues if depth < len(q)]
        depth += 1
    return out


def rank_key(c: Candidate) -> tuple:
    """Estimated time, in buckets of 2% (the model cannot tell such times apart), then fewer
    kernels, then the canonical text for determinism."""
    bucket = math.floor(math.log(max(c.estimate_s, 1e-9)) / math.log(1.02))
    kernels = sum(n.op not in (Op.INPUT, Op.OUTPUT, Op.RESHAPE) for n in c.graph.nodes)
    return (bucket, kernels, c.estimate_s, c.graph.fingerprint())


def round_robin(scored: Sequence[tuple], n: int) -> set[int]:
    """Indices of the ``n`` skeletons to expand at every tiling: the best of each (site,
    loop structure) group first, then the second best of each, ... (variety for ranking)."""
    groups: dict[Any, list[int]] = {}
    for k, (_, _, site, skel, *_) in enumerate(scored):
        groups.setdefault((site.prefix.nodes, site.operands, skel.fdims), []).append(k)
    chosen: set[int] = set()
    depth = 0
    while len(chosen) < n and any(len(g) > depth for g in groups.values()):
        for g in groups.values():
            if depth < len(g) and len(chosen) < n:
                chosen.add(g[depth])
        depth += 1
    return chosen


def representative(tilings: Sequence[en.Tiling], space: SearchSpace) -> en.Tiling | None:
    """A middle-of-the-road tiling: blocks nearest 4 per core, then the middle loop range."""
    if not tilings:
        return None
    want = 4 * space.cores

    def blocks(t: en.Tiling) -> int:
        return t.grid[0] * t.grid[1] * t.grid[2]

    best = min(tilings, key=lambda t: (abs(blocks(t) - want), t.forloop))
    ranges = sorted({t.forloop for t in tilings if t.axes == best.axes})
    mid = ranges[len(ranges) // 2]
    return next(t for t in tilings if t.axes == best.axes and t.forloop == mid)


def site_cost(site: en.Site) -> int:
    """Sites in order: fewer compute ops before the graph_def, then fewer layout ops; operands
    of different ranks (which block ops cannot combine) last among their peers."""
    compute = sum(op not in (Op.RESHAPE, Op.TRANSPOSE, Op.SLICE, Op.CAST)
                  for op, _, _ in site.prefix.nodes)  # fmt: skip
    mixed = len({t.rank for t in site.arg_types}) > 1
    return 10 * compute + site.prefix.num_ops + 5 * mixed


__all__ = ["diversify", "rank_key", "representative", "round_robin", "site_cost", "structure"]
