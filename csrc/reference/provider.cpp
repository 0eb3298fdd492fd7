/*
 * provider.cpp -- the four exported KVX entry points of the reference provider.
 *
 * Each call runs the front end (frontend.cpp: R-ORDER steps 1-3, plan), then
 * step 4, memory-type support: HOST memory goes to the host backend
 * (host_backend.cpp); DEVICE and UNIFIED memory to the CUDA backend when it
 * is compiled in and a device is usable, else UNSUPPORTED. Step 5 (data) is
 * the backend's. Stateless (spec 7.2).
 */
#include <signal.h>
#include <stdlib.h>

#include <chrono>
#include <thread>

#include "frontend.h"
#include "kvx/kvx_abi.h"
#include "kvx_plan.h"
#include "mutants.h"

namespace {

using kvx_ref::cuda_available;

/* R-ORDER step 4. */
kvx_status_t memory_supported(kvx_memory_type_t memory) {
  if (memory == KVX_MEMORY_HOST) return KVX_STATUS_OK;
  return cuda_available() ? KVX_STATUS_OK : KVX_STATUS_UNSUPPORTED;
}

[[noreturn]] void hang_forever() {
  for (;;) std::this_thread::sleep_for(std::chrono::hours(1));
}

}  // namespace

extern "C" {

KVX_API kvx_status_t kvx_get_version(kvx_version_t* version) {
  /* R-SIZE: NULL or size < 16 -> INVALID_ARGUMENT, nothing written. */
  if (version == nullptr || version->size < sizeof(kvx_version_t)) return KVX_STATUS_INVALID_ARGUMENT;
  version->size = sizeof(kvx_version_t);
  version->abi_major = KVX_ABI_VERSION_MAJOR;
  version->abi_minor = KVX_MUT(WRONG_VERSION) ? 0 : KVX_ABI_VERSION_MINOR;
  version->abi_patch = KVX_ABI_VERSION_PATCH;
  return KVX_STATUS_OK;
}

KVX_API kvx_status_t kvx_validate_cache_desc(const kvx_cache_desc_t* cache) {
  const kvx_status_t st = kvx_ref::check_cache_call(cache);
  if (st != KVX_STATUS_OK) return st;
  return memory_supported(cache->k.memory);
}

KVX_API kvx_status_t kvx_write_kv(const kvx_cache_desc_t* cache, const kvx_write_desc_t* desc, void* stream) {
  if (KVX_MUT(SEGV_ON_WRITE)) raise(SIGSEGV);
  if (KVX_MUT(HANG_ON_WRITE)) hang_forever();
  if (KVX_MUT(NOOP_OK)) return KVX_STATUS_OK;
  kvx_ref::WritePlan plan{};
  kvx_status_t st = kvx_ref::resolve_write(cache, desc, &plan);
  if (st != KVX_STATUS_OK) return st;
  st = memory_supported(plan.memory);
  if (st != KVX_STATUS_OK) return st;
  if (plan.memory == KVX_MEMORY_HOST) return kvx_ref::host_write(plan);
  return kvx_ref::cuda_write(plan, stream);
}

KVX_API kvx_status_t kvx_gather_kv(const kvx_cache_desc_t* cache, const kvx_gather_desc_t* desc, void* stream) {
  if (KVX_MUT(ABORT_ON_GATHER)) abort();
  if (KVX_MUT(NOOP_OK)) return KVX_STATUS_OK;
  kvx_ref::GatherPlan plan{};
  kvx_status_t st = kvx_ref::resolve_gather(cache, desc, &plan);
  if (st != KVX_STATUS_OK) return st;
  st = memory_supported(plan.memory);
  if (st != KVX_STATUS_OK) return st;
  if (plan.memory == KVX_MEMORY_HOST) return kvx_ref::host_gather(plan);
  return kvx_ref::cuda_gather(plan, stream);
}

}  /* extern "C" */
