"""Fault injection: every fault ends in a clear message, XLA's answer, a clean cache and a
next run that works.

Faults: no C++ compiler on PATH; a compile that fails; a truncated or corrupted shared library,
decision record or kernel library manifest; a read-only cache directory; a full disk while an
artifact is published; a search worker killed mid-search; Ctrl-C (SIGINT) during a compile and
during a search; two processes planning the same function at once. For each: the call returns
what ``jax.jit`` returns, ``explain`` (and the log) names the cause and the remedy, no
temporary or half-written entry is left in the cache, and the next run makes the custom call.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from racing import child_env, race

import mirage_jax as mj
from mirage_jax import store
from mirage_jax.api import libraries
from mirage_jax.backend.cpu import build
from mirage_jax.errors import LibraryError
from mirage_jax.planner import library
from mirage_jax.planner import region as planner
from mirage_jax.planner.decisions import cache_stats
from mirage_jax.search import SearchConfig

X = np.random.default_rng(0).standard_normal((8, 33)).astype(np.float32)


def f(x):
    return jnp.tanh(x) * 2.0 + 1.0


@pytest.fixture(autouse=True)
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "cache"
    monkeypatch.setenv("MIRAGE_JAX_CACHE_DIR", str(root))
    monkeypatch.delenv(library.LIBRARY_ENV, raising=False)
    monkeypatch.setattr(planner, "compare", lambda candidate, baseline, args: (1e-6, 2e-6))
    monkeypatch.setattr(planner, "compare_in_loop", lambda *a, **k: (1e-6, 2e-6))
    return root


def _optimize(fn=f, **kwargs):
    return mj.optimize(fn, strategy=kwargs.pop("strategy", "as_is"), require_speedup=False,
                       **kwargs)  # fmt: skip


def _run(fn=f, **kwargs) -> tuple[str, bool]:
    """Plan and call ``fn`` afresh: (explain's report, whether it made a custom call); the
    answer must be jax.jit's."""
    opt = _optimize(fn, **kwargs)
    np.testing.assert_allclose(opt(X), jax.jit(fn)(X), rtol=2e-6, atol=2e-6)
    plan = opt.plan(X)
    return plan.report(), all(r.impl is not None for r in plan.regions)


def _fell_back(report: str, *phrases: str) -> None:
    assert "fell back to XLA" in report, report
    for phrase in phrases:
        assert phrase in report, f"{phrase!r} not in:\n{report}"
    assert "remedy:" in report, report


def _clean(root: Path) -> None:
    """No temporary file anywhere in the cache, and every artifact checks against its record."""
    if not root.exists():
        return
    assert not [p for p in root.rglob("*") if ".tmp-" in p.name]
    for lib in root.rglob("*.so"):
        store.verified(lib)


def _next_run_works(root: Path) -> None:
    report, custom = _run()
    assert custom, report
    _clean(root)


# --- the compiler ----------------------------------------------------------------------------


def test_no_compiler_on_path(cache: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv(build.CXX_ENV, raising=False)
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))
    report, custom = _run()
    assert not custom
    _fell_back(report, "no C++ compiler", "install g++")
    _clean(cache)
    monkeypatch.undo()
    monkeypatch.setenv("MIRAGE_JAX_CACHE_DIR", str(cache))
    monkeypatch.setattr(planner, "compare", lambda candidate, baseline, args: (1e-6, 2e-6))
    monkeypatch.setattr(planner, "compare_in_loop", lambda *a, **k: (1e-6, 2e-6))
    _next_run_works(cache)


def _script(path: Path, body: str) -> Path:
    path.write_text("#!/bin/sh\n" + textwrap.dedent(body))
    path.chmod(0o755)
    return path


def test_a_compile_that_fails(cache: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # a compiler that writes half an output, complains and fails
    broken = _script(tmp_path / "broken-g++", """\
        case "$*" in *--version*) echo "broken-g++ 1.0"; exit 0;; esac
        for a; do [ "$prev" = "-o" ] && printf 'half' > "$a"; prev="$a"; done
        echo "internal compiler error: segmentation fault" >&2
        exit 4
        """)  # fmt: skip
    monkeypatch.setenv(build.CXX_ENV, str(broken))
    report, custom = _run()
    assert not custom
    _fell_back(report, "failed (exit 4)", "internal compiler error")
    _clean(cache)
    assert not list(cache.rglob("*.so"))
    monkeypatch.delenv(build.CXX_ENV)
    _next_run_works(cache)


# --- damaged cache entries -------------------------------------------------------------------


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 3])


