/*
 * kvx_fp4_own_stream.c -- libkvx_testing_fp4_own_stream.so, a defective provider for kvx-conform's
 * own tests, built when nvcc is found.
 *
 * A thin front over the bundled reference provider (libkvx_reference.so, loaded from this
 * library's own folder): every call is forwarded unchanged, except that the device work of an FP4
 * call (a KVX 1.2 cache whose FP4 extension names a format) goes to a non-blocking stream of the
 * front's own instead of the caller's, with no wait on either. That is the defect the stream-order
 * check of the FP4 calls (`stream.order_fp4`, suites/conformance/test_s7_concurrency.py) must see:
 * the write may read its rows before the caller's stream has filled them, the gather may read the
 * cache before the write has stored it, and work queued after the gather may read its outputs
 * before they are there (R-STREAM). Every other check passes with it, since the harness waits for
 * the whole device after each call (tests/test_stream_order.py).
 */
#define KVX_BUILD_PROVIDER 1
#define _GNU_SOURCE 1
#include <cuda_runtime_api.h>
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
  cudaStream_t own;
} ref;
static pthread_once_t once = PTHREAD_ONCE_INIT, stream_once = PTHREAD_ONCE_INIT;

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

static void create_stream(void) {
  if (cudaStreamCreateWithFlags(&ref.own, cudaStreamNonBlocking) != cudaSuccess) {
    cudaGetLastError();
    ref.own = NULL;
  }
}

/* The stream of a call's work: the caller's, or for an FP4 cache the front's own. */
static void* stream_for(const kvx_cache_desc_t* cache, void* stream) {
  const size_t need = offsetof(kvx_cache_desc_t, fp4) + offsetof(kvx_fp4_cache_ext_t, format) +
                      sizeof(kvx_fp4_format_t);
  if (!cache || cache->size < need || cache->fp4.format == KVX_FP4_NONE) return stream;
  pthread_once(&stream_once, create_stream);
  return ref.own ? (void*)ref.own : stream;
}

KVX_API kvx_status_t kvx_get_version(kvx_version_t* version) {
  return ready() ? ref.version(version) : KVX_STATUS_INTERNAL_ERROR;
}

KVX_API kvx_status_t kvx_validate_cache_desc(const kvx_cache_desc_t* cache) {
  return ready() ? ref.validate(cache) : KVX_STATUS_INTERNAL_ERROR;
}

KVX_API kvx_status_t kvx_write_kv(const kvx_cache_desc_t* cache, const kvx_write_desc_t* desc, void* stream) {
  return ready() ? ref.write(cache, desc, stream_for(cache, stream)) : KVX_STATUS_INTERNAL_ERROR;
}

KVX_API kvx_status_t kvx_gather_kv(const kvx_cache_desc_t* cache, const kvx_gather_desc_t* desc, void* stream) {
  return ready() ? ref.gather(cache, desc, stream_for(cache, stream)) : KVX_STATUS_INTERNAL_ERROR;
}
