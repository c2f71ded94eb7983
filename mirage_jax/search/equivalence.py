"""Probabilistic equivalence of a candidate μGraph and the target: finite field, then floats.

**Finite-field fingerprints.** Candidate and target are evaluated on ``trials`` independent
random inputs in Z_p x Z_q (``mirage_jax.interpret``: p = 2147483579, q = 1073741789,
q | p - 1, exp(a) = omega^a with omega of order q, so exp(a+b) = exp(a) exp(b) holds exactly;
division by modular inverses; sqrt, log, erf and max are fixed uninterpreted functions shared
by both graphs). Inputs depend only on (input types, seed, trial), so every candidate of one
target sees the same inputs and the target's outputs are computed once per trial.

False-acceptance bound. If candidate and target differ as functions, their outputs differ as
rational functions of the inputs (and of the values of the uninterpreted functions, which act
as extra variables, and of exp's exponents, which are checked mod q); after clearing
denominators the difference is a nonzero polynomial of total degree at most D, computed by
``degree_bound`` from both graphs. By Schwartz-Zippel one trial accepts it with probability at
most D / q (q < p is the smaller field), and ``trials`` independent trials with probability at
most (D / q) ** trials. For the suite D is below 10^3, so with 3 trials the bound is below
10^-18 per candidate (``false_acceptance_bound`` gives the exact figure for each search).
Caveats, stated honestly: ``degree_bound`` assumes a sum of rational terms along one axis
shares one denominator (true of the normalisations and softmax here; otherwise the bound grows
with the axis length), an uninterpreted function's inputs may collide (about 1/q per pair),
and max comparisons make the bound hold per branch of the comparisons rather than globally.

**Incremental fingerprints.** Kernel-level values are cached by their structural key (the op,
its attributes and the keys of its operands), so candidates that share a prefix of
pre-defined kernels (a reshape, a normalisation) evaluate it once per trial and process;
``ff_evaluate_values(..., known=...)`` takes the cached values.

**Float check.** Candidates run on wide random inputs (normal with standard deviation
``FLOAT_INPUT_STD`` = 3, so that an exp without its max shift overflows float32 where the
shifted one does not; a gain-like operand of shape [1, n] or [n] is drawn near 1) in their own
dtypes against the target evaluated in float64. Accepted when the largest error is within
``FLOAT_TOLERANCE[dtype]`` times the output's scale (its largest magnitude), or where the
target in its own dtypes is itself further off (bf16 attention logits of magnitude 100 round by
0.5), when about as accurate as the target relative to each element: the field cannot see
overflow or cancellation. Then once more on inputs whose magnitudes spread over decades
with random signs (``spread_inputs``), against the target evaluated both in float64 and in
its own dtypes: the candidate must be about as accurate as the target itself
(``as_accurate_error``), so a rewrite that is equal over the reals but cancels where the
target does not (x0 - x1 computed as (x2 + x0) - x2 - x1, found by the fuzzer) is rejected.
"""

from __future__ import annotations

import hashlib
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from mirage_jax.interpret import Field, evaluate, ff_evaluate_values
from mirage_jax.interpret.finite_field import fingerprint_inputs, hash_outputs
from mirage_jax.interpret.numerics import (
    FLOAT_TOLERANCE,
    as_accurate_error,
    output_error,
    sample_inputs,
    spread_inputs,
)
from mirage_jax.ir.graph import BlockGraph, Graph, KernelGraph, Node, Phase, ThreadGraph
from mirage_jax.ir.ops import Op
from mirage_jax.ir.types import TensorType

FLOAT_INPUT_STD = 3.0

# per process: the inputs of recent trials, and prefix values (bounded)
_INPUT_BYTES = 2 * 1024**3
_VALUE_BYTES = 768 * 1024**2


@dataclass(frozen=True)
class FFSpec:
    """How candidates are fingerprinted: the field, the input seed and the number of trials."""

    seed: int = 0
    trials: int = 3
    p: int = 2147483579
    q: int = 1073741789
    omega: int = 4

    @property
    def field(self) -> Any:
        return Field(self.p, self.q, self.omega, self.seed)


@dataclass(frozen=True)
class FFVerdict:
    ok: bool
    trials: int  # trials run (stops at the first mismatch)
    seconds: float
    error: str | None = None  # an evaluation error (the candidate is rejected)


