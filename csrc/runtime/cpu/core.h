// core.h - shapes, tiles, views, SIMD vectors and the N-d iteration engine of the CPU runtime.
//
// Every runtime template is written against compile-time shapes (mj::Shape<d0, d1, ...>), so
// loop trip counts and strides are constants and g++ -O3 unrolls and vectorises them. Generated
// code only names shapes and maps; all loops live here.
//
// The iteration engine: an elementwise operation over K operands (operand 0 is written) is an
// N-d index space with per-operand element strides (0 where an operand broadcasts). `collapse`
// drops size-1 dims and merges adjacent dims that are contiguous for every operand, so the
// innermost loop is as long as possible; `nd_for` runs the outer dims and hands each innermost
// row to a row functor (see elementwise.h).
#pragma once

#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <utility>

#include "cpu/abi.h"

#define MJ_INLINE inline __attribute__((always_inline))

// Bytes in one SIMD register for the ISA this translation unit is compiled for.
#if defined(__AVX512F__)
#define MJ_VEC_BYTES 64
#elif defined(__AVX__)
#define MJ_VEC_BYTES 32
#else
#define MJ_VEC_BYTES 16
#endif

namespace mj {

using i64 = std::int64_t;

inline constexpr std::size_t kAlign = 64;
inline constexpr double kInf = std::numeric_limits<double>::infinity();
inline constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// ---------------------------------------------------------- half-precision storage types

// bfloat16 and float16 are storage types only: reading one widens it to float, writing one
// rounds to nearest even (NaN stays a quiet NaN), and every op computes in float, as XLA's
// CPU backend does. Tiles and accumulators of half-precision values are float arrays.
struct bf16 {
  std::uint16_t bits;
  bf16() = default;
  MJ_INLINE bf16(float f) : bits(round(f)) {}
  MJ_INLINE operator float() const {
    return __builtin_bit_cast(float, static_cast<std::uint32_t>(bits) << 16);
  }
  static MJ_INLINE std::uint16_t round(float f) {
    const std::uint32_t u = __builtin_bit_cast(std::uint32_t, f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((u >> 16) | 0x40u);
    return static_cast<std::uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
  }
};

struct f16 {
  _Float16 value;  // IEEE binary16: F16C converts it where the ISA has it
  f16() = default;
  MJ_INLINE f16(float f) : value(static_cast<_Float16>(f)) {}
  MJ_INLINE operator float() const { return static_cast<float>(value); }
};

// A mask element (jax's bool: one byte, 0 or 1): read as 0.0f or 1.0f, computed in float like
// the half types; only where / where_not read it.
struct mask8 {
  std::uint8_t bits;
  mask8() = default;
  MJ_INLINE mask8(float f) : bits(f != 0.0f) {}
  MJ_INLINE operator float() const { return bits ? 1.0f : 0.0f; }
};

// The type an element of type T is computed in: float for the narrow types, else T itself.
template <class T>
struct Compute {
  using type = T;
};
template <>
struct Compute<bf16> {
  using type = float;
};
template <>
struct Compute<f16> {
  using type = float;
};
template <>
struct Compute<mask8> {
  using type = float;
};
template <class T>
using compute_t = typename Compute<std::remove_cv_t<T>>::type;
template <class T>
inline constexpr bool is_half = !std::is_same_v<compute_t<T>, std::remove_cv_t<T>>;

template <class T>
MJ_INLINE compute_t<T> widen(const T& x) {
  return static_cast<compute_t<T>>(x);
}

// ------------------------------------------------------------------------------------ shapes

template <i64... D>
struct Shape {
  static constexpr int rank = sizeof...(D);
  static constexpr i64 size = (i64{1} * ... * D);
  static constexpr std::array<i64, sizeof...(D)> dims{{D...}};
  static constexpr i64 dim(int d) { return dims[d]; }
  // Row-major element stride of dim d.
  static constexpr i64 stride(int d) {
    i64 s = 1;
    for (int k = d + 1; k < rank; ++k) s *= dims[k];
    return s;
  }
  // Product of the dims in [lo, hi).
  static constexpr i64 prod(int lo, int hi) {
    i64 p = 1;
    for (int k = lo; k < hi; ++k) p *= dims[k];
    return p;
  }
};

// A grid-axis -> tensor-dim map (imap / omap); -1 means "not mapped".
template <int X, int Y, int Z>
struct Map {
  static constexpr std::array<int, 3> axis{{X, Y, Z}};
};

template <int... P>
struct Perm {
  static constexpr int rank = sizeof...(P);
  static constexpr std::array<int, sizeof...(P)> src{{P...}};
};

struct BlockIdx {
  i64 x, y, z;
  constexpr i64 operator[](int a) const { return a == 0 ? x : (a == 1 ? y : z); }
};

// --------------------------------------------------------------------------- tiles and views

// A block's tile: a contiguous, 64-byte aligned row-major array sized at compile time.
template <class T, class Sh>
struct alignas(kAlign) Tile {
  using value_type = T;
  using shape = Sh;
  T data[Sh::size];
  MJ_INLINE T* ptr() { return data; }
  MJ_INLINE const T* ptr() const { return data; }
};

// A kernel-level tensor: a pointer to dense row-major memory of a compile-time shape.
template <class T, class Sh>
struct View {
  using value_type = std::remove_const_t<T>;
  using shape = Sh;
  T* data;
  template <class P>
  explicit View(P* p) : data(reinterpret_cast<T*>(p)) {}
  MJ_INLINE T* ptr() const { return data; }
  // Row-major reshape: the same memory seen with another shape of equal size.
  template <class Sh2>
  View<T, Sh2> reshape() const {
    static_assert(Sh2::size == Sh::size, "reshape must keep the element count");
    return View<T, Sh2>(data);
  }
};

// A block's tile read in place: the box of a row-major kernel tensor of shape Full that a
// block sees, with Full's strides. Matmul operands use it instead of a copied Tile, since the
// copy costs a store and a reload of every element the matmul streams once.
// Next: elements from this tile to the one the next loop iteration reads (0: none), which the
// matmul prefetches as it goes.
template <class T, class Sh, class Full, i64 Next = 0>
struct TileRef {
  using value_type = T;
  using shape = Sh;
  static_assert(Sh::rank == Full::rank, "a tile has its tensor's rank");
  static constexpr i64 next = Next;
  const T* data;
  MJ_INLINE const T* ptr() const { return data; }
  static constexpr i64 stride(int d) { return Full::stride(d); }
};

template <class X>
using shape_of = typename std::remove_reference_t<X>::shape;

// Element stride of dim d of an operand: row-major in its own shape, except for a TileRef.
template <class X>
struct StrideOf {
  static constexpr i64 get(int d) { return shape_of<X>::stride(d); }
};
template <class T, class Sh, class Full, i64 Next>
struct StrideOf<TileRef<T, Sh, Full, Next>> {
  static constexpr i64 get(int d) { return Full::stride(d); }
};
template <class X>
inline constexpr i64 stride_of(int d) {
  return StrideOf<std::remove_cv_t<std::remove_reference_t<X>>>::get(d);
}

// A TileRef (it has `next`): an operand read where it lies in a kernel tensor, i.e. streamed
// from memory rather than from a tile in cache.
template <class X, class = void>
struct InPlace : std::false_type {};
template <class X>
struct InPlace<X, std::void_t<decltype(X::next)>> : std::true_type {};
template <class X>
inline constexpr bool in_place = InPlace<std::remove_cv_t<std::remove_reference_t<X>>>::value;

// Elements ahead an operand's reader should prefetch (a TileRef's next tile; else none).
template <class X>
constexpr i64 prefetch_ahead_of() {
  using Y = std::remove_cv_t<std::remove_reference_t<X>>;
  if constexpr (in_place<Y>) return Y::next;
  else return 0;
}
template <class X>
inline constexpr i64 prefetch_ahead = prefetch_ahead_of<X>();
template <class X>
using value_of = typename std::remove_reference_t<X>::value_type;

// ------------------------------------------------------------------------------ SIMD vectors

// vec_t<T>: one SIMD register of T (GCC vector extension, lowered to the compiled ISA).
template <class T>
struct VecOf {
  typedef T type __attribute__((vector_size(MJ_VEC_BYTES)));
};
template <class T>
using vec_t = typename VecOf<T>::type;
template <class T>
inline constexpr int lanes = MJ_VEC_BYTES / sizeof(T);

using vf32 = vec_t<float>;
using vf64 = vec_t<double>;
using vi32 = vec_t<std::int32_t>;
using vi64 = vec_t<std::int64_t>;
using vu32 = vec_t<std::uint32_t>;
// Half a register of 16-bit elements: as many as a vf32 has lanes (half-precision storage).
typedef std::uint16_t vu16_half __attribute__((vector_size(MJ_VEC_BYTES / 2)));
typedef _Float16 vf16_half __attribute__((vector_size(MJ_VEC_BYTES / 2)));

// Lane<T>: the scalar type of T (itself for a scalar) and whether T is a vector.
template <class T>
struct Lane {
  using type = T;
  static constexpr bool vector = false;
};
template <>
struct Lane<vf32> {
  using type = float;
  static constexpr bool vector = true;
};
template <>
struct Lane<vf64> {
  using type = double;
  static constexpr bool vector = true;
};
template <class T>
using lane_t = typename Lane<T>::type;
template <class T>
inline constexpr bool is_vec = Lane<T>::vector;

template <class T>
inline constexpr bool simd_type = std::is_same_v<T, float> || std::is_same_v<T, double>;

// A broadcast (not 0 + s, which g++ must compute as an add to keep -0.0).
template <class T>
MJ_INLINE T splat(lane_t<T> s) {
  if constexpr (is_vec<T>) {
    return s - T{};  // s - 0 is s for every s, -0.0 included, so this folds to a broadcast
  } else {
    return s;
  }
}

template <class V>
MJ_INLINE V vload(const lane_t<V>* p) {
  V v;
  std::memcpy(&v, p, sizeof(V));
  return v;
}

template <class V>
MJ_INLINE void vstore(lane_t<V>* p, V v) {
  std::memcpy(p, &v, sizeof(V));
}

// ------------------------------------------------------------------------ iteration engine

// An N-d index space shared by K operands: extents n[d] and element strides s[k][d].
template <int R, int K>
struct Space {
  int rank = 0;
  i64 n[R + 1] = {};
  i64 s[K][R + 1] = {};
  constexpr i64 inner_n() const { return rank ? n[rank - 1] : 1; }
  constexpr i64 inner_s(int k) const { return rank ? s[k][rank - 1] : 0; }
  constexpr i64 outer_n() const { return rank ? n[0] : 1; }
};

// Drop size-1 dims; merge a dim into the one outside it when every operand is contiguous
// across the two (also true for two broadcast dims: 0 == 0 * n).
template <int R, int K>
constexpr Space<R, K> collapse(const Space<R, K>& in) {
  Space<R, K> out;
  for (int d = 0; d < in.rank; ++d) {
    if (in.n[d] == 1) continue;
    bool merge = out.rank > 0;
    for (int k = 0; k < K && merge; ++k) merge = out.s[k][out.rank - 1] == in.s[k][d] * in.n[d];
    if (merge) {
      out.n[out.rank - 1] *= in.n[d];
      for (int k = 0; k < K; ++k) out.s[k][out.rank - 1] = in.s[k][d];
    } else {
      out.n[out.rank] = in.n[d];
      for (int k = 0; k < K; ++k) out.s[k][out.rank] = in.s[k][d];
      ++out.rank;
    }
  }
  return out;
}

// Operand 0 is the dense output of shape Out; the others broadcast to it (stride 0 on dims
// where they have size 1).
template <class Out, class... In>
struct BroadcastSpace {
  static constexpr int R = Out::rank;
  static constexpr int K = 1 + sizeof...(In);
  static_assert(((In::rank == R) && ...), "broadcast operands need the output's rank");
  template <class Sh>
  static constexpr void strides(Space<R, K>& sp, int k) {
    for (int d = 0; d < R; ++d) sp.s[k][d] = Sh::dims[d] == 1 ? 0 : Sh::stride(d);
  }
  static constexpr Space<R, K> make() {
    Space<R, K> sp;
    sp.rank = R;
    for (int d = 0; d < R; ++d) sp.n[d] = Out::dims[d];
    strides<Out>(sp, 0);
    int k = 1;
    ((strides<In>(sp, k++)), ...);
    return sp;
  }
  static constexpr Space<R, K> value = collapse(make());
};

// A region of shape Region copied between operand 0 (row-major strides of Dst) and operand 1
// (row-major strides of Src): tile loads and stores.
template <class Region, class Dst, class Src>
struct CopySpace {
  static constexpr int R = Region::rank;
  static constexpr Space<R, 2> make() {
    Space<R, 2> sp;
    sp.rank = R;
    for (int d = 0; d < R; ++d) {
      sp.n[d] = Region::dims[d];
      sp.s[0][d] = Dst::stride(d);
      sp.s[1][d] = Src::stride(d);
    }
    return sp;
  }
  static constexpr Space<R, 2> value = collapse(make());
};

// out[i0, i1, ...] = in[i_{perm^-1}...]: out dim d reads in dim Pm::src[d].
template <class Out, class In, class Pm>
struct TransposeSpace {
  static constexpr int R = Out::rank;
  static constexpr Space<R, 2> make() {
    Space<R, 2> sp;
    sp.rank = R;
    for (int d = 0; d < R; ++d) {
      sp.n[d] = Out::dims[d];
      sp.s[0][d] = Out::stride(d);
      sp.s[1][d] = In::stride(Pm::src[d]);
    }
    return sp;
  }
  static constexpr Space<R, 2> value = collapse(make());
};

// Run the outer dims [D, rank-1) of SpH::value; call row(j0, j1, ptrs...) for every innermost
// row, with each pointer advanced by its operand's strides.
template <class SpH, int D, class Row, class... P>
MJ_INLINE void nd_for(const Row& row, P*... p);

template <class SpH, int D, class Row, std::size_t... K, class... P>
MJ_INLINE void nd_step(const Row& row, std::index_sequence<K...>, i64 lo, i64 hi, P*... p) {
  constexpr auto& sp = SpH::value;
  for (i64 i = lo; i < hi; ++i) nd_for<SpH, D + 1>(row, (p + i * sp.s[K][D])...);
}

template <class SpH, int D, class Row, class... P>
MJ_INLINE void nd_for(const Row& row, P*... p) {
  constexpr auto& sp = SpH::value;
  if constexpr (D + 1 >= sp.rank) {
    row(0, sp.inner_n(), p...);
  } else {
    nd_step<SpH, D>(row, std::index_sequence_for<P...>{}, 0, sp.n[D], p...);
  }
}

// The part [lo, hi) of the outermost dim (the innermost when rank <= 1): one parallel task.
template <class SpH, class Row, class... P>
MJ_INLINE void nd_range(const Row& row, i64 lo, i64 hi, P*... p) {
  constexpr auto& sp = SpH::value;
  if constexpr (sp.rank <= 1) {
    row(lo, hi, p...);
  } else {
    nd_step<SpH, 0>(row, std::index_sequence_for<P...>{}, lo, hi, p...);
  }
}

}  // namespace mj
