"""Spec 4.1, 5.2, 7 (R-WRITE): slot semantics of ``kvx_write_kv``.

Every write is compared bit-exactly with the oracle (both caches, padding included)
and its guards are checked. Slot semantics do not depend on the layout, so these
tests use the one of NHD / HND the provider serves (core needs one of them).
"""
from __future__ import annotations

import numpy as np
import pytest

from kvx_conformance.abi.descriptors import Geometry
from kvx_conformance.abi.header import DType, Status
from kvx_conformance.cases import build as cb
from kvx_conformance.cases.checks import partial_write, verify_write
from kvx_conformance.results.outcomes import INFORMATIONAL, RECOMMENDED, REQUIRED, conformance

G = cb.GEOM
N = G.num_slots
SLOT_DTYPES = pytest.mark.parametrize("slot_dtype", [DType.S32, DType.S64], ids=["s32", "s64"])
CL_NOOP = "spec 5.2, 7 (invalid_slot and negative slots are no-ops); R-WRITE"
CL_OOR = "spec 5.2, 8 (OUT_OF_RANGE); R-WRITE"
ANY_STATUS = tuple(Status)


def _cache(provider, memory, seed: int, geom: Geometry = G, dtype: DType = DType.F16):
    return cb.simple_cache(geom, cb.core_layout(provider, memory), dtype, seed=seed)


@conformance("write.slots.valid", "spec 4.1, 5.2, 7; R-WRITE", REQUIRED, "core", "write")
@SLOT_DTYPES
def test_valid_slots(kvx_provider, kvx_call_options, slot_dtype):
    opts = kvx_call_options()
    slots = cb.spread_slots(G, 11, seed=5)
    slots[0], slots[1] = 0, N - 1  # first and last slot of the cache
    case = cb.write_case(_cache(kvx_provider, opts.memory, 1), slots, slot_dtype=slot_dtype, seed=2,
                         label="distinct valid slots")
    verify_write(kvx_provider, case, opts, clause="spec 4.1, 5.2, 7; R-WRITE")


@conformance("write.slots.every_slot", "spec 4.1, 5.2; R-WRITE", REQUIRED, "core", "write")
def test_every_slot_once(kvx_provider, kvx_call_options):
    opts = kvx_call_options()
    slots = cb.rng_for(7).permutation(N)
    case = cb.write_case(_cache(kvx_provider, opts.memory, 3), slots, slot_dtype=DType.S32, seed=4,
                         label="every slot once, shuffled")
    verify_write(kvx_provider, case, opts, clause="spec 4.1, 5.2; R-WRITE")


GEOMETRIES = {
    "block1": Geometry(5, 1, 2, 4),
    "block3": Geometry(4, 3, 1, 5),
    "block16": Geometry(2, 16, 3, 2),
    "dim1": Geometry(3, 4, 4, 1),
    "wide": Geometry(2, 2, 1, 64),
}


@conformance("write.slots.geometry", "spec 4.1, 5.2; R-WRITE", REQUIRED, "core", "write")
@pytest.mark.parametrize("geom", list(GEOMETRIES.values()), ids=list(GEOMETRIES))
def test_geometries(kvx_provider, kvx_call_options, geom):
    opts = kvx_call_options()
    slots = cb.spread_slots(geom, min(geom.num_slots, 9), seed=8)
    case = cb.write_case(_cache(kvx_provider, opts.memory, 9, geom), slots, seed=10, label=f"geometry {geom}")
    verify_write(kvx_provider, case, opts, clause="spec 4.1, 5.2; R-WRITE")


CL_NON_POW2 = ("spec 4.1 (block_idx = slot_idx / block_size, offset = slot_idx % block_size), 7.1 (only "
               "KV_OFFSETS requires a power-of-two block_size); R-WRITE")


