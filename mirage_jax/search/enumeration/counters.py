"""What an enumeration did (``Counters``) and how it stops when its budget is spent (``Stop``)."""

from __future__ import annotations

from dataclasses import dataclass


class Stop(Exception):
    """Raised inside a DFS when its state or time budget is spent."""


@dataclass
class Counters:
    """What one enumeration did (summed over tasks into the SearchReport)."""

    states: int = 0  # partial graphs visited
    proposed: int = 0  # op applications that type-checked
    pruned_abstract: int = 0  # dropped: term not a subexpression of the target
    pruned_dead: int = 0  # dropped: could not use every tensor within the op bound
    pruned_index: int = 0  # dropped: aligns index classes the target keeps apart
    pruned_duplicate: int = 0  # dropped: recomputes an existing tensor or a constant
    pruned_numeric: int = 0  # dropped: an exp of an unshifted value (see terms.shifted_exps)
    complete: int = 0  # complete skeletons found
    truncated: bool = False  # stopped by max_states or the deadline
    timed_out: bool = False  # stopped by the deadline (then the result depends on the host)

    def add(self, other: Counters) -> None:
        self.states += other.states
        self.proposed += other.proposed
        self.pruned_abstract += other.pruned_abstract
        self.pruned_dead += other.pruned_dead
        self.pruned_index += other.pruned_index
        self.pruned_duplicate += other.pruned_duplicate
        self.pruned_numeric += other.pruned_numeric
        self.complete += other.complete
        self.truncated |= other.truncated
        self.timed_out |= other.timed_out
