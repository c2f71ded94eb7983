// The scalar meaning of every elementwise op and reduction, shared by block-level tiles,
// thread graphs and kernel-level kernels. C is the compute type (float or double); `s` is the
// op's float attribute (scalar / exponent), ignored by ops without one.
#pragma once

#include "cuda/platform.cuh"

namespace mj::op {

#define MJ_UNARY(Name, expr)                 \
  struct Name {                              \
    template <class C>                       \
    MJ_HD static C f(C x, C s) {             \
      (void)s;                               \
      return (expr);                         \
    }                                        \
  };

MJ_UNARY(Identity, x)
MJ_UNARY(Exp, m_exp(x))
MJ_UNARY(Log, m_log(x))
MJ_UNARY(Square, x* x)
MJ_UNARY(Sqrt, m_sqrt(x))
MJ_UNARY(Rsqrt, C(1) / m_sqrt(x))
MJ_UNARY(Sigmoid, C(1) / (C(1) + m_exp(-x)))
MJ_UNARY(Silu, x / (C(1) + m_exp(-x)))
// tanh approximation, as jax.nn.gelu(approximate=True)
MJ_UNARY(Gelu, C(0.5) * x * (C(1) + m_tanh(C(0.7978845608028654) * (x + C(0.044715) * x * x * x))))
MJ_UNARY(Tanh, m_tanh(x))
MJ_UNARY(Erf, m_erf(x))
MJ_UNARY(Erfc, m_erfc(x))
MJ_UNARY(ErfInv, m_erfinv(x))
MJ_UNARY(Sin, m_sin(x))
MJ_UNARY(Cos, m_cos(x))
MJ_UNARY(Sign, (x > C(0) ? C(1) : (x < C(0) ? C(-1) : x)))
MJ_UNARY(Relu, (x != x ? x : (x > C(0) ? x : C(0))))
MJ_UNARY(Neg, -x)
MJ_UNARY(Reciprocal, C(1) / x)
MJ_UNARY(MulScalar, x* s)
MJ_UNARY(AddScalar, x + s)
MJ_UNARY(PowScalar, m_pow(x, s))
// x where finite, else the fill s: x - x is exactly 0 for finite x, NaN otherwise
MJ_UNARY(FiniteOr, (x - x == C(0) ? x : s))
#undef MJ_UNARY

// A cast to T whose result is kept in a wider tile type: round to T, keep the wider type.
template <class T>
struct RoundTo {
  template <class C>
  MJ_HD static C f(C x, C) {
    return cvt<C>(cvt<T>(x));
  }
};

// `s` as for the unary ops: where's fill, ignored by the others.
#define MJ_BINARY(Name, expr)            \
  struct Name {                          \
    template <class C>                   \
    MJ_HD static C f(C a, C b, C s) {    \
      (void)s;                           \
      return (expr);                     \
    }                                    \
  };

MJ_BINARY(Add, a + b)
MJ_BINARY(Sub, a - b)
MJ_BINARY(Mul, a* b)
MJ_BINARY(Div, a / b)
MJ_BINARY(Max, m_max(a, b))
MJ_BINARY(Rem, m_rem(a, b))
// a: the mask (0 or 1), b: the value
MJ_BINARY(Where, a != C(0) ? b : s)
MJ_BINARY(WhereNot, a == C(0) ? b : s)
#undef MJ_BINARY

}  // namespace mj::op

namespace mj {

// Reductions: init, map each element, combine, finish with the reduced element count n.
struct RSum {
  template <class C> MJ_HD static C init() { return C(0); }
  template <class C> MJ_HD static C map(C x) { return x; }
  template <class C> MJ_HD static C combine(C a, C b) { return a + b; }
  template <class C> MJ_HD static C finish(C a, int) { return a; }
};
struct RMax {
  template <class C> MJ_HD static C init() { return neg_inf<C>(); }
  template <class C> MJ_HD static C map(C x) { return x; }
  template <class C> MJ_HD static C combine(C a, C b) { return m_max(a, b); }
  template <class C> MJ_HD static C finish(C a, int) { return a; }
};
struct RMean {
  template <class C> MJ_HD static C init() { return C(0); }
  template <class C> MJ_HD static C map(C x) { return x; }
  template <class C> MJ_HD static C combine(C a, C b) { return a + b; }
  template <class C> MJ_HD static C finish(C a, int n) { return a / C(n); }
};
struct RRms {
  template <class C> MJ_HD static C init() { return C(0); }
  template <class C> MJ_HD static C map(C x) { return x * x; }
  template <class C> MJ_HD static C combine(C a, C b) { return a + b; }
  template <class C> MJ_HD static C finish(C a, int n) { return m_sqrt(a / C(n)); }
};

}  // namespace mj
