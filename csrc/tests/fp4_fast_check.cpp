/*
 * fp4_fast_check.cpp -- exhaustive host check of csrc/reference/cuda/fp4_fast.h,
 * the exact encoding steps of the fast FP4 CUDA kernels (docs/fp4.md "CUDA figures"):
 *   1. e2m1_f16(a) is, as F16 bits, fp4.h's f32_to_e2m1(a) << 9, for every
 *      FP32 a >= 0 that is not NaN (inf included): 2^31 inputs; and so is
 *      e2m1_f16_scaled(RN(a * 2^-14)), the form the kernels use;
 *   2. e4m3_pos(w) == convert.h's f32_to_e4m3(w) for every FP32 w in [0, 448];
 *   3. e4m3_pos_f32(s) == e4m3_to_f32(s) (bits) for s in [0, 0x7E].
 * Build and run (about 30 s):
 *   g++ -O2 -ffp-contract=off -std=c++17 -Icsrc/reference -Icsrc/include \
 *       csrc/tests/fp4_fast_check.cpp -o /tmp/fp4fast && /tmp/fp4fast
 * Exit status 0 when all hold.
 */
#include <stdint.h>
#include <stdio.h>

#include "cuda/fp4_fast.h"
#include "fp4.h"

int main() {
  using namespace kvx_ref;
  long long bad1 = 0, bad2 = 0, bad3 = 0;
  for (uint64_t u = 0; u <= 0x7F800000ull; ++u) {
    const float a = bits_to_f32((uint32_t)u);
    const uint32_t got = f32_to_f16(kvx_fp4_fast::e2m1_f16(a));
    const uint32_t want = (uint32_t)f32_to_e2m1(a) << 9;
    if (got != want && bad1++ < 10) printf("e2m1 mismatch: %08x got %04x want %04x\n", (uint32_t)u, got, want);
  }
  printf("e2m1_f16: %llu inputs, %lld mismatches\n", 0x7F800001ull, bad1);
  long long bad4 = 0;
  for (uint64_t u = 0; u <= 0x7F800000ull; ++u) {
    const float a = bits_to_f32((uint32_t)u);
    const uint32_t got = f32_to_f16(kvx_fp4_fast::e2m1_f16_scaled(a * 6.103515625e-05f));
    const uint32_t want = (uint32_t)f32_to_e2m1(a) << 9;
    if (got != want && bad4++ < 10) printf("e2m1 scaled mismatch: %08x got %04x want %04x\n", (uint32_t)u, got, want);
  }
  printf("e2m1_f16_scaled: %llu inputs a, s = RN(a 2^-14), %lld mismatches\n", 0x7F800001ull, bad4);
  bad1 += bad4;
  for (uint32_t u = 0; u <= 0x43E00000u; ++u) {
    const float w = bits_to_f32(u);
    if (kvx_fp4_fast::e4m3_pos(w) != f32_to_e4m3(w) && bad2++ < 10)
      printf("e4m3 mismatch: %08x got %02x want %02x\n", u, kvx_fp4_fast::e4m3_pos(w), f32_to_e4m3(w));
  }
  printf("e4m3_pos: all FP32 in [0, 448], %lld mismatches\n", bad2);
  for (uint32_t s = 0; s <= 0x7Eu; ++s)
    if (f32_to_bits(kvx_fp4_fast::e4m3_pos_f32(s)) != f32_to_bits(e4m3_to_f32((uint8_t)s)) && bad3++ < 10)
      printf("e4m3 decode mismatch: %02x\n", s);
  printf("e4m3_pos_f32: 127 bytes, %lld mismatches\n", bad3);
  return bad1 || bad2 || bad3 ? 1 : 0;
}
