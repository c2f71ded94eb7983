"""Flatten a closed jaxpr: inline nested calls into one list of equations over fresh vars.

Nested ``jit`` calls and ``custom_jvp_call`` / ``custom_vjp_call`` (and the other call-like
primitives in ``_CALLEES``) are replaced by their bodies, so the partitioner sees one flat
sequence. Custom derivative rules are dropped with them: the flat program has the primal
(forward) semantics only, which is all the partitioner and ``TracedProgram.run`` need.

Every use of a literal gets its own ``Literal`` object, so a region can turn one particular
use into a region input without touching the others; scalar literal conversions
(``convert_element_type`` of a literal, as ``jnp.clip`` emits for its bounds) are folded.
Each equation keeps its source info; inlined equations whose traceback holds no user frame
inherit the user line of the call that contained them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

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
    jaxpr = Jaxpr(
        flat.constvars, invars, outs, flat.eqns, closed.jaxpr.effects, closed.jaxpr.debug_info
    )
    return FlatJaxpr(ClosedJaxpr(jaxpr, flat.consts), tuple(flat.sources))


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


def _fold(eqn: JaxprEqn, invals: list[Any]) -> Literal | None:
    """A literal for ``convert_element_type`` of a scalar literal; ``None`` otherwise."""
    if eqn.primitive.name != "convert_element_type" or not isinstance(invals[0], Literal):
        return None
    out = eqn.outvars[0]
    if np.shape(invals[0].val) != () or isinstance(out, DropVar):
        return None
    return Literal(np.asarray(invals[0].val).astype(eqn.params["new_dtype"]), out.aval)


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
