// fp4_ceiling.cu -- what a plain kernel reaches on fp4bench's shape (262144 tokens, K and V rows of
// 8 x 128 F16 = 2 KB; FP4 rows of 512 code bytes and 64 scale bytes, 16-value blocks): the write reads
// the F16 rows and writes codes and scales at a random permutation of the slots; the gather reads
// them through a shuffled PACKED table (128 sequences of 2048 tokens, blocks of 16) and writes F16 rows.
// One warp per token (both sides), each lane two 16-value blocks per side (write) or four 8-value
// chunks per side (gather), every load of the token issued before the first use. MODE 0 moves the
// bytes only (codes from a fold of the input bits, the gather's output from the code bits); MODE 1
// adds an encoding of about the reference's cost (per block the amax, an exponent and seven packed
// compares per word; the gather a table decode and a multiply per value). Resident 256-thread blocks
// per SM set by dynamic shared memory. Against cudaMemcpyAsync of 1 GiB and of the same bytes; bytes
// counted as fp4bench counts them. docs/fp4.md, "Eleventh round".
//   nvcc -O3 -arch=sm_90 -std=c++17 tools/probes/fp4_ceiling.cu -o fp4_ceiling && ./fp4_ceiling
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include <algorithm>
#include <numeric>
#include <random>
#include <vector>
#define CK(x)                                                             \
  do {                                                                    \
    cudaError_t e_ = (x);                                                 \
    if (e_ != cudaSuccess) {                                              \
      printf("ERR %s: %s\n", #x, cudaGetErrorString(e_));                 \
      exit(1);                                                            \
    }                                                                     \
  } while (0)

constexpr int NTOK = 262144, ROWV = 1024, SUBS = ROWV / 16;  // values per side-row, 16-value blocks per row
constexpr int SEQ = 2048, BS = 16, NB = NTOK / BS, BPS = SEQ / BS;

// the codes of one 16-value block (8 words of F16 pairs) and its scale byte
template <int MODE>
__device__ __forceinline__ uint2 enc(const uint4& a, const uint4& b, uint32_t& sbyte) {
  const uint32_t w[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
  if (MODE == 0) {
    sbyte = (w[0] ^ w[7]) & 0xFF;
    return make_uint2(w[0] ^ w[1] ^ w[2] ^ w[3], w[4] ^ w[5] ^ w[6] ^ w[7]);
  }
  __half2 m = __habs2(*(const __half2*)&w[0]);
#pragma unroll
  for (int i = 1; i < 8; ++i) m = __hmax2(m, __habs2(*(const __half2*)&w[i]));
  const float amax = fmaxf(__low2float(m), __high2float(m));
  const int e = (int)((__float_as_uint(amax) >> 23) & 0xFF) - 2;
  sbyte = (uint32_t)e;
  const __half2 d = __float2half2_rn(__uint_as_float((uint32_t)(e > 1 ? e : 1) << 23));
  uint32_t c[2] = {0, 0};
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const __half2 x = __habs2(*(const __half2*)&w[i]);
    __half2 n = __float2half2_rn(0.f);
    const float th[7] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.f};
#pragma unroll
    for (int k = 0; k < 7; ++k) n = __hadd2(n, __hge2(x, __hmul2(d, __float2half2_rn(th[k]))));
    const uint32_t nb = *(const uint32_t*)&n;
    const uint32_t code = ((nb >> 10) & 7) | (((nb >> 26) & 7) << 4) | ((w[i] >> 12) & 0x8) | ((w[i] >> 24) & 0x80);
    c[i >> 2] |= code << (8 * (i & 3));
  }
  return make_uint2(c[0], c[1]);
}

