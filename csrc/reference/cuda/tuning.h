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

#ifndef KVX_CUDA_LEAN_MIN_LG_TG
#define KVX_CUDA_LEAN_MIN_LG_TG 2 /* lean_rows_for at memory depth 1: tasks of at least 4 rows */
#endif
#ifndef KVX_CUDA_ROWS_PAIR_GATHER
#define KVX_CUDA_ROWS_PAIR_GATHER 1 /* lean_gather_pairs_for: PACKED gathers of whole-token rows, two rows per task */
#endif
#ifndef KVX_CUDA_ROWS_WRITE_EARLY_DEPTH
#define KVX_CUDA_ROWS_WRITE_EARLY_DEPTH 2 /* rows_write_early_for: the least memory depth (0: never) */
#endif
#ifndef KVX_CUDA_ROWS_FP8_AFFINE
#define KVX_CUDA_ROWS_FP8_AFFINE 1 /* rows_fp8_affine_for: FP8 lean writes with chunk offsets stepped by constants */
#endif
#ifndef KVX_CUDA_ROWS_INVERT_DEPTH
#define KVX_CUDA_ROWS_INVERT_DEPTH 2 /* rows_invert_for: the least memory depth (0: every device) */
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

/* Whether a large call into or out of NHD/HND caches takes the lean kernel (move_rows,
 * move_kernels.cuh), which keeps more warps resident than move_fast: on a device of memory
 * depth 2 or more every such call; at depth 1 the calls with many lookups per byte, whose
 * latency the extra warps hide: gathers whose rows are found through a lookup per token
 * (RAGGED indices, KV_OFFSETS entries; docs/cuda-reference.md, "Ninth round") and calls of
 * short rows, 2^lg_tg rows per task with lg_tg at least KVX_CUDA_LEAN_MIN_LG_TG (one head of
 * 64 to 256 F16 values: "Thirteenth round"). */
inline bool lean_rows_for(int depth, bool lookup_gather, int lg_tg) {
  return depth > 1 || lookup_gather || lg_tg >= KVX_CUDA_LEAN_MIN_LG_TG;
}

/* Whether a large PACKED gather through the lean kernel takes two rows per task where one row
 * fills a task (lg_tg 0) with fewer than twice `task_chunks` 16-byte chunks (K and V): on a device
 * of memory depth 2 or more, from a cache whose token rows are one contiguous run of heads x
 * head_dim (NHD), so that a task reads one run of two rows and its lookups serve twice the bytes
 * (H200: gathers of 8 heads x 128 16-bit values +1.2 to +2 points; HND rows, whose heads lie a
 * block apart, and rows already two per task gained nothing or lost: docs/cuda-reference.md,
 * "Twentieth round"). */
inline bool lean_gather_pairs_for(int depth, bool packed_gather, bool token_rows, int lg_tg,
                                  unsigned long long row_chunks, unsigned long long task_chunks) {
  return KVX_CUDA_ROWS_PAIR_GATHER && depth >= 2 && packed_gather && token_rows && lg_tg == 0 &&
         row_chunks < 2 * task_chunks;
}

/* Whether an unscaled write (a copy, F16 <-> BF16; FP8 writes keep their order, unmeasured) through
 * the lean kernel over the IO rows issues each row's IO loads before its slot arrives (one memory
 * round trip before the stores instead of two; a row whose slot is invalid is read for nothing):
 * from KVX_CUDA_ROWS_WRITE_EARLY_DEPTH on (H200: 16-bit rows of 8 x 128 at
 * 65536 tokens +0.9 to +1.5 points, 8 x 64 +1.8, one head of 64 / 128 +2.2 / +3.5, F32 rows and
 * tasks of 8 KB or more unchanged: docs/cuda-reference.md, "Twentieth round"; at depth 1 unmeasured,
 * where the lean kernel writes only tasks of 4 or more short rows). */
inline bool rows_write_early_for(int depth) {
  return KVX_CUDA_ROWS_WRITE_EARLY_DEPTH > 0 && depth >= KVX_CUDA_ROWS_WRITE_EARLY_DEPTH;
}

/* Whether a large write through the lean kernel goes over the cache's slots instead of the IO
 * rows (move_invert.cu: the cache written in order, the IO rows read at random) on a device of
 * memory depth `depth`: from KVX_CUDA_ROWS_INVERT_DEPTH on (docs/cuda-reference.md, "Thirteenth
 * round"). */
inline bool rows_invert_for(int depth) { return depth >= KVX_CUDA_ROWS_INVERT_DEPTH; }

/* Whether an FP8 quantizing write through the lean kernel takes its affine form (move_rows<..., AFFINE>):
 * one row per task (lg_tg 0), heads of C 16-byte chunks with C dividing the warp's 32 lanes, and K and
 * V halves of H x C chunks, a multiple of 32, so that a lane keeps one chunk position within its heads
 * and its offsets step by constants; per-tensor scales (or none), read once. Instruction issue bounds
 * these writes on an H200 (docs/cuda-reference.md, "Twenty-sixth round"). */
inline bool rows_fp8_affine_for(int lg_tg, unsigned C, unsigned H, bool per_head) {
  return KVX_CUDA_ROWS_FP8_AFFINE && lg_tg == 0 && C >= 1u && C <= 32u && 32u % C == 0u && (H * C) % 32u == 0u &&
         H * C > 0u && !per_head;
}

/* Whether the FP4 lean write (write_lean_kernel, move_fp4_write.cu) runs in its deep form: each
 * next row of F16/BF16 prefetched into L2, and a grid of the resident CTAs whose warps split the
 * rows evenly (no partial last wave). At memory depth 2 or more the extra bytes in flight and the
 * even tail feed the part's bandwidth; at depth 1 both cost more than they give (docs/fp4.md,
 * "Eleventh round"). */
inline bool fp4_lean_deep_for(int depth) { return depth >= 2; }

/* Whether the lean kernel's 32-bit offsets reach every vector of a row of `heads` heads of
 * `dim` elements: head strides (elements) not negative and the end of the last head,
 * ((heads - 1) x head stride + dim) x element size, at most 2^31 bytes from the row's start,
 * on the cache and the IO side. */
inline bool row_offsets_fit32(unsigned long long heads, unsigned long long dim, long long c_head, int c_esize,
                              long long io_head, int io_esize) {
  const unsigned long long lim = 1ull << 31;
  if (heads == 0 || c_head < 0 || io_head < 0 || c_esize <= 0 || io_esize <= 0 || dim >= lim) return false;
  auto fits = [&](unsigned long long stride, unsigned long long es) {
    if (heads > 1 && stride > (lim - dim) / (heads - 1)) return false; /* (heads - 1) stride + dim > lim */
    return ((heads - 1) * stride + dim) * es <= lim;
  };
  return fits((unsigned long long)c_head, (unsigned long long)c_esize) && fits((unsigned long long)io_head, (unsigned long long)io_esize);
}

}  // namespace kvx_cuda

#endif /* KVX_REFERENCE_CUDA_TUNING_H */
