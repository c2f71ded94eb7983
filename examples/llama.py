"""A small Llama-style decoder in flax.nnx under @mirage_jax.optimize: prefill and decode.

    pip install '.[models]'
    python examples/llama.py [--layers 2] [--d-model 512] [--prefill 64] [--dtype bfloat16]

Random weights; RMSNorm, rotary position embeddings (RoPE, by halves), grouped-query attention
with a causal mask, a SwiGLU MLP, and a KV cache for decode. The model is written as a user
writes it; ``@optimize`` goes on the functions that run it (``nnx.split`` / ``nnx.merge``).
Prints what each region became (``explain``; identical layers are planned once and say "same
as region N") and the speedup over ``jax.jit`` of the same function, measured in this process.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

import mirage_jax as mj
from mirage_jax.timing import compare


@dataclass(frozen=True)
class Config:
    layers: int = 2
    d_model: int = 512
    heads: int = 8
    kv_heads: int = 2
    ffn: int = 1408
    vocab: int = 2048
    max_len: int = 128
    dtype: str = "float32"

    @property
    def head_dim(self) -> int:
        return self.d_model // self.heads


class Attention(nnx.Module):
    def __init__(self, c: Config, rngs: nnx.Rngs):
        hd, dt = c.head_dim, jnp.dtype(c.dtype)
        self.c = c
        self.q = nnx.Linear(c.d_model, c.heads * hd, use_bias=False, param_dtype=dt, rngs=rngs)
        self.kv = nnx.Linear(c.d_model, 2 * c.kv_heads * hd, use_bias=False, param_dtype=dt,
                             rngs=rngs)  # fmt: skip
        self.o = nnx.Linear(c.heads * hd, c.d_model, use_bias=False, param_dtype=dt, rngs=rngs)

    def __call__(self, x, rope, cache, pos):
        """x: [T, d]; rope: (cos, sin) at positions pos..pos+T; cache: (k, v), each
        [max_len, kv_heads, head_dim]. Returns the output and the updated cache."""
        c, t = self.c, x.shape[0]
        q = rotate(self.q(x).reshape(t, c.heads, c.head_dim), *rope)
        k, v = jnp.split(self.kv(x).reshape(t, 2 * c.kv_heads, c.head_dim), 2, axis=1)
        k = rotate(k, *rope)
        cache = tuple(jax.lax.dynamic_update_slice(a, b.astype(a.dtype), (pos, 0, 0))
                      for a, b in zip(cache, (k, v)))  # fmt: skip
        groups = c.heads // c.kv_heads
        keys, values = (jnp.repeat(a, groups, axis=1) for a in cache)
        scores = jnp.einsum("thd,shd->hts", q, keys) / np.sqrt(c.head_dim).astype(q.dtype)
        visible = jnp.arange(c.max_len)[None, :] <= (pos + jnp.arange(t))[:, None]
        scores = jnp.where(visible, scores, jnp.finfo(scores.dtype).min)
        out = jnp.einsum("hts,shd->thd", jax.nn.softmax(scores, axis=-1), values)
        return self.o(out.reshape(t, -1)), cache


def rotate(x, cos, sin):
    """RoPE by halves: (x1, x2) -> (x1 cos - x2 sin, x2 cos + x1 sin), per head."""
    x1, x2 = jnp.split(x, 2, axis=-1)
    cos, sin = cos[:, None, :], sin[:, None, :]
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)


class Mlp(nnx.Module):
    def __init__(self, c: Config, rngs: nnx.Rngs):
        dt = jnp.dtype(c.dtype)
        self.gate = nnx.Linear(c.d_model, c.ffn, use_bias=False, param_dtype=dt, rngs=rngs)
        self.up = nnx.Linear(c.d_model, c.ffn, use_bias=False, param_dtype=dt, rngs=rngs)
        self.down = nnx.Linear(c.ffn, c.d_model, use_bias=False, param_dtype=dt, rngs=rngs)

    def __call__(self, x):
        return self.down(jax.nn.silu(self.gate(x)) * self.up(x))


class Layer(nnx.Module):
    def __init__(self, c: Config, rngs: nnx.Rngs):
        dt = jnp.dtype(c.dtype)
        self.attn_norm = nnx.RMSNorm(c.d_model, param_dtype=dt, rngs=rngs)
        self.attn = Attention(c, rngs)
        self.mlp_norm = nnx.RMSNorm(c.d_model, param_dtype=dt, rngs=rngs)
        self.mlp = Mlp(c, rngs)

    def __call__(self, x, rope, cache, pos):
        h, cache = self.attn(self.attn_norm(x), rope, cache, pos)
        x = x + h
        return x + self.mlp(self.mlp_norm(x)), cache


class Llama(nnx.Module):
    def __init__(self, c: Config, rngs: nnx.Rngs):
        dt = jnp.dtype(c.dtype)
        self.c = c
        self.embed = nnx.Embed(c.vocab, c.d_model, param_dtype=dt, rngs=rngs)
        self.layers = nnx.List([Layer(c, rngs) for _ in range(c.layers)])
        self.norm = nnx.RMSNorm(c.d_model, param_dtype=dt, rngs=rngs)
        self.head = nnx.Linear(c.d_model, c.vocab, use_bias=False, param_dtype=dt, rngs=rngs)

    def __call__(self, tokens, caches, pos):
        """Logits of ``tokens`` (at positions pos..) and the updated caches."""
        x = self.embed(tokens)
        rope = rope_tables(self.c, pos, tokens.shape[0], x.dtype)
        new = []
        for layer, cache in zip(self.layers, caches):
            x, cache = layer(x, rope, cache, pos)
            new.append(cache)
        return self.head(self.norm(x)), new


def rope_tables(c: Config, pos, t: int, dtype):
    inv = 1.0 / (10000.0 ** (jnp.arange(0, c.head_dim, 2) / c.head_dim))
    angles = (pos + jnp.arange(t))[:, None] * inv[None, :]
    return jnp.cos(angles).astype(dtype), jnp.sin(angles).astype(dtype)


def empty_caches(c: Config):
    shape = (c.max_len, c.kv_heads, c.head_dim)
    return [(jnp.zeros(shape, c.dtype), jnp.zeros(shape, c.dtype)) for _ in range(c.layers)]


def make(c: Config, seed: int = 0):
    """The model's graph definition and state, and the function that runs it: what
    ``@optimize`` and ``jax.jit`` are put on."""
    graphdef, state = nnx.split(Llama(c, nnx.Rngs(seed)))

    def forward(state, tokens, caches, pos):
        return nnx.merge(graphdef, state)(tokens, caches, pos)

    return forward, state


def run(c: Config, prefill: int, rounds: int = 10) -> None:
    forward, state = make(c)
    tokens = jnp.asarray(np.random.default_rng(1).integers(0, c.vocab, prefill), jnp.int32)
    caches = empty_caches(c)
    fast, xla = mj.optimize(forward), jax.jit(forward)
    for phase, args in (("prefill", (state, tokens, caches, 0)),
                        ("decode", (state, tokens[:1], xla(state, tokens, caches, 0)[1],
                                    prefill))):  # fmt: skip
        start = time.perf_counter()
        report = mj.explain(fast, *args)
        planned = time.perf_counter() - start
        got, want = fast(*args)[0], xla(*args)[0]
        err = float(jnp.max(jnp.abs(got.astype(float) - want.astype(float)))
                    / jnp.max(jnp.abs(want.astype(float))))  # fmt: skip
        t_mj, t_xla = compare(fast, xla, args, rounds=rounds)
        print(f"== {phase}: {args[1].shape[0]} token(s), {c.layers} layers, d_model "
              f"{c.d_model}, {c.dtype}; planned in {planned:.1f} s")
        print(report)
        print(f"max relative error vs jax.jit: {err:.2e}; speedup over jax.jit: "
              f"{t_xla / t_mj:.2f}x ({t_mj * 1e3:.3f} ms vs {t_xla * 1e3:.3f} ms)\n")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--d-model", type=int, default=512)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--ffn", type=int, default=1408)
    p.add_argument("--prefill", type=int, default=64)
    p.add_argument("--max-len", type=int, default=128)
    p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    a = p.parse_args()
    run(Config(a.layers, a.d_model, a.heads, a.kv_heads, a.ffn, max_len=a.max_len,
               dtype=a.dtype), a.prefill)  # fmt: skip


if __name__ == "__main__":
    main()
