"""Hand-built μGraphs shared by tests: plain kernel graphs and their Mirage-style fused forms.

Every builder takes shapes (and loop/grid sizes) and returns a ``KernelGraph``. Each fused
builder also has deliberately wrong ``variant``s that still type-check with the same input
and output types, so tests can show that the float check and the finite-field fingerprint
both reject them (the ``omap`` / ``imap`` variants keep the output type only on a square
grid, gx == gy):

- rmsnorm_linear: ``"acc_max"`` (matmul accumulated by max), ``"omap"`` (row/column blocks
  swapped on save), ``"imap"`` (x's rows partitioned by the column grid axis).
- gated_mlp: ``"acc_max"``, ``"swap"`` (silu applied to the wrong matmul), ``"omap"``.
- attention: ``"norescale"`` (acc_sum instead of acc_rescale_sum), ``"acc_max"``.
- flash_decoding_split (two kernels): ``"norescale"`` (the combine drops the rescale).
"""

from __future__ import annotations

import math

from mirage_jax.ir import (
    BOOL,
    F32,
    BlockBuilder,
    DType,
    KernelBuilder,
    KernelGraph,
    Op,
    TensorType,
)
from mirage_jax.ir.ops import NONE_DIM

N = NONE_DIM


def T(*shape: int, dtype: DType = F32) -> TensorType:
    return TensorType(tuple(shape), dtype)


def _check_variant(variant: str, allowed: tuple[str, ...]) -> None:
    if variant not in ("ok",) + allowed:
        raise ValueError(f"unknown variant {variant!r}; expected one of ok, {', '.join(allowed)}")


# ----------------------------------------------------------------------------- RMSNorm + matmul


def rmsnorm_linear_plain(
    m: int, h: int, n: int, eps: float = 1e-6, dtype: DType = F32
) -> KernelGraph:
    """y = (x * rsqrt(mean(x*x, -1) + eps) * g) @ w with x[m,h], g[1,h], w[h,n]."""
    kb = KernelBuilder()
    x, g, w = (
        kb.input(T(m, h, dtype=dtype)),
        kb.input(T(1, h, dtype=dtype)),
        kb.input(T(h, n, dtype=dtype)),
    )
    ms = kb.apply(Op.REDUCE_MEAN, kb.apply(Op.MUL, x, x), dim=1)
    r = kb.apply(Op.RSQRT, kb.apply(Op.ADD_SCALAR, ms, scalar=eps))
    xn = kb.apply(Op.MUL, kb.apply(Op.MUL, x, r), g)
    kb.output(kb.matmul(xn, w))
    return kb.build()


def rmsnorm_linear_fused(
    m: int, h: int, n: int, *, grid: tuple[int, int] = (2, 1), loop: int = 4,
    eps: float = 1e-6, use_acc_mean: bool = False, variant: str = "ok", dtype: DType = F32,
) -> KernelGraph:  # fmt: skip
    """One graph_def: grid x over w's columns, grid y over x's rows, for-loop over h.

    Body: ``x_t * g_t @ w_t -> acc_sum``; ``square(x_t) -> acc_sum[dim=1]`` (or acc_mean);
    epilogue: ``* (1/h) -> + eps -> rsqrt -> * acc``; saved with omap (x->1, y->0)."""
    _check_variant(variant, ("acc_max", "omap", "imap"))
    gx, gy = grid
    args = (T(m, h, dtype=dtype), T(1, h, dtype=dtype), T(h, n, dtype=dtype))
    bb = BlockBuilder((gx, gy, 1), loop, args)
    x_imap = (0, N, N) if variant == "imap" else (N, 0, N)
    x_t = bb.input_iter(0, x_imap, 1)
    g_t = bb.input_iter(1, (N, N, N), 1)
    w_t = bb.input_iter(2, (1, N, N), 0)
    mm = bb.matmul(bb.apply(Op.MUL, x_t, g_t), w_t)
    acc = bb.apply(Op.ACC_MAX if variant == "acc_max" else Op.ACC_SUM, mm)
    sq = bb.apply(Op.SQUARE, x_t)
    if use_acc_mean:
        ms = bb.apply(Op.ACC_MEAN, sq, dim=1)
    else:
        ms = bb.apply(Op.MUL_SCALAR, bb.apply(Op.ACC_SUM, sq, dim=1), scalar=1.0 / h)
    r = bb.apply(Op.RSQRT, bb.apply(Op.ADD_SCALAR, ms, scalar=eps))
    omap = (0, 1, N) if variant == "omap" else (1, 0, N)
    bb.output_saver(bb.apply(Op.MUL, acc, r), omap)
    return _wrap(bb.build())


