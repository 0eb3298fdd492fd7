// write_stream.cu -- write-heavy streams on one GPU against cudaMemcpyAsync, each timed with CUDA events
// (median of 15; the figure is bytes read + written per second): cudaMemsetAsync and a store-only fill
// kernel (plain and streaming stores), and the FP4 gathers' shape into F32 without the decoding: a
// 2-byte load and a 16-byte store per chunk, 4 or 8 chunks a lane (plain and streaming stores).
// docs/fp4.md, "Nineteenth round".
//   nvcc -O3 -arch=sm_90 -std=c++17 tools/probes/write_stream.cu -o write_stream && ./write_stream
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdint.h>
#include <vector>
#include <algorithm>
#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { printf("ERR %s\n", cudaGetErrorString(e_)); return 1; } } while (0)
// each thread: NI chunks of 16 B written from one 2-byte read per chunk (the F32 gather's ratio)
template <int NI, bool CS>
__global__ void __launch_bounds__(128) gath(const unsigned short* __restrict__ c, uint4* __restrict__ o, size_t nchunks) {
  size_t base = ((size_t)blockIdx.x * 128 + (threadIdx.x & ~31u)) * NI + (threadIdx.x & 31u);
  unsigned short v[NI];
#pragma unroll
  for (int m = 0; m < NI; ++m) v[m] = base + 32 * m < nchunks ? __ldg(c + base + 32 * m) : 0;
#pragma unroll
  for (int m = 0; m < NI; ++m) if (base + 32 * m < nchunks) {
    uint4 w = make_uint4(v[m] * 3u, v[m] ^ 7u, v[m] + 1u, v[m]);
    if (CS) __stcs(o + base + 32 * m, w); else o[base + 32 * m] = w;
  }
}
template <bool CS>
__global__ void __launch_bounds__(256) fill(uint4* __restrict__ o, size_t n) {
  for (size_t i = (size_t)blockIdx.x * 256 + threadIdx.x; i < n; i += (size_t)gridDim.x * 256) {
    uint4 w = make_uint4(i, 1, 2, 3); if (CS) __stcs(o + i, w); else o[i] = w; }
}
int main() {
  const size_t bytes = 1ull << 30, nch = bytes / 16;
  void *a, *b; unsigned short* c;
  CK(cudaMalloc(&a, bytes)); CK(cudaMalloc(&b, bytes)); CK(cudaMalloc(&c, nch * 2)); CK(cudaMemset(c, 1, nch * 2));
  cudaEvent_t e0, e1; cudaEventCreate(&e0); cudaEventCreate(&e1);
  int sms; cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  auto t = [&](auto f, double moved, const char* name) {
    std::vector<float> ms;
    for (int r = 0; r < 17; ++r) { cudaEventRecord(e0); f(); cudaEventRecord(e1); cudaEventSynchronize(e1); float x; cudaEventElapsedTime(&x, e0, e1); if (r > 1) ms.push_back(x); }
    std::sort(ms.begin(), ms.end()); printf("%-40s %8.1f GB/s\n", name, moved / (ms[ms.size() / 2] * 1e-3) / 1e9);
  };
  t([&] { cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice); }, 2.0 * bytes, "cudaMemcpyAsync (r+w)");
  t([&] { cudaMemsetAsync(b, 3, bytes); }, 1.0 * bytes, "cudaMemsetAsync (w)");
  t([&] { fill<false><<<sms * 8, 256>>>((uint4*)b, nch); }, 1.0 * bytes, "fill kernel (w)");
  t([&] { fill<true><<<sms * 8, 256>>>((uint4*)b, nch); }, 1.0 * bytes, "fill kernel .cs (w)");
  t([&] { gath<4, false><<<(nch + 511) / 512, 128>>>(c, (uint4*)b, nch); }, bytes + nch * 2.0, "2B read -> 16B write, NI 4");
  t([&] { gath<4, true><<<(nch + 511) / 512, 128>>>(c, (uint4*)b, nch); }, bytes + nch * 2.0, "... .cs stores");
  t([&] { gath<8, false><<<(nch + 1023) / 1024, 128>>>(c, (uint4*)b, nch); }, bytes + nch * 2.0, "2B read -> 16B write, NI 8");
  return 0;
}
