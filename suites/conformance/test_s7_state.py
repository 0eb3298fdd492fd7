"""Spec 7.2 ("The API is stateless aside from user-provided buffers"), 5.2, 5.1: calls that
reuse the caller's buffers, and batches of engine size.

- Engines keep persistent input buffers (a slot mapping, a block table, sequence lengths
  that CUDA-graph replays read at fixed addresses) and rewrite their contents between
  calls. A sequence of calls here passes the same pointers and descriptors each time with
  new contents (``execute.run_write_sequence`` / ``run_gather_sequence``); every call must
  act on what the buffers hold at that call, so a provider that keeps what it decoded from
  a pointer (a cache keyed by address) is seen.
- A call made again is made again: the same write or gather three times through the same
  buffers and contents, the caller rewriting the cache's written slots or the gather's outputs
  between them, must do its work each time; a provider that remembers the calls it has made and
  skips one it has seen (a benchmark repeats identical calls) leaves the rewritten contents.
- The cache descriptor is the call's too: memory described as NHD in one call and as HND in the
  next (the same pointers, geometry and dtype) is addressed by each call's own descriptor.
- FP8 scales are user buffers too (vLLM's ``k_scale`` / ``v_scale`` tensors, rewritten in place
  when the scales are calibrated): three FP8 writes through the same scale buffers with new values
  each time must each quantize by the values the buffers hold at that call.
- A prefill write of 4096 tokens and a decode gather of 320 sequences: every token and
  every sequence of a call is served, not only the first tile of them; the prefill write's
  padding tokens carry a non-negative ``invalid_slot`` too, a no-op at any batch size, and an
  ``invalid_slot`` outside int32 makes no live S32 slot a no-op; S64 lengths past int32 in the
  decode batches gather ``min(L, max_seq_len)`` tokens.
- A write of 65600 tokens: more tokens than a 16-bit grid dimension (65535) holds, so a
  kernel that launches one grid row per token with ``gridDim.y`` capped drops the tail.
"""
from __future__ import annotations

import pytest

from kvx_conformance.abi.descriptors import Geometry
from kvx_conformance.abi.dtypes import np_dtype
from kvx_conformance.abi.header import DType, ScaleGranularity, Status
from kvx_conformance.cases import build as cb
from kvx_conformance import reference_impl as oracle
from kvx_conformance.cases.checks import (OracleDisagrees, check_arrays, check_guards, check_status, verify_gather,
                                          verify_write)
from kvx_conformance.cases.execute import run_gather_sequence, run_validate_sequence, run_write_sequence
from kvx_conformance.results.outcomes import REQUIRED, conformance

CL_STATE = ("spec 7.2 (the API is stateless aside from user-provided buffers); 5.2 (the slot of each token in "
            "the write batch); 5.1, 5.3 (the block table and lengths of the call)")
CL_BATCH = "spec 7 (kvx_write_kv writes K/V for tokens using a slot mapping; kvx_gather_kv gathers K/V), 5.1, 5.2"
G = Geometry(num_blocks=16, block_size=8, num_kv_heads=2, head_dim=16)
CALLS = 3


def _judge_sequence(results, expected, cases, clause: str) -> None:
    for i, (got, exp, case) in enumerate(zip(results, expected, cases)):
        check_status(got.status, Status.OK, clause=clause, case=case, what=f"status of call {i + 1} of {len(cases)}")
        check_guards(got, clause=clause, case=case)
        check_arrays(got, exp, case, clause=clause,
                     what=f"call {i + 1} of {len(cases)} through the same buffers differs from the reference")


def _judge_write_chain(provider, opts, cache, make_case, clause: str) -> None:
    """Writes ``make_case(i, cache)`` for i < CALLS, each case built on the cache the previous call
    leaves (the oracle's), made through one set of buffers (``run_write_sequence``) and judged call
    by call."""
    cases, expected = [], []
    for i in range(CALLS):
        case = make_case(i, cache)
        exp = oracle.expected_write(case, opts.memory)
        cases.append(case)
        expected.append(exp)
        cache = cb.replace(cache, k_init=exp.arrays["k"], v_init=exp.arrays["v"])
    _judge_sequence(run_write_sequence(provider, cases, opts), expected, cases, clause)


@conformance("state.persistent_slots", CL_STATE, REQUIRED, "core", "write")
@pytest.mark.parametrize("slot_dtype", [DType.S32, DType.S64], ids=["s32", "s64"])
def test_persistent_slot_mapping(kvx_provider, kvx_call_options, slot_dtype):
    """Three writes through one slot-mapping buffer (and one set of IO rows) whose contents change
    between the calls; each call's slots overlap the previous call's on purpose."""
    opts = kvx_call_options()
    cache = cb.simple_cache(G, cb.core_layout(kvx_provider, opts.memory), DType.F16, seed=301)

    def make_case(i, cache):
        slots = cb.spread_slots(G, 24, 310 + i).tolist()
        slots[5] = -1  # an invalid slot, a no-op (5.2)
        return cb.write_case(cache, slots, seed=320 + i, slot_dtype=slot_dtype,
                             label=f"call {i + 1} of {CALLS} through one slots buffer: slots {slots[:6]}...")

    _judge_write_chain(kvx_provider, opts, cache, make_case, CL_STATE)


@conformance("state.persistent_table", CL_STATE, REQUIRED, "core", "gather")
def test_persistent_block_table(kvx_provider, kvx_call_options):
    """Three PACKED gathers through one block-table buffer and one lengths buffer whose contents
    change between the calls (other blocks, other lengths), into the same outputs."""
    opts = kvx_call_options()
    cache = cb.simple_cache(G, cb.core_layout(kvx_provider, opts.memory), DType.F16, seed=330)
    cases = []
    for i in range(CALLS):
        table = cb.distinct_table(G, 3, 4, 340 + i)
        lens = [[32, 9, 17], [5, 32, 24], [20, 1, 31]][i]
        cases.append(cb.packed_gather(cache, table, lens, 32, seed=350 + i,
                                      label=f"call {i + 1} of {CALLS} through one table buffer: rows {table[:, 0]}"))
    expected = [oracle.expected_gather(c, opts.memory) for c in cases]
    _judge_sequence(run_gather_sequence(kvx_provider, cases, opts), expected, cases, CL_STATE)


