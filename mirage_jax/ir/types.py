"""Tensor types: a dtype and a static shape, checked when built."""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass

import ml_dtypes
import numpy as np

from mirage_jax.errors import GraphError


class DType(enum.Enum):
    """Element types a μGraph tensor may have. The value is the canonical text name."""

    F16 = "f16"
    BF16 = "bf16"
    F32 = "f32"
    F64 = "f64"
    # a mask: the predicate operand of WHERE / WHERE_NOT only (a region input, never computed)
    BOOL = "bool"

    @property
    def itemsize(self) -> int:
        return {"f16": 2, "bf16": 2, "f32": 4, "f64": 8, "bool": 1}[self.value]

    @property
    def numpy(self) -> np.dtype:
        """The numpy dtype holding values of this type (bf16 via ml_dtypes, which jax ships)."""
        if self is DType.BF16:
            return np.dtype(ml_dtypes.bfloat16)
        return np.dtype({"f16": np.float16, "f32": np.float32, "f64": np.float64,
                         "bool": np.bool_}[self.value])  # fmt: skip

    @classmethod
    def from_numpy(cls, dtype: object) -> DType:
        """Map a numpy/jax dtype to a DType; raise GraphError naming it if unsupported."""
        name = np.dtype(dtype).name
        table = {"float16": cls.F16, "bfloat16": cls.BF16, "float32": cls.F32, "float64": cls.F64}
        if name not in table:
            raise GraphError(
                f"dtype {name} is not supported by μGraphs",
                remedy="use float16, bfloat16, float32 or float64 tensors in the optimized region",
            )
        return table[name]


F16, BF16, F32, F64, BOOL = DType.F16, DType.BF16, DType.F32, DType.F64, DType.BOOL


@dataclass(frozen=True)
class TensorType:
    """A tensor's static shape (row-major) and element type."""

    shape: tuple[int, ...]
    dtype: DType

    def __post_init__(self) -> None:
        shape = tuple(self.shape)
        if not all(isinstance(d, (int, np.integer)) and int(d) >= 1 for d in shape):
            raise GraphError(
                f"tensor shape {shape} must be a tuple of positive integers",
                remedy="μGraphs need static shapes with no zero-sized dimensions",
            )
        object.__setattr__(self, "shape", tuple(int(d) for d in shape))
        if not isinstance(self.dtype, DType):
            raise GraphError(f"tensor dtype {self.dtype!r} is not a DType")

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize

    def with_shape(self, shape: tuple[int, ...]) -> TensorType:
        return TensorType(tuple(shape), self.dtype)

    def __str__(self) -> str:
        return f"{self.dtype.value}[{','.join(map(str, self.shape))}]"
