"""TensorRT-LLM ``KVBlockArray`` pools and block offsets as KVX KV_OFFSETS.

Engine facts (seed 003, ``kvx-abi-1.1.md``; ``cpp/tensorrt_llm/kernels/kvCacheUtils.h``,
``cpp/include/tensorrt_llm/kernels/kvCacheIndex.h``):

- a block holds ``[num_kv_heads, tokens_per_block, head_dim]`` (HND), contiguous;
  ``bytes_per_block = num_kv_heads * tokens_per_block * head_dim * element_size``;
- ``tokens_per_block`` is a power of two (the kernels shift by its log2);
- ``block_offsets[B, W, 2, M]`` holds ``KVCacheIndex`` values: int32, bit 31 set
  for the secondary pool, index ``value & 0x7fffffff``, all ones for "no block";
  block address = ``(secondary ? secondary_pool : primary_pool) + index * bytes_per_block``;
- the KV cache manager lays a pool out as ``[num_blocks, num_layers, 2, H, T, D]``
  and hands each layer the pool pointer of its ``(layer, K)`` sub-block, so K of
  pool block ``b`` has index ``b * num_layers * 2`` and V that index plus one.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from ..abi.descriptors import BlockTable, Geometry, TensorLayout, contiguous_strides
from ..abi.header import DType, Layout
from .common import AdaptedCache, AdapterError, PoolRef, array_info, cache_dtype, is_power_of_two, to_numpy

SECONDARY_BIT = 0x80000000
INDEX_MASK = 0x7FFFFFFF
#: TensorRT-LLM's null ``KVCacheIndex`` (all ones), as the int32 it is stored as.
NULL_INDEX = -1


@dataclass(frozen=True)
class PoolBlock:
    """A block of one pool: ``index`` in pool blocks, ``secondary`` for the secondary pool."""

    index: int
    secondary: bool = False


def kv_cache_index(index: int, secondary: bool = False) -> int:
    """The int32 ``KVCacheIndex`` (as a Python int in [-2^31, 2^31)) of a pool index."""
    if not 0 <= index <= INDEX_MASK:
        raise AdapterError(f"KVCacheIndex {index}", "pool indices are 31-bit (bit 31 marks the secondary pool)")
    raw = index | (SECONDARY_BIT if secondary else 0)
    return raw - (1 << 32) if raw & SECONDARY_BIT else raw


def decode_index(value: int) -> tuple[int, bool]:
    """``(index, secondary)`` of an int32 ``KVCacheIndex`` bit pattern."""
    raw = int(value) & 0xFFFFFFFF
    return raw & INDEX_MASK, bool(raw & SECONDARY_BIT)


def check_tokens_per_block(tokens_per_block: int) -> int:
    """log2 of ``tokens_per_block``; refused unless a power of two (spec 5.1 KV_OFFSETS)."""
    if not is_power_of_two(tokens_per_block):
        raise AdapterError(
            f"TensorRT-LLM tokens_per_block {tokens_per_block}",
            "KV_OFFSETS requires a power-of-two block size (KVBlockArray indexes with tokensPerBlockLog2)",
        )
    return tokens_per_block.bit_length() - 1


def block_array(
    pool: Any, *, layer_idx: int, num_kv_heads: int, tokens_per_block: int, head_dim: int,
    secondary_pool: Any = None, kv_cache_dtype: str | DType = "auto",
    sink_tokens: int = 0, cyclic_cache_len: int | None = None,
) -> AdaptedCache:
    """One layer's ``KVBlockArray`` over a ``[num_blocks, num_layers, 2, ...]`` pool.

    The bundle's ``pool`` is the layer's pool pointers (KV_OFFSETS addressing); its
    K/V layouts describe the same memory as BLOCK_HND strided views, so a PACKED
    table of pool block ids addresses what :func:`block_offsets` indices address.
    """
    check_tokens_per_block(tokens_per_block)
    if sink_tokens or cyclic_cache_len is not None:
        raise AdapterError(
            f"TensorRT-LLM cyclic KV cache (sink_tokens={sink_tokens}, cyclic_cache_len={cyclic_cache_len})",
            "KVX v1 does not standardize cyclic windowing (spec 10): the slot a token overwrites is not in any descriptor",
        )
    info = array_info(pool, "TensorRT-LLM pool")
    if len(info.shape) < 3:
        raise AdapterError(f"TensorRT-LLM pool of shape {info.shape}", "expected [num_blocks, num_layers, kv_factor, ...]")
    nb, num_layers, kv_factor = info.shape[:3]
    if kv_factor != 2:
        raise AdapterError(
            f"TensorRT-LLM pool with kv_factor {kv_factor}",
            "KVX caches hold separate K and V blocks (a kv_factor-1 MLA latent cache has no V of its own)",
        )
    block_elems = num_kv_heads * tokens_per_block * head_dim
    if int(np.prod(info.shape[3:])) != block_elems:
        raise ValueError(f"pool sub-blocks of {info.shape[3:]} are not [H={num_kv_heads}, T={tokens_per_block}, D={head_dim}]")
    if info.stride != contiguous_strides(info.shape):
        raise AdapterError(
            f"TensorRT-LLM pool with strides {info.stride}",
            "KV_OFFSETS addresses base + index * bytes_per_block, which only a contiguous pool satisfies",
        )
    if not 0 <= layer_idx < num_layers:
        raise ValueError(f"layer_idx {layer_idx} outside a pool of {num_layers} layers")
    dt = cache_dtype(info, kv_cache_dtype, "TensorRT-LLM pool")
    secondary = None
    if secondary_pool is not None:
        sinfo = array_info(secondary_pool, "TensorRT-LLM secondary pool")
        if sinfo.shape[1:] != info.shape[1:] or sinfo.stride[1:] != info.stride[1:] or sinfo.itemsize != info.itemsize:
            raise ValueError(f"secondary pool {sinfo.shape} does not match the primary pool's block layout {info.shape}")
        secondary = secondary_pool
    layer_off = layer_idx * kv_factor * block_elems
    stride = (num_layers * kv_factor * block_elems, tokens_per_block * head_dim, head_dim, 1)
    shape = (nb, num_kv_heads, tokens_per_block, head_dim)
    k = TensorLayout(dt, Layout.BLOCK_HND, shape, stride)
    pool_ref = PoolRef(
        bytes_per_block=block_elems * info.itemsize, primary=pool, primary_offset=layer_off,
        secondary=secondary, secondary_offset=layer_off if secondary is not None else 0,
    )
    return AdaptedCache(
        "trtllm.KVBlockArray", Geometry(nb, tokens_per_block, num_kv_heads, head_dim), k, k, pool, pool,
        k_offset=layer_off, v_offset=layer_off + block_elems, pool=pool_ref,
        notes=(f"layer {layer_idx} of {num_layers}; index of pool block b: K = b*{num_layers * kv_factor}, V = K + 1",),
    )


def _as_block(entry: Any) -> PoolBlock:
    return entry if isinstance(entry, PoolBlock) else PoolBlock(int(entry))


def block_offsets(
    block_ids: Sequence[Any], *, beam_width: int = 1, max_blocks_per_seq: int | None = None, num_layers: int = 1,
) -> np.ndarray:
    """int32 ``block_offsets[seq, beam, 2, max_blocks]`` from per-sequence pool block lists.

    ``block_ids[s]`` is a list of pool blocks (ints for the primary pool, or
    :class:`PoolBlock`) shared by every beam, or ``beam_width`` such lists. K of
    pool block ``b`` gets index ``b * num_layers * 2``, V that plus one (the KV
    cache manager's ``[blocks, layers, 2, ...]`` pool); unused entries hold the null
    index.
    """
    per_beam: list[list[list[PoolBlock]]] = []
    for s, entry in enumerate(block_ids):
        entry = list(entry)
        if entry and isinstance(entry[0], (list, tuple, np.ndarray)):
            if len(entry) != beam_width:
                raise ValueError(f"sequence {s} has {len(entry)} beam lists, beam_width is {beam_width}")
            per_beam.append([[_as_block(b) for b in beam] for beam in entry])
        else:
            blocks = [_as_block(b) for b in entry]
            per_beam.append([blocks] * beam_width)
    longest = max((len(b) for beams in per_beam for b in beams), default=0)
    m = longest if max_blocks_per_seq is None else max_blocks_per_seq
    if longest > m:
        raise ValueError(f"a sequence has {longest} blocks, max_blocks_per_seq is {m}")
    out = np.full((len(per_beam), beam_width, 2, m), NULL_INDEX, dtype=np.int32)
    per_block = num_layers * 2
    for s, beams in enumerate(per_beam):
        for w, blocks in enumerate(beams):
            for j, blk in enumerate(blocks):
                out[s, w, 0, j] = kv_cache_index(blk.index * per_block, blk.secondary)
                out[s, w, 1, j] = kv_cache_index(blk.index * per_block + 1, blk.secondary)
    return out


def kv_offsets_table(offsets: Any) -> BlockTable:
    """An engine ``block_offsets`` tensor (int32 ``[B, W, 2, M]``) as a KVX KV_OFFSETS table."""
    info = array_info(offsets, "TensorRT-LLM block_offsets")
    if info.dtype_name not in ("int32", "uint32"):
        raise AdapterError(f"TensorRT-LLM block_offsets of {info.dtype_name}", "KV_OFFSETS indices are S32 KVCacheIndex values (spec 7.1)")
    arr = np.asarray(to_numpy(offsets))
    if arr.ndim != 4 or arr.shape[2] != 2:
        raise AdapterError(f"TensorRT-LLM block_offsets of shape {arr.shape}", "KV_OFFSETS tables are [seq_count, beam_width, 2, max_blocks_per_seq]")
    return BlockTable.kv_offsets(arr.view(np.int32).astype(np.int64))