@conformance("state.persistent_table_batch", CL_STATE, REQUIRED, "core", "gather")
def test_persistent_block_table_batch(kvx_provider, kvx_call_options):
    """``state.persistent_table`` with a decode batch of 24 sequences (a CUDA graph's captured batch):
    three PACKED gathers through one table buffer whose rows change between the calls while its first
    entry (sequence 0's first block) and its last (the padding id 0 ending the last row, unused) stay
    the same. A provider that keeps the table it decoded from an address and checks only its ends
    before reusing it gathers the first call's blocks three times."""
    opts = kvx_call_options()
    cache = cb.simple_cache(G, cb.core_layout(kvx_provider, opts.memory), DType.F16, seed=360)
    seqs, mb = 24, 3
    msl = mb * G.block_size
    cases = []
    for i in range(CALLS):
        table = cb.distinct_table(G, seqs, mb, 361 + i)
        table[0, 0], table[-1, -1] = 5, 0
        lens = cb.rng_for(364 + i).integers(1, msl + 1, seqs)
        lens[-1] = min(int(lens[-1]), (mb - 1) * G.block_size)  # the last row's last entry is padding
        cases.append(cb.packed_gather(cache, table, lens.tolist(), msl, seed=367 + i,
                                      label=f"call {i + 1} of {CALLS} through one table buffer of {seqs} rows, "
                                            f"first and last entries unchanged: rows {table[1:4, 0]}..."))
    expected = [oracle.expected_gather(c, opts.memory) for c in cases]
    _judge_sequence(run_gather_sequence(kvx_provider, cases, opts), expected, cases, CL_STATE)


CL_REPEAT = ("spec 7.2 (the API is stateless aside from user-provided buffers: a call acts on what its buffers "
             "hold when it is made, so a call made again does its work again); 7 (kvx_write_kv writes K/V for "
             "tokens using a slot mapping; kvx_gather_kv gathers K/V); R-STATE")


@conformance("state.repeated_write", CL_REPEAT, REQUIRED, "core", "write")
def test_repeated_write(kvx_provider, kvx_call_options):
    """The same write three times through the same buffers and descriptors (the same pointers, slots
    and rows), the caller putting the cache back to what it held before the first call between them
    (an engine re-running a step; a benchmark repeating one call): every call stores the rows again.
    A provider that remembers the calls it has made (descriptors and slots) and answers OK without
    work for one it has seen leaves the restored contents in the slots."""
    opts = kvx_call_options()
    cache = cb.simple_cache(G, cb.core_layout(kvx_provider, opts.memory), DType.F16, seed=370)
    slots = cb.spread_slots(G, 24, 371).tolist()
    slots[3] = -1  # an invalid slot, a no-op (5.2)
    first = cb.write_case(cache, slots, seed=372)
    cases = [cb.replace(first, label=f"call {i + 1} of {CALLS}, the same write (slots {slots[:6]}...)"
                                      + (", the cache given its contents before call 1 again first" if i else ""))
             for i in range(CALLS)]
    expected = [oracle.expected_write(c, opts.memory) for c in cases]
    _judge_sequence(run_write_sequence(kvx_provider, cases, opts, reset_cache=True), expected, cases, CL_REPEAT)


@conformance("state.repeated_gather", CL_REPEAT, REQUIRED, "core", "gather")
def test_repeated_gather(kvx_provider, kvx_call_options):
    """The same PACKED gather three times through the same buffers and descriptors (the same table,
    lengths and outputs), the caller overwriting the outputs between them: every call gathers the
    rows again. A provider that skips a call it has seen leaves the overwritten outputs."""
    opts = kvx_call_options()
    cache = cb.simple_cache(G, cb.core_layout(kvx_provider, opts.memory), DType.F16, seed=373)
    table = cb.distinct_table(G, 3, 4, 374)
    first = cb.packed_gather(cache, table, [32, 11, 20], 32, seed=375)
    cases = [cb.replace(first, label=f"call {i + 1} of {CALLS}, the same gather (rows {table[:, 0]}...)"
                                      + (", the outputs overwritten first" if i else ""))
             for i in range(CALLS)]
    expected = [oracle.expected_gather(c, opts.memory) for c in cases]
    _judge_sequence(run_gather_sequence(kvx_provider, cases, opts), expected, cases, CL_REPEAT)


CL_STATE_DESC = ("spec 7.2 (the API is stateless aside from user-provided buffers); 4.2 (the layout and strides "
                 "the call's cache descriptor gives; implementations MUST honor provided strides); R-STATE, R-CACHE")


def _dims_overrides(prefix: str, t) -> dict:
    """The tensor descriptor at ``prefix`` (e.g. ``cache.k``, ``desc.io.key``) given ``t``'s ndim, shape and
    strides, every one of the five dimensions set (0 past ``t``'s), so that a call of a sequence does not
    inherit the previous call's."""
    ov: dict = {f"{prefix}.ndim": len(t.shape)}
    for i in range(5):
        ov[f"{prefix}.shape[{i}]"] = int(t.shape[i]) if i < len(t.shape) else 0
        ov[f"{prefix}.stride[{i}]"] = int(t.stride[i]) if i < len(t.stride) else 0
    return ov


def _cache_layout_overrides(t) -> dict:
    """``cache.k`` / ``cache.v`` layout, shape and strides set to ``t`` (every dimension)."""
    ov: dict = {}
    for side in ("k", "v"):
        ov[f"cache.{side}.layout"] = int(t.layout)
        ov.update(_dims_overrides(f"cache.{side}", t))
    return ov


@conformance("state.cache_descriptor_per_call", CL_STATE_DESC, REQUIRED, "core", "write")
def test_cache_descriptor_per_call(kvx_provider, kvx_call_options):
    """Three writes into one pair of cache buffers (same pointers, geometry and dtype) described as
    NHD, then HND, then NHD again (memory an engine hands to another layer or model, a caching
    allocator's block given out again): each call addresses the cache by the descriptor it passes.
    A provider that keeps a plan per cache address (the layout and strides first seen with those
    pointers) writes the HND call at NHD offsets. NHD and HND are each first written alone: the
    layout other than the provider's core one is an optional feature, and a refusal of it there is
    excused."""
    opts = kvx_call_options()
    for kind in ("nhd", "hnd"):
        alone = cb.write_case(cb.simple_cache(G, kind, DType.F16, seed=400), cb.spread_slots(G, 10, 401), seed=402,
                              label=f"{kind.upper()} write alone")
        verify_write(kvx_provider, alone, opts, clause=CL_STATE_DESC, feature=kind)
    kinds = ["nhd", "hnd", "nhd"]

    def make_case(i, cache):
        lay = cb.layout(G, kinds[i], DType.F16)
        return cb.write_case(cb.replace(cache, k=lay, v=lay), cb.spread_slots(G, 10, 404 + i), seed=407 + i,
                             overrides=_cache_layout_overrides(lay),
                             label=f"call {i + 1} of {CALLS} into one pair of cache buffers: described as "
                                   f"{kinds[i].upper()} (strides {lay.stride})")

    _judge_write_chain(kvx_provider, opts, cb.simple_cache(G, "nhd", DType.F16, seed=403), make_case, CL_STATE_DESC)


