/*
 * host_fp4.cpp -- KVX 1.2 FP4 caches on host memory (plan.fp4.format != 0).
 *
 * Write quantizes F16/BF16/F32 rows block by block (fp4.h) into the packed
 * E2M1 data tensors and the scale pool, which is indexed by the same physical
 * block id as the data; gather dequantizes into F16/BF16/F32 (FP32, then one
 * RNE rounding) or, with F4_E2M1 IO, copies codes and scale bytes as they
 * are (raw). The data-dependent pre-scan is the host backend's, so statuses
 * and "nothing written on error" are the same as for any other cache.
 */
#include <stdint.h>
#include <string.h>

#include "convert.h"
#include "fp4.h"
#include "kvx_plan.h"
#include "mutants.h"

namespace kvx_ref {
namespace {

inline char* byte_at(const void* base, uint64_t off) {
  return reinterpret_cast<char*>(reinterpret_cast<uintptr_t>(base) + off);
}

/* Nibble offset of cache element (b, t, h, d): its byte is offset / 2. */
inline uint64_t cache_nibble(const CacheTensorPlan& c, uint64_t b, uint64_t t, uint64_t h, uint64_t d) {
  return b * (uint64_t)c.s_block + t * (uint64_t)c.s_token + h * (uint64_t)c.s_head + d * (uint64_t)c.s_dim_outer;
}

/* Byte of scale j of (b, t, h) in a scale tensor. */
inline char* scale_at(const CacheTensorPlan& c, uint64_t b, uint64_t t, uint64_t h, uint64_t j) {
  return byte_at(c.data, cache_nibble(c, b, t, h, j));
}

inline uint64_t io_off(const IoTensorPlan& io, uint64_t row, uint64_t h, uint64_t d) {
  return row * (uint64_t)io.s_token + h * (uint64_t)io.s_head + d * (uint64_t)io.s_dim;
}

inline char* io_elem(const IoTensorPlan& io, uint64_t row, uint64_t h, uint64_t d) {
  return byte_at(io.data, io_off(io, row, h, d) * dtype_size(io.dtype));
}

inline float global_of(const ScalePlan& s, uint64_t head) {
  float v = 1.0f;
  if (s.kind == SCALE_PER_TENSOR) memcpy(&v, s.ptr, sizeof v);
  if (s.kind == SCALE_PER_HEAD) memcpy(&v, s.ptr + head, sizeof v);
  return v;
}

/* One (token row, head) of K or V: quantize (or copy raw) into cache block b, offset t. */
void write_row(const WritePlan& p, bool v, uint64_t i, uint64_t b, uint64_t t, uint64_t h) {
  const Fp4Plan& f = p.fp4;
  const CacheTensorPlan& c = v ? p.v_cache : p.k_cache;
  const CacheTensorPlan& sc = v ? f.v_scales : f.k_scales;
  const IoTensorPlan& io = v ? p.value : p.key;
  const uint32_t B = f.block_values, D = p.head_dim;
  if (f.raw) {
    const IoTensorPlan& ios = v ? f.io_v_scales : f.io_k_scales;
    for (uint64_t d = 0; d < D; d += 2)
      *byte_at(c.data, cache_nibble(c, b, t, h, d) / 2) = *byte_at(io.data, io_off(io, i, h, d) / 2);
    for (uint64_t j = 0; j < D / B; ++j) *scale_at(sc, b, t, h, j) = *byte_at(ios.data, io_off(ios, i, h, j));
    return;
  }
  const float g = global_of(v ? f.v_global : f.k_global, h);
  float x[kFp4MaxBlock];
  uint8_t codes[kFp4MaxBlock], s;
  for (uint64_t j = 0; j < D / B; ++j) {
    for (uint32_t k = 0; k < B; ++k) x[k] = load_as_f32(io_elem(io, i, h, j * B + k), io.dtype);
    fp4_encode_block(f.format, x, (int)B, g, &s, codes);
    *scale_at(sc, b, t, h, j) = (char)s;
    for (uint32_t k = 0; k < B; k += 2)
      *byte_at(c.data, cache_nibble(c, b, t, h, j * B + k) / 2) = (char)fp4_pack(codes[k], codes[k + 1]);
  }
}

/* One (output row, head) of K or V from cache block b (scales from block sb), offset t. */
void gather_row(const GatherPlan& p, bool v, uint64_t row, uint64_t b, uint64_t sb, uint64_t t, uint64_t h) {
  const Fp4Plan& f = p.fp4;
  const CacheTensorPlan& c = v ? p.v_cache : p.k_cache;
  const CacheTensorPlan& sc = v ? f.v_scales : f.k_scales;
  const IoTensorPlan& io = v ? p.value : p.key;
  const uint32_t B = f.block_values, D = p.head_dim;
  if (f.raw) {
    const IoTensorPlan& ios = v ? f.io_v_scales : f.io_k_scales;
    for (uint64_t d = 0; d < D; d += 2)
      *byte_at(io.data, io_off(io, row, h, d) / 2) = *byte_at(c.data, cache_nibble(c, b, t, h, d) / 2);
    for (uint64_t j = 0; j < D / B; ++j) *byte_at(ios.data, io_off(ios, row, h, j)) = *scale_at(sc, sb, t, h, j);
    return;
  }
  const float g = global_of(v ? f.v_global : f.k_global, h);
  for (uint64_t d = 0; d < D; d += 2) {
    const uint8_t byte = (uint8_t)*byte_at(c.data, cache_nibble(c, b, t, h, d) / 2);
    const uint8_t s = (uint8_t)*scale_at(sc, sb, t, h, d / B);
    encode_from_f32(io_elem(io, row, h, d), io.dtype, fp4_decode(f.format, fp4_even(byte), s, g));
    encode_from_f32(io_elem(io, row, h, d + 1), io.dtype, fp4_decode(f.format, fp4_odd(byte), s, g));
  }
}

}  // namespace

kvx_status_t host_fp4_write(const WritePlan& p) {
  const kvx_status_t st = host_prescan_write(p);
  if (st != KVX_STATUS_OK) return st;
  const uint64_t num_slots = (uint64_t)p.num_blocks * p.block_size;
  for (uint64_t i = 0; i < p.num_tokens; ++i) {
    const int64_t slot = load_index(p.slots, p.slot_dtype, i);
    if (slot < 0 || slot == p.invalid_slot || (uint64_t)slot >= num_slots) continue;
    const uint64_t b = (uint64_t)slot / p.block_size, t = (uint64_t)slot % p.block_size;
    for (uint64_t h = 0; h < p.num_kv_heads; ++h) {
      write_row(p, false, i, b, t, h);
      write_row(p, true, i, b, t, h);
    }
  }
  return KVX_STATUS_OK;
}

kvx_status_t host_fp4_gather(const GatherPlan& p) {
  const kvx_status_t st = host_prescan_gather(p);
  if (st != KVX_STATUS_OK) return st;
  for (uint64_t s = 0; s < p.seq_count; ++s) {
    const uint64_t L = (uint64_t)load_index(p.seq_lens, p.seq_lens_dtype, s);
    const uint64_t n = L < p.max_seq_len ? L : p.max_seq_len;
    for (uint64_t t = 0; t < n; ++t) {
      const uint64_t j = t / p.block_size;
      uint64_t b;
      if (p.format == KVX_BLOCK_TABLE_RAGGED)
        b = (uint64_t)load_index(p.indices, p.index_dtype,
                                 (uint64_t)load_index(p.indptr, p.indptr_dtype, s) + t);
      else /* PACKED (KV_OFFSETS is UNSUPPORTED for FP4 caches) */
        b = (uint64_t)load_index(p.indices, p.index_dtype, s * p.max_blocks_per_seq + j);
      const uint64_t sb = KVX_MUT(FP4_SCALE_LOGICAL_BLOCK) ? j : b;
      const uint64_t off = t % p.block_size, row = s * p.max_seq_len + t;
      for (uint64_t h = 0; h < p.num_kv_heads; ++h) {
        gather_row(p, false, row, b, sb, off, h);
        gather_row(p, true, row, b, sb, off, h);
      }
    }
  }
  return KVX_STATUS_OK;
}

}  // namespace kvx_ref
