"""ppl.nn dynamic_batching.KeyValueCache adapter: the four cache layouts, both cache modes,
num_repeat, and oracle round trips.

Engine semantics: seed 001 (ppl.nn ``docs/ops/pmx/dynamic_batching/KeyValueCache.md``):
``cache_layout`` 0 ``(MaxT, L, 2, H, Dh)``, 1 ``(L, MaxT, 2, H, Dh)``, 2 ``(L, 2, MaxT, H,
Dh)``, 3 ``(L, 2, H, MaxT, Dh)``; ``cachestarts[b]`` (mode 0) or ``cachestarts[b, p]``
(mode 1, pages of ``page_size`` rows); new tokens at positions ``start_pos[b] + i``.

Repro: python -m pytest tests/test_adapters_ppl.py -k <name>
"""
from __future__ import annotations

import itertools

import numpy as np
import pytest

from kvx_conformance.abi.header import DType, Layout, Status, TableFormat
from kvx_conformance.adapters import AdapterError, ppl

MAXT, NL, H, DH = 16, 3, 2, 4
SHAPES = {
    0: (MAXT, NL, 2, H, DH),
    1: (NL, MAXT, 2, H, DH),
    2: (NL, 2, MAXT, H, DH),
    3: (NL, 2, H, MAXT, DH),
}


def oracle():
    return pytest.importorskip("kvx_conformance.reference_impl", reason="the numpy oracle is not installed")


def index(layout, row, layer, kv, h, d):
    """The ``cache`` index of (row, layer, K/V, head, dim) for each cache_layout."""
    return {
        0: (row, layer, kv, h, d),
        1: (layer, row, kv, h, d),
        2: (layer, kv, row, h, d),
        3: (layer, kv, h, row, d),
    }[layout]


def hand_offset(layout, row, layer, kv, h, d):
    """Row-major element offset in each cache_layout, written out."""
    return {
        0: (((row * NL + layer) * 2 + kv) * H + h) * DH + d,
        1: (((layer * MAXT + row) * 2 + kv) * H + h) * DH + d,
        2: (((layer * 2 + kv) * MAXT + row) * H + h) * DH + d,
        3: (((layer * 2 + kv) * H + h) * MAXT + row) * DH + d,
    }[layout]


