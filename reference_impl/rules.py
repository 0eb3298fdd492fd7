"""The rule catalog: every check the oracle makes, with its clause, status and R-ORDER step.

A rule id names one way a call can fail (docs/spec-readings.md). Ids that restate a
rule listed in spec 7.1 start with ``7.1.``; the others start with the reading that
states them (``R-SIZE``, ``R-CACHE``, ``R-IO``, ``R-CONVERT``, ``R-FP8``, ``R-WRITE``,
``R-GATHER``, ``R-ORDER``, ``R-DATA``). ``step`` is the R-ORDER step that runs the
check; within a step the oracle reports INVALID_ARGUMENT rules before UNSUPPORTED
ones (a malformed descriptor is malformed whatever the provider supports).
"""
from __future__ import annotations

from dataclasses import dataclass

from kvx_conformance.abi.header import Status

INVALID = Status.INVALID_ARGUMENT
UNSUPPORTED = Status.UNSUPPORTED
OUT_OF_RANGE = Status.OUT_OF_RANGE


@dataclass(frozen=True)
class Rule:
    id: str
    clause: str  # spec clause(s) and reading
    status: Status
    step: int  # R-ORDER step: 1 pointers/sizes, 2 cache, 3 call descriptor, 4 memory, 5 data
    text: str


#: Structs under a size guard (R-SIZE), by their c_overrides path, in R-ORDER.
SIZED_STRUCTS = (
    "cache",
    "cache.k",
    "cache.v",
    "cache.pool",  # only when the call's table is KV_OFFSETS
    "desc",
    "desc.io",
    "desc.io.key",
    "desc.io.value",
    "desc.slots",  # write
    "desc.k_scale_desc",  # write
    "desc.v_scale_desc",  # write
    "desc.block_table",  # gather
    "desc.seq_lens",  # gather
)

