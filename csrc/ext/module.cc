// mirage_jax._C: the native core, kept deliberately small.
//
// It exposes the one generic XLA FFI dispatcher as a PyCapsule (registered with
// jax.ffi.register_ffi_target by mirage_jax.runtime), the name -> kernel registry the
// dispatcher reads, the CPU ISA probe, and the search's block-level DFS (csrc/search).
// Generated kernels never link against it.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <string>

#include "dispatch.h"
#include "search/block_dfs.h"

namespace py = pybind11;

PYBIND11_MODULE(_C, m) {
  m.doc() = "mirage_jax native core: generic XLA FFI CPU dispatcher and kernel registry.";
  m.attr("ABI_VERSION") = MJ_ABI_VERSION;
  m.attr("DISPATCH_TARGET") = "mirage_jax_dispatch";

  m.def(
      "dispatch_capsule",
      [] { return py::capsule(reinterpret_cast<void*>(&MirageJaxDispatch)); },
      "PyCapsule holding the XLA FFI handler; pass it to jax.ffi.register_ffi_target.");

  m.def(
      "register_kernel",
      [](const std::string& name, std::uintptr_t address) {
        if (name.empty()) throw py::value_error("kernel name must not be empty");
        if (address == 0) throw py::value_error("kernel address must not be 0 (NULL)");
        mirage_jax::RegisterKernel(name, reinterpret_cast<mj_kernel_fn>(address));
      },
      py::arg("name"), py::arg("address"),
      "Registers (or replaces) the kernel `name` at function address `address`, which must "
      "implement mj_kernel_fn from cpu/abi.h and stay loaded for the life of the process.");

  m.def(
      "has_kernel", [](const std::string& name) { return mirage_jax::FindKernel(name) != nullptr; },
      py::arg("name"), "Whether a kernel of this name is registered.");

  m.def("registered_kernels", &mirage_jax::RegisteredKernels,
        "Names of all registered kernels, sorted.");

  m.def("cpu_isa", [] { return std::string(mirage_jax::CpuIsa()); },
        "Best ISA this CPU and OS support: 'avx512', 'avx2' or 'generic'.");

  mirage_jax::search::BindBlockSearch(m);
}
