"""The state of one region under construction: graph values, lazy views of jaxpr vars, rollback.

Every jaxpr var the region defines maps to a ``View``: a graph value plus the var's logical
shape. The graph value is either

- the same elements in row-major order (equal size, any shape): reductions keep rank in the
  IR and reshapes are free, so ``reduce_sum`` over axis 1 of ``[4,8]`` leaves ``[4,1]`` for a
  logical ``[4]``; a reshape node is only emitted when a consumer needs the exact shape; or
- a broadcast of the value (equal rank, each dim equal or 1): ``broadcast_in_dim`` is left
  implicit for the binary ops that consume it, and only materialised if something else needs
  the full tensor.

Nodes are recorded here and turned into a ``KernelGraph`` when the region closes (dead nodes
dropped), so a rule that fails half-way is rolled back without trace. Pure nodes are shared
(common subexpressions), which also keeps repeated reshapes from multiplying.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np
from jax.extend.core import Literal, Var

from mirage_jax.errors import GraphError
from mirage_jax.ir import DType, KernelBuilder, KernelGraph, Op, TensorType
from mirage_jax.ir.ops import COMPUTE
from mirage_jax.ir.shapes import infer


class Unsupported(Exception):
    """A rule cannot express an equation; ``reason`` goes into the cut report."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class View:
    """A jaxpr var inside a region: graph value ``vid`` seen with logical ``shape``."""

    vid: int
    shape: tuple[int, ...]


def tensor_type(aval: Any) -> TensorType:
    """The μGraph type of a jaxpr aval; ``Unsupported`` if μGraphs cannot hold it."""
    shape, dtype = getattr(aval, "shape", None), getattr(aval, "dtype", None)
    if shape is None or dtype is None:
        raise Unsupported(f"operand {aval} is not an array")
    try:
        dt = DType.from_numpy(dtype)
    except (GraphError, TypeError):
        raise Unsupported(
            f"dtype {dtype} is not supported by μGraphs (float16/bfloat16/float32/float64 only)"
        ) from None
    if any(int(d) < 1 for d in shape):
        raise Unsupported(f"zero-sized array {aval} cannot be a μGraph tensor")
    return TensorType(tuple(int(d) for d in shape), dt)


def atom_key(atom: Any) -> Any:
    """A dict key for a jaxpr atom (literals are unhashable and unique per use)."""
    return ("literal", id(atom)) if isinstance(atom, Literal) else atom


_Node = tuple[Op | str, tuple[int, ...], tuple[tuple[str, Any], ...]]  # str: IS_FINITE only


@dataclass(frozen=True)
class Work:
    """What a region under construction computes, for pricing it as one fused kernel."""

    ops: int  # compute nodes reachable from the region's vars
    inputs: int  # tensors read from outside the region by its compute
    input_bytes: int  # every region input once
    matmul_flops: float
    element_ops: float  # elementwise and reduction element operations (``OpInfo.element_flops``)


# The one node a region holds that is no μGraph op: a predicate ``is_finite(x)`` kept until a
# ``select_n`` folds it into ``finite_or`` (no op of a region computes a bool). The partitioner
# ends a region before it if the predicate would be read outside the region.
IS_FINITE = "is_finite"