@conformance("write.slots.block_size_non_pow2", CL_NON_POW2, REQUIRED, "core", "write")
@SLOT_DTYPES
@pytest.mark.parametrize("block_size", [48, 96, 528])
def test_block_size_non_pow2(kvx_provider, kvx_call_options, block_size, slot_dtype):
    """block_size 48, 96 and 528 (not powers of two, >= 32): every slot once, shuffled, so a block
    index taken with a shift and an offset with a mask (right only for powers of two) is seen. 528 is
    a hybrid model's attention block (vLLM sizes it to the Mamba state): block offsets 256 and later,
    which a kernel of one thread per token of a block, launched with at most 256 and no loop, drops."""
    opts = kvx_call_options()
    geom = Geometry(num_blocks=3, block_size=block_size, num_kv_heads=2, head_dim=4)
    slots = cb.rng_for(11).permutation(geom.num_slots)
    case = cb.write_case(_cache(kvx_provider, opts.memory, 12, geom), slots, slot_dtype=slot_dtype, seed=13,
                         label=f"block_size {block_size}, every slot once")
    verify_write(kvx_provider, case, opts, clause=CL_NON_POW2)


#: the layouts and block sizes of ``write.slots.block_size_non_pow2_layouts``: the three layouts (whatever the core one),
#: each with a block size of 48 (S32 slots) and 528 (S64 slots)
NON_POW2_LAYOUTS = [pytest.param(kind, bs, dt, id=f"{kind}-bs{bs}") for kind in ("nhd", "hnd", "hnd_packed")
                    for bs, dt in ((48, DType.S32), (528, DType.S64))]


@conformance("write.slots.block_size_non_pow2_layouts", CL_NON_POW2 + "; R-CACHE (every layout)", REQUIRED, "core",
             "write")
@pytest.mark.parametrize("kind,block_size,slot_dtype", NON_POW2_LAYOUTS)
def test_block_size_non_pow2_layouts(kvx_provider, kvx_call_options, kind, block_size, slot_dtype):
    """``write.slots.block_size_non_pow2`` in NHD, HND and HND_PACKED caches: every slot once, shuffled
    (144 or 1584 tokens). That test writes the core layout's caches only, and the other writes in a
    non-power-of-two block hold at most 24 tokens (``shapes.layouts``: blocks of 528), so a batch kernel of
    another layout that takes the block offset with a mask (``slot & (block_size - 1)``, right for powers
    of two only) was never run. A refusal of a layout other than the provider's core one is the layout's
    (R-REFUSAL)."""
    opts = kvx_call_options()
    geom = Geometry(num_blocks=3, block_size=block_size, num_kv_heads=2, head_dim=4)
    slots = cb.rng_for(14).permutation(geom.num_slots)
    cache = cb.simple_cache(geom, kind, DType.F16, seed=15)
    case = cb.write_case(cache, slots, slot_dtype=slot_dtype, seed=16,
                         label=f"{kind.upper()} F16 cache, block_size {block_size}, every slot once")
    verify_write(kvx_provider, case, opts, clause=CL_NON_POW2 + "; R-CACHE", feature=())


@conformance("write.slots.single_token", "spec 4.1, 5.2, 7 (K and V of every head); R-WRITE", REQUIRED, "core",
             "write")
@pytest.mark.parametrize("heads", [2, 8])
def test_single_token(kvx_provider, kvx_call_options, heads):
    """A write of one token (a decode step of batch 1) with 2 and 8 KV heads: every head is written
    (a one-token fast path is a path of its own)."""
    opts = kvx_call_options()
    geom = Geometry(num_blocks=4, block_size=4, num_kv_heads=heads, head_dim=8)
    case = cb.write_case(_cache(kvx_provider, opts.memory, 26, geom), [6], seed=27,
                         label=f"one token, {heads} heads")
    verify_write(kvx_provider, case, opts, clause="spec 4.1, 5.2, 7; R-WRITE")


@conformance("write.slots.padded_batch_beyond_cache", CL_NOOP + " (more tokens than cache slots)", REQUIRED, "core",
             "write")
def test_padded_batch_beyond_cache(kvx_provider, kvx_call_options):
    """40 tokens into a cache of 24 slots: 10 valid slots, then 30 tokens of slot -1 (a CUDA-graph
    batch padded to its captured size). num_tokens is not bounded by num_blocks * block_size."""
    opts = kvx_call_options()
    slots = [*cb.spread_slots(G, 10, seed=28), *([-1] * 30)]
    case = cb.write_case(_cache(kvx_provider, opts.memory, 29), slots, seed=30,
                         label=f"{len(slots)} tokens (10 valid, 30 of slot -1) > {N} slots")
    verify_write(kvx_provider, case, opts, clause=CL_NOOP)