@dataclass(frozen=True)
class FloatVerdict:
    ok: bool
    max_error: float
    tolerance: float
    scale: float
    seconds: float

    def __str__(self) -> str:
        return (f"max error {self.max_error:.3g} vs tolerance {self.tolerance:.3g} "
                f"(scale {self.scale:.3g})")  # fmt: skip


# ---------------------------------------------------------------------------------------------
# cost


def evaluation_size(graph: KernelGraph) -> int:
    """The tensor elements one evaluation of ``graph`` computes, as the interpreters run it: a
    graph_def's block values once per block, those of its loop body once per iteration too,
    a thread graph's once per op in it. What a check of the graph costs, counted without a
    clock, so that a bound on it stops verification at the same candidate on every host."""
    total = 0
    for node in graph.nodes:
        if node.op is Op.GRAPH_DEF:
            total += _block_size(node.attr("block"))
        elif node.op is not Op.INPUT:
            total += sum(graph.types[v].size for v in node.outs)
    return total


def _block_size(block: BlockGraph) -> int:
    phases = block.phases()
    per_block = 0
    for n in block.nodes:
        if n.op is Op.INPUT_ITER:
            continue  # a view of its operand
        size = sum(block.types[v].size for v in n.outs)
        if n.op is Op.THREAD:
            size *= max(1, len(n.attr("graph").nodes) - len(n.attr("graph").inputs))
        looped = n.outs and phases.get(n.outs[0]) is Phase.BODY
        per_block += size * (block.forloop_range if looped else 1)
    return per_block * block.num_blocks


# ---------------------------------------------------------------------------------------------
# degree bound


def degree_bound(graph: Graph) -> int:
    """A bound on the total degree of the numerator + denominator of any output of ``graph``
    as a rational function (uninterpreted functions and exps counted as fresh variables, and
    exponents by their own degree): the D of the module docstring for one graph."""
    degs, worst = _degrees(graph, None)
    return max([worst] + [sum(degs[n.ins[0]]) for n in graph.outputs])


def pair_degree_bound(target: Graph, candidate: Graph) -> int:
    """D for the difference of a candidate's and the target's outputs."""
    a, wa = _degrees(target, None)
    b, wb = _degrees(candidate, None)
    d = max(wa, wb, 1)
    for na, nb in zip(target.outputs, candidate.outputs):
        (n1, d1), (n2, d2) = a[na.ins[0]], b[nb.ins[0]]
        d = max(d, n1 + d2, n2 + d1, d1 + d2)
    return d


def false_acceptance_bound(degree: int, spec: FFSpec) -> float:
    """(D / q) ** trials: the probability that a wrong candidate of degree D passes."""
    return min(1.0, degree / spec.q) ** spec.trials


_FRESH = (1, 0)


def _add(a: tuple[int, int], b: tuple[int, int]) -> tuple[int, int]:
    return (max(a[0] + b[1], b[0] + a[1]), a[1] + b[1])


def _degrees(graph: Graph, args: Sequence[tuple[int, int]] | None) -> tuple[dict, int]:
    """(numerator, denominator) degree per value, and the largest exponent degree seen."""
    degs: dict[int, tuple[int, int]] = {}
    worst = 0
    inputs = iter(args or ())
    for node in graph.nodes:
        ins = [degs[i] for i in node.ins]
        if node.op is Op.INPUT:
            degs[node.outs[0]] = next(inputs, (1, 0)) if args is not None else (1, 0)
        elif node.op is Op.INPUT_ITER:
            degs[node.outs[0]] = args[node.attr("arg")] if args is not None else (1, 0)
        elif node.op is Op.GRAPH_DEF:
            inner, w = _degrees(node.attr("block"), ins)
            worst = max(worst, w)
            block = node.attr("block")
            for o, saver in zip(node.outs, block.outputs):
                degs[o] = inner[saver.ins[0]]
        elif node.op is Op.THREAD:
            inner_graph: ThreadGraph = node.attr("graph")
            inner, w = _degrees(inner_graph, ins)
            worst = max(worst, w)
            degs[node.outs[0]] = inner[inner_graph.outputs[0].ins[0]]
        elif node.outs:
            out, w = _node_degree(node, ins)
            worst = max(worst, w)
            degs[node.outs[0]] = out
    return degs, worst


Degree = tuple[int, int]  # (numerator, denominator) degree of a rational function


