"""Whole models against jax.jit: a Llama-style decoder (flax.nnx, prefill and decode) and a
GPT-2 block (flax.linen), at a few sizes, in float32 and bfloat16.

    pip install '.[models]'
    python benchmarks/models.py [--models llama gpt2] [--d-model 256 512] [--dtype float32 bfloat16]
                                [--rounds 10] [--json benchmarks/models.json]

Per case: the speedup of ``@optimize`` over ``jax.jit`` of the same function (``timing.compare``
in this process), the harness's A/A (``jax.jit`` against itself: the noise floor of that
speedup), regions replaced / regions (identical layers count once: "same as"), the cold plan
time (empty cache: trace, search, compile, verify, time) and the cached plan time (a new
process's view: decisions and kernels from the disk cache), and the max error relative to the
largest output. A JSON of all rows is written beside the table.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

import mirage_jax as mj
from mirage_jax.timing import compare

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))
import llama  # noqa: E402


class Gpt2Block(nn.Module):
    """LayerNorm, causal multi-head attention, GELU MLP, both with residuals."""

    heads: int
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        d = x.shape[-1]
        h = nn.LayerNorm(param_dtype=self.dtype)(x)
        mask = nn.make_causal_mask(jnp.ones(x.shape[:2]))
        x = x + nn.MultiHeadDotProductAttention(num_heads=self.heads, param_dtype=self.dtype)(
            h, h, mask=mask)  # fmt: skip
        h = nn.LayerNorm(param_dtype=self.dtype)(x)
        h = nn.Dense(4 * d, param_dtype=self.dtype)(h)
        return x + nn.Dense(d, param_dtype=self.dtype)(nn.gelu(h))


def llama_cases(d: int, dtype: str, prefill: int) -> list[tuple[str, Callable, tuple]]:
    c = llama.Config(layers=2, d_model=d, heads=max(4, d // 64), kv_heads=2,
                     ffn=int(d * 8 / 3) // 64 * 64, max_len=2 * prefill, dtype=dtype)  # fmt: skip
    forward, state = llama.make(c)
    tokens = jnp.asarray(np.random.default_rng(1).integers(0, c.vocab, prefill), jnp.int32)
    caches = jax.jit(forward)(state, tokens, llama.empty_caches(c), 0)[1]
    return [
        (f"llama d={d} prefill T={prefill}", forward, (state, tokens, llama.empty_caches(c), 0)),
        (f"llama d={d} decode", forward, (state, tokens[:1], caches, prefill)),
    ]


def gpt2_cases(d: int, dtype: str, t: int) -> list[tuple[str, Callable, tuple]]:
    block = Gpt2Block(heads=max(4, d // 64), dtype=jnp.dtype(dtype))
    x = jnp.asarray(np.random.default_rng(0).standard_normal((1, t, d)), dtype)
    params = block.init(jax.random.key(0), x)
    return [(f"gpt2 block d={d} T={t}", block.apply, (params, x))]


def bench(name: str, fn: Callable, args: tuple, rounds: int) -> dict:
    with tempfile.TemporaryDirectory() as cache:
        os.environ["MIRAGE_JAX_CACHE_DIR"] = cache
        fast = mj.optimize(fn)
        start = time.perf_counter()
        plan = fast.plan(*args)
        cold = time.perf_counter() - start
        start = time.perf_counter()
        mj.optimize(fn).plan(*args)
        cached = time.perf_counter() - start
    os.environ.pop("MIRAGE_JAX_CACHE_DIR")
    xla = jax.jit(fn)
    got = jax.tree_util.tree_leaves(fast(*args))[0].astype(jnp.float32)
    want = jax.tree_util.tree_leaves(xla(*args))[0].astype(jnp.float32)
    err = float(jnp.max(jnp.abs(got - want)) / jnp.max(jnp.abs(want)))
    t_mj, t_xla = compare(fast, xla, args, rounds=rounds)
    again = jax.jit(lambda *a: fn(*a))
    t_again, t_first = compare(again, xla, args, rounds=rounds)
    replaced = sum(p.impl is not None for p in plan.regions)
    return {"case": name, "speedup": t_xla / t_mj, "aa": t_first / t_again,
            "mirage_s": t_mj, "xla_s": t_xla, "replaced": replaced,
            "regions": len(plan.regions), "cuts": len(plan.program.cuts),
            "plan_cold_s": cold, "plan_cached_s": cached, "max_rel_err": err,
            "explain": plan.report()}  # fmt: skip


def print_table(rows: list[dict]) -> None:
    head = (f"{'case':34} {'dtype':>8} {'speedup':>8} {'A/A':>6} {'replaced':>9} "
            f"{'cold plan':>10} {'cached':>7} {'rel err':>8}")  # fmt: skip
    print(head)
    print("-" * len(head))
    for r in rows:
        print(f"{r['case']:34} {r['dtype']:>8} {r['speedup']:>7.2f}x {r['aa']:>6.3f} "
              f"{r['replaced']:>4}/{r['regions']:<4} {r['plan_cold_s']:>9.1f}s "
              f"{r['plan_cached_s']:>6.2f}s {r['max_rel_err']:>8.1e}")  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", nargs="+", default=["llama", "gpt2"], choices=("llama", "gpt2"))
    p.add_argument("--d-model", type=int, nargs="+", default=[256, 512])
    p.add_argument("--dtype", nargs="+", default=["float32", "bfloat16"],
                   choices=("float32", "bfloat16"))  # fmt: skip
    p.add_argument("--tokens", type=int, default=64, help="prefill / block sequence length")
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--json", default="benchmarks/models.json")
    a = p.parse_args()
    makers = {"llama": llama_cases, "gpt2": gpt2_cases}
    rows = []
    for model in a.models:
        for d in a.d_model:
            for dtype in a.dtype:
                for name, fn, args in makers[model](d, dtype, a.tokens):
                    row = {**bench(name, fn, args, a.rounds), "dtype": dtype}
                    print(f"  {name} {dtype}: {row['speedup']:.2f}x", file=sys.stderr)
                    rows.append(row)
    print_table(rows)
    aa = [r["aa"] for r in rows]
    print(f"\nA/A (jax.jit against itself): {min(aa):.3f} to {max(aa):.3f}")
    Path(a.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
