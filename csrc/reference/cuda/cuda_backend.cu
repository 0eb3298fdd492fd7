/*
 * cuda_backend.cu -- the CUDA backend of the reference provider (kvx_plan.h):
 * cuda_available(), cuda_write(), cuda_gather() for DEVICE and UNIFIED memory.
 *
 * Semantics are the host backend's (docs/spec-readings.md R-WRITE, R-GATHER,
 * R-DATA, R-CONVERT, R-FP8) with one difference allowed by R-DEVICE-STATUS: a
 * data-dependent error (bad slot, block id, length, indptr range, KV_OFFSETS
 * null / secondary index) skips the rows it concerns and the call returns OK;
 * nothing outside the tensors is ever touched. A DEVICE call only enqueues
 * kernels on `stream` (NULL: the default stream): it never synchronizes, copies
 * or allocates, so it can be captured into a CUDA graph. A UNIFIED call first
 * runs the host's pre-scan on its host-readable metadata (after waiting for the
 * stream), so it answers exactly the host's statuses.
 *
 * Each call is planned here on the host: per tensor pair (K, V) the fast path
 * (16-byte chunks) when head_dim runs are contiguous and aligned, else the
 * general element path; K and V share one launch when they share the kernel.
 */
#include <cuda_runtime.h>

#include <string.h>

#include "convert.h"
#include "kvx_plan.h"
#include "move.cuh"

namespace kvx_ref {

bool cuda_available() {
  static const bool ok = [] {
    int n = 0;
    const cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
      cudaGetLastError(); /* clear: no driver / no device is not our caller's error */
      return false;
    }
    return n > 0;
  }();
  return ok;
}

/* R-PLACEMENT (docs/spec-readings.md): a DEVICE pointer names its GPU. Where more than one GPU is
 * visible, a call runs on the GPU that holds its cache, whatever the calling thread's current
 * device (switched for the call and restored after); a call whose IO lies on another GPU, or whose
 * stream belongs to another GPU, is refused with UNSUPPORTED (the optional feature multi_device).
 * With one GPU, nothing is asked of the driver. */
namespace {

int device_count() {
  static const int n = [] {
    int c = 0;
    if (cudaGetDeviceCount(&c) != cudaSuccess) {
      cudaGetLastError();
      return 0;
    }
    return c;
  }();
  return n;
}

/* The GPU holding `p`, or -1 where the driver does not say (then nothing is switched). */
int device_of(const void* p) {
  if (!p) return -1;
  cudaPointerAttributes a;
  if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
    cudaGetLastError();
    return -1;
  }
  return a.type == cudaMemoryTypeDevice ? a.device : -1;
}

class DeviceScope {
 public:
  kvx_status_t enter(int memory, const void* cache, const void* io, void* stream) {
    if (memory != KVX_MEMORY_DEVICE || device_count() < 2) return KVX_STATUS_OK;
    /* A stream being captured into a CUDA graph: no pointer query (cudaPointerGetAttributes is
     * not allowed there and would invalidate the capture); the work goes where the stream's
     * device is, as captured work must. */
    if (stream) {
      cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
      if (cudaStreamIsCapturing((cudaStream_t)stream, &capture) != cudaSuccess) {
        cudaGetLastError();
        return KVX_STATUS_OK;
      }
      if (capture != cudaStreamCaptureStatusNone) return KVX_STATUS_OK;
    }
    const int dev = device_of(cache);
    if (dev < 0) return KVX_STATUS_OK;
    const int io_dev = device_of(io);
    if (io_dev >= 0 && io_dev != dev) return KVX_STATUS_UNSUPPORTED;
#if CUDART_VERSION >= 12080
    if (stream) {
      int sdev = -1;
      if (cudaStreamGetDevice((cudaStream_t)stream, &sdev) == cudaSuccess) {
        if (sdev != dev) return KVX_STATUS_UNSUPPORTED;
      } else {
        cudaGetLastError();
      }
    }
#endif
    int cur = -1;
    if (cudaGetDevice(&cur) != cudaSuccess) return KVX_STATUS_INTERNAL_ERROR;
    if (cur != dev) {
      if (cudaSetDevice(dev) != cudaSuccess) {
        cudaGetLastError();
        return KVX_STATUS_UNSUPPORTED;
      }
      prev_ = cur;
    }
    return KVX_STATUS_OK;
  }
  ~DeviceScope() {
    if (prev_ >= 0) cudaSetDevice(prev_);
  }

 private:
  int prev_ = -1;
};

}  // namespace

}  // namespace kvx_ref

