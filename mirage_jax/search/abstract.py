"""Abstract expressions: what every tensor of a μGraph computes, ignoring how it is tiled.

This is Mirage's pruning abstraction. Every tensor gets a ``Term`` over a small core language;
a search prefix is pruned when the term of a new tensor is not a subexpression of the target's
terms modulo the axioms (``mirage_jax.search.axioms``). ``SubexprOracle`` answers that question
from the target's e-graph, saturated once with egglog (``mirage_jax.search.egraph``). ``Term``
and the oracle's ``SaturationBudget`` and ``OracleStats`` live in
``mirage_jax.search.abstract_terms`` (shared with ``egraph``) and are re-exported here.

Core language (``Term.head``; ``param`` in brackets)::

    var[i]          kernel input i                const[q]      a rational constant
    add(a, b, ...)  n-ary sum (flattened)         mul(a, ...)   n-ary product (flattened)
    inv(a)          1/a                           exp(a), sqrt(a)
    sum[n](a)       sum over a reduced extent n   rmax(a)       max over a reduced extent
    max(a, b)       elementwise maximum           concat(a, b)  opaque symbol over both parts
    fn[name](a)     uninterpreted unary function (log, tanh, erf, pow:<e>)

Lowering choices: each op's ``OpInfo.abstract`` (``mirage_jax.ir.ops``) is a formula over this
language, compiled once into ``LOWERING`` below:

- matmul = sum[k](mul(a, b)); reduce_sum over a dim of size n = sum[n](x); reduce_mean =
  mul(sum[n](x), 1/n); reduce_rms / acc_rms = sqrt(mean(x*x)).
- sub(a, b) = add(a, mul(b, -1)); neg = mul(x, -1); div(a, b) = mul(a, inv(b)); rsqrt = inv(sqrt);
  reciprocal = inv; square = mul(x, x); sigmoid = inv(add(1, exp(mul(x, -1)))); silu = x*sigmoid;
  relu = max(x, 0); gelu = its tanh formula with tanh opaque; pow_scalar 2, 3, 0.5, -0.5, -1, -2
  become products/sqrt/inv, other exponents an opaque ``fn[pow:e]``.
- reshape, transpose and cast are the identity: the abstraction has no indices or dtypes.
  concat is an opaque symbol over both operands (the ``concat-matmul`` axiom relates it to sums).
- Block level: an input_iter tile has the expression of its whole operand; a tile matmul
  contracts only the tile's k; acc_sum over R iterations (dim d of tile extent t: R*t) is
  sum[R*t]; acc_mean multiplies by 1/(R*t); acc_rms is sqrt of that mean of x*x.
- Max reductions drop their extent: ``rmax(x)`` is "a max of x over some reduced extent", so a
  per-tile max, a per-iteration max and the loop's global max (acc_max) have one expression.
  acc_rescale_sum(x, m) = sum_i exp(m_i - M) x_i lowers to sum[R](x): the rescale factor is a
  max-shift, invisible once the shift's maxima are identified. With both choices the online
  softmax of FlashDecoding has the same expressions as the plain softmax it replaces.
- Output savers pass the tile's term through; graph_def results are the saved terms.

Terms are normalized as they are built (products and sums flattened and sorted, like terms
collected, constants folded, constant factors pulled out of sums, nested sums merged, sum[1]
dropped, rmax(rmax x) = rmax x, x*0 = 0, exp(0) = 1); float constants are rounded to float32
and snapped to a simple fraction when one rounds the same (see ``const``). Each normalizing step
is also an axiom the e-graph applies, so normalizing does not hide a term the e-graph holds.
Terms without inputs (x - x = 0) are always accepted.

Soundness of pruning. The abstraction only identifies more things than arithmetic does, and
axioms whose real form needs a side condition are applied without it (see ``axioms``): both
make the oracle accept more, never less. Relative to the axioms, ``contains`` is complete for
what the saturation schedule (``axioms.SCHEDULE``) reaches: the algebra is saturated, but
distribution over sums runs two passes, concat-matmul one, and the algebra three passes over
the tile splits (running everything to a fixpoint explodes on the attention targets); the
lookup also tries every order of a product or sum of up to 4 operands. ``stats.saturated`` is
False when a budget limit cut the schedule short. Pruned although equivalent: graphs equal to
the target only through an identity outside the axioms (a cancellation ``x * inv(x)``, the
factoring direction of distributivity, log/tanh/erf identities, a max-subtracting softmax
against a target without the subtraction) or through tile derivations deeper than the schedule's
last passes.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from fractions import Fraction
from typing import Any, NoReturn

import numpy as np

from mirage_jax.errors import SearchError
from mirage_jax.ir.graph import BlockGraph, KernelGraph, ThreadGraph
from mirage_jax.ir.ops import NONE_DIM, Op
from mirage_jax.ir.shapes import BlockContext
from mirage_jax.ir.types import TensorType
from mirage_jax.search.abstract_terms import OracleStats, SaturationBudget, Term

# ---------------------------------------------------------------------------------------------
# normalizing constructors


def _key(t: Term) -> str:
    return str(t)


def _snap(value: float | Fraction) -> Fraction:
    """A float constant as a rational, rounded to float32 first and snapped to a simple
    fraction when one rounds to the same float32: ``1e-6`` traced in f32 or written in f64,
    ``mul_scalar(1/3)`` and a mean over 3 all get one constant. (Identifying constants that
    agree to float32 precision only ever makes the oracle accept more.)"""
    if isinstance(value, Fraction):
        return value
    if isinstance(value, int):
        return Fraction(value)
    if not math.isfinite(value):
        raise SearchError(f"constant {value} is not finite: abstract expressions are rational")
    with np.errstate(over="ignore"):
        x32 = np.float32(value)
    if not np.isfinite(x32) or x32 == 0:
        return Fraction(float(value))
    simple = Fraction(float(x32)).limit_denominator(1_000_000)
    return simple if np.float32(simple) == x32 else Fraction(float(x32))


def var(index: int) -> Term:
    return Term("var", (), int(index))


def const(value: float | Fraction) -> Term:
    return Term("const", (), _snap(value))


ONE = Term("const", (), Fraction(1))
MINUS_ONE = Term("const", (), Fraction(-1))


def _flatten(head: str, xs: Sequence[Term]) -> tuple[list[Term], list[Fraction]]:
    terms: list[Term] = []
    consts: list[Fraction] = []
    for x in xs:
        for y in x.args if x.head == head else (x,):
            if y.head == "const":
                consts.append(y.param)  # type: ignore[arg-type]
            else:
                terms.append(y)
    return terms, consts


def mul(*xs: Term) -> Term:
    """Product; flattened, constants folded into one trailing factor, factors sorted."""
    terms, consts = _flatten("mul", xs)
    c = math.prod(consts, start=Fraction(1))
    if c == 0:
        return Term("const", (), Fraction(0))
    terms.sort(key=_key)
    if c != 1 or not terms:
        terms.append(Term("const", (), c))
    return terms[0] if len(terms) == 1 else Term("mul", tuple(terms))


def _coefficient(t: Term) -> tuple[Term, Fraction]:
    """``t`` as core * k; cores of normalized products are normalized (factors stay sorted)."""
    if t.head == "mul" and t.args[-1].head == "const":
        rest, k = t.args[:-1], t.args[-1].param
        return (rest[0] if len(rest) == 1 else Term("mul", rest)), k  # type: ignore[return-value]
    return t, Fraction(1)


def add(*xs: Term) -> Term:
    """Sum of terms; flattened, like terms collected (x + 2x = 3x, x - x = 0), constants
    folded, terms sorted."""
    terms, consts = _flatten("add", xs)
    collected: dict[Term, list[Any]] = {}  # core -> [coefficient, the summand if alone]
    for t in terms:
        core, k = _coefficient(t)
        entry = collected.get(core)
        if entry is None:
            collected[core] = [k, t]
        else:
            entry[0] += k
            entry[1] = None
    out = [t if t is not None else mul(core, Term("const", (), k))
           for core, (k, t) in collected.items() if k != 0]  # fmt: skip
    out.sort(key=_key)
    c = sum(consts, start=Fraction(0))
    if c != 0 or not out:
        out.append(Term("const", (), c))
    return out[0] if len(out) == 1 else Term("add", tuple(out))


def inv(x: Term) -> Term:
    if x.head == "const" and x.param != 0:
        return Term("const", (), 1 / x.param)  # type: ignore[operator]
    if x.head == "inv":
        return x.args[0]
    return Term("inv", (x,))


def exp(x: Term) -> Term:
    return ONE if x.head == "const" and x.param == 0 else Term("exp", (x,))


def sqrt(x: Term) -> Term:
    return Term("sqrt", (x,))


def sum_(extent: int, x: Term) -> Term:
    """Sum over a reduced extent; sum[1] is dropped, constant factors move out, nests merge."""
    extent = int(extent)
    if extent < 1:
        raise SearchError(f"a sum over extent {extent} is meaningless")
    if extent == 1:
        return x
    if x.head == "mul" and x.args[-1].head == "const":
        rest = mul(*x.args[:-1])
        return mul(sum_(extent, rest), x.args[-1])
    if x.head == "sum":
        return sum_(extent * x.param, x.args[0])  # type: ignore[operator]
    return Term("sum", (x,), extent)


def rmax(x: Term) -> Term:
    """Max over a reduced extent (the extent is abstracted away, see the module docstring)."""
    return x if x.head == "rmax" else Term("rmax", (x,))


def maximum(a: Term, b: Term) -> Term:
    """Elementwise maximum (commutative: operands sorted)."""
    return Term("max", tuple(sorted((a, b), key=_key)))


def concat(a: Term, b: Term) -> Term:
    return Term("concat", (a, b))


def fn(name: str, x: Term) -> Term:
    """An uninterpreted unary function."""
    return Term("fn", (x,), str(name))


def neg(x: Term) -> Term:
    return mul(x, MINUS_ONE)


def sigmoid(x: Term) -> Term:
    return inv(add(ONE, exp(neg(x))))


def mean(extent: int, x: Term) -> Term:
    return mul(sum_(extent, x), const(Fraction(1, extent)))


# ---------------------------------------------------------------------------------------------
# lowering of ops


Lower = Callable[
    [Mapping[str, Any], Sequence[Term], Sequence[TensorType], "BlockContext | None"], Term
]


def _pow(x: Term, e: float) -> Term:
    table = {
        1.0: lambda: x, 2.0: lambda: mul(x, x), 3.0: lambda: mul(x, x, x),
        0.5: lambda: sqrt(x), -0.5: lambda: inv(sqrt(x)), -1.0: lambda: inv(x),
        -2.0: lambda: inv(mul(x, x)), 0.0: lambda: ONE,
    }  # fmt: skip
    make = table.get(float(e))
    return make() if make is not None else fn(f"pow:{float(e)!r}", x)


def _loop(op: Op, blk: BlockContext | None) -> int:
    if blk is None:
        raise SearchError(
            f"{op.value}: an accumulator needs the block context (forloop range)",
            remedy="pass block=BlockGraph.context to abstract_op for block-level ops",
        )
    return blk.forloop_range


def _attr(op: Op, attrs: Mapping[str, Any], name: str) -> Any:
    try:
        return attrs[name]
    except KeyError:
        raise SearchError(f"{op.value}: abstract_op needs the node's attrs[{name!r}]",
                          remedy="pass the node's attributes (node.attr_dict)") from None  # fmt: skip


# ---------------------------------------------------------------------------------------------
# formulas: each op's ``OpInfo.abstract`` (ir.ops), compiled once into a ``Lower``

_FORMULA_TOKEN = re.compile(r"\s*(-?\d+(?:\.\d*)?(?:e[-+]?\d+)?|[A-Za-z_]\w*|[][(),*])")
# constructors a formula may call by name (with the operands' terms as arguments)
_CONSTRUCTORS: dict[str, Callable[..., Term]] = {
    "add": add, "mul": mul, "inv": inv, "exp": exp, "sqrt": sqrt, "max": maximum, "neg": neg,
    "sigmoid": sigmoid, "concat": concat,
}  # fmt: skip
_OPERANDS = {"x": 0, "y": 1}


def _along_dim(attrs: Mapping[str, Any], types: Sequence[TensorType], blk: Any) -> int:
    dim = attrs.get("dim", NONE_DIM)
    return 1 if dim == NONE_DIM else types[0].shape[dim]


def _extent(op: Op, name: str) -> Callable[[Mapping[str, Any], Sequence[TensorType], Any], int]:
    """A reduced extent of a formula: ``k`` (the first operand's last dim, a matmul's
    contraction), ``dim`` (the first operand's extent along attribute ``dim``, 1 for none),
    ``loop`` (the block's for-loop range)."""
    if name == "k":
        return lambda attrs, types, blk: types[0].shape[-1]
    if name == "dim":
        return _along_dim
    if name == "loop":
        return lambda attrs, types, blk: _loop(op, blk)
    raise SearchError(f"{op.value}: unknown extent {name!r} in its abstract formula")


class _Formula:
    """A recursive-descent reader of one formula (grammar in ``OpInfo.abstract``)."""

    def __init__(self, op: Op, text: str) -> None:
        self.op, self.text = op, text
        self.tokens = _FORMULA_TOKEN.findall(text)
        if "".join(self.tokens) != re.sub(r"\s", "", text):
            self.fail("unexpected characters")
        self.pos = 0

    def fail(self, why: str) -> NoReturn:
        raise SearchError(f"{self.op.value}: abstract formula {self.text!r}: {why}")

    def take(self, want: str | None = None) -> str:
        if self.pos >= len(self.tokens):
            self.fail("ends early")
        tok = self.tokens[self.pos]
        if want is not None and tok != want:
            self.fail(f"expected {want!r}, found {tok!r}")
        self.pos += 1
        return tok

    def peek(self) -> str | None:
        return self.tokens[self.pos] if self.pos < len(self.tokens) else None

    def compile(self) -> Lower:
        lower = self.expr()
        if self.peek() is not None:
            self.fail(f"unexpected {self.peek()!r}")
        return lower

    def expr(self) -> Lower:
        tok = self.take()
        if tok[0].isdigit() or tok[0] == "-":
            c = const(float(tok) if any(ch in tok for ch in ".e") else int(tok))
            return lambda attrs, ins, types, blk: c
        if tok in _OPERANDS:
            i = _OPERANDS[tok]
            return lambda attrs, ins, types, blk: ins[i]
        param = None
        if self.peek() == "[":
            self.take("[")
            param = [self.take()]
            while self.peek() == "*":
                self.take("*")
                param.append(self.take())
            self.take("]")
        args = []
        if self.peek() == "(":
            self.take("(")
            args.append(self.expr())
            while self.peek() == ",":
                self.take(",")
                args.append(self.expr())
            self.take(")")
        return self.apply(tok, param, args)

    def apply(self, head: str, param: list[str] | None, args: list[Lower]) -> Lower:
        op = self.op
        if head in _CONSTRUCTORS and param is None:
            return _call(_CONSTRUCTORS[head], args)
        if param is None or (len(param) != 1 and head not in ("sum", "mean", "rmax")):
            self.fail(f"{head} needs one [parameter]")
        name = param[0]
        if head in ("const", "var") and not args:
            make = const if head == "const" else var
            return lambda attrs, ins, types, blk: make(_attr(op, attrs, name))
        if len(args) != 1:
            self.fail(f"{head}[...] takes one argument")
        (a,) = args
        if head == "fn":
            return lambda attrs, ins, types, blk: fn(name, a(attrs, ins, types, blk))
        if head == "pow":
            return lambda attrs, ins, types, blk: _pow(a(attrs, ins, types, blk),
                                                        _attr(op, attrs, name))  # fmt: skip
        if head in ("sum", "mean", "rmax"):
            return _reduce(head, [_extent(op, p) for p in param], a)
        self.fail(f"unknown head {head!r}")


def _call(f: Callable[..., Term], args: list[Lower]) -> Lower:
    if len(args) == 1:
        (a,) = args
        return lambda attrs, ins, types, blk: f(a(attrs, ins, types, blk))
    if len(args) == 2:
        a, b = args
        return lambda attrs, ins, types, blk: f(a(attrs, ins, types, blk),
                                                 b(attrs, ins, types, blk))  # fmt: skip
    return lambda attrs, ins, types, blk: f(*[g(attrs, ins, types, blk) for g in args])


def _reduce(head: str, extents: list[Callable[..., int]], a: Lower) -> Lower:
    """sum / mean / rmax of ``a`` over the product of ``extents``; a max over a single element
    is the element itself."""
    make = {"sum": sum_, "mean": mean, "rmax": lambda n, x: x if n == 1 else rmax(x)}[head]
    if len(extents) == 1:
        (e,) = extents
        return lambda attrs, ins, types, blk: make(e(attrs, types, blk), a(attrs, ins, types, blk))

    def lower(attrs, ins, types, blk):
        n = 1
        for e in extents:
            n *= e(attrs, types, blk)
        return make(n, a(attrs, ins, types, blk))

    return lower


# every op with a value of its own; OUTPUT, OUTPUT_SAVER, GRAPH_DEF and THREAD are structural
LOWERING: dict[Op, Lower] = {
    op: _Formula(op, op.info.abstract).compile() for op in Op if op.info.abstract
}


def abstract_op(
    op: Op,
    attrs: Mapping[str, Any],
    in_terms: Sequence[Term],
    in_types: Sequence[TensorType],
    out_types: Sequence[TensorType],
    block: BlockContext | None = None,
) -> tuple[Term, ...]:
    """The terms of one node's outputs from its operands' terms (one term per output).

    Conventions for the structural ops: INPUT takes ``attrs['index']`` (its position among the
    kernel inputs); INPUT_ITER takes ``in_terms=(term of the operand it reads,)``; OUTPUT and
    OUTPUT_SAVER have no outputs, so ``()`` (a saver's term is its operand's term); GRAPH_DEF
    and THREAD expand their nested graph. Block-level accumulators need ``block``.
    """
    if op in (Op.OUTPUT, Op.OUTPUT_SAVER):
        return ()
    if op is Op.GRAPH_DEF:
        return block_output_terms(attrs["block"], in_terms)
    if op is Op.THREAD:
        return (thread_term(attrs["graph"], in_terms),)
    if op is Op.INPUT and "index" not in attrs:
        raise SearchError(
            "input: abstract_op needs the input's position as attrs['index']",
            remedy="pass {'index': i} for the i-th INPUT node, or use var(i)",
        )
    if op is Op.INPUT_ITER and len(in_terms) != 1:
        raise SearchError(
            "input_iter: abstract_op needs the term of the graph_def operand it reads",
            remedy="pass in_terms=(arg_terms[attrs['arg']],)",
        )
    lower = LOWERING.get(op)
    if lower is None:  # pragma: no cover - guards the table against a new Op
        raise SearchError(f"{op.value}: no abstract-expression lowering")
    return (lower(attrs, tuple(in_terms), tuple(in_types), block),)


def _node_terms(graph, nodes_terms: dict[int, Term], block: BlockContext | None, node) -> None:
    ins = [nodes_terms[i] for i in node.ins]
    types = [graph.types[i] for i in node.ins]
    outs = abstract_op(
        node.op, node.attr_dict, ins, types, [graph.types[o] for o in node.outs], block
    )
    nodes_terms.update(zip(node.outs, outs))


def kernel_terms(graph: KernelGraph) -> dict[int, Term]:
    """The term of every value id of a kernel graph (graph_def results via their block)."""
    terms: dict[int, Term] = {}
    index = 0
    for node in graph.nodes:
        if node.op is Op.INPUT:
            terms[node.outs[0]] = var(index)
            index += 1
        else:
            _node_terms(graph, terms, None, node)
    return terms


def block_terms(block: BlockGraph, arg_terms: Sequence[Term]) -> dict[int, Term]:
    """The term of every value id of a block graph whose operands have ``arg_terms``."""
    if len(arg_terms) != len(block.arg_types):
        raise SearchError(
            f"block graph has {len(block.arg_types)} operands but {len(arg_terms)} terms given"
        )
    ctx = block.context
    terms: dict[int, Term] = {}
    for node in block.nodes:
        if node.op is Op.INPUT_ITER:
            terms[node.outs[0]] = arg_terms[node.attr("arg")]
        else:
            _node_terms(block, terms, ctx, node)
    return terms


def block_output_terms(block: BlockGraph, arg_terms: Sequence[Term]) -> tuple[Term, ...]:
    """The terms of a block graph's saved outputs (the graph_def results), in saver order."""
    terms = block_terms(block, arg_terms)
    return tuple(terms[n.ins[0]] for n in block.outputs)


def thread_term(graph: ThreadGraph, in_terms: Sequence[Term]) -> Term:
    """The term of a thread graph's output: its elementwise chain inlined."""
    terms: dict[int, Term] = {}
    inputs = iter(in_terms)
    for node in graph.nodes:
        if node.op is Op.INPUT:
            terms[node.outs[0]] = next(inputs)
        elif node.op is Op.OUTPUT:
            return terms[node.ins[0]]
        else:
            _node_terms(graph, terms, None, node)
    raise SearchError("thread graph without an output")  # pragma: no cover - builder forbids


def all_terms(graph: KernelGraph) -> list[tuple[str, Term]]:
    """Every tensor of a μGraph at every level, labelled: ``("k%3", t)`` for kernel value 3,
    ``("b1%5", t)`` for value 5 of the block graph of the second graph_def (thread graphs are
    inlined into the block value they produce)."""
    terms = kernel_terms(graph)
    out = [(f"k%{vid}", t) for vid, t in sorted(terms.items())]
    for i, node in enumerate(graph.nodes_of(Op.GRAPH_DEF)):
        inner = block_terms(node.attr("block"), [terms[v] for v in node.ins])
        out += [(f"b{i}%{vid}", t) for vid, t in sorted(inner.items())]
    return out


def output_terms(graph: KernelGraph, terms: Mapping[int, Term] | None = None
                 ) -> tuple[Term, ...]:  # fmt: skip
    """The terms of a kernel graph's outputs, in order (``terms``: its ``kernel_terms``, when
    already computed)."""
    terms = kernel_terms(graph) if terms is None else terms
    return tuple(terms[n.ins[0]] for n in graph.outputs)


# ---------------------------------------------------------------------------------------------
# the oracle


def _roots(outputs: tuple[Term, ...], values: Iterable[Term]) -> list[Term]:
    """The e-graph's roots: the outputs, then every other value the target computes. The
    terms' normal form can hide a value inside its users (x - mean(x) is
    ``x + sum(x) * -1/n``, in which ``sum(x) * 1/n`` is no subterm), and a candidate must at
    least be allowed the target's own steps."""
    roots = dict.fromkeys(outputs)
    roots.update(dict.fromkeys(t for t in values if _has_var(t)))
    return list(roots)


def _has_var(term: Term) -> bool:
    return any(t.head == "var" for t in term.subterms())


class SubexprOracle:
    """Is a term, modulo the axioms, a subexpression of the target's outputs?

    The target's output terms and the values it computes on the way (``_roots``) go into one
    egglog e-graph, saturated once with ``AXIOMS`` by ``axioms.SCHEDULE`` under ``budget``;
    the result is frozen into a Python hash-cons table, so a query is a bottom-up lookup over
    the term's nodes (memoized per subterm, answers cached per term), with no egglog call.
    ``stats.saturated`` is False when a budget limit cut the schedule short; the oracle then
    still answers, but may reject a term it should accept (the module docstring says what
    the schedule reaches).
    """

    def __init__(
        self, target: KernelGraph | Sequence[Term], *, budget: SaturationBudget | None = None,
        keep_egraph: bool = False,
    ) -> None:  # fmt: skip
        # egglog is heavy and needed only once an oracle is built: importing this module
        # (and so the search package) must not load it
        from mirage_jax.search.egraph import saturate

        values: Iterable[Term] = ()
        if isinstance(target, KernelGraph):
            terms = kernel_terms(target)
            self.targets: tuple[Term, ...] = output_terms(target, terms)
            values = terms.values()
        else:
            self.targets = tuple(target)
        self.budget = budget or SaturationBudget()
        self.stats = OracleStats()
        self._index = saturate(_roots(self.targets, values), self.budget, self.stats,
                               keep_egraph=keep_egraph)  # fmt: skip
        self._outputs = tuple(self._index.class_of(t) for t in self.targets)
        self._answers: dict[Term, bool] = {}

    def contains(self, term: Term) -> bool:
        self.stats.queries += 1
        hit = self._answers.get(term)
        if hit is not None:
            self.stats.cache_hits += 1
            return hit
        # a term without inputs (x - x = 0) tells nothing about the target: accept it
        found = self._index.class_of(term) is not None or not _has_var(term)
        self._answers[term] = found
        self.stats.accepted += found
        return found

    def equals_output(self, term: Term, index: int) -> bool:
        """Whether ``term`` is in the e-class of target output ``index``.

        A necessary-condition filter before the finite-field check: False means the axioms do
        not show the two equal (a truly equal term is answered False only through identities
        outside the axioms and schedule). True is *not* proof: the abstraction identifies things
        arithmetic does not (tile layouts, max extents, the online-softmax rescale), so a True
        must still be verified.
        """
        if not 0 <= index < len(self._outputs):
            raise SearchError(f"target has {len(self._outputs)} outputs, not index {index}")
        cls = self._index.class_of(term)
        return cls is not None and cls == self._outputs[index]

    def class_of(self, term: Term) -> int | None:
        """The e-class id of ``term`` in the saturated target e-graph, or None."""
        return self._index.class_of(term)

    def check_with_egglog(self, term: Term) -> bool:
        """``contains`` asked of egglog itself (slow; for cross-checking the frozen table)."""
        return self._index.check_with_egglog(term)


__all__ = [
    "LOWERING", "OracleStats", "SaturationBudget", "SubexprOracle", "Term", "abstract_op",
    "add", "all_terms", "block_output_terms", "block_terms", "concat", "const", "exp", "fn", "inv",
    "kernel_terms", "maximum", "mean", "mul", "neg", "output_terms", "rmax", "sigmoid",
    "sqrt", "sum_", "thread_term", "var",
]  # fmt: skip
