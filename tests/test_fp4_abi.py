"""KVX 1.2 negotiation: a v1.1 build of the reference handed 1.2 structs, and the 1.2 build handed v1.1 ones.

``libkvx_reference_v1_1.so`` is the reference compiled against the header's v1.1
build (``KVX_ABI_TARGET_MINOR=1``): it reports ABI 1.1 and knows no FP4. The readings
(size guards, FP4 extension): a larger top-level ``size`` with a zero tail is accepted,
a non-zero tail is UNSUPPORTED, and nothing is written then.
"""
from __future__ import annotations

import ctypes

import numpy as np
import pytest

from kvx_conformance.abi import header as abi, native
from kvx_conformance.abi.header import DType, Fp4Format, Layout, Memory, Status, TableFormat
from kvx_conformance.abi.loader import load_provider
from kvx_conformance.cases import fp4 as fx

H, D, BS, NB = 2, 32, 4, 6


@pytest.fixture(scope="module")
def v11():
    return load_provider(native.reference_provider_v1_1())


@pytest.fixture(scope="module")
def v12():
    return load_provider(native.reference_provider())


def _f16_call(provider, kind: str, struct_minor: int, cache_size: int | None = None, cache_tail: bytes = b""):
    """F16 NHD write (or gather) with v1.1 or 1.2 structs; returns (status, result array, violations)."""
    rng = np.random.default_rng(5)
    arena = fx._Arena(Memory.HOST)
    shape = (NB, BS, H, D)
    init = rng.standard_normal(shape).astype(np.float16)
    cls_c = abi.kvx_cache_desc_v1_2_t if struct_minor == 2 else abi.kvx_cache_desc_t
    c = cls_c.new(num_blocks=NB, block_size=BS, num_kv_heads=H, head_dim=D)
    c.k = fx._tensor(DType.F16, Layout.BLOCK_NHD, Memory.HOST, shape, fx._dense_strides(shape), arena.put("k", init))
    c.v = fx._tensor(DType.F16, Layout.BLOCK_NHD, Memory.HOST, shape, fx._dense_strides(shape), arena.put("v", init))
    c.pool = abi.kvx_pool_desc_t.new()
    if cache_size is not None:
        c.size = cache_size
    if cache_tail:
        ctypes.memmove(ctypes.addressof(c) + abi.V1_1_SIZES["kvx_cache_desc_t"], cache_tail, len(cache_tail))
    n = 5
    x = rng.standard_normal((n, H, D)).astype(np.float16)
    if kind == "write":
        d = (abi.kvx_write_desc_v1_2_t if struct_minor == 2 else abi.kvx_write_desc_t).new()
        d.io = fx._io(DType.F16, Memory.HOST, arena.put("key", x), arena.put("value", x), n, H, D)
        d.slots = abi.kvx_slot_mapping_t.new(dtype=int(DType.S64), token_count=n, invalid_slot=-1)
        slots = np.array([3, 22, 0, 9, 17], np.int64)
        d.slots.slots = arena.put("slots", slots)
        d.k_scale_desc = abi.kvx_scale_desc_t.new()
        d.v_scale_desc = abi.kvx_scale_desc_t.new()
        st = provider.write_kv(c, d, None)
        want = init.copy()
        for i, s in enumerate(slots):
            want[s // BS, s % BS] = x[i]
        return st, arena.get("k", init), want, arena.violations()
    d = (abi.kvx_gather_desc_v1_2_t if struct_minor == 2 else abi.kvx_gather_desc_t).new(max_seq_len=6)
    out = np.zeros((6, H, D), np.float16)
    d.io = fx._io(DType.F16, Memory.HOST, arena.put("ok", out), arena.put("ov", out), 6, H, D)
    d.block_table = abi.kvx_block_table_t.new(format=int(TableFormat.PACKED), index_dtype=int(DType.S32), seq_count=1,
                                              beam_width=1, max_blocks_per_seq=2, indices_count=2)
    d.block_table.indices = arena.put("idx", np.array([4, 1], np.int32))
    d.seq_lens = abi.kvx_seq_lens_t.new(dtype=int(DType.S32), seq_count=1)
    d.seq_lens.lengths = arena.put("lens", np.array([6], np.int32))
    st = provider.gather_kv(c, d, None)
    want = np.concatenate([init[4], init[1][:2]])
    return st, arena.get("ok", out), want, arena.violations()


def test_versions(v11, v12):
    assert (v11.version().major, v11.version().minor) == (1, 1)
    assert (v12.version().major, v12.version().minor) == (1, 2)
    assert fx.provider_minor(v11) == 1 and fx.provider_minor(v12) == 2


@pytest.mark.parametrize("kind", ["write", "gather"])
@pytest.mark.parametrize("minor", [1, 2], ids=["v1_1_structs", "v1_2_structs"])
@pytest.mark.parametrize("which", ["v11", "v12"])
def test_f16_cache_works_with_either_struct_version(request, which, minor, kind):
    provider = request.getfixturevalue(which)
    st, got, want, viol = _f16_call(provider, kind, minor)
    assert st == Status.OK, f"{which} provider, {kind} with v1.{minor} structs: status {Status(st).name}"
    assert not viol and np.array_equal(got.view(np.uint16), want.view(np.uint16))


def test_v11_provider_refuses_fp4_cache_cleanly(v11):
    """A v1.1 provider handed a 1.2 FP4 cache: UNSUPPORTED (non-zero unknown tail), nothing written."""
    cache = fx.new_cache(Fp4Format.NVFP4, NB, BS, H, D, k_global=0.01)
    x = np.ones((2, H, D), np.float32)
    res = fx.run_write(v11, cache, x, x, [1, 7])
    assert res.status == Status.UNSUPPORTED and not res.violations
    assert np.array_equal(res.cache.k_codes, cache.k_codes) and np.array_equal(res.cache.k_scales, cache.k_scales)
    g = fx.run_gather(v11, cache, np.array([[0, 1]]), [5], 5, DType.F16)
    assert g.status == Status.UNSUPPORTED and not g.violations
    assert np.array_equal(g.out["k"].view(np.uint8), fx.out_init(cache, 5, DType.F16)["k"].view(np.uint8))


def test_v12_provider_needs_the_extension_for_fp4(v12):
    """F4_E2M1 in a v1.1-sized cache (no scale pool) is INVALID_ARGUMENT."""
    cache = fx.new_cache(Fp4Format.MXFP4, NB, BS, H, D)
    x = np.ones((1, H, D), np.float32)
    res = fx.run_write(v12, cache, x, x, [0], cache_size=abi.V1_1_SIZES["kvx_cache_desc_t"])
    assert res.status == Status.INVALID_ARGUMENT and not res.violations
    assert np.array_equal(res.cache.k_codes, cache.k_codes)


@pytest.mark.parametrize("tail,expect", [(b"", Status.OK), (b"\x00" * 8, Status.OK), (b"\x01", Status.UNSUPPORTED)],
                         ids=["exact_v11", "zero_partial_tail", "nonzero_partial_tail"])
def test_v12_provider_partial_tail(v12, tail, expect):
    """A size between the v1.1 and 1.2 sizeof: the part beyond v1.1 is unknown, accepted only when zero."""
    size = abi.V1_1_SIZES["kvx_cache_desc_t"] + len(tail)
    st, got, want, viol = _f16_call(v12, "write", 2, cache_size=size, cache_tail=tail)
    assert st == expect and not viol
