// parallel.h - work splitting over the caller's pool, kernel workspace, error guard.
//
// Generated kernels never create threads: they hand tasks to mj_pool::parallel_for (XLA's
// intra-op pool behind the FFI dispatcher). Work is cut into a few chunks per thread so the
// per-task cost stays negligible, and runs inline when there is one thread or little work.
#pragma once

#include <atomic>
#include <cstdlib>
#include <new>
#include <vector>

#include "cpu/core.h"

namespace mj {

// Elements below which a kernel-level op runs on the calling thread.
inline constexpr i64 kParallelMinWork = 1 << 15;

MJ_INLINE int pool_threads(const mj_pool* pool) {
  return (pool && pool->parallel_for && pool->num_threads > 1) ? pool->num_threads : 1;
}

// f(i) for i in [0, n), spread over the pool.
template <class F>
inline void parallel_for(const mj_pool* pool, i64 n, const F& f) {
  if (n <= 0) return;
  if (n == 1 || pool_threads(pool) == 1) {
    for (i64 i = 0; i < n; ++i) f(i);
    return;
  }
  auto tramp = [](void* arg, std::int64_t i) { (*static_cast<const F*>(arg))(i); };
  pool->parallel_for(pool->ctx, n, tramp, const_cast<void*>(static_cast<const void*>(&f)));
}

// f(lo, hi) over a partition of [0, n) into at most 4 chunks per thread; `work` is the total
// number of elements touched, to keep small ops on the calling thread.
template <class F>
inline void parallel_ranges(const mj_pool* pool, i64 n, i64 work, const F& f) {
  const int threads = pool_threads(pool);
  i64 chunks = (threads == 1 || work < kParallelMinWork) ? 1 : 4 * threads;
  if (chunks > n) chunks = n;
  if (chunks <= 1) {
    f(i64{0}, n);
    return;
  }
  parallel_for(pool, chunks, [&](i64 c) { f(n * c / chunks, n * (c + 1) / chunks); });
}

// body(BlockIdx) for every block of a GX x GY x GZ grid (x fastest), in contiguous chunks.
template <i64 GX, i64 GY, i64 GZ, class F>
inline void for_each_block(const mj_pool* pool, const F& body) {
  constexpr i64 n = GX * GY * GZ;
  const int threads = pool_threads(pool);
  const i64 chunks = n < 4 * threads ? n : 4 * threads;
  auto run = [&](i64 c) {
    for (i64 b = n * c / chunks; b < n * (c + 1) / chunks; ++b)
      body(BlockIdx{b % GX, (b / GX) % GY, b / (GX * GY)});
  };
  parallel_for(pool, chunks, run);
}

// States of a block up to this size live on the stack of the task that runs it.
inline constexpr std::size_t kStackStateBytes = 256 * 1024;

// A grid whose for-loop only folds accumulators (sum, mean, max, rms), with the loop split
// over its iterations when the grid has fewer blocks than the pool has threads: a decode
// matmul with one block reads whole rows of its weight in each part, which streams at ~1.5x
// the bandwidth of the column strips an N-split grid reads (measured on a 2-core Zen 4).
// loop(b, s, i0, i1) runs the loop-invariant part and iterations [i0, i1) into state s;
// merge(s, o) folds o's accumulators into s; post(b, s) runs the epilogue and the savers.
// With one part this is exactly for_each_block over loop(b, s, 0, R) then post(b, s).
template <i64 GX, i64 GY, i64 GZ, i64 R, class S, class Loop, class Merge, class Post>
inline void for_each_block_split(const mj_pool* pool, const Loop& loop, const Merge& merge,
                                 const Post& post) {
  constexpr i64 n = GX * GY * GZ;
  const i64 threads = pool_threads(pool);
  const i64 parts = n >= threads ? 1 : (R < threads / n ? R : threads / n);
  if (parts <= 1) {
    for_each_block<GX, GY, GZ>(pool, [&](const BlockIdx& b) {
      if constexpr (sizeof(S) <= kStackStateBytes) {
        S s;
        loop(b, s, 0, R);
        post(b, s);
      } else {
        static thread_local S s;
        loop(b, s, 0, R);
        post(b, s);
      }
    });
    return;
  }
  // Per calling thread, grown on first use: no allocation on later calls.
  static thread_local std::vector<S> states;
  if (static_cast<i64>(states.size()) < n * parts) states.resize(n * parts);
  S* st = states.data();
  auto index = [](i64 b) { return BlockIdx{b % GX, (b / GX) % GY, b / (GX * GY)}; };
  parallel_for(pool, n * parts, [&](i64 t) {
    const i64 p = t % parts;
    loop(index(t / parts), st[t], R * p / parts, R * (p + 1) / parts);
  });
  parallel_for(pool, n, [&](i64 b) {
    for (i64 p = 1; p < parts; ++p) merge(st[b * parts], st[b * parts + p]);
    post(index(b), st[b * parts]);
  });
}

// Storage for a kernel's intermediate tensors: one static buffer per kernel, reused by every
// call. A concurrent or reentrant call finds it busy and takes a private heap buffer instead.
template <std::size_t Bytes>
class Workspace {
 public:
  class Lease {
   public:
    Lease(unsigned char* base, std::atomic<bool>* busy) : base_(base), busy_(busy) {}
    Lease(const Lease&) = delete;
    Lease& operator=(const Lease&) = delete;
    ~Lease() {
      if (busy_) busy_->store(false, std::memory_order_release);
      else std::free(base_);
    }
    template <class T>
    T* at(std::size_t offset) const { return reinterpret_cast<T*>(base_ + offset); }

   private:
    unsigned char* base_;
    std::atomic<bool>* busy_;
  };

  Lease lease() {
    if (!busy_.exchange(true, std::memory_order_acquire)) return Lease(buf_, &busy_);
    constexpr std::size_t rounded = (Bytes + kAlign - 1) / kAlign * kAlign;
    void* p = std::aligned_alloc(kAlign, rounded);
    if (!p) throw std::bad_alloc();
    return Lease(static_cast<unsigned char*>(p), nullptr);
  }

 private:
  alignas(kAlign) unsigned char buf_[Bytes];
  std::atomic<bool> busy_{false};
};

// Run a kernel body; any C++ exception becomes a nonzero status for the FFI dispatcher.
template <class F>
inline int guard(const F& body) noexcept {
  try {
    body();
    return 0;
  } catch (...) {
    return 1;
  }
}

}  // namespace mj
