// Block matmul on shared-memory tiles: C[b] = A[b] @ B[b] for row-major A [.., M, K] and
// B [.., K, N], with the result accumulated in registers.
//
// Accumulator<NT, LA, LB, TA, TB> is the register-resident accumulator. The generated kernel
// declares one before its for-loop when a matmul feeds an acc_sum directly, calls mma() each
// iteration and store() once after the loop, so the partial products never touch shared
// memory. block_matmul() is the one-shot form.
//
// Two implementations behind one interface:
//  * MmaAcc: f16 x f16 or bf16 x bf16 on tensor cores, mma.sync.m16n8k16 with f32
//    accumulation (sm_80+). Each warp owns a fixed list of 16x8 output tiles; M, N, K that are
//    not multiples of 16/8/16 are zero-padded when fragments are loaded.
//  * FmaAcc: every other dtype (f32, f64, mixed) with plain FMA in the compute type; each
//    thread owns output elements tid, tid + NT, ...
#pragma once

#include "cuda/layout.cuh"

namespace mj {

template <class LA, class LB>
struct MatmulShape {
  static_assert(LA::rank >= 2 && LA::rank == LB::rank, "matmul operands have equal rank >= 2");
  static constexpr int M = LA::dim(LA::rank - 2);
  static constexpr int K = LA::last();
  static constexpr int N = LB::last();
  static constexpr int BATCH = LA::size / (M * K);
  static_assert(LB::dim(LB::rank - 2) == K, "contracting dims differ");
  static_assert(LB::size == BATCH * K * N, "batch dims differ");
};

template <class TA, class TB>
inline constexpr bool mma_types = (std::is_same_v<TA, half> && std::is_same_v<TB, half>) ||
                                  (std::is_same_v<TA, bf16> && std::is_same_v<TB, bf16>);

// One m16n8k16 tensor-core step: c += a @ b with the PTX fragment layouts
// (groupID g = lane / 4, t = lane % 4):
//   a[0]: (g, 2t..2t+1)  a[1]: (g+8, 2t..2t+1)  a[2]: (g, 2t+8..2t+9)  a[3]: (g+8, 2t+8..2t+9)
//   b[0]: rows 2t..2t+1 of col g               b[1]: rows 2t+8..2t+9 of col g
//   c[0..1]: (g, 2t..2t+1)                      c[2..3]: (g+8, 2t..2t+1)
template <class T>
MJ_DEV void mma_16816(float (&c)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
#if defined(MJ_EMU)
  const uint32_t mine[6] = {a[0], a[1], a[2], a[3], b[0], b[1]};
  emu::publish(mine, 6);
  auto half_of = [](uint32_t w, int hi) {
    T v;
    const uint16_t h = static_cast<uint16_t>(hi ? w >> 16 : w & 0xFFFFu);
    std::memcpy(&v, &h, 2);
    return to_f(v);
  };
  float A[16][16], B[16][8];
  for (int l = 0; l < 32; ++l) {
    const int g = l >> 2, t = l & 3;
    for (int i = 0; i < 4; ++i) {
      const int row = g + 8 * (i & 1), col = 2 * t + 8 * (i >> 1);
      A[row][col] = half_of(emu::peek(l, i), 0);
      A[row][col + 1] = half_of(emu::peek(l, i), 1);
    }
    for (int i = 0; i < 2; ++i) {
      const int k = 2 * t + 8 * i;
      B[k][g] = half_of(emu::peek(l, 4 + i), 0);
      B[k + 1][g] = half_of(emu::peek(l, 4 + i), 1);
    }
  }
  const int g = emu::lane() >> 2, t = emu::lane() & 3;
  for (int r = 0; r < 4; ++r) {
    const int row = g + 8 * (r >> 1), col = 2 * t + (r & 1);
    float s = 0.f;
    for (int k = 0; k < 16; ++k) s += A[row][k] * B[k][col];
    c[r] += s;
  }
  emu::warp_sync();
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  if constexpr (std::is_same_v<T, half>) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
        "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
        "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  }
#else
  (void)c, (void)a, (void)b;  // never selected below sm_80 (see Accumulator)
#endif
}

template <int NT, class LA, class LB, class T>
struct MmaAcc {
  using S = MatmulShape<LA, LB>;
  static constexpr int M = S::M, N = S::N, K = S::K;
  static constexpr int MT = (M + 15) / 16, NTILES = (N + 7) / 8, KT = (K + 15) / 16;
  static constexpr int TILES = S::BATCH * MT * NTILES;
  static constexpr int WARPS = NT / 32;
  static constexpr int PER = (TILES + WARPS - 1) / WARPS;
  static constexpr bool EXACT_MK = M % 16 == 0 && K % 16 == 0;
  static constexpr bool EXACT_KN = K % 16 == 0 && N % 8 == 0;
  static_assert(NT % 32 == 0, "whole warps");

  float c[PER][4];

  MJ_DEV void zero() {
#pragma unroll
    for (int j = 0; j < PER; ++j)
#pragma unroll
      for (int r = 0; r < 4; ++r) c[j][r] = 0.f;
  }

