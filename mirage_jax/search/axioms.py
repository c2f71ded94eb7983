"""The rewrite axioms of the abstract-expression layer, as data.

Each ``Axiom`` is a pair of patterns over the core language of ``mirage_jax.search.abstract``
(heads ``add mul inv exp sqrt sum rmax max concat const var fn``, plus the
e-graph-only ``mean``). ``mirage_jax.search.egraph``
turns the whole tuple into egglog rewrites in one place; the tests instantiate both sides on
random values (float64 and a finite field) and check that they agree.

Patterns are built with the helpers below: ``V("a")`` is a tensor pattern variable, ``N("n")``
an extent (integer) variable, ``Q("p")`` a rational-constant variable; extents and constants can
be combined arithmetically (``N("n") // N("d")``, ``Q("p") * Q("q")``, ``rat(N("d"), N("n"))``).
Computed parameters may appear on a right-hand side only (egglog evaluates them once the left
side has bound the variables).

Every axiom is an identity of real arithmetic, with one kind of exception: ``invariant`` names
pattern variables the law needs to be *loop-invariant* in the summed index
(``sum(n, a*b) = sum(n, a)*b`` holds when ``b`` does not depend on the summation index).
Abstract expressions carry no index information, so the e-graph applies such a law without the
condition. That only merges more e-classes: the oracle accepts more, never less, which is the
safe direction for pruning (see ``abstract.SubexprOracle``). The tests instantiate those
variables as loop-invariant scalars. (The max abstraction is made by the lowering, not by an
axiom: see ``abstract``.) ``stage`` says in which step of ``SCHEDULE`` the axiom runs.

``example`` gives the shapes (tuples) of tensor variables and the values of extent variables for
the semantic test; a tensor variable that is not named there is a random vector of length 4.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

# ---------------------------------------------------------------------------------------------
# parameter expressions (extents and rational constants)


@dataclass(frozen=True)
class Param:
    """An integer (``kind='int'``) or rational (``kind='rat'``) parameter expression."""

    kind: str  # "int" | "rat"
    op: str  # "var" | "lit" | "*" | "//" | "+" | "neg" | "inv" | "rat"
    args: tuple[Any, ...]

    def __mul__(self, other: Param) -> Param:
        return Param(self.kind, "*", (self, other))

    def __floordiv__(self, other: Param) -> Param:
        return Param("int", "//", (self, other))

    def __add__(self, other: Param) -> Param:
        return Param(self.kind, "+", (self, other))

    def __neg__(self) -> Param:
        return Param("rat", "neg", (self,))

    @property
    def is_plain(self) -> bool:
        """A variable or literal, i.e. usable on a left-hand side."""
        return self.op in ("var", "lit")

    def variables(self) -> set[str]:
        if self.op == "var":
            return {self.args[0]}
        if self.op == "lit":
            return set()
        return set().union(*(a.variables() for a in self.args))

    def evaluate(self, env: dict[str, Any]) -> Any:
        """The value of the expression with variables from ``env`` (used by tests)."""
        if self.op == "var":
            return env[self.args[0]]
        if self.op == "lit":
            return self.args[0]
        vals = [a.evaluate(env) for a in self.args]
        if self.op == "*":
            return vals[0] * vals[1]
        if self.op == "+":
            return vals[0] + vals[1]
        if self.op == "//":
            return vals[0] // vals[1]
        if self.op == "neg":
            return -vals[0]
        if self.op == "inv":
            return 1 / Fraction(vals[0])
        if self.op == "rat":
            return Fraction(vals[0], vals[1])
        raise ValueError(f"unknown parameter op {self.op!r}")

    def __str__(self) -> str:
        if self.op == "var":
            return self.args[0]
        if self.op == "lit":
            return str(self.args[0])
        if self.op in ("neg", "inv"):
            return f"{self.op}({self.args[0]})"
        if self.op == "rat":
            return f"({self.args[0]}/{self.args[1]})"
        return f"({self.args[0]} {self.op} {self.args[1]})"


def N(name: str) -> Param:  # noqa: N802 - reads like math in the axiom table
    """An extent variable."""
    return Param("int", "var", (name,))


def Q(name: str) -> Param:  # noqa: N802
    """A rational-constant variable."""
    return Param("rat", "var", (name,))


def lit_int(value: int) -> Param:
    return Param("int", "lit", (int(value),))


def lit_rat(value: Fraction | int) -> Param:
    return Param("rat", "lit", (Fraction(value),))


def rat(num: Param, den: Param) -> Param:
    """The rational num/den of two extent expressions."""
    return Param("rat", "rat", (num, den))


def inv_q(p: Param) -> Param:
    return Param("rat", "inv", (p,))


# ---------------------------------------------------------------------------------------------
# term patterns


@dataclass(frozen=True)
class Pat:
    """A pattern over the core language; head ``"?"`` is a tensor variable named by ``param``."""

    head: str
    args: tuple[Pat, ...] = ()
    param: Param | str | None = None

    def tensor_vars(self) -> set[str]:
        if self.head == "?":
            return {self.param}  # type: ignore[arg-type]
        return set().union(*(a.tensor_vars() for a in self.args))

    def param_vars(self) -> set[str]:
        own = self.param.variables() if isinstance(self.param, Param) else set()
        return own.union(*(a.param_vars() for a in self.args))

    def params_plain(self) -> bool:
        own = not isinstance(self.param, Param) or self.param.is_plain
        return own and all(a.params_plain() for a in self.args)

    def __str__(self) -> str:
        if self.head == "?":
            return f"?{self.param}"
        if self.head == "const":
            return f"c({self.param})"
        inner = [str(self.param)] if self.param is not None else []
        inner += [str(a) for a in self.args]
        return f"{self.head}({', '.join(inner)})"


def V(name: str) -> Pat:  # noqa: N802
    """A tensor pattern variable."""
    return Pat("?", (), name)


def add(a: Pat, b: Pat) -> Pat:
    return Pat("add", (a, b))


def mul(a: Pat, b: Pat) -> Pat:
    return Pat("mul", (a, b))


def maximum(a: Pat, b: Pat) -> Pat:
    return Pat("max", (a, b))


def inv(a: Pat) -> Pat:
    return Pat("inv", (a,))


def exp(a: Pat) -> Pat:
    return Pat("exp", (a,))


def sqrt(a: Pat) -> Pat:
    return Pat("sqrt", (a,))


def rmax(a: Pat) -> Pat:
    return Pat("rmax", (a,))


def concat(a: Pat, b: Pat) -> Pat:
    return Pat("concat", (a, b))


def sum_(n: Param, a: Pat) -> Pat:
    return Pat("sum", (a,), n)


def mean_(n: Param, a: Pat) -> Pat:
    """The auxiliary mean head (e-graph only; see mean-intro)."""
    return Pat("mean", (a,), n)


def const(p: Param | Fraction | int) -> Pat:
    return Pat("const", (), p if isinstance(p, Param) else lit_rat(p))


# ---------------------------------------------------------------------------------------------
# the axioms


@dataclass(frozen=True)
class Cond:
    """A side condition egglog checks before firing.

    ``divisor(n, d)``: ``d`` is a proper divisor of ``n`` and ``n`` divides an extent of the
    target (the split table is filled per target). ``nonzero(p)``: the constant ``p`` is not 0.
    ``recip(n, p)``: the constant ``p`` is ``1/n``.
    """

    kind: str
    args: tuple[str, ...]

    def __str__(self) -> str:
        return f"{self.kind}({', '.join(self.args)})"


@dataclass(frozen=True)
class Axiom:
    name: str
    lhs: Pat
    rhs: Pat
    both: bool = False  # also rewrite rhs -> lhs (needs plain parameters on both sides)
    when: tuple[Cond, ...] = ()
    invariant: tuple[str, ...] = ()
    stage: str = "core"  # which step of SCHEDULE applies it
    example: dict[str, Any] = field(default_factory=dict)
    doc: str = ""

    def __post_init__(self) -> None:
        if not self.lhs.params_plain():
            raise ValueError(f"axiom {self.name}: computed parameters on the left-hand side")
        if self.both and not self.rhs.params_plain():
            raise ValueError(f"axiom {self.name}: a two-way axiom needs plain parameters")
        free = (self.rhs.tensor_vars() - self.lhs.tensor_vars()) | (
            self.rhs.param_vars() - self.lhs.param_vars() - {v for c in self.when for v in c.args}
        )
        if free:
            raise ValueError(f"axiom {self.name}: right-hand side variables {free} are unbound")

    def __str__(self) -> str:
        arrow = "<->" if self.both else "->"
        cond = f"  if {', '.join(map(str, self.when))}" if self.when else ""
        return f"{self.name}: {self.lhs} {arrow} {self.rhs}{cond}"


a, b, c, d = V("a"), V("b"), V("c"), V("d")
n, m, k = N("n"), N("m"), N("d")
p, q = Q("p"), Q("q")
ONE, ZERO, MINUS_ONE = const(1), const(0), const(-1)
ONE_N = lit_int(1)

AXIOMS: tuple[Axiom, ...] = (
    # commutative rings: + and * (the lowering already flattens and folds, these close the
    # e-graph under every bracketing and order)
    Axiom("add-comm", add(a, b), add(b, a)),
    Axiom("add-assoc", add(a, add(b, c)), add(add(a, b), c), both=True),
    Axiom("mul-comm", mul(a, b), mul(b, a)),
    Axiom("mul-assoc", mul(a, mul(b, c)), mul(mul(a, b), c), both=True),
    Axiom("mul-add-distribute", mul(a, add(b, c)), add(mul(a, b), mul(a, c)),
          stage="distribute",
          doc="expanding only: with factoring too, AC over + and * explodes on ntrans"),
    Axiom("max-comm", maximum(a, b), maximum(b, a)),
    Axiom("max-assoc", maximum(a, maximum(b, c)), maximum(maximum(a, b), c), both=True),
    # constants and like terms (the lowering folds these too)
    Axiom("const-mul-fold", mul(const(p), const(q)), const(p * q)),
    Axiom("const-add-fold", add(const(p), const(q)), const(p + q)),
    Axiom("mul-one", mul(a, ONE), a),
    Axiom("mul-zero", mul(a, ZERO), ZERO),
    Axiom("add-zero", add(a, ZERO), a),
    Axiom("add-double", add(a, a), mul(a, const(2))),
    Axiom("add-collect", add(a, mul(a, const(p))), mul(a, const(p + lit_rat(1)))),
    Axiom("add-collect2", add(mul(a, const(p)), mul(a, const(q))), mul(a, const(p + q))),
    Axiom("inv-const", inv(const(p)), const(inv_q(p)), when=(Cond("nonzero", ("p",)),)),
    # division (div(a, b) is lowered to mul(a, inv(b)))
    Axiom("inv-mul", inv(mul(a, b)), mul(inv(a), inv(b)), both=True),
    Axiom("inv-inv", inv(inv(a)), a),
    # sums over a reduced extent
    Axiom("sum-add", sum_(n, add(a, b)), add(sum_(n, a), sum_(n, b)), both=True,
          example={"n": 6, "a": (6,), "b": (6,)}),
    Axiom("sum-pull", sum_(n, mul(a, b)), mul(sum_(n, a), b), both=True, invariant=("b",),
          example={"n": 6, "a": (6,), "b": ()},
          doc="factor out of a sum what does not depend on its index (unconditional in the "
              "e-graph: abstract expressions carry no indices)"),
    Axiom("sum-merge", sum_(n, sum_(m, a)), sum_(n * m, a), example={"n": 2, "m": 3, "a": (6,)}),
    Axiom("sum-one", sum_(lit_int(1), a), a, example={"a": ()}),
    # means: the e-graph has an auxiliary head mean(n, a) = mul(sum(n, a), 1/n) (queries never
    # use it) so that a mean over n can split into a mean over d of tile means over n/d without
    # inventing constants (a general constant-splitting rule makes the e-graph explode)
    Axiom("mean-intro", mul(sum_(n, a), const(p)), mean_(n, a), when=(Cond("recip", ("n", "p")),),
          example={"n": 6, "a": (6,), "p": Fraction(1, 6)}),
    Axiom("mean-def", mean_(n, a), mul(sum_(n, a), const(rat(ONE_N, n))),
          example={"n": 6, "a": (6,)}),
    # tiling: a reduction over n is a loop accumulation over d of tile reductions over n/d
    Axiom("sum-split", sum_(n, a), sum_(k, sum_(n // k, a)), when=(Cond("divisor", ("n", "d")),),
          stage="tiling", example={"n": 6, "d": 2, "a": (6,)},
          doc="sum(n*m, x) = sum(n, sum(m, x)): a tile sum nested in a loop accumulator"),
    Axiom("mean-split", mean_(n, a), mean_(k, mean_(n // k, a)),
          when=(Cond("divisor", ("n", "d")),), stage="tiling",
          example={"n": 6, "d": 3, "a": (6,)},
          doc="a mean over n*m is a mean over n of tile means over m"),
    Axiom("mean-merge", mean_(n, mean_(m, a)), mean_(n * m, a), stage="tiling",
          example={"n": 2, "m": 3, "a": (6,)}),
    # exponentials (online softmax)
    Axiom("exp-add", exp(add(a, b)), mul(exp(a), exp(b))),
    Axiom("exp-neg", exp(mul(a, MINUS_ONE)), inv(exp(a)), both=True),
    Axiom("exp-zero", exp(ZERO), ONE),
    # max-reduce: the abstraction drops the reduced extent, so max factoring
    # max(n*m, x) = max(n, max(m, x)) becomes idempotence
    Axiom("rmax-idem", rmax(rmax(a)), rmax(a)),
    # square roots (of the non-negative mean squares rms norms take)
    Axiom("sqrt-mul", sqrt(mul(a, b)), mul(sqrt(a), sqrt(b)), both=True,
          example={"a": "pos", "b": "pos"}),
    Axiom("sqrt-inv", sqrt(inv(a)), inv(sqrt(a)), both=True, example={"a": "pos"}),
    # concatenation along a contracted dimension (LoRA-style fused matmuls)
    Axiom("concat-matmul", add(sum_(n, mul(a, b)), sum_(m, mul(c, d))),
          sum_(n + m, mul(concat(a, c), concat(b, d))), stage="concat",
          example={"n": 3, "m": 2, "a": (3,), "b": (3,), "c": (2,), "d": (2,)},
          doc="X@W + Y@V = concat(X, Y) @ concat(W, V) with the concat along k"),
)  # fmt: skip

# How the stages run (egraph.saturate): (stage, iterations or None = until saturated). Running
# every axiom together saturates the small targets but not the attention ones: AC over long
# products times the divisor splits of a 4096 extent, times concat-matmul on every pair of
# sums, times distribution both ways, grows past a million e-nodes. So: expand products over
# sums a little, saturate the algebra, relate concatenations once, then split the reductions
# into tiles and give the algebra three more passes over the tiles (a fourth triples the
# e-graph again; the oracle's lookup also tries every order of a product of up to 4 factors).
SCHEDULE: tuple[tuple[str, int | None], ...] = (
    ("distribute", 2),
    ("core", None),
    ("concat", 1),
    ("core", None),
    ("tiling", None),
    ("core", 3),
)

AXIOM_BY_NAME: dict[str, Axiom] = {ax.name: ax for ax in AXIOMS}

__all__ = [
    "AXIOMS", "AXIOM_BY_NAME", "SCHEDULE", "Axiom", "Cond", "N", "Param", "Pat", "Q", "V",
    "lit_int", "lit_rat", "rat",
]  # fmt: skip
