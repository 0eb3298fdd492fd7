"""Default verdicts on independent host providers (csrc/testing/kvx_host_provider.c).

- ``host_ok``: correct on host memory (F16/BF16/F32, NHD and HND with any strides, PACKED and
  RAGGED tables, S32/S64), refuses an IO dtype other than the cache dtype with
  INVALID_ARGUMENT (spec 8 "unsupported field"), no FP4 extension (ABI 1.1). With no claims
  file it is CERTIFIED by a full default run; fp4 / fp4_exact / fp8 read "not served" (fp4_exact,
  the opt-in exact tier, also "not claimed"); the refusals are ``unsupported`` outcomes.
  Claiming ``mixed_io_dtype`` turns them into failures.
- ``host_ignore_strides`` / ``host_ragged_short`` / ``host_late_write`` / ``host_abs_strides``:
  one defect each (spec 4.2 strides, spec 5.1 RAGGED rows, spec 7.2 lifetime, spec 4.2 negative
  strides read as their magnitude); with no claims file each is not certified: the default
  claims cover every profile but the opt-in fp4_exact, so the failing profile blocks.
- ``host_scribble_input`` / ``host_touch_desc``: a write stores into the caller's slots (and
  restores them) or into its const descriptor (the same value): nothing changed is left to
  compare, but the read-only pages of the call fault, a crash of the test.
- ``host_harness_detect``: writes only where the environment names a pytest test or worker;
  the harness hides those from every provider call, so it is seen.
- ``host_memo``: answers a write or gather whose descriptors and slots / table equal one of its
  last 16 calls' OK without work (a benchmark repeats identical calls): the repeated calls of
  ``state.repeated_*``, the caller having rewritten the cache or outputs between them, see it.
- ``fp4_memo`` (csrc/testing/kvx_defect_front.c, FRONT_MEMO): the bundled reference behind a front that
  answers an FP4 call on host memory it has seen (descriptors, slots or table and first row bytes
  hashed) OK without work: ``fp4.state.repeated_*`` see it, and a full default run fails exactly
  those six checks.
- ``front_ragged_scratch`` / ``front_ragged_overread`` / ``front_hnd_sentinel`` (the same front,
  FRONT_RAGGED_SCRATCH / FRONT_RAGGED_OVERREAD / FRONT_HND_SENTINEL): RAGGED gathers through one
  array of block ids every call shares (spec 7.2 threads), RAGGED tables read four elements at a
  time past their counts (R-DATA, R-INPUTS), HND writes of more than 24 tokens that write tokens
  whose slot is a non-negative ``invalid_slot`` (spec 5.2). Each breaks its MUST only in calls the
  suite once never made (RAGGED gathers from threads, a RAGGED table at an inaccessible page, a
  batch-sized write into a layout other than the core one), so each certified: now
  ``concurrency.threads.gather_ragged``, ``inputs.read_within_bounds_ragged`` and
  ``write.prefill_batch_sentinel[hnd-*]`` see it.
- ``front_fp8_batch_nosat`` / ``front_custom_shape`` / ``front_kvo_batch_secondary`` (FRONT_FP8_BATCH_NOSAT,
  FRONT_CUSTOM_SHAPE, FRONT_KVO_BATCH_SECONDARY): E5M2 writes of more than 24 tokens stored unsaturated
  (R-FP8), a CUSTOM tensor's shape never checked (spec 4.2, 7.1), the secondary-pool bit dropped in
  KV_OFFSETS gathers of 16 or more rows (spec 5.1): each certified, since every E5M2 quantizing write
  held at most 24 tokens, no shape test used CUSTOM and every secondary-pool gather at most 4 rows;
  now ``fp8.write.batch[e5m2-*]``, ``validate.shape_mismatch[custom-*]`` and
  ``gather.kv_offsets.secondary_pool_batch`` see it.
- ``front_fp4_dim64`` / ``front_bf16_dim_tail`` / ``front_fp4_global_scratch`` (FRONT_FP4_DIM64,
  FRONT_BF16_DIM_TAIL, FRONT_FP4_GLOBAL_SCRATCH): FP4 gathers of more than 64 dims leave the dims past
  64 unwritten, BF16 gathers of a head_dim no multiple of 32 leave its tail unwritten (spec 4.1,
  R-CACHE), NVFP4 gathers share one array of global scales among calls (spec 7.2): each certified,
  since every FP4 test used 2 heads of 64 dims, the odd head dims only F16 caches and the FP4 thread
  test one shared cache; now ``fp4.geometries``, ``shapes.model_heads_dtypes`` and
  ``concurrency.threads.fp4_gather`` see it.
- ``front_convert_bulk_rtz`` / ``front_fp8_heads_mod8`` / ``front_fp4_bulk_sentinel``: F32 rows truncated into
  F16 / BF16 caches in writes of more than 4096 tokens (R-CONVERT), per-head FP8 scales read from a table
  of 8 in writes of more than 16 tokens and 8 heads (R-FP8), a non-negative ``invalid_slot`` written in FP4
  writes of more than 16 tokens (spec 5.2): each gated just past the sizes the suite used, each certified;
  now ``dtype.write.convert_batch[*-65600]``, ``fp8.write.batch[*-h40_d16]`` and ``fp4.geometries[*-write-*]``
  see it.
- ``front_fp4_nested_size`` / ``front_kvo_bpb_f32`` / ``front_fp8_pack_rule``: validation defects of one dtype
  or struct: the FP4 extension's nested struct sizes unchecked (R-SIZE), ``pool.bytes_per_block`` ignored for
  F32 KV_OFFSETS pools (R-GATHER), the HND_PACKED pack rule skipped for FP8 caches (spec 7.1); each
  certified, since those tests used F16 caches and the extension's own size only; now
  ``fp4.validate.invalid[*_size_*]``, ``gather.validation.kv_offsets_bytes_per_block`` and
  ``validate.hnd_packed_pack_not_dividing_dtypes`` see it.
- ``front_kvo_beam4`` / ``front_hnd_heads64`` / ``front_hnd_wide_blocks`` / ``front_fp8_stride0``: KV_OFFSETS
  gathers of 4 or more beams read beam 0's entries (R-GATHER), HND gathers of more than 64 heads move 64
  (R-CACHE), HND writes into blocks above 128 tokens drop offsets 128 and up (R-WRITE), FP8 PER_HEAD
  scales of ``stride[0]`` 0 read as a broadcast (R-FP8); each certified, since the beam tests stopped at 3,
  more than 64 heads and blocks above 128 ran in NHD only, and every scale descriptor sent stride 1; now
  ``gather.kv_offsets.beams[4|8]``, ``shapes.layouts`` and ``fp8.write.scale_stride_unset`` see it.
- ``front_fp8_hnd_k_from_v`` / ``front_ragged_hndp_ids`` / ``front_hnd_bf16_tail`` / ``front_ragged_s64_lens``:
  one (layout, dtype) or (table, layout) pair broken: HND E4M3 raw gathers fill K from V, RAGGED gathers
  from HND_PACKED caches read one id per block, HND BF16 writes past 128 tokens store whole tiles only,
  RAGGED gathers of 256 or more sequences read S64 lengths as S32; each certified, since the engine-sized
  tests crossed the layouts with F16 only and the RAGGED and FP8 tests ran in the core layout; now the
  ``matrix.*`` tests (every layout with every dtype and table format at engine size) see it.
- ``front_hnd_bf16_rtz`` / ``front_misaligned_hnd_tail`` / ``front_fp8_v_k_scale`` / ``front_kvo_fp8_v_from_k``:
  one pair of a call's parameters broken past 32 tokens or sequences: F32 rows truncated into HND BF16
  caches (R-CONVERT), a misaligned HND cache's row tails not gathered (4.4), V quantized with K's
  PER_TENSOR scale into HND FP8 caches (R-FP8), V read through K's entries in KV_OFFSETS gathers from FP8
  pools (R-GATHER); each certified, since those pairs met only in small calls; now the all-pairs designs
  ``pairwise.write`` / ``pairwise.gather`` see it.
- ``front_nhd_convert_sentinel`` / ``front_hnd_grid16`` / ``front_offset_sum_overflow``: a non-negative
  ``invalid_slot`` written by converting writes of more than 24 tokens into NHD caches, tokens past 65535
  dropped from writes into HND / HND_PACKED caches, a tensor whose farthest offset overflows int64 only as
  a sum of its dims' terms validated OK; each certified, since the sentinel batch wrote same-dtype rows,
  the 65600-token write ran in the core layout and every overflow case overflowed in one term; now
  ``write.prefill_batch_sentinel_convert``, ``write.prefill_batch_65600[hnd*]`` and
  ``validate.field_invalid[*offset_overflow_sum]`` see it.
- ``front_hnd_u32_offset``: element offsets of HND caches of more than 2^32 elements taken in 32 bits
  (R-CACHE); certified while the ``large_cache.*`` tests ran in the core layout (NHD) only; now
  ``large_cache.write_high_slots`` and ``large_cache.gather_high_blocks`` run in NHD and HND.
- ``front_hndp_u32_offset``: the same in HND_PACKED caches (a packed layout's own kernel); certified
  while those two tests ran in NHD and HND only; now in HND_PACKED as well.
- ``front_bulk_bf16_nan``, ``front_bf16_ftz_write``: F32 -> BF16 conversions of more than 4096 rows
  that turn NaNs with low payload bits into inf or +-0 (R-NAN-CLASS), or flush F32 subnormals (R-CONVERT);
  certified while the conversion batches held the quiet NaN and no subnormal that survives BF16
  rounding; now ``dtype.*.convert_batch`` starts with low-payload NaNs and subnormals.
- ``front_s32_sentinel_narrow``: batches of S32 slots compared with ``(int32_t)invalid_slot`` (spec 5.2,
  7): ``write.prefill_batch_sentinel[*-high_bits|*-negative_high]`` (sentinels outside int32).
- ``front_ue8m0_cache``: a UE8M0 K or V dtype validated OK (spec 7): ``validate.field_invalid[*_ue8m0]``.
- ``front_wide_len_batch``: S64 lengths of batches of 16 or more sequences narrowed to int32
  (R-WIDE-IDS): ``gather.decode_batch_wide_indices[*_past_int32|*_low_word_negative]`` and the RAGGED
  and KV_OFFSETS batches' ``lens_s64_past_int32`` cases.
- ``front_fp4_raw_sentinel``, ``front_fp4_raw_pad_zero``: raw FP4 writes that store a non-negative
  ``invalid_slot``, raw FP4 gathers of more than 64 rows that zero their padding rows (R-DATA):
  ``fp4.write.raw_slots``, ``fp4.gather.raw_batch``.
- ``front_fp8_recip_prefill``: FP8 writes of more than 1024 tokens by a reciprocal multiply (R-FP8):
  ``fp8.write.division_not_reciprocal_batch``.
- ``front_plan_addr_gather``, ``front_plan_addr_dtype``: a plan per cache address (spec 7.2, R-STATE),
  kept by the gather path (the layout first seen with the pointers) or by converting writes (the
  dtype); certified while only writes were made through one pair of buffers described as NHD and
  HND: ``state.cache_layout_per_call_gather``, ``state.cache_dtype_per_call``.
- ``front_one_buffer_bulk``: writes of more than 64 tokens whose key and value are one buffer store the
  K cache only (R-WRITE): ``inputs.write.key_value_one_buffer_batch`` (the 11-token
  ``inputs.write.key_value_one_buffer`` passes it).
- ``front_one_buffer_fp8``: FP8 writes from one buffer quantized once, with K's scales, stored in both
  caches (R-FP8): ``fp8.write.key_value_one_buffer``.
- ``front_kvo_u32_bytes``: KV_OFFSETS gathers from pools of 1- or 4-byte elements with byte offsets in
  32 bits (spec 5.1, R-DATA): ``large_cache.kv_offsets_high_indices[e4m3]``, ``[f32]`` (its F16 case
  passes it).
- ``front_decode_bf16_nan``: one-token F32 -> BF16 writes rounded by the bit trick with no NaN case
  (R-NAN-CLASS): ``dtype.write.convert_single_token[cache_bf16-io_f32]``, which now starts its data
  with the batch conversions' low-payload NaNs and subnormals.
- ``front_kv_out_strides_batch``, ``front_kv_out_dtypes_batch``: PACKED / RAGGED gathers of 32 or more
  sequences that write the value output through the key output's strides, or convert it to the key output's
  dtype (F16 beside BF16) (spec 4.2, 6.8; R-IO, R-CONVERT); certified while every engine-sized gather gave
  its two outputs one layout and one dtype: ``gather.kv_out_strides_batch``,
  ``dtype.gather.kv_out_dtypes_batch`` (260 sequences; ``gather.kv_out_strides`` and
  ``dtype.gather.kv_out_dtypes`` gather 2).
- ``front_fp8_scalar_batch``: FP8 writes of more than 24 tokens that take a scalar (ndim 0) PER_TENSOR scale
  descriptor for none, quantizing by the pointer or 1.0 (R-FP8); certified while every write through a
  scalar descriptor held at most 24 tokens or set the pointer to the same value:
  ``fp8.write.scalar_scale_batch`` (300 tokens).
- ``front_msl_table_batch``: gathers of 16 or more sequences whose max_seq_len needs more table entries than
  ``max_blocks_per_seq`` answered OUT_OF_RANGE though every sequence's ``min(L, max_seq_len)`` fits its row
  (spec 6.10, R-DATA); certified while every engine-sized gather sized its table by max_seq_len:
  ``gather.packed.max_seq_len_past_table`` (320 sequences, max_seq_len 13 and 64 beside rows of 12 tokens).
- ``front_fp8_neg_zero_batch``: FP8 writes of more than 24 tokens from F32 / BF16 rows that store -0.0 as +0
  (the sign taken from ``x < 0``; R-FP8, docs/numerics.md: +-0); certified while the batch writes held exact
  -0.0 only in F16 rows (tiny values underflowing): ``fp8.write.batch``, whose special values now include
  +-0.0.
- ``front_hnd_bs_mask_batch``, ``front_hnd_bs_mask_gather``: writes of more than 24 tokens, and PACKED gathers
  of 16 or more sequences, on BLOCK_HND caches whose block_size is no power of two that take the block offset
  as ``slot & (block_size - 1)`` (spec 4.1, 7.1); certified while the non-power-of-two block tests ran in the
  core layout alone and the other layouts' calls in such blocks held 24 tokens or 2 sequences:
  ``write.slots.block_size_non_pow2_layouts``, ``gather.packed.block_size_non_pow2_layouts`` (NHD, HND and
  HND_PACKED; blocks of 48 and 528).
- ``front_fp8_k_head_v_tensor_batch``: FP8 writes of more than 24 tokens whose K scale descriptor is PER_HEAD
  beside a PER_TENSOR V descriptor read V's scale per head from a staging buffer of V's value and K's values
  (spec 6.6, 6.9; R-FP8); certified while that pair of granularities was written 10 tokens at a time only:
  ``fp8.write.scales_batch`` (300 tokens, 4 heads).
- ``front_ragged_bs_mask_batch``: RAGGED gathers of 16 or more sequences from caches whose block_size is no
  power of two that take the block offset as ``t & (block_size - 1)`` (spec 5.1, 7.1); certified while every
  RAGGED gather but the generated draws used blocks of 4 or 16: ``gather.ragged.block_size_non_pow2_batch``
  (20 sequences, blocks of 48 and 528).
- ``front_s32_len_unsigned_batch``: gathers of 16 or more sequences that take S32 lengths as uint32 (``min(L,
  max_seq_len)`` against the uint32 ``max_seq_len``), so a negative length gathers max_seq_len tokens and the call
  answers OK (spec 5.3; R-DATA: INVALID_ARGUMENT); certified while every call with a negative length held 1 to 3
  sequences: ``gather.packed.negative_seq_len_batch`` (20 sequences, -1 and INT32_MIN).
- ``front_ragged_range_batch``: RAGGED gathers of 16 or more sequences that bound each sequence's tokens by
  ``indices_count`` alone, so a sequence whose range holds fewer ids than ``min(L, max_seq_len)`` gathers the next
  ranges' ids (spec 5.1; R-DATA); certified while every short range sat in a call of 1 to 4 sequences:
  ``gather.ragged.short_range_batch_no_oob`` (20 sequences, two ranges 3 ids short).
- ``front_fp8_ptr_over_head_batch``: FP8 writes of more than 24 tokens that quantize by the flat ``k_scale`` /
  ``v_scale`` pointer where it sits beside a PER_HEAD descriptor (spec 6.9, R-FP8); certified while the
  pointers sat beside PER_HEAD descriptors in writes of at most 10 tokens: ``fp8.write.scales_batch``.
- ``front_fp8_stride0_batch``: ``front_fp8_stride0``'s broadcast of head 0's scale for a PER_HEAD descriptor whose
  ``stride[0]`` is 0, in FP8 writes of more than 24 tokens only (R-FP8); certified while ``stride[0]`` 0 was
  written 12 tokens at a time only (``fp8.write.scale_stride_unset``): ``fp8.write.scales_batch``.
- ``front_s32_grid16``: writes with S32 slots of more than 65535 tokens that store tokens 0 to 65535 only (spec
  7, 5.2), beside a refusal of writes of more than 2^22 tokens (R-LARGE allows it); certified while the only
  S32-slot writes past 65535 tokens were ``large_cache.write_input_rows_past_2_31``'s, which that refusal
  excuses: ``write.prefill_batch_65600_s32``.
- ``front_float_slot``: writes into caches of at most 2^31 elements that carry slots of 2^24 and more through
  float32 (spec 4.1: integer arithmetic), beside a refusal of caches of more than 2^31 elements (R-LARGE allows
  it); certified while the only caches past 2^24 slots were the ``large_cache`` tests' 8 GiB ones, which that
  refusal excuses: ``write.wide_cache_high_slots`` (2 GiB, required).
- ``front_s64_slot_low32_batch``: writes of more than 24 tokens with S64 slots that test each slot against 0 and
  ``invalid_slot`` in 64 bits, then bound and address its low 32 bits, so an out-of-range slot of 2^32 + 3 is
  written to slot 3 (spec 5.2, 7: never written; R-WIDE-IDS); certified while the writes with out-of-range slots
  held 7 tokens and the batches' S64 slots past 2^32 were their ``invalid_slot``:
  ``write.slots.out_of_range_batch[s64_wide-*]`` (300 and 4096 tokens).
- ``front_hndp_stride4_unchecked``: ``kvx_validate_cache_desc`` checks the strides of dims 0 to 3 only, so an
  HND_PACKED K or V tensor whose pack stride (``stride[4]``) is 0 on a pack above 1 or overflows int64 validates
  OK (spec 4.2, 7; R-CACHE); certified while the explicit stride cases used 4-D tensors and the default run's
  draws broke no pack stride: ``validate.hnd_packed_pack_stride``.
- ``front_prefill_row_stride``: writes of more than 1024 tokens that read a key or value input whose token rows are
  contiguous (heads ``head_dim`` apart) but further apart than ``H * head_dim`` (a view of a fused QKV projection's
  rows) as dense rows, the token stride unread (spec 4.2 MUST honor strides, 6.8; R-IO); certified while every write
  from strided inputs held at most a few hundred tokens: ``write.prefill_strided_io[*qkv_view]`` (4096 tokens).
- ``front_gather_4d_seq_dense``: serves 4-D gather outputs of dense rows whose sequence stride holds more than
  ``max_seq_len`` rows (the reference refuses them), correctly for fewer than 16 sequences and with sequence s at
  ``s * max_seq_len`` rows for 16 or more (spec 4.2, 6.8, 6.10; R-IO); certified while every such output held 3
  sequences: ``gather.packed.output_4d_sequence_stride_batch`` (40 and 260 sequences).
- ``front_plan_addr_same_dtype``: refuses converting writes (``mixed_io_dtype``), and its copies keep a plan per cache
  allocation (the K / V dtypes first seen with a pair of cache pointers and as many bytes), so F32 rows written into
  an allocation first written as F16 are stored as F16 (spec 7.2, 4.3; R-STATE); certified while the only test that
  handed one allocation to another dtype converted (``state.cache_dtype_per_call``), which that refusal excuses:
  ``state.cache_dtype_per_call_copy`` (F16, then F32 of half the dims, then F16, rows of the cache's dtype).
- ``front_wide_dtype_grid16``: refuses converting writes, and writes of more than 65535 tokens into BF16 or F32
  caches store tokens 0 to 65535 only (spec 7, 5.2); certified while the only writes past 65535 tokens into such
  caches were ``dtype.write.convert_batch[*-65600]``'s, which that refusal excuses:
  ``write.prefill_batch_65600_dtypes`` (65600 tokens, BF16 and F32 caches and rows).
- ``front_packed_id_wrap_batch``: PACKED gathers of 16 or more sequences that never bound a block id, reading an id
  outside ``[0, num_blocks)`` as block ``(uint64_t)id % num_blocks`` and answering OK (a read past the cache on a
  real provider; spec 5.1, 8; R-DATA); certified while every PACKED gather with such an id held at most 4 sequences:
  ``gather.packed.bad_block_id_batch_no_oob`` (20 and 260 sequences, four bad S32 or S64 ids among good ones).
- ``front_kvo_secondary_null_batch``: KV_OFFSETS gathers of 16 or more (sequence, beam) rows with no secondary pool
  that read a secondary-bit entry from the primary pool, bit 31 dropped, answering OK (spec 5.1, 10; R-DATA: never
  dereferenced); certified while every unusable entry sat in a call of at most 4 sequences:
  ``gather.kv_offsets.unusable_entry_batch_no_oob`` (20 sequences x 2 beams, 260 x 1).
- ``front_fp8_gather_satfinite``: raw FP8 gathers of 16 or more (sequence, beam) rows that move each code through F32
  and back by a saturating conversion, so E5M2's +-inf become +-57344 and every NaN byte 0x7F (spec 4.3; R-CONVERT:
  a raw copy; R-NAN-CLASS); certified while every FP8 gather read caches of finite values:
  ``fp8.gather.raw_every_byte`` (3 and 260 sequences from caches holding every byte value).
- ``front_fp4_raw_scale_rows``: raw FP4 writes (F4_E2M1 IO) of more than 64 tokens that read the block scale inputs
  (``desc.fp4``) as dense ``[tokens, H, D/B]`` rows whatever their strides, so padded scale rows or heads are stored
  from the wrong bytes (spec 4.2, 6.8; R-IO, R-FP4); certified while every FP4 write read dense inputs:
  ``fp4.write.strided_io[*-raw-*-300tok]`` (padded scale rows alone, or padded code and scale rows and heads; its
  20-token cases pass it).
- ``front_prefill_bs256``: writes of more than 24 tokens into caches whose block_size is a power of two above 256
  that store no token at a block offset of 256 or more (a prefill kernel's tile of 256 block offsets; spec 4.1;
  R-WRITE); certified while the only blocks past 256 tokens were of 528, no power of two:
  ``shapes.prefill_wide_blocks`` (``block_size`` + 300 tokens into blocks of 512, 1024 and 2048 in NHD, HND and
  HND_PACKED; its case of 768 passes it).
- ``front_fp8_v_head_shape_batch``: writes of more than 24 tokens into an FP8 V cache that check the PER_HEAD shape of
  ``k_scale_desc`` alone, so a PER_HEAD ``v_scale_desc`` of another ``ndim`` or shape answers OK (spec 6.6, 6.9, 7;
  R-FP8: "Same for V"); certified while the catalog's R-FP8 rules drew K's side and every generated invalid write
  held 24 tokens at most: ``fp8.write.scale_desc_invalid`` (either side malformed, 10 and 300 tokens; its K cases
  and 10-token cases pass it).
- ``host_late_write_slow``: the late writer 1.5 s after the return, past the lifetime test's
  wait: the quarantine of freed buffers sees it while later tests run, and the run-wide
  record fails.
- ``indep`` (csrc/testing/indep/kvx_indep_provider.c, ABI 1.2): written from the spec and the
  readings alone, it serves every feature a valid call can ask for (HND_PACKED, CUSTOM,
  KV_OFFSETS with a secondary pool, negative strides, every FP8 scale kind, the FP4 extension
  in all three formats, raw and quantizing). With every optional feature it serves claimed, and the
  opt-in exact FP4 tier (csrc/testing/indep/kvx-claims.json) a full run CERTIFIES every profile, so no test can
  hold a choice the documents leave open to the bundled reference's answer.
- ``contra`` (csrc/testing/contra/kvx_contra_provider.c, ABI 1.2.7): correct, but wherever the
  spec and the readings leave a choice open it takes the other one than the reference: HND its
  only core layout while kvx_validate_cache_desc accepts NHD, refusals as INVALID_ARGUMENT (KV_OFFSETS,
  large caches, the k_scale / v_scale pointer fallback), data errors answered after the valid
  part is written, INVALID_ARGUMENT for bad block ids, the first of duplicate slots, other NaN
  encodings, FP4 Inf blocks stored as NaN blocks. With what it serves claimed, and the exact FP4
  tier (csrc/testing/contra/kvx-claims.json) a full run CERTIFIES with no failure at any level.

Every run here passes ``--reruns 0`` (:data:`NO_RERUNS`). A re-run never changes a verdict
(attempts that disagree read ``flaky``, which blocks or warns exactly as ``fail`` does:
results/record.py BLOCKING, WARNING), and each defect is deterministic (C code, no timing but
the late writers', which the lifetime test waits 1.2 s for and the quarantine backs up), so a
re-run would change no outcome asserted here and cost a worker start per attempt; re-runs
themselves are tested in test_hostile_habits.py and test_device_faults.py. The runs of a few
selected tests use one worker (:func:`_run` ``workers``): a second would only collect the
suite once more.
"""
from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kvx_conformance.abi import native

