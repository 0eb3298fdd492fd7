/*
 * hwconv_front.c -- the front end of the hwconv test providers (hwconv.h): every
 * descriptor rule of docs/spec-readings.md in R-ORDER, then the backend. Within a
 * step an INVALID_ARGUMENT rule wins over a refusal (UNSUPPORTED); a refusal is
 * reported only when the call is well formed.
 */
#define KVX_BUILD_PROVIDER 1
#include <string.h>

#include "hwconv.h"

#define OK KVX_STATUS_OK
#define BAD KVX_STATUS_INVALID_ARGUMENT
#define NOPE KVX_STATUS_UNSUPPORTED

#define REQUIRE(c)              \
  do {                          \
    if (!(c)) return BAD;       \
  } while (0)
#define TRY(e)                  \
  do {                          \
    kvx_status_t st_ = (e);     \
    if (st_ != OK) return st_;  \
  } while (0)

/* ---------------------------------------------------------------- step 1 (R-SIZE) */

/* The unknown tail of a newer minor's top-level struct must be zero (else we
 * cannot honour it: UNSUPPORTED). */
static int tail_zero(const void* s, uint32_t size, size_t known) {
  const unsigned char* p = (const unsigned char*)s;
  if (size <= known) return 1;
  if (size > 65536u) return 0;
  for (uint32_t i = (uint32_t)known; i < size; ++i)
    if (p[i]) return 0;
  return 1;
}

#define SMALL(s, T) ((s).size < sizeof(T))

/* ---------------------------------------------------------------- shapes, strides */

static int cache_dtype_ok(int dt) {
  return dt == KVX_DTYPE_F16 || dt == KVX_DTYPE_BF16 || dt == KVX_DTYPE_F32 || dt == KVX_DTYPE_F8_E4M3 ||
         dt == KVX_DTYPE_F8_E5M2;
}
static int index_dtype_ok(int dt) { return dt == KVX_DTYPE_S32 || dt == KVX_DTYPE_S64; }
static int memory_ok(int m) {
  return m == KVX_MEMORY_HOST || m == KVX_MEMORY_DEVICE || m == KVX_MEMORY_UNIFIED;
}

/* The farthest element offset sum((n-1)*|s|) fits int64; a zero stride on an
 * extent > 1 is invalid when `no_alias`; a negative stride is refused. */
static kvx_status_t strides(const int64_t* shape, const int64_t* stride, uint32_t nd, int no_alias, int* refuse) {
  int64_t span = 0;
  for (uint32_t i = 0; i < nd; ++i) {
    int64_t n = shape[i], s = stride[i], term;
    if (s < 0) *refuse = 1;
    if (n <= 1) continue;
    if (s == 0 && no_alias) return BAD;
    if (s == INT64_MIN) return BAD;
    if (__builtin_mul_overflow(n - 1, s < 0 ? -s : s, &term) || __builtin_add_overflow(span, term, &span))
      return BAD;
  }
  return OK;
}

static int shape_eq(const kvx_tensor_desc_t* t, uint32_t nd, const int64_t* e) {
  if (t->ndim != nd) return 0;
  for (uint32_t i = 0; i < nd; ++i)
    if (t->shape[i] != e[i]) return 0;
  return 1;
}

/* ---------------------------------------------------------------- step 2 (R-CACHE) */

static kvx_status_t cache_tensor(const kvx_cache_desc_t* c, const kvx_tensor_desc_t* t, int* refuse) {
  const int64_t nb = c->num_blocks, bs = c->block_size, H = c->num_kv_heads, D = c->head_dim;
  int64_t e[5];
  uint32_t nd = 4;
  REQUIRE(cache_dtype_ok((int)t->dtype));
  switch ((int)t->layout) {
    case KVX_LAYOUT_BLOCK_NHD:
    case KVX_LAYOUT_BLOCK_CUSTOM:
      e[0] = nb, e[1] = bs, e[2] = H, e[3] = D;
      if ((int)t->layout == KVX_LAYOUT_BLOCK_CUSTOM) *refuse = 1; /* not served */
      break;
    case KVX_LAYOUT_BLOCK_HND:
      e[0] = nb, e[1] = H, e[2] = bs, e[3] = D;
      break;
    case KVX_LAYOUT_BLOCK_HND_PACKED:
      nd = 5;
      REQUIRE(t->ndim == 5 && t->shape[4] > 0 && D % t->shape[4] == 0);
      e[0] = nb, e[1] = H, e[2] = D / t->shape[4], e[3] = bs, e[4] = t->shape[4];
      *refuse = 1; /* not served */
      break;
    default:
      return BAD;
  }
  REQUIRE(shape_eq(t, nd, e));
  REQUIRE(t->data != NULL);
  REQUIRE(memory_ok((int)t->memory));
  return strides(t->shape, t->stride, nd, 1, refuse);
}

