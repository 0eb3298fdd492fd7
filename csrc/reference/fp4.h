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

/* FP32 value of E2M1 code c, built from its bits (no int-to-float conversion):
 * magnitude index m = 2e + man gives 0, 0.5 (e = 0) or 2^(e-1) * (1 + man/2). */
KVX_HD inline float e2m1_to_f32(uint32_t code) {
  const uint32_t m = code & 7u, e = m >> 1, man = m & 1u;
  const uint32_t mag = e ? ((e + 126u) << 23) | (man << 22) : (man ? 0x3F000000u : 0u);
  return bits_to_f32(mag | ((code & 8u) << 28));
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
  } else if (a >= 6.0f) { /* saturate (inf too) */
    m = 7;
  } else {
    /* Round a to the grid step of its range by adding C = step * 2^23: the FP32
     * addition rounds to nearest even, which is ties-to-even on the E2M1 codes
     * (the step's multiples alternate even/odd codes). [0,2): step 0.5, k = code;
     * [2,4): step 1, code = k + 2; [4,6): step 2, code = k + 4. Same result as
     * comparing with the midpoints 0.25 0.75 1.25 1.75 2.5 3.5 5 (`>` where the
     * lower code is even, `>=` where odd). */
    const float C = a < 2.0f ? 4194304.0f : a < 4.0f ? 8388608.0f : 16777216.0f;
    const uint32_t k = f32_to_bits(a + C) - f32_to_bits(C);
    m = a < 2.0f ? k : a < 4.0f ? k + 2u : k + 4u;
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

/* The scale of a block from its amax (NaN-free) and NaN flag: the scale byte,
 * and the divisor (`denom`, 0 for a dead block) or, for MXFP4, its exact
 * reciprocal `inv` (0 when the division must be used). */
struct Fp4BlockScale {
  uint8_t byte;
  bool dead; /* NaN block, all-zero block or scale underflow: codes 0 */
  float denom, inv;
};

KVX_HD inline Fp4BlockScale fp4_block_scale(int format, float amax, bool nan, float g) {
  Fp4BlockScale r{0, true, 0.0f, 0.0f};
  const bool zero = !nan && amax == 0.0f;
  if (nan || (KVX_MUT(FP4_ZERO_BLOCK_NAN) && zero)) { /* the mutant: !(amax > 0) taken as NaN */
    r.byte = format == FP4_NVFP4 ? 0x7F : 0xFF;
    return r;
  }
  float unrounded;
  if (format == FP4_NVFP4) {
    const float wanted = amax / (6.0f * g);
    const uint8_t s8 = f32_to_e4m3(wanted < kE4M3Max ? wanted : kE4M3Max);
    r.byte = s8;
    r.denom = e4m3_to_f32(s8) * g;
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
    r.byte = zero ? 0 : (uint8_t)(e + 127);
    r.denom = zero ? 0.0f : ue8m0_to_f32((uint8_t)(e + 127));
    r.inv = ue8m0_to_f32((uint8_t)(127 - e)); /* 2^-e, exact: x * 2^-e == x / 2^e (one rounding each) */
    unrounded = amax / 6.0f;
  }
  if (r.denom == 0.0f) { /* all-zero block or scale underflow */
    r.inv = 0.0f;
    return r;
  }
  r.dead = false;
  if (KVX_MUT(FP4_UNROUNDED_SCALE)) {
    r.denom = unrounded;
    r.inv = 0.0f;
  }
  return r;
}

/* Code of x in a live block. */
KVX_HD inline uint8_t fp4_encode_value(const Fp4BlockScale& sc, float x) {
  if (sc.dead) return 0;
  return f32_to_e2m1(sc.inv != 0.0f ? x * sc.inv : x / sc.denom);
}

/* amax of n values, NaN reported apart (the oracle's NaN-propagating max). */
KVX_HD inline float fp4_amax(const float* x, int n, bool* nan) {
  float amax = 0.0f;
  KVX_FP4_UNROLL
  for (int i = 0; i < n; ++i) {
    const float a = fabsf(x[i]);
    if (a != a) *nan = true;
    else if (a > amax) amax = a;
  }
  return amax;
}

/* Encode one block of n (16 or 32) FP32 values. Writes the scale byte and the
 * n codes (one per byte, low nibble). g: NVFP4 global scale (1.0 for MXFP4). */
KVX_HD inline void fp4_encode_block(int format, const float* x, int n, float g, uint8_t* scale_byte,
                                    uint8_t* codes) {
  bool nan = false;
  const float amax = fp4_amax(x, n, &nan);
  const Fp4BlockScale sc = fp4_block_scale(format, amax, nan, g);
  *scale_byte = sc.byte;
  KVX_FP4_UNROLL
  for (int i = 0; i < n; ++i) codes[i] = fp4_encode_value(sc, x[i]);
}

/* FP32 value of a block's scale byte (E4M3 for NVFP4, UE8M0 for MXFP4). */
KVX_HD inline float fp4_scale_f32(int format, uint8_t s) {
  return format == FP4_NVFP4 ? e4m3_to_f32(s) : ue8m0_to_f32(s);
}

/* Decoded FP32 value of `code` in a block whose scale is `sf` (fp4_scale_f32). */
KVX_HD inline float fp4_decode_with(int format, uint32_t code, float sf, float g) {
  /* A NaN scale: the product is that NaN, bit for bit, as on x86 (and in the
   * oracle); a GPU would return its canonical NaN instead. */
  if (sf != sf) return sf;
  const float v = e2m1_to_f32(code);
  if (format == FP4_NVFP4) return (v * sf) * g;
  return v * sf;
}

/* Decoded FP32 value of `code` in a block with scale byte `s`. */
KVX_HD inline float fp4_decode(int format, uint32_t code, uint8_t s, float g) {
  return fp4_decode_with(format, code, fp4_scale_f32(format, s), g);
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
