// copy_variants.cu -- device-to-device copies on one GPU, each timed with CUDA events (median of 15)
// and verified: cudaMemcpyAsync; a grid-stride copy kernel (V 16-byte vectors per thread in flight,
// cache-hint variants: L2::256B / L2::128B prefetch sizes, non-coherent, streaming); one 4 KB task per
// warp over the whole grid (tpw tasks per warp, two task orders); TMA bulk copies through shared
// memory (cp.async.bulk, S stages of CH bytes per block). docs/cuda-reference.md, "Ninth round".
//   nvcc -O3 -arch=sm_90 -std=c++17 tools/probes/copy_variants.cu -o copy_variants && ./copy_variants [MiB]
// (MiB: bytes copied, default 1024; the figure printed is bytes read + written per second)
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <vector>
#include <algorithm>
#include <string>

#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { printf("ERR %s: %s\n", #x, cudaGetErrorString(e_)); exit(1); } } while (0)

__device__ __forceinline__ uint4 ld_hint(const uint4* p, int mode) {
  uint4 r;
  if (mode == 1) asm volatile("ld.global.L2::256B.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"(p));
  else if (mode == 2) asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"(p));
  else if (mode == 3) asm volatile("ld.global.L2::128B.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"(p));
  else if (mode == 4) r = __ldcs(p);
  else r = *p;
  return r;
}

// grid-stride, V vectors per thread in flight
template <int V, int MODE>
__global__ void gs(uint4* __restrict__ d, const uint4* __restrict__ s, size_t n) {
  const size_t chunk = (size_t)blockDim.x * V, stride = chunk * gridDim.x;
  for (size_t b = (size_t)blockIdx.x * chunk + threadIdx.x; b + (V - 1) * (size_t)blockDim.x < n; b += stride) {
    uint4 r[V];
#pragma unroll
    for (int k = 0; k < V; ++k) r[k] = ld_hint(s + b + (size_t)k * blockDim.x, MODE);
#pragma unroll
    for (int k = 0; k < V; ++k) d[b + (size_t)k * blockDim.x] = r[k];
  }
}

// warp tasks of 4 KB (like the move kernels: one warp = one 4 KB row, 8 x 16 B per lane), whole grid.
// INTERLEAVED false: warp w takes tasks w*tpw .. w*tpw + tpw-1; true: block b's warp w takes tasks
// b*8*tpw + w + 8*t (the reference's order)
template <bool INTERLEAVED>
__global__ void warptask(uint4* __restrict__ d, const uint4* __restrict__ s, size_t n, int tpw) {
  const int wib = threadIdx.x >> 5, wpb = blockDim.x >> 5;
  const int lane = threadIdx.x & 31;
  const size_t warp = (size_t)blockIdx.x * wpb + wib;
  for (int t = 0; t < tpw; ++t) {
    const size_t task = INTERLEAVED ? (size_t)blockIdx.x * wpb * tpw + wib + (size_t)t * wpb : warp * tpw + t;
    const size_t b = task * 256;
    if (b >= n) return;
    uint4 r[8];
#pragma unroll
    for (int k = 0; k < 8; ++k) r[k] = s[b + lane + 32 * k];
#pragma unroll
    for (int k = 0; k < 8; ++k) d[b + lane + 32 * k] = r[k];
  }
}

// TMA bulk copies: global -> smem (mbarrier) -> global (bulk group), S stages of CH bytes, lane 0 issues
__device__ __forceinline__ uint32_t sa(const void* p) { return (uint32_t)__cvta_generic_to_shared(p); }
__global__ void tma(char* __restrict__ d, const char* __restrict__ s, size_t n, int S, int CH) {
  extern __shared__ __align__(128) char sm[];
  __shared__ __align__(8) uint64_t bar[16];
  if (threadIdx.x != 0) return;
  for (int i = 0; i < S; ++i) asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(sa(&bar[i])));
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
  const size_t nch = n / CH;
  auto chunk = [&](size_t it) { return (size_t)blockIdx.x + it * gridDim.x; };
  auto load = [&](size_t it) {
    const int st = it % S;
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(sa(&bar[st])), "r"(CH) : "memory");
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(sa(sm + (size_t)st * CH)),
                 "l"(s + chunk(it) * CH), "r"(CH), "r"(sa(&bar[st]))
                 : "memory");
  };
  for (int i = 0; i < S; ++i)
    if (chunk(i) < nch) load(i);
  for (size_t it = 0; chunk(it) < nch; ++it) {
    const int st = it % S;
    const uint32_t ph = (it / S) & 1;
    asm volatile("{ .reg .pred p; W%=: mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1; @!p bra W%=; }" ::"r"(sa(&bar[st])), "r"(ph) : "memory");
    asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;" ::"l"(d + chunk(it) * CH), "r"(sa(sm + (size_t)st * CH)), "r"(CH) : "memory");
    asm volatile("cp.async.bulk.commit_group;" ::: "memory");
    if (it >= 1 && chunk(it - 1 + S) < nch) {
      asm volatile("cp.async.bulk.wait_group.read 1;" ::: "memory");
      load(it - 1 + S);
    }
  }
  asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
}

