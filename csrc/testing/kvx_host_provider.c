/*
 * kvx_host_provider.c -- an independent host-memory KVX v1.1 provider for kvx-conform's own
 * tests, and compile-time defect variants of it (csrc/testing/CMakeLists.txt builds one
 * library per KVX_HOST_DEFECT, libkvx_testing_host_<variant>.so).
 *
 * Written from kvx_abi.h and the spec (not from the bundled reference provider). It serves:
 *   - K and V caches in F16, BF16 or F32, each NHD or HND with any strides, negative ones too;
 *   - PACKED and RAGGED block tables, S32/S64 indices, slots and lengths;
 *   - IO tensors of the cache's own dtype (3-D, or 4-D for a gather), any strides.
 * It refuses an IO dtype other than the cache dtype with KVX_STATUS_INVALID_ARGUMENT (spec 8:
 * "unsupported field"), and HND_PACKED, CUSTOM, FP8, KV_OFFSETS and device memory with
 * KVX_STATUS_UNSUPPORTED. It reports ABI 1.1: no FP4 extension.
 *
 * Defects (one per build, -DKVX_HOST_DEFECT=...):
 *   DEFECT_NONE           correct
 *   DEFECT_IGNORE_STRIDES cache tensors addressed with canonical strides (spec 4.2 MUST honor strides)
 *   DEFECT_RAGGED_SHORT   RAGGED gather stops one row short of a sequence's indptr range
 *                         (off by one: rows i < indptr[s+1] - 1)
 *   DEFECT_LATE_WRITE     a write returns, then a detached thread stores the same elements again
 *                         KVX_HOST_LATE_MS (default 50) ms later (spec 7.2 MUST NOT retain pointers)
 *   DEFECT_ABS_STRIDES    a negative stride read as its magnitude, cache and IO (spec 4.2 MUST
 *                         honor strides)
 *   DEFECT_SCRIBBLE_INPUT a write negates the caller's first slot in place and puts it back
 *                         before returning (spec 7.2 / const inputs: no change is left to see)
 *   DEFECT_TOUCH_DESC     a write stores the write descriptor's invalid_slot over itself (a store
 *                         into a const descriptor that changes no byte)
 *   DEFECT_HARNESS_DETECT a write returns OK and writes nothing unless the environment names a
 *                         pytest test or worker (correct only where it believes it is tested)
 *   DEFECT_MEMO           a write or gather whose descriptors and slots / table and lengths equal
 *                         one of the last 16 calls' returns OK without work (a benchmark repeats
 *                         identical calls; spec 7.2: the API is stateless aside from user buffers)
 */
#define DEFECT_NONE 0
#define DEFECT_IGNORE_STRIDES 1
#define DEFECT_RAGGED_SHORT 2
#define DEFECT_LATE_WRITE 3
#define DEFECT_ABS_STRIDES 4
#define DEFECT_SCRIBBLE_INPUT 5
#define DEFECT_TOUCH_DESC 6
#define DEFECT_HARNESS_DETECT 7
#define DEFECT_MEMO 8
#ifndef KVX_HOST_DEFECT
#define KVX_HOST_DEFECT DEFECT_NONE
#endif
#ifndef KVX_HOST_LATE_MS
#define KVX_HOST_LATE_MS 50
#endif
#if KVX_HOST_DEFECT == DEFECT_LATE_WRITE
#include <pthread.h>
#include <stdlib.h>
#include <time.h>
#endif
#define KVX_BUILD_PROVIDER 1
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kvx/kvx_abi.h"

#define INV KVX_STATUS_INVALID_ARGUMENT
#define UNS KVX_STATUS_UNSUPPORTED
#define OOR KVX_STATUS_OUT_OF_RANGE
#define REQUIRE(cond, status) \
  do {                        \
    if (!(cond)) return (status); \
  } while (0)

/* ------------------------------------------------------------------ small helpers */

/* Bytes per element of a cache / IO dtype; 0 for anything else. */
static int elem_size(int t) {
  switch (t) {
    case KVX_DTYPE_F16: case KVX_DTYPE_BF16: return 2;
    case KVX_DTYPE_F32: return 4;
    case KVX_DTYPE_F8_E4M3: case KVX_DTYPE_F8_E5M2: return 1;
    default: return 0;
  }
}

static int is_index_dtype(int t) { return t == KVX_DTYPE_S32 || t == KVX_DTYPE_S64; }
static int is_valid_memory(int m) { return m == KVX_MEMORY_HOST || m == KVX_MEMORY_DEVICE || m == KVX_MEMORY_UNIFIED; }
/* The dtypes this provider stores and copies (no FP8, no conversion). */
static int is_served_dtype(int t) { return t == KVX_DTYPE_F16 || t == KVX_DTYPE_BF16 || t == KVX_DTYPE_F32; }

