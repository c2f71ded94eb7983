"""Starting two processes at the same instant, for the tests of concurrent cache use.

Each child is told (by its argv) a ready file to create once it has imported everything, and a
go file to wait for; ``race`` releases them together and returns the JSON each printed last.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import mirage_jax


def child_env() -> dict[str, str]:
    """The environment of a child that imports the same mirage_jax as this process."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(Path(mirage_jax.__file__).parents[1]), env.get("PYTHONPATH", "")]
    )
    return env


def race(script: str, args: Callable[[Path, Path], list[str]], tmp_path: Path, n: int = 2,
         env: dict[str, str] | None = None) -> list[dict[str, Any]]:  # fmt: skip
    """Run ``python -c script *args(ready_i, go)`` ``n`` times, released together."""
    go = tmp_path / "go"
    ready = [tmp_path / f"ready{i}" for i in range(n)]
    procs = [subprocess.Popen([sys.executable, "-c", script, *args(r, go)], env=env or child_env(),
                              cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for r in ready]  # fmt: skip
    deadline = time.monotonic() + 120
    while not all(r.exists() for r in ready):
        assert time.monotonic() < deadline, "children did not start"
        assert all(p.poll() is None for p in procs), [p.communicate() for p in procs]
        time.sleep(0.01)
    go.touch()
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        results.append(json.loads(out.strip().splitlines()[-1]))
    return results
