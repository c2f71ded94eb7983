"""Mirage's benchmark programs (DESIGN.md §5) as plain ``jax.numpy`` functions, with shapes.

``programs(bs)`` gives the six suite programs at batch size ``bs``; ``extra_programs()`` gives
smaller ones that exercise the frontend (norms, softmax, residuals, an unsupported op between
two supported parts, pytree arguments). ``make_inputs`` draws realistic inputs: activations
~ N(0, 1), weights ~ N(0, 1/sqrt(fan_in)), gains near 1, attention operands scaled so the
logits have unit variance.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

# ------------------------------------------------------------------------------- programs


def rmsnorm(x: jax.Array, axis: int = -1, eps: float = 1e-6) -> jax.Array:
    return x * jax.lax.rsqrt(jnp.mean(x * x, axis, keepdims=True) + eps)


def l2norm(x: jax.Array) -> jax.Array:
    """x / ||x||_2 over the last axis."""
    return x * jax.lax.rsqrt(jnp.sum(x * x, -1, keepdims=True))


def rmsnorm_linear(x: jax.Array, g: jax.Array, w: jax.Array) -> jax.Array:
    return (rmsnorm(x) * g) @ w


def gated_mlp(x: jax.Array, w1: jax.Array, w2: jax.Array) -> jax.Array:
    return jax.nn.silu(x @ w1) * (x @ w2)


def lora(x: jax.Array, w: jax.Array, a: jax.Array, b: jax.Array) -> jax.Array:
    return x @ w + (x @ a) @ b


def gqa_decode(q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
    return jax.nn.softmax(q @ k, axis=-1) @ v


def qknorm_attn(q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
    # Q[b, queries, head_dim], K[b, head_dim, keys]: normalise both over the head dim.
    return jax.nn.softmax(rmsnorm(q, axis=-1) @ rmsnorm(k, axis=1), axis=-1) @ v


def ntrans(h: jax.Array, x: jax.Array, alpha: jax.Array) -> jax.Array:
    """nGPT's normalised update: norm(H + alpha * (norm(X) - H))."""
    return l2norm(h + alpha * (l2norm(x) - h))


def layernorm(x: jax.Array, g: jax.Array, b: jax.Array) -> jax.Array:
    mean = jnp.mean(x, -1, keepdims=True)
    var = jnp.mean((x - mean) ** 2, -1, keepdims=True)
    return (x - mean) * jax.lax.rsqrt(var + 1e-5) * g + b


def softmax(x: jax.Array) -> jax.Array:
    return jax.nn.softmax(x, axis=-1)


def residual_relu(x: jax.Array, w: jax.Array, b: jax.Array) -> jax.Array:
    return jax.nn.relu(x @ w + b) + x


def gelu_mlp(x: jax.Array, w1: jax.Array, w2: jax.Array) -> jax.Array:
    return jax.nn.gelu(x @ w1) @ w2


def sort_between(x: jax.Array, w: jax.Array) -> jax.Array:
    """Two supported parts around ``jnp.sort``, which no μGraph operator expresses."""
    h = jnp.sort(jnp.tanh(x @ w), axis=-1)
    return jnp.exp(h) * 2.0 + 1.0


def cumsum_between(x: jax.Array, g: jax.Array) -> jax.Array:
    """Two supported parts around ``jnp.cumsum``."""
    c = jnp.cumsum(jax.nn.sigmoid(x) * g, axis=-1)
    return rmsnorm(c) * g


def pytree_mlp(params: dict[str, jax.Array], x: jax.Array) -> dict[str, jax.Array]:
    """Dict of parameters in, dict of results out."""
    hidden = jax.nn.relu(x @ params["w1"] + params["b1"])
    return {"out": hidden @ params["w2"], "hidden": hidden}


# ------------------------------------------------------------------------ program records


@dataclass(frozen=True)
class Arg:
    """One array argument: its shape and the normal distribution its values come from."""

    name: str
    shape: tuple[int, ...]
    std: float = 1.0
    mean: float = 0.0


