/*
 * move_fp4.cu -- KVX 1.2 FP4 caches on CUDA (DEVICE and UNIFIED memory):
 * cuda_fp4_write (quantize, or raw copy of codes and scales) and
 * cuda_fp4_gather (dequantize into F16/BF16/F32, or raw copy).
 *
 * Numerics are fp4.h's, shared with the host backend, so results are bit
 * identical to the oracle (reference_impl/fp4.py). One thread handles one
 * scale block (16 or 32 values) of one (row, K|V, head): it loads the block
 * (16-byte vector loads when the IO row is contiguous and aligned), computes
 * amax, the scale byte and the codes, and stores B/2 code bytes and one scale
 * byte (the gather reverses this). Consecutive threads take consecutive blocks
 * of a row, so loads and stores coalesce. Data-dependent errors on DEVICE
 * memory skip the rows concerned (R-DEVICE-STATUS); UNIFIED memory answers the
 * host's statuses through the host pre-scan, as the rest of the CUDA backend.
 * Never synchronizes (except the UNIFIED pre-scan), never allocates.
 */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <string.h>

#include "convert.h"
#include "fp4.h"
#include "kvx_plan.h"

namespace kvx_fp4 {
namespace {

using kvx_ref::CacheTensorPlan;
using kvx_ref::IoTensorPlan;

/* n / d for n < 2^31 by multiply and shift (d >= 1). */
struct Div {
  unsigned d, m, s;
};

Div make_div(unsigned d) {
  unsigned s = 0;
  while ((1ull << s) < d) ++s;
  const unsigned long long m = ((1ull << 32) * ((1ull << s) - d)) / d + 1;
  return Div{d, (unsigned)m, s};
}

__device__ __forceinline__ unsigned divu(const Div& D, unsigned n) { return (__umulhi(n, D.m) + n) >> D.s; }

struct Side {
  char* codes;                 /* cache data (nibble strides) */
  long long c_block, c_token, c_head;
  char* scales;                /* scale pool (byte strides) */
  long long s_block, s_token, s_head, s_dim;
  char* io;                    /* IO tensor (elements of io_dtype; nibbles when raw) */
  long long io_token, io_head, io_dim;
  char* ios;                   /* raw: IO scales */
  long long ios_token, ios_head, ios_dim;
  const float* g;              /* NVFP4 global: NULL (1.0), per tensor or per head */
  int g_per_head;
};

struct Params {
  Side side[2];
  int format, B, J, H;
  int io_dtype, io_esize;
  int raw, vec_ok;             /* vec_ok: IO rows contiguous and every block 16-byte aligned */
  unsigned items;              /* items of this launch: rows * 2 * H * J, below 2^31 */
  unsigned long long row_begin;
  Div fd_hj, fd_j, fd_bs, fd_msl;
  int slot32;                  /* num_slots < 2^31: 32-bit slot arithmetic */
  /* write */
  const void* slots;
  int slot64;
  long long invalid_slot;
  unsigned long long num_slots;
  unsigned block_size;
  /* gather */
  int ragged, idx64, indptr64, len64;
  const void* indices;
  const void* indptr;
  const void* seq_lens;
  unsigned max_seq_len, max_blocks, num_blocks, indices_count;
};

__device__ __forceinline__ long long ld_index(const void* base, int is64, unsigned long long i) {
  return is64 ? ((const long long*)base)[i] : (long long)((const int*)base)[i];
}

__device__ __forceinline__ float global_of(const Side& s, int h) {
  if (!s.g) return 1.0f;
  return s.g_per_head ? s.g[h] : s.g[0];
}

/* Kernels are instantiated per block size B (16, 32) and IO dtype DT (F16,
 * BF16, F32; 0 = raw F4_E2M1 transfer), so the per-block arrays stay in
 * registers. ES is the IO element size. */
template <int DT>
struct Es {
  static constexpr int value = DT == KVX_DTYPE_F32 ? 4 : 2;
};

/* FP32 value of element k of a block whose first element is at `p` (io_dim stride). */
template <int DT>
__device__ __forceinline__ float load_elem(const char* p, long long stride, int k) {
  const char* q = p + (long long)k * stride * Es<DT>::value;
  switch (DT) {
    case KVX_DTYPE_F16: {
      unsigned short h;
      memcpy(&h, q, 2);
      return __half2float(__ushort_as_half(h));
    }
    case KVX_DTYPE_BF16: {
      unsigned short b;
      memcpy(&b, q, 2);
      return __uint_as_float((unsigned)b << 16);
    }
    default: {
      float f;
      memcpy(&f, q, 4);
      return f;
    }
  }
}

/* Loads B values of a contiguous, 16-byte aligned block with vector loads. */
template <int B, int DT>
__device__ __forceinline__ void load_block_vec(const char* p, float* x) {
  const uint4* v = (const uint4*)p;
  constexpr int nvec = B * Es<DT>::value / 16;
#pragma unroll
  for (int i = 0; i < nvec; ++i) {
    const uint4 u = __ldg(v + i);
    const unsigned w[4] = {u.x, u.y, u.z, u.w};
    if (DT == KVX_DTYPE_F32) {
#pragma unroll
      for (int k = 0; k < 4; ++k) x[i * 4 + k] = __uint_as_float(w[k]);
    } else if (DT == KVX_DTYPE_F16) {
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        x[i * 8 + 2 * k] = __half2float(__ushort_as_half((unsigned short)(w[k] & 0xFFFFu)));
        x[i * 8 + 2 * k + 1] = __half2float(__ushort_as_half((unsigned short)(w[k] >> 16)));
      }
    } else {
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        x[i * 8 + 2 * k] = __uint_as_float(w[k] << 16);
        x[i * 8 + 2 * k + 1] = __uint_as_float(w[k] & 0xFFFF0000u);
      }
    }
  }
}

