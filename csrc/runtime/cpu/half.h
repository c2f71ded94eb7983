// half.h - kernel-level folds and products over half-precision tensors.
//
// Elementwise loops, copies, concat and transpose read and write bf16 / f16 elements directly
// (elementwise.h widens each element as it is read), and so do matmuls (in registers:
// matmul.h). Reductions fold in one element type, so a half-precision operand is widened once
// into an aligned float buffer; a half-precision result of either is computed in float and
// rounded as it is copied out. Block-level code never needs this: its tiles of
// half-precision values are float, loaded and stored with the conversion (tile.h).
#pragma once

#include <new>

#include "cpu/elementwise.h"

namespace mj {

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

// f(x') with x' the tensor x in its compute type: x itself, or a float copy of it.
template <class X, class F>
inline void with_wide_input(const mj_pool* pool, const X& x, const F& f) {
  if constexpr (is_half<value_of<X>>) {
    Owned<compute_t<value_of<X>>, shape_of<X>> buf;
    const auto wide = buf.view();
    copy(pool, wide, x);
    f(wide);
  } else {
    f(x);
  }
}

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
