"""TGI adapter: layouts by hand from TGI's store, slots, padded and ragged block tables.

Engine semantics are those of ``server/text_generation_server/layers/attention/kv_cache.py``
(``KVCache.__init__`` shapes, ``store``: ``cache.view(-1, H, D)[slots] = key``; paged
``x = BLOCK_SIZE // element_size``) and ``models/metadata_kernels.py``
(``block_tables_to_ragged``: ``block_tables[i][:cache_len + input_len]``).

Repro: python -m pytest tests/test_adapters_tgi.py -k <name>
"""
from __future__ import annotations

import itertools

import numpy as np
import pytest

from kvx_conformance.abi.header import DType, Layout, Status, TableFormat
from kvx_conformance.adapters import AdapterError, tgi

SEED = 7301
H, D = 2, 16


def oracle():
    return pytest.importorskip("kvx_conformance.reference_impl", reason="the numpy oracle is not installed")


def test_flash_layout_is_nhd_with_the_store_addresses():
    nb, bs = 5, 4
    key = np.arange(nb * bs * H * D, dtype=np.float16).reshape(nb, bs, H, D)
    a = tgi.flash_cache(key, key.copy())
    assert (a.engine, a.k.layout, a.geometry.block_size) == ("tgi.flash/NHD", Layout.BLOCK_NHD, bs)
    flat = key.reshape(-1)
    for b, t, h, d in itertools.product(range(nb), range(bs), range(H), range(D)):
        slot = b * bs + t
        assert a.element_offset("k", b, t, h, d) == slot * H * D + h * D + d  # cache.view(-1, H, D)[slot, h, d]
        assert flat[a.element_offset("k", b, t, h, d)] == key.reshape(-1, H, D)[slot, h, d]


def test_ipex_cpu_layout_is_hnd():
    nb, bs = 3, 4
    key = np.arange(nb * H * bs * D, dtype=np.float32).reshape(nb, H, bs, D)
    a = tgi.ipex_cpu_cache(key, key.copy())
    assert (a.k.layout, a.geometry.block_size, a.geometry.num_kv_heads) == (Layout.BLOCK_HND, bs, H)
    for b, t, h, d in itertools.product(range(nb), range(bs), range(H), range(D)):
        assert a.element_offset("k", b, t, h, d) == b * H * bs * D + h * bs * D + t * D + d


def test_paged_pack_factor_is_block_size_over_element_size():
    assert tgi.pack_factor(16, 2) == 8
    assert tgi.pack_factor(16, 1) == 16
    assert tgi.pack_factor(16, 4) == 4
    assert tgi.pack_factor(16, 2, xpu=True) == 1
    with pytest.raises(AdapterError, match="x = BLOCK_SIZE // element_size is 0"):
        tgi.pack_factor(1, 2)  # flashinfer's BLOCK_SIZE with the paged layout


