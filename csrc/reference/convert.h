/*
 * convert.h -- element conversions of the reference provider (host and device).
 *
 * Readings R-CONVERT and R-FP8 (docs/spec-readings.md): values move through
 * FP32. Decoding a cache/IO dtype to FP32 is exact; encoding FP32 into F16,
 * BF16, F8_E4M3 or F8_E5M2 rounds to nearest even (subnormals kept). The bits
 * match the numpy oracle exactly:
 *   - F16  : numpy `astype(float16)`: overflow -> inf; NaN keeps its sign and
 *            the top 10 payload bits (a payload that would vanish becomes 1);
 *            F16 -> F32 keeps the payload (no quieting).
 *   - BF16 : ml_dtypes.bfloat16: overflow -> inf; NaN -> 0x7FC0 | sign.
 *   - E4M3 : ml_dtypes.float8_e4m3fn (no inf): overflow, inf and NaN -> 0x7F | sign;
 *            decoding 0x7F/0xFF gives the FP32 quiet NaN with the sign.
 *   - E5M2 : ml_dtypes.float8_e5m2: overflow -> inf; NaN -> 0x7E | sign;
 *            decoding a NaN gives the FP32 quiet NaN with the sign.
 * FP8 quantization (R-FP8) is `q = x / scale` (IEEE FP32 division), clamped to
 * the largest finite value (NaN stays NaN), then the cast above.
 *
 * Every function is usable from CUDA device code (KVX_HD) and never assumes
 * alignment: element loads and stores go through memcpy.
 */
#ifndef KVX_REFERENCE_CONVERT_H
#define KVX_REFERENCE_CONVERT_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "kvx/kvx_abi.h"

#if defined(__CUDACC__)
#define KVX_HD __host__ __device__
#else
#define KVX_HD
#endif

namespace kvx_ref {

/* Rounding of an FP32 -> narrow encode. RNE is the only one the reference
 * uses; TOWARD_ZERO exists for the truncation mutants. */
enum Rounding { ROUND_NEAREST_EVEN = 0, ROUND_TOWARD_ZERO = 1 };

KVX_HD inline uint32_t f32_to_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
}

