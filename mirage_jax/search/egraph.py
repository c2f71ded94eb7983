"""The egglog side of the abstraction: one sort, the axioms as rewrites, budgeted saturation.

``saturate(targets, budget, stats)`` puts the target terms into a fresh ``egglog.EGraph``,
fills the divisor table for the extents they reduce over, runs the axioms stage by stage as
``axioms.SCHEDULE`` says (one egglog iteration at a time, so the limits of ``budget`` are
checked between iterations), and freezes the e-graph into a Python hash-cons table
(``EGraphIndex``): e-node key -> e-class. A query then needs no egglog call: the class of a
term is found bottom-up from the classes of its children.

Encoding: n-ary ``add``/``mul`` terms become left-nested binary nodes (the e-graph holds every
bracketing and order once the AC axioms have run); ``sum`` carries its extent as an ``i64``,
``const`` its value as a ``BigRat``, ``fn`` its name as a ``String``.

Logging: egglog's Rust crates log every command and rule report through Python loggers named
after their modules (``egglog.egraph``, ``egglog_bridge.rule``, ...): over a thousand INFO lines
per saturation. While this module drives egglog those records stop below WARNING
(``quiet_egglog``) unless ``MIRAGE_JAX_DEBUG`` is set.
"""

from __future__ import annotations

import itertools
import logging
import os
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from fractions import Fraction
from typing import Any

from egglog import (
    BigInt,
    BigRat,
    EGraph,
    Expr,
    Ruleset,
    StringLike,
    eq,
    i64,
    i64Like,
    method,
    ne,
    relation,
    rewrite,
    ruleset,
)
from egglog import var as evar

from mirage_jax.errors import SearchError
from mirage_jax.search.abstract_terms import OracleStats, SaturationBudget, Term
from mirage_jax.search.axioms import AXIOMS, SCHEDULE, Axiom, Cond, Param, Pat


class MjTerm(Expr):
    """The egglog sort of abstract expressions (constructors named for the frozen table)."""

    @method(egg_fn="MjVar")
    @classmethod
    def var(cls, index: i64Like) -> MjTerm: ...

    @method(egg_fn="MjConst")
    @classmethod
    def const(cls, value: BigRat) -> MjTerm: ...

    @method(egg_fn="MjAdd")
    @classmethod
    def add(cls, a: MjTerm, b: MjTerm) -> MjTerm: ...

    @method(egg_fn="MjMul")
    @classmethod
    def mul(cls, a: MjTerm, b: MjTerm) -> MjTerm: ...

    @method(egg_fn="MjMax")
    @classmethod
    def max(cls, a: MjTerm, b: MjTerm) -> MjTerm: ...

    @method(egg_fn="MjConcat")
    @classmethod
    def concat(cls, a: MjTerm, b: MjTerm) -> MjTerm: ...

    @method(egg_fn="MjInv")
    @classmethod
    def inv(cls, a: MjTerm) -> MjTerm: ...

    @method(egg_fn="MjExp")
    @classmethod
    def exp(cls, a: MjTerm) -> MjTerm: ...

    @method(egg_fn="MjSqrt")
    @classmethod
    def sqrt(cls, a: MjTerm) -> MjTerm: ...

    @method(egg_fn="MjRMax")
    @classmethod
    def rmax(cls, a: MjTerm) -> MjTerm: ...

    @method(egg_fn="MjSum")
    @classmethod
    def sum(cls, extent: i64Like, a: MjTerm) -> MjTerm: ...

    @method(egg_fn="MjMean")
    @classmethod
    def mean(cls, extent: i64Like, a: MjTerm) -> MjTerm: ...

    @method(egg_fn="MjFn")
    @classmethod
    def fn(cls, name: StringLike, a: MjTerm) -> MjTerm: ...


# the divisor table: MjSplit(n, d) holds when d is a proper divisor of an extent n of the target
MjSplit = relation("MjSplit", i64, i64)

_BINARY = {"add": "MjAdd", "mul": "MjMul", "max": "MjMax", "concat": "MjConcat"}
_UNARY = {"inv": "MjInv", "exp": "MjExp", "sqrt": "MjSqrt", "rmax": "MjRMax"}
_CTOR = {
    "MjAdd": MjTerm.add, "MjMul": MjTerm.mul, "MjMax": MjTerm.max, "MjConcat": MjTerm.concat,
    "MjInv": MjTerm.inv, "MjExp": MjTerm.exp, "MjSqrt": MjTerm.sqrt, "MjRMax": MjTerm.rmax,
}  # fmt: skip


