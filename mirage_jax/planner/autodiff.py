"""Derivatives of a custom-call region: reverse mode through a backward region planned like any.

An XLA FFI call has no derivative rule, and whether a region became one depends on a timing,
so every kernel is wrapped in ``jax.custom_jvp``. Its rule takes the primal outputs from the
kernel and the tangents from ``region_tangent_p``, a primitive of our own for the region's
tangent map ``t -> J(x) t`` at the primal inputs ``x``:

- forward mode (``jvp``, ``jacfwd``) evaluates the tangent map as XLA computes it (the jvp of
  the region); it is not superoptimized, since a JVP's cost is that of the region again and
  forward-mode training is rare;
- reverse mode (``grad``, ``vjp``, ``jacrev``) transposes the primitive, and its transpose
  rule calls ``optimize`` of the transposed map - the region's backward, a function of
  ``(x, cotangents)`` made of ordinary ops - so the backward is traced, searched, verified
  and timed like any region, a custom call where it wins and XLA where it does not;
- ``vmap`` maps the primitive to the same primitive of the vmapped tangent map, so a
  batched backward (``jacrev``, ``vmap(grad)``) is planned at its batched shape;
- higher derivatives differentiate the tangent map as XLA computes it, or go through the
  backward's own kernels, which carry this same rule.

Residuals: the backward keeps only the region's inputs and recomputes inside its own kernel
what it needs from the forward (as ``jax.checkpoint`` would). For the memory-bound regions
Mirage fuses, reading the inputs again costs less than writing and reading intermediates.
Where that loses - XLA's own derivative computes the forward once and keeps its residuals -
the region differentiates as XLA does: at the first derivative of each signature, a reverse
pass of each way (kernel and planned backward, or XLA's vjp) is timed on the region's sample
inputs (``ReverseChoice``), so that a differentiated region is never slower than XLA's.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend.core import Primitive
from jax.interpreters import ad, batching, mlir

from mirage_jax.planner.region import WIN_MARGIN
from mirage_jax.timing import compare, device_args

region_tangent_p = Primitive("mirage_region_tangent")
region_tangent_p.multiple_results = True


@dataclass(eq=False)  # a primitive parameter: hashed by identity, one per region and batching
class TangentMap:
    """``(x, t) -> J(x) t`` of one region, linear in ``t``, with its planned transposes.

    ``forward`` takes the ``num_primals`` primal inputs then the tangents of the inexact ones
    (the others have none); ``optimize`` plans a function as ``@optimize`` does."""

    forward: Callable[..., tuple[Any, ...]]
    num_primals: int
    optimize: Callable[[Callable[..., Any]], Any]
    choice: ReverseChoice | None = None  # the region's, on the map of its own inputs only
    # optimize(transpose of forward) per tangent shapes, made at the first reverse pass
    backward: dict[tuple[Any, ...], Any] = field(default_factory=dict)
    _batched: dict[tuple[Any, ...], TangentMap] = field(default_factory=dict)

    @functools.cached_property
    def jitted(self) -> Callable[..., tuple[Any, ...]]:
        """``forward`` compiled once, for eager evaluation (outside any jit)."""
        return jax.jit(self.forward)

    def transpose(self, primals: tuple[Any, ...], cotangents: tuple[Any, ...],
                  tangents: tuple[jax.ShapeDtypeStruct, ...]) -> tuple[Any, ...]:  # fmt: skip
        key = tuple((t.shape, t.dtype) for t in tangents)
        if key not in self.backward:
            self.backward[key] = self.optimize(functools.partial(self._transposed, tangents))
        return tuple(self.backward[key](*primals, *cotangents))

    def _transposed(self, tangents: tuple[jax.ShapeDtypeStruct, ...], *args: Any
                    ) -> tuple[Any, ...]:  # fmt: skip
        primals, cotangents = args[: self.num_primals], args[self.num_primals:]
        linear = jax.linear_transpose(lambda *t: self.forward(*primals, *t), *tangents)
        return tuple(linear(tuple(cotangents)))

    def batched(self, in_axes: tuple[int | None, ...]) -> TangentMap:
        """The same map vmapped over the operands ``in_axes`` marks, batch axis first."""
        if in_axes not in self._batched:
            self._batched[in_axes] = TangentMap(
                jax.vmap(self.forward, in_axes=in_axes), self.num_primals, self.optimize)  # fmt: skip
        return self._batched[in_axes]

    def report(self) -> str | None:
        """What the backward regions became, once a reverse pass planned them."""
        maps = [self, *self._batched.values()]
        plans = [p for m in maps for b in m.backward.values() for p in b.plans()]
        lines = self.choice.report() if self.choice is not None else []
        return "\n".join([*lines, *(p.report() for p in plans)]) or None


@dataclass(eq=False)
class ReverseChoice:
    """Whether a differentiated region runs its kernel and planned backward (True) or XLA's
    own derivative, from a timed reverse pass of each on ``sample()``, the region's inputs as
    the planner draws them: one decision, as a region's kernel has one signature (a vmapped
    call sees the same per-example shapes). ``require_speedup=False`` always takes the
    kernel (as ``@optimize`` keeps every custom call then)."""

    sample: Callable[[], Sequence[Any]]
    require_speedup: bool
    chosen: tuple[bool, float] | None = None  # (kernel?, XLA's time / ours)
    _deciding: bool = False

    def kernel_wins(self, call: Callable[..., tuple[Any, ...]],
                    reference: Callable[..., tuple[Any, ...]]) -> bool:  # fmt: skip
        if not self.require_speedup or self._deciding:
            return True
        if self.chosen is None:
            self._deciding = True
            try:
                with jax.ensure_compile_time_eval():
                    self.chosen = self._measure(call, reference)
            finally:
                self._deciding = False
        return self.chosen[0]

    def _measure(self, call: Callable[..., tuple[Any, ...]],
                 reference: Callable[..., tuple[Any, ...]]) -> tuple[bool, float]:  # fmt: skip
        inputs = device_args(self.sample())
        outs = jax.eval_shape(reference, *inputs)
        rng = np.random.default_rng(0)
        scales = device_args([rng.standard_normal(o.shape).astype(o.dtype) for o in outs])
        n = len(inputs)

        def step(fn: Callable[..., tuple[Any, ...]]) -> Callable[..., Any]:
            # the cotangents depend on the outputs, as a loss's do: with independent ones the
            # kernel's forward and backward calls overlapped on the pool and looked 1.4x
            # faster than XLA's vjp on a region whose training step ran 0.8x of XLA's
            def run(*args: Any) -> Any:
                out, pullback = jax.vjp(fn, *args[:n])
                return out, pullback(tuple(o * s for o, s in zip(out, args[n:], strict=True)))
            return jax.jit(run)

        ours, xla = step(call), step(reference)
        ours_s, xla_s = compare(ours, xla, [*inputs, *scales])
        return ours_s * WIN_MARGIN < xla_s, xla_s / ours_s

    def report(self) -> list[str]:
        if self.chosen is None:
            return []
        kernel, ratio = self.chosen
        way = "kernel and planned backward" if kernel else "as XLA does"
        return [f"differentiated: {way} ({ratio:.2f}x vs XLA's vjp)"]


def with_derivatives(kernel: Callable[..., tuple[Any, ...]],
                     reference: Callable[..., tuple[Any, ...]], num_inputs: int,
                     optimize: Callable[[Callable[..., Any]], Any], choice: ReverseChoice,
                     ) -> tuple[Callable[..., tuple[Any, ...]], TangentMap]:  # fmt: skip
    """``kernel`` (a region's custom call) differentiable like ``reference``, the same region
    as XLA computes it (both take the region's ``num_inputs`` inputs and return its outputs
    as a tuple), and the region's tangent map, whose planned backward ``explain`` reports;
    ``choice`` says which way a derivative goes."""
    tangent_map = TangentMap(_jvp_of(reference, num_inputs), num_inputs, optimize, choice)

    @jax.custom_jvp
    def call(*inputs: Any) -> tuple[Any, ...]:
        return tuple(kernel(*inputs))

    @call.defjvp
    def call_jvp(primals: tuple[Any, ...], tangents: tuple[Any, ...]
                 ) -> tuple[tuple[Any, ...], tuple[Any, ...]]:  # fmt: skip
        if not choice.kernel_wins(call, reference):
            out, tangent_out = jax.jvp(reference, primals, tangents)
            return tuple(out), tuple(tangent_out)
        live = [t for p, t in zip(primals, tangents) if _inexact(p)]
        out = region_tangent_p.bind(*primals, *live, tangent_map=tangent_map)
        # call, not kernel: under an outer derivative (hessian) the primals are its tracers
        return tuple(call(*primals)), tuple(out)

    return call, tangent_map


def _jvp_of(reference: Callable[..., tuple[Any, ...]], num_inputs: int
            ) -> Callable[..., tuple[Any, ...]]:  # fmt: skip
    """The region's jvp as a flat function of its primals and its inexact inputs' tangents."""

    def forward(*args: Any) -> tuple[Any, ...]:
        primals, live = args[:num_inputs], iter(args[num_inputs:])
        tangents = [next(live) if _inexact(p) else np.zeros(np.shape(p), jax.dtypes.float0)
                    for p in primals]  # fmt: skip
        return tuple(jax.jvp(reference, tuple(primals), tuple(tangents))[1])

    return forward


def _inexact(x: Any) -> bool:
    return jnp.issubdtype(jnp.result_type(x), jnp.inexact)


def _tangent_map_impl(*args: Any, tangent_map: TangentMap) -> list[Any]:
    return list(tangent_map.jitted(*args))


def _tangent_map_abstract(*avals: Any, tangent_map: TangentMap) -> list[Any]:
    shapes = jax.eval_shape(tangent_map.forward,
                            *(jax.ShapeDtypeStruct(a.shape, a.dtype) for a in avals))  # fmt: skip
    return [jax.core.ShapedArray(s.shape, s.dtype) for s in shapes]


def _tangent_map_jvp(primals: tuple[Any, ...], tangents: tuple[Any, ...], *,
                     tangent_map: TangentMap) -> tuple[Any, Any]:  # fmt: skip
    """A derivative of the tangent map (second order): as XLA computes it."""
    tangents = tuple(ad.instantiate_zeros(t) for t in tangents)
    out = region_tangent_p.bind(*primals, tangent_map=tangent_map)
    return out, list(jax.jvp(tangent_map.forward, tuple(primals), tangents)[1])


def _tangent_map_transpose(cotangents: list[Any], *args: Any, tangent_map: TangentMap
                           ) -> list[Any]:  # fmt: skip
    n = tangent_map.num_primals
    primals = args[:n]
    if any(ad.is_undefined_primal(p) for p in primals):
        raise NotImplementedError("a region's tangent map is linear in its tangents only")
    cts = tuple(ad.instantiate_zeros(c) for c in cotangents)
    tangents = tuple(jax.ShapeDtypeStruct(t.aval.shape, t.aval.dtype) if ad.is_undefined_primal(t)
                     else jax.ShapeDtypeStruct(jnp.shape(t), jnp.result_type(t))
                     for t in args[n:])  # fmt: skip
    out = tangent_map.transpose(tuple(primals), cts, tangents)
    return [None] * n + [c if ad.is_undefined_primal(t) else None
                         for c, t in zip(out, args[n:])]  # fmt: skip


def _tangent_map_batch(args: tuple[Any, ...], dims: tuple[Any, ...], *,
                       tangent_map: TangentMap) -> tuple[list[Any], list[int]]:  # fmt: skip
    moved = [a if d is None else jnp.moveaxis(a, d, 0) for a, d in zip(args, dims)]
    in_axes = tuple(None if d is None else 0 for d in dims)
    out = region_tangent_p.bind(*moved, tangent_map=tangent_map.batched(in_axes))
    return out, [0] * len(out)


region_tangent_p.def_impl(_tangent_map_impl)
region_tangent_p.def_abstract_eval(_tangent_map_abstract)
ad.primitive_jvps[region_tangent_p] = _tangent_map_jvp
ad.primitive_transposes[region_tangent_p] = _tangent_map_transpose
batching.primitive_batchers[region_tangent_p] = _tangent_map_batch
mlir.register_lowering(region_tangent_p, lambda ctx, *args, tangent_map: mlir.lower_fun(
    tangent_map.forward, multiple_results=True)(ctx, *args))

__all__ = ["TangentMap", "region_tangent_p", "with_derivatives"]
