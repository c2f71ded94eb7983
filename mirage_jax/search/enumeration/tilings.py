"""Tilings of a skeleton: the grid splits it admits (``split_patterns``), every concrete tiling
within the space (``tilings``), and the skeleton rebuilt at one of them (``instantiate``)."""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from mirage_jax.errors import GraphError
from mirage_jax.ir.graph import BlockBuilder, BlockGraph
from mirage_jax.ir.ops import ACCUMULATORS, REDUCTIONS, Op
from mirage_jax.search.enumeration.rules import N
from mirage_jax.search.enumeration.tasks import Skeleton


@dataclass(frozen=True)
class SplitPattern:
    """How one grid axis partitions a skeleton: a dim per operand (-1: replicated) and per saver."""

    imap: tuple[int, ...]
    omap: tuple[int, ...]


def split_patterns(skel: Skeleton) -> list[SplitPattern]:
    """Every consistent way one grid axis can partition the skeleton's tensors.

    A split follows a dim through the ops: elementwise ops keep it (an unsplit operand must be
    broadcast along it), reductions and accumulators over it are invalid (they would leave
    partial results), matmul keeps batch dims and the free dims of each side (a split
    contraction dim is invalid). Every saved value must be split (its grid axis must be mapped).
    """
    block = skel.block
    iters = block.nodes_of(Op.INPUT_ITER)
    options = []
    for n in iters:
        t = block.types[n.outs[0]]
        f = n.attr("fdim")
        options.append([N] + [d for d, s in enumerate(t.shape) if s > 1 and d != f])
    out = []
    for choice in itertools.product(*options):
        if all(c == N for c in choice):
            continue
        omap = _propagate(block, dict(zip((n.outs[0] for n in iters), choice)))
        if omap is not None:
            out.append(SplitPattern(tuple(choice), omap))
    return out


def _propagate(block: BlockGraph, split: dict[int, int]) -> tuple[int, ...] | None:
    """The saver dims (omap) of the split that starts at the iterators' dims ``split`` (None:
    some op or saver cannot follow it)."""
    types = block.types
    for node in block.nodes:
        if node.op is Op.INPUT_ITER or node.op is Op.OUTPUT_SAVER:
            continue
        s = _split_of(node, split, types)
        if s is False:
            return None
        split[node.outs[0]] = s  # type: ignore[assignment]
    omap = []
    for saver in block.outputs:
        s = split[saver.ins[0]]
        if s == N or s == saver.attr("fdim"):
            return None
        omap.append(s)
    return tuple(omap)


def _split_of(node, split: dict[int, int], types) -> int | bool:
    """The split dim of a node's result (N: unsplit), or False if the split is invalid."""
    op, ins = node.op, node.ins
    sp = [split[i] for i in ins]
    if op in REDUCTIONS or (op in ACCUMULATORS and op is not Op.ACC_RESCALE_SUM):
        dim = node.attr("dim")
        return False if sp[0] != N and sp[0] == dim else sp[0]
    if op is Op.MATMUL:
        return _matmul_split(sp, len(types[ins[0]].shape))
    if op is Op.CONCAT:
        dim = node.attr("dim")
        if sp[0] != sp[1] or sp[0] == dim:
            return False
        return sp[0]
    # elementwise (unary, binary, rescale_sum): one split dim; unsplit operands broadcast on it
    splits = {s for s in sp if s != N}
    if not splits:
        return N
    if len(splits) > 1:
        return False
    s = splits.pop()
    for i, si in zip(ins, sp):
        if si == N and types[i].shape[s] != 1:
            return False
    return s


def _matmul_split(sp: list[int], rank: int) -> int | bool:
    """A matmul keeps a batch dim split on both sides or one free dim (not the contraction)."""
    a, b = sp
    if a == rank - 1 or b == rank - 2:
        return False
    outs = set()
    if a != N:
        outs.add(a)
    if b != N:
        outs.add(b)
    if len(outs) > 1:
        return False
    s = outs.pop() if outs else N
    if s != N and s < rank - 2 and (a != s or b != s):
        return False  # a batch dim split on one side only
    return s


@dataclass(frozen=True)
class Tiling:
    """A concrete grid for a skeleton: per used grid axis, a pattern and a size."""

    axes: tuple[tuple[SplitPattern, int], ...]
    forloop: int

    @property
    def grid(self) -> tuple[int, int, int]:
        g = [size for _, size in self.axes] + [1] * (3 - len(self.axes))
        return (g[0], g[1], g[2])


def tilings(skel: Skeleton, space: Any) -> list[Tiling]:
    """Every concrete tiling of a skeleton within the space's grid and loop candidates.

    ``SearchConfig.imaps``/``omaps`` do not filter here: ``instantiate`` checks the built maps.
    """
    cfg = space.config
    sized = _sized_patterns(skel.block, split_patterns(skel), space.grid_sizes)
    ranges = _loop_ranges(skel.block, space)
    lo_blocks, hi_blocks = space.cores, cfg.max_blocks
    out = []
    for axes in _axis_combos(sized, cfg.max_grid_axes):
        blocks = 1
        for _, g in axes:
            blocks *= g
        if blocks != 1 and not lo_blocks <= blocks <= hi_blocks:
            continue
        for r in ranges:
            out.append(Tiling(axes, r))
    return out