def test_paged_layout_addresses():
    nb, bs, x = 3, 16, 8
    key = np.arange(nb * H * (D // x) * bs * x, dtype=np.float16).reshape(nb, H, D // x, bs, x)
    value = np.arange(nb * H * D * bs, dtype=np.float16).reshape(nb, H, D, bs)
    a = tgi.paged_cache(key, value)
    assert (a.engine, a.k.layout, a.k.shape[4], a.v.layout) == ("tgi.paged", Layout.BLOCK_HND_PACKED, x, Layout.BLOCK_HND)
    for b, t, h, d in itertools.product(range(nb), range(bs), range(H), range(D)):
        assert a.element_offset("k", b, t, h, d) == (((b * H + h) * (D // x) + d // x) * bs + t) * x + d % x
        assert a.element_offset("v", b, t, h, d) == ((b * H + h) * D + d) * bs + t
    with pytest.raises(ValueError, match="TGI allocates x"):
        tgi.paged_cache(key.reshape(nb, H, D // 4, bs, 4), value)  # x=4 is not 16 // 2


def test_slots_refuse_negative_values():
    s = tgi.slots(np.array([3, 9, 0], np.int64))
    assert (s.dtype, s.slots.tolist()) == (DType.S64, [3, 9, 0])
    with pytest.raises(AdapterError, match="wrapping a negative slot"):
        tgi.slots(np.array([3, -1], np.int64))


def test_block_tables_tensor_is_packed():
    t = tgi.block_tables_tensor(np.array([[4, 2], [7, 0]], np.int32))
    assert (t.format, t.index_dtype, t.indices.tolist()) == (TableFormat.PACKED, DType.S32, [4, 2, 7, 0])


def test_block_tables_ragged_with_block_size_one():
    block_tables = np.array([[9, 4, 6, 1, 0], [3, 8, 0, 0, 0]], np.int32)
    input_lengths, cache_lengths = [1, 2], [3, 0]
    # TGI: block_tables_ragged = concat(block_tables[i][:cache_len + input_len])
    ragged = np.concatenate([block_tables[i][: c + n] for i, (n, c) in enumerate(zip(input_lengths, cache_lengths))])
    t, lens = tgi.block_tables_ragged(ragged, input_lengths, cache_lengths, block_size=1)
    assert (t.format, t.index_dtype) == (TableFormat.RAGGED, DType.S32)
    assert t.indices.tolist() == [9, 4, 6, 1, 3, 8]
    assert t.indptr.tolist() == [0, 4, 6]
    assert lens.lengths.tolist() == [4, 2]
    same, _ = tgi.ragged_from_block_tables(block_tables, input_lengths, cache_lengths, 1)
    assert same.indices.tolist() == t.indices.tolist() and same.indptr.tolist() == t.indptr.tolist()
    with pytest.raises(AdapterError, match="per-token only for BLOCK_SIZE 1"):
        tgi.block_tables_ragged(ragged, input_lengths, cache_lengths, block_size=16)


def test_ragged_from_block_tables_repeats_each_block_per_token():
    t, lens = tgi.ragged_from_block_tables(np.array([[5, 2], [7, 0]], np.int32), [2, 1], [3, 0], block_size=4)
    assert t.indices.tolist() == [5, 5, 5, 5, 2, 7]
    assert t.indptr.tolist() == [0, 5, 6]
    assert lens.lengths.tolist() == [5, 1]


def test_flashinfer_store_and_ragged_gather_through_the_oracle():
    ref = oracle()
    rng = np.random.default_rng(SEED)
    nb, bs = 12, 1  # flashinfer runs TGI with BLOCK_SIZE 1
    k0 = rng.standard_normal((nb, bs, H, D)).astype(np.float32)
    v0 = rng.standard_normal((nb, bs, H, D)).astype(np.float32)
    slots = np.array([7, 2, 11, 0, 5], np.int64)
    key = rng.standard_normal((len(slots), H, D)).astype(np.float32)
    value = rng.standard_normal((len(slots), H, D)).astype(np.float32)
    hk, hv = k0.copy(), v0.copy()
    hk.reshape(-1, H, D)[slots] = key  # TGI's store
    hv.reshape(-1, H, D)[slots] = value
    kk, kv = k0.copy(), v0.copy()
    a = tgi.flash_cache(kk, kv)
    res = ref.expected_write(a.write_case(key, value, tgi.slots(slots)))
    assert res.status == Status.OK, res
    a.load(res.arrays)
    np.testing.assert_array_equal(kk, hk)
    np.testing.assert_array_equal(kv, hv)
    # gather the two requests back through block_tables_ragged (one block per token)
    block_tables = np.array([[7, 2, 11], [0, 5, 0]], np.int32)
    input_lengths, cache_lengths = [1, 1], [2, 1]
    ragged = np.concatenate([block_tables[0][:3], block_tables[1][:2]])
    table, lens = tgi.block_tables_ragged(ragged, input_lengths, cache_lengths, 1)
    g = ref.expected_gather(a.gather_case(table, lens, 3))
    assert g.status == Status.OK, g
    out = g.arrays["k"].reshape(2, 3, H, D)
    np.testing.assert_array_equal(out[0], key[[0, 1, 2]])
    np.testing.assert_array_equal(out[1, :2], key[[3, 4]])
    assert (out[1, 2] == -7).all()


def test_paged_write_through_the_oracle():
    ref = oracle()
    rng = np.random.default_rng(SEED + 1)
    nb, bs, x = 4, 16, 8
    k0 = rng.standard_normal((nb, H, D // x, bs, x)).astype(np.float16)
    v0 = rng.standard_normal((nb, H, D, bs)).astype(np.float16)
    slots = np.array([17, 63, 0, 40], np.int64)
    key = rng.standard_normal((len(slots), H, D)).astype(np.float16)
    hk, hv = k0.copy(), v0.copy()
    for i, s in enumerate(slots):  # paged_attention.reshape_and_cache
        b, t = divmod(int(s), bs)
        for h, d in itertools.product(range(H), range(D)):
            hk[b, h, d // x, t, d % x] = key[i, h, d]
            hv[b, h, d, t] = key[i, h, d]
    kk, kv = k0.copy(), v0.copy()
    a = tgi.paged_cache(kk, kv)
    res = ref.expected_write(a.write_case(key, key, tgi.slots(slots)))
    assert res.status == Status.OK, res
    a.load(res.arrays)
    np.testing.assert_array_equal(kk, hk)
    np.testing.assert_array_equal(kv, hv)