/* Element i of an S32 (sign-extended) or S64 array. */
static int64_t read_index(const void* p, int t, uint64_t i) {
  if (t == KVX_DTYPE_S32) {
    int32_t v;
    memcpy(&v, (const char*)p + 4 * i, 4);
    return v;
  }
  int64_t v;
  memcpy(&v, (const char*)p + 8 * i, 8);
  return v;
}

/* Bytes past the v1.1 struct that a newer minor may have added: all zero? */
static int tail_is_zero(const void* s, uint32_t size, size_t known) {
  const unsigned char* b = (const unsigned char*)s;
  for (size_t i = known; i < size; ++i)
    if (b[i]) return 0;
  return 1;
}

/* The farthest element offset sum((shape-1) * |stride|) fits in int64 (no wrap, ever). */
static int offsets_fit(uint32_t nd, const int64_t* shape, const int64_t* stride) {
  uint64_t far = 0;
  for (uint32_t i = 0; i < nd; ++i) {
    if (shape[i] <= 0) return 1; /* an empty tensor addresses nothing */
  }
  for (uint32_t i = 0; i < nd; ++i) {
    uint64_t n = (uint64_t)shape[i] - 1;
    uint64_t s = stride[i] < 0 ? (uint64_t)0 - (uint64_t)stride[i] : (uint64_t)stride[i];
    if (n == 0 || s == 0) continue;
    if (n > ((uint64_t)INT64_MAX - far) / s) return 0;
    far += n * s;
  }
  return 1;
}

/* Element strides of the four logical axes of a cache tensor this provider executes. */
typedef struct {
  int64_t block, token, head, dim;
  int es; /* bytes per element */
} cache_axes_t;

/* Element strides of an IO tensor: row (outer, inner) and head / dim. */
typedef struct {
  int64_t outer, inner, head, dim; /* 3-D: row r at r*outer (inner unused); 4-D: s*outer + t*inner */
  int ndim, es;
} io_axes_t;

/* ------------------------------------------------------------------ step 1: size guards */

static kvx_status_t sizes_cache(const kvx_cache_desc_t* c) {
  REQUIRE(c != NULL, INV);
  REQUIRE(c->size >= sizeof(kvx_cache_desc_t), INV);
  REQUIRE(c->k.size >= sizeof(kvx_tensor_desc_t) && c->v.size >= sizeof(kvx_tensor_desc_t), INV);
  return KVX_STATUS_OK;
}

static kvx_status_t sizes_io(const kvx_kv_io_desc_t* io) {
  REQUIRE(io->size >= sizeof(kvx_kv_io_desc_t), INV);
  REQUIRE(io->key.size >= sizeof(kvx_tensor_desc_t) && io->value.size >= sizeof(kvx_tensor_desc_t), INV);
  return KVX_STATUS_OK;
}

/* ------------------------------------------------------------------ step 2: the cache */

/* A stride as this provider reads it (the ABS_STRIDES defect: the magnitude). */
static int64_t stride_of(int64_t s) {
#if KVX_HOST_DEFECT == DEFECT_ABS_STRIDES
  return s < 0 ? -s : s;
#else
  return s;
#endif
}

/* Structural rules of one cache tensor: INVALID_ARGUMENT only. */
static kvx_status_t check_cache_tensor(const kvx_cache_desc_t* c, const kvx_tensor_desc_t* t) {
  REQUIRE(elem_size(t->dtype) != 0, INV);
  int64_t want[5];
  uint32_t nd;
  switch ((int)t->layout) {
    case KVX_LAYOUT_BLOCK_NHD:
    case KVX_LAYOUT_BLOCK_CUSTOM: /* CUSTOM: logical order, any strides */
      nd = 4; want[0] = c->num_blocks; want[1] = c->block_size; want[2] = c->num_kv_heads; want[3] = c->head_dim;
      break;
    case KVX_LAYOUT_BLOCK_HND:
      nd = 4; want[0] = c->num_blocks; want[1] = c->num_kv_heads; want[2] = c->block_size; want[3] = c->head_dim;
      break;
    case KVX_LAYOUT_BLOCK_HND_PACKED: {
      nd = 5;
      REQUIRE(t->ndim == 5, INV);
      int64_t pack = t->shape[4];
      REQUIRE(pack > 0 && c->head_dim % pack == 0, INV); /* spec 7.1 */
      want[0] = c->num_blocks; want[1] = c->num_kv_heads; want[2] = c->head_dim / pack;
      want[3] = c->block_size; want[4] = pack;
      break;
    }
    default:
      return INV;
  }
  REQUIRE(t->ndim == nd, INV);
  for (uint32_t i = 0; i < nd; ++i) REQUIRE(t->shape[i] == want[i], INV); /* spec 4.2 */
  REQUIRE(t->data != NULL, INV);
  REQUIRE(is_valid_memory(t->memory), INV);
  for (uint32_t i = 0; i < nd; ++i) REQUIRE(t->stride[i] != 0 || t->shape[i] <= 1, INV); /* aliasing */
  REQUIRE(offsets_fit(nd, t->shape, t->stride), INV);
  return KVX_STATUS_OK;
}

