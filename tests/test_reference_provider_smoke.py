"""Smoke test of the bundled C++ reference provider (libkvx_reference.so) on host memory.

A write followed by a PACKED gather round-trips on a tiny cache for every cache layout
(NHD, HND, HND_PACKED, CUSTOM, padded and transposed strides) and every cache dtype,
checked element by element against numpy / ml_dtypes (readings R-CACHE, R-CONVERT,
R-FP8). The conformance suites test the provider in depth; this file only proves that
the library built here loads and moves bytes. Point ``KVX_CONFORM_NATIVE_DIR`` at a
build tree's ``native/`` folder to test that build.
"""
from __future__ import annotations

import ctypes

import ml_dtypes
import numpy as np
import pytest

from kvx_conformance.abi import header as abi, native
from kvx_conformance.abi.descriptors import (
    BlockTable,
    Geometry,
    IOLayout,
    SeqLens,
    SlotMapping,
    TensorLayout,
    cache_layout,
    to_c_cache,
    to_c_io,
    to_c_scale,
    to_c_seq_lens,
    to_c_slots,
    to_c_table,
)
from kvx_conformance.abi.dtypes import bits_view, np_dtype
from kvx_conformance.abi.header import DType, Layout, Memory, Status

GEOM = Geometry(num_blocks=3, block_size=4, num_kv_heads=2, head_dim=4)
SEED = 20240611
FP8_MAX = {DType.F8_E4M3: 448.0, DType.F8_E5M2: 57344.0}


@pytest.fixture(scope="module")
def lib() -> ctypes.CDLL:
    path = native.reference_provider()
    assert path.exists(), f"reference provider not built: {path} (set KVX_CONFORM_NATIVE_DIR)"
    so = ctypes.CDLL(str(path))
    so.kvx_get_version.argtypes = [ctypes.POINTER(abi.kvx_version_t)]
    so.kvx_write_kv.argtypes = [ctypes.POINTER(abi.kvx_cache_desc_t), ctypes.POINTER(abi.kvx_write_desc_t),
                                ctypes.c_void_p]
    so.kvx_gather_kv.argtypes = [ctypes.POINTER(abi.kvx_cache_desc_t), ctypes.POINTER(abi.kvx_gather_desc_t),
                                 ctypes.c_void_p]
    for f in (so.kvx_get_version, so.kvx_write_kv, so.kvx_gather_kv):
        f.restype = ctypes.c_int
    return so


def ptr(a: np.ndarray) -> int:
    return a.ctypes.data