def _flip(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def _garbage(path: Path) -> None:
    path.write_text('{"format": 1, "payload": {"graph": "kernel {", "reason": 3}, "sha256": "0"}')


@pytest.mark.parametrize("what, damage", [
    ("library", _truncate), ("library", _flip), ("decision", _truncate), ("decision", _garbage),
])  # fmt: skip
def test_a_damaged_cache_entry(cache: Path, what: str, damage, caplog) -> None:
    _, custom = _run()
    assert custom
    pattern = "cpu/*/*.so" if what == "library" else "decisions/*.json"
    (entry,) = cache.glob(pattern)
    damage(entry)
    before = cache_stats().corrupt
    with caplog.at_level(logging.WARNING):
        _, custom = _run()  # a fresh plan reads the entry, finds it damaged and rebuilds it
    assert custom
    assert "is corrupt" in caplog.text and "will be rebuilt" in caplog.text, caplog.text
    if what == "decision":
        assert cache_stats().corrupt == before + 1
    _clean(cache)
    assert len(list(cache.glob(pattern))) == 1


# --- kernel library manifests ----------------------------------------------------------------


@pytest.fixture
def kernel_library(tmp_path: Path) -> Path:
    out = tmp_path / "lib"
    libraries.precompile(f, (X,), out, strategy="as_is", require_speedup=False)
    return out


def _manifest_damage(manifest: Path, how: str) -> None:
    data = json.loads(manifest.read_text())
    if how == "truncated":
        manifest.write_text(manifest.read_text()[:40])
    elif how == "fields missing":
        del data["regions"][0]["graph"]
        manifest.write_text(json.dumps(data))
    elif how == "bad graph text":
        data["regions"][0]["graph"] = "kernel { %0 = frobnicate }"
        manifest.write_text(json.dumps(data))
    elif how == "regions not a list":
        data["regions"] = 7
        manifest.write_text(json.dumps(data))


@pytest.mark.parametrize("how", ["truncated", "fields missing", "bad graph text",
                                 "regions not a list"])  # fmt: skip
def test_a_damaged_kernel_library_manifest(kernel_library: Path, how: str, cache: Path,
                                           monkeypatch: pytest.MonkeyPatch, caplog) -> None:  # fmt: skip
    _manifest_damage(kernel_library / "manifest.json", how)
    with pytest.raises(LibraryError) as err:
        mj.load_library(kernel_library)
    assert "manifest" in str(err.value) and err.value.remedy, str(err.value)
    # named by the environment: a warning, and the functions are planned as without it
    monkeypatch.setenv(library.LIBRARY_ENV, str(kernel_library))
    monkeypatch.setattr(library, "_ENV_LOADED", False)
    with caplog.at_level(logging.WARNING):
        report, custom = _run()
    assert custom, report
    assert "not used" in caplog.text and "precompile" in caplog.text, caplog.text
    _clean(cache)


# --- the file system -------------------------------------------------------------------------


def _failing_writes(monkeypatch: pytest.MonkeyPatch, code: int, match: str) -> None:
    """Every file the store creates whose path contains ``match`` fails with ``code`` (root
    ignores permissions, so a read-only directory is simulated as the kernel reports it)."""
    real_open = os.open

    def fake_open(path, flags, *args, **kwargs):
        if match in str(path) and flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT):
            raise OSError(code, os.strerror(code), str(path))
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", fake_open)


