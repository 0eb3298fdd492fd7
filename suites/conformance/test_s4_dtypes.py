"""Spec 4.3, 6.9, 10 (R-CONVERT, R-FP8): element types of caches and IO tensors.

- F16 / BF16 / F32 caches with IO of the same dtype (baseline, required) and of the
  other two (feature ``mixed_io_dtype``): values move through FP32 and round to
  nearest even; inputs include infinities, NaN, signed zeros, subnormals and values
  that overflow the narrower format; writes of a few tokens and of 64 and more (a batched
  path rounds as the short one), gathers of 1024 to 65600 rows, each batch holding NaNs with
  low or all-ones payloads (both signs) and subnormals of its source dtype (a bulk path keeps
  NaNs NaN and subnormals unflushed as the short one does); gathers whose key and value
  outputs differ in dtype (2 and 260 sequences).
- FP8 caches (profile fp8, feature ``fp8``): write quantizes ``x / scale`` (IEEE FP32
  division), saturating, RNE; the scale comes from ``k_scale_desc`` (PER_TENSOR, also as a
  0-d scalar, in writes of 12 and 300 tokens; PER_HEAD, also with 8 and 16 heads; one side PER_HEAD beside the
  other PER_TENSOR, in writes of 10 and 300 tokens), else the ``k_scale`` pointer, else 1.0; into blocks of no power
  of two too (144 and 1584 tokens);
  FP8 IO of the cache's dtype copies raw bytes, both ways (gathers of 3 and 260 sequences from caches
  holding all 256 byte values, NaN and inf bytes included, too); an E4M3 K cache beside an E5M2 V
  cache (and the reverse) quantizes each side to its own format; ``kvx_validate_cache_desc``
  answers OK for a valid FP8 cache.
"""
from __future__ import annotations

import functools

import numpy as np
import pytest

from kvx_conformance.abi.descriptors import Geometry
from kvx_conformance.abi.dtypes import SHORT_NAMES as NAMES
from kvx_conformance.abi.dtypes import np_dtype
from kvx_conformance.abi.header import DType, ScaleGranularity, Status
from kvx_conformance.abi.loader import status_name
from kvx_conformance.cases import build as cb
from kvx_conformance.cases.checks import verify_gather, verify_validate, verify_write
from kvx_conformance.results.outcomes import (INFORMATIONAL, RECOMMENDED, REQUIRED, ConformanceFailure, Unsupported,
                                             conformance)

G = cb.GEOM
BASE = [DType.F16, DType.BF16, DType.F32]
FP8 = [DType.F8_E4M3, DType.F8_E5M2]
CL_CONVERT = "spec 4.3 (baseline F16/BF16/F32 caches and IO); R-CONVERT"
CL_FP8 = "spec 4.3, 6.9, 10 (FP8 caches, scales); R-FP8"

SAME = [pytest.param(d, id=NAMES[d]) for d in BASE]
MIXED = [pytest.param(c, i, id=f"cache_{NAMES[c]}-io_{NAMES[i]}") for c in BASE for i in BASE if c != i]


def _cache(provider, memory, dtype, seed):
    return cb.simple_cache(G, cb.core_layout(provider, memory), dtype, seed=seed)


def _write(provider, opts, cache_dtype, io_dtype, seed, feature=None, clause=CL_CONVERT, label_extra="", **kw):
    cache = _cache(provider, opts.memory, cache_dtype, seed)
    case = cb.write_case(cache, cb.spread_slots(G, 12, seed), io_dtype=io_dtype, seed=seed + 1,
                         label=f"{NAMES[io_dtype]} -> {NAMES[cache_dtype]} cache"
                               + (f", {label_extra}" if label_extra else ""), **kw)
    return verify_write(provider, case, opts, clause=clause, feature=feature)


def _gather(provider, opts, cache_dtype, io_dtype, seed, feature=None, clause=CL_CONVERT, specials=False,
            nan_payloads=False):
    cache = _cache(provider, opts.memory, cache_dtype, seed)
    if specials and cache_dtype in BASE:
        cache = cb.replace(cache, k_init=cb.with_specials(cache.k_init, cache_dtype))
    if nan_payloads:
        cache = cb.replace(cache, k_init=cb.with_nan_payloads(cache.k_init, cache_dtype),
                           v_init=cb.with_nan_payloads(cache.v_init, cache_dtype))
    # block 0 first: with_specials put the special values at the start of the K storage
    table = np.array([[0, 3, 5], [2, 1, 4]], np.int64)
    case = cb.packed_gather(cache, table, [12, 9], 12, io_dtype=io_dtype, seed=seed + 1,
                            label=f"{NAMES[cache_dtype]} cache -> {NAMES[io_dtype]}")
    return verify_gather(provider, case, opts, clause=clause, feature=feature)


# ---------------------------------------------------------------------------- F16 / BF16 / F32


@conformance("dtype.write.same", CL_CONVERT, REQUIRED, "core", "write")
@pytest.mark.parametrize("dtype", SAME)
def test_write_same_dtype(kvx_provider, kvx_call_options, dtype):
    _write(kvx_provider, kvx_call_options(), dtype, dtype, 1, specials=True)


@conformance("dtype.gather.same", CL_CONVERT, REQUIRED, "core", "gather")
@pytest.mark.parametrize("dtype", SAME)
def test_gather_same_dtype(kvx_provider, kvx_call_options, dtype):
    _gather(kvx_provider, kvx_call_options(), dtype, dtype, 2, specials=True)


CL_BITS = "spec 4.3; R-CONVERT (an IO dtype equal to the cache dtype moves the bits: NaN payloads and signs kept)"


@conformance("dtype.write.same_bits", CL_BITS, RECOMMENDED, "core", "write")
@pytest.mark.parametrize("dtype", SAME)
def test_write_same_dtype_keeps_bits(kvx_provider, kvx_call_options, dtype):
    """NaNs with payloads written into a cache of their own dtype keep their exact bits."""
    _write(kvx_provider, kvx_call_options(), dtype, dtype, 41, clause=CL_BITS, nan_payloads=True)


@conformance("dtype.gather.same_bits", CL_BITS, RECOMMENDED, "core", "gather")
@pytest.mark.parametrize("dtype", SAME)
def test_gather_same_dtype_keeps_bits(kvx_provider, kvx_call_options, dtype):
    """NaNs with payloads gathered into IO of the cache's dtype keep their exact bits."""
    _gather(kvx_provider, kvx_call_options(), dtype, dtype, 43, clause=CL_BITS, nan_payloads=True)


@conformance("dtype.write.convert", CL_CONVERT + " (through FP32, RNE, overflow to inf)", REQUIRED, "core", "write",
             feature="mixed_io_dtype")
@pytest.mark.parametrize("cache_dtype,io_dtype", MIXED)
def test_write_convert(kvx_provider, kvx_call_options, cache_dtype, io_dtype):
    _write(kvx_provider, kvx_call_options(), cache_dtype, io_dtype, 3, feature="mixed_io_dtype", specials=True)


@conformance("dtype.gather.convert", CL_CONVERT + " (through FP32, RNE, overflow to inf)", REQUIRED, "core", "gather",
             feature="mixed_io_dtype")
@pytest.mark.parametrize("cache_dtype,io_dtype", MIXED)
def test_gather_convert(kvx_provider, kvx_call_options, cache_dtype, io_dtype):
    _gather(kvx_provider, kvx_call_options(), cache_dtype, io_dtype, 4, feature="mixed_io_dtype", specials=True)


@conformance("dtype.write.rounding_ties", CL_CONVERT + " (ties to even)", REQUIRED, "core", "write",
             feature="mixed_io_dtype")
@pytest.mark.parametrize("cache_dtype", [DType.F16, DType.BF16], ids=["f16", "bf16"])
def test_write_rounding_ties(kvx_provider, kvx_call_options, cache_dtype):
    """F32 inputs exactly halfway between two representable values, and just off halfway."""
    opts = kvx_call_options()
    cache = _cache(kvx_provider, opts.memory, cache_dtype, 5)
    n = 6
    case = cb.write_case(cache, cb.spread_slots(G, n, 5), io_dtype=DType.F32, seed=6, label="rounding ties")
    key = _near_ties(case.key.size, cache_dtype, 7)
    case = cb.replace(case, key=key.copy(), value=key[::-1].copy())
    verify_write(kvx_provider, case, opts, clause=CL_CONVERT, feature="mixed_io_dtype")


def _near_ties(n: int, cache_dtype: DType, seed: int) -> np.ndarray:
    """``n`` F32 values exactly halfway between two neighbours of ``cache_dtype`` (F16 / BF16), or
    one F32 ulp or one below / above halfway, or on a neighbour; both signs."""
    mant = 13 if cache_dtype == DType.F16 else 16  # dropped mantissa bits
    rng = cb.rng_for(seed)
    base = (rng.integers(0x3C00_0000, 0x4200_0000, size=n, dtype=np.uint32) >> mant) << mant
    half = np.uint32(1 << (mant - 1))
    tweak = rng.choice(np.array([0, 1, half - 1, half, half + 1], np.uint32), size=base.size)
    sign = rng.choice(np.array([0, 0x8000_0000], np.uint32), size=base.size).astype(np.uint32)
    return ((base + tweak) | sign).view(np.float32)


CL_OVERFLOW = CL_CONVERT + " (RNE: a finite F32 value at or past the midpoint above the largest finite value is inf)"
#: F32 inputs around the rounding edge of the largest finite F16 / BF16 value, as F32 bits: the
#: midpoint (65520; 0x7F7F8000) and everything above it round to inf; just below it, to the largest
#: finite value; the midpoint below (65488; 0x7F7E8000) rounds to even, finite
OVERFLOW_BITS = {
    DType.F16: np.array([65520.0, 65535.99, 65536.0, 65519.99, 65504.0, 65528.0, 65488.0, 131072.0],
                        np.float32).view(np.uint32),
    DType.BF16: np.array([0x7F7F8000, 0x7F7FFFFF, np.float32(3.4e38).view(np.uint32), 0x7F7F7FFF, 0x7F7F0000,
                          0x7F7FC000, 0x7F7E8000, 0x7F7E8001], np.uint32),
}


@conformance("dtype.write.overflow_by_rounding", CL_OVERFLOW, REQUIRED, "core", "write", feature="mixed_io_dtype")
@pytest.mark.parametrize("cache_dtype", [DType.F16, DType.BF16], ids=["f16", "bf16"])
def test_write_overflow_by_rounding(kvx_provider, kvx_call_options, cache_dtype):
    """F32 values that are finite but round past the largest finite F16 / BF16 value: 65520, 65535.99
    (F16) and 0x7F7F8000, FLT_MAX, 3.4e38 (BF16) become inf with their sign; 65519.99 and 0x7F7F7FFF
    stay the largest finite value. A provider that saturates (clamps to the largest finite value
    before or instead of rounding) fails here; ``dtype.write.convert`` only writes values that are
    far from that edge or already inf."""
    opts = kvx_call_options()
    cache = _cache(kvx_provider, opts.memory, cache_dtype, 50)
    case = cb.write_case(cache, cb.spread_slots(G, 6, 50), io_dtype=DType.F32, seed=51,
                         label=f"f32 -> {NAMES[cache_dtype]} cache, values rounding past the largest finite value")
    vals = OVERFLOW_BITS[cache_dtype].view(np.float32)
    vals = np.concatenate([vals, -vals])
    rng = cb.rng_for(52)
    case = cb.replace(case, key=np.resize(vals, case.key.size).astype(np.float32),
                      value=rng.permutation(np.resize(vals, case.value.size)).astype(np.float32))
    verify_write(kvx_provider, case, opts, clause=CL_OVERFLOW, feature="mixed_io_dtype")


