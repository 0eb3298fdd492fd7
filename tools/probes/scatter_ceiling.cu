// scatter_ceiling.cu -- what a plain copy kernel reaches on the bench's 16-bit write and gather shape:
// 65536 tokens x (K, V) rows of ROW_CHUNKS x 16 B (default 128: 2 KB, 8 heads x 128 F16; 64: 1 KB, 8 heads
// x 64), cache rows at slot[token] (identity, a random permutation of a cache twice that size, or random
// 16-token blocks as a PACKED gather reads them), 128 chunks per warp task (8 x 16 B per lane: one token
// of 2 KB rows, two of 1 KB), against cudaMemcpyAsync of the same bytes; tasks per warp 1 / 2 / 4 and
// resident 256-thread blocks per SM 8 / 4 / 3 / 2 (dynamic shared memory caps them).
// docs/cuda-reference.md, "Ninth round" (2 KB rows) and "The same kernels under the repeat, FP8
// stream-order checks" (1 KB rows).
//   nvcc -O3 -arch=sm_90 -std=c++17 [-DROW_CHUNKS=64] tools/probes/scatter_ceiling.cu -o scatter_ceiling && ./scatter_ceiling
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <vector>
#include <algorithm>
#include <numeric>
#include <random>
#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { printf("ERR %s: %s\n", #x, cudaGetErrorString(e_)); exit(1); } } while (0)

#ifndef ROW_CHUNKS
#define ROW_CHUNKS 128
#endif
constexpr int RC = ROW_CHUNKS, TOKS = 128 / ROW_CHUNKS;  // 16-byte chunks per row, tokens per warp task
static_assert(RC * TOKS == 128, "ROW_CHUNKS must divide 128");

template <bool GATHER, int TPW>
__global__ void __launch_bounds__(256) scat(const uint4* __restrict__ ks, const uint4* __restrict__ vs, uint4* __restrict__ kc,
                                            uint4* __restrict__ vc, const int* __restrict__ slot, int ntok) {
  extern __shared__ char pad[];
  const int wib = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int base = blockIdx.x * 8 * TPW + wib, ngroups = ntok / TOKS;
  for (int t = 0; t < TPW; ++t) {
    const int grp = base + 8 * t;
    if (grp >= ngroups) return;
    int s[TOKS];
#pragma unroll
    for (int i = 0; i < TOKS; ++i) s[i] = __ldg(slot + grp * TOKS + i);
    uint4 r[8];
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      const int c = lane + 32 * (k & 3), tk = c / RC, ch = c % RC;
      const size_t io = (size_t)(grp * TOKS + tk) * RC + ch, ca = (size_t)s[tk] * RC + ch;
      const uint4* src = k < 4 ? (GATHER ? kc + ca : ks + io) : (GATHER ? vc + ca : vs + io);
      r[k] = src[0];
    }
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      const int c = lane + 32 * (k & 3), tk = c / RC, ch = c % RC;
      const size_t io = (size_t)(grp * TOKS + tk) * RC + ch, ca = (size_t)s[tk] * RC + ch;
      uint4* dst = k < 4 ? (GATHER ? (uint4*)ks + io : kc + ca) : (GATHER ? (uint4*)vs + io : vc + ca);
      dst[0] = r[k];
    }
  }
}

int main() {
  const int ntok = 65536, ncache = 65536 * 2;  // cache twice the tokens (like the bench: random slots in a larger cache)
  const size_t row = 16 * RC;
  uint4 *ks, *vs, *kc, *vc; int* slot;
  CK(cudaMalloc(&ks, ntok * row)); CK(cudaMalloc(&vs, ntok * row));
  CK(cudaMalloc(&kc, ncache * row)); CK(cudaMalloc(&vc, ncache * row));
  CK(cudaMalloc(&slot, ntok * 4));
  cudaMemset(ks, 1, ntok * row); cudaMemset(vs, 2, ntok * row); cudaMemset(kc, 3, ncache * row); cudaMemset(vc, 4, ncache * row);
  std::vector<int> perm(ncache); std::iota(perm.begin(), perm.end(), 0);
  std::mt19937 g(1); std::shuffle(perm.begin(), perm.end(), g);
  std::vector<int> ident(ntok); std::iota(ident.begin(), ident.end(), 0);
  std::vector<int> bperm(ncache / 16); std::iota(bperm.begin(), bperm.end(), 0);
  std::shuffle(bperm.begin(), bperm.end(), g);
  std::vector<int> blocks(ntok);  // random 16-token blocks, their tokens in order (a PACKED table's reads)
  for (int t = 0; t < ntok; ++t) blocks[t] = bperm[t / 16] * 16 + t % 16;
  int sms; cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  cudaEvent_t e0, e1; cudaEventCreate(&e0); cudaEventCreate(&e1);
  const double bytes = 4.0 * ntok * row;
  char nm0[64];
  auto run = [&](const char* nm, auto fn) {
    fn(); fn(); CK(cudaDeviceSynchronize());
    std::vector<float> t;
    for (int r = 0; r < 15; ++r) { cudaEventRecord(e0); for (int i = 0; i < 4; ++i) fn(); cudaEventRecord(e1); cudaEventSynchronize(e1); float ms; cudaEventElapsedTime(&ms, e0, e1); t.push_back(ms / 4); }
    CK(cudaGetLastError()); std::sort(t.begin(), t.end());
    printf("%-44s %8.1f GB/s  (med %.1f us)\n", nm, bytes / (t[7] * 1e-3) / 1e9, t[7] * 1e3);
  };
  snprintf(nm0, sizeof nm0, "memcpy same bytes (2 x %zu MiB)", ntok * row >> 20);
  run(nm0, [&] { cudaMemcpyAsync(kc, ks, ntok * row, cudaMemcpyDeviceToDevice); cudaMemcpyAsync(vc, vs, ntok * row, cudaMemcpyDeviceToDevice); });
  char nm[96];
  const char* pattern[3] = {"ident ", "random", "blocks"};
  const std::vector<int>* slots[3] = {&ident, &perm, &blocks};
  for (int rnd = 0; rnd < 3; ++rnd) {
    cudaMemcpy(slot, slots[rnd]->data(), ntok * 4, cudaMemcpyHostToDevice);
    for (int gat = 0; gat < 2; ++gat)
      for (int tpw : {1, 2, 4})
        for (int per : {8, 4, 3, 2}) {
          // limit resident blocks with dynamic shared memory
          const int smem = per == 8 ? 0 : (228 * 1024) / per - 1024 - 1024;
          auto k = gat ? (tpw == 1 ? scat<true, 1> : tpw == 2 ? scat<true, 2> : scat<true, 4>)
                       : (tpw == 1 ? scat<false, 1> : tpw == 2 ? scat<false, 2> : scat<false, 4>);
          CK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
          int occ; cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, k, 256, smem);
          const int grid = (ntok / TOKS + 8 * tpw - 1) / (8 * tpw);
          snprintf(nm, sizeof nm, "%s %s tpw %d blocks/SM %d", pattern[rnd], gat ? "gather" : "write ", tpw, occ);
          run(nm, [&] { k<<<grid, 256, smem>>>(ks, vs, kc, vc, slot, ntok); });
        }
  }
  return 0;
}
