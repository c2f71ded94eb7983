// matmul.h - register-blocked matrix multiply on tiles and on whole (batched) tensors.
//
// Structure, innermost first:
//   micro<MR, NV>   C[MR, NV*W] (+)= A[MR, K] B[K, NV*W]: MR x NV SIMD accumulators stay in
//                   registers for the whole K loop; one broadcast of A and NV loads of B per k.
//                   This is the piece an ISA-specific (e.g. AVX-512 assembly) kernel replaces.
//   gemm<M, N, K>   covers C with micro panels: full NV-wide panels, a narrower vector panel,
//                   then the last N % W columns with a scalar-column kernel; rows in MR steps
//                   (a strided B panel reused by 3+ row panels is packed densely first).
//   k::matmul       splits batch x M x N into tasks over the pool, K in cache-sized chunks.
// All sizes and leading dimensions are compile-time constants. Accumulation is in T, C's type;
// A and B may be stored in a half-precision type (TA, TB): they are widened in registers as
// they are read, so a bf16 weight streams from memory at half the bytes of a float one. Where
// the ISA has AVX512_BF16 and both operands are bf16, micro_dp multiplies pairs of them with
// one instruction (bf16 products are exact in float: only the summation order differs).
#pragma once

#if defined(__AVX512BF16__)
#include <immintrin.h>
#endif

#include "cpu/half.h"
#include "cpu/parallel.h"

namespace mj {

template <class T>
struct GemmCfg {
#if MJ_VEC_BYTES == 64
  static constexpr int MR = 6, NV = 4, ACC_REGS = 24;  // 24 of 32 zmm registers hold C
#elif MJ_VEC_BYTES == 32
  static constexpr int MR = 6, NV = 2, ACC_REGS = 12;  // 12 of 16 ymm registers
#else
  static constexpr int MR = 4, NV = 2, ACC_REGS = 8;  // 8 of 16 xmm registers
#endif
  static constexpr int W = lanes<T>;
  static constexpr i64 NB = 4 * NV * W, KB = 256;  // kernel-level task columns, K chunk
};

// Register blocking for a product with M rows and N columns (N = 0: unknown): skinny products
// (decode: M <= 8) take all rows in one panel, so B is read once, with as many vectors per row
// as the accumulators allow; M a multiple of 8 takes 8 x 3, others the default. A split like
// 6 + 2 would read B twice and run the 2-row pass load-bound. But where the default's vectors
// tile N exactly and 8 x 3's leave a narrow tail panel (N a power of two: 64 = 48 + 16) that
// is a larger share of N than the default's row tail is of M, the default wins. Measured on
// the Ice Lake Xeon, 6 x 4 against 8 x 3: a 256 x 64 x 128 tile product (attention's P @ V)
// 1.16x faster, 256 x 128 x 64 1.08x, while 16 x 2048 x 64 ran 1.11x slower (6 + 6 + 4 rows
// read B three times). A tie keeps 8 x 3: 64 x 256 x 256 gained 1.04x, within noise, and a
// 6 x 4 row tail of 2 rows runs load-bound.
template <class T, i64 M, i64 N = 0>
struct Blocking {
  using C = GemmCfg<T>;
  static constexpr bool default_fits() {
    constexpr i64 NR = C::NV * C::W, NR8 = C::ACC_REGS / 8 * C::W;  // 6 x 4's and 8 x 3's width
    return N > 0 && N % NR == 0 && N % NR8 != 0 && (N % NR8) * M > (M % C::MR) * N;
  }
  static constexpr int pick_mr() {
    if (M <= 8 && M * 2 <= C::ACC_REGS) return static_cast<int>(M);
    if (M % 8 == 0 && C::ACC_REGS >= 24 && !default_fits()) return 8;
    return C::MR;
  }
  static constexpr int MR = pick_mr();
  static constexpr int NV = MR == C::MR ? C::NV : (C::ACC_REGS / MR > 8 ? 8 : C::ACC_REGS / MR);
};

// g++ contracts this into one FMA instruction where the ISA has one.
template <class V>
MJ_INLINE V vfma(V a, V b, V c) {
  return a * b + c;
}

// Prefetch (into L2) the lines of NV vectors (of T's lanes) of one row of B, PF elements
// past `row`.
template <class T, int NV, i64 PF, class U>
MJ_INLINE void prefetch_row(const U* row) {
  if constexpr (PF != 0) {
#pragma GCC unroll 8
    for (int v = 0; v < NV * lanes<T>; v += 64 / static_cast<int>(sizeof(U)))
      __builtin_prefetch(row + v + PF, 0, 2);
  }
}

#if defined(__AVX512BF16__)
inline constexpr bool kDotBf16 = true;

// micro for float C and bf16 A and B with VDPBF16PS: each instruction adds the products of
// a pair of A's elements (k, k + 1, one 32-bit broadcast) with the same pair of B's rows,
// interleaved into the halves of each 32-bit lane. An odd K's last k pairs with zeros.
// Denormal bf16 operands count as zero (the instruction's DAZ): they are below 1.2e-38.
template <int MR, int NV, i64 K, i64 LDA, i64 LDB, i64 LDC, bool ACC, i64 PF>
MJ_INLINE void micro_dp(float* C, const bf16* A, const bf16* B) {
  constexpr int W = 16;
  __m512 c[MR][NV];
#pragma GCC unroll 16
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) c[r][v] = ACC ? _mm512_loadu_ps(C + r * LDC + v * W) : _mm512_setzero_ps();
  auto row = [&](i64 k, int v) {
    return _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(B + k * LDB + v * W)));
  };
  for (i64 k = 0; k + 1 < K; k += 2) {
    __m512i b[NV];
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) b[v] = _mm512_or_si512(row(k, v), _mm512_slli_epi32(row(k + 1, v), 16));
    prefetch_row<float, NV, PF>(B + k * LDB);
    prefetch_row<float, NV, PF>(B + (k + 1) * LDB);
