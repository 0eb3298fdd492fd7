"""Value conversions (docs/spec-readings.md R-CONVERT, R-FP8).

Values move through FP32: source -> FP32 is exact for every KVX float dtype, and
FP32 -> destination rounds to nearest, ties to even (numpy for F16, ml_dtypes for
BF16 and FP8), overflowing to inf for F16/BF16. FP8 destinations are reached only by
quantization: ``float32(x) / scale`` (an IEEE FP32 division), clamped to the format's
largest finite value (inf saturates, NaN stays NaN), then RNE. An FP8 IO dtype equal
to the FP8 cache dtype moves raw bytes; every other pairing with an FP8 side is
UNSUPPORTED in v1.1.
"""
from __future__ import annotations

import ml_dtypes
import numpy as np

from kvx_conformance.abi.dtypes import np_dtype
from kvx_conformance.abi.header import FP8_DTYPES, DType

FP8_MAX = {
    DType.F8_E4M3: np.float32(ml_dtypes.finfo(ml_dtypes.float8_e4m3fn).max),  # 448
    DType.F8_E5M2: np.float32(ml_dtypes.finfo(ml_dtypes.float8_e5m2).max),  # 57344
}


def is_fp8(dtype: DType) -> bool:
    return dtype in FP8_DTYPES


def supported(src: DType, dst: DType) -> bool:
    """Whether R-CONVERT defines a conversion from ``src`` values to ``dst`` storage.

    Write: src = IO dtype, dst = cache dtype. Gather: src = cache dtype, dst = IO dtype.
    """
    if src == dst:
        return True
    if is_fp8(src):
        return False  # FP8 IO into another cache dtype; FP8 cache into another IO dtype
    return True  # F16/BF16/F32 -> F16/BF16/F32 (RNE) or -> FP8 (quantize)


def to_f32(values: np.ndarray) -> np.ndarray:
    """Exact widening of F16/BF16/F32/FP8 values to FP32."""
    return values.astype(np.float32)


def round_f32(x32: np.ndarray, dst: DType) -> np.ndarray:
    """FP32 -> F16/BF16/F32 with round-to-nearest-even (IEEE overflow to inf)."""
    if is_fp8(dst):
        raise ValueError("FP8 storage is reached only through quantize()")
    with np.errstate(over="ignore"):
        return np.asarray(x32, np.float32).astype(np_dtype(dst))


def quantize(x32: np.ndarray, scale: np.ndarray | np.float32, dst: DType) -> np.ndarray:
    """R-FP8: ``clamp(float32(x) / scale, +-max)`` then RNE to ``dst`` (bits as ml_dtypes)."""
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        q = np.asarray(x32, np.float32) / np.asarray(scale, np.float32)
    m = FP8_MAX[dst]
    q = np.clip(q, -m, m)  # NaN passes through, +-inf saturate
    return q.astype(np_dtype(dst))


def convert(values: np.ndarray, src: DType, dst: DType, scale=None) -> np.ndarray:
    """Storage of ``dst`` holding ``values`` (storage of ``src``) per R-CONVERT / R-FP8.

    ``scale`` (FP32, broadcastable to ``values``) is used only when quantizing into FP8.
    Same-dtype moves copy the bits unchanged.
    """
    values = np.asarray(values)
    if src == dst:
        return values.copy()
    if not supported(src, dst):
        raise ValueError(f"R-CONVERT: no conversion from {src.name} to {dst.name} in v1.1")
    x32 = to_f32(values)
    if is_fp8(dst):
        return quantize(x32, np.float32(1.0) if scale is None else scale, dst)
    return round_f32(x32, dst)
