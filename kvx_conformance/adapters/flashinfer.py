"""FlashInfer paged-KV metadata to and from KVX tables.

Engine facts (seed 003; ``vllm/v1/attention/backends/flashinfer.py``, FlashInfer's
``docs/tutorials/kv_layout.rst``):

- ``paged_kv_indptr`` ``[batch + 1]``: prefix sums of each request's page count;
- ``paged_kv_indices``: the pages of every request, concatenated;
- ``paged_kv_last_page_len`` ``[batch]``: tokens in each request's last page, in
  ``[1, page_size]``, so ``seq_len = (num_pages - 1) * page_size + last_page_len``
  (a request with no pages has length 0; vLLM writes ``page_size`` there);
- the paged cache is ``[max_pages, 2, page_size, H, D]`` (NHD) or
  ``[max_pages, 2, H, page_size, D]`` (HND), or a (K, V) pair of such tensors
  without the 2.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..abi.descriptors import BlockTable, Geometry, SeqLens, TensorLayout
from ..abi.header import DType, Layout, TableFormat
from .common import AdaptedCache, AdapterError, array_info, cache_dtype, per_token_blocks, ragged_table, to_numpy


@dataclass
class PagedKVMetadata:
    """FlashInfer's three arrays (int32 like FlashInfer's own)."""

    indptr: np.ndarray
    indices: np.ndarray
    last_page_len: np.ndarray
    page_size: int

    def seq_lens(self) -> np.ndarray:
        return lengths_from_metadata(self.indptr, self.last_page_len, self.page_size)


def lengths_from_metadata(indptr: Any, last_page_len: Any, page_size: int) -> np.ndarray:
    """Sequence lengths from ``indptr`` and ``last_page_len`` (validated)."""
    indptr = np.asarray(to_numpy(indptr), dtype=np.int64)
    last = np.asarray(to_numpy(last_page_len), dtype=np.int64)
    if len(indptr) != len(last) + 1:
        raise ValueError(f"paged_kv_indptr has {len(indptr)} entries, expected batch + 1 = {len(last) + 1}")
    pages = np.diff(indptr)
    if len(indptr) and indptr[0] != 0 or (pages < 0).any():
        raise ValueError(f"paged_kv_indptr {indptr.tolist()} must start at 0 and not decrease")
    bad = (pages > 0) & ((last < 1) | (last > page_size))
    if bad.any():
        s = int(np.argmax(bad))
        raise ValueError(f"paged_kv_last_page_len[{s}] = {int(last[s])} outside [1, {page_size}] for a request with pages")
    return np.where(pages > 0, (pages - 1) * page_size + last, 0)


def to_kvx(
    indptr: Any, indices: Any, last_page_len: Any, page_size: int, *, format: TableFormat = TableFormat.PACKED,
    pad_id: int = 0, index_dtype: DType = DType.S32,
) -> tuple[BlockTable, SeqLens]:
    """A KVX PACKED (rows padded with ``pad_id``) or RAGGED table plus seq lens."""
    ip = np.asarray(to_numpy(indptr), dtype=np.int64)
    idx = np.asarray(to_numpy(indices), dtype=np.int64).reshape(-1)
    lens = lengths_from_metadata(ip, last_page_len, page_size)
    if len(ip) and ip[-1] > len(idx):
        raise ValueError(f"paged_kv_indptr ends at {int(ip[-1])}, paged_kv_indices has {len(idx)} entries")
    rows = [idx[ip[s]: ip[s + 1]] for s in range(len(lens))]
    seq_lens = SeqLens(lens, dtype=index_dtype)
    if format == TableFormat.PACKED:
        width = max((len(r) for r in rows), default=0)
        table = np.full((len(rows), width), pad_id, dtype=np.int64)
        for s, r in enumerate(rows):
            table[s, : len(r)] = r
        return BlockTable.packed(table, index_dtype=index_dtype), seq_lens
    if format == TableFormat.RAGGED:
        return ragged_table(rows, lens, page_size, index_dtype=index_dtype), seq_lens
    raise AdapterError(f"FlashInfer metadata as {TableFormat(format).name}", "KV_OFFSETS needs TensorRT-LLM pool indices, FlashInfer pages are plain block ids")


def _last_page_len(lens: np.ndarray, page_size: int) -> np.ndarray:
    last = lens % page_size
    return np.where(last == 0, page_size, last)  # vLLM's convention, also for empty requests


def from_packed(table: BlockTable, seq_lens: SeqLens, page_size: int) -> PagedKVMetadata:
    """FlashInfer metadata of a KVX PACKED table: the first ``ceil(L / page_size)`` pages of each row."""
    if table.format != TableFormat.PACKED:
        raise ValueError(f"from_packed needs a PACKED table, got {table.format.name}")
    lens = np.asarray(seq_lens.lengths, dtype=np.int64)
    pages = -(-lens // page_size)
    if (pages > table.max_blocks_per_seq).any():
        s = int(np.argmax(pages > table.max_blocks_per_seq))
        raise ValueError(f"sequence {s} of length {int(lens[s])} needs {int(pages[s])} pages, the table has {table.max_blocks_per_seq}")
    rows = np.asarray(table.indices, dtype=np.int64).reshape(table.seq_count, table.max_blocks_per_seq)
    indices = np.concatenate([rows[s, : pages[s]] for s in range(table.seq_count)]) if table.seq_count else np.zeros(0, np.int64)
    indptr = np.concatenate([[0], np.cumsum(pages)])
    return PagedKVMetadata(indptr.astype(np.int32), indices.astype(np.int32), _last_page_len(lens, page_size).astype(np.int32), page_size)


def from_ragged(table: BlockTable, page_size: int, seq_lens: SeqLens | None = None) -> PagedKVMetadata:
    """FlashInfer metadata of a KVX RAGGED table (lengths default to each sequence's indptr range).

    Refused when two tokens of one logical page name different blocks: a FlashInfer
    page is one block for all its tokens.
    """
    if table.format != TableFormat.RAGGED or table.indptr is None:
        raise ValueError(f"from_ragged needs a RAGGED table, got {table.format.name}")
    ip = np.asarray(table.indptr, dtype=np.int64)
    idx = np.asarray(table.indices, dtype=np.int64)
    lens = np.diff(ip) if seq_lens is None else np.asarray(seq_lens.lengths, dtype=np.int64)
    pages_per_seq, all_pages = [], []
    for s in range(table.seq_count):
        L = int(lens[s])
        if L > ip[s + 1] - ip[s]:
            raise ValueError(f"sequence {s} of length {L} has only {int(ip[s + 1] - ip[s])} RAGGED entries")
        tok = idx[ip[s]: ip[s] + L]
        pages = tok[::page_size]
        if not np.array_equal(per_token_blocks(pages, L, page_size), tok):
            t = int(np.argmax(per_token_blocks(pages, L, page_size) != tok))
            raise AdapterError(
                f"RAGGED sequence {s} token {t} in block {int(tok[t])}, its page starts in block {int(pages[t // page_size])}",
                "a FlashInfer page is one block for all of its tokens",
            )
        pages_per_seq.append(len(pages))
        all_pages.append(pages)
    indices = np.concatenate(all_pages) if all_pages else np.zeros(0, np.int64)
    indptr = np.concatenate([[0], np.cumsum(pages_per_seq)])
    return PagedKVMetadata(indptr.astype(np.int32), indices.astype(np.int32), _last_page_len(lens, page_size).astype(np.int32), page_size)


def paged_kv_cache(cache: Any, *, kv_layout: str = "NHD", kv_cache_dtype: str | DType = "auto") -> AdaptedCache:
    """FlashInfer's combined ``[max_pages, 2, page_size, H, D]`` (NHD) or
    ``[max_pages, 2, H, page_size, D]`` (HND) cache, K at index 0 and V at 1."""
    info = array_info(cache, "FlashInfer paged_kv_cache")
    if len(info.shape) != 5 or info.shape[1] != 2:
        raise AdapterError(f"FlashInfer paged_kv_cache of shape {info.shape}", "expected [max_pages, 2, ...] with K at 0 and V at 1")
    if kv_layout not in ("NHD", "HND"):
        raise ValueError(f"kv_layout must be 'NHD' or 'HND', got {kv_layout!r}")
    layout = Layout.BLOCK_NHD if kv_layout == "NHD" else Layout.BLOCK_HND
    shape = (info.shape[0],) + info.shape[2:]
    stride = (info.stride[0],) + info.stride[2:]
    if layout == Layout.BLOCK_NHD:
        nb, ps, h, d = shape
    else:
        nb, h, ps, d = shape
    dt = cache_dtype(info, kv_cache_dtype, "FlashInfer paged_kv_cache")
    t = TensorLayout(dt, layout, shape, stride)
    return AdaptedCache(
        f"flashinfer/{kv_layout}", Geometry(nb, ps, h, d), t, t, cache, cache, k_offset=0, v_offset=info.stride[1],
    )
