/*
 * move_fp4.cuh -- what the FP4 write (move_fp4_write.cu) and gather
 * (move_fp4_gather.cu) on CUDA share: the kernels' parameters, the per-block
 * device helpers, the fast kernels' knobs and helpers, and the host-side
 * checks and launches. Included by those two files only (everything is in an
 * anonymous namespace: each gets its own copy).
 *
 * The FP4 kernels: KVX 1.2 FP4 caches on CUDA (DEVICE and UNIFIED memory):
 * cuda_fp4_write (quantize, or raw copy of codes and scales) and
 * cuda_fp4_gather (dequantize into F16/BF16/F32, or raw copy).
 *
 * Numerics are fp4.h's, shared with the host backend, so results are bit
 * identical to the oracle (reference_impl/fp4.py). Two kernel families:
 *  - the fast kernels (below "Fast kernels"): IO F16/BF16/F32 rows contiguous
 *    and 16-byte aligned, code rows aligned to whole blocks, the reference
 *    build; a warp per 32 rows, a lane per 16 input values (write; 32, a
 *    whole OCP block, from F16/BF16) or per 16 output bytes (gather), the
 *    exact shortcuts of fp4_fast.h;
 *  - the per-block kernels (everything else: raw transfers, strided IO, the
 *    mutant builds): one thread per scale block (16 or 32 values) of one (row,
 *    K|V, head), every step through fp4.h.
 * Data-dependent errors on DEVICE memory skip the rows concerned
 * (R-DEVICE-STATUS); UNIFIED memory answers the host's statuses through the
 * host pre-scan, as the rest of the CUDA backend. Never synchronizes (except
 * the UNIFIED pre-scan), never allocates.
 */
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <string.h>

#include <mutex>

#include "convert.h"
#include "fp4.h"
#include "fp4_fast.h"
#include "kvx_plan.h"
#include "move.cuh" /* kvx_cuda::memory_depth */

namespace kvx_fp4 {
namespace {

using kvx_ref::CacheTensorPlan;
using kvx_ref::IoTensorPlan;

/* n / d for n < 2^31 by multiply and shift (d >= 1). */
struct Div {
  unsigned d, m, s;
};

Div make_div(unsigned d) {
  unsigned s = 0;
  while ((1ull << s) < d) ++s;
  const unsigned long long m = ((1ull << 32) * ((1ull << s) - d)) / d + 1;
  return Div{d, (unsigned)m, s};
}

__device__ __forceinline__ unsigned divu(const Div& D, unsigned n) { return (__umulhi(n, D.m) + n) >> D.s; }

struct Side {
  char* codes;                 /* cache data (nibble strides) */
  long long c_block, c_token, c_head;
  char* scales;                /* scale pool (byte strides) */
  long long s_block, s_token, s_head, s_dim;
  char* io;                    /* IO tensor (elements of io_dtype; nibbles when raw) */
  long long io_token, io_head, io_dim;
  char* ios;                   /* raw: IO scales */
  long long ios_token, ios_head, ios_dim;
  const float* g;              /* NVFP4 global: NULL (1.0), per tensor or per head */
  int g_per_head;
};

struct Params {
  Side side[2];
  int format, B, J, H;
  int io_dtype, io_esize;
  int raw, vec_ok;             /* vec_ok: IO rows contiguous and every block 16-byte aligned */
  int lin;                     /* fast kernels: heads packed in the IO row, the code row and the scale row */
  unsigned items;              /* items of this launch: rows * 2 * H * J, below 2^31 */
  unsigned long long rows;     /* fast kernels: rows (tokens) of this launch */
  unsigned long long row_begin;
  Div fd_hj, fd_j, fd_bs, fd_msl;
  int slot32;                  /* num_slots < 2^31: 32-bit slot arithmetic */
  /* write */
  const void* slots;
  int slot64;
  long long invalid_slot;
  unsigned long long num_slots;
  unsigned block_size;
  /* gather */
  int ragged, idx64, indptr64, len64;
  const void* indices;
  const void* indptr;
  const void* seq_lens;
  unsigned max_seq_len, max_blocks, num_blocks, indices_count;
};

__device__ __forceinline__ long long ld_index(const void* base, int is64, unsigned long long i) {
  return is64 ? ((const long long*)base)[i] : (long long)((const int*)base)[i];
}

/* A valid slot's (block, token in block): by multiply and shift when slots fit 31 bits. */
__device__ __forceinline__ void split_slot(const Params& P, long long slot, unsigned long long& b,
                                           unsigned long long& t) {
  if (P.slot32) {
    b = divu(P.fd_bs, (unsigned)slot);
    t = (unsigned long long)slot - b * P.block_size;
  } else {
    b = (unsigned long long)slot / P.block_size;
    t = (unsigned long long)slot % P.block_size;
  }
}

__device__ __forceinline__ float global_of(const Side& s, int h) {
  if (!s.g) return 1.0f;
  return s.g_per_head ? s.g[h] : s.g[0];
}

/* Kernels are instantiated per block size B (16, 32) and IO dtype DT (F16,
 * BF16, F32; 0 = raw F4_E2M1 transfer), so the per-block arrays stay in
 * registers. ES is the IO element size. */
template <int DT>
struct Es {
  static constexpr int value = DT == KVX_DTYPE_F32 ? 4 : 2;
};

/* FP32 value of element k of a block whose first element is at `p` (io_dim stride). */
template <int DT>
__device__ __forceinline__ float load_elem(const char* p, long long stride, int k) {
  const char* q = p + (long long)k * stride * Es<DT>::value;
  switch (DT) {
    case KVX_DTYPE_F16: {
      unsigned short h;
      memcpy(&h, q, 2);
      return __half2float(__ushort_as_half(h));
    }
    case KVX_DTYPE_BF16: {
      unsigned short b;
      memcpy(&b, q, 2);
      return __uint_as_float((unsigned)b << 16);
    }
    default: {
      float f;
      memcpy(&f, q, 4);
      return f;
    }
  }
}

/* Loads B values of a contiguous, 16-byte aligned block with vector loads. */
template <int B, int DT>
__device__ __forceinline__ void load_block_vec(const char* p, float* x) {
  const uint4* v = (const uint4*)p;
  constexpr int nvec = B * Es<DT>::value / 16;
#pragma unroll
  for (int i = 0; i < nvec; ++i) {
    const uint4 u = __ldg(v + i);
    const unsigned w[4] = {u.x, u.y, u.z, u.w};
    if (DT == KVX_DTYPE_F32) {
#pragma unroll
      for (int k = 0; k < 4; ++k) x[i * 4 + k] = __uint_as_float(w[k]);
    } else if (DT == KVX_DTYPE_F16) {
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        x[i * 8 + 2 * k] = __half2float(__ushort_as_half((unsigned short)(w[k] & 0xFFFFu)));
        x[i * 8 + 2 * k + 1] = __half2float(__ushort_as_half((unsigned short)(w[k] >> 16)));
      }
    } else {
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        x[i * 8 + 2 * k] = __uint_as_float(w[k] << 16);
        x[i * 8 + 2 * k + 1] = __uint_as_float(w[k] & 0xFFFF0000u);
      }
    }
  }
}

