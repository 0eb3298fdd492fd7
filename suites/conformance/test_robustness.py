"""Spec 4.4, 6, 7, 8: robustness against malformed and unusual calls.

- misaligned buffers (every data pointer offset by 2, 4 or 8 bytes from a 256-byte
  boundary): the correct result or UNSUPPORTED, never a wrong one (spec 4.4), head rows of
  16 or 32 bytes and rows that are not a multiple of 16 bytes alike;
- malformed descriptors: absurd counts (0xFFFFFFFF), products that overflow 32 or 64
  bits, enum values out of range, NULL pointers where data is needed: an error status
  and nothing written; a crash or a hang is the worst outcome (the harness isolates it);
- descriptors that are huge but consistent: validated as such, and a call touching
  only the first blocks works;
- zero-sized calls, with NULL data pointers where nothing is read.
"""
from __future__ import annotations

import numpy as np
import pytest

from kvx_conformance.abi.descriptors import Geometry
from kvx_conformance.abi.header import DType, Status
from kvx_conformance.cases import build as cb
from kvx_conformance.cases.checks import verify_gather, verify_validate, verify_write
from kvx_conformance.results.outcomes import RECOMMENDED, REQUIRED, conformance

G = cb.GEOM
INVALID, OK = Status.INVALID_ARGUMENT, Status.OK
CL_ALIGN = "spec 4.4 (MAY return UNSUPPORTED if alignment requirements are not met); readings: never wrong"
CL_MALFORMED = "spec 6, 7, 8 (malformed descriptor: INVALID_ARGUMENT, never a crash); R-CACHE, R-GATHER"
U32_MAX = 0xFFFFFFFF


def _cache(provider, memory, seed, dtype=DType.F16):
    return cb.simple_cache(G, cb.core_layout(provider, memory), dtype, seed=seed)


# ---------------------------------------------------------------------------- misalignment


@conformance("robust.misaligned", CL_ALIGN, REQUIRED, "robustness", ("write", "gather"), feature="misaligned")
@pytest.mark.parametrize("misalign", [2, 4, 8])
@pytest.mark.parametrize("dtype", [DType.F16, DType.F32], ids=["f16", "f32"])
@pytest.mark.parametrize("op", ["write", "gather"])
def test_misaligned(kvx_provider, kvx_call_options, misalign, dtype, op):
    opts = kvx_call_options(misalign=misalign)
    cache = _cache(kvx_provider, opts.memory, 1, dtype)
    label = f"data pointers {misalign} bytes past a 256-byte boundary"
    if op == "write":
        case = cb.write_case(cache, cb.spread_slots(G, 12, 2), seed=3, label=label)
        verify_write(kvx_provider, case, opts, clause=CL_ALIGN, feature="misaligned")
    else:
        case = cb.packed_gather(cache, cb.distinct_table(G, 3, 2, 4), [8, 5, 3], 8, seed=5, label=label)
        verify_gather(kvx_provider, case, opts, clause=CL_ALIGN, feature="misaligned")


#: head rows that are not a multiple of 16 bytes: F16 head_dim 12 (24 bytes), F32 head_dim 5 (20 bytes)
ODD_ROWS = {DType.F16: Geometry(num_blocks=6, block_size=4, num_kv_heads=2, head_dim=12),
            DType.F32: Geometry(num_blocks=6, block_size=4, num_kv_heads=2, head_dim=5)}


@conformance("robust.misaligned_odd_rows", CL_ALIGN + "; R-REFUSAL (rows not a multiple of 16 bytes: a valid cache)",
             REQUIRED, "robustness", ("write", "gather"), feature="misaligned")
@pytest.mark.parametrize("misalign", [2, 4, 8])
@pytest.mark.parametrize("dtype", [DType.F16, DType.F32], ids=["f16", "f32"])
@pytest.mark.parametrize("op", ["write", "gather"])
def test_misaligned_odd_rows(kvx_provider, kvx_call_options, misalign, dtype, op):
    """``robust.misaligned`` with head rows of 24 (F16) and 20 (F32) bytes: a path for unaligned
    pointers that moves each row in whole 16-byte chunks and drops the rest writes or gathers rows
    without their last elements (``robust.misaligned``'s rows are 16 and 32 bytes)."""
    opts = kvx_call_options(misalign=misalign)
    g = ODD_ROWS[dtype]
    cache = cb.simple_cache(g, cb.core_layout(kvx_provider, opts.memory), dtype, seed=31)
    label = f"data pointers {misalign} bytes past a 256-byte boundary, head rows of {g.head_dim} {dtype.name}"
    if op == "write":
        case = cb.write_case(cache, cb.spread_slots(g, 12, 32), seed=33, label=label)
        verify_write(kvx_provider, case, opts, clause=CL_ALIGN, feature="misaligned")
    else:
        case = cb.packed_gather(cache, cb.distinct_table(g, 3, 2, 34), [8, 5, 3], 8, seed=35, label=label)
        verify_gather(kvx_provider, case, opts, clause=CL_ALIGN, feature="misaligned")


# ---------------------------------------------------------------------------- malformed


