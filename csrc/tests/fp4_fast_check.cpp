/*
 * fp4_fast_check.cpp -- exhaustive host check of csrc/reference/cuda/fp4_fast.h,
 * the exact encoding steps of the fast FP4 CUDA kernels (docs/fp4.md "CUDA figures"):
 *   1. e2m1_f16(a) is, as F16 bits, fp4.h's f32_to_e2m1(a) << 9, for every
 *      FP32 a >= 0 that is not NaN (inf included): 2^31 inputs; and so is
 *      e2m1_f16_scaled(RN(a * 2^-14)), the form the kernels use;
 *   2. e4m3_pos(w) == convert.h's f32_to_e4m3(w) for every FP32 w in [0, 448];
 *   3. e4m3_pos_f32(s) == e4m3_to_f32(s) (bits) for s in [0, 0x7E];
 *   4. e4m3_sat(w) (its host / sm_80 form) == f32_to_e4m3(min(w, 448)) for
 *      every finite FP32 w >= 0 (the sm_89+ hardware form is checked on the
 *      GPU: tools/fp4_gpu_check.sh E4M3CHECK=1);
 *   5. e2m1_h (the MXFP4 writes' packed F16 step, HostF16 arithmetic) gives
 *      f32_to_e2m1(|x| * 2^-e) << 9, the oracle's code, from the kernels' s:
 *      RN16(|x| 2^-e) for every finite F16 x and e in [-15, 14], and
 *      RN16(RN32(|x| 2^-e)) for every finite BF16 x and e in [-127, 127]
 *      (both whole in quick mode too: 9.3e6 inputs);
 *   7. e2m1_thresholds / e2m1_count (the 16-bit writes' code by packed compares)
 *      give f32_to_e2m1(|x| / d) & 7 for every F16 |x| and every BF16 |x| of the
 *      kernels' fast path (below 2^60 for NVFP4, up to 2^121 for MXFP4), NVFP4
 *      divisors float(s) g (every s, 12 g) and MXFP4 2^e (every e).
 *   8. nv_ab / nv_pair_entry (the NVFP4 gathers' packed products into F16 and BF16)
 *      give the oracle's bytes, f32_to_T(fp4_decode_with(NVFP4, code, sf, g)), for every
 *      code byte and every scale byte with a spread of g, and with g just above and below
 *      each scale's bounds (the fast path's 2^-13 / 2^-125 floor, and where A, B and
 *      their 2- and 4-fold overflow); blocks the test sends to the FP32 path are counted apart.
 *   9. nv_alu_word (the same products' operands by byte permutes, KVX_FP4_G_NV_ALU) gives the
 *      oracle's bytes for every code byte in each word of a code word (the other bytes at random),
 *      every scale byte and a spread of g.
 *  10. e2m1_word_scaled (the MX gathers' E2M1 values by byte permutes, KVX_FP4_G_MX_ALU) times 2^14
 *      or 2^126 is each code's E2M1 value in F16 and BF16, for every code byte in each word.
 *  11. ScaleBits and MxPairs (the fast gathers' tables, made by the compiler) hold fp4_scale_f32's
 *      bits for every scale byte of NVFP4 (E4M3) and of the MX formats (UE8M0), and every code byte's
 *      two E2M1 values in F16 and BF16 (f32_to_f16 / f32_to_bf16 of e2m1_to_f32).
 * Build and run (about 50 s):
 *   g++ -O2 -ffp-contract=off -std=c++17 -Icsrc/reference -Icsrc/include \
 *       csrc/tests/fp4_fast_check.cpp -o /tmp/fp4fast && /tmp/fp4fast
 *   /tmp/fp4fast quick   (CI: tests/test_kernel_identities.py; every 509th input of
 *                         each range plus dense windows around every E2M1 tie and
 *                         code value and every E4M3 value and midpoint; < 1 s)
 * Exit status 0 when all hold.
 */
#include <stdint.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include <initializer_list>
#include <vector>

#include "cuda/fp4_fast.h"
#include "fp4.h"