def _wrap(block, n_out: int = 1) -> KernelGraph:
    kb = KernelBuilder()
    ins = [kb.input(t) for t in block.arg_types]
    for y in kb.graph_def(block, *ins)[:n_out]:
        kb.output(y)
    return kb.build()


# ------------------------------------------------------------------------------------ gated MLP


def gated_mlp_plain(m: int, k: int, n: int, dtype: DType = F32) -> KernelGraph:
    """silu(x @ w1) * (x @ w2) with x[m,k], w1, w2[k,n]."""
    kb = KernelBuilder()
    x, w1, w2 = (
        kb.input(T(m, k, dtype=dtype)),
        kb.input(T(k, n, dtype=dtype)),
        kb.input(T(k, n, dtype=dtype)),
    )
    a = kb.apply(Op.SILU, kb.matmul(x, w1))
    kb.output(kb.apply(Op.MUL, a, kb.matmul(x, w2)))
    return kb.build()


def gated_mlp_fused(
    m: int, k: int, n: int, *, grid: tuple[int, int] = (2, 1), loop: int = 4,
    thread: bool = False, variant: str = "ok", dtype: DType = F32,
) -> KernelGraph:  # fmt: skip
    """Both matmuls in one block graph: grid over (columns, rows), for-loop over k, two
    acc_sums, epilogue silu(a1) * a2 (as a fused thread graph when ``thread``)."""
    from mirage_jax.ir import ThreadBuilder

    _check_variant(variant, ("acc_max", "swap", "omap"))
    gx, gy = grid
    args = (T(m, k, dtype=dtype), T(k, n, dtype=dtype), T(k, n, dtype=dtype))
    bb = BlockBuilder((gx, gy, 1), loop, args)
    x_t = bb.input_iter(0, (N, 0, N), 1)
    w1_t = bb.input_iter(1, (1, N, N), 0)
    w2_t = bb.input_iter(2, (1, N, N), 0)
    acc_op = Op.ACC_MAX if variant == "acc_max" else Op.ACC_SUM
    a1 = bb.apply(acc_op, bb.matmul(x_t, w1_t))
    a2 = bb.apply(Op.ACC_SUM, bb.matmul(x_t, w2_t))
    if variant == "swap":
        a1, a2 = a2, a1
    if thread:
        tb = ThreadBuilder()
        u, v = tb.input(a1.type), tb.input(a2.type)
        tb.output(tb.apply(Op.MUL, tb.apply(Op.SILU, u), v))
        y = bb.apply(Op.THREAD, a1, a2, graph=tb.build())
    else:
        y = bb.apply(Op.MUL, bb.apply(Op.SILU, a1), a2)
    bb.output_saver(y, (0, 1, N) if variant == "omap" else (1, 0, N))
    return _wrap(bb.build())


# ------------------------------------------------------------------------------------ attention


def attention_plain(b: int, m: int, d: int, n: int, dtype: DType = F32) -> KernelGraph:
    """softmax(q @ k, -1) @ v with q[b,m,d], k[b,d,n], v[b,n,d]."""
    kb = KernelBuilder()
    q, k, v = (kb.input(T(b, m, d, dtype=dtype)), kb.input(T(b, d, n, dtype=dtype)),
               kb.input(T(b, n, d, dtype=dtype)))  # fmt: skip
    s = kb.matmul(q, k)
    e = kb.apply(Op.EXP, kb.apply(Op.SUB, s, kb.apply(Op.REDUCE_MAX, s, dim=2)))
    p = kb.apply(Op.DIV, e, kb.apply(Op.REDUCE_SUM, e, dim=2))
    kb.output(kb.matmul(p, v))
    return kb.build()


