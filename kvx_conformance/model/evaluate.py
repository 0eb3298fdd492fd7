"""Accuracy of KV-cache formats with a real model: perplexity and top-1 agreement vs BF16.

SmolLM2-135M reads a fixed English text (:mod:`.text`) in chunks (chunked prefill):
every attention reads K/V back from the provider's paged cache, so each format's
rounding reaches every score. Per cache format the row gives the perplexity, its
delta against the BF16 cache, top-1 next-token agreement with the BF16 run, the
mean KL divergence from the BF16 distribution, and the path the K/V took:
``provider`` (the provider's write/gather in that cache dtype) or ``oracle-fp4``
(the reference FP4 codec round trip applied before the provider's F32 write, as the
v1.1 ABI has no FP4 cache dtype).
"""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from .decoder import Decoder, log_softmax
from .kv_store import FORMATS, CacheFormat
from .paged_kv import BLOCK_SIZE, PagedKVStore, blocks_needed
from .text import TOPICS, eval_text, text_id
from .tokenizer import encode
from .weights import load_weights, package_versions

EVAL_FORMATS = ("F32", "BF16", "FP8-E4M3", "NVFP4", "MXFP4")
BASELINE = "BF16"
QUICK_TOKENS = 128
FULL_TOKENS = 512
CHUNK = 64


def eval_tokens(n: int) -> np.ndarray:
    ids = np.asarray(encode(eval_text()), dtype=np.int64)
    if n > len(ids):
        raise ValueError(f"the evaluation text has {len(ids)} tokens, {n} asked")
    return ids[:n]


def score_format(provider, fmt: CacheFormat, ids: np.ndarray, chunk: int = CHUNK, seed: int = 0) -> np.ndarray:
    """Log-probabilities ``[len(ids) - 1, vocab]`` of each next token, K/V through a paged cache."""
    w = load_weights()
    store = PagedKVStore(provider, w.config, fmt, num_blocks=blocks_needed([len(ids)]) + 4, seed=seed)
    dec = Decoder(w)
    logits = []
    for a in range(0, len(ids), chunk):
        logits.append(dec.step(store, [0], [ids[a:a + chunk]], all_logits=True).logits[0])
    return log_softmax(np.concatenate(logits)[:-1])


def run_model_eval(
    provider_path: str | Path | None = None,
    quick: bool = True,
    tokens: int | None = None,
    formats: tuple[str, ...] = EVAL_FORMATS,
    chunk: int = CHUNK,
) -> list[dict]:
    """One row per cache format (see the module docstring); the BF16 row is the baseline.

    ``provider_path`` None means the bundled reference provider. Raises
    :class:`~kvx_conformance.model.weights.ModelUnavailable` without the model packages.
    """
    from ..loader import load_provider
    from ..native import reference_provider

    n = tokens or (QUICK_TOKENS if quick else FULL_TOKENS)
    path = Path(provider_path) if provider_path is not None else reference_provider()
    provider = load_provider(path)
    ids = eval_tokens(n)
    targets = ids[1:]
    names = list(dict.fromkeys([BASELINE, *formats]))
    scored: dict[str, tuple[np.ndarray, float]] = {}
    for name in names:
        t0 = time.perf_counter()
        scored[name] = (score_format(provider, FORMATS[name], ids, chunk), time.perf_counter() - t0)
    base_lp, _ = scored[BASELINE]
    base_top1 = base_lp.argmax(axis=-1)
    base_ppl = float(np.exp(-base_lp[np.arange(len(targets)), targets].mean()))
    base_p = np.exp(base_lp)
    text = eval_text()
    versions = package_versions()
    rows = []
    for name in formats:
        lp, secs = scored[name]
        nll = -lp[np.arange(len(targets)), targets]
        ppl = float(np.exp(nll.mean()))
        top1 = lp.argmax(axis=-1)
        rows.append({
            "cache": name,
            "path": FORMATS[name].path,
            "perplexity": ppl,
            "delta": ppl - base_ppl,
            "top1_agreement": float(np.mean(top1 == base_top1)),
            "kl_vs_bf16": float(np.mean(np.sum(base_p * (base_lp - lp), axis=-1))),
            "top1_accuracy": float(np.mean(top1 == targets)),
            "tokens": int(len(ids)),
            "scored": int(len(targets)),
            "chunk": chunk,
            "block_size": BLOCK_SIZE,
            "seconds": round(secs, 2),
            "provider": path.name,
            "model": f"SmolLM2-135M-Instruct Q4_1 GGUF ({_versions_label(versions)})",
            "text": f"pydoc_data.topics {'+'.join(TOPICS)} sha256:{text_id(text)}",
        })
    return rows


def _versions_label(versions: dict[str, str]) -> str:
    return ", ".join(f"{k} {v}" for k, v in versions.items())


def format_table(rows: list[dict]) -> str:
    """A plain-text table of :func:`run_model_eval` rows (one line per cache format)."""
    head = f"{'cache':<10} {'path':<11} {'ppl':>9} {'delta':>9} {'top1 agr':>9} {'KL':>9} {'top1 acc':>9} {'tokens':>7}"
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(
            f"{r['cache']:<10} {r['path']:<11} {r['perplexity']:>9.4f} {r['delta']:>+9.4f} "
            f"{r['top1_agreement']:>9.2%} {r['kl_vs_bf16']:>9.2e} {r['top1_accuracy']:>9.2%} {r['tokens']:>7}"
        )
    if rows:
        r = rows[0]
        lines.append(f"baseline BF16 cache; provider {r['provider']}; {r['text']}; {r['model']}")
    return "\n".join(lines)
