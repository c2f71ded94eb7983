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
import numpy as np


def median_seconds(
    fn: Callable[..., Any],
    args: Sequence[Any],
    *,
    warmup: int = 2,
    min_reps: int = 5,
    max_reps: int = 200,
    budget_s: float = 0.5,
) -> float:
    """Median wall time of ``fn(*args)`` in seconds, including waiting for its results.

    Host arrays are put on the device once, before timing: passed as numpy arrays, every
    call would copy them in, and for a decode-sized weight that copy costs more than the
    kernel.
    """
    args = device_args(args)
    for _ in range(warmup):
        jax.block_until_ready(fn(*args))
    times: list[float] = []
    deadline = time.perf_counter() + budget_s
    while len(times) < max_reps and (len(times) < min_reps or time.perf_counter() < deadline):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def device_args(args: Sequence[Any]) -> list[Any]:
    """``args`` with every numpy array replaced by a committed device array (leaves others)."""
    return jax.tree_util.tree_map(
        lambda a: jax.device_put(a) if isinstance(a, np.ndarray) else a, list(args)
    )


def compare(
    candidate: Callable[..., Any],
    baseline: Callable[..., Any],
    args: Sequence[Any],
    *,
    rounds: int = 3,
    budget_s: float = 0.3,
) -> tuple[float, float]:
    """Median times of candidate and baseline, interleaved in rounds so drift hits both alike."""
    args = device_args(args)
    cand, base = [], []
    for _ in range(rounds):
        cand.append(median_seconds(candidate, args, budget_s=budget_s))
        base.append(median_seconds(baseline, args, budget_s=budget_s))
    return statistics.median(cand), statistics.median(base)
