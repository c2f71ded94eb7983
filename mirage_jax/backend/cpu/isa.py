"""The host's instruction set, and the compiler flags generated code is built with.

Four levels: ``avx512bf16`` (x86-64-v4 and AVX512_BF16: bfloat16 dot products, used by the
matmuls of bfloat16 operands), ``avx512`` (x86-64-v4: AVX-512 F/BW/VL/DQ), ``avx2`` (x86-64-v3:
AVX2 + FMA) and ``generic``. Flags name an explicit ``-march`` level, never ``-march=native``, so the cache key
of a compiled library says exactly what it needs and a library built on one machine is valid on
every machine of the same level. ``MIRAGE_JAX_ISA`` forces a lower level (e.g. to build a
library for older machines, or to test the generic path).
"""

from __future__ import annotations

import functools
import os
import platform
from pathlib import Path

from mirage_jax.errors import CompileError
from mirage_jax.runtime.native import try_native

ISAS: tuple[str, ...] = ("generic", "avx2", "avx512", "avx512bf16")  # weakest first
ISA_ENV = "MIRAGE_JAX_ISA"

_X86_FLAGS: dict[str, tuple[str, ...]] = {
    "avx512bf16": ("-march=x86-64-v4", "-mavx512bf16"),
    "avx512": ("-march=x86-64-v4",),
    "avx2": ("-march=x86-64-v3",),
    "generic": ("-march=x86-64",),
}
_REQUIRED_CPU_FLAGS: dict[str, frozenset[str]] = {
    "avx512bf16": frozenset({"avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_bf16"}),
    "avx512": frozenset({"avx512f", "avx512bw", "avx512vl", "avx512dq"}),
    "avx2": frozenset({"avx2", "fma"}),
}


def is_x86() -> bool:
    """Whether this is an x86-64 host (the only one with ISA levels above generic here)."""
    return platform.machine().lower() in ("x86_64", "amd64")


def host_isa() -> str:
    """The ISA generated code targets here: the detected level, capped by ``MIRAGE_JAX_ISA``."""
    detected = detected_isa()
    forced = os.environ.get(ISA_ENV, "").strip().lower()
    if not forced:
        return detected
    if forced not in ISAS:
        raise CompileError(
            f"{ISA_ENV}={forced!r} is not an ISA level",
            remedy=f"set {ISA_ENV} to one of {', '.join(ISAS)}, or unset it",
        )
    # Never target more than the CPU has: the kernels would die with SIGILL.
    return min(forced, detected, key=ISAS.index)


@functools.cache
def detected_isa() -> str:
    """The best level this CPU and OS support, from ``_C`` when built, else /proc/cpuinfo."""
    if not is_x86():
        return "generic"
    native = try_native()
    if native is not None:
        return str(native.cpu_isa())
    return _isa_from_cpuinfo(read_cpuinfo())


def isa_flags(isa: str) -> tuple[str, ...]:
    """Compiler flags for ``isa``: an explicit ``-march`` level on x86-64, nothing elsewhere."""
    if isa not in ISAS:
        raise CompileError(f"unknown ISA {isa!r}", remedy=f"use one of {', '.join(ISAS)}")
    return _X86_FLAGS[isa] if is_x86() else ()


def read_cpuinfo() -> str:
    try:
        return Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        return ""


def _isa_from_cpuinfo(text: str) -> str:
    """Level from the first ``flags`` line of /proc/cpuinfo text (all cores are alike here)."""
    flags: frozenset[str] = frozenset()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "flags":
            flags = frozenset(value.split())
            break
    for isa in reversed(ISAS[1:]):
        if _REQUIRED_CPU_FLAGS[isa] <= flags:
            return isa
    return "generic"
