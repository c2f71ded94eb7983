"""This host's ceilings for the CPU cost model, and the kernel build setting they decide,
measured once and cached.

``host_model()`` returns a ``CpuModel`` whose rates were measured on this machine by the
runtime's own code (``csrc/runtime/cpu/calibrate.h``): the matmul micro-kernel at 1, 2, 4 and
8 rows, an elementwise map, streaming reads from memory on one core and on all, and the
cost of a matmul reading a narrow column strip of a wide weight row by row, how much a
streamed matmul slows down when it reads short runs of each row of its weight, and whether it
runs faster with or without software prefetch (``kernel_flags``), and how much of a streamed
product's memory time and compute time overlap. Hosts
differ by more than 2x in these (the project has run on Zen 5, Zen 4 and Ice Lake machines),
and a model tuned on one misorders the candidates of the other before the timing step sees
them.

The probe compiles once (the library cache) and runs for well under a second; its figures are
cached as JSON in the store's ``calibration`` namespace (``<cache root>/calibration/``), keyed
by the probe library (source, compiler, flags, ISA, runtime headers) and the CPU's model name
and core count, so a new host or a new runtime measures again. The key's lock keeps concurrent
processes from measuring at the same time (they would measure each other); a cached file that
does not hold every figure is deleted and measured again. ``MIRAGE_JAX_CALIBRATE=0`` uses the
built-in defaults (``cost.DEFAULT_MODEL``), as does any failure to build or run the probe
(logged).
"""

from __future__ import annotations

import ctypes
import dataclasses
import functools
import hashlib
import json
import logging
import math
import os
from pathlib import Path

from mirage_jax.backend.cpu.build import compile_shared_library
from mirage_jax.backend.cpu.cost import DEFAULT_MODEL, CpuModel
from mirage_jax.backend.cpu.isa import read_cpuinfo
from mirage_jax.errors import MirageError
from mirage_jax.store import namespace

CALIBRATE_ENV = "MIRAGE_JAX_CALIBRATE"
_SYMBOL = "mj_calibrate"
# the probe's fields (calibrate.h, enum Field), in order
_FIELDS = ("matmul1", "matmul2", "matmul4", "matmul8", "vector", "core_stream", "all_stream",
           "cores", "strided_row", "strided_revisit", "stream_prefetch_gain",
           "strip_slowdown", "short_prefetch_gain", "stream_overlap")  # fmt: skip
# Kernels keep matmul.h's software prefetch of streamed operands unless the probe measured a
# streamed decode product at least this much faster without it (timings scatter by a few %).
_PREFETCH_OFF_BELOW = 0.95
# The probe measures the overlap under the prefetch setting kernels will get, so it is told the
# threshold; the threshold is part of the probe's source and so of its cache key.
_SOURCE = f"""// mirage_jax host calibration probe
#include "cpu/calibrate.h"
MJ_EXPORT void {_SYMBOL}(double* out) {{ mj::probe::run(out, {_PREFETCH_OFF_BELOW!r}); }}
"""
_PREFETCH_MAX_RUN = 5120  # bytes per row of a strip, where long rows stream better without
# The probe's streamed product reads its weight in strips of 12 KiB and of 1 KiB per row.
_STRIP_LONG_BYTES, _STRIP_SHORT_BYTES = 12 * 1024, 1024

log = logging.getLogger("mirage_jax.search")
_CALIBRATION = namespace("calibration")


def calibration_enabled() -> bool:
    return os.environ.get(CALIBRATE_ENV, "1").strip().lower() not in ("0", "false", "no", "off")


@functools.cache
def host_model() -> CpuModel:
    """The cost model with this host's measured rates (``DEFAULT_MODEL`` when disabled)."""
    if not calibration_enabled():
        return DEFAULT_MODEL
    try:
        return model_from(measurements())
    except (MirageError, OSError, ValueError, KeyError) as e:
        log.warning("CPU cost model: calibration failed (%s); using the built-in defaults", e)
        return DEFAULT_MODEL


def measurements() -> dict[str, float]:
    """The probe's figures for this host, from the cache or measured now."""
    lib = compile_shared_library(_SOURCE, name_hint="calibrate")
    path = _CALIBRATION.entry(f"{_host_key(lib.key)}.json")

    def measure() -> None:
        _CALIBRATION.publish_text(path, json.dumps(_run_probe(lib.path), indent=1) + "\n")

    figures, measured = _CALIBRATION.get_or_create(path, _read_figures, measure)
    if measured:
        log.info("CPU cost model calibrated: %s", _describe(figures))
    return figures


def _read_figures(path: Path) -> dict[str, float]:
    """The cached figures; ValueError when the file does not hold exactly the probe's fields."""
    figures = json.loads(path.read_text())
    if not isinstance(figures, dict) or set(figures) != set(_FIELDS):
        raise ValueError(f"expected the probe's {len(_FIELDS)} fields")
    if not all(type(v) in (int, float) for v in figures.values()):
        raise ValueError("a figure is not a number")
    return figures


