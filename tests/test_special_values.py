"""Special values with XLA's semantics, rule by rule, on the emitted C++ and on emulated CUDA.

Each rule is a small jax function over inputs full of special values (NaN, +-inf, +-0, values
whose exp overflows or underflows, huge and tiny ones), placed so that every one lands both in
SIMD lanes and in scalar tails (rows of 37). ``jax.jit`` of the function is the answer; the
function under ``@optimize`` (every region forced to a custom call: C++ on this host) and its
traced regions run as generated CUDA on emulated thread blocks must give NaN where it does,
the same infinities, the same signs of zero, and finite values within float32 rounding.

All rules are planned as one function (one C++ build, one CUDA build per module); each test
checks its own rule's outputs. The online-softmax accumulators are checked on hand-built
FlashAttention μGraphs with masked scores: a fully masked tile of a row that has unmasked
scores must not turn the row into NaN (XLA's softmax of that row is finite), a fully masked
row is NaN as in XLA; the float reference interpreter, the accumulators' definition, agrees.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import mirage_jax as mj
from mirage_jax.backend.cpu.backend import cpu_backend
from mirage_jax.backend.cuda.build import find_nvcc
from mirage_jax.interpret import evaluate
from mirage_jax.ir import F32, BlockBuilder, KernelBuilder, KernelGraph, Op, TensorType

N = -1  # "not mapped" in imap / omap / fdim
NZ = -0.0
COLS = 37  # one AVX-512 vector of 16, two of 8, and a scalar tail, whatever the ISA
# No denormals: XLA on CPU flushes them to zero (so does a kernel it calls), the emulation's
# host threads do not; that is a floating-point mode, not a special value.
SPECIALS = np.array([np.nan, np.inf, -np.inf, 0.0, NZ, 1.0, -1.0, 2.5, 89.0, -104.0, 1e30,
                     -1e30, 1e-30, -3.0, 0.5, 1e-3], np.float32)  # fmt: skip


def _grid(step: int, shift: int) -> np.ndarray:
    """Eight rows of 37 that cycle through the specials, each row shifted by 5, so every special
    sits in vector lanes and in the tail; a last row holds only -0.0 and +0.0."""
    k = np.arange(COLS)
    rows = [SPECIALS[(k * step + 5 * r + shift) % len(SPECIALS)] for r in range(8)]
    rows.append(np.where(k % 3 == 0, np.float32(0.0), np.float32(NZ)))
    return np.stack(rows).astype(np.float32)


# y pairs each x with many partners (its step differs)
X, Y = _grid(1, 0), _grid(3, 7)


# --- the rules: name -> function of (x, y) returning a tuple of arrays ----------------------


def _max_min(x, y):
    # 1 / the result shows its sign of zero as +-inf
    return (jnp.maximum(x, y), jnp.minimum(x, y), jnp.maximum(y, x), jax.nn.relu(x), jnp.abs(x),
            1.0 / jnp.minimum(x, 0.0), 1.0 / jnp.maximum(x, 0.0))  # fmt: skip


def _reductions(x, y):
    del y
    return (jnp.max(x, axis=1), jnp.min(x, axis=1), jnp.max(x, axis=0), jnp.min(x, axis=0),
            jnp.sum(x, axis=1), jnp.mean(x, axis=0))  # fmt: skip


def _exp_overflow(x, y):
    del y
    return jnp.exp(x), jax.nn.sigmoid(x), jnp.tanh(x), jax.lax.erf(x), jax.nn.silu(x)


def _division_by_zero(x, y):
    return x / y, 1.0 / x, -2.0 / x, x / 0.0, x / NZ


def _roots_and_logs(x, y):
    del y
    return jax.lax.rsqrt(x), jnp.sqrt(x), jnp.log(x), x ** 0.5, x ** -0.5, x ** 1.5, x ** -1.5


def _negative_zero(x, y):
    return -x, x * -1.0, 0.0 - x, x * y, x - x, x ** 3, x ** -2


def _products(x, y):
    return x @ y.T, jnp.einsum("ij,kj->ik", y, x)


def _softmax(x, y):
    del y
    return (jax.nn.softmax(x, axis=-1),)


RULES: dict[str, Callable[..., tuple[Any, ...]]] = {
    "max and min with NaN and signed zeros": _max_min,
    "max, min, sum and mean reductions with NaN and infinities": _reductions,
    "exp overflow and underflow; sigmoid, tanh, erf, silu at the extremes": _exp_overflow,
    "division by zero and by -0.0": _division_by_zero,
    "rsqrt and sqrt of +-0, log of 0, pow at -inf and -0": _roots_and_logs,
    "-0.0 through negation, products and integer powers": _negative_zero,
    "matmuls propagate NaN and infinities": _products,
    "softmax of rows with infinities": _softmax,
}


def _all_rules(x, y):
    return tuple(out for fn in RULES.values() for out in fn(x, y))


def _spans() -> dict[str, slice]:
    spans, at = {}, 0
    for name, fn in RULES.items():
        n = len(jax.eval_shape(fn, X, Y))
        spans[name], at = slice(at, at + n), at + n
    return spans


# --- running them ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory):
    mp = pytest.MonkeyPatch()
    mp.setenv("MIRAGE_JAX_CACHE_DIR", str(tmp_path_factory.mktemp("special_cache")))
    yield
    mp.undo()


@pytest.fixture(scope="module")
def outputs(cache) -> dict[str, list[np.ndarray]]:
    """jax.jit's, the C++ custom call's and emulated CUDA's outputs of every rule."""
    fast = mj.optimize(_all_rules, strategy="as_is", require_speedup=False, verify=False,
                       cache=False)  # fmt: skip
    got = {"xla": jax.jit(_all_rules)(X, Y), "cpu": fast(X, Y)}
    plan = fast.plan(X, Y)
    assert plan.regions and all(r.impl is not None for r in plan.regions), plan.report()
    if find_nvcc() is not None:
        from mirage_jax.backend.cuda.emulate import emulate

        def emulated(graph: KernelGraph) -> Callable[..., list[np.ndarray]]:
            return lambda *xs: emulate(graph, [np.asarray(v) for v in xs])

        program = mj.trace(_all_rules, X, Y)
        impls = {r.index: emulated(r.graph) for r in program.regions}
        got["cuda-emu"] = program.run(X, Y, region_impls=impls)
    return {k: [np.asarray(o) for o in v] for k, v in got.items()}


