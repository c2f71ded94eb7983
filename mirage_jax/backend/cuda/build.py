"""Building generated CUDA, with a content-addressed on-disk cache.

Four kinds of artifact from one ``emit_cuda`` source:

- ``"shared"``: the loadable library with the XLA FFI handler (nvcc ``-shared``; ~10 s, as the
  FFI headers are template-heavy);
- ``"cubin"`` / ``"ptx"``: kernels only (``-DMJ_NO_FFI``), for compile checks and for reading
  the generated machine code (~1 s); ``"obj"``: the same plus the host launch code (``-c``);
- ``"emu"``: a host shared library built with g++ and ``-DMJ_EMU`` whose
  ``<symbol>_emu(inputs, outputs)`` runs the kernels on emulated thread blocks (tests without
  a GPU; see ``csrc/runtime/cuda/emu.h``).

GPU builds target ``-arch=sm_90a`` (H100/H200) by default; ``arch="sm_80"`` builds for A100.
Cache: the store's ``cuda`` namespace (``<cache root>/cuda/``, see ``mirage_jax.store``), one
artifact ``<name>-<kind>-<key[:20]><suffix>`` beside its source (``.cu``) and its digest record
(``.json``). The key hashes the source, the compiler's version, the flags, the arch, the
runtime headers and the package version. The store serialises concurrent builds of one key,
publishes the artifact atomically and checks its digest on every hit.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import jax

from mirage_jax.backend.artifacts import get_or_build
from mirage_jax.backend.headers import runtime_include_dir as include_dir_with
from mirage_jax.errors import CompileError
from mirage_jax.store import namespace, write_text_atomic
from mirage_jax.version import __version__

ARCHS = ("sm_90a", "sm_80")
KINDS = ("shared", "obj", "cubin", "ptx", "emu")
NVCC_ENV = "MIRAGE_JAX_NVCC"
_BUILDS = namespace("cuda")
_SUFFIX = {"shared": ".so", "obj": ".o", "cubin": ".cubin", "ptx": ".ptx", "emu": ".so"}
# ffi.h trips nvcc's "missing return" (940) and "always_inline ignored" (2473) diagnostics.
_QUIET = ("-diag-suppress", "940,2473", "-Xcompiler", "-Wno-return-type")
_NO_NVCC_REMEDY = (
    "install the CUDA toolkit (nvcc 12 or newer), put nvcc on PATH, or point "
    f"${NVCC_ENV} at it; without it mirage_jax uses the CPU backend"
)


def find_nvcc() -> str | None:
    """The nvcc to use: ``$MIRAGE_JAX_NVCC``, then PATH, then ``$CUDA_HOME`` and /usr/local."""
    env = os.environ.get(NVCC_ENV)
    if env:
        return env if Path(env).is_file() else None
    found = shutil.which("nvcc")
    if found:
        return found
    roots = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"]
    for root in filter(None, roots):
        cand = Path(root) / "bin" / "nvcc"
        if cand.is_file():
            return str(cand)
    return None


def require_nvcc() -> str:
    nvcc = find_nvcc()
    if nvcc is None:
        raise CompileError("nvcc (the CUDA compiler) was not found", remedy=_NO_NVCC_REMEDY)
    return nvcc


@functools.cache
def _tool_version(tool: str) -> str:
    try:
        out = subprocess.run([tool, "--version"], capture_output=True, text=True, timeout=60,
                             check=False)  # fmt: skip
    except OSError as err:
        raise CompileError(f"cannot run {tool}: {err}", remedy=_NO_NVCC_REMEDY) from err
    return out.stdout.strip()


@functools.cache
def cuda_include_dirs(nvcc: str) -> tuple[str, ...]:
    """The toolkit's include directories, as nvcc reports them (for host emulation builds)."""
    # --dryrun only prints the commands, so an empty input and no output file are enough
    out = subprocess.run([nvcc, "--dryrun", "-c", "-x", "cu", os.devnull, "-o", os.devnull],
                         capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
    dirs = re.findall(r'INCLUDES="([^"]*)"', out.stdout + out.stderr)
    paths = [p[2:] for d in dirs for p in d.split() if p.startswith("-I")]
    return tuple(p for p in paths if (Path(p) / "cuda_fp16.h").is_file())


def runtime_include_dir() -> Path:
    """The include root of the runtime (generated code says ``#include "cuda/mj_cuda.cuh"``)."""
    return include_dir_with("cuda/mj_cuda.cuh")


@functools.cache
def runtime_digest() -> str:
    """Hash of the CUDA runtime headers: a header change invalidates every cached build."""
    h = hashlib.sha256()
    for path in sorted((runtime_include_dir() / "cuda").glob("*")):
        h.update(path.name.encode())
        h.update(path.read_bytes())
    return h.hexdigest()


def cache_dir() -> Path:
    """Where CUDA builds are cached: ``cuda/`` beside the CPU libraries (see ``build``)."""
    return _BUILDS.directory


def nvcc_command(kind: str, arch: str, src: Path, out: Path, nvcc: str) -> list[str]:
    """The nvcc command line for one artifact kind (without the cache around it)."""
    if arch not in ARCHS:
        raise CompileError(f"unknown CUDA arch {arch!r}", remedy=f"use one of {', '.join(ARCHS)}")
    base = [nvcc, f"-arch={arch}", "-O3", "-std=c++17", "-I", str(runtime_include_dir())]
    if kind == "shared":
        return [*base, "-shared", "-Xcompiler", "-fPIC", "-I", jax.ffi.include_dir(), *_QUIET,
                str(src), "-o", str(out)]  # fmt: skip
    if kind in ("cubin", "ptx"):
        return [*base, f"-{kind}", "-DMJ_NO_FFI", str(src), "-o", str(out)]
    if kind == "obj":  # host and device code, without the FFI handler
        return [*base, "-c", "-DMJ_NO_FFI", str(src), "-o", str(out)]
    raise CompileError(f"unknown CUDA build kind {kind!r}", remedy=f"use one of {', '.join(KINDS)}")


def emu_command(src: Path, out: Path, nvcc: str) -> list[str]:
    cxx = os.environ.get("CXX", "g++")
    includes = [f"-I{d}" for d in cuda_include_dirs(nvcc)]
    if not includes:
        raise CompileError("the CUDA toolkit's headers (cuda_fp16.h) were not found",
                           remedy=_NO_NVCC_REMEDY)  # fmt: skip
    return [cxx, "-std=c++17", "-O1", "-DMJ_EMU", "-x", "c++", "-shared", "-fPIC", "-pthread",
            f"-I{runtime_include_dir()}", *includes, str(src), "-o", str(out)]  # fmt: skip


def build_cuda(source: str, *, arch: str = "sm_90a", kind: str = "shared",
               name_hint: str = "mj") -> Path:  # fmt: skip
    """Compile ``source`` (from ``emit_cuda``) and return the cached artifact's path.

    Raises ``CompileError`` when nvcc is absent or the compiler fails (with its log).
    """
    if kind not in KINDS:
        raise CompileError(f"unknown CUDA build kind {kind!r}",
                           remedy=f"use one of {', '.join(KINDS)}")  # fmt: skip
    nvcc = require_nvcc()
    probe_src, probe_out = Path("SRC.cu"), Path("OUT")
    if kind == "emu":
        cmd = emu_command(probe_src, probe_out, nvcc)
        compiler = _tool_version(cmd[0])
    else:
        cmd = nvcc_command(kind, arch, probe_src, probe_out, nvcc)
        compiler = _tool_version(nvcc)
    key = _key(source, compiler, cmd, arch if kind != "emu" else "host")
    name = re.sub(r"[^A-Za-z0-9_]", "_", name_hint)[:48]
    out = _BUILDS.entry(f"{name}-{kind}-{key[:20]}{_SUFFIX[kind]}")

    def build(tmp: Path) -> None:
        _compile(source, cmd, probe_src, probe_out, out, tmp)

    def record() -> dict[str, str]:
        return {"key": key, "kind": kind, "arch": arch, "name_hint": name}

    path, _ = get_or_build(_BUILDS, out, build, record)
    return path


def build_emulated(source: str, name_hint: str = "mj") -> Path:
    """The host-emulation library of ``source``: ``build_cuda(source, kind="emu")``."""
    return build_cuda(source, kind="emu", name_hint=name_hint)


def _key(source: str, compiler: str, cmd: list[str], arch: str) -> str:
    blob = json.dumps({"source": source, "compiler": compiler, "cmd": cmd[1:], "arch": arch,
                       "runtime": runtime_digest(), "version": __version__})  # fmt: skip
    return hashlib.sha256(blob.encode()).hexdigest()


def _compile(source: str, cmd: list[str], probe_src: Path, probe_out: Path, out: Path,
             tmp: Path) -> None:  # fmt: skip
    """Compile ``source`` into ``tmp``, which the store then publishes as ``out``."""
    src = out.with_suffix(".cu")  # kept beside the artifact: the first thing to read on failure
    write_text_atomic(src, source)
    argv = [str(src) if a == str(probe_src) else str(tmp) if a == str(probe_out) else a
            for a in cmd]  # fmt: skip
    try:
        res = subprocess.run(argv, capture_output=True, text=True, timeout=900, check=False)
    except (OSError, subprocess.TimeoutExpired) as err:
        raise CompileError(f"running {argv[0]} failed: {err}", remedy=_NO_NVCC_REMEDY) from err
    if res.returncode != 0:
        log = (res.stderr + res.stdout).strip()
        raise CompileError(
            f"compiling generated CUDA failed ({Path(argv[0]).name} exit {res.returncode}); "
            f"source: {src}\n{log[-6000:]}",
            remedy="this is a mirage_jax bug: please report it with the source file above",
        )


__all__ = [
    "ARCHS", "KINDS", "build_cuda", "build_emulated", "cache_dir",
    "cuda_include_dirs", "find_nvcc", "nvcc_command", "require_nvcc", "runtime_include_dir",
]  # fmt: skip
