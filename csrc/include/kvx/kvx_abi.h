/*
 * kvx_abi.h -- the KVX v1 C ABI for paged KV caches.
 *
 * Binary compatible with the published KVX v1.1 header (same names, enumerator
 * values, field order and C types; natural C alignment, no packing pragmas).
 * Spec: KVX v1 draft, sections 3 (versioning), 4 (memory model), 5 (tables),
 * 6 (metadata), 7 (API), 8 (status codes). The field-by-field layout is held
 * against the published table by tests/test_abi_layout.py through the ABI probe
 * (csrc/probe/kvx_abi_probe.c).
 *
 * Every public struct starts with `uint32_t size`, the caller's sizeof of the
 * struct it filled. A provider refuses a size below its own v1.1 sizeof with
 * KVX_STATUS_INVALID_ARGUMENT and accepts a larger size whose tail it does not
 * know (a newer minor), reading only the prefix it knows.
 *
 * Usable from C (C99 and later) and C++.
 */
#ifndef KVX_KVX_ABI_H
#define KVX_KVX_ABI_H

#include <stddef.h>
#include <stdint.h>

/*
 * ABI minor. By default this header is exactly the published v1.1 header
 * (tests/test_abi_layout.py holds it to the published table), so code written
 * against v1.1 -- size guards as `size < sizeof(T)` included -- keeps its
 * meaning. Defining KVX_ABI_TARGET_MINOR=2 before including it opts in to
 * KVX 1.2, the FP4 extension (docs/fp4.md): two dtypes, kvx_fp4_format_t and
 * two extension structs, and one field APPENDED at the end of each top-level
 * struct (kvx_cache_desc_t, kvx_write_desc_t, kvx_gather_desc_t). Nothing
 * else moves: the v1.1 prefix of every struct is byte for byte the published
 * one and embedded structs never grow. A v1.1 provider handed a 1.2 struct
 * sees a `size` above its sizeof and a tail it does not know (spec 3: accept
 * when the tail is zero, else UNSUPPORTED); a 1.2 provider must still accept
 * v1.1 sizes, which KVX_V1_1_SIZEOF_* give in either build. A caller uses the
 * 1.2 layout only with a provider whose kvx_get_version reports minor >= 2.
 */
#ifndef KVX_ABI_TARGET_MINOR
#define KVX_ABI_TARGET_MINOR 1
#endif
#if KVX_ABI_TARGET_MINOR != 1 && KVX_ABI_TARGET_MINOR != 2
#error "KVX_ABI_TARGET_MINOR must be 1 or 2"
#endif

#define KVX_ABI_VERSION_MAJOR 1
#define KVX_ABI_VERSION_MINOR KVX_ABI_TARGET_MINOR
#define KVX_ABI_VERSION_PATCH 0

#define KVX_MAX_TENSOR_DIMS 5

/* Export / import of the provider entry points. A provider is built with
 * KVX_BUILD_PROVIDER defined; consumers include the header plainly. */
#if defined(_WIN32) || defined(__CYGWIN__)
#  if defined(KVX_BUILD_PROVIDER)
#    define KVX_API __declspec(dllexport)
#  else
#    define KVX_API __declspec(dllimport)
#  endif
#elif defined(__GNUC__) || defined(__clang__)
#  define KVX_API __attribute__((visibility("default")))
#else
#  define KVX_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* Spec 8. */
typedef enum kvx_status {
  KVX_STATUS_OK = 0,
  KVX_STATUS_INVALID_ARGUMENT = 1,
  KVX_STATUS_UNSUPPORTED = 2,
  KVX_STATUS_OUT_OF_RANGE = 3,
  KVX_STATUS_INCOMPATIBLE = 4,
  KVX_STATUS_INTERNAL_ERROR = 5
} kvx_status_t;

/* Spec 4.3. */
typedef enum kvx_dtype {
  KVX_DTYPE_INVALID = 0,
  KVX_DTYPE_F16 = 1,
  KVX_DTYPE_BF16 = 2,
  KVX_DTYPE_F32 = 3,
  KVX_DTYPE_F8_E4M3 = 4,
  KVX_DTYPE_F8_E5M2 = 5,
  KVX_DTYPE_S32 = 6,
  KVX_DTYPE_S64 = 7,
  KVX_DTYPE_U32 = 8,
  KVX_DTYPE_U64 = 9,
  KVX_DTYPE_U8 = 10
#if KVX_ABI_VERSION_MINOR >= 2
  ,
  /* KVX 1.2 (FP4 extension). F4_E2M1: packed two per byte, element 2i in the
   * low nibble and 2i+1 in the high nibble; shapes and strides of such a
   * tensor count elements (nibbles). UE8M0: unsigned exponent byte, value
   * 2^(byte - 127), 0xFF is NaN (MXFP4 block scales). */
  KVX_DTYPE_F4_E2M1 = 11,
  KVX_DTYPE_UE8M0 = 12
#endif
} kvx_dtype_t;