/* FP32 -> 16-bit output bits, bit-identical to convert.h (NaN through convert.h). */
template <int DT>
__device__ __forceinline__ unsigned short out16(float v) {
  if (v != v) return DT == KVX_DTYPE_F16 ? kvx_ref::f32_to_f16(v) : kvx_ref::f32_to_bf16(v);
  if (DT == KVX_DTYPE_F16) return __half_as_ushort(__float2half_rn(v));
  return __bfloat16_as_ushort(__float2bfloat16_rn(v));
}

template <int DT>
__device__ __forceinline__ void store_out(char* q, float v) {
  if (DT == KVX_DTYPE_F32) {
    memcpy(q, &v, 4);
    return;
  }
  const unsigned short b = out16<DT>(v);
  memcpy(q, &b, 2);
}

/* |v| in [2^-60, 2^60): see exact_div below. */
__device__ __forceinline__ bool div_range(float v) {
  return (__float_as_uint(v) & 0x7FFFFFFFu) - 0x21800000u < 0x3C000000u;
}

/* kvx_ref::f32_to_e2m1 (NaN excluded), fewer instructions: |q| < 1 by the
 * FP32 addition of 2^22 (RNE on the 0.5 grid: codes 0, 1, 2); |q| >= 1 by
 * rounding the FP32 bits to one mantissa bit (RNE in integers: + 0x1FFFFF + the
 * kept bit), whose (exponent, mantissa) field is then the code + 252, saturated
 * at 7. Equal to fp4.h's for every non-NaN FP32 input (checked exhaustively on
 * the host, all 2^32 bit patterns). The ties-away mutant keeps fp4.h's. */
__device__ __forceinline__ uint8_t e2m1_code(float q) {
  if (KVX_MUT(FP4_TIES_AWAY)) return kvx_ref::f32_to_e2m1(q);
  const uint32_t u = __float_as_uint(q), a = u & 0x7FFFFFFFu;
  uint32_t m;
  if (a < 0x3F800000u) {
    m = __float_as_uint(__fadd_rn(__uint_as_float(a), 4194304.0f)) - 0x4A800000u;
  } else {
    const uint32_t r = a + 0x1FFFFFu + ((a >> 22) & 1u);
    m = min((r >> 22) - 252u, 7u);
  }
  return (uint8_t)(((u >> 28) & 8u) | m);
}

