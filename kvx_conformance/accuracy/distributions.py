"""Seeded synthetic K/V tensors ``[tokens, kv_heads, head_dim]`` (FP32) for the accuracy benchmark.

* ``gaussian``   i.i.d. N(0, 1).
* ``student_t3`` i.i.d. Student-t with 3 degrees of freedom (heavy tails, finite variance).
* ``k_outliers`` K-like: per-(head, channel) lognormal scales and offsets, plus a few
  outlier channels per head with a large offset and scale (the channel structure
  keys show before and after RoPE).
* ``v_like``     V-like: Gaussian channels with mild lognormal channel scales, each token
  scaled by a lognormal factor (values vary per token, not per channel).

Values are FP32 "activation truth"; every method, BF16 included, rounds from it.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["DISTRIBUTIONS", "Sample", "sample"]

DISTRIBUTIONS: tuple[str, ...] = ("gaussian", "student_t3", "k_outliers", "v_like")

#: K-like outliers: channels per head, their scale multiplier and offset (in units of their scale)
OUTLIER_CHANNELS = 4
OUTLIER_SCALE = 12.0
OUTLIER_OFFSET = 3.0


@dataclass(frozen=True)
class Sample:
    """One draw: ``x`` and which (head, channel) pairs are outlier channels."""

    name: str
    x: np.ndarray  # float32 [tokens, kv_heads, head_dim]
    outliers: np.ndarray  # bool [kv_heads, head_dim]
    seed: tuple[int, ...]


def _rng(seed: int, name: str, stream: int) -> tuple[np.random.Generator, tuple[int, ...]]:
    key = (int(seed), DISTRIBUTIONS.index(name), int(stream))
    return np.random.default_rng(key), key


def sample(name: str, tokens: int, kv_heads: int, head_dim: int, seed: int = 0, stream: int = 0) -> Sample:
    """Draw ``name``; the same (seed, name, stream) always gives the same tensor."""
    if name not in DISTRIBUTIONS:
        raise ValueError(f"unknown distribution {name!r}; known: {', '.join(DISTRIBUTIONS)}")
    rng, key = _rng(seed, name, stream)
    shape = (tokens, kv_heads, head_dim)
    outliers = np.zeros((kv_heads, head_dim), dtype=bool)
    if name == "gaussian":
        x = rng.standard_normal(shape)
    elif name == "student_t3":
        x = rng.standard_t(3, size=shape)
    elif name == "k_outliers":
        scale = rng.lognormal(0.0, 0.5, size=(kv_heads, head_dim))
        offset = rng.normal(0.0, 0.5, size=(kv_heads, head_dim)) * scale
        for h in range(kv_heads):
            idx = rng.choice(head_dim, size=min(OUTLIER_CHANNELS, head_dim), replace=False)
            outliers[h, idx] = True
        scale = np.where(outliers, scale * OUTLIER_SCALE, scale)
        sign = np.where(rng.random((kv_heads, head_dim)) < 0.5, -1.0, 1.0)
        offset = np.where(outliers, sign * OUTLIER_OFFSET * scale, offset)
        x = offset + scale * rng.standard_normal(shape)
    else:  # v_like
        channel = rng.lognormal(0.0, 0.25, size=(kv_heads, head_dim))
        token = rng.lognormal(0.0, 0.5, size=(tokens, kv_heads, 1))
        x = 0.5 * token * channel * rng.standard_normal(shape)
    return Sample(name, np.ascontiguousarray(x, dtype=np.float32), outliers, key)
