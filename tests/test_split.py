"""Splitting regions too large for one search (``frontend.split``): pieces within the bound,
the same values as the whole, cuts where the cost model says least data crosses, and explain."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from tolerance import assert_tree_close

import mirage_jax as mj
from mirage_jax.backend.cpu.backend import cpu_backend
from mirage_jax.errors import SearchError
from mirage_jax.frontend import TracedProgram, trace
from mirage_jax.frontend.split import SplitPolicy, compute_ops, split_regions
from mirage_jax.interpret import evaluate
from mirage_jax.planner.search import split_for_search
from mirage_jax.search import SearchConfig


def _randn(*shape: int, seed: int) -> jax.Array:
    return jnp.asarray(np.random.default_rng(seed).standard_normal(shape), jnp.float32)


def _interpreted(program: TracedProgram) -> dict:
    def impl(graph):
        return lambda *xs: evaluate(graph, [np.asarray(x) for x in xs])

    return {r.index: impl(r.graph) for r in program.regions}


def _block(x, g, w1, w2, w3):
    """A pre-norm MLP block and a softmax over its output: one region of about 30 ops."""
    h = x * jax.lax.rsqrt(jnp.mean(x * x, -1, keepdims=True) + 1e-6) * g
    h = x + (jax.nn.silu(h @ w1) * (h @ w2)) @ w3
    h = h * jax.lax.rsqrt(jnp.mean(h * h, -1, keepdims=True) + 1e-6)
    return jax.nn.softmax(jnp.tanh(h) * 3.0, axis=-1) + jnp.sin(h)


def _block_args(seed: int) -> list[jax.Array]:
    shapes = [(16, 64), (64,), (64, 96), (64, 96), (96, 64)]
    return [_randn(*s, seed=seed + i) * (0.2 if i >= 2 else 1.0) for i, s in enumerate(shapes)]


def _split(fn, args, max_ops: int, max_inputs: int = 4) -> tuple[TracedProgram, TracedProgram]:
    whole = trace(fn, *args)
    config = SearchConfig(max_region_ops=max_ops, max_graph_def_inputs=max_inputs)
    return whole, split_for_search(whole, config, cpu_backend())


@pytest.mark.parametrize("max_ops", [6, 11])
def test_pieces_stay_within_the_bound_cover_the_run_and_compute_the_same(max_ops):
    whole, split = _split(_block, _block_args(0), max_ops)
    (region,) = whole.regions
    assert compute_ops(region) > max_ops
    assert len(split.regions) >= 2
    spans = [r.span for r in split.regions]
    assert spans[0][0] >= region.span[0] and spans[-1][1] <= region.span[1]
    assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:])), spans
    assert [r.index for r in split.regions] == list(range(len(split.regions)))
    for piece in split.regions:
        assert compute_ops(piece) <= max_ops, piece.describe()
        assert len(piece.inputs) <= 4, piece.describe()
        assert piece.split is split.regions[0].split
        assert piece.split.ops == compute_ops(region) and piece.split.max_ops == max_ops
    fresh = _block_args(10)
    got = split.run(*fresh, region_impls=_interpreted(split))
    assert_tree_close(got, jax.jit(_block)(*fresh), rtol=1e-4)


def test_cuts_fall_after_the_reduction_where_least_data_crosses():
    def fn(x):
        y = jnp.sin(jnp.tanh(jnp.exp(x) * x) + x)
        s = jnp.sum(y, axis=-1)
        return jnp.tanh(jnp.cos(jnp.exp(s) * 2.0) + 1.0)

    x = _randn(256, 1024, seed=0)
    whole, split = _split(fn, [x], 7)
    reduce_at = next(i for i, e in enumerate(whole.eqns) if e.primitive.name == "reduce_sum")
    (cut,) = split.regions[0].split.cuts
    assert cut > reduce_at, (cut, reduce_at)
    assert split.regions[0].split.crossing == 256 * 4  # the sums alone, not a [256, 1024] value


def test_a_region_within_the_bounds_is_left_as_traced():
    whole, split = _split(_block, _block_args(0), 200, max_inputs=5)
    assert split is whole


def test_a_region_with_more_inputs_than_one_searched_kernel_takes_is_split():
    def fn(a, b, c, d, e, f):  # few ops, six inputs: no one graph-defined kernel can take them
        return jnp.tanh(a * b + c) * d + jnp.exp(e) * f

    args = [_randn(32, 32, seed=i) for i in range(6)]
    whole, split = _split(fn, args, 24)
    assert len(whole.regions) == 1 and compute_ops(whole.regions[0]) <= 24
    assert len(split.regions) >= 2 and all(len(r.inputs) <= 4 for r in split.regions)
    assert "6 inputs, more than the 4 one searched kernel takes" in str(split.regions[0].split)
    fresh = [_randn(32, 32, seed=10 + i) for i in range(6)]
    got = split.run(*fresh, region_impls=_interpreted(split))
    assert_tree_close(got, jax.jit(fn)(*fresh), rtol=1e-5)


def test_an_equation_larger_than_the_bound_keeps_its_region_whole():
    def fn(x):  # clamp is two ops (max, min) in one equation
        return jnp.sin(jax.lax.clamp(-0.5, jnp.exp(x), 0.5))

    policy = SplitPolicy(1, 8, lambda nbytes, mm, elem: nbytes + mm + elem)
    whole = trace(fn, _randn(4, 8, seed=0))
    split = split_regions(whole, policy)
    assert [r.span for r in split.regions] == [r.span for r in whole.regions]
    assert split.regions[0].split is None


def test_the_cost_decides_the_cut_not_the_op_count():
    """Two admissible cuts, one through a wide value and one after a narrow one: a price of
    bytes picks the narrow one whatever the op counts on each side."""

    def fn(x, w):
        y = jnp.exp(x) * x + 1.0  # [64, 512]
        z = y @ w  # [64, 4]: narrow
        return jnp.tanh(z) * 2.0 + jnp.sin(z)

    whole = trace(fn, _randn(64, 512, seed=0), _randn(512, 4, seed=1))
    by_bytes = split_regions(whole, SplitPolicy(5, 8, lambda nbytes, mm, elem: nbytes))
    cuts = by_bytes.regions[0].split.cuts
    matmul_at = next(i for i, e in enumerate(whole.eqns) if e.primitive.name == "dot_general")
    assert cuts == (matmul_at + 1,), cuts
    assert all(compute_ops(r) <= 5 for r in by_bytes.regions)


def test_max_region_ops_must_be_positive():
    with pytest.raises(SearchError, match="max_region_ops"):
        SearchConfig(max_region_ops=0)


def test_explain_shows_the_split_and_each_piece_is_planned():
    config = SearchConfig(workers=1, time_candidates=False, progress=False, max_tasks=4,
                          max_verify=6, time_budget_s=120, max_region_ops=11)  # fmt: skip
    fast = mj.optimize(_block, config=config, require_speedup=False)
    args = _block_args(0)
    report = mj.explain(fast, *args)
    assert "split: equations [" in report and "more than the 11 a search covers" in report
    assert report.count("split:") == 1, report
    plans = fast.plan(*args).regions
    assert len(plans) >= 3 and all(p.impl is not None for p in plans), report
    fresh = _block_args(20)
    assert_tree_close(fast(*fresh), jax.jit(_block)(*fresh), rtol=1e-4)
