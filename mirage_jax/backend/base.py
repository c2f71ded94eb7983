"""The ``Backend`` interface: everything the planner and the search need from one target.

A backend is chosen once per region (``mirage_jax.backend.backend_for``) and passed down: the
search ranks candidates with ``cost_model()`` and times them with ``timer()``; the planner
compiles the winner with ``compile``; kernel libraries are written with ``emit`` and the
``library_*`` facts and loaded back with ``load_library_kernel``; ``cache_facts`` goes into
every decision key so a plan made for one machine is never reused on another.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import jax

from mirage_jax.interpret.numerics import sample_inputs
from mirage_jax.ir import KernelGraph
from mirage_jax.timing import device_args, median_seconds

# A compiled region: takes and returns jax arrays (a tuple, one per graph output); traceable
# inside jax.jit.
KernelCall = Callable[..., tuple[Any, ...]]


class CostModel(abc.ABC):
    """An analytic estimate of a μGraph's run time on one backend, in seconds."""

    @abc.abstractmethod
    def estimate_s(self, graph: KernelGraph) -> float:
        """Predicted seconds; ``math.inf`` for a graph this backend cannot run."""

    @abc.abstractmethod
    def fused_s(self, nbytes: float, matmul_flops: float, element_ops: float) -> float:
        """Seconds of one kernel that moves ``nbytes`` through memory and does the given work
        at this machine's ceilings: what a fused region at best costs (the frontend prices the
        pieces of a split region with it, before any μGraph exists)."""


class Backend(abc.ABC):
    """One code generator and the machine it targets (see the module docstring)."""

    name: str = ""
    # file suffix of one emitted kernel source in a kernel library
    source_suffix: str = ""
    # prefix of exported kernel symbols (distinct per backend: a library names its kernels)
    symbol_prefix: str = "mj_"

    @abc.abstractmethod
    def target(self) -> str:
        """The instruction set kernels are built for (an ISA level, a GPU arch): a library or
        a decision made for another target is refused."""

    @abc.abstractmethod
    def cache_facts(self) -> dict[str, str]:
        """Facts that change which plan is best or valid here, for decision keys."""

    @abc.abstractmethod
    def cost_model(self) -> CostModel:
        """This backend's cost model (calibrated to this machine where the backend can)."""

    @abc.abstractmethod
    def emit(self, graph: KernelGraph, symbol: str) -> str:
        """The source of ``graph`` as one exported function named ``symbol``."""

    @abc.abstractmethod
    def compile(self, graph: KernelGraph) -> KernelCall:
        """Emit, build (cached by content) and register ``graph``; a jax-traceable call."""

    @abc.abstractmethod
    def include_dir(self) -> Path:
        """The runtime headers generated sources include (shipped inside kernel libraries)."""

    @abc.abstractmethod
    def library_cmake(self) -> str:
        """The ``CMakeLists.txt`` that builds a kernel library's ``sources/`` into
        ``lib/libmirage_kernels.so``."""

    @abc.abstractmethod
    def load_library_kernel(self, lib_path: Path, key: str, graph: KernelGraph,
                            symbol: str) -> KernelCall:  # fmt: skip
        """Register ``symbol`` of a built kernel library; its jax-traceable call."""

    def symbol(self, graph: KernelGraph) -> str:
        """The exported name of ``graph``'s kernel: content-derived, so stable across runs."""
        return self.symbol_prefix + graph.fingerprint()[:24]

    def timer(self, budget_s: float = 0.15, working_set_bytes: int = 0
              ) -> Callable[[KernelGraph], float | None]:  # fmt: skip
        """Compile a candidate on this backend and take its median call time, its inputs
        taken in turns from copies as large as ``working_set_bytes`` (the program a region is
        a piece of: ``timing.median_seconds``).

        Compiled callables and their inputs are kept per graph, so timing rounds re-time a
        candidate without compiling it again."""
        prepared: dict[str, tuple[Any, Sequence[Any]]] = {}

        def measure(graph: KernelGraph) -> float | None:
            key = graph.fingerprint()
            if key not in prepared:
                fn = jax.jit(self.compile(graph))
                prepared[key] = fn, device_args(sample_inputs(graph.input_types))
            fn, args = prepared[key]
            return median_seconds(fn, args, budget_s=budget_s,
                                  working_set_bytes=working_set_bytes)  # fmt: skip

        return measure

    def __repr__(self) -> str:
        return f"<mirage_jax {self.name} backend>"


def bind_kernel(ffi_call: Callable[..., Sequence[Any]], name: str, graph: KernelGraph
                ) -> KernelCall:  # fmt: skip
    """The jax-traceable call of registered kernel ``name`` computing ``graph``, through a
    runtime's ``ffi_call(name, output_avals, *args)``."""
    avals = [jax.ShapeDtypeStruct(t.shape, t.dtype.numpy) for t in graph.output_types]

    def call(*args: Any) -> tuple[Any, ...]:
        return tuple(ffi_call(name, avals, *args))

    return call


def library_cmake(language: str, suffix: str, flags: str, properties: str) -> str:
    """The ``CMakeLists.txt`` of a kernel library: every ``sources/*{suffix}`` into
    ``lib/libmirage_kernels.so`` with ``flags``; ``properties`` are extra target properties."""
    return _CMAKE.format(language=language, suffix=suffix, flags=flags, properties=properties)


_CMAKE = """cmake_minimum_required(VERSION 3.18)
project(mirage_kernels {language})
file(GLOB MJ_SOURCES CONFIGURE_DEPENDS ${{CMAKE_CURRENT_SOURCE_DIR}}/sources/*{suffix})
if(NOT MJ_SOURCES)
  # A library whose every region stays with XLA still ships a (trivial) shared object.
  file(WRITE ${{CMAKE_CURRENT_BINARY_DIR}}/empty{suffix} "extern \\"C\\" int mj_empty() {{ return 0; }}\\n")
  set(MJ_SOURCES ${{CMAKE_CURRENT_BINARY_DIR}}/empty{suffix})
endif()
add_library(mirage_kernels SHARED ${{MJ_SOURCES}})
target_include_directories(mirage_kernels PRIVATE ${{CMAKE_CURRENT_SOURCE_DIR}}/include)
separate_arguments(MJ_FLAGS UNIX_COMMAND "{flags}")
target_compile_options(mirage_kernels PRIVATE ${{MJ_FLAGS}})
set_target_properties(mirage_kernels PROPERTIES {properties}
  LIBRARY_OUTPUT_DIRECTORY ${{CMAKE_CURRENT_SOURCE_DIR}}/lib)
"""


__all__ = ["Backend", "CostModel", "KernelCall", "bind_kernel", "library_cmake"]
