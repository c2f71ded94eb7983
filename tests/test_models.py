"""Model code as users write it, under ``@optimize``: flax.nnx, flax.linen, Equinox, Haiku.

Each framework gets a small transformer-style model with random weights (small dims, so the
suite stays fast), every region forced to a custom call (``as_is``, no timing), and checks:
the forward pass and ``jax.value_and_grad`` of a loss equal ``jax.jit``'s on fresh inputs, at
least one region is a custom call, and what stays with XLA is cut with a reason. The
frameworks are test extras (``pip install '.[test]'`` or ``'.[models]'``), never dependencies
of ``mirage_jax``.
"""

from __future__ import annotations

import equinox as eqx
import flax.linen as nn
import haiku as hk
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from tolerance import (
    assert_array_close,
    assert_tree_close,
    error_scale,
    sum_rtol,
    typical,
)

import mirage_jax as mj

D = 32
FORCED = {"strategy": "as_is", "require_speedup": False, "cache": False}


@pytest.fixture(autouse=True)
def _private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MIRAGE_JAX_CACHE_DIR", str(tmp_path / "cache"))


def _x(*shape: int, seed: int) -> jax.Array:
    return jnp.asarray(np.random.default_rng(seed).standard_normal(shape), jnp.float32)


def _check(fn, params, *rest, min_custom: int = 1) -> str:
    """``fn(params, *rest)`` and the gradient of its mean square w.r.t. ``params``, under
    @optimize (forced) against jax.jit, on inputs other than the planning ones; the report."""
    fast = mj.optimize(fn, **FORCED)
    report = fast.explain(params, *rest)
    assert report.count("mirage custom call") >= min_custom, report
    fresh = [_x(*np.shape(r), seed=7) if hasattr(r, "shape") else r for r in rest]
    rtol = sum_rtol(4 * D)
    assert_tree_close(fast(params, *fresh), jax.jit(fn)(params, *fresh), rtol=rtol)

    def loss(f):
        return lambda p, *r: jnp.mean(jnp.square(f(p, *r)))

    (value, grads) = jax.jit(jax.value_and_grad(loss(fast)))(params, *fresh)
    (want_value, want_grads) = jax.jit(jax.value_and_grad(loss(fn)))(params, *fresh)
    assert_tree_close(value, want_value, rtol=rtol)
    # a gradient that is 0 in exact arithmetic (attention's key bias: softmax ignores a
    # shift per query) is rounding noise of the size of eps times the other gradients, so
    # every leaf is checked at the scale of the largest leaf's typical element at least
    leaves = [np.asarray(w, np.float64) for w in jax.tree_util.tree_leaves(want_grads)]
    floor = max(typical(w) for w in leaves)
    for i, (g, w) in enumerate(zip(jax.tree_util.tree_leaves(grads), leaves, strict=True)):
        assert_array_close(g, w, dtype=np.float32, rtol=rtol,
                           scale=np.maximum(error_scale(w), floor),
                           what=f"gradient leaf {i}")  # fmt: skip
    return report


