"""``@optimize`` where users run code, checked in fresh interpreters (issue 25, items 4-5).

Worker processes: a script with no ``if __name__ == "__main__":`` guard, the same code through
``python -c`` and on standard input each run a search on a real process pool (``workers=2``)
and must print the right numbers; before, the pool's workers ran the user's ``__main__``
again (the no-guard script died with multiprocessing's bootstrapping error, code on stdin with
BrokenProcessPool after FileNotFoundError '<stdin>').

Logging: with ``logging.basicConfig(level=logging.INFO)`` a search prints one line per region
from mirage_jax and nothing from the libraries it drives (egglog printed ~1,200 lines);
``MIRAGE_JAX_DEBUG=1`` brings the detail back.

The interpreters share a fresh cache directory (compiled kernels) but not decisions
(``cache=False``), so each one searches; the built-in host rates (``MIRAGE_JAX_CALIBRATE=0``), a
small LoRA, a task budget and no candidate timing keep each run to seconds. The no-guard script
runs once, with INFO logging, for both kinds of check.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import mirage_jax

SHAPES = [(16, 64), (64, 128), (64, 8), (8, 128)]

# module-level code only, no __main__ guard: what a user types into a script or a terminal
USER_CODE = textwrap.dedent(f"""
    import json, logging, os
    if os.environ.get("TEST_LOG_INFO"):
        logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    import jax, jax.numpy as jnp, numpy as np
    import mirage_jax as mj
    from mirage_jax.search import SearchConfig

    def lora(x, w, a, b):
        return x @ w + (x @ a) @ b

    rng = np.random.default_rng(int(os.environ["TEST_SEED"]))
    args = [jnp.asarray(rng.standard_normal(s, dtype=np.float32)) for s in {SHAPES!r}]
    config = SearchConfig(time_budget_s=60, workers=int(os.environ["TEST_WORKERS"]),
                          max_tasks=60, time_candidates=False, progress=False)
    fast = mj.optimize(lora, config=config, cache=False, require_speedup=False)
    print("== first call", flush=True)
    first = jax.jit(lambda *a: fast(*a)) if os.environ.get("TEST_IN_JIT") else fast
    got = np.asarray(first(*args))
    print("== done", flush=True)
    plan = fast.plan(*args)
    print("RESULT " + json.dumps({{
        "got": got.tolist(),
        "jit": np.asarray(jax.jit(lora)(*args)).tolist(),
        "regions": len(plan.regions),
        "custom_calls": sum(r.impl is not None for r in plan.regions),
        "tasks_run": [r.search_report.tasks_run for r in plan.regions if r.search_report],
        "processes": [r.search_report.workers for r in plan.regions if r.search_report],
    }}))