@dataclass(frozen=True)
class Program:
    """A benchmark program: ``fn(*call_args(make_inputs(program, seed)))``.

    ``pack`` turns the flat list of input arrays into ``fn``'s arguments when they are not
    simply positional arrays (pytree arguments).
    """

    name: str
    fn: Callable[..., Any]
    args: tuple[Arg, ...]
    dtype: str = "float32"
    pack: Callable[[Sequence[np.ndarray]], tuple[Any, ...]] | None = None

    @property
    def shapes(self) -> tuple[tuple[int, ...], ...]:
        return tuple(a.shape for a in self.args)

    def call_args(self, inputs: Sequence[Any]) -> tuple[Any, ...]:
        return self.pack(inputs) if self.pack is not None else tuple(inputs)


def _weight(name: str, fan_in: int, fan_out: int) -> Arg:
    return Arg(name, (fan_in, fan_out), std=fan_in**-0.5)


def programs(bs: int) -> list[Program]:
    """The six suite programs of DESIGN.md §5 at batch size ``bs`` (1 and 8 in the paper)."""
    qk = 64**-0.25  # q·k over 64 dims then has unit variance
    attn = (Arg("q", (2 * bs, 256, 64), qk), Arg("k", (2 * bs, 64, 4096), qk),
            Arg("v", (2 * bs, 4096, 64)))  # fmt: skip
    return [
        Program("rmsnorm_linear", rmsnorm_linear, (
            Arg("x", (2 * bs, 4096)), Arg("g", (4096,), 0.1, 1.0), _weight("w", 4096, 6144))),
        Program("gated_mlp", gated_mlp, (
            Arg("x", (8 * bs, 4096)), _weight("w1", 4096, 4096), _weight("w2", 4096, 4096))),
        Program("lora", lora, (
            Arg("x", (16 * bs, 256)), _weight("w", 256, 4096), _weight("a", 256, 16),
            _weight("b", 16, 4096))),
        Program("gqa_decode", gqa_decode, attn),
        Program("qknorm_attn", qknorm_attn, attn),
        Program("ntrans", ntrans, (
            Arg("h", (8 * bs, 4096)), Arg("x", (8 * bs, 4096)),
            Arg("alpha", (8 * bs, 4096), 0.01, 0.05))),
    ]  # fmt: skip


def _pack_pytree_mlp(inputs: Sequence[Any]) -> tuple[Any, ...]:
    w1, b1, w2, x = inputs
    return ({"w1": w1, "b1": b1, "w2": w2}, x)


def extra_programs() -> list[Program]:
    """Smaller programs for tests: norms, softmax, residuals, a cut in the middle, pytrees."""
    return [
        Program("layernorm", layernorm, (
            Arg("x", (64, 512), 2.0, 0.5), Arg("g", (512,), 0.1, 1.0), Arg("b", (512,), 0.1))),
        Program("softmax", softmax, (Arg("x", (64, 1000), 2.0),)),
        Program("residual_relu", residual_relu, (
            Arg("x", (32, 256)), _weight("w", 256, 256), Arg("b", (256,), 0.1))),
        Program("gelu_mlp", gelu_mlp, (
            Arg("x", (32, 256)), _weight("w1", 256, 1024), _weight("w2", 1024, 256))),
        Program("sort_between", sort_between, (Arg("x", (32, 128)), _weight("w", 128, 128))),
        Program("cumsum_between", cumsum_between, (
            Arg("x", (16, 256)), Arg("g", (256,), 0.1, 1.0))),
        Program("pytree_mlp", pytree_mlp, (
            _weight("w1", 128, 256), Arg("b1", (256,), 0.1), _weight("w2", 256, 64),
            Arg("x", (16, 128))), pack=_pack_pytree_mlp),
    ]  # fmt: skip


