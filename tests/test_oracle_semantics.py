"""Oracle write/gather semantics on small cases whose results are worked out by hand.

Spec 4.1 (slot addressing), 5.1 (PACKED / RAGGED / KV_OFFSETS), 5.2 (invalid slots);
readings R-WRITE, R-GATHER, R-DATA, R-FP8, R-ORDER.
"""
from __future__ import annotations

import ml_dtypes
import numpy as np

from kvx_conformance.abi.descriptors import (
    BlockTable,
    Geometry,
    IOLayout,
    ScaleSpec,
    SeqLens,
    SlotMapping,
    cache_layout,
)
from kvx_conformance.abi.dtypes import bits_view
from kvx_conformance.abi.header import DType, Layout, ScaleGranularity, Status
from kvx_conformance.cases.case import CacheCase, GatherCase, PoolCase, WriteCase
from kvx_conformance.reference_impl import expected_gather, expected_write

POISON = -7.0


def _cache(geom: Geometry, layout=Layout.BLOCK_NHD, dtype=DType.F32, k=None, v=None, pool=None) -> CacheCase:
    kl = cache_layout(geom, layout, dtype)
    vl = cache_layout(geom, layout, dtype)
    n = kl.span_elements()
    k = np.arange(1, n + 1, dtype=np.float32) if k is None else k
    v = -np.arange(1, n + 1, dtype=np.float32) if v is None else v
    return CacheCase(geom, kl, vl, k, v, pool)


def _write_case(geom, slots, key, value, invalid_slot=-1, slot_dtype=DType.S64, layout=Layout.BLOCK_NHD, **kw):
    T = len(slots)
    H, D = geom.num_kv_heads, geom.head_dim
    io = IOLayout.dense(DType.F32, T, H, D)
    return WriteCase(_cache(geom, layout), io, io, np.asarray(key, np.float32).reshape(-1),
                     np.asarray(value, np.float32).reshape(-1),
                     SlotMapping(np.array(slots, np.int64), slot_dtype, invalid_slot), T, **kw)


G = Geometry(num_blocks=2, block_size=2, num_kv_heads=1, head_dim=2)  # NHD strides (4, 2, 2, 1)


def test_write_slots_and_invalid_slots():
    # tokens: slot 3 (block 1, offset 1 -> elements 4+2 = 6, 7), slot -1 (no-op), slot 0 (elements 0, 1)
    case = _write_case(G, [3, -1, 0], [[10, 11], [20, 21], [30, 31]], [[-10, -11], [-20, -21], [-30, -31]])
    r = expected_write(case)
    assert r.status == Status.OK
    assert r.arrays["k"].tolist() == [30, 31, 3, 4, 5, 6, 10, 11]
    assert r.arrays["v"].tolist() == [-30, -31, -3, -4, -5, -6, -10, -11]


def test_write_hnd_slot_addressing():
    g = Geometry(num_blocks=2, block_size=2, num_kv_heads=2, head_dim=1)  # HND strides (4, 2, 1, 1)
    # slot 1 = block 0, offset 1: head 0 at 0*4 + 0*2 + 1 = 1, head 1 at 0 + 2 + 1 = 3
    case = _write_case(g, [1], [[[5], [6]]], [[[7], [8]]], layout=Layout.BLOCK_HND)
    r = expected_write(case)
    assert r.arrays["k"].tolist() == [1, 5, 3, 6, 5, 6, 7, 8]


def test_write_nonnegative_invalid_slot_and_negative_slots():
    # invalid_slot = 3 makes slot 3 a no-op; -5 is a no-op too (any negative slot); slot 2 -> elements 4, 5
    case = _write_case(G, [3, -5, 2], [[10, 11], [20, 21], [30, 31]], [[0, 0]] * 3, invalid_slot=3,
                       slot_dtype=DType.S32)
    r = expected_write(case)
    assert r.status == Status.OK
    assert r.arrays["k"].tolist() == [1, 2, 3, 4, 30, 31, 7, 8]


