/*
 * fp4_fast.h -- the few exact FP4 encoding steps of the fast CUDA kernels
 * (move_fp4_write.cu, move_fp4_gather.cu), written so that the host can check them against fp4.h /
 * convert.h on every input they are used for (csrc/tests/fp4_fast_check.cpp,
 * exhaustive). They replace branchy integer code by FP32 additions on the
 * GPU's FMA pipe where that is exact:
 *
 *   e2m1_f16(a)   a >= 0, not NaN (inf allowed): the FP32 value h * 2^-14, h
 *                 the E2M1 value of fp4.h's f32_to_e2m1(a) (round to nearest,
 *                 ties to the even code, saturating at 6). h * 2^-14 is exactly
 *                 an F16 whose bits are (code << 9), so one packed F16
 *                 conversion of two such values gives two codes. Below 1 the
 *                 FP32 addition of 2^22 rounds to the 0.5 grid (ties to even
 *                 on the codes); from 1 Veltkamp's splitting with 2^22 + 1
 *                 rounds to two significant bits, to nearest, ties to even
 *                 (c = RN(a (2^22+1)), RN(c - RN(c - a))); above 6 (inf too)
 *                 min(., 6) saturates (fminf drops the NaN that inf makes).
 *   e2m1_f16_scaled(s)  the same from s = a * 2^-14, in five instructions
 *                 (see below).
 *   e4m3_pos(w)   w in [0, 448]: convert.h's f32_to_e4m3(w) (RNE, subnormals)
 *                 by the addition of 2^14 below 2^-6 and integer RNE on the
 *                 bits above.
 *   e4m3_pos_f32(s)  s in [0, 0x7E]: e4m3_to_f32(s) without the loop.
 *   e4m3_sat(w)   w >= 0 finite: f32_to_e4m3(min(w, 448)); on sm_89+ the
 *                 hardware conversion cvt.rn.satfinite.e4m3x2.f32 (checked
 *                 against f32_to_e4m3 on every such w on an H100 by
 *                 tools/fp4_gpu_check.sh E4M3CHECK=1), elsewhere e4m3_pos.
 *   e2m1_h<A>(s)  the MXFP4 writes' E2M1 step in F16 arithmetic, two values
 *                 per instruction (A = H2Ops on the GPU, HostF16 in the check):
 *                 for an F16 s >= 0, its F16 bits are f32_to_e2m1(s) << 9.
 *                 The MXFP4 scale is a power of two, so s = |x| 2^-e is exact
 *                 in F16 wherever the code depends on it (s >= 2^-14; below,
 *                 any rounding stays under the first tie 0.25).
 *   nv_ab / nv_pair_entry  the NVFP4 gathers into F16/BF16 by packed products:
 *                 2^k times the block's A or B (below, at their definition);
 *                 nv_alu_word the same operands by byte permutes, no table;
 *                 e2m1_word_scaled two E2M1 values by byte permutes (MX gathers).
 *   ScaleBits, MxPairs  the gathers' tables of scale bytes (FP32 bits) and of code bytes (two
 *                 E2M1 values in F16 / BF16), built at compile time.
 */
#ifndef KVX_REFERENCE_CUDA_FP4_FAST_H
#define KVX_REFERENCE_CUDA_FP4_FAST_H

#include <stdint.h>
#include <string.h>

#if defined(__CUDACC__)
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#endif

#include "convert.h"

#if defined(__CUDA_ARCH__)
#define KVX_FADD(a, b) __fadd_rn(a, b)
#define KVX_FSUB(a, b) __fsub_rn(a, b)
#define KVX_FMUL(a, b) __fmul_rn(a, b)
#define KVX_FFMA(a, b, c) __fmaf_rn(a, b, c)
#define KVX_FMIN(a, b) fminf(a, b)
#define KVX_FMAX(a, b) fmaxf(a, b)
#else
#include <math.h>
#define KVX_FADD(a, b) ((a) + (b))
#define KVX_FSUB(a, b) ((a) - (b))
#define KVX_FMUL(a, b) ((a) * (b))
#define KVX_FFMA(a, b, c) fmaf(a, b, c)
#define KVX_FMIN(a, b) fminf(a, b)
#define KVX_FMAX(a, b) fmaxf(a, b)
#endif

