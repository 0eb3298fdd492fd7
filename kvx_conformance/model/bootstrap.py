"""Paired bootstrap intervals for the model evaluation: one resampling, every format at once.

The scored tokens are cut into blocks of :data:`BLOCK_TOKENS` consecutive tokens of one
window (neighbouring tokens' losses are correlated, so single tokens would give too
narrow an interval). Each of :data:`RESAMPLES` resamples draws as many blocks as there are,
with replacement, from a fixed seed, and the *same* blocks count for every format
(paired): a format's perplexity, its delta against the baseline, its mean KL and its
top-1 agreement are recomputed on each resample, and the 95% interval is the 2.5th to
97.5th percentile. Two formats differ significantly when the interval of the difference
of their perplexities (same resamples) leaves out zero.
"""
from __future__ import annotations

import numpy as np

BLOCK_TOKENS = 32
RESAMPLES = 2000
SEED = 20250101


def block_ids(scored_per_window: list[int], block: int = BLOCK_TOKENS) -> np.ndarray:
    """Block index of every scored token (windows in order; a block never spans two windows)."""
    out, nxt = [], 0
    for n in scored_per_window:
        nb = -(-n // block)
        out.append(nxt + np.arange(n) // block)
        nxt += nb
    return np.concatenate(out) if out else np.zeros(0, dtype=np.int64)


def _ci(x: np.ndarray) -> list[float]:
    lo, hi = np.percentile(x, [2.5, 97.5])
    return [float(lo), float(hi)]


def paired_bootstrap(figures: dict[str, dict], baseline: str, blocks: np.ndarray, resamples: int = RESAMPLES,
                     seed: int = SEED) -> dict[str, dict]:
    """Intervals per format. ``figures[name]``: per-token ``nll`` (and, where there is a
    baseline to compare with, ``kl`` and ``agree``), all in the order of ``blocks``.

    Returns per format ``delta_ppl_ci95``, ``kl_ci95``, ``top1_agreement_ci95`` (None without
    a baseline) and ``pairwise``: for every other format, ``ppl_diff`` (this one's perplexity
    minus the other's), its ``ci95`` and ``significant``.
    """
    nb = int(blocks.max()) + 1 if blocks.size else 0
    if nb == 0:
        return {name: {"delta_ppl_ci95": None, "kl_ci95": None, "top1_agreement_ci95": None, "pairwise": {}}
                for name in figures}
    rng = np.random.default_rng(seed)
    draws = rng.integers(0, nb, size=(resamples, nb))
    flat = (draws + (np.arange(resamples) * nb)[:, None]).ravel()
    weights = np.bincount(flat, minlength=resamples * nb).reshape(resamples, nb).astype(np.float64)
    n_tok = weights @ np.bincount(blocks, minlength=nb).astype(np.float64)

    def mean(x: np.ndarray) -> np.ndarray:
        return (weights @ np.bincount(blocks, weights=np.asarray(x, dtype=np.float64), minlength=nb)) / n_tok

    ppl = {name: np.exp(mean(f["nll"])) for name, f in figures.items()}
    point = {name: float(np.exp(np.mean(f["nll"]))) for name, f in figures.items()}
    out: dict[str, dict] = {}
    for name, f in figures.items():
        has_base = baseline in ppl and f.get("kl") is not None
        res = {
            "delta_ppl_ci95": _ci(ppl[name] - ppl[baseline]) if has_base else None,
            "kl_ci95": _ci(mean(f["kl"])) if has_base else None,
            "top1_agreement_ci95": _ci(mean(f["agree"])) if has_base else None,
            "pairwise": {},
        }
        for other in figures:
            if other == name:
                continue
            lo, hi = _ci(ppl[name] - ppl[other])
            res["pairwise"][other] = {"ppl_diff": point[name] - point[other], "ci95": [lo, hi],
                                      "significant": bool(lo > 0 or hi < 0)}
        out[name] = res
    return out
