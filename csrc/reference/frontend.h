/*
 * frontend.h -- the reference provider's front end: NULL checks, size guards,
 * descriptor rules and plan resolution (docs/spec-readings.md R-SIZE, R-ORDER,
 * R-CACHE, R-IO, R-CONVERT, R-FP8, R-WRITE, R-GATHER).
 *
 * Each resolve_* runs R-ORDER steps 1-3 for its call and, on OK, fills the
 * plan; step 4 (memory support) and step 5 (data) are the dispatcher's and
 * the backends' (provider.cpp, host_backend.cpp). Within a step every
 * INVALID_ARGUMENT rule is decided before any UNSUPPORTED one: a malformed
 * descriptor is malformed whatever the provider supports.
 */
#ifndef KVX_REFERENCE_FRONTEND_H
#define KVX_REFERENCE_FRONTEND_H

#include "kvx/kvx_abi.h"
#include "kvx_plan.h"

namespace kvx_ref {

/* kvx_validate_cache_desc, steps 1-2: the cache's own guards and rules. */
kvx_status_t check_cache_call(const kvx_cache_desc_t* cache);

/* kvx_write_kv / kvx_gather_kv, steps 1-3, then the plan. */
kvx_status_t resolve_write(const kvx_cache_desc_t* cache, const kvx_write_desc_t* desc, WritePlan* plan);
kvx_status_t resolve_gather(const kvx_cache_desc_t* cache, const kvx_gather_desc_t* desc, GatherPlan* plan);

}  // namespace kvx_ref

#endif /* KVX_REFERENCE_FRONTEND_H */
