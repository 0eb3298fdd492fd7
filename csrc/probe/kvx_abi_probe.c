/*
 * kvx_abi_probe.c -- prints the binary layout of kvx_abi.h as JSON:
 * {"structs": {name: {"size", "align", "fields": [{"name","offset","size"}]}},
 *  "enums": {name: {"size", "values": {enumerator: value}}}, "constants": {...}}
 * tests/test_abi_layout.py holds the ctypes mirror and the published v1.1 table
 * against this output.
 */
#include <stddef.h>
#include <stdio.h>

#include "kvx/kvx_abi.h"

#define ALIGNOF(T) offsetof(struct { char c; T t; }, t)
#define FIELD(T, F, last) \
  printf("{\"name\": \"%s\", \"offset\": %zu, \"size\": %zu}%s", #F, offsetof(T, F), sizeof(((T*)0)->F), (last) ? "" : ", ")
/* Last field / enumerator of the v1.1 part: not last when 1.2 appends more. */
#define V11_LAST (KVX_ABI_VERSION_MINOR < 2)
#define VALUE(E, last) printf("\"%s\": %lld%s", #E, (long long)(E), (last) ? "" : ", ")

int main(void) {
  printf("{\"structs\": {");
  printf("\"kvx_version_t\": {\"size\": %zu, \"align\": %zu, \"fields\": [", sizeof(kvx_version_t), ALIGNOF(kvx_version_t));
  FIELD(kvx_version_t, size, 0);
  FIELD(kvx_version_t, abi_major, 0);
  FIELD(kvx_version_t, abi_minor, 0);
  FIELD(kvx_version_t, abi_patch, 1);
  printf("]}, ");
  printf("\"kvx_tensor_desc_t\": {\"size\": %zu, \"align\": %zu, \"fields\": [", sizeof(kvx_tensor_desc_t), ALIGNOF(kvx_tensor_desc_t));
  FIELD(kvx_tensor_desc_t, size, 0);
  FIELD(kvx_tensor_desc_t, dtype, 0);
  FIELD(kvx_tensor_desc_t, layout, 0);
  FIELD(kvx_tensor_desc_t, memory, 0);
  FIELD(kvx_tensor_desc_t, ndim, 0);
  FIELD(kvx_tensor_desc_t, shape, 0);
  FIELD(kvx_tensor_desc_t, stride, 0);
  FIELD(kvx_tensor_desc_t, data, 1);
  printf("]}, ");
  printf("\"kvx_pool_desc_t\": {\"size\": %zu, \"align\": %zu, \"fields\": [", sizeof(kvx_pool_desc_t), ALIGNOF(kvx_pool_desc_t));
  FIELD(kvx_pool_desc_t, size, 0);
  FIELD(kvx_pool_desc_t, memory, 0);
  FIELD(kvx_pool_desc_t, bytes_per_block, 0);
  FIELD(kvx_pool_desc_t, primary, 0);
  FIELD(kvx_pool_desc_t, secondary, 1);
  printf("]}, ");
  printf("\"kvx_cache_desc_t\": {\"size\": %zu, \"align\": %zu, \"fields\": [", sizeof(kvx_cache_desc_t), ALIGNOF(kvx_cache_desc_t));
  FIELD(kvx_cache_desc_t, size, 0);
  FIELD(kvx_cache_desc_t, num_blocks, 0);
  FIELD(kvx_cache_desc_t, block_size, 0);
  FIELD(kvx_cache_desc_t, num_kv_heads, 0);
  FIELD(kvx_cache_desc_t, head_dim, 0);
  FIELD(kvx_cache_desc_t, k, 0);
  FIELD(kvx_cache_desc_t, v, 0);
  FIELD(kvx_cache_desc_t, pool, V11_LAST);
#if KVX_ABI_VERSION_MINOR >= 2
  FIELD(kvx_cache_desc_t, fp4, 1);
#endif
  printf("]}, ");
  printf("\"kvx_block_table_t\": {\"size\": %zu, \"align\": %zu, \"fields\": [", sizeof(kvx_block_table_t), ALIGNOF(kvx_block_table_t));
  FIELD(kvx_block_table_t, size, 0);
  FIELD(kvx_block_table_t, format, 0);
  FIELD(kvx_block_table_t, index_dtype, 0);
  FIELD(kvx_block_table_t, indptr_dtype, 0);
  FIELD(kvx_block_table_t, seq_count, 0);
  FIELD(kvx_block_table_t, beam_width, 0);
  FIELD(kvx_block_table_t, max_blocks_per_seq, 0);
  FIELD(kvx_block_table_t, indices, 0);
  FIELD(kvx_block_table_t, indptr, 0);
  FIELD(kvx_block_table_t, indices_count, 0);
  FIELD(kvx_block_table_t, indptr_count, 0);
  FIELD(kvx_block_table_t, flags, 1);
  printf("]}, ");
  printf("\"kvx_slot_mapping_t\": {\"size\": %zu, \"align\": %zu, \"fields\": [", sizeof(kvx_slot_mapping_t), ALIGNOF(kvx_slot_mapping_t));
  FIELD(kvx_slot_mapping_t, size, 0);
  FIELD(kvx_slot_mapping_t, dtype, 0);
  FIELD(kvx_slot_mapping_t, token_count, 0);
  FIELD(kvx_slot_mapping_t, invalid_slot, 0);
  FIELD(kvx_slot_mapping_t, slots, 1);
  printf("]}, ");
  printf("\"kvx_seq_lens_t\": {\"size\": %zu, \"align\": %zu, \"fields\": [", sizeof(kvx_seq_lens_t), ALIGNOF(kvx_seq_lens_t));
  FIELD(kvx_seq_lens_t, size, 0);
  FIELD(kvx_seq_lens_t, dtype, 0);
  FIELD(kvx_seq_lens_t, seq_count, 0);
  FIELD(kvx_seq_lens_t, lengths, 1);
  printf("]}, ");
  printf("\"kvx_kv_io_desc_t\": {\"size\": %zu, \"align\": %zu, \"fields\": [", sizeof(kvx_kv_io_desc_t), ALIGNOF(kvx_kv_io_desc_t));
  FIELD(kvx_kv_io_desc_t, size, 0);
  FIELD(kvx_kv_io_desc_t, key, 0);
  FIELD(kvx_kv_io_desc_t, value, 0);
  FIELD(kvx_kv_io_desc_t, num_tokens, 0);
  FIELD(kvx_kv_io_desc_t, num_kv_heads, 0);
  FIELD(kvx_kv_io_desc_t, head_dim, 1);
  printf("]}, ");
  printf("\"kvx_scale_desc_t\": {\"size\": %zu, \"align\": %zu, \"fields\": [", sizeof(kvx_scale_desc_t), ALIGNOF(kvx_scale_desc_t));
  FIELD(kvx_scale_desc_t, size, 0);
  FIELD(kvx_scale_desc_t, dtype, 0);
  FIELD(kvx_scale_desc_t, granularity, 0);
  FIELD(kvx_scale_desc_t, ndim, 0);
  FIELD(kvx_scale_desc_t, shape, 0);
  FIELD(kvx_scale_desc_t, stride, 0);
  FIELD(kvx_scale_desc_t, data, 1);
  printf("]}, ");
  printf("\"kvx_write_desc_t\": {\"size\": %zu, \"align\": %zu, \"fields\": [", sizeof(kvx_write_desc_t), ALIGNOF(kvx_write_desc_t));
  FIELD(kvx_write_desc_t, size, 0);
  FIELD(kvx_write_desc_t, io, 0);
  FIELD(kvx_write_desc_t, slots, 0);
  FIELD(kvx_write_desc_t, k_scale, 0);
  FIELD(kvx_write_desc_t, v_scale, 0);
  FIELD(kvx_write_desc_t, k_scale_desc, 0);
  FIELD(kvx_write_desc_t, v_scale_desc, V11_LAST);
#if KVX_ABI_VERSION_MINOR >= 2
  FIELD(kvx_write_desc_t, fp4, 1);
#endif
  printf("]}, ");
  printf("\"kvx_gather_desc_t\": {\"size\": %zu, \"align\": %zu, \"fields\": [", sizeof(kvx_gather_desc_t), ALIGNOF(kvx_gather_desc_t));
  FIELD(kvx_gather_desc_t, size, 0);
  FIELD(kvx_gather_desc_t, io, 0);
  FIELD(kvx_gather_desc_t, block_table, 0);
  FIELD(kvx_gather_desc_t, seq_lens, 0);
  FIELD(kvx_gather_desc_t, max_seq_len, V11_LAST);
#if KVX_ABI_VERSION_MINOR >= 2
  FIELD(kvx_gather_desc_t, fp4, 1);
#endif
  printf("]}");
#if KVX_ABI_VERSION_MINOR >= 2
  printf(", \"kvx_fp4_cache_ext_t\": {\"size\": %zu, \"align\": %zu, \"fields\": [", sizeof(kvx_fp4_cache_ext_t), ALIGNOF(kvx_fp4_cache_ext_t));
  FIELD(kvx_fp4_cache_ext_t, size, 0);
  FIELD(kvx_fp4_cache_ext_t, format, 0);
  FIELD(kvx_fp4_cache_ext_t, k_scales, 0);
  FIELD(kvx_fp4_cache_ext_t, v_scales, 0);
  FIELD(kvx_fp4_cache_ext_t, k_global, 0);
  FIELD(kvx_fp4_cache_ext_t, v_global, 1);
  printf("]}, ");
  printf("\"kvx_fp4_io_scales_t\": {\"size\": %zu, \"align\": %zu, \"fields\": [", sizeof(kvx_fp4_io_scales_t), ALIGNOF(kvx_fp4_io_scales_t));
  FIELD(kvx_fp4_io_scales_t, size, 0);
  FIELD(kvx_fp4_io_scales_t, key_scales, 0);
  FIELD(kvx_fp4_io_scales_t, value_scales, 1);
  printf("]}");
#endif
  printf("}, \"enums\": {");
  printf("\"kvx_status_t\": {\"size\": %zu, \"values\": {", sizeof(kvx_status_t));
  VALUE(KVX_STATUS_OK, 0);
  VALUE(KVX_STATUS_INVALID_ARGUMENT, 0);
  VALUE(KVX_STATUS_UNSUPPORTED, 0);
  VALUE(KVX_STATUS_OUT_OF_RANGE, 0);
  VALUE(KVX_STATUS_INCOMPATIBLE, 0);
  VALUE(KVX_STATUS_INTERNAL_ERROR, 1);
  printf("}}, ");
  printf("\"kvx_dtype_t\": {\"size\": %zu, \"values\": {", sizeof(kvx_dtype_t));
  VALUE(KVX_DTYPE_INVALID, 0);
  VALUE(KVX_DTYPE_F16, 0);
  VALUE(KVX_DTYPE_BF16, 0);
  VALUE(KVX_DTYPE_F32, 0);
  VALUE(KVX_DTYPE_F8_E4M3, 0);
  VALUE(KVX_DTYPE_F8_E5M2, 0);
  VALUE(KVX_DTYPE_S32, 0);
  VALUE(KVX_DTYPE_S64, 0);
  VALUE(KVX_DTYPE_U32, 0);
  VALUE(KVX_DTYPE_U64, 0);
  VALUE(KVX_DTYPE_U8, V11_LAST);
#if KVX_ABI_VERSION_MINOR >= 2
  VALUE(KVX_DTYPE_F4_E2M1, 0);
  VALUE(KVX_DTYPE_UE8M0, 1);
#endif
  printf("}}, ");
  printf("\"kvx_memory_type_t\": {\"size\": %zu, \"values\": {", sizeof(kvx_memory_type_t));
  VALUE(KVX_MEMORY_UNKNOWN, 0);
  VALUE(KVX_MEMORY_HOST, 0);
  VALUE(KVX_MEMORY_DEVICE, 0);
  VALUE(KVX_MEMORY_UNIFIED, 1);
  printf("}}, ");
  printf("\"kvx_layout_t\": {\"size\": %zu, \"values\": {", sizeof(kvx_layout_t));
  VALUE(KVX_LAYOUT_INVALID, 0);
  VALUE(KVX_LAYOUT_BLOCK_NHD, 0);
  VALUE(KVX_LAYOUT_BLOCK_HND, 0);
  VALUE(KVX_LAYOUT_BLOCK_HND_PACKED, 0);
  VALUE(KVX_LAYOUT_BLOCK_CUSTOM, 1);
  printf("}}, ");
  printf("\"kvx_block_table_format_t\": {\"size\": %zu, \"values\": {", sizeof(kvx_block_table_format_t));
  VALUE(KVX_BLOCK_TABLE_INVALID, 0);
  VALUE(KVX_BLOCK_TABLE_PACKED, 0);
  VALUE(KVX_BLOCK_TABLE_RAGGED, 0);
  VALUE(KVX_BLOCK_TABLE_KV_OFFSETS, 1);
  printf("}}, ");
  printf("\"kvx_block_table_flags_t\": {\"size\": %zu, \"values\": {", sizeof(kvx_block_table_flags_t));
  VALUE(KVX_BLOCK_TABLE_FLAG_NONE, 0);
  VALUE(KVX_BLOCK_TABLE_FLAG_KVCACHEINDEX, 1);
  printf("}}, ");
  printf("\"kvx_scale_granularity_t\": {\"size\": %zu, \"values\": {", sizeof(kvx_scale_granularity_t));
  VALUE(KVX_SCALE_NONE, 0);
  VALUE(KVX_SCALE_PER_TENSOR, 0);
  VALUE(KVX_SCALE_PER_BLOCK, 0);
  VALUE(KVX_SCALE_PER_HEAD, 0);
  VALUE(KVX_SCALE_PER_BLOCK_HEAD, 1);
  printf("}}");
#if KVX_ABI_VERSION_MINOR >= 2
  printf(", \"kvx_fp4_format_t\": {\"size\": %zu, \"values\": {", sizeof(kvx_fp4_format_t));
  VALUE(KVX_FP4_NONE, 0);
  VALUE(KVX_FP4_NVFP4, 0);
  VALUE(KVX_FP4_MXFP4, 0);
  VALUE(KVX_FP4_MXFP4_OCP, 1);
  printf("}}");
#endif
  printf("}, \"constants\": {\"KVX_MAX_TENSOR_DIMS\": %d, \"KVX_ABI_VERSION_MAJOR\": %d, \"KVX_ABI_VERSION_MINOR\": %d}}\n", KVX_MAX_TENSOR_DIMS, KVX_ABI_VERSION_MAJOR, KVX_ABI_VERSION_MINOR);
  return 0;
}
