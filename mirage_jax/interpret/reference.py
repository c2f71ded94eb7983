"""The float reference evaluator: the living definition of every op, in numpy.

``evaluate(graph, inputs)`` runs a kernel graph (or a block or thread graph on its operands)
with the contract's semantics: block graphs with true grid / for-loop / accumulator semantics
(see ``walker``), thread graphs as their ops inlined.

Precision: ``precision=None`` computes in the graph's dtypes: f32 and f64 natively; f16 and
bf16 are computed in float32 and rounded to their type where XLA writes them out
(``ir.precision``: graph inputs and outputs, casts, the results of matmuls and reductions, and
the operands of matmuls). Elementwise chains stay in float32 unrounded, as in XLA's fusions
(its excess precision): rounding every intermediate would be less precise than ``jax.jit``
where a sum cancels. The CPU and CUDA kernels round at the same places. ``precision="float64"``
upcasts every input and every op to float64 and ignores casts: the high-precision reference
the float check compares against.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from fractions import Fraction
from typing import Any

import numpy as np

from mirage_jax.errors import GraphError, MirageError
from mirage_jax.interpret.walker import (
    NumberSystem,
    batched_matmul,
    check_arity,
    evaluate_graph,
    graph_input_types,
    kernel_values,
)
from mirage_jax.ir.graph import Graph, KernelGraph
from mirage_jax.ir.ops import GELU_C, GELU_K
from mirage_jax.ir.types import DType, TensorType

_PRECISIONS = (None, "float64")


def _up(x: np.ndarray) -> np.ndarray:
    """Half types compute in float32 (numpy has no fast bf16 arithmetic)."""
    return x.astype(np.float32) if x.dtype.itemsize < 4 else x


def _lift(fn: Callable[..., np.ndarray]) -> Callable[..., np.ndarray]:
    return lambda self, *xs: fn(*map(_up, xs))


class FloatSystem(NumberSystem):
    """IEEE floats in numpy: the reference number system."""

    def __init__(self, precision: str | None = None) -> None:
        if precision not in _PRECISIONS:
            raise MirageError(
                f"precision={precision!r} is not supported",
                remedy="use precision=None (the graph's dtypes) or precision='float64'",
            )
        self.float64 = precision == "float64"

    # structure
    def layout(self, x, fn):
        return fn(x)

    def shape(self, x):
        return x.shape

    def stack(self, xs, axis):
        return np.stack(xs, axis)

    def concat(self, xs, axis):
        return np.concatenate(xs, axis)

    def where(self, m, x, fill, keep):
        return np.where((np.asarray(m) != 0) == keep, x, np.asarray(fill, np.asarray(x).dtype))

    def input(self, x: Any, type_: TensorType, what: str) -> np.ndarray:
        arr = np.asarray(x)
        if arr.shape != type_.shape:
            raise GraphError(
                f"{what} has shape {arr.shape} but the graph expects {type_}",
                remedy="pass arrays whose shapes match the graph's input types",
            )
        if type_.dtype is DType.BOOL:
            return arr.astype(bool, copy=False)
        return arr.astype(np.float64 if self.float64 else type_.dtype.numpy, copy=False)

    def finish(self, x: np.ndarray, dtype: DType) -> np.ndarray:
        if self.float64:
            return x
        if dtype.itemsize < 4:
            return x.astype(np.float32, copy=False)  # held unrounded until stored
        return x.astype(dtype.numpy, copy=False)

    def store(self, x: np.ndarray, dtype: DType) -> np.ndarray:
        return x if self.float64 else x.astype(dtype.numpy, copy=False)

    # primitives
    add = _lift(np.add)
    sub = _lift(np.subtract)
    mul = _lift(np.multiply)
    div = _lift(np.divide)
    maximum = _lift(np.maximum)
    neg = _lift(np.negative)
    reciprocal = _lift(np.reciprocal)
    exp = _lift(np.exp)
    log = _lift(np.log)
    sqrt = _lift(np.sqrt)
    square = _lift(np.square)
    tanh = _lift(np.tanh)
    sin = _lift(np.sin)
    cos = _lift(np.cos)

    def sign(self, x):
        x = _up(x)
        return np.where(x == 0, x, np.sign(x))  # XLA keeps -0 (numpy's sign gives +0)

    def finite_or(self, x, fill):
        x = _up(x)
        return np.where(np.isfinite(x), x, np.asarray(fill, x.dtype))
    matmul = _lift(batched_matmul)

    def erf(self, x):
        from scipy.special import erf  # scipy ships with jax

        return erf(_up(x))

    def erfc(self, x):
        from scipy.special import erfc  # scipy ships with jax

        return erfc(_up(x))

    def erf_inv(self, x):
        from scipy.special import erfinv  # scipy ships with jax

        return erfinv(_up(x))

    rem = _lift(np.fmod)  # C's fmod, exact, as XLA's rem (numpy's remainder floors)

    def sigmoid(self, x):
        from scipy.special import expit  # overflow-free logistic

        return expit(_up(x))

    def silu(self, x):
        return _up(x) * self.sigmoid(x)

    def gelu(self, x):
        x = _up(x)
        return 0.5 * x * (1 + np.tanh(GELU_C * (x + GELU_K * x**3)))

    def relu(self, x):
        return np.maximum(_up(x), 0)

    def rsqrt(self, x):
        return 1 / np.sqrt(_up(x))

    def scale(self, x, c: float | Fraction):
        return _up(x) * float(c)  # a python float is weakly typed: the dtype is kept

    def shift(self, x, c: float | Fraction):
        return _up(x) + float(c)

    def pow_scalar(self, x, e: float):
        x = _up(x)
        if float(e).is_integer():
            return np.power(x, e)
        # numpy gives NaN for (-inf) ** 0.5 and -0 for (-0) ** 0.5; C's pow and XLA give
        # pow(+inf, e) and pow(+0, e) (+0, or +inf for e < 0)
        x = np.where(x == -np.inf, np.inf, np.where(x == 0, 0.0, x)).astype(x.dtype)
        return np.power(x, e)

    def reduce_sum(self, x, axis):
        return np.sum(_up(x), axis=axis, keepdims=True)

    def reduce_max(self, x, axis):
        return np.max(_up(x), axis=axis, keepdims=True)

    def reduce_mean(self, x, axis):
        return np.mean(_up(x), axis=axis, keepdims=True)

    def reduce_rms(self, x, axis):
        x = _up(x)
        return np.sqrt(np.mean(x * x, axis=axis, keepdims=True))

    def cast(self, x, dtype: DType):
        return x if self.float64 else x.astype(dtype.numpy)

    def exp_diff(self, a, b):
        # online softmax starts from -inf maxima: exp(-inf - -inf) must be exp(0) = 1
        a, b = _up(a), _up(b)
        return np.where(a == b, np.ones((), a.dtype), np.exp(a - b))

    def rescaled(self, x, m, top):
        # a fully masked tile (max -inf) adds nothing, though its x is NaN: XLA's softmax of
        # the row is defined when another tile has a finite score
        term = self.mul(x, self.exp_diff(m, top))
        return np.where(_up(m) == -np.inf, np.zeros((), term.dtype), term)


def evaluate(
    graph: Graph, inputs: Sequence[Any], *, precision: str | None = None
) -> list[np.ndarray]:
    """The outputs of ``graph`` on float ``inputs`` (a kernel graph's inputs in order, or a
    block / thread graph's operands)."""
    ns = FloatSystem(precision)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore", under="ignore"):
        return evaluate_graph(graph, inputs, ns)


def evaluate_values(
    graph: KernelGraph,
    inputs: Sequence[Any],
    *,
    precision: str | None = None,
    known: Mapping[int, np.ndarray] | None = None,
) -> dict[int, np.ndarray]:
    """Every value id of a kernel graph -> its array. ``known`` (values of a prefix of this
    graph, e.g. the graph one op ago) are reused rather than recomputed."""
    ns = FloatSystem(precision)
    check_arity(graph, inputs)
    types = graph_input_types(graph)
    values = [ns.input(x, t, f"input {i}") for i, (x, t) in enumerate(zip(inputs, types))]
    with np.errstate(over="ignore", invalid="ignore", divide="ignore", under="ignore"):
        return kernel_values(graph, values, ns, known)
