// tuning_check SMS MEM_KHZ BUS_BITS [GBPS_PER_SM]: the memory depth (cuda/tuning.h) of a device
// with these properties, as the CUDA backend computes it at its first launch on that device.
// Prints "per_sm_gbps X depth N". tests/test_kernel_identities.py runs it on the host in CI.
#include <cstdio>
#include <cstdlib>

#include "cuda/tuning.h"

int main(int argc, char** argv) {
  if (argc != 4 && argc != 5) {
    std::fprintf(stderr, "usage: tuning_check SMS MEM_KHZ BUS_BITS [GBPS_PER_SM]\n");
    return 2;
  }
  const int sms = std::atoi(argv[1]), khz = std::atoi(argv[2]), bits = std::atoi(argv[3]);
  const double unit = argc == 5 ? std::atof(argv[4]) : (double)KVX_CUDA_DEPTH_GBPS_PER_SM;
  const double per_sm = sms > 0 ? kvx_cuda::peak_dram_Bps(khz, bits) / sms / 1e9 : 0.0;
  std::printf("per_sm_gbps %.2f depth %d\n", per_sm, kvx_cuda::memory_depth_for(sms, khz, bits, unit));
  return 0;
}
