"""Compiling generated C++: the content-addressed cache, its key, errors, and concurrency."""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from racing import race

import mirage_jax
from mirage_jax.backend.cpu import build, isa
from mirage_jax.backend.cpu.build import CompiledLibrary, compile_shared_library
from mirage_jax.errors import CompileError

# A plain kernel with the runtime ABI and no XLA headers: what a generated kernel looks like.
KERNEL = textwrap.dedent("""
    #include "cpu/abi.h"
    MJ_EXPORT int add_one(const void* const* in, void* const* out, const mj_pool* pool) {
      (void)pool;
      const float* x = (const float*)in[0];
      float* y = (float*)out[0];
      for (int i = 0; i < 16; ++i) y[i] = x[i] + 1.0f;
      return 0;
    }
    """)


@pytest.fixture(autouse=True)
def cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every test gets its own empty cache and fresh counters."""
    root = tmp_path / "cache"
    monkeypatch.setenv(build.CACHE_ENV, str(root))
    monkeypatch.delenv(build.CXX_ENV, raising=False)
    monkeypatch.delenv(isa.ISA_ENV, raising=False)
    build.reset_build_stats()
    return root


def _unique(source: str, tag: str) -> str:
    """The same kernel with a comment that gives it a fresh cache key."""
    return f"// {tag} {time.time_ns()}\n{source}"


def test_second_compile_is_a_cache_hit(cache_dir: Path) -> None:
    first = compile_shared_library(KERNEL, name_hint="add_one")
    compiled = build.build_stats().compile_s
    second = compile_shared_library(KERNEL, name_hint="add_one")
    assert first == second
    stats = build.build_stats()
    assert (stats.compiles, stats.cache_hits) == (1, 1)
    assert 0 < compiled < 120 and stats.compile_s == compiled  # the hit runs no compiler
    assert first.path.is_file() and first.path.is_relative_to(cache_dir)
    assert first.path.with_suffix(".cpp").read_text() == KERNEL
    meta = json.loads(first.path.with_suffix(".json").read_text())
    assert meta["key"] == first.key and meta["name_hint"] == "add_one"


def test_library_is_loadable_and_exports_the_kernel() -> None:
    lib = compile_shared_library(KERNEL)
    fn = ctypes.CDLL(str(lib.path)).add_one
    fn.restype = ctypes.c_int
    x = (ctypes.c_float * 16)(*range(16))
    y = (ctypes.c_float * 16)()
    ins = (ctypes.c_void_p * 1)(ctypes.addressof(x))
    outs = (ctypes.c_void_p * 1)(ctypes.addressof(y))
    assert fn(ins, outs, None) == 0
    assert list(y) == [float(i + 1) for i in range(16)]


def test_key_depends_on_source_flags_and_isa(monkeypatch: pytest.MonkeyPatch) -> None:
    base = compile_shared_library(KERNEL)
    flagged = compile_shared_library(KERNEL, extra_flags=("-DMJ_TEST_FLAG=1",))
    edited = compile_shared_library(KERNEL + "\n// edited\n")
    monkeypatch.setenv(isa.ISA_ENV, "generic")
    generic = compile_shared_library(KERNEL)
    keys = {base.key, flagged.key, edited.key, generic.key}
    assert len(keys) == 4
    assert len({base.path, flagged.path, edited.path, generic.path}) == 4
    assert build.build_stats().compiles == 4


def test_key_is_deterministic_across_cache_dirs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Keys hold no paths, so a library built elsewhere has the same key (shippable)."""
    first = compile_shared_library(KERNEL)
    monkeypatch.setenv(build.CACHE_ENV, str(tmp_path / "other"))
    second = compile_shared_library(KERNEL)
    assert first.key == second.key and first.path != second.path


def test_bad_source_raises_compile_error_with_stderr_and_kept_source(cache_dir: Path) -> None:
    source = _unique("int broken( { return 0; }\n", "bad")
    with pytest.raises(CompileError) as info:
        compile_shared_library(source)
    message = str(info.value)
    assert "error" in message  # the compiler's own diagnostic is included
    (kept,) = cache_dir.rglob("*.cpp")
    assert kept.read_text() == source
    assert f"kept at {kept}" in message
    assert build.build_stats().compiles == 0
    assert not list(cache_dir.rglob("*.so"))  # nothing half-built was published


def test_undefined_symbol_fails_at_link_time() -> None:
    source = 'extern "C" int missing(void);\nextern "C" int k(void) { return missing(); }\n'
    with pytest.raises(CompileError, match="missing"):
        compile_shared_library(source)


def test_missing_compiler_names_cxx_and_remedy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(build.CXX_ENV, str(tmp_path / "no-such-g++"))
    with pytest.raises(CompileError) as info:
        compile_shared_library(KERNEL)
    assert "CXX" in str(info.value) and "install g++" in str(info.value)


def test_cxx_with_arguments_is_honoured(monkeypatch: pytest.MonkeyPatch) -> None:
    """$CXX may carry arguments; they are part of the key."""
    plain = compile_shared_library(KERNEL)
    monkeypatch.setenv(build.CXX_ENV, "g++ -DMJ_FROM_CXX=1")
    with_args = compile_shared_library(KERNEL)
    assert plain.key != with_args.key