def _power(node: Node, ins: list[Degree], x: Degree) -> Degree:
    e = node.attr("exponent")
    if float(e).is_integer():
        k = abs(int(e))
        n, d = k * x[0], k * x[1]
        return (d, n) if e < 0 else (n, d)
    return _FRESH


# The degree rules ``OpInfo.degree`` names: the result's degree from the operands' (``x`` is
# the first). A fresh value is an uninterpreted function's, a max's or exp's (checked as its
# own variable); tanh is a ratio of two such, sigmoid an inverse of one.
DEGREE_RULES: dict[str, Callable[[Node, list[Degree], Degree], Degree]] = {
    "same": lambda node, ins, x: x,
    "fresh": lambda node, ins, x: _FRESH,
    "inverse_fresh": lambda node, ins, x: (0, 1),
    "fresh_ratio": lambda node, ins, x: (1, 1),
    "times_inverse_fresh": lambda node, ins, x: (x[0], x[1] + 1),  # silu: x * sigmoid
    "times_fresh_ratio": lambda node, ins, x: (x[0] + 1, x[1] + 1),  # gelu: 0.5 x (1 + tanh)
    "reciprocal": lambda node, ins, x: (x[1], x[0]),
    "square": lambda node, ins, x: (2 * x[0], 2 * x[1]),
    "power": _power,
    "sum": lambda node, ins, x: _add(ins[0], ins[1]),
    # a matmul is a sum of products: denominators along k assumed shared (module docstring)
    "product": lambda node, ins, x: (ins[0][0] + ins[1][0], ins[0][1] + ins[1][1]),
    "quotient": lambda node, ins, x: (ins[0][0] + ins[1][1], ins[0][1] + ins[1][0]),
    # x - y * t, t = trunc(x / y) a fresh value
    "remainder": lambda node, ins, x: _add(ins[0], (ins[1][0] + 1, ins[1][1])),
    "shift": lambda node, ins, x: (max(x[0], x[1]), x[1]),
    "either": lambda node, ins, x: (max(ins[0][0], ins[1][0]), max(ins[0][1], ins[1][1])),
    "rescale": lambda node, ins, x: (ins[0][0] + 1, ins[0][1]),  # times exp(m_i - M)
}


def _node_degree(node: Node, ins: list[Degree]) -> tuple[Degree, int]:
    """A node's result degree (``OpInfo.degree``) and the degree of the exponent it checks:
    its operand's where the field computes it through exp (``OpInfo.exponentiates``), the
    rescale's shift for acc_rescale_sum."""
    info = node.op.info
    x = ins[0] if ins else (0, 0)
    out = DEGREE_RULES[info.degree](node, ins, x)
    if info.exponentiates:
        return out, x[0] + x[1]  # the exponent polynomial, checked mod q
    if node.op is Op.ACC_RESCALE_SUM:
        return out, ins[1][0] + ins[1][1]
    return out, 0


# ---------------------------------------------------------------------------------------------
# finite-field fingerprints (cached per process)


class _LRU:
    def __init__(self, limit: int) -> None:
        self.limit, self.size = limit, 0
        self.items: OrderedDict[Any, tuple[Any, int]] = OrderedDict()

    def get(self, key: Any) -> Any:
        hit = self.items.get(key)
        if hit is None:
            return None
        self.items.move_to_end(key)
        return hit[0]

    def put(self, key: Any, value: Any, nbytes: int) -> None:
        if key in self.items or nbytes > self.limit:
            return
        self.items[key] = (value, nbytes)
        self.size += nbytes
        while self.size > self.limit:
            _, (_, n) = self.items.popitem(last=False)
            self.size -= n


_INPUTS = _LRU(_INPUT_BYTES)
_VALUES = _LRU(_VALUE_BYTES)


def _nbytes(t: Any) -> int:
    return t.a.nbytes + (0 if t.b is None else t.b.nbytes)


def ff_inputs(types: Sequence[TensorType], spec: FFSpec, trial: int) -> list[Any]:
    """The field inputs of one trial (a function of types, seed and trial; cached)."""
    key = (tuple(types), spec, trial)
    hit = _INPUTS.get(key)
    if hit is None:
        hit = fingerprint_inputs(list(types), spec.field, spec.seed, trial)
        _INPUTS.put(key, hit, sum(_nbytes(t) for t in hit))
    return hit


