// The generic XLA FFI CPU dispatcher and its kernel registry.
//
// One handler, compiled once into mirage_jax._C, serves every generated kernel: the HLO names
// the kernel by a string attribute, the handler looks the name up in a process-wide registry
// and calls the function pointer through the C ABI in csrc/runtime/cpu/abi.h.  Names (not
// addresses) are what the HLO carries, so persistent compilation caches stay valid across
// processes.
#ifndef MIRAGE_JAX_EXT_DISPATCH_H_
#define MIRAGE_JAX_EXT_DISPATCH_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "cpu/abi.h"
#include "xla/ffi/api/c_api.h"

namespace mirage_jax {

// Registers (or replaces) the kernel called `name`.  Thread-safe.
void RegisterKernel(std::string name, mj_kernel_fn fn);

// The registered kernel, or nullptr.  Thread-safe; takes a shared lock only.
mj_kernel_fn FindKernel(std::string_view name);

// Names of all registered kernels, sorted.
std::vector<std::string> RegisteredKernels();

// Best ISA of this CPU: "avx512", "avx2" or "generic".
const char* CpuIsa();

}  // namespace mirage_jax

// The FFI handler symbol (XLA_FFI_DEFINE_HANDLER_SYMBOL makes it extern "C").
extern "C" XLA_FFI_Error* MirageJaxDispatch(XLA_FFI_CallFrame* call_frame);

#endif  // MIRAGE_JAX_EXT_DISPATCH_H_
