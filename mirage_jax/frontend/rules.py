"""The primitive -> rule table that turns jaxpr equations into kernel-graph nodes.

A rule takes the region under construction and one equation and returns a ``View`` per
output var, or raises ``Unsupported`` with the reason for the cut report. Rules only add
nodes (the partitioner rolls a failed rule back) and never define vars themselves.
A primitive that is not in ``RULES`` always cuts its region.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Container, Mapping, Sequence
from typing import Any

import jax.numpy as jnp
import numpy as np
from jax.extend.core import JaxprEqn, Literal

from mirage_jax.frontend.builder import RegionBuilder, Unsupported, View, tensor_type
from mirage_jax.ir import DType, Op

Rule = Callable[[RegionBuilder, JaxprEqn], list[View]]


def _out_shape(eqn: JaxprEqn, i: int = 0) -> tuple[int, ...]:
    return tuple(eqn.outvars[i].aval.shape)


def _finish(b: RegionBuilder, eqn: JaxprEqn, vid: int, shape: tuple[int, ...]) -> list[View]:
    """One output view, cast to the output var's dtype if the op changed it (``out_dtype``)."""
    return [b.view(b.cast(vid, tensor_type(eqn.outvars[0].aval).dtype), shape)]


# ---------------------------------------------------------------------------- elementwise


def _unary(op: Op) -> Rule:
    def rule(b: RegionBuilder, eqn: JaxprEqn) -> list[View]:
        x = b.tensor(eqn.invars[0])
        return [b.view(b.apply(op, x.vid), x.shape)]

    return rule


def _exp2(b: RegionBuilder, eqn: JaxprEqn) -> list[View]:
    """exp2 as jax lowers it for XLA: exp(log(2) * x), with log(2) rounded to x's dtype."""
    x = b.tensor(eqn.invars[0])
    ln2 = float(np.asarray(math.log(2.0), tensor_type(eqn.invars[0].aval).dtype.numpy))
    return [b.view(b.apply(Op.EXP, b.apply(Op.MUL_SCALAR, x.vid, scalar=ln2)), x.shape)]


def _identity(b: RegionBuilder, eqn: JaxprEqn) -> list[View]:
    return [b.tensor(eqn.invars[0])]


def _abs(b: RegionBuilder, eqn: JaxprEqn) -> list[View]:
    x = b.tensor(eqn.invars[0])  # |x| == max(x, -x) exactly
    return [b.view(b.apply(Op.MAX, x.vid, b.apply(Op.NEG, x.vid)), x.shape)]


def _log(b: RegionBuilder, eqn: JaxprEqn) -> list[View]:
    """log, rewritten where XLA's algebraic simplifier rewrites it under jit, so the region
    gives jax.jit's answers also where the rewrite is not IEEE-exact: log(exp(y)) is y (also
    where exp overflows), log(sqrt(y)) is 0.5 log(y), log(rsqrt(y)) is -0.5 log(y) (inf, not
    NaN, at y = -0), and log(y ** c) for a non-integer c is c log(|y|) (finite for y < 0).
    Integer powers are multiplies by then in XLA, and stay literal here. XLA:CPU leaves
    bfloat16 logs as written (the float32 converts it puts around each bf16 op hide the
    patterns; float16 it rewrites), and so does this rule (fuzz seed 41478)."""
    x = b.tensor(eqn.invars[0])
    if tensor_type(eqn.outvars[0].aval).dtype is DType.BF16:
        return [b.view(b.apply(Op.LOG, x.vid), x.shape)]
    op, ins, attrs = b.producer(x.vid)
    if op is Op.EXP:
        return [b.view(ins[0], x.shape)]
    if op in (Op.SQRT, Op.RSQRT):
        half = 0.5 if op is Op.SQRT else -0.5
        return [b.view(b.apply(Op.MUL_SCALAR, b.apply(Op.LOG, ins[0]), scalar=half), x.shape)]
    c = dict(attrs).get("exponent") if op is Op.POW_SCALAR else None
    if c is not None and not float(c).is_integer():
        y = ins[0]
        magnitude = b.apply(Op.MAX, y, b.apply(Op.NEG, y))
        return [b.view(b.apply(Op.MUL_SCALAR, b.apply(Op.LOG, magnitude), scalar=float(c)),
                       x.shape)]  # fmt: skip
    return [b.view(b.apply(Op.LOG, x.vid), x.shape)]


