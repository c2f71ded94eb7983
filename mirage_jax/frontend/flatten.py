"""Flatten a closed jaxpr: inline nested calls into one list of equations over fresh vars.

Nested ``jit`` calls and ``custom_jvp_call`` / ``custom_vjp_call`` (and the other call-like
primitives in ``_CALLEES``) are replaced by their bodies, so the partitioner sees one flat
sequence. Custom derivative rules are dropped with them: the flat program has the primal
(forward) semantics only, which is all the partitioner and ``TracedProgram.run`` need.

Every use of a literal gets its own ``Literal`` object, so a region can turn one particular
use into a region input without touching the others. Exact operations on scalar literals are
folded (``convert_element_type`` of a literal, as ``jnp.clip`` emits for its bounds; the
``n - ddof > 0`` guard of ``jnp.var``), and a ``select_n`` with a literal predicate becomes the
operand it selects.
Each equation keeps its source info; inlined equations whose traceback holds no user frame
inherit the user line of the call that contained them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np
from jax.extend.core import ClosedJaxpr, DropVar, Jaxpr, JaxprEqn, Literal, Var

from mirage_jax.frontend.source import user_source

# call-like primitive -> the parameter holding its body
_CALLEES = {
    "jit": "jaxpr",
    "pjit": "jaxpr",
    "closed_call": "call_jaxpr",
    "core_call": "call_jaxpr",
    "custom_jvp_call": "call_jaxpr",
    "custom_vjp_call": "call_jaxpr",
    "custom_vjp_call_jaxpr": "fun_jaxpr",
    "checkpoint": "jaxpr",
    "remat": "jaxpr",
}


@dataclass(frozen=True, eq=False)
class FlatJaxpr:
    """A flat closed jaxpr and, per equation, the user's source line (or ``None``)."""

    closed: ClosedJaxpr
    sources: tuple[str | None, ...]


def flatten(closed: ClosedJaxpr) -> FlatJaxpr:
    """Inline every nested call of ``closed``; the result computes the same function."""
    flat = _Flattener()
    invars = [Var(v.aval) for v in closed.jaxpr.invars]
    outs = flat.inline(closed.jaxpr, closed.consts, invars, None)
    eqns, sources = _live(flat.eqns, flat.sources, outs)
    jaxpr = Jaxpr(flat.constvars, invars, outs, eqns, closed.jaxpr.effects,
                  closed.jaxpr.debug_info)  # fmt: skip
    return FlatJaxpr(ClosedJaxpr(jaxpr, flat.consts), tuple(sources))


def _live(eqns: list[JaxprEqn], sources: list[str | None], outs: Sequence[Any]
          ) -> tuple[list[JaxprEqn], list[str | None]]:  # fmt: skip
    """The equations whose results are used (or that have effects), with their sources: a
    fold leaves the operand it did not select behind, which no region should compute."""
    used = {v for v in outs if isinstance(v, Var)}
    kept: list[tuple[JaxprEqn, str | None]] = []
    for eqn, source in zip(reversed(eqns), reversed(sources)):
        if eqn.effects or any(o in used for o in eqn.outvars if not isinstance(o, DropVar)):
            used.update(v for v in eqn.invars if isinstance(v, Var))
            kept.append((eqn, source))
    kept.reverse()
    return [e for e, _ in kept], [s for _, s in kept]


def _callee(eqn: JaxprEqn) -> tuple[Jaxpr, Sequence[Any]] | None:
    """The body of a call-like equation, when it can be inlined one-to-one."""
    key = _CALLEES.get(eqn.primitive.name)
    body = eqn.params.get(key) if key else None
    if isinstance(body, ClosedJaxpr):
        jaxpr, consts = body.jaxpr, body.consts
    elif isinstance(body, Jaxpr) and not body.constvars:
        jaxpr, consts = body, ()
    else:
        return None
    if len(jaxpr.invars) != len(eqn.invars) or len(jaxpr.outvars) != len(eqn.outvars):
        return None
    return jaxpr, consts


def _fresh_literal(lit: Literal) -> Literal:
    return Literal(lit.val, lit.aval)


# primitives whose value on scalar constants is exact in IEEE arithmetic, so evaluating them
# here gives what XLA's own constant folding gives (transcendentals are left alone: their
# values depend on the implementation)
_FOLDABLE = frozenset({
    "convert_element_type", "add", "sub", "mul", "div", "neg", "max", "min", "abs", "sign",
    "eq", "ne", "lt", "le", "gt", "ge", "and", "or", "not", "select_n", "floor", "ceil",
})  # fmt: skip


def _fold(eqn: JaxprEqn, invals: list[Any]) -> Any | None:
    """What an equation over scalar literals becomes: a literal of its value, or for a
    ``select_n`` whose predicate is a literal, the chosen operand (``jnp.var`` guards its
    divisor ``n - ddof > 0`` this way); ``None`` when it stays an equation."""
    name, out = eqn.primitive.name, eqn.outvars[0]
    if name not in _FOLDABLE or len(eqn.outvars) != 1 or isinstance(out, DropVar):
        return None
    if name == "select_n" and _scalar_literal(invals[0]):
        chosen = invals[1 + int(np.asarray(invals[0].val))]
        return chosen if chosen.aval.shape == out.aval.shape else None
    if not all(_scalar_literal(v) for v in invals) or out.aval.shape != ():
        return None
    with jax.ensure_compile_time_eval():
        value = eqn.primitive.bind(*(np.asarray(v.val, v.aval.dtype) for v in invals),
                                   **eqn.params)  # fmt: skip
    return Literal(np.asarray(value), out.aval)


def _scalar_literal(atom: Any) -> bool:
    return isinstance(atom, Literal) and np.shape(atom.val) == ()


class _Flattener:
    def __init__(self) -> None:
        self.eqns: list[JaxprEqn] = []
        self.sources: list[str | None] = []
        self.constvars: list[Var] = []
        self.consts: list[Any] = []

    def inline(
        self, jaxpr: Jaxpr, consts: Sequence[Any], args: Sequence[Any], fallback: str | None
    ) -> list[Any]:
        env: dict[Var, Any] = {}
        for cv, value in zip(jaxpr.constvars, consts):
            env[cv] = Var(cv.aval)
            self.constvars.append(env[cv])
            self.consts.append(value)
        env.update(zip(jaxpr.invars, args))

        def read(atom: Any) -> Any:
            value = atom if isinstance(atom, Literal) else env[atom]
            return _fresh_literal(value) if isinstance(value, Literal) else value

        for eqn in jaxpr.eqns:
            source = user_source(eqn.source_info) or fallback
            invals = [read(a) for a in eqn.invars]
            callee = _callee(eqn)
            if callee is not None:
                outs = self.inline(*callee, invals, source)
                env.update((o, v) for o, v in zip(eqn.outvars, outs) if not isinstance(o, DropVar))
                continue
            folded = _fold(eqn, invals)
            if folded is not None:
                env[eqn.outvars[0]] = folded
                continue
            outvars = [DropVar(o.aval) if isinstance(o, DropVar) else Var(o.aval)
                       for o in eqn.outvars]  # fmt: skip
            env.update((o, n) for o, n in zip(eqn.outvars, outvars) if not isinstance(o, DropVar))
            self.eqns.append(eqn.replace(invars=invals, outvars=outvars))
            self.sources.append(source)
        return [read(a) for a in jaxpr.outvars]
