"""``CpuBackend``: generated C++ built by the host compiler, ranked by the calibrated CPU model."""

from __future__ import annotations

import functools
from pathlib import Path

from mirage_jax.backend.base import (
    Backend,
    CostModel,
    KernelCall,
    bind_kernel,
    library_cmake,
)
from mirage_jax.backend.cpu.build import compile_shared_library, runtime_include_dir
from mirage_jax.backend.cpu.calibrate import host_model, kernel_flags
from mirage_jax.backend.cpu.cost import CpuModel, estimate, fused_time
from mirage_jax.backend.cpu.emit import emit_cpu
from mirage_jax.backend.cpu.isa import host_isa, isa_flags
from mirage_jax.ir import KernelGraph
from mirage_jax.runtime import kernel_call, load_kernel
from mirage_jax.runtime.loader import CompiledLibrary


class CpuCostModel(CostModel):
    """The analytic CPU model (``backend.cpu.cost``) at one set of machine rates."""

    def __init__(self, model: CpuModel) -> None:
        self.model = model

    def estimate_s(self, graph: KernelGraph) -> float:
        return estimate(graph, self.model).time_s

    def fused_s(self, nbytes: float, matmul_flops: float, element_ops: float) -> float:
        return fused_time(nbytes, matmul_flops, element_ops, self.model)

    def __repr__(self) -> str:
        return f"CpuCostModel({self.model!r})"


class CpuBackend(Backend):
    """Kernels for this host's CPU at its ISA level (``MIRAGE_JAX_ISA`` caps it)."""

    name = "cpu"
    source_suffix = ".cpp"
    symbol_prefix = "mj_"

    def target(self) -> str:
        return host_isa()

    def cache_facts(self) -> dict[str, str]:
        return {"backend": self.name, "isa": host_isa()}

    def cost_model(self) -> CostModel:
        # calibrates once per host (cached on disk), before any search worker loads the cores
        return CpuCostModel(host_model())

    def emit(self, graph: KernelGraph, symbol: str) -> str:
        return emit_cpu(graph, symbol)

    def compile(self, graph: KernelGraph) -> KernelCall:
        symbol = self.symbol(graph)
        lib = compile_shared_library(emit_cpu(graph, symbol), name_hint=symbol,
                                     extra_flags=kernel_flags())  # fmt: skip
        return bind_kernel(kernel_call, load_kernel(lib, symbol), graph)

    def include_dir(self) -> Path:
        return runtime_include_dir()

    def library_cmake(self) -> str:
        flags = " ".join(("-O3", *isa_flags(host_isa()), *kernel_flags()))
        return library_cmake("CXX", self.source_suffix, flags,
                             "CXX_STANDARD 17 CXX_STANDARD_REQUIRED ON")  # fmt: skip

    def load_library_kernel(self, lib_path: Path, key: str, graph: KernelGraph,
                            symbol: str) -> KernelCall:  # fmt: skip
        return bind_kernel(kernel_call, load_kernel(CompiledLibrary(lib_path, key), symbol), graph)


@functools.cache
def cpu_backend() -> CpuBackend:
    """The process's CPU backend (stateless; one instance keeps ``repr`` and keys simple)."""
    return CpuBackend()


__all__ = ["CpuBackend", "CpuCostModel", "cpu_backend"]