def _integer_pow(b: RegionBuilder, eqn: JaxprEqn) -> list[View]:
    x, y = b.tensor(eqn.invars[0]), int(eqn.params["y"])
    if y == 0:
        raise Unsupported("integer_pow with exponent 0 is a constant")
    if y == 1:
        return [x]
    op_attrs = {2: (Op.SQUARE, {}), -1: (Op.RECIPROCAL, {})}
    op, attrs = op_attrs.get(y, (Op.POW_SCALAR, {"exponent": float(y)}))
    return [b.view(b.apply(op, x.vid, **attrs), x.shape)]


def _scalar_op(b: RegionBuilder, name: str, x: View, c: float, scalar_right: bool) -> int | None:
    """``x <name> c`` (or ``c <name> x``) with a scalar attribute; ``None`` if there is none."""
    v = x.vid
    if name == "mul":
        return b.apply(Op.MUL_SCALAR, v, scalar=c)
    if name == "add":
        return b.apply(Op.ADD_SCALAR, v, scalar=c)
    if name == "sub":
        if scalar_right:
            return b.apply(Op.ADD_SCALAR, v, scalar=-c)
        return b.apply(Op.ADD_SCALAR, b.apply(Op.NEG, v), scalar=c)  # c - x == (-x) + c exactly
    if name == "div":
        if scalar_right:
            inv = 1.0 / c if c != 0 else math.copysign(math.inf, c)
            return b.apply(Op.MUL_SCALAR, v, scalar=inv)
        # c / x is a division: c * (1 / x) overflows where 1 / x does (|x| below 1 / max)
        # though c / x is finite, as XLA computes it
        return b.apply(Op.RECIPROCAL, v) if c == 1.0 else None
    if name == "pow" and scalar_right:
        return b.apply(Op.POW_SCALAR, v, exponent=c)
    if name == "max" and c == -math.inf:
        return v
    # max(x, +0.0) is relu; max(x, -0.0) is not: it is -0 where x < 0 (1 / it is -inf)
    if name == "max" and c == 0.0 and math.copysign(1.0, c) > 0:
        return b.apply(Op.RELU, v)
    # not min(x, 0) as -relu(-x): that is -0 for x > 0, where XLA gives +0 (and 1 / that is
    # -inf, not inf); the 0 becomes an input and min is -max(-x, -0.0), exact in the zeros too
    if name == "min" and c == math.inf:
        return v
    return None


_BINARY = {"add": Op.ADD, "sub": Op.SUB, "mul": Op.MUL, "div": Op.DIV, "max": Op.MAX,
           "rem": Op.REM}


def _tensor_op(b: RegionBuilder, name: str, x: int, y: int) -> int:
    if name == "min":  # min(x, y) == -max(-x, -y) exactly
        return b.apply(Op.NEG, b.apply(Op.MAX, b.apply(Op.NEG, x), b.apply(Op.NEG, y)))
    if name == "mul":
        px, py = b.producer(x), b.producer(y)
        # XLA's simplifier makes exp(a) * exp(b) exp(a + b) (1, not NaN, for exp(100) *
        # exp(-100)) where both are unbroadcast operands of the product; so does the trace
        if px[0] is Op.EXP and py[0] is Op.EXP and b.shape(x) == b.shape(y):
            return b.apply(Op.EXP, b.apply(Op.ADD, px[1][0], py[1][0]))
        for p, q in ((x, y), (y, x)):  # x * sigmoid(x) is silu
            op, ins, _ = b.producer(q)
            if op is Op.SIGMOID and ins == (p,):
                return b.apply(Op.SILU, p)
    if name not in _BINARY:
        raise Unsupported(f"{name} of two tensors has no μGraph operator")
    return b.apply(_BINARY[name], x, y)


