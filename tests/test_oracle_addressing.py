"""Oracle addressing against offsets computed by hand (spec 4.2; readings R-CACHE, R-GATHER).

Every expected number below is worked out in the comment next to it from the spec's
stride formulas, not computed by the code under test.
"""
from __future__ import annotations

import numpy as np
import pytest

from kvx_conformance.abi.descriptors import Geometry, cache_layout
from kvx_conformance.abi.header import DType, Layout
from kvx_conformance.reference_impl.addressing import cache_offsets, farthest_offset, io_offsets, pool_offsets

G = Geometry(num_blocks=3, block_size=4, num_kv_heads=2, head_dim=8)


@pytest.mark.parametrize(
    "layout, pack, pad, order, strides, elem, offset",
    [
        # NHD [3, 4, 2, 8]: s = (4*2*8, 2*8, 8, 1) = (64, 16, 8, 1); (1,2,1,6) -> 64+32+8+6
        (Layout.BLOCK_NHD, None, 0, None, (64, 16, 8, 1), (1, 2, 1, 6), 110),
        # HND [3, 2, 4, 8]: s = (2*4*8, 4*8, 8, 1) = (64, 32, 8, 1); (b,t,h,d)=(1,2,1,6) -> 64+32+16+6
        (Layout.BLOCK_HND, None, 0, None, (64, 32, 8, 1), (1, 2, 1, 6), 118),
        # HND_PACKED pack 4 [3, 2, 2, 4, 4]: s = (64, 32, 16, 4, 1);
        # (1,2,1,6) -> 64 + 1*32 + (6//4)*16 + 2*4 + (6%4)*1 = 64+32+16+8+2
        (Layout.BLOCK_HND_PACKED, 4, 0, None, (64, 32, 16, 4, 1), (1, 2, 1, 6), 122),
        # HND_PACKED pack 1 (= HND with an extra unit dim): s = (64, 32, 4, 1, 1); (1,2,1,6) -> 64+32+24+2
        (Layout.BLOCK_HND_PACKED, 1, 0, None, (64, 32, 4, 1, 1), (1, 2, 1, 6), 122),
        # NHD with 3 padding elements after each row of D: s3=1, s2=11, s1=22, s0=88; (1,2,1,6) -> 88+44+11+6
        (Layout.BLOCK_NHD, None, 3, None, (88, 22, 11, 1), (1, 2, 1, 6), 149),
        # vLLM V cache [blocks, H, D, block_size] described as HND (order 0,1,3,2):
        # token stride 1, dim stride 4, head stride 8*4=32, block stride 64; (2,3,0,5) -> 128+3+20
        (Layout.BLOCK_HND, None, 0, (0, 1, 3, 2), (64, 32, 1, 4), (2, 3, 0, 5), 151),
        # CUSTOM in logical order [nb, bs, H, D], stored [H, D, nb, bs]: s_t=1, s_b=4, s_d=12, s_h=96;
        # (2,3,1,5) -> 2*4 + 3*1 + 1*96 + 5*12 = 8+3+96+60
        (Layout.BLOCK_CUSTOM, None, 0, (2, 3, 0, 1), (4, 1, 96, 12), (2, 3, 1, 5), 167),
    ],
)
def test_cache_offsets_by_hand(layout, pack, pad, order, strides, elem, offset):
    t = cache_layout(G, layout, DType.F16, pack=pack, pad=pad, order=order)
    assert t.stride == strides, f"strides of {layout.name} pad={pad} order={order}"
    p = t.shape[4] if layout == Layout.BLOCK_HND_PACKED else 1
    assert int(cache_offsets(layout, t.stride, p, *elem)) == offset


def test_cache_offsets_cover_every_element_once():
    """Canonical layouts are bijections onto [0, nb*bs*H*D) (spec 4.2 contiguous strides)."""
    b, t, h, d = np.meshgrid(*(np.arange(n) for n in (3, 4, 2, 8)), indexing="ij")
    for layout, pack in ((Layout.BLOCK_NHD, None), (Layout.BLOCK_HND, None), (Layout.BLOCK_HND_PACKED, 2),
                         (Layout.BLOCK_HND_PACKED, 8)):
        lay = cache_layout(G, layout, DType.F32, pack=pack)
        off = cache_offsets(layout, lay.stride, pack or 1, b, t, h, d)
        assert sorted(off.reshape(-1).tolist()) == list(range(3 * 4 * 2 * 8)), layout.name


def test_io_offsets_3d_and_4d_by_hand():
    # dense [5, 2, 3]: strides (6, 3, 1); (row 4, h 1, d 2) -> 24+3+2
    assert int(io_offsets((5, 2, 3), (6, 3, 1), 4, 1, 2)) == 29
    # 4-D [2 groups, 3 max_seq_len, 2, 4] with padded strides (30, 9, 4, 1):
    # row 4 = (group 1, t 1); (h 1, d 3) -> 30 + 9 + 4 + 3
    assert int(io_offsets((2, 3, 2, 4), (30, 9, 4, 1), 4, 1, 3)) == 46
    # row 2 = (group 0, t 2) -> 18 + 0 + 0
    assert int(io_offsets((2, 3, 2, 4), (30, 9, 4, 1), 2, 0, 0)) == 18


def test_pool_offsets_by_hand():
    # KV_OFFSETS block = HND [H=2, bs=4, D=8] contiguous: 64 elements per block.
    # (block 3, t 2, h 1, d 5) -> 3*64 + 1*32 + 2*8 + 5
    assert int(pool_offsets(3, 2, 1, 5, num_kv_heads=2, block_size=4, head_dim=8)) == 245


def test_farthest_offset_is_exact():
    assert farthest_offset((3, 4), (10, 1)) == 23
    assert farthest_offset((3, 0), (10, 1)) == 0
    # (3-1) * 2**62 = 2**63 > INT64_MAX: exact Python ints, no wraparound
    assert farthest_offset((3, 1), (1 << 62, 1)) == 1 << 63
    assert farthest_offset((2, 2), (-5, 1)) == 6
