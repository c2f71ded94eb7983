"""What a search reports: each candidate with its verdicts, the stage-by-stage report and
the result (the winner, every verified candidate, the report)."""

from __future__ import annotations

from dataclasses import dataclass, field

from mirage_jax.ir.graph import BlockGraph, KernelGraph
from mirage_jax.ir.ops import Op
from mirage_jax.search.equivalence import FFVerdict, FloatVerdict


@dataclass(frozen=True)
class Candidate:
    """A candidate μGraph with what the search learnt about it."""

    graph: KernelGraph
    estimate_s: float
    skeleton: str  # canonical fingerprint of its block skeleton(s)
    ff: FFVerdict | None = None
    float: FloatVerdict | None = None
    measured_s: float | None = None

    @property
    def verified(self) -> bool:
        return bool(self.ff and self.ff.ok and (self.float is None or self.float.ok))

    def summary(self) -> str:
        return summarize(self.graph)


@dataclass
class SearchReport:
    """What one search did, stage by stage (``str()`` gives a readable summary)."""

    target: str = ""
    states: int = 0  # partial μGraphs enumerated (kernel and block level)
    proposed: int = 0
    pruned_abstract: int = 0  # by the abstract-expression oracle
    pruned_index: int = 0  # by the index analysis
    pruned_duplicate: int = 0
    pruned_dead: int = 0
    pruned_numeric: int = 0  # exps of unshifted values (numerically unsafe)
    sites: int = 0
    tasks: int = 0
    tasks_run: int = 0
    tasks_exhausted: int = 0  # run to their end (neither bound nor deadline cut them)
    tasks_truncated: int = 0
    block_s: float = 0.0  # wall-clock seconds of the block enumeration (all workers)
    workers: int = 1
    skeletons: int = 0  # distinct complete block skeletons
    candidates: int = 0  # concrete μGraphs (skeleton x tiling) ranked by the cost model
    cost_model: str = ""  # the model that ranked them (the target backend's), as repr()
    ff_checked: int = 0
    ff_rejected: int = 0  # rejected by verification (finite field)
    skipped_rejected_skeleton: int = 0
    float_rejected: int = 0
    verified: int = 0
    timed: int = 0
    # (summary, estimated s, measured s) of every timed candidate: how the cost model ranks
    timed_candidates: list[tuple[str, float, float]] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)
    stop_reason: str = ""
    trials: int = 0
    degree: int = 0
    false_acceptance_bound: float = 0.0
    oracle_saturated: bool = False
    oracle_enodes: int = 0
    best_summary: str = ""
    best_text: str = ""
    best_estimate_s: float | None = None
    best_measured_s: float | None = None
    baseline_s: float | None = None
    comparison: str = "not compared"
    notes: list[str] = field(default_factory=list)

    @property
    def total_s(self) -> float:
        return self.timings.get("total", 0.0)

    @property
    def exhausted(self) -> bool:
        """Every block task ran to its end: the best μGraph within the bounds was found."""
        return self.stop_reason == "exhausted"

    @property
    def coverage(self) -> float:
        """The share of block tasks run to their end (1.0 for an exhausted search)."""
        return self.tasks_exhausted / self.tasks if self.tasks else 1.0

    @property
    def states_per_s(self) -> float:
        """Block-level states per second per worker."""
        return self.states / self.block_s / max(1, self.workers) if self.block_s else 0.0

    @property
    def projected_s(self) -> float | None:
        """A lower estimate of the enumeration's seconds, in all, to exhaust every task: its
        time over the share of tasks it finished (tasks cut by a bound would take longer)."""
        if self.exhausted or not self.tasks_exhausted:
            return None
        return self.block_s / self.coverage

    def coverage_text(self) -> str:
        """One line for ``explain`` and the decision cache: optimal within the bounds, or how
        much of the space the search covered before what stopped it."""
        if self.exhausted:
            return (f"optimal within bounds: all {self.tasks} block tasks exhausted, "
                    f"{self.states} states")  # fmt: skip
        if self.stop_reason.startswith("reused"):
            return (f"{self.stop_reason}: {self.skeletons} skeletons replayed, not enumerated "
                    "at these shapes")  # fmt: skip
        if not self.tasks:
            return self.stop_reason or "no block tasks"
        line = (f"stopped by the {self.stop_reason}: {self.tasks_exhausted}/{self.tasks} block "
                f"tasks exhausted ({100 * self.coverage:.1f}%), {self.states} states")
        if self.projected_s is not None:
            line += f", about {self.projected_s:.0f}s of enumeration in all to exhaust"
        return line

    def __str__(self) -> str:
        t = self.timings
        lines = [
            f"search of {self.target}: {self.stop_reason} after {self.total_s:.1f}s",
            f"  enumerated {self.states} states ({self.proposed} ops proposed); pruned: "
            f"{self.pruned_abstract} abstract, {self.pruned_index} index, "
            f"{self.pruned_duplicate} duplicate, {self.pruned_dead} dead-end, "
            f"{self.pruned_numeric} unsafe exp",
            f"  {self.sites} graph_def sites, {self.tasks_run}/{self.tasks} block tasks run "
            f"({self.tasks_truncated} cut by a budget), {self.states_per_s:.0f} states/s per "
            f"worker; coverage: {self.coverage_text()}",
            f"  {self.skeletons} skeletons, "
            f"{self.candidates} candidates ranked by {self.cost_model or 'a cost model'}",
            f"  verification: {self.ff_checked} checked, {self.ff_rejected} rejected (finite "
            f"field, {self.trials} trials), {self.float_rejected} rejected (float), "
            f"{self.verified} verified; false acceptance <= {self.false_acceptance_bound:.2g} "
            f"per candidate (degree <= {self.degree})",
            f"  oracle: {'saturated' if self.oracle_saturated else 'NOT saturated'}, "
            f"{self.oracle_enodes} e-nodes",
            "  timings: " + ", ".join(f"{k} {v:.2f}s" for k, v in t.items()),
            f"  best: {self.best_summary or '(the target itself)'}",
        ]
        if self.best_estimate_s is not None:
            lines.append(f"  estimate {self.best_estimate_s * 1e6:.1f}us; measured "
                         + (f"{self.best_measured_s * 1e6:.1f}us"
                            if self.best_measured_s is not None else "-")
                         + f"; {self.comparison}")  # fmt: skip
        lines.extend(f"  timed: estimate {e * 1e6:.1f}us, measured {m * 1e6:.1f}us: {what}"
                     for what, e, m in self.timed_candidates)
        lines.extend(f"  note: {n}" for n in self.notes)
        return "\n".join(lines)


@dataclass(frozen=True)
class SearchResult:
    """The winner (the target itself when nothing verified beats it), every verified
    candidate (best first) and the report."""

    best: KernelGraph
    verified: tuple[Candidate, ...]
    report: SearchReport


# ---------------------------------------------------------------------------------------------
# executors


def summarize(graph: KernelGraph) -> str:
    """One line: the kernels of a μGraph, with each graph_def's grid, loop and ops."""
    parts = []
    for node in graph.nodes:
        if node.op in (Op.INPUT, Op.OUTPUT):
            continue
        if node.op is Op.GRAPH_DEF:
            b: BlockGraph = node.attr("block")
            ops = [n.op.value for n in b.nodes if n.op not in (Op.INPUT_ITER, Op.OUTPUT_SAVER)]
            parts.append(f"graph_def[grid={b.grid} R={b.forloop_range}: {' '.join(ops)}]")
        else:
            parts.append(node.op.value)
    return "; ".join(parts)


__all__ = ["Candidate", "SearchReport", "SearchResult", "summarize"]