def combine(b: RegionBuilder, name: str, x_in: Any, y_in: Any, shape: tuple[int, ...]) -> View:
    """The view of ``x <name> y`` (atoms or views) with logical result ``shape``."""
    x, y = (v if isinstance(v, View) else b.operand(v) for v in (x_in, y_in))
    if isinstance(x, float) and isinstance(y, float):
        raise Unsupported(f"{name} of two constants")
    if isinstance(x, float) or isinstance(y, float):
        scalar_right = isinstance(y, float)
        t, c = (x, y) if scalar_right else (y, x)
        vid = _scalar_op(b, name, t, c, scalar_right)  # type: ignore[arg-type]
        if vid is not None:
            return b.view(vid, t.shape)  # type: ignore[union-attr]
        # No scalar form: the constant becomes a region input.
        x, y = (v if isinstance(v, View) else b.tensor(v) for v in (x_in, y_in))
    rank = len(shape)
    vid = _tensor_op(b, name, b.aligned(x, rank), b.aligned(y, rank))  # type: ignore[arg-type]
    return b.view(vid, shape)


def _binary(name: str) -> Rule:
    def rule(b: RegionBuilder, eqn: JaxprEqn) -> list[View]:
        out = combine(b, name, *eqn.invars, _out_shape(eqn))
        return _finish(b, eqn, out.vid, out.shape)

    return rule


def _is_finite(b: RegionBuilder, eqn: JaxprEqn) -> list[View]:
    """A predicate the region holds for a ``select_n`` to fold (``_finite_or``); offered only
    when ``is_finite_folds``."""
    return [b.is_finite(b.tensor(eqn.invars[0]))]


IS_FINITE_KEPT = ("is_finite is read other than as a select's predicate (only "
                  "where(isfinite(x), x, constant) has a μGraph operator); it stays with XLA")


def is_finite_folds(eqn: JaxprEqn, read_by: Mapping[Any, Sequence[JaxprEqn]],
                    outputs: Container[Any]) -> bool:  # fmt: skip
    """Whether every read of an ``is_finite`` is as the predicate of a two-way ``select_n``
    (``read_by``: ``readers`` of the jaxpr; ``outputs``: its output vars), which
    ``_finite_or`` may fold (it checks the cases: x where it holds, else a constant);
    anything else needs the bool, which no region makes."""
    (pred,) = eqn.outvars
    readers = read_by.get(pred, ())
    return bool(readers) and pred not in outputs and all(
        r.primitive.name == "select_n" and len(r.invars) == 3 and r.invars[0] is pred
        and pred not in r.invars[1:] for r in readers
    )  # fmt: skip


def _select_n(b: RegionBuilder, eqn: JaxprEqn) -> list[View]:
    """``select_n(pred, on_false, on_true)`` over a bool mask from outside the region (as
    ``jnp.where`` and attention masks give): a WHERE keeping the tensor case where a scalar
    constant is the other, else where(m, on_true, -0) + where_not(m, on_false, -0), which is
    exact (x + -0 is x for every x, -0 included). Over ``is_finite(x)`` of this region, see
    ``_finite_or``."""
    pred, *cases = eqn.invars
    if len(cases) != 2:
        raise Unsupported(f"select_n of {len(cases)} cases has no μGraph operator")
    shape = _out_shape(eqn)
    x = b.predicate_of(pred)
    if x is not None:
        return _finite_or(b, eqn, x, *cases)
    mask = b.aligned(b.mask(pred), len(shape))
    lo, hi = (b.operand(c) for c in cases)
    lo_c, hi_c = (c if isinstance(c, float) else b.constant(c) for c in (lo, hi))
    if lo_c is not None and hi_c is not None:
        raise Unsupported("select_n of two constants")
    if lo_c is not None:
        vid = b.apply(Op.WHERE, mask, b.aligned(hi, len(shape)), fill=lo_c)
    elif hi_c is not None:
        vid = b.apply(Op.WHERE_NOT, mask, b.aligned(lo, len(shape)), fill=hi_c)
    else:
        kept = b.apply(Op.WHERE, mask, b.aligned(hi, len(shape)), fill=-0.0)
        other = b.apply(Op.WHERE_NOT, mask, b.aligned(lo, len(shape)), fill=-0.0)
        vid = b.apply(Op.ADD, kept, other)
    return _finish(b, eqn, vid, shape)


