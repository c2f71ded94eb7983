"""``trace``: a function and example arguments -> a ``TracedProgram`` of regions and cuts.

``TracedProgram.run`` re-executes the program on new arguments of the same shapes: regions
with an implementation are called as one unit, every other equation is replayed with
``primitive.bind``. It is pure jax, so it can be jitted: that is how ``@optimize`` builds one
XLA program in which the regions are custom calls and the rest is left to XLA.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np
from jax.extend.core import ClosedJaxpr, DropVar, JaxprEqn, Literal, Var
from jax.extend.source_info_util import user_context

from mirage_jax.errors import TraceError
from mirage_jax.frontend.flatten import flatten
from mirage_jax.frontend.partition import Cut, Region, partition
from mirage_jax.frontend.schedule import hoist_cuts

RegionImpl = Callable[..., Sequence[Any]]


@dataclass(frozen=True, eq=False)
class TracedProgram:
    """A traced function: its flat jaxpr, the regions found in it and the cuts between them.

    ``jaxpr`` is the flat closed jaxpr (nested calls inlined; it takes the flattened dynamic
    arguments and returns the flattened outputs). ``sources[i]`` is the user's source line of
    equation ``i`` where known.
    """

    name: str
    jaxpr: ClosedJaxpr
    sources: tuple[str | None, ...]
    regions: tuple[Region, ...]
    cuts: tuple[Cut, ...]
    in_tree: Any
    out_tree: Any
    num_args: int
    static_args: tuple[tuple[int, Any], ...]

    @property
    def eqns(self) -> Sequence[JaxprEqn]:
        return self.jaxpr.jaxpr.eqns

    # ---------------------------------------------------------------------------- running

    def run(
        self, *args: Any, region_impls: Mapping[int, RegionImpl] | None = None, **kwargs: Any
    ) -> Any:
        """``fn(*args, **kwargs)`` with ``region_impls[i]`` computing region ``i``.

        ``args`` are the positional arguments without the static ones (all of them is also
        accepted, if the static ones equal those traced). Each implementation takes the
        region's input arrays in order and returns its output arrays in order; regions
        without one, and everything outside regions, run the original equations.
        """
        leaves = self._flatten_args(args, kwargs)
        impls = dict(region_impls or {})
        unknown = sorted(set(impls) - {r.index for r in self.regions})
        if unknown:
            raise TraceError(
                f"region_impls names region(s) {unknown}, but {self.name} has "
                f"{len(self.regions)} region(s)",
                remedy="key region_impls by Region.index",
            )
        jaxpr = self.jaxpr.jaxpr
        env: dict[Var, Any] = dict(zip(jaxpr.constvars, self.jaxpr.consts))
        env.update(zip(jaxpr.invars, leaves))
        starts = {r.span[0]: r for r in self.regions if r.index in impls}
        i = 0
        while i < len(jaxpr.eqns):
            region = starts.get(i)
            if region is None:
                _replay(jaxpr.eqns[i], env, {})
                i += 1
                continue
            outs = impls[region.index](*(_read(env, {}, a) for a in region.inputs))
            _store_region_outputs(region, outs, env)
            i = region.span[1]
        outs = [_read(env, {}, a) for a in jaxpr.outvars]
        return jax.tree_util.tree_unflatten(self.out_tree, outs)

    def region_callable(self, index: int) -> Callable[..., tuple[Any, ...]]:
        """Region ``index`` as XLA would run it: its equations, on its inputs in order."""
        region = self.regions[index]

        def call(*inputs: Any) -> tuple[Any, ...]:
            if len(inputs) != len(region.inputs):
                raise TraceError(
                    f"region {index} takes {len(region.inputs)} input(s), got {len(inputs)}"
                )
            env: dict[Var, Any] = {}
            literals: dict[int, Any] = {}  # literals the graph takes as inputs: use the value
            for atom, x in zip(region.inputs, inputs):
                if isinstance(atom, Literal):
                    literals[id(atom)] = jax.numpy.reshape(x, atom.aval.shape)
                else:
                    env[atom] = x
            for i in region.eqns:
                _replay(self.eqns[i], env, literals)
            return tuple(env[v] for v in region.outputs)

        return call

    def _flatten_args(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[Any]:
        static = dict(self.static_args)
        if static and len(args) == self.num_args:
            for i, value in static.items():
                if not _same_static(args[i], value):
                    raise TraceError(
                        f"static argument {i} of {self.name} is {args[i]!r}, traced with {value!r}",
                        remedy="trace the function again for the new static value",
                    )
            args = tuple(a for i, a in enumerate(args) if i not in static)
        leaves, tree = jax.tree_util.tree_flatten((tuple(args), kwargs))
        if tree != self.in_tree:
            raise TraceError(
                f"{self.name} was traced with arguments {self.in_tree}, called with {tree}",
                remedy="pass arguments with the traced structure (static arguments may be "
                "left out), or trace again",
            )
        for k, (leaf, var) in enumerate(zip(leaves, self.jaxpr.jaxpr.invars)):
            if tuple(np.shape(leaf)) != tuple(var.aval.shape):
                raise TraceError(
                    f"argument leaf {k} of {self.name} has shape {tuple(np.shape(leaf))}, "
                    f"traced with {tuple(var.aval.shape)}",
                    remedy="trace the function again for the new shapes",
                )
        return leaves

    # ------------------------------------------------------------------------- reporting

    def describe(self) -> str:
        """Regions with their kernel graphs, then the cuts with their source lines."""
        head = f"{self.name}: {len(self.eqns)} equation(s), {len(self.regions)} region(s), "
        lines = [head + f"{len(self.cuts)} cut(s)"]
        lines += [r.describe() for r in self.regions]
        lines += [f"cut: {c}" for c in self.cuts]
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.describe()

    def __repr__(self) -> str:
        return (
            f"TracedProgram({self.name}: {len(self.eqns)} equation(s), "
            f"{len(self.regions)} region(s), {len(self.cuts)} cut(s))"
        )


def _same_static(a: Any, b: Any) -> bool:
    try:
        return bool(a is b or a == b)
    except (TypeError, ValueError):  # e.g. arrays, whose == is elementwise
        return False


def _read(env: dict[Var, Any], literals: dict[int, Any], atom: Any) -> Any:
    if isinstance(atom, Literal):
        return literals.get(id(atom), atom.val)
    return env[atom]


def _replay(eqn: JaxprEqn, env: dict[Var, Any], literals: dict[int, Any]) -> None:
    bound = eqn.primitive.get_bind_params(eqn.params)  # (subfuns, params) in older jax
    subfuns, params = bound if isinstance(bound, tuple) else ((), bound)
    invals = [_read(env, literals, a) for a in eqn.invars]
    # Keep the user's source line on replayed ops (XLA metadata, error messages).
    with user_context(eqn.source_info.traceback), eqn.ctx.manager:
        out = eqn.primitive.bind(*subfuns, *invals, **params)
    outs = out if eqn.primitive.multiple_results else [out]
    env.update((v, x) for v, x in zip(eqn.outvars, outs) if not isinstance(v, DropVar))


def _store_region_outputs(region: Region, outs: Sequence[Any], env: dict[Var, Any]) -> None:
    outs = list(outs)
    if len(outs) != len(region.outputs):
        raise TraceError(
            f"the implementation of region {region.index} returned {len(outs)} array(s), "
            f"the region has {len(region.outputs)} output(s)",
            remedy="return one array per graph OUTPUT, in order",
        )
    for k, (var, x) in enumerate(zip(region.outputs, outs)):
        if tuple(np.shape(x)) != tuple(var.aval.shape):
            raise TraceError(
                f"output {k} of region {region.index}'s implementation has shape "
                f"{tuple(np.shape(x))}, expected {tuple(var.aval.shape)}",
                remedy="return arrays with the graph's output types",
            )
        env[var] = x


def trace(
    fn: Callable[..., Any], *args: Any, static_argnums: int | Sequence[int] = (), **kwargs: Any
) -> TracedProgram:
    """Trace ``fn(*args, **kwargs)`` and cut it into regions of μGraph-expressible ops.

    Arguments and results may be pytrees; array leaves may be arrays or
    ``jax.ShapeDtypeStruct``. Positional arguments at ``static_argnums`` are baked in.
    Unsupported operations never raise: they are reported in ``TracedProgram.cuts``.
    """
    nums = (static_argnums,) if isinstance(static_argnums, int) else tuple(static_argnums)
    static = {}
    for n in nums:
        if not -len(args) <= n < len(args):
            raise TraceError(
                f"static_argnums contains {n}, but {len(args)} positional argument(s) were given",
                remedy="pass an example value for every static argument",
            )
        static[n % len(args)] = args[n % len(args)]
    dynamic = tuple(a for i, a in enumerate(args) if i not in static)
    leaves, in_tree = jax.tree_util.tree_flatten((dynamic, kwargs))
    out_trees: list[Any] = []

    def flat_fn(*flat: Any) -> list[Any]:
        dyn, kw = jax.tree_util.tree_unflatten(in_tree, flat)
        it = iter(dyn)
        full = [static[i] if i in static else next(it) for i in range(len(args))]
        out_leaves, out_tree = jax.tree_util.tree_flatten(fn(*full, **kw))
        out_trees.append(out_tree)
        return out_leaves

    flat = hoist_cuts(flatten(jax.make_jaxpr(flat_fn)(*leaves)))
    regions, cuts = partition(flat)
    return TracedProgram(
        name=getattr(fn, "__name__", type(fn).__name__),
        jaxpr=flat.closed,
        sources=flat.sources,
        regions=regions,
        cuts=cuts,
        in_tree=in_tree,
        out_tree=out_trees[-1],
        num_args=len(args),
        static_args=tuple(sorted(static.items())),
    )