def masked_attention_plain(b: int, m: int, d: int, n: int, fill: float = -math.inf
                           ) -> KernelGraph:  # fmt: skip
    """softmax(where(mask, q @ k, fill), -1) @ v with a bool mask[1, m, n] (rows may be fully
    masked: with fill -inf they are NaN, as jax.nn.softmax gives)."""
    kb = KernelBuilder()
    q, k, v = kb.input(T(b, m, d)), kb.input(T(b, d, n)), kb.input(T(b, n, d))
    mask = kb.input(T(1, m, n, dtype=BOOL))
    s = kb.apply(Op.WHERE, mask, kb.matmul(q, k), fill=fill)
    e = kb.apply(Op.EXP, kb.apply(Op.SUB, s, kb.apply(Op.REDUCE_MAX, s, dim=2)))
    p = kb.apply(Op.DIV, e, kb.apply(Op.REDUCE_SUM, e, dim=2))
    kb.output(kb.matmul(p, v))
    return kb.build()


def masked_attention_fused(b: int, m: int, d: int, n: int, *, loop: int = 4,
                           fill: float = -1e9) -> KernelGraph:  # fmt: skip
    """FlashAttention with the mask's tile loaded per loop step and applied to the scores
    (where) before the online softmax."""
    args = (T(b, m, d), T(b, d, n), T(b, n, d), T(1, m, n, dtype=BOOL))
    bb = BlockBuilder((b, 1, 1), loop, args)
    q_t = bb.input_iter(0, (0, N, N))
    k_t = bb.input_iter(1, (0, N, N), 2)
    v_t = bb.input_iter(2, (0, N, N), 1)
    mask_t = bb.input_iter(3, (N, N, N), 2)
    o, den_t, mx = _online_softmax_body(bb, q_t, k_t, v_t, mask=(mask_t, fill))
    num, den = bb.apply(Op.ACC_RESCALE_SUM, o, mx), bb.apply(Op.ACC_RESCALE_SUM, den_t, mx)
    bb.output_saver(bb.apply(Op.DIV, num, den), (0, N, N))
    return _wrap(bb.build())


def _online_softmax_body(bb: BlockBuilder, q_t, k_t, v_t, mask=None):
    """s = q@k (masked: where(mask, s, fill)), m = rowmax(s), p = exp(s - m): per-chunk
    o = p@v and l = rowsum(p)."""
    s = bb.matmul(q_t, k_t)
    if mask is not None:
        s = bb.apply(Op.WHERE, mask[0], s, fill=mask[1])
    last = s.type.rank - 1
    mx = bb.apply(Op.REDUCE_MAX, s, dim=last)
    p = bb.apply(Op.EXP, bb.apply(Op.SUB, s, mx))
    return bb.matmul(p, v_t), bb.apply(Op.REDUCE_SUM, p, dim=last), mx


def attention_fused(
    b: int, m: int, d: int, n: int, *, row_blocks: int = 1, loop: int = 4,
    variant: str = "ok", dtype: DType = F32,
) -> KernelGraph:  # fmt: skip
    """FlashAttention: grid over (batch, row blocks), for-loop over n with the online-softmax
    accumulators; epilogue acc_rescale_sum(o, m) / acc_rescale_sum(l, m)."""
    _check_variant(variant, ("norescale", "acc_max"))
    args = (T(b, m, d, dtype=dtype), T(b, d, n, dtype=dtype), T(b, n, d, dtype=dtype))
    bb = BlockBuilder((b, row_blocks, 1), loop, args)
    q_t = bb.input_iter(0, (0, 1, N))
    k_t = bb.input_iter(1, (0, N, N), 2)
    v_t = bb.input_iter(2, (0, N, N), 1)
    o, den_t, mx = _online_softmax_body(bb, q_t, k_t, v_t)
    if variant == "norescale":
        num, den = bb.apply(Op.ACC_SUM, o), bb.apply(Op.ACC_SUM, den_t)
    elif variant == "acc_max":
        num, den = bb.apply(Op.ACC_MAX, o), bb.apply(Op.ACC_RESCALE_SUM, den_t, mx)
    else:
        num, den = bb.apply(Op.ACC_RESCALE_SUM, o, mx), bb.apply(Op.ACC_RESCALE_SUM, den_t, mx)
    bb.output_saver(bb.apply(Op.DIV, num, den), (0, 1, N))
    return _wrap(bb.build())


