// mirage.h - everything a generated CPU kernel includes (see mirage_jax/codegen/cpu.py).
//
//   core.h         shapes, tiles, views, SIMD vectors, the N-d iteration engine
//   math.h         one elementwise functor per IR op (vectorisable float32 exp/log/tanh/erf)
//   half.h         kernel-level folds and products over bf16 / f16 tensors (via float)
//   parallel.h     pool-based parallel for, kernel workspace, error guard
//   elementwise.h  map: fused, broadcasting elementwise loops (ops and thread graphs)
//   reduce.h       reductions over one dim, concat, slice, transpose
//   matmul.h       register-blocked tile and batched kernel-level matmul
//   tile.h         input_iter loads and output_saver stores
//   accum.h        for-loop accumulators
#pragma once

#include "cpu/abi.h"
#include "cpu/accum.h"
#include "cpu/core.h"
#include "cpu/elementwise.h"
#include "cpu/half.h"
#include "cpu/math.h"
#include "cpu/matmul.h"
#include "cpu/parallel.h"
#include "cpu/reduce.h"
#include "cpu/tile.h"
