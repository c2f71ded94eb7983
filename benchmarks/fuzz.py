"""Differential fuzzing of ``@optimize``: random programs, three implementations, one answer.

Each random program is a small jax function over the vocabulary ``@optimize`` turns into
regions (batched matmuls, elementwise chains, reductions, broadcasts, reshapes, transposes,
concatenation, casts) with random shapes (odd and prime sizes, size-1 dims, sizes that do and
do not divide the tile sizes), one dtype (f32, f64, bf16, f16) and a value range (normal, tiny,
huge, mixed magnitudes and signs, or sprinkled with NaN, +-inf and -0.0). It runs

- through ``jax.jit`` (the answer), and ``jax.jit`` on the inputs in float64 (the truth it is
  judged against);
- through the float reference interpreter (every region's μGraph evaluated in numpy);
- through ``@optimize`` with every region forced to a custom call (no speed requirement, no
  verification of its own): its kernel graph as is, or a small-budget search's winner.

Outputs must agree (``compare``): NaN and +-inf where ``jax.jit`` has them, and finite values
within the dtype's tolerance (``interpret.numerics``) of the output's scale, widened by what
``jax.jit`` itself is off from float64 (cancellation hurts every order of summation).

Programs are built from a stream of choices (``Chooser``): the driver draws them from a seeded
generator (program ``i`` of a run is reproducible from its seed), ``tests/test_fuzz.py`` from
hypothesis, which shrinks a failure to a small program. A failure the driver finds is shrunk
here (``shrink``: drop steps, shrink dims, tame the values) and printed as a ``Program(...)``
literal to paste into ``tests/test_fuzz.py``'s regressions.

    python benchmarks/fuzz.py --programs 2000              # the table; failures shrunk
    python benchmarks/fuzz.py --programs 50 --search 0.5   # half of them through the search
    python benchmarks/fuzz.py --seed 1234 --programs 1 -v  # one program, its text and verdict

Planning's timing step is skipped (``--time`` keeps it): speed is not what is checked here.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import dataclasses
import logging
import math
import os
import re
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TypeVar

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # the source tree, not an older installed copy

T = TypeVar("T")

# Small sizes, with primes, odd sizes, 1 and sizes that divide (or just miss) tile widths.
DIMS = (1, 2, 3, 4, 5, 7, 8, 11, 13, 16, 17, 24, 31, 32, 33, 48, 64)
MAX_ELEMENTS = 6144
DTYPES = ("f32",) * 6 + ("f64",) * 2 + ("bf16", "f16")
RANGES = ("normal", "normal", "tiny", "huge", "mixed", "special")
SCALARS = (0.5, -1.25, 3.0, 1e-3, 7.0, -0.0)


class Chooser(Protocol):
    """Where a program's random choices come from (a seeded generator, or hypothesis)."""

    def integer(self, lo: int, hi: int) -> int: ...  # inclusive; smaller is simpler

    def pick(self, options: Sequence[T]) -> T: ...  # earlier is simpler

    def chance(self, p: float) -> bool: ...  # False is simpler


