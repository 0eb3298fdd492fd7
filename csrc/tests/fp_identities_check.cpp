/*
 * fp_identities_check.cpp -- host checks of the two floating-point identities the
 * CUDA kernels use instead of the host backend's operations (docs/cuda-reference.md
 * "FP8 division", docs/fp4.md "CUDA figures"):
 *   1. Markstein's division: q0 = RN(x r), q = RN(q0 + (x - q0 s) r) with
 *      r = RN(1/s) equals RN(x / s) (cuda/move.cuh exact_div_rcp, and for s > 0
 *      exact_div_rcp_pos, which forms the residual negated and needs no sign fix-up;
 *      move_fp4.cuh encode_block); checked for every x significand in two binades (both signs)
 *      against special and random divisor significands at two exponents;
 *      x = +-0 included (the kernel takes the sign of x r with copysignf);
 *   2. the integer E2M1 rounding of move_fp4.cuh (e2m1_code) equals fp4.h's
 *      f32_to_e2m1 for every non-NaN FP32 input (all 2^32 patterns);
 *   3. the packed range tests of move_kernels.cuh (TF16 / TBF16 div_ok_words, with
 *      the 16x2 integer max / min) equal the per-element div_ok for every 16-bit
 *      pattern in either half of a word;
 *   4. TBF16 div_hi_words (the upper bound alone, taken when |scale| >= 2^-40): for
 *      every BF16 x with a nonzero |x| below 2^-60 (below div_ok's lower bound) and
 *      divisors |s| in [2^-40, 2^60) (every binade, boundary and random
 *      significands, both signs), the E4M3 and E5M2 bytes of the reciprocal-multiply
 *      quotient equal those of RN(x / s).
 * Build and run (about 10 s for the E2M1 part, 0.6 s per 10 random divisors):
 *   g++ -O2 -march=native -ffp-contract=off -std=c++17 -Icsrc/reference -Icsrc/include \
 *       csrc/tests/fp_identities_check.cpp -o /tmp/fpcheck && /tmp/fpcheck [RANDOM_DIVISORS] [SEED]
 *   /tmp/fpcheck quick   (CI: tests/test_kernel_identities.py; the special divisors
 *                         against every 257th significand, E2M1 on a stride and
 *                         around every rounding boundary, part 3 in full; < 1 s)
 * Exit status 0 when all hold. Results of this round (2026-11-21): arguments
 * "1500 7" and "1500 11", 1.0e11 pairs, 0 mismatches; E2M1 0 mismatches.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <initializer_list>

#include "convert.h"
#include "fp4.h"

static float bf(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
static uint32_t fb(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }

/* the kernel's formulas, on the host (fmaf is the correctly rounded fused multiply-add):
 * move.cuh exact_div_rcp_pos for s > 0, exact_div_rcp otherwise */
static float div_rcp(float x, float s, float r) {
  const float q0 = x * r;
  if (s > 0.0f) {
    /* the GPU negates x and e as FMA operands; with FMA instructions GCC folds
     * these negations and zero addends in ways that lose the sign of a zero,
     * so each operand goes through a volatile */
    volatile float nx = -x;
    volatile float e = fmaf(q0, s, nx);
    volatile float ne = -e;
    return fmaf(ne, r, q0);
  }
  return copysignf(fmaf(fmaf(-q0, s, x), r, q0), q0);
}

