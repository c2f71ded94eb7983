"""Block-level enumeration tasks: what a task fixes (``BlockTask``: operands, loop structure),
what it yields (``Skeleton``, ``BlockResult``), and the loop structures a site offers."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from mirage_jax.ir.graph import BlockGraph, KernelGraph
from mirage_jax.ir.ops import REDUCTIONS, Op
from mirage_jax.ir.types import TensorType
from mirage_jax.search.enumeration.counters import Counters
from mirage_jax.search.enumeration.index import IndexInfo
from mirage_jax.search.enumeration.macros import Macro
from mirage_jax.search.enumeration.rules import N


@dataclass(frozen=True)
class BlockTask:
    """One block-level enumeration: operands, loop structure and what the savers must produce.

    ``fdims[i]`` is the dim of operand i the for-loop splits (-1: loop-invariant);
    ``forloop`` the representative loop range (1 when no operand is split).
    """

    arg_types: tuple[TensorType, ...]
    arg_terms: tuple[Any, ...]
    fdims: tuple[int, ...]
    forloop: int
    out_types: tuple[TensorType, ...]
    max_ops: int
    max_states: int
    prune: bool = True
    priority: int = 0
    # the index analysis (None: off): operand infos, target output classes, target events
    arg_index: tuple[IndexInfo, ...] | None = None
    out_index: tuple[tuple[Any, ...], ...] | None = None
    events: frozenset[Any] = frozenset()
    loop_class: Any = None  # the index class of the loop-split dims
    seeds: tuple[Macro, ...] = ()  # target fragments applied before the op-by-op search
    shifted_exp: bool = False  # every exp must take a max-shifted value (see terms.shifted_exps)
    replay: bool = False  # the seed is a whole stored skeleton: nothing to search without it

    @property
    def label(self) -> str:
        loops = ",".join("-" if f == N else str(f) for f in self.fdims)
        return f"args={len(self.arg_types)} fdims=({loops}) R={self.forloop}"


@dataclass(frozen=True)
class Skeleton:
    """A complete block graph at the representative tiling (grid (1,1,1), ``task.forloop``)."""

    block: BlockGraph
    fdims: tuple[int, ...]


@dataclass
class BlockResult:
    """What one block task found (its skeletons) and did (its counters and seconds)."""

    task: BlockTask
    skeletons: list[Skeleton] = field(default_factory=list)
    counters: Counters = field(default_factory=Counters)
    seconds: float = 0.0


# ---------------------------------------------------------------------------------------------
# loop structures of a graph_def site


def loop_structures(
    arg_types: Sequence[TensorType], space: Any, reduce_extents: frozenset[int],
    arg_index: Sequence[IndexInfo] | None = None,
) -> list[tuple[tuple[int, ...], int, int, Any]]:
    """(fdims, representative forloop range, priority, loop class) for every loop structure.

    The no-loop structure comes first; then structures whose split dims all have extents the
    target reduces over (``reduce_extents``), then the rest (lower priority value = sooner).
    ``SearchConfig.fmaps`` restricts the dims a loop may split. With index labels, the split
    dims must share one index class (the loop couples them; see ``IndexAnalysis``).
    """
    allowed = space.config.fmaps
    options = []
    for t in arg_types:
        dims = [N] + [d for d, s in enumerate(t.shape) if s > 1]
        if allowed is not None:
            dims = [d for d in dims if d in allowed or d == N]
        options.append(dims)
    out = [(tuple(N for _ in arg_types), 1, 0, None)]
    for fdims in itertools.product(*options):
        split = [(t.shape[f]) for t, f in zip(arg_types, fdims) if f != N]
        if not split:
            continue
        loop_class = None
        if arg_index is not None:
            classes = {info.labels[f] for info, f in zip(arg_index, fdims) if f != N}
            if len(classes) != 1 or None in classes:
                continue
            loop_class = classes.pop()
        ranges = space.forloop_ranges(tuple(split))
        if not ranges:
            continue
        plausible = all(e in reduce_extents for e in split)
        prio = (1 if plausible else 3) * 100 - len(split)
        out.append((tuple(fdims), ranges[0], prio, loop_class))
    out.sort(key=lambda x: (x[2], x[0]))
    return out


def reduce_extents(target: KernelGraph) -> frozenset[int]:
    """The extents the target reduces over (reduction dims, matmul k)."""
    found = set()
    for n in target.nodes:
        if n.op in REDUCTIONS:
            found.add(target.types[n.ins[0]].shape[n.attr("dim")])
        elif n.op is Op.MATMUL:
            found.add(target.types[n.ins[0]].shape[-1])
    return frozenset(found)
