// libkvx_bench_copy.so: the device-to-device copies the bandwidth bench measures its roofline
// with (docs/benchmarks.md, "Method"), beside torch.Tensor.copy_. Not a KVX provider: it exports
// no kvx_* entry point. Called through ctypes (kvx_conformance/bench/copies.py) on the caller's
// stream (the torch current stream), so CUDA events recorded there time it.
//
//   kvx_bench_copy_abi()                         1
//   kvx_bench_memcpy_async(dst, src, n, stream)  cudaMemcpyAsync device-to-device
//   kvx_bench_copy_kernel(dst, src, n, vecs, threads, flags, stream)
//       a grid-stride copy kernel: each thread loads `vecs` 16-byte vectors (16 * vecs bytes in
//       flight per thread: vecs 1, 2, 4 or 8) before storing them; grid = SM count x the blocks
//       of `threads` threads that fit on one SM (occupancy of that variant), from the device the
//       destination lives on; flags 1: streaming cache hints (__ldcs / __stcs), 0: plain
//       loads and stores
//   kvx_bench_copy_plan(dst, vecs, threads, flags, &grid, &sm_count, &blocks_per_sm)   the grid it uses
//   kvx_bench_error_string(status)               cudaGetErrorString
//
// Every function returns a cudaError_t (0 = success). Pointers not 16-byte aligned (or a size
// that is not a multiple of 16) are copied correctly: the aligned body by the vector loop, the
// ragged edges byte by byte.
#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>

#define KVX_BENCH_EXPORT extern "C" __attribute__((visibility("default")))
#define KVX_BENCH_COPY_STREAMING 1  // flags: streaming (evict-first) loads and stores, __ldcs / __stcs

namespace {

template <int V, bool CS>
__global__ void __launch_bounds__(1024) copy_vec(uint4* __restrict__ dst, const uint4* __restrict__ src,
                                                 size_t nvec) {
  // One chunk = blockDim.x * V vectors; thread t touches t, t + blockDim.x, ... (coalesced).
  const size_t chunk = (size_t)blockDim.x * V;
  const size_t stride = chunk * gridDim.x;
  size_t base = (size_t)blockIdx.x * chunk + threadIdx.x;
  for (; base + (V - 1) * (size_t)blockDim.x < nvec; base += stride) {
    uint4 r[V];
#pragma unroll
    for (int k = 0; k < V; ++k) {
      const uint4* p = src + base + (size_t)k * blockDim.x;
      r[k] = CS ? __ldcs(p) : *p;
    }
#pragma unroll
    for (int k = 0; k < V; ++k) {
      if (CS) __stcs(dst + base + (size_t)k * blockDim.x, r[k]);
      else dst[base + (size_t)k * blockDim.x] = r[k];
    }
  }
  // the last, partial chunk
  for (int k = 0; k < V; ++k) {
    const size_t i = base + (size_t)k * blockDim.x;
    if (i < nvec) dst[i] = src[i];
  }
}

__global__ void copy_bytes(unsigned char* __restrict__ dst, const unsigned char* __restrict__ src, size_t n) {
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
    dst[i] = src[i];
}

template <int V>
cudaError_t occupancy(int threads, bool streaming, int* blocks) {
  // the two cache-hint forms of one width need not use the same registers: ask for the one launched
  return streaming ? cudaOccupancyMaxActiveBlocksPerMultiprocessor(blocks, copy_vec<V, true>, threads, 0)
                   : cudaOccupancyMaxActiveBlocksPerMultiprocessor(blocks, copy_vec<V, false>, threads, 0);
}

cudaError_t blocks_per_sm(int vecs, int threads, bool streaming, int* out) {
  switch (vecs) {
    case 1: return occupancy<1>(threads, streaming, out);
    case 2: return occupancy<2>(threads, streaming, out);
    case 4: return occupancy<4>(threads, streaming, out);
    case 8: return occupancy<8>(threads, streaming, out);
    default: return cudaErrorInvalidValue;
  }
}

// The device `ptr` lives on made current (the runtime of this library keeps its own current
// device); its SM count and the variant's grid.
cudaError_t plan(const void* ptr, int vecs, int threads, int flags, int* grid, int* sms, int* per_sm) {
  if (threads <= 0 || threads > 1024 || threads % 32) return cudaErrorInvalidValue;
  if (flags & ~KVX_BENCH_COPY_STREAMING) return cudaErrorInvalidValue;
  cudaPointerAttributes a;
  cudaError_t e = cudaPointerGetAttributes(&a, ptr);
  if (e != cudaSuccess) return e;
  if (a.type != cudaMemoryTypeDevice && a.type != cudaMemoryTypeManaged) return cudaErrorInvalidDevicePointer;
  if ((e = cudaSetDevice(a.device)) != cudaSuccess) return e;
  int sm = 0, b = 0;
  if ((e = cudaDeviceGetAttribute(&sm, cudaDevAttrMultiProcessorCount, a.device)) != cudaSuccess) return e;
  if ((e = blocks_per_sm(vecs, threads, (flags & KVX_BENCH_COPY_STREAMING) != 0, &b)) != cudaSuccess) return e;
  if (b < 1) b = 1;
  *sms = sm;
  *per_sm = b;
  *grid = sm * b;
  return cudaSuccess;
}

template <int V>
void launch_vec(int grid, int threads, bool streaming, cudaStream_t s, uint4* d, const uint4* src, size_t nvec) {
  if (streaming) copy_vec<V, true><<<grid, threads, 0, s>>>(d, src, nvec);
  else copy_vec<V, false><<<grid, threads, 0, s>>>(d, src, nvec);
}

}  // namespace

