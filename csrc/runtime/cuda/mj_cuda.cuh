// mirage_jax CUDA runtime: the one header generated CUDA includes.
//
// Header-only templates instantiated by mirage_jax/codegen/cuda.py:
//   platform.cuh  CUDA / host-emulation switch, dtype conversion, math, launch macros
//   layout.cuh    compile-time row-major shapes, broadcast and box indexing
//   ops.cuh       scalar meaning of elementwise ops and reductions
//   tile.cuh      block level: tile loads (cp.async) / stores, elementwise, reductions,
//                 concat, accumulators, online softmax
//   mma.cuh       block matmul: tensor cores (mma.sync) or FMA, register accumulators
//   kernels.cuh   kernel level: standalone elementwise / reduce / concat / transpose / matmul
#pragma once

#include "cuda/platform.cuh"
#include "cuda/layout.cuh"
#include "cuda/ops.cuh"
#include "cuda/tile.cuh"
#include "cuda/mma.cuh"
#include "cuda/kernels.cuh"
