/*
 * kvx_defect_front.c -- defective providers for kvx-conform's own tests: a thin front over the
 * bundled reference provider (libkvx_reference.so, loaded from this library's own folder) that
 * forwards every call unchanged but the calls its one defect is about. Each defect breaks a MUST
 * (or a required reading) that only some calls reach, so that a suite which never makes such a
 * call certifies it. csrc/testing/CMakeLists.txt builds it once per defect (KVX_FRONT_DEFECT):
 *
 *   libkvx_testing_fp4_own_stream.so  FRONT_OWN_STREAM (built when nvcc is found): the device work
 *       of an FP4 call goes to a non-blocking stream of the front's own instead of the caller's,
 *       with no wait on either. The write may read its rows before the caller's stream has filled
 *       them, the gather may read the cache before the write has stored it, and work queued after
 *       the gather may read its outputs before they are there (R-STREAM): `stream.order_fp4`
 *       (suites/conformance/test_s7_concurrency.py) must see it; every other check passes, since
 *       the harness waits for the whole device after each call (tests/test_stream_order.py).
 *   libkvx_testing_fp4_memo.so  FRONT_MEMO: an FP4 call on host memory whose descriptors, slots or
 *       table and first row bytes hash like one of the last 16 FP4 calls' answers OK without work
 *       (a provider caching its calls: spec 7.2, R-STATE). `fp4.state.repeated_write` and
 *       `fp4.state.repeated_gather` (suites/conformance/test_s10_fp4.py) must see it
 *       (tests/test_host_providers.py).
 *   libkvx_testing_front_ragged_scratch.so  FRONT_RAGGED_SCRATCH: a RAGGED gather on host memory
 *       first widens its block ids into one static S64 array that every call shares, then gathers
 *       through it (spec 7.2: thread-safe on disjoint cache regions; R-THREADS). Serial calls are
 *       exact; two RAGGED gathers at once read each other's ids. It waits 2 ms between filling the
 *       array and reading it, so that calls released together by the suite's barrier overlap there
 *       on any machine: `concurrency.threads.gather_ragged` must see it.
 *   libkvx_testing_front_ragged_overread.so  FRONT_RAGGED_OVERREAD: a RAGGED gather on host memory
 *       reads its indptr and indices four elements at a time with no tail loop, up to three
 *       elements past `indptr_count` / `indices_count` (R-DATA: never reads past indices_count;
 *       R-INPUTS). The values read past the end are never used, so every result is exact:
 *       `inputs.read_within_bounds_ragged` (suites/conformance/test_s7_inputs.py) must see it.
 *   libkvx_testing_front_hnd_sentinel.so  FRONT_HND_SENTINEL: a write of more than 24 tokens into
 *       BLOCK_HND K and V caches skips negative slots only, so tokens whose slot equals a
 *       non-negative `invalid_slot` are written (spec 5.2, 7: invalid_slot MUST be a no-op). NHD
 *       writes and small writes are exact: `write.prefill_batch_sentinel[hnd-*]`
 *       (suites/conformance/test_s7_state.py) must see it.
 *   libkvx_testing_front_fp8_batch_nosat.so  FRONT_FP8_BATCH_NOSAT: a quantizing write of more than 24
 *       tokens into an E5M2 cache on host memory stores inf where the reference stored the largest
 *       finite value (+-57344), as a conversion without saturation does (R-FP8: clamped to +-57344,
 *       +-inf saturate too): `fp8.write.batch[e5m2-*]` (suites/conformance/test_s4_dtypes.py).
 *   libkvx_testing_front_custom_shape.so  FRONT_CUSTOM_SHAPE: a BLOCK_CUSTOM tensor's shape is never
 *       checked (each positive entry replaced by the cache descriptor's value before forwarding), so a
 *       CUSTOM shape that disagrees with the descriptor validates OK (spec 4.2, 7, 7.1; R-CUSTOM):
 *       `validate.shape_mismatch[custom-*]` (suites/conformance/test_s7_validation.py).
 *   libkvx_testing_front_kvo_batch_secondary.so  FRONT_KVO_BATCH_SECONDARY: a KV_OFFSETS gather on host
 *       memory of 16 or more (sequence, beam) rows reads every entry from the primary pool, bit 31
 *       dropped (spec 5.1 KVCacheIndex; R-GATHER): `gather.kv_offsets.secondary_pool_batch`
 *       (suites/conformance/test_s5_gather_tables.py).
 *   libkvx_testing_front_fp4_dim64.so  FRONT_FP4_DIM64: an FP4 gather on host memory of more than 64
 *       dims leaves dims 64 and up of every output row as they were (a kernel moving one tile of 64
 *       dims; spec 4.1, R-CACHE: every head and dim): `fp4.geometries[*-gather-*]`.
 *   libkvx_testing_front_bf16_dim_tail.so  FRONT_BF16_DIM_TAIL: a gather from a BF16 cache on host
 *       memory whose head_dim is above 32 and no multiple of 32 leaves the last head_dim % 32 dims of
 *       every output row as they were: `shapes.model_heads_dtypes[gather-bf16-*]`.
 *   libkvx_testing_front_fp4_global_scratch.so  FRONT_FP4_GLOBAL_SCRATCH: an NVFP4 gather on host
 *       memory copies the cache's global scales into one array every call shares and decodes through
 *       it, waiting 2 ms between the two (spec 7.2 thread-safe calls): two layers gathered at once
 *       read each other's scales: `concurrency.threads.fp4_gather[nvfp4]`.
 *   libkvx_testing_front_convert_bulk_rtz.so  FRONT_CONVERT_BULK_RTZ: a write of more than 4096 tokens
 *       converts F32 rows into an F16 / BF16 cache by truncation, not to nearest even (R-CONVERT: the
 *       rule does not depend on the size of the call): `dtype.write.convert_batch[*-65600]`.
 *   libkvx_testing_front_fp8_heads_mod8.so  FRONT_FP8_HEADS_MOD8: a quantizing FP8 write of more than
 *       16 tokens and 8 heads quantizes head h by the per-head scale of head h % 8 (R-FP8: the value of
 *       head h, for any number of heads): `fp8.write.batch[*-h40_d16]`.
 *   libkvx_testing_front_fp4_bulk_sentinel.so  FRONT_FP4_BULK_SENTINEL: an FP4 write of more than 16
 *       tokens skips negative slots only, so tokens whose slot is a non-negative invalid_slot are
 *       written (spec 5.2, 7): `fp4.geometries[*-write-*]`.
 *   libkvx_testing_front_fp4_nested_size.so  FRONT_FP4_NESTED_SIZE: the structs inside a cache's FP4
 *       extension (scale pools, global scales) are not size-checked: a size below sizeof is read as
 *       sizeof (spec 6, R-SIZE: nested structs too): `fp4.validate.invalid[*_size_*]`.
 *   libkvx_testing_front_kvo_bpb_f32.so  FRONT_KVO_BPB_F32: a KV_OFFSETS cache of F32 K and V takes its
 *       block stride from the geometry, whatever `pool.bytes_per_block` says (R-GATHER: it must equal
 *       the block's bytes): `gather.validation.kv_offsets_bytes_per_block[f32-*]`.
 *   libkvx_testing_front_fp8_pack_rule.so  FRONT_FP8_PACK_RULE: kvx_validate_cache_desc answers OK for
 *       an FP8 HND_PACKED cache whose pack does not divide head_dim (spec 7.1):
 *       `validate.hnd_packed_pack_not_dividing_dtypes[e4m3-*|e5m2-*]`.
 *   libkvx_testing_front_kvo_beam4.so  FRONT_KVO_BEAM4: a KV_OFFSETS gather on host memory of 4 or more
 *       beams reads every beam through beam 0's entries (spec 5.1, R-GATHER: entry (s, beam, kv, j)):
 *       `gather.kv_offsets.beams[4|8]`.
 *   libkvx_testing_front_hnd_heads64.so  FRONT_HND_HEADS64: a gather from BLOCK_HND K and V caches of
 *       more than 64 heads moves heads 0-63 only, the others' output rows left as they were (spec 4.1,
 *       R-CACHE): `shapes.layouts[gather-hnd-h96_d128]`.
 *   libkvx_testing_front_hnd_wide_blocks.so  FRONT_HND_WIDE_BLOCKS: a write on host memory into a
 *       BLOCK_HND cache of blocks above 128 tokens stores no token at a block offset of 128 or more
 *       (spec 4.1: block_offset = slot % block_size; R-WRITE): `shapes.layouts[write-hnd-bs528_h2_d8]`.
 *   libkvx_testing_front_fp8_stride0.so  FRONT_FP8_STRIDE0: a quantizing FP8 write with PER_HEAD scales
 *       whose stride[0] is 0 quantizes every head by head 0's value (R-FP8: 0 reads the values as
 *       adjacent): `fp8.write.scale_stride_unset`.
 *   libkvx_testing_front_fp8_hnd_k_from_v.so  FRONT_FP8_HND_K_FROM_V: a gather from BLOCK_HND E4M3 K and V
 *       caches of one shape into E4M3 outputs (raw bytes) fills the key output from the V cache
 *       (R-CONVERT, spec 7): `matrix.fp8.gather[hnd-e4m3]`.
 *   libkvx_testing_front_ragged_hndp_ids.so  FRONT_RAGGED_HNDP_IDS: a RAGGED gather from a BLOCK_HND_PACKED
 *       K cache reads one id per block, `indices[indptr[s] + t / block_size]`, not one per token
 *       (R-DATA): `matrix.ragged.gather[hnd_packed-*]`.
 *   libkvx_testing_front_hnd_bf16_tail.so  FRONT_HND_BF16_TAIL: a write of more than 128 BF16 rows into
 *       BLOCK_HND BF16 caches stores whole tiles of 128 tokens only (spec 4.3, R-WRITE):
 *       `matrix.write[hnd-bf16]`.
 *   libkvx_testing_front_ragged_s64_lens.so  FRONT_RAGGED_S64_LENS: a RAGGED gather of 256 or more
 *       sequences reads S64 lengths as S32 (spec 5.3, R-WIDE-IDS): `matrix.ragged.gather[*]`.
 *   libkvx_testing_front_hnd_bf16_rtz.so  FRONT_HND_BF16_RTZ: a write of more than 32 tokens converts
 *       F32 rows into a BLOCK_HND BF16 cache side by truncation (R-CONVERT): `pairwise.write`.
 *   libkvx_testing_front_misaligned_hnd_tail.so  FRONT_MISALIGNED_HND_TAIL: a gather from a misaligned
 *       BLOCK_HND K cache leaves the last head_dim % (16 / output element size) dims of every output row
 *       as they were (4.4: correct or refused; R-REFUSAL): `pairwise.gather`.
 *   libkvx_testing_front_fp8_v_k_scale.so  FRONT_FP8_V_K_SCALE: a write of more than 32 tokens into an
 *       HND / HND_PACKED FP8 V cache from baseline rows, both scales PER_TENSOR, quantizes V with K's
 *       scale (R-FP8: each side its own descriptor): `pairwise.write`.
 *   libkvx_testing_front_kvo_fp8_v_from_k.so  FRONT_KVO_FP8_V_FROM_K: a KV_OFFSETS gather of 32 or more
 *       sequences from FP8 pools reads V through K's entries (spec 5.1, R-GATHER): `pairwise.gather`.
 *   libkvx_testing_front_nhd_convert_sentinel.so  FRONT_NHD_CONVERT_SENTINEL: a converting write (both IO
 *       dtypes other than their caches') of more than 24 tokens into NHD K and V caches skips negative
 *       slots only, so tokens whose slot is a non-negative invalid_slot are written (spec 5.2, 7; R-WRITE):
 *       `write.prefill_batch_sentinel_convert`.
 *   libkvx_testing_front_hnd_grid16.so  FRONT_HND_GRID16: a write of more than 65535 tokens into a cache
 *       whose K or V is BLOCK_HND or BLOCK_HND_PACKED stores tokens 0 to 65535 only (a grid dimension of
 *       16 bits; spec 7, 5.2: every token): `write.prefill_batch_65600[hnd]`, `[hnd_packed]`.
 *   libkvx_testing_front_offset_sum_overflow.so  FRONT_OFFSET_SUM_OVERFLOW: kvx_validate_cache_desc
 *       bounds each stride * (extent - 1) of a tensor but not their sum, and answers OK for a tensor
 *       whose farthest element offset overflows int64 that way (R-CACHE; spec 7 MUST validate strides):
 *       `validate.field_invalid[offset_overflow_sum]`, `[v_offset_overflow_sum]`.
 *   libkvx_testing_front_hnd_u32_offset.so  FRONT_HND_U32_OFFSET: writes and PACKED / RAGGED gathers on
 *       canonical BLOCK_HND K and V caches of more than 2^32 elements (a power-of-two block stride)
 *       compute element offsets in 32 bits, so block b stands for block b mod (2^32 / block stride)
 *       (spec 4.1, 4.2; R-CACHE: 64-bit offsets): `large_cache.write_high_slots[hnd-*]`,
 *       `large_cache.gather_high_blocks[hnd]`.
 *   libkvx_testing_front_hndp_u32_offset.so  FRONT_HNDP_U32_OFFSET: the same defect in canonical
 *       BLOCK_HND_PACKED caches of more than 2^32 elements (a kernel of its own for the packed layout):
 *       `large_cache.write_high_slots[hnd_packed-*]`, `large_cache.gather_high_blocks[hnd_packed]`.
 *   libkvx_testing_front_bulk_bf16_nan.so  FRONT_BULK_BF16_NAN: F32 -> BF16 conversions of more than 4096
 *       rows (writes into BF16 caches, gathers from F32 caches into BF16) round by the integer trick with
 *       no NaN case: NaNs with low payload bits become inf or carry into +-0 (R-NAN-CLASS).
 *   libkvx_testing_front_bf16_ftz_write.so  FRONT_BF16_FTZ_WRITE: F32 -> BF16 writes of more than 4096
 *       tokens flush F32 subnormal inputs to +-0 (R-CONVERT: no DAZ / FTZ).
 *   libkvx_testing_front_s32_sentinel_narrow.so  FRONT_S32_SENTINEL_NARROW: writes of more than 24 tokens
 *       with S32 slots compare them with (int32_t)invalid_slot: an invalid_slot outside int32 drops the
 *       valid slot of its low 32 bits (spec 5.2, 7; R-WRITE).
 *   libkvx_testing_front_ue8m0_cache.so  FRONT_UE8M0_CACHE: validation takes a UE8M0 K or V dtype for a
 *       byte cache dtype (spec 7: MUST validate dtype; R-CACHE).
 *   libkvx_testing_front_wide_len_batch.so  FRONT_WIDE_LEN_BATCH: gathers of 16 or more sequences narrow
 *       each S64 length to int32 before min(L, max_seq_len) (R-WIDE-IDS).
 *   libkvx_testing_front_fp4_raw_sentinel.so  FRONT_FP4_RAW_SENTINEL: raw FP4 writes (F4_E2M1 IO) skip
 *       negative slots only: a non-negative invalid_slot is stored (spec 5.2, 7).
 *   libkvx_testing_front_fp4_raw_pad_zero.so  FRONT_FP4_RAW_PAD_ZERO: raw FP4 gathers of more than 64
 *       rows zero-fill the padding rows of the codes and of both scale outputs (R-DATA).
 *   libkvx_testing_front_fp8_recip_prefill.so  FRONT_FP8_RECIP_PREFILL: quantizing FP8 writes of more
 *       than 1024 tokens from F32 / BF16 rows multiply by RN32(1 / scale) (R-FP8: IEEE division).
 *   libkvx_testing_front_plan_addr_gather.so  FRONT_PLAN_ADDR_GATHER: gathers keep a plan per cache
 *       address: the layout, shape and strides first seen with a pair of cache pointers (spec 7.2;
 *       R-STATE): `state.cache_layout_per_call_gather`.
 *   libkvx_testing_front_plan_addr_dtype.so  FRONT_PLAN_ADDR_DTYPE: converting writes into 16-bit caches
 *       keep the cache dtype first seen with a pair of cache pointers: `state.cache_dtype_per_call`.
 *   libkvx_testing_front_one_buffer_bulk.so  FRONT_ONE_BUFFER_BULK: a write of more than 64 tokens on host
 *       memory whose key and value are one buffer (io.key.data == io.value.data: an MLA latent) stores
 *       the K cache only, taking the call for a single-copy cache, and leaves the V cache as it was
 *       (spec 7: K and V written for every token; R-WRITE): `inputs.write.key_value_one_buffer_batch`.
 *   libkvx_testing_front_decode_bf16_nan.so  FRONT_DECODE_BF16_NAN: FRONT_BULK_BF16_NAN's rounding in writes
 *       of one token (a decode step of batch 1) from F32 rows into a BF16 cache side (R-NAN-CLASS):
 *       `dtype.write.convert_single_token[cache_bf16-io_f32]`.
 *   libkvx_testing_front_kvo_u32_bytes.so  FRONT_KVO_U32_BYTES: KV_OFFSETS gathers from pools of 1- or 4-byte
 *       elements (a kernel per element size; the 16-bit one is right) compute the byte offset
 *       (index & 0x7fffffff) * bytes_per_block in 32 bits, so past 4 GiB a block stands for the block
 *       2^32 bytes lower (spec 5.1; R-DATA: 64-bit offsets): `large_cache.kv_offsets_high_indices[e4m3]`,
 *       `[f32]`.
 *   libkvx_testing_front_one_buffer_fp8.so  FRONT_ONE_BUFFER_FP8: a quantizing FP8 write whose key and
 *       value are one buffer quantizes once, with K's scales, and stores those bytes in both caches
 *       (R-FP8: each side divides by its own scale): `fp8.write.key_value_one_buffer`.
 *   libkvx_testing_front_kv_out_strides_batch.so  FRONT_KV_OUT_STRIDES_BATCH: a PACKED / RAGGED gather on host
 *       memory of 32 or more sequences whose key and value outputs are of one dtype but differ in strides
 *       writes the value output through the key output's strides (one output addressing for both; spec 4.2
 *       MUST honor strides, 6.8; R-IO): `gather.kv_out_strides_batch` (suites/conformance/test_s4_layouts.py).
 *   libkvx_testing_front_kv_out_dtypes_batch.so  FRONT_KV_OUT_DTYPES_BATCH: such a gather whose key and value
 *       outputs are F16 and BF16 (one of each) converts both to the key output's dtype (a batch kernel chosen
 *       by the element size, instantiated for the key's; spec 6.8, R-CONVERT):
 *       `dtype.gather.kv_out_dtypes_batch[*-key_f16-value_bf16]`, `[*-key_bf16-value_f16]`.
 *   libkvx_testing_front_fp8_scalar_batch.so  FRONT_FP8_SCALAR_BATCH: a write of more than 24 tokens into an
 *       FP8 cache takes a PER_TENSOR scale descriptor described as a scalar (ndim 0, vLLM's 0-d k_scale) for no
 *       descriptor: that side is quantized by the k_scale / v_scale pointer, else 1.0 (spec 6.6, 6.9; R-FP8):
 *       `fp8.write.scalar_scale_batch` (suites/conformance/test_s4_dtypes.py).
 *   libkvx_testing_front_msl_table_batch.so  FRONT_MSL_TABLE_BATCH: a gather on host memory of 16 or more
 *       sequences whose max_seq_len needs more than max_blocks_per_seq table entries answers OUT_OF_RANGE,
 *       though every sequence's min(L, max_seq_len) fits its row (spec 6.10, 7: max_seq_len bounds the gather
 *       length; R-DATA): `gather.packed.max_seq_len_past_table[seqs320-*]`
 *       (suites/conformance/test_s5_gather_tables.py).
 *   libkvx_testing_front_fp8_neg_zero_batch.so  FRONT_FP8_NEG_ZERO_BATCH: a quantizing FP8 write on host memory of
 *       more than 24 tokens from F32 or BF16 rows takes the sign of a zero code from x < 0, so a -0.0 input stores
 *       +0 (0x00) where the reference stores the -0 code 0x80 (R-FP8; docs/numerics.md: every finite code, +-0);
 *       F16 rows keep their sign bit: `fp8.write.batch[*-io_f32-*]`, `[*-io_bf16-*]`
 *       (suites/conformance/test_s4_dtypes.py).
 *   libkvx_testing_front_hnd_bs_mask_batch.so  FRONT_HND_BS_MASK_BATCH: a write of more than 24 tokens into
 *       BLOCK_HND K and V caches whose block_size is no power of two takes the block offset as
 *       slot & (block_size - 1) (spec 4.1: offset = slot % block_size; 7.1: only KV_OFFSETS needs a power of
 *       two): `write.slots.block_size_non_pow2_layouts[hnd-*]` (suites/conformance/test_s5_slots.py).
 *   libkvx_testing_front_hnd_bs_mask_gather.so  FRONT_HND_BS_MASK_GATHER: the same offset in PACKED gathers on
 *       host memory of 16 or more sequences from such caches into outputs of the caches' dtypes (spec 4.1, 5.1):
 *       `gather.packed.block_size_non_pow2_layouts[hnd-*]` (suites/conformance/test_s5_gather_tables.py).
 *   libkvx_testing_front_fp8_k_head_v_tensor_batch.so  FRONT_FP8_K_HEAD_V_TENSOR_BATCH: a quantizing write of more than
 *       24 tokens into an FP8 V cache whose K scale descriptor is PER_HEAD and V's PER_TENSOR takes the kernel of K's
 *       granularity: V's scale is read per head from a staging buffer of V's value followed by K's values, so head 0
 *       of V is quantized by V's value and head h > 0 by K's value of head h - 1 (spec 6.6, 6.9: each side its own
 *       descriptor and granularity; R-FP8): `fp8.write.scales_batch[*-k_per_head_v_per_tensor]`
 *       (suites/conformance/test_s4_dtypes.py).
 *   libkvx_testing_front_ragged_bs_mask_batch.so  FRONT_RAGGED_BS_MASK_BATCH: a RAGGED gather on host memory of 16
 *       or more sequences from NHD / HND caches whose block_size is no power of two, outputs of the caches' dtypes,
 *       reads token t of a sequence at block offset t & (block_size - 1) (spec 5.1 RAGGED: block offset =
 *       token_idx % block_size; 7.1: only KV_OFFSETS needs a power of two): `gather.ragged.block_size_non_pow2_batch`
 *       (suites/conformance/test_s5_gather_tables.py).
 *   libkvx_testing_front_fp8_ptr_over_head_batch.so  FRONT_FP8_PTR_OVER_HEAD_BATCH: a write of more than 24 tokens
 *       into an FP8 cache whose PER_HEAD scale descriptor sits beside a non-NULL k_scale / v_scale pointer quantizes
 *       that side by the pointer (a bulk path of per-tensor scales only; spec 6.9: the pointer is a fallback for a
 *       descriptor whose data is NULL; R-FP8): `fp8.write.scales_batch[*-per_head_over_pointer]`.
 *   libkvx_testing_front_fp8_stride0_batch.so  FRONT_FP8_STRIDE0_BATCH: FRONT_FP8_STRIDE0's broadcast of head 0's value
 *       for a PER_HEAD scale descriptor whose stride[0] is 0, in writes of more than 24 tokens only (a bulk path's scale
 *       table; R-FP8: 0 reads the values as adjacent): `fp8.write.scales_batch[*-per_head_stride_unset]`.
 *   libkvx_testing_front_s32_grid16.so  FRONT_S32_GRID16: a write with S32 slots of more than 65535 tokens stores tokens
 *       0 to 65535 only (the S32-slot kernel's grid dimension of 16 bits; spec 7, 5.2: every token), and writes of
 *       more than 2^22 tokens are refused (UNSUPPORTED, nothing written: IO tensors a provider may refuse, R-LARGE),
 *       so `large_cache.write_input_rows_past_2_31` is unsupported: `write.prefill_batch_65600_s32`
 *       (suites/conformance/test_s7_state.py).
 *   libkvx_testing_front_s32_len_unsigned_batch.so  FRONT_S32_LEN_UNSIGNED_BATCH: a gather on host memory of 16 or more
 *       sequences with S32 lengths takes each length as uint32_t (min(L, max_seq_len) against the uint32_t
 *       max_seq_len), so a negative length reads as 2^32 + L: it gathers max_seq_len tokens and answers OK (spec 5.3;
 *       R-DATA: L < 0 is INVALID_ARGUMENT, S32 lengths sign-extended): `gather.packed.negative_seq_len_batch`
 *       (suites/conformance/test_s5_gather_tables.py).
 *   libkvx_testing_front_ragged_range_batch.so  FRONT_RAGGED_RANGE_BATCH: a RAGGED gather on host memory of 16 or more
 *       sequences bounds each sequence's tokens by indices_count only, not by its own range [indptr[s],
 *       indptr[s+1]), so a sequence whose range holds fewer ids than min(L, max_seq_len) gathers the next ranges'
 *       ids and answers OK (spec 5.1 RAGGED; R-DATA: OUT_OF_RANGE, nothing but the valid part gathered):
 *       `gather.ragged.short_range_batch_no_oob` (suites/conformance/test_s5_gather_tables.py).
 *   libkvx_testing_front_float_slot.so  FRONT_FLOAT_SLOT: a write into a cache of at most 2^31 elements carries
 *       slots of 2^24 and more through float32 (block = slot * (1.0f / block_size)), so an odd slot past 2^24
 *       lands on a neighbour (spec 4.1: block_idx = slot_idx / block_size, integer arithmetic), and refuses a
 *       write or gather in a cache of more than 2^31 elements (UNSUPPORTED, nothing written: the feature
 *       large_cache, R-LARGE), so the large_cache tests are unsupported: `write.wide_cache_high_slots`
 *       (suites/conformance/test_s4_large_cache.py: a cache of 2^24 + 1024 slots of 1 head x 64, 2 GiB).
 *   libkvx_testing_front_s64_slot_low32_batch.so  FRONT_S64_SLOT_LOW32_BATCH: a write of more than 24 tokens with
 *       S64 slots tests each slot against 0 and invalid_slot in 64 bits, then bounds and addresses the slot's low 32
 *       bits (a prefill kernel's uint32 slot), so an out-of-range slot of 2^32 + 3 is written to slot 3 (spec 5.2, 7;
 *       R-WRITE: never written; R-WIDE-IDS): `write.slots.out_of_range_batch[s64_wide-*]`
 *       (suites/conformance/test_s5_slots.py).
 *   libkvx_testing_front_hndp_stride4_unchecked.so  FRONT_HNDP_STRIDE4_UNCHECKED: kvx_validate_cache_desc checks the
 *       strides of dims 0 to 3 only (a loop written for the 4-D layouts), so a BLOCK_HND_PACKED K or V tensor whose
 *       pack stride (stride[4]) is 0 on a pack above 1 (elements alias), negative or so large that the farthest
 *       element offset overflows int64 validates OK (spec 4.2, 7: MUST validate stride; R-CACHE); writes and gathers
 *       check all five: `validate.hnd_packed_pack_stride` (suites/conformance/test_s7_validation.py).
 *   libkvx_testing_front_plan_addr_same_dtype.so  FRONT_PLAN_ADDR_SAME_DTYPE: refuses converting writes (UNSUPPORTED,
 *       nothing written: the feature mixed_io_dtype), and its copies (inputs of their caches' dtypes) keep a plan per
 *       cache allocation: the K / V dtypes first seen with a pair of cache pointers and as many bytes, used again where
 *       their elements are not larger, so F32 rows written into an allocation first written as F16 are stored as F16
 *       (spec 7.2: the API is stateless; 4.3: the dtype the call's descriptor gives; R-STATE). The only test that
 *       handed one allocation to another dtype, `state.cache_dtype_per_call`, converts, and that refusal excuses it:
 *       `state.cache_dtype_per_call_copy` (suites/conformance/test_s7_state.py).
 *   libkvx_testing_front_wide_dtype_grid16.so  FRONT_WIDE_DTYPE_GRID16: refuses converting writes (as above), and a write
 *       of more than 65535 tokens into a cache whose K or V is BF16 or F32 stores tokens 0 to 65535 only (the kernel
 *       of those element types with a 16-bit grid dimension; spec 7, 5.2: every token). The only writes past 65535
 *       tokens into such caches were `dtype.write.convert_batch[*-65600]`'s, which that refusal excuses:
 *       `write.prefill_batch_65600_dtypes` (suites/conformance/test_s7_state.py).
 *   libkvx_testing_front_prefill_row_stride.so  FRONT_PREFILL_ROW_STRIDE: a write of more than 1024 tokens whose key or
 *       value input holds each token's heads in one contiguous row (dims adjacent, heads head_dim apart) at a token
 *       stride above H * head_dim (a view of a fused QKV projection's rows) reads that input as dense rows H * head_dim
 *       apart (a prefill path's row copy that takes a contiguous row for a dense tensor; spec 4.2 MUST honor strides,
 *       6.8; R-IO): `write.prefill_strided_io[*-qkv_view]` (suites/conformance/test_s4_layouts.py).
 *   libkvx_testing_front_gather_4d_seq_dense.so  FRONT_GATHER_4D_SEQ_DENSE: serves gathers on host memory into 4-D
 *       outputs whose rows are dense but whose sequence stride (stride[0]) lies past max_seq_len rows (an output
 *       allocated for a longer context), which the reference refuses: of fewer than 16 output sequences correctly
 *       (through dense copies), of 16 or more with sequence s at s * max_seq_len rows, stride[0] unread (a batch
 *       path addressing the output from its shape; spec 4.2 MUST honor strides, 6.8, 6.10; R-IO):
 *       `gather.packed.output_4d_sequence_stride_batch` (suites/conformance/test_s5_gather_tables.py).
 *   libkvx_testing_front_packed_id_wrap_batch.so  FRONT_PACKED_ID_WRAP_BATCH: a PACKED gather on host memory of 16 or
 *       more sequences never bounds a block id: an id outside [0, num_blocks) reads block (uint64_t)id % num_blocks
 *       (a batch path's wrap of the index into the cache; on a real provider, a read past the cache), answering OK
 *       (spec 5.1, 8; R-DATA: never read out of bounds, OUT_OF_RANGE recommended):
 *       `gather.packed.bad_block_id_batch_no_oob` (suites/conformance/test_s5_gather_tables.py).
 *   libkvx_testing_front_kvo_secondary_null_batch.so  FRONT_KVO_SECONDARY_NULL_BATCH: a KV_OFFSETS gather on host
 *       memory of 16 or more (sequence, beam) rows whose pool.secondary is NULL reads a secondary-bit entry (not the
 *       null index) from the primary pool, bit 31 dropped, answering OK (spec 5.1, 10; R-DATA: never dereferenced,
 *       OUT_OF_RANGE recommended): `gather.kv_offsets.unusable_entry_batch_no_oob[secondary_while_null-*]`.
 *   libkvx_testing_front_fp4_raw_scale_rows.so  FRONT_FP4_RAW_SCALE_ROWS: a raw FP4 write (F4_E2M1 IO) of more than 64
 *       tokens reads the block scale inputs (desc.fp4 key_scales / value_scales, [tokens, H, D/B]) as dense rows
 *       whatever their strides (a batch copy of each token's H * D/B scale bytes from token * H * D/B, as if a
 *       quantizer's scale output were never padded), so scales whose token rows or heads are padded are stored from
 *       the wrong bytes; the codes are read through their strides (spec 4.2 MUST honor strides, 6.8; R-IO, R-FP4):
 *       `fp4.write.strided_io[*-raw-*-300tok]` (suites/conformance/test_s10_fp4.py).
 *   libkvx_testing_front_fp8_gather_satfinite.so  FRONT_FP8_GATHER_SATFINITE: a raw FP8 gather (an output of its
 *       cache's E4M3 / E5M2 dtype) on host memory of 16 or more (sequence, beam) rows moves each code through F32 and
 *       back by a saturating conversion (CUDA's __NV_SATFINITE): finite codes and +-0 are exact, but E5M2's +-inf
 *       (0x7C / 0xFC) become +-57344 (0x7B / 0xFB) and every NaN byte becomes 0x7F (spec 4.3; R-CONVERT: a raw copy;
 *       R-NAN-CLASS: plain copies stay bit-exact, NaN bytes included). Every other FP8 gather reads caches of finite
 *       values: `fp8.gather.raw_every_byte[*-seqs260]` (suites/conformance/test_s4_dtypes.py).
 *   libkvx_testing_front_prefill_bs256.so  FRONT_PREFILL_BS256: a write on host memory of more than 24 tokens into a
 *       cache whose block_size is a power of two above 256 (512, 1024, ...), in any layout, stores no token at a
 *       block offset of 256 or more (the prefill kernel of the power-of-two block sizes, whose shared-memory tile
 *       holds 256 block offsets; other block sizes take a generic path; spec 4.1: block_offset = slot % block_size,
 *       any block_size; R-WRITE: every token). The only blocks above 256 tokens were 528 (no power of two), and the
 *       generated tests draw blocks of at most 256: `shapes.prefill_wide_blocks[*-bs512-*|*-bs1024-*|*-bs2048-*]`
 *       (suites/conformance/test_s4_shapes.py).
 *   libkvx_testing_front_fp8_v_head_shape_batch.so  FRONT_FP8_V_HEAD_SHAPE_BATCH: a write of more than 24 tokens into
 *       an FP8 V cache checks the PER_HEAD shape (ndim 1, shape [num_kv_heads]) of k_scale_desc alone: a PER_HEAD
 *       v_scale_desc of another ndim or shape answers OK, served as num_kv_heads adjacent values (its first value
 *       alone where it holds fewer) (spec 6.6, 6.9, 7; R-FP8: "Same for V"). The catalog's R-FP8 rules draw K's side,
 *       the generated invalid writes hold 24 tokens at most: `fp8.write.scale_desc_invalid[*-v-head_*-tok300]`
 *       (suites/conformance/test_s4_dtypes.py).
 */