namespace kvx_fp4_fast {

KVX_HD inline float e2m1_f16(float a) {
  const float hA = KVX_FSUB(KVX_FADD(a, 4194304.0f), 4194304.0f);
  const float c = KVX_FFMA(a, 4194304.0f, a);
  const float hB = KVX_FSUB(c, KVX_FSUB(c, a));
  const float h = KVX_FMIN(a < 1.0f ? hA : hB, 6.0f);
  return KVX_FMUL(h, 6.103515625e-05f); /* 2^-14 */
}

/* e2m1_f16 of a = s * 2^14, given s (the kernels fold the 2^-14 into the
 * divisor or the exponent): for every FP32 a >= 0 (not NaN) and s = RN(a *
 * 2^-14), the F16 bits of e2m1_f16_scaled(s) are f32_to_e2m1(a) << 9 (below
 * 2^-112, where s loses bits, a < 0.25 and the code is 0). Five FP32-pipe
 * instructions: P = 2^floor(log2(max(s, 2^-14))) (the exponent bits), so the
 * E2M1 step is P / 2 (0.5 below a = 1, two significant bits above);
 * c = RN(P 2^22 + s) rounds s to that step, ties to the even multiple (the
 * power of two P 2^22 fixes c's binade, whose ulp is P / 2), which is the
 * even code; c - P 2^22 is exact; min(., 6 2^-14) saturates (when P 2^22
 * overflows, c and the difference are inf or NaN, and min gives 6 2^-14). */
KVX_HD inline float e2m1_f16_scaled(float s) {
  const float m = KVX_FMAX(s, 6.103515625e-05f);
  const float p = kvx_ref::bits_to_f32(kvx_ref::f32_to_bits(m) & 0x7F800000u);
  const float c = KVX_FFMA(p, 4194304.0f, s);
  return KVX_FMIN(KVX_FFMA(-p, 4194304.0f, c), 3.662109375e-04f); /* 2^-14, 6 * 2^-14 */
}

KVX_HD inline uint32_t e4m3_pos(float w) {
  const uint32_t a = kvx_ref::f32_to_bits(w);
  if (a < 0x3C800000u) return kvx_ref::f32_to_bits(KVX_FADD(w, 16384.0f)) - 0x46800000u;
  return ((a + 0x7FFFFu + ((a >> 20) & 1u)) >> 20) - 960u;
}

KVX_HD inline float e4m3_pos_f32(uint32_t s) {
  if (s >= 8u) return kvx_ref::bits_to_f32((s << 20) + (120u << 23));
  return KVX_FSUB(kvx_ref::bits_to_f32((s << 20) + (121u << 23)), 0.015625f);
}

#ifndef KVX_FP4_HW_E4M3
#define KVX_FP4_HW_E4M3 1 /* 0: the integer form on every GPU */
#endif

KVX_HD inline uint32_t e4m3_sat(float w) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890 && KVX_FP4_HW_E4M3
  unsigned short h;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %1;" : "=h"(h) : "f"(w));
  return h & 0xFFu;
#else
  return e4m3_pos(w < 448.0f ? w : 448.0f);
#endif
}

/* E2M1 thresholds: the code magnitude of a non-negative 16-bit (F16 or BF16)
 * value v in a block of divisor d > 0 (NVFP4: float(s) g; MXFP4: 2^e) is
 * f32_to_e2m1(RN(v / d)) & 7, monotone in v, so it is the number of k in 1..7
 * with v >= B_k, B_k the least 16-bit value whose code is k or more. The code
 * reaches k when RN(v / d) passes the midpoint M_k (0.25 0.75 1.25 1.75 2.5 3.5
 * 5): `>` where the code below M_k is even, `>=` where odd (fp4.h
 * f32_to_e2m1). Every M_k has an even FP32 significand, so a tie of the FP32
 * rounding goes to M_k: RN(y) >= M_k iff y >= M_k - u/2 (u the FP32 ulp below
 * M_k), RN(y) > M_k iff y > M_k + u'/2 (u' the ulp above), for every real y.
 * With y = v / d: v >= d c_k or v > d c_k, c_k below; d c_k is exact in
 * double (24 + 27 significant bits) and never a 16-bit value (its significand
 * is the product of d's odd one and c_k's, 25 to 27 bits long), so both are
 * v >= B_k with B_k the 16-bit ceiling of d c_k. The kernels compare 16-bit
 * magnitudes as F16 (the bits of both formats are ordered alike up to 0x7C00,
 * F16 inf), and their fast-path magnitudes are at most 0x7C00 (F16: finite;
 * BF16: NVFP4 amax < 2^60, MXFP4 through the F16 max, which sends any block
 * with a magnitude above 0x7C00 to the slow path), so a B_k above 0x7C00 (above
 * the F16 range, or a BF16 beyond 2^121) is 0x7FFF, an F16 NaN, which no
 * compare passes. */
