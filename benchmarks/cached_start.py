"""What a second process start costs: the six programs planned from the persistent cache.

For every program of ``programs.programs(bs)`` (``benchmarks/programs.py``), two fresh processes share one empty
cache directory: the first plans the program with the default strategy (search, compile,
verify, time against XLA), the second plans it again. The table gives, per process, where
the decision came from, how many kernels were compiled, and the planning time (tracing,
cache lookup and loading the kernel: mirage_jax's overhead before the first call), plus the
result's error against ``jax.jit``.

    python benchmarks/cached_start.py [--bs 1] [--programs lora ntrans]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CHILD = textwrap.dedent(
    """
    import json, sys, time
    import jax, numpy as np
    import mirage_jax as mj
    import programs
    from mirage_jax.backend.cpu.build import build_stats

    name, bs = sys.argv[1], int(sys.argv[2])
    program = {p.name: p for p in programs.programs(bs)}[name]
    args = program.call_args([jax.device_put(x) for x in programs.make_inputs(program, seed=1)])
    start = time.perf_counter()
    fast = mj.optimize(program.fn)
    plan = fast.plan(*args)
    planned = time.perf_counter() - start
    got = np.asarray(fast(*args))
    want = np.asarray(jax.jit(program.fn)(*args))
    print(json.dumps({
        "plan_s": planned, "compiles": build_stats().compiles,
        "sources": [r.source for r in plan.regions],
        "custom": [r.impl is not None for r in plan.regions],
        "err": float(np.max(np.abs(got - want)) / max(float(np.max(np.abs(want))), 1e-30)),
    }))
    """
)


def run(name: str, bs: int, env: dict[str, str]) -> dict:
    done = subprocess.run([sys.executable, "-c", CHILD, name, str(bs)], capture_output=True,
                          text=True, env=env, timeout=900)  # fmt: skip
    if done.returncode != 0:
        raise SystemExit(f"{name} bs={bs} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bs", type=int, default=1)
    parser.add_argument("--programs", nargs="*")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(ROOT))  # the source tree, not an older installed copy
    import programs

    names = args.programs or [p.name for p in programs.programs(args.bs)]
    print(f"{'program':16} {'bs':>2} | {'1st: source':>12} {'compiles':>8} {'plan s':>7} | "
          f"{'2nd: source':>12} {'compiles':>8} {'plan s':>7} | {'rel err':>8}")  # fmt: skip
    worst = 0.0
    for name in names:
        with tempfile.TemporaryDirectory() as cache_dir:
            env = {**os.environ, "MIRAGE_JAX_CACHE_DIR": cache_dir,
                   "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "benchmarks"),
                                                  os.environ.get("PYTHONPATH", "")])}
            first, second = run(name, args.bs, env), run(name, args.bs, env)
        worst = max(worst, second["plan_s"])
        print(f"{name:16} {args.bs:>2} | {','.join(first['sources']):>12} {first['compiles']:>8} "
              f"{first['plan_s']:>7.2f} | {','.join(second['sources']):>12} "
              f"{second['compiles']:>8} {second['plan_s']:>7.2f} | {second['err']:>8.1e}")
    print(f"\nslowest second start: {worst:.2f} s of planning")
    return 0


if __name__ == "__main__":
    sys.exit(main())