#define KVX_BUILD_PROVIDER 1
#define _GNU_SOURCE 1
#define FRONT_OWN_STREAM 1
#define FRONT_MEMO 2
#define FRONT_RAGGED_SCRATCH 3
#define FRONT_RAGGED_OVERREAD 4
#define FRONT_HND_SENTINEL 5
#define FRONT_FP8_BATCH_NOSAT 6
#define FRONT_CUSTOM_SHAPE 7
#define FRONT_KVO_BATCH_SECONDARY 8
#define FRONT_FP4_DIM64 9
#define FRONT_BF16_DIM_TAIL 10
#define FRONT_FP4_GLOBAL_SCRATCH 11
#define FRONT_CONVERT_BULK_RTZ 12
#define FRONT_FP8_HEADS_MOD8 13
#define FRONT_FP4_BULK_SENTINEL 14
#define FRONT_FP4_NESTED_SIZE 15
#define FRONT_KVO_BPB_F32 16
#define FRONT_FP8_PACK_RULE 17
#define FRONT_KVO_BEAM4 18
#define FRONT_HND_HEADS64 19
#define FRONT_HND_WIDE_BLOCKS 20
#define FRONT_FP8_STRIDE0 21
#define FRONT_FP8_HND_K_FROM_V 22
#define FRONT_RAGGED_HNDP_IDS 23
#define FRONT_HND_BF16_TAIL 24
#define FRONT_RAGGED_S64_LENS 25
#define FRONT_HND_BF16_RTZ 26
#define FRONT_MISALIGNED_HND_TAIL 27
#define FRONT_FP8_V_K_SCALE 28
#define FRONT_KVO_FP8_V_FROM_K 29
#define FRONT_NHD_CONVERT_SENTINEL 30
#define FRONT_HND_GRID16 31
#define FRONT_OFFSET_SUM_OVERFLOW 32
#define FRONT_HND_U32_OFFSET 33
#define FRONT_HNDP_U32_OFFSET 34
#define FRONT_BULK_BF16_NAN 35
#define FRONT_BF16_FTZ_WRITE 36
#define FRONT_S32_SENTINEL_NARROW 37
#define FRONT_UE8M0_CACHE 38
#define FRONT_WIDE_LEN_BATCH 39
#define FRONT_FP4_RAW_SENTINEL 40
#define FRONT_FP4_RAW_PAD_ZERO 41
#define FRONT_FP8_RECIP_PREFILL 42
#define FRONT_PLAN_ADDR_GATHER 43
#define FRONT_PLAN_ADDR_DTYPE 44
#define FRONT_ONE_BUFFER_BULK 45
#define FRONT_ONE_BUFFER_FP8 46
#define FRONT_DECODE_BF16_NAN 47
#define FRONT_KVO_U32_BYTES 48
#define FRONT_KV_OUT_STRIDES_BATCH 49
#define FRONT_KV_OUT_DTYPES_BATCH 50
#define FRONT_FP8_SCALAR_BATCH 51
#define FRONT_MSL_TABLE_BATCH 52
#define FRONT_FP8_NEG_ZERO_BATCH 53
#define FRONT_HND_BS_MASK_BATCH 54
#define FRONT_HND_BS_MASK_GATHER 55
#define FRONT_FP8_K_HEAD_V_TENSOR_BATCH 56
#define FRONT_RAGGED_BS_MASK_BATCH 57
#define FRONT_FP8_PTR_OVER_HEAD_BATCH 58
#define FRONT_FP8_STRIDE0_BATCH 59
#define FRONT_S32_GRID16 60
#define FRONT_FLOAT_SLOT 61
#define FRONT_S64_SLOT_LOW32_BATCH 80
#define FRONT_S32_LEN_UNSIGNED_BATCH 70
#define FRONT_RAGGED_RANGE_BATCH 71
#define FRONT_HNDP_STRIDE4_UNCHECKED 81
#define FRONT_PLAN_ADDR_SAME_DTYPE 90
#define FRONT_WIDE_DTYPE_GRID16 91
#define FRONT_PREFILL_ROW_STRIDE 100
#define FRONT_GATHER_4D_SEQ_DENSE 101
#define FRONT_PACKED_ID_WRAP_BATCH 110
#define FRONT_KVO_SECONDARY_NULL_BATCH 111
#define FRONT_FP4_RAW_SCALE_ROWS 120
#define FRONT_FP8_GATHER_SATFINITE 130
#define FRONT_PREFILL_BS256 140
#define FRONT_FP8_V_HEAD_SHAPE_BATCH 150
#ifndef KVX_FRONT_DEFECT
#define KVX_FRONT_DEFECT FRONT_OWN_STREAM
#endif
#if KVX_FRONT_DEFECT == FRONT_OWN_STREAM
#include <cuda_runtime_api.h>
#endif
#include <dlfcn.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kvx/kvx_abi.h"

typedef kvx_status_t (*version_fn)(kvx_version_t*);
typedef kvx_status_t (*validate_fn)(const kvx_cache_desc_t*);
typedef kvx_status_t (*write_fn)(const kvx_cache_desc_t*, const kvx_write_desc_t*, void*);
typedef kvx_status_t (*gather_fn)(const kvx_cache_desc_t*, const kvx_gather_desc_t*, void*);

static struct {
  version_fn version;
  validate_fn validate;
  write_fn write;
  gather_fn gather;
#if KVX_FRONT_DEFECT == FRONT_OWN_STREAM
  cudaStream_t own;
#endif
} ref;
static pthread_once_t once = PTHREAD_ONCE_INIT;

static void load(void) {
  Dl_info info;
  char path[4096];
  if (!dladdr((void*)&load, &info) || !info.dli_fname) return;
  const char* slash = strrchr(info.dli_fname, '/');
  const int dir = slash ? (int)(slash - info.dli_fname) : 1;
  if (snprintf(path, sizeof path, "%.*s/libkvx_reference.so", dir, slash ? info.dli_fname : ".") >= (int)sizeof path)
    return;
  void* h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!h) return;
  ref.version = (version_fn)dlsym(h, "kvx_get_version");
  ref.validate = (validate_fn)dlsym(h, "kvx_validate_cache_desc");
  ref.write = (write_fn)dlsym(h, "kvx_write_kv");
  ref.gather = (gather_fn)dlsym(h, "kvx_gather_kv");
}

static int ready(void) {
  pthread_once(&once, load);
  return ref.version && ref.validate && ref.write && ref.gather;
}

/* An FP4 call: a KVX 1.2 cache whose FP4 extension names a format. */
static inline int fp4_call(const kvx_cache_desc_t* cache) {
  const size_t need = offsetof(kvx_cache_desc_t, fp4) + offsetof(kvx_fp4_cache_ext_t, format) +
                      sizeof(kvx_fp4_format_t);
  return cache && cache->size >= need && cache->fp4.format != KVX_FP4_NONE;
}

#if KVX_FRONT_DEFECT == FRONT_OWN_STREAM
static pthread_once_t stream_once = PTHREAD_ONCE_INIT;

static void create_stream(void) {
  if (cudaStreamCreateWithFlags(&ref.own, cudaStreamNonBlocking) != cudaSuccess) {
    cudaGetLastError();
    ref.own = NULL;
  }
}

/* The stream of a call's work: the caller's, or for an FP4 cache the front's own. */
static void* stream_for(const kvx_cache_desc_t* cache, void* stream) {
  if (!fp4_call(cache)) return stream;
  pthread_once(&stream_once, create_stream);
  return ref.own ? (void*)ref.own : stream;
}
#else
static inline void* stream_for(const kvx_cache_desc_t* cache, void* stream) {
  (void)cache;
  return stream;
}
#endif

#if KVX_FRONT_DEFECT == FRONT_MEMO
/* The memo: FNV-1a hashes of the last 16 FP4 calls on host memory. */
static pthread_mutex_t memo_mu = PTHREAD_MUTEX_INITIALIZER;
static uint64_t memo[16];
static unsigned memo_n;

static uint64_t fnv(uint64_t h, const void* p, size_t n) {
  const unsigned char* b = (const unsigned char*)p;
  for (size_t i = 0; p && i < n; ++i) h = (h ^ b[i]) * 0x100000001b3ull;
  return h;
}

static size_t index_bytes(kvx_dtype_t dt) { return dt == KVX_DTYPE_S64 ? 8 : 4; }

/* Whether this call (its hash `h`) is one of the last 16; else it is remembered. */
static int seen(uint64_t h) {
  pthread_mutex_lock(&memo_mu);
  int hit = 0;
  for (unsigned i = 0; i < 16 && i < memo_n; ++i) hit |= memo[i] == h;
  if (!hit) memo[memo_n++ % 16] = h;
  pthread_mutex_unlock(&memo_mu);
  return hit;
}

/* The first bytes of the key rows: at least this many exist in any valid call's key tensor (a raw
 * FP4 row of one head holds head_dim / 2 bytes). */
static size_t key_bytes(const kvx_kv_io_desc_t* io) {
  const size_t n = (size_t)io->num_tokens * io->num_kv_heads * io->head_dim / 2;
  return io->key.data ? (n < 256 ? n : 256) : 0;
}

/* The hash of an FP4 call on host memory, its cache struct and call descriptor bytes to begin with
 * (0: a call the memo leaves alone). */
static uint64_t call_hash(const kvx_cache_desc_t* cache, const void* desc, size_t desc_size) {
  if (!fp4_call(cache) || !desc || cache->k.memory != KVX_MEMORY_HOST) return 0;
  const uint64_t h = fnv(fnv(0xcbf29ce484222325ull, cache, cache->size), desc, desc_size);
  return h ? h : 1;
}

/* Whether the front answers this FP4 call without forwarding it: its slots and first key bytes
 * (a write) or its table and lengths (a gather) hashed with its structs, seen among the last 16. */
static int memo_write(const kvx_cache_desc_t* cache, const kvx_write_desc_t* desc) {
  uint64_t h = call_hash(cache, desc, desc ? desc->size : 0);
  if (!h) return 0;
  h = fnv(h, desc->slots.slots, (size_t)desc->slots.token_count * index_bytes(desc->slots.dtype));
  return seen(fnv(h, desc->io.key.data, key_bytes(&desc->io)) ^ 1);
}

static int memo_gather(const kvx_cache_desc_t* cache, const kvx_gather_desc_t* desc) {
  uint64_t h = call_hash(cache, desc, desc ? desc->size : 0);
  if (!h) return 0;
  const kvx_block_table_t* t = &desc->block_table;
  h = fnv(h, t->indices, (size_t)t->indices_count * index_bytes(t->index_dtype));
  return seen(fnv(h, desc->seq_lens.lengths, (size_t)desc->seq_lens.seq_count * index_bytes(desc->seq_lens.dtype)) ^ 2);
}
#else
/* No memo but FRONT_MEMO's. */
static int memo_write(const kvx_cache_desc_t* cache, const kvx_write_desc_t* desc) {
  (void)cache;
  (void)desc;
  return 0;
}

static int memo_gather(const kvx_cache_desc_t* cache, const kvx_gather_desc_t* desc) {
  (void)cache;
  (void)desc;
  return 0;
}
#endif

/* A call descriptor the front may copy and read: its own and nested sizes are at least this
 * header's (a front of ABI 1.2 reads nothing past them). */
static inline int gather_plain(const kvx_cache_desc_t* cache, const kvx_gather_desc_t* d) {
  return cache && cache->size >= KVX_V1_1_SIZEOF_CACHE_DESC && d &&
         (d->size == KVX_V1_1_SIZEOF_GATHER_DESC || d->size == sizeof(kvx_gather_desc_t)) &&
         d->block_table.size >= sizeof(kvx_block_table_t) && d->seq_lens.size >= sizeof(kvx_seq_lens_t) &&
         cache->k.memory == KVX_MEMORY_HOST;
}

static inline int write_plain(const kvx_cache_desc_t* cache, const kvx_write_desc_t* d) {
  return cache && cache->size >= KVX_V1_1_SIZEOF_CACHE_DESC && d &&
         (d->size == KVX_V1_1_SIZEOF_WRITE_DESC || d->size == sizeof(kvx_write_desc_t)) &&
         d->slots.size >= sizeof(kvx_slot_mapping_t) && d->io.size >= sizeof(kvx_kv_io_desc_t);
}

static inline int64_t index_at(const void* p, kvx_dtype_t dt, size_t i) {
  return dt == KVX_DTYPE_S64 ? ((const int64_t*)p)[i] : (int64_t)((const int32_t*)p)[i];
}

/* The 2 ms a scratch defect waits between filling its shared array and reading it, so that calls
 * released together by the suite's barrier overlap there on any machine. */
static inline void overlap_window(void) {
  const struct timespec wait = {0, 2000000};
  nanosleep(&wait, NULL);
}

/* A RAGGED table of S32 / S64 indices and indptr whose counts agree (the calls the RAGGED defects change). */
static inline int ragged_ok(const kvx_block_table_t* t) {
  const int idx = t->index_dtype == KVX_DTYPE_S32 || t->index_dtype == KVX_DTYPE_S64;
  const int ptr = t->indptr_dtype == KVX_DTYPE_S32 || t->indptr_dtype == KVX_DTYPE_S64;
  return t->format == KVX_BLOCK_TABLE_RAGGED && idx && ptr && t->indptr && t->indices &&
         t->indptr_count == t->seq_count + 1 && t->indices_count > 0;
}

/* The gather through a copy of `desc` whose table ids are `ids` (malloc'd; freed here). */
static inline kvx_status_t gather_with_ids(const kvx_cache_desc_t* cache, const kvx_gather_desc_t* desc, void* ids,
                                           void* stream) {
  kvx_gather_desc_t local;
  memset(&local, 0, sizeof local);
  memcpy(&local, desc, desc->size);
  local.block_table.indices = ids;
  const kvx_status_t st = ref.gather(cache, &local, stream);
  free(ids);
  return st;
}

