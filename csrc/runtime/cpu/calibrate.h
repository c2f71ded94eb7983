// calibrate.h - measures this host's ceilings for the search's CPU cost model.
//
// The cost model orders candidates by rates of *this* runtime on *this* host: the micro-kernel
// at the register blocks matmul.h picks, an elementwise map on tiles in L2, and streaming reads
// from memory on one core and on all. Hosts differ by more than 2x in all of these (a Zen 5
// core does two 512-bit FMAs per cycle, a Zen 4 core one), so constants tuned on one machine
// misorder candidates on another. It also decides one build setting of the kernels: whether
// streamed matmul operands are prefetched in software (stream_prefetch_gain). And it measures
// how much of a streamed product's memory time and compute time overlap (stream_overlap, the
// cost model's `overlap`).
//
// This is a probe, not a kernel: it may start threads (the bandwidth of all cores needs them).
// mirage_jax.search.calibrate compiles it once per host and caches what it prints.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <new>
#include <thread>
#include <vector>

#include "cpu/mirage.h"

namespace mj::probe {

// Fields of the result, in order (calibrate.py reads them by these positions).
enum Field : int {
  kMatmul1, kMatmul2, kMatmul4, kMatmul8,  // flop/s of one core, tile product with M rows
  kVector,        // elementwise multiply element/s of one core, tiles in L2
  kCoreStream,    // bytes/s one core reads contiguously from memory
  kAllStream,     // bytes/s all cores read contiguously
  kCores,
  kStridedRow,      // seconds of a matmul's first read of one row of a narrow strip of B
  kStridedRevisit,  // seconds of every further row panel's read of that row
  kStreamPrefetchGain,  // a streamed decode product's seconds without software prefetch / with
  kStripSlowdown,  // its seconds reading 1 KiB of each row of its weight / reading 12 KiB
  kShortPrefetchGain,  // reading 1 KiB of each row: seconds without software prefetch / with
  kStreamOverlap,  // share of the shorter of a streamed product's read and compute it hides
  kFields
};

inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

template <class F>
double median_seconds(int reps, const F& f) {
  std::vector<double> ts;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    ts.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return median(ts);
}

template <class T>
T* alloc(std::size_t n, T fill) {
  void* p = std::aligned_alloc(kAlign, (n * sizeof(T) + kAlign - 1) / kAlign * kAlign);
  if (!p) throw std::bad_alloc();
  T* t = static_cast<T*>(p);
  std::fill(t, t + n, fill);  // touches every page, so timing sees no page faults
  return t;
}

// C[M, 512] += A[M, 256] @ B[256, 512] with B (512 KiB) in L2: the in-cache rate.
template <i64 M>
double matmul_rate() {
  constexpr i64 K = 256, N = 512, CALLS = 64 / M + 4;
  float* a = alloc<float>(M * K, 0.5f);
  float* b = alloc<float>(K * N, 0.25f);
  float* c = alloc<float>(M * N, 0.0f);
  auto run = [&] {
    for (i64 r = 0; r < CALLS; ++r) gemm<float, M, N, K, K, N, N, true>(c, a, b);
  };
  run();
  const double s = median_seconds(9, run);
  std::free(a), std::free(b), std::free(c);
  return 2.0 * M * N * K * CALLS / s;
}

// Seconds per call of C[M, 16] += A[M, 4096] @ B[4096, 16], B a column strip of a matrix
// with rows of LDB floats (LDB = 16: contiguous).
template <i64 M, i64 LDB>
double strip_seconds() {
  constexpr i64 K = 4096, N = 16, CALLS = 16;
  float* a = alloc<float>(M * K, 0.5f);
  float* b = alloc<float>(K * LDB, 0.25f);
  float* c = alloc<float>(M * N, 0.0f);
  auto run = [&] {
    for (i64 r = 0; r < CALLS; ++r) gemm<float, M, N, K, K, LDB, N, true>(c, a, b);
  };
  run();
  const double s = median_seconds(9, run);
  std::free(a), std::free(b), std::free(c);
  return s / CALLS;
}

// A one-vector strip of a weight with 16 KiB rows puts every row of B on its own page and
// in the same few cache sets: the prefetchers do not follow it and it does not stay in L2
// between row panels, so each row costs a miss, not FMAs (8 rows of C measured 4x slower
// than with the strip contiguous on the Zen 4). Per row: the first panel's visit, and each
// further panel's (32 rows of C are 4 panels of 8).
inline void strided_rows(double* first, double* revisit) {
  constexpr double K = 4096;
  const double one = strip_seconds<8, 4096>() - strip_seconds<8, 16>();
  const double four = strip_seconds<32, 4096>() - strip_seconds<32, 16>();
  *first = std::max(one / K, 1e-12);
  *revisit = std::max((four - one) / (3 * K), 1e-12);
}

double vector_rate() {
  using S = Shape<16, 1024>;  // 64 KiB tiles: past L1, in L2
  Tile<float, S> x, y;
  for (i64 i = 0; i < S::size; ++i) x.ptr()[i] = 1.0f + i % 7, y.ptr()[i] = 1.0f;
  constexpr int CALLS = 32;
  auto run = [&] {  // in place, so no call's stores are dead
    for (int r = 0; r < CALLS; ++r) map(op::Mul{}, x, x, y);
  };
  run();
  const double s = median_seconds(9, run);
  volatile float sink = x.ptr()[S::size - 1];
  (void)sink;
  return double(S::size) * CALLS / s;
}

// Sum of rows [r0, r1) of a row-major matrix with `ld` floats per row.
inline float read_rows(const float* m, i64 ld, i64 r0, i64 r1) {
  using V = vec_t<float>;
  constexpr int W = lanes<float>;
  V s0{}, s1{}, s2{}, s3{};
  for (i64 r = r0; r < r1; ++r) {
    const float* p = m + r * ld;
    for (i64 c = 0; c < ld; c += 4 * W) {
      s0 += vload<V>(p + c), s1 += vload<V>(p + c + W);
      s2 += vload<V>(p + c + 2 * W), s3 += vload<V>(p + c + 3 * W);
    }
  }
  const V s = s0 + s1 + s2 + s3;
  float t = 0;
  for (int i = 0; i < W; ++i) t += s[i];
  return t;
}

// Seconds of body(t) run for t in [0, threads): t = 0 on this thread, the others on threads
// started for the call (the probe may start threads; kernels never do).
template <class F>
double seconds_on_threads(int threads, const F& body) {
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<std::thread> pool;
  for (int t = 1; t < threads; ++t) pool.emplace_back(body, t);
  body(0);
  for (auto& th : pool) th.join();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Seconds of `threads` threads reading a 4096 x 6144 float matrix (96 MiB, past any L3),
// each a contiguous share of the rows.
inline double stream_once(const float* m, int threads) {
  constexpr i64 R = 4096, C = 6144;
  std::vector<float> sink(threads);
  return seconds_on_threads(threads, [&](int t) {
    sink[t] = read_rows(m, C, R * t / threads, R * (t + 1) / threads);
  });
}

// Bytes/s of one core and of all. Rounds interleave the two: a shared host's memory bus
// drifts over seconds.
inline void stream_rates(int cores, double* core, double* all) {
  constexpr double bytes = 4096.0 * 6144 * sizeof(float);
  float* m = alloc<float>(std::size_t{4096} * 6144, 1.0f);
  std::vector<double> t1, tn;
  for (int r = 0; r < 11; ++r) {
    t1.push_back(stream_once(m, 1));
    tn.push_back(stream_once(m, cores));
  }
  std::free(m);
  *core = bytes / median(t1);
  *all = bytes / median(tn);
}

// Seconds of `threads` threads computing C[M, 6144] = A[M, 4096] @ B for the 4096 x 6144 B
// (96 MiB) read in place, each thread a block of NB columns at a time: a decode product whose
// weight streams from memory, split by columns as a grid splits it. SWPF: with the software
// prefetch of matmul.h, or with the hardware prefetchers alone.
template <bool SWPF, i64 NB, i64 M = 8>
double streamed_gemm_once(const float* a, const float* b, float* c, int threads) {
  constexpr i64 K = 4096, N = 6144, blocks = N / NB;
  return seconds_on_threads(threads, [&](int t) {
    for (i64 j = t; j < blocks; j += threads)
      gemm<float, M, NB, K, K, N, N, false, 0, true, SWPF>(c + j * NB, a, b + j * NB);
  });
}

// Three figures of such a product, rounds alternating as the memory bus of a shared host
// drifts: gain, how much slower it runs without the software prefetch (>1: the prefetch helps
// here), and short_gain, the same in 1 KiB strips;
// strip, how much slower it runs in 256-column strips (1 KiB of each row, what a kernel-level
// matmul reads) than in 3072-column ones (12 KiB), each with its faster prefetch setting: the
// hardware prefetchers of some hosts (an Ice Lake Xeon: 1.7-1.9x) stream short runs of many
// rows far worse than long ones.
inline void streamed_products(int cores, double* gain, double* strip, double* short_gain) {
  float* a = alloc<float>(8 * 4096, 0.5f);
  float* b = alloc<float>(std::size_t{4096} * 6144, 0.25f);
  float* c = alloc<float>(8 * 6144, 0.0f);
  constexpr i64 NB = 3072;  // two blocks, the grid the 2-core hosts' searches pick
  std::vector<double> with, without, with_n, without_n;
  streamed_gemm_once<true, NB>(a, b, c, cores);
  for (int r = 0; r < 7; ++r) {
    with.push_back(streamed_gemm_once<true, NB>(a, b, c, cores));
    without.push_back(streamed_gemm_once<false, NB>(a, b, c, cores));
    with_n.push_back(streamed_gemm_once<true, NB / 12>(a, b, c, cores));
    without_n.push_back(streamed_gemm_once<false, NB / 12>(a, b, c, cores));
  }
  std::free(a), std::free(b), std::free(c);
  *gain = median(without) / median(with);
  *strip = std::min(median(with_n), median(without_n)) / std::min(median(with), median(without));
  *short_gain = median(without_n) / median(with_n);
}

// How much of a streamed product's memory time its compute hides: C[16, 6144] = A[16, 4096]
// @ B on all cores, B (96 MiB) streamed in two blocks of 3072 columns with the kernels'
// prefetch setting (SWPF) -- the rmsnorm_linear bs=8 product, whose compute time is about its
// memory time. Against a plain read of B and the same FMAs on 64-row chunks of B in L2:
// (read + compute - product) / min(read, compute); 1 when the product takes only the longer
// of the two, 0 when it takes their sum (the Ice Lake Xeon: -0.6 to 0.5 over runs). Rounds
// interleave the three, as a shared host's memory bus and clock drift over seconds.
template <bool SWPF>
double stream_overlap(int cores) {
  constexpr i64 M = 16, K = 4096, N = 6144, NB = 3072, KL = 64, blocks = N / NB;
  float* a = alloc<float>(M * K, 0.5f);
  float* b = alloc<float>(std::size_t{K} * N, 0.25f);
  float* c = alloc<float>(M * N, 0.0f);
  auto in_cache = [&] {
    return seconds_on_threads(cores, [&](int t) {
      for (i64 j = t; j < blocks; j += cores)
        for (i64 k = 0; k < K; k += KL)  // the same 64 rows of B every time: 768 KiB in L2
          gemm<float, M, NB, KL, K, N, N, true, 0, true, SWPF>(c + j * NB, a + k, b + j * NB);
    });
  };
  std::vector<double> read, compute, product;
  streamed_gemm_once<SWPF, NB, M>(a, b, c, cores);
  for (int r = 0; r < 5; ++r) {
    read.push_back(stream_once(b, cores));
    compute.push_back(in_cache());
    product.push_back(streamed_gemm_once<SWPF, NB, M>(a, b, c, cores));
  }
  std::free(a), std::free(b), std::free(c);
  const double rd = median(read), cp = median(compute);
  return (rd + cp - median(product)) / std::min(rd, cp);
}

// prefetch_off_below: the gain below which kernels are built without software prefetch
// (calibrate.py's _PREFETCH_OFF_BELOW, passed in so that the rule has one home).
inline void run(double* out, double prefetch_off_below) {
  const int cores = std::max(1u, std::thread::hardware_concurrency());
  out[kMatmul1] = matmul_rate<1>();
  out[kMatmul2] = matmul_rate<2>();
  out[kMatmul4] = matmul_rate<4>();
  out[kMatmul8] = matmul_rate<8>();
  out[kVector] = vector_rate();
  stream_rates(cores, &out[kCoreStream], &out[kAllStream]);
  out[kCores] = cores;
  strided_rows(&out[kStridedRow], &out[kStridedRevisit]);
  streamed_products(cores, &out[kStreamPrefetchGain], &out[kStripSlowdown],
                    &out[kShortPrefetchGain]);
  // with the prefetch setting kernels get for 12 KiB runs (calibrate.py's kernel_flags)
  out[kStreamOverlap] = out[kStreamPrefetchGain] >= prefetch_off_below
                            ? stream_overlap<true>(cores)
                            : stream_overlap<false>(cores);
}

}  // namespace mj::probe
