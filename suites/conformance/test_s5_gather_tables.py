"""Spec 5.1, 5.3, 6.10, 7 (R-GATHER, R-DATA): ``kvx_gather_kv`` through PACKED, RAGGED
and KV_OFFSETS block tables.

Every gather is compared bit-exactly with the oracle: gathered rows hold the cache's
tokens, every other output row keeps its poisoned initial bytes, the cache is
unchanged and no guard byte moved. Data-dependent errors (bad block ids, lengths
beyond the table) are tested twice: "never out of bounds" (required, any status) and
the status (recommended; OK accepted on DEVICE memory, R-DEVICE-STATUS).
"""
from __future__ import annotations

import numpy as np
import pytest

from kvx_conformance.abi.descriptors import BlockTable, Geometry, IOLayout
from kvx_conformance.abi.header import DType, Status
from kvx_conformance.cases import build as cb
from kvx_conformance.cases.checks import partial_gather, verify_gather
from kvx_conformance.results.outcomes import RECOMMENDED, REQUIRED, conformance

G = cb.GEOM  # 6 blocks of 4 tokens, 2 heads, head_dim 8
BS = G.block_size
ANY_STATUS = tuple(Status)
CL_PACKED = "spec 5.1 (PACKED), 5.3, 6.10, 7; R-GATHER"
CL_RAGGED = "spec 5.1 (RAGGED), 5.3, 6.10; R-GATHER, R-DATA"
CL_KVOFF = "spec 5.1 (KV_OFFSETS), 6.7, 10; kvx-abi-1.1; R-GATHER, R-DATA"
CL_UNTOUCHED = "spec 6.10, 7; R-DATA (rows t >= min(L, max_seq_len) untouched)"
CL_OOR = "spec 5.1, 8 (OUT_OF_RANGE); R-DATA"
#: a block id outside the cache or a length past the table's capacity: the product readings ("Gather
#: output") say such a call "must never cause an out-of-bounds read or write; the status should be
#: OUT_OF_RANGE or INVALID_ARGUMENT" (spec 8: "Slot or index out of bounds" / "Malformed descriptor")
CL_RANGE = "spec 5.1, 8 (OUT_OF_RANGE or INVALID_ARGUMENT); R-DATA"
RANGE_STATUSES = (Status.OUT_OF_RANGE, Status.INVALID_ARGUMENT)


def _cache(provider, memory, seed, dtype=DType.F16):
    return cb.simple_cache(G, cb.core_layout(provider, memory), dtype, seed=seed)


def _table(seqs, mb, seed):
    return cb.distinct_table(G, seqs, mb, seed)


INDEX_PARAMS = [
    pytest.param(DType.S32, DType.S32, id="idx_s32-lens_s32"),
    pytest.param(DType.S64, DType.S32, id="idx_s64-lens_s32"),
    pytest.param(DType.S32, DType.S64, id="idx_s32-lens_s64"),
    pytest.param(DType.S64, DType.S64, id="idx_s64-lens_s64"),
]

# ---------------------------------------------------------------------------- PACKED


@conformance("gather.packed.basic", CL_PACKED, REQUIRED, "core", "gather")
@pytest.mark.parametrize("index_dtype,lens_dtype", INDEX_PARAMS)
def test_packed_basic(kvx_provider, kvx_call_options, index_dtype, lens_dtype):
    opts = kvx_call_options()
    case = cb.packed_gather(_cache(kvx_provider, opts.memory, 1), _table(3, 3, 2), [5, 12, 1], 12, seed=3,
                            index_dtype=index_dtype, lens_dtype=lens_dtype, label="3 sequences, partial blocks")
    verify_gather(kvx_provider, case, opts, clause=CL_PACKED)


@conformance("gather.packed.zero_length_sequences", CL_PACKED, REQUIRED, "core", "gather")
def test_packed_zero_lengths(kvx_provider, kvx_call_options):
    opts = kvx_call_options()
    case = cb.packed_gather(_cache(kvx_provider, opts.memory, 4), _table(3, 2, 5), [0, 7, 0], 8, seed=6,
                            label="sequences of length 0 between others")
    verify_gather(kvx_provider, case, opts, clause=CL_PACKED)


@conformance("gather.packed.shared_blocks", CL_PACKED, REQUIRED, "core", "gather")
def test_packed_shared_blocks(kvx_provider, kvx_call_options):
    opts = kvx_call_options()
    table = [[4, 1, 2], [4, 1, 5], [3, 3, 3]]  # prefix sharing, one block used thrice
    case = cb.packed_gather(_cache(kvx_provider, opts.memory, 7), table, [10, 12, 9], 12, seed=8,
                            label="blocks shared between and within sequences")
    verify_gather(kvx_provider, case, opts, clause=CL_PACKED)


LONG = Geometry(num_blocks=640, block_size=16, num_kv_heads=1, head_dim=8)
LONG_MB = 300  # more than 256 entries in a table row


@conformance("gather.packed.long_sequences", CL_PACKED + " (logical block j of sequence s is indices[s * "
             "max_blocks_per_seq + j], for every j < max_blocks_per_seq)", REQUIRED, "core", "gather")
@pytest.mark.parametrize("index_dtype", [DType.S32, DType.S64], ids=["s32", "s64"])
def test_packed_long_sequences(kvx_provider, kvx_call_options, index_dtype):
    """Two sequences of 4800 and 4507 tokens (300 and 282 blocks of 16) through table rows of
    max_blocks_per_seq 300 with distinct ids: logical blocks 256 and later are read from their own
    entries (a row staged in 256 entries reads entry j % 256)."""
    opts = kvx_call_options()
    cache = cb.simple_cache(LONG, cb.core_layout(kvx_provider, opts.memory), DType.F16, seed=90)
    table = cb.distinct_table(LONG, 2, LONG_MB, 91)
    msl = LONG_MB * LONG.block_size
    case = cb.packed_gather(cache, table, [msl, msl - 293], msl, seed=92, index_dtype=index_dtype,
                            label=f"2 sequences, {LONG_MB} blocks per table row")
    verify_gather(kvx_provider, case, opts, clause=CL_PACKED)


LONGCTX = Geometry(num_blocks=4112, block_size=16, num_kv_heads=1, head_dim=8)  # 65792 slots
LONGCTX_TOKENS = 65600


@conformance("gather.packed.positions_past_65535", CL_PACKED + " (token t of a sequence for every t < "
             "min(L, max_seq_len))", REQUIRED, "core", "gather")