def _sized_patterns(
    block: BlockGraph, patterns: Sequence[SplitPattern], grid_sizes: Sequence[int]
) -> list[tuple[int, SplitPattern, int]]:
    """(pattern index, pattern, grid size) for every size that divides each split dim."""
    arg_shapes = [t.shape for t in block.arg_types]
    iters = block.nodes_of(Op.INPUT_ITER)
    out_shapes = [t.shape for t in block.output_types]
    sized: list[tuple[int, SplitPattern, int]] = []
    for pi, pat in enumerate(patterns):
        for g in grid_sizes:
            ok = all(
                d == N or arg_shapes[n.attr("arg")][d] % g == 0 for n, d in zip(iters, pat.imap)
            ) and all(out_shapes[k][d] % g == 0 for k, d in enumerate(pat.omap))
            if ok:
                sized.append((pi, pat, g))
    return sized


def _loop_ranges(block: BlockGraph, space: Any) -> tuple[int, ...]:
    """The space's loop ranges for the extents the skeleton's loop splits ((1,): no loop)."""
    extents = tuple(
        block.arg_types[n.attr("arg")].shape[n.attr("fdim")]
        for n in block.nodes_of(Op.INPUT_ITER) if n.attr("fdim") != N
    )  # fmt: skip
    return space.forloop_ranges(extents) if extents else (1,)


def _axis_combos(
    sized: Sequence[tuple[int, SplitPattern, int]], max_axes: int
) -> list[tuple[tuple[SplitPattern, int], ...]]:
    """The grids: no split, then 1..max_axes sized patterns, distinct and splitting disjoint
    dims of every operand and saver."""
    combos: list[tuple[tuple[SplitPattern, int], ...]] = [()]
    for n_axes in range(1, max_axes + 1):
        for chosen in itertools.combinations(sized, n_axes):
            if len({pi for pi, _, _ in chosen}) < n_axes or not _disjoint(chosen):
                continue
            combos.append(tuple((pat, g) for _, pat, g in chosen))
    return combos


def _disjoint(chosen: Sequence[tuple[int, SplitPattern, int]]) -> bool:
    """Do the chosen axes split different dims of every operand and saver?"""
    pats = [p for _, p, _ in chosen]
    for k in range(len(pats[0].imap)):
        used = [p.imap[k] for p in pats if p.imap[k] != N]
        if len(used) != len(set(used)):
            return False
    for k in range(len(pats[0].omap)):
        used = [p.omap[k] for p in pats]
        if len(used) != len(set(used)):
            return False
    return True


def instantiate(skel: Skeleton, tiling: Tiling, space: Any | None = None) -> BlockGraph | None:
    """The skeleton rebuilt at a concrete tiling (None if the IR rejects it, or if the space's
    ``imaps``/``omaps`` exclude one of its maps)."""
    block = skel.block
    iters = block.nodes_of(Op.INPUT_ITER)
    pad = [N] * (3 - len(tiling.axes))
    imaps: dict[int, list[int]] = {}
    for k, n in enumerate(iters):
        imaps[n.outs[0]] = [pat.imap[k] for pat, _ in tiling.axes] + pad
    omaps = [[pat.omap[k] for pat, _ in tiling.axes] + pad for k in range(len(block.outputs))]
    cfg = space.config if space is not None else None
    if cfg is not None and not _maps_allowed(cfg, imaps.values(), omaps):
        return None
    try:
        return _rebuild(block, tiling, imaps, omaps)
    except GraphError:
        return None


def _maps_allowed(cfg: Any, imaps: Iterable[list[int]], omaps: Sequence[list[int]]) -> bool:
    if cfg.imaps is not None and any(tuple(m) not in cfg.imaps for m in imaps):
        return False
    return cfg.omaps is None or all(tuple(m) in cfg.omaps for m in omaps)


def _rebuild(
    block: BlockGraph, tiling: Tiling, imaps: dict[int, list[int]], omaps: Sequence[list[int]]
) -> BlockGraph:
    bb = BlockBuilder(tiling.grid, tiling.forloop, block.arg_types)
    vals: dict[int, Any] = {}
    saver = 0
    for node in block.nodes:
        if node.op is Op.INPUT_ITER:
            vals[node.outs[0]] = bb.input_iter(
                node.attr("arg"), tuple(imaps[node.outs[0]]), node.attr("fdim")
            )
        elif node.op is Op.OUTPUT_SAVER:
            bb.output_saver(vals[node.ins[0]], tuple(omaps[saver]), node.attr("fdim"))
            saver += 1
        else:
            (out,) = bb.add_node(node.op, tuple(vals[i] for i in node.ins), node.attr_dict)
            vals[node.outs[0]] = out
    return bb.build()