def _bigrat(value: Fraction) -> BigRat:
    value = Fraction(value)
    return BigRat(value.numerator, value.denominator)


# ---------------------------------------------------------------------------------------------
# terms -> egglog expressions


def to_egglog(term: Term, memo: dict[Term, MjTerm] | None = None) -> MjTerm:
    """The egglog expression of a term (n-ary add/mul left-nested)."""
    memo = {} if memo is None else memo
    for t in term.subterms():
        if t not in memo:
            memo[t] = _encode_node(t, [memo[a] for a in t.args])
    return memo[term]


def _encode_node(t: Term, args: list[MjTerm]) -> MjTerm:
    h = t.head
    if h == "var":
        return MjTerm.var(int(t.param))  # type: ignore[arg-type]
    if h == "const":
        return MjTerm.const(_bigrat(t.param))  # type: ignore[arg-type]
    if h == "sum":
        return MjTerm.sum(int(t.param), args[0])  # type: ignore[arg-type]
    if h == "fn":
        return MjTerm.fn(str(t.param), args[0])
    if h in _UNARY:
        return _CTOR[_UNARY[h]](args[0])
    if h in _BINARY:
        ctor = _CTOR[_BINARY[h]]
        out = args[0]
        for a in args[1:]:
            out = ctor(out, a)
        return out
    raise ValueError(f"unknown term head {h!r}")


# ---------------------------------------------------------------------------------------------
# axioms -> egglog rewrites


class _RuleVars:
    """egglog pattern variables of one rule, by name and sort."""

    def __init__(self, rule: str) -> None:
        self.rule = rule
        self.cache: dict[tuple[str, str], Any] = {}

    def get(self, name: str, sort: str) -> Any:
        key = (name, sort)
        if key not in self.cache:
            tp = {"term": MjTerm, "int": i64, "rat": BigRat}[sort]
            self.cache[key] = evar(f"{self.rule}_{name}", tp)
        return self.cache[key]


def _param(p: Param, vs: _RuleVars) -> Any:
    if p.op == "var":
        return vs.get(p.args[0], p.kind)
    if p.op == "lit":
        return i64(p.args[0]) if p.kind == "int" else _bigrat(p.args[0])
    args = [_param(x, vs) for x in p.args]
    if p.op == "*":
        return args[0] * args[1]
    if p.op == "+":
        return args[0] + args[1]
    if p.op == "//":
        return args[0] / args[1]
    if p.op == "neg":
        return -args[0]
    if p.op == "inv":
        return BigRat(1, 1) / args[0]
    if p.op == "rat":
        return BigRat(BigInt(args[0]), BigInt(args[1]))
    raise ValueError(f"unknown parameter op {p.op!r}")


def _pattern(pat: Pat, vs: _RuleVars) -> MjTerm:
    h = pat.head
    if h == "?":
        return vs.get(pat.param, "term")  # type: ignore[arg-type]
    args = [_pattern(a, vs) for a in pat.args]
    if h == "const":
        return MjTerm.const(_param(pat.param, vs))  # type: ignore[arg-type]
    if h == "sum":
        return MjTerm.sum(_param(pat.param, vs), args[0])  # type: ignore[arg-type]
    if h == "mean":
        return MjTerm.mean(_param(pat.param, vs), args[0])  # type: ignore[arg-type]
    if h == "fn":
        return MjTerm.fn(pat.param, args[0])  # type: ignore[arg-type]
    if h in _UNARY:
        return _CTOR[_UNARY[h]](args[0])
    if h in _BINARY:
        return _CTOR[_BINARY[h]](args[0], args[1])
    raise ValueError(f"unknown pattern head {h!r}")


def _condition(cond: Cond, vs: _RuleVars) -> Any:
    if cond.kind == "divisor":
        n, d = cond.args
        return MjSplit(vs.get(n, "int"), vs.get(d, "int"))
    if cond.kind == "recip":
        n, p = cond.args
        return eq(vs.get(p, "rat")).to(BigRat(BigInt(1), BigInt(vs.get(n, "int"))))
    if cond.kind == "nonzero":
        return ne(vs.get(cond.args[0], "rat")).to(BigRat(0, 1))
    raise ValueError(f"unknown axiom condition {cond.kind!r}")


# No tensor has an extent near this. The rules multiply extents (sum-merge: sum(n, sum(m, x))
# = sum(n*m, x)), and on sums nested ever deeper by other rules the products would overflow
# egglog's i64, which aborts the whole saturation ("call of primitive * failed"); each product
# on a right-hand side is guarded instead.
_MAX_EXTENT = 1 << 40


