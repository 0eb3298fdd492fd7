"""FlashInfer metadata <-> KVX tables, and FlashInfer's paged cache layouts.

Engine semantics: ``vllm/v1/attention/backends/flashinfer.py`` (indptr = prefix sums
of each request's block count, indices = the used blocks of each row,
last_page_len = ``seq_len % page_size`` with 0 -> ``page_size``) and FlashInfer's
``docs/tutorials/kv_layout.rst`` (``[max_pages, 2, page_size, H, D]`` NHD /
``[max_pages, 2, H, page_size, D]`` HND; token ``t`` of request ``s`` in page
``indices[indptr[s] + t // page_size]`` at ``t % page_size``).

Repro: python -m pytest tests/test_adapters_flashinfer.py -k <name>
"""
from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvx_conformance.abi.descriptors import BlockTable, SeqLens
from kvx_conformance.abi.header import DType, Layout, Status, TableFormat
from kvx_conformance.adapters import AdapterError, flashinfer

PS = 4


def oracle():
    return pytest.importorskip("kvx_conformance.reference_impl", reason="the numpy oracle is not installed")


INDPTR, INDICES, LAST = [0, 2, 3, 3], [5, 1, 7], [3, 4, 4]  # lengths 7, 4, 0


def test_metadata_to_packed_and_ragged():
    t, lens = flashinfer.to_kvx(INDPTR, INDICES, LAST, PS, pad_id=-1)
    assert lens.lengths.tolist() == [7, 4, 0]
    assert (t.format, t.index_dtype, t.max_blocks_per_seq) == (TableFormat.PACKED, DType.S32, 2)
    assert t.indices.reshape(3, 2).tolist() == [[5, 1], [7, -1], [-1, -1]]
    r, lens_r = flashinfer.to_kvx(INDPTR, INDICES, LAST, PS, format=TableFormat.RAGGED)
    assert r.indices.tolist() == [5, 5, 5, 5, 1, 1, 1, 7, 7, 7, 7]
    assert r.indptr.tolist() == [0, 7, 11, 11]
    assert lens_r.lengths.tolist() == [7, 4, 0]
    with pytest.raises(AdapterError, match="KV_OFFSETS"):
        flashinfer.to_kvx(INDPTR, INDICES, LAST, PS, format=TableFormat.KV_OFFSETS)


def test_packed_to_metadata_matches_vllms_builder_by_hand():
    table = np.array([[3, 9, 2], [6, 0, 0], [8, 1, 0]], np.int32)
    seq_lens = np.array([9, 4, 5])
    m = flashinfer.from_packed(BlockTable.packed(table), SeqLens(seq_lens), PS)
    # vLLM: blocks per request = ceil(len / page_size); indices = table[r, :blocks]; last = len % ps or ps
    assert m.indptr.tolist() == [0, 3, 4, 6]
    assert m.indices.tolist() == [3, 9, 2, 6, 8, 1]
    assert m.last_page_len.tolist() == [1, 4, 1]
    assert m.indices.dtype == np.int32 and m.seq_lens().tolist() == [9, 4, 5]


def test_ragged_to_metadata_and_its_refusal():
    r, _ = flashinfer.to_kvx(INDPTR, INDICES, LAST, PS, format=TableFormat.RAGGED)
    m = flashinfer.from_ragged(r, PS)
    assert (m.indptr.tolist(), m.indices.tolist(), m.last_page_len.tolist()) == (INDPTR, INDICES, LAST)
    mixed = BlockTable.ragged([np.array([5, 5, 6, 5])], 1)  # one page, two blocks
    with pytest.raises(AdapterError, match="one block for all of its tokens"):
        flashinfer.from_ragged(mixed, PS)


def test_bad_metadata_is_rejected():
    with pytest.raises(ValueError, match=r"outside \[1, 4\]"):
        flashinfer.to_kvx([0, 1], [3], [0], PS)
    with pytest.raises(ValueError, match="batch \\+ 1"):
        flashinfer.to_kvx([0, 1, 2], [3, 4], [1], PS)
    with pytest.raises(ValueError, match="not decrease"):
        flashinfer.to_kvx([0, 2, 1], [3, 4], [1, 1], PS)