CL_RUNS = "spec 5.2, 7 (token i is written at slots[i]; invalid_slot and negative slots are no-ops); R-WRITE"
RUN_GEOM = Geometry(num_blocks=6, block_size=8, num_kv_heads=2, head_dim=4)  # 48 slots
_A = 2 * RUN_GEOM.block_size  # a block-aligned first slot
_RUN = list(range(_A, _A + 12))  # 12 consecutive slots: the first and the last 11 apart
#: id -> (slots, invalid_slot). Each write's first and last slots look like one ascending run (or one
#: whole block, first slot block-aligned, num_tokens == block_size), but the slots between are not that
#: run: a path that trusts the endpoints (a prefill chunk copied as slot[0] + i) writes the holes.
RUNS = {
    "run-hole_minus1": ([*_RUN[:5], -1, *_RUN[6:]], -1),
    "run-hole_sentinel": ([*_RUN[:3], 41, *_RUN[4:8], 41, *_RUN[9:]], 41),  # invalid_slot 41, a valid slot
    "run-shuffled_middle": ([_RUN[0], *_RUN[7:11], *_RUN[1:7], _RUN[11]], -1),
    "block-padded_tail": ([*range(_A, _A + 6), -1, -1], -1),  # a block filled in part, padded to block_size
    "block-hole_middle": ([*range(_A, _A + 3), -1, *range(_A + 4, _A + 8)], -1),
    "block-shuffled": ([_A, _A + 5, _A + 2, _A + 7, _A + 1, _A + 6, _A + 3, _A + 4], -1),
}


@conformance("write.slots.runs_with_holes", CL_RUNS, REQUIRED, "core", "write")
@pytest.mark.parametrize("which", list(RUNS))
@SLOT_DTYPES
def test_runs_with_holes(kvx_provider, kvx_call_options, which, slot_dtype):
    """Writes whose first and last slots bound what looks like a contiguous run (a prefill chunk of
    12 tokens, last slot = first + 11) or one whole block (8 tokens, block_size 8, the first slot
    block-aligned), with slot -1 or the call's ``invalid_slot`` (41, a valid slot) among them, or the
    slots between out of order. Each token goes to its own slot and the invalid ones nowhere: a fast
    path that reads only the endpoints (copying token i to slot[0] + i) writes the holes and misplaces
    the shuffled tokens."""
    slots, invalid = RUNS[which]
    opts = kvx_call_options()
    cache = _cache(kvx_provider, opts.memory, 31, RUN_GEOM)
    case = cb.write_case(cache, slots, slot_dtype=slot_dtype, invalid_slot=invalid, seed=32,
                         label=f"{which}: slots {slots}, invalid_slot {invalid}")
    verify_write(kvx_provider, case, opts, clause=CL_RUNS)


CL_ZERO_ROWS = ("spec 7 (kvx_write_kv writes K/V for tokens using a slot mapping), 5.2 (only invalid slots are "
                "no-ops); R-WRITE")


@conformance("write.slots.zero_rows", CL_ZERO_ROWS, REQUIRED, "core", "write")
def test_zero_rows(kvx_provider, kvx_call_options):
    """Tokens whose K and V inputs are all +0.0, all -0.0, or K zero beside a live V, at valid slots
    of a cache holding other values: they are written like any token (a provider that takes an
    all-zero row for a padding token and skips it leaves the old values)."""
    opts = kvx_call_options()
    cache = _cache(kvx_provider, opts.memory, 33)
    case = cb.write_case(cache, cb.spread_slots(G, 8, seed=34), seed=35, label="tokens 1 and 5 all +0.0, 3 all -0.0, "
                         "6 with an all-zero K")
    row = G.num_kv_heads * G.head_dim
    key, value = case.key.copy(), case.value.copy()
    for i, v in ((1, 0.0), (5, 0.0), (3, -0.0)):
        key[i * row:(i + 1) * row] = v
        value[i * row:(i + 1) * row] = v
    key[6 * row:7 * row] = 0.0
    verify_write(kvx_provider, cb.replace(case, key=key, value=value), opts, clause=CL_ZERO_ROWS)