/* FP32 -> 16-bit output bits, bit-identical to convert.h (NaN through convert.h). */
template <int DT>
__device__ __forceinline__ unsigned short out16(float v) {
  if (v != v) return DT == KVX_DTYPE_F16 ? kvx_ref::f32_to_f16(v) : kvx_ref::f32_to_bf16(v);
  if (DT == KVX_DTYPE_F16) return __half_as_ushort(__float2half_rn(v));
  return __bfloat16_as_ushort(__float2bfloat16_rn(v));
}

template <int DT>
__device__ __forceinline__ void store_out(char* q, float v) {
  if (DT == KVX_DTYPE_F32) {
    memcpy(q, &v, 4);
    return;
  }
  const unsigned short b = out16<DT>(v);
  memcpy(q, &b, 2);
}

/* |v| in [2^-60, 2^60): see exact_div below. */
__device__ __forceinline__ bool div_range(float v) {
  return (__float_as_uint(v) & 0x7FFFFFFFu) - 0x21800000u < 0x3C000000u;
}

/* kvx_ref::f32_to_e2m1 (NaN excluded), fewer instructions: |q| < 1 by the
 * FP32 addition of 2^22 (RNE on the 0.5 grid: codes 0, 1, 2); |q| >= 1 by
 * rounding the FP32 bits to one mantissa bit (RNE in integers: + 0x1FFFFF + the
 * kept bit), whose (exponent, mantissa) field is then the code + 252, saturated
 * at 7. Equal to fp4.h's for every non-NaN FP32 input (checked exhaustively on
 * the host, all 2^32 bit patterns). The ties-away mutant keeps fp4.h's. */
__device__ __forceinline__ uint8_t e2m1_code(float q) {
  if (KVX_MUT(FP4_TIES_AWAY)) return kvx_ref::f32_to_e2m1(q);
  const uint32_t u = __float_as_uint(q), a = u & 0x7FFFFFFFu;
  uint32_t m;
  if (a < 0x3F800000u) {
    m = __float_as_uint(__fadd_rn(__uint_as_float(a), 4194304.0f)) - 0x4A800000u;
  } else {
    const uint32_t r = a + 0x1FFFFFu + ((a >> 22) & 1u);
    m = min((r >> 22) - 252u, 7u);
  }
  return (uint8_t)(((u >> 28) & 8u) | m);
}

/* kvx_ref::fp4_encode_block, bit for bit, with the NVFP4 division x / denom of
 * every value done as Markstein's correctly rounded reciprocal-multiply:
 * r = RN(1/denom) once per block, q0 = RN(x r), e = x - q0 denom (exact, fma),
 * q = RN(q0 + e r) == RN(x / denom) when |denom| and |x| are in [2^-60, 2^60)
 * (no underflow or overflow; x = +-0 gives x r). Other values take the IEEE
 * division. The same identity as the FP8 path (cuda/move.cuh exact_div_rcp,
 * checked against IEEE division on every FP32 significand against thousands of
 * divisor significands). Returns the scale byte. */
