"""The CPU emitter: a KernelGraph becomes one C++17 translation unit.

The generated code states only the graph's specifics - shapes, maps, the op sequence - as
instantiations of the header-only runtime in ``csrc/runtime/cpu/`` (``#include "cpu/mirage.h"``);
every loop lives in those headers. ``TABLE`` maps each ``Op`` to the runtime template it
instantiates. The layout of the translation unit:

- one ``block_<id>`` function per graph-defined kernel (after ``fuse_elementwise``): its tiles
  as local aligned arrays sized at compile time (``static thread_local`` when too large for a
  stack), loop-invariant tiles and ops hoisted before the for-loop, loop-varying loads, body ops
  and accumulator updates inside it, accumulator finishes and the epilogue after it, and the
  output savers per omap/fdim (inside the loop for body values saved along fdim);
- the exported (``MJ_EXPORT``: C linkage, default visibility) kernel with the fixed C ABI of
  ``cpu/abi.h``: views of the input and output buffers, kernel-level ops over whole tensors
  (``mj::k::...``, split over the caller's pool), graph-defined kernels run over all grid
  blocks with ``mj::for_each_block``. Intermediate tensors live in a workspace allocated once
  per kernel and reused; a reshape is an alias; an output is written in place by its producer
  (the storage plan of ``mirage_jax.backend.emit``, shared with the CUDA backend).

float32 and float64 are computed as they are. bfloat16 and float16 are storage types
(``mj::bf16``, ``mj::f16``): the kernel's input and output buffers hold them, while tiles,
accumulators and scratch tensors hold float, the loads and stores of tiles convert, and a value
is rounded to its half type where the reference interpreter rounds it (``ir.precision``: casts,
the results of matmuls and reductions and the operands of matmuls, where XLA writes them out);
scratch tensors rounded so are held in the half type. A half-precision input tile is copied
(converted), except one that only matmuls read: they read it in place and widen it in
registers (with AVX512_BF16, two bf16 operands multiply as bf16 pairs: exact products), and
so is a contiguous one that elementwise ops and reductions read. An elementwise tile rounded
as a matmul's operand is held in its half type.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from mirage_jax.backend.emit import (
    SECTION,
    KernelEmitter,
    Template,
    check_request,
    check_table,
    fusable_matmuls,
    indent,
    literal,
    lookup,
    node_text,
    op_functor,
    op_group,
    shape_type,
    thread_steps,
)
from mirage_jax.errors import CompileError
from mirage_jax.ir.fuse import fuse_elementwise
from mirage_jax.ir.graph import BlockGraph, KernelGraph, Node, Phase, ThreadGraph
from mirage_jax.ir.ops import ACCUMULATORS, ELEMENTWISE, NONE_DIM, REDUCTIONS, Op
from mirage_jax.ir.precision import HALF, materialised
from mirage_jax.ir.types import DType, TensorType

_CTYPE = {DType.F32: "float", DType.F64: "double", DType.BF16: "mj::bf16", DType.F16: "mj::f16",
          DType.BOOL: "mj::mask8"}  # fmt: skip
# stored narrow, computed in float: the half types and masks (a mask reads as 0 or 1)
_NARROW = HALF | {DType.BOOL}
_ALIGN = 64
_KERNEL_PARAMS = "const void* const* inputs, void* const* outputs, const mj_pool* pool"
# Tiles of one block beyond this many bytes go to thread-local storage instead of the stack.
_STACK_FRAME_LIMIT = 256 * 1024


# A Template's ``fn`` is called as ``mj::<fn>(...)`` inside a block and ``mj::k::<fn>(pool, ...)``
# in the kernel; its ``functor`` is the op functor (``mj::op::*``), reducer (``mj::*R``) or
# accumulator state type the entry point is instantiated with.
_REDUCER = {Op.REDUCE_SUM: "SumR", Op.REDUCE_MAX: "MaxR", Op.REDUCE_MEAN: "MeanR",
            Op.REDUCE_RMS: "RmsR"}  # fmt: skip
_ACCUMULATOR = {Op.ACC_SUM: "AccSum", Op.ACC_MEAN: "AccMean", Op.ACC_MAX: "AccMax",
                Op.ACC_RMS: "AccRms", Op.ACC_RESCALE_SUM: "AccRescaleSum"}  # fmt: skip

TABLE: dict[Op, Template] = {
    Op.INPUT: Template("View"),  # a typed view of inputs[i]
    Op.OUTPUT: Template("copy"),  # outputs[k] is the producer's storage, else a copy into it
    Op.GRAPH_DEF: Template("for_each_block"),  # runs block_<id> over the grid
    Op.INPUT_ITER: Template("load_tile"),
    Op.OUTPUT_SAVER: Template("store_tile"),
    Op.THREAD: Template("map", "<lambda of the thread graph>"),
    Op.RESHAPE: Template("reshape"),  # View::reshape: an alias, no copy
    Op.TRANSPOSE: Template("transpose"),
    Op.SLICE: Template("slice"),
    Op.CAST: Template("map", "mj::op::Cast"),
    Op.MATMUL: Template("matmul"),  # matmul_acc when it feeds an acc_sum directly
    Op.CONCAT: Template("concat"),
    **{op: Template("map", op_functor(op)) for op in Op if op in ELEMENTWISE},
    **{op: Template("reduce", f"mj::{name}") for op, name in _REDUCER.items()},
    **{op: Template("update", f"mj::{name}") for op, name in _ACCUMULATOR.items()},
}
check_table(TABLE, "CPU")


def reads_in_place(block: BlockGraph, value: int) -> bool:
    """Whether an input tile is read where it lies instead of copied: when only matmuls use
    it (they stream it from the tensor, widening a half-precision one in registers). The cost
    model prices tiles by the same rule."""
    users = block.users(value)
    if block.types[value].dtype is DType.BOOL:
        return False
    return bool(users) and all(u.op is Op.MATMUL for u in users)


def is_contiguous_tile(tile: tuple[int, ...], full: tuple[int, ...]) -> bool:
    """Whether a tile of a row-major tensor is one contiguous run of it: size-1 dims, then
    at most one split dim, then whole dims. Such a tile is used where it lies (no copy)."""
    k = next((d for d, n in enumerate(tile) if n != 1), len(tile))
    return all(tile[d] == full[d] for d in range(k + 1, len(tile)))


# Accumulators whose partial states over disjoint iterations combine (mj::AccFold::merge).
_MERGEABLE = frozenset({Op.ACC_SUM, Op.ACC_MEAN, Op.ACC_MAX, Op.ACC_RMS})
# Accumulator bytes of one block above which a split loop measured slower than any N-split
# grid on the 2-core Zen 4 (rmsnorm_linear bs=8, 384 KiB: 0.5x), while 48 KiB (bs=1) and
# 256 KiB (gated_mlp bs=1) ran as fast as the best grid.
_SPLIT_STATE_LIMIT = 256 * 1024


def splits_loop(block: BlockGraph) -> bool:
    """Whether the runtime may split the block's for-loop over threads
    (``mj::for_each_block_split``): a loop of 2+ iterations that only folds mergeable
    accumulators of at most ``_SPLIT_STATE_LIMIT`` bytes, no loop-invariant work but input
    tiles (every part would redo it), and savers only after the loop (a saver in the loop, or
    of a loop-invariant value, would be written by every part)."""
    accs = [n for n in block.nodes if n.op in ACCUMULATORS]
    if block.forloop_range < 2 or not accs or any(n.op not in _MERGEABLE for n in accs):
        return False
    if sum(block.types[n.outs[0]].nbytes for n in accs) > _SPLIT_STATE_LIMIT:
        return False
    phases = block.phases()
    if any(phases[n.outs[0]] is Phase.INVARIANT and n.op is not Op.INPUT_ITER
           for n in block.nodes if n.outs):  # fmt: skip
        return False  # every part would compute it again (a hoisted matmul: 2x the work)
    return all(phases[n.ins[0]] is Phase.EPILOGUE for n in block.nodes_of(Op.OUTPUT_SAVER))


def emit_cpu(graph: KernelGraph, symbol: str) -> str:
    """C++ source defining ``extern "C" int <symbol>(inputs, outputs, pool)`` for ``graph``."""
    check_request(graph, symbol, "emit_cpu")
    return _KernelEmitter(graph, symbol).source()


# ------------------------------------------------------------------------------ C++ spelling


def _ctype(t: TensorType, op: Op) -> str:
    """The C++ element type a buffer of ``t`` is stored in."""
    if t.dtype not in _CTYPE:
        raise CompileError(
            f"CPU backend: {op.value} on {t.dtype.value} tensors is not supported",
            remedy="run the region in float32 (cast at its boundary) or leave it to XLA",
        )
    return _CTYPE[t.dtype]


def _compute_ctype(t: TensorType, op: Op) -> str:
    """The C++ element type ``t`` is computed in: float for the half types (tiles, scratch)."""
    return "float" if t.dtype in _NARROW else _ctype(t, op)


def _tile_bytes(t: TensorType) -> int:
    """Bytes of a tile or scratch tensor of ``t`` (in its compute type)."""
    return t.size * 4 if t.dtype in _NARROW else t.nbytes


def _round(t: TensorType) -> str | None:
    """The functor rounding a float value to ``t``'s half type, or None for other dtypes."""
    return f"mj::op::Round<{_CTYPE[t.dtype]}>{{}}" if t.dtype in HALF else None


