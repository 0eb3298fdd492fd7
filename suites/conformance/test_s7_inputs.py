"""Spec 7.2 (R-INPUTS): inputs are read-only.

``kvx_abi.h`` passes every descriptor as ``const``, and the caller owns every buffer
(spec 7.2): a provider reads the IO key and value of a write, its slots and scales, the
block table, indptr and sequence lengths of a gather, and the cache (and pools) a gather
or a validation looks at, and changes none of them. The executor keeps a copy of each of
these buffers and compares them after *every* call of every test (``checks.check_inputs``);
the tests here make that rule visible by name, with calls that touch each kind of input:
valid and invalid slots, S32 and S64 indices, per-tensor and per-head scales, and an
erroneous call (an input stays the caller's whatever the answer).

A call also reads no byte of an input past the elements its descriptors give (``token_count``
slots, ``indices_count`` ids, ``seq_count`` lengths, the IO rows' span): on host memory
``inputs.read_within_bounds`` places one input at a time so that it ends where an inaccessible
page begins, and a read past it (a vector load of the last elements with no tail loop) faults.
"""
from __future__ import annotations

import numpy as np
import pytest

from kvx_conformance.abi import buffers
from kvx_conformance.abi.descriptors import Geometry
from kvx_conformance.abi.dtypes import SHORT_NAMES as NAMES
from kvx_conformance.abi.header import DType, ScaleGranularity, Status
from kvx_conformance.cases import build as cb
from kvx_conformance.cases.checks import (
    CL_INPUTS,
    partial_gather,
    partial_write,
    verify_gather,
    verify_validate,
    verify_write,
)
from kvx_conformance.results.outcomes import REQUIRED, conformance

G = cb.GEOM
N = G.num_slots
ANY_STATUS = tuple(Status)
INDEX_DTYPES = pytest.mark.parametrize("index_dtype", [DType.S32, DType.S64], ids=["s32", "s64"])


def _cache(provider, memory, seed, dtype=DType.F16):
    return cb.simple_cache(G, cb.core_layout(provider, memory), dtype, seed=seed)


@conformance("inputs.write.unchanged", CL_INPUTS, REQUIRED, "core", "write")
@INDEX_DTYPES
def test_write_inputs_unchanged(kvx_provider, kvx_call_options, index_dtype):
    """Key, value and slots (valid, -1 and the invalid_slot sentinel) after a write."""
    opts = kvx_call_options()
    slots = cb.spread_slots(G, 9, seed=301, exclude={7}).tolist()
    slots[2], slots[6] = -1, 7  # a negative slot and the sentinel: both no-ops
    case = cb.write_case(_cache(kvx_provider, opts.memory, 302), slots, slot_dtype=index_dtype, invalid_slot=7,
                         seed=303, label="inputs after a write")
    verify_write(kvx_provider, case, opts, clause=CL_INPUTS)


@conformance("inputs.write.scales_unchanged", CL_INPUTS, REQUIRED, "core", "write")
def test_write_scales_unchanged(kvx_provider, kvx_call_options):
    """k_scale / v_scale pointers and scale-descriptor data (ignored by a non-FP8 cache, R-FP8) stay as given."""
    opts = kvx_call_options()
    case = cb.write_case(_cache(kvx_provider, opts.memory, 304), cb.spread_slots(G, 5, seed=305), seed=306,
                         k_scale=0.5, v_scale=2.0, k_scale_desc=cb.scale_spec([0.25]),
                         v_scale_desc=cb.scale_spec([4.0]), label="F16 cache, scale pointers and descriptors set")
    verify_write(kvx_provider, case, opts, clause=CL_INPUTS)


CL_ONE_BUFFER = ("spec 6.9 (io.key and io.value: the input K and V tensors), 7 (kvx_write_kv writes K/V for tokens "
                 "using a slot mapping), 7.2 (callers own the buffers; the inputs are const); R-INPUTS, R-WRITE")


def _one_buffer(case, label: str):
    """``case`` with its value tensor the key tensor itself (one buffer, one layout)."""
    case = cb.replace(case, value=case.key, value_layout=case.key_layout, value_is_key=True)
    return cb.replace(case, label=label)