template <int MODE>
__global__ void __launch_bounds__(256) wr(const uint4* __restrict__ io, uint2* __restrict__ codes,
                                          uint8_t* __restrict__ scales, const long long* __restrict__ slot) {
  extern __shared__ char pad[];
  const int lane = threadIdx.x & 31;
  const int tok = blockIdx.x * 8 + (threadIdx.x >> 5);
  if (tok >= NTOK) return;
  uint4 r[2][2][2];  // side, block, half
#pragma unroll
  for (int sd = 0; sd < 2; ++sd)
#pragma unroll
    for (int m = 0; m < 2; ++m) {
      const uint4* src = io + ((size_t)sd * NTOK + tok) * (ROWV / 8) + (size_t)(lane + 32 * m) * 2;
      r[sd][m][0] = __ldg(src);
      r[sd][m][1] = __ldg(src + 1);
    }
  const long long s = __ldg(slot + tok);
#pragma unroll
  for (int sd = 0; sd < 2; ++sd)
#pragma unroll
    for (int m = 0; m < 2; ++m) {
      uint32_t sb;
      const uint2 c = enc<MODE>(r[sd][m][0], r[sd][m][1], sb);
      codes[((size_t)sd * NTOK + s) * SUBS + lane + 32 * m] = c;
      scales[((size_t)sd * NTOK + s) * SUBS + lane + 32 * m] = (uint8_t)sb;
    }
}

template <int MODE>
__global__ void __launch_bounds__(256) ga(const uint32_t* __restrict__ codes, const uint8_t* __restrict__ scales,
                                          const int* __restrict__ table, uint4* __restrict__ io) {
  extern __shared__ char pad[];
  __shared__ float e2m1[16];
  if (threadIdx.x < 16) {
    const float v[8] = {0.f, 0.5f, 1.f, 1.5f, 2.f, 3.f, 4.f, 6.f};
    e2m1[threadIdx.x] = threadIdx.x & 8 ? -v[threadIdx.x & 7] : v[threadIdx.x & 7];
  }
  __syncthreads();
  const int lane = threadIdx.x & 31;
  const int tok = blockIdx.x * 8 + (threadIdx.x >> 5);
  if (tok >= NTOK) return;
  const int seq = tok / SEQ, t = tok % SEQ;
  const long long slot = (long long)__ldg(table + seq * BPS + t / BS) * BS + t % BS;
  uint32_t c[2][4];
  uint8_t sc[2][4];
#pragma unroll
  for (int sd = 0; sd < 2; ++sd)
#pragma unroll
    for (int m = 0; m < 4; ++m) {  // chunk = 8 values: 4 code bytes; its block's scale byte
      const int ch = lane + 32 * m;
      c[sd][m] = __ldg(codes + ((size_t)sd * NTOK + slot) * (ROWV / 8) + ch);
      sc[sd][m] = __ldg(scales + ((size_t)sd * NTOK + slot) * SUBS + ch / 2);
    }
#pragma unroll
  for (int sd = 0; sd < 2; ++sd)
#pragma unroll
    for (int m = 0; m < 4; ++m) {
      uint4 o;
      if (MODE == 0) {
        o = make_uint4(c[sd][m], c[sd][m] ^ sc[sd][m], c[sd][m] + 1, c[sd][m] * 3);
      } else {
        const float sf = __uint_as_float((uint32_t)sc[sd][m] << 23);
        uint32_t ow[4];
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          const float a = e2m1[(c[sd][m] >> (8 * k)) & 15] * sf, b = e2m1[(c[sd][m] >> (8 * k + 4)) & 15] * sf;
          const __half2 h = __floats2half2_rn(a, b);
          ow[k] = *(const uint32_t*)&h;
        }
        o = make_uint4(ow[0], ow[1], ow[2], ow[3]);
      }
      io[((size_t)sd * NTOK + tok) * (ROWV / 8) + lane + 32 * m] = o;
    }
}