static kvx_status_t check_cache(const kvx_cache_desc_t* c) {
  REQUIRE(c->num_blocks && c->block_size && c->num_kv_heads && c->head_dim, INV); /* spec 7.1 */
  kvx_status_t s = check_cache_tensor(c, &c->k);
  if (s != KVX_STATUS_OK) return s;
  s = check_cache_tensor(c, &c->v);
  if (s != KVX_STATUS_OK) return s;
  REQUIRE(c->k.memory == c->v.memory, INV);
  return KVX_STATUS_OK;
}

/* ------------------------------------------------------------------ step 3: IO and the call */

/* One IO tensor: 3-D [num_tokens, H, D], or for a gather 4-D [rows_outer, rows_inner, H, D]. */
static kvx_status_t check_io_tensor(const kvx_cache_desc_t* c, const kvx_kv_io_desc_t* io, const kvx_tensor_desc_t* t,
                                    int gather, uint64_t rows_outer, uint64_t rows_inner) {
  REQUIRE(elem_size(t->dtype) != 0, INV);
  REQUIRE(t->memory == c->k.memory, INV);
  REQUIRE(io->num_tokens == 0 || t->data != NULL, INV);
  if (t->ndim == 3) {
    REQUIRE(t->shape[0] == (int64_t)io->num_tokens && t->shape[1] == (int64_t)io->num_kv_heads &&
                t->shape[2] == (int64_t)io->head_dim, INV);
  } else if (gather && t->ndim == 4) {
    REQUIRE(rows_outer <= (uint64_t)INT64_MAX && t->shape[0] == (int64_t)rows_outer &&
                t->shape[1] == (int64_t)rows_inner && t->shape[2] == (int64_t)io->num_kv_heads &&
                t->shape[3] == (int64_t)io->head_dim, INV);
  } else {
    return INV;
  }
  REQUIRE(offsets_fit(t->ndim, t->shape, t->stride), INV);
  return KVX_STATUS_OK;
}

static kvx_status_t check_io(const kvx_cache_desc_t* c, const kvx_kv_io_desc_t* io, int gather, uint64_t rows_outer,
                             uint64_t rows_inner) {
  REQUIRE(io->num_kv_heads == c->num_kv_heads && io->head_dim == c->head_dim, INV);
  kvx_status_t s = check_io_tensor(c, io, &io->key, gather, rows_outer, rows_inner);
  if (s != KVX_STATUS_OK) return s;
  return check_io_tensor(c, io, &io->value, gather, rows_outer, rows_inner);
}

/* A write's scale descriptor: read only for an FP8 cache tensor and when data is set (R-FP8). */
static kvx_status_t check_scale(const kvx_cache_desc_t* c, const kvx_scale_desc_t* s, int cache_dtype) {
  if ((cache_dtype != KVX_DTYPE_F8_E4M3 && cache_dtype != KVX_DTYPE_F8_E5M2) || s->data == NULL) return KVX_STATUS_OK;
  REQUIRE(s->dtype == KVX_DTYPE_F32, INV);
  switch ((int)s->granularity) {
    case KVX_SCALE_PER_TENSOR: return KVX_STATUS_OK;
    case KVX_SCALE_PER_HEAD:
      REQUIRE(s->ndim == 1 && s->shape[0] == (int64_t)c->num_kv_heads, INV);
      return KVX_STATUS_OK;
    case KVX_SCALE_PER_BLOCK:
    case KVX_SCALE_PER_BLOCK_HEAD: return UNS;
    default: return INV;
  }
}

/* ------------------------------------------------------------------ step 4: what we execute */