@pytest.mark.parametrize("layout", range(4))
def test_layer_views_of_every_cache_layout(layout):
    cache = np.arange(np.prod(SHAPES[layout]), dtype=np.float32).reshape(SHAPES[layout])
    layer, bs = 1, 4
    a = ppl.key_value_cache(cache, num_layer=NL, layer_idx=layer, cache_layout=layout, cache_mode=1, page_size=8, block_size=bs)
    assert a.k.layout == (Layout.BLOCK_HND if layout == 3 else Layout.BLOCK_NHD)
    assert (a.geometry.num_blocks, a.geometry.block_size) == (MAXT // bs, bs)
    flat = cache.reshape(-1)
    for row, h, d in itertools.product(range(MAXT), range(H), range(DH)):
        b, t = divmod(row, bs)
        for kv, kind in ((0, "k"), (1, "v")):
            off = a.element_offset(kind, b, t, h, d)
            assert off == hand_offset(layout, row, layer, kv, h, d), (layout, row, kind)
            assert flat[off] == cache[index(layout, row, layer, kv, h, d)]


def test_refusals_and_checks():
    cache = np.zeros(SHAPES[0], np.float16)
    with pytest.raises(AdapterError, match="no int8/int4 cache dtype"):
        ppl.key_value_cache(cache, num_layer=NL, layer_idx=0, quant_bit=8)
    with pytest.raises(AdapterError, match="whole number of KVX blocks"):
        ppl.key_value_cache(cache, num_layer=NL, layer_idx=0, cache_mode=1, page_size=8, block_size=3)
    with pytest.raises(AdapterError, match="not a KVX cache dtype"):
        ppl.key_value_cache(cache.astype(np.int8), num_layer=NL, layer_idx=0)
    with pytest.raises(ValueError, match="not cache_layout 1"):
        ppl.key_value_cache(cache, num_layer=NL, layer_idx=0, cache_layout=1)
    odd = ppl.key_value_cache(np.zeros((13, NL, 2, H, DH), np.float16), num_layer=NL, layer_idx=2, block_size=4)
    assert odd.geometry.num_blocks == 3 and "rows >= 12 unaddressable" in odd.notes[0]


def test_write_slots_in_both_modes_by_hand():
    seqstarts, start_pos = [0, 3, 5], [2, 6]
    # mode 0: row = cachestarts[b] + start_pos[b] + i
    s0 = ppl.write_slots([1, 9], seqstarts, start_pos, cache_mode=0)
    assert s0.slots.tolist() == [3, 4, 5, 15, 16]
    # mode 1: row = cachestarts[b, p // page] + p % page
    cs = np.array([[8, 0, 4], [12, 20, 16]])
    s1 = ppl.write_slots(cs, seqstarts, start_pos, cache_mode=1, page_size=4)
    assert s1.slots.tolist() == [10, 11, 0, 22, 23]
    assert s1.dtype == DType.S64
    from kvx_conformance.abi.descriptors import Geometry

    with pytest.raises(AdapterError, match="past the 20 rows"):
        ppl.write_slots(cs, seqstarts, start_pos, cache_mode=1, page_size=4, geometry=Geometry(5, 4, H, DH))


def test_gather_tables_by_hand_and_off_grid_starts():
    kvstarts = [0, 7, 10]
    t, lens = ppl.gather_table(np.array([[8, 0], [12, 4]]), kvstarts, cache_mode=1, page_size=4, block_size=2)
    assert lens.lengths.tolist() == [7, 3]
    assert (t.format, t.max_blocks_per_seq) == (TableFormat.PACKED, 4)
    assert t.indices.reshape(2, 4).tolist() == [[4, 5, 0, 1], [6, 7, 0, 0]]
    t0, _ = ppl.gather_table([4, 12], kvstarts, cache_mode=0, block_size=4)
    assert t0.indices.reshape(2, 2).tolist() == [[1, 2], [3, 0]]
    with pytest.raises(AdapterError, match="cache row 5.*not a multiple of the KVX block_size 4"):
        ppl.gather_table([5, 12], kvstarts, cache_mode=0, block_size=4)
    t1, _ = ppl.gather_table([5, 12], kvstarts, cache_mode=0, block_size=1)  # block_size 1 always fits
    assert t1.indices.reshape(2, 7)[0].tolist() == [5, 6, 7, 8, 9, 10, 11]


def test_repeat_output_views_address_the_repeated_heads():
    T, R = 3, 2
    views = ppl.repeat_output_views(T, H, DH, R, DType.F32)
    out = np.arange(T * H * R * DH).reshape(T, H * R, DH)
    for r, (layout, base) in enumerate(views):
        for row, h, d in itertools.product(range(T), range(H), range(DH)):
            off = base + row * layout.stride[0] + h * layout.stride[1] + d * layout.stride[2]
            assert out.reshape(-1)[off] == out[row, h * R + r, d]
    g = np.arange(T * H * DH).reshape(T, H, DH)
    rep = ppl.repeat_heads(g, R)
    assert rep.shape == (T, H * R, DH) and (rep[:, 1] == g[:, 0]).all() and (rep[:, 2] == g[:, 1]).all()


def _ppl_write(cache, layout, layer, rows, key, value):
    """ppl.nn's KeyValueCache store: key/value of token i into row rows[i] of the layer."""
    for i, row in enumerate(rows):
        for h, d in itertools.product(range(H), range(DH)):
            cache[index(layout, row, layer, 0, h, d)] = key[i, h, d]
            cache[index(layout, row, layer, 1, h, d)] = value[i, h, d]


@pytest.mark.parametrize("layout, mode", [(0, 0), (3, 1), (1, 1), (2, 0)])
def test_write_and_gather_through_the_oracle(layout, mode):
    ref = oracle()
    rng = np.random.default_rng(1000 + 10 * layout + mode)
    cache0 = rng.standard_normal(SHAPES[layout]).astype(np.float32)
    layer, page = 2, 4
    if mode == 0:
        cachestarts, bs = np.array([8, 0]), 4
    else:
        cachestarts, bs = np.array([[12, 4, 0], [8, 0, 0]]), page
    seqstarts, start_pos, kvstarts = [0, 3, 5], [5, 1], [0, 8, 11]
    key = rng.standard_normal((5, H, DH)).astype(np.float32)
    value = rng.standard_normal((5, H, DH)).astype(np.float32)
    slots = ppl.write_slots(cachestarts, seqstarts, start_pos, cache_mode=mode, page_size=page)
    hand = cache0.copy()
    _ppl_write(hand, layout, layer, slots.slots, key, value)
    mine = cache0.copy()
    a = ppl.key_value_cache(mine, num_layer=NL, layer_idx=layer, cache_layout=layout, cache_mode=mode, page_size=page, block_size=bs)
    res = ref.expected_write(a.write_case(key, value, slots))
    assert res.status == Status.OK, res
    a.load(res.arrays)
    np.testing.assert_array_equal(mine, hand)  # other layers and rows untouched too
    # gather every cached token back (ppl.nn's `key` output, padded per batch entry)
    table, lens = ppl.gather_table(cachestarts, kvstarts, cache_mode=mode, block_size=bs, page_size=page)
    max_len = 8
    g = ref.expected_gather(a.gather_case(table, lens, max_len))
    assert g.status == Status.OK, g
    out_k = g.arrays["k"].reshape(2, max_len, H, DH)
    out_v = g.arrays["v"].reshape(2, max_len, H, DH)
    for b, n in enumerate(lens.lengths):
        rows = ppl.cache_rows(cachestarts, np.arange(n), np.full(n, b), mode, page)
        for t, row in enumerate(rows):
            for h, d in itertools.product(range(H), range(DH)):
                assert out_k[b, t, h, d] == mine[index(layout, row, layer, 0, h, d)]
                assert out_v[b, t, h, d] == mine[index(layout, row, layer, 1, h, d)]


def test_num_repeat_gathers_land_in_the_repeated_output():
    ref = oracle()
    rng = np.random.default_rng(5)
    cache = rng.standard_normal(SHAPES[2]).astype(np.float32)
    a = ppl.key_value_cache(cache, num_layer=NL, layer_idx=0, cache_layout=2, cache_mode=0, block_size=4)
    table, lens = ppl.gather_table([4], [0, 6], cache_mode=0, block_size=4)
    R, T = 2, 6
    out = np.zeros((T, H * R, DH), np.float32)
    flat = out.reshape(-1)
    for layout, base in ppl.repeat_output_views(T, H, DH, R, DType.F32):
        case = a.gather_case(table, lens, T)
        span = layout.span_elements()
        case.out_layout, case.out_k_init, case.out_v_init = layout, flat[base: base + span].copy(), flat[base: base + span].copy()
        g = ref.expected_gather(case)
        if g.status == Status.UNSUPPORTED:
            pytest.fail("the oracle refused strided IO; R-IO says non-dense IO strides give a correct result")
        assert g.status == Status.OK, g
        flat[base: base + span] = g.arrays["k"]
    dense = ref.expected_gather(a.gather_case(table, lens, T))
    np.testing.assert_array_equal(out, ppl.repeat_heads(dense.arrays["k"].reshape(T, H, DH), R))