def test_packed_positions_past_65535(kvx_provider, kvx_call_options):
    """One sequence of 65600 tokens (4100 distinct blocks of 16, 1 head x 8 dims F16): positions
    65535 and later are gathered like the others (a grid dimension per position capped at 65535,
    as a 128k-context model's gather meets it, drops them)."""
    opts = kvx_call_options()
    cache = cb.simple_cache(LONGCTX, cb.core_layout(kvx_provider, opts.memory), DType.F16, seed=96)
    mb = -(-LONGCTX_TOKENS // LONGCTX.block_size)
    case = cb.packed_gather(cache, cb.distinct_table(LONGCTX, 1, mb, 97), [LONGCTX_TOKENS], LONGCTX_TOKENS,
                            seed=98, label=f"one sequence of {LONGCTX_TOKENS} tokens, {mb} blocks")
    verify_gather(kvx_provider, case, opts, clause=CL_PACKED)


MANY_SEQS = 65600
MANYSEQ = Geometry(num_blocks=64, block_size=4, num_kv_heads=1, head_dim=8)


@conformance("gather.packed.sequences_past_65535", CL_PACKED + " (every sequence s < seq_count of the call)",
             REQUIRED, "core", "gather")
def test_packed_sequences_past_65535(kvx_provider, kvx_call_options):
    """65600 sequences of 0 to 2 tokens in one PACKED gather (1 head x 8 dims F16, one table entry
    per sequence, max_seq_len 2): sequences 65535 and later are gathered like the others (a kernel
    that launches one grid row per sequence with ``gridDim.y`` / ``gridDim.z`` capped at 65535 drops
    them; ``gather.decode_batch`` has 320 sequences, ``gather.packed.positions_past_65535`` one)."""
    opts = kvx_call_options()
    cache = cb.simple_cache(MANYSEQ, cb.core_layout(kvx_provider, opts.memory), DType.F16, seed=99)
    rng = cb.rng_for(100)
    table = rng.integers(0, MANYSEQ.num_blocks, size=(MANY_SEQS, 1))
    lens = rng.integers(1, 3, size=MANY_SEQS)
    lens[::97] = 0  # a few empty sequences, on both sides of 65535
    case = cb.packed_gather(cache, table, lens.tolist(), 2, seed=101,
                            label=f"{MANY_SEQS} sequences of 0 to 2 tokens, one block each")
    verify_gather(kvx_provider, case, opts, clause=CL_PACKED + " (every sequence s < seq_count of the call)")


CL_NON_POW2 = ("spec 4.1 (block_idx = slot_idx / block_size, offset = slot_idx % block_size), 7.1 (only "
               "KV_OFFSETS requires a power-of-two block_size); R-DATA")


@conformance("gather.packed.block_size_non_pow2", CL_NON_POW2, REQUIRED, "core", "gather")
@pytest.mark.parametrize("block_size", [48, 96, 528])
def test_packed_block_size_non_pow2(kvx_provider, kvx_call_options, block_size):
    """block_size 48, 96 and 528 (not powers of two, >= 32): every token of a block is at its offset
    t % block_size. 528 (a hybrid model's attention block, sized to the Mamba state) has offsets 256
    and later, which a kernel of at most 256 threads per block and no loop leaves ungathered."""
    opts = kvx_call_options()
    geom = Geometry(num_blocks=4, block_size=block_size, num_kv_heads=2, head_dim=4)
    cache = cb.simple_cache(geom, cb.core_layout(kvx_provider, opts.memory), DType.F16, seed=93)
    msl = 3 * block_size
    case = cb.packed_gather(cache, cb.distinct_table(geom, 2, 3, 94), [msl, block_size + 37], msl, seed=95,
                            label=f"block_size {block_size}")
    verify_gather(kvx_provider, case, opts, clause=CL_NON_POW2)


#: the layouts and block sizes of ``gather.packed.block_size_non_pow2_layouts``: the three layouts (whatever the core
#: one), each with a block size of 48 and 528
NON_POW2_LAYOUTS = [pytest.param(kind, bs, id=f"{kind}-bs{bs}") for kind in ("nhd", "hnd", "hnd_packed") for bs in (48, 528)]
#: the sequences of each such gather (a decode batch: past the 2 of ``gather.packed.block_size_non_pow2``)
NON_POW2_SEQS = 20


@conformance("gather.packed.block_size_non_pow2_layouts", CL_NON_POW2 + "; R-CACHE (every layout)", REQUIRED, "core",
             "gather")
@pytest.mark.parametrize("kind,block_size", NON_POW2_LAYOUTS)
def test_packed_block_size_non_pow2_layouts(kvx_provider, kvx_call_options, kind, block_size):
    """``gather.packed.block_size_non_pow2`` as a batch of 20 PACKED sequences (lengths 1 to 2 * block_size, two
    blocks of table each, blocks shared between sequences) from NHD, HND and HND_PACKED caches. That test
    gathers 2 sequences of the core layout's caches, and the other gathers from blocks of no power of two hold
    2 sequences too (``shapes.layouts``), so a batch kernel of another layout that takes the block offset with a mask
    (``t & (block_size - 1)``, right for powers of two only) was never run. A refusal of a layout other than
    the provider's core one is the layout's (R-REFUSAL)."""
    opts = kvx_call_options()
    geom = Geometry(num_blocks=5, block_size=block_size, num_kv_heads=2, head_dim=4)
    cache = cb.simple_cache(geom, kind, DType.F16, seed=96)
    rng = cb.rng_for(97)
    table = rng.integers(0, geom.num_blocks, size=(NON_POW2_SEQS, 2))
    lens = rng.integers(1, 2 * block_size + 1, size=NON_POW2_SEQS).tolist()
    case = cb.packed_gather(cache, table, lens, 2 * block_size, seed=98,
                            label=f"{kind.upper()} F16 cache, block_size {block_size}, {NON_POW2_SEQS} sequences")
    verify_gather(kvx_provider, case, opts, clause=CL_NON_POW2 + "; R-CACHE", feature=())


@conformance("gather.packed.max_seq_len_truncates", "spec 6.10, 7 (max_seq_len bounds the gather); R-DATA",
             REQUIRED, "core", "gather")
def test_packed_truncation(kvx_provider, kvx_call_options):
    opts = kvx_call_options()
    case = cb.packed_gather(_cache(kvx_provider, opts.memory, 9), _table(3, 3, 10), [12, 9, 3], 6, seed=11,
                            label="lengths above max_seq_len")
    verify_gather(kvx_provider, case, opts, clause="spec 6.10, 7; R-DATA")


@conformance("gather.packed.untouched_rows", CL_UNTOUCHED, REQUIRED, "core", "gather")
def test_packed_untouched_rows(kvx_provider, kvx_call_options):
    opts = kvx_call_options()
    case = cb.packed_gather(_cache(kvx_provider, opts.memory, 12), _table(2, 3, 13), [1, 6], 11, seed=14,
                            label="short sequences, long padded rows")
    verify_gather(kvx_provider, case, opts, clause=CL_UNTOUCHED)


@conformance("gather.packed.length_beyond_capacity_truncated",
             "spec 6.10; R-DATA (only min(L, max_seq_len) tokens need blocks)", REQUIRED, "core", "gather")
def test_packed_capacity_truncated(kvx_provider, kvx_call_options):
    opts = kvx_call_options()
    case = cb.packed_gather(_cache(kvx_provider, opts.memory, 15), _table(2, 2, 16), [20, 3], 2 * BS, seed=17,
                            label="length 20 > capacity 8, max_seq_len 8")
    verify_gather(kvx_provider, case, opts, clause="spec 6.10; R-DATA")


#: (sequences, max_seq_len) of ``gather.packed.max_seq_len_past_table``: tables of 3 entries (12 tokens) a
#: sequence, max_seq_len one token past them and a CUDA-graph bucket of 64
PAST_TABLE = [pytest.param(3, 13, id="seqs3-msl13"), pytest.param(320, 13, id="seqs320-msl13"),
              pytest.param(320, 64, id="seqs320-msl64")]


@conformance("gather.packed.max_seq_len_past_table", "spec 6.10, 7 (max_seq_len bounds the gather length per "
             "sequence); R-DATA (a sequence needs ceil(min(L, max_seq_len) / block_size) table entries)", REQUIRED,
             "core", "gather")
@pytest.mark.parametrize("seqs,max_seq_len", PAST_TABLE)
def test_packed_max_seq_len_past_table(kvx_provider, kvx_call_options, seqs, max_seq_len):
    """A gather whose ``max_seq_len`` (a bucket an engine pads it to) is past what the table's rows
    hold, ``max_blocks_per_seq * block_size``, while every sequence's length fits its row (0 to 12
    tokens, 3 entries of 4): valid, each sequence gathered, the rows past its length untouched. Only
    ``ceil(min(L, max_seq_len) / block_size) > max_blocks_per_seq`` is OUT_OF_RANGE (R-DATA), never a
    table narrower than max_seq_len alone. The other engine-sized gathers size their tables by
    max_seq_len, so a batch path that checks the table's width against max_seq_len (the size of its
    grid) and refuses the call was never reached."""
    opts = kvx_call_options()
    rng = cb.rng_for(18 + seqs + max_seq_len)
    mb = 3
    table = rng.integers(0, G.num_blocks, size=(seqs, mb))
    lens = rng.integers(0, mb * BS + 1, size=seqs)
    lens[0] = mb * BS  # a full row
    case = cb.packed_gather(_cache(kvx_provider, opts.memory, 19), table, lens.tolist(), max_seq_len, seed=20,
                            label=f"{seqs} sequences of 0 to {mb * BS} tokens, {mb} entries a row, max_seq_len "
                                  f"{max_seq_len}")
    verify_gather(kvx_provider, case, opts, clause=CL_PACKED + "; R-DATA")


UNUSED = {"minus1": -1, "num_blocks": G.num_blocks, "int32_min": -(2 ** 31), "large": 2 ** 30}


@conformance("gather.packed.unused_entries_ignored", "spec 5.1, 6.10; R-DATA (only used blocks are checked)",
             REQUIRED, "core", "gather")
@pytest.mark.parametrize("junk", list(UNUSED.values()), ids=list(UNUSED))
def test_packed_unused_entries(kvx_provider, kvx_call_options, junk):
    opts = kvx_call_options()
    table = _table(2, 4, 18)
    table[0, 2:] = junk  # sequence 0 uses 2 blocks
    table[1, 1:] = junk  # sequence 1 uses 1 block
    case = cb.packed_gather(_cache(kvx_provider, opts.memory, 19), table, [7, 4], 16, seed=20,
                            label=f"unused table entries = {junk}")
    verify_gather(kvx_provider, case, opts, clause="spec 5.1, 6.10; R-DATA")


BAD_IDS = {
    "negative": -1, "num_blocks": G.num_blocks, "int32_max": 2 ** 31 - 1,
    # S64 ids whose low 32 bits name a block inside the cache: a 64-bit id is 64 bits wide
    "s64_high_bits": 2 ** 32 + 1, "s64_negative_high": -(2 ** 32) + 2,
}


def _id_dtype(bad: int) -> DType:
    """S32 indices where the id fits them, else S64."""
    return DType.S32 if -(2 ** 31) <= bad < 2 ** 31 else DType.S64


def _bad_packed(provider, memory, bad):
    table = _table(2, 3, 21)
    table[1, 1] = bad
    return cb.packed_gather(_cache(provider, memory, 22), table, [9, 7], 12, seed=23, index_dtype=_id_dtype(bad),
                            label=f"used block id {bad} outside [0, {G.num_blocks})")


@conformance("gather.packed.bad_block_id_no_oob", "spec 5.1, 7; R-DATA (never out of bounds)", REQUIRED, "core", "gather")
@pytest.mark.parametrize("bad", list(BAD_IDS.values()), ids=list(BAD_IDS))
def test_packed_bad_block_never_oob(kvx_provider, kvx_call_options, bad):
    opts = kvx_call_options()
    case = _bad_packed(kvx_provider, opts.memory, bad)
    verify_gather(kvx_provider, case, opts, clause="spec 5.1, 7; R-DATA", statuses=ANY_STATUS,
                  partial=partial_gather(case))


@conformance("gather.packed.bad_block_id_status", CL_RANGE, RECOMMENDED, "core", "gather")
@pytest.mark.parametrize("bad", list(BAD_IDS.values()), ids=list(BAD_IDS))
def test_packed_bad_block_status(kvx_provider, kvx_call_options, bad):
    opts = kvx_call_options()
    case = _bad_packed(kvx_provider, opts.memory, bad)
    verify_gather(kvx_provider, case, opts, clause=CL_RANGE, statuses=RANGE_STATUSES, partial=partial_gather(case))


#: ids outside [0, 6) that ``gather.packed.bad_block_id_batch_no_oob`` puts in used entries, by index dtype: none is
#: 0 modulo num_blocks (taken as a 64-bit or a 32-bit unsigned value), the block a provider that skips a bad id may read
#: (``checks.repaired_gather``), so a wrap of the id into the cache (or a mask, for most of them) gathers another block
BAD_BATCH_IDS = {
    DType.S32: [G.num_blocks + 1, 2 ** 31 - 1, -1, -(2 ** 31)],
    DType.S64: [2 ** 32 + 1, -(2 ** 32) + 2, G.num_blocks + 3, 2 ** 63 - 1],
}
#: the (sequence, logical block) entries holding them in a batch of 20 and of 260 sequences (none the last sequence)
BAD_BATCH_AT = {20: [(2, 0), (7, 2), (11, 1), (16, 2)], 260: [(5, 0), (64, 1), (131, 2), (257, 1)]}


@conformance("gather.packed.bad_block_id_batch_no_oob", "spec 5.1, 7; R-DATA (a block id outside the cache is never "
             "read, in a call of any size)", REQUIRED, "core", "gather")
@pytest.mark.parametrize("seqs", sorted(BAD_BATCH_AT), ids=lambda s: f"seqs{s}")
@pytest.mark.parametrize("index_dtype", [DType.S32, DType.S64], ids=["idx_s32", "idx_s64"])
def test_packed_bad_block_batch_never_oob(kvx_provider, kvx_call_options, seqs, index_dtype):
    """``gather.packed.bad_block_id_no_oob`` in decode batches: 20 and 260 sequences of 1 to 12 tokens (tables of 3
    entries, max_seq_len 12) whose four used entries hold ids outside the cache among good ones (S32: 7, 2^31 - 1, -1,
    INT32_MIN; S64: 2^32 + 1, -(2^32) + 2, 9, 2^63 - 1). Any status (OUT_OF_RANGE recommended,
    ``gather.packed.bad_block_id_status``), but those entries' rows stay untouched (or read block 0, as a skipping
    provider does): nothing else is gathered for them. That test holds 2 sequences and the generated invalid calls 1
    to 4, so a batch path that never bounds a block id (a read past the cache; here the id taken modulo num_blocks)
    and answers OK was never run."""
    opts = kvx_call_options()
    rng = cb.rng_for(110 + seqs)
    table = rng.integers(0, G.num_blocks, size=(seqs, 3))
    lens = rng.integers(1, 3 * BS + 1, size=seqs).tolist()
    for (s, j), bad in zip(BAD_BATCH_AT[seqs], BAD_BATCH_IDS[index_dtype]):
        table[s, j] = bad
        lens[s] = 3 * BS  # every entry of the row used
    lens_dtype = DType.S64 if index_dtype == DType.S64 else DType.S32
    case = cb.packed_gather(_cache(kvx_provider, opts.memory, 111), table, lens, 3 * BS, seed=112,
                            index_dtype=index_dtype, lens_dtype=lens_dtype,
                            label=f"{seqs} sequences, {index_dtype.name} ids {BAD_BATCH_IDS[index_dtype]} at "
                                  f"(sequence, block) {BAD_BATCH_AT[seqs]}")
    verify_gather(kvx_provider, case, opts, clause="spec 5.1, 7; R-DATA", statuses=ANY_STATUS,
                  partial=partial_gather(case))


@conformance("gather.packed.wide_seq_len", "spec 5.3, 6.10; R-DATA (S64 lengths are 64 bits wide)", REQUIRED,
             "core", "gather")
def test_packed_wide_seq_len(kvx_provider, kvx_call_options):
    """An S64 length of 2^32 + 3 gathers min(L, max_seq_len) = 8 tokens, not 3."""
    opts = kvx_call_options()
    case = cb.packed_gather(_cache(kvx_provider, opts.memory, 35), _table(2, 2, 36), [2 ** 32 + 3, 5], 2 * BS,
                            seed=37, index_dtype=DType.S64, lens_dtype=DType.S64,
                            label="S64 length 2^32 + 3, max_seq_len 8")
    verify_gather(kvx_provider, case, opts, clause="spec 5.3, 6.10; R-DATA")


def _negative_wide_len(provider, memory):
    return cb.packed_gather(_cache(provider, memory, 38), _table(2, 2, 39), [5, -(2 ** 32) + 3], 2 * BS, seed=34,
                            index_dtype=DType.S64, lens_dtype=DType.S64,
                            label="S64 length -(2^32) + 3 (negative; its low 32 bits say 3)")


@conformance("gather.packed.wide_negative_seq_len_no_oob", "spec 5.3; R-DATA (a negative length gathers nothing)",
             REQUIRED, "core", "gather")
def test_packed_wide_negative_seq_len(kvx_provider, kvx_call_options):
    opts = kvx_call_options()
    case = _negative_wide_len(kvx_provider, opts.memory)
    verify_gather(kvx_provider, case, opts, clause="spec 5.3; R-DATA", statuses=ANY_STATUS,
                  partial=partial_gather(case))


@conformance("gather.packed.wide_negative_seq_len_status", "spec 5.3, 8 (INVALID_ARGUMENT); R-DATA", RECOMMENDED,
             "core", "gather")
def test_packed_wide_negative_seq_len_status(kvx_provider, kvx_call_options):
    opts = kvx_call_options()
    case = _negative_wide_len(kvx_provider, opts.memory)
    verify_gather(kvx_provider, case, opts, clause="spec 5.3, 8; R-DATA", partial=partial_gather(case))


@conformance("gather.packed.negative_seq_len_s32", "spec 5.3; R-DATA (a negative length is INVALID_ARGUMENT; S32 "
             "lengths are sign-extended, -1 is not 2^32 - 1)", REQUIRED, "core", "gather")
def test_packed_negative_seq_len_s32(kvx_provider, kvx_call_options):
    opts = kvx_call_options()
    case = cb.packed_gather(_cache(kvx_provider, opts.memory, 40), _table(2, 2, 41), [5, -1], 2 * BS, seed=42,
                            lens_dtype=DType.S32, label="S32 lengths [5, -1]")
    verify_gather(kvx_provider, case, opts, clause="spec 5.3; R-DATA", expect=Status.INVALID_ARGUMENT,
                  partial=partial_gather(case))


#: the sequences of ``gather.packed.negative_seq_len_batch`` and the one among them whose length is negative
NEG_BATCH_SEQS, NEG_BATCH_AT = 20, 11


@conformance("gather.packed.negative_seq_len_batch", "spec 5.3; R-DATA (a negative length is INVALID_ARGUMENT in a "
             "call of any size; S32 lengths are sign-extended, -1 is not 2^32 - 1)", REQUIRED, "core", "gather")
@pytest.mark.parametrize("negative", [-1, -(2 ** 31)], ids=["minus1", "int32_min"])
def test_packed_negative_seq_len_batch(kvx_provider, kvx_call_options, negative):
    """``gather.packed.negative_seq_len_s32`` in a decode batch: 20 sequences of S32 lengths 1 to 12 (tables of 3
    entries, max_seq_len 12), sequence 11's length -1 or INT32_MIN: INVALID_ARGUMENT, nothing but the valid part
    gathered. That test holds 2 sequences and the generated invalid calls 1 to 3, so a batch path that takes
    min(L, max_seq_len) against the uint32_t ``max_seq_len`` unsigned (C's conversions make -1 2^32 - 1) and
    gathers max_seq_len tokens of that sequence, answering OK, was never run."""
    opts = kvx_call_options()
    rng = cb.rng_for(43)
    table = rng.integers(0, G.num_blocks, size=(NEG_BATCH_SEQS, 3))
    lens = rng.integers(1, 3 * BS + 1, size=NEG_BATCH_SEQS).tolist()
    lens[NEG_BATCH_AT] = negative
    case = cb.packed_gather(_cache(kvx_provider, opts.memory, 44), table, lens, 3 * BS, seed=45,
                            lens_dtype=DType.S32,
                            label=f"{NEG_BATCH_SEQS} sequences, S32 length {negative} at sequence {NEG_BATCH_AT}")
    verify_gather(kvx_provider, case, opts, clause="spec 5.3; R-DATA", expect=Status.INVALID_ARGUMENT,
                  partial=partial_gather(case))


def _beyond_capacity(provider, memory):
    return cb.packed_gather(_cache(provider, memory, 24), _table(2, 2, 25), [3, 11], 12, seed=26,
                            label="length 11 needs 3 blocks, table holds 2")


@conformance("gather.packed.beyond_capacity_no_oob", "spec 5.1, 6.10; R-DATA (never out of bounds)", REQUIRED,
             "core", "gather")
def test_packed_beyond_capacity_never_oob(kvx_provider, kvx_call_options):
    opts = kvx_call_options()
    case = _beyond_capacity(kvx_provider, opts.memory)
    verify_gather(kvx_provider, case, opts, clause="spec 5.1, 6.10; R-DATA", statuses=ANY_STATUS,
                  partial=partial_gather(case))


@conformance("gather.packed.beyond_capacity_status", CL_RANGE, RECOMMENDED, "core", "gather")
def test_packed_beyond_capacity_status(kvx_provider, kvx_call_options):
    opts = kvx_call_options()
    case = _beyond_capacity(kvx_provider, opts.memory)
    verify_gather(kvx_provider, case, opts, clause=CL_RANGE, statuses=RANGE_STATUSES, partial=partial_gather(case))


@conformance("gather.packed.output_4d", "spec 6.8, 6.10; R-IO (4-D padded output)", RECOMMENDED, "core", "gather",
             feature="gather_4d")
def test_packed_4d(kvx_provider, kvx_call_options):
    opts = kvx_call_options()
    case = cb.packed_gather(_cache(kvx_provider, opts.memory, 27), _table(3, 2, 28), [6, 0, 8], 8, seed=29,
                            out4d=True, label="4-D output [seq, max_seq_len, H, D]")
    verify_gather(kvx_provider, case, opts, clause="spec 6.8, 6.10; R-IO", feature="gather_4d")


@conformance("gather.packed.output_4d_sequence_stride", "spec 6.8, 6.10; R-IO (4-D output with its own strides: "
             "sequence s at s * stride[0], not at s * shape[1] * stride[1]; a correct result or a refusal)", REQUIRED,
             "core", "gather", feature="gather_4d")
def test_packed_4d_sequence_stride(kvx_provider, kvx_call_options):
    opts = kvx_call_options()
    base = cb.packed_gather(_cache(kvx_provider, opts.memory, 27), _table(3, 2, 28), [6, 0, 8], 8, seed=29,
                            out4d=True, label="4-D output, 3 padding rows between sequences")
    lay = base.out_layout
    hd = G.num_kv_heads * G.head_dim
    lay = IOLayout(lay.dtype, lay.shape, (lay.stride[0] + 3 * hd, *lay.stride[1:]))
    rng = cb.rng_for(30)
    n = lay.span_elements()
    case = cb.replace(base, out_layout=lay, out_k_init=cb.poison(rng, lay.dtype, n),
                      out_v_init=cb.poison(rng, lay.dtype, n), label=f"4-D output strides {lay.stride}")
    verify_gather(kvx_provider, case, opts, clause="spec 6.8, 6.10; R-IO", feature="gather_4d")


CL_4D_SEQ_BATCH = ("spec 4.2 (implementations MUST honor provided strides), 6.8, 6.10; R-IO (4-D output with its own "
                   "strides: sequence s at s * stride[0], not at s * shape[1] * stride[1], in a gather of any size; a "
                   "correct result or a refusal)")
#: the decode batches of ``gather.packed.output_4d_sequence_stride_batch``: max_seq_len, and the rows each sequence
#: of the output holds (an output allocated for a longer context, viewed at this step's max_seq_len)
SEQ_STRIDE_BATCH_MSL, SEQ_STRIDE_BATCH_ROWS = 12, 16


@conformance("gather.packed.output_4d_sequence_stride_batch", CL_4D_SEQ_BATCH, REQUIRED, "core", "gather",
             feature="gather_4d")
@pytest.mark.parametrize("seqs", [40, 260])
def test_packed_4d_sequence_stride_batch(kvx_provider, kvx_call_options, seqs):
    """``gather.packed.output_4d_sequence_stride`` in decode batches: 40 and 260 sequences (lengths 0 to 15, some
    past max_seq_len 12) gathered into 4-D outputs of dense rows whose sequence stride holds 16 rows, as an output
    allocated once for a longer context and viewed at each step's max_seq_len. The other 4-D gathers with such a
    stride hold 3 sequences, and every engine-sized 4-D gather is dense, so a batch path that places sequence s at
    ``s * max_seq_len`` rows (``stride[0]`` unread) was never reached; every element of both outputs, the 4 rows
    past each sequence's max_seq_len included, is compared (they stay poison)."""
    opts = kvx_call_options()
    cache = _cache(kvx_provider, opts.memory, 393)
    rng = cb.rng_for(394)
    table = rng.integers(0, G.num_blocks, size=(seqs, SEQ_STRIDE_BATCH_MSL // G.block_size))
    lens = rng.integers(0, SEQ_STRIDE_BATCH_MSL + 4, size=seqs).tolist()
    base = cb.packed_gather(cache, table, lens, SEQ_STRIDE_BATCH_MSL, seed=395, out4d=True)
    lay = base.out_layout
    hd = G.num_kv_heads * G.head_dim
    lay = IOLayout(lay.dtype, lay.shape, (SEQ_STRIDE_BATCH_ROWS * hd, *lay.stride[1:]))
    rng = cb.rng_for(396)
    n = lay.span_elements()
    case = cb.replace(base, out_layout=lay, out_k_init=cb.poison(rng, lay.dtype, n),
                      out_v_init=cb.poison(rng, lay.dtype, n),
                      label=f"{seqs}-sequence gather into 4-D outputs of {SEQ_STRIDE_BATCH_ROWS} rows a sequence "
                            f"(max_seq_len {SEQ_STRIDE_BATCH_MSL}), strides {lay.stride}")
    verify_gather(kvx_provider, case, opts, clause=CL_4D_SEQ_BATCH, feature="gather_4d")


@conformance("gather.packed.max_seq_len_zero", "spec 6.10; R-GATHER (max_seq_len 0 is a no-op)", RECOMMENDED,
             "core", "gather")
def test_packed_max_seq_len_zero(kvx_provider, kvx_call_options):
    opts = kvx_call_options()
    case = cb.packed_gather(_cache(kvx_provider, opts.memory, 30), _table(2, 2, 31), [5, 3], 0, seed=32,
                            label="max_seq_len 0, num_tokens 0")
    verify_gather(kvx_provider, case, opts, clause="spec 6.10; R-GATHER")


@conformance("gather.packed.zero_sequences", "spec 6.10; R-GATHER", RECOMMENDED, "core", "gather")
def test_packed_zero_sequences(kvx_provider, kvx_call_options):
    opts = kvx_call_options()
    case = cb.packed_gather(_cache(kvx_provider, opts.memory, 33), np.zeros((0, 2), np.int64), [], 4, seed=34,
                            label="seq_count 0")
    verify_gather(kvx_provider, case, opts, clause="spec 6.10; R-GATHER")


@conformance("gather.packed.no_blocks_all_empty", CL_PACKED + "; R-DATA (ceil(0 / block_size) = 0 blocks "
             "needed: OK, every row untouched)", REQUIRED, "core", "gather")
def test_packed_no_blocks_all_empty(kvx_provider, kvx_call_options):
    """max_blocks_per_seq 0 (indices_count 0, indices NULL) and every length 0, max_seq_len 4: a
    batch of empty sequences is valid (no R-GATHER rule rejects it, no block is needed), OK with
    the 2 x 4 output rows untouched."""
    opts = kvx_call_options()
    case = cb.packed_gather(_cache(kvx_provider, opts.memory, 35), np.zeros((2, 0), np.int64), [0, 0], 4, seed=36,
                            label="max_blocks_per_seq 0, lengths [0, 0], max_seq_len 4")
    verify_gather(kvx_provider, case, opts, clause=CL_PACKED + "; R-DATA")


# ---------------------------------------------------------------------------- RAGGED

RAGGED_DTYPES = [
    pytest.param(DType.S32, DType.S32, id="idx_s32-indptr_s32"),
    pytest.param(DType.S64, DType.S64, id="idx_s64-indptr_s64"),
    pytest.param(DType.S32, DType.S64, id="idx_s32-indptr_s64"),
    pytest.param(DType.S64, DType.S32, id="idx_s64-indptr_s32"),  # each array read at its own width
]


@conformance("gather.ragged.basic", CL_RAGGED, REQUIRED, "tables", "gather", feature="ragged")
@pytest.mark.parametrize("index_dtype,indptr_dtype", RAGGED_DTYPES)
def test_ragged_basic(kvx_provider, kvx_call_options, index_dtype, indptr_dtype):
    opts = kvx_call_options()
    case = cb.ragged_gather(_cache(kvx_provider, opts.memory, 40), _table(3, 3, 41), [5, 12, 0], 12, seed=42,
                            index_dtype=index_dtype, indptr_dtype=indptr_dtype, label="per-token block ids")
    verify_gather(kvx_provider, case, opts, clause=CL_RAGGED, feature="ragged")


@conformance("gather.ragged.truncation_and_spare_range", CL_RAGGED, REQUIRED, "tables", "gather", feature="ragged")
def test_ragged_truncation(kvx_provider, kvx_call_options):
    opts = kvx_call_options()
    case = cb.ragged_gather(_cache(kvx_provider, opts.memory, 43), _table(3, 3, 44), [9, 3, 6], 5, seed=45,
                            extra=2, label="ranges longer than lengths, max_seq_len 5")
    verify_gather(kvx_provider, case, opts, clause=CL_RAGGED, feature="ragged")


@conformance("gather.ragged.indptr_offset", CL_RAGGED, REQUIRED, "tables", "gather", feature="ragged")
def test_ragged_indptr_offset(kvx_provider, kvx_call_options):
    """``indptr[0] > 0``: sequence s reads from ``indices[indptr[s]]`` on, not from a running count."""
    opts = kvx_call_options()
    lens = [3, 6]
    base = cb.ragged_table(_table(2, 2, 46), lens, BS, 2)
    lead = np.array([5, 0, 3], np.int64)  # entries no sequence uses
    gap = np.array([1, 1], np.int64)
    indices = np.concatenate([lead, base.indices[:3], gap, base.indices[3:]])
    indptr = np.array([3, 6 + 2, 14], np.int64)
    table = BlockTable(base.format, indices, 2, 2, index_dtype=DType.S32, indptr=indptr, indptr_dtype=DType.S32)
    case = cb.ragged_gather(_cache(kvx_provider, opts.memory, 47), _table(2, 2, 46), lens, 8, seed=48,
                            block_table=table, label="indptr = [3, 8, 14], unused entries between ranges")
    verify_gather(kvx_provider, case, opts, clause=CL_RAGGED, feature="ragged")


def _ragged_short(provider, memory):
    lens = [4, 7]
    table = _table(2, 2, 49)
    bt = cb.ragged_table(table, [4, 5], BS, 2)  # sequence 1's range holds 5 ids, 7 are gathered
    return cb.ragged_gather(_cache(provider, memory, 50), table, lens, 8, seed=51, block_table=bt,
                            label="sequence 1 gathers 7 tokens from a range of 5")


@conformance("gather.ragged.short_range_no_oob", "spec 5.1; R-DATA (never read past indices_count)", REQUIRED,
             "tables", "gather", feature="ragged")
def test_ragged_short_range_never_oob(kvx_provider, kvx_call_options):
    opts = kvx_call_options()
    case = _ragged_short(kvx_provider, opts.memory)
    verify_gather(kvx_provider, case, opts, clause="spec 5.1; R-DATA", feature="ragged", statuses=ANY_STATUS,
                  partial=partial_gather(case))


@conformance("gather.ragged.short_range_status", CL_OOR, RECOMMENDED, "tables", "gather", feature="ragged")
def test_ragged_short_range_status(kvx_provider, kvx_call_options):
    opts = kvx_call_options()
    case = _ragged_short(kvx_provider, opts.memory)
    verify_gather(kvx_provider, case, opts, clause=CL_OOR, feature="ragged", partial=partial_gather(case))


#: the sequences of ``gather.ragged.short_range_batch_no_oob`` and those among them whose range holds 3 ids fewer
#: than they gather (neither the last)
SHORT_BATCH_SEQS, SHORT_BATCH_AT = 20, (4, 13)
SHORT_BATCH_DTYPES = [pytest.param(DType.S32, DType.S64, id="idx_s32-indptr_s64"),
                      pytest.param(DType.S64, DType.S32, id="idx_s64-indptr_s32")]


@conformance("gather.ragged.short_range_batch_no_oob", "spec 5.1 (RAGGED: sequence s's tokens are indices[i] for i "
             "in [indptr[s], indptr[s+1])); R-DATA (n > indptr[s+1] - indptr[s]: nothing but the valid part "
             "gathered)", REQUIRED, "tables", "gather", feature="ragged")
@pytest.mark.parametrize("index_dtype,indptr_dtype", SHORT_BATCH_DTYPES)
def test_ragged_short_range_batch_never_oob(kvx_provider, kvx_call_options, index_dtype, indptr_dtype):
    """``gather.ragged.short_range_no_oob`` in a decode batch: 20 sequences of 4 to 12 tokens, max_seq_len 12, the
    ranges of sequences 4 and 13 holding 3 ids fewer than their lengths. Any status (OUT_OF_RANGE recommended,
    ``gather.ragged.short_range_status``), but the rows past a sequence's range stay untouched: the ids after it are
    the next sequence's. That test holds 2 sequences (the short range the last one's) and the generated invalid calls
    1 to 4, so a batch path that bounds a sequence's tokens by ``indices_count`` alone (a sequence reading on into
    the next ranges' ids) was never run."""
    opts = kvx_call_options()
    rng = cb.rng_for(106)
    table = rng.integers(0, G.num_blocks, size=(SHORT_BATCH_SEQS, 3))
    lens = rng.integers(4, 3 * BS + 1, size=SHORT_BATCH_SEQS).tolist()
    ranges = list(lens)
    for s in SHORT_BATCH_AT:
        ranges[s] = lens[s] - 3
    bt = cb.ragged_table(table, ranges, BS, 3, index_dtype=index_dtype, indptr_dtype=indptr_dtype)
    case = cb.ragged_gather(_cache(kvx_provider, opts.memory, 107), table, lens, 3 * BS, seed=108, block_table=bt,
                            label=f"{SHORT_BATCH_SEQS} sequences, the ranges of sequences {list(SHORT_BATCH_AT)} 3 ids "
                                  f"short of their lengths, {index_dtype.name} indices, {indptr_dtype.name} indptr")
    verify_gather(kvx_provider, case, opts, clause="spec 5.1; R-DATA", feature="ragged", statuses=ANY_STATUS,
                  partial=partial_gather(case))


def _ragged_bad_id(provider, memory, bad):
    table = _table(2, 2, 52)
    bt = cb.ragged_table(table, [6, 5], BS, 2, index_dtype=_id_dtype(bad))
    bt.indices[8] = bad  # sequence 1, token 2
    return cb.ragged_gather(_cache(provider, memory, 53), table, [6, 5], 8, seed=54, block_table=bt,
                            label=f"RAGGED block id {bad}")


@conformance("gather.ragged.bad_block_id_no_oob", "spec 5.1; R-DATA (never out of bounds)", REQUIRED, "tables",
             "gather", feature="ragged")
@pytest.mark.parametrize("bad", list(BAD_IDS.values()), ids=list(BAD_IDS))
def test_ragged_bad_block_never_oob(kvx_provider, kvx_call_options, bad):
    opts = kvx_call_options()
    case = _ragged_bad_id(kvx_provider, opts.memory, bad)
    verify_gather(kvx_provider, case, opts, clause="spec 5.1; R-DATA", feature="ragged", statuses=ANY_STATUS,
                  partial=partial_gather(case))


@conformance("gather.ragged.bad_block_id_status", CL_RANGE, RECOMMENDED, "tables", "gather", feature="ragged")
@pytest.mark.parametrize("bad", list(BAD_IDS.values()), ids=list(BAD_IDS))
def test_ragged_bad_block_status(kvx_provider, kvx_call_options, bad):
    opts = kvx_call_options()
    case = _ragged_bad_id(kvx_provider, opts.memory, bad)
    verify_gather(kvx_provider, case, opts, clause=CL_RANGE, feature="ragged", statuses=RANGE_STATUSES,
                  partial=partial_gather(case))


#: (block_size, index dtype, indptr dtype) of ``gather.ragged.block_size_non_pow2_batch``
RAGGED_NON_POW2 = [pytest.param(48, DType.S32, DType.S64, id="bs48"),
                   pytest.param(528, DType.S64, DType.S32, id="bs528")]


@conformance("gather.ragged.block_size_non_pow2_batch", CL_RAGGED + "; " + CL_NON_POW2, REQUIRED, "tables", "gather",
             feature="ragged")
@pytest.mark.parametrize("block_size,index_dtype,indptr_dtype", RAGGED_NON_POW2)
def test_ragged_block_size_non_pow2_batch(kvx_provider, kvx_call_options, block_size, index_dtype, indptr_dtype):
    """``gather.packed.block_size_non_pow2_layouts`` through a RAGGED table: 20 sequences of 1 to
    2 * block_size tokens (blocks of 48 or 528, shared between sequences) from F16 caches of the core
    layout. Token t of sequence s is at block ``indices[indptr[s] + t]``, offset ``t % block_size`` (spec
    5.1). Every other RAGGED gather uses blocks of 4 or 16 tokens (the generated batches draw other sizes
    only by chance), so a RAGGED batch kernel that takes the block offset with a mask
    (``t & (block_size - 1)``, right for powers of two only) was never run."""
    opts = kvx_call_options()
    geom = Geometry(num_blocks=5, block_size=block_size, num_kv_heads=2, head_dim=4)
    cache = cb.simple_cache(geom, cb.core_layout(kvx_provider, opts.memory), DType.F16, seed=99)
    rng = cb.rng_for(100 + block_size)
    table = rng.integers(0, geom.num_blocks, size=(NON_POW2_SEQS, 2))
    lens = rng.integers(1, 2 * block_size + 1, size=NON_POW2_SEQS).tolist()
    case = cb.ragged_gather(cache, table, lens, 2 * block_size, seed=101, index_dtype=index_dtype,
                            indptr_dtype=indptr_dtype,
                            label=f"RAGGED, F16 cache, block_size {block_size}, {NON_POW2_SEQS} sequences, "
                                  f"{index_dtype.name} indices, {indptr_dtype.name} indptr")
    verify_gather(kvx_provider, case, opts, clause=CL_RAGGED + "; " + CL_NON_POW2, feature="ragged")


@conformance("gather.ragged.output_4d", "spec 6.8, 6.10; R-IO (4-D padded output)", RECOMMENDED, "tables",
             "gather", feature="gather_4d")
def test_ragged_4d(kvx_provider, kvx_call_options):
    opts = kvx_call_options()
    case = cb.ragged_gather(_cache(kvx_provider, opts.memory, 55), _table(2, 2, 56), [7, 2], 8, seed=57,
                            out4d=True, label="RAGGED into a 4-D output")
    verify_gather(kvx_provider, case, opts, clause="spec 6.8, 6.10; R-IO", feature="gather_4d")


# ---------------------------------------------------------------------------- KV_OFFSETS

SEC, NULL = cb.SECONDARY, cb.NULL_INDEX


def _kv_cache(provider, memory, seed, primary=10, secondary=0, dtype=DType.F16, secondary_null=False):
    c = cb.kv_offsets_cache(G, dtype, primary_blocks=primary, secondary_blocks=secondary, seed=seed,
                            secondary_null=secondary_null)
    kind = cb.core_layout(provider, memory)
    t = cb.layout(G, kind, dtype)
    return cb.replace(c, k=t, v=t, k_init=cb.finite_values(cb.rng_for(seed), dtype, t.span_elements()),
                      v_init=cb.finite_values(cb.rng_for(seed + 1), dtype, t.span_elements()))


def _offsets(seqs, beams, mb, seed, primary=10, secondary=0):
    """Random K and V entries (V is not K + 1); about a third from the secondary pool when it exists."""
    rng = cb.rng_for(seed)
    off = rng.integers(0, primary, size=(seqs, beams, 2, mb)).astype(np.int64)
    if secondary:
        sec = rng.random(off.shape) < 0.35
        off[sec] = SEC | rng.integers(0, secondary, size=int(sec.sum()))
    return off


@conformance("gather.kv_offsets.basic", CL_KVOFF, REQUIRED, "tables", "gather", feature="kv_offsets")
def test_kv_offsets_basic(kvx_provider, kvx_call_options):
    opts = kvx_call_options()
    case = cb.kv_offsets_gather(_kv_cache(kvx_provider, opts.memory, 60), _offsets(3, 1, 3, 61), [9, 12, 2], 12,
                                seed=62, label="beam 1, pool of 10 blocks (> num_blocks)")
    verify_gather(kvx_provider, case, opts, clause=CL_KVOFF, feature="kv_offsets")


KVO_LARGE = Geometry(num_blocks=1, block_size=64, num_kv_heads=8, head_dim=128)  # bytes_per_block 131072


@conformance("gather.kv_offsets.large_blocks", CL_KVOFF + " (block base = pool + index * bytes_per_block, "
             "bytes_per_block >= 65536)", REQUIRED, "tables", "gather", feature="kv_offsets")
def test_kv_offsets_large_blocks(kvx_provider, kvx_call_options):
    """TensorRT-LLM's tokens_per_block 64 with 8 heads x 128 F16: bytes_per_block 131072 (2^17),
    a pool of 3 blocks. Blocks 1 and 2 start at byte 131072 and 262144 (a bytes_per_block kept in
    16 bits puts every block at the pool's start)."""
    opts = kvx_call_options()
    c = cb.kv_offsets_cache(KVO_LARGE, DType.F16, primary_blocks=3, seed=81)
    t = cb.layout(KVO_LARGE, cb.core_layout(kvx_provider, opts.memory), DType.F16)
    c = cb.replace(c, k=t, v=t, k_init=cb.finite_values(cb.rng_for(82), DType.F16, t.span_elements()),
                   v_init=cb.finite_values(cb.rng_for(83), DType.F16, t.span_elements()))
    off = np.array([[[[2, 1], [1, 0]]], [[[0, 2], [2, 1]]]], np.int64)  # [seq, beam, K|V, block]
    case = cb.kv_offsets_gather(c, off, [100, 70], 128, seed=84,
                                label="tokens_per_block 64, 8 x 128 F16: bytes_per_block 131072")
    verify_gather(kvx_provider, case, opts, clause=CL_KVOFF, feature="kv_offsets")


KVO_HEADS3 = Geometry(num_blocks=6, block_size=4, num_kv_heads=3, head_dim=8)


@conformance("gather.kv_offsets.cache_layouts", CL_KVOFF + " (inside a pool block HND [H, block_size, D], whatever "
             "the layout of cache.k / cache.v)", REQUIRED, "tables", "gather", feature="kv_offsets")
@pytest.mark.parametrize("kind", ["nhd", "hnd"])
def test_kv_offsets_cache_layouts(kvx_provider, kvx_call_options, kind):
    """The cache tensors described NHD and HND (3 heads, 2 beams): a KV_OFFSETS gather reads
    only the pools, whose blocks are HND whatever the cache tensors say; a provider that
    reads pool blocks with cache.k's layout fails the NHD case."""
    opts = kvx_call_options()
    c = cb.kv_offsets_cache(KVO_HEADS3, DType.F16, primary_blocks=10, seed=86)
    t = cb.layout(KVO_HEADS3, kind, DType.F16)
    c = cb.replace(c, k=t, v=t, k_init=cb.finite_values(cb.rng_for(87), DType.F16, t.span_elements()),
                   v_init=cb.finite_values(cb.rng_for(88), DType.F16, t.span_elements()))
    off = _offsets(2, 2, 3, 89)
    case = cb.kv_offsets_gather(c, off, [10, 7], 12, seed=90,
                                label=f"cache tensors {kind.upper()}, 3 heads, beam_width 2")
    verify_gather(kvx_provider, case, opts, clause=CL_KVOFF, feature="kv_offsets")


@conformance("gather.kv_offsets.beams", CL_KVOFF, REQUIRED, "tables", "gather", feature="kv_offsets")
@pytest.mark.parametrize("beams", [2, 3, 4, 8])
def test_kv_offsets_beams(kvx_provider, kvx_call_options, beams):
    """Each (sequence, beam) row reads its own K and V entries (R-GATHER: entry (s, beam, kv, j) at
    ``((s * beam_width + beam) * 2 + kv) * max_blocks_per_seq + j``), at the beam widths of beam search
    in engines (4 and 8 besides 2 and 3): a provider that reads beam 0's entries for every beam past
    some width is seen."""
    opts = kvx_call_options()
    case = cb.kv_offsets_gather(_kv_cache(kvx_provider, opts.memory, 63), _offsets(2, beams, 2, 64 + beams),
                                [7, 5], 8, seed=65, label=f"beam_width {beams}")
    verify_gather(kvx_provider, case, opts, clause=CL_KVOFF, feature="kv_offsets")


@conformance("gather.kv_offsets.secondary_pool", CL_KVOFF, REQUIRED, "tables", "gather", feature="secondary_pool")
@pytest.mark.parametrize("beams", [1, 2])
def test_kv_offsets_secondary(kvx_provider, kvx_call_options, beams):
    opts = kvx_call_options()
    off = _offsets(2, beams, 3, 66 + beams, primary=10, secondary=5)
    off[0, 0, 0, 0] = SEC | 4  # at least one K and one V entry in the secondary pool
    off[0, 0, 1, 1] = SEC | 2
    case = cb.kv_offsets_gather(_kv_cache(kvx_provider, opts.memory, 67, secondary=5), off, [10, 12], 12,
                                seed=68, label="primary and secondary pools")
    verify_gather(kvx_provider, case, opts, clause=CL_KVOFF, feature="secondary_pool")


KV_BATCH = Geometry(num_blocks=64, block_size=16, num_kv_heads=2, head_dim=32)
#: S64 lengths past int32 (R-WIDE-IDS) and the sequences of the KV_OFFSETS batch that get them (in turn): each is
#: above the batch's max_seq_len (64), so each such sequence gathers 64 tokens (R-DATA); narrowed to int32 they
#: read 3, 0, 17 and 9 (non-negative: a provider that narrows them answers OK with rows missing, where an
#: INVALID_ARGUMENT would be excused as a refusal of KV_OFFSETS)
KV_BATCH_WIDE_LENS = (2 ** 32 + 3, 2 ** 32, 2 ** 33 + 17, 2 ** 62 + 9)
KV_BATCH_WIDE_SEQS = (0, 3, 17, 64, 100, 127, 128, 159)


@conformance("gather.kv_offsets.secondary_pool_batch", CL_KVOFF + " - in a decode-sized batch", REQUIRED, "tables",
             "gather", feature="secondary_pool")
@pytest.mark.parametrize("beams,past_int32", [pytest.param(1, False, id="1"), pytest.param(2, False, id="2"),
                                              pytest.param(2, True, id="2-lens_s64_past_int32")])
def test_kv_offsets_secondary_batch(kvx_provider, kvx_call_options, beams, past_int32):
    """``gather.kv_offsets.secondary_pool`` in a batch of 160 sequences (0 to 64 tokens, 16-token blocks),
    about a third of the K and V entries in the secondary pool: the other secondary-pool gathers hold
    at most 4 (sequence, beam) rows, so a batch kernel taken past some row count that reads every
    entry from the primary pool (bit 31 dropped) was never reached.

    ``2-lens_s64_past_int32``: S64 lengths, 8 of them past int32 (2^32 + 3, 2^32, 2^33 + 17, 2^62 + 9),
    each gathering min(L, max_seq_len) = 64 tokens of both beams (R-WIDE-IDS, R-DATA); a batch kernel
    that narrows each length to int32 gathers 3, 0, 17 or 9 tokens of them
    (``gather.decode_batch_wide_indices[*_past_int32]`` for PACKED)."""
    opts = kvx_call_options()
    c = cb.kv_offsets_cache(KV_BATCH, DType.F16, primary_blocks=96, secondary_blocks=40, seed=75)
    t = cb.layout(KV_BATCH, cb.core_layout(kvx_provider, opts.memory), DType.F16)
    cache = cb.replace(c, k=t, v=t, k_init=cb.finite_values(cb.rng_for(76), DType.F16, t.span_elements()),
                       v_init=cb.finite_values(cb.rng_for(77), DType.F16, t.span_elements()))
    seqs, mb = 160, 4
    off = _offsets(seqs, beams, mb, 78 + beams, primary=96, secondary=40)
    lens = cb.rng_for(80 + beams).integers(0, mb * KV_BATCH.block_size + 1, size=seqs).tolist()
    lens_dtype, wide = DType.S32, ""
    if past_int32:
        for i, s in enumerate(KV_BATCH_WIDE_SEQS):
            lens[s] = KV_BATCH_WIDE_LENS[i % len(KV_BATCH_WIDE_LENS)]
        lens_dtype = DType.S64
        wide = f", S64 lengths past int32 {list(KV_BATCH_WIDE_LENS)} on sequences {list(KV_BATCH_WIDE_SEQS)}"
    case = cb.kv_offsets_gather(cache, off, lens, mb * KV_BATCH.block_size, seed=82, lens_dtype=lens_dtype,
                                label=f"{seqs} sequences x {beams} beams, primary and secondary pools" + wide)
    verify_gather(kvx_provider, case, opts, clause=CL_KVOFF + ("; 5.3, 6.5 (S64 lengths); R-WIDE-IDS" if wide else ""),
                  feature="secondary_pool")


@conformance("gather.kv_offsets.null_index_unused", "spec 5.1; kvx-abi-1.1; R-DATA (null index of an unused block)",
             REQUIRED, "tables", "gather", feature="kv_offsets")
def test_kv_offsets_null_unused(kvx_provider, kvx_call_options):
    opts = kvx_call_options()
    off = _offsets(2, 2, 3, 69)
    off[0, :, :, 2] = NULL  # sequence 0 uses 2 blocks
    off[1, :, :, 1:] = NULL  # sequence 1 uses 1 block
    case = cb.kv_offsets_gather(_kv_cache(kvx_provider, opts.memory, 70), off, [8, 3], 12, seed=71,
                                label="null index on unused blocks")
    verify_gather(kvx_provider, case, opts, clause="spec 5.1; R-DATA", feature="kv_offsets")


def _kv_bad(provider, memory, what):
    off = _offsets(2, 2, 2, 72)
    if what == "null_index":
        off[1, 1, 1, 1] = NULL
        cache = _kv_cache(provider, memory, 73)
    elif what == "null_index_with_secondary":
        # a live secondary pool: the null index must not read as secondary block 0x7FFFFFFF
        off[1, 1, 1, 1] = NULL
        cache = _kv_cache(provider, memory, 73, secondary=3)
    else:
        off[1, 0, 0, 1] = SEC | 1
        cache = _kv_cache(provider, memory, 73, secondary=3, secondary_null=True)
    return cb.kv_offsets_gather(cache, off, [5, 8], 8, seed=74, label=f"used entry: {what}")


KV_BAD = ["null_index", "null_index_with_secondary", "secondary_while_null"]


@conformance("gather.kv_offsets.unusable_entry_no_oob", "spec 5.1, 10; R-DATA (never dereferenced)", REQUIRED,
             "tables", "gather", feature="kv_offsets")
@pytest.mark.parametrize("what", KV_BAD)
def test_kv_offsets_unusable_never_oob(kvx_provider, kvx_call_options, what):
    opts = kvx_call_options()
    case = _kv_bad(kvx_provider, opts.memory, what)
    verify_gather(kvx_provider, case, opts, clause="spec 5.1, 10; R-DATA", feature="kv_offsets",
                  statuses=ANY_STATUS, partial=partial_gather(case))


@conformance("gather.kv_offsets.unusable_entry_status", CL_OOR, RECOMMENDED, "tables", "gather",
             feature="kv_offsets")
@pytest.mark.parametrize("what", KV_BAD)
def test_kv_offsets_unusable_status(kvx_provider, kvx_call_options, what):
    opts = kvx_call_options()
    case = _kv_bad(kvx_provider, opts.memory, what)
    verify_gather(kvx_provider, case, opts, clause=CL_OOR, feature="kv_offsets", partial=partial_gather(case))


#: (what, sequences, beams) of ``gather.kv_offsets.unusable_entry_batch_no_oob``, and the (sequence, beam, K|V, block)
#: entries that get the unusable value, all used (their rows' lengths are set to 12): secondary-bit entries name
#: blocks 3 and 7, which the primary pool holds, so a provider reading the primary pool for them gathers a real block
KV_BAD_BATCH = [("secondary_while_null", 20, 2), ("secondary_while_null", 260, 1), ("null_index", 20, 2),
                ("null_index", 260, 1)]
KV_BAD_BATCH_AT = {20: [(3, 1, 0, 2), (9, 0, 1, 0), (14, 1, 1, 1)], 260: [(6, 0, 0, 1), (129, 0, 1, 2), (250, 0, 0, 0)]}


@conformance("gather.kv_offsets.unusable_entry_batch_no_oob", "spec 5.1, 10; R-DATA (the null index and a "
             "secondary-pool index while pool.secondary is NULL are never dereferenced, in a call of any size)",
             REQUIRED, "tables", "gather", feature="kv_offsets")
@pytest.mark.parametrize("what,seqs,beams", KV_BAD_BATCH, ids=[f"{w}-seqs{s}" for w, s, _ in KV_BAD_BATCH])
def test_kv_offsets_unusable_batch_never_oob(kvx_provider, kvx_call_options, what, seqs, beams):
    """``gather.kv_offsets.unusable_entry_no_oob`` in decode batches: 20 sequences x 2 beams and 260 x 1 of 1 to 12
    tokens (3 entries per row, a primary pool of 10 blocks, no secondary pool), three used entries among good ones the
    null index or a secondary-pool index (blocks 3 and 7). Any status (OUT_OF_RANGE recommended,
    ``gather.kv_offsets.unusable_entry_status``), but those entries' rows stay untouched (or read primary block 0, as
    a skipping provider does). Pool indices past num_blocks are valid (R-DATA), so only these entries are data
    errors. That test holds 2 sequences and the generated invalid calls 1 to 4, so a batch path that takes an entry's
    pool as ``bit31 && secondary ? secondary : primary`` (a secondary-pool index read from the primary pool, OK) was
    never run."""
    opts = kvx_call_options()
    rng = cb.rng_for(113 + seqs)
    off = _offsets(seqs, beams, 3, 114 + seqs)
    lens = rng.integers(1, 3 * BS + 1, size=seqs).tolist()
    for i, (s, b, kv, j) in enumerate(KV_BAD_BATCH_AT[seqs]):
        off[s, b, kv, j] = NULL if what == "null_index" else SEC | (3, 7)[i % 2]
        lens[s] = 3 * BS
    case = cb.kv_offsets_gather(_kv_cache(kvx_provider, opts.memory, 115), off, lens, 3 * BS, seed=116,
                                label=f"{seqs} sequences x {beams} beams, used entries {KV_BAD_BATCH_AT[seqs]}: "
                                      f"{what}, no secondary pool")
    verify_gather(kvx_provider, case, opts, clause="spec 5.1, 10; R-DATA", feature="kv_offsets",
                  statuses=ANY_STATUS, partial=partial_gather(case))


def _kv_beyond_capacity(provider, memory):
    return cb.kv_offsets_gather(_kv_cache(provider, memory, 91), _offsets(2, 1, 2, 92), [5, 11], 12, seed=93,
                                label="length 11 needs 3 blocks, table holds 2 per (sequence, beam, K|V)")


@conformance("gather.kv_offsets.beyond_capacity_no_oob", "spec 5.1 (KV_OFFSETS: [seq_count, beam_width, 2, "
             "max_blocks_per_seq]), 6.10; R-DATA (a length needing more than max_blocks_per_seq blocks: never out "
             "of bounds)", REQUIRED, "tables", "gather", feature="kv_offsets")
def test_kv_offsets_beyond_capacity_never_oob(kvx_provider, kvx_call_options):
    """The KV_OFFSETS form of ``gather.packed.beyond_capacity_no_oob``: sequence 1 (the last row of
    the table) needs 3 blocks of a table of 2 per row. Its third K entry would be the V row's first
    and its third V entry lies past ``indices_count``: a provider that does not bound the logical
    block by ``max_blocks_per_seq`` reads another row's pool block, or the caller's memory past the
    table as a pool index. Any status; rows past the table's capacity stay untouched."""
    opts = kvx_call_options()
    case = _kv_beyond_capacity(kvx_provider, opts.memory)
    verify_gather(kvx_provider, case, opts, clause="spec 5.1, 6.10; R-DATA", feature="kv_offsets",
                  statuses=ANY_STATUS, partial=partial_gather(case))


@conformance("gather.kv_offsets.beyond_capacity_status", CL_RANGE, RECOMMENDED, "tables", "gather",
             feature="kv_offsets")
def test_kv_offsets_beyond_capacity_status(kvx_provider, kvx_call_options):
    opts = kvx_call_options()
    case = _kv_beyond_capacity(kvx_provider, opts.memory)
    verify_gather(kvx_provider, case, opts, clause=CL_RANGE, feature="kv_offsets", statuses=RANGE_STATUSES,
                  partial=partial_gather(case))


@conformance("gather.kv_offsets.output_4d", "spec 6.8, 6.10; R-IO (4-D output, rows in (sequence, beam) order)",
             RECOMMENDED, "tables", "gather", feature="gather_4d")
def test_kv_offsets_4d(kvx_provider, kvx_call_options):
    opts = kvx_call_options()
    case = cb.kv_offsets_gather(_kv_cache(kvx_provider, opts.memory, 75), _offsets(2, 2, 2, 76), [6, 8], 8,
                                seed=77, out4d=True, label="beams into [seq * beam, max_seq_len, H, D]")
    verify_gather(kvx_provider, case, opts, clause="spec 6.8, 6.10; R-IO", feature="gather_4d")


@conformance("gather.kv_offsets.truncation", CL_KVOFF, REQUIRED, "tables", "gather", feature="kv_offsets")
def test_kv_offsets_truncation(kvx_provider, kvx_call_options):
    opts = kvx_call_options()
    off = _offsets(2, 1, 2, 78)
    case = cb.kv_offsets_gather(_kv_cache(kvx_provider, opts.memory, 79), off, [30, 3], 5, seed=80,
                                label="length 30 beyond the table, max_seq_len 5")
    verify_gather(kvx_provider, case, opts, clause=CL_KVOFF, feature="kv_offsets")