def _product_bounds(pat: Pat, vs: _RuleVars) -> list[Any]:
    """Conditions keeping every extent product ``pat`` builds at most ``_MAX_EXTENT``."""
    conds = []
    params = [pat.param] if isinstance(pat.param, Param) else []
    while params:
        p = params.pop()
        if p.is_plain:
            continue
        params.extend(p.args)
        if p.kind == "int" and p.op == "*":
            x, y = p.args
            if not (x.is_plain and y.is_plain):
                raise ValueError(f"extent product {p} of products: its bound would overflow")
            conds.append(_param(x, vs) <= i64(_MAX_EXTENT) / _param(y, vs))
    for arg in pat.args:
        conds.extend(_product_bounds(arg, vs))
    return conds


def axiom_rewrites(axiom: Axiom) -> list[Any]:
    """The egglog rewrite(s) of one axiom (two for a two-way axiom)."""
    out = []
    directions = [(axiom.lhs, axiom.rhs, "f")]
    if axiom.both:
        directions.append((axiom.rhs, axiom.lhs, "b"))
    for lhs, rhs, tag in directions:
        vs = _RuleVars(f"{axiom.name.replace('-', '_')}_{tag}")
        conds = [_condition(c, vs) for c in axiom.when] + _product_bounds(rhs, vs)
        rw = rewrite(_pattern(lhs, vs)).to(_pattern(rhs, vs), *conds)
        RULE_NAMES[rw.decl] = axiom.name + ("" if tag == "f" else " (reverse)")
        out.append(rw)
    return out


# egglog reports matches per rewrite declaration; this names them after their axiom
RULE_NAMES: dict[Any, str] = {}


_RULESETS: dict[tuple[int, ...], Ruleset] = {}


def axiom_ruleset(axioms: Sequence[Axiom] = AXIOMS) -> Ruleset:
    """One egglog ruleset holding every axiom (built once per axiom tuple)."""
    key = tuple(id(ax) for ax in axioms)  # Axiom holds a dict (its example): key by identity
    if key not in _RULESETS:
        rs = ruleset(name=f"mirage_axioms_{len(_RULESETS)}")
        for ax in axioms:
            for rw in axiom_rewrites(ax):
                rs.append(rw)
        _RULESETS[key] = rs
    return _RULESETS[key]


# ---------------------------------------------------------------------------------------------
# egglog's logging

# the crates of egglog 13 that log (pyo3-log names a record's logger after its Rust module
# path, so every logger of theirs sits under one of these); crates added later are found by
# name among the loggers that exist when the gate closes
_EGGLOG_CRATES = ("egglog", "egglog_ast", "egglog_bridge", "egglog_concurrency",
                  "egglog_core_relations", "egglog_experimental", "egglog_numeric_id",
                  "egglog_reports", "egglog_union_find")  # fmt: skip


def debug_enabled() -> bool:
    """``MIRAGE_JAX_DEBUG`` is set (to anything but 0/false/no/off): show egglog's logs."""
    flag = os.environ.get("MIRAGE_JAX_DEBUG", "").strip().lower()
    return flag not in ("", "0", "false", "no", "off")


class _WarningsOnward(logging.Handler):
    """Stands in for propagation at a crate's top logger while the gate is closed: WARNING and
    above go on to the handlers above it, as propagation would take them; the rest stop."""

    def __init__(self, above: logging.Logger) -> None:
        super().__init__()
        self._above = above

    def emit(self, record: logging.LogRecord) -> None:
        if record.levelno >= logging.WARNING:
            self._above.callHandlers(record)


_gate_lock = threading.Lock()
_gate_depth = 0
_gate_saved: list[tuple[logging.Logger, _WarningsOnward]] = []


def _crate_loggers() -> list[logging.Logger]:
    found = set(_EGGLOG_CRATES)
    found.update(name.split(".")[0] for name in list(logging.root.manager.loggerDict)
                 if name.startswith("egglog"))  # fmt: skip
    return [logging.getLogger(name) for name in sorted(found)]