#pragma GCC unroll 16
    for (int r = 0; r < MR; ++r) {
      std::uint32_t pair;
      std::memcpy(&pair, A + r * LDA + k, sizeof(pair));
      const __m512bh a = reinterpret_cast<__m512bh>(_mm512_set1_epi32(static_cast<int>(pair)));
#pragma GCC unroll 8
      for (int v = 0; v < NV; ++v) c[r][v] = _mm512_dpbf16_ps(c[r][v], a, reinterpret_cast<__m512bh>(b[v]));
    }
  }
  if constexpr (K % 2 != 0) {
    __m512i b[NV];
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) b[v] = row(K - 1, v);
#pragma GCC unroll 16
    for (int r = 0; r < MR; ++r) {
      const __m512bh a = reinterpret_cast<__m512bh>(_mm512_set1_epi32(A[r * LDA + K - 1].bits));
#pragma GCC unroll 8
      for (int v = 0; v < NV; ++v) c[r][v] = _mm512_dpbf16_ps(c[r][v], a, reinterpret_cast<__m512bh>(b[v]));
    }
  }
#pragma GCC unroll 16
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) _mm512_storeu_ps(C + r * LDC + v * W, c[r][v]);
}
#else
inline constexpr bool kDotBf16 = false;
#endif

template <class T, class TA, class TB>
inline constexpr bool use_dot_bf16 =
    kDotBf16 && std::is_same_v<T, float> && std::is_same_v<TA, bf16> && std::is_same_v<TB, bf16>;

// PF != 0: also prefetch B's lines PF elements ahead (the same place in the next loop
// iteration's tile), spread over the k loop so the misses overlap the FMAs.
template <class T, int MR, int NV, i64 K, i64 LDA, i64 LDB, i64 LDC, bool ACC, i64 PF = 0,
          class TA, class TB>
