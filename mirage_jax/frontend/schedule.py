"""Order a flat jaxpr so that what stays with XLA anyway does not split regions.

A jaxpr lists its equations in the order the user's code ran them; any order that respects
the data dependencies computes the same values. Masks are the common case where that order
costs a region: ``jnp.where(iota <= iota, scores, -inf)`` traces the comparison, and the bool
broadcast of its result, between the matmul that makes the scores and the softmax that reads
them, so the cut for the comparison splits attention in two. ``hoist_cuts`` moves every
equation no rule can take to just after the last equation it reads from (to the front, when
it reads only inputs and literals): the mask is built first and the attention stays one
region. Equations with effects keep their place.
"""

from __future__ import annotations

from typing import Any

from jax.extend.core import ClosedJaxpr, JaxprEqn, Var

from mirage_jax.frontend.builder import Unsupported, tensor_type
from mirage_jax.frontend.flatten import FlatJaxpr
from mirage_jax.frontend.rules import RULES, is_finite_folds, readers, tensor_atoms


def hoist_cuts(flat: FlatJaxpr) -> FlatJaxpr:
    """``flat`` with every equation that stays with XLA moved up to its inputs."""
    jaxpr = flat.closed.jaxpr
    read_by = readers(jaxpr)
    outs = {v for v in jaxpr.outvars if isinstance(v, Var)}
    order: list[int] = []
    for i, eqn in enumerate(jaxpr.eqns):
        if eqn.effects or not _stays_with_xla(eqn, read_by, outs):
            order.append(i)
            continue
        reads = {v for v in eqn.invars if isinstance(v, Var)}
        at = len(order)
        while at > 0 and not _writes(jaxpr.eqns[order[at - 1]], reads):
            at -= 1
        order.insert(at, i)
    if order == list(range(len(jaxpr.eqns))):
        return flat
    eqns = [jaxpr.eqns[i] for i in order]
    moved = jaxpr.replace(eqns=eqns)
    return FlatJaxpr(ClosedJaxpr(moved, flat.closed.consts), tuple(flat.sources[i] for i in order))


def _writes(eqn: JaxprEqn, reads: set[Any]) -> bool:
    return any(v in reads for v in eqn.outvars)


def _stays_with_xla(eqn: JaxprEqn, read_by: dict[Any, list[JaxprEqn]], outs: set[Any]) -> bool:
    """No rule can take it: its primitive has none, or a value it reads or writes is not a
    μGraph tensor (integers, bools other than a select's predicate or a folded is_finite)."""
    if eqn.primitive.name not in RULES:
        return True
    if eqn.primitive.name == "is_finite":
        return not is_finite_folds(eqn, read_by, outs)
    try:
        for atom in tensor_atoms(eqn):
            tensor_type(atom.aval)
    except Unsupported:
        return True
    return False