@contextmanager
def quiet_egglog() -> Iterator[None]:
    """egglog's records below WARNING stop at its crates' top loggers for the duration.

    Why not raise those loggers' levels: pyo3-log caches each Rust module's effective level at
    its first record, so a level raised then would silence that module for the rest of the
    process, also after we restored it. Closing propagation leaves levels (and that cache) as
    the user set them. A handler the user attached to an egglog logger still sees everything,
    and a crate logger the user stopped from propagating is left alone. Re-entrant and
    thread-safe: the gate opens when the last holder leaves."""
    global _gate_depth
    if debug_enabled():
        yield
        return
    with _gate_lock:
        if _gate_depth == 0:
            for logger in _crate_loggers():
                if logger.propagate and logger.parent is not None:
                    gate = _WarningsOnward(logger.parent)
                    logger.addHandler(gate)
                    logger.propagate = False
                    _gate_saved.append((logger, gate))
        _gate_depth += 1
    try:
        yield
    finally:
        with _gate_lock:
            _gate_depth -= 1
            if _gate_depth == 0:
                for logger, gate in _gate_saved:
                    logger.removeHandler(gate)
                    logger.propagate = True
                _gate_saved.clear()


# ---------------------------------------------------------------------------------------------
# saturation and the frozen table


def extents(terms: Iterable[Term]) -> set[int]:
    """Every sum extent occurring in the terms."""
    found: set[int] = set()
    for term in terms:
        found.update(t.param for t in term.subterms() if t.head == "sum")  # type: ignore[misc]
    return found


def _divisors(n: int) -> list[int]:
    return [d for d in range(2, n) if n % d == 0]


def split_table(extents_: Iterable[int]) -> set[tuple[int, int]]:
    """(n, d) for every divisor n > 1 of an extent and proper divisor d of n."""
    closed: set[int] = set()
    for e in extents_:
        closed.update(d for d in _divisors(e) + [e] if d > 1)
    return {(m, d) for m in closed for d in _divisors(m)}


_PERMUTE_UP_TO = 4


def _fold(get: Any, name: str, args: Sequence[int]) -> int | None:
    cls: int | None = args[0]
    for a in args[1:]:
        cls = get((name, cls, a))
        if cls is None:
            return None
    return cls


class EGraphIndex:
    """A saturated e-graph frozen into Python: e-node key -> dense e-class id."""

    def __init__(self, egraph: EGraph, keep_egraph: bool = False) -> None:
        # egglog's e-graph may only be dropped on the thread that made it: kept, the index
        # would drop it wherever the index dies (a worker's cyclic GC ran it on another one)
        self._egraph = egraph if keep_egraph else None
        raw = egraph._egraph  # the bindings e-graph: freeze() gives every function's rows
        frozen = raw.freeze()
        decoders = {"i64": raw.value_to_i64, "BigRat": raw.value_to_bigrat,
                    "String": raw.value_to_string}  # fmt: skip
        classes: dict[Any, int] = {}
        table: dict[tuple[Any, ...], int] = {}
        for name, fn in frozen.functions.items():
            if fn.is_let_binding or not name.startswith("Mj") or name == "MjSplit":
                continue
            decode = [decoders.get(s) for s in fn.input_sorts]
            for row in fn.rows:
                if row.subsumed:
                    continue
                key = [name]
                for dec, v in zip(decode, row.inputs):
                    key.append(dec(v) if dec is not None else classes.setdefault(v, len(classes)))
                table[tuple(key)] = classes.setdefault(row.output, len(classes))
        self.table = table
        self.num_classes = len(classes)
        self._memo: dict[Term, int | None] = {}

    @property
    def num_nodes(self) -> int:
        return len(self.table)

    def class_of(self, term: Term) -> int | None:
        memo = self._memo
        if term in memo:
            return memo[term]
        args = []
        for a in term.args:
            cls = self.class_of(a)
            if cls is None:
                memo[term] = None
                return None
            args.append(cls)
        cls = self._lookup(term, args)
        memo[term] = cls
        return cls

    def _lookup(self, t: Term, args: list[int]) -> int | None:
        get, h = self.table.get, t.head
        if h == "var":
            return get(("MjVar", t.param))
        if h == "const":
            return get(("MjConst", t.param))
        if h == "sum":
            return get(("MjSum", t.param, args[0]))
        if h == "fn":
            return get(("MjFn", t.param, args[0]))
        if h in _UNARY:
            return get((_UNARY[h], args[0]))
        name = _BINARY[h]
        cls = _fold(get, name, args)
        if cls is None and h in ("add", "mul", "max") and len(args) <= _PERMUTE_UP_TO:
            # a bracketing/order the schedule's last (bounded) stage did not reach
            for order in itertools.permutations(args):
                cls = _fold(get, name, order)
                if cls is not None:
                    break
        return cls

    def check_with_egglog(self, term: Term) -> bool:
        if self._egraph is None:
            raise SearchError("this index did not keep its e-graph",
                              remedy="saturate with keep_egraph=True to cross-check it")
        with quiet_egglog():
            return self._egraph.check_bool(to_egglog(term))


