/*
 * fp4.h -- the FP4 block codecs of the KVX 1.2 extension (host and device).
 *
 * Bit-exact with the numpy oracle kvx_conformance.reference_impl.fp4 (the
 * readings "FP4 extension", docs/fp4.md): every step is one correctly
 * rounded FP32 operation in the order the oracle uses.
 *   NVFP4: wanted = amax / (6 * g); s = E4M3_RNE(min(wanted, 448));
 *          d = float(s) * g; code = E2M1_RNE(clip(x / d, -6, 6));
 *          decode (E2M1(code) * float(s)) * g.
 *   MXFP4: e = ceil(log2(amax / 6)) (16-value blocks) or floor(log2 amax) - 2
 *          (OCP, 32), clamped to [-127, 127]; byte e + 127;
 *          code = E2M1_RNE(clip(x / 2^e, -6, 6)); decode E2M1(code) * 2^e.
 * A block whose scale is zero (all-zero block, NVFP4 scale underflow) stores
 * codes 0; an all-zero MXFP4 block stores byte 0. A block with a NaN stores
 * the scale format's NaN byte (0x7F / 0xFF) and codes 0. The five FP4 mutants
 * (mutants.h) sit here.
 */
#ifndef KVX_REFERENCE_FP4_H
#define KVX_REFERENCE_FP4_H

#include <math.h>
#include <stdint.h>

#include "convert.h"
#include "mutants.h"

#if defined(__CUDA_ARCH__)
#define KVX_FP4_UNROLL _Pragma("unroll")
#else
#define KVX_FP4_UNROLL
#endif

