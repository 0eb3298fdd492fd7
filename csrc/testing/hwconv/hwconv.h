/*
 * hwconv.h -- a second, independent KVX provider for kvx-conform's own tests.
 *
 * Written from the spec and docs/spec-readings.md alone (no code shared with the
 * bundled reference under csrc/reference), the way a vendor would write one around
 * its own kernels. One front end (hwconv_front.c: validation, R-ORDER) and two
 * backends:
 *
 *   hwconv_cuda.cu  libkvx_testing_hwconv_cuda.so (built when nvcc is found):
 *                   DEVICE memory only; conversions by the GPU's own instructions
 *                   (cuda_fp8.h saturating FP8 conversions, __float2half_rn,
 *                   __float2bfloat16_rn), whatever NaN encodings they produce.
 *   hwconv_host.c   libkvx_testing_hwconv_host.so (always built): HOST memory only;
 *                   the same semantics in C, encoding every NaN a conversion makes
 *                   differently from the reference (docs/numerics.md lists them).
 *
 * Served: BLOCK_NHD and BLOCK_HND caches (any non-negative strides), F16 / BF16 /
 * F32 and F8_E4M3 / F8_E5M2 caches and IO, quantizing FP8 writes with the per-tensor
 * scale pointer or PER_TENSOR / PER_HEAD scale descriptors (PER_HEAD values stride[0]
 * apart too), PACKED block tables,
 * S32 / S64 indices. Everything else a valid call may ask for (HND_PACKED, CUSTOM,
 * negative strides, RAGGED, KV_OFFSETS, PER_BLOCK scales, the other memory type) is
 * refused with KVX_STATUS_UNSUPPORTED after the call's descriptors validated.
 */
#ifndef KVX_TESTING_HWCONV_H
#define KVX_TESTING_HWCONV_H

#include <stdint.h>

#include "kvx/kvx_abi.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Element (block, token, head, dim) of a cache tensor at
 * b*s_block + t*s_token + h*s_head + d*s_dim (elements). */
typedef struct hw_cache_tensor {
  void* data;
  int dtype;
  int64_t s_block, s_token, s_head, s_dim;
} hw_cache_tensor;

/* IO row r (a token of a write, an output row of a gather), head h, dim d at
 * (r / rows_per_group)*s_group + (r % rows_per_group)*s_row + h*s_head + d*s_dim. */
typedef struct hw_io_tensor {
  void* data;
  int dtype;
  int64_t rows_per_group, s_group, s_row, s_head, s_dim;
} hw_io_tensor;

typedef struct hw_scale {
  const float* ptr; /* NULL: 1.0 */
  int64_t head_stride; /* PER_HEAD: head h's value at ptr[h * head_stride] (R-FP8); 0: one value */
} hw_scale;

typedef struct hw_write_plan {
  uint32_t num_tokens, num_kv_heads, head_dim, block_size, num_blocks;
  hw_cache_tensor k, v;
  hw_io_tensor key, value;
  const void* slots;
  int slot_dtype;
  int64_t invalid_slot;
  hw_scale k_scale, v_scale;
} hw_write_plan;

typedef struct hw_gather_plan {
  uint32_t num_kv_heads, head_dim, block_size, num_blocks;
  uint32_t seq_count, max_blocks_per_seq, max_seq_len;
  hw_cache_tensor k, v;
  hw_io_tensor key, value;
  const void* indices;
  int index_dtype;
  const void* lengths;
  int lengths_dtype;
} hw_gather_plan;

/* Backend: the one memory type it serves, and the calls (the front end has
 * validated every descriptor; data-dependent rules are the backend's). */
int hw_backend_memory(void);
kvx_status_t hw_backend_write(const hw_write_plan* p, void* stream);
kvx_status_t hw_backend_gather(const hw_gather_plan* p, void* stream);

#ifdef __CUDACC__
#define HW_HD __host__ __device__
#else
#define HW_HD
#endif

HW_HD static inline int hw_dtype_size(int dt) {
  return dt == KVX_DTYPE_F32 ? 4 : (dt == KVX_DTYPE_F16 || dt == KVX_DTYPE_BF16) ? 2 : 1;
}
HW_HD static inline int hw_is_fp8(int dt) { return dt == KVX_DTYPE_F8_E4M3 || dt == KVX_DTYPE_F8_E5M2; }

#ifdef __cplusplus
}
#endif

#endif