MJ_INLINE void micro(T* C, const TA* A, const TB* B) {
#if defined(__AVX512BF16__)
  if constexpr (use_dot_bf16<T, TA, TB>) {
    micro_dp<MR, NV, K, LDA, LDB, LDC, ACC, PF>(C, A, B);
    return;
  }
#endif
  using V = vec_t<T>;
  constexpr int W = lanes<T>;
  V c[MR][NV];
#pragma GCC unroll 16
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) c[r][v] = ACC ? vload<V>(C + r * LDC + v * W) : V{};
  for (i64 k = 0; k < K; ++k) {
    V b[NV];
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) b[v] = load_wide<V>(B + k * LDB + v * W);
    prefetch_row<T, NV, PF>(B + k * LDB);
#pragma GCC unroll 16
    for (int r = 0; r < MR; ++r) {
      const V a = splat<V>(static_cast<T>(A[r * LDA + k]));
#pragma GCC unroll 8
      for (int v = 0; v < NV; ++v) c[r][v] = vfma(a, b[v], c[r][v]);
    }
  }
#pragma GCC unroll 16
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) vstore<V>(C + r * LDC + v * W, c[r][v]);
}

// The last NS (< W) columns: scalar accumulators, which g++ may still vectorise.
template <class T, int MR, int NS, i64 K, i64 LDA, i64 LDB, i64 LDC, bool ACC, i64 PF = 0,
          class TA, class TB>
MJ_INLINE void micro_cols(T* C, const TA* A, const TB* B) {
  T c[MR][NS];
  for (int r = 0; r < MR; ++r)
    for (int s = 0; s < NS; ++s) c[r][s] = ACC ? C[r * LDC + s] : T(0);
  for (i64 k = 0; k < K; ++k)
    for (int r = 0; r < MR; ++r) {
      const T a = static_cast<T>(A[r * LDA + k]);
      for (int s = 0; s < NS; ++s) c[r][s] += a * static_cast<T>(B[k * LDB + s]);
    }
  for (int r = 0; r < MR; ++r)
    for (int s = 0; s < NS; ++s) C[r * LDC + s] = c[r][s];
}

// Row panels from which a B panel read in place with a long row stride is copied to a dense
// buffer first. Its K rows lie LDB apart: at a 16 KiB stride they share one L1 set (12 ways)
// and each sits on its own page, so every row panel after the first re-read them from L2
// through TLB misses. A copy (a load and a store per element) that the row panels then read
// densely from L1 paid off from 3 row panels: a 64 x 2048 x 4096 block product streaming
// its weight ran 1.35x faster on the Ice Lake (155 vs 110 GFLOP/s on 2 cores).
inline constexpr int kPackPanels = 3;

// All M rows of one column panel, MR rows at a time (NV vectors wide, or NS scalar columns);
// MR is the caller's Blocking<T, M, N>, which depends on the whole product's N.
// The first row panel prefetches (PF); the others find B in cache. With kPackPanels or more
// row panels, B is first copied to a dense buffer (prefetching as the first panel would).
template <class T, i64 M, int MR, int NV, int NS, i64 K, i64 LDA, i64 LDB, i64 LDC, bool ACC,
          i64 PF = 0, class TA, class TB>