def _gather(provider, memory, overrides, label, seqs=2, mb=2):
    lens = [5, 8, 3, 1][:seqs]
    return cb.packed_gather(_cache(provider, memory, 6), cb.distinct_table(G, seqs, mb, 7), lens, 8, seed=8,
                            label=label, overrides=overrides)


def _kv_gather(provider, memory, overrides, label):
    c = cb.kv_offsets_cache(G, DType.F16, primary_blocks=8, seed=9)
    t = cb.layout(G, cb.core_layout(provider, memory), DType.F16)
    c = cb.replace(c, k=t, v=t, k_init=cb.finite_values(cb.rng_for(9), DType.F16, t.span_elements()),
                   v_init=cb.finite_values(cb.rng_for(10), DType.F16, t.span_elements()))
    off = cb.rng_for(11).integers(0, 8, size=(1, 1, 2, 2)).astype(np.int64)
    return cb.kv_offsets_gather(c, off, [6], 8, seed=12, label=label, overrides=overrides)


GATHER_MALFORMED = {
    # 2 * 0x80000000 wraps to 0 in 32 bits
    "packed_count_wraps_32": {"desc.block_table.max_blocks_per_seq": 0x80000000, "desc.block_table.indices_count": 0},
    # 0xFFFFFFFF sequences, a table of 4 entries
    "seq_count_u32_max": {"desc.block_table.seq_count": U32_MAX, "desc.seq_lens.seq_count": U32_MAX},
    # seq_count * max_seq_len = 2^32 wraps to num_tokens 0
    "num_tokens_wraps_32": {"desc.block_table.seq_count": 0x10000, "desc.seq_lens.seq_count": 0x10000,
                            "desc.block_table.indices_count": 0x20000, "desc.max_seq_len": 0x10000,
                            "desc.io.num_tokens": 0, "desc.io.key.shape[0]": 0, "desc.io.value.shape[0]": 0},
    "max_blocks_u32_max": {"desc.block_table.max_blocks_per_seq": U32_MAX},
    "indices_count_u32_max": {"desc.block_table.indices_count": U32_MAX},
    "io_ndim_u32_max": {"desc.io.key.ndim": U32_MAX},
    "io_dtype_negative": {"desc.io.value.dtype": -1},
    "io_stride_overflow_64": {"desc.io.key.stride[0]": 1 << 61},
    "table_format_negative": {"desc.block_table.format": -2},
}


@conformance("robust.malformed.gather", CL_MALFORMED, REQUIRED, "robustness", "gather")
@pytest.mark.parametrize("which", list(GATHER_MALFORMED))
def test_malformed_gather(kvx_provider, kvx_call_options, which):
    opts = kvx_call_options()
    case = _gather(kvx_provider, opts.memory, GATHER_MALFORMED[which], which)
    verify_gather(kvx_provider, case, opts, clause=CL_MALFORMED, expect=INVALID)


KV_MALFORMED = {
    # 1 * 0x80000000 * 2 * 2 wraps to 0 in 32 bits
    "beam_count_wraps_32": {"desc.block_table.beam_width": 0x80000000, "desc.block_table.indices_count": 0},
    "bytes_per_block_wraps": {"cache.pool.bytes_per_block": 256 + (1 << 31)},
}


@conformance("robust.malformed.kv_offsets", CL_MALFORMED, REQUIRED, "robustness", "gather", feature="kv_offsets")
@pytest.mark.parametrize("which", list(KV_MALFORMED))
def test_malformed_kv_offsets(kvx_provider, kvx_call_options, which):
    opts = kvx_call_options()
    case = _kv_gather(kvx_provider, opts.memory, KV_MALFORMED[which], which)
    verify_gather(kvx_provider, case, opts, clause=CL_MALFORMED, feature="kv_offsets", expect=INVALID)


CACHE_MALFORMED = {
    "num_blocks_u32_max_shape_mismatch": {"cache.num_blocks": U32_MAX},
    "offset_overflows_64": {"cache.num_blocks": U32_MAX, "cache.k.shape[0]": U32_MAX, "cache.v.shape[0]": U32_MAX,
                            "cache.k.stride[0]": 1 << 40, "cache.v.stride[0]": 1 << 40},
    "shape_negative": {"cache.k.shape[3]": -8},
    "ndim_u32_max": {"cache.v.ndim": U32_MAX},
    "dtype_negative": {"cache.k.dtype": -1},
    "layout_huge": {"cache.k.layout": 0x7FFFFFFF},
    "memory_negative": {"cache.k.memory": -5, "cache.v.memory": -5},
}


@conformance("robust.malformed.cache", CL_MALFORMED, REQUIRED, "robustness", ("validate", "write"))
@pytest.mark.parametrize("which", list(CACHE_MALFORMED))
@pytest.mark.parametrize("op", ["validate", "write"])
def test_malformed_cache(kvx_provider, kvx_call_options, which, op):
    opts = kvx_call_options()
    ov = CACHE_MALFORMED[which]
    cache = _cache(kvx_provider, opts.memory, 13)
    if op == "validate":
        verify_validate(kvx_provider, cb.validate_case(cache, label=which, overrides=ov), opts, clause=CL_MALFORMED,
                        expect=INVALID)
    else:
        case = cb.write_case(cache, cb.spread_slots(G, 4, 14), seed=15, label=which, overrides=ov)
        verify_write(kvx_provider, case, opts, clause=CL_MALFORMED, expect=INVALID)