_shape = shape_type


def _map(m: tuple[int, ...]) -> str:
    return f"mj::Map<{','.join(map(str, m))}>"


def _literal(x: float) -> str:
    return literal(x, nan="mj::kNaN", inf="mj::kInf")


def _functor(node: Node, types: tuple[TensorType, ...]) -> str:
    """The op functor of an elementwise node (unary, binary or cast)."""
    op = node.op
    if op is Op.CAST:
        return _round(types[node.outs[0]]) or f"mj::op::Cast<{_ctype(types[node.outs[0]], op)}>{{}}"
    if op is Op.POW_SCALAR:
        e = node.attr("exponent")
        if float(e).is_integer() and abs(e) <= 64:
            return f"mj::op::PowInt<{int(e)}>{{}}"
        # not Sqrt / Rsqrt for +-0.5: pow(-0, 0.5) is +0 and pow(-inf, 0.5) is +inf
        return f"mj::op::PowScalar{{{_literal(e)}}}"
    if op.info.scalar_attr:  # the other scalar ops and the masks' fills
        return f"{TABLE[op].functor}{{{_literal(node.attr(op.info.scalar_attr))}}}"
    return f"{TABLE[op].functor}{{}}"


def _thread_lambda(graph: ThreadGraph) -> str:
    """A generic lambda evaluating the fused chain; called on SIMD vectors and on scalars."""
    params = ", ".join(f"auto x{n.outs[0]}" for n in graph.inputs)
    stmts = []
    steps, result = thread_steps(graph)
    for n in steps:
        if n.op not in TABLE or TABLE[n.op].fn != "map":
            raise CompileError(f"CPU backend: {n.op.value} cannot appear in a thread graph")
        args = ", ".join(f"x{i}" for i in n.ins)
        stmts.append(f"const auto x{n.outs[0]} = {_functor(n, graph.types)}({args});")
    stmts.append(f"return x{result};")
    if sum(map(len, stmts)) <= 60:
        fn = f"[]({params}) {{ {' '.join(stmts)} }}"
    else:
        fn = "\n".join([f"[]({params}) {{", *("  " + s for s in stmts), "}"])
    # A cast inside changes the element type mid-chain: run it on scalars only.
    return f"mj::ScalarOnly{{{fn}}}" if graph.nodes_of(Op.CAST) else fn