NEGATIVE = {
    DType.S32: [-1, -2, -100, -(2 ** 31)],
    DType.S64: [-1, -2, -(2 ** 31) - 5, -(2 ** 63), -(2 ** 32) + 3],  # the last: low 32 bits say slot 3
}


@conformance("write.slots.negative_noop", CL_NOOP, REQUIRED, "core", "write")
@SLOT_DTYPES
def test_negative_slots_are_noops(kvx_provider, kvx_call_options, slot_dtype):
    opts = kvx_call_options()
    valid = cb.spread_slots(G, 6, seed=11, exclude={3})
    slots = np.concatenate([valid[:3], NEGATIVE[slot_dtype], valid[3:]])
    case = cb.write_case(_cache(kvx_provider, opts.memory, 12), slots, slot_dtype=slot_dtype, seed=13,
                         label="negative slots between valid ones")
    verify_write(kvx_provider, case, opts, clause=CL_NOOP)


SENTINELS = {
    "minus7": -7,
    "valid_slot_value": 5,  # a non-negative sentinel that is also a valid slot
    "zero": 0,
    "beyond_range": N + 2,  # a sentinel tokens use must not turn into OUT_OF_RANGE
    "int64_max": 2 ** 63 - 1,
    # the low 32 bits are slot 5, which the tokens also use: a sentinel compared in 32 bits
    # (narrowed to an S32 slot's width) turns that valid slot into a no-op
    "high_bits": 2 ** 32 + 5,
}


@conformance("write.slots.invalid_slot_sentinel", CL_NOOP, REQUIRED, "core", "write")
@pytest.mark.parametrize("sentinel", list(SENTINELS.values()), ids=list(SENTINELS))
@SLOT_DTYPES
def test_invalid_slot_sentinel(kvx_provider, kvx_call_options, sentinel, slot_dtype):
    if slot_dtype == DType.S32 and not (-(2 ** 31) <= sentinel < 2 ** 31):
        sentinel_slot = None  # no S32 slot can hold it: the call must simply work
    else:
        sentinel_slot = sentinel
    opts = kvx_call_options()
    low = sentinel & 0xFFFFFFFF if sentinel >= 2 ** 32 else None  # its low 32 bits as a valid slot
    valid = cb.spread_slots(G, 7, seed=14, exclude={sentinel, low} - {None} if sentinel >= 0 else None)
    slots = valid.tolist()
    if sentinel_slot is not None:
        slots[1:1] = [sentinel_slot]
        slots[5:5] = [sentinel_slot, sentinel_slot]
    if low is not None and low < N:
        slots[3:3] = [low]
    case = cb.write_case(_cache(kvx_provider, opts.memory, 15), slots, slot_dtype=slot_dtype,
                         invalid_slot=sentinel, seed=16, label=f"invalid_slot={sentinel}")
    verify_write(kvx_provider, case, opts, clause=CL_NOOP)


@conformance("write.slots.all_invalid", CL_NOOP, REQUIRED, "core", "write")
def test_all_tokens_invalid(kvx_provider, kvx_call_options):
    opts = kvx_call_options()
    case = cb.write_case(_cache(kvx_provider, opts.memory, 17), [-1, 4, -3, 4], invalid_slot=4, seed=18,
                         label="every token invalid")
    verify_write(kvx_provider, case, opts, clause=CL_NOOP)


OUT_OF_RANGE = {
    DType.S32: {"first_beyond": N, "next_block": N + G.block_size + 1, "int32_max": 2 ** 31 - 1},
    DType.S64: {"first_beyond": N, "high_bits": 2 ** 32 + 3, "int64_max": 2 ** 63 - 1},
}
OOR_PARAMS = [pytest.param(dt, v, id=f"{dt.name.lower()}-{name}") for dt, d in OUT_OF_RANGE.items() for name, v in d.items()]


def _oor_case(provider, memory, slot_dtype, bad):
    valid = cb.spread_slots(G, 6, seed=19)
    slots = [*valid[:3], bad, *valid[3:]]
    return cb.write_case(_cache(provider, memory, 20), slots, slot_dtype=slot_dtype, seed=21,
                         label=f"slot {bad} >= num_blocks * block_size = {N}")