/* __vmaxu2 / __vminu2 on the host: unsigned max / min of each 16-bit half */
static uint32_t vmaxu2(uint32_t a, uint32_t b) {
  const uint32_t lo = (a & 0xFFFFu) > (b & 0xFFFFu) ? (a & 0xFFFFu) : (b & 0xFFFFu);
  const uint32_t hi = (a >> 16) > (b >> 16) ? (a >> 16) : (b >> 16);
  return (hi << 16) | lo;
}
static uint32_t vminu2(uint32_t a, uint32_t b) {
  const uint32_t lo = (a & 0xFFFFu) < (b & 0xFFFFu) ? (a & 0xFFFFu) : (b & 0xFFFFu);
  const uint32_t hi = (a >> 16) < (b >> 16) ? (a >> 16) : (b >> 16);
  return (hi << 16) | lo;
}
/* move_kernels.cuh, TF16 / TBF16: div_ok and div_ok_words (one word here) */
static bool f16_ok(uint32_t v) { return (v & 0x7FFFu) < 0x7C00u; }
static bool bf16_ok(uint32_t v) {
  const uint32_t a = v & 0x7FFFu;
  return a == 0 || (uint32_t)(a - 0x2180u) < 0x3C00u;
}
static bool f16_ok_word(uint32_t w) {
  const uint32_t mx = vmaxu2(0, w & 0x7FFF7FFFu);
  return vmaxu2(mx, 0x7BFF7BFFu) == 0x7BFF7BFFu;
}
/* __vmins2 on the host: signed min of each 16-bit half */
static uint32_t vmins2(uint32_t a, uint32_t b) {
  const int16_t al = (int16_t)(a & 0xFFFFu), bl = (int16_t)(b & 0xFFFFu);
  const int16_t ah = (int16_t)(a >> 16), bh = (int16_t)(b >> 16);
  return ((uint32_t)(uint16_t)(ah < bh ? ah : bh) << 16) | (uint16_t)(al < bl ? al : bl);
}
static bool bf16_ok_word(uint32_t w) {
  const uint32_t a = w & 0x7FFF7FFFu;
  const uint32_t mx = vmaxu2(0, a), mn = vmins2(0x7FFF7FFFu, a + 0x7FFF7FFFu);
  return vmaxu2(mx, 0x5D7F5D7Fu) == 0x5D7F5D7Fu && vmins2(mn, 0xA17FA17Fu) == 0xA17FA17Fu;
}
static uint8_t e2m1_int(float q) {
  const uint32_t u = fb(q), a = u & 0x7FFFFFFFu;
  uint32_t m;
  if (a < 0x3F800000u) {
    m = fb(bf(a) + 4194304.0f) - 0x4A800000u;
  } else {
    const uint32_t r = a + 0x1FFFFFu + ((a >> 22) & 1u);
    m = (r >> 22) - 252u;
    m = m < 7u ? m : 7u;
  }
  return (uint8_t)(((u >> 28) & 8u) | m);
}