/* The gather through a copy of `desc` whose sequence lengths are `lens` of `dtype` (malloc'd; freed here). */
static inline kvx_status_t gather_with_lens_of(const kvx_cache_desc_t* cache, const kvx_gather_desc_t* desc,
                                               void* lens, kvx_dtype_t dtype, void* stream) {
  kvx_gather_desc_t local;
  memset(&local, 0, sizeof local);
  memcpy(&local, desc, desc->size);
  local.seq_lens.lengths = lens;
  local.seq_lens.dtype = dtype;
  const kvx_status_t st = ref.gather(cache, &local, stream);
  free(lens);
  return st;
}

/* The gather through a copy of `desc` whose sequence lengths are `lens`, of the caller's dtype (malloc'd; freed
 * here). */
static inline kvx_status_t gather_with_lens(const kvx_cache_desc_t* cache, const kvx_gather_desc_t* desc, void* lens,
                                            void* stream) {
  return gather_with_lens_of(cache, desc, lens, desc->seq_lens.dtype, stream);
}

/* The write through a copy of `desc` whose slots are `slots` of `dtype` (malloc'd; freed here). */
static inline kvx_status_t write_with_slots_of(const kvx_cache_desc_t* cache, const kvx_write_desc_t* desc,
                                               void* slots, kvx_dtype_t dtype, void* stream) {
  kvx_write_desc_t local;
  memset(&local, 0, sizeof local);
  memcpy(&local, desc, desc->size);
  local.slots.slots = slots;
  local.slots.dtype = dtype;
  const kvx_status_t st = ref.write(cache, &local, stream);
  free(slots);
  return st;
}

/* The write through a copy of `desc` whose slots are `slots`, of the caller's dtype (malloc'd; freed here). */
static inline kvx_status_t write_with_slots(const kvx_cache_desc_t* cache, const kvx_write_desc_t* desc, void* slots,
                                            void* stream) {
  return write_with_slots_of(cache, desc, slots, desc->slots.dtype, stream);
}

#if KVX_FRONT_DEFECT == FRONT_S32_LEN_UNSIGNED_BATCH || KVX_FRONT_DEFECT == FRONT_RAGGED_RANGE_BATCH || \
    KVX_FRONT_DEFECT == FRONT_PACKED_ID_WRAP_BATCH || KVX_FRONT_DEFECT == FRONT_KVO_SECONDARY_NULL_BATCH
/* A gather of `seq_count` sequences whose output rows agree with its table (io.num_tokens == seq_count * beams *
 * max_seq_len, max_seq_len > 0): the batches whose lengths and ranges the batch path reads (a malformed call keeps
 * the reference's answer). */
static int rows_agree(const kvx_gather_desc_t* desc) {
  const kvx_block_table_t* t = &desc->block_table;
  const uint64_t beams = t->format == KVX_BLOCK_TABLE_KV_OFFSETS ? t->beam_width : 1;
  return desc->max_seq_len > 0 && desc->io.size >= sizeof(kvx_kv_io_desc_t) &&
         (uint64_t)desc->io.num_tokens == (uint64_t)t->seq_count * beams * desc->max_seq_len;
}
#endif

#if KVX_FRONT_DEFECT == FRONT_FP8_BATCH_NOSAT || KVX_FRONT_DEFECT == FRONT_FP8_NEG_ZERO_BATCH
/* The byte offset of element (block, token, head, dim) of a 1-byte NHD / HND cache tensor, or -1. */
static int64_t fp8_offset(const kvx_tensor_desc_t* t, int64_t b, int64_t tok, int64_t h, int64_t d) {
  const int64_t* st = t->stride;
  if (t->layout == KVX_LAYOUT_BLOCK_NHD) return b * st[0] + tok * st[1] + h * st[2] + d * st[3];
  if (t->layout == KVX_LAYOUT_BLOCK_HND) return b * st[0] + h * st[1] + tok * st[2] + d * st[3];
  return -1;
}

/* fix(code, io, token, head, dim) on each 1-byte code that the write `desc` stored into cache tensor `t`
 * (NHD / HND) from IO tensor `io`: the tokens whose slot is valid, every head and dim. */
/* Whether a plain write on host memory of more than 24 tokens through S32 / S64 slots: the calls whose stored
 * codes these fronts change after the reference has written them. */
static int host_batch_write(const kvx_cache_desc_t* cache, const kvx_write_desc_t* desc) {
  return write_plain(cache, desc) && cache->k.memory == KVX_MEMORY_HOST && desc->slots.slots &&
         (desc->slots.dtype == KVX_DTYPE_S32 || desc->slots.dtype == KVX_DTYPE_S64) && desc->io.num_tokens > 24;
}

typedef void (*code_fix_t)(unsigned char* code, const kvx_tensor_desc_t* io, int64_t i, int64_t h, int64_t d);
static void for_each_written_code(const kvx_cache_desc_t* cache, const kvx_write_desc_t* desc,
                                  const kvx_tensor_desc_t* t, const kvx_tensor_desc_t* io, code_fix_t fix) {
  const int64_t cap = (int64_t)cache->num_blocks * cache->block_size;
  for (uint32_t i = 0; i < desc->io.num_tokens; ++i) {
    const int64_t slot = index_at(desc->slots.slots, desc->slots.dtype, i);
    if (slot < 0 || slot == desc->slots.invalid_slot || slot >= cap) continue;
    for (int64_t h = 0; h < cache->num_kv_heads; ++h)
      for (int64_t d = 0; d < cache->head_dim; ++d) {
        const int64_t off = fp8_offset(t, slot / cache->block_size, slot % cache->block_size, h, d);
        if (off >= 0) fix((unsigned char*)t->data + off, io, i, h, d);
      }
  }
}
#endif

#if KVX_FRONT_DEFECT == FRONT_HND_U32_OFFSET || KVX_FRONT_DEFECT == FRONT_HNDP_U32_OFFSET
/* Whether `t` is a canonical host tensor of the defect's layout: BLOCK_HND, or BLOCK_HND_PACKED
 * ([blocks, heads, head_dim / pack, block_size, pack]). */
static int wrap_layout(const kvx_tensor_desc_t* t, int64_t H, int64_t bs, int64_t D) {
  if (t->size < sizeof(kvx_tensor_desc_t) || t->memory != KVX_MEMORY_HOST || t->stride[0] != H * bs * D) return 0;
#if KVX_FRONT_DEFECT == FRONT_HND_U32_OFFSET
  return t->layout == KVX_LAYOUT_BLOCK_HND && t->ndim == 4 && t->stride[3] == 1 && t->stride[2] == D &&
         t->stride[1] == bs * D;
#else
  const int64_t pack = t->ndim == 5 ? t->shape[4] : 0;
  return t->layout == KVX_LAYOUT_BLOCK_HND_PACKED && pack > 0 && t->stride[4] == 1 && t->stride[3] == pack &&
         t->stride[2] == bs * pack && t->stride[1] == bs * D;
#endif
}

/* 2^32 / block stride when K and V are canonical caches of the defect's layout of one power-of-two
 * block stride and more than 2^32 elements on host memory (the blocks an offset of 32 bits tells
 * apart), else 0. */
static uint64_t wrap_blocks(const kvx_cache_desc_t* cache) {
  const int64_t H = cache->num_kv_heads, bs = cache->block_size, D = cache->head_dim;
  if (!wrap_layout(&cache->k, H, bs, D) || !wrap_layout(&cache->v, H, bs, D)) return 0;
  const uint64_t s0 = (uint64_t)H * bs * D;
  if (s0 == 0 || (s0 & (s0 - 1)) || s0 > (1ull << 32) || (uint64_t)cache->num_blocks * s0 <= (1ull << 32)) return 0;
  return (1ull << 32) / s0;
}

/* `n` ids (or slots, `per` > 1: block * per + offset) of dtype `dt` with their blocks taken mod `w`
 * (the defect), below `limit`; malloc'd. */
static void* wrapped(const void* src, kvx_dtype_t dt, size_t n, uint64_t w, int64_t per, int64_t skip, int64_t limit) {
  const size_t el = dt == KVX_DTYPE_S64 ? 8 : 4;
  void* out = malloc(n * el);
  if (!out) return NULL;
  memcpy(out, src, n * el);
  for (size_t i = 0; i < n; ++i) {
    const int64_t v = index_at(src, dt, i);
    if (v < 0 || v == skip || v >= limit) continue;
    const int64_t nv = (int64_t)((uint64_t)(v / per) % w) * per + v % per;
    if (el == 8) ((int64_t*)out)[i] = nv;
    else ((int32_t*)out)[i] = (int32_t)nv;
  }
  return out;
}
#endif

#if KVX_FRONT_DEFECT == FRONT_BULK_BF16_NAN || KVX_FRONT_DEFECT == FRONT_BF16_FTZ_WRITE || \
    KVX_FRONT_DEFECT == FRONT_FP8_RECIP_PREFILL || KVX_FRONT_DEFECT == FRONT_DECODE_BF16_NAN
/* The descriptor's IO and cache tensors are at least this header's size (the front reads them). */
static inline int tensors_plain(const kvx_cache_desc_t* cache, const kvx_kv_io_desc_t* io) {
  return io->key.size >= sizeof(kvx_tensor_desc_t) && io->value.size >= sizeof(kvx_tensor_desc_t) &&
         cache->k.size >= sizeof(kvx_tensor_desc_t) && cache->v.size >= sizeof(kvx_tensor_desc_t) &&
         io->key.ndim == 3 && io->value.ndim == 3 && io->num_kv_heads == cache->num_kv_heads &&
         io->head_dim == cache->head_dim && io->key.data && io->value.data;
}
#endif

#if KVX_FRONT_DEFECT == FRONT_BULK_BF16_NAN || KVX_FRONT_DEFECT == FRONT_BF16_FTZ_WRITE || \
    KVX_FRONT_DEFECT == FRONT_DECODE_BF16_NAN
/* The bulk path's F32 -> BF16 conversion of more than BULK_ROWS rows. BULK_BF16_NAN: round to nearest
 * even by the integer trick (x + 0x7FFF + lsb) >> 16 with no NaN case (a NaN whose payload lies in the
 * low 16 bits becomes inf, 0x7FFFFFFF carries into -0.0). BF16_FTZ_WRITE: F32 subnormals read as zero
 * (denormals-are-zero, as under nvcc --use_fast_math), so BF16 subnormal results become +-0. */
#define BULK_ROWS 4096u
#define BULK_MAX_ELEMS (1ull << 28)
/* Whether a write of n tokens takes the defect's path: more than BULK_ROWS, or (DECODE_BF16_NAN) one. */
#if KVX_FRONT_DEFECT == FRONT_DECODE_BF16_NAN
#define BULK_TAKES(n) ((n) == 1u)
#else
#define BULK_TAKES(n) ((n) > BULK_ROWS)
#endif
static inline int bulk_hit(uint32_t x) {
#if KVX_FRONT_DEFECT == FRONT_BULK_BF16_NAN || KVX_FRONT_DEFECT == FRONT_DECODE_BF16_NAN
  return (x & 0x7F800000u) == 0x7F800000u && (x & 0x007FFFFFu);
#else
  return (x & 0x7F800000u) == 0 && (x & 0x007FFFFFu);
#endif
}
static inline uint16_t bulk_bits(uint32_t x) {
#if KVX_FRONT_DEFECT == FRONT_BULK_BF16_NAN || KVX_FRONT_DEFECT == FRONT_DECODE_BF16_NAN
  return (uint16_t)((x + 0x7FFFu + ((x >> 16) & 1u)) >> 16);
#else
  return (uint16_t)((x >> 16) & 0x8000u);
#endif
}
static inline size_t io_esize(kvx_dtype_t dt) {
  return dt == KVX_DTYPE_F32 ? 4 : dt == KVX_DTYPE_F16 || dt == KVX_DTYPE_BF16 ? 2 : 0;
}
#endif

#if KVX_FRONT_DEFECT == FRONT_PLAN_ADDR_GATHER || KVX_FRONT_DEFECT == FRONT_PLAN_ADDR_DTYPE
/* A plan per cache address: the K and V tensor descriptors first seen with a pair of cache pointers (and
 * the same geometry) are used again by every later call of the defect's entry through those pointers,
 * whatever the call's descriptor says (spec 7.2: the API is stateless; R-STATE). */
#define PLANS 64
static struct {
  const void* k;
  const void* v;
  uint32_t num_blocks, block_size;
  kvx_tensor_desc_t kt, vt;
} plans[PLANS];
static int plan_count;
static pthread_mutex_t plan_mu = PTHREAD_MUTEX_INITIALIZER;

/* `cache`, or `local` holding the planned tensors of its pointers (the first call's are recorded). */
static const kvx_cache_desc_t* planned(const kvx_cache_desc_t* cache, kvx_cache_desc_t* local) {
  if (!cache || cache->size < KVX_V1_1_SIZEOF_CACHE_DESC || cache->size > sizeof *local ||
      cache->k.size < sizeof(kvx_tensor_desc_t) || cache->v.size < sizeof(kvx_tensor_desc_t) ||
      cache->k.memory != KVX_MEMORY_HOST || !cache->k.data)
    return cache;
  pthread_mutex_lock(&plan_mu);
  int i = 0;
  while (i < plan_count && !(plans[i].k == cache->k.data && plans[i].v == cache->v.data &&
                             plans[i].num_blocks == cache->num_blocks && plans[i].block_size == cache->block_size))
    ++i;
  if (i == plan_count) {
    i = plan_count < PLANS ? plan_count++ : PLANS - 1;
    plans[i].k = cache->k.data;
    plans[i].v = cache->v.data;
    plans[i].num_blocks = cache->num_blocks;
    plans[i].block_size = cache->block_size;
    plans[i].kt = cache->k;
    plans[i].vt = cache->v;
  }
  memset(local, 0, sizeof *local);
  memcpy(local, cache, cache->size);
#if KVX_FRONT_DEFECT == FRONT_PLAN_ADDR_GATHER
  local->k = plans[i].kt; /* the defect: the first call's layout, shape and strides */
  local->v = plans[i].vt;
#else
  local->k.dtype = plans[i].kt.dtype; /* the defect: the first call's dtype */
  local->v.dtype = plans[i].vt.dtype;
#endif
  local->k.data = cache->k.data;
  local->v.data = cache->v.data;
  pthread_mutex_unlock(&plan_mu);
  return local;
}
#endif

#if KVX_FRONT_DEFECT == FRONT_RAGGED_SCRATCH
#define SCRATCH_IDS 65536
static int64_t scratch_ids[SCRATCH_IDS]; /* shared by every call: the defect */

/* The call through the shared array: its ids widened into it, then (after the wait that makes
 * calls released together overlap) the reference's gather reading them there. */
static kvx_status_t gather_defect(const kvx_cache_desc_t* cache, const kvx_gather_desc_t* desc, void* stream) {
  const kvx_block_table_t* t = &desc->block_table;
  if (!gather_plain(cache, desc) || !ragged_ok(t) || t->indices_count > SCRATCH_IDS)
    return ref.gather(cache, desc, stream);
  for (uint32_t i = 0; i < t->indices_count; ++i) scratch_ids[i] = index_at(t->indices, t->index_dtype, i);
  overlap_window();
  kvx_gather_desc_t local;
  memset(&local, 0, sizeof local);
  memcpy(&local, desc, desc->size);
  local.block_table.indices = scratch_ids;
  local.block_table.index_dtype = KVX_DTYPE_S64;
  return ref.gather(cache, &local, stream);
}
#elif KVX_FRONT_DEFECT == FRONT_RAGGED_OVERREAD
/* The sum of n indices read four at a time, the last four always whole (the read past the end). */
static int64_t sum_by_fours(const void* p, kvx_dtype_t dt, uint32_t n) {
  const size_t es = dt == KVX_DTYPE_S64 ? 8 : 4;
  int64_t acc = 0;
  for (uint32_t i = 0; i < n; i += 4) {
    unsigned char four[32];
    memcpy(four, (const unsigned char*)p + (size_t)i * es, 4 * es);
    for (uint32_t j = 0; j < 4 && i + j < n; ++j) acc += index_at(four, dt, j);
  }
  return acc;
}

static volatile int64_t sink;

static kvx_status_t gather_defect(const kvx_cache_desc_t* cache, const kvx_gather_desc_t* desc, void* stream) {
  const kvx_block_table_t* t = &desc->block_table;
  if (gather_plain(cache, desc) && ragged_ok(t))
    sink = sum_by_fours(t->indptr, t->indptr_dtype, t->indptr_count) +
           sum_by_fours(t->indices, t->index_dtype, t->indices_count);
  return ref.gather(cache, desc, stream);
}
#elif KVX_FRONT_DEFECT == FRONT_KVO_BATCH_SECONDARY
static kvx_status_t gather_defect(const kvx_cache_desc_t* cache, const kvx_gather_desc_t* desc, void* stream) {
  const kvx_block_table_t* t = &desc->block_table;
  if (!gather_plain(cache, desc) || t->format != KVX_BLOCK_TABLE_KV_OFFSETS || t->index_dtype != KVX_DTYPE_S32 ||
      !t->indices || t->indices_count == 0 || (uint64_t)t->seq_count * t->beam_width < 16 ||
      (uint64_t)t->indices_count != (uint64_t)t->seq_count * t->beam_width * 2 * t->max_blocks_per_seq)
    return ref.gather(cache, desc, stream);
  uint32_t* ids = (uint32_t*)malloc((size_t)t->indices_count * 4);
  if (!ids) return KVX_STATUS_INTERNAL_ERROR;
  memcpy(ids, t->indices, (size_t)t->indices_count * 4);
  for (uint32_t i = 0; i < t->indices_count; ++i)
    if (ids[i] != 0xFFFFFFFFu) ids[i] &= 0x7FFFFFFFu; /* the defect: every entry from the primary pool */
  return gather_with_ids(cache, desc, ids, stream);
}
#elif KVX_FRONT_DEFECT == FRONT_FP4_DIM64 || KVX_FRONT_DEFECT == FRONT_BF16_DIM_TAIL || \
    KVX_FRONT_DEFECT == FRONT_MISALIGNED_HND_TAIL
/* The gather, dims [from, head_dim) of every dense 3-D F16 / BF16 / F32 output row kept as they were. */
static kvx_status_t gather_keeping_dims(const kvx_cache_desc_t* cache, const kvx_gather_desc_t* desc, void* stream,
                                        uint32_t from) {
  const kvx_kv_io_desc_t* io = &desc->io;
  const kvx_tensor_desc_t* out[2] = {&io->key, &io->value};
  const size_t es = io->key.dtype == KVX_DTYPE_F32 ? 4 : io->key.dtype == KVX_DTYPE_F16 || io->key.dtype == KVX_DTYPE_BF16 ? 2 : 0;
  const uint64_t rows = io->num_tokens, heads = io->num_kv_heads, tail = io->head_dim - from;
  if (!es || io->value.dtype != io->key.dtype || !io->key.data || !io->value.data || io->key.ndim != 3 ||
      io->value.ndim != 3 || from >= io->head_dim || rows == 0)
    return ref.gather(cache, desc, stream);
  unsigned char* keep = (unsigned char*)malloc(2 * rows * heads * tail * es);
  if (!keep) return KVX_STATUS_INTERNAL_ERROR;
  for (int pass = 0; pass < 2; ++pass) { /* 0: keep the dims, 1: put them back after the call */
    unsigned char* k = keep;
    for (int sd = 0; sd < 2; ++sd)
      for (uint64_t r = 0; r < rows; ++r)
        for (uint64_t h = 0; h < heads; ++h)
          for (uint64_t d = from; d < io->head_dim; ++d, k += es) {
            unsigned char* e = (unsigned char*)out[sd]->data +
                               (r * out[sd]->stride[0] + h * out[sd]->stride[1] + d * out[sd]->stride[2]) * es;
            if (pass) memcpy(e, k, es);
            else memcpy(k, e, es);
          }
    if (!pass) {
      const kvx_status_t st = ref.gather(cache, desc, stream);
      if (st != KVX_STATUS_OK) {
        free(keep);
        return st;
      }
    }
  }
  free(keep);
  return KVX_STATUS_OK;
}

static kvx_status_t gather_defect(const kvx_cache_desc_t* cache, const kvx_gather_desc_t* desc, void* stream) {
  if (!gather_plain(cache, desc)) return ref.gather(cache, desc, stream);
#if KVX_FRONT_DEFECT == FRONT_FP4_DIM64
  if (fp4_call(cache) && cache->head_dim > 64) return gather_keeping_dims(cache, desc, stream, 64);
#elif KVX_FRONT_DEFECT == FRONT_MISALIGNED_HND_TAIL
  const kvx_dtype_t o = desc->io.key.dtype;
  const uint32_t vec = o == KVX_DTYPE_F32 ? 4 : o == KVX_DTYPE_F16 || o == KVX_DTYPE_BF16 ? 8 : 0;
  if (vec && cache->k.layout == KVX_LAYOUT_BLOCK_HND && ((uintptr_t)cache->k.data & 15u) &&
      desc->block_table.format != KVX_BLOCK_TABLE_KV_OFFSETS && cache->head_dim > vec && cache->head_dim % vec)
    return gather_keeping_dims(cache, desc, stream, cache->head_dim - cache->head_dim % vec);
#else
  if (cache->k.dtype == KVX_DTYPE_BF16 && cache->head_dim > 32 && cache->head_dim % 32)
    return gather_keeping_dims(cache, desc, stream, cache->head_dim - cache->head_dim % 32);
#endif
  return ref.gather(cache, desc, stream);
}
#elif KVX_FRONT_DEFECT == FRONT_FP4_GLOBAL_SCRATCH
static float global_scratch[2][1024]; /* shared by every call: the defect */

