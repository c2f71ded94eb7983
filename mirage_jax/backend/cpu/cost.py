"""An analytic CPU cost model for μGraphs compiled by the C++ backend.

``estimate(graph, model)`` predicts the run time of a kernel graph on a multi-core CPU, to
order verified candidates before the best few are compiled and timed for real. The CPU
mapping (DESIGN.md §2): a kernel is one parallel region, a grid block is one task of the
intra-op thread pool working on cache-resident tiles, the for-loop streams over a reduction
dimension with accumulators in L1/L2, and a thread graph is one fused SIMD loop. What each
kernel loads, stores and computes comes from ``backend.work``; this module prices it.

Per graph-defined kernel:

- bytes from memory: every operand tile a block reads (loop-varying tiles once per iteration,
  loop-invariant tiles that a matmul in the loop reads in place also once per iteration unless
  they stay in L2), summed over the blocks, i.e. replicated operands are re-read by every
  block; a re-read of an operand that fits in the shared last-level cache costs
  ``llc_reread`` of a memory read;
  outputs are written once. Streams of short rows (a tile narrower than ``strip_ref_bytes``
  of its tensor's rows) lose bandwidth to the hardware prefetchers, which stop at page
  boundaries and follow a limited number of streams: a power of the run length, calibrated
  per host (on the Zen 4, strips of long rows cost nothing more: a one-block split loop
  reading whole rows measured 0.9x of a 2-block grid's 12 KiB strips for the rmsnorm_linear
  bs=1 shape; on the Ice Lake Xeon, 4 KiB strips stream 1.25-1.4x slower than 12 KiB ones
  and the 1 KiB strips of a kernel-level matmul 1.7-1.9x);
- tile copies: the emitter reads matmul operands in place but copies every other operand tile
  into a local buffer, a load and a store per element on the core;
- flops: tile matmuls at the measured rate of the register block the runtime picks for
  their M (``matmul.h``: all rows of a skinny product in one panel), plus a miss per row
  where B is a narrow strip of a wide tensor read in place (``_strided_rows``, calibrated),
  elementwise ops and reductions at the vector rate (transcendentals and divides cost
  ``OpInfo.element_flops`` element operations), accumulator updates, all times the iterations;
- working set: the live tiles of one block (operand tiles, intermediates, accumulators); past
  L2, copies and intermediates go to memory and back, past L1 intermediates stream through L2;
- parallelism: a grid with fewer blocks than cores whose loop only folds mergeable
  accumulators runs its loop split over the idle cores (``backend.cpu.emit.splits_loop``); blocks
  (or parts) are spread over the cores in waves; the last wave may leave cores idle
  (``imbalance``), and every block and every iteration pays a small scheduling overhead.

time = launch + max(memory time, compute time / efficiency) + (1 - overlap) * the shorter of the
two + spill time + overheads, where ``overlap`` is the share of the shorter that a core hides
under the longer (calibrated; an Ice Lake Xeon hides little of it). Kernel-level
(pre-defined) ops are simple streaming kernels over whole tensors. The search uses the rates
``calibrate.host_model()`` measured on the host it runs on; the defaults here are one such
machine (2 cores of an AMD EPYC Zen 5, ~40 GB/s of streaming reads, AVX-512 with two FMA
pipes: the runtime's micro-kernel reaches ~230 GFLOP/s per core in cache, L1 48 KiB, L2 1 MiB
per core, L3 32 MiB), which ``estimate`` uses when given no model. The model orders
candidates; the timing step decides. ``benchmarks/search_table.py`` reports how well the
model's order matches measurements (rank correlation).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from mirage_jax.backend.cpu.emit import reads_in_place, splits_loop
from mirage_jax.backend.work import (
    BlockWork,
    NodeWork,
    OpWork,
    TileRead,
    block_work,
    contiguous_run,
    kernel_costs,
    totals,
    working_set,
)
from mirage_jax.ir.graph import BlockGraph, KernelGraph, Node, Phase
from mirage_jax.ir.ops import Op


@dataclass(frozen=True)
class CpuModel:
    """The ceilings of one CPU (defaults: the 2-core AMD EPYC this project runs on)."""

    cores: int = 2
    mem_bytes_per_s: float = 40e9  # all cores together
    core_mem_bytes_per_s: float = 30e9  # what one core alone pulls
    l2_bytes_per_s: float = 60e9  # per core
    l1_bytes: int = 48 * 1024
    l2_bytes: int = 1024 * 1024
    llc_bytes: int = 32 * 1024 * 1024
    llc_reread: float = 0.3  # a re-read of an LLC-resident operand, relative to memory
    page_bytes: int = 4096
    # flop/s of one core on tile products in cache with 1, 2, 4 and 8 rows per register block
    matmul_rates: tuple[float, float, float, float] = (57e9, 115e9, 165e9, 230e9)
    l2_stream_bytes_per_cycle: float = 32.0  # B panels re-read from L2 by the micro-kernel
    simd_lanes: int = 16  # float32 lanes of one vector register
    acc_regs: int = 24  # vector registers the matmul micro-kernel keeps accumulators in
    # elementwise element-ops per core per second: a multiply of rows in L1 runs at 53e9;
    # tiles in L2 and the loop overhead of short rows take that to about 30e9
    vector_elems: float = 30e9
    launch_s: float = 3e-6  # one parallel region
    block_s: float = 0.4e-6  # scheduling one block
    iteration_s: float = 0.03e-6  # one for-loop iteration of one block
    # a matmul reading B in place as a strip of short rows, each on its own page: seconds per
    # row for the first row panel of C and for each further one (``_strided_rows``)
    strided_row_s: float = 7e-9
    strided_revisit_s: float = 1e-9
    # a loop-varying tile read in runs (contiguous bytes per row) shorter than strip_ref_bytes
    # streams at (run / strip_ref_bytes) ** strip_exponent of the bandwidth (calibrated: ~0.25
    # on an Ice Lake Xeon, whose 1 KiB strips of a weight stream ~1.8x slower than 12 KiB ones)
    strip_ref_bytes: int = 4096
    strip_exponent: float = 0.1
    # the share of the shorter of a kernel's memory and compute times hidden under the longer,
    # calibrated from a streamed product whose two are alike. The default 1 is the Zen hosts'
    # (their software prefetch was measured keeping misses under the FMAs; this probe has not
    # run there). On an Ice Lake Xeon the product took about the sum (probed 0-0.5), and
    # re-ranking the same timed candidates of 10 suite searches with 0 instead of 1 took the
    # model's rank correlation from -0.06 to +0.29 and its first pick from 1.25x to 1.08x of
    # the fastest (geomean; rmsnorm_linear bs=8: 2.04x to 1.00x)
    overlap: float = 1.0


DEFAULT_MODEL = CpuModel()


@dataclass(frozen=True)
class KernelCost:
    """The estimate for one kernel: a graph_def or a pre-defined op."""

    what: str
    time_s: float
    bytes: float
    flops: float
    blocks: int = 1
    working_set: int = 0
    imbalance: float = 0.0  # fraction of core time idle in the last wave


@dataclass(frozen=True)
class CpuCost:
    """The estimate for a kernel graph: the sum over its kernels."""

    time_s: float
    bytes: float
    flops: float
    kernels: tuple[KernelCost, ...]

    def __str__(self) -> str:
        parts = ", ".join(
            f"{k.what}: {k.time_s * 1e6:.1f}us ({k.blocks} blocks, ws {k.working_set // 1024}KiB)"
            for k in self.kernels
        )  # fmt: skip
        return f"{self.time_s * 1e6:.1f}us [{parts}]"


def estimate(graph: KernelGraph, model: CpuModel | None = None) -> CpuCost:
    """Predicted time of ``graph`` on ``model`` (default: ``DEFAULT_MODEL``; the search passes
    this host's measured rates, ``calibrate.host_model()``)."""
    m = DEFAULT_MODEL if model is None else model
    kernels = kernel_costs(graph, lambda block, what: block_cost(block, m, what),
                           lambda op: _op_cost(op, m))  # fmt: skip
    return CpuCost(*totals(kernels), kernels)


def _elem_cost(op: Op, size: int) -> float:
    """Element-ops of one elementwise/reduction op over ``size`` elements: ``OpInfo.element_flops``
    per element (the table in ``ir.ops`` says how they were measured)."""
    return size * op.info.element_flops


def _matmul_rate(m: int, n: int, model: CpuModel) -> float:
    """Flops per second of one core on an [m, k] @ [k, n] tile product.

    Mirrors the runtime's register blocking (``Blocking`` in matmul.h): mr rows by nv vectors
    of accumulators. The rate of a full-width block of mr rows is measured (``matmul_rates``
    at 1, 2, 4, 8 rows, interpolated between). A product too narrow for the full nv runs
    shorter k steps: each issues mr * nv FMAs (two per cycle) against nv vector loads of B
    from L2 (about ``l2_stream_bytes_per_cycle``) and cannot be shorter than one FMA latency;
    that ratio scales the measured rate. Ragged edges run partly empty panels.
    """
    lanes, regs = model.simd_lanes, model.acc_regs
    mr = _register_rows(m, n, model)
    vecs = math.ceil(n / lanes)
    full = max(1, min(regs // mr, 8))
    nv = min(vecs, full)
    rows = m / (math.ceil(m / mr) * mr)
    cols = n / (vecs * lanes)
    narrow = _step_efficiency(mr, nv, model) / _step_efficiency(mr, full, model)
    return _block_rate(mr, model) * narrow * rows * cols


def _register_rows(m: int, n: int, model: CpuModel) -> int:
    """Rows of C per register block (``Blocking::pick_mr`` in matmul.h): 8 x 3 for m a multiple
    of 8 unless the default 6 x 4 tiles n exactly and 8 x 3's column tail is a larger share of
    n than 6 x 4's row tail is of m."""
    if m <= 8 and 2 * m <= model.acc_regs:
        return m
    if m % 8 == 0 and model.acc_regs >= 24:
        lanes = model.simd_lanes
        tail = n % (3 * lanes)
        default_fits = n % (4 * lanes) == 0 and tail != 0 and tail * m > (m % 6) * n
        if not default_fits:
            return 8
    return 6


def _step_efficiency(mr: int, nv: int, model: CpuModel) -> float:
    """FMA-pipe share of one micro-kernel k step with mr x nv accumulators."""
    fma_cycles = mr * nv / 2
    load_cycles = nv * model.simd_lanes * 4 / model.l2_stream_bytes_per_cycle  # float32 B
    return fma_cycles / max(fma_cycles, load_cycles, 4)


def _block_rate(mr: int, model: CpuModel) -> float:
    """Measured rate of a full-width register block of mr rows (linear between 1, 2, 4, 8)."""
    return float(np.interp(mr, (1, 2, 4, 8), model.matmul_rates))


def _stream_efficiency(tile: tuple[int, ...], full: tuple[int, ...], itemsize: int,
                       model: CpuModel) -> float:  # fmt: skip
    """Share of the memory bandwidth a loop-varying tile read achieves: its contiguous runs
    (the tile's rows, merged where the tile spans whole rows) against ``strip_ref_bytes``."""
    run = contiguous_run(tile, full, itemsize)
    return min(1.0, run / model.strip_ref_bytes) ** model.strip_exponent


def _op_cost(op: OpWork, model: CpuModel) -> KernelCost:
    nbytes = op.bytes
    memory = nbytes / model.mem_bytes_per_s
    if op.matmul is not None:
        b = op.ins[1]
        flops = op.matmul.flops
        compute = flops / (model.cores * _matmul_rate(op.matmul.m, op.matmul.n, model))
        # k::matmul's tasks read B in strips of GemmCfg::NB columns (matmul.h)
        nb = 4 * (4 if model.simd_lanes >= 16 else 2) * model.simd_lanes
        strip = (*b.shape[:-1], min(op.matmul.n, nb))
        eff = _stream_efficiency(strip, b.shape, b.dtype.itemsize, model)
        memory += b.nbytes * (1.0 / eff - 1.0) / model.mem_bytes_per_s
    else:
        flops = _elem_cost(op.op, op.largest)
        compute = flops / (model.cores * model.vector_elems)
    t = model.launch_s + combined(memory, compute, model)
    return KernelCost(op.op.value, t, nbytes, flops)


def fused_time(nbytes: float, matmul_flops: float, element_ops: float, model: CpuModel
               ) -> float:  # fmt: skip
    """Seconds of one parallel kernel moving ``nbytes`` and doing the given work on all cores
    at the model's best rates (full register blocks, vectors in cache): a fused region's floor.
    """
    memory = nbytes / model.mem_bytes_per_s
    per_core = matmul_flops / model.matmul_rates[-1] + element_ops / model.vector_elems
    compute = per_core / model.cores
    return model.launch_s + combined(memory, compute, model)


def combined(memory: float, compute: float, model: CpuModel) -> float:
    """Seconds of a kernel that needs ``memory`` seconds of reads and ``compute`` seconds of
    core work: the longer, plus the part of the shorter the host does not hide under it."""
    return max(memory, compute) + (1.0 - model.overlap) * min(memory, compute)


def _node_flops(block: BlockGraph, node: NodeWork, model: CpuModel) -> tuple[float, float]:
    """(flops, seconds on one core) of one block node on its tiles, for one execution:
    elementwise ops count one flop per element of their largest operand (a thread graph's,
    of its output) and cost ``OpInfo.element_flops`` element operations each."""
    if node.matmul is not None:
        mm = node.matmul
        return mm.flops, mm.flops / _matmul_rate(mm.m, mm.n, model) + _strided_rows(
            block, node.node, model)  # fmt: skip
    if node.op is Op.THREAD:
        size = node.out_elems
        work = sum(_elem_cost(op, size) for op in node.element_ops)
        return float(len(node.element_ops) * size), work / model.vector_elems
    if node.element_ops:
        work = _elem_cost(node.op, node.in_elems)
        return float(node.in_elems), work / model.vector_elems
    return 0.0, 0.0


# B rows shorter than this, one per page, miss in every cache level on every visit: the
# adjacent-line prefetch covers a row of a few lines, the stride prefetcher stops at pages,
# and rows a multiple of 4 KiB apart share a handful of cache sets (measured on the Zen 4:
# 16- and 32-column strips of a 4096-wide weight 2-4x slower than contiguous; 128 columns
# and more, or K <= 512 rows, at the in-cache rate)
_STRIP_ROW_BYTES = 512


def _strided_rows(block: BlockGraph, node: Node, model: CpuModel) -> float:
    """Seconds a tile matmul waits on B beyond its FMAs when B is a narrow strip read in
    place from a tensor whose rows lie a page or more apart: a miss per row in the first
    row panel of C (``strided_row_s``) and a cheaper one in every further panel."""
    b = node.ins[1]
    src = block.producer(b)
    if src.op is not Op.INPUT_ITER or not reads_in_place(block, b):
        return 0.0
    tile, full = block.types[b], block.arg_types[src.attr("arg")]
    itemsize = tile.dtype.itemsize
    row_bytes, stride = tile.shape[-1] * itemsize, full.shape[-1] * itemsize
    k = tile.shape[-2]
    if row_bytes >= _STRIP_ROW_BYTES or stride < model.page_bytes or k <= 512:
        return 0.0
    m = block.types[node.ins[0]].shape[-2]
    panels = math.ceil(m / _register_rows(m, tile.shape[-1], model))
    batch = tile.size // (k * tile.shape[-1])
    return batch * k * (model.strided_row_s + (panels - 1) * model.strided_revisit_s)


def block_cost(block: BlockGraph, model: CpuModel = DEFAULT_MODEL, what: str = "graph_def"
               ) -> KernelCost:  # fmt: skip
    """The estimate for one graph-defined kernel (see the module docstring)."""
    work = block_work(block)
    R, blocks = work.iterations, work.blocks
    # fewer blocks than cores: the runtime splits a loop of mergeable accumulators over the
    # idle cores (mj::for_each_block_split), else the idle cores stay idle
    parts = min(R, model.cores // blocks) if blocks < model.cores and splits_loop(block) else 1
    tasks = blocks * parts
    # cores without a task do not pull memory either
    bandwidth = min(model.mem_bytes_per_s, min(tasks, model.cores) * model.core_mem_bytes_per_s)
    read, copied, stream_time = _tile_reads(work, tasks, bandwidth, model)
    written = float(work.written)
    flops = seconds = 0.0
    inter = 0.0  # bytes of intermediates produced per block (all iterations)
    for node in work.nodes:
        # accumulator updates (EPILOGUE) are charged once per block, not per iteration as
        # the GPU model does: kept so that the estimates, and the ranking, stay as calibrated
        times = R if node.phase is Phase.BODY else 1
        f, s = _node_flops(block, node, model)
        flops += f * times * blocks
        seconds += s * times * blocks
        inter += node.out_bytes * times
    ws = work.working_set
    extra_memory = 0.0
    if ws > model.l2_bytes:  # tile copies and intermediates go out to memory and back
        extra_memory = 2.0 * (copied + inter * blocks)
        spill = extra_memory / model.mem_bytes_per_s
    elif ws > model.l1_bytes:  # intermediates stream through L2
        spill = inter * blocks / (model.l2_bytes_per_s * model.cores)
    else:
        spill = 0.0
    waves = math.ceil(tasks / model.cores)
    efficiency = tasks / (waves * model.cores)
    seconds += copied / model.l2_bytes_per_s  # a load and a store per copied element
    if parts > 1:  # merging the parts' accumulators, in L2
        seconds += 2.0 * work.accumulator_bytes * blocks * (parts - 1) / model.l2_bytes_per_s
    compute = seconds / model.cores / efficiency
    memory = stream_time + written / bandwidth
    overhead = (blocks * model.block_s + blocks * R * model.iteration_s) / model.cores
    # spills stall the cores whether the kernel is bound by memory or by compute
    t = model.launch_s + combined(memory, compute, model) + spill + overhead
    return KernelCost(what, t, read + written + extra_memory, flops, blocks, ws, 1.0 - efficiency)


def _tile_reads(work: BlockWork, tasks: int, bandwidth: float, model: CpuModel
                ) -> tuple[float, float, float]:  # fmt: skip
    """(bytes from memory, bytes copied into local tiles, seconds of memory time) of the
    kernel's tile reads: re-reads of an LLC-resident tensor cost ``llc_reread``, short runs
    stream slower, and the emitter copies every tile it does not read in place."""
    read = copied = 0.0
    stream_time = 0.0
    for r in work.reads:
        total = r.total
        in_place = reads_in_place(work.block, r.value)
        if not in_place:
            copied += total
        factor = model.llc_reread if r.unique <= model.llc_bytes else 1.0
        nbytes = min(total, r.unique) + r.rereads * factor
        if in_place and r.loads == 1:
            nbytes += _invariant_rereads(work, r, tasks, model)
        read += nbytes
        eff = _stream_efficiency(r.tile.shape, r.tensor.shape, r.tile.dtype.itemsize, model)
        stream_time += nbytes / (bandwidth * eff)
    return read, copied, stream_time


def _invariant_rereads(work: BlockWork, tile: TileRead, tasks: int, model: CpuModel) -> float:
    """Bytes from memory of the iterations after the first reading a loop-invariant tile
    that matmuls in the loop body read in place: the matmul streams it from the tensor every
    iteration, so a tile past L2 comes from the LLC again or, past that, from memory
    (rmsnorm_linear bs=1 looping over x's 2 rows against a 48 MiB weight strip measured 1.8x
    of the one-iteration grid that the model had tied with it)."""
    R = work.iterations
    tile_bytes = tile.tile.nbytes
    if R == 1 or not tile.used_in_loop or tile_bytes <= model.l2_bytes // 2:
        return 0.0
    live = tile_bytes * min(tasks, model.cores)  # what the cores' tiles hold of the LLC
    factor = model.llc_reread if live <= model.llc_bytes // 2 else 1.0
    return float(tile_bytes) * (R - 1) * work.blocks * factor


__all__ = ["DEFAULT_MODEL", "CpuCost", "CpuModel", "KernelCost", "block_cost", "combined",
           "estimate", "working_set"]  # fmt: skip
