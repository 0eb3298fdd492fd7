"""FP4 codecs of the oracle (readings "FP4 extension"; docs/fp4.md) against an independent
scalar reference: E2M1 and E4M3 rounding by brute force over the enumerated grids."""
from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest

from kvx_conformance.reference_impl import fp4

F32 = np.float32
E2M1_GRID = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
SEED = 1234  # every random test below draws from default_rng(SEED + k)


# ----------------------------------------------------------------------------- independent reference


def e2m1_ref(q: float) -> int:
    """Nearest E2M1 code, ties to the even code, saturating at +-6 (NaN not expected)."""
    mag = min(abs(q), 6.0)
    best = min(range(8), key=lambda c: (abs(mag - E2M1_GRID[c]), c % 2))
    return best | (8 if math.copysign(1.0, q) < 0 else 0)


def e4m3_values() -> list[float]:
    """All non-negative finite E4M3 (fn) values by their bit formula, index == byte."""
    vals = []
    for byte in range(0x7F):
        e, m = byte >> 3, byte & 7
        vals.append(m / 8 * 2.0**-6 if e == 0 else (1 + m / 8) * 2.0 ** (e - 7))
    return vals


E4M3 = e4m3_values()


def e4m3_ref(v: float) -> int:
    """RNE byte of 0 <= v <= 448 (ties to even byte = even mantissa)."""
    return min(range(len(E4M3)), key=lambda b: (abs(v - E4M3[b]), b % 2))


def nvfp4_ref(x: np.ndarray, g: float) -> tuple[list[int], list[int], list[float]]:
    """Scalar NVFP4 of one vector: (codes, scale bytes, FP32 decoded values)."""
    g32 = F32(g)
    codes, scales, dec = [], [], []
    for blk in np.asarray(x, dtype=F32).reshape(-1, 16):
        amax = max(abs(float(v)) for v in blk)
        wanted = float(F32(amax) / (F32(6) * g32))
        byte = e4m3_ref(min(wanted, 448.0))
        s = F32(E4M3[byte])
        scales.append(byte)
        for v in blk:
            c = 0 if s * g32 == 0 else e2m1_ref(float(F32(v) / (s * g32)))
            codes.append(c)
            mag = F32(E2M1_GRID[c & 7] * (-1 if c & 8 else 1))
            dec.append(float((mag * s) * g32))
    return codes, scales, dec


def mxfp4_ref(x: np.ndarray, block: int, rule: str) -> tuple[list[int], list[int]]:
    codes, scales = [], []
    for blk in np.asarray(x, dtype=F32).reshape(-1, block):
        amax = max(abs(float(v)) for v in blk)
        if amax == 0:
            scales.append(0)
            codes += [0] * block
            continue
        if rule == "ceil":
            e = math.ceil(math.log2(float(F32(amax) / F32(6))))
        else:
            e = math.floor(math.log2(amax)) - 2
        e = max(-127, min(127, e))
        scales.append(e + 127)
        codes += [e2m1_ref(float(v) / 2.0**e) for v in blk]
    return codes, scales


def unpacked(codes_packed: np.ndarray) -> np.ndarray:
    return fp4.unpack_e2m1(codes_packed)


# ----------------------------------------------------------------------------- E2M1 primitives


def test_e2m1_code_table_matches_ml_dtypes():
    vals = fp4.e2m1_to_float(np.arange(16, dtype=np.uint8))
    want = [*E2M1_GRID, *(-v for v in E2M1_GRID)]
    assert np.array_equal(vals, np.array(want, dtype=F32)), f"E2M1 decode table {vals} != {want}"
    assert np.signbit(vals[8]), "code 8 must be -0"
    assert vals.tolist() == np.arange(16, dtype=np.uint8).view(ml_dtypes.float4_e2m1fn).astype(F32).tolist()


TIES = [(0.25, 0), (0.75, 2), (1.25, 2), (1.75, 4), (2.5, 4), (3.5, 6), (5.0, 6)]


