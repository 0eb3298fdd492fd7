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
    by = {r["cache"]: r for r in rows}
    assert list(by) == ["F32", "BF16", "FP8-E4M3", "NVFP4", "MXFP4"]
    for r in rows:
        for key in ("cache", "perplexity", "delta", "top1_agreement", "tokens", "path"):
            assert key in r, f"row {r['cache']} lacks {key}"
        assert r["tokens"] == TOKENS
        # the bundled reference has the KVX 1.2 FP4 extension: FP4 goes through its own FP4 cache
        fp4_path = "provider-fp4" if _minor() >= 2 else "oracle-fp4"
        assert r["path"] == (fp4_path if r["cache"] in ("NVFP4", "MXFP4") else "provider"), r


def test_figures_are_sane(rows):
    by = {r["cache"]: r for r in rows}
    msg = f"\n{format_table(rows)}\nrepro: {REPRO}"
    for r in rows:
        assert math.isfinite(r["perplexity"]) and 5.0 < r["perplexity"] < 40.0, f"{r['cache']} perplexity{msg}"
    bf16 = by["BF16"]
    assert bf16["delta"] == 0.0 and bf16["top1_agreement"] == 1.0 and bf16["kl_vs_bf16"] == 0.0, msg
    # F32 and BF16 caches differ by BF16 rounding only
    assert abs(by["F32"]["delta"]) < 0.01 * bf16["perplexity"] and by["F32"]["top1_agreement"] >= 0.95, msg
    assert by["FP8-E4M3"]["top1_agreement"] >= 0.85, msg
    for fp4 in ("NVFP4", "MXFP4"):
        assert by[fp4]["top1_agreement"] >= 0.5, msg
    # coarser caches disturb the distribution more
    kl = {k: r["kl_vs_bf16"] for k, r in by.items()}
    assert kl["F32"] < kl["FP8-E4M3"] < kl["MXFP4"], msg


def test_table_names_every_row(rows):
    table = format_table(rows)
    for r in rows:
        assert r["cache"] in table
    assert "provider-fp4" in table or "oracle-fp4" in table
    assert "sha256:" in table