@conformance("write.slots.out_of_range_never_written", "spec 5.2, 7; R-WRITE (never written)", REQUIRED, "core", "write")
@pytest.mark.parametrize("slot_dtype,bad", OOR_PARAMS)
def test_out_of_range_never_written(kvx_provider, kvx_call_options, slot_dtype, bad):
    """Whatever the status, nothing outside the cache changes and no element gets a wrong value."""
    opts = kvx_call_options()
    case = _oor_case(kvx_provider, opts.memory, slot_dtype, bad)
    verify_write(kvx_provider, case, opts, clause="spec 5.2, 7; R-WRITE", statuses=ANY_STATUS,
                 partial=partial_write(case))


@conformance("write.slots.out_of_range_status", CL_OOR, RECOMMENDED, "core", "write")
@pytest.mark.parametrize("slot_dtype,bad", OOR_PARAMS)
def test_out_of_range_status(kvx_provider, kvx_call_options, slot_dtype, bad):
    """OUT_OF_RANGE (on DEVICE memory OK is accepted, R-DEVICE-STATUS)."""
    opts = kvx_call_options()
    case = _oor_case(kvx_provider, opts.memory, slot_dtype, bad)
    verify_write(kvx_provider, case, opts, clause=CL_OOR, partial=partial_write(case))


CL_OOR_BATCH = ("spec 5.2, 7 (a slot past num_blocks * block_size is never written), 4.1 (block_idx = slot_idx / "
                "block_size on 64-bit slots); R-WRITE (never written), R-WIDE-IDS")
#: the cache of ``write.slots.out_of_range_batch``: 320 blocks of 16 slots, 2 heads x 32 (5120 slots)
OOR_BATCH_GEOM = Geometry(num_blocks=320, block_size=16, num_kv_heads=2, head_dim=32)
NB = OOR_BATCH_GEOM.num_slots
#: token index -> slot of each out-of-range or negative slot in the batch: (slot dtype, slots) by variant. The S64
#: slots past 2^32 name valid slots in their low 32 bits (3, 777, the last slot), slots no other token writes: a path
#: that tests 0 and invalid_slot in 64 bits and then bounds and addresses a uint32 slot writes them there.
#: ``s64_wide`` holds those alone (and a negative one), so that a provider that pre-scans the slots by that bound
#: finds nothing out of range and writes them; ``s64`` mixes them with slots out of range in any width.
OOR_BATCH_SLOTS = {
    "s32": (DType.S32, {7: NB, 40: NB + 17, 111: 2 ** 31 - 1, 200: -2, 250: -(2 ** 31), 299: NB + 16 * 5}),
    "s64": (DType.S64, {7: NB, 40: 2 ** 32 + 3, 111: 2 ** 33 + 777, 200: -(2 ** 32) + 5, 250: 2 ** 63 - 1,
                        299: 2 ** 32 + NB - 1}),
    "s64_wide": (DType.S64, {40: 2 ** 32 + 3, 111: 2 ** 33 + 777, 200: -(2 ** 32) + 5, 299: 2 ** 32 + NB - 1}),
}
OOR_BATCH_PARAMS = [pytest.param(v, n, id=f"{v}-{n}") for v in OOR_BATCH_SLOTS for n in (300, 4096)]


