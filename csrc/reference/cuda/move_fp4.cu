/*
 * move_fp4.cu -- KVX 1.2 FP4 caches on CUDA (DEVICE and UNIFIED memory):
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
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <string.h>

#include <mutex>

#include "convert.h"
#include "fp4.h"
#include "fp4_fast.h"
#include "kvx_plan.h"

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

#ifndef KVX_FP4_WRITE32_MIN_BLOCKS
#define KVX_FP4_WRITE32_MIN_BLOCKS 3 /* 32-value blocks: at most 80 registers (BF16 IO: 2, it would spill) */
#endif
template <int B, int DT>
__global__ void __launch_bounds__(256, B == 16 ? 4 : DT == KVX_DTYPE_BF16 ? 2 : KVX_FP4_WRITE32_MIN_BLOCKS)
    write_kernel(Params P) {
  constexpr int ES = Es<DT>::value;
  for (unsigned i = blockIdx.x * blockDim.x + threadIdx.x; i < P.items; i += gridDim.x * blockDim.x) {
    const Item it = split(P, i);
    const long long slot = ld_index(P.slots, P.slot64, it.row);
    const Side& S = P.side[it.side];
    /* The block is loaded and encoded while the slot load is in flight (the IO
     * row exists whatever its slot); only the stores wait for the slot. */
    uint8_t codes[B], sbyte = 0;
    if (DT != 0) {
      float x[B];
      const char* src = S.io + (it.row * S.io_token + it.h * S.io_head + (long long)it.j * B * S.io_dim) * ES;
      if (P.vec_ok) {
        load_block_vec<B, DT>(src, x);
      } else {
#pragma unroll
        for (int k = 0; k < B; ++k) x[k] = load_elem<DT>(src, S.io_dim, k);
      }
      sbyte = encode_block<B>(P.format, x, global_of(S, it.h), codes);
    }
    if (slot < 0 || slot == P.invalid_slot || (unsigned long long)slot >= P.num_slots) continue;
    unsigned long long b, t;
    split_slot(P, slot, b, t);
    const long long c0 = b * S.c_block + t * S.c_token + it.h * S.c_head + (long long)it.j * B; /* nibbles */
    char* sc = S.scales + b * S.s_block + t * S.s_token + it.h * S.s_head + it.j * S.s_dim;
    if (DT == 0) { /* raw */
      const long long i0 = it.row * S.io_token + it.h * S.io_head + (long long)it.j * B; /* nibbles */
      for (int k = 0; k < B; k += 2) S.codes[(c0 + k) / 2] = S.io[(i0 + k) / 2];
      *sc = S.ios[it.row * S.ios_token + it.h * S.ios_head + it.j * S.ios_dim];
      continue;
    }
    *sc = (char)sbyte;
    char* dst = S.codes + c0 / 2;
    if (((uintptr_t)dst % 8) == 0) { /* B/2 = 8 or 16 bytes */
#pragma unroll
      for (int w = 0; w < B / 16; ++w) {
        unsigned lo = 0, hi = 0;
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          lo |= (unsigned)kvx_ref::fp4_pack(codes[w * 16 + 2 * k], codes[w * 16 + 2 * k + 1]) << (8 * k);
          hi |= (unsigned)kvx_ref::fp4_pack(codes[w * 16 + 8 + 2 * k], codes[w * 16 + 8 + 2 * k + 1]) << (8 * k);
        }
        ((uint2*)dst)[w] = make_uint2(lo, hi);
      }
    } else {
#pragma unroll
      for (int k = 0; k < B; k += 2) dst[k / 2] = (char)kvx_ref::fp4_pack(codes[k], codes[k + 1]);
    }
  }
}

template <int B, int DT>
__global__ void __launch_bounds__(256, B == 16 ? 4 : 2) gather_kernel(Params P) {
  constexpr int ES = Es<DT>::value;
  /* E2M1 code -> FP32 value (kvx_ref::e2m1_to_f32), one shared-memory load per
   * value: 16 words in 16 banks, so lanes never conflict. */
  __shared__ float e2m1[16];
  if (threadIdx.x < 16) e2m1[threadIdx.x] = kvx_ref::e2m1_to_f32(threadIdx.x);
  __syncthreads();
  for (unsigned i = blockIdx.x * blockDim.x + threadIdx.x; i < P.items; i += gridDim.x * blockDim.x) {
    const Item it = split(P, i);
    const unsigned long long s =
        it.row < 0x80000000ull ? divu(P.fd_msl, (unsigned)it.row) : it.row / P.max_seq_len;
    const unsigned long long t = it.row - s * P.max_seq_len;
    long long L = ld_index(P.seq_lens, P.len64, s);
    if (L < 0) continue;
    if ((unsigned long long)L > P.max_seq_len) L = P.max_seq_len;
    if (t >= (unsigned long long)L) continue;
    const unsigned long long jb = t < 0x80000000ull ? divu(P.fd_bs, (unsigned)t) : t / P.block_size;
    long long b;
    if (P.ragged) {
      const long long lo = ld_index(P.indptr, P.indptr64, s), hi = ld_index(P.indptr, P.indptr64, s + 1);
      if (lo < 0 || hi < lo || (long long)t >= hi - lo || (unsigned long long)(lo + t) >= P.indices_count) continue;
      b = ld_index(P.indices, P.idx64, lo + t);
    } else {
      if (jb >= P.max_blocks) continue;
      b = ld_index(P.indices, P.idx64, s * P.max_blocks + jb);
    }
    if (b < 0 || (unsigned long long)b >= P.num_blocks) continue;
    const unsigned long long sb = KVX_MUT(FP4_SCALE_LOGICAL_BLOCK) ? jb : (unsigned long long)b;
    const Side& S = P.side[it.side];
    const unsigned long long off = t - jb * P.block_size; /* t % block_size */
    const long long c0 = b * S.c_block + off * S.c_token + it.h * S.c_head + (long long)it.j * B;
    const uint8_t sbyte = (uint8_t)S.scales[sb * S.s_block + off * S.s_token + it.h * S.s_head + it.j * S.s_dim];
    const char* src = S.codes + c0 / 2;
    if (DT == 0) { /* raw */
      const long long i0 = it.row * S.io_token + it.h * S.io_head + (long long)it.j * B;
      for (int k = 0; k < B; k += 2) S.io[(i0 + k) / 2] = src[k / 2];
      S.ios[it.row * S.ios_token + it.h * S.ios_head + it.j * S.ios_dim] = (char)sbyte;
      continue;
    }
    uint8_t bytes[B / 2];
    if (((uintptr_t)src % 8) == 0) {
#pragma unroll
      for (int w = 0; w < B / 16; ++w) {
        const uint2 u = __ldg((const uint2*)src + w);
        memcpy(bytes + 8 * w, &u, 8);
      }
    } else {
#pragma unroll
      for (int k = 0; k < B / 2; ++k) bytes[k] = (uint8_t)src[k];
    }
    const float g = global_of(S, it.h);
    const float sf = kvx_ref::fp4_scale_f32(P.format, sbyte); /* once per block */
    const bool nan_block = sf != sf;
    float v[B];
    /* kvx_ref::fp4_decode_with, the same operations: a NaN scale is every value
     * (its bits), else (E2M1 * sf) * g for NVFP4, E2M1 * sf for MXFP4. */
    if (nan_block) {
#pragma unroll
      for (int k = 0; k < B; ++k) v[k] = sf;
    } else if (P.format == kvx_ref::FP4_NVFP4) {
#pragma unroll
      for (int k = 0; k < B / 2; ++k) {
        v[2 * k] = __fmul_rn(__fmul_rn(e2m1[kvx_ref::fp4_even(bytes[k])], sf), g);
        v[2 * k + 1] = __fmul_rn(__fmul_rn(e2m1[kvx_ref::fp4_odd(bytes[k])], sf), g);
      }
    } else {
#pragma unroll
      for (int k = 0; k < B / 2; ++k) {
        v[2 * k] = __fmul_rn(e2m1[kvx_ref::fp4_even(bytes[k])], sf);
        v[2 * k + 1] = __fmul_rn(e2m1[kvx_ref::fp4_odd(bytes[k])], sf);
      }
    }
    char* dst = S.io + (it.row * S.io_token + it.h * S.io_head + (long long)it.j * B * S.io_dim) * ES;
    if (P.vec_ok) {
      constexpr int nvec = B * ES / 16;
#pragma unroll
      for (int w = 0; w < nvec; ++w) {
        unsigned o[4];
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          if (ES == 4) {
            o[k] = __float_as_uint(v[w * 4 + k]);
          } else if (nan_block) { /* NaN bits as convert.h (numpy / ml_dtypes) */
            o[k] = (unsigned)out16<DT>(v[w * 8 + 2 * k]) | ((unsigned)out16<DT>(v[w * 8 + 2 * k + 1]) << 16);
          } else if (DT == KVX_DTYPE_F16) { /* two RN conversions in one instruction */
            const __half2 h = __floats2half2_rn(v[w * 8 + 2 * k], v[w * 8 + 2 * k + 1]);
            memcpy(&o[k], &h, 4);
          } else {
            const __nv_bfloat162 h = __floats2bfloat162_rn(v[w * 8 + 2 * k], v[w * 8 + 2 * k + 1]);
            memcpy(&o[k], &h, 4);
          }
        }
        ((uint4*)dst)[w] = make_uint4(o[0], o[1], o[2], o[3]);
      }
    } else {
#pragma unroll
      for (int k = 0; k < B; ++k) store_out<DT>(dst + (long long)k * S.io_dim * ES, v[k]);
    }
  }
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
 * through the 16-entry E2M1 table; the arithmetic is fp4_decode_with's. With
 * heads packed (P.lin) chunk c's offsets are c * VPC / 2 (codes), c / CPB
 * (scale) and c * 16 (output); a chunk of a NaN block goes out of line
 * (store_nan16), so the F16 and BF16 loops differ only in the conversion. */

