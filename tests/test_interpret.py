"""The float reference interpreter: every op against numpy / jax formulas, block-graph grid,
for-loop and accumulator semantics, and the hand-built fused graphs against their plain forms."""

from __future__ import annotations

import math
import time
import zlib

import graphs as G
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy.special import erf as sp_erf
from scipy.special import erfc as sp_erfc
from scipy.special import erfinv
from tolerance import assert_array_close, product_scale, sum_rtol

from mirage_jax.errors import GraphError, MirageError
from mirage_jax.interpret import evaluate, evaluate_values, ff_fingerprint
from mirage_jax.ir import (
    BF16,
    F16,
    F32,
    F64,
    BlockBuilder,
    KernelBuilder,
    Op,
    TensorType,
    ThreadBuilder,
)

N = -1


def T(*shape: int, dtype=F64) -> TensorType:
    return TensorType(shape, dtype)


@pytest.fixture
def rng(request) -> np.random.Generator:
    # fresh inputs per test, reproducible from the test's name
    return np.random.default_rng(zlib.crc32(request.node.name.encode()))


def unary_graph(op: Op, shape, dtype=F64, **attrs):
    kb = KernelBuilder()
    x = kb.input(T(*shape, dtype=dtype))
    kb.output(kb.apply(op, x, **attrs))
    return kb.build()


# ----------------------------------------------------------------------------- kernel-level ops

SHAPE = (3, 5, 7)


def GELU(x):
    return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))


UNARY_CASES = [
    (Op.EXP, {}, np.exp, jnp.exp, False),
    (Op.LOG, {}, np.log, jnp.log, True),
    (Op.SQUARE, {}, np.square, jnp.square, False),
    (Op.SQRT, {}, np.sqrt, jnp.sqrt, True),
    (Op.RSQRT, {}, lambda x: 1 / np.sqrt(x), jax.lax.rsqrt, True),
    (Op.SIGMOID, {}, lambda x: 1 / (1 + np.exp(-x)), jax.nn.sigmoid, False),
    (Op.SILU, {}, lambda x: x / (1 + np.exp(-x)), jax.nn.silu, False),
    (Op.GELU, {}, GELU, jax.nn.gelu, False),
    (Op.TANH, {}, np.tanh, jnp.tanh, False),
    (Op.ERF, {}, sp_erf, jax.scipy.special.erf, False),
    (Op.ERFC, {}, sp_erfc, jax.scipy.special.erfc, False),
    (Op.SIN, {}, np.sin, jnp.sin, False),
    (Op.COS, {}, np.cos, jnp.cos, False),
    (Op.SIGN, {}, lambda x: np.where(x == 0, x, np.sign(x)), jnp.sign, False),
    (Op.RELU, {}, lambda x: np.where(x > 0, x, 0.0), jax.nn.relu, False),
    (Op.NEG, {}, np.negative, jnp.negative, False),
    (Op.RECIPROCAL, {}, lambda x: 1 / x, jnp.reciprocal, True),
    (Op.MUL_SCALAR, {"scalar": -1.75}, lambda x: x * -1.75, lambda x: x * -1.75, False),
    (Op.ADD_SCALAR, {"scalar": 0.3}, lambda x: x + 0.3, lambda x: x + 0.3, False),
    (Op.POW_SCALAR, {"exponent": 1.5}, lambda x: x**1.5, lambda x: x**1.5, True),
    (Op.POW_SCALAR, {"exponent": 3.0}, lambda x: x**3, lambda x: x**3, False),
    (Op.FINITE_OR, {"fill": 0.5}, lambda x: np.where(np.isfinite(x), x, 0.5),
     lambda x: jnp.where(jnp.isfinite(x), x, 0.5), False),
]


@pytest.mark.parametrize("op, attrs, ref, jref, positive", UNARY_CASES,
                         ids=[f"{c[0].value}{c[1]}" for c in UNARY_CASES])  # fmt: skip
