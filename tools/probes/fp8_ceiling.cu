// fp8_ceiling.cu -- what a plain kernel reaches on the bench's FP8 write shape: 262144 tokens, K and V
// rows of 8 x 128 F16 (2 KB) quantized to E4M3 rows (1 KB) at random slots of a cache twice that size,
// one warp per token, U 16-byte loads per lane in flight; mode 0 no conversion (the memory traffic
// alone), 1 multiply by the reciprocal and convert, 2 the same with a residual correction (the
// reference's reciprocal division). Figures: bytes read + written per second. docs/cuda-reference.md,
// "Ninth round".
//   nvcc -O3 -arch=sm_90 -std=c++17 tools/probes/fp8_ceiling.cu -o fp8_ceiling && ./fp8_ceiling
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <vector>
#include <algorithm>
#include <numeric>
#include <random>
#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { printf("ERR %s: %s\n", #x, cudaGetErrorString(e_)); exit(1); } } while (0)

template <int MODE>
__device__ __forceinline__ uint2 conv(uint4 v, float rcp) {
  if (MODE == 0) return make_uint2(v.x, v.z);  // no conversion: the DRAM pattern alone
  const uint32_t w[4] = {v.x, v.y, v.z, v.w};
  uint16_t o[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    float a, b;
    asm("cvt.f32.f16 %0, %1;" : "=f"(a) : "h"((uint16_t)(w[i] & 0xFFFF)));
    asm("cvt.f32.f16 %0, %1;" : "=f"(b) : "h"((uint16_t)(w[i] >> 16)));
    a *= rcp; b *= rcp;
    if (MODE == 2) { float s = 1.0f / rcp; a = __fmaf_rn(-__fmaf_rn(a, s, -a * s), rcp, a); b = __fmaf_rn(-__fmaf_rn(b, s, -b * s), rcp, b); }
    asm("{cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;}" : "=h"(o[i]) : "f"(b), "f"(a));
  }
  return make_uint2(o[0] | ((uint32_t)o[1] << 16), o[2] | ((uint32_t)o[3] << 16));
}

// one warp per token: K and V rows = 2 x 128 chunks of 16 B input; lane takes chunks lane + 32 k
template <int U, int MODE>
__global__ void __launch_bounds__(256) q8(const uint4* __restrict__ ks, const uint4* __restrict__ vs, uint2* __restrict__ kc,
                                          uint2* __restrict__ vc, const int* __restrict__ slot, int ntok, float rcp) {
  const int lane = threadIdx.x & 31;
  const int tok = blockIdx.x * 8 + (threadIdx.x >> 5);
  if (tok >= ntok) return;
  const int s = __ldg(slot + tok);
  for (int base = 0; base < 256; base += 32 * U) {
    uint4 r[U];
#pragma unroll
    for (int k = 0; k < U; ++k) {
      const int q = base + lane + 32 * k;
      r[k] = q < 128 ? ks[(size_t)tok * 128 + q] : vs[(size_t)tok * 128 + q - 128];
    }
#pragma unroll
    for (int k = 0; k < U; ++k) {
      const int q = base + lane + 32 * k;
      const uint2 o = conv<MODE>(r[k], rcp);
      if (q < 128) kc[(size_t)s * 128 + q] = o; else vc[(size_t)s * 128 + q - 128] = o;
    }
  }
}

int main() {
  const int ntok = 262144, ncache = ntok * 2;
  uint4 *ks, *vs; uint2 *kc, *vc; int* slot;
  CK(cudaMalloc(&ks, (size_t)ntok * 2048)); CK(cudaMalloc(&vs, (size_t)ntok * 2048));
  CK(cudaMalloc(&kc, (size_t)ncache * 1024)); CK(cudaMalloc(&vc, (size_t)ncache * 1024));
  CK(cudaMalloc(&slot, ntok * 4));
  cudaMemset(ks, 0x31, (size_t)ntok * 2048); cudaMemset(vs, 0x32, (size_t)ntok * 2048);
  std::vector<int> perm(ncache); std::iota(perm.begin(), perm.end(), 0);
  std::mt19937 g(1); std::shuffle(perm.begin(), perm.end(), g);
  cudaMemcpy(slot, perm.data(), ntok * 4, cudaMemcpyHostToDevice);
  cudaEvent_t e0, e1; cudaEventCreate(&e0); cudaEventCreate(&e1);
  const double bytes0 = 2.0 * ntok * 1024 * 3;
  auto run = [&](const char* nm, auto fn, double bytes_ = 0) {
    const double bytes = bytes_ ? bytes_ : bytes0;
    fn(); fn(); CK(cudaDeviceSynchronize());
    std::vector<float> t;
    for (int r = 0; r < 11; ++r) { cudaEventRecord(e0); for (int i = 0; i < 3; ++i) fn(); cudaEventRecord(e1); cudaEventSynchronize(e1); float ms; cudaEventElapsedTime(&ms, e0, e1); t.push_back(ms / 3); }
    CK(cudaGetLastError()); std::sort(t.begin(), t.end());
    printf("%-40s %8.1f GB/s  (med %.1f us)\n", nm, bytes / (t[5] * 1e-3) / 1e9, t[5] * 1e3);
  };
  void* big; CK(cudaMalloc(&big, 2ull << 30));
  run("memcpy 1 GiB", [&] { cudaMemcpyAsync(big, (char*)big + (1ull << 30), 1ull << 30, cudaMemcpyDeviceToDevice); }, 2.0 * (1ull << 30));
  char nm[80];
  const int blocks = ntok / 8;
#define R(U, M) snprintf(nm, sizeof nm, "q8 U%d mode %d", U, M); run(nm, [&] { q8<U, M><<<blocks, 256>>>(ks, vs, kc, vc, slot, ntok, 0.37f); });
  R(2, 0) R(4, 0) R(8, 0) R(2, 1) R(4, 1) R(8, 1) R(2, 2) R(4, 2) R(8, 2)
  return 0;
}
