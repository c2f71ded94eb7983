"""Persistent decisions and kernel libraries, across processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import mirage_jax as mj
from mirage_jax.errors import LibraryError
from mirage_jax.planner import decisions as cache
from mirage_jax.planner import library

SHAPES = [(4, 256), (256,), (256, 128)]
BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"

CHILD = textwrap.dedent(
    """
    import json, sys
    import numpy as np, jax
    import mirage_jax as mj
    import programs
    from mirage_jax.planner import decisions as cache
    from mirage_jax.backend.cpu.build import build_stats
    if len(sys.argv) > 2:
        mj.load_library(sys.argv[2])
    rng = np.random.default_rng(int(sys.argv[1]))
    args = [rng.standard_normal(s).astype(np.float32) for s in {shapes}]
    f = mj.optimize(programs.rmsnorm_linear, strategy="as_is", require_speedup=False)
    out = np.asarray(f(*args))
    want = np.asarray(jax.jit(programs.rmsnorm_linear)(*args))
    plan = f.plan(*args)
    print(json.dumps({{"source": plan.regions[0].source, "custom": plan.regions[0].impl is not None,
        "compiles": build_stats().compiles, "hits": cache.cache_stats().hits,
        "err": float(np.max(np.abs(out - want)) / np.max(np.abs(want)))}}))
    """
).format(shapes=SHAPES)


def run_child(env: dict[str, str], seed: int, lib: Path | None = None) -> dict:
    argv = [sys.executable, "-c", CHILD, str(seed)] + ([str(lib)] if lib else [])
    done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    # calibration off: a fresh cache would also compile the host probe, and these tests count
    # the kernel's compiles alone
    # the children import the benchmark programs (benchmarks/programs.py) by module name
    path = os.pathsep.join(filter(None, (str(BENCHMARKS), os.environ.get("PYTHONPATH"))))
    return {**os.environ, "MIRAGE_JAX_CACHE_DIR": str(tmp_path / "cache"),
            "MIRAGE_JAX_CALIBRATE": "0", "PYTHONPATH": path}  # fmt: skip


def test_second_process_reuses_the_decision_and_the_kernel(env):
    first = run_child(env, seed=1)
    assert first == {**first, "source": "search", "custom": True, "hits": 0}
    assert first["compiles"] == 1 and first["err"] < 1e-5
    second = run_child(env, seed=2)
    assert second["source"] == "cache" and second["custom"]
    assert second["compiles"] == 0 and second["hits"] == 1 and second["err"] < 1e-5


def test_concurrent_processes_share_one_cache(env):
    argv = [sys.executable, "-c", CHILD]
    procs = [subprocess.Popen(argv + [str(s)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, env=env) for s in (3, 4)]  # fmt: skip
    results = []
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err[-3000:]
        results.append(json.loads(out.strip().splitlines()[-1]))
    assert all(r["custom"] and r["err"] < 1e-5 for r in results)
    assert sum(r["compiles"] for r in results) <= 2
    assert run_child(env, seed=5)["compiles"] == 0


def test_corrupt_entry_is_reported_deleted_and_rebuilt(tmp_path, caplog):
    kb = mj.ir.KernelBuilder()
    x = kb.input(mj.ir.TensorType((4, 4), mj.ir.F32))
    kb.output(kb.apply(mj.ir.Op.EXP, x))
    graph = kb.build()
    key = cache.decision_key(graph, backend="cpu")
    path = cache.store(key, cache.Decision(graph, "", 1e-6, 2e-6), root=tmp_path)
    assert cache.load(key, root=tmp_path).graph == graph
    for damage in (lambda t: t[: len(t) // 2], lambda t: t.replace("exp", "log")):
        path.write_text(damage(path.read_text()))
        before = cache.cache_stats().corrupt
        assert cache.load(key, root=tmp_path) is None
        assert cache.cache_stats().corrupt == before + 1
        assert not path.exists() and "corrupt" in caplog.text
        path = cache.store(key, cache.Decision(graph, "", 1e-6, 2e-6), root=tmp_path)


def _precompile(out: Path, env_dir: Path) -> Path:
    os.environ["MIRAGE_JAX_CACHE_DIR"] = str(env_dir)
    try:
        rng = np.random.default_rng(0)
        args = [rng.standard_normal(s).astype(np.float32) for s in SHAPES]
        import programs

        return mj.precompile(programs.rmsnorm_linear, args, out, strategy="as_is",
                             require_speedup=False, cache=False)  # fmt: skip
    finally:
        os.environ.pop("MIRAGE_JAX_CACHE_DIR")


def test_library_precompile_then_load_in_a_fresh_process(tmp_path, env):
    lib = _precompile(tmp_path / "lib", tmp_path / "build-cache")
    manifest = json.loads((lib / "manifest.json").read_text())
    assert (lib / "CMakeLists.txt").exists() and (lib / "lib" / "libmirage_kernels.so").exists()
    assert manifest["regions"][0]["graph"].startswith("kernel {")
    result = run_child(env, seed=7, lib=lib)
    assert result["source"] == "library" and result["custom"]
    assert result["compiles"] == 0 and result["err"] < 1e-5


def test_library_for_another_isa_or_version_is_refused(tmp_path):
    lib = _precompile(tmp_path / "lib", tmp_path / "build-cache")
    manifest_path = lib / "manifest.json"
    good = json.loads(manifest_path.read_text())
    for field, value, message in (("isa", "sse2-only", "built for ISA sse2-only"),
                                  ("version", "0.0.1", "built by mirage_jax 0.0.1")):  # fmt: skip
        manifest_path.write_text(json.dumps({**good, field: value}))
        with pytest.raises(LibraryError, match=message):
            mj.load_library(lib)
    with pytest.raises(LibraryError, match="no manifest.json"):
        mj.load_library(tmp_path)


def test_env_var_library_mismatch_falls_back_with_a_warning(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv(library.LIBRARY_ENV, str(tmp_path / "nothing-here"))
    monkeypatch.setattr(library, "_ENV_LOADED", False)
    assert library.lookup("0" * 64) is None
    assert "not used" in caplog.text and "no manifest.json" in caplog.text


def test_show_cli_prints_regions_and_writes_dot(tmp_path, env):
    argv = [sys.executable, "-m", "mirage_jax", "show", "programs:rmsnorm_linear",
            "--shapes", "f32[4,256] f32[256] f32[256,128]", "--strategy", "as_is",
            "--dot", str(tmp_path)]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "region 0:" in done.stdout and "kernel {" in done.stdout
    assert (tmp_path / "region0.dot").read_text().startswith('digraph "μGraph"')


def test_cli_reports_bad_shapes_clearly(env):
    argv = [sys.executable, "-m", "mirage_jax", "show", "programs:rmsnorm_linear",
            "--shapes", "nonsense"]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 2 and "no shapes in 'nonsense'" in done.stderr