@conformance("inputs.write.key_value_one_buffer", CL_ONE_BUFFER, REQUIRED, "core", "write")
def test_write_key_value_one_buffer(kvx_provider, kvx_call_options):
    """``io.key.data == io.value.data``: one input tensor for both (MLA's latent, which DeepSeek's models
    store as K and as V; a caller reusing a buffer). Inputs are only read, so nothing forbids it: K and V
    caches both receive the tensor's rows. A provider that takes one buffer for an MLA cache keeping a
    single copy, and leaves the V cache unwritten, fails here (every other write passes two buffers)."""
    opts = kvx_call_options()
    slots = cb.spread_slots(G, 10, seed=306).tolist()
    slots[4:4] = [-1]
    case = cb.write_case(_cache(kvx_provider, opts.memory, 307), slots, seed=308)
    verify_write(kvx_provider, _one_buffer(case, "io.value.data == io.key.data (one input buffer for K and V)"), opts,
                 clause=CL_ONE_BUFFER)


#: the engine-sized one-buffer writes: 320 blocks of 16 tokens, 2 heads of 32
ONE_BUFFER_BATCH = Geometry(num_blocks=320, block_size=16, num_kv_heads=2, head_dim=32)


@conformance("inputs.write.key_value_one_buffer_batch", CL_ONE_BUFFER + " - in engine-sized writes", REQUIRED, "core",
             "write")
@pytest.mark.parametrize("dtype,tokens", [(DType.F16, 160), (DType.F16, 4096), (DType.BF16, 4096), (DType.F32, 4096)],
                         ids=["f16-160", "f16-4096", "bf16-4096", "f32-4096"])