FULL_RUN_BUDGET_S = 240  # a full default run of host_ok takes about 20 s on 2 loaded cores
#: deterministic defects: one attempt decides (kvx_conformance.harness.mutants.cli_run does the same)
NO_RERUNS = ("--reruns", "0")


def _kvx() -> list[str]:
    script = Path(sys.executable).with_name("kvx-conform")
    return [str(script)] if script.exists() else [sys.executable, "-m", "kvx_conformance.cli"]


def _lib(variant: str) -> str:
    front = variant.startswith(("fp4_", "front_"))  # the bundled reference behind a front (kvx_defect_front.c)
    path = native.testing_provider(variant if front or variant in ("indep", "contra") else f"host_{variant}")
    if not path.exists():
        pytest.fail(f"{path} is not built: the package build (csrc/testing) must produce it")
    return str(path)


def _run(variant: str, out: Path, *args: str, workers: int = 2) -> tuple[subprocess.CompletedProcess, dict, float]:
    t0 = time.monotonic()
    p = subprocess.run([*_kvx(), "run", _lib(variant), "--output-dir", str(out), "-n", str(workers), "--progress",
                        "none", *args], capture_output=True, text=True, timeout=600)
    elapsed = time.monotonic() - t0
    assert (out / "results.json").exists(), f"exit {p.returncode}\n{p.stdout[-3000:]}\n{p.stderr[-2000:]}"
    return p, json.loads((out / "results.json").read_text(encoding="utf-8")), elapsed