def _check_dtypes(graph: BlockGraph | KernelGraph | ThreadGraph) -> None:
    """Every value a computing node touches has a C++ type (so errors name that node)."""
    for node in graph.nodes:
        if node.op in (Op.INPUT, Op.OUTPUT):
            continue
        for v in node.ins + node.outs:
            _ctype(graph.types[v], node.op)
        if node.op is Op.GRAPH_DEF:
            _check_dtypes(node.attr("block"))
        if node.op is Op.THREAD:
            _check_dtypes(node.attr("graph"))


# ---------------------------------------------------------------------------- kernel level


class _KernelEmitter(KernelEmitter):
    """The exported kernel: views of the buffers the storage plan names, one statement a node."""

    scratch_align = _ALIGN
    prefix = "v"

    def scratch_nbytes(self, t: TensorType) -> int:
        return _tile_bytes(t)

    def computed_in_output(self, v: int) -> bool:
        # a half-precision output that other ops read too: they read it unrounded (as XLA's
        # multi-output fusions do), so it is computed in float and rounded as it is copied
        users = [u for u in self.g.users(v) if u.op is not Op.OUTPUT]
        return self.g.types[v].dtype not in _NARROW or not users

    def _stored(self, v: int) -> str:
        """The C++ element type of v's memory: its dtype's in the kernel's own buffers (inputs,
        outputs) and for half-precision values rounded where they are written
        (``ir.precision``: read as half as many bytes), its compute type in other scratch."""
        t, root = self.g.types[v], self.storage.root(v)
        producer = self.g.producer(root)
        if (root in self.storage.input_index or root in self.storage.output_of
                or (t.dtype in HALF and materialised(self.g, producer))):  # fmt: skip
            return _ctype(t, producer.op)
        return _compute_ctype(t, producer.op)

    def source(self) -> str:
        _check_dtypes(self.g)
        self.walk()
        head = [self.banner(__name__), '#include "cpu/mirage.h"', ""]
        blocks = ["namespace {", "", *self.blocks, "}  // namespace", ""] if self.blocks else []
        body = []
        workspace = self.storage.scratch_bytes
        if workspace:
            body += [f"static mj::Workspace<{workspace}> workspace;",
                     "const auto ws = workspace.lease();"]  # fmt: skip
        body += self.lines
        kernel = [
            f"MJ_EXPORT int {self.symbol}({_KERNEL_PARAMS}) {{",
            "  return mj::guard([&] {",
            *indent(body, "    "),
            "  });",
            "}",
        ]
        return "\n".join(head + blocks + kernel) + "\n"

    def _view(self, v: int, where: str, const: bool = False) -> None:
        t = self.g.types[v]
        ct = self._stored(v)
        elem = f"const {ct}" if const else ct
        self.lines.append(f"const mj::View<{elem}, {_shape(t.shape)}> {self.var(v)}({where});")

    def input(self, v: int, index: int) -> None:
        self._view(v, f"inputs[{index}]", const=True)

    def copy_output(self, k: int, v: int) -> None:
        t = self.g.types[v]
        self.lines.append(
            f"const mj::View<{_ctype(t, Op.OUTPUT)}, {_shape(t.shape)}> o{k}(outputs[{k}]);"
        )
        self.lines.append(f"mj::k::copy(pool, o{k}, {self.var(v)});  // output {k}")

    def reshape(self, node: Node) -> None:
        v = node.outs[0]
        self.lines.append(
            f"const auto {self.var(v)} = {self.var(node.ins[0])}"
            f".reshape<{_shape(self.g.types[v].shape)}>();  // {node_text(node)}"
        )

    def declare(self, v: int) -> None:
        st = self.storage
        if v in st.output_of:
            self._view(v, f"outputs[{st.output_of[v]}]")
        else:
            self._view(v, f"ws.at<{self._stored(v)}>({st.offset[v]})")

    def compute(self, node: Node) -> None:
        emit = lookup(_KERNEL_OPS, node.op, "CPU", "kernel")
        ins = [self.var(i) for i in node.ins]
        out = self.var(node.outs[0]) if node.outs else ""
        self.lines.append(f"{emit(self, node, out, ins)};  // {node_text(node)}")
        if node.op is Op.MATMUL or node.op in REDUCTIONS:
            v = node.outs[0]
            rounding = _round(self.g.types[v])
            if rounding and self._stored(v) == "float":  # a bf16 / f16 buffer rounds itself
                self.lines.append(f"mj::k::map(pool, {rounding}, {out}, {out});  // round")

    def _graph_def(self, node: Node, out: str, ins: list[str]) -> str:
        block = node.attr("block")
        fname = f"block_{node.outs[0]}"
        stored = [self._stored(v) for v in (*node.ins, *node.outs)]
        emitter = _BlockEmitter(block, fname, stored)
        self.blocks.append(emitter.source())
        data = ", ".join([*(f"{a}.data" for a in ins),
                          *(f"{self.var(v)}.data" for v in node.outs)])  # fmt: skip
        gx, gy, gz = block.grid
        if not emitter.split:
            return (f"mj::for_each_block<{gx}, {gy}, {gz}>(pool, "
                    f"[&](const mj::BlockIdx& b) {{ {fname}(b, {data}); }})")  # fmt: skip
        st = f"{fname}_state"
        return (
            f"mj::for_each_block_split<{gx}, {gy}, {gz}, {block.forloop_range}, {st}>(pool, "
            f"[&](const mj::BlockIdx& b, {st}& s, mj::i64 i0, mj::i64 i1) "
            f"{{ {fname}_loop(b, s, i0, i1, {data}); }}, "
            f"[]({st}& s, const {st}& o) {{ {fname}_merge(s, o); }}, "
            f"[&](const mj::BlockIdx& b, {st}& s) {{ {fname}_post(b, s, {data}); }})"
        )