template <int B>
__device__ __forceinline__ uint8_t encode_block(int format, const float* x, float g, uint8_t* codes) {
  bool nan = false;
  const float amax = kvx_ref::fp4_amax(x, B, &nan);
  const kvx_ref::Fp4BlockScale sc = kvx_ref::fp4_block_scale(format, amax, nan, g);
  if (sc.dead) {
#pragma unroll
    for (int i = 0; i < B; ++i) codes[i] = 0;
  } else if (sc.inv != 0.0f) {
#pragma unroll
    for (int i = 0; i < B; ++i) codes[i] = e2m1_code(__fmul_rn(x[i], sc.inv));
  } else if (div_range(sc.denom)) {
    const float d = sc.denom, r = __frcp_rn(d);
    bool slow = false;
#pragma unroll
    for (int i = 0; i < B; ++i) {
      slow |= !(div_range(x[i]) || x[i] == 0.0f);
      const float q0 = __fmul_rn(x[i], r);
      const float q = __fmaf_rn(__fmaf_rn(-q0, d, x[i]), r, q0);
      codes[i] = e2m1_code(x[i] == 0.0f ? q0 : q);
    }
    if (slow) {
#pragma unroll
      for (int i = 0; i < B; ++i) codes[i] = kvx_ref::fp4_encode_value(sc, x[i]);
    }
  } else {
#pragma unroll
    for (int i = 0; i < B; ++i) codes[i] = kvx_ref::fp4_encode_value(sc, x[i]);
  }
  return sc.byte;
}

struct Item {
  unsigned long long row;
  int side, h, j;
};

__device__ __forceinline__ Item split(const Params& P, unsigned i) {
  Item it;
  const unsigned q = divu(P.fd_hj, i), hj = i - q * P.fd_hj.d;
  it.h = (int)divu(P.fd_j, hj);
  it.j = (int)(hj - (unsigned)it.h * P.fd_j.d);
  it.side = (int)(q & 1u);
  it.row = P.row_begin + (q >> 1);
  return it;
}

/* ------------------------------------------------------------------------ */
/* Fast kernels (IO F16/BF16/F32 with 16-byte aligned contiguous blocks, code
 * rows aligned to whole blocks; the reference build only: a mutant build keeps
 * the per-block kernels above, which take every step through fp4.h). One warp
 * takes 32 rows (tokens): lane i resolves the slot (write) or the table entry
 * (gather) of row i once, then the warp walks the 32 rows, K then V (write:
 * per batch of a row), as a stream of batches, broadcasting each row's block
 * and offset with a shuffle;
 * the next batch's loads are issued before the current batch is computed.
 *
 * Write: one lane per 16 values (a 16-value block, or half of a 32-value
 * block from F32: the lane pair exchanges its amax with one shuffle), or per
 * whole 32-value block from F16/BF16 (64 bytes), lanes on consecutive blocks
 * of the row, two 16-value blocks per lane per batch with 16-bit IO; the
 * format is a template argument; NVFP4 takes K and V of a batch in one
 * unrolled step, so each side's parameters are constant operands. Per block:
 * amax (max.NaN; F16/BF16 in packed F16 arithmetic, BF16 through the F16 max,
 * see amax16), the scale byte (fp4_fast.h's exact forms of the E4M3 steps,
 * the hardware conversion on sm_89+; NVFP4's amax / (6 g) by Markstein's
 * reciprocal-multiply, the divisor float(s) * g and its reciprocal from a
 * 128-entry shared table for a per-tensor g; MXFP4's amax / 6 likewise), the
 * codes through fp4_fast::e2m1_f16_scaled (five FP32-pipe instructions
 * instead of integer rounding; exhaustively equal to fp4.h), two
 * codes per packed F16 conversion, the signs copied from the input bits,
 * nibbles gathered with byte permutes. A block with a NaN or Inf, an
 * out-of-range amax, g or divisor (see encode16) takes encode_block / fp4.h.
 *
 * Gather: one lane per 16 bytes of output (8 F16/BF16 or 4 F32 values), so
 * each store instruction of a warp writes 512 contiguous bytes; the lane
 * loads its 4 (or 2) code bytes and its block's scale byte; the scale bytes
 * are decoded through a 256-entry shared table (fp4_scale_f32), the codes
 * through the 16-entry E2M1 table; the arithmetic is fp4_decode_with's (the MX
 * formats into F16/BF16: a code byte's two values from a 256-entry table times
 * 2^e by one packed product, the same bits where 2^e is a normal of the output
 * type: move_fp4_gather.cu). With
 * heads packed (P.lin) chunk c's offsets are c * VPC / 2 (codes), c / CPB
 * (scale) and c * 16 (output); a chunk of a NaN block goes out of line
 * (store_nan16), so the F16 and BF16 loops differ only in the conversion. */

constexpr bool kFp4Mutant = KVX_MUT(FP4_NIBBLE_SWAP) || KVX_MUT(FP4_TIES_AWAY) || KVX_MUT(FP4_UNROUNDED_SCALE) ||
                            KVX_MUT(FP4_ZERO_BLOCK_NAN) || KVX_MUT(FP4_SCALE_LOGICAL_BLOCK);