CL_SUBNORMAL = CL_CONVERT + " (subnormal inputs and results are values like any other: no flush to zero)"
#: (stored mantissa bits, exponent of the smallest normal value) of F16 and BF16
_NARROW = {DType.F16: (10, -14), DType.BF16: (7, -126)}


def _subnormal_values(n: int, cache_dtype: DType, io_dtype: DType, seed: int) -> np.ndarray:
    """``n`` values of ``io_dtype`` (both signs) that are subnormal in the IO dtype or convert to a
    subnormal of the cache dtype: every subnormal step of F16 / BF16 (the cache's and the IO's),
    rounding ties between two subnormals and one F32 ulp either side of them, half the smallest
    subnormal (ties to 0), the largest subnormal, the tie below the smallest normal (rounds up to
    it); F32 IO adds F32 subnormals."""
    rng = cb.rng_for(seed)
    parts = []
    for dt in (cache_dtype, io_dtype):
        if dt not in _NARROW:
            continue
        m, emin = _NARROW[dt]
        q = 2.0 ** (emin - m)  # the smallest subnormal
        k = rng.integers(1, 2 ** m, size=32).astype(np.float64)
        grid = np.concatenate([k * q, (k + 0.5) * q,
                               np.array([0.25, 0.5, 1.0, 1.5, 2.5, 2 ** m - 1.0, 2 ** m - 0.5, 2 ** m]) * q])
        g = grid.astype(np.float32)
        parts += [g, np.nextafter(g, np.float32(0)), np.nextafter(g, np.float32(np.inf))]
    if io_dtype == DType.F32:
        parts.append(rng.integers(1, 1 << 23, size=32, dtype=np.uint32).view(np.float32))
    pool = np.concatenate(parts)
    pool = pool[pool.astype(np_dtype(io_dtype)) != 0]  # BF16 subnormals are 0 as F16 IO: left out
    x = rng.choice(pool, size=n) * rng.choice(np.array([1, -1], np.float32), size=n)
    return x.astype(np_dtype(io_dtype))


def _subnormal_share(x: np.ndarray, cache_dtype: DType) -> float:
    """The share of ``x`` that is subnormal as given or once converted (RNE) to ``cache_dtype``."""
    tiny = {DType.F16: 2.0 ** -14, DType.BF16: 2.0 ** -126, DType.F32: 2.0 ** -126}

    def sub(a, dt):
        f = np.abs(a.astype(np.float64))
        return (f > 0) & (f < tiny[dt])
    io_dtype = next(d for d in tiny if np_dtype(d) == x.dtype)
    return float(np.mean(sub(x, io_dtype) | sub(x.astype(np.float32).astype(np_dtype(cache_dtype)), cache_dtype)))


@conformance("dtype.write.subnormals", CL_SUBNORMAL, REQUIRED, "core", "write", feature="mixed_io_dtype")
@pytest.mark.parametrize("cache_dtype,io_dtype", MIXED)
def test_write_subnormals(kvx_provider, kvx_call_options, cache_dtype, io_dtype):
    """Converting writes whose inputs are subnormal or whose results are F16 / BF16 subnormals
    (F32 subnormals into a BF16 cache, F32 and BF16 values below 2^-14 into an F16 cache, F16 /
    BF16 subnormals widened): RNE at every subnormal step, ties included. A provider that flushes
    subnormal results to zero (FTZ) or reads subnormal inputs as zero (DAZ, e.g. built with fast
    math) fails here."""
    opts = kvx_call_options()
    cache = _cache(kvx_provider, opts.memory, cache_dtype, 53)
    case = cb.write_case(cache, cb.spread_slots(G, 12, 53), io_dtype=io_dtype, seed=54,
                         label=f"{NAMES[io_dtype]} -> {NAMES[cache_dtype]} cache, subnormal inputs / results")
    key = _subnormal_values(case.key.size, cache_dtype, io_dtype, 55)
    value = _subnormal_values(case.value.size, cache_dtype, io_dtype, 56)
    for x in (key, value):  # a harness fault (outcome "error"), never a skip
        if _subnormal_share(x, cache_dtype) < 0.5:
            raise RuntimeError(f"dtype.write.subnormals: fewer than half of the {NAMES[io_dtype]} inputs are "
                               f"subnormal or convert to a {NAMES[cache_dtype]} subnormal")
    verify_write(kvx_provider, cb.replace(case, key=key, value=value), opts, clause=CL_SUBNORMAL,
                 feature="mixed_io_dtype")


def _gather_values(provider, opts, cache_dtype, out_dtype, seed, k, v, what, clause=None):
    """A PACKED gather from a ``cache_dtype`` cache whose K and V storage hold ``k`` / ``v`` (resized
    to the storage) into ``out_dtype`` outputs, verified against the oracle (R-CONVERT: the gather
    converts by the write's rule)."""
    cache = _cache(provider, opts.memory, cache_dtype, seed)
    ki, vi = cache.k_init, cache.v_init
    cache = cb.replace(cache, k_init=np.resize(k, ki.size).astype(ki.dtype).reshape(ki.shape),
                       v_init=np.resize(v, vi.size).astype(vi.dtype).reshape(vi.shape))
    table = np.array([[0, 3, 5], [2, 1, 4]], np.int64)
    case = cb.packed_gather(cache, table, [12, 9], 12, io_dtype=out_dtype, seed=seed + 1,
                            label=f"{NAMES[cache_dtype]} cache -> {NAMES[out_dtype]}, {what}")
    if clause is None:
        clause = CL_OVERFLOW if "edge" in what else CL_SUBNORMAL
    verify_gather(provider, case, opts, clause=clause, feature="mixed_io_dtype")


@conformance("dtype.gather.overflow_by_rounding", CL_OVERFLOW, REQUIRED, "core", "gather", feature="mixed_io_dtype")
@pytest.mark.parametrize("out_dtype", [DType.F16, DType.BF16], ids=["f16", "bf16"])
def test_gather_overflow_by_rounding(kvx_provider, kvx_call_options, out_dtype):
    """The gather direction of ``dtype.write.overflow_by_rounding``: an F32 cache holding values at
    the rounding edge of the largest finite F16 / BF16 value, gathered into F16 / BF16 outputs."""
    vals = OVERFLOW_BITS[out_dtype].view(np.float32)
    vals = np.concatenate([vals, -vals])
    _gather_values(kvx_provider, kvx_call_options(), DType.F32, out_dtype, 57, vals,
                   cb.rng_for(58).permutation(vals), "values at the largest finite value's rounding edge")


@conformance("dtype.gather.subnormals", CL_SUBNORMAL, REQUIRED, "core", "gather", feature="mixed_io_dtype")
@pytest.mark.parametrize("cache_dtype,out_dtype", MIXED)
def test_gather_subnormals(kvx_provider, kvx_call_options, cache_dtype, out_dtype):
    """The gather direction of ``dtype.write.subnormals``: cache values that are subnormal or become
    subnormal in the output dtype, gathered without flush to zero."""
    k = _subnormal_values(512, out_dtype, cache_dtype, 59)
    v = _subnormal_values(512, out_dtype, cache_dtype, 60)
    for x in (k, v):  # a harness fault (outcome "error"), never a skip
        if _subnormal_share(x, out_dtype) < 0.5:
            raise RuntimeError(f"dtype.gather.subnormals: fewer than half of the {NAMES[cache_dtype]} values are "
                               f"subnormal or convert to a {NAMES[out_dtype]} subnormal")
    _gather_values(kvx_provider, kvx_call_options(), cache_dtype, out_dtype, 61, k, v, "subnormal values / results")


CL_NAN = (CL_CONVERT + " (NaN stays NaN, whatever its payload: any NaN of the destination, never inf or a "
                       "number; R-NAN-CLASS)")
#: NaNs (storage bits) whose payload sits in the low mantissa bits a narrowing conversion drops, or fills
#: every mantissa bit (a rounding carry reaches the exponent and the sign), signalling and quiet, both signs
NAN_LOW_PAYLOADS = {
    DType.F32: [0x7F800001, 0xFF800001, 0x7F80FFFF, 0x7F801FFF, 0x7FFFFFFF, 0xFFFFFFFF, 0x7FBFFFFF, 0xFFC00001],
    DType.F16: [0x7C01, 0xFC01, 0x7C0F, 0x7DFF, 0x7FFF, 0xFFFF],
    DType.BF16: [0x7F81, 0xFF81, 0x7FFF, 0xFFFF],
}


def _nan_mix(n: int, dtype: DType, seed: int) -> np.ndarray:
    """``n`` values of ``dtype``: every other one a NaN of :data:`NAN_LOW_PAYLOADS`, the rest finite."""
    x = cb.finite_values(cb.rng_for(seed), dtype, n)
    bits = np.array(NAN_LOW_PAYLOADS[dtype], np.uint32 if dtype == DType.F32 else np.uint16)
    x[::2] = np.resize(bits, x[::2].size).view(np_dtype(dtype))
    return x


@conformance("dtype.write.nan_payloads_convert", CL_NAN, REQUIRED, "core", "write", feature="mixed_io_dtype")
@pytest.mark.parametrize("cache_dtype,io_dtype", MIXED)
def test_write_nan_payloads_convert(kvx_provider, kvx_call_options, cache_dtype, io_dtype):
    """Converting writes of NaNs whose payload lies only in the mantissa bits the cache dtype drops
    (F32 0x7F800001, F16 0x7C01 into BF16) or fills them all (0x7FFFFFFF): each stays a NaN. The
    round-to-nearest-even bit trick ``(x + 0x7FFF + lsb) >> 16`` without a NaN case turns the first
    into inf and carries the second into the sign (-0); a converter that keeps the top payload bits
    without setting one makes inf. ``dtype.write.convert`` writes the quiet NaN 0x7FC00000 only."""
    opts = kvx_call_options()
    cache = _cache(kvx_provider, opts.memory, cache_dtype, 62)
    case = cb.write_case(cache, cb.spread_slots(G, 12, 62), io_dtype=io_dtype, seed=63,
                         label=f"{NAMES[io_dtype]} -> {NAMES[cache_dtype]} cache, NaNs with low payload bits")
    case = cb.replace(case, key=_nan_mix(case.key.size, io_dtype, 64), value=_nan_mix(case.value.size, io_dtype, 65))
    verify_write(kvx_provider, case, opts, clause=CL_NAN, feature="mixed_io_dtype")


@conformance("dtype.gather.nan_payloads_convert", CL_NAN, REQUIRED, "core", "gather", feature="mixed_io_dtype")
@pytest.mark.parametrize("cache_dtype,out_dtype", MIXED)
def test_gather_nan_payloads_convert(kvx_provider, kvx_call_options, cache_dtype, out_dtype):
    """The gather direction of ``dtype.write.nan_payloads_convert``: cache NaNs with low payload bits
    gathered into outputs of another dtype stay NaNs."""
    _gather_values(kvx_provider, kvx_call_options(), cache_dtype, out_dtype, 66, _nan_mix(512, cache_dtype, 67),
                   _nan_mix(512, cache_dtype, 68), "NaNs with low payload bits", clause=CL_NAN)


