/*
 * kvx_contra_provider.c -- a contrarian KVX 1.2 host provider (libkvx_testing_contra.so):
 * correct by the spec and the readings, but wherever they leave a choice open it takes the
 * other one than the bundled reference. It is the independent provider's code
 * (csrc/testing/indep/kvx_indep_core.h, which says what each switch does) compiled with every
 * choice switch set to 1 (below). tests/test_host_providers.py holds it certified, with no
 * failure at any level, under the claims of csrc/testing/contra/kvx-claims.json: a test that
 * pins a choice the documents leave open fails here.
 *
 * The choices (docs/spec-readings.md names each reading):
 * - Core layout HND only: NHD caches are refused with INVALID_ARGUMENT (spec 8 "unsupported
 *   field"), FP8 caches excepted (vLLM's FP8 flash layout), while kvx_validate_cache_desc
 *   answers OK for every valid cache, NHD, large and KV_OFFSETS ones included (spec 7: it
 *   validates "layout, dtype, shape, stride, and required fields"; it says nothing of support).
 * - Refusals with INVALID_ARGUMENT, after every descriptor rule: KV_OFFSETS tables, caches or IO
 *   tensors past 2^31 elements (R-LARGE), FP8 IO into another cache dtype and FP8 gathers through
 *   a conversion (R-CONVERT), PER_BLOCK / PER_BLOCK_HEAD FP8 scales, gather outputs whose zero
 *   strides alias, DEVICE / UNIFIED memory, and the k_scale / v_scale pointer fallback (spec 6.9:
 *   MAY): FP8 writes scale through scale descriptors only.
 * - Data errors: the valid part of the call is written and the first error answered after it
 *   (no pre-scan: R-ORDER); a used block id outside the cache and a length past the table's
 *   capacity INVALID_ARGUMENT, a decreasing RAGGED indptr OUT_OF_RANGE (product readings:
 *   "should be OUT_OF_RANGE or INVALID_ARGUMENT"); sequence by sequence.
 * - Duplicate slots in one write: the first token wins (tokens are written last to first).
 * - NaNs a conversion produces: the other sign and the smallest payload (signalling F16 / BF16 /
 *   F32 NaNs, E4M3 0x7F / 0xFF of the other sign, E5M2 0x7D / 0xFD); plain copies stay bit-exact.
 * - FP4: exact-tier numerics (docs/fp4.md); a NaN block stores scale byte 0xFF and non-zero codes,
 *   and a block with an Inf input is stored as a NaN block (readings: "informational beyond that").
 * - A newer minor's struct: every byte past the 1.2 struct, zero or not, is ignored (spec 3; R-SIZE:
 *   a non-zero tail may be refused or ignored, never misread); a partial 1.2 field is not read.
 * - kvx_get_version reports 1.2.7 (the patch number is the provider's).
 * Serves otherwise what the independent provider serves: HND, HND_PACKED and CUSTOM caches with
 * any strides (negative too), K and V of different layouts and dtypes, F16 / BF16 / F32 / E4M3 /
 * E5M2 / F4_E2M1, IO with any strides, 3-D or 4-D outputs, PACKED and RAGGED tables (S32 / S64),
 * FP8 scales PER_TENSOR / PER_HEAD (strided too), the FP4 extension in its three formats.
 */
#define CHOICE_ABI_PATCH_7 1
#define CHOICE_IGNORE_TAIL 1
#define CHOICE_REFUSE_INVALID 1
#define CHOICE_VALIDATE_RULES_ONLY 1
#define CHOICE_HND_ONLY 1
#define CHOICE_REFUSE_LARGE 1
#define CHOICE_REFUSE_KV_OFFSETS 1
#define CHOICE_REFUSE_BLOCK_SCALES 1
#define CHOICE_DECLINE_SCALE_PTR 1
#define CHOICE_NO_PRESCAN 1
#define CHOICE_FIRST_TOKEN_WINS 1
#define CHOICE_GATHER_RANGE_INVALID 1
#define CHOICE_INDPTR_ORDER_OOR 1
#define CHOICE_OTHER_NANS 1
#define CHOICE_FP4_OTHER_NAN_BLOCK 1
#define CHOICE_FP4_INF_AS_NAN 1
#include "../indep/kvx_indep_core.h"
