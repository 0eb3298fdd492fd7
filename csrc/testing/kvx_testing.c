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
 *
 * Three more modes are *correct* providers with one hostile habit: they forward every
 * call to the bundled reference (libkvx_reference.so beside this library, or the file
 * KVX_TESTING_REFERENCE names), so the suites judge the habit alone:
 *
 *   CHATTY           writes 2 MiB to stderr and 64 KiB to stdout (no final newline) when
 *                    loaded, and 8 KiB to stderr plus an unterminated line to stdout in
 *                    every call: must certify like the reference
 *   EXIT0_ON_WRITE   every write calls exit(0): a process that ends "successfully" in
 *                    the middle of a call is a crash, not a pass
 *   FLAKY            each process that loads it takes a number from the counter file
 *                    KVX_TESTING_FLAKY_FILE (0, 1, 2, ... across processes); in the
 *                    processes with an odd number every write answers
 *                    INTERNAL_ERROR after writing correctly (without the variable it is
 *                    never wrong): a failure that a re-run does not repeat
 */
#define _GNU_SOURCE 1 /* dladdr */
#define KVX_BUILD_PROVIDER 1
#include <signal.h>
#include <stddef.h>
#include <unistd.h>

#include "kvx/kvx_abi.h"

#define MODE_SEGV_ON_GATHER 1
#define MODE_HANG_ON_GATHER 2
#define MODE_MAJOR2 3
#define MODE_NO_ENTRY_POINTS 4
#define MODE_CHATTY 5
#define MODE_EXIT0_ON_WRITE 6
#define MODE_FLAKY 7

#ifndef KVX_TESTING_MODE
#error "build with -DKVX_TESTING_MODE=MODE_..."
#endif

#if KVX_TESTING_MODE >= MODE_CHATTY
#define KVX_TESTING_FORWARDS 1
#else
#define KVX_TESTING_FORWARDS 0
#endif

#if KVX_TESTING_FORWARDS
/* ---------------------------------------------------------- forwarding modes */
#include <dlfcn.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>

typedef kvx_status_t (*version_fn)(kvx_version_t*);
typedef kvx_status_t (*validate_fn)(const kvx_cache_desc_t*);
typedef kvx_status_t (*write_fn)(const kvx_cache_desc_t*, const kvx_write_desc_t*, void*);
typedef kvx_status_t (*gather_fn)(const kvx_cache_desc_t*, const kvx_gather_desc_t*, void*);

static version_fn ref_version;
static validate_fn ref_validate;
static write_fn ref_write;
static gather_fn ref_gather;
static int flaky_wrong; /* FLAKY: this process answers INTERNAL_ERROR */

static void chatter(int fd, size_t bytes, char c) {
  char line[1024];
  memset(line, c, sizeof line);
  line[sizeof line - 1] = '\n';
  while (bytes > 0) {
    const size_t n = bytes < sizeof line ? bytes : sizeof line;
    const ssize_t w = write(fd, line, n);
    if (w <= 0) return;
    bytes -= (size_t)w;
  }
}

static void chat_in_call(void) {
#if KVX_TESTING_MODE == MODE_CHATTY
  chatter(2, 8 * 1024, 'e');
  static const char out[] = "kvx-testing chatty: a line without its newline ";
  (void)!write(1, out, sizeof out - 1);
#endif
}

static int flaky_number(void) {
  const char* path = getenv("KVX_TESTING_FLAKY_FILE");
  if (path == NULL || *path == 0) return -1;
  const int fd = open(path, O_RDWR | O_CREAT, 0644);
  if (fd < 0) return -1;
  flock(fd, LOCK_EX);
  char buf[32] = {0};
  const ssize_t n = pread(fd, buf, sizeof buf - 1, 0);
  const int k = n > 0 ? atoi(buf) : 0;
  const int len = snprintf(buf, sizeof buf, "%d\n", k + 1);
  if (ftruncate(fd, 0) == 0) (void)!pwrite(fd, buf, (size_t)len, 0);
  flock(fd, LOCK_UN);
  close(fd);
  return k;
}

__attribute__((constructor)) static void load_reference(void) {
  char path[4096];
  const char* env = getenv("KVX_TESTING_REFERENCE");
  if (env != NULL && *env != 0) {
    snprintf(path, sizeof path, "%s", env);
  } else {
    Dl_info info;
    if (!dladdr((void*)&load_reference, &info) || info.dli_fname == NULL) return;
    snprintf(path, sizeof path, "%s", info.dli_fname);
    char* slash = strrchr(path, '/');
    const size_t at = slash ? (size_t)(slash - path + 1) : 0;
    snprintf(path + at, sizeof path - at, "libkvx_reference.so");
  }
  void* h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (h == NULL) return; /* every entry point then answers INTERNAL_ERROR */
  ref_version = (version_fn)dlsym(h, "kvx_get_version");
  ref_validate = (validate_fn)dlsym(h, "kvx_validate_cache_desc");
  ref_write = (write_fn)dlsym(h, "kvx_write_kv");
  ref_gather = (gather_fn)dlsym(h, "kvx_gather_kv");
#if KVX_TESTING_MODE == MODE_CHATTY
  chatter(2, 2 * 1024 * 1024, 'l');
  chatter(1, 64 * 1024 - 7, 'o');
#elif KVX_TESTING_MODE == MODE_FLAKY
  const int k = flaky_number();
  flaky_wrong = k >= 0 && k % 2 == 1;
#endif
}

KVX_API kvx_status_t kvx_get_version(kvx_version_t* version) {
  chat_in_call();
  return ref_version ? ref_version(version) : KVX_STATUS_INTERNAL_ERROR;
}

KVX_API kvx_status_t kvx_validate_cache_desc(const kvx_cache_desc_t* cache) {
  chat_in_call();
  return ref_validate ? ref_validate(cache) : KVX_STATUS_INTERNAL_ERROR;
}

KVX_API kvx_status_t kvx_write_kv(const kvx_cache_desc_t* cache, const kvx_write_desc_t* desc, void* stream) {
  chat_in_call();
#if KVX_TESTING_MODE == MODE_EXIT0_ON_WRITE
  exit(0);
#endif
  const kvx_status_t st = ref_write ? ref_write(cache, desc, stream) : KVX_STATUS_INTERNAL_ERROR;
  return flaky_wrong ? KVX_STATUS_INTERNAL_ERROR : st;
}

KVX_API kvx_status_t kvx_gather_kv(const kvx_cache_desc_t* cache, const kvx_gather_desc_t* desc, void* stream) {
  chat_in_call();
  return ref_gather ? ref_gather(cache, desc, stream) : KVX_STATUS_INTERNAL_ERROR;
}

#else /* ------------------------------------------------ non-forwarding modes */

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
#endif /* KVX_TESTING_FORWARDS */