def _explain(p: subprocess.CompletedProcess) -> str:
    return f"exit {p.returncode}\n--- stdout (tail)\n{p.stdout[-4000:]}\n--- stderr (tail)\n{p.stderr[-2000:]}"


def test_correct_host_provider_certified_with_no_claims(tmp_path):
    """The full default run (no claims file, no selection): CERTIFIED, nothing required fails
    because of a refusal, and the profiles it does not serve say so everywhere. No re-runs: they
    could not change the verdict, and would run any test that did not pass three more times, each
    pass a fresh pair of workers."""
    p, doc, elapsed = _run("ok", tmp_path / "ok", *NO_RERUNS)
    print(f"full default run of host_ok: {elapsed:.1f} s, {len(doc['tests'])} tests")
    assert p.returncode == 0, _explain(p)
    assert doc["verdict"] == "certified" and doc["certifying"] and doc["claimed_profiles_certified"]
    assert elapsed < FULL_RUN_BUDGET_S, f"the full default run took {elapsed:.0f} s"
    # the default claims: every profile but the opt-in exact FP4 tier, whose verdict is reported
    assert set(doc["claims"]["profiles"]) == set(doc["profiles"]) - {"fp4_exact"} and not doc["claims"]["explicit"]
    assert not doc["profiles"]["fp4_exact"]["claimed"]
    assert doc["provider"]["abi_version"].startswith("1.1"), doc["provider"]["abi_version"]
    required_bad = [t["id"] for t in doc["tests"] if t["level"] == "required"
                    and t["outcome"] in ("fail", "crash", "timeout", "error")]
    assert not required_bad, required_bad
    for prof in ("fp4", "fp4_exact", "fp8"):
        assert doc["profiles"][prof]["verdict"] == "not served", (prof, doc["profiles"][prof])
        assert not doc["profiles"][prof]["served"]
    for prof in ("core", "layouts", "tables", "robustness", "concurrency", "generated", "engines"):
        assert doc["profiles"][prof]["verdict"] == "certified", (prof, doc["profiles"][prof])
    assert set(doc["not_served"]) == {"fp4", "fp4_exact", "fp8"} and doc["not_claimed"] == ["fp4_exact"]
    by_id = {t["id"]: t for t in doc["tests"]}
    refused = [i for i, t in by_id.items() if t["refusal"] == "INVALID_ARGUMENT"]
    for tid in ("dtype.write.convert[cache_f16-io_f32]", "dtype.gather.convert[cache_bf16-io_f16]",
                "dtype.write.rounding_ties[bf16]", "layout.mixed_k_v.io_convert[write-nhd_k_hnd_v]"):
        assert by_id[tid]["outcome"] == "unsupported" and tid in refused, by_id[tid]
    # the same layouts without a conversion are served and pass
    assert by_id["layout.mixed_k_v[write-nhd_k_hnd_v]"]["outcome"] == "pass"
    # negative strides, which the bundled reference refuses, are served and held to the oracle
    neg = {i: t["outcome"] for i, t in by_id.items() if i.startswith("layout.negative_strides[")}
    assert len(neg) == 12 and set(neg.values()) == {"pass"}, neg
    for rule in ("R-CACHE.stride_negative", "R-IO.stride_negative"):
        assert by_id[f"validation.rule[{rule}]"]["outcome"] == "pass", by_id[f"validation.rule[{rule}]"]
    assert "lifetime.freed_buffers_untouched" not in by_id
    cert = json.loads((tmp_path / "ok" / "certificate.json").read_text(encoding="utf-8"))
    assert cert["verdict"] == "certified" and set(cert["not_served_profiles"]) == {"fp4", "fp4_exact", "fp8"}
    assert cert["profiles"]["fp4"]["verdict"] == "not served"
    assert "not served: fp8, fp4, fp4_exact" in p.stdout, p.stdout[-2000:]
    report = (tmp_path / "ok" / "report.html").read_text(encoding="utf-8")
    assert 'id="not-served"' in report and "not served" in report


