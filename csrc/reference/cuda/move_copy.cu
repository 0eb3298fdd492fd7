/*
 * move_copy.cu -- same-dtype fast path (raw 16-byte chunks), the general
 * element path, the fast-path dispatcher and grid sizing.
 */
#include <mutex>

#include "move_kernels.cuh"

namespace kvx_cuda {

/* General path kernel (helpers in move_kernels.cuh). */
__global__ void __launch_bounds__(kThreads) move_general(const __grid_constant__ MoveParams p) {
  dependent_entry();
  const uint32_t total = p.items_per_job * p.njobs;
  const uint32_t stride = gridDim.x * kThreads;
  const bool gather = p.kind != KIND_WRITE;
  for (uint32_t base = blockIdx.x * kThreads + threadIdx.x; base < total; base += stride * kUnroll) {
    Item it[kUnroll];
    uint32_t v[kUnroll];
    char* dst[kUnroll];
    if (!gather) {
      long long slot[kUnroll];
#pragma unroll
      for (int k = 0; k < kUnroll; ++k) {
        const uint32_t u = base + k * stride;
        it[k] = decompose(p, u < total ? u : 0);
        it[k].live &= u < total;
        slot[k] = write_slot_load(p, it[k]);
        const Job& jb = *it[k].job;
        if (it[k].live) v[k] = ld_raw(jb.io + elem_io_off(jb, it[k].row, it[k].h, it[k].c), jb.io_esize, p.bytewise);
      }
#pragma unroll
      for (int k = 0; k < kUnroll; ++k) {
        char* row = it[k].live ? write_cache_row(p, *it[k].job, slot[k]) : nullptr;
        dst[k] = row ? row + elem_cache_off(*it[k].job, it[k].h, it[k].c) : nullptr;
      }
    } else {
      GatherMeta m[kUnroll];
#pragma unroll
      for (int k = 0; k < kUnroll; ++k) {
        const uint32_t u = base + k * stride;
        it[k] = decompose(p, u < total ? u : 0);
        it[k].live &= u < total;
        m[k] = gather_meta_load(p, it[k]);
      }
#pragma unroll
      for (int k = 0; k < kUnroll; ++k) {
        const Job& jb = *it[k].job;
        char* row = gather_cache_row(p, jb, m[k]);
        dst[k] = nullptr;
        if (row) {
          v[k] = ld_raw(row + elem_cache_off(jb, it[k].h, it[k].c), jb.cache_esize, p.bytewise);
          dst[k] = jb.io + elem_io_off(jb, it[k].row, it[k].h, it[k].c);
        }
      }
    }
#pragma unroll
    for (int k = 0; k < kUnroll; ++k) {
      if (dst[k]) {
        const Job& jb = *it[k].job;
        const int src_dt = gather ? jb.cache_dtype : jb.io_dtype;
        const int dst_dt = gather ? jb.io_dtype : jb.cache_dtype;
        const float s = kvx_ref::is_fp8((kvx_dtype_t)dst_dt) && src_dt != dst_dt ? load_scale(p, jb, it[k].h) : 1.0f;
        st_raw(dst[k], gather ? jb.io_esize : jb.cache_esize, convert_elem(v[k], src_dt, dst_dt, s, p.default_nan), p.bytewise);
      }
    }
  }
}

cudaError_t launch_copy(int esize, const MoveParams& p, cudaStream_t stream) {
  switch (esize) {
    case 1: return launch_fast_op<CopyOp<1>>(p, stream);
    case 2: return launch_fast_op<CopyOp<2>>(p, stream);
    case 4: return launch_fast_op<CopyOp<4>>(p, stream);
    default: return cudaErrorInvalidValue;
  }
}

cudaError_t launch_general(const MoveParams& p, cudaStream_t stream) {
  const int grid = grid_for((const void*)move_general, (unsigned long long)p.items_per_job * p.njobs);
  return launch_kernel(move_general, (unsigned)grid, kThreads, 0, stream, p);
}

cudaError_t launch_fast(kvx_dtype_t src, kvx_dtype_t dst, const MoveParams& p, cudaStream_t stream) {
  if (src == dst) return launch_copy((int)kvx_ref::dtype_size(src), p, stream);
  if (kvx_ref::is_fp8(dst)) return launch_convert_fp8(src, dst, p, stream);
  return launch_convert_float(src, dst, p, stream);
}

/* rows_ok's question asked of the dtypes before an Op is chosen: FP8 quantization, or input and
 * output of one width (the Ops launch_fast picks). */
bool rows_serve(kvx_dtype_t src, kvx_dtype_t dst) {
  if (src != dst && kvx_ref::is_fp8(dst)) return KVX_CUDA_ROWS_FP8;
  return KVX_CUDA_ROWS && kvx_ref::dtype_size(src) == kvx_ref::dtype_size(dst);
}

namespace {
struct GridEntry {
  const void* kernel;
  int device, threads;
  int blocks; /* SMs * resident blocks per SM */
};
std::mutex g_grid_mu;
GridEntry g_grid[256];
int g_grid_n = 0;
}  // namespace

static int resident_blocks(const void* kernel, int threads = kThreads);

int grid_for(const void* kernel, unsigned long long total_items) {
  const int cap = resident_blocks(kernel);
  const unsigned long long per_block = (unsigned long long)kThreads * kUnroll;
  const unsigned long long want = (total_items + per_block - 1) / per_block;
  return (int)(want < (unsigned long long)cap ? (want ? want : 1) : cap);
}

int grid_for_warps(const void* kernel, unsigned long long tasks, bool persistent, int threads) {
  const unsigned long long per_block = (unsigned long long)threads / 32;
  const unsigned long long want = (tasks + per_block - 1) / per_block;
  const unsigned long long cap = persistent ? (unsigned long long)resident_blocks(kernel, threads) : 0x7FFFFFFFull;
  return (int)(want < cap ? (want ? want : 1) : cap);
}

/* The current device's properties the planner reads, looked up once per device and thread. */
struct DeviceTraits {
  int sms;   /* SM count (1 when unknown) */
  int depth; /* memory_depth_for (tuning.h) */
  bool pdl;  /* compute capability 9.0 or more (dependent_launch) */
};
static const DeviceTraits& device_traits() {
  static thread_local int cached_dev = -1;
  static thread_local DeviceTraits cached{1, 1, false};
  int dev = 0;
  cudaGetDevice(&dev);
  if (dev != cached_dev) {
    int sms = 0, khz = 0, bits = 0, major = 0;
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
    cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
    cudaDeviceGetAttribute(&khz, cudaDevAttrMemoryClockRate, dev);
    cudaDeviceGetAttribute(&bits, cudaDevAttrGlobalMemoryBusWidth, dev);
    cached = DeviceTraits{sms > 0 ? sms : 1, memory_depth_for(sms, khz, bits), major >= 9};
    cached_dev = dev;
  }
  return cached;
}

int launch_threads(const MoveParams& p, unsigned long long warps, int threads) {
  if (p.fuse || !KVX_CUDA_SPREAD_SMALL) return threads;
  const unsigned long long sms = (unsigned long long)device_traits().sms;
  const unsigned long long most = (unsigned long long)(threads / 32);
  unsigned long long wpb = (warps + sms - 1) / sms;
  if (wpb < 1) wpb = 1;
  if (wpb > most) wpb = most;
  return (int)(32 * wpb);
}

int memory_depth() { return device_traits().depth; }

bool dependent_launch() { return KVX_CUDA_PDL && device_traits().pdl; }

/* SMs x resident blocks per SM of `kernel` with `threads` per block on the current device (cached). */
static int resident_blocks(const void* kernel, int threads) {
  int dev = 0;
  cudaGetDevice(&dev);
  int cap = 0;
  {
    std::lock_guard<std::mutex> lock(g_grid_mu);
    for (int i = 0; i < g_grid_n; ++i)
      if (g_grid[i].kernel == kernel && g_grid[i].device == dev && g_grid[i].threads == threads) cap = g_grid[i].blocks;
    if (!cap) {
      int sms = 0, per_sm = 0;
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, 0);
      cap = (sms > 0 ? sms : 1) * (per_sm > 0 ? per_sm : 1);
      if (g_grid_n < 256) g_grid[g_grid_n++] = GridEntry{kernel, dev, threads, cap};
    }
  }
  return cap;
}

}  // namespace kvx_cuda