class _NnxBlock(nnx.Module):
    """RMSNorm, causal attention (mask from jnp.tril), SwiGLU MLP: a Llama layer in small."""

    def __init__(self, rngs: nnx.Rngs, heads: int = 2):
        self.heads = heads
        self.norm1, self.norm2 = nnx.RMSNorm(D, rngs=rngs), nnx.RMSNorm(D, rngs=rngs)
        self.qkv = nnx.Linear(D, 3 * D, use_bias=False, rngs=rngs)
        self.out = nnx.Linear(D, D, use_bias=False, rngs=rngs)
        self.gate = nnx.Linear(D, 2 * D, use_bias=False, rngs=rngs)
        self.up = nnx.Linear(D, 2 * D, use_bias=False, rngs=rngs)
        self.down = nnx.Linear(2 * D, D, use_bias=False, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        t = x.shape[0]
        q, k, v = jnp.split(self.qkv(self.norm1(x)), 3, axis=-1)
        q, k, v = (a.reshape(t, self.heads, -1).transpose(1, 0, 2) for a in (q, k, v))
        scores = q @ k.transpose(0, 2, 1) / np.sqrt(q.shape[-1])
        scores = jnp.where(jnp.tril(jnp.ones((t, t), bool)), scores, -1e9)
        att = (jax.nn.softmax(scores, -1) @ v).transpose(1, 0, 2).reshape(t, D)
        x = x + self.out(att)
        h = self.norm2(x)
        return x + self.down(jax.nn.silu(self.gate(h)) * self.up(h))


def test_flax_nnx_split_merge_and_nnx_jit():
    model = _NnxBlock(nnx.Rngs(0))
    graphdef, state = nnx.split(model)

    def apply(state, x):
        return nnx.merge(graphdef, state)(x)

    report = _check(apply, state, _x(8, D, seed=1))
    # what stays with XLA says why (the causal mask's comparison, today)
    assert all(" at " in line for line in report.splitlines() if line.startswith("cut:"))

    fast = mj.optimize(apply, **FORCED)

    @nnx.jit
    def through_nnx_jit(model, x):
        return fast(nnx.state(model), x)

    x = _x(8, D, seed=2)
    assert_tree_close(through_nnx_jit(model, x), model(x), rtol=sum_rtol(4 * D))


def test_a_model_whose_parameters_change_shape_plans_again():
    fast = mj.optimize(lambda s, x: nnx.merge(nnx.split(_NnxBlock(nnx.Rngs(0)))[0], s)(x),
                       **FORCED)  # fmt: skip
    x = _x(8, D, seed=3)
    assert_tree_close(fast(nnx.state(_NnxBlock(nnx.Rngs(0))), x),
                      _NnxBlock(nnx.Rngs(0))(x), rtol=sum_rtol(4 * D))  # fmt: skip
    # another head count: the same parameter shapes, another program; a longer sequence:
    # other shapes. Each is its own plan, none reuses a stale one.
    y = _x(12, D, seed=4)
    model = _NnxBlock(nnx.Rngs(1))
    assert_tree_close(fast(nnx.state(model), y), model(y), rtol=sum_rtol(4 * D))
    assert len(fast._plans) == 2


class _LinenBlock(nn.Module):
    """A GPT-2 block: LayerNorm, multi-head causal attention, GELU MLP."""

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        h = nn.LayerNorm()(x)
        mask = nn.make_causal_mask(jnp.ones(x.shape[:2]))
        x = x + nn.MultiHeadDotProductAttention(num_heads=2)(h, h, mask=mask)
        h = nn.LayerNorm()(x)
        return x + nn.Dense(D)(nn.gelu(nn.Dense(4 * D)(h)))


def test_flax_linen_apply():
    model = _LinenBlock()
    x = _x(1, 8, D, seed=1)
    params = model.init(jax.random.key(0), x)
    # the mask is built by XLA ahead of the block, which is one region
    report = _check(model.apply, params, x)
    assert report.startswith("1 region(s)"), report


class _EqxMlp(eqx.Module):
    """An Equinox pytree with a static field, applied per example with vmap."""

    norm: eqx.nn.LayerNorm
    up: eqx.nn.Linear
    down: eqx.nn.Linear
    activation: str = eqx.field(static=True)

    def __init__(self, key: jax.Array):
        k1, k2 = jax.random.split(key)
        self.norm = eqx.nn.LayerNorm(D)
        self.up, self.down = eqx.nn.Linear(D, 2 * D, key=k1), eqx.nn.Linear(2 * D, D, key=k2)
        self.activation = "tanh"

    def __call__(self, x: jax.Array) -> jax.Array:
        return x + self.down(getattr(jnp, self.activation)(self.up(self.norm(x))))


def test_equinox_filtered_pytree_with_static_field():
    params, static = eqx.partition(_EqxMlp(jax.random.key(1)), eqx.is_array)

    def apply(params, x):
        return jax.vmap(eqx.combine(params, static))(x)

    report = _check(apply, params, _x(4, D, seed=1))
    assert "cut:" not in report


def test_haiku_transform_apply():
    def forward(x):
        x = hk.LayerNorm(-1, create_scale=True, create_offset=True)(x)
        return hk.nets.MLP([2 * D, D], activation=jax.nn.gelu)(x)

    model = hk.without_apply_rng(hk.transform(forward))
    x = _x(4, D, seed=1)
    params = model.init(jax.random.key(2), x)
    report = _check(model.apply, params, x)
    # jnp.var's constant guard folds: the layer norm is not cut into pieces
    assert "cut:" not in report and report.startswith("1 region(s)")