def test_write_out_of_range_writes_nothing():
    # slot 4 = num_blocks * block_size: OUT_OF_RANGE, and the valid token 0 is not written either (R-ORDER)
    case = _write_case(G, [0, 4], [[10, 11], [20, 21]], [[0, 0]] * 2)
    r = expected_write(case)
    assert r.status == Status.OUT_OF_RANGE and r.rule == "R-WRITE.slot_out_of_range"
    assert r.arrays["k"].tolist() == list(range(1, 9))
    # ... unless that slot is the sentinel
    case = _write_case(G, [0, 4], [[10, 11], [20, 21]], [[0, 0]] * 2, invalid_slot=4)
    assert expected_write(case).arrays["k"].tolist() == [10, 11, 3, 4, 5, 6, 7, 8]


def test_write_duplicate_slots_last_wins():
    case = _write_case(G, [1, 1], [[10, 11], [20, 21]], [[0, 0]] * 2)
    assert expected_write(case).arrays["k"].tolist() == [1, 2, 20, 21, 5, 6, 7, 8]


def test_write_zero_tokens_is_ok():
    case = _write_case(G, [], np.zeros(0), np.zeros(0))
    r = expected_write(case)
    assert r.status == Status.OK and r.arrays["k"].tolist() == list(range(1, 9))


def _fp8_two_heads(**scales) -> WriteCase:
    """One token of two heads, head_dim 1, into an E4M3 cache: K = [2.125, 1000], V = [0.5, 300]."""
    g = Geometry(num_blocks=1, block_size=1, num_kv_heads=2, head_dim=1)
    init = np.frombuffer(bytes([0x11, 0x11]), np.uint8).view(ml_dtypes.float8_e4m3fn)
    lay = cache_layout(g, Layout.BLOCK_NHD, DType.F8_E4M3)
    io = IOLayout.dense(DType.F32, 1, 2, 1)
    return WriteCase(CacheCase(g, lay, lay, init.copy(), init.copy()), io, io, np.array([2.125, 1000], np.float32),
                     np.array([0.5, 300], np.float32), SlotMapping(np.array([0])), 1, **scales)


def test_write_fp8_per_head_scale():
    # head 0: 2.125 / 2 = 1.0625 (tie -> 1.0 = 0x38); head 1: 1000 / 4 = 250, between 240 and 256 (step 16):
    # nearest 256 = 0 1111 000 = 0x78
    # v: k_scale_desc absent, v_scale pointer 0.5: 0.5 / 0.5 = 1.0 (0x38); 300 / 0.5 = 600 -> 448 (0x7E)
    case = _fp8_two_heads(k_scale=100.0,  # ignored: k_scale_desc.data wins
                          v_scale=0.5,
                          k_scale_desc=ScaleSpec(np.array([2.0, 4.0], np.float32), ScaleGranularity.PER_HEAD))
    r = expected_write(case)
    assert r.status == Status.OK
    assert bits_view(r.arrays["k"]).tolist() == [0x38, 0x78]
    assert bits_view(r.arrays["v"]).tolist() == [0x38, 0x7E]


def test_write_fp8_per_head_scale_strides():
    """R-FP8: head h's value at data[h * stride[0]]; the reference refuses stride[0] > 1
    (UNSUPPORTED); served, the result is that of the same values stored adjacent."""
    import dataclasses

    dense = _fp8_two_heads(k_scale_desc=ScaleSpec(np.array([2.0, 4.0], np.float32), ScaleGranularity.PER_HEAD))
    init = dense.cache.k_init
    strided = dataclasses.replace(dense, k_scale_desc=dataclasses.replace(dense.k_scale_desc, stride=3))
    assert strided.k_scale_desc.buffer().tolist() == [2.0, -3.0, -3.0, 4.0]
    r = expected_write(strided)
    assert (r.status, r.rule) == (Status.UNSUPPORTED, "R-FP8.scale_stride")
    served, want = expected_write(strided, served=("R-FP8.scale_stride",)), expected_write(dense)
    assert served.status == Status.OK
    assert bits_view(served.arrays["k"]).tolist() == bits_view(want.arrays["k"]).tolist() == [0x38, 0x78]
    # one head: only data[0] is read, whatever the stride
    one = Geometry(num_blocks=1, block_size=1, num_kv_heads=1, head_dim=1)
    lay1 = cache_layout(one, Layout.BLOCK_NHD, DType.F8_E4M3)
    io1 = IOLayout.dense(DType.F32, 1, 1, 1)
    case1 = WriteCase(CacheCase(one, lay1, lay1, init[:1].copy(), init[:1].copy()), io1, io1,
                      np.array([2.125], np.float32), np.array([0.5], np.float32), SlotMapping(np.array([0])), 1,
                      k_scale_desc=ScaleSpec(np.array([2.0], np.float32), ScaleGranularity.PER_HEAD, stride=7))
    assert expected_write(case1).status == Status.OK


