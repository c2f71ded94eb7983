"""``CudaBackend``: generated CUDA built by nvcc for this process's GPU, ranked by the GPU model."""

from __future__ import annotations

import functools
from pathlib import Path

import jax

from mirage_jax.backend.base import (
    Backend,
    CostModel,
    KernelCall,
    bind_kernel,
    library_cmake,
)
from mirage_jax.backend.cuda.build import build_cuda, runtime_include_dir
from mirage_jax.backend.cuda.cost import A100, H100, H200, GpuSpec, estimate, fused_time
from mirage_jax.backend.cuda.emit import emit_cuda
from mirage_jax.ir import KernelGraph
from mirage_jax.runtime.cuda import cuda_kernel_call, device_arch, load_cuda_kernel


class CudaCostModel(CostModel):
    """The analytic GPU model (``backend.cuda.cost``) for one GPU; infeasible graphs are inf."""

    def __init__(self, spec: GpuSpec) -> None:
        self.spec = spec

    def estimate_s(self, graph: KernelGraph) -> float:
        return estimate(graph, self.spec).time_s

    def fused_s(self, nbytes: float, matmul_flops: float, element_ops: float) -> float:
        return fused_time(nbytes, matmul_flops, element_ops, self.spec)

    def __repr__(self) -> str:
        return f"CudaCostModel({self.spec.name})"


class CudaBackend(Backend):
    """Kernels for an NVIDIA GPU: ``arch`` (sm_90a, sm_80) defaults to this process's GPU's,
    ``spec`` (the cost model's figures) to the GPU's kind."""

    name = "cuda"
    source_suffix = ".cu"
    symbol_prefix = "mjc_"

    def __init__(self, arch: str | None = None, spec: GpuSpec | None = None) -> None:
        self._arch, self._spec = arch, spec

    def target(self) -> str:
        return self._arch or device_arch()

    def spec(self) -> GpuSpec:
        return self._spec or gpu_spec(_device_kind())

    def cache_facts(self) -> dict[str, str]:
        return {"backend": self.name, "arch": self.target(), "gpu": self.spec().name}

    def cost_model(self) -> CostModel:
        return CudaCostModel(self.spec())

    def emit(self, graph: KernelGraph, symbol: str) -> str:
        return emit_cuda(graph, symbol)

    def compile(self, graph: KernelGraph) -> KernelCall:
        symbol = self.symbol(graph)
        lib = build_cuda(emit_cuda(graph, symbol), arch=self.target(), kind="shared",
                         name_hint=symbol)  # fmt: skip
        return bind_kernel(cuda_kernel_call, load_cuda_kernel(lib, symbol), graph)

    def include_dir(self) -> Path:
        return runtime_include_dir()

    def library_cmake(self) -> str:
        flags = f"-arch={self.target()} -O3 -Xcompiler -fPIC -I{jax.ffi.include_dir()}"
        # the arch is in the flags: sm_90a needs nvcc's spelling, which older CMake cannot name
        return library_cmake("CUDA", self.source_suffix, flags,
                             "CUDA_ARCHITECTURES OFF CUDA_STANDARD 17")  # fmt: skip

    def load_library_kernel(self, lib_path: Path, key: str, graph: KernelGraph,
                            symbol: str) -> KernelCall:  # fmt: skip
        return bind_kernel(cuda_kernel_call, load_cuda_kernel(lib_path, symbol), graph)


def gpu_spec(device_kind: str) -> GpuSpec:
    """The cost model's figures for a jax ``device_kind`` ("NVIDIA H100 80GB HBM3", ...);
    an unknown GPU gets the H200's."""
    kind = device_kind.upper()
    for marker, spec in (("H100", H100), ("A100", A100), ("H200", H200)):
        if marker in kind:
            return spec
    return H200


def _device_kind() -> str:
    try:
        return str(jax.devices("gpu")[0].device_kind)
    except RuntimeError:  # no GPU in this process: the model still ranks for the default GPU
        return ""


@functools.cache
def cuda_backend() -> CudaBackend:
    """The process's CUDA backend (arch and GPU model resolved from the device on use)."""
    return CudaBackend()


__all__ = ["CudaBackend", "CudaCostModel", "cuda_backend", "gpu_spec"]