def logical_offsets(t: TensorLayout, g: Geometry) -> np.ndarray:
    """Element offset of (block, token, head, dim), shape [nb, bs, H, D] (R-CACHE)."""
    b, tok, h, d = np.meshgrid(*(np.arange(n) for n in (g.num_blocks, g.block_size, g.num_kv_heads, g.head_dim)),
                               indexing="ij")
    s = t.stride
    if t.layout in (Layout.BLOCK_NHD, Layout.BLOCK_CUSTOM):
        return b * s[0] + tok * s[1] + h * s[2] + d * s[3]
    if t.layout == Layout.BLOCK_HND:
        return b * s[0] + h * s[1] + tok * s[2] + d * s[3]
    pack = t.shape[4]
    return b * s[0] + h * s[1] + (d // pack) * s[2] + tok * s[3] + (d % pack) * s[4]


def cache_layouts(dtype: DType) -> dict[str, TensorLayout]:
    g = GEOM
    custom = cache_layout(g, Layout.BLOCK_CUSTOM, dtype, order=(0, 2, 1, 3))  # HND memory, logical shape
    return {
        "nhd": cache_layout(g, Layout.BLOCK_NHD, dtype),
        "hnd": cache_layout(g, Layout.BLOCK_HND, dtype),
        "hnd_packed": cache_layout(g, Layout.BLOCK_HND_PACKED, dtype, pack=2),
        "custom": custom,
        "nhd_padded": cache_layout(g, Layout.BLOCK_NHD, dtype, pad=3),
        "vllm_v": cache_layout(g, Layout.BLOCK_HND, dtype, order=(0, 1, 3, 2)),
    }


def expected_cache_values(x: np.ndarray, cache_dtype: DType, scale: float) -> np.ndarray:
    """IO values (FP32) as stored in the cache: RNE cast, FP8 quantized (R-CONVERT, R-FP8)."""
    if cache_dtype in FP8_MAX:
        m = np.float32(FP8_MAX[cache_dtype])
        return np.clip(x / np.float32(scale), -m, m).astype(np_dtype(cache_dtype))
    return x.astype(np_dtype(cache_dtype))


@pytest.mark.parametrize("dtype", [DType.F16, DType.BF16, DType.F32, DType.F8_E4M3, DType.F8_E5M2],
                         ids=lambda d: d.name)
@pytest.mark.parametrize("layout_name", list(cache_layouts(DType.F16)))
def test_write_then_gather_round_trips(lib, layout_name: str, dtype: DType) -> None:
    g, rng = GEOM, np.random.default_rng(SEED)
    k_lay = cache_layouts(dtype)[layout_name]
    v_lay = cache_layouts(dtype)["nhd"]  # K and V may differ in layout (R-CACHE)
    k_store = np.zeros(k_lay.span_elements(), np_dtype(dtype))
    v_store = np.zeros(v_lay.span_elements(), np_dtype(dtype))
    cache = to_c_cache(g, k_lay, ptr(k_store), v_lay, ptr(v_store), Memory.HOST)

    # Write 6 tokens, one of them padding (-1), as FP32 IO.
    slots = np.array([5, -1, 0, 11, 7, 2], np.int64)
    n_tok, H, D = len(slots), g.num_kv_heads, g.head_dim
    key = (rng.standard_normal((n_tok, H, D)) * 3).astype(np.float32)
    value = (rng.standard_normal((n_tok, H, D)) * 3).astype(np.float32)
    io_lay = IOLayout.dense(DType.F32, n_tok, H, D)
    w = abi.kvx_write_desc_t.new()
    w.io = to_c_io(io_lay, ptr(key), io_lay, ptr(value), Memory.HOST, n_tok, H, D)
    slot_map = SlotMapping(slots, DType.S64)
    slot_buf = slot_map.encoded()
    w.slots = to_c_slots(slot_map, ptr(slot_buf))
    k_scale = np.array([0.5], np.float32)
    w.k_scale = ptr(k_scale)  # per-tensor fallback (spec 7), used by FP8 caches only
    w.k_scale_desc, w.v_scale_desc = to_c_scale(None, 0), to_c_scale(None, 0)
    assert lib.kvx_write_kv(ctypes.byref(cache), ctypes.byref(w), None) == Status.OK

    k_off, v_off = logical_offsets(k_lay, g), logical_offsets(v_lay, g)
    want_k = np.zeros_like(k_store)
    want_v = np.zeros_like(v_store)
    for i, s in enumerate(slots):
        if s < 0:
            continue
        b, t = divmod(int(s), g.block_size)
        want_k[k_off[b, t]] = expected_cache_values(key[i], dtype, 0.5)
        want_v[v_off[b, t]] = expected_cache_values(value[i], dtype, 1.0)
    np.testing.assert_array_equal(bits_view(k_store), bits_view(want_k), err_msg=f"K cache, seed {SEED}")
    np.testing.assert_array_equal(bits_view(v_store), bits_view(want_v), err_msg=f"V cache, seed {SEED}")

    # Gather 2 sequences through a PACKED table into IO of the cache dtype (FP8: raw bytes),
    # F32 otherwise; padded rows (t >= len) must stay untouched.
    table = BlockTable.packed(np.array([[1, 0, 2], [2, 1, 0]]), DType.S32)
    lens = SeqLens(np.array([6, 3]), DType.S64)
    max_seq_len = 5
    out_dtype = dtype if dtype in FP8_MAX else DType.F32
    rows = table.seq_count * max_seq_len
    out_lay = IOLayout.padded4d(out_dtype, table.seq_count, max_seq_len, H, D)
    poison = np.full((rows, H, D), 0x5A, np.uint8 if out_dtype in FP8_MAX else np.uint32)
    out_k, out_v = poison.copy().view(np_dtype(out_dtype)), poison.copy().view(np_dtype(out_dtype))
    gd = abi.kvx_gather_desc_t.new(max_seq_len=max_seq_len)
    gd.io = to_c_io(out_lay, ptr(out_k), out_lay, ptr(out_v), Memory.HOST, rows, H, D)
    idx, lens_buf = table.encoded_indices(), lens.encoded()
    gd.block_table = to_c_table(table, ptr(idx), 0)
    gd.seq_lens = to_c_seq_lens(lens, ptr(lens_buf))
    assert lib.kvx_gather_kv(ctypes.byref(cache), ctypes.byref(gd), None) == Status.OK

    want_out_k, want_out_v = poison.copy().view(np_dtype(out_dtype)), poison.copy().view(np_dtype(out_dtype))
    for s in range(table.seq_count):
        for t in range(min(int(lens.lengths[s]), max_seq_len)):
            b = int(table.indices[s * table.max_blocks_per_seq + t // g.block_size])
            r = s * max_seq_len + t
            want_out_k[r] = k_store[k_off[b, t % g.block_size]].astype(np_dtype(out_dtype))
            want_out_v[r] = v_store[v_off[b, t % g.block_size]].astype(np_dtype(out_dtype))
    np.testing.assert_array_equal(bits_view(out_k), bits_view(want_out_k), err_msg=f"gathered K, seed {SEED}")
    np.testing.assert_array_equal(bits_view(out_v), bits_view(want_out_v), err_msg=f"gathered V, seed {SEED}")


def test_get_version_reports_1_1_0(lib) -> None:
    """The reference speaks KVX 1.2 (the FP4 extension; its v1.1 build reports 1.1.0:
    tests/test_fp4_abi.py); the version struct itself is the v1.1 one."""
    v = abi.kvx_version_t.new()
    assert lib.kvx_get_version(ctypes.byref(v)) == Status.OK
    assert (v.size, v.abi_major, v.abi_minor, v.abi_patch) == (16, 1, 2, 0)
    small = abi.kvx_version_t(size=12)
    assert lib.kvx_get_version(ctypes.byref(small)) == Status.INVALID_ARGUMENT
    assert (small.size, small.abi_major) == (12, 0), "nothing written on INVALID_ARGUMENT (R-SIZE)"
    assert lib.kvx_get_version(None) == Status.INVALID_ARGUMENT