#: G's buffers described with half the block size and twice the blocks (the same bytes, canonical strides)
G_HALF = Geometry(num_blocks=2 * G.num_blocks, block_size=G.block_size // 2, num_kv_heads=G.num_kv_heads,
                  head_dim=G.head_dim)


@conformance("state.cache_geometry_per_call", CL_STATE_DESC, REQUIRED, "core", "gather")
def test_cache_geometry_per_call(kvx_provider, kvx_call_options):
    """Three PACKED gathers from one pair of cache buffers in the provider's core layout, described
    with blocks of 8 tokens, then of 4 (twice the blocks, the same bytes), then of 8 again: an
    allocator's pages handed to a layer of another block size, as hybrid models do. Each call reads
    the cache by the geometry its descriptor gives (token t of a sequence: block ``table[t / block_size]``,
    offset ``t % block_size``). A provider that keeps a plan per cache address (the block size first
    seen with those pointers) reads the second call's blocks at the first geometry's offsets.
    ``state.cache_descriptor_per_call`` checks the same with NHD against HND; this one needs no layout
    but the core one, so a provider serving one layout is held to it too. (A write would not do: in
    NHD a slot's offset does not depend on the block size.)"""
    opts = kvx_call_options()
    kind = cb.core_layout(kvx_provider, opts.memory)
    cache = cb.simple_cache(G, kind, DType.F16, seed=413)
    cases = []
    for i, g in enumerate([G, G_HALF, G]):
        lay = cb.layout(g, kind, DType.F16)
        ov = {**_cache_layout_overrides(lay), "cache.num_blocks": g.num_blocks, "cache.block_size": g.block_size}
        table = cb.distinct_table(g, 3, 4, 414 + i)
        lens = [[16, 9, 13], [5, 16, 12], [14, 1, 16]][i]
        cases.append(cb.packed_gather(cb.replace(cache, geom=g, k=lay, v=lay), table, lens, 16, seed=417 + i,
                                      overrides=ov,
                                      label=f"call {i + 1} of {CALLS} from one pair of cache buffers: {kind.upper()}, "
                                            f"{g.num_blocks} blocks of {g.block_size} tokens (strides {lay.stride}), "
                                            f"rows {table[:, 0]}"))
    expected = [oracle.expected_gather(c, opts.memory) for c in cases]
    _judge_sequence(run_gather_sequence(kvx_provider, cases, opts), expected, cases, CL_STATE_DESC)


@conformance("state.cache_layout_per_call_gather", CL_STATE_DESC, REQUIRED, "core", "gather")
def test_cache_layout_per_call_gather(kvx_provider, kvx_call_options):
    """``state.cache_descriptor_per_call`` for gathers: three PACKED gathers from one pair of cache
    buffers described as NHD, then HND, then NHD again; each call reads the cache by the layout and
    strides its descriptor gives. A provider that keeps a gather plan per cache address (the layout
    first seen with those pointers) reads the HND call at NHD offsets; the write test does not see a
    plan kept by the gather path alone. NHD and HND are each first gathered alone: the layout other
    than the provider's core one is an optional feature, and a refusal of it there is excused."""
    opts = kvx_call_options()
    lens = [[16, 9, 13], [5, 16, 12], [14, 1, 16]]
    for kind in ("nhd", "hnd"):
        alone = cb.packed_gather(cb.simple_cache(G, kind, DType.F16, seed=420), cb.distinct_table(G, 3, 4, 421),
                                 lens[0], 16, seed=422, label=f"{kind.upper()} gather alone")
        verify_gather(kvx_provider, alone, opts, clause=CL_STATE_DESC, feature=kind)
    cache = cb.simple_cache(G, "nhd", DType.F16, seed=423)
    cases = []
    for i, kind in enumerate(["nhd", "hnd", "nhd"]):
        lay = cb.layout(G, kind, DType.F16)
        table = cb.distinct_table(G, 3, 4, 424 + i)
        cases.append(cb.packed_gather(cb.replace(cache, k=lay, v=lay), table, lens[i], 16, seed=427 + i,
                                      overrides=_cache_layout_overrides(lay),
                                      label=f"call {i + 1} of {CALLS} from one pair of cache buffers: described as "
                                            f"{kind.upper()} (strides {lay.stride}), rows {table[:, 0]}"))
    expected = [oracle.expected_gather(c, opts.memory) for c in cases]
    _judge_sequence(run_gather_sequence(kvx_provider, cases, opts), expected, cases, CL_STATE_DESC)


CL_STATE_DTYPE = ("spec 7.2 (the API is stateless aside from user-provided buffers); 4.3 (the cache dtype the "
                  "call's descriptor gives); R-STATE, R-CONVERT")