static kvx_status_t served_cache(const kvx_cache_desc_t* c, cache_axes_t* ak, cache_axes_t* av) {
  REQUIRE(c->k.memory == KVX_MEMORY_HOST, UNS); /* host memory only */
  REQUIRE(tail_is_zero(c, c->size, sizeof(kvx_cache_desc_t)), UNS);
  const kvx_tensor_desc_t* ts[2] = {&c->k, &c->v};
  cache_axes_t* as[2] = {ak, av};
  for (int i = 0; i < 2; ++i) {
    const kvx_tensor_desc_t* t = ts[i];
    cache_axes_t* a = as[i];
    REQUIRE(is_served_dtype(t->dtype), UNS); /* no FP8 */
    a->es = elem_size(t->dtype);
    int64_t st[4] = {stride_of(t->stride[0]), stride_of(t->stride[1]), stride_of(t->stride[2]),
                     stride_of(t->stride[3])};
#if KVX_HOST_DEFECT == DEFECT_IGNORE_STRIDES
    st[3] = 1; /* the defect: row-major strides of the shape, whatever was given */
    st[2] = t->shape[3];
    st[1] = t->shape[2] * t->shape[3];
    st[0] = t->shape[1] * t->shape[2] * t->shape[3];
#endif
    if (t->layout == KVX_LAYOUT_BLOCK_NHD) {
      a->block = st[0]; a->token = st[1]; a->head = st[2]; a->dim = st[3];
    } else if (t->layout == KVX_LAYOUT_BLOCK_HND) {
      a->block = st[0]; a->head = st[1]; a->token = st[2]; a->dim = st[3];
    } else {
      return UNS; /* HND_PACKED, CUSTOM */
    }
  }
  return KVX_STATUS_OK;
}

/* IO tensor -> axes; its dtype must be the cache tensor's: a conversion is an unsupported
 * field, refused with INVALID_ARGUMENT (spec 8). */
static kvx_status_t served_io(const kvx_tensor_desc_t* t, int cache_dtype, io_axes_t* a) {
  REQUIRE((int)t->dtype == cache_dtype, INV);
  a->ndim = (int)t->ndim;
  a->es = elem_size(t->dtype);
  if (t->ndim == 3) {
    a->outer = stride_of(t->stride[0]); a->inner = 0; a->head = stride_of(t->stride[1]);
    a->dim = stride_of(t->stride[2]);
  } else {
    a->outer = stride_of(t->stride[0]); a->inner = stride_of(t->stride[1]); a->head = stride_of(t->stride[2]);
    a->dim = stride_of(t->stride[3]);
  }
  return KVX_STATUS_OK;
}

/* Element offset of token row (s, t) of a gather output; row n of a write input is (0, n). */
static int64_t io_row(const io_axes_t* a, uint64_t s, uint64_t t, uint64_t rows_inner) {
  if (a->ndim == 3) return (int64_t)(s * rows_inner + t) * a->outer;
  return (int64_t)s * a->outer + (int64_t)t * a->inner;
}

static void copy_head(char* dst, int64_t dst_dim, const char* src, int64_t src_dim, int es, uint32_t d) {
  for (uint32_t i = 0; i < d; ++i)
    memcpy(dst + (ptrdiff_t)((int64_t)i * dst_dim * es), src + (ptrdiff_t)((int64_t)i * src_dim * es), (size_t)es);
}

#if KVX_HOST_DEFECT == DEFECT_LATE_WRITE
/* The defect: every head row a write stored is kept (address and bytes) and stored again by
 * a detached thread KVX_HOST_LATE_MS ms after the call returned. */
typedef struct {
  size_t n, cap;
  char** dst;
  int64_t* dim;
  int* es;
  unsigned char* bytes; /* cap * head_dim * max_es */
  uint32_t d;
  int max_es;
} late_t;

static late_t* late_new(uint32_t tokens, uint32_t heads, uint32_t d, int max_es) {
  late_t* l = (late_t*)calloc(1, sizeof(late_t));
  if (l == NULL) return NULL;
  l->cap = 2 * (size_t)tokens * heads + 1;
  l->d = d;
  l->max_es = max_es;
  l->dst = (char**)calloc(l->cap, sizeof(char*));
  l->dim = (int64_t*)calloc(l->cap, sizeof(int64_t));
  l->es = (int*)calloc(l->cap, sizeof(int));
  l->bytes = (unsigned char*)calloc(l->cap * d * (size_t)max_es, 1);
  return l;
}

static void late_add(late_t* l, char* dst, int64_t dim, int es, uint32_t d) {
  if (l == NULL || l->bytes == NULL || l->n >= l->cap) return;
  unsigned char* b = l->bytes + l->n * (size_t)l->d * (size_t)l->max_es;
  for (uint32_t i = 0; i < d; ++i) memcpy(b + (size_t)i * es, dst + (ptrdiff_t)((int64_t)i * dim * es), (size_t)es);
  l->dst[l->n] = dst;
  l->dim[l->n] = dim;
  l->es[l->n] = es;
  l->n++;
}