def value_keys(graph: KernelGraph) -> dict[int, Any]:
    """A structural key per kernel value: equal keys compute equal tensors."""
    keys: dict[int, Any] = {}
    k = 0
    for node in graph.nodes:
        if node.op is Op.INPUT:
            keys[node.outs[0]] = ("in", k, graph.types[node.outs[0]])
            k += 1
        elif node.op is Op.OUTPUT:
            continue
        else:
            attrs = tuple(
                (name, v.fingerprint() if isinstance(v, Graph) else v) for name, v in node.attrs
            )  # fmt: skip
            base = (node.op, attrs, tuple(keys[i] for i in node.ins))
            digest = hashlib.sha1(repr(base).encode()).hexdigest()
            for j, o in enumerate(node.outs):
                keys[o] = ("v", digest, j)
    return keys


def ff_outputs(graph: KernelGraph, spec: FFSpec, trial: int) -> list[Any]:
    """The candidate's outputs on one trial, reusing cached values of shared prefixes."""
    inputs = ff_inputs(graph.input_types, spec, trial)
    keys = value_keys(graph)
    known = {}
    for v, key in keys.items():
        if key[0] == "in":
            continue
        hit = _VALUES.get((trial, spec, key))
        if hit is not None:
            known[v] = hit
    values = ff_evaluate_values(graph, inputs, spec.field, known=known)
    produced_by_gd = {o for n in graph.nodes_of(Op.GRAPH_DEF) for o in n.outs}
    for v, key in keys.items():
        if key[0] != "in" and v not in known and v not in produced_by_gd:
            _VALUES.put((trial, spec, key), values[v], _nbytes(values[v]))
    return [values[n.ins[0]] for n in graph.outputs]


def _digest(outputs: Sequence[Any]) -> str:
    h = hashlib.sha256()
    hash_outputs(outputs, h)
    return h.hexdigest()


_TARGETS: dict[Any, str] = {}


def target_digest(target: KernelGraph, spec: FFSpec, trial: int) -> str:
    key = (target.fingerprint(), spec, trial)
    if key not in _TARGETS:
        _TARGETS[key] = _digest(ff_outputs(target, spec, trial))
    return _TARGETS[key]


def ff_check(target: KernelGraph, candidate: KernelGraph, spec: FFSpec) -> FFVerdict:
    """Does ``candidate`` match ``target`` on every trial? Stops at the first mismatch."""
    return ff_check_many(target, [candidate], spec)[0]


def ff_check_many(
    target: KernelGraph, candidates: Sequence[KernelGraph], spec: FFSpec,
    target_digests: Sequence[str] | None = None,
) -> list[FFVerdict]:
    """``ff_check`` for several candidates, trial by trial, so each trial's inputs (the
    largest cost at real shapes) are drawn once for all of them. ``target_digests`` (one
    per trial, from ``target_digest``) spare recomputing the target here."""
    start = time.perf_counter()
    verdicts: list[FFVerdict | None] = [None] * len(candidates)
    for k, c in enumerate(candidates):
        if c.input_types != target.input_types or c.output_types != target.output_types:
            verdicts[k] = FFVerdict(False, 0, 0.0, "input or output types differ from the target's")
    for trial in range(spec.trials):
        for k, c in enumerate(candidates):
            if verdicts[k] is not None:
                continue
            try:
                got = _digest(ff_outputs(c, spec, trial))
            except (ArithmeticError, ValueError, IndexError) as err:  # pragma: no cover
                verdicts[k] = FFVerdict(False, trial + 1, time.perf_counter() - start, repr(err))
                continue
            want = target_digests[trial] if target_digests else target_digest(target, spec, trial)
            if got != want:
                verdicts[k] = FFVerdict(False, trial + 1, time.perf_counter() - start)
    elapsed = time.perf_counter() - start
    return [v if v is not None else FFVerdict(True, spec.trials, elapsed) for v in verdicts]


# ---------------------------------------------------------------------------------------------
# float check


_REFS: dict[Any, list[np.ndarray]] = {}


def float_reference(target: KernelGraph, seed: int, spread: bool = False,
                    precision: str | None = "float64") -> list[np.ndarray]:  # fmt: skip
    """The target on the float check's inputs (``spread``: on ``spread_inputs``) in float64,
    or in its own dtypes (``precision=None``), as float64 arrays; each computed on demand."""
    def compute() -> list[np.ndarray]:
        inputs = _float_inputs(target, seed, spread)
        return [np.asarray(r, np.float64)
                for r in evaluate(target, inputs, precision=precision)]  # fmt: skip

    return _for_one_target(_REFS, (target.fingerprint(), seed, spread, precision), compute)


