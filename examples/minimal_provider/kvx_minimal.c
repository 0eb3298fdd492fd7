/*
 * kvx_minimal.c -- a minimal KVX v1.1 provider, written from kvx_abi.h alone.
 *
 * Copy this to start your own provider. It certifies for the "core" profile of
 * kvx-conform on host memory:
 *   - kvx_get_version, size guards on every struct it reads,
 *   - every validation rule of spec 7.1 (for all three table formats, even the two
 *     it does not execute),
 *   - caches in F16, BF16 or F32 with layouts NHD or HND and any non-negative strides,
 *     IO tensors of the cache's dtype,
 *   - PACKED block tables with S32/S64 indices, S32/S64 slots and lengths,
 *   - invalid slots as no-ops, out-of-range slots and block ids as OUT_OF_RANGE.
 * Everything else (HND_PACKED, CUSTOM, FP8, RAGGED, KV_OFFSETS, device memory,
 * dtype conversion) answers KVX_STATUS_UNSUPPORTED, which the core profile allows.
 *
 * Build:  cc -O2 -shared -fPIC -I<kvx-conform>/csrc/include kvx_minimal.c -o libkvx_minimal.so
 * (or `make` / `cmake` in this folder), then:  kvx-conform run ./libkvx_minimal.so --profile core
 */
#define KVX_BUILD_PROVIDER 1
#include <stdint.h>
#include <string.h>

#include "kvx/kvx_abi.h"

#define CHECK(cond, status) \
  do {                      \
    if (!(cond)) return (status); \
  } while (0)

static int elem_size(kvx_dtype_t t) {
  switch (t) {
    case KVX_DTYPE_F16: case KVX_DTYPE_BF16: return 2;
    case KVX_DTYPE_F32: return 4;
    case KVX_DTYPE_F8_E4M3: case KVX_DTYPE_F8_E5M2: return 1;
    default: return 0;
  }
}

static int is_index_dtype(kvx_dtype_t t) { return t == KVX_DTYPE_S32 || t == KVX_DTYPE_S64; }

static int64_t read_index(const void* p, kvx_dtype_t t, uint64_t i) {
  if (t == KVX_DTYPE_S32) {
    int32_t v;
    memcpy(&v, (const char*)p + 4 * i, 4);
    return v;
  }
  int64_t v;
  memcpy(&v, (const char*)p + 8 * i, 8);
  return v;
}

/* Tail bytes beyond what we know must be zero (a newer minor's fields we cannot honour). */
static int tail_is_zero(const void* s, uint32_t size, size_t known) {
  const unsigned char* b = (const unsigned char*)s;
  for (size_t i = known; i < size; ++i)
    if (b[i]) return 0;
  return 1;
}

/* Offsets (in elements) of the four logical axes of a cache tensor. */
typedef struct {
  int64_t block, token, head, dim;
} axes_t;

