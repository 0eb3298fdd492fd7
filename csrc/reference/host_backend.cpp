/*
 * host_backend.cpp -- write and gather on host memory (KVX_MEMORY_HOST).
 *
 * The plan is well-formed (frontend.cpp). What is left here is R-ORDER step 5:
 * a full pre-scan of the data-dependent rules (R-WRITE slot range, R-DATA),
 * so that a call that returns an error writes nothing, then the copy with the
 * R-CONVERT / R-FP8 conversions of convert.h. Addresses follow the plan's
 * strides; elements are loaded and stored with memcpy (no alignment assumed).
 * No global mutable state (spec 7.2) outside the data_race / late_write mutants.
 */
#include <stdint.h>
#include <string.h>

#include <chrono>
#include <thread>
#include <utility>
#include <vector>

#include "convert.h"
#include "kvx_plan.h"
#include "mutants.h"

namespace kvx_ref {
namespace {

constexpr kvx_status_t OK = KVX_STATUS_OK;
constexpr kvx_status_t INVALID = KVX_STATUS_INVALID_ARGUMENT;
constexpr kvx_status_t OUT_OF_RANGE = KVX_STATUS_OUT_OF_RANGE;

/* ------------------------------------------------------------------------ */
/* Addressing. Offsets are formed in uint64 (wrapping, never UB); the front   */
/* end guarantees they stay inside the described tensors.                     */

inline char* at(const void* base, uint64_t elem_offset, size_t elem_size) {
  return reinterpret_cast<char*>(reinterpret_cast<uintptr_t>(base) + elem_offset * elem_size);
}

inline char* cache_elem(const CacheTensorPlan& c, uint64_t b, uint64_t t, uint64_t h, uint64_t d) {
  const uint64_t pack = (uint64_t)c.pack;
  const uint64_t off = b * (uint64_t)c.s_block + t * (uint64_t)c.s_token + h * (uint64_t)c.s_head +
                       (d / pack) * (uint64_t)c.s_dim_outer + (d % pack) * (uint64_t)c.s_dim_inner;
  return at(c.data, off, dtype_size(c.dtype));
}

inline char* io_elem(const IoTensorPlan& io, uint64_t row, uint64_t h, uint64_t d) {
  const uint64_t off = row * (uint64_t)io.s_token + h * (uint64_t)io.s_head + d * (uint64_t)io.s_dim;
  return at(io.data, off, dtype_size(io.dtype));
}

/* Token position inside its block (spec 4.1). */
inline uint64_t block_offset(uint64_t token, uint32_t block_size) {
  if (KVX_MUT(BLOCK_OFFSET_OFF_BY_ONE)) return (token + 1) % block_size;
  return token % block_size;
}

/* ceil(n / block_size); block_size 0 (only a mutant lets it through) needs
 * more blocks than any table has. */
inline uint64_t blocks_needed(uint64_t n, uint32_t block_size) {
  if (block_size == 0) return n ? UINT64_MAX : 0;
  return n / block_size + (n % block_size != 0);
}

/* ------------------------------------------------------------------------ */
/* Element transfer (R-CONVERT, R-FP8).                                       */

struct Xfer {
  kvx_dtype_t src, dst;
  size_t dst_size;
};

inline Xfer make_xfer(kvx_dtype_t src, kvx_dtype_t dst) {
  return Xfer{src, dst, dtype_size(dst)};
}

/* Converts one element at `src` into `out` (xf.dst_size bytes). Same dtype:
 * the bits, unchanged (NaN payloads kept, R-CONVERT). FP8 destination (write
 * into an FP8 cache): quantize with `scale`. Otherwise through FP32 with RNE. */
inline void convert_value(const char* src, unsigned char* out, const Xfer& xf, float scale) {
  if (xf.src == xf.dst) {
    memcpy(out, src, xf.dst_size);
    return;
  }
  const float f = load_as_f32(src, xf.src);
  if (is_fp8(xf.dst)) {
    const Rounding r = KVX_MUT(FP8_TRUNCATES) ? ROUND_TOWARD_ZERO : ROUND_NEAREST_EVEN;
    out[0] = quantize_fp8(xf.dst, f, KVX_MUT(FP8_IGNORES_SCALE) ? 1.0f : scale, r, !KVX_MUT(FP8_NO_SATURATE));
    return;
  }
  encode_from_f32(out, xf.dst, f, ROUND_NEAREST_EVEN,
                  KVX_MUT(BF16_TRUNCATES) ? ROUND_TOWARD_ZERO : ROUND_NEAREST_EVEN);
}

/* What a converted element's bytes hold: 0 finite non-zero, 1 zero, 2 NaN (inf: 0). */
inline int converted_kind(const unsigned char* out, kvx_dtype_t dt) {
  if (dt == KVX_DTYPE_F32) {
    uint32_t u;
    memcpy(&u, out, 4);
    return (u & 0x7FFFFFFFu) > 0x7F800000u ? 2 : (u & 0x7FFFFFFFu) == 0 ? 1 : 0;
  }
  if (dt == KVX_DTYPE_F16 || dt == KVX_DTYPE_BF16) {
    uint16_t h;
    memcpy(&h, out, 2);
    const uint16_t inf = dt == KVX_DTYPE_F16 ? 0x7C00u : 0x7F80u;
    return (h & 0x7FFFu) > inf ? 2 : (h & 0x7FFFu) == 0 ? 1 : 0;
  }
  const uint8_t m = out[0] & 0x7Fu;
  if (dt == KVX_DTYPE_F8_E4M3) return m == 0x7Fu ? 2 : m == 0 ? 1 : 0;
  return m > 0x7Cu ? 2 : m == 0 ? 1 : 0;
}

/* Three deliberate changes to a conversion's result (mutants.h): a NaN stored as
 * the largest finite value of its sign; a zero stored with the other sign; and
 * (the certifying variant) every NaN stored in another encoding. */
inline void mutate_converted(unsigned char* out, const Xfer& xf) {
  if (xf.src == xf.dst) return; /* plain copies are not conversions */
  const int kind = converted_kind(out, xf.dst);
  const size_t n = xf.dst_size;
  const unsigned char sign = out[n - 1] & 0x80u; /* little endian: the top byte */
  if (KVX_MUT(CONVERSION_NAN_TO_FINITE) && kind == 2) {
    static const unsigned char f16[2] = {0xFF, 0x7B}, bf16[2] = {0x7F, 0x7F}, f32[4] = {0xFF, 0xFF, 0x7F, 0x7F};
    if (xf.dst == KVX_DTYPE_F16) memcpy(out, f16, 2);
    else if (xf.dst == KVX_DTYPE_BF16) memcpy(out, bf16, 2);
    else if (xf.dst == KVX_DTYPE_F32) memcpy(out, f32, 4);
    else out[0] = xf.dst == KVX_DTYPE_F8_E4M3 ? 0x7Eu : 0x7Bu;
    out[n - 1] |= sign;
  }
  if (KVX_MUT(CONVERSION_ZERO_SIGN) && kind == 1) out[n - 1] ^= 0x80u;
  if (KVX_MUT(NAN_PAYLOAD_VARIANT) && kind == 2) {
    /* F16 / BF16 0x7FFF, F32 0x7FFFFFFF, E4M3 the other sign, E5M2 0x7F | sign */
    if (xf.dst == KVX_DTYPE_F8_E4M3) out[0] ^= 0x80u;
    else if (xf.dst == KVX_DTYPE_F8_E5M2) out[0] = (unsigned char)(sign | 0x7Fu);
    else {
      memset(out, 0xFF, n);
      out[n - 1] = 0x7F;
    }
  }
}

inline void convert_elem(const char* src, unsigned char* out, const Xfer& xf, float scale) {
  convert_value(src, out, xf, scale);
  if (KVX_MUT(CONVERSION_NAN_TO_FINITE) || KVX_MUT(CONVERSION_ZERO_SIGN) || KVX_MUT(NAN_PAYLOAD_VARIANT))
    mutate_converted(out, xf);
}

inline float scale_of(const ScalePlan& s, uint64_t head) {
  float v = 1.0f;
  if (s.kind == SCALE_PER_TENSOR) memcpy(&v, s.ptr, sizeof v);
  if (s.kind == SCALE_PER_HEAD) memcpy(&v, s.ptr + head, sizeof v);
  return v;
}

/* ------------------------------------------------------------------------ */
/* Stores. The reference stores directly; two mutants route stores through   */
/* shared or deferred state.                                                  */

struct DirectStore {
  void operator()(char* dst, const unsigned char* bytes, size_t n) { memcpy(dst, bytes, n); }
};

struct Staged {
  char* dst;
  unsigned char bytes[4];
  size_t n;
};

/* late_write mutant: remembers every store to replay it after returning. */
struct RecordingStore {
  std::vector<Staged> log;
  void operator()(char* dst, const unsigned char* bytes, size_t n) {
    memcpy(dst, bytes, n);
    Staged s{dst, {0, 0, 0, 0}, n};
    memcpy(s.bytes, bytes, n);
    log.push_back(s);
  }
};

/* data_race mutant: stages through one static buffer shared by all calls
 * (a single unused element in every other build). */
constexpr size_t kStageCapacity = KVX_MUT(DATA_RACE) ? size_t{1} << 16 : 1;
Staged g_stage[kStageCapacity];

struct SharedStagingStore {
  size_t count = 0;
  void operator()(char* dst, const unsigned char* bytes, size_t n) {
    if (count == kStageCapacity) flush();
    Staged& s = g_stage[count++];
    s.dst = dst;
    s.n = n;
    memcpy(s.bytes, bytes, n);
  }
  void flush() {
    std::this_thread::sleep_for(std::chrono::milliseconds(1)); /* a launch's latency */
    for (size_t i = 0; i < count; ++i) memcpy(g_stage[i].dst, g_stage[i].bytes, g_stage[i].n);
    count = 0;
  }
};

/* ------------------------------------------------------------------------ */
/* Write (spec 5.2, R-WRITE).                                                 */

inline int64_t slot_of(const WritePlan& p, uint64_t i) {
  const kvx_dtype_t dt = KVX_MUT(S64_SLOTS_AS_S32) ? KVX_DTYPE_S32 : p.slot_dtype;
  return load_index(p.slots, dt, i);
}

/* Slots < 0 and slots equal to invalid_slot are no-ops (spec 5.2, 7). */
inline bool is_noop_slot(const WritePlan& p, int64_t slot) {
  return slot < 0 || (!KVX_MUT(IGNORE_INVALID_SLOT) && slot == p.invalid_slot);
}

inline bool slot_in_range(const WritePlan& p, int64_t slot) {
  const uint64_t num_slots = (uint64_t)p.num_blocks * p.block_size;
  if (KVX_MUT(WRITE_PAST_LAST_BLOCK)) return (uint64_t)slot <= num_slots;
  return (uint64_t)slot < num_slots;
}

kvx_status_t prescan_write(const WritePlan& p) {
  for (uint64_t i = 0; i < p.num_tokens; ++i) {
    const int64_t slot = slot_of(p, i);
    if (KVX_MUT(NEGATIVE_SLOT_ERROR) && slot < 0 && slot != p.invalid_slot) return OUT_OF_RANGE;
    if (is_noop_slot(p, slot)) continue;
    if (!slot_in_range(p, slot) && !KVX_MUT(OOB_SLOT_OK)) return OUT_OF_RANGE;
  }
  return OK;
}

template <class Store>
void write_tokens(const WritePlan& p, Store& store) {
  const CacheTensorPlan& kc = p.k_cache;
  const CacheTensorPlan& vc = KVX_MUT(V_INTO_K) ? p.k_cache : p.v_cache;
  const Xfer kx = make_xfer(p.key.dtype, kc.dtype), vx = make_xfer(p.value.dtype, vc.dtype);
  unsigned char buf[4];
  for (uint64_t i = 0; i < p.num_tokens; ++i) {
    const int64_t slot = slot_of(p, i);
    if (is_noop_slot(p, slot) || !slot_in_range(p, slot)) continue;
    const uint64_t b = (uint64_t)slot / p.block_size, t = block_offset((uint64_t)slot, p.block_size);
    for (uint64_t h = 0; h < p.num_kv_heads; ++h) {
      const float ks = scale_of(p.k_scale, h), vs = scale_of(p.v_scale, h);
      for (uint64_t d = 0; d < p.head_dim; ++d) {
        convert_elem(io_elem(p.key, i, h, d), buf, kx, ks);
        store(cache_elem(kc, b, t, h, d), buf, kx.dst_size);
        convert_elem(io_elem(p.value, i, h, d), buf, vx, vs);
        store(cache_elem(vc, b, t, h, d), buf, vx.dst_size);
      }
    }
  }
}

/* ------------------------------------------------------------------------ */
/* Gather (spec 5.1, 5.3, R-GATHER, R-DATA).                                  */

constexpr uint32_t kKvIndexNull = 0xFFFFFFFFu;
constexpr uint32_t kKvIndexSecondary = 0x80000000u;

inline int64_t seq_len_of(const GatherPlan& p, uint64_t s) {
  const kvx_dtype_t dt = KVX_MUT(SEQ_LENS_S64_AS_S32) ? KVX_DTYPE_S32 : p.seq_lens_dtype;
  return load_index(p.seq_lens, dt, s);
}

/* Tokens gathered for sequence s: min(L, max_seq_len) (L >= 0, pre-scanned). */
inline uint64_t gather_len(const GatherPlan& p, uint64_t s) {
  const uint64_t L = (uint64_t)seq_len_of(p, s);
  const uint64_t cap =
      KVX_MUT(MAX_SEQ_LEN_IGNORED) ? (uint64_t)p.max_blocks_per_seq * p.block_size : p.max_seq_len;
  return L < cap ? L : cap;
}

inline int64_t indptr_of(const GatherPlan& p, uint64_t s) { return load_index(p.indptr, p.indptr_dtype, s); }

inline uint32_t kv_index_of(const GatherPlan& p, uint64_t s, uint64_t beam, uint64_t kv, uint64_t j) {
  if (KVX_MUT(BEAM_WIDTH_IGNORED)) beam = 0;
  const uint64_t e = ((s * p.beam_width + beam) * 2 + kv) * p.max_blocks_per_seq + j;
  return (uint32_t)load_index(p.indices, KVX_DTYPE_S32, e);
}

/* Block id of PACKED / RAGGED table entry e (S32 sign-extended, S64 as is). */
inline int64_t block_index_of(const GatherPlan& p, uint64_t e) {
  const int64_t id = load_index(p.indices, p.index_dtype, e);
  if (KVX_MUT(S64_BLOCK_IDS_TRUNCATED)) return (int64_t)(int32_t)(uint32_t)id; /* 64-bit ids kept in an int */
  return id;
}

inline bool block_id_ok(const GatherPlan& p, int64_t id) {
  return KVX_MUT(GATHER_BLOCK_ID_UNCHECKED) || (id >= 0 && (uint64_t)id < p.num_blocks);
}

inline uint64_t block_id_used(const GatherPlan& p, int64_t id) {
  if (KVX_MUT(GATHER_BLOCK_ID_UNCHECKED)) return (uint64_t)(((id % p.num_blocks) + p.num_blocks) % p.num_blocks);
  return (uint64_t)id;
}

kvx_status_t prescan_gather(const GatherPlan& p) {
  /* INVALID_ARGUMENT rules first: negative lengths, malformed RAGGED indptr. */
  for (uint64_t s = 0; s < p.seq_count; ++s)
    if (seq_len_of(p, s) < 0) return INVALID;
  if (p.format == KVX_BLOCK_TABLE_RAGGED) {
    int64_t prev = indptr_of(p, 0);
    if (prev < 0) return INVALID;
    for (uint64_t s = 1; s <= p.seq_count; ++s) {
      const int64_t cur = indptr_of(p, s);
      if (cur < prev) return INVALID;
      prev = cur;
    }
    if (prev != (int64_t)p.indices_count) return INVALID;
  }
  /* Then OUT_OF_RANGE: capacity and every block a gathered token uses. */
  for (uint64_t s = 0; s < p.seq_count; ++s) {
    const uint64_t n = gather_len(p, s);
    const uint64_t nblk = blocks_needed(n, p.block_size);
    if (nblk > p.max_blocks_per_seq) return OUT_OF_RANGE;
    switch (p.format) {
      case KVX_BLOCK_TABLE_PACKED:
        for (uint64_t j = 0; j < nblk; ++j)
          if (!block_id_ok(p, block_index_of(p, s * p.max_blocks_per_seq + j)))
            return OUT_OF_RANGE;
        break;
      case KVX_BLOCK_TABLE_RAGGED: {
        const int64_t lo = indptr_of(p, s), hi = indptr_of(p, s + 1);
        if (n > (uint64_t)(hi - lo)) return OUT_OF_RANGE;
        for (uint64_t t = 0; t < n; ++t)
          if (!block_id_ok(p, block_index_of(p, (uint64_t)lo + t))) return OUT_OF_RANGE;
        break;
      }
      case KVX_BLOCK_TABLE_KV_OFFSETS:
        for (uint64_t beam = 0; beam < p.beam_width; ++beam)
          for (uint64_t kv = 0; kv < 2; ++kv)
            for (uint64_t j = 0; j < nblk; ++j) {
              const uint32_t idx = kv_index_of(p, s, beam, kv, j);
              if (idx == kKvIndexNull) return OUT_OF_RANGE;
              if ((idx & kKvIndexSecondary) && p.pool_secondary == nullptr && !KVX_MUT(IGNORE_SECONDARY_POOL))
                return OUT_OF_RANGE;
            }
        break;
      default:
        return KVX_STATUS_INTERNAL_ERROR;
    }
  }
  return OK;
}

/* Where token t of (sequence s, beam) lives, for K and V. */
struct TokenSource {
  const GatherPlan& p;
  /* PACKED / RAGGED: cache block and offset; KV_OFFSETS: block bases. */
  uint64_t block = 0, offset = 0;
  const char* k_base = nullptr;
  const char* v_base = nullptr;

