"""The tests' one closeness check: a result against an independent reference, element by
element, in float64, at the tightest tolerance its dtype allows (see ``tests/README.md``).

An element passes when ``|got - want| <= rtol * (|want| + typical)``, where ``typical`` is the
median magnitude of the reference's nonzero elements. The ``typical`` term admits the rounding
of sums that cancel (their error follows the size of the terms, not of the result); it does
not grow with the largest element, so an output spanning magnitudes (``exp(3 * x)``) is
checked per element and a small element returned as 0 fails. A product of two computed
factors passes its own per-element scale (``product_scale``). This is
deliberately tighter than the verifier's own tolerance (``mirage_jax.interpret.numerics``),
which scales with an output's largest magnitude: a test must catch a kernel that is wrong by
less than what the verifier would reject.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

# Per dtype: float32 results of differently ordered sums agree to a few units in the last
# place (6e-8) of the terms; 1e-5 leaves room for sums of ~100 terms (longer ones: sum_rtol).
# Half types are checked at a few units of their own rounding (f16: 2**-11 = 4.9e-4, bf16:
# 2**-8 = 3.9e-3), which half-precision accumulation exceeds (f16: 5.8e-3 and more for 256
# terms, bf16: 3.8e-2 and more; test_codegen_cuda's control).
RTOL = {"float16": 2.5e-3, "bfloat16": 1.6e-2, "float32": 1e-5, "float64": 1e-12}


def rtol_for(dtype: Any) -> float:
    """The relative tolerance of a result of ``dtype``."""
    return RTOL[np.dtype(dtype).name]


def sum_rtol(terms: int, dtype: Any = np.float32) -> float:
    """The tolerance of results that sum ``terms`` rounded terms (a matmul's K, a reduction's
    length): two such sums taken in different orders drift apart like a random walk of
    roundings, sqrt(terms) units; 16 of those (a product or an exp of such sums amplifies the
    drift a few times), or the dtype's ``RTOL`` if that is larger. For K = 4096 in float32:
    6e-5, where ``jax.jit`` itself is 2e-5 from float64 (gated_mlp, qknorm_attn)."""
    unit = float(np.finfo(dtype).eps) / 2
    return max(rtol_for(dtype), 16 * unit * terms**0.5)


def typical(want: np.ndarray) -> float:
    """The median magnitude of the reference's finite nonzero elements (0 when it has none)."""
    mags = np.abs(want[np.isfinite(want) & (want != 0)])
    return float(np.median(mags)) if mags.size else 0.0


def error_scale(want: np.ndarray) -> np.ndarray:
    """The default per-element scale of the error: ``|want| + typical(want)``."""
    return np.abs(want) + typical(want)


def product_scale(a: Any, b: Any) -> np.ndarray:
    """The per-element error scale of a product of two computed factors (float64 values of
    them): each factor's rounding, at the size of its terms, times the other factor,
    ``(|a| + typical(a)) * (|b| + typical(b))``. A gated product silu(x w1) * (x w2) takes
    ``a = x w1`` (silu's slope is at most 1.1). The output's own median cannot stand in: where
    one factor is near 0 and the other large, the element is small and its error is not."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return error_scale(a) * error_scale(b)


def bad_elements(got: Any, want: Any, rtol: float, scale: Any = None) -> np.ndarray:
    """A mask of the elements of ``got`` that are not within ``rtol * scale`` of ``want``
    (both in float64; ``scale`` per element, default ``error_scale(want)``)."""
    g, w = np.asarray(got, np.float64), np.asarray(want, np.float64)
    scale = error_scale(w) if scale is None else np.asarray(scale, np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        ok = (np.abs(g - w) <= rtol * scale) | (g == w) | (np.isnan(g) & np.isnan(w))
    return ~ok


def assert_array_close(got: Any, want: Any, *, dtype: Any = None, rtol: float | None = None,
                       scale: Any = None, what: str = "") -> None:  # fmt: skip
    """``got`` has ``want``'s shape, the given ``dtype`` (default: ``want``'s) and every
    element within ``rtol`` (default: the dtype's ``RTOL``) times ``scale`` (default:
    ``error_scale(want)``) of ``want``."""
    got_dtype = np.asarray(got).dtype if not hasattr(got, "dtype") else got.dtype
    expected = np.dtype(dtype if dtype is not None else np.asarray(want).dtype)
    assert np.shape(got) == np.shape(want), f"{what}: shape {np.shape(got)} != {np.shape(want)}"
    assert np.dtype(got_dtype) == expected, f"{what}: dtype {got_dtype} != {expected}"
    rtol = rtol if rtol is not None else rtol_for(expected)
    g, w = np.asarray(got, np.float64), np.asarray(want, np.float64)
    scale = error_scale(w) if scale is None else np.broadcast_to(scale, w.shape)
    bad = bad_elements(g, w, rtol, scale)
    if bad.any():
        at = tuple(np.argwhere(bad)[0].tolist())
        with np.errstate(invalid="ignore", divide="ignore"):
            rel = np.nanmax(np.abs(g - w)[bad] / scale[bad])
        raise AssertionError(
            f"{what}: {int(bad.sum())} of {w.size} elements differ (rtol {rtol:g}, worst "
            f"{rel:.3g} of the error scale, typical |want| {typical(w):.3g}); first at {at}: "
            f"got {g[at]!r}, want {w[at]!r}"
        )


def assert_tree_close(got: Any, want: Any, *, dtype: Any = None, rtol: float | None = None
                      ) -> None:  # fmt: skip
    """The same pytree structure, and every leaf close (``assert_array_close``)."""
    got_leaves, got_tree = jax.tree.flatten(got)
    want_leaves, want_tree = jax.tree.flatten(want)
    assert got_tree == want_tree, f"tree {got_tree} != {want_tree}"
    assert len(got_leaves) == len(want_leaves)
    for i, (g, w) in enumerate(zip(got_leaves, want_leaves, strict=True)):
        assert_array_close(g, w, dtype=dtype, rtol=rtol, what=f"leaf {i}")


__all__ = ["RTOL", "assert_array_close", "assert_tree_close", "bad_elements", "error_scale",
           "product_scale", "rtol_for", "sum_rtol", "typical"]  # fmt: skip