def _finite_or(b: RegionBuilder, eqn: JaxprEqn, x: View, on_false: Any, on_true: Any
               ) -> list[View]:  # fmt: skip
    """``jnp.where(jnp.isfinite(x), x, c)`` for a constant c (``logsumexp`` guards its max so)
    as ``finite_or[fill=c](x)``; another select over ``is_finite`` has no μGraph operator."""
    lo, hi = b.operand(on_false), b.operand(on_true)
    fill = lo if isinstance(lo, float) else b.constant(lo)
    if fill is None or isinstance(hi, float) or hi.vid != x.vid or hi.shape != x.shape:
        raise Unsupported("select_n over is_finite(x) has a μGraph operator only as "
                          "where(isfinite(x), x, constant)")  # fmt: skip
    return _finish(b, eqn, b.apply(Op.FINITE_OR, x.vid, fill=fill), x.shape)


def _clamp(b: RegionBuilder, eqn: JaxprEqn) -> list[View]:
    lo, x, hi = eqn.invars
    shape = _out_shape(eqn)
    return [combine(b, "min", combine(b, "max", x, lo, shape), hi, shape)]


# ----------------------------------------------------------------------------- reductions


def _reduce(kind: str) -> Rule:
    def rule(b: RegionBuilder, eqn: JaxprEqn) -> list[View]:
        x = b.tensor(eqn.invars[0])
        axes = tuple(sorted(int(a) for a in eqn.params["axes"]))
        vid = x.vid if b.is_broadcast(x) else b.reshape(x.vid, x.shape)
        vid = b.apply(Op.NEG, vid) if kind == "min" else vid  # min == -max(-x)
        factor = 1
        for d in axes:
            if x.shape[d] == 1:
                continue
            if b.shape(vid)[d] == 1:  # a broadcast dim: sum of n copies, max of copies
                factor *= x.shape[d] if kind == "sum" else 1
                continue
            vid = b.apply(Op.REDUCE_SUM if kind == "sum" else Op.REDUCE_MAX, vid, dim=d)
        vid = b.apply(Op.NEG, vid) if kind == "min" else vid
        vid = b.apply(Op.MUL_SCALAR, vid, scalar=float(factor)) if factor != 1 else vid
        out = _out_shape(eqn)
        kept = tuple(s for d, s in enumerate(b.shape(vid)) if d not in axes)
        if kept != out:  # still broadcast along kept dims: drop the reduced dims for real
            vid = b.reshape(vid, kept)
        return [b.view(vid, out)]

    return rule


# --------------------------------------------------------------------------------- layout


def _broadcast_in_dim(b: RegionBuilder, eqn: JaxprEqn) -> list[View]:
    x = b.tensor(eqn.invars[0])
    dims = tuple(eqn.params["broadcast_dimensions"])
    if list(dims) != sorted(dims):
        raise Unsupported("broadcast_in_dim with unordered broadcast_dimensions")
    src = b.shape(x.vid) if b.is_broadcast(x) else x.shape
    out = _out_shape(eqn)
    target = [1] * len(out)
    for i, d in enumerate(dims):
        target[d] = src[i]
    return [b.view(b.reshape(x.vid, target), out)]


def _non_unit(shape: tuple[int, ...]) -> list[int]:
    return [d for d in shape if d != 1]


def _reshape(b: RegionBuilder, eqn: JaxprEqn) -> list[View]:
    if eqn.params.get("dimensions") is not None:
        raise Unsupported("reshape with a dimension permutation")
    x, out = b.tensor(eqn.invars[0]), _out_shape(eqn)
    if not b.is_broadcast(x):
        return [b.view(x.vid, out)]  # same row-major elements: nothing to emit
    if _non_unit(x.shape) != _non_unit(out):
        return [b.view(b.exact(x), out)]
    # Only unit dims come or go: carry the broadcast along the surviving dims.
    have = iter(g for g, s in zip(b.shape(x.vid), x.shape) if s != 1)
    target = [next(have) if s != 1 else 1 for s in out]
    return [b.view(b.reshape(x.vid, target), out)]