""")


def _run(how: str, workdir: Path, cache: Path, seed: int, workers: int = 2, **env: str
         ) -> tuple[dict, str]:  # fmt: skip
    # the pool starts with the first block task (by default only once they have taken 2 s)
    environ = {**os.environ, "MIRAGE_JAX_CACHE_DIR": str(cache), "MIRAGE_JAX_CALIBRATE": "0",
               "MIRAGE_JAX_POOL_AFTER_S": "0", "TEST_SEED": str(seed),
               "TEST_WORKERS": str(workers), **env}  # fmt: skip
    if "MIRAGE_JAX_DEBUG" not in env:
        environ.pop("MIRAGE_JAX_DEBUG", None)
    # the interpreter imports the mirage_jax this test imported
    root = str(Path(mirage_jax.__file__).resolve().parents[1])
    environ["PYTHONPATH"] = os.pathsep.join(filter(None, [root, environ.get("PYTHONPATH")]))
    stdin = None
    if how == "script":
        (workdir / "user_script.py").write_text(USER_CODE)
        cmd = [sys.executable, "user_script.py"]
    elif how == "-c":
        cmd = [sys.executable, "-c", USER_CODE]
    else:
        cmd = [sys.executable, "-"]
        stdin = USER_CODE
    proc = subprocess.run(cmd, cwd=workdir, env=environ, input=stdin, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=300, check=False)  # fmt: skip
    out = proc.stdout
    assert proc.returncode == 0, f"{how} exited {proc.returncode}:\n{out[-4000:]}"
    assert "BrokenProcessPool" not in out and "bootstrapping phase" not in out, out[-4000:]
    line = next(s for s in out.splitlines() if s.startswith("RESULT "))
    return json.loads(line[len("RESULT "):]), out


def _reference(seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x, w, a, b = (rng.standard_normal(s, dtype=np.float32).astype(np.float64) for s in SHAPES)
    return x @ w + (x @ a) @ b


def _fresh_seed() -> int:
    return int(np.random.SeedSequence().entropy % 2**31)


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("cache")


@pytest.fixture(scope="module")
def script_run(tmp_path_factory: pytest.TempPathFactory, cache: Path
               ) -> tuple[int, dict, str]:  # fmt: skip
    """The no-guard script, as examples/quickstart.py configures logging (INFO)."""
    seed = _fresh_seed()
    result, out = _run("script", tmp_path_factory.mktemp("script"), cache, seed,
                       TEST_LOG_INFO="1")  # fmt: skip
    return seed, result, out


@pytest.mark.parametrize("how, in_jit", [("script", False), ("-c", True), ("stdin", False)],
                         ids=["no-guard script", "python -c, first call in jax.jit",
                              "python - (stdin)"])  # fmt: skip
def test_search_runs_its_pool_from_user_code(how: str, in_jit: bool, tmp_path: Path,
                                             cache: Path, request: pytest.FixtureRequest,
                                             ) -> None:  # fmt: skip
    if how == "script":
        seed, result, out = request.getfixturevalue("script_run")
    else:
        seed = _fresh_seed()
        result, out = _run(how, tmp_path, cache, seed, **({"TEST_IN_JIT": "1"} if in_jit else {}))
    got, jit = np.asarray(result["got"]), np.asarray(result["jit"])
    want = _reference(seed)
    scale = np.max(np.abs(want))
    assert np.max(np.abs(got - jit)) <= 1e-4 * scale, f"seed {seed}: differs from jax.jit"
    assert np.max(np.abs(got - want)) <= 1e-4 * scale, f"seed {seed}: differs from float64"
    # the search ran its enumeration tasks on the pool's two processes and kept its winner
    assert result["tasks_run"] and min(result["tasks_run"]) > 0, out[-4000:]
    assert result["processes"] == [2], out[-4000:]
    assert result["custom_calls"] == result["regions"] == 1, out[-4000:]


_RECORD = re.compile(r"^(DEBUG|INFO|WARNING|ERROR|CRITICAL) (\S+): ", re.MULTILINE)


def _records(out: str) -> list[tuple[str, str]]:
    """(level, logger) of every log line printed during the first call (before it, jax's
    one-time backend message belongs to the user's own jax use)."""
    during = out.split("== first call", 1)[1].split("== done", 1)[0]
    return _RECORD.findall(during)


def test_info_logging_shows_one_line_per_region_and_no_library_internals(
    script_run: tuple[int, dict, str],
) -> None:
    _, result, out = script_run
    records = _records(out)
    ours = [r for r in records if r[1] == "mirage_jax" or r[1].startswith("mirage_jax.")]
    theirs = [r for r in records if r not in ours]
    assert not theirs, f"other libraries logged during the search: {sorted(set(theirs))}"
    assert 1 <= len([r for r in ours if r[0] == "INFO"]) <= result["regions"], ours
    assert not [r for r in ours if r[0] == "DEBUG"], ours


def test_mirage_jax_debug_shows_the_detail(tmp_path: Path, cache: Path) -> None:
    _, out = _run("script", tmp_path, cache, _fresh_seed(), workers=1, TEST_LOG_INFO="1",
                  MIRAGE_JAX_DEBUG="1")  # fmt: skip
    records = _records(out)
    assert ("DEBUG", "mirage_jax.search") in records, sorted(set(records))
    # egglog's rule and command logs, from the saturation in this process (workers=1)
    assert any(name.split(".")[0].startswith("egglog") for _, name in records), \
        sorted(set(records))  # fmt: skip


AFTER_A_SEARCH = textwrap.dedent("""
    import logging
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    from egglog import EGraph, i64
    from mirage_jax.search.abstract_terms import SaturationBudget, Term
    from mirage_jax.search.egraph import saturate

    x, y = Term("var", (), 0), Term("var", (), 1)
    print("== first call", flush=True)
    saturate([Term("mul", (x, y))], SaturationBudget())
    print("== done", flush=True)
    loggers = [lg for name, lg in logging.root.manager.loggerDict.items()
               if name.startswith("egglog") and isinstance(lg, logging.Logger)]
    print("UNTOUCHED", all(lg.level == logging.NOTSET and lg.propagate and not lg.handlers
                           for lg in loggers), len(loggers), flush=True)
    EGraph().extract(i64(1) + i64(2))
""")


def test_egglog_logging_is_the_users_again_after_a_search(tmp_path: Path) -> None:
    """Quieting egglog during a saturation leaves its loggers as they were, and the user's own
    egglog calls afterwards log as configured (a level raised during the first record of an
    egglog module would stay cached in pyo3-log and silence that module for good)."""
    environ = {k: v for k, v in os.environ.items() if k != "MIRAGE_JAX_DEBUG"}
    root = str(Path(mirage_jax.__file__).resolve().parents[1])
    environ["PYTHONPATH"] = os.pathsep.join(filter(None, [root, environ.get("PYTHONPATH")]))
    proc = subprocess.run([sys.executable, "-c", AFTER_A_SEARCH], cwd=tmp_path, env=environ,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=120, check=False)  # fmt: skip
    out = proc.stdout
    assert proc.returncode == 0, out[-4000:]
    assert not _records(out), out[-4000:]
    assert re.search(r"^UNTOUCHED True [1-9]", out, re.MULTILINE), out[-4000:]
    after = out.split("UNTOUCHED", 1)[1]
    assert ("INFO", "egglog") in _RECORD.findall(after), out[-4000:]