@pytest.mark.parametrize("sign", [1.0, -1.0])
@pytest.mark.parametrize("tie,code", TIES)
def test_e2m1_ties_to_even_code(tie: float, code: int, sign: float):
    want = code | (8 if sign < 0 else 0)
    got = int(fp4.float_to_e2m1(np.array([sign * tie], F32))[0])
    assert got == want, f"E2M1_RNE({sign * tie}) = code {got}, expected even code {want}"
    above = np.nextafter(F32(tie), F32(10)) * F32(sign)
    below = np.nextafter(F32(tie), F32(0)) * F32(sign)
    assert int(fp4.float_to_e2m1(np.array([above], F32))[0]) == e2m1_ref(float(above))
    assert int(fp4.float_to_e2m1(np.array([below], F32))[0]) == e2m1_ref(float(below))
    assert e2m1_ref(float(above)) != e2m1_ref(float(below)), "the tie point must separate two codes"


def test_e2m1_saturates_and_keeps_sign_of_zero():
    x = np.array([6.0, 6.9, 7.0, 1e30, np.inf, -7.0, -np.inf, -0.0, -0.1, 0.1], F32)
    assert fp4.float_to_e2m1(x).tolist() == [7, 7, 7, 7, 7, 15, 15, 8, 8, 0]


def test_nibble_order_low_nibble_first():
    codes = np.array([[1, 7, 0, 15, 9, 2]], np.uint8)
    packed = fp4.pack_e2m1(codes)
    assert packed.tolist() == [[0x71, 0xF0, 0x29]], "element 2i goes in the low nibble, 2i+1 in the high nibble"
    assert np.array_equal(fp4.unpack_e2m1(packed), codes)
    x = np.zeros(16, F32)
    x[0], x[1] = 0.5, 6.0  # block amax 6 with g = 1: scale 1.0, codes are E2M1(x)
    packed, scales = fp4.nvfp4_encode(x)
    assert packed[0] == 0x71 and scales[0] == 0x38, f"got byte {packed[0]:#x}, scale {scales[0]:#x}"


# ----------------------------------------------------------------------------- NVFP4


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_nvfp4_tie_points_through_the_codec(sign: float):
    """With amax 6 and g 1 the block scale is exactly 1: every E2M1 tie reaches the rounding."""
    ties = [t for t, _ in TIES]
    x = np.zeros(16, F32)
    x[0] = 6.0
    x[1 : 1 + len(ties)] = sign * np.array(ties, F32)
    codes, scales = fp4.nvfp4_encode(x)
    got = unpacked(codes)[1 : 1 + len(ties)].tolist()
    want = [c | (8 if sign < 0 else 0) for _, c in TIES]
    assert scales.tolist() == [0x38], "scale of a block with amax 6 and g = 1 must be E4M3(1.0) = 0x38"
    assert got == want, f"tie codes {got}, expected {want}"


def test_nvfp4_ties_with_a_non_unit_scale():
    """Scale 1.5 * g (E4M3 exact) with g = 0.25: ties at t * 0.375 still go to the even code."""
    g = 0.25
    s = 1.5
    x = np.zeros(16, F32)
    x[0] = 6 * s * g
    x[1:8] = np.array([t for t, _ in TIES], F32) * F32(s * g)
    codes, scales = fp4.nvfp4_encode(x, g)
    assert scales[0] == 0x3C  # 1.5 in E4M3
    assert unpacked(codes)[1:8].tolist() == [c for _, c in TIES]