/* kvx_ref::fp4_encode_block, bit for bit, with the NVFP4 division x / denom of
 * every value done as Markstein's correctly rounded reciprocal-multiply:
 * r = RN(1/denom) once per block, q0 = RN(x r), e = x - q0 denom (exact, fma),
 * q = RN(q0 + e r) == RN(x / denom) when |denom| and |x| are in [2^-60, 2^60)
 * (no underflow or overflow; x = +-0 gives x r). Other values take the IEEE
 * division. The same identity as the FP8 path (cuda/move.cuh exact_div_rcp,
 * checked against IEEE division on every FP32 significand against thousands of
 * divisor significands). Returns the scale byte. */
template <int B>
__device__ __forceinline__ uint8_t encode_block(int format, const float* x, float g, uint8_t* codes) {
  bool nan = false;
  const float amax = kvx_ref::fp4_amax(x, B, &nan);
  const kvx_ref::Fp4BlockScale sc = kvx_ref::fp4_block_scale(format, amax, nan, g);
  if (sc.dead) {
#pragma unroll
    for (int i = 0; i < B; ++i) codes[i] = 0;
  } else if (sc.inv != 0.0f) {
#pragma unroll
    for (int i = 0; i < B; ++i) codes[i] = e2m1_code(__fmul_rn(x[i], sc.inv));
  } else if (div_range(sc.denom)) {
    const float d = sc.denom, r = __frcp_rn(d);
    bool slow = false;
#pragma unroll
    for (int i = 0; i < B; ++i) {
      slow |= !(div_range(x[i]) || x[i] == 0.0f);
      const float q0 = __fmul_rn(x[i], r);
      const float q = __fmaf_rn(__fmaf_rn(-q0, d, x[i]), r, q0);
      codes[i] = e2m1_code(x[i] == 0.0f ? q0 : q);
    }
    if (slow) {
#pragma unroll
      for (int i = 0; i < B; ++i) codes[i] = kvx_ref::fp4_encode_value(sc, x[i]);
    }
  } else {
#pragma unroll
    for (int i = 0; i < B; ++i) codes[i] = kvx_ref::fp4_encode_value(sc, x[i]);
  }
  return sc.byte;
}

struct Item {
  unsigned long long row;
  int side, h, j;
};

__device__ __forceinline__ Item split(const Params& P, unsigned i) {
  Item it;
  const unsigned q = divu(P.fd_hj, i), hj = i - q * P.fd_hj.d;
  it.h = (int)divu(P.fd_j, hj);
  it.j = (int)(hj - (unsigned)it.h * P.fd_j.d);
  it.side = (int)(q & 1u);
  it.row = P.row_begin + (q >> 1);
  return it;
}

