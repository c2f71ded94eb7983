"""Split regions too large for one search into pieces, at the cut points a cost model prices lowest.

The search covers a region of a dozen or two compute ops within its budget; a transformer
layer traced whole (attention and MLP, or a training step's forward and backward) holds
50-100, and a search of that finishes a fraction of a percent of its tasks and keeps XLA. Such
a region is split into contiguous runs of its equations (contiguous runs of a jaxpr are convex,
so each piece is replaced by one call), each within ``SplitPolicy.max_ops``. Where to cut is
a dynamic program over the run's equation boundaries: every admissible piece is priced as one
fused kernel by the backend's cost model (its inputs read and its escaping values written
once, its flops, one launch), and the partition of least total time wins - so cuts fall where
little data crosses (after a reduction, at a projection's narrow output), not every N ops.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from jax.extend.core import DropVar, Var

from mirage_jax.frontend.builder import RegionBuilder, tensor_type
from mirage_jax.frontend.partition import Assembler, Region, Split
from mirage_jax.frontend.program import TracedProgram
from mirage_jax.ir import Op
from mirage_jax.ir.ops import COMPUTE

log = logging.getLogger("mirage_jax")

# seconds of one fused kernel that moves ``bytes`` through memory and does ``matmul_flops``
# and ``element_ops`` of work (``CostModel.fused_s``)
KernelTime = Callable[[float, float, float], float]


@dataclass(frozen=True)
class SplitPolicy:
    """How large a region the search takes whole, and the price of one fused piece.

    ``max_ops``: compute ops (the search's effort grows combinatorially with them).
    ``max_inputs``: the inputs one graph-defined kernel may take; a piece with more cannot be
    fused into one kernel by the search. Both bound each piece; where some equation alone
    exceeds the input bound, pieces are bounded by ``max_ops`` only.
    """

    max_ops: int
    max_inputs: int
    kernel_s: KernelTime

    def fits(self, ops: int, inputs: int) -> bool:
        return ops <= self.max_ops and inputs <= self.max_inputs


def compute_ops(region: Region) -> int:
    """The region's compute nodes (the size the search's effort grows with)."""
    return sum(node.op in COMPUTE for node in region.graph.nodes)


def read_inputs(region: Region) -> int:
    """The region's inputs its graph reads (a scalar literal XLA's equations take as an
    operand is an input the graph may hold as an attribute instead)."""
    read = {i for node in region.graph.nodes for i in node.ins}
    return sum(out in read for node in region.graph.nodes_of(Op.INPUT) for out in node.outs)


def _fits(region: Region, policy: SplitPolicy) -> bool:
    return policy.fits(compute_ops(region), read_inputs(region))


def split_regions(program: TracedProgram, policy: SplitPolicy) -> TracedProgram:
    """``program`` with every region beyond ``policy``'s bounds replaced by its pieces
    (regions numbered again in equation order); unchanged if none is that large."""
    if all(_fits(r, policy) for r in program.regions):
        return program
    asm = Assembler(program.jaxpr.jaxpr, program.sources)
    for region in program.regions:
        ops = compute_ops(region)
        pieces = None if _fits(region, policy) else _best_pieces(asm, region.span, policy)
        if pieces is None:
            asm.regions.append(dataclasses.replace(region, index=len(asm.regions)))
            continue
        bounds, estimate_s = pieces
        split = Split(region.span, ops, read_inputs(region), policy.max_ops, policy.max_inputs,
                      tuple(bounds[1:-1]), estimate_s, _whole_s(asm, region.span, policy),
                      _crossing(asm, bounds))  # fmt: skip
        log.debug("mirage_jax: %s", split)
        for start, end in itertools.pairwise(bounds):
            builder = RegionBuilder(start)
            for i in range(start, end):
                reason = asm.apply(builder, asm.eqns[i])
                assert reason is None, "a piece's equations were accepted when it was priced"
            asm.close(builder, end, split)
    return dataclasses.replace(program, regions=tuple(asm.regions),
                               cuts=tuple(sorted(program.cuts + tuple(asm.cuts),
                                                 key=lambda c: c.eqn_index)))  # fmt: skip


def _pieces_from(asm: Assembler, start: int, end: int, policy: SplitPolicy
                 ) -> Iterator[tuple[int, float]]:  # fmt: skip
    """``(stop, seconds)`` of every admissible piece ``[start, stop)`` with ``stop <= end``."""
    builder, defined = RegionBuilder(start), []
    for i in range(start, end):
        if asm.apply(builder, asm.eqns[i]) is not None:
            return
        work = builder.work()
        if not policy.fits(work.ops, work.inputs):  # both only grow with the piece
            return
        defined.extend(v for v in asm.eqns[i].outvars if not isinstance(v, DropVar))
        if asm.escaping_predicate(builder, i + 1) is not None:
            continue  # a piece cannot end between is_finite and the select_n folding it
        written = sum(tensor_type(v.aval).nbytes for v in defined if asm.escapes(v, i + 1))
        yield i + 1, policy.kernel_s(work.input_bytes + written, work.matmul_flops,
                                     work.element_ops)  # fmt: skip


def _best_pieces(asm: Assembler, span: tuple[int, int], policy: SplitPolicy
                 ) -> tuple[list[int], float] | None:  # fmt: skip
    """The piece boundaries ``[span[0], ..., span[1]]`` of least total time, and that time;
    ``None`` when some equation alone exceeds the op bound (the region then stays whole)."""
    found = _least_time(asm, span, policy)
    if found is None and policy.max_inputs < _UNBOUNDED:
        found = _least_time(asm, span, dataclasses.replace(policy, max_inputs=_UNBOUNDED))
    return found


_UNBOUNDED = 1 << 30


def _least_time(asm: Assembler, span: tuple[int, int], policy: SplitPolicy
                ) -> tuple[list[int], float] | None:  # fmt: skip
    """The dynamic program: the cheapest partition of ``span[0]..stop`` for every reachable
    ``stop``, each extended by every admissible piece that starts there."""
    start, end = span
    best: dict[int, tuple[float, int, int]] = {start: (0.0, 0, start)}  # stop -> (s, pieces, from)
    for i in range(start, end):
        if i not in best:
            continue
        before, count, _ = best[i]
        for stop, seconds in _pieces_from(asm, i, end, policy):
            candidate = (before + seconds, count + 1, i)
            if stop not in best or candidate[:2] < best[stop][:2]:
                best[stop] = candidate
    if end not in best:
        log.debug("mirage_jax: equations [%d, %d) cannot be split within %d compute ops",
                  start, end, policy.max_ops)
        return None
    bounds, at = [end], end
    while at != start:
        at = best[at][2]
        bounds.append(at)
    return bounds[::-1], best[end][0]


def _whole_s(asm: Assembler, span: tuple[int, int], policy: SplitPolicy) -> float:
    """The run priced as one fused kernel, for explain's comparison."""
    unbounded = dataclasses.replace(policy, max_ops=_UNBOUNDED, max_inputs=_UNBOUNDED)
    return [s for _, s in _pieces_from(asm, span[0], span[1], unbounded)][-1]


def _crossing(asm: Assembler, bounds: list[int]) -> int:
    """Bytes of the values one piece writes and a later piece of the same run reads."""
    total = 0
    for start, stop in itertools.pairwise(bounds[1:]):
        read = {a for i in range(start, stop) for a in asm.eqns[i].invars if isinstance(a, Var)}
        for i in range(bounds[0], start):
            total += sum(tensor_type(v.aval).nbytes for v in asm.eqns[i].outvars
                         if not isinstance(v, DropVar) and v in read)  # fmt: skip
    return total