constexpr bool kFp4Mutant = KVX_MUT(FP4_NIBBLE_SWAP) || KVX_MUT(FP4_TIES_AWAY) || KVX_MUT(FP4_UNROUNDED_SCALE) ||
                            KVX_MUT(FP4_ZERO_BLOCK_NAN) || KVX_MUT(FP4_SCALE_LOGICAL_BLOCK);

/* max(m, |x|), NaN if either is NaN. */
__device__ __forceinline__ float max_abs_nan(float m, float x) {
  float r;
  asm("max.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(m), "f"(fabsf(x)));
  return r;
}

/* FP32 values of the NW words of a block of IO dtype DT. */
template <int DT, int NW>
__device__ __forceinline__ void unpack(const uint32_t* w, float* x) {
#pragma unroll
  for (int k = 0; k < NW; ++k) {
    if (DT == KVX_DTYPE_F32) {
      x[k] = __uint_as_float(w[k]);
    } else if (DT == KVX_DTYPE_F16) {
      __half2 h;
      memcpy(&h, &w[k], 4);
      const float2 f = __half22float2(h);
      x[2 * k] = f.x;
      x[2 * k + 1] = f.y;
    } else {
      x[2 * k] = __uint_as_float(w[k] << 16);
      x[2 * k + 1] = __uint_as_float(w[k] & 0xFFFF0000u);
    }
  }
}

/* Encodes one block given as its raw IO words `w`: returns the scale byte and
 * writes the B/8 words of packed codes. Bit-identical to encode_block (fp4.h):
 *  - NVFP4 fast when g is in [2^-60, 2^60) and amax < 2^60 (neither NaN nor
 *    inf): wanted = amax / (6 g) (IEEE), s = E4M3(min(wanted, 448)) (s = 0: a
 *    dead block, codes 0), d = float(s) * g; codes by Markstein's division
 *    when d is in [2^-40, 2^60) (|x| / d for |x| < 2^-60 is below 2^-20 then:
 *    magnitude 0 either way), else encode_block;
 *  - MXFP4: amax a normal FP32 (and amax / 6 normal for the ceil rule): the
 *    exponent from the bits, codes of |x| * 2^-e; amax == 0: byte 0, codes 0;
 *  - the code's sign is the input's (d, 2^-e > 0: RN(x / d) has x's sign). */
/* encode_block (fp4.h's steps), packed: the rare blocks the fast path leaves
 * (NaN, Inf, extreme amax, g or divisor), out of line and reloading the block
 * from `src`, to keep the fast path's registers. */
template <int B>
struct Packed {
  uint32_t w[B / 8];
  uint32_t sbyte;
};

template <int B, int DT>
__device__ __noinline__ Packed<B> encode_slow(int format, const uint4* src, float g) {
  constexpr int NV = B * Es<DT>::value / 16;
  uint32_t w[NV * 4];
#pragma unroll
  for (int v = 0; v < NV; ++v) {
    const uint4 u = __ldg(src + v);
    w[4 * v] = u.x;
    w[4 * v + 1] = u.y;
    w[4 * v + 2] = u.z;
    w[4 * v + 3] = u.w;
  }
  float x[B];
  unpack<DT, NV * 4>(w, x);
  uint8_t codes[B];
  Packed<B> r;
  r.sbyte = encode_block<B>(format, x, g, codes);
#pragma unroll
  for (int o = 0; o < B / 8; ++o) {
    uint32_t v = 0;
#pragma unroll
    for (int k = 0; k < 4; ++k) v |= (uint32_t)kvx_ref::fp4_pack(codes[8 * o + 2 * k], codes[8 * o + 2 * k + 1]) << (8 * k);
    r.w[o] = v;
  }
  return r;
}

/* RN(x / s) by Markstein's reciprocal-multiply, r = RN(1 / s): exact for |x|
 * and |s| in [2^-60, 2^60) (csrc/tests/fp_identities_check.cpp), x = +0 too. */
__device__ __forceinline__ float div_rcp(float x, float s, float r) {
  const float q0 = __fmul_rn(x, r);
  return __fmaf_rn(__fmaf_rn(-q0, s, x), r, q0);
}

/* |v| in [2^-60, 2^60) for v >= 0 (bits). */
__device__ __forceinline__ bool pos_range(uint32_t b) { return b - 0x21800000u < 0x3C000000u; }

/* d in [2^-40, 2^46): the codes of x / d by Markstein's division of x by
 * d * 2^14 (in [2^-26, 2^60)), which is RN(x / d) * 2^-14, the input of
 * e2m1_f16_scaled (|x| < 2^-60 gives a quotient below 2^-20: magnitude 0). */
__device__ __forceinline__ bool d_fast(float d) { return __float_as_uint(d) - 0x2B800000u < 0x2B000000u; }

/* max |x| of the 16 NG values of 8 NG words of F16 or BF16 in packed
 * arithmetic (NaN-propagating max of the magnitudes), as FP32 (exact): equal
 * to the FP32 max.NaN of |x| except that a NaN is the canonical one, which the
 * callers only test for being NaN. */
#ifndef KVX_FP4_BF16_AMAX_F16
#define KVX_FP4_BF16_AMAX_F16 1 /* BF16 amax through the F16 max (0: the BF16 max of the ANDed words) */
#endif
template <typename H2>
__device__ __forceinline__ H2 hmax8_nan(H2* m) {
  m[0] = __hmax2_nan(__hmax2_nan(m[0], m[1]), m[2]);
  m[3] = __hmax2_nan(__hmax2_nan(m[3], m[4]), m[5]);
  m[6] = __hmax2_nan(__hmax2_nan(m[6], m[7]), m[0]);
  return __hmax2_nan(m[3], m[6]);
}

/* The packed F16 max of the magnitudes of 8 NG words of two 16-bit values each
 * (NaN propagates; the |.| is a free operand modifier of the max). */
template <int NG>
__device__ __forceinline__ __half2 habs_max(const uint32_t* w) {
  constexpr int N = 8 * NG;
    __half2 m[N];
#pragma unroll
    for (int k = 0; k < N; ++k) {
      __half2 h;
      memcpy(&h, &w[k], 4);
      m[k] = __habs2(h);
    }
    __half2 r = hmax8_nan(m);
    if (NG == 2) r = __hmax2_nan(r, hmax8_nan(m + 8 % N));
  return r;
}

template <int DT, int NG>
__device__ __forceinline__ float amax16(const uint32_t* w) {
  if (DT == KVX_DTYPE_F16) {
    __half2 r = habs_max<NG>(w);
    return __low2float(__hmax2_nan(r, __lowhigh2highlow(r)));
  } else {
#if KVX_FP4_BF16_AMAX_F16
    /* BF16 through the F16 max, whose |.| operand modifier is free (a BF16 |x| is
     * one more instruction per word): non-negative values of either format are
     * ordered as their bits, so below 0x7C00 (BF16 2^121) the F16 max of the BF16
     * magnitudes' bits is their max, exactly; from there on (huge, inf or NaN) the
     * result is 0x7C00 (= BF16 2^121, exact) or the F16 NaN 0x7FFF, a BF16 NaN,
     * which sends the block to encode_slow (fp4.h, from the input). */
    __half2 r = habs_max<NG>(w);
#else
    constexpr int N = 8 * NG;
    __nv_bfloat162 m[N];
#pragma unroll
    for (int k = 0; k < N; ++k) {
      const uint32_t u = w[k] & 0x7FFF7FFFu; /* an integer AND (__habs2 would be an FMA-pipe HFMA2) */
      memcpy(&m[k], &u, 4);
    }
    __nv_bfloat162 r = hmax8_nan(m);
    if (NG == 2) r = __hmax2_nan(r, hmax8_nan(m + 8 % N));
#endif
    r = __hmax2_nan(r, __lowhigh2highlow(r));
    uint32_t u;
    memcpy(&u, &r, 4);
    return __uint_as_float(u << 16);
  }
}

/* The two words of packed codes of 16 values from their 8 words of F16 code
 * bits (code << 9 in each half, the sign in bit 15). */
__device__ __forceinline__ void pack_codes(const uint32_t* hw, uint32_t* out) {
#pragma unroll
  for (int o = 0; o < 2; ++o) {
    const uint32_t p01 = __byte_perm(hw[4 * o], hw[4 * o + 1], 0x7531);
    const uint32_t p23 = __byte_perm(hw[4 * o + 2], hw[4 * o + 3], 0x7531);
    const uint32_t x01 = ((p01 >> 1) | (p01 >> 4)) & 0x0F0F0F0Fu;
    const uint32_t x23 = ((p23 >> 1) | (p23 >> 4)) & 0x0F0F0F0Fu;
    out[o] = __byte_perm(x01 | (x01 >> 4), x23 | (x23 >> 4), 0x6420);
  }
}

/* fp4_fast.h's e2m1_h on two F16 values at once. */
struct H2Ops {
  typedef __half2 T;
  static __device__ __forceinline__ T c(float v) { return __float2half2_rn(v); }
  static __device__ __forceinline__ T min(T a, T b) { return __hmin2(a, b); }
  static __device__ __forceinline__ T max(T a, T b) { return __hmax2(a, b); }
  static __device__ __forceinline__ T expo(T a) {
    uint32_t u;
    memcpy(&u, &a, 4);
    u &= 0x7C007C00u;
    memcpy(&a, &u, 4);
    return a;
  }
  static __device__ __forceinline__ T fma(T a, T b, T c) { return __hfma2(a, b, c); }
  static __device__ __forceinline__ T neg(T a) { return __hneg2(a); }
  static __device__ __forceinline__ T mul(T a, T b) { return __hmul2(a, b); }
};

#ifndef KVX_FP4_MX_H2
#define KVX_FP4_MX_H2 1 /* MXFP4 codes in packed F16 arithmetic: 1 for OCP blocks from F16 (+0.6 points on the
                           H100); 2 for every MXFP4 write from F16/BF16 (16-value blocks -2.4 to -3.7 points, OCP
                           from BF16 +-0.1); 0 never (FP32, one value at a time) */
