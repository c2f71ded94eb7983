"""Wall-clock timing of jitted callables, shared by the search, the decorator and benchmarks.

Medians of many short repetitions, after warm-up, with results blocked on: the machines this
runs on are small and noisy, so single timings mean little and ratios measured in one process
are what we compare. ``compare`` times two programs as the user calls them;
``compare_in_loop`` times two pieces of a program as they run inside it (a call each in one
executable's loop, over inputs that touch the program's working set).
"""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np


def median_seconds(
    fn: Callable[..., Any],
    args: Sequence[Any],
    *,
    warmup: int = 2,
    min_reps: int = 5,
    max_reps: int = 200,
    budget_s: float = 0.5,
    working_set_bytes: int = 0,
) -> float:
    """Median wall time of ``fn(*args)`` in seconds, including waiting for its results.

    Host arrays are put on the device once, before timing: passed as numpy arrays, every
    call would copy them in, and for a decode-sized weight that copy costs more than the
    kernel. ``working_set_bytes``: calls take turns on copies of ``args`` that together are
    this large (see ``compare_in_loop``), so that they read their inputs from where a
    program of that working set leaves them rather than from the core's cache.
    """
    copies = _copies(device_args(args), working_set_bytes)
    for k in range(max(warmup, len(copies))):
        jax.block_until_ready(fn(*copies[k % len(copies)]))
    times: list[float] = []
    deadline = time.perf_counter() + budget_s
    while len(times) < max_reps and (len(times) < min_reps or time.perf_counter() < deadline):
        call_args = copies[len(times) % len(copies)]
        start = time.perf_counter()
        jax.block_until_ready(fn(*call_args))
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


def compare_in_loop(
    candidate: Callable[..., Any],
    baseline: Callable[..., Any],
    args: Sequence[Any],
    *,
    working_set_bytes: int = 0,
    rounds: int = 3,
    budget_s: float = 0.3,
    seed: int = 0,
) -> tuple[float, float]:
    """Seconds of one call of candidate and of baseline (traceable functions, not jitted) in
    the steady state of a program that runs them: each is called repeatedly inside one
    executable, and the looped executables are compared by ``compare``.

    Timing a piece of a program as a program of its own charges it the cost of a program
    call, and not the same cost to both sides: PjRt runs a program of under ~1000 flops (one
    of custom calls only: they count none) inline on the caller's thread, any other on a
    pool thread that the caller then waits for, and the two thread hand-overs cost 20-40 us
    on a 2-vCPU VM. A decode-sized region that XLA computes in 0.2 us read 6-11 us that way,
    and an attention piece ran 1.6x faster than XLA's alone and 0.89x in its program. In a
    loop both sides pay one call for many iterations.

    ``working_set_bytes``: what one call of the whole program reads and writes. A piece
    called again and again on the same arguments finds them in the core's cache, where in
    its program the rest of the program has evicted them since its last call: a decode
    step's head projection read its 2 MiB weight in 27 us from L2 in a loop and took 63 us
    in the program, from L3 (XLA's 29 us either way). So each iteration takes the next of
    enough copies of the arguments that the loop touches as much memory as the program.
    """
    args = device_args(args)
    copies = _copies(args, working_set_bytes)
    looped_c, looped_b = _looped(candidate, len(copies)), _looped(baseline, len(copies))
    flat = [a for c in copies for a in c]
    n = _iterations(looped_c, looped_b, flat)
    t_c, t_b = compare(looped_c, looped_b, [n, *flat], rounds=rounds, budget_s=budget_s,
                       seed=seed)  # fmt: skip
    return t_c / int(n), t_b / int(n)


# A looped call runs at least this long, so that the one program call it pays is a small
# part of it (~1-2% of the per-iteration time, the same on both sides).
LOOP_S = 0.002
MAX_ITERATIONS = 4096
MAX_COPIES = 32
# Past every core's and the shared cache (tens of MiB on these hosts): a larger working set
# is read from memory either way, so copies stop there.
MAX_COPIED_BYTES = 256 << 20


def _copies(args: Sequence[Any], working_set_bytes: int) -> list[list[Any]]:
    """``args`` and copies of them, as many as it takes to touch ``working_set_bytes``
    (``args`` alone, whatever they are, for a working set of 0)."""
    if working_set_bytes <= 0:
        return [list(args)]
    nbytes = sum(int(np.prod(np.shape(a))) * np.dtype(a.dtype).itemsize for a in args)
    if nbytes == 0:
        return [list(args)]
    wanted = min(working_set_bytes, MAX_COPIED_BYTES)
    count = min(MAX_COPIES, max(1, -(-wanted // nbytes)))
    return [list(args)] + [[jnp.array(a, copy=True) for a in args] for _ in range(count - 1)]


def _looped(fn: Callable[..., Any], copies: int) -> Callable[..., Any]:
    """``fn`` called ``n`` times in a loop in one executable: ``looped(n, *flat)``, ``flat``
    holding ``copies`` argument lists one after another, iteration ``i`` calling ``fn`` on
    copy ``i % copies``. The arguments pass an optimisation barrier with the iteration number
    on every iteration, so that XLA cannot hoist the loop-invariant call out of the loop."""

    def run(n: jax.Array, *flat: Any) -> Any:
        arity = len(flat) // copies
        lists = [flat[k * arity:(k + 1) * arity] for k in range(copies)]
        init = jax.tree_util.tree_map(lambda s: jnp.zeros(s.shape, s.dtype),
                                      jax.eval_shape(fn, *lists[0]))  # fmt: skip

        def call(i: jax.Array, args: Sequence[Any]) -> Any:
            _, fresh = jax.lax.optimization_barrier((i, tuple(args)))
            return fn(*fresh)

        def body(i: jax.Array, _: Any) -> Any:
            if copies == 1:
                return call(i, lists[0])
            branches = [lambda i, a=a: call(i, a) for a in lists]
            return jax.lax.switch(i % copies, branches, i)

        return jax.lax.fori_loop(0, n, body, init)

    return jax.jit(run)


def _iterations(looped_c: Callable[..., Any], looped_b: Callable[..., Any],
                flat: Sequence[Any]) -> jax.Array:  # fmt: skip
    """Iterations for which the slower of the two looped calls takes about ``LOOP_S``."""
    n = 1
    while True:
        count = jnp.asarray(n, jnp.int32)
        took = max(_one_call(looped_c, [count, *flat]), _one_call(looped_b, [count, *flat]))
        if took >= LOOP_S or n >= MAX_ITERATIONS:
            return count
        n = min(MAX_ITERATIONS, max(2 * n, int(n * LOOP_S / max(took, 1e-9))))


def _one_call(fn: Callable[..., Any], args: Sequence[Any]) -> float:
    jax.block_until_ready(fn(*args))  # compiles on the first, warm after
    start = time.perf_counter()
    jax.block_until_ready(fn(*args))
    return time.perf_counter() - start


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
