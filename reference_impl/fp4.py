"""FP4 KV-cache codecs of the optional "fp4" profile (KVX 1.2): NVFP4 and MXFP4.

The numerics are pinned by docs/spec-readings.md ("FP4 extension") and spelled out
step by step in docs/fp4.md. Every rounding step here is a named IEEE operation in
FP32 (numpy float32 arithmetic is correctly rounded); the narrow casts (E2M1, E4M3,
E8M0) are ml_dtypes casts, which round to nearest, ties to even.

Layout (last axis is ``head_dim``, every leading axis is kept as is):

* codes: ``uint8[..., head_dim // 2]``, element ``2i`` in the low nibble and
  ``2i + 1`` in the high nibble; a nibble is an E2M1 code (sign bit 3, magnitude
  index 0..7 for 0, 0.5, 1, 1.5, 2, 3, 4, 6).
* scales: ``uint8[..., head_dim // block]``, one byte per block of ``block``
  consecutive values along ``head_dim``: an E4M3 value (NVFP4) or an E8M0
  exponent byte with bias 127 (MXFP4).

Special values (informational in the readings; what this oracle produces):

* A block whose scale is zero (all-zero block, or NVFP4 block whose scale
  underflows E4M3) stores codes 0 everywhere and decodes to +0.
* A block containing a NaN stores the scale format's NaN byte (0x7F for E4M3,
  0xFF for E8M0) and codes 0; it decodes to NaN everywhere. Other blocks are
  untouched.
* +-Inf in a block saturates: the NVFP4 block scale becomes 448, the MXFP4
  exponent becomes 127, and the Inf element gets code +-6. Decoding such an MXFP4
  block overflows FP32 for the Inf element (+-inf) and flushes its finite neighbours
  to 0; NVFP4 decodes it to the finite value +-6 * 448 * g.
* -0 and negative values that round to zero keep their sign: code 8 (-0), except in
  zero-scale blocks (codes 0).
"""
from __future__ import annotations

from typing import Literal

import ml_dtypes
import numpy as np

__all__ = [
    "E2M1_MAX",
    "E4M3_MAX",
    "E4M3_NAN_BYTE",
    "E8M0_BIAS",
    "E8M0_NAN_BYTE",
    "NVFP4_BLOCK",
    "MXFP4_KV_BLOCK",
    "OCP_MXFP4_BLOCK",
    "E2M1_MAGNITUDES",
    "float_to_e2m1",
    "e2m1_to_float",
    "pack_e2m1",
    "unpack_e2m1",
    "nvfp4_global_scale",
    "nvfp4_encode",
    "nvfp4_decode",
    "mxfp4_exponents",
    "mxfp4_encode",
    "mxfp4_decode",
]

E2M1_MAX = 6.0
E4M3_MAX = 448.0
E4M3_NAN_BYTE = 0x7F
E8M0_BIAS = 127
E8M0_NAN_BYTE = 0xFF
NVFP4_BLOCK = 16
MXFP4_KV_BLOCK = 16
OCP_MXFP4_BLOCK = 32
#: Magnitude of E2M1 code ``c`` (``c & 7``); bit 3 is the sign.
E2M1_MAGNITUDES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)

_F32 = np.float32
_E2M1 = np.dtype(ml_dtypes.float4_e2m1fn)
_E4M3 = np.dtype(ml_dtypes.float8_e4m3fn)
_E8M0 = np.dtype(ml_dtypes.float8_e8m0fnu)
_FLOAT_INPUTS = (np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16), np.dtype(np.float32), np.dtype(np.float64))

MxRule = Literal["ceil", "floor"]


# ----------------------------------------------------------------------------- E2M1


def float_to_e2m1(q: np.ndarray) -> np.ndarray:
    """E2M1 codes (uint8, 0..15) of FP32 values: RNE, saturating at +-6.

    NaN is not representable; callers mask NaN blocks themselves.
    """
    q = np.clip(np.asarray(q, dtype=_F32), -E2M1_MAX, E2M1_MAX)
    return q.astype(_E2M1).view(np.uint8) & np.uint8(0x0F)