constexpr unsigned kNoBlock = 0xFFFFFFFFu;

/* Bulk copies into shared memory completed on an mbarrier (sm_90; the sm_80 build compiles
 * them out, and the planner takes their kernels on devices of compute capability 9 or more only). */
__device__ __forceinline__ unsigned smem_u32(const void* p) { return (unsigned)__cvta_generic_to_shared(p); }
__device__ __forceinline__ void mbar_init(unsigned long long* bar, unsigned count) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_u32(bar)), "r"(count) : "memory");
#else
  (void)bar;
  (void)count;
#endif
}
/* Makes the barriers' initialization visible to the async proxy (before the CTA's barrier). */
__device__ __forceinline__ void mbar_init_fence() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
#endif
}
/* One arrival that also expects `bytes` of transactions on `bar`. */
__device__ __forceinline__ void mbar_expect_tx(unsigned long long* bar, unsigned bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_u32(bar)), "r"(bytes) : "memory");
#else
  (void)bar;
  (void)bytes;
#endif
}
/* `bytes` (a multiple of 16) from global `src` to shared `dst` (both 16-byte aligned), counted on `bar`. */
__device__ __forceinline__ void bulk_load(void* dst, const void* src, unsigned bytes, unsigned long long* bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                   smem_u32(dst)),
               "l"(src), "r"(bytes), "r"(smem_u32(bar))
               : "memory");
#else
  (void)dst;
  (void)src;
  (void)bytes;
  (void)bar;
#endif
}
/* Waits for the phase of `bar` of parity `parity` to complete. */
__device__ __forceinline__ void mbar_wait(unsigned long long* bar, unsigned parity) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile(
      "{\n"
      ".reg .pred P1;\n"
      "WAIT_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 P1, [%0], %1;\n"
      "@!P1 bra WAIT_%=;\n"
      "}\n" ::"r"(smem_u32(bar)),
      "r"(parity)
      : "memory");
#else
  (void)bar;
  (void)parity;
#endif
}
/* Orders this thread's earlier shared-memory accesses before later async-proxy ones (a bulk copy
 * into a buffer just read). */
__device__ __forceinline__ void fence_proxy_async() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
#endif
}

/* Warms L2 with `bytes` from `p` (16-byte aligned, a multiple of 16): the bulk
 * prefetch of sm_90; older GPUs (the sm_80 build) skip it. */
__device__ __forceinline__ void prefetch_l2(const void* p, unsigned bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p), "r"(bytes) : "memory");
#else
  (void)p;
  (void)bytes;
#endif
}

/* Tuning knobs (H100, docs/fp4.md "CUDA figures"): none changes a result. */
#ifndef KVX_FP4_W32_ASYNC
#define KVX_FP4_W32_ASYNC 1 /* write, whole 32-value blocks from 16-bit IO: the IO rows staged in shared memory by
                               cp.async, KVX_FP4_W32_STAGES steps deep (0: a register double buffer, one step ahead) */
#endif
#ifndef KVX_FP4_W16_ASYNC
#define KVX_FP4_W16_ASYNC 0 /* 1: the same for 16-value blocks from 16-bit IO (two per lane per step): 57 % of \
                               copy against 86.5-88.4 without (with the carveout at its maximum too; cause not found) */
#endif
#ifndef KVX_FP4_W32_STAGES
#define KVX_FP4_W32_STAGES 3 /* ring steps per warp (2: OCP BF16 -1 to -2 points, 4: -2) */
#endif
#ifndef KVX_FP4_W16_STAGES
#define KVX_FP4_W16_STAGES KVX_FP4_W32_STAGES /* the same for 16-value blocks (KVX_FP4_W16_ASYNC) */
#endif

#ifndef KVX_FP4_W16_NI
#define KVX_FP4_W16_NI 1 /* write, 16-bit IO, 32-value blocks with KVX_FP4_W32_WHOLE=0: half-blocks per lane per
                            batch (2 spilled 92 bytes) */
#endif
#ifndef KVX_FP4_WRITE_MIN_BLOCKS
#define KVX_FP4_WRITE_MIN_BLOCKS 2 /* at most 128 registers: more CTAs spill */
#endif
#ifndef KVX_FP4_G16_NI
#define KVX_FP4_G16_NI 4 /* gather into F16/BF16: 16-byte chunks per lane per batch */
#endif
#ifndef KVX_FP4_G_MX_PAIRS
#define KVX_FP4_G_MX_PAIRS 1 /* fast gathers of MX formats into F16/BF16: a code byte's two values from a table, \
                                times the block's power of two by one packed product (0: the FP32 path) */
#endif
#ifndef KVX_FP4_G_MX_ALU
#define KVX_FP4_G_MX_ALU 0 /* ... the two values by byte permutes times 2^14 (BF16: 2^126), one more exact packed \
                              product, instead of the shared-memory table (fp4_fast.h e2m1_word_scaled) */