#: storage bits, per source dtype (the IO dtype of a write, the cache dtype of a gather), of the subnormals
#: and near-subnormals of the batch conversions: F32 subnormals whose BF16 rounding is not zero (2^-127,
#: 2^-130, the largest subnormal, BF16's smallest subnormal 2^-133, its tie 1.5 x 2^-133 (to even: 2^-132)
#: and half of it (to 0), one F32 ulp above half (to 2^-133)), F32 normals that round to F16 subnormals
#: (2^-24, 0.75 x 2^-24, the tie 2^-25 (to 0), -1.5 x 2^-24 (to even: -2^-23), F16's largest subnormal),
#: F16 and BF16 subnormals (the smallest, the largest, others), both signs. A path that reads F32
#: subnormals as zero (DAZ) or flushes subnormal results (FTZ) stores +-0 for many of them.
BATCH_SUBNORMALS = {
    DType.F32: [0x00400000, 0x80400000, 0x00080000, 0x80080000, 0x007FFFFF, 0x807FFFFF, 0x00010000, 0x80018000,
                0x00008000, 0x80008001, 0x33800000, 0x33400000, 0x33000000, 0xB3C00000, 0x387FC000],
    DType.F16: [0x0001, 0x8001, 0x03FF, 0x8200, 0x0155],
    DType.BF16: [0x0001, 0x8001, 0x007F, 0x8040, 0x0055],
}
#: cb.with_specials' values come first (8 elements), then these
_BATCH_SPECIALS_AT = 8


def _batch_specials(values: np.ndarray, dtype: DType) -> np.ndarray:
    """``values`` (storage of ``dtype``, flat) with the special values of the batch conversions at
    the start: ``cb.with_specials`` (+-inf, the quiet NaN, +-0, a tiny value, a large one), then
    :data:`NAN_LOW_PAYLOADS` (NaNs whose payload lies only in the bits a narrowing drops, or fills
    every mantissa bit: signalling and quiet, both signs), then :data:`BATCH_SUBNORMALS`."""
    v = cb.with_specials(values, dtype)
    raw = np.uint32 if dtype == DType.F32 else np.uint16
    extra = np.array(NAN_LOW_PAYLOADS[dtype] + BATCH_SUBNORMALS[dtype], raw).view(np_dtype(dtype))
    if v.size < _BATCH_SPECIALS_AT + extra.size:  # a harness fault (outcome "error"), never a skip
        raise RuntimeError(f"batch special values: {_BATCH_SPECIALS_AT + extra.size} of them do not fit in "
                           f"{v.size} elements")
    v[_BATCH_SPECIALS_AT:_BATCH_SPECIALS_AT + extra.size] = extra
    return v


def _batch_specials_count(dtype: DType) -> int:
    return _BATCH_SPECIALS_AT + len(NAN_LOW_PAYLOADS[dtype]) + len(BATCH_SUBNORMALS[dtype])


#: the clause of a batch conversion's failure: the rounding, and the values the batch holds first
CL_BATCH = (CL_CONVERT + " (through FP32, RNE, overflow to inf; subnormals are values: no DAZ / FTZ; NaN stays "
                         "NaN, whatever its payload, never inf, a number or a zero: R-NAN-CLASS; the rule does not "
                         "depend on the size of the call)")

#: token counts of the batch conversion writes (the other conversion tests write at most 24
#: tokens; a provider may take another, vectorized or batched, path past some count: 4096 is a
#: prefill chunk, past the thresholds at which such paths start)
BATCH_TOKENS = [64, 203, 4096, 65600]
BATCH_GEOM = Geometry(num_blocks=64, block_size=4, num_kv_heads=2, head_dim=8)
#: the geometry of a batch too large for BATCH_GEOM: 4096 slots
PREFILL_GEOM = Geometry(num_blocks=1024, block_size=4, num_kv_heads=2, head_dim=8)
#: ... and of the largest batches: 65792 slots of one head of 16 dims (a bulk path taken past 4096 or
#: 65535 tokens, the size of a long prefill, is reached)
LONG_GEOM = Geometry(num_blocks=4112, block_size=16, num_kv_heads=1, head_dim=16)


def _batch_geom(tokens: int) -> Geometry:
    return BATCH_GEOM if tokens <= BATCH_GEOM.num_slots else PREFILL_GEOM if tokens <= PREFILL_GEOM.num_slots \
        else LONG_GEOM


def _ties_in_second_half(case, cache_dtype: DType, io_dtype: DType, seed: int):
    """``case`` with the second half of K and V at or next to rounding ties of ``cache_dtype``
    (``_near_ties``, seeds ``seed`` and ``seed + 1``) where F32 rows go into an F16 / BF16 cache;
    any other pair as it is."""
    if io_dtype != DType.F32 or cache_dtype not in (DType.F16, DType.BF16):
        return case
    key, value = case.key.copy(), case.value.copy()
    half = key.size // 2
    key[half:] = _near_ties(key.size - half, cache_dtype, seed)
    value[half:] = _near_ties(value.size - half, cache_dtype, seed + 1)
    return cb.replace(case, key=key, value=value)


@conformance("dtype.write.convert_batch", CL_CONVERT + " (through FP32, RNE, overflow to inf, no DAZ / FTZ, NaN "
             "stays NaN whatever its payload (R-NAN-CLASS); writes of 64 tokens and more, a 4096-token prefill "
             "chunk and a 65600-token prefill included)", REQUIRED, "core", "write", feature="mixed_io_dtype")
@pytest.mark.parametrize("tokens", BATCH_TOKENS)
@pytest.mark.parametrize("cache_dtype,io_dtype", MIXED)
def test_write_convert_batch(kvx_provider, kvx_call_options, cache_dtype, io_dtype, tokens):
    """``dtype.write.convert`` with many tokens in one call: the special values of the IO dtype first
    in K and V (:func:`_batch_specials`: +-inf, the quiet NaN, +-0, NaNs whose payload lies only in
    the bits the cache dtype drops or fills every mantissa bit, both signs, and subnormals: F32 ones
    whose BF16 rounding is not zero, F32 values that round to F16 subnormals, F16 / BF16 ones), then
    random values; from F32 into F16 / BF16 the second half of K and V lies at or next to rounding
    ties, so a path that truncates (or rounds ties away) on large writes changes many elements. A
    bulk path that rounds by the bit trick ``(x + 0x7FFF + lsb) >> 16`` with no NaN case (NaNs to
    inf or, from 0x7FFFFFFF, to -0) or reads F32 subnormals as zero fails at 65600 tokens, though the
    12-token ``dtype.write.nan_payloads_convert`` and ``dtype.write.subnormals`` pass."""
    opts = kvx_call_options()
    g = _batch_geom(tokens)
    cache = cb.simple_cache(g, cb.core_layout(kvx_provider, opts.memory), cache_dtype, seed=46)
    case = cb.write_case(cache, cb.spread_slots(g, tokens, 46), io_dtype=io_dtype, seed=47,
                         label=f"{tokens} tokens, {NAMES[io_dtype]} -> {NAMES[cache_dtype]} cache, "
                               f"specials with low-payload NaNs and subnormals first")
    case = cb.replace(case, key=_batch_specials(case.key, io_dtype), value=_batch_specials(case.value, io_dtype))
    case = _ties_in_second_half(case, cache_dtype, io_dtype, 48)
    verify_write(kvx_provider, case, opts, clause=CL_BATCH, feature="mixed_io_dtype")


DECODE_GEOM = Geometry(num_blocks=4, block_size=4, num_kv_heads=8, head_dim=16)  # one token: 128 values


@conformance("dtype.write.convert_single_token", CL_CONVERT + " (through FP32, RNE, overflow to inf, no DAZ / FTZ, NaN "
             "stays NaN whatever its payload (R-NAN-CLASS); a write of one token)", REQUIRED, "core", "write",
             feature="mixed_io_dtype")
@pytest.mark.parametrize("cache_dtype,io_dtype", MIXED)
def test_write_convert_single_token(kvx_provider, kvx_call_options, cache_dtype, io_dtype):
    """``dtype.write.convert`` with one token (a decode step of batch 1, 8 heads x 16): the special
    values of the batch conversions first (:func:`_batch_specials`: +-inf, the quiet NaN, +-0, NaNs
    whose payload lies only in the bits the cache dtype drops or fills every mantissa bit, both signs,
    subnormals), then random values; from F32 into F16 / BF16 the second half of K and V lies at or
    next to rounding ties. The other conversion writes hold 3 tokens or more, so a one-token decode
    path that truncates (or rounds ties away), or rounds F32 to BF16 by the bit trick with no NaN case
    (a low-payload NaN becomes inf), is seen here (R-CONVERT: the rule does not depend on the size of
    the call)."""
    opts = kvx_call_options()
    g = DECODE_GEOM
    cache = cb.simple_cache(g, cb.core_layout(kvx_provider, opts.memory), cache_dtype, seed=55)
    case = cb.write_case(cache, [6], io_dtype=io_dtype, seed=56,
                         label=f"one token, {NAMES[io_dtype]} -> {NAMES[cache_dtype]} cache, "
                               f"specials with low-payload NaNs and subnormals first")
    case = cb.replace(case, key=_batch_specials(case.key, io_dtype), value=_batch_specials(case.value, io_dtype))
    case = _ties_in_second_half(case, cache_dtype, io_dtype, 57)
    verify_write(kvx_provider, case, opts, clause=CL_BATCH, feature="mixed_io_dtype")


#: batch id -> (sequences, max_seq_len, geometry) of the batch conversion gathers (the other
#: conversion gathers return at most 24 rows): a decode batch of 64 sequences of up to 16 tokens
#: (1024 output rows) and a prefill's context, 2 sequences of up to 2048 tokens (4096 rows)
GATHER_BATCHES = {"decode_64x16": (64, 16, BATCH_GEOM), "context_2x2048": (2, 2048, PREFILL_GEOM),
                  "context_1x65600": (1, 65600, LONG_GEOM)}


@conformance("dtype.gather.convert_batch", CL_CONVERT + " (cache -> FP32 -> IO dtype, RNE, overflow to inf, no DAZ "
             "/ FTZ, NaN stays NaN whatever its payload (R-NAN-CLASS); gathers of 1024, 4096 and 65600 output rows)",
             REQUIRED, "core", "gather", feature="mixed_io_dtype")