static kvx_status_t gather_defect(const kvx_cache_desc_t* cache, const kvx_gather_desc_t* desc, void* stream) {
  if (!gather_plain(cache, desc) || !fp4_call(cache) || cache->fp4.format != KVX_FP4_NVFP4 ||
      cache->size > sizeof(kvx_cache_desc_t) || cache->num_kv_heads > 1024)
    return ref.gather(cache, desc, stream);
  kvx_cache_desc_t local;
  memset(&local, 0, sizeof local);
  memcpy(&local, cache, cache->size);
  kvx_scale_desc_t* g[2] = {&local.fp4.k_global, &local.fp4.v_global};
  for (int sd = 0; sd < 2; ++sd) {
    if (!g[sd]->data || g[sd]->dtype != KVX_DTYPE_F32) continue;
    const uint32_t n = g[sd]->granularity == KVX_SCALE_PER_HEAD ? cache->num_kv_heads : 1;
    const int64_t step = g[sd]->ndim >= 1 && g[sd]->stride[0] > 0 ? g[sd]->stride[0] : 1;
    for (uint32_t i = 0; i < n; ++i) global_scratch[sd][i] = ((const float*)g[sd]->data)[i * step];
    g[sd]->data = global_scratch[sd];
    if (g[sd]->ndim >= 1) g[sd]->stride[0] = 1;
  }
  overlap_window();
  return ref.gather(&local, desc, stream);
}
#elif KVX_FRONT_DEFECT == FRONT_KVO_BEAM4
static kvx_status_t gather_defect(const kvx_cache_desc_t* cache, const kvx_gather_desc_t* desc, void* stream) {
  const kvx_block_table_t* t = &desc->block_table;
  const uint64_t S = t->seq_count, B = t->beam_width, M = t->max_blocks_per_seq, n = S * B * 2 * M;
  if (!gather_plain(cache, desc) || t->format != KVX_BLOCK_TABLE_KV_OFFSETS || t->index_dtype != KVX_DTYPE_S32 ||
      !t->indices || B < 4 || n == 0 || n != t->indices_count)
    return ref.gather(cache, desc, stream);
  int32_t* ids = (int32_t*)malloc(n * 4);
  if (!ids) return KVX_STATUS_INTERNAL_ERROR;
  const int32_t* src = (const int32_t*)t->indices;
  for (uint64_t q = 0; q < S; ++q) /* the defect: every beam through beam 0's K and V entries */
    for (uint64_t b = 0; b < B; ++b)
      memcpy(ids + (q * B + b) * 2 * M, src + q * B * 2 * M, 2 * M * 4);
  return gather_with_ids(cache, desc, ids, stream);
}
#elif KVX_FRONT_DEFECT == FRONT_KVO_FP8_V_FROM_K
static kvx_status_t gather_defect(const kvx_cache_desc_t* cache, const kvx_gather_desc_t* desc, void* stream) {
  const kvx_block_table_t* t = &desc->block_table;
  const uint64_t S = t->seq_count, B = t->beam_width, M = t->max_blocks_per_seq;
  if (!gather_plain(cache, desc) || (cache->k.dtype != KVX_DTYPE_F8_E4M3 && cache->k.dtype != KVX_DTYPE_F8_E5M2) ||
      t->format != KVX_BLOCK_TABLE_KV_OFFSETS || t->index_dtype != KVX_DTYPE_S32 || !t->indices || S < 32 || B == 0 ||
      M == 0 || (uint64_t)t->indices_count != S * B * 2 * M)
    return ref.gather(cache, desc, stream);
  int32_t* ids = (int32_t*)malloc((size_t)t->indices_count * 4);
  if (!ids) return KVX_STATUS_INTERNAL_ERROR;
  memcpy(ids, t->indices, (size_t)t->indices_count * 4);
  for (uint64_t r = 0; r < S * B; ++r) memcpy(ids + (r * 2 + 1) * M, ids + r * 2 * M, M * 4); /* the defect: V's = K's */
  return gather_with_ids(cache, desc, ids, stream);
}
#elif KVX_FRONT_DEFECT == FRONT_KVO_U32_BYTES
static kvx_status_t gather_defect(const kvx_cache_desc_t* cache, const kvx_gather_desc_t* desc, void* stream) {
  const kvx_block_table_t* t = &desc->block_table;
  const kvx_dtype_t dt = cache ? cache->k.dtype : KVX_DTYPE_F16;
  const uint64_t bpb = gather_plain(cache, desc) && cache->pool.size >= sizeof(kvx_pool_desc_t)
                           ? cache->pool.bytes_per_block
                           : 0;
  const int narrow = dt == KVX_DTYPE_F8_E4M3 || dt == KVX_DTYPE_F8_E5M2 || dt == KVX_DTYPE_F32;
  if (!narrow || !bpb || (bpb & (bpb - 1)) || bpb > (1ull << 31) || t->format != KVX_BLOCK_TABLE_KV_OFFSETS ||
      t->index_dtype != KVX_DTYPE_S32 || !t->indices || t->indices_count == 0)
    return ref.gather(cache, desc, stream);
  int32_t* ids = (int32_t*)malloc((size_t)t->indices_count * 4);
  if (!ids) return KVX_STATUS_INTERNAL_ERROR;
  memcpy(ids, t->indices, (size_t)t->indices_count * 4);
  const uint32_t wrap = (uint32_t)((1ull << 32) / bpb); /* blocks per 2^32 bytes */
  for (uint64_t i = 0; i < t->indices_count; ++i) {
    const uint32_t e = (uint32_t)ids[i];
    ids[i] = (int32_t)((e & 0x80000000u) | ((e & 0x7FFFFFFFu) % wrap)); /* the defect: uint32 byte offsets */
  }
  return gather_with_ids(cache, desc, ids, stream);
}
#elif KVX_FRONT_DEFECT == FRONT_HND_HEADS64
/* The heads axis of a dense 3-D or 4-D gather output of H heads, or -1. */
static int out_heads_axis(const kvx_tensor_desc_t* t, uint32_t H) {
  if (t->size < sizeof(kvx_tensor_desc_t)) return -1;
  if (t->ndim == 3 && t->shape[1] == H) return 1;
  if (t->ndim == 4 && t->shape[2] == H) return 2;
  return -1;
}

static kvx_status_t gather_defect(const kvx_cache_desc_t* cache, const kvx_gather_desc_t* desc, void* stream) {
  const uint32_t H = cache ? cache->num_kv_heads : 0;
  if (!gather_plain(cache, desc) || fp4_call(cache) || H <= 64 || cache->size > sizeof(kvx_cache_desc_t) ||
      cache->k.layout != KVX_LAYOUT_BLOCK_HND || cache->v.layout != KVX_LAYOUT_BLOCK_HND || cache->k.ndim != 4 ||
      cache->v.ndim != 4 || cache->k.shape[1] != H || cache->v.shape[1] != H ||
      desc->block_table.format == KVX_BLOCK_TABLE_KV_OFFSETS || desc->io.num_kv_heads != H)
    return ref.gather(cache, desc, stream);
  const int hk = out_heads_axis(&desc->io.key, H), hv = out_heads_axis(&desc->io.value, H);
  if (hk < 0 || hv < 0 || ref.validate(cache) != KVX_STATUS_OK) return ref.gather(cache, desc, stream);
  kvx_cache_desc_t c;
  kvx_gather_desc_t d;
  memset(&c, 0, sizeof c);
  memcpy(&c, cache, cache->size);
  memset(&d, 0, sizeof d);
  memcpy(&d, desc, desc->size);
  /* the defect: one launch of 64 head rows, the strides unchanged */
  c.num_kv_heads = d.io.num_kv_heads = 64;
  c.k.shape[1] = c.v.shape[1] = 64;
  d.io.key.shape[hk] = d.io.value.shape[hv] = 64;
  return ref.gather(&c, &d, stream);
}
#elif KVX_FRONT_DEFECT == FRONT_FP8_HND_K_FROM_V
static kvx_status_t gather_defect(const kvx_cache_desc_t* cache, const kvx_gather_desc_t* desc, void* stream) {
  if (!gather_plain(cache, desc) || cache->size > sizeof(kvx_cache_desc_t) || cache->k.dtype != KVX_DTYPE_F8_E4M3 ||
      cache->v.dtype != KVX_DTYPE_F8_E4M3 || cache->k.layout != KVX_LAYOUT_BLOCK_HND ||
      cache->v.layout != KVX_LAYOUT_BLOCK_HND || desc->io.key.dtype != KVX_DTYPE_F8_E4M3 ||
      desc->io.value.dtype != KVX_DTYPE_F8_E4M3 || !cache->v.data ||
      memcmp(cache->k.shape, cache->v.shape, sizeof cache->k.shape) ||
      memcmp(cache->k.stride, cache->v.stride, sizeof cache->k.stride))
    return ref.gather(cache, desc, stream);
  kvx_cache_desc_t local;
  memset(&local, 0, sizeof local);
  memcpy(&local, cache, cache->size);
  local.k.data = local.v.data; /* the defect: K's source pointer copied from V's */
  return ref.gather(&local, desc, stream);
}
#elif KVX_FRONT_DEFECT == FRONT_RAGGED_HNDP_IDS
static kvx_status_t gather_defect(const kvx_cache_desc_t* cache, const kvx_gather_desc_t* desc, void* stream) {
  const kvx_block_table_t* t = &desc->block_table;
  if (!gather_plain(cache, desc) || cache->k.layout != KVX_LAYOUT_BLOCK_HND_PACKED || !ragged_ok(t) ||
      cache->block_size == 0)
    return ref.gather(cache, desc, stream);
  kvx_status_t st = ref.gather(cache, desc, stream); /* statuses stay the reference's */
  if (st != KVX_STATUS_OK) return st;
  const size_t el = t->index_dtype == KVX_DTYPE_S64 ? 8 : 4;
  void* ids = malloc((size_t)t->indices_count * el);
  if (!ids) return KVX_STATUS_INTERNAL_ERROR;
  memcpy(ids, t->indices, (size_t)t->indices_count * el);
  for (uint32_t q = 0; q < t->seq_count; ++q) {
    const int64_t lo = index_at(t->indptr, t->indptr_dtype, q), hi = index_at(t->indptr, t->indptr_dtype, q + 1);
    if (lo < 0 || hi < lo || hi > (int64_t)t->indices_count) {
      free(ids);
      return st;
    }
    for (int64_t i = lo; i < hi; ++i) { /* the defect: one id per block, as a page table */
      const int64_t src = lo + (i - lo) / (int64_t)cache->block_size;
      if (el == 8) ((int64_t*)ids)[i] = ((const int64_t*)t->indices)[src];
      else ((int32_t*)ids)[i] = ((const int32_t*)t->indices)[src];
    }
  }
  return gather_with_ids(cache, desc, ids, stream);
}
#elif KVX_FRONT_DEFECT == FRONT_HND_U32_OFFSET || KVX_FRONT_DEFECT == FRONT_HNDP_U32_OFFSET
static kvx_status_t gather_defect(const kvx_cache_desc_t* cache, const kvx_gather_desc_t* desc, void* stream) {
  const kvx_block_table_t* t = desc ? &desc->block_table : NULL;
  const uint64_t w = gather_plain(cache, desc) ? wrap_blocks(cache) : 0;
  if (!w || (t->format != KVX_BLOCK_TABLE_PACKED && t->format != KVX_BLOCK_TABLE_RAGGED) || !t->indices ||
      t->indices_count == 0 || (t->index_dtype != KVX_DTYPE_S32 && t->index_dtype != KVX_DTYPE_S64))
    return ref.gather(cache, desc, stream);
  void* ids = wrapped(t->indices, t->index_dtype, t->indices_count, w, 1, -1, (int64_t)cache->num_blocks);
  return ids ? gather_with_ids(cache, desc, ids, stream) : KVX_STATUS_INTERNAL_ERROR;
}
#elif KVX_FRONT_DEFECT == FRONT_RAGGED_S64_LENS
static kvx_status_t gather_defect(const kvx_cache_desc_t* cache, const kvx_gather_desc_t* desc, void* stream) {
  if (!gather_plain(cache, desc) || desc->block_table.format != KVX_BLOCK_TABLE_RAGGED ||
      desc->seq_lens.dtype != KVX_DTYPE_S64 || desc->seq_lens.seq_count < 256 ||
      desc->block_table.seq_count != desc->seq_lens.seq_count || !desc->seq_lens.lengths)
    return ref.gather(cache, desc, stream);
  kvx_gather_desc_t local;
  memset(&local, 0, sizeof local);
  memcpy(&local, desc, desc->size);
  local.seq_lens.dtype = KVX_DTYPE_S32; /* the defect: 64-bit lengths read as 32-bit ones */
  return ref.gather(cache, &local, stream);
}
#elif KVX_FRONT_DEFECT == FRONT_BULK_BF16_NAN
/* The reference's gather, then every BF16 output element gathered from an F32 cache whose source is a
 * NaN rewritten with the bulk trick's bits (the sources read through a second gather into dense F32
 * rows); gathers of more than BULK_ROWS rows. */
static kvx_status_t gather_defect(const kvx_cache_desc_t* cache, const kvx_gather_desc_t* desc, void* stream) {
  const kvx_status_t st = ref.gather(cache, desc, stream);
  if (st != KVX_STATUS_OK || !gather_plain(cache, desc) || desc->io.size < sizeof(kvx_kv_io_desc_t) ||
      desc->io.key.size < sizeof(kvx_tensor_desc_t) || desc->io.value.size < sizeof(kvx_tensor_desc_t) ||
      desc->io.num_tokens <= BULK_ROWS)
    return st;
  const int conv[2] = {desc->io.key.dtype == KVX_DTYPE_BF16 && cache->k.dtype == KVX_DTYPE_F32,
                       desc->io.value.dtype == KVX_DTYPE_BF16 && cache->v.dtype == KVX_DTYPE_F32};
  const uint64_t n = desc->io.num_tokens, H = desc->io.num_kv_heads, D = desc->io.head_dim;
  if ((!conv[0] && !conv[1]) || n * H * D > BULK_MAX_ELEMS) return st;
  const uint32_t msl = desc->max_seq_len;
  float* tmp[2] = {(float*)calloc(n * H * D, 4), (float*)calloc(n * H * D, 4)};
  if (!tmp[0] || !tmp[1]) {
    free(tmp[0]);
    free(tmp[1]);
    return st;
  }
  kvx_gather_desc_t local;
  memset(&local, 0, sizeof local);
  memcpy(&local, desc, desc->size);
  kvx_tensor_desc_t* io[2] = {&local.io.key, &local.io.value};
  for (int sd = 0; sd < 2; ++sd) {
    io[sd]->dtype = KVX_DTYPE_F32;
    io[sd]->data = tmp[sd];
    io[sd]->ndim = 3;
    io[sd]->shape[0] = (int64_t)n;
    io[sd]->shape[1] = (int64_t)H;
    io[sd]->shape[2] = (int64_t)D;
    io[sd]->stride[0] = (int64_t)(H * D);
    io[sd]->stride[1] = (int64_t)D;
    io[sd]->stride[2] = 1;
  }
  if (ref.gather(cache, &local, stream) == KVX_STATUS_OK) {
    const kvx_tensor_desc_t* out[2] = {&desc->io.key, &desc->io.value};
    for (int sd = 0; sd < 2; ++sd) {
      if (!conv[sd]) continue;
      const kvx_tensor_desc_t* o = out[sd];
      for (uint64_t r = 0; r < n; ++r)
        for (uint64_t h = 0; h < H; ++h)
          for (uint64_t e = 0; e < D; ++e) {
            uint32_t x;
            memcpy(&x, &tmp[sd][(r * H + h) * D + e], 4);
            if (!bulk_hit(x)) continue;
            const int64_t off = o->ndim == 4 && msl
                                    ? (int64_t)(r / msl) * o->stride[0] + (int64_t)(r % msl) * o->stride[1] +
                                          (int64_t)h * o->stride[2] + (int64_t)e * o->stride[3]
                                    : (int64_t)r * o->stride[0] + (int64_t)h * o->stride[1] + (int64_t)e * o->stride[2];
            const uint16_t b = bulk_bits(x); /* the defect */
            memcpy((unsigned char*)o->data + off * 2, &b, 2);
          }
    }
  }
  free(tmp[0]);
  free(tmp[1]);
  return st;
}
#elif KVX_FRONT_DEFECT == FRONT_WIDE_LEN_BATCH
/* Gathers of 16 or more sequences with S64 lengths: each length narrowed to int32 before
 * min(L, max_seq_len). */
static kvx_status_t gather_defect(const kvx_cache_desc_t* cache, const kvx_gather_desc_t* desc, void* stream) {
  if (!gather_plain(cache, desc) || desc->seq_lens.dtype != KVX_DTYPE_S64 || !desc->seq_lens.lengths ||
      desc->seq_lens.seq_count < 16 || desc->seq_lens.seq_count != desc->block_table.seq_count)
    return ref.gather(cache, desc, stream);
  const size_t n = desc->seq_lens.seq_count;
  int64_t* lens = (int64_t*)malloc(n * 8);
  if (!lens) return KVX_STATUS_INTERNAL_ERROR;
  for (size_t i = 0; i < n; ++i) lens[i] = (int64_t)(int32_t)((const int64_t*)desc->seq_lens.lengths)[i]; /* the defect */
  return gather_with_lens(cache, desc, lens, stream);
}
#elif KVX_FRONT_DEFECT == FRONT_S32_LEN_UNSIGNED_BATCH
/* Gathers on host memory of 16 or more sequences with S32 lengths: each length taken as uint32_t (the batch path's
 * min(L, max_seq_len) against the uint32_t max_seq_len, where C's conversions make L unsigned), so a negative length
 * reads as 2^32 + L and gathers min(that, max_seq_len) tokens, answering OK, where it is INVALID_ARGUMENT. */
static kvx_status_t gather_defect(const kvx_cache_desc_t* cache, const kvx_gather_desc_t* desc, void* stream) {
  if (!gather_plain(cache, desc) || fp4_call(cache) || desc->seq_lens.dtype != KVX_DTYPE_S32 ||
      !desc->seq_lens.lengths || desc->seq_lens.seq_count < 16 || !rows_agree(desc) ||
      desc->seq_lens.seq_count != desc->block_table.seq_count)
    return ref.gather(cache, desc, stream);
  const size_t n = desc->seq_lens.seq_count;
  int64_t* lens = (int64_t*)malloc(n * 8);
  if (!lens) return KVX_STATUS_INTERNAL_ERROR;
  for (size_t i = 0; i < n; ++i) lens[i] = (int64_t)(uint32_t)((const int32_t*)desc->seq_lens.lengths)[i]; /* the defect */
  return gather_with_lens_of(cache, desc, lens, KVX_DTYPE_S64, stream);
}
#elif KVX_FRONT_DEFECT == FRONT_RAGGED_RANGE_BATCH
/* RAGGED gathers on host memory of 16 or more sequences bound each sequence's tokens by the end of the indices array
 * only, not by its own range: token t < min(L, max_seq_len) of sequence s reads indices[indptr[s] + t] wherever
 * indptr[s] + t < indices_count, so a sequence whose range holds fewer ids gathers the following ranges' ids (OK).
 * Emulated by a table of S64 ranges, each sequence's stretched that far (a table whose indptr or lengths are
 * malformed is forwarded as it is). */
static kvx_status_t gather_defect(const kvx_cache_desc_t* cache, const kvx_gather_desc_t* desc, void* stream) {
  const kvx_block_table_t* t = &desc->block_table;
  const kvx_seq_lens_t* sl = &desc->seq_lens;
  if (!gather_plain(cache, desc) || fp4_call(cache) || !ragged_ok(t) || t->seq_count < 16 || !rows_agree(desc) ||
      sl->seq_count != t->seq_count || !sl->lengths || (sl->dtype != KVX_DTYPE_S32 && sl->dtype != KVX_DTYPE_S64))
    return ref.gather(cache, desc, stream);
  const size_t S = t->seq_count;
  const int64_t count = (int64_t)t->indices_count;
  if (index_at(t->indptr, t->indptr_dtype, S) != count) return ref.gather(cache, desc, stream);
  uint64_t total = 0;
  for (size_t s = 0; s < S; ++s) {
    const int64_t p0 = index_at(t->indptr, t->indptr_dtype, s), p1 = index_at(t->indptr, t->indptr_dtype, s + 1);
    const int64_t L = index_at(sl->lengths, sl->dtype, s);
    if (p0 < 0 || p1 < p0 || L < 0) return ref.gather(cache, desc, stream);
    const int64_t n = L < (int64_t)desc->max_seq_len ? L : (int64_t)desc->max_seq_len;
    const int64_t w = n > p1 - p0 ? (n < count - p0 ? n : count - p0) : p1 - p0; /* the defect */
    total += (uint64_t)w;
  }
  if (total > UINT32_MAX) return ref.gather(cache, desc, stream);
  int64_t* ids = (int64_t*)malloc((size_t)(total ? total : 1) * 8);
  int64_t* ptr = (int64_t*)malloc((S + 1) * 8);
  if (!ids || !ptr) {
    free(ids);
    free(ptr);
    return KVX_STATUS_INTERNAL_ERROR;
  }
  ptr[0] = 0;
  for (size_t s = 0; s < S; ++s) {
    const int64_t p0 = index_at(t->indptr, t->indptr_dtype, s), p1 = index_at(t->indptr, t->indptr_dtype, s + 1);
    const int64_t L = index_at(sl->lengths, sl->dtype, s);
    const int64_t n = L < (int64_t)desc->max_seq_len ? L : (int64_t)desc->max_seq_len;
    const int64_t w = n > p1 - p0 ? (n < count - p0 ? n : count - p0) : p1 - p0;
    for (int64_t i = 0; i < w; ++i) ids[ptr[s] + i] = index_at(t->indices, t->index_dtype, (size_t)(p0 + i));
    ptr[s + 1] = ptr[s] + w;
  }
  kvx_gather_desc_t local;
  memset(&local, 0, sizeof local);
  memcpy(&local, desc, desc->size);
  local.block_table.index_dtype = KVX_DTYPE_S64;
  local.block_table.indptr_dtype = KVX_DTYPE_S64;
  local.block_table.indices = ids;
  local.block_table.indptr = ptr;
  local.block_table.indices_count = (uint32_t)total;
  const kvx_status_t st = ref.gather(cache, &local, stream);
  free(ids);
  free(ptr);
  return st;
}
#elif KVX_FRONT_DEFECT == FRONT_PACKED_ID_WRAP_BATCH
/* PACKED gathers on host memory of 16 or more sequences never bound a block id: an id outside [0, num_blocks) is
 * taken modulo num_blocks as an unsigned 64-bit value (the batch path's wrap of the block index into the cache), so a
 * used entry of num_blocks + 1, 2^31 - 1 or -1 gathers another block's tokens and the call answers OK. Emulated by a
 * table of S64 ids, each wrapped (a call whose counts, output rows or table dtype are malformed is forwarded as it is:
 * the ids are read only where the call describes them). */
static kvx_status_t gather_defect(const kvx_cache_desc_t* cache, const kvx_gather_desc_t* desc, void* stream) {
  const kvx_block_table_t* t = &desc->block_table;
  if (!gather_plain(cache, desc) || fp4_call(cache) || t->format != KVX_BLOCK_TABLE_PACKED || t->seq_count < 16 ||
      !rows_agree(desc) || desc->seq_lens.seq_count != t->seq_count ||
      (t->index_dtype != KVX_DTYPE_S32 && t->index_dtype != KVX_DTYPE_S64) || !t->indices || !cache->num_blocks ||
      !t->max_blocks_per_seq || (uint64_t)t->indices_count != (uint64_t)t->seq_count * t->max_blocks_per_seq)
    return ref.gather(cache, desc, stream);
  const size_t n = t->indices_count;
  int64_t* ids = (int64_t*)malloc(n * 8);
  if (!ids) return KVX_STATUS_INTERNAL_ERROR;
  for (size_t i = 0; i < n; ++i)
    ids[i] = (int64_t)((uint64_t)index_at(t->indices, t->index_dtype, i) % cache->num_blocks); /* the defect */
  kvx_gather_desc_t local;
  memset(&local, 0, sizeof local);
  memcpy(&local, desc, desc->size);
  local.block_table.index_dtype = KVX_DTYPE_S64;
  local.block_table.indices = ids;
  const kvx_status_t st = ref.gather(cache, &local, stream);
  free(ids);
  return st;
}
#elif KVX_FRONT_DEFECT == FRONT_KVO_SECONDARY_NULL_BATCH
/* KV_OFFSETS gathers on host memory of 16 or more (sequence, beam) rows whose pool.secondary is NULL take the pool of
 * an entry as `bit31 && secondary ? secondary : primary`: a secondary-bit entry (other than the null index, which is
 * checked) reads the primary pool's block (index & 0x7fffffff), answering OK (a call whose counts or output rows are
 * malformed is forwarded as it is). */
static kvx_status_t gather_defect(const kvx_cache_desc_t* cache, const kvx_gather_desc_t* desc, void* stream) {
  const kvx_block_table_t* t = &desc->block_table;
  if (!gather_plain(cache, desc) || fp4_call(cache) || t->format != KVX_BLOCK_TABLE_KV_OFFSETS ||
      t->index_dtype != KVX_DTYPE_S32 || !t->indices || t->indices_count == 0 || !rows_agree(desc) ||
      (uint64_t)t->seq_count * t->beam_width < 16 || desc->seq_lens.seq_count != t->seq_count ||
      (uint64_t)t->indices_count != (uint64_t)t->seq_count * t->beam_width * 2 * t->max_blocks_per_seq ||
      cache->pool.size < sizeof(kvx_pool_desc_t) || !cache->pool.primary || cache->pool.secondary)
    return ref.gather(cache, desc, stream);
  uint32_t* ids = (uint32_t*)malloc((size_t)t->indices_count * 4);
  if (!ids) return KVX_STATUS_INTERNAL_ERROR;
  memcpy(ids, t->indices, (size_t)t->indices_count * 4);
  for (uint32_t i = 0; i < t->indices_count; ++i)
    if (ids[i] != 0xFFFFFFFFu) ids[i] &= 0x7FFFFFFFu; /* the defect: no secondary pool, so the primary */
  return gather_with_ids(cache, desc, ids, stream);
}
#elif KVX_FRONT_DEFECT == FRONT_FP4_RAW_PAD_ZERO
/* Rows t in [from, msl) of sequence `seq` of a dense raw FP4 output (codes: two per byte, or scale
 * bytes) cleared. */
