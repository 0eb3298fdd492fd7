/*
 * tuning.h -- launch tuning that follows the device's properties (no table keyed
 * by a GPU's name). Plain C++, no CUDA: csrc/tests/tuning_check.cpp checks it on
 * the host in CI (tests/test_kernel_identities.py).
 */
#ifndef KVX_REFERENCE_CUDA_TUNING_H
#define KVX_REFERENCE_CUDA_TUNING_H

#ifndef KVX_CUDA_DEPTH_GBPS_PER_SM
#define KVX_CUDA_DEPTH_GBPS_PER_SM 30 /* DRAM GB/s per SM that one fast-path task per warp keeps fed */
#endif

namespace kvx_cuda {

/* Peak DRAM bandwidth of a device in bytes/s: two transfers per memory clock
 * (cudaDevAttrMemoryClockRate, kHz) over the bus (cudaDevAttrGlobalMemoryBusWidth, bits). */
inline double peak_dram_Bps(int mem_khz, int bus_bits) {
  return mem_khz > 0 && bus_bits > 0 ? 2.0 * (double)mem_khz * 1e3 * ((double)bus_bits / 8.0) : 0.0;
}

/* Memory depth: how many fast-path tasks a warp must have in flight to keep DRAM busy,
 * ceil(peak DRAM bandwidth per SM / gbps_per_sm GB/s), at least 1 and at most 4 (1 when
 * a property is unknown). With a similar memory latency, a part with more bandwidth per
 * SM needs more bytes in flight per SM (Little's law). */
inline int memory_depth_for(int sms, int mem_khz, int bus_bits, double gbps_per_sm = KVX_CUDA_DEPTH_GBPS_PER_SM) {
  if (sms <= 0 || gbps_per_sm <= 0) return 1;
  const double per_sm = peak_dram_Bps(mem_khz, bus_bits) / (double)sms;
  int d = 1;
  while (d < 4 && per_sm > gbps_per_sm * 1e9 * d) ++d;
  return d;
}

}  // namespace kvx_cuda

#endif /* KVX_REFERENCE_CUDA_TUNING_H */