int main(int argc, char** argv) {
  using namespace kvx_ref;
  const bool quick = argc > 1 && !strcmp(argv[1], "quick");
  /* the inputs of one range: all of [lo, hi], or (quick) a stride plus windows */
  std::vector<uint32_t> dense;
  if (quick) {
    auto window = [&](float c, int half) {
      for (int d = -half; d <= half; ++d) dense.push_back(f32_to_bits(c) + (uint32_t)d);
    };
    for (const float c : {0.25f, 0.5f, 0.75f, 1.0f, 1.25f, 1.5f, 1.75f, 2.0f, 2.5f, 3.0f, 3.5f, 4.0f, 5.0f, 6.0f})
      for (const float sc : {1.0f, 6.103515625e-05f}) window(c * sc, 2048); /* E2M1 ties and codes, plain and 2^-14 */
    float prev = 0.0f;
    for (uint32_t b = 1; b <= 0x7Eu; ++b) { /* every E4M3 value and the midpoint below it */
      const float v = e4m3_to_f32((uint8_t)b);
      window(v, 64);
      window(0.5f * (prev + v), 64);
      prev = v;
    }
  }
  auto each = [&](uint64_t lo, uint64_t hi, auto&& f) {
    if (!quick) {
      for (uint64_t u = lo; u <= hi; ++u) f((uint32_t)u);
      return;
    }
    for (uint64_t u = lo; u <= hi; u += 509) f((uint32_t)u);
    f((uint32_t)hi);
    for (const uint32_t u : dense)
      if (u >= lo && u <= hi) f(u);
  };
  long long bad1 = 0, bad2 = 0, bad3 = 0;
  each(0, 0x7F800000ull, [&](uint32_t u) {
    const float a = bits_to_f32(u);
    const uint32_t got = f32_to_f16(kvx_fp4_fast::e2m1_f16(a));
    const uint32_t want = (uint32_t)f32_to_e2m1(a) << 9;
    if (got != want && bad1++ < 10) printf("e2m1 mismatch: %08x got %04x want %04x\n", u, got, want);
  });
  printf("e2m1_f16: FP32 in [0, inf]%s, %lld mismatches\n", quick ? " (sampled)" : "", bad1);
  long long bad4 = 0;
  each(0, 0x7F800000ull, [&](uint32_t u) {
    const float a = bits_to_f32(u);
    const uint32_t got = f32_to_f16(kvx_fp4_fast::e2m1_f16_scaled(a * 6.103515625e-05f));
    const uint32_t want = (uint32_t)f32_to_e2m1(a) << 9;
    if (got != want && bad4++ < 10) printf("e2m1 scaled mismatch: %08x got %04x want %04x\n", u, got, want);
  });
  printf("e2m1_f16_scaled: a in [0, inf]%s, s = RN(a 2^-14), %lld mismatches\n", quick ? " (sampled)" : "", bad4);
  bad1 += bad4;
  each(0, 0x43E00000u, [&](uint32_t u) {
    const float w = bits_to_f32(u);
    if (kvx_fp4_fast::e4m3_pos(w) != f32_to_e4m3(w) && bad2++ < 10)
      printf("e4m3 mismatch: %08x got %02x want %02x\n", u, kvx_fp4_fast::e4m3_pos(w), f32_to_e4m3(w));
  });
  printf("e4m3_pos: FP32 in [0, 448]%s, %lld mismatches\n", quick ? " (sampled)" : "", bad2);
  long long bad5 = 0;
  each(0, 0x7F7FFFFFu, [&](uint32_t u) {
    const float w = bits_to_f32(u);
    const uint32_t want = f32_to_e4m3(w < 448.0f ? w : 448.0f);
    if (kvx_fp4_fast::e4m3_sat(w) != want && bad5++ < 10)
      printf("e4m3_sat mismatch: %08x got %02x want %02x\n", u, kvx_fp4_fast::e4m3_sat(w), want);
  });
  printf("e4m3_sat: finite FP32 >= 0%s, %lld mismatches\n", quick ? " (sampled)" : "", bad5);
  bad2 += bad5;
  for (uint32_t s = 0; s <= 0x7Eu; ++s)
    if (f32_to_bits(kvx_fp4_fast::e4m3_pos_f32(s)) != f32_to_bits(e4m3_to_f32((uint8_t)s)) && bad3++ < 10)
      printf("e4m3 decode mismatch: %02x\n", s);
  printf("e4m3_pos_f32: 127 bytes, %lld mismatches\n", bad3);
  long long bad6 = 0, n6 = 0;
  for (int src = 0; src < 2; ++src) { /* 0: F16 x, 1: BF16 x */
    const int e_lo = src ? -127 : -15, e_hi = src ? 127 : 14;
    const uint32_t x_hi = src ? 0x7F7Fu : 0x7BFFu; /* the largest finite magnitude */
    for (int e = e_lo; e <= e_hi; ++e) {
      const float inv = ue8m0_to_f32((uint8_t)(127 - e)); /* fp4_block_scale's 2^-e */
      for (uint32_t xb = 0; xb <= x_hi; ++xb) {
        const float x = src ? bf16_to_f32((uint16_t)xb) : f16_to_f32((uint16_t)xb);
        const float s = f16_to_f32(f32_to_f16(x * inv)); /* x * inv: exact for F16 x, the kernel's FP32 product for BF16 */
        const uint32_t got = f32_to_f16(kvx_fp4_fast::e2m1_h<kvx_fp4_fast::HostF16>(s));
        const uint32_t want = (uint32_t)f32_to_e2m1(x * inv) << 9;
        ++n6;
        if (got != want && bad6++ < 10)
          printf("e2m1_h mismatch: %s %04x e %d got %04x want %04x\n", src ? "bf16" : "f16", xb, e, got, want);
      }
    }
  }
  printf("e2m1_h: %lld (x, e) of F16 and BF16 x, %lld mismatches\n", n6, bad6);
  bad1 += bad6;
  /* 7. the thresholds of the 16-bit writes: e2m1_count(|x|, e2m1_thresholds(d)) is
   * f32_to_e2m1(|x| / d) & 7 (NVFP4: d = float(s) g, every s and a spread of g) and
   * f32_to_e2m1(|x| 2^-e) & 7 (MXFP4: d = 2^e, every e), for every |x| of the kernels'
   * fast path: every finite F16, BF16 below 2^60 (NVFP4) or up to 2^121 (bits 0x7C00,
   * MXFP4); quick: every 61st |x| and the five around each threshold. */
  long long bad7 = 0, n7 = 0;
  const float gs[] = {1.0f, 0.5f, 3.0f, 1.0f / 3.0f, 0.1f, 7.3e-5f, 1234.5f, 0x1.8p-60f, 0x1.fffffep59f,
                      0.0123f, 1.0f / 2688.0f, 0x1p-40f};
  for (int bf = 0; bf < 2; ++bf) {
    uint32_t a_hi = 0;
    auto val = [&](uint32_t a) { return bf ? bf16_to_f32((uint16_t)a) : f16_to_f32((uint16_t)a); };
    auto check = [&](float d, auto&& want) {
      uint32_t t[7];
      if (bf) {
        kvx_fp4_fast::e2m1_thresholds<true>(d, t);
      } else {
        kvx_fp4_fast::e2m1_thresholds<false>(d, t);
      }
      auto one = [&](uint32_t a) {
        if (a > a_hi) return;
        ++n7;
        const uint32_t got = kvx_fp4_fast::e2m1_count(a, t), w = want(val(a));
        if (got != w && bad7++ < 10)
          printf("threshold mismatch: %s d %a |x| %04x got %u want %u\n", bf ? "bf16" : "f16", d, a, got, w);
      };
      if (!quick) {
        for (uint32_t a = 0; a <= a_hi; ++a) one(a);
        return;
      }
      for (uint32_t a = 0; a <= a_hi; a += 61) one(a);
      for (int k = 0; k < 7; ++k)
        for (int o = -2; o <= 2; ++o) one((t[k] & 0xFFFFu) + (uint32_t)o);
    };
    a_hi = bf ? 0x5D7Fu : 0x7BFFu;
    for (const float g : gs)
      for (uint32_t s8 = 1; s8 <= 0x7Eu; ++s8) {
        const float d = e4m3_to_f32((uint8_t)s8) * g; /* fp4_block_scale's denom */
        if (d > 0.0f) check(d, [&](float x) { return f32_to_e2m1(x / d) & 7u; });
      }
    a_hi = bf ? 0x7C00u : 0x7BFFu;
    for (int e = -127; e <= 127; ++e) {
      const float inv = ue8m0_to_f32((uint8_t)(127 - e));
      check(ue8m0_to_f32((uint8_t)(e + 127)), [&](float x) { return f32_to_e2m1(x * inv) & 7u; });
    }
  }
  printf("e2m1 thresholds: %lld (|x|, d) of F16 and BF16 |x|, %lld mismatches\n", n7, bad7);
  bad1 += bad7;
  /* 8. the NVFP4 gathers' packed products (nv_ab, nv_pair_entry): where nv_ab takes a block,
   * each half of a code byte is RN_T(2^k M), M the half of A | B << 16 that the entry's byte
   * permute picks (2^k M is exact in FP32, so one rounding of it is the packed product). */
  long long bad8 = 0, n8 = 0, slow8 = 0;
  for (int bf = 0; bf < 2; ++bf) {
    auto to_t = [&](float v) { return (uint32_t)(bf ? f32_to_bf16(v) : f32_to_f16(v)); };
    auto from_t = [&](uint32_t h) { return bf ? bf16_to_f32((uint16_t)h) : f16_to_f32((uint16_t)h); };
    auto block = [&](uint32_t s8, float g) {
      const float sf = e4m3_to_f32((uint8_t)s8);
      if (sf != sf) return;
      uint32_t ab;
      const bool fast = bf ? kvx_fp4_fast::nv_ab<true>(sf, g, &ab) : kvx_fp4_fast::nv_ab<false>(sf, g, &ab);
      if (!fast) {
        ++slow8;
        return;
      }
      for (uint32_t byte = 0; byte < 256; ++byte) {
        uint32_t mul, sel;
        if (bf) {
          kvx_fp4_fast::nv_pair_entry<true>(byte, &mul, &sel);
        } else {
          kvx_fp4_fast::nv_pair_entry<false>(byte, &mul, &sel);
        }
        for (int half = 0; half < 2; ++half) {
          const uint32_t m = ((sel >> (8 * half)) & 0xFFu) == 0x32u ? ab >> 16 : ab & 0xFFFFu;
          const uint32_t got = to_t(from_t((mul >> (16 * half)) & 0xFFFFu) * from_t(m));
          const uint32_t want = to_t(fp4_decode_with(FP4_NVFP4, (byte >> (4 * half)) & 15u, sf, g));
          ++n8;
          if (got != want && bad8++ < 10)
            printf("nv pair mismatch: %s s %02x g %a byte %02x got %04x want %04x\n", bf ? "bf16" : "f16", s8, g,
                   byte, got, want);
        }
      }
    };
    std::vector<float> spread = {1.0f, 0.37f, -0.37f, 0.5f, 3.0f, 1.0f / 3.0f, 0.0241f, 7.3e-5f, 1234.5f, 100.3f,
                                 0x1p-20f, 0x1.8p-116f, 0x1.3p+110f, 0.0f, -0.0f};
    uint32_t lcg = 12345u;
    for (int i = 0; i < (quick ? 24 : 400); ++i) { /* log-uniform g in [2^-40, 2^40], both signs */
      lcg = lcg * 1664525u + 1013904223u;
      const float e = (float)((int)(lcg >> 8) % 80 - 40);
      lcg = lcg * 1664525u + 1013904223u;
      const float g = ldexpf(1.0f + (float)(lcg >> 9) * 0x1p-23f, (int)e);
      spread.push_back((lcg & 1u) ? -g : g);
    }
    for (const float g : spread)
      for (uint32_t s8 = 0; s8 < 256; ++s8) block(s8, g);
    for (uint32_t s8 = 1; s8 <= 0x7Eu; ++s8) { /* each scale's bounds, g a few FP32 steps either side */
      const float sf = e4m3_to_f32((uint8_t)s8);
      /* the floor; where A, 2A, 4A, B, 2B or 4B reach T's overflow bound (F16 65520, BF16 2^127 (2 - 2^-8)) */
      const float lo = bf ? 0x1p-125f : 0x1p-13f, top = bf ? 0x1.ffp+127f : 65520.0f;
      for (const float edge : {lo / sf, top / sf, 0.5f * top / sf, 0.25f * top / sf, top / (1.5f * sf),
                               0.5f * top / (1.5f * sf), 0.25f * top / (1.5f * sf)})
        for (int d = -3; d <= 3; ++d) {
          const float g = bits_to_f32(f32_to_bits(edge) + (uint32_t)d);
          block(s8, g);
          block(s8 | 0x80u, g);
          block(s8, -g);
        }
      for (int i = 0; i < (quick ? 24 : 400); ++i) { /* g across [lo / (2 sf), 2 lo / sf]: the values about the floor */
        lcg = lcg * 1664525u + 1013904223u;
        block(s8, lo / sf * (0.5f + 1.5f * (float)(lcg >> 8) * 0x1p-24f));
      }
    }
  }
  printf("nv pairs: %lld values of F16 and BF16 fast blocks (%lld blocks to the FP32 path), %lld mismatches\n", n8,
         slow8, bad8);
  bad1 += bad8;
  /* 9. nv_alu_word (KVX_FP4_G_NV_ALU): its operands' packed product gives the oracle's bytes for
   * every code byte in each of a code word's four words, the other three bytes drawn at random,
   * wherever nv_ab takes the block (every scale byte, a spread of g). */
  long long bad9 = 0, n9 = 0;
  for (int bf = 0; bf < 2; ++bf) {
    auto to_t = [&](float v) { return (uint32_t)(bf ? f32_to_bf16(v) : f32_to_f16(v)); };
    auto from_t = [&](uint32_t h) { return bf ? bf16_to_f32((uint16_t)h) : f16_to_f32((uint16_t)h); };
    std::vector<float> gs = {1.0f, -1.0f, 0.37f, 0.0241f, 7.3e-5f, 1234.5f, 0x1p-20f, 0x1.8p-116f, 0x1.3p+110f};
    uint32_t lcg9 = 777u;
    for (int i = 0; i < (quick ? 6 : 60); ++i) {
      lcg9 = lcg9 * 1664525u + 1013904223u;
      const float g = ldexpf(1.0f + (float)(lcg9 >> 9) * 0x1p-23f, (int)((lcg9 >> 4) % 80) - 40);
      gs.push_back((lcg9 & 1u) ? -g : g);
    }
    for (const float g : gs)
      for (uint32_t s8 = 0; s8 < 256; ++s8) {
        const float sf = e4m3_to_f32((uint8_t)s8);
        if (sf != sf) continue;
        uint32_t ab;
        if (!(bf ? kvx_fp4_fast::nv_ab<true>(sf, g, &ab) : kvx_fp4_fast::nv_ab<false>(sf, g, &ab))) continue;
        const uint32_t zab = ab & 0x80008000u;
        for (int kk = 0; kk < 4; ++kk)
          for (uint32_t byte = 0; byte < 256; ++byte) {
            lcg9 = lcg9 * 1664525u + 1013904223u;
            const uint32_t cw = (lcg9 & ~(0xFFu << (8 * kk))) | byte << (8 * kk);
            uint32_t mul = 0, op = 0, sels[2];
            kvx_fp4_fast::nv_alu_sels(cw, sels);
            const uint32_t sel = sels[kk >> 1] >> (16 * (kk & 1));
#define KVX_NV_ALU_CASE(K)                                                   \
  case K:                                                                    \
    if (bf)                                                                  \
      kvx_fp4_fast::nv_alu_word<true, K>(cw, sel, ab, zab, &mul, &op);        \
    else                                                                     \
      kvx_fp4_fast::nv_alu_word<false, K>(cw, sel, ab, zab, &mul, &op);       \
    break;
            switch (kk) {
              KVX_NV_ALU_CASE(0)
              KVX_NV_ALU_CASE(1)
              KVX_NV_ALU_CASE(2)
              KVX_NV_ALU_CASE(3)
            }
#undef KVX_NV_ALU_CASE
            for (int half = 0; half < 2; ++half) {
              const uint32_t got = to_t(from_t((mul >> (16 * half)) & 0xFFFFu) * from_t((op >> (16 * half)) & 0xFFFFu));
              const uint32_t want = to_t(fp4_decode_with(FP4_NVFP4, (byte >> (4 * half)) & 15u, sf, g));
              ++n9;
              if (got != want && bad9++ < 10)
                printf("nv alu mismatch: %s s %02x g %a word %d byte %02x got %04x want %04x\n", bf ? "bf16" : "f16",
                       s8, g, kk, byte, got, want);
            }
          }
      }
  }
  printf("nv alu words: %lld values of F16 and BF16 fast blocks, %lld mismatches\n", n9, bad9);
  bad1 += bad9;
  /* 10. e2m1_word_scaled (KVX_FP4_G_MX_ALU): times 2^14 (F16) or 2^126 (BF16), one exact product,
   * each value of every code byte in each word of a code word is the E2M1 value in T, bit for bit
   * (the MX gathers' table of pairs). */
  long long bad10 = 0, n10 = 0;
  for (int bf = 0; bf < 2; ++bf) {
    auto from_t = [&](uint32_t h) { return bf ? bf16_to_f32((uint16_t)h) : f16_to_f32((uint16_t)h); };
    uint32_t lcg10 = 4242u;
    for (int kk = 0; kk < 4; ++kk)
      for (uint32_t byte = 0; byte < 256; ++byte)
        for (int rep = 0; rep < 4; ++rep) {
          lcg10 = lcg10 * 1664525u + 1013904223u;
          const uint32_t cw = (lcg10 & ~(0xFFu << (8 * kk))) | byte << (8 * kk);
          uint32_t v = 0;
#define KVX_MX_ALU_CASE(K)                                                              \
  case K:                                                                               \
    v = bf ? kvx_fp4_fast::e2m1_word_scaled<true, K>(cw) : kvx_fp4_fast::e2m1_word_scaled<false, K>(cw); \
    break;
          switch (kk) {
            KVX_MX_ALU_CASE(0)
            KVX_MX_ALU_CASE(1)
            KVX_MX_ALU_CASE(2)
            KVX_MX_ALU_CASE(3)
          }
#undef KVX_MX_ALU_CASE
          for (int half = 0; half < 2; ++half) {
            const float x = from_t((v >> (16 * half)) & 0xFFFFu) * (bf ? 0x1p126f : 0x1p14f); /* exact */
            const float want = e2m1_to_f32((byte >> (4 * half)) & 15u);
            ++n10;
            if (f32_to_bits(x) != f32_to_bits(want) && bad10++ < 10)
              printf("mx alu mismatch: %s word %d byte %02x got %a want %a\n", bf ? "bf16" : "f16", kk, byte, x, want);
          }
        }
  }
  printf("mx alu words: %lld values of F16 and BF16 code words, %lld mismatches\n", n10, bad10);
  bad1 += bad10;
  /* 11. the scale tables */
  long long bad11 = 0;
  static const kvx_fp4_fast::ScaleBits<true> nv_tab;
  static const kvx_fp4_fast::ScaleBits<false> mx_tab;
  for (uint32_t b = 0; b < 256; ++b) {
    const uint32_t want_nv = f32_to_bits(fp4_scale_f32(FP4_NVFP4, (uint8_t)b));
    const uint32_t want_mx = f32_to_bits(fp4_scale_f32(FP4_MXFP4, (uint8_t)b));
    if (nv_tab.w[b] != want_nv && bad11++ < 10) printf("scale table mismatch: nvfp4 %02x got %08x want %08x\n", b, nv_tab.w[b], want_nv);
    if (mx_tab.w[b] != want_mx && bad11++ < 10) printf("scale table mismatch: mx %02x got %08x want %08x\n", b, mx_tab.w[b], want_mx);
  }
  static const kvx_fp4_fast::MxPairs<false> pf16;
  static const kvx_fp4_fast::MxPairs<true> pbf16;
  for (uint32_t k = 0; k < 256; ++k) {
    const uint32_t lo = k & 15u, hi = k >> 4;
    const uint32_t wf = f32_to_f16(e2m1_to_f32(lo)) | ((uint32_t)f32_to_f16(e2m1_to_f32(hi)) << 16);
    const uint32_t wb = f32_to_bf16(e2m1_to_f32(lo)) | ((uint32_t)f32_to_bf16(e2m1_to_f32(hi)) << 16);
    if (pf16.w[k] != wf && bad11++ < 10) printf("pair table mismatch: f16 %02x got %08x want %08x\n", k, pf16.w[k], wf);
    if (pbf16.w[k] != wb && bad11++ < 10) printf("pair table mismatch: bf16 %02x got %08x want %08x\n", k, pbf16.w[k], wb);
  }
  printf("scale and pair tables: 512 scale bytes, 512 code bytes, %lld mismatches\n", bad11);
  bad1 += bad11;
  return bad1 || bad2 || bad3 ? 1 : 0;
}