  TokenSource(const GatherPlan& plan, uint64_t s, uint64_t beam, uint64_t t) : p(plan) {
    const uint64_t j = t / p.block_size;
    switch (p.format) {
      case KVX_BLOCK_TABLE_PACKED:
        block = block_id_used(p, block_index_of(p, s * p.max_blocks_per_seq + j));
        offset = block_offset(t, p.block_size);
        break;
      case KVX_BLOCK_TABLE_RAGGED: {
        const uint64_t i = (uint64_t)indptr_of(p, s) + t;
        block = block_id_used(p, block_index_of(p, i));
        offset = block_offset(KVX_MUT(RAGGED_GLOBAL_OFFSET) ? i : t, p.block_size);
        break;
      }
      default: /* KV_OFFSETS */
        k_base = pool_block(kv_index_of(p, s, beam, 0, j));
        v_base = pool_block(kv_index_of(p, s, beam, 1, j));
        offset = block_offset(t, p.block_size);
        break;
    }
  }

  const char* pool_block(uint32_t idx) const {
    const bool secondary = (idx & kKvIndexSecondary) && !KVX_MUT(IGNORE_SECONDARY_POOL);
    const void* base = secondary ? p.pool_secondary : p.pool_primary;
    return reinterpret_cast<const char*>(reinterpret_cast<uintptr_t>(base) +
                                         (uint64_t)(idx & ~kKvIndexSecondary) * p.bytes_per_block);
  }