#endif

/* Per-side constants of the fast write. */
struct WSide {
  float g, sixg, r6; /* NVFP4 per-tensor g (1.0 without), 6 g, RN(1 / (6 g)) (0: divide) */
  int g_ok;          /* g in [2^-60, 2^60): else every NVFP4 block takes encode_slow */
};

/* Encodes 16 NG values of a block of B (16, or 32: over a lane pair, PAIR,
 * or NG = 2 in one lane) given as their raw IO words `w`; returns the scale
 * byte and writes the 2 NG words of packed codes, or sets `slow` (then the
 * caller takes encode_slow). Bit-identical to encode_block (fp4.h):
 *  - NVFP4 fast when g is in [2^-60, 2^60) and amax < 2^60 (neither NaN nor
 *    inf): wanted = RN(amax / (6 g)) (Markstein with RN(1 / (6 g)) when amax
 *    and 6 g allow it, else IEEE), s = E4M3(min(wanted, 448)) (s = 0: a dead
 *    block, codes 0), d = float(s) * g (from the shared table `tab` for a
 *    per-tensor g, with d * 2^14 and its reciprocal); codes by Markstein's
 *    division of |x| by d * 2^14 when d is in [2^-40, 2^46) (see d_fast), else
 *    encode_block;
 *  - MXFP4: amax a normal FP32 (and amax / 6 normal for the ceil rule, by
 *    Markstein with RN(1/6) when amax >= 2^-60): the exponent from the bits,
 *    codes of |x| * 2^(-e-14); amax == 0: byte 0, codes 0;
 *  - the code's sign is the input's (d, 2^-e > 0: RN(x / d) has x's sign). */
