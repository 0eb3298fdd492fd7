/*
 * hwconv_host.c -- the host backend of the hwconv test provider (hwconv.h):
 * HOST memory only. Conversions are written here from the readings (R-CONVERT,
 * R-FP8: through FP32, round to nearest even, FP8 as float32(x) / scale clamped to
 * the largest finite value), with NaN encodings chosen to differ from the
 * reference's: every NaN a conversion produces is
 *   F16 0x7FFF, BF16 0x7FFF, F32 0x7FFFFFFF (positive, all payload bits set),
 *   E4M3 0x7F / 0xFF with the sign of the input inverted,
 *   E5M2 0x7F | sign (the reference stores 0x7E | sign).
 * Plain copies (IO dtype equal to the cache dtype) move the bits unchanged.
 * Data-dependent errors are found by a full pre-scan: an erroneous call writes nothing.
 */
#include <math.h>
#include <string.h>

#include "hwconv.h"

int hw_backend_memory(void) { return KVX_MEMORY_HOST; }

/* --------------------------------------------------------------- narrow floats */

typedef struct fmt {
  int eb, mb;     /* exponent and mantissa bits */
  int has_inf;    /* IEEE-like all-ones exponent (F16, BF16, E5M2) */
} fmt;

static const fmt F16 = {5, 10, 1}, BF16 = {8, 7, 1}, E4M3 = {4, 3, 0}, E5M2 = {5, 2, 1};

/* Magnitude code of finite |a| rounded to nearest even; overflow gives inf (the
 * FP8 callers clamp first, so they never overflow). */
static uint32_t encode_mag(double a, fmt f) {
  const int bias = (1 << (f.eb - 1)) - 1, emin = 1 - bias;
  if (a == 0.0) return 0;
  int k;
  frexp(a, &k); /* a = m * 2^k, m in [0.5, 1) */
  int e = k - 1;
  if (e < emin) e = emin; /* subnormal: the quantum of the smallest binade */
  double m = nearbyint(ldexp(a, f.mb - e)); /* exact scaling, RNE (default rounding mode) */
  uint32_t code;
  if (e == emin && m < ldexp(1.0, f.mb)) {
    code = (uint32_t)m; /* subnormal (or rounds up into the first normal: same code) */
  } else {
    if (m >= ldexp(1.0, f.mb + 1)) {
      m = ldexp(m, -1);
      ++e;
    }
    code = ((uint32_t)(e + bias) << f.mb) | ((uint32_t)m - (1u << f.mb));
  }
  const uint32_t inf = ((1u << f.eb) - 1u) << f.mb;
  if (f.has_inf && code >= inf) return inf;
  return code;
}

static double decode_mag(uint32_t code, fmt f) {
  const int bias = (1 << (f.eb - 1)) - 1;
  const uint32_t field = code >> f.mb, mant = code & ((1u << f.mb) - 1u);
  if (field == 0) return ldexp((double)mant, 1 - bias - f.mb);
  return ldexp((double)((1u << f.mb) | mant), (int)field - bias - f.mb);
}

static const fmt* fmt_of(int dt) {
  switch (dt) {
    case KVX_DTYPE_F16: return &F16;
    case KVX_DTYPE_BF16: return &BF16;
    case KVX_DTYPE_F8_E4M3: return &E4M3;
    default: return &E5M2;
  }
}

/* FP32 value of an F16 / BF16 / F32 element (FP8 sources are only copied). */
static float load_f32(const unsigned char* p, int dt) {
  if (dt == KVX_DTYPE_F32) {
    float f;
    memcpy(&f, p, 4);
    return f;
  }
  uint16_t h;
  memcpy(&h, p, 2);
  const fmt* f = fmt_of(dt);
  const uint32_t sign = h >> 15, mag = h & 0x7FFFu, inf = ((1u << f->eb) - 1u) << f->mb;
  float v;
  if (mag > inf) v = NAN;
  else if (mag == inf) v = INFINITY;
  else v = (float)decode_mag(mag, *f);
  return sign ? -v : v;
}

/* Store FP32 `x` as dtype `dt` (FP8: x / scale, clamped), NaNs as the header says. */
static void store_converted(unsigned char* out, int dt, float x, float scale) {
  const int neg = signbit(x) != 0;
  if (dt == KVX_DTYPE_F32) {
    if (isnan(x)) {
      const uint32_t bits = 0x7FFFFFFFu;
      memcpy(out, &bits, 4);
    } else {
      memcpy(out, &x, 4);
    }
    return;
  }
  if (hw_is_fp8(dt)) {
    const float q = x / scale; /* IEEE FP32 division */
    const fmt* f = fmt_of(dt);
    if (isnan(q)) {
      const int qneg = signbit(q) != 0;
      out[0] = dt == KVX_DTYPE_F8_E4M3 ? (uint8_t)((qneg ? 0x00 : 0x80) | 0x7F) : (uint8_t)((qneg ? 0x80 : 0) | 0x7F);
      return;
    }
    const double max = dt == KVX_DTYPE_F8_E4M3 ? 448.0 : 57344.0;
    double a = fabs((double)q);
    if (a > max) a = max; /* +-inf saturate too */
    out[0] = (uint8_t)((signbit(q) ? 0x80u : 0u) | encode_mag(a, *f));
    return;
  }
  uint16_t h;
  if (isnan(x)) {
    h = 0x7FFFu;
  } else if (isinf(x)) {
    h = (uint16_t)((neg ? 0x8000u : 0u) | (((1u << fmt_of(dt)->eb) - 1u) << fmt_of(dt)->mb));
  } else {
    h = (uint16_t)((neg ? 0x8000u : 0u) | encode_mag(fabs((double)x), *fmt_of(dt)));
  }
  memcpy(out, &h, 2);
}

