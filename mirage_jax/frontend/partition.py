"""Cut a flat jaxpr into regions: maximal contiguous runs of equations the rules accept.

Contiguous runs in jaxpr order are always convex (no path leaves a run and comes back), so a
region can be replaced by one call. An equation no rule accepts cuts the current region and is
reported as a ``Cut`` with the reason and the user's source line. A run with no compute op
(only layout and casts), or whose results nobody uses, is not a region: XLA keeps it.
``Assembler`` builds a region from any run of equations; ``frontend.split`` uses it to cut a
region too large for one search into pieces (``Split`` records why and where).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from jax.extend.core import DropVar, Jaxpr, JaxprEqn, Literal, Var

from mirage_jax.errors import GraphError
from mirage_jax.frontend.builder import (
    RegionBuilder,
    Unsupported,
    View,
    atom_key,
    tensor_type,
)
from mirage_jax.frontend.flatten import FlatJaxpr
from mirage_jax.frontend.rules import (
    IS_FINITE_KEPT,
    RULES,
    is_finite_folds,
    readers,
    tensor_atoms,
    unsupported_reason,
)
from mirage_jax.interpret.numerics import sample_inputs
from mirage_jax.ir import DType, KernelGraph, TensorType

log = logging.getLogger("mirage_jax")


@dataclass(frozen=True, eq=False)
class Region:
    """A run of supported equations and the kernel graph computing the same values.

    ``graph``'s INPUT nodes are ``inputs`` in order (jaxpr vars, or literals the graph needs
    as tensors) and its OUTPUT nodes are ``outputs`` in order (vars defined here and used
    later, or program outputs), each with exactly the var's shape and dtype. ``span`` is the
    equation range ``[start, stop)`` of the flat jaxpr; ``eqns`` the equations of the span
    that the outputs need (what XLA runs for this region).
    """

    index: int
    graph: KernelGraph
    inputs: tuple[Any, ...]
    outputs: tuple[Var, ...]
    span: tuple[int, int]
    eqns: tuple[int, ...]
    sources: tuple[str, ...]
    backward: bool = False  # holds equations of a derivative's transposed (reverse-mode) part
    forward: bool = True  # holds equations of anything else
    split: Split | None = None  # set when the region is one piece of a run split for the search

    def sample_inputs(self, seed: int = 0) -> list[np.ndarray]:
        """Random inputs of the graph's input types (masks: random bools), its literals at
        their own values: a constant the graph holds as an attribute (a where's fill) is an
        input of the equations XLA replays too, and must be the same constant there."""
        drawn = sample_inputs(self.graph.input_types, seed=seed)
        return [np.full(x.shape, np.asarray(atom.val), x.dtype) if isinstance(atom, Literal)
                else x for atom, x in zip(self.inputs, drawn, strict=True)]  # fmt: skip

    @property
    def pass_label(self) -> str:
        """' (backward pass)', ' (forward and backward pass)' or '' (forward only)."""
        return pass_label(self.forward, self.backward)

    def __repr__(self) -> str:
        ins = ", ".join(map(str, self.graph.input_types))
        outs = ", ".join(map(str, self.graph.output_types))
        return (
            f"Region({self.index}: equations [{self.span[0]}, {self.span[1]}), ({ins}) -> ({outs}))"
        )

    def describe(self) -> str:
        ins = ", ".join(_atom_text(a, t) for a, t in zip(self.inputs, self.graph.input_types))
        outs = ", ".join(map(str, self.graph.output_types))
        lines = [
            f"region {self.index}{self.pass_label}: equations [{self.span[0]}, {self.span[1]})",
            f"  inputs: {ins}",
            f"  outputs: {outs}",
        ]
        lines += [f"  from {s}" for s in self.sources]
        lines += ["  " + line for line in str(self.graph).splitlines()]
        return "\n".join(lines)


def pass_label(forward: bool, backward: bool) -> str:
    """How explain names the passes a region's equations come from."""
    if not backward:
        return ""
    return " (forward and backward pass)" if forward else " (backward pass)"


@dataclass(frozen=True)
class Cut:
    """An equation no rule accepts: it stays with XLA and splits the regions around it."""

    primitive: str
    reason: str
    source: str | None
    eqn_index: int

    def __str__(self) -> str:
        return f"{self.primitive} at {self.source or 'an unknown source line'}: {self.reason}"


@dataclass(frozen=True)
class Split:
    """A run of equations too large for one search, cut into pieces (``frontend.split``).

    ``cuts`` are the equation indices where a piece begins (after the first); ``estimate_s``
    is the cost model's time of the pieces, each one fused kernel, and ``whole_s`` of the run
    as one; ``crossing`` the bytes the pieces hand each other through memory.
    """

    span: tuple[int, int]
    ops: int
    inputs: int
    max_ops: int
    max_inputs: int
    cuts: tuple[int, ...]
    estimate_s: float
    whole_s: float
    crossing: int

    def __str__(self) -> str:
        cuts = ", ".join(map(str, self.cuts))
        why = []
        if self.ops > self.max_ops:
            why.append(f"{self.ops} compute ops, more than the {self.max_ops} a search covers "
                       "within its budget (SearchConfig.max_region_ops)")
        if self.inputs > self.max_inputs:
            why.append(f"{self.inputs} inputs, more than the {self.max_inputs} one searched "
                       "kernel takes (SearchConfig.max_graph_def_inputs)")
        return (
            f"equations [{self.span[0]}, {self.span[1]}) hold {' and '.join(why)}:"
            f" split before equation(s) {cuts} into {len(self.cuts) + 1} pieces, the cuts the "
            f"cost model prices lowest ({self.estimate_s * 1e6:.0f} us as fused pieces, "
            f"{self.whole_s * 1e6:.0f} us as one kernel; {_size_text(self.crossing)} cross "
            "between pieces)"
        )


def _size_text(nbytes: int) -> str:
    for unit, scale in (("MiB", 2**20), ("KiB", 2**10)):
        if nbytes >= scale:
            return f"{nbytes / scale:.1f} {unit}"
    return f"{nbytes} B"


def _atom_text(atom: Any, t: Any) -> str:
    if isinstance(atom, Var):
        return str(t)
    return f"{t} (literal {atom.val})"


_HELD = ("is_finite feeds an equation outside its region (a select_n folds it only within "
         "one); it stays with XLA")  # fmt: skip


def partition(flat: FlatJaxpr) -> tuple[tuple[Region, ...], tuple[Cut, ...]]:
    """The regions and cuts of a flat jaxpr, in equation order."""
    asm = Assembler(flat.closed.jaxpr, flat.sources)
    n, i, builder = len(asm.eqns), 0, RegionBuilder(0)
    while True:
        reason = None
        while i < n and (reason := asm.apply(builder, asm.eqns[i])) is None:
            i += 1
        # a predicate read past the region's end cannot leave it: end the region before it
        while (held := asm.escaping_predicate(builder, i)) is not None:
            builder, i, reason = asm.rebuild(builder.start, held), held, _HELD
        if i < n:
            asm.cuts.append(Cut(asm.eqns[i].primitive.name, reason or "", flat.sources[i], i))
        asm.close(builder, i)
        if i >= n:  # a rebuilt region's cut comes after the cuts found past it
            return tuple(asm.regions), tuple(sorted(asm.cuts, key=lambda c: c.eqn_index))
        i, builder = i + 1, RegionBuilder(i + 1)


class Assembler:
    """Builds regions from runs of a flat jaxpr's equations; collects them and the cuts."""

    def __init__(self, jaxpr: Jaxpr, sources: Sequence[str | None]) -> None:
        self.eqns = jaxpr.eqns
        self.sources = sources
        self.last_use: dict[Var, int] = {}
        for i, eqn in enumerate(self.eqns):
            self.last_use.update((a, i) for a in eqn.invars if isinstance(a, Var))
        self.is_finite_at = [i for i, e in enumerate(self.eqns) if e.primitive.name == "is_finite"]
        self.program_outs = {a for a in jaxpr.outvars if isinstance(a, Var)}
        self.readers = readers(jaxpr)
        self.regions: list[Region] = []
        self.cuts: list[Cut] = []

    def escapes(self, var: Var, end: int) -> bool:
        """Whether ``var`` is read at or after equation ``end`` or is a program output."""
        return self.last_use.get(var, -1) >= end or var in self.program_outs

    def escaping_predicate(self, b: RegionBuilder, end: int) -> int | None:
        """The first equation of ``b`` making a predicate read at or after ``end`` (a region
        ending there could not output it), else None."""
        for i in self.is_finite_at:  # usually none: the splitter asks at every equation
            v = self.eqns[i].outvars[0]
            if b.start <= i < end and b.predicate_of(v) is not None and self.escapes(v, end):
                return i
        return None

    def rebuild(self, start: int, end: int) -> RegionBuilder:
        """A builder holding equations ``start`` to ``end`` again (all accepted before)."""
        b = RegionBuilder(start)
        for i in range(start, end):
            if self.apply(b, self.eqns[i]) is not None:
                raise GraphError(f"equation {i} was accepted once and not again")
        return b

    def apply(self, b: RegionBuilder, eqn: JaxprEqn) -> str | None:
        """Add ``eqn`` to the region; the reason it cannot be added, or ``None``."""
        name = eqn.primitive.name
        rule = RULES.get(name)
        if rule is None:
            return unsupported_reason(name)
        if eqn.effects:
            return f"{name} has side effects"
        if name == "is_finite" and not is_finite_folds(eqn, self.readers, self.program_outs):
            return IS_FINITE_KEPT
        mark = b.mark()
        outvars = [v for v in eqn.outvars if not isinstance(v, DropVar)]
        try:
            for atom in tensor_atoms(eqn):
                if not isinstance(atom, DropVar):
                    tensor_type(atom.aval)
            views = rule(b, eqn)
            for var, view in zip(eqn.outvars, views):
                self._check(b, var, view)
        except Unsupported as err:
            b.rollback(mark)
            return err.reason
        except GraphError as err:  # a rule bug: keep it with XLA rather than fail the user
            b.rollback(mark)
            log.warning("mirage_jax frontend: %s rule failed: %s", name, err)
            return f"internal error in the {name} rule ({err.cause}); please report it"
        b.env.update((v, view) for v, view in zip(eqn.outvars, views) if v in outvars)
        return None

    @staticmethod
    def _check(b: RegionBuilder, var: Any, view: View) -> None:
        bool_var = np.dtype(var.aval.dtype) == np.bool_  # a predicate (``is_finite``)
        want = TensorType(tuple(var.aval.shape), DType.BOOL) if bool_var else tensor_type(var.aval)
        have = b.type(view.vid)
        same_size = have.size == want.size
        broadcast = have.rank == want.rank and all(
            h in (1, w) for h, w in zip(have.shape, want.shape)
        )
        if have.dtype is not want.dtype or view.shape != want.shape or not (same_size or broadcast):
            raise GraphError(f"rule produced {have} for a var of type {want}")

    def close(self, b: RegionBuilder, end: int, split: Split | None = None) -> None:
        """Add the region of ``b``'s equations up to ``end`` (none if it computes nothing that
        is used; a cut if its graph cannot be built)."""
        start = b.start
        span = range(start, end)
        outvars = [
            v for i in span for v in self.eqns[i].outvars
            if not isinstance(v, DropVar) and self.escapes(v, end)
        ]  # fmt: skip
        if not outvars:
            return
        live = self._live_eqns(span, outvars)
        reads = {atom_key(a) for i in live for a in self.eqns[i].invars}
        try:
            built = b.finish(outvars, reads.__contains__)
        except GraphError as err:
            log.warning("mirage_jax frontend: region at equation %d failed: %s", start, err)
            reason = f"internal error building the region's μGraph ({err.cause}); please report it"
            self.cuts.append(Cut("<region>", reason, self.sources[start], start))
            return
        if built is None:
            return
        graph, inputs = built
        sources = tuple(dict.fromkeys(s for i in live if (s := self.sources[i]) is not None))
        # jax names the equations that reverse-mode autodiff transposes "transpose(jvp(...))"
        transposed = ["transpose(" in str(self.eqns[i].source_info.name_stack) for i in live]
        self.regions.append(Region(len(self.regions), graph, inputs, tuple(outvars),
                                   (start, end), live, sources, any(transposed),
                                   not all(transposed), split))  # fmt: skip

    def _live_eqns(self, span: range, outvars: list[Var]) -> tuple[int, ...]:
        needed, live = set(outvars), []
        for i in reversed(span):
            eqn = self.eqns[i]
            if any(v in needed for v in eqn.outvars if not isinstance(v, DropVar)):
                live.append(i)
                needed.update(a for a in eqn.invars if isinstance(a, Var))
        return tuple(reversed(live))
