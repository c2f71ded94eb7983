"""The CUDA block planner: how one block graph runs as a ``__global__`` kernel.

``plan_block`` decides, before any code is written, the C++ storage type of every tile, the
thread count (more threads when register accumulators would not fit), which matmuls run on
tensor cores and which accumulate in registers, which input tiles are double-buffered, and
the shared-memory layout: a first-fit allocator over the tiles' live ranges in the order the
emitter writes the kernel. The emitter (``emit``) and the GPU cost model (``cost``) both read
the same ``BlockPlan``, so the model prices exactly the kernel that is generated.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from mirage_jax.backend.emit import SECTION, fusable_matmuls
from mirage_jax.ir.fuse import fuse_elementwise
from mirage_jax.ir.graph import BlockGraph, Node, Phase
from mirage_jax.ir.ops import ACCUMULATORS, Op
from mirage_jax.ir.types import DType

CTYPE = {DType.F16: "mj::half", DType.BF16: "mj::bf16", DType.F32: "float", DType.F64: "double",
         DType.BOOL: "bool"}  # fmt: skip
ELEM_BYTES = {"mj::half": 2, "mj::bf16": 2, "float": 4, "double": 8, "bool": 1}  # by storage
_HALF = (DType.F16, DType.BF16)
SMEM_ALIGN = 16
# Accumulator registers per thread above which a block graph gets more threads.
_ACC_REGS_PER_THREAD = 96


def _acc_ctype(dtype: DType) -> str:
    return "double" if dtype is DType.F64 else "float"


@dataclass(frozen=True)
class Buffer:
    """One shared-memory tile: ``stages`` copies of ``nbytes`` each, from byte ``offset``."""

    offset: int
    nbytes: int
    ctype: str
    stages: int = 1

    @property
    def end(self) -> int:
        return self.offset + self.nbytes * self.stages


@dataclass(frozen=True)
class MatmulPlan:
    """How one block matmul runs: operand storage types, tensor cores or FMA, registers."""

    value: int
    a_ctype: str
    b_ctype: str
    tensor_cores: bool
    acc_registers: int  # 32-bit accumulator registers per thread
    fused_acc: int | None  # the acc_sum value it accumulates into, in registers


@dataclass(frozen=True)
class BlockPlan:
    """Everything the emitter and the GPU cost model need to know about one block kernel."""

    graph: BlockGraph  # the block graph after fuse_elementwise
    threads: int
    smem_bytes: int
    buffers: Mapping[str, Buffer]  # "v<id>", "v<id>_run", "v<id>_next" -> tile
    matmuls: Mapping[int, MatmulPlan]
    double_buffered: tuple[int, ...]  # loop-varying input tiles, prefetched one iteration ahead
    phases: Mapping[int, Phase] = field(repr=False, default_factory=dict)

    @property
    def acc_registers(self) -> int:
        """Accumulator registers per thread: all fused accumulators plus the largest one-shot."""
        return _acc_registers(self.matmuls)

    @property
    def fused(self) -> dict[int, int]:
        """acc value -> the matmul value accumulated into it in registers."""
        return {m.fused_acc: v for v, m in self.matmuls.items() if m.fused_acc is not None}


def plan_block(block: BlockGraph) -> BlockPlan:
    """Storage, thread count and shared-memory layout of ``block`` as the emitter will use it."""
    g = fuse_elementwise(block)
    phases = g.phases()
    storage = _storage_types(g)
    fusable = fusable_matmuls(g, phases)
    threads = 128
    for threads in (128, 256, 512):
        mm = _matmul_plans(g, storage, fusable, threads)
        regs = _acc_registers(mm)
        if regs <= _ACC_REGS_PER_THREAD:
            break
    dbl = tuple(
        n.outs[0] for n in g.nodes_of(Op.INPUT_ITER) if phases[n.outs[0]] is Phase.BODY
    )
    buffers = _allocate(g, phases, storage, mm, dbl)
    smem = max((b.end for b in buffers.values()), default=0)
    return BlockPlan(g, threads, smem, buffers, mm, dbl, phases)


def _acc_registers(mm: Mapping[int, MatmulPlan]) -> int:
    fused = sum(m.acc_registers for m in mm.values() if m.fused_acc is not None)
    once = max((m.acc_registers for m in mm.values() if m.fused_acc is None), default=0)
    return fused + once


def _storage_types(g: BlockGraph) -> dict[int, str]:
    """The C++ element type of every tile.

    Input tiles keep their dtype (cp.async copies bytes). f16/bf16 values computed in the
    block are kept in float unless a matmul consumes them (tensor cores read f16/bf16);
    accumulators are float (double for f64).
    """
    matmul_operands = {i for n in g.nodes_of(Op.MATMUL) for i in n.ins}
    out: dict[int, str] = {}
    for n in g.nodes:
        for v in n.outs:
            dt = g.types[v].dtype
            if n.op is Op.INPUT_ITER:
                out[v] = CTYPE[dt]
            elif n.op in ACCUMULATORS:
                out[v] = _acc_ctype(dt)
            elif dt in _HALF and v not in matmul_operands:
                out[v] = "float"
            else:
                out[v] = CTYPE[dt]
    return out


def _matmul_plans(
    g: BlockGraph, storage: Mapping[int, str], fusable: Mapping[int, int], threads: int
) -> dict[int, MatmulPlan]:
    plans = {}
    for n in g.nodes_of(Op.MATMUL):
        a, b = n.ins
        ta, tb = g.types[a], g.types[b]
        m, k, nn = ta.shape[-2], ta.shape[-1], tb.shape[-1]
        batch = ta.size // (m * k)
        tc = storage[a] == storage[b] and storage[a] in ("mj::half", "mj::bf16")
        if tc:
            tiles = batch * -(-m // 16) * -(-nn // 8)
            regs = 4 * -(-tiles // (threads // 32))
        else:
            words = 2 if "double" in (storage[a], storage[b]) else 1
            regs = words * -(-(batch * m * nn) // threads)
        v = n.outs[0]
        plans[v] = MatmulPlan(v, storage[a], storage[b], tc, regs, fusable.get(v))
    return plans


def _allocate(
    g: BlockGraph,
    phases: Mapping[int, Phase],
    storage: Mapping[int, str],
    matmuls: Mapping[int, MatmulPlan],
    double_buffered: tuple[int, ...],
) -> dict[str, Buffer]:
    """First-fit placement of every tile over its live range in the emitted schedule."""
    ranges = _live_ranges(g, phases, matmuls, double_buffered)
    sizes: dict[str, tuple[int, str, int]] = {}
    for key, (vid, _, _) in ranges.items():
        # the running max of an online softmax is kept like its accumulator
        owner = int(key[1:].split("_")[0])
        ct = storage[owner] if key.endswith(("_run", "_next")) else storage[vid]
        elem = ELEM_BYTES[ct]
        stages = 2 if vid in double_buffered and g.forloop_range > 1 and key == f"v{vid}" else 1
        sizes[key] = (g.types[vid].size * elem, ct, stages)
    placed: list[tuple[int, int, int, int]] = []  # (start, end, offset, bytes)
    buffers: dict[str, Buffer] = {}
    order = sorted(ranges, key=lambda k: (ranges[k][1], -sizes[k][0] * sizes[k][2], k))
    for key in order:
        _, start, end = ranges[key]
        nbytes, ct, stages = sizes[key]
        total = -(-nbytes * stages // SMEM_ALIGN) * SMEM_ALIGN
        busy = sorted((o, o + b) for s, e, o, b in placed if s <= end and start <= e)
        offset = 0
        for lo, hi in busy:
            if offset + total <= lo:
                break
            offset = max(offset, -(-hi // SMEM_ALIGN) * SMEM_ALIGN)
        placed.append((start, end, offset, total))
        per_stage = -(-nbytes // SMEM_ALIGN) * SMEM_ALIGN if stages > 1 else nbytes
        buffers[key] = Buffer(offset, per_stage, ct, stages)
    return buffers


def _live_ranges(
    g: BlockGraph,
    phases: Mapping[int, Phase],
    matmuls: Mapping[int, MatmulPlan],
    double_buffered: tuple[int, ...],
) -> dict[str, tuple[int, int, int]]:
    """key -> (value, first, last) schedule positions.

    Positions follow the emitted order: invariant nodes, then the accumulator inits and the
    first prefetch (``init``), the loop body, the accumulator finishes (``fin``), the epilogue.
    A value used inside the loop stays live to the loop's end (the loop repeats).
    """
    by_section = sections(g, phases)
    pos: dict[int, int] = {}
    p = 0
    for n in by_section["pre"]:
        pos[id(n)] = p
        p += 1
    init = p
    p += 1
    loop_start = p
    for n in by_section["loop"]:
        pos[id(n)] = p
        p += 1
    loop_end = max(p - 1, loop_start)
    fin = loop_end + 1
    p = fin + 1
    for n in by_section["post"]:
        pos[id(n)] = p
        p += 1
    fused_mm = {v for v, m in matmuls.items() if m.fused_acc is not None}
    fused_acc = {m.fused_acc for m in matmuls.values() if m.fused_acc is not None}
    ranges: dict[str, tuple[int, int, int]] = {}
    for n in g.nodes:
        if n.op is Op.OUTPUT_SAVER:
            continue
        for v in n.outs:
            if v in fused_mm:
                continue  # lives in registers
            if n.op in ACCUMULATORS:
                start = fin if v in fused_acc else init
            elif v in double_buffered:
                start = init
            else:
                start = pos[id(n)]
            end = start
            for u in g.users(v):
                use = pos[id(u)]
                if loop_start <= use <= loop_end and start < loop_start:
                    use = loop_end  # an invariant value read by every iteration
                end = max(end, use)
            if v in double_buffered:
                end = max(end, loop_end)
            if n.op in ACCUMULATORS:
                end = max(end, fin)  # updated every iteration and finished, even if unused
            ranges[f"v{v}"] = (v, start, end)
            if n.op is Op.ACC_RESCALE_SUM:
                ranges[f"v{v}_run"] = (n.ins[1], init, loop_end)
                ranges[f"v{v}_next"] = (n.ins[1], init, loop_end)
    return ranges


def sections(g: BlockGraph, phases: Mapping[int, Phase]) -> dict[str, list[Node]]:
    """Which part of the kernel each node is emitted in: before, inside or after the loop."""
    out: dict[str, list[Node]] = {"pre": [], "loop": [], "post": []}
    for n in g.nodes:
        if n.op is Op.OUTPUT_SAVER:
            out[SECTION[phases[n.ins[0]]]].append(n)
        elif n.op in ACCUMULATORS:
            out["loop"].append(n)  # the update; init and finish are placed around the loop
        else:
            out[SECTION[phases[n.outs[0]]]].append(n)
    return out


__all__ = ["CTYPE", "ELEM_BYTES", "SMEM_ALIGN", "BlockPlan", "Buffer", "MatmulPlan", "plan_block",
           "sections"]  # fmt: skip
