"""TensorRT-LLM adapter: KVBlockArray pools, KVCacheIndex, block offsets, KV_OFFSETS gathers.

Engine semantics: ``cpp/tensorrt_llm/kernels/kvCacheUtils.h`` (``KVBlockArray``: block
pointer = pool (primary or secondary) + ``offset * bytesPerBlock``, HND inside the
block, ``tokensPerBlockLog2``) and ``cpp/include/tensorrt_llm/kernels/kvCacheIndex.h``
(int32, bit 31 = secondary pool), with the ``[blocks, layers, 2, H, T, D]`` pool of
``kvx-abi-1.1.md``.

Repro: python -m pytest tests/test_adapters_trtllm.py -k <name>
"""
from __future__ import annotations

import itertools

import numpy as np
import pytest

from kvx_conformance.abi.descriptors import BlockTable, SeqLens
from kvx_conformance.abi.header import DType, Layout, Status, TableFormat, TableFlags
from kvx_conformance.adapters import AdapterError, trtllm
from kvx_conformance.adapters.trtllm import PoolBlock

NB, L, H, T, D = 5, 3, 2, 4, 8
HTD = H * T * D


def oracle():
    return pytest.importorskip("kvx_conformance.reference_impl", reason="the numpy oracle is not installed")


def make_pool(dtype=np.float16, seed=0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((NB, L, 2, H, T, D)).astype(dtype)


def test_kv_cache_index_bits():
    assert trtllm.kv_cache_index(5) == 5
    sec = trtllm.kv_cache_index(5, secondary=True)
    assert np.int64(sec).astype(np.int32).view(np.uint32) == 0x80000005
    assert trtllm.decode_index(sec) == (5, True)
    assert trtllm.decode_index(trtllm.NULL_INDEX) == (0x7FFFFFFF, True)  # all ones
    with pytest.raises(AdapterError, match="31-bit"):
        trtllm.kv_cache_index(1 << 31)


def test_tokens_per_block_must_be_a_power_of_two():
    assert trtllm.check_tokens_per_block(64) == 6
    for bad in (0, 12, 48):
        with pytest.raises(AdapterError, match="power-of-two"):
            trtllm.check_tokens_per_block(bad)
    with pytest.raises(AdapterError, match="power-of-two"):
        trtllm.block_array(np.zeros((2, 1, 2, 2 * 12 * 8), np.float16), layer_idx=0, num_kv_heads=2, tokens_per_block=12, head_dim=8)


@pytest.mark.parametrize("layer", range(L))
def test_block_array_hnd_views_address_the_layer_sub_blocks(layer):
    pool = make_pool()
    a = trtllm.block_array(pool, layer_idx=layer, num_kv_heads=H, tokens_per_block=T, head_dim=D)
    assert (a.k.layout, a.k.shape) == (Layout.BLOCK_HND, (NB, H, T, D))
    assert a.pool.bytes_per_block == HTD * 2
    assert a.pool.primary_ptr == pool.ctypes.data + layer * 2 * HTD * 2
    flat = pool.reshape(-1)
    for b, t, h, d in itertools.product(range(NB), range(T), range(H), range(D)):
        hand = ((b * L + layer) * 2) * HTD + h * T * D + t * D + d
        assert a.element_offset("k", b, t, h, d) == hand
        assert a.element_offset("v", b, t, h, d) == hand + HTD
        assert flat[hand] == pool[b, layer, 0, h, t, d] and flat[hand + HTD] == pool[b, layer, 1, h, t, d]


def test_block_offsets_address_what_the_views_address():
    pool = make_pool()
    layer = 2
    a = trtllm.block_array(pool, layer_idx=layer, num_kv_heads=H, tokens_per_block=T, head_dim=D)
    offs = trtllm.block_offsets([[3, 0, 4], [1]], num_layers=L, max_blocks_per_seq=4)
    assert offs.shape == (2, 1, 2, 4) and offs.dtype == np.int32
    assert offs[1, 0, :, 1:].tolist() == [[-1] * 3, [-1] * 3]  # unused: the null index
    for (s, j), kv in itertools.product([(0, 0), (0, 1), (0, 2), (1, 0)], (0, 1)):
        block = [[3, 0, 4], [1]][s][j]
        index, secondary = trtllm.decode_index(offs[s, 0, kv, j])
        assert not secondary and index == block * L * 2 + kv
        # KVBlockArray: pool pointer + index * bytes_per_block == the view's block base
        addr = a.pool.primary_ptr + index * a.pool.bytes_per_block
        view_base = (a.k_ptr if kv == 0 else a.v_ptr) + (block * a.k.stride[0]) * 2
        assert addr == view_base


def test_block_offsets_beams_and_secondary_pool():
    offs = trtllm.block_offsets([[[2, 1], [2, PoolBlock(0, secondary=True)]]], beam_width=2, num_layers=1)
    assert offs.shape == (1, 2, 2, 2)
    assert offs[0, 0, 0].tolist() == [4, 2] and offs[0, 0, 1].tolist() == [5, 3]
    assert trtllm.decode_index(offs[0, 1, 0, 1]) == (0, True)
    assert trtllm.decode_index(offs[0, 1, 1, 1]) == (1, True)
    t = trtllm.kv_offsets_table(offs)
    assert (t.format, t.index_dtype, t.beam_width, t.flags) == (TableFormat.KV_OFFSETS, DType.S32, 2, int(TableFlags.KVCACHEINDEX))
    assert t.encoded_indices().tolist() == offs.reshape(-1).tolist()


def test_refusals():
    pool = make_pool()
    kw = dict(layer_idx=0, num_kv_heads=H, tokens_per_block=T, head_dim=D)
    with pytest.raises(AdapterError, match="cyclic windowing"):
        trtllm.block_array(pool, cyclic_cache_len=64, **kw)
    with pytest.raises(AdapterError, match="cyclic windowing"):
        trtllm.block_array(pool, sink_tokens=4, **kw)
    with pytest.raises(AdapterError, match="kv_factor 1"):
        trtllm.block_array(pool[:, :, :1], **kw)
    with pytest.raises(AdapterError, match="contiguous pool"):
        trtllm.block_array(np.asfortranarray(pool), **kw)
    with pytest.raises(AdapterError, match="S32 KVCacheIndex"):
        trtllm.kv_offsets_table(np.zeros((1, 1, 2, 1), np.int64))


def test_kv_offsets_gather_equals_packed_gather_and_the_engine_rule():
    ref = oracle()
    primary = make_pool(np.float32, seed=1)
    secondary = make_pool(np.float32, seed=2)
    layer = 1
    a = trtllm.block_array(primary, layer_idx=layer, num_kv_heads=H, tokens_per_block=T, head_dim=D, secondary_pool=secondary)
    blocks = [[3, PoolBlock(1, secondary=True), 0], [4, 2]]
    offs = trtllm.block_offsets(blocks, beam_width=2, num_layers=L)
    lens = np.array([10, 7])
    max_len = 12
    g = ref.expected_gather(a.gather_case(trtllm.kv_offsets_table(offs), SeqLens(lens), max_len))
    assert g.status == Status.OK, g
    out_k = g.arrays["k"].reshape(2, 2, max_len, H, D)
    out_v = g.arrays["v"].reshape(2, 2, max_len, H, D)
    # the engine's rule, by hand: pool (by bit 31) + index * bytes_per_block, HND inside
    pools = {False: primary.reshape(-1)[layer * 2 * HTD:], True: secondary.reshape(-1)[layer * 2 * HTD:]}
    for s, w in itertools.product(range(2), range(2)):
        for t in range(max_len):
            if t >= lens[s]:
                assert (out_k[s, w, t] == -7).all()
                continue
            for kv, out in ((0, out_k), (1, out_v)):
                index, sec = trtllm.decode_index(offs[s, w, kv, t // T])
                base = index * HTD
                want = pools[sec][base: base + HTD].reshape(H, T, D)[:, t % T]
                np.testing.assert_array_equal(out[s, w, t], want)
    # primary-only blocks through a PACKED table of the HND views read the same values
    p = ref.expected_gather(a.gather_case(BlockTable.packed(np.array([[4, 2]])), SeqLens(np.array([7])), max_len))
    assert p.status == Status.OK, p
    np.testing.assert_array_equal(p.arrays["k"].reshape(max_len, H, D)[:7], out_k[1, 0, :7])
    np.testing.assert_array_equal(p.arrays["v"].reshape(max_len, H, D)[:7], out_v[1, 1, :7])