#endif
#ifndef KVX_FP4_G_NV_PAIRS
#define KVX_FP4_G_NV_PAIRS 1 /* fast NVFP4 gathers into F16/BF16: a code byte's two values as 2^k times the block's \
                                A or B by one packed product (fp4_fast.h nv_ab; 0: the FP32 path) */
#endif
#ifndef KVX_FP4_G_NV_ALU
#define KVX_FP4_G_NV_ALU 1 /* ... their two operands by byte permutes (fp4_fast.h nv_alu_word) instead of a \
                              shared-memory table of the 256 code bytes: 1 every word, 2 half of them, 0 none */
#endif
#ifndef KVX_FP4_G_DENSE
#define KVX_FP4_G_DENSE 1 /* fast gathers, heads packed and a multiple of 32 chunks a row: each batch's chunks at \
                             constant steps from one address (0: every chunk's address and bounds its own) */
#endif
#ifndef KVX_FP4_G_PH_SPLIT
#define KVX_FP4_G_PH_SPLIT 1 /* dense gathers: whether the global scale is per head tested once per batch (0: per \
                                chunk). With the two below, H200 NVFP4 gathers into F16/BF16 87.3-87.8 -> 89.8-91.1 %, \
                                MX ones and the H100 within a point (docs/fp4.md, "Nineteenth round") */
#endif
#ifndef KVX_FP4_G_WHOLE_SPLIT
#define KVX_FP4_G_WHOLE_SPLIT 1 /* dense gathers: a batch whose chunks all lie in the row without a test per chunk */
#endif
#ifndef KVX_FP4_G_STORE_CS
#define KVX_FP4_G_STORE_CS 1 /* fast gathers: output stores marked streaming (st.global.cs; into F32: H200 +0.3 \
                                to +1.1 point, H100 +0.1 to +0.9; into F16/BF16 within the runs' \
                                spread; docs/fp4.md, "Twenty-third round"; 0: plain stores) */
#endif
#ifndef KVX_FP4_G_NAN_LATE
#define KVX_FP4_G_NAN_LATE 1 /* fast gathers: a chunk's NaN scale tested after the packed-product paths, which no NaN \
                                scale takes (0: before them) */
#endif
#ifndef KVX_FP4_W_SADDR
#define KVX_FP4_W_SADDR 1 /* lean and staged writes: the thresholds' rows read at a 32-bit shared address (H200: \
                             the writes within their run-to-run spread) */
#endif
#ifndef KVX_FP4_G_SADDR
#define KVX_FP4_G_SADDR 1 /* fast gathers: the tables read at 32-bit shared addresses (0: through generic pointers) */
#endif
#ifndef KVX_FP4_G_SCALE_TAB
#define KVX_FP4_G_SCALE_TAB 1 /* fast gathers: the scale bytes' table copied from one made by the compiler (0: each \
                                 CTA decodes the 256 bytes) */
#endif
#ifndef KVX_FP4_G_THREADS
#define KVX_FP4_G_THREADS 128 /* fast gathers: threads per CTA */
#endif
#ifndef KVX_FP4_G_MIN_BLOCKS
#define KVX_FP4_G_MIN_BLOCKS 9 /* ... CTAs per SM the launch bounds ask for (0: none). 9 x 128 threads (56 registers, \
                                  36 warps), against 4 x 256 (56-58, 32 warps): H200 +1.9 to +3.0 points, H100 -0.5 \
                                  to +0.9; 5 x 256 (48 registers, spills): H200 +0.6 to +3, H100 -3 to -5 */
#endif
#if KVX_FP4_G_MIN_BLOCKS
#define KVX_FP4_G_BOUNDS __launch_bounds__(KVX_FP4_G_THREADS, KVX_FP4_G_MIN_BLOCKS)
#else
#define KVX_FP4_G_BOUNDS __launch_bounds__(KVX_FP4_G_THREADS)
#endif
#ifndef KVX_FP4_G32_NI
#define KVX_FP4_G32_NI 4 /* gather into F32: 16-byte chunks per lane per batch (8: 2-3 % slower; H200, dense \
                             kernels: 84-85 % NVFP4, 79-80 % MX against 89-90 %) */
#endif
#ifndef KVX_FP4_W_ROWS_B16
#define KVX_FP4_W_ROWS_B16 32 /* fast writes of 16-value blocks (NVFP4, MXFP4) from F16/BF16: rows per warp, a power
                                 of two up to 32 (H100, % of copy, NVFP4 F16: 32: 87.0-87.2, 8: 85.2, 4: 84.1-84.5,
                                 2: 80.7, 1: 71.1) */
#endif
#ifndef KVX_FP4_W_ROWS_B32
#define KVX_FP4_W_ROWS_B32 2 /* ... of 32-value blocks (OCP MXFP4) from F16/BF16, the shared-memory ring (F16 / BF16:
                                32: 89.6 / 88.8-89.0, 8: 87.8-88.0 / 87.4, 4: 90.0-90.3 / 89.7-90.2,
                                2: 96.0 / 94.7-95.0, 1: 86.7-87.0 / 83.6-83.7) */
