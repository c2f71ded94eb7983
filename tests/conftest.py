"""Shared test setup: the benchmark programs (``benchmarks/programs.py``) and the test graphs
(``tests/graphs.py``) are importable as top-level modules; pytest's importlib mode puts
neither directory on ``sys.path`` by itself."""

from __future__ import annotations

import sys
from pathlib import Path

_ROOT = Path(__file__).resolve().parents[1]
for _dir in (_ROOT / "benchmarks", _ROOT / "tests"):
    if str(_dir) not in sys.path:
        sys.path.insert(0, str(_dir))