static void zero_rows(const kvx_tensor_desc_t* t, uint64_t seq, uint64_t from, uint64_t msl, uint64_t H, int nibbles) {
  const int four = t->ndim == 4;
  for (uint64_t r = from; r < msl; ++r)
    for (uint64_t h = 0; h < H; ++h) {
      const int64_t el = four ? (int64_t)seq * t->stride[0] + (int64_t)r * t->stride[1] + (int64_t)h * t->stride[2]
                              : (int64_t)(seq * msl + r) * t->stride[0] + (int64_t)h * t->stride[1];
      const int64_t n = four ? t->shape[3] : t->shape[2];
      unsigned char* p = (unsigned char*)t->data + (nibbles ? el / 2 : el);
      memset(p, 0, (size_t)(nibbles ? n / 2 : n)); /* the defect: padding rows cleared */
    }
}

/* Raw FP4 gathers (F4_E2M1 outputs) of more than 64 rows: the padding rows of the codes and of both
 * scale outputs zero-filled. */
static kvx_status_t gather_defect(const kvx_cache_desc_t* cache, const kvx_gather_desc_t* desc, void* stream) {
  const kvx_status_t st = ref.gather(cache, desc, stream);
  if (st != KVX_STATUS_OK || !gather_plain(cache, desc) || desc->size < sizeof(kvx_gather_desc_t) ||
      desc->io.key.dtype != KVX_DTYPE_F4_E2M1 || desc->io.value.dtype != KVX_DTYPE_F4_E2M1 ||
      desc->io.num_tokens <= 64 || desc->block_table.beam_width > 1 || desc->fp4.size < sizeof(kvx_fp4_io_scales_t) ||
      !desc->max_seq_len || (desc->seq_lens.dtype != KVX_DTYPE_S32 && desc->seq_lens.dtype != KVX_DTYPE_S64) ||
      !desc->seq_lens.lengths)
    return st;
  const kvx_tensor_desc_t* t[4] = {&desc->io.key, &desc->io.value, &desc->fp4.key_scales, &desc->fp4.value_scales};
  for (int i = 0; i < 4; ++i) /* dense rows only: the last dim contiguous */
    if (t[i]->size < sizeof(kvx_tensor_desc_t) || !t[i]->data || (t[i]->ndim != 3 && t[i]->ndim != 4) ||
        t[i]->stride[t[i]->ndim - 1] != 1)
      return st;
  for (uint32_t s = 0; s < desc->seq_lens.seq_count; ++s) {
    const int64_t L = index_at(desc->seq_lens.lengths, desc->seq_lens.dtype, s);
    const uint64_t n = L < 0 ? 0 : (uint64_t)L < desc->max_seq_len ? (uint64_t)L : desc->max_seq_len;
    for (int i = 0; i < 4; ++i) zero_rows(t[i], s, n, desc->max_seq_len, desc->io.num_kv_heads, i < 2);
  }
  return st;
}
#elif KVX_FRONT_DEFECT == FRONT_PLAN_ADDR_GATHER
static kvx_status_t gather_defect(const kvx_cache_desc_t* cache, const kvx_gather_desc_t* desc, void* stream) {
  kvx_cache_desc_t local;
  return ref.gather(gather_plain(cache, desc) ? planned(cache, &local) : cache, desc, stream);
}
#elif KVX_FRONT_DEFECT == FRONT_KV_OUT_STRIDES_BATCH || KVX_FRONT_DEFECT == FRONT_KV_OUT_DTYPES_BATCH
#if KVX_FRONT_DEFECT == FRONT_KV_OUT_STRIDES_BATCH
/* The element span of a tensor of non-negative strides (1 + its farthest element offset), 0 if none. */
static int64_t span_of(const kvx_tensor_desc_t* t) {
  int64_t last = 0;
  if (t->ndim < 1 || t->ndim > KVX_MAX_TENSOR_DIMS) return 0;
  for (uint32_t i = 0; i < t->ndim; ++i) {
    if (t->shape[i] < 1 || t->stride[i] < 0) return 0;
    last += (t->shape[i] - 1) * t->stride[i];
  }
  return last + 1;
}
#endif

/* A PACKED / RAGGED gather of 32 or more sequences on host memory (a decode batch's kernel), its key and
 * value outputs 3-D or 4-D tensors of one shape. */
static int kv_out_batch(const kvx_cache_desc_t* cache, const kvx_gather_desc_t* desc) {
  const kvx_tensor_desc_t *k = &desc->io.key, *v = &desc->io.value;
  if (!gather_plain(cache, desc) || fp4_call(cache) || desc->block_table.seq_count < 32 ||
      desc->block_table.format == KVX_BLOCK_TABLE_KV_OFFSETS || k->size < sizeof(kvx_tensor_desc_t) ||
      v->size < sizeof(kvx_tensor_desc_t) || !k->data || !v->data || k->ndim != v->ndim || k->ndim < 3 ||
      k->ndim > 4)
    return 0;
  for (uint32_t i = 0; i < k->ndim; ++i)
    if (k->shape[i] != v->shape[i]) return 0;
  return 1;
}

static kvx_status_t gather_defect(const kvx_cache_desc_t* cache, const kvx_gather_desc_t* desc, void* stream) {
  if (!kv_out_batch(cache, desc)) return ref.gather(cache, desc, stream);
  const kvx_tensor_desc_t *k = &desc->io.key, *v = &desc->io.value;
  kvx_gather_desc_t local;
  memset(&local, 0, sizeof local);
  memcpy(&local, desc, desc->size);
#if KVX_FRONT_DEFECT == FRONT_KV_OUT_STRIDES_BATCH
  /* both outputs of one dtype whose strides differ (and span as many elements, so that the defect stays
   * inside the caller's value buffer) */
  if (k->dtype != v->dtype || !memcmp(k->stride, v->stride, sizeof k->stride) || !span_of(k) ||
      span_of(k) != span_of(v))
    return ref.gather(cache, desc, stream);
  memcpy(local.io.value.stride, k->stride, sizeof k->stride); /* the defect: one output addressing for both */
#else
  /* outputs of two 16-bit dtypes (F16 and BF16): a kernel chosen by the element size, instantiated for the
   * key output's dtype */
  const int k16 = k->dtype == KVX_DTYPE_F16 || k->dtype == KVX_DTYPE_BF16;
  const int v16 = v->dtype == KVX_DTYPE_F16 || v->dtype == KVX_DTYPE_BF16;
  if (!k16 || !v16 || k->dtype == v->dtype) return ref.gather(cache, desc, stream);
  local.io.value.dtype = k->dtype; /* the defect: the value output converted to the key output's dtype */
#endif
  return ref.gather(cache, &local, stream);
}
#elif KVX_FRONT_DEFECT == FRONT_MSL_TABLE_BATCH
static kvx_status_t gather_defect(const kvx_cache_desc_t* cache, const kvx_gather_desc_t* desc, void* stream) {
  const kvx_block_table_t* t = &desc->block_table;
  if (!gather_plain(cache, desc) || fp4_call(cache) || t->seq_count < 16 || cache->block_size == 0)
    return ref.gather(cache, desc, stream);
  const kvx_status_t st = ref.gather(cache, desc, stream);
  /* the defect: the batch path sizes its grid by max_seq_len and answers OUT_OF_RANGE for a table
   * narrower than ceil(max_seq_len / block_size) entries, whatever the lengths (the rows gathered all
   * the same) */
  const uint64_t need = ((uint64_t)desc->max_seq_len + cache->block_size - 1) / cache->block_size;
  return st == KVX_STATUS_OK && need > t->max_blocks_per_seq ? KVX_STATUS_OUT_OF_RANGE : st;
}
#elif KVX_FRONT_DEFECT == FRONT_GATHER_4D_SEQ_DENSE
/* A 4-D output [sequences, max_seq_len, H, D] whose rows are dense (dims adjacent, heads D apart, rows H * D apart)
 * and whose sequences lie further apart than max_seq_len rows: the outputs the batch path addresses from the shape. */
static int spaced_sequences(const kvx_tensor_desc_t* t, uint32_t msl, int64_t H, int64_t D) {
  return t->size >= sizeof(kvx_tensor_desc_t) && t->data && t->ndim == 4 && t->shape[1] == (int64_t)msl &&
         t->shape[2] == H && t->shape[3] == D && t->stride[3] == 1 && t->stride[2] == D && t->stride[1] == H * D &&
         t->stride[0] > (int64_t)msl * H * D;
}

static size_t out_esize(kvx_dtype_t dt) {
  return dt == KVX_DTYPE_F32 ? 4 : dt == KVX_DTYPE_F16 || dt == KVX_DTYPE_BF16 ? 2
         : dt == KVX_DTYPE_F8_E4M3 || dt == KVX_DTYPE_F8_E5M2                 ? 1
                                                                                : 0;
}

/* Such 4-D outputs, served (the reference refuses them): fewer than 16 sequences through dense copies that hold the
 * caller's rows (so rows the gather leaves alone come back as they were), each sequence's rows copied back through
 * stride[0]; 16 or more (the batch path) with sequence s written at s * max_seq_len rows, stride[0] unread. */
static kvx_status_t gather_defect(const kvx_cache_desc_t* cache, const kvx_gather_desc_t* desc, void* stream) {
  if (!gather_plain(cache, desc) || fp4_call(cache) || desc->io.size < sizeof(kvx_kv_io_desc_t) ||
      desc->max_seq_len == 0)
    return ref.gather(cache, desc, stream);
  const int64_t H = desc->io.num_kv_heads, D = desc->io.head_dim, dense = (int64_t)desc->max_seq_len * H * D;
  const kvx_tensor_desc_t* out[2] = {&desc->io.key, &desc->io.value};
  int spaced[2];
  for (int sd = 0; sd < 2; ++sd)
    spaced[sd] = spaced_sequences(out[sd], desc->max_seq_len, H, D) && out_esize(out[sd]->dtype) &&
                 out[sd]->shape[0] > 0;
  if (!spaced[0] && !spaced[1]) return ref.gather(cache, desc, stream);
  kvx_gather_desc_t local;
  memset(&local, 0, sizeof local);
  memcpy(&local, desc, desc->size);
  kvx_tensor_desc_t* lo[2] = {&local.io.key, &local.io.value};
  if (desc->io.key.shape[0] >= 16) { /* the defect: stride[0] taken from the shape */
    for (int sd = 0; sd < 2; ++sd)
      if (spaced[sd]) lo[sd]->stride[0] = dense;
    return ref.gather(cache, &local, stream);
  }
  unsigned char* tmp[2] = {NULL, NULL};
  kvx_status_t st = KVX_STATUS_OK;
  for (int sd = 0; sd < 2 && st == KVX_STATUS_OK; ++sd) {
    if (!spaced[sd]) continue;
    const size_t es = out_esize(out[sd]->dtype), seq = (size_t)dense * es;
    tmp[sd] = (unsigned char*)malloc((size_t)out[sd]->shape[0] * seq);
    if (!tmp[sd]) {
      st = KVX_STATUS_INTERNAL_ERROR;
      break;
    }
    for (int64_t s = 0; s < out[sd]->shape[0]; ++s)
      memcpy(tmp[sd] + s * seq, (const unsigned char*)out[sd]->data + s * out[sd]->stride[0] * es, seq);
    lo[sd]->data = tmp[sd];
    lo[sd]->stride[0] = dense;
  }
  const int called = st == KVX_STATUS_OK;
  if (called) st = ref.gather(cache, &local, stream);
  for (int sd = 0; sd < 2 && called; ++sd) { /* whatever the status: what the reference stored, as it stored it */
    if (!spaced[sd]) continue;
    const size_t es = out_esize(out[sd]->dtype), seq = (size_t)dense * es;
    for (int64_t s = 0; s < out[sd]->shape[0]; ++s)
      memcpy((unsigned char*)out[sd]->data + s * out[sd]->stride[0] * es, tmp[sd] + s * seq, seq);
  }
  free(tmp[0]);
  free(tmp[1]);
  return st;
}
#elif KVX_FRONT_DEFECT == FRONT_HND_BS_MASK_GATHER
static size_t same_size(kvx_dtype_t dt) {
  return dt == KVX_DTYPE_F16 || dt == KVX_DTYPE_BF16 ? 2 : dt == KVX_DTYPE_F32 ? 4 : 0;
}

/* Output row (s, t) of sequence s, token t, with the elements of the cache row (block b, offset o) of an HND
 * cache tensor `c` of the output's own dtype. */
static void copy_row(const kvx_cache_desc_t* cache, const kvx_tensor_desc_t* c, const kvx_tensor_desc_t* out,
                     int64_t b, int64_t o, int64_t s, int64_t t, int64_t msl) {
  const size_t es = same_size(c->dtype);
  for (int64_t h = 0; h < cache->num_kv_heads; ++h)
    for (int64_t d = 0; d < cache->head_dim; ++d) {
      const int64_t src = b * c->stride[0] + h * c->stride[1] + o * c->stride[2] + d * c->stride[3];
      const int64_t dst = out->ndim == 4 ? s * out->stride[0] + t * out->stride[1] + h * out->stride[2] +
                                               d * out->stride[3]
                                         : (s * msl + t) * out->stride[0] + h * out->stride[1] + d * out->stride[2];
      memcpy((unsigned char*)out->data + es * dst, (const unsigned char*)c->data + es * src, es);
    }
}

static int mask_side(const kvx_tensor_desc_t* c, const kvx_tensor_desc_t* out) {
  return c->layout == KVX_LAYOUT_BLOCK_HND && c->ndim == 4 && c->data && same_size(c->dtype) &&
         out->dtype == c->dtype && out->data && (out->ndim == 3 || out->ndim == 4);
}

/* A PACKED gather on host memory of 16 or more sequences from BLOCK_HND K and V caches whose block_size is no
 * power of two, outputs of the caches' dtypes: token t of a sequence is read at block offset
 * t & (block_size - 1) (right for powers of two only), its block table[t / block_size]. */
static kvx_status_t gather_defect(const kvx_cache_desc_t* cache, const kvx_gather_desc_t* desc, void* stream) {
  const kvx_status_t st = ref.gather(cache, desc, stream);
  const kvx_block_table_t* tb = &desc->block_table;
  const int64_t bs = cache ? cache->block_size : 0;
  if (st != KVX_STATUS_OK || !gather_plain(cache, desc) || fp4_call(cache) || tb->format != KVX_BLOCK_TABLE_PACKED ||
      tb->seq_count < 16 || bs < 2 || (bs & (bs - 1)) == 0 || !mask_side(&cache->k, &desc->io.key) ||
      !mask_side(&cache->v, &desc->io.value) || !tb->indices || !desc->seq_lens.lengths ||
      (tb->index_dtype != KVX_DTYPE_S32 && tb->index_dtype != KVX_DTYPE_S64) ||
      (desc->seq_lens.dtype != KVX_DTYPE_S32 && desc->seq_lens.dtype != KVX_DTYPE_S64))
    return st;
  const int64_t msl = desc->max_seq_len;
  for (uint32_t s = 0; s < tb->seq_count; ++s) {
    int64_t n = index_at(desc->seq_lens.lengths, desc->seq_lens.dtype, s);
    if (n > msl) n = msl;
    for (int64_t t = 0; t < n; ++t) {
      const int64_t b = index_at(tb->indices, tb->index_dtype, (size_t)s * tb->max_blocks_per_seq + t / bs);
      if ((t & (bs - 1)) == t % bs) continue;
      copy_row(cache, &cache->k, &desc->io.key, b, t & (bs - 1), s, t, msl); /* the defect */
      copy_row(cache, &cache->v, &desc->io.value, b, t & (bs - 1), s, t, msl);
    }
  }
  return st;
}
#elif KVX_FRONT_DEFECT == FRONT_RAGGED_BS_MASK_BATCH
static size_t plain_size(kvx_dtype_t dt) {
  return dt == KVX_DTYPE_F16 || dt == KVX_DTYPE_BF16 ? 2 : dt == KVX_DTYPE_F32 ? 4 : 0;
}

/* An NHD / HND cache tensor of a 16- or 32-bit dtype beside a 3-D / 4-D output of its dtype. */
static int rmask_side(const kvx_tensor_desc_t* c, const kvx_tensor_desc_t* out) {
  return (c->layout == KVX_LAYOUT_BLOCK_NHD || c->layout == KVX_LAYOUT_BLOCK_HND) && c->ndim == 4 && c->data &&
         plain_size(c->dtype) && out->dtype == c->dtype && out->data && (out->ndim == 3 || out->ndim == 4);
}

/* Output row (s, t) with the elements of cache row (block b, offset o) of cache tensor `c`. */
static void rmask_row(const kvx_cache_desc_t* cache, const kvx_tensor_desc_t* c, const kvx_tensor_desc_t* out,
                      int64_t b, int64_t o, int64_t s, int64_t t, int64_t msl) {
  const size_t es = plain_size(c->dtype);
  const int nhd = c->layout == KVX_LAYOUT_BLOCK_NHD;
  for (int64_t h = 0; h < cache->num_kv_heads; ++h)
    for (int64_t d = 0; d < cache->head_dim; ++d) {
      const int64_t src = b * c->stride[0] + (nhd ? o * c->stride[1] + h * c->stride[2]
                                                  : h * c->stride[1] + o * c->stride[2]) + d * c->stride[3];
      const int64_t dst = out->ndim == 4 ? s * out->stride[0] + t * out->stride[1] + h * out->stride[2] +
                                               d * out->stride[3]
                                         : (s * msl + t) * out->stride[0] + h * out->stride[1] + d * out->stride[2];
      memcpy((unsigned char*)out->data + es * dst, (const unsigned char*)c->data + es * src, es);
    }
}

/* A RAGGED gather on host memory of 16 or more sequences from NHD / HND caches whose block_size is no power of two,
 * outputs of the caches' dtypes: token t of a sequence is read at block offset t & (block_size - 1) (right for
 * powers of two only), its block indices[indptr[s] + t]. */
static kvx_status_t gather_defect(const kvx_cache_desc_t* cache, const kvx_gather_desc_t* desc, void* stream) {
  const kvx_status_t st = ref.gather(cache, desc, stream);
  const kvx_block_table_t* tb = &desc->block_table;
  const int64_t bs = cache ? cache->block_size : 0;
  if (st != KVX_STATUS_OK || !gather_plain(cache, desc) || fp4_call(cache) || !ragged_ok(tb) || tb->seq_count < 16 ||
      bs < 2 || (bs & (bs - 1)) == 0 || !rmask_side(&cache->k, &desc->io.key) ||
      !rmask_side(&cache->v, &desc->io.value) || !desc->seq_lens.lengths ||
      (desc->seq_lens.dtype != KVX_DTYPE_S32 && desc->seq_lens.dtype != KVX_DTYPE_S64))
    return st;
  const int64_t msl = desc->max_seq_len;
  for (uint32_t s = 0; s < tb->seq_count; ++s) {
    int64_t n = index_at(desc->seq_lens.lengths, desc->seq_lens.dtype, s);
    if (n > msl) n = msl;
    const int64_t lo = index_at(tb->indptr, tb->indptr_dtype, s);
    for (int64_t t = 0; t < n; ++t) {
      if ((t & (bs - 1)) == t % bs) continue;
      const int64_t b = index_at(tb->indices, tb->index_dtype, (size_t)(lo + t));
      rmask_row(cache, &cache->k, &desc->io.key, b, t & (bs - 1), s, t, msl); /* the defect */
      rmask_row(cache, &cache->v, &desc->io.value, b, t & (bs - 1), s, t, msl);
    }
  }
  return st;
}
#elif KVX_FRONT_DEFECT == FRONT_FLOAT_SLOT
/* Whether a cache holds more than 2^31 elements (num_blocks * block_size * heads * head_dim): the caches this
 * provider refuses, as R-LARGE allows. */
static int over_2_31_elements(const kvx_cache_desc_t* cache) {
  return cache && cache->size >= KVX_V1_1_SIZEOF_CACHE_DESC &&
         (uint64_t)cache->num_blocks * cache->block_size * cache->num_kv_heads * cache->head_dim > (1ull << 31);
}

/* A gather from a cache of more than 2^31 elements is refused, nothing written (its gathers are right). */
static kvx_status_t gather_defect(const kvx_cache_desc_t* cache, const kvx_gather_desc_t* desc, void* stream) {
  if (over_2_31_elements(cache) && desc && !fp4_call(cache) && ref.validate(cache) == KVX_STATUS_OK)
    return KVX_STATUS_UNSUPPORTED;
  return ref.gather(cache, desc, stream);
}
#elif KVX_FRONT_DEFECT == FRONT_FP8_GATHER_SATFINITE
/* The byte a raw FP8 code becomes when decoded to F32 and encoded again by a saturating conversion (CUDA's
 * __nv_cvt_float_to_fp8 with __NV_SATFINITE): every finite code and +-0 round-trip, E5M2's +-inf become +-57344
 * and every NaN byte the conversion's one NaN, 0x7F. */
static unsigned char satfinite_roundtrip(unsigned char b, kvx_dtype_t dt) {
  if (dt == KVX_DTYPE_F8_E4M3) return (b & 0x7F) == 0x7F ? 0x7F : b;
  if ((b & 0x7F) == 0x7C) return (unsigned char)(b - 1); /* +-inf -> +-57344 (0x7B / 0xFB) */
  return (b & 0x7F) > 0x7C ? 0x7F : b;
}

/* A raw gather (each FP8 output of its cache's dtype) on host memory of 16 or more (sequence, beam) rows: the
 * reference's gather, then every byte it wrote (rows t < min(L, max_seq_len) of each row group, 3-D or 4-D
 * outputs) through satfinite_roundtrip: a batch kernel that moves FP8 through F32 as its converting gathers do. */
static kvx_status_t gather_defect(const kvx_cache_desc_t* cache, const kvx_gather_desc_t* desc, void* stream) {
  const kvx_status_t st = ref.gather(cache, desc, stream);
  if (st != KVX_STATUS_OK || !gather_plain(cache, desc) || fp4_call(cache) ||
      desc->io.size < sizeof(kvx_kv_io_desc_t) || !desc->seq_lens.lengths ||
      (desc->seq_lens.dtype != KVX_DTYPE_S32 && desc->seq_lens.dtype != KVX_DTYPE_S64))
    return st;
  const kvx_block_table_t* tb = &desc->block_table;
  const uint64_t beams = tb->format == KVX_BLOCK_TABLE_KV_OFFSETS ? tb->beam_width : 1;
  const int64_t msl = desc->max_seq_len;
  if ((uint64_t)tb->seq_count * beams < 16 || msl == 0 ||
      (uint64_t)desc->io.num_tokens != (uint64_t)tb->seq_count * beams * (uint64_t)msl)
    return st;
  const kvx_tensor_desc_t* sides[2][2] = {{&cache->k, &desc->io.key}, {&cache->v, &desc->io.value}};
  for (int sd = 0; sd < 2; ++sd) {
    const kvx_tensor_desc_t* c = sides[sd][0];
    const kvx_tensor_desc_t* o = sides[sd][1];
    if ((c->dtype != KVX_DTYPE_F8_E4M3 && c->dtype != KVX_DTYPE_F8_E5M2) || o->dtype != c->dtype || !o->data ||
        (o->ndim != 3 && o->ndim != 4))
      continue;
    for (uint64_t g = 0; g < (uint64_t)tb->seq_count * beams; ++g) {
      int64_t n = index_at(desc->seq_lens.lengths, desc->seq_lens.dtype, (size_t)(g / beams));
      if (n > msl) n = msl;
      for (int64_t t = 0; t < n; ++t)
        for (int64_t h = 0; h < (int64_t)desc->io.num_kv_heads; ++h)
          for (int64_t d = 0; d < (int64_t)desc->io.head_dim; ++d) {
            const int64_t off = o->ndim == 4 ? (int64_t)g * o->stride[0] + t * o->stride[1] + h * o->stride[2] +
                                                   d * o->stride[3]
                                             : ((int64_t)g * msl + t) * o->stride[0] + h * o->stride[1] +
                                                   d * o->stride[2];
            unsigned char* e = (unsigned char*)o->data + off;
            *e = satfinite_roundtrip(*e, c->dtype); /* the defect */
          }
    }
  }
  return st;
}
#else
static kvx_status_t gather_defect(const kvx_cache_desc_t* cache, const kvx_gather_desc_t* desc, void* stream) {
  return ref.gather(cache, desc, stream_for(cache, stream));
}
#endif

