"""The Backend seam: which backend a region gets, and that the search ranks with its model.

A region's backend is chosen once from the device its inputs live on and passed down: the
search ranks candidates with that backend's cost model (so on a GPU the CUDA model ranks, not
the CPU one), times them with its timer, and kernel libraries are written for it.
"""

from __future__ import annotations

import json
import subprocess

import jax
import numpy as np
import pytest
from graphs import T, rmsnorm_linear_plain

import mirage_jax as mj
from mirage_jax.api import libraries as precompile_mod
from mirage_jax.backend import backend_for, get_backend, platform_for
from mirage_jax.backend.cpu.backend import CpuBackend
from mirage_jax.backend.cpu.cost import DEFAULT_MODEL
from mirage_jax.backend.cpu.cost import estimate as cpu_estimate
from mirage_jax.backend.cuda.backend import CudaBackend, gpu_spec
from mirage_jax.backend.cuda.cost import H100, H200
from mirage_jax.backend.cuda.cost import estimate as gpu_estimate
from mirage_jax.errors import MirageError
from mirage_jax.ir import KernelBuilder, Op
from mirage_jax.planner.library import LIB_NAME
from mirage_jax.search import SearchConfig


class _FakeDevice:
    """Stands in for a jax Device of another platform (no GPU on the test machines)."""

    def __init__(self, platform: str, version: str = "cuda 12.8") -> None:
        self.platform, self.id = platform, 0
        self.client = type("Client", (), {"platform_version": version})()


def test_host_arrays_and_devices_get_the_cpu_backend() -> None:
    assert platform_for([np.zeros(3), jax.numpy.ones(2)]) == "cpu"
    assert platform_for(jax.devices("cpu")[0]) == "cpu"
    assert platform_for(jax.device_put(np.ones(2), jax.devices("cpu")[0])) == "cpu"
    assert isinstance(backend_for(np.zeros(3)), CpuBackend)


def test_gpu_devices_get_the_cuda_backend_and_others_are_refused() -> None:
    assert platform_for([_FakeDevice("gpu"), _FakeDevice("gpu")]) == "cuda"
    assert isinstance(backend_for(_FakeDevice("gpu")), CudaBackend)
    with pytest.raises(MirageError, match="different platforms"):
        platform_for([_FakeDevice("gpu"), _FakeDevice("cpu")])
    with pytest.raises(MirageError, match="rocm"):
        platform_for(_FakeDevice("gpu", "rocm 6.0"))
    with pytest.raises(MirageError, match="tpu"):
        platform_for(_FakeDevice("tpu"))
    with pytest.raises(MirageError, match="no 'tpu' backend"):
        get_backend("tpu")


def test_the_gpu_model_follows_the_device_kind() -> None:
    assert gpu_spec("NVIDIA H100 80GB HBM3") is H100
    assert gpu_spec("NVIDIA H200") is H200
    assert gpu_spec("some future GPU") is H200


def _search(backend, graph):
    config = SearchConfig(workers=1, time_candidates=False, max_verify=4, progress=False,
                          time_budget_s=60.0, max_tasks=40)  # fmt: skip
    return mj.superoptimize(graph, config, backend=backend)


@pytest.mark.parametrize("which", ["cpu", "cuda"])
def test_the_search_ranks_with_the_backends_cost_model(which: str) -> None:
    """A CUDA backend with a stub device (no GPU here): its H100 model ranks, and every
    candidate's estimate is that model's; the CPU backend's is the CPU model's."""
    graph = rmsnorm_linear_plain(8, 256, 128)
    if which == "cuda":
        backend, model = CudaBackend(arch="sm_90a", spec=H100), "CudaCostModel(H100-SXM)"

        def expected(g):
            return gpu_estimate(g, H100).time_s
    else:
        backend, model = CpuBackend(), "CpuCostModel"

        def expected(g):
            return cpu_estimate(g, backend.cost_model().model).time_s

    result = _search(backend, graph)
    assert result.report.cost_model.startswith(model)
    assert model in str(result.report)
    assert result.verified, str(result.report)
    for cand in result.verified:
        assert cand.estimate_s == pytest.approx(expected(cand.graph), rel=1e-12)
    if which == "cuda":  # the two models disagree, so the check above tells them apart
        assert any(gpu_estimate(c.graph, H100).time_s
                   != pytest.approx(cpu_estimate(c.graph, DEFAULT_MODEL).time_s, rel=1e-3)
                   for c in result.verified)  # fmt: skip


def test_a_library_is_written_for_the_backend_it_was_searched_for(tmp_path) -> None:
    """The CUDA backend's library holds CUDA sources, says so, and builds with cmake and nvcc
    into a library exporting the kernel (loading it needs a GPU)."""
    kb = KernelBuilder()
    x = kb.input(T(4, 64))
    kb.output(kb.apply(Op.EXP, x))
    graph = kb.build()
    region = type("RegionPlan", (), {"key": "k0", "reason": "", "mirage_s": 1e-6, "xla_s": 2e-6,
                                      "graph": graph, "impl": object(), "target": graph})()  # fmt: skip
    backend = CudaBackend(arch="sm_90a", spec=H100)
    out = precompile_mod.write_library([region], tmp_path / "lib", backend)
    manifest = json.loads((out / "manifest.json").read_text())
    assert (manifest["backend"], manifest["isa"]) == ("cuda", "sm_90a")
    (source,) = (out / "sources").iterdir()
    assert source.suffix == ".cu" and source.stem == manifest["regions"][0]["symbol"]
    assert "mirage_jax.backend.cuda.emit" in source.read_text()  # the CUDA emitter wrote it
    assert "project(mirage_kernels CUDA)" in (out / "CMakeLists.txt").read_text()
    assert "-arch=sm_90a" in (out / "CMakeLists.txt").read_text()
    symbols = subprocess.run(["nm", "-D", "--defined-only", str(out / "lib" / LIB_NAME)],
                             capture_output=True, text=True, check=True).stdout  # fmt: skip
    assert source.stem in symbols
