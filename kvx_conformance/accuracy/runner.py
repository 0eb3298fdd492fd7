"""Accuracy benchmark: every KV storage method on every synthetic distribution, one row each.

``run_accuracy()`` measures the numpy oracle's codecs (``path = "oracle"``). Measuring
a provider needs its FP4 cache (KVX 1.2 "fp4" profile: write quantizes, gather
dequantizes); that path is :func:`provider_roundtrip`, which a later phase fills in.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from ..reference_impl import quant
from . import metrics
from .distributions import DISTRIBUTIONS, sample
from .paged_attention import build_paged, paged_decode_attention

__all__ = [
    "BenchConfig",
    "FULL",
    "QUICK",
    "ProviderAccuracyUnavailable",
    "provider_roundtrip",
    "run_accuracy",
    "format_table",
    "ROW_KEYS",
]


@dataclass(frozen=True)
class BenchConfig:
    tokens: int  # K and V tokens per distribution (split over num_seqs sequences)
    kv_heads: int
    q_heads: int
    head_dim: int
    block_size: int
    num_seqs: int
    decode_steps: int  # independent decode queries per sequence for the attention error
    logit_queries: int
    seed: int = 20250101


FULL = BenchConfig(tokens=8192, kv_heads=2, q_heads=8, head_dim=128, block_size=16, num_seqs=8, decode_steps=8, logit_queries=64)
QUICK = BenchConfig(tokens=1024, kv_heads=2, q_heads=4, head_dim=128, block_size=16, num_seqs=4, decode_steps=2, logit_queries=16)

ROW_KEYS: tuple[str, ...] = (
    "method", "label", "distribution", "path",
    "rel_rmse", "snr_db", "cosine", "max_abs_err", "rel_rmse_inliers", "logit_rmse", "attn_rel_err",
    "bits_per_value", "bytes_per_token", "compression_vs_bf16", "compression_vs_fp8",
    "tokens", "kv_heads", "q_heads", "head_dim", "seed",
)


class ProviderAccuracyUnavailable(NotImplementedError):
    """The provider path of the accuracy benchmark is not there yet."""


def provider_roundtrip(provider: Any, method_name: str, x: np.ndarray) -> np.ndarray:
    """Phase-2 hook: write ``x [tokens, kv_heads, head_dim]`` into ``provider``'s cache stored
    as ``method_name`` (kvx write), read it back with a dequantizing gather, return FP32.

    Needs the KVX 1.2 FP4 extension (FP4 dtypes, scale pool) in the ABI mirror and the
    provider; until then every provider is refused rather than measured by the oracle.
    """
    raise ProviderAccuracyUnavailable(
        f"accuracy through a provider ({method_name!r}) needs the KVX 1.2 FP4 extension, which the harness "
        "does not drive yet; run without a provider for the oracle figures"
    )


def _seq_lens(tokens: int, num_seqs: int, rng: np.random.Generator) -> np.ndarray:
    """Uneven lengths adding up to ``tokens`` (each at least 1)."""
    cuts = np.sort(rng.choice(np.arange(1, tokens), size=num_seqs - 1, replace=False))
    return np.diff(np.concatenate(([0], cuts, [tokens]))).astype(np.int64)


@dataclass(frozen=True)
class _AttentionCase:
    """Sequence split, physical block layout, queries and the reference output of one distribution."""

    lens: np.ndarray
    layout_seed: int
    q: np.ndarray  # [num_seqs, decode_steps, q_heads, head_dim]
    ref: np.ndarray

    def rel_err(self, cfg: BenchConfig, k_hat: np.ndarray, v_hat: np.ndarray) -> float:
        got = build_paged(k_hat, v_hat, self.lens, cfg.block_size, np.random.default_rng(self.layout_seed))
        out = paged_decode_attention(self.q, got.k_cache, got.v_cache, got.block_table, got.seq_lens)
        return metrics.rel_err(self.ref, out)


def _attention_case(cfg: BenchConfig, k: np.ndarray, v: np.ndarray, key: tuple[int, ...]) -> _AttentionCase:
    rng = np.random.default_rng(key + (1,))
    lens = _seq_lens(cfg.tokens, cfg.num_seqs, rng)
    layout_seed = int(rng.integers(2**31))
    q = rng.standard_normal((cfg.num_seqs, cfg.decode_steps, cfg.q_heads, cfg.head_dim))
    ref = build_paged(k, v, lens, cfg.block_size, np.random.default_rng(layout_seed))
    out = paged_decode_attention(q, ref.k_cache, ref.v_cache, ref.block_table, ref.seq_lens)
    return _AttentionCase(lens, layout_seed, q, out)


def _rows_for(
    cfg: BenchConfig,
    dist: str,
    path: str,
    roundtrip_of: Callable[[quant.QuantMethod], Callable[[np.ndarray], np.ndarray]],
) -> list[dict]:
    ks = sample(dist, cfg.tokens, cfg.kv_heads, cfg.head_dim, cfg.seed, stream=0)
    vs = sample(dist, cfg.tokens, cfg.kv_heads, cfg.head_dim, cfg.seed, stream=1)
    k, v = ks.x, vs.x
    both = np.stack([k, v]).astype(np.float64)
    attention = _attention_case(cfg, k, v, ks.seed)
    inliers = np.stack([~ks.outliers, ~vs.outliers])[:, None]  # [2, 1, H, D]
    q_logit = np.random.default_rng(ks.seed + (2,)).standard_normal((cfg.logit_queries, cfg.kv_heads, cfg.head_dim))
    bf16 = quant.method("bf16").bytes_per_token(cfg.kv_heads, cfg.head_dim)
    fp8 = quant.method("fp8_e4m3_tensor").bytes_per_token(cfg.kv_heads, cfg.head_dim)
    rows = []
    for m in quant.METHODS:
        rt = roundtrip_of(m)
        k_hat = np.asarray(rt(k), dtype=np.float32)
        v_hat = np.asarray(rt(v), dtype=np.float32)
        got = np.stack([k_hat, v_hat]).astype(np.float64)
        nbytes = m.bytes_per_token(cfg.kv_heads, cfg.head_dim)
        rows.append({
            "method": m.name,
            "label": m.label,
            "distribution": dist,
            "path": path,
            "rel_rmse": metrics.rel_rmse(both, got),
            "snr_db": metrics.snr_db(both, got),
            "cosine": metrics.cosine(both, got),
            "max_abs_err": metrics.max_abs_err(both, got),
            "rel_rmse_inliers": metrics.rel_rmse(both, got, keep=inliers),
            "logit_rmse": metrics.logit_rmse(q_logit, k, k_hat),
            "attn_rel_err": attention.rel_err(cfg, k_hat, v_hat),
            "bits_per_value": m.bits_per_value(cfg.head_dim),
            "bytes_per_token": nbytes,
            "compression_vs_bf16": bf16 / nbytes,
            "compression_vs_fp8": fp8 / nbytes,
            "tokens": cfg.tokens,
            "kv_heads": cfg.kv_heads,
            "q_heads": cfg.q_heads,
            "head_dim": cfg.head_dim,
            "seed": cfg.seed,
        })
    return rows


def run_accuracy(provider: Any = None, quick: bool = False, config: BenchConfig | None = None) -> list[dict]:
    """One row per (method, distribution) with the keys in :data:`ROW_KEYS`.

    Oracle rows always; with a provider, the same rows measured through it follow
    (``path = "provider"``), which raises :class:`ProviderAccuracyUnavailable` until
    :func:`provider_roundtrip` exists.
    """
    cfg = config or (QUICK if quick else FULL)
    provider_rows: list[dict] = []
    if provider is not None:  # measured first, so a provider that cannot be measured fails fast
        for dist in DISTRIBUTIONS:
            provider_rows += _rows_for(
                cfg, dist, "provider", lambda m: functools.partial(provider_roundtrip, provider, m.name)
            )
    rows: list[dict] = []
    for dist in DISTRIBUTIONS:
        rows += _rows_for(cfg, dist, "oracle", lambda m: m.roundtrip)
    return rows + provider_rows


def _fmt(x: float, spec: str) -> str:
    if isinstance(x, float) and math.isinf(x):
        return "inf"
    return format(x, spec)


_COLUMNS: tuple[tuple[str, str, str], ...] = (
    # header, key, format
    ("method", "label", "<22"),
    ("bits/val", "bits_per_value", ">8.2f"),
    ("B/token", "bytes_per_token", ">8.0f"),
    ("xBF16", "compression_vs_bf16", ">6.2f"),
    ("xFP8", "compression_vs_fp8", ">5.2f"),
    ("relRMSE", "rel_rmse", ">8.4f"),
    ("SNR dB", "snr_db", ">7.2f"),
    ("cosine", "cosine", ">8.5f"),
    ("max|err|", "max_abs_err", ">9.3g"),
    ("inliers", "rel_rmse_inliers", ">8.4f"),
    ("logitRMSE", "logit_rmse", ">9.4f"),
    ("attn err", "attn_rel_err", ">8.4f"),
    ("path", "path", "<8"),
)


def format_table(rows: list[dict]) -> str:
    """Fixed-width text table, one block per distribution (in row order)."""
    if not rows:
        return "(no accuracy rows)"
    widths = [len(h) for h, _, _ in _COLUMNS]
    cells_by_dist: dict[str, list[list[str]]] = {}
    for r in rows:
        cells = []
        for h, key, f in _COLUMNS:
            val = r[key]
            cells.append(format(val, f) if isinstance(val, str) else _fmt(val, f))
        cells_by_dist.setdefault(r["distribution"], []).append(cells)
    for cells_list in cells_by_dist.values():
        for cells in cells_list:
            widths = [max(w, len(c)) for w, c in zip(widths, cells)]
    def line(cells: list[str]) -> str:
        return "  ".join(c.ljust(w) if i in (0, len(cells) - 1) else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths))).rstrip()
    header = line([h for h, _, _ in _COLUMNS])
    first = rows[0]
    out = [
        f"KV accuracy: {first['tokens']} tokens x {first['kv_heads']} KV heads x head_dim {first['head_dim']}"
        f" (GQA {first['q_heads']} query heads), seed {first['seed']}; relRMSE/SNR/cosine/max|err| over K and V,"
        " inliers = relRMSE without outlier channels, logitRMSE on K, attn err = paged decode attention",
    ]
    for dist, cells_list in cells_by_dist.items():
        out += ["", f"[{dist}]", header, "-" * len(header)]
        out += [line(c) for c in cells_list]
    return "\n".join(out)
