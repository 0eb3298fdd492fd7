/*
 * kvx_fp4_front.c -- defective providers for kvx-conform's own tests: a thin front over the bundled
 * reference provider (libkvx_reference.so, loaded from this library's own folder) that forwards
 * every call unchanged but an FP4 call's (a KVX 1.2 cache whose FP4 extension names a format).
 * csrc/testing/CMakeLists.txt builds it once per defect (KVX_FRONT_DEFECT):
 *
 *   libkvx_testing_fp4_own_stream.so  FRONT_OWN_STREAM (built when nvcc is found): the device work
 *       of an FP4 call goes to a non-blocking stream of the front's own instead of the caller's,
 *       with no wait on either. The write may read its rows before the caller's stream has filled
 *       them, the gather may read the cache before the write has stored it, and work queued after
 *       the gather may read its outputs before they are there (R-STREAM): `stream.order_fp4`
 *       (suites/conformance/test_s7_concurrency.py) must see it; every other check passes, since
 *       the harness waits for the whole device after each call (tests/test_stream_order.py).
 *   libkvx_testing_fp4_memo.so  FRONT_MEMO: an FP4 call on host memory whose descriptors, slots or
 *       table and first row bytes hash like one of the last 16 FP4 calls' answers OK without work
 *       (a provider caching its calls: spec 7.2, R-STATE). `fp4.state.repeated_write` and
 *       `fp4.state.repeated_gather` (suites/conformance/test_s10_fp4.py) must see it
 *       (tests/test_host_providers.py).
 */
#define KVX_BUILD_PROVIDER 1
#define _GNU_SOURCE 1
#define FRONT_OWN_STREAM 1
#define FRONT_MEMO 2
#ifndef KVX_FRONT_DEFECT
#define KVX_FRONT_DEFECT FRONT_OWN_STREAM
#endif
#if KVX_FRONT_DEFECT == FRONT_OWN_STREAM
#include <cuda_runtime_api.h>
#endif
#include <dlfcn.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "kvx/kvx_abi.h"

typedef kvx_status_t (*version_fn)(kvx_version_t*);
typedef kvx_status_t (*validate_fn)(const kvx_cache_desc_t*);
typedef kvx_status_t (*write_fn)(const kvx_cache_desc_t*, const kvx_write_desc_t*, void*);
typedef kvx_status_t (*gather_fn)(const kvx_cache_desc_t*, const kvx_gather_desc_t*, void*);

static struct {
  version_fn version;
  validate_fn validate;
  write_fn write;
  gather_fn gather;
#if KVX_FRONT_DEFECT == FRONT_OWN_STREAM
  cudaStream_t own;
#endif
} ref;
static pthread_once_t once = PTHREAD_ONCE_INIT;

static void load(void) {
  Dl_info info;
  char path[4096];
  if (!dladdr((void*)&load, &info) || !info.dli_fname) return;
  const char* slash = strrchr(info.dli_fname, '/');
  const int dir = slash ? (int)(slash - info.dli_fname) : 1;
  if (snprintf(path, sizeof path, "%.*s/libkvx_reference.so", dir, slash ? info.dli_fname : ".") >= (int)sizeof path)
    return;
  void* h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!h) return;
  ref.version = (version_fn)dlsym(h, "kvx_get_version");
  ref.validate = (validate_fn)dlsym(h, "kvx_validate_cache_desc");
  ref.write = (write_fn)dlsym(h, "kvx_write_kv");
  ref.gather = (gather_fn)dlsym(h, "kvx_gather_kv");
}

static int ready(void) {
  pthread_once(&once, load);
  return ref.version && ref.validate && ref.write && ref.gather;
}

/* An FP4 call: a KVX 1.2 cache whose FP4 extension names a format. */
static int fp4_call(const kvx_cache_desc_t* cache) {
  const size_t need = offsetof(kvx_cache_desc_t, fp4) + offsetof(kvx_fp4_cache_ext_t, format) +
                      sizeof(kvx_fp4_format_t);
  return cache && cache->size >= need && cache->fp4.format != KVX_FP4_NONE;
}

#if KVX_FRONT_DEFECT == FRONT_OWN_STREAM
static pthread_once_t stream_once = PTHREAD_ONCE_INIT;

static void create_stream(void) {
  if (cudaStreamCreateWithFlags(&ref.own, cudaStreamNonBlocking) != cudaSuccess) {
    cudaGetLastError();
    ref.own = NULL;
  }
}

/* The stream of a call's work: the caller's, or for an FP4 cache the front's own. */
static void* stream_for(const kvx_cache_desc_t* cache, void* stream) {
  if (!fp4_call(cache)) return stream;
  pthread_once(&stream_once, create_stream);
  return ref.own ? (void*)ref.own : stream;
}