def test_write_key_value_one_buffer_batch(kvx_provider, kvx_call_options, dtype, tokens):
    """``inputs.write.key_value_one_buffer`` in a decode-sized batch (160 tokens) and a prefill chunk (4096
    tokens) of each baseline dtype, a few -1 slots: that test writes 11 tokens, so a bulk path taken past
    some token count that takes one buffer for a single-copy (MLA) cache and leaves the V cache as it was
    was never reached."""
    opts = kvx_call_options()
    g = ONE_BUFFER_BATCH
    cache = cb.simple_cache(g, cb.core_layout(kvx_provider, opts.memory), dtype, seed=330)
    slots = cb.spread_slots(g, tokens, 331).tolist()
    for i in (0, tokens // 2, tokens - 1):
        slots[i] = -1
    case = cb.write_case(cache, slots, seed=332)
    verify_write(kvx_provider, _one_buffer(case, f"{tokens}-token {NAMES[dtype]} write, io.value.data == io.key.data"),
                 opts, clause=CL_ONE_BUFFER)


CL_ONE_BUFFER_FP8 = CL_ONE_BUFFER + "; spec 4.3, 6.9 (each side quantized with its own scale descriptor); R-FP8"
#: (cache dtype, IO dtype, tokens, K scales, V scales, granularity): one input buffer, two scales
ONE_BUFFER_FP8 = [
    pytest.param(DType.F8_E4M3, DType.F16, 11, [0.5], [2.0], ScaleGranularity.PER_TENSOR, id="e4m3-io_f16-11"),
    pytest.param(DType.F8_E5M2, DType.BF16, 4096, [0.25, 3.0], [1.5, 0.125], ScaleGranularity.PER_HEAD,
                 id="e5m2-io_bf16-4096-per_head"),
    pytest.param(DType.F8_E4M3, DType.F32, 4096, [0.0173], [0.75], ScaleGranularity.PER_TENSOR, id="e4m3-io_f32-4096"),
]


@conformance("fp8.write.key_value_one_buffer", CL_ONE_BUFFER_FP8, REQUIRED, "fp8", "write", feature="fp8")
@pytest.mark.parametrize("dtype,io_dtype,tokens,k_scales,v_scales,gran", ONE_BUFFER_FP8)
def test_fp8_write_key_value_one_buffer(kvx_provider, kvx_call_options, dtype, io_dtype, tokens, k_scales, v_scales,
                                        gran):
    """A quantizing FP8 write whose key and value are one buffer, with K and V scales that differ: the
    K cache holds the rows divided by K's scales, the V cache the same rows divided by V's. A provider
    that sees one buffer, quantizes once and stores those bytes in both caches fails (every other FP8
    write passes two buffers, ``inputs.write.key_value_one_buffer`` writes an F16 cache)."""
    opts = kvx_call_options()
    g = ONE_BUFFER_BATCH
    cache = cb.simple_cache(g, cb.core_layout(kvx_provider, opts.memory), dtype, seed=333)
    slots = cb.spread_slots(g, tokens, 334).tolist()
    slots[tokens // 2] = -1
    case = cb.write_case(cache, slots, io_dtype=io_dtype, seed=335, k_scale_desc=cb.scale_spec(k_scales, gran),
                         v_scale_desc=cb.scale_spec(v_scales, gran))
    label = (f"{tokens}-token {NAMES[io_dtype]} -> {NAMES[dtype]} write, io.value.data == io.key.data, "
             f"K scales {k_scales}, V scales {v_scales} ({gran.name})")
    verify_write(kvx_provider, _one_buffer(case, label), opts, clause=CL_ONE_BUFFER_FP8, feature="fp8")


@conformance("inputs.write.fp8_scales_unchanged", CL_INPUTS, REQUIRED, "fp8", "write", feature="fp8")
def test_write_fp8_scales_unchanged(kvx_provider, kvx_call_options):
    """Per-head scale descriptors of an FP8 write (the scales the write divides by) stay as given."""
    opts = kvx_call_options()
    cache = _cache(kvx_provider, opts.memory, 307, DType.F8_E4M3)
    case = cb.write_case(cache, cb.spread_slots(G, 5, seed=308), seed=309, io_dtype=DType.F32,
                         k_scale=3.0, v_scale=3.0,
                         k_scale_desc=cb.scale_spec([0.5, 1.5], ScaleGranularity.PER_HEAD),
                         v_scale_desc=cb.scale_spec([2.0, 0.75], ScaleGranularity.PER_HEAD),
                         label="F8_E4M3 cache, per-head scales")
    verify_write(kvx_provider, case, opts, clause=CL_INPUTS, feature="fp8")


@conformance("inputs.write.unchanged_on_error", CL_INPUTS, REQUIRED, "core", "write")
def test_write_inputs_unchanged_on_error(kvx_provider, kvx_call_options):
    """An out-of-range slot: whatever the status, the inputs are the caller's."""
    opts = kvx_call_options()
    slots = [*cb.spread_slots(G, 4, seed=310), N + 1]
    case = cb.write_case(_cache(kvx_provider, opts.memory, 311), slots, seed=312,
                         label=f"slot {N + 1} out of range")
    verify_write(kvx_provider, case, opts, clause=CL_INPUTS, statuses=ANY_STATUS, partial=partial_write(case))


@conformance("inputs.gather.packed_unchanged", CL_INPUTS, REQUIRED, "core", "gather")
@INDEX_DTYPES
def test_gather_packed_inputs_unchanged(kvx_provider, kvx_call_options, index_dtype):
    """Block table, seq_lens and the cache after a PACKED gather."""
    opts = kvx_call_options()
    case = cb.packed_gather(_cache(kvx_provider, opts.memory, 313), cb.distinct_table(G, 3, 2, 314), [5, 8, 0], 8,
                            seed=315, index_dtype=index_dtype, lens_dtype=index_dtype,
                            label="inputs after a PACKED gather")
    verify_gather(kvx_provider, case, opts, clause=CL_INPUTS)


@conformance("inputs.gather.unchanged_on_error", CL_INPUTS, REQUIRED, "core", "gather")
def test_gather_inputs_unchanged_on_error(kvx_provider, kvx_call_options):
    """A used block id out of range: whatever the status, table, lengths and cache are unchanged."""
    opts = kvx_call_options()
    table = cb.distinct_table(G, 2, 2, 316)
    table[1, 1] = G.num_blocks
    case = cb.packed_gather(_cache(kvx_provider, opts.memory, 317), table, [6, 7], 8, seed=318,
                            label=f"used block id {G.num_blocks} out of range")
    verify_gather(kvx_provider, case, opts, clause=CL_INPUTS, statuses=ANY_STATUS, partial=partial_gather(case))


@conformance("inputs.gather.ragged_unchanged", CL_INPUTS, REQUIRED, "tables", "gather", feature="ragged")
@INDEX_DTYPES
def test_gather_ragged_inputs_unchanged(kvx_provider, kvx_call_options, index_dtype):
    """Indices, indptr, seq_lens and the cache after a RAGGED gather."""
    opts = kvx_call_options()
    case = cb.ragged_gather(_cache(kvx_provider, opts.memory, 319), cb.distinct_table(G, 2, 2, 320), [5, 7], 8,
                            seed=321, index_dtype=index_dtype, indptr_dtype=index_dtype, lens_dtype=index_dtype,
                            extra=1, label="inputs after a RAGGED gather")
    verify_gather(kvx_provider, case, opts, clause=CL_INPUTS, feature="ragged")


@conformance("inputs.gather.kv_offsets_unchanged", CL_INPUTS, REQUIRED, "tables", "gather", feature="kv_offsets")
def test_gather_kv_offsets_inputs_unchanged(kvx_provider, kvx_call_options):
    """Offsets, seq_lens, the cache and both pools after a KV_OFFSETS gather (the table names
    primary blocks only: a secondary-pool index is the optional feature secondary_pool, which
    this required test leaves out; the secondary pool is still given and must stay unchanged)."""
    opts = kvx_call_options()
    c = cb.kv_offsets_cache(G, DType.F16, primary_blocks=6, secondary_blocks=3, seed=322)
    t = cb.layout(G, cb.core_layout(kvx_provider, opts.memory), DType.F16)
    cache = cb.replace(c, k=t, v=t, k_init=cb.finite_values(cb.rng_for(325), DType.F16, t.span_elements()),
                       v_init=cb.finite_values(cb.rng_for(326), DType.F16, t.span_elements()))
    off = np.array([[[[0, 4], [5, 1]]], [[[2, 3], [0, 2]]]], dtype=np.int64)
    case = cb.kv_offsets_gather(cache, off, [7, 6], 8, seed=323, label="inputs after a KV_OFFSETS gather")
    verify_gather(kvx_provider, case, opts, clause=CL_INPUTS, feature="kv_offsets")


@conformance("inputs.validate.cache_unchanged", CL_INPUTS, REQUIRED, "core", "validate")
def test_validate_leaves_cache(kvx_provider, kvx_call_options):
    """kvx_validate_cache_desc only looks: the cache tensors are unchanged."""
    opts = kvx_call_options()
    verify_validate(kvx_provider, cb.validate_case(_cache(kvx_provider, opts.memory, 324), label="valid cache"),
                    opts, clause=CL_INPUTS)


CL_BOUNDS = ("spec 7.2 (callers own the buffers passed via descriptors), 6.3, 6.4, 6.5, 6.8 (token_count slots, "
             "indices_count ids, seq_count lengths, IO tensors of the described shape and strides); R-INPUTS "
             "(a call reads no byte of an input past what its descriptors describe)")
#: (operation, input, pointer field, index dtype): each input placed alone at an inaccessible page
BOUNDS = {
    "write-slots_s32": ("write", "slots", "desc.slots.slots", DType.S32),
    "write-slots_s64": ("write", "slots", "desc.slots.slots", DType.S64),
    "write-key": ("write", "key", "desc.io.key.data", DType.S64),
    "write-value": ("write", "value", "desc.io.value.data", DType.S64),
    "gather-indices_s32": ("gather", "indices", "desc.block_table.indices", DType.S32),
    "gather-indices_s64": ("gather", "indices", "desc.block_table.indices", DType.S64),
    "gather-seq_lens_s32": ("gather", "seq_lens", "desc.seq_lens.lengths", DType.S32),
    "gather-seq_lens_s64": ("gather", "seq_lens", "desc.seq_lens.lengths", DType.S64),
}


@conformance("inputs.read_within_bounds", CL_BOUNDS, REQUIRED, "core", ("write", "gather"))
@pytest.mark.kvx_memory_types("host")  # the inaccessible page is a host page
@pytest.mark.parametrize("which", list(BOUNDS))
def test_inputs_read_within_bounds(kvx_provider, kvx_call_options, which):
    """5 slots (a count no vector width divides), 5 IO rows, 3 sequences of 3 table entries: one
    input at a time ends at an inaccessible page (its pointer in the descriptor replaced by that
    copy, the values unchanged). A provider that loads slots, ids or lengths 4, 8 or 16 at a time
    with no tail loop reads past the buffer the caller gave and crashes here (on a GPU, the same
    load reads another allocation or faults); the guarded buffers of the other tests hide such a
    read behind readable guard bytes."""
    op, name, field, index_dtype = BOUNDS[which]
    opts = kvx_call_options()
    cache = _cache(kvx_provider, opts.memory, 330)
    if op == "write":
        case = cb.write_case(cache, cb.spread_slots(G, 5, seed=331), slot_dtype=index_dtype, seed=332,
                             label=f"5-token write, {name} ending at an inaccessible page")
        data = {"slots": case.slots.encoded(), "key": case.key, "value": case.value}[name]
    else:
        case = cb.packed_gather(cache, cb.distinct_table(G, 3, 3, 333), [9, 12, 5], 12, seed=334,
                                index_dtype=index_dtype, lens_dtype=index_dtype,
                                label=f"3-sequence PACKED gather, {name} ending at an inaccessible page")
        data = case.table.encoded_indices() if name == "indices" else case.seq_lens.encoded()
    placed = buffers.EndsAtInaccessiblePage(data)
    case = cb.replace(case, c_overrides={**case.c_overrides, field: placed.ptr},
                      label=f"{case.label} ({placed.nbytes} bytes at 0x{placed.ptr:x}, {field})")
    if op == "write":
        verify_write(kvx_provider, case, opts, clause=CL_BOUNDS)
    else:
        verify_gather(kvx_provider, case, opts, clause=CL_BOUNDS)
    del placed  # alive until the call and its checks are done


#: (table input, pointer field, index dtype) of the RAGGED gather placed at an inaccessible page
RAGGED_BOUNDS = {
    "indices_s32": ("indices", "desc.block_table.indices", DType.S32),
    "indices_s64": ("indices", "desc.block_table.indices", DType.S64),
    "indptr_s32": ("indptr", "desc.block_table.indptr", DType.S32),
    "indptr_s64": ("indptr", "desc.block_table.indptr", DType.S64),
    "seq_lens_s64": ("seq_lens", "desc.seq_lens.lengths", DType.S64),
}


def _bounded_gather(provider, opts, case, data, field: str, name: str, feature: str) -> None:
    """``case`` with its ``field`` pointing at a copy of ``data`` that ends at an inaccessible page."""
    placed = buffers.EndsAtInaccessiblePage(data)
    case = cb.replace(case, c_overrides={**case.c_overrides, field: placed.ptr},
                      label=f"{case.label}, {name} ending at an inaccessible page ({placed.nbytes} bytes at "
                            f"0x{placed.ptr:x}, {field})")
    verify_gather(provider, case, opts, clause=CL_BOUNDS, feature=feature)
    del placed  # alive until the call and its checks are done


@conformance("inputs.read_within_bounds_ragged", CL_BOUNDS + "; R-DATA (RAGGED: never reads past indices_count)",
             REQUIRED, "tables", "gather", feature="ragged")
@pytest.mark.kvx_memory_types("host")  # the inaccessible page is a host page
@pytest.mark.parametrize("which", list(RAGGED_BOUNDS))
def test_inputs_read_within_bounds_ragged(kvx_provider, kvx_call_options, which):
    """``inputs.read_within_bounds`` for a RAGGED gather: 4 sequences (5 indptr entries, 29 ids: counts no
    vector width divides), one of its indices, indptr or lengths ending at an inaccessible page. A
    provider that loads a RAGGED table's ids or offsets several at a time with no tail loop crashes
    here; every other RAGGED gather's table lies in readable guard bytes."""
    name, field, index_dtype = RAGGED_BOUNDS[which]
    opts = kvx_call_options()
    case = cb.ragged_gather(_cache(kvx_provider, opts.memory, 335), cb.distinct_table(G, 4, 3, 336), [9, 12, 5, 3],
                            12, seed=337, index_dtype=index_dtype, indptr_dtype=index_dtype, lens_dtype=index_dtype,
                            label="4-sequence RAGGED gather")
    data = {"indices": case.table.encoded_indices(), "indptr": case.table.encoded_indptr(),
            "seq_lens": case.seq_lens.encoded()}[name]
    _bounded_gather(kvx_provider, opts, case, data, field, name, "ragged")


@conformance("inputs.read_within_bounds_kv_offsets", CL_BOUNDS, REQUIRED, "tables", "gather", feature="kv_offsets")
@pytest.mark.kvx_memory_types("host")  # the inaccessible page is a host page
@pytest.mark.parametrize("which", ["offsets", "seq_lens"])
def test_inputs_read_within_bounds_kv_offsets(kvx_provider, kvx_call_options, which):
    """``inputs.read_within_bounds`` for a KV_OFFSETS gather: 3 sequences of 3 blocks (18 S32 offsets, K and
    V), its offsets or its 3 lengths ending at an inaccessible page."""
    opts = kvx_call_options()
    c = cb.kv_offsets_cache(G, DType.F16, primary_blocks=6, seed=338)
    t = cb.layout(G, cb.core_layout(kvx_provider, opts.memory), DType.F16)
    cache = cb.replace(c, k=t, v=t, k_init=cb.finite_values(cb.rng_for(339), DType.F16, t.span_elements()),
                       v_init=cb.finite_values(cb.rng_for(340), DType.F16, t.span_elements()))
    off = cb.rng_for(341).integers(0, 6, size=(3, 1, 2, 3))
    case = cb.kv_offsets_gather(cache, off, [12, 7, 9], 12, seed=342, label="3-sequence KV_OFFSETS gather")
    if which == "offsets":
        _bounded_gather(kvx_provider, opts, case, case.table.encoded_indices(), "desc.block_table.indices",
                        "offsets", "kv_offsets")
    else:
        _bounded_gather(kvx_provider, opts, case, case.seq_lens.encoded(), "desc.seq_lens.lengths", "seq_lens",
                        "kv_offsets")
