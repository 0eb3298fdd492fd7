"""Spec 4.2, 5, 6, 7.1 (R-CACHE, R-IO, R-WRITE, R-GATHER, R-DATA): descriptor validation.

Two kinds of tests:

- explicit ones, named after the rule they break (every 7.1 rule, spec 9's "layout
  shape/stride validation for NHD/HND/HND_PACKED" and "block table counts and indptr
  validation"), each a single-field violation of an otherwise valid call;
- ``validation.rule[<rule id>]``: one single-violation case per rule of the oracle
  engineer's catalog (``kvx_conformance.cases.generators.RULES``), built by its generator
  from a fixed seed, and drawn again from that seed in the layouts the provider serves where
  the first draw used one it does not (``_in_served_layouts``).

Every test holds the provider's status to the oracle's, and (write, gather) checks that
a refused call wrote nothing and touched no guard byte.
"""
from __future__ import annotations

import zlib

import pytest

from kvx_conformance.abi.descriptors import Geometry
from kvx_conformance.abi.header import DTYPE_SIZE, DType, Layout, Memory, Status
from kvx_conformance.cases import build as cb
from kvx_conformance.cases.checks import (
    ENTRY_OF,
    partial_gather,
    partial_write,
    verify_gather,
    verify_validate,
    verify_write,
)
from kvx_conformance.results.outcomes import INFORMATIONAL, RECOMMENDED, REQUIRED, conformance

G = cb.GEOM
INVALID, UNSUPPORTED, OK = Status.INVALID_ARGUMENT, Status.UNSUPPORTED, Status.OK
CL_71 = "spec 7.1"
CL_SHAPE = "spec 4.2, 7.1 (shape MUST agree with the cache descriptor); R-CACHE"

LAYOUT_FEATURE = {"nhd": "nhd", "hnd": "hnd", "hnd_packed": "hnd_packed", "custom": "custom_layout"}


def _vcase(kind="nhd", dtype=DType.F16, overrides=None, geom=G, label="", **kw):
    return cb.validate_case(cb.simple_cache(geom, kind, dtype, seed=1, **kw), label=label, overrides=overrides)


# ---------------------------------------------------------------------------- valid descriptors

DTYPES = pytest.mark.parametrize("dtype", [DType.F16, DType.BF16, DType.F32], ids=["f16", "bf16", "f32"])
CL_VALID = "spec 4.2, 7 (a valid descriptor validates)"


def _valid(provider, opts, kind, dtype, **kw):
    verify_validate(provider, _vcase(kind, dtype, label=f"valid {kind} {kw or ''}", **kw), opts,
                    clause=CL_VALID, feature=LAYOUT_FEATURE[kind], expect=OK)


@conformance("validate.valid.nhd", CL_VALID, REQUIRED, "core", "validate", feature="nhd")
@DTYPES
def test_valid_nhd(kvx_provider, kvx_call_options, dtype):
    _valid(kvx_provider, kvx_call_options(), "nhd", dtype)


@conformance("validate.valid.hnd", CL_VALID, REQUIRED, "core", "validate", feature="hnd")
@DTYPES
def test_valid_hnd(kvx_provider, kvx_call_options, dtype):
    _valid(kvx_provider, kvx_call_options(), "hnd", dtype)


@conformance("validate.valid.hnd_packed", CL_VALID, REQUIRED, "layouts", "validate", feature="hnd_packed")
@pytest.mark.parametrize("pack", [1, 2, 8])
@DTYPES
def test_valid_hnd_packed(kvx_provider, kvx_call_options, pack, dtype):
    _valid(kvx_provider, kvx_call_options(), "hnd_packed", dtype, pack=pack)


@conformance("validate.valid.custom", CL_VALID + "; R-CUSTOM", REQUIRED, "layouts", "validate",
             feature="custom_layout")
@DTYPES
def test_valid_custom(kvx_provider, kvx_call_options, dtype):
    _valid(kvx_provider, kvx_call_options(), "custom", dtype, order=(2, 0, 3, 1))


# ---------------------------------------------------------------------------- 7.1 zero dims

ZERO_DIMS = ("num_blocks", "block_size", "num_kv_heads", "head_dim")
#: where each dimension lies in a cache tensor's shape, by core layout
DIM_AT = {"nhd": {"num_blocks": 0, "block_size": 1, "num_kv_heads": 2, "head_dim": 3},
          "hnd": {"num_blocks": 0, "num_kv_heads": 1, "block_size": 2, "head_dim": 3}}


def _zero_dim(kind: str, dim: str) -> dict:
    """Zero in the descriptor and, consistently, in both tensors' shapes of layout ``kind``."""
    i = DIM_AT[kind][dim]
    return {f"cache.{dim}": 0, f"cache.k.shape[{i}]": 0, f"cache.v.shape[{i}]": 0}


@conformance("validate.zero_dimension", CL_71 + " (block_size, num_blocks, num_kv_heads, head_dim MUST be non-zero)",
             REQUIRED, "core", "validate")
@pytest.mark.parametrize("dim", ZERO_DIMS)
def test_zero_dimension(kvx_provider, kvx_call_options, dim):
    """Zero in the descriptor and, consistently, in both shapes (the provider's core layout: a
    refusal of a layout it does not serve would say nothing of the rule): only the 7.1 rule is
    broken."""
    opts = kvx_call_options()
    kind = cb.core_layout(kvx_provider, opts.memory)
    verify_validate(kvx_provider, _vcase(kind, overrides=_zero_dim(kind, dim), label=f"{dim} = 0"), opts,
                    clause=CL_71, expect=INVALID)