#ifndef KVX_FP4_WRITE32_MIN_BLOCKS
#define KVX_FP4_WRITE32_MIN_BLOCKS 3 /* 32-value blocks: at most 80 registers (BF16 IO: 2, it would spill) */
#endif
template <int B, int DT>
__global__ void __launch_bounds__(256, B == 16 ? 4 : DT == KVX_DTYPE_BF16 ? 2 : KVX_FP4_WRITE32_MIN_BLOCKS)
    write_kernel(Params P) {
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
    if (P.slot32) {
      b = divu(P.fd_bs, (unsigned)slot);
      t = (unsigned long long)slot - b * P.block_size;
    } else {
      b = (unsigned long long)slot / P.block_size;
      t = (unsigned long long)slot % P.block_size;
    }
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

template <int B, int DT>
__global__ void __launch_bounds__(256, B == 16 ? 4 : 2) gather_kernel(Params P) {
  constexpr int ES = Es<DT>::value;
  /* E2M1 code -> FP32 value (kvx_ref::e2m1_to_f32), one shared-memory load per
   * value: 16 words in 16 banks, so lanes never conflict. */
  __shared__ float e2m1[16];
  if (threadIdx.x < 16) e2m1[threadIdx.x] = kvx_ref::e2m1_to_f32(threadIdx.x);
  __syncthreads();
  for (unsigned i = blockIdx.x * blockDim.x + threadIdx.x; i < P.items; i += gridDim.x * blockDim.x) {
    const Item it = split(P, i);
    const unsigned long long s =
        it.row < 0x80000000ull ? divu(P.fd_msl, (unsigned)it.row) : it.row / P.max_seq_len;
    const unsigned long long t = it.row - s * P.max_seq_len;
    long long L = ld_index(P.seq_lens, P.len64, s);
    if (L < 0) continue;
    if ((unsigned long long)L > P.max_seq_len) L = P.max_seq_len;
    if (t >= (unsigned long long)L) continue;
    const unsigned long long jb = t < 0x80000000ull ? divu(P.fd_bs, (unsigned)t) : t / P.block_size;
    long long b;
    if (P.ragged) {
      const long long lo = ld_index(P.indptr, P.indptr64, s), hi = ld_index(P.indptr, P.indptr64, s + 1);
      if (lo < 0 || hi < lo || (long long)t >= hi - lo || (unsigned long long)(lo + t) >= P.indices_count) continue;
      b = ld_index(P.indices, P.idx64, lo + t);
    } else {
      if (jb >= P.max_blocks) continue;
      b = ld_index(P.indices, P.idx64, s * P.max_blocks + jb);
    }
    if (b < 0 || (unsigned long long)b >= P.num_blocks) continue;
    const unsigned long long sb = KVX_MUT(FP4_SCALE_LOGICAL_BLOCK) ? jb : (unsigned long long)b;
    const Side& S = P.side[it.side];
    const unsigned long long off = t - jb * P.block_size; /* t % block_size */
    const long long c0 = b * S.c_block + off * S.c_token + it.h * S.c_head + (long long)it.j * B;
    const uint8_t sbyte = (uint8_t)S.scales[sb * S.s_block + off * S.s_token + it.h * S.s_head + it.j * S.s_dim];
    const char* src = S.codes + c0 / 2;
    if (DT == 0) { /* raw */
      const long long i0 = it.row * S.io_token + it.h * S.io_head + (long long)it.j * B;
      for (int k = 0; k < B; k += 2) S.io[(i0 + k) / 2] = src[k / 2];
      S.ios[it.row * S.ios_token + it.h * S.ios_head + it.j * S.ios_dim] = (char)sbyte;
      continue;
    }
    uint8_t bytes[B / 2];
    if (((uintptr_t)src % 8) == 0) {
#pragma unroll
      for (int w = 0; w < B / 16; ++w) {
        const uint2 u = __ldg((const uint2*)src + w);
        memcpy(bytes + 8 * w, &u, 8);
      }
    } else {
#pragma unroll
      for (int k = 0; k < B / 2; ++k) bytes[k] = (uint8_t)src[k];
    }
    const float g = global_of(S, it.h);
    const float sf = kvx_ref::fp4_scale_f32(P.format, sbyte); /* once per block */
    const bool nan_block = sf != sf;
    float v[B];
    /* kvx_ref::fp4_decode_with, the same operations: a NaN scale is every value
     * (its bits), else (E2M1 * sf) * g for NVFP4, E2M1 * sf for MXFP4. */
    if (nan_block) {
#pragma unroll
      for (int k = 0; k < B; ++k) v[k] = sf;
    } else if (P.format == kvx_ref::FP4_NVFP4) {
#pragma unroll
      for (int k = 0; k < B / 2; ++k) {
        v[2 * k] = __fmul_rn(__fmul_rn(e2m1[kvx_ref::fp4_even(bytes[k])], sf), g);
        v[2 * k + 1] = __fmul_rn(__fmul_rn(e2m1[kvx_ref::fp4_odd(bytes[k])], sf), g);
      }
    } else {
#pragma unroll
      for (int k = 0; k < B / 2; ++k) {
        v[2 * k] = __fmul_rn(e2m1[kvx_ref::fp4_even(bytes[k])], sf);
        v[2 * k + 1] = __fmul_rn(e2m1[kvx_ref::fp4_odd(bytes[k])], sf);
      }
    }
    char* dst = S.io + (it.row * S.io_token + it.h * S.io_head + (long long)it.j * B * S.io_dim) * ES;
    if (P.vec_ok) {
      constexpr int nvec = B * ES / 16;
#pragma unroll
      for (int w = 0; w < nvec; ++w) {
        unsigned o[4];
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          if (ES == 4) {
            o[k] = __float_as_uint(v[w * 4 + k]);
          } else if (nan_block) { /* NaN bits as convert.h (numpy / ml_dtypes) */
            o[k] = (unsigned)out16<DT>(v[w * 8 + 2 * k]) | ((unsigned)out16<DT>(v[w * 8 + 2 * k + 1]) << 16);
          } else if (DT == KVX_DTYPE_F16) { /* two RN conversions in one instruction */
            const __half2 h = __floats2half2_rn(v[w * 8 + 2 * k], v[w * 8 + 2 * k + 1]);
            memcpy(&o[k], &h, 4);
          } else {
            const __nv_bfloat162 h = __floats2bfloat162_rn(v[w * 8 + 2 * k], v[w * 8 + 2 * k + 1]);
            memcpy(&o[k], &h, 4);
          }
        }
        ((uint4*)dst)[w] = make_uint4(o[0], o[1], o[2], o[3]);
      }
    } else {
#pragma unroll
      for (int k = 0; k < B; ++k) store_out<DT>(dst + (long long)k * S.io_dim * ES, v[k]);
    }
  }
}