#if KVX_FRONT_DEFECT == FRONT_HND_SENTINEL || KVX_FRONT_DEFECT == FRONT_FP4_BULK_SENTINEL || \
    KVX_FRONT_DEFECT == FRONT_NHD_CONVERT_SENTINEL
/* HND_SENTINEL: more than 24 tokens into HND K and V caches; NHD_CONVERT_SENTINEL: more than 24
 * tokens into NHD K and V caches, both sides converting; FP4_BULK_SENTINEL: more than 16 tokens into
 * an FP4 cache: only negative slots skipped (invalid_slot -1). */
static kvx_status_t write_defect(const kvx_cache_desc_t* cache, const kvx_write_desc_t* desc, void* stream) {
#if KVX_FRONT_DEFECT == FRONT_HND_SENTINEL
  const int gated = write_plain(cache, desc) && cache->k.layout == KVX_LAYOUT_BLOCK_HND &&
                    cache->v.layout == KVX_LAYOUT_BLOCK_HND && desc->io.num_tokens > 24;
#elif KVX_FRONT_DEFECT == FRONT_NHD_CONVERT_SENTINEL
  const int gated = write_plain(cache, desc) && cache->k.layout == KVX_LAYOUT_BLOCK_NHD &&
                    cache->v.layout == KVX_LAYOUT_BLOCK_NHD && desc->io.key.dtype != cache->k.dtype &&
                    desc->io.value.dtype != cache->v.dtype && desc->io.num_tokens > 24;
#else
  const int gated = write_plain(cache, desc) && fp4_call(cache) && desc->io.num_tokens > 16;
#endif
  if (gated && desc->slots.invalid_slot >= 0) {
    kvx_write_desc_t local;
    memset(&local, 0, sizeof local);
    memcpy(&local, desc, desc->size);
    local.slots.invalid_slot = -1;
    return ref.write(cache, &local, stream);
  }
  return ref.write(cache, desc, stream);
}
#elif KVX_FRONT_DEFECT == FRONT_FP8_BATCH_NOSAT

/* The written tokens' saturated E5M2 bytes (+-57344) turned into +-inf. */
static void unsaturate_code(unsigned char* p, const kvx_tensor_desc_t* io, int64_t i, int64_t h, int64_t d) {
  (void)io, (void)i, (void)h, (void)d;
  if ((*p & 0x7Fu) == 0x7Bu) *p = (unsigned char)((*p & 0x80u) | 0x7Cu);
}
static void unsaturate(const kvx_cache_desc_t* cache, const kvx_write_desc_t* desc, const kvx_tensor_desc_t* t,
                       const kvx_tensor_desc_t* io) {
  if (t->dtype != KVX_DTYPE_F8_E5M2 || io->dtype == KVX_DTYPE_F8_E5M2 || !t->data) return;
  for_each_written_code(cache, desc, t, io, unsaturate_code);
}

static kvx_status_t write_defect(const kvx_cache_desc_t* cache, const kvx_write_desc_t* desc, void* stream) {
  const kvx_status_t st = ref.write(cache, desc, stream);
  if (st == KVX_STATUS_OK && host_batch_write(cache, desc)) {
    unsaturate(cache, desc, &cache->k, &desc->io.key);
    unsaturate(cache, desc, &cache->v, &desc->io.value);
  }
  return st;
}
#elif KVX_FRONT_DEFECT == FRONT_CONVERT_BULK_RTZ || KVX_FRONT_DEFECT == FRONT_HND_BF16_RTZ
/* Whether the F32 rows of the side whose cache tensor is `t` are truncated in a write of n tokens:
 * CONVERT_BULK_RTZ, past 4096 tokens; HND_BF16_RTZ, past 32 tokens into an HND BF16 cache. */
static int truncates(const kvx_tensor_desc_t* t, uint32_t n) {
#if KVX_FRONT_DEFECT == FRONT_CONVERT_BULK_RTZ
  (void)t;
  return n > 4096;
#else
  return n > 32 && t->layout == KVX_LAYOUT_BLOCK_HND && t->dtype == KVX_DTYPE_BF16;
#endif
}

/* F32 bits truncated to the F16 (normal range) or BF16 grid: what the cache's rounding then keeps exactly. */
static uint32_t truncated_bits(uint32_t b, kvx_dtype_t to) {
  const uint32_t e = (b >> 23) & 0xFFu;
  if (e == 0xFFu) return b;
  if (to == KVX_DTYPE_BF16) return b & 0xFFFF0000u;
  return e >= 113 && e <= 142 ? b & 0xFFFFE000u : b;
}

/* A dense copy of an F32 IO tensor of [n, H, D], truncated to ``to``, or NULL. */
static float* truncated_rows(const kvx_tensor_desc_t* t, kvx_dtype_t to, uint32_t n, uint32_t H, uint32_t D) {
  if (t->dtype != KVX_DTYPE_F32 || (to != KVX_DTYPE_F16 && to != KVX_DTYPE_BF16) || t->ndim != 3 || !t->data) return NULL;
  float* out = (float*)malloc((size_t)n * H * D * sizeof(float));
  if (!out) return NULL;
  for (int64_t i = 0; i < n; ++i)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t d = 0; d < D; ++d) {
        uint32_t b;
        memcpy(&b, (const float*)t->data + i * t->stride[0] + h * t->stride[1] + d * t->stride[2], 4);
        b = truncated_bits(b, to);
        memcpy(out + ((size_t)i * H + h) * D + d, &b, 4);
      }
  return out;
}

static kvx_status_t write_defect(const kvx_cache_desc_t* cache, const kvx_write_desc_t* desc, void* stream) {
  const uint32_t n = write_plain(cache, desc) ? desc->io.num_tokens : 0;
  if (!n || cache->k.memory != KVX_MEMORY_HOST || (!truncates(&cache->k, n) && !truncates(&cache->v, n)) ||
      desc->io.num_kv_heads != cache->num_kv_heads || desc->io.head_dim != cache->head_dim ||
      ref.validate(cache) != KVX_STATUS_OK)
    return ref.write(cache, desc, stream);
  const uint32_t H = cache->num_kv_heads, D = cache->head_dim;
  float* k = truncates(&cache->k, n) ? truncated_rows(&desc->io.key, cache->k.dtype, n, H, D) : NULL;
  float* v = truncates(&cache->v, n) ? truncated_rows(&desc->io.value, cache->v.dtype, n, H, D) : NULL;
  kvx_write_desc_t local;
  memset(&local, 0, sizeof local);
  memcpy(&local, desc, desc->size);
  kvx_tensor_desc_t* io[2] = {&local.io.key, &local.io.value};
  float* rows[2] = {k, v};
  for (int sd = 0; sd < 2; ++sd)
    if (rows[sd]) {
      io[sd]->data = rows[sd];
      io[sd]->stride[0] = (int64_t)H * D;
      io[sd]->stride[1] = D;
      io[sd]->stride[2] = 1;
    }
  const kvx_status_t st = ref.write(cache, &local, stream);
  free(k);
  free(v);
  return st;
}
#elif KVX_FRONT_DEFECT == FRONT_FP8_HEADS_MOD8
static kvx_status_t write_defect(const kvx_cache_desc_t* cache, const kvx_write_desc_t* desc, void* stream) {
  const int fp8 = cache && (cache->k.dtype == KVX_DTYPE_F8_E4M3 || cache->k.dtype == KVX_DTYPE_F8_E5M2);
  if (!write_plain(cache, desc) || !fp8 || cache->num_kv_heads <= 8 || cache->num_kv_heads > 1024 ||
      desc->io.num_tokens <= 16 || cache->k.memory != KVX_MEMORY_HOST)
    return ref.write(cache, desc, stream);
  kvx_write_desc_t local;
  memset(&local, 0, sizeof local);
  memcpy(&local, desc, desc->size);
  static __thread float mod8[2][1024];
  kvx_scale_desc_t* sc[2] = {&local.k_scale_desc, &local.v_scale_desc};
  for (int sd = 0; sd < 2; ++sd) {
    if (!sc[sd]->data || sc[sd]->granularity != KVX_SCALE_PER_HEAD || sc[sd]->dtype != KVX_DTYPE_F32) continue;
    const int64_t step = sc[sd]->ndim >= 1 && sc[sd]->stride[0] > 0 ? sc[sd]->stride[0] : 1;
    for (uint32_t h = 0; h < cache->num_kv_heads; ++h)  /* the defect: a table of 8 heads */
      mod8[sd][h] = ((const float*)sc[sd]->data)[(h % 8) * step];
    sc[sd]->data = mod8[sd];
    if (sc[sd]->ndim >= 1) sc[sd]->stride[0] = 1;
  }
  return ref.write(cache, &local, stream);
}
#elif KVX_FRONT_DEFECT == FRONT_HND_WIDE_BLOCKS || KVX_FRONT_DEFECT == FRONT_HND_BF16_TAIL || \
    KVX_FRONT_DEFECT == FRONT_HND_GRID16 || KVX_FRONT_DEFECT == FRONT_PREFILL_BS256
/* HND_WIDE_BLOCKS: into HND caches of blocks above 128 tokens, no token at a block offset of 128 or
 * more stored; HND_BF16_TAIL: of more than 128 BF16 rows into HND BF16 caches, only whole tiles of
 * 128 tokens stored; HND_GRID16: into caches with an HND or HND_PACKED side, no token past 65535
 * stored; PREFILL_BS256: of more than 24 tokens into caches of blocks of a power of two above 256 tokens (any
 * layout), no token at a block offset of 256 or more stored. The tokens dropped get slot -1. */
#if KVX_FRONT_DEFECT == FRONT_HND_GRID16
static int hnd_side(const kvx_cache_desc_t* cache) {
  const kvx_layout_t k = cache->k.layout, v = cache->v.layout;
  return k == KVX_LAYOUT_BLOCK_HND || k == KVX_LAYOUT_BLOCK_HND_PACKED || v == KVX_LAYOUT_BLOCK_HND ||
         v == KVX_LAYOUT_BLOCK_HND_PACKED;
}
#endif

static int dropped(const kvx_cache_desc_t* cache, const kvx_write_desc_t* desc, size_t i, int64_t slot) {
#if KVX_FRONT_DEFECT == FRONT_HND_WIDE_BLOCKS
  (void)desc, (void)i;
  return slot % cache->block_size >= 128;
#elif KVX_FRONT_DEFECT == FRONT_HND_GRID16
  (void)cache, (void)desc, (void)slot;
  return i > 65535;
#elif KVX_FRONT_DEFECT == FRONT_PREFILL_BS256
  (void)desc, (void)i;
  return slot % cache->block_size >= 256; /* the defect: a tile of 256 block offsets */
#else
  (void)cache, (void)slot;
  return i >= desc->io.num_tokens / 128 * 128;
#endif
}

static kvx_status_t write_defect(const kvx_cache_desc_t* cache, const kvx_write_desc_t* desc, void* stream) {
  const kvx_slot_mapping_t* sm = &desc->slots;
#if KVX_FRONT_DEFECT == FRONT_HND_WIDE_BLOCKS
  const int gated = write_plain(cache, desc) && cache->block_size > 128 &&
                    (cache->k.layout == KVX_LAYOUT_BLOCK_HND || cache->v.layout == KVX_LAYOUT_BLOCK_HND);
#elif KVX_FRONT_DEFECT == FRONT_HND_GRID16
  const int gated = write_plain(cache, desc) && hnd_side(cache) && desc->io.num_tokens > 65535;
#elif KVX_FRONT_DEFECT == FRONT_PREFILL_BS256
  const int gated = write_plain(cache, desc) && cache->block_size > 256 &&
                    !(cache->block_size & (cache->block_size - 1)) && desc->io.num_tokens > 24;
#else
  const int gated = write_plain(cache, desc) && cache->k.layout == KVX_LAYOUT_BLOCK_HND &&
                    cache->v.layout == KVX_LAYOUT_BLOCK_HND && cache->k.dtype == KVX_DTYPE_BF16 &&
                    cache->v.dtype == KVX_DTYPE_BF16 && desc->io.key.dtype == KVX_DTYPE_BF16 &&
                    desc->io.value.dtype == KVX_DTYPE_BF16 && desc->io.num_tokens > 128;
#endif
  if (!gated || cache->k.memory != KVX_MEMORY_HOST || (sm->dtype != KVX_DTYPE_S32 && sm->dtype != KVX_DTYPE_S64) ||
      !sm->slots || sm->token_count == 0 || sm->token_count != desc->io.num_tokens)
    return ref.write(cache, desc, stream);
  const size_t el = sm->dtype == KVX_DTYPE_S64 ? 8 : 4, n = sm->token_count;
  const int64_t cap = (int64_t)cache->num_blocks * cache->block_size;
  void* slots = malloc(n * el);
  if (!slots) return KVX_STATUS_INTERNAL_ERROR;
  memcpy(slots, sm->slots, n * el);
  for (size_t i = 0; i < n; ++i) { /* the defect: those tokens not stored */
    const int64_t v = index_at(sm->slots, sm->dtype, i);
    if (v < 0 || v == sm->invalid_slot || v >= cap || !dropped(cache, desc, i, v)) continue;
    if (el == 8) ((int64_t*)slots)[i] = -1;
    else ((int32_t*)slots)[i] = -1;
  }
  return write_with_slots(cache, desc, slots, stream);
}
#elif KVX_FRONT_DEFECT == FRONT_FP8_V_K_SCALE
static int per_tensor_f32(const kvx_scale_desc_t* sd) {
  return sd->size >= sizeof(kvx_scale_desc_t) && sd->data && sd->dtype == KVX_DTYPE_F32 &&
         sd->granularity == KVX_SCALE_PER_TENSOR && (sd->ndim == 0 || (sd->ndim == 1 && sd->shape[0] == 1));
}

static kvx_status_t write_defect(const kvx_cache_desc_t* cache, const kvx_write_desc_t* desc, void* stream) {
  const kvx_dtype_t io = desc ? desc->io.value.dtype : KVX_DTYPE_F32;
  if (!write_plain(cache, desc) || desc->io.num_tokens <= 32 ||
      (cache->v.layout != KVX_LAYOUT_BLOCK_HND && cache->v.layout != KVX_LAYOUT_BLOCK_HND_PACKED) ||
      (cache->v.dtype != KVX_DTYPE_F8_E4M3 && cache->v.dtype != KVX_DTYPE_F8_E5M2) ||
      (io != KVX_DTYPE_F16 && io != KVX_DTYPE_BF16 && io != KVX_DTYPE_F32) || !per_tensor_f32(&desc->k_scale_desc) ||
      !per_tensor_f32(&desc->v_scale_desc))
    return ref.write(cache, desc, stream);
  kvx_write_desc_t local;
  memset(&local, 0, sizeof local);
  memcpy(&local, desc, desc->size);
  local.v_scale_desc = desc->k_scale_desc; /* the defect: V quantized with K's scale */
  return ref.write(cache, &local, stream);
}
#elif KVX_FRONT_DEFECT == FRONT_FP8_STRIDE0 || KVX_FRONT_DEFECT == FRONT_FP8_STRIDE0_BATCH
/* STRIDE0: every write; STRIDE0_BATCH: writes of more than 24 tokens (a bulk path's scale table). */
static kvx_status_t write_defect(const kvx_cache_desc_t* cache, const kvx_write_desc_t* desc, void* stream) {
  if (!write_plain(cache, desc) || cache->k.memory != KVX_MEMORY_HOST || cache->num_kv_heads < 2 ||
      cache->num_kv_heads > 1024 || (KVX_FRONT_DEFECT == FRONT_FP8_STRIDE0_BATCH && desc->io.num_tokens <= 24))
    return ref.write(cache, desc, stream);
  const uint32_t H = cache->num_kv_heads;
  kvx_write_desc_t local;
  memset(&local, 0, sizeof local);
  memcpy(&local, desc, desc->size);
  static __thread float head0[2][1024];
  const kvx_dtype_t dts[2] = {cache->k.dtype, cache->v.dtype};
  kvx_scale_desc_t* sc[2] = {&local.k_scale_desc, &local.v_scale_desc};
  for (int sd = 0; sd < 2; ++sd) {
    const int fp8 = dts[sd] == KVX_DTYPE_F8_E4M3 || dts[sd] == KVX_DTYPE_F8_E5M2;
    if (!fp8 || sc[sd]->size < sizeof(kvx_scale_desc_t) || !sc[sd]->data || sc[sd]->dtype != KVX_DTYPE_F32 ||
        sc[sd]->granularity != KVX_SCALE_PER_HEAD || sc[sd]->ndim != 1 || sc[sd]->stride[0] != 0)
      continue;
    for (uint32_t h = 0; h < H; ++h) head0[sd][h] = ((const float*)sc[sd]->data)[0]; /* the defect: a broadcast */
    sc[sd]->data = head0[sd];
    sc[sd]->stride[0] = 1;
  }
  return ref.write(cache, &local, stream);
}
#elif KVX_FRONT_DEFECT == FRONT_HND_U32_OFFSET || KVX_FRONT_DEFECT == FRONT_HNDP_U32_OFFSET
static kvx_status_t write_defect(const kvx_cache_desc_t* cache, const kvx_write_desc_t* desc, void* stream) {
  const kvx_slot_mapping_t* sm = desc ? &desc->slots : NULL;
  const uint64_t w = write_plain(cache, desc) ? wrap_blocks(cache) : 0;
  if (!w || !sm->slots || sm->token_count == 0 || sm->token_count != desc->io.num_tokens ||
      (sm->dtype != KVX_DTYPE_S32 && sm->dtype != KVX_DTYPE_S64))
    return ref.write(cache, desc, stream);
  const int64_t bs = cache->block_size;
  void* slots =
      wrapped(sm->slots, sm->dtype, sm->token_count, w, bs, sm->invalid_slot, (int64_t)cache->num_blocks * bs);
  return slots ? write_with_slots(cache, desc, slots, stream) : KVX_STATUS_INTERNAL_ERROR;
}
#elif KVX_FRONT_DEFECT == FRONT_BULK_BF16_NAN || KVX_FRONT_DEFECT == FRONT_BF16_FTZ_WRITE || \
    KVX_FRONT_DEFECT == FRONT_DECODE_BF16_NAN
/* Writes of more than BULK_ROWS tokens (DECODE_BF16_NAN: of one) from F32 rows into a BF16 cache side: the live tokens copied
 * densely, every input the defect changes replaced by the F32 value of what the bulk path stores. */
static kvx_status_t write_defect(const kvx_cache_desc_t* cache, const kvx_write_desc_t* desc, void* stream) {
  const kvx_slot_mapping_t* sm = &desc->slots;
  if (!write_plain(cache, desc) || !tensors_plain(cache, &desc->io) || cache->k.memory != KVX_MEMORY_HOST ||
      !BULK_TAKES(desc->io.num_tokens) || sm->token_count != desc->io.num_tokens || !sm->slots ||
      (sm->dtype != KVX_DTYPE_S32 && sm->dtype != KVX_DTYPE_S64))
    return ref.write(cache, desc, stream);
  const int conv[2] = {desc->io.key.dtype == KVX_DTYPE_F32 && cache->k.dtype == KVX_DTYPE_BF16,
                       desc->io.value.dtype == KVX_DTYPE_F32 && cache->v.dtype == KVX_DTYPE_BF16};
  const size_t es[2] = {io_esize(desc->io.key.dtype), io_esize(desc->io.value.dtype)};
  if ((!conv[0] && !conv[1]) || !es[0] || !es[1] || ref.validate(cache) != KVX_STATUS_OK)
    return ref.write(cache, desc, stream);
  const uint64_t n = desc->io.num_tokens, H = desc->io.num_kv_heads, D = desc->io.head_dim;
  uint64_t m = 0;
  for (uint64_t i = 0; i < n; ++i) {
    const int64_t s = index_at(sm->slots, sm->dtype, i);
    m += s >= 0 && s != sm->invalid_slot;
  }
  if (m * H * D > BULK_MAX_ELEMS) return ref.write(cache, desc, stream);
  int64_t* slots = (int64_t*)malloc((m ? m : 1) * 8);
  unsigned char* rows[2] = {(unsigned char*)malloc((m ? m : 1) * H * D * es[0]),
                            (unsigned char*)malloc((m ? m : 1) * H * D * es[1])};
  if (!slots || !rows[0] || !rows[1]) {
    free(slots);
    free(rows[0]);
    free(rows[1]);
    return KVX_STATUS_INTERNAL_ERROR;
  }
  const kvx_tensor_desc_t* in[2] = {&desc->io.key, &desc->io.value};
  uint64_t j = 0;
  for (uint64_t i = 0; i < n; ++i) {
    const int64_t s = index_at(sm->slots, sm->dtype, i);
    if (s < 0 || s == sm->invalid_slot) continue;
    slots[j] = s;
    for (int sd = 0; sd < 2; ++sd)
      for (uint64_t h = 0; h < H; ++h)
        for (uint64_t e = 0; e < D; ++e) {
          const unsigned char* src = (const unsigned char*)in[sd]->data +
              (int64_t)(i * in[sd]->stride[0] + h * in[sd]->stride[1] + e * in[sd]->stride[2]) * (int64_t)es[sd];
          unsigned char* dst = rows[sd] + ((j * H + h) * D + e) * es[sd];
          memcpy(dst, src, es[sd]);
          uint32_t x;
          if (conv[sd] && (memcpy(&x, dst, 4), bulk_hit(x))) {
            x = (uint32_t)bulk_bits(x) << 16; /* the defect */
            memcpy(dst, &x, 4);
          }
        }
    ++j;
  }
  kvx_write_desc_t local;
  memset(&local, 0, sizeof local);
  memcpy(&local, desc, desc->size);
  kvx_tensor_desc_t* io[2] = {&local.io.key, &local.io.value};
  for (int sd = 0; sd < 2; ++sd) {
    io[sd]->data = rows[sd];
    io[sd]->shape[0] = (int64_t)m;
    io[sd]->stride[0] = (int64_t)(H * D);
    io[sd]->stride[1] = (int64_t)D;
    io[sd]->stride[2] = 1;
  }
  local.io.num_tokens = (uint32_t)m;
  local.slots.token_count = (uint32_t)m;
  local.slots.dtype = KVX_DTYPE_S64;
  local.slots.invalid_slot = -1;
  local.slots.slots = slots;
  const kvx_status_t st = ref.write(cache, &local, stream);
  free(slots);
  free(rows[0]);
  free(rows[1]);
  return st;
}
#elif KVX_FRONT_DEFECT == FRONT_S32_SENTINEL_NARROW
/* Writes of more than 24 tokens with S32 slots: the slots compared with (int32_t)invalid_slot, so an
 * invalid_slot outside int32 drops the valid slot of its low 32 bits. */