__global__ void cmpk(const uint32_t* a, const uint32_t* b, size_t n, unsigned long long* bad) {
  unsigned long long c = 0;
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) c += a[i] != b[i];
  if (c) atomicAdd(bad, c);
}
__global__ void fillk(uint32_t* a, size_t n, uint32_t seed) {
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) a[i] = (uint32_t)(i * 2654435761u) ^ seed;
}

int main(int argc, char** argv) {
  const size_t n = (argc > 1 ? atoll(argv[1]) : 1024) << 20;
  int sms; CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  char *a, *b;
  CK(cudaMalloc(&a, n)); CK(cudaMalloc(&b, n));
  unsigned long long* bad; CK(cudaMalloc(&bad, 8));
  fillk<<<1024, 256>>>((uint32_t*)a, n / 4, 7);
  cudaEvent_t e0, e1; cudaEventCreate(&e0); cudaEventCreate(&e1);
  const int REPS = 15;
  auto run = [&](const char* name, auto fn) {
    cudaMemset(b, 0, n);
    fn(); fn(); CK(cudaDeviceSynchronize());
    std::vector<float> t;
    for (int r = 0; r < REPS; ++r) { cudaEventRecord(e0); fn(); cudaEventRecord(e1); cudaEventSynchronize(e1); float ms; cudaEventElapsedTime(&ms, e0, e1); t.push_back(ms); }
    CK(cudaGetLastError());
    std::sort(t.begin(), t.end());
    cudaMemset(bad, 0, 8); cmpk<<<1024, 256>>>((uint32_t*)a, (uint32_t*)b, n / 4, bad);
    unsigned long long h; cudaMemcpy(&h, bad, 8, cudaMemcpyDeviceToHost);
    printf("%-34s %8.1f GB/s  (min %.1f us, med %.1f us)%s\n", name, 2.0 * n / (t[REPS / 2] * 1e-3) / 1e9, t[0] * 1e3, t[REPS / 2] * 1e3, h ? "  MISMATCH" : "");
  };
  const size_t nv = n / 16;
  char nm[96];
  run("cudaMemcpyAsync", [&] { cudaMemcpyAsync(b, a, n, cudaMemcpyDeviceToDevice); });
#define GS(V, M, T)                                                                  \
  {                                                                                  \
    int per; cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per, gs<V, M>, T, 0);    \
    snprintf(nm, sizeof nm, "gs v%d m%d t%d x%d", V, M, T, per);                     \
    run(nm, [&] { gs<V, M><<<sms * per, T>>>((uint4*)b, (const uint4*)a, nv); });    \
  }
  GS(1, 0, 256) GS(2, 0, 256) GS(4, 0, 256) GS(8, 0, 256)
  GS(1, 0, 1024) GS(4, 0, 1024)
  GS(1, 1, 256) GS(2, 1, 256) GS(4, 1, 256) GS(8, 1, 256)
  GS(2, 2, 256) GS(4, 2, 256) GS(4, 3, 256) GS(4, 4, 256)
  for (int tpw : {1, 2, 4, 8}) {
    const size_t tasks = nv / 256; const int blocks = (int)((tasks + 8 * tpw - 1) / (8 * tpw));
    snprintf(nm, sizeof nm, "warptask tpw %d", tpw); run(nm, [&] { warptask<false><<<blocks, 256>>>((uint4*)b, (const uint4*)a, nv, tpw); });
    snprintf(nm, sizeof nm, "warptask2 tpw %d", tpw); run(nm, [&] { warptask<true><<<blocks, 256>>>((uint4*)b, (const uint4*)a, nv, tpw); });
  }
  for (int CH : {8192, 16384, 32768})
    for (int S : {2, 4, 6})
      for (int per : {1, 2}) {
        const int smem = S * CH;
        if (smem * per > 220 * 1024) continue;
        CK(cudaFuncSetAttribute(tma, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
        snprintf(nm, sizeof nm, "tma ch %d S %d x%d", CH, S, per);
        run(nm, [&] { tma<<<sms * per, 32, smem>>>(b, a, n, S, CH); });
      }
  for (int CH : {4096, 8192})
    for (int per : {4, 8}) {
      const int S = 4, smem = S * CH;
      if (smem * per > 220 * 1024) continue;
      CK(cudaFuncSetAttribute(tma, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
      snprintf(nm, sizeof nm, "tma ch %d S %d x%d", CH, S, per);
      run(nm, [&] { tma<<<sms * per, 32, smem>>>(b, a, n, S, CH); });
    }
  run("cudaMemcpyAsync (again)", [&] { cudaMemcpyAsync(b, a, n, cudaMemcpyDeviceToDevice); });
  return 0;
}