static kvx_status_t cache_rules(const kvx_cache_desc_t* c) {
  int refuse = 0;
  REQUIRE(c->num_blocks && c->block_size && c->num_kv_heads && c->head_dim);
  TRY(cache_tensor(c, &c->k, &refuse));
  TRY(cache_tensor(c, &c->v, &refuse));
  REQUIRE(c->k.memory == c->v.memory);
  return refuse ? NOPE : OK;
}

static void cache_plan(const kvx_tensor_desc_t* t, hw_cache_tensor* p) {
  p->data = t->data;
  p->dtype = (int)t->dtype;
  p->s_block = t->stride[0];
  p->s_dim = t->stride[3];
  if ((int)t->layout == KVX_LAYOUT_BLOCK_HND) {
    p->s_head = t->stride[1];
    p->s_token = t->stride[2];
  } else {
    p->s_token = t->stride[1];
    p->s_head = t->stride[2];
  }
}

/* ---------------------------------------------------------------- step 3 (R-IO) */

/* groups / rows: the 4-D gather form [groups, rows, H, D] (groups 0: write, 3-D only). */
static kvx_status_t io_tensor(const kvx_cache_desc_t* c, const kvx_kv_io_desc_t* io, const kvx_tensor_desc_t* t,
                              int cache_dt, int gather, uint64_t groups, uint32_t rows, int* refuse,
                              hw_io_tensor* p) {
  const int dt = (int)t->dtype;
  REQUIRE(cache_dtype_ok(dt));
  REQUIRE(t->memory == c->k.memory);
  REQUIRE(io->num_tokens == 0 || t->data != NULL);
  REQUIRE(t->ndim == 3 || (gather && t->ndim == 4));
  if (t->ndim == 3) {
    const int64_t e[3] = {io->num_tokens, io->num_kv_heads, io->head_dim};
    REQUIRE(shape_eq(t, 3, e));
    TRY(strides(t->shape, t->stride, 3, 0, refuse));
    p->rows_per_group = INT64_MAX;
    p->s_group = 0;
    p->s_row = t->stride[0];
    p->s_head = t->stride[1];
    p->s_dim = t->stride[2];
  } else {
    REQUIRE(groups <= (uint64_t)INT64_MAX);
    const int64_t e[4] = {(int64_t)groups, rows, io->num_kv_heads, io->head_dim};
    REQUIRE(shape_eq(t, 4, e));
    TRY(strides(t->shape, t->stride, 4, 0, refuse));
    p->rows_per_group = rows ? rows : 1;
    p->s_group = t->stride[0];
    p->s_row = t->stride[1];
    p->s_head = t->stride[2];
    p->s_dim = t->stride[3];
  }
  p->data = t->data;
  p->dtype = dt;
  /* R-CONVERT: FP8 on either side only as a raw copy of the same dtype, except a
   * quantizing write (F16/BF16/F32 IO into an FP8 cache). */
  if (hw_is_fp8(dt) && dt != cache_dt) *refuse = 1;
  if (gather && hw_is_fp8(cache_dt) && dt != cache_dt) *refuse = 1;
  return OK;
}

static kvx_status_t scale_rules(const kvx_scale_desc_t* sd, const void* fallback, uint32_t heads, int* refuse,
                                hw_scale* out) {
  out->ptr = NULL;
  out->head_stride = 0;
  if (sd->data == NULL) {
    out->ptr = (const float*)fallback;
    return OK;
  }
  REQUIRE((int)sd->dtype == KVX_DTYPE_F32);
  switch ((int)sd->granularity) {
    case KVX_SCALE_PER_TENSOR:
      break;
    case KVX_SCALE_PER_HEAD:
      REQUIRE(sd->ndim == 1 && sd->shape[0] == (int64_t)heads);
      /* readings R-FP8: head h's value at data[h * stride[0]], 0 and 1 adjacent; served */
      if (sd->stride[0] < 0) *refuse = 1;
      out->head_stride = sd->stride[0] > 1 ? sd->stride[0] : 1;
      break;
    case KVX_SCALE_PER_BLOCK:
    case KVX_SCALE_PER_BLOCK_HEAD:
      *refuse = 1;
      break;
    default:
      return BAD;
  }
  out->ptr = (const float*)sd->data;
  return OK;
}

