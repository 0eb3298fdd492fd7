/*
 * frontend.cpp -- descriptor validation and plan resolution (see frontend.h).
 *
 * All descriptor decoding of the reference provider lives here, once, shared
 * by kvx_validate_cache_desc, kvx_write_kv and kvx_gather_kv. Arithmetic on
 * caller-supplied counts, shapes and strides is overflow-checked: an absurd
 * descriptor is INVALID_ARGUMENT, never a crash.
 */
#include "frontend.h"

#include <stdint.h>
#include <string.h>

#include "convert.h"
#include "mutants.h"

namespace kvx_ref {
namespace {

constexpr kvx_status_t OK = KVX_STATUS_OK;
constexpr kvx_status_t INVALID = KVX_STATUS_INVALID_ARGUMENT;
constexpr kvx_status_t UNSUPPORTED = KVX_STATUS_UNSUPPORTED;

#define KVX_REQUIRE(cond)                         \
  do {                                            \
    if (!(cond)) return KVX_STATUS_INVALID_ARGUMENT; \
  } while (0)

#define KVX_TRY(expr)                  \
  do {                                 \
    const kvx_status_t st_ = (expr);   \
    if (st_ != KVX_STATUS_OK) return st_; \
  } while (0)

/* A step's verdict: its INVALID_ARGUMENT rules return at once; UNSUPPORTED
 * conditions are remembered and reported only when no INVALID rule fails. */
inline kvx_status_t verdict(kvx_status_t invalid_or_ok, bool unsupported) {
  if (invalid_or_ok != OK) return invalid_or_ok;
  return unsupported ? UNSUPPORTED : OK;
}

/* ------------------------------------------------------------------------ */
/* Step 1: size guards (R-SIZE).                                              */

/* A newer minor's top-level struct may be larger than ours; its unknown tail
 * is scanned for non-zero bytes up to this size (beyond it: UNSUPPORTED). */
constexpr uint32_t kMaxTopLevelSize = 64u * 1024u;

template <class T>
bool too_small(const T& s) {
  return s.size < sizeof(T);
}

/* Top-level structs: the minimum is the v1.1 sizeof in every build (KVX 1.2
 * appends to them; kvx_abi.h). */
inline uint32_t v11_size(const kvx_cache_desc_t&) { return (uint32_t)KVX_V1_1_SIZEOF_CACHE_DESC; }
inline uint32_t v11_size(const kvx_write_desc_t&) { return (uint32_t)KVX_V1_1_SIZEOF_WRITE_DESC; }
inline uint32_t v11_size(const kvx_gather_desc_t&) { return (uint32_t)KVX_V1_1_SIZEOF_GATHER_DESC; }
bool too_small(const kvx_cache_desc_t& s) { return s.size < v11_size(s); }
bool too_small(const kvx_write_desc_t& s) { return s.size < v11_size(s); }
bool too_small(const kvx_gather_desc_t& s) { return s.size < v11_size(s); }

/* The caller filled this build's whole struct (KVX 1.2 part included). */
template <class T>
bool has_ext(const T& s) {
  return s.size >= sizeof(T) && sizeof(T) > v11_size(s);
}

/* Bytes from the end of what this build reads (all of T, or its v1.1 prefix
 * when the caller's struct stops short of T) up to `size` must be zero. */
template <class T>
bool tail_is_zero(const T& s) {
  const uint32_t from = s.size >= sizeof(T) ? (uint32_t)sizeof(T) : v11_size(s);
  if (s.size <= from) return true;
  if (s.size > kMaxTopLevelSize) return false;
  const unsigned char* p = reinterpret_cast<const unsigned char*>(&s);
  for (uint32_t i = from; i < s.size; ++i)
    if (p[i]) return false;
  return true;
}

/* cache, cache.k, cache.v (and cache.pool when the call's table needs it). */
bool cache_too_small(const kvx_cache_desc_t& c, bool needs_pool) {
  if (!KVX_MUT(ACCEPT_SMALL_SIZE) && too_small(c)) return true;
  if (!KVX_MUT(ACCEPT_SMALL_NESTED_SIZE) && (too_small(c.k) || too_small(c.v))) return true;
  return needs_pool && too_small(c.pool);
}

bool io_too_small(const kvx_kv_io_desc_t& io) {
  if (KVX_MUT(ACCEPT_SMALL_NESTED_SIZE)) return false;
  return too_small(io) || too_small(io.key) || too_small(io.value);
}

/* ------------------------------------------------------------------------ */
/* Shapes and strides.                                                        */

/* The int value of a caller's enum field, read without assuming it holds one
 * of the enumerators (it may not: validating it is the point). */
template <class E>
int raw(const E& e) {
  static_assert(sizeof(E) == sizeof(int), "C enums are ints");
  int v;
  memcpy(&v, &e, sizeof v);
  return v;
}

/* KVX 1.2: the cache carries an FP4 extension with a format set. */
bool is_fp4_cache(const kvx_cache_desc_t& c) {
#if KVX_ABI_VERSION_MINOR >= 2
  return has_ext(c) && raw(c.fp4.format) != 0;
#else
  (void)c;
  return false;
#endif
}

bool is_f4_dtype(int dt) {
#if KVX_ABI_VERSION_MINOR >= 2
  return dt == KVX_DTYPE_F4_E2M1;
#else
  (void)dt;
  return false;
#endif
}

bool valid_memory(int m) {
  return m == KVX_MEMORY_HOST || m == KVX_MEMORY_DEVICE || m == KVX_MEMORY_UNIFIED;
}

bool valid_cache_dtype(int dt) {
  return dt == KVX_DTYPE_F16 || dt == KVX_DTYPE_BF16 || dt == KVX_DTYPE_F32 || dt == KVX_DTYPE_F8_E4M3 ||
         dt == KVX_DTYPE_F8_E5M2;
}

bool valid_index_dtype(int dt) {
  return dt == KVX_DTYPE_S32 || dt == KVX_DTYPE_S64;
}

/* shape[0..nd) already equals the expected non-negative extents. Negative
 * strides flag UNSUPPORTED (R-STRIDE-NEG); a zero stride on an extent > 1 is
 * INVALID when `zero_is_invalid` (cache tensors: elements would alias); the
 * farthest element offset sum((n-1)*|s|) must fit int64. */
kvx_status_t stride_rules(const int64_t* shape, const int64_t* stride, uint32_t nd, bool zero_is_invalid,
                          bool& unsupported) {
  int64_t span = 0;
  for (uint32_t i = 0; i < nd; ++i) {
    const int64_t n = shape[i], s = stride[i];
    if (s < 0) unsupported = true;
    if (n <= 1) continue;
    if (s == 0) {
      if (zero_is_invalid) return INVALID;
      continue;
    }
    if (s == INT64_MIN) return INVALID;
    int64_t term;
    if (__builtin_mul_overflow(n - 1, s < 0 ? -s : s, &term) || __builtin_add_overflow(span, term, &span))
      return INVALID;
  }
  return OK;
}

bool shape_is(const kvx_tensor_desc_t& t, uint32_t nd, const int64_t* expect) {
  if (t.ndim != nd) return false;
  for (uint32_t i = 0; i < nd; ++i)
    if (t.shape[i] != expect[i]) return false;
  return true;
}

/* ------------------------------------------------------------------------ */
/* Step 2: the cache descriptor (R-CACHE, spec 4.2, 6.1, 6.2, 7.1).           */

kvx_status_t cache_tensor_rules(const kvx_cache_desc_t& c, const kvx_tensor_desc_t& t, bool& unsupported) {
  const bool fp4 = is_fp4_cache(c);
  /* An FP4 cache's tensors are F4_E2M1, and F4_E2M1 needs the FP4 extension. */
  KVX_REQUIRE(fp4 ? is_f4_dtype(raw(t.dtype)) : valid_cache_dtype(raw(t.dtype)));
  const int64_t nb = c.num_blocks, bs = c.block_size, H = c.num_kv_heads, D = c.head_dim;
  uint32_t nd;
  int64_t expect[KVX_MAX_TENSOR_DIMS];
  switch (raw(t.layout)) {
    case KVX_LAYOUT_BLOCK_NHD:
    case KVX_LAYOUT_BLOCK_CUSTOM: { /* R-CUSTOM: logical order, any strides */
      nd = 4;
      const int64_t e[] = {nb, bs, H, D};
      for (int i = 0; i < 4; ++i) expect[i] = e[i];
      break;
    }
    case KVX_LAYOUT_BLOCK_HND: {
      nd = 4;
      const int64_t e[] = {nb, H, bs, D};
      for (int i = 0; i < 4; ++i) expect[i] = e[i];
      break;
    }
    case KVX_LAYOUT_BLOCK_HND_PACKED: {
      nd = 5;
      KVX_REQUIRE(t.ndim == nd);
      const int64_t pack = t.shape[4];
      KVX_REQUIRE(pack > 0);
      if (!KVX_MUT(PACKED_PACK_UNCHECKED)) KVX_REQUIRE(D % pack == 0); /* 7.1 */
      const int64_t e[] = {nb, H, D / pack, bs, pack};
      for (int i = 0; i < 5; ++i) expect[i] = e[i];
      break;
    }
    default:
      return INVALID;
  }
  KVX_REQUIRE(shape_is(t, nd, expect));
  KVX_REQUIRE(t.data != nullptr);
  KVX_REQUIRE(valid_memory(raw(t.memory)));
  if (fp4) { /* nibble addressing: contiguous head_dim pairs, NHD or HND */
    const int layout = raw(t.layout);
    if (layout != KVX_LAYOUT_BLOCK_NHD && layout != KVX_LAYOUT_BLOCK_HND) unsupported = true;
    if (t.stride[3] != 1) unsupported = true;
    for (int i = 0; i < 3; ++i)
      if (t.shape[i] > 1 && t.stride[i] % 2) unsupported = true;
  }
  return stride_rules(t.shape, t.stride, nd, /*zero_is_invalid=*/true, unsupported);
}

/* Readings R-FP8, every PER_HEAD scale (FP8 write scales, NVFP4 global scales): head h's
 * value is data[h * stride[0]], 0 and 1 read as adjacent; values farther apart are not
 * served (UNSUPPORTED). */
static bool per_head_values_apart(const kvx_scale_desc_t& sd, uint32_t num_kv_heads) {
  return !KVX_MUT(SCALE_STRIDE_IGNORED) && num_kv_heads > 1 && sd.stride[0] != 0 && sd.stride[0] != 1;
}

#if KVX_ABI_VERSION_MINOR >= 2
/* KVX 1.2 FP4 extension of the cache (readings "FP4 extension", docs/fp4.md). */
int fp4_scale_dtype(int format) { return format == KVX_FP4_NVFP4 ? KVX_DTYPE_F8_E4M3 : KVX_DTYPE_UE8M0; }

kvx_status_t fp4_scale_tensor_rules(const kvx_cache_desc_t& c, const kvx_tensor_desc_t& t, uint32_t bv,
                                    bool& unsupported) {
  KVX_REQUIRE(!too_small(t));
  KVX_REQUIRE(raw(t.dtype) == fp4_scale_dtype(raw(c.fp4.format)));
  const int64_t nb = c.num_blocks, bs = c.block_size, H = c.num_kv_heads, J = c.head_dim / bv;
  const int64_t nhd[] = {nb, bs, H, J}, hnd[] = {nb, H, bs, J};
  const int layout = raw(t.layout);
  KVX_REQUIRE((layout == KVX_LAYOUT_BLOCK_NHD && shape_is(t, 4, nhd)) ||
              (layout == KVX_LAYOUT_BLOCK_HND && shape_is(t, 4, hnd)));
  KVX_REQUIRE(t.data != nullptr);
  KVX_REQUIRE(raw(t.memory) == raw(c.k.memory));
  return stride_rules(t.shape, t.stride, 4, /*zero_is_invalid=*/true, unsupported);
}

kvx_status_t fp4_global_rules(const kvx_scale_desc_t& sd, uint32_t num_kv_heads, bool& unsupported,
                              ScalePlan* out) {
  out->kind = SCALE_ONE;
  out->ptr = nullptr;
  KVX_REQUIRE(!too_small(sd));
  if (sd.data == nullptr) return OK;
  KVX_REQUIRE(raw(sd.dtype) == KVX_DTYPE_F32);
  switch (raw(sd.granularity)) {
    case KVX_SCALE_PER_TENSOR:
      out->kind = SCALE_PER_TENSOR;
      break;
    case KVX_SCALE_PER_HEAD:
      KVX_REQUIRE(sd.ndim == 1 && sd.shape[0] == (int64_t)num_kv_heads);
      if (per_head_values_apart(sd, num_kv_heads)) unsupported = true;
      out->kind = SCALE_PER_HEAD;
      break;
    default:
      return INVALID;
  }
  out->ptr = static_cast<const float*>(sd.data);
  return OK;
}

kvx_status_t fp4_cache_rules(const kvx_cache_desc_t& c, bool& unsupported, Fp4Plan* plan) {
  const kvx_fp4_cache_ext_t& x = c.fp4;
  KVX_REQUIRE(!too_small(x));
  const int format = raw(x.format);
  KVX_REQUIRE(format == KVX_FP4_NVFP4 || format == KVX_FP4_MXFP4 || format == KVX_FP4_MXFP4_OCP);
  const uint32_t bv = format == KVX_FP4_MXFP4_OCP ? 32u : 16u;
  KVX_REQUIRE(c.head_dim % bv == 0); /* readings: head_dim % 16 (% 32 for OCP) */
  KVX_TRY(fp4_scale_tensor_rules(c, x.k_scales, bv, unsupported));
  KVX_TRY(fp4_scale_tensor_rules(c, x.v_scales, bv, unsupported));
  Fp4Plan p{};
  p.format = format;
  p.block_values = bv;
  if (format == KVX_FP4_NVFP4) {
    KVX_TRY(fp4_global_rules(x.k_global, c.num_kv_heads, unsupported, &p.k_global));
    KVX_TRY(fp4_global_rules(x.v_global, c.num_kv_heads, unsupported, &p.v_global));
  } else {
    p.k_global = p.v_global = ScalePlan{SCALE_ONE, nullptr}; /* MXFP4 has no global scale */
  }
  if (plan) *plan = p;
  return OK;
}
#endif

kvx_status_t cache_rules(const kvx_cache_desc_t& c, Fp4Plan* fp4 = nullptr) {
  if (!KVX_MUT(ZERO_DIMS_ACCEPTED))
    KVX_REQUIRE(c.num_blocks != 0 && c.block_size != 0 && c.num_kv_heads != 0 && c.head_dim != 0);
  bool unsupported = false;
  KVX_TRY(cache_tensor_rules(c, c.k, unsupported));
  KVX_TRY(cache_tensor_rules(c, c.v, unsupported));
  KVX_REQUIRE(raw(c.k.memory) == raw(c.v.memory));
  if (fp4) *fp4 = Fp4Plan{};
#if KVX_ABI_VERSION_MINOR >= 2
  if (is_fp4_cache(c)) KVX_TRY(fp4_cache_rules(c, unsupported, fp4));
#endif
  return verdict(OK, unsupported);
}

/* ------------------------------------------------------------------------ */
/* Step 3, shared: IO tensors (R-IO, spec 6.8) and dtype pairs (R-CONVERT).   */

struct IoExpect {
  uint32_t num_tokens, num_kv_heads, head_dim;
  bool allow_4d;        /* gather: [groups, max_seq_len, H, D] too */
  uint64_t groups;      /* seq_count * beam_width */
  uint32_t max_seq_len;
};

kvx_status_t io_tensor_rules(const kvx_tensor_desc_t& t, int memory, const IoExpect& e,
                             bool& unsupported, IoTensorPlan* plan, int extra_dtype = 0) {
  KVX_REQUIRE(valid_cache_dtype(raw(t.dtype)) || (extra_dtype != 0 && raw(t.dtype) == extra_dtype));
  if (is_f4_dtype(raw(t.dtype))) { /* nibble addressing: contiguous head_dim pairs */
    const int nd = (int)t.ndim;
    if (nd >= 1 && nd <= KVX_MAX_TENSOR_DIMS) {
      if (t.stride[nd - 1] != 1) unsupported = true;
      for (int i = 0; i + 1 < nd; ++i)
        if (t.shape[i] > 1 && t.stride[i] % 2) unsupported = true;
    }
  }
  KVX_REQUIRE(raw(t.memory) == memory);
  KVX_REQUIRE(e.num_tokens == 0 || t.data != nullptr);
  const int64_t H = e.num_kv_heads, D = e.head_dim;
  const int64_t dense[] = {e.num_tokens, H, D};
  plan->data = t.data;
  plan->dtype = t.dtype;
  if (shape_is(t, 3, dense)) {
    KVX_TRY(stride_rules(t.shape, t.stride, 3, /*zero_is_invalid=*/false, unsupported));
    plan->s_token = t.stride[0];
    plan->s_head = t.stride[1];
    plan->s_dim = t.stride[2];
    return OK;
  }
  KVX_REQUIRE(e.allow_4d && e.groups <= (uint64_t)INT64_MAX);
  const int64_t padded[] = {(int64_t)e.groups, e.max_seq_len, H, D};
  KVX_REQUIRE(shape_is(t, 4, padded));
  KVX_TRY(stride_rules(t.shape, t.stride, 4, /*zero_is_invalid=*/false, unsupported));
  /* Row r = g * max_seq_len + t: fold [g, t] into one token stride when the
   * strides allow it; otherwise this reference answers UNSUPPORTED (R-IO). */
  const int64_t s0 = t.stride[0], s1 = t.stride[1];
  int64_t folded;
  if (e.groups <= 1) {
    plan->s_token = s1;
  } else if (e.max_seq_len <= 1) {
    plan->s_token = s0;
  } else if (!__builtin_mul_overflow(s1, (int64_t)e.max_seq_len, &folded) && folded == s0) {
    plan->s_token = s1;
  } else {
    unsupported = true;
  }
  plan->s_head = t.stride[2];
  plan->s_dim = t.stride[3];
  return OK;
}

/* io heads/dims, key and value tensors, and the dtype pair rules. */
kvx_status_t io_rules(const kvx_cache_desc_t& c, const kvx_kv_io_desc_t& io, const IoExpect& e, bool gather,
                      bool& unsupported, IoTensorPlan* key, IoTensorPlan* value) {
  if (KVX_MUT(ZERO_TOKENS_ERROR)) KVX_REQUIRE(io.num_tokens != 0);
  KVX_REQUIRE(io.num_kv_heads == c.num_kv_heads);
  KVX_REQUIRE(io.head_dim == c.head_dim);
  const bool fp4 = is_fp4_cache(c);
  const int extra = fp4 ? (int)c.k.dtype : 0; /* F4_E2M1 IO: a raw FP4 transfer */
  KVX_TRY(io_tensor_rules(io.key, c.k.memory, e, unsupported, key, extra)); /* cache memory: validated */
  KVX_TRY(io_tensor_rules(io.value, c.k.memory, e, unsupported, value, extra));
  if (fp4) { /* FP4: F16/BF16/F32 IO (quantize / dequantize) or F4_E2M1 on both sides (raw) */
    const bool kraw = is_f4_dtype(raw(io.key.dtype)), vraw = is_f4_dtype(raw(io.value.dtype));
    if (kraw != vraw || is_fp8(io.key.dtype) || is_fp8(io.value.dtype)) unsupported = true;
    return OK;
  }
  /* R-CONVERT: FP8 IO only with the same FP8 cache dtype (raw bytes); gather
   * from an FP8 cache only into its own dtype. */
  const kvx_dtype_t pairs[2][2] = {{io.key.dtype, c.k.dtype}, {io.value.dtype, c.v.dtype}};
  for (const auto& p : pairs) {
    if (is_fp8(p[0]) && p[0] != p[1]) unsupported = true;
    if (gather && is_fp8(p[1]) && p[0] != p[1]) unsupported = true;
  }
  return OK;
}

/* ------------------------------------------------------------------------ */
/* Step 3, write: slots and FP8 scales (R-WRITE, R-FP8).                      */

kvx_status_t scale_rules(const kvx_scale_desc_t& sd, const void* fallback, uint32_t num_kv_heads,
                         bool& unsupported, ScalePlan* out) {
  out->kind = SCALE_ONE;
  out->ptr = nullptr;
  if (sd.data != nullptr) {
    KVX_REQUIRE(raw(sd.dtype) == KVX_DTYPE_F32);
    switch (raw(sd.granularity)) {
      case KVX_SCALE_PER_TENSOR:
        out->kind = SCALE_PER_TENSOR;
        break;
      case KVX_SCALE_PER_HEAD:
        KVX_REQUIRE(sd.ndim == 1 && sd.shape[0] == (int64_t)num_kv_heads);
        if (per_head_values_apart(sd, num_kv_heads)) unsupported = true;
        out->kind = SCALE_PER_HEAD;
        break;
      case KVX_SCALE_PER_BLOCK:
      case KVX_SCALE_PER_BLOCK_HEAD:
        unsupported = true;
        break;
      default:
        return INVALID;
    }
    out->ptr = static_cast<const float*>(sd.data);
  } else if (fallback != nullptr) {
    out->kind = SCALE_PER_TENSOR;
    out->ptr = static_cast<const float*>(fallback);
  }
  return OK;
}

/* ------------------------------------------------------------------------ */
/* Step 3, gather: block table and sequence lengths (R-GATHER, 5.1, 7.1).     */

/* a * b * c * d in uint64, false on overflow. */
bool mul_u64(uint64_t a, uint64_t b, uint64_t c, uint64_t d, uint64_t* out) {
  uint64_t ab, abc;
  return !__builtin_mul_overflow(a, b, &ab) && !__builtin_mul_overflow(ab, c, &abc) &&
         !__builtin_mul_overflow(abc, d, out);
}

kvx_status_t table_rules(const kvx_cache_desc_t& c, const kvx_block_table_t& bt, bool& unsupported) {
  KVX_REQUIRE(bt.indices_count == 0 || bt.indices != nullptr);
  uint64_t want;
  switch (raw(bt.format)) {
    case KVX_BLOCK_TABLE_PACKED:
      KVX_REQUIRE(valid_index_dtype(raw(bt.index_dtype)));
      if (!KVX_MUT(PACKED_COUNT_UNCHECKED))
        KVX_REQUIRE((uint64_t)bt.seq_count * bt.max_blocks_per_seq == bt.indices_count);
      KVX_REQUIRE(bt.indptr_count == 0);
      KVX_REQUIRE(bt.beam_width == 1);
      return OK;
    case KVX_BLOCK_TABLE_RAGGED:
      KVX_REQUIRE(valid_index_dtype(raw(bt.index_dtype)));
      KVX_REQUIRE(valid_index_dtype(raw(bt.indptr_dtype)));
      KVX_REQUIRE(bt.indptr != nullptr);
      if (!KVX_MUT(SKIP_RAGGED_INDPTR_CHECK)) KVX_REQUIRE((uint64_t)bt.seq_count + 1 == bt.indptr_count);
      KVX_REQUIRE(bt.beam_width == 1);
      return OK;
    case KVX_BLOCK_TABLE_KV_OFFSETS: {
      KVX_REQUIRE(raw(bt.index_dtype) == KVX_DTYPE_S32);
      KVX_REQUIRE(bt.flags & KVX_BLOCK_TABLE_FLAG_KVCACHEINDEX);
      if (!KVX_MUT(KV_OFFSETS_NON_POW2)) KVX_REQUIRE((c.block_size & (c.block_size - 1)) == 0);
      KVX_REQUIRE(bt.beam_width >= 1);
      KVX_REQUIRE(mul_u64(bt.seq_count, bt.beam_width, 2, bt.max_blocks_per_seq, &want) &&
                  want == bt.indices_count);
      KVX_REQUIRE(bt.indptr_count == 0);
      KVX_REQUIRE(c.pool.primary != nullptr);
      if (is_fp4_cache(c)) { /* pools carry no scale pool: not an FP4 addressing mode */
        unsupported = true;
        return OK;
      }
      KVX_REQUIRE(mul_u64(c.num_kv_heads, c.block_size, c.head_dim, dtype_size(c.k.dtype), &want) &&
                  want == c.pool.bytes_per_block);
      if (c.k.dtype != c.v.dtype) unsupported = true;
      return OK;
    }
    default:
      return INVALID;
  }
}

/* ------------------------------------------------------------------------ */
/* Plans.                                                                     */

void* maybe_round_down(void* p) {
  if (KVX_MUT(MISALIGNED_ROUNDS_DOWN)) return reinterpret_cast<void*>(reinterpret_cast<uintptr_t>(p) & ~uintptr_t{15});
  return p;
}

CacheTensorPlan cache_plan(const kvx_tensor_desc_t& t) {
  CacheTensorPlan p{};
  p.data = maybe_round_down(t.data);
  p.dtype = t.dtype;
  int64_t s[KVX_MAX_TENSOR_DIMS];
  for (int i = 0; i < KVX_MAX_TENSOR_DIMS; ++i) s[i] = t.stride[i];
  if (KVX_MUT(IGNORE_STRIDES)) { /* canonical contiguous strides of the shape */
    uint64_t acc = 1;
    for (int i = (int)t.ndim - 1; i >= 0; --i) {
      s[i] = (int64_t)acc;
      acc *= (uint64_t)t.shape[i];
    }
  }
  int layout = static_cast<int>(t.layout);
  if (KVX_MUT(HND_AS_NHD) && layout == KVX_LAYOUT_BLOCK_HND) layout = KVX_LAYOUT_BLOCK_NHD;
  p.s_block = s[0];
  p.s_dim_inner = 0;
  p.pack = 1;
  switch (layout) {
    case KVX_LAYOUT_BLOCK_HND:
      p.s_head = s[1];
      p.s_token = s[2];
      p.s_dim_outer = s[3];
      break;
    case KVX_LAYOUT_BLOCK_HND_PACKED:
      p.s_head = s[1];
      p.s_dim_outer = s[2];
      p.s_token = s[3];
      p.s_dim_inner = s[4];
      p.pack = t.shape[4];
      break;
    default: /* NHD, CUSTOM */
      p.s_token = s[1];
      p.s_head = s[2];
      p.s_dim_outer = s[3];
      break;
  }
  return p;
}

#if KVX_ABI_VERSION_MINOR >= 2
/* Raw FP4 transfer (F4_E2M1 IO): the block scales travel in desc.fp4. */
template <class Desc>
kvx_status_t fp4_io_scales_rules(const kvx_cache_desc_t& c, const Desc& desc, const IoExpect& e, bool& unsupported,
                                 Fp4Plan* p) {
  KVX_REQUIRE(has_ext(desc));
  const kvx_fp4_io_scales_t& x = desc.fp4;
  KVX_REQUIRE(!too_small(x) && !too_small(x.key_scales) && !too_small(x.value_scales));
  IoExpect es = e;
  es.head_dim = c.head_dim / p->block_values;
  const int sdt = fp4_scale_dtype(p->format);
  KVX_TRY(io_tensor_rules(x.key_scales, c.k.memory, es, unsupported, &p->io_k_scales, KVX_DTYPE_UE8M0));
  KVX_TRY(io_tensor_rules(x.value_scales, c.k.memory, es, unsupported, &p->io_v_scales, KVX_DTYPE_UE8M0));
  KVX_REQUIRE(raw(x.key_scales.dtype) == sdt && raw(x.value_scales.dtype) == sdt);
  p->raw = true;
  return OK;
}
#endif

/* Step 3 for an FP4 cache (after io_rules) and the scale pool plans. */
template <class Desc>
kvx_status_t fp4_step3(const kvx_cache_desc_t& c, const Desc& desc, const IoExpect& e, bool& unsupported,
                       Fp4Plan* p) {
#if KVX_ABI_VERSION_MINOR >= 2
  if (p->format == 0) return OK;
  p->k_scales = cache_plan(c.fp4.k_scales);
  p->v_scales = cache_plan(c.fp4.v_scales);
  if (is_f4_dtype(raw(desc.io.key.dtype)) && is_f4_dtype(raw(desc.io.value.dtype)))
    return fp4_io_scales_rules(c, desc, e, unsupported, p);
#else
  (void)c, (void)desc, (void)e, (void)unsupported, (void)p;
#endif
  return OK;
}

}  // namespace

/* ------------------------------------------------------------------------ */
/* Entry points of the front end.                                             */

kvx_status_t check_cache_call(const kvx_cache_desc_t* cache) {
  if (cache == nullptr) return INVALID;
  if (cache_too_small(*cache, /*needs_pool=*/false)) return INVALID;
  if (!tail_is_zero(*cache)) return UNSUPPORTED;
  return cache_rules(*cache);
}

kvx_status_t resolve_write(const kvx_cache_desc_t* cache, const kvx_write_desc_t* desc, WritePlan* plan) {
  /* Step 1 */
  if (cache == nullptr || desc == nullptr) return INVALID;
  if (too_small(*desc)) return INVALID; /* before reading anything inside it */
  if (cache_too_small(*cache, /*needs_pool=*/false) || io_too_small(desc->io) || too_small(desc->slots) ||
      too_small(desc->k_scale_desc) || too_small(desc->v_scale_desc))
    return INVALID;
  if (!tail_is_zero(*cache) || !tail_is_zero(*desc)) return UNSUPPORTED;
  /* Step 2 */
  const kvx_cache_desc_t& c = *cache;
  KVX_TRY(cache_rules(c, &plan->fp4));
  /* Step 3 */
  const kvx_kv_io_desc_t& io = desc->io;
  const kvx_slot_mapping_t& sm = desc->slots;
  bool unsupported = false;
  const IoExpect e{io.num_tokens, c.num_kv_heads, c.head_dim, /*allow_4d=*/false, 0, 0};
  KVX_TRY(io_rules(c, io, e, /*gather=*/false, unsupported, &plan->key, &plan->value));
  KVX_TRY(fp4_step3(c, *desc, e, unsupported, &plan->fp4));
  KVX_REQUIRE(io.num_tokens == sm.token_count);
  KVX_REQUIRE(valid_index_dtype(raw(sm.dtype)));
  KVX_REQUIRE(io.num_tokens == 0 || sm.slots != nullptr);
  plan->k_scale = ScalePlan{SCALE_ONE, nullptr};
  plan->v_scale = ScalePlan{SCALE_ONE, nullptr};
  if (is_fp8(c.k.dtype))
    KVX_TRY(scale_rules(desc->k_scale_desc, desc->k_scale, c.num_kv_heads, unsupported, &plan->k_scale));
  if (is_fp8(c.v.dtype))
    KVX_TRY(scale_rules(desc->v_scale_desc, desc->v_scale, c.num_kv_heads, unsupported, &plan->v_scale));
  KVX_TRY(verdict(OK, unsupported));

  plan->memory = c.k.memory;
  plan->num_tokens = io.num_tokens;
  plan->num_kv_heads = c.num_kv_heads;
  plan->head_dim = c.head_dim;
  plan->block_size = c.block_size;
  plan->num_blocks = c.num_blocks;
  plan->k_cache = cache_plan(c.k);
  plan->v_cache = cache_plan(c.v);
  plan->key.data = maybe_round_down(plan->key.data);
  plan->value.data = maybe_round_down(plan->value.data);
  plan->slots = sm.slots;
  plan->slot_dtype = sm.dtype;
  plan->invalid_slot = sm.invalid_slot;
  return OK;
}

kvx_status_t resolve_gather(const kvx_cache_desc_t* cache, const kvx_gather_desc_t* desc, GatherPlan* plan) {
  /* Step 1 */
  if (cache == nullptr || desc == nullptr) return INVALID;
  if (too_small(*desc)) return INVALID;
  const kvx_block_table_t& bt = desc->block_table;
  const bool kv_offsets = raw(bt.format) == KVX_BLOCK_TABLE_KV_OFFSETS;
  if (cache_too_small(*cache, kv_offsets) || io_too_small(desc->io) || too_small(bt) ||
      too_small(desc->seq_lens))
    return INVALID;
  if (!tail_is_zero(*cache) || !tail_is_zero(*desc)) return UNSUPPORTED;
  /* Step 2 */
  const kvx_cache_desc_t& c = *cache;
  KVX_TRY(cache_rules(c, &plan->fp4));
  /* Step 3 */
  const kvx_kv_io_desc_t& io = desc->io;
  const kvx_seq_lens_t& sl = desc->seq_lens;
  bool unsupported = false;
  KVX_TRY(table_rules(c, bt, unsupported));
  uint64_t rows;
  KVX_REQUIRE(mul_u64(bt.seq_count, bt.beam_width, desc->max_seq_len, 1, &rows) && rows == io.num_tokens);
  if (!KVX_MUT(SEQ_COUNT_MISMATCH_UNCHECKED)) KVX_REQUIRE(sl.seq_count == bt.seq_count);
  KVX_REQUIRE(valid_index_dtype(raw(sl.dtype)));
  KVX_REQUIRE(bt.seq_count == 0 || sl.lengths != nullptr);
  const IoExpect e{io.num_tokens, c.num_kv_heads, c.head_dim, /*allow_4d=*/true,
                   (uint64_t)bt.seq_count * bt.beam_width, desc->max_seq_len};
  KVX_TRY(io_rules(c, io, e, /*gather=*/true, unsupported, &plan->key, &plan->value));
  KVX_TRY(fp4_step3(c, *desc, e, unsupported, &plan->fp4));
  KVX_TRY(verdict(OK, unsupported));

  plan->memory = c.k.memory;
  plan->num_kv_heads = c.num_kv_heads;
  plan->head_dim = c.head_dim;
  plan->block_size = c.block_size;
  plan->num_blocks = c.num_blocks;
  plan->seq_count = bt.seq_count;
  plan->beam_width = bt.beam_width;
  plan->max_seq_len = desc->max_seq_len;
  plan->max_blocks_per_seq = bt.max_blocks_per_seq;
  plan->k_cache = cache_plan(c.k);
  plan->v_cache = cache_plan(c.v);
  plan->key.data = maybe_round_down(plan->key.data);
  plan->value.data = maybe_round_down(plan->value.data);
  plan->format = bt.format;
  plan->indices = bt.indices;
  plan->index_dtype = bt.index_dtype;
  plan->indices_count = bt.indices_count;
  const bool ragged = bt.format == KVX_BLOCK_TABLE_RAGGED;
  plan->indptr = ragged ? bt.indptr : nullptr;
  plan->indptr_dtype = ragged ? bt.indptr_dtype : KVX_DTYPE_INVALID; /* unread otherwise */
  plan->seq_lens = sl.lengths;
  plan->seq_lens_dtype = sl.dtype;
  plan->pool_primary = kv_offsets ? c.pool.primary : nullptr;
  plan->pool_secondary = kv_offsets ? c.pool.secondary : nullptr;
  plan->bytes_per_block = kv_offsets ? c.pool.bytes_per_block : 0;
  return OK;
}

}  // namespace kvx_ref