def e2m1_to_float(codes: np.ndarray) -> np.ndarray:
    """FP32 values of E2M1 codes (only the low nibble of each byte is read)."""
    codes = np.asarray(codes, dtype=np.uint8) & np.uint8(0x0F)
    return codes.view(_E2M1).astype(_F32)


def pack_e2m1(codes: np.ndarray) -> np.ndarray:
    """Pack codes ``[..., n]`` (n even) into bytes ``[..., n // 2]``: element 2i low nibble."""
    codes = np.asarray(codes, dtype=np.uint8)
    if codes.ndim == 0 or codes.shape[-1] % 2:
        raise ValueError(f"pack_e2m1 needs an even last axis, got shape {codes.shape}")
    lo = codes[..., 0::2] & np.uint8(0x0F)
    hi = codes[..., 1::2] & np.uint8(0x0F)
    return lo | (hi << np.uint8(4))


def unpack_e2m1(packed: np.ndarray) -> np.ndarray:
    """Inverse of :func:`pack_e2m1`: bytes ``[..., m]`` to codes ``[..., 2m]``."""
    packed = np.asarray(packed)
    if packed.dtype != np.uint8:
        raise TypeError(f"packed E2M1 codes must be uint8, got {packed.dtype}")
    if packed.ndim == 0:
        raise ValueError("packed E2M1 codes need at least one axis")
    out = np.empty(packed.shape[:-1] + (2 * packed.shape[-1],), dtype=np.uint8)
    out[..., 0::2] = packed & np.uint8(0x0F)
    out[..., 1::2] = packed >> np.uint8(4)
    return out


# ----------------------------------------------------------------------------- helpers


def _to_f32(x: np.ndarray) -> np.ndarray:
    """The input as FP32 (F16/BF16/F32 exactly; F64 rounded once, RNE)."""
    a = np.asarray(x)
    if a.dtype not in _FLOAT_INPUTS:
        raise TypeError(f"FP4 encode takes float16, bfloat16, float32 or float64 input, got {a.dtype}")
    return a.astype(_F32)