#endif
#ifndef KVX_FP4_W_ROWS_F32
#define KVX_FP4_W_ROWS_F32 32 /* ... from F32 (NVFP4 / MXFP4 / OCP, 32: 90.5 / 96.2-96.4 / 95.8-95.9,
                                 2: 87.2 / 96.8-96.9 / 96.1-96.2) */
#endif
#ifndef KVX_FP4_G_ROWS_16
#define KVX_FP4_G_ROWS_16 1 /* fast gathers into F16/BF16: rows per warp, a power of two up to 32 (the dense kernels, \
                               NVFP4 / MX % of copy, H100: 2: 87.5-91.7 / 93.4-94.0, 1: 93.7-93.8 / 93.2-94.0; H200: \
                               4: 85.4-86.3 / 83.2-85.5, 2: 87.9-88.0 / 88.4-89.3, 1: 86.9-88.0 / 91.0-91.9) */
#endif
#ifndef KVX_FP4_G_ROWS_32
#define KVX_FP4_G_ROWS_32 1 /* ... into F32 (32: 86, 4: 89, 2: 91, 1: 93; H200, dense kernels: 2: 84-86, 1: 89-90) */
#endif
#ifndef KVX_FP4_G_SMEM_HEADS
#define KVX_FP4_G_SMEM_HEADS 256 /* fast gathers: NVFP4 global scales of up to this many heads held in shared memory */
#endif
#ifndef KVX_FP4_PREFETCH_W16
#define KVX_FP4_PREFETCH_W16 1 /* write, 16-bit IO: the next row into L2 (+3-6 %; with F32 IO, or the
                                  gathers' codes, it cost 10-30 %) */
#endif
#ifndef KVX_FP4_PREFETCH_MX16
#define KVX_FP4_PREFETCH_MX16 0 /* ... for the 16-value MXFP4 blocks too in the general kernel (H100: 89.1-89.7 %
                                   without, 87.0-87.6 with; the lean kernel prefetches for every format) */
#endif
#ifndef KVX_FP4_PREFETCH_AHEAD
#define KVX_FP4_PREFETCH_AHEAD 1 /* ... that many rows ahead (2: -19 to -22 points, 4: -29 to -32, 8: -30 to -33) */
#endif
#ifndef KVX_FP4_W16_NI_16
#define KVX_FP4_W16_NI_16 2 /* the same, 16-value blocks (1 at 3 CTAs per SM: 6-20 points slower on the H100) */
#endif
#ifndef KVX_FP4_WRITE_MIN_BLOCKS_16
#define KVX_FP4_WRITE_MIN_BLOCKS_16 KVX_FP4_WRITE_MIN_BLOCKS /* the same, 16-value blocks from 16-bit IO */
#endif
#ifndef KVX_FP4_WRITE_MIN_BLOCKS_32
#define KVX_FP4_WRITE_MIN_BLOCKS_32 KVX_FP4_WRITE_MIN_BLOCKS_16 /* the same, whole 32-value blocks (OCP; 3: 80 \
                                                                     registers, 144-308 bytes spilled) */
#endif
#ifndef KVX_FP4_W16_THREADS
#define KVX_FP4_W16_THREADS 256 /* write, 16-bit IO: threads per CTA (128 at 4 CTAs: OCP +0.3 to +0.5, MXFP4
                                    -0.5 to -1; at 5 and 6 CTAs (96, 80 registers, spilling): -9 to -41) */
#endif
#ifndef KVX_FP4_W32_WHOLE
#define KVX_FP4_W32_WHOLE 1 /* write, 16-bit IO, 32-value blocks: a whole block per lane (0: a lane pair,
                               the previous form) */
#endif
#ifndef KVX_FP4_SIDE_UNROLL
#define KVX_FP4_SIDE_UNROLL 1 /* write, NVFP4: K and V of a batch in one unrolled step (0: one side per step) */
#endif
/* Shared-memory loads at 32-bit shared addresses, taken once per kernel (KVX_FP4_G_SADDR, KVX_FP4_W_SADDR): through a
 * generic pointer the compiler rebuilt each table's address (the CTA's window) at every lookup. */
__device__ __forceinline__ unsigned saddr(const void* p) {
  unsigned a = (unsigned)__cvta_generic_to_shared(p);
  asm volatile("mov.b32 %0, %0;" : "+r"(a)); /* opaque: kept in a register, not rebuilt at each use */
  return a;
}
__device__ __forceinline__ float lds_f32(unsigned a) {
  float v;
  asm volatile("ld.shared.f32 %0, [%1];" : "=f"(v) : "r"(a));
  return v;
}
__device__ __forceinline__ uint32_t lds_u32(unsigned a) {
  uint32_t v;
  asm volatile("ld.shared.u32 %0, [%1];" : "=r"(v) : "r"(a));
  return v;
}
__device__ __forceinline__ uint2 lds_u2(unsigned a) {
  uint2 v;
  asm volatile("ld.shared.v2.u32 {%0, %1}, [%2];" : "=r"(v.x), "=r"(v.y) : "r"(a));
  return v;
}

__device__ __forceinline__ uint4 lds_u4(unsigned a) {
  uint4 v;
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(a));
  return v;
}