/* Spec 4.3. */
typedef enum kvx_memory_type {
  KVX_MEMORY_UNKNOWN = 0,
  KVX_MEMORY_HOST = 1,
  KVX_MEMORY_DEVICE = 2,
  KVX_MEMORY_UNIFIED = 3
} kvx_memory_type_t;

/* Spec 4.2. */
typedef enum kvx_layout {
  KVX_LAYOUT_INVALID = 0,
  KVX_LAYOUT_BLOCK_NHD = 1,
  KVX_LAYOUT_BLOCK_HND = 2,
  KVX_LAYOUT_BLOCK_HND_PACKED = 3,
  KVX_LAYOUT_BLOCK_CUSTOM = 15
} kvx_layout_t;

/* Spec 5.1. */
typedef enum kvx_block_table_format {
  KVX_BLOCK_TABLE_INVALID = 0,
  KVX_BLOCK_TABLE_PACKED = 1,
  KVX_BLOCK_TABLE_RAGGED = 2,
  KVX_BLOCK_TABLE_KV_OFFSETS = 3
} kvx_block_table_format_t;

/* Spec 5.1 (KV_OFFSETS). */
typedef enum kvx_block_table_flags {
  KVX_BLOCK_TABLE_FLAG_NONE = 0,
  KVX_BLOCK_TABLE_FLAG_KVCACHEINDEX = 1 /* bit 0 */
} kvx_block_table_flags_t;

/* Spec 6.6. */
typedef enum kvx_scale_granularity {
  KVX_SCALE_NONE = 0,
  KVX_SCALE_PER_TENSOR = 1,
  KVX_SCALE_PER_BLOCK = 2,
  KVX_SCALE_PER_HEAD = 3,
  KVX_SCALE_PER_BLOCK_HEAD = 4
} kvx_scale_granularity_t;

/* Spec 3. */
typedef struct kvx_version {
  uint32_t size;
  uint32_t abi_major;
  uint32_t abi_minor;
  uint32_t abi_patch;
} kvx_version_t;

/* Spec 6.2. Strides are in elements. */
typedef struct kvx_tensor_desc {
  uint32_t size;
  kvx_dtype_t dtype;
  kvx_layout_t layout;
  kvx_memory_type_t memory;
  uint32_t ndim;
  int64_t shape[KVX_MAX_TENSOR_DIMS];
  int64_t stride[KVX_MAX_TENSOR_DIMS];
  void* data;
} kvx_tensor_desc_t;

/* Spec 6.7. */
typedef struct kvx_pool_desc {
  uint32_t size;
  kvx_memory_type_t memory;
  uint32_t bytes_per_block;
  void* primary;
  void* secondary;
} kvx_pool_desc_t;

/* Spec 6.6. */
typedef struct kvx_scale_desc {
  uint32_t size;
  kvx_dtype_t dtype;
  kvx_scale_granularity_t granularity;
  uint32_t ndim;
  int64_t shape[KVX_MAX_TENSOR_DIMS];
  int64_t stride[KVX_MAX_TENSOR_DIMS];
  const void* data;
} kvx_scale_desc_t;

#if KVX_ABI_VERSION_MINOR >= 2
/* ------------------------------------------------------------------------ */
/* KVX 1.2: the FP4 extension (docs/fp4.md, readings "FP4 extension").        */

/* How an F4_E2M1 cache is scaled. */
typedef enum kvx_fp4_format {
  KVX_FP4_NONE = 0,       /* not an FP4 cache: the extension is unused */
  KVX_FP4_NVFP4 = 1,      /* 16 values per F8_E4M3 block scale, FP32 global scale */
  KVX_FP4_MXFP4 = 2,      /* 16 values per UE8M0 exponent, e = ceil(log2(amax / 6)) */
  KVX_FP4_MXFP4_OCP = 3   /* 32 values per UE8M0 exponent, e = floor(log2(amax)) - 2 */
} kvx_fp4_format_t;

/* The scale pool of an FP4 cache and its global scales. Appended to
 * kvx_cache_desc_t. k_scales / v_scales are indexed by the same block ids as
 * the data pool: BLOCK_NHD [num_blocks, block_size, num_kv_heads, head_dim / B]
 * or BLOCK_HND [num_blocks, num_kv_heads, block_size, head_dim / B], B = 16
 * (NVFP4, MXFP4) or 32 (MXFP4_OCP), dtype F8_E4M3 (NVFP4) or UE8M0 (MXFP4),
 * strides in bytes (= elements), same memory type as the cache. k_global /
 * v_global: NVFP4's decode-direction FP32 scale g (PER_TENSOR, or PER_HEAD of
 * shape [num_kv_heads]); data NULL means 1.0; ignored by MXFP4. An all-zero
 * extension (size 0, format NONE) means a v1.1 cache. */
typedef struct kvx_fp4_cache_ext {
  uint32_t size;
  kvx_fp4_format_t format;
  kvx_tensor_desc_t k_scales;
  kvx_tensor_desc_t v_scales;
  kvx_scale_desc_t k_global;
  kvx_scale_desc_t v_global;
} kvx_fp4_cache_ext_t;