def assert_same_specials(got: np.ndarray, want: np.ndarray, what: str, atol: float = 1e-30
                         ) -> None:  # fmt: skip
    """NaN where ``want`` is NaN, the same infinities and signs of zero, finite values within
    float32 rounding (relative 1e-5, absolute ``atol``)."""
    assert got.shape == want.shape and got.dtype == want.dtype, what
    nan = np.isnan(want)
    where = np.argwhere(np.isnan(got) != nan)
    assert not where.size, f"{what}: NaN differs at {where[:4].tolist()}: got " \
        f"{got[tuple(where[0])]}, jax.jit {want[tuple(where[0])]}"
    inf = np.isinf(want) | np.isinf(got)
    where = np.argwhere(inf & (got != want))
    assert not where.size, f"{what}: infinities differ at {where[:4].tolist()}: got " \
        f"{got[tuple(where[0])]}, jax.jit {want[tuple(where[0])]}"
    zero = (want == 0) & (got == 0)
    where = np.argwhere(zero & (np.signbit(got) != np.signbit(want)))
    assert not where.size, f"{what}: sign of zero differs at {where[:4].tolist()}: got " \
        f"{got[tuple(where[0])]}, jax.jit {want[tuple(where[0])]}"
    finite = np.isfinite(want)
    np.testing.assert_allclose(got[finite], want[finite], rtol=1e-5, atol=atol, err_msg=what)


@pytest.mark.parametrize("target", ["cpu", "cuda-emu"])
@pytest.mark.parametrize("rule", list(RULES))
def test_rule(outputs, rule: str, target: str) -> None:
    if target not in outputs:
        pytest.skip("nvcc not found: CUDA emulation needs the CUDA toolkit's headers")
    span = _spans()[rule]
    for k, (got, want) in enumerate(zip(outputs[target][span], outputs["xla"][span])):
        assert_same_specials(got, want, f"{rule}, output {k}, {target}")


def test_inputs_cover_every_special_in_lanes_and_tails() -> None:
    for special in SPECIALS:
        hit = np.isnan(X) if np.isnan(special) else (X == special) & (
            np.signbit(X) == np.signbit(special))  # fmt: skip
        cols = np.argwhere(hit)[:, 1]
        assert (cols < 32).any() and (cols >= 32).any(), special


# --- online softmax on masked rows ---------------------------------------------------------

B, M, D, KEYS, ROW_BLOCKS, LOOP = 2, 8, 8, 32, 2, 4  # 4 tiles of 8 keys per row


