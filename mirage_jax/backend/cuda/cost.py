"""An analytic GPU cost model for μGraphs compiled by the CUDA backend.

``estimate(graph, spec)`` predicts the run time of a kernel graph on an H100/H200-class GPU
and rejects candidates the hardware cannot run, with the reason. It reads each block graph's
``plan_block`` - the exact shared-memory layout, thread count and register accumulators the
CUDA emitter will use - so the model and the generated code agree on what a block needs, and
prices the work (``backend.work``) of the block graph that plan runs.

Per block graph (one kernel launch):

- feasibility: shared memory per block <= 227 KiB, registers per thread <= 255 and per block
  <= 65536 (registers = a base for addressing and loop state + 1.5x the accumulator registers
  of the plan, fitted to ptxas), grid y/z <= 65535;
- occupancy: resident blocks per SM from threads, registers and shared memory (228 KiB/SM);
- bytes: every input tile read (loop-varying tiles once per iteration) by every block; a
  tensor that fits in L2 is fetched from HBM once and its re-reads cost a tenth; outputs once;
- flops: block matmuls at the tensor-core rate (f16/bf16 operands) or the FMA rate, other
  ops at the FMA rate (``OpInfo.transcendental`` ops count 8);
- time = launch + max(memory time, compute time, per-iteration latency), where memory and
  compute rates scale down when the grid leaves SMs idle (HBM needs about half the SMs
  streaming to saturate) and the latency term charges each wave of blocks its barriers and
  one memory round trip per iteration (halved when loads are double-buffered).

Kernel-level ops are memory-bound simple kernels (the matmul runs at half the FMA peak).
The numbers are ceilings, not measurements: use the model to order candidates and reject the
impossible ones, then time the best few for real.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from mirage_jax.backend.cuda.emit import BlockPlan, plan_block
from mirage_jax.backend.work import BlockWork, OpWork, block_work, kernel_costs, totals
from mirage_jax.ir.graph import BlockGraph, KernelGraph, Phase
from mirage_jax.ir.ops import ACCUMULATORS, BINARY, ELEMENTWISE, REDUCTIONS, UNARY, Op
from mirage_jax.ir.types import DType

# Registers per thread = base + factor x accumulator registers (+ mma fragments): fitted to
# ptxas -v (nvcc 13, sm_90a) on the generated fused kernels of the benchmark shapes, where
# ptxas used 47..159 registers; the fit is within about 15% except for attention in f32.
_BASE_REGISTERS = 50
_ACC_REGISTER_FACTOR = 1.5
_MMA_FRAGMENT_REGISTERS = 6  # A and B fragments of one mma.sync step


@dataclass(frozen=True)
class GpuSpec:
    """The ceilings of one GPU. Defaults: an H200 (H100 SXM with HBM3e)."""

    name: str = "H200"
    sms: int = 132
    hbm_bytes_per_s: float = 4.8e12
    l2_bytes: int = 50 * 2**20
    tensor_flops: float = 990e12  # dense f16/bf16 with f32 accumulate
    f32_flops: float = 60e12  # FMA, non-tensor
    f64_flops: float = 30e12
    smem_per_sm: int = 228 * 1024
    smem_per_block: int = 227 * 1024
    smem_reserved_per_block: int = 1024  # the driver reserves 1 KiB per resident block
    regs_per_sm: int = 65536
    regs_per_block: int = 65536
    max_regs_per_thread: int = 255
    max_threads_per_sm: int = 2048
    max_blocks_per_sm: int = 32
    launch_s: float = 2.5e-6
    barrier_s: float = 30e-9
    memory_latency_s: float = 0.7e-6


H200 = GpuSpec()
H100 = GpuSpec(name="H100-SXM", hbm_bytes_per_s=3.35e12)
A100 = GpuSpec(name="A100-SXM", sms=108, hbm_bytes_per_s=2.0e12, l2_bytes=40 * 2**20,
               tensor_flops=312e12, f32_flops=19.5e12, f64_flops=9.7e12,
               smem_per_sm=164 * 1024, smem_per_block=163 * 1024)  # fmt: skip


@dataclass(frozen=True)
class KernelCost:
    """The estimate for one launch: a block graph or a kernel-level op."""

    what: str  # "graph_def #k" or the op name
    time_s: float
    bytes: float  # HBM traffic
    flops: float
    blocks: int = 0
    threads: int = 0
    smem_bytes: int = 0
    registers: int = 0  # per thread
    blocks_per_sm: int = 0
    reason: str | None = None  # why it cannot run; None when feasible

    @property
    def feasible(self) -> bool:
        return self.reason is None


@dataclass(frozen=True)
class GpuCost:
    """The estimate for a kernel graph: the sum over its launches, or why it cannot run."""

    time_s: float
    bytes: float
    flops: float
    kernels: tuple[KernelCost, ...]
    reason: str | None = None

    @property
    def feasible(self) -> bool:
        return self.reason is None


def estimate(graph: KernelGraph, spec: GpuSpec = H200) -> GpuCost:
    """Predicted time of ``graph`` on ``spec``; infeasible graphs get ``time_s = inf``."""
    kernels = kernel_costs(graph, lambda block, what: block_cost(block, spec, what),
                           lambda op: _op_cost(op, spec))  # fmt: skip
    time, nbytes, flops = totals(kernels)
    bad = [kc for kc in kernels if not kc.feasible]
    reason = "; ".join(f"{kc.what}: {kc.reason}" for kc in bad) or None
    return GpuCost(math.inf if bad else time, nbytes, flops, kernels, reason)


def reject_reason(block: BlockGraph, spec: GpuSpec = H200) -> str | None:
    """Why ``block`` cannot run as one CUDA kernel on ``spec``, or None if it can."""
    return block_cost(block, spec).reason


def registers_per_thread(plan: BlockPlan) -> int:
    tc = any(m.tensor_cores for m in plan.matmuls.values())
    acc = math.ceil(_ACC_REGISTER_FACTOR * plan.acc_registers)
    return _BASE_REGISTERS + acc + (_MMA_FRAGMENT_REGISTERS if tc else 0)


def block_cost(block: BlockGraph, spec: GpuSpec = H200, what: str = "graph_def") -> KernelCost:
    plan = plan_block(block)
    work = block_work(plan.graph)  # the graph the emitter runs: elementwise chains fused
    nt, smem = plan.threads, plan.smem_bytes
    regs = registers_per_thread(plan)
    blocks = work.blocks
    reason = _infeasible(work.grid, nt, smem, regs, spec)
    if reason is not None:
        return KernelCost(what, math.inf, 0.0, 0.0, blocks, nt, smem, regs, 0, reason)
    per_sm = _blocks_per_sm(nt, smem, regs, spec)
    nbytes = _block_bytes(work, spec)
    tc_flops, fma_flops = _block_flops(work, plan)
    sm_used = min(blocks, spec.sms)
    bw = spec.hbm_bytes_per_s * min(1.0, sm_used / (0.5 * spec.sms))
    waves = math.ceil(blocks / (spec.sms * per_sm))
    fill = blocks / (waves * spec.sms * per_sm)
    fma_rate = spec.f64_flops if work.has_f64 else spec.f32_flops
    compute = (tc_flops / spec.tensor_flops + fma_flops / fma_rate) / max(fill, 1 / spec.sms)
    barriers = _barriers_per_iteration(work)
    hide = 0.5 if plan.double_buffered else 1.0
    latency = waves * work.iterations * (barriers * spec.barrier_s
                                         + hide * spec.memory_latency_s)  # fmt: skip
    time = spec.launch_s + max(nbytes / bw, compute, latency)
    return KernelCost(what, time, nbytes, tc_flops + fma_flops, blocks, nt, smem, regs, per_sm)


def _infeasible(grid: tuple[int, int, int], nt: int, smem: int, regs: int, spec: GpuSpec
                ) -> str | None:  # fmt: skip
    if smem > spec.smem_per_block:
        return (f"needs {smem / 1024:.1f} KiB of shared memory per block; {spec.name} allows "
                f"{spec.smem_per_block // 1024} KiB (use a larger grid or forloop range)")
    if regs > spec.max_regs_per_thread:
        return (f"needs about {regs} registers per thread; the limit is "
                f"{spec.max_regs_per_thread} (smaller output tiles per block)")
    if regs * nt > spec.regs_per_block:
        return (f"needs about {regs * nt} registers per block ({nt} threads x {regs}); the "
                f"limit is {spec.regs_per_block}")
    if grid[1] > 65535 or grid[2] > 65535:
        return f"grid {grid} exceeds 65535 blocks on y or z"
    return None


def _blocks_per_sm(nt: int, smem: int, regs: int, spec: GpuSpec) -> int:
    limits = [spec.max_blocks_per_sm, spec.max_threads_per_sm // nt,
              spec.regs_per_sm // max(1, regs * nt)]  # fmt: skip
    if smem:
        limits.append(spec.smem_per_sm // (smem + spec.smem_reserved_per_block))
    return max(1, min(limits))


def _block_bytes(work: BlockWork, spec: GpuSpec) -> float:
    """HBM bytes: each input once, its re-reads at a tenth while it fits in L2; outputs once."""
    total = 0.0
    for arg, read in work.reads_by_input().items():
        unique = work.block.arg_types[arg].nbytes
        again = max(0.0, read - unique)
        total += unique + again * (0.1 if unique <= spec.l2_bytes else 1.0)
    return total + work.written


def _op_flops(elements: int, op: Op) -> float:
    return elements * (8 if op.info.transcendental else 1)


def _block_flops(work: BlockWork, plan: BlockPlan) -> tuple[float, float]:
    """(tensor-core flops, FMA flops) over all blocks and iterations."""
    tc = fma = 0.0
    for n in work.nodes:
        # accumulators update every iteration
        times = work.iterations if n.phase is Phase.BODY or n.op in ACCUMULATORS else 1
        if n.matmul is not None:
            if plan.matmuls[n.value].tensor_cores:
                tc += n.matmul.flops * times
            else:
                fma += n.matmul.flops * times
        elif n.op is Op.THREAD:
            fma += times * sum(_op_flops(n.out_elems, op) for op in n.element_ops)
        elif n.op in ELEMENTWISE or n.op in ACCUMULATORS:
            fma += times * _op_flops(n.out_elems, n.op)
        elif n.op in REDUCTIONS:
            fma += times * n.in_elems
    return tc * work.blocks, fma * work.blocks


def _barriers_per_iteration(work: BlockWork) -> int:
    return 2 + len(work.loop_ops) + work.loop_ops.count(Op.ACC_RESCALE_SUM) * 2


def fused_time(nbytes: float, matmul_flops: float, element_ops: float, spec: GpuSpec) -> float:
    """Seconds of one kernel moving ``nbytes`` through HBM and doing the given work at the
    GPU's ceilings (products on tensor cores): a fused region's floor."""
    compute = matmul_flops / spec.tensor_flops + element_ops / spec.f32_flops
    return spec.launch_s + max(nbytes / spec.hbm_bytes_per_s, compute)


def _op_cost(op: OpWork, spec: GpuSpec) -> KernelCost:
    ins, outs = op.ins, op.outs
    nbytes = op.bytes
    fma_rate = spec.f64_flops if any(t.dtype is DType.F64 for t in ins) else spec.f32_flops
    if op.matmul is not None:
        a, b = ins
        flops = op.matmul.flops
        # A is re-read per 64-column tile of C, B per 64-row tile (through L2 when it fits)
        rereads = a.nbytes * (math.ceil(b.shape[-1] / 64) - 1) + b.nbytes * (
            math.ceil(a.shape[-2] / 64) - 1
        )
        nbytes += rereads * (0.1 if a.nbytes + b.nbytes <= spec.l2_bytes else 1.0)
        compute = flops / (0.5 * fma_rate)
    elif op.op in UNARY or op.op in BINARY or op.op is Op.CAST:
        flops = _op_flops(outs[0].size, op.op)
        compute = flops / fma_rate
    else:
        flops = float(op.in_elems)
        compute = flops / fma_rate
    time = spec.launch_s + max(nbytes / spec.hbm_bytes_per_s, compute)
    return KernelCost(op.op.value, time, nbytes, flops)


__all__ = [
    "A100", "H100", "H200", "GpuCost", "GpuSpec", "KernelCost", "block_cost", "estimate",
    "registers_per_thread", "reject_reason",
]  # fmt: skip
