"""The CUDA emitter: a KernelGraph becomes one CUDA C++17 translation unit.

The generated code states only the graph's specifics - shapes, maps, the op sequence - as
instantiations of the header-only runtime in ``csrc/runtime/cuda/`` (``#include
"cuda/mj_cuda.cuh"``); every loop lives in those headers. ``TABLE`` maps each ``Op`` to the
runtime template it instantiates. The translation unit holds:

- one ``__global__`` kernel per graph-defined kernel (after ``fuse_elementwise``): the block
  graph's grid is the CUDA grid (``blockIdx.x/y/z`` = grid axes x/y/z); its tiles live in
  dynamic shared memory at offsets planned by ``plan_block`` (``plan``: a first-fit
  allocator over the tiles' live ranges); loop-invariant tiles and ops run before the
  for-loop; loop-varying tiles are double-buffered and prefetched one iteration ahead with
  ``cp.async`` (sm_80+); a body matmul that feeds an ``acc_sum`` directly accumulates in
  registers (``mj::Accumulator``: tensor cores via ``mma.sync`` for f16/bf16, FMA otherwise)
  and is written out once after the loop; thread graphs become one fused loop over the tile;
  accumulator finishes, the epilogue and the output savers (per omap/fdim) follow;
- ``<symbol>_run(stream, inputs, outputs, scratch)``: the launch sequence. Kernel-level ops
  launch the simple kernels of ``cuda/kernels.cuh``; intermediate tensors live in one scratch
  buffer; a reshape is an alias; an output is written in place by its producer (the storage
  plan of ``mirage_jax.backend.emit``, shared with the CPU backend);
- the XLA FFI handler ``<symbol>`` (``XLA_FFI_DEFINE_HANDLER_SYMBOL``) taking the platform
  stream, a scratch allocator, typed input buffers and result buffers. Compiling with
  ``-DMJ_NO_FFI`` leaves it out (kernel-only builds for fast compile checks);
- under ``-DMJ_EMU`` (a host compiler, see ``cuda/emu.h``) instead ``extern "C" int
  <symbol>_emu(inputs, outputs)``, which runs the same kernels with emulated thread blocks so
  the generated code can be checked numerically without a GPU.

``backend_for`` (in ``backend.select``) decides between this backend and the CPU one.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from mirage_jax.backend.cuda.plan import (
    CTYPE,
    ELEM_BYTES,
    BlockPlan,
    Buffer,
    MatmulPlan,
    plan_block,
    sections,
)
from mirage_jax.backend.emit import (
    KernelEmitter,
    Template,
    check_request,
    check_table,
    indent,
    literal,
    lookup,
    node_text,
    op_functor,
    shape_type,
    thread_steps,
)
from mirage_jax.errors import CompileError
from mirage_jax.ir.graph import BlockGraph, KernelGraph, Node, ThreadGraph
from mirage_jax.ir.ops import ACCUMULATORS, BINARY, NONE_DIM, UNARY, Op
from mirage_jax.ir.types import DType, TensorType

_FFI_DTYPE = {DType.F16: "F16", DType.BF16: "BF16", DType.F32: "F32", DType.F64: "F64",
              DType.BOOL: "PRED"}  # fmt: skip

SCRATCH_ALIGN = 256
# Per-block shared-memory limit of sm_80 .. sm_90 (227 KiB opt-in; 48 KiB without opting in).
MAX_SMEM_PER_BLOCK = 227 * 1024
DEFAULT_SMEM_PER_BLOCK = 48 * 1024
MAX_GRID_YZ = 65535
KERNEL_THREADS = 256  # 1-D blocks of the kernel-level kernels
MAX_KERNEL_BLOCKS = 132 * 8  # grid-stride loops need no more than a few waves of blocks

# A Template's ``fn`` is ``mj::<fn>`` in a block kernel (``mj::k_<fn>`` at kernel level); its
# ``functor`` is the op functor (``mj::op::*``) or reduction (``mj::R*``) it is instantiated with.
_REDUCER = {Op.REDUCE_SUM: "RSum", Op.REDUCE_MAX: "RMax", Op.REDUCE_MEAN: "RMean",
            Op.REDUCE_RMS: "RRms"}  # fmt: skip
# Accumulators combine like these reductions; mean and rms finish over all iterations.
_ACC_REDUCER = {Op.ACC_SUM: "RSum", Op.ACC_MEAN: "RMean", Op.ACC_MAX: "RMax",
                Op.ACC_RMS: "RRms"}  # fmt: skip

TABLE: dict[Op, Template] = {
    Op.INPUT: Template("inputs"),  # the FFI argument buffers
    Op.OUTPUT: Template("outputs"),  # the producer writes the result buffer, else a copy
    Op.GRAPH_DEF: Template("__global__"),  # one generated kernel per block graph
    Op.INPUT_ITER: Template("load_tile_async"),  # load_tile for loop-invariant tiles
    Op.OUTPUT_SAVER: Template("store_tile"),
    Op.THREAD: Template("fused loop", "<inlined thread graph>"),
    Op.RESHAPE: Template("alias"),
    Op.TRANSPOSE: Template("transpose"),
    Op.SLICE: Template("slice"),
    Op.CAST: Template("unary", "mj::op::Identity"),
    Op.MATMUL: Template("block_matmul"),  # Accumulator::mma when it feeds an acc_sum
    Op.CONCAT: Template("concat"),
    **{op: Template("unary", op_functor(op)) for op in Op if op in UNARY},
    **{op: Template("binary", op_functor(op)) for op in Op if op in BINARY},
    **{op: Template("reduce", f"mj::{name}") for op, name in _REDUCER.items()},
    **{op: Template("acc_update", f"mj::{name}") for op, name in _ACC_REDUCER.items()},
    Op.ACC_RESCALE_SUM: Template("acc_rescale_sum"),
}
check_table(TABLE, "CUDA")


def emit_cuda(graph: KernelGraph, symbol: str) -> str:
    """CUDA source for ``graph``: its kernels, ``<symbol>_run`` and the FFI handler ``symbol``."""
    check_request(graph, symbol, "emit_cuda")
    return _KernelEmitter(graph, symbol).source()


# ------------------------------------------------------------------------------ C++ spelling


def ctype(dtype: DType) -> str:
    return CTYPE[dtype]


def _shape(shape: tuple[int, ...]) -> str:
    return shape_type(shape or (1,))  # a scalar is one element


def _literal(x: float) -> str:
    return literal(x, nan="NAN", inf="INFINITY")


def _scalar(node: Node) -> str:
    """The scalar operand of an elementwise functor: the op's scalar attribute, else unused."""
    if node.op.info.scalar_attr:
        return _literal(node.attr(node.op.info.scalar_attr))
    return "0.0"