def test_unary_ops_match_numpy_float64_and_jax(op, attrs, ref, jref, positive, rng):
    x = rng.standard_normal(SHAPE) * 2
    if positive:
        x = np.abs(x) + 0.1
    (y,) = evaluate(unary_graph(op, SHAPE, **attrs), [x])
    assert y.dtype == np.float64
    np.testing.assert_allclose(y, ref(x), rtol=1e-12, atol=1e-14)
    # the float32 graph agrees with jax's own definition (gelu = tanh approximation, ...)
    x32 = x.astype(np.float32)
    (y32,) = evaluate(unary_graph(op, SHAPE, F32, **attrs), [x32])
    assert y32.dtype == np.float32
    assert_array_close(y32, np.asarray(jref(x32)), rtol=2e-6, what=op.value)


@pytest.mark.parametrize("op, ref", [(Op.ADD, np.add), (Op.SUB, np.subtract),
                                     (Op.MUL, np.multiply), (Op.DIV, np.divide),
                                     (Op.MAX, np.maximum), (Op.REM, np.fmod)])  # fmt: skip
def test_binary_ops_broadcast_numpy_style(op, ref, rng):
    a, b = rng.standard_normal((3, 1, 7)), rng.standard_normal((1, 5, 7)) + 3
    kb = KernelBuilder()
    x, y = kb.input(T(3, 1, 7)), kb.input(T(1, 5, 7))
    kb.output(kb.apply(op, x, y))
    (out,) = evaluate(kb.build(), [a, b])
    assert out.shape == (3, 5, 7)
    np.testing.assert_allclose(out, ref(a, b), rtol=1e-14)


def test_erf_inv_and_rem_match_scipy_and_jax(rng):
    """Outside the unary table: erf_inv is defined on (-1, 1) only, and rem is C's fmod (the
    dividend's sign) where jnp.remainder / % floor."""
    u = np.tanh(rng.standard_normal(SHAPE) * 2)
    (y,) = evaluate(unary_graph(Op.ERF_INV, SHAPE), [u])
    np.testing.assert_allclose(y, erfinv(u), rtol=1e-15)
    u32 = u.astype(np.float32)
    (y32,) = evaluate(unary_graph(Op.ERF_INV, SHAPE, F32), [u32])
    # XLA's float32 erf_inv forms 1 - x * x, which rounds near |x| = 1 (3e-6 off at 2.51)
    assert_array_close(y32, np.asarray(jax.scipy.special.erfinv(u32)), rtol=1e-5, what="erf_inv")
    kb = KernelBuilder()
    kb.output(kb.apply(Op.REM, kb.input(T(*SHAPE, dtype=F32)), kb.input(T(*SHAPE, dtype=F32))))
    x, d = (rng.standard_normal(SHAPE) * 10).astype(np.float32), rng.standard_normal(SHAPE)
    d = d.astype(np.float32)
    (r,) = evaluate(kb.build(), [x, d])
    np.testing.assert_array_equal(r, np.asarray(jax.lax.rem(x, d)))
    assert (np.signbit(r) == np.signbit(x)).all()


@pytest.mark.parametrize("dim", [0, 1, 2])
@pytest.mark.parametrize("op, ref", [
    (Op.REDUCE_SUM, lambda x, d: x.sum(d, keepdims=True)),
    (Op.REDUCE_MAX, lambda x, d: x.max(d, keepdims=True)),
    (Op.REDUCE_MEAN, lambda x, d: x.mean(d, keepdims=True)),
    (Op.REDUCE_RMS, lambda x, d: np.sqrt((x * x).mean(d, keepdims=True))),
])  # fmt: skip
def test_reductions_keep_rank(op, ref, dim, rng):
    x = rng.standard_normal(SHAPE)
    (y,) = evaluate(unary_graph(op, SHAPE, dim=dim), [x])
    np.testing.assert_allclose(y, ref(x, dim), rtol=1e-13)


