// accum.h - for-loop accumulators: state objects with init() before the loop, update() every
// iteration and finish() after it; `out` is the accumulated tile the epilogue reads.
//
// Dim = -1 accumulates tiles as they are; Dim = d also reduces tile dim d to 1 on every
// update. Range is the block graph's forloop_range (the mean / rms divide by the full count).
#pragma once

#include "cpu/reduce.h"

namespace mj {

template <class Sh, int Dim>
struct Reduced;
template <i64... D, int Dim>
struct Reduced<Shape<D...>, Dim> {
  static constexpr std::array<i64, sizeof...(D)> in{{D...}};
  template <std::size_t... I>
  static auto make(std::index_sequence<I...>) -> Shape<(static_cast<int>(I) == Dim ? 1 : in[I])...>;
  using type = decltype(make(std::make_index_sequence<sizeof...(D)>{}));
};
template <class Sh, int Dim>
using reduced_t = std::conditional_t<(Dim < 0), Sh, typename Reduced<Sh, Dim>::type>;

template <class R>
struct StepOf {
  template <class U>
  MJ_INLINE U operator()(U acc, U x) const { return R::step(acc, x); }
};
// exp(a - b), with exp(-inf - -inf) = 1 so a loop that starts from -inf maxima is exact.
struct ExpSub {
  template <class U>
  MJ_INLINE U operator()(U a, U b) const { return a == b ? splat<U>(1) : fm::exp(a - b); }
};
// acc * s + x * w, where x from a tile whose max m is -inf (every score of the tile masked)
// adds nothing: such an x is NaN (its scores were shifted by exp(-inf - -inf)), while XLA's
// softmax of the row is defined as soon as another tile has a finite score.
struct Rescale {
  template <class U>
  MJ_INLINE U operator()(U acc, U x, U s, U w, U m) const {
    const U term = x * w;
    return acc * s + (m == -std::numeric_limits<lane_t<U>>::infinity() ? U{} : term);
  }
};

// Shared by sum / mean / max / rms: out folds R over iterations (and over Dim).
template <class R, class T, class Sh, int Dim, i64 Count>
struct AccFold {
  Tile<T, reduced_t<Sh, Dim>> out;

  MJ_INLINE void init() {
    for (auto& v : out.data) v = R::template init<T>();
  }
  template <class X>
  MJ_INLINE void update(const X& x) {
    if constexpr (Dim < 0) {
      map(StepOf<R>{}, out, out, x);
    } else {
      reduce_into<R, Dim>(out, x);
    }
  }
  // Folds in the state of the same loop over other iterations (a split loop's other part).
  MJ_INLINE void merge(const AccFold& other) {
    for (i64 j = 0; j < reduced_t<Sh, Dim>::size; ++j)
      out.data[j] = R::combine(out.data[j], other.out.data[j]);
  }
  MJ_INLINE void finish() {
    if constexpr (R::has_finish) {
      for (auto& v : out.data) v = R::finish(v, Count);
    }
  }
};

template <class Sh, int Dim>
inline constexpr i64 dim_count = Dim < 0 ? 1 : Sh::dims[Dim < 0 ? 0 : Dim];

template <class T, class Sh, int Dim, i64 Range>
struct AccSum : AccFold<SumR, T, Sh, Dim, 1> {};
template <class T, class Sh, int Dim, i64 Range>
struct AccMean : AccFold<MeanR, T, Sh, Dim, Range * dim_count<Sh, Dim>> {};
template <class T, class Sh, int Dim, i64 Range>
struct AccMax : AccFold<MaxR, T, Sh, Dim, 1> {};
template <class T, class Sh, int Dim, i64 Range>
struct AccRms : AccFold<RmsR, T, Sh, Dim, Range * dim_count<Sh, Dim>> {};

// Online softmax numerator: out = sum_i exp(m_i - M) x_i with M = max_i m_i, kept as a running
// max: M' = max(M, m_i); out = out * exp(M - M') + x_i * exp(m_i - M').
template <class T, class XSh, class MSh, i64 Range>
struct AccRescaleSum {
  Tile<T, XSh> out;
  Tile<T, MSh> max, next, scale, weight;

  MJ_INLINE void init() {
    for (auto& v : out.data) v = T(0);
    for (auto& v : max.data) v = -std::numeric_limits<T>::infinity();
  }
  template <class X, class M>
  MJ_INLINE void update(const X& x, const M& m) {
    map(op::Max{}, next, max, m);
    map(ExpSub{}, scale, max, next);
    map(ExpSub{}, weight, m, next);
    map(op::Identity{}, max, next);
    map(Rescale{}, out, out, x, scale, weight, m);
  }
  MJ_INLINE void finish() {}
};

}  // namespace mj