KVX_HD inline double e2m1_bound(int k) { /* c_k, k = 1..7 */
  const double m[7] = {0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0};
  const double h[7] = {0x1p-26, -0x1p-25, 0x1p-24, -0x1p-24, 0x1p-23, -0x1p-23, 0x1p-22};
  return m[k - 1] + h[k - 1];
}

/* The least 16-bit value (bits; BF: BF16, else F16) >= L, for a finite L > 0
 * (0x7FFF when above 0x7C00, above). The GPU rounds up in hardware; the host by
 * round-to-nearest and one step up when that fell below L. */
template <bool BF>
KVX_HD inline uint32_t ceil16(double L) {
#if defined(__CUDA_ARCH__)
  const float f = __double2float_ru(L);
  uint32_t h;
  if (BF) {
    h = __bfloat16_as_ushort(__float2bfloat16_ru(f));
  } else {
    h = __half_as_ushort(__float2half_ru(f));
  }
#else
  float f = (float)L;
  if ((double)f < L) f = kvx_ref::bits_to_f32(kvx_ref::f32_to_bits(f) + 1u);
  uint32_t h = BF ? kvx_ref::f32_to_bf16(f) : kvx_ref::f32_to_f16(f);
  if ((BF ? kvx_ref::bf16_to_f32((uint16_t)h) : kvx_ref::f16_to_f32((uint16_t)h)) < f) ++h;
#endif
  return h <= 0x7C00u ? h : 0x7FFFu;
}

/* B_1..B_7 (above) for divisor d (finite, > 0), each in both halves of a word. */
template <bool BF>
KVX_HD inline void e2m1_thresholds(float d, uint32_t* t) {
  for (int k = 1; k <= 7; ++k) {
    const uint32_t h = ceil16<BF>((double)d * e2m1_bound(k));
    t[k - 1] = h | (h << 16);
  }
}

/* The code magnitude from the thresholds (the host's reading of the kernels'
 * packed compares): the number of B_k <= a, a a 16-bit magnitude up to 0x7C00. */
KVX_HD inline uint32_t e2m1_count(uint32_t a, const uint32_t* t) {
  uint32_t n = 0;
  for (int k = 0; k < 7; ++k) n += a >= (t[k] & 0xFFFFu);
  return n;
}

/* e2m1_h(s), six F16 operations (the checks: csrc/tests/fp4_fast_check.cpp,
 * every F16 s = RN16(|x| 2^-e) of an F16 x and e in [-15, 14], and of an
 * FP32 RN(|x| 2^-e) of a BF16 x and e in [-127, 127]): m = min(s, 6)
 * saturates; p = 2^floor(log2(max(m, 1))) (the exponent bits), so the E2M1
 * step is p / 2 (0.5 below 2, 1 on [2, 4), 2 on [4, 6]); c = RN(p 2^9 + m)
 * rounds m to that step, ties to the even multiple (F16 has 10 fraction bits,
 * so the binade of p 2^9 has ulp p / 2), which is the even code; c - p 2^9 is
 * exact, and so is the product by 2^-14, whose F16 bits are then code << 9
 * (0.5 2^-14 is the subnormal 0x0200). A: min, max, expo (the exponent bits),
 * fma, neg, mul and c(v) (a constant) on its value type T. */
template <class A>
KVX_HD inline typename A::T e2m1_h(typename A::T s) {
  const typename A::T m = A::min(s, A::c(6.0f));
  const typename A::T p = A::expo(A::max(m, A::c(1.0f)));
  const typename A::T c = A::fma(p, A::c(512.0f), m);
  return A::mul(A::fma(A::neg(p), A::c(512.0f), c), A::c(6.103515625e-05f));
}

