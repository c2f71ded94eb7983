"""Quickstart: trace a function into μGraphs, optimize it, compare with jax.jit.

    python examples/quickstart.py
"""

from __future__ import annotations

import logging

import jax
import jax.numpy as jnp
import numpy as np

import mirage_jax as mj
from mirage_jax.timing import compare


def rmsnorm_linear(x, g, w):
    x = x * jax.lax.rsqrt(jnp.mean(x * x, -1, keepdims=True) + 1e-6) * g
    return x @ w


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    rng = np.random.default_rng(0)
    x = rng.standard_normal((16, 4096), dtype=np.float32)
    g = rng.standard_normal((4096,), dtype=np.float32)
    w = (rng.standard_normal((4096, 6144)) / 64).astype(np.float32)

    program = mj.trace(rmsnorm_linear, x, g, w)
    print("== traced regions and their kernel graphs")
    print(program.describe())

    fast = mj.optimize(rmsnorm_linear)
    got = np.asarray(fast(x, g, w))
    want = np.asarray(jax.jit(rmsnorm_linear)(x, g, w))
    print("== explain")
    print(mj.explain(fast, x, g, w))
    err = float(np.max(np.abs(got - want)) / np.max(np.abs(want)))
    t_mj, t_xla = compare(fast, jax.jit(rmsnorm_linear), (x, g, w))
    print(f"max relative error vs jax.jit: {err:.2e}")
    print(f"speedup over jax.jit (same process): {t_xla / t_mj:.2f}x")


if __name__ == "__main__":
    main()