@conformance("state.cache_dtype_per_call", CL_STATE_DTYPE, REQUIRED, "core", "write", feature="mixed_io_dtype")
def test_cache_dtype_per_call(kvx_provider, kvx_call_options):
    """Three writes of F32 rows into one pair of cache buffers in the provider's core layout,
    described as F16, then BF16, then F16 again (the same bytes: an allocator's pages handed to a layer
    of another dtype); each call converts to the dtype its descriptor gives (R-CONVERT). A provider
    that keeps a conversion plan per cache address (the dtype first seen with those pointers) stores
    F16 bits in the BF16 call. Each dtype is first written alone; a refusal of converting writes is
    excused (``mixed_io_dtype``)."""
    opts = kvx_call_options()
    kind = cb.core_layout(kvx_provider, opts.memory)
    for dt in (DType.F16, DType.BF16):
        alone = cb.write_case(cb.simple_cache(G, kind, dt, seed=430), cb.spread_slots(G, 10, 431), io_dtype=DType.F32,
                              seed=432, label=f"f32 -> {dt.name.lower()} write alone")
        verify_write(kvx_provider, alone, opts, clause=CL_STATE_DTYPE, feature="mixed_io_dtype")
    dts = [DType.F16, DType.BF16, DType.F16]

    def make_case(i, cache):
        dt = dts[i]
        lay = cb.layout(G, kind, dt)
        same_bytes = cb.replace(cache, k=lay, v=lay, k_init=cache.k_init.view(np_dtype(dt)),
                                v_init=cache.v_init.view(np_dtype(dt)))
        return cb.write_case(same_bytes, cb.spread_slots(G, 10, 434 + i), io_dtype=DType.F32, seed=437 + i,
                             overrides={"cache.k.dtype": int(dt), "cache.v.dtype": int(dt)},
                             label=f"call {i + 1} of {CALLS} into one pair of cache buffers: f32 rows, the cache "
                                   f"described as {dt.name.lower()}")

    _judge_write_chain(kvx_provider, opts, cb.simple_cache(G, kind, DType.F16, seed=433), make_case, CL_STATE_DTYPE)


