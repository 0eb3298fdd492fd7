/*
 * mutants.h -- deliberate defects of the reference provider.
 *
 * csrc/mutants/CMakeLists.txt builds the reference once per name listed in
 * csrc/mutants/mutants.txt, with -DKVX_MUTANT=KVX_MUT_<NAME>. The project's
 * tests prove that the suites catch every one of them. In the reference
 * (KVX_MUTANT undefined) every KVX_MUT(NAME) is the constant false and the
 * compiler drops the defect. Each defect sits at the one place it belongs;
 * mutants.txt says what each one does.
 */
#ifndef KVX_REFERENCE_MUTANTS_H
#define KVX_REFERENCE_MUTANTS_H

#define KVX_MUT_NONE 0
#define KVX_MUT_IGNORE_INVALID_SLOT 1
#define KVX_MUT_NEGATIVE_SLOT_ERROR 2
#define KVX_MUT_IGNORE_STRIDES 3
#define KVX_MUT_V_INTO_K 4
#define KVX_MUT_BLOCK_OFFSET_OFF_BY_ONE 5
#define KVX_MUT_ACCEPT_SMALL_SIZE 6
#define KVX_MUT_ACCEPT_SMALL_NESTED_SIZE 7
#define KVX_MUT_OOB_SLOT_OK 8
#define KVX_MUT_S64_SLOTS_AS_S32 9
#define KVX_MUT_SKIP_RAGGED_INDPTR_CHECK 10
#define KVX_MUT_WRITE_PAST_LAST_BLOCK 11
#define KVX_MUT_IGNORE_SECONDARY_POOL 12
#define KVX_MUT_WRITES_PADDING_ROWS 13
#define KVX_MUT_WRONG_VERSION 14
#define KVX_MUT_DATA_RACE 15
#define KVX_MUT_ZERO_DIMS_ACCEPTED 16
#define KVX_MUT_PACKED_PACK_UNCHECKED 17
#define KVX_MUT_PACKED_COUNT_UNCHECKED 18
#define KVX_MUT_KV_OFFSETS_NON_POW2 19
#define KVX_MUT_FP8_IGNORES_SCALE 20
#define KVX_MUT_FP8_TRUNCATES 21
#define KVX_MUT_FP8_NO_SATURATE 22
#define KVX_MUT_BF16_TRUNCATES 23
#define KVX_MUT_MAX_SEQ_LEN_IGNORED 24
#define KVX_MUT_SEQ_COUNT_MISMATCH_UNCHECKED 25
#define KVX_MUT_GATHER_BLOCK_ID_UNCHECKED 26
#define KVX_MUT_BEAM_WIDTH_IGNORED 27
#define KVX_MUT_HND_AS_NHD 28
#define KVX_MUT_ZERO_TOKENS_ERROR 29
#define KVX_MUT_NOOP_OK 30
#define KVX_MUT_RAGGED_GLOBAL_OFFSET 31
#define KVX_MUT_SEQ_LENS_S64_AS_S32 32
#define KVX_MUT_MISALIGNED_ROUNDS_DOWN 33
#define KVX_MUT_LATE_WRITE 34
#define KVX_MUT_SEGV_ON_WRITE 35
#define KVX_MUT_ABORT_ON_GATHER 36
#define KVX_MUT_HANG_ON_WRITE 37
#define KVX_MUT_FP4_NIBBLE_SWAP 38
#define KVX_MUT_FP4_TIES_AWAY 39
#define KVX_MUT_FP4_UNROUNDED_SCALE 40
#define KVX_MUT_FP4_ZERO_BLOCK_NAN 41
#define KVX_MUT_FP4_SCALE_LOGICAL_BLOCK 42
#define KVX_MUT_CONVERSION_NAN_TO_FINITE 43
#define KVX_MUT_CONVERSION_ZERO_SIGN 44
/* Not a mutant (never in mutants.txt): a reference variant whose conversions
 * encode NaN differently, which must still certify (NaN compared as a class,
 * docs/numerics.md; csrc/mutants/CMakeLists.txt builds libkvx_variant_nan_payload). */
#define KVX_MUT_NAN_PAYLOAD_VARIANT 45
/* inputs are read-only, 64-bit block ids (numbered apart from the others) */
#define KVX_MUT_MODIFIES_INPUT_KEY 70
#define KVX_MUT_MODIFIES_SLOTS 71
#define KVX_MUT_S64_BLOCK_IDS_TRUNCATED 72
/* writes after return, later than the lifetime probe used to wait */
#define KVX_MUT_LATE_WRITE_DELAYED 46
/* PER_HEAD scale values (FP8, NVFP4 globals) read as adjacent whatever stride[0] says */
#define KVX_MUT_SCALE_STRIDE_IGNORED 47

#ifndef KVX_MUTANT
#define KVX_MUTANT KVX_MUT_NONE
#endif

/* True (a compile-time constant) only in the mutant named NAME. */
#define KVX_MUT(NAME) (KVX_MUTANT == KVX_MUT_##NAME)

#endif /* KVX_REFERENCE_MUTANTS_H */
