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
    """Median times of candidate and baseline, measured in alternating blocks of calls so
    that drift of the machine (frequency, other tenants) hits both alike; ``rounds *
    budget_s`` seconds of timing for both together, at least 8 calls each (who goes first
    alternates too).

    Blocks, not single calls: the first calls of one executable right after another's pay a
    switch cost (measured 40-110 us on the first and less on the second, on a 2-core host),
    which single-call alternation charges to every sample of a sub-millisecond program. A
    block of up to 16 calls, about 20 ms of work, keeps that cost out of the median while
    still alternating many times a second.
    """
    args = device_args(args)
    for _ in range(2):
        jax.block_until_ready(candidate(*args))
        jax.block_until_ready(baseline(*args))
    block = _block_size(candidate, baseline, args)
    cand: list[float] = []
    base: list[float] = []
    deadline = time.perf_counter() + rounds * budget_s
    pair = [(candidate, cand), (baseline, base)]
    while len(cand) < 2000 and (len(cand) < 8 or time.perf_counter() < deadline):
        for fn, out in pair:
            for _ in range(block):
                start = time.perf_counter()
                jax.block_until_ready(fn(*args))
                out.append(time.perf_counter() - start)
        pair.reverse()
    return statistics.median(cand), statistics.median(base)


def _block_size(candidate: Callable[..., Any], baseline: Callable[..., Any],
                args: Sequence[Any]) -> int:  # fmt: skip
    start = time.perf_counter()
    jax.block_until_ready(candidate(*args))
    jax.block_until_ready(baseline(*args))
    per_call = (time.perf_counter() - start) / 2
    return max(1, min(16, int(0.02 / max(per_call, 1e-9))))
