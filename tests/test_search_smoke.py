"""A fast end-to-end search: small LoRA is fused into one verified graph-defined kernel, and
every verified candidate, compiled and run, computes what ``jax.jit`` computes."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from tolerance import assert_array_close

from mirage_jax import superoptimize, trace
from mirage_jax.backend.cpu.backend import CpuBackend
from mirage_jax.interpret import evaluate, ff_fingerprint
from mirage_jax.ir import Op
from mirage_jax.search import InlineExecutor, SearchConfig


def lora(x, w, a, b):
    return x @ w + (x @ a) @ b


def test_small_lora_search_finds_a_verified_fused_kernel():
    rng = np.random.default_rng(0)
    shapes = [(16, 64), (64, 128), (64, 8), (8, 128)]
    args = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    target = trace(lora, *args).regions[0].graph
    config = SearchConfig(time_budget_s=30, workers=1, time_candidates=False, progress=False)
    result = superoptimize(target, config, executor=InlineExecutor(), timer=lambda g: None)
    assert result.verified, str(result.report)
    best = result.verified[0].graph
    assert any(n.op is Op.GRAPH_DEF for n in best.nodes)
    assert ff_fingerprint(best) == ff_fingerprint(target)
    fresh = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    want = np.asarray(jax.jit(lora)(*[jnp.asarray(x) for x in fresh]))
    assert_array_close(evaluate(best, fresh)[0], want, what="interpreted")
    backend = CpuBackend()
    for i, candidate in enumerate(result.verified):
        (got,) = jax.jit(backend.compile(candidate.graph))(*fresh)
        assert_array_close(got, want, what=f"compiled candidate {i}\n{candidate.graph}")
    text = str(result.report)
    assert "verification:" in text and "false acceptance <=" in text
