/* mirage_jax CPU kernel ABI.
 *
 * The one contract between generated kernels and the generic XLA FFI dispatcher in
 * mirage_jax._C.  Kernels are plain C/C++ functions with this signature; they include no XLA
 * header, so compiling one takes ~0.1 s instead of the ~2 s an FFI handler costs.
 *
 * Generated code includes it as  #include "cpu/abi.h"  (the include root is csrc/runtime in a
 * source checkout and mirage_jax/_runtime_headers in an installed wheel; build.py passes -I).
 *
 * This header must stay valid C and C++: it is the ABI, so change it only together with the
 * dispatcher (csrc/ext) and bump MJ_ABI_VERSION.
 */
#ifndef MIRAGE_JAX_RUNTIME_CPU_ABI_H_
#define MIRAGE_JAX_RUNTIME_CPU_ABI_H_

#include <stdint.h>

#define MJ_ABI_VERSION 1

#ifdef __cplusplus
extern "C" {
#endif

/* XLA's intra-op thread pool, as seen by a kernel.
 *
 * parallel_for(ctx, n, fn, arg) runs fn(arg, i) once for every i in [0, n), spread over the pool
 * workers and the calling thread, and returns when all calls are done.  Indices are handed out
 * in contiguous chunks, so neighbouring i usually run on the same thread.  It never spawns a
 * thread; n <= 1 or a one-thread pool runs inline.  fn must not throw.  Nested calls are allowed
 * (the caller always helps, so they cannot deadlock). */
typedef struct mj_pool {
  void* ctx;
  int num_threads; /* workers available incl. the caller (>= 1) */
  void (*parallel_for)(void* ctx, int64_t n, void (*fn)(void* arg, int64_t i), void* arg);
} mj_pool;

/* A kernel: inputs[k] / outputs[k] are the dense row-major buffers of the custom call's k-th
 * operand / result, in order, with the shapes and dtypes the kernel was generated for.
 * Return 0 on success; any other value makes the XLA call fail with an error naming the kernel
 * and the code. */
typedef int (*mj_kernel_fn)(const void* const* inputs, void* const* outputs, const mj_pool* pool);

#ifdef __cplusplus
} /* extern "C" */
#define MJ_EXTERN_C extern "C"
#else
#define MJ_EXTERN_C
#endif

/* Put before a kernel definition so it is exported with C linkage even under
 * -fvisibility=hidden:  MJ_EXPORT int my_kernel(const void* const* in, void* const* out,
 *                                               const mj_pool* pool) { ... } */
#define MJ_EXPORT MJ_EXTERN_C __attribute__((visibility("default")))

#endif /* MIRAGE_JAX_RUNTIME_CPU_ABI_H_ */