template <int DT, bool PAIR, int format, int NG>
__device__ __forceinline__ uint32_t encode16(const uint32_t* w, const WSide& ws, float g_head, bool use_tab,
                                             const float2* tab, bool& slow, uint32_t* out) {
  constexpr int WG = 16 * Es<DT>::value / 4; /* words per 16 values */
  float amax;
  if (DT == KVX_DTYPE_F32) {
    float m[8 * NG];
#pragma unroll
    for (int i = 0; i < 8 * NG; ++i) m[i] = max_abs_nan(fabsf(__uint_as_float(w[2 * i])), __uint_as_float(w[2 * i + 1]));
#pragma unroll
    for (int lv = 1; lv <= 2 + NG; ++lv) { /* 8 NG = 2^(2 + NG) */
#pragma unroll
      for (int i = 0; i < ((8 * NG) >> lv); ++i) {
        float r;
        asm("max.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(m[i]), "f"(m[i + ((8 * NG) >> lv)]));
        m[i] = r;
      }
    }
    amax = m[0];
  } else {
    amax = amax16<DT, NG>(w);
  }
  if (PAIR) {
    const float o = __shfl_xor_sync(0xFFFFFFFFu, amax, 1);
    float r;
    asm("max.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(amax), "f"(o));
    amax = r;
  }
  const uint32_t ab = __float_as_uint(amax);
  float d = 0.0f, r = 0.0f, inv = 0.0f;
  int e = 0;     /* MXFP4: the scale exponent */
  int state = 0; /* 0 slow, 1 dead (codes 0), 2 NVFP4 live (d, r), 3 MXFP4 live (inv) */
  uint32_t sbyte = 0;
  if (format == kvx_ref::FP4_NVFP4) {
    const float g = use_tab ? ws.g : g_head;
    if ((use_tab ? ws.g_ok : pos_range(__float_as_uint(g))) && ab < 0x5D800000u) {
      float wanted;
      if (use_tab && ws.r6 != 0.0f && (pos_range(ab) || ab == 0u)) {
        wanted = div_rcp(amax, ws.sixg, ws.r6);
      } else {
        wanted = __fdiv_rn(amax, __fmul_rn(6.0f, g));
      }
      const uint32_t s8 = kvx_fp4_fast::e4m3_sat(wanted); /* wanted finite, >= 0 */
      if (s8 == 0) {
        state = 1;
      } else {
        if (use_tab) {
          const float2 dr = tab[s8];
          d = dr.x;
          r = dr.y;
        } else {
          d = __fmul_rn(kvx_fp4_fast::e4m3_pos_f32(s8), g);
          if (d_fast(d)) {
            d = __fmul_rn(d, 16384.0f);
            r = __frcp_rn(d);
          }
        }
        if (r != 0.0f) {
          sbyte = s8;
          state = 2;
        }
      }
    }
  } else if (ab == 0) {
    state = 1;
  } else if (ab - 0x00800000u < 0x7F000000u) { /* normal, finite */
    bool ok = true;
    if (format == kvx_ref::FP4_MXFP4) {
      const float v6 = pos_range(ab) ? div_rcp(amax, 6.0f, 0.16666667163372039795f) : __fdiv_rn(amax, 6.0f);
      const uint32_t v = __float_as_uint(v6);
      ok = v >= 0x00800000u;
      e = (int)(v >> 23) - 127 + ((v & 0x7FFFFFu) != 0u);
    } else {
      e = max((int)(ab >> 23) - 129, -127);
    }
    if (ok) { /* 2^(-e-14), subnormal for e > 112 */
      inv = __uint_as_float(e <= 112 ? (uint32_t)(113 - e) << 23 : 1u << (135 - e));
      sbyte = (uint32_t)(e + 127);
      state = 3;
    }
  }
  slow = state == 0;
  /* MXFP4 from F16 (2^-e a normal F16) or BF16: the codes in packed F16
   * arithmetic (fp4_fast.h e2m1_h), two values per instruction: s = |x| 2^-e
   * by one packed F16 product (F16) or by two FP32 products and one packed
   * conversion (BF16) */
  if (state == 3 && DT != KVX_DTYPE_F32 && (KVX_FP4_MX_H2 == 2 || (KVX_FP4_MX_H2 == 1 && DT == KVX_DTYPE_F16 && NG == 2)) &&
      (DT == KVX_DTYPE_BF16 || e >= -15)) {
    const uint32_t e16 = (uint32_t)(15 - e) << 10;
    const uint32_t sc2u = e16 | (e16 << 16); /* 2^-e in both halves (F16) */
    const float inv32 = __uint_as_float(e <= 126 ? (uint32_t)(127 - e) << 23 : 1u << 22); /* 2^-e (BF16) */
#pragma unroll
    for (int gi = 0; gi < NG; ++gi) {
      const uint32_t* wg = w + gi * WG;
      uint32_t hw[8];
#pragma unroll
      for (int k = 0; k < 8; ++k) {
        __half2 sv;
        if (DT == KVX_DTYPE_F16) {
          __half2 xv, sc2;
          memcpy(&xv, &wg[k], 4);
          memcpy(&sc2, &sc2u, 4);
          sv = __hmul2(__habs2(xv), sc2);
        } else {
          sv = __floats2half2_rn(__fmul_rn(fabsf(__uint_as_float(wg[k] << 16)), inv32),
                                 __fmul_rn(fabsf(__uint_as_float(wg[k] & 0xFFFF0000u)), inv32));
        }
        const __half2 cv = kvx_fp4_fast::e2m1_h<H2Ops>(sv);
        uint32_t u;
        memcpy(&u, &cv, 4);
        hw[k] = u | (wg[k] & 0x80008000u);
      }
      pack_codes(hw, out + 2 * gi);
    }
    return sbyte;
  }
  if (state >= 2) {
#pragma unroll
    for (int gi = 0; gi < NG; ++gi) {
      const uint32_t* wg = w + gi * WG;
      float x[16];
      unpack<DT, WG>(wg, x);
      float f[16];
      if (state == 2) {
#pragma unroll
        for (int i = 0; i < 16; ++i) f[i] = kvx_fp4_fast::e2m1_f16_scaled(div_rcp(fabsf(x[i]), d, r));
      } else {
#pragma unroll
        for (int i = 0; i < 16; ++i) f[i] = kvx_fp4_fast::e2m1_f16_scaled(__fmul_rn(fabsf(x[i]), inv));
      }
      uint32_t hw[8];
#pragma unroll
      for (int k = 0; k < 8; ++k) {
        const __half2 h = __floats2half2_rn(f[2 * k], f[2 * k + 1]);
        uint32_t u;
        memcpy(&u, &h, 4);
        if (DT == KVX_DTYPE_F32) {
          u |= ((wg[2 * k] >> 16) & 0x8000u) | (wg[2 * k + 1] & 0x80000000u);
        } else {
          u |= wg[k] & 0x80008000u;
        }
        hw[k] = u;
      }
      pack_codes(hw, out + 2 * gi);
    }
  } else {
#pragma unroll
    for (int o = 0; o < 2 * NG; ++o) out[o] = 0;
  }
  return sbyte;
}

constexpr unsigned kNoBlock = 0xFFFFFFFFu;

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

#ifndef KVX_FP4_W16_NI
#define KVX_FP4_W16_NI 1 /* write, 16-bit IO, 32-value blocks with KVX_FP4_W32_WHOLE=0: half-blocks per lane per
                            batch (2 spilled 92 bytes) */
#endif
#ifndef KVX_FP4_WRITE_MIN_BLOCKS
#define KVX_FP4_WRITE_MIN_BLOCKS 2 /* at most 128 registers: more CTAs spill */
#endif
#ifndef KVX_FP4_G32_NI
#define KVX_FP4_G32_NI 4 /* gather into F32: 16-byte chunks per lane per batch (8: 2-3 % slower) */
#endif
#ifndef KVX_FP4_PREFETCH_W16
#define KVX_FP4_PREFETCH_W16 1 /* write, 16-bit IO: the next row into L2 (+3-6 %; with F32 IO, or the
                                  gathers' codes, it cost 10-30 %) */
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

/* Threads per CTA of the fast write kernel (the launch reads it too). */
template <int DT>
struct WThreads {
  static constexpr int value = DT == KVX_DTYPE_F32 ? 256 : KVX_FP4_W16_THREADS;
};
template <int B, int DT, int FMT> /* FMT: P.format, a template argument so each kernel keeps one format's path */
__global__ void __launch_bounds__(WThreads<DT>::value, B == 16 && DT != KVX_DTYPE_F32
                                                          ? KVX_FP4_WRITE_MIN_BLOCKS_16
                                                          : B == 32 && DT != KVX_DTYPE_F32 && KVX_FP4_W32_WHOLE
                                                          ? KVX_FP4_WRITE_MIN_BLOCKS_32
                                                          : KVX_FP4_WRITE_MIN_BLOCKS * 256 / WThreads<DT>::value)
    write_fast_kernel(Params P) {
  /* VPL values per lane and sub-block (16, or a whole 32-value block with
   * 16-bit IO: NG = 2 groups of 16), LB lanes per block, NI sub-blocks per
   * lane in flight */
  constexpr int ES = Es<DT>::value;
  constexpr bool WHOLE = B == 32 && ES == 2 && KVX_FP4_W32_WHOLE;
  constexpr int VPL = WHOLE ? 32 : 16, NG = VPL / 16, LB = B / VPL, NV = VPL * ES / 16,
                NI = VPL * ES >= 64 ? 1 : B == 16 ? KVX_FP4_W16_NI_16 : KVX_FP4_W16_NI;
  /* sides per step: 2 for NVFP4 (+2-3 points on the H100); MXFP4 lost 1.4-3 points with 2 and the
   * 32-value blocks spill */
  constexpr int SU = KVX_FP4_SIDE_UNROLL && B == 16 && FMT == kvx_ref::FP4_NVFP4 ? 2 : 1;
  __shared__ float2 tab[2][128];
  WSide ws[2];
  const bool use_tab = FMT == kvx_ref::FP4_NVFP4 && !P.side[0].g_per_head && !P.side[1].g_per_head;
#pragma unroll
  for (int sd = 0; sd < 2; ++sd) {
    const Side& S = P.side[sd];
    ws[sd].g = S.g && !S.g_per_head ? S.g[0] : 1.0f;
    ws[sd].g_ok = pos_range(__float_as_uint(ws[sd].g));
    ws[sd].sixg = __fmul_rn(6.0f, ws[sd].g);
    ws[sd].r6 = ws[sd].g_ok && pos_range(__float_as_uint(ws[sd].sixg)) ? __frcp_rn(ws[sd].sixg) : 0.0f;
  }
  if (use_tab) {
    for (unsigned k = threadIdx.x; k < 256; k += blockDim.x) {
      const unsigned sd = k >> 7, s8 = k & 127u;
      const float g = sd ? ws[1].g : ws[0].g;
      const float d = s8 <= 0x7Eu ? __fmul_rn(kvx_fp4_fast::e4m3_pos_f32(s8), g) : 0.0f;
      const float ds = __fmul_rn(d, 16384.0f);
      tab[sd][s8] = make_float2(ds, d_fast(d) ? __frcp_rn(ds) : 0.0f);
    }
    __syncthreads();
  }
  const unsigned lane = threadIdx.x & 31u;
  const unsigned long long r0 = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x - lane;
  if (r0 >= P.rows) return;
  unsigned bl = kNoBlock, tl = 0;
  if (r0 + lane < P.rows) {
    const long long slot = ld_index(P.slots, P.slot64, P.row_begin + r0 + lane);
    if (!(slot < 0 || slot == P.invalid_slot || (unsigned long long)slot >= P.num_slots)) {
      unsigned long long b, t;
      split_slot(P, slot, b, t);
      bl = (unsigned)b;
      tl = (unsigned)t;
    }
  }
  const unsigned n = P.rows - r0 < 32ull ? (unsigned)(P.rows - r0) : 32u;
  const unsigned NB = (unsigned)(P.H * P.J), NS = NB * LB, NQ = (NS + 32u * NI - 1u) / (32u * NI);
  const unsigned row_bytes = NB * B * ES, T = n * NQ * (2 / SU);
  /* The warp's work is a stream of T steps (row i, batch q of NI sub-blocks
   * per lane, and with SU = 1 the side; with SU = 2 a step takes both sides,
   * unrolled, so each side's parameters are constant operands); side k + 1 is
   * loaded while side k is encoded. */
  uint4 nraw[NI][NV];
  unsigned ni = 0, nq = 0, ns = 0; /* the step after the current one */
  /* the stream cursor (row i, batch q, side sd) one step on: a side at a time when `sides` */
  auto advance = [&](unsigned& i, unsigned& q, unsigned& sd, bool sides) {
    if (sides && ++sd < 2) return;
    sd = 0;
    if (++q == NQ) {
      q = 0;
      ++i;
    }
  };
  /* IO element offset, in its row, of sub-block sb (< NS) */
  auto io_off = [&](const Side& S, unsigned sb) -> long long {
    if (P.lin) return (long long)sb * VPL;
    const unsigned bi = sb / LB, h = divu(P.fd_j, bi), j = bi - h * (unsigned)P.J;
    return (long long)h * S.io_head + (long long)j * B + (sb % LB) * VPL;
  };
  /* ASYNC: each lane's 64 bytes of a step (one side of a batch: NI x NV
   * 16-byte loads, 4 of them) go to its own shared-memory slots (a lane reads
   * back only what it copied, so no warp barrier is needed), ST steps per warp
   * in the ring, ST - 1 of them in flight while one is encoded; slot (lane, k)
   * = 4 lane + ((k + lane / 2) mod 4): the 8 lanes of a quarter-warp hit 8
   * distinct 16-byte bank groups. The ring advances one side at a time (with
   * SU = 2 both sides of a step are consumed in turn, in the order issued). */
  constexpr bool ASYNC =
      ES == 2 && NI * NV == 4 && (WHOLE ? KVX_FP4_W32_ASYNC : B == 16 && KVX_FP4_W16_ASYNC);
  constexpr int ST = KVX_FP4_W32_STAGES;
  uint4* const ring = fp4_stage + (threadIdx.x >> 5) * (ST * 32 * 4);
  unsigned ai = 0, aq = 0, as = 0, issued = 0, wst = 0, rst = 0;
  auto slot = [&](unsigned k) { return 4u * lane + ((k + (lane >> 1)) & 3u); };
  const unsigned units = T * SU; /* sides in the whole stream */
  auto issue = [&]() {
    if (issued < units) {
      const Side& S = P.side[as];
      const char* io_row = S.io + (long long)(P.row_begin + r0 + ai) * S.io_token * ES;
      uint4* dst = ring + wst * (32 * 4);
#pragma unroll
      for (int m = 0; m < NI; ++m) {
        const unsigned sb = aq * 32u * NI + lane + 32u * m;
        const bool ok = sb < NS;
        const uint4* src = (const uint4*)(io_row + (ok ? io_off(S, sb) : 0ll) * ES);
#pragma unroll
        for (int v = 0; v < NV; ++v) cp_async16(dst + slot(m * NV + v), src + (ok ? v : 0), ok);
      }
      advance(ai, aq, as, true);
    }
    ++issued;
    wst = wst + 1 == ST ? 0 : wst + 1;
    cp_async_commit();
  };
  auto load = [&](unsigned i, unsigned side, unsigned q) {
    const Side& S = P.side[side];
    const char* io_row = S.io + (long long)(P.row_begin + r0 + i) * S.io_token * ES;
#pragma unroll
    for (int m = 0; m < NI; ++m) {
      const unsigned sb = q * 32u * NI + lane + 32u * m;
#pragma unroll
      for (int v = 0; v < NV; ++v) nraw[m][v] = make_uint4(0, 0, 0, 0);
      if (sb < NS) {
        const uint4* src = (const uint4*)(io_row + io_off(S, sb) * ES);
#pragma unroll
        for (int v = 0; v < NV; ++v) nraw[m][v] = __ldg(src + v);
      }
    }
  };
  if constexpr (ASYNC) {
#pragma unroll
    for (int st = 0; st < ST - 1; ++st) issue();
  } else {
    load(0, 0, 0);
  }
#pragma unroll 1
  for (unsigned k = 0; k < T; ++k) {
    const unsigned i = ni, q = nq, s0 = ns;
    advance(ni, nq, ns, SU == 1);
    const unsigned long long row = P.row_begin + r0 + i;
    if (KVX_FP4_PREFETCH_W16 && ES == 2 && P.lin && s0 == 0 && q == 0) {
      /* lane 2k + side: row i + A (the first row: rows 1..A) of that side */
      const unsigned k = lane >> 1, sd = lane & 1u;
      const unsigned ahead = i == 0 ? k + 1u : k == 0 ? (unsigned)KVX_FP4_PREFETCH_AHEAD : 0u;
      if (lane < 2u * KVX_FP4_PREFETCH_AHEAD && ahead && r0 + i + ahead < P.rows)
        prefetch_l2(P.side[sd].io + (long long)(row + ahead) * P.side[sd].io_token * ES, row_bytes);
    }
    const unsigned b = __shfl_sync(0xFFFFFFFFu, bl, i), t = __shfl_sync(0xFFFFFFFFu, tl, i);
#pragma unroll
    for (int su = 0; su < SU; ++su) {
      uint4 raw[NI][NV];
      if constexpr (ASYNC) {
        issue();
        cp_async_wait<ST - 1>();
        const uint4* cur = ring + rst * (32 * 4);
#pragma unroll
        for (int m = 0; m < NI; ++m) {
#pragma unroll
          for (int v = 0; v < NV; ++v) raw[m][v] = cur[slot(m * NV + v)];
        }
        rst = rst + 1 == ST ? 0 : rst + 1;
      } else {
#pragma unroll
        for (int m = 0; m < NI; ++m) {
#pragma unroll
          for (int v = 0; v < NV; ++v) raw[m][v] = nraw[m][v];
        }
        if (SU == 2 && su == 0) {
          load(i, 1, q);
        } else if (k + 1 < T) {
          load(ni, ns, nq);
        }
      }
      if (b == kNoBlock) continue;
      const unsigned side = SU == 2 ? (unsigned)su : s0;
      const Side& S = P.side[side];
      const char* io_row = S.io + (long long)row * S.io_token * ES;
      char* code_row = S.codes + ((long long)b * S.c_block + (long long)t * S.c_token) / 2;
      char* sc_row = S.scales + (long long)b * S.s_block + (long long)t * S.s_token;
      const WSide wsd = side ? ws[1] : ws[0];
      const float2* tabs = tab[side]; /* read only when use_tab */
#pragma unroll
      for (int m = 0; m < NI; ++m) {
        const unsigned sb = q * 32u * NI + lane + 32u * m, bi = sb / LB, half = sb % LB;
        unsigned h = 0, j = 0;
        if (!P.lin || (!use_tab && S.g_per_head)) {
          h = divu(P.fd_j, bi);
          j = bi - h * (unsigned)P.J;
        }
        const float g_head = !use_tab && S.g ? S.g[S.g_per_head ? h : 0u] : 1.0f;
        uint32_t out[2 * NG];
        bool slow;
        uint32_t sbyte =
            encode16<DT, (LB == 2), FMT, NG>((const uint32_t*)raw[m], wsd, g_head, use_tab, tabs, slow, out);
        if (slow && sb < NS) {
          const long long boff = P.lin ? (long long)bi * B : (long long)h * S.io_head + (long long)j * B;
          const Packed<B> pk = encode_slow<B, DT>(FMT, (const uint4*)(io_row + boff * ES), use_tab ? wsd.g : g_head);
#pragma unroll
          for (int o = 0; o < 2 * NG; ++o) out[o] = pk.w[half * 2 * NG + o];
          sbyte = pk.sbyte;
        }
        if (sb < NS) {
          long long coff, soff;
          if (P.lin) {
            coff = (long long)sb * VPL;
            soff = bi;
          } else {
            coff = (long long)h * S.c_head + (long long)j * B + half * VPL;
            soff = (long long)h * S.s_head + (long long)j * S.s_dim;
          }
          if (NG == 2) {
            *(uint4*)(code_row + coff / 2) = make_uint4(out[0], out[1], out[2 % (2 * NG)], out[3 % (2 * NG)]);
          } else {
            *(uint2*)(code_row + coff / 2) = make_uint2(out[0], out[1]);
          }
          if (half == 0) sc_row[soff] = (char)sbyte;
        }
      }
    }
  }
}

/* The 16 output bytes of a chunk of a NaN block: every value is the scale's
 * NaN, its bits as fp4_decode_with (F32) or through convert.h (F16, BF16: the
 * bits numpy and ml_dtypes give). Out of line: the hot path only tests sf. */
template <int DT>
__device__ __noinline__ void store_nan16(char* dst, float sf) {
  unsigned w = __float_as_uint(sf);
  if (DT != KVX_DTYPE_F32) w = (unsigned)out16<DT>(sf) * 0x10001u;
  *(uint4*)dst = make_uint4(w, w, w, w);
}

template <int B, int DT>
__global__ void __launch_bounds__(256) gather_fast_kernel(Params P) {
  constexpr int ES = Es<DT>::value, VPC = 16 / ES, CPB = B / VPC, NI = VPC == 4 ? KVX_FP4_G32_NI : 4;
  __shared__ float e2m1[16];
  __shared__ float sdec[256];
  if (threadIdx.x < 16) e2m1[threadIdx.x] = kvx_ref::e2m1_to_f32(threadIdx.x);
  for (unsigned k = threadIdx.x; k < 256; k += blockDim.x) sdec[k] = kvx_ref::fp4_scale_f32(P.format, (uint8_t)k);
  __syncthreads();
  const unsigned lane = threadIdx.x & 31u;
  const unsigned long long r0 = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x - lane;
  if (r0 >= P.rows) return;
  const float g0 = P.side[0].g ? P.side[0].g[0] : 1.0f, g1 = P.side[1].g ? P.side[1].g[0] : 1.0f;
  unsigned bl = kNoBlock, ol = 0;
  if (r0 + lane < P.rows) {
    const unsigned long long row = P.row_begin + r0 + lane;
    const unsigned long long s = row < 0x80000000ull ? divu(P.fd_msl, (unsigned)row) : row / P.max_seq_len;
    const unsigned long long t = row - s * P.max_seq_len;
    long long L = ld_index(P.seq_lens, P.len64, s);
    if (L > (long long)P.max_seq_len) L = P.max_seq_len;
    if (L >= 0 && t < (unsigned long long)L) {
      const unsigned long long jb = t < 0x80000000ull ? divu(P.fd_bs, (unsigned)t) : t / P.block_size;
      long long b = -1;
      if (P.ragged) {
        const long long lo = ld_index(P.indptr, P.indptr64, s), hi = ld_index(P.indptr, P.indptr64, s + 1);
        if (!(lo < 0 || hi < lo || (long long)t >= hi - lo || (unsigned long long)(lo + t) >= P.indices_count))
          b = ld_index(P.indices, P.idx64, lo + t);
      } else if (jb < P.max_blocks) {
        b = ld_index(P.indices, P.idx64, s * P.max_blocks + jb);
      }
      if (b >= 0 && (unsigned long long)b < P.num_blocks) {
        bl = (unsigned)b;
        ol = (unsigned)(t - jb * P.block_size);
      }
    }
  }
  const unsigned n = P.rows - r0 < 32ull ? (unsigned)(P.rows - r0) : 32u;
  const unsigned NC = (unsigned)(P.H * P.J) * CPB, NQ = (NC + 32u * NI - 1u) / (32u * NI), T = n * 2u * NQ;
  /* The warp's work is a stream of T batches (row i, side, batch q of NI
   * chunks per lane); the codes and scale bytes of batch k + 1 are loaded
   * while batch k is decoded and stored. */
  uint32_t ncw[NI];
  unsigned nsb[NI];
  bool nvalid = false;
  unsigned ni = 0, ns = 0, nq = 0; /* the batch held in ncw, nsb */
  auto load = [&](unsigned i, unsigned side, unsigned q) {
    const unsigned b = __shfl_sync(0xFFFFFFFFu, bl, i), off = __shfl_sync(0xFFFFFFFFu, ol, i);
    nvalid = b != kNoBlock;
    if (!nvalid) return;
    const Side& S = P.side[side];
    const char* code_row = S.codes + ((long long)b * S.c_block + (long long)off * S.c_token) / 2;
    const unsigned char* sc_row = (const unsigned char*)S.scales + (long long)b * S.s_block + (long long)off * S.s_token;
#pragma unroll
    for (int m = 0; m < NI; ++m) {
      const unsigned c = q * 32u * NI + lane + 32u * m;
      ncw[m] = 0;
      nsb[m] = 0;
      if (c < NC) {
        const char* src;
        const unsigned char* sp;
        if (P.lin) { /* chunk c: code bytes at c * VPC / 2, its block's scale at c / CPB */
          src = code_row + c * (unsigned)(VPC / 2);
          sp = sc_row + c / CPB;
        } else {
          const unsigned bi = c / CPB, p = c % CPB;
          const unsigned h = divu(P.fd_j, bi), j = bi - h * (unsigned)P.J;
          src = code_row + ((long long)h * S.c_head + (long long)j * B) / 2 + p * (VPC / 2);
          sp = sc_row + (long long)h * S.s_head + (long long)j * S.s_dim;
        }
        if (VPC == 8) {
          ncw[m] = __ldg((const unsigned*)src);
        } else {
          ncw[m] = __ldg((const unsigned short*)src);
        }
        nsb[m] = __ldg(sp);
      }
    }
  };
  load(0, 0, 0);
#pragma unroll 1
  for (unsigned k = 0; k < T; ++k) {
    uint32_t cw[NI];
    unsigned sb[NI];
#pragma unroll
    for (int m = 0; m < NI; ++m) {
      cw[m] = ncw[m];
      sb[m] = nsb[m];
    }
    const bool valid = nvalid;
    const unsigned i = ni, side = ns, q = nq;
    if (++nq == NQ) {
      nq = 0;
      if (++ns == 2) {
        ns = 0;
        ++ni;
      }
    }
    if (k + 1 < T) load(ni, ns, nq);
    if (!valid) continue;
    const Side& S = P.side[side];
    char* io_row = S.io + (long long)(P.row_begin + r0 + i) * S.io_token * ES;
    const float g_t = side ? g1 : g0;
#pragma unroll
    for (int m = 0; m < NI; ++m) {
      const unsigned c = q * 32u * NI + lane + 32u * m;
      if (c < NC) {
        unsigned h = 0;
        char* dst;
        if (P.lin) { /* chunk c: output bytes at c * 16 */
          if (S.g_per_head) h = divu(P.fd_j, c / CPB);
          dst = io_row + (size_t)c * 16u;
        } else {
          const unsigned bi = c / CPB, p = c % CPB;
          h = divu(P.fd_j, bi);
          const unsigned j = bi - h * (unsigned)P.J;
          dst = io_row + ((long long)h * S.io_head + (long long)j * B + (long long)p * VPC) * ES;
        }
        const float sf = sdec[sb[m]];
        if (sf != sf) { /* a NaN block: rare, out of line */
          store_nan16<DT>(dst, sf);
          continue;
        }
        const float g = S.g_per_head ? S.g[h] : g_t;
        float v[VPC];
        if (P.format == kvx_ref::FP4_NVFP4) {
#pragma unroll
          for (int kk = 0; kk < VPC; ++kk) v[kk] = __fmul_rn(__fmul_rn(e2m1[(cw[m] >> (4 * kk)) & 15u], sf), g);
        } else {
#pragma unroll
          for (int kk = 0; kk < VPC; ++kk) v[kk] = __fmul_rn(e2m1[(cw[m] >> (4 * kk)) & 15u], sf);
        }
        unsigned o[4];
#pragma unroll
        for (int kk = 0; kk < 4; ++kk) {
          if (ES == 4) {
            o[kk] = __float_as_uint(v[kk]);
          } else if (DT == KVX_DTYPE_F16) { /* not NaN: two RN conversions in one instruction */
            const __half2 hh = __floats2half2_rn(v[2 * kk], v[2 * kk + 1]);
            memcpy(&o[kk], &hh, 4);
          } else {
            const __nv_bfloat162 hh = __floats2bfloat162_rn(v[2 * kk], v[2 * kk + 1]);
            memcpy(&o[kk], &hh, 4);
          }
        }
        *(uint4*)dst = make_uint4(o[0], o[1], o[2], o[3]);
      }
    }
  }
}

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

template <bool W, int B>
Kernel pick_dt(int dt) {
  switch (dt) {
    case KVX_DTYPE_F16:
      return W ? write_kernel<B, KVX_DTYPE_F16> : gather_kernel<B, KVX_DTYPE_F16>;
    case KVX_DTYPE_BF16:
      return W ? write_kernel<B, KVX_DTYPE_BF16> : gather_kernel<B, KVX_DTYPE_BF16>;
    case KVX_DTYPE_F32:
      return W ? write_kernel<B, KVX_DTYPE_F32> : gather_kernel<B, KVX_DTYPE_F32>;
    default:
      return W ? write_kernel<B, 0> : gather_kernel<B, 0>;
  }
}

template <bool W>
Kernel pick(const Params& P) {
  const int dt = P.raw ? 0 : P.io_dtype;
  return P.B == 32 ? pick_dt<W, 32>(dt) : pick_dt<W, 16>(dt);
}

template <bool W, int B, int FMT>
Kernel pick_fast_dt(int dt) {
  switch (dt) {
    case KVX_DTYPE_F16:
      return W ? write_fast_kernel<B, KVX_DTYPE_F16, FMT> : gather_fast_kernel<B, KVX_DTYPE_F16>;
    case KVX_DTYPE_BF16:
      return W ? write_fast_kernel<B, KVX_DTYPE_BF16, FMT> : gather_fast_kernel<B, KVX_DTYPE_BF16>;
    default:
      return W ? write_fast_kernel<B, KVX_DTYPE_F32, FMT> : gather_fast_kernel<B, KVX_DTYPE_F32>;
  }
}

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

template <bool W>
Kernel pick_fast(const Params& P) {
  if (P.B == 32) return pick_fast_dt<W, 32, kvx_ref::FP4_MXFP4_OCP>(P.io_dtype);
  /* the gathers take the format at run time: one instantiation serves both */
  return P.format == kvx_ref::FP4_NVFP4 || !W ? pick_fast_dt<W, 16, kvx_ref::FP4_NVFP4>(P.io_dtype)
                                              : pick_fast_dt<W, 16, kvx_ref::FP4_MXFP4>(P.io_dtype);
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

/* Dynamic shared memory of the fast write: the ASYNC staging ring (16-bit IO; 64 bytes per lane per step). */
int write_smem(const Params& P, unsigned threads) {
  if (P.io_dtype == KVX_DTYPE_F32) return 0;
  const bool async = P.B == 32 ? KVX_FP4_W32_ASYNC && KVX_FP4_W32_WHOLE : KVX_FP4_W16_ASYNC && KVX_FP4_W16_NI_16 == 2;
  return async ? (int)(threads / 32) * KVX_FP4_W32_STAGES * 32 * 4 * 16 : 0;
}

/* Fast kernels: 32 rows per warp, 256 rows per CTA, chunks of 2^30 rows. */
#ifndef KVX_FP4_FAST_MIN_ROWS
#define KVX_FP4_FAST_MIN_ROWS 256 /* FP4 writes of at most this many rows: the per-block kernel (launch) */
#endif
kvx_status_t launch_fast(Kernel kernel, Params P, unsigned long long rows, cudaStream_t stream, unsigned threads = 256,
                         int smem = 0) {
  if (smem && !allow_smem(kernel, smem)) return KVX_STATUS_INTERNAL_ERROR;
  P.fd_j = make_div((unsigned)P.J);
  P.fd_bs = make_div(P.block_size);
  P.lin = lin_ok(P);
  const unsigned long long max_rows = 1ull << 30;
  for (unsigned long long r0 = 0; r0 < rows; r0 += max_rows) {
    P.row_begin = r0;
    P.rows = rows - r0 < max_rows ? rows - r0 : max_rows;
    kernel<<<(unsigned)((P.rows + threads - 1) / threads), threads, smem, stream>>>(P);
    if (cudaGetLastError() != cudaSuccess) return KVX_STATUS_INTERNAL_ERROR;
  }
  return KVX_STATUS_OK;
}

kvx_status_t launch_chunk(Kernel kernel, const Params& P, cudaStream_t stream) {
  if (P.items == 0) return KVX_STATUS_OK;
  /* One item per thread: many short-lived warps keep the most loads in flight
   * (the kernels still loop, grid-stride, should the grid ever be capped). */
  const unsigned grid = (unsigned)((P.items + 255) / 256);
  kernel<<<grid, 256, 0, stream>>>(P);
  const cudaError_t e = cudaGetLastError();
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

namespace kvx_ref {

kvx_status_t cuda_fp4_write(const WritePlan& plan, void* stream) {
  using namespace kvx_fp4;
  if (plan.num_tokens == 0) return KVX_STATUS_OK;
  if (!cuda_available()) return KVX_STATUS_UNSUPPORTED;
  if (plan.memory == KVX_MEMORY_UNIFIED) {
    kvx_status_t st = unified_wait((cudaStream_t)stream);
    if (st == KVX_STATUS_OK) st = host_prescan_write(plan);
    if (st != KVX_STATUS_OK) return st;
  }
  const Fp4Plan& f = plan.fp4;
  Params P = base(f, plan.num_kv_heads, plan.head_dim, plan.key.dtype);
  if (!f.raw && plan.key.dtype != plan.value.dtype) return KVX_STATUS_UNSUPPORTED; /* one IO dtype per launch */
  fill_side(P.side[0], plan.k_cache, f.k_scales, plan.key, f.io_k_scales, f.k_global);
  fill_side(P.side[1], plan.v_cache, f.v_scales, plan.value, f.io_v_scales, f.v_global);
  P.slots = plan.slots;
  P.slot64 = plan.slot_dtype == KVX_DTYPE_S64;
  P.invalid_slot = plan.invalid_slot;
  P.num_slots = (unsigned long long)plan.num_blocks * plan.block_size;
  P.block_size = plan.block_size;
  P.slot32 = P.num_slots < (1ull << 31);
  P.vec_ok = vec_ok(P);
  /* one thread per token row suits large calls; a decode-sized call (at most KVX_FP4_FAST_MIN_ROWS
   * rows) takes the per-block kernel, one thread per (row, side, head, scale block): 256 rows took
   * 82 us on the row kernel (docs/cuda-reference.md, "Decode-sized calls") */
  if (fast_ok(P) && plan.num_tokens > (unsigned long long)KVX_FP4_FAST_MIN_ROWS) {
    const unsigned threads = P.io_dtype == KVX_DTYPE_F32 ? 256u : (unsigned)KVX_FP4_W16_THREADS;
    return launch_fast(pick_fast<true>(P), P, plan.num_tokens, (cudaStream_t)stream, threads, write_smem(P, threads));
  }
  return launch(pick<true>(P), P, plan.num_tokens, (cudaStream_t)stream);
}

kvx_status_t cuda_fp4_gather(const GatherPlan& plan, void* stream) {
  using namespace kvx_fp4;
  if (!cuda_available()) return KVX_STATUS_UNSUPPORTED;
  if (plan.memory == KVX_MEMORY_UNIFIED && plan.seq_count > 0) {
    kvx_status_t st = unified_wait((cudaStream_t)stream);
    if (st == KVX_STATUS_OK) st = host_prescan_gather(plan);
    if (st != KVX_STATUS_OK) return st;
  }
  const unsigned long long rows = (unsigned long long)plan.seq_count * plan.max_seq_len;
  if (rows == 0) return KVX_STATUS_OK;
  if (plan.format != KVX_BLOCK_TABLE_PACKED && plan.format != KVX_BLOCK_TABLE_RAGGED) return KVX_STATUS_UNSUPPORTED;
  const Fp4Plan& f = plan.fp4;
  if (!f.raw && plan.key.dtype != plan.value.dtype) return KVX_STATUS_UNSUPPORTED;
  Params P = base(f, plan.num_kv_heads, plan.head_dim, plan.key.dtype);
  fill_side(P.side[0], plan.k_cache, f.k_scales, plan.key, f.io_k_scales, f.k_global);
  fill_side(P.side[1], plan.v_cache, f.v_scales, plan.value, f.io_v_scales, f.v_global);
  P.block_size = plan.block_size;
  P.ragged = plan.format == KVX_BLOCK_TABLE_RAGGED;
  P.indices = plan.indices;
  P.idx64 = plan.index_dtype == KVX_DTYPE_S64;
  P.indptr = plan.indptr;
  P.indptr64 = plan.indptr_dtype == KVX_DTYPE_S64;
  P.seq_lens = plan.seq_lens;
  P.len64 = plan.seq_lens_dtype == KVX_DTYPE_S64;
  P.max_seq_len = plan.max_seq_len;
  P.fd_msl = make_div(plan.max_seq_len);
  P.max_blocks = plan.max_blocks_per_seq;
  P.num_blocks = plan.num_blocks;
  P.indices_count = plan.indices_count;
  P.vec_ok = vec_ok(P);
  if (fast_ok(P)) return launch_fast(pick_fast<false>(P), P, rows, (cudaStream_t)stream);
  return launch(pick<false>(P), P, rows, (cudaStream_t)stream);
}

}  // namespace kvx_ref