def test_matmul_with_batch_dims_concat_and_layout_ops(rng):
    a, b = rng.standard_normal((2, 3, 5)) * 0.5, rng.standard_normal((2, 5, 7)) * 0.5
    kb = KernelBuilder()
    x, y = kb.input(T(2, 3, 5)), kb.input(T(2, 5, 7))
    mm = kb.matmul(x, y)  # [2,3,7]
    cat = kb.apply(Op.CONCAT, mm, kb.apply(Op.EXP, mm), dim=1)  # [2,6,7]
    tr = kb.apply(Op.TRANSPOSE, cat, perm=(2, 0, 1))  # [7,2,6]
    rs = kb.apply(Op.RESHAPE, tr, shape=(14, 6))
    kb.output(rs)
    kb.output(kb.apply(Op.CAST, rs, dtype=F16))
    kb.output(kb.apply(Op.SLICE, cat, dim=1, start=2, size=3))
    out, half, part = evaluate(kb.build(), [a, b])
    m = a @ b
    want = np.concatenate([m, np.exp(m)], 1).transpose(2, 0, 1).reshape(14, 6)
    np.testing.assert_allclose(out, want, rtol=1e-13)
    np.testing.assert_array_equal(part, np.concatenate([m, np.exp(m)], 1)[:, 2:5])
    assert half.dtype == np.float16
    np.testing.assert_array_equal(half, want.astype(np.float16))


def test_precision_float64_upcasts_and_graph_dtypes_round(rng):
    x = (rng.standard_normal((4, 9)) * 3).astype(np.float32)
    g = unary_graph(Op.EXP, (4, 9), F32)
    (y32,) = evaluate(g, [x])
    (y64,) = evaluate(g, [x], precision="float64")
    assert y32.dtype == np.float32 and y64.dtype == np.float64
    np.testing.assert_array_equal(y64, np.exp(x.astype(np.float64)))
    np.testing.assert_array_equal(y32, np.exp(x))
    for dtype in (F16, BF16):
        gh = unary_graph(Op.SILU, (4, 9), dtype)
        xh = x.astype(dtype.numpy)
        (yh,) = evaluate(gh, [xh])
        assert yh.dtype == dtype.numpy
        # computed in float32, rounded once to the storage type
        want = (xh.astype(np.float32) / (1 + np.exp(-xh.astype(np.float32)))).astype(dtype.numpy)
        np.testing.assert_array_equal(yh.astype(np.float32), want.astype(np.float32))


def test_half_types_round_where_xla_writes_them(rng):
    """Elementwise chains stay in float32 (XLA fuses them), matmul and reduction results and
    the outputs round to the half type (XLA writes them out in it)."""
    x = (rng.standard_normal((7,)) * 3).astype(BF16.numpy)
    kb = KernelBuilder()
    xi = kb.input(T(7, dtype=BF16))
    prod = kb.apply(Op.MUL_SCALAR, xi, scalar=3.0)
    kb.output(kb.apply(Op.REDUCE_SUM, prod, dim=0))
    kb.output(prod)
    total, prod_out = evaluate(kb.build(), [x])
    unrounded = x.astype(np.float32) * 3
    assert total.dtype == prod_out.dtype == BF16.numpy
    assert float(total[0]) == float(np.float32(unrounded.sum()).astype(BF16.numpy))
    np.testing.assert_array_equal(prod_out, unrounded.astype(BF16.numpy))
    # a product that overflows f16 is inf, also when scaled back into range after it
    kb = KernelBuilder()
    a, b = kb.input(T(2, 4, dtype=F16)), kb.input(T(4, 2, dtype=F16))
    kb.output(kb.apply(Op.MUL_SCALAR, kb.matmul(a, b), scalar=1e-3))
    (y,) = evaluate(kb.build(), [np.full((2, 4), 200, np.float16), np.full((4, 2), 100, np.float16)])
    assert np.isposinf(y).all(), y


@pytest.mark.parametrize("also_elementwise", [False, True])
def test_a_half_matmul_operand_rounds_unless_fused_further(rng, also_elementwise: bool):
    """An elementwise value that a matmul reads is written out in its half type (as XLA writes
    a dot's operand, and tensor cores take it), also where a reduction reads it too; read by
    another elementwise op it stays in float32 (XLA's fusion)."""
    x = rng.standard_normal((3, 16)).astype(BF16.numpy)
    w = rng.standard_normal((16, 5)).astype(BF16.numpy)
    kb = KernelBuilder()
    xi, wi = kb.input(T(3, 16, dtype=BF16)), kb.input(T(16, 5, dtype=BF16))
    e = kb.apply(Op.EXP, kb.apply(Op.MUL_SCALAR, xi, scalar=0.3))
    kb.output(kb.matmul(e, wi))
    kb.output(kb.apply(Op.REDUCE_SUM, e, dim=1))
    if also_elementwise:
        kb.output(kb.apply(Op.ADD_SCALAR, e, scalar=1.0))
    y, total = evaluate(kb.build(), [x, w])[:2]
    e32 = np.exp(x.astype(np.float32) * np.float32(0.3))
    operand = e32 if also_elementwise else e32.astype(BF16.numpy).astype(np.float32)
    np.testing.assert_array_equal(y, (operand @ w.astype(np.float32)).astype(BF16.numpy))
    np.testing.assert_array_equal(total, operand.sum(axis=1, keepdims=True).astype(BF16.numpy))