/* Block scales of a raw FP4 transfer (IO dtype F4_E2M1): [num_tokens,
 * num_kv_heads, head_dim / B] (a gather may also use the 4-D padded form),
 * dtype and memory as the scale pool. Appended to kvx_write_desc_t and
 * kvx_gather_desc_t; unused (zero) for any other IO dtype. */
typedef struct kvx_fp4_io_scales {
  uint32_t size;
  kvx_tensor_desc_t key_scales;
  kvx_tensor_desc_t value_scales;
} kvx_fp4_io_scales_t;
#endif

/* Spec 6.1. */
typedef struct kvx_cache_desc {
  uint32_t size;
  uint32_t num_blocks;
  uint32_t block_size;
  uint32_t num_kv_heads;
  uint32_t head_dim;
  kvx_tensor_desc_t k;
  kvx_tensor_desc_t v;
  kvx_pool_desc_t pool;
#if KVX_ABI_VERSION_MINOR >= 2
  kvx_fp4_cache_ext_t fp4; /* KVX 1.2 */
#endif
} kvx_cache_desc_t;

/* Spec 5.1, 6.3. */
typedef struct kvx_block_table {
  uint32_t size;
  kvx_block_table_format_t format;
  kvx_dtype_t index_dtype;
  kvx_dtype_t indptr_dtype;
  uint32_t seq_count;
  uint32_t beam_width;
  uint32_t max_blocks_per_seq;
  const void* indices;
  const void* indptr;
  uint32_t indices_count;
  uint32_t indptr_count;
  uint32_t flags;
} kvx_block_table_t;

/* Spec 5.2, 6.4. */
typedef struct kvx_slot_mapping {
  uint32_t size;
  kvx_dtype_t dtype;
  uint32_t token_count;
  int64_t invalid_slot;
  const void* slots;
} kvx_slot_mapping_t;

/* Spec 5.3, 6.5. */
typedef struct kvx_seq_lens {
  uint32_t size;
  kvx_dtype_t dtype;
  uint32_t seq_count;
  const void* lengths;
} kvx_seq_lens_t;

/* Spec 6.8. */
typedef struct kvx_kv_io_desc {
  uint32_t size;
  kvx_tensor_desc_t key;
  kvx_tensor_desc_t value;
  uint32_t num_tokens;
  uint32_t num_kv_heads;
  uint32_t head_dim;
} kvx_kv_io_desc_t;

/* Spec 6.9. */
typedef struct kvx_write_desc {
  uint32_t size;
  kvx_kv_io_desc_t io;
  kvx_slot_mapping_t slots;
  const void* k_scale;
  const void* v_scale;
  kvx_scale_desc_t k_scale_desc;
  kvx_scale_desc_t v_scale_desc;
#if KVX_ABI_VERSION_MINOR >= 2
  kvx_fp4_io_scales_t fp4; /* KVX 1.2 */
#endif
} kvx_write_desc_t;

/* Spec 6.10. */
typedef struct kvx_gather_desc {
  uint32_t size;
  kvx_kv_io_desc_t io;
  kvx_block_table_t block_table;
  kvx_seq_lens_t seq_lens;
  uint32_t max_seq_len;
#if KVX_ABI_VERSION_MINOR >= 2
  kvx_fp4_io_scales_t fp4; /* KVX 1.2 */
#endif
} kvx_gather_desc_t;

/* The v1.1 sizeof of each top-level struct: the smallest `size` a provider
 * accepts (a v1.1 caller's struct). */
#if KVX_ABI_VERSION_MINOR >= 2
#define KVX_V1_1_SIZEOF_CACHE_DESC offsetof(kvx_cache_desc_t, fp4)
#define KVX_V1_1_SIZEOF_WRITE_DESC offsetof(kvx_write_desc_t, fp4)
#define KVX_V1_1_SIZEOF_GATHER_DESC offsetof(kvx_gather_desc_t, fp4)
#else
#define KVX_V1_1_SIZEOF_CACHE_DESC sizeof(kvx_cache_desc_t)
#define KVX_V1_1_SIZEOF_WRITE_DESC sizeof(kvx_write_desc_t)
#define KVX_V1_1_SIZEOF_GATHER_DESC sizeof(kvx_gather_desc_t)
#endif

/* Spec 3 and 7. */
KVX_API kvx_status_t kvx_get_version(kvx_version_t* version);
KVX_API kvx_status_t kvx_validate_cache_desc(const kvx_cache_desc_t* cache);
KVX_API kvx_status_t kvx_write_kv(const kvx_cache_desc_t* cache,
                                  const kvx_write_desc_t* desc, void* stream);
KVX_API kvx_status_t kvx_gather_kv(const kvx_cache_desc_t* cache,
                                   const kvx_gather_desc_t* desc, void* stream);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* KVX_KVX_ABI_H */
