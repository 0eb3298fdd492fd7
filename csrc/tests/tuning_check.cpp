// The launch tuning of cuda/tuning.h, computed on the host as the CUDA backend computes it on
// the device. tests/test_kernel_identities.py runs it in CI.
//   tuning_check SMS MEM_KHZ BUS_BITS [GBPS_PER_SM]   "per_sm_gbps X depth N": the memory depth
//   tuning_check lean DEPTH LOOKUP_GATHER [LG_TG]      "lean 0|1": lean_rows_for (LG_TG 0 if not given)
//   tuning_check fp4deep DEPTH                         "fp4deep 0|1": fp4_lean_deep_for
//   tuning_check rowsinv DEPTH                         "rowsinv 0|1": rows_invert_for
//   tuning_check rowsearly DEPTH                       "rowsearly 0|1": rows_write_early_for
//   tuning_check fit32 HEADS DIM C_HEAD C_ESIZE IO_HEAD IO_ESIZE   "fit32 0|1": row_offsets_fit32
//   tuning_check pairs DEPTH PACKED TOKEN_ROWS LG_TG ROW_CHUNKS TASK_CHUNKS   "pairs 0|1": lean_gather_pairs_for
//   tuning_check fp8affine LG_TG CHUNKS HEADS PER_HEAD   "fp8affine 0|1": rows_fp8_affine_for
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "cuda/tuning.h"

int main(int argc, char** argv) {
  if ((argc == 4 || argc == 5) && std::strcmp(argv[1], "lean") == 0) {
    const int lg_tg = argc == 5 ? std::atoi(argv[4]) : 0;
    std::printf("lean %d\n", kvx_cuda::lean_rows_for(std::atoi(argv[2]), std::atoi(argv[3]) != 0, lg_tg) ? 1 : 0);
    return 0;
  }
  if (argc == 3 && std::strcmp(argv[1], "fp4deep") == 0) {
    std::printf("fp4deep %d\n", kvx_cuda::fp4_lean_deep_for(std::atoi(argv[2])) ? 1 : 0);
    return 0;
  }
  if (argc == 3 && std::strcmp(argv[1], "rowsinv") == 0) {
    std::printf("rowsinv %d\n", kvx_cuda::rows_invert_for(std::atoi(argv[2])) ? 1 : 0);
    return 0;
  }
  if (argc == 3 && std::strcmp(argv[1], "rowsearly") == 0) {
    std::printf("rowsearly %d\n", kvx_cuda::rows_write_early_for(std::atoi(argv[2])) ? 1 : 0);
    return 0;
  }
  if (argc == 8 && std::strcmp(argv[1], "fit32") == 0) {
    const bool f = kvx_cuda::row_offsets_fit32(std::strtoull(argv[2], nullptr, 10), std::strtoull(argv[3], nullptr, 10),
                                               std::atoll(argv[4]), std::atoi(argv[5]), std::atoll(argv[6]),
                                               std::atoi(argv[7]));
    std::printf("fit32 %d\n", f ? 1 : 0);
    return 0;
  }
  if (argc == 8 && std::strcmp(argv[1], "pairs") == 0) {
    const bool on = kvx_cuda::lean_gather_pairs_for(std::atoi(argv[2]), std::atoi(argv[3]) != 0, std::atoi(argv[4]) != 0,
                                                    std::atoi(argv[5]), std::strtoull(argv[6], nullptr, 10),
                                                    std::strtoull(argv[7], nullptr, 10));
    std::printf("pairs %d\n", on ? 1 : 0);
    return 0;
  }
  if (argc == 6 && std::strcmp(argv[1], "fp8affine") == 0) {
    const bool on = kvx_cuda::rows_fp8_affine_for(std::atoi(argv[2]), (unsigned)std::strtoul(argv[3], nullptr, 10),
                                                  (unsigned)std::strtoul(argv[4], nullptr, 10), std::atoi(argv[5]) != 0);
    std::printf("fp8affine %d\n", on ? 1 : 0);
    return 0;
  }
  if (argc != 4 && argc != 5) {
    std::fprintf(stderr,
                 "usage: tuning_check SMS MEM_KHZ BUS_BITS [GBPS_PER_SM] | lean DEPTH LOOKUP_GATHER [LG_TG] | fp4deep DEPTH |"
                 " rowsinv DEPTH | rowsearly DEPTH |"
                 " fit32 HEADS DIM C_HEAD C_ESIZE IO_HEAD IO_ESIZE |"
                 " pairs DEPTH PACKED TOKEN_ROWS LG_TG ROW_CHUNKS TASK_CHUNKS | fp8affine LG_TG CHUNKS HEADS PER_HEAD\n");
    return 2;
  }
  const int sms = std::atoi(argv[1]), khz = std::atoi(argv[2]), bits = std::atoi(argv[3]);
  const double unit = argc == 5 ? std::atof(argv[4]) : (double)KVX_CUDA_DEPTH_GBPS_PER_SM;
  const double per_sm = sms > 0 ? kvx_cuda::peak_dram_Bps(khz, bits) / sms / 1e9 : 0.0;
  std::printf("per_sm_gbps %.2f depth %d\n", per_sm, kvx_cuda::memory_depth_for(sms, khz, bits, unit));
  return 0;
}