@conformance("write.zero_dimension", CL_71, REQUIRED, "core", "write")
@pytest.mark.parametrize("dim", ZERO_DIMS)
def test_write_zero_dimension(kvx_provider, kvx_call_options, dim):
    opts = kvx_call_options()
    kind = cb.core_layout(kvx_provider, opts.memory)
    cache = cb.simple_cache(G, kind, DType.F16, seed=2)
    case = cb.write_case(cache, [1, 2], seed=3, overrides=_zero_dim(kind, dim), label=f"write with {dim} = 0")
    verify_write(kvx_provider, case, opts, clause=CL_71, expect=INVALID)


@conformance("gather.zero_dimension", CL_71 + " (block_size, num_blocks, num_kv_heads, head_dim MUST be non-zero)",
             REQUIRED, "core", "gather")
@pytest.mark.parametrize("dim", ZERO_DIMS)
def test_gather_zero_dimension(kvx_provider, kvx_call_options, dim):
    """The 7.1 rule on the third entry point that takes a cache descriptor: a PACKED gather whose
    cache has a zero dimension (consistently in both shapes) is INVALID_ARGUMENT and writes nothing
    (a gather that divides by ``block_size`` or loops over the heads before validating them fails)."""
    opts = kvx_call_options()
    kind = cb.core_layout(kvx_provider, opts.memory)
    cache = cb.simple_cache(G, kind, DType.F16, seed=5)
    case = cb.packed_gather(cache, cb.distinct_table(G, 2, 2, 6), [5, 7], 8, seed=7, overrides=_zero_dim(kind, dim),
                            label=f"gather with {dim} = 0")
    verify_gather(kvx_provider, case, opts, clause=CL_71, expect=INVALID)


# ---------------------------------------------------------------------------- shapes and ndim

SHAPE_PARAMS = (
    [pytest.param("nhd", "k", i, id=f"nhd-k-dim{i}") for i in range(4)]
    + [pytest.param("hnd", "k", i, id=f"hnd-k-dim{i}") for i in range(4)]
    + [pytest.param("hnd_packed", "k", i, id=f"hnd_packed-k-dim{i}") for i in range(5)]
    + [pytest.param("custom", "k", i, id=f"custom-k-dim{i}") for i in range(4)]
    + [pytest.param(kind, "v", 1, id=f"{kind}-v-dim1") for kind in ("nhd", "hnd", "hnd_packed", "custom")]
)


@conformance("validate.shape_mismatch", CL_SHAPE, REQUIRED, "core", "validate")
@pytest.mark.parametrize("kind,side,dim", SHAPE_PARAMS)
def test_shape_mismatch(kvx_provider, kvx_call_options, kind, side, dim):
    """One extent off by one (NHD/HND/HND_PACKED, spec 9; CUSTOM, whose shape is the logical
    ``[num_blocks, block_size, num_kv_heads, head_dim]``, R-CUSTOM). For HND_PACKED dim 4 (pack)
    the pack 4 still divides head_dim 8 but shape[2] then disagrees."""
    opts = kvx_call_options()
    base = cb.simple_cache(G, kind, DType.F16, seed=4)
    t = getattr(base, side)
    ov = {f"cache.{side}.shape[{dim}]": int(t.shape[dim]) + (2 if kind == "hnd_packed" and dim == 4 else 1)}
    verify_validate(kvx_provider, cb.validate_case(base, label=f"{kind} {side}.shape[{dim}] wrong", overrides=ov),
                    opts, clause=CL_SHAPE, expect=INVALID)


NDIM = [pytest.param("nhd", 5, id="nhd-5"), pytest.param("nhd", 3, id="nhd-3"), pytest.param("hnd", 5, id="hnd-5"),
        pytest.param("hnd_packed", 4, id="hnd_packed-4"), pytest.param("custom", 5, id="custom-5")]


@conformance("validate.ndim_mismatch", "spec 4.2 (ndim MUST match the layout); R-CACHE", REQUIRED, "core", "validate")
@pytest.mark.parametrize("kind,ndim", NDIM)
def test_ndim_mismatch(kvx_provider, kvx_call_options, kind, ndim):
    opts = kvx_call_options()
    ov = {"cache.k.ndim": ndim}
    verify_validate(kvx_provider, _vcase(kind, overrides=ov, label=f"{kind} with ndim {ndim}"), opts,
                    clause="spec 4.2; R-CACHE", expect=INVALID)


@conformance("validate.hnd_packed_pack_not_dividing", CL_71 + " (HND_PACKED head_dim % pack == 0)", REQUIRED, "core",
             "validate")
@pytest.mark.parametrize("pack", [3, 5, 16])
def test_pack_not_dividing(kvx_provider, kvx_call_options, pack):
    """head_dim 8 with pack = shape[4] = 3, 5 or 16 (shape[2] = head_dim // pack)."""
    opts = kvx_call_options()
    base = cb.simple_cache(G, "hnd_packed", DType.F16, seed=5, pack=2)
    ov = {}
    for side in ("k", "v"):
        ov[f"cache.{side}.shape[4]"] = pack
        ov[f"cache.{side}.shape[2]"] = G.head_dim // pack
    verify_validate(kvx_provider, cb.validate_case(base, label=f"head_dim {G.head_dim}, pack {pack}", overrides=ov),
                    opts, clause=CL_71, expect=INVALID)