#: ``G``'s bytes as an F32 cache: the same blocks and heads, half the dims (16 x 8 x 2 x 8 F32 = 16 x 8 x 2 x 16 F16)
G_F32 = Geometry(num_blocks=G.num_blocks, block_size=G.block_size, num_kv_heads=G.num_kv_heads, head_dim=G.head_dim // 2)


def _write_desc_overrides(case) -> dict:
    """Every field of ``case``'s cache and IO descriptors that a call of a sequence changes (dtypes, head_dim,
    layout, shapes, strides), so that the call does not inherit the previous call's (the sequence reuses the first
    call's structs)."""
    ov = {**_cache_layout_overrides(case.cache.k), "cache.head_dim": case.cache.geom.head_dim,
          "cache.k.dtype": int(case.cache.k.dtype), "cache.v.dtype": int(case.cache.v.dtype),
          "desc.io.head_dim": case.cache.geom.head_dim}
    for side, io in (("key", case.key_layout), ("value", case.value_layout)):
        ov[f"desc.io.{side}.dtype"] = int(io.dtype)
        ov.update(_dims_overrides(f"desc.io.{side}", io))
    return ov


@conformance("state.cache_dtype_per_call_copy", CL_STATE_DTYPE, REQUIRED, "core", "write")
def test_cache_dtype_per_call_copy(kvx_provider, kvx_call_options):
    """``state.cache_dtype_per_call`` without a conversion: three writes into one pair of cache buffers in the
    provider's core layout, described as F16 (2 heads x 16), then as F32 of 2 heads x 8 (the same bytes: an
    allocator's pages handed to a layer of another dtype), then as F16 again, each with rows of the cache's dtype
    (a copy). A provider that keeps a plan per cache allocation (the element type first seen with those pointers)
    stores the F32 call's rows as F16. That test converts F32 rows, a call a provider may refuse
    (``mixed_io_dtype``), so such a plan certified beside that refusal; this one needs no optional feature."""
    opts = kvx_call_options()
    kind = cb.core_layout(kvx_provider, opts.memory)
    dts = [(DType.F16, G), (DType.F32, G_F32), (DType.F16, G)]

    def make_case(i, cache):
        dt, g = dts[i]
        lay = cb.layout(g, kind, dt)
        same_bytes = cb.replace(cache, geom=g, k=lay, v=lay, k_init=cache.k_init.view(np_dtype(dt)),
                                v_init=cache.v_init.view(np_dtype(dt)))
        case = cb.write_case(same_bytes, cb.spread_slots(g, 10, 444 + i), seed=447 + i,
                             label=f"call {i + 1} of {CALLS} into one pair of cache buffers: described as "
                                   f"{dt.name.lower()} of {g.num_kv_heads} heads x {g.head_dim}, rows of its dtype")
        return cb.replace(case, c_overrides=_write_desc_overrides(case))

    _judge_write_chain(kvx_provider, opts, cb.simple_cache(G, kind, DType.F16, seed=443), make_case, CL_STATE_DTYPE)


CL_STATE_VALIDATE = ("spec 7 (kvx_validate_cache_desc MUST validate layout, dtype, shape, stride, and required "
                     "fields, returning KVX_STATUS_INVALID_ARGUMENT on failure), 4.2 (shape MUST agree with the cache "
                     "descriptor), 7.1 (dimensions MUST be non-zero), 7.2 (the API is stateless aside from "
                     "user-provided buffers); R-STATE")
#: the calls of state.validate_descriptor_per_call: what the descriptor says, its fields over the valid one's
VALIDATE_CALLS = [
    ("valid", {}, Status.OK),
    ("K shape[0] = num_blocks + 1", {"cache.k.shape[0]": G.num_blocks + 1}, Status.INVALID_ARGUMENT),
    ("valid again", {}, Status.OK),
    ("head_dim 0 (and the shapes' head_dim extent 0)", {"cache.head_dim": 0, "cache.k.shape[3]": 0,
                                                         "cache.v.shape[3]": 0}, Status.INVALID_ARGUMENT),
]


@conformance("state.validate_descriptor_per_call", CL_STATE_VALIDATE, REQUIRED, "core", "validate")
def test_validate_descriptor_per_call(kvx_provider, kvx_call_options):
    """Four ``kvx_validate_cache_desc`` calls through one descriptor (the same struct address, the same
    K and V buffers) whose fields change between the calls, as an engine keeps its cache descriptor in
    one struct and rewrites it: valid, a K shape that disagrees with ``num_blocks``, valid again,
    ``head_dim`` 0. Each call is answered by what the descriptor holds then: a provider that remembers
    the descriptors it found valid by address and buffers (an engine validates the same cache at every
    step) answers OK for the second and fourth (``execute.run_validate_sequence``; the other validation
    tests pass each descriptor once)."""
    opts = kvx_call_options()
    cache = cb.simple_cache(G, cb.core_layout(kvx_provider, opts.memory), DType.F16, seed=415)
    n = len(VALIDATE_CALLS)
    cases = [cb.validate_case(cache, overrides=ov, seed=415,
                              label=f"call {i + 1} of {n} through one descriptor and one pair of buffers: {what}")
             for i, (what, ov, _) in enumerate(VALIDATE_CALLS)]
    for case, (_, _, want) in zip(cases, VALIDATE_CALLS):
        exp = oracle.expected_validate(case, opts.memory)
        if exp.status != want:
            raise OracleDisagrees(f"the test expects {want.name} but the oracle answers {Status(exp.status).name} "
                                  f"for {case.label}")
    results = run_validate_sequence(kvx_provider, cases, opts)
    for i, (got, case, (_, _, want)) in enumerate(zip(results, cases, VALIDATE_CALLS)):
        check_status(got.status, want, clause=CL_STATE_VALIDATE, case=case,
                     what=f"status of call {i + 1} of {n} through one descriptor")
        check_guards(got, clause=CL_STATE_VALIDATE, case=case)


CL_STATE_SCALES = ("spec 7.2 (the API is stateless aside from user-provided buffers); 6.6, 6.9 (the FP8 scale "
                   "of the call, from k_scale_desc / v_scale_desc); R-FP8, R-STATE")
#: per call: (K values, V values) of the PER_TENSOR or PER_HEAD scale descriptors
PERSISTENT_SCALES = {
    "per_tensor": [([0.21], [3.3]), ([1.7], [0.4]), ([0.05], [11.0])],
    "per_head": [([0.5, 1.7], [2.25, 0.093]), ([2.0, 0.11], [0.6, 4.5]), ([0.07, 6.5], [13.0, 0.3])],
}


@conformance("state.persistent_scales", CL_STATE_SCALES, REQUIRED, "fp8", "write", feature="fp8")
@pytest.mark.parametrize("granularity", list(PERSISTENT_SCALES))
@pytest.mark.parametrize("dtype", [DType.F8_E4M3, DType.F8_E5M2], ids=["e4m3", "e5m2"])
def test_persistent_scales(kvx_provider, kvx_call_options, dtype, granularity):
    """Three F32 -> FP8 writes through one set of scale-descriptor buffers (and one slots buffer and
    IO rows) whose values change between the calls, as an engine rewrites its persistent
    ``k_scale`` / ``v_scale`` in place: every call quantizes by the scales its buffers hold then. A
    provider that keeps the values it read behind a scale pointer (read once, to spare a device
    sync per call) quantizes the later calls by the first call's scales."""
    opts = kvx_call_options()
    g = ScaleGranularity.PER_TENSOR if granularity == "per_tensor" else ScaleGranularity.PER_HEAD
    cache = cb.simple_cache(G, cb.core_layout(kvx_provider, opts.memory), dtype, seed=390)

    def make_case(i, cache):
        ks, vs = PERSISTENT_SCALES[granularity][i]
        case = cb.write_case(cache, cb.spread_slots(G, 24, 391 + i), io_dtype=DType.F32, seed=395 + i,
                             k_scale_desc=cb.scale_spec(ks, g), v_scale_desc=cb.scale_spec(vs, g),
                             label=f"call {i + 1} of {CALLS} through one set of scale buffers: {granularity} "
                                   f"K scales {ks}, V scales {vs}")
        if i == 0:  # a refusal of FP8 is the feature's; a wrong first call a failure of its own
            verify_write(kvx_provider, case, opts, clause=CL_STATE_SCALES, feature="fp8")
        return case

    _judge_write_chain(kvx_provider, opts, cache, make_case, CL_STATE_SCALES)


# ---------------------------------------------------------------------------- engine-sized batches

BATCH = Geometry(num_blocks=320, block_size=16, num_kv_heads=2, head_dim=32)
#: the cache layouts of the engine-sized batches: each in every layout a provider may serve, the
#: core one required, the others refusable (R-REFUSAL). The other tests of a layout other than the
#: provider's core one write at most 24 tokens and gather at most a few sequences, so a bulk path
#: taken past some size in that layout alone (a kernel per layout and size) was never reached.
BATCH_LAYOUTS = pytest.mark.parametrize("kind", ["nhd", "hnd", "hnd_packed"])


def _batch_cache(kind: str, seed: int, geom: Geometry = BATCH):
    """An F16 cache of ``geom`` in layout ``kind`` (HND_PACKED: 8 elements, 16 bytes, a pack)."""
    return cb.simple_cache(geom, kind, DType.F16, seed=seed, **({"pack": 8} if kind == "hnd_packed" else {}))


@conformance("write.prefill_batch", CL_BATCH, REQUIRED, "core", "write")
@BATCH_LAYOUTS
def test_prefill_sized_write(kvx_provider, kvx_call_options, kind):
    """4096 tokens in one write (a prefill chunk), random distinct slots and a few invalid ones, in
    each cache layout (a refusal of a layout other than the provider's core one is the layout's)."""
    opts = kvx_call_options()
    cache = _batch_cache(kind, 360)
    slots = cb.spread_slots(BATCH, 4096, 361).tolist()
    for i in (0, 1023, 1024, 2047, 4095):
        slots[i] = -1
    # feature (): a refusal is excused by the case's own optional features, its layout unless the core one
    verify_write(kvx_provider, cb.write_case(cache, slots, seed=362, label=f"4096-token write, {kind.upper()} cache"),
                 opts, clause=CL_BATCH, feature=())


CL_BATCH_NOOP = ("spec 5.2 (implementations MUST treat invalid_slot as a no-op write), 7 (invalid slots, "
                 "invalid_slot or negative, MUST be treated as no-op) - in a prefill-sized write; R-WRITE")
#: the padding tokens' invalid_slot in the prefill-sized write: a valid slot of BATCH no other token writes
BATCH_SENTINEL = 777
#: non-negative invalid_slot values past int32 and negative ones below it (spec 5.2: invalid_slot is an int64, any
#: value): the low 32 bits of each (777, 1500) are valid slots that live tokens of the same write use, so a sentinel
#: compared at an S32 slot's width (narrowed to int32) instead of as an int64 turns those tokens into no-ops
BATCH_WIDE_SENTINELS = {"high_bits": 2 ** 32 + BATCH_SENTINEL, "negative_high": -(2 ** 32) + 1500}
#: the live tokens of the wide-sentinel batches: (token index, slot), the slots the sentinels' low 32 bits name
BATCH_WIDE_LIVE = ((100, BATCH_SENTINEL), (2900, 1500))
#: (slot dtype, invalid_slot) of ``write.prefill_batch_sentinel``
SENTINEL_BATCH = [pytest.param(DType.S32, BATCH_SENTINEL, id="s32"), pytest.param(DType.S64, BATCH_SENTINEL, id="s64"),
                  *[pytest.param(dt, v, id=f"{dt.name.lower()}-{name}") for name, v in BATCH_WIDE_SENTINELS.items()
                    for dt in (DType.S32, DType.S64)]]


@conformance("write.prefill_batch_sentinel", CL_BATCH_NOOP, REQUIRED, "core", "write")
@pytest.mark.parametrize("slot_dtype,sentinel", SENTINEL_BATCH)
@BATCH_LAYOUTS
def test_prefill_sized_write_sentinel(kvx_provider, kvx_call_options, kind, slot_dtype, sentinel):
    """``write.prefill_batch`` whose padding tokens carry a non-negative ``invalid_slot`` (777, a valid
    slot that no other token writes), a few others -1: all are no-ops however many tokens the call
    holds, in each cache layout. ``write.slots.invalid_slot_sentinel`` writes 7 to 10 tokens in the
    core layout; a bulk path taken past some token count, or in one layout, that skips negative
    slots only (vLLM pads with -1) writes slot 777.

    ``*-high_bits`` / ``*-negative_high``: ``invalid_slot`` 2^32 + 777 / -(2^32) + 1500, outside
    int32, while live tokens write slots 777 and 1500 (the sentinels' low 32 bits). Only slots < 0
    or equal to ``invalid_slot`` compared as int64 are no-ops (S32 slots sign-extended, R-WRITE):
    with S32 slots no token can carry such a sentinel (its padding is -1) and every token with a
    slot >= 0 is written; with S64 slots the padding carries the sentinel itself (2^32 + 777, past
    the cache: a no-op, not OUT_OF_RANGE). A bulk path that compares S32 slots with
    ``(int32_t)invalid_slot`` drops the live tokens of slot 777 or 1500;
    ``write.slots.invalid_slot_sentinel[high_bits-s32]`` writes 8 tokens."""
    opts = kvx_call_options()
    if sentinel == BATCH_SENTINEL:
        cache = _batch_cache(kind, 365)
        slots = cb.spread_slots(BATCH, 4096, 366, exclude={BATCH_SENTINEL}).tolist()
        for i in (5, 1500, 2047, 2048, 3000, 4095):
            slots[i] = BATCH_SENTINEL
        for i in (0, 1024):
            slots[i] = -1
        label = f"4096-token write, {kind.upper()} cache, invalid_slot={BATCH_SENTINEL} on 6 tokens, -1 on 2"
    else:
        cache = _batch_cache(kind, 371)
        slots = cb.spread_slots(BATCH, 4096, 372, exclude={s for _, s in BATCH_WIDE_LIVE}).tolist()
        pad = sentinel if slot_dtype == DType.S64 else -1  # no S32 slot holds a sentinel outside int32
        for i in (5, 1500, 2047, 2048, 3000, 4095):
            slots[i] = pad
        for i in (0, 1024):
            slots[i] = -1
        for i, s in BATCH_WIDE_LIVE:
            slots[i] = s
        label = (f"4096-token write, {kind.upper()} cache, {slot_dtype.name} slots, invalid_slot={sentinel} "
                 f"(low 32 bits {sentinel & 0xFFFFFFFF}), live tokens "
                 + ", ".join(f"{i} -> slot {s}" for i, s in BATCH_WIDE_LIVE)
                 + f"; slot {pad} on 6 tokens, -1 on 2")
    case = cb.write_case(cache, slots, slot_dtype=slot_dtype, invalid_slot=sentinel,
                         seed=367 if sentinel == BATCH_SENTINEL else 373, label=label)
    verify_write(kvx_provider, case, opts, clause=CL_BATCH_NOOP, feature=())


@conformance("write.prefill_batch_sentinel_convert", CL_BATCH_NOOP + " (converting writes)", REQUIRED, "core", "write",
             feature="mixed_io_dtype")
@pytest.mark.parametrize("io_dtype", [DType.F32, DType.BF16], ids=["f32", "bf16"])
@BATCH_LAYOUTS
def test_prefill_sized_write_sentinel_convert(kvx_provider, kvx_call_options, kind, io_dtype):
    """``write.prefill_batch_sentinel`` from F32 or BF16 rows into the F16 caches: a converting write
    takes its own path in many kernels (a conversion per element), and the sentinel must be a no-op
    on that path too, in each layout (a refusal is the layout's or ``mixed_io_dtype``'s)."""
    opts = kvx_call_options()
    cache = _batch_cache(kind, 368)
    slots = cb.spread_slots(BATCH, 4096, 369, exclude={BATCH_SENTINEL}).tolist()
    for i in (3, 999, 2048, 4095):
        slots[i] = BATCH_SENTINEL
    slots[17] = -1
    case = cb.write_case(cache, slots, io_dtype=io_dtype, invalid_slot=BATCH_SENTINEL, seed=370,
                         label=f"4096-token write, {io_dtype.name} rows into a {kind.upper()} F16 cache, "
                               f"invalid_slot={BATCH_SENTINEL} on 4 tokens, -1 on 1")
    verify_write(kvx_provider, case, opts, clause=CL_BATCH_NOOP, feature=())


BIG_BATCH = Geometry(num_blocks=4112, block_size=16, num_kv_heads=1, head_dim=8)  # 65792 slots, 1 MiB per tensor
BIG_TOKENS = 65600
CL_BIG_BATCH = "spec 7 (kvx_write_kv writes K/V for tokens using a slot mapping), 5.2 (every token of the batch)"


@conformance("write.prefill_batch_65600", CL_BIG_BATCH, REQUIRED, "core", "write")
@BATCH_LAYOUTS
def test_prefill_write_past_65535_tokens(kvx_provider, kvx_call_options, kind):
    """65600 tokens in one write (1 head x 8 dims F16, 4112 blocks), random distinct slots, in each
    cache layout: tokens 65535 and later must land like the others (a grid dimension capped at 65535
    drops them; a kernel per layout may cap it in one layout only). A refusal of a layout other than
    the provider's core one is the layout's."""
    opts = kvx_call_options()
    cache = _batch_cache(kind, 380, BIG_BATCH)
    slots = cb.spread_slots(BIG_BATCH, BIG_TOKENS, 381)
    slots[[7, 65536]] = -1  # a no-op on each side of 65535
    verify_write(kvx_provider, cb.write_case(cache, slots, seed=382,
                                             label=f"{BIG_TOKENS}-token write, {kind.upper()} cache"), opts,
                 clause=CL_BIG_BATCH, feature=())


@conformance("write.prefill_batch_65600_s32", CL_BIG_BATCH + "; 5.2 (slots S32 or S64)", REQUIRED, "core", "write")
def test_prefill_write_past_65535_tokens_s32(kvx_provider, kvx_call_options):
    """``write.prefill_batch_65600`` with S32 slots (the core layout): tokens 65535 and later land like the
    others whatever the slot width. That test sends S64 slots, and the other writes of S32 slots past
    65535 tokens are ``large_cache.write_input_rows_past_2_31``'s (8 GiB inputs, which a provider may
    refuse: R-LARGE), so a kernel per slot dtype whose S32 one caps its grid at 65535 tokens certified
    beside such a refusal."""
    opts = kvx_call_options()
    cache = _batch_cache(cb.core_layout(kvx_provider, opts.memory), 383, BIG_BATCH)
    slots = cb.spread_slots(BIG_BATCH, BIG_TOKENS, 384)
    slots[[11, 65535, 65590]] = -1  # no-ops on each side of 65535
    verify_write(kvx_provider, cb.write_case(cache, slots, slot_dtype=DType.S32, seed=385,
                                             label=f"{BIG_TOKENS}-token write, S32 slots"), opts,
                 clause=CL_BIG_BATCH + "; 5.2")


@conformance("write.prefill_batch_65600_dtypes", CL_BIG_BATCH + "; 4.3 (F16, BF16 and F32 caches)", REQUIRED, "core",
             "write")
@pytest.mark.parametrize("dtype", [DType.BF16, DType.F32], ids=["bf16", "f32"])
def test_prefill_write_past_65535_tokens_dtypes(kvx_provider, kvx_call_options, dtype):
    """``write.prefill_batch_65600`` into BF16 and F32 caches of the core layout, with rows of the cache's dtype
    (a copy, no conversion): tokens 65535 and later land like the others whatever the element type. That test
    writes F16 caches, and the other writes past 65535 tokens into BF16 / F32 caches are
    ``dtype.write.convert_batch[*-65600]``'s, converting writes a provider may refuse (``mixed_io_dtype``), so
    a kernel per element type whose BF16 / F32 one caps its grid at 65535 tokens certified beside such a
    refusal."""
    opts = kvx_call_options()
    cache = cb.simple_cache(BIG_BATCH, cb.core_layout(kvx_provider, opts.memory), dtype, seed=386)
    slots = cb.spread_slots(BIG_BATCH, BIG_TOKENS, 387)
    slots[[13, 65535, 65599]] = -1  # no-ops on each side of 65535
    verify_write(kvx_provider, cb.write_case(cache, slots, seed=388,
                                             label=f"{BIG_TOKENS}-token write, {dtype.name} cache and rows"), opts,
                 clause=CL_BIG_BATCH + "; 4.3")


def _decode_batch(kvx_provider, opts, seed: int, kind: str | None = None):
    """A decode batch of 320 sequences of 0 to 64 tokens over BATCH in layout ``kind`` (None: the
    provider's core layout): (cache, a table of 4 random block ids a sequence, lengths,
    max_seq_len); ``seed`` for the cache, ``seed + 1`` for the table and lengths."""
    cache = _batch_cache(kind or cb.core_layout(kvx_provider, opts.memory), seed)
    rng = cb.rng_for(seed + 1)
    seqs, mb = 320, 4
    table = rng.integers(0, BATCH.num_blocks, size=(seqs, mb))
    lens = rng.integers(0, mb * BATCH.block_size + 1, size=seqs).tolist()
    return cache, table, lens, mb * BATCH.block_size


@conformance("gather.decode_batch", CL_BATCH, REQUIRED, "core", "gather")
@BATCH_LAYOUTS
def test_decode_sized_gather(kvx_provider, kvx_call_options, kind):
    """320 sequences in one PACKED gather (a decode batch), lengths 0 to 64 tokens, from each cache
    layout (a refusal of a layout other than the provider's core one is the layout's)."""
    opts = kvx_call_options()
    cache, table, lens, msl = _decode_batch(kvx_provider, opts, 370, kind)
    case = cb.packed_gather(cache, table, lens, msl, seed=372, label=f"320-sequence gather, {kind.upper()} cache")
    verify_gather(kvx_provider, case, opts, clause=CL_BATCH, feature=())


CL_BATCH_WIDE = CL_BATCH + ", 5.3 / 6.5 (seq_lens dtype S32 or S64), 7.1 (S32 or S64 indices); R-WIDE-IDS"
#: S64 lengths past int32 (R-WIDE-IDS: 64 bits wide), each above the decode batches' max_seq_len (64), so that
#: each such sequence gathers min(L, max_seq_len) = 64 tokens (R-DATA). Narrowed to int32 they read 3, 0, 17 and 9:
#: a short or empty sequence, an OK answer with rows missing
WIDE_LENS = (2 ** 32 + 3, 2 ** 32, 2 ** 33 + 17, 2 ** 62 + 9)
#: S64 lengths past int32 whose low 32 bits, narrowed to int32, are negative (2^31 + 5, 2^32 - 1, INT64_MAX): a
#: provider that narrows them rejects a valid call (INVALID_ARGUMENT) or gathers nothing. PACKED only: a refusal of
#: RAGGED or KV_OFFSETS is excused where the table format is not claimed
WIDE_LENS_SIGN = (2 ** 31 + 5, 2 ** 32 - 1, 2 ** 63 - 1)
#: the sequences of a 320-sequence decode batch given the wide lengths (in turn): the first, the last, both sides
#: of 256
WIDE_LEN_SEQS = (0, 3, 17, 64, 129, 200, 255, 256, 318, 319)
#: (block id dtype, length dtype, the wide lengths or None) of the wide decode batches: ``gather.decode_batch``
#: is S32 / S32
WIDE_BATCH = [pytest.param(DType.S64, DType.S64, None, id="idx_s64-lens_s64"),
              pytest.param(DType.S32, DType.S64, None, id="idx_s32-lens_s64"),
              pytest.param(DType.S64, DType.S32, None, id="idx_s64-lens_s32"),
              pytest.param(DType.S64, DType.S64, WIDE_LENS, id="idx_s64-lens_s64_past_int32"),
              pytest.param(DType.S32, DType.S64, WIDE_LENS, id="idx_s32-lens_s64_past_int32"),
              pytest.param(DType.S64, DType.S64, WIDE_LENS_SIGN, id="idx_s64-lens_s64_low_word_negative")]


def with_wide_lens(lens: list, wide: tuple) -> list:
    """``lens`` with the lengths ``wide`` (in turn) on the sequences WIDE_LEN_SEQS (a batch of 320 sequences)."""
    lens = list(lens)
    for i, s in enumerate(WIDE_LEN_SEQS):
        lens[s] = wide[i % len(wide)]
    return lens


@conformance("gather.decode_batch_wide_indices", CL_BATCH_WIDE, REQUIRED, "core", "gather")
@pytest.mark.parametrize("index_dtype,lens_dtype,wide", WIDE_BATCH)
def test_decode_sized_gather_wide_indices(kvx_provider, kvx_call_options, index_dtype, lens_dtype, wide):
    """``gather.decode_batch`` (320 sequences, lengths 0 to 64) with S64 block ids and / or S64
    lengths (PyTorch's default integer tensors): each array is read at its own width in a batch of
    any size. A batch kernel for many sequences instantiated for int32 only, handed the S64 arrays
    unconverted, reads the low and high words of lengths (or ids) 0, 1, ... as those of sequences
    0, 1, 2, 3, ...; the other S64 tables and lengths go with a few sequences.

    ``*_past_int32``: 10 of the sequences (the first and the last among them) have S64 lengths past
    int32 (2^32 + 3, 2^32, 2^33 + 17, 2^62 + 9), each gathering min(L, max_seq_len) = 64 tokens
    (R-WIDE-IDS, R-DATA); a batch kernel that narrows each length to int32 before the min gathers
    3, 0, 17 or 9 tokens of them. ``*_low_word_negative``: lengths 2^31 + 5, 2^32 - 1 and 2^63 - 1,
    whose low 32 bits read as an int32 are negative: 64 tokens each too, never INVALID_ARGUMENT.
    ``gather.packed.wide_seq_len`` holds 2 sequences."""
    opts = kvx_call_options()
    cache, table, lens, msl = _decode_batch(kvx_provider, opts, 373)
    if wide:
        lens = with_wide_lens(lens, wide)
    case = cb.packed_gather(cache, table, lens, msl, seed=375, index_dtype=index_dtype,
                            lens_dtype=lens_dtype, label=f"320-sequence gather, {index_dtype.name} block ids, "
                                                         f"{lens_dtype.name} lengths"
                                                         + (f", lengths past int32 {list(wide)} on sequences "
                                                            f"{list(WIDE_LEN_SEQS)}" if wide else ""))
    verify_gather(kvx_provider, case, opts, clause=CL_BATCH_WIDE)


CL_BATCH_RAGGED = (CL_BATCH + " (RAGGED: token t of s uses indices[indptr[s] + t]), 6.3 (indices and indptr S32 or "
                   "S64, each its own dtype field); R-DATA, R-WIDE-IDS")
RAGGED_BATCH = [pytest.param(DType.S32, DType.S32, False, id="idx_s32-indptr_s32"),
                pytest.param(DType.S64, DType.S64, False, id="idx_s64-indptr_s64"),
                pytest.param(DType.S32, DType.S64, False, id="idx_s32-indptr_s64"),
                pytest.param(DType.S64, DType.S32, False, id="idx_s64-indptr_s32"),
                pytest.param(DType.S32, DType.S32, True, id="idx_s32-indptr_s32-lens_s64_past_int32"),
                pytest.param(DType.S64, DType.S64, True, id="idx_s64-indptr_s64-lens_s64_past_int32")]


@conformance("gather.ragged.decode_batch", CL_BATCH_RAGGED, REQUIRED, "tables", "gather", feature="ragged")
@pytest.mark.parametrize("index_dtype,indptr_dtype,past_int32", RAGGED_BATCH)
def test_ragged_decode_batch(kvx_provider, kvx_call_options, index_dtype, indptr_dtype, past_int32):
    """``gather.decode_batch`` through a RAGGED table (flashinfer's ``kv_indptr``): 320 sequences,
    lengths 0 to 64, every pair of id and indptr widths. The other RAGGED gathers hold at most 4
    sequences (the engine scenarios a few more, S32 indptr): a batch kernel for many sequences
    instantiated for an int32 indptr and handed an S64 one unconverted starts sequence s at the s-th
    32-bit word, another sequence's range, where the front end's checks of the S64 array pass.

    ``*-lens_s64_past_int32``: S64 lengths, 10 of them past int32 as in
    ``gather.decode_batch_wide_indices[*_past_int32]``, each such sequence's range holding
    max_seq_len = 64 ids: it gathers min(L, max_seq_len) = 64 tokens (R-WIDE-IDS, R-DATA), not the
    3, 0, 17 or 9 of its length narrowed to int32."""
    opts = kvx_call_options()
    cache, table, lens, msl = _decode_batch(kvx_provider, opts, 376)
    lens_dtype, bt, wide = DType.S32, None, ""
    if past_int32:
        lens, lens_dtype = with_wide_lens(lens, WIDE_LENS), DType.S64
        # a range of min(L, max_seq_len) ids a sequence: what the gather reads (R-DATA)
        bt = cb.ragged_table(table, [min(int(n), msl) for n in lens], BATCH.block_size, table.shape[1], index_dtype,
                             indptr_dtype)
        wide = f", S64 lengths past int32 {list(WIDE_LENS)} on sequences {list(WIDE_LEN_SEQS)}"
    case = cb.ragged_gather(cache, table, lens, msl, seed=378, index_dtype=index_dtype, indptr_dtype=indptr_dtype,
                            lens_dtype=lens_dtype, block_table=bt,
                            label=f"320-sequence RAGGED gather, {index_dtype.name} ids, {indptr_dtype.name} indptr"
                                  + wide)
    verify_gather(kvx_provider, case, opts, clause=CL_BATCH_RAGGED, feature="ragged")