def test_input_errors_name_the_cause():
    g = unary_graph(Op.EXP, (2, 3))
    with pytest.raises(GraphError, match=r"takes 1 input\(s\), got 2"):
        evaluate(g, [np.ones((2, 3)), np.ones((2, 3))])
    with pytest.raises(GraphError, match=r"input 0 has shape \(3, 2\) but the graph expects"):
        evaluate(g, [np.ones((3, 2))])
    with pytest.raises(MirageError, match="precision='fp8' is not supported"):
        evaluate(g, [np.ones((2, 3))], precision="fp8")


def test_evaluate_values_returns_every_value_and_reuses_known(rng):
    x = rng.standard_normal((3, 4))
    kb = KernelBuilder()
    a = kb.input(T(3, 4))
    e = kb.apply(Op.EXP, a)
    s = kb.apply(Op.REDUCE_SUM, e, dim=1)
    kb.output(s)
    g = kb.build()
    values = evaluate_values(g, [x])
    assert sorted(values) == [a.id, e.id, s.id]
    np.testing.assert_allclose(values[s.id], np.exp(x).sum(1, keepdims=True))
    # a known prefix value is taken as given, not recomputed
    again = evaluate_values(g, [x], known={e.id: np.ones((3, 4))})
    np.testing.assert_array_equal(again[s.id], np.full((3, 1), 4.0))


# ------------------------------------------------------------------------------ block graphs


def block_kernel(block, n_out=1):
    kb = KernelBuilder()
    ins = [kb.input(t) for t in block.arg_types]
    for y in kb.graph_def(block, *ins)[:n_out]:
        kb.output(y)
    return kb.build()


ROWS, COLS, GX, LOOP = 6, 15, 3, 5  # x[6,15]: 3 row blocks, 5 iterations of 3 columns


def acc_graph(op: Op, dim: int):
    bb = BlockBuilder((GX, 1, 1), LOOP, (T(ROWS, COLS),))
    x = bb.input_iter(0, (0, N, N), 1)  # tile [2, 3]
    y = bb.apply(op, x, dim=dim)
    bb.output_saver(y, (0, N, N))
    return block_kernel(bb.build())


