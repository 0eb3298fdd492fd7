/*
 * kvx_faulting.cu -- a small CUDA provider for kvx-conform's own device-fault tests.
 *
 * Independent of the reference provider (its own validation and kernels, nothing
 * shared): DEVICE / UNIFIED memory, F16 / BF16 / F32 caches in BLOCK_NHD or BLOCK_HND
 * with any positive strides, F16 / BF16 / F32 IO (converted to and from the cache's
 * dtype, rounding to nearest even), S32 / S64 slots, PACKED block tables. Everything
 * else answers UNSUPPORTED. csrc/testing/CMakeLists.txt builds it once per variant:
 *
 *   libkvx_testing_cuda_faulting.so   KVX_FAULTING=1: a write with S64 slots and
 *                                     exactly 9 tokens stores through a wild device
 *                                     pointer (an illegal memory access: a sticky
 *                                     CUDA error that ends the process's context)
 *   libkvx_testing_cuda_twin.so       KVX_FAULTING=0: the same provider without it
 *   libkvx_testing_cuda_own_stream.so KVX_FAULTING=0, KVX_OWN_STREAM=1: the twin, its
 *                                     kernels on a stream of its own instead of the
 *                                     caller's (waited for before it returns): out of
 *                                     the caller's stream order (R-STREAM)
 *   libkvx_testing_cuda_own_stream_convert.so KVX_OWN_STREAM=2: the same for the calls
 *                                     that convert (IO dtype other than the cache's)
 *                                     only; its plain copies keep the caller's stream
 *   libkvx_testing_cuda_own_stream_small.so KVX_OWN_STREAM=3: the same for the calls of at
 *                                     most 256 rows only (a decode-sized fast path off the
 *                                     caller's stream); its large calls keep it
 *   libkvx_testing_cuda_capture_skip.so KVX_FAULTING=0, KVX_SKIP_CAPTURED=1: the twin,
 *                                     answering OK without doing anything while the
 *                                     stream it is given is capturing a CUDA graph
 *                                     (a benchmark's graph then holds no work)
 *   libkvx_testing_cuda_shared_scratch.so KVX_FAULTING=0, KVX_SHARED_SCRATCH=1: the twin,
 *                                     its index arrays in one device scratch buffer
 *                                     shared by all calls, guarded by a lock held only
 *                                     while the call enqueues its work (a busy kernel,
 *                                     as a larger call's work would be, then the move):
 *                                     safe while every call is on one stream, not for
 *                                     threads calling on streams of their own (R-THREADS)
 *
 * tests/test_device_faults.py runs the suites on both and requires the faulting
 * calls' tests to be device-fault crashes and every other test to match the twin;
 * tests/test_stream_order.py holds the own-stream build to `stream.order`;
 * tests/test_bench_graph_work.py requires the bench to fail the capture-skipping build;
 * tests/test_thread_streams.py holds the shared-scratch build to `concurrency.threads.streams`.
 */
#define KVX_BUILD_PROVIDER 1
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <string.h>

#include <mutex>
#include <vector>

#include "kvx/kvx_abi.h"

#ifndef KVX_FAULTING
#error "build with -DKVX_FAULTING=0 or 1"
#endif
#ifndef KVX_OWN_STREAM
#define KVX_OWN_STREAM 0
#endif
#ifndef KVX_SKIP_CAPTURED
#define KVX_SKIP_CAPTURED 0
#endif
#ifndef KVX_SHARED_SCRATCH
#define KVX_SHARED_SCRATCH 0
#endif

