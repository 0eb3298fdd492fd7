"""Error metrics of a decoded tensor against its FP32 truth (computed in FP64)."""
from __future__ import annotations

import math

import numpy as np

__all__ = ["rel_rmse", "snr_db", "max_abs_err", "cosine", "logit_rmse", "rel_err"]


def _pair(ref: np.ndarray, got: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    ref = np.asarray(ref, dtype=np.float64)
    got = np.asarray(got, dtype=np.float64)
    if ref.shape != got.shape:
        raise ValueError(f"shapes differ: reference {ref.shape}, decoded {got.shape}")
    return ref, got


def _norm(a: np.ndarray) -> float:
    """2-norm by a pairwise sum (no BLAS: deterministic and cheap on a busy machine)."""
    return math.sqrt(float(np.sum(np.square(a))))


def rel_err(ref: np.ndarray, got: np.ndarray) -> float:
    """``||got - ref||_2 / ||ref||_2`` over all elements (0 when both are zero, inf when only ref is)."""
    ref, got = _pair(ref, got)
    num = _norm(got - ref)
    den = _norm(ref)
    if den == 0.0:
        return 0.0 if num == 0.0 else math.inf
    return num / den


def rel_rmse(ref: np.ndarray, got: np.ndarray, keep: np.ndarray | None = None) -> float:
    """Relative RMSE; ``keep`` (broadcastable bool mask) restricts it to some elements."""
    ref, got = _pair(ref, got)
    if keep is not None:
        keep = np.broadcast_to(np.asarray(keep, dtype=bool), ref.shape)
        ref, got = ref[keep], got[keep]
    return rel_err(ref, got)


def snr_db(ref: np.ndarray, got: np.ndarray) -> float:
    """Signal-to-noise ratio ``-20 log10(rel_rmse)`` (inf for an exact result)."""
    r = rel_rmse(ref, got)
    return math.inf if r == 0.0 else -20.0 * math.log10(r)


def max_abs_err(ref: np.ndarray, got: np.ndarray) -> float:
    ref, got = _pair(ref, got)
    return float(np.max(np.abs(got - ref))) if ref.size else 0.0


def cosine(ref: np.ndarray, got: np.ndarray) -> float:
    """Cosine similarity of the flattened tensors."""
    ref, got = _pair(ref, got)
    den = _norm(ref) * _norm(got)
    return float(np.sum(ref * got)) / den if den else (1.0 if not ref.any() and not got.any() else 0.0)


def logit_rmse(q: np.ndarray, k_ref: np.ndarray, k_got: np.ndarray) -> float:
    """RMSE of the attention logits ``q . k / sqrt(head_dim)``.

    ``q``: ``[num_queries, kv_heads, head_dim]``; ``k_*``: ``[tokens, kv_heads, head_dim]``.
    """
    k_ref, k_got = _pair(k_ref, k_got)
    q = np.asarray(q, dtype=np.float64)
    if q.ndim != 3 or q.shape[1:] != k_ref.shape[1:]:
        raise ValueError(f"queries {q.shape} do not match keys {k_ref.shape}")
    d = np.einsum("nhd,thd->nht", q, k_got - k_ref) / math.sqrt(k_ref.shape[-1])
    return float(np.sqrt(np.mean(d * d)))
