/*
 * move_invert.cu -- writes over the cache's slots instead of the IO rows.
 *
 * A write scatters IO rows to the cache by slot. With random slots the cache side is
 * written in pieces at random places (a token's row in NHD, one head's row in HND, one
 * 16-byte piece per token and dgroup in HND_PACKED), the IO side read in order. A large
 * write that covers a good part of the cache (KVX_CUDA_INVERT_COVER) can be turned around:
 * first record, for every cache slot, the IO row that writes it (a 4-byte scatter into a
 * stream-ordered scratch array set to -1 first), then run the kernel over consecutive cache
 * slots: the cache is then written in order, whole tiles or rows, and the IO side read at
 * random (a gather's pattern, which the memory serves better than a scatter's:
 * docs/cuda-reference.md, "Thirteenth round"). Slots no row writes are skipped; a slot
 * written twice in one call keeps one of its rows, whole (R-WRITE: which one is
 * informational only); rows whose slot is invalid are never recorded.
 *
 * The kernels that run over the slots read the entries with inv_row_of (move.cuh): the
 * same-dtype HND_PACKED tiles and the FP8 ones (move_packed.cu), and the lean kernel of
 * NHD/HND writes (move_rows, move_kernels.cuh).
 */
#include <mutex>
#include <string.h>

#include "move_kernels.cuh"

namespace kvx_cuda {

/* inv[slot] = row for every row of the call whose slot is valid (rows row_begin ..). */
__global__ void __launch_bounds__(kThreads) invert_slots(const __grid_constant__ MoveParams p, int* inv) {
  dependent_entry();
  const uint32_t r = blockIdx.x * blockDim.x + threadIdx.x;
  if (r >= p.row_count) return;
  const uint32_t row = p.row_begin + r;
  const long long slot = ld_index(p, p.slots, p.slot64, row);
  if (!slot_valid(p, slot)) return;
  inv[slot] = (int)row;
}

bool invert_ok(const MoveParams& p, unsigned long long rows, unsigned long long min_rows) {
  if (min_rows == 0 || p.kind != KIND_WRITE || p.bytewise) return false;
  if (rows < min_rows || rows > 0x7FFFFFFFull) return false;
  if (p.num_slots > (unsigned long long)KVX_CUDA_INVERT_MAX_SLOTS) return false;
  return p.num_slots <= rows * (unsigned long long)KVX_CUDA_INVERT_COVER;
}

/* Stream-ordered scratch memory. Outside a graph capture it comes from the backend's own pool on
 * the current device, which keeps up to KVX_CUDA_SCRATCH_KEEP bytes between calls (the default
 * pool returns its memory at every synchronization, and mapping it again cost an eager call 20 to
 * 45 us on the H100); inside a capture from cudaMallocAsync, which the capture turns into a graph
 * memory node. False where neither is available. */
#ifndef KVX_CUDA_SCRATCH_KEEP
#define KVX_CUDA_SCRATCH_KEEP (64ull << 20)
#endif
static bool scratch_alloc(void** ptr, size_t bytes, cudaStream_t stream) {
  static std::mutex mu;
  static cudaMemPool_t pools[64];
  static bool tried[64];
  int dev = 0, supported = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64) return false;
  if (cudaDeviceGetAttribute(&supported, cudaDevAttrMemoryPoolsSupported, dev) != cudaSuccess || !supported) return false;
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream, &capture) != cudaSuccess) return false;
  if (capture == cudaStreamCaptureStatusNone) {
    cudaMemPool_t pool = nullptr;
    {
      std::lock_guard<std::mutex> lock(mu);
      if (!tried[dev]) {
        tried[dev] = true;
        cudaMemPoolProps props;
        memset(&props, 0, sizeof props);
        props.allocType = cudaMemAllocationTypePinned;
        props.location.type = cudaMemLocationTypeDevice;
        props.location.id = dev;
        if (cudaMemPoolCreate(&pools[dev], &props) == cudaSuccess) {
          unsigned long long keep = KVX_CUDA_SCRATCH_KEEP;
          cudaMemPoolSetAttribute(pools[dev], cudaMemPoolAttrReleaseThreshold, &keep);
        } else {
          pools[dev] = nullptr;
        }
      }
      pool = pools[dev];
    }
    if (pool && cudaMallocFromPoolAsync(ptr, bytes, pool, stream) == cudaSuccess) return true;
    (void)cudaGetLastError();
  }
  return cudaMallocAsync(ptr, bytes, stream) == cudaSuccess;
}

/* Records the call's rows by slot in a stream-ordered scratch array, runs `kernel` over the
 * cache's slots, frees the array: two launches and two stream-ordered memory operations, all
 * capturable into a CUDA graph. Where stream-ordered allocation is not available, the kernel
 * over the IO rows as usual. */
cudaError_t launch_inverted(InvKernel kernel, kvx_dtype_t src, kvx_dtype_t dst, MoveParams p, unsigned long long rows,
                            cudaStream_t stream) {
  p.row_begin = 0;
  p.row_count = (uint32_t)rows;
  auto run = [&](const MoveParams& q) {
    switch (kernel) {
      case INV_TILES: return launch_packed(q, stream);
      case INV_QTILES: return launch_packed_fp8(src, dst, q, stream);
      default: return launch_fast(src, dst, q, stream);
    }
  };
  int* inv = nullptr;
  const size_t bytes = (size_t)p.num_slots * sizeof(int);
  if (scratch_alloc((void**)&inv, bytes, stream)) {
    cudaError_t e = KVX_CUDA_INVERT_CLEAR ? cudaMemsetAsync(inv, 0xFF, bytes, stream) : cudaSuccess;
    if (e == cudaSuccess) {
      e = launch_kernel(invert_slots, (unsigned)((rows + kThreads - 1) / kThreads), kThreads, 0, stream, p, inv);
    }
    if (e == cudaSuccess) {
      p.inv = inv;
      e = run(p);
    }
    const cudaError_t f = cudaFreeAsync(inv, stream);
    return e != cudaSuccess ? e : f;
  }
  (void)cudaGetLastError(); /* no stream-ordered allocation here: over the IO rows */
  p.inv = nullptr;
  return run(p);
}

}  // namespace kvx_cuda