class RandomChooser:
    """Choices from ``numpy.random.default_rng(seed)``."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng([seed, 0xF022])

    def integer(self, lo: int, hi: int) -> int:
        return int(self.rng.integers(lo, hi + 1))

    def pick(self, options: Sequence[T]) -> T:
        return options[int(self.rng.integers(len(options)))]

    def chance(self, p: float) -> bool:
        return bool(self.rng.random() < p)


# --------------------------------------------------------------------------------- programs


@dataclass(frozen=True)
class Program:
    """A fuzz program: jax source defining ``program(x0, x1, ...)`` and its inputs.

    ``shapes`` are the inputs' shapes, all of ``dtype``; ``values`` names the value range
    (``sample``) and ``seed`` the draw; ``strategy`` is how ``@optimize`` plans it ("as_is"
    or "search")."""

    source: str
    shapes: tuple[tuple[int, ...], ...]
    dtype: str = "f32"
    values: str = "normal"
    seed: int = 0
    strategy: str = "as_is"

    def function(self) -> Callable[..., Any]:
        import jax
        import jax.numpy as jnp

        scope: dict[str, Any] = {"jax": jax, "jnp": jnp}
        exec(compile(self.source, f"<fuzz program {self.seed}>", "exec"), scope)  # noqa: S102
        return scope["program"]

    def inputs(self) -> list[np.ndarray]:
        return [sample(s, self.dtype, self.values, self.seed * 131 + i)
                for i, s in enumerate(self.shapes)]  # fmt: skip

    def literal(self) -> str:
        """This program as Python, to paste into ``tests/test_fuzz.py``."""
        fields = ", ".join(f"{f.name}={getattr(self, f.name)!r}"
                           for f in dataclasses.fields(self) if f.name != "source")  # fmt: skip
        return f'Program("""\\\n{self.source}""", {fields})'


def numpy_dtype(name: str) -> np.dtype:
    import ml_dtypes

    return np.dtype({"f16": np.float16, "bf16": ml_dtypes.bfloat16, "f32": np.float32,
                     "f64": np.float64}[name])  # fmt: skip


def sample(shape: tuple[int, ...], dtype: str, values: str, seed: int) -> np.ndarray:
    """Inputs of one value range: normal N(0, 1); tiny and huge (N(0, 1) scaled down or up,
    within the dtype's normal range); mixed (magnitudes spread over 12 decades, random signs);
    special (normal with NaN, +-inf, +-0 and the largest finite value sprinkled in)."""
    rng = np.random.default_rng([seed, 0x5A3])
    x = rng.standard_normal(shape)
    half = dtype in ("f16", "bf16")
    if values == "tiny":
        x *= 1e-3 if half else 1e-7
    elif values == "huge":
        x *= 3e2 if half else 1e7
    elif values == "mixed":
        decades = 2.0 if half else 6.0
        x = np.sign(x) * 10.0 ** rng.uniform(-decades, decades, shape)
    elif values == "special":
        specials = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0])
        hit = rng.random(shape) < 0.15
        x = np.where(hit, specials[rng.integers(len(specials), size=shape)], x)
    return x.astype(numpy_dtype(dtype))


_JNP_DTYPES = {"f32": "jnp.float32", "f64": "jnp.float64", "bf16": "jnp.bfloat16",
               "f16": "jnp.float16"}  # fmt: skip


def tolerance_dtype(program: Program) -> str:
    """The narrowest dtype the program computes in (its own, or one it casts to): rounding
    to it is where two correct orders of evaluation part most."""
    used = [d for d, expr in _JNP_DTYPES.items()
            if d == program.dtype or expr in program.source]  # fmt: skip
    return max(used, key=lambda d: {"f64": 1e-9, "f32": 2e-4, "f16": 2e-2, "bf16": 5e-2}[d])


@dataclass
class _Var:
    name: str
    shape: tuple[int, ...]


class _Builder:
    """Grows one program step by step from a ``Chooser``."""

    def __init__(self, choose: Chooser, dtype: str) -> None:
        self.c = choose
        self.dtype_expr = _JNP_DTYPES[dtype]
        self.inputs: list[_Var] = []
        self.emitted: list[_Var] = []
        self.vars: list[_Var] = []
        self.lines: list[str] = []

    # --- shapes and inputs ------------------------------------------------------------------

    def dim(self) -> int:
        return self.c.pick(DIMS[: self.c.integer(4, len(DIMS))])

    def shape(self, rank: int) -> tuple[int, ...]:
        dims = [self.dim() for _ in range(rank)]
        while math.prod(dims) > MAX_ELEMENTS:
            dims[dims.index(max(dims))] //= 2
        return tuple(dims)

    def new_input(self, shape: tuple[int, ...]) -> _Var:
        var = _Var(f"x{len(self.inputs)}", tuple(shape))
        self.inputs.append(var)
        self.vars.append(var)
        return var

    def emit(self, expr: str, shape: tuple[int, ...]) -> _Var:
        var = _Var(f"v{len(self.lines)}", tuple(shape))
        self.lines.append(f"    {var.name} = {expr}")
        self.vars.append(var)
        self.emitted.append(var)
        return var

    def operand(self) -> _Var:
        """Mostly the newest value: programs grow chains rather than dead branches."""
        if self.emitted and self.c.chance(0.6):
            return self.emitted[-1]
        k = len(self.vars)
        return self.vars[k - 1 - min(self.c.integer(0, 3), k - 1)]

    def sinks(self) -> list[_Var]:
        """Values no later statement reads: the program returns them all."""
        return [v for i, v in enumerate(self.emitted)
                if not any(re.search(rf"\b{v.name}\b", line.split(" = ", 1)[1])
                           for line in self.lines[i + 1:])]  # fmt: skip

    # --- steps ------------------------------------------------------------------------------

    def step(self) -> None:
        kinds = (self.unary, self.scalar, self.binary, self.reduce, self.matmul, self.layout,
                 self.broadcast, self.concat, self.cast)  # fmt: skip
        for _ in range(4):  # a kind that does not fit its operand gives way to another
            if self.c.pick(kinds)(self.operand()):
                return
        self.unary(self.operand())

    def unary(self, v: _Var) -> bool:
        fn = self.c.pick((
            "jnp.tanh({})", "jnp.exp({})", "jax.nn.sigmoid({})", "jnp.square({})", "-{}",
            "jnp.abs({})", "jax.nn.relu({})", "jax.nn.silu({})", "jnp.log({})", "jnp.sqrt({})",
            "jax.lax.rsqrt({})", "jax.lax.erf({})", "{} ** 3", "jax.nn.gelu({})",
            "jax.nn.gelu({}, approximate=False)", "1.0 / {}", "jnp.clip({}, -1.5, 2.0)",
            "jnp.minimum({}, 0.0)", "{} ** -2", "jnp.sin({})", "jnp.cos({})",
            "jnp.sign({})", "jnp.exp2({})", "jax.scipy.special.erfinv(jnp.tanh({}))",
            "jnp.fmod({}, 1.7)",
        ))  # fmt: skip
        self.emit(fn.format(v.name), v.shape)
        return True

    def scalar(self, v: _Var) -> bool:
        c = self.c.pick(SCALARS)
        form = self.c.pick(("{v} * {c}", "{v} + {c}", "{c} - {v}", "{v} / {c}", "{c} / {v}",
                            "{v} ** 0.5", "jnp.maximum({v}, {c})", "{v} ** 1.5"))  # fmt: skip
        self.emit(form.format(v=v.name, c=repr(c)), v.shape)
        return True

    def binary(self, v: _Var) -> bool:
        op = self.c.pick(("{a} + {b}", "{a} * {b}", "{a} - {b}", "{a} / {b}",
                          "jnp.maximum({a}, {b})", "jnp.minimum({a}, {b})"))  # fmt: skip
        other = self._broadcastable(v)
        a, b = (v, other) if self.c.chance(0.7) else (other, v)
        shape = np.broadcast_shapes(a.shape, b.shape)
        if math.prod(shape) > MAX_ELEMENTS:
            return False
        self.emit(op.format(a=a.name, b=b.name), tuple(shape))
        return True

    def _broadcastable(self, v: _Var) -> _Var:
        same = [u for u in self.vars if u is not v and u.shape == v.shape]
        if same and self.c.chance(0.4):
            return self.c.pick(same)
        shape = [1 if self.c.chance(0.3) else d for d in v.shape]
        drop = self.c.integer(0, len(shape)) if self.c.chance(0.3) else 0
        return self.new_input(tuple(shape[drop:]))

    def reduce(self, v: _Var) -> bool:
        if not v.shape:
            return False
        fn = self.c.pick(("jnp.sum", "jnp.max", "jnp.mean", "jnp.min"))
        rank = len(v.shape)
        axes = sorted({self.c.integer(0, rank - 1) for _ in range(self.c.integer(1, 2))})
        keep = self.c.chance(0.5)
        if not keep and len(axes) == rank and not self.c.chance(0.2):
            keep = True  # a rank-0 result now and then
        out = tuple(1 if d in axes else s for d, s in enumerate(v.shape) if keep or d not in axes)
        axis = axes[0] if len(axes) == 1 else tuple(axes)
        self.emit(f"{fn}({v.name}, axis={axis!r}, keepdims={keep})", out)
        return True

    def matmul(self, v: _Var) -> bool:
        if not v.shape:
            return False
        k, n = v.shape[-1], self.dim()
        batch = v.shape[:-2]
        if len(v.shape) >= 2 and self.c.chance(0.3):
            other = self.new_input((*batch, n, k))  # contract both last dims
            spec = "...mk,...nk->...mn"
            self.emit(f'jnp.einsum("{spec}", {v.name}, {other.name})', (*v.shape[:-1], n))
            return True
        if self.c.chance(0.3) and batch:
            batch = batch[self.c.integer(0, len(batch)):]  # the weight broadcasts over batch
        other = self.new_input((*batch, k, n))
        out = np.broadcast_shapes(v.shape[:-1] + (1,), (*batch, 1, 1))[:-1] + (n,)
        if len(v.shape) == 1:
            out = other.shape[:-2] + (n,)
        if math.prod(out) > MAX_ELEMENTS:
            return False
        self.emit(f"{v.name} @ {other.name}", tuple(out))
        return True

    def layout(self, v: _Var) -> bool:
        s = list(v.shape)
        kind = self.c.pick(("transpose", "merge", "split", "unit"))
        if kind == "transpose" and len(s) >= 2:
            perm = list(range(len(s)))
            i, j = self.c.integer(0, len(s) - 1), self.c.integer(0, len(s) - 1)
            perm[i], perm[j] = perm[j], perm[i]
            if len(s) >= 3 and self.c.chance(0.5):
                perm = perm[1:] + perm[:1]
            self.emit(f"jnp.transpose({v.name}, {tuple(perm)!r})", tuple(s[p] for p in perm))
            return True
        if kind == "merge" and len(s) >= 2:
            i = self.c.integer(0, len(s) - 2)
            s[i: i + 2] = [s[i] * s[i + 1]]
        elif kind == "split" and s:
            i = self.c.integer(0, len(s) - 1)
            f = [d for d in range(2, s[i]) if s[i] % d == 0]
            if not f:
                return False
            a = self.c.pick(f)
            s[i: i + 1] = [a, s[i] // a]
        elif kind == "unit":
            s.insert(self.c.integer(0, len(s)), 1)
        else:
            return False
        self.emit(f"{v.name}.reshape({tuple(s)!r})", tuple(s))
        return True

    def broadcast(self, v: _Var) -> bool:
        units = [d for d, s in enumerate(v.shape) if s == 1]
        s = list(v.shape)
        if units and self.c.chance(0.6):
            s[self.c.pick(units)] = self.dim()
        else:
            s.insert(0, self.dim())
        if math.prod(s) > MAX_ELEMENTS:
            return False
        self.emit(f"jnp.broadcast_to({v.name}, {tuple(s)!r})", tuple(s))
        return True

    def concat(self, v: _Var) -> bool:
        if not v.shape:
            return False
        axis = self.c.integer(0, len(v.shape) - 1)
        s = list(v.shape)
        s[axis] = self.dim()
        other = self.new_input(tuple(s)) if self.c.chance(0.6) else v
        out = list(v.shape)
        out[axis] += other.shape[axis]
        if math.prod(out) > MAX_ELEMENTS:
            return False
        pair = (v.name, other.name) if self.c.chance(0.5) else (other.name, v.name)
        self.emit(f"jnp.concatenate([{pair[0]}, {pair[1]}], axis={axis})", tuple(out))
        return True

    def cast(self, v: _Var) -> bool:
        # half and double programs go to float32: values of two widths then meet in later ops
        # (see ``tolerance_dtype``)
        if self.dtype_expr == "jnp.float32":
            return False
        self.emit(f"{v.name}.astype(jnp.float32)", v.shape)
        return True


def build_program(choose: Chooser, seed: int = 0, strategy: str = "as_is") -> Program:
    """One random program from ``choose``'s choices."""
    dtype = choose.pick(DTYPES)
    values = choose.pick(RANGES)
    b = _Builder(choose, dtype)
    b.new_input(b.shape(choose.integer(1, 3)))
    for _ in range(choose.integer(1, 6)):
        b.step()
    outs = [v.name for v in b.sinks()]
    body = "\n".join(b.lines)
    names = ", ".join(v.name for v in b.inputs)
    source = f"def program({names}):\n{body}\n    return {', '.join(outs)}\n"
    return Program(source, tuple(v.shape for v in b.inputs), dtype, values, seed, strategy)


# ------------------------------------------------------------------------------- comparison


def compare(got: Any, want: Any, truth: Any, dtype: str) -> str | None:
    """None when ``got`` agrees with ``want`` (``jax.jit``'s output), else why not.

    Special values must match: NaN where ``want`` is NaN, +-inf of the same sign where it is
    infinite, and nothing non-finite elsewhere - except where the float64 ``truth`` is within
    a factor 2 of the dtype's largest value, where one order of rounding may overflow and
    another not. Finite values must be within ``tolerance(dtype)`` of the output's largest
    magnitude in ``truth``, plus 4x the largest error of ``want`` itself against ``truth``."""
    from mirage_jax.interpret.numerics import tolerance

    g, w, t = (np.asarray(a).astype(np.float64) for a in (got, want, truth))
    if g.shape != w.shape:
        return f"shape {g.shape}, jax.jit gives {w.shape}"
    with np.errstate(invalid="ignore", over="ignore"):
        special = ~np.isfinite(g) | ~np.isfinite(w)
        same = (np.isnan(g) & np.isnan(w)) | (g == w)
        border = np.isfinite(t) & (np.abs(t) >= float(np.finfo(numpy_dtype(dtype)).max) / 2)
    bad = special & ~same & ~border
    if bad.any():
        i = tuple(int(k) for k in np.argwhere(bad)[0])
        return (f"special values differ at {i}: got {g[i]!r}, jax.jit {w[i]!r} "
                f"({int(bad.sum())} of {bad.size} elements)")  # fmt: skip
    finite = ~special & np.isfinite(t)
    if not finite.any():
        return None
    with np.errstate(invalid="ignore", over="ignore"):
        scale = float(np.max(np.abs(t[finite])))
        err_want = float(np.max(np.abs(w[finite] - t[finite])))
        err = np.where(finite, np.abs(g - t), 0.0)
    allowed = tolerance(dtype) * scale + 4 * err_want
    if float(err.max()) <= allowed:
        return None
    i = tuple(int(k) for k in np.unravel_index(int(np.argmax(err)), err.shape))
    return (f"off by {float(err.max()):.3g} at {i} (allowed {allowed:.3g}): got {g[i]!r}, "
            f"jax.jit {w[i]!r}, float64 {t[i]!r}")  # fmt: skip


# ---------------------------------------------------------------------------------- running


FAILURES = ("mismatch", "crash", "bad kernel")


@dataclass
class Outcome:
    """What one program did. ``verdict``: "ok", "mismatch" (an output disagrees), "crash"
    (something raised that must not), "bad kernel" (a region fell back because its generated
    code failed to compile or to verify: the answer is right, the code generator is not),
    "xla deviation" (the outputs agree with XLA's documented semantics, not with what this
    jaxlib's ``jax.jit`` computed: counted, not a failure), or "invalid" (``jax.jit`` itself
    rejects the program: a generator bug, not counted)."""

    program: Program
    verdict: str = "ok"
    detail: str = ""
    stage: str = "jax.jit"
    regions: int = 0
    custom_calls: int = 0
    fallbacks: list[str] = field(default_factory=list)
    seconds: float = 0.0


def small_search_config() -> Any:
    """A search that finishes in seconds: few ops, one worker, no candidate timing."""
    from mirage_jax.search import SearchConfig

    return SearchConfig(max_kernel_ops=3, time_budget_s=4.0, workers=1, max_states=20_000,
                        saturation_time_s=2.0, saturation_iterations=16, max_verify=2,
                        time_candidates=False, progress=False)  # fmt: skip


def run_program(program: Program) -> Outcome:
    """Run ``program`` three ways and compare (see the module docstring)."""
    import jax

    out = Outcome(program)
    start = time.perf_counter()
    try:
        _run(program, out, jax)
    except Exception:  # noqa: BLE001 - the fuzzer reports whatever escaped as a crash
        out.verdict = "crash"
        out.detail = f"in {out.stage}:\n{traceback.format_exc(limit=-8)}"
    out.seconds = time.perf_counter() - start
    return out


def _run(program: Program, out: Outcome, jax: Any) -> None:
    import mirage_jax as mj

    fn, inputs = program.function(), program.inputs()
    with jax.enable_x64(program.dtype == "f64"):
        try:
            want = _flat(jax.jit(fn)(*inputs))
        except Exception as err:  # noqa: BLE001 - jax refusing the program is the generator's bug
            out.verdict, out.detail = "invalid", f"jax.jit: {type(err).__name__}: {err}"
            return
    with jax.enable_x64(True):
        truth = _flat(jax.jit(fn)(*[x.astype(np.float64) for x in inputs]))
    with jax.enable_x64(program.dtype == "f64"):
        out.stage = "the reference interpreter"
        reference = _flat(_reference(fn, inputs))
        out.stage = "@optimize"
        config = small_search_config() if program.strategy == "search" else None
        opt = mj.optimize(fn, strategy=program.strategy, require_speedup=False, verify=False,
                          config=config)  # fmt: skip
        got = _flat(opt(*inputs))
        plan = opt.plan(*inputs)
    out.regions = len(plan.regions)
    out.custom_calls = sum(r.impl is not None for r in plan.regions)
    out.fallbacks = [_reason(r.reason) for r in plan.regions if r.impl is None]
    broken = [r.reason for r in plan.regions if r.impl is None and _is_bug(r.reason)]
    if broken:  # the fallback kept the answer right, but the generated code is wrong
        out.verdict, out.detail = "bad kernel", broken[0]
        return
    second: list[np.ndarray] = []  # XLA's answer without YNNPACK, computed when needed
    for what, outs in (("@optimize", got), ("the reference interpreter", reference)):
        for k, (g, w, t) in enumerate(zip(outs, want, truth)):
            why = compare(g, w, t, tolerance_dtype(program))
            if why is None:
                continue
            second = second or _xla_without_ynn(fn, inputs, program)
            if compare(g, second[k], t, tolerance_dtype(program)) is not None:
                out.verdict, out.detail = "mismatch", f"{what}, output {k}: {why}"
                return
            out.verdict = "xla deviation"
            out.detail = f"{what}, output {k}: {why}; XLA without YNNPACK fusions agrees"


def _xla_without_ynn(fn: Callable[..., Any], inputs: Sequence[np.ndarray], program: Program) -> list:
    """``jax.jit``'s answer with XLA:CPU's YNNPACK library fusions off: their reduce-max drops
    NaN (jaxlib 0.10.2: max over a tensor holding NaN gives -inf or 0), where XLA's own max
    propagates it as documented. A program that agrees with this answer is XLA's deviation."""
    import jax

    with jax.enable_x64(program.dtype == "f64"):
        compiled = jax.jit(fn).lower(*inputs).compile(
            compiler_options={"xla_cpu_experimental_ynn_fusion_type": ""}
        )
        return _flat(compiled(*inputs))


def _reference(fn: Callable[..., Any], inputs: Sequence[np.ndarray]) -> Any:
    """``fn`` with every region evaluated by the float reference interpreter (in the region's
    dtypes); the equations between regions run eagerly in jax."""
    import mirage_jax as mj
    from mirage_jax.interpret import evaluate

    program = mj.trace(fn, *inputs)

    def impl(graph: Any) -> Callable[..., list[np.ndarray]]:
        return lambda *xs: evaluate(graph, [np.asarray(x) for x in xs])

    return program.run(*inputs, region_impls={r.index: impl(r.graph) for r in program.regions})


def _flat(tree: Any) -> list[np.ndarray]:
    import jax

    return [np.asarray(x) for x in jax.tree_util.tree_leaves(tree)]


# Fallback reasons that are mirage_jax's own bugs: generated code that does not compile, or
# that planning's verification caught computing something else.
_BUG_REASONS = ("compiling ", "differs from XLA")


def _is_bug(reason: str) -> bool:
    return any(b in reason for b in _BUG_REASONS)


def _reason(text: str) -> str:
    """A fallback reason without its particulars (numbers, shapes, paths), for the table."""
    text = re.sub(r"^fell back to XLA: ", "", text).split(" (remedy: ")[0]
    text = re.sub(r"CPU backend: \w+ on (\w+) tensors", r"CPU backend: ops on \1 tensors", text)
    text = re.sub(r"^compiling \S+ failed.*", "compiling generated code failed", text)
    text = re.sub(r"\b\d+(\.\d+)?\b", "N", text.split("\n")[0])
    return re.sub(r"\(.*?\)", "", text).strip()[:90] or "(none given)"


# -------------------------------------------------------------------------------- shrinking


def shrink(program: Program, fails: Callable[[Program], bool], budget: int = 60) -> Program:
    """A smaller program that still ``fails``: drop statements (the returns kept defined),
    halve input dims, tame the values; greedy, at most ``budget`` tries."""
    tries = 0
    progress = True
    while progress and tries < budget:
        progress = False
        for candidate in _smaller(program):
            tries += 1
            if _valid(candidate) and fails(candidate):
                program, progress = candidate, True
                break
            if tries >= budget:
                break
    return program


def _smaller(p: Program) -> list[Program]:
    head, *body, ret = p.source.rstrip("\n").split("\n")
    out = []
    for i in range(len(body)):  # drop a statement, its users reading its first operand
        name, expr = body[i].strip().split(" = ", 1)
        first = re.search(r"\b([xv]\d+)\b", expr)
        if not first:
            continue
        rest = [re.sub(rf"\b{name}\b", first.group(1), line) for line in body[i + 1:]]
        tail = re.sub(rf"\b{name}\b", first.group(1), ret)
        out.append(dataclasses.replace(p, source="\n".join([head, *body[:i], *rest, tail]) + "\n"))
    if p.values != "normal":
        out.append(dataclasses.replace(p, values="normal"))
    if p.strategy != "as_is":
        out.append(dataclasses.replace(p, strategy="as_is"))
    return out


def _valid(p: Program) -> bool:
    try:
        import jax

        with jax.enable_x64(p.dtype == "f64"):
            jax.eval_shape(p.function(), *p.inputs())
        return True
    except Exception:  # noqa: BLE001 - a shrink step that breaks the program is discarded
        return False


# ----------------------------------------------------------------------------------- driver


@dataclass
class Table:
    """The driver's tally."""

    programs: int = 0
    regions: int = 0
    custom_calls: int = 0
    compiled: int = 0
    cache_hits: int = 0
    mismatches: int = 0
    crashes: int = 0
    bad_kernels: int = 0
    xla_deviations: int = 0
    invalid: int = 0
    searched: int = 0
    fallbacks: collections.Counter = field(default_factory=collections.Counter)
    by_dtype: collections.Counter = field(default_factory=collections.Counter)
    by_values: collections.Counter = field(default_factory=collections.Counter)
    failures: list[Outcome] = field(default_factory=list)

    def add(self, out: Outcome) -> None:
        self.programs += 1
        self.regions += out.regions
        self.custom_calls += out.custom_calls
        self.searched += out.program.strategy == "search"
        self.fallbacks.update(out.fallbacks)
        self.by_dtype[out.program.dtype] += 1
        self.by_values[out.program.values] += 1
        if out.verdict == "mismatch":
            self.mismatches += 1
        elif out.verdict == "crash":
            self.crashes += 1
        elif out.verdict == "invalid":
            self.invalid += 1
        elif out.verdict == "bad kernel":
            self.bad_kernels += 1
        elif out.verdict == "xla deviation":
            self.xla_deviations += 1
        if out.verdict in FAILURES:
            self.failures.append(out)

    def render(self, seconds: float) -> str:
        rows = [("programs", self.programs), ("  through a small-budget search", self.searched),
                ("  rejected by jax.jit (generator)", self.invalid),
                ("regions", self.regions), ("  compiled (g++ runs)", self.compiled),
                ("  kernels from the cache", self.cache_hits),
                ("custom calls", self.custom_calls), ("mismatches", self.mismatches),
                ("crashes", self.crashes),
                ("  agreeing with XLA without YNNPACK (its NaN-dropping max)", self.xla_deviations),
                ("generated code failing (caught, fell back)", self.bad_kernels),
                ("fallbacks", sum(self.fallbacks.values()))]
        rows += [(f"  {reason}", n) for reason, n in self.fallbacks.most_common()]
        width = max(len(r[0]) for r in rows)
        lines = [f"{name:<{width}}  {n:>7}" for name, n in rows]
        lines.append(f"{'dtypes':<{width}}  " + ", ".join(
            f"{k} {v}" for k, v in sorted(self.by_dtype.items())))  # fmt: skip
        lines.append(f"{'value ranges':<{width}}  " + ", ".join(
            f"{k} {v}" for k, v in sorted(self.by_values.items())))  # fmt: skip
        lines.append(f"{'wall time':<{width}}  {seconds:7.0f} s")
        return "\n".join(lines)


def _skip_timing() -> None:
    """Planning times a forced region only to report its ratio; the fuzzer skips that."""
    from mirage_jax.planner import region

    region.compare = lambda candidate, baseline, args: (0.0, 0.0)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--programs", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=0, help="first program's seed")
    ap.add_argument("--search", type=float, default=0.1,
                    help="fraction of programs planned by a small-budget search")
    ap.add_argument("--cache-dir", default=None, help="shared by every program (default: a "
                    "fresh temporary directory)")
    ap.add_argument("--time", action="store_true", help="keep planning's timing step")
    ap.add_argument("--no-shrink", action="store_true")
    ap.add_argument("-v", "--verbose", action="store_true", help="print every program")
    args = ap.parse_args(argv)

    with _fuzzing_settings(args.cache_dir, args.time):
        table = _drive(args)
    if table.failures and not args.no_shrink:
        with _fuzzing_settings(args.cache_dir, args.time):
            _report_shrunk(table.failures)
    return 1 if table.failures else 0


@contextlib.contextmanager
def _fuzzing_settings(cache_dir: str | None, keep_timing: bool) -> Iterator[None]:
    """One cache for every program, no timing, fallbacks tallied rather than logged; all
    restored afterwards (the tests run the driver in their own process)."""
    from mirage_jax.planner import region

    saved_env, saved_compare = os.environ.get("MIRAGE_JAX_CACHE_DIR"), region.compare
    logger = logging.getLogger("mirage_jax")
    saved_level = logger.level
    os.environ["MIRAGE_JAX_CACHE_DIR"] = cache_dir or tempfile.mkdtemp(prefix="mirage_fuzz_")
    if not keep_timing:
        _skip_timing()
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(saved_level)
        region.compare = saved_compare
        if saved_env is None:
            os.environ.pop("MIRAGE_JAX_CACHE_DIR", None)
        else:
            os.environ["MIRAGE_JAX_CACHE_DIR"] = saved_env


def _drive(args: argparse.Namespace) -> Table:
    import jax

    from mirage_jax.backend.cpu.build import build_stats

    table = Table()
    start, before = time.perf_counter(), build_stats()
    every = max(1, round(1 / args.search)) if args.search > 0 else 0
    for seed in range(args.seed, args.seed + args.programs):
        strategy = "search" if every and seed % every == every - 1 else "as_is"
        program = build_program(RandomChooser(seed), seed, strategy)
        out = run_program(program)
        table.add(out)
        if args.verbose or out.verdict in FAILURES:
            print(f"--- program {seed} ({program.dtype}, {program.values}, {strategy}): "
                  f"{out.verdict} in {out.seconds:.1f} s\n{program.source}{out.detail}",
                  flush=True)  # fmt: skip
        if table.programs % 100 == 0:
            print(f"[{table.programs} programs, {time.perf_counter() - start:.0f} s: "
                  f"{table.mismatches} mismatches, {table.crashes} crashes, "
                  f"{table.bad_kernels} bad kernels]", flush=True)  # fmt: skip
            jax.clear_caches()  # thousands of one-off functions: keep memory flat
    after = build_stats()
    table.compiled = after.compiles - before.compiles
    table.cache_hits = after.cache_hits - before.cache_hits
    print(table.render(time.perf_counter() - start))
    return table


def _report_shrunk(failures: Sequence[Outcome]) -> None:
    print("\nshrunk failures (paste into tests/test_fuzz.py REGRESSIONS):")
    for out in failures:
        small = shrink(out.program, lambda p, v=out.verdict: run_program(p).verdict == v)
        print(f"# {out.verdict}: {run_program(small).detail.splitlines()[0]}")
        print(small.literal() + ",")


if __name__ == "__main__":
    sys.exit(main())