/* The memo (FRONT_MEMO): none here. */
static int memo_write(const kvx_cache_desc_t* cache, const kvx_write_desc_t* desc) {
  (void)cache;
  (void)desc;
  return 0;
}

static int memo_gather(const kvx_cache_desc_t* cache, const kvx_gather_desc_t* desc) {
  (void)cache;
  (void)desc;
  return 0;
}
#else
static void* stream_for(const kvx_cache_desc_t* cache, void* stream) {
  (void)cache;
  return stream;
}

/* The memo: FNV-1a hashes of the last 16 FP4 calls on host memory. */
static pthread_mutex_t memo_mu = PTHREAD_MUTEX_INITIALIZER;
static uint64_t memo[16];
static unsigned memo_n;

static uint64_t fnv(uint64_t h, const void* p, size_t n) {
  const unsigned char* b = (const unsigned char*)p;
  for (size_t i = 0; p && i < n; ++i) h = (h ^ b[i]) * 0x100000001b3ull;
  return h;
}

static size_t index_bytes(kvx_dtype_t dt) { return dt == KVX_DTYPE_S64 ? 8 : 4; }

/* Whether this call (its hash `h`) is one of the last 16; else it is remembered. */
static int seen(uint64_t h) {
  pthread_mutex_lock(&memo_mu);
  int hit = 0;
  for (unsigned i = 0; i < 16 && i < memo_n; ++i) hit |= memo[i] == h;
  if (!hit) memo[memo_n++ % 16] = h;
  pthread_mutex_unlock(&memo_mu);
  return hit;
}

/* The first bytes of the key rows: at least this many exist in any valid call's key tensor (a raw
 * FP4 row of one head holds head_dim / 2 bytes). */
static size_t key_bytes(const kvx_kv_io_desc_t* io) {
  const size_t n = (size_t)io->num_tokens * io->num_kv_heads * io->head_dim / 2;
  return io->key.data ? (n < 256 ? n : 256) : 0;
}

/* The hash of an FP4 call on host memory, its cache struct and call descriptor bytes to begin with
 * (0: a call the memo leaves alone). */
static uint64_t call_hash(const kvx_cache_desc_t* cache, const void* desc, size_t desc_size) {
  if (!fp4_call(cache) || !desc || cache->k.memory != KVX_MEMORY_HOST) return 0;
  const uint64_t h = fnv(fnv(0xcbf29ce484222325ull, cache, cache->size), desc, desc_size);
  return h ? h : 1;
}

/* Whether the front answers this FP4 call without forwarding it: its slots and first key bytes
 * (a write) or its table and lengths (a gather) hashed with its structs, seen among the last 16. */
static int memo_write(const kvx_cache_desc_t* cache, const kvx_write_desc_t* desc) {
  uint64_t h = call_hash(cache, desc, desc ? desc->size : 0);
  if (!h) return 0;
  h = fnv(h, desc->slots.slots, (size_t)desc->slots.token_count * index_bytes(desc->slots.dtype));
  return seen(fnv(h, desc->io.key.data, key_bytes(&desc->io)) ^ 1);
}

static int memo_gather(const kvx_cache_desc_t* cache, const kvx_gather_desc_t* desc) {
  uint64_t h = call_hash(cache, desc, desc ? desc->size : 0);
  if (!h) return 0;
  const kvx_block_table_t* t = &desc->block_table;
  h = fnv(h, t->indices, (size_t)t->indices_count * index_bytes(t->index_dtype));
  return seen(fnv(h, desc->seq_lens.lengths, (size_t)desc->seq_lens.seq_count * index_bytes(desc->seq_lens.dtype)) ^ 2);
}
#endif

KVX_API kvx_status_t kvx_get_version(kvx_version_t* version) {
  return ready() ? ref.version(version) : KVX_STATUS_INTERNAL_ERROR;
}

KVX_API kvx_status_t kvx_validate_cache_desc(const kvx_cache_desc_t* cache) {
  return ready() ? ref.validate(cache) : KVX_STATUS_INTERNAL_ERROR;
}

KVX_API kvx_status_t kvx_write_kv(const kvx_cache_desc_t* cache, const kvx_write_desc_t* desc, void* stream) {
  if (!ready()) return KVX_STATUS_INTERNAL_ERROR;
  return memo_write(cache, desc) ? KVX_STATUS_OK : ref.write(cache, desc, stream_for(cache, stream));
}

KVX_API kvx_status_t kvx_gather_kv(const kvx_cache_desc_t* cache, const kvx_gather_desc_t* desc, void* stream) {
  if (!ready()) return KVX_STATUS_INTERNAL_ERROR;
  return memo_gather(cache, desc) ? KVX_STATUS_OK : ref.gather(cache, desc, stream_for(cache, stream));
}