def _transpose(b: RegionBuilder, eqn: JaxprEqn) -> list[View]:
    x, perm = b.tensor(eqn.invars[0]), tuple(eqn.params["permutation"])
    vid = x.vid if b.is_broadcast(x) else b.reshape(x.vid, x.shape)
    return [b.view(b.permute(vid, perm), (x.shape[p] for p in perm))]


def _convert(b: RegionBuilder, eqn: JaxprEqn) -> list[View]:
    x = b.tensor(eqn.invars[0])
    return [b.view(b.cast(x.vid, tensor_type(eqn.outvars[0].aval).dtype), x.shape)]


def _format(dtype: DType) -> tuple[int, int]:
    """(exponent bits, mantissa bits) of a float type: reduce_precision's parameters."""
    info = jnp.finfo(dtype.numpy)
    return int(info.nexp), int(info.nmant)


def _reduce_precision(b: RegionBuilder, eqn: JaxprEqn) -> list[View]:
    """``reduce_precision`` of float32 to bfloat16's format is a round trip through bfloat16:
    the same bits for every float32 (checked over 44M patterns, denormals, inf and NaN
    included). To float16's format XLA flushes what float16 keeps as denormals, so that one
    (and any other format) stays with XLA."""
    x = b.tensor(eqn.invars[0])
    fmt = (int(eqn.params["exponent_bits"]), int(eqn.params["mantissa_bits"]))
    dtype = b.type(x.vid).dtype
    if fmt == _format(dtype):  # to its own format: the identity
        return [x]
    if dtype is DType.F32 and fmt == _format(DType.BF16):
        return [b.view(b.cast(b.cast(x.vid, DType.BF16), DType.F32), x.shape)]
    raise Unsupported(f"reduce_precision of {dtype.value} to {fmt[0]} exponent and {fmt[1]} "
                      "mantissa bits is not a round trip through a μGraph type")


def _concatenate(b: RegionBuilder, eqn: JaxprEqn) -> list[View]:
    dim = int(eqn.params["dimension"])
    vids = [b.exact(b.tensor(a)) for a in eqn.invars]
    vid = vids[0]
    for other in vids[1:]:
        vid = b.apply(Op.CONCAT, vid, other, dim=dim)
    return [b.view(vid, _out_shape(eqn))]


def _slice(b: RegionBuilder, eqn: JaxprEqn) -> list[View]:
    """``lax.slice`` with unit strides: one SLICE per dim it narrows."""
    strides = eqn.params.get("strides")
    if strides is not None and any(s != 1 for s in strides):
        raise Unsupported(f"slice with strides {tuple(strides)} has no μGraph operator")
    x = b.tensor(eqn.invars[0])
    vid = b.exact(x)
    bounds = zip(eqn.params["start_indices"], eqn.params["limit_indices"], x.shape)
    for dim, (start, limit, extent) in enumerate(bounds):
        if (start, limit) != (0, extent):
            vid = b.apply(Op.SLICE, vid, dim=dim, start=int(start), size=int(limit - start))
    return [b.view(vid, _out_shape(eqn))]


def _split(b: RegionBuilder, eqn: JaxprEqn) -> list[View]:
    """``jnp.split`` (QKV splits, RoPE halves): one SLICE per part."""
    vid, dim = b.exact(b.tensor(eqn.invars[0])), int(eqn.params["axis"])
    views, start = [], 0
    for i, size in enumerate(eqn.params["sizes"]):
        views.append(b.view(b.apply(Op.SLICE, vid, dim=dim, start=start, size=int(size)),
                            _out_shape(eqn, i)))  # fmt: skip
        start += int(size)
    return views


# ---------------------------------------------------------------------------- contraction