def test_a_read_only_cache_directory(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cache.mkdir(parents=True)
    if os.geteuid() != 0:
        cache.chmod(0o555)
    else:
        _failing_writes(monkeypatch, errno.EROFS, str(cache))
    report, custom = _run()
    assert not custom
    _fell_back(report, str(cache), "MIRAGE_JAX_CACHE_DIR")
    monkeypatch.undo()
    cache.chmod(0o755)
    monkeypatch.setenv("MIRAGE_JAX_CACHE_DIR", str(cache))
    monkeypatch.setattr(planner, "compare", lambda candidate, baseline, args: (1e-6, 2e-6))
    monkeypatch.setattr(planner, "compare_in_loop", lambda *a, **k: (1e-6, 2e-6))
    _clean(cache)
    _next_run_works(cache)


def test_a_full_disk_while_publishing_an_artifact(cache: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    real_replace = os.replace

    def no_space(src, dst, *args, **kwargs):  # the artifact is written, then the disk is full
        if str(dst).endswith(".so"):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(dst))
        return real_replace(src, dst, *args, **kwargs)

    monkeypatch.setattr(os, "replace", no_space)
    report, custom = _run()
    assert not custom
    _fell_back(report, "No space left on device", "free space")
    monkeypatch.setattr(os, "replace", real_replace)
    _clean(cache)
    assert not list(cache.rglob("*.so"))
    _next_run_works(cache)


# --- the search -------------------------------------------------------------------------------

SEARCH = SearchConfig(max_kernel_ops=3, time_budget_s=4, workers=2, time_candidates=False,
                      progress=False, saturation_time_s=2.0)  # fmt: skip


def _children(pid: int) -> list[int]:
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            out.append(int(stat.parent.name))
    return out


def test_a_search_worker_killed_mid_search(cache: Path, monkeypatch: pytest.MonkeyPatch,
                                           caplog) -> None:  # fmt: skip
    import threading

    # the pool's processes start with the first block task (by default once they took 1 s)
    monkeypatch.setenv("MIRAGE_JAX_POOL_AFTER_S", "0")
    killed: list[int] = []

    def killer() -> None:
        deadline = time.monotonic() + 60
        while not killed and time.monotonic() < deadline:
            for pid in _children(os.getpid()):
                if b"spawn_main" in Path(f"/proc/{pid}/cmdline").read_bytes():
                    os.kill(pid, signal.SIGKILL)
                    killed.append(pid)
                    break
            time.sleep(0.05)

    def g(x):
        return jnp.exp(x - jnp.max(x, axis=-1, keepdims=True))

    thread = threading.Thread(target=killer, daemon=True)
    thread.start()
    with caplog.at_level(logging.WARNING):
        report, _ = _run(g, strategy="search", config=SEARCH)
    thread.join()
    assert killed, "no search worker was seen"
    # the search sends the dead worker's tasks again (or falls back); either way it says so
    assert "was lost" in caplog.text or "fell back to XLA" in report, report + caplog.text
    _clean(cache)
    report, custom = _run(g, strategy="search", config=SEARCH)  # the next run plans afresh
    assert custom, report


# --- Ctrl-C ----------------------------------------------------------------------------------

_CHILD = """\
import sys, numpy as np, jax.numpy as jnp, mirage_jax as mj
from mirage_jax.search import SearchConfig
x = np.ones((8, 33), np.float32)
cfg = SearchConfig(max_kernel_ops=3, time_budget_s=60, workers=2, time_candidates=False,
                   progress=False)
fn = lambda x: jnp.exp(x - jnp.max(x, axis=-1, keepdims=True))
print("planning", flush=True)
mj.optimize(fn, strategy=sys.argv[1], require_speedup=False, config=cfg)(x)
print("finished", flush=True)
"""


def _interrupt(args: list[str], env: dict[str, str], started) -> subprocess.CompletedProcess:
    proc = subprocess.Popen([sys.executable, "-c", _CHILD, *args], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    deadline = time.monotonic() + 120
    while not started(proc.pid):
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the child never reached the interrupted step"
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def _token_processes(token: str) -> list[int]:
    pids = []
    for environ in Path("/proc").glob("[0-9]*/environ"):
        try:
            if token.encode() in environ.read_bytes():
                pids.append(int(environ.parent.name))
        except OSError:
            continue
    return pids


def test_an_error_cleaning_up_after_ctrl_c_does_not_swallow_it(cache: Path, monkeypatch) -> None:
    """Ctrl-C while the search's process pool started its manager thread made the pool's
    shutdown raise "cannot join thread before it is started"; the planner took that for a
    failed region, fell back to XLA and the program ran on. The interrupt must propagate; the
    same error without an interrupt behind it stays one region's fallback."""

    def interrupted_in_cleanup(*args, **kwargs):
        try:
            raise KeyboardInterrupt
        finally:
            raise RuntimeError("cannot join thread before it is started")

    def failed(*args, **kwargs):
        raise RuntimeError("cannot join thread before it is started")

    x = jnp.ones((8, 16), jnp.float32)
    monkeypatch.setattr(planner, "_choose_graph", interrupted_in_cleanup)
    with pytest.raises(KeyboardInterrupt):
        mj.optimize(lambda x: jnp.tanh(x) * 2.0, cache=False)(x)
    monkeypatch.setattr(planner, "_choose_graph", failed)
    fast = mj.optimize(lambda x: jnp.tanh(x) * 2.0, cache=False)
    np.testing.assert_allclose(fast(x), jnp.tanh(x) * 2.0)
    assert "internal error (RuntimeError: cannot join thread" in fast.explain(x)


def test_ctrl_c_during_a_compile(cache: Path, tmp_path: Path) -> None:
    marker = tmp_path / "compiling"
    slow = _script(tmp_path / "slow-g++", f"""\
        case "$*" in *--version*) exec g++ --version;; esac
        for a; do [ "$prev" = "-o" ] && printf 'partial' > "$a"; prev="$a"; done
        touch {marker}
        exec sleep 60
        """)  # fmt: skip
    env = {**child_env(), "MIRAGE_JAX_CACHE_DIR": str(cache), build.CXX_ENV: str(slow),
           "MIRAGE_JAX_CALIBRATE": "0"}
    done = _interrupt(["as_is"], env, lambda pid: marker.exists())
    assert done.returncode != 0 and "KeyboardInterrupt" in done.stderr, done.stderr[-3000:]
    assert "finished" not in done.stdout
    _clean(cache)
    assert not list(cache.rglob("*.so"))
    _next_run_works(cache)


def test_ctrl_c_during_a_search(cache: Path) -> None:
    token = f"MJ_FAULT_TEST_{os.getpid()}_{time.monotonic_ns()}"
    # the pool's processes start with the first block task (by default once they took 1 s)
    env = {**child_env(), "MIRAGE_JAX_CACHE_DIR": str(cache), "MIRAGE_JAX_CALIBRATE": "0",
           "MIRAGE_JAX_POOL_AFTER_S": "0", token: "1"}
    # interrupted once its worker processes run
    done = _interrupt(["search"], env, lambda pid: len(_children(pid)) >= 2)
    assert done.returncode != 0 and "KeyboardInterrupt" in done.stderr, done.stderr[-3000:]
    deadline = time.monotonic() + 30
    while _token_processes(token) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _token_processes(token), "search workers outlived the interrupted process"
    _clean(cache)
    _next_run_works(cache)


# --- two processes ---------------------------------------------------------------------------

_RACER = """\
import json, sys, time
from pathlib import Path
import numpy as np, jax, jax.numpy as jnp, mirage_jax as mj
from mirage_jax.backend.cpu.build import build_stats
from mirage_jax.planner import region
region.compare = lambda candidate, baseline, args: (1e-6, 2e-6)
x = np.random.default_rng(0).standard_normal((8, 33)).astype(np.float32)
fn = lambda x: jnp.tanh(x) * 2.0 + 1.0
ready, go = Path(sys.argv[1]), Path(sys.argv[2])
ready.touch()
while not go.exists():
    time.sleep(0.001)
opt = mj.optimize(fn, strategy="as_is", require_speedup=False)
y = opt(x)
ok = bool(np.allclose(y, jax.jit(fn)(x), rtol=2e-6, atol=2e-6))
custom = all(r.impl is not None for r in opt.plan(x).regions)
print(json.dumps({"ok": ok, "custom": custom, "compiles": build_stats().compiles}))
"""


def test_two_processes_plan_the_same_function_at_once(cache: Path, tmp_path: Path) -> None:
    env = {**child_env(), "MIRAGE_JAX_CACHE_DIR": str(cache), "MIRAGE_JAX_CALIBRATE": "0"}
    results = race(_RACER, lambda ready, go: [str(ready), str(go)], tmp_path, env=env)
    assert all(r["ok"] and r["custom"] for r in results), results
    # every artifact (the kernel, the calibration probe) built once: one built, one waited
    assert sum(r["compiles"] for r in results) == len(list(cache.glob("cpu/*/*.so"))), results
    _clean(cache)
    assert len(list(cache.glob("decisions/*.json"))) == 1
    _next_run_works(cache)


def test_an_unexpected_error_in_one_regions_search_costs_that_region_alone(monkeypatch):
    """A bug (ours or a library's) raised while planning one region keeps that region with
    XLA, says so, and the other regions and the program still run."""
    real = planner.superoptimize

    def fails_on_tanh(target, *args, **kwargs):
        if any(n.op.name == "TANH" for n in target.nodes):
            raise OverflowError("a panic deep inside a library")
        return real(target, *args, **kwargs)

    monkeypatch.setattr(planner, "superoptimize", fails_on_tanh)

    def g(x):
        return jnp.sort(jnp.tanh(x) * 2.0, axis=-1) @ x.T * 3.0 + 1.0

    config = SearchConfig(workers=1, time_candidates=False, progress=False, max_tasks=4)
    opt = mj.optimize(g, config=config, require_speedup=False, cache=False)
    np.testing.assert_allclose(opt(X), jax.jit(g)(X), rtol=2e-5, atol=2e-5)
    first, second = opt.plan(X).regions
    assert first.impl is None and second.impl is not None
    assert "internal error (OverflowError: a panic deep inside a library, at test_faults.py:" \
        in first.reason
    assert "mirage_jax bug" in first.reason