static kvx_status_t check_tensor(const kvx_cache_desc_t* c, const kvx_tensor_desc_t* t, axes_t* ax) {
  CHECK(t->size >= sizeof(kvx_tensor_desc_t), KVX_STATUS_INVALID_ARGUMENT);
  CHECK(elem_size(t->dtype) != 0, KVX_STATUS_INVALID_ARGUMENT);
  CHECK(t->data != NULL, KVX_STATUS_INVALID_ARGUMENT);
  CHECK(t->memory >= KVX_MEMORY_HOST && t->memory <= KVX_MEMORY_UNIFIED, KVX_STATUS_INVALID_ARGUMENT);
  int64_t want[5];
  uint32_t nd;
  switch (t->layout) {
    case KVX_LAYOUT_BLOCK_NHD:
    case KVX_LAYOUT_BLOCK_CUSTOM:
      nd = 4; want[0] = c->num_blocks; want[1] = c->block_size; want[2] = c->num_kv_heads; want[3] = c->head_dim;
      break;
    case KVX_LAYOUT_BLOCK_HND:
      nd = 4; want[0] = c->num_blocks; want[1] = c->num_kv_heads; want[2] = c->block_size; want[3] = c->head_dim;
      break;
    case KVX_LAYOUT_BLOCK_HND_PACKED: {
      nd = 5;
      CHECK(t->ndim == 5, KVX_STATUS_INVALID_ARGUMENT);
      int64_t pack = t->shape[4];
      CHECK(pack > 0 && c->head_dim % pack == 0, KVX_STATUS_INVALID_ARGUMENT); /* spec 7.1 */
      want[0] = c->num_blocks; want[1] = c->num_kv_heads; want[2] = c->head_dim / pack;
      want[3] = c->block_size; want[4] = pack;
      break;
    }
    default:
      return KVX_STATUS_INVALID_ARGUMENT;
  }
  CHECK(t->ndim == nd, KVX_STATUS_INVALID_ARGUMENT);
  int64_t far = 0;
  for (uint32_t i = 0; i < nd; ++i) {
    CHECK(t->shape[i] == want[i], KVX_STATUS_INVALID_ARGUMENT); /* spec 7.1: shapes match */
    if (t->stride[i] < 0) return KVX_STATUS_UNSUPPORTED;
    CHECK(t->stride[i] > 0 || t->shape[i] == 1, KVX_STATUS_INVALID_ARGUMENT); /* aliasing */
    /* overflow-safe farthest offset */
    if (t->stride[i] && (t->shape[i] - 1) > (INT64_MAX - far) / t->stride[i]) return KVX_STATUS_INVALID_ARGUMENT;
    far += (t->shape[i] - 1) * t->stride[i];
  }
  /* What this provider executes: */
  if (t->layout == KVX_LAYOUT_BLOCK_NHD) {
    ax->block = t->stride[0]; ax->token = t->stride[1]; ax->head = t->stride[2]; ax->dim = t->stride[3];
  } else if (t->layout == KVX_LAYOUT_BLOCK_HND) {
    ax->block = t->stride[0]; ax->head = t->stride[1]; ax->token = t->stride[2]; ax->dim = t->stride[3];
  } else {
    return KVX_STATUS_UNSUPPORTED; /* HND_PACKED, CUSTOM */
  }
  if (t->dtype != KVX_DTYPE_F16 && t->dtype != KVX_DTYPE_BF16 && t->dtype != KVX_DTYPE_F32)
    return KVX_STATUS_UNSUPPORTED; /* FP8 */
  return KVX_STATUS_OK;
}

static kvx_status_t check_cache(const kvx_cache_desc_t* c, axes_t* k, axes_t* v) {
  CHECK(c != NULL, KVX_STATUS_INVALID_ARGUMENT);
  CHECK(c->size >= sizeof(kvx_cache_desc_t), KVX_STATUS_INVALID_ARGUMENT);
  if (!tail_is_zero(c, c->size, sizeof(kvx_cache_desc_t))) return KVX_STATUS_UNSUPPORTED;
  CHECK(c->k.size >= sizeof(kvx_tensor_desc_t) && c->v.size >= sizeof(kvx_tensor_desc_t), KVX_STATUS_INVALID_ARGUMENT);
  CHECK(c->num_blocks && c->block_size && c->num_kv_heads && c->head_dim, KVX_STATUS_INVALID_ARGUMENT); /* 7.1 */
  /* Structural checks of both tensors first, then what we can execute. */
  kvx_status_t sk = check_tensor(c, &c->k, k);
  kvx_status_t sv = check_tensor(c, &c->v, v);
  if (sk == KVX_STATUS_INVALID_ARGUMENT || sv == KVX_STATUS_INVALID_ARGUMENT) return KVX_STATUS_INVALID_ARGUMENT;
  CHECK(c->k.memory == c->v.memory, KVX_STATUS_INVALID_ARGUMENT);
  if (sk != KVX_STATUS_OK) return sk;
  if (sv != KVX_STATUS_OK) return sv;
  if (c->k.dtype != c->v.dtype || c->k.layout != c->v.layout) return KVX_STATUS_UNSUPPORTED;
  if (c->k.memory != KVX_MEMORY_HOST) return KVX_STATUS_UNSUPPORTED;
  return KVX_STATUS_OK;
}