def _run_with_claims(name: str, unclaimed: set, tmp_path: Path):
    """One full run of the testing provider ``name`` (no re-runs) with its claims file
    (csrc/testing/<name>/kvx-claims.json), which must claim every optional feature but
    ``unclaimed`` and the opt-in exact FP4 tier (``opt_in: [fp4_exact]``, so every profile):
    CERTIFIED, certifying, every profile claimed and certified, within the budget. Returns the
    run's results document."""
    from kvx_conformance.results.outcomes import OPTIONAL_FEATURES

    claims_file = Path(__file__).resolve().parents[1] / "csrc" / "testing" / name / "kvx-claims.json"
    claims = json.loads(claims_file.read_text(encoding="utf-8"))
    claimed = set(claims["features"])
    assert claimed == set(OPTIONAL_FEATURES) - unclaimed, claimed ^ (set(OPTIONAL_FEATURES) - unclaimed)
    assert claims.get("opt_in") == ["fp4_exact"] and "profiles" not in claims, claims
    p, doc, elapsed = _run(name, tmp_path / name, "--claims", str(claims_file), *NO_RERUNS)
    print(f"full run of {name}, its features claimed: {elapsed:.1f} s, {len(doc['tests'])} tests")
    assert p.returncode == 0, _explain(p)
    assert doc["verdict"] == "certified" and doc["certifying"] and doc["claimed_profiles_certified"]
    assert elapsed < FULL_RUN_BUDGET_S, f"the full run took {elapsed:.0f} s"
    assert set(doc["claims"]["features"]) == claimed
    assert doc["not_claimed"] == [] and not doc["claims"]["explicit"]
    for prof, rec in doc["profiles"].items():
        assert rec["verdict"] == "certified" and rec["served"] and rec["claimed"], (prof, rec)
    bad = {t["id"]: t["outcome"] for t in doc["tests"] if t["outcome"] not in ("pass", "skip", "unsupported")}
    assert not bad, bad
    return doc