@pytest.mark.parametrize("batch", list(GATHER_BATCHES))
@pytest.mark.parametrize("cache_dtype,io_dtype", MIXED)
def test_gather_convert_batch(kvx_provider, kvx_call_options, cache_dtype, io_dtype, batch):
    """``dtype.gather.convert`` with many output rows in one call: PACKED gathers of 64 sequences x
    16 rows, of 2 sequences x 2048 rows (lengths from half of ``max_seq_len`` to past it) and of one
    sequence of 65600 rows, the special values of the cache dtype (:func:`_batch_specials`: +-inf,
    the quiet NaN, +-0, NaNs with low or all-ones payloads, both signs, subnormals) at the start of
    the K and V storage, in the first block gathered; from an F32 cache into F16 / BF16 outputs the
    second half of the K and V storage lies at or next to rounding ties, so a path that truncates (or
    rounds ties away) on large gathers changes many elements, and one that rounds F32 to BF16 by the
    bit trick with no NaN case turns NaNs into inf or zeros (R-CONVERT, R-NAN-CLASS: the rule does
    not depend on the size of the call)."""
    opts = kvx_call_options()
    seqs, msl, g = GATHER_BATCHES[batch]
    cache = cb.simple_cache(g, cb.core_layout(kvx_provider, opts.memory), cache_dtype, seed=50)
    if _batch_specials_count(cache_dtype) > g.block_size * g.num_kv_heads * g.head_dim:  # a harness fault
        raise RuntimeError("dtype.gather.convert_batch: the special values do not fit in the first block gathered")
    k, v = _batch_specials(cache.k_init, cache_dtype), _batch_specials(cache.v_init, cache_dtype)
    if cache_dtype == DType.F32 and io_dtype in (DType.F16, DType.BF16):
        half = k.size // 2
        k[half:] = _near_ties(k.size - half, io_dtype, 51)
        v[half:] = _near_ties(v.size - half, io_dtype, 52)
    cache = cb.replace(cache, k_init=k, v_init=v)
    rng = cb.rng_for(53)
    table = rng.integers(0, g.num_blocks, size=(seqs, -(-msl // g.block_size)))
    table[0, 0] = 0  # the block that holds the special values
    lens = rng.integers(msl // 2, msl + 1, size=seqs)
    lens[::5] = msl + 3  # truncated by max_seq_len
    case = cb.packed_gather(cache, table, lens.tolist(), msl, io_dtype=io_dtype, seed=54,
                            label=f"{seqs} sequences x max_seq_len {msl} ({seqs * msl} output rows), "
                                  f"{NAMES[cache_dtype]} cache -> {NAMES[io_dtype]}, specials with low-payload "
                                  f"NaNs and subnormals in the first block")
    verify_gather(kvx_provider, case, opts, clause=CL_BATCH, feature="mixed_io_dtype")


CL_KV_OUT = (CL_CONVERT + "; spec 6.8 (io.key and io.value are tensor descriptors of their own: each output "
             "in its own dtype)")
#: (cache dtype, key output dtype, value output dtype)
KV_OUT = [pytest.param(c, k, v, id=f"cache_{NAMES[c]}-key_{NAMES[k]}-value_{NAMES[v]}")
          for c in (DType.F16, DType.F32)
          for k, v in ((DType.F16, DType.BF16), (DType.BF16, DType.F16), (DType.F16, DType.F32), (DType.F32, DType.BF16))]


@conformance("dtype.gather.kv_out_dtypes", CL_KV_OUT, REQUIRED, "core", "gather", feature="mixed_io_dtype")
@pytest.mark.parametrize("cache_dtype,key_dtype,value_dtype", KV_OUT)
def test_gather_kv_out_dtypes(kvx_provider, kvx_call_options, cache_dtype, key_dtype, value_dtype):
    """A gather whose key output and value output have different dtypes (F16, BF16 and F32, of the
    same element size and of different ones): each output holds the cache's values converted to
    its own dtype, never to the other's, at its own element size."""
    opts = kvx_call_options()
    cache = _cache(kvx_provider, opts.memory, cache_dtype, 44)
    table = np.array([[0, 3, 5], [2, 1, 4]], np.int64)
    case = cb.packed_gather(cache, table, [12, 9], 12, io_dtype=key_dtype, seed=45,
                            label=f"{NAMES[cache_dtype]} cache -> key {NAMES[key_dtype]}, value {NAMES[value_dtype]}")
    case = cb.with_out_dtypes(case, value=value_dtype)
    verify_gather(kvx_provider, case, opts, clause=CL_KV_OUT, feature="mixed_io_dtype")


#: the decode batch of ``dtype.gather.kv_out_dtypes_batch``: sequences, max_seq_len (G: blocks of 4 tokens)
KV_OUT_BATCH_SEQS, KV_OUT_BATCH_MSL = 260, 12


@conformance("dtype.gather.kv_out_dtypes_batch", CL_KV_OUT + " - in a decode-sized gather", REQUIRED, "core", "gather",
             feature="mixed_io_dtype")
@pytest.mark.parametrize("cache_dtype,key_dtype,value_dtype", KV_OUT)
def test_gather_kv_out_dtypes_batch(kvx_provider, kvx_call_options, cache_dtype, key_dtype, value_dtype):
    """``dtype.gather.kv_out_dtypes`` in a decode batch: 260 sequences (lengths 0 to 15, a fifth past
    max_seq_len 12) whose key and value outputs differ in dtype. ``dtype.gather.kv_out_dtypes`` gathers
    2 sequences, and every engine-sized gather of the suite (``dtype.gather.convert_batch``,
    ``matrix.*``, ``pairwise.gather``, the generated batches) converts both outputs to one dtype, so a
    batch kernel instantiated for the key output's dtype alone was never reached."""
    opts = kvx_call_options()
    cache = _cache(kvx_provider, opts.memory, cache_dtype, 46)
    rng = cb.rng_for(47)
    mb = KV_OUT_BATCH_MSL // G.block_size
    table = rng.integers(0, G.num_blocks, size=(KV_OUT_BATCH_SEQS, mb))
    lens = rng.integers(0, KV_OUT_BATCH_MSL + 4, size=KV_OUT_BATCH_SEQS).tolist()
    case = cb.packed_gather(cache, table, lens, KV_OUT_BATCH_MSL, io_dtype=key_dtype, seed=48,
                            label=f"{KV_OUT_BATCH_SEQS}-sequence gather, {NAMES[cache_dtype]} cache -> key "
                                  f"{NAMES[key_dtype]}, value {NAMES[value_dtype]}")
    case = cb.with_out_dtypes(case, value=value_dtype)
    verify_gather(kvx_provider, case, opts, clause=CL_KV_OUT, feature="mixed_io_dtype")


@conformance("dtype.write.scale_ignored_non_fp8", "spec 6.9; R-FP8 (scales apply to FP8 caches only)", REQUIRED,
             "core", "write")
def test_scale_ignored_for_non_fp8(kvx_provider, kvx_call_options):
    opts = kvx_call_options()
    cache = _cache(kvx_provider, opts.memory, DType.F16, 8)
    case = cb.write_case(cache, cb.spread_slots(G, 8, 8), seed=9, k_scale=4.0, v_scale=0.25,
                         label="F16 cache with k_scale 4, v_scale 0.25")
    verify_write(kvx_provider, case, opts, clause="spec 6.9; R-FP8")


# ---------------------------------------------------------------------------- FP8

SCALES = {
    "none": {},
    "per_tensor_desc": {"k_scale_desc": ("t", [0.21]), "v_scale_desc": ("t", [3.3])},
    "per_head_desc": {"k_scale_desc": ("h", [0.5, 1.7]), "v_scale_desc": ("h", [2.25, 0.093])},
    "desc_over_pointer": {"k_scale": 9.0, "v_scale": 9.0, "k_scale_desc": ("t", [0.61]),
                          "v_scale_desc": ("h", [0.3, 1.1])},
    # K per head beside V per tensor (desc_over_pointer has the other way round): each side's value by its
    # own granularity, never by K's (a kernel chosen by K's granularity reads V's data[h], past its value)
    "k_per_head_v_per_tensor": {"k_scale_desc": ("h", [0.5, 1.7]), "v_scale_desc": ("t", [3.3])},
}


def _scale_kw(spec: dict) -> dict:
    out = {}
    for k, v in spec.items():
        if k.endswith("_desc"):
            g, vals = v
            out[k] = cb.scale_spec(vals, ScaleGranularity.PER_TENSOR if g == "t" else ScaleGranularity.PER_HEAD)
        else:
            out[k] = v
    return out


FP8_PARAMS = [pytest.param(d, id=NAMES[d]) for d in FP8]


CL_FP8_VALID = ("spec 7 (kvx_validate_cache_desc MUST validate layout, dtype, shape, stride and required fields, "
                "returning INVALID_ARGUMENT on failure), 4.3, 10 (F8_E4M3 / F8_E5M2 caches); R-FP8")


@conformance("fp8.validate.valid", CL_FP8_VALID, REQUIRED, "fp8", "validate", feature="fp8")
@pytest.mark.parametrize("dtype", FP8_PARAMS)
def test_fp8_validate_valid(kvx_provider, kvx_call_options, dtype):
    """A valid FP8 cache (E4M3 / E5M2, the core layout) validates OK and changes nothing. A refusal
    (UNSUPPORTED, or INVALID_ARGUMENT: spec 8 "unsupported field") is the feature's only while the
    provider's write refuses the same cache too: a provider whose validation checks dtypes against
    the baseline table (F16, BF16, F32) while its writes serve FP8 fails (an engine that validates
    its cache once, at start-up, would turn away a cache the provider serves)."""
    opts = kvx_call_options()
    seed = 90 + int(dtype)
    cache = _cache(kvx_provider, opts.memory, dtype, seed)
    vcase = cb.validate_case(cache, label=f"valid {NAMES[dtype]} cache", seed=seed)
    got = verify_validate(kvx_provider, vcase, opts, clause=CL_FP8_VALID, expect=Status.OK,
                          statuses=(Status.OK, Status.UNSUPPORTED, Status.INVALID_ARGUMENT))
    if got.status == Status.OK:
        return
    wcase = cb.write_case(cache, cb.spread_slots(G, 6, seed), io_dtype=DType.F32, seed=seed + 1,
                          label=f"F32 -> {NAMES[dtype]} cache, the cache kvx_validate_cache_desc refused")
    verify_write(kvx_provider, wcase, opts, clause=CL_FP8, feature="fp8")  # a refusal here is the feature's
    raise ConformanceFailure("kvx_validate_cache_desc refused an FP8 cache the provider writes",
                             expected="OK (kvx_write_kv answers OK on the same cache and writes it correctly)",
                             got=f"{status_name(int(got.status))} from kvx_validate_cache_desc", clause=CL_FP8_VALID,
                             case=vcase.describe(), seed=seed)


@conformance("fp8.write.scales", CL_FP8, REQUIRED, "fp8", "write", feature="fp8")
@pytest.mark.parametrize("scales", list(SCALES))
@pytest.mark.parametrize("dtype", FP8_PARAMS)
def test_fp8_write_scales(kvx_provider, kvx_call_options, scales, dtype):
    _write(kvx_provider, kvx_call_options(), dtype, DType.F32, 10, feature="fp8", clause=CL_FP8,
           **_scale_kw(SCALES[scales]))


CL_SCALAR = CL_FP8 + "; spec 6.6 (shape / ndim: \"for non-scalar scales\"; a PER_TENSOR scale may be a 0-d scalar)"
#: PER_TENSOR scale descriptors of ndim 0 (no shape): K, V, both, and both beside the flat pointers
SCALAR_SCALES = {
    "k_scalar": {"k_scale_desc": (0.21, True), "v_scale_desc": (3.3, False)},
    "v_scalar": {"k_scale_desc": (0.21, False), "v_scale_desc": (3.3, True)},
    "both_scalar": {"k_scale_desc": (0.43, True), "v_scale_desc": (2.6, True)},
    "scalar_over_pointer": {"k_scale": 9.0, "v_scale": 9.0, "k_scale_desc": (0.61, True),
                            "v_scale_desc": (0.3, True)},
}


@conformance("fp8.write.scalar_scale", CL_SCALAR, REQUIRED, "fp8", "write", feature="fp8")
@pytest.mark.parametrize("scales", list(SCALAR_SCALES))
@pytest.mark.parametrize("dtype", FP8_PARAMS)
def test_fp8_write_scalar_scale(kvx_provider, kvx_call_options, scales, dtype):
    """A PER_TENSOR scale described as a scalar (``ndim 0``, as a 0-d tensor such as vLLM's
    ``k_scale`` is described) is that scale: never ignored, never replaced by the flat pointer."""
    kw = {}
    for k, v in SCALAR_SCALES[scales].items():
        kw[k] = cb.scale_spec([v[0]], scalar=v[1]) if k.endswith("_desc") else v
    desc = ", ".join(f"{k[0].upper()} {v[0]} (ndim {0 if v[1] else 1})" for k, v in SCALAR_SCALES[scales].items()
                     if k.endswith("_desc"))
    _write(kvx_provider, kvx_call_options(), dtype, DType.F32, 22, feature="fp8", clause=CL_SCALAR,
           **kw, label_extra=f"PER_TENSOR scales {desc}" + (", k_scale / v_scale 9.0" if "k_scale" in kw else ""))


#: the cache and token count of ``fp8.write.scalar_scale_batch``: a prefill chunk past the 24 tokens of the
#: other quantizing writes of a scalar descriptor
SCALAR_BATCH_GEOM, SCALAR_BATCH_TOKENS = Geometry(num_blocks=24, block_size=16, num_kv_heads=2, head_dim=8), 300


@conformance("fp8.write.scalar_scale_batch", CL_SCALAR + " - in a prefill-sized write", REQUIRED, "fp8", "write",
             feature="fp8")
@pytest.mark.parametrize("scales", list(SCALAR_SCALES))
@pytest.mark.parametrize("dtype", FP8_PARAMS)
def test_fp8_write_scalar_scale_batch(kvx_provider, kvx_call_options, scales, dtype):
    """``fp8.write.scalar_scale`` in a write of 300 tokens (a few -1 slots): a scalar PER_TENSOR scale
    descriptor quantizes its side whatever the size of the call. The other writes through a scalar
    descriptor hold at most 24 tokens (``fp8.write.scalar_scale``, vLLM's FP8 decode steps), and the
    generated and pairwise batches that draw one set the flat pointer to the same value beside it, so
    a bulk path that takes a scalar for no descriptor (falling back to the pointer, else 1.0) passed
    them all."""
    opts = kvx_call_options()
    g = SCALAR_BATCH_GEOM
    kw = {}
    for k, v in SCALAR_SCALES[scales].items():
        kw[k] = cb.scale_spec([v[0]], scalar=v[1]) if k.endswith("_desc") else v
    desc = ", ".join(f"{k[0].upper()} {v[0]} (ndim {0 if v[1] else 1})" for k, v in SCALAR_SCALES[scales].items()
                     if k.endswith("_desc"))
    cache = cb.simple_cache(g, cb.core_layout(kvx_provider, opts.memory), dtype, seed=23)
    slots = cb.spread_slots(g, SCALAR_BATCH_TOKENS, 23).tolist()
    for i in (0, 117, SCALAR_BATCH_TOKENS - 1):
        slots[i] = -1
    case = cb.write_case(cache, slots, io_dtype=DType.F32, seed=24, **kw,
                         label=f"{SCALAR_BATCH_TOKENS}-token f32 -> {NAMES[dtype]} write, PER_TENSOR scales {desc}"
                               + (", k_scale / v_scale 9.0" if "k_scale" in kw else ""))
    verify_write(kvx_provider, case, opts, clause=CL_SCALAR, feature="fp8")


#: (K, V) scale descriptors of ``fp8.write.scales_batch``: one side PER_HEAD beside the other PER_TENSOR, 4 heads,
#: every value distinct
SCALES_BATCH = {
    "k_per_head_v_per_tensor": {"k_scale_desc": ("h", [0.5, 1.7, 0.093, 2.6]), "v_scale_desc": ("t", [3.3])},
    "k_per_tensor_v_per_head": {"k_scale_desc": ("t", [0.21]), "v_scale_desc": ("h", [2.25, 0.093, 0.61, 1.3])},
    # PER_HEAD descriptors beside the flat pointers (vLLM passes its k_scale / v_scale always): the descriptors
    # decide (R-FP8), never the pointers, whatever granularity a bulk path serves
    "per_head_over_pointer": {"k_scale": 9.0, "v_scale": 9.0, "k_scale_desc": ("h", [0.37, 1.9, 0.0625, 0.81]),
                              "v_scale_desc": ("h", [2.6, 0.14, 0.5, 1.15])},
    # PER_HEAD descriptors whose stride[0] is left at 0: the values adjacent, as with 1 (R-FP8;
    # ``fp8.write.scale_stride_unset`` writes 12 tokens)
    "per_head_stride_unset": {"k_scale_desc": ("h", [0.29, 1.45, 0.071, 3.1]),
                              "v_scale_desc": ("h", [1.8, 0.22, 0.9, 0.047]), "stride": 0},
}
SCALES_BATCH_GEOM, SCALES_BATCH_TOKENS = Geometry(num_blocks=24, block_size=16, num_kv_heads=4, head_dim=8), 300
CL_SCALES_BATCH = (CL_FP8 + "; spec 6.6, 6.9 (k_scale_desc and v_scale_desc each a descriptor of its own granularity)"
                   " - in a prefill-sized write")


@conformance("fp8.write.scales_batch", CL_SCALES_BATCH, REQUIRED, "fp8", "write", feature="fp8")
@pytest.mark.parametrize("scales", list(SCALES_BATCH))
@pytest.mark.parametrize("dtype", FP8_PARAMS)
def test_fp8_write_scales_batch(kvx_provider, kvx_call_options, scales, dtype):
    """A 300-token F32 write (4 heads, a few -1 slots) whose K scale descriptor is PER_HEAD beside a
    PER_TENSOR V descriptor, and the reverse: each side quantized by its own descriptor's granularity;
    PER_HEAD descriptors beside the flat ``k_scale`` / ``v_scale`` pointers (9.0): the descriptors decide;
    and PER_HEAD descriptors whose ``stride[0]`` is 0 (left unset): the values adjacent.
    ``fp8.write.scales[*-k_per_head_v_per_tensor]`` and ``[*-desc_over_pointer]`` write 10 tokens and
    ``fp8.write.scale_stride_unset`` 12, while every quantizing write past 24 tokens gives K and V one
    granularity or K the PER_TENSOR one, sets the pointers beside PER_TENSOR descriptors only and
    ``stride[0]`` to 1 (``fp8.write.batch``, the generated and pairwise draws), so a bulk path that picks its
    scale kernel by K's granularity and reads V's one value per head (from a staging buffer of the scales,
    say), that serves per-tensor scales only and takes the pointer where one is set, or that reads head h's
    value at ``h * stride[0]`` with no case for 0, was never reached."""
    opts = kvx_call_options()
    g = SCALES_BATCH_GEOM
    cache = cb.simple_cache(g, cb.core_layout(kvx_provider, opts.memory), dtype, seed=28)
    slots = cb.spread_slots(g, SCALES_BATCH_TOKENS, 29).tolist()
    for i in (0, 150, SCALES_BATCH_TOKENS - 1):
        slots[i] = -1
    spec = dict(SCALES_BATCH[scales])
    stride = spec.pop("stride", None)
    kw = _scale_kw(spec)
    if stride is not None:
        kw = {k: cb.replace(v, stride=stride) if k.endswith("_desc") else v for k, v in kw.items()}
    desc = ", ".join(f"{k[0].upper()} {v[1]} ({'PER_HEAD' if v[0] == 'h' else 'PER_TENSOR'})" for k, v in spec.items()
                     if k.endswith("_desc"))
    case = cb.write_case(cache, slots, io_dtype=DType.F32, seed=30, **kw,
                         label=f"{SCALES_BATCH_TOKENS}-token f32 -> {NAMES[dtype]} write, {g.num_kv_heads} heads, "
                               f"scales {desc}" + (", k_scale / v_scale 9.0" if "k_scale" in spec else "")
                               + (f", stride[0] {stride}" if stride is not None else ""))
    verify_write(kvx_provider, case, opts, clause=CL_SCALES_BATCH, feature="fp8")


#: malformations of one side's PER_HEAD scale descriptor (4 heads) in ``fp8.write.scale_desc_invalid``
SCALE_DESC_BAD = {
    "head_shape_plus1": lambda s, h: {f"desc.{s}_scale_desc.shape[0]": h + 1},
    "head_shape_minus1": lambda s, h: {f"desc.{s}_scale_desc.shape[0]": h - 1},
    "head_ndim2": lambda s, h: {f"desc.{s}_scale_desc.ndim": 2, f"desc.{s}_scale_desc.shape[1]": 1},
    "head_ndim0": lambda s, h: {f"desc.{s}_scale_desc.ndim": 0},
    "dtype_f16": lambda s, h: {f"desc.{s}_scale_desc.dtype": int(DType.F16)},
    "granularity_99": lambda s, h: {f"desc.{s}_scale_desc.granularity": 99},
}
CL_SCALE_DESC_BAD = (CL_FP8 + "; spec 6.6, 6.9, 7 (each side's scale descriptor validated: dtype F32, a granularity "
                     "of the enum, PER_HEAD of ndim 1 and shape [num_kv_heads]; same for V), in a call of any size")


@conformance("fp8.write.scale_desc_invalid", CL_SCALE_DESC_BAD, REQUIRED, "fp8", "write", feature="fp8")
@pytest.mark.parametrize("tokens", [10, 300], ids=["tok10", "tok300"])
@pytest.mark.parametrize("bad", list(SCALE_DESC_BAD))
@pytest.mark.parametrize("side", ["k", "v"])
@pytest.mark.parametrize("dtype", FP8_PARAMS)
def test_fp8_write_scale_desc_invalid(kvx_provider, kvx_call_options, dtype, side, bad, tokens):
    """A quantizing F32 write (4 heads) into an FP8 cache whose K and V scale descriptors are PER_HEAD
    but for one field of one side: a PER_HEAD shape of 5 or 3 values, ``ndim`` 2 (``[4, 1]``) or 0, dtype
    F16, or granularity 99. INVALID_ARGUMENT and nothing written, whichever side and at 10 tokens as at
    300 (R-FP8: "Same for V"). The catalog's rules ``R-FP8.scale_dtype``, ``.scale_granularity`` and
    ``.per_head_shape`` draw one case each, all three on K's side, and the generated invalid writes are
    of 24 tokens at most: a write path past 24 tokens that checks K's PER_HEAD shape alone and reads
    num_kv_heads values of V's was never called with a malformed V descriptor."""
    from kvx_conformance.cases.checks import partial_write

    opts = kvx_call_options()
    g = SCALES_BATCH_GEOM
    h = g.num_kv_heads
    cache = cb.simple_cache(g, cb.core_layout(kvx_provider, opts.memory), dtype, seed=47)
    case = cb.write_case(cache, cb.spread_slots(g, tokens, 48), io_dtype=DType.F32, seed=49,
                         k_scale_desc=cb.scale_spec([0.5, 1.7, 0.093, 2.6], ScaleGranularity.PER_HEAD),
                         v_scale_desc=cb.scale_spec([2.25, 0.061, 0.75, 1.3], ScaleGranularity.PER_HEAD),
                         overrides=SCALE_DESC_BAD[bad](side, h),
                         label=f"{tokens}-token f32 -> {NAMES[dtype]} write, {h} heads, PER_HEAD scales, "
                               f"{side.upper()} scale descriptor {bad}")
    verify_write(kvx_provider, case, opts, clause=CL_SCALE_DESC_BAD, feature="fp8", expect=Status.INVALID_ARGUMENT,
                 partial=partial_write(case))


#: (dtype, block_size, slot dtype, IO dtype) of ``fp8.write.block_size_non_pow2_batch``
FP8_NON_POW2 = [pytest.param(d, bs, sd, io, id=f"{NAMES[d]}-bs{bs}")
                for d, bs, sd, io in ((DType.F8_E4M3, 48, DType.S32, DType.F32),
                                      (DType.F8_E4M3, 528, DType.S64, DType.BF16),
                                      (DType.F8_E5M2, 48, DType.S64, DType.F16),
                                      (DType.F8_E5M2, 528, DType.S32, DType.F32))]
CL_FP8_NON_POW2 = (CL_FP8 + "; spec 4.1 (block_idx = slot_idx / block_size, offset = slot_idx % block_size), 7.1 "
                   "(only KV_OFFSETS requires a power-of-two block_size)")


@conformance("fp8.write.block_size_non_pow2_batch", CL_FP8_NON_POW2, REQUIRED, "fp8", "write", feature="fp8")
@pytest.mark.parametrize("dtype,block_size,slot_dtype,io_dtype", FP8_NON_POW2)
def test_fp8_write_block_size_non_pow2_batch(kvx_provider, kvx_call_options, dtype, block_size, slot_dtype, io_dtype):
    """``write.slots.block_size_non_pow2`` as a quantizing write: F32 / BF16 / F16 rows into an E4M3 / E5M2
    cache (the core layout) of 3 blocks of 48 or 528 tokens, every slot once, shuffled (144 or 1584
    tokens), a PER_TENSOR K scale and PER_HEAD V scales. The writes into blocks of no power of two past 24
    tokens are of F16 caches and F16 rows (``write.slots.block_size_non_pow2*``), and the quantizing
    writes of the other tests use blocks of a power of two: only ``generated.batch.write`` meets a
    quantizing kernel that takes the block offset with a mask (``slot & (block_size - 1)``, right for
    powers of two only), when its draw holds an FP8 cache of blocks of 3, 5 or 200 tokens (the default
    run's does; another ``--seed`` may not). This test makes that call whatever the draw."""
    opts = kvx_call_options()
    g = Geometry(num_blocks=3, block_size=block_size, num_kv_heads=2, head_dim=8)
    cache = cb.simple_cache(g, cb.core_layout(kvx_provider, opts.memory), dtype, seed=43)
    slots = cb.rng_for(44 + block_size).permutation(g.num_slots)
    case = cb.write_case(cache, slots, io_dtype=io_dtype, slot_dtype=slot_dtype, seed=45,
                         k_scale_desc=cb.scale_spec([0.37]),
                         v_scale_desc=cb.scale_spec([2.5, 0.11], ScaleGranularity.PER_HEAD),
                         label=f"{NAMES[io_dtype]} -> {NAMES[dtype]} cache, block_size {block_size}, every slot once "
                               f"({slot_dtype.name} slots), K scale 0.37 (PER_TENSOR), V scales [2.5, 0.11] (PER_HEAD)")
    verify_write(kvx_provider, case, opts, clause=CL_FP8_NON_POW2, feature="fp8")


CL_PER_HEAD = CL_FP8 + " (PER_HEAD: head h is quantized with the value of head h, for any num_kv_heads)"


@conformance("fp8.write.per_head_many_heads", CL_PER_HEAD, REQUIRED, "fp8", "write", feature="fp8")
@pytest.mark.parametrize("heads", [8, 16])
@pytest.mark.parametrize("dtype", FP8_PARAMS)
def test_fp8_write_per_head_many_heads(kvx_provider, kvx_call_options, heads, dtype):
    """PER_HEAD K and V scales with 8 and 16 KV heads (Llama-3-8B has 8), every head's scale distinct:
    a provider that loads the scales in vectors of 4 or 8 and reuses them (head h % 4) fails here."""
    opts = kvx_call_options()
    g = Geometry(num_blocks=6, block_size=4, num_kv_heads=heads, head_dim=8)
    cache = cb.simple_cache(g, cb.core_layout(kvx_provider, opts.memory), dtype, seed=24)
    rng = cb.rng_for(25 + heads)
    # distinct scales, a factor 1.3 or more apart, in random head order
    ks = (0.05 * 1.3 ** rng.permutation(heads)).astype(np.float32)
    vs = (0.04 * 1.37 ** rng.permutation(heads)).astype(np.float32)
    case = cb.write_case(cache, cb.spread_slots(g, 12, 26), io_dtype=DType.F32, seed=27,
                         k_scale_desc=cb.scale_spec(ks, ScaleGranularity.PER_HEAD),
                         v_scale_desc=cb.scale_spec(vs, ScaleGranularity.PER_HEAD),
                         label=f"f32 -> {NAMES[dtype]} cache, {heads} heads, PER_HEAD scales K {ks.tolist()} "
                               f"V {vs.tolist()}")
    verify_write(kvx_provider, case, opts, clause=CL_PER_HEAD, feature="fp8")


@conformance("fp8.write.scale_pointer_fallback", "spec 6.9 (with k_scale_desc.data NULL, implementations MAY fall "
             "back to k_scale / v_scale as per-tensor F32); R-FP8", INFORMATIONAL, "fp8", "write", feature="fp8")
@pytest.mark.parametrize("dtype", FP8_PARAMS)
def test_fp8_write_scale_pointer(kvx_provider, kvx_call_options, dtype):
    """The flat k_scale / v_scale pointers alone: the reading uses them (R-FP8); the spec lets a
    provider decline that fallback, so this result does not weigh on certification. A provider
    that declines it by refusing the call (UNSUPPORTED or INVALID_ARGUMENT, nothing written) is
    not failed here even where it claims ``fp8``: it takes the other branch of a MAY."""
    opts = kvx_call_options()
    try:
        _write(kvx_provider, opts, dtype, DType.F32, 10, feature="fp8", clause=CL_FP8, k_scale=0.37, v_scale=2.5)
    except Unsupported as e:
        # the same write with the scales in scalar descriptors: served (and correct), the refusal was of the
        # fallback alone; refused too, FP8 quantization is refused altogether (Unsupported as usual)
        _write(kvx_provider, opts, dtype, DType.F32, 10, feature="fp8", clause=CL_FP8,
               k_scale_desc=cb.scale_spec([0.37], scalar=True), v_scale_desc=cb.scale_spec([2.5], scalar=True))
        pytest.skip(f"the provider declined the k_scale / v_scale fallback (spec 6.9: MAY), refusing the call "
                    f"with {e.refused_with} and writing nothing; it serves the same scales in descriptors")


CL_SCALE_STRIDE = ("spec 6.6 (scale descriptor: stride[] \"Scale strides\"), 4.2 (\"Implementations MUST honor "
                   "provided strides\"); R-FP8 (head h's value at data[h * stride[0]]: a correct result or "
                   "UNSUPPORTED)")
#: PER_HEAD scale descriptors whose values lie stride[0] elements apart (the elements between hold
#: a negative scale): K strided, V strided, both (2 heads); both with 8 heads (K stride 3, V stride 2)
SCALE_STRIDES = {"k_stride2": (2, 1, 2), "v_stride3": (1, 3, 2), "both_stride5": (5, 5, 2),
                 "heads8_both_strided": (3, 2, 8)}


@conformance("fp8.write.scale_strides", CL_SCALE_STRIDE, REQUIRED, "fp8", "write", feature="scale_strides")
@pytest.mark.parametrize("strides", list(SCALE_STRIDES))
@pytest.mark.parametrize("dtype", FP8_PARAMS)
def test_fp8_write_scale_strides(kvx_provider, kvx_call_options, strides, dtype):
    """A provider that reads the per-head values as adjacent quantizes a head by the gap's negative
    scale; the reference refuses such descriptors (UNSUPPORTED), which the spec allows. With 8 heads
    (Llama-3-8B) too: a provider that loads 8 or more heads' values as one vector of adjacent floats,
    and honours stride[0] only in its loop for fewer heads, fails ``heads8_both_strided``."""
    ks, vs, heads = SCALE_STRIDES[strides]
    opts = kvx_call_options()
    g = G if heads == G.num_kv_heads else Geometry(num_blocks=6, block_size=4, num_kv_heads=heads, head_dim=8)
    cache = cb.simple_cache(g, cb.core_layout(kvx_provider, opts.memory), dtype, seed=18)
    rng = cb.rng_for(20)
    kvals = [0.5, 1.7] if heads == 2 else (0.05 * 1.3 ** rng.permutation(heads)).astype(np.float32).tolist()
    vvals = [2.25, 0.093] if heads == 2 else (0.04 * 1.37 ** rng.permutation(heads)).astype(np.float32).tolist()
    k = cb.replace(cb.scale_spec(kvals, ScaleGranularity.PER_HEAD), stride=ks)
    v = cb.replace(cb.scale_spec(vvals, ScaleGranularity.PER_HEAD), stride=vs)
    case = cb.write_case(cache, cb.spread_slots(g, 12, 18), io_dtype=DType.F32, seed=19, k_scale_desc=k,
                         v_scale_desc=v, label=f"F32 -> {NAMES[dtype]} cache, {heads} heads, PER_HEAD scales with "
                                               f"stride[0] {ks} (K) and {vs} (V)")
    verify_write(kvx_provider, case, opts, clause=CL_SCALE_STRIDE, feature="scale_strides",
                 served=("R-FP8.scale_stride",))


CL_SCALE_UNSET = ("spec 6.6, 4.2; R-FP8 (PER_HEAD values: stride[0] 0 or 1 reads them as adjacent, 0 being the "
                  "field left unset)")


@conformance("fp8.write.scale_stride_unset", CL_SCALE_UNSET, REQUIRED, "fp8", "write", feature="fp8")
@pytest.mark.parametrize("dtype", FP8_PARAMS)
def test_fp8_write_scale_stride_unset(kvx_provider, kvx_call_options, dtype):
    """PER_HEAD scales of 8 heads whose descriptor leaves ``stride[0]`` at 0 (every other test sends 1):
    the values are adjacent, head h's at ``data[h]`` (R-FP8). A provider that reads stride 0 as a
    broadcast quantizes every head by head 0's scale."""
    opts = kvx_call_options()
    g = Geometry(num_blocks=6, block_size=4, num_kv_heads=8, head_dim=8)
    cache = cb.simple_cache(g, cb.core_layout(kvx_provider, opts.memory), dtype, seed=21)
    rng = cb.rng_for(22)
    kvals = (0.05 * 1.3 ** rng.permutation(8)).astype(np.float32).tolist()
    vvals = (0.04 * 1.37 ** rng.permutation(8)).astype(np.float32).tolist()
    k = cb.replace(cb.scale_spec(kvals, ScaleGranularity.PER_HEAD), stride=0)
    v = cb.replace(cb.scale_spec(vvals, ScaleGranularity.PER_HEAD), stride=0)
    case = cb.write_case(cache, cb.spread_slots(g, 12, 23), io_dtype=DType.F32, seed=24, k_scale_desc=k,
                         v_scale_desc=v, label=f"F32 -> {NAMES[dtype]} cache, 8 heads, PER_HEAD scales with stride[0] "
                                               f"0 (K and V)")
    verify_write(kvx_provider, case, opts, clause=CL_SCALE_UNSET, feature="fp8")


CL_FP8_MIXED = CL_FP8 + " (each cache quantized to its own format); R-CACHE (K and V dtypes may differ)"
FP8_PAIRS = [pytest.param(DType.F8_E4M3, DType.F8_E5M2, id="k_e4m3-v_e5m2"),
             pytest.param(DType.F8_E5M2, DType.F8_E4M3, id="k_e5m2-v_e4m3")]


@conformance("fp8.write.mixed_formats", CL_FP8_MIXED, REQUIRED, "fp8", "write", feature="fp8")
@pytest.mark.parametrize("io_dtype", [DType.F32, DType.F16, DType.BF16], ids=["io_f32", "io_f16", "io_bf16"])
@pytest.mark.parametrize("k_dtype,v_dtype", FP8_PAIRS)
def test_fp8_write_mixed_formats(kvx_provider, kvx_call_options, k_dtype, v_dtype, io_dtype):
    """An E4M3 K cache beside an E5M2 V cache, and the reverse, quantizing with a PER_TENSOR K
    scale and PER_HEAD V scales: each side in its own format (a provider that quantizes V to
    K's format fails). K and V of different dtypes are also ``mixed_layouts``: a refusal is
    excused unless ``fp8`` and ``mixed_layouts`` are both claimed."""
    opts = kvx_call_options()
    kind = cb.core_layout(kvx_provider, opts.memory)
    cache = cb.make_cache(G, cb.layout(G, kind, k_dtype), cb.layout(G, kind, v_dtype), seed=28)
    case = cb.write_case(cache, cb.spread_slots(G, 12, 29), io_dtype=io_dtype, seed=30,
                         k_scale_desc=cb.scale_spec([0.37]),
                         v_scale_desc=cb.scale_spec([2.5, 0.11], ScaleGranularity.PER_HEAD),
                         label=f"{NAMES[io_dtype]} -> {NAMES[k_dtype]} K cache and {NAMES[v_dtype]} V cache, "
                               f"K scale 0.37 (PER_TENSOR), V scales [2.5, 0.11] (PER_HEAD)")
    verify_write(kvx_provider, case, opts, clause=CL_FP8_MIXED, feature=("fp8", "mixed_layouts"))


@conformance("fp8.write.io_dtypes", CL_FP8, REQUIRED, "fp8", "write", feature="fp8")
@pytest.mark.parametrize("io_dtype", [DType.F16, DType.BF16], ids=["io_f16", "io_bf16"])
@pytest.mark.parametrize("dtype", FP8_PARAMS)
def test_fp8_write_io_dtypes(kvx_provider, kvx_call_options, io_dtype, dtype):
    _write(kvx_provider, kvx_call_options(), dtype, io_dtype, 11, feature="fp8", clause=CL_FP8,
           **_scale_kw(SCALES["per_tensor_desc"]))


@conformance("fp8.write.saturation_and_specials", CL_FP8 + " (clamp to the largest finite value; NaN stays NaN)",
             REQUIRED, "fp8", "write", feature="fp8")
@pytest.mark.parametrize("dtype", FP8_PARAMS)
def test_fp8_saturation(kvx_provider, kvx_call_options, dtype):
    opts = kvx_call_options()
    cache = _cache(kvx_provider, opts.memory, dtype, 12)
    case = cb.write_case(cache, cb.spread_slots(G, 10, 12), io_dtype=DType.F32, seed=13, specials=True,
                         k_scale_desc=cb.scale_spec([0.5]), label="inf, NaN, huge values into FP8")
    big = np.float32(1e6 if dtype == DType.F8_E4M3 else 1e9)
    key = case.key.copy()
    key[8::5] = big * np.sign(key[8::5] + np.float32(0.5))
    case = cb.replace(case, key=key)
    verify_write(kvx_provider, case, opts, clause=CL_FP8, feature="fp8")


CL_FP8_SAT_IO = CL_FP8 + " (clamp to the largest finite value, +-inf too, from every IO dtype; NaN stays NaN)"
#: F16 / BF16 inputs at and past the largest finite E4M3 (448) and E5M2 (57344) values: the midpoints
#: above them (464, 61440), the largest finite inputs, inf; NaN; and 0.0, whose negative -0.0 must store the
#: -0 code 0x80 (docs/numerics.md: every finite code, +-0; a sign taken from ``x < 0`` stores +0)
SAT_IO_VALUES = [np.inf, 65504.0, 63488.0, 61440.0, 61408.0, 58000.0, 57344.0, 3.0e38, 1.0e6, 480.0, 464.0, 456.0,
                 448.0, np.nan, 0.0]


@conformance("fp8.write.saturation_io_dtypes", CL_FP8_SAT_IO, REQUIRED, "fp8", "write", feature="fp8")
@pytest.mark.parametrize("io_dtype", [DType.F16, DType.BF16], ids=["io_f16", "io_bf16"])
@pytest.mark.parametrize("dtype", FP8_PARAMS)
def test_fp8_saturation_io_dtypes(kvx_provider, kvx_call_options, dtype, io_dtype):
    """F16 and BF16 inputs at and past the largest finite FP8 value, written with no scale (scale
    1.0): they saturate to +-448 / +-57344, inf included, as F32 inputs do
    (``fp8.write.saturation_and_specials``, F32 IO with a scale). A path that converts unscaled
    F16 into E5M2 by rounding away F16's low byte without saturating (``__NV_NOSAT``) stores inf for
    |x| >= 61440."""
    opts = kvx_call_options()
    cache = _cache(kvx_provider, opts.memory, dtype, 31)
    case = cb.write_case(cache, cb.spread_slots(G, 10, 31), io_dtype=io_dtype, seed=32,
                         label=f"{NAMES[io_dtype]} -> {NAMES[dtype]} cache, no scale, values at and past the "
                               f"largest finite value")
    case = _with_sat_values(case, io_dtype, 33, slice(0, None, 2), slice(1, None, 2), permute_key=False)
    verify_write(kvx_provider, case, opts, clause=CL_FP8_SAT_IO, feature="fp8")


def _with_sat_values(case, io_dtype: DType, seed: int, key_at: slice, value_at: slice, permute_key: bool = True):
    """``case`` with ``SAT_IO_VALUES`` and their negatives (in ``io_dtype``) at the elements ``key_at`` of its
    key rows and ``value_at`` of its value rows, repeated, in an order drawn from ``seed``."""
    vals = np.array(SAT_IO_VALUES, np.float32)
    vals = np.concatenate([vals, -vals]).astype(np_dtype(io_dtype))
    rng = cb.rng_for(seed)
    key, value = case.key.copy(), case.value.copy()
    key[key_at] = np.resize(rng.permutation(vals) if permute_key else vals, key[key_at].size)
    value[value_at] = np.resize(rng.permutation(vals), value[value_at].size)
    return cb.replace(case, key=key, value=value)


#: (geometry, tokens) of ``fp8.write.batch``: 2 heads x 32 dims, 4096 tokens; 40 heads x 16 dims (more heads
#: than a table of 8 or 16 per-head scales holds), 1024 tokens
FP8_BATCHES = {"h2_d32": (Geometry(num_blocks=320, block_size=16, num_kv_heads=2, head_dim=32), 4096),
               "h40_d16": (Geometry(num_blocks=80, block_size=16, num_kv_heads=40, head_dim=16), 1024)}
CL_FP8_BATCH = CL_FP8_SAT_IO + " - in a prefill-sized write, per-head scales of any number of heads"


@conformance("fp8.write.batch", CL_FP8_BATCH, REQUIRED, "fp8", "write", feature="fp8")
@pytest.mark.parametrize("geom", list(FP8_BATCHES))
@pytest.mark.parametrize("io_dtype", [DType.F32, DType.F16, DType.BF16], ids=["io_f32", "io_f16", "io_bf16"])
@pytest.mark.parametrize("dtype", FP8_PARAMS)
def test_fp8_write_batch(kvx_provider, kvx_call_options, dtype, io_dtype, geom):
    """1024 to 4096 tokens quantized into an FP8 cache in one write (a PER_TENSOR K scale, PER_HEAD V
    scales, each head its own value; 2 or 40 heads), a few -1 slots: random normal values, and on
    every seventh element a value at or past the largest finite FP8 value, inf, NaN or +-0.0 (-0.0
    stores the -0 code 0x80: the random rows hold exact -0.0 only in F16, where tiny values
    underflow, so a bulk F32 / BF16 path taking the sign from ``x < 0`` passed them). The other
    quantizing writes hold at most 24 tokens (the E4M3 thread test 128) and, past 8 heads, 12
    tokens, so a bulk path taken past some token count that rounds or saturates otherwise (stores
    inf for ``|x / scale|`` past the largest finite value), or that keeps a table of 8 per-head
    scales, was never reached."""
    opts = kvx_call_options()
    g, tokens = FP8_BATCHES[geom]
    cache = cb.simple_cache(g, cb.core_layout(kvx_provider, opts.memory), dtype, seed=34)
    slots = cb.spread_slots(g, tokens, 35).tolist()
    for i in (0, 999, tokens // 2, tokens - 1):
        slots[i] = -1
    v_scales = [2.0, 0.75] if g.num_kv_heads == 2 else [0.1 * (1 + h) for h in range(g.num_kv_heads)]
    case = cb.write_case(cache, slots, io_dtype=io_dtype, seed=36, k_scale_desc=cb.scale_spec([0.5]),
                         v_scale_desc=cb.scale_spec(v_scales, ScaleGranularity.PER_HEAD),
                         label=f"{tokens}-token {NAMES[io_dtype]} -> {NAMES[dtype]} write, {g.num_kv_heads} heads, "
                               f"scales, values at and past the largest finite value, inf, NaN")
    case = _with_sat_values(case, io_dtype, 37, slice(3, None, 7), slice(5, None, 7))
    verify_write(kvx_provider, case, opts, clause=CL_FP8_BATCH, feature="fp8")


@conformance("fp8.write.raw_bytes", "spec 4.3; R-CONVERT (FP8 IO of the cache's dtype copies raw bytes)", REQUIRED,
             "fp8", "write", feature="fp8")
@pytest.mark.parametrize("dtype", FP8_PARAMS)
def test_fp8_write_raw(kvx_provider, kvx_call_options, dtype):
    _write(kvx_provider, kvx_call_options(), dtype, dtype, 14, feature="fp8", clause="spec 4.3; R-CONVERT",
           k_scale_desc=cb.scale_spec([3.0]))  # a scale, not applied to a raw copy


@conformance("fp8.gather.raw_bytes", "spec 4.3; R-CONVERT (gather from FP8 copies raw bytes)", REQUIRED, "fp8",
             "gather", feature="fp8")
@pytest.mark.parametrize("dtype", FP8_PARAMS)
def test_fp8_gather_raw(kvx_provider, kvx_call_options, dtype):
    _gather(kvx_provider, kvx_call_options(), dtype, dtype, 15, feature="fp8", clause="spec 4.3; R-CONVERT")


CL_FP8_RAW_BYTES = ("spec 4.3; R-CONVERT (an IO dtype equal to the FP8 cache dtype copies raw bytes), R-NAN-CLASS "
                    "(plain copies stay bit-exact, NaN bytes included; the rule does not depend on the size of the "
                    "call)")
#: gathers of ``fp8.gather.raw_every_byte``: id -> (PACKED table over G's 6 blocks, lengths, max_seq_len)
RAW_BYTE_GATHERS = {
    "seqs3": ([[0, 1, 2], [3, 4, 5], [5, 0, 2]], [12, 12, 9], 12),
    "seqs260": (cb.rng_for(62).integers(0, G.num_blocks, size=(260, 3)).tolist(),
                cb.rng_for(63).integers(0, 16, size=260).tolist(), 12),
}


@conformance("fp8.gather.raw_every_byte", CL_FP8_RAW_BYTES, REQUIRED, "fp8", "gather", feature="fp8")
@pytest.mark.parametrize("batch", list(RAW_BYTE_GATHERS))
@pytest.mark.parametrize("dtype", FP8_PARAMS)
def test_fp8_gather_raw_every_byte(kvx_provider, kvx_call_options, dtype, batch):
    """A raw gather (outputs of the cache's FP8 dtype) from K and V caches whose storage holds every one of
    the 256 byte values (each NaN byte of the format: E4M3 0x7F / 0xFF, E5M2 0x7D-0x7F / 0xFD-0xFF; E5M2's
    +-inf 0x7C / 0xFC; +-0; the largest finite values), shuffled, of 3 sequences and of a decode batch of 260
    (lengths 0 to 15 past max_seq_len 12): every byte gathered is copied as it is. Every other FP8 gather
    reads caches of finite values, so a batch path that moves the codes through F32 and back by a saturating
    conversion (E5M2 inf to 57344, every NaN to one NaN byte) was never seen."""
    opts = kvx_call_options()
    cache = _cache(kvx_provider, opts.memory, dtype, 60)
    rng = cb.rng_for(61)

    def every_byte(n: int) -> np.ndarray:
        reps = -(-n // 256)
        return np.concatenate([rng.permutation(256) for _ in range(reps)])[:n].astype(np.uint8).view(np_dtype(dtype))

    if cache.k_init.size < 256 or cache.v_init.size < 256:  # a harness fault: some byte would be missing
        raise RuntimeError("fp8.gather.raw_every_byte: the cache storage holds fewer than 256 elements")
    cache = cb.replace(cache, k_init=every_byte(cache.k_init.size), v_init=every_byte(cache.v_init.size))
    table, lens, msl = RAW_BYTE_GATHERS[batch]
    case = cb.packed_gather(cache, table, lens, msl, seed=64,
                            label=f"{len(lens)}-sequence raw gather (max_seq_len {msl}) from {NAMES[dtype]} caches "
                                  f"holding every byte value (NaN and inf bytes, +-0) into {NAMES[dtype]} outputs")
    verify_gather(kvx_provider, case, opts, clause=CL_FP8_RAW_BYTES, feature="fp8")


@conformance("fp8.gather.dequantize_unsupported", "spec 4.3; R-CONVERT (no cache-level scale in v1.1)", RECOMMENDED,
             "fp8", "gather", feature="fp8")
@pytest.mark.parametrize("dtype", FP8_PARAMS)
def test_fp8_gather_dequantize(kvx_provider, kvx_call_options, dtype):
    opts = kvx_call_options()
    cache = _cache(kvx_provider, opts.memory, dtype, 16)
    case = cb.packed_gather(cache, cb.distinct_table(G, 1, 2, 16), [6], 8, io_dtype=DType.F16, seed=17,
                            label="FP8 cache into F16 output")
    # the reference refuses with UNSUPPORTED; a refusal as INVALID_ARGUMENT is read the same way (spec 8:
    # "Malformed descriptor or unsupported field"; readings R-REFUSAL), and no SHOULD of the spec names
    # UNSUPPORTED here
    verify_gather(kvx_provider, case, opts, clause="spec 4.3, 8; R-CONVERT, R-REFUSAL", expect=Status.UNSUPPORTED,
                  statuses=(Status.UNSUPPORTED, Status.INVALID_ARGUMENT))


# FP8 write with scales where ``x / s`` and ``x * RN32(1 / s)`` give different FP8 codes.
CL_FP8_DIV = ("spec 6.6, 6.9; R-FP8 (q = float32(x) / scale: IEEE FP32 division, not a reciprocal multiply, "
              "then RNE)")
#: scales whose F32 reciprocal is inexact and leaves many discriminating values in both formats
DIV_SCALES = {
    "per_tensor_desc": {"k_scale_desc": ("t", [0.21]), "v_scale_desc": ("t", [2.9])},
    "per_head_desc": {"k_scale_desc": ("h", [0.093, 1.7]), "v_scale_desc": ("h", [0.0071, 13.7])},
}
#: discriminating values the search must find per (dtype, scale), else the test has lost its teeth
DIV_MIN_VALUES = 32


@functools.lru_cache(maxsize=None)
def _division_values(dtype: DType, scale: float) -> np.ndarray:
    """F32 ``x`` (both signs) with ``RN_fp8(x / s) != RN_fp8(x * RN32(1 / s))`` for ``s = float32(scale)``.

    The candidates are ``RN32(m * s)`` and its 2 neighbouring F32 values either side, for
    every midpoint ``m`` between adjacent finite FP8 values (subnormals included): there
    ``x / s`` sits within an ulp of an FP8 rounding boundary, where the reciprocal
    product's extra rounding can move it across. Both paths go through the oracle's
    quantize (clamp, then RNE as ml_dtypes casts); deterministic, no randomness."""
    from kvx_conformance.reference_impl.convert import quantize

    s = np.float32(scale)
    fp8 = np.arange(0x80, dtype=np.uint8).view(np_dtype(dtype)).astype(np.float32)
    fp8 = np.unique(fp8[np.isfinite(fp8)])
    mids = (fp8[:-1] + fp8[1:]) / np.float32(2)  # exact in F32
    bits = (mids * s).view(np.uint32).astype(np.int64)[:, None] + np.arange(-2, 3)
    x = bits.astype(np.uint32).view(np.float32).ravel()
    x = np.unique(np.concatenate([x, -x]))
    x = x[np.isfinite(x) & (x != 0)]
    recip = np.float32(1) / s
    by_div = quantize(x, s, dtype).view(np.uint8)
    by_recip = quantize(x * recip, np.float32(1), dtype).view(np.uint8)
    return x[by_div != by_recip]


def _division_io(io: np.ndarray, dtype: DType, granularity: str, scales, n: int, seed: int,
                 g: Geometry = G) -> np.ndarray:
    """``io`` (dense ``[n, H, D]`` F32 of geometry ``g``) refilled with discriminating values for the
    scale of each head."""
    rng = cb.rng_for(seed)
    out = io.reshape(n, g.num_kv_heads, g.head_dim).copy()
    for h in range(g.num_kv_heads):
        s = scales[0] if granularity == "t" else scales[h]
        pool = _division_values(dtype, s)
        if len(pool) < DIV_MIN_VALUES:  # a harness fault (outcome "error"), never a skip
            raise RuntimeError(f"fp8.write.division_not_reciprocal: only {len(pool)} values found where "
                               f"{NAMES[dtype]}(x / {s}) and {NAMES[dtype]}(x * RN32(1 / {s})) differ, "
                               f"fewer than {DIV_MIN_VALUES}: the test would not tell division from a reciprocal")
        out[:, h, :] = rng.choice(pool, size=(n, g.head_dim), replace=len(pool) < n * g.head_dim)
    return out.reshape(io.shape)


@conformance("fp8.write.division_not_reciprocal", CL_FP8_DIV, REQUIRED, "fp8", "write", feature="fp8")
@pytest.mark.parametrize("scales", list(DIV_SCALES))
@pytest.mark.parametrize("dtype", FP8_PARAMS)
def test_fp8_write_division_not_reciprocal(kvx_provider, kvx_call_options, scales, dtype):
    """Every K and V element sits where the R-FP8 division and a multiply by the F32
    reciprocal of the scale round to different FP8 codes (values near FP8 rounding
    midpoints, times the scale), so a provider computing ``x * (1 / scale)`` fails here."""
    opts = kvx_call_options()
    spec = DIV_SCALES[scales]
    cache = _cache(kvx_provider, opts.memory, dtype, 18)
    n = 12
    case = cb.write_case(cache, cb.spread_slots(G, n, 18), io_dtype=DType.F32, seed=19,
                         label=f"f32 -> {NAMES[dtype]} cache, x / scale vs x * (1 / scale) discriminating values",
                         **_scale_kw(spec))
    (kg, ks), (vg, vs) = spec["k_scale_desc"], spec["v_scale_desc"]
    key = _division_io(case.key, dtype, kg, ks, n, 20)
    value = _division_io(case.value, dtype, vg, vs, n, 21)
    case = cb.replace(case, key=key, value=value)
    verify_write(kvx_provider, case, opts, clause=CL_FP8_DIV, feature="fp8")


CL_FP8_DIV_BATCH = CL_FP8_DIV + " - at any call size"


@conformance("fp8.write.division_not_reciprocal_batch", CL_FP8_DIV_BATCH, REQUIRED, "fp8", "write", feature="fp8")
@pytest.mark.parametrize("scales", list(DIV_SCALES))
@pytest.mark.parametrize("dtype", FP8_PARAMS)
def test_fp8_write_division_not_reciprocal_batch(kvx_provider, kvx_call_options, scales, dtype):
    """``fp8.write.division_not_reciprocal`` in a 4096-token write (the geometry of ``fp8.write.batch``,
    2 heads x 32): every element discriminating. The other quantizing writes past 1024 tokens hold
    random values and scales of 0.5, 2 and 0.75, whose reciprocals are exact or leave almost no value
    where division and a reciprocal multiply differ, so a bulk path that multiplies by the reciprocal
    past some token count was never seen."""
    opts = kvx_call_options()
    spec = DIV_SCALES[scales]
    g, tokens = FP8_BATCHES["h2_d32"]
    cache = cb.simple_cache(g, cb.core_layout(kvx_provider, opts.memory), dtype, seed=38)
    case = cb.write_case(cache, cb.spread_slots(g, tokens, 39).tolist(), io_dtype=DType.F32, seed=40,
                         label=f"{tokens}-token f32 -> {NAMES[dtype]} write, {g.num_kv_heads} heads x {g.head_dim}, "
                               f"x / scale vs x * (1 / scale) discriminating values", **_scale_kw(spec))
    (kg, ks), (vg, vs) = spec["k_scale_desc"], spec["v_scale_desc"]
    key = _division_io(case.key, dtype, kg, ks, tokens, 41, g)
    value = _division_io(case.value, dtype, vg, vs, tokens, 42, g)
    case = cb.replace(case, key=key, value=value)
    verify_write(kvx_provider, case, opts, clause=CL_FP8_DIV_BATCH, feature="fp8")