def _map_call(e: _KernelEmitter, n: Node, out: str, ins: list[str]) -> str:
    return f"mj::k::map(pool, {_functor(n, e.g.types)}, {out}, " + ", ".join(ins) + ")"


_KernelOp = Callable[[_KernelEmitter, Node, str, list[str]], str]
_KERNEL_OPS: dict[str, _KernelOp] = {
    "unary": _map_call,
    "binary": _map_call,
    "reduce": lambda e, n, out, ins: (
        f"mj::k::reduce<{TABLE[n.op].functor}, {n.attr('dim')}>(pool, {out}, {ins[0]})"
    ),
    "matmul": lambda e, n, out, ins: f"mj::k::matmul(pool, {out}, {ins[0]}, {ins[1]})",
    "concat": lambda e, n, out, ins: (
        f"mj::k::concat<{n.attr('dim')}>(pool, {out}, {ins[0]}, {ins[1]})"
    ),
    "transpose": lambda e, n, out, ins: (
        f"mj::k::transpose<mj::Perm<{','.join(map(str, n.attr('perm')))}>>(pool, {out}, {ins[0]})"
    ),
    "slice": lambda e, n, out, ins: (
        f"mj::k::slice<{n.attr('dim')}, {n.attr('start')}>(pool, {out}, {ins[0]})"
    ),
    "graph_def": lambda e, n, out, ins: e._graph_def(n, out, ins),
}


