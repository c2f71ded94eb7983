"""The μGraph IR: checked construction, error messages, canonical text round trip, fingerprint."""

from __future__ import annotations

import subprocess
import sys

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mirage_jax.errors import GraphError, ParseError
from mirage_jax.ir import (
    BINARY,
    F32,
    F64,
    REDUCTIONS,
    SCALAR_UNARY,
    UNARY,
    BlockBuilder,
    KernelBuilder,
    Op,
    Phase,
    TensorType,
    ThreadBuilder,
    parse,
    to_text,
)


def T(*shape: int, dtype=F32) -> TensorType:
    return TensorType(shape, dtype)


def rms_matmul_block(grid=(64, 1, 1), loop=64):
    bb = BlockBuilder(grid, loop, (T(16, 4096), T(4096, 6144)))
    x = bb.input_iter(0, (-1, -1, -1), 1)
    w = bb.input_iter(1, (1, -1, -1), 0)
    m = bb.matmul(x, w)
    r = bb.apply(Op.ACC_RMS, x, dim=1)
    s = bb.apply(Op.ACC_SUM, m)
    bb.output_saver(bb.apply(Op.DIV, s, r), (1, -1, -1))
    return bb.build()


GOLDEN_RMS = """\
kernel {
  %0 = input : f32[16,4096]
  %1 = input : f32[4096,6144]
  %2 = graph_def(%0, %1) : f32[16,6144] block grid=(64,1,1) forloop=64 args=(f32[16,4096], f32[4096,6144]) {
    %0 = input_iter[arg=0, fdim=1, imap=(-1,-1,-1)] : f32[16,64]
    %1 = input_iter[arg=1, fdim=0, imap=(1,-1,-1)] : f32[64,96]
    %2 = matmul(%0, %1) : f32[16,96]
    %3 = acc_rms[dim=1](%0) : f32[16,1]
    %4 = acc_sum[dim=-1](%2) : f32[16,96]
    %5 = div(%4, %3) : f32[16,96]
    output_saver[fdim=-1, omap=(1,-1,-1)](%5)
  }
  output(%2)
}
"""


def rms_kernel():
    kb = KernelBuilder()
    x, w = kb.input(T(16, 4096)), kb.input(T(4096, 6144))
    (y,) = kb.graph_def(rms_matmul_block(), x, w)
    kb.output(y)
    return kb.build()


def test_golden_text_of_fused_rmsnorm_matmul():
    g = rms_kernel()
    assert to_text(g) == GOLDEN_RMS
    assert parse(GOLDEN_RMS) == g
    assert g.output_types == (T(16, 6144),)
    assert g.block_graphs[0].num_blocks == 64


def test_types_are_inferred_and_frozen():
    kb = KernelBuilder()
    a, b = kb.input(T(2, 3, 5)), kb.input(T(2, 5, 7))
    m = kb.matmul(a, b)
    assert m.type == T(2, 3, 7)
    r = kb.apply(Op.REDUCE_SUM, m, dim=1)
    assert r.type == T(2, 1, 7)
    s = kb.apply(Op.ADD, m, r)  # broadcasting over the size-1 dim
    assert s.type == T(2, 3, 7)
    kb.output(s)
    g = kb.build()
    with pytest.raises(AttributeError):
        g.nodes = ()  # type: ignore[misc]
    assert hash(g) == hash(parse(to_text(g)))


def test_phases_of_a_block_graph():
    blk = rms_matmul_block()
    phases = blk.phases()
    assert phases[0] is Phase.BODY and phases[2] is Phase.BODY
    assert phases[3] is Phase.EPILOGUE and phases[5] is Phase.EPILOGUE


@pytest.mark.parametrize(
    "build, message",
    [
        (lambda: BlockBuilder((7, 1, 1), 1, (T(16, 4096),)).input_iter(0, (1, -1, -1)),
         "input 0 f32[16,4096]: dim 1 (size 4096) does not divide by grid axis x = 7"),
        (lambda: BlockBuilder((1, 1, 1), 3, (T(16, 4096),)).input_iter(0, (-1, -1, -1), 1),
         "does not divide by forloop_range=3"),
        (lambda: BlockBuilder((2, 2, 1), 1, (T(16, 16),)).input_iter(0, (0, 0, -1)),
         "maps two grid axes to one tensor dim"),
        (lambda: _matmul(T(4, 5), T(6, 7)), "contracting dims differ"),
        (lambda: _matmul(T(4, 5), T(5, 7, dtype=F64)), "operand dtypes differ"),
        (lambda: _binary(T(4, 5), T(4, 6)), "dim 1 cannot broadcast"),
        (lambda: _binary(T(4, 5), T(5)), "operand ranks differ"),
        (lambda: _unsaved_omap(), "is not mapped by omap"),
        (lambda: _body_saver_without_fdim(), "each iteration would overwrite the last"),
        (lambda: _mix_body_epilogue(), "mixes a loop-body value with a post-loop"),
        (lambda: KernelBuilder().apply(Op.ACC_SUM), "acc_sum is not allowed in a kernel graph"),
        (lambda: _reduce(T(3, 4), 2), "dim=2 is out of range"),
        (lambda: _reduce_missing_dim(), "missing attribute 'dim'"),
    ],
)
def test_errors_name_the_cause(build, message):
    with pytest.raises(GraphError) as info:
        build()
    assert message in str(info.value)


def _matmul(a, b):
    kb = KernelBuilder()
    return kb.matmul(kb.input(a), kb.input(b))


def _binary(a, b):
    kb = KernelBuilder()
    return kb.apply(Op.ADD, kb.input(a), kb.input(b))


def _reduce(a, dim):
    kb = KernelBuilder()
    return kb.apply(Op.REDUCE_SUM, kb.input(a), dim=dim)


