"""vLLM adapter: addresses by hand from vLLM's kernels, metadata semantics, oracle round trips.

Engine semantics are those of ``vllm/csrc/cache_kernels.cu`` (``reshape_and_cache``,
``reshape_and_cache_flash``) and ``vllm/v1/worker/block_table.py`` (block table,
slot mapping, hybrid blocks, decode context parallelism).

Repro: python -m pytest tests/test_adapters_vllm.py -k <name>
"""
from __future__ import annotations

import itertools

import numpy as np
import pytest

from kvx_conformance.abi.descriptors import SeqLens
from kvx_conformance.abi.header import DType, Layout, Status, TableFormat
from kvx_conformance.adapters import AdapterError, vllm
from kvx_conformance.adapters.common import flat_alias

SEED = 20240611
NB, BS, H, D, X = 6, 4, 2, 8, 4


def oracle():
    return pytest.importorskip("kvx_conformance.reference_impl", reason="the numpy oracle is not installed")


def every_element(nb=NB, bs=BS, h=H, d=D):
    return itertools.product(range(nb), range(bs), range(h), range(d))


def assert_addresses(adapted, kind, engine_array, engine_index, hand_offset):
    """Every logical element: the KVX address holds what the engine's indexing reads, and
    equals the offset written out from vLLM's kernel."""
    g = adapted.geometry
    flat = flat_alias(engine_array, 0, engine_array.size)
    for b, t, h, d in every_element(g.num_blocks, g.block_size, g.num_kv_heads, g.head_dim):
        off = adapted.element_offset(kind, b, t, h, d)
        assert off == hand_offset(b, t, h, d), (kind, b, t, h, d)
        assert flat[off] == engine_array[engine_index(b, t, h, d)], (kind, b, t, h, d)


# ---------------------------------------------------------------------------- layouts


def test_flash_nhd_addresses_match_reshape_and_cache_flash():
    key = np.arange(NB * BS * H * D, dtype=np.float32).reshape(NB, BS, H, D)
    value = key + 0.5
    a = vllm.flash_cache(key, value)
    assert a.engine == "vllm.flash/NHD"
    assert (a.k.layout, a.k.shape, a.k.stride) == (Layout.BLOCK_NHD, (NB, BS, H, D), (BS * H * D, H * D, D, 1))
    # tgt = block_idx * block_stride + block_offset * num_heads * head_size + head_idx * head_size + head_offset
    hand = lambda b, t, h, d: b * BS * H * D + t * H * D + h * D + d
    assert_addresses(a, "k", key, lambda *i: i, hand)
    assert_addresses(a, "v", value, lambda *i: i, hand)


def test_flash_hnd_is_chosen_by_the_head_stride():
    phys = np.arange(NB * H * BS * D, dtype=np.float32).reshape(NB, H, BS, D)
    logical = phys.transpose(0, 2, 1, 3)  # what vLLM hands the kernel: [num_blocks, block_size, H, D]
    assert logical.strides[2] // 4 != D  # head stride != head_size: not NHD
    a = vllm.flash_cache(logical, logical.copy())
    assert a.engine == "vllm.flash/HND"
    assert (a.k.layout, a.k.shape, a.k.stride) == (Layout.BLOCK_HND, (NB, H, BS, D), (H * BS * D, BS * D, D, 1))
    hand = lambda b, t, h, d: b * H * BS * D + h * BS * D + t * D + d
    assert_addresses(a, "k", phys, lambda b, t, h, d: (b, h, t, d), hand)


@pytest.mark.parametrize("backend", ["flash_attn", "flashinfer"])
def test_combined_kv_cache_splits_k_and_v(backend):
    if backend == "flash_attn":
        kv = np.arange(2 * NB * BS * H * D, dtype=np.float32).reshape(2, NB, BS, H, D)
        k_of, v_of = (lambda b, t, h, d: (0, b, t, h, d)), (lambda b, t, h, d: (1, b, t, h, d))
    else:
        kv = np.arange(NB * 2 * BS * H * D, dtype=np.float32).reshape(NB, 2, BS, H, D)
        k_of, v_of = (lambda b, t, h, d: (b, 0, t, h, d)), (lambda b, t, h, d: (b, 1, t, h, d))
    a = vllm.flash_kv_cache(kv, backend=backend)
    flat = kv.reshape(-1)
    base = kv.ctypes.data
    for b, t, h, d in every_element():
        k_off = (a.k_ptr - base) // 4 + (a.element_offset("k", b, t, h, d) - a.k_offset)
        v_off = (a.v_ptr - base) // 4 + (a.element_offset("v", b, t, h, d) - a.v_offset)
        assert flat[k_off] == kv[k_of(b, t, h, d)] and flat[v_off] == kv[v_of(b, t, h, d)]


