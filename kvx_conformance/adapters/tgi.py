"""text-generation-inference (TGI) caches and metadata as KVX descriptors.

Engine facts (seed 003; ``server/text_generation_server/layers/attention/kv_cache.py``,
``models/flash_causal_lm.py``, ``models/metadata_kernels.py``, ``models/globals.py``):

- ``flashinfer`` / ``flashdecoding``: K and V ``[num_blocks, BLOCK_SIZE, num_heads,
  head_size]`` (NHD); the store is ``cache.view(-1, H, D)[slots] = key``.
- IPEX CPU: ``[num_blocks, num_heads, BLOCK_SIZE, head_size]`` (HND).
- ``paged``: K ``[num_blocks, H, head_size // x, BLOCK_SIZE, x]``, V ``[num_blocks, H,
  head_size, BLOCK_SIZE]`` with ``x = BLOCK_SIZE // element_size`` (``x = 1`` on IPEX XPU).
- ``BLOCK_SIZE`` is 1 with flashinfer, 256 with flashdecoding, 16 otherwise.
- ``block_tables_tensor``: padded int32 ``[num_reqs, max_blocks]``.
- ``block_tables_ragged``: int32, ``block_tables[i][:cache_len + input_len]`` of each
  request concatenated: per token only because flashinfer runs with BLOCK_SIZE 1.
- ``slots``: one global slot per token; no padding sentinel.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from ..abi.descriptors import BlockTable, Geometry, SeqLens, SlotMapping, TensorLayout
from ..abi.header import DType, Layout, TableFormat
from . import vllm as _vllm
from .common import AdaptedCache, AdapterError, array_info, cache_dtype, index_dtype, ragged_table, to_numpy

#: ``BLOCK_SIZE`` of each TGI attention backend (models/globals.py).
BLOCK_SIZES = {"flashinfer": 1, "flashdecoding": 256, "paged": 16}


def flash_cache(key_cache: Any, value_cache: Any, *, kv_cache_dtype: str | DType = "auto") -> AdaptedCache:
    """flashinfer / flashdecoding caches ``[num_blocks, BLOCK_SIZE, H, D]`` as BLOCK_NHD."""
    k = array_info(key_cache, "TGI key cache")
    v = array_info(value_cache, "TGI value cache")
    if len(k.shape) != 4 or k.shape != v.shape:
        raise AdapterError(f"TGI flash caches of shapes {k.shape} / {v.shape}", "expected two [num_blocks, BLOCK_SIZE, num_heads, head_size] tensors")
    geom = Geometry(*k.shape)
    kl = TensorLayout(cache_dtype(k, kv_cache_dtype, "TGI key cache"), Layout.BLOCK_NHD, k.shape, k.stride)
    vl = TensorLayout(cache_dtype(v, kv_cache_dtype, "TGI value cache"), Layout.BLOCK_NHD, v.shape, v.stride)
    return AdaptedCache("tgi.flash/NHD", geom, kl, vl, key_cache, value_cache)


def ipex_cpu_cache(key_cache: Any, value_cache: Any, *, kv_cache_dtype: str | DType = "auto") -> AdaptedCache:
    """IPEX CPU caches ``[num_blocks, H, BLOCK_SIZE, D]`` as BLOCK_HND."""
    k = array_info(key_cache, "TGI key cache")
    v = array_info(value_cache, "TGI value cache")
    if len(k.shape) != 4 or k.shape != v.shape:
        raise AdapterError(f"TGI IPEX caches of shapes {k.shape} / {v.shape}", "expected two [num_blocks, num_heads, BLOCK_SIZE, head_size] tensors")
    nb, h, bs, d = k.shape
    kl = TensorLayout(cache_dtype(k, kv_cache_dtype, "TGI key cache"), Layout.BLOCK_HND, k.shape, k.stride)
    vl = TensorLayout(cache_dtype(v, kv_cache_dtype, "TGI value cache"), Layout.BLOCK_HND, v.shape, v.stride)
    return AdaptedCache("tgi.ipex/HND", Geometry(nb, bs, h, d), kl, vl, key_cache, value_cache)


def pack_factor(block_size: int, element_size: int, *, xpu: bool = False) -> int:
    """TGI's ``x`` for the paged layout: ``BLOCK_SIZE // element_size`` (1 on IPEX XPU)."""
    if xpu:
        return 1
    x = block_size // element_size
    if x == 0:
        raise AdapterError(
            f"TGI paged layout with BLOCK_SIZE {block_size} and {element_size}-byte elements",
            "x = BLOCK_SIZE // element_size is 0, and BLOCK_HND_PACKED needs pack > 0",
        )
    return x