def _egraph_size(egraph: EGraph) -> int:
    return sum(size for _, size in egraph.all_function_sizes())


def saturate(
    targets: Sequence[Term],
    budget: SaturationBudget,
    stats: OracleStats | None = None,
    axioms: Sequence[Axiom] = AXIOMS,
    schedule: Sequence[tuple[str, int | None]] = SCHEDULE,
    keep_egraph: bool = False,
) -> EGraphIndex:
    """Saturate the e-graph of ``targets`` under ``axioms``, stage by stage as ``schedule``
    says, within ``budget``; freeze it (``keep_egraph``: keep egglog's e-graph too, for
    ``check_with_egglog``).

    ``stats.saturated`` is True when every step of the schedule finished (each unbounded step
    reached its fixpoint); ``stats.stop_reason`` names the limit hit otherwise.
    """
    with quiet_egglog():
        return _saturate(targets, budget, stats, axioms, schedule, keep_egraph)


def _saturate(
    targets: Sequence[Term],
    budget: SaturationBudget,
    stats: OracleStats | None,
    axioms: Sequence[Axiom],
    schedule: Sequence[tuple[str, int | None]],
    keep_egraph: bool,
) -> EGraphIndex:
    stats = stats if stats is not None else OracleStats()
    start = time.perf_counter()
    egraph = EGraph()
    try:
        return _fill_and_run(egraph, targets, budget, stats, axioms, schedule, keep_egraph, start)
    finally:
        if not keep_egraph:
            _release(egraph)


def _release(egraph: EGraph) -> None:
    """Drop egglog's native e-graph now, on this thread. It may only be dropped on the thread
    that made it (elsewhere it is leaked and a RuntimeError is printed on the user's stderr),
    and it sits in a reference cycle of egglog's own (callbacks it holds refer back to its
    state), so left to the cyclic GC it is freed on whichever thread collects next: another
    region's search thread, or the user's."""
    state = getattr(egraph, "_state", None)
    if state is not None and getattr(state, "egraph", None) is not None:
        state.egraph = None


def _fill_and_run(
    egraph: EGraph,
    targets: Sequence[Term],
    budget: SaturationBudget,
    stats: OracleStats,
    axioms: Sequence[Axiom],
    schedule: Sequence[tuple[str, int | None]],
    keep_egraph: bool,
    start: float,
) -> EGraphIndex:
    # only the target's own extents split: the products of extents that pulling factors in
    # and out of sums creates (sum(a, x) * sum(b, y) = sum(a*b, x*y)) have many more divisors
    for n, d in sorted(split_table(extents(targets))):
        egraph.register(MjSplit(n, d))
    memo: dict[Term, MjTerm] = {}
    for t in targets:
        egraph.register(to_egglog(t, memo))
    stats.stop_reason = _run_schedule(egraph, axioms, schedule, budget, stats, start)
    stats.saturated = stats.stop_reason == "saturated"
    index = EGraphIndex(egraph, keep_egraph)
    stats.saturation_s = time.perf_counter() - start
    stats.enodes, stats.eclasses = index.num_nodes, index.num_classes
    return index


def _run_schedule(
    egraph: EGraph,
    axioms: Sequence[Axiom],
    schedule: Sequence[tuple[str, int | None]],
    budget: SaturationBudget,
    stats: OracleStats,
    start: float,
) -> str:
    for stage, steps in schedule:
        stage_axioms = [ax for ax in axioms if ax.stage == stage]
        if not stage_axioms:
            continue
        rules = axiom_ruleset(stage_axioms)
        done = 0
        while steps is None or done < steps:
            if stats.iterations >= budget.iterations:
                return "iterations"
            report = egraph.run(rules)
            done += 1
            stats.iterations += 1
            size = _egraph_size(egraph)
            elapsed = time.perf_counter() - start
            stats.per_iteration.append((stage, size, elapsed))
            if not report.updated:
                break
            if size > budget.node_limit:
                return "node_limit"
            if elapsed > budget.time_limit_s:
                return "time_limit"
    return "saturated"


__all__ = [
    "EGraphIndex", "MjSplit", "MjTerm", "axiom_rewrites", "axiom_ruleset", "debug_enabled",
    "extents", "quiet_egglog", "saturate", "split_table", "to_egglog",
]  # fmt: skip
