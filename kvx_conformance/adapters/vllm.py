"""vLLM caches and metadata as KVX descriptors.

Engine facts (seed 003; ``vllm/csrc/cache_kernels.cu``, ``vllm/v1/worker/block_table.py``):

- ``reshape_and_cache_flash`` takes K/V caches as logical ``[num_blocks, block_size,
  num_heads, head_size]`` tensors and addresses them through their strides
  (``block_stride``, ``page_stride``, ``head_stride``); ``head_stride == head_size``
  means the NHD layout, otherwise the memory is HND permuted to that logical view.
- ``reshape_and_cache`` (paged attention) takes packed K ``[num_blocks, num_heads,
  head_size / x, block_size, x]`` and V ``[num_blocks, num_heads, head_size,
  block_size]``.
- ``slot_mapping`` is int64, ``-1`` for padded or non-local tokens; ``block_table`` is
  int32 ``[max_num_reqs, max_num_blocks_per_req]``.
- Hybrid block sizes: a KV-manager block of ``block_size`` tokens is
  ``blocks_per_kv_block = block_size // kernel_block_size`` kernel blocks, manager
  block ``m`` being kernel blocks ``m * blocks_per_kv_block + [0, blocks_per_kv_block)``.
- Decode context parallelism: the slot mapping uses a virtual block of
  ``block_size * cp_world_size`` tokens, interleaved across ranks in runs of
  ``cp_kv_cache_interleave_size`` tokens; tokens of other ranks get ``-1``.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from ..abi.descriptors import BlockTable, Geometry, SeqLens, SlotMapping, TensorLayout
from ..abi.header import DType, Layout
from .common import AdaptedCache, AdapterError, array_info, cache_dtype, index_dtype, to_numpy

PAD_SLOT_ID = -1


def _check_same(what: str, a: tuple[int, ...], b: tuple[int, ...]) -> None:
    if a != b:
        raise AdapterError(what, f"K and V disagree ({a} vs {b}); a KVX cache has one geometry")


def flash_cache(key_cache: Any, value_cache: Any, *, kv_cache_dtype: str | DType = "auto") -> AdaptedCache:
    """``reshape_and_cache_flash`` caches: logical ``[num_blocks, block_size, H, D]`` views.

    Described as BLOCK_NHD when the head stride equals ``head_size`` (vLLM's test),
    else as BLOCK_HND with the same strides in HND order. Either way every element
    keeps the address vLLM gives it.
    """
    k = array_info(key_cache, "vLLM key_cache")
    v = array_info(value_cache, "vLLM value_cache")
    for info, name in ((k, "key_cache"), (v, "value_cache")):
        if len(info.shape) != 4:
            raise AdapterError(f"vLLM {name} of shape {info.shape}", "reshape_and_cache_flash caches are 4-D [num_blocks, block_size, num_heads, head_size]")
    _check_same("vLLM flash cache shapes", k.shape, v.shape)
    nb, bs, h, d = k.shape
    geom = Geometry(nb, bs, h, d)
    layouts = []
    for info, name in ((k, "key_cache"), (v, "value_cache")):
        dt = cache_dtype(info, kv_cache_dtype, f"vLLM {name}")
        s0, s1, s2, s3 = info.stride
        if s2 == d:  # contiguous heads: NHD
            layouts.append(TensorLayout(dt, Layout.BLOCK_NHD, (nb, bs, h, d), (s0, s1, s2, s3)))
        else:
            layouts.append(TensorLayout(dt, Layout.BLOCK_HND, (nb, h, bs, d), (s0, s2, s1, s3)))
    name = "NHD" if layouts[0].layout == Layout.BLOCK_NHD else "HND"
    return AdaptedCache(f"vllm.flash/{name}", geom, layouts[0], layouts[1], key_cache, value_cache)


def flash_kv_cache(kv_cache: Any, *, backend: str = "flash_attn", kv_cache_dtype: str | DType = "auto") -> AdaptedCache:
    """A backend's combined per-layer cache: FlashAttention ``[2, num_blocks, block_size, H, D]``,
    FlashInfer ``[num_blocks, 2, block_size, H, D]`` (logical order; any stride order)."""
    if backend == "flash_attn":
        key, value = kv_cache[0], kv_cache[1]
    elif backend == "flashinfer":
        key, value = kv_cache[:, 0], kv_cache[:, 1]
    else:
        raise ValueError(f"backend must be 'flash_attn' or 'flashinfer', got {backend!r}")
    return flash_cache(key, value, kv_cache_dtype=kv_cache_dtype)


def paged_cache(key_cache: Any, value_cache: Any, *, kv_cache_dtype: str | DType = "auto") -> AdaptedCache:
    """``reshape_and_cache`` caches: packed K as BLOCK_HND_PACKED (pack = x), V
    ``[num_blocks, H, D, block_size]`` as BLOCK_HND with transposed strides."""
    k = array_info(key_cache, "vLLM key_cache")
    v = array_info(value_cache, "vLLM value_cache")
    if len(k.shape) != 5:
        raise AdapterError(f"vLLM paged key_cache of shape {k.shape}", "expected [num_blocks, num_heads, head_size/x, block_size, x]")
    if len(v.shape) != 4:
        raise AdapterError(f"vLLM paged value_cache of shape {v.shape}", "expected [num_blocks, num_heads, head_size, block_size]")
    nb, h, dx, bs, x = k.shape
    d = dx * x
    _check_same("vLLM paged cache [num_blocks, H, head_size, block_size]", (nb, h, d, bs), v.shape)
    geom = Geometry(nb, bs, h, d)
    kl = TensorLayout(cache_dtype(k, kv_cache_dtype, "vLLM key_cache"), Layout.BLOCK_HND_PACKED, (nb, h, dx, bs, x), k.stride)
    s0, s1, s2, s3 = v.stride
    vl = TensorLayout(cache_dtype(v, kv_cache_dtype, "vLLM value_cache"), Layout.BLOCK_HND, (nb, h, bs, d), (s0, s1, s3, s2))
    return AdaptedCache("vllm.paged", geom, kl, vl, key_cache, value_cache)


def slot_mapping(slots: Any, num_tokens: int | None = None) -> SlotMapping:
    """``slot_mapping`` (int64, ``-1`` = padded / non-local) as a KVX slot mapping.

    ``num_tokens`` takes the first tokens only (vLLM's buffer is padded to
    ``max_num_batched_tokens`` with ``-1``; passing the whole buffer is also valid).
    """
    dt = index_dtype(slots, "vLLM slot_mapping")
    arr = np.asarray(to_numpy(slots), dtype=np.int64).reshape(-1)
    if num_tokens is not None:
        arr = arr[:num_tokens]
    return SlotMapping(arr.copy(), dtype=dt, invalid_slot=PAD_SLOT_ID)


def block_table(table: Any, num_reqs: int | None = None) -> BlockTable:
    """``block_table`` (int32 ``[max_num_reqs, max_num_blocks_per_req]``) as PACKED."""
    dt = index_dtype(table, "vLLM block_table")
    arr = np.asarray(to_numpy(table), dtype=np.int64)
    if arr.ndim != 2:
        raise AdapterError(f"vLLM block_table of shape {arr.shape}", "PACKED tables are 2-D [seq_count, max_blocks_per_seq]")
    if num_reqs is not None:
        arr = arr[:num_reqs]
    return BlockTable.packed(arr, index_dtype=dt)


# ----------------------------------------------------------------------------
# Hybrid manager / kernel block sizes


def blocks_per_kv_block(manager_block_size: int, kernel_block_size: int) -> int:
    if kernel_block_size <= 0 or manager_block_size % kernel_block_size:
        raise AdapterError(
            f"vLLM kernel_block_size {kernel_block_size} with manager block_size {manager_block_size}",
            "a manager block must be a whole number of kernel blocks for a KVX table of kernel blocks",
        )
    return manager_block_size // kernel_block_size


def map_to_kernel_blocks(manager_block_ids: Any, blocks_per_kv_block: int) -> np.ndarray:
    """Manager block ``m`` -> kernel blocks ``m * k + [0, k)`` (``k = blocks_per_kv_block``)."""
    ids = np.asarray(manager_block_ids, dtype=np.int64).reshape(-1, 1)
    return (ids * blocks_per_kv_block + np.arange(blocks_per_kv_block, dtype=np.int64)).reshape(-1)


def hybrid_block_table(
    manager_table: Any, num_blocks_per_row: Any, manager_block_size: int, kernel_block_size: int, pad_id: int = 0,
) -> BlockTable:
    """A KVX PACKED table of kernel blocks from a table of manager blocks.

    Row ``r`` expands its first ``num_blocks_per_row[r]`` manager blocks; the rest of
    the ``max_blocks * blocks_per_kv_block`` columns hold ``pad_id``. The cache
    geometry to pair it with has ``block_size = kernel_block_size`` and
    ``num_blocks = manager blocks * blocks_per_kv_block``.
    """
    k = blocks_per_kv_block(manager_block_size, kernel_block_size)
    mt = np.asarray(to_numpy(manager_table), dtype=np.int64)
    counts = np.asarray(to_numpy(num_blocks_per_row), dtype=np.int64)
    out = np.full((mt.shape[0], mt.shape[1] * k), pad_id, dtype=np.int64)
    for r in range(mt.shape[0]):
        n = int(counts[r])
        out[r, : n * k] = map_to_kernel_blocks(mt[r, :n], k)
    return BlockTable.packed(out, index_dtype=DType.S32)


# ----------------------------------------------------------------------------
# Slot mapping from positions (incl. decode context parallelism)


def _check_cp(block_size: int, cp_world_size: int, cp_rank: int, interleave: int) -> None:
    if cp_world_size < 1 or not 0 <= cp_rank < cp_world_size:
        raise ValueError(f"cp_rank {cp_rank} outside a world of {cp_world_size}")
    if interleave < 1 or (cp_world_size > 1 and block_size % interleave):
        raise AdapterError(
            f"vLLM cp_kv_cache_interleave_size {interleave} with block_size {block_size}",
            "interleave runs that do not divide the block would place local tokens past the block's end",
        )


def _local_offsets(pos: np.ndarray, block_size: int, world: int, rank: int, interleave: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    vbs = block_size * world
    block_idx = pos // vbs
    vo = pos % vbs
    local = (vo // interleave) % world == rank
    off = (vo // (world * interleave)) * interleave + vo % interleave
    return block_idx, off, local


def compute_slot_mapping(
    block_table: Any, query_start_loc: Any, positions: Any, block_size: int, *,
    cp_world_size: int = 1, cp_rank: int = 0, cp_kv_cache_interleave_size: int = 1, pad_to: int | None = None,
) -> SlotMapping:
    """The slot mapping vLLM's ``BlockTable.compute_slot_mapping`` produces, as KVX.

    Token ``i`` of request ``r`` (``query_start_loc[r] <= i < query_start_loc[r+1]``) at
    position ``p``: block ``table[r, p // (block_size * W)]``, local offset from the
    interleave; tokens owned by another rank, and padding up to ``pad_to``, get -1.
    ``block_table`` is in kernel blocks (see :func:`hybrid_block_table`).
    """
    _check_cp(block_size, cp_world_size, cp_rank, cp_kv_cache_interleave_size)
    table = np.asarray(to_numpy(block_table), dtype=np.int64)
    qsl = np.asarray(to_numpy(query_start_loc), dtype=np.int64)
    pos = np.asarray(to_numpy(positions), dtype=np.int64)
    n = len(pos)
    req = np.repeat(np.arange(len(qsl) - 1), np.diff(qsl))
    if len(req) != n:
        raise ValueError(f"query_start_loc covers {len(req)} tokens, positions has {n}")
    block_idx, off, local = _local_offsets(pos, block_size, cp_world_size, cp_rank, cp_kv_cache_interleave_size)
    if n and block_idx.max() >= table.shape[1]:
        raise ValueError(f"position {int(pos.max())} needs logical block {int(block_idx.max())}, the table has {table.shape[1]}")
    slots = np.where(local, table[req, block_idx] * block_size + off, PAD_SLOT_ID) if n else np.zeros(0, np.int64)
    if pad_to is not None:
        slots = np.concatenate([slots, np.full(max(0, pad_to - n), PAD_SLOT_ID, np.int64)])
    return SlotMapping(slots.astype(np.int64), dtype=DType.S64, invalid_slot=PAD_SLOT_ID)


def cp_local_seq_lens(
    seq_lens: Any, block_size: int, cp_world_size: int, cp_rank: int, cp_kv_cache_interleave_size: int = 1,
    dtype: DType = DType.S32,
) -> SeqLens:
    """Tokens of each sequence that this context-parallel rank holds.

    The rank's tokens of positions ``[0, L)`` fill its blocks in order (local token
    ``k`` at logical block ``k // block_size``), so a KVX gather with the same PACKED
    table and these lengths returns exactly the rank's share.
    """
    _check_cp(block_size, cp_world_size, cp_rank, cp_kv_cache_interleave_size)
    out = []
    for L in np.asarray(to_numpy(seq_lens), dtype=np.int64):
        p = np.arange(int(L), dtype=np.int64)
        out.append(int(_local_offsets(p, block_size, cp_world_size, cp_rank, cp_kv_cache_interleave_size)[2].sum()))
    return SeqLens(np.asarray(out, dtype=np.int64), dtype=dtype)


def cp_local_positions(
    length: int, block_size: int, cp_world_size: int, cp_rank: int, cp_kv_cache_interleave_size: int = 1,
) -> np.ndarray:
    """Global positions, in local-token order, of the tokens a rank holds of ``[0, length)``."""
    _check_cp(block_size, cp_world_size, cp_rank, cp_kv_cache_interleave_size)
    p = np.arange(int(length), dtype=np.int64)
    block_idx, off, local = _local_offsets(p, block_size, cp_world_size, cp_rank, cp_kv_cache_interleave_size)
    local_index = block_idx * block_size + off
    order = np.argsort(np.where(local, local_index, np.iinfo(np.int64).max), kind="stable")
    return p[order][: int(local.sum())]