def masked_flash_attention() -> KernelGraph:
    """FlashAttention with an additive mask: grid (batch, row blocks), a loop over key tiles,
    s = q@k + bias, per-tile max m and p = exp(s - m), acc_rescale_sum of p@v and of
    rowsum(p) against m, divided at the end."""
    types = (TensorType((B, M, D), F32), TensorType((B, D, KEYS), F32),
             TensorType((B, KEYS, D), F32), TensorType((B, M, KEYS), F32))  # fmt: skip
    bb = BlockBuilder((B, ROW_BLOCKS, 1), LOOP, types)
    q_t = bb.input_iter(0, (0, 1, N))
    k_t = bb.input_iter(1, (0, N, N), 2)
    v_t = bb.input_iter(2, (0, N, N), 1)
    bias_t = bb.input_iter(3, (0, 1, N), 2)
    s = bb.apply(Op.ADD, bb.matmul(q_t, k_t), bias_t)
    mx = bb.apply(Op.REDUCE_MAX, s, dim=2)
    p = bb.apply(Op.EXP, bb.apply(Op.SUB, s, mx))
    num = bb.apply(Op.ACC_RESCALE_SUM, bb.matmul(p, v_t), mx)
    den = bb.apply(Op.ACC_RESCALE_SUM, bb.apply(Op.REDUCE_SUM, p, dim=2), mx)
    bb.output_saver(bb.apply(Op.DIV, num, den), (0, 1, N))
    kb = KernelBuilder()
    ins = [kb.input(t) for t in types]
    kb.output(kb.graph_def(bb.build(), *ins)[0])
    return kb.build()


def _attention(q, k, v, bias):
    return jax.nn.softmax(q @ k + bias, axis=-1) @ v


def _masks() -> dict[str, np.ndarray]:
    """Additive masks over [M, KEYS]: -inf (or the most negative float) where masked."""
    inf = np.float32(np.inf)
    i, j = np.arange(M)[:, None], np.arange(KEYS)[None, :]
    causal = np.where(j > i, -inf, 0)  # rows 0-7 see only the first tile: 3 masked tiles
    first_tile = np.where((j < 8) & (i % 2 == 0), -inf, 0)  # even rows: first tile masked
    full_row = np.where(i == 3, -inf, causal)  # row 3 masked everywhere: NaN, as XLA gives
    lowest = np.where(j > i, np.finfo(np.float32).min, 0)  # finite mask: every row defined
    lowest[5] = np.finfo(np.float32).min
    return {"causal": causal, "first tile": first_tile, "full row": full_row,
            "lowest finite": lowest}  # fmt: skip


@pytest.fixture(scope="module")
def attention_runs(cache) -> dict[str, Callable[..., list[np.ndarray]]]:
    graph = masked_flash_attention()
    call = jax.jit(cpu_backend().compile(graph))
    runs = {"cpu": lambda *xs: [np.asarray(y) for y in call(*xs)],
            "reference": lambda *xs: evaluate(graph, xs)}
    if find_nvcc() is not None:
        from mirage_jax.backend.cuda.emulate import emulate

        runs["cuda-emu"] = lambda *xs: emulate(graph, xs)
    return runs


@pytest.mark.parametrize("target", ["cpu", "cuda-emu", "reference"])
@pytest.mark.parametrize("mask", list(_masks()))
def test_online_softmax_on_masked_rows(attention_runs, mask: str, target: str) -> None:
    if target not in attention_runs:
        pytest.skip("nvcc not found: CUDA emulation needs the CUDA toolkit's headers")
    rng = np.random.default_rng(7)
    q, k, v = (rng.standard_normal(s).astype(np.float32) for s in ((B, M, D), (B, D, KEYS),
                                                                  (B, KEYS, D)))  # fmt: skip
    bias = np.broadcast_to(_masks()[mask], (B, M, KEYS)).astype(np.float32)
    want = np.asarray(jax.jit(_attention)(q, k, v, bias))
    got = attention_runs[target](q, k, v, bias)[0]
    # sums of products: rounding is relative to the row's scale, not to each output
    scale = float(np.max(np.abs(want[np.isfinite(want)])))
    assert_same_specials(got, want, f"masked attention ({mask}), {target}", atol=1e-5 * scale)
    if mask in ("causal", "first tile", "lowest finite"):
        assert np.isfinite(want).all()  # the rule under test: XLA's answer is defined here