# ----------------------------------------------------------------------------
# gather

GG = Geometry(num_blocks=3, block_size=2, num_kv_heads=1, head_dim=1)  # NHD strides (2, 1, 1, 1)


def _kv_values():
    # element (b, t) at offset 2b + t holds 100b + t + 1 in K and its negation in V
    k = np.array([100 * b + t + 1 for b in range(3) for t in range(2)], np.float32)
    return k, -k


def _gather_case(table: BlockTable, lens, msl, out=None, cache=None) -> GatherCase:
    bw = table.beam_width
    S = table.seq_count
    out = out or IOLayout.dense(DType.F32, S * bw * msl, 1, 1)
    span = out.span_elements()
    return GatherCase(cache or _cache(GG, k=_kv_values()[0], v=_kv_values()[1]), table,
                      SeqLens(np.array(lens, np.int64)), msl, out, S * bw * msl,
                      out_k_init=np.full(span, POISON, np.float32), out_v_init=np.full(span, POISON, np.float32))


def test_gather_packed_by_hand():
    # seq 0 (len 3): t0 -> block 2 off 0 = 201, t1 -> block 2 off 1 = 202, t2 -> block 0 off 0 = 1
    # seq 1 (len 1): t0 -> block 1 off 0 = 101; its second table entry (-5) is never used
    # rows t >= len keep the poison
    case = _gather_case(BlockTable.packed(np.array([[2, 0], [1, -5]])), [3, 1], 3)
    r = expected_gather(case)
    assert r.status == Status.OK
    assert r.arrays["k"].tolist() == [201, 202, 1, 101, POISON, POISON]
    assert r.arrays["v"].tolist() == [-201, -202, -1, -101, POISON, POISON]


def test_gather_max_seq_len_truncates_and_zero_length():
    # seq 0 len 1000 truncated to max_seq_len 2: a table too small for 1000 tokens is fine
    case = _gather_case(BlockTable.packed(np.array([[2], [1]]), DType.S64), [1000, 0], 2)
    r = expected_gather(case)
    assert r.status == Status.OK
    assert r.arrays["k"].tolist() == [201, 202, POISON, POISON]


def test_gather_4d_padded_output():
    out = IOLayout.padded4d(DType.F32, 2, 3, 1, 1)  # [2, 3, 1, 1]: same rows as the 3-D form
    case = _gather_case(BlockTable.packed(np.array([[2, 0], [1, -5]])), [3, 1], 3, out=out)
    assert expected_gather(case).arrays["k"].tolist() == [201, 202, 1, 101, POISON, POISON]


def test_gather_ragged_by_hand():
    # RAGGED: one block id per token, offset = t % block_size
    # seq 0 ids [2, 1, 0]: t0 -> (2, 0) = 201, t1 -> (1, 1) = 102, t2 -> (0, 0) = 1; seq 1 ids [1, 7]: len 1 -> 101
    table = BlockTable.ragged([np.array([2, 1, 0]), np.array([1, 7])], 2, index_dtype=DType.S64, indptr_dtype=DType.S32)
    assert table.indptr.tolist() == [0, 3, 5]
    r = expected_gather(_gather_case(table, [3, 1], 3))
    assert r.status == Status.OK
    assert r.arrays["k"].tolist() == [201, 102, 1, 101, POISON, POISON]


def test_gather_ragged_range_too_short_is_out_of_range():
    table = BlockTable.ragged([np.array([2, 1]), np.array([1])], 2)
    r = expected_gather(_gather_case(table, [3, 1], 3))
    assert (r.status, r.rule) == (Status.OUT_OF_RANGE, "R-DATA.ragged_seq_range")
    assert r.arrays["k"].tolist() == [POISON] * 6