/* IO tensors: [num_tokens, H, D] (or [S, T, H, D] for a gather), any strides. */
static kvx_status_t check_io(const kvx_cache_desc_t* c, const kvx_kv_io_desc_t* io, int64_t st[2][3], int gather,
                             uint32_t rows_outer, uint32_t rows_inner) {
  CHECK(io->size >= sizeof(kvx_kv_io_desc_t), KVX_STATUS_INVALID_ARGUMENT);
  CHECK(io->num_kv_heads == c->num_kv_heads && io->head_dim == c->head_dim, KVX_STATUS_INVALID_ARGUMENT);
  const kvx_tensor_desc_t* ts[2] = {&io->key, &io->value};
  for (int i = 0; i < 2; ++i) {
    const kvx_tensor_desc_t* t = ts[i];
    CHECK(t->size >= sizeof(kvx_tensor_desc_t), KVX_STATUS_INVALID_ARGUMENT);
    CHECK(elem_size(t->dtype) != 0, KVX_STATUS_INVALID_ARGUMENT);
    CHECK(t->memory == c->k.memory, KVX_STATUS_INVALID_ARGUMENT);
    CHECK(io->num_tokens == 0 || t->data != NULL, KVX_STATUS_INVALID_ARGUMENT);
    if (t->ndim == 3) {
      CHECK(t->shape[0] == io->num_tokens && t->shape[1] == io->num_kv_heads && t->shape[2] == io->head_dim,
            KVX_STATUS_INVALID_ARGUMENT);
      st[i][0] = t->stride[0]; st[i][1] = t->stride[1]; st[i][2] = t->stride[2];
    } else if (gather && t->ndim == 4) {
      CHECK(t->shape[0] == rows_outer && t->shape[1] == rows_inner && t->shape[2] == io->num_kv_heads &&
                t->shape[3] == io->head_dim, KVX_STATUS_INVALID_ARGUMENT);
      /* rows fold into one token axis only when [S, T] is contiguous in rows */
      if (rows_outer > 1 && t->stride[0] != (int64_t)rows_inner * t->stride[1]) return KVX_STATUS_UNSUPPORTED;
      st[i][0] = t->stride[1]; st[i][1] = t->stride[2]; st[i][2] = t->stride[3];
    } else {
      return KVX_STATUS_INVALID_ARGUMENT;
    }
    for (int j = 0; j < 3; ++j)
      if (st[i][j] < 0) return KVX_STATUS_UNSUPPORTED;
    if (t->dtype != c->k.dtype) return KVX_STATUS_UNSUPPORTED; /* no dtype conversion here */
  }
  return KVX_STATUS_OK;
}

static void copy_row(char* dst, int64_t dst_dim, const char* src, int64_t src_dim, int es, uint32_t d) {
  for (uint32_t i = 0; i < d; ++i) memcpy(dst + (size_t)(i * dst_dim) * es, src + (size_t)(i * src_dim) * es, es);
}

KVX_API kvx_status_t kvx_get_version(kvx_version_t* v) {
  CHECK(v != NULL && v->size >= sizeof(kvx_version_t), KVX_STATUS_INVALID_ARGUMENT);
  v->size = sizeof(kvx_version_t);
  v->abi_major = KVX_ABI_VERSION_MAJOR;
  v->abi_minor = KVX_ABI_VERSION_MINOR;
  v->abi_patch = KVX_ABI_VERSION_PATCH;
  return KVX_STATUS_OK;
}

KVX_API kvx_status_t kvx_validate_cache_desc(const kvx_cache_desc_t* c) {
  axes_t k, v;
  return check_cache(c, &k, &v);
}

