/*
 * kvx_indep_core.h -- the code of the independent KVX 1.2 host provider, with the choices the
 * spec and the readings leave open as compile-time switches. One translation unit per library
 * sets its switches and includes this file once:
 *   indep/kvx_indep_provider.c   libkvx_testing_indep.so   every switch 0 (left undefined)
 *   contra/kvx_contra_provider.c libkvx_testing_contra.so  every switch 1 (the contrarian)
 * A switch left undefined reads as 0 in `#if`: the independent provider's choice, which is also
 * the bundled reference's. 1 takes the other one. The switches (docs/spec-readings.md names
 * each reading):
 *   CHOICE_ABI_PATCH_7          kvx_get_version reports patch 7 (spec 3: "ABI version is (major,
 *                               minor, patch)"; nothing pins the patch).
 *   CHOICE_IGNORE_TAIL          a newer minor's struct: a non-zero unknown tail, and a partial 1.2
 *                               field, are ignored rather than refused (R-SIZE: "it may answer
 *                               UNSUPPORTED ... and must never misread them").
 *   CHOICE_REFUSE_INVALID       refusals answer INVALID_ARGUMENT, not UNSUPPORTED (spec 8:
 *                               INVALID_ARGUMENT "Malformed descriptor or unsupported field";
 *                               R-REFUSAL: both are refusals).
 *   CHOICE_VALIDATE_RULES_ONLY  kvx_validate_cache_desc answers OK for every valid cache, served or
 *                               not (spec 7: it "MUST validate layout, dtype, shape, stride, and
 *                               required fields"; it says nothing of support).
 *   CHOICE_HND_ONLY             HND the only core layout: NHD caches refused, FP8 ones excepted
 *                               (vLLM's FP8 flash layout) (R-REFUSAL: core needs NHD or HND).
 *   CHOICE_REFUSE_LARGE         caches and IO tensors past 2^31 elements refused (R-LARGE: "A
 *                               provider may refuse such a cache or such IO tensors").
 *   CHOICE_REFUSE_KV_OFFSETS    KV_OFFSETS tables refused, after their descriptor rules (spec 10:
 *                               an optional feature).
 *   CHOICE_REFUSE_BLOCK_SCALES  PER_BLOCK / PER_BLOCK_HEAD FP8 scales refused (R-FP8: the readings
 *                               leave their shape to the provider).
 *   CHOICE_DECLINE_SCALE_PTR    the k_scale / v_scale pointer fallback declined: such a write is
 *                               refused (spec 6.9: "implementations MAY fall back to k_scale/v_scale").
 *   CHOICE_NO_PRESCAN           data errors: the valid part of the call is written and the first
 *                               error answered after it, sequence by sequence (R-ORDER: "The spec
 *                               asks no pre-scan"; two step-5 errors of one call are not ranked).
 *   CHOICE_FIRST_TOKEN_WINS     duplicate slots in one write: the first token wins, tokens written
 *                               last to first (spec 5.2 gives no token order; R-WRITE).
 *   CHOICE_GATHER_RANGE_INVALID a used block id outside the cache and a length past the table's
 *                               capacity answer INVALID_ARGUMENT (R-DATA: "the status should be
 *                               OUT_OF_RANGE or INVALID_ARGUMENT").
 *   CHOICE_INDPTR_ORDER_OOR     a decreasing RAGGED indptr answers OUT_OF_RANGE (R-DATA, the same
 *                               sentence); indptr[0] < 0 and indptr[S] != indices_count stay
 *                               INVALID_ARGUMENT.
 *   CHOICE_OTHER_NANS           a NaN a conversion produces takes the other sign and the smallest
 *                               payload (R-NAN-CLASS: any NaN of the destination, "any payload,
 *                               either sign"); plain copies stay bit-exact.
 *   CHOICE_FP4_OTHER_NAN_BLOCK  an FP4 NaN block stores scale byte 0xFF and non-zero codes
 *                               (docs/numerics.md: its scale byte may be either NaN and its codes
 *                               are not compared).
 *   CHOICE_FP4_INF_AS_NAN       an FP4 block with an Inf input is stored as a NaN block (R-FP4:
 *                               "must not crash and must not disturb other blocks (informational
 *                               beyond that)").
 */
#define KVX_ABI_TARGET_MINOR 2
#ifndef KVX_BUILD_PROVIDER
#define KVX_BUILD_PROVIDER
#endif
#include "kvx/kvx_abi.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

typedef kvx_status_t st_t;
#define OK KVX_STATUS_OK
#define INVALID KVX_STATUS_INVALID_ARGUMENT
#define UNSUP KVX_STATUS_UNSUPPORTED
#define OOR KVX_STATUS_OUT_OF_RANGE

#define CHECK(cond)      \
  do {                   \
    if (!(cond)) return INVALID; \
  } while (0)
#define TRY(expr)            \
  do {                       \
    st_t st_ = (expr);       \
    if (st_ != OK) return st_; \
  } while (0)

/* The status of a refusal of an optional feature (CHOICE_REFUSE_INVALID). */
#if CHOICE_REFUSE_INVALID
#define REFUSE INVALID
#else
#define REFUSE UNSUP
#endif
/* Gather data errors the readings let be OUT_OF_RANGE or INVALID_ARGUMENT (R-DATA): a used
 * block id outside the cache or a length past the table's capacity (CHOICE_GATHER_RANGE_INVALID),
 * a decreasing RAGGED indptr (CHOICE_INDPTR_ORDER_OOR). */
#if CHOICE_GATHER_RANGE_INVALID
#define GATHER_RANGE INVALID
#else
#define GATHER_RANGE OOR
#endif
#if CHOICE_INDPTR_ORDER_OOR
#define INDPTR_BAD OOR
#else
#define INDPTR_BAD INVALID
#endif

/* ------------------------------------------------------------------------ */
/* Numerics                                                                  */

static inline uint32_t f2u(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}
static inline float u2f(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}

#if CHOICE_OTHER_NANS
/* The NaN of a conversion: the other sign, the smallest payload (signalling). */
static float nan_other(float v) { return u2f(((f2u(v) & 0x80000000u) ^ 0x80000000u) | 0x7f800001u); }
#define FP8_NAN(neg) nan_other((neg) ? -1.0f : 1.0f)
#else
#define FP8_NAN(neg) NAN
#endif

static float f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  uint32_t e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
  if (e == 0x1f) {
#if CHOICE_OTHER_NANS
    if (m) return u2f((sign ^ 0x80000000u) | 0x7f800001u); /* NaN: the other sign, payload 1 */
#endif
    return u2f(sign | 0x7f800000u | (m << 13)); /* inf / NaN, payload kept */
  }
  if (e == 0) {
    float v = ldexpf((float)m, -24); /* subnormal or zero: exact */
    return sign ? -v : v;
  }
  return u2f(sign | ((e - 15 + 127) << 23) | (m << 13));
}

static uint16_t f32_to_f16(float f) {
  uint32_t x = f2u(f);
  uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
  uint32_t ax = x & 0x7fffffffu;
#if CHOICE_OTHER_NANS
  if (ax > 0x7f800000u) return (uint16_t)((sign ^ 0x8000u) | 0x7c01u); /* NaN: other sign, payload 1 */
#else
  if (ax > 0x7f800000u) /* NaN: stays NaN (quiet bit set, top payload bits kept) */
    return (uint16_t)(sign | 0x7e00u | ((ax >> 13) & 0x3ffu));
#endif
  if (ax >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* >= 65520 rounds to inf */
  if (ax < 0x38800000u) {                                     /* below 2^-14: subnormal step 2^-24 */
    float a = u2f(ax);
    uint32_t m = (uint32_t)nearbyintf(a * 16777216.0f); /* exact scaling, RNE */
    return (uint16_t)(sign | m);                        /* m == 1024 is the smallest normal */
  }
  uint32_t e = (ax >> 23) - 127 + 15;
  uint32_t mant = ax & 0x7fffffu;
  uint32_t r = (e << 10) | (mant >> 13);
  uint32_t rem = mant & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (r & 1u))) r++;
  return (uint16_t)(sign | r);
}

