"""``@optimize`` and ``explain``: trace → plan each region → build → one jitted program.

The pipeline for one set of argument shapes is ``_build_plan``; read it top to bottom:

1. trace the function to a jaxpr and cut it into regions of supported ops (``frontend``),
   splitting those too large for one search where the cost model prices the cuts lowest;
2. pick the backend from the device the arguments live on (``backend_for``); for every
   region, find a μGraph (``planner``: the superoptimizer by default), compile it for that
   backend, check it against XLA on random inputs and time both in this process;
3. keep the custom call only where it is verified and faster, else leave the region to XLA
   and record why; then time the whole program with its custom calls against ``jax.jit``
   and drop those that do not pay for themselves there (``planner.whole``);
4. jit the whole function with the kept regions as custom calls (``TracedProgram.run``).

The user's promise: never a wrong answer, never slower than XLA, and ``explain`` says why.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import jax
import numpy as np

from mirage_jax.backend import Backend, backend_for
from mirage_jax.errors import MirageError
from mirage_jax.frontend import TracedProgram, trace
from mirage_jax.planner.autodiff import ReverseChoice, TangentMap, with_derivatives
from mirage_jax.planner.batching import with_batching
from mirage_jax.planner.region import RegionPlan, plan_regions
from mirage_jax.planner.search import split_for_search
from mirage_jax.planner.whole import keep_winning, program_key
from mirage_jax.timing import compare

log = logging.getLogger("mirage_jax")
# MIRAGE_JAX_DEBUG=1 shows the search's stage-by-stage detail (DEBUG) wherever the user's
# logging prints, unless the user gave this logger a level; egglog's own logs are let through
# by mirage_jax.search.egraph.quiet_egglog, which reads the same variable (not imported here:
# it loads egglog)
_DEBUG = os.environ.get("MIRAGE_JAX_DEBUG", "").strip().lower() not in ("", "0", "false", "no", "off")
if _DEBUG and log.level == logging.NOTSET:
    log.setLevel(logging.DEBUG)

STRATEGIES = ("search", "as_is", "xla")


@dataclass(frozen=True)
class OptimizeOptions:
    """How ``@optimize`` treats each region (the search bounds live in ``SearchConfig``)."""

    strategy: str = "search"  # "search": superoptimize; "as_is": the region's own kernel graph
    require_speedup: bool = True  # keep a custom call only if it beats XLA in this process
    verify: bool = True  # check every compiled region against XLA on random inputs
    cache: bool = True  # reuse and record decisions in the on-disk cache
    config: Any = None  # mirage_jax.search.config.SearchConfig or None for the defaults
    # where the search's tasks run: None for a local process pool per plan; a Dask
    # distributed.Client (or any concurrent.futures.Executor) searches all regions at once on it
    executor: Any = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if self.strategy not in STRATEGIES:
            raise MirageError(
                f"unknown strategy {self.strategy!r}",
                remedy=f"use one of {', '.join(STRATEGIES)}",
            )


@dataclass
class Plan:
    """What one specialisation (argument shapes/dtypes/static values) of a function became.

    ``traceable`` takes the dynamic arguments and is what ``Optimized`` stages into its
    dispatching jit; ``jitted`` is the same computation as a stand-alone jitted callable.
    """

    program: TracedProgram
    backend: Backend
    regions: tuple[RegionPlan, ...]
    traceable: Callable[..., Any]
    jitted: Callable[..., Any]
    tangent_maps: dict[int, TangentMap] = field(default_factory=dict)  # per custom-call region
    whole: str = ""  # how the custom calls fared in the whole program (``planner.whole``)

    def report(self) -> str:
        lines = [f"{len(self.regions)} region(s), {len(self.program.cuts)} cut(s)"]
        splits: list[Any] = []
        for plan in self.regions:
            split = self.program.regions[plan.index].split
            if split is not None and split not in splits:
                splits.append(split)
                lines.append(f"split: {split}")
            lines.append(plan.describe())
        for cut in self.program.cuts:
            lines.append(f"cut: {cut}")
        if self.whole:
            lines.append(f"whole program: {self.whole}")
        for index, tangent_map in self.tangent_maps.items():
            backward = tangent_map.report()
            if backward is not None:
                lines.append(f"region {index} under derivatives (planned at the first one):")
                lines.extend("  " + line for line in backward.splitlines())
        return "\n".join(lines)


class _NoPlanYet(Exception):
    """Raised while tracing the dispatcher for a signature that has no plan: the plan must be
    built outside any trace (it compiles and times code), then the call is traced again."""


@dataclass(eq=False)  # identity equality and hash: jax.jit(fast) and functools caches need one
class Optimized:
    """A function under ``@optimize``: specialised and built on first call per signature.

    Calls go through one ``jax.jit`` whose body picks the plan for the signature it is traced
    at, so a call with a seen signature takes jit's C++ fast path with no Python work of ours:
    Python between two dispatches measured 10-20 us on a 2-core host, well beyond its own run
    time, and a program that XLA keeps must cost what ``jax.jit`` costs. A call on tracers
    (inside a transformation or the caller's jit) inlines the plan's program instead.
    """

    fn: Callable[..., Any]
    options: OptimizeOptions
    static_argnums: tuple[int, ...] = ()
    _plans: dict[Any, Plan] = field(default_factory=dict)

    def __post_init__(self) -> None:
        functools.update_wrapper(self, self.fn)  # type: ignore[arg-type]
        # inline: under a transformation or the user's jit the program joins the caller's
        # trace as fn itself would; behind a jit boundary reverse mode splits it into a
        # forward and a backward call and XLA schedules the pieces apart (jax.grad of a jitted
        # rmsnorm_linear ran 0.92x of the same function inlined, with the same fusions)
        self._dispatch = jax.jit(self._staged, static_argnums=self.static_argnums, inline=True)

    def __call__(self, *args: Any) -> Any:
        try:
            return self._dispatch(*args)
        except _NoPlanYet:
            self.plan(*args)
            return self._dispatch(*args)

    def _staged(self, *args: Any) -> Any:
        plan = self._plans.get(_signature(args, self.static_argnums))
        if plan is None:
            raise _NoPlanYet
        if not self.static_argnums:
            return plan.traceable(*args)
        return plan.traceable(*(a for i, a in enumerate(args) if i not in self.static_argnums))

    def plan(self, *args: Any) -> Plan:
        key = _signature(args, self.static_argnums)
        if key not in self._plans:
            self._plans[key] = _build_plan(self.fn, args, self.static_argnums, self.options)
        return self._plans[key]

    def explain(self, *args: Any) -> str:
        return self.plan(*args).report()

    def plans(self) -> tuple[Plan, ...]:
        """Every specialisation planned so far."""
        return tuple(self._plans.values())


def optimize(
    fn: Callable[..., Any] | None = None,
    *,
    config: Any = None,
    strategy: str = "search",
    require_speedup: bool = True,
    verify: bool = True,
    cache: bool = True,
    static_argnums: int | Sequence[int] = (),
    executor: Any = None,
) -> Any:
    """Superoptimize ``fn``'s supported regions with Mirage; the rest stays with XLA.

    Usable as ``@optimize`` or ``@optimize(config=SearchConfig(...), static_argnums=...)``.
    ``executor``: where the searches run (see ``OptimizeOptions.executor``), e.g. a
    ``distributed.Client``; set ``SearchConfig(workers=...)`` to its thread count to use it all.
    """
    options = OptimizeOptions(strategy, require_speedup, verify, cache, config, executor)
    nums = (static_argnums,) if isinstance(static_argnums, int) else tuple(static_argnums)

    def wrap(f: Callable[..., Any]) -> Optimized:
        return Optimized(f, options, nums)

    return wrap(fn) if fn is not None else wrap


def explain(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> str:
    """A readable report of what ``optimize`` does with ``fn`` at these arguments and why."""
    opt = fn if isinstance(fn, Optimized) else optimize(fn, **kwargs)
    return opt.explain(*args)


def _signature(args: Sequence[Any], static_argnums: tuple[int, ...]) -> Any:
    """The plan key of a call: the same for concrete arguments and for the tracers jit makes
    of them (shape, canonical dtype and weak type of every leaf, the pytree structure and the
    static values)."""
    parts = []
    for i, a in enumerate(args):
        if i in static_argnums:
            parts.append(("static", a))
            continue
        leaves, treedef = jax.tree_util.tree_flatten(a)
        parts.append((treedef, tuple(_leaf_key(x) for x in leaves)))
    return tuple(parts)


def _leaf_key(x: Any) -> tuple[Any, ...]:
    aval = jax.typeof(x)
    return (aval.shape, aval.dtype, aval.weak_type)


def _build_plan(
    fn: Callable[..., Any], args: Sequence[Any], static_argnums: tuple[int, ...],
    options: OptimizeOptions,
) -> Plan:  # fmt: skip
    program = trace(fn, *args, static_argnums=static_argnums)
    dynamic = jax.tree_util.tree_leaves(
        [a for i, a in enumerate(args) if i not in static_argnums])  # fmt: skip
    backend = backend_for(dynamic)
    if options.strategy == "search":
        program = split_for_search(program, options.config, backend)
    # a first call inside the user's own jit (args are tracers) plans all the same: the
    # search, verification and timing run on concrete random inputs and must run now, not be
    # staged into the user's trace. Compile-time eval makes them run, but only then: it also
    # folds what the timed programs compute from constants alone (a causal mask from iota)
    # while tracing them, and so times programs that no later call runs (a GPT-2 block's
    # custom calls read 1.22x of jax.jit that way, 0.90x as they run). Tracing the program
    # stays outside too: there jnp.mean's divisor would become a captured constant.
    staged = any(isinstance(x, jax.core.Tracer) for x in dynamic)
    with jax.ensure_compile_time_eval() if staged else contextlib.nullcontext():
        regions = plan_regions(program, options, backend)
        whole = _judge_whole(program, regions, fn, args, static_argnums, options)
    transformable = {p.index: _transformable(program, p.index, p.impl, options)
                     for p in regions if p.impl is not None}  # fmt: skip
    impls = {index: call for index, (call, _) in transformable.items()}
    tangent_maps = {index: tangent_map for index, (_, tangent_map) in transformable.items()}
    for p in regions:
        log.info("%s", p.describe())

    if not impls:
        plain = _dynamic_call(fn, args, static_argnums)
        return Plan(program, backend, regions, plain, jax.jit(plain), whole=whole)

    def run(*dynamic: Any) -> Any:
        return program.run(*dynamic, region_impls=impls)

    return Plan(program, backend, regions, run, jax.jit(run), tangent_maps, whole)


def _judge_whole(program: TracedProgram, regions: Sequence[RegionPlan], fn: Callable[..., Any],
                 args: Sequence[Any], static_argnums: tuple[int, ...], options: OptimizeOptions
                 ) -> str:  # fmt: skip
    """Drop the custom calls that do not pay in the whole program (``planner.whole``), unless
    the user keeps them regardless of speed; what was measured, for explain."""
    if not options.require_speedup:
        return ""
    key = program_key([p.key for p in regions], str(program.jaxpr)) if options.cache else None
    timer = _program_timer(program, regions, fn, args, static_argnums)
    return keep_winning(regions, timer, key, alone=not program.cuts)


def _program_timer(program: TracedProgram, regions: Sequence[RegionPlan],
                   fn: Callable[..., Any], args: Sequence[Any], static_argnums: tuple[int, ...]
                   ) -> Callable[[frozenset[int]], tuple[float, float]]:  # fmt: skip
    """Times of the program with the custom calls of a set of regions, and of jax.jit, on the
    call's own arguments (random ones of their types where the call is being traced)."""
    dynamic = _concrete([a for i, a in enumerate(args) if i not in static_argnums])
    baseline = jax.jit(_dynamic_call(fn, args, static_argnums))

    def measure(keep: frozenset[int]) -> tuple[float, float]:
        impls = {p.index: p.impl for p in regions if p.index in keep}
        run = jax.jit(lambda *d: program.run(*d, region_impls=impls))
        return compare(run, baseline, dynamic, rounds=6)

    return measure


def _concrete(args: Sequence[Any]) -> list[Any]:
    """``args`` with every tracer leaf replaced by a random array of its type."""
    rng = np.random.default_rng(0)

    def leaf(x: Any) -> Any:
        if not isinstance(x, jax.core.Tracer):
            return x
        aval = jax.typeof(x)
        if jax.numpy.issubdtype(aval.dtype, jax.numpy.floating):
            return jax.numpy.asarray(rng.standard_normal(aval.shape), aval.dtype)
        return jax.numpy.zeros(aval.shape, aval.dtype)  # indices and flags: 0 is always valid

    return jax.tree_util.tree_map(leaf, list(args))


def _transformable(program: TracedProgram, index: int, kernel: Callable[..., Any],
                   options: OptimizeOptions) -> tuple[Callable[..., Any], TangentMap]:  # fmt: skip
    """A region's kernel as jax transformations expect it: batched by planning the vmapped
    region, and differentiated by planning its backward, each as a region of its own."""
    reference = program.region_callable(index)
    region = program.regions[index]

    def plan(fn: Callable[..., Any]) -> Optimized:
        return Optimized(fn, options)

    batchable = with_batching(kernel, reference, plan)
    choice = ReverseChoice(lambda: region.sample_inputs(seed=index), options.require_speedup)
    return with_derivatives(batchable, reference, len(region.inputs), plan, choice)


def _dynamic_call(fn: Callable[..., Any], args: Sequence[Any], static_argnums: tuple[int, ...]
                  ) -> Callable[..., Any]:  # fmt: skip
    """``fn`` called with the dynamic arguments (the static ones bound): what a plan that
    replaces no region stages, so that it is exactly the program ``jax.jit`` compiles."""
    if not static_argnums:
        return fn
    static = {i: args[i] for i in static_argnums}

    def call(*dynamic: Any) -> Any:
        rest = iter(dynamic)
        return fn(*[static[i] if i in static else next(rest) for i in range(len(args))])

    return call


__all__ = ["OptimizeOptions", "Optimized", "explain", "optimize"]
