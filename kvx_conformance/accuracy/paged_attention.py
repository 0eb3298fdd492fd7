"""Paged decode-attention oracle: ``softmax(q . K^T / sqrt(d)) . V`` gathered through a block table.

Caches are NHD pools ``[num_blocks, block_size, kv_heads, head_dim]``; token ``t`` of
sequence ``b`` lives at ``cache[block_table[b, t // block_size], t % block_size]``.
Queries are ``[batch, q_heads, head_dim]`` with ``q_heads`` a multiple of ``kv_heads``
(GQA: query head ``h`` reads KV head ``h // (q_heads // kv_heads)``). Computed in FP64.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

__all__ = ["PagedKV", "build_paged", "gather_sequence", "paged_decode_attention"]


@dataclass(frozen=True)
class PagedKV:
    k_cache: np.ndarray  # [num_blocks, block_size, kv_heads, head_dim]
    v_cache: np.ndarray
    block_table: np.ndarray  # int32 [batch, max_blocks_per_seq]; unused entries -1
    seq_lens: np.ndarray  # int32 [batch]

    @property
    def block_size(self) -> int:
        return int(self.k_cache.shape[1])


def build_paged(
    k: np.ndarray,
    v: np.ndarray,
    seq_lens: np.ndarray | list[int],
    block_size: int,
    rng: np.random.Generator,
    spare_blocks: int = 2,
) -> PagedKV:
    """Scatter sequences stored back to back in ``k, v [sum(seq_lens), H, D]`` into paged pools.

    Physical blocks are a random permutation (plus ``spare_blocks`` unused ones); every
    slot that holds no token is NaN, so an oracle or provider reading past a sequence
    shows it.
    """
    k = np.asarray(k)
    v = np.asarray(v)
    lens = np.asarray(seq_lens, dtype=np.int64)
    if k.shape != v.shape or k.ndim != 3:
        raise ValueError(f"k {k.shape} and v {v.shape} must both be [tokens, kv_heads, head_dim]")
    if np.any(lens < 0) or int(lens.sum()) != k.shape[0]:
        raise ValueError(f"seq_lens {lens.tolist()} do not add up to {k.shape[0]} tokens")
    per_seq = [-(-int(n) // block_size) for n in lens]
    num_blocks = sum(per_seq) + spare_blocks
    max_blocks = max(per_seq, default=0) or 1
    perm = rng.permutation(num_blocks)
    shape = (num_blocks, block_size) + k.shape[1:]
    k_cache = np.full(shape, np.nan, dtype=k.dtype)
    v_cache = np.full(shape, np.nan, dtype=v.dtype)
    table = np.full((len(lens), max_blocks), -1, dtype=np.int32)
    start = 0
    used = 0
    for b, (n, nb) in enumerate(zip(lens, per_seq)):
        for j in range(nb):
            blk = int(perm[used])
            used += 1
            table[b, j] = blk
            lo = start + j * block_size
            hi = min(start + int(n), lo + block_size)
            k_cache[blk, : hi - lo] = k[lo:hi]
            v_cache[blk, : hi - lo] = v[lo:hi]
        start += int(n)
    return PagedKV(k_cache, v_cache, table, lens.astype(np.int32))


def gather_sequence(cache: np.ndarray, block_table: np.ndarray, seq_len: int, seq: int) -> np.ndarray:
    """Tokens ``[seq_len, kv_heads, head_dim]`` of sequence ``seq`` read through the table."""
    num_blocks, block_size = cache.shape[:2]
    need = -(-int(seq_len) // block_size)
    if seq_len < 0 or need > block_table.shape[1]:
        raise ValueError(f"sequence {seq}: length {seq_len} needs {need} blocks, table has {block_table.shape[1]}")
    ids = np.asarray(block_table[seq, :need], dtype=np.int64)
    if np.any((ids < 0) | (ids >= num_blocks)):
        raise ValueError(f"sequence {seq}: block ids {ids.tolist()} outside [0, {num_blocks})")
    return cache[ids].reshape((need * block_size,) + cache.shape[2:])[:seq_len]


def paged_decode_attention(
    q: np.ndarray,
    k_cache: np.ndarray,
    v_cache: np.ndarray,
    block_table: np.ndarray,
    seq_lens: np.ndarray,
    scale: float | None = None,
) -> np.ndarray:
    """Decode attention per sequence, in FP64.

    ``q`` is ``[batch, q_heads, head_dim]`` (one decode step) or
    ``[batch, steps, q_heads, head_dim]`` (independent decode queries, each attending to
    the whole sequence); the output has the shape of ``q``. ``scale`` defaults to
    ``1 / sqrt(head_dim)``. A sequence of length 0 outputs zeros.
    """
    q = np.asarray(q, dtype=np.float64)
    single = q.ndim == 3
    if single:
        q = q[:, None]
    if q.ndim != 4:
        raise ValueError(f"queries must be [batch, q_heads, head_dim] or [batch, steps, q_heads, head_dim], got {q.shape}")
    batch, steps, q_heads, head_dim = q.shape
    kv_heads = k_cache.shape[2]
    if k_cache.shape != v_cache.shape or k_cache.shape[3] != head_dim:
        raise ValueError(f"caches {k_cache.shape}/{v_cache.shape} do not match queries {q.shape}")
    if q_heads % kv_heads:
        raise ValueError(f"q_heads {q_heads} is not a multiple of kv_heads {kv_heads}")
    if len(seq_lens) != batch or block_table.shape[0] != batch:
        raise ValueError(f"batch {batch}: seq_lens {len(seq_lens)} and block_table {block_table.shape[0]} rows")
    group = q_heads // kv_heads
    scale = 1.0 / math.sqrt(head_dim) if scale is None else float(scale)
    out = np.zeros(q.shape, dtype=np.float64)
    for b in range(batch):
        n = int(seq_lens[b])
        if n == 0:
            continue
        keys = gather_sequence(k_cache, block_table, n, b).astype(np.float64).transpose(1, 0, 2)  # [Hkv, n, D]
        vals = gather_sequence(v_cache, block_table, n, b).astype(np.float64).transpose(1, 0, 2)
        # query head h = kv * group + j reads KV head kv
        qg = q[b].reshape(steps, kv_heads, group, head_dim).transpose(1, 0, 2, 3).reshape(kv_heads, steps * group, head_dim)
        logits = np.matmul(qg, keys.transpose(0, 2, 1)) * scale  # [Hkv, steps*group, n]
        logits -= logits.max(axis=-1, keepdims=True)
        p = np.exp(logits)
        p /= p.sum(axis=-1, keepdims=True)
        o = np.matmul(p, vals)  # [Hkv, steps*group, D]
        out[b] = o.reshape(kv_heads, steps, group, head_dim).transpose(1, 0, 2, 3).reshape(steps, q_heads, head_dim)
    return out[:, 0] if single else out