static float bf16_to_f32(uint16_t b) {
#if CHOICE_OTHER_NANS
  if ((b & 0x7fffu) > 0x7f80u) return u2f(((((uint32_t)b << 16) & 0x80000000u) ^ 0x80000000u) | 0x7f800001u);
#endif
  return u2f((uint32_t)b << 16);
}

static uint16_t f32_to_bf16(float f) {
  uint32_t x = f2u(f);
#if CHOICE_OTHER_NANS
  if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((((x >> 16) & 0x8000u) ^ 0x8000u) | 0x7f81u);
#else
  if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x0040u); /* NaN stays NaN */
#endif
  uint32_t r = x + 0x7fffu + ((x >> 16) & 1u);
  return (uint16_t)(r >> 16);
}

/* FP8: E4M3 (fn: no inf, 0x7f / 0xff NaN, max 448), E5M2 (IEEE-like, max 57344). */
static float fp8_to_f32(uint8_t b, int e4m3) {
  int neg = b & 0x80;
  float v;
  if (e4m3) {
    int e = (b >> 3) & 0xf, m = b & 7;
    if ((b & 0x7f) == 0x7f) return FP8_NAN(neg);
    v = e == 0 ? ldexpf((float)m, -9) : ldexpf((float)(8 + m), e - 7 - 3);
  } else {
    int e = (b >> 2) & 0x1f, m = b & 3;
    if (e == 0x1f) return m ? FP8_NAN(neg) : (neg ? -INFINITY : INFINITY);
    v = e == 0 ? ldexpf((float)m, -16) : ldexpf((float)(4 + m), e - 15 - 2);
  }
  return neg ? -v : v;
}

/* Clamp to the format's largest finite value (inf saturates), then RNE; NaN stays NaN. */
static uint8_t f32_to_fp8(float q, int e4m3) {
  const int mbits = e4m3 ? 3 : 2, bias = e4m3 ? 7 : 15, emin = 1 - bias;
  const double maxv = e4m3 ? 448.0 : 57344.0;
  uint8_t sign = signbit(q) ? 0x80 : 0;
#if CHOICE_OTHER_NANS
  if (isnan(q)) return (uint8_t)((sign ^ 0x80) | (e4m3 ? 0x7f : 0x7d)); /* other sign; E5M2 0x7d */
#else
  if (isnan(q)) return (uint8_t)(sign | (e4m3 ? 0x7f : 0x7e));
#endif
  double a = fabs((double)q);
  if (a > maxv) a = maxv;
  if (a == 0.0) return sign;
  int E;
  (void)frexp(a, &E);
  E -= 1; /* a in [2^E, 2^(E+1)) */
  if (E < emin) E = emin;
  double r = nearbyint(ldexp(a, mbits - E)); /* number of quanta, RNE */
  if (r == 0.0) return sign;
  int expf_, mant;
  if (E == emin && r < (double)(1 << mbits)) {
    expf_ = 0;
    mant = (int)r;
  } else {
    if (r >= (double)(2 << mbits)) { /* carried into the next binade */
      r /= 2;
      E += 1;
    }
    expf_ = E + bias;
    mant = (int)r - (1 << mbits);
  }
  return (uint8_t)(sign | (expf_ << mbits) | mant);
}

