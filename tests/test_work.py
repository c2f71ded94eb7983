"""backend.work: the bytes, flops, iterations and working sets of hand-built μGraphs, against
counts worked out by hand."""

from __future__ import annotations

from types import SimpleNamespace

import graphs as G

from mirage_jax.backend.work import (
    block_work,
    contiguous_run,
    kernel_costs,
    op_work,
    totals,
)
from mirage_jax.ir import Op, Phase

F = 4  # bytes of a float32


def test_rmsnorm_linear_fused_loads_writes_and_computes_what_a_hand_count_says():
    # x[16,4096], g[1,4096], w[4096,6144]; 2 blocks over w's columns, 64 iterations over h
    (block,) = G.rmsnorm_linear_fused(16, 4096, 6144, grid=(2, 1), loop=64).block_graphs
    work = block_work(block)
    assert (work.grid, work.blocks, work.iterations) == ((2, 1, 1), 2, 64)
    x, g, w = work.reads
    assert [r.arg for r in work.reads] == [0, 1, 2]
    assert (x.tile.shape, g.tile.shape, w.tile.shape) == ((16, 64), (1, 64), (64, 3072))
    assert all(r.loads == 64 and r.used_in_loop for r in work.reads)
    # every block reads all of x and g: the second block's pass is a re-read
    assert (x.total, x.unique, x.rereads) == (16 * 64 * F * 64 * 2, 16 * 4096 * F, 16 * 4096 * F)
    assert (g.total, g.unique, g.rereads) == (64 * F * 64 * 2, 4096 * F, 4096 * F)
    # the blocks split w: one pass over it
    assert (w.total, w.unique, w.rereads) == (4096 * 6144 * F, 4096 * 6144 * F, 0.0)
    assert work.reads_by_input() == {0: x.total, 1: g.total, 2: w.total}
    # runs: 64 floats of each row of x and g, 3072 of each row of w
    assert (x.run_bytes, g.run_bytes, w.run_bytes) == (64 * F, 64 * F, 3072 * F)
    assert work.written == 16 * 6144 * F

    ops = [n.op for n in work.nodes]
    assert ops == [Op.MUL, Op.MATMUL, Op.ACC_SUM, Op.SQUARE, Op.ACC_SUM, Op.MUL_SCALAR,
                   Op.ADD_SCALAR, Op.RSQRT, Op.MUL]  # fmt: skip
    mul, mm, acc, sq, ms = work.nodes[:5]
    assert (mm.matmul.m, mm.matmul.k, mm.matmul.n) == (16, 64, 3072)
    assert mm.matmul.flops == 2 * 16 * 64 * 3072
    # over all blocks and iterations: the whole product, 2 m h n
    assert mm.matmul.flops * work.iterations * work.blocks == 2 * 16 * 4096 * 6144
    assert (mul.phase, mm.phase, sq.phase) == (Phase.BODY,) * 3
    assert (acc.phase, ms.phase) == (Phase.EPILOGUE,) * 2
    # x_t * g_t broadcasts g's row; acc_sum[dim=1] folds the squares' [16,64] into [16,1]
    assert (mul.in_elems, mul.out_elems, mul.element_ops) == (16 * 64, 16 * 64, (Op.MUL,))
    assert (ms.in_elems, ms.out_elems, ms.out_bytes) == (16 * 64, 16, 16 * F)
    assert mm.element_ops == ()
    # the loop runs 3 input iterators, mul, matmul, square and both accumulators
    assert len(work.loop_ops) == 8
    acc_tiles = 16 * 3072 + 16
    assert work.accumulator_bytes == acc_tiles * F
    tiles = (16 * 64 + 64 + 64 * 3072  # x_t, g_t, w_t
             + 16 * 64 + 16 * 3072 + 16 * 3072 + 16 * 64  # mul, matmul, acc, square
             + 16 * 4  # acc_sum[dim=1], * 1/h, + eps, rsqrt
             + 16 * 3072)  # the product saved
    assert work.working_set == tiles * F
    assert not work.has_f64