@conformance("validate.hnd_packed_pack_not_dividing_dtypes", CL_71 + " (HND_PACKED head_dim % pack == 0, every "
             "cache dtype)", REQUIRED, "core", "validate")
@pytest.mark.parametrize("pack", [3, 5])
@pytest.mark.parametrize("dtype", [DType.BF16, DType.F32, DType.F8_E4M3, DType.F8_E5M2], ids=["bf16", "f32", "e4m3",
                                                                                             "e5m2"])
def test_pack_not_dividing_dtypes(kvx_provider, kvx_call_options, dtype, pack):
    """``validate.hnd_packed_pack_not_dividing`` (F16) in caches of the other dtypes, FP8 among them (vLLM's
    FP8 cache is HND_PACKED): a validation that checks the pack rule on its 16-bit path only answers OK.
    Descriptor rules come before any refusal (R-ORDER), so a provider without FP8 answers
    INVALID_ARGUMENT here too."""
    opts = kvx_call_options()
    base = cb.simple_cache(G, "hnd_packed", dtype, seed=6, pack=2)
    ov = {}
    for side in ("k", "v"):
        ov[f"cache.{side}.shape[4]"] = pack
        ov[f"cache.{side}.shape[2]"] = G.head_dim // pack
    verify_validate(kvx_provider, cb.validate_case(base, label=f"{dtype.name} cache, head_dim {G.head_dim}, pack {pack}",
                                                   overrides=ov), opts, clause=CL_71, expect=INVALID)


CL_PACK_STRIDE = ("spec 4.2, 7 (kvx_validate_cache_desc MUST validate stride; every dimension of the layout, "
                  "HND_PACKED's fifth too); R-CACHE (stride 0 on an extent > 1, farthest offset past int64)")
#: (side, pack, stride[4]) of ``validate.hnd_packed_pack_stride``: 0 on a pack of 2 or 8 (the pack's elements alias),
#: 2^62 on a pack of 8 (7 * 2^62: the farthest element offset overflows int64)
PACK_STRIDES = [pytest.param(side, pack, st, id=f"{side}-pack{pack}-{name}")
                for pack, st, name in ((2, 0, "zero"), (8, 0, "zero"), (8, 2 ** 62, "overflow")) for side in ("k", "v")]


@conformance("validate.hnd_packed_pack_stride", CL_PACK_STRIDE, REQUIRED, "core", "validate")
@pytest.mark.parametrize("side,pack,stride4", PACK_STRIDES)
@pytest.mark.parametrize("dtype", [DType.F16, DType.F8_E4M3], ids=["f16", "e4m3"])
def test_pack_stride(kvx_provider, kvx_call_options, dtype, side, pack, stride4):
    """A BLOCK_HND_PACKED K or V tensor whose pack stride (``stride[4]``, the fifth dimension only this layout has)
    is 0 on a pack above 1, or 2^62 on a pack of 8: INVALID_ARGUMENT, as ``validate.field_invalid[stride_zero]`` /
    ``[offset_overflow]`` want of a core layout's dims. Those cases and the rule catalog's draws use 4-D tensors, so a
    validator whose stride checks loop over 4 dims (written for NHD / HND) answers OK. F16 and E4M3 (vLLM's FP8
    cache is HND_PACKED); descriptor rules come before any refusal (R-ORDER): a provider that refuses every
    HND_PACKED (or FP8) cache with INVALID_ARGUMENT is excused, as a refusal of that feature (R-REFUSAL)."""
    opts = kvx_call_options()
    base = cb.simple_cache(G, "hnd_packed", dtype, seed=7, pack=pack)
    ov = {f"cache.{side}.stride[4]": stride4}
    label = (f"{dtype.name} HND_PACKED cache, pack {pack}, {side}.stride[4] = {stride4} "
             f"(strides {getattr(base, side).stride})")
    verify_validate(kvx_provider, cb.validate_case(base, label=label, overrides=ov, seed=7), opts,
                    clause=CL_PACK_STRIDE, expect=INVALID)


@conformance("validate.hnd_packed_pack_zero", "spec 4.2; R-CACHE (pack = shape[4] > 0)", REQUIRED, "core", "validate")
def test_pack_zero(kvx_provider, kvx_call_options):
    opts = kvx_call_options()
    ov = {"cache.k.shape[4]": 0}
    verify_validate(kvx_provider, _vcase("hnd_packed", overrides=ov, label="pack 0", pack=2), opts,
                    clause="spec 4.2; R-CACHE", expect=INVALID)


# ---------------------------------------------------------------------------- fields