def _dot_general(b: RegionBuilder, eqn: JaxprEqn) -> list[View]:
    """Any dot_general as ``[batch..., m, k] @ [batch..., k, n]``: transpose, then reshape."""
    (lc, rc), (lb, rb) = eqn.params["dimension_numbers"]
    dtype = tensor_type(eqn.outvars[0].aval).dtype
    x, y = (b.tensor(a) for a in eqn.invars)
    xs, ys = x.shape, y.shape
    x_free = [d for d in range(len(xs)) if d not in lc and d not in lb]
    y_free = [d for d in range(len(ys)) if d not in rc and d not in rb]
    batch = tuple(xs[d] for d in lb)
    m, k = math.prod(xs[d] for d in x_free), math.prod(xs[d] for d in lc)
    n = math.prod(ys[d] for d in y_free)
    lhs = b.permute(b.cast(b.exact(x), dtype), (*lb, *x_free, *lc))
    rhs = b.permute(b.cast(b.exact(y), dtype), (*rb, *rc, *y_free))
    vid = b.apply(Op.MATMUL, b.reshape(lhs, (*batch, m, k)), b.reshape(rhs, (*batch, k, n)))
    return [b.view(vid, _out_shape(eqn))]


# ---------------------------------------------------------------------------------- table

RULES: dict[str, Rule] = {
    **{name: _unary(op) for name, op in {
        "exp": Op.EXP, "sqrt": Op.SQRT, "rsqrt": Op.RSQRT, "tanh": Op.TANH,
        "logistic": Op.SIGMOID, "erf": Op.ERF, "erfc": Op.ERFC, "erf_inv": Op.ERF_INV,
        "neg": Op.NEG, "square": Op.SQUARE, "sin": Op.SIN, "cos": Op.COS, "sign": Op.SIGN,
    }.items()},
    **{name: _binary(name) for name in ("add", "sub", "mul", "div", "max", "min", "pow", "rem")},
    "add_any": _binary("add"),  # how reverse-mode autodiff sums cotangents
    "abs": _abs,
    "log": _log,
    "exp2": _exp2,
    "integer_pow": _integer_pow,
    "clamp": _clamp,
    "select_n": _select_n,
    "is_finite": _is_finite,
    "reduce_sum": _reduce("sum"),
    "reduce_max": _reduce("max"),
    "reduce_min": _reduce("min"),
    "broadcast_in_dim": _broadcast_in_dim,
    "reshape": _reshape,
    "squeeze": _reshape,
    "transpose": _transpose,
    "convert_element_type": _convert,
    "reduce_precision": _reduce_precision,
    "copy": _identity,
    "copy_p": _identity,
    "stop_gradient": _identity,
    "concatenate": _concatenate,
    "slice": _slice,
    "split": _split,
    "dot_general": _dot_general,
}  # fmt: skip

# Primitives that take whole sub-programs: named in the cut report as control flow.
CONTROL_FLOW = frozenset({"cond", "while", "scan", "fori_loop", "switch", "custom_linear_solve"})


def readers(jaxpr: Any) -> dict[Any, list[JaxprEqn]]:
    """The equations that read each var of ``jaxpr``."""
    found: dict[Any, list[JaxprEqn]] = {}
    for eqn in jaxpr.eqns:
        for a in eqn.invars:
            if not isinstance(a, Literal):
                found.setdefault(a, []).append(eqn)
    return found


def tensor_atoms(eqn: JaxprEqn) -> tuple[Any, ...]:
    """The atoms of ``eqn`` that must be μGraph tensors: all of them but a select's predicate,
    which enters a region as a bool mask (``RegionBuilder.mask``), and the predicate that
    ``is_finite`` makes."""
    name = eqn.primitive.name
    operands = eqn.invars[1:] if name == "select_n" else eqn.invars
    return tuple(operands) if name == "is_finite" else (*operands, *eqn.outvars)


def unsupported_reason(name: str) -> str:
    if name in CONTROL_FLOW:
        return f"control flow ({name}) is not expressible in a μGraph; it stays with XLA"
    return f"no μGraph operator for {name}; it stays with XLA"