def test_nvfp4_matches_scalar_reference_on_random_data():
    rng = np.random.default_rng(SEED)
    x = (rng.standard_normal((24, 64)) * rng.lognormal(0, 2, (24, 1))).astype(F32)
    x[3, 16:32] = 0.0
    x[5, :16] *= 1e-6  # block scale deep in the E4M3 subnormals or underflowing
    g = float(fp4.nvfp4_global_scale(x))
    codes, scales = fp4.nvfp4_encode(x, g)
    dec = fp4.nvfp4_decode(codes, scales, g)
    for row in range(x.shape[0]):
        rc, rs, rd = nvfp4_ref(x[row], g)
        assert unpacked(codes[row]).tolist() == rc, f"seed {SEED} row {row}: codes differ from the scalar reference"
        assert scales[row].tolist() == rs, f"seed {SEED} row {row}: scales differ"
        assert dec[row].tolist() == rd, f"seed {SEED} row {row}: decoded values differ"


def _ulp_walk(x: float, steps: int) -> list[np.float32]:
    """FP32 values from ``steps`` ulps below ``x`` to ``steps`` ulps above."""
    out = [F32(x)]
    for direction in (F32(np.inf), F32(0)):
        v = F32(x)
        for _ in range(steps):
            v = np.nextafter(v, direction)
            out.append(v)
    return out


@pytest.mark.parametrize("g", [0.1, 0.3])
def test_nvfp4_rounding_order_is_pinned(g: float):
    """Inputs within a few ulps of E4M3 and E2M1 ties, where the pinned order of operations
    (s from amax / (6 g); codes from x / (s g), a division) decides the result."""
    g32 = F32(g)
    blocks = []
    # block amax next to an E4M3 tie: the scale byte depends on computing amax / (6 g)
    for e in range(-3, 3):
        for m in range(8):
            tie = (1 + (2 * m + 1) / 16) * 2.0**e
            for a in _ulp_walk(float(F32(tie) * F32(6) * g32), 3):
                blk = np.zeros(16, F32)
                blk[0] = a
                blocks.append(blk)
    # elements next to E2M1 ties of a block with scale byte sb: codes depend on x / (s g)
    for sb in (0x38, 0x3B, 0x45, 0x2D):
        s = F32(E4M3[sb])
        d = s * g32
        for t, _ in TIES:
            vals = _ulp_walk(float(F32(t) * d), 7)
            blk = np.zeros(16, F32)
            blk[0] = F32(6) * d
            blk[1:16] = vals
            blocks.append(blk)
    x = np.stack(blocks)
    codes, scales = fp4.nvfp4_encode(x, g)
    c = unpacked(codes)
    scale_order_matters = recip_matters = 0
    for i, blk in enumerate(x):
        rc, rs, _ = nvfp4_ref(blk, g)
        assert c[i].tolist() == rc and scales[i].tolist() == rs, f"g={g} block {i} ({blk[:2]}): codes/scale differ"
        alt_s = np.array((F32(abs(blk).max()) / F32(6)) / g32).astype(ml_dtypes.float8_e4m3fn).view(np.uint8)
        scale_order_matters += int(alt_s) != rs[0]
        d = F32(E4M3[rs[0]]) * g32
        recip_matters += sum(e2m1_ref(float(v * (F32(1) / d))) != rc[j] for j, v in enumerate(blk) if d)
    assert scale_order_matters and recip_matters, "the cases must separate the pinned order from the alternatives"


def test_nvfp4_zero_blocks_and_all_zero_tensor():
    x = np.zeros((3, 32), F32)
    x[0, 16:] = np.linspace(-1, 1, 16)
    x[1, :16] = -0.0
    codes, scales = fp4.nvfp4_encode(x, 0.5)
    assert scales[:, 0].tolist() == [0, 0, 0] and scales[0, 1] != 0
    c = unpacked(codes)
    assert not c[:, :16].any() and not c[1:].any(), "zero blocks (also of -0) store codes 0"
    dec = fp4.nvfp4_decode(codes, scales, 0.5)
    assert not np.signbit(dec[:, :16]).any() and not dec[:, :16].any(), "zero blocks decode to +0"
    z = np.zeros((4, 2, 128), ml_dtypes.bfloat16)
    zc, zs = fp4.nvfp4_encode(z)
    assert zc.shape == (4, 2, 64) and zs.shape == (4, 2, 8)
    assert not zc.any() and not zs.any()
    assert float(fp4.nvfp4_global_scale(z)) == 1.0, "an all-zero tensor gets global scale 1.0"


