// Block-level operators on shared-memory tiles: loads and stores between global memory and
// shared memory (cp.async on sm_80+), elementwise ops with broadcasting, reductions, concat,
// and the for-loop accumulators including online softmax.
//
// Conventions: every function is called by all NT threads of the block with the same
// arguments and does not synchronise at its end; the generated kernel places __syncthreads()
// between dependent operators. Tiles are dense row-major arrays of their Shape.
#pragma once

#include "cuda/layout.cuh"
#include "cuda/ops.cuh"

namespace mj {

// ---------------------------------------------------------------------------- global <-> smem

// Copy the box `Tile` of the row-major tensor `Global` whose first element is `src`.
template <int NT, class Tile, class Global, class S, class G>
MJ_DEV void load_tile(S* __restrict__ dst, const G* __restrict__ src) {
  if constexpr (std::is_same_v<S, G> && vec16_ok<Tile, Global, S>) {
    constexpr int V = 16 / static_cast<int>(sizeof(S));
    for (int c = thread_id(); c < Tile::size / V; c += NT) {
      const int i = c * V;
      *reinterpret_cast<int4*>(dst + i) =
          *reinterpret_cast<const int4*>(src + box_offset<Tile, Global>(i));
    }
  } else {
    for (int i = thread_id(); i < Tile::size; i += NT) {
      dst[i] = cvt<S>(src[box_offset<Tile, Global>(i)]);
    }
  }
}

MJ_DEV void cp_async16(void* smem, const void* gmem) {
#if MJ_HAS_CP_ASYNC && !defined(MJ_EMU)
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(gmem));
#else
  *reinterpret_cast<int4*>(smem) = *reinterpret_cast<const int4*>(gmem);
#endif
}

MJ_DEV void cp_async_commit() {
#if MJ_HAS_CP_ASYNC && !defined(MJ_EMU)
  asm volatile("cp.async.commit_group;\n" ::);
#endif
}

// Wait until at most N committed groups are still in flight (this thread's copies only: a
// __syncthreads() must follow before other threads read the tile).
template <int N>
MJ_DEV void cp_async_wait() {
#if MJ_HAS_CP_ASYNC && !defined(MJ_EMU)
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
#endif
}

// As load_tile, but asynchronous (cp.async) where the tile is 16-byte vectorisable; other
// tiles are copied synchronously, which is also complete by the next barrier.
template <int NT, class Tile, class Global, class S, class G>
MJ_DEV void load_tile_async(S* __restrict__ dst, const G* __restrict__ src) {
  if constexpr (std::is_same_v<S, G> && vec16_ok<Tile, Global, S>) {
    constexpr int V = 16 / static_cast<int>(sizeof(S));
    for (int c = thread_id(); c < Tile::size / V; c += NT) {
      const int i = c * V;
      cp_async16(dst + i, src + box_offset<Tile, Global>(i));
    }
  } else {
    load_tile<NT, Tile, Global>(dst, src);
  }
}

// Write the tile into the box of `Global` whose first element is `dst`.
template <int NT, class Tile, class Global, class G, class S>
MJ_DEV void store_tile(G* __restrict__ dst, const S* __restrict__ src) {
  if constexpr (std::is_same_v<S, G> && vec16_ok<Tile, Global, S>) {
    constexpr int V = 16 / static_cast<int>(sizeof(S));
    for (int c = thread_id(); c < Tile::size / V; c += NT) {
      const int i = c * V;
      *reinterpret_cast<int4*>(dst + box_offset<Tile, Global>(i)) =
          *reinterpret_cast<const int4*>(src + i);
    }
  } else {
    for (int i = thread_id(); i < Tile::size; i += NT) {
      dst[box_offset<Tile, Global>(i)] = cvt<G>(src[i]);
    }
  }
}

// ---------------------------------------------------------------------------- elementwise

template <class Op, int NT, class L, class TO, class TI>
MJ_DEV void unary(TO* __restrict__ out, const TI* __restrict__ in, double s) {
  using C = compute_t<TO, TI>;
  for (int i = thread_id(); i < L::size; i += NT) {
    out[i] = cvt<TO>(Op::template f<C>(cvt<C>(in[i]), C(s)));
  }
}

template <class Op, int NT, class LO, class LA, class LB, class TO, class TA, class TB>
MJ_DEV void binary(TO* __restrict__ out, const TA* __restrict__ a, const TB* __restrict__ b,
                   double s) {
  using C = compute_t<TO, TA, TB>;
  for (int i = thread_id(); i < LO::size; i += NT) {
    const C x = cvt<C>(a[bcast_offset<LO, LA>(i)]);
    const C y = cvt<C>(b[bcast_offset<LO, LB>(i)]);
    out[i] = cvt<TO>(Op::template f<C>(x, y, C(s)));
  }
}

template <int NT, class L, class T>
MJ_DEV void fill(T* __restrict__ x, float v) {
  for (int i = thread_id(); i < L::size; i += NT) x[i] = cvt<T>(v);
}

// ---------------------------------------------------------------------------- reductions

