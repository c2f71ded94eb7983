"""Shape and dtype rules, one function per op family, applied whenever a node is built.

``infer`` returns the output types of a node from its input types and attributes, or raises a
``GraphError`` that names the node, the offending tensor/dimension and what would fix it.
Block-level iterators need the block's grid and loop range, passed in ``BlockContext``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from mirage_jax.errors import GraphError
from mirage_jax.ir.ops import (
    ACCUMULATORS,
    BINARY,
    MASKED,
    NONE_DIM,
    REDUCTIONS,
    UNARY,
    Op,
)
from mirage_jax.ir.types import DType, TensorType


@dataclass(frozen=True)
class BlockContext:
    """What block-level shape rules need beyond the node itself."""

    grid: tuple[int, int, int]
    forloop_range: int
    arg_types: tuple[TensorType, ...]


def _fail(op: Op, msg: str, remedy: str | None = None) -> GraphError:
    return GraphError(f"{op.value}: {msg}", remedy=remedy)


def _same_dtype(op: Op, types: tuple[TensorType, ...]) -> DType:
    dtypes = {t.dtype for t in types}
    if len(dtypes) != 1:
        raise _fail(op, f"operand dtypes differ: {', '.join(str(t) for t in types)}",
                    "insert a cast so both operands have one dtype")  # fmt: skip
    return types[0].dtype


def _check_dim(op: Op, t: TensorType, dim: int, what: str = "dim") -> None:
    if not isinstance(dim, int) or not 0 <= dim < t.rank:
        raise _fail(op, f"{what}={dim} is out of range for a rank-{t.rank} tensor {t}")


def _broadcast(op: Op, a: TensorType, b: TensorType) -> TensorType:
    dtype = _same_dtype(op, (a, b))
    if a.rank != b.rank:
        raise _fail(op, f"operand ranks differ ({a} vs {b})",
                    "reshape the lower-rank operand to add size-1 dimensions")  # fmt: skip
    shape = []
    for i, (x, y) in enumerate(zip(a.shape, b.shape)):
        if x != y and 1 not in (x, y):
            raise _fail(op, f"dim {i} cannot broadcast: {a} vs {b}")
        shape.append(max(x, y))
    return TensorType(tuple(shape), dtype)


def _reduced(t: TensorType, dim: int) -> TensorType:
    return t.with_shape(t.shape[:dim] + (1,) + t.shape[dim + 1 :])


def _matmul(op: Op, a: TensorType, b: TensorType) -> TensorType:
    dtype = _same_dtype(op, (a, b))
    if a.rank < 2 or a.rank != b.rank:
        raise _fail(op, f"needs two operands of equal rank >= 2, got {a} and {b}")
    if a.shape[:-2] != b.shape[:-2]:
        raise _fail(op, f"batch dims differ: {a} vs {b}")
    if a.shape[-1] != b.shape[-2]:
        raise _fail(op, f"contracting dims differ: {a} has k={a.shape[-1]}, {b} has k={b.shape[-2]}")
    return TensorType(a.shape[:-1] + (b.shape[-1],), dtype)


def _concat(op: Op, a: TensorType, b: TensorType, dim: int) -> TensorType:
    dtype = _same_dtype(op, (a, b))
    _check_dim(op, a, dim)
    if a.rank != b.rank or any(
        x != y for i, (x, y) in enumerate(zip(a.shape, b.shape)) if i != dim
    ):
        raise _fail(op, f"shapes {a} and {b} differ outside dim {dim}")
    shape = list(a.shape)
    shape[dim] += b.shape[dim]
    return TensorType(tuple(shape), dtype)


def _check_map(op: Op, m: Any, name: str) -> tuple[int, int, int]:
    if not (isinstance(m, tuple) and len(m) == 3 and all(isinstance(x, int) for x in m)):
        raise _fail(op, f"{name} must be a tuple of 3 ints (one per grid axis x, y, z), got {m!r}")
    used = [d for d in m if d != NONE_DIM]
    if len(used) != len(set(used)):
        raise _fail(op, f"{name}={m} maps two grid axes to one tensor dim")
    return m


def input_iter_tile(
    arg: int, imap: tuple[int, int, int], fdim: int, ctx: BlockContext
) -> TensorType:
    """The tile one block sees of kernel input ``arg`` in one loop iteration."""
    op = Op.INPUT_ITER
    if not 0 <= arg < len(ctx.arg_types):
        raise _fail(op, f"arg={arg} but the block graph has {len(ctx.arg_types)} inputs")
    t = ctx.arg_types[arg]
    _check_map(op, imap, "imap")
    shape = list(t.shape)
    for axis, dim in enumerate(imap):
        if dim == NONE_DIM:
            continue
        _check_dim(op, t, dim, f"imap[{'xyz'[axis]}]")
        parts = ctx.grid[axis]
        if shape[dim] % parts:
            raise _fail(
                op,
                f"input {arg} {t}: dim {dim} (size {t.shape[dim]}) does not divide by grid axis "
                f"{'xyz'[axis]} = {parts}",
                "choose a grid size that divides the mapped dimension, or map another dimension",
            )
        shape[dim] //= parts
    if fdim != NONE_DIM:
        _check_dim(op, t, fdim, "fdim")
        if fdim in imap:
            raise _fail(op, f"input {arg}: fdim={fdim} is also partitioned by imap={imap}")
        if shape[fdim] % ctx.forloop_range:
            raise _fail(
                op,
                f"input {arg} {t}: tile dim {fdim} (size {shape[fdim]}) does not divide by "
                f"forloop_range={ctx.forloop_range}",
                "choose a forloop range that divides the loop dimension",
            )
        shape[fdim] //= ctx.forloop_range
    return t.with_shape(tuple(shape))


def saved_output(
    tile: TensorType, omap: tuple[int, int, int], fdim: int, ctx: BlockContext
) -> TensorType:
    """The full kernel output an output saver assembles from every block's tile."""
    op = Op.OUTPUT_SAVER
    _check_map(op, omap, "omap")
    shape = list(tile.shape)
    for axis, dim in enumerate(omap):
        if dim == NONE_DIM:
            if ctx.grid[axis] > 1:
                raise _fail(
                    op,
                    f"grid axis {'xyz'[axis]} = {ctx.grid[axis]} is not mapped by omap={omap}: "
                    "every block along it would write the same output tile",
                    "map that grid axis to an output dimension",
                )
            continue
        _check_dim(op, tile, dim, f"omap[{'xyz'[axis]}]")
        shape[dim] *= ctx.grid[axis]
    if fdim != NONE_DIM:
        _check_dim(op, tile, fdim, "fdim")
        if fdim in omap:
            raise _fail(op, f"fdim={fdim} is also partitioned by omap={omap}")
        shape[fdim] *= ctx.forloop_range
    return tile.with_shape(tuple(shape))


