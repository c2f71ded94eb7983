// reduce.h - reductions over one dim (sum / max / mean / rms, rank kept) and concat.
//
// A reduction views its input as [A, N, B] (dims before, the reduced dim, dims after). With
// B == 1 each row of N contiguous elements is folded in SIMD lanes (lane-wise partial results,
// combined at the end: deterministic, no fast-math); with B > 1 the B contiguous outputs are
// updated together for each n. Accumulation is in the element type (float for float32).
#pragma once

#include "cpu/elementwise.h"
#include "cpu/half.h"

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

// One operand of a fused row (fold_row_of): a row of N contiguous values, or one value that
// broadcasts along the row.
template <class T, bool Bcast>
struct RowOperand {
  const T* p;
  template <class V>
  MJ_INLINE V vec(i64 j) const {
    if constexpr (Bcast) return splat<V>(p[0]);
    else return load_wide<V>(p + j);
  }
  MJ_INLINE T at(i64 j) const { return Bcast ? p[0] : p[j]; }
};

// Fold f(x...) over a row of N elements without storing f's values. Four vector accumulators
// hide the latency of the reducer's step (a single chain runs at one vector per 3-4 cycles);
// they combine in a fixed order, so the result is deterministic.
template <class R, i64 N, class T, class F, class... X>
MJ_INLINE T fold_row_of(const F& f, const X&... x) {
  T acc = R::template init<T>();
  i64 j = 0;
  if constexpr (simd_type<T> && !is_scalar_only<F>::value && N >= lanes<T>) {
    using V = vec_t<T>;
    constexpr i64 W = lanes<T>;
    V a0 = splat<V>(acc), a1 = a0, a2 = a0, a3 = a0;
    for (; j + 4 * W <= N; j += 4 * W) {
      a0 = R::step(a0, f(x.template vec<V>(j)...));
      a1 = R::step(a1, f(x.template vec<V>(j + W)...));
      a2 = R::step(a2, f(x.template vec<V>(j + 2 * W)...));
      a3 = R::step(a3, f(x.template vec<V>(j + 3 * W)...));
    }
    for (; j + W <= N; j += W) a0 = R::step(a0, f(x.template vec<V>(j)...));
    a0 = R::combine(R::combine(a0, a1), R::combine(a2, a3));
    acc = a0[0];
    for (int l = 1; l < W; ++l) acc = R::combine(acc, a0[l]);
  }
  for (; j < N; ++j) acc = R::step(acc, static_cast<T>(f(x.at(j)...)));
  return acc;
}

// Fold N contiguous elements of type U (T's own, or half precision widened as read) in T.
template <class R, i64 N, class T, class U>
MJ_INLINE T fold_row(const U* x) {
  return fold_row_of<R, N, T>(op::Identity{}, RowOperand<U, false>{x});
}

// Rows [a0, a1) of out[A, B] (+)= reduce_n in[A, N, B]; ACC folds into out's current values
// (accumulators), otherwise out starts from R's init. No finish here. `in` holds T or a half
// type, widened as it is read.
template <class R, i64 N, i64 B, bool ACC, class T, class U>
MJ_INLINE void fold_rows(T* out, const U* in, i64 a0, i64 a1) {
  for (i64 a = a0; a < a1; ++a) {
    if constexpr (B == 1) {
      const T v = fold_row<R, N, T>(in + a * N);
      out[a] = ACC ? R::combine(out[a], v) : v;
    } else {
      T* o = out + a * B;
      const U* x = in + a * N * B;
      if constexpr (!ACC) {
        for (i64 b = 0; b < B; ++b) o[b] = R::template init<T>();
      }
      for (i64 n = 0; n < N; ++n) {
        const U* xn = x + n * B;
        i64 b = 0;
        if constexpr (simd_type<T>) {
          using V = vec_t<T>;
          for (; b + lanes<T> <= B; b += lanes<T>) vstore<V>(o + b, R::step(vload<V>(o + b), load_wide<V>(xn + b)));
        }
        for (; b < B; ++b) o[b] = R::step(o[b], static_cast<T>(xn[b]));
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

// The operand of row a of a fused reduction over the last dim of Full: In broadcasts to Full
// (numpy rules, equal ranks), so its row is either N values or one value.
template <class Full, class In, class T>
MJ_INLINE auto row_operand(const T* x, i64 a) {
  constexpr int r = Full::rank;
  constexpr bool bcast = In::dims[r - 1] == 1 && Full::dims[r - 1] != 1;
  i64 off = 0;
  for (int d = r - 2; d >= 0; --d) {
    const i64 idx = a % Full::dims[d];
    a /= Full::dims[d];
    if (In::dims[d] != 1) off += idx * In::stride(d);
  }
  return RowOperand<T, bcast>{x + off};
}

// Block level: out = reduce over the last dim of f(in...), f's values never stored. Full is
// the shape of f's result; every `in` broadcasts to it.
template <class R, class Full, class Out, class F, class... In>
MJ_INLINE void map_reduce(Out& out, const F& f, const In&... in) {
  using T = value_of<Out>;
  constexpr i64 N = Full::dims[Full::rank - 1];
  static_assert(shape_of<Out>::size * N == Full::size, "fused reduction output shape");
  T* o = out.ptr();
  for (i64 a = 0; a < shape_of<Out>::size; ++a)
    o[a] = fold_row_of<R, N, T>(f, row_operand<Full, shape_of<In>>(in.ptr(), a)...);
  finish_all<R, N>(o, 0, shape_of<Out>::size);
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
inline void reduce_wide_out(const mj_pool* pool, Out& out, const In& in) {
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
        for (i64 b = lo; b < hi; ++b) o[b] = R::step(o[b], static_cast<value_of<Out>>(x[n * D::B + b]));
      finish_all<R, D::N>(o, lo, hi);
    });
  }
}

template <class R, int Dim, class Out, class In>
inline void reduce(const mj_pool* pool, Out& out, const In& in) {
  if constexpr (is_half<value_of<Out>>) {  // a half input is widened as it is read
    with_wide_output(pool, out, [&](const auto& o) { reduce_wide_out<R, Dim>(pool, o, in); });
  } else {
    reduce_wide_out<R, Dim>(pool, out, in);
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

// out = in[..., Start:Start + n, ...] along Dim (n: out's extent there): a row copy per outer
// index.
template <int Dim, int Start, class Out, class In>
inline void slice(const mj_pool* pool, Out& out, const In& in) {
  using SI = shape_of<In>;
  using SO = shape_of<Out>;
  constexpr i64 outer = SI::prod(0, Dim);
  constexpr i64 ri = SI::prod(Dim, SI::rank), ro = SO::prod(Dim, SO::rank);
  constexpr i64 offset = Start * SI::prod(Dim + 1, SI::rank);
  static_assert(SO::size == outer * ro && offset + ro <= ri, "slice output shape");
  auto* o = out.ptr();
  const auto* x = in.ptr();
  parallel_ranges(pool, outer, SO::size, [&](i64 lo, i64 hi) {
    for (i64 i = lo; i < hi; ++i)
      copy_region<Shape<ro>, Shape<ro>, Shape<ro>>(o + i * ro, x + i * ri + offset);
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
