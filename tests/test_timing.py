"""The timing harness (``mirage_jax.timing.compare``): unbiased between equal programs, and
right about unequal ones, on fake programs whose cost we set (busy waits, no jax work)."""

from __future__ import annotations

import time

import numpy as np

from mirage_jax.timing import compare


def _busy(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


class _Program:
    """Costs ``seconds`` a call, plus ``switch_s`` on the first call after another program ran
    (as a freshly switched-to executable pays for cold caches)."""

    last: object = None

    def __init__(self, seconds: float, switch_s: float = 0.0) -> None:
        self.seconds, self.switch_s = seconds, switch_s

    def __call__(self, x: np.ndarray) -> np.ndarray:
        if _Program.last is not self:
            _busy(self.switch_s)
            _Program.last = self
        _busy(self.seconds)
        return x


def test_equal_programs_compare_as_equal_despite_a_switch_cost():
    x = np.zeros(4, np.float32)
    a, b = _Program(2e-4, switch_s=6e-4), _Program(2e-4, switch_s=6e-4)
    t_a, t_b = compare(a, b, (x,), rounds=2, budget_s=0.2)
    # a switch cost three times the call itself: charged to every sample by single-call
    # alternation (ratio still 1, but times 4x too long), here left out of each block's median
    assert 0.9 < t_a / t_b < 1.1
    assert t_b < 4e-4


def test_a_program_twice_as_slow_measures_twice_as_slow():
    x = np.zeros(4, np.float32)
    t_slow, t_fast = compare(_Program(4e-4), _Program(2e-4), (x,), rounds=2, budget_s=0.2)
    assert 1.8 < t_slow / t_fast < 2.2


class _Settling(_Program):
    """Costs ``seconds`` a call once settled; for ``settle_s`` after another program ran, each
    call costs ``slow`` times that (as XLA's calls after a custom call's did for ~10 ms)."""

    def __init__(self, seconds: float, slow: float, settle_s: float) -> None:
        super().__init__(seconds)
        self.slow, self.settle_s, self.since = slow, settle_s, 0.0

    def __call__(self, x: np.ndarray) -> np.ndarray:
        if _Program.last is not self:
            _Program.last, self.since = self, time.perf_counter()
        settling = time.perf_counter() - self.since < self.settle_s
        _busy(self.seconds * (self.slow if settling else 1.0))
        return x


def test_a_switch_cost_that_lasts_milliseconds_is_not_charged_to_one_side():
    """An XLA region's calls ran 1.5-1.9x slower for ~10 ms after a custom call's block, and a
    block of 16 calls of 300 us fell inside that window: the region then read 1.7x faster
    than XLA where their steady times were equal."""
    x = np.zeros(4, np.float32)
    t_a, t_b = compare(_Program(2e-4), _Settling(2e-4, slow=1.8, settle_s=0.008), (x,),
                       rounds=2, budget_s=0.3)  # fmt: skip
    assert 0.9 < t_b / t_a < 1.1, t_b / t_a


def test_a_loop_times_the_call_inside_a_program_not_a_program_call():
    """A piece of a program timed as a program of its own pays a program call, which on these
    hosts costs more than a small piece's work (and more for XLA's multi-thread programs than
    for a custom call's, which run inline): ``compare_in_loop`` times a call each inside one
    executable, and still times the work (XLA may not hoist the loop-invariant call)."""
    import jax
    import jax.numpy as jnp

    from mirage_jax.timing import compare_in_loop, median_seconds

    small = jnp.ones((1, 64), jnp.float32)
    alone = median_seconds(jax.jit(jnp.sin), [small])
    t_small, _ = compare_in_loop(jnp.sin, jnp.sin, [small], rounds=1, budget_s=0.2)
    assert t_small < alone / 2, (t_small, alone)

    big = jnp.asarray(np.random.default_rng(0).standard_normal((256, 1024)), jnp.float32)

    def thrice(x):
        return jnp.sin(jnp.sin(jnp.sin(x)))

    t_thrice, t_once = compare_in_loop(thrice, jnp.sin, [big], rounds=1, budget_s=0.3)
    assert 1.6 < t_thrice / t_once < 4.5, t_thrice / t_once
    # through copies of the arguments, as many as a program's working set takes
    t_thrice, t_once = compare_in_loop(thrice, jnp.sin, [big], rounds=1, budget_s=0.3,
                                       working_set_bytes=3 * big.nbytes)  # fmt: skip
    assert 1.6 < t_thrice / t_once < 4.5, t_thrice / t_once


def test_the_loop_cycles_through_copies_that_touch_the_programs_working_set():
    import jax.numpy as jnp

    from mirage_jax.timing import MAX_COPIED_BYTES, MAX_COPIES, _copies

    x, w = jnp.ones((4, 8), jnp.float32), jnp.ones((8, 8), jnp.bfloat16)  # 128 + 128 bytes
    assert len(_copies([x, w], 0)) == len(_copies([x, w], 256)) == 1
    copies = _copies([x, w], 257)
    assert len(copies) == 2 and copies[0][0] is x
    assert copies[1][0] is not x and copies[1][1].dtype == jnp.bfloat16
    assert copies[1][0].unsafe_buffer_pointer() != x.unsafe_buffer_pointer()
    assert len(_copies([x, w], 1 << 30)) == MAX_COPIES
    big = jnp.ones((1 << 20,), jnp.float32)  # 4 MiB: copies stop at MAX_COPIED_BYTES
    assert len(_copies([big], 1 << 40)) == min(MAX_COPIES, MAX_COPIED_BYTES // (4 << 20))
    assert len(_copies([], 1 << 20)) == 1
    pair = (x, w)
    (only,) = _copies([3.0, pair], 0)  # no working set: any arguments, passed as they are
    assert only[0] == 3.0 and only[1] is pair


def test_candidate_timings_take_their_inputs_in_turns_from_the_copies():
    import jax.numpy as jnp

    from mirage_jax.timing import median_seconds

    x = jnp.ones((64, 64), jnp.float32)
    seen: list[int] = []

    def fn(a):
        seen.append(a.unsafe_buffer_pointer())
        return a

    median_seconds(fn, [x], min_reps=6, max_reps=6, budget_s=0.0)
    assert set(seen) == {x.unsafe_buffer_pointer()}
    seen.clear()
    median_seconds(fn, [x], min_reps=6, max_reps=6, budget_s=0.0,
                   working_set_bytes=3 * x.nbytes)  # fmt: skip
    assert len(set(seen)) == 3 and seen[-6:] == seen[-3:] * 2, seen


def test_the_thunk_profile_names_each_thunk_of_a_program_with_its_time():
    """``benchmarks/thunks.py`` reads jax.profiler's trace of a program's thunks."""
    import jax
    import jax.numpy as jnp
    import thunks  # benchmarks/thunks.py

    def f(x, w):
        return jnp.sort(jnp.tanh(x @ w), axis=-1)

    x, w = jnp.ones((64, 128), jnp.float32), jnp.ones((128, 128), jnp.float32)
    rows = thunks.thunk_times(jax.jit(f), (x, w), calls=5)
    names = [name for name, _ in rows]
    assert any("sort" in n for n in names) and len(names) >= 2, names
    assert names.index(next(n for n in names if "sort" in n)) == len(names) - 1, names
    assert all(us > 0 for _, us in rows)