namespace kvx_ref {

/* kvx_fp4_format_t values (kept as ints so this header compiles against the
 * v1.1 header too). */
enum Fp4Format { FP4_NONE = 0, FP4_NVFP4 = 1, FP4_MXFP4 = 2, FP4_MXFP4_OCP = 3 };

constexpr int kFp4MaxBlock = 32;

KVX_HD inline int fp4_block_values(int format) { return format == FP4_MXFP4_OCP ? 32 : 16; }

/* E2M1 magnitude of code c (bits 0-2). */
KVX_HD inline float e2m1_magnitude(uint32_t c) {
  /* 0, 0.5, 1, 1.5, 2, 3, 4, 6 */
  const uint32_t m = c & 7u;
  if (m < 2) return 0.5f * (float)m;
  const uint32_t e = (m >> 1) - 1, man = m & 1u; /* 1.man * 2^e */
  return (float)(2u + man) * (float)(1u << e) * 0.5f;
}

KVX_HD inline float e2m1_to_f32(uint32_t code) {
  const float v = e2m1_magnitude(code);
  return (code & 8u) ? -v : v;
}

/* E2M1 code of FP32 q: round to nearest, ties to the even code, saturating at
 * +-6 (inf too). Between neighbours the midpoints are 0.25 0.75 1.25 1.75 2.5
 * 3.5 5; a midpoint goes to the even code, hence `>` where the lower code is
 * even and `>=` where it is odd. Exactly the oracle's ml_dtypes cast of
 * clip(q, -6, 6). The ties-away mutant sends every midpoint up. NaN is the
 * caller's business. */
KVX_HD inline uint8_t f32_to_e2m1(float q) {
  const uint32_t sign = (f32_to_bits(q) >> 28) & 8u;
  const float a = fabsf(q);
  uint32_t m;
  if (KVX_MUT(FP4_TIES_AWAY)) {
    m = (a >= 0.25f) + (a >= 0.75f) + (a >= 1.25f) + (a >= 1.75f) + (a >= 2.5f) + (a >= 3.5f) + (a >= 5.0f);
  } else {
    m = (a > 0.25f) + (a >= 0.75f) + (a > 1.25f) + (a >= 1.75f) + (a > 2.5f) + (a >= 3.5f) + (a > 5.0f);
  }
  return (uint8_t)(sign | m);
}

/* UE8M0 byte -> FP32 (0xFF NaN; byte 0 is 2^-127, an FP32 subnormal). */
KVX_HD inline float ue8m0_to_f32(uint8_t b) {
  if (b == 0xFF) return bits_to_f32(0x7FC00000u);
  if (b == 0) return bits_to_f32(0x00400000u);
  return bits_to_f32((uint32_t)b << 23);
}

/* floor(log2 v) of a finite v > 0, exactly (subnormals too). */
KVX_HD inline int floor_log2(float v) {
  const uint32_t u = f32_to_bits(v) & 0x7FFFFFFFu;
  const int E = (int)(u >> 23);
  if (E) return E - 127;
  uint32_t m = u & 0x7FFFFFu;
  int k = -1;
  while (m) {
    m >>= 1;
    ++k;
  }
  return k - 149;
}

/* ceil(log2 v) of a finite v > 0. */
KVX_HD inline int ceil_log2(float v) {
  const uint32_t u = f32_to_bits(v) & 0x7FFFFFFFu;
  const int f = floor_log2(v);
  const bool pow2 = (u >> 23) ? (u & 0x7FFFFFu) == 0 : (u & (u - 1u)) == 0;
  return pow2 ? f : f + 1;
}

/* Encode one block of n (16 or 32) FP32 values. Writes the scale byte and the
 * n codes (one per byte, low nibble). g: NVFP4 global scale (1.0 for MXFP4). */
KVX_HD inline void fp4_encode_block(int format, const float* x, int n, float g, uint8_t* scale_byte,
                                    uint8_t* codes) {
  float amax = 0.0f;
  bool nan = false;
  KVX_FP4_UNROLL
  for (int i = 0; i < n; ++i) {
    const float a = fabsf(x[i]);
    if (a != a) nan = true;
    else if (a > amax) amax = a;
  }
  const bool zero = !nan && amax == 0.0f;
  if (nan || (KVX_MUT(FP4_ZERO_BLOCK_NAN) && zero)) { /* the mutant: !(amax > 0) taken as NaN */
    *scale_byte = format == FP4_NVFP4 ? 0x7F : 0xFF;
    for (int i = 0; i < n; ++i) codes[i] = 0;
    return;
  }
  float denom, unrounded, inv = 0.0f;
  if (format == FP4_NVFP4) {
    const float wanted = amax / (6.0f * g);
    const uint8_t s8 = f32_to_e4m3(wanted < kE4M3Max ? wanted : kE4M3Max);
    *scale_byte = s8;
    denom = e4m3_to_f32(s8) * g;
    unrounded = wanted * g;
  } else {
    int e;
    if (zero) {
      e = 0;
    } else if (f32_to_bits(amax) == 0x7F800000u) { /* inf */
      e = 127;
    } else {
      const float v = amax / 6.0f;
      /* amax / 6 underflowing to 0 gives e = 0, as frexp(0) does in the oracle */
      e = format == FP4_MXFP4 ? (v == 0.0f ? 0 : ceil_log2(v)) : floor_log2(amax) - 2;
      e = e < -127 ? -127 : e > 127 ? 127 : e;
    }
    *scale_byte = zero ? 0 : (uint8_t)(e + 127);
    denom = zero ? 0.0f : ue8m0_to_f32((uint8_t)(e + 127));
    inv = ue8m0_to_f32((uint8_t)(127 - e)); /* 2^-e, exact: x * 2^-e == x / 2^e (one rounding each) */
    unrounded = amax / 6.0f;
  }
  if (denom == 0.0f) { /* all-zero block or scale underflow */
    for (int i = 0; i < n; ++i) codes[i] = 0;
    return;
  }
  if (KVX_MUT(FP4_UNROUNDED_SCALE)) {
    denom = unrounded;
    inv = 0.0f;
  }
  if (inv != 0.0f) { /* MXFP4: a power-of-two scale */
    KVX_FP4_UNROLL
    for (int i = 0; i < n; ++i) codes[i] = f32_to_e2m1(x[i] * inv);
    return;
  }
  KVX_FP4_UNROLL
  for (int i = 0; i < n; ++i) codes[i] = f32_to_e2m1(x[i] / denom);
}

/* Decoded FP32 value of `code` in a block with scale byte `s`. */
KVX_HD inline float fp4_decode(int format, uint32_t code, uint8_t s, float g) {
  const float v = e2m1_to_f32(code);
  const float sf = format == FP4_NVFP4 ? e4m3_to_f32(s) : ue8m0_to_f32(s);
  /* A NaN scale: the product is that NaN, bit for bit, as on x86 (and in the
   * oracle); a GPU would return its canonical NaN instead. */
  if (sf != sf) return sf;
  if (format == FP4_NVFP4) return (v * sf) * g;
  return v * sf;
}

/* One byte holds elements 2k (low nibble) and 2k+1 (high nibble); the
 * nibble-order mutant swaps them. */
KVX_HD inline uint8_t fp4_pack(uint8_t even, uint8_t odd) {
  if (KVX_MUT(FP4_NIBBLE_SWAP)) return (uint8_t)(((even & 15u) << 4) | (odd & 15u));
  return (uint8_t)((even & 15u) | ((odd & 15u) << 4));
}

KVX_HD inline uint8_t fp4_even(uint8_t byte) { return KVX_MUT(FP4_NIBBLE_SWAP) ? byte >> 4 : byte & 15u; }
KVX_HD inline uint8_t fp4_odd(uint8_t byte) { return KVX_MUT(FP4_NIBBLE_SWAP) ? byte & 15u : byte >> 4; }

}  // namespace kvx_ref

#endif /* KVX_REFERENCE_FP4_H */