def _functor(op: Op) -> str:
    return TABLE[op].functor


def _node_text(node: Node) -> str:
    return node_text(node, attrs=True)


def _check_size(t: TensorType, what: str) -> None:
    if t.size >= 2**31:
        raise CompileError(
            f"CUDA backend: {what} {t} has 2^31 or more elements",
            remedy="split the region into smaller tensors or leave it to XLA",
        )


# ----------------------------------------------------------------------------- block kernels


class _BlockEmitter:
    """One graph-defined kernel as a ``__global__`` function."""

    def __init__(self, block: BlockGraph, name: str) -> None:
        self.plan = plan_block(block)
        self.g = self.plan.graph
        self.name = name
        self.nt = self.plan.threads
        self.lines: dict[str, list[str]] = {"pre": [], "loop": [], "post": []}
        self.saver_index = {id(n): k for k, n in enumerate(self.g.outputs)}

    def source(self) -> str:
        g, plan = self.g, self.plan
        if plan.smem_bytes > MAX_SMEM_PER_BLOCK:
            raise CompileError(
                f"CUDA backend: block graph needs {plan.smem_bytes / 1024:.1f} KiB of shared "
                f"memory per block; the limit is {MAX_SMEM_PER_BLOCK // 1024} KiB",
                remedy="use a larger grid or forloop range so the tiles are smaller",
            )
        if g.grid[1] > MAX_GRID_YZ or g.grid[2] > MAX_GRID_YZ:
            raise CompileError(f"CUDA backend: grid {g.grid} exceeds 65535 blocks on y or z",
                               remedy="put the largest grid axis on x")  # fmt: skip
        for t in (*g.arg_types, *g.output_types):
            _check_size(t, "block graph tensor")
        by_section = sections(g, plan.phases)
        for where in ("pre", "loop", "post"):
            for n in by_section[where]:
                self._node(n, where)
        params = [f"const {CTYPE[t.dtype]}* __restrict__ in{i}" for i, t in enumerate(g.arg_types)]
        params += [f"{CTYPE[t.dtype]}* __restrict__ out{k}" for k, t in enumerate(g.output_types)]
        gx, gy, gz = g.grid
        r = g.forloop_range
        body = [
            (f"// grid=({gx},{gy},{gz}) forloop_range={r} threads={self.nt} "
             f"smem={plan.smem_bytes} bytes"),
            f"__global__ void __launch_bounds__({self.nt}) {self.name}({', '.join(params)}) {{",
            "  MJ_DYN_SMEM(mj_smem);",
            f"  constexpr int NT = {self.nt};",
            "  const int bx = blockIdx.x, by = blockIdx.y, bz = blockIdx.z;",
            "  (void)bx, (void)by, (void)bz;",
            *indent(self._declarations(), "  "),
            *indent(_dedupe_syncs(self.lines["pre"]), "  "),
            *indent(self._init(), "  "),
            f"  for (int it = 0; it < {r}; ++it) {{",
            *indent(self._loop_head(), "    "),
            *indent(_dedupe_syncs(self.lines["loop"] + ["__syncthreads();"]), "    "),
            "  }",
            *indent(_dedupe_syncs(self._finish() + self.lines["post"]), "  "),
            "}",
            "",
        ]
        return "\n".join(body)

    # ---- storage

    def _buf(self, v: int) -> str:
        return f"v{v}"

    def _declarations(self) -> list[str]:
        out = []
        for key, b in sorted(self.plan.buffers.items(), key=lambda kv: kv[1].offset):
            vid = int(key[1:].split("_")[0])
            if key.endswith(("_run", "_next")):  # shaped like the max operand
                vid = self.g.producer(vid).ins[1]
            t = self.g.types[vid]
            note = f"{t}" + (f", {b.stages} stages" if b.stages > 1 else "")
            name = f"{key}_s" if b.stages > 1 else key
            out.append(f"{b.ctype}* const {name} = reinterpret_cast<{b.ctype}*>(mj_smem + "
                       f"{b.offset});  // {note}")  # fmt: skip
        for acc, mm in sorted(self.plan.fused.items()):
            a, b = self.g.producer(mm).ins
            m = self.plan.matmuls[mm]
            out.append(
                f"mj::Accumulator<NT, {_shape(self.g.types[a].shape)}, "
                f"{_shape(self.g.types[b].shape)}, {m.a_ctype}, {m.b_ctype}> r{acc};"
                f"  // %{acc} = acc_sum(%{mm}) in registers"
            )
        return out

    def _stage_ptr(self, v: int, stage: str) -> str:
        b = self.plan.buffers[f"v{v}"]
        elems = b.nbytes // ELEM_BYTES[b.ctype]
        return f"v{v}_s + ({stage}) * {elems}" if b.stages > 1 else f"v{v}"

    # ---- loop structure

    def _init(self) -> list[str]:
        out = []
        for n in self.g.nodes:
            if n.op not in ACCUMULATORS:
                continue
            v = n.outs[0]
            if v in self.plan.fused:
                out.append(f"r{v}.zero();")
                continue
            L = _shape(self.g.types[v].shape)
            init = "-INFINITY" if n.op is Op.ACC_MAX else "0.0f"
            out.append(f"mj::fill<NT, {L}>(v{v}, {init});  // init {n.op.value}")
            if n.op is Op.ACC_RESCALE_SUM:
                Lm = _shape(self.g.types[n.ins[1]].shape)
                out.append(f"mj::fill<NT, {Lm}>(v{v}_run, -INFINITY);  // running max")
        for v in self.plan.double_buffered:
            out.append(self._load(v, "0", async_=True, stage="0"))
        if self.plan.double_buffered:
            out.append("mj::cp_async_commit();")
        out.append("__syncthreads();")
        return out

    def _loop_head(self) -> list[str]:
        dbl = self.plan.double_buffered
        if not dbl:
            return []
        stages = 2 if self.g.forloop_range > 1 else 1
        out = [f"const int st = it % {stages};", "(void)st;"]
        if self.g.forloop_range > 1:
            out.append(f"if (it + 1 < {self.g.forloop_range}) {{  // prefetch the next iteration")
            out += [f"  {self._load(v, 'it + 1', async_=True, stage='st ^ 1')}" for v in dbl]
            out.append("}")
        out += ["mj::cp_async_commit();", "mj::cp_async_wait<1>();", "__syncthreads();"]
        for v in dbl:
            b = self.plan.buffers[f"v{v}"]
            if b.stages > 1:
                out.append(f"{b.ctype}* const v{v} = {self._stage_ptr(v, 'st')};")
        return out

    def _finish(self) -> list[str]:
        out = []
        r = self.g.forloop_range
        for n in self.g.nodes:
            if n.op not in ACCUMULATORS:
                continue
            v = n.outs[0]
            if v in self.plan.fused:
                out.append(f"r{v}.store(v{v});")
            elif n.op in (Op.ACC_MEAN, Op.ACC_RMS):
                dim = n.attr("dim")
                count = r * (self.g.types[n.ins[0]].shape[dim] if dim != NONE_DIM else 1)
                L = _shape(self.g.types[v].shape)
                out.append(f"mj::acc_finish<{_functor(n.op)}, NT, {L}>(v{v}, {count});")
        if out:
            out.append("__syncthreads();")
        return out

    # ---- nodes

    def _node(self, n: Node, where: str) -> None:
        emit = lookup(_BLOCK_OPS, n.op, "CUDA", "block")
        lines = emit(self, n)
        if not lines:
            return
        self.lines[where].append(f"// {_node_text(n)}")
        self.lines[where].extend(lines)

    def _global_offset(self, shape: tuple[int, ...], tile: tuple[int, ...],
                       gmap: tuple[int, int, int], fdim: int, it: str) -> str:  # fmt: skip
        strides = [math.prod(shape[d + 1 :]) for d in range(len(shape))]
        terms = []
        for axis, d in enumerate(gmap):
            if d != NONE_DIM and self.g.grid[axis] > 1:
                terms.append(f"{('bx', 'by', 'bz')[axis]} * {tile[d] * strides[d]}")
        if fdim != NONE_DIM and self.g.forloop_range > 1:
            terms.append(f"({it}) * {tile[fdim] * strides[fdim]}")
        return " + ".join(terms) or "0"

    def _load(self, v: int, it: str, async_: bool, stage: str = "0") -> str:
        n = self.g.producer(v)
        arg, imap, fdim = n.attr("arg"), n.attr("imap"), n.attr("fdim")
        gt, tt = self.g.arg_types[arg], self.g.types[v]
        off = self._global_offset(gt.shape, tt.shape, imap, fdim, it)
        fn = "load_tile_async" if async_ else "load_tile"
        dst = self._stage_ptr(v, stage) if async_ else f"v{v}"
        return (f"mj::{fn}<NT, {_shape(tt.shape)}, {_shape(gt.shape)}>({dst}, in{arg} + {off});")

    def _input_iter(self, n: Node) -> list[str]:
        v = n.outs[0]
        if v in self.plan.double_buffered:
            return []  # loaded by the prefetch at the loop head
        return [self._load(v, "0", async_=False), "__syncthreads();"]

    def _saver(self, n: Node) -> list[str]:
        k = self.saver_index[id(n)]
        v = n.ins[0]
        ot, tt = self.g.output_types[k], self.g.types[v]
        off = self._global_offset(ot.shape, tt.shape, n.attr("omap"), n.attr("fdim"), "it")
        # every op ends with a barrier: later ops may reuse the shared memory it read
        store = (f"mj::store_tile<NT, {_shape(tt.shape)}, {_shape(ot.shape)}>(out{k} + {off}, "
                 f"{self._buf(v)});")  # fmt: skip
        return [store, "__syncthreads();"]

    def _matmul(self, n: Node) -> list[str]:
        v = n.outs[0]
        a, b = n.ins
        m = self.plan.matmuls[v]
        if m.fused_acc is not None:
            # the barrier lets later ops reuse the operands' shared memory
            return [f"r{m.fused_acc}.mma(v{a}, v{b});", "__syncthreads();"]
        la, lb = _shape(self.g.types[a].shape), _shape(self.g.types[b].shape)
        return [f"mj::block_matmul<NT, {la}, {lb}>(v{v}, v{a}, v{b});", "__syncthreads();"]

    def _unary(self, n: Node) -> list[str]:
        v = n.outs[0]
        L = _shape(self.g.types[v].shape)
        f = _functor(n.op)
        target = CTYPE[self.g.types[v].dtype]
        if n.op is Op.CAST and self.plan.buffers[f"v{v}"].ctype != target:
            f = f"mj::op::RoundTo<{target}>"  # an f16/bf16 value kept in a float tile
        return [f"mj::unary<{f}, NT, {L}>(v{v}, v{n.ins[0]}, {_scalar(n)});", "__syncthreads();"]

    def _two_operands(self, n: Node, template: str, tail: str = "", scalar: str = ""
                      ) -> list[str]:  # fmt: skip
        """``template<out shape, a shape, b shape tail>(out, a, b[, scalar])``; ``template``
        ends with its leading arguments (``mj::binary<F, NT, ``)."""
        v, (a, b) = n.outs[0], n.ins
        shapes = ", ".join(_shape(self.g.types[x].shape) for x in (v, a, b))
        args = ", ".join([f"v{v}", f"v{a}", f"v{b}", *([scalar] if scalar else [])])
        return [f"{template}{shapes}{tail}>({args});", "__syncthreads();"]

    def _binary(self, n: Node) -> list[str]:
        return self._two_operands(n, f"mj::binary<{_functor(n.op)}, NT, ", scalar=_scalar(n))

    def _reduce(self, n: Node) -> list[str]:
        v, x = n.outs[0], n.ins[0]
        lo, li = _shape(self.g.types[v].shape), _shape(self.g.types[x].shape)
        return [f"mj::reduce<{_functor(n.op)}, NT, {lo}, {li}, {n.attr('dim')}>(v{v}, v{x});",
                "__syncthreads();"]  # fmt: skip

    def _concat(self, n: Node) -> list[str]:
        return self._two_operands(n, "mj::concat<NT, ", f", {n.attr('dim')}")

    def _accumulate(self, n: Node) -> list[str]:
        v = n.outs[0]
        if v in self.plan.fused:
            return []
        if n.op is Op.ACC_RESCALE_SUM:
            x, m = n.ins
            lx, lm = _shape(self.g.types[x].shape), _shape(self.g.types[m].shape)
            call = (f"mj::acc_rescale_sum<NT, {lx}, {lm}>(v{v}, v{v}_run, v{v}_next, v{x}, "
                    f"v{m});")  # fmt: skip
            return [call, "__syncthreads();"]
        x = n.ins[0]
        la, lx = _shape(self.g.types[v].shape), _shape(self.g.types[x].shape)
        return [f"mj::acc_update<{_functor(n.op)}, NT, {la}, {lx}, {n.attr('dim')}>(v{v}, v{x});",
                "__syncthreads();"]  # fmt: skip

    def _thread(self, n: Node) -> list[str]:
        tg: ThreadGraph = n.attr("graph")
        v = n.outs[0]
        lo = _shape(self.g.types[v].shape)
        steps, result = thread_steps(tg)
        dtypes = [self.g.types[i].dtype for i in n.ins] + [tg.types[result].dtype]
        c = "double" if DType.F64 in dtypes else "float"
        body = [f"for (int i = mj::thread_id(); i < {lo}::size; i += NT) {{"]
        names: dict[int, str] = {}
        for k, (tin, operand) in enumerate(zip(tg.inputs, n.ins)):
            t = tin.outs[0]
            names[t] = f"x{t}"
            li = _shape(self.g.types[operand].shape)
            idx = "i" if li == lo else f"mj::bcast_offset<{lo}, {li}>(i)"
            body.append(f"  const {c} x{t} = mj::cvt<{c}>(v{operand}[{idx}]);")
        for tn in steps:
            t = tn.outs[0]
            args = [names[i] for i in tn.ins]
            if tn.op is Op.CAST:
                dt = tg.types[t].dtype
                expr = f"mj::cvt<{c}>(mj::cvt<{CTYPE[dt]}>({args[0]}))"
            elif tn.op in BINARY:
                expr = f"{_functor(tn.op)}::f<{c}>({args[0]}, {args[1]}, {c}({_scalar(tn)}))"
            elif tn.op in UNARY:
                expr = f"{_functor(tn.op)}::f<{c}>({args[0]}, {c}({_scalar(tn)}))"
            else:
                raise CompileError(f"CUDA backend: {tn.op.value} cannot appear in a thread graph")
            body.append(f"  const {c} x{t} = {expr};")
            names[t] = f"x{t}"
        out_ct = self.plan.buffers[f"v{v}"].ctype
        body.append(f"  v{v}[i] = mj::cvt<{out_ct}>({names[result]});")
        body.append("}")
        return [*body, "__syncthreads();"]