def make_inputs(program: Program, seed: int = 0) -> list[np.ndarray]:
    """Fresh random inputs for ``program`` (one array per ``Arg``, in order)."""
    rng = np.random.default_rng(seed)
    dtype = np.dtype(program.dtype)
    return [(a.mean + a.std * rng.standard_normal(a.shape)).astype(dtype) for a in program.args]


# ------------------------------------------------------------ the μGraphs Mirage finds


def _block_ops(block: Any) -> list[Any]:
    """Ops of a block graph with its thread graphs inlined."""
    from mirage_jax.ir import Op

    out = []
    for n in block.nodes:
        if n.op is Op.THREAD:
            out += [m.op for m in n.attr("graph").nodes if m.op not in (Op.INPUT, Op.OUTPUT)]
        else:
            out.append(n.op)
    return out


def single_kernel(graph: Any) -> Any:
    """The block graph when ``graph`` is one graph-defined kernel (reshapes aside), else None."""
    from mirage_jax.ir import Op

    blocks = [n.attr("block") for n in graph.nodes if n.op is Op.GRAPH_DEF]
    others = [n for n in graph.nodes
              if n.op not in (Op.INPUT, Op.OUTPUT, Op.RESHAPE, Op.GRAPH_DEF)]  # fmt: skip
    return blocks[0] if len(blocks) == 1 and not others else None


def _rms_with_accumulators(block: Any) -> bool:
    from mirage_jax.ir import Op
    from mirage_jax.ir.ops import ACCUMULATORS

    accs = [n for n in block.nodes if n.op in ACCUMULATORS]
    return (block.forloop_range > 1 and Op.MATMUL in _block_ops(block)
            and any(n.attr("dim") == -1 for n in accs if n.op is Op.ACC_SUM)
            and any(n.attr("dim") != -1 for n in accs
                    if n.op in (Op.ACC_SUM, Op.ACC_MEAN, Op.ACC_RMS)))  # fmt: skip


def _count(op_name: str, n: int) -> Callable[[Any], bool]:
    def check(block: Any) -> bool:
        from mirage_jax.ir import Op

        return _block_ops(block).count(Op(op_name)) == n

    return check


def _online_softmax(block: Any) -> bool:
    from mirage_jax.ir import Op

    return Op.ACC_RESCALE_SUM in _block_ops(block)


# What Mirage finds for each suite program, as a predicate on the block graph of a single
# graph-defined kernel, with the words for it.
MIRAGE_FORMS: dict[str, tuple[str, Callable[[Any], bool]]] = {
    "rmsnorm_linear": ("a for-loop with a sum (matmul) and a sum-of-squares accumulator",
                       _rms_with_accumulators),
    "gated_mlp": ("both matmuls in one block graph", _count("matmul", 2)),
    "lora": ("all three matmuls fused", _count("matmul", 3)),
    "gqa_decode": ("online softmax (FlashDecoding-style) in one kernel", _online_softmax),
    "qknorm_attn": ("both rsqrt normalisations and both matmuls in the block",
                    lambda b: _count("rsqrt", 2)(b) and _count("matmul", 2)(b)),
    "ntrans": ("both norms and the update in one kernel", _count("rsqrt", 2)),
}  # fmt: skip


def has_mirage_form(name: str, graph: Any) -> bool:
    """Whether ``graph`` is one graph-defined kernel of the form Mirage finds for ``name``."""
    block = single_kernel(graph)
    return block is not None and MIRAGE_FORMS[name][1](block)


__all__ = [
    "MIRAGE_FORMS", "has_mirage_form", "single_kernel",
    "Arg", "Program", "cumsum_between", "extra_programs", "gated_mlp", "gelu_mlp", "gqa_decode",
    "l2norm", "layernorm", "lora", "make_inputs", "ntrans", "programs", "pytree_mlp", "qknorm_attn",
    "residual_relu", "rmsnorm", "rmsnorm_linear", "softmax", "sort_between",
]  # fmt: skip
