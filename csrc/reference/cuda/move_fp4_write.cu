/*
 * move_fp4_write.cu -- cuda_fp4_write: KVX 1.2 FP4 writes on CUDA (quantize, or
 * raw copy of codes and scales). The per-block and fast write kernels and their
 * helpers; what the gather shares is in move_fp4.cuh.
 */
#include "move_fp4.cuh"

namespace kvx_fp4 {
namespace {

#ifndef KVX_FP4_DECODE
#define KVX_FP4_DECODE 1 /* decode-sized writes on the fast layouts: write_decode_kernel (0: the per-block kernel) */
#endif
#ifndef KVX_FP4_WRITE32_MIN_BLOCKS
#define KVX_FP4_WRITE32_MIN_BLOCKS 3 /* 32-value blocks: at most 80 registers (BF16 IO: 2, it would spill) */
#endif
template <int B, int DT>
__global__ void __launch_bounds__(256, B == 16 ? 4 : DT == KVX_DTYPE_BF16 ? 2 : KVX_FP4_WRITE32_MIN_BLOCKS)
    write_kernel(Params P) {
  kvx_cuda::dependent_entry();
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

/* The 4 NV words of NV 16-byte vectors at `src` (read-only loads). */
template <int NV>
__device__ __forceinline__ void load_words(const uint4* src, uint32_t* w) {
#pragma unroll
  for (int v = 0; v < NV; ++v) {
    const uint4 u = __ldg(src + v);
    w[4 * v] = u.x;
    w[4 * v + 1] = u.y;
    w[4 * v + 2] = u.z;
    w[4 * v + 3] = u.w;
  }
}

template <int B, int DT>
__device__ __noinline__ Packed<B> encode_slow(int format, const uint4* src, float g) {
  constexpr int NV = B * Es<DT>::value / 16;
  uint32_t w[NV * 4];
  load_words<NV>(src, w);
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

/* MX codes of NG groups of 16 values (8 words each, WG apart) from F16 (2^-e a normal F16, e >=
 * -15) or BF16 in packed F16 arithmetic (fp4_fast.h e2m1_h), two values per instruction: s = |x|
 * 2^-e by one packed F16 product (F16) or by two FP32 products and one packed conversion (BF16). */
template <int DT, int NG, int WG>
__device__ __forceinline__ void mx_codes_h2(const uint32_t* w, int e, uint32_t* out) {
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
}

#ifndef KVX_FP4_MX_H2
#define KVX_FP4_MX_H2 1 /* MXFP4 codes in packed F16 arithmetic: 1 for OCP blocks from F16 (+0.6 points on the
                           H100); 2 for every MXFP4 write from F16/BF16 (16-value blocks -2.4 to -3.7 points, OCP
                           from BF16 +-0.1); 0 never (FP32, one value at a time) */
#endif

/* The 16-bit writes' codes by threshold compares (KVX_FP4_THR, fp4_fast.h
 * e2m1_thresholds): a block's scale picks a row of B_1..B_7 from a shared table
 * built once per CTA (NVFP4 with a per-tensor g: one row per side and scale
 * byte; MXFP4: one per exponent), and the magnitude of each 16-bit value is the
 * number of B_k at or below it, by packed F16 compares of the 16-bit magnitudes
 * (F16 and BF16 bits alike: both order as their bits up to 0x7C00) instead of
 * the FP32 division and rounding: 1: a binary search of three compares per
 * word (masks and selects); 2: seven compares summed in F16 (on 1024, so the
 * count is the low bits of each half). */
#ifndef KVX_FP4_THR
#define KVX_FP4_THR 2
#endif
#ifndef KVX_FP4_THR_B32
#define KVX_FP4_THR_B32 0 /* 1: the thresholds for the 32-value (OCP) blocks too */
#endif
#ifndef KVX_FP4_THR_MX16
#define KVX_FP4_THR_MX16 1 /* 0: the 16-value MXFP4 blocks keep the FP32 codes */
#endif

__device__ __forceinline__ uint32_t prmt(uint32_t a, uint32_t b, uint32_t sel) {
  uint32_t r;
  /* the default mode: bit 3 of a selector nibble replicates the selected byte's sign */
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(sel));
  return r;
}

__device__ __forceinline__ __half2 as_h2(uint32_t u) {
  __half2 h;
  memcpy(&h, &u, 4);
  return h;
}

/* The number of thresholds B_1..B_7 (each in both halves) at or below each half of a: seven
 * packed compares summed in F16 on 1024, so the count is the low bits of each half. */
__device__ __forceinline__ uint32_t thr_count(__half2 a, __half2 b1, __half2 b2, __half2 b3, __half2 b4, __half2 b5,
                                              __half2 b6, __half2 b7) {
  const __half2 s0 = __hadd2(__float2half2_rn(1024.0f), __hge2(a, b1));
  const __half2 s1 = __hadd2(__hge2(a, b2), __hge2(a, b3));
  const __half2 s2 = __hadd2(__hge2(a, b4), __hge2(a, b5));
  const __half2 s3 = __hadd2(__hge2(a, b6), __hge2(a, b7));
  const __half2 s = __hadd2(__hadd2(s0, s1), __hadd2(s2, s3));
  uint32_t r;
  memcpy(&r, &s, 4);
  return r;
}

/* The code magnitudes of the two values of word w (B_1..B_7 in t) in bytes 0
 * and 2 (the other bytes: 0 or 0x64). */
__device__ __forceinline__ uint32_t thr_mag(uint32_t w, const uint32_t* t) {
  const __half2 a = __habs2(as_h2(w));
#if KVX_FP4_THR == 1
  const uint32_t m2 = __hge2_mask(a, as_h2(t[3]));
  const uint32_t t1 = (m2 & t[5]) | (~m2 & t[1]);
  const uint32_t m1 = __hge2_mask(a, as_h2(t1));
  const uint32_t hi = (m1 & t[6]) | (~m1 & t[4]), lo = (m1 & t[2]) | (~m1 & t[0]);
  const uint32_t m0 = __hge2_mask(a, as_h2((m2 & hi) | (~m2 & lo)));
  return (m2 & 0x00040004u) | (m1 & 0x00020002u) | (m0 & 0x00010001u);
#else
  return thr_count(a, as_h2(t[0]), as_h2(t[1]), as_h2(t[2]), as_h2(t[3]), as_h2(t[4]), as_h2(t[5]), as_h2(t[6]));
#endif
}

/* The packed codes of 8 values from thr_mag of their 4 words `c` and the words
 * (the signs): [n0 n2 n1 n3] and [n4 n6 n5 n7] with their signs (bit 3: the
 * replicated sign byte, where the sign mask sm, 0x08080808 or 0, keeps it), then
 * the even and the odd elements, odd ones << 4. */
__device__ __forceinline__ uint32_t thr_pack8m(const uint32_t* c, const uint32_t* w, uint32_t sm) {
  const uint32_t p = prmt(c[0], c[1], 0x6240u) | (prmt(w[0], w[1], 0xFBD9u) & sm);
  const uint32_t q = prmt(c[2], c[3], 0x6240u) | (prmt(w[2], w[3], 0xFBD9u) & sm);
  return prmt(p, q, 0x5410u) + (prmt(p, q, 0x7632u) << 4);
}

/* The two words of packed codes of 16 values (8 words w), mag(word) giving thr_mag's bytes. */
template <class Mag>
__device__ __forceinline__ void codes16_by(const uint32_t* w, uint32_t* out, Mag mag, uint32_t sm = 0x08080808u) {
  uint32_t c[8];
#pragma unroll
  for (int k = 0; k < 8; ++k) c[k] = mag(w[k]);
  out[0] = thr_pack8m(c, w, sm);
  out[1] = thr_pack8m(c + 4, w + 4, sm);
}

/* The two words of packed codes of 16 values (8 words w) from their thresholds' row. */
__device__ __forceinline__ void thr_codes16(const uint32_t* w, const uint4* row, uint32_t* out) {
  const uint4 r0 = row[0], r1 = row[1];
  const uint32_t t[7] = {r0.x, r0.y, r0.z, r0.w, r1.x, r1.y, r1.z};
  codes16_by(w, out, [&](uint32_t x) { return thr_mag(x, t); });
}

/* The same from a compact row (KVX_FP4_LEAN_THR_C): B_1..B_7 as the halves of c.x, c.y, c.z and
 * the low half of c.w, each compared in both halves of a word by the compare's operand selector;
 * SIGNED: the signs where the row's flag (c.w's high half, 0x0808 or 0) has them, else always. */
template <bool SIGNED = false>
__device__ __forceinline__ void thr_codes16_c(const uint32_t* w, const uint4 c, uint32_t* out) {
  const __half2 x = as_h2(c.x), y = as_h2(c.y), z = as_h2(c.z), v = as_h2(c.w);
  codes16_by(
      w, out,
      [&](uint32_t wd) {
        return thr_count(__habs2(as_h2(wd)), __low2half2(x), __high2half2(x), __low2half2(y), __high2half2(y),
                         __low2half2(z), __high2half2(z), __low2half2(v));
      },
      SIGNED ? prmt(c.w, c.w, 0x3232u) : 0x08080808u);
}

/* Per-side constants of the fast write. */
struct WSide {
  float g, sixg, r6; /* NVFP4 per-tensor g (1.0 without), 6 g, RN(1 / (6 g)) (0: divide) */
  int g_ok;          /* g in [2^-60, 2^60): else every NVFP4 block takes encode_slow */
};

/* NVFP4's wanted scale RN(amax / (6 g)) of a block, amax < 2^60 and g in [2^-60, 2^60):
 * Markstein's division by 6 g with RN(1 / (6 g)) when that holds (ws.r6 != 0 and amax in
 * range or 0; `per_tensor`: g is ws.g), else IEEE. */
__device__ __forceinline__ float nv_wanted(float amax, uint32_t ab, const WSide& ws, bool per_tensor, float g) {
  if (per_tensor && ws.r6 != 0.0f && (pos_range(ab) || ab == 0u)) return div_rcp(amax, ws.sixg, ws.r6);
  return __fdiv_rn(amax, __fmul_rn(6.0f, g));
}

/* An MXFP4 block's scale exponent from its amax (a normal FP32, bits ab): MXFP4's ceil rule,
 * ceil(log2(amax / 6)) (false when amax / 6 is not normal: encode_block's path), or OCP's
 * floor rule, floor(log2(amax)) - 2, clamped at -127. */
template <int format>
__device__ __forceinline__ bool mx_exponent(float amax, uint32_t ab, int& e) {
  if (format == kvx_ref::FP4_MXFP4) {
    const float v6 = pos_range(ab) ? div_rcp(amax, 6.0f, 0.16666667163372039795f) : __fdiv_rn(amax, 6.0f);
    const uint32_t v = __float_as_uint(v6);
    e = (int)(v >> 23) - 127 + ((v & 0x7FFFFFu) != 0u);
    return v >= 0x00800000u;
  }
  e = max((int)(ab >> 23) - 129, -127);
  return true;
}

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
template <int DT, bool PAIR, int format, int NG, bool THR = false>
__device__ __forceinline__ uint32_t encode16(const uint32_t* w, const WSide& ws, float g_head, bool use_tab,
                                             const float2* tab, bool& slow, uint32_t* out,
                                             const uint4* thr = nullptr) {
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
  /* THR: the thresholds' row (NVFP4 with use_tab: the side's table at the scale byte; MXFP4: at e + 127) */
  constexpr bool T16 = THR && DT != KVX_DTYPE_F32;
  const uint4* trow = thr;
  if (format == kvx_ref::FP4_NVFP4) {
    const float g = use_tab ? ws.g : g_head;
    if ((use_tab ? ws.g_ok : pos_range(__float_as_uint(g))) && ab < 0x5D800000u) {
      const uint32_t s8 = kvx_fp4_fast::e4m3_sat(nv_wanted(amax, ab, ws, use_tab, g)); /* wanted finite, >= 0 */
      if (s8 == 0) {
        state = 1;
      } else if (T16 && use_tab) {
        trow = thr + 2 * s8;
        if (trow[1].w) { /* d > 0 */
          sbyte = s8;
          state = 2;
        }
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
    if (mx_exponent<format>(amax, ab, e)) { /* 2^(-e-14), subnormal for e > 112 */
      inv = __uint_as_float(e <= 112 ? (uint32_t)(113 - e) << 23 : 1u << (135 - e));
      sbyte = (uint32_t)(e + 127);
      state = 3;
      if (T16) trow = thr + 2 * (e + 127);
    }
  }
  slow = state == 0;
  if (T16 && state >= 2 && (format != kvx_ref::FP4_NVFP4 || use_tab)) {
#pragma unroll
    for (int gi = 0; gi < NG; ++gi) thr_codes16(w + gi * WG, trow, out + 2 * gi);
    return sbyte;
  }
  /* MXFP4 from F16 (2^-e a normal F16) or BF16: the codes in packed F16 arithmetic */
  if (!T16 && state == 3 && DT != KVX_DTYPE_F32 && (KVX_FP4_MX_H2 == 2 || (KVX_FP4_MX_H2 == 1 && DT == KVX_DTYPE_F16 && NG == 2)) &&
      (DT == KVX_DTYPE_BF16 || e >= -15)) {
    mx_codes_h2<DT, NG, WG>(w, e, out);
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

/* The thresholds' table of a CTA (KVX_FP4_THR): 256 rows of B_1..B_7 and a
 * live flag (d > 0); NVFP4: row side * 128 + s8 (d = float(s8) g), MXFP4:
 * row e + 127 (d = 2^e). The caller synchronizes. */
template <int DT, int FMT, bool COMPACT = false> /* COMPACT: one uint4 per row (thr_codes16_c), the flag in c.w's high
                                                   half (0x0808 live: the codes' sign mask, thr_codes16_c<true>) */
__device__ __forceinline__ void build_thr(uint4* thr_tab, const WSide* ws) {
  for (unsigned k = threadIdx.x; k < 256; k += blockDim.x) {
    float d = 0.0f;
    if (FMT == kvx_ref::FP4_NVFP4) {
      const unsigned s8 = k & 127u;
      if (s8 >= 1u && s8 <= 0x7Eu) d = __fmul_rn(kvx_fp4_fast::e4m3_pos_f32(s8), k >> 7 ? ws[1].g : ws[0].g);
    } else if (k < 255u) {
      d = kvx_ref::ue8m0_to_f32((uint8_t)k);
    }
    uint32_t t[8] = {0x7C007C00u, 0x7C007C00u, 0x7C007C00u, 0x7C007C00u, 0x7C007C00u, 0x7C007C00u, 0x7C007C00u, 0u};
    if (d > 0.0f && d < INFINITY) {
      kvx_fp4_fast::e2m1_thresholds<DT == KVX_DTYPE_BF16>(d, t);
      t[7] = 1u;
    }
    if (COMPACT) {
      thr_tab[k] = make_uint4(__byte_perm(t[0], t[1], 0x5410u), __byte_perm(t[2], t[3], 0x5410u),
                              __byte_perm(t[4], t[5], 0x5410u), (t[6] & 0xFFFFu) | (t[7] ? 0x08080000u : 0u));
    } else {
      thr_tab[2 * k] = make_uint4(t[0], t[1], t[2], t[3]);
      thr_tab[2 * k + 1] = make_uint4(t[4], t[5], t[6], t[7]);
    }
  }
}

/* The cache block and token of row r0 + lane of a warp's R rows (lane < R), kNoBlock for
 * none (past the call's rows, or an invalid slot). */
__device__ __forceinline__ void row_slot(const Params& P, unsigned long long r0, unsigned lane, unsigned R,
                                         unsigned& bl, unsigned& tl) {
  bl = kNoBlock;
  tl = 0;
  if (lane < R && r0 + lane < P.rows) {
    const long long slot = ld_index(P.slots, P.slot64, P.row_begin + r0 + lane);
    if (!(slot < 0 || slot == P.invalid_slot || (unsigned long long)slot >= P.num_slots)) {
      unsigned long long b, t;
      split_slot(P, slot, b, t);
      bl = (unsigned)b;
      tl = (unsigned)t;
    }
  }
}

/* The NVFP4 divisors of a CTA (per-tensor g): per side and scale byte, d 2^14 and its
 * reciprocal (0 where Markstein's division does not hold: d_fast). The caller synchronizes. */
__device__ __forceinline__ void build_dtab(float2 (*tab)[128], const WSide* ws) {
  for (unsigned k = threadIdx.x; k < 256; k += blockDim.x) {
    const unsigned sd = k >> 7, s8 = k & 127u;
    const float g = sd ? ws[1].g : ws[0].g;
    const float d = s8 <= 0x7Eu ? __fmul_rn(kvx_fp4_fast::e4m3_pos_f32(s8), g) : 0.0f;
    const float ds = __fmul_rn(d, 16384.0f);
    tab[sd][s8] = make_float2(ds, d_fast(d) ? __frcp_rn(ds) : 0.0f);
  }
}

/* The per-side constants of the fast writes (NVFP4 g from a per-tensor scale, 1.0 without). */
__device__ __forceinline__ void load_wside(const Params& P, WSide* ws) {
#pragma unroll
  for (int sd = 0; sd < 2; ++sd) {
    const Side& S = P.side[sd];
    ws[sd].g = S.g && !S.g_per_head ? S.g[0] : 1.0f;
    ws[sd].g_ok = pos_range(__float_as_uint(ws[sd].g));
    ws[sd].sixg = __fmul_rn(6.0f, ws[sd].g);
    ws[sd].r6 = ws[sd].g_ok && pos_range(__float_as_uint(ws[sd].sixg)) ? __frcp_rn(ws[sd].sixg) : 0.0f;
  }
}

/* A lane's batch q of NI sub-blocks (NV 16-byte vectors each) of one IO row into `dst`:
 * sub-block lane + 32 m of the batch, at byte offset off(sub-block) of the row; zeros past the
 * row's NS sub-blocks. */
template <int NI, int NV, class Off>
__device__ __forceinline__ void load_batch(uint4 (&dst)[NI][NV], const char* io_row, unsigned q, unsigned lane,
                                           unsigned NS, Off off) {
#pragma unroll
  for (int m = 0; m < NI; ++m) {
    const unsigned sb = q * 32u * NI + lane + 32u * m;
#pragma unroll
    for (int v = 0; v < NV; ++v) dst[m][v] = make_uint4(0, 0, 0, 0);
    if (sb < NS) {
      const uint4* src = (const uint4*)(io_row + off(sb));
#pragma unroll
      for (int v = 0; v < NV; ++v) dst[m][v] = __ldg(src + v);
    }
  }
}

/* Threads per CTA of the fast write kernel (the launch reads it too). */
template <int DT>
struct WThreads {
  static constexpr int value = DT == KVX_DTYPE_F32 ? 256 : KVX_FP4_W16_THREADS;
};
/* Rows per warp of the fast write of blocks of `b` values from IO elements of `es` bytes. */
__host__ __device__ constexpr unsigned write_rows_per_warp(int b, int es) {
  return es == 4 ? KVX_FP4_W_ROWS_F32 : b == 32 ? KVX_FP4_W_ROWS_B32 : KVX_FP4_W_ROWS_B16;
}

template <int B, int DT, int FMT> /* FMT: P.format, a template argument so each kernel keeps one format's path */
__global__ void __launch_bounds__(WThreads<DT>::value, B == 16 && DT != KVX_DTYPE_F32
                                                          ? KVX_FP4_WRITE_MIN_BLOCKS_16
                                                          : B == 32 && DT != KVX_DTYPE_F32 && KVX_FP4_W32_WHOLE
                                                          ? KVX_FP4_WRITE_MIN_BLOCKS_32
                                                          : KVX_FP4_WRITE_MIN_BLOCKS * 256 / WThreads<DT>::value)
    write_fast_kernel(Params P) {
  kvx_cuda::dependent_entry();
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
  constexpr bool THR = KVX_FP4_THR != 0 && ES == 2 && (B == 16 || KVX_FP4_THR_B32) &&
                       (FMT != kvx_ref::FP4_MXFP4 || KVX_FP4_THR_MX16);
  __shared__ uint4 thr_tab[THR ? 512 : 1]; /* 256 rows of B_1..B_7 and a live flag (d > 0) */
  WSide ws[2];
  const bool use_tab = FMT == kvx_ref::FP4_NVFP4 && !P.side[0].g_per_head && !P.side[1].g_per_head;
  load_wside(P, ws);
  if (THR && (FMT != kvx_ref::FP4_NVFP4 || use_tab)) {
    build_thr<DT, FMT>(thr_tab, ws);
    __syncthreads();
  } else if (use_tab) {
    build_dtab(tab, ws);
    __syncthreads();
  }
  const unsigned lane = threadIdx.x & 31u;
  constexpr unsigned R = write_rows_per_warp(B, ES); /* rows per warp */
  const unsigned long long r0 = (((unsigned long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5) * R;
  if (r0 >= P.rows) return;
  unsigned bl, tl;
  row_slot(P, r0, lane, R, bl, tl);
  const unsigned n = P.rows - r0 < (unsigned long long)R ? (unsigned)(P.rows - r0) : R;
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
  constexpr int ST = WHOLE ? KVX_FP4_W32_STAGES : KVX_FP4_W16_STAGES;
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
    load_batch(nraw, S.io + (long long)(P.row_begin + r0 + i) * S.io_token * ES, q, lane, NS,
               [&](unsigned sb) { return io_off(S, sb) * ES; });
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
    if (KVX_FP4_PREFETCH_W16 && ES == 2 && (FMT != kvx_ref::FP4_MXFP4 || KVX_FP4_PREFETCH_MX16) && P.lin && s0 == 0 &&
        q == 0) {
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
        uint32_t sbyte = encode16<DT, (LB == 2), FMT, NG, THR>(
            (const uint32_t*)raw[m], wsd, g_head, use_tab, tabs, slow, out,
            FMT == kvx_ref::FP4_NVFP4 ? thr_tab + 256 * side : thr_tab);
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

/* The lean write (KVX_FP4_LEAN): 16-value blocks (NVFP4 with a per-tensor or no g, MXFP4) with
 * heads packed in every row (P.lin), from F16/BF16 (codes by thresholds) or F32 (encode16's FP32
 * codes), and OCP MXFP4's 32-value blocks from F16/BF16 (thresholds): the fast kernel's stream
 * (rows of a warp in turn; a step is one batch of NI blocks per lane of both sides, side 1 loaded
 * while side 0 is encoded and the next step's side 0 while side 1 is) without its general cases,
 * so no per-block branch but the rare slow block (encode_slow). Its deep form (pick_lean) adds
 * the L2 prefetch of each next row and a grid of the resident CTAs. */
#ifndef KVX_FP4_LEAN
#define KVX_FP4_LEAN 1
#endif
#ifndef KVX_FP4_LEAN_MIN_DEPTH
#define KVX_FP4_LEAN_MIN_DEPTH 1 /* ... from F16/BF16 on devices of at least this memory depth (cuda/tuning.h) */
#endif
#ifndef KVX_FP4_LEAN_F32
#define KVX_FP4_LEAN_F32 3 /* ... from F32 IO too: 1 NVFP4, 2 MXFP4, 3 both */
#endif
#ifndef KVX_FP4_LEAN_MIN_BLOCKS
#define KVX_FP4_LEAN_MIN_BLOCKS 2
#endif
#ifndef KVX_FP4_LEAN_OCP
#define KVX_FP4_LEAN_OCP 1 /* ... for OCP MXFP4 (32-value blocks) at memory depth 2 or more: 0 never, \
                              1 from BF16, 2 from F16 too (H200: BF16 75.6 -> 80.7 %, F16 86.0 -> 79.8 %: the \
                              general kernel's F16 codes in packed F16 arithmetic are cheaper than the thresholds) */
#endif
#ifndef KVX_FP4_LEAN_MX_H2
#define KVX_FP4_LEAN_MX_H2 2 /* MX blocks from F16 by packed F16 arithmetic (e2m1_h) instead of the thresholds: \
                                0 never, 1 in the deep form, 2 always (MXFP4 from F16: H200 85.5 -> 89.3-89.4 %, \
                                H100 93.6-93.7 -> 94.6-94.7 %) */
#endif
#ifndef KVX_FP4_LEAN_MX_H2_BF16
#define KVX_FP4_LEAN_MX_H2_BF16 1 /* ... and MXFP4 (16-value blocks) from BF16 (s = RN16(RN32(|x| 2^-e)): two FP32 \
                                     products and a packed conversion per word, then e2m1_h; 0: the thresholds). \
                                     H100: 93.0-93.8 -> 93.6-94.4 %; OCP's lean blocks from BF16 keep the thresholds */
#endif
#ifndef KVX_FP4_LEAN_THR_C
#define KVX_FP4_LEAN_THR_C 1 /* 1: the thresholds' rows compact, one 16-byte shared load per block instead of two */
#endif
#ifndef KVX_FP4_LEAN_THREADS
#define KVX_FP4_LEAN_THREADS 256 /* threads per CTA (H200, 16-bit IO: 128 at 5 CTAs per SM, 96 registers, 20-36 \
                                    bytes spilled: NVFP4 84 -> 78-79 %, MXFP4 80-81 % either way) */
#endif
#ifndef KVX_FP4_LEAN_NI16
#define KVX_FP4_LEAN_NI16 2 /* sub-blocks per lane per step from 16-bit IO (1, the same occupancy: H200 NVFP4 84 -> \
                               74 %, MXFP4 80 -> 72 %) */
#endif

/* The lean write's block size: 32 values for OCP MXFP4, else 16. */
template <int FMT>
struct LeanB {
  static constexpr int value = FMT == kvx_ref::FP4_MXFP4_OCP ? 32 : 16;
};

#ifndef KVX_FP4_BULK_NV_LITE
#define KVX_FP4_BULK_NV_LITE 1 /* the staged write's NVFP4 blocks by encode_nv16_lite (0: encode_lean's tests) */
#endif

/* The staged write's NVFP4 block of 16 values from 16-bit IO (KVX_FP4_BULK_NV_LITE): encode_lean's
 * codes with its per-block tests folded into one. On a side with ws.r6 != 0 (g and 6 g in
 * [2^-60, 2^60), so every scale byte from 1 to 0x7E has a positive finite divisor and a live
 * row), a block whose amax is 0 or in [2^-60, 2^60) takes Markstein's quotient, its scale byte's
 * row of thresholds and the codes with the row's sign mask: row 0 (a dead block, byte 0) has
 * every threshold +inf and the mask 0, so its codes are 0 without a branch. Any other block
 * (a NaN or an infinity, a BF16 amax out of range, or a side without r6) takes encode_slow. */
template <int DT>
__device__ __forceinline__ uint32_t encode_nv16_lite(const uint32_t* w, const WSide& ws, const char* src,
                                                     uint32_t* out, unsigned thr_a) {
  const float amax = amax16<DT, 1>(w);
  const uint32_t ab = __float_as_uint(amax);
  if (ws.r6 != 0.0f && (pos_range(ab) || ab == 0u)) {
    const uint32_t s8 = kvx_fp4_fast::e4m3_sat(div_rcp(amax, ws.sixg, ws.r6));
    thr_codes16_c<true>(w, lds_u4(thr_a + s8 * 16u), out);
    return s8;
  }
  const Packed<16> pk = encode_slow<16, DT>(kvx_ref::FP4_NVFP4, (const uint4*)src, ws.g);
  out[0] = pk.w[0];
  out[1] = pk.w[1];
  return pk.sbyte;
}

/* One block of B = LeanB<FMT> values (B / 2 words): its packed codes in out[0 .. B / 8 - 1], its
 * scale byte returned; the slow blocks by encode_slow from `src`. LITE (the staged write): NVFP4
 * from 16-bit IO by encode_nv16_lite. */
template <int DT, int FMT, bool DEEP, bool LITE = false>
__device__ __forceinline__ uint32_t encode_lean(const uint32_t* w, const WSide& ws, const uint4* thr,
                                                const char* src, uint32_t* out, unsigned thr_a = 0) {
  constexpr int B = LeanB<FMT>::value, NG = B / 16;
  if constexpr (LITE && FMT == kvx_ref::FP4_NVFP4 && DT != KVX_DTYPE_F32 && KVX_FP4_LEAN_THR_C && KVX_FP4_W_SADDR)
    return encode_nv16_lite<DT>(w, ws, src, out, thr_a);
  const float amax = amax16<DT, NG>(w);
  const uint32_t ab = __float_as_uint(amax);
  int row = -1;   /* the thresholds' row; -1: slow */
  uint32_t sbyte = 0;
  if (FMT == kvx_ref::FP4_NVFP4) {
    if (ws.g_ok && ab < 0x5D800000u) {
      sbyte = kvx_fp4_fast::e4m3_sat(nv_wanted(amax, ab, ws, true, ws.g));
      row = sbyte == 0 ? 256 : (int)sbyte;
    }
  } else if (ab == 0) {
    row = 256;
  } else if (int e; ab - 0x00800000u < 0x7F000000u && mx_exponent<FMT>(amax, ab, e)) {
    sbyte = (uint32_t)(e + 127);
    row = (int)sbyte;
    if ((KVX_FP4_LEAN_MX_H2 == 2 || (KVX_FP4_LEAN_MX_H2 == 1 && DEEP)) &&
        ((DT == KVX_DTYPE_F16 && e >= -15) || (DT == KVX_DTYPE_BF16 && B == 16 && KVX_FP4_LEAN_MX_H2_BF16))) {
      mx_codes_h2<DT, NG, 8>(w, e, out); /* MX from F16 (and MXFP4 from BF16): encode16's packed F16 codes */
      return sbyte;
    }
  }
  if (row == 256) { /* dead: codes 0 */
#pragma unroll
    for (int o = 0; o < B / 8; ++o) out[o] = 0;
    return sbyte;
  }
  uint4 crow = make_uint4(0, 0, 0, 0);
  if (KVX_FP4_LEAN_THR_C && row >= 0) crow = KVX_FP4_W_SADDR ? lds_u4(thr_a + (unsigned)row * 16u) : thr[row];
  if (row < 0 || (KVX_FP4_LEAN_THR_C ? !(crow.w >> 16) : !thr[2 * row + 1].w)) { /* slow (or d == 0) */
    const Packed<B> pk = encode_slow<B, DT>(FMT, (const uint4*)src, ws.g);
#pragma unroll
    for (int o = 0; o < B / 8; ++o) out[o] = pk.w[o];
    return pk.sbyte;
  }
#pragma unroll
  for (int gi = 0; gi < NG; ++gi) {
    if (KVX_FP4_LEAN_THR_C) {
      thr_codes16_c(w + 8 * gi, crow, out + 2 * gi);
    } else {
      thr_codes16(w + 8 * gi, thr + 2 * row, out + 2 * gi);
    }
  }
  return sbyte;
}

/* DEEP (kvx_cuda::fp4_lean_deep_for): the next row prefetched into L2 (16-bit IO), and the rows split
 * evenly over the warps of a grid of the resident CTAs (the launch caps it); else R rows per warp. */
template <int DT, int FMT, bool DEEP>
__global__ void __launch_bounds__(KVX_FP4_LEAN_THREADS, KVX_FP4_LEAN_MIN_BLOCKS) write_lean_kernel(Params P) {
  kvx_cuda::dependent_entry();
  /* 16-bit IO: the thresholds, two sub-blocks per lane per step; F32: encode16's FP32 codes (the
   * NVFP4 divisors from a table), one sub-block of 4 vectors per lane */
  /* B-value blocks (LeanB), NV vectors each; OCP's 32-value blocks one per lane per step */
  constexpr int ES = Es<DT>::value, B = LeanB<FMT>::value, NV = B * ES / 16,
                NI = ES == 4 || B == 32 ? 1 : KVX_FP4_LEAN_NI16;
  __shared__ uint4 thr_tab[ES == 2 ? 512 : 1];
  __shared__ float2 tab[ES == 4 && FMT == kvx_ref::FP4_NVFP4 ? 2 : 1][128];
  WSide ws[2];
  load_wside(P, ws);
  if (ES == 2) {
    build_thr<DT, FMT, KVX_FP4_LEAN_THR_C>(thr_tab, ws);
  } else if (FMT == kvx_ref::FP4_NVFP4) {
    build_dtab(tab, ws);
  }
  __syncthreads();
  const unsigned lane = threadIdx.x & 31u, thr_a = saddr(thr_tab);
  constexpr unsigned R = KVX_FP4_W_ROWS_B16;
  const unsigned long long warp = ((unsigned long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
  unsigned long long lo = warp * R, hi = lo + R;
  if (DEEP) {
    const unsigned long long nw = (unsigned long long)gridDim.x * blockDim.x >> 5;
    lo = warp * P.rows / nw;
    hi = (warp + 1) * P.rows / nw;
  }
  if (hi > P.rows) hi = P.rows;
#pragma unroll 1
  for (unsigned long long r0 = lo; r0 < hi; r0 += R) {
    const unsigned n = hi - r0 < (unsigned long long)R ? (unsigned)(hi - r0) : R;
    unsigned bl, tl;
    row_slot(P, r0, lane, n, bl, tl);
    const unsigned NS = (unsigned)(P.H * P.J), NQ = (NS + 32u * NI - 1u) / (32u * NI), T = n * NQ;
    const unsigned row_bytes = NS * (unsigned)B * ES;
    uint4 nraw[NI][NV];
    /* side `sd` of step (row i, batch q) into nraw */
    auto load = [&](unsigned i, unsigned sd, unsigned q) {
      load_batch(nraw, P.side[sd].io + (long long)(P.row_begin + r0 + i) * P.side[sd].io_token * ES, q, lane, NS,
                 [](unsigned sb) { return (long long)(sb * (unsigned)B * ES); });
    };
    load(0, 0, 0);
    unsigned i = 0, q = 0;
#pragma unroll 1
    for (unsigned k = 0; k < T; ++k) {
      const unsigned long long row = P.row_begin + r0 + i;
      if (DEEP && ES == 2 && q == 0) {
        const unsigned k2 = lane >> 1, sd = lane & 1u;
        const unsigned ahead = i == 0 ? k2 + 1u : k2 == 0 ? (unsigned)KVX_FP4_PREFETCH_AHEAD : 0u;
        if (lane < 2u * KVX_FP4_PREFETCH_AHEAD && ahead && r0 + i + ahead < P.rows)
          prefetch_l2(P.side[sd].io + (long long)(row + ahead) * P.side[sd].io_token * ES, row_bytes);
      }
      const unsigned b = __shfl_sync(0xFFFFFFFFu, bl, i), t = __shfl_sync(0xFFFFFFFFu, tl, i);
      unsigned ni = i, nq = q + 1;
      if (nq == NQ) {
        nq = 0;
        ++ni;
      }
#pragma unroll
      for (int sd = 0; sd < 2; ++sd) {
        uint4 raw[NI][NV];
#pragma unroll
        for (int m = 0; m < NI; ++m) {
#pragma unroll
          for (int v = 0; v < NV; ++v) raw[m][v] = nraw[m][v];
        }
        if (sd == 0) {
          load(i, 1, q);
        } else if (k + 1 < T) {
          load(ni, 0, nq);
        }
        if (b == kNoBlock) continue;
        const Side& S = P.side[sd];
        const char* io_row = S.io + (long long)row * S.io_token * ES;
        char* code_row = S.codes + ((long long)b * S.c_block + (long long)t * S.c_token) / 2;
        char* sc_row = S.scales + (long long)b * S.s_block + (long long)t * S.s_token;
#pragma unroll
        for (int m = 0; m < NI; ++m) {
          const unsigned sb = q * 32u * NI + lane + 32u * m;
          if (sb < NS) {
            uint32_t out[B / 8], sbyte;
            const char* src = io_row + sb * (unsigned)B * ES;
            if constexpr (ES == 2) {
              const unsigned toff = FMT == kvx_ref::FP4_NVFP4 ? (KVX_FP4_LEAN_THR_C ? 128 : 256) * sd : 0;
              sbyte = encode_lean<DT, FMT, DEEP>((const uint32_t*)raw[m], ws[sd], thr_tab + toff, src, out,
                                                 thr_a + toff * 16u);
            } else {
              bool slow;
              sbyte = encode16<DT, false, FMT, 1>((const uint32_t*)raw[m], ws[sd], 1.0f, FMT == kvx_ref::FP4_NVFP4,
                                                  tab[FMT == kvx_ref::FP4_NVFP4 ? sd : 0], slow, out);
              if (slow) {
                const Packed<16> pk = encode_slow<16, DT>(FMT, (const uint4*)src, ws[sd].g);
                out[0] = pk.w[0];
                out[1] = pk.w[1];
                sbyte = pk.sbyte;
              }
            }
            if constexpr (B == 32) {
              *(uint4*)(code_row + sb * 16u) = make_uint4(out[0], out[1], out[2], out[3]);
            } else {
              *(uint2*)(code_row + sb * 8u) = make_uint2(out[0], out[1]);
            }
            sc_row[sb] = (char)sbyte;
          }
        }
      }
      i = ni;
      q = nq;
    }
  }
}

/* The staged write (KVX_FP4_BULK): the lean write's blocks and codes (encode_lean) from 16-bit IO,
 * with the IO rows brought into shared memory by bulk copies (sm_90) instead of registers. Each
 * warp owns a ring of KVX_FP4_BULK_STAGES stages, one row (both sides) each: lane 0 issues the
 * copies of the next rows while the warp encodes the current one from shared memory, so the bytes
 * in flight no longer depend on the registers a warp holds (the lean kernel keeps one side of one
 * row in flight per warp, at 16 warps per SM). Rows are split evenly over the warps of a grid of
 * the resident CTAs. Taken for OCP MXFP4 and NVFP4 on devices of memory depth 2 or more (the
 * H200: OCP 16-bit writes 79-86 -> 89-91 %, NVFP4 84-86 -> 86-87 %, docs/fp4.md, "Sixteenth round";
 * then the NVFP4 blocks by encode_nv16_lite, +0.3 to +3.0 points, "Twenty-fourth round"); MXFP4's
 * 16-value blocks read within two points of the lean write either way and keep it; on the H100,
 * forced on, every format lost 1-9 points in the sixteenth round. */
#ifndef KVX_FP4_BULK
#define KVX_FP4_BULK 1 /* 0 never; 1 on devices of memory depth KVX_FP4_BULK_MIN_DEPTH or more; needs sm_90 */
#endif
#ifndef KVX_FP4_BULK_MIN_DEPTH
#define KVX_FP4_BULK_MIN_DEPTH 2
#endif
#ifndef KVX_FP4_BULK_MX16
#define KVX_FP4_BULK_MX16 0 /* 1: MXFP4 (16-value blocks) too (at three CTAs per SM: -1.7 to +1.4 points against the \
                                 lean write over eight runs, docs/fp4.md "Twenty-fourth round") */
#endif
#ifndef KVX_FP4_BULK_WARPS
#define KVX_FP4_BULK_WARPS 8 /* warps per CTA, each with its own ring */
#endif
#ifndef KVX_FP4_BULK_STAGES
#define KVX_FP4_BULK_STAGES 2 /* rows in each warp's ring */
#endif
#ifndef KVX_FP4_BULK_CTAS16
#define KVX_FP4_BULK_CTAS16 3 /* 16-value blocks (NVFP4, MXFP4): CTAs per SM the registers must allow, as many as
                                 the rings fit in shared memory (OCP blocks: 2, their codes need 128 registers) */
#endif
#ifndef KVX_FP4_BULK_SB_UNROLL
#define KVX_FP4_BULK_SB_UNROLL 1 /* blocks of a side per unrolled step of a lane (2: within noise, one more register) */
#endif
#ifndef KVX_FP4_BULK_MAX_ROW
#define KVX_FP4_BULK_MAX_ROW 4096 /* bytes of one side's IO row, at most */
#endif

template <int DT, int FMT>
__global__ void __launch_bounds__(32 * KVX_FP4_BULK_WARPS, FMT != kvx_ref::FP4_MXFP4_OCP ? KVX_FP4_BULK_CTAS16 : 2)
    write_bulk_kernel(Params P) {
  kvx_cuda::dependent_entry();
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900 /* the sm_80 build: an empty kernel, never launched */
  constexpr int ES = Es<DT>::value, B = LeanB<FMT>::value, NV = B * ES / 16, S = KVX_FP4_BULK_STAGES;
  constexpr int SBU = KVX_FP4_BULK_SB_UNROLL;
  extern __shared__ __align__(128) unsigned char bulk_ring[];
  __shared__ unsigned long long bar[KVX_FP4_BULK_WARPS][S];
  __shared__ uint4 thr_tab[512];
  WSide ws[2];
  load_wside(P, ws);
  build_thr<DT, FMT, KVX_FP4_LEAN_THR_C>(thr_tab, ws);
  const unsigned lane = threadIdx.x & 31u, wi = threadIdx.x >> 5, thr_a = saddr(thr_tab);
  if (lane == 0) {
#pragma unroll
    for (int s = 0; s < S; ++s) mbar_init(&bar[wi][s], 1);
    mbar_init_fence();
  }
  __syncthreads();
  const unsigned NS = (unsigned)(P.H * P.J), row_bytes = NS * (unsigned)B * ES;
  unsigned char* ring = bulk_ring + (size_t)wi * S * 2 * row_bytes; /* stage s: K's row, then V's */
  const unsigned long long nw = (unsigned long long)gridDim.x * KVX_FP4_BULK_WARPS,
                           warp = (unsigned long long)blockIdx.x * KVX_FP4_BULK_WARPS + wi;
  const unsigned long long lo = warp * P.rows / nw, hi = (warp + 1) * P.rows / nw, nu = hi - lo;
  auto issue = [&](unsigned long long u) { /* lane 0: row lo + u (both sides) into its stage */
    unsigned long long* b = &bar[wi][u % S];
    unsigned char* dst = ring + (size_t)(u % S) * 2 * row_bytes;
    mbar_expect_tx(b, 2 * row_bytes);
#pragma unroll
    for (unsigned sd = 0; sd < 2; ++sd)
      bulk_load(dst + sd * row_bytes, P.side[sd].io + (long long)(P.row_begin + lo + u) * P.side[sd].io_token * ES,
                row_bytes, b);
  };
  if (lane == 0)
    for (unsigned long long u = 0; u < nu && u < S; ++u) issue(u);
#pragma unroll 1
  for (unsigned long long r0 = lo; r0 < hi; r0 += 32) {
    const unsigned n = hi - r0 < 32ull ? (unsigned)(hi - r0) : 32u;
    unsigned bl, tl;
    row_slot(P, r0, lane, n, bl, tl);
#pragma unroll 1
    for (unsigned i = 0; i < n; ++i) {
      const unsigned long long r = r0 + i, row = P.row_begin + r, u = r - lo;
      const unsigned b = __shfl_sync(0xFFFFFFFFu, bl, i), t = __shfl_sync(0xFFFFFFFFu, tl, i);
      const unsigned st = (unsigned)(u % S);
      mbar_wait(&bar[wi][st], (unsigned)(u / S) & 1u);
      if (b != kNoBlock) {
#pragma unroll
        for (int sd = 0; sd < 2; ++sd) {
          const Side& Sd = P.side[sd];
          const uint4* src_s = (const uint4*)(ring + ((size_t)st * 2 + sd) * row_bytes);
          const char* io_row = Sd.io + (long long)row * Sd.io_token * ES;
          /* fast_ok: c_block and c_token are multiples of B, so the nibble offset is even and >> 1 halves it */
          char* code_row = Sd.codes + (((long long)b * Sd.c_block + (long long)t * Sd.c_token) >> 1);
          char* sc_row = Sd.scales + (long long)b * Sd.s_block + (long long)t * Sd.s_token;
          const unsigned toff = FMT == kvx_ref::FP4_NVFP4 ? (KVX_FP4_LEAN_THR_C ? 128 : 256) * sd : 0;
          const uint4* thr = thr_tab + toff;
#pragma unroll SBU
          for (unsigned sb = lane; sb < NS; sb += 32u) {
            uint4 raw[NV];
#pragma unroll
            for (int v = 0; v < NV; ++v) raw[v] = src_s[sb * NV + v];
            uint32_t out[B / 8];
            const uint32_t sbyte =
                encode_lean<DT, FMT, true, KVX_FP4_BULK_NV_LITE>((const uint32_t*)raw, ws[sd], thr,
                                                                 io_row + sb * (unsigned)B * ES, out, thr_a + toff * 16u);
            if constexpr (B == 32) {
              *(uint4*)(code_row + sb * 16u) = make_uint4(out[0], out[1], out[2], out[3]);
            } else {
              *(uint2*)(code_row + sb * 8u) = make_uint2(out[0], out[1]);
            }
            sc_row[sb] = (char)sbyte;
          }
        }
      }
      __syncwarp(); /* every lane is done with stage st before lane 0 refills it */
      if (lane == 0 && u + S < nu) {
        fence_proxy_async();
        issue(u + S);
      }
    }
  }
#endif
}

/* Decode-sized writes (at most KVX_FP4_FAST_MIN_ROWS rows, the fast kernels' layouts): one thread
 * per (row, side, head, scale block), as the per-block kernel, but every load known at entry is
 * issued at once (the slot, the block's IO words, the NVFP4 global scale), the block is encoded by
 * the fast kernels' encode16 (encode_slow for the blocks it leaves) while the slot is in flight,
 * and only the stores wait for it: one memory round trip, then the encoding's chain, then the
 * stores (docs/cuda-reference.md, "Decode-sized calls"). */
template <int B, int DT, int FMT>
__global__ void __launch_bounds__(256) write_decode_kernel(const __grid_constant__ Params P) {
  kvx_cuda::dependent_entry();
  constexpr int ES = Es<DT>::value, NG = B / 16, NV = B * ES / 16;
  const unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= P.items) return;
  const Item it = split(P, i);
  const Side& S = P.side[it.side];
  const long long slot = P.slot64 ? __ldg((const long long*)P.slots + it.row) : (long long)__ldg((const int*)P.slots + it.row);
  const uint4* src = (const uint4*)(S.io + (it.row * S.io_token + it.h * S.io_head + (long long)it.j * B) * ES);
  uint32_t w[NV * 4];
  load_words<NV>(src, w);
  const float g = FMT == kvx_ref::FP4_NVFP4 && S.g ? __ldg(S.g_per_head ? S.g + it.h : S.g) : 1.0f;
  WSide ws;
  ws.g = g;
  ws.g_ok = 0;
  ws.sixg = ws.r6 = 0.0f;
  uint32_t out[B / 8];
  bool slow = false;
  uint32_t sbyte = encode16<DT, false, FMT, NG>(w, ws, g, false, nullptr, slow, out);
  if (slow) {
    const Packed<B> pk = encode_slow<B, DT>(FMT, src, g);
    sbyte = pk.sbyte;
#pragma unroll
    for (int o = 0; o < B / 8; ++o) out[o] = pk.w[o];
  }
  if (slot < 0 || slot == P.invalid_slot || (unsigned long long)slot >= P.num_slots) return;
  unsigned long long b, t;
  split_slot(P, slot, b, t);
  const long long c0 = b * S.c_block + t * S.c_token + it.h * S.c_head + (long long)it.j * B; /* nibbles */
  S.scales[b * S.s_block + t * S.s_token + it.h * S.s_head + it.j * S.s_dim] = (char)sbyte;
  if (B == 16) {
    *(uint2*)(S.codes + c0 / 2) = make_uint2(out[0], out[1]);
  } else {
    *(uint4*)(S.codes + c0 / 2) = make_uint4(out[0], out[1], out[2], out[3]);
  }
}

/* The kernel of a write: per-block (pick) or fast (pick_fast), by block size, IO dtype and format. */
template <int B>
Kernel pick_dt(int dt) {
  switch (dt) {
    case KVX_DTYPE_F16:
      return write_kernel<B, KVX_DTYPE_F16>;
    case KVX_DTYPE_BF16:
      return write_kernel<B, KVX_DTYPE_BF16>;
    case KVX_DTYPE_F32:
      return write_kernel<B, KVX_DTYPE_F32>;
    default:
      return write_kernel<B, 0>;
  }
}

Kernel pick(const Params& P) {
  const int dt = P.raw ? 0 : P.io_dtype;
  return P.B == 32 ? pick_dt<32>(dt) : pick_dt<16>(dt);
}

/* The fast and the decode-sized write kernels share one dispatch: block size and format
 * (16-value NVFP4 or MXFP4, 32-value OCP MXFP4), then the IO dtype (F16, BF16, F32). */
template <int B, int DT, int FMT>
struct FastKernel {
  static constexpr Kernel k = write_fast_kernel<B, DT, FMT>;
};
template <int B, int DT, int FMT>
struct DecodeKernel {
  static constexpr Kernel k = write_decode_kernel<B, DT, FMT>;
};

template <template <int, int, int> class K, int B, int FMT>
Kernel pick_io(int dt) {
  switch (dt) {
    case KVX_DTYPE_F16:
      return K<B, KVX_DTYPE_F16, FMT>::k;
    case KVX_DTYPE_BF16:
      return K<B, KVX_DTYPE_BF16, FMT>::k;
    default:
      return K<B, KVX_DTYPE_F32, FMT>::k;
  }
}

template <template <int, int, int> class K>
Kernel pick_format(const Params& P) {
  if (P.B == 32) return pick_io<K, 32, kvx_ref::FP4_MXFP4_OCP>(P.io_dtype);
  return P.format == kvx_ref::FP4_NVFP4 ? pick_io<K, 16, kvx_ref::FP4_NVFP4>(P.io_dtype)
                                        : pick_io<K, 16, kvx_ref::FP4_MXFP4>(P.io_dtype);
}

Kernel pick_fast(const Params& P) { return pick_format<FastKernel>(P); }

/* The lean write's kernel, or nullptr where it does not apply (module comment above it), `deep`
 * set to its DEEP form (kvx_cuda::fp4_lean_deep_for: memory depth 2 or more). Taken for 16-value
 * blocks from F32 IO (NVFP4 74.9 -> 90.4-90.8 % of copy on the H200, 90.4-90.6 -> 96.4 % on the
 * H100; MXFP4 +0.2 to +1.3 points) and from F16/BF16 on every device, where the general kernel's
 * per-block branches bound the writes by latency (H200: NVFP4 67 -> 84 %, MXFP4 71.5 -> 81 %;
 * H100: NVFP4 86-87 -> 93 %, MXFP4 89-89.6 -> 93.4 %); for OCP's 32-value blocks from BF16 at
 * depth 2 or more (KVX_FP4_LEAN_OCP). The DEEP form on the H200: 16-bit writes 79 -> 84 % with
 * the prefetch, then +1.5 to +2 points with the fitted grid (F32 +1.2); on the H100 both lose
 * (prefetch: 93 -> 85-88.6 %; grid: -0.2 to -1). docs/fp4.md, "Tenth round" and "Eleventh round". */
template <int DT, int FMT>
Kernel lean_kernel(bool deep) {
  return deep ? write_lean_kernel<DT, FMT, true> : write_lean_kernel<DT, FMT, false>;
}

Kernel pick_lean(const Params& P, bool& deep) {
  deep = false;
  if (!KVX_FP4_LEAN || !lin_ok(P)) return nullptr;
  const int depth = kvx_cuda::memory_depth();
  deep = kvx_cuda::fp4_lean_deep_for(depth);
  const bool f16 = P.io_dtype == KVX_DTYPE_F16;
  if (P.B == 32) { /* OCP MXFP4 */
    const bool ocp_lean = P.io_dtype == KVX_DTYPE_BF16 ? KVX_FP4_LEAN_OCP >= 1 : f16 && KVX_FP4_LEAN_OCP >= 2;
    if (depth < 2 || !ocp_lean) return nullptr;
    constexpr int OCP = kvx_ref::FP4_MXFP4_OCP;
    return f16 ? lean_kernel<KVX_DTYPE_F16, OCP>(deep) : lean_kernel<KVX_DTYPE_BF16, OCP>(deep);
  }
  const bool nv = P.format == kvx_ref::FP4_NVFP4;
  if (nv && (P.side[0].g_per_head || P.side[1].g_per_head)) return nullptr;
  constexpr int NV = kvx_ref::FP4_NVFP4, MX = kvx_ref::FP4_MXFP4;
  if (P.io_dtype == KVX_DTYPE_F32) {
    if (!(nv ? KVX_FP4_LEAN_F32 & 1 : KVX_FP4_LEAN_F32 & 2)) return nullptr;
    return nv ? lean_kernel<KVX_DTYPE_F32, NV>(deep) : lean_kernel<KVX_DTYPE_F32, MX>(deep);
  }
  if (!KVX_FP4_THR || (!nv && !KVX_FP4_THR_MX16) || depth < KVX_FP4_LEAN_MIN_DEPTH) return nullptr;
  if (f16) return nv ? lean_kernel<KVX_DTYPE_F16, NV>(deep) : lean_kernel<KVX_DTYPE_F16, MX>(deep);
  return nv ? lean_kernel<KVX_DTYPE_BF16, NV>(deep) : lean_kernel<KVX_DTYPE_BF16, MX>(deep);
}
Kernel pick_decode(const Params& P) { return pick_format<DecodeKernel>(P); }
/* The staged write's kernel and its dynamic shared memory, or nullptr where it does not apply
 * (module comment above it): 16-bit IO, NVFP4 without per-head g or OCP MXFP4 (MXFP4 too with
 * KVX_FP4_BULK_MX16), heads packed, every IO row 16-byte aligned and at most KVX_FP4_BULK_MAX_ROW
 * bytes, a device of compute capability 9 or more and memory depth KVX_FP4_BULK_MIN_DEPTH or more. */
Kernel pick_bulk(const Params& P, int& smem) {
  smem = 0;
  if (!KVX_FP4_BULK || !lin_ok(P) || kvx_cuda::memory_depth() < KVX_FP4_BULK_MIN_DEPTH) return nullptr;
  if (P.io_dtype != KVX_DTYPE_F16 && P.io_dtype != KVX_DTYPE_BF16) return nullptr;
  if (P.format == kvx_ref::FP4_NVFP4 && (P.side[0].g_per_head || P.side[1].g_per_head)) return nullptr;
  if (P.format != kvx_ref::FP4_NVFP4 && P.B != 32 && !KVX_FP4_BULK_MX16) return nullptr; /* MXFP4 */
  if (!bulk_capable()) return nullptr;
  const unsigned long long row_bytes = (unsigned long long)P.H * P.J * P.B * P.io_esize;
  if (row_bytes > KVX_FP4_BULK_MAX_ROW || row_bytes % 16) return nullptr;
  for (int i = 0; i < 2; ++i)
    if (!aligned(P.side[i].io, 16) || (P.side[i].io_token * P.io_esize) % 16) return nullptr;
  smem = (int)(KVX_FP4_BULK_WARPS * KVX_FP4_BULK_STAGES * 2 * row_bytes);
  constexpr int NV = kvx_ref::FP4_NVFP4, MX = kvx_ref::FP4_MXFP4, OCP = kvx_ref::FP4_MXFP4_OCP;
  const bool f16 = P.io_dtype == KVX_DTYPE_F16;
  if (P.B == 32) return f16 ? write_bulk_kernel<KVX_DTYPE_F16, OCP> : write_bulk_kernel<KVX_DTYPE_BF16, OCP>;
  if (P.format == NV) return f16 ? write_bulk_kernel<KVX_DTYPE_F16, NV> : write_bulk_kernel<KVX_DTYPE_BF16, NV>;
  return f16 ? write_bulk_kernel<KVX_DTYPE_F16, MX> : write_bulk_kernel<KVX_DTYPE_BF16, MX>;
}


/* Dynamic shared memory of the fast write: the ASYNC staging ring (16-bit IO; 64 bytes per lane per step). */
int write_smem(const Params& P, unsigned threads) {
  if (P.io_dtype == KVX_DTYPE_F32) return 0;
  const bool async = P.B == 32 ? KVX_FP4_W32_ASYNC && KVX_FP4_W32_WHOLE : KVX_FP4_W16_ASYNC && KVX_FP4_W16_NI_16 == 2;
  return async ? (int)(threads / 32) * (P.B == 32 ? KVX_FP4_W32_STAGES : KVX_FP4_W16_STAGES) * 32 * 4 * 16 : 0;
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
   * rows) takes one thread per (row, side, head, scale block): 256 rows took 82 us on the row
   * kernel; write_decode_kernel where the fast kernels' layouts hold, else the per-block kernel
   * (docs/cuda-reference.md, "Decode-sized calls") */
  if (fast_ok(P) && plan.num_tokens > (unsigned long long)KVX_FP4_FAST_MIN_ROWS) {
    int smem;
    if (const Kernel bulk = pick_bulk(P, smem))
      return launch_persistent(bulk, P, plan.num_tokens, 32 * KVX_FP4_BULK_WARPS, smem, (cudaStream_t)stream);
    bool deep;
    if (const Kernel lean = pick_lean(P, deep)) {
      unsigned long long rpc = KVX_FP4_LEAN_THREADS / 32 * KVX_FP4_W_ROWS_B16; /* rows per CTA */
      if (deep) { /* at most the resident CTAs */
        const unsigned long long warps = (plan.num_tokens + KVX_FP4_W_ROWS_B16 - 1) / KVX_FP4_W_ROWS_B16;
        const unsigned long long cap =
            (unsigned long long)kvx_cuda::grid_for_warps((const void*)lean, warps, true, KVX_FP4_LEAN_THREADS);
        const unsigned long long even = (plan.num_tokens + cap - 1) / cap;
        if (even > rpc) rpc = even;
      }
      return launch_fast(lean, P, plan.num_tokens, (cudaStream_t)stream, KVX_FP4_LEAN_THREADS, 0, (unsigned)rpc);
    }
    const unsigned threads = P.io_dtype == KVX_DTYPE_F32 ? 256u : (unsigned)KVX_FP4_W16_THREADS;
    return launch_fast(pick_fast(P), P, plan.num_tokens, (cudaStream_t)stream, threads, write_smem(P, threads),
                       threads / 32 * write_rows_per_warp(P.B, P.io_esize));
  }
  if (KVX_FP4_DECODE && fast_ok(P)) return launch(pick_decode(P), P, plan.num_tokens, (cudaStream_t)stream);
  return launch(pick(P), P, plan.num_tokens, (cudaStream_t)stream);
}

}  // namespace kvx_ref
