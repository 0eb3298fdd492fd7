"""What the provider sees: the ctypes structs of a call, built from a case.

The oracle decides descriptor problems from the C fields exactly as a provider
receives them (raw counts, u32 truncation, NULL pointers, ``c_overrides``), so it
builds the same structs the executor builds, with stand-in addresses: a pointer is
non-NULL exactly when the executor would hand the provider a buffer. Only NULL-ness
of pointers is ever looked at; the data behind them comes from the case's arrays.
"""
from __future__ import annotations

import ctypes
import itertools
from dataclasses import dataclass

from kvx_conformance.abi import descriptors as d
from kvx_conformance.abi import header as abi
from kvx_conformance.abi.header import Memory
from kvx_conformance.cases.case import CacheCase, GatherCase, ValidateCase, WriteCase
from kvx_conformance.cases.execute import apply_overrides

_addresses = itertools.count(0x10000, 0x1000)


def _ptr(present: bool) -> int:
    """A stand-in address (never dereferenced) or 0 for NULL."""
    return next(_addresses) if present else 0


@dataclass
class CallView:
    """The call's arguments as C structs; ``None`` is a NULL struct pointer."""

    cache: abi.kvx_cache_desc_t | None
    desc: abi.kvx_write_desc_t | abi.kvx_gather_desc_t | None = None


def _cache_struct(cache: CacheCase, memory: Memory) -> abi.kvx_cache_desc_t:
    pool = cache.pool
    bpb = prim = sec = 0
    if pool is not None:
        bpb = pool.bytes_per_block
        prim = _ptr(True)
        sec = _ptr(pool.secondary is not None and not pool.secondary_null)
    return d.to_c_cache(cache.geom, cache.k, _ptr(True), cache.v, _ptr(True), memory,
                        pool_bytes_per_block=bpb, pool_primary=prim, pool_secondary=sec)


def validate_view(case: ValidateCase | CacheCase, memory: Memory = Memory.HOST) -> CallView:
    if isinstance(case, CacheCase):
        case = ValidateCase(case)
    args = apply_overrides({"cache": _cache_struct(case.cache, memory)}, case.c_overrides)
    return CallView(args["cache"])


def write_view(case: WriteCase, memory: Memory = Memory.HOST) -> CallView:
    g = case.cache.geom
    cache = _cache_struct(case.cache, memory)
    desc = abi.kvx_write_desc_t.new()
    desc.io = d.to_c_io(case.key_layout, _ptr(True), case.value_layout, _ptr(True), memory,
                        case.num_tokens, g.num_kv_heads, g.head_dim)
    desc.slots = d.to_c_slots(case.slots, _ptr(True))
    desc.k_scale = _ptr(case.k_scale is not None) or None
    desc.v_scale = _ptr(case.v_scale is not None) or None
    desc.k_scale_desc = d.to_c_scale(case.k_scale_desc, _ptr(case.k_scale_desc is not None))
    desc.v_scale_desc = d.to_c_scale(case.v_scale_desc, _ptr(case.v_scale_desc is not None))
    args = apply_overrides({"cache": cache, "desc": desc}, case.c_overrides)
    return CallView(args["cache"], args["desc"])


def gather_view(case: GatherCase, memory: Memory = Memory.HOST) -> CallView:
    g = case.cache.geom
    cache = _cache_struct(case.cache, memory)
    t = case.table
    desc = abi.kvx_gather_desc_t.new(max_seq_len=case.max_seq_len)
    desc.io = d.to_c_io(case.out_layout, _ptr(True), case.value_out, _ptr(True), memory,
                        case.num_tokens, g.num_kv_heads, g.head_dim)
    desc.block_table = d.to_c_table(t, _ptr(len(t.indices) > 0), _ptr(t.indptr is not None))
    desc.seq_lens = d.to_c_seq_lens(case.seq_lens, _ptr(len(case.seq_lens.lengths) > 0))
    args = apply_overrides({"cache": cache, "desc": desc}, case.c_overrides)
    return CallView(args["cache"], args["desc"])


# ----------------------------------------------------------------------------
# Reading C fields


def is_null(ptr) -> bool:
    return not ptr


def dims(t: abi.kvx_tensor_desc_t | abi.kvx_scale_desc_t) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(shape, stride) of the first ``ndim`` dimensions (at most MAX_TENSOR_DIMS)."""
    n = min(int(t.ndim), abi.MAX_TENSOR_DIMS)
    return tuple(int(t.shape[i]) for i in range(n)), tuple(int(t.stride[i]) for i in range(n))


def enum_or_none(enum_cls, value: int):
    try:
        return enum_cls(value)
    except ValueError:
        return None


def struct_size(cls: type[ctypes.Structure]) -> int:
    return abi.V1_1_SIZES[cls.__name__]


class CaseError(ValueError):
    """The case asks the provider to read memory the case does not provide."""