/* Per-lane asynchronous 16-byte copies into shared memory (sm_80+): `ok`
 * false zero-fills the destination and reads nothing. */
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, bool ok) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const unsigned s = (unsigned)__cvta_generic_to_shared(smem);
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(s), "l"(gmem), "r"(ok ? 16 : 0) : "memory");
#else
  *(uint4*)smem = ok ? __ldg((const uint4*)gmem) : make_uint4(0, 0, 0, 0);
#endif
}
__device__ __forceinline__ void cp_async_commit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;" ::: "memory");
#endif
}
template <int N>
__device__ __forceinline__ void cp_async_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
#endif
}
/* The staging buffer of the asynchronous write (dynamic shared memory). */
extern __shared__ uint4 fp4_stage[];

bool aligned(const void* p, unsigned long long n) { return ((uintptr_t)p % n) == 0; }

void fill_side(Side& S, const CacheTensorPlan& c, const CacheTensorPlan& sc, const IoTensorPlan& io,
               const IoTensorPlan& ios, const kvx_ref::ScalePlan& g) {
  S.codes = (char*)c.data;
  S.c_block = c.s_block;
  S.c_token = c.s_token;
  S.c_head = c.s_head;
  S.scales = (char*)sc.data;
  S.s_block = sc.s_block;
  S.s_token = sc.s_token;
  S.s_head = sc.s_head;
  S.s_dim = sc.s_dim_outer;
  S.io = (char*)io.data;
  S.io_token = io.s_token;
  S.io_head = io.s_head;
  S.io_dim = io.s_dim;
  S.ios = (char*)ios.data;
  S.ios_token = ios.s_token;
  S.ios_head = ios.s_head;
  S.ios_dim = ios.s_dim;
  S.g = g.kind == kvx_ref::SCALE_ONE ? nullptr : g.ptr;
  S.g_per_head = g.kind == kvx_ref::SCALE_PER_HEAD;
}

/* IO rows contiguous along head_dim with every block start 16-byte aligned. */
bool vec_ok(const Params& P) {
  if (P.raw) return false;
  const unsigned long long blk = (unsigned long long)P.B * P.io_esize;
  for (int i = 0; i < 2; ++i) {
    const Side& S = P.side[i];
    if (S.io_dim != 1 || !aligned(S.io, 16)) return false;
    if ((S.io_token * P.io_esize) % 16 || (S.io_head * P.io_esize) % 16 || blk % 16) return false;
  }
  return true;
}

typedef void (*Kernel)(Params);

/* The fast kernels take IO F16/BF16/F32 with vec_ok, code rows whose blocks
 * start on B/2-byte boundaries of a 16-byte aligned pool, in the reference
 * build (a mutant build keeps the per-block kernels). */
bool fast_ok(const Params& P) {
  if (kFp4Mutant || P.raw || !P.vec_ok) return false;
  if (P.io_dtype != KVX_DTYPE_F16 && P.io_dtype != KVX_DTYPE_BF16 && P.io_dtype != KVX_DTYPE_F32) return false;
  for (int i = 0; i < 2; ++i) {
    const Side& S = P.side[i];
    if (!aligned(S.codes, 16) || S.c_block % P.B || S.c_token % P.B || S.c_head % P.B) return false;
  }
  return true;
}

/* Heads packed one after the other in the IO row, the code row and the scale row. */
bool lin_ok(const Params& P) {
  const long long D = (long long)P.J * P.B;
  for (int i = 0; i < 2; ++i) {
    const Side& S = P.side[i];
    if (S.io_head != D || S.c_head != D || S.s_dim != 1 || S.s_head != P.J) return false;
  }
  return true;
}

/* Lets `kernel` take `bytes` of dynamic shared memory on the current device, whatever its static shared memory
 * (once per kernel and device). */
bool allow_smem(Kernel kernel, int bytes) {
  static std::mutex mu;
  static struct {
    Kernel k;
    int dev, bytes;
  } seen[16];
  static int n = 0;
  int dev = 0;
  cudaGetDevice(&dev);
  std::lock_guard<std::mutex> lock(mu);
  for (int i = 0; i < n; ++i)
    if (seen[i].k == kernel && seen[i].dev == dev && seen[i].bytes >= bytes) return true;
  if (cudaFuncSetAttribute((const void*)kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes) != cudaSuccess)
    return false;
  if (n < 16) seen[n++] = {kernel, dev, bytes};
  return true;
}

/* Fast kernels: rows_per_cta rows per CTA (default: one per thread, 32 per warp), chunks of 2^30 rows. */
#ifndef KVX_FP4_FAST_MIN_ROWS
#define KVX_FP4_FAST_MIN_ROWS 256 /* FP4 writes of at most this many rows: the per-block kernel (launch) */
#endif
kvx_status_t launch_fast(Kernel kernel, Params P, unsigned long long rows, cudaStream_t stream, unsigned threads = 256,
                         int smem = 0, unsigned rows_per_cta = 0) {
  if (!rows_per_cta) rows_per_cta = threads;
  if (smem && !allow_smem(kernel, smem)) return KVX_STATUS_INTERNAL_ERROR;
  P.fd_j = make_div((unsigned)P.J);
  P.fd_bs = make_div(P.block_size);
  P.lin = lin_ok(P);
  const unsigned long long max_rows = 1ull << 30;
  for (unsigned long long r0 = 0; r0 < rows; r0 += max_rows) {
    P.row_begin = r0;
    P.rows = rows - r0 < max_rows ? rows - r0 : max_rows;
    if (kvx_cuda::launch_kernel(kernel, (unsigned)((P.rows + rows_per_cta - 1) / rows_per_cta), threads, (size_t)smem,
                                stream, P) != cudaSuccess)
      return KVX_STATUS_INTERNAL_ERROR;
  }
  return KVX_STATUS_OK;
}

