"""@optimize and explain end to end: numerics against jax.jit, fallbacks and their reasons.

Every numeric check compares with ``jax.jit`` of the same function on fresh random inputs,
per element at float32's tolerance (``tests/tolerance.py``), tighter than the verifier's own.
"""

from __future__ import annotations

import logging

import jax
import jax.numpy as jnp
import numpy as np
import programs
import pytest
from tolerance import assert_tree_close, sum_rtol

import mirage_jax as mj
from mirage_jax.backend.cpu.backend import CpuBackend
from mirage_jax.errors import CompileError, MirageError
from mirage_jax.ir import Op
from mirage_jax.planner import region as planner
from mirage_jax.search import SearchConfig


@pytest.fixture(autouse=True)
def _private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MIRAGE_JAX_CACHE_DIR", str(tmp_path / "cache"))


def _close(got, want, rtol: float | None = None) -> None:
    assert_tree_close(got, want, rtol=rtol)


def _randn(*shape: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize("program", programs.programs(1), ids=lambda p: p.name)
def test_six_benchmarks_match_jit_as_custom_calls(program):
    args = program.call_args([jax.device_put(x) for x in programs.make_inputs(program, seed=11)])
    fast = mj.optimize(program.fn, strategy="as_is", require_speedup=False)
    rtol = sum_rtol(4096)  # every program reduces over 4096 (a matmul's K or a norm's length)
    _close(fast(*args), jax.jit(program.fn)(*args), rtol)
    plan = fast.plan(*args)
    assert [p.impl is not None for p in plan.regions] == [True]
    assert "mirage custom call" in fast.explain(*args)
    fresh = program.call_args([jax.device_put(x) for x in programs.make_inputs(program, seed=12)])
    _close(fast(*fresh), jax.jit(program.fn)(*fresh), rtol)


# the default strategy at small shapes: a bounded search, candidates not timed (the
# comparison with XLA is what require_speedup governs, and it is off here)
FAST_SEARCH = SearchConfig(workers=1, time_candidates=False, progress=False, max_tasks=4,
                           max_verify=6, time_budget_s=120)  # fmt: skip
SMALL = {
    "gated_mlp": [(4, 64), (64, 32), (64, 32)],
    "lora": [(8, 32), (32, 64), (32, 4), (4, 64)],
    "gqa_decode": [(2, 8, 16), (2, 16, 64), (2, 64, 16)],
}
FNS = {p.name: p.fn for p in programs.programs(1)}


@pytest.mark.parametrize("name", list(SMALL))
def test_default_strategy_runs_a_searched_graph_defined_kernel_equal_to_jit(name):
    fn = FNS[name]
    args = [_randn(*s, seed=i) for i, s in enumerate(SMALL[name])]
    fast = mj.optimize(fn, config=FAST_SEARCH, require_speedup=False)
    _close(fast(*args), jax.jit(fn)(*args))
    (region,) = fast.plan(*args).regions
    assert region.impl is not None and region.source == "search", region.describe()
    assert region.search_report is not None and region.search_report.verified >= 1
    assert region.graph.nodes_of(Op.GRAPH_DEF), f"no graph-defined kernel:\n{region.graph}"
    fresh = [_randn(*s, seed=10 + i) for i, s in enumerate(SMALL[name])]
    _close(fast(*fresh), jax.jit(fn)(*fresh))


def _qkv_rope(x, w, cos, sin):
    """A fused QKV projection split in three, and RoPE by halves on q and k."""
    q, k, v = jnp.split(x @ w, 3, axis=-1)

    def rotate(a):
        a1, a2 = jnp.split(a, 2, axis=-1)
        return jnp.concatenate([a1 * cos - a2 * sin, a2 * cos + a1 * sin], axis=-1)

    return rotate(q) * v, rotate(k)


def test_splits_and_slices_are_searched_and_run_as_one_custom_call():
    shapes = [(8, 32), (32, 48), (8, 8), (8, 8)]
    args = [_randn(*s, seed=i) for i, s in enumerate(shapes)]
    fast = mj.optimize(_qkv_rope, config=FAST_SEARCH, require_speedup=False)
    (region,) = fast.plan(*args).regions
    assert region.impl is not None and region.source == "search", region.describe()
    assert region.graph.nodes_of(Op.SLICE)
    fresh = [_randn(*s, seed=10 + i) for i, s in enumerate(shapes)]
    _close(fast(*fresh), jax.jit(_qkv_rope)(*fresh), rtol=sum_rtol(32))


def _causal_attention(q, k, v):
    s = q @ jnp.swapaxes(k, -1, -2) * 0.25
    t = s.shape[-1]
    keep = jnp.arange(t)[None, :] <= jnp.arange(t)[:, None]
    return jax.nn.softmax(jnp.where(keep, s, -jnp.inf), axis=-1) @ v


def test_masked_attention_is_searched_and_runs_as_one_custom_call():
    shapes = [(2, 16, 16), (2, 16, 16), (2, 16, 16)]
    args = [_randn(*s, seed=i) for i, s in enumerate(shapes)]
    fast = mj.optimize(_causal_attention, config=FAST_SEARCH, require_speedup=False)
    (region,) = fast.plan(*args).regions
    assert region.impl is not None and region.source == "search", region.describe()
    assert region.graph.nodes_of(Op.WHERE) or any(
        b.attr("block").nodes_of(Op.WHERE) for b in region.graph.nodes_of(Op.GRAPH_DEF))
    fresh = [_randn(*s, seed=10 + i) for i, s in enumerate(shapes)]
    _close(fast(*fresh), jax.jit(_causal_attention)(*fresh), rtol=sum_rtol(16))
    g = jax.grad(lambda *a: jnp.sum(fast(*a) ** 2), argnums=(0, 1, 2))(*fresh)
    want = jax.grad(lambda *a: jnp.sum(_causal_attention(*a) ** 2), argnums=(0, 1, 2))(*fresh)
    _close(g, want, rtol=sum_rtol(16))


def test_unsupported_op_cuts_and_the_rest_runs_as_custom_calls():
    def f(x, w):
        y = jnp.sort(jnp.exp(x) @ w, axis=-1)
        return jax.nn.silu(y) * 2.0

    rng = np.random.default_rng(0)
    x, w = rng.standard_normal((8, 16), np.float32), rng.standard_normal((16, 32), np.float32)
    fast = mj.optimize(f, strategy="as_is", require_speedup=False)
    _close(fast(x, w), jax.jit(f)(x, w))
    report = fast.explain(x, w)
    assert report.count("mirage custom call") == 2
    assert "cut: " in report and "sort" in report and "test_api.py" in report


def test_explain_says_how_far_each_search_got_and_the_cache_remembers_it():
    def f(x, w):
        return jax.nn.silu(x @ w)

    x, w = _randn(8, 16, seed=1), _randn(16, 32, seed=2)
    exhaustive = SearchConfig(workers=1, time_candidates=False, progress=False)
    fast = mj.optimize(f, config=exhaustive, require_speedup=False)
    report = fast.explain(x, w)
    assert "search optimal within bounds: all " in report, report
    again = mj.optimize(f, config=exhaustive, require_speedup=False).explain(x, w)
    assert "[from cache]" in again and "search optimal within bounds" in again, again
    bounded = mj.optimize(f, config=exhaustive.with_(max_total_states=50),
                          require_speedup=False).explain(x, w)  # fmt: skip
    assert "search stopped by the total state budget: " in bounded, bounded
    assert "optimal" not in bounded


def test_repeated_layers_are_planned_once_and_explain_says_same_as(monkeypatch):
    def layer(x, g, w):
        return programs.rmsnorm(x) * g @ w

    def model(x, g1, w1, g2, w2, g3, w3):
        # sorts cut the layers apart, as unsupported ops between a model's layers do
        x = jnp.sort(layer(x, g1, w1), axis=-1)
        x = jnp.sort(layer(x, g2, w2), axis=-1)
        return layer(x, g3, w3[:, :8])  # another shape: a region of its own

    compiled = []
    compile_once = CpuBackend.compile
    monkeypatch.setattr(CpuBackend, "compile",
                        lambda self, g: compiled.append(g) or compile_once(self, g))
    args = [_randn(4, 16, seed=0)] + [_randn(*s, seed=i) for i, s in
                                      enumerate([(16,), (16, 16)] * 3, start=1)]  # fmt: skip
    fast = mj.optimize(model, strategy="as_is", require_speedup=False, cache=False)
    _close(fast(*args), jax.jit(model)(*args), rtol=sum_rtol(16))
    report = fast.explain(*args).splitlines()
    assert report[0].startswith("3 region(s)")
    assert report[1].startswith("region 0: mirage custom call")
    assert report[2] == "region 1: mirage custom call - same as region 0"
    assert report[3].startswith("region 2: mirage custom call") and "same as" not in report[3]
    assert len(compiled) == 2


def test_pytrees_static_args_and_no_retrace():
    traces = []

    def f(params, x, scale):
        traces.append(1)
        h = jnp.tanh(x @ params["w"]) * scale
        return {"out": h, "norm": jnp.sum(h * h, axis=-1)}

    rng = np.random.default_rng(1)
    params = {"w": rng.standard_normal((16, 8), np.float32)}
    x = rng.standard_normal((4, 16), np.float32)
    fast = mj.optimize(f, strategy="as_is", require_speedup=False, static_argnums=2)
    for scale in (0.5, 0.5, 2.0):
        _close(fast(params, x, scale), jax.jit(f, static_argnums=2)(params, x, scale))
    n = len(traces)
    fast(params, x, 0.5)
    fast(params, x + 1, 2.0)
    assert len(traces) == n, "a seen signature must not be traced again"
    assert len(fast._plans) == 2


def test_calls_with_a_seen_signature_skip_planning_and_new_ones_plan(monkeypatch):
    from mirage_jax.api import optimized as api

    def f(x, s):
        return jnp.tanh(x) * s

    fast = mj.optimize(f, strategy="as_is", require_speedup=False, static_argnums=1)
    want = jax.jit(f, static_argnums=1)
    x = _randn(4, 8, seed=2)
    _close(fast(x, 3.0), want(x, 3.0))

    def no_python_per_call(*args):
        raise AssertionError("a seen signature must dispatch without computing its key")

    monkeypatch.setattr(api, "_signature", no_python_per_call)
    y = _randn(4, 8, seed=3)
    _close(fast(y, 3.0), want(y, 3.0))  # same shapes: jit's fast path only
    monkeypatch.undo()
    _close(fast(x[:2], 3.0), want(x[:2], 3.0))
    _close(fast(x, 0.5), want(x, 0.5))
    assert len(fast._plans) == 3


def test_failed_build_falls_back_to_xla_with_the_reason(monkeypatch, caplog):
    def broken(self, graph):
        raise CompileError("g++ exploded", remedy="none")

    def f(x):
        return jnp.exp(x) * 3.0

    monkeypatch.setattr(CpuBackend, "compile", broken)
    fast = mj.optimize(f, strategy="as_is", cache=False)
    x = _randn(4, 4, seed=4)
    with caplog.at_level(logging.WARNING, logger="mirage_jax"):
        _close(fast(x), jax.jit(f)(x))
    assert "fell back to XLA: g++ exploded" in fast.explain(x)
    assert "g++ exploded" in caplog.text


def _two_outputs(x, w):
    return jnp.exp(3.0 * x), jnp.tanh(x) @ w  # the first spans magnitudes: 1e-3 to 1e3


def _flat_edit(o, edit):
    return edit(o.reshape(-1)).reshape(o.shape)


# Wrong kernels, each as an edit of the compiled call's outputs (run inside jit by the planner)
MUTANTS = {
    # the last element, where a loop's tail or an off-by-one lands, off by 1% of the output
    "one_wrong_element": lambda outs: (
        _flat_edit(outs[0], lambda o: o.at[-1].add(0.01 * jnp.max(jnp.abs(o)))), outs[1]),
    "relative_1e-3": lambda outs: (outs[0] * (1 + 1e-3), outs[1] * (1 + 1e-3)),
    "one_nan": lambda outs: (outs[0], _flat_edit(outs[1], lambda o: o.at[5].set(jnp.nan))),
    "only_second_output": lambda outs: (outs[0], outs[1] * (1 + 1e-3)),
    # the smallest element of exp(3 x) (about 1e-3, against a largest near 1e3) returned as 0:
    # within 2e-4 of the largest, so only a per-element tolerance catches it
    "smallest_element_zeroed": lambda outs: (
        _flat_edit(outs[0], lambda o: o.at[jnp.argmin(jnp.abs(o))].set(0.0)), outs[1]),
    # right values in the wrong layout: an [8, 16] output returned as [16, 8]
    "wrong_shape": lambda outs: (outs[0].reshape(16, 8), outs[1]),
    # a first output that also broadcasts against XLA's: one row of eight, the rest lost
    "broadcastable_row": lambda outs: (outs[0], outs[1][:1]),
}


@pytest.mark.parametrize("mutant", list(MUTANTS))
def test_wrong_compiled_code_is_caught_and_never_used(monkeypatch, mutant):
    real = CpuBackend.compile

    def wrong(self, graph):
        call = real(self, graph)
        return lambda *args: MUTANTS[mutant](tuple(call(*args)))

    monkeypatch.setattr(CpuBackend, "compile", wrong)
    fast = mj.optimize(_two_outputs, strategy="as_is", require_speedup=False, cache=False)
    x, w = _randn(8, 16, seed=5), _randn(16, 8, seed=6)
    _close(fast(x, w), jax.jit(_two_outputs)(x, w))
    (region,) = fast.plan(x, w).regions
    assert region.impl is None and "differs from XLA" in fast.explain(x, w)


def test_slower_region_stays_with_xla_and_explain_says_so(monkeypatch):
    def f(x):
        return jnp.exp(x) + 1.0

    monkeypatch.setattr(planner, "compare", lambda cand, base, args: (2e-3, 1e-3))
    monkeypatch.setattr(planner, "compare_in_loop", lambda cand, base, args, **k: (2e-3, 1e-3))
    fast = mj.optimize(f, strategy="as_is", cache=False)
    x = _randn(8, 8, seed=7)
    _close(fast(x), jax.jit(f)(x))
    plan = fast.plan(x)
    assert plan.regions[0].impl is None
    assert "slower than XLA (0.50x), kept with XLA" in fast.explain(x)


def test_pieces_of_a_program_are_timed_per_call_in_a_loop_and_explain_says_so(monkeypatch):
    """A region cut out of a larger program is compared with XLA as it runs there: a call
    each inside a loop (``timing.compare_in_loop``), not as programs of their own, whose
    call costs differ between XLA's and a custom call's; a region that is the whole program
    is compared as the program the user calls."""
    looped: list[int] = []

    def in_loop(cand, base, args, working_set_bytes):
        assert working_set_bytes == 2 * 8 * 16 * 4  # the argument and the result
        looped.append(len(args))
        return 1e-6, 3e-6

    def as_programs(cand, base, args):
        raise AssertionError("a piece of a program timed as a program of its own")

    monkeypatch.setattr(planner, "compare_in_loop", in_loop)
    monkeypatch.setattr(planner, "compare", as_programs)

    def f(x):
        return jnp.sort(jnp.tanh(x) * 2.0, axis=-1) * 3.0 + 1.0

    x = _randn(8, 16, seed=0)
    fast = mj.optimize(f, strategy="as_is", cache=False)
    plan = fast.plan(x)
    assert looped == [1, 1] and all(p.in_a_loop for p in plan.regions)
    assert "(3.00x vs XLA, per call in a loop: 1 us vs 3 us)" in fast.explain(x)
    assert planner._us(3.8e-7) == "0.38 us" and planner._us(4.25e-5) == "42.5 us"
    assert planner._us(1.2345e-3) == "1234 us"

    monkeypatch.setattr(planner, "compare", lambda cand, base, args: (1e-6, 2e-6))
    whole = mj.optimize(lambda x: jnp.tanh(x) * 2.0, strategy="as_is", cache=False)
    assert "(2.00x vs jax.jit: 1 us vs 2 us)" in whole.explain(x)
    assert looped == [1, 1]


def test_a_close_win_is_measured_again_and_kept_only_if_it_holds(monkeypatch):
    def f(x):
        return jnp.exp(x) + 1.0

    x = _randn(8, 8, seed=8)
    for times, kept in ((((1.0, 1.08), (1.0, 1.02)), False), (((1.0, 1.08), (1.0, 1.10)), True),
                        (((1.0, 1.5),), True), (((1.0, 0.9),), False)):  # fmt: skip
        calls = iter(times)
        monkeypatch.setattr(planner, "compare", lambda cand, base, args, calls=calls: next(calls))
        fast = mj.optimize(f, strategy="as_is", cache=False)
        region = fast.plan(x).regions[0]
        assert next(calls, None) is None, f"{times}: not every comparison ran"
        assert (region.impl is not None) == kept, (times, fast.explain(x))
        ratio = min(xla / mj_s for mj_s, xla in times)
        assert region.speedup == pytest.approx(ratio), times  # the less favourable one
        _close(fast(x), jax.jit(f)(x))


def test_a_plan_that_replaces_nothing_calls_jax_jit_of_the_function(monkeypatch):
    monkeypatch.setattr(planner, "compare", lambda cand, base, args: (2e-3, 1e-3))
    monkeypatch.setattr(planner, "compare_in_loop", lambda cand, base, args, **k: (2e-3, 1e-3))

    def user_fn(x, scale):
        return jnp.exp(x) * scale

    f = mj.optimize(user_fn, strategy="as_is", cache=False, static_argnums=1)
    x = _randn(8, 8, seed=9)
    for scale in (0.5, 2.0):
        _close(f(x, scale), jax.jit(user_fn, static_argnums=1)(x, scale))
    plan = f.plan(x, 2.0)
    assert plan.regions[0].impl is None
    # the user's function itself, as jax.jit(user_fn) traces it, not a re-evaluation of the
    # jaxpr (and no jit of its own: under jax.grad that splits the program, see test_transforms)
    want = str(jax.make_jaxpr(lambda x: user_fn(x, 2.0))(x))
    assert str(jax.make_jaxpr(plan.traceable)(x)) == want
    assert str(jax.make_jaxpr(lambda x: f(x, 2.0))(x)) == want  # traced: inlined


def test_xla_strategy_and_bad_options():
    f = mj.optimize(lambda x: jnp.exp(x), strategy="xla")
    x = _randn(3, seed=10)
    assert "strategy 'xla'" in f.explain(x)
    _close(f(x), jax.jit(jnp.exp)(x))
    with pytest.raises(MirageError, match="unknown strategy 'fast'"):
        mj.optimize(lambda x: x, strategy="fast")


def _tanh_matmul(x, w):
    return jnp.tanh(x @ w) * 2.0


def test_first_call_inside_the_users_jit_and_vmap_plans_and_matches_jit():
    x, w = _randn(8, 16, seed=11), _randn(16, 32, seed=12)
    fast = mj.optimize(_tanh_matmul, strategy="as_is", require_speedup=False)

    @jax.jit
    def outer(x, w):  # plans while x and w are tracers of this jit
        return fast(x, w).sum(-1) + 1.0

    _close(outer(x, w), jax.jit(lambda x, w: _tanh_matmul(x, w).sum(-1) + 1.0)(x, w))
    plan = fast.plan(x, w)  # the eager call's plan is the one the trace made
    assert len(fast._plans) == 1 and [p.impl is not None for p in plan.regions] == [True]
    xs, ws = np.stack([x, 2 * x]), np.stack([w, w[::-1]])
    _close(jax.vmap(fast)(xs, ws), jax.vmap(jax.jit(_tanh_matmul))(xs, ws))


def test_an_optimized_function_is_a_function_to_jax_and_functools():
    # jax.jit(fast) hashes fast (its cache is keyed by the function), as functools caches do
    x, w = _randn(8, 16, seed=13), _randn(16, 32, seed=14)
    fast = mj.optimize(_tanh_matmul, strategy="as_is", require_speedup=False)
    assert len({fast, fast}) == 1 and fast != mj.optimize(_tanh_matmul)
    _close(jax.jit(fast)(x, w), jax.jit(_tanh_matmul)(x, w))
    grad = jax.jit(jax.grad(lambda x, w: fast(x, w).sum(), argnums=1))
    _close(grad(x, w), jax.grad(lambda x, w: _tanh_matmul(x, w).sum(), argnums=1)(x, w))


def test_first_call_under_vmap_plans_the_per_example_shapes():
    xs = np.stack([_randn(8, 16, seed=13 + i) for i in range(3)])
    ws = np.stack([_randn(16, 32, seed=16 + i) for i in range(3)])
    fast = mj.optimize(_tanh_matmul, strategy="as_is", require_speedup=False)
    _close(jax.vmap(fast)(xs, ws), jax.vmap(jax.jit(_tanh_matmul))(xs, ws))
    (key,) = fast._plans  # one plan, for one example's shapes, with a custom call
    plan = fast.plan(xs[0], ws[0])
    assert fast._plans[key] is plan and [p.impl is not None for p in plan.regions] == [True]
    _close(fast(xs[1], ws[1]), jax.jit(_tanh_matmul)(xs[1], ws[1]))


def test_custom_calls_that_lose_in_the_whole_program_are_dropped(monkeypatch, tmp_path):
    """Each region wins alone, but together the program is slower than jax.jit: each kernel
    is timed alone in the program, the one that wins there is kept, the other dropped with
    the reason, and the choice is cached for the next process."""
    from mirage_jax.api import optimized as api

    monkeypatch.setenv("MIRAGE_JAX_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(planner, "compare", lambda *a, **k: (1e-6, 2e-6))  # both win alone
    monkeypatch.setattr(planner, "compare_in_loop", lambda *a, **k: (1e-6, 2e-6))
    in_program = {frozenset({0, 1}): 0.9, frozenset({0}): 0.95, frozenset({1}): 1.2}
    measured: list[frozenset] = []

    def timer(program, regions, fn, args, static_argnums):
        def measure(keep):
            measured.append(keep)
            return 1.0, in_program[keep]  # (mirage, xla) seconds: ratio in_program[keep]

        return measure

    monkeypatch.setattr(api, "_program_timer", timer)

    def f(x):
        return jnp.sort(jnp.tanh(x) * 2.0, axis=-1) * 3.0 + 1.0

    x = _randn(8, 16, seed=0)
    fast = mj.optimize(f, strategy="as_is")
    _close(fast(x), jax.jit(f)(x))
    first, second = fast.plan(x).regions
    assert first.impl is None and second.impl is not None
    assert first.reason.startswith("dropped from the program: with all 2 custom calls the "
                                   "program ran 0.90x of jax.jit")
    report = fast.explain(x)
    assert "kept regions 1 (1.20x)" in report and "whole program:" in report, report
    assert "regions 1 1.20x, regions 0 0.95x" in report, report
    assert measured == [frozenset({0, 1}), frozenset({0}), frozenset({1})]
    again = mj.optimize(f, strategy="as_is").plan(x)  # a new process's view: from the cache
    assert [p.impl is not None for p in again.regions] == [False, True]
    assert len(measured) == 3


@pytest.mark.parametrize("together, kept", [(1.3, {0, 1, 2}), (0.97, {2})])
def test_kernels_that_win_alone_in_the_program_are_kept_together_only_if_that_wins(
        together, kept):  # fmt: skip
    from types import SimpleNamespace

    from mirage_jax.planner.whole import keep_winning

    plans = [SimpleNamespace(index=i, key=k, impl=object(), reason="")
             for i, k in enumerate(["a", "a", "b", "c"])]  # regions 0 and 1 share a kernel
    ratios = {frozenset({0, 1, 2, 3}): 0.9, frozenset({0, 1}): 1.1, frozenset({2}): 1.2,
              frozenset({3}): 0.8, frozenset({0, 1, 2}): together}  # fmt: skip
    note = keep_winning(plans, lambda keep: (1.0, ratios[keep]), key=None)
    assert {p.index for p in plans if p.impl is not None} == kept, note
    assert all(p.reason.startswith("dropped from the program") for p in plans
               if p.impl is None)  # fmt: skip


def test_the_searches_of_a_plan_share_one_process_pool(monkeypatch):
    from mirage_jax.search import InlineExecutor, runner

    pools = []

    def one_pool(workers):
        pools.append(workers)
        return InlineExecutor()

    def no_pool_per_search(workers):
        raise AssertionError("a search of the plan started a pool of its own")

    monkeypatch.setattr(planner, "default_executor", one_pool)
    monkeypatch.setattr(runner, "default_executor", no_pool_per_search)
    program = {p.name: p for p in programs.extra_programs()}["sort_between"]
    args = program.call_args(programs.make_inputs(program, seed=1))
    fast = mj.optimize(program.fn, config=FAST_SEARCH.with_(workers=2), cache=False,
                       require_speedup=False)  # fmt: skip
    plan = fast.plan(*args)
    assert sum(r.search_report is not None for r in plan.regions) == 2, plan.report()
    assert pools == [2]
    _close(fast(*args), jax.jit(program.fn)(*args))


def test_planning_traces_the_programs_it_times_as_later_calls_trace_them(monkeypatch):
    """Compile-time eval would fold a mask built from iota into a constant while the planner
    traces what it times, so the plan would be judged on a program no later call runs."""
    from mirage_jax.api import optimized

    seen = []
    real = optimized.plan_regions

    def spy(program, options, backend):
        jaxpr = jax.make_jaxpr(lambda x: x + jax.lax.iota(jnp.float32, 8))(jnp.ones(8))
        seen.append([e.primitive.name for e in jaxpr.eqns])
        return real(program, options, backend)

    monkeypatch.setattr(optimized, "plan_regions", spy)
    x = _randn(8, 8, seed=9)
    mj.optimize(lambda x: jnp.exp(x) + 1.0, strategy="as_is", cache=False).plan(x)
    assert "iota" in seen[0], seen