#: the features the independent provider refuses on purpose (kvx-claims.json "notes")
INDEP_UNCLAIMED = {"device_memory", "unified_memory", "multi_device", "nonzero_tail"}


def test_independent_provider_certified_with_every_feature_claimed(tmp_path):
    """One full run of ``indep`` with every feature it serves claimed: CERTIFIED in every
    profile (fp8, fp4 and fp4_exact included), no test fails at any level, and the only
    refusals are the size probes of a non-zero unknown tail (spec 3), the one optional feature
    it does not claim that a host run reaches."""
    doc = _run_with_claims("indep", INDEP_UNCLAIMED, tmp_path)
    assert doc["provider"]["abi_version"].startswith("1.2"), doc["provider"]["abi_version"]
    assert doc["not_served"] == [] and doc["not_claimed"] == []
    refused = {t["id"] for t in doc["tests"] if t["outcome"] == "unsupported"}
    assert refused and all(i.startswith("size.larger_nonzero_tail[") for i in refused), refused
    skipped = [t for t in doc["tests"] if t["outcome"] == "skip"]
    assert all(t["level"] == "informational" for t in skipped), skipped  # engine cases KVX cannot express


#: what the contrarian provider refuses on purpose (kvx-claims.json "notes")
CONTRA_UNCLAIMED = {"nhd", "kv_offsets", "secondary_pool", "large_cache", "device_memory", "unified_memory",
                    "multi_device"}