def _chunks(x):  # [rows, iterations, tile cols]
    return x.reshape(ROWS, LOOP, COLS // LOOP)


ACC_CASES = [
    (Op.ACC_SUM, N, lambda x: _chunks(x).sum(1)),
    (Op.ACC_SUM, 1, lambda x: x.sum(1, keepdims=True)),
    (Op.ACC_MEAN, N, lambda x: _chunks(x).mean(1)),
    (Op.ACC_MEAN, 1, lambda x: x.mean(1, keepdims=True)),
    (Op.ACC_MAX, N, lambda x: _chunks(x).max(1)),
    (Op.ACC_MAX, 1, lambda x: x.max(1, keepdims=True)),
    (Op.ACC_RMS, N, lambda x: np.sqrt((_chunks(x) ** 2).mean(1))),
    (Op.ACC_RMS, 1, lambda x: np.sqrt((x**2).mean(1, keepdims=True))),
    (Op.ACC_SUM, 0, lambda x: _chunks(x).reshape(GX, ROWS // GX, LOOP, -1).sum((1, 2))),
]


@pytest.mark.parametrize("op, dim, ref", ACC_CASES, ids=[f"{c[0].value}-{c[1]}" for c in ACC_CASES])
def test_accumulators_over_the_for_loop(op, dim, ref, rng):
    x = rng.standard_normal((ROWS, COLS))
    (y,) = evaluate(acc_graph(op, dim), [x])
    want = ref(x)
    if dim == 0:  # tile rows reduced: one row per block
        want = want.reshape(GX, -1)
    np.testing.assert_allclose(y, want, rtol=1e-13)


def rescale_graph(m_cols: int):
    """acc_rescale_sum(x_t, m_t) with m either per element or per row of each tile."""
    bb = BlockBuilder((GX, 1, 1), LOOP, (T(ROWS, COLS), T(ROWS, m_cols * LOOP)))
    x = bb.input_iter(0, (0, N, N), 1)
    m = bb.input_iter(1, (0, N, N), 1)
    bb.output_saver(bb.apply(Op.ACC_RESCALE_SUM, x, m), (0, N, N))
    return block_kernel(bb.build())


@pytest.mark.parametrize("per_row", [False, True])
def test_acc_rescale_sum_is_sum_of_exp_rescaled_terms(per_row, rng):
    tile_cols = COLS // LOOP
    x = rng.standard_normal((ROWS, COLS))
    m_cols = 1 if per_row else tile_cols
    m = rng.standard_normal((ROWS, m_cols * LOOP)) * 4
    m[:, :m_cols] = -np.inf  # first iteration: the online max starts at -inf
    (y,) = evaluate(rescale_graph(m_cols), [x, m])
    xs, ms = _chunks(x), m.reshape(ROWS, LOOP, m_cols)
    big = ms.max(1, keepdims=True)
    want = (np.exp(ms - big) * xs).sum(1)
    assert np.isfinite(y).all()
    np.testing.assert_allclose(y, want, rtol=1e-12)


def test_multi_axis_grid_body_saver_and_replicated_operand(rng):
    """x[4,6,10]: grid x splits dim 2, grid y splits dim 0, loop over dim 1; w replicated.
    The body value is saved every iteration (fdim) with the grid axes mapped back."""
    bb = BlockBuilder((2, 2, 1), 3, (T(4, 6, 10), T(1, 2, 1)))
    x = bb.input_iter(0, (2, 0, N), 1)  # [2, 2, 5]
    w = bb.input_iter(1, (N, N, N))  # [1, 2, 1], the same for every block and iteration
    y = bb.apply(Op.MUL, bb.apply(Op.ADD_SCALAR, x, scalar=1.0), w)
    bb.output_saver(y, (2, 0, N), fdim=1)
    s = bb.apply(Op.ACC_SUM, x, dim=1)  # [2, 1, 5]
    bb.output_saver(s, (2, 0, N))
    g = block_kernel(bb.build(), 2)
    a, b = rng.standard_normal((4, 6, 10)), rng.standard_normal((1, 2, 1))
    y_out, s_out = evaluate(g, [a, b])
    np.testing.assert_allclose(y_out, (a + 1) * np.tile(b, (1, 3, 1)), rtol=1e-14)
    np.testing.assert_allclose(s_out, a.sum(1, keepdims=True), rtol=1e-13)


def test_concat_in_a_block_broadcasts_block_axes(rng):
    bb = BlockBuilder((2, 1, 1), 1, (T(4, 3), T(2, 3)))
    a = bb.input_iter(0, (0, N, N))  # differs per block
    b = bb.input_iter(1, (N, N, N))  # replicated
    bb.output_saver(bb.apply(Op.CONCAT, a, b, dim=0), (0, N, N))
    x, y = rng.standard_normal((4, 3)), rng.standard_normal((2, 3))
    (out,) = evaluate(block_kernel(bb.build()), [x, y])
    np.testing.assert_array_equal(out, np.concatenate([x[:2], y, x[2:], y]))


def test_thread_graph_is_its_ops_inlined(rng):
    tb = ThreadBuilder()
    u, v = tb.input(T(2, 5)), tb.input(T(2, 5))
    tb.output(tb.apply(Op.ADD, tb.apply(Op.MUL, tb.apply(Op.GELU, u), v), u))
    thread = tb.build()
    bb = BlockBuilder((3, 1, 1), 2, (T(6, 10), T(6, 10)))
    x, y = bb.input_iter(0, (0, N, N), 1), bb.input_iter(1, (0, N, N), 1)
    bb.output_saver(bb.apply(Op.THREAD, x, y, graph=thread), (0, N, N), fdim=1)
    a, b = rng.standard_normal((6, 10)), rng.standard_normal((6, 10))
    (out,) = evaluate(block_kernel(bb.build()), [a, b])
    np.testing.assert_allclose(out, GELU(a) * b + a, rtol=1e-13)
    # a thread graph also evaluates on its own, on its operands
    (alone,) = evaluate(thread, [a[:2, :5], b[:2, :5]])
    np.testing.assert_allclose(alone, out[:2, :5], rtol=1e-15)


def test_block_graph_evaluates_on_its_operands(rng):
    block = acc_graph(Op.ACC_SUM, 1).block_graphs[0]
    x = rng.standard_normal((ROWS, COLS))
    (y,) = evaluate(block, [x])
    np.testing.assert_allclose(y, x.sum(1, keepdims=True), rtol=1e-13)


# ------------------------------------------------------------------- fused graphs vs plain ones


def rms_ref(x, g, w, eps=1e-6):
    x = x.astype(np.float64)
    return (x / np.sqrt((x * x).mean(1, keepdims=True) + eps) * g) @ w


def gated_ref(x, w1, w2):
    a, b = x.astype(np.float64) @ w1, x.astype(np.float64) @ w2
    return a / (1 + np.exp(-a)) * b


def attn_ref(q, k, v):
    s = q.astype(np.float64) @ k
    p = np.exp(s - s.max(-1, keepdims=True))
    return (p / p.sum(-1, keepdims=True)) @ v


FUSED = {
    "rmsnorm": (lambda: G.rmsnorm_linear_plain(8, 64, 32),
                lambda v: G.rmsnorm_linear_fused(8, 64, 32, grid=(2, 2), loop=4, variant=v),
                rms_ref, ("acc_max", "omap", "imap")),
    "rmsnorm_acc_mean": (lambda: G.rmsnorm_linear_plain(6, 48, 20),
                         lambda v: G.rmsnorm_linear_fused(6, 48, 20, grid=(5, 3), loop=3,
                                                          use_acc_mean=True, variant=v),
                         rms_ref, ("acc_max",)),
    "gated_mlp": (lambda: G.gated_mlp_plain(8, 64, 32),
                  lambda v: G.gated_mlp_fused(8, 64, 32, grid=(2, 2), loop=4, variant=v),
                  gated_ref, ("acc_max", "swap", "omap")),
    "gated_mlp_thread": (lambda: G.gated_mlp_plain(6, 30, 12),
                         lambda v: G.gated_mlp_fused(6, 30, 12, grid=(3, 2), loop=5,
                                                     thread=True, variant=v),
                         gated_ref, ("swap",)),
    "attention": (lambda: G.attention_plain(2, 6, 8, 40),
                  lambda v: G.attention_fused(2, 6, 8, 40, row_blocks=3, loop=5, variant=v),
                  attn_ref, ("norescale", "acc_max")),
    "flash_decoding": (lambda: G.attention_plain(3, 2, 8, 48),
                       lambda v: G.flash_decoding_split(3, 2, 8, 48, splits=3, loop=4,
                                                        variant=v),
                       attn_ref, ("norescale",)),
}  # fmt: skip


def _inputs(graph, rng, scale=1.0):
    return [(rng.standard_normal(t.shape) * scale).astype(np.float32) for t in graph.input_types]


def error_scale_of(name: str, ins: list[np.ndarray]):
    """The per-element error scale of a fused graph's output (tests/tolerance.py): a gated
    product's is its factors' (x w1 and x w2), the others' the default one."""
    if not name.startswith("gated"):
        return None
    x, w1, w2 = (a.astype(np.float64) for a in ins)
    return product_scale(x @ w1, x @ w2)


@pytest.mark.parametrize("name", sorted(FUSED))
def test_fused_graph_equals_plain_graph_and_float64_reference(name, rng):
    plain_fn, fused_fn, ref, _ = FUSED[name]
    plain, fused = plain_fn(), fused_fn("ok")
    assert fused.input_types == plain.input_types
    assert fused.output_types == plain.output_types
    ins = _inputs(plain, rng, 2.0)  # scores of size ~10: the online max actually moves
    want = ref(*ins)
    (y_fused,) = evaluate(fused, ins)
    (y_plain,) = evaluate(plain, ins)
    (y_fused64,) = evaluate(fused, ins, precision="float64")
    # per element against the float64 reference (tests/tolerance.py)
    scale = error_scale_of(name, ins)
    assert_array_close(y_fused, want, dtype=np.float32, rtol=1e-5, scale=scale, what="fused")
    assert_array_close(y_plain, want, dtype=np.float32, rtol=1e-5, scale=scale, what="plain")
    assert_array_close(y_fused64, want, rtol=1e-12, scale=scale, what="fused in float64")
    assert ff_fingerprint(fused) == ff_fingerprint(plain)


@pytest.mark.parametrize("name, variant",
                         [(n, v) for n in sorted(FUSED) for v in FUSED[n][3]])  # fmt: skip
def test_wrong_variants_differ_in_float_and_fingerprint(name, variant, rng):
    plain_fn, fused_fn, ref, _ = FUSED[name]
    plain, wrong = plain_fn(), fused_fn(variant)
    assert wrong.output_types == plain.output_types  # it type-checks as a replacement
    ins = _inputs(plain, rng, 2.0)
    want = ref(*ins)
    (y,) = evaluate(wrong, ins)
    assert np.abs(y - want).max() > 1e-2 * np.abs(want).max()
    assert ff_fingerprint(wrong) != ff_fingerprint(plain)


def test_the_fused_graphs_match_jax(rng):
    x, g, w = _inputs(G.rmsnorm_linear_plain(8, 64, 32), rng)
    jy = (x * jax.lax.rsqrt(jnp.mean(x * x, -1, keepdims=True) + 1e-6) * g) @ w
    (y,) = evaluate(G.rmsnorm_linear_fused(8, 64, 32, grid=(2, 2), loop=4), [x, g, w])
    assert_array_close(y, np.asarray(jy), what="rmsnorm_linear")
    q, k, v = _inputs(G.attention_plain(2, 6, 8, 40), rng, 2.0)
    ja = jax.nn.softmax(q @ k, axis=-1) @ v
    (a,) = evaluate(G.attention_fused(2, 6, 8, 40, row_blocks=3, loop=5), [q, k, v])
    assert_array_close(a, np.asarray(ja), what="attention")


def test_benchmark_sized_block_graph_is_fast(rng):
    """X[16,4096] @ W[4096,6144] as grid 64 x forloop 64: one pass, well under a second."""
    g = G.rmsnorm_linear_fused(16, 4096, 6144, grid=(64, 1), loop=64)
    x, gain, w = _inputs(g, rng)
    evaluate(
        G.rmsnorm_linear_fused(16, 64, 64, grid=(2, 1), loop=2),
        [x[:, :64], gain[:, :64], w[:64, :64]],
    )  # warm
    start = time.perf_counter()
    (y,) = evaluate(g, [x, gain, w])
    elapsed = time.perf_counter() - start
    assert_array_close(y, rms_ref(x, gain, w), dtype=np.float32, rtol=sum_rtol(4096))
    assert elapsed < 3.0  # ~0.05 s here; generous for a loaded 2-core machine


def test_as_accurate_as_the_original_against_float64() -> None:
    """Two half-precision answers may differ from each other by more than the tolerance while
    each is as close to the float64 truth: accepted. Relative to each element's scale, a
    large element's rounding does not excuse a wrong small one (the planner's check)."""
    from mirage_jax.interpret.numerics import as_accurate_error, output_error

    rng = np.random.default_rng(0)
    truth = rng.standard_normal(512)
    own = truth + rng.choice([-1.0, 1.0], 512) * 0.1 * np.abs(truth)  # XLA: 10% off each way
    other = truth - (own - truth)  # as far off, the other way: 20% from XLA
    err, tol, _ = output_error(other, own, "bf16")
    assert err > tol
    for relative in (False, True):
        off, allowed = as_accurate_error(other, own, truth, "bf16", relative=relative)
        assert off <= allowed
    spread = np.concatenate([truth, [1e3, 1e-3]])
    xla = spread * (1 + 1e-7)
    small_zeroed = xla.copy()
    small_zeroed[-1] = 0.0
    off, allowed = as_accurate_error(small_zeroed, xla, spread, "f32", relative=True)
    assert off > allowed