KVX_API kvx_status_t kvx_write_kv(const kvx_cache_desc_t* c, const kvx_write_desc_t* w, void* stream) {
  (void)stream;
  axes_t ak, av;
  CHECK(c != NULL && w != NULL, KVX_STATUS_INVALID_ARGUMENT);
  CHECK(c->size >= sizeof(kvx_cache_desc_t) && w->size >= sizeof(kvx_write_desc_t), KVX_STATUS_INVALID_ARGUMENT);
  CHECK(w->slots.size >= sizeof(kvx_slot_mapping_t), KVX_STATUS_INVALID_ARGUMENT);
  CHECK(w->k_scale_desc.size >= sizeof(kvx_scale_desc_t) && w->v_scale_desc.size >= sizeof(kvx_scale_desc_t),
        KVX_STATUS_INVALID_ARGUMENT);
  kvx_status_t s = check_cache(c, &ak, &av);
  if (s != KVX_STATUS_OK) return s;
  if (!tail_is_zero(w, w->size, sizeof(kvx_write_desc_t))) return KVX_STATUS_UNSUPPORTED;
  int64_t io[2][3];
  s = check_io(c, &w->io, io, 0, 0, 0);
  if (s != KVX_STATUS_OK) return s;
  CHECK(w->slots.token_count == w->io.num_tokens, KVX_STATUS_INVALID_ARGUMENT);
  CHECK(is_index_dtype(w->slots.dtype), KVX_STATUS_INVALID_ARGUMENT);
  CHECK(w->io.num_tokens == 0 || w->slots.slots != NULL, KVX_STATUS_INVALID_ARGUMENT);
  const uint64_t nslots = (uint64_t)c->num_blocks * c->block_size;
  /* Pre-scan: an out-of-range slot fails the call before anything is written. */
  for (uint32_t n = 0; n < w->io.num_tokens; ++n) {
    int64_t slot = read_index(w->slots.slots, w->slots.dtype, n);
    if (slot < 0 || slot == w->slots.invalid_slot) continue;
    if ((uint64_t)slot >= nslots) return KVX_STATUS_OUT_OF_RANGE;
  }
  const int es = elem_size(c->k.dtype);
  for (uint32_t n = 0; n < w->io.num_tokens; ++n) {
    int64_t slot = read_index(w->slots.slots, w->slots.dtype, n);
    if (slot < 0 || slot == w->slots.invalid_slot) continue; /* spec 5.2: no-op */
    int64_t b = slot / c->block_size, t = slot % c->block_size;
    for (uint32_t h = 0; h < c->num_kv_heads; ++h) {
      char* kd = (char*)c->k.data + (size_t)(b * ak.block + t * ak.token + h * ak.head) * es;
      char* vd = (char*)c->v.data + (size_t)(b * av.block + t * av.token + h * av.head) * es;
      const char* ks = (const char*)w->io.key.data + (size_t)(n * io[0][0] + h * io[0][1]) * es;
      const char* vs = (const char*)w->io.value.data + (size_t)(n * io[1][0] + h * io[1][1]) * es;
      copy_row(kd, ak.dim, ks, io[0][2], es, c->head_dim);
      copy_row(vd, av.dim, vs, io[1][2], es, c->head_dim);
    }
  }
  return KVX_STATUS_OK;
}