  MJ_DEV static T ld_a(const T* A, int m, int k) {
    if constexpr (EXACT_MK) return A[m * K + k];
    return (m < M && k < K) ? A[m * K + k] : from_f<T>(0.f);
  }
  MJ_DEV static T ld_b(const T* B, int k, int n) {
    if constexpr (EXACT_KN) return B[k * N + n];
    return (k < K && n < N) ? B[k * N + n] : from_f<T>(0.f);
  }
  // Two consecutive A elements of one row in one 32-bit load when no padding is involved.
  MJ_DEV static uint32_t ld_a2(const T* A, int m, int k) {
    if constexpr (EXACT_MK) {
      uint32_t w;
      std::memcpy(&w, A + m * K + k, 4);
      return w;
    }
    return pack2(ld_a(A, m, k), ld_a(A, m, k + 1));
  }

  // c += A @ B for the smem tiles a (LA) and b (LB).
  MJ_DEV void mma(const T* __restrict__ a, const T* __restrict__ b) {
    const int warp = thread_id() / 32, lane = thread_id() % 32, g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int j = 0; j < PER; ++j) {
      const int tile = warp + j * WARPS;  // uniform across the warp
      if (tile < TILES) {
        const int bt = tile / (MT * NTILES), r = tile % (MT * NTILES);
        const int m0 = (r / NTILES) * 16 + g, n = (r % NTILES) * 8 + g;
        const T* A = a + bt * M * K;
        const T* B = b + bt * K * N;
        for (int kt = 0; kt < KT; ++kt) {
          const int k0 = kt * 16 + 2 * t;
          const uint32_t ra[4] = {ld_a2(A, m0, k0), ld_a2(A, m0 + 8, k0), ld_a2(A, m0, k0 + 8),
                                  ld_a2(A, m0 + 8, k0 + 8)};
          const uint32_t rb[2] = {pack2(ld_b(B, k0, n), ld_b(B, k0 + 1, n)),
                                  pack2(ld_b(B, k0 + 8, n), ld_b(B, k0 + 9, n))};
          mma_16816<T>(c[j], ra, rb);
        }
      }
    }
  }

  // out = the accumulated C (row-major [.., M, N]), converted to TC.
  template <class TC>
  MJ_DEV void store(TC* __restrict__ out) const {
    const int warp = thread_id() / 32, lane = thread_id() % 32, g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int j = 0; j < PER; ++j) {
      const int tile = warp + j * WARPS;
      if (tile < TILES) {
        const int bt = tile / (MT * NTILES), r = tile % (MT * NTILES);
        const int m0 = (r / NTILES) * 16 + g, n0 = (r % NTILES) * 8 + 2 * t;
        TC* C = out + bt * M * N;
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          const int m = m0 + 8 * (q >> 1), n = n0 + (q & 1);
          if (m < M && n < N) C[m * N + n] = cvt<TC>(c[j][q]);
        }
      }
    }
  }
};

template <int NT, class LA, class LB, class C>
struct FmaAcc {
  using S = MatmulShape<LA, LB>;
  static constexpr int M = S::M, N = S::N, K = S::K;
  static constexpr int TOTAL = S::BATCH * M * N;
  static constexpr int PER = (TOTAL + NT - 1) / NT;

  C c[PER];

  MJ_DEV void zero() {
#pragma unroll
    for (int j = 0; j < PER; ++j) c[j] = C(0);
  }

  template <class TA, class TB>
  MJ_DEV void mma(const TA* __restrict__ a, const TB* __restrict__ b) {
#pragma unroll
    for (int j = 0; j < PER; ++j) {
      const int idx = thread_id() + j * NT;
      if (idx < TOTAL) {
        const int bt = idx / (M * N), r = idx % (M * N), m = r / N, n = r % N;
        const TA* A = a + bt * M * K + m * K;
        const TB* B = b + bt * K * N + n;
        C s = C(0);
        for (int k = 0; k < K; ++k) s += cvt<C>(A[k]) * cvt<C>(B[k * N]);
        c[j] += s;
      }
    }
  }

  template <class TC>
  MJ_DEV void store(TC* __restrict__ out) const {
#pragma unroll
    for (int j = 0; j < PER; ++j) {
      const int idx = thread_id() + j * NT;
      if (idx < TOTAL) out[idx] = cvt<TC>(c[j]);
    }
  }
};

template <int NT, class LA, class LB, class TA, class TB>
using Accumulator = std::conditional_t<(MJ_HAS_MMA != 0) && mma_types<TA, TB>,
                                       MmaAcc<NT, LA, LB, TA>,
                                       FmaAcc<NT, LA, LB, compute_t<TA, TB>>>;

// c = a @ b in one call (the result is formed in registers, then written to c).
template <int NT, class LA, class LB, class TC, class TA, class TB>
MJ_DEV void block_matmul(TC* __restrict__ c, const TA* __restrict__ a, const TB* __restrict__ b) {
  Accumulator<NT, LA, LB, TA, TB> acc;
  acc.zero();
  acc.mma(a, b);
  acc.store(c);
}

}  // namespace mj
