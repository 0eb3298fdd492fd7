"""Accuracy benchmark: anchors of the codecs on i.i.d. Gaussian data, the comparison
methods, the paged decode-attention oracle and the rows of run_accuracy()."""
from __future__ import annotations

import json
import math

import ml_dtypes
import numpy as np
import pytest

from kvx_conformance.accuracy import ROW_KEYS, ProviderAccuracyUnavailable, format_table, run_accuracy
from kvx_conformance.accuracy import metrics
from kvx_conformance.accuracy.distributions import DISTRIBUTIONS, sample
from kvx_conformance.accuracy.paged_attention import build_paged, paged_decode_attention
from kvx_conformance.reference_impl import fp4, quant

ANCHOR_SEED = 0


@pytest.fixture(scope="module")
def gaussian_8192x128() -> np.ndarray:
    return np.random.default_rng(ANCHOR_SEED).standard_normal((8192, 128)).astype(np.float32)


# name, expected relative RMSE on 8192 x 128 i.i.d. N(0, 1) (docs/fp4.md), tolerance
ANCHORS = [
    ("nvfp4", 0.095, 0.03),
    ("mxfp4_16", 0.113, 0.03),
    ("fp8_e4m3_tensor", 0.026, 0.04),
]


@pytest.mark.parametrize("name,expected,tol", ANCHORS)
def test_anchor_relative_rmse(gaussian_8192x128, name: str, expected: float, tol: float):
    x = gaussian_8192x128
    got = metrics.rel_rmse(x, quant.method(name).roundtrip(x))
    assert abs(got - expected) <= tol * expected, (
        f"{name}: relative RMSE {got:.5f}, expected {expected} +- {tol:.0%} "
        f"(8192 x 128 N(0,1), default_rng({ANCHOR_SEED}))"
    )


def test_anchor_nvfp4_snr_and_global_scale(gaussian_8192x128):
    x = gaussian_8192x128
    g = fp4.nvfp4_global_scale(x)
    assert g == np.float32(np.abs(x).max()) / np.float32(6 * 448)
    codes, scales = fp4.nvfp4_encode(x, g)
    assert codes.shape == (8192, 64) and scales.shape == (8192, 8)
    snr = metrics.snr_db(x, fp4.nvfp4_decode(codes, scales, g))
    assert abs(snr - 20.4) < 0.3, f"NVFP4 SNR {snr:.2f} dB, expected about 20.4 dB"


def test_comparison_methods_rank_as_their_precision(gaussian_8192x128):
    x = gaussian_8192x128[:2048]
    err = {m.name: metrics.rel_rmse(x, m.roundtrip(x)) for m in quant.METHODS}
    order = ["bf16", "int8_g8", "int8_token", "fp8_e4m3_tensor", "int4_g8", "nvfp4", "mxfp4_16", "mxfp4_32_ocp"]
    assert [err[n] for n in order] == sorted(err[n] for n in order), f"unexpected error order: {err}"


def test_int_group_and_token_codecs():
    x = np.array([[0.5, -1.0, 0.25, 0.0, 2.0, -2.0, 1.0, 0.125]], np.float32)
    q, s = quant.int_group_encode(x, 8)
    assert s.dtype == np.float16 and s[0, 0] == np.float16(2.0 / 127)
    assert q.tolist() == [np.clip(np.rint(x[0] / np.float32(s[0, 0])), -127, 127).astype(int).tolist()]
    q4, s4 = quant.int_group_encode(x, 4)
    assert q4.min() >= -7 and q4.max() <= 7 and abs(q4).max() == 7
    qt, scale, zero = quant.int_token_encode(x, 4)
    assert qt.min() == 0 and qt.max() == 15
    assert zero[0] == ml_dtypes.bfloat16(-2.0) and scale[0] == ml_dtypes.bfloat16(4.0 / 15)
    assert np.allclose(quant.int_token_decode(qt, scale, zero), x, atol=float(scale[0]) / 2 + 1e-6)
    const = np.full((1, 16), 3.0, np.float32)
    assert np.array_equal(quant.int_token_decode(*quant.int_token_encode(const, 8)), const)


def test_fp8_per_tensor_saturates_and_rounds_to_nearest_even():
    s = np.float32(0.5)
    x = np.array([1.0, 1000.0, -1000.0, 1.0625 * 0.5, 1.1875 * 0.5, np.inf], np.float32)
    q = quant.fp8_e4m3_encode(x, s)
    assert q[1] == 0x7E and q[2] == 0xFE and q[5] == 0x7E, "beyond +-448 * scale saturates to +-448"
    assert q[3] == 0x38 and q[4] == 0x3A, "ties between E4M3 neighbours go to the even mantissa"
    assert quant.fp8_e4m3_decode(q, s)[0] == 1.0


