"""Descriptor checks of R-ORDER steps 1-4, one function per struct, each listing rule ids.

Every function returns the ids (``rules.RULES``) of the rules its struct breaks, in
the order the oracle checks them; checks that only make sense once another passed
(the shape of a tensor whose layout is unknown) are skipped. ``descriptor_violations``
runs the steps in R-ORDER and returns the violations of the first failing step, INVALID
rules before UNSUPPORTED ones; its first element decides the call's status.
"""
from __future__ import annotations

from typing import Iterable

from kvx_conformance.abi import header as abi
from kvx_conformance.abi.header import (
    CACHE_DTYPES,
    INDEX_DTYPES,
    DType,
    Layout,
    Memory,
    ScaleGranularity,
    TableFlags,
    TableFormat,
)

from . import convert
from .addressing import farthest_offset
from .cview import CallView, dims, enum_or_none, is_null, struct_size
from .rules import RULES, SERVABLE, UNSUPPORTED

INT64_MAX = (1 << 63) - 1
_NDIM = {Layout.BLOCK_NHD: 4, Layout.BLOCK_HND: 4, Layout.BLOCK_CUSTOM: 4, Layout.BLOCK_HND_PACKED: 5}
_VALID_MEMORY = (Memory.HOST, Memory.DEVICE, Memory.UNIFIED)


def _ordered(ids: Iterable[str]) -> list[str]:
    """INVALID_ARGUMENT rules before UNSUPPORTED ones, otherwise in check order."""
    ids = list(ids)
    return sorted(ids, key=lambda r: RULES[r].status == UNSUPPORTED)


# ----------------------------------------------------------------------------
# Step 1: NULL struct pointers and size guards (R-SIZE)


def size_violations(view: CallView, call: str) -> list[str]:
    """``call`` is "validate", "write" or "gather"."""
    if view.cache is None:
        return ["R-SIZE.null_cache"]
    if call != "validate" and view.desc is None:
        return ["R-SIZE.null_desc"]
    c, dsc = view.cache, view.desc
    guarded: list[tuple[str, object]] = [("cache", c), ("cache.k", c.k), ("cache.v", c.v)]
    if call == "gather" and dsc.block_table.format == TableFormat.KV_OFFSETS:
        guarded.append(("cache.pool", c.pool))
    if call == "write":
        guarded += [("desc", dsc), ("desc.io", dsc.io), ("desc.io.key", dsc.io.key), ("desc.io.value", dsc.io.value),
                    ("desc.slots", dsc.slots), ("desc.k_scale_desc", dsc.k_scale_desc),
                    ("desc.v_scale_desc", dsc.v_scale_desc)]
    elif call == "gather":
        guarded += [("desc", dsc), ("desc.io", dsc.io), ("desc.io.key", dsc.io.key), ("desc.io.value", dsc.io.value),
                    ("desc.block_table", dsc.block_table), ("desc.seq_lens", dsc.seq_lens)]
    return [f"R-SIZE.{path}" for path, s in guarded if s.size < struct_size(type(s))]


# ----------------------------------------------------------------------------
# Step 2: the cache descriptor (R-CACHE)