int main(int argc, char** argv) {
  const bool quick = argc > 1 && !strcmp(argv[1], "quick");
  const int nrand = quick ? 0 : argc > 1 ? atoi(argv[1]) : 20;
  srand(!quick && argc > 2 ? (unsigned)atoi(argv[2]) : 1u);
  const uint32_t xstep = quick ? 257u : 1u;
  static const uint32_t special[] = {0,        1,        2,        3,        0x7FFFFF, 0x7FFFFE, 0x7FFFFD,
                                     0x400000, 0x3FFFFF, 0x400001, 0x555555, 0x2AAAAA, 0x200000, 0x600000,
                                     0x0CCCCD, 0x4CCCCD, 0x124925, 0x638E39, 0x1C71C7};
  const int nspec = (int)(sizeof special / sizeof special[0]);
  long long bad = 0, pairs = 0;
  for (int k = 0; k < nspec + nrand; ++k) {
    const uint32_t sm = k < nspec ? special[k] : (((uint32_t)rand() * 2654435761u) ^ (uint32_t)rand()) & 0x7FFFFFu;
    for (int se = 0; se < 2; ++se) {
      float s = bf(((127u + se * 37u) << 23) | sm);
      if (k & 1) s = -s;
      volatile float one = 1.0f;
      const float r = one / s;
      for (uint32_t m = 0; m < (1u << 24); m += xstep) {
        float x = bf(((127u + (m >> 23)) << 23) | (m & 0x7FFFFFu));
        if (m & 1) x = -x;
        ++pairs;
        if (fb(div_rcp(x, s, r)) != fb(x / s) && bad++ < 10)
          printf("division mismatch: s=%08x x=%08x got %08x want %08x\n", fb(s), fb(x), fb(div_rcp(x, s, r)), fb(x / s));
      }
      for (const float x : {0.0f, -0.0f}) { /* the sign of a zero quotient */
        ++pairs;
        if (fb(div_rcp(x, s, r)) != fb(x / s) && bad++ < 10)
          printf("division mismatch: s=%08x x=%08x got %08x want %08x\n", fb(s), fb(x), fb(div_rcp(x, s, r)), fb(x / s));
      }
    }
  }
  printf("division: %lld pairs (%d divisor significands), %lld mismatches\n", pairs, nspec + nrand, bad);
  long long bad2 = 0, n2 = 0;
  auto e2m1_one = [&](uint32_t u) {
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) return; /* NaN: dead blocks, never encoded */
    ++n2;
    if (e2m1_int(bf(u)) != kvx_ref::f32_to_e2m1(bf(u)) && bad2++ < 10)
      printf("e2m1 mismatch: %08x got %d want %d\n", u, e2m1_int(bf(u)), kvx_ref::f32_to_e2m1(bf(u)));
  };
  if (!quick) {
    for (uint64_t i = 0; i < (1ull << 32); ++i) e2m1_one((uint32_t)i);
  } else {
    for (uint64_t i = 0; i < (1ull << 32); i += 65521) e2m1_one((uint32_t)i);
    /* every rounding boundary and code value, both signs, 4096 ulps either side */
    for (const float c : {0.25f, 0.5f, 0.75f, 1.0f, 1.25f, 1.5f, 1.75f, 2.0f, 2.5f, 3.0f, 3.5f, 4.0f, 5.0f, 6.0f})
      for (int d = -4096; d <= 4096; ++d) {
        e2m1_one(fb(c) + (uint32_t)d);
        e2m1_one((fb(c) + (uint32_t)d) | 0x80000000u);
      }
  }
  printf("e2m1: %lld non-NaN FP32 inputs%s, %lld mismatches\n", n2, quick ? " (sampled)" : " (all)", bad2);
  long long bad3 = 0;
  for (uint32_t v = 0; v < 0x10000u; ++v)
    for (const uint32_t other : {0u, 0x3C00u, 0x2180u, 0x5D7Fu}) { /* a passing neighbour half */
      const uint32_t w1 = (v << 16) | other, w2 = (other << 16) | v;
      const bool f16o = f16_ok(other), bf16o = bf16_ok(other);
      if (f16_ok_word(w1) != (f16_ok(v) && f16o) || f16_ok_word(w2) != (f16_ok(v) && f16o)) {
        if (bad3++ < 10) printf("f16 range mismatch: half %04x next to %04x\n", v, other);
      }
      if (bf16_ok_word(w1) != (bf16_ok(v) && bf16o) || bf16_ok_word(w2) != (bf16_ok(v) && bf16o)) {
        if (bad3++ < 10) printf("bf16 range mismatch: half %04x next to %04x\n", v, other);
      }
    }
  printf("packed range tests: every 16-bit half, %lld mismatches\n", bad3);
  long long bad4 = 0, n4 = 0;
  {
    using kvx_ref::f32_to_e4m3;
    using kvx_ref::f32_to_e5m2;
    using kvx_ref::fp8_clamp;
    const int nsig = quick ? 4 : 24;
    for (int e = -40; e < 60; ++e)
      for (int k = 0; k < nsig; ++k) {
        const uint32_t sm = k == 0 ? 0u : k == 1 ? 0x7FFFFFu : k == 2 ? 0x400000u
                                                                   : (((uint32_t)rand() * 2654435761u) ^ (uint32_t)rand()) & 0x7FFFFFu;
        for (const uint32_t sign : {0u, 0x80000000u}) {
          const float s = bf(sign | ((uint32_t)(127 + e) << 23) | sm);
          volatile float one = 1.0f;
          const float r = one / s;
          for (uint32_t a = 1; a < 0x2180u; ++a)
            for (const uint32_t xs : {0u, 0x8000u}) {
              const float x = bf((xs | a) << 16);
              const float q = div_rcp(x, s, r), want = x / s;
              ++n4;
              if ((f32_to_e4m3(fp8_clamp(q, kvx_ref::kE4M3Max)) != f32_to_e4m3(fp8_clamp(want, kvx_ref::kE4M3Max)) ||
                   f32_to_e5m2(fp8_clamp(q, kvx_ref::kE5M2Max)) != f32_to_e5m2(fp8_clamp(want, kvx_ref::kE5M2Max))) &&
                  bad4++ < 10)
                printf("small-x FP8 mismatch: s=%08x x=%08x quotient %08x, RN %08x\n", fb(s), fb(x), fb(q), fb(want));
            }
        }
      }
    /* the scale bound is what makes the upper bound alone enough: at |s| = 2^-60 (the
     * smallest divisor of the reciprocal path) such an x reaches a nonzero E4M3 code */
    const float s = bf(0x21800000u);
    bool nonzero = false;
    for (uint32_t a = 1; a < 0x2180u && !nonzero; ++a) nonzero = f32_to_e4m3(fp8_clamp(bf(a << 16) / s, kvx_ref::kE4M3Max)) != 0;
    if (!nonzero) {
      ++bad4;
      printf("small-x FP8: at |s| = 2^-60 every x below 2^-60 quantizes to zero (the check would prove nothing)\n");
    }
  }
  printf("small-x FP8 (div_hi_words): %lld pairs, %lld mismatches\n", n4, bad4);
  return bad || bad2 || bad3 || bad4 ? 1 : 0;
}