_BlockOp = Callable[[_BlockEmitter, Node], list[str]]
_BLOCK_OPS: dict[str, _BlockOp] = {
    "input_iter": _BlockEmitter._input_iter,
    "output_saver": _BlockEmitter._saver,
    "matmul": _BlockEmitter._matmul,
    "unary": _BlockEmitter._unary,
    "binary": _BlockEmitter._binary,
    "reduce": _BlockEmitter._reduce,
    "concat": _BlockEmitter._concat,
    "acc": _BlockEmitter._accumulate,
    "thread": _BlockEmitter._thread,
}


def _dedupe_syncs(lines: list[str]) -> list[str]:
    """Drop a barrier that directly follows another (comments in between do not count)."""
    out: list[str] = []
    last_sync = False
    for line in lines:
        is_sync = line == "__syncthreads();"
        if is_sync and last_sync:
            continue
        if not line.startswith("//"):
            last_sync = is_sync
        out.append(line)
    return out


# ---------------------------------------------------------------------------- kernel level


class _KernelEmitter(KernelEmitter):
    """``<symbol>_run``: pointers to the buffers the storage plan names, then the launches."""

    scratch_align = SCRATCH_ALIGN
    prefix = "t"

    def source(self) -> str:
        for n in self.g.nodes:
            for v in n.outs:
                _check_size(self.g.types[v], "tensor")
        self.walk()
        return "\n".join(self._translation_unit()) + "\n"

    def _translation_unit(self) -> list[str]:
        sym, scratch = self.symbol, self.storage.scratch_bytes
        ins = [t for t in self.g.input_types]
        outs = [t for t in self.g.output_types]
        head = [
            self.banner(__name__),
            "// Build: nvcc (FFI handler), nvcc -DMJ_NO_FFI (kernels only), or a host compiler",
            "// with -DMJ_EMU (emulated thread blocks, for tests without a GPU).",
            '#include "cuda/mj_cuda.cuh"',
            "",
            "namespace {",
            "",
            *self.blocks,
            "}  // namespace",
            "",
            f"[[maybe_unused]] static constexpr size_t {sym}_scratch_bytes = {scratch};",
            "",
            f"[[maybe_unused]] static int {sym}_run(cudaStream_t stream, void* const* inputs,",
            "    void* const* outputs, unsigned char* scratch) {",
            "  (void)stream, (void)inputs, (void)outputs, (void)scratch;",
            *indent(self.lines, "  "),
            "  return MJ_LAST_ERROR();",
            "}",
            "",
        ]
        emu = [
            "#if defined(MJ_EMU)",
            f'extern "C" int {sym}_emu(void* const* inputs, void* const* outputs) {{',
            f"  std::vector<unsigned char> ws({sym}_scratch_bytes + {SCRATCH_ALIGN});",
            "  const auto base = reinterpret_cast<uintptr_t>(ws.data());",
            (f"  auto* scratch = reinterpret_cast<unsigned char*>((base + {SCRATCH_ALIGN - 1}) & "
             f"~uintptr_t({SCRATCH_ALIGN - 1}));"),
            f"  return {sym}_run(nullptr, inputs, outputs, scratch);",
            "}",
        ]
        args = [f"ffi::Buffer<ffi::{_FFI_DTYPE[t.dtype]}> in{i}" for i, t in enumerate(ins)]
        rets = [f"ffi::ResultBuffer<ffi::{_FFI_DTYPE[t.dtype]}> out{k}" for k, t in enumerate(outs)]
        binds = [f".Arg<ffi::Buffer<ffi::{_FFI_DTYPE[t.dtype]}>>()" for t in ins]
        binds += [f".Ret<ffi::Buffer<ffi::{_FFI_DTYPE[t.dtype]}>>()" for t in outs]
        params = ["cudaStream_t stream", "ffi::ScratchAllocator alloc", *args, *rets]
        in_ptrs = ", ".join(f"in{i}.untyped_data()" for i in range(len(ins))) or "nullptr"
        out_ptrs = ", ".join(f"out{k}->untyped_data()" for k in range(len(outs)))
        ffi = [
            "#elif !defined(MJ_NO_FFI)",
            "#include <string>",
            '#include "xla/ffi/api/ffi.h"',
            "namespace ffi = xla::ffi;",
            "",
            f"static ffi::Error {sym}_ffi({', '.join(params)}) {{",
            f"  void* inputs[] = {{{in_ptrs}}};",
            f"  void* outputs[] = {{{out_ptrs}}};",
            "  unsigned char* scratch = nullptr;",
            f"  if ({sym}_scratch_bytes > 0) {{",
            f"    auto mem = alloc.Allocate({sym}_scratch_bytes, {SCRATCH_ALIGN});",
            "    if (!mem.has_value())",
            "      return ffi::Error(ffi::ErrorCode::kResourceExhausted,",
            f'                        "mirage_jax {sym}: no scratch memory");',
            "    scratch = static_cast<unsigned char*>(*mem);",
            "  }",
            f"  const int err = {sym}_run(stream, inputs, outputs, scratch);",
            "  if (err != 0)",
            "    return ffi::Error(ffi::ErrorCode::kInternal,",
            f'                      std::string("mirage_jax {sym}: ") +',
            "                          cudaGetErrorString(static_cast<cudaError_t>(err)));",
            "  return ffi::Error::Success();",
            "}",
            "",
            f"XLA_FFI_DEFINE_HANDLER_SYMBOL({sym}, {sym}_ffi,",
            "                              ffi::Ffi::Bind()",
            "                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()",
            "                                  .Ctx<ffi::ScratchAllocator>()",
            *(f"                                  {b}" for b in binds[:-1]),
            f"                                  {binds[-1]});",
            "#endif",
        ]
        return head + emu + ffi

    def _ct(self, v: int) -> str:
        return CTYPE[self.g.types[v].dtype]

    def input(self, v: int, index: int) -> None:
        ct = self._ct(v)
        self.lines.append(f"const {ct}* const t{v} = reinterpret_cast<const {ct}*>("
                          f"inputs[{index}]);  // {self.g.types[v]}")  # fmt: skip

    def copy_output(self, k: int, v: int) -> None:
        self.lines.append(f"MJ_MEMCPY(outputs[{k}], t{v}, {self.g.types[v].nbytes}, stream);"
                          f"  // output {k}")  # fmt: skip

    def reshape(self, node: Node) -> None:
        v, src = node.outs[0], node.ins[0]
        const = "const " if self.storage.root(src) in self.storage.input_index else ""
        self.lines.append(f"{const}{self._ct(v)}* const t{v} = t{src};  // {_node_text(node)}")

    def declare(self, v: int) -> None:
        ct, st = self._ct(v), self.storage
        where = f"outputs[{st.output_of[v]}]" if v in st.output_of else f"scratch + {st.offset[v]}"
        self.lines.append(f"{ct}* const t{v} = reinterpret_cast<{ct}*>({where});"
                          f"  // {self.g.types[v]}")  # fmt: skip

    def compute(self, node: Node) -> None:
        emit = lookup(_KERNEL_OPS, node.op, "CUDA", "kernel")
        self.lines.append(f"// {_node_text(node)}")
        self.lines.extend(emit(self, node))

    def _launch(self, kernel: str, grid: str, threads: int, smem: str, args: list[str]) -> str:
        return f"MJ_LAUNCH(({kernel}), {grid}, dim3({threads}), {smem}, stream, {', '.join(args)});"

    def _blocks_for(self, work_items: int) -> str:
        return f"dim3({max(1, min(-(-work_items // KERNEL_THREADS), MAX_KERNEL_BLOCKS))})"

    def _graph_def(self, node: Node) -> list[str]:
        block: BlockGraph = node.attr("block")
        name = f"{self.symbol}_b{len(self.blocks)}"
        emitter = _BlockEmitter(block, name)
        self.blocks.append(emitter.source())
        smem = emitter.plan.smem_bytes
        args = [f"t{i}" for i in node.ins] + [f"t{v}" for v in node.outs]
        gx, gy, gz = block.grid
        out = []
        if smem > DEFAULT_SMEM_PER_BLOCK:
            out.append(f"MJ_SET_SMEM(({name}), {smem});")
        out.append(self._launch(name, f"dim3({gx}, {gy}, {gz})", emitter.nt, str(smem), args))
        return out

    def _elementwise(self, node: Node) -> list[str]:
        g, v = self.g, node.outs[0]
        t = g.types[v]
        if node.op in BINARY:
            a, b = node.ins
            shapes = ", ".join(_shape(g.types[x].shape) for x in (v, a, b))
            kernel = (f"mj::k_binary<{_functor(node.op)}, {shapes}, {self._ct(v)}, {self._ct(a)}, "
                      f"{self._ct(b)}>")  # fmt: skip
            args = [f"t{v}", f"t{a}", f"t{b}", _scalar(node)]
        else:
            x = node.ins[0]
            kernel = (f"mj::k_unary<{_functor(node.op)}, {_shape(t.shape)}, {self._ct(v)}, "
                      f"{self._ct(x)}>")  # fmt: skip
            args = [f"t{v}", f"t{x}", _scalar(node)]
        return [self._launch(kernel, self._blocks_for(t.size), KERNEL_THREADS, "0", args)]

    def _reduce(self, node: Node) -> list[str]:
        g, v, x = self.g, node.outs[0], node.ins[0]
        kernel = (f"mj::k_reduce<{_functor(node.op)}, {_shape(g.types[v].shape)}, "
                  f"{_shape(g.types[x].shape)}, {node.attr('dim')}, {self._ct(v)}, {self._ct(x)}>")
        grid = self._blocks_for(g.types[v].size * 32)
        return [self._launch(kernel, grid, KERNEL_THREADS, "0", [f"t{v}", f"t{x}"])]

    def _matmul(self, node: Node) -> list[str]:
        g, v = self.g, node.outs[0]
        a, b = node.ins
        ta, tb = g.types[a], g.types[b]
        m, n = ta.shape[-2], tb.shape[-1]
        batch = ta.size // (m * ta.shape[-1])
        if batch > MAX_GRID_YZ or -(-m // 64) > MAX_GRID_YZ:
            raise CompileError(f"CUDA backend: matmul {ta} @ {tb} has too many batches or rows "
                               "for one launch", remedy="leave this region to XLA")  # fmt: skip
        shapes = ", ".join(_shape(g.types[x].shape) for x in (a, b, v))
        cts = ", ".join(self._ct(x) for x in (a, b, v))
        kernel = f"mj::k_matmul<{shapes}, {cts}>"
        compute = "double" if DType.F64 in (ta.dtype, tb.dtype, g.types[v].dtype) else "float"
        grid = f"dim3({-(-n // 64)}, {-(-m // 64)}, {batch})"
        smem = f"mj::matmul_smem_bytes<{compute}>()"
        return [self._launch(kernel, grid, KERNEL_THREADS, smem, [f"t{v}", f"t{a}", f"t{b}"])]

    def _concat(self, node: Node) -> list[str]:
        g, v = self.g, node.outs[0]
        a, b = node.ins
        shapes = ", ".join(_shape(g.types[x].shape) for x in (v, a, b))
        cts = ", ".join(self._ct(x) for x in (v, a, b))
        kernel = f"mj::k_concat<{shapes}, {node.attr('dim')}, {cts}>"
        grid = self._blocks_for(g.types[v].size)
        return [self._launch(kernel, grid, KERNEL_THREADS, "0", [f"t{v}", f"t{a}", f"t{b}"])]

    def _transpose(self, node: Node) -> list[str]:
        g, v, x = self.g, node.outs[0], node.ins[0]
        perm = ", ".join(map(str, node.attr("perm")))
        kernel = (f"mj::k_transpose<{_shape(g.types[v].shape)}, {_shape(g.types[x].shape)}, "
                  f"{self._ct(v)}, {self._ct(x)}, {perm}>")  # fmt: skip
        grid = self._blocks_for(g.types[v].size)
        return [self._launch(kernel, grid, KERNEL_THREADS, "0", [f"t{v}", f"t{x}"])]

    def _slice(self, node: Node) -> list[str]:
        g, v, x = self.g, node.outs[0], node.ins[0]
        kernel = (f"mj::k_slice<{_shape(g.types[v].shape)}, {_shape(g.types[x].shape)}, "
                  f"{node.attr('dim')}, {node.attr('start')}, {self._ct(v)}, {self._ct(x)}>")
        grid = self._blocks_for(g.types[v].size)
        return [self._launch(kernel, grid, KERNEL_THREADS, "0", [f"t{v}", f"t{x}"])]


_KernelOp = Callable[[_KernelEmitter, Node], list[str]]
_KERNEL_OPS: dict[str, _KernelOp] = {
    "unary": _KernelEmitter._elementwise,
    "binary": _KernelEmitter._elementwise,
    "reduce": _KernelEmitter._reduce,
    "matmul": _KernelEmitter._matmul,
    "concat": _KernelEmitter._concat,
    "transpose": _KernelEmitter._transpose,
    "slice": _KernelEmitter._slice,
    "graph_def": _KernelEmitter._graph_def,
}


__all__ = [
    "MAX_SMEM_PER_BLOCK", "TABLE", "BlockPlan", "Buffer", "MatmulPlan", "Template", "ctype",
    "emit_cuda", "plan_block",
]  # fmt: skip