class RegionBuilder:
    """Graph values and jaxpr-var views of one region; see the module docstring."""

    def __init__(self, start: int) -> None:
        self.start = start
        self.env: dict[Var, View] = {}  # vars defined by the region's equations
        self._nodes: list[_Node] = []  # one node per value: value id == node index
        self._types: list[TensorType] = []
        self._inputs: dict[Any, tuple[Any, int]] = {}  # atom key -> (atom, input value id)
        self._cache: dict[_Node, int] = {}

    # ---------------------------------------------------------------- values and rollback

    def type(self, vid: int) -> TensorType:
        return self._types[vid]

    def shape(self, vid: int) -> tuple[int, ...]:
        return self._types[vid].shape

    def producer(self, vid: int) -> _Node:
        return self._nodes[vid]

    def apply(self, op: Op, *vids: int, **attrs: Any) -> int:
        """Add (or reuse) the node ``op[attrs](vids)`` and return its value id."""
        key = (op, tuple(vids), tuple(sorted(attrs.items())))
        if key in self._cache:
            return self._cache[key]
        (out,) = infer(op, tuple(self._types[v] for v in vids), attrs)
        return self._push(key, out, cache=True)

    def _push(self, node: _Node, out: TensorType, cache: bool) -> int:
        vid = len(self._types)
        self._nodes.append(node)
        self._types.append(out)
        if cache:
            self._cache[node] = vid
        return vid

    def mark(self) -> int:
        return len(self._types)

    def rollback(self, mark: int) -> None:
        """Forget every value created since ``mark`` (a rule failed half-way)."""
        del self._nodes[mark:], self._types[mark:]
        self._cache = {k: v for k, v in self._cache.items() if v < mark}
        self._inputs = {k: iv for k, iv in self._inputs.items() if iv[1] < mark}

    # ---------------------------------------------------------------------------- atoms

    def operand(self, atom: Any) -> View | float:
        """A scalar literal as a python float, anything else as a tensor view."""
        if isinstance(atom, Literal) and np.shape(atom.val) == ():
            return float(np.asarray(atom.val))
        return self.tensor(atom)

    def tensor(self, atom: Any) -> View:
        """The view of ``atom``; values from outside the region become region inputs."""
        if isinstance(atom, Var) and atom in self.env:
            return self.env[atom]
        return self._input(atom, tensor_type(atom.aval))

    def mask(self, atom: Any) -> View:
        """A bool ``atom`` (computed by XLA: no op of a region makes one) as a mask input."""
        if np.dtype(atom.aval.dtype) != np.bool_ or not isinstance(atom, Var):
            raise Unsupported(f"predicate {atom.aval} is not a bool array")
        return self._input(atom, TensorType(tuple(atom.aval.shape), DType.BOOL))

    def is_finite(self, x: View) -> View:
        """The predicate ``is_finite(x)``, for a ``select_n`` of this region to fold."""
        t = TensorType(self.shape(x.vid), DType.BOOL)
        return View(self._push((IS_FINITE, (x.vid,), ()), t, cache=True), x.shape)

    def predicate_of(self, atom: Any) -> View | None:
        """``x`` where ``atom`` is a predicate ``is_finite(x)`` this region holds, else None."""
        view = self.env.get(atom) if isinstance(atom, Var) else None
        if view is None or self._nodes[view.vid][0] != IS_FINITE:
            return None
        return View(self._nodes[view.vid][1][0], view.shape)

    def _input(self, atom: Any, t: TensorType) -> View:
        key = atom_key(atom)
        if key not in self._inputs:
            self._inputs[key] = (atom, self._push((Op.INPUT, (), ()), t, cache=False))
        return View(self._inputs[key][1], tuple(atom.aval.shape))

    def constant(self, view: View) -> float | None:
        """The scalar literal ``view`` broadcasts (a region input made of one), else None."""
        vid = view.vid
        while self._nodes[vid][0] is Op.RESHAPE:
            vid = self._nodes[vid][1][0]
        for atom, input_vid in self._inputs.values():
            if input_vid == vid and isinstance(atom, Literal) and np.shape(atom.val) == ():
                return float(np.asarray(atom.val))
        return None

    def view(self, vid: int, shape: Iterable[int]) -> View:
        return View(vid, tuple(shape))

    # --------------------------------------------------------------------- shape helpers

    def is_broadcast(self, view: View) -> bool:
        return math.prod(self.shape(view.vid)) != math.prod(view.shape)

    def reshape(self, vid: int, shape: Iterable[int]) -> int:
        shape = tuple(shape)
        op, ins, _ = self._nodes[vid]
        if op is Op.RESHAPE:  # reshape of a reshape: go back to the source
            vid = ins[0]
        if self.shape(vid) == shape:
            return vid
        return self.apply(Op.RESHAPE, vid, shape=shape)

    def permute(self, vid: int, perm: Iterable[int]) -> int:
        """Transpose ``vid``; free (a reshape) when only unit dims move; composes transposes."""
        perm = tuple(perm)
        if perm == tuple(range(len(perm))):
            return vid
        shape = self.shape(vid)
        moved = [p for p in perm if shape[p] != 1]
        if moved == sorted(moved):
            return self.reshape(vid, (shape[p] for p in perm))
        op, ins, attrs = self._nodes[vid]
        if op is Op.TRANSPOSE:
            inner = dict(attrs)["perm"]
            return self.permute(ins[0], (inner[p] for p in perm))
        return self.apply(Op.TRANSPOSE, vid, perm=perm)

    def exact(self, view: View) -> int:
        """A graph value with exactly the view's logical shape (materialising broadcasts)."""
        if not self.is_broadcast(view):
            return self.reshape(view.vid, view.shape)
        vid = view.vid
        for dim, (have, want) in enumerate(zip(self.shape(vid), view.shape)):
            if have == 1 and want > 1:
                vid = self._repeat(vid, dim, want)
        return vid

    def _repeat(self, vid: int, dim: int, times: int) -> int:
        # No broadcast op in the IR: repeat by doubling with concat (exact, log2(times) nodes).
        result, power = None, vid
        while times:
            if times & 1:
                result = power if result is None else self.apply(Op.CONCAT, result, power, dim=dim)
            times >>= 1
            if times:
                power = self.apply(Op.CONCAT, power, power, dim=dim)
        return result  # type: ignore[return-value]

    def aligned(self, view: View, rank: int) -> int:
        """A value of rank ``rank`` that broadcasts (numpy-style) to the view's shape."""
        if len(view.shape) == rank:
            return view.vid if self.is_broadcast(view) else self.reshape(view.vid, view.shape)
        if not view.shape:
            return self.reshape(view.vid, (1,) * rank)
        raise Unsupported(f"operand of rank {len(view.shape)} in a rank-{rank} elementwise op")

    def cast(self, vid: int, dtype: DType) -> int:
        if self.type(vid).dtype is dtype:
            return vid
        folded = self._half_sum(vid, dtype)
        return folded if folded is not None else self.apply(Op.CAST, vid, dtype=dtype)

    def _half_sum(self, vid: int, dtype: DType) -> int | None:
        """``vid`` cast to ``dtype`` as one reduction in ``dtype`` where ``vid`` is a float32
        sum (over one dim, maybe reshaped) of a ``dtype`` tensor cast up: ``jnp.sum`` of
        bf16 / f16 accumulates so. A half-precision reduction accumulates in float32 and
        rounds its result, so the two are the same value; as one op, the search fuses it
        like the sums of a float32 program (the cast-up chain is dropped if unread)."""
        if dtype not in (DType.BF16, DType.F16):
            return None
        reshapes: list[tuple[int, ...]] = []
        while self.producer(vid)[0] is Op.RESHAPE:
            reshapes.append(self.shape(vid))
            vid = self.producer(vid)[1][0]
        op, ins, attrs = self.producer(vid)
        if op is not Op.REDUCE_SUM:
            return None
        up_op, up_ins, _ = self.producer(ins[0])
        if up_op is not Op.CAST or self.type(up_ins[0]).dtype is not dtype:
            return None
        out = self.apply(Op.REDUCE_SUM, up_ins[0], **dict(attrs))
        for shape in reversed(reshapes):
            out = self.reshape(out, shape)
        return out

    # ------------------------------------------------------------------------ finishing

    def finish(
        self, outvars: list[Var], read_by_live: Callable[[Any], bool]
    ) -> tuple[KernelGraph, tuple[Any, ...]] | None:
        """The region's kernel graph and inputs, or ``None`` if it has no compute op.

        ``read_by_live(atom_key)`` tells whether a live equation reads an input, so the
        region's inputs are exactly what its equations need when replayed by XLA.
        """
        outs = [self.exact(self.env[v]) for v in outvars]
        live = self._live(outs)
        if not any(self._nodes[v][0] in COMPUTE for v in live):
            return None
        inputs = sorted(
            (vid, atom) for key, (atom, vid) in self._inputs.items()
            if vid in live or read_by_live(key)
        )  # fmt: skip
        kb, new = KernelBuilder(), {}
        for vid, _ in inputs:
            new[vid] = kb.input(self._types[vid])
        for vid in sorted(live - set(new)):
            op, ins, attrs = self._nodes[vid]
            new[vid] = kb.apply(op, *(new[i] for i in ins), **dict(attrs))
        for vid in outs:
            kb.output(new[vid])
        return kb.build(), tuple(atom for _, atom in inputs)

    def work(self) -> Work:
        """The ``Work`` of the equations added so far (nodes no var reaches are not counted)."""
        ops, mm, elem = 0, 0.0, 0.0
        live = self._live([view.vid for view in self.env.values()])
        for vid in live:
            op, ins, _ = self._nodes[vid]
            if op not in COMPUTE:
                continue
            ops += 1
            out = self._types[vid]
            if op is Op.MATMUL:
                mm += 2.0 * out.size * self._types[ins[0]].shape[-1]
            else:
                elem += op.info.element_flops * max([out.size, *(self._types[i].size for i in ins)])
        read = [vid for _, vid in self._inputs.values() if vid in live]
        return Work(ops, len(read), sum(self._types[v].nbytes for v in read), mm, elem)

    def _live(self, roots: list[int]) -> set[int]:
        live, stack = set(), list(roots)
        while stack:
            vid = stack.pop()
            if vid not in live:
                live.add(vid)
                stack.extend(self._nodes[vid][1])
        return live