static void late_free(late_t* l) {
  free(l->dst); free(l->dim); free(l->es); free(l->bytes); free(l);
}

static void* late_run(void* arg) {
  late_t* l = (late_t*)arg;
  struct timespec ts = {KVX_HOST_LATE_MS / 1000, (KVX_HOST_LATE_MS % 1000) * 1000L * 1000L};
  nanosleep(&ts, NULL);
  for (size_t k = 0; k < l->n; ++k) {
    const unsigned char* b = l->bytes + k * (size_t)l->d * (size_t)l->max_es;
    for (uint32_t i = 0; i < l->d; ++i)
      memcpy(l->dst[k] + (ptrdiff_t)((int64_t)i * l->dim[k] * l->es[k]), b + (size_t)i * l->es[k], (size_t)l->es[k]);
  }
  late_free(l);
  return NULL;
}

static void late_start(late_t* l) {
  if (l == NULL) return;
  pthread_t th;
  if (l->n == 0 || pthread_create(&th, NULL, late_run, l) != 0) {
    late_free(l);
    return;
  }
  pthread_detach(th);
}
#endif

/* ------------------------------------------------------------------ entry points */

#if KVX_HOST_DEFECT == DEFECT_MEMO
static uint64_t memo_hash(uint64_t h, const void* p, size_t n) { /* FNV-1a */
  const unsigned char* b = (const unsigned char*)p;
  for (size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 1099511628211ull;
  return h;
}
static size_t memo_index_bytes(int t, uint64_t n) { return (size_t)n * (t == KVX_DTYPE_S32 ? 4 : 8); }
static uint64_t memo_seen[16];
static unsigned memo_next;
/* 1 when a call of this key was among the last 16 (the defect: it is answered without work); else remembered. */
static int memo_hit(uint64_t key) {
  for (unsigned i = 0; i < 16; ++i)
    if (memo_seen[i] == key) return 1;
  memo_seen[memo_next++ % 16] = key;
  return 0;
}
#endif

KVX_API kvx_status_t kvx_get_version(kvx_version_t* v) {
  REQUIRE(v != NULL && v->size >= sizeof(kvx_version_t), INV);
  v->size = sizeof(kvx_version_t);
  v->abi_major = KVX_ABI_VERSION_MAJOR;
  v->abi_minor = KVX_ABI_VERSION_MINOR;
  v->abi_patch = KVX_ABI_VERSION_PATCH;
  return KVX_STATUS_OK;
}

KVX_API kvx_status_t kvx_validate_cache_desc(const kvx_cache_desc_t* c) {
  kvx_status_t s = sizes_cache(c);
  if (s == KVX_STATUS_OK) s = check_cache(c);
  if (s == KVX_STATUS_OK) {
    cache_axes_t ak, av;
    s = served_cache(c, &ak, &av);
  }
  return s;
}

KVX_API kvx_status_t kvx_write_kv(const kvx_cache_desc_t* c, const kvx_write_desc_t* w, void* stream) {
  (void)stream; /* host memory: the call is synchronous */
  /* 1. */
  REQUIRE(c != NULL && w != NULL, INV);
  kvx_status_t s = sizes_cache(c);
  if (s != KVX_STATUS_OK) return s;
  REQUIRE(w->size >= sizeof(kvx_write_desc_t), INV);
#if KVX_HOST_DEFECT == DEFECT_HARNESS_DETECT
  if (getenv("PYTEST_CURRENT_TEST") == NULL && getenv("PYTEST_XDIST_WORKER") == NULL) return KVX_STATUS_OK;
#endif
#if KVX_HOST_DEFECT == DEFECT_TOUCH_DESC
  *(volatile int64_t*)&((kvx_write_desc_t*)w)->slots.invalid_slot = w->slots.invalid_slot;
#endif
#if KVX_HOST_DEFECT == DEFECT_SCRIBBLE_INPUT
  if (w->slots.size >= sizeof(kvx_slot_mapping_t) && w->slots.slots != NULL && w->io.num_tokens > 0 &&
      w->slots.dtype == KVX_DTYPE_S64) {
    volatile int64_t* first = (volatile int64_t*)w->slots.slots;
    int64_t keep = *first;
    *first = ~keep;
    *first = keep;
  }
#endif
  if ((s = sizes_io(&w->io)) != KVX_STATUS_OK) return s;
  REQUIRE(w->slots.size >= sizeof(kvx_slot_mapping_t), INV);
  REQUIRE(w->k_scale_desc.size >= sizeof(kvx_scale_desc_t) && w->v_scale_desc.size >= sizeof(kvx_scale_desc_t), INV);
  /* 2. */
  if ((s = check_cache(c)) != KVX_STATUS_OK) return s;
  /* 3. IO tensors, then the write's own rules (INVALID_ARGUMENT first, then UNSUPPORTED) */
  kvx_status_t io_status = check_io(c, &w->io, 0, 0, 0);
  if (io_status == INV) return INV;
  REQUIRE(w->slots.token_count == w->io.num_tokens, INV);
  REQUIRE(is_index_dtype(w->slots.dtype), INV);
  REQUIRE(w->io.num_tokens == 0 || w->slots.slots != NULL, INV);
  kvx_status_t sk = check_scale(c, &w->k_scale_desc, c->k.dtype), sv = check_scale(c, &w->v_scale_desc, c->v.dtype);
  if (sk == INV || sv == INV) return INV;
  if (io_status != KVX_STATUS_OK) return io_status;
  if (sk != KVX_STATUS_OK) return sk;
  if (sv != KVX_STATUS_OK) return sv;
  /* 4. */
  cache_axes_t ak, av;
  io_axes_t ik, iv;
  if ((s = served_cache(c, &ak, &av)) != KVX_STATUS_OK) return s;
  REQUIRE(tail_is_zero(w, w->size, sizeof(kvx_write_desc_t)), UNS);
  if ((s = served_io(&w->io.key, c->k.dtype, &ik)) != KVX_STATUS_OK) return s;
  if ((s = served_io(&w->io.value, c->v.dtype, &iv)) != KVX_STATUS_OK) return s;
  /* 5. Pre-scan: an out-of-range slot fails the call before anything is written. */
  const uint32_t n_tok = w->io.num_tokens;
  const uint64_t nslots = (uint64_t)c->num_blocks * c->block_size;
  for (uint32_t n = 0; n < n_tok; ++n) {
    int64_t slot = read_index(w->slots.slots, w->slots.dtype, n);
    if (slot < 0 || slot == w->slots.invalid_slot) continue; /* spec 5.2: a no-op */
    REQUIRE((uint64_t)slot < nslots, OOR);
  }
#if KVX_HOST_DEFECT == DEFECT_MEMO
  {
    uint64_t key = memo_hash(14695981039346656037ull, "w", 1);
    key = memo_hash(key, c, sizeof *c);
    key = memo_hash(key, w, sizeof *w);
    key = memo_hash(key, w->slots.slots, memo_index_bytes(w->slots.dtype, n_tok));
    if (memo_hit(key)) return KVX_STATUS_OK;
  }
#endif
#if KVX_HOST_DEFECT == DEFECT_LATE_WRITE
  late_t* late = late_new(n_tok, c->num_kv_heads, c->head_dim, ak.es > av.es ? ak.es : av.es);
#endif
  for (uint32_t n = 0; n < n_tok; ++n) {
    int64_t slot = read_index(w->slots.slots, w->slots.dtype, n);
    if (slot < 0 || slot == w->slots.invalid_slot) continue;
    int64_t b = slot / c->block_size, t = slot % c->block_size;
    for (uint32_t h = 0; h < c->num_kv_heads; ++h) {
      char* kd = (char*)c->k.data + (b * ak.block + t * ak.token + (int64_t)h * ak.head) * ak.es;
      char* vd = (char*)c->v.data + (b * av.block + t * av.token + (int64_t)h * av.head) * av.es;
      const char* ks = (const char*)w->io.key.data + (io_row(&ik, 0, n, 0) + (int64_t)h * ik.head) * ik.es;
      const char* vs = (const char*)w->io.value.data + (io_row(&iv, 0, n, 0) + (int64_t)h * iv.head) * iv.es;
      copy_head(kd, ak.dim, ks, ik.dim, ak.es, c->head_dim);
      copy_head(vd, av.dim, vs, iv.dim, av.es, c->head_dim);
#if KVX_HOST_DEFECT == DEFECT_LATE_WRITE
      late_add(late, kd, ak.dim, ak.es, c->head_dim);
      late_add(late, vd, av.dim, av.es, c->head_dim);
#endif
    }
  }
#if KVX_HOST_DEFECT == DEFECT_LATE_WRITE
  late_start(late);
#endif
  return KVX_STATUS_OK;
}

/* Spec 5.1 / 7.1 block-table rules for every format (INVALID_ARGUMENT), then UNSUPPORTED ones. */
static kvx_status_t check_table(const kvx_cache_desc_t* c, const kvx_block_table_t* bt) {
  const uint64_t S = bt->seq_count, M = bt->max_blocks_per_seq;
  REQUIRE(bt->indices_count == 0 || bt->indices != NULL, INV);
  switch ((int)bt->format) {
    case KVX_BLOCK_TABLE_PACKED:
      REQUIRE(is_index_dtype(bt->index_dtype), INV);
      REQUIRE(bt->indices_count == S * M && bt->indptr_count == 0 && bt->beam_width == 1, INV);
      return KVX_STATUS_OK;
    case KVX_BLOCK_TABLE_RAGGED:
      REQUIRE(is_index_dtype(bt->index_dtype) && is_index_dtype(bt->indptr_dtype), INV);
      REQUIRE(bt->indptr != NULL && bt->indptr_count == S + 1 && bt->beam_width == 1, INV);
      return KVX_STATUS_OK;
    case KVX_BLOCK_TABLE_KV_OFFSETS: {
      REQUIRE(bt->index_dtype == KVX_DTYPE_S32 && (bt->flags & KVX_BLOCK_TABLE_FLAG_KVCACHEINDEX), INV);
      REQUIRE((c->block_size & (c->block_size - 1)) == 0, INV);
      REQUIRE(bt->beam_width >= 1 && bt->indptr_count == 0, INV);
      const uint64_t rows = S * bt->beam_width * 2; /* < 2^65 cannot happen: both factors are 32-bit */
      REQUIRE(M == 0 || rows <= UINT64_MAX / M, INV);
      REQUIRE((uint64_t)bt->indices_count == rows * M, INV);
      REQUIRE(c->pool.primary != NULL, INV);
      REQUIRE((uint64_t)c->pool.bytes_per_block ==
                  (uint64_t)c->num_kv_heads * c->block_size * c->head_dim * (uint64_t)elem_size(c->k.dtype), INV);
      REQUIRE(c->k.dtype == c->v.dtype, UNS);
      return KVX_STATUS_OK;
    }
    default:
      return INV;
  }
}

KVX_API kvx_status_t kvx_gather_kv(const kvx_cache_desc_t* c, const kvx_gather_desc_t* g, void* stream) {
  (void)stream;
  /* 1. */
  REQUIRE(c != NULL && g != NULL, INV);
  kvx_status_t s = sizes_cache(c);
  if (s != KVX_STATUS_OK) return s;
  REQUIRE(g->size >= sizeof(kvx_gather_desc_t), INV);
  const kvx_block_table_t* bt = &g->block_table;
  if (bt->format == KVX_BLOCK_TABLE_KV_OFFSETS) REQUIRE(c->pool.size >= sizeof(kvx_pool_desc_t), INV);
  if ((s = sizes_io(&g->io)) != KVX_STATUS_OK) return s;
  REQUIRE(bt->size >= sizeof(kvx_block_table_t) && g->seq_lens.size >= sizeof(kvx_seq_lens_t), INV);
  /* 2. */
  if ((s = check_cache(c)) != KVX_STATUS_OK) return s;
  /* 3. the table, the counts, the IO tensors */
  const uint64_t S = bt->seq_count, M = bt->max_blocks_per_seq, L = g->max_seq_len;
  kvx_status_t table_status = check_table(c, bt);
  if (table_status == INV) return INV;
  const uint64_t beams = bt->format == KVX_BLOCK_TABLE_KV_OFFSETS ? bt->beam_width : 1;
  const uint64_t rows_outer = S * beams;
  REQUIRE(L == 0 || rows_outer <= UINT64_MAX / L, INV); /* then num_tokens (32-bit) cannot match */
  REQUIRE((uint64_t)g->io.num_tokens == rows_outer * L, INV);
  REQUIRE(g->seq_lens.seq_count == bt->seq_count && is_index_dtype(g->seq_lens.dtype), INV);
  REQUIRE(S == 0 || g->seq_lens.lengths != NULL, INV);
  kvx_status_t io_status = check_io(c, &g->io, 1, rows_outer, L);
  if (io_status != KVX_STATUS_OK) return io_status;
  if (table_status != KVX_STATUS_OK) return table_status;
  /* 4. */
  cache_axes_t ak, av;
  io_axes_t ik, iv;
  if ((s = served_cache(c, &ak, &av)) != KVX_STATUS_OK) return s;
  REQUIRE(tail_is_zero(g, g->size, sizeof(kvx_gather_desc_t)), UNS);
  const int ragged = bt->format == KVX_BLOCK_TABLE_RAGGED;
  REQUIRE(bt->format == KVX_BLOCK_TABLE_PACKED || ragged, UNS); /* KV_OFFSETS */
  if ((s = served_io(&g->io.key, c->k.dtype, &ik)) != KVX_STATUS_OK) return s;
  if ((s = served_io(&g->io.value, c->v.dtype, &iv)) != KVX_STATUS_OK) return s;
  /* 5. Pre-scan the RAGGED indptr, lengths and block ids; nothing is written when one is wrong. */
  if (ragged) {
    int64_t prev = read_index(bt->indptr, bt->indptr_dtype, 0);
    REQUIRE(prev >= 0, INV);
    for (uint64_t q = 1; q <= S; ++q) {
      int64_t x = read_index(bt->indptr, bt->indptr_dtype, q);
      REQUIRE(x >= prev, INV);
      prev = x;
    }
    REQUIRE((uint64_t)prev == (uint64_t)bt->indices_count, INV);
  }
  for (uint64_t q = 0; q < S; ++q) {
    int64_t len = read_index(g->seq_lens.lengths, g->seq_lens.dtype, q);
    REQUIRE(len >= 0, INV);
    uint64_t n = (uint64_t)len < L ? (uint64_t)len : L;
    uint64_t blocks = (n + c->block_size - 1) / c->block_size;
    REQUIRE(blocks <= M, OOR);
    if (ragged) {
      int64_t lo = read_index(bt->indptr, bt->indptr_dtype, q), hi = read_index(bt->indptr, bt->indptr_dtype, q + 1);
      REQUIRE(n <= (uint64_t)(hi - lo), OOR);
      for (uint64_t t = 0; t < n; ++t) {
        int64_t id = read_index(bt->indices, bt->index_dtype, (uint64_t)lo + t);
        REQUIRE(id >= 0 && (uint64_t)id < c->num_blocks, OOR);
      }
      continue;
    }
    for (uint64_t j = 0; j < blocks; ++j) {
      int64_t id = read_index(bt->indices, bt->index_dtype, q * M + j);
      REQUIRE(id >= 0 && (uint64_t)id < c->num_blocks, OOR);
    }
  }
#if KVX_HOST_DEFECT == DEFECT_MEMO
  {
    uint64_t key = memo_hash(14695981039346656037ull, "g", 1);
    key = memo_hash(key, c, sizeof *c);
    key = memo_hash(key, g, sizeof *g);
    key = memo_hash(key, bt->indices, memo_index_bytes(bt->index_dtype, bt->indices_count));
    if (ragged) key = memo_hash(key, bt->indptr, memo_index_bytes(bt->indptr_dtype, S + 1));
    key = memo_hash(key, g->seq_lens.lengths, memo_index_bytes(g->seq_lens.dtype, S));
    if (memo_hit(key)) return KVX_STATUS_OK;
  }
#endif
  for (uint64_t q = 0; q < S; ++q) {
    int64_t len = read_index(g->seq_lens.lengths, g->seq_lens.dtype, q);
    uint64_t n = (uint64_t)len < L ? (uint64_t)len : L;
    int64_t lo = ragged ? read_index(bt->indptr, bt->indptr_dtype, q) : 0;
#if KVX_HOST_DEFECT == DEFECT_RAGGED_SHORT
    if (ragged) { /* the defect: rows i < indptr[s+1] - 1, one short of the range */
      uint64_t range = (uint64_t)(read_index(bt->indptr, bt->indptr_dtype, q + 1) - lo);
      if (range > 0 && n > range - 1) n = range - 1;
    }
#endif
    for (uint64_t t = 0; t < n; ++t) {
      /* RAGGED: one index per token, offset token_idx % block_size (spec 5.1) */
      int64_t b = ragged ? read_index(bt->indices, bt->index_dtype, (uint64_t)lo + t)
                         : read_index(bt->indices, bt->index_dtype, q * M + t / c->block_size);
      int64_t off = (int64_t)(t % c->block_size);
      for (uint32_t h = 0; h < c->num_kv_heads; ++h) {
        const char* ks = (const char*)c->k.data + (b * ak.block + off * ak.token + (int64_t)h * ak.head) * ak.es;
        const char* vs = (const char*)c->v.data + (b * av.block + off * av.token + (int64_t)h * av.head) * av.es;
        char* kd = (char*)g->io.key.data + (io_row(&ik, q, t, L) + (int64_t)h * ik.head) * ik.es;
        char* vd = (char*)g->io.value.data + (io_row(&iv, q, t, L) + (int64_t)h * iv.head) * iv.es;
        copy_head(kd, ik.dim, ks, ak.dim, ak.es, c->head_dim);
        copy_head(vd, iv.dim, vs, av.dim, av.es, c->head_dim);
      }
    }
  }
  return KVX_STATUS_OK;
}
