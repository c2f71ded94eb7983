// mirage_jax CUDA runtime: the platform layer every other header builds on.
//
// Generated kernels are ordinary CUDA. They compile two ways:
//   * with nvcc for the GPU (the real backend), or
//   * with a host C++ compiler and -DMJ_EMU, where emu.h runs every thread of a block as an OS
//     thread with real barriers. That mode exists so the generated code can be checked for
//     numerical correctness on machines without a GPU; it is slow and only meant for tests.
// Everything architecture-specific (cp.async, mma.sync, warp shuffles) goes through the
// wrappers below so both modes share one source.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#if defined(MJ_EMU)
#include "cuda/emu.h"
#elif !defined(__CUDACC__)
#error "compile generated CUDA with nvcc, or with a host compiler and -DMJ_EMU for emulation"
#else
#include <cuda_runtime.h>
#endif

#ifndef __launch_bounds__
#define __launch_bounds__(...)
#endif

#define MJ_HD __host__ __device__ __forceinline__
#define MJ_DEV __device__ __forceinline__

// Tensor cores (mma.sync m16n8k16 with f16/bf16 operands) need sm_80; emulation models them.
#if defined(MJ_EMU) || (defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800)
#define MJ_HAS_MMA 1
#define MJ_HAS_CP_ASYNC 1
#else
#define MJ_HAS_MMA 0
#define MJ_HAS_CP_ASYNC 0
#endif

#if defined(MJ_EMU)
#define MJ_DYN_SMEM(name) unsigned char* name = ::mj::emu::dynamic_smem()
#define MJ_LAUNCH(kernel, grid, block, smem, stream, ...) \
  ::mj::emu::launch(kernel, grid, block, smem, __VA_ARGS__)
#define MJ_SET_SMEM(kernel, bytes) ((void)0)
#define MJ_MEMCPY(dst, src, bytes, stream) std::memcpy(dst, src, bytes)
#define MJ_LAST_ERROR() 0
#else
#define MJ_DYN_SMEM(name) extern __shared__ __align__(16) unsigned char name[]
#define MJ_LAUNCH(kernel, grid, block, smem, stream, ...) \
  kernel<<<grid, block, smem, stream>>>(__VA_ARGS__)
// Blocks that need more than 48 KiB of dynamic shared memory must opt in once per kernel.
#define MJ_SET_SMEM(kernel, bytes)                                                        \
  do {                                                                                    \
    static bool mj_smem_set_ = false;                                                     \
    if (!mj_smem_set_) {                                                                  \
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (bytes)); \
      mj_smem_set_ = true;                                                                \
    }                                                                                     \
  } while (0)
#define MJ_MEMCPY(dst, src, bytes, stream) \
  cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream)
#define MJ_LAST_ERROR() static_cast<int>(cudaGetLastError())
#endif

