"""``kvx_write_kv`` as the readings define it (R-ORDER, R-WRITE, R-IO, R-CONVERT, R-FP8)."""
from __future__ import annotations

import numpy as np

from kvx_conformance.abi import header as abi
from kvx_conformance.abi.header import DType, Layout, Memory, ScaleGranularity, Status
from kvx_conformance.cases.case import Result, WriteCase

from . import convert, metadata
from .addressing import cache_offsets, io_offsets
from .cview import CaseError, dims, is_null, write_view
from .rules import RULES
from .storage import check_bounds, typed_view
from .validate import descriptor_violations


def _unchanged(case: WriteCase, status: int, rule: str) -> Result:
    c = case.cache
    return Result(int(status), {"k": c.k_init.copy(), "v": c.v_init.copy()}, rule=rule)


def slot_plan(slots: np.ndarray, invalid_slot: int, num_slots: int) -> tuple[np.ndarray, np.ndarray] | None:
    """(token indices, slots) actually written, last token winning per slot; None if one is out of range.

    R-WRITE: a slot < 0 or == invalid_slot is a no-op; a remaining slot >= num_slots is
    OUT_OF_RANGE for the whole call.
    """
    live = (slots >= 0) & (slots != invalid_slot)
    if np.any(live & (slots >= num_slots)):
        return None
    tokens = np.nonzero(live)[0]
    # duplicates: the last token wins (informational reading)
    rev = tokens[::-1]
    _, first_in_rev = np.unique(slots[rev], return_index=True)
    tokens = np.sort(rev[first_in_rev])
    return tokens, slots[tokens]


def _scale(case: WriteCase, desc: abi.kvx_write_desc_t, side: str, num_kv_heads: int) -> np.ndarray:
    """R-FP8 scale, shaped to broadcast over [tokens, heads, dims]."""
    sd = getattr(desc, f"{side}_scale_desc")
    if not is_null(sd.data):
        spec = getattr(case, f"{side}_scale_desc")
        if spec is None:
            raise CaseError(f"{side}_scale_desc.data is set but the case has no scale values")
        if sd.granularity == ScaleGranularity.PER_HEAD:
            vals = metadata.scale_values(spec.buffer(), num_kv_heads, f"{side}_scale_desc", int(sd.stride[0]))
            return vals.reshape(1, num_kv_heads, 1)
        return metadata.scale_values(spec.buffer(), 1, f"{side}_scale_desc").reshape(1, 1, 1)
    if getattr(desc, f"{side}_scale"):
        value = getattr(case, f"{side}_scale")
        if value is None:
            raise CaseError(f"{side}_scale is set but the case has no value")
        return np.array(value, np.float32).reshape(1, 1, 1)
    return np.ones((1, 1, 1), np.float32)


def expected_write(case: WriteCase, memory: Memory = Memory.HOST, memory_supported: bool = True,
                   served: tuple[str, ...] = ()) -> Result:
    """Status and cache storage (``{"k", "v"}``, flat, from the case's init arrays) after the write."""
    view = write_view(case, memory)
    violations = descriptor_violations(view, "write", memory_supported, served)
    if violations:
        return _unchanged(case, RULES[violations[0]].status, violations[0])
    c, w = view.cache, view.desc
    io = w.io
    n = io.num_tokens
    if n == 0:
        return _unchanged(case, Status.OK, "")
    slots = metadata.slots(case, w.slots.dtype, n)
    plan = slot_plan(slots, int(w.slots.invalid_slot), c.num_blocks * c.block_size)
    if plan is None:
        return _unchanged(case, Status.OUT_OF_RANGE, "R-WRITE.slot_out_of_range")
    tokens, live_slots = plan
    out = {"k": case.cache.k_init.copy(), "v": case.cache.v_init.copy()}
    H, D, bs = c.num_kv_heads, c.head_dim, c.block_size
    tok = tokens.reshape(-1, 1, 1)
    blk = (live_slots // bs).reshape(-1, 1, 1)
    off = (live_slots % bs).reshape(-1, 1, 1)
    h = np.arange(H, dtype=np.int64).reshape(1, -1, 1)
    d = np.arange(D, dtype=np.int64).reshape(1, 1, -1)
    for side, tdesc, src_array, src_layout in (("k", io.key, case.key, case.key_layout),
                                               ("v", io.value, case.value, case.value_layout)):
        cdesc = getattr(c, side)
        io_store = typed_view(src_array, tdesc.dtype, f"io {side}")
        io_shape, io_stride = dims(tdesc)
        src_off = io_offsets(io_shape, io_stride, tok, h, d) + src_layout.origin
        check_bounds(src_off, io_store.size, f"io {side}")
        cache_store = typed_view(out[side], cdesc.dtype, f"{side} cache")
        shape, stride = dims(cdesc)
        pack = shape[4] if cdesc.layout == Layout.BLOCK_HND_PACKED else 1
        dst_off = cache_offsets(Layout(cdesc.layout), stride, pack, blk, off, h, d) + getattr(case.cache, side).origin
        check_bounds(dst_off, cache_store.size, f"{side} cache")
        src_dt, dst_dt = DType(tdesc.dtype), DType(cdesc.dtype)
        scale = _scale(case, w, side, H) if convert.is_fp8(dst_dt) and src_dt != dst_dt else None
        cache_store[dst_off] = convert.convert(io_store[src_off], src_dt, dst_dt, scale)
    return Result(int(Status.OK), out)
