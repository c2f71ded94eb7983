// tile.h - moving a block's tiles between kernel tensors and local buffers.
//
// input_iter: the tile of a row-major tensor of shape Full that block b sees in iteration it,
// per imap (grid axis a splits tensor dim IMap::axis[a]) and FDim (the loop splits that dim of
// the tile), copied into a contiguous aligned Tile. output_saver: the inverse, per omap/FDim.
#pragma once

#include "cpu/elementwise.h"

// Loop iterations ahead whose tiles a loop-varying load prefetches.
#ifndef MJ_PREFETCH_AHEAD
#define MJ_PREFETCH_AHEAD 1
#endif

namespace mj {

// Element offset of the tile's first element in the full tensor.
template <class Full, class TileSh, class GMap, int FDim>
MJ_INLINE i64 tile_offset(const BlockIdx& b, i64 it) {
  i64 off = 0;
  for (int a = 0; a < 3; ++a) {
    const int d = GMap::axis[a];
    if (d >= 0) off += b[a] * TileSh::dims[d] * Full::stride(d);
  }
  if constexpr (FDim >= 0) off += it * TileSh::dims[FDim] * Full::stride(FDim);
  return off;
}

// Ask for every cache line of a region of a row-major tensor (into L2: the copy that follows
// one iteration later takes it from there, while this iteration computes).
template <class Region, class Full, class U>
MJ_INLINE void prefetch_region(const U* src) {
  using SpH = CopySpace<Region, Full, Full>;
  constexpr i64 line = 64 / sizeof(U);
  struct Row {
    MJ_INLINE void operator()(i64 j0, i64 j1, const U* p, const U*) const {
      constexpr i64 s = SpH::value.inner_s(0);
      if constexpr (s <= 1) {
        for (i64 j = j0; j < j1; j += line) __builtin_prefetch(p + j, 0, 2);
        __builtin_prefetch(p + j1 - 1, 0, 2);
      } else {
        for (i64 j = j0; j < j1; ++j) __builtin_prefetch(p + j * s, 0, 2);
      }
    }
  };
  nd_for<SpH, 0>(Row{}, src, src);
}

template <class Full, class IMap, int FDim, class T, class TSh, class U>
MJ_INLINE void load_tile(Tile<T, TSh>& tile, const U* src, const BlockIdx& b, i64 it) {
  copy_region<TSh, TSh, Full>(tile.data, src + tile_offset<Full, TSh, IMap, FDim>(b, it));
  if constexpr (FDim >= 0) {
    // The loop dim is not split by the grid, so it holds exactly Range parts.
    constexpr i64 range = Full::dims[FDim] / TSh::dims[FDim];
    constexpr i64 ahead = MJ_PREFETCH_AHEAD;
    if (it == 0)
      for (i64 k = 1; k < ahead && k < range; ++k)
        prefetch_region<TSh, Full>(src + tile_offset<Full, TSh, IMap, FDim>(b, k));
    if (it + ahead < range)
      prefetch_region<TSh, Full>(src + tile_offset<Full, TSh, IMap, FDim>(b, it + ahead));
  }
}

// The same tile without a copy (see TileRef). Its reader prefetches the next iteration's tile
// as it goes (TileRef::next), instead of one burst of prefetches per iteration that stalls
// the core until the memory system takes them.
template <class Full, class TSh, int FDim>
inline constexpr i64 next_tile =
    FDim >= 0 ? TSh::dims[FDim < 0 ? 0 : FDim] * Full::stride(FDim < 0 ? 0 : FDim) : 0;

template <class Full, class IMap, int FDim, class TSh, class U>
MJ_INLINE TileRef<U, TSh, Full, next_tile<Full, TSh, FDim>> tile_ref(const U* src,
                                                                     const BlockIdx& b, i64 it) {
  return {src + tile_offset<Full, TSh, IMap, FDim>(b, it)};
}

// A tile that is one contiguous run of its tensor (size-1 dims, then one split dim, then
// whole dims) is already a dense row-major array: a view of it replaces the copy.
template <class Full, class IMap, int FDim, class TSh, class U>
MJ_INLINE View<U, TSh> tile_view(U* base, const BlockIdx& b, i64 it) {
  return View<U, TSh>(base + tile_offset<Full, TSh, IMap, FDim>(b, it));
}

// T may be a half-precision type of a float tile: copy_region rounds each element.
template <class Full, class OMap, int FDim, class T, class U, class TSh>
MJ_INLINE void store_tile(T* dst, const Tile<U, TSh>& tile, const BlockIdx& b, i64 it) {
  copy_region<TSh, Full, TSh>(dst + tile_offset<Full, TSh, OMap, FDim>(b, it), tile.data);
}

// A block graph may save an input tile as it is; the emitter reads such a tile where it lies,
// as a view of a dense run of its tensor or as a TileRef with its tensor's strides.
template <class Full, class OMap, int FDim, class T, class U, class TSh>
MJ_INLINE void store_tile(T* dst, const View<U, TSh>& tile, const BlockIdx& b, i64 it) {
  copy_region<TSh, Full, TSh>(dst + tile_offset<Full, TSh, OMap, FDim>(b, it), tile.data);
}
template <class Full, class OMap, int FDim, class T, class U, class TSh, class Src, i64 Next>
MJ_INLINE void store_tile(T* dst, const TileRef<U, TSh, Src, Next>& tile, const BlockIdx& b,
                          i64 it) {
  copy_region<TSh, Full, Src>(dst + tile_offset<Full, TSh, OMap, FDim>(b, it), tile.data);
}

}  // namespace mj