int main() {
  uint4* io;
  uint2* codes;
  uint8_t* scales;
  long long* slot;
  int* table;
  const size_t io_b = 2ull * NTOK * ROWV * 2, code_b = 2ull * NTOK * ROWV / 2, sc_b = 2ull * NTOK * SUBS;
  CK(cudaMalloc(&io, io_b));
  CK(cudaMalloc(&codes, code_b));
  CK(cudaMalloc(&scales, sc_b));
  CK(cudaMalloc(&slot, NTOK * 8));
  CK(cudaMalloc(&table, NB * 4));
  {  // F16 values of a normal-ish spread (the encode's work does not depend on them)
    std::vector<__half> h(io_b / 2);
    std::mt19937 g(1);
    std::normal_distribution<float> nd;
    for (auto& x : h) x = __float2half(nd(g));
    CK(cudaMemcpy(io, h.data(), io_b, cudaMemcpyHostToDevice));
  }
  cudaMemset(codes, 0x35, code_b);
  cudaMemset(scales, 120, sc_b);
  std::mt19937 g(2);
  std::vector<long long> perm(NTOK);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), g);
  CK(cudaMemcpy(slot, perm.data(), NTOK * 8, cudaMemcpyHostToDevice));
  std::vector<int> tb(NB);
  std::iota(tb.begin(), tb.end(), 0);
  std::shuffle(tb.begin(), tb.end(), g);
  CK(cudaMemcpy(table, tb.data(), NB * 4, cudaMemcpyHostToDevice));
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  auto run = [&](const char* nm, double bytes, auto fn) {
    fn();
    fn();
    CK(cudaDeviceSynchronize());
    std::vector<float> t;
    for (int r = 0; r < 11; ++r) {
      cudaEventRecord(e0);
      for (int i = 0; i < 5; ++i) fn();
      cudaEventRecord(e1);
      cudaEventSynchronize(e1);
      float ms;
      cudaEventElapsedTime(&ms, e0, e1);
      t.push_back(ms / 5);
    }
    CK(cudaGetLastError());
    std::sort(t.begin(), t.end());
    const double gbs = bytes / (t[5] * 1e-3) / 1e9;
    printf("%-40s %8.1f GB/s  (median %.1f us)\n", nm, gbs, t[5] * 1e3);
    return gbs;
  };
  char *a, *b;
  const size_t G = 1ull << 30;
  CK(cudaMalloc(&a, G));
  CK(cudaMalloc(&b, G));
  cudaMemset(a, 1, G);
  const double roof = run("memcpy 1 GiB (roofline)", 2.0 * G, [&] { cudaMemcpyAsync(b, a, G, cudaMemcpyDeviceToDevice); });
  const double moved = (double)io_b + code_b + sc_b;  // + slots or table, as fp4bench
  const size_t half = (size_t)(moved / 2) & ~(size_t)255;
  run("memcpy of the same bytes", 2.0 * half, [&] { cudaMemcpyAsync(b, a, half, cudaMemcpyDeviceToDevice); });
  char nm[96];
  for (int mode = 0; mode < 2; ++mode)
    for (int per : {8, 6, 4, 3, 2}) {
      const int smem = per == 8 ? 0 : (228 * 1024) / per - 2048;
      auto w = mode ? wr<1> : wr<0>;
      auto gk = mode ? ga<1> : ga<0>;
      CK(cudaFuncSetAttribute(w, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
      CK(cudaFuncSetAttribute(gk, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
      int ow, og;
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&ow, w, 256, smem);
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&og, gk, 256, smem);
      snprintf(nm, sizeof nm, "write  mode %d blocks/SM %d", mode, ow);
      double x = run(nm, moved + NTOK * 8.0, [&] { w<<<NTOK / 8, 256, smem>>>(io, codes, scales, slot); });
      printf("%-40s %8.1f %% of roofline\n", "", 100 * x / roof);
      snprintf(nm, sizeof nm, "gather mode %d blocks/SM %d", mode, og);
      x = run(nm, moved + NB * 4.0, [&] { gk<<<NTOK / 8, 256, smem>>>((const uint32_t*)codes, scales, table, io); });
      printf("%-40s %8.1f %% of roofline\n", "", 100 * x / roof);
    }
  cudaFuncAttributes fa;
  cudaFuncGetAttributes(&fa, wr<1>);
  printf("registers: write mode 1 %d", fa.numRegs);
  cudaFuncGetAttributes(&fa, ga<1>);
  printf(", gather mode 1 %d\n", fa.numRegs);
  return 0;
}
