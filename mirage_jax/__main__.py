"""Command line: ``python -m mirage_jax {precompile,show,bench}``.

    python -m mirage_jax show mymodel:rmsnorm_linear --shapes "f32[2,4096] f32[4096] f32[4096,6144]"
    python -m mirage_jax precompile MODULE:FUNCTION --shapes "..." -o mylib
    python -m mirage_jax precompile MODULE:FUNCTION --shapes "..." -o mylib --dask local:8
    python -m mirage_jax bench [--bs 1 8] [--json out.json]
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import logging
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np

from mirage_jax.api import optimize, precompile
from mirage_jax.errors import MirageError
from mirage_jax.ir import DType
from mirage_jax.ir.dot import to_dot, to_svg
from mirage_jax.planner.cluster import dask_cluster
from mirage_jax.search import SearchConfig

_SHAPE = re.compile(r"(f16|bf16|f32|f64)\[([\d,\s]*)\]")


def parse_shapes(text: str) -> list[tuple[tuple[int, ...], DType]]:
    """``"f32[2,4096] f32[4096]"`` -> [((2, 4096), F32), ((4096,), F32)]."""
    found = [(tuple(int(d) for d in dims.split(",") if d.strip()), DType(dt))
             for dt, dims in _SHAPE.findall(text)]  # fmt: skip
    if not found:
        raise MirageError(f"no shapes in {text!r}", remedy='write them like "f32[16,4096] f32[4096]"')
    return found


def load_function(spec: str) -> Any:
    module, _, name = spec.partition(":")
    if not name:
        raise MirageError(f"{spec!r} is not MODULE:FUNCTION", remedy="e.g. mymodel:forward")
    sys.path.insert(0, str(Path.cwd()))
    fn = getattr(importlib.import_module(module), name, None)
    if fn is None:
        raise MirageError(f"module {module} has no function {name}")
    return getattr(fn, "fn", fn)  # accept suite Programs and @optimize'd functions


def example_args(shapes: list[tuple[tuple[int, ...], DType]], seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(s).astype(dt.numpy) for s, dt in shapes]


def _show(args: argparse.Namespace) -> None:
    fn = optimize(load_function(args.function), strategy=args.strategy)
    plan = fn.plan(*example_args(parse_shapes(args.shapes)))
    print(plan.report())
    for region in plan.regions:
        graph = region.graph or region.target
        print(f"\n== region {region.index}: μGraph\n{graph}")
        if region.search_report is not None:
            print(region.search_report)
        if args.dot:
            out = Path(args.dot)
            out.mkdir(parents=True, exist_ok=True)
            (out / f"region{region.index}.dot").write_text(to_dot(graph))
            svg = to_svg(graph)
            if svg:
                (out / f"region{region.index}.svg").write_text(svg)
            print(f"wrote {out}/region{region.index}.dot" + (" and .svg" if svg else ""))


def _precompile(args: argparse.Namespace) -> None:
    fn = load_function(args.function)
    with _cluster(args.dask) as executor:
        # one search task per worker thread in flight, as the local pool has one per process
        config = SearchConfig(workers=executor.nthreads) if executor is not None else None
        out = precompile(fn, example_args(parse_shapes(args.shapes)), args.output,
                         strategy=args.strategy, executor=executor, config=config)  # fmt: skip
    print(f"kernel library written to {out}")


@contextlib.contextmanager
def _cluster(spec: str | None) -> Any:
    """The Dask executor ``--dask`` names (None: the local process pool)."""
    if not spec:
        yield None
        return
    with dask_cluster(spec) as executor:
        refused = "".join(f"\n  refused {w}: {why}" for w, why in executor.refused.items())
        print(f"searching on {len(executor.workers)} Dask worker(s), {executor.nthreads} "
              f"thread(s){refused}", file=sys.stderr)  # fmt: skip
        yield executor


def _bench(args: argparse.Namespace) -> None:
    script = Path(__file__).resolve().parent.parent / "benchmarks" / "run.py"
    if not script.exists():
        raise MirageError(f"{script} not found",
                          remedy="run from a source checkout of mirage_jax")  # fmt: skip
    sys.exit(subprocess.call([sys.executable, str(script), *args.rest]))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m mirage_jax")
    parser.add_argument("-v", "--verbose", action="store_true")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, help_ in (("show", "trace, optimize and show the μGraphs"),
                        ("precompile", "search and write a kernel library")):  # fmt: skip
        p = sub.add_parser(name, help=help_)
        p.add_argument("function", help="MODULE:FUNCTION")
        p.add_argument("--shapes", required=True, help='e.g. "f32[16,4096] f32[4096]"')
        p.add_argument("--strategy", default="search", choices=("search", "as_is", "xla"))
        if name == "show":
            p.add_argument("--dot", help="directory for Graphviz .dot (and .svg) pictures")
        else:
            p.add_argument("-o", "--output", required=True, help="library directory")
            p.add_argument("--dask", metavar="ADDRESS",
                           help="search on a Dask cluster: a scheduler address "
                           "(tcp://host:8786), or local:N for a LocalCluster of N worker "
                           "processes for this run (needs mirage-jax[dask])")  # fmt: skip
    bench = sub.add_parser("bench", help="run benchmarks/run.py against jax.jit")
    bench.add_argument("rest", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING)
    if not args.verbose:  # dask configures distributed's loggers at INFO when it is imported
        os.environ.setdefault("DASK_LOGGING__DISTRIBUTED", "warning")
    try:
        {"show": _show, "precompile": _precompile, "bench": _bench}[args.command](args)
    except MirageError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
