"""Paired bootstrap intervals of the model evaluation (kvx_conformance/model/bootstrap.py), on
made-up per-token losses: no model needed. Repro: python -m pytest tests/test_model_bootstrap.py"""
from __future__ import annotations

import numpy as np

from kvx_conformance.model.bootstrap import block_ids, paired_bootstrap
from kvx_conformance.report.model_eval import delta_chart, normalize, section_view


def test_blocks_stay_inside_windows():
    ids = block_ids([70, 5, 32], block=32)
    assert list(np.bincount(ids)) == [32, 32, 6, 5, 32]


def _figures(seed=0, n=4096):
    rng = np.random.default_rng(seed)
    base = rng.gamma(2.0, 1.5, size=n)  # per-token NLL of the baseline
    same = base + rng.normal(0, 1e-4, size=n)  # a format indistinguishable from it
    worse = base + 0.05 + rng.normal(0, 0.02, size=n)  # a format that adds 0.05 nats everywhere
    zeros, ones = np.zeros(n), np.ones(n, dtype=bool)
    return {"BF16": {"nll": base, "kl": zeros, "agree": ones},
            "SAME": {"nll": same, "kl": np.full(n, 1e-6), "agree": ones},
            "WORSE": {"nll": worse, "kl": np.full(n, 0.05), "agree": rng.random(n) < 0.9}}


def test_a_real_difference_is_significant_and_noise_is_not():
    figs = _figures()
    out = paired_bootstrap(figs, "BF16", block_ids([len(figs["BF16"]["nll"])]), resamples=500, seed=1)
    ppl = {k: float(np.exp(np.mean(f["nll"]))) for k, f in figs.items()}
    lo, hi = out["WORSE"]["delta_ppl_ci95"]
    assert 0 < lo <= ppl["WORSE"] - ppl["BF16"] <= hi, (lo, hi)
    assert out["WORSE"]["pairwise"]["SAME"]["significant"] and out["WORSE"]["pairwise"]["BF16"]["significant"]
    lo, hi = out["SAME"]["delta_ppl_ci95"]
    assert lo < 0 < hi or abs(hi - lo) < 1e-3, (lo, hi)
    assert out["BF16"]["delta_ppl_ci95"] == [0.0, 0.0]
    assert 0.87 < out["WORSE"]["top1_agreement_ci95"][0] < 0.9 < out["WORSE"]["top1_agreement_ci95"][1] < 0.93
    # paired: the interval of a constant shift is far narrower than the spread of either format alone
    width = hi - lo
    assert width < 0.01, width


def test_same_seed_same_intervals():
    figs = _figures(3, 512)
    a = paired_bootstrap(figs, "BF16", block_ids([512]), resamples=200, seed=7)
    b = paired_bootstrap(figs, "BF16", block_ids([512]), resamples=200, seed=7)
    assert a == b


def _row(fmt, bits, delta, ci):
    return {"format": fmt, "path": "provider", "bits_per_value": bits, "kv_bytes_per_token": bits * 360,
            "ppl": 20 + delta, "delta_ppl": delta, "delta_ppl_ci95": ci, "kl": 0.01, "top1_agreement": 0.9,
            "top1_accuracy": 0.4, "pairwise": {}, "tokens": 100, "scored": 99, "chunk": 64, "block_size": 16,
            "memory": "host", "provider": "p.so", "model": "m", "text": "t"}


def test_chart_has_a_point_and_an_interval_per_format():
    rows = [_row("BF16", 16, 0.0, [0.0, 0.0]), _row("NVFP4", 4.5, 0.8, [0.5, 1.1]), _row("INT4", 4.5, 1.2, [0.9, 1.6])]
    svg = delta_chart(rows)
    assert svg.count("<circle") == 3 and 'data-format="NVFP4"' in svg and "95% CI +0.5000 to +1.1000" in svg
    assert delta_chart([]) == ""


def test_rows_written_before_the_intervals_still_render():
    old = {"cache": "NVFP4", "perplexity": 16.8, "delta": 0.9, "top1_agreement": 0.86, "kl_vs_bf16": 0.07,
           "top1_accuracy": 0.39, "path": "provider-fp4", "tokens": 512, "scored": 511, "chunk": 64,
           "block_size": 16, "memory": "host", "seconds": 3.0, "provider": "p.so", "model": "m", "text": "t"}
    assert normalize(old)["ppl"] == 16.8 and normalize(old)["format"] == "NVFP4"
    view = section_view([old])
    assert view["rows"][0][0] == "NVFP4" and view["rows"][0][4] == "16.8000" and view["chart_svg"] == ""