/* ---------------------------------------------------------------- entry points */

KVX_API kvx_status_t kvx_get_version(kvx_version_t* v) {
  if (v == NULL || v->size < sizeof(kvx_version_t)) return BAD;
  v->size = sizeof(kvx_version_t);
  v->abi_major = 1;
  v->abi_minor = 1;
  v->abi_patch = 0;
  return OK;
}

KVX_API kvx_status_t kvx_validate_cache_desc(const kvx_cache_desc_t* c) {
  if (c == NULL) return BAD;
  if (SMALL(*c, kvx_cache_desc_t) || SMALL(c->k, kvx_tensor_desc_t) || SMALL(c->v, kvx_tensor_desc_t)) return BAD;
  if (!tail_zero(c, c->size, sizeof *c)) return NOPE;
  return cache_rules(c);
}

KVX_API kvx_status_t kvx_write_kv(const kvx_cache_desc_t* c, const kvx_write_desc_t* w, void* stream) {
  if (c == NULL || w == NULL) return BAD;
  if (SMALL(*w, kvx_write_desc_t)) return BAD;
  if (SMALL(*c, kvx_cache_desc_t) || SMALL(c->k, kvx_tensor_desc_t) || SMALL(c->v, kvx_tensor_desc_t) ||
      SMALL(w->io, kvx_kv_io_desc_t) || SMALL(w->io.key, kvx_tensor_desc_t) ||
      SMALL(w->io.value, kvx_tensor_desc_t) || SMALL(w->slots, kvx_slot_mapping_t) ||
      SMALL(w->k_scale_desc, kvx_scale_desc_t) || SMALL(w->v_scale_desc, kvx_scale_desc_t))
    return BAD;
  if (!tail_zero(c, c->size, sizeof *c) || !tail_zero(w, w->size, sizeof *w)) return NOPE;
  TRY(cache_rules(c));
  const kvx_kv_io_desc_t* io = &w->io;
  hw_write_plan p;
  memset(&p, 0, sizeof p);
  int refuse = 0;
  REQUIRE(io->num_kv_heads == c->num_kv_heads && io->head_dim == c->head_dim);
  REQUIRE(io->num_tokens == w->slots.token_count);
  TRY(io_tensor(c, io, &io->key, (int)c->k.dtype, 0, 0, 0, &refuse, &p.key));
  TRY(io_tensor(c, io, &io->value, (int)c->v.dtype, 0, 0, 0, &refuse, &p.value));
  REQUIRE(index_dtype_ok((int)w->slots.dtype));
  REQUIRE(io->num_tokens == 0 || w->slots.slots != NULL);
  if (hw_is_fp8((int)c->k.dtype)) TRY(scale_rules(&w->k_scale_desc, w->k_scale, c->num_kv_heads, &refuse, &p.k_scale));
  if (hw_is_fp8((int)c->v.dtype)) TRY(scale_rules(&w->v_scale_desc, w->v_scale, c->num_kv_heads, &refuse, &p.v_scale));
  if (refuse) return NOPE;
  if ((int)c->k.memory != hw_backend_memory()) return NOPE; /* step 4 */
  if (io->num_tokens == 0) return OK;
  p.num_tokens = io->num_tokens;
  p.num_kv_heads = c->num_kv_heads;
  p.head_dim = c->head_dim;
  p.block_size = c->block_size;
  p.num_blocks = c->num_blocks;
  cache_plan(&c->k, &p.k);
  cache_plan(&c->v, &p.v);
  p.slots = w->slots.slots;
  p.slot_dtype = (int)w->slots.dtype;
  p.invalid_slot = w->slots.invalid_slot;
  return hw_backend_write(&p, stream);
}