def test_paged_layout_packed_k_and_transposed_v():
    key = np.arange(NB * H * (D // X) * BS * X, dtype=np.float32).reshape(NB, H, D // X, BS, X)
    value = np.arange(NB * H * D * BS, dtype=np.float32).reshape(NB, H, D, BS) + 0.25
    a = vllm.paged_cache(key, value)
    assert (a.k.layout, a.k.shape) == (Layout.BLOCK_HND_PACKED, (NB, H, D // X, BS, X))
    assert (a.v.layout, a.v.shape, a.v.stride) == (Layout.BLOCK_HND, (NB, H, BS, D), (H * D * BS, D * BS, 1, BS))
    # reshape_and_cache: tgt_key_idx = b*H*(D/x)*bs*x + h*(D/x)*bs*x + (d/x)*bs*x + t*x + d%x
    hand_k = lambda b, t, h, d: b * H * (D // X) * BS * X + h * (D // X) * BS * X + (d // X) * BS * X + t * X + d % X
    # tgt_value_idx = b*H*D*bs + h*D*bs + d*bs + t
    hand_v = lambda b, t, h, d: b * H * D * BS + h * D * BS + d * BS + t
    assert_addresses(a, "k", key, lambda b, t, h, d: (b, h, d // X, t, d % X), hand_k)
    assert_addresses(a, "v", value, lambda b, t, h, d: (b, h, d, t), hand_v)


def test_fp8_cache_allocated_as_uint8():
    key = np.zeros((NB, BS, H, D), np.uint8)
    a = vllm.flash_cache(key, key.copy(), kv_cache_dtype="fp8_e5m2")
    assert a.k.dtype == DType.F8_E5M2 == a.v.dtype
    with pytest.raises(AdapterError, match="uint8.*not a KVX cache dtype"):
        vllm.flash_cache(key, key.copy())


def test_mismatched_or_misshaped_caches_are_refused():
    with pytest.raises(AdapterError, match="K and V disagree"):
        vllm.flash_cache(np.zeros((NB, BS, H, D), np.float16), np.zeros((NB, BS, H, D + 8), np.float16))
    with pytest.raises(AdapterError, match="4-D"):
        vllm.flash_cache(np.zeros((NB, BS, H * D), np.float16), np.zeros((NB, BS, H * D), np.float16))
    with pytest.raises(AdapterError, match="K and V disagree"):
        vllm.paged_cache(np.zeros((NB, H, D // X, BS, X), np.float16), np.zeros((NB, H, D, BS * 2), np.float16))


# ---------------------------------------------------------------------------- metadata


def test_slot_mapping_keeps_dtype_and_minus_one():
    s = vllm.slot_mapping(np.array([5, -1, 17, -1, -1], np.int64), num_tokens=3)
    assert (s.dtype, s.invalid_slot, s.slots.tolist()) == (DType.S64, -1, [5, -1, 17])
    assert vllm.slot_mapping(np.array([1, 2], np.int32)).dtype == DType.S32
    with pytest.raises(AdapterError, match="S32 or S64"):
        vllm.slot_mapping(np.array([1.0, 2.0]))


def test_block_table_is_packed_int32():
    t = vllm.block_table(np.array([[3, 1, 0], [4, 0, 0], [9, 9, 9]], np.int32), num_reqs=2)
    assert (t.format, t.index_dtype, t.seq_count, t.max_blocks_per_seq) == (TableFormat.PACKED, DType.S32, 2, 3)
    assert t.indices.tolist() == [3, 1, 0, 4, 0, 0]


def test_hybrid_manager_blocks_expand_to_kernel_blocks():
    assert vllm.map_to_kernel_blocks([0, 1, 2], 2).tolist() == [0, 1, 2, 3, 4, 5]
    assert vllm.map_to_kernel_blocks([5, 2], 4).tolist() == [20, 21, 22, 23, 8, 9, 10, 11]
    t = vllm.hybrid_block_table(np.array([[5, 2, 0], [1, 0, 0]], np.int32), [2, 1], 32, 16, pad_id=-7)
    assert t.max_blocks_per_seq == 6
    assert t.indices.reshape(2, 6).tolist() == [[10, 11, 4, 5, -7, -7], [2, 3, -7, -7, -7, -7]]
    with pytest.raises(AdapterError, match="whole number of kernel blocks"):
        vllm.hybrid_block_table(np.zeros((1, 1), np.int32), [1], 24, 16)


def test_hybrid_slot_mapping_matches_the_manager_block_arithmetic():
    manager = np.array([[5, 2]], np.int32)
    kernel = vllm.hybrid_block_table(manager, [2], 8, 4).indices.reshape(1, -1)
    pos = np.arange(16)
    s = vllm.compute_slot_mapping(kernel, [0, 16], pos, 4)
    # by hand, with vLLM's hybrid rule: kernel block = manager[p // 8] * 2 + (p % 8) // 4, slot = that * 4 + p % 4
    hand = [(int(manager[0, p // 8]) * 2 + (p % 8) // 4) * 4 + p % 4 for p in range(16)]
    assert s.slots.tolist() == hand
    assert s.slots[9] == 17  # position 9: manager block 2 -> kernel block 4, offset 1


def test_slot_mapping_from_positions_and_padding():
    table = np.array([[7, 3, 0], [2, 8, 0]], np.int32)
    s = vllm.compute_slot_mapping(table, [0, 3, 5], np.array([0, 1, 4, 6, 7]), 4, pad_to=8)
    assert s.slots.tolist() == [28, 29, 12, 34, 35, -1, -1, -1]


def test_context_parallel_slot_mapping_by_hand():
    table = np.array([[7, 3]], np.int32)
    pos = np.arange(12)
    # W=2, interleave 1: virtual block of 8; rank 0 owns even positions
    r0 = vllm.compute_slot_mapping(table, [0, 12], pos, 4, cp_world_size=2, cp_rank=0)
    r1 = vllm.compute_slot_mapping(table, [0, 12], pos, 4, cp_world_size=2, cp_rank=1)
    assert r0.slots.tolist() == [28, -1, 29, -1, 30, -1, 31, -1, 12, -1, 13, -1]
    assert r1.slots.tolist() == [-1, 28, -1, 29, -1, 30, -1, 31, -1, 12, -1, 13]
    # interleave 2: runs of two tokens alternate between ranks
    i2 = vllm.compute_slot_mapping(table, [0, 12], pos, 4, cp_world_size=2, cp_rank=0, cp_kv_cache_interleave_size=2)
    assert i2.slots.tolist() == [28, 29, -1, -1, 30, 31, -1, -1, 12, 13, -1, -1]
    assert vllm.cp_local_seq_lens([11, 0, 9], 4, 2, 0).lengths.tolist() == [6, 0, 5]
    assert vllm.cp_local_seq_lens([11], 4, 2, 1).lengths.tolist() == [5]
    assert vllm.cp_local_positions(11, 4, 2, 1).tolist() == [1, 3, 5, 7, 9]
    with pytest.raises(AdapterError, match="interleave"):
        vllm.compute_slot_mapping(table, [0, 12], pos, 4, cp_world_size=2, cp_rank=0, cp_kv_cache_interleave_size=3)


@pytest.mark.parametrize("world, interleave", [(2, 1), (2, 2), (4, 1), (2, 4)])
def test_context_parallel_local_tokens_fill_blocks_in_order(world, interleave):
    """What a rank writes through its slot mapping, a PACKED gather of its local length
    reads back in local order: token k at table[k // bs] * bs + k % bs."""
    bs, L = 4, 37
    table = np.array([[11, 4, 9, 0, 6, 2, 13, 1, 3, 5]], np.int32)
    for rank in range(world):
        s = vllm.compute_slot_mapping(table, [0, L], np.arange(L), bs, cp_world_size=world, cp_rank=rank,
                                      cp_kv_cache_interleave_size=interleave)
        cache = np.full(16 * bs, -1, np.int64)
        live = s.slots >= 0
        cache[s.slots[live]] = np.arange(L)[live]  # the "token" written is its position
        n = int(vllm.cp_local_seq_lens([L], bs, world, rank, interleave).lengths[0])
        k = np.arange(n)
        read = cache[table[0, k // bs].astype(np.int64) * bs + k % bs]
        assert read.tolist() == vllm.cp_local_positions(L, bs, world, rank, interleave).tolist(), (world, interleave, rank)
        assert n == int(live.sum())


# ---------------------------------------------------------------------------- oracle round trips


def _tokens(rng, n, dtype=np.float32):
    return rng.standard_normal((n, H, D)).astype(dtype)


def test_paged_write_through_the_oracle_equals_reshape_and_cache():
    ref = oracle()
    rng = np.random.default_rng(SEED)
    key0 = rng.standard_normal((NB, H, D // X, BS, X)).astype(np.float32)
    val0 = rng.standard_normal((NB, H, D, BS)).astype(np.float32)
    slots = np.array([5, -1, 0, 23, 9, -1, 14], np.int64)
    key, value = _tokens(rng, len(slots)), _tokens(rng, len(slots))
    # vLLM semantics, by hand (cache_kernels.cu reshape_and_cache)
    hk, hv = key0.copy(), val0.copy()
    for i, s in enumerate(slots):
        if s < 0:
            continue
        b, t = divmod(int(s), BS)
        for h, d in itertools.product(range(H), range(D)):
            hk[b, h, d // X, t, d % X] = key[i, h, d]
            hv[b, h, d, t] = value[i, h, d]
    # the same write through the KVX description
    kk, kv = key0.copy(), val0.copy()
    a = vllm.paged_cache(kk, kv)
    res = ref.expected_write(a.write_case(key, value, vllm.slot_mapping(slots)))
    assert res.status == Status.OK, res
    a.load(res.arrays)
    np.testing.assert_array_equal(kk, hk)
    np.testing.assert_array_equal(kv, hv)


def test_flash_hnd_gather_through_the_oracle_reads_the_block_table():
    ref = oracle()
    rng = np.random.default_rng(SEED + 1)
    phys = rng.standard_normal((NB, H, BS, D)).astype(np.float32)
    key_cache = phys.transpose(0, 2, 1, 3)
    value_cache = (phys * 3).transpose(0, 2, 1, 3)
    table = np.array([[4, 1, 0], [2, 5, 3]], np.int32)
    lens = np.array([6, 11])
    a = vllm.flash_cache(key_cache, value_cache)
    max_len = 12
    res = ref.expected_gather(a.gather_case(vllm.block_table(table), SeqLens(lens), max_len))
    assert res.status == Status.OK, res
    out_k = res.arrays["k"].reshape(2, max_len, H, D)
    out_v = res.arrays["v"].reshape(2, max_len, H, D)
    for s, L in enumerate(lens):
        for t in range(max_len):
            if t < L:
                b = table[s, t // BS]
                np.testing.assert_array_equal(out_k[s, t], key_cache[b, t % BS])
                np.testing.assert_array_equal(out_v[s, t], value_cache[b, t % BS])
            else:
                assert (out_k[s, t] == -7).all()  # untouched rows keep the poison


def test_context_parallel_round_trip_through_the_oracle():
    ref = oracle()
    rng = np.random.default_rng(SEED + 2)
    world, inter, L = 2, 2, 13
    table = np.array([[3, 0, 5, 1]], np.int32)
    key = _tokens(rng, L)
    for rank in range(world):
        kc = np.zeros((NB, BS, H, D), np.float32)
        a = vllm.flash_cache(kc, kc.copy())
        sm = vllm.compute_slot_mapping(table, [0, L], np.arange(L), BS, cp_world_size=world, cp_rank=rank,
                                       cp_kv_cache_interleave_size=inter)
        res = ref.expected_write(a.write_case(key, key, sm))
        assert res.status == Status.OK
        a.load(res.arrays)
        lens = vllm.cp_local_seq_lens([L], BS, world, rank, inter)
        n = int(lens.lengths[0])
        g = ref.expected_gather(a.gather_case(vllm.block_table(table), lens, n))
        assert g.status == Status.OK
        want = key[vllm.cp_local_positions(L, BS, world, rank, inter)]
        np.testing.assert_array_equal(g.arrays["k"].reshape(n, H, D), want)