namespace mj {

using half = __half;
using bf16 = __nv_bfloat16;

// ---------------------------------------------------------------------------- conversions
// Arithmetic happens in the compute type: double if any operand is double, else float.

MJ_HD float to_f(float x) { return x; }
MJ_HD float to_f(double x) { return static_cast<float>(x); }
MJ_HD float to_f(half x) { return __half2float(x); }
MJ_HD float to_f(bf16 x) { return __bfloat162float(x); }
MJ_HD float to_f(bool x) { return x ? 1.0f : 0.0f; }  // a mask (where / where_not only)

template <class To>
MJ_HD To from_f(float x);
template <>
MJ_HD float from_f<float>(float x) { return x; }
template <>
MJ_HD double from_f<double>(float x) { return x; }
template <>
MJ_HD half from_f<half>(float x) { return __float2half_rn(x); }
template <>
MJ_HD bf16 from_f<bf16>(float x) { return __float2bfloat16_rn(x); }

template <class To, class From>
MJ_HD To cvt(From x) {
  if constexpr (std::is_same_v<To, From>) {
    return x;
  } else if constexpr (std::is_same_v<To, double>) {
    return static_cast<double>(to_f(x));
  } else {
    return from_f<To>(to_f(x));
  }
}

template <class... T>
using compute_t = std::conditional_t<(std::is_same_v<T, double> || ...), double, float>;

template <class T>
MJ_HD uint16_t bits16(T x) {
  static_assert(sizeof(T) == 2, "16-bit types only");
  uint16_t u;
  std::memcpy(&u, &x, 2);
  return u;
}

// Two 16-bit values in one 32-bit register, the lower index in the low half (PTX f16x2 order).
template <class T>
MJ_HD uint32_t pack2(T lo, T hi) {
  return static_cast<uint32_t>(bits16(lo)) | (static_cast<uint32_t>(bits16(hi)) << 16);
}

// ---------------------------------------------------------------------------- math
// Accurate libm versions (not the __expf intrinsics): results are compared against XLA.

MJ_HD float m_exp(float x) { return ::expf(x); }
MJ_HD double m_exp(double x) { return ::exp(x); }
MJ_HD float m_log(float x) { return ::logf(x); }
MJ_HD double m_log(double x) { return ::log(x); }
MJ_HD float m_sqrt(float x) { return ::sqrtf(x); }
MJ_HD double m_sqrt(double x) { return ::sqrt(x); }
MJ_HD float m_tanh(float x) { return ::tanhf(x); }
MJ_HD double m_tanh(double x) { return ::tanh(x); }
MJ_HD float m_erf(float x) { return ::erff(x); }
MJ_HD double m_erf(double x) { return ::erf(x); }
MJ_HD float m_erfc(float x) { return ::erfcf(x); }
MJ_HD double m_erfc(double x) { return ::erfc(x); }
MJ_HD float m_sin(float x) { return ::sinf(x); }
MJ_HD double m_sin(double x) { return ::sin(x); }
MJ_HD float m_cos(float x) { return ::cosf(x); }
MJ_HD double m_cos(double x) { return ::cos(x); }
MJ_HD float m_rem(float x, float y) { return ::fmodf(x, y); }
MJ_HD double m_rem(double x, double y) { return ::fmod(x, y); }
#if defined(MJ_EMU)
// Host libm has no erfinv: Newton steps from sqrt(-log(1 - x^2)), on erf near 0 and on
// log(erfc) in the tail (where erf saturates), to a few ulps of double.
inline double m_erfinv(double x) {
  const double a = std::fabs(x);
  if (!(a < 1.0)) return a == 1.0 ? x * static_cast<double>(INFINITY) : static_cast<double>(NAN);
  double y = std::sqrt(-std::log((1.0 - a) * (1.0 + a)));
  for (int i = 0; i < 100; ++i) {
    const double d = 1.1283791670955126 * std::exp(-y * y);  // erf'(y)
    const double e = std::erfc(y);
    const double step = a < 0.5 ? (std::erf(y) - a) / d : -(std::log(e) - std::log1p(-a)) * e / d;
    y -= step;
    if (std::fabs(step) <= 1e-15 * y) break;
  }
  return std::copysign(y, x);
}
inline float m_erfinv(float x) { return static_cast<float>(m_erfinv(static_cast<double>(x))); }
#else
MJ_HD float m_erfinv(float x) { return ::erfinvf(x); }
MJ_HD double m_erfinv(double x) { return ::erfinv(x); }
#endif
MJ_HD float m_pow(float x, float y) { return ::powf(x, y); }
MJ_HD double m_pow(double x, double y) { return ::pow(x, y); }

template <class C>
MJ_HD C neg_inf() {
  return -static_cast<C>(INFINITY);
}

// NaN-propagating max, like jnp.maximum, with +0 above -0 as in XLA: of equal operands, a + b
// is +0 for +0 and -0 (and -0 only for two -0s); other equal operands are returned as they are.
template <class C>
MJ_HD C m_max(C a, C b) {
  if (a == b) return a + b == C(0) ? a + b : a;
  return (a != a || a > b) ? a : b;
}

// ---------------------------------------------------------------------------- threads

MJ_DEV int thread_id() { return static_cast<int>(threadIdx.x); }

MJ_DEV float shfl_xor(float v, int mask) {
#if defined(MJ_EMU)
  return ::mj::emu::shfl_xor(v, mask);
#else
  return __shfl_xor_sync(0xffffffffu, v, mask);
#endif
}

MJ_DEV double shfl_xor(double v, int mask) {
#if defined(MJ_EMU)
  return ::mj::emu::shfl_xor(v, mask);
#else
  return __shfl_xor_sync(0xffffffffu, v, mask);
#endif
}

}  // namespace mj
