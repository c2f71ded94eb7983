// half.h - widening half-precision elements in registers, and kernel-level results in them.
//
// Elementwise loops, copies, concat and transpose read and write bf16 / f16 elements directly
// (elementwise.h widens each element as it is read); matmuls and reductions widen a vector at
// a time as they read (load_wide). A half-precision result of a reduction is computed in float
// and rounded as it is copied out (with_wide_output: reduction results are small); a matmul
// rounds each task's block from a float tile in cache (matmul.h). Block-level tiles of
// half-precision values are float, loaded and stored with the conversion (tile.h), but for a
// matmul operand rounded to its type (ir/precision.py), which a block holds in that type.
#pragma once

#include <cstring>
#include <new>

#include "cpu/elementwise.h"

namespace mj {

// One vector of V's lanes read from elements of type U, widened to V's lane type in
// registers: bf16 is the high half of a float (a shift), f16 converts (F16C where present).
template <class V, class U>
MJ_INLINE V load_wide(const U* p) {
  if constexpr (std::is_same_v<U, lane_t<V>>) {
    return vload<V>(p);
  } else {
    static_assert(std::is_same_v<V, vf32> && sizeof(U) == 2, "widens half to float");
    if constexpr (std::is_same_v<U, bf16>) {
      vu16_half h;
      std::memcpy(&h, p, sizeof(h));
      return reinterpret_cast<vf32>(__builtin_convertvector(h, vu32) << 16);
    } else {
      vf16_half h;
      std::memcpy(&h, p, sizeof(h));
      return __builtin_convertvector(h, vf32);
    }
  }
}

// An aligned, owned buffer holding a tensor of shape Sh in element type T.
template <class T, class Sh>
class Owned {
 public:
  Owned() : data_(static_cast<T*>(::operator new(sizeof(T) * Sh::size, std::align_val_t(kAlign)))) {}
  ~Owned() { ::operator delete(data_, std::align_val_t(kAlign)); }
  Owned(const Owned&) = delete;
  Owned& operator=(const Owned&) = delete;
  View<T, Sh> view() const { return View<T, Sh>(data_); }

 private:
  T* data_;
};

template <class... X>
inline constexpr bool any_half = (is_half<value_of<X>> || ...);

namespace k {

// f(o') where o' is out in its compute type; a float o' is rounded into out afterwards.
template <class Out, class F>
inline void with_wide_output(const mj_pool* pool, Out& out, const F& f) {
  if constexpr (is_half<value_of<Out>>) {
    Owned<compute_t<value_of<Out>>, shape_of<Out>> buf;
    const auto wide = buf.view();
    f(wide);
    copy(pool, out, wide);
  } else {
    f(out);
  }
}

}  // namespace k
}  // namespace mj