def test_contrarian_provider_certified_with_what_it_serves_claimed(tmp_path):
    """One full run of ``contra`` with what it serves claimed: CERTIFIED, every claimed profile
    certified, no test fails at any level (a warning or an informational fail included). Each of
    its choices is one the spec or the readings leave open (docs/spec-readings.md): a test that
    holds such a choice to the reference's answer fails here. Its refusals are of the features it
    does not claim; the informational pointer-fallback test is skipped (it declines that MAY)."""
    doc = _run_with_claims("contra", CONTRA_UNCLAIMED, tmp_path)
    assert doc["provider"]["abi_version"] == "1.2.7", doc["provider"]["abi_version"]
    assert not doc.get("warnings"), doc.get("warnings")
    for t in doc["tests"]:
        if t["outcome"] == "unsupported":  # excused only by a feature it does not claim
            assert set(t["message"].split("(", 1)[1].split(")", 1)[0].split(", ")) <= CONTRA_UNCLAIMED, t
    skipped = {t["id"] for t in doc["tests"] if t["outcome"] == "skip" and t["level"] != "informational"}
    assert not skipped, skipped
    by_id = {t["id"]: t for t in doc["tests"]}
    for dt in ("e4m3", "e5m2"):  # the MAY fallback declined by a refusal: skipped, not failed
        rec = by_id[f"fp8.write.scale_pointer_fallback[{dt}]"]
        assert rec["outcome"] == "skip" and "declined" in rec["message"], rec



def test_claiming_mixed_io_dtype_turns_refusals_into_failures(tmp_path):
    claims = tmp_path / "claims.json"
    claims.write_text(json.dumps({"features": ["mixed_io_dtype"]}))
    p, doc, _ = _run("ok", tmp_path / "claimed", "--claims", str(claims), "--id", "dtype.*.convert*",
                     "--id", "dtype.write.rounding_ties*", *NO_RERUNS, workers=1)
    assert p.returncode == 1, _explain(p)
    assert doc["tests"] and {t["outcome"] for t in doc["tests"]} == {"fail"}, _explain(p)
    for t in doc["tests"]:
        assert "claimed feature mixed_io_dtype answered INVALID_ARGUMENT" in t["message"], t["message"]
    assert doc["profiles"]["core"]["verdict"] == "not certified"