static kvx_status_t write_defect(const kvx_cache_desc_t* cache, const kvx_write_desc_t* desc, void* stream) {
  const kvx_slot_mapping_t* sm = &desc->slots;
  if (!write_plain(cache, desc) || sm->dtype != KVX_DTYPE_S32 || !sm->slots || sm->token_count <= 24 ||
      sm->token_count != desc->io.num_tokens || (sm->invalid_slot >= INT32_MIN && sm->invalid_slot <= INT32_MAX))
    return ref.write(cache, desc, stream);
  const int32_t narrowed = (int32_t)sm->invalid_slot; /* the defect: the sentinel at the slots' width */
  int32_t* slots = (int32_t*)malloc((size_t)sm->token_count * 4);
  if (!slots) return KVX_STATUS_INTERNAL_ERROR;
  memcpy(slots, sm->slots, (size_t)sm->token_count * 4);
  for (uint32_t i = 0; i < sm->token_count; ++i)
    if (slots[i] == narrowed) slots[i] = -1;
  return write_with_slots(cache, desc, slots, stream);
}
#elif KVX_FRONT_DEFECT == FRONT_FP4_RAW_SCALE_ROWS
/* A raw transfer's scale input [n, H, J] of positive strides, none below its dense one and not all equal to them
 * (padded rows or heads): the inputs the batch copy reads as dense rows (inside their span: each term of the
 * farthest offset no larger than the strided one's). */
static int scale_rows_padded(const kvx_tensor_desc_t* t, int64_t n, int64_t H, int64_t J) {
  if (t->size < sizeof(kvx_tensor_desc_t) || !t->data || t->ndim != 3 || t->shape[0] != n || t->shape[1] != H ||
      t->shape[2] != J)
    return 0;
  const int64_t dense[3] = {H * J, J, 1};
  int same = 1;
  for (int i = 0; i < 3; ++i) {
    if (t->stride[i] < dense[i]) return 0;
    same &= t->stride[i] == dense[i];
  }
  return !same;
}

/* Raw FP4 writes of more than 64 tokens: each padded scale input read through dense strides. */
static kvx_status_t write_defect(const kvx_cache_desc_t* cache, const kvx_write_desc_t* desc, void* stream) {
  if (!write_plain(cache, desc) || !fp4_call(cache) || desc->size != sizeof(kvx_write_desc_t) ||
      desc->fp4.size < sizeof(kvx_fp4_io_scales_t) || desc->io.key.dtype != KVX_DTYPE_F4_E2M1 ||
      desc->io.value.dtype != KVX_DTYPE_F4_E2M1 || desc->io.num_tokens <= 64)
    return ref.write(cache, desc, stream);
  const int64_t B = cache->fp4.format == KVX_FP4_MXFP4_OCP ? 32 : 16;
  const int64_t n = desc->io.num_tokens, H = desc->io.num_kv_heads, J = desc->io.head_dim / B;
  kvx_write_desc_t local;
  memset(&local, 0, sizeof local);
  memcpy(&local, desc, desc->size);
  kvx_tensor_desc_t* sides[2] = {&local.fp4.key_scales, &local.fp4.value_scales};
  int changed = 0;
  for (int i = 0; i < 2; ++i)
    if (scale_rows_padded(sides[i], n, H, J)) {
      sides[i]->stride[0] = H * J; /* the defect: the strides unread */
      sides[i]->stride[1] = J;
      sides[i]->stride[2] = 1;
      changed = 1;
    }
  return ref.write(cache, changed ? &local : desc, stream);
}
#elif KVX_FRONT_DEFECT == FRONT_FP4_RAW_SENTINEL
/* Raw FP4 writes (F4_E2M1 IO: codes and scale bytes copied): only negative slots skipped. */
static kvx_status_t write_defect(const kvx_cache_desc_t* cache, const kvx_write_desc_t* desc, void* stream) {
  if (!write_plain(cache, desc) || desc->io.key.size < sizeof(kvx_tensor_desc_t) ||
      desc->io.key.dtype != KVX_DTYPE_F4_E2M1 || desc->slots.invalid_slot < 0)
    return ref.write(cache, desc, stream);
  kvx_write_desc_t local;
  memset(&local, 0, sizeof local);
  memcpy(&local, desc, desc->size);
  local.slots.invalid_slot = -1; /* the defect */
  return ref.write(cache, &local, stream);
}
#elif KVX_FRONT_DEFECT == FRONT_FP8_RECIP_PREFILL
#define RECIP_MIN 1024u
/* The F32 scale of FP8 side `sd` for each of `H` heads (per tensor or per head, F32 descriptors or the
 * v1.1 pointer); 0 when the call is not one this defect handles. */
static int side_scales(const kvx_write_desc_t* d, int sd, uint32_t H, float* out) {
  const kvx_scale_desc_t* s = sd ? &d->v_scale_desc : &d->k_scale_desc;
  const void* ptr = sd ? d->v_scale : d->k_scale;
  if (s->size < sizeof *s) return 0;
  if (s->data) {
    if (s->dtype != KVX_DTYPE_F32) return 0;
    if (s->granularity == KVX_SCALE_PER_TENSOR && (s->ndim == 0 || (s->ndim == 1 && s->shape[0] == 1))) {
      for (uint32_t h = 0; h < H; ++h) out[h] = ((const float*)s->data)[0];
      return 1;
    }
    if (s->granularity == KVX_SCALE_PER_HEAD && s->ndim == 1 && s->shape[0] == (int64_t)H &&
        (H == 1 || s->stride[0] == 1)) {
      for (uint32_t h = 0; h < H; ++h) out[h] = ((const float*)s->data)[h];
      return 1;
    }
    return 0;
  }
  for (uint32_t h = 0; h < H; ++h) out[h] = ptr ? *(const float*)ptr : 1.0f;
  return 1;
}

/* Quantizing FP8 writes of more than RECIP_MIN tokens from F32 / BF16 rows: each side's rows passed as
 * F32 `x * RN32(1 / scale)` with a scale of 1, so the reference quantizes what a reciprocal-multiply
 * kernel computes (R-FP8 asks for IEEE division). */
static kvx_status_t write_defect(const kvx_cache_desc_t* cache, const kvx_write_desc_t* desc, void* stream) {
  if (!write_plain(cache, desc) || !tensors_plain(cache, &desc->io) || cache->k.memory != KVX_MEMORY_HOST ||
      desc->io.num_tokens <= RECIP_MIN || cache->num_kv_heads > 4096)
    return ref.write(cache, desc, stream);
  const uint64_t n = desc->io.num_tokens, H = cache->num_kv_heads, D = cache->head_dim;
  const kvx_tensor_desc_t* in[2] = {&desc->io.key, &desc->io.value};
  const kvx_dtype_t cd[2] = {cache->k.dtype, cache->v.dtype};
  static __thread float sc[2][4096];
  int quant[2];
  for (int sd = 0; sd < 2; ++sd)
    quant[sd] = (cd[sd] == KVX_DTYPE_F8_E4M3 || cd[sd] == KVX_DTYPE_F8_E5M2) &&
                (in[sd]->dtype == KVX_DTYPE_BF16 || in[sd]->dtype == KVX_DTYPE_F32) &&
                side_scales(desc, sd, (uint32_t)H, sc[sd]);
  if ((!quant[0] && !quant[1]) || n * H * D > (1ull << 26) || ref.validate(cache) != KVX_STATUS_OK)
    return ref.write(cache, desc, stream);
  kvx_write_desc_t local;
  memset(&local, 0, sizeof local);
  memcpy(&local, desc, desc->size);
  float* rows[2] = {NULL, NULL};
  static const float one = 1.0f;
  for (int sd = 0; sd < 2; ++sd) {
    if (!quant[sd]) continue;
    rows[sd] = (float*)malloc(n * H * D * 4);
    if (!rows[sd]) {
      free(rows[0]);
      return KVX_STATUS_INTERNAL_ERROR;
    }
    const int f32 = in[sd]->dtype == KVX_DTYPE_F32;
    for (uint64_t h = 0; h < H; ++h) {
      const float r = 1.0f / sc[sd][h]; /* the defect: the reciprocal, rounded to F32, then a multiply */
      for (uint64_t i = 0; i < n; ++i)
        for (uint64_t e = 0; e < D; ++e) {
          const unsigned char* p = (const unsigned char*)in[sd]->data +
              (int64_t)(i * in[sd]->stride[0] + h * in[sd]->stride[1] + e * in[sd]->stride[2]) * (f32 ? 4 : 2);
          uint32_t bits = 0;
          if (f32) {
            memcpy(&bits, p, 4);
          } else {
            uint16_t b;
            memcpy(&b, p, 2);
            bits = (uint32_t)b << 16;
          }
          float x;
          memcpy(&x, &bits, 4);
          volatile float y = x * r;
          rows[sd][(i * H + h) * D + e] = y;
        }
    }
    kvx_tensor_desc_t* t = sd ? &local.io.value : &local.io.key;
    t->dtype = KVX_DTYPE_F32;
    t->data = rows[sd];
    t->stride[0] = (int64_t)(H * D);
    t->stride[1] = (int64_t)D;
    t->stride[2] = 1;
    kvx_scale_desc_t* s = sd ? &local.v_scale_desc : &local.k_scale_desc;
    s->dtype = KVX_DTYPE_F32;
    s->granularity = KVX_SCALE_PER_TENSOR;
    s->ndim = 0;
    s->data = &one;
    if (sd)
      local.v_scale = NULL;
    else
      local.k_scale = NULL;
  }
  const kvx_status_t st = ref.write(cache, &local, stream);
  free(rows[0]);
  free(rows[1]);
  return st;
}
#elif KVX_FRONT_DEFECT == FRONT_PLAN_ADDR_DTYPE
/* Converting writes (IO dtype other than the cache's) of 16-bit caches keep the first call's cache dtype. */
static kvx_status_t write_defect(const kvx_cache_desc_t* cache, const kvx_write_desc_t* desc, void* stream) {
  kvx_cache_desc_t local;
  const int converting = write_plain(cache, desc) && desc->io.key.size >= sizeof(kvx_tensor_desc_t) &&
                         cache->k.size >= sizeof(kvx_tensor_desc_t) && desc->io.key.dtype != cache->k.dtype &&
                         (cache->k.dtype == KVX_DTYPE_F16 || cache->k.dtype == KVX_DTYPE_BF16);
  return ref.write(converting ? planned(cache, &local) : cache, desc, stream);
}
#elif KVX_FRONT_DEFECT == FRONT_ONE_BUFFER_BULK
/* Bytes from the first to one past the last element of a host tensor with non-negative strides (0: not one). */
static size_t host_span_bytes(const kvx_tensor_desc_t* t) {
  const size_t es = t->dtype == KVX_DTYPE_F32 ? 4 : t->dtype == KVX_DTYPE_F16 || t->dtype == KVX_DTYPE_BF16 ? 2
                    : t->dtype == KVX_DTYPE_F8_E4M3 || t->dtype == KVX_DTYPE_F8_E5M2       ? 1
                                                                                           : 0;
  if (!es || t->size < sizeof(kvx_tensor_desc_t) || t->memory != KVX_MEMORY_HOST || !t->data || t->ndim < 1 ||
      t->ndim > KVX_MAX_TENSOR_DIMS)
    return 0;
  uint64_t last = 0;
  for (uint32_t i = 0; i < t->ndim; ++i) {
    if (t->shape[i] < 1 || t->stride[i] < 0) return 0;
    last += (uint64_t)(t->shape[i] - 1) * (uint64_t)t->stride[i];
  }
  return (size_t)((last + 1) * es);
}

static kvx_status_t write_defect(const kvx_cache_desc_t* cache, const kvx_write_desc_t* desc, void* stream) {
  const size_t span = write_plain(cache, desc) && desc->io.num_tokens > 64 && desc->io.key.data &&
                              desc->io.key.data == desc->io.value.data
                          ? host_span_bytes(&cache->v)
                          : 0;
  void* scratch = span ? malloc(span) : NULL;
  if (!scratch) return ref.write(cache, desc, stream);
  kvx_cache_desc_t local;
  memset(&local, 0, sizeof local);
  memcpy(&local, cache, cache->size < sizeof local ? cache->size : sizeof local);
  memcpy(scratch, cache->v.data, span);
  local.v.data = scratch; /* the defect: the V side's stores land outside the caller's V cache */
  const kvx_status_t st = ref.write(&local, desc, stream);
  free(scratch);
  return st;
}
#elif KVX_FRONT_DEFECT == FRONT_ONE_BUFFER_FP8
static kvx_status_t write_defect(const kvx_cache_desc_t* cache, const kvx_write_desc_t* desc, void* stream) {
  const int fp8 = cache && cache->size >= KVX_V1_1_SIZEOF_CACHE_DESC &&
                  (cache->v.dtype == KVX_DTYPE_F8_E4M3 || cache->v.dtype == KVX_DTYPE_F8_E5M2);
  if (!fp8 || !write_plain(cache, desc) || !desc->io.key.data || desc->io.key.data != desc->io.value.data)
    return ref.write(cache, desc, stream);
  kvx_write_desc_t local;
  memset(&local, 0, sizeof local);
  memcpy(&local, desc, desc->size);
  local.v_scale = desc->k_scale; /* the defect: one quantization, K's scales, stored twice */
  local.v_scale_desc = desc->k_scale_desc;
  return ref.write(cache, &local, stream);
}
#elif KVX_FRONT_DEFECT == FRONT_FP8_SCALAR_BATCH
/* A PER_TENSOR F32 scale descriptor with data described as a scalar (ndim 0, as a 0-d framework tensor). */
static int scalar_scale(const kvx_scale_desc_t* sd) {
  return sd->size >= sizeof(kvx_scale_desc_t) && sd->data && sd->dtype == KVX_DTYPE_F32 &&
         sd->granularity == KVX_SCALE_PER_TENSOR && sd->ndim == 0;
}

static kvx_status_t write_defect(const kvx_cache_desc_t* cache, const kvx_write_desc_t* desc, void* stream) {
  const int fp8 = cache && cache->size >= KVX_V1_1_SIZEOF_CACHE_DESC &&
                  (cache->k.dtype == KVX_DTYPE_F8_E4M3 || cache->k.dtype == KVX_DTYPE_F8_E5M2 ||
                   cache->v.dtype == KVX_DTYPE_F8_E4M3 || cache->v.dtype == KVX_DTYPE_F8_E5M2);
  if (!fp8 || !write_plain(cache, desc) || desc->io.num_tokens <= 24 ||
      (!scalar_scale(&desc->k_scale_desc) && !scalar_scale(&desc->v_scale_desc)))
    return ref.write(cache, desc, stream);
  kvx_write_desc_t local;
  memset(&local, 0, sizeof local);
  memcpy(&local, desc, desc->size);
  /* the defect: the bulk path counts a descriptor's values by shape[0] of its ndim dims, so a scalar holds
   * none and reads as absent: the k_scale / v_scale pointer, else 1.0, quantizes that side */
  if (scalar_scale(&desc->k_scale_desc)) local.k_scale_desc.data = NULL;
  if (scalar_scale(&desc->v_scale_desc)) local.v_scale_desc.data = NULL;
  return ref.write(cache, &local, stream);
}
#elif KVX_FRONT_DEFECT == FRONT_FP8_NEG_ZERO_BATCH

/* Whether IO element (i, h, d) of `io` (F16 / BF16 / F32, strides in elements) is -0.0. */
static int io_neg_zero(const kvx_tensor_desc_t* io, int64_t i, int64_t h, int64_t d) {
  const int64_t e = i * io->stride[0] + h * io->stride[1] + d * io->stride[2];
  if (io->dtype == KVX_DTYPE_F32) return ((const uint32_t*)io->data)[e] == 0x80000000u;
  if (io->dtype == KVX_DTYPE_BF16) return ((const uint16_t*)io->data)[e] == 0x8000u;
  return 0; /* F16 rows: the sign bit copied from the input's bits, right */
}

static void unsign_code(unsigned char* p, const kvx_tensor_desc_t* io, int64_t i, int64_t h, int64_t d) {
  if (*p == 0x80u && io_neg_zero(io, i, h, d)) *p = 0x00u; /* the defect */
}
/* The written tokens' -0 codes (0x80) of -0.0 inputs turned into +0: the sign taken from x < 0. */
static void unsign_zeros(const kvx_cache_desc_t* cache, const kvx_write_desc_t* desc, const kvx_tensor_desc_t* t,
                         const kvx_tensor_desc_t* io) {
  if ((t->dtype != KVX_DTYPE_F8_E4M3 && t->dtype != KVX_DTYPE_F8_E5M2) || !t->data || !io->data || io->ndim != 3 ||
      (io->dtype != KVX_DTYPE_F32 && io->dtype != KVX_DTYPE_F16 && io->dtype != KVX_DTYPE_BF16))
    return;
  for_each_written_code(cache, desc, t, io, unsign_code);
}

static kvx_status_t write_defect(const kvx_cache_desc_t* cache, const kvx_write_desc_t* desc, void* stream) {
  const kvx_status_t st = ref.write(cache, desc, stream);
  if (st == KVX_STATUS_OK && host_batch_write(cache, desc)) {
    unsign_zeros(cache, desc, &cache->k, &desc->io.key);
    unsign_zeros(cache, desc, &cache->v, &desc->io.value);
  }
  return st;
}
#elif KVX_FRONT_DEFECT == FRONT_HND_BS_MASK_BATCH
/* A write of more than 24 tokens into BLOCK_HND K and V caches whose block_size is no power of two takes the block
 * offset as slot & (block_size - 1) (right for powers of two only), the block as slot / block_size. */
static kvx_status_t write_defect(const kvx_cache_desc_t* cache, const kvx_write_desc_t* desc, void* stream) {
  const int64_t bs = cache ? cache->block_size : 0;
  if (!write_plain(cache, desc) || fp4_call(cache) || cache->k.layout != KVX_LAYOUT_BLOCK_HND ||
      cache->v.layout != KVX_LAYOUT_BLOCK_HND || desc->io.num_tokens <= 24 || bs < 2 || (bs & (bs - 1)) == 0 || !desc->slots.slots ||
      (desc->slots.dtype != KVX_DTYPE_S32 && desc->slots.dtype != KVX_DTYPE_S64))
    return ref.write(cache, desc, stream);
  int64_t* slots = (int64_t*)malloc(sizeof(int64_t) * desc->io.num_tokens);
  if (!slots) return ref.write(cache, desc, stream);
  const int64_t cap = (int64_t)cache->num_blocks * bs;
  for (uint32_t i = 0; i < desc->io.num_tokens; ++i) {
    const int64_t s = index_at(desc->slots.slots, desc->slots.dtype, i);
    slots[i] = (s < 0 || s == desc->slots.invalid_slot || s >= cap) ? s : s / bs * bs + (s & (bs - 1)); /* defect */
  }
  return write_with_slots_of(cache, desc, slots, KVX_DTYPE_S64, stream);
}
#elif KVX_FRONT_DEFECT == FRONT_FP8_K_HEAD_V_TENSOR_BATCH
/* An F32 scale descriptor with data of granularity `g`, as the reference reads it. */
static int f32_scale(const kvx_scale_desc_t* sd, kvx_scale_granularity_t g) {
  return sd->size >= sizeof(kvx_scale_desc_t) && sd->data && sd->dtype == KVX_DTYPE_F32 && sd->granularity == g;
}

/* A write of more than 24 tokens into an FP8 V cache from baseline rows, K's scale descriptor PER_HEAD and V's
 * PER_TENSOR: the kernel of K's granularity reads V's scale per head from a staging buffer of V's value followed by
 * K's values (head 0 of V by V's value, head h > 0 by K's value of head h - 1). */
static kvx_status_t write_defect(const kvx_cache_desc_t* cache, const kvx_write_desc_t* desc, void* stream) {
  const int fp8v = cache && cache->size >= KVX_V1_1_SIZEOF_CACHE_DESC &&
                   (cache->v.dtype == KVX_DTYPE_F8_E4M3 || cache->v.dtype == KVX_DTYPE_F8_E5M2);
  const uint32_t H = cache ? cache->num_kv_heads : 0;
  if (!fp8v || !write_plain(cache, desc) || fp4_call(cache) || desc->io.num_tokens <= 24 || H < 2 || H > 1024 ||
      desc->io.value.dtype == cache->v.dtype || !f32_scale(&desc->k_scale_desc, KVX_SCALE_PER_HEAD) ||
      !f32_scale(&desc->v_scale_desc, KVX_SCALE_PER_TENSOR) || desc->k_scale_desc.ndim != 1 ||
      desc->k_scale_desc.shape[0] != (int64_t)H)
    return ref.write(cache, desc, stream);
  static __thread float staging[1025];
  const int64_t step = desc->k_scale_desc.stride[0] > 0 ? desc->k_scale_desc.stride[0] : 1;
  staging[0] = ((const float*)desc->v_scale_desc.data)[0];
  for (uint32_t h = 0; h < H; ++h) staging[1 + h] = ((const float*)desc->k_scale_desc.data)[h * step];
  kvx_write_desc_t local;
  memset(&local, 0, sizeof local);
  memcpy(&local, desc, desc->size);
  local.v_scale_desc.granularity = KVX_SCALE_PER_HEAD; /* the defect: V read by K's granularity */
  local.v_scale_desc.ndim = 1;
  local.v_scale_desc.shape[0] = (int64_t)H;
  local.v_scale_desc.stride[0] = 1;
  local.v_scale_desc.data = staging;
  return ref.write(cache, &local, stream);
}
#elif KVX_FRONT_DEFECT == FRONT_FP8_PTR_OVER_HEAD_BATCH
/* A write of more than 24 tokens into an FP8 cache whose PER_HEAD scale descriptor sits beside a non-NULL flat
 * k_scale / v_scale pointer: the bulk path, of per-tensor scales only, takes the pointer (the descriptor ignored). */
static kvx_status_t write_defect(const kvx_cache_desc_t* cache, const kvx_write_desc_t* desc, void* stream) {
  const int fp8 = cache && cache->size >= KVX_V1_1_SIZEOF_CACHE_DESC &&
                  (cache->k.dtype == KVX_DTYPE_F8_E4M3 || cache->k.dtype == KVX_DTYPE_F8_E5M2 ||
                   cache->v.dtype == KVX_DTYPE_F8_E4M3 || cache->v.dtype == KVX_DTYPE_F8_E5M2);
  if (!fp8 || !write_plain(cache, desc) || fp4_call(cache) || desc->io.num_tokens <= 24)
    return ref.write(cache, desc, stream);
  const int k = desc->k_scale && desc->k_scale_desc.data && desc->k_scale_desc.granularity == KVX_SCALE_PER_HEAD;
  const int v = desc->v_scale && desc->v_scale_desc.data && desc->v_scale_desc.granularity == KVX_SCALE_PER_HEAD;
  if (!k && !v) return ref.write(cache, desc, stream);
  kvx_write_desc_t local;
  memset(&local, 0, sizeof local);
  memcpy(&local, desc, desc->size);
  if (k) local.k_scale_desc.data = NULL; /* the defect: the flat pointer over the PER_HEAD descriptor */
  if (v) local.v_scale_desc.data = NULL;
  return ref.write(cache, &local, stream);
}
#elif KVX_FRONT_DEFECT == FRONT_S32_GRID16
/* A write with S32 slots of more than 65535 tokens stores tokens 0 to 65535 only (the S32-slot kernel's grid
 * dimension of 16 bits; the S64 one is right), and a write of more than 2^22 tokens is refused as UNSUPPORTED,
 * nothing written (IO tensors a provider may refuse: R-LARGE). */
