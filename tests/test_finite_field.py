"""The finite-field evaluator: the algebra it promises (exp homomorphism, exact constants,
inverses, a real max order, exact limb matmul), fingerprint determinism and sensitivity."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import graphs as G
import numpy as np
import pytest

from mirage_jax.errors import GraphError
from mirage_jax.interpret import (
    DEFAULT_FIELD,
    FFTensor,
    Field,
    ff_evaluate,
    ff_evaluate_values,
    ff_fingerprint,
    random_inputs,
)
from mirage_jax.interpret.finite_field import (
    _limb_plan,
    _matmul_mod,
    fingerprint_inputs,
)
from mirage_jax.ir import (
    BOOL,
    F32,
    BlockBuilder,
    KernelBuilder,
    Op,
    TensorType,
    parse,
    to_text,
)

F = DEFAULT_FIELD
N = -1


def T(*shape: int) -> TensorType:
    return TensorType(shape, F32)


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng()  # fresh field inputs every run: the identities are exact


def kernel(types, body):
    """A kernel graph over inputs of ``types`` whose outputs are ``body(kb, *inputs)``."""
    kb = KernelBuilder()
    ins = [kb.input(t) for t in types]
    outs = body(kb, *ins)
    for y in outs if isinstance(outs, tuple) else (outs,):
        kb.output(y)
    return kb.build()


def run(graph, rng, inputs=None):
    inputs = inputs if inputs is not None else random_inputs(graph.input_types, F, rng)
    return ff_evaluate(graph, inputs, F), inputs


def ap(kb, op, *xs, **attrs):
    return kb.apply(op, *xs, **attrs)


def same_p(a: FFTensor, b: FFTensor) -> None:
    assert a.shape == b.shape
    np.testing.assert_array_equal(a.a, b.a)


def test_default_field_is_a_valid_pair():
    assert F.p == 2 * F.q + 1 and F.p < 2**31
    assert pow(F.omega, F.q, F.p) == 1 and F.omega != 1  # order exactly q (q prime)
    with pytest.raises(GraphError, match="not a valid field pair"):
        Field(p=2147483579, q=1000003)  # q does not divide p - 1
    with pytest.raises(GraphError, match="not a valid field pair"):
        Field(p=2 * 1073741789 + 1, q=1073741789, omega=F.p - 1)  # -1 has order 2
    with pytest.raises(GraphError, match="not a valid field pair"):
        Field(p=31, q=15, omega=2)  # q not prime (2 has order 5, which divides 15)
    small = Field(p=167, q=83, omega=4)  # Mirage's pair
    assert small.const(0.25) == (42, 21)


def test_random_inputs_are_residues_of_the_right_shapes(rng):
    (x, y) = random_inputs([T(3, 4), T(5)], F, rng)
    assert x.shape == (3, 4) and y.shape == (5,)
    assert x.a.dtype == np.int64 and 0 <= x.a.min() and x.a.max() < F.p
    assert 0 <= x.b.min() and x.b.max() < F.q


def test_exp_is_a_homomorphism(rng):
    t = T(4, 33)
    g = kernel([t, t], lambda kb, x, y: (
        ap(kb, Op.EXP, ap(kb, Op.ADD, x, y)),
        ap(kb, Op.MUL, ap(kb, Op.EXP, x), ap(kb, Op.EXP, y)),
        ap(kb, Op.EXP, ap(kb, Op.NEG, x)),
        ap(kb, Op.RECIPROCAL, ap(kb, Op.EXP, x)),
    ))  # fmt: skip
    (s, prod, eneg, inv), _ = run(g, rng)
    same_p(s, prod)
    same_p(eneg, inv)
    assert s.b is None  # the q-part of an exp is not defined by the algebra
    assert len(np.unique(s.a)) > 100  # and not a constant


def test_online_softmax_rescaling_cancels_exactly(rng):
    """exp(s - m) * exp(m - M) == exp(s - M): the identity FlashAttention relies on."""
    t, r = T(3, 20), T(3, 1)
    g = kernel([t, r, r], lambda kb, s, m, big: (
        ap(kb, Op.MUL, ap(kb, Op.EXP, ap(kb, Op.SUB, s, m)), ap(kb, Op.EXP, ap(kb, Op.SUB, m, big))),
        ap(kb, Op.EXP, ap(kb, Op.SUB, s, big)),
    ))  # fmt: skip
    (lhs, rhs), _ = run(g, rng)
    same_p(lhs, rhs)


def test_reciprocal_is_the_modular_inverse_and_zero_maps_to_zero(rng):
    t = T(5, 7)
    g = kernel([t, t], lambda kb, x, y: (
        ap(kb, Op.MUL, x, ap(kb, Op.RECIPROCAL, x)),
        ap(kb, Op.MUL, ap(kb, Op.DIV, x, y), y),
    ))  # fmt: skip
    x, y = random_inputs(g.input_types, F, rng)
    x.a[0, :3] = 0
    x.b[0, :3] = 0
    (one, back), _ = run(g, rng, [x, y])
    want = np.ones((5, 7), np.int64)
    want[0, :3] = 0  # 0 * inverse(0) = 0 * 0
    np.testing.assert_array_equal(one.a, want)
    np.testing.assert_array_equal(one.b, want)
    np.testing.assert_array_equal(back.a, x.a)
    np.testing.assert_array_equal(back.b, x.b)


def test_float_constants_map_exactly(rng):
    t = T(3, 4096)
    g = kernel([t], lambda kb, x: (
        ap(kb, Op.MUL_SCALAR, ap(kb, Op.REDUCE_SUM, x, dim=1), scalar=1 / 4096),
        ap(kb, Op.REDUCE_MEAN, x, dim=1),
        ap(kb, Op.ADD_SCALAR, ap(kb, Op.ADD_SCALAR, x, scalar=0.375), scalar=0.625),
        ap(kb, Op.ADD_SCALAR, x, scalar=1.0),
        ap(kb, Op.MUL_SCALAR, x, scalar=3.0),
        ap(kb, Op.ADD, ap(kb, Op.ADD, x, x), x),
    ))  # fmt: skip
    (scaled, mean, twice, once, triple, summed), (x,) = run(g, rng)
    for a, b in ((scaled, mean), (twice, once), (triple, summed)):
        same_p(a, b)
        np.testing.assert_array_equal(a.b, b.b)
    np.testing.assert_array_equal(once.a, (x.a + 1) % F.p)
    assert F.const(0.5) == ((F.p + 1) // 2, (F.q + 1) // 2)
    inf = kernel([T(2)], lambda kb, x: ap(kb, Op.ADD_SCALAR, x, scalar=float("inf")))
    with pytest.raises(GraphError, match="the constant inf has no finite-field image"):
        ff_fingerprint(inf)


def test_max_of_tile_maxima_is_the_row_max_and_max_is_a_real_order(rng):
    bb = BlockBuilder((2, 1, 1), 8, (T(6, 64),))
    xt = bb.input_iter(0, (0, N, N), 1)
    bb.output_saver(bb.apply(Op.ACC_MAX, xt, dim=1), (0, N, N))
    fused = kernel([T(6, 64)], lambda kb, x: kb.graph_def(bb.build(), x)[0])
    plain = kernel([T(6, 64)], lambda kb, x: ap(kb, Op.REDUCE_MAX, x, dim=1))
    x = random_inputs([T(6, 64)], F, rng)
    (tiles,), _ = run(fused, rng, x)
    (row,), _ = run(plain, rng, x)
    same_p(tiles, row)
    np.testing.assert_array_equal(tiles.b, row.b)
    assert ff_fingerprint(fused) == ff_fingerprint(plain)

    t = T(50)
    g = kernel([t, t, t], lambda kb, a, b, c: (
        ap(kb, Op.MAX, ap(kb, Op.MAX, a, b), c), ap(kb, Op.MAX, a, ap(kb, Op.MAX, b, c)),
        ap(kb, Op.MAX, b, a), ap(kb, Op.MAX, a, b), ap(kb, Op.MAX, a, a),
        ap(kb, Op.RELU, a),
    ))  # fmt: skip
    (left, right, ba, ab, aa, relu), (a, _, _) = run(g, rng)
    same_p(left, right)
    same_p(ab, ba)
    same_p(aa, a)
    # relu keeps about half: zero is not the least element of the order
    kept = np.mean(relu.a == a.a)
    assert 0.2 < kept < 0.8
    np.testing.assert_array_equal(relu.a[relu.a != a.a], 0)


def test_acc_rescale_sum_is_its_definition(rng):
    loop = 6
    bb = BlockBuilder((1, 1, 1), loop, (T(4, loop), T(4, loop)))
    x, m = bb.input_iter(0, (N, N, N), 1), bb.input_iter(1, (N, N, N), 1)
    bb.output_saver(bb.apply(Op.ACC_RESCALE_SUM, x, m), (N, N, N))
    fused = kernel([T(4, loop)] * 2, lambda kb, x, m: kb.graph_def(bb.build(), x, m)[0])

    def definition(kb, x, m):  # sum_i exp(m_i - max m) * x_i
        big = ap(kb, Op.REDUCE_MAX, m, dim=1)
        return ap(
            kb, Op.REDUCE_SUM, ap(kb, Op.MUL, ap(kb, Op.EXP, ap(kb, Op.SUB, m, big)), x), dim=1
        )

    plain = kernel([T(4, loop)] * 2, definition)
    ins = random_inputs(fused.input_types, F, rng)
    same_p(run(fused, rng, ins)[0][0], run(plain, rng, ins)[0][0])


@pytest.mark.parametrize("acc, red", [(Op.ACC_MEAN, Op.REDUCE_MEAN), (Op.ACC_RMS, Op.REDUCE_RMS),
                                      (Op.ACC_SUM, Op.REDUCE_SUM)])  # fmt: skip
def test_loop_accumulators_equal_full_reductions(acc, red):
    shape = (6, 45)  # 3 iterations of 15: the 1/(R*n) of the mean is 1/45, not a float
    bb = BlockBuilder((3, 1, 1), 3, (T(*shape),))
    xt = bb.input_iter(0, (0, N, N), 1)
    bb.output_saver(bb.apply(acc, xt, dim=1), (0, N, N))
    fused = kernel([T(*shape)], lambda kb, x: kb.graph_def(bb.build(), x)[0])
    plain = kernel([T(*shape)], lambda kb, x: ap(kb, red, x, dim=1))
    assert ff_fingerprint(fused) == ff_fingerprint(plain)
    other = kernel([T(*shape)], lambda kb, x: ap(kb, Op.REDUCE_MAX, x, dim=1))
    assert ff_fingerprint(other) != ff_fingerprint(plain)


def test_composite_ops_follow_their_definitions(rng):
    def pairs(kb, x):
        def u(op, v, **attrs):
            return kb.apply(op, v, **attrs)

        two_x = u(Op.MUL_SCALAR, x, scalar=2.0)
        return (
            # tanh(x) = 2 * sigmoid(2x) - 1 needs exp(2x) * exp(-2x) = 1 to hold exactly
            u(Op.TANH, x),
            u(Op.ADD_SCALAR, u(Op.MUL_SCALAR, u(Op.SIGMOID, two_x), scalar=2.0), scalar=-1.0),
            u(Op.SILU, x), ap(kb, Op.MUL, x, u(Op.SIGMOID, x)),
            u(Op.RSQRT, x), u(Op.RECIPROCAL, u(Op.SQRT, x)),
            u(Op.POW_SCALAR, x, exponent=3.0), ap(kb, Op.MUL, u(Op.SQUARE, x), x),
            u(Op.POW_SCALAR, x, exponent=-1.0), u(Op.RECIPROCAL, x),
            u(Op.POW_SCALAR, x, exponent=0.5), u(Op.SQRT, x),
            u(Op.POW_SCALAR, x, exponent=-0.5), u(Op.RSQRT, x),
            u(Op.POW_SCALAR, x, exponent=0.0),
            u(Op.ADD_SCALAR, u(Op.MUL_SCALAR, x, scalar=0.0), scalar=1.0),
            u(Op.REDUCE_RMS, x, dim=0), u(Op.SQRT, u(Op.REDUCE_MEAN, u(Op.SQUARE, x), dim=0)),
        )  # fmt: skip

    outs, _ = run(kernel([T(40)], pairs), rng)
    for i in range(0, len(outs), 2):
        same_p(outs[i], outs[i + 1])
    assert np.all(outs[14].a == 1)  # x^0 = 1
    assert not np.array_equal(outs[10].a, outs[8].a)  # sqrt is not the reciprocal


def test_slices_of_a_concat_are_its_parts_and_commute_with_elementwise_ops(rng):
    def pairs(kb, x, y):
        cat = ap(kb, Op.CONCAT, x, y, dim=1)
        return (
            ap(kb, Op.SLICE, cat, dim=1, start=0, size=5), x,
            ap(kb, Op.SLICE, cat, dim=1, start=5, size=3), y,
            ap(kb, Op.SLICE, ap(kb, Op.EXP, cat), dim=1, start=4, size=2),
            ap(kb, Op.EXP, ap(kb, Op.SLICE, cat, dim=1, start=4, size=2)),
        )  # fmt: skip

    outs, _ = run(kernel([T(6, 5), T(6, 3)], pairs), rng)
    for i in range(0, len(outs), 2):
        same_p(outs[i], outs[i + 1])


def test_masks_are_zero_one_and_where_splits_a_value_exactly(rng):
    def pairs(kb, m, x):
        kept = ap(kb, Op.WHERE, m, x, fill=0.0)
        dropped = ap(kb, Op.WHERE_NOT, m, x, fill=0.0)
        return (
            ap(kb, Op.ADD, kept, dropped), ap(kb, Op.ADD, x, ap(kb, Op.MUL_SCALAR, x, scalar=0.0)),
            ap(kb, Op.WHERE, m, x, fill=-np.inf), ap(kb, Op.WHERE, m, x, fill=-np.inf),
            ap(kb, Op.WHERE, m, x, fill=-np.inf), ap(kb, Op.WHERE, m, x, fill=-1e9),
        )  # fmt: skip

    g = kernel([TensorType((1, 16), BOOL), T(6, 16)], pairs)
    outs, ins = run(g, rng)
    assert set(np.unique(ins[0].a)) <= {0, 1} and set(np.unique(ins[0].b)) <= {0, 1}
    same_p(outs[0], outs[1])
    same_p(outs[2], outs[3])  # a non-finite fill is one fixed element per seed
    assert not np.array_equal(outs[4].a, outs[5].a)  # and not a finite one's image


def test_gelu_is_its_tanh_formula(rng):
    c = float(np.sqrt(2.0 / np.pi))

    def both(kb, x):
        cube = kb.apply(Op.POW_SCALAR, x, exponent=3.0)
        inner = ap(kb, Op.ADD, x, ap(kb, Op.MUL_SCALAR, cube, scalar=0.044715))
        t = ap(kb, Op.TANH, ap(kb, Op.MUL_SCALAR, inner, scalar=c))
        half_x = ap(kb, Op.MUL_SCALAR, x, scalar=0.5)
        return ap(kb, Op.GELU, x), ap(kb, Op.MUL, half_x, ap(kb, Op.ADD_SCALAR, t, scalar=1.0))

    (a, b), _ = run(kernel([T(30)], both), rng)
    same_p(a, b)


def test_uninterpreted_functions_are_fixed_per_op_and_seed(rng):
    t = T(64)
    g = kernel([t], lambda kb, x: (ap(kb, Op.SQRT, x), ap(kb, Op.LOG, x), ap(kb, Op.ERF, x),
                                   ap(kb, Op.ERFC, x), ap(kb, Op.SIN, x), ap(kb, Op.COS, x),
                                   ap(kb, Op.SIGN, x), ap(kb, Op.ERF_INV, x),
                                   ap(kb, Op.POW_SCALAR, x, exponent=1.5),
                                   ap(kb, Op.FINITE_OR, x, fill=0.0),
                                   ap(kb, Op.FINITE_OR, x, fill=1.0)))  # fmt: skip
    x = random_inputs([t], F, rng)
    first = ff_evaluate(g, x, F)
    again = ff_evaluate(g, x, F)
    reseeded = ff_evaluate(g, x, Field(seed=7))
    for a, b, c in zip(first, again, reseeded):
        same_p(a, b)
        assert a.b is not None and 0 <= a.b.min() and a.b.max() < F.q
        assert not np.array_equal(a.a, c.a)
    for i in range(len(first)):  # distinct functions per op (finite_or: per fill)
        for j in range(i):
            assert not np.array_equal(first[i].a, first[j].a)


def test_rem_is_exact_algebra_around_an_uninterpreted_trunc(rng):
    """rem(2x, 2y) = 2 rem(x, y) holds in the field as in floats (the quotients are equal);
    rem(x, y) differs from rem(y, x) and from x."""
    t = T(64)

    def body(kb, x, y):
        two = lambda v: ap(kb, Op.MUL_SCALAR, v, scalar=2.0)  # noqa: E731
        r = ap(kb, Op.REM, x, y)
        return two(r), ap(kb, Op.REM, two(x), two(y)), ap(kb, Op.REM, y, x), r

    (scaled, of_scaled, swapped, r), x = run(kernel([t, t], body), rng)
    same_p(scaled, of_scaled)
    assert not np.array_equal(r.a, swapped.a)
    assert not np.array_equal(r.a, x[0].a)


@pytest.mark.parametrize("m, k, n", [(3, 5, 4), (7, 64, 5), (4, 100, 9), (2, 5000, 3)])
def test_limb_matmul_is_exact(m, k, n, rng):
    for mod in (F.p, F.q):
        x = rng.integers(mod - 1000, mod, (2, m, k))  # the largest residues stress the bounds
        y = rng.integers(0, mod, (2, k, n))
        want = np.array([(xi.astype(object) @ yi.astype(object)) % mod for xi, yi in zip(x, y)])
        got = _matmul_mod(x, y, mod)
        np.testing.assert_array_equal(got, want.astype(np.int64))
        np.testing.assert_array_equal(_matmul_mod(y.swapaxes(1, 2), x.swapaxes(1, 2), mod),
                                      want.swapaxes(1, 2).astype(np.int64))  # fmt: skip
    assert {_limb_plan(k)[0] for k in (5, 64, 100, 5000)} == {2, 3}
    assert _limb_plan(5000)[2] < 5000  # the last case runs several exact chunks


def test_values_of_every_kernel_value_and_known_reuse(rng):
    g = G.rmsnorm_linear_plain(4, 16, 8)
    ins = random_inputs(g.input_types, F, rng)
    values = ff_evaluate_values(g, ins, F)
    assert set(values) == set(range(len(g.types)))
    (out,) = ff_evaluate(g, ins, F)
    same_p(values[g.outputs[0].ins[0]], out)
    partial = {v: values[v] for v in range(len(g.types) - 1)}
    again = ff_evaluate_values(g, ins, F, known=partial)
    same_p(again[len(g.types) - 1], out)


def test_inputs_are_checked():
    g = G.gated_mlp_plain(4, 8, 4)
    with pytest.raises(GraphError, match="not an FFTensor"):
        ff_evaluate(g, [np.zeros((4, 8))] * 3)
    ins = random_inputs(g.input_types, F)
    with pytest.raises(GraphError, match=r"input 1 has shape \(4, 8\)"):
        ff_evaluate(g, [ins[0], ins[0], ins[2]])


def test_fingerprint_is_deterministic_and_input_types_fix_the_inputs():
    g = G.attention_fused(2, 4, 8, 16, row_blocks=2, loop=4)
    fp = ff_fingerprint(g)
    assert fp == ff_fingerprint(g)
    assert fp == ff_fingerprint(parse(to_text(g)))
    assert fp != ff_fingerprint(g, seed=1)
    assert fp != ff_fingerprint(g, trials=2)
    a = fingerprint_inputs(g.input_types, F, 0, 1)
    b = fingerprint_inputs(G.attention_plain(2, 4, 8, 16).input_types, F, 0, 1)
    assert all(x.equals(y) for x, y in zip(a, b))
    # and across processes (python salts str hashes per process; the fingerprint must not care)
    code = (
        "import sys; sys.path.insert(0, 'tests'); import graphs as G; "
        "from mirage_jax.interpret import ff_fingerprint; "
        "print(ff_fingerprint(G.attention_fused(2, 4, 8, 16, row_blocks=2, loop=4)))"
    )
    root = Path(__file__).parent.parent
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=root,
                         check=True)  # fmt: skip
    assert out.stdout.strip() == fp


def test_fingerprint_separates_near_misses():
    t = T(4, 6)

    def fp(body):
        return ff_fingerprint(kernel([t, t], body))

    prints = {
        fp(lambda kb, x, y: ap(kb, Op.ADD, x, y)),
        fp(lambda kb, x, y: ap(kb, Op.MUL, x, y)),
        fp(lambda kb, x, y: ap(kb, Op.SUB, x, y)),
        fp(lambda kb, x, y: ap(kb, Op.SUB, y, x)),
        fp(lambda kb, x, y: ap(kb, Op.RELU, x)),
        fp(lambda kb, x, y: ap(kb, Op.MUL_SCALAR, x, scalar=1.0)),
        fp(lambda kb, x, y: ap(kb, Op.EXP, x)),
        fp(lambda kb, x, y: ap(kb, Op.MUL_SCALAR, ap(kb, Op.EXP, x), scalar=1.0000001)),
    }
    assert len(prints) == 8
    assert fp(lambda kb, x, y: ap(kb, Op.ADD, x, y)) == fp(lambda kb, x, y: ap(kb, Op.ADD, y, x))