namespace kvx_cuda {
namespace {

using kvx_ref::CacheTensorPlan;
using kvx_ref::IoTensorPlan;

uint32_t host_default_nan() {
  static const uint32_t bits = [] {
    volatile float z = 0.0f;
    const float n = z / z;
    uint32_t u;
    memcpy(&u, &n, 4);
    return u;
  }();
  return bits;
}

bool aligned(const void* p, unsigned long long bytes) { return ((uintptr_t)p % bytes) == 0; }
/* A stride matters only on a dimension of extent > 1. */
bool stride_ok(long long stride, unsigned long long extent, int vec) { return extent <= 1 || stride % vec == 0; }

struct JobPlan {
  Job job;
  kvx_dtype_t src, dst;  /* value flow: write IO -> cache, gather cache -> IO */
  bool fast;
  bool packed;           /* fast path with more than one head_dim group */
  bool token_inner;      /* general path: the cache's token stride is its smallest */
};

/* Fills the job's cache side. `pool` true: KV_OFFSETS blocks (HND contiguous,
 * base from the pools), else the plan's strides. */
void cache_side(JobPlan& jp, const CacheTensorPlan& c, bool pool, uint32_t H, uint32_t D, uint32_t bs) {
  Job& j = jp.job;
  j.cache = (char*)c.data;
  j.cache_dtype = c.dtype;
  j.cache_esize = (int)kvx_ref::dtype_size(c.dtype);
  if (pool) {
    j.c_block = 0;
    j.c_token = D;
    j.c_head = (long long)bs * D;
    j.c_outer = 1;
    j.c_inner = 1;
  } else {
    j.c_block = c.s_block;
    j.c_token = c.s_token;
    j.c_head = c.s_head;
    j.c_outer = c.s_dim_outer;
    j.c_inner = c.s_dim_inner;
  }
}

void io_side(JobPlan& jp, const IoTensorPlan& io) {
  Job& j = jp.job;
  j.io = (char*)io.data;
  j.io_dtype = io.dtype;
  j.io_esize = (int)kvx_ref::dtype_size(io.dtype);
  j.io_token = io.s_token;
  j.io_head = io.s_head;
  j.io_dim = io.s_dim;
}

/* Decides fast or general for one job and sets grp accordingly. */
void choose_path(JobPlan& jp, const CacheTensorPlan& c, bool pool, const void* const pools[2],
                 unsigned long long bytes_per_block, uint64_t rows, uint32_t H, uint32_t D, uint32_t bs,
                 uint32_t num_blocks) {
  Job& j = jp.job;
  const long long pack = pool ? 1 : (c.pack > 0 ? c.pack : 1);
  const int vec = fast_vec(jp.src, jp.dst);
  const unsigned long long cbytes = (unsigned long long)vec * j.cache_esize;
  const unsigned long long iobytes = (unsigned long long)vec * j.io_esize;
  bool fast = D % vec == 0;
  /* IO side: head_dim contiguous, every chunk aligned. */
  fast = fast && (D == 1 || j.io_dim == 1) && aligned(j.io, iobytes) && stride_ok(j.io_token, rows, vec) &&
         stride_ok(j.io_head, H, vec);
  bool packed = false;
  if (pool) {
    fast = fast && aligned(pools[0], cbytes) && (!pools[1] || aligned(pools[1], cbytes)) &&
           bytes_per_block % cbytes == 0;
  } else {
    fast = fast && aligned(j.cache, cbytes) && stride_ok(j.c_block, num_blocks, vec) &&
           stride_ok(j.c_token, bs, vec) && stride_ok(j.c_head, H, vec);
    if (pack == 1) {
      fast = fast && (D == 1 || j.c_outer == 1);
    } else {
      fast = fast && j.c_inner == 1 && pack % vec == 0 && stride_ok(j.c_outer, (unsigned long long)(D / pack), vec);
      packed = (uint32_t)pack < D;
    }
  }
  jp.fast = fast;
  jp.packed = fast && packed;
  if (fast) {
    const uint32_t chunks = D / vec;
    const uint32_t per_group = pack == 1 ? chunks : (uint32_t)(pack / vec);
    j.grp = make_fastdiv(per_group);
    if (pack == 1) j.c_outer = 0;
    jp.token_inner = false;
  } else {
    j.grp = make_fastdiv((uint32_t)pack);
    if (pack == 1) j.c_inner = 0;
    const long long dim_step = pack == 1 ? j.c_outer : j.c_inner;
    jp.token_inner = bs > 1 && j.c_token < dim_step;
  }
}

/* Whether the jobs' tensors sit on element boundaries (else p.bytewise). */
bool jobs_elem_aligned(const JobPlan jobs[2], bool pool) {
  for (int i = 0; i < 2; ++i) {
    const Job& j = jobs[i].job;
    if (!aligned(j.io, j.io_esize)) return false;
    if (!pool && !aligned(j.cache, j.cache_esize)) return false;
    if (j.scale_kind != SCALE_ONE && !aligned(j.scale, 4)) return false;
  }
  return true;
}

/* The FP8 tile kernel (move_packed_fp8) stores 16-byte pieces of the cache, where the fast
 * path's checks only cover its 4- or 8-byte chunks: the cache and every stride the kernel
 * steps by must be 16-byte multiples too (padded HND_PACKED strides need not be; those
 * calls take the generic fast path). */
bool pieces16(const Job& j, uint32_t H, uint32_t bs) {
  const long long es = j.cache_esize;
  return aligned(j.cache, 16) && (j.c_block * es) % 16 == 0 && (bs <= 1 || (j.c_token * es) % 16 == 0) &&
         (H <= 1 || (j.c_head * es) % 16 == 0) && (j.c_outer * es) % 16 == 0;
}

bool same_kernel(const JobPlan& a, const JobPlan& b) {
  if (a.fast != b.fast) return false;
  if (!a.fast) return true; /* one general kernel */
  if (a.src == a.dst && b.src == b.dst) return kvx_ref::dtype_size(a.src) == kvx_ref::dtype_size(b.src);
  return a.src == b.src && a.dst == b.dst;
}

/* Launches jobs[0..n) (sharing one kernel) over all rows, in pieces whose item
 * count fits 31 bits. */
kvx_status_t launch_jobs(MoveParams p, const JobPlan* jobs, uint32_t n, uint64_t rows, uint32_t H, uint32_t D,
                         cudaStream_t stream) {
  p.njobs = n;
  for (uint32_t i = 0; i < n; ++i) p.job[i] = jobs[i].job;
  if (n == 1) p.job[1] = jobs[0].job;
  const bool fast = jobs[0].fast;
  bool packed = false, token_inner = false;
  for (uint32_t i = 0; i < n; ++i) {
    packed |= jobs[i].packed;
    token_inner |= jobs[i].token_inner;
  }
  const uint32_t vec = fast ? (uint32_t)fast_vec(jobs[0].src, jobs[0].dst) : 1u;
  const uint32_t chunks = D / vec;
  p.vec = vec;
  p.fd_c = make_fastdiv(chunks);
  p.fd_h = make_fastdiv(H);
  /* Rows per group: HND_PACKED fast path 8 (8 tokens x 16 bytes = a 128-byte line
   * per chunk when they share a block; 16 measured slower); general path 8 when
   * tokens are innermost. */
  p.lg_tg = fast ? (packed ? (uint32_t)KVX_CUDA_PACKED_LG_TG : 0u) : (token_inner ? 3u : 0u);
  /* HND_PACKED with 16-byte pack groups on every job, same dtype, whole tiles
   * of 16 dgroups per head: the shared-memory tile kernel (move_packed.cu). */
  bool tiles = KVX_CUDA_PACKED_SMEM && fast && chunks % 16 == 0;
  for (uint32_t i = 0; i < n; ++i)
    tiles = tiles && jobs[i].packed && jobs[i].job.grp.div == 1 && jobs[i].src == jobs[i].dst;
  /* Quantizing writes into FP8 HND_PACKED with 16-element pack groups, head_dim a
   * multiple of 128: the tile kernel with the conversion (move_packed.cu). */
  bool qtiles = KVX_CUDA_PACKED_SMEM && fast && p.kind == KIND_WRITE && D % 128 == 0;
  for (uint32_t i = 0; i < n; ++i)
    qtiles = qtiles && jobs[i].packed && kvx_ref::is_fp8(jobs[i].dst) && jobs[i].src != jobs[i].dst &&
             jobs[i].job.grp.div * vec == 16 && pieces16(jobs[i].job, H, p.block_size);
  if (tiles || qtiles) p.lg_tg = 4;
  /* Tasks per warp of the fast path (measured on an H100, docs/cuda-reference.md):
   * one for writes and HND_PACKED token groups, four for gathers (dead rows of
   * short sequences and KV_OFFSETS lookups: +4 to +11 points over one), a
   * resident grid for 1-byte rows (+13 points over one). FP8 kernels always
   * take a resident grid (launch_fast_op). */
  const bool byte_rows = fast && kvx_ref::dtype_size(jobs[0].src) == 1 && kvx_ref::dtype_size(jobs[0].dst) == 1;
  p.tpw = byte_rows ? 0u : packed || p.kind == KIND_WRITE ? 1u : (uint32_t)KVX_CUDA_GATHER_TPW;
  /* ... but a gather of fewer row groups than KVX_CUDA_GATHER_TPW_MIN_GROUPS keeps one task
   * per warp (with four, a call of tens of thousands of rows ends in a tail of a few
   * waves: +1.5 to +6 points below 262144 rows), except KV_OFFSETS, whose lookups four
   * tasks per warp hide (at 65536 rows 91.8-93.1% with four, 89.9-90.4% with one) */
  if (p.tpw > 1 && p.kind != KIND_KV_OFFSETS && (rows >> p.lg_tg) < (uint64_t)KVX_CUDA_GATHER_TPW_MIN_GROUPS)
    p.tpw = 1;
  /* Small (decode-sized) calls: as many warps as possible, each one short (one
   * K or V row group), so the call's latency is one memory round trip. */
  p.fuse = 1;
  if ((rows >> p.lg_tg) < (uint64_t)KVX_CUDA_FUSE_MIN_GROUPS) {
    p.fuse = 0;
    if (p.tpw > 1) p.tpw = 1;
  }
  /* Decode-sized writes and gathers (PACKED of one beam; RAGGED and KV_OFFSETS with
   * KVX_CUDA_DECODE_LOOKUP): the one-chunk-per-thread kernels (move_kernels.cuh, launch_decode):
   * every load known at entry issued at once. */
  p.decode = 0;
  const uint64_t packed_max = p.kind == KIND_WRITE ? (uint64_t)KVX_CUDA_DECODE_PACKED_MAX_ROWS
                                                  : (uint64_t)KVX_CUDA_DECODE_PACKED_GATHER_MAX_ROWS;
  if (KVX_CUDA_DECODE && fast && (!packed || rows <= packed_max) && !p.fuse &&
      !p.bytewise &&
      rows <= (uint64_t)KVX_CUDA_DECODE_MAX_ROWS && (uint64_t)H * chunks * n * rows <= 0x7F000000ull &&
      (p.kind == KIND_WRITE || (p.kind == KIND_PACKED && p.fd_bw.div == 1) ||
       (KVX_CUDA_DECODE_LOOKUP && (p.kind == KIND_RAGGED || p.kind == KIND_KV_OFFSETS))))
    p.decode = 1;
  if (p.decode) tiles = qtiles = false;
  /* Large calls of the generic fast path whose task (one row, K and V) has fewer than
   * KVX_CUDA_TASK_CHUNKS 16-byte chunks (head_dim 64 x 8 heads in F16: 128) would leave
   * the lanes' loads half unused: 2, 4 or 8 rows per task instead (lanes alternate rows). */
  /* rows per task (2^p.lg_tg) until a task has `target` chunks, at most 2^cap rows */
  auto widen_tasks = [&](uint64_t target, uint32_t cap) {
    while (((uint64_t)H * chunks * n << p.lg_tg) < target && p.lg_tg < cap) ++p.lg_tg;
  };
  if (fast && !packed && !tiles && !qtiles && p.fuse && p.lg_tg == 0) widen_tasks(KVX_CUDA_TASK_CHUNKS, 3);
  /* A device with more DRAM bandwidth per SM (memory_depth() > 1) needs more bytes in flight per
   * SM: a large call whose tasks are small (at most KVX_CUDA_DEEP_TASK_BYTES on the wider side)
   * gives each warp `depth` times the tasks (writes `depth`, gathers KVX_CUDA_GATHER_TPW x depth,
   * from KVX_CUDA_GATHER_TPW_MIN_GROUPS_DEEP row groups on). Measured on an H200 (depth 2,
   * docs/cuda-reference.md, "Eighth round"): 16-bit rows of 8 heads x 128 +3 to +5 points;
   * tasks of 8 KB and more lose 1 point from it, so they keep one task per warp. */
  const uint32_t depth = fast && p.fuse ? (uint32_t)memory_depth() : 1u; /* looked up by large calls only */
  const uint64_t task_bytes = ((uint64_t)H * chunks * n << p.lg_tg) * 16;  /* wider side */
  if (depth > 1 && fast && !packed && p.fuse && p.tpw >= 1 && task_bytes <= (uint64_t)KVX_CUDA_DEEP_TASK_BYTES) {
    if (p.kind == KIND_WRITE)
      p.tpw = depth;
    else if (p.kind == KIND_KV_OFFSETS || (rows >> p.lg_tg) >= (uint64_t)KVX_CUDA_GATHER_TPW_MIN_GROUPS_DEEP)
      p.tpw = (uint32_t)KVX_CUDA_GATHER_TPW * depth;
  }
  /* Large calls into or out of NHD/HND caches: the lean kernel where its Op serves them
   * (move_rows, move_kernels.cuh: one task per warp and more resident warps than move_fast:
   * same-dtype copies four blocks per SM where move_fast fits two, FP8 quantizing writes six).
   * On a device with more DRAM bandwidth per SM (memory_depth() > 1) every such call (H200:
   * copies +2 to +7.5 points at 65536 rows, FP8 writes +6 to +9); at depth 1 RAGGED and
   * KV_OFFSETS gathers, whose lookups the extra warps hide (H100: +0.8 and +3 points; its
   * writes lost 0.5 to 1), and tasks of 4 or more short rows (one head of 64 to 256 F16
   * values: +0.5 to +14). docs/cuda-reference.md, "Ninth round", "Thirteenth round". Only K
   * and V in one launch, whole vectors, one run of head_dim per head, tasks of at most
   * KVX_CUDA_ROWS_MAX_TASK_BYTES, and rows whose every vector a 32-bit offset reaches
   * (row_offsets_fit32). */
  p.rows = 0;
  if (fast && !packed && !tiles && !qtiles && p.fuse && !p.decode && n == 2 && !p.bytewise &&
      (KVX_CUDA_ROWS_MAX_TASK_BYTES == 0 || task_bytes <= (uint64_t)KVX_CUDA_ROWS_MAX_TASK_BYTES) &&
      lean_rows_for((int)depth, p.kind == KIND_RAGGED || p.kind == KIND_KV_OFFSETS, (int)p.lg_tg)) {
    bool ok = true;
    for (uint32_t i = 0; i < n; ++i) {
      const Job& j = p.job[i];
      ok = ok && j.grp.div == chunks && row_offsets_fit32(H, D, j.c_head, j.cache_esize, j.io_head, j.io_esize);
    }
    p.rows = ok;
  }
  /* Large writes over the cache's slots instead of the IO rows (move_invert.cu). HND_PACKED tiles:
   * whole tiles stored instead of one 16-byte piece per token, dgroup and head. The lean kernel
   * (NHD/HND) at the memory depths rows_invert_for takes: the cache written in order, the IO rows
   * read at random; one row per task (with several, the slots no row writes idle their lanes)
   * and at least KVX_CUDA_ROWS_INVERT_MIN_BYTES of rows, against which the inversion's fixed
   * cost (a memset and a pass over the slots) is small (docs/cuda-reference.md, "Thirteenth
   * round"); FP8 quantizing writes only over a cache of at most KVX_CUDA_ROWS_INVERT_FP8_COVER slots
   * per row ("Twenty-fifth round": a warp per slot, the slots no row writes idle). */
  p.early = p.rows && p.kind == KIND_WRITE && rows_write_early_for((int)depth);
  p.inv = nullptr;
  const bool inv_tiles = (tiles || qtiles) && !p.decode && packed_invert_ok(p, rows, H, chunks);
  const bool inv_rows = p.rows && p.kind == KIND_WRITE && p.lg_tg == 0 && rows_invert_for((int)depth) &&
                        KVX_CUDA_ROWS_INVERT_MIN_BYTES > 0 &&
                        rows * task_bytes >= (uint64_t)KVX_CUDA_ROWS_INVERT_MIN_BYTES &&
                        rows_serve(jobs[0].src, jobs[0].dst) && invert_ok(p, rows, 1) &&
                        (!kvx_ref::is_fp8(jobs[0].dst) || jobs[0].src == jobs[0].dst ||
                         p.num_slots <= rows * (uint64_t)KVX_CUDA_ROWS_INVERT_FP8_COVER);
  if (inv_tiles || inv_rows) {
    const InvKernel k = inv_rows ? INV_ROWS : qtiles ? INV_QTILES : INV_TILES;
    const cudaError_t e = launch_inverted(k, jobs[0].src, jobs[0].dst, p, rows, stream);
    if (e != cudaSuccess) return e == cudaErrorInvalidValue ? KVX_STATUS_UNSUPPORTED : KVX_STATUS_INTERNAL_ERROR;
    return KVX_STATUS_OK;
  }
  /* The lean kernel over the IO rows: rows per task so that a task has KVX_CUDA_ROWS_TASK_CHUNKS
   * chunks, up to 2^KVX_CUDA_ROWS_MAX_LG_TG rows (move_rows takes any 2^lg_tg up to 32) */
  if (p.rows) widen_tasks(KVX_CUDA_ROWS_TASK_CHUNKS, KVX_CUDA_ROWS_MAX_LG_TG);
  if (p.rows) {
    bool token_rows = true; /* NHD: each job's cache token row one run of H x D */
    for (uint32_t i = 0; i < n; ++i)
      token_rows = token_rows && p.job[i].c_head == (long long)D && p.job[i].c_token == (long long)H * D;
    if (lean_gather_pairs_for((int)depth, p.kind == KIND_PACKED, token_rows, (int)p.lg_tg, (uint64_t)H * chunks * n,
                              KVX_CUDA_ROWS_TASK_CHUNKS))
      p.lg_tg = 1;
  }
  const uint64_t tg = 1ull << p.lg_tg;
  const uint64_t per_group = (uint64_t)H * chunks * n * tg; /* items per TG rows */
  /* Items per job below 2^31 minus headroom: the kernels' 32-bit grid-stride
   * index (base + stride * kUnroll, at most a few million past `total`) never wraps. */
  const uint64_t limit = 0x7F000000ull;
  if (per_group > limit) return KVX_STATUS_UNSUPPORTED; /* a token row of > 2^31 items */
  const uint64_t rows_per_launch = (limit / per_group) * tg;
  for (uint64_t r0 = 0; r0 < rows; r0 += rows_per_launch) {
    const uint64_t cnt = rows - r0 < rows_per_launch ? rows - r0 : rows_per_launch;
    p.row_begin = (uint32_t)r0;
    p.row_count = (uint32_t)cnt;
    p.items_per_job = (uint32_t)(((cnt + tg - 1) / tg) * tg * H * chunks);
    const cudaError_t e = tiles    ? launch_packed(p, stream)
                          : qtiles ? launch_packed_fp8(jobs[0].src, jobs[0].dst, p, stream)
                          : fast   ? launch_fast(jobs[0].src, jobs[0].dst, p, stream)
                                   : launch_general(p, stream);
    if (e != cudaSuccess) return e == cudaErrorInvalidValue ? KVX_STATUS_UNSUPPORTED : KVX_STATUS_INTERNAL_ERROR;
  }
  return KVX_STATUS_OK;
}

kvx_status_t launch_pair(const MoveParams& p, JobPlan jobs[2], uint64_t rows, uint32_t H, uint32_t D,
                         cudaStream_t stream) {
  if (same_kernel(jobs[0], jobs[1])) return launch_jobs(p, jobs, 2, rows, H, D, stream);
  kvx_status_t st = launch_jobs(p, &jobs[0], 1, rows, H, D, stream);
  if (st != KVX_STATUS_OK) return st;
  return launch_jobs(p, &jobs[1], 1, rows, H, D, stream);
}

/* R-CONVERT: same dtype (raw bytes), or a non-FP8 source into any cache/IO
 * float dtype, FP8 destinations only on write (quantize). */
bool conversion_supported(kvx_dtype_t src, kvx_dtype_t dst, bool write) {
  if (!kvx_ref::is_cache_dtype(src) || !kvx_ref::is_cache_dtype(dst)) return false;
  if (src == dst) return true;
  if (kvx_ref::is_fp8(src)) return false;
  return write || !kvx_ref::is_fp8(dst);
}

int scale_kind(const kvx_ref::ScalePlan& s) {
  if (s.kind == kvx_ref::SCALE_PER_TENSOR && s.ptr) return SCALE_TENSOR;
  if (s.kind == kvx_ref::SCALE_PER_HEAD && s.ptr) return SCALE_HEAD;
  return SCALE_ONE;
}

/* UNIFIED memory: the metadata is host-readable, so the call answers the host
 * backend's data-dependent statuses (readings: OK for skipped rows is allowed on
 * DEVICE memory only). The host reads it in stream order: the call first waits
 * for the work already queued on `stream` (the one host synchronization, UNIFIED
 * only; DEVICE calls never wait), or for the whole device where the host may not
 * touch managed memory while kernels run. */
kvx_status_t unified_prescan_wait(cudaStream_t stream) {
  /* A stream being captured into a CUDA graph cannot be waited on (the wait would
   * invalidate the capture and leave a sticky error): a UNIFIED call there is
   * UNSUPPORTED and touches nothing. DEVICE calls capture fine. */
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  const cudaError_t ce = cudaStreamIsCapturing(stream, &capture);
  if (ce != cudaSuccess) {
    cudaGetLastError(); /* e.g. the NULL stream while another stream captures globally */
    return KVX_STATUS_UNSUPPORTED;
  }
  if (capture != cudaStreamCaptureStatusNone) return KVX_STATUS_UNSUPPORTED;
  int dev = 0, concurrent = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) return KVX_STATUS_INTERNAL_ERROR;
  cudaDeviceGetAttribute(&concurrent, cudaDevAttrConcurrentManagedAccess, dev);
  const cudaError_t e = concurrent ? cudaStreamSynchronize(stream) : cudaDeviceSynchronize();
  return e == cudaSuccess ? KVX_STATUS_OK : KVX_STATUS_INTERNAL_ERROR;
}

MoveParams base_params(uint32_t block_size) {
  MoveParams p;
  memset(&p, 0, sizeof p);
  p.block_size = block_size;
  p.fd_bs = make_fastdiv(block_size);
  p.default_nan = host_default_nan();
  p.fd_msl = make_fastdiv(1);
  p.fd_bw = make_fastdiv(1);
  return p;
}

}  // namespace
}  // namespace kvx_cuda

