// math.h - elementwise functors (one per IR op) for scalars and SIMD vectors.
//
// Every functor is callable on T = float, double, vec_t<float> or vec_t<double>, so one fused
// loop (elementwise.h) runs the same code in SIMD lanes and in its scalar tail. float32
// transcendental functions use branch-free range reduction + polynomials (Cephes / Eigen
// coefficients, <= 2 ulp on the tested ranges) so they vectorise; float64 uses std:: lane by
// lane, for accuracy. sqrt on vectors uses the ISA's sqrt instruction because std::sqrt keeps
// errno semantics that block vectorisation. (g++ contracts a * b + c into FMA where the ISA has
// it, also under -std=c++17.)
#pragma once

#include "cpu/core.h"

namespace mj {
namespace fm {

// ---------------------------------------------------------------- bit-level helpers (float)

MJ_INLINE std::int32_t bits(float x) { return __builtin_bit_cast(std::int32_t, x); }
MJ_INLINE vi32 bits(vf32 x) { return reinterpret_cast<vi32>(x); }
MJ_INLINE float from_bits(std::int32_t i) { return __builtin_bit_cast(float, i); }
MJ_INLINE vf32 from_bits(vi32 i) { return reinterpret_cast<vf32>(i); }
MJ_INLINE std::int32_t to_int(float x) { return static_cast<std::int32_t>(x); }
MJ_INLINE vi32 to_int(vf32 x) { return __builtin_convertvector(x, vi32); }
MJ_INLINE float to_float(std::int32_t i) { return static_cast<float>(i); }
MJ_INLINE vf32 to_float(vi32 i) { return __builtin_convertvector(i, vf32); }

template <class T>
MJ_INLINE T abs_f(T x) {
  return from_bits(bits(x) & 0x7fffffff);
}
template <class T>
MJ_INLINE T copysign_f(T mag, T sgn) {
  return from_bits((bits(mag) & 0x7fffffff) | (bits(sgn) & std::numeric_limits<std::int32_t>::min()));
}

// Apply a scalar function to every lane (float64 vectors, or anything without a fast path).
template <class T, class F>
MJ_INLINE T lanewise(T x, F f) {
  if constexpr (is_vec<T>) {
    for (int l = 0; l < lanes<lane_t<T>>; ++l) x[l] = f(x[l]);
    return x;
  } else {
    return f(x);
  }
}

template <class T>
inline constexpr bool f32_lanes = std::is_same_v<lane_t<T>, float>;

// --------------------------------------------------------------------------- float32 kernels

// exp: x = n ln2 + r, |r| <= ln2/2, degree-6 polynomial; 2^n applied as two factors so the
// result degrades gracefully into denormals and overflows to +inf exactly where float does.
template <class T>
MJ_INLINE T exp_f32(T x) {
  const float hi = 88.7228394f, lo = -103.972076f;
  T xc = x >= lo ? x : splat<T>(lo);  // NaN -> lo, patched below
  xc = xc <= hi ? xc : splat<T>(hi);
  const float magic = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
  T fn = (xc * 1.44269504088896341f + magic) - magic;
  T r = xc - fn * 0.693359375f;
  r = r - fn * -2.12194440e-4f;
  T z = r * r;
  T p = splat<T>(1.9875691500e-4f);
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  T y = p * z + r + 1.0f;
  auto n = to_int(fn);
  auto n1 = n >> 1;
  auto n2 = n - n1;
  y = y * from_bits((n1 + 127) << 23) * from_bits((n2 + 127) << 23);
  y = x > hi ? splat<T>(__builtin_inff()) : y;
  y = x < lo ? splat<T>(0.0f) : y;
  return x != x ? x : y;
}

// log: x = m 2^e with m in [sqrt(1/2), sqrt(2)), degree-9 polynomial in m - 1 (Cephes logf).
template <class T>
MJ_INLINE T log_f32(T x) {
  const float tiny = 1.17549435e-38f;  // FLT_MIN: scale denormals into the normal range
  T xs = x < tiny ? x * 8388608.0f : x;
  auto u = bits(xs);
  auto e = ((u >> 23) & 0xff) - 126;
  e = x < tiny ? e - 23 : e;
  T m = from_bits((u & 0x007fffff) | 0x3f000000);  // in [0.5, 1)
  auto lt = m < 0.707106781186547524f;
  T ef = to_float(e) - (lt ? splat<T>(1.0f) : splat<T>(0.0f));
  m = (lt ? m + m : m) - 1.0f;
  T z = m * m;
  T y = splat<T>(7.0376836292e-2f);
  y = y * m - 1.1514610310e-1f;
  y = y * m + 1.1676998740e-1f;
  y = y * m - 1.2420140846e-1f;
  y = y * m + 1.4249322787e-1f;
  y = y * m - 1.6668057665e-1f;
  y = y * m + 2.0000714765e-1f;
  y = y * m - 2.4999993993e-1f;
  y = y * m + 3.3333331174e-1f;
  y = y * m * z;
  y = y + ef * -2.12194440e-4f;
  y = y - z * 0.5f;
  T r = m + y + ef * 0.693359375f;
  r = x == 0.0f ? splat<T>(-__builtin_inff()) : r;
  r = x < 0.0f ? splat<T>(__builtin_nanf("")) : r;
  r = x == __builtin_inff() ? x : r;
  return x != x ? x : r;
}

// tanh: odd polynomial below |x| = 0.625 (keeps relative accuracy near 0), else
// 1 - 2 / (exp(2|x|) + 1) with the sign restored.
template <class T>
MJ_INLINE T tanh_f32(T x) {
  T z = x * x;
  T p = splat<T>(-5.70498872745e-3f);
  p = p * z + 2.06390887954e-2f;
  p = p * z - 5.37397155531e-2f;
  p = p * z + 1.33314422036e-1f;
  p = p * z - 3.33332819422e-1f;
  T small = p * z * x + x;
  small = x == 0.0f ? x : small;  // tanh(-0) = -0: x + (-0 * z * p) would round to +0
  T ax = abs_f(x);
  T big = copysign_f(1.0f - 2.0f / (exp_f32(ax + ax) + 1.0f), x);
  return ax < 0.625f ? small : big;
}

// sin and cos: x = q pi/2 + r with |r| <= pi/4, pi/2 taken in three parts (Cephes' split: the
// first two have 8 and 11 bits, so their products by q are exact while |q| < 2^13), then the
// odd or even polynomial of r (Cephes sinf / cosf) by q's quadrant, signed by it. Lanes with
// |x| beyond kTrigReduced (and inf, nan) take std:: in double.
inline constexpr float kTrigReduced = 12800.0f;

// Whether a comparison holds in every lane (a bool for scalars, a lane mask for vectors).
template <class M>
MJ_INLINE bool all_lanes(M m) {
  if constexpr (std::is_same_v<M, bool>) {
    return m;
  } else {
    std::uint64_t w[sizeof(M) / 8];
    std::memcpy(w, &m, sizeof(M));
    std::uint64_t all = ~std::uint64_t{0};
    for (auto v : w) all &= v;
    return all == ~std::uint64_t{0};
  }
}

template <class T>
MJ_INLINE T sin_cos_f32(T x, int quadrant) {
  const float magic = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
  T fq = (x * 0.636619772f + magic) - magic;
  T r = x - fq * 1.5703125f;
  r = r - fq * 4.837512969970703125e-4f;
  r = r - fq * 7.549790126404332e-8f;
  auto q = to_int(fq) + quadrant;
  T z = r * r;
  T sin_r = ((splat<T>(-1.9515295891e-4f) * z + 8.3321608736e-3f) * z - 1.6666654611e-1f) * z * r + r;
  T cos_r = ((splat<T>(2.443315711809948e-5f) * z - 1.388731625493765e-3f) * z + 4.166664568298827e-2f) * z * z -
            0.5f * z + 1.0f;
  T y = (q & 1) != 0 ? cos_r : sin_r;
  y = (q & 2) != 0 ? -y : y;  // quadrants 2 and 3 negate
  if (quadrant == 0) y = x == 0.0f ? x : y;  // sin(-0) = -0: r + (-0 * ...) rounds to +0
  const auto reduced = abs_f(x) <= kTrigReduced;
  if (!all_lanes(reduced)) {
    y = reduced ? y : lanewise(x, [quadrant](float v) {
      return static_cast<float>(quadrant ? std::cos(double{v}) : std::sin(double{v}));
    });
  }
  return y;
}

// erf: odd/even rational approximation on [-4, 4] (Eigen / XLA ErfImpl32); erf = +-1 beyond.
template <class T>
MJ_INLINE T erf_f32(T a) {
  T x = a <= 4.0f ? a : splat<T>(4.0f);
  x = x >= -4.0f ? x : splat<T>(-4.0f);
  T x2 = x * x;
  T p = x2 * -2.72614225801306e-10f + 2.77068142495902e-08f;
  p = x2 * p + -2.10102402082508e-06f;
  p = x2 * p + -5.69250639462346e-05f;
  p = x2 * p + -7.34990630326855e-04f;
  p = x2 * p + -2.95459980854025e-03f;
  p = x2 * p + -1.60960333262415e-02f;
  T q = x2 * -1.45660718464996e-05f + -2.13374055278905e-04f;
  q = x2 * q + -1.68282697438203e-03f;
  q = x2 * q + -7.37332916720468e-03f;
  q = x2 * q + -1.42647390514189e-02f;
  T r = x * (p / q);  // x last: x * p alone would underflow for tiny x
  return a != a ? a : r;
}

// c0 y^n + c1 y^(n-1) + ... + cn by Horner's rule (g++ contracts each step into an FMA).
template <class T, class... C>
MJ_INLINE T horner(T y, float c0, C... c) {
  T p = splat<T>(c0);
  ((p = p * y + c), ...);
  return p;
}

// erfc: 1 - erf below |x| = 1 (erfc >= 0.157 there, so no cancellation); beyond, the tail
// form exp(-x^2) / |x| * P(1/x^2) with our own fits (relative error <= 4e-7 on [1, 9.2]),
// reflected as 2 - erfc(|x|) for x < 0. exp(-x^2) takes x^2's rounding error back through a
// Dekker split of x: the tail's relative error is otherwise x^2 * 2^-24 (4e-6 at x = 7).
template <class T>
MJ_INLINE T erfc_f32(T a) {
  T x = abs_f(a);
  T hi = from_bits(bits(x) & static_cast<std::int32_t>(0xfffff000));
  T lo = x - hi;
  T xx = x * x;
  T err = ((hi * hi - xx) + 2.0f * hi * lo) + lo * lo;
  T z = exp_f32(-xx);
  z = z - z * err;
  T q = 1.0f / x;
  T y = q * q;
  // 1 <= x < 2: y in (1/4, 1]; x >= 2: y in (0, 1/4]
  T p = horner(y, 2.326754844529242e-02f, -1.387006965707934e-01f, 3.687355888830502e-01f,
               -5.824651977652747e-01f, 6.209946731096033e-01f, -4.944489708049572e-01f,
               3.404873092814477e-01f, -2.741126019558556e-01f, 5.638259364677017e-01f);
  T r = horner(y, -9.947741274100792e+00f, 1.247375176674141e+01f, -7.303214399266145e+00f,
               2.883302691502092e+00f, -1.011247844000937e+00f, 4.216208373012304e-01f,
               -2.820708432701798e-01f, 5.641894550605679e-01f);
  T tail = z * q * (x < 2.0f ? p : r);
  tail = x > 10.5f ? splat<T>(0.0f) : tail;  // below float's range; x * x may be inf
  tail = a < 0.0f ? 2.0f - tail : tail;
  T near = 1.0f - erf_f32(a);
  T out = x < 1.0f ? near : tail;
  return a != a ? a : out;
}

// ------------------------------------------------------------------- dtype-generic wrappers

template <class T>
MJ_INLINE T exp(T x) {
  if constexpr (f32_lanes<T>) return exp_f32(x);
  else return lanewise(x, [](double v) { return std::exp(v); });
}
template <class T>
MJ_INLINE T log(T x) {
  if constexpr (f32_lanes<T>) return log_f32(x);
  else return lanewise(x, [](double v) { return std::log(v); });
}
template <class T>
MJ_INLINE T tanh(T x) {
  if constexpr (f32_lanes<T>) return tanh_f32(x);
  else return lanewise(x, [](double v) { return std::tanh(v); });
}
template <class T>
MJ_INLINE T sin(T x) {
  if constexpr (f32_lanes<T>) return sin_cos_f32(x, 0);
  else return lanewise(x, [](double v) { return std::sin(v); });
}
template <class T>
MJ_INLINE T cos(T x) {
  if constexpr (f32_lanes<T>) return sin_cos_f32(x, 1);
  else return lanewise(x, [](double v) { return std::cos(v); });
}
template <class T>
MJ_INLINE T erf(T x) {
  if constexpr (f32_lanes<T>) return erf_f32(x);
  else return lanewise(x, [](double v) { return std::erf(v); });
}
template <class T>
MJ_INLINE T erfc(T x) {
  if constexpr (f32_lanes<T>) return erfc_f32(x);
  else return lanewise(x, [](double v) { return std::erfc(v); });
}

// C's fmod lane by lane: exact, where x - y * trunc(x / y) is not (x / y rounds)
template <class T>
MJ_INLINE T rem(T a, T b) {
  if constexpr (is_vec<T>) {
    for (int l = 0; l < lanes<lane_t<T>>; ++l) a[l] = std::fmod(a[l], b[l]);
    return a;
  } else {
    return std::fmod(a, b);
  }
}

MJ_INLINE float sqrt(float x) { return __builtin_sqrtf(x); }
MJ_INLINE double sqrt(double x) { return __builtin_sqrt(x); }
// The ISA's vector sqrt through GCC's builtins (<immintrin.h> alone costs ~0.3 s to parse).
#if defined(__x86_64__) && MJ_VEC_BYTES == 64
MJ_INLINE vf32 sqrt(vf32 x) { return __builtin_ia32_sqrtps512_mask(x, x, 0xffff, 4); }
MJ_INLINE vf64 sqrt(vf64 x) { return __builtin_ia32_sqrtpd512_mask(x, x, 0xff, 4); }
#elif defined(__x86_64__) && MJ_VEC_BYTES == 32
MJ_INLINE vf32 sqrt(vf32 x) { return __builtin_ia32_sqrtps256(x); }
MJ_INLINE vf64 sqrt(vf64 x) { return __builtin_ia32_sqrtpd256(x); }
#elif defined(__x86_64__)
MJ_INLINE vf32 sqrt(vf32 x) { return __builtin_ia32_sqrtps(x); }
MJ_INLINE vf64 sqrt(vf64 x) { return __builtin_ia32_sqrtpd(x); }
#else
MJ_INLINE vf32 sqrt(vf32 x) { return lanewise(x, [](float v) { return __builtin_sqrtf(v); }); }
MJ_INLINE vf64 sqrt(vf64 x) { return lanewise(x, [](double v) { return __builtin_sqrt(v); }); }
#endif

// erf_inv: Giles' single-precision polynomials in w = -log(1 - x^2) (as XLA's ErfInv32),
// w < 5 and beyond; (1 - x)(1 + x) keeps 1 - x exact near |x| = 1, where 1 - x * x rounds.
// +-1 gives +-inf, |x| > 1 NaN (log of a negative), NaN stays NaN.
template <class T>
MJ_INLINE T erf_inv_f32(T x) {
  T w = -log_f32((1.0f - x) * (1.0f + x));
  T c = w - 2.5f;
  T p = horner(c, 2.81022636e-08f, 3.43273939e-07f, -3.5233877e-06f, -4.39150654e-06f,
               2.1858087e-04f, -1.25372503e-03f, -4.17768164e-03f, 2.46640727e-01f,
               1.50140941e+00f);
  T t = sqrt(w) - 3.0f;
  T q = horner(t, -2.00214257e-04f, 1.00950558e-04f, 1.34934322e-03f, -3.67342844e-03f,
               5.73950773e-03f, -7.6224613e-03f, 9.43887047e-03f, 1.00167406e+00f,
               2.83297682e+00f);
  T r = (w < 5.0f ? p : q) * x;
  return abs_f(x) == 1.0f ? x * std::numeric_limits<float>::infinity() : r;
}

// erf_inv in double: the float estimate, refined by Newton steps on erf (|x| < 0.5) or on
// log(erfc) (the tail, where erf saturates and log(erfc) is nearly quadratic), to a few ulps.
inline double erf_inv_f64(double x) {
  const double a = std::fabs(x);
  if (!(a < 1.0)) {
    return a == 1.0 ? x * std::numeric_limits<double>::infinity()
                    : std::numeric_limits<double>::quiet_NaN();
  }
  const float start = static_cast<float>(a) < 1.0f ? static_cast<float>(a) : 0.99999994f;
  double y = erf_inv_f32(start);
  const double c = 1.0 - a;  // exact for a >= 0.5
  const double k = 1.1283791670955126;  // 2 / sqrt(pi)
  for (int i = 0; i < 50; ++i) {
    const double d = k * std::exp(-y * y);
    double step;
    if (a < 0.5) {
      step = (std::erf(y) - a) / d;
    } else {
      const double e = std::erfc(y);
      step = -(std::log(e) - std::log(c)) * e / d;
    }
    y -= step;
    if (std::fabs(step) <= 1e-15 * y) break;
  }
  return std::copysign(y, x);
}

template <class T>
MJ_INLINE T erf_inv(T x) {
  if constexpr (f32_lanes<T>) return erf_inv_f32(x);
  else return lanewise(x, [](double v) { return erf_inv_f64(v); });
}

// Bitwise AND of two float or double scalars or vectors.
template <class T>
MJ_INLINE T and_bits(T a, T b) {
  using S = lane_t<T>;
  using I = std::conditional_t<sizeof(S) == 4, std::int32_t, std::int64_t>;
  if constexpr (is_vec<T>) {
    using VI = vec_t<I>;
    return reinterpret_cast<T>(reinterpret_cast<VI>(a) & reinterpret_cast<VI>(b));
  } else {
    return __builtin_bit_cast(S, __builtin_bit_cast(I, a) & __builtin_bit_cast(I, b));
  }
}

// NaN-propagating max, as XLA's: a NaN in either operand gives NaN, and +0 is above -0
// (max(+0, -0) = +0 in either order; min = -max(-a, -b) then gives -0). Equal operands AND
// their bits: the only equal values whose bits differ are +0 and -0.
template <class T>
MJ_INLINE T max_nan(T a, T b) {
  T m = a > b ? a : b;
  m = a == b ? and_bits(a, b) : m;
  return a != a ? a : m;
}

template <class T>
MJ_INLINE T sigmoid(T x) {
  using S = lane_t<T>;
  return S(1) / (S(1) + exp(-x));
}

}  // namespace fm

// ------------------------------------------------------------------------ one functor per op

namespace op {

#define MJ_UNARY(NAME, EXPR)                 \
  struct NAME {                              \
    template <class T>                       \
    MJ_INLINE T operator()(T x) const {      \
      using S = lane_t<T>;                   \
      (void)sizeof(S);                       \
      return EXPR;                           \
    }                                        \
  };

MJ_UNARY(Identity, x)
MJ_UNARY(Exp, fm::exp(x))
MJ_UNARY(Log, fm::log(x))
MJ_UNARY(Square, x * x)
MJ_UNARY(Sqrt, fm::sqrt(x))
MJ_UNARY(Rsqrt, S(1) / fm::sqrt(x))
MJ_UNARY(Sigmoid, fm::sigmoid(x))
MJ_UNARY(Silu, x * fm::sigmoid(x))
// gelu (tanh form): 0.5 x (1 + tanh(y)) == x sigmoid(2y), which has no cancellation for x << 0.
MJ_UNARY(Gelu, x * fm::sigmoid(x * (S(1.5957691216057308) + S(0.07135481627260025) * x * x)))
MJ_UNARY(Tanh, fm::tanh(x))
MJ_UNARY(Erf, fm::erf(x))
MJ_UNARY(Erfc, fm::erfc(x))
MJ_UNARY(ErfInv, fm::erf_inv(x))
MJ_UNARY(Sin, fm::sin(x))
MJ_UNARY(Cos, fm::cos(x))
// -1 or 1; zeros keep their sign and NaN stays NaN, as XLA's sign
MJ_UNARY(Sign, x > S(0) ? splat<T>(S(1)) : (x < S(0) ? splat<T>(S(-1)) : x))
// max(x, 0) as XLA: NaN stays NaN, -0 becomes +0
MJ_UNARY(Relu, x > S(0) ? x : (x != x ? x : T{}))
MJ_UNARY(Neg, -x)
MJ_UNARY(Reciprocal, S(1) / x)
#undef MJ_UNARY

struct MulScalar {
  double c;
  template <class T>
  MJ_INLINE T operator()(T x) const { return x * lane_t<T>(c); }
};
struct AddScalar {
  double c;
  template <class T>
  MJ_INLINE T operator()(T x) const { return x + lane_t<T>(c); }
};
// x where it is finite, else c (jnp.where(jnp.isfinite(x), x, c), as logsumexp guards its max):
// x - x is exactly 0 for a finite x and NaN for an infinite or NaN one.
struct FiniteOr {
  double c;
  template <class T>
  MJ_INLINE T operator()(T x) const {
    using S = lane_t<T>;
    return x - x == S(0) ? x : splat<T>(S(c));
  }
};
// x^N for an integer N (repeated squaring, unrolled at compile time).
template <int N>
struct PowInt {
  template <class T>
  MJ_INLINE T operator()(T x) const {
    using S = lane_t<T>;
    if constexpr (N < 0) return S(1) / PowInt<-N>{}(x);
    else if constexpr (N == 0) return splat<T>(S(1));
    else if constexpr (N == 1) return x;
    else {
      T h = PowInt<N / 2>{}(x);
      if constexpr (N % 2) return h * h * x;
      else return h * h;
    }
  }
};
// x^c for a non-integer c, with pow's special values (as XLA): NaN for finite x < 0,
// pow(-0, c) = +0 for c > 0 and +inf for c < 0, pow(-inf, c) = +inf for c > 0 and +0 for
// c < 0. c = +-0.5 is a square root; others are exp(c log x).
struct PowScalar {
  double c;
  template <class T>
  MJ_INLINE T operator()(T x) const {
    using S = lane_t<T>;
    const S inf = std::numeric_limits<S>::infinity();
    T y;
    if (c == 0.5) {
      y = fm::sqrt(x) + S(0);  // + 0 turns sqrt(-0) = -0 into +0
    } else if (c == -0.5) {
      y = S(1) / (fm::sqrt(x) + S(0));
    } else {
      y = fm::exp(fm::log(x) * S(c));  // log(-inf) is NaN: -inf is patched below
    }
    return x == -inf ? splat<T>(c > 0 ? inf : S(0)) : y;
  }
};

#define MJ_BINARY(NAME, EXPR)                     \
  struct NAME {                                   \
    template <class T>                            \
    MJ_INLINE T operator()(T a, T b) const {      \
      return EXPR;                                \
    }                                             \
  };
MJ_BINARY(Add, a + b)
MJ_BINARY(Sub, a - b)
MJ_BINARY(Mul, a * b)
MJ_BINARY(Div, a / b)
MJ_BINARY(Max, fm::max_nan(a, b))
MJ_BINARY(Rem, fm::rem(a, b))
#undef MJ_BINARY

// x where the mask m (0 or 1) holds, else the fill c; WhereNot: where it does not hold. The
// mask reads as float: in a double graph m and x differ in type (scalar path only).
struct Where {
  double c;
  template <class M, class T>
  MJ_INLINE T operator()(M m, T x) const {
    return m != lane_t<M>(0) ? x : splat<T>(lane_t<T>(c));
  }
};
struct WhereNot {
  double c;
  template <class M, class T>
  MJ_INLINE T operator()(M m, T x) const {
    return m == lane_t<M>(0) ? x : splat<T>(lane_t<T>(c));
  }
};

// Element type conversion. Fused loops containing a cast run their scalar path (ScalarOnly).
template <class To>
struct Cast {
  template <class T>
  MJ_INLINE auto operator()(T x) const {
    if constexpr (std::is_same_v<lane_t<T>, To>) return x;  // a half type's value, in float
    else return static_cast<To>(x);
  }
};

// A cast to a half-precision type H where values are computed in float: x rounded to H and
// kept in float (a double is rounded to float first: one more rounding, at double's ties).
// Float vectors round in registers: bf16 by integer arithmetic on the bits (to nearest even,
// NaN kept quiet, as bf16::round), f16 by a conversion there and back (F16C where present).
template <class H>
struct Round {
  template <class T>
  MJ_INLINE T operator()(T x) const {
    if constexpr (std::is_same_v<T, vf32> && std::is_same_v<H, bf16>) {
      const vu32 u = reinterpret_cast<vu32>(x);
      const vu32 nearest = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
      const vu32 quiet = (u | 0x00400000u) & 0xffff0000u;
      const vu32 nan = reinterpret_cast<vu32>((u & 0x7fffffffu) > 0x7f800000u);
      return reinterpret_cast<vf32>((nan & quiet) | (~nan & nearest));
    } else if constexpr (std::is_same_v<T, vf32> && std::is_same_v<H, f16>) {
      return __builtin_convertvector(__builtin_convertvector(x, vf16_half), vf32);
    } else {
      return fm::lanewise(x, [](auto v) {
        return static_cast<decltype(v)>(static_cast<float>(H(static_cast<float>(v))));
      });
    }
  }
};

}  // namespace op

// Wraps a fused functor that must only see scalars (it changes the element type inside).
template <class F>
struct ScalarOnly {
  F f;
  template <class... T>
  MJ_INLINE auto operator()(T... x) const { return f(x...); }
};
template <class F>
ScalarOnly(F) -> ScalarOnly<F>;

template <class F>
struct is_scalar_only : std::false_type {};
template <class F>
struct is_scalar_only<ScalarOnly<F>> : std::true_type {};

}  // namespace mj