def paged_cache(key_cache: Any, value_cache: Any, *, kv_cache_dtype: str | DType = "auto", xpu: bool = False) -> AdaptedCache:
    """``paged`` caches: packed K as BLOCK_HND_PACKED (pack = x), V as BLOCK_HND by strides.

    Checks that ``x`` is the one TGI allocates (``BLOCK_SIZE // element_size``), so
    a tensor built with another factor is reported rather than misdescribed.
    """
    adapted = _vllm.paged_cache(key_cache, value_cache, kv_cache_dtype=kv_cache_dtype)
    info = array_info(key_cache, "TGI key cache")
    bs = adapted.geometry.block_size
    x = adapted.k.shape[4]
    want = pack_factor(bs, info.itemsize, xpu=xpu)
    if x != want:
        raise ValueError(f"TGI paged key cache has x={x}, TGI allocates x = BLOCK_SIZE // element_size = {want}")
    if adapted.geometry.head_dim % x:
        raise AdapterError(f"TGI paged layout head_size {adapted.geometry.head_dim} with x={x}", "head_dim % pack must be 0 (spec 7.1)")
    adapted.engine = "tgi.paged"
    return adapted


def slots(slot_ids: Any) -> SlotMapping:
    """``slots`` as a KVX slot mapping. TGI has no padding sentinel: its flashinfer store
    indexes the cache with each slot, so a negative slot would wrap to the cache's end
    where KVX writes nothing; such slots are refused."""
    dt = index_dtype(slot_ids, "TGI slots")
    arr = np.asarray(to_numpy(slot_ids), dtype=np.int64).reshape(-1)
    if (arr < 0).any():
        raise AdapterError(
            f"TGI slots with negative value {int(arr.min())}",
            "TGI indexes cache.view(-1, H, D)[slots], wrapping a negative slot to the end, while KVX treats it as a no-op",
        )
    return SlotMapping(arr.copy(), dtype=dt, invalid_slot=-1)


def block_tables_tensor(table: Any, num_reqs: int | None = None) -> BlockTable:
    """``block_tables_tensor`` (padded int32 ``[num_reqs, max_blocks]``) as PACKED."""
    return _vllm.block_table(table, num_reqs)


def seq_lens(input_lengths: Any, cache_lengths: Any, dtype: DType = DType.S32) -> SeqLens:
    """Cached length of each request after this step: ``cache_length + input_length``."""
    il = np.asarray(to_numpy(input_lengths), dtype=np.int64)
    cl = np.asarray(to_numpy(cache_lengths), dtype=np.int64)
    return SeqLens(il + cl, dtype=dtype)


def block_tables_ragged(ragged: Any, input_lengths: Any, cache_lengths: Any, block_size: int) -> tuple[BlockTable, SeqLens]:
    """``block_tables_ragged`` as a KVX RAGGED table (+ indptr from the lengths).

    TGI builds it as ``block_tables[i][:seq_len]``: one entry per token only when
    ``BLOCK_SIZE == 1`` (flashinfer). With larger blocks those entries are block ids
    cut at a token count, not the per-token ids KVX RAGGED holds: refused (use
    :func:`ragged_from_block_tables`).
    """
    dt = index_dtype(ragged, "TGI block_tables_ragged")
    lens = seq_lens(input_lengths, cache_lengths)
    if block_size != 1:
        raise AdapterError(
            f"TGI block_tables_ragged with BLOCK_SIZE {block_size}",
            "TGI slices block_tables[i][:seq_len], per-token only for BLOCK_SIZE 1, while KVX RAGGED needs the block of every token",
        )
    arr = np.asarray(to_numpy(ragged), dtype=np.int64).reshape(-1)
    total = int(lens.lengths.sum())
    if len(arr) != total:
        raise ValueError(f"block_tables_ragged has {len(arr)} entries, the lengths sum to {total}")
    indptr = np.concatenate([[0], np.cumsum(lens.lengths)]).astype(np.int64)
    max_blocks = int(lens.lengths.max()) if len(lens.lengths) else 0
    table = BlockTable(
        format=TableFormat.RAGGED, indices=arr.copy(), seq_count=len(lens.lengths), max_blocks_per_seq=max_blocks,
        index_dtype=dt, indptr=indptr, indptr_dtype=dt,
    )
    return table, SeqLens(lens.lengths, dtype=dt)


def ragged_from_block_tables(block_tables: Any, input_lengths: Any, cache_lengths: Any, block_size: int) -> tuple[BlockTable, SeqLens]:
    """The KVX RAGGED table of a padded TGI block table, for any ``BLOCK_SIZE``
    (equal to TGI's ``block_tables_ragged`` when ``BLOCK_SIZE == 1``)."""
    bt = np.asarray(to_numpy(block_tables), dtype=np.int64)
    lens = seq_lens(input_lengths, cache_lengths)
    table = ragged_table(list(bt), lens.lengths, block_size)
    return table, lens
