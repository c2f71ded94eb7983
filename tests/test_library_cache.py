"""Persistent decisions and kernel libraries, across processes."""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from racing import race

import mirage_jax as mj
from mirage_jax.errors import LibraryError
from mirage_jax.planner import decisions as cache
from mirage_jax.planner import library

SHAPES = [(4, 256), (256,), (256, 128)]
BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
# rmsnorm over 256 then a product over K = 256: float32 drifts by sum_rtol(256) at most
# (tests/tolerance.py; the children import neither the tests nor their helpers)
RTOL = 1.5e-5

# One process: plan rmsnorm_linear at SHAPES (argv[1]: a JSON of seed, strategy and an
# optional library, ready and go files), check it per element against jax.jit, print a report.
CHILD = textwrap.dedent(
    """
    import json, sys, time
    from pathlib import Path
    import numpy as np, jax
    import mirage_jax as mj
    import programs
    from mirage_jax.ir import Op
    from mirage_jax.planner import decisions as cache
    from mirage_jax.search import SearchConfig
    from mirage_jax.store import namespace
    from mirage_jax.backend.cpu.build import build_stats
    opts = json.loads(sys.argv[1])
    if opts.get("lib"):
        mj.load_library(opts["lib"])
    rng = np.random.default_rng(opts["seed"])
    args = [rng.standard_normal(s).astype(np.float32) for s in {shapes}]
    config = SearchConfig(workers=1, time_candidates=False, progress=False, max_tasks=4,
                          max_verify=6) if opts["strategy"] == "search" else None
    f = mj.optimize(programs.rmsnorm_linear, strategy=opts["strategy"], config=config,
                    require_speedup=False)
    if opts.get("ready"):
        Path(opts["ready"]).touch()
        while not Path(opts["go"]).exists():
            time.sleep(0.001)
    out = np.asarray(f(*args), np.float64)
    want = np.asarray(jax.jit(programs.rmsnorm_linear)(*args), np.float64)
    plan = f.plan(*args)
    region = plan.regions[0]
    typical = np.median(np.abs(want))
    print(json.dumps({{"source": region.source, "custom": region.impl is not None,
        "graph_def": bool(region.graph is not None and region.graph.nodes_of(Op.GRAPH_DEF)),
        "compiles": build_stats().compiles, "hits": cache.cache_stats().hits,
        "decision_corrupt": cache.cache_stats().corrupt,
        "kernel_corrupt": namespace("cpu").stats().corrupt,
        "err": float(np.max(np.abs(out - want) / (np.abs(want) + typical)))}}))
    """
).format(shapes=SHAPES)


def _argv(seed: int, strategy: str = "as_is", **extra: str) -> list[str]:
    return [sys.executable, "-c", CHILD, json.dumps({"seed": seed, "strategy": strategy, **extra})]