@pytest.mark.parametrize("variant,ids,profile", [
    ("ignore_strides", ["layout.padded_rows*", "layout.transposed*"], "layouts"),
    ("ragged_short", ["gather.ragged.*"], "tables"),
    ("late_write", ["lifetime.*"], "concurrency"),
    ("abs_strides", ["layout.negative_strides*"], "layouts"),
    ("scribble_input", ["inputs.write.*"], "core"),
    ("touch_desc", ["inputs.write.*"], "core"),
    ("harness_detect", ["write.slots.valid*"], "core"),
    ("memo", ["state.repeated_*"], "core"),
    ("fp4_memo", ["fp4.state.repeated_*"], "fp4"),
    ("front_ragged_scratch", ["concurrency.threads.gather_ragged"], "concurrency"),
    ("front_ragged_overread", ["inputs.read_within_bounds_ragged*"], "tables"),
    ("front_hnd_sentinel", ["write.prefill_batch_sentinel*"], "core"),
    ("front_fp8_batch_nosat", ["fp8.write.batch*"], "fp8"),
    ("front_custom_shape", ["validate.shape_mismatch*"], "core"),
    ("front_kvo_batch_secondary", ["gather.kv_offsets.secondary_pool_batch*"], "tables"),
    ("front_fp4_dim64", ["fp4.geometries*"], "fp4"),
    ("front_bf16_dim_tail", ["shapes.model_heads_dtypes*"], "core"),
    ("front_fp4_global_scratch", ["concurrency.threads.fp4_gather*"], "fp4"),
    ("front_convert_bulk_rtz", ["dtype.write.convert_batch*"], "core"),
    ("front_fp8_heads_mod8", ["fp8.write.batch*"], "fp8"),
    ("front_fp4_bulk_sentinel", ["fp4.geometries*"], "fp4"),
    ("front_fp4_nested_size", ["fp4.validate.invalid*"], "fp4"),
    ("front_kvo_bpb_f32", ["gather.validation.kv_offsets_bytes_per_block*"], "tables"),
    ("front_fp8_pack_rule", ["validate.hnd_packed_pack_not_dividing_dtypes*"], "core"),
    ("front_kvo_beam4", ["gather.kv_offsets.beams*"], "tables"),
    ("front_hnd_heads64", ["shapes.layouts*"], "core"),
    ("front_hnd_wide_blocks", ["shapes.layouts*"], "core"),
    ("front_fp8_stride0", ["fp8.write.scale_stride_unset*"], "fp8"),
    ("front_fp8_hnd_k_from_v", ["matrix.fp8.gather*"], "fp8"),
    ("front_ragged_hndp_ids", ["matrix.ragged.gather*"], "tables"),
    ("front_hnd_bf16_tail", ["matrix.write*"], "core"),
    ("front_ragged_s64_lens", ["matrix.ragged.gather*"], "tables"),
    ("front_hnd_bf16_rtz", ["pairwise.write"], "generated"),
    ("front_misaligned_hnd_tail", ["pairwise.gather"], "generated"),
    ("front_fp8_v_k_scale", ["pairwise.write"], "generated"),
    ("front_kvo_fp8_v_from_k", ["pairwise.gather"], "generated"),
    ("front_nhd_convert_sentinel", ["write.prefill_batch_sentinel_convert*"], "core"),
    ("front_hnd_grid16", ["write.prefill_batch_65600*"], "core"),
    ("front_offset_sum_overflow", ["validate.field_invalid*"], "core"),
    ("front_hnd_u32_offset", ["large_cache.write_high_slots*", "large_cache.gather_high_blocks*"], "robustness"),
    ("front_hndp_u32_offset", ["large_cache.write_high_slots*", "large_cache.gather_high_blocks*"], "robustness"),
    ("front_bulk_bf16_nan", ["dtype.write.convert_batch*", "dtype.gather.convert_batch*"], "core"),
    ("front_bf16_ftz_write", ["dtype.write.convert_batch*"], "core"),
    ("front_s32_sentinel_narrow", ["write.prefill_batch_sentinel[*"], "core"),
    ("front_ue8m0_cache", ["validate.field_invalid*"], "core"),
    ("front_wide_len_batch", ["gather.decode_batch_wide_indices*", "gather.ragged.decode_batch*"], "core"),
    ("front_fp4_raw_sentinel", ["fp4.write.raw_slots*"], "fp4"),
    ("front_fp4_raw_pad_zero", ["fp4.gather.raw_batch*"], "fp4"),
    ("front_fp8_recip_prefill", ["fp8.write.division_not_reciprocal_batch*"], "fp8"),
    ("front_plan_addr_gather", ["state.cache_layout_per_call_gather"], "core"),
    ("front_plan_addr_dtype", ["state.cache_dtype_per_call"], "core"),
    ("front_one_buffer_bulk", ["inputs.write.key_value_one_buffer_batch*"], "core"),
    ("front_one_buffer_fp8", ["fp8.write.key_value_one_buffer*"], "fp8"),
    ("front_decode_bf16_nan", ["dtype.write.convert_single_token*"], "core"),
    ("front_kvo_u32_bytes", ["large_cache.kv_offsets_high_indices*"], "robustness"),
    ("front_kv_out_strides_batch", ["gather.kv_out_strides_batch*"], "layouts"),
    ("front_kv_out_dtypes_batch", ["dtype.gather.kv_out_dtypes_batch*"], "core"),
    ("front_fp8_scalar_batch", ["fp8.write.scalar_scale_batch*"], "fp8"),
    ("front_msl_table_batch", ["gather.packed.max_seq_len_past_table*"], "core"),
    ("front_fp8_neg_zero_batch", ["fp8.write.batch*"], "fp8"),
    ("front_hnd_bs_mask_batch", ["write.slots.block_size_non_pow2_layouts*"], "core"),
    ("front_hnd_bs_mask_gather", ["gather.packed.block_size_non_pow2_layouts*"], "core"),
    ("front_fp8_k_head_v_tensor_batch", ["fp8.write.scales_batch*"], "fp8"),
    ("front_ragged_bs_mask_batch", ["gather.ragged.block_size_non_pow2_batch*"], "tables"),
    ("front_fp8_ptr_over_head_batch", ["fp8.write.scales_batch*"], "fp8"),
    ("front_fp8_stride0_batch", ["fp8.write.scales_batch*"], "fp8"),
    ("front_s32_grid16", ["write.prefill_batch_65600*"], "core"),
    ("front_s32_len_unsigned_batch", ["gather.packed.negative_seq_len_batch*"], "core"),
    ("front_ragged_range_batch", ["gather.ragged.short_range_batch_no_oob*"], "tables"),
    ("front_float_slot", ["write.wide_cache_high_slots*"], "core"),
    ("front_s64_slot_low32_batch", ["write.slots.out_of_range_batch*"], "core"),
    ("front_hndp_stride4_unchecked", ["validate.hnd_packed_pack_stride*"], "core"),
    ("front_prefill_row_stride", ["write.prefill_strided_io*"], "layouts"),
    ("front_gather_4d_seq_dense", ["gather.packed.output_4d_sequence_stride_batch*"], "core"),
    ("front_plan_addr_same_dtype", ["state.cache_dtype_per_call_copy*"], "core"),
    ("front_wide_dtype_grid16", ["write.prefill_batch_65600_dtypes*"], "core"),
    ("front_packed_id_wrap_batch", ["gather.packed.bad_block_id_batch_no_oob*"], "core"),
    ("front_kvo_secondary_null_batch", ["gather.kv_offsets.unusable_entry_batch_no_oob*"], "tables"),
    ("front_fp8_gather_satfinite", ["fp8.gather.raw_every_byte*"], "fp8"),
    ("front_fp4_raw_scale_rows", ["fp4.write.strided_io*"], "fp4"),
    ("front_prefill_bs256", ["shapes.prefill_wide_blocks*"], "core"),
    ("front_fp8_v_head_shape_batch", ["fp8.write.scale_desc_invalid*"], "fp8"),
])
def test_defect_not_certified_with_no_claims(tmp_path, variant, ids, profile):
    """With no claims file the profile that holds the broken MUST is claimed: its failure
    blocks (exit 1), though the run selects only that profile's catching tests."""
    sel = [a for i in ids for a in ("--id", i)]
    p, doc, _ = _run(variant, tmp_path / variant, *sel, *NO_RERUNS, workers=1)
    assert p.returncode == 1, _explain(p)
    assert not doc["claims"]["explicit"] and profile in doc["claims"]["profiles"]
    assert doc["profiles"][profile]["verdict"] == "not certified", doc["profiles"][profile]
    assert doc["profiles"][profile]["blocking"], doc["profiles"][profile]
    assert not doc["claimed_profiles_certified"]
    # caught by a verdict on the defect, not by a front that hangs (a timeout would block as well)
    assert not [t["id"] for t in doc["tests"] if t["outcome"] == "timeout"], _explain(p)
    if variant in ("scribble_input", "touch_desc"):
        # a store into an input or a descriptor, undone or changing nothing: only the read-only
        # pages of the call see it, and the crash says so
        crashed = [t for t in doc["tests"] if t["outcome"] == "crash"]
        assert crashed and all("read-only while it runs" in t["message"] for t in crashed), _explain(p)
        assert all(t["crash"]["entry"] == "kvx_write_kv" for t in crashed), crashed