def expected_cache_shape(c: abi.kvx_cache_desc_t, layout: Layout, pack: int) -> tuple[int, ...]:
    nb, bs, h, d = c.num_blocks, c.block_size, c.num_kv_heads, c.head_dim
    if layout == Layout.BLOCK_HND:
        return (nb, h, bs, d)
    if layout == Layout.BLOCK_HND_PACKED:
        return (nb, h, d // pack, bs, pack)
    return (nb, bs, h, d)  # NHD and CUSTOM (R-CUSTOM: logical order)


def tensor_violations(c: abi.kvx_cache_desc_t, t: abi.kvx_tensor_desc_t) -> list[str]:
    """One cache tensor (``cache.k`` or ``cache.v``)."""
    out: list[str] = []
    if t.dtype not in [int(x) for x in CACHE_DTYPES]:
        out.append("R-CACHE.dtype")
    shape_ok = False
    layout = enum_or_none(Layout, t.layout)
    if layout not in _NDIM:
        out.append("R-CACHE.layout")
    elif t.ndim != _NDIM[layout]:
        out.append("R-CACHE.ndim")
    else:
        shape, _ = dims(t)
        if layout == Layout.BLOCK_HND_PACKED:
            pack = shape[4]
            if pack <= 0:
                out.append("R-CACHE.pack_zero")
            elif c.head_dim % pack != 0:
                out.append("7.1.hnd_packed_pack_divides")
                exp = expected_cache_shape(c, layout, pack)
                if tuple(shape[i] for i in (0, 1, 3)) != tuple(exp[i] for i in (0, 1, 3)):
                    out.append("R-CACHE.shape")
            elif shape != expected_cache_shape(c, layout, pack):
                out.append("R-CACHE.shape")
            else:
                shape_ok = True
        elif shape != expected_cache_shape(c, layout, 1):
            out.append("R-CACHE.shape")
        else:
            shape_ok = True
    if is_null(t.data):
        out.append("R-CACHE.data_null")
    if t.memory not in [int(m) for m in _VALID_MEMORY]:
        out.append("R-CACHE.memory_invalid")
    if shape_ok:
        shape, stride = dims(t)
        if any(s == 0 and n > 1 for n, s in zip(shape, stride)):
            out.append("R-CACHE.stride_zero")
        if farthest_offset(shape, stride) > INT64_MAX:
            out.append("R-CACHE.offset_overflow")
        if any(s < 0 for s in stride):
            out.append("R-CACHE.stride_negative")
    return out


def cache_violations(c: abi.kvx_cache_desc_t) -> list[str]:
    out: list[str] = []
    for field in ("num_blocks", "block_size", "num_kv_heads", "head_dim"):
        if getattr(c, field) == 0:
            out.append(f"7.1.{field}_zero")
    k, v = tensor_violations(c, c.k), tensor_violations(c, c.v)
    out += k + [r for r in v if r not in k]
    valid_mem = [int(m) for m in _VALID_MEMORY]
    if c.k.memory in valid_mem and c.v.memory in valid_mem and c.k.memory != c.v.memory:
        out.append("R-CACHE.memory_mismatch")
    return _ordered(out)


# ----------------------------------------------------------------------------
# Step 3: IO tensors, write and gather descriptors (R-IO, R-CONVERT, R-FP8, R-WRITE, R-GATHER)


def io_tensor_violations(
    c: abi.kvx_cache_desc_t,
    io: abi.kvx_kv_io_desc_t,
    t: abi.kvx_tensor_desc_t,
    cache_dtype: int,
    gather_rows: tuple[int, int] | None,
) -> list[str]:
    """``io.key`` or ``io.value``; ``gather_rows`` = (seq_count * beam_width, max_seq_len) for a gather."""
    out: list[str] = []
    dtype_ok = t.dtype in [int(x) for x in CACHE_DTYPES]
    if not dtype_ok:
        out.append("R-IO.dtype")
    if t.memory != c.k.memory:
        out.append("R-IO.memory")
    if is_null(t.data) and io.num_tokens > 0:
        out.append("R-IO.data_null")
    shape, stride = dims(t)
    allowed = (3, 4) if gather_rows is not None else (3,)
    if t.ndim not in allowed:
        out.append("R-IO.ndim")
    else:
        if t.ndim == 3:
            expect = (io.num_tokens, io.num_kv_heads, io.head_dim)
        elif gather_rows is None:
            expect = None
        else:
            expect = (gather_rows[0], gather_rows[1], io.num_kv_heads, io.head_dim)
        if expect is not None and shape != expect:
            out.append("R-IO.shape")
        if farthest_offset(shape, stride) > INT64_MAX:
            out.append("R-IO.offset_overflow")
        if any(s < 0 for s in stride):
            out.append("R-IO.stride_negative")
    if dtype_ok and cache_dtype in [int(x) for x in CACHE_DTYPES]:
        io_dt, cache_dt = DType(t.dtype), DType(cache_dtype)
        if gather_rows is None:
            if not convert.supported(io_dt, cache_dt):
                out.append("R-CONVERT.fp8_io")
        elif not convert.supported(cache_dt, io_dt):
            out.append("R-CONVERT.fp8_cache_gather")
        elif io_dt != cache_dt and convert.is_fp8(io_dt):
            out.append("R-CONVERT.fp8_io")
    return out


def scale_violations(c: abi.kvx_cache_desc_t, s: abi.kvx_scale_desc_t, cache_dtype: int) -> list[str]:
    """A write's ``k_scale_desc`` / ``v_scale_desc`` (only read for an FP8 cache tensor, with data set)."""
    if cache_dtype not in [int(x) for x in abi.FP8_DTYPES] or is_null(s.data):
        return []
    out: list[str] = []
    if s.dtype != DType.F32:
        out.append("R-FP8.scale_dtype")
    g = enum_or_none(ScaleGranularity, s.granularity)
    if g == ScaleGranularity.PER_HEAD:
        shape, _ = dims(s)
        if s.ndim != 1 or shape[0] != c.num_kv_heads:
            out.append("R-FP8.per_head_shape")
        elif c.num_kv_heads > 1 and s.stride[0] not in (0, 1):
            out.append("R-FP8.scale_stride")
    elif g in (ScaleGranularity.PER_BLOCK, ScaleGranularity.PER_BLOCK_HEAD):
        out.append("R-FP8.per_block_unsupported")
    elif g != ScaleGranularity.PER_TENSOR:
        out.append("R-FP8.scale_granularity")
    return out


def _io_common(c: abi.kvx_cache_desc_t, io: abi.kvx_kv_io_desc_t) -> list[str]:
    out = []
    if io.num_kv_heads != c.num_kv_heads:
        out.append("R-IO.num_kv_heads")
    if io.head_dim != c.head_dim:
        out.append("R-IO.head_dim")
    return out


def write_violations(c: abi.kvx_cache_desc_t, w: abi.kvx_write_desc_t) -> list[str]:
    io = w.io
    out = _io_common(c, io)
    if io.num_tokens != w.slots.token_count:
        out.append("R-WRITE.token_count")
    key = io_tensor_violations(c, io, io.key, c.k.dtype, None)
    val = io_tensor_violations(c, io, io.value, c.v.dtype, None)
    out += key + [r for r in val if r not in key]
    if w.slots.dtype not in [int(x) for x in INDEX_DTYPES]:
        out.append("R-WRITE.slot_dtype")
    if is_null(w.slots.slots) and io.num_tokens > 0:
        out.append("R-WRITE.slots_null")
    ks = scale_violations(c, w.k_scale_desc, c.k.dtype)
    vs = scale_violations(c, w.v_scale_desc, c.v.dtype)
    out += ks + [r for r in vs if r not in ks]
    return _ordered(out)


def table_violations(c: abi.kvx_cache_desc_t, t: abi.kvx_block_table_t) -> list[str]:
    out: list[str] = []
    fmt = enum_or_none(TableFormat, t.format)
    if fmt not in (TableFormat.PACKED, TableFormat.RAGGED, TableFormat.KV_OFFSETS):
        return ["R-GATHER.format"]
    if is_null(t.indices) and t.indices_count > 0:
        out.append("R-GATHER.indices_null")
    index_dtypes = [int(x) for x in INDEX_DTYPES]
    if fmt == TableFormat.PACKED:
        if t.index_dtype not in index_dtypes:
            out.append("7.1.index_dtype")
        if t.indices_count != t.seq_count * t.max_blocks_per_seq:
            out.append("7.1.packed_indices_count")
        if t.indptr_count != 0:
            out.append("R-GATHER.packed_indptr_count")
        if t.beam_width != 1:
            out.append("R-GATHER.packed_beam_width")
    elif fmt == TableFormat.RAGGED:
        if t.index_dtype not in index_dtypes:
            out.append("7.1.index_dtype")
        if t.indptr_dtype not in index_dtypes:
            out.append("R-GATHER.ragged_indptr_dtype")
        if is_null(t.indptr):
            out.append("R-GATHER.ragged_indptr_null")
        if t.indptr_count != t.seq_count + 1:
            out.append("R-GATHER.ragged_indptr_count")
        if t.beam_width != 1:
            out.append("R-GATHER.ragged_beam_width")
    else:
        if t.index_dtype != DType.S32:
            out.append("7.1.kv_offsets_index_dtype")
        if not t.flags & TableFlags.KVCACHEINDEX:
            out.append("R-GATHER.kv_offsets_flag")
        bs = c.block_size
        if bs == 0 or bs & (bs - 1):
            out.append("7.1.kv_offsets_pow2")
        if t.beam_width == 0:
            out.append("R-GATHER.kv_offsets_beam_width")
        if t.indices_count != t.seq_count * t.beam_width * 2 * t.max_blocks_per_seq:
            out.append("7.1.kv_offsets_indices_count")
        if t.indptr_count != 0:
            out.append("R-GATHER.kv_offsets_indptr_count")
        if is_null(c.pool.primary):
            out.append("R-GATHER.pool_primary_null")
        elem = abi.DTYPE_SIZE.get(enum_or_none(DType, c.k.dtype), 0)
        if c.pool.bytes_per_block != c.num_kv_heads * c.block_size * c.head_dim * elem:
            out.append("R-GATHER.pool_bytes_per_block")
        if c.k.dtype != c.v.dtype:
            out.append("R-GATHER.kv_offsets_kv_dtype")
    return out


def gather_violations(c: abi.kvx_cache_desc_t, g: abi.kvx_gather_desc_t) -> list[str]:
    io, t, sl = g.io, g.block_table, g.seq_lens
    out = _io_common(c, io)
    out += table_violations(c, t)
    known_format = "R-GATHER.format" not in out
    beams = t.beam_width if t.format == TableFormat.KV_OFFSETS else 1
    if known_format and io.num_tokens != t.seq_count * beams * g.max_seq_len:
        out.append("R-GATHER.num_tokens")
    if sl.seq_count != t.seq_count:
        out.append("R-GATHER.seq_count_match")
    if sl.dtype not in [int(x) for x in INDEX_DTYPES]:
        out.append("R-GATHER.seq_lens_dtype")
    if is_null(sl.lengths) and sl.seq_count > 0:
        out.append("R-GATHER.lengths_null")
    rows = (t.seq_count * beams, g.max_seq_len)
    # KV_OFFSETS reads both K and V from the pools, in k.dtype
    v_dtype = c.k.dtype if t.format == TableFormat.KV_OFFSETS else c.v.dtype
    if known_format:
        key = io_tensor_violations(c, io, io.key, c.k.dtype, rows)
        val = io_tensor_violations(c, io, io.value, v_dtype, rows)
        out += key + [r for r in val if r not in key]
    return _ordered(out)


# ----------------------------------------------------------------------------
# Steps 1-4 in R-ORDER


def descriptor_violations(view: CallView, call: str, memory_supported: bool = True,
                          served: Iterable[str] = ()) -> list[str]:
    """Violations of the first failing step among 1-4 (empty: proceed to the data step).

    ``served``: rules of ``rules.SERVABLE`` read as served instead (a provider may serve what the
    reference refuses: the result such a provider must give)."""
    served = frozenset(served)
    if not served <= SERVABLE:
        raise ValueError(f"the oracle serves none of {sorted(served - SERVABLE)} (rules.SERVABLE)")
    step1 = size_violations(view, call)
    if step1:
        return step1
    step2 = [r for r in cache_violations(view.cache) if r not in served]
    if step2:
        return step2
    if call == "write":
        step3 = write_violations(view.cache, view.desc)
    elif call == "gather":
        step3 = gather_violations(view.cache, view.desc)
    else:
        step3 = []
    step3 = [r for r in step3 if r not in served]
    if step3:
        return step3
    if call != "validate" and not memory_supported:
        return ["R-ORDER.memory_unsupported"]
    return []


def all_descriptor_violations(view: CallView, call: str) -> list[str]:
    """Every descriptor rule steps 1-3 find, whatever the step (for single-rule checks)."""
    out = size_violations(view, call)
    if "R-SIZE.null_cache" in out or "R-SIZE.null_desc" in out:
        return out
    out += cache_violations(view.cache)
    if call == "write":
        out += write_violations(view.cache, view.desc)
    elif call == "gather":
        out += gather_violations(view.cache, view.desc)
    return out