FIELD_CASES = {
    "k_dtype_invalid": {"cache.k.dtype": int(DType.INVALID)},
    "k_dtype_s32": {"cache.k.dtype": int(DType.S32)},
    "v_dtype_u8": {"cache.v.dtype": int(DType.U8)},
    "v_dtype_99": {"cache.v.dtype": 99},
    # every index and scale dtype on each side: a validator that admits 1-byte (or 4- / 8-byte) dtypes by
    # their element size takes one of them for a cache dtype (UE8M0: the MXFP4 scale byte, spec 1.2)
    "k_dtype_ue8m0": {"cache.k.dtype": int(DType.UE8M0)},
    "v_dtype_ue8m0": {"cache.v.dtype": int(DType.UE8M0)},
    "k_dtype_u8": {"cache.k.dtype": int(DType.U8)},
    "v_dtype_s32": {"cache.v.dtype": int(DType.S32)},
    "k_dtype_s64": {"cache.k.dtype": int(DType.S64)},
    "v_dtype_s64": {"cache.v.dtype": int(DType.S64)},
    "k_dtype_u32": {"cache.k.dtype": int(DType.U32)},
    "v_dtype_u32": {"cache.v.dtype": int(DType.U32)},
    "k_dtype_u64": {"cache.k.dtype": int(DType.U64)},
    "v_dtype_u64": {"cache.v.dtype": int(DType.U64)},
    "k_layout_invalid": {"cache.k.layout": int(Layout.INVALID)},
    "v_layout_4": {"cache.v.layout": 4},
    "k_data_null": {"cache.k.data": None},
    "v_data_null": {"cache.v.data": None},
    "k_memory_unknown": {"cache.k.memory": int(Memory.UNKNOWN), "cache.v.memory": int(Memory.UNKNOWN)},
    "memory_not_enum": {"cache.k.memory": 9, "cache.v.memory": 9},
    "k_v_memory_differ": {"cache.v.memory": int(Memory.UNIFIED)},
    "stride_zero": {"cache.k.stride[1]": 0},
    "offset_overflow": {"cache.k.stride[0]": 2 ** 62},
    # V's strides are checked like K's (a validator that checks K twice passes the K cases)
    "v_stride_zero": {"cache.v.stride[1]": 0},
    "v_offset_overflow": {"cache.v.stride[0]": 2 ** 62},
    # the farthest element offset overflows int64 only as a sum: each stride * (extent - 1) of dims 0
    # and 1 lies in [2^62, 2^63), so a validator that bounds each term alone misses it
    "offset_overflow_sum": "k",
    "v_offset_overflow_sum": "v",
}