namespace kvx_ref {

kvx_status_t cuda_write(const WritePlan& plan, void* stream) {
  using namespace kvx_cuda;
  DeviceScope scope;
  if (plan.num_tokens > 0) {
    const kvx_status_t st = scope.enter(plan.memory, plan.k_cache.data, plan.key.data, stream);
    if (st != KVX_STATUS_OK) return st;
  }
  if (plan.fp4.format) return cuda_fp4_write(plan, stream); /* KVX 1.2 FP4 cache: cuda/move_fp4_write.cu */
  if (plan.num_tokens == 0) return KVX_STATUS_OK;
  if (!cuda_available()) return KVX_STATUS_UNSUPPORTED;
  if (plan.num_kv_heads == 0 || plan.head_dim == 0 || plan.block_size == 0) return KVX_STATUS_INTERNAL_ERROR;
  if (!conversion_supported(plan.key.dtype, plan.k_cache.dtype, true) ||
      !conversion_supported(plan.value.dtype, plan.v_cache.dtype, true))
    return KVX_STATUS_UNSUPPORTED;
  if (plan.slot_dtype != KVX_DTYPE_S32 && plan.slot_dtype != KVX_DTYPE_S64) return KVX_STATUS_INTERNAL_ERROR;
  if (plan.memory == KVX_MEMORY_UNIFIED) {
    kvx_status_t st = unified_prescan_wait((cudaStream_t)stream);
    if (st == KVX_STATUS_OK) st = host_prescan_write(plan);
    if (st != KVX_STATUS_OK) return st;
  }

  const uint32_t H = plan.num_kv_heads, D = plan.head_dim, bs = plan.block_size;
  MoveParams p = base_params(bs);
  p.kind = KIND_WRITE;
  p.slots = plan.slots;
  p.slot64 = plan.slot_dtype == KVX_DTYPE_S64;
  p.invalid_slot = plan.invalid_slot;
  p.num_slots = (unsigned long long)plan.num_blocks * bs;

  JobPlan jobs[2];
  const CacheTensorPlan* caches[2] = {&plan.k_cache, &plan.v_cache};
  const IoTensorPlan* ios[2] = {&plan.key, &plan.value};
  const ScalePlan* scales[2] = {&plan.k_scale, &plan.v_scale};
  const void* no_pools[2] = {nullptr, nullptr};
  for (int i = 0; i < 2; ++i) {
    JobPlan& jp = jobs[i];
    memset(&jp, 0, sizeof jp);
    cache_side(jp, *caches[i], false, H, D, bs);
    io_side(jp, *ios[i]);
    jp.src = ios[i]->dtype;
    jp.dst = caches[i]->dtype;
    const bool quantize = kvx_ref::is_fp8(jp.dst) && jp.src != jp.dst;
    jp.job.scale_kind = quantize ? scale_kind(*scales[i]) : SCALE_ONE;
    jp.job.scale = scales[i]->ptr;
    jp.job.kv = i;
    choose_path(jp, *caches[i], false, no_pools, 0, plan.num_tokens, H, D, bs, plan.num_blocks);
  }
  p.bytewise = !jobs_elem_aligned(jobs, false) || !aligned(plan.slots, p.slot64 ? 8 : 4);
  return launch_pair(p, jobs, plan.num_tokens, H, D, (cudaStream_t)stream);
}

kvx_status_t cuda_gather(const GatherPlan& plan, void* stream) {
  using namespace kvx_cuda;
  DeviceScope scope;
  {
    const kvx_status_t st = scope.enter(plan.memory, plan.k_cache.data, plan.key.data, stream);
    if (st != KVX_STATUS_OK) return st;
  }
  if (plan.fp4.format) return cuda_fp4_gather(plan, stream); /* KVX 1.2 FP4 cache: cuda/move_fp4_gather.cu */
  const uint64_t beams = plan.beam_width; /* 1 unless KV_OFFSETS (front end) */
  const uint64_t rows = (uint64_t)plan.seq_count * beams * plan.max_seq_len;
  if (!cuda_available()) return KVX_STATUS_UNSUPPORTED;
  if (plan.memory == KVX_MEMORY_UNIFIED && plan.seq_count > 0) {
    /* before the early return: an empty output still answers bad lengths / indptr */
    kvx_status_t st = unified_prescan_wait((cudaStream_t)stream);
    if (st == KVX_STATUS_OK) st = host_prescan_gather(plan);
    if (st != KVX_STATUS_OK) return st;
  }
  if (rows == 0 || beams == 0) return KVX_STATUS_OK;
  if (plan.num_kv_heads == 0 || plan.head_dim == 0 || plan.block_size == 0) return KVX_STATUS_INTERNAL_ERROR;
  if (rows > 0xFFFFFFFFull) return KVX_STATUS_UNSUPPORTED; /* io.num_tokens is 32-bit: never reached */
  if (!conversion_supported(plan.k_cache.dtype, plan.key.dtype, false) ||
      !conversion_supported(plan.v_cache.dtype, plan.value.dtype, false))
    return KVX_STATUS_UNSUPPORTED;
  const bool kvoff = plan.format == KVX_BLOCK_TABLE_KV_OFFSETS;
  if (!kvoff && plan.format != KVX_BLOCK_TABLE_PACKED && plan.format != KVX_BLOCK_TABLE_RAGGED)
    return KVX_STATUS_INTERNAL_ERROR;

  const uint32_t H = plan.num_kv_heads, D = plan.head_dim, bs = plan.block_size;
  MoveParams p = base_params(bs);
  p.kind = kvoff ? KIND_KV_OFFSETS : plan.format == KVX_BLOCK_TABLE_RAGGED ? KIND_RAGGED : KIND_PACKED;
  p.max_seq_len = plan.max_seq_len;
  p.fd_msl = make_fastdiv(plan.max_seq_len);
  p.fd_bw = make_fastdiv((uint32_t)beams);
  p.max_blocks = plan.max_blocks_per_seq;
  p.num_blocks = plan.num_blocks;
  p.indices = plan.indices;
  p.idx64 = plan.index_dtype == KVX_DTYPE_S64;
  p.indices_count = plan.indices_count;
  p.indptr = plan.indptr;
  p.indptr64 = plan.indptr_dtype == KVX_DTYPE_S64;
  p.seq_lens = plan.seq_lens;
  p.len64 = plan.seq_lens_dtype == KVX_DTYPE_S64;
  p.pool[0] = (const char*)plan.pool_primary;
  p.pool[1] = (const char*)plan.pool_secondary;
  p.bytes_per_block = plan.bytes_per_block;
  if (kvoff && !plan.pool_primary) return KVX_STATUS_INTERNAL_ERROR;
  if (plan.format == KVX_BLOCK_TABLE_RAGGED && !plan.indptr) return KVX_STATUS_INTERNAL_ERROR;

  JobPlan jobs[2];
  const CacheTensorPlan* caches[2] = {&plan.k_cache, &plan.v_cache};
  const IoTensorPlan* ios[2] = {&plan.key, &plan.value};
  const void* pools[2] = {plan.pool_primary, plan.pool_secondary};
  for (int i = 0; i < 2; ++i) {
    JobPlan& jp = jobs[i];
    memset(&jp, 0, sizeof jp);
    const CacheTensorPlan& c = *caches[i]; /* KV_OFFSETS: the pools hold this dtype */
    cache_side(jp, c, kvoff, H, D, bs);
    io_side(jp, *ios[i]);
    jp.src = c.dtype;
    jp.dst = ios[i]->dtype;
    jp.job.scale_kind = SCALE_ONE;
    jp.job.kv = i;
    choose_path(jp, c, kvoff, pools, plan.bytes_per_block, rows, H, D, bs, plan.num_blocks);
  }
  bool meta_aligned = aligned(plan.indices, p.idx64 ? 8 : 4) && aligned(plan.seq_lens, p.len64 ? 8 : 4) &&
                      (!plan.indptr || aligned(plan.indptr, p.indptr64 ? 8 : 4));
  if (kvoff) {
    const unsigned long long es = kvx_ref::dtype_size(plan.k_cache.dtype);
    meta_aligned = meta_aligned && aligned(plan.pool_primary, es) && aligned(plan.pool_secondary, es) &&
                   plan.bytes_per_block % es == 0;
  }
  p.bytewise = !jobs_elem_aligned(jobs, kvoff) || !meta_aligned;
  return launch_pair(p, jobs, rows, H, D, (cudaStream_t)stream);
}

}  // namespace kvx_ref