def run_child(env: dict[str, str], seed: int, lib: Path | None = None,
              strategy: str = "as_is") -> dict:  # fmt: skip
    extra = {"lib": str(lib)} if lib else {}
    done = subprocess.run(_argv(seed, strategy, **extra), capture_output=True, text=True, env=env,
                          timeout=300, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    result["log"] = done.stderr
    return result


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    # calibration off: a fresh cache would also compile the host probe, and these tests count
    # the kernel's compiles alone
    # the children import the benchmark programs (benchmarks/programs.py) by module name
    path = os.pathsep.join(filter(None, (str(BENCHMARKS), os.environ.get("PYTHONPATH"))))
    return {**os.environ, "MIRAGE_JAX_CACHE_DIR": str(tmp_path / "cache"),
            "MIRAGE_JAX_CALIBRATE": "0", "PYTHONPATH": path}  # fmt: skip


def _entries(env: dict[str, str], namespace: str, suffix: str) -> list[Path]:
    return sorted((Path(env["MIRAGE_JAX_CACHE_DIR"]) / namespace).rglob(f"*{suffix}"))


@pytest.mark.parametrize("strategy", ["as_is", "search"])
def test_second_process_reuses_the_decision_and_the_kernel(env, strategy):
    first = run_child(env, seed=1, strategy=strategy)
    assert first == {**first, "source": "search", "custom": True, "hits": 0}
    assert first["graph_def"] == (strategy == "search")  # the search fuses into one kernel
    assert first["compiles"] == 1 and first["err"] < RTOL
    second = run_child(env, seed=2, strategy=strategy)
    assert second["source"] == "cache" and second["custom"]
    assert second["graph_def"] == first["graph_def"]
    assert second["compiles"] == 0 and second["hits"] == 1 and second["err"] < RTOL


def test_concurrent_processes_share_one_cache(env, tmp_path):
    results = race(CHILD, lambda ready, go: _argv(0, ready=str(ready), go=str(go))[3:], tmp_path,
                   env=env)  # fmt: skip
    assert all(r["custom"] and r["err"] < RTOL for r in results)
    # the kernel is built once: the second process waits on the entry's lock and loads it
    assert sorted(r["compiles"] for r in results) == [0, 1], results
    assert len(_entries(env, "cpu", ".so")) == 1
    assert len(_entries(env, "decisions", ".json")) == 1
    third = run_child(env, seed=5)
    assert third["source"] == "cache" and third["compiles"] == 0 and third["hits"] == 1


def test_corrupt_decision_is_reported_deleted_and_rebuilt(tmp_path, caplog):
    kb = mj.ir.KernelBuilder()
    x = kb.input(mj.ir.TensorType((4, 4), mj.ir.F32))
    kb.output(kb.apply(mj.ir.Op.EXP, x))
    graph = kb.build()
    key = cache.decision_key(graph, backend="cpu")
    path = cache.store(key, cache.Decision(graph, "", 1e-6, 2e-6), root=tmp_path)
    assert cache.load(key, root=tmp_path).graph == graph
    for damage in (lambda t: t[: len(t) // 2], lambda t: t.replace("exp", "log"),
                   lambda t: t.replace('"format": 1', '"format": 99'), lambda t: ""):  # fmt: skip
        path.write_text(damage(path.read_text()))
        before = cache.cache_stats().corrupt
        assert cache.load(key, root=tmp_path) is None
        assert cache.cache_stats().corrupt == before + 1
        assert not path.exists() and "corrupt" in caplog.text
        path = cache.store(key, cache.Decision(graph, "", 1e-6, 2e-6), root=tmp_path)


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


# what is damaged in a populated cache -> (where the next process's decision comes from, its
# compiles, its corrupt decisions, its corrupt kernels)
DAMAGE = {
    "kernel_truncated": ("cpu", ".so", _truncate, ("cache", 1, 0, 1)),
    "kernel_record_garbled": ("cpu", ".json", lambda p: p.write_text("{"), ("cache", 1, 0, 1)),
    "decision_truncated": ("decisions", ".json", _truncate, ("search", 0, 1, 0)),
}


@pytest.fixture(scope="module")
def populated(tmp_path_factory) -> Path:
    """A cache that one process filled with rmsnorm_linear's decision and kernel."""
    root = tmp_path_factory.mktemp("populated")
    path = os.pathsep.join(filter(None, (str(BENCHMARKS), os.environ.get("PYTHONPATH"))))
    env = {**os.environ, "MIRAGE_JAX_CACHE_DIR": str(root / "cache"),
           "MIRAGE_JAX_CALIBRATE": "0", "PYTHONPATH": path}  # fmt: skip
    assert run_child(env, seed=1)["compiles"] == 1
    return root / "cache"


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_a_damaged_cache_entry_is_rebuilt_by_the_next_process(env, populated, damage):
    shutil.copytree(populated, env["MIRAGE_JAX_CACHE_DIR"])
    namespace, suffix, harm, expected = DAMAGE[damage]
    (entry,) = _entries(env, namespace, suffix)
    harm(entry)
    result = run_child(env, seed=3)
    got = (result["source"], result["compiles"], result["decision_corrupt"],
           result["kernel_corrupt"])  # fmt: skip
    assert got == expected, result["log"][-3000:]
    assert result["custom"] and result["err"] < RTOL
    assert "corrupt" in result["log"] and str(entry.with_suffix("")) in result["log"]
    again = run_child(env, seed=4)  # repaired: nothing is corrupt or compiled any more
    assert (again["source"], again["compiles"], again["decision_corrupt"],
            again["kernel_corrupt"]) == ("cache", 0, 0, 0)  # fmt: skip


@pytest.fixture(scope="module")
def precompiled(tmp_path_factory) -> Path:
    """rmsnorm_linear's kernel library (built once: cmake takes seconds); tests that damage
    it work on a copy (``library_copy``)."""
    root = tmp_path_factory.mktemp("precompiled")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MIRAGE_JAX_CACHE_DIR", str(root / "build-cache"))
        rng = np.random.default_rng(0)
        args = [rng.standard_normal(s).astype(np.float32) for s in SHAPES]
        import programs

        return mj.precompile(programs.rmsnorm_linear, args, root / "lib", strategy="as_is",
                             require_speedup=False, cache=False)  # fmt: skip


def library_copy(precompiled: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(precompiled, tmp_path / "lib"))


def test_library_precompile_then_load_in_a_fresh_process(precompiled, env):
    lib = precompiled
    manifest = json.loads((lib / "manifest.json").read_text())
    assert (lib / "CMakeLists.txt").exists() and (lib / "lib" / "libmirage_kernels.so").exists()
    assert manifest["regions"][0]["graph"].startswith("kernel {")
    result = run_child(env, seed=7, lib=lib)
    assert result["source"] == "library" and result["custom"]
    assert result["compiles"] == 0 and result["err"] < RTOL


def test_library_for_another_isa_or_version_or_damaged_is_refused(precompiled, tmp_path):
    lib = library_copy(precompiled, tmp_path)
    manifest_path = lib / "manifest.json"
    good_text = manifest_path.read_text()
    good = json.loads(good_text)
    for text, message in (
        (json.dumps({**good, "isa": "sse2-only"}), "built for ISA sse2-only"),
        (json.dumps({**good, "version": "0.0.1"}), "built by mirage_jax 0.0.1"),
        (good_text[: len(good_text) // 2], "manifest.json is corrupt"),
        (json.dumps({**good, "format": 99}), "manifest format 99"),
    ):
        manifest_path.write_text(text)
        with pytest.raises(LibraryError, match=message):
            mj.load_library(lib)
    manifest_path.write_text(good_text)
    (lib / "lib" / library.LIB_NAME).unlink()
    with pytest.raises(LibraryError, match="libmirage_kernels.so is missing"):
        mj.load_library(lib)
    with pytest.raises(LibraryError, match="no manifest.json"):
        mj.load_library(tmp_path)


LOAD = textwrap.dedent("""
    import sys
    import mirage_jax as mj
    try:
        mj.load_library(sys.argv[1])
    except mj.errors.MirageError as err:
        print(f"refused: {err.cause} | {err.remedy}")
    """)


def test_a_truncated_library_is_refused_not_a_crash(precompiled, tmp_path, env):
    lib = library_copy(precompiled, tmp_path)
    _truncate(lib / "lib" / library.LIB_NAME)
    # in a child: what the damage does to the loading process is the point
    done = subprocess.run([sys.executable, "-c", LOAD, str(lib)], capture_output=True,
                          text=True, env=env, timeout=120, check=False)  # fmt: skip
    assert done.returncode == 0, f"load_library died with {done.returncode}: {done.stderr[-2000:]}"
    assert "refused:" in done.stdout and library.LIB_NAME in done.stdout


def test_env_var_library_mismatch_falls_back_with_a_warning(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv(library.LIBRARY_ENV, str(tmp_path / "nothing-here"))
    monkeypatch.setattr(library, "_ENV_LOADED", False)
    with caplog.at_level(logging.WARNING):
        assert library.lookup("0" * 64) is None
    assert "not used" in caplog.text and "no manifest.json" in caplog.text


def test_show_cli_prints_regions_and_writes_dot(tmp_path, env):
    argv = [sys.executable, "-m", "mirage_jax", "show", "programs:rmsnorm_linear",
            "--shapes", "f32[4,256] f32[256] f32[256,128]", "--strategy", "as_is",
            "--dot", str(tmp_path)]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=300,
                          check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "region 0:" in done.stdout and "kernel {" in done.stdout
    assert (tmp_path / "region0.dot").read_text().startswith('digraph "μGraph"')


def test_cli_reports_bad_shapes_clearly(env):
    argv = [sys.executable, "-m", "mirage_jax", "show", "programs:rmsnorm_linear",
            "--shapes", "nonsense"]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=120,
                          check=False)
    assert done.returncode == 2 and "no shapes in 'nonsense'" in done.stderr