def _sum_overflow(side: str, shape) -> dict:
    """Strides of dims 0 and 1 of ``side`` whose terms stride * (extent - 1) each fit in int64 and
    whose sum does not (both extents above 1 in either core layout)."""
    return {f"cache.{side}.stride[{i}]": -(-(2 ** 62) // (int(shape[i]) - 1)) for i in (0, 1)}


@conformance("validate.field_invalid", "spec 4.2, 4.3, 6.2, 7; R-CACHE", REQUIRED, "core", "validate")
@pytest.mark.parametrize("which", list(FIELD_CASES))
def test_field_invalid(kvx_provider, kvx_call_options, which):
    opts = kvx_call_options()
    kind = cb.core_layout(kvx_provider, opts.memory)
    ov = FIELD_CASES[which]
    ov = _sum_overflow(ov, cb.simple_cache(G, kind, DType.F16, seed=1).k.shape) if isinstance(ov, str) else dict(ov)
    if which == "k_v_memory_differ" and opts.memory == Memory.UNIFIED:
        ov = {"cache.v.memory": int(Memory.HOST)}
    # the provider's core layout: stride[1] (tokens in NHD, heads in HND) has an extent above 1 in both
    verify_validate(kvx_provider, _vcase(kind, overrides=ov, label=which), opts,
                    clause="spec 4.2, 4.3, 6.2, 7; R-CACHE", expect=INVALID)


@conformance("validate.stride_zero_extent_one", "spec 4.2; R-CACHE (stride 0 only aliases on extents > 1)",
             RECOMMENDED, "core", "validate", feature="noncanonical_strides")
def test_stride_zero_extent_one(kvx_provider, kvx_call_options):
    opts = kvx_call_options()
    geom = Geometry(4, 4, 1, 8)
    kind = cb.core_layout(kvx_provider, opts.memory)
    base = cb.simple_cache(geom, kind, DType.F16, seed=6)
    h = DIM_AT[kind]["num_kv_heads"]
    ov = {f"cache.k.stride[{h}]": 0, f"cache.v.stride[{h}]": 0}
    verify_validate(kvx_provider, cb.validate_case(base, label="num_kv_heads 1, head stride 0", overrides=ov),
                    opts, clause="spec 4.2; R-CACHE", feature="noncanonical_strides", expect=OK)


@conformance("validate.negative_stride", "spec 4.2; R-STRIDE-NEG (a provider may serve them)", INFORMATIONAL, "core",
             "validate", feature="noncanonical_strides")
def test_negative_stride(kvx_provider, kvx_call_options):
    opts = kvx_call_options()
    # the provider's core layout, not NHD: HND alone may be its core layout (readings, core:
    # "at least one of NHD/HND"), and its refusal of an NHD cache, INVALID_ARGUMENT being one
    # (spec 8: "Malformed descriptor or unsupported field"; R-REFUSAL), says nothing of strides
    base = cb.simple_cache(G, cb.core_layout(kvx_provider, opts.memory), DType.F16, seed=5)
    cache = cb.replace(base, k=base.k.reversed(0))  # blocks walked backwards, all in the buffer
    verify_validate(kvx_provider, cb.validate_case(cache, label=f"negative block stride {cache.k.stride}"), opts,
                    clause="spec 4.2; R-STRIDE-NEG", statuses=(OK, UNSUPPORTED))


@conformance("validate.mixed_k_v", "spec 4.2; R-CACHE (K and V may differ in layout, strides and dtype)", RECOMMENDED,
             "layouts", "validate", feature="mixed_layouts")
def test_mixed_k_v(kvx_provider, kvx_call_options):
    opts = kvx_call_options()
    k = cb.layout(G, "hnd_packed", DType.F16, pack=4)
    v = cb.layout(G, "hnd", DType.BF16, order=(0, 1, 3, 2))
    case = cb.validate_case(cb.make_cache(G, k, v, seed=7), label="packed K F16, transposed HND V BF16")
    verify_validate(kvx_provider, case, opts, clause="spec 4.2; R-CACHE", feature="mixed_layouts", expect=OK)


# ---------------------------------------------------------------------------- tables (spec 9)


def _packed(provider, memory, overrides, label):
    cache = cb.simple_cache(G, cb.core_layout(provider, memory), DType.F16, seed=8)
    return cb.packed_gather(cache, cb.distinct_table(G, 2, 2, 9), [5, 7], 8, seed=10, label=label,
                            overrides=overrides)


PACKED_BAD = {
    "indices_count_short": {"desc.block_table.indices_count": 3},
    "indices_count_long": {"desc.block_table.indices_count": 5},
    "indptr_count_nonzero": {"desc.block_table.indptr_count": 3},
    "beam_width_2": {"desc.block_table.beam_width": 2},
    "index_dtype_u32": {"desc.block_table.index_dtype": int(DType.U32)},
    "index_dtype_f32": {"desc.block_table.index_dtype": int(DType.F32)},
    "format_invalid": {"desc.block_table.format": 0},
    "format_7": {"desc.block_table.format": 7},
    "seq_lens_count_mismatch": {"desc.seq_lens.seq_count": 1},
    "seq_lens_dtype_u64": {"desc.seq_lens.dtype": int(DType.U64)},
    "lengths_null": {"desc.seq_lens.lengths": None},
    "indices_null": {"desc.block_table.indices": None},
    "num_tokens_wrong": {"desc.io.num_tokens": 15, "desc.io.key.shape[0]": 15, "desc.io.value.shape[0]": 15},
}


@conformance("gather.validation.packed", "spec 5.1, 5.3, 7, 7.1, 9 (block table counts); R-GATHER", REQUIRED, "core",
             "gather")
@pytest.mark.parametrize("which", list(PACKED_BAD))
def test_packed_table_invalid(kvx_provider, kvx_call_options, which):
    opts = kvx_call_options()
    case = _packed(kvx_provider, opts.memory, PACKED_BAD[which], which)
    verify_gather(kvx_provider, case, opts, clause="spec 5.1, 5.3, 7.1; R-GATHER", expect=INVALID)


def _ragged(provider, memory, overrides, label, indptr=None, extra=0):
    cache = cb.simple_cache(G, cb.core_layout(provider, memory), DType.F16, seed=11)
    table = cb.distinct_table(G, 2, 2, 12)
    bt = cb.ragged_table(table, [5, 7], G.block_size, 2, extra=extra)
    if indptr is not None:
        bt.indptr = indptr
    return cb.ragged_gather(cache, table, [5, 7], 8, seed=13, block_table=bt, label=label, overrides=overrides)


RAGGED_BAD = {
    "indptr_count_short": ({"desc.block_table.indptr_count": 2}, None),
    "indptr_count_long": ({"desc.block_table.indptr_count": 4}, None),
    "indptr_null": ({"desc.block_table.indptr": None}, None),
    "indptr_dtype_u32": ({"desc.block_table.indptr_dtype": int(DType.U32)}, None),
    "index_dtype_u8": ({"desc.block_table.index_dtype": int(DType.U8)}, None),
    "beam_width_2": ({"desc.block_table.beam_width": 2}, None),
    "indptr_first_negative": ({}, [-1, 5, 12]),
    "indptr_decreasing": ({}, [0, 13, 12]),
    # 14 indices (one spare per sequence): ranges of 6 and 7 hold both lengths, so the only error is
    # indptr[2] = 13 != indices_count (with [0, 5, 11] over 12 indices sequence 1 would also be short)
    "indptr_last_not_count": ({}, [0, 6, 13]),
    # spec 5.3 / 7: seq_lens.seq_count MUST match the table's and its dtype MUST be S32 or S64, whatever
    # the table's format (the PACKED cases are gather.validation.packed's)
    "seq_lens_count_mismatch": ({"desc.seq_lens.seq_count": 1}, None),
    "seq_lens_dtype_u64": ({"desc.seq_lens.dtype": int(DType.U64)}, None),
}
#: indptr cases built over ``extra`` spare indices per sequence
RAGGED_EXTRA = {"indptr_last_not_count": 1}
#: readings ("Gather output"): a RAGGED indptr that is not non-decreasing "must never cause an
#: out-of-bounds read or write; the status should be OUT_OF_RANGE or INVALID_ARGUMENT"
RAGGED_EITHER = {"indptr_decreasing"}


@conformance("gather.validation.ragged", "spec 5.1, 5.3, 7, 7.1, 9 (indptr validation); R-GATHER, R-DATA", REQUIRED,
             "tables", "gather", feature="ragged")
@pytest.mark.parametrize("which", list(RAGGED_BAD))
def test_ragged_table_invalid(kvx_provider, kvx_call_options, which):
    opts = kvx_call_options()
    ov, indptr = RAGGED_BAD[which]
    import numpy as np

    case = _ragged(kvx_provider, opts.memory, ov, which, None if indptr is None else np.array(indptr, np.int64),
                   extra=RAGGED_EXTRA.get(which, 0))
    kw = {"statuses": (INVALID, Status.OUT_OF_RANGE)} if which in RAGGED_EITHER else {}
    verify_gather(kvx_provider, case, opts, clause="spec 5.1, 5.3, 7.1; R-GATHER, R-DATA", feature="ragged",
                  expect=INVALID, partial=partial_gather(case) if indptr is not None else None, **kw)


def _kv(provider, memory, overrides, label, geom=G, dtype=DType.F16):
    import numpy as np

    c = cb.kv_offsets_cache(geom, dtype, primary_blocks=8, seed=14)
    t = cb.layout(geom, cb.core_layout(provider, memory), dtype)
    c = cb.replace(c, k=t, v=t, k_init=cb.finite_values(cb.rng_for(1), dtype, t.span_elements()),
                   v_init=cb.finite_values(cb.rng_for(2), dtype, t.span_elements()))
    off = cb.rng_for(15).integers(0, 8, size=(2, 2, 2, 2)).astype(np.int64)
    return cb.kv_offsets_gather(c, off, [5, geom.block_size + 1], 2 * geom.block_size, seed=16, label=label,
                                overrides=overrides)


KV_BAD = {
    "index_dtype_s64": {"desc.block_table.index_dtype": int(DType.S64)},
    "flag_missing": {"desc.block_table.flags": 0},
    "indices_count_wrong": {"desc.block_table.indices_count": 8},
    "indptr_count_nonzero": {"desc.block_table.indptr_count": 3},
    "beam_width_zero": {"desc.block_table.beam_width": 0},
    "pool_primary_null": {"cache.pool.primary": None},
    "bytes_per_block_wrong": {"cache.pool.bytes_per_block": 2 * 4 * 8 * 2 + 2},
    # spec 5.3 / 7: as for PACKED and RAGGED
    "seq_lens_count_mismatch": {"desc.seq_lens.seq_count": 1},
    "seq_lens_dtype_u64": {"desc.seq_lens.dtype": int(DType.U64)},
}


@conformance("gather.validation.kv_offsets_bytes_per_block", "spec 6.7 (bytes_per_block, required for KV_OFFSETS); "
             "R-GATHER (bytes_per_block == num_kv_heads * block_size * head_dim * elem_size(k.dtype))", REQUIRED,
             "tables", "gather", feature="kv_offsets")
@pytest.mark.parametrize("wrong", ["plus_2", "double"])
@pytest.mark.parametrize("dtype", [DType.BF16, DType.F32], ids=["bf16", "f32"])
def test_kv_offsets_bytes_per_block_dtypes(kvx_provider, kvx_call_options, dtype, wrong):
    """``gather.validation.kv_offsets[bytes_per_block_wrong]`` (F16) in BF16 and F32 caches: a wrong
    ``pool.bytes_per_block`` (2 bytes more, or twice the block) is INVALID_ARGUMENT whatever the element
    size; a provider that derives the block stride from the geometry for 4-byte elements and checks the
    field only on its 16-bit path answers OK."""
    opts = kvx_call_options()
    right = G.num_kv_heads * G.block_size * G.head_dim * DTYPE_SIZE[dtype]
    bad = right + 2 if wrong == "plus_2" else 2 * right
    case = _kv(kvx_provider, opts.memory, {"cache.pool.bytes_per_block": bad},
               f"{dtype.name} cache, bytes_per_block {bad} (the block is {right})", dtype=dtype)
    verify_gather(kvx_provider, case, opts, clause="spec 6.7; R-GATHER", feature="kv_offsets", expect=INVALID)


@conformance("gather.validation.kv_offsets", "spec 5.1, 5.3, 6.7, 7, 7.1, 9; R-GATHER", REQUIRED, "tables", "gather",
             feature="kv_offsets")
@pytest.mark.parametrize("which", list(KV_BAD))
def test_kv_offsets_invalid(kvx_provider, kvx_call_options, which):
    opts = kvx_call_options()
    case = _kv(kvx_provider, opts.memory, KV_BAD[which], which)
    verify_gather(kvx_provider, case, opts, clause="spec 5.1, 5.3, 6.7, 7.1; R-GATHER", feature="kv_offsets",
                  expect=INVALID)


@conformance("gather.validation.kv_offsets_block_size_pow2", CL_71 + " (KV_OFFSETS block_size MUST be a power of two)",
             REQUIRED, "tables", "gather", feature="kv_offsets")
@pytest.mark.parametrize("block_size", [3, 6])
def test_kv_offsets_non_pow2(kvx_provider, kvx_call_options, block_size):
    opts = kvx_call_options()
    geom = Geometry(4, block_size, 2, 8)
    case = _kv(kvx_provider, opts.memory, {}, f"KV_OFFSETS with block_size {block_size}", geom=geom)
    verify_gather(kvx_provider, case, opts, clause=CL_71, feature="kv_offsets", expect=INVALID)


# ---------------------------------------------------------------------------- write descriptors


def _write(provider, memory, overrides, label, n=4):
    cache = cb.simple_cache(G, cb.core_layout(provider, memory), DType.F16, seed=17)
    return cb.write_case(cache, cb.spread_slots(G, n, 18), seed=19, label=label, overrides=overrides)


WRITE_BAD = {
    "token_count_mismatch": {"desc.slots.token_count": 3},
    "slot_dtype_u64": {"desc.slots.dtype": int(DType.U64)},
    "slot_dtype_f32": {"desc.slots.dtype": int(DType.F32)},
    "slots_null": {"desc.slots.slots": None},
    "io_heads_mismatch": {"desc.io.num_kv_heads": 3, "desc.io.key.shape[1]": 3, "desc.io.value.shape[1]": 3},
    "io_head_dim_mismatch": {"desc.io.head_dim": 4, "desc.io.key.shape[2]": 4, "desc.io.value.shape[2]": 4},
    "io_key_null": {"desc.io.key.data": None},
    "io_value_null": {"desc.io.value.data": None},
    "io_key_dtype_s32": {"desc.io.key.dtype": int(DType.S32)},
    "io_value_memory": {"desc.io.value.memory": int(Memory.UNKNOWN)},
    "io_key_ndim_4": {"desc.io.key.ndim": 4},
    "io_key_shape": {"desc.io.key.shape[0]": 5},
}


@conformance("write.validation", "spec 5.2, 6.8, 7 (num_tokens, num_kv_heads, head_dim validated); R-WRITE, R-IO",
             REQUIRED, "core", "write")
@pytest.mark.parametrize("which", list(WRITE_BAD))
def test_write_invalid(kvx_provider, kvx_call_options, which):
    opts = kvx_call_options()
    case = _write(kvx_provider, opts.memory, WRITE_BAD[which], which)
    verify_write(kvx_provider, case, opts, clause="spec 5.2, 6.8, 7; R-WRITE, R-IO", expect=INVALID,
                 partial=partial_write(case))


# ---------------------------------------------------------------------------- the rule catalog


def _rule_seed(rule: str) -> int:
    return zlib.crc32(rule.encode()) & 0x7FFFFFFF


def _rule_params():
    """One param per rule of the generators' catalog, with its own metadata marker."""
    import numpy as np

    from kvx_conformance.cases.generators import RULES, random_invalid_case

    params = []
    for rule, rc in RULES.items():
        seed = _rule_seed(rule)
        v = random_invalid_case(np.random.default_rng(seed), rule, seed=seed)
        step5 = rule.startswith(("R-DATA.", "R-WRITE.slot_out_of_range"))
        if rc.status == UNSUPPORTED:
            level = INFORMATIONAL  # a provider may serve what the reference refuses
        elif step5 and rule != "R-DATA.negative_length":
            level = RECOMMENDED  # readings: "should be OUT_OF_RANGE or INVALID_ARGUMENT"
        else:
            level = REQUIRED
        feats = cb.case_features(v.case)
        if "ragged" in feats or "kv_offsets" in feats:
            profile = "tables"
        elif "fp8" in feats:
            profile = "fp8"
        else:
            profile = "core"
        entry = ENTRY_OF[type(v.case).__name__]
        mark = conformance("validation.rule", f"{rc.clause} (rule {rule})", level, profile, entry,
                           feature=feats[0] if feats else None)
        # every optional feature of the case: UNSUPPORTED is excused when any of them is unclaimed
        params.append(pytest.param(v, level, tuple(feats) or None, id=rule, marks=mark))
    return params


def _in_served_layouts(provider, opts, claims, violation, feature):
    """The rule's case, drawn again from the same seed in the layouts the provider serves or claims
    (``served.rule_profile``, probed on the case's own entry point), where the catalog's draw put K
    or V in another one, or K and V in two, which it does not serve.

    The catalog draws from ``CORE`` (NHD and HND, K and V apart). A provider that serves one
    layout refuses the others, and the refusal (INVALID_ARGUMENT, as many of these rules expect,
    or an excused UNSUPPORTED) would stand for the rule under test without exercising it. Readings
    R-REFUSAL: what a provider does not serve it may refuse; the rule is then tested where it
    serves."""
    from kvx_conformance.cases.strategies import rule_case

    profile = _redraw_profile(provider, opts, claims, ENTRY_OF[type(violation.case).__name__], violation.case)
    if profile is None:
        return violation, feature
    v = rule_case(violation.rule, _rule_seed(violation.rule), profile, opts.memory)
    return v, tuple(cb.case_features(v.case)) or None


def _redraw_profile(provider, opts, claims, entry: str, case):
    """The profile to draw ``case`` again from (``served.rule_profile``, probed on ``entry``), or None
    where the layouts and the K / V mix it uses are served or claimed."""
    from kvx_conformance.cases import served as served_mod

    profile = served_mod.rule_profile(provider, opts.memory, claims, entry)
    if profile is None:  # every layout and their mix served or claimed
        return None
    drawn = set(cb.case_features(case)) & set(served_mod.LAYOUT_FEATURES)
    if drawn <= set(profile.layout_kinds) | ({"mixed_layouts"} if profile.mixed_kv else set()):
        return None
    return profile


@pytest.mark.parametrize("violation,level,feature", _rule_params())
def test_rule(kvx_provider, kvx_call_options, kvx_claims, violation, level, feature):
    """A case that breaks exactly one rule of the catalog (generators.RULES).

    Informational rules are the UNSUPPORTED answers of the reference (a provider may
    serve those cases; the result says so without weighing on certification). Where the
    spec defines the served result (negative strides: spec 4.2 "Implementations MUST honor
    provided strides", ``rules.SERVABLE``), OK with that result passes as well. Elsewhere
    the refusal may be INVALID_ARGUMENT as well as UNSUPPORTED: spec 8 defines
    INVALID_ARGUMENT as "Malformed descriptor or unsupported field", and readings R-REFUSAL
    read both as refusals (none of these rules is one whose refusal spec 4.2 / 4.4 says
    SHOULD be UNSUPPORTED). A provider that serves the feature may find the case malformed
    for it: ``R-FP8.per_block_unsupported`` relabels a PER_TENSOR scale descriptor (``ndim``
    0 or shape ``[1]``) as PER_BLOCK / PER_BLOCK_HEAD, which a provider serving per-block
    scales reads as a shape that disagrees with ``num_blocks``.
    Recommended ones are data-dependent errors: OUT_OF_RANGE or INVALID_ARGUMENT, and
    nothing beyond what the valid part of the call writes.
    """
    from kvx_conformance.reference_impl.rules import SERVABLE

    opts = kvx_call_options()
    violation, feature = _in_served_layouts(kvx_provider, opts, kvx_claims, violation, feature)
    case, clause, status = violation.case, f"{violation.clause} (rule {violation.rule})", violation.status
    kw = dict(clause=clause, feature=feature, expect=status)
    if level == RECOMMENDED:
        kw["statuses"] = (Status.OUT_OF_RANGE, Status.INVALID_ARGUMENT)
    if violation.rule in SERVABLE:
        kw["statuses"] = (Status.UNSUPPORTED, Status.OK)
        if hasattr(case, "slots") or hasattr(case, "table"):
            kw["served"] = (violation.rule,)
    elif status == UNSUPPORTED:
        kw["statuses"] = (Status.UNSUPPORTED, Status.INVALID_ARGUMENT)  # spec 8; R-REFUSAL
    if hasattr(case, "slots"):
        verify_write(kvx_provider, case, opts, partial=partial_write(case), **kw)
    elif hasattr(case, "table"):
        verify_gather(kvx_provider, case, opts, partial=partial_gather(case), **kw)
    else:
        verify_validate(kvx_provider, case, opts, **kw)


# ---------------------------------------------------------------------------- order (R-ORDER)

#: descriptor rules (R-ORDER steps 2-3) paired below with a data error of step 5
ORDER_RULES = {"write": ["R-IO.num_kv_heads", "R-IO.head_dim", "R-IO.shape", "R-CACHE.shape", "R-WRITE.token_count"],
               "gather": ["R-IO.num_kv_heads", "R-GATHER.num_tokens", "R-CACHE.shape", "R-GATHER.seq_count_match"]}
CL_ORDER = "spec 7, 8; R-ORDER (checks run in order, the first failing one decides the status)"


def _with_data_error(case):
    """The case plus a step-5 data error: a slot past the cache (write) or a block id past it (a
    PACKED or RAGGED gather); None where the case has no such value to break."""
    import dataclasses

    import numpy as np

    from kvx_conformance.abi.header import TableFormat

    g = case.cache.geom
    if hasattr(case, "slots"):
        s = np.asarray(case.slots.slots, np.int64).copy()
        if not len(s):
            return None
        s[0] = g.num_slots + 5
        return dataclasses.replace(case, slots=dataclasses.replace(case.slots, slots=s))
    t = case.table
    if t.format not in (TableFormat.PACKED, TableFormat.RAGGED) or not len(t.indices):
        return None
    idx = np.asarray(t.indices, np.int64).copy()
    idx[:] = g.num_blocks + 3  # every entry: whichever a provider reads first is out of range
    return dataclasses.replace(case, table=dataclasses.replace(t, indices=idx))


def _order_case(call: str, rule: str, profile=None, memory: Memory = Memory.HOST):
    """The first case from the rule's seeds (``profile``: drawn from it, ``strategies.rule_case``) that
    is a ``call`` and can carry a data error, with that error; None if none of 200 seeds gives one."""
    from kvx_conformance.cases.strategies import rule_case

    for k in range(200):
        seed = _rule_seed(f"order:{rule}:{call}") + k
        v = rule_case(rule, seed, profile, memory)
        if not hasattr(v.case, "slots" if call == "write" else "table"):
            continue
        case = _with_data_error(v.case)
        if case is not None:
            return case
    return None


def _order_params():
    params = []
    for call, rules in ORDER_RULES.items():
        for rule in rules:
            case = _order_case(call, rule)
            if case is None:
                raise RuntimeError(f"no {call} case for {rule}")
            params.append(pytest.param(call, rule, case, id=f"{call}-{rule}"))
    return params


def _order_in_served_layouts(provider, opts, claims, call: str, rule: str, case):
    """The case drawn again in the layouts the provider serves or claims (as ``_in_served_layouts``):
    an INVALID_ARGUMENT refusal of an unserved layout would stand for the order under test."""
    profile = _redraw_profile(provider, opts, claims, call, case)
    return case if profile is None else _order_case(call, rule, profile, opts.memory) or case


# the spec does not rank two errors of one call: the reading's order is recommended (a warning)
@conformance("validation.order.descriptor_before_data", CL_ORDER, RECOMMENDED, "core", ("write", "gather"))
@pytest.mark.parametrize("call,rule,case", _order_params())
def test_descriptor_error_before_data_error(kvx_provider, kvx_call_options, kvx_claims, call, rule, case):
    """A malformed descriptor (steps 2-3) and an out-of-range slot or block id (step 5) in one
    call: INVALID_ARGUMENT, and nothing written: the descriptor is checked before any data. The
    case is drawn in the layouts the provider serves (``_order_in_served_layouts``)."""
    opts = kvx_call_options()
    case = _order_in_served_layouts(kvx_provider, opts, kvx_claims, call, rule, case)
    feats = tuple(cb.case_features(case)) or None
    verify = verify_write if call == "write" else verify_gather
    verify(kvx_provider, case, opts, clause=f"{CL_ORDER} (rule {rule} with a data error)", feature=feats,
           expect=Status.INVALID_ARGUMENT)
