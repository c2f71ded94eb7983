"""Float inputs and float comparison: the one input sampler and the one tolerance table.

The search's float check, the planner's verification against XLA and candidate timing all
draw inputs from ``sample_inputs`` and judge outputs with ``FLOAT_TOLERANCE``, so a graph is
tested the same way wherever it is tested.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from mirage_jax.ir.types import DType, TensorType

# Relative tolerance of an output element, by dtype (``output_error`` says relative to what).
FLOAT_TOLERANCE = {"f16": 2e-2, "bf16": 5e-2, "f32": 2e-4, "f64": 1e-9}
_DEFAULT_TOLERANCE = FLOAT_TOLERANCE["f32"]


def sample_inputs(types: Sequence[TensorType], seed: int = 0, std: float = 1.0
                  ) -> list[np.ndarray]:  # fmt: skip
    """Normal inputs (``std``) in each input's dtype; vectors and [1, n] rows (gains) near 1,
    which keeps norms and softmax in range."""
    rng = np.random.default_rng([seed, 0xF10A7])
    out = []
    for t in types:
        if t.dtype is DType.BOOL:
            out.append(_mask(rng, t))
            continue
        x = std * rng.standard_normal(t.shape)
        if t.rank == 1 or (t.rank >= 2 and all(s == 1 for s in t.shape[:-1])):
            x = 1.0 + 0.1 * x / std
        out.append(x.astype(t.dtype.numpy))
    return out


def _mask(rng: np.random.Generator, t: TensorType) -> np.ndarray:
    return rng.random(t.shape) < 0.6  # most kept, many masked


def spread_inputs(types: Sequence[TensorType], seed: int = 0) -> list[np.ndarray]:
    """Inputs whose magnitudes spread over decades (10^-6 to 10^6 for f32 / f64, 10^-2 to 10^2
    for the half types: the fuzzer's "mixed" range) with random signs: where rounding orders
    matter, e.g. a sum that cancels differently in an algebraically equal graph."""
    rng = np.random.default_rng([seed, 0x5B12EAD])
    out = []
    for t in types:
        if t.dtype is DType.BOOL:
            out.append(_mask(rng, t))
            continue
        decades = 2.0 if t.dtype.itemsize < 4 else 6.0
        mag = 10.0 ** rng.uniform(-decades, decades, t.shape)
        out.append((rng.choice([-1.0, 1.0], t.shape) * mag).astype(t.dtype.numpy))
    return out


def tolerance(dtype_name: str) -> float:
    """The relative tolerance of an output of this dtype (``"f32"``, ``"bf16"``, ...)."""
    return FLOAT_TOLERANCE.get(dtype_name, _DEFAULT_TOLERANCE)


def output_error(got: Any, want: Any, dtype_name: str) -> tuple[float, float, float]:
    """(error, tolerance, scale) of ``got`` against the reference ``want`` at the element
    where the error is largest relative to its tolerance, in float64.

    Each element may differ by ``tolerance(dtype) * (|want_i| + typical)``, where ``typical``
    is the median magnitude of the reference's nonzero finite elements (1 if none). The
    per-element term keeps small elements honest (one of 1e-3 beside one of 1e3 may not be
    returned as 0); ``typical`` absorbs rounding near zero, where a reordered sum of terms of
    that size leaves an absolute error, not a relative one. Where the reference is NaN or
    infinite the output must be the same value; anything else is an infinite error. A shape
    mismatch is an infinite error too, never a broadcast."""
    g64, w64 = np.asarray(got, np.float64), np.asarray(want, np.float64)
    if g64.shape != w64.shape:
        return float("inf"), 0.0, 1.0
    if not w64.size:
        return 0.0, tolerance(dtype_name), 1.0
    mag = np.abs(w64)
    ordinary = mag[np.isfinite(mag) & (mag > 0)]
    typical = float(np.median(ordinary)) if ordinary.size else 1.0
    special = ~np.isfinite(w64)
    same_special = (np.isnan(g64) & np.isnan(w64)) | (g64 == w64)
    err = np.where(special, np.where(same_special, 0.0, np.inf), np.abs(g64 - w64))
    err = np.where(np.isnan(err), np.inf, err)
    scale = np.where(special, typical, mag + typical)
    worst = int(np.argmax(err / scale))
    return float(err.flat[worst]), tolerance(dtype_name) * float(scale.flat[worst]), float(
        scale.flat[worst])


def as_accurate_error(got: Any, own: Any, truth: Any, dtype_name: str, relative: bool = False
                      ) -> tuple[float, float]:  # fmt: skip
    """(error, allowed) of ``got`` where the graph it replaces computed ``own`` in its own
    dtypes and ``truth`` is that graph in float64: special values as ``own`` has them, and
    finite elements within ``tolerance(dtype) * (|truth_i| + typical)`` plus 4x ``own``'s own
    largest error. A candidate may round differently, not worse: a rewrite that cancels where
    the original does not (x + y - y for x) fails here though it is equal over the reals.
    ``relative``: ``own``'s largest error relative to each element's scale ``|truth_i| +
    typical``, allowed 4x at every element's own scale, so that a large element's rounding
    does not excuse a wrong small one."""
    g, o, t = (np.asarray(a, np.float64) for a in (got, own, truth))
    if g.shape != o.shape:
        return float("inf"), 0.0
    special = ~np.isfinite(o)
    if ((np.isnan(g) != np.isnan(o)) | (special & ~np.isnan(o) & (g != o))).any():
        return float("inf"), 0.0
    finite = ~special & np.isfinite(t)
    if not finite.any():
        return 0.0, 0.0
    if not np.isfinite(g[finite]).all():
        return float("inf"), 0.0
    mag = np.abs(t[finite])
    typical = float(np.median(mag[mag > 0])) if (mag > 0).any() else 1.0
    own_off = np.abs(o[finite] - t[finite])
    scale = mag + typical
    if relative:
        allowed = (tolerance(dtype_name) + 4 * float(np.max(own_off / scale))) * scale
    else:
        allowed = tolerance(dtype_name) * scale + 4 * float(np.max(own_off))
    off = np.abs(g[finite] - t[finite])
    worst = int(np.argmax(off - allowed))
    return float(off[worst]), float(allowed[worst])


def dtype_name(x: Any) -> str:
    """The IR's short name (``"f32"``) of an array's dtype; ``"f32"`` for unknown ones."""
    return {"float16": "f16", "bfloat16": "bf16", "float32": "f32", "float64": "f64"}.get(
        np.dtype(x.dtype).name, "f32"
    )


__all__ = ["FLOAT_TOLERANCE", "dtype_name", "output_error", "sample_inputs", "spread_inputs",
           "tolerance"]  # fmt: skip