KVX_HD inline float bits_to_f32(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

/* Byte size of a dtype's element; 0 for INVALID or an unknown value. */
KVX_HD inline size_t dtype_size(kvx_dtype_t dt) {
  switch (dt) {
    case KVX_DTYPE_F8_E4M3:
    case KVX_DTYPE_F8_E5M2:
    case KVX_DTYPE_U8:
      return 1;
    case KVX_DTYPE_F16:
    case KVX_DTYPE_BF16:
      return 2;
    case KVX_DTYPE_F32:
    case KVX_DTYPE_S32:
    case KVX_DTYPE_U32:
      return 4;
    case KVX_DTYPE_S64:
    case KVX_DTYPE_U64:
      return 8;
    default:
      return 0;
  }
}

KVX_HD inline bool is_fp8(kvx_dtype_t dt) {
  return dt == KVX_DTYPE_F8_E4M3 || dt == KVX_DTYPE_F8_E5M2;
}

/* Cache dtypes (spec 4.3): F16, BF16, F32, F8_E4M3, F8_E5M2. */
KVX_HD inline bool is_cache_dtype(kvx_dtype_t dt) {
  return dt == KVX_DTYPE_F16 || dt == KVX_DTYPE_BF16 || dt == KVX_DTYPE_F32 || is_fp8(dt);
}

/* ------------------------------------------------------------------------ */
/* Generic narrow binary float, EB exponent bits, MB mantissa bits, bias      */
/* 2^(EB-1)-1. Magnitude code of |x| (x finite, f32 bits `a` without sign),   */
/* rounded; a code at or above the format's overflow code means overflow.    */

template <int EB, int MB>
KVX_HD inline uint32_t round_magnitude(uint32_t a, Rounding rounding) {
  const int bias = (1 << (EB - 1)) - 1;
  int exp = (int)(a >> 23);
  uint32_t mant = a & 0x7FFFFFu;
  if (exp == 0) {
    if (mant == 0) return 0;
    exp = 1; /* FP32 subnormal: no implicit bit, exponent -126 */
  } else {
    mant |= 0x800000u;
  }
  const int e = exp - 127; /* |x| = mant * 2^(e - 23) */
  int shift;
  uint32_t field;
  if (e >= 1 - bias) {
    shift = 23 - MB;
    field = (uint32_t)(e + bias);
  } else {
    shift = 23 - MB + (1 - bias - e);
    field = 0;
  }
  if (shift > 25) return 0; /* below half the smallest subnormal (mant < 2^24) */
  uint32_t q = mant >> shift;
  const uint32_t rem = mant & ((1u << shift) - 1u);
  const uint32_t half = 1u << (shift - 1);
  if (rounding == ROUND_NEAREST_EVEN && (rem > half || (rem == half && (q & 1u)))) ++q;
  /* Normal: q in [2^MB, 2^(MB+1)] carries the implicit bit; adding it to the
   * shifted exponent field lets a rounding carry bump the exponent. */
  return field ? (field << MB) + q - (1u << MB) : q;
}

/* Decode a narrow float (no NaN/inf handling: the caller does that). */
template <int EB, int MB>
KVX_HD inline float decode_finite(uint32_t sign, uint32_t exp_field, uint32_t mant) {
  const int bias = (1 << (EB - 1)) - 1;
  uint32_t bits;
  if (exp_field == 0) {
    if (mant == 0) {
      bits = 0;
    } else {
      int e = 1 - bias;
      while (!(mant & (1u << MB))) {
        mant <<= 1;
        --e;
      }
      mant &= (1u << MB) - 1u;
      bits = ((uint32_t)(e + 127) << 23) | (mant << (23 - MB));
    }
  } else {
    bits = ((uint32_t)((int)exp_field - bias + 127) << 23) | (mant << (23 - MB));
  }
  return bits_to_f32(bits | (sign << 31));
}

/* ------------------------------------------------------------------------ */
/* F16 */

KVX_HD inline float f16_to_f32(uint16_t h) {
  const uint32_t sign = h >> 15, exp = (h >> 10) & 0x1Fu, mant = h & 0x3FFu;
  if (exp == 0x1F) return bits_to_f32((sign << 31) | 0x7F800000u | (mant << 13));
  return decode_finite<5, 10>(sign, exp, mant);
}

KVX_HD inline uint16_t f32_to_f16(float f, Rounding rounding = ROUND_NEAREST_EVEN) {
  const uint32_t u = f32_to_bits(f);
  const uint32_t sign = (u >> 16) & 0x8000u;
  const uint32_t a = u & 0x7FFFFFFFu;
  if (a > 0x7F800000u) { /* NaN: top payload bits, kept a NaN */
    uint32_t r = 0x7C00u + ((a & 0x7FFFFFu) >> 13);
    if (r == 0x7C00u) r = 0x7C01u;
    return (uint16_t)(sign | r);
  }
  if (a == 0x7F800000u) return (uint16_t)(sign | 0x7C00u);
  uint32_t m = round_magnitude<5, 10>(a, rounding);
  if (m >= 0x7C00u) m = rounding == ROUND_NEAREST_EVEN ? 0x7C00u : 0x7BFFu;
  return (uint16_t)(sign | m);
}

/* ------------------------------------------------------------------------ */
/* BF16 */

KVX_HD inline float bf16_to_f32(uint16_t b) { return bits_to_f32((uint32_t)b << 16); }

KVX_HD inline uint16_t f32_to_bf16(float f, Rounding rounding = ROUND_NEAREST_EVEN) {
  const uint32_t u = f32_to_bits(f);
  const uint32_t sign = (u >> 16) & 0x8000u;
  const uint32_t a = u & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return (uint16_t)(sign | 0x7FC0u);
  if (a == 0x7F800000u) return (uint16_t)(sign | 0x7F80u);
  /* Same exponent range as FP32: RNE can at most carry into inf (0x7F80). */
  return (uint16_t)(sign | round_magnitude<8, 7>(a, rounding));
}

/* ------------------------------------------------------------------------ */
/* F8_E4M3 (float8_e4m3fn: no inf, 0x7F / 0xFF are NaN, max 448) */

constexpr float kE4M3Max = 448.0f;
constexpr float kE5M2Max = 57344.0f;

KVX_HD inline float e4m3_to_f32(uint8_t b) {
  const uint32_t sign = b >> 7, exp = (b >> 3) & 0xFu, mant = b & 0x7u;
  if (exp == 0xF && mant == 0x7) return bits_to_f32((sign << 31) | 0x7FC00000u);
  return decode_finite<4, 3>(sign, exp, mant);
}

/* Non-saturating cast (ml_dtypes): overflow and inf give NaN. */
KVX_HD inline uint8_t f32_to_e4m3(float f, Rounding rounding = ROUND_NEAREST_EVEN) {
  const uint32_t u = f32_to_bits(f);
  const uint32_t sign = (u >> 24) & 0x80u;
  const uint32_t a = u & 0x7FFFFFFFu;
  if (a >= 0x7F800000u) return (uint8_t)(sign | 0x7Fu);
  uint32_t m = round_magnitude<4, 3>(a, rounding);
  if (m > 0x7Eu) m = 0x7Fu;
  return (uint8_t)(sign | m);
}

/* ------------------------------------------------------------------------ */
/* F8_E5M2 (IEEE-like: inf 0x7C, NaN 0x7D..0x7F, max 57344) */

KVX_HD inline float e5m2_to_f32(uint8_t b) {
  const uint32_t sign = b >> 7, exp = (b >> 2) & 0x1Fu, mant = b & 0x3u;
  if (exp == 0x1F) return bits_to_f32((sign << 31) | (mant ? 0x7FC00000u : 0x7F800000u));
  return decode_finite<5, 2>(sign, exp, mant);
}

/* Non-saturating cast (ml_dtypes): overflow gives inf, NaN gives 0x7E | sign. */
KVX_HD inline uint8_t f32_to_e5m2(float f, Rounding rounding = ROUND_NEAREST_EVEN) {
  const uint32_t u = f32_to_bits(f);
  const uint32_t sign = (u >> 24) & 0x80u;
  const uint32_t a = u & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return (uint8_t)(sign | 0x7Eu);
  if (a == 0x7F800000u) return (uint8_t)(sign | 0x7Cu);
  uint32_t m = round_magnitude<5, 2>(a, rounding);
  if (m >= 0x7Cu) m = rounding == ROUND_NEAREST_EVEN ? 0x7Cu : 0x7Bu;
  return (uint8_t)(sign | m);
}

/* ------------------------------------------------------------------------ */
/* FP8 quantization (R-FP8): x / scale in FP32, clamp to +-max (inf too; NaN   */
/* stays NaN), then the RNE cast. `saturate` false skips the clamp (mutant).  */

KVX_HD inline float fp8_clamp(float q, float max_finite) {
  if (q > max_finite) return max_finite;
  if (q < -max_finite) return -max_finite;
  return q; /* NaN fails both comparisons */
}

KVX_HD inline uint8_t quantize_fp8(kvx_dtype_t dt, float x, float scale,
                                   Rounding rounding = ROUND_NEAREST_EVEN, bool saturate = true) {
  const float q = x / scale;
  if (dt == KVX_DTYPE_F8_E4M3) return f32_to_e4m3(saturate ? fp8_clamp(q, kE4M3Max) : q, rounding);
  return f32_to_e5m2(saturate ? fp8_clamp(q, kE5M2Max) : q, rounding);
}

/* ------------------------------------------------------------------------ */
/* Element loads and stores (unaligned-safe).                                 */

/* FP32 value of the element of cache/IO dtype `dt` at `p` (exact). */
KVX_HD inline float load_as_f32(const void* p, kvx_dtype_t dt) {
  switch (dt) {
    case KVX_DTYPE_F16: {
      uint16_t h;
      memcpy(&h, p, 2);
      return f16_to_f32(h);
    }
    case KVX_DTYPE_BF16: {
      uint16_t b;
      memcpy(&b, p, 2);
      return bf16_to_f32(b);
    }
    case KVX_DTYPE_F32: {
      float f;
      memcpy(&f, p, 4);
      return f;
    }
    case KVX_DTYPE_F8_E4M3:
      return e4m3_to_f32(*(const uint8_t*)p);
    case KVX_DTYPE_F8_E5M2:
      return e5m2_to_f32(*(const uint8_t*)p);
    default:
      return 0.0f;
  }
}

/* Encode FP32 `f` as a non-FP8 float dtype (F16, BF16, F32) into `out`
 * (dtype_size(dt) bytes). FP8 goes through quantize_fp8. */
KVX_HD inline void encode_from_f32(void* out, kvx_dtype_t dt, float f,
                                   Rounding f16_rounding = ROUND_NEAREST_EVEN,
                                   Rounding bf16_rounding = ROUND_NEAREST_EVEN) {
  switch (dt) {
    case KVX_DTYPE_F16: {
      const uint16_t h = f32_to_f16(f, f16_rounding);
      memcpy(out, &h, 2);
      break;
    }
    case KVX_DTYPE_BF16: {
      const uint16_t b = f32_to_bf16(f, bf16_rounding);
      memcpy(out, &b, 2);
      break;
    }
    case KVX_DTYPE_F32:
      memcpy(out, &f, 4);
      break;
    default:
      break;
  }
}

/* Signed index value (S32 sign-extended, S64) of element i of an S32/S64 array. */
KVX_HD inline int64_t load_index(const void* base, kvx_dtype_t dt, uint64_t i) {
  if (dt == KVX_DTYPE_S32) {
    int32_t v;
    memcpy(&v, (const char*)base + 4 * i, 4);
    return v;
  }
  int64_t v;
  memcpy(&v, (const char*)base + 8 * i, 8);
  return v;
}

}  // namespace kvx_ref

#endif /* KVX_REFERENCE_CONVERT_H */