@functools.cache
def kernel_flags() -> tuple[str, ...]:
    """Build settings of the runtime that this host's measurements decide (compiler flags of
    every generated CPU kernel), for matmul.h's software prefetch of streamed operands:
    nothing where it helps (the Zen hosts) or calibration is off or failed;
    ``-DMJ_STREAM_PREFETCH_MAX_RUN=5120`` where the hardware prefetchers stream long rows
    better alone but short strips still gain from it (an Ice Lake Xeon: 12 KiB runs 1.2-1.3x
    faster without, 1 KiB runs 1.5x faster with; between those, 4 KiB runs gained 1.2x at
    M = 8 and 3 KiB ones ~1.03x at M = 16, while 6 KiB ones lost 1.1x at M = 16, so the limit
    sits at 5 KiB); ``-DMJ_STREAM_PREFETCH=0`` where it loses at both lengths."""
    if not calibration_enabled():
        return ()
    try:
        figures = measurements()
        gain, short_gain = figures["stream_prefetch_gain"], figures["short_prefetch_gain"]
    except (MirageError, OSError, ValueError, KeyError) as e:
        log.warning("kernel tuning: calibration failed (%s); using the runtime's defaults", e)
        return ()
    if gain >= _PREFETCH_OFF_BELOW:
        return ()
    if short_gain >= 1.0 / _PREFETCH_OFF_BELOW:
        return (f"-DMJ_STREAM_PREFETCH_MAX_RUN={_PREFETCH_MAX_RUN}",)
    return ("-DMJ_STREAM_PREFETCH=0",)


def model_from(figures: dict[str, float]) -> CpuModel:
    """``DEFAULT_MODEL`` with the measured rates in place of its defaults."""
    rates = tuple(figures[f"matmul{m}"] for m in (1, 2, 4, 8))
    return dataclasses.replace(
        DEFAULT_MODEL,
        cores=max(1, int(figures["cores"])),
        mem_bytes_per_s=figures["all_stream"],
        core_mem_bytes_per_s=figures["core_stream"],
        matmul_rates=rates,
        vector_elems=figures["vector"],
        strided_row_s=figures["strided_row"],
        strided_revisit_s=figures["strided_revisit"],
        strip_ref_bytes=_STRIP_LONG_BYTES,
        strip_exponent=strip_exponent(figures["strip_slowdown"]),
        # the probe is noisy: a product is neither faster than its longer part nor slower than
        # both parts one after the other
        overlap=min(1.0, max(0.0, figures["stream_overlap"])),
    )


def strip_exponent(slowdown: float) -> float:
    """The exponent p of the model's strip efficiency (run / 12 KiB) ** p that reproduces the
    probe's slowdown of 1 KiB runs against 12 KiB ones (clamped: a run is never faster than a
    longer one, and the probe is noisy)."""
    p = math.log(max(slowdown, 1.0)) / math.log(_STRIP_LONG_BYTES / _STRIP_SHORT_BYTES)
    return min(p, 0.6)


def _run_probe(lib_path: Path) -> dict[str, float]:
    fn = getattr(ctypes.CDLL(str(lib_path)), _SYMBOL)
    fn.restype = None
    fn.argtypes = [ctypes.POINTER(ctypes.c_double)]
    out = (ctypes.c_double * len(_FIELDS))()
    fn(out)
    figures = dict(zip(_FIELDS, map(float, out)))
    # every field is a rate, a time or a ratio of two, but the overlap, a difference of times
    if not all(v > 0 for k, v in figures.items() if k != "stream_overlap"):
        raise ValueError(f"the probe measured a non-positive rate: {figures}")
    return figures


def _host_key(library_key: str) -> str:
    ident = json.dumps([library_key, _cpu_name(), os.cpu_count()])
    return hashlib.sha256(ident.encode()).hexdigest()[:32]


def _cpu_name() -> str:
    for line in read_cpuinfo().splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "model name":
            return value.strip()
    import platform

    return platform.processor() or platform.machine()


def _describe(f: dict[str, float]) -> str:
    mm = "/".join(f"{f[f'matmul{m}'] / 1e9:.0f}" for m in (1, 2, 4, 8))
    return (f"matmul {mm} GFLOP/s per core (1/2/4/8 rows), map {f['vector'] / 1e9:.0f} G/s per "
            f"core, memory {f['core_stream'] / 1e9:.1f} GB/s one core, "
            f"{f['all_stream'] / 1e9:.1f} GB/s all {int(f['cores'])}, strided strip rows "
            f"{f['strided_row'] * 1e9:.1f} ns first, {f['strided_revisit'] * 1e9:.1f} ns "
            f"again, streamed matmul {f['stream_prefetch_gain']:.2f}x slower without software "
            f"prefetch ({f['short_prefetch_gain']:.2f}x in 1 KiB strips) and "
            f"{f['strip_slowdown']:.2f}x slower in 1 KiB strips, a streamed 16-row product "
            f"hiding {f['stream_overlap']:.2f} of its shorter part")  # fmt: skip


__all__ = ["CALIBRATE_ENV", "calibration_enabled", "host_model", "kernel_flags", "measurements",
           "model_from", "strip_exponent"]  # fmt: skip