Rule = Callable[[Op, tuple[TensorType, ...], Mapping[str, Any], "BlockContext | None"],
                tuple[TensorType, ...]]  # fmt: skip


def infer(
    op: Op,
    ins: tuple[TensorType, ...],
    attrs: Mapping[str, Any],
    ctx: BlockContext | None = None,
) -> tuple[TensorType, ...]:
    """Output types of ``op`` applied to ``ins``; raises GraphError when they do not fit."""
    arity = op.info.arity
    if arity is not None and len(ins) != arity:
        raise _fail(op, f"takes {arity} operand(s), got {len(ins)}")
    if op in MASKED:
        return (_masked(op, *ins),)
    if op not in _TAKES_MASKS and any(t.dtype is DType.BOOL for t in ins):
        raise _fail(op, f"takes no bool operand: {', '.join(map(str, ins))}",
                    "bool tensors are masks: the first operand of where / where_not")  # fmt: skip
    if op in UNARY:
        return (ins[0],)
    if op in BINARY:
        return (_broadcast(op, *ins),)
    if op in REDUCTIONS:
        _check_dim(op, ins[0], attrs["dim"])
        return (_reduced(ins[0], attrs["dim"]),)
    if op in ACCUMULATORS:
        return _accumulator(op, ins, attrs)
    return _SPECIAL[op](op, ins, attrs, ctx)


def masked_dtype(op: Op, dtypes: tuple[DType, ...]) -> DType | None:
    """The result dtype of an elementwise op over operands of ``dtypes``, or None where the
    enumerator must not build it (mixed dtypes; a bool anywhere but a mask's place)."""
    if op in MASKED:
        return dtypes[1] if dtypes[0] is DType.BOOL and dtypes[1] is not DType.BOOL else None
    if DType.BOOL in dtypes or len(set(dtypes)) != 1:
        return None
    return dtypes[0]


