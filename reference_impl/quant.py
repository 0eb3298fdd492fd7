"""KV-cache quantization methods the FP4 codecs are compared with (accuracy benchmark).

Every method is an encode/decode round trip over vectors along the last axis
(``head_dim``) plus its storage cost. Per-tensor statistics (the FP8 scale, the NVFP4
global scale) are taken over the whole array handed in: a static calibration.

* ``bf16``: the cache holds BF16 (RNE from FP32).
* ``fp8_e4m3_tensor``: spec 4.3 / readings "FP8 caches": ``q = E4M3(clip(x / s, +-448))``,
  RNE, one FP32 scale per tensor ``s = amax / 448``; decode ``q * s``.
* ``int8_g8`` / ``int4_g8``: symmetric group quantization after seed 001
  (ppl.nn ``quant_group`` 8, F16 scale per group): ``s = F16(max(amax / qmax, 1e-5))``,
  ``q = clip(RNE(x / s), -qmax, qmax)`` with qmax 127 / 7; decode ``q * s``.
* ``int8_token`` / ``int4_token``: asymmetric per-token, per-head quantization after
  seed 002 (TurboMind ``(scale, zero)`` stored in the model dtype, BF16 here):
  ``zero = BF16(min)``, ``scale = BF16((max - min) / (2**bits - 1))``,
  ``q = clip(RNE((x - zero) / scale), 0, 2**bits - 1)``; decode ``q * scale + zero``.
* ``mxfp4_16``, ``mxfp4_32_ocp``, ``nvfp4``: :mod:`.fp4` (NVFP4 with the per-tensor
  global scale ``amax / (6 * 448)``).

Storage cost is counted per value, scales included: per-block and per-token scales
are shared by their values; a per-tensor FP32 scale is amortized to zero.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import ml_dtypes
import numpy as np

from ..abi.header import DType
from . import fp4
from .convert import quantize as _fp8_quantize

__all__ = [
    "QuantMethod",
    "METHODS",
    "method",
    "bf16_roundtrip",
    "fp8_e4m3_tensor_scale",
    "fp8_e4m3_encode",
    "fp8_e4m3_decode",
    "int_group_encode",
    "int_group_decode",
    "int_token_encode",
    "int_token_decode",
]

_F32 = np.float32
_BF16 = np.dtype(ml_dtypes.bfloat16)
_E4M3 = np.dtype(ml_dtypes.float8_e4m3fn)
E4M3_MAX = 448.0
INT_GROUP = 8
INT_GROUP_EPS = 1e-5


def _f32(x: np.ndarray) -> np.ndarray:
    return np.asarray(x).astype(_F32)


# ----------------------------------------------------------------------------- BF16 / FP8


def bf16_roundtrip(x: np.ndarray) -> np.ndarray:
    return _f32(x).astype(_BF16).astype(_F32)


def fp8_e4m3_tensor_scale(x: np.ndarray) -> np.float32:
    """Per-tensor decode scale ``amax / 448`` over finite values (1.0 when amax is 0)."""
    a = np.abs(_f32(x))
    amax = _F32(np.max(np.where(np.isfinite(a), a, _F32(0)), initial=_F32(0)))
    return _F32(amax / _F32(E4M3_MAX)) if amax > 0 else _F32(1.0)


def fp8_e4m3_encode(x: np.ndarray, scale: float) -> np.ndarray:
    """E4M3 bytes of ``x / scale``, RNE, saturating at +-448 (NaN stays NaN): the FP8
    cache write of the conformance oracle (``convert.quantize``, readings R-FP8)."""
    return _fp8_quantize(_f32(x), _F32(scale), DType.F8_E4M3).view(np.uint8)


def fp8_e4m3_decode(q: np.ndarray, scale: float) -> np.ndarray:
    return np.asarray(q, dtype=np.uint8).view(_E4M3).astype(_F32) * _F32(scale)


# ----------------------------------------------------------------------------- INT group (seed 001)


def _qmax(bits: int) -> int:
    if bits not in (4, 8):
        raise ValueError(f"integer KV quantization takes 4 or 8 bits, got {bits}")
    return (1 << (bits - 1)) - 1


def int_group_encode(x: np.ndarray, bits: int, group: int = INT_GROUP) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric group quantization: ``(q int8[..., D], scales float16[..., D // group])``."""
    qmax = _qmax(bits)
    x32 = _f32(x)
    d = x32.shape[-1]
    if d % group:
        raise ValueError(f"head_dim {d} is not a multiple of the group size {group}")
    xb = x32.reshape(x32.shape[:-1] + (d // group, group))
    amax = np.max(np.abs(xb), axis=-1)
    s = np.maximum(amax / _F32(qmax), _F32(INT_GROUP_EPS)).astype(np.float16)
    q = np.clip(np.rint(xb / s.astype(_F32)[..., None]), -qmax, qmax).astype(np.int8)
    return q.reshape(x32.shape), s


def int_group_decode(q: np.ndarray, scales: np.ndarray) -> np.ndarray:
    d = q.shape[-1]
    group = d // scales.shape[-1]
    qb = q.astype(_F32).reshape(q.shape[:-1] + (scales.shape[-1], group))
    return (qb * scales.astype(_F32)[..., None]).reshape(q.shape)


# ----------------------------------------------------------------------------- INT per token (seed 002)


def int_token_encode(x: np.ndarray, bits: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Asymmetric per-vector quantization: ``(q uint8[..., D], scale bf16[...], zero bf16[...])``."""
    _qmax(bits)
    levels = (1 << bits) - 1
    x32 = _f32(x)
    lo = np.min(x32, axis=-1)
    hi = np.max(x32, axis=-1)
    zero = lo.astype(_BF16)
    scale = ((hi - lo) / _F32(levels)).astype(_BF16)
    s32 = scale.astype(_F32)[..., None]
    with np.errstate(divide="ignore", invalid="ignore"):
        t = (x32 - zero.astype(_F32)[..., None]) / s32
    t = np.where(s32 > 0, t, _F32(0))
    q = np.clip(np.rint(t), 0, levels).astype(np.uint8)
    return q, scale, zero


def int_token_decode(q: np.ndarray, scale: np.ndarray, zero: np.ndarray) -> np.ndarray:
    return q.astype(_F32) * scale.astype(_F32)[..., None] + zero.astype(_F32)[..., None]


# ----------------------------------------------------------------------------- method table


@dataclass(frozen=True)
class QuantMethod:
    """One KV storage method: a round trip over ``[..., head_dim]`` and its cost."""

    name: str
    label: str
    roundtrip: Callable[[np.ndarray], np.ndarray]
    #: bytes of one K (or V) vector of ``head_dim`` values, scales included
    vector_bytes: Callable[[int], float]

    def bits_per_value(self, head_dim: int) -> float:
        return 8.0 * self.vector_bytes(head_dim) / head_dim

    def bytes_per_token(self, num_kv_heads: int, head_dim: int) -> float:
        """K and V of every KV head of one layer for one token."""
        return 2 * num_kv_heads * self.vector_bytes(head_dim)


def _fp8_roundtrip(x: np.ndarray) -> np.ndarray:
    s = fp8_e4m3_tensor_scale(x)
    return fp8_e4m3_decode(fp8_e4m3_encode(x, s), s)


def _int_group_roundtrip(bits: int) -> Callable[[np.ndarray], np.ndarray]:
    return lambda x: int_group_decode(*int_group_encode(x, bits))


def _int_token_roundtrip(bits: int) -> Callable[[np.ndarray], np.ndarray]:
    return lambda x: int_token_decode(*int_token_encode(x, bits))


def _nvfp4_roundtrip(x: np.ndarray) -> np.ndarray:
    g = fp4.nvfp4_global_scale(x)
    codes, scales = fp4.nvfp4_encode(x, g)
    return fp4.nvfp4_decode(codes, scales, g)


def _mxfp4_roundtrip(block: int, rule: fp4.MxRule) -> Callable[[np.ndarray], np.ndarray]:
    def run(x: np.ndarray) -> np.ndarray:
        codes, scales = fp4.mxfp4_encode(x, block, rule)
        return fp4.mxfp4_decode(codes, scales, block)

    return run


METHODS: tuple[QuantMethod, ...] = (
    QuantMethod("bf16", "BF16", bf16_roundtrip, lambda d: 2.0 * d),
    QuantMethod("fp8_e4m3_tensor", "FP8 E4M3 /tensor", _fp8_roundtrip, lambda d: 1.0 * d),
    QuantMethod("int8_g8", "INT8 g8 (seed 001)", _int_group_roundtrip(8), lambda d: d + 2.0 * d / INT_GROUP),
    QuantMethod("int4_g8", "INT4 g8 (seed 001)", _int_group_roundtrip(4), lambda d: d / 2 + 2.0 * d / INT_GROUP),
    QuantMethod("int8_token", "INT8 /token (seed 002)", _int_token_roundtrip(8), lambda d: d + 4.0),
    QuantMethod("int4_token", "INT4 /token (seed 002)", _int_token_roundtrip(4), lambda d: d / 2 + 4.0),
    QuantMethod("mxfp4_16", "MXFP4-16 ceil", _mxfp4_roundtrip(16, "ceil"), lambda d: d / 2 + d / 16),
    QuantMethod("mxfp4_32_ocp", "MXFP4-32 OCP", _mxfp4_roundtrip(32, "floor"), lambda d: d / 2 + d / 32),
    QuantMethod("nvfp4", "NVFP4", _nvfp4_roundtrip, lambda d: d / 2 + d / 16),
)


def method(name: str) -> QuantMethod:
    for m in METHODS:
        if m.name == name:
            return m
    raise KeyError(f"unknown KV quantization method {name!r}; known: {', '.join(m.name for m in METHODS)}")
