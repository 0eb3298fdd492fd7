"""Profiles of the features a generator may use, and the random contents of tensors."""
from __future__ import annotations

import contextlib
import contextvars
from dataclasses import dataclass
from typing import Iterator

import numpy as np

from ...abi.dtypes import BITS_DTYPE, np_dtype
from ...abi.header import BASELINE_DTYPES, CACHE_DTYPES, FP8_DTYPES, DType, TableFormat


#: Every byte of a gather output starts as this (finite in F16, BF16, F32, E4M3 and E5M2).
POISON_BYTE = 0x5A

PACKS = (1, 2, 4, 8, 16)
LAYOUT_KINDS = ("nhd", "hnd", "hnd_packed", "custom", "nhd_padded", "hnd_padded", "vllm_v", "permuted")
IO_KINDS = ("dense", "padded", "permuted")
VALUE_MODES = ("bits", "normal", "ties")

NULL_INDEX = 0xFFFFFFFF
SECONDARY_BIT = 0x80000000
INT32_MIN, INT32_MAX = -(1 << 31), (1 << 31) - 1


def _pick(rng: np.random.Generator, seq):
    return seq[int(rng.integers(len(seq)))]


@dataclass(frozen=True)
class Profile:
    """Which features unconstrained generator choices draw from."""

    layout_kinds: tuple[str, ...] = LAYOUT_KINDS
    io_kinds: tuple[str, ...] = IO_KINDS
    four_d: bool = True  # 4-D gather outputs
    cache_dtypes: tuple[DType, ...] = CACHE_DTYPES
    formats: tuple[TableFormat, ...] = (TableFormat.PACKED, TableFormat.RAGGED, TableFormat.KV_OFFSETS)
    scales: tuple[str, ...] = ("none", "tensor_ptr", "per_tensor", "per_head", "both")
    mixed_kv: bool = True  # K and V of different layouts, strides or dtypes (feature mixed_layouts)
    mixed_io: bool = True  # IO dtype different from the cache dtype (feature mixed_io_dtype)
    noncanonical: bool = True  # padded / permuted HND_PACKED and CUSTOM strides (noncanonical_strides)
    secondary: bool = True  # KV_OFFSETS secondary pool (feature secondary_pool)


#: Everything the generators know.
FULL = Profile()
#: The readings' minimum ("core") profile: canonical NHD/HND caches, dense 3-D IO, F16/BF16/F32,
#: PACKED tables, no scales. Single-rule cases start from it so that a provider's optional
#: UNSUPPORTED answers cannot hide the rule under test.
CORE = Profile(layout_kinds=("nhd", "hnd"), io_kinds=("dense",), four_d=False, cache_dtypes=BASELINE_DTYPES,
               formats=(TableFormat.PACKED,), scales=("none",))


_profile: contextvars.ContextVar[Profile] = contextvars.ContextVar("kvx_generator_profile", default=FULL)


@contextlib.contextmanager
def using_profile(profile: Profile) -> Iterator[Profile]:
    """Unconstrained choices of the generators draw from ``profile`` inside the block."""
    token = _profile.set(profile)
    try:
        yield profile
    finally:
        _profile.reset(token)


def random_finite(rng: np.random.Generator, dtype: DType, n: int) -> np.ndarray:
    """``n`` random bit patterns of ``dtype`` that are finite and non-zero."""
    npdt = np_dtype(dtype)
    bits_dt = BITS_DTYPE[npdt.itemsize]
    out = rng.integers(0, 1 << (8 * npdt.itemsize), size=n, dtype=np.uint64).astype(bits_dt)
    for _ in range(64):
        f = out.view(npdt).astype(np.float32)
        bad = ~np.isfinite(f) | (f == 0)
        if not bad.any():
            break
        out[bad] = rng.integers(0, 1 << (8 * npdt.itemsize), size=int(bad.sum()), dtype=np.uint64).astype(bits_dt)
    else:  # pragma: no cover - probability ~0
        raise RuntimeError("could not draw finite values")
    return out.view(npdt)


def _from_f32(x32: np.ndarray, dtype: DType) -> np.ndarray:
    """FP32 values to ``dtype`` storage (RNE; FP8 clamped to its range first)."""
    if dtype in FP8_DTYPES:
        import ml_dtypes

        m = np.float32(ml_dtypes.finfo(np_dtype(dtype)).max)
        x32 = np.clip(x32, -m, m)
    with np.errstate(over="ignore"):
        return np.asarray(x32, np.float32).astype(np_dtype(dtype))


def tie_values(rng: np.random.Generator, target: DType, n: int) -> np.ndarray:
    """FP32 midpoints between adjacent finite values of ``target`` (round-to-even ties)."""
    npdt = np_dtype(target)
    bits_dt = BITS_DTYPE[npdt.itemsize]
    a = random_finite(rng, target, n).view(bits_dt).copy()
    sign_bit = bits_dt.type(1 << (8 * npdt.itemsize - 1))
    a &= ~sign_bit  # magnitude
    b = a + bits_dt.type(1)
    lo, hi = a.view(npdt).astype(np.float32), b.view(npdt).astype(np.float32)
    ok = np.isfinite(hi)
    mid = np.where(ok, lo + (hi - lo) / np.float32(2), lo).astype(np.float32)
    return np.where(rng.random(n) < 0.5, -mid, mid).astype(np.float32)


def random_values(
    rng: np.random.Generator, dtype: DType, n: int, mode: str = "bits", target: DType | None = None,
    scale: float = 1.0,
) -> np.ndarray:
    """Storage of ``dtype``: random bits, scaled normals, or ties of ``target`` (times ``scale``)."""
    if mode == "bits":
        return random_finite(rng, dtype, n)
    if mode == "normal":
        x = rng.standard_normal(n) * 2.0 ** rng.uniform(-6, 8)
        return _from_f32(x.astype(np.float32), dtype)
    if mode == "ties":
        with np.errstate(over="ignore"):
            t = tie_values(rng, target or dtype, n) * np.float32(scale)
        return _from_f32(t, dtype)
    raise ValueError(f"unknown value mode {mode!r}")


def poisoned(dtype: DType, n: int) -> np.ndarray:
    return np.full(n * np_dtype(dtype).itemsize, POISON_BYTE, np.uint8).view(np_dtype(dtype))