/* Whether the current device runs the staged kernels' bulk copies (compute capability 9 or more). */
bool bulk_capable() {
  int dev = 0, major = 0;
  cudaGetDevice(&dev);
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
  return major >= 9;
}

/* Launches a kernel whose warps split `rows` rows evenly (the staged kernels) over a grid of the resident CTAs
 * of `threads` threads and `smem` bytes of dynamic shared memory, in chunks of 2^30 rows. */
kvx_status_t launch_persistent(Kernel kernel, Params P, unsigned long long rows, unsigned threads, int smem,
                               cudaStream_t stream) {
  if (!allow_smem(kernel, smem)) return KVX_STATUS_INTERNAL_ERROR;
  int dev = 0, sms = 0, per_sm = 0;
  cudaGetDevice(&dev);
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, (int)threads, smem) != cudaSuccess || per_sm < 1)
    return KVX_STATUS_INTERNAL_ERROR;
  P.fd_j = make_div((unsigned)P.J);
  P.fd_bs = make_div(P.block_size);
  P.lin = lin_ok(P);
  const unsigned long long max_rows = 1ull << 30, warps = threads / 32;
  for (unsigned long long r0 = 0; r0 < rows; r0 += max_rows) {
    P.row_begin = r0;
    P.rows = rows - r0 < max_rows ? rows - r0 : max_rows;
    const unsigned long long want = (P.rows + warps - 1) / warps, cap = (unsigned long long)(sms > 0 ? sms : 1) * per_sm;
    if (kvx_cuda::launch_kernel(kernel, (unsigned)(want < cap ? want : cap), threads, (size_t)smem, stream, P) !=
        cudaSuccess)
      return KVX_STATUS_INTERNAL_ERROR;
  }
  return KVX_STATUS_OK;
}

kvx_status_t launch_chunk(Kernel kernel, const Params& P, cudaStream_t stream) {
  if (P.items == 0) return KVX_STATUS_OK;
  /* One item per thread: many short-lived warps keep the most loads in flight
   * (the kernels still loop, grid-stride, should the grid ever be capped). */
  const unsigned grid = (unsigned)((P.items + 255) / 256);
  const cudaError_t e = kvx_cuda::launch_kernel(kernel, grid, 256, 0, stream, P);
  return e == cudaSuccess ? KVX_STATUS_OK : KVX_STATUS_INTERNAL_ERROR;
}

/* Launches over `rows` rows in chunks whose item count stays below 2^31. */
kvx_status_t launch(Kernel kernel, Params P, unsigned long long rows, cudaStream_t stream) {
  const unsigned long long per_row = 2ull * P.H * P.J;
  const unsigned long long max_rows = 0x7F000000ull / per_row;
  if (max_rows == 0) return KVX_STATUS_UNSUPPORTED;
  P.fd_hj = make_div((unsigned)(P.H * P.J));
  P.fd_j = make_div((unsigned)P.J);
  P.fd_bs = make_div(P.block_size);
  for (unsigned long long r0 = 0; r0 < rows; r0 += max_rows) {
    const unsigned long long n = rows - r0 < max_rows ? rows - r0 : max_rows;
    P.row_begin = r0;
    P.items = (unsigned)(n * per_row);
    const kvx_status_t st = launch_chunk(kernel, P, stream);
    if (st != KVX_STATUS_OK) return st;
  }
  return KVX_STATUS_OK;
}

kvx_status_t unified_wait(cudaStream_t stream) {
  int dev = 0, concurrent = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) return KVX_STATUS_INTERNAL_ERROR;
  cudaDeviceGetAttribute(&concurrent, cudaDevAttrConcurrentManagedAccess, dev);
  const cudaError_t e = concurrent ? cudaStreamSynchronize(stream) : cudaDeviceSynchronize();
  return e == cudaSuccess ? KVX_STATUS_OK : KVX_STATUS_INTERNAL_ERROR;
}

Params base(const kvx_ref::Fp4Plan& f, uint32_t H, uint32_t D, kvx_dtype_t io_dtype) {
  Params P;
  memset(&P, 0, sizeof P);
  P.format = f.format;
  P.B = (int)f.block_values;
  P.J = (int)(D / f.block_values);
  P.H = (int)H;
  P.raw = f.raw;
  P.io_dtype = io_dtype;
  P.io_esize = (int)kvx_ref::dtype_size(io_dtype);
  return P;
}

}  // namespace
}  // namespace kvx_fp4