namespace {

constexpr kvx_status_t OK = KVX_STATUS_OK;
constexpr kvx_status_t INVALID = KVX_STATUS_INVALID_ARGUMENT;
constexpr kvx_status_t UNSUPPORTED = KVX_STATUS_UNSUPPORTED;
constexpr kvx_status_t OUT_OF_RANGE = KVX_STATUS_OUT_OF_RANGE;
constexpr uint64_t kFaultTokens = 9;

__host__ __device__ int elem_size(kvx_dtype_t t) {
  switch (t) {
    case KVX_DTYPE_F16:
    case KVX_DTYPE_BF16: return 2;
    case KVX_DTYPE_F32: return 4;
    default: return 0;
  }
}

bool gpu_memory(kvx_memory_type_t m) { return m == KVX_MEMORY_DEVICE || m == KVX_MEMORY_UNIFIED; }

/* Element strides of a cache tensor as (block, token, head, dim). */
struct CacheView {
  char* data;
  int64_t sb, st, sh, sd;
  kvx_dtype_t dtype;
};

kvx_status_t check_cache_tensor(const kvx_cache_desc_t* c, const kvx_tensor_desc_t& t, CacheView* out) {
  if (t.size < sizeof(kvx_tensor_desc_t)) return INVALID;
  if (t.memory == KVX_MEMORY_HOST) return UNSUPPORTED;
  if (!gpu_memory(t.memory)) return INVALID;
  if (t.dtype == KVX_DTYPE_F8_E4M3 || t.dtype == KVX_DTYPE_F8_E5M2) return UNSUPPORTED;
  if (elem_size(t.dtype) == 0) return INVALID;
  if (t.layout == KVX_LAYOUT_BLOCK_HND_PACKED || t.layout == KVX_LAYOUT_BLOCK_CUSTOM) return UNSUPPORTED;
  if (t.layout != KVX_LAYOUT_BLOCK_NHD && t.layout != KVX_LAYOUT_BLOCK_HND) return INVALID;
  if (t.ndim != 4 || t.data == nullptr) return INVALID;
  const bool nhd = t.layout == KVX_LAYOUT_BLOCK_NHD;
  const int64_t want[4] = {c->num_blocks, nhd ? c->block_size : c->num_kv_heads,
                           nhd ? c->num_kv_heads : c->block_size, c->head_dim};
  for (int i = 0; i < 4; ++i)
    if (t.shape[i] != want[i] || t.stride[i] <= 0) return INVALID;
  out->data = static_cast<char*>(t.data);
  out->dtype = t.dtype;
  out->sb = t.stride[0];
  out->st = nhd ? t.stride[1] : t.stride[2];
  out->sh = nhd ? t.stride[2] : t.stride[1];
  out->sd = t.stride[3];
  return OK;
}

kvx_status_t check_cache(const kvx_cache_desc_t* c, CacheView* k, CacheView* v) {
  if (c == nullptr || c->size < sizeof(kvx_cache_desc_t)) return INVALID;
  if (c->num_blocks == 0 || c->block_size == 0 || c->num_kv_heads == 0 || c->head_dim == 0) return INVALID;
  if (c->pool.primary != nullptr || c->pool.secondary != nullptr) return UNSUPPORTED;
  kvx_status_t st = check_cache_tensor(c, c->k, k);
  if (st != OK) return st;
  st = check_cache_tensor(c, c->v, v);
  if (st != OK) return st;
  if (c->k.dtype != c->v.dtype || c->k.layout != c->v.layout) return UNSUPPORTED;
  return OK;
}

/* An IO tensor [num_tokens, num_kv_heads, head_dim]: F16, BF16 or F32, converted to and from
 * the cache's dtype (round to nearest even when narrowing). */
struct IOView {
  char* data;
  int64_t st, sh, sd;
  kvx_dtype_t dtype;
};

kvx_status_t check_io(const kvx_kv_io_desc_t& io, const kvx_cache_desc_t* c, IOView* key, IOView* value) {
  if (io.size < sizeof(kvx_kv_io_desc_t)) return INVALID;
  if (io.num_kv_heads != c->num_kv_heads || io.head_dim != c->head_dim) return INVALID;
  const kvx_tensor_desc_t* ts[2] = {&io.key, &io.value};
  IOView* out[2] = {key, value};
  for (int i = 0; i < 2; ++i) {
    const kvx_tensor_desc_t& t = *ts[i];
    if (t.size < sizeof(kvx_tensor_desc_t)) return INVALID;
    if (t.memory == KVX_MEMORY_HOST) return UNSUPPORTED;
    if (!gpu_memory(t.memory)) return INVALID;
    if (elem_size(t.dtype) == 0 && t.dtype != KVX_DTYPE_F8_E4M3 && t.dtype != KVX_DTYPE_F8_E5M2) return INVALID;
    if (elem_size(t.dtype) == 0) return UNSUPPORTED; /* FP8 IO */
    if (t.ndim != 3) return t.ndim == 4 ? UNSUPPORTED : INVALID;
    if (t.shape[0] != (int64_t)io.num_tokens || t.shape[1] != (int64_t)io.num_kv_heads ||
        t.shape[2] != (int64_t)io.head_dim)
      return INVALID;
    if (io.num_tokens > 0 && t.data == nullptr) return INVALID;
    for (int d = 0; d < 3; ++d)
      if (t.stride[d] <= 0) return INVALID;
    *out[i] = IOView{static_cast<char*>(t.data), t.stride[0], t.stride[1], t.stride[2], t.dtype};
  }
  return OK;
}

bool copy_to_host(void* dst, const void* src, size_t n) {
  return n == 0 || cudaMemcpy(dst, src, n, cudaMemcpyDefault) == cudaSuccess;
}

int64_t load_index(const std::vector<char>& raw, kvx_dtype_t dt, size_t i) {
  if (dt == KVX_DTYPE_S32) {
    int32_t x;
    memcpy(&x, raw.data() + 4 * i, 4);
    return x;
  }
  int64_t x;
  memcpy(&x, raw.data() + 8 * i, 8);
  return x;
}

__device__ float load_value(const char* p, kvx_dtype_t t) {
  if (t == KVX_DTYPE_F16) return __half2float(*reinterpret_cast<const __half*>(p));
  if (t == KVX_DTYPE_BF16) return __bfloat162float(*reinterpret_cast<const __nv_bfloat16*>(p));
  return *reinterpret_cast<const float*>(p);
}

__device__ void store_value(char* p, kvx_dtype_t t, float x) {
  if (t == KVX_DTYPE_F16) {
    *reinterpret_cast<__half*>(p) = __float2half_rn(x);
  } else if (t == KVX_DTYPE_BF16) {
    *reinterpret_cast<__nv_bfloat16*>(p) = __float2bfloat16_rn(x);
  } else {
    *reinterpret_cast<float*>(p) = x;
  }
}

/* One thread per (row, head, dim) element: move one element between the cache slot (blk[r], tok[r])
 * and IO row row[r], into the cache when to_cache: its bytes when the dtypes agree, else converted.
 * blk[r] < 0 skips row r. */
__global__ void move_rows(char* cache, int64_t c_sb, int64_t c_st, int64_t c_sh, int64_t c_sd, kvx_dtype_t c_dt,
                          char* io, int64_t i_st, int64_t i_sh, int64_t i_sd, kvx_dtype_t i_dt, const int64_t* blk,
                          const int64_t* tok, const int64_t* row, uint64_t rows, uint32_t heads, uint32_t dim,
                          int to_cache) {
  const uint64_t i = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x;
  if (i >= rows * heads * dim) return;
  const uint64_t r = i / ((uint64_t)heads * dim);
  const uint64_t h = (i / dim) % heads;
  const uint64_t d = i % dim;
  if (blk[r] < 0) return;
  const int c_size = elem_size(c_dt), i_size = elem_size(i_dt);
  char* c = cache + (blk[r] * c_sb + tok[r] * c_st + (int64_t)h * c_sh + (int64_t)d * c_sd) * c_size;
  char* x = io + (row[r] * i_st + (int64_t)h * i_sh + (int64_t)d * i_sd) * i_size;
  char* to = to_cache ? c : x;
  const char* from = to_cache ? x : c;
  if (c_dt == i_dt) {
    for (int b = 0; b < c_size; ++b) to[b] = from[b];
  } else {
    store_value(to, to_cache ? c_dt : i_dt, load_value(from, to_cache ? i_dt : c_dt));
  }
}

/* The injected defect: a store through a pointer no allocation covers. */
__global__ void wild_store(uint64_t n) {
  char* wild = reinterpret_cast<char*>(0x1000ull * n); /* the unmapped first pages */
  wild[threadIdx.x] = 1;
}

/* KVX_SHARED_SCRATCH: keeps the stream busy for about a millisecond (a larger call's work) */
__global__ void busy(long long cycles) {
  const long long t0 = clock64();
  while (clock64() - t0 < cycles) {
  }
}

/* KVX_SHARED_SCRATCH (the defect): one index scratch buffer for every call, the lock held only
 * while a call enqueues its work on its stream */
struct SharedScratch {
  std::mutex lock;
  int64_t* data = nullptr;
  uint64_t capacity = 0;  // int64_t elements
};

SharedScratch& shared_scratch() {
  static SharedScratch s;
  return s;
}

kvx_status_t launch(const CacheView& cv, const IOView& io, const std::vector<int64_t>& blk,
                    const std::vector<int64_t>& tok, const std::vector<int64_t>& row, uint32_t heads, uint32_t dim,
                    bool to_cache, cudaStream_t stream) {
  const uint64_t rows = blk.size();
  if (rows == 0) return OK;
  int64_t* dev = nullptr;
  std::unique_lock<std::mutex> hold;
  /* per call, the allocation is stream-ordered: cudaMalloc / cudaFree may wait for the whole
   * device, which would hide the own-stream defect behind an implicit synchronization */
  if (KVX_SHARED_SCRATCH) {
    SharedScratch& sc = shared_scratch();
    hold = std::unique_lock<std::mutex>(sc.lock);
    if (sc.capacity < 3 * rows) {
      cudaFree(sc.data);
      sc.data = nullptr;
      sc.capacity = 0;
      if (cudaMalloc(&sc.data, 3 * rows * sizeof(int64_t)) != cudaSuccess) return KVX_STATUS_INTERNAL_ERROR;
      sc.capacity = 3 * rows;
    }
    dev = sc.data;
  } else if (cudaMallocAsync(&dev, 3 * rows * sizeof(int64_t), stream) != cudaSuccess) {
    return KVX_STATUS_INTERNAL_ERROR;
  }
  cudaMemcpyAsync(dev, blk.data(), rows * 8, cudaMemcpyHostToDevice, stream);
  cudaMemcpyAsync(dev + rows, tok.data(), rows * 8, cudaMemcpyHostToDevice, stream);
  cudaMemcpyAsync(dev + 2 * rows, row.data(), rows * 8, cudaMemcpyHostToDevice, stream);
  if (KVX_SHARED_SCRATCH) busy<<<1, 1, 0, stream>>>(2000000);
  const uint64_t n = rows * heads * dim;
  const unsigned threads = 256;
  const unsigned blocks = (unsigned)((n + threads - 1) / threads);
  move_rows<<<blocks, threads, 0, stream>>>(cv.data, cv.sb, cv.st, cv.sh, cv.sd, cv.dtype, io.data, io.st, io.sh,
                                             io.sd, io.dtype, dev, dev + rows, dev + 2 * rows, rows, heads, dim,
                                             to_cache ? 1 : 0);
  const cudaError_t launched = cudaGetLastError();
  if (KVX_SHARED_SCRATCH) {
    hold.unlock();
  } else {
    cudaFreeAsync(dev, stream);
  }
  cudaStreamSynchronize(stream);
  return launched == cudaSuccess ? OK : KVX_STATUS_INTERNAL_ERROR;
}

/* KVX_OWN_STREAM=3: calls of at most this many rows (a decode-sized fast path) */
constexpr uint64_t kSmallRows = 256;

/* The stream a call's work goes to: the caller's, or (KVX_OWN_STREAM, the defect: 1 every call,
 * 2 the converting calls, 3 the calls of at most kSmallRows rows) one of this provider's own that
 * does not wait for the caller's stream. */
cudaStream_t work_stream(void* caller, bool converting, uint64_t rows) {
  if (KVX_OWN_STREAM == 1 || (KVX_OWN_STREAM == 2 && converting) || (KVX_OWN_STREAM == 3 && rows <= kSmallRows)) {
    static cudaStream_t own = [] {
      cudaStream_t s = nullptr;
      cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
      return s;
    }();
    return own;
  }
  return static_cast<cudaStream_t>(caller);
}

/* KVX_SKIP_CAPTURED (the defect): true while `stream` is capturing a graph, when the call then does nothing */
bool skipped(void* stream) {
#if KVX_SKIP_CAPTURED
  cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
  return cudaStreamIsCapturing(static_cast<cudaStream_t>(stream), &st) == cudaSuccess &&
         st != cudaStreamCaptureStatusNone;
#else
  (void)stream;
  return false;
#endif
}

}  // namespace

