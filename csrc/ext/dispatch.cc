// The generic XLA FFI CPU dispatcher: registry, thread-pool bridge and the handler itself.
#include "dispatch.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <utility>

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace mirage_jax {
namespace {

// ---------------------------------------------------------------------------------------------
// Registry.  std::less<> allows lookup by string_view, so the hot path never builds a string.

std::shared_mutex& RegistryMutex() {
  static std::shared_mutex mu;
  return mu;
}

std::map<std::string, mj_kernel_fn, std::less<>>& Registry() {
  // Leaked on purpose: XLA may still call the handler while the interpreter shuts down.
  static auto* registry = new std::map<std::string, mj_kernel_fn, std::less<>>();
  return *registry;
}

// ---------------------------------------------------------------------------------------------
// parallel_for over XLA's intra-op pool.
//
// [0, n) is cut into contiguous chunks that threads claim with an atomic counter (dynamic
// balance, locality within a chunk).  The caller claims chunks too and then waits only for
// chunks that are already claimed, i.e. being run by a live thread; helper tasks that start
// late find nothing left.  So the call cannot deadlock even when the pool is busy or the caller
// is itself a pool worker, and nested calls are safe.  Late helpers may outlive the call, which
// is why the shared state is reference-counted (one small allocation per parallel_for).

struct PoolCtx {
  ffi::ThreadPool* pool;
  int num_threads;
};

constexpr std::chrono::microseconds kSpinBeforeSleep{50};

inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

struct ForState {
  void (*fn)(void*, int64_t);
  void* arg;
  int64_t n;
  int64_t chunks;
  std::atomic<int64_t> next{0};
  std::atomic<int64_t> done{0};
  std::mutex mu;
  std::condition_variable cv;

  // Claims and runs chunks until none is left.
  void Work() {
    for (;;) {
      const int64_t c = next.fetch_add(1, std::memory_order_relaxed);
      if (c >= chunks) return;
      const int64_t lo = c * n / chunks;
      const int64_t hi = (c + 1) * n / chunks;
      for (int64_t i = lo; i < hi; ++i) fn(arg, i);
      if (done.fetch_add(1, std::memory_order_acq_rel) + 1 == chunks) {
        // Taking the lock orders this notify after the waiter's predicate check.
        std::lock_guard<std::mutex> lock(mu);
        cv.notify_all();
      }
    }
  }

  // Waits for the chunks other threads claimed: they are running and end within about a
  // chunk's time of the caller's last one. Sleeping here costs a wake-up, which on virtual
  // machines takes 10-30 us (measured on a 2-vCPU VM: the caller returned 28 us after the
  // helper's last chunk ended); spinning about that long before sleeping loses at most
  // twice what the better choice would have.
  void WaitAllDone() {
    const auto until = std::chrono::steady_clock::now() + kSpinBeforeSleep;
    do {
      for (int k = 0; k < 64; ++k) {
        if (done.load(std::memory_order_acquire) == chunks) return;
        CpuRelax();
      }
    } while (std::chrono::steady_clock::now() < until);
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [this] { return done.load(std::memory_order_acquire) == chunks; });
  }
};

// Chunks per thread: enough for dynamic balance, few enough that claiming stays cheap.
constexpr int64_t kChunksPerThread = 4;

void ParallelFor(void* ctx, int64_t n, void (*fn)(void* arg, int64_t i), void* arg) {
  if (n <= 0) return;
  auto* pool_ctx = static_cast<PoolCtx*>(ctx);
  const int64_t threads = pool_ctx->num_threads;
  if (n == 1 || threads <= 1 || pool_ctx->pool == nullptr) {
    for (int64_t i = 0; i < n; ++i) fn(arg, i);
    return;
  }
  auto state = std::make_shared<ForState>();
  state->fn = fn;
  state->arg = arg;
  state->n = n;
  state->chunks = std::min<int64_t>(n, threads * kChunksPerThread);
  const int64_t helpers = std::min<int64_t>(threads, state->chunks) - 1;
  for (int64_t h = 0; h < helpers; ++h) {
    pool_ctx->pool->Schedule([state] { state->Work(); });
  }
  state->Work();
  state->WaitAllDone();
}

// ---------------------------------------------------------------------------------------------
// The handler.

// Pointer arrays live on the stack up to this many buffers; more falls back to the heap.
constexpr size_t kInlineBuffers = 32;

template <typename T>
class PtrArray {
 public:
  explicit PtrArray(size_t n) : n_(n) {
    if (n > kInlineBuffers) heap_.resize(n);
  }
  T* data() { return n_ > kInlineBuffers ? heap_.data() : inline_.data(); }

 private:
  size_t n_;
  std::array<T, kInlineBuffers> inline_{};
  std::vector<T> heap_;
};

std::string KernelError(std::string_view kernel, std::string_view what) {
  std::string msg = "mirage_jax: kernel '";
  msg.append(kernel).append("' ").append(what);
  return msg;
}

ffi::Error Dispatch(ffi::ThreadPool pool, ffi::RemainingArgs args, ffi::RemainingRets rets,
                    std::string_view kernel) {
  mj_kernel_fn fn = FindKernel(kernel);
  if (fn == nullptr) {
    return ffi::Error::InvalidArgument(KernelError(
        kernel,
        "is not registered in this process. Load its library first with "
        "mirage_jax.runtime.load_kernel(); a program from a persistent compilation cache "
        "needs its kernels loaded again in every new process."));
  }

  PtrArray<const void*> inputs(args.size());
  for (size_t i = 0; i < args.size(); ++i) {
    auto buf = args.get<ffi::AnyBuffer>(i);
    if (buf.has_error()) {
      return ffi::Error::Internal(KernelError(kernel, "got a non-buffer input"));
    }
    inputs.data()[i] = buf->untyped_data();
  }
  PtrArray<void*> outputs(rets.size());
  for (size_t i = 0; i < rets.size(); ++i) {
    auto buf = rets.get<ffi::AnyBuffer>(i);
    if (buf.has_error()) {
      return ffi::Error::Internal(KernelError(kernel, "got a non-buffer output"));
    }
    outputs.data()[i] = (*buf)->untyped_data();
  }

  // XLA reports 0 when it has no intra-op pool; the caller still counts as one worker.
  PoolCtx pool_ctx{&pool, static_cast<int>(std::max<int64_t>(1, pool.num_threads()))};
  const mj_pool mj{&pool_ctx, pool_ctx.num_threads, &ParallelFor};

  int rc = 0;
  try {
    rc = fn(inputs.data(), outputs.data(), &mj);
  } catch (const std::exception& e) {
    return ffi::Error::Internal(KernelError(kernel, std::string("threw: ") + e.what()));
  } catch (...) {
    return ffi::Error::Internal(KernelError(kernel, "threw an unknown exception"));
  }
  if (rc != 0) {
    return ffi::Error::Internal(KernelError(kernel, "failed with code " + std::to_string(rc)));
  }
  return ffi::Error::Success();
}

}  // namespace