@settings(derandomize=True, database=None, max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 30), min_size=1, max_size=6), st.integers(1, 8), st.randoms(use_true_random=False))
def test_packed_round_trip(lengths, page_size, rnd):
    pages = [-(-n // page_size) for n in lengths]
    width = max(pages)
    ids = list(range(sum(pages)))
    rnd.shuffle(ids)
    table = np.zeros((len(lengths), width), np.int64)
    it = iter(ids)
    for s, p in enumerate(pages):
        table[s, :p] = [next(it) for _ in range(p)]
    m = flashinfer.from_packed(BlockTable.packed(table), SeqLens(np.array(lengths)), page_size)
    back, lens = flashinfer.to_kvx(m.indptr, m.indices, m.last_page_len, page_size)
    assert lens.lengths.tolist() == lengths
    got = back.indices.reshape(back.seq_count, back.max_blocks_per_seq)
    for s, p in enumerate(pages):
        assert got[s, :p].tolist() == table[s, :p].tolist()
    rag, _ = flashinfer.to_kvx(m.indptr, m.indices, m.last_page_len, page_size, format=TableFormat.RAGGED)
    again = flashinfer.from_ragged(rag, page_size)
    assert again.indices.tolist() == m.indices.tolist() and again.last_page_len.tolist() == m.last_page_len.tolist()


@pytest.mark.parametrize("kv_layout", ["NHD", "HND"])
def test_paged_kv_cache_layouts(kv_layout):
    nb, h, d = 3, 2, 4
    if kv_layout == "NHD":
        cache = np.arange(nb * 2 * PS * h * d, dtype=np.float32).reshape(nb, 2, PS, h, d)
        idx = lambda b, kv, t, hh, dd: (b, kv, t, hh, dd)
    else:
        cache = np.arange(nb * 2 * h * PS * d, dtype=np.float32).reshape(nb, 2, h, PS, d)
        idx = lambda b, kv, t, hh, dd: (b, kv, hh, t, dd)
    a = flashinfer.paged_kv_cache(cache, kv_layout=kv_layout)
    assert a.k.layout == (Layout.BLOCK_NHD if kv_layout == "NHD" else Layout.BLOCK_HND)
    assert (a.geometry.num_blocks, a.geometry.block_size, a.geometry.num_kv_heads, a.geometry.head_dim) == (nb, PS, h, d)
    flat = cache.reshape(-1)
    for b, t, hh, dd in itertools.product(range(nb), range(PS), range(h), range(d)):
        assert flat[a.element_offset("k", b, t, hh, dd)] == cache[idx(b, 0, t, hh, dd)]
        assert flat[a.element_offset("v", b, t, hh, dd)] == cache[idx(b, 1, t, hh, dd)]


def test_packed_and_ragged_gathers_read_flashinfer_pages():
    ref = oracle()
    rng = np.random.default_rng(99)
    nb, h, d = 8, 2, 4
    cache = rng.standard_normal((nb, 2, PS, h, d)).astype(np.float32)
    a = flashinfer.paged_kv_cache(cache, kv_layout="NHD")
    max_len = 8
    outs = []
    for fmt in (TableFormat.PACKED, TableFormat.RAGGED):
        table, lens = flashinfer.to_kvx(INDPTR, INDICES, LAST, PS, format=fmt)
        res = ref.expected_gather(a.gather_case(table, lens, max_len))
        assert res.status == Status.OK, (fmt, res)
        outs.append(res.arrays["k"].reshape(3, max_len, h, d))
    np.testing.assert_array_equal(outs[0], outs[1])
    lens = [7, 4, 0]
    for s, t in itertools.product(range(3), range(max_len)):
        if t < lens[s]:
            page = INDICES[INDPTR[s] + t // PS]
            np.testing.assert_array_equal(outs[0][s, t], cache[page, 0, t % PS])
        else:
            assert (outs[0][s, t] == -7).all()
