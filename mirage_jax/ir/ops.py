"""The one operator vocabulary shared by kernel, block and thread graphs.

Each ``Op`` has an ``OpInfo``: its text name, arity, the graph levels where it may appear and the
attributes it takes (with defaults). Shape rules live in ``ir.shapes``; semantics live in the
interpreters (``mirage_jax.interpret``), which are the living definition of every op.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any


class Level(enum.Enum):
    KERNEL = "kernel"
    BLOCK = "block"
    THREAD = "thread"


K, B, T = Level.KERNEL, Level.BLOCK, Level.THREAD

# Sentinel for "no dimension" in imap / omap / forloop_dim / accumulator dim, as in Mirage.
NONE_DIM = -1


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
    RELU = "relu"
    NEG = "neg"
    RECIPROCAL = "reciprocal"
    MUL_SCALAR = "mul_scalar"
    ADD_SCALAR = "add_scalar"
    POW_SCALAR = "pow_scalar"
    # elementwise binary, numpy broadcasting over equal ranks (each dim equal or 1)
    ADD = "add"
    SUB = "sub"
    MUL = "mul"
    DIV = "div"
    MAX = "max"
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


@dataclass(frozen=True)
class OpInfo:
    arity: int | None  # None: variadic
    levels: frozenset[Level]
    attrs: dict[str, Any] = field(default_factory=dict)  # name -> default (REQUIRED if none)
    outputs: int | None = 1  # None: decided by the attributes (graph_def)


REQUIRED = object()

UNARY = frozenset(
    {
        Op.EXP, Op.LOG, Op.SQUARE, Op.SQRT, Op.RSQRT, Op.SIGMOID, Op.SILU, Op.GELU, Op.TANH,
        Op.ERF, Op.RELU, Op.NEG, Op.RECIPROCAL, Op.MUL_SCALAR, Op.ADD_SCALAR, Op.POW_SCALAR,
    }
)  # fmt: skip
SCALAR_UNARY = frozenset({Op.MUL_SCALAR, Op.ADD_SCALAR, Op.POW_SCALAR})
BINARY = frozenset({Op.ADD, Op.SUB, Op.MUL, Op.DIV, Op.MAX})
ELEMENTWISE = UNARY | BINARY
REDUCTIONS = frozenset({Op.REDUCE_SUM, Op.REDUCE_MAX, Op.REDUCE_MEAN, Op.REDUCE_RMS})
ACCUMULATORS = frozenset({Op.ACC_SUM, Op.ACC_MEAN, Op.ACC_MAX, Op.ACC_RMS, Op.ACC_RESCALE_SUM})
LAYOUT = frozenset({Op.RESHAPE, Op.TRANSPOSE, Op.CAST})
COMPUTE = ELEMENTWISE | REDUCTIONS | frozenset({Op.MATMUL, Op.CONCAT})


def _info() -> dict[Op, OpInfo]:
    kb, kbt = frozenset({K, B}), frozenset({K, B, T})
    table: dict[Op, OpInfo] = {
        Op.INPUT: OpInfo(0, frozenset({K, T})),
        Op.OUTPUT: OpInfo(1, frozenset({K, T}), outputs=0),
        Op.GRAPH_DEF: OpInfo(None, frozenset({K}), {"block": REQUIRED}, outputs=None),
        Op.INPUT_ITER: OpInfo(
            0, frozenset({B}), {"arg": REQUIRED, "imap": REQUIRED, "fdim": NONE_DIM}
        ),
        Op.OUTPUT_SAVER: OpInfo(
            1, frozenset({B}), {"omap": REQUIRED, "fdim": NONE_DIM}, outputs=0
        ),
        Op.THREAD: OpInfo(None, frozenset({B}), {"graph": REQUIRED}),
        Op.RESHAPE: OpInfo(1, frozenset({K}), {"shape": REQUIRED}),
        Op.TRANSPOSE: OpInfo(1, frozenset({K}), {"perm": REQUIRED}),
        Op.CAST: OpInfo(1, kbt, {"dtype": REQUIRED}),
        Op.MATMUL: OpInfo(2, kb),
        Op.CONCAT: OpInfo(2, kb, {"dim": REQUIRED}),
    }
    for op in UNARY - SCALAR_UNARY:
        table[op] = OpInfo(1, kbt)
    table[Op.MUL_SCALAR] = OpInfo(1, kbt, {"scalar": REQUIRED})
    table[Op.ADD_SCALAR] = OpInfo(1, kbt, {"scalar": REQUIRED})
    table[Op.POW_SCALAR] = OpInfo(1, kbt, {"exponent": REQUIRED})
    for op in BINARY:
        table[op] = OpInfo(2, kbt)
    for op in REDUCTIONS:
        table[op] = OpInfo(1, kb, {"dim": REQUIRED})
    for op in ACCUMULATORS - {Op.ACC_RESCALE_SUM}:
        table[op] = OpInfo(1, frozenset({B}), {"dim": NONE_DIM})
    table[Op.ACC_RESCALE_SUM] = OpInfo(2, frozenset({B}))
    missing = set(Op) - set(table)
    if missing:  # pragma: no cover - guards the table against a new Op without info
        raise RuntimeError(f"ops without OpInfo: {missing}")
    return table


OP_INFO: dict[Op, OpInfo] = _info()
OP_BY_NAME: dict[str, Op] = {op.value: op for op in Op}