void RegisterKernel(std::string name, mj_kernel_fn fn) {
  std::unique_lock<std::shared_mutex> lock(RegistryMutex());
  Registry()[std::move(name)] = fn;
}

mj_kernel_fn FindKernel(std::string_view name) {
  std::shared_lock<std::shared_mutex> lock(RegistryMutex());
  auto& registry = Registry();
  auto it = registry.find(name);
  return it == registry.end() ? nullptr : it->second;
}

std::vector<std::string> RegisteredKernels() {
  std::shared_lock<std::shared_mutex> lock(RegistryMutex());
  std::vector<std::string> names;
  names.reserve(Registry().size());
  for (const auto& kv : Registry()) names.push_back(kv.first);
  return names;
}

const char* CpuIsa() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  // libgcc's checks include OS support (XCR0), so a kernel that passes can use the registers.
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq")) {
    return __builtin_cpu_supports("avx512bf16") ? "avx512bf16" : "avx512";
  }
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return "avx2";
#endif
  return "generic";
}

}  // namespace mirage_jax

XLA_FFI_DEFINE_HANDLER_SYMBOL(MirageJaxDispatch, mirage_jax::Dispatch,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .RemainingArgs()
                                  .RemainingRets()
                                  .Attr<std::string_view>("kernel"));