def test_late_writer_past_the_lifetime_wait_not_certified(tmp_path):
    """Writes 1.5 s after each return land in buffers the harness has freed while later tests
    run (or after the last one, watched as long at the end of a run that can certify): the
    run-wide record fails in the profile of the test whose buffer was written, naming it."""
    p, doc, _ = _run("late_write_slow", tmp_path / "slow", "--profile", "layouts", *NO_RERUNS)
    assert p.returncode == 1, _explain(p)
    rec = next((t for t in doc["tests"] if t["id"] == "lifetime.freed_buffers_untouched"), None)
    assert rec is not None, _explain(p)
    assert rec["outcome"] == "fail" and rec["level"] == "required" and rec["profile"] == "layouts", rec
    assert "spec 7.2" in rec["clause"] and "freed" in rec["message"] and rec["repro"].startswith("kvx-conform run")
    assert doc["profiles"]["layouts"]["verdict"] == "not certified"
    assert any(w["where"] == "later-test" for w in doc["late_writes"])


def test_explicit_narrow_claim_names_the_profiles_not_claimed(tmp_path):
    """A claims file naming core only: the ignore-strides defect then certifies for core, and
    the console, results, certificate and report name every profile not claimed."""
    claims = tmp_path / "claims.json"
    claims.write_text(json.dumps({"profiles": ["core"]}))
    p, doc, _ = _run("ok", tmp_path / "narrow", "--claims", str(claims), "--id", "version.*", *NO_RERUNS, workers=1)
    assert doc["claims"]["explicit"] and doc["claims"]["profiles"] == ["core"]
    assert "layouts" in doc["not_claimed"] and "core" not in doc["not_claimed"]
    # each profile not claimed with its own verdict, which the run's does not depend on
    assert "== not claimed (reported, not part of this run's verdict): layouts not run" in p.stdout, p.stdout[-2000:]
    cert = json.loads((tmp_path / "narrow" / "certificate.json").read_text(encoding="utf-8"))
    assert "layouts" in cert["not_claimed_profiles"] and cert["claims_explicit"]
    assert 'id="not-claimed"' in (tmp_path / "narrow" / "report.html").read_text(encoding="utf-8")


def test_invalid_argument_refusal_of_strides_is_a_recommended_warning():
    """Spec 4.2 / 4.4 say the refusal SHOULD be UNSUPPORTED: refused with INVALID_ARGUMENT the
    test is still ``unsupported`` (accepted) but the warning shows in the profile and the run."""
    from kvx_conformance.results.claims import Claims
    from kvx_conformance.harness.plugin import refusal_warning
    from kvx_conformance.results.record import TestRecord, summarize

    w = refusal_warning("INVALID_ARGUMENT", ["noncanonical_strides"])
    assert w and "spec 4.2" in w and "SHOULD" in w
    assert refusal_warning("UNSUPPORTED", ["noncanonical_strides"]) is None
    assert refusal_warning("INVALID_ARGUMENT", ["mixed_io_dtype"]) is None  # spec 8 allows it there
    assert refusal_warning("INVALID_ARGUMENT", ["noncanonical_strides", "mixed_io_dtype"]) is None
    recs = [TestRecord("layout.padded_rows[write-nhd_pad3]", "n1", "spec 4.2", "required", "layouts", [],
                       "noncanonical_strides", "unsupported", refusal="INVALID_ARGUMENT", warning=w),
            TestRecord("layout.nhd[write]", "n2", "spec 4.2", "required", "layouts", [], "nhd", "pass",
                       served_calls=1)]
    s = summarize(recs, Claims(), [], quick=False, partial=False, complete=True)
    assert s["profiles"]["layouts"]["verdict"] == "certified"
    assert "layout.padded_rows[write-nhd_pad3]" in s["profiles"]["layouts"]["warnings"]
    assert any("layout.padded_rows[write-nhd_pad3]: recommended:" in x and "SHOULD" in x for x in s["warnings"])


def test_served_needs_a_valid_call_served():
    """A profile whose only passing required tests check rejections is not served."""
    from kvx_conformance.results.claims import Claims
    from kvx_conformance.results.record import TestRecord, summarize

    recs = [TestRecord("fp4.validate.f4_without_extension", "n1", "x", "required", "fp4", [], "fp4", "pass",
                       served_calls=0),
            TestRecord("fp4.write.roundtrip", "n2", "x", "required", "fp4", [], "fp4", "unsupported",
                       served_calls=0)]
    s = summarize(recs, Claims(), [], quick=False, partial=False, complete=True)
    assert s["profiles"]["fp4"]["verdict"] == "not served" and s["claimed_profiles_certified"]
    s = summarize(recs, Claims(("fp4",)), [], quick=False, partial=False, complete=True)
    assert s["profiles"]["fp4"]["verdict"] == "not served" and not s["claimed_profiles_certified"]
    recs[1].outcome, recs[1].served_calls = "pass", 3
    s = summarize(recs, Claims(("fp4",)), [], quick=False, partial=False, complete=True)
    assert s["profiles"]["fp4"]["verdict"] == "certified" and s["claimed_profiles_certified"]