# ----------------------------------------------------------------------------- block level


class _BlockEmitter:
    """One graph-defined kernel as a per-block C++ function."""

    def __init__(self, block: BlockGraph, fname: str, stored: list[str]) -> None:
        self.g = fuse_elementwise(block)
        self.fname = fname
        self.stored = stored  # C++ element types of the operands' and outputs' memory
        self.phase = self.g.phases()
        self.decls: list[str] = []
        self.frame_bytes = 0
        self.sections: dict[str, list[str]] = {"pre": [], "loop": [], "post": []}
        self.pre, self.loop, self.post = (self.sections[k] for k in ("pre", "loop", "post"))
        self.name: dict[int, str] = {}
        # matmul value -> the acc_sum value it accumulates into (mj::matmul_acc)
        self.fused_acc = fusable_matmuls(self.g, self.phase)
        self.fused_map: dict[int, Node] = {}  # elementwise value -> the node producing it
        self.direct_out: dict[int, int] = {}  # value computed in its output -> saver number
        self.split = splits_loop(block)

    def source(self) -> str:
        g = self.g
        self._find_map_reduce()
        self._find_direct_outputs()
        savers = 0
        for node in g.nodes:
            self._node(node, savers)
            savers += node.op is Op.OUTPUT_SAVER
        params = ["const mj::BlockIdx& b"]
        n_in = len(g.arg_types)
        params += [f"const {self.stored[i]}* in{i}" for i in range(n_in)]
        params += [f"{self.stored[n_in + k]}* out{k}" for k in range(len(g.output_types))]
        if self.split:
            return self._split_source(params)
        storage = "static thread_local " if self.frame_bytes > _STACK_FRAME_LIMIT else ""
        r = g.forloop_range
        gx, gy, gz = g.grid
        loop = [f"for (mj::i64 i = 0; i < {r}; ++i) {{", *indent(self.loop, "  "), "}"]
        lines = [
            f"// grid=({gx},{gy},{gz}) forloop_range={r}",
            f"void {self.fname}({', '.join(params)}) {{",
            *(f"  {storage}{d}" for d in self.decls),
            *indent(self.pre + (loop if self.loop else []) + self.post, "  "),
            "}",
            "",
        ]
        return "\n".join(lines)

    def _split_source(self, params: list[str]) -> str:
        """The block as a state struct and loop / merge / post functions, for
        mj::for_each_block_split (see splits_loop)."""
        f, g = self.fname, self.g
        names = [re.sub(r".*\s(\w+);$", r"\1", d) for d in self.decls]
        accs = [n for n in names if n.startswith("a")]
        b, rest = params[0], params[1:]
        state = f"{f}_state& s"
        loop = ["for (mj::i64 i = i0; i < i1; ++i) {", *indent(self.loop, "  "), "}"]
        loop = self.pre + loop
        # the epilogue needs the loop-invariant views again (they are not in the state)
        post = [line for line in self.pre if line.startswith("const auto ")] + self.post

        def bind(body: list[str]) -> list[str]:
            text = "\n".join(body)
            return [f"auto& {n} = s.{n};" for n in names if re.search(rf"\b{n}\b", text)]

        gx, gy, gz = g.grid
        lines = [
            f"// grid=({gx},{gy},{gz}) forloop_range={g.forloop_range}, split over iterations",
            f"struct {f}_state {{", *(f"  {d}" for d in self.decls), "};",
            f"void {f}_loop({', '.join([b, state, 'mj::i64 i0', 'mj::i64 i1', *rest])}) {{",
            *indent(bind(loop) + loop, "  "),
            "}",
            f"void {f}_merge({state}, const {f}_state& o) {{",
            *(f"  s.{a}.merge(o.{a});" for a in accs),
            "}",
            f"void {f}_post({', '.join([b, state, *rest])}) {{",
            *indent(bind(post) + post, "  "),
            "}",
            "",
        ]
        return "\n".join(lines)

    def _find_map_reduce(self) -> None:
        """An elementwise value whose only use is a reduction over the last dim is folded as
        it is computed (mj::map_reduce) instead of stored as a tile and read back."""
        g = self.g
        for n in g.nodes:
            if n.op not in REDUCTIONS:
                continue
            x = n.ins[0]
            p = g.producer(x)
            if (
                op_group(p.op) in _ELEMENTWISE
                and len(g.users(x)) == 1
                and n.attr("dim") == len(g.types[x].shape) - 1
                and self.phase[x] is self.phase[n.outs[0]]
            ):
                self.fused_map[x] = p

    def _find_direct_outputs(self) -> None:
        """A value used only by its output saver, whose tile is a contiguous run of the output
        tensor, is computed straight into the output (no tile, no store)."""
        g = self.g
        savers = g.nodes_of(Op.OUTPUT_SAVER)
        for k, saver in enumerate(savers):
            v = saver.ins[0]
            p = g.producer(v)
            if (
                op_group(p.op) in _DIRECT_WRITERS
                and len(g.users(v)) == 1
                and v not in self.fused_acc
                and g.types[v].dtype not in _NARROW  # computed in float, stored converted
                and is_contiguous_tile(g.types[v].shape, g.output_types[k].shape)
            ):
                self.direct_out[v] = k

    def _saver_args(self, k: int) -> tuple[str, str]:
        """The <Full, OMap, FDim> of saver k's tile and its loop-iteration argument."""
        saver = self.g.nodes_of(Op.OUTPUT_SAVER)[k]
        full = self.g.output_types[k].shape
        tmpl = f"<{_shape(full)}, {_map(saver.attr('omap'))}, {saver.attr('fdim')}"
        return tmpl, "i" if self.phase[saver.ins[0]] is Phase.BODY else "0"

    def _output_view(self, v: int) -> str:
        k = self.direct_out[v]
        tmpl, it = self._saver_args(k)
        tile = _shape(self.g.types[v].shape)
        self._where(v).append(f"const auto t{v} = mj::tile_view{tmpl}, {tile}>(out{k}, b, {it});")
        self.name[v] = f"t{v}"
        return self.name[v]

    def _tile(self, v: int, op: Op) -> str:
        t = self.g.types[v]
        if self._narrow_operand(v, op):
            ctype, nbytes = _CTYPE[t.dtype], t.nbytes
        else:
            ctype, nbytes = _compute_ctype(t, op), _tile_bytes(t)
        self.decls.append(f"mj::Tile<{ctype}, {_shape(t.shape)}> t{v};")
        self.frame_bytes += nbytes
        self.name[v] = f"t{v}"
        return self.name[v]

    def _viewable(self, v: int) -> bool:
        """Whether input tile v may be used where it lies (when contiguous): in its compute
        type, or in a half type that its users widen as they read (elementwise ops,
        reductions, matmuls)."""
        dtype = self.g.types[v].dtype
        if dtype not in _NARROW:
            return True
        return dtype in HALF and all(
            op_group(u.op) in _ELEMENTWISE or u.op in REDUCTIONS or u.op is Op.MATMUL
            for u in self.g.users(v))  # fmt: skip

    def _narrow_operand(self, v: int, op: Op) -> bool:
        """Whether elementwise value v of a half type is held in that type: where it is
        rounded to it as a matmul's operand (``ir.precision``; two bf16 operands then multiply
        as pairs, and reductions widen it as they read)."""
        return (self.g.types[v].dtype in HALF and op_group(op) in _ELEMENTWISE
                and materialised(self.g, self.g.producer(v)))  # fmt: skip

    def _where(self, v: int) -> list[str]:
        return self.sections[SECTION[self.phase[v]]]

    def _node(self, node: Node, saver_index: int) -> None:
        g, op = self.g, node.op
        text = node_text(node)
        if op is Op.INPUT_ITER:
            v = node.outs[0]
            arg, fdim = node.attr("arg"), node.attr("fdim")
            full = g.arg_types[arg].shape
            it = "i" if fdim != NONE_DIM else "0"
            tmpl = f"<{_shape(full)}, {_map(node.attr('imap'))}, {fdim}"
            tile = _shape(g.types[v].shape)
            if reads_in_place(g, v):
                self.name[v] = f"t{v}"
                stmt = f"const auto t{v} = mj::tile_ref{tmpl}, {tile}>(in{arg}, b, {it});"
            elif self._viewable(v) and is_contiguous_tile(g.types[v].shape, full):
                self.name[v] = f"t{v}"
                stmt = f"const auto t{v} = mj::tile_view{tmpl}, {tile}>(in{arg}, b, {it});"
            else:
                stmt = f"mj::load_tile{tmpl}>({self._tile(v, op)}, in{arg}, b, {it});"
            self._where(v).append(f"{stmt}  // {text}")
            return
        if op is Op.OUTPUT_SAVER:
            self._saver(node, saver_index, text)
            return
        if op in ACCUMULATORS:
            self._accumulator(node, text)
            return
        v = node.outs[0]
        if v in self.fused_map:
            return  # computed inside the reduction that uses it
        if op in REDUCTIONS and node.ins[0] in self.fused_map:
            self._map_reduce(node, text)
            return
        ins = [self.name[i] for i in node.ins]
        if v in self.fused_acc:
            acc = self.fused_acc[v]
            self.loop.append(f"mj::matmul_acc(a{acc}.out, {ins[0]}, {ins[1]});  // {text}")
            return
        out = self._output_view(v) if v in self.direct_out else self._tile(v, op)
        emit = lookup(_BLOCK_OPS, op, "CPU", "block")
        self._where(v).append(f"{emit(self, node, out, ins)};  // {text}")
        if op is Op.MATMUL or op in REDUCTIONS:
            self._round(v, out)

    def _round(self, v: int, name: str) -> None:
        """A matmul's or a reduction's float result rounded to its half type (see the module
        docstring), where its dtype is one."""
        rounding = _round(self.g.types[v])
        if rounding:
            self._where(v).append(f"mj::map({rounding}, {name}, {name});  // round")

    def _map_reduce(self, node: Node, text: str) -> None:
        g, v, x = self.g, node.outs[0], node.ins[0]
        p = self.fused_map[x]
        f = _thread_lambda(p.attr("graph")) if p.op is Op.THREAD else _functor(p, g.types)
        ins = ", ".join(self.name[i] for i in p.ins)
        out = self._tile(v, node.op)
        stmt = (f"mj::map_reduce<{TABLE[node.op].functor}, {_shape(g.types[x].shape)}>"
                f"({out}, {f}, {ins});")  # fmt: skip
        self._where(v).append(f"{stmt}  // {text} of {node_text(p)}")
        self._round(v, out)

    def _saver(self, node: Node, k: int, text: str) -> None:
        v = node.ins[0]
        if v in self.direct_out:
            return  # its producer wrote it in place
        tmpl, it = self._saver_args(k)
        stmt = f"mj::store_tile{tmpl}>(out{k}, {self.name[v]}, b, {it});"
        (self.loop if self.phase[v] is Phase.BODY else self.post).append(f"{stmt}  // {text}")

    def _accumulator(self, node: Node, text: str) -> None:
        g, op = self.g, node.op
        v, x = node.outs[0], node.ins[0]
        ct = _compute_ctype(g.types[v], op)
        r = g.forloop_range
        xs = _shape(g.types[x].shape)
        if op is Op.ACC_RESCALE_SUM:
            ms = _shape(g.types[node.ins[1]].shape)
            decl = f"mj::AccRescaleSum<{ct}, {xs}, {ms}, {r}> a{v};"
            self.frame_bytes += _tile_bytes(g.types[x]) + 4 * _tile_bytes(g.types[node.ins[1]])
        else:
            decl = f"{TABLE[op].functor}<{ct}, {xs}, {node.attr('dim')}, {r}> a{v};"
            self.frame_bytes += _tile_bytes(g.types[v])
        self.decls.append(decl)
        self.name[v] = f"a{v}.out"
        self.pre.append(f"a{v}.init();")
        if x not in self.fused_acc:
            args = ", ".join(self.name[i] for i in node.ins)
            self.loop.append(f"a{v}.update({args});  // {text}")
        self.post.append(f"a{v}.finish();")
        rounding = _round(g.types[v])
        if rounding:
            self.post.append(f"mj::map({rounding}, a{v}.out, a{v}.out);  // round")