def test_gather_packed_bad_block_and_too_many_blocks():
    r = expected_gather(_gather_case(BlockTable.packed(np.array([[2, 3]])), [3], 3))
    assert (r.status, r.rule) == (Status.OUT_OF_RANGE, "R-DATA.packed_block_id")
    r = expected_gather(_gather_case(BlockTable.packed(np.array([[2]])), [3], 3))
    assert (r.status, r.rule) == (Status.OUT_OF_RANGE, "R-DATA.max_blocks")
    r = expected_gather(_gather_case(BlockTable.packed(np.array([[2]])), [-1], 3))
    assert (r.status, r.rule) == (Status.INVALID_ARGUMENT, "R-DATA.negative_length")


def _kvo_case(offsets, lens, msl, secondary=True, secondary_null=False):
    g = Geometry(num_blocks=2, block_size=2, num_kv_heads=1, head_dim=2)  # pool block = [1, 2, 2]: 4 elements
    prim = 1000 + np.arange(3 * 4, dtype=np.float32)  # 3 primary blocks (more than num_blocks)
    sec = 2000 + np.arange(2 * 4, dtype=np.float32) if secondary else None
    pool = PoolCase(4 * 4, prim, sec, secondary_null=secondary_null)
    table = BlockTable.kv_offsets(np.array(offsets, np.int64))
    S, bw = table.seq_count, table.beam_width
    out = IOLayout.dense(DType.F32, S * bw * msl, 1, 2)
    span = out.span_elements()
    cache = _cache(g, pool=pool)
    return GatherCase(cache, table, SeqLens(np.array(lens)), msl, out, S * bw * msl,
                      out_k_init=np.full(span, POISON, np.float32), out_v_init=np.full(span, POISON, np.float32))


def test_gather_kv_offsets_beams_and_secondary_pool():
    S2 = 0x80000000
    # one sequence, two beams, len 3 (blocks 0 and 1 used); element (blk, t, d) at blk*4 + t*2 + d
    # beam 0 K: [prim 2, sec 1]: t0 -> 1008 1009, t1 -> 1010 1011, t2 -> sec blk 1 t0 -> 2004 2005
    # beam 1 K: [sec 0, prim 1]: t0 -> 2000 2001, t1 -> 2002 2003, t2 -> 1004 1005
    # beam 0 V: [prim 1, prim 0]: 1004 1005, 1006 1007, 1000 1001; beam 1 V: [prim 0, prim 2]: 1000.., 1008 1009
    case = _kvo_case([[[[2, S2 | 1], [1, 0]], [[S2 | 0, 1], [0, 2]]]], [3], 3)
    r = expected_gather(case)
    assert r.status == Status.OK
    assert r.arrays["k"].tolist() == [1008, 1009, 1010, 1011, 2004, 2005, 2000, 2001, 2002, 2003, 1004, 1005]
    assert r.arrays["v"].tolist() == [1004, 1005, 1006, 1007, 1000, 1001, 1000, 1001, 1002, 1003, 1008, 1009]


def test_gather_kv_offsets_null_index():
    null = 0xFFFFFFFF
    # len 2 uses only block 0: the null index in block 1 is never looked at
    case = _kvo_case([[[[2, null], [1, null]]]], [2], 3)
    r = expected_gather(case)
    assert r.status == Status.OK and r.arrays["k"].tolist() == [1008, 1009, 1010, 1011, POISON, POISON]
    # len 3 needs block 1: the null index is OUT_OF_RANGE and nothing is written
    r = expected_gather(_kvo_case([[[[2, null], [1, 0]]]], [3], 3))
    assert (r.status, r.rule) == (Status.OUT_OF_RANGE, "R-DATA.kv_offsets_null_index")
    assert r.arrays["k"].tolist() == [POISON] * 6


def test_gather_kv_offsets_secondary_without_pool():
    r = expected_gather(_kvo_case([[[[0x80000001, 0], [1, 0]]]], [1], 1, secondary=True, secondary_null=True))
    assert (r.status, r.rule) == (Status.OUT_OF_RANGE, "R-DATA.kv_offsets_secondary_null")