WRITE_MALFORMED = {
    "num_tokens_u32_max": {"desc.io.num_tokens": U32_MAX},
    "token_count_u32_max": {"desc.slots.token_count": U32_MAX},
    "io_heads_u32_max": {"desc.io.num_kv_heads": U32_MAX},
    "slot_dtype_negative": {"desc.slots.dtype": -7},
}


@conformance("robust.malformed.write", CL_MALFORMED, REQUIRED, "robustness", "write")
@pytest.mark.parametrize("which", list(WRITE_MALFORMED))
def test_malformed_write(kvx_provider, kvx_call_options, which):
    opts = kvx_call_options()
    case = cb.write_case(_cache(kvx_provider, opts.memory, 16), cb.spread_slots(G, 4, 17), seed=18, label=which,
                         overrides=WRITE_MALFORMED[which])
    verify_write(kvx_provider, case, opts, clause=CL_MALFORMED, expect=INVALID)


@conformance("robust.huge_consistent_descriptor",
             "spec 4.1, 6.1 (counts are uint32; slot arithmetic must not wrap in 32 bits); R-CACHE, R-WRITE, R-LARGE",
             REQUIRED, "robustness", ("validate", "write"), feature="large_cache")
@pytest.mark.parametrize("op", ["validate", "write"])
def test_huge_consistent_descriptor(kvx_provider, kvx_call_options, op):
    """num_blocks = 2^31 (so num_blocks * block_size = 2^33 does not fit 32 bits), buffers
    for the first 6 blocks only; the write touches slots inside them. Such a cache holds more
    than 2^31 elements and 2^24 slots: the feature ``large_cache``, which a provider may refuse
    (readings R-LARGE: "A provider may refuse such a cache ... it may never write or read the
    wrong elements"); a provider that serves it must not wrap."""
    opts = kvx_call_options()
    kind = cb.core_layout(kvx_provider, opts.memory)
    cache = _cache(kvx_provider, opts.memory, 19)
    nb = 1 << 31
    ov = {"cache.num_blocks": nb, "cache.k.shape[0]": nb, "cache.v.shape[0]": nb}
    label = f"{kind} cache claiming 2^31 blocks"
    if op == "validate":
        verify_validate(kvx_provider, cb.validate_case(cache, label=label, overrides=ov), opts,
                        clause="spec 4.1, 6.1; R-LARGE", expect=OK, feature="large_cache")
    else:
        case = cb.write_case(cache, [0, 5, G.num_slots - 1, -1, 7], slot_dtype=DType.S64, seed=20, label=label,
                             overrides=ov)
        verify_write(kvx_provider, case, opts, clause="spec 4.1, 6.1; R-WRITE, R-LARGE", expect=OK,
                     feature="large_cache")


# ---------------------------------------------------------------------------- zero-sized


@conformance("robust.zero.gather_null_pointers", "spec 6.10; R-GATHER (nothing to read: NULL allowed)", RECOMMENDED,
             "robustness", "gather")
def test_zero_gather_null_pointers(kvx_provider, kvx_call_options):
    opts = kvx_call_options()
    ov = {"desc.block_table.indices": None, "desc.seq_lens.lengths": None, "desc.io.key.data": None,
          "desc.io.value.data": None}
    case = cb.packed_gather(_cache(kvx_provider, opts.memory, 21), np.zeros((0, 2), np.int64), [], 8, seed=22,
                            label="seq_count 0, every pointer NULL", overrides=ov)
    verify_gather(kvx_provider, case, opts, clause="spec 6.10; R-GATHER", expect=OK)


@conformance("robust.zero.gather_zero_lengths", "spec 6.10; R-DATA", REQUIRED, "robustness", "gather")
def test_zero_lengths(kvx_provider, kvx_call_options):
    opts = kvx_call_options()
    case = cb.packed_gather(_cache(kvx_provider, opts.memory, 23), np.full((3, 2), -1, np.int64), [0, 0, 0], 4,
                            seed=24, label="every length 0, every table entry -1")
    verify_gather(kvx_provider, case, opts, clause="spec 6.10; R-DATA", expect=OK)


@conformance("robust.zero.write_zero_tokens_s32", "spec 5.2; R-WRITE (num_tokens == 0 is a no-op)", RECOMMENDED,
             "robustness", "write")
def test_zero_tokens_s32(kvx_provider, kvx_call_options):
    opts = kvx_call_options()
    case = cb.write_case(_cache(kvx_provider, opts.memory, 25, DType.BF16), [], slot_dtype=DType.S32, seed=26,
                         label="0 tokens, S32 slots", overrides={"desc.slots.slots": None})
    verify_write(kvx_provider, case, opts, clause="spec 5.2; R-WRITE", expect=OK)
