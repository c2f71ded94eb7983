"""JAX transformations through optimized functions: grad, jvp, jacobians, checkpoint, vmap.

Every region is forced to a custom call (``strategy="as_is"``, no speed requirement), so the
derivatives must come through the kernels' derivative rule; the same checks with every region
kept by XLA (``strategy="xla"``) show the behaviour does not depend on what a region became.
References are ``jax`` transformations of the plain function, on fresh random inputs.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import mirage_jax as mj

# f32 kernels against XLA: the primal agrees to rounding; derivatives are XLA's own
RTOL = 2e-5


def rmsnorm_linear(x, g, w):
    x = x * jax.lax.rsqrt(jnp.mean(x * x, -1, keepdims=True) + 1e-6) * g
    return x @ w


def gated_mlp(x, w1, w2):
    return jax.nn.silu(x @ w1) * (x @ w2)


def attention(q, k, v):
    s = (q @ k.T) / np.sqrt(q.shape[-1])
    return jax.nn.softmax(s, axis=-1) @ v


def two_regions(x, w):
    y = jnp.exp(x) @ w
    y = jnp.cumsum(y, axis=-1)  # no μGraph operator: cuts the function in two regions
    return jnp.tanh(y) * y


def logits_logsumexp(x, w):
    return jax.nn.logsumexp(x @ w, axis=-1)  # its max's guard is a finite_or in the region


CASES = {
    "rmsnorm_linear": (rmsnorm_linear, [(4, 64), (64,), (64, 32)]),
    "logsumexp": (logits_logsumexp, [(4, 16), (16, 8)]),
    "gated_mlp": (gated_mlp, [(4, 32), (32, 48), (32, 48)]),
    "attention": (attention, [(8, 16), (12, 16), (12, 16)]),
    "two_regions": (two_regions, [(4, 16), (16, 8)]),
}


def _inputs(shapes, seed):
    rng = np.random.default_rng(seed)
    return [jnp.asarray(rng.standard_normal(s).astype(np.float32)) for s in shapes]


def _close(got, want) -> None:
    got_leaves, want_leaves = jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)
    assert len(got_leaves) == len(want_leaves)
    for g, w in zip(got_leaves, want_leaves):
        assert g.shape == w.shape and g.dtype == w.dtype
        g64, w64 = np.asarray(g, np.float64), np.asarray(w, np.float64)
        scale = max(float(np.max(np.abs(w64))), 1e-30)
        np.testing.assert_allclose(g64, w64, rtol=RTOL, atol=RTOL * scale)


def _optimized(fn, strategy):
    return mj.optimize(fn, strategy=strategy, require_speedup=False, cache=False)


def _loss(fn):
    def loss(*args):
        y = fn(*args)
        return jnp.sum(y * jnp.sin(y))  # a nonlinear read-out: every output element matters

    return loss


@pytest.fixture(params=["as_is", "xla"])
def strategy(request) -> str:
    return request.param


@pytest.mark.parametrize("name", sorted(CASES))
def test_grad_and_value_and_grad_equal_jax(name: str, strategy: str) -> None:
    fn, shapes = CASES[name]
    fast = _optimized(fn, strategy)
    args = _inputs(shapes, seed=1)
    custom = [p.impl is not None for p in fast.plan(*args).regions]
    assert all(custom) if strategy == "as_is" else not any(custom), fast.explain(*args)
    argnums = tuple(range(len(args)))
    fresh = _inputs(shapes, seed=2)
    want = jax.jit(jax.value_and_grad(_loss(fn), argnums=argnums))(*fresh)
    _close(jax.value_and_grad(_loss(fast), argnums=argnums)(*fresh), want)
    _close(jax.jit(jax.grad(_loss(fast), argnums=argnums))(*fresh), want[1])
    _close(jax.grad(jax.checkpoint(_loss(fast)), argnums=argnums)(*fresh), want[1])


@pytest.mark.parametrize("name", sorted(CASES))
def test_forward_mode_and_jacobians_equal_jax(name: str, strategy: str) -> None:
    fn, shapes = CASES[name]
    fast = _optimized(fn, strategy)
    args, tangents = _inputs(shapes, seed=3), _inputs(shapes, seed=4)
    _close(jax.jvp(fast, args, tangents), jax.jvp(jax.jit(fn), args, tangents))
    _close(jax.jacfwd(fast)(*args), jax.jacfwd(fn)(*args))
    _close(jax.jacrev(fast)(*args), jax.jacrev(fn)(*args))


def test_vmap_of_grad_equals_jax(strategy: str) -> None:
    fn, shapes = CASES["rmsnorm_linear"]
    fast = _optimized(fn, strategy)
    args = _inputs(shapes, seed=5)
    fast(*args)  # plan at the unbatched shapes first: vmap then maps the planned call
    xs = jnp.stack(_inputs([shapes[0]] * 3, seed=6))
    per_row = jax.vmap(jax.grad(_loss(fast)), in_axes=(0, None, None))
    want = jax.vmap(jax.grad(_loss(fn)), in_axes=(0, None, None))(xs, *args[1:])
    _close(per_row(xs, *args[1:]), want)


def test_the_primal_still_comes_from_the_kernel() -> None:
    """The derivative rule must not replace the custom call in the forward pass."""
    fn, shapes = CASES["gated_mlp"]
    fast = _optimized(fn, "as_is")
    args = _inputs(shapes, seed=7)
    fast(*args)
    hlo = jax.jit(jax.value_and_grad(_loss(fast))).lower(*args).as_text()
    assert "mirage_jax_dispatch" in hlo


@pytest.mark.parametrize("name", ["rmsnorm_linear", "attention"])
def test_vmap_plans_the_batched_region_as_one_call(name: str) -> None:
    """vmap of an optimized function, first call included, runs the region once for the whole
    batch (a custom call planned at the batched shape), not once per element."""
    fn, shapes = CASES[name]
    fast = _optimized(fn, "as_is")
    args = _inputs(shapes, seed=8)
    xs = jnp.stack(_inputs([shapes[0]] * 5, seed=9))
    batched = jax.vmap(fast, in_axes=(0, *[None] * (len(args) - 1)))
    want = jax.vmap(jax.jit(fn), in_axes=(0, *[None] * (len(args) - 1)))(xs, *args[1:])
    _close(batched(xs, *args[1:]), want)  # the first call: nothing planned before
    hlo = jax.jit(batched).lower(xs, *args[1:]).as_text()
    assert "mirage_jax_dispatch" in hlo and "while" not in hlo, hlo[-2000:]
    _close(jax.vmap(jax.vmap(fast, in_axes=(0, None, None)), in_axes=(None, 0, None))(
        xs, jnp.stack([args[1]] * 2), args[2]),
        jax.vmap(jax.vmap(fn, in_axes=(0, None, None)), in_axes=(None, 0, None))(
        xs, jnp.stack([args[1]] * 2), args[2]))  # fmt: skip


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_training_step_under_optimize_plans_its_backward_regions(name: str) -> None:
    """@optimize on a value_and_grad step traces the backward pass too: its regions are
    planned like any region (here forced to custom calls) and explain names them."""
    fn, shapes = CASES[name]
    argnums = tuple(range(len(shapes)))
    step = jax.value_and_grad(_loss(fn), argnums=argnums)
    fast = _optimized(step, "as_is")
    args = _inputs(shapes, seed=10)
    plan = fast.plan(*args)
    backward = [p for p in plan.regions if p.backward]
    assert backward and all(p.impl is not None for p in backward), fast.explain(*args)
    assert "backward pass): mirage custom call" in fast.explain(*args)
    fresh = _inputs(shapes, seed=11)
    _close(fast(*fresh), jax.jit(step)(*fresh))


@pytest.mark.parametrize("name", sorted(CASES))
def test_grad_of_an_optimized_function_plans_the_backward_as_a_region(name: str) -> None:
    """Reverse mode through a custom-call region runs the region's backward as a region of its
    own (here forced to a custom call too), and explain reports it after the first grad."""
    fn, shapes = CASES[name]
    fast = _optimized(fn, "as_is")
    args = _inputs(shapes, seed=16)
    argnums = tuple(range(len(args)))
    assert "backward" not in fast.explain(*args)
    step = jax.jit(jax.value_and_grad(_loss(fast), argnums=argnums))
    fresh = _inputs(shapes, seed=17)
    _close(step(*fresh), jax.jit(jax.value_and_grad(_loss(fn), argnums=argnums))(*fresh))
    report = fast.explain(*args)
    assert "under derivatives (planned at the first one)" in report, report
    regions = len(fast.plan(*args).regions)
    hlo = step.lower(*fresh).as_text()
    assert hlo.count("mirage_jax_dispatch") >= 2 * regions, report


@pytest.mark.parametrize("kernel_wins", [True, False])
def test_a_region_is_differentiated_the_faster_way(monkeypatch, kernel_wins: bool) -> None:
    """With a speedup required, the first derivative times a reverse pass through the kernel
    and its planned backward against XLA's own vjp of the region, and keeps the faster: the
    kernel's custom calls, or none at all under grad (XLA's derivative, residuals and all)."""
    from mirage_jax.planner import autodiff, region

    timings = (1.0, 2.0) if kernel_wins else (2.0, 1.0)  # (ours, XLA's) seconds
    monkeypatch.setattr(region, "compare", lambda *a, **k: (1.0, 2.0))  # the forward wins
    monkeypatch.setattr(region, "compare_in_loop", lambda *a, **k: (1.0, 2.0))
    monkeypatch.setattr(autodiff, "compare", lambda *a, **k: timings)
    fn, shapes = CASES["gated_mlp"]
    fast = mj.optimize(fn, strategy="as_is", cache=False)
    args = _inputs(shapes, seed=19)
    assert fast.plan(*args).regions[0].impl is not None
    step = jax.jit(jax.value_and_grad(_loss(fast), argnums=(0, 1, 2)))
    fresh = _inputs(shapes, seed=20)
    _close(step(*fresh), jax.jit(jax.value_and_grad(_loss(fn), argnums=(0, 1, 2)))(*fresh))
    hlo = step.lower(*fresh).as_text()
    assert ("mirage_jax_dispatch" in hlo) == kernel_wins
    report = fast.explain(*args)
    assert ("kernel and planned backward" if kernel_wins else "as XLA does") in report, report


def test_second_derivatives_equal_jax(strategy: str) -> None:
    fn, shapes = CASES["gated_mlp"]
    fast = _optimized(fn, strategy)
    x, w1, w2 = _inputs(shapes, seed=18)
    for hess in (jax.hessian, lambda f: jax.jacrev(jax.jacrev(f))):
        _close(hess(lambda x: _loss(fast)(x, w1, w2))(x), hess(lambda x: _loss(fn)(x, w1, w2))(x))


def test_forward_only_regions_are_not_called_backward() -> None:
    fn, shapes = CASES["gated_mlp"]
    plan = _optimized(fn, "as_is").plan(*_inputs(shapes, seed=12))
    assert plan.regions and not any(p.backward for p in plan.regions)
    assert "pass)" not in plan.report()


def test_a_step_whose_cut_parts_the_passes_names_each() -> None:
    """The cumsum cuts two_regions' step: regions of the forward alone, of the backward alone,
    and ones holding both are each named so."""
    fn, shapes = CASES["two_regions"]
    step = jax.value_and_grad(_loss(fn), argnums=(0, 1))
    report = _optimized(step, "xla").explain(*_inputs(shapes, seed=15))
    assert "(backward pass)" in report, report
    assert any(line.startswith("region") and "pass)" not in line
               for line in report.splitlines()), report  # fmt: skip


def test_donated_arguments_and_mixed_precision_under_jit() -> None:
    """jax.jit(..., donate_argnums) over an optimized function, with bf16 weights cast up to
    f32 activations inside the region (one custom call), equals jax.jit of the function."""

    def fn(x, w):
        return x * jnp.tanh(x @ w.astype(jnp.float32))  # x's shape: its buffer is reusable

    fast = _optimized(fn, "as_is")
    x, w = _inputs([(4, 24), (24, 24)], seed=13)
    w = w.astype(jnp.bfloat16)
    assert [p.impl is not None for p in fast.plan(x, w).regions] == [True]
    want = jax.jit(fn)(x, w)
    got = jax.jit(fast, donate_argnums=0)(jnp.array(x), w)
    _close(got, want)


def test_grad_with_respect_to_an_integer_argument_is_jax_own_error() -> None:
    fast = _optimized(lambda x, n: jnp.tanh(x) * n, "as_is")
    x, n = _inputs([(3, 4)], seed=14)[0], jnp.int32(2)
    with pytest.raises(TypeError, match="grad requires real- or complex-valued inputs"):
        jax.grad(lambda x, n: jnp.sum(fast(x, n)), argnums=1)(x, n)
    _close(jax.grad(lambda x: jnp.sum(fast(x, n)))(x), 2 * (1 - jnp.tanh(x) ** 2))


# The six suite programs at small shapes (benchmarks/programs.py), same layouts as the suite's
SUITE_SHAPES = {
    "rmsnorm_linear": [(2, 64), (64,), (64, 48)],
    "gated_mlp": [(4, 32), (32, 32), (32, 32)],
    "lora": [(4, 16), (16, 32), (16, 4), (4, 32)],
    "gqa_decode": [(2, 8, 16), (2, 16, 32), (2, 32, 16)],
    "qknorm_attn": [(2, 8, 16), (2, 16, 32), (2, 32, 16)],
    "ntrans": [(4, 64), (4, 64), (4, 64)],
}


@pytest.mark.parametrize("name", sorted(SUITE_SHAPES))
def test_suite_programs_differentiate_whatever_their_regions_became(name: str, strategy: str
                                                                    ) -> None:  # fmt: skip
    """Every suite program, forced to custom calls or kept by XLA: value_and_grad (through a
    custom call, the backward planned as its own region), jit of it, and jvp equal jax's on
    fresh inputs."""
    import programs

    fn = {p.name: p.fn for p in programs.programs(1)}[name]
    shapes = SUITE_SHAPES[name]
    fast = _optimized(fn, strategy)
    args = _inputs(shapes, seed=21)
    custom = [p.impl is not None for p in fast.plan(*args).regions]
    assert all(custom) if strategy == "as_is" else not any(custom), fast.explain(*args)
    argnums = tuple(range(len(shapes)))
    fresh, tangents = _inputs(shapes, seed=22), _inputs(shapes, seed=23)
    want = jax.jit(jax.value_and_grad(_loss(fn), argnums=argnums))(*fresh)
    _close(jax.jit(jax.value_and_grad(_loss(fast), argnums=argnums))(*fresh), want)
    _close(jax.jvp(fast, fresh, tangents), jax.jvp(jax.jit(fn), fresh, tangents))
    assert ("under derivatives" in fast.explain(*args)) == (strategy == "as_is")


def _extra_programs() -> dict:
    import programs

    return {p.name: p for p in programs.extra_programs()}


@pytest.mark.parametrize("name", sorted(_extra_programs()))
def test_the_further_test_programs_differentiate_whatever_their_regions_became(
    name: str, strategy: str
) -> None:
    """The tests' further programs (norms, softmax, residuals, cuts around sort and cumsum,
    pytree arguments), forced to custom calls or kept by XLA: jit(value_and_grad) over every
    argument, pytrees included, and grad through jax.checkpoint equal jax's on fresh inputs."""
    import programs

    program = _extra_programs()[name]
    args = program.call_args([jnp.asarray(x) for x in programs.make_inputs(program, seed=31)])
    fresh = program.call_args([jnp.asarray(x) for x in programs.make_inputs(program, seed=32)])
    fast = _optimized(program.fn, strategy)
    custom = [p.impl is not None for p in fast.plan(*args).regions]
    assert all(custom) if strategy == "as_is" else not any(custom), fast.explain(*args)
    argnums = tuple(range(len(args)))

    def loss(fn):  # over every output leaf (pytree_mlp returns a dict)
        return lambda *a: sum(jnp.sum(y * jnp.sin(y)) for y in jax.tree_util.tree_leaves(fn(*a)))

    want = jax.jit(jax.value_and_grad(loss(program.fn), argnums=argnums))(*fresh)
    _close(jax.jit(jax.value_and_grad(loss(fast), argnums=argnums))(*fresh), want)
    _close(jax.grad(loss(jax.checkpoint(fast)))(*fresh), jax.grad(loss(program.fn))(*fresh))


def test_under_a_transformation_the_plan_joins_the_callers_trace() -> None:
    """Called on tracers, an optimized function inlines its program as the plain function
    would: no jit boundary for reverse mode to split into a forward and a backward call (XLA
    then scheduled the pieces apart: jax.grad of a jitted rmsnorm_linear ran 0.92x)."""
    fn, shapes = CASES["rmsnorm_linear"]
    args = _inputs(shapes, seed=11)
    fast = _optimized(fn, "xla")
    grad_text = str(jax.make_jaxpr(jax.grad(_loss(fast), argnums=(0, 1, 2)))(*args))
    assert "jit[" not in grad_text, grad_text
    assert grad_text == str(jax.make_jaxpr(jax.grad(_loss(fn), argnums=(0, 1, 2)))(*args))
    _close(jax.jit(jax.grad(_loss(fast)))(*args), jax.grad(_loss(fn))(*args))
