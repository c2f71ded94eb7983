"""Wall-clock timing of jitted callables, shared by the search, the decorator and benchmarks.

Medians of many short repetitions, after warm-up, with results blocked on: the machines this
runs on are small and noisy, so single timings mean little and ratios measured in one process
are what we compare.
"""

from __future__ import annotations

import random
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
    seed: int = 0,
) -> tuple[float, float]:
    """Times of candidate and baseline in seconds, as (baseline's median x the median of the
    paired ratios, baseline's median); ``rounds * budget_s`` seconds of timing for both
    together, at least ``MIN_PAIRS`` pairs.

    A pair is one block of calls of each, in an order drawn at random per pair: drift of the
    machine (frequency, other tenants) hits both halves of a pair alike, a fixed order would
    charge a warm-cache or switch effect to one side, and the median of many pair ratios
    shrugs off the spells of noise that shift whole medians on a shared 2-core host (an A/A
    comparison of one program against itself read up to 1.13 with pooled medians).

    Blocks, not single calls, each after untimed calls: an executable's calls right after
    another's are slower, and not only the first (see ``SWITCH_S``). Each block is timed
    once its program has run ``SWITCH_S`` since the switch, so both sides are measured in
    the steady state a program reaches when it runs repeatedly.
    """
    args = device_args(args)
    for _ in range(2):
        jax.block_until_ready(candidate(*args))
        jax.block_until_ready(baseline(*args))
    block = _block_size(candidate, baseline, args)
    rng = random.Random(seed)
    ratios: list[float] = []
    base: list[float] = []
    deadline = time.perf_counter() + rounds * budget_s
    while len(ratios) < MAX_PAIRS and (len(ratios) < MIN_PAIRS or time.perf_counter() < deadline):
        first_is_candidate = rng.random() < 0.5
        order = (candidate, baseline) if first_is_candidate else (baseline, candidate)
        a, b = (_block(fn, args, block) for fn in order)
        cand, bas = (a, b) if first_is_candidate else (b, a)
        ratios.append(cand / bas)
        base.append(bas)
    t_base = statistics.median(base)
    return statistics.median(ratios) * t_base, t_base


MIN_PAIRS = 12
MAX_PAIRS = 2000
# After another executable ran, a program's calls stay slow for milliseconds, not one call:
# measured on a 2-vCPU VM with pieces of a Llama layer (150-300 us a call), an XLA region's
# calls after a block of a custom call's ran 1.5-1.9x their steady time for ~20 calls (6-10
# ms), the custom call's after XLA's up to 1.3x for as long. Timed inside that window, the
# side that recovers slower reads slower: a region read 1.7x faster than XLA whose steady
# ratio was 1.0x (and lost in the program). So each block runs this long untimed first.
SWITCH_S = 0.03


def _block(fn: Callable[..., Any], args: Sequence[Any], calls: int) -> float:
    """Median seconds of ``calls`` consecutive calls of ``fn``, after ``SWITCH_S`` of calls
    (at least one) that are not timed."""
    settle = time.perf_counter() + SWITCH_S
    jax.block_until_ready(fn(*args))
    while time.perf_counter() < settle:
        jax.block_until_ready(fn(*args))
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _block_size(candidate: Callable[..., Any], baseline: Callable[..., Any],
                args: Sequence[Any]) -> int:  # fmt: skip
    start = time.perf_counter()
    jax.block_until_ready(candidate(*args))
    jax.block_until_ready(baseline(*args))
    per_call = (time.perf_counter() - start) / 2
    # about 6 ms a block after its settling calls: short enough for many pairs in the budget,
    # at least 3 calls for a median
    return max(3, min(16, int(0.006 / max(per_call, 1e-9))))