KVX_BENCH_EXPORT int kvx_bench_copy_abi(void) { return 1; }

KVX_BENCH_EXPORT const char* kvx_bench_error_string(int status) {
  return cudaGetErrorString(static_cast<cudaError_t>(status));
}

KVX_BENCH_EXPORT int kvx_bench_memcpy_async(void* dst, const void* src, size_t n, void* stream) {
  return (int)cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToDevice, static_cast<cudaStream_t>(stream));
}

KVX_BENCH_EXPORT int kvx_bench_copy_plan(const void* dst, int vecs, int threads, int flags, int* grid,
                                         int* sm_count, int* blocks_per_sm_out) {
  if (!grid || !sm_count || !blocks_per_sm_out) return (int)cudaErrorInvalidValue;
  return (int)plan(dst, vecs, threads, flags, grid, sm_count, blocks_per_sm_out);
}

KVX_BENCH_EXPORT int kvx_bench_copy_kernel(void* dst, const void* src, size_t n, int vecs, int threads,
                                           int flags, void* stream) {
  const bool streaming = (flags & KVX_BENCH_COPY_STREAMING) != 0;
  // The launches below report through cudaGetLastError, which also returns an error that an
  // earlier call of this thread left behind (a refused cudaMemcpyAsync, say): clear it first,
  // or this copy would be reported as failed.
  (void)cudaGetLastError();
  int grid = 0, sms = 0, per_sm = 0;
  cudaError_t e = plan(dst, vecs, threads, flags, &grid, &sms, &per_sm);
  if (e != cudaSuccess) return (int)e;
  if (n == 0) return (int)cudaSuccess;
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  const uintptr_t d = reinterpret_cast<uintptr_t>(dst), r = reinterpret_cast<uintptr_t>(src);
  unsigned char* db = static_cast<unsigned char*>(dst);
  const unsigned char* sb = static_cast<const unsigned char*>(src);
  if ((d & 15) != (r & 15)) {  // never co-aligned: bytes only
    copy_bytes<<<grid, threads, 0, s>>>(db, sb, n);
    return (int)cudaGetLastError();
  }
  size_t head = (16 - (d & 15)) & 15;
  if (head > n) head = n;
  const size_t nvec = (n - head) / 16, tail = n - head - nvec * 16;
  if (head) copy_bytes<<<1, 32, 0, s>>>(db, sb, head);
  if (nvec) {
    uint4* dv = reinterpret_cast<uint4*>(db + head);
    const uint4* sv = reinterpret_cast<const uint4*>(sb + head);
    switch (vecs) {
      case 1: launch_vec<1>(grid, threads, streaming, s, dv, sv, nvec); break;
      case 2: launch_vec<2>(grid, threads, streaming, s, dv, sv, nvec); break;
      case 4: launch_vec<4>(grid, threads, streaming, s, dv, sv, nvec); break;
      case 8: launch_vec<8>(grid, threads, streaming, s, dv, sv, nvec); break;
      default: return (int)cudaErrorInvalidValue;
    }
  }
  if (tail) copy_bytes<<<1, 32, 0, s>>>(db + head + nvec * 16, sb + head + nvec * 16, tail);
  return (int)cudaGetLastError();
}
