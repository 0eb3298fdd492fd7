/*
 * kvx_plan.h -- the reference provider's internal contract between the front
 * end (validation, size guards, descriptor decoding: provider.cpp) and the
 * backends that move bytes (host: host_backend.cpp, CUDA: cuda_backend.cu).
 *
 * The front end validates every descriptor (spec 7.1 and the readings), then
 * resolves it into a plan of plain integers and pointers. Backends never look
 * at a descriptor and never return INVALID_ARGUMENT for a descriptor problem:
 * by the time a plan exists it is well-formed. Data-dependent checks (slot and
 * block-id ranges, RAGGED indptr contents, seq_lens values) are the backend's,
 * because only it can read memory of its kind; a backend that cannot report a
 * data-dependent error without synchronizing the host (CUDA on device memory)
 * skips the offending element and never touches memory out of bounds.
 */
#ifndef KVX_REFERENCE_PLAN_H
#define KVX_REFERENCE_PLAN_H

#include <stddef.h>
#include <stdint.h>

#include "kvx/kvx_abi.h"

namespace kvx_ref {

/* Where element (block b, token t, head h, dim d) of a cache tensor lives:
 *   data + elem_size * (b*s_block + t*s_token + h*s_head
 *                       + (d / pack)*s_dim_outer + (d % pack)*s_dim_inner)
 * NHD/HND/CUSTOM have pack == 1 (s_dim_inner unused, s_dim_outer = stride of d).
 * HND_PACKED has pack = shape[4]. Strides are in elements and may be any
 * non-negative values the caller gave (spec 4.2: honor provided strides). */
struct CacheTensorPlan {
  void* data;
  kvx_dtype_t dtype;
  int64_t s_block, s_token, s_head, s_dim_outer, s_dim_inner;
  int64_t pack;
};

/* IO tensor row (token n, head h, dim d): data + elem_size*(n*s_token + h*s_head + d*s_dim).
 * For a 4-D padded gather output [seq, max_seq_len, H, D] the front end folds
 * the first two dims into s_token when they are compatible. */
struct IoTensorPlan {
  void* data;
  kvx_dtype_t dtype;
  int64_t s_token, s_head, s_dim;
};

/* Scale used to quantize on write into an FP8 cache (readings: FP8 caches).
 * kind NONE: scale 1.0; PER_TENSOR: ptr[0]; PER_HEAD: ptr[h]. ptr is F32 in
 * the memory type of the cache. */
enum ScaleKind { SCALE_ONE = 0, SCALE_PER_TENSOR = 1, SCALE_PER_HEAD = 2 };
struct ScalePlan {
  ScaleKind kind;
  const float* ptr;
};

/* KVX 1.2 FP4 cache (fp4.h, host_fp4.cpp, cuda/move_fp4_*.cu). format 0: not
 * an FP4 cache, everything else here unused. Data tensors (k_cache/v_cache of
 * the plan, dtype F4_E2M1) are addressed in nibbles: element offset o lives in
 * byte o / 2, low nibble when o is even (the front end guarantees s_dim_outer
 * == 1, pack == 1 and even token/head/block strides). Scale tensors (one byte
 * per `block_values` values along head_dim, dim index j = d / block_values)
 * use the same addressing with byte elements; `raw` transfers carry codes and
 * scales through F4_E2M1 IO tensors (nibble strides) and byte scale IO
 * tensors (io_k_scales: row, head, j). */
struct Fp4Plan {
  int format; /* kvx_fp4_format_t */
  uint32_t block_values;
  CacheTensorPlan k_scales, v_scales;
  ScalePlan k_global, v_global;
  bool raw;
  IoTensorPlan io_k_scales, io_v_scales;
};

struct WritePlan {
  kvx_memory_type_t memory;
  uint32_t num_tokens, num_kv_heads, head_dim, block_size, num_blocks;
  CacheTensorPlan k_cache, v_cache;
  IoTensorPlan key, value;
  const void* slots; /* num_tokens entries */
  kvx_dtype_t slot_dtype; /* S32 or S64 */
  int64_t invalid_slot;
  ScalePlan k_scale, v_scale;
  Fp4Plan fp4;
};

struct GatherPlan {
  kvx_memory_type_t memory;
  uint32_t num_kv_heads, head_dim, block_size, num_blocks;
  uint32_t seq_count, beam_width, max_seq_len, max_blocks_per_seq;
  CacheTensorPlan k_cache, v_cache;
  IoTensorPlan key, value; /* row r = (s * beam_width + beam) * max_seq_len + t */
  kvx_block_table_format_t format;
  const void* indices;
  kvx_dtype_t index_dtype;
  uint32_t indices_count;
  const void* indptr; /* RAGGED only, indptr_count = seq_count + 1 entries */
  kvx_dtype_t indptr_dtype;
  const void* seq_lens; /* seq_count entries */
  kvx_dtype_t seq_lens_dtype;
  /* KV_OFFSETS: block base = (secondary bit ? pool_secondary : pool_primary)
   * + (index & 0x7fffffff) * bytes_per_block; inside a block HND contiguous. */
  const void* pool_primary;
  const void* pool_secondary;
  uint64_t bytes_per_block;
  Fp4Plan fp4;
};

/* Backends. Each returns OK or a data-dependent status (OUT_OF_RANGE,
 * INVALID_ARGUMENT for a negative length or a malformed indptr), or
 * UNSUPPORTED / INTERNAL_ERROR. */
kvx_status_t host_write(const WritePlan& plan);
kvx_status_t host_gather(const GatherPlan& plan);

/* FP4 caches (plan.fp4.format != 0), host memory: host_fp4.cpp. The pre-scan
 * of data-dependent rules is shared with host_write / host_gather. */
kvx_status_t host_fp4_write(const WritePlan& plan);
kvx_status_t host_fp4_gather(const GatherPlan& plan);
kvx_status_t host_prescan_write(const WritePlan& plan);
kvx_status_t host_prescan_gather(const GatherPlan& plan);

/* CUDA backend (cuda_backend.cu when CUDA is compiled in, cuda_stub.cpp
 * otherwise: the stub answers UNSUPPORTED). `stream` is a cudaStream_t or NULL
 * (the default stream). Never synchronizes the host. */
bool cuda_available();
kvx_status_t cuda_write(const WritePlan& plan, void* stream);
kvx_status_t cuda_gather(const GatherPlan& plan, void* stream);
/* FP4 on CUDA (cuda/move_fp4_*.cu; UNSUPPORTED in cuda_stub.cpp). */
kvx_status_t cuda_fp4_write(const WritePlan& plan, void* stream);
kvx_status_t cuda_fp4_gather(const GatherPlan& plan, void* stream);

}  // namespace kvx_ref

#endif /* KVX_REFERENCE_PLAN_H */