# Block ops (by op_group) whose runtime entry writes any dense row-major output (a Tile or a
# View), and the elementwise ones among them (mj::map).
_ELEMENTWISE = ("unary", "binary", "thread")
_DIRECT_WRITERS = (*_ELEMENTWISE, "matmul", "concat")


def _block_map(e: _BlockEmitter, n: Node, out: str, ins: list[str]) -> str:
    return f"mj::map({_functor(n, e.g.types)}, {out}, {', '.join(ins)})"


_BlockOp = Callable[[_BlockEmitter, Node, str, list[str]], str]
_BLOCK_OPS: dict[str, _BlockOp] = {
    "unary": _block_map,
    "binary": _block_map,
    "thread": lambda e, n, out, ins: (
        f"mj::map({_thread_lambda(n.attr('graph'))}, {out}, {', '.join(ins)})"
    ),
    "reduce": lambda e, n, out, ins: (
        f"mj::reduce<{TABLE[n.op].functor}, {n.attr('dim')}>({out}, {ins[0]})"
    ),
    "matmul": lambda e, n, out, ins: f"mj::matmul({out}, {ins[0]}, {ins[1]})",
    "concat": lambda e, n, out, ins: f"mj::concat<{n.attr('dim')}>({out}, {ins[0]}, {ins[1]})",
}


__all__ = ["TABLE", "Template", "emit_cpu", "reads_in_place", "splits_loop"]