/* NVFP4 gathers into F16/BF16 by packed products (move_fp4_gather.cu, KVX_FP4_G_NV_PAIRS; the
 * check: csrc/tests/fp4_fast_check.cpp part 8). The oracle's value is RN_T(RN32((v sf) g)), T
 * the output type, v the E2M1 value and sf the E4M3 scale, v sf exact in FP32. v = m 2^k with
 * m in {1, 1.5} and k in [-1, 2], and 1.5 sf is exact too, so the value is 2^k RN_T(RN32((m sf)
 * g)) wherever neither rounding meets a subnormal or an overflow: rounding to nearest commutes
 * with a power of two there. Per block two magnitudes, A = RN_T(RN32(sf g)) and
 * B = RN_T(RN32((1.5 sf) g)); per code byte one packed product of its two values' signed 2^k by
 * A or B (a byte permute of the word A | B << 16), exact in T. nv_ab gives that word and whether
 * the block may take it: |RN32(sf g)| >= 2^-13 (F16) or 2^-125 (BF16), so every 2^-1 A and its
 * FP32 step are normal, and A is finite. Above, a product 2^k M overflows exactly where the
 * oracle's value does: M >= 2^-k V, V T's overflow bound (F16 65520, BF16 2^127 (2 - 2^-8)),
 * means RN32((m sf) g) >= 2^-k V, a power of two times a value FP32 holds, so the oracle's
 * 2^k-fold FP32 value reaches V too; B may be inf (its codes have k >= 0), A may not (2^-1 A
 * and a zero code's 0 x A, where the oracle has a finite value and 0). NaN, inf and zero
 * products fail one test and take the FP32 path. */
template <bool BF>
KVX_HD inline bool nv_ab(float sf, float g, uint32_t* ab) {
  const float y1 = KVX_FMUL(sf, g), y15 = KVX_FMUL(KVX_FMUL(1.5f, sf), g);
#if defined(__CUDA_ARCH__)
  if (BF) {
    const __nv_bfloat162 h = __floats2bfloat162_rn(y1, y15);
    memcpy(ab, &h, 4);
  } else {
    const __half2 h = __floats2half2_rn(y1, y15);
    memcpy(ab, &h, 4);
  }
#else
  *ab = BF ? (uint32_t)kvx_ref::f32_to_bf16(y1) | ((uint32_t)kvx_ref::f32_to_bf16(y15) << 16)
           : (uint32_t)kvx_ref::f32_to_f16(y1) | ((uint32_t)kvx_ref::f32_to_f16(y15) << 16);
#endif
  return fabsf(y1) >= (BF ? 0x1p-125f : 0x1p-13f) && (*ab & 0x7FFFu) < (BF ? 0x7F80u : 0x7C00u);
}

/* The table entry of code byte `byte` (low nibble the even value, as fp4.h's fp4_even): *mul
 * holds each value's signed 2^k in T (0 for a zero code), *sel the byte permute that puts A or
 * B under it (0x10: A, the low half; 0x32: B). */
template <bool BF>
KVX_HD constexpr void nv_pair_entry(uint32_t byte, uint32_t* mul, uint32_t* sel) {
  *mul = 0;
  *sel = 0;
  for (int half = 0; half < 2; ++half) {
    const uint32_t c = (byte >> (4 * half)) & 15u, mag = c & 7u;
    /* E2M1 magnitudes 0 0.5 1 1.5 2 3 4 6: their 2^k (exponent bits of T) and whether m = 1.5 */
    const uint32_t k2 = mag == 0u ? 0u : mag == 1u ? 1u : mag <= 3u ? 2u : mag <= 5u ? 3u : 4u; /* k + 2 */
    const uint32_t bias = BF ? 127u : 15u, shift = BF ? 7u : 10u;
    const uint32_t bits = (mag ? (bias + k2 - 2u) << shift : 0u) | ((c & 8u) ? 0x8000u : 0u);
    const uint32_t pick = (mag == 3u || mag == 5u || mag == 7u) ? 0x32u : 0x10u;
    *mul |= bits << (16 * half);
    *sel |= pick << (8 * half);
  }
}

