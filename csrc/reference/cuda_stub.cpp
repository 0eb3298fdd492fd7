/*
 * cuda_stub.cpp -- the CUDA backend when the provider is built without CUDA
 * (no nvcc, KVX_WITH_CUDA=OFF, or a host-only mutant): DEVICE and UNIFIED
 * memory are UNSUPPORTED (R-ORDER step 4).
 */
#include "kvx_plan.h"

namespace kvx_ref {

bool cuda_available() { return false; }

kvx_status_t cuda_write(const WritePlan&, void*) { return KVX_STATUS_UNSUPPORTED; }

kvx_status_t cuda_gather(const GatherPlan&, void*) { return KVX_STATUS_UNSUPPORTED; }

kvx_status_t cuda_fp4_write(const WritePlan&, void*) { return KVX_STATUS_UNSUPPORTED; }

kvx_status_t cuda_fp4_gather(const GatherPlan&, void*) { return KVX_STATUS_UNSUPPORTED; }

}  // namespace kvx_ref