MJ_INLINE void gemm_panel(T* C, const TA* A, const TB* B) {
  constexpr i64 MF = M / MR * MR;
  constexpr i64 PT = MF > 0 ? 0 : PF;  // the tail prefetches when it is the only panel
  constexpr i64 NR = NV * lanes<T>;
  if constexpr (NV > 0 && MF / MR >= kPackPanels && LDB != NR) {
    alignas(kAlign) TB packed[K * NR];
    for (i64 k = 0; k < K; ++k) {
      std::memcpy(packed + k * NR, B + k * LDB, sizeof(TB) * NR);
      prefetch_row<T, NV, PF>(B + k * LDB);
    }
    gemm_panel<T, M, MR, NV, NS, K, LDA, NR, LDC, ACC>(C, A, packed);
    return;
  }
  for (i64 i = 0; i < MF; i += MR) {
    if constexpr (NV > 0) {
      if (i == 0) micro<T, MR, NV, K, LDA, LDB, LDC, ACC, PF>(C, A, B);
      else micro<T, MR, NV, K, LDA, LDB, LDC, ACC>(C + i * LDC, A + i * LDA, B);
    } else {
      micro_cols<T, MR, NS, K, LDA, LDB, LDC, ACC>(C + i * LDC, A + i * LDA, B);
    }
  }
  if constexpr (M > MF) {
    constexpr int MT = static_cast<int>(M - MF);
    if constexpr (NV > 0) micro<T, MT, NV, K, LDA, LDB, LDC, ACC, PT>(C + MF * LDC, A + MF * LDA, B);
    else micro_cols<T, MT, NS, K, LDA, LDB, LDC, ACC>(C + MF * LDC, A + MF * LDA, B);
  }
}

// C[M, N] (+)= A[M, K] @ B[K, N] over all column panels, for one chunk of K.
template <class T, i64 M, i64 N, i64 K, i64 LDA, i64 LDB, i64 LDC, bool ACC, i64 PF = 0,
          class TA, class TB>
MJ_INLINE void gemm_chunk(T* C, const TA* A, const TB* B) {
  static_assert(simd_type<T>, "matmul supports float and double");
  using Bk = Blocking<T, M, N>;
  constexpr int W = GemmCfg<T>::W, NV = Bk::NV, MR = Bk::MR;
  constexpr i64 NR = NV * W, NF = N / NR * NR;
  for (i64 j = 0; j < NF; j += NR)
    gemm_panel<T, M, MR, NV, 0, K, LDA, LDB, LDC, ACC, PF>(C + j, A, B + j);
  constexpr int NVT = static_cast<int>((N - NF) / W);
  if constexpr (NVT > 0)
    gemm_panel<T, M, MR, NVT, 0, K, LDA, LDB, LDC, ACC, PF>(C + NF, A, B + NF);
  constexpr i64 J = NF + NVT * W;
  if constexpr (N > J)
    gemm_panel<T, M, MR, 0, static_cast<int>(N - J), K, LDA, LDB, LDC, ACC>(C + J, A, B + J);
}

// Rows of B per pass over all column panels: a pass touches KC rows of B (KC pages when B's
// rows are long), which stay in L1's TLB and in L2 for the next panel; C is reloaded once per
// pass, which costs 1/KC of the FMAs.
// - Skinny products (M <= 8, decode) are bound by reading B: streamed B (read in place from
//   memory) takes passes of as few rows as the C reloads allow (4 rows up to M = 2, then 4
//   per row of C), since every row in flight is one more stream for the hardware
//   prefetchers to track. On the 2-core Zen 4, against 32-row passes: M = 1 and 2 with 4 rows
//   1.17-1.35x faster (a 4096 x 6144 weight), M = 4 with 16 rows 1.16x, M = 8 no faster with
//   fewer than 32 (0.92x at 16: the C reloads cost more than the streams gain).
// - Taller products are bound by the FMAs, and C, too big for L1 past 8 rows, comes back from
//   L2 every pass: 128-row passes (24 KiB of B per 48-column panel still fit L1) for tiles
//   in cache; streamed, 2 rows of B per row of C up to 128 (on the Zen 4, against 128:
//   M = 16 with 32 rows 1.2x faster, M = 32 with 64 1.07x, M = 64 best at 128).
template <i64 M, bool STREAM>
inline constexpr i64 kGemmKC =
    !STREAM ? (M <= 8 ? 64 : 128)
            : (M <= 2 ? 4 : (M <= 8 ? 4 * M : (2 * M < 128 ? 2 * M : 128)));