def test_storage_cost_counts_scales():
    d = 128
    bits = {m.name: m.bits_per_value(d) for m in quant.METHODS}
    assert bits == {
        "bf16": 16.0, "fp8_e4m3_tensor": 8.0, "int8_g8": 10.0, "int4_g8": 6.0, "int8_token": 8.25,
        "int4_token": 4.25, "mxfp4_16": 4.5, "mxfp4_32_ocp": 4.25, "nvfp4": 4.5,
    }
    assert quant.method("nvfp4").bytes_per_token(8, 128) == 2 * 8 * (64 + 8)


# ----------------------------------------------------------------------------- paged attention oracle


def dense_attention(q, k, v, lens):
    """Independent reference: per sequence, per query head, a plain softmax loop."""
    out = np.zeros(q.shape)
    start = 0
    group = q.shape[1] // k.shape[1]
    for b, n in enumerate(lens):
        for h in range(q.shape[1]):
            kk = k[start : start + n, h // group].astype(np.float64)
            vv = v[start : start + n, h // group].astype(np.float64)
            if n:
                w = np.exp(kk @ q[b, h] / math.sqrt(q.shape[2]) - (kk @ q[b, h] / math.sqrt(q.shape[2])).max())
                out[b, h] = (w / w.sum()) @ vv
        start += n
    return out


def test_paged_attention_matches_dense_through_a_shuffled_table():
    rng = np.random.default_rng(7)
    lens = [37, 0, 16, 1, 64]
    k = rng.standard_normal((sum(lens), 2, 32)).astype(np.float32)
    v = rng.standard_normal((sum(lens), 2, 32)).astype(np.float32)
    paged = build_paged(k, v, lens, 8, rng)
    assert np.isnan(paged.k_cache).any(), "slots without a token are NaN poison"
    used = paged.block_table[paged.block_table >= 0].tolist()
    assert len(set(used)) == len(used) and used != sorted(used), "physical blocks are distinct and shuffled"
    q = rng.standard_normal((len(lens), 6, 32))
    got = paged_decode_attention(q, paged.k_cache, paged.v_cache, paged.block_table, paged.seq_lens)
    want = dense_attention(q, k, v, lens)
    assert np.isfinite(got).all(), "the oracle read a poisoned slot"
    assert np.allclose(got, want, rtol=1e-12, atol=1e-12)
    steps = np.stack([q, 2 * q], axis=1)
    multi = paged_decode_attention(steps, paged.k_cache, paged.v_cache, paged.block_table, paged.seq_lens)
    assert np.allclose(multi[:, 0], got, rtol=1e-12, atol=1e-12)


def test_paged_attention_gqa_head_mapping():
    rng = np.random.default_rng(8)
    k = rng.standard_normal((20, 2, 16)).astype(np.float32)
    v = rng.standard_normal((20, 2, 16)).astype(np.float32)
    paged = build_paged(k, v, [20], 4, np.random.default_rng(1))
    q = rng.standard_normal((1, 4, 16))
    base = paged_decode_attention(q, paged.k_cache, paged.v_cache, paged.block_table, paged.seq_lens)
    v2 = paged.v_cache.copy()
    v2[:, :, 1] += 1.0  # KV head 1 feeds query heads 2 and 3 only
    moved = paged_decode_attention(q, paged.k_cache, v2, paged.block_table, paged.seq_lens)
    assert np.allclose(moved[0, :2], base[0, :2]) and np.allclose(moved[0, 2:], base[0, 2:] + 1.0)


def test_paged_attention_rejects_bad_tables():
    k = np.zeros((8, 1, 16), np.float32)
    paged = build_paged(k, k, [8], 4, np.random.default_rng(0))
    q = np.zeros((1, 1, 16))
    with pytest.raises(ValueError):
        paged_decode_attention(q, paged.k_cache, paged.v_cache, paged.block_table, np.array([9]))
    bad = paged.block_table.copy()
    bad[0, 0] = paged.k_cache.shape[0]
    with pytest.raises(ValueError):
        paged_decode_attention(q, paged.k_cache, paged.v_cache, bad, paged.seq_lens)
    with pytest.raises(ValueError):
        paged_decode_attention(np.zeros((1, 3, 16)), np.zeros((2, 4, 2, 16)), np.zeros((2, 4, 2, 16)), bad, paged.seq_lens)


# ----------------------------------------------------------------------------- distributions and metrics


def test_distributions_are_seeded_and_shaped():
    for name in DISTRIBUTIONS:
        a = sample(name, 64, 2, 32, seed=5)
        b = sample(name, 64, 2, 32, seed=5)
        c = sample(name, 64, 2, 32, seed=6)
        assert a.x.shape == (64, 2, 32) and a.x.dtype == np.float32
        assert np.array_equal(a.x, b.x) and not np.array_equal(a.x, c.x), name
    k = sample("k_outliers", 4096, 2, 128, seed=0)
    assert k.outliers.sum(axis=1).tolist() == [4, 4]
    rms = np.sqrt((k.x**2).mean(axis=0))
    assert rms[k.outliers].min() > 5 * np.median(rms[~k.outliers]), "outlier channels must stand out"
    with pytest.raises(ValueError):
        sample("uniform", 4, 1, 16)


def test_metrics_known_values():
    ref = np.array([3.0, 4.0])
    got = np.array([3.0, 4.5])
    assert metrics.rel_rmse(ref, got) == pytest.approx(0.1)
    assert metrics.snr_db(ref, got) == pytest.approx(20.0)
    assert metrics.max_abs_err(ref, got) == 0.5
    assert metrics.cosine(ref, ref * 2) == pytest.approx(1.0)
    assert metrics.snr_db(ref, ref) == math.inf
    assert metrics.rel_rmse(ref, got, keep=np.array([True, False])) == 0.0
    rng = np.random.default_rng(3)
    q, k = rng.standard_normal((5, 2, 8)), rng.standard_normal((7, 2, 8))
    k2 = k + 0.01 * rng.standard_normal(k.shape)
    direct = [(q[n, h] @ (k2[t, h] - k[t, h])) / math.sqrt(8) for n in range(5) for h in range(2) for t in range(7)]
    assert metrics.logit_rmse(q, k, k2) == pytest.approx(math.sqrt(np.mean(np.square(direct))))


# ----------------------------------------------------------------------------- run_accuracy


@pytest.fixture(scope="module")
def quick_rows() -> list[dict]:
    return run_accuracy(quick=True)


def test_run_accuracy_rows(quick_rows):
    assert len(quick_rows) == len(quant.METHODS) * len(DISTRIBUTIONS)
    assert {(r["method"], r["distribution"]) for r in quick_rows} == {
        (m.name, d) for m in quant.METHODS for d in DISTRIBUTIONS
    }
    for r in quick_rows:
        assert set(ROW_KEYS) <= set(r), f"row lacks {set(ROW_KEYS) - set(r)}"
        assert r["path"] == "oracle"
        for key in ("rel_rmse", "snr_db", "cosine", "max_abs_err", "logit_rmse", "attn_rel_err"):
            assert math.isfinite(r[key]) and r[key] >= 0, (r["method"], r["distribution"], key, r[key])
    json.dumps(quick_rows, allow_nan=False)
    by = {(r["method"], r["distribution"]): r for r in quick_rows}
    for d in DISTRIBUTIONS:
        assert by["nvfp4", d]["rel_rmse"] < by["mxfp4_16", d]["rel_rmse"], d
        assert by["bf16", d]["attn_rel_err"] < by["fp8_e4m3_tensor", d]["attn_rel_err"] < by["nvfp4", d]["attn_rel_err"], d
    nv = by["nvfp4", "gaussian"]
    assert nv["bits_per_value"] == 4.5 and nv["compression_vs_bf16"] == pytest.approx(16 / 4.5)
    assert nv["compression_vs_fp8"] == pytest.approx(8 / 4.5)
    ko = by["nvfp4", "k_outliers"]
    assert ko["rel_rmse_inliers"] > 2 * ko["rel_rmse"], "outlier channels inflate the inliers' block scales"


def test_format_table(quick_rows):
    text = format_table(quick_rows)
    for m in quant.METHODS:
        assert m.label in text
    for d in DISTRIBUTIONS:
        assert f"[{d}]" in text
    assert format_table([]) == "(no accuracy rows)"


def test_provider_roundtrip_refuses_what_a_provider_cannot_store():
    from kvx_conformance.accuracy import provider_roundtrip

    x = np.ones((16, 1, 32), np.float32)
    with pytest.raises(ProviderAccuracyUnavailable):
        provider_roundtrip(object(), "nvfp4", x)  # no kvx_get_version: no FP4 extension
    with pytest.raises(ProviderAccuracyUnavailable):
        provider_roundtrip(object(), "bf16", x)  # not an FP4 format



def test_provider_rows_match_the_oracle_for_the_reference():
    """Through the reference provider the FP4 rows are the oracle's figures (bit-exact codec);
    every other method is measured by the oracle, one row per (method, distribution)."""
    from kvx_conformance.abi import native
    from kvx_conformance.accuracy import BenchConfig
    from kvx_conformance.abi.loader import load_provider

    cfg = BenchConfig(tokens=256, kv_heads=2, q_heads=4, head_dim=64, block_size=16, num_seqs=2, decode_steps=1,
                      logit_queries=4)
    prov = run_accuracy(provider=load_provider(native.reference_provider()), config=cfg)
    orc = run_accuracy(config=cfg)
    assert [(r["method"], r["distribution"]) for r in prov] == [(r["method"], r["distribution"]) for r in orc]
    for p, o in zip(prov, orc):
        fp4 = p["method"] in ("nvfp4", "mxfp4_16", "mxfp4_32_ocp")
        assert p["path"] == ("provider" if fp4 else "oracle"), p
        for k in ("rel_rmse", "snr_db", "cosine", "max_abs_err", "attn_rel_err"):
            assert p[k] == o[k], (p["method"], p["distribution"], k, p[k], o[k])
    # a provider without the FP4 extension: everything through the oracle
    rows = run_accuracy(provider=load_provider(native.reference_provider_v1_1()), config=cfg)
    assert {r["path"] for r in rows} == {"oracle"} and len(rows) == len(orc)
