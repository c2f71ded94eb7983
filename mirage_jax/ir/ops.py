"""The one operator vocabulary shared by kernel, block and thread graphs, and every fact about
each op.

Each ``Op`` has an ``OpInfo`` (``OP_INFO``, or ``op.info``): its group, text name, arity, the
graph levels where it may appear and the attributes it takes (with defaults), and the facts the
layers above read instead of keeping their own op lists - the runtime functor both emitters
instantiate, what the cost models charge per element, the finite-field degree rule, the
abstract-expression formula, which accumulators carry it across a for-loop. The op groups
(``UNARY``, ``BINARY``, ``REDUCTIONS``, ...) are derived from the table. Adding an op means one
row here plus its templates in each backend; ``tests/test_ops.py`` names any fact or table
entry a new op lacks. Shape rules live in ``ir.shapes``; semantics live in the interpreters
(``mirage_jax.interpret``), which are the living definition of every op.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field
from typing import Any


class Level(enum.Enum):
    KERNEL = "kernel"
    BLOCK = "block"
    THREAD = "thread"


K, B, T = Level.KERNEL, Level.BLOCK, Level.THREAD

# Sentinel for "no dimension" in imap / omap / forloop_dim / accumulator dim, as in Mirage.
NONE_DIM = -1

# gelu's tanh-approximation constants, as jax.nn.gelu(approximate=True) uses them
GELU_C = math.sqrt(2.0 / math.pi)
GELU_K = 0.044715


class Op(enum.Enum):
    # structure
    INPUT = "input"
    OUTPUT = "output"
    GRAPH_DEF = "graph_def"
    INPUT_ITER = "input_iter"
    OUTPUT_SAVER = "output_saver"
    THREAD = "thread"
    # layout (kernel level only; row-major reshape is free, transpose copies)
    RESHAPE = "reshape"
    TRANSPOSE = "transpose"
    SLICE = "slice"  # size elements from start along dim (split halves, QKV): copies
    CAST = "cast"
    # contraction
    MATMUL = "matmul"
    # elementwise unary
    EXP = "exp"
    LOG = "log"
    SQUARE = "square"
    SQRT = "sqrt"
    RSQRT = "rsqrt"
    SIGMOID = "sigmoid"
    SILU = "silu"
    GELU = "gelu"  # tanh approximation, as jax.nn.gelu(approximate=True)
    TANH = "tanh"
    ERF = "erf"
    ERFC = "erfc"  # not 1 - erf: that is 0 where erfc is tiny (and its sign matters)
    ERF_INV = "erf_inv"  # on (-1, 1); +-1 -> +-inf, NaN beyond
    SIN = "sin"
    COS = "cos"
    SIGN = "sign"  # -1, +-0 (its own sign), 1; NaN stays NaN
    RELU = "relu"
    NEG = "neg"
    RECIPROCAL = "reciprocal"
    MUL_SCALAR = "mul_scalar"
    ADD_SCALAR = "add_scalar"
    POW_SCALAR = "pow_scalar"
    FINITE_OR = "finite_or"  # x where finite, else the fill (logsumexp's guard of its max)
    # elementwise binary, numpy broadcasting over equal ranks (each dim equal or 1)
    ADD = "add"
    SUB = "sub"
    MUL = "mul"
    DIV = "div"
    MAX = "max"
    REM = "rem"  # x - y * trunc(x / y), exactly (C's fmod: the sign of x), as XLA's rem
    # where(m, x): x where the bool mask m holds, else the scalar fill (jnp.where with a
    # constant; masks of attention); where_not: x where m does not hold
    WHERE = "where"
    WHERE_NOT = "where_not"
    # reductions over one dim, rank kept (the dim becomes 1)
    REDUCE_SUM = "reduce_sum"
    REDUCE_MAX = "reduce_max"
    REDUCE_MEAN = "reduce_mean"
    REDUCE_RMS = "reduce_rms"  # sqrt(mean(x*x)) over dim
    CONCAT = "concat"
    # for-loop accumulators (block level); optional dim also reduces inside the tile
    ACC_SUM = "acc_sum"
    ACC_MEAN = "acc_mean"
    ACC_MAX = "acc_max"
    ACC_RMS = "acc_rms"
    # online softmax: sum_i exp(m_i - M) * x_i with M = max_i m_i (pair with ACC_MAX(m) for M)
    ACC_RESCALE_SUM = "acc_rescale_sum"

    @property
    def info(self) -> OpInfo:
        return OP_INFO[self]

    def __repr__(self) -> str:
        return f"Op.{self.name}"


class Group(enum.Enum):
    """What kind of op it is; the op sets below (``UNARY``, ...) are unions of groups."""

    STRUCTURE = "structure"  # graph plumbing: inputs, outputs, nested graphs
    LAYOUT = "layout"
    MATMUL = "matmul"
    CONCAT = "concat"
    UNARY = "unary"
    BINARY = "binary"
    REDUCTION = "reduction"
    ACCUMULATOR = "accumulator"


@dataclass(frozen=True, kw_only=True)
class OpInfo:
    """Every fact about one op. Facts whose default is empty are required where
    ``missing_facts`` says (tests/test_ops.py checks the table)."""

    group: Group
    arity: int | None  # None: variadic
    levels: frozenset[Level]
    attrs: dict[str, Any] = field(default_factory=dict)  # name -> default (REQUIRED if none)
    outputs: int | None = 1  # None: decided by the attributes (graph_def)
    # elementwise ops: the functor both runtimes define as ``mj::op::<functor>``
    functor: str = ""
    # unary ops taking a scalar: the attribute that holds it (makes the op SCALAR_UNARY)
    scalar_attr: str = ""
    # binary ops: op(a, b) == op(b, a)
    commutative: bool = False
    # binary ops: op(x, x) is x or a constant (x - x, x / x, max(x, x), rem(x, x)): never
    # searched
    trivial_on_itself: bool = False
    # the CPU cost model: vector element operations per element (a multiply is 1)
    element_flops: float = 1.0
    # the GPU cost model: priced as a transcendental (several FMAs) per element
    transcendental: bool = False
    # the finite-field degree bound (search.equivalence): the rule for the result's degree,
    # and whether the field evaluates it as exp of its operand (exp(a) = omega^a), whose degree
    # then bounds an exponent checked mod q
    degree: str = ""
    exponentiates: bool = False
    # the abstract expression of its result, a formula search.abstract interprets: operands
    # x, y; numbers; the abstract constructors add, mul, inv, exp, sqrt, max, neg, sigmoid,
    # concat; fn[name] (uninterpreted); sum, mean, rmax over an extent [k | dim | loop | a*b];
    # const[attr], pow[attr], var[attr] (attribute values). "" for structural ops that have no
    # value of their own or expand a nested graph.
    abstract: str = ""
    # the block accumulators that carry this op's reduction across a for-loop
    carried_by: tuple[Op, ...] = ()


REQUIRED = object()

_GELU = f"mul(0.5, x, add(1, fn[tanh](mul({GELU_C!r}, add(x, mul({GELU_K!r}, x, x, x))))))"


def _info() -> dict[Op, OpInfo]:
    kb, kbt, b = frozenset({K, B}), frozenset({K, B, T}), frozenset({B})
    G = Group

    def structure(arity: int | None, levels: frozenset[Level], **kw: Any) -> OpInfo:
        return OpInfo(group=G.STRUCTURE, arity=arity, levels=levels, **kw)

    def layout(attr: str, levels: frozenset[Level]) -> OpInfo:
        return OpInfo(group=G.LAYOUT, arity=1, levels=levels, attrs={attr: REQUIRED},
                      degree="same", abstract="x")  # fmt: skip

    def unary(functor: str, abstract: str, degree: str, **kw: Any) -> OpInfo:
        return OpInfo(group=G.UNARY, arity=1, levels=kbt, functor=functor, abstract=abstract,
                      degree=degree, **kw)  # fmt: skip

    def scalar(functor: str, attr: str, abstract: str, degree: str, **kw: Any) -> OpInfo:
        return unary(functor, abstract, degree, attrs={attr: REQUIRED}, scalar_attr=attr, **kw)

    def binary(functor: str, abstract: str, degree: str, **kw: Any) -> OpInfo:
        return OpInfo(group=G.BINARY, arity=2, levels=kbt, functor=functor, abstract=abstract,
                      degree=degree, **kw)  # fmt: skip

    def reduction(abstract: str, degree: str, carried_by: tuple[Op, ...]) -> OpInfo:
        return OpInfo(group=G.REDUCTION, arity=1, levels=kb, attrs={"dim": REQUIRED},
                      abstract=abstract, degree=degree, carried_by=carried_by)  # fmt: skip

    def accumulator(abstract: str, degree: str) -> OpInfo:
        return OpInfo(group=G.ACCUMULATOR, arity=1, levels=b, attrs={"dim": NONE_DIM},
                      abstract=abstract, degree=degree)  # fmt: skip

    # element_flops: measured with the runtime's float32 kernels (math.h) on 16 KiB rows in L1
    # on the 2-core Zen 5, against a multiply at 53 G elements/s per core: exp 3.9, tanh 2.5,
    # sqrt-then-divide 9, divide 24; sin and cos 3.5 where exp ran 4.0 in the same loop. The
    # others are composed from those (sigmoid and silu: an exp and a divide; log like exp; erf
    # and gelu like tanh, erfc like erf and exp; pow: a log and an exp). erf_inv (a log, a sqrt,
    # two polynomials) ran 3.3x exp's time and rem (C's fmod lane by lane) about 30x.
    return {
        Op.INPUT: structure(0, frozenset({K, T}), abstract="var[index]"),
        Op.OUTPUT: structure(1, frozenset({K, T}), outputs=0),
        Op.GRAPH_DEF: structure(None, frozenset({K}), attrs={"block": REQUIRED}, outputs=None),
        Op.INPUT_ITER: structure(0, b, attrs={"arg": REQUIRED, "imap": REQUIRED,
                                              "fdim": NONE_DIM}, abstract="x"),
        Op.OUTPUT_SAVER: structure(1, b, attrs={"omap": REQUIRED, "fdim": NONE_DIM}, outputs=0),
        Op.THREAD: structure(None, b, attrs={"graph": REQUIRED}),
        Op.RESHAPE: layout("shape", frozenset({K})),
        Op.TRANSPOSE: layout("perm", frozenset({K})),
        # a slice is a new value to the abstraction: slices of one tensor differ
        Op.SLICE: OpInfo(group=G.LAYOUT, arity=1, levels=frozenset({K}),
                         attrs={"dim": REQUIRED, "start": REQUIRED, "size": REQUIRED},
                         degree="same", abstract="fn[slice](x)"),
        Op.CAST: layout("dtype", kbt),
        Op.MATMUL: OpInfo(group=G.MATMUL, arity=2, levels=kb, degree="product",
                          abstract="sum[k](mul(x, y))", carried_by=(Op.ACC_SUM,)),
        Op.EXP: unary("Exp", "exp(x)", "fresh", element_flops=8.0, transcendental=True,
                      exponentiates=True),
        Op.LOG: unary("Log", "fn[log](x)", "fresh", element_flops=8.0, transcendental=True),
        Op.SQUARE: unary("Square", "mul(x, x)", "square"),
        Op.SQRT: unary("Sqrt", "sqrt(x)", "fresh", element_flops=3.0, transcendental=True),
        Op.RSQRT: unary("Rsqrt", "inv(sqrt(x))", "inverse_fresh", element_flops=3.0,
                        transcendental=True),
        Op.SIGMOID: unary("Sigmoid", "sigmoid(x)", "inverse_fresh", element_flops=9.0,
                          transcendental=True, exponentiates=True),
        Op.SILU: unary("Silu", "mul(x, sigmoid(x))", "times_inverse_fresh", element_flops=9.0,
                       transcendental=True, exponentiates=True),
        Op.GELU: unary("Gelu", _GELU, "times_fresh_ratio", element_flops=13.0,
                       transcendental=True, exponentiates=True),
        Op.TANH: unary("Tanh", "fn[tanh](x)", "fresh_ratio", element_flops=12.0,
                       transcendental=True, exponentiates=True),
        Op.ERF: unary("Erf", "fn[erf](x)", "fresh", element_flops=12.0, transcendental=True),
        Op.ERFC: unary("Erfc", "fn[erfc](x)", "fresh", element_flops=20.0, transcendental=True),
        Op.ERF_INV: unary("ErfInv", "fn[erf_inv](x)", "fresh", element_flops=26.0,
                          transcendental=True),
        Op.SIN: unary("Sin", "fn[sin](x)", "fresh", element_flops=9.0, transcendental=True),
        Op.COS: unary("Cos", "fn[cos](x)", "fresh", element_flops=9.0, transcendental=True),
        Op.SIGN: unary("Sign", "fn[sign](x)", "fresh"),
        Op.RELU: unary("Relu", "max(x, 0)", "fresh"),
        Op.NEG: unary("Neg", "neg(x)", "same"),
        Op.RECIPROCAL: unary("Reciprocal", "inv(x)", "reciprocal", element_flops=1.25,
                             transcendental=True),
        Op.MUL_SCALAR: scalar("MulScalar", "scalar", "mul(x, const[scalar])", "same"),
        Op.ADD_SCALAR: scalar("AddScalar", "scalar", "add(x, const[scalar])", "shift"),
        Op.POW_SCALAR: scalar("PowScalar", "exponent", "pow[exponent](x)", "power",
                              element_flops=16.0, transcendental=True),
        # to the abstraction a new value of x whatever the fill (coarser, so pruning stays sound)
        Op.FINITE_OR: scalar("FiniteOr", "fill", "fn[finite_or](x)", "fresh"),
        Op.ADD: binary("Add", "add(x, y)", "sum", commutative=True),
        Op.SUB: binary("Sub", "add(x, neg(y))", "sum", trivial_on_itself=True),
        Op.MUL: binary("Mul", "mul(x, y)", "product", commutative=True),
        Op.DIV: binary("Div", "mul(x, inv(y))", "quotient", element_flops=1.25,
                       transcendental=True, trivial_on_itself=True),
        Op.MAX: binary("Max", "max(x, y)", "fresh", commutative=True, trivial_on_itself=True),
        # trunc is a new value to the abstraction and the field: the rest is exact algebra
        Op.REM: binary("Rem", "add(x, neg(mul(y, fn[trunc](mul(x, inv(y))))))", "remainder",
                       element_flops=250.0, transcendental=True, trivial_on_itself=True),
        # in the field, m y + (1 - m) fill over a 0/1 mask; to the abstraction a new value of y
        Op.WHERE: binary("Where", "fn[where](y)", "product", attrs={"fill": REQUIRED},
                         scalar_attr="fill"),
        Op.WHERE_NOT: binary("WhereNot", "fn[where_not](y)", "product",
                             attrs={"fill": REQUIRED}, scalar_attr="fill"),
        Op.REDUCE_SUM: reduction("sum[dim](x)", "same", (Op.ACC_SUM,)),
        Op.REDUCE_MAX: reduction("rmax[dim](x)", "fresh", (Op.ACC_MAX, Op.ACC_RESCALE_SUM)),
        Op.REDUCE_MEAN: reduction("mean[dim](x)", "same", (Op.ACC_MEAN,)),
        Op.REDUCE_RMS: reduction("sqrt(mean[dim](mul(x, x)))", "fresh", (Op.ACC_RMS,)),
        Op.CONCAT: OpInfo(group=G.CONCAT, arity=2, levels=kb, attrs={"dim": REQUIRED},
                          degree="either", abstract="concat(x, y)"),
        Op.ACC_SUM: accumulator("sum[loop*dim](x)", "same"),
        Op.ACC_MEAN: accumulator("mean[loop*dim](x)", "same"),
        Op.ACC_MAX: accumulator("rmax[loop*dim](x)", "fresh"),
        Op.ACC_RMS: accumulator("sqrt(mean[loop*dim](mul(x, x)))", "fresh"),
        # the rescale factor exp(m_i - M) is a max-shift the abstraction does not see
        Op.ACC_RESCALE_SUM: OpInfo(group=G.ACCUMULATOR, arity=2, levels=b, degree="rescale",
                                   abstract="sum[loop](x)"),
    }  # fmt: skip


def missing_facts(op: Op) -> tuple[str, ...]:
    """The facts ``op``'s OpInfo must state but leaves empty (the group says which)."""
    info = OP_INFO.get(op)
    if info is None:
        return ("OpInfo",)
    missing = []
    if info.group in (Group.UNARY, Group.BINARY) and not info.functor:
        missing.append("functor")
    if info.group is not Group.STRUCTURE:
        missing += [name for name in ("degree", "abstract") if not getattr(info, name)]
    return tuple(missing)


OP_INFO: dict[Op, OpInfo] = _info()
OP_BY_NAME: dict[str, Op] = {op.value: op for op in Op}


def ops_in(*groups: Group) -> frozenset[Op]:
    """The ops of the given groups."""
    return frozenset(op for op, info in OP_INFO.items() if info.group in groups)


STRUCTURE = ops_in(Group.STRUCTURE)
UNARY = ops_in(Group.UNARY)
SCALAR_UNARY = frozenset(op for op in UNARY if OP_INFO[op].scalar_attr)
BINARY = ops_in(Group.BINARY)
MASKED = frozenset({Op.WHERE, Op.WHERE_NOT})  # binary ops whose first operand is a bool mask
ELEMENTWISE = UNARY | BINARY
REDUCTIONS = ops_in(Group.REDUCTION)
ACCUMULATORS = ops_in(Group.ACCUMULATOR)
LAYOUT = ops_in(Group.LAYOUT)
COMPUTE = ELEMENTWISE | REDUCTIONS | ops_in(Group.MATMUL, Group.CONCAT)

_MISSING = set(Op) - set(OP_INFO)
if _MISSING:  # pragma: no cover - guards the table against a new Op without info
    raise RuntimeError(f"ops without OpInfo: {_MISSING}")
