/*
 * kvx_testing.c -- hostile and malformed "providers" for kvx-conform's own tests.
 *
 * Not providers anyone should copy: each exists to prove that the harness survives
 * or refuses it (tests/test_cli_run.py). csrc/testing/CMakeLists.txt builds this file
 * once per mode (-DKVX_TESTING_MODE=...), host only, into libkvx_testing_<mode>.so
 * beside the mutants:
 *
 *   SEGV_ON_GATHER   every gather raises SIGSEGV; write is an OK no-op
 *   HANG_ON_GATHER   every gather sleeps forever; write is an OK no-op
 *   MAJOR2           kvx_get_version reports ABI 2.0.0 (must be refused at load, spec 3)
 *   NO_ENTRY_POINTS  exports kvx_get_version and kvx_validate_cache_desc only
 *                    (no kvx_write_kv, no kvx_gather_kv: must be refused at load)
 *
 * Validation answers OK for any non-NULL descriptor (wrong, and the suites say so).
 */
#define KVX_BUILD_PROVIDER 1
#include <signal.h>
#include <stddef.h>
#include <unistd.h>

#include "kvx/kvx_abi.h"

#define MODE_SEGV_ON_GATHER 1
#define MODE_HANG_ON_GATHER 2
#define MODE_MAJOR2 3
#define MODE_NO_ENTRY_POINTS 4

#ifndef KVX_TESTING_MODE
#error "build with -DKVX_TESTING_MODE=MODE_..."
#endif

KVX_API kvx_status_t kvx_get_version(kvx_version_t* version) {
  if (version == NULL || version->size < sizeof(kvx_version_t)) return KVX_STATUS_INVALID_ARGUMENT;
#if KVX_TESTING_MODE == MODE_MAJOR2
  version->abi_major = 2;
  version->abi_minor = 0;
#else
  version->abi_major = 1;
  version->abi_minor = 1;
#endif
  version->abi_patch = 0;
  return KVX_STATUS_OK;
}

KVX_API kvx_status_t kvx_validate_cache_desc(const kvx_cache_desc_t* cache) {
  return cache == NULL ? KVX_STATUS_INVALID_ARGUMENT : KVX_STATUS_OK;
}

#if KVX_TESTING_MODE != MODE_NO_ENTRY_POINTS
KVX_API kvx_status_t kvx_write_kv(const kvx_cache_desc_t* cache, const kvx_write_desc_t* desc, void* stream) {
  (void)stream;
  return (cache == NULL || desc == NULL) ? KVX_STATUS_INVALID_ARGUMENT : KVX_STATUS_OK;
}

KVX_API kvx_status_t kvx_gather_kv(const kvx_cache_desc_t* cache, const kvx_gather_desc_t* desc, void* stream) {
  (void)cache;
  (void)desc;
  (void)stream;
#if KVX_TESTING_MODE == MODE_SEGV_ON_GATHER
  raise(SIGSEGV);
#elif KVX_TESTING_MODE == MODE_HANG_ON_GATHER
  for (;;) pause();
#endif
  return KVX_STATUS_OK;
}
#endif