def test_nvfp4_subnormal_scales_and_underflow():
    # amax / 6 = k * 2**-9 (g = 1): E4M3 subnormal bytes 1..7
    x = np.zeros((9, 16), F32)
    for k in range(1, 8):
        x[k - 1, 0] = 6 * k * 2.0**-9
        x[k - 1, 1] = -3 * k * 2.0**-9  # exactly -3 after scaling: code 13
    x[7, 0] = 6 * 2.0**-10  # tie between 0 and the smallest subnormal: scale 0
    x[8, 0] = np.nextafter(F32(6 * 2.0**-10), F32(1))  # just above: smallest subnormal
    codes, scales = fp4.nvfp4_encode(x)
    assert scales[:7, 0].tolist() == list(range(1, 8)), f"subnormal scale bytes {scales[:7, 0]}"
    c = unpacked(codes)
    assert c[:7, 0].tolist() == [7] * 7 and c[:7, 1].tolist() == [13] * 7
    dec = fp4.nvfp4_decode(codes, scales)
    assert np.array_equal(dec[:7, :2], x[:7, :2]), "subnormal-scaled values on the grid decode exactly"
    assert scales[7, 0] == 0 and not c[7].any() and not dec[7].any(), "an underflowing scale stores 0 and codes 0"
    assert scales[8, 0] == 1 and c[8, 0] == 5, "just above the tie: scale 2**-9, x / s just above 3 gives code 5"


def test_nvfp4_scale_saturation_does_not_disturb_other_blocks():
    g = 1e-3
    x = np.full((2, 32), 0.01, F32)
    x[0, :16] = np.linspace(-1000, 1000, 16, dtype=F32)
    codes, scales = fp4.nvfp4_encode(x, g)
    assert scales[0, 0] == 0x7E, "block amax / (6 g) above 448 saturates the scale to 448 (0x7E)"
    c = unpacked(codes)
    assert c[0, 0] == 15 and c[0, 15] == 7, "values beyond 6 * 448 * g saturate to code +-6"
    ref_c, ref_s = fp4.nvfp4_encode(x[1:], g)
    assert np.array_equal(scales[0, 1], ref_s[0, 1]) and np.array_equal(c[0, 16:], unpacked(ref_c)[0, 16:])
    dec = fp4.nvfp4_decode(codes, scales, g)
    assert dec[0, 15] == np.float32(6 * 448) * F32(g)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_nvfp4_nan_inf_stay_in_their_block(bad: float):
    rng = np.random.default_rng(SEED + 1)
    x = rng.standard_normal((2, 48)).astype(F32)
    y = x.copy()
    y[1, 20] = bad
    g = 0.01
    xc, xs = fp4.nvfp4_encode(x, g)
    yc, ys = fp4.nvfp4_encode(y, g)
    cx, cy = unpacked(xc), unpacked(yc)
    assert np.array_equal(cx[0], cy[0]) and np.array_equal(xs[0], ys[0]), "other vectors untouched"
    keep = np.r_[0:16, 32:48]
    assert np.array_equal(cx[1, keep], cy[1, keep]) and xs[1, 0] == ys[1, 0] and xs[1, 2] == ys[1, 2]
    dec = fp4.nvfp4_decode(yc, ys, g)
    if np.isnan(bad):
        assert ys[1, 1] == fp4.E4M3_NAN_BYTE and not cy[1, 16:32].any()
        assert np.isnan(dec[1, 16:32]).all(), "a NaN block decodes to NaN"
    else:
        assert ys[1, 1] == 0x7E and cy[1, 20] == (7 if bad > 0 else 15)
        assert dec[1, 20] == np.float32(math.copysign(6 * 448, bad)) * F32(g)
        assert np.isfinite(dec).all()


