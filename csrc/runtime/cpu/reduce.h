// reduce.h - reductions over one dim (sum / max / mean / rms, rank kept) and concat.
//
// A reduction views its input as [A, N, B] (dims before, the reduced dim, dims after). With
// B == 1 each row of N contiguous elements is folded in SIMD lanes (lane-wise partial results,
// combined at the end: deterministic, no fast-math); with B > 1 the B contiguous outputs are
// updated together for each n. Accumulation is in the element type (float for float32).
#pragma once

#include "cpu/elementwise.h"

namespace mj {

// Reducers: init value, step(acc, x), combine(acc, acc), finish(acc, n).
struct SumR {
  static constexpr bool has_finish = false;
  template <class S> static constexpr S init() { return S(0); }
  template <class T> static MJ_INLINE T step(T a, T x) { return a + x; }
  template <class T> static MJ_INLINE T combine(T a, T b) { return a + b; }
  template <class T> static MJ_INLINE T finish(T a, i64) { return a; }
};
struct MaxR {
  static constexpr bool has_finish = false;
  template <class S> static constexpr S init() { return -std::numeric_limits<S>::infinity(); }
  template <class T> static MJ_INLINE T step(T a, T x) { return fm::max_nan(x, a); }
  template <class T> static MJ_INLINE T combine(T a, T b) { return fm::max_nan(a, b); }
  template <class T> static MJ_INLINE T finish(T a, i64) { return a; }
};
struct MeanR : SumR {
  static constexpr bool has_finish = true;
  template <class T> static MJ_INLINE T finish(T a, i64 n) { return a / T(n); }
};
// Sum of squares; finish gives sqrt(mean(x * x)).
struct RmsR : SumR {
  static constexpr bool has_finish = true;
  template <class T> static MJ_INLINE T step(T a, T x) { return a + x * x; }
  template <class T> static MJ_INLINE T finish(T a, i64 n) { return fm::sqrt(a / T(n)); }
};

// Fold N contiguous elements.
template <class R, i64 N, class T>
MJ_INLINE T fold_row(const T* x) {
  if constexpr (simd_type<T> && N >= 2 * lanes<T>) {
    using V = vec_t<T>;
    constexpr i64 W = lanes<T>;
    V a0 = splat<V>(R::template init<T>()), a1 = a0;
    i64 j = 0;
    for (; j + 2 * W <= N; j += 2 * W) {
      a0 = R::step(a0, vload<V>(x + j));
      a1 = R::step(a1, vload<V>(x + j + W));
    }
    if (j + W <= N) {
      a0 = R::step(a0, vload<V>(x + j));
      j += W;
    }
    a0 = R::combine(a0, a1);
    T acc = a0[0];
    for (int l = 1; l < W; ++l) acc = R::combine(acc, a0[l]);
    for (; j < N; ++j) acc = R::step(acc, x[j]);
    return acc;
  } else {
    T acc = R::template init<T>();
    for (i64 j = 0; j < N; ++j) acc = R::step(acc, x[j]);
    return acc;
  }
}

// Rows [a0, a1) of out[A, B] (+)= reduce_n in[A, N, B]; ACC folds into out's current values
// (accumulators), otherwise out starts from R's init. No finish here.
template <class R, i64 N, i64 B, bool ACC, class T>
MJ_INLINE void fold_rows(T* out, const T* in, i64 a0, i64 a1) {
  for (i64 a = a0; a < a1; ++a) {
    if constexpr (B == 1) {
      const T v = fold_row<R, N>(in + a * N);
      out[a] = ACC ? R::combine(out[a], v) : v;
    } else {
      T* o = out + a * B;
      const T* x = in + a * N * B;
      if constexpr (!ACC) {
        for (i64 b = 0; b < B; ++b) o[b] = R::template init<T>();
      }
      for (i64 n = 0; n < N; ++n) {
        const T* xn = x + n * B;
        i64 b = 0;
        if constexpr (simd_type<T>) {
          using V = vec_t<T>;
          for (; b + lanes<T> <= B; b += lanes<T>) vstore<V>(o + b, R::step(vload<V>(o + b), vload<V>(xn + b)));
        }
        for (; b < B; ++b) o[b] = R::step(o[b], xn[b]);
      }
    }
  }
}

template <class R, i64 N, class T>
MJ_INLINE void finish_all(T* out, i64 lo, i64 hi) {
  if constexpr (R::has_finish) {
    for (i64 i = lo; i < hi; ++i) out[i] = R::finish(out[i], N);
  }
}

template <class Sh, int Dim>
struct ReduceDims {
  static_assert(Dim >= 0 && Dim < Sh::rank, "reduction dim out of range");
  static constexpr i64 A = Sh::prod(0, Dim), N = Sh::dims[Dim], B = Sh::prod(Dim + 1, Sh::rank);
};

// Block level: out = reduce over dim Dim of in (out has size 1 there).
template <class R, int Dim, class Out, class In>
MJ_INLINE void reduce(Out& out, const In& in) {
  using D = ReduceDims<shape_of<In>, Dim>;
  static_assert(shape_of<Out>::size == D::A * D::B, "reduction output shape");
  fold_rows<R, D::N, D::B, false>(out.ptr(), in.ptr(), 0, D::A);
  finish_all<R, D::N>(out.ptr(), 0, D::A * D::B);
}

// Accumulator update: out (+)= reduce over dim Dim of in, without finish.
template <class R, int Dim, class Out, class In>
MJ_INLINE void reduce_into(Out& out, const In& in) {
  using D = ReduceDims<shape_of<In>, Dim>;
  fold_rows<R, D::N, D::B, true>(out.ptr(), in.ptr(), 0, D::A);
}

// out = concat(a, b) along Dim.
template <int Dim, class Out, class A, class B>
MJ_INLINE void concat(Out& out, const A& a, const B& b) {
  using SA = shape_of<A>;
  using SB = shape_of<B>;
  constexpr i64 outer = SA::prod(0, Dim);
  constexpr i64 ra = SA::prod(Dim, SA::rank), rb = SB::prod(Dim, SB::rank);
  static_assert(shape_of<Out>::size == outer * (ra + rb), "concat output shape");
  using Region = Shape<outer, ra + rb>;
  copy_region<Shape<outer, ra>, Region, Shape<outer, ra>>(out.ptr(), a.ptr());
  copy_region<Shape<outer, rb>, Region, Shape<outer, rb>>(out.ptr() + ra, b.ptr());
}

namespace k {

template <class R, int Dim, class Out, class In>
inline void reduce(const mj_pool* pool, Out& out, const In& in) {
  using D = ReduceDims<shape_of<In>, Dim>;
  static_assert(shape_of<Out>::size == D::A * D::B, "reduction output shape");
  auto* o = out.ptr();
  const auto* x = in.ptr();
  if constexpr (D::A > 1 || D::B == 1) {
    parallel_ranges(pool, D::A, shape_of<In>::size, [&](i64 lo, i64 hi) {
      fold_rows<R, D::N, D::B, false>(o, x, lo, hi);
      finish_all<R, D::N>(o, lo * D::B, hi * D::B);
    });
  } else {  // one row of B outputs: split the columns
    parallel_ranges(pool, D::B, shape_of<In>::size, [&](i64 lo, i64 hi) {
      for (i64 b = lo; b < hi; ++b) o[b] = R::template init<value_of<Out>>();
      for (i64 n = 0; n < D::N; ++n)
        for (i64 b = lo; b < hi; ++b) o[b] = R::step(o[b], x[n * D::B + b]);
      finish_all<R, D::N>(o, lo, hi);
    });
  }
}

template <int Dim, class Out, class A, class B>
inline void concat(const mj_pool* pool, Out& out, const A& a, const B& b) {
  using SA = shape_of<A>;
  using SB = shape_of<B>;
  constexpr i64 outer = SA::prod(0, Dim);
  constexpr i64 ra = SA::prod(Dim, SA::rank), rb = SB::prod(Dim, SB::rank);
  static_assert(shape_of<Out>::size == outer * (ra + rb), "concat output shape");
  auto* o = out.ptr();
  const auto* pa = a.ptr();
  const auto* pb = b.ptr();
  parallel_ranges(pool, outer, shape_of<Out>::size, [&](i64 lo, i64 hi) {
    for (i64 i = lo; i < hi; ++i) {
      copy_region<Shape<ra>, Shape<ra>, Shape<ra>>(o + i * (ra + rb), pa + i * ra);
      copy_region<Shape<rb>, Shape<rb>, Shape<rb>>(o + i * (ra + rb) + ra, pb + i * rb);
    }
  });
}

// out = transpose(in, perm): out dim d is in dim Pm::src[d].
template <class Pm, class Out, class In>
inline void transpose(const mj_pool* pool, Out& out, const In& in) {
  using SpH = TransposeSpace<shape_of<Out>, shape_of<In>, Pm>;
  const op::Identity id;
  const MapRow<SpH, op::Identity> row{id};
  auto* o = out.ptr();
  const auto* x = in.ptr();
  parallel_ranges(pool, SpH::value.outer_n(), shape_of<Out>::size,
                  [&](i64 lo, i64 hi) { nd_range<SpH>(row, lo, hi, o, x); });
}

}  // namespace k
}  // namespace mj