  /* Element (h, d) of K (kv 0) or V (kv 1). KV_OFFSETS blocks are HND
   * [H, block_size, D], contiguous, of the cache dtype (kvx-abi-1.1). */
  const char* elem(int kv, uint64_t h, uint64_t d) const {
    const CacheTensorPlan& c = kv ? p.v_cache : p.k_cache;
    if (p.format != KVX_BLOCK_TABLE_KV_OFFSETS) return cache_elem(c, block, offset, h, d);
    const uint64_t off = (h * p.block_size + offset) * p.head_dim + d;
    return at(kv ? v_base : k_base, off, dtype_size(c.dtype));
  }
};

template <class Store>
void gather_rows(const GatherPlan& p, Store& store) {
  const Xfer kx = make_xfer(p.k_cache.dtype, p.key.dtype), vx = make_xfer(p.v_cache.dtype, p.value.dtype);
  unsigned char buf[4];
  for (uint64_t s = 0; s < p.seq_count; ++s) {
    const uint64_t n = gather_len(p, s);
    for (uint64_t beam = 0; beam < p.beam_width; ++beam) {
      const uint64_t row0 = (s * p.beam_width + beam) * p.max_seq_len;
      for (uint64_t t = 0; t < n; ++t) {
        const TokenSource src(p, s, beam, t);
        for (uint64_t h = 0; h < p.num_kv_heads; ++h)
          for (uint64_t d = 0; d < p.head_dim; ++d) {
            convert_elem(src.elem(0, h, d), buf, kx, 1.0f);
            store(io_elem(p.key, row0 + t, h, d), buf, kx.dst_size);
            convert_elem(src.elem(1, h, d), buf, vx, 1.0f);
            store(io_elem(p.value, row0 + t, h, d), buf, vx.dst_size);
          }
      }
      if (KVX_MUT(WRITES_PADDING_ROWS)) { /* rows t >= n must stay untouched */
        const unsigned char zero[4] = {0, 0, 0, 0};
        for (uint64_t t = n; t < p.max_seq_len; ++t)
          for (uint64_t h = 0; h < p.num_kv_heads; ++h)
            for (uint64_t d = 0; d < p.head_dim; ++d) {
              store(io_elem(p.key, row0 + t, h, d), zero, kx.dst_size);
              store(io_elem(p.value, row0 + t, h, d), zero, vx.dst_size);
            }
      }
    }
  }
}

}  // namespace


kvx_status_t host_write(const WritePlan& p) {
  if (p.fp4.format) return host_fp4_write(p); /* KVX 1.2 FP4 cache: host_fp4.cpp */
  const kvx_status_t st = prescan_write(p);
  if (st != OK) return st;
  if (KVX_MUT(LATE_WRITE) || KVX_MUT(LATE_WRITE_DELAYED)) { /* spec 7.2 lifetime: writes again after returning */
    RecordingStore rec;
    write_tokens(p, rec);
    /* the delayed one writes long after the lifetime probe's wait */
    std::thread([log = std::move(rec.log)] {
      std::this_thread::sleep_for(std::chrono::milliseconds(KVX_MUT(LATE_WRITE_DELAYED) ? 1000 : 50));
      for (const Staged& s : log) memcpy(s.dst, s.bytes, s.n);
    }).detach();
    return OK;
  }
  DirectStore store;
  write_tokens(p, store);
  if (KVX_MUT(MODIFIES_INPUT_KEY) && p.num_tokens > 0) /* the header declares the input const */
    memset(io_elem(p.key, p.num_tokens - 1, p.num_kv_heads - 1, p.head_dim - 1), 0, dtype_size(p.key.dtype));
  if (KVX_MUT(MODIFIES_SLOTS)) /* "consumes" its const slot array */
    for (uint64_t i = 0; i < p.num_tokens; ++i) {
      char* at = const_cast<char*>(static_cast<const char*>(p.slots)) + i * dtype_size(p.slot_dtype);
      if (p.slot_dtype == KVX_DTYPE_S64) {
        const int64_t m = -1;
        memcpy(at, &m, sizeof m);
      } else {
        const int32_t m = -1;
        memcpy(at, &m, sizeof m);
      }
    }
  return OK;
}

kvx_status_t host_gather(const GatherPlan& p) {
  if (p.fp4.format) return host_fp4_gather(p); /* KVX 1.2 FP4 cache: host_fp4.cpp */
  const kvx_status_t st = prescan_gather(p);
  if (st != OK) return st;
  if (KVX_MUT(DATA_RACE)) { /* spec 7.2: shared scratch across calls */
    SharedStagingStore store;
    gather_rows(p, store);
    store.flush();
    return OK;
  }
  DirectStore store;
  gather_rows(p, store);
  return OK;
}

/* The pre-scan alone (kvx_plan.h): used by host_fp4.cpp and by the CUDA backend on
 * UNIFIED memory (host-readable metadata: UNIFIED answers the host's statuses). */
kvx_status_t host_prescan_write(const WritePlan& p) { return prescan_write(p); }
kvx_status_t host_prescan_gather(const GatherPlan& p) { return prescan_gather(p); }

}  // namespace kvx_ref