static void move_elem(unsigned char* dst, int dst_dt, const unsigned char* src, int src_dt, float scale) {
  if (dst_dt == src_dt) {
    memcpy(dst, src, (size_t)hw_dtype_size(dst_dt));
    return;
  }
  store_converted(dst, dst_dt, load_f32(src, src_dt), scale);
}

/* --------------------------------------------------------------- addressing */

static int64_t load_index(const void* base, int dt, uint64_t i) {
  if (dt == KVX_DTYPE_S32) {
    int32_t v;
    memcpy(&v, (const char*)base + 4 * i, 4);
    return v;
  }
  int64_t v;
  memcpy(&v, (const char*)base + 8 * i, 8);
  return v;
}

static unsigned char* cache_at(const hw_cache_tensor* c, uint64_t b, uint64_t t, uint64_t h, uint64_t d) {
  const int64_t off = (int64_t)b * c->s_block + (int64_t)t * c->s_token + (int64_t)h * c->s_head + (int64_t)d * c->s_dim;
  return (unsigned char*)c->data + off * hw_dtype_size(c->dtype);
}

static unsigned char* io_at(const hw_io_tensor* t, uint64_t r, uint64_t h, uint64_t d) {
  const int64_t g = (int64_t)r / t->rows_per_group, row = (int64_t)r % t->rows_per_group;
  const int64_t off = g * t->s_group + row * t->s_row + (int64_t)h * t->s_head + (int64_t)d * t->s_dim;
  return (unsigned char*)t->data + off * hw_dtype_size(t->dtype);
}

static float scale_at(const hw_scale* s, uint32_t h) {
  float v = 1.0f;
  if (s->ptr) memcpy(&v, s->ptr + s->head_stride * (int64_t)h, sizeof v);
  return v;
}

/* --------------------------------------------------------------- calls */

kvx_status_t hw_backend_write(const hw_write_plan* p, void* stream) {
  (void)stream;
  const uint64_t nslots = (uint64_t)p->num_blocks * p->block_size;
  for (uint32_t i = 0; i < p->num_tokens; ++i) { /* pre-scan (R-WRITE) */
    const int64_t s = load_index(p->slots, p->slot_dtype, i);
    if (s < 0 || s == p->invalid_slot) continue;
    if ((uint64_t)s >= nslots) return KVX_STATUS_OUT_OF_RANGE;
  }
  for (uint32_t i = 0; i < p->num_tokens; ++i) {
    const int64_t s = load_index(p->slots, p->slot_dtype, i);
    if (s < 0 || s == p->invalid_slot) continue;
    const uint64_t b = (uint64_t)s / p->block_size, t = (uint64_t)s % p->block_size;
    for (uint32_t h = 0; h < p->num_kv_heads; ++h) {
      const float ks = scale_at(&p->k_scale, h), vs = scale_at(&p->v_scale, h);
      for (uint32_t d = 0; d < p->head_dim; ++d) {
        move_elem(cache_at(&p->k, b, t, h, d), p->k.dtype, io_at(&p->key, i, h, d), p->key.dtype, ks);
        move_elem(cache_at(&p->v, b, t, h, d), p->v.dtype, io_at(&p->value, i, h, d), p->value.dtype, vs);
      }
    }
  }
  return KVX_STATUS_OK;
}

kvx_status_t hw_backend_gather(const hw_gather_plan* p, void* stream) {
  (void)stream;
  const uint32_t S = p->seq_count, mb = p->max_blocks_per_seq, bs = p->block_size;
  /* R-DATA, in the readings' order: lengths, table capacity, block ids */
  for (uint32_t s = 0; s < S; ++s)
    if (load_index(p->lengths, p->lengths_dtype, s) < 0) return KVX_STATUS_INVALID_ARGUMENT;
  for (uint32_t s = 0; s < S; ++s) {
    int64_t n = load_index(p->lengths, p->lengths_dtype, s);
    if (n > (int64_t)p->max_seq_len) n = p->max_seq_len;
    if ((uint64_t)(n + bs - 1) / bs > mb) return KVX_STATUS_OUT_OF_RANGE;
  }
  for (uint32_t s = 0; s < S; ++s) {
    int64_t n = load_index(p->lengths, p->lengths_dtype, s);
    if (n > (int64_t)p->max_seq_len) n = p->max_seq_len;
    for (uint64_t j = 0; j * bs < (uint64_t)n; ++j) {
      const int64_t id = load_index(p->indices, p->index_dtype, (uint64_t)s * mb + j);
      if (id < 0 || id >= (int64_t)p->num_blocks) return KVX_STATUS_OUT_OF_RANGE;
    }
  }
  for (uint32_t s = 0; s < S; ++s) {
    int64_t n = load_index(p->lengths, p->lengths_dtype, s);
    if (n > (int64_t)p->max_seq_len) n = p->max_seq_len;
    for (int64_t t = 0; t < n; ++t) {
      const uint64_t b = (uint64_t)load_index(p->indices, p->index_dtype, (uint64_t)s * mb + (uint64_t)t / bs);
      const uint64_t r = (uint64_t)s * p->max_seq_len + (uint64_t)t;
      for (uint32_t h = 0; h < p->num_kv_heads; ++h)
        for (uint32_t d = 0; d < p->head_dim; ++d) {
          move_elem(io_at(&p->key, r, h, d), p->key.dtype, cache_at(&p->k, b, (uint64_t)t % bs, h, d), p->k.dtype, 1.0f);
          move_elem(io_at(&p->value, r, h, d), p->value.dtype, cache_at(&p->v, b, (uint64_t)t % bs, h, d), p->v.dtype,
                    1.0f);
        }
    }
  }
  return KVX_STATUS_OK;
}