/* E2M1: sign bit 3, magnitude index 0..7 into 0, .5, 1, 1.5, 2, 3, 4, 6. */
static const float e2m1_mag[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
static float e2m1_value(unsigned code) {
  float v = e2m1_mag[code & 7];
  return (code & 8) ? -v : v;
}
/* v already clipped to [-6, 6]; round to nearest, ties to the even code. */
static unsigned e2m1_encode(float v) {
  unsigned s = signbit(v) ? 8u : 0u;
  float a = fabsf(v);
  unsigned c;
  if (a <= 0.25f) c = 0;
  else if (a < 0.75f) c = 1;
  else if (a <= 1.25f) c = 2;
  else if (a < 1.75f) c = 3;
  else if (a <= 2.5f) c = 4;
  else if (a < 3.5f) c = 5;
  else if (a <= 5.0f) c = 6;
  else c = 7;
  return s | c;
}
static float clip6(float v) { return v > 6.0f ? 6.0f : (v < -6.0f ? -6.0f : v); }

/* ------------------------------------------------------------------------ */
/* Dtypes and views                                                          */

static int is_base_dtype(int dt) { return dt == KVX_DTYPE_F16 || dt == KVX_DTYPE_BF16 || dt == KVX_DTYPE_F32; }
static int is_fp8(int dt) { return dt == KVX_DTYPE_F8_E4M3 || dt == KVX_DTYPE_F8_E5M2; }
static int is_cache_dtype_v11(int dt) { return is_base_dtype(dt) || is_fp8(dt); }
static int is_index_dtype(int dt) { return dt == KVX_DTYPE_S32 || dt == KVX_DTYPE_S64; }
static int64_t elem_bytes(int dt) {
  switch (dt) {
    case KVX_DTYPE_F16: case KVX_DTYPE_BF16: return 2;
    case KVX_DTYPE_F32: case KVX_DTYPE_S32: case KVX_DTYPE_U32: return 4;
    case KVX_DTYPE_S64: case KVX_DTYPE_U64: return 8;
    case KVX_DTYPE_F8_E4M3: case KVX_DTYPE_F8_E5M2: case KVX_DTYPE_U8: case KVX_DTYPE_UE8M0: return 1;
    default: return 0; /* F4_E2M1: nibbles, handled apart */
  }
}

static float load_f32(int dt, const uint8_t* p) {
  uint16_t h;
  float f;
  switch (dt) {
    case KVX_DTYPE_F16: memcpy(&h, p, 2); return f16_to_f32(h);
    case KVX_DTYPE_BF16: memcpy(&h, p, 2); return bf16_to_f32(h);
    case KVX_DTYPE_F32: memcpy(&f, p, 4); return f;
    case KVX_DTYPE_F8_E4M3: return fp8_to_f32(*p, 1);
    case KVX_DTYPE_F8_E5M2: return fp8_to_f32(*p, 0);
    default: return NAN;
  }
}
/* A conversion's store (never a plain copy): the NaN encodings of CHOICE_OTHER_NANS. */
static void store_f32(int dt, uint8_t* p, float v) {
  uint16_t h;
  switch (dt) {
    case KVX_DTYPE_F16: h = f32_to_f16(v); memcpy(p, &h, 2); break;
    case KVX_DTYPE_BF16: h = f32_to_bf16(v); memcpy(p, &h, 2); break;
    case KVX_DTYPE_F32:
#if CHOICE_OTHER_NANS
      if (isnan(v)) v = nan_other(v);
#endif
      memcpy(p, &v, 4);
      break;
    case KVX_DTYPE_F8_E4M3: *p = f32_to_fp8(v, 1); break;
    case KVX_DTYPE_F8_E5M2: *p = f32_to_fp8(v, 0); break;
    default: break;
  }
}

static inline int64_t fdiv2(int64_t off) { return (off - (off & 1)) / 2; }
static unsigned nib_get(const uint8_t* base, int64_t off) {
  uint8_t b = base[fdiv2(off)];
  return (off & 1) ? (unsigned)(b >> 4) : (unsigned)(b & 0xf);
}
/* One atomic byte update: two tokens whose nibbles share a byte may be written by
 * concurrent calls on disjoint slots (spec 7.2). */
static void nib_set(uint8_t* base, int64_t off, unsigned code) {
  uint8_t* p = base + fdiv2(off);
  int hi = (int)(off & 1);
  uint8_t old = __atomic_load_n(p, __ATOMIC_RELAXED), nw;
  do {
    nw = hi ? (uint8_t)((old & 0x0f) | ((code & 0xf) << 4)) : (uint8_t)((old & 0xf0) | (code & 0xf));
  } while (!__atomic_compare_exchange_n(p, &old, nw, 1, __ATOMIC_RELAXED, __ATOMIC_RELAXED));
}

/* A strided tensor: element (i0..i3 / i4) at base + sum(i * stride) elements. */
typedef struct {
  uint8_t* base;
  int dtype;
  int layout; /* cache tensors: NHD / HND / HND_PACKED / CUSTOM; IO: 0 */
  int ndim;
  int64_t shape[5];
  int64_t stride[5];
  int64_t pack;
} view_t;

/* Element offset of cache element (block, token, head, dim). */
static int64_t cache_off(const view_t* v, int64_t b, int64_t t, int64_t h, int64_t d) {
  const int64_t* s = v->stride;
  switch (v->layout) {
    case KVX_LAYOUT_BLOCK_HND: return b * s[0] + h * s[1] + t * s[2] + d * s[3];
    case KVX_LAYOUT_BLOCK_HND_PACKED: return b * s[0] + h * s[1] + (d / v->pack) * s[2] + t * s[3] + (d % v->pack) * s[4];
    default: return b * s[0] + t * s[1] + h * s[2] + d * s[3]; /* NHD, CUSTOM */
  }
}
/* Element offset of IO element (row, head, dim); 4-D outputs split the row. */
static int64_t io_off(const view_t* v, int64_t row, int64_t h, int64_t d) {
  const int64_t* s = v->stride;
  if (v->ndim == 4) {
    int64_t msl = v->shape[1];
    return (row / msl) * s[0] + (row % msl) * s[1] + h * s[2] + d * s[3];
  }
  return row * s[0] + h * s[1] + d * s[2];
}

/* The farthest element offsets, both ways, must fit int64 (and so must bytes). */
static int extent_ok(int ndim, const int64_t* shape, const int64_t* stride, int64_t esize) {
  int64_t pos = 0, neg = 0;
  for (int i = 0; i < ndim; i++) {
    if (shape[i] <= 1) continue;
    int64_t t;
    if (__builtin_mul_overflow(shape[i] - 1, stride[i], &t)) return 0;
    if (t >= 0) {
      if (__builtin_add_overflow(pos, t, &pos)) return 0;
    } else {
      if (__builtin_add_overflow(neg, t, &neg)) return 0;
    }
  }
  int64_t bp, bn;
  if (__builtin_mul_overflow(pos, esize, &bp) || __builtin_mul_overflow(neg, esize, &bn)) return 0;
  return 1;
}

/* Stride rules of R-CACHE for a tensor: 0 on an extent > 1 is INVALID (aliasing),
 * an overflowing offset is INVALID. Negative strides are served. */
static st_t check_strides(int ndim, const int64_t* shape, const int64_t* stride, int dtype) {
  for (int i = 0; i < ndim; i++)
    if (shape[i] > 1 && stride[i] == 0) return INVALID;
  int64_t es = dtype == KVX_DTYPE_F4_E2M1 ? 1 : elem_bytes(dtype);
  if (!extent_ok(ndim, shape, stride, es)) return INVALID;
  return OK;
}

/* ------------------------------------------------------------------------ */
/* Size guards and the 1.2 extension                                         */

#if !CHOICE_IGNORE_TAIL
static int tail_zero(const void* s, size_t from, size_t to) {
  const uint8_t* p = (const uint8_t*)s;
  for (size_t i = from; i < to; i++)
    if (p[i]) return 0;
  return 1;
}
#endif

/* Copies a top-level struct of the caller's size into a full local one (never
 * reading past `size`); *ext is 1 when the caller's struct holds the whole 1.2
 * field, *refuse is set when an unknown tail is not zero (spec 3: UNSUPPORTED).
 * CHOICE_IGNORE_TAIL: unknown bytes, zero or not, are ignored (the prefix it knows is
 * read; a partial 1.2 field is not read). */
static st_t copy_top(void* dst, const void* src, size_t v11, size_t v12, int* ext, int* refuse) {
  uint32_t size;
  memcpy(&size, src, 4);
  if (size < v11) return INVALID;
  memset(dst, 0, v12);
  const size_t known = size >= v12 ? v12 : v11;
  memcpy(dst, src, known);
  *ext = size >= v12;
#if CHOICE_IGNORE_TAIL
  (void)refuse;
#else
  if (!tail_zero(src, known, size)) *refuse = 1; /* a partial 1.2 field counts as unknown */
#endif
  return OK;
}

/* ------------------------------------------------------------------------ */
/* Cache descriptor                                                          */

typedef struct {
  kvx_cache_desc_t c; /* full 1.2 copy, zero tail for a v1.1 caller */
  view_t k, v;
  int memory;
  int fp4;       /* format, 0 for a v1.1 cache */
  int B;         /* FP4 values per scale */
  view_t ks, vs; /* FP4 scale pools */
} cache_t;

static int layout_ndim(int layout) {
  switch (layout) {
    case KVX_LAYOUT_BLOCK_NHD: case KVX_LAYOUT_BLOCK_HND: case KVX_LAYOUT_BLOCK_CUSTOM: return 4;
    case KVX_LAYOUT_BLOCK_HND_PACKED: return 5;
    default: return 0;
  }
}

/* Shape and stride rules of one cache tensor (data pool or FP4 scale pool whose last
 * dim is `last`). */
static st_t check_cache_tensor(const kvx_tensor_desc_t* t, const kvx_cache_desc_t* c, int64_t last, int allow_packed,
                               view_t* out) {
  CHECK(t->size >= sizeof(kvx_tensor_desc_t));
  int nd = layout_ndim(t->layout);
  CHECK(nd != 0);
  CHECK(allow_packed || t->layout != KVX_LAYOUT_BLOCK_HND_PACKED);
  CHECK(t->ndim == (uint32_t)nd);
  const int64_t nb = c->num_blocks, bs = c->block_size, H = c->num_kv_heads;
  const int64_t* sh = t->shape;
  int64_t pack = 0;
  switch (t->layout) {
    case KVX_LAYOUT_BLOCK_NHD:
    case KVX_LAYOUT_BLOCK_CUSTOM:
      CHECK(sh[0] == nb && sh[1] == bs && sh[2] == H && sh[3] == last);
      break;
    case KVX_LAYOUT_BLOCK_HND:
      CHECK(sh[0] == nb && sh[1] == H && sh[2] == bs && sh[3] == last);
      break;
    default: /* HND_PACKED */
      pack = sh[4];
      CHECK(pack > 0 && last % pack == 0);
      CHECK(sh[0] == nb && sh[1] == H && sh[2] == last / pack && sh[3] == bs);
      break;
  }
  CHECK(t->data != NULL);
  out->base = (uint8_t*)t->data;
  out->dtype = t->dtype;
  out->layout = t->layout;
  out->ndim = nd;
  out->pack = pack;
  for (int i = 0; i < 5; i++) {
    out->shape[i] = i < nd ? sh[i] : 1;
    out->stride[i] = i < nd ? t->stride[i] : 0;
  }
  return OK;
}

static int memory_valid(int m) { return m >= KVX_MEMORY_HOST && m <= KVX_MEMORY_UNIFIED; }

/* Reads PER_TENSOR / PER_HEAD scale values (F32) from a scale descriptor. */
typedef struct {
  int gran; /* 0: constant */
  float constant;
  const uint8_t* data;
  int64_t s0, s1;
} scale_t;

static float scale_at(const scale_t* s, int64_t block, int64_t head) {
  float f;
  int64_t off;
  switch (s->gran) {
    case KVX_SCALE_PER_TENSOR: off = 0; break;
    case KVX_SCALE_PER_HEAD: off = head * s->s0; break;
    case KVX_SCALE_PER_BLOCK: off = block * s->s0; break;
    case KVX_SCALE_PER_BLOCK_HEAD: off = block * s->s0 + head * s->s1; break;
    default: return s->constant;
  }
  memcpy(&f, s->data + off * 4, 4);
  return f;
}

/* A scale descriptor whose data is set. allow_block: PER_BLOCK / PER_BLOCK_HEAD.
 * CHOICE_REFUSE_BLOCK_SCALES: those two are refused (*refuse) and their shape is not read
 * (the readings leave it to the provider); where allow_block is 0 they stay malformed. */
static st_t parse_scale_desc(const kvx_scale_desc_t* d, const kvx_cache_desc_t* c, int allow_block, scale_t* out,
                             int* refuse) {
  CHECK(d->dtype == KVX_DTYPE_F32);
  const int64_t H = c->num_kv_heads, nb = c->num_blocks;
  out->data = (const uint8_t*)d->data;
  out->gran = d->granularity;
  out->s0 = out->s1 = 0;
#if CHOICE_REFUSE_BLOCK_SCALES
  if (d->granularity == KVX_SCALE_PER_BLOCK || d->granularity == KVX_SCALE_PER_BLOCK_HEAD) {
    CHECK(allow_block);
    *refuse = 1;
    out->gran = 0;
    out->constant = 1.0f;
    return OK;
  }
#else
  (void)refuse;
#endif
  switch (d->granularity) {
    case KVX_SCALE_PER_TENSOR:
      CHECK(d->ndim == 0 || (d->ndim == 1 && d->shape[0] == 1));
      return OK;
    case KVX_SCALE_PER_HEAD:
      CHECK(d->ndim == 1 && d->shape[0] == H);
      out->s0 = d->stride[0] == 0 ? 1 : d->stride[0]; /* 0: the field left unset */
      break;
    case KVX_SCALE_PER_BLOCK:
      CHECK(allow_block);
      CHECK(d->ndim == 1 && d->shape[0] == nb);
      out->s0 = d->stride[0] == 0 ? 1 : d->stride[0];
      break;
    case KVX_SCALE_PER_BLOCK_HEAD:
      CHECK(allow_block);
      CHECK(d->ndim == 2 && d->shape[0] == nb && d->shape[1] == H);
      if (d->stride[0] == 0 && d->stride[1] == 0) {
        out->s0 = H;
        out->s1 = 1;
      } else {
        out->s0 = d->stride[0];
        out->s1 = d->stride[1];
      }
      break;
    default:
      return INVALID;
  }
  int64_t shp[2] = {d->shape[0], d->ndim == 2 ? d->shape[1] : 1};
  int64_t str[2] = {out->s0, out->s1};
  CHECK(extent_ok(2, shp, str, 4));
  return OK;
}

/* FP4 global scale (NVFP4 only): data NULL means 1.0. */
static st_t parse_global(const kvx_scale_desc_t* d, const kvx_cache_desc_t* c, scale_t* out) {
  CHECK(d->size >= sizeof(kvx_scale_desc_t));
  if (d->data == NULL) {
    out->gran = 0;
    out->constant = 1.0f;
    return OK;
  }
  int refuse = 0; /* never set: block granularities are malformed here */
  TRY(parse_scale_desc(d, c, 0, out, &refuse));
  return OK;
}

/* R-CACHE (and the FP4 extension's cache rules). `refuse` collects refusals decided
 * after every descriptor rule. */
static st_t parse_cache(const kvx_cache_desc_t* in, cache_t* cc, int* refuse) {
  if (in == NULL) return INVALID;
  int ext = 0;
  TRY(copy_top(&cc->c, in, KVX_V1_1_SIZEOF_CACHE_DESC, sizeof(kvx_cache_desc_t), &ext, refuse));
  const kvx_cache_desc_t* c = &cc->c;
  CHECK(c->k.size >= sizeof(kvx_tensor_desc_t));
  CHECK(c->v.size >= sizeof(kvx_tensor_desc_t));
  CHECK(c->num_blocks && c->block_size && c->num_kv_heads && c->head_dim);
  cc->fp4 = ext ? (int)c->fp4.format : KVX_FP4_NONE;
  if (cc->fp4 != KVX_FP4_NONE) {
    CHECK(c->fp4.size >= sizeof(kvx_fp4_cache_ext_t));
    CHECK(cc->fp4 == KVX_FP4_NVFP4 || cc->fp4 == KVX_FP4_MXFP4 || cc->fp4 == KVX_FP4_MXFP4_OCP);
    CHECK(c->k.dtype == KVX_DTYPE_F4_E2M1 && c->v.dtype == KVX_DTYPE_F4_E2M1);
    cc->B = cc->fp4 == KVX_FP4_MXFP4_OCP ? 32 : 16;
    CHECK(c->head_dim % (uint32_t)cc->B == 0);
  } else {
    CHECK(is_cache_dtype_v11(c->k.dtype) && is_cache_dtype_v11(c->v.dtype)); /* F4 needs the extension */
    cc->B = 0;
  }
  TRY(check_cache_tensor(&c->k, c, c->head_dim, 1, &cc->k));
  TRY(check_cache_tensor(&c->v, c, c->head_dim, 1, &cc->v));
  CHECK(memory_valid(c->k.memory) && c->k.memory == c->v.memory);
  cc->memory = c->k.memory;
  TRY(check_strides(cc->k.ndim, cc->k.shape, cc->k.stride, cc->k.dtype));
  TRY(check_strides(cc->v.ndim, cc->v.shape, cc->v.stride, cc->v.dtype));
#if CHOICE_HND_ONLY
  /* NHD served for FP8 caches only (vLLM's FP8 flash layout); HND is the core layout */
  if ((c->k.layout == KVX_LAYOUT_BLOCK_NHD || c->v.layout == KVX_LAYOUT_BLOCK_NHD) &&
      !(is_fp8(c->k.dtype) && is_fp8(c->v.dtype)))
    *refuse = 1;
#endif
#if CHOICE_REFUSE_LARGE
  if ((uint64_t)c->num_blocks * c->block_size * c->num_kv_heads * c->head_dim > (1ull << 31)) *refuse = 1;
#endif
  if (cc->fp4 != KVX_FP4_NONE) {
    const int sdt = cc->fp4 == KVX_FP4_NVFP4 ? KVX_DTYPE_F8_E4M3 : KVX_DTYPE_UE8M0;
    const kvx_tensor_desc_t* pools[2] = {&c->fp4.k_scales, &c->fp4.v_scales};
    view_t* pv[2] = {&cc->ks, &cc->vs};
    for (int i = 0; i < 2; i++) {
      const kvx_tensor_desc_t* t = pools[i];
      CHECK(t->size >= sizeof(kvx_tensor_desc_t));
      CHECK((int)t->dtype == sdt);
      TRY(check_cache_tensor(t, c, c->head_dim / (uint32_t)cc->B, 0, pv[i]));
      CHECK(t->memory == (kvx_memory_type_t)cc->memory);
      TRY(check_strides(pv[i]->ndim, pv[i]->shape, pv[i]->stride, sdt));
    }
    if (cc->fp4 == KVX_FP4_NVFP4) {
      scale_t g;
      TRY(parse_global(&c->fp4.k_global, c, &g));
      TRY(parse_global(&c->fp4.v_global, c, &g));
    }
  }
  return OK;
}

/* Step 4 of R-ORDER: the memory types this build serves. */
static st_t memory_served(int memory) { return memory == KVX_MEMORY_HOST ? OK : REFUSE; }

/* ------------------------------------------------------------------------ */
/* IO tensors                                                                */

/* R-IO. rows: 3-D shape[0]; for a gather `rows4` / `msl` give the 4-D form.
 * dims: head count and last dim. is_output: a zero stride would alias outputs. */
static st_t parse_io_tensor(const kvx_tensor_desc_t* t, int64_t rows, int64_t H, int64_t D, int allow4, int64_t rows4,
                            int64_t msl, int memory, int is_output, int tokens, view_t* out, int* refuse) {
  CHECK(t->size >= sizeof(kvx_tensor_desc_t));
  CHECK(t->memory == (kvx_memory_type_t)memory);
  if (t->ndim == 3) {
    CHECK(t->shape[0] == rows && t->shape[1] == H && t->shape[2] == D);
  } else if (t->ndim == 4 && allow4) {
    CHECK(t->shape[0] == rows4 && t->shape[1] == msl && t->shape[2] == H && t->shape[3] == D);
  } else {
    return INVALID;
  }
  CHECK(tokens == 0 || t->data != NULL);
  int nd = (int)t->ndim;
  int64_t es = t->dtype == KVX_DTYPE_F4_E2M1 ? 1 : elem_bytes(t->dtype);
  CHECK(extent_ok(nd, t->shape, t->stride, es));
  int64_t elems = 1;
  for (int i = 0; i < nd; i++) elems *= t->shape[i] > 0 ? 1 : 0;
  for (int i = 0; i < nd; i++) /* outputs would alias (a tensor of no element aliases nothing) */
    if (elems && t->shape[i] > 1 && t->stride[i] == 0 && is_output) *refuse = 1;
#if CHOICE_REFUSE_LARGE
  if ((uint64_t)rows * (uint64_t)H * (uint64_t)D > (1ull << 31)) *refuse = 1; /* large IO */
#endif
  out->base = (uint8_t*)t->data;
  out->dtype = t->dtype;
  out->layout = 0;
  out->ndim = nd;
  out->pack = 0;
  for (int i = 0; i < 5; i++) {
    out->shape[i] = i < nd ? t->shape[i] : 1;
    out->stride[i] = i < nd ? t->stride[i] : 0;
  }
  return OK;
}

static int is_io_dtype(int dt) { return is_cache_dtype_v11(dt) || dt == KVX_DTYPE_F4_E2M1; }

/* Which (IO dtype, cache dtype) pairs are served; *refuse for the others. */
static void io_pair(int io_dt, int cache_dt, int fp4, int gather, int* refuse) {
  if (fp4) {
    if (!(is_base_dtype(io_dt) || io_dt == KVX_DTYPE_F4_E2M1)) *refuse = 1; /* FP8 IO with an FP4 cache */
    return;
  }
  if (io_dt == KVX_DTYPE_F4_E2M1) {
    *refuse = 1;
    return;
  }
  if (io_dt == cache_dt) return;                                /* plain copy */
  if (is_fp8(io_dt)) *refuse = 1;                               /* FP8 IO other than the cache's own */
  if (gather && is_fp8(cache_dt)) *refuse = 1;                  /* dequantizing needs cache-level scales */
}

/* ------------------------------------------------------------------------ */
/* FP4 codecs                                                                */

/* Quantizes one block of n values: scale byte and codes (docs/fp4.md). */
static uint8_t fp4_quantize(int fmt, const float* x, int n, float g, unsigned* codes) {
  float amax = 0.0f;
  int has_nan = 0;
  for (int i = 0; i < n; i++) {
#if CHOICE_FP4_INF_AS_NAN
    if (isnan(x[i]) || isinf(x[i])) has_nan = 1; /* an Inf block is stored as a NaN block (informational) */
#else
    if (isnan(x[i])) has_nan = 1;
#endif
    float a = fabsf(x[i]);
    if (a > amax) amax = a;
  }
  if (has_nan) {
#if CHOICE_FP4_OTHER_NAN_BLOCK /* the other NaN scale byte, codes not zero */
    for (int i = 0; i < n; i++) codes[i] = 7u | (i & 1 ? 8u : 0u);
    return 0xff; /* E4M3 NaN of the other sign (NVFP4), UE8M0 NaN (MXFP4) */
#else
    for (int i = 0; i < n; i++) codes[i] = 0;
    return fmt == KVX_FP4_NVFP4 ? 0x7f : 0xff;
#endif
  }
  if (amax == 0.0f) { /* all-zero block (also all -0): scale 0, codes 0 */
    for (int i = 0; i < n; i++) codes[i] = 0;
    return 0;
  }
  if (fmt == KVX_FP4_NVFP4) {
    float t = 6.0f * g;
    float wanted = amax / t;
    if (wanted > 448.0f) wanted = 448.0f;
    uint8_t s = f32_to_fp8(wanted, 1);
    float d = fp8_to_f32(s, 1) * g;
    if ((s & 0x7f) == 0 || d == 0.0f) { /* scale underflow: the block decodes to +0 */
      for (int i = 0; i < n; i++) codes[i] = 0;
      return s & 0x7f ? s : 0;
    }
    for (int i = 0; i < n; i++) codes[i] = e2m1_encode(clip6(x[i] / d));
    return s;
  }
  int e;
  if (fmt == KVX_FP4_MXFP4) {
    float t = amax / 6.0f; /* FP32 */
    if (t == 0.0f) {
      e = -127;
    } else if (isinf(t)) {
      e = 127;
    } else {
      int k;
      float m = frexpf(t, &k); /* t = m * 2^k, m in [0.5, 1) */
      e = m == 0.5f ? k - 1 : k;
    }
  } else { /* OCP: floor(log2(amax)) - 2 */
    if (isinf(amax)) {
      e = 127;
    } else {
      int k;
      (void)frexpf(amax, &k);
      e = (k - 1) - 2;
    }
  }
  if (e < -127) e = -127;
  if (e > 127) e = 127;
  float div = ldexpf(1.0f, e);
  for (int i = 0; i < n; i++) codes[i] = e2m1_encode(clip6(x[i] / div));
  return (uint8_t)(e + 127);
}

static float fp4_scale_value(int fmt, uint8_t s) {
  if (fmt == KVX_FP4_NVFP4) return fp8_to_f32(s, 1);
  if (s == 0xff) return NAN;
  return ldexpf(1.0f, (int)s - 127);
}

static float fp4_decode(int fmt, unsigned code, uint8_t s, float g) {
  float sv = fp4_scale_value(fmt, s);
  float v = e2m1_value(code) * sv;
  if (fmt == KVX_FP4_NVFP4) v = v * g;
  return v;
}

/* ------------------------------------------------------------------------ */
/* Entry points                                                              */

KVX_API kvx_status_t kvx_get_version(kvx_version_t* version) {
  if (version == NULL || version->size < sizeof(kvx_version_t)) return INVALID;
  version->size = (uint32_t)sizeof(kvx_version_t);
  version->abi_major = KVX_ABI_VERSION_MAJOR;
  version->abi_minor = KVX_ABI_VERSION_MINOR;
#if CHOICE_ABI_PATCH_7
  version->abi_patch = 7; /* the patch number is the provider's */
#else
  version->abi_patch = KVX_ABI_VERSION_PATCH;
#endif
  return OK;
}

KVX_API kvx_status_t kvx_validate_cache_desc(const kvx_cache_desc_t* cache) {
  cache_t cc;
  int refuse = 0;
  TRY(parse_cache(cache, &cc, &refuse));
#if CHOICE_VALIDATE_RULES_ONLY
  /* a valid cache is valid, whether or not writes serve it (spec 7: validation) */
  (void)refuse;
#else
  if (refuse) return REFUSE;
  TRY(memory_served(cc.memory));
#endif
  return OK;
}

static int64_t load_index(const void* p, int dt, int64_t i) {
  if (dt == KVX_DTYPE_S32) {
    int32_t v;
    memcpy(&v, (const uint8_t*)p + 4 * i, 4);
    return v;
  }
  int64_t v;
  memcpy(&v, (const uint8_t*)p + 8 * i, 8);
  return v;
}

/* --- write ---------------------------------------------------------------- */

/* An FP8 write's scale: its descriptor, else the k_scale / v_scale pointer (spec 6.9: a MAY;
 * CHOICE_DECLINE_SCALE_PTR: declined, the write is refused), else 1. */
static st_t parse_write_scale(const kvx_scale_desc_t* d, const void* ptr, const kvx_cache_desc_t* c, scale_t* out,
                              int* refuse) {
  if (d->data != NULL) return parse_scale_desc(d, c, 1, out, refuse);
  out->gran = 0;
#if CHOICE_DECLINE_SCALE_PTR
  out->constant = 1.0f;
  if (ptr != NULL) *refuse = 1;
#else
  if (ptr != NULL) memcpy(&out->constant, ptr, 4);
  else out->constant = 1.0f;
#endif
  return OK;
}

static void write_side_v11(const cache_t* cc, const view_t* cv, const view_t* io, const scale_t* sc, int64_t i,
                           int64_t b, int64_t t) {
  const int64_t H = cc->c.num_kv_heads, D = cc->c.head_dim;
  const int cdt = cv->dtype, idt = io->dtype;
  const int64_t ces = elem_bytes(cdt), ies = elem_bytes(idt);
  for (int64_t h = 0; h < H; h++) {
    float s = is_fp8(cdt) && idt != cdt ? scale_at(sc, b, h) : 1.0f;
    for (int64_t d = 0; d < D; d++) {
      const uint8_t* src = io->base + io_off(io, i, h, d) * ies;
      uint8_t* dst = cv->base + cache_off(cv, b, t, h, d) * ces;
      if (idt == cdt) {
        memmove(dst, src, (size_t)ces);
      } else if (is_fp8(cdt)) {
        float x = load_f32(idt, src);
        store_f32(cdt, dst, x / s);
      } else {
        store_f32(cdt, dst, load_f32(idt, src));
      }
    }
  }
}

static void write_side_fp4(const cache_t* cc, const view_t* cv, const view_t* sv, const view_t* io,
                           const view_t* ios, const scale_t* g, int64_t i, int64_t b, int64_t t) {
  const int64_t H = cc->c.num_kv_heads, D = cc->c.head_dim;
  const int B = cc->B, fmt = cc->fp4;
  float x[32];
  unsigned codes[32];
  for (int64_t h = 0; h < H; h++) {
    float gv = fmt == KVX_FP4_NVFP4 ? scale_at(g, 0, h) : 1.0f;
    for (int64_t k = 0; k < D / B; k++) {
      uint8_t* sdst = sv->base + cache_off(sv, b, t, h, k);
      if (io->dtype == KVX_DTYPE_F4_E2M1) { /* raw: codes and scale byte copied */
        for (int j = 0; j < B; j++) {
          int64_t d = k * B + j;
          nib_set(cv->base, cache_off(cv, b, t, h, d), nib_get(io->base, io_off(io, i, h, d)));
        }
        *sdst = *(ios->base + io_off(ios, i, h, k));
        continue;
      }
      const int64_t ies = elem_bytes(io->dtype);
      for (int j = 0; j < B; j++) x[j] = load_f32(io->dtype, io->base + io_off(io, i, h, k * B + j) * ies);
      uint8_t s = fp4_quantize(fmt, x, B, gv, codes);
      for (int j = 0; j < B; j++) nib_set(cv->base, cache_off(cv, b, t, h, k * B + j), codes[j]);
      *sdst = s;
    }
  }
}

KVX_API kvx_status_t kvx_write_kv(const kvx_cache_desc_t* cache, const kvx_write_desc_t* desc, void* stream) {
  (void)stream;
  if (cache == NULL || desc == NULL) return INVALID;
  int refuse = 0, ext = 0;
  cache_t cc;
  kvx_write_desc_t w;
  /* 1. size guards */
  TRY(copy_top(&w, desc, KVX_V1_1_SIZEOF_WRITE_DESC, sizeof(kvx_write_desc_t), &ext, &refuse));
  CHECK(w.io.size >= sizeof(kvx_kv_io_desc_t));
  CHECK(w.io.key.size >= sizeof(kvx_tensor_desc_t) && w.io.value.size >= sizeof(kvx_tensor_desc_t));
  CHECK(w.slots.size >= sizeof(kvx_slot_mapping_t));
  CHECK(w.k_scale_desc.size >= sizeof(kvx_scale_desc_t) && w.v_scale_desc.size >= sizeof(kvx_scale_desc_t));
  /* 2. cache rules */
  TRY(parse_cache(cache, &cc, &refuse));
  const kvx_cache_desc_t* c = &cc.c;
  /* 3. the write's own rules */
  const kvx_kv_io_desc_t* io = &w.io;
  CHECK(io->num_kv_heads == c->num_kv_heads && io->head_dim == c->head_dim);
  CHECK(io->num_tokens == w.slots.token_count);
  CHECK(is_index_dtype(w.slots.dtype));
  const int64_t N = io->num_tokens, H = c->num_kv_heads, D = c->head_dim;
  CHECK(N == 0 || w.slots.slots != NULL);
  CHECK(is_io_dtype(io->key.dtype) && is_io_dtype(io->value.dtype));
  view_t kin, vin, ksin, vsin;
  memset(&ksin, 0, sizeof ksin);
  memset(&vsin, 0, sizeof vsin);
  TRY(parse_io_tensor(&io->key, N, H, D, 0, 0, 0, cc.memory, 0, (int)(N > 0), &kin, &refuse));
  TRY(parse_io_tensor(&io->value, N, H, D, 0, 0, 0, cc.memory, 0, (int)(N > 0), &vin, &refuse));
  io_pair(kin.dtype, cc.k.dtype, cc.fp4 != 0, 0, &refuse);
  io_pair(vin.dtype, cc.v.dtype, cc.fp4 != 0, 0, &refuse);
  scale_t ksc, vsc, kg, vg;
  memset(&ksc, 0, sizeof ksc);
  memset(&vsc, 0, sizeof vsc);
  memset(&kg, 0, sizeof kg);
  memset(&vg, 0, sizeof vg);
  if (cc.fp4 != KVX_FP4_NONE) {
    if (kin.dtype == KVX_DTYPE_F4_E2M1 || vin.dtype == KVX_DTYPE_F4_E2M1) {
      CHECK(ext && w.fp4.size >= sizeof(kvx_fp4_io_scales_t));
      const int sdt = cc.fp4 == KVX_FP4_NVFP4 ? KVX_DTYPE_F8_E4M3 : KVX_DTYPE_UE8M0;
      const int64_t nbk = D / cc.B;
      if (kin.dtype == KVX_DTYPE_F4_E2M1) {
        CHECK((int)w.fp4.key_scales.dtype == sdt);
        TRY(parse_io_tensor(&w.fp4.key_scales, N, H, nbk, 0, 0, 0, cc.memory, 0, (int)(N > 0), &ksin, &refuse));
      }
      if (vin.dtype == KVX_DTYPE_F4_E2M1) {
        CHECK((int)w.fp4.value_scales.dtype == sdt);
        TRY(parse_io_tensor(&w.fp4.value_scales, N, H, nbk, 0, 0, 0, cc.memory, 0, (int)(N > 0), &vsin, &refuse));
      }
    }
    if (cc.fp4 == KVX_FP4_NVFP4) {
      TRY(parse_global(&c->fp4.k_global, c, &kg));
      TRY(parse_global(&c->fp4.v_global, c, &vg));
    }
  } else {
    if (is_fp8(cc.k.dtype) && kin.dtype != cc.k.dtype)
      TRY(parse_write_scale(&w.k_scale_desc, w.k_scale, c, &ksc, &refuse));
    if (is_fp8(cc.v.dtype) && vin.dtype != cc.v.dtype)
      TRY(parse_write_scale(&w.v_scale_desc, w.v_scale, c, &vsc, &refuse));
  }
  if (refuse) return REFUSE;
  /* 4. memory */
  TRY(memory_served(cc.memory));
  /* 5. data: the slots, all of them before any store (CHOICE_NO_PRESCAN: the valid part
   * written, an out-of-range slot skipped and answered after) */
  const int64_t nslots = (int64_t)c->num_blocks * (int64_t)c->block_size;
  const int64_t inv = w.slots.invalid_slot;
  st_t err = OK;
#if !CHOICE_NO_PRESCAN
  for (int64_t i = 0; i < N; i++) {
    int64_t s = load_index(w.slots.slots, w.slots.dtype, i);
    if (s < 0 || s == inv) continue;
    if (s >= nslots) return OOR;
  }
#endif
  /* duplicate slots: tokens written first to last, the last wins (CHOICE_FIRST_TOKEN_WINS:
   * last to first, the first wins) */
  for (int64_t k = 0; k < N; k++) {
#if CHOICE_FIRST_TOKEN_WINS
    const int64_t i = N - 1 - k;
#else
    const int64_t i = k;
#endif
    int64_t s = load_index(w.slots.slots, w.slots.dtype, i);
    if (s < 0 || s == inv) continue;
    if (s >= nslots) { /* never written (R-WRITE); only without the pre-scan */
      err = OOR;
      continue;
    }
    int64_t b = s / c->block_size, t = s % c->block_size;
    if (cc.fp4 != KVX_FP4_NONE) {
      write_side_fp4(&cc, &cc.k, &cc.ks, &kin, &ksin, &kg, i, b, t);
      write_side_fp4(&cc, &cc.v, &cc.vs, &vin, &vsin, &vg, i, b, t);
    } else {
      write_side_v11(&cc, &cc.k, &kin, &ksc, i, b, t);
      write_side_v11(&cc, &cc.v, &vin, &vsc, i, b, t);
    }
  }
  return err;
}

/* --- gather --------------------------------------------------------------- */

/* Moves one token (all heads) from a cache view into output row `row`. */
static void gather_token_v11(const view_t* cv, int64_t b, int64_t t, const view_t* out, int64_t row, int64_t H,
                             int64_t D) {
  const int cdt = cv->dtype, odt = out->dtype;
  const int64_t ces = elem_bytes(cdt), oes = elem_bytes(odt);
  for (int64_t h = 0; h < H; h++)
    for (int64_t d = 0; d < D; d++) {
      const uint8_t* src = cv->base + cache_off(cv, b, t, h, d) * ces;
      uint8_t* dst = out->base + io_off(out, row, h, d) * oes;
      if (cdt == odt) memmove(dst, src, (size_t)ces);
      else store_f32(odt, dst, load_f32(cdt, src));
    }
}

static void gather_token_fp4(const cache_t* cc, const view_t* cv, const view_t* sv, const scale_t* g, int64_t b,
                             int64_t t, const view_t* out, const view_t* outs, int64_t row) {
  const int64_t H = cc->c.num_kv_heads, D = cc->c.head_dim;
  const int B = cc->B, fmt = cc->fp4;
  for (int64_t h = 0; h < H; h++) {
    float gv = fmt == KVX_FP4_NVFP4 ? scale_at(g, 0, h) : 1.0f;
    for (int64_t k = 0; k < D / B; k++) {
      uint8_t s = *(sv->base + cache_off(sv, b, t, h, k));
      if (out->dtype == KVX_DTYPE_F4_E2M1) {
        for (int j = 0; j < B; j++) {
          int64_t d = k * B + j;
          nib_set(out->base, io_off(out, row, h, d), nib_get(cv->base, cache_off(cv, b, t, h, d)));
        }
        *(outs->base + io_off(outs, row, h, k)) = s;
        continue;
      }
      const int64_t oes = elem_bytes(out->dtype);
      for (int j = 0; j < B; j++) {
        int64_t d = k * B + j;
        float v = fp4_decode(fmt, nib_get(cv->base, cache_off(cv, b, t, h, d)), s, gv);
        store_f32(out->dtype, out->base + io_off(out, row, h, d) * oes, v);
      }
    }
  }
}

/* Moves token `off` of block b, K and V, into output row `row`. */
static void gather_row(const cache_t* cc, int64_t b, int64_t off, int64_t row, const view_t* kout, const view_t* vout,
                       const view_t* ksout, const view_t* vsout, const scale_t* kg, const scale_t* vg) {
  const int64_t H = cc->c.num_kv_heads, D = cc->c.head_dim;
  if (cc->fp4 != KVX_FP4_NONE) {
    gather_token_fp4(cc, &cc->k, &cc->ks, kg, b, off, kout, ksout, row);
    gather_token_fp4(cc, &cc->v, &cc->vs, vg, b, off, vout, vsout, row);
  } else {
    gather_token_v11(&cc->k, b, off, kout, row, H, D);
    gather_token_v11(&cc->v, b, off, vout, row, H, D);
  }
}

/* The RAGGED indptr rules in order (R-DATA): indptr[0] >= 0, never decreasing (INDPTR_BAD),
 * indptr[S] == indices_count; the status of the first one broken, OK when none is. */
static st_t indptr_status(const kvx_block_table_t* bt, int64_t S) {
  int64_t prev = load_index(bt->indptr, bt->indptr_dtype, 0);
  if (prev < 0) return INVALID;
  for (int64_t s = 1; s <= S; s++) {
    int64_t cur = load_index(bt->indptr, bt->indptr_dtype, s);
    if (cur < prev) return INDPTR_BAD;
    prev = cur;
  }
  return prev != (int64_t)bt->indices_count ? INVALID : OK;
}

#if CHOICE_NO_PRESCAN
#if !CHOICE_REFUSE_KV_OFFSETS
#error "CHOICE_NO_PRESCAN moves PACKED and RAGGED tables only: set CHOICE_REFUSE_KV_OFFSETS too"
#endif
static void first_error(st_t* err, st_t st) {
  if (*err == OK) *err = st;
}
#endif

KVX_API kvx_status_t kvx_gather_kv(const kvx_cache_desc_t* cache, const kvx_gather_desc_t* desc, void* stream) {
  (void)stream;
  if (cache == NULL || desc == NULL) return INVALID;
  int refuse = 0, ext = 0;
  cache_t cc;
  kvx_gather_desc_t gd;
  /* 1. size guards */
  TRY(copy_top(&gd, desc, KVX_V1_1_SIZEOF_GATHER_DESC, sizeof(kvx_gather_desc_t), &ext, &refuse));
  CHECK(gd.io.size >= sizeof(kvx_kv_io_desc_t));
  CHECK(gd.io.key.size >= sizeof(kvx_tensor_desc_t) && gd.io.value.size >= sizeof(kvx_tensor_desc_t));
  CHECK(gd.block_table.size >= sizeof(kvx_block_table_t));
  CHECK(gd.seq_lens.size >= sizeof(kvx_seq_lens_t));
  const kvx_block_table_t* bt = &gd.block_table;
  /* 2. cache rules (the pool's size guard too, read only for KV_OFFSETS) */
  TRY(parse_cache(cache, &cc, &refuse));
  const kvx_cache_desc_t* c = &cc.c;
  if (bt->format == KVX_BLOCK_TABLE_KV_OFFSETS) CHECK(c->pool.size >= sizeof(kvx_pool_desc_t));
  /* 3. the gather's own rules */
  const kvx_kv_io_desc_t* io = &gd.io;
  const int64_t H = c->num_kv_heads, D = c->head_dim, bs = c->block_size, nb = c->num_blocks;
  CHECK(io->num_kv_heads == c->num_kv_heads && io->head_dim == c->head_dim);
  const int64_t S = bt->seq_count, mbps = bt->max_blocks_per_seq, msl = gd.max_seq_len;
  int64_t bw = 1;
  switch (bt->format) {
    case KVX_BLOCK_TABLE_PACKED:
      CHECK(is_index_dtype(bt->index_dtype));
      CHECK((uint64_t)bt->indices_count == (uint64_t)S * (uint64_t)mbps);
      CHECK(bt->indptr_count == 0);
      CHECK(bt->beam_width == 1);
      CHECK(bt->indices_count == 0 || bt->indices != NULL);
      break;
    case KVX_BLOCK_TABLE_RAGGED:
      CHECK(is_index_dtype(bt->index_dtype) && is_index_dtype(bt->indptr_dtype));
      CHECK(bt->indptr != NULL);
      CHECK((uint64_t)bt->indptr_count == (uint64_t)S + 1);
      CHECK(bt->beam_width == 1);
      CHECK(bt->indices_count == 0 || bt->indices != NULL);
      break;
    case KVX_BLOCK_TABLE_KV_OFFSETS: {
      CHECK(bt->index_dtype == KVX_DTYPE_S32);
      CHECK(bt->flags & KVX_BLOCK_TABLE_FLAG_KVCACHEINDEX);
      CHECK((bs & (bs - 1)) == 0);
      CHECK(bt->beam_width >= 1);
      bw = bt->beam_width;
      CHECK((uint64_t)bt->indices_count == (uint64_t)S * (uint64_t)bw * 2u * (uint64_t)mbps);
      CHECK(bt->indptr_count == 0);
      CHECK(bt->indices_count == 0 || bt->indices != NULL);
      CHECK(c->pool.primary != NULL);
      CHECK(c->pool.memory <= KVX_MEMORY_UNIFIED);
      if (cc.fp4 != KVX_FP4_NONE) {
        refuse = 1; /* the pools carry no scale pool */
      } else {
        uint64_t bpb = (uint64_t)H * (uint64_t)bs * (uint64_t)D * (uint64_t)elem_bytes(cc.k.dtype);
        CHECK(bpb == (uint64_t)c->pool.bytes_per_block);
        if (cc.k.dtype != cc.v.dtype) refuse = 1;
      }
#if CHOICE_REFUSE_KV_OFFSETS
      refuse = 1; /* KV_OFFSETS tables are not served (after their descriptor rules) */
#endif
      break;
    }
    default:
      return INVALID;
  }
  CHECK((uint64_t)io->num_tokens == (uint64_t)S * (uint64_t)bw * (uint64_t)msl);
  CHECK(gd.seq_lens.seq_count == bt->seq_count);
  CHECK(is_index_dtype(gd.seq_lens.dtype));
  CHECK(S == 0 || gd.seq_lens.lengths != NULL);
  const int64_t N = io->num_tokens;
  CHECK(is_io_dtype(io->key.dtype) && is_io_dtype(io->value.dtype));
  view_t kout, vout, ksout, vsout;
  memset(&ksout, 0, sizeof ksout);
  memset(&vsout, 0, sizeof vsout);
  TRY(parse_io_tensor(&io->key, N, H, D, 1, S * bw, msl, cc.memory, 1, (int)(N > 0), &kout, &refuse));
  TRY(parse_io_tensor(&io->value, N, H, D, 1, S * bw, msl, cc.memory, 1, (int)(N > 0), &vout, &refuse));
  io_pair(kout.dtype, cc.k.dtype, cc.fp4 != 0, 1, &refuse);
  io_pair(vout.dtype, cc.v.dtype, cc.fp4 != 0, 1, &refuse);
  scale_t kg, vg;
  memset(&kg, 0, sizeof kg);
  memset(&vg, 0, sizeof vg);
  if (cc.fp4 != KVX_FP4_NONE) {
    if (kout.dtype == KVX_DTYPE_F4_E2M1 || vout.dtype == KVX_DTYPE_F4_E2M1) {
      CHECK(ext && gd.fp4.size >= sizeof(kvx_fp4_io_scales_t));
      const int sdt = cc.fp4 == KVX_FP4_NVFP4 ? KVX_DTYPE_F8_E4M3 : KVX_DTYPE_UE8M0;
      const int64_t nbk = D / cc.B;
      if (kout.dtype == KVX_DTYPE_F4_E2M1) {
        CHECK((int)gd.fp4.key_scales.dtype == sdt);
        TRY(parse_io_tensor(&gd.fp4.key_scales, N, H, nbk, 1, S * bw, msl, cc.memory, 1, (int)(N > 0), &ksout,
                            &refuse));
      }
      if (vout.dtype == KVX_DTYPE_F4_E2M1) {
        CHECK((int)gd.fp4.value_scales.dtype == sdt);
        TRY(parse_io_tensor(&gd.fp4.value_scales, N, H, nbk, 1, S * bw, msl, cc.memory, 1, (int)(N > 0), &vsout,
                            &refuse));
      }
    }
    if (cc.fp4 == KVX_FP4_NVFP4) {
      TRY(parse_global(&c->fp4.k_global, c, &kg));
      TRY(parse_global(&c->fp4.v_global, c, &vg));
    }
  }
  if (refuse) return REFUSE;
  /* 4. memory */
  TRY(memory_served(cc.memory));
  if (bt->format == KVX_BLOCK_TABLE_KV_OFFSETS) TRY(memory_served(c->pool.memory == KVX_MEMORY_UNKNOWN
                                                                     ? KVX_MEMORY_HOST : (int)c->pool.memory));
  /* 5. data */
  const void* lens = gd.seq_lens.lengths;
  const int ldt = gd.seq_lens.dtype;
#if CHOICE_NO_PRESCAN
  /* sequence by sequence, a bad sequence or token skipped (its rows untouched), the valid part
   * written, the first error answered after */
  st_t err = OK;
  const int64_t nidx = bt->indices_count;
  const st_t indptr_st = bt->format == KVX_BLOCK_TABLE_RAGGED ? indptr_status(bt, S) : OK;
  for (int64_t s = 0; s < S; s++) {
    int64_t L = load_index(lens, ldt, s);
    if (L < 0) {
      first_error(&err, INVALID);
      continue;
    }
    int64_t n = L < msl ? L : msl;
    int64_t nblk = (n + bs - 1) / bs;
    if (nblk > mbps) {
      first_error(&err, GATHER_RANGE);
      continue;
    }
    int64_t lo = 0;
    if (bt->format == KVX_BLOCK_TABLE_RAGGED) {
      lo = load_index(bt->indptr, bt->indptr_dtype, s);
      int64_t hi = load_index(bt->indptr, bt->indptr_dtype, s + 1);
      if (lo < 0 || hi < lo || hi > nidx) {
        first_error(&err, indptr_st != OK ? indptr_st : INVALID);
        continue;
      }
      if (n > hi - lo) {
        first_error(&err, OOR);
        continue;
      }
    }
    for (int64_t t = 0; t < n; t++) {
      const int64_t row = s * msl + t, j = t / bs, off = t % bs;
      int64_t b = bt->format == KVX_BLOCK_TABLE_PACKED ? load_index(bt->indices, bt->index_dtype, s * mbps + j)
                                                       : load_index(bt->indices, bt->index_dtype, lo + t);
      if (b < 0 || b >= nb) {
        first_error(&err, GATHER_RANGE);
        continue;
      }
      gather_row(&cc, b, off, row, &kout, &vout, &ksout, &vsout, &kg, &vg);
    }
  }
  if (indptr_st != OK) first_error(&err, indptr_st);
  return err;
#else
  /* malformed values (INVALID) first, then ranges (OUT_OF_RANGE); nothing is stored before
   * every check has passed. */
  for (int64_t s = 0; s < S; s++)
    if (load_index(lens, ldt, s) < 0) return INVALID;
  if (bt->format == KVX_BLOCK_TABLE_RAGGED) TRY(indptr_status(bt, S));
  for (int64_t s = 0; s < S; s++) {
    int64_t L = load_index(lens, ldt, s);
    int64_t n = L < msl ? L : msl;
    int64_t nblk = (n + bs - 1) / bs;
    if (nblk > mbps) return GATHER_RANGE;
    if (bt->format == KVX_BLOCK_TABLE_PACKED) {
      for (int64_t j = 0; j < nblk; j++) {
        int64_t id = load_index(bt->indices, bt->index_dtype, s * mbps + j);
        if (id < 0 || id >= nb) return GATHER_RANGE;
      }
    } else if (bt->format == KVX_BLOCK_TABLE_RAGGED) {
      int64_t lo = load_index(bt->indptr, bt->indptr_dtype, s), hi = load_index(bt->indptr, bt->indptr_dtype, s + 1);
      if (n > hi - lo) return OOR;
      for (int64_t t = 0; t < n; t++) {
        int64_t id = load_index(bt->indices, bt->index_dtype, lo + t);
        if (id < 0 || id >= nb) return GATHER_RANGE;
      }
    } else {
      for (int64_t beam = 0; beam < bw; beam++)
        for (int kv = 0; kv < 2; kv++)
          for (int64_t j = 0; j < nblk; j++) {
            uint32_t idx = (uint32_t)load_index(bt->indices, KVX_DTYPE_S32, ((s * bw + beam) * 2 + kv) * mbps + j);
            if (idx == 0xffffffffu) return OOR;
            if ((idx & 0x80000000u) && c->pool.secondary == NULL) return OOR;
          }
    }
  }
  /* the moves */
  for (int64_t s = 0; s < S; s++) {
    int64_t L = load_index(lens, ldt, s);
    int64_t n = L < msl ? L : msl;
    for (int64_t beam = 0; beam < bw; beam++) {
      for (int64_t t = 0; t < n; t++) {
        int64_t row = (s * bw + beam) * msl + t;
        int64_t j = t / bs, off = t % bs;
        if (bt->format == KVX_BLOCK_TABLE_KV_OFFSETS) {
          for (int kv = 0; kv < 2; kv++) {
            uint32_t idx = (uint32_t)load_index(bt->indices, KVX_DTYPE_S32, ((s * bw + beam) * 2 + kv) * mbps + j);
            uint8_t* pool = (uint8_t*)((idx & 0x80000000u) ? c->pool.secondary : c->pool.primary);
            view_t blk;
            memset(&blk, 0, sizeof blk);
            blk.base = pool + (int64_t)(idx & 0x7fffffffu) * (int64_t)c->pool.bytes_per_block;
            blk.dtype = cc.k.dtype;
            blk.layout = KVX_LAYOUT_BLOCK_HND;
            blk.ndim = 4;
            blk.stride[0] = 0;
            blk.stride[1] = bs * D;
            blk.stride[2] = D;
            blk.stride[3] = 1;
            gather_token_v11(&blk, 0, off, kv ? &vout : &kout, row, H, D);
          }
          continue;
        }
        int64_t b = bt->format == KVX_BLOCK_TABLE_PACKED
                        ? load_index(bt->indices, bt->index_dtype, s * mbps + j)
                        : load_index(bt->indices, bt->index_dtype, load_index(bt->indptr, bt->indptr_dtype, s) + t);
        gather_row(&cc, b, off, row, &kout, &vout, &ksout, &vsout, &kg, &vg);
      }
    }
  }
  return OK;
#endif
}
