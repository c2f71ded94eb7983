// Compile-time row-major shapes and the index arithmetic on them.
//
// Every tile and every kernel-level tensor is a Shape<D0, D1, ...> known at compile time, so
// the divisions below fold into shifts and multiplies. Broadcasting follows the IR: operands
// have equal rank and each dim equals the output's or is 1.
#pragma once

#include "cuda/platform.cuh"

namespace mj {

template <int... D>
struct Shape {
  static_assert(sizeof...(D) >= 1, "rank-0 tensors are emitted as Shape<1>");
  static constexpr int rank = sizeof...(D);
  static constexpr long long size_ll = (1LL * ... * D);
  static_assert(size_ll < (1LL << 31), "tensors over 2^31 elements are not supported");
  static constexpr int size = static_cast<int>(size_ll);

  MJ_HD static constexpr int dim(int i) {
    constexpr int d[] = {D...};
    return d[i];
  }
  MJ_HD static constexpr int stride(int i) {
    int s = 1;
    for (int j = rank - 1; j > i; --j) s *= dim(j);
    return s;
  }
  MJ_HD static constexpr int last() { return dim(rank - 1); }
};

// Offset in `In` of the element at linear index `i` of `Out`, where `In` broadcasts to `Out`.
template <class Out, class In>
MJ_HD int bcast_offset(int i) {
  static_assert(Out::rank == In::rank, "broadcast operands have equal rank");
  if constexpr (std::is_same_v<Out, In>) {
    return i;
  } else {
    int off = 0;
#pragma unroll
    for (int d = Out::rank - 1; d >= 0; --d) {
      const int c = i % Out::dim(d);
      i /= Out::dim(d);
      if (In::dim(d) != 1) off += c * In::stride(d);
    }
    return off;
  }
}

// Offset in the row-major tensor `Global` of element `i` of a box of shape `Box` whose first
// element is at offset 0 (the caller adds the box origin).
template <class Box, class Global>
MJ_HD int box_offset(int i) {
  static_assert(Box::rank == Global::rank, "a box has the rank of its tensor");
  if constexpr (std::is_same_v<Box, Global>) {
    return i;
  } else {
    int off = 0;
#pragma unroll
    for (int d = Box::rank - 1; d >= 0; --d) {
      off += (i % Box::dim(d)) * Global::stride(d);
      i /= Box::dim(d);
    }
    return off;
  }
}

// A box's rows (all dims but the last) are contiguous runs of Box::last() elements; 16-byte
// vector copies need those runs, and their starts, to be multiples of 16 bytes.
template <class Box, class Global, class T>
inline constexpr bool vec16_ok =
    (Box::last() * static_cast<int>(sizeof(T))) % 16 == 0 &&
    (Global::last() * static_cast<int>(sizeof(T))) % 16 == 0;

}  // namespace mj
