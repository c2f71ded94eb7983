"""``SearchConfig``: the user's bounds on the superoptimizer, and the concrete space they imply.

``SearchConfig`` is what a user passes (``mj.optimize(config=SearchConfig(...))``): frozen and
hashable, so it can key caches. ``SearchConfig.space(target)`` derives the concrete
``SearchSpace`` for one target kernel graph from the target's own ops and shapes:

- operator vocabularies: the target's pre-defined ops at kernel level; at block level the
  target's compute ops plus the for-loop accumulators that reduce like them;
- attribute candidates: the target's scalars, reshape shapes and transpose permutations;
- grid sizes: divisors of the target's output dims (powers of two, or the whole dim), with the
  total number of blocks 1 or between ``cores`` and ``max_blocks``;
- for-loop ranges: per loop extent, divisors giving loop tiles within ``loop_tile`` (powers of
  two), see ``SearchSpace.forloop_ranges``.

Every ``None`` field means "derive it"; an explicit tuple replaces the derivation.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field, replace
from typing import Any

from mirage_jax.errors import SearchError
from mirage_jax.ir.graph import KernelGraph
from mirage_jax.ir.ops import ACCUMULATORS, COMPUTE, LAYOUT, Op


def _frozen_ops(ops: Any, what: str) -> frozenset[Op] | None:
    if ops is None:
        return None
    try:
        out = frozenset(o if isinstance(o, Op) else Op(o) for o in ops)
    except ValueError as err:
        raise SearchError(f"SearchConfig.{what}: {err}",
                          remedy="name ops by mirage_jax.ir.Op or their text names") from None  # fmt: skip
    return out


@dataclass(frozen=True)
class SearchConfig:
    """Bounds and knobs of one superoptimizer run (all fields optional).

    Counts: ``max_kernel_ops`` counts kernel nodes other than inputs/outputs (a graph_def is
    one); ``max_block_ops`` counts block compute nodes and accumulators (input iterators and
    output savers are not counted, one iterator per operand is implied).
    """

    max_kernel_ops: int = 5
    # a region with more compute ops is split into pieces of at most this many (the planner
    # prices the cut points, ``frontend.split``): the suite's largest program, 19 ops, finds
    # its Mirage form within the default budget; a 45-op training step finished 0.1% of its
    # block tasks and kept XLA
    max_region_ops: int = 24
    max_block_ops: int | None = None  # None: max(11, the target's compute ops + 2)
    max_graph_defs: int = 1
    max_graph_def_inputs: int = 4
    # grid and loop candidates (None: derived from the target's shapes)
    grid_sizes: tuple[int, ...] | None = None
    max_grid_axes: int = 2
    max_blocks: int = 256
    forloop_ranges: tuple[int, ...] | None = None
    loop_tile: tuple[int, int] = (16, 1024)
    max_forloop_candidates: int = 6
    # allowed maps (None: every map that divides evenly)
    imaps: tuple[tuple[int, int, int], ...] | None = None
    omaps: tuple[tuple[int, int, int], ...] | None = None
    fmaps: tuple[int, ...] | None = None
    # operator vocabularies (None: derived from the target)
    kernel_ops: frozenset[Op] | None = None
    block_ops: frozenset[Op] | None = None
    # budgets
    time_budget_s: float = 60.0
    max_states: int = 400_000  # per enumeration task: a deterministic bound
    # block states over all tasks, added in task order: the deterministic bound on the whole
    # enumeration (None: none); the time budget is the safety net behind it
    max_total_states: int | None = 6_000_000
    max_tasks: int | None = None  # block enumeration tasks run, in priority order (None: all)
    saturation_iterations: int = 64
    saturation_node_limit: int = 200_000
    saturation_time_s: float = 30.0
    prune: bool = True  # abstract-expression pruning (off only to test its soundness)
    # replay the block skeletons a search of the same program at other extents found (the
    # shape-generic cache, ``search.skeletons``) instead of enumerating: verified and timed
    # as ever, but not a search of the bounds at these shapes (the report says so)
    reuse_skeletons: bool = False
    # verification
    seed: int = 0
    trials: int = 3
    max_verify: int = 6
    # the verification's deterministic bound: tensor elements its checks may evaluate in all,
    # each candidate costing ``equivalence.evaluation_size`` x (trials + 1) (the float check
    # and the field trials); the first candidate is checked whatever it costs (None: no bound)
    verify_elements: int | None = 700_000_000
    max_skeletons_ranked: int = 24  # skeletons whose every tiling is ranked (others: one)
    float_check: bool = True
    # ranking
    top_k_timed: int = 4
    timing_rounds: int = 3  # rounds over the shortlist; each candidate keeps its best
    time_candidates: bool = True
    # parallelism
    workers: int = 2
    cores: int | None = None
    progress: bool | None = None  # None: a bar when the search runs longer than a second

    def __post_init__(self) -> None:
        for name in ("kernel_ops", "block_ops"):
            object.__setattr__(self, name, _frozen_ops(getattr(self, name), name))
        for name in ("grid_sizes", "forloop_ranges", "fmaps"):
            value = getattr(self, name)
            if value is not None:
                object.__setattr__(self, name, tuple(int(v) for v in value))
        for name in ("imaps", "omaps"):
            value = getattr(self, name)
            if value is not None:
                object.__setattr__(self, name, tuple(tuple(int(x) for x in m) for m in value))
        positive = ("max_kernel_ops", "max_region_ops", "max_graph_def_inputs", "max_blocks",
                    "trials", "workers", "max_states", "max_forloop_candidates",
                    "timing_rounds")  # fmt: skip
        if self.max_total_states is not None and self.max_total_states < 1:
            raise SearchError("SearchConfig.max_total_states must be >= 1 or None, got "
                              f"{self.max_total_states}")
        if self.max_block_ops is not None and self.max_block_ops < 1:
            raise SearchError(f"SearchConfig.max_block_ops must be >= 1, got {self.max_block_ops}")
        for name in positive:
            if int(getattr(self, name)) < 1:
                raise SearchError(f"SearchConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.max_graph_defs < 0 or not 1 <= self.max_grid_axes <= 3:
            raise SearchError("SearchConfig: max_graph_defs >= 0 and 1 <= max_grid_axes <= 3",
                              remedy="use the defaults (1 graph_def, 2 grid axes)")  # fmt: skip
        if self.time_budget_s <= 0:
            raise SearchError(f"SearchConfig.time_budget_s must be > 0, got {self.time_budget_s}")
        lo, hi = self.loop_tile
        if not 1 <= lo <= hi:
            raise SearchError(f"SearchConfig.loop_tile {self.loop_tile} must be (lo, hi), 1<=lo<=hi")

    def with_(self, **changes: Any) -> SearchConfig:
        return replace(self, **changes)

    @property
    def num_cores(self) -> int:
        return self.cores or os.cpu_count() or 1

    def space(self, target: KernelGraph) -> SearchSpace:
        """The concrete search space for ``target`` (see the module docstring)."""
        return derive_space(self, target)


@dataclass(frozen=True)
class SearchSpace:
    """Everything the enumerator needs, derived once from (config, target). Frozen, hashable."""

    config: SearchConfig
    kernel_ops: tuple[Op, ...]
    block_ops: tuple[Op, ...]
    scalars: dict[Op, tuple[float, ...]] = field(hash=False, compare=False)
    scalar_key: tuple[tuple[str, tuple[float, ...]], ...] = ()
    reshapes: tuple[tuple[int, ...], ...] = ()
    perms: tuple[tuple[int, ...], ...] = ()
    # the target's slices: (input shape, dim, start, size)
    slices: tuple[tuple[tuple[int, ...], int, int, int], ...] = ()
    grid_sizes: tuple[int, ...] = ()
    cores: int = 1
    max_block_ops: int = 11

    def forloop_ranges(self, extents: tuple[int, ...]) -> tuple[int, ...]:
        """Loop ranges R >= 2 dividing every loop extent, with loop tiles within ``loop_tile``.

        Powers of two (or the extent itself) only; at most ``max_forloop_candidates``, those
        with tiles nearest 64 first, then returned in increasing order.
        """
        cfg = self.config
        if cfg.forloop_ranges is not None:
            ok = [r for r in cfg.forloop_ranges if r >= 2 and all(e % r == 0 for e in extents)]
            return tuple(sorted(ok))
        if not extents:
            return ()
        lo, hi = cfg.loop_tile
        g = math.gcd(*extents)
        cands = []
        for r in _divisors(g):
            if r < 2 or not (_pow2(r) or r == g):
                continue
            tiles = [e // r for e in extents]
            if all(lo <= t <= hi for t in tiles) or (max(extents) < lo and r == g):
                cands.append(r)
        # loop tiles near 64 rows first: matmul operands stream in place, so short tiles
        # cost little and keep a pass over B in L1's TLB and in L2
        mid = min(max(64, lo), hi)
        cands.sort(key=lambda r: (abs(math.log(max(extents) / r / mid)), r))
        return tuple(sorted(cands[: cfg.max_forloop_candidates]))


def _divisors(n: int) -> list[int]:
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


def _pow2(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def _default_kernel_ops(target: KernelGraph) -> frozenset[Op]:
    return frozenset(n.op for n in target.nodes if n.op in COMPUTE | LAYOUT)


def _default_block_ops(target: KernelGraph) -> frozenset[Op]:
    ops = {n.op for n in target.nodes if n.op in COMPUTE}
    for op in list(ops):
        ops.update(op.info.carried_by)  # the accumulators that carry it across the loop
    return frozenset(ops)


def _scalars(target: KernelGraph) -> dict[Op, tuple[float, ...]]:
    found: dict[Op, set[float]] = {}
    for n in target.nodes:
        if n.op.info.scalar_attr:  # scalar ops' constants and masks' fills
            found.setdefault(n.op, set()).add(float(n.attr(n.op.info.scalar_attr)))
    return {op: tuple(sorted(v)) for op, v in sorted(found.items(), key=lambda kv: kv[0].value)}


def _grid_sizes(config: SearchConfig, target: KernelGraph, cores: int) -> tuple[int, ...]:
    if config.grid_sizes is not None:
        return tuple(sorted({g for g in config.grid_sizes if g >= 2}))
    sizes: set[int] = set()
    for t in target.output_types:
        for d in t.shape:
            sizes.update(g for g in _divisors(d) if g >= 2 and (_pow2(g) or g == d))
    return tuple(sorted(g for g in sizes if g <= config.max_blocks))


def derive_space(config: SearchConfig, target: KernelGraph) -> SearchSpace:
    if not isinstance(target, KernelGraph):
        raise SearchError(f"superoptimize needs a KernelGraph, got {type(target).__name__}")
    kernel = config.kernel_ops if config.kernel_ops is not None else _default_kernel_ops(target)
    block = config.block_ops if config.block_ops is not None else _default_block_ops(target)
    bad = {op for op in block if op not in COMPUTE | ACCUMULATORS}
    if bad:
        raise SearchError(f"SearchConfig.block_ops: {sorted(o.value for o in bad)} cannot "
                          "appear in a block graph",
                          remedy="block graphs take compute ops and accumulators")  # fmt: skip
    order = {op: i for i, op in enumerate(Op)}
    scalars = _scalars(target)
    cores = config.num_cores
    return SearchSpace(
        config=config,
        kernel_ops=tuple(sorted(kernel - {Op.INPUT, Op.OUTPUT}, key=order.__getitem__)),
        block_ops=tuple(sorted(block, key=order.__getitem__)),
        scalars=scalars,
        scalar_key=tuple((op.value, v) for op, v in scalars.items()),
        reshapes=tuple(sorted({tuple(n.attr("shape")) for n in target.nodes_of(Op.RESHAPE)})),
        perms=tuple(sorted({tuple(n.attr("perm")) for n in target.nodes_of(Op.TRANSPOSE)})),
        slices=tuple(sorted({(target.types[n.ins[0]].shape, n.attr("dim"), n.attr("start"),
                              n.attr("size")) for n in target.nodes_of(Op.SLICE)})),  # fmt: skip
        grid_sizes=_grid_sizes(config, target, cores),
        cores=cores,
        max_block_ops=config.max_block_ops or max(
            11, 2 + sum(n.op in COMPUTE for n in target.nodes)
        ),
    )


__all__ = ["SearchConfig", "SearchSpace", "derive_space"]