bool aligned(const void* p, unsigned long long n) { return ((uintptr_t)p % n) == 0; }

void fill_side(Side& S, const CacheTensorPlan& c, const CacheTensorPlan& sc, const IoTensorPlan& io,
               const IoTensorPlan& ios, const kvx_ref::ScalePlan& g) {
  S.codes = (char*)c.data;
  S.c_block = c.s_block;
  S.c_token = c.s_token;
  S.c_head = c.s_head;
  S.scales = (char*)sc.data;
  S.s_block = sc.s_block;
  S.s_token = sc.s_token;
  S.s_head = sc.s_head;
  S.s_dim = sc.s_dim_outer;
  S.io = (char*)io.data;
  S.io_token = io.s_token;
  S.io_head = io.s_head;
  S.io_dim = io.s_dim;
  S.ios = (char*)ios.data;
  S.ios_token = ios.s_token;
  S.ios_head = ios.s_head;
  S.ios_dim = ios.s_dim;
  S.g = g.kind == kvx_ref::SCALE_ONE ? nullptr : g.ptr;
  S.g_per_head = g.kind == kvx_ref::SCALE_PER_HEAD;
}

/* IO rows contiguous along head_dim with every block start 16-byte aligned. */
bool vec_ok(const Params& P) {
  if (P.raw) return false;
  const unsigned long long blk = (unsigned long long)P.B * P.io_esize;
  for (int i = 0; i < 2; ++i) {
    const Side& S = P.side[i];
    if (S.io_dim != 1 || !aligned(S.io, 16)) return false;
    if ((S.io_token * P.io_esize) % 16 || (S.io_head * P.io_esize) % 16 || blk % 16) return false;
  }
  return true;
}

typedef void (*Kernel)(Params);

template <bool W, int B>
Kernel pick_dt(int dt) {
  switch (dt) {
    case KVX_DTYPE_F16:
      return W ? write_kernel<B, KVX_DTYPE_F16> : gather_kernel<B, KVX_DTYPE_F16>;
    case KVX_DTYPE_BF16:
      return W ? write_kernel<B, KVX_DTYPE_BF16> : gather_kernel<B, KVX_DTYPE_BF16>;
    case KVX_DTYPE_F32:
      return W ? write_kernel<B, KVX_DTYPE_F32> : gather_kernel<B, KVX_DTYPE_F32>;
    default:
      return W ? write_kernel<B, 0> : gather_kernel<B, 0>;
  }
}

template <bool W>
Kernel pick(const Params& P) {
  const int dt = P.raw ? 0 : P.io_dtype;
  return P.B == 32 ? pick_dt<W, 32>(dt) : pick_dt<W, 16>(dt);
}

kvx_status_t launch_chunk(Kernel kernel, const Params& P, cudaStream_t stream) {
  if (P.items == 0) return KVX_STATUS_OK;
  /* One item per thread: many short-lived warps keep the most loads in flight
   * (the kernels still loop, grid-stride, should the grid ever be capped). */
  const unsigned grid = (unsigned)((P.items + 255) / 256);
  kernel<<<grid, 256, 0, stream>>>(P);
  const cudaError_t e = cudaGetLastError();
  return e == cudaSuccess ? KVX_STATUS_OK : KVX_STATUS_INTERNAL_ERROR;
}

