"""numpy / ml_dtypes element types of the KVX dtypes (storage, not semantics)."""
from __future__ import annotations

import ml_dtypes
import numpy as np

from .header import DType

NUMPY_DTYPE: dict[DType, np.dtype] = {
    DType.F16: np.dtype(np.float16),
    DType.BF16: np.dtype(ml_dtypes.bfloat16),
    DType.F32: np.dtype(np.float32),
    DType.F8_E4M3: np.dtype(ml_dtypes.float8_e4m3fn),
    DType.F8_E5M2: np.dtype(ml_dtypes.float8_e5m2),
    DType.S32: np.dtype(np.int32),
    DType.S64: np.dtype(np.int64),
    DType.U32: np.dtype(np.uint32),
    DType.U64: np.dtype(np.uint64),
    DType.U8: np.dtype(np.uint8),
}

#: Short names of the cache and IO dtypes in test ids and case labels.
SHORT_NAMES = {DType.F16: "f16", DType.BF16: "bf16", DType.F32: "f32", DType.F8_E4M3: "e4m3", DType.F8_E5M2: "e5m2"}

#: Unsigned integer type of the same width, for bit-exact comparison and poisoning.
BITS_DTYPE = {1: np.dtype(np.uint8), 2: np.dtype(np.uint16), 4: np.dtype(np.uint32), 8: np.dtype(np.uint64)}


def np_dtype(dtype: DType) -> np.dtype:
    try:
        return NUMPY_DTYPE[DType(dtype)]
    except (KeyError, ValueError):
        raise ValueError(f"no numpy element type for KVX dtype {dtype!r}") from None


def bits_view(array: np.ndarray) -> np.ndarray:
    """The array's raw bits as unsigned integers (NaN payloads and -0 compare exactly)."""
    return array.view(BITS_DTYPE[array.dtype.itemsize])