def _masked(op: Op, m: TensorType, x: TensorType) -> TensorType:
    dtype = masked_dtype(op, (m.dtype, x.dtype))
    if dtype is None:
        raise _fail(op, f"takes a bool mask and a float value, got {m} and {x}")
    return _broadcast(op, TensorType(m.shape, dtype), x)


# ops whose operands may be bool: a mask's way from a region input to a where (no op computes
# a bool, and none is an output)
_TAKES_MASKS = frozenset({Op.RESHAPE, Op.INPUT_ITER, Op.GRAPH_DEF, Op.THREAD})


def _accumulator(
    op: Op, ins: tuple[TensorType, ...], attrs: Mapping[str, Any]
) -> tuple[TensorType, ...]:
    if op is Op.ACC_RESCALE_SUM:
        x, m = ins
        _same_dtype(op, ins)
        if m.rank != x.rank or any(a not in (1, b) for a, b in zip(m.shape, x.shape)):
            raise _fail(op, f"the max operand {m} does not broadcast to the value {x}")
        return (x,)
    dim = attrs.get("dim", NONE_DIM)
    if dim == NONE_DIM:
        return (ins[0],)
    _check_dim(op, ins[0], dim)
    return (_reduced(ins[0], dim),)


def _reshape(op, ins, attrs, ctx):
    shape = tuple(attrs["shape"])
    if math.prod(shape) != ins[0].size:
        raise _fail(op, f"cannot reshape {ins[0]} to {shape}: sizes differ")
    return (ins[0].with_shape(shape),)


def _transpose(op, ins, attrs, ctx):
    perm = tuple(attrs["perm"])
    if sorted(perm) != list(range(ins[0].rank)):
        raise _fail(op, f"perm={perm} is not a permutation of the dims of {ins[0]}")
    return (ins[0].with_shape(tuple(ins[0].shape[p] for p in perm)),)


def _slice(op, ins, attrs, ctx):
    (x,), dim, start, size = ins, attrs["dim"], attrs["start"], attrs["size"]
    _check_dim(op, x, dim)
    if not (0 <= start and 0 < size and start + size <= x.shape[dim]):
        raise _fail(op, f"[{start}, {start + size}) is not inside dim {dim} of {x}")
    shape = list(x.shape)
    shape[dim] = size
    return (x.with_shape(tuple(shape)),)


def _cast(op, ins, attrs, ctx):
    if not isinstance(attrs["dtype"], DType):
        raise _fail(op, f"dtype must be a DType, got {attrs['dtype']!r}")
    return (TensorType(ins[0].shape, attrs["dtype"]),)


def _need_block(op: Op, ctx: BlockContext | None) -> BlockContext:
    if ctx is None:
        raise _fail(op, "only valid inside a block graph")
    return ctx


def _input_iter(op, ins, attrs, ctx):
    ctx = _need_block(op, ctx)
    return (input_iter_tile(attrs["arg"], attrs["imap"], attrs["fdim"], ctx),)


def _output_saver(op, ins, attrs, ctx):
    saved_output(ins[0], attrs["omap"], attrs["fdim"], _need_block(op, ctx))
    return ()


def _graph_def(op, ins, attrs, ctx):
    block = attrs["block"]
    if tuple(ins) != block.arg_types:
        raise _fail(
            op,
            "operand types (" + ", ".join(map(str, ins)) + ") differ from the block graph's "
            "inputs (" + ", ".join(map(str, block.arg_types)) + ")",
        )
    return block.output_types


def _thread(op, ins, attrs, ctx):
    graph = attrs["graph"]
    if tuple(ins) != graph.input_types:
        raise _fail(op, "operand types differ from the thread graph's inputs")
    return graph.output_types


_SPECIAL: dict[Op, Rule] = {
    Op.INPUT: lambda op, ins, attrs, ctx: (_ for _ in ()).throw(
        _fail(op, "input types are declared, not inferred")
    ),
    Op.OUTPUT: lambda op, ins, attrs, ctx: (),
    Op.RESHAPE: _reshape,
    Op.TRANSPOSE: _transpose,
    Op.SLICE: _slice,
    Op.CAST: _cast,
    Op.MATMUL: lambda op, ins, attrs, ctx: (_matmul(op, *ins),),
    Op.CONCAT: lambda op, ins, attrs, ctx: (_concat(op, *ins, attrs["dim"]),),
    Op.INPUT_ITER: _input_iter,
    Op.OUTPUT_SAVER: _output_saver,
    Op.GRAPH_DEF: _graph_def,
    Op.THREAD: _thread,
}
