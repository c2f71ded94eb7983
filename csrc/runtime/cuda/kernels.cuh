// Kernel-level predefined operators as simple standalone kernels (the ops of a kernel graph
// that are not graph-defined): elementwise with broadcasting, reductions, concat, slice, transpose,
// cast, and a tiled FMA matmul. Launch shapes are chosen by the emitter; every kernel is
// correct for any grid (grid-stride loops) and uses 1-D blocks.
#pragma once

#include "cuda/layout.cuh"
#include "cuda/mma.cuh"
#include "cuda/ops.cuh"

namespace mj {

MJ_DEV int global_tid() { return static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x); }
MJ_DEV int global_threads() { return static_cast<int>(gridDim.x * blockDim.x); }

template <class Op, class L, class TO, class TI>
__global__ void __launch_bounds__(256) k_unary(TO* __restrict__ out, const TI* __restrict__ in,
                                               double s) {
  using C = compute_t<TO, TI>;
  for (int i = global_tid(); i < L::size; i += global_threads()) {
    out[i] = cvt<TO>(Op::template f<C>(cvt<C>(in[i]), C(s)));
  }
}

template <class Op, class LO, class LA, class LB, class TO, class TA, class TB>
__global__ void __launch_bounds__(256) k_binary(TO* __restrict__ out, const TA* __restrict__ a,
                                                const TB* __restrict__ b, double s) {
  using C = compute_t<TO, TA, TB>;
  for (int i = global_tid(); i < LO::size; i += global_threads()) {
    out[i] = cvt<TO>(Op::template f<C>(cvt<C>(a[bcast_offset<LO, LA>(i)]),
                                       cvt<C>(b[bcast_offset<LO, LB>(i)]), C(s)));
  }
}

// One warp per output element; the warp loop is uniform over the grid so shuffles see whole
// warps.
template <class R, class LO, class LI, int DIM, class TO, class TI>
__global__ void __launch_bounds__(256) k_reduce(TO* __restrict__ out, const TI* __restrict__ in) {
  using C = compute_t<TO, TI>;
  constexpr int n = LI::dim(DIM), st = LI::stride(DIM);
  const int warps = global_threads() / 32, w = global_tid() / 32, lane = global_tid() % 32;
  for (int o0 = 0; o0 < LO::size; o0 += warps) {
    const int o = o0 + w;
    C acc = R::template init<C>();
    if (o < LO::size) {
      const int base = bcast_offset<LO, LI>(o);
      for (int j = lane; j < n; j += 32) acc = R::combine(acc, R::map(cvt<C>(in[base + j * st])));
    }
#pragma unroll
    for (int m = 16; m >= 1; m /= 2) acc = R::combine(acc, shfl_xor(acc, m));
    if (o < LO::size && lane == 0) out[o] = cvt<TO>(R::finish(acc, n));
  }
}

template <class LO, class LA, class LB, int DIM, class TO, class TA, class TB>
__global__ void __launch_bounds__(256) k_concat(TO* __restrict__ out, const TA* __restrict__ a,
                                                const TB* __restrict__ b) {
  constexpr int inner = LO::stride(DIM);
  constexpr int na = LA::dim(DIM), nb = LB::dim(DIM), no = LO::dim(DIM);
  for (int i = global_tid(); i < LO::size; i += global_threads()) {
    const int outer = i / (inner * no), c = (i / inner) % no, in = i % inner;
    out[i] = c < na ? cvt<TO>(a[(outer * na + c) * inner + in])
                    : cvt<TO>(b[(outer * nb + (c - na)) * inner + in]);
  }
}

// out = in[..., START:START + n, ...] along DIM (n: out's extent there).
template <class LO, class LI, int DIM, int START, class TO, class TI>
__global__ void __launch_bounds__(256) k_slice(TO* __restrict__ out, const TI* __restrict__ in) {
  constexpr int inner = LO::stride(DIM);
  constexpr int no = LO::dim(DIM), ni = LI::dim(DIM);
  for (int i = global_tid(); i < LO::size; i += global_threads()) {
    const int outer = i / (inner * no), c = (i / inner) % no, rest = i % inner;
    out[i] = cvt<TO>(in[(outer * ni + START + c) * inner + rest]);
  }
}

// out dim d is in dim P[d].
template <class LO, class LI, class TO, class TI, int... P>
__global__ void __launch_bounds__(256) k_transpose(TO* __restrict__ out,
                                                   const TI* __restrict__ in) {
  static_assert(sizeof...(P) == LO::rank, "one perm entry per dim");
  constexpr int perm[] = {P...};
  for (int i = global_tid(); i < LO::size; i += global_threads()) {
    int rem = i, off = 0;
#pragma unroll
    for (int d = LO::rank - 1; d >= 0; --d) {
      off += (rem % LO::dim(d)) * LI::stride(perm[d]);
      rem /= LO::dim(d);
    }
    out[i] = cvt<TO>(in[off]);
  }
}

// Batched C = A @ B: 64x64 output tile per block (grid: N tiles, M tiles, batch), 256 threads
// with 4x4 outputs each, K in steps of 16 through 2 * 16 * 64 compute-type words of dynamic
// shared memory.
constexpr int kMatmulTile = 64;
constexpr int kMatmulK = 16;

template <class LA, class LB, class LC, class TA, class TB, class TC>
__global__ void __launch_bounds__(256) k_matmul(TC* __restrict__ c, const TA* __restrict__ a,
                                                const TB* __restrict__ b) {
  using S = MatmulShape<LA, LB>;
  using C = compute_t<TA, TB, TC>;
  constexpr int M = S::M, N = S::N, K = S::K, T = kMatmulTile, KS = kMatmulK;
  MJ_DYN_SMEM(mj_smem);
  C* As = reinterpret_cast<C*>(mj_smem);  // [KS][T], A transposed
  C* Bs = As + KS * T;                    // [KS][T]
  const int bt = blockIdx.z, m0 = blockIdx.y * T, n0 = blockIdx.x * T;
  const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
  const TA* A = a + bt * M * K;
  const TB* B = b + bt * K * N;
  C acc[4][4];
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) acc[i][j] = C(0);
  for (int k0 = 0; k0 < K; k0 += KS) {
    for (int e = threadIdx.x; e < KS * T; e += 256) {
      const int mm = e / KS, kk = e % KS;
      const int m = m0 + mm, k = k0 + kk;
      As[kk * T + mm] = (m < M && k < K) ? cvt<C>(A[m * K + k]) : C(0);
      const int kb = e / T, nn = e % T;
      const int kg = k0 + kb, n = n0 + nn;
      Bs[kb * T + nn] = (kg < K && n < N) ? cvt<C>(B[kg * N + n]) : C(0);
    }
    __syncthreads();
#pragma unroll 4
    for (int kk = 0; kk < KS; ++kk) {
      C av[4], bv[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) av[i] = As[kk * T + ty + 16 * i];
#pragma unroll
      for (int j = 0; j < 4; ++j) bv[j] = Bs[kk * T + tx + 16 * j];
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j] += av[i] * bv[j];
    }
    __syncthreads();
  }
  TC* Cb = c + bt * M * N;
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int m = m0 + ty + 16 * i, n = n0 + tx + 16 * j;
      if (m < M && n < N) Cb[m * N + n] = cvt<TC>(acc[i][j]);
    }
}

template <class C>
constexpr int matmul_smem_bytes() {
  return 2 * kMatmulK * kMatmulTile * static_cast<int>(sizeof(C));
}

}  // namespace mj