// Lanes cooperating on one output: a power of two, at most a warp, so that few outputs over a
// long dim (an rmsnorm row) still use the whole block.
MJ_HD constexpr int reduce_group(int nt, int outs, int n) {
  int g = 1;
  while (g < 32 && g * 2 <= n && outs * g * 2 <= nt) g *= 2;
  return g;
}

// For every element o of LO (LI with dim DIM reduced to 1), reduce R over that dim of `in`
// and call emit(o, value) on one lane. The loop trip count is uniform across the block so
// the shuffles see whole warps.
template <class R, int NT, class LO, class LI, int DIM, class C, class TI, class F>
MJ_DEV void reduce_dim(const TI* __restrict__ in, F&& emit) {
  constexpr int n = LI::dim(DIM);
  constexpr int st = LI::stride(DIM);
  constexpr int G = reduce_group(NT, LO::size, n);
  constexpr int PER_PASS = NT / G;
  const int tid = thread_id();
  const int g = tid % G;
  for (int o0 = 0; o0 < LO::size; o0 += PER_PASS) {
    const int o = o0 + tid / G;
    C acc = R::template init<C>();
    if (o < LO::size) {
      const int base = bcast_offset<LO, LI>(o);
      for (int j = g; j < n; j += G) acc = R::combine(acc, R::map(cvt<C>(in[base + j * st])));
    }
#pragma unroll
    for (int m = G / 2; m >= 1; m /= 2) acc = R::combine(acc, shfl_xor(acc, m));
    if (o < LO::size && g == 0) emit(o, acc);
  }
}

template <class R, int NT, class LO, class LI, int DIM, class TO, class TI>
MJ_DEV void reduce(TO* __restrict__ out, const TI* __restrict__ in) {
  using C = compute_t<TO, TI>;
  reduce_dim<R, NT, LO, LI, DIM, C>(
      in, [&](int o, C v) { out[o] = cvt<TO>(R::finish(v, LI::dim(DIM))); });
}

template <int NT, class LO, class LA, class LB, int DIM, class TO, class TA, class TB>
MJ_DEV void concat(TO* __restrict__ out, const TA* __restrict__ a, const TB* __restrict__ b) {
  constexpr int inner = LO::stride(DIM);
  constexpr int na = LA::dim(DIM), nb = LB::dim(DIM), no = LO::dim(DIM);
  for (int i = thread_id(); i < LO::size; i += NT) {
    const int outer = i / (inner * no), c = (i / inner) % no, in = i % inner;
    out[i] = c < na ? cvt<TO>(a[(outer * na + c) * inner + in])
                    : cvt<TO>(b[(outer * nb + (c - na)) * inner + in]);
  }
}

// ---------------------------------------------------------------------------- accumulators
// Accumulator buffers are float (double for f64 graphs) whatever the IR dtype: the sum over
// iterations keeps full precision and is rounded once when saved.

// acc = combine(acc, x) elementwise (DIM < 0), or combine(acc, reduce over DIM of x).
template <class R, int NT, class LAcc, class LX, int DIM, class A, class TX>
MJ_DEV void acc_update(A* __restrict__ acc, const TX* __restrict__ x) {
  if constexpr (DIM < 0) {
    for (int i = thread_id(); i < LAcc::size; i += NT) {
      acc[i] = R::combine(acc[i], R::map(cvt<A>(x[i])));
    }
  } else {
    reduce_dim<R, NT, LAcc, LX, DIM, A>(x, [&](int o, A v) { acc[o] = R::combine(acc[o], v); });
  }
}

// After the loop: mean divides by, rms takes sqrt of the mean over, n elements in all.
template <class R, int NT, class L, class A>
MJ_DEV void acc_finish(A* __restrict__ acc, int n) {
  for (int i = thread_id(); i < L::size; i += NT) acc[i] = R::finish(acc[i], n);
}

// Online softmax numerator: with M' = max(M, m), acc = acc * exp(M - M') + x * exp(m - M').
// `run` holds the running max M (layout LM, initialised to -inf), `next` is scratch for M'.
// Synchronises internally: every thread must see all of M' before any M is replaced.
template <int NT, class LX, class LM, class A, class TX, class TM>
MJ_DEV void acc_rescale_sum(A* __restrict__ acc, A* __restrict__ run, A* __restrict__ next,
                            const TX* __restrict__ x, const TM* __restrict__ m) {
  for (int i = thread_id(); i < LM::size; i += NT) next[i] = m_max(run[i], cvt<A>(m[i]));
  __syncthreads();
  for (int i = thread_id(); i < LX::size; i += NT) {
    const int j = bcast_offset<LX, LM>(i);
    const A mx = next[j], old = run[j], mj = cvt<A>(m[j]);
    const A scale = old == neg_inf<A>() ? A(0) : m_exp(old - mx);
    // a tile whose scores are all masked (max -inf) adds nothing: its x is NaN, while XLA's
    // softmax of the row is defined as soon as another tile has a finite score
    const A term = mj == neg_inf<A>() ? A(0) : cvt<A>(x[i]) * m_exp(mj - mx);
    acc[i] = acc[i] * scale + term;
  }
  __syncthreads();
  for (int i = thread_id(); i < LM::size; i += NT) run[i] = next[i];
}

}  // namespace mj