def test_nvfp4_negative_zero_in_a_live_block():
    x = np.zeros(16, F32)
    x[0], x[1], x[2] = 6.0, -0.0, -0.1
    codes, scales = fp4.nvfp4_encode(x)
    c = unpacked(codes)
    assert c[1] == 8 and c[2] == 8, "-0 and negatives rounding to zero keep their sign (code 8)"
    assert np.signbit(fp4.nvfp4_decode(codes, scales, out_dtype=np.float16)[1])


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16])
def test_nvfp4_half_inputs_use_their_fp32_values(dtype):
    rng = np.random.default_rng(SEED + 2)
    x = (rng.standard_normal((16, 64)) * 3).astype(dtype)
    g = float(fp4.nvfp4_global_scale(x))
    a = fp4.nvfp4_encode(x, g)
    b = fp4.nvfp4_encode(x.astype(F32), g)
    assert np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1])
    for out in (np.float16, ml_dtypes.bfloat16):
        dec = fp4.nvfp4_decode(*a, g, out_dtype=out)
        assert dec.dtype == np.dtype(out)
        assert np.array_equal(dec, fp4.nvfp4_decode(*a, g).astype(out)), "decode rounds once from FP32"


def test_nvfp4_per_head_global_scale_broadcasts():
    rng = np.random.default_rng(SEED + 3)
    x = rng.standard_normal((8, 3, 32)).astype(F32) * np.array([1, 10, 100], F32)[:, None]
    g = fp4.nvfp4_global_scale(x, reduce_axes=(0, 2))
    assert g.shape == (3,)
    codes, scales = fp4.nvfp4_encode(x, g)
    dec = fp4.nvfp4_decode(codes, scales, g)
    for h in range(3):
        c, s = fp4.nvfp4_encode(x[:, h], float(g[h]))
        assert np.array_equal(c, codes[:, h]) and np.array_equal(s, scales[:, h])
        assert np.array_equal(fp4.nvfp4_decode(c, s, float(g[h])), dec[:, h])


def test_nvfp4_argument_errors():
    with pytest.raises(ValueError):
        fp4.nvfp4_encode(np.zeros(24, F32))
    with pytest.raises(ValueError):
        fp4.nvfp4_encode(np.zeros(16, F32), 0.0)
    with pytest.raises(ValueError):
        fp4.nvfp4_encode(np.zeros(16, F32), np.nan)
    with pytest.raises(ValueError):
        fp4.nvfp4_encode(np.zeros((2, 16), F32), np.ones(3, F32))
    with pytest.raises(TypeError):
        fp4.nvfp4_encode(np.zeros(16, np.int32))
    with pytest.raises(ValueError):
        fp4.nvfp4_decode(np.zeros((2, 8), np.uint8), np.zeros((3, 1), np.uint8))
    with pytest.raises(ValueError):
        fp4.nvfp4_decode(np.zeros(16, np.uint8), np.zeros(1, np.uint8))  # 32 values, 1 scale: block 32
    with pytest.raises(TypeError):
        fp4.nvfp4_decode(np.zeros(8, np.uint8), np.zeros(1, np.uint8), out_dtype=np.int8)


# ----------------------------------------------------------------------------- MXFP4


@pytest.mark.parametrize("block,rule", [(16, "ceil"), (32, "floor"), (32, "ceil"), (16, "floor")])
def test_mxfp4_matches_scalar_reference(block: int, rule: str):
    rng = np.random.default_rng(SEED + 4)
    x = (rng.standard_normal((12, 64)) * rng.lognormal(0, 3, (12, 1))).astype(F32)
    x[2, :block] = 0.0
    codes, scales = fp4.mxfp4_encode(x, block, rule)
    for row in range(x.shape[0]):
        rc, rs = mxfp4_ref(x[row], block, rule)
        assert unpacked(codes[row]).tolist() == rc, f"seed {SEED + 4} row {row}: codes differ"
        assert scales[row].tolist() == rs, f"seed {SEED + 4} row {row}: scales differ"
    dec = fp4.mxfp4_decode(codes, scales, block)
    want = fp4.e2m1_to_float(unpacked(codes)).reshape(12, -1, block) * np.exp2(
        scales.astype(np.float64) - 127
    )[..., None].astype(F32)
    assert np.array_equal(dec, want.reshape(dec.shape))