def flash_decoding_split(
    b: int, m: int, d: int, n: int, *, splits: int = 2, loop: int = 2,
    variant: str = "ok", dtype: DType = F32,
) -> KernelGraph:  # fmt: skip
    """FlashDecoding in two kernels. The IR does not let one dim be both grid-partitioned and
    loop-split, so the kernel graph first gives the splits their own dim: q[b,1,m,d],
    k[b,splits,d,n/splits], v[b,splits,n/splits,d]. Kernel 1 (a graph_def, grid (batch,
    split), loop over each split) saves per-split o[b,splits,m,d], l and mx[b,splits,m,1];
    kernel 2 (plain ops) rescales each split by exp(mx - max mx) and combines."""
    _check_variant(variant, ("norescale",))
    kb = KernelBuilder()
    q, k, v = (kb.input(T(b, m, d, dtype=dtype)), kb.input(T(b, d, n, dtype=dtype)),
               kb.input(T(b, n, d, dtype=dtype)))  # fmt: skip
    c = n // splits
    q4 = kb.apply(Op.RESHAPE, q, shape=(b, 1, m, d))
    k4 = kb.apply(Op.TRANSPOSE, kb.apply(Op.RESHAPE, k, shape=(b, d, splits, c)),
                  perm=(0, 2, 1, 3))  # fmt: skip
    v4 = kb.apply(Op.RESHAPE, v, shape=(b, splits, c, d))

    bb = BlockBuilder((b, splits, 1), loop, (q4.type, k4.type, v4.type))
    q_t = bb.input_iter(0, (0, N, N))
    k_t = bb.input_iter(1, (0, 1, N), 3)
    v_t = bb.input_iter(2, (0, 1, N), 2)
    o, den_t, mx = _online_softmax_body(bb, q_t, k_t, v_t)
    o, den_t, mx = (
        bb.apply(Op.ACC_RESCALE_SUM, o, mx), bb.apply(Op.ACC_RESCALE_SUM, den_t, mx),
        bb.apply(Op.ACC_MAX, mx))  # fmt: skip
    for value in (o, den_t, mx):
        bb.output_saver(value, (0, 1, N))
    o4, l4, m4 = kb.graph_def(bb.build(), q4, k4, v4)

    if variant == "norescale":
        num, den = o4, l4
    else:
        w = kb.apply(Op.EXP, kb.apply(Op.SUB, m4, kb.apply(Op.REDUCE_MAX, m4, dim=1)))
        num, den = kb.apply(Op.MUL, o4, w), kb.apply(Op.MUL, l4, w)
    num, den = kb.apply(Op.REDUCE_SUM, num, dim=1), kb.apply(Op.REDUCE_SUM, den, dim=1)
    out = kb.apply(Op.DIV, num, den)
    kb.output(kb.apply(Op.RESHAPE, out, shape=(b, m, d)))
    return kb.build()


def aliasing_graph() -> tuple[KernelGraph, set[int]]:
    """Outputs that alias an input, another output or a reshape, planned by the storage plan
    both backends share (``mirage_jax.backend.emit``); also which outputs must be copied.
    test_codegen_cpu.py and test_codegen_cuda.py check it on each backend."""
    kb = KernelBuilder()
    x = kb.input(T(4, 6))
    e = kb.apply(Op.EXP, x)
    flat = kb.apply(Op.RESHAPE, e, shape=(24,))
    kb.output(kb.apply(Op.RESHAPE, flat, shape=(6, 4)))  # 0: exp writes output 0 in place
    kb.output(e)  # 1: its root already fills output 0: copied
    kb.output(x)  # 2: an input: copied
    kb.output(kb.apply(Op.RESHAPE, x, shape=(2, 12)))  # 3: a reshaped input: copied
    t = kb.apply(Op.TANH, x)
    kb.output(t)  # 4: in place
    kb.output(t)  # 5: the same value again: copied
    kb.output(kb.apply(Op.MUL, t, t))  # 6: reads t back from output 4
    bb = BlockBuilder((2, 1, 1), 1, (T(4, 6),))
    bb.output_saver(bb.apply(Op.NEG, bb.input_iter(0, (0, NONE_DIM, NONE_DIM))), (0, NONE_DIM, NONE_DIM))
    (b,) = kb.graph_def(bb.build(), x)
    kb.output(kb.apply(Op.RESHAPE, b, shape=(24,)))  # 7: the block writes output 7 in place
    kb.output(b)  # 8: copied
    return kb.build(), {1, 2, 3, 5, 8}