// Software prefetch of a B streamed from memory (the next pass, the next loop iteration's
// tile): on the Zen 4 and Zen 5 hosts it kept the misses overlapping the FMAs, while on an
// Ice Lake Xeon the same prefetches made streamed decode products 1.2-1.3x slower than the
// hardware prefetchers alone (rmsnorm_linear M = 16: 7.2 vs 5.5 ms; gated_mlp M = 8: 6.7 vs
// 5.6). The calibration probe (calibrate.h) times both on the host, and kernels are built
// with -DMJ_STREAM_PREFETCH=0 where the hardware streams better alone.
// The same Xeon gains from them where each row of the strip is short (a 1 KiB strip of a
// 4096 x 6144 weight at M = 8: 1.5x faster with them, 4 KiB 1.2x, 12 KiB 0.8x): there the
// kernels are built with -DMJ_STREAM_PREFETCH_MAX_RUN=<bytes>, and only strips whose rows run
// shorter than that prefetch in software (0, the default: every streamed strip does).
#ifndef MJ_STREAM_PREFETCH
#define MJ_STREAM_PREFETCH 1
#endif
#ifndef MJ_STREAM_PREFETCH_MAX_RUN
#define MJ_STREAM_PREFETCH_MAX_RUN 0
#endif
inline constexpr bool kStreamPrefetch = MJ_STREAM_PREFETCH != 0;

// Whether a B of N-element rows LDB apart gets software prefetch: a strip of whole rows is one
// long run.
template <class TB, i64 N, i64 LDB>
inline constexpr bool kPrefetchRun =
    MJ_STREAM_PREFETCH_MAX_RUN == 0 ||
    (N < LDB && N * static_cast<i64>(sizeof(TB)) < MJ_STREAM_PREFETCH_MAX_RUN);

// C[M, N] (+)= A[M, K] @ B[K, N] with leading dims LDA, LDB, LDC.
// PF: see micro. STREAM (B is read from memory, not from a tile in cache): every pass but the
// last also prefetches the rows of the pass after it, so a tile with no next loop iteration
// (or a long one) still streams with its misses overlapping the FMAs. SWPF = false drops
// both kinds of software prefetch (see kStreamPrefetch), as do strips of rows longer than
// MJ_STREAM_PREFETCH_MAX_RUN bytes where that is set. A product of exactly 2 KC rows (a
// for-loop iteration of 64 rows at M = 8) takes two passes, not one of 2 KC: on the Ice Lake
// Xeon one pass of 64 streamed rows ran 1.7-2x slower than two of 32 (decode, M = 8, 1536-
// and 768-column strips of a 4096 x 6144 weight), more row streams than its L2 prefetcher
// follows.
template <class T, i64 M, i64 N, i64 K, i64 LDA, i64 LDB, i64 LDC, bool ACC, i64 PF0 = 0,
          bool STREAM = false, bool SWPF = kStreamPrefetch, class TA, class TB>
MJ_INLINE void gemm(T* C, const TA* A, const TB* B) {
  constexpr i64 KC = kGemmKC<M, STREAM>;
  constexpr bool SW = SWPF && kPrefetchRun<TB, N, LDB>;
  constexpr i64 PF = SW ? PF0 : 0;
  constexpr i64 PN = STREAM && SW ? KC * LDB : 0;  // same columns, one pass down
  if constexpr (K < 2 * KC) {
    gemm_chunk<T, M, N, K, LDA, LDB, LDC, ACC, PF>(C, A, B);
  } else {
    constexpr i64 KF = K / KC * KC;
    constexpr i64 PL = K > KF ? PN : PF;  // the last full pass: the tail or the next tile
    gemm_chunk<T, M, N, KC, LDA, LDB, LDC, ACC, PN>(C, A, B);  // K >= 2 KC: KF >= 2 KC
    for (i64 k0 = KC; k0 < KF - KC; k0 += KC)
      gemm_chunk<T, M, N, KC, LDA, LDB, LDC, true, PN>(C, A + k0, B + k0 * LDB);
    gemm_chunk<T, M, N, KC, LDA, LDB, LDC, true, PL>(C, A + KF - KC, B + (KF - KC) * LDB);
    if constexpr (K > KF)
      gemm_chunk<T, M, N, K - KF, LDA, LDB, LDC, true, PF>(C, A + KF, B + KF * LDB);
  }
}