def test_a_thread_graph_applies_its_elementwise_ops_to_every_output_element():
    (block,) = G.gated_mlp_fused(8, 256, 128, grid=(4, 1), loop=4, thread=True).block_graphs
    work = block_work(block)
    (thread,) = [n for n in work.nodes if n.op is Op.THREAD]
    assert thread.element_ops == (Op.SILU, Op.MUL)
    assert thread.out_elems == 8 * 32 and thread.phase is Phase.EPILOGUE
    # x is replicated to the 4 column blocks; w1 and w2 are split among them
    x, w1, w2 = work.reads
    assert x.rereads == 3 * 8 * 256 * F and w1.rereads == w2.rereads == 0.0
    mms = [n.matmul for n in work.nodes if n.matmul is not None]
    assert [(m.m, m.k, m.n) for m in mms] == [(8, 64, 32)] * 2


def test_online_softmax_runs_its_rescaling_accumulator_every_iteration():
    (block,) = G.attention_fused(2, 8, 16, 64, row_blocks=2, loop=4).block_graphs
    work = block_work(block)
    assert Op.ACC_RESCALE_SUM in work.loop_ops
    assert work.loop_ops.count(Op.INPUT_ITER) == 2  # k and v stream; q is loop-invariant
    (q,) = [r for r in work.reads if r.loads == 1]
    assert q.arg == 0 and q.used_in_loop and q.total == q.unique == 2 * 8 * 16 * F


def test_kernel_level_ops_read_their_operands_and_write_their_results_once():
    graph = G.rmsnorm_linear_plain(16, 4096, 6144)
    works = [op_work(graph, n) for n in graph.nodes
             if n.op not in (Op.INPUT, Op.OUTPUT, Op.RESHAPE)]  # fmt: skip
    mm = works[-1]
    assert mm.op is Op.MATMUL
    assert (mm.matmul.m, mm.matmul.k, mm.matmul.n) == (16, 4096, 6144)
    assert mm.matmul.flops == 2 * 16 * 4096 * 6144
    assert mm.bytes == (16 * 4096 + 4096 * 6144 + 16 * 6144) * F
    (scale,) = [w for w in works if w.op is Op.MUL and w.ins[1].shape == (16, 1)]
    assert scale.bytes == (2 * 16 * 4096 + 16) * F
    assert (scale.largest, scale.in_elems, scale.matmul) == (16 * 4096, 16 * 4096 + 16, None)


def test_kernel_costs_prices_every_kernel_in_order_and_totals_sum_them():
    graph = G.flash_decoding_split(2, 8, 16, 64, splits=2, loop=2)

    def block(b, what):
        return SimpleNamespace(what=what, time_s=1.0, bytes=block_work(b).written, flops=0.0)

    def op(w):
        return SimpleNamespace(what=w.op.value, time_s=0.5, bytes=w.bytes, flops=1.0)

    kernels = kernel_costs(graph, block, op)
    launched = [n for n in graph.nodes if n.op not in (Op.INPUT, Op.OUTPUT, Op.RESHAPE)]
    assert [k.what for k in kernels] == [
        "graph_def #0" if n.op is Op.GRAPH_DEF else n.op.value for n in launched]
    n_ops = sum(n.op is not Op.GRAPH_DEF for n in launched)
    assert totals(kernels) == (len(kernels) - 0.5 * n_ops, sum(k.bytes for k in kernels), n_ops)


def test_a_run_is_a_tile_row_merged_across_whole_rows():
    assert contiguous_run((4, 8), (4, 8), 4) == 4 * 8 * 4  # the whole tensor
    assert contiguous_run((2, 8), (4, 8), 4) == 2 * 8 * 4  # whole rows: one run
    assert contiguous_run((4, 2), (4, 8), 2) == 2 * 2  # a column strip
    assert contiguous_run((1, 2, 8), (3, 4, 8), 4) == 2 * 8 * 4
