"""``@optimize`` and ``explain``: trace → plan each region → build → one jitted program.

The pipeline for one set of argument shapes is ``_build_plan``; read it top to bottom:

1. trace the function to a jaxpr and cut it into regions of supported ops (``frontend``);
2. for every region, find a μGraph (``lower``: the superoptimizer by default), compile it for
   the CPU, check it against XLA on random inputs and time both in this process;
3. keep the custom call only where it is verified and faster, else leave the region to XLA
   and record why;
4. jit the whole function with the kept regions as custom calls (``TracedProgram.run``).

The user's promise: never a wrong answer, never slower than XLA, and ``explain`` says why.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import jax
import numpy as np

from mirage_jax.errors import MirageError
from mirage_jax.frontend import TracedProgram, trace
from mirage_jax.lowering import RegionPlan, plan_region

log = logging.getLogger("mirage_jax")

STRATEGIES = ("search", "as_is", "xla")


@dataclass(frozen=True)
class OptimizeOptions:
    """How ``@optimize`` treats each region (the search bounds live in ``SearchConfig``)."""

    strategy: str = "search"  # "search": superoptimize; "as_is": the region's own kernel graph
    require_speedup: bool = True  # keep a custom call only if it beats XLA in this process
    verify: bool = True  # check every compiled region against XLA on random inputs
    cache: bool = True  # reuse and record decisions in the on-disk cache
    config: Any = None  # mirage_jax.config.SearchConfig or None for the defaults

    def __post_init__(self) -> None:
        if self.strategy not in STRATEGIES:
            raise MirageError(
                f"unknown strategy {self.strategy!r}",
                remedy=f"use one of {', '.join(STRATEGIES)}",
            )


@dataclass
class Plan:
    """What one specialisation (argument shapes/dtypes/static values) of a function became."""

    program: TracedProgram
    regions: tuple[RegionPlan, ...]
    jitted: Callable[..., Any]

    def report(self) -> str:
        lines = [f"{len(self.regions)} region(s), {len(self.program.cuts)} cut(s)"]
        for plan in self.regions:
            lines.append(plan.describe())
        for cut in self.program.cuts:
            lines.append(f"cut: {cut}")
        return "\n".join(lines)


@dataclass
class Optimized:
    """A function under ``@optimize``: specialised and built on first call per signature."""

    fn: Callable[..., Any]
    options: OptimizeOptions
    static_argnums: tuple[int, ...] = ()
    _plans: dict[Any, Plan] = field(default_factory=dict)

    def __post_init__(self) -> None:
        functools.update_wrapper(self, self.fn)  # type: ignore[arg-type]

    def __call__(self, *args: Any) -> Any:
        plan = self.plan(*args)
        if not self.static_argnums:
            return plan.jitted(*args)
        dynamic = [a for i, a in enumerate(args) if i not in self.static_argnums]
        return plan.jitted(*dynamic)

    def plan(self, *args: Any) -> Plan:
        key = _signature(args, self.static_argnums)
        if key not in self._plans:
            self._plans[key] = _build_plan(self.fn, args, self.static_argnums, self.options)
        return self._plans[key]

    def explain(self, *args: Any) -> str:
        return self.plan(*args).report()


def optimize(
    fn: Callable[..., Any] | None = None,
    *,
    config: Any = None,
    strategy: str = "search",
    require_speedup: bool = True,
    verify: bool = True,
    cache: bool = True,
    static_argnums: int | Sequence[int] = (),
) -> Any:
    """Superoptimize ``fn``'s supported regions with Mirage; the rest stays with XLA.

    Usable as ``@optimize`` or ``@optimize(config=SearchConfig(...), static_argnums=...)``.
    """
    options = OptimizeOptions(strategy, require_speedup, verify, cache, config)
    nums = (static_argnums,) if isinstance(static_argnums, int) else tuple(static_argnums)

    def wrap(f: Callable[..., Any]) -> Optimized:
        return Optimized(f, options, nums)

    return wrap(fn) if fn is not None else wrap


def explain(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> str:
    """A readable report of what ``optimize`` does with ``fn`` at these arguments and why."""
    opt = fn if isinstance(fn, Optimized) else optimize(fn, **kwargs)
    return opt.explain(*args)


def _signature(args: Sequence[Any], static_argnums: tuple[int, ...]) -> Any:
    def leaf_key(x: Any) -> Any:
        # the per-call path: arrays answer from their attributes; result_type (slow) only
        # for Python scalars and other leaves
        dtype = getattr(x, "dtype", None)
        if dtype is not None and hasattr(x, "shape"):
            return (x.shape, dtype, getattr(x, "weak_type", False))
        return (tuple(np.shape(x)), jax.numpy.result_type(x), getattr(x, "weak_type", False))

    parts = []
    for i, a in enumerate(args):
        if i in static_argnums:
            parts.append(("static", a))
        elif type(a) in _ARRAY_TYPES or _is_array_type(type(a)):  # common, without flattening
            parts.append((a.shape, a.dtype, a.weak_type))
        else:
            leaves, treedef = jax.tree_util.tree_flatten(a)
            parts.append((treedef, tuple(leaf_key(x) for x in leaves)))
    return tuple(parts)


# Concrete classes of jax.Array seen so far: isinstance against the abstract jax.Array costs
# about a microsecond per argument, on a path every call of an optimized function takes.
_ARRAY_TYPES: set[type] = set()


def _is_array_type(cls: type) -> bool:
    if issubclass(cls, jax.Array) and not issubclass(cls, jax.core.Tracer):
        _ARRAY_TYPES.add(cls)
        return True
    return False


def _build_plan(
    fn: Callable[..., Any], args: Sequence[Any], static_argnums: tuple[int, ...],
    options: OptimizeOptions,
) -> Plan:  # fmt: skip
    program = trace(fn, *args, static_argnums=static_argnums)
    regions = tuple(plan_region(program, region, options) for region in program.regions)
    impls = {p.index: p.impl for p in regions if p.impl is not None}
    for p in regions:
        log.info("%s", p.describe())

    if not impls:
        return Plan(program, regions, _xla_call(fn, args, static_argnums))

    def run(*dynamic: Any) -> Any:
        return program.run(*dynamic, region_impls=impls)

    return Plan(program, regions, jax.jit(run))


def _xla_call(fn: Callable[..., Any], args: Sequence[Any], static_argnums: tuple[int, ...]
              ) -> Callable[..., Any]:  # fmt: skip
    """The function exactly as ``jax.jit`` compiles it, called with the dynamic arguments:
    what a plan that replaces no region runs, so that it costs what XLA costs."""
    xla = jax.jit(fn, static_argnums=static_argnums)
    if not static_argnums:
        return xla  # no wrapper: a Python frame per call measured ~7 us on a 2-core host
    static = {i: args[i] for i in static_argnums}

    def call(*dynamic: Any) -> Any:
        rest = iter(dynamic)
        full = [static[i] if i in static else next(rest) for i in range(len(args))]
        return xla(*full)

    return call


__all__ = ["Optimized", "OptimizeOptions", "explain", "optimize"]
