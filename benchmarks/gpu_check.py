"""Check and time the six suite programs on an NVIDIA GPU with the CUDA backend vs jax.jit.

For every program of ``programs.programs(bs)`` (``benchmarks/programs.py``) (bs = 1 and 8 by default):

- ``regions``: the program traced and cut into regions (``mirage_jax.frontend.trace``); every
  region's kernel graph compiled as is with the CUDA backend (kernel-level ops as simple
  kernels) and run through ``TracedProgram.run`` inside ``jax.jit``;
- ``fused``: for rmsnorm_linear, gated_mlp and gqa_decode, Mirage's hand-built fused μGraphs
  (``tests/graphs.py``) over a few grid / for-loop choices; infeasible ones are rejected by
  the GPU cost model (``mirage_jax.backend.cuda.cost``), the best three by its estimate are
  built and timed;
- ``search`` (with ``--search``): the superoptimizer's μGraph of each region, ranked by the
  CUDA backend's cost model.

Every candidate is compared with ``jax.jit`` of the program on the same inputs (tolerance from
``mirage_jax.interpret.numerics``) and timed against it in the same process. All nvcc builds run
concurrently up front. Prints one table; exits 1 if any candidate ran but gave a wrong
answer, 2 if there is no GPU. ``benchmarks/gpu_check.sh`` is the entry point.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import time
import traceback
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the source tree, not an older installed copy

import jax  # noqa: E402
import numpy as np  # noqa: E402

import programs  # noqa: E402
from mirage_jax.backend.cuda.emit import emit_cuda  # noqa: E402
from mirage_jax.backend.cuda.build import build_cuda  # noqa: E402
from mirage_jax.errors import MirageError  # noqa: E402
from mirage_jax.frontend import trace  # noqa: E402
from mirage_jax.ir import KernelGraph  # noqa: E402
from mirage_jax.interpret.numerics import FLOAT_TOLERANCE as TOLERANCE  # noqa: E402
from mirage_jax.runtime import cuda as rt  # noqa: E402
from mirage_jax.backend.cuda import cost as gpu_cost  # noqa: E402
from mirage_jax.backend.cuda.backend import CudaBackend  # noqa: E402
from mirage_jax.planner.search import superoptimize  # noqa: E402
from mirage_jax.timing import compare  # noqa: E402


def _load_graphs():
    spec = importlib.util.spec_from_file_location("mj_graphs", ROOT / "tests" / "graphs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


G = _load_graphs()


@dataclass
class Candidate:
    program: str
    bs: int
    label: str
    graphs: list[KernelGraph]  # built and registered before make() runs
    make: Callable[[list[Callable[..., Any]]], Callable[..., Any]]  # impls -> program fn
    estimate_s: float | None = None
    libs: list[Path] = field(default_factory=list)
    status: str = "ok"
    err: float | None = None
    mirage_s: float | None = None
    xla_s: float | None = None


# ------------------------------------------------------------------------ fused candidates


def _fused_graphs(name: str, shapes: tuple[tuple[int, ...], ...]) -> list[tuple[str, Any, Any]]:
    """(label, graph, wrapper(impl) -> program fn) for the hand-fused μGraphs of a program."""
    out = []
    if name == "rmsnorm_linear":
        (m, h), _, (_, n) = shapes
        for gx, loop in ((96, 64), (192, 32), (192, 64), (384, 16), (48, 64)):
            g = G.rmsnorm_linear_fused(m, h, n, grid=(gx, 1), loop=loop)
            out.append((f"fused grid={gx} loop={loop}", g,
                        lambda f: lambda x, gain, w: f(x, gain.reshape(1, -1), w)[0]))
    elif name == "gated_mlp":
        (m, k), (_, n), _ = shapes
        for gx, loop in ((64, 64), (128, 32), (128, 64), (32, 64), (256, 16)):
            g = G.gated_mlp_fused(m, k, n, grid=(gx, 1), loop=loop, thread=True)
            out.append((f"fused grid={gx} loop={loop}", g, lambda f: lambda *a: f(*a)[0]))
    elif name == "gqa_decode":
        (b, m, d), (_, _, n), _ = shapes
        for rb, loop in ((8, 64), (16, 64), (32, 64), (16, 32), (32, 128)):
            g = G.attention_fused(b, m, d, n, row_blocks=rb, loop=loop)
            out.append((f"flash rows={rb} loop={loop}", g, lambda f: lambda *a: f(*a)[0]))
        for splits, loop in ((4, 16), (8, 8), (16, 4)):
            g = G.flash_decoding_split(b, m, d, n, splits=splits, loop=loop)
            out.append((f"flashdecoding splits={splits} loop={loop}", g,
                        lambda f: lambda *a: f(*a)[0]))
    return out


def candidates_for(program: programs.Program, bs: int, inputs: list[Any], search: bool,
                   top: int) -> list[Candidate]:  # fmt: skip
    cands: list[Candidate] = []
    traced = trace(program.fn, *program.call_args(inputs))
    if traced.regions:
        def make_regions(impls, traced=traced):
            table = dict(zip((r.index for r in traced.regions), impls))
            return lambda *args: traced.run(*args, region_impls=table)

        graphs = [r.graph for r in traced.regions]
        cands.append(Candidate(program.name, bs, f"regions x{len(graphs)}", graphs,
                               make_regions, sum(gpu_cost.estimate(g).time_s for g in graphs)))
        if search:
            cands += _search_candidates(program, bs, traced)
    fused = []
    for label, g, wrap in _fused_graphs(program.name, program.shapes):
        cost = gpu_cost.estimate(g)
        if not cost.feasible:
            print(f"  {program.name} bs={bs} {label}: rejected by the cost model: {cost.reason}")
            continue
        fused.append(Candidate(program.name, bs, label, [g],
                               lambda impls, wrap=wrap: wrap(impls[0]), cost.time_s))
    fused.sort(key=lambda c: c.estimate_s)
    return cands + fused[:top]


def _search_candidates(program: programs.Program, bs: int, traced: Any) -> list[Candidate]:
    graphs = []
    for r in traced.regions:
        try:
            graphs.append(superoptimize(r.graph, backend=CudaBackend()).best)
        except MirageError as err:
            print(f"  {program.name} region {r.index}: search failed: {err.cause}")
            graphs.append(r.graph)

    def make(impls):
        table = dict(zip((r.index for r in traced.regions), impls))
        return lambda *args: traced.run(*args, region_impls=table)

    return [Candidate(program.name, bs, "search", graphs, make)]


# ---------------------------------------------------------------------------------- running


def build_all(cands: list[Candidate], arch: str, jobs: int, kind: str = "shared") -> None:
    """Emit and nvcc-build every graph of every candidate, concurrently."""
    work = {}
    for c in cands:
        for g in c.graphs:
            symbol = CudaBackend.symbol_prefix + g.fingerprint()[:24]  # as the backend names it
            work.setdefault(symbol, (emit_cuda(g, symbol), symbol))
    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        futures = {s: pool.submit(build_cuda, src, arch=arch, kind=kind, name_hint=s)
                   for s, (src, _) in work.items()}  # fmt: skip
        for s, f in futures.items():
            try:
                f.result()
            except MirageError as err:
                print(f"  build {s} failed: {err.cause[:2000]}")
    print(f"built {len(work)} libraries in {time.perf_counter() - t0:.1f} s ({jobs} jobs)")


def max_error(got: Any, want: Any) -> tuple[float, float]:
    """The largest error over all output leaves, and the tolerance it is held to."""
    err, tol = 0.0, np.inf
    for g, w in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
        g64, w64 = np.asarray(g, np.float64), np.asarray(w, np.float64)
        name = {"float16": "f16", "bfloat16": "bf16", "float64": "f64"}.get(
            np.asarray(w).dtype.name, "f32")  # fmt: skip
        if g64.shape != w64.shape:
            return np.inf, 0.0
        err = max(err, float(np.max(np.abs(g64 - w64))))
        tol = min(tol, TOLERANCE[name] * max(1.0, float(np.max(np.abs(w64)))))
    return err, tol


def run_candidate(c: Candidate, xla: Callable[..., Any], args: tuple[Any, ...],
                  want: Any, arch: str) -> None:  # fmt: skip
    try:
        impls = [CudaBackend(arch=arch).compile(g) for g in c.graphs]
        fn = jax.jit(c.make(impls))
        got = jax.block_until_ready(fn(*args))
    except Exception as err:  # noqa: BLE001 - report and continue with the next candidate
        c.status = f"failed: {type(err).__name__}: {str(err).splitlines()[0][:120]}"
        traceback.print_exc(limit=3)
        return
    c.err, tol = max_error(got, want)
    if not np.isfinite(c.err) or c.err > tol:
        c.status = f"WRONG (max error {c.err:.3g} > {tol:.3g})"
        return
    c.mirage_s, c.xla_s = compare(fn, xla, args)


def print_table(cands: list[Candidate]) -> None:
    head = f"{'program':<16}{'bs':>3}  {'candidate':<34}{'model us':>9}{'xla us':>9}" \
           f"{'mirage us':>10}{'speedup':>9}  status"  # fmt: skip
    print("\n" + head + "\n" + "-" * len(head))
    for c in cands:
        est = f"{c.estimate_s * 1e6:9.1f}" if c.estimate_s and np.isfinite(c.estimate_s) else \
            f"{'-':>9}"  # fmt: skip
        if c.mirage_s:
            times = f"{c.xla_s * 1e6:9.1f}{c.mirage_s * 1e6:10.1f}{c.xla_s / c.mirage_s:8.2f}x"
        else:
            times = f"{'-':>9}{'-':>10}{'-':>9}"
        print(f"{c.program:<16}{c.bs:>3}  {c.label:<34}{est}{times}  {c.status}")
    print("\nbest per program:")
    best: dict[tuple[str, int], Candidate] = {}
    for c in cands:
        key = (c.program, c.bs)
        if c.mirage_s and (key not in best or c.mirage_s < best[key].mirage_s):
            best[key] = c
    for (name, bs), c in sorted(best.items()):
        print(f"  {name:<16} bs={bs}: {c.xla_s / c.mirage_s:5.2f}x vs jax.jit ({c.label})")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bs", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--programs", nargs="*", help="only these suite programs")
    ap.add_argument("--top", type=int, default=3, help="fused configurations timed per program")
    ap.add_argument("--search", action="store_true", help="also time the superoptimizer's graph")
    ap.add_argument("--jobs", type=int, default=min(16, os.cpu_count() or 4))
    ap.add_argument("--budget-s", type=float, default=420.0, help="stop timing after this")
    ap.add_argument("--dry-run", action="store_true",
                    help="no GPU: trace, plan and compile kernel-only objects, run nothing")
    args = ap.parse_args(argv)
    if args.dry_run:
        return dry_run(args)
    if not rt.gpu_available():
        print("no CUDA GPU visible to jax: install jax[cuda12] on a machine with an NVIDIA GPU")
        return 2
    start = time.perf_counter()
    arch = rt.device_arch()
    dev = jax.devices("gpu")[0]
    print(f"device: {dev.device_kind}, arch {arch}, jax {jax.__version__}")
    cands, inputs = [], {}
    for bs in args.bs:
        for p in programs.programs(bs):
            if args.programs and p.name not in args.programs:
                continue
            xs = [jax.device_put(x, dev) for x in programs.make_inputs(p, seed=bs)]
            inputs[(p.name, bs)] = (p, xs)
            cands += candidates_for(p, bs, xs, args.search, args.top)
    build_all(cands, arch, args.jobs)
    for (name, bs), (p, xs) in inputs.items():
        call_args = p.call_args(xs)
        xla = jax.jit(p.fn)
        want = jax.block_until_ready(xla(*call_args))
        for c in (c for c in cands if (c.program, c.bs) == (name, bs)):
            if time.perf_counter() - start > args.budget_s:
                c.status = "skipped (time budget)"
                continue
            run_candidate(c, xla, call_args, want, arch)
            print(f"  {name} bs={bs} {c.label}: {c.status}", flush=True)
    print_table(cands)
    print(f"\ntotal {time.perf_counter() - start:.0f} s")
    return 1 if any(c.status.startswith("WRONG") for c in cands) else 0


def dry_run(args: argparse.Namespace) -> int:
    """Everything that needs no GPU: candidates, cost-model estimates, nvcc kernel builds."""
    cands = []
    for bs in args.bs:
        for p in programs.programs(bs):
            if not args.programs or p.name in args.programs:
                xs = programs.make_inputs(p, seed=bs)
                cands += candidates_for(p, bs, xs, args.search, args.top)
    build_all(cands, "sm_90a", args.jobs, kind="cubin")
    for c in cands:
        c.status = "built (dry run)"
    print_table(cands)
    return 0


if __name__ == "__main__":
    sys.exit(main())