def _blocked(x32: np.ndarray, block: int) -> np.ndarray:
    if x32.ndim == 0:
        raise ValueError("FP4 encode needs at least one axis (head_dim last)")
    d = x32.shape[-1]
    if d == 0 or d % block:
        raise ValueError(f"head_dim {d} is not a positive multiple of the block size {block}")
    return x32.reshape(x32.shape[:-1] + (d // block, block))


def _global_scale(global_scale: float | np.ndarray | None, lead_shape: tuple[int, ...]) -> np.ndarray:
    """g as FP32 broadcast to ``lead_shape + (1, 1)`` (one per vector, per block axis)."""
    if global_scale is None:
        g = np.ones((), dtype=_F32)
    else:
        g = np.asarray(global_scale, dtype=_F32)
        if not np.all(np.isfinite(g)) or np.any(g <= 0):
            raise ValueError("NVFP4 global scale must be finite and > 0")
    try:
        g = np.broadcast_to(g, lead_shape)
    except ValueError:
        raise ValueError(
            f"NVFP4 global scale of shape {g.shape} does not broadcast to the leading axes {lead_shape}"
        ) from None
    return g[..., None, None]


def _out_dtype(out_dtype) -> np.dtype:
    dt = np.dtype(out_dtype)
    if dt not in (np.dtype(np.float32), np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16)):
        raise TypeError(f"FP4 decode writes float32, float16 or bfloat16, not {dt}")
    return dt


def _check_pair(codes: np.ndarray, scales: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
    codes = np.asarray(codes)
    scales = np.asarray(scales)
    if codes.dtype != np.uint8 or scales.dtype != np.uint8:
        raise TypeError(f"codes and scales must be uint8, got {codes.dtype} and {scales.dtype}")
    if codes.ndim == 0 or codes.shape[:-1] != scales.shape[:-1] or scales.shape[-1] == 0:
        raise ValueError(f"codes {codes.shape} and scales {scales.shape} differ in their leading axes")
    d = 2 * codes.shape[-1]
    if d % scales.shape[-1]:
        raise ValueError(f"head_dim {d} is not a multiple of {scales.shape[-1]} scale blocks")
    return codes, scales, d // scales.shape[-1]


# ----------------------------------------------------------------------------- NVFP4


def nvfp4_global_scale(x: np.ndarray, reduce_axes: int | tuple[int, ...] | None = None) -> np.ndarray:
    """Static decode-direction global scale ``g = amax / (6 * 448)`` in FP32.

    ``amax`` is the largest finite magnitude over ``reduce_axes`` (all axes by
    default: per tensor). Where it is 0 (nothing finite and non-zero), g is 1.0.
    """
    a = np.abs(_to_f32(x))
    a = np.where(np.isfinite(a), a, _F32(0))
    amax = np.max(a, axis=reduce_axes).astype(_F32)
    g = amax / _F32(E2M1_MAX * E4M3_MAX)
    return np.where(amax > 0, g, _F32(1.0)).astype(_F32)


def nvfp4_encode(x: np.ndarray, global_scale: float | np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """NVFP4: E2M1 codes with one E4M3 scale per 16 values and an FP32 global scale g.

    ``global_scale`` is a scalar or an array broadcasting to ``x.shape[:-1]``
    (e.g. per head); None means 1.0. Returns ``(codes_packed, scales)`` as uint8.
    Steps, all FP32: ``s = E4M3(min(amax / (6 * g), 448))``, ``d = float(s) * g``,
    ``code = E2M1(clip(x / d, -6, 6))``.
    """
    x32 = _to_f32(x)
    xb = _blocked(x32, NVFP4_BLOCK)
    g = _global_scale(global_scale, x32.shape[:-1])[..., 0]  # (..., 1): one per vector
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        amax = np.max(np.abs(xb), axis=-1)  # NaN propagates
        wanted = amax / (_F32(E2M1_MAX) * g)
        s8 = np.minimum(wanted, _F32(E4M3_MAX)).astype(_E4M3)  # NaN -> 0x7F
        denom = s8.astype(_F32) * g
        q = xb / denom[..., None]
    nan_block = np.isnan(amax)
    dead_block = nan_block | (denom == 0)  # all-zero block, or scale underflow
    codes = float_to_e2m1(np.where(dead_block[..., None], _F32(0), q))
    scales = s8.view(np.uint8).copy()
    scales[nan_block] = E4M3_NAN_BYTE
    return pack_e2m1(codes.reshape(x32.shape)), scales


def nvfp4_decode(
    codes: np.ndarray,
    scales: np.ndarray,
    global_scale: float | np.ndarray | None = None,
    out_dtype=np.float32,
) -> np.ndarray:
    """``(E2M1(code) * float(s)) * g`` in FP32, rounded once to ``out_dtype``."""
    codes, scales, block = _check_pair(codes, scales)
    if block != NVFP4_BLOCK:
        raise ValueError(f"NVFP4 uses one scale per {NVFP4_BLOCK} values, these arrays imply {block}")
    dt = _out_dtype(out_dtype)
    vals = e2m1_to_float(unpack_e2m1(codes))
    vb = vals.reshape(scales.shape + (NVFP4_BLOCK,))
    g = _global_scale(global_scale, codes.shape[:-1])
    s = scales.view(_E4M3).astype(_F32)[..., None]
    with np.errstate(invalid="ignore", over="ignore"):
        out = (vb * s) * g
    return out.reshape(vals.shape).astype(dt)


# ----------------------------------------------------------------------------- MXFP4


def mxfp4_exponents(amax: np.ndarray, rule: MxRule = "ceil") -> np.ndarray:
    """Shared exponent e (int32, clamped to [-127, 127]) of blocks with the given amax.

    ``ceil``:  e = ceil(log2(fp32(amax / 6)))   (seed 002 KV rule)
    ``floor``: e = floor(log2(amax)) - 2         (OCP MX rule)
    Computed exactly from the binary exponent (no log approximation). Zero, NaN and
    Inf amax are the callers' business (their e is meaningless here).
    """
    amax = np.asarray(amax, dtype=_F32)
    if rule == "ceil":
        with np.errstate(invalid="ignore", over="ignore"):
            v = amax / _F32(E2M1_MAX)
        m, ex = np.frexp(v)  # v = m * 2**ex, m in [0.5, 1)
        e = ex - (m == _F32(0.5))
    elif rule == "floor":
        m, ex = np.frexp(amax)
        e = (ex - 1) - 2
    else:
        raise ValueError(f"MXFP4 exponent rule must be 'ceil' or 'floor', got {rule!r}")
    return np.clip(e.astype(np.int32), -E8M0_BIAS, E8M0_BIAS)


def mxfp4_encode(x: np.ndarray, block: int = MXFP4_KV_BLOCK, rule: MxRule = "ceil") -> tuple[np.ndarray, np.ndarray]:
    """MXFP4: E2M1 codes with one E8M0 exponent byte per ``block`` values.

    KV variant (seed 002): ``block=16, rule="ceil"``; OCP: ``block=32, rule="floor"``.
    Codes are ``E2M1(clip(x / 2**e, -6, 6))``; the byte is ``e + 127``; an all-zero
    block stores byte 0 and codes 0.
    """
    if block not in (MXFP4_KV_BLOCK, OCP_MXFP4_BLOCK):
        raise ValueError(f"MXFP4 block must be {MXFP4_KV_BLOCK} or {OCP_MXFP4_BLOCK}, got {block}")
    x32 = _to_f32(x)
    xb = _blocked(x32, block)
    with np.errstate(invalid="ignore"):
        amax = np.max(np.abs(xb), axis=-1)
    nan_block = np.isnan(amax)
    zero_block = amax == 0
    e = mxfp4_exponents(amax, rule)
    e = np.where(np.isinf(amax), E8M0_BIAS, e)
    scale = np.ldexp(_F32(1), e).astype(_F32)  # exact: 2**-127 is an FP32 subnormal
    with np.errstate(invalid="ignore", over="ignore"):
        q = xb / scale[..., None]
    dead = nan_block | zero_block
    codes = float_to_e2m1(np.where(dead[..., None], _F32(0), q))
    scales = scale.astype(_E8M0).view(np.uint8).copy()
    scales[zero_block] = 0
    scales[nan_block] = E8M0_NAN_BYTE
    return pack_e2m1(codes.reshape(x32.shape)), scales


def mxfp4_decode(
    codes: np.ndarray,
    scales: np.ndarray,
    block: int | None = None,
    out_dtype=np.float32,
) -> np.ndarray:
    """``E2M1(code) * 2**(byte - 127)`` in FP32 (byte 0xFF is NaN), rounded once to ``out_dtype``.

    ``block`` is implied by the shapes; when given it is checked against them.
    """
    codes, scales, implied = _check_pair(codes, scales)
    if block is not None and block != implied:
        raise ValueError(f"block {block} given, but codes {codes.shape} and scales {scales.shape} imply {implied}")
    if implied not in (MXFP4_KV_BLOCK, OCP_MXFP4_BLOCK):
        raise ValueError(f"MXFP4 block must be {MXFP4_KV_BLOCK} or {OCP_MXFP4_BLOCK}, these arrays imply {implied}")
    dt = _out_dtype(out_dtype)
    vals = e2m1_to_float(unpack_e2m1(codes))
    vb = vals.reshape(scales.shape + (implied,))
    s = scales.view(_E8M0).astype(_F32)[..., None]
    with np.errstate(invalid="ignore", over="ignore"):
        out = vb * s
    return out.reshape(vals.shape).astype(dt)
