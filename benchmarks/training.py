"""Training steps, batching and bfloat16 on Mirage's six programs: what each region became.

For every program at one batch size (``--bs``, default 1) it prints one row:

- ``step``: ``@optimize`` on ``jax.value_and_grad`` of a loss over the program (the loss
  reads every output element through a nonlinearity): the step's forward and backward
  regions and how many became custom calls (the rest stayed with XLA: ``explain`` says why),
  the step's speedup over ``jax.jit`` of the same step in this process, and the largest error
  of the loss and gradients relative to ``jax.jit``'s (per leaf, of its largest element);
- ``grad(opt)``: ``jax.value_and_grad`` of the optimized program itself: the forward regions'
  custom calls, the backward regions (planned at the first reverse pass, one per custom-call
  region) and how many became custom calls, its speedup over ``jax.jit`` of the step and
  error;
- ``vmap``: ``jax.vmap`` over 4 batches of the optimized program, whether it ran as one custom
  call per region (planned at the batched shape), and its error against ``jax.vmap`` of
  ``jax.jit``;
- ``bf16``: the program with bfloat16 inputs and weights: the forward's speedup over
  ``jax.jit`` of the bf16 program, over our own float32 plan of the program, and its error
  against ``jax.jit``.

    python benchmarks/training.py [--bs 1] [--programs lora gated_mlp] [--json out.json]
                                  [--search-s 20]

``--search-s``: each region's search budget (the default SearchConfig's is 60 s; a step has
up to a dozen regions).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the source tree, not an older installed copy

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import programs  # noqa: E402

import mirage_jax as mj  # noqa: E402
from mirage_jax.timing import compare  # noqa: E402


def loss_of(fn: Any) -> Any:
    def loss(*args: Any) -> Any:
        y = fn(*args)
        return jnp.sum(y * jnp.sin(y))

    return loss


def rel_error(got: Any, want: Any) -> float:
    """The largest error over the leaves, each relative to its largest reference element."""
    worst = 0.0
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        g64, w64 = np.asarray(g, np.float64), np.asarray(w, np.float64)
        worst = max(worst, float(np.max(np.abs(g64 - w64)) / max(np.max(np.abs(w64)), 1e-30)))
    return worst


def fates(plan: Any) -> dict[str, str]:
    """'custom calls/regions' for the forward and the backward regions of a plan."""
    out = {}
    for name, backward in (("fwd", False), ("bwd", True)):
        regions = [r for r in plan.regions if r.backward == backward]
        out[name] = f"{sum(r.impl is not None for r in regions)}/{len(regions)}"
    return out


def backward_fates(fast: Any, args: Any) -> str:
    """'custom calls/regions' over the backward plans of ``fast``'s custom-call regions."""
    regions = [r for tangent_map in fast.plan(*args).tangent_maps.values()
               for b in tangent_map.backward.values() for plan in b.plans()
               for r in plan.regions]  # fmt: skip
    return f"{sum(r.impl is not None for r in regions)}/{len(regions)}"


def speedup(fast: Any, xla: Any, args: Any) -> float:
    t_fast, t_xla = compare(fast, xla, args, rounds=5, budget_s=0.4)
    return t_xla / t_fast


def case(program: programs.Program, config: Any) -> dict[str, Any]:
    args = program.call_args([jnp.asarray(x) for x in programs.make_inputs(program, seed=0)])
    argnums = tuple(range(len(args)))
    step = jax.value_and_grad(loss_of(program.fn), argnums=argnums)
    row: dict[str, Any] = {"program": program.name}
    t0 = time.perf_counter()
    fast_step = mj.optimize(step, config=config)
    plan = fast_step.plan(*args)
    row["step_plan_s"] = time.perf_counter() - t0
    row["step"] = fates(plan)
    row["step_speedup"] = speedup(fast_step, jax.jit(step), args)
    row["step_err"] = rel_error(fast_step(*args), jax.jit(step)(*args))
    row["step_explain"] = plan.report()

    fast = mj.optimize(program.fn, config=config)
    grad_of_fast = jax.jit(jax.value_and_grad(loss_of(fast), argnums=argnums))
    row["grad_custom_calls"] = fates(fast.plan(*args))["fwd"]
    row["grad_speedup"] = speedup(grad_of_fast, jax.jit(step), args)  # plans the backward
    row["grad_bwd"] = backward_fates(fast, args)
    row["grad_err"] = rel_error(grad_of_fast(*args), jax.jit(step)(*args))

    batched_args = [jnp.stack([a] * 4) for a in args]
    vfast = jax.jit(jax.vmap(fast))
    vwant = jax.jit(jax.vmap(program.fn))
    row["vmap_one_call"] = "while" not in vfast.lower(*batched_args).as_text()
    row["vmap_err"] = rel_error(vfast(*batched_args), vwant(*batched_args))

    half = dataclasses.replace(program, dtype="bfloat16")
    hargs = half.call_args([jnp.asarray(x) for x in programs.make_inputs(half, seed=0)])
    hfast = mj.optimize(half.fn, config=config)
    row["bf16"] = fates(hfast.plan(*hargs))["fwd"]
    row["bf16_speedup"] = speedup(hfast, jax.jit(half.fn), hargs)
    row["bf16_err"] = rel_error(hfast(*hargs), jax.jit(half.fn)(*hargs))
    # the same program in f32 against bf16: time each on its own arguments
    row["bf16_over_f32"] = speedup(lambda *_: hfast(*hargs), lambda *_: fast(*args), ())
    return row


def print_table(rows: list[dict[str, Any]]) -> None:
    head = (f"{'program':15} {'step fwd':>8} {'bwd':>5} {'step':>6} {'err':>8} {'plan':>6} "
            f"{'grad fwd':>8} {'bwd':>5} {'grad':>6} {'err':>8} {'vmap 1 call':>11} {'err':>8} "
            f"{'bf16':>5} {'speedup':>7} {'/f32':>6} {'err':>8}")  # fmt: skip
    print(head)
    print("-" * len(head))
    for r in rows:
        print(f"{r['program']:15} {r['step']['fwd']:>8} {r['step']['bwd']:>5} "
              f"{r['step_speedup']:>5.2f}x {r['step_err']:>8.1e} {r['step_plan_s']:>5.0f}s "
              f"{r['grad_custom_calls']:>8} {r['grad_bwd']:>5} "
              f"{r['grad_speedup']:>5.2f}x {r['grad_err']:>8.1e} "
              f"{'yes' if r['vmap_one_call'] else 'no':>11} {r['vmap_err']:>8.1e} "
              f"{r['bf16']:>5} {r['bf16_speedup']:>6.2f}x {r['bf16_over_f32']:>5.2f}x "
              f"{r['bf16_err']:>8.1e}")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bs", type=int, default=1)
    parser.add_argument("--programs", nargs="*")
    parser.add_argument("--json", default=None)
    parser.add_argument("--search-s", type=float, default=20.0)
    ns = parser.parse_args()
    config = mj.SearchConfig(time_budget_s=ns.search_s)
    rows = []
    with tempfile.TemporaryDirectory() as cache_dir:
        os.environ["MIRAGE_JAX_CACHE_DIR"] = cache_dir
        for program in programs.programs(ns.bs):
            if ns.programs and program.name not in ns.programs:
                continue
            rows.append(case(program, config))
            print(f"  {program.name}: step {rows[-1]['step_speedup']:.2f}x", file=sys.stderr)
    print_table(rows)
    if ns.json:
        Path(ns.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