@pytest.mark.parametrize("k", [-20, -1, 0, 1, 5, 40])
def test_mxfp4_exponent_rules_at_powers_of_two(k: int):
    at = F32(6 * 2.0**k)
    above = np.nextafter(at, F32(np.inf))
    e = fp4.mxfp4_exponents(np.array([at, above], F32), "ceil")
    assert e.tolist() == [k, k + 1], "ceil(log2(amax / 6)) must be exact at and just above 6 * 2**k"
    p = F32(2.0 ** (k + 2))
    e = fp4.mxfp4_exponents(np.array([p, np.nextafter(p, F32(0))], F32), "floor")
    assert e.tolist() == [k, k - 1], "floor(log2 amax) - 2 must be exact at and just below 2**(k+2)"
    b = np.exp2(np.array([k], F32)).astype(ml_dtypes.float8_e8m0fnu).view(np.uint8)
    assert int(b[0]) == k + 127, "byte = e + 127 agrees with ml_dtypes E8M0"


def test_mxfp4_ties_zero_blocks_and_clamps():
    x = np.zeros((4, 16), F32)
    x[0, 0] = 6.0  # ceil rule: e = 0, scale 1
    x[0, 1:8] = [t for t, _ in TIES]
    x[2, 0] = 1e-40  # amax / 6 below 2**-127: e clamps to -127 (byte 0)
    x[3, :] = -0.0
    codes, scales = fp4.mxfp4_encode(x)
    c = unpacked(codes)
    assert scales.tolist() == [[127], [0], [0], [0]]
    assert c[0, 1:8].tolist() == [c_ for _, c_ in TIES]
    assert not c[1].any() and not c[3].any()
    dec = fp4.mxfp4_decode(codes, scales)
    assert not np.signbit(dec[3]).any() and not dec[3].any()


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_mxfp4_nan_inf_stay_in_their_block(bad: float):
    rng = np.random.default_rng(SEED + 5)
    x = rng.standard_normal(64).astype(F32)
    y = x.copy()
    y[40] = bad
    for block, rule in ((16, "ceil"), (32, "floor")):
        xc, xs = fp4.mxfp4_encode(x, block, rule)
        yc, ys = fp4.mxfp4_encode(y, block, rule)
        b = 40 // block
        other = [i for i in range(64 // block) if i != b]
        assert np.array_equal(xs[other], ys[other])
        mask = np.ones(64, bool)
        mask[b * block : (b + 1) * block] = False
        assert np.array_equal(unpacked(xc)[mask], unpacked(yc)[mask])
        dec = fp4.mxfp4_decode(yc, ys)
        if np.isnan(bad):
            assert ys[b] == fp4.E8M0_NAN_BYTE and np.isnan(dec[~mask]).all()
        else:
            assert ys[b] == 254 and unpacked(yc)[40] == 7 and dec[40] == np.inf


def test_mxfp4_argument_errors():
    with pytest.raises(ValueError):
        fp4.mxfp4_encode(np.zeros(48, F32), 32, "floor")
    with pytest.raises(ValueError):
        fp4.mxfp4_encode(np.zeros(64, F32), 64)
    with pytest.raises(ValueError):
        fp4.mxfp4_encode(np.zeros(32, F32), 16, "round")
    with pytest.raises(ValueError):
        fp4.mxfp4_decode(np.zeros(8, np.uint8), np.zeros(1, np.uint8), block=32)