template <class SA, class SB>
struct MatmulDims {
  static constexpr int r = SA::rank;
  static_assert(r >= 2 && SB::rank == r, "matmul needs equal ranks >= 2");
  static constexpr i64 M = SA::dims[r - 2], K = SA::dims[r - 1], N = SB::dims[r - 1];
  static_assert(SB::dims[r - 2] == K, "matmul contracting dims differ");
  static constexpr i64 batch = SA::prod(0, r - 2);
};

// Element offset of batch index t (row-major over the batch dims) in an operand.
template <class X>
constexpr i64 batch_offset(i64 t) {
  using Sh = shape_of<X>;
  i64 off = 0;
  for (int d = Sh::rank - 3; d >= 0; --d) {
    off += (t % Sh::dims[d]) * stride_of<X>(d);
    t /= Sh::dims[d];
  }
  return off;
}

// Block level: out = a @ b over the batch dims; matmul_acc adds the product into out. The
// operands may be TileRefs (strided, read in place); out is a dense tile.
template <bool ACC, class Out, class A, class B>
MJ_INLINE void matmul_impl(Out& out, const A& a, const B& b) {
  using D = MatmulDims<shape_of<A>, shape_of<B>>;
  using T = value_of<Out>;
  constexpr int r = D::r;
  constexpr i64 LDA = stride_of<A>(r - 2), LDB = stride_of<B>(r - 2);
  static_assert(stride_of<A>(r - 1) == 1 && stride_of<B>(r - 1) == 1, "rows must be dense");
  for (i64 t = 0; t < D::batch; ++t)
    gemm<T, D::M, D::N, D::K, LDA, LDB, D::N, ACC, prefetch_ahead<B>, in_place<B>>(
        out.ptr() + t * D::M * D::N, a.ptr() + batch_offset<A>(t), b.ptr() + batch_offset<B>(t));
}
template <class Out, class A, class B>
MJ_INLINE void matmul(Out& out, const A& a, const B& b) { matmul_impl<false>(out, a, b); }
template <class Out, class A, class B>
MJ_INLINE void matmul_acc(Out& out, const A& a, const B& b) { matmul_impl<true>(out, a, b); }

