"""A Llama-style decoder in numpy float32: RMSNorm, RoPE, grouped-query attention, SwiGLU.

The decoder owns no cache. Each forward step hands every layer's new K and V to a
:class:`~kvx_conformance.model.kv_store.KVStore` and attends over what the store gives
back: all attention reads K/V from the cache, the step's own tokens included (as an
engine whose every attention goes through its paged cache). Several sequences of
different lengths run in one step; their new tokens are concatenated in batch order.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .kv_store import KVStore
from .weights import LlamaConfig, ModelWeights


def rms_norm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    var = np.mean(x * x, axis=-1, keepdims=True, dtype=np.float32)
    return (x / np.sqrt(var + np.float32(eps))) * weight


def silu(x: np.ndarray) -> np.ndarray:
    return x / (np.float32(1.0) + np.exp(-x))


def rope_tables(cfg: LlamaConfig, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """cos/sin ``[n, head_dim/2]`` for the given positions (angles in float64, tables float32)."""
    half = cfg.head_dim // 2
    inv_freq = 1.0 / (cfg.rope_base ** (np.arange(0, half, dtype=np.float64) * 2.0 / cfg.head_dim))
    ang = positions.astype(np.float64)[:, None] * inv_freq[None, :]
    return np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)


def apply_rope(x, cos, sin, neox: bool):
    """Rotate ``x [n, heads, head_dim]``: pairs (i, i + D/2) when ``neox``, else (2i, 2i+1).
    numpy arrays or torch tensors alike (the torch decoder calls it too): slices and
    elementwise products only."""
    c, s = cos[:, None, :], sin[:, None, :]
    out = np.empty_like(x) if isinstance(x, np.ndarray) else x.clone()
    if neox:
        half = x.shape[-1] // 2
        x1, x2 = x[..., :half], x[..., half:]
        out[..., :half] = x1 * c - x2 * s
        out[..., half:] = x2 * c + x1 * s
    else:
        x1, x2 = x[..., 0::2], x[..., 1::2]
        out[..., 0::2] = x1 * c - x2 * s
        out[..., 1::2] = x2 * c + x1 * s
    return out


def attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, first_pos: int, group: int) -> np.ndarray:
    """Causal GQA for one sequence.

    ``q [n, Hq, D]`` are the queries at positions ``first_pos .. first_pos+n-1``;
    ``k, v [L, Hkv, D]`` the whole context (L = first_pos + n). Query head h reads
    KV head ``h // group``. Returns ``[n, Hq * D]``.
    """
    n, hq, d = q.shape
    L, hkv, _ = k.shape
    qg = q.reshape(n, hkv, group, d).transpose(1, 2, 0, 3)  # [Hkv, g, n, D]
    kt = k.transpose(1, 2, 0)  # [Hkv, D, L]
    scores = np.matmul(qg, kt[:, None]) * np.float32(1.0 / np.sqrt(d))  # [Hkv, g, n, L]
    qpos = first_pos + np.arange(n)[:, None]
    scores = np.where(np.arange(L)[None, :] <= qpos, scores, np.float32(-np.inf))
    scores = scores - scores.max(axis=-1, keepdims=True)
    p = np.exp(scores)
    p /= p.sum(axis=-1, keepdims=True)
    out = np.matmul(p, v.transpose(1, 0, 2)[:, None])  # [Hkv, g, n, D]
    return np.ascontiguousarray(out.transpose(2, 0, 1, 3).reshape(n, hq * d))


@dataclass
class StepOutput:
    #: per sequence, logits ``[n_new, vocab]`` (all new positions) or ``[1, vocab]`` (last only)
    logits: list[np.ndarray]


class Decoder:
    def __init__(self, weights: ModelWeights):
        self.w = weights
        self.cfg = weights.config

    def step(self, store: KVStore, seq_ids: list[int], tokens: list[np.ndarray], all_logits: bool = False) -> StepOutput:
        """Run the new ``tokens`` of each sequence ``seq_ids[i]`` through every layer.

        The store appends them after the tokens it already holds for that sequence.
        """
        cfg, w = self.cfg, self.w
        counts = [len(t) for t in tokens]
        starts = store.begin_step(seq_ids, counts)
        ids = np.concatenate([np.asarray(t, dtype=np.int64) for t in tokens])
        positions = np.concatenate([s + np.arange(c) for s, c in zip(starts, counts)])
        cos, sin = rope_tables(cfg, positions)
        bounds = np.concatenate([[0], np.cumsum(counts)])
        x = w.embed[ids]
        for li, lw in enumerate(w.layers):
            h = rms_norm(x, lw.attn_norm, cfg.rms_eps)
            q = (h @ lw.wq.T).reshape(-1, cfg.n_heads, cfg.head_dim)
            k = (h @ lw.wk.T).reshape(-1, cfg.n_kv_heads, cfg.head_dim)
            v = np.ascontiguousarray((h @ lw.wv.T).reshape(-1, cfg.n_kv_heads, cfg.head_dim))
            q = apply_rope(q, cos, sin, w.neox_rotary)
            k = apply_rope(k, cos, sin, w.neox_rotary)
            store.write(li, k, v)
            context = store.read(li)
            attn = np.empty((len(ids), cfg.n_heads * cfg.head_dim), dtype=np.float32)
            for i, (kc, vc) in enumerate(context):
                a, b = bounds[i], bounds[i + 1]
                attn[a:b] = attention(q[a:b], kc, vc, starts[i], cfg.group)
            x = x + attn @ lw.wo.T
            h = rms_norm(x, lw.ffn_norm, cfg.rms_eps)
            x = x + (silu(h @ lw.w_gate.T) * (h @ lw.w_up.T)) @ lw.w_down.T
        store.end_step()
        if all_logits:
            rows = [x[bounds[i]:bounds[i + 1]] for i in range(len(counts))]
        else:
            rows = [x[bounds[i + 1] - 1: bounds[i + 1]] for i in range(len(counts))]
        out = []
        for r in rows:
            out.append(rms_norm(r, w.out_norm, cfg.rms_eps) @ w.lm_head.T)
        return StepOutput(out)


def log_softmax(logits: np.ndarray) -> np.ndarray:
    z = logits.astype(np.float64)
    z = z - z.max(axis=-1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=-1, keepdims=True))
