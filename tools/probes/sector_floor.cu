// sector_floor.cu -- the cold-L2 floor of the standard preset's slowest decode-sized call, the random-slot
// F32 write of 256 tokens into an HND_PACKED cache (8 heads x 128 values; x = 4, so every token and dgroup is
// one 16-byte piece, half of a 32-byte sector whose other half belongs to another, unwritten slot). As the
// bench's standard preset: K and V caches of 128 MiB each, slots drawn at random over the whole cache,
// 25 input sets rotated so one round moves twice the L2, the calls replayed from a CUDA graph; the time is
// per call. `./sector_floor f16` runs the same call with F16 values (x = 8: 16 pieces per head and token,
// 65536 per call), the random-slot F16/BF16 writes of the preset. One plain kernel, one thread per piece,
// in five modes:
//   0  load the IO piece, store it at its slot (what any provider must do)
//   1  store only (no IO read): the stores' floor
//   2  mode 0 with the destination prefetched into L2 first (prefetch.global.L2)
//   3  mode 0 with prefill slots (16 consecutive slots per block: whole sectors)
//   4  mode 0 with the destination sector read first (ld.global.cg), its value unused
// docs/cuda-reference.md, "Fourteenth round".
//   nvcc -O3 -arch=sm_90 -std=c++17 tools/probes/sector_floor.cu -o sector_floor && ./sector_floor
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

constexpr int kTokens = 256, kHeads = 8, kBlock = 16;

/* kDgroups: 16-byte pieces per head and token (128 F32: 32; 128 F16: 16) */
template <int kDgroups>
__global__ void write_pieces(const uint4* __restrict__ k, const uint4* __restrict__ v, uint4* kc, uint4* vc,
                             const int* __restrict__ slot, int mode) {
  constexpr int kPieces = kTokens * kHeads * kDgroups; /* per side */
  const int i = blockIdx.x * blockDim.x + threadIdx.x; /* K's pieces, then V's */
  const int side = i >= kPieces, p = side ? i - kPieces : i;
  const int t = p / (kHeads * kDgroups), h = (p / kDgroups) % kHeads, dg = p % kDgroups;
  const int s = __ldg(slot + t), b = s / kBlock, o = s % kBlock;
  uint4* dst = (side ? vc : kc) + (((size_t)b * kHeads + h) * kDgroups + dg) * kBlock + o; /* [block][head][dg][token] */
  if (mode == 2) asm volatile("prefetch.global.L2 [%0];" ::"l"(dst));
  uint4 r = make_uint4(i, 1, 2, 3);
  if (mode != 1) r = (side ? v : k)[p];
  if (mode == 4) {
    uint4 q;
    asm volatile("ld.global.cg.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(q.x), "=r"(q.y), "=r"(q.z), "=r"(q.w) : "l"(dst));
    r.w ^= q.x & 0u;
  }
  *dst = r;
}

template <int kDgroups>
int run() {
  constexpr int kPieces = kTokens * kHeads * kDgroups; /* per side */
  const int kSets = kDgroups == 32 ? 25 : 50;          /* the preset's sets: twice the L2 per round */
  const size_t blocks = 4096 * 16 / kDgroups;          /* 128 MiB per cache */
  const size_t cache_bytes = blocks * kHeads * kDgroups * kBlock * 16, io_bytes = (size_t)kPieces * 16;
  uint4 *kc, *vc;
  CK(cudaMalloc(&kc, cache_bytes));
  CK(cudaMalloc(&vc, cache_bytes));
  CK(cudaMemset(kc, 0, cache_bytes));
  CK(cudaMemset(vc, 0, cache_bytes));
  std::vector<uint4*> kio(kSets), vio(kSets);
  std::vector<int*> rnd(kSets), pre(kSets);
  std::mt19937 gen(1);
  std::vector<int> slots(blocks * kBlock), order(blocks);
  std::iota(slots.begin(), slots.end(), 0);
  std::shuffle(slots.begin(), slots.end(), gen);
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), gen);
  for (int j = 0; j < kSets; ++j) {
    CK(cudaMalloc(&kio[j], io_bytes));
    CK(cudaMalloc(&vio[j], io_bytes));
    CK(cudaMemset(kio[j], j, io_bytes));
    CK(cudaMemset(vio[j], j + 1, io_bytes));
    CK(cudaMalloc(&rnd[j], kTokens * 4));
    CK(cudaMalloc(&pre[j], kTokens * 4));
    std::vector<int> r(slots.begin() + j * kTokens, slots.begin() + (j + 1) * kTokens), q(kTokens);
    for (int t = 0; t < kTokens; ++t) q[t] = order[j * (kTokens / kBlock) + t / kBlock] * kBlock + t % kBlock;
    CK(cudaMemcpy(rnd[j], r.data(), kTokens * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(pre[j], q.data(), kTokens * 4, cudaMemcpyHostToDevice));
  }
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  printf("%s, %s: %d sets, %d pieces of 16 bytes per call\n", prop.name, kDgroups == 32 ? "F32" : "F16", kSets,
         2 * kPieces);
  cudaStream_t st;
  CK(cudaStreamCreate(&st));
  const char* names[] = {"IO load + store", "store only", "prefetch + load + store", "prefill slots",
                         "destination read + store"};
  for (int mode = 0; mode < 5; ++mode) {
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
    for (int j = 0; j < kSets; ++j)
      write_pieces<kDgroups><<<2 * kPieces / 256, 256, 0, st>>>(kio[j], vio[j], kc, vc, mode == 3 ? pre[j] : rnd[j],
                                                      mode == 3 ? 0 : mode);
    CK(cudaStreamEndCapture(st, &graph));
    CK(cudaGraphInstantiate(&exec, graph, 0));
    for (int w = 0; w < 3; ++w) CK(cudaGraphLaunch(exec, st));
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    const int reps = 40;
    std::vector<float> us;
    for (int round = 0; round < 5; ++round) {
      CK(cudaEventRecord(a, st));
      for (int r = 0; r < reps; ++r) CK(cudaGraphLaunch(exec, st));
      CK(cudaEventRecord(b, st));
      CK(cudaEventSynchronize(b));
      float ms;
      CK(cudaEventElapsedTime(&ms, a, b));
      us.push_back(ms * 1000.0f / (reps * kSets));
    }
    std::sort(us.begin(), us.end());
    printf("mode %d (%s): %.2f us per call (rounds %.2f-%.2f)\n", mode, names[mode], us[2], us[0], us[4]);
    CK(cudaGraphExecDestroy(exec));
    CK(cudaGraphDestroy(graph));
  }
  return 0;
}

int main(int argc, char** argv) { return argc > 1 && argv[1][0] == 'f' && argv[1][1] == '1' ? run<16>() : run<32>(); }
