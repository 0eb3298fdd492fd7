/*
 * kvx_indep_provider.c -- an independent KVX 1.2 host provider that serves every
 * feature a valid call can ask for (libkvx_testing_indep.so).
 *
 * Written from the KVX v1 spec, the published v1.1 binary layout, kvx_abi.h and the
 * project's documents (docs/spec-readings.md, docs/numerics.md, the numerics sections
 * of docs/fp4.md) only: no code of the bundled reference or of the other testing
 * providers was read. Its purpose is to find tests tuned to the reference's choices
 * where the documents leave room (tests/test_host_providers.py holds it certified
 * with every optional feature claimed).
 *
 * Serves: host memory; BLOCK_NHD, BLOCK_HND, BLOCK_HND_PACKED (any pack) and
 * BLOCK_CUSTOM (logical [blocks, tokens, heads, dim] order) caches with any strides,
 * negative ones included; K and V in different layouts and dtypes; cache dtypes F16,
 * BF16, F32, F8_E4M3, F8_E5M2 and (KVX 1.2) F4_E2M1 with NVFP4 / MXFP4 / OCP MXFP4
 * scale pools; IO tensors with any strides, 3-D or (gather) 4-D; PACKED and RAGGED
 * tables with S32 / S64 ids, KV_OFFSETS tables with primary and secondary pools; FP8
 * scales PER_TENSOR, PER_HEAD, PER_BLOCK and PER_BLOCK_HEAD (strided values too) and
 * the k_scale / v_scale pointer fallback; raw FP4 transfers both ways.
 *
 * Refuses (KVX_STATUS_UNSUPPORTED), after every descriptor rule has passed
 * (readings R-ORDER): DEVICE / UNIFIED memory; FP8 IO that is not the cache's own
 * dtype (readings R-CONVERT: no scale says what such values mean); a gather from an
 * FP8 cache into another dtype and a gather into FP8 from another dtype (same
 * reason); F4_E2M1 IO with a non-FP4 cache; KV_OFFSETS tables with FP4 caches (the
 * pools carry no scale pool); KV_OFFSETS with K and V of different dtypes (readings
 * R-GATHER); gather outputs with a zero stride on an extent above 1 (outputs would
 * alias); a newer minor's struct whose unknown tail is not zero (spec 3).
 *
 * Numerics: every conversion goes through FP32 with round-to-nearest-even (R-CONVERT);
 * FP8 quantization is q = float32(x) / scale, clamped, then RNE (R-FP8); FP4 follows
 * docs/fp4.md step by step. The encoders are its own (frexp / ldexp and bit arithmetic).
 *
 * The code is kvx_indep_core.h, shared with the contrarian provider (csrc/testing/contra):
 * this file leaves every choice switch undefined (0), the choices described above.
 */
#include "kvx_indep_core.h"