extern "C" {

KVX_API kvx_status_t kvx_get_version(kvx_version_t* version) {
  if (version == nullptr || version->size < sizeof(kvx_version_t)) return INVALID;
  version->abi_major = 1;
  version->abi_minor = 1;
  version->abi_patch = 0;
  return OK;
}

KVX_API kvx_status_t kvx_validate_cache_desc(const kvx_cache_desc_t* cache) {
  CacheView k, v;
  return check_cache(cache, &k, &v);
}

KVX_API kvx_status_t kvx_write_kv(const kvx_cache_desc_t* cache, const kvx_write_desc_t* desc, void* stream) {
  CacheView k, v;
  kvx_status_t st = check_cache(cache, &k, &v);
  if (st != OK) return st;
  if (skipped(stream)) return OK;
  if (desc == nullptr || desc->size < sizeof(kvx_write_desc_t)) return INVALID;
  IOView key, value;
  st = check_io(desc->io, cache, &key, &value);
  if (st != OK) return st;
  const kvx_slot_mapping_t& sm = desc->slots;
  if (sm.size < sizeof(kvx_slot_mapping_t)) return INVALID;
  if (sm.dtype != KVX_DTYPE_S32 && sm.dtype != KVX_DTYPE_S64) return INVALID;
  if (sm.token_count != desc->io.num_tokens) return INVALID;
  const uint64_t n = desc->io.num_tokens;
  if (n == 0) return OK;
  if (sm.slots == nullptr) return INVALID;
  const size_t width = sm.dtype == KVX_DTYPE_S32 ? 4 : 8;
  std::vector<char> raw(n * width);
  if (!copy_to_host(raw.data(), sm.slots, raw.size())) return KVX_STATUS_INTERNAL_ERROR;
  const int64_t num_slots = (int64_t)cache->num_blocks * cache->block_size;
  std::vector<int64_t> blk(n), tok(n), row(n);
  for (uint64_t i = 0; i < n; ++i) {
    const int64_t s = load_index(raw, sm.dtype, i);
    row[i] = (int64_t)i;
    if (s < 0 || s == sm.invalid_slot) {
      blk[i] = -1;
      tok[i] = 0;
      continue;
    }
    if (s >= num_slots) return OUT_OF_RANGE; /* nothing written */
    blk[i] = s / cache->block_size;
    tok[i] = s % cache->block_size;
  }
  cudaStream_t cs = work_stream(stream, key.dtype != k.dtype || value.dtype != v.dtype, n);
  if (KVX_FAULTING && sm.dtype == KVX_DTYPE_S64 && n == kFaultTokens) {
    wild_store<<<1, 32, 0, cs>>>(n);
    cudaStreamSynchronize(cs);
    return OK;
  }
  st = launch(k, key, blk, tok, row, cache->num_kv_heads, cache->head_dim, true, cs);
  if (st != OK) return st;
  return launch(v, value, blk, tok, row, cache->num_kv_heads, cache->head_dim, true, cs);
}

KVX_API kvx_status_t kvx_gather_kv(const kvx_cache_desc_t* cache, const kvx_gather_desc_t* desc, void* stream) {
  CacheView k, v;
  kvx_status_t st = check_cache(cache, &k, &v);
  if (st != OK) return st;
  if (skipped(stream)) return OK;
  if (desc == nullptr || desc->size < sizeof(kvx_gather_desc_t)) return INVALID;
  IOView key, value;
  st = check_io(desc->io, cache, &key, &value);
  if (st != OK) return st;
  const kvx_block_table_t& bt = desc->block_table;
  const kvx_seq_lens_t& sl = desc->seq_lens;
  if (bt.size < sizeof(kvx_block_table_t) || sl.size < sizeof(kvx_seq_lens_t)) return INVALID;
  if (bt.format == KVX_BLOCK_TABLE_RAGGED || bt.format == KVX_BLOCK_TABLE_KV_OFFSETS) return UNSUPPORTED;
  if (bt.format != KVX_BLOCK_TABLE_PACKED) return INVALID;
  if (bt.index_dtype != KVX_DTYPE_S32 && bt.index_dtype != KVX_DTYPE_S64) return INVALID;
  if (sl.dtype != KVX_DTYPE_S32 && sl.dtype != KVX_DTYPE_S64) return INVALID;
  if (bt.beam_width != 1 || bt.indptr != nullptr || bt.indptr_count != 0) return INVALID;
  if (sl.seq_count != bt.seq_count) return INVALID;
  if ((uint64_t)bt.indices_count != (uint64_t)bt.seq_count * bt.max_blocks_per_seq) return INVALID;
  if ((uint64_t)desc->io.num_tokens != (uint64_t)bt.seq_count * desc->max_seq_len) return INVALID;
  if (bt.seq_count == 0 || desc->max_seq_len == 0) return OK;
  if (bt.indices == nullptr && bt.indices_count > 0) return INVALID;
  if (sl.lengths == nullptr) return INVALID;
  std::vector<char> idx((size_t)bt.indices_count * (bt.index_dtype == KVX_DTYPE_S32 ? 4 : 8));
  std::vector<char> lens((size_t)bt.seq_count * (sl.dtype == KVX_DTYPE_S32 ? 4 : 8));
  if (!copy_to_host(idx.data(), bt.indices, idx.size()) || !copy_to_host(lens.data(), sl.lengths, lens.size()))
    return KVX_STATUS_INTERNAL_ERROR;
  std::vector<int64_t> blk, tok, row;
  for (uint32_t s = 0; s < bt.seq_count; ++s) {
    const int64_t L = load_index(lens, sl.dtype, s);
    if (L < 0) return INVALID;
    const uint64_t n = (uint64_t)L < desc->max_seq_len ? (uint64_t)L : desc->max_seq_len;
    if ((uint64_t)L > (uint64_t)bt.max_blocks_per_seq * cache->block_size) return OUT_OF_RANGE;
    for (uint64_t t = 0; t < n; ++t) {
      const int64_t b = load_index(idx, bt.index_dtype, (size_t)s * bt.max_blocks_per_seq + t / cache->block_size);
      if (b < 0 || b >= (int64_t)cache->num_blocks) return OUT_OF_RANGE;
      blk.push_back(b);
      tok.push_back((int64_t)(t % cache->block_size));
      row.push_back((int64_t)(s * (uint64_t)desc->max_seq_len + t));
    }
  }
  cudaStream_t cs = work_stream(stream, key.dtype != k.dtype || value.dtype != v.dtype, blk.size());
  st = launch(k, key, blk, tok, row, cache->num_kv_heads, cache->head_dim, false, cs);
  if (st != OK) return st;
  return launch(v, value, blk, tok, row, cache->num_kv_heads, cache->head_dim, false, cs);
}

}  // extern "C"