static kvx_status_t write_defect(const kvx_cache_desc_t* cache, const kvx_write_desc_t* desc, void* stream) {
  if (!write_plain(cache, desc) || fp4_call(cache) || desc->io.num_tokens <= 65535)
    return ref.write(cache, desc, stream);
  const kvx_kv_io_desc_t* io = &desc->io;
  const int well_formed = ref.validate(cache) == KVX_STATUS_OK && desc->slots.token_count == io->num_tokens &&
                          desc->slots.slots && (desc->slots.dtype == KVX_DTYPE_S32 || desc->slots.dtype == KVX_DTYPE_S64) &&
                          io->num_kv_heads == cache->num_kv_heads && io->head_dim == cache->head_dim && io->key.data &&
                          io->value.data && io->key.ndim == 3 && io->value.ndim == 3 &&
                          io->key.shape[0] == (int64_t)io->num_tokens && io->value.shape[0] == (int64_t)io->num_tokens;
  if (io->num_tokens > (1u << 22) && well_formed) return KVX_STATUS_UNSUPPORTED; /* a refusal R-LARGE allows */
  if (desc->slots.dtype != KVX_DTYPE_S32 || !desc->slots.slots) return ref.write(cache, desc, stream);
  int64_t* slots = (int64_t*)malloc(sizeof(int64_t) * desc->io.num_tokens);
  if (!slots) return ref.write(cache, desc, stream);
  for (uint32_t i = 0; i < desc->io.num_tokens; ++i)
    slots[i] = i > 65535 ? -1 : index_at(desc->slots.slots, KVX_DTYPE_S32, i); /* the defect */
  return write_with_slots_of(cache, desc, slots, KVX_DTYPE_S64, stream);
}
#elif KVX_FRONT_DEFECT == FRONT_FLOAT_SLOT
/* A write into a cache of at most 2^31 elements takes slots of 2^24 and more through float32 (a kernel's
 * reciprocal multiply: block = (int)(slot * (1.0f / block_size)), the offset what is left); a larger cache is
 * refused, nothing written. */
static kvx_status_t write_defect(const kvx_cache_desc_t* cache, const kvx_write_desc_t* desc, void* stream) {
  if (!write_plain(cache, desc) || fp4_call(cache)) return ref.write(cache, desc, stream);
  if (over_2_31_elements(cache) && ref.validate(cache) == KVX_STATUS_OK) return KVX_STATUS_UNSUPPORTED;
  const kvx_slot_mapping_t* sm = &desc->slots;
  if (!sm->slots || (sm->dtype != KVX_DTYPE_S32 && sm->dtype != KVX_DTYPE_S64) || sm->token_count == 0 ||
      cache->block_size == 0)
    return ref.write(cache, desc, stream);
  int64_t* slots = (int64_t*)malloc(sizeof(int64_t) * sm->token_count);
  if (!slots) return ref.write(cache, desc, stream);
  const float inv = 1.0f / (float)cache->block_size;
  const int64_t capacity = (int64_t)cache->num_blocks * cache->block_size;
  for (uint32_t i = 0; i < sm->token_count; ++i) {
    const int64_t s = index_at(sm->slots, sm->dtype, i);
    slots[i] = s;
    if (s >= (1 << 24) && s < capacity && s != sm->invalid_slot) { /* a slot the range check let through */
      const int64_t block = (int64_t)((float)s * inv);             /* the defect */
      const int64_t moved = block * cache->block_size + (int64_t)((float)s - (float)block * (float)cache->block_size);
      if (moved >= 0 && moved < capacity) slots[i] = moved;
    }
  }
  return write_with_slots_of(cache, desc, slots, KVX_DTYPE_S64, stream);
}
#elif KVX_FRONT_DEFECT == FRONT_PLAN_ADDR_SAME_DTYPE || KVX_FRONT_DEFECT == FRONT_WIDE_DTYPE_GRID16
/* The element size of F16 / BF16 / F32 (0: another dtype). */
static size_t float_size(kvx_dtype_t dt) {
  return dt == KVX_DTYPE_F32 ? 4 : dt == KVX_DTYPE_F16 || dt == KVX_DTYPE_BF16 ? 2 : 0;
}

/* A side whose input is of a float dtype other than its cache's (both F16 / BF16 / F32): a conversion. */
static int converting_side(const kvx_tensor_desc_t* c, const kvx_tensor_desc_t* io) {
  return c->size >= sizeof(kvx_tensor_desc_t) && io->size >= sizeof(kvx_tensor_desc_t) && float_size(c->dtype) &&
         float_size(io->dtype) && io->dtype != c->dtype;
}

/* A converting write (the feature mixed_io_dtype), which this provider does not serve: refused, nothing written. */
static int refused_conversion(const kvx_cache_desc_t* cache, const kvx_write_desc_t* desc) {
  return write_plain(cache, desc) && !fp4_call(cache) &&
         (converting_side(&cache->k, &desc->io.key) || converting_side(&cache->v, &desc->io.value));
}
#if KVX_FRONT_DEFECT == FRONT_PLAN_ADDR_SAME_DTYPE
/* A plan per cache allocation: the K and V dtypes first seen with a pair of cache pointers and a number of bytes. */
#define SD_PLANS 64
static struct {
  const void* k;
  const void* v;
  uint64_t bytes;
  kvx_dtype_t kdt, vdt;
} sd_plans[SD_PLANS];
static int sd_count;
static pthread_mutex_t sd_mu = PTHREAD_MUTEX_INITIALIZER;

/* Conversions refused; a write whose inputs are of their caches' dtypes (a copy) through cache pointers seen before
 * with as many bytes copies by the dtypes first seen there, where their elements are not larger (an element size
 * chosen when the plan was made): F32 rows into an allocation first written as F16 are stored as F16. */
static kvx_status_t write_defect(const kvx_cache_desc_t* cache, const kvx_write_desc_t* desc, void* stream) {
  if (refused_conversion(cache, desc)) return KVX_STATUS_UNSUPPORTED;
  if (!write_plain(cache, desc) || fp4_call(cache) || cache->size > sizeof(kvx_cache_desc_t) ||
      cache->k.memory != KVX_MEMORY_HOST || !cache->k.data || !cache->v.data || !float_size(cache->k.dtype) ||
      !float_size(cache->v.dtype))
    return ref.write(cache, desc, stream);
  const uint64_t bytes = (uint64_t)cache->num_blocks * cache->block_size * cache->num_kv_heads * cache->head_dim *
                         float_size(cache->k.dtype);
  pthread_mutex_lock(&sd_mu);
  int i = 0;
  while (i < sd_count && !(sd_plans[i].k == cache->k.data && sd_plans[i].v == cache->v.data && sd_plans[i].bytes == bytes))
    ++i;
  if (i == sd_count) {
    i = sd_count < SD_PLANS ? sd_count++ : SD_PLANS - 1;
    sd_plans[i].k = cache->k.data;
    sd_plans[i].v = cache->v.data;
    sd_plans[i].bytes = bytes;
    sd_plans[i].kdt = cache->k.dtype;
    sd_plans[i].vdt = cache->v.dtype;
  }
  const kvx_dtype_t kdt = sd_plans[i].kdt, vdt = sd_plans[i].vdt;
  pthread_mutex_unlock(&sd_mu);
  if (kdt == cache->k.dtype && vdt == cache->v.dtype) return ref.write(cache, desc, stream);
  kvx_cache_desc_t local;
  memset(&local, 0, sizeof local);
  memcpy(&local, cache, cache->size);
  if (float_size(kdt) <= float_size(cache->k.dtype)) local.k.dtype = kdt; /* the defect: the planned dtype */
  if (float_size(vdt) <= float_size(cache->v.dtype)) local.v.dtype = vdt;
  return ref.write(&local, desc, stream);
}
#else
/* Conversions refused; a write of more than 65535 tokens into a cache whose K or V is BF16 or F32 stores tokens 0 to
 * 65535 only (the kernel of those element types launches a grid row per token, a 16-bit grid dimension). */
static kvx_status_t write_defect(const kvx_cache_desc_t* cache, const kvx_write_desc_t* desc, void* stream) {
  if (refused_conversion(cache, desc)) return KVX_STATUS_UNSUPPORTED;
  if (!write_plain(cache, desc) || fp4_call(cache) || desc->io.num_tokens <= 65535 ||
      (cache->k.dtype != KVX_DTYPE_BF16 && cache->k.dtype != KVX_DTYPE_F32 && cache->v.dtype != KVX_DTYPE_BF16 &&
       cache->v.dtype != KVX_DTYPE_F32) ||
      !desc->slots.slots || (desc->slots.dtype != KVX_DTYPE_S32 && desc->slots.dtype != KVX_DTYPE_S64) ||
      desc->slots.token_count != desc->io.num_tokens)
    return ref.write(cache, desc, stream);
  int64_t* slots = (int64_t*)malloc(sizeof(int64_t) * desc->io.num_tokens);
  if (!slots) return ref.write(cache, desc, stream);
  for (uint32_t i = 0; i < desc->io.num_tokens; ++i)
    slots[i] = i > 65535 ? -1 : index_at(desc->slots.slots, desc->slots.dtype, i); /* the defect */
  return write_with_slots_of(cache, desc, slots, KVX_DTYPE_S64, stream);
}
#endif
#elif KVX_FRONT_DEFECT == FRONT_S64_SLOT_LOW32_BATCH
/* A write of more than 24 tokens with S64 slots: each slot is tested against 0 and invalid_slot in 64 bits, then
 * bounded and addressed by its low 32 bits (a uint32 slot in the prefill kernel): slot 2^32 + 3 writes slot 3. */
static kvx_status_t write_defect(const kvx_cache_desc_t* cache, const kvx_write_desc_t* desc, void* stream) {
  const kvx_slot_mapping_t* sm = write_plain(cache, desc) ? &desc->slots : NULL;
  if (!sm || sm->dtype != KVX_DTYPE_S64 || !sm->slots || desc->io.num_tokens <= 24 ||
      sm->token_count != desc->io.num_tokens)
    return ref.write(cache, desc, stream);
  int64_t* slots = (int64_t*)malloc(sizeof(int64_t) * sm->token_count);
  if (!slots) return ref.write(cache, desc, stream);
  memcpy(slots, sm->slots, sizeof(int64_t) * sm->token_count);
  for (uint32_t i = 0; i < sm->token_count; ++i)
    if (slots[i] > (int64_t)UINT32_MAX && slots[i] != sm->invalid_slot)
      slots[i] = (int64_t)(uint32_t)slots[i]; /* the defect: the slot's low 32 bits */
  return write_with_slots(cache, desc, slots, stream);
}
#elif KVX_FRONT_DEFECT == FRONT_PREFILL_ROW_STRIDE
/* A 3-D input [tokens, H, D] whose token rows are contiguous (dims adjacent, heads D apart) but further apart than a
 * dense row (a view of a fused QKV projection's rows): the inputs the prefill path's row copy takes for dense. */
static int spaced_rows(const kvx_tensor_desc_t* t, int64_t H, int64_t D) {
  return t->size >= sizeof(kvx_tensor_desc_t) && t->data && t->ndim == 3 && t->shape[1] == H && t->shape[2] == D &&
         t->stride[2] == 1 && (H == 1 || t->stride[1] == D) && t->stride[0] > H * D;
}

/* A write of more than 1024 tokens: each such input read as dense rows H * D apart (stride[0] unread). */
static kvx_status_t write_defect(const kvx_cache_desc_t* cache, const kvx_write_desc_t* desc, void* stream) {
  if (!write_plain(cache, desc) || fp4_call(cache) || desc->io.num_tokens <= 1024) return ref.write(cache, desc, stream);
  const int64_t H = desc->io.num_kv_heads, D = desc->io.head_dim;
  const int k = spaced_rows(&desc->io.key, H, D), v = spaced_rows(&desc->io.value, H, D);
  if (!k && !v) return ref.write(cache, desc, stream);
  kvx_write_desc_t local;
  memset(&local, 0, sizeof local);
  memcpy(&local, desc, desc->size);
  if (k) local.io.key.stride[0] = H * D; /* the defect: rows taken as dense */
  if (v) local.io.value.stride[0] = H * D;
  return ref.write(cache, &local, stream);
}
#elif KVX_FRONT_DEFECT == FRONT_FP8_V_HEAD_SHAPE_BATCH
/* A write of more than 24 tokens (the prefill path, which builds its own table of scales) checks the PER_HEAD shape
 * (ndim 1, shape [num_kv_heads]) of k_scale_desc alone (its V branch tests dtype and granularity, then reads
 * num_kv_heads values as K's does): a PER_HEAD v_scale_desc of an FP8 V cache whose ndim or shape disagrees is
 * served as num_kv_heads adjacent values (its first value alone where it holds fewer). */
static kvx_status_t write_defect(const kvx_cache_desc_t* cache, const kvx_write_desc_t* desc, void* stream) {
  if (!write_plain(cache, desc) || fp4_call(cache) || desc->io.num_tokens <= 24 ||
      desc->v_scale_desc.size < sizeof(kvx_scale_desc_t) || !desc->v_scale_desc.data ||
      (cache->v.dtype != KVX_DTYPE_F8_E4M3 && cache->v.dtype != KVX_DTYPE_F8_E5M2))
    return ref.write(cache, desc, stream);
  const kvx_scale_desc_t* sd = &desc->v_scale_desc;
  const int64_t H = cache->num_kv_heads;
  if (sd->granularity != KVX_SCALE_PER_HEAD || (sd->ndim == 1 && sd->shape[0] == H))
    return ref.write(cache, desc, stream);
  int64_t n = sd->ndim >= 1 && sd->ndim <= KVX_MAX_TENSOR_DIMS ? 1 : 0;
  for (uint32_t i = 0; n && i < sd->ndim; ++i) n = sd->shape[i] > 0 && n <= INT64_MAX / sd->shape[i] ? n * sd->shape[i] : 0;
  kvx_write_desc_t local;
  memset(&local, 0, sizeof local);
  memcpy(&local, desc, desc->size);
  kvx_scale_desc_t* v = &local.v_scale_desc;
  if (n >= H) { /* the defect: V's shape never checked */
    v->ndim = 1;
    v->shape[0] = H;
    if (v->stride[0] != 0) v->stride[0] = 1;
  } else {
    v->granularity = KVX_SCALE_PER_TENSOR;
  }
  return ref.write(cache, &local, stream);
}
#else
static kvx_status_t write_defect(const kvx_cache_desc_t* cache, const kvx_write_desc_t* desc, void* stream) {
  return ref.write(cache, desc, stream_for(cache, stream));
}
#endif

#if KVX_FRONT_DEFECT == FRONT_CUSTOM_SHAPE
/* The caller's cache, or a copy whose CUSTOM tensors' positive shape entries are the descriptor's. */
static const kvx_cache_desc_t* cache_for(const kvx_cache_desc_t* cache, kvx_cache_desc_t* local) {
  if (!cache || cache->size < KVX_V1_1_SIZEOF_CACHE_DESC || cache->size > sizeof *local ||
      (cache->k.layout != KVX_LAYOUT_BLOCK_CUSTOM && cache->v.layout != KVX_LAYOUT_BLOCK_CUSTOM))
    return cache;
  memset(local, 0, sizeof *local);
  memcpy(local, cache, cache->size);
  const int64_t want[4] = {cache->num_blocks, cache->block_size, cache->num_kv_heads, cache->head_dim};
  kvx_tensor_desc_t* sides[2] = {&local->k, &local->v};
  for (int s = 0; s < 2; ++s)
    if (sides[s]->size >= sizeof(kvx_tensor_desc_t) && sides[s]->layout == KVX_LAYOUT_BLOCK_CUSTOM &&
        sides[s]->ndim == 4)
      for (int i = 0; i < 4; ++i)
        if (sides[s]->shape[i] > 0 && want[i] > 0) sides[s]->shape[i] = want[i]; /* the defect */
  return local;
}
#elif KVX_FRONT_DEFECT == FRONT_FP4_NESTED_SIZE || KVX_FRONT_DEFECT == FRONT_KVO_BPB_F32
/* The caller's cache, or a copy with the field the defect ignores set to what the reference accepts:
 * the FP4 extension's nested sizes (FP4_NESTED_SIZE), or F32 KV_OFFSETS pools' bytes_per_block. */
static const kvx_cache_desc_t* cache_for(const kvx_cache_desc_t* cache, kvx_cache_desc_t* local) {
  if (!cache || cache->size < KVX_V1_1_SIZEOF_CACHE_DESC || cache->size > sizeof *local) return cache;
#if KVX_FRONT_DEFECT == FRONT_FP4_NESTED_SIZE
  if (!fp4_call(cache)) return cache;
  memset(local, 0, sizeof *local);
  memcpy(local, cache, cache->size);
  if (local->fp4.k_scales.size < sizeof(kvx_tensor_desc_t)) local->fp4.k_scales.size = sizeof(kvx_tensor_desc_t);
  if (local->fp4.v_scales.size < sizeof(kvx_tensor_desc_t)) local->fp4.v_scales.size = sizeof(kvx_tensor_desc_t);
  if (local->fp4.k_global.size < sizeof(kvx_scale_desc_t)) local->fp4.k_global.size = sizeof(kvx_scale_desc_t);
  if (local->fp4.v_global.size < sizeof(kvx_scale_desc_t)) local->fp4.v_global.size = sizeof(kvx_scale_desc_t);
#else
  if (cache->k.dtype != KVX_DTYPE_F32 || cache->v.dtype != KVX_DTYPE_F32 || cache->pool.size < sizeof(kvx_pool_desc_t) ||
      !cache->pool.primary || cache->pool.bytes_per_block == 0)
    return cache;
  memset(local, 0, sizeof *local);
  memcpy(local, cache, cache->size);
  local->pool.bytes_per_block = cache->num_kv_heads * cache->block_size * cache->head_dim * 4u;
#endif
  return local;
}
#else
static const kvx_cache_desc_t* cache_for(const kvx_cache_desc_t* cache, kvx_cache_desc_t* local) {
  (void)local;
  return cache;
}
#endif

#if KVX_FRONT_DEFECT == FRONT_FP8_PACK_RULE
/* An FP8 HND_PACKED tensor whose pack (shape[4]) does not divide head_dim. */
static int fp8_pack_broken(const kvx_cache_desc_t* cache, const kvx_tensor_desc_t* t) {
  const int fp8 = t->dtype == KVX_DTYPE_F8_E4M3 || t->dtype == KVX_DTYPE_F8_E5M2;
  return fp8 && t->layout == KVX_LAYOUT_BLOCK_HND_PACKED && t->ndim == 5 && t->shape[4] > 0 &&
         cache->head_dim % t->shape[4] != 0;
}

static kvx_status_t validate_defect(const kvx_cache_desc_t* cache) {
  if (cache && cache->size >= KVX_V1_1_SIZEOF_CACHE_DESC && (fp8_pack_broken(cache, &cache->k) ||
                                                             fp8_pack_broken(cache, &cache->v)))
    return KVX_STATUS_OK; /* the defect: the pack rule checked on the 16-bit path only */
  return ref.validate(cache);
}
#elif KVX_FRONT_DEFECT == FRONT_OFFSET_SUM_OVERFLOW
/* A tensor each of whose stride * (extent - 1) fits in int64 but whose sum, the farthest element
 * offset, does not (non-negative strides). */
static int offset_sum_overflows(const kvx_tensor_desc_t* t) {
  if (t->size < sizeof(kvx_tensor_desc_t) || t->ndim < 1 || t->ndim > KVX_MAX_TENSOR_DIMS) return 0;
  int64_t sum = 0, term;
  int over = 0;
  for (uint32_t i = 0; i < t->ndim; ++i) {
    if (t->shape[i] < 1 || t->stride[i] < 0 || __builtin_mul_overflow(t->stride[i], t->shape[i] - 1, &term)) return 0;
    over |= __builtin_add_overflow(sum, term, &sum);
  }
  return over;
}

static kvx_status_t validate_defect(const kvx_cache_desc_t* cache) {
  if (cache && cache->size >= KVX_V1_1_SIZEOF_CACHE_DESC && (offset_sum_overflows(&cache->k) ||
                                                             offset_sum_overflows(&cache->v)))
    return KVX_STATUS_OK; /* the defect: each term bounded, not their sum */
  return ref.validate(cache);
}
#elif KVX_FRONT_DEFECT == FRONT_UE8M0_CACHE
/* Validation by element size: UE8M0 (a 1-byte dtype of the 1.2 size table, the MXFP4 scale byte)
 * passes as a byte (FP8-like) K / V cache dtype. */
static kvx_status_t validate_defect(const kvx_cache_desc_t* cache) {
  if (!cache || cache->size < KVX_V1_1_SIZEOF_CACHE_DESC || cache->size > sizeof(kvx_cache_desc_t) ||
      cache->k.size < sizeof(kvx_tensor_desc_t) || cache->v.size < sizeof(kvx_tensor_desc_t) ||
      (cache->k.dtype != KVX_DTYPE_UE8M0 && cache->v.dtype != KVX_DTYPE_UE8M0))
    return ref.validate(cache);
  kvx_cache_desc_t local;
  memset(&local, 0, sizeof local);
  memcpy(&local, cache, cache->size);
  if (local.k.dtype == KVX_DTYPE_UE8M0) local.k.dtype = KVX_DTYPE_F8_E4M3; /* the defect */
  if (local.v.dtype == KVX_DTYPE_UE8M0) local.v.dtype = KVX_DTYPE_F8_E4M3;
  return ref.validate(&local);
}
#elif KVX_FRONT_DEFECT == FRONT_HNDP_STRIDE4_UNCHECKED
/* kvx_validate_cache_desc with the stride checks of dims 0 to 3 only: a BLOCK_HND_PACKED tensor's stride[4] is never
 * read (the reference is handed the canonical 1 there). */
static kvx_status_t validate_defect(const kvx_cache_desc_t* cache) {
  if (!cache || cache->size < KVX_V1_1_SIZEOF_CACHE_DESC || cache->size > sizeof(kvx_cache_desc_t))
    return ref.validate(cache);
  kvx_cache_desc_t local;
  memset(&local, 0, sizeof local);
  memcpy(&local, cache, cache->size);
  kvx_tensor_desc_t* sides[2] = {&local.k, &local.v};
  for (int i = 0; i < 2; ++i)
    if (sides[i]->size >= sizeof(kvx_tensor_desc_t) && sides[i]->layout == KVX_LAYOUT_BLOCK_HND_PACKED &&
        sides[i]->ndim == 5)
      sides[i]->stride[4] = 1; /* the defect: the pack stride unchecked */
  return ref.validate(&local);
}
#else
static kvx_status_t validate_defect(const kvx_cache_desc_t* cache) { return ref.validate(cache); }
#endif

KVX_API kvx_status_t kvx_get_version(kvx_version_t* version) {
  return ready() ? ref.version(version) : KVX_STATUS_INTERNAL_ERROR;
}

KVX_API kvx_status_t kvx_validate_cache_desc(const kvx_cache_desc_t* cache) {
  kvx_cache_desc_t local;
  return ready() ? validate_defect(cache_for(cache, &local)) : KVX_STATUS_INTERNAL_ERROR;
}

KVX_API kvx_status_t kvx_write_kv(const kvx_cache_desc_t* cache, const kvx_write_desc_t* desc, void* stream) {
  if (!ready()) return KVX_STATUS_INTERNAL_ERROR;
  kvx_cache_desc_t local;
  cache = cache_for(cache, &local);
  return memo_write(cache, desc) ? KVX_STATUS_OK : write_defect(cache, desc, stream);
}

KVX_API kvx_status_t kvx_gather_kv(const kvx_cache_desc_t* cache, const kvx_gather_desc_t* desc, void* stream) {
  if (!ready()) return KVX_STATUS_INTERNAL_ERROR;
  kvx_cache_desc_t local;
  cache = cache_for(cache, &local);
  return memo_gather(cache, desc) ? KVX_STATUS_OK : gather_defect(cache, desc, stream);
}