def _reduce_missing_dim():
    kb = KernelBuilder()
    return kb.apply(Op.REDUCE_SUM, kb.input(T(3)))


def _unsaved_omap():
    bb = BlockBuilder((4, 1, 1), 1, (T(16, 16),))
    x = bb.input_iter(0, (0, -1, -1))
    bb.output_saver(x, (-1, -1, -1))


def _body_saver_without_fdim():
    bb = BlockBuilder((1, 1, 1), 4, (T(16, 16),))
    x = bb.input_iter(0, (-1, -1, -1), 1)
    bb.output_saver(x, (-1, -1, -1))


def _mix_body_epilogue():
    bb = BlockBuilder((1, 1, 1), 4, (T(16, 16),))
    x = bb.input_iter(0, (-1, -1, -1), 1)
    s = bb.apply(Op.ACC_SUM, x)
    bb.apply(Op.ADD, x, s)


def test_parse_errors_are_clear():
    with pytest.raises(ParseError, match="unknown op 'frobnicate'"):
        parse("kernel {\n  %0 = input : f32[2]\n  %1 = frobnicate(%0) : f32[2]\n}\n")
    with pytest.raises(ParseError, match="used before it is defined"):
        parse("kernel {\n  %1 = exp(%0) : f32[2]\n}\n")
    with pytest.raises(GraphError, match="differ from the inferred"):
        parse("kernel {\n  %0 = input : f32[2]\n  %1 = exp(%0) : f32[3]\n  output(%1)\n}\n")


def test_thread_graph_holds_only_elementwise_ops():
    tb = ThreadBuilder()
    a = tb.input(T(4, 8))
    tb.output(tb.apply(Op.EXP, tb.apply(Op.MUL_SCALAR, a, scalar=0.5)))
    tg = tb.build()
    assert tg.output_types == (T(4, 8),)
    tb2 = ThreadBuilder()
    with pytest.raises(GraphError, match="not allowed in a thread graph"):
        tb2.apply(Op.MATMUL, tb2.input(T(2, 2)), tb2.input(T(2, 2)))


def test_fingerprint_is_stable_across_processes():
    code = (
        "import sys; sys.path.insert(0, %r); from test_ir import rms_kernel; "
        "print(rms_kernel().fingerprint())" % str(__import__("pathlib").Path(__file__).parent)
    )
    other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert other.stdout.strip() == rms_kernel().fingerprint()
    kb = KernelBuilder()
    x, w = kb.input(T(16, 4096)), kb.input(T(4096, 6144))
    kb.output(kb.graph_def(rms_matmul_block(grid=(32, 1, 1)), x, w)[0])
    assert kb.build().fingerprint() != rms_kernel().fingerprint()


# ------------------------------------------------------------------------ round-trip property

_UNARY = sorted(UNARY - SCALAR_UNARY, key=lambda o: o.value)
_SCALAR = sorted(SCALAR_UNARY, key=lambda o: o.value)
_BINARY = sorted(BINARY, key=lambda o: o.value)
_REDUCE = sorted(REDUCTIONS, key=lambda o: o.value)
_ACCS = [Op.ACC_SUM, Op.ACC_MEAN, Op.ACC_MAX, Op.ACC_RMS]

_floats = st.floats(allow_nan=False, allow_infinity=False, width=64)


@st.composite
def kernel_graphs(draw):
    kb = KernelBuilder()
    rows, cols = draw(st.sampled_from([2, 4, 6])), draw(st.sampled_from([4, 8]))
    values = [kb.input(T(rows, cols)) for _ in range(draw(st.integers(1, 3)))]
    for _ in range(draw(st.integers(0, 6))):
        kind = draw(st.sampled_from(["unary", "scalar", "binary", "reduce", "block"]))
        x = draw(st.sampled_from(values))
        if kind == "unary":
            values.append(kb.apply(draw(st.sampled_from(_UNARY)), x))
        elif kind == "scalar":
            op = draw(st.sampled_from(_SCALAR))
            attr = op.info.scalar_attr
            values.append(kb.apply(op, x, **{attr: draw(_floats)}))
        elif kind == "binary":
            y = draw(st.sampled_from([v for v in values if v.type.rank == x.type.rank]))
            try:
                values.append(kb.apply(draw(st.sampled_from(_BINARY)), x, y))
            except GraphError:
                pass
        elif kind == "reduce":
            dim = draw(st.integers(0, x.type.rank - 1))
            values.append(kb.apply(draw(st.sampled_from(_REDUCE)), x, dim=dim))
        else:
            values.extend(kb.graph_def(draw(block_graphs(x.type)), x))
    kb.output(values[-1])
    return kb.build()


@st.composite
def block_graphs(draw, arg: TensorType):
    rows, cols = arg.shape
    gx = draw(st.sampled_from([d for d in (1, 2) if rows % d == 0]))
    loop = draw(st.sampled_from([d for d in (1, 2, 4) if cols % d == 0]))
    bb = BlockBuilder((gx, 1, 1), loop, (arg,))
    x = bb.input_iter(0, (0, -1, -1), 1 if loop > 1 else draw(st.sampled_from([-1, 1])))
    y = bb.apply(draw(st.sampled_from(_UNARY)), x)
    acc = bb.apply(draw(st.sampled_from(_ACCS)), y, dim=draw(st.sampled_from([-1, 1])))
    bb.output_saver(bb.apply(Op.MUL_SCALAR, acc, scalar=draw(_floats)), (0, -1, -1))
    return bb.build()


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(kernel_graphs())
def test_text_round_trip_is_exact(graph):
    text = to_text(graph)
    again = parse(text)
    assert again == graph
    assert to_text(again) == text
    assert again.fingerprint() == graph.fingerprint()