_R = [
    # -- step 1: NULL descriptor pointers and size guards
    Rule("R-SIZE.null_cache", "spec 6, 7; R-ORDER 1", INVALID, 1, "cache descriptor pointer is NULL"),
    Rule("R-SIZE.null_desc", "spec 6, 7; R-ORDER 1", INVALID, 1, "write/gather descriptor pointer is NULL"),
    *(
        Rule(f"R-SIZE.{p}", "spec 3, 6; R-SIZE", INVALID, 1, f"{p}.size below its v1.1 sizeof")
        for p in SIZED_STRUCTS
    ),
    # -- step 2: the cache descriptor (R-CACHE)
    Rule("7.1.num_blocks_zero", "spec 7.1", INVALID, 2, "num_blocks is 0"),
    Rule("7.1.block_size_zero", "spec 7.1", INVALID, 2, "block_size is 0"),
    Rule("7.1.num_kv_heads_zero", "spec 7.1", INVALID, 2, "num_kv_heads is 0"),
    Rule("7.1.head_dim_zero", "spec 7.1", INVALID, 2, "head_dim is 0"),
    Rule("R-CACHE.dtype", "spec 4.3, 6.2; R-CACHE", INVALID, 2, "k/v dtype is not a cache dtype"),
    Rule("R-CACHE.layout", "spec 4.2; R-CACHE", INVALID, 2, "k/v layout is not NHD, HND, HND_PACKED or CUSTOM"),
    Rule("R-CACHE.ndim", "spec 4.2; R-CACHE", INVALID, 2, "k/v ndim does not match the layout"),
    Rule("R-CACHE.pack_zero", "spec 4.2; R-CACHE", INVALID, 2, "HND_PACKED pack = shape[4] is not positive"),
    Rule("7.1.hnd_packed_pack_divides", "spec 4.2, 7.1", INVALID, 2, "HND_PACKED head_dim % pack != 0"),
    Rule("R-CACHE.shape", "spec 4.2, 7.1; R-CACHE", INVALID, 2, "k/v shape disagrees with the cache descriptor"),
    Rule("R-CACHE.data_null", "spec 6.2; R-CACHE", INVALID, 2, "k/v data is NULL"),
    Rule("R-CACHE.memory_invalid", "spec 6.2; R-CACHE", INVALID, 2, "k/v memory is UNKNOWN or not an enum value"),
    Rule("R-CACHE.memory_mismatch", "spec 6.2; R-CACHE", INVALID, 2, "k.memory != v.memory"),
    Rule("R-CACHE.stride_zero", "spec 4.2; R-CACHE", INVALID, 2, "a stride is 0 on a dimension of extent > 1"),
    Rule("R-CACHE.offset_overflow", "spec 4.2; R-CACHE", INVALID, 2, "the farthest element offset overflows int64"),
    Rule("R-CACHE.stride_negative", "spec 4.2; R-STRIDE-NEG", UNSUPPORTED, 2, "a k/v stride is negative"),
    # -- step 3: IO tensors (write and gather)
    Rule("R-IO.num_kv_heads", "spec 6.8, 7; R-IO", INVALID, 3, "io.num_kv_heads != cache num_kv_heads"),
    Rule("R-IO.head_dim", "spec 6.8, 7; R-IO", INVALID, 3, "io.head_dim != cache head_dim"),
    Rule("R-IO.dtype", "spec 6.8; R-IO", INVALID, 3, "io key/value dtype is not a cache dtype"),
    Rule("R-IO.memory", "spec 6.8; R-IO", INVALID, 3, "io key/value memory differs from the cache's"),
    Rule("R-IO.data_null", "spec 6.8; R-IO", INVALID, 3, "io key/value data is NULL while num_tokens > 0"),
    Rule("R-IO.ndim", "spec 6.8; R-IO", INVALID, 3, "io ndim is not 3 (write) or 3/4 (gather)"),
    Rule("R-IO.shape", "spec 6.8; R-IO", INVALID, 3, "io shape disagrees with num_tokens / heads / head_dim"),
    Rule("R-IO.offset_overflow", "spec 6.8; R-IO, R-CACHE", INVALID, 3, "the farthest io element offset overflows int64"),
    Rule("R-IO.stride_negative", "spec 6.8; R-IO, R-STRIDE-NEG", UNSUPPORTED, 3, "an io stride is negative"),
    Rule("R-CONVERT.fp8_io", "spec 4.3; R-CONVERT", UNSUPPORTED, 3, "FP8 io tensor with a cache of another dtype"),
    Rule("R-CONVERT.fp8_cache_gather", "spec 4.3; R-CONVERT", UNSUPPORTED, 3, "gather from an FP8 cache into another io dtype"),
    # -- step 3: write
    Rule("R-WRITE.token_count", "spec 5.2, 7; R-WRITE", INVALID, 3, "io.num_tokens != slots.token_count"),
    Rule("R-WRITE.slot_dtype", "spec 5.2; R-WRITE", INVALID, 3, "slots dtype is not S32/S64"),
    Rule("R-WRITE.slots_null", "spec 6.4; R-WRITE", INVALID, 3, "slots NULL with num_tokens > 0"),
    Rule("R-FP8.scale_dtype", "spec 6.6, 6.9; R-FP8", INVALID, 3, "scale descriptor with data but dtype not F32"),
    Rule("R-FP8.scale_granularity", "spec 6.6; R-FP8", INVALID, 3, "scale descriptor granularity NONE or not an enum value"),
    Rule("R-FP8.per_head_shape", "spec 6.6; R-FP8", INVALID, 3, "PER_HEAD scale without ndim 1, shape[0] == num_kv_heads"),
    Rule("R-FP8.per_block_unsupported", "spec 6.6; R-FP8", UNSUPPORTED, 3, "PER_BLOCK / PER_BLOCK_HEAD scales"),
    Rule("R-FP8.scale_stride", "spec 6.6, 4.2; R-FP8", UNSUPPORTED, 3,
         "PER_HEAD scale whose stride[0] is not 0 or 1 (values not adjacent), num_kv_heads > 1"),
    # -- step 3: gather
    Rule("R-GATHER.format", "spec 5.1, 6.3; R-GATHER", INVALID, 3, "block table format is not PACKED, RAGGED or KV_OFFSETS"),
    Rule("R-GATHER.num_tokens", "spec 6.10; R-GATHER", INVALID, 3, "io.num_tokens != seq_count * beam_width * max_seq_len"),
    Rule("R-GATHER.seq_count_match", "spec 5.3, 7", INVALID, 3, "seq_lens.seq_count != block_table.seq_count"),
    Rule("R-GATHER.seq_lens_dtype", "spec 5.3; R-GATHER", INVALID, 3, "seq_lens dtype is not S32/S64"),
    Rule("R-GATHER.lengths_null", "spec 6.5; R-GATHER", INVALID, 3, "seq_lens.lengths NULL with seq_count > 0"),
    Rule("R-GATHER.indices_null", "spec 6.3; R-GATHER", INVALID, 3, "block_table.indices NULL with indices_count > 0"),
    Rule("7.1.index_dtype", "spec 5.1, 7.1", INVALID, 3, "PACKED/RAGGED index dtype is not S32/S64"),
    Rule("7.1.packed_indices_count", "spec 5.1, 7.1", INVALID, 3, "PACKED indices_count != seq_count * max_blocks_per_seq"),
    Rule("R-GATHER.packed_indptr_count", "spec 5.1, 7.1", INVALID, 3, "PACKED indptr_count != 0"),
    Rule("R-GATHER.packed_beam_width", "spec 5.1; R-GATHER", INVALID, 3, "PACKED beam_width != 1"),
    Rule("R-GATHER.ragged_indptr_dtype", "spec 5.1, 6.3; R-GATHER", INVALID, 3, "RAGGED indptr dtype is not S32/S64"),
    Rule("R-GATHER.ragged_indptr_null", "spec 5.1; R-GATHER", INVALID, 3, "RAGGED indptr is NULL"),
    Rule("R-GATHER.ragged_indptr_count", "spec 5.1, 7.1", INVALID, 3, "RAGGED indptr_count != seq_count + 1"),
    Rule("R-GATHER.ragged_beam_width", "spec 5.1; R-GATHER", INVALID, 3, "RAGGED beam_width != 1"),
    Rule("7.1.kv_offsets_index_dtype", "spec 5.1, 7.1", INVALID, 3, "KV_OFFSETS index dtype is not S32"),
    Rule("R-GATHER.kv_offsets_flag", "spec 5.1; R-GATHER", INVALID, 3, "KV_OFFSETS flags lack KVCACHEINDEX"),
    Rule("7.1.kv_offsets_pow2", "spec 5.1, 7.1", INVALID, 3, "KV_OFFSETS block_size is not a power of two"),
    Rule("R-GATHER.kv_offsets_beam_width", "spec 5.1; R-GATHER", INVALID, 3, "KV_OFFSETS beam_width is 0"),
    Rule("7.1.kv_offsets_indices_count", "spec 5.1, 7.1", INVALID, 3,
         "KV_OFFSETS indices_count != seq_count * beam_width * 2 * max_blocks_per_seq"),
    Rule("R-GATHER.kv_offsets_indptr_count", "spec 5.1, 7.1", INVALID, 3, "KV_OFFSETS indptr_count != 0"),
    Rule("R-GATHER.pool_primary_null", "spec 6.1, 6.7; R-GATHER", INVALID, 3, "KV_OFFSETS pool.primary is NULL"),
    Rule("R-GATHER.pool_bytes_per_block", "spec 6.7; kvx-abi-1.1; R-GATHER", INVALID, 3,
         "pool.bytes_per_block != num_kv_heads * block_size * head_dim * elem_size(k.dtype)"),
    Rule("R-GATHER.kv_offsets_kv_dtype", "spec 5.1; R-GATHER", UNSUPPORTED, 3, "KV_OFFSETS with k.dtype != v.dtype"),
    # -- step 4
    Rule("R-ORDER.memory_unsupported", "spec 4.3, 8; R-ORDER 4", UNSUPPORTED, 4, "memory type the provider cannot serve"),
    # -- step 5: data-dependent
    Rule("R-WRITE.slot_out_of_range", "spec 5.2, 8; R-WRITE", OUT_OF_RANGE, 5, "a valid slot >= num_blocks * block_size"),
    Rule("R-DATA.ragged_indptr_first", "spec 5.1; R-DATA", INVALID, 5, "RAGGED indptr[0] < 0"),
    Rule("R-DATA.ragged_indptr_monotonic", "spec 5.1; R-DATA", INVALID, 5, "RAGGED indptr decreases"),
    Rule("R-DATA.ragged_indptr_last", "spec 5.1, 7.1; R-DATA", INVALID, 5, "RAGGED indptr[seq_count] != indices_count"),
    Rule("R-DATA.negative_length", "spec 5.3; R-DATA", INVALID, 5, "a seq_lens value is negative"),
    Rule("R-DATA.max_blocks", "spec 5.1, 6.10; R-DATA", OUT_OF_RANGE, 5,
         "ceil(min(L, max_seq_len) / block_size) > max_blocks_per_seq"),
    Rule("R-DATA.packed_block_id", "spec 5.1, 8; R-DATA", OUT_OF_RANGE, 5, "a used PACKED block id outside [0, num_blocks)"),
    Rule("R-DATA.ragged_seq_range", "spec 5.1; R-DATA", OUT_OF_RANGE, 5, "gathered tokens exceed the sequence's indptr range"),
    Rule("R-DATA.ragged_block_id", "spec 5.1, 8; R-DATA", OUT_OF_RANGE, 5, "a used RAGGED block id outside [0, num_blocks)"),
    Rule("R-DATA.kv_offsets_null_index", "spec 5.1; kvx-abi-1.1; R-DATA", OUT_OF_RANGE, 5,
         "a used KV_OFFSETS entry is the null index 0xFFFFFFFF"),
    Rule("R-DATA.kv_offsets_secondary_null", "spec 5.1, 10; R-DATA", OUT_OF_RANGE, 5,
         "a used KV_OFFSETS entry selects the secondary pool while pool.secondary is NULL"),
]

RULES: dict[str, Rule] = {r.id: r for r in _R}

#: UNSUPPORTED rules whose calls the oracle can also serve: the reference refuses negative strides
#: (R-STRIDE-NEG) and strided PER_HEAD scale values (R-FP8) by choice, while spec 4.2
#: ("Implementations MUST honor provided strides") and 6.6 ("Scale strides") define the result
#: of a provider that serves them.
SERVABLE: frozenset[str] = frozenset({"R-CACHE.stride_negative", "R-IO.stride_negative", "R-FP8.scale_stride"})
assert len(RULES) == len(_R), "duplicate rule id"


def rule(rule_id: str) -> Rule:
    return RULES[rule_id]