def test_cache_dir_env_and_xdg(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(build.CACHE_ENV, str(tmp_path / "explicit"))
    assert build.library_cache_dir() == tmp_path / "explicit" / "cpu"
    monkeypatch.delenv(build.CACHE_ENV)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert build.cache_root() == tmp_path / "xdg" / "mirage_jax"
    lib = compile_shared_library(_unique(KERNEL, "xdg"))
    assert lib.path.is_relative_to(tmp_path / "xdg" / "mirage_jax" / "cpu")
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert build.cache_root() == Path.home() / ".cache" / "mirage_jax"


def test_runtime_headers_are_found_and_hashed(tmp_path: Path) -> None:
    root = build.runtime_include_dir()
    assert (root / "cpu" / "abi.h").is_file()
    (tmp_path / "cpu").mkdir()
    (tmp_path / "cpu" / "abi.h").write_text("// v1\n")
    before = build.headers_hash(tmp_path)
    (tmp_path / "cpu" / "abi.h").write_text("// v2 (longer)\n")
    assert build.headers_hash(tmp_path) != before


def test_plain_kernel_compiles_quickly() -> None:
    start = time.perf_counter()
    compile_shared_library(_unique(KERNEL, "speed"))
    elapsed = time.perf_counter() - start
    # About 0.1-0.3 s here; the bound only catches pathologies (e.g. XLA headers pulled in).
    assert elapsed < 10.0


_RACE_SCRIPT = textwrap.dedent("""
    import dataclasses, json, sys, time
    from pathlib import Path
    from mirage_jax.backend.cpu import build
    ready, go, source = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3]).read_text()
    build.compiler_identity(build._compiler_argv())  # warm up so both race on the compile
    ready.touch()
    while not go.exists():
        time.sleep(0.001)
    lib = build.compile_shared_library(source)
    print(json.dumps({"path": str(lib.path), "key": lib.key,
                      **dataclasses.asdict(build.build_stats())}))
    """)


def test_two_processes_building_one_key_compile_once(tmp_path: Path, cache_dir: Path) -> None:
    # A slower translation unit widens the window in which both processes want the same key.
    source = _unique("#include <vector>\n#include <map>\n#include <string>\n" + KERNEL, "race")
    (tmp_path / "k.cpp").write_text(source)
    results = race(_RACE_SCRIPT, lambda ready, go: [str(ready), str(go), str(tmp_path / "k.cpp")],
                   tmp_path)  # fmt: skip
    assert results[0]["path"] == results[1]["path"] and results[0]["key"] == results[1]["key"]
    assert sum(r["compiles"] for r in results) == 1
    assert sum(r["cache_hits"] for r in results) == 1
    assert Path(results[0]["path"]).is_relative_to(cache_dir)
    ctypes.CDLL(results[0]["path"]).add_one  # a complete, loadable library
    # No temporaries left behind.
    assert not [p for p in Path(results[0]["path"]).parent.iterdir() if ".tmp-" in p.name]


# --- ISA ---------------------------------------------------------------------------------------

_CPUINFO = "processor\t: 0\nflags\t\t: fpu sse2 {extra}\n\nprocessor\t: 1\nflags\t\t: fpu\n"


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        ("avx2 fma avx512f avx512bw avx512vl avx512dq avx512_bf16", "avx512bf16"),
        ("avx2 fma avx512f avx512bw avx512vl avx512dq", "avx512"),
        ("avx2 fma avx512f avx512_bf16", "avx2"),  # BF16 without the x86-64-v4 set
        ("avx2 fma avx512f", "avx2"),  # incomplete AVX-512 set
        ("avx2 fma", "avx2"),
        ("avx2", "generic"),  # AVX2 without FMA is not x86-64-v3
        ("", "generic"),
    ],
)
def test_isa_from_cpuinfo(extra: str, expected: str) -> None:
    assert isa._isa_from_cpuinfo(_CPUINFO.format(extra=extra)) == expected


def test_host_isa_agrees_with_cpuinfo_and_flags_are_explicit() -> None:
    detected = isa.host_isa()
    assert detected in isa.ISAS
    if isa.is_x86():
        assert detected == isa._isa_from_cpuinfo(isa.read_cpuinfo())
        assert isa.isa_flags("avx512bf16") == ("-march=x86-64-v4", "-mavx512bf16")
        assert isa.isa_flags("avx512") == ("-march=x86-64-v4",)
        assert isa.isa_flags("avx2") == ("-march=x86-64-v3",)
        assert isa.isa_flags("generic") == ("-march=x86-64",)
    assert not any("native" in f for i in isa.ISAS for f in isa.isa_flags(i))


def test_isa_override_caps_and_validates(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(isa.ISA_ENV, "generic")
    assert isa.host_isa() == "generic"
    monkeypatch.setenv(isa.ISA_ENV, isa.ISAS[-1])
    assert isa.host_isa() == isa.detected_isa()  # never above what the CPU has
    monkeypatch.setenv(isa.ISA_ENV, "sse9")
    with pytest.raises(CompileError, match="MIRAGE_JAX_ISA"):
        isa.host_isa()


def test_import_needs_no_compiler_and_no_native_module(tmp_path: Path) -> None:
    code = (
        "import sys, mirage_jax, mirage_jax.runtime, mirage_jax.backend.cpu.build, "
        "mirage_jax.backend.cpu.isa\n"
        "assert 'mirage_jax._C' not in sys.modules, 'imported _C eagerly'\n"
    )
    env = dict(os.environ, CXX=str(tmp_path / "no-compiler"), PATH="/nonexistent")
    env["PYTHONPATH"] = str(Path(mirage_jax.__file__).parents[1])
    proc = subprocess.run(
        [sys.executable, "-c", code], env=env, cwd=tmp_path, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr


def test_compiled_library_is_a_value() -> None:
    lib = CompiledLibrary(Path("/x.so"), "ab")
    assert lib == CompiledLibrary(Path("/x.so"), "ab") and hash(lib) == hash(
        CompiledLibrary(Path("/x.so"), "ab")
    )
