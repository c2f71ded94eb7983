// Host emulation of CUDA thread blocks, for testing generated kernels without a GPU.
//
// Included by platform.cuh only under -DMJ_EMU with a host compiler. Every thread of a block is
// an OS thread; __syncthreads is a real barrier over the block, and warp-level operations
// (shuffles, mma.sync) exchange values through per-warp slots behind a barrier over the warp.
// Blocks run one after another; shared memory is refilled with 0xFF bytes (NaN for every float
// type) before each block so a kernel that reads shared memory it never wrote gives NaNs.
// This checks indexing, synchronisation and fragment layouts; it says nothing about speed.
#pragma once

#include <driver_types.h>  // cudaStream_t (a plain C typedef; no CUDA runtime needed)
#include <vector_types.h>  // dim3

#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace mj::emu {

class Barrier {
 public:
  explicit Barrier(int n) : n_(n) {}
  void wait() {
    std::unique_lock<std::mutex> lock(mutex_);
    const long gen = gen_;
    if (++count_ == n_) {
      count_ = 0;
      ++gen_;
      cv_.notify_all();
    } else {
      cv_.wait(lock, [&] { return gen != gen_; });
    }
  }

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  int n_;
  int count_ = 0;
  long gen_ = 0;
};

struct Block {
  Block(int threads, size_t smem_bytes)
      : bar(threads), smem(smem_bytes + 16), slots(static_cast<size_t>(threads) * 8) {
    for (int w = 0; w < threads / 32; ++w) warp_bars.emplace_back(new Barrier(32));
  }
  void poison() { std::memset(smem.data(), 0xFF, smem.size()); }

  Barrier bar;
  std::vector<std::unique_ptr<Barrier>> warp_bars;
  std::vector<unsigned char> smem;
  std::vector<uint64_t> slots;  // 64 bytes per thread for warp exchanges
};

struct Ctx {
  dim3 tid, bid, bdim, gdim;
  Block* block = nullptr;
};

inline thread_local Ctx ctx;

inline unsigned char* dynamic_smem() { return ctx.block->smem.data(); }
inline void syncthreads() { ctx.block->bar.wait(); }
inline int lane() { return static_cast<int>(ctx.tid.x % 32); }
inline int warp() { return static_cast<int>(ctx.tid.x / 32); }
inline void warp_sync() { ctx.block->warp_bars[warp()]->wait(); }
inline uint64_t* slot(int lane_in_warp) {
  return &ctx.block->slots[(static_cast<size_t>(warp()) * 32 + lane_in_warp) * 8];
}

template <class T>
T shfl_xor(T v, int mask) {
  static_assert(sizeof(T) <= 64, "slot too small");
  std::memcpy(slot(lane()), &v, sizeof(T));
  warp_sync();
  T r;
  std::memcpy(&r, slot(lane() ^ mask), sizeof(T));
  warp_sync();
  return r;
}

// Publish `n` 32-bit words of this lane and wait for the warp; read another lane's with peek.
inline void publish(const uint32_t* words, int n) {
  std::memcpy(slot(lane()), words, sizeof(uint32_t) * n);
  warp_sync();
}
inline uint32_t peek(int lane_in_warp, int word) {
  uint32_t w;
  std::memcpy(&w, reinterpret_cast<const unsigned char*>(slot(lane_in_warp)) + 4 * word, 4);
  return w;
}

template <class... P, class... A>
void launch(void (*kernel)(P...), dim3 grid, dim3 block, size_t smem_bytes, A... args) {
  static_assert(sizeof...(P) == sizeof...(A), "kernel argument count");
  const int nt = static_cast<int>(block.x * block.y * block.z);
  if (nt % 32 != 0 || block.y != 1 || block.z != 1) {
    std::fprintf(stderr, "mj::emu: blocks must be 1-D with a multiple of 32 threads\n");
    std::abort();
  }
  Block blk(nt, smem_bytes);
  blk.poison();
  std::vector<std::thread> threads;
  threads.reserve(nt);
  for (int t = 0; t < nt; ++t) {
    threads.emplace_back([&, t] {
      for (unsigned z = 0; z < grid.z; ++z)
        for (unsigned y = 0; y < grid.y; ++y)
          for (unsigned x = 0; x < grid.x; ++x) {
            ctx.tid = dim3(t, 0, 0);
            ctx.bid = dim3(x, y, z);
            ctx.bdim = block;
            ctx.gdim = grid;
            ctx.block = &blk;
            kernel(static_cast<P>(args)...);
            blk.bar.wait();
            if (t == 0) blk.poison();
            blk.bar.wait();
          }
    });
  }
  for (auto& th : threads) th.join();
}

}  // namespace mj::emu

#define threadIdx (::mj::emu::ctx.tid)
#define blockIdx (::mj::emu::ctx.bid)
#define blockDim (::mj::emu::ctx.bdim)
#define gridDim (::mj::emu::ctx.gdim)
#define __syncthreads() ::mj::emu::syncthreads()