namespace k {

// C[MM, NN] = A[MM, K] @ B[K, NN] with K in chunks of KB (the B chunk stays in L2).
// STREAM: no other task reads this B chunk (one block of rows: a decode product), so it is
// streamed from memory like a block-level tile read in place, prefetching the next chunk.
template <class T, i64 MM, i64 NN, i64 K, i64 LDA, i64 LDB, i64 LDC, bool STREAM, class TA,
          class TB>
inline void gemm_block(T* C, const TA* A, const TB* B) {
  constexpr i64 KB = GemmCfg<T>::KB;
  constexpr i64 PF = STREAM ? KB * LDB : 0;
  if constexpr (K <= KB) {
    gemm<T, MM, NN, K, LDA, LDB, LDC, false, 0, STREAM>(C, A, B);
  } else {
    constexpr i64 KF = K / KB * KB;
    gemm<T, MM, NN, KB, LDA, LDB, LDC, false, PF, STREAM>(C, A, B);
    for (i64 k0 = KB; k0 < KF; k0 += KB)
      gemm<T, MM, NN, KB, LDA, LDB, LDC, true, PF, STREAM>(C, A + k0, B + k0 * LDB);
    if constexpr (K > KF)
      gemm<T, MM, NN, K - KF, LDA, LDB, LDC, true, 0, STREAM>(C, A + KF, B + KF * LDB);
  }
}

// Rows of C per task of a kernel-level product with M rows and `others` tasks per M block
// (batch x N blocks): the fewest blocks of at most kBlockRows rows, of equal height (a
// multiple of 8), halved while the product has fewer than kMinTasks tasks and blocks stay
// 32 rows or more. Every M block reads all of B, so fewer and taller blocks read it less
// often, and equal heights keep the register blocking efficient in every block: on the Ice
// Lake Xeon a 128 x 256 x 4096 product (lora bs=8) ran 1.06-1.13x faster in one 128-row
// block than in the 96 + 32 of a fixed 96-row block (2 threads, 25 paired rounds, 4 runs).
inline constexpr i64 kBlockRows = 128, kMinTasks = 8;
constexpr i64 kernel_block_rows(i64 M, i64 others) {
  i64 blocks = (M + kBlockRows - 1) / kBlockRows;
  auto rows = [&] { return ((M + blocks - 1) / blocks + 7) / 8 * 8; };
  while (blocks * others < kMinTasks && rows() / 2 >= 32) blocks *= 2;
  const i64 r = rows();
  return r < M ? r : M;
}

// One task's ROWS x COLS block of a kernel-level product, at C (rows N apart). A half-precision
// C is computed in a float tile of the task's thread (in cache) and rounded into place: no
// float copy of the whole product is allocated, written and read again.
template <class T, i64 ROWS, i64 COLS, i64 K, i64 N, i64 NB, bool S, class O, class TA, class TB>
MJ_INLINE void product_block(O* C, const TA* A, const TB* B) {
  if constexpr (is_half<O>) {
    alignas(kAlign) static thread_local T tile[ROWS * NB];
    gemm_block<T, ROWS, COLS, K, K, N, NB, S>(tile, A, B);
    copy_region<Shape<ROWS, COLS>, Shape<ROWS, N>, Shape<ROWS, NB>>(C, tile);
  } else {
    gemm_block<T, ROWS, COLS, K, K, N, N, S>(C, A, B);
  }
}

// Kernel level: out = a @ b with batch dims, tasks over batch x M blocks x N blocks; a and b
// in their compute type or half precision (widened as they are read), out in either too.
template <class Out, class A, class B>
inline void matmul(const mj_pool* pool, Out& out, const A& a, const B& b) {
  using D = MatmulDims<shape_of<A>, shape_of<B>>;
  using O = value_of<Out>;
  using T = compute_t<O>;
  using Cfg = GemmCfg<T>;
  constexpr i64 M = D::M, N = D::N, K = D::K;
  constexpr i64 NB = N < Cfg::NB ? N : Cfg::NB, TN = (N + NB - 1) / NB;
  constexpr i64 MB = kernel_block_rows(M, D::batch * TN), TM = (M + MB - 1) / MB;
  constexpr i64 MT = M - (TM - 1) * MB, NT = N - (TN - 1) * NB;  // last block sizes
  O* o = out.ptr();
  const auto* pa = a.ptr();
  const auto* pb = b.ptr();
  auto task = [&](i64 t) {
    const i64 bi = t / (TM * TN), im = (t / TN) % TM, jn = t % TN;
    O* C = o + bi * M * N + im * MB * N + jn * NB;
    const auto* Ap = pa + bi * M * K + im * MB * K;
    const auto* Bp = pb + bi * K * N + jn * NB;
    const bool mlast = im == TM - 1, nlast = jn == TN - 1;
    constexpr bool S = TM == 1;
    if (mlast && nlast) product_block<T, MT, NT, K, N, NB, S>(C, Ap, Bp);
    else if (mlast) product_block<T, MT, NB, K, N, NB, S>(C, Ap, Bp);
    else if (nlast) product_block<T, MB, NT, K, N, NB, S>(C, Ap, Bp);
    else product_block<T, MB, NB, K, N, NB, S>(C, Ap, Bp);
  };
  constexpr i64 tasks = D::batch * TM * TN;
  if (2 * M * N * K < kParallelMinWork * 8) {
    for (i64 t = 0; t < tasks; ++t) task(t);
  } else {
    parallel_for(pool, tasks, task);
  }
}

}  // namespace k
}  // namespace mj