def _for_one_target(cache: dict[Any, Any], key: tuple[Any, ...],
                    compute: Callable[[], Any]) -> Any:  # fmt: skip
    """``cache[key]``, computed on a miss; the cache holds the entries of one target at a time
    per process (those whose key shares ``key[:2]``): the next target's search empties it."""
    if key not in cache:
        if any(k[:2] != key[:2] for k in cache):
            cache.clear()
        cache[key] = compute()
    return cache[key]


_FLOAT_INPUTS: dict[Any, list[np.ndarray]] = {}


def _float_inputs(graph: KernelGraph, seed: int, spread: bool) -> list[np.ndarray]:
    """The float check's inputs, drawn once per (input types, seed, kind) and shared by every
    candidate of a target (read-only): at full shapes drawing them took ~0.9 s a candidate."""
    def draw() -> list[np.ndarray]:
        drawn = (spread_inputs(graph.input_types, seed) if spread else
                 sample_inputs(graph.input_types, seed, FLOAT_INPUT_STD))  # fmt: skip
        for x in drawn:
            if isinstance(x, np.ndarray):  # a rank-0 input may be drawn as a numpy scalar
                x.flags.writeable = False
        return drawn

    return _for_one_target(_FLOAT_INPUTS, (tuple(graph.input_types), seed, spread), draw)


def roundings(graph: Graph) -> int:
    """Casts to a narrower float type in ``graph`` and in its block and thread graphs."""
    count = 0
    for node in graph.nodes:
        if node.op is Op.CAST:
            out, x = graph.types[node.outs[0]], graph.types[node.ins[0]]
            count += int(out.dtype.itemsize < x.dtype.itemsize)
        count += sum(roundings(v) for v in node.attr_dict.values() if isinstance(v, Graph))
    return count


def float_check(target: KernelGraph, candidate: KernelGraph, seed: int = 0) -> FloatVerdict:
    """The candidate in its own dtypes against the float64 target, then as accurate as the
    target on inputs of spread magnitudes (module docstring). A candidate with fewer roundings
    to a narrower type than the target fails: to the field and to the float64 reference a cast
    is the identity, so dropping a rounding the program asks for (``x.astype(bf16)`` and back,
    ``reduce_precision``) would pass both while differing from XLA by the rounding."""
    start = time.perf_counter()
    if roundings(candidate) < roundings(target):
        return FloatVerdict(False, np.inf, 0.0, 1.0, time.perf_counter() - start)
    ref = float_reference(target, seed)
    got = evaluate(candidate, _float_inputs(candidate, seed, spread=False))
    worst_ok, worst = True, (0.0, 1.0, 1.0)
    for k, (g, r, t) in enumerate(zip(got, ref, candidate.output_types)):
        err, tol, scale = output_error(g, r, t.dtype.value)
        ok = bool(np.isfinite(err)) and err <= tol
        if not ok:
            # a target that is itself this far off (bf16 logits of magnitude 100 round by
            # 0.5) excuses a candidate as far off, not further (relative to each element)
            own = float_reference(target, seed, precision=None)[k]
            near, allowed = as_accurate_error(g, own, r, t.dtype.value, relative=True)
            if near <= allowed:
                err, tol, ok = near, allowed, True
        if not ok or err / tol >= worst[0] / worst[1]:
            worst = (err, tol, scale)
        worst_ok &= ok
    if worst_ok:
        own = float_reference(target, seed, spread=True, precision=None)
        truth = float_reference(target, seed, spread=True)
        got = evaluate(candidate, _float_inputs(candidate, seed, spread=True))
        for g, o, r, t in zip(got, own, truth, candidate.output_types):
            err, allowed = as_accurate_error(g, o, r, t.dtype.value)
            if not err <= allowed:
                worst_ok, worst = False, (err, allowed, 1.0)
                break
    return FloatVerdict(worst_ok, worst[0], worst[1], worst[2], time.perf_counter() - start)


__all__ = [
    "DEGREE_RULES", "FLOAT_TOLERANCE", "FFSpec", "FFVerdict", "FloatVerdict", "degree_bound",
    "false_acceptance_bound", "ff_check", "ff_check_many", "ff_inputs", "ff_outputs",
    "float_check", "pair_degree_bound", "target_digest", "value_keys",
]  # fmt: skip