KVX_API kvx_status_t kvx_gather_kv(const kvx_cache_desc_t* c, const kvx_gather_desc_t* g, void* stream) {
  (void)stream;
  axes_t ak, av;
  CHECK(c != NULL && g != NULL, KVX_STATUS_INVALID_ARGUMENT);
  CHECK(c->size >= sizeof(kvx_cache_desc_t) && g->size >= sizeof(kvx_gather_desc_t), KVX_STATUS_INVALID_ARGUMENT);
  const kvx_block_table_t* bt = &g->block_table;
  CHECK(bt->size >= sizeof(kvx_block_table_t) && g->seq_lens.size >= sizeof(kvx_seq_lens_t), KVX_STATUS_INVALID_ARGUMENT);
  kvx_status_t s = check_cache(c, &ak, &av);
  if (s != KVX_STATUS_OK) return s;
  if (!tail_is_zero(g, g->size, sizeof(kvx_gather_desc_t))) return KVX_STATUS_UNSUPPORTED;
  /* Spec 5.1 / 7.1 table rules, for every format. */
  const uint64_t S = bt->seq_count, M = bt->max_blocks_per_seq;
  switch (bt->format) {
    case KVX_BLOCK_TABLE_PACKED:
      CHECK(is_index_dtype(bt->index_dtype), KVX_STATUS_INVALID_ARGUMENT);
      CHECK(bt->indices_count == S * M && bt->indptr_count == 0 && bt->beam_width == 1, KVX_STATUS_INVALID_ARGUMENT);
      CHECK(bt->indices_count == 0 || bt->indices != NULL, KVX_STATUS_INVALID_ARGUMENT);
      break;
    case KVX_BLOCK_TABLE_RAGGED:
      CHECK(is_index_dtype(bt->index_dtype) && is_index_dtype(bt->indptr_dtype), KVX_STATUS_INVALID_ARGUMENT);
      CHECK(bt->indptr != NULL && bt->indptr_count == S + 1 && bt->beam_width == 1, KVX_STATUS_INVALID_ARGUMENT);
      return KVX_STATUS_UNSUPPORTED;
    case KVX_BLOCK_TABLE_KV_OFFSETS:
      CHECK(bt->index_dtype == KVX_DTYPE_S32 && (bt->flags & KVX_BLOCK_TABLE_FLAG_KVCACHEINDEX), KVX_STATUS_INVALID_ARGUMENT);
      CHECK((c->block_size & (c->block_size - 1)) == 0, KVX_STATUS_INVALID_ARGUMENT);
      CHECK(bt->beam_width >= 1 && bt->indptr_count == 0, KVX_STATUS_INVALID_ARGUMENT);
      CHECK(bt->indices_count == S * bt->beam_width * 2 * M, KVX_STATUS_INVALID_ARGUMENT);
      return KVX_STATUS_UNSUPPORTED;
    default:
      return KVX_STATUS_INVALID_ARGUMENT;
  }
  CHECK(g->seq_lens.seq_count == bt->seq_count && is_index_dtype(g->seq_lens.dtype), KVX_STATUS_INVALID_ARGUMENT);
  CHECK(S == 0 || g->seq_lens.lengths != NULL, KVX_STATUS_INVALID_ARGUMENT);
  CHECK((uint64_t)g->io.num_tokens == S * g->max_seq_len, KVX_STATUS_INVALID_ARGUMENT);
  int64_t io[2][3];
  s = check_io(c, &g->io, io, 1, bt->seq_count, g->max_seq_len);
  if (s != KVX_STATUS_OK) return s;
  /* Pre-scan lengths and block ids. */
  for (uint64_t q = 0; q < S; ++q) {
    int64_t len = read_index(g->seq_lens.lengths, g->seq_lens.dtype, q);
    CHECK(len >= 0, KVX_STATUS_INVALID_ARGUMENT);
    uint64_t n = (uint64_t)len < g->max_seq_len ? (uint64_t)len : g->max_seq_len;
    uint64_t blocks = (n + c->block_size - 1) / c->block_size;
    CHECK(blocks <= M, KVX_STATUS_OUT_OF_RANGE);
    for (uint64_t j = 0; j < blocks; ++j) {
      int64_t id = read_index(bt->indices, bt->index_dtype, q * M + j);
      CHECK(id >= 0 && (uint64_t)id < c->num_blocks, KVX_STATUS_OUT_OF_RANGE);
    }
  }
  const int es = elem_size(c->k.dtype);
  for (uint64_t q = 0; q < S; ++q) {
    int64_t len = read_index(g->seq_lens.lengths, g->seq_lens.dtype, q);
    uint64_t n = (uint64_t)len < g->max_seq_len ? (uint64_t)len : g->max_seq_len;
    for (uint64_t t = 0; t < n; ++t) {
      int64_t b = read_index(bt->indices, bt->index_dtype, q * M + t / c->block_size);
      int64_t off = (int64_t)(t % c->block_size);
      int64_t row = (int64_t)(q * g->max_seq_len + t);
      for (uint32_t h = 0; h < c->num_kv_heads; ++h) {
        const char* ks = (const char*)c->k.data + (size_t)(b * ak.block + off * ak.token + h * ak.head) * es;
        const char* vs = (const char*)c->v.data + (size_t)(b * av.block + off * av.token + h * av.head) * es;
        char* kd = (char*)g->io.key.data + (size_t)(row * io[0][0] + h * io[0][1]) * es;
        char* vd = (char*)g->io.value.data + (size_t)(row * io[1][0] + h * io[1][1]) * es;
        copy_row(kd, io[0][2], ks, ak.dim, es, c->head_dim);
        copy_row(vd, io[1][2], vs, av.dim, es, c->head_dim);
      }
    }
  }
  return KVX_STATUS_OK;
}