/* Launches over `rows` rows in chunks whose item count stays below 2^31. */
kvx_status_t launch(Kernel kernel, Params P, unsigned long long rows, cudaStream_t stream) {
  const unsigned long long per_row = 2ull * P.H * P.J;
  const unsigned long long max_rows = 0x7F000000ull / per_row;
  if (max_rows == 0) return KVX_STATUS_UNSUPPORTED;
  P.fd_hj = make_div((unsigned)(P.H * P.J));
  P.fd_j = make_div((unsigned)P.J);
  P.fd_bs = make_div(P.block_size);
  for (unsigned long long r0 = 0; r0 < rows; r0 += max_rows) {
    const unsigned long long n = rows - r0 < max_rows ? rows - r0 : max_rows;
    P.row_begin = r0;
    P.items = (unsigned)(n * per_row);
    const kvx_status_t st = launch_chunk(kernel, P, stream);
    if (st != KVX_STATUS_OK) return st;
  }
  return KVX_STATUS_OK;
}

kvx_status_t unified_wait(cudaStream_t stream) {
  int dev = 0, concurrent = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) return KVX_STATUS_INTERNAL_ERROR;
  cudaDeviceGetAttribute(&concurrent, cudaDevAttrConcurrentManagedAccess, dev);
  const cudaError_t e = concurrent ? cudaStreamSynchronize(stream) : cudaDeviceSynchronize();
  return e == cudaSuccess ? KVX_STATUS_OK : KVX_STATUS_INTERNAL_ERROR;
}

Params base(const kvx_ref::Fp4Plan& f, uint32_t H, uint32_t D, kvx_dtype_t io_dtype) {
  Params P;
  memset(&P, 0, sizeof P);
  P.format = f.format;
  P.B = (int)f.block_values;
  P.J = (int)(D / f.block_values);
  P.H = (int)H;
  P.raw = f.raw;
  P.io_dtype = io_dtype;
  P.io_esize = (int)kvx_ref::dtype_size(io_dtype);
  return P;
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
  return launch(pick<true>(P), P, plan.num_tokens, (cudaStream_t)stream);
}

kvx_status_t cuda_fp4_gather(const GatherPlan& plan, void* stream) {
  using namespace kvx_fp4;
  if (!cuda_available()) return KVX_STATUS_UNSUPPORTED;
  if (plan.memory == KVX_MEMORY_UNIFIED && plan.seq_count > 0) {
    kvx_status_t st = unified_wait((cudaStream_t)stream);
    if (st == KVX_STATUS_OK) st = host_prescan_gather(plan);
    if (st != KVX_STATUS_OK) return st;
  }
  const unsigned long long rows = (unsigned long long)plan.seq_count * plan.max_seq_len;
  if (rows == 0) return KVX_STATUS_OK;
  if (plan.format != KVX_BLOCK_TABLE_PACKED && plan.format != KVX_BLOCK_TABLE_RAGGED) return KVX_STATUS_UNSUPPORTED;
  const Fp4Plan& f = plan.fp4;
  if (!f.raw && plan.key.dtype != plan.value.dtype) return KVX_STATUS_UNSUPPORTED;
  Params P = base(f, plan.num_kv_heads, plan.head_dim, plan.key.dtype);
  fill_side(P.side[0], plan.k_cache, f.k_scales, plan.key, f.io_k_scales, f.k_global);
  fill_side(P.side[1], plan.v_cache, f.v_scales, plan.value, f.io_v_scales, f.v_global);
  P.block_size = plan.block_size;
  P.ragged = plan.format == KVX_BLOCK_TABLE_RAGGED;
  P.indices = plan.indices;
  P.idx64 = plan.index_dtype == KVX_DTYPE_S64;
  P.indptr = plan.indptr;
  P.indptr64 = plan.indptr_dtype == KVX_DTYPE_S64;
  P.seq_lens = plan.seq_lens;
  P.len64 = plan.seq_lens_dtype == KVX_DTYPE_S64;
  P.max_seq_len = plan.max_seq_len;
  P.fd_msl = make_div(plan.max_seq_len);
  P.max_blocks = plan.max_blocks_per_seq;
  P.num_blocks = plan.num_blocks;
  P.indices_count = plan.indices_count;
  P.vec_ok = vec_ok(P);
  return launch(pick<false>(P), P, rows, (cudaStream_t)stream);
}

}  // namespace kvx_ref
