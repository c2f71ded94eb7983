"""Float inputs and float comparison: the one input sampler and the one tolerance table.

The search's float check, the planner's verification against XLA and candidate timing all
draw inputs from ``sample_inputs`` and judge outputs with ``FLOAT_TOLERANCE``, so a graph is
tested the same way wherever it is tested.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from mirage_jax.ir.types import TensorType

# Relative tolerance of an output, by dtype, scaled by the output's largest magnitude.
FLOAT_TOLERANCE = {"f16": 2e-2, "bf16": 5e-2, "f32": 2e-4, "f64": 1e-9}
_DEFAULT_TOLERANCE = FLOAT_TOLERANCE["f32"]


def sample_inputs(types: Sequence[TensorType], seed: int = 0, std: float = 1.0
                  ) -> list[np.ndarray]:  # fmt: skip
    """Normal inputs (``std``) in each input's dtype; vectors and [1, n] rows (gains) near 1,
    which keeps norms and softmax in range."""
    rng = np.random.default_rng([seed, 0xF10A7])
    out = []
    for t in types:
        x = std * rng.standard_normal(t.shape)
        if t.rank == 1 or (t.rank >= 2 and all(s == 1 for s in t.shape[:-1])):
            x = 1.0 + 0.1 * x / std
        out.append(x.astype(t.dtype.numpy))
    return out


def tolerance(dtype_name: str) -> float:
    """The relative tolerance of an output of this dtype (``"f32"``, ``"bf16"``, ...)."""
    return FLOAT_TOLERANCE.get(dtype_name, _DEFAULT_TOLERANCE)


def output_error(got: Any, want: Any, dtype_name: str, scale_floor: float = 0.0
                 ) -> tuple[float, float, float]:  # fmt: skip
    """(max abs error, tolerance, scale) of ``got`` against the reference ``want``, in float64.

    The tolerance is ``tolerance(dtype) * scale``, where the scale is the reference's largest
    magnitude (1 for an all-zero or non-finite reference), at least ``scale_floor``."""
    g64, w64 = np.asarray(got, np.float64), np.asarray(want, np.float64)
    scale = float(np.max(np.abs(w64))) if w64.size else 1.0
    scale = scale if scale > 0 and np.isfinite(scale) else 1.0
    scale = max(scale, scale_floor)
    err = float(np.max(np.abs(g64 - w64))) if w64.size else 0.0
    return err, tolerance(dtype_name) * scale, scale


def dtype_name(x: Any) -> str:
    """The IR's short name (``"f32"``) of an array's dtype; ``"f32"`` for unknown ones."""
    return {"float16": "f16", "bfloat16": "bf16", "float32": "f32", "float64": "f64"}.get(
        np.dtype(x.dtype).name, "f32"
    )


__all__ = ["FLOAT_TOLERANCE", "dtype_name", "output_error", "sample_inputs", "tolerance"]