@conformance("write.slots.out_of_range_batch", CL_OOR_BATCH, REQUIRED, "core", "write")
@pytest.mark.parametrize("variant,tokens", OOR_BATCH_PARAMS)
def test_out_of_range_batch(kvx_provider, kvx_call_options, variant, tokens):
    """``write.slots.out_of_range_never_written`` in writes of 300 and 4096 tokens (a prefill chunk, where a bulk path
    takes over): four to six out-of-range or negative slots among distinct valid ones. S32: ``num_blocks *
    block_size``, past it, ``INT32_MAX``, -2 and ``INT32_MIN``; S64: slots past 2^32 whose low 32 bits are valid
    slots no other token writes (2^32 + 3, 2^33 + 777, 2^32 + N - 1), ``-(2^32) + 5`` (negative: a no-op), ``N``
    and ``INT64_MAX``; ``s64_wide``: the slots past 2^32 and the negative one alone. Whatever the status
    (OUT_OF_RANGE is recommended: ``write.slots.out_of_range_status``), no out-of-range slot is written and nothing
    changes but what the valid tokens write (R-WRITE, R-ORDER). The other writes with such slots hold 7 tokens,
    and the batches' S64 slots past 2^32 are their ``invalid_slot``, so a bulk path past 24 tokens that takes a
    slot's low 32 bits after its 64-bit sentinel test was never run."""
    opts = kvx_call_options()
    slot_dtype, bad = OOR_BATCH_SLOTS[variant]
    if tokens > 300:  # the same slots spread over the longer batch
        bad = {i * 13 + 5: s for i, s in bad.items()}
    shadows = {s & 0xFFFFFFFF for s in bad.values() if s >= 2 ** 32}
    slots = cb.spread_slots(OOR_BATCH_GEOM, tokens, seed=40 + tokens, exclude=shadows).tolist()
    for i, s in bad.items():
        slots[i] = s
    cache = _cache(kvx_provider, opts.memory, 41, OOR_BATCH_GEOM)
    case = cb.write_case(cache, slots, slot_dtype=slot_dtype, seed=42,
                         label=f"{tokens}-token write, {slot_dtype.name} slots, out-of-range / negative slots "
                               + ", ".join(f"{s} (token {i})" for i, s in sorted(bad.items())))
    verify_write(kvx_provider, case, opts, clause=CL_OOR_BATCH, statuses=ANY_STATUS, partial=partial_write(case))


@conformance("write.slots.zero_tokens", "spec 5.2, 6.8; R-WRITE", RECOMMENDED, "core", "write")
@pytest.mark.parametrize("null_pointers", [False, True], ids=["empty_buffers", "null_pointers"])
def test_zero_tokens(kvx_provider, kvx_call_options, null_pointers):
    opts = kvx_call_options()
    ov = {"desc.io.key.data": None, "desc.io.value.data": None, "desc.slots.slots": None} if null_pointers else {}
    case = cb.write_case(_cache(kvx_provider, opts.memory, 22), [], seed=23, label="num_tokens == 0", overrides=ov)
    verify_write(kvx_provider, case, opts, clause="spec 5.2, 6.8; R-WRITE")


CL_DUPLICATES = ("spec 5.2 (no token order is given for a slot named twice); R-WRITE (informational: each element "
                 "from one of the tokens that name its slot)")


@conformance("write.slots.duplicates_any_token", CL_DUPLICATES, INFORMATIONAL, "core", "write")
def test_duplicate_slots(kvx_provider, kvx_call_options):
    """Duplicate valid slots in one write. Spec 5.2 says only that ``slots`` holds "a 1D array of slots
    for each token": it does not say which token a slot named twice keeps. The reference keeps the
    last; a provider that writes tokens in parallel may keep any of them, even element by element.
    So each element of such a slot must hold the value of one of the tokens naming it, every other
    element what a write of distinct slots leaves; the status OK."""
    import dataclasses

    from kvx_conformance import reference_impl
    from kvx_conformance.cases import execute
    from kvx_conformance.cases.checks import check_arrays_any, check_guards, check_status

    opts = kvx_call_options()
    case = cb.write_case(_cache(kvx_provider, opts.memory, 24), [3, 9, 3, 3, 9], seed=25,
                         label="duplicate valid slots")
    slots = np.asarray(case.slots.slots, np.int64)
    candidates = []
    for i, s in enumerate(slots.tolist()):
        keep = np.where((slots == s) & (np.arange(len(slots)) != i), -1, slots)
        one = dataclasses.replace(case, slots=dataclasses.replace(case.slots, slots=keep))
        candidates.append((f"token {i} kept in slot {s}", reference_impl.expected_write(one, opts.memory)))
    got = execute.run_write(kvx_provider, case, opts)
    check_status(got.status, Status.OK, clause=CL_DUPLICATES, case=case.describe())
    check_guards(got, clause=CL_DUPLICATES, case=case)
    check_arrays_any(got, candidates, case, clause=CL_DUPLICATES,
                     what="a slot named twice holds a value of none of the tokens that name it")