/* prmt.b32 in its default mode: byte i of the result is byte (c >> 4i) & 7 of b:a (a the low word),
 * or, where bit 3 of that selector nibble is set, that byte's top bit in all eight bits. */
KVX_HD inline uint32_t prmt(uint32_t a, uint32_t b, uint32_t c) {
#if defined(__CUDA_ARCH__)
  uint32_t d;
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  return d;
#else
  const unsigned long long x = (unsigned long long)b << 32 | a;
  uint32_t d = 0;
  for (int i = 0; i < 4; ++i) {
    const uint32_t s = (c >> (4 * i)) & 15u;
    uint32_t byte = (uint32_t)(x >> (8 * (s & 7u))) & 0xFFu;
    if (s & 8u) byte = (byte & 0x80u) ? 0xFFu : 0u;
    d |= byte << (8 * i);
  }
  return d;
#endif
}

/* nv_pair_entry's two operands computed instead of loaded (KVX_FP4_G_NV_ALU): for the code word
 * cw (eight E2M1 values, value i in bits 4i..4i+3) and its word kk (values 2kk and 2kk + 1, the
 * low and the high half), *mul gets each value's signed 2^k in T and *op the half of ab = A | B << 16
 * that the entry picks, so mul2(*mul, *op) is the entry's product. The two halves are apart by one
 * byte permute: w holds value 2kk in bits 0..3 and value 2kk + 1 in bits 16..19; the exponent
 * field of 2^k is bias - 1 + (mag >> 1) (mag the value's three magnitude bits), the sign bit 3
 * moved to 15. A zero code (mag 0) gets 2^-1 instead of 0 and, as its operand, A's signed zero
 * (the low half of zab = ab & 0x80008000): the same signed zero as the entry's 0 x A. The operand
 * is a byte permute of ab:zab by the selector `sel` that nv_alu_sels gives the word: a table of the
 * eight magnitudes in one more permute (0x54: zab's low half, 0x10: A, 0x32: B for 1.5 x 2^k). */
/* Values 2kk and 2kk + 1 of the code word cw (value i in bits 4i..4i+3) in bits 0..3 and 16..19 of
 * one word, by one byte permute of cw and cw >> 4 (the other bits are not zero). */
template <int kk>
KVX_HD inline uint32_t nibble_pair(uint32_t cw) {
  return prmt(cw, cw >> 4, (uint32_t)(kk * 0x11 + (4 + kk) * 0x1100));
}

/* The E2M1 values of word kk of the code word cw, in T times 2^-14 (F16) or 2^-126 (BF16): each
 * value's sign and three magnitude bits become T's sign, two lowest exponent bits and first
 * mantissa bit (0.5, magnitude 1, a subnormal of T), so one exact packed product by 2^14 or 2^126
 * gives the values themselves (KVX_FP4_G_MX_ALU). */
template <bool BF, int kk>
KVX_HD inline uint32_t e2m1_word_scaled(uint32_t cw) {
  const uint32_t w = nibble_pair<kk>(cw);
  return (w & 0x00070007u) * (BF ? 64u : 512u) | ((w << 12) & 0x80008000u);
}

template <bool BF, int kk>
KVX_HD inline void nv_alu_word(uint32_t cw, uint32_t sel, uint32_t ab, uint32_t zab, uint32_t* mul, uint32_t* op) {
  const uint32_t w = nibble_pair<kk>(cw);
  const uint32_t field = (w & 0x00060006u) * (BF ? 64u : 512u) + (BF ? 0x3F003F00u : 0x38003800u);
  *mul = field | ((w << 12) & 0x80008000u);
  *op = prmt(ab, zab, sel);
}

/* The selectors of nv_alu_word's four words: word kk's is s[kk >> 1] >> (16 (kk & 1)) (a byte
 * permute reads the low 16 bits of its selector). */
KVX_HD inline void nv_alu_sels(uint32_t cw, uint32_t s[2]) {
  const uint32_t m7 = cw & 0x77777777u;
  s[0] = prmt(0x32101054u, 0x32103210u, m7);
  s[1] = prmt(0x32101054u, 0x32103210u, m7 >> 16);
}

