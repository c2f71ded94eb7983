"""Where a plan's time goes inside its program: each thunk's median time, beside jax.jit's.

A region can win its own comparison and still cost more in the program (a kernel that splits
over XLA's pool waits for a helper thread there, a weight comes from another cache level).
This runs a model case of ``models.py`` with its plan and with ``jax.jit`` under
``jax.profiler`` and prints, for each program, its thunks in the order they ran (fusions,
dots, copies, ``ffi_call.N`` for our custom calls) with their median times, and the program's
total.

    pip install '.[models]'
    python benchmarks/thunks.py [--model llama] [--d-model 256] [--dtype float32]
                                [--case decode] [--calls 200] [--keep-all]

``--keep-all`` plans with ``require_speedup=False``: every region that verifies becomes a
custom call, to see what each costs in the program whether or not the planner keeps it.
"""

from __future__ import annotations

import argparse
import collections
import re
import statistics
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import jax

import mirage_jax as mj


def thunk_times(fn: Callable, args: tuple, calls: int) -> list[tuple[str, float]]:
    """(thunk, median microseconds) of ``fn(*args)``'s program (a jitted callable), in the
    order they first ran. Thunks are the profiler's events named as an instruction of the
    compiled program: which thread runs them (the caller's for a program PjRt runs inline, a
    pool thread's otherwise) differs between programs."""
    hlo = fn.lower(*args).compile().as_text()
    names = set(re.findall(r"^\s*(?:ROOT )?%?([\w.-]+) = ", hlo, re.M))
    for _ in range(20):
        jax.block_until_ready(fn(*args))
    with tempfile.TemporaryDirectory() as logdir:
        with jax.profiler.trace(logdir):
            for _ in range(calls):
                jax.block_until_ready(fn(*args))
        (pb,) = Path(logdir).glob("**/*.xplane.pb")
        data = jax.profiler.ProfileData.from_file(str(pb))
    times: dict[str, list[float]] = collections.defaultdict(list)
    first: dict[str, int] = {}
    for plane in data.planes:
        for line in plane.lines:
            for event in line.events:
                if event.name in names:
                    times[event.name].append(event.duration_ns / 1e3)
                    first.setdefault(event.name, event.start_ns)
    return [(name, statistics.median(times[name])) for name in sorted(times, key=first.get)]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="llama", choices=("llama", "gpt2"))
    p.add_argument("--d-model", type=int, default=256)
    p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--case", default="", help="substring of the case name (e.g. decode)")
    p.add_argument("--calls", type=int, default=200)
    p.add_argument("--keep-all", action="store_true")
    a = p.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import models  # the [models] extra: flax

    makers = {"llama": models.llama_cases, "gpt2": models.gpt2_cases}
    for name, fn, args in makers[a.model](a.d_model, a.dtype, a.tokens):
        if a.case not in name:
            continue
        fast = mj.optimize(fn, require_speedup=not a.keep_all)
        plan = fast.plan(*args)
        print(f"== {name} ({sum(p.impl is not None for p in plan.regions)} custom calls)")
        rows = {"mirage_jax": thunk_times(plan.jitted, args, a.calls),
                "jax.jit": thunk_times(jax.jit(fn), args, a.calls)}  # fmt: skip
        for label, thunks in rows.items():
            print(f"  {label}: {sum(us for _, us in thunks):.1f} us in {len(thunks)} thunks")
            for thunk, us in thunks:
                print(f"    {us:9.2f} us  {thunk}")


if __name__ == "__main__":
    main()
