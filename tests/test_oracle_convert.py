"""Oracle conversions (readings R-CONVERT, R-FP8) against ml_dtypes, numpy and hand-made bit patterns."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from kvx_conformance.abi.dtypes import bits_view
from kvx_conformance.abi.header import DType
from kvx_conformance.reference_impl import convert


def _bf16_rne_bits(x: np.ndarray) -> np.ndarray:
    """FP32 -> BF16 round-to-nearest-even on the bit pattern (finite inputs), written out by hand."""
    u = x.view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def test_f32_to_bf16_is_rne_on_bits():
    rng = np.random.default_rng(1)
    u = rng.integers(0, 1 << 32, size=20000, dtype=np.uint64).astype(np.uint32)
    u[:8] = [0x3F808000, 0x3F818000, 0x3F80FFFF, 0x3F807FFF, 0x7F7FFFFF, 0x00008000, 0x80018000, 0x3F800001]
    x = u.view(np.float32)
    keep = np.isfinite(x) & (np.abs(x) < np.float32(3.3e38))  # no overflow into inf here
    x = x[keep]
    got = bits_view(convert.convert(x, DType.F32, DType.BF16))
    assert np.array_equal(got, _bf16_rne_bits(x))
    # ties by hand: 1 + 2^-8 (0x3F808000) ties to even 1.0 (0x3F80); 0x3F818000 ties up to 0x3F82
    assert bits_view(convert.convert(np.array([1 + 2.0**-8], np.float32), DType.F32, DType.BF16))[0] == 0x3F80
    assert bits_view(convert.convert(np.array([0x3F818000], np.uint32).view(np.float32), DType.F32, DType.BF16))[0] == 0x3F82


def test_overflow_to_inf_for_f16_and_bf16():
    x = np.array([65520.0, -1e6, 3.4e38], np.float32)  # 65520 is the F16 rounding boundary (ties to inf)
    f16 = convert.convert(x, DType.F32, DType.F16)
    assert np.isinf(f16).all() and f16[1] < 0
    assert bits_view(convert.convert(np.array([65519.0], np.float32), DType.F32, DType.F16))[0] == 0x7BFF
    bf = convert.convert(np.array([np.finfo(np.float32).max], np.float32), DType.F32, DType.BF16)
    assert np.isinf(bf.astype(np.float32)).all()


@pytest.mark.parametrize("src", [DType.F16, DType.BF16, DType.F32])
@pytest.mark.parametrize("dst", [DType.F16, DType.BF16, DType.F32])
def test_baseline_pairs_go_through_fp32(src, dst):
    rng = np.random.default_rng(int(src) * 10 + int(dst))
    from kvx_conformance.cases.generators import random_finite

    x = random_finite(rng, src, 5000)
    got = convert.convert(x, src, dst)
    want = x.astype(np.float32)
    with np.errstate(over="ignore"):
        want = want.astype(np.float16) if dst == DType.F16 else want.astype(ml_dtypes.bfloat16) if dst == DType.BF16 else want
    assert np.array_equal(bits_view(got), bits_view(np.asarray(want)))


def test_same_dtype_copies_bits():
    x = np.array([0x7E01, 0xFE00, 0x8000, 0x0001], np.uint16).view(np.float16)  # NaN payloads, -0, subnormal
    assert np.array_equal(bits_view(convert.convert(x, DType.F16, DType.F16)), bits_view(x))


@pytest.mark.parametrize(
    "dst, x, scale, byte",
    [
        # E4M3: 1.0 = 0 0111 000 = 0x38; step 0.125 near 1
        (DType.F8_E4M3, 1.0625, 1.0, 0x38),  # tie between 1.0 and 1.125 -> even (1.0)
        (DType.F8_E4M3, 1.1875, 1.0, 0x3A),  # tie between 1.125 and 1.25 -> even (1.25 = 0x3A)
        (DType.F8_E4M3, 0.53125, 0.5, 0x38),  # 0.53125 / 0.5 = 1.0625 -> 0x38
        (DType.F8_E4M3, 1000.0, 2.0, 0x7E),  # 500 saturates to 448 = 0 1111 110
        (DType.F8_E4M3, -1e30, 1.0, 0xFE),  # -448
        (DType.F8_E4M3, np.inf, 1.0, 0x7E),  # inf saturates
        (DType.F8_E4M3, 3.0, 0.0, 0x7E),  # x / 0 = inf -> 448
        # E5M2: 1.0 = 0 01111 00 = 0x3C; 57344 = 0 11110 11 = 0x7B
        (DType.F8_E5M2, 1e9, 1.0, 0x7B),
        (DType.F8_E5M2, -70000.0, 1.0, 0xFB),
        (DType.F8_E5M2, 1.125, 1.0, 0x3C),  # tie between 1.0 and 1.25 -> even 1.0
    ],
)
def test_fp8_quantize_by_hand(dst, x, scale, byte):
    got = convert.convert(np.array([x], np.float32), DType.F32, dst, scale=np.float32(scale))
    assert int(bits_view(got)[0]) == byte


def test_fp8_nan_stays_nan():
    for dst in (DType.F8_E4M3, DType.F8_E5M2):
        got = convert.convert(np.array([np.nan], np.float32), DType.F32, dst, scale=np.float32(1.0))
        assert np.isnan(got.astype(np.float32))[0]


def test_fp8_quantize_divides_not_multiplies_by_reciprocal():
    """R-FP8: q = x / scale in FP32. Find inputs where x * (1/scale) rounds to another FP8 value."""
    # candidates: E4M3 rounding midpoints times the scale, where x / scale is exactly the tie
    # and x * fl(1/scale) lands a hair off it
    codes = np.arange(0x01, 0x7E, dtype=np.uint8)
    lo = codes.view(ml_dtypes.float8_e4m3fn).astype(np.float32)
    hi = (codes + 1).view(ml_dtypes.float8_e4m3fn).astype(np.float32)
    mids = (lo + hi) / np.float32(2)
    found = 0
    for scale in map(np.float32, (3.0, 5.0, 7.0, 0.3, 1.7, 6.0, 11.0)):
        x = (mids * scale).astype(np.float32)
        div = np.clip(x / scale, -448, 448).astype(ml_dtypes.float8_e4m3fn)
        mul = np.clip(x * (np.float32(1) / scale), -448, 448).astype(ml_dtypes.float8_e4m3fn)
        differ = bits_view(div) != bits_view(mul)
        if differ.any():
            got = convert.convert(x[differ], DType.F32, DType.F8_E4M3, scale=scale)
            assert np.array_equal(bits_view(got), bits_view(div[differ])), float(scale)
            found += int(differ.sum())
    assert found, "no distinguishing input found; widen the search"


def test_fp8_from_f16_and_bf16_matches_ml_dtypes():
    rng = np.random.default_rng(3)
    for src in (DType.F16, DType.BF16):
        from kvx_conformance.cases.generators import random_finite

        x = random_finite(rng, src, 5000)
        for dst in (DType.F8_E4M3, DType.F8_E5M2):
            m = np.float32(ml_dtypes.finfo(ml_dtypes.float8_e4m3fn if dst == DType.F8_E4M3 else ml_dtypes.float8_e5m2).max)
            s = np.float32(0.75)
            with np.errstate(over="ignore"):
                q = x.astype(np.float32) / s
            want = np.clip(q, -m, m).astype(
                ml_dtypes.float8_e4m3fn if dst == DType.F8_E4M3 else ml_dtypes.float8_e5m2)
            got = convert.convert(x, src, dst, scale=s)
            assert np.array_equal(bits_view(got), bits_view(want)), (src, dst)


def test_supported_pairs():
    assert convert.supported(DType.F16, DType.F8_E4M3)  # write quantizes
    assert convert.supported(DType.F8_E5M2, DType.F8_E5M2)  # raw bytes
    assert not convert.supported(DType.F8_E4M3, DType.F16)  # FP8 -> other: UNSUPPORTED in v1.1
    assert not convert.supported(DType.F8_E4M3, DType.F8_E5M2)
    with pytest.raises(ValueError):
        convert.convert(np.zeros(1, ml_dtypes.float8_e4m3fn), DType.F8_E4M3, DType.F32)
