"""Model pieces against jax.jit, each alone: a causal attention head (mask from ``tril``), a
logsumexp head (cross-entropy's, with its ``isfinite`` guard) and a masked row sum.

    python benchmarks/pieces.py

Each runs ``@optimize`` from an empty cache and prints its speedup (the median of three
``timing.compare`` runs after a warm one, with their range and the harness's A/A), the cold
plan time, the largest error against ``jax.jit`` and ``explain``'s region lines. These are the
shapes of code whose regions had no fused form before the search learnt to peel output
reshapes and to leave a literal fill unread.
"""

from __future__ import annotations

import os
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np

import mirage_jax as mj
from mirage_jax.timing import compare


def causal_attention(q, k, v):
    t, d = q.shape
    s = q @ k.T / np.sqrt(d)
    mask = jnp.tril(jnp.ones((t, t), bool))
    return jax.nn.softmax(jnp.where(mask, s, -jnp.inf), axis=-1) @ v


def logsumexp_head(x, w):
    return jax.nn.logsumexp(x @ w, axis=-1)


def masked_rowsum(x, y, m):
    return jnp.sum(jnp.where(m, x * y, 0.0), axis=-1)


def cases(rng: np.random.Generator) -> dict[str, tuple]:
    def f32(*shape: int) -> jax.Array:
        return jnp.asarray(rng.standard_normal(shape).astype(np.float32))

    mask = jnp.asarray(rng.random((256, 1024)) < 0.5)
    return {
        "causal_attention T=128 d=64": (causal_attention, (f32(128, 64), f32(128, 64),
                                                           f32(128, 64))),
        "logsumexp_head 64x512 @ 512x2048": (logsumexp_head, (f32(64, 512),
                                                              f32(512, 2048) * 0.05)),
        "masked_rowsum 256x1024": (masked_rowsum, (f32(256, 1024), f32(256, 1024), mask)),
    }  # fmt: skip


def main() -> None:
    os.environ.setdefault("MIRAGE_JAX_CACHE_DIR", tempfile.mkdtemp())
    for name, (fn, args) in cases(np.random.default_rng(0)).items():
        fast = mj.optimize(fn)
        start = time.time()
        fast.plan(*args)
        plan_s = time.time() - start
        err = float(jnp.max(jnp.abs(fast(*args) - jax.jit(fn)(*args))))
        compare(fast, jax.jit(fn), args, rounds=2)  # the first comparison after planning is cold
        ratios = sorted(b / c for c, b in (compare(fast, jax.jit(fn), args, rounds=5)
                                           for _ in range(3)))  # fmt: skip
        aa, base = compare(jax.jit(fn), jax.jit(fn), args, rounds=3)
        print(f"{name}: {ratios[1]:.2f}x vs jax.jit ({ratios[0]:.2f}-{ratios[2]:.2f}; "
              f"A/A {base / aa:.3f}), cold plan {plan_s:.0f} s, max error {err:.1e}")
        for line in mj.explain(fast, *args).splitlines():
            if line.startswith("region"):
                print("   ", line)


if __name__ == "__main__":
    main()
