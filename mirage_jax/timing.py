"""Wall-clock timing of jitted callables, shared by the search, the decorator and benchmarks.

Medians of many short repetitions, after warm-up, with results blocked on: the machines this
runs on are small and noisy, so single timings mean little and ratios measured in one process
are what we compare.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax


def median_seconds(
    fn: Callable[..., Any],
    args: Sequence[Any],
    *,
    warmup: int = 2,
    min_reps: int = 5,
    max_reps: int = 200,
    budget_s: float = 0.5,
) -> float:
    """Median wall time of ``fn(*args)`` in seconds, including waiting for its results."""
    for _ in range(warmup):
        jax.block_until_ready(fn(*args))
    times: list[float] = []
    deadline = time.perf_counter() + budget_s
    while len(times) < max_reps and (len(times) < min_reps or time.perf_counter() < deadline):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def compare(
    candidate: Callable[..., Any],
    baseline: Callable[..., Any],
    args: Sequence[Any],
    *,
    rounds: int = 3,
    budget_s: float = 0.3,
) -> tuple[float, float]:
    """Median times of candidate and baseline, interleaved in rounds so drift hits both alike."""
    cand, base = [], []
    for _ in range(rounds):
        cand.append(median_seconds(candidate, args, budget_s=budget_s))
        base.append(median_seconds(baseline, args, budget_s=budget_s))
    return statistics.median(cand), statistics.median(base)