/* Every code byte's nv_pair_entry, built at compile time: w[2k] its mul, w[2k + 1] its sel (the
 * gathers copy it into shared memory, 16 bytes a thread). */
template <bool BF>
struct NvPairs {
  alignas(16) uint32_t w[512];
  constexpr NvPairs() : w() {
    for (uint32_t k = 0; k < 256; ++k) nv_pair_entry<BF>(k, &w[2 * k], &w[2 * k + 1]);
  }
};

/* The FP32 bits of a scale byte, kvx_ref::fp4_scale_f32's value: E4M3 (NVFP4; 0x7F and 0xFF its NaN,
 * the subnormals m 2^-9) or UE8M0 (MX; 0xFF NaN, 0 its 2^-127). In integers, for compile time. */
constexpr uint32_t e4m3_bits(uint32_t b) {
  const uint32_t s = (b >> 7) << 31, e = (b >> 3) & 15u, m = b & 7u;
  if (e == 15u && m == 7u) return s | 0x7FC00000u;
  if (e) return s | ((e + 120u) << 23) | (m << 20);
  if (!m) return s;
  const uint32_t p = m >= 4u ? 2u : m >= 2u ? 1u : 0u; /* m 2^-9 = 2^(p - 9) (m / 2^p) */
  return s | ((118u + p) << 23) | ((m - (1u << p)) << (23u - p));
}
constexpr uint32_t ue8m0_bits(uint32_t b) { return b == 0xFFu ? 0x7FC00000u : b ? b << 23 : 0x00400000u; }

/* Every scale byte's bits (e4m3_bits or ue8m0_bits), built at compile time: the fast gathers copy it
 * into shared memory instead of decoding 256 bytes per CTA. */
template <bool NV>
struct ScaleBits {
  uint32_t w[256];
  constexpr ScaleBits() : w() {
    for (uint32_t b = 0; b < 256; ++b) w[b] = NV ? e4m3_bits(b) : ue8m0_bits(b);
  }
};

/* An E2M1 code's value in F16 (BF) or BF16 bits, exactly (every E2M1 value is one of both types). */
constexpr uint32_t e2m1_bits16(uint32_t code, bool bf) {
  constexpr uint16_t f16[8] = {0x0000, 0x3800, 0x3C00, 0x3E00, 0x4000, 0x4200, 0x4400, 0x4600};
  constexpr uint16_t b16[8] = {0x0000, 0x3F00, 0x3F80, 0x3FC0, 0x4000, 0x4040, 0x4080, 0x40C0};
  return (uint32_t)((bf ? b16 : f16)[code & 7u] | ((code & 8u) << 12));
}

/* Every code byte's two E2M1 values in the output type (low half: the low nibble), built at compile
 * time: the MX gathers into F16/BF16 copy it into shared memory instead of converting 512 values per CTA. */
template <bool BF>
struct MxPairs {
  alignas(16) uint32_t w[256];
  constexpr MxPairs() : w() {
    for (uint32_t k = 0; k < 256; ++k) w[k] = e2m1_bits16(k & 15u, BF) | (e2m1_bits16(k >> 4, BF) << 16);
  }
};

/* One F16 value held as a float; each operation rounds its FP32 result to
 * F16. That is F16 arithmetic wherever the FP32 result is exact, or rounds to
 * the same F16: in e2m1_h every product is exact, and p 2^9 + m is exact in
 * FP32 except for m < 2^-4, where both roundings give p 2^9 (the F16 tie is at
 * p 2^9 + 0.25). */
struct HostF16 {
  typedef float T;
  static float r(float v) { return kvx_ref::f16_to_f32(kvx_ref::f32_to_f16(v)); }
  static T c(float v) { return v; }
  static T min(T a, T b) { return a < b ? a : b; }
  static T max(T a, T b) { return a > b ? a : b; }
  static T expo(T a) { return kvx_ref::f16_to_f32((uint16_t)(kvx_ref::f32_to_f16(a) & 0x7C00u)); }
  static T fma(T a, T b, T c) { return r(KVX_FFMA(a, b, c)); }
  static T neg(T a) { return -a; }
  static T mul(T a, T b) { return r(KVX_FMUL(a, b)); }
};

}  // namespace kvx_fp4_fast

#endif /* KVX_REFERENCE_CUDA_FP4_FAST_H */
