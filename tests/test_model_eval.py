"""The model evaluation: perplexity and top-1 agreement per KV-cache format vs BF16.

A short run (64 tokens of the CPython documentation prose) through the bundled
reference provider (FP4 through its KVX 1.2 FP4 cache). The bounds are wide on purpose: they catch a broken format
(a scale ignored, a codec applied to the wrong axis), not small numeric drift.
"""
from __future__ import annotations

import math

import pytest

from kvx_conformance.abi import native
from kvx_conformance.model import format_table, model_unavailable, run_model_eval
from kvx_conformance.model.threads import blas_threads

_why = model_unavailable()
pytestmark = pytest.mark.skipif(_why is not None, reason=_why or "")

REPRO = "python -m pytest tests/test_model_eval.py"
TOKENS = 64


@pytest.fixture(autouse=True, scope="module")
def _one_blas_thread():
    """Small matrix products: one BLAS thread per xdist worker (kvx_conformance.model.threads)."""
    with blas_threads(1):
        yield


def _minor() -> int:
    from kvx_conformance.abi.loader import load_provider
    from kvx_conformance.model.paged_kv import provider_minor

    return provider_minor(load_provider(native.reference_provider()))


@pytest.fixture(scope="module")
def rows():
    return run_model_eval(native.reference_provider(), quick=True, tokens=TOKENS)


def test_rows_cover_every_format(rows):
    by = {r["format"]: r for r in rows}
    assert list(by) == ["F32", "BF16", "FP8-E4M3", "NVFP4", "MXFP4", "INT8", "INT4"]
    for r in rows:
        for key in ("format", "bits_per_value", "ppl", "delta_ppl", "delta_ppl_ci95", "kl", "top1_agreement", "tokens", "path"):
            assert key in r, f"row {r['format']} lacks {key}"
        assert r["tokens"] == TOKENS
        # the bundled reference has the KVX 1.2 FP4 extension: FP4 goes through its own FP4 cache
        fp4_path = "provider-fp4" if _minor() >= 2 else "oracle-fp4"
        want = {"NVFP4": fp4_path, "MXFP4": fp4_path, "INT8": "harness-int", "INT4": "harness-int"}
        assert r["path"] == want.get(r["format"], "provider"), r


def test_figures_are_sane(rows):
    by = {r["format"]: r for r in rows}
    msg = f"\n{format_table(rows)}\nrepro: {REPRO}"
    for r in rows:
        assert math.isfinite(r["ppl"]) and 5.0 < r["ppl"] < 60.0, f"{r['format']} perplexity{msg}"
    bf16 = by["BF16"]
    assert bf16["delta_ppl"] == 0.0 and bf16["top1_agreement"] == 1.0 and bf16["kl"] == 0.0, msg
    # F32 and BF16 caches differ by BF16 rounding only
    assert abs(by["F32"]["delta_ppl"]) < 0.01 * bf16["ppl"] and by["F32"]["top1_agreement"] >= 0.95, msg
    assert by["FP8-E4M3"]["top1_agreement"] >= 0.85, msg
    for fp4 in ("NVFP4", "MXFP4"):
        assert by[fp4]["top1_agreement"] >= 0.5, msg
    # coarser caches disturb the distribution more
    kl = {k: r["kl"] for k, r in by.items()}
    assert kl["F32"] < kl["FP8-E4M3"] < kl["MXFP4"], msg


def test_table_names_every_row(rows):
    table = format_table(rows)
    for r in rows:
        assert r["format"] in table
    assert "provider-fp4" in table or "oracle-fp4" in table
    assert "sha256:" in table


def test_intervals_bits_and_memory(rows):
    """Every row carries its 95% interval (around its own delta), the bits it stores per value
    and the KV bytes per token: FP4 and INT4 at 4.5 bits (scales counted), INT8 at 8.5."""
    msg = f"\n{format_table(rows)}\nrepro: {REPRO}"
    by = {r["format"]: r for r in rows}
    assert by["BF16"]["delta_ppl_ci95"] == [0.0, 0.0], msg
    for r in rows:
        lo, hi = r["delta_ppl_ci95"]
        assert lo <= r["delta_ppl"] + 1e-9 and r["delta_ppl"] - 1e-9 <= hi, f"{r['format']} interval{msg}"
        assert r["kl_ci95"][0] <= r["kl"] + 1e-12 <= r["kl_ci95"][1] + 2e-12, f"{r['format']} KL interval{msg}"
        # 30 layers x K and V x 3 KV heads x 64 values
        assert r["kv_bytes_per_token"] == 30 * 2 * 3 * 64 * r["bits_per_value"] / 8, r
        assert r["scored"] == TOKENS - 1 and r["windows"] == 1 and r["bootstrap"]["resamples"] > 0
    bits = {k: r["bits_per_value"] for k, r in by.items()}
    assert bits == {"F32": 32, "BF16": 16, "FP8-E4M3": 8, "NVFP4": 4.5, "MXFP4": 4.5, "INT8": 8.5, "INT4": 4.5}, bits
    # the pairwise comparisons are antisymmetric, and "significant" means the interval leaves out 0
    for a in rows:
        for b, p in a["pairwise"].items():
            q = by[b]["pairwise"][a["format"]]
            assert abs(p["ppl_diff"] + q["ppl_diff"]) < 1e-9 and p["significant"] == q["significant"], (a["format"], b)
            assert p["significant"] == (p["ci95"][0] > 0 or p["ci95"][1] < 0)
            assert (b in a["significant_vs"]) == p["significant"]
    # integer codes lose more at 4 bits than at 8
    assert by["INT8"]["kl"] < by["INT4"]["kl"] and by["INT8"]["top1_agreement"] >= 0.9, msg
    texts = rows[0]["texts"]
    assert texts[0]["name"] == "python-reference" and len(texts[0]["sha256"]) == 64 and texts[0]["tokens_used"] == TOKENS
