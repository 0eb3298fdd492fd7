"""ppl.nn ``dynamic_batching.KeyValueCache`` (seed 001) as KVX descriptors.

Engine facts (seed 001, ppl.nn ``docs/ops/pmx/dynamic_batching/KeyValueCache.md``):

- one ``cache`` tensor holds K and V of every layer; ``cache_layout`` orders it:
  0 ``(MaxT, L, 2, H, Dh)``, 1 ``(L, MaxT, 2, H, Dh)``, 2 ``(L, 2, MaxT, H, Dh)``,
  3 ``(L, 2, H, MaxT, Dh)``; index 0 of the ``2`` axis is K, 1 is V; ``layer_idx``
  picks the layer;
- ``cache_mode`` 0 (offset): ``cachestarts[b]`` is the row of ``MaxT`` where batch
  ``b``'s cache begins, its tokens contiguous from there;
  ``cache_mode`` 1 (paged): ``cachestarts[b, p]`` is the first row of page ``p``
  (``page_size`` rows);
- current tokens go to sequence positions ``start_pos[b] + i``; ``seqstarts`` /
  ``kvstarts`` are prefix sums of the new and of the total (cached) lengths;
- ``num_repeat`` repeats K and V on the head axis of the *outputs* for GQA;
- ``quant_bit`` 8 / 4 stores int8 / int4 with a ``scale`` tensor per ``quant_group``.

KVX view: a token row of ``MaxT`` is a slot (row ``r`` = block ``r // block_size``,
offset ``r % block_size``) for every layout, so ``block_size`` is free as long as it
divides ``page_size`` and every page / cache start.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from ..abi.descriptors import BlockTable, Geometry, IOLayout, SeqLens, SlotMapping, TensorLayout
from ..abi.header import DType, Layout
from .common import AdaptedCache, AdapterError, array_info, cache_dtype, to_numpy

#: cache_layout -> (axis order of the 5-D ``cache`` in names, as the seed lists it)
CACHE_LAYOUTS = {
    0: ("T", "L", "KV", "H", "D"),
    1: ("L", "T", "KV", "H", "D"),
    2: ("L", "KV", "T", "H", "D"),
    3: ("L", "KV", "H", "T", "D"),
}


def _refuse_unsupported(quant_bit: int, cache_mode: int, cache_layout: int) -> None:
    if quant_bit:
        raise AdapterError(
            f"ppl.nn KeyValueCache quant_bit={quant_bit}",
            "KVX v1.1 has no int8/int4 cache dtype and no per-group (quant_group) scale tensor",
        )
    if cache_mode not in (0, 1):
        raise ValueError(f"cache_mode must be 0 or 1, got {cache_mode}")
    if cache_layout not in CACHE_LAYOUTS:
        raise ValueError(f"cache_layout must be 0..3, got {cache_layout}")


def default_block_size(cache_mode: int, page_size: int) -> int:
    """``page_size`` in paged mode; 1 in offset mode (cache starts may be any row)."""
    return page_size if cache_mode == 1 else 1


def key_value_cache(
    cache: Any, *, num_layer: int, layer_idx: int, cache_layout: int = 0, cache_mode: int = 0,
    page_size: int = 128, block_size: int | None = None, quant_bit: int = 0,
    kv_cache_dtype: str | DType = "auto",
) -> AdaptedCache:
    """K and V of layer ``layer_idx`` as strided views into the one ``cache`` tensor.

    Layouts 0-2 keep token-major rows (BLOCK_NHD); layout 3 puts heads outside tokens
    (BLOCK_HND with the head stride ``MaxT * Dh``). ``MaxT % block_size`` trailing rows
    are not addressable through the descriptor.
    """
    _refuse_unsupported(quant_bit, cache_mode, cache_layout)
    bs = block_size or default_block_size(cache_mode, page_size)
    if cache_mode == 1 and page_size % bs:
        raise AdapterError(f"ppl.nn page_size {page_size} with KVX block_size {bs}", "a page must be a whole number of KVX blocks")
    info = array_info(cache, "ppl.nn cache")
    if len(info.shape) != 5:
        raise AdapterError(f"ppl.nn cache of shape {info.shape}", f"cache_layout {cache_layout} is 5-D {CACHE_LAYOUTS[cache_layout]}")
    axes = dict(zip(CACHE_LAYOUTS[cache_layout], zip(info.shape, info.stride)))
    if axes["L"][0] != num_layer or axes["KV"][0] != 2:
        raise ValueError(f"ppl.nn cache {info.shape} is not cache_layout {cache_layout} with L={num_layer} and a K/V axis of 2")
    if not 0 <= layer_idx < num_layer:
        raise ValueError(f"layer_idx {layer_idx} outside num_layer {num_layer}")
    (max_t, st), (h, sh), (d, sd) = axes["T"], axes["H"], axes["D"]
    nb = max_t // bs
    if nb == 0:
        raise AdapterError(f"ppl.nn cache of MaxT={max_t} rows with block_size {bs}", "not one whole block fits, and KVX needs num_blocks > 0")
    dt = cache_dtype(info, kv_cache_dtype, "ppl.nn cache")
    base = layer_idx * axes["L"][1]
    if cache_layout == 3:
        t = TensorLayout(dt, Layout.BLOCK_HND, (nb, h, bs, d), (bs * st, sh, st, sd))
    else:
        t = TensorLayout(dt, Layout.BLOCK_NHD, (nb, bs, h, d), (bs * st, st, sh, sd))
    return AdaptedCache(
        f"ppl.KeyValueCache/layout{cache_layout}/mode{cache_mode}", Geometry(nb, bs, h, d), t, t, cache, cache,
        k_offset=base, v_offset=base + axes["KV"][1],
        notes=(f"MaxT={max_t}: rows >= {nb * bs} unaddressable",) if max_t % bs else (),
    )


# ----------------------------------------------------------------------------
# cachestarts -> slots and tables


def cache_rows(cachestarts: Any, positions: Any, batch: Any, cache_mode: int, page_size: int) -> np.ndarray:
    """The ``MaxT`` row of sequence position ``positions[i]`` of batch ``batch[i]``."""
    cs = np.asarray(to_numpy(cachestarts), dtype=np.int64)
    pos = np.asarray(positions, dtype=np.int64)
    b = np.asarray(batch, dtype=np.int64)
    if cache_mode == 0:
        if cs.ndim != 1:
            raise ValueError(f"cache_mode 0 takes cachestarts of shape (B), got {cs.shape}")
        return cs[b] + pos
    if cs.ndim != 2:
        raise ValueError(f"cache_mode 1 takes cachestarts of shape (B, MaxP), got {cs.shape}")
    page = pos // page_size
    if len(page) and page.max() >= cs.shape[1]:
        raise ValueError(f"position {int(pos.max())} needs page {int(page.max())}, cachestarts has {cs.shape[1]}")
    return cs[b, page] + pos % page_size


def write_slots(
    cachestarts: Any, seqstarts: Any, start_pos: Any, *, cache_mode: int, page_size: int = 128,
    geometry: Geometry | None = None,
) -> SlotMapping:
    """The KVX slot of every ``current_key`` row: its ``MaxT`` row (see module doc).

    With ``geometry``, a row beyond ``num_blocks * block_size`` is refused (the
    descriptor cannot reach it; ppl.nn would write it).
    """
    ss = np.asarray(to_numpy(seqstarts), dtype=np.int64)
    sp = np.asarray(to_numpy(start_pos), dtype=np.int64)
    lens = np.diff(ss)
    batch = np.repeat(np.arange(len(lens)), lens)
    pos = sp[batch] + (np.arange(int(ss[-1]) if len(ss) else 0) - ss[batch])
    rows = cache_rows(cachestarts, pos, batch, cache_mode, page_size)
    if geometry is not None and len(rows) and rows.max() >= geometry.num_slots:
        raise AdapterError(
            f"ppl.nn cache row {int(rows.max())}",
            f"past the {geometry.num_slots} rows that whole blocks of {geometry.block_size} cover",
        )
    return SlotMapping(rows, dtype=DType.S64, invalid_slot=-1)


def gather_table(
    cachestarts: Any, kvstarts: Any, *, cache_mode: int, block_size: int, page_size: int = 128,
    pad_id: int = 0, index_dtype: DType = DType.S64,
) -> tuple[BlockTable, SeqLens]:
    """A PACKED table and seq lens reading each batch's ``kvstarts`` length.

    Logical KVX block ``j`` of batch ``b`` is the ``block_size`` rows starting at the
    row of position ``j * block_size``; refused where that row is not a multiple of
    ``block_size`` (a page or cache start off the KVX block grid).
    """
    ks = np.asarray(to_numpy(kvstarts), dtype=np.int64)
    lens = np.diff(ks)
    if cache_mode == 1 and page_size % block_size:
        raise AdapterError(f"ppl.nn page_size {page_size} with KVX block_size {block_size}", "a page must be a whole number of KVX blocks")
    nblocks = -(-lens // block_size)
    width = int(nblocks.max()) if len(lens) else 0
    table = np.full((len(lens), width), pad_id, dtype=np.int64)
    for b, n in enumerate(nblocks):
        if n == 0:
            continue
        starts = cache_rows(cachestarts, np.arange(n) * block_size, np.full(n, b), cache_mode, page_size)
        off = starts % block_size
        if off.any():
            j = int(np.argmax(off != 0))
            raise AdapterError(
                f"ppl.nn batch {b} block {j} starting at cache row {int(starts[j])}",
                f"not a multiple of the KVX block_size {block_size}; use a block_size dividing every cache start",
            )
        table[b, :n] = starts // block_size
    return BlockTable.packed(table, index_dtype=index_dtype), SeqLens(lens, dtype=index_dtype)


# ----------------------------------------------------------------------------
# num_repeat (GQA): an output-side concept


def repeat_output_views(num_tokens: int, num_kv_heads: int, head_dim: int, num_repeat: int, dtype: DType) -> list[tuple[IOLayout, int]]:
    """IO layouts that land a KVX gather straight in ppl.nn's repeated output.

    ppl.nn's ``key`` output is ``(T, H * num_repeat, Dh)`` with output head
    ``h * num_repeat + r`` a copy of KV head ``h`` (the GQA grouping of query heads).
    KVX gathers ``H`` heads, so the repeat is ``num_repeat`` gathers, gather ``r``
    writing through ``(layout, element offset r * Dh)``: head stride
    ``num_repeat * Dh`` (non-dense IO strides: a provider may answer UNSUPPORTED,
    R-IO; then repeat after a dense gather). Rows follow KVX's padded output order,
    so this lands in ppl.nn's packed ``kvstarts`` rows when every length equals
    ``max_seq_len`` (or one gather per batch entry at row ``kvstarts[b]``).
    """
    if num_repeat < 1:
        raise ValueError(f"num_repeat must be >= 1, got {num_repeat}")
    hd = num_kv_heads * num_repeat * head_dim
    layout = IOLayout(dtype, (num_tokens, num_kv_heads, head_dim), (hd, num_repeat * head_dim, 1))
    return [(layout, r * head_dim) for r in range(num_repeat)]


def repeat_heads(gathered: np.ndarray, num_repeat: int) -> np.ndarray:
    """ppl.nn's output from a dense KVX gather ``[..., H, Dh]``: each head ``num_repeat`` times."""
    return np.repeat(gathered, num_repeat, axis=-2)
