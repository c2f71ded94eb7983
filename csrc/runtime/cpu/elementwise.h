// elementwise.h - one fused SIMD loop for unary/binary ops and thread graphs, with broadcasting.
//
// map(f, out, in...) evaluates out = f(in...) elementwise; every `in` broadcasts to `out`
// (numpy rules over equal ranks). f is an op functor (math.h) or a generated lambda holding a
// whole thread graph, so a fused chain is a single pass over the tile. The innermost row runs
// in SIMD registers when all operands share the output's element type and are contiguous or
// broadcast there; the tail and any other case run the same f on scalars, reading bf16 / f16
// elements as float and rounding a bf16 / f16 result (core.h).
#pragma once

#include "cpu/math.h"
#include "cpu/parallel.h"

namespace mj {

template <class SpH, class F>
struct MapRow {
  const F& f;

  template <class O, class... X>
  MJ_INLINE void operator()(i64 j0, i64 j1, O* o, const X*... x) const {
    run(std::index_sequence_for<X...>{}, j0, j1, o, x...);
  }

  template <std::size_t... K, class O, class... X>
  MJ_INLINE void run(std::index_sequence<K...>, i64 j0, i64 j1, O* o, const X*... x) const {
    constexpr auto& sp = SpH::value;
    constexpr i64 so = sp.inner_s(0);
    constexpr bool simd = simd_type<O> && !is_scalar_only<F>::value && so == 1 &&
                          ((std::is_same_v<O, X> && sp.inner_s(K + 1) <= 1) && ...);
    i64 j = j0;
    if constexpr (simd) {
      using V = vec_t<O>;
      constexpr i64 W = lanes<O>;
      for (; j + W <= j1; j += W) vstore<V>(o + j, f(load<V, sp.inner_s(K + 1)>(x, j)...));
    }
#pragma GCC ivdep
    for (; j < j1; ++j) o[j * so] = static_cast<O>(f(widen(x[j * sp.inner_s(K + 1)])...));
  }

  template <class V, i64 S, class X>
  static MJ_INLINE V load(const X* x, i64 j) {
    if constexpr (S == 0) return splat<V>(x[0]);
    else return vload<V>(x + j);
  }
};

// Block level: out = f(in...) over a whole tile, on the calling thread.
template <class F, class Out, class... In>
MJ_INLINE void map(const F& f, Out& out, const In&... in) {
  using SpH = BroadcastSpace<shape_of<Out>, shape_of<In>...>;
  nd_for<SpH, 0>(MapRow<SpH, F>{f}, out.ptr(), in.ptr()...);
}

// Dense copy of a region between two row-major arrays (tile loads/stores, concat, copies).
template <class Region, class DstSh, class SrcSh, class T, class U>
MJ_INLINE void copy_region(T* dst, const U* src) {
  using SpH = CopySpace<Region, DstSh, SrcSh>;
  const op::Identity id;
  nd_for<SpH, 0>(MapRow<SpH, op::Identity>{id}, dst, src);
}

namespace k {

// Kernel level: out = f(in...) over whole tensors, split over the pool along the outer dim.
template <class F, class Out, class... In>
inline void map(const mj_pool* pool, const F& f, Out& out, const In&... in) {
  using SpH = BroadcastSpace<shape_of<Out>, shape_of<In>...>;
  const MapRow<SpH, F> row{f};
  auto* o = out.ptr();
  parallel_ranges(pool, SpH::value.outer_n(), shape_of<Out>::size,
                  [&](i64 lo, i64 hi) { nd_range<SpH>(row, lo, hi, o, in.ptr()...); });
}

// out = in element by element in row-major order (shapes may differ, sizes may not).
template <class Out, class In>
inline void copy(const mj_pool* pool, Out& out, const In& in) {
  using Flat = Shape<shape_of<Out>::size>;
  static_assert(shape_of<In>::size == Flat::size, "copy needs equal element counts");
  View<value_of<Out>, Flat> o(out.ptr());
  View<const value_of<In>, Flat> i(in.ptr());
  map(pool, op::Identity{}, o, i);
}

}  // namespace k
}  // namespace mj