KVX_API kvx_status_t kvx_gather_kv(const kvx_cache_desc_t* c, const kvx_gather_desc_t* g, void* stream) {
  if (c == NULL || g == NULL) return BAD;
  if (SMALL(*g, kvx_gather_desc_t)) return BAD;
  const kvx_block_table_t* bt = &g->block_table;
  const int kv_offsets = (int)bt->format == KVX_BLOCK_TABLE_KV_OFFSETS;
  if (SMALL(*c, kvx_cache_desc_t) || SMALL(c->k, kvx_tensor_desc_t) || SMALL(c->v, kvx_tensor_desc_t) ||
      (kv_offsets && SMALL(c->pool, kvx_pool_desc_t)) || SMALL(g->io, kvx_kv_io_desc_t) ||
      SMALL(g->io.key, kvx_tensor_desc_t) || SMALL(g->io.value, kvx_tensor_desc_t) ||
      SMALL(*bt, kvx_block_table_t) || SMALL(g->seq_lens, kvx_seq_lens_t))
    return BAD;
  if (!tail_zero(c, c->size, sizeof *c) || !tail_zero(g, g->size, sizeof *g)) return NOPE;
  TRY(cache_rules(c));
  const kvx_kv_io_desc_t* io = &g->io;
  hw_gather_plan p;
  memset(&p, 0, sizeof p);
  int refuse = 0;
  uint64_t beams = 1, want;
  REQUIRE(io->num_kv_heads == c->num_kv_heads && io->head_dim == c->head_dim);
  REQUIRE(bt->indices_count == 0 || bt->indices != NULL);
  switch ((int)bt->format) {
    case KVX_BLOCK_TABLE_PACKED:
      REQUIRE(index_dtype_ok((int)bt->index_dtype));
      REQUIRE((uint64_t)bt->seq_count * bt->max_blocks_per_seq == bt->indices_count);
      REQUIRE(bt->indptr_count == 0 && bt->beam_width == 1);
      break;
    case KVX_BLOCK_TABLE_RAGGED:
      REQUIRE(index_dtype_ok((int)bt->index_dtype) && index_dtype_ok((int)bt->indptr_dtype));
      REQUIRE(bt->indptr != NULL && (uint64_t)bt->seq_count + 1 == bt->indptr_count && bt->beam_width == 1);
      refuse = 1; /* not served */
      break;
    case KVX_BLOCK_TABLE_KV_OFFSETS: {
      const uint64_t bs = c->block_size;
      REQUIRE((int)bt->index_dtype == KVX_DTYPE_S32 && (bt->flags & KVX_BLOCK_TABLE_FLAG_KVCACHEINDEX));
      REQUIRE((bs & (bs - 1)) == 0 && bt->beam_width >= 1 && bt->indptr_count == 0);
      REQUIRE(!__builtin_mul_overflow((uint64_t)bt->seq_count * bt->beam_width, 2ull * bt->max_blocks_per_seq, &want) &&
              want == bt->indices_count);
      REQUIRE(c->pool.primary != NULL);
      REQUIRE((uint64_t)c->num_kv_heads * c->block_size * c->head_dim * hw_dtype_size((int)c->k.dtype) ==
              c->pool.bytes_per_block);
      beams = bt->beam_width;
      refuse = 1; /* not served (k.dtype != v.dtype would be refused as well) */
      break;
    }
    default:
      return BAD;
  }
  REQUIRE(!__builtin_mul_overflow((uint64_t)bt->seq_count * beams, (uint64_t)g->max_seq_len, &want) &&
          want == io->num_tokens);
  REQUIRE(g->seq_lens.seq_count == bt->seq_count);
  REQUIRE(index_dtype_ok((int)g->seq_lens.dtype));
  REQUIRE(g->seq_lens.seq_count == 0 || g->seq_lens.lengths != NULL);
  const int v_dt = kv_offsets ? (int)c->k.dtype : (int)c->v.dtype;
  TRY(io_tensor(c, io, &io->key, (int)c->k.dtype, 1, (uint64_t)bt->seq_count * beams, g->max_seq_len, &refuse,
                &p.key));
  TRY(io_tensor(c, io, &io->value, v_dt, 1, (uint64_t)bt->seq_count * beams, g->max_seq_len, &refuse, &p.value));
  if (refuse) return NOPE;
  if ((int)c->k.memory != hw_backend_memory()) return NOPE; /* step 4 */
  p.num_kv_heads = c->num_kv_heads;
  p.head_dim = c->head_dim;
  p.block_size = c->block_size;
  p.num_blocks = c->num_blocks;
  p.seq_count = bt->seq_count;
  p.max_blocks_per_seq = bt->max_blocks_per_seq;
  p.max_seq_len = g->max_seq_len;
  cache_plan(&c->k, &p.k);
  cache_plan(&c->v, &p.v);
  p.indices = bt->indices;
  p.index_dtype = (int)bt->index_dtype;
  p.lengths = g->seq_lens.lengths;
  p.lengths_dtype = (int)g->seq_lens.dtype;
  return hw_backend_gather(&p, stream);
}
