/*
 * hwconv_cuda.cu -- the device backend of the hwconv test provider (hwconv.h):
 * DEVICE memory only (metadata and scales in device memory too, R-META-MEMORY).
 * Conversions are the GPU's own instructions: __half2float / __bfloat162float to
 * FP32, __float2half_rn / __float2bfloat16_rn, and for FP8 q = x / scale (IEEE
 * division, __fdiv_rn) converted by __nv_cvt_float_to_fp8(q, __NV_SATFINITE, ...):
 * finite values round to nearest even and saturate to +-448 / +-57344, +-inf
 * saturates to the largest finite value, and NaN stays a NaN in the hardware's
 * encoding (0x7F for both formats). Same-dtype moves copy the bits.
 * Data-dependent errors (slots, lengths, block ids) are skipped per element and the
 * call answers OK (R-DEVICE-STATUS): nothing out of bounds is touched and the host
 * never synchronizes on the stream. Built once more as
 * libkvx_testing_hwconv_cuda_own_stream_fp8.so with a defect (KVX_HW_OWN_STREAM_FP8, below).
 */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>
#include <string.h>

#include "hwconv.h"

extern "C" int hw_backend_memory(void) { return KVX_MEMORY_DEVICE; }

namespace {

__device__ inline float load_f32(const unsigned char* p, int dt) {
  if (dt == KVX_DTYPE_F32) {
    float f;
    memcpy(&f, p, 4);
    return f;
  }
  unsigned short h;
  memcpy(&h, p, 2);
  if (dt == KVX_DTYPE_F16) return __half2float(__ushort_as_half(h));
  return __bfloat162float(__ushort_as_bfloat16(h));
}

/* One 16-bit element: a single 2-byte store where the address allows it. */
__device__ inline void store16(unsigned char* dst, unsigned short h) {
  if ((reinterpret_cast<unsigned long long>(dst) & 1ull) == 0) {
    *reinterpret_cast<unsigned short*>(dst) = h;
  } else {
    dst[0] = (unsigned char)(h & 0xFFu);
    dst[1] = (unsigned char)(h >> 8);
  }
}

__device__ inline void move_elem(unsigned char* dst, int dst_dt, const unsigned char* src, int src_dt,
                                 const float* scale) {
  if (dst_dt == src_dt) {
    memcpy(dst, src, hw_dtype_size(dst_dt));
    return;
  }
  const float x = load_f32(src, src_dt);
  switch (dst_dt) {
    case KVX_DTYPE_F32:
      memcpy(dst, &x, 4);
      break;
    case KVX_DTYPE_F16:
      store16(dst, __half_as_ushort(__float2half_rn(x)));
      break;
    case KVX_DTYPE_BF16:
      store16(dst, __bfloat16_as_ushort(__float2bfloat16_rn(x)));
      break;
    default: {
      float s = 1.0f;
      if (scale) memcpy(&s, scale, 4);
      const float q = __fdiv_rn(x, s);
      *dst = (unsigned char)__nv_cvt_float_to_fp8(q, __NV_SATFINITE,
                                                 dst_dt == KVX_DTYPE_F8_E4M3 ? __NV_E4M3 : __NV_E5M2);
      break;
    }
  }
}

__device__ inline long long load_index(const void* base, int dt, unsigned long long i) {
  if (dt == KVX_DTYPE_S32) {
    int v;
    memcpy(&v, (const char*)base + 4 * i, 4);
    return v;
  }
  long long v;
  memcpy(&v, (const char*)base + 8 * i, 8);
  return v;
}

__device__ inline unsigned char* cache_at(const hw_cache_tensor& c, long long b, long long t, long long h,
                                          long long d) {
  const long long off = b * c.s_block + t * c.s_token + h * c.s_head + d * c.s_dim;
  return (unsigned char*)c.data + off * hw_dtype_size(c.dtype);
}

__device__ inline unsigned char* io_at(const hw_io_tensor& t, long long r, long long h, long long d) {
  const long long g = r / t.rows_per_group, row = r % t.rows_per_group;
  const long long off = g * t.s_group + row * t.s_row + h * t.s_head + d * t.s_dim;
  return (unsigned char*)t.data + off * hw_dtype_size(t.dtype);
}

__device__ inline const float* scale_ptr(const hw_scale& s, unsigned h) {
  return s.ptr ? s.ptr + s.head_stride * h : nullptr;
}

/* One thread per (token, head, dim), grid-stride. */
__global__ void write_kernel(hw_write_plan p) {
  const unsigned long long HD = (unsigned long long)p.num_kv_heads * p.head_dim;
  const unsigned long long n = HD * p.num_tokens, nslots = (unsigned long long)p.num_blocks * p.block_size;
  for (unsigned long long e = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; e < n;
       e += (unsigned long long)gridDim.x * blockDim.x) {
    const unsigned long long i = e / HD, h = (e % HD) / p.head_dim, d = e % p.head_dim;
    const long long s = load_index(p.slots, p.slot_dtype, i);
    if (s < 0 || s == p.invalid_slot || (unsigned long long)s >= nslots) continue; /* no-op / skipped */
    const long long b = s / p.block_size, t = s % p.block_size;
    move_elem(cache_at(p.k, b, t, h, d), p.k.dtype, io_at(p.key, i, h, d), p.key.dtype, scale_ptr(p.k_scale, h));
    move_elem(cache_at(p.v, b, t, h, d), p.v.dtype, io_at(p.value, i, h, d), p.value.dtype,
              scale_ptr(p.v_scale, h));
  }
}

/* One thread per (output row, head, dim), grid-stride. */
__global__ void gather_kernel(hw_gather_plan p) {
  const unsigned long long HD = (unsigned long long)p.num_kv_heads * p.head_dim;
  const unsigned long long n = HD * p.seq_count * p.max_seq_len;
  for (unsigned long long e = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; e < n;
       e += (unsigned long long)gridDim.x * blockDim.x) {
    const unsigned long long r = e / HD, h = (e % HD) / p.head_dim, d = e % p.head_dim;
    const unsigned long long s = r / p.max_seq_len, t = r % p.max_seq_len;
    const long long len = load_index(p.lengths, p.lengths_dtype, s);
    if (len < 0 || (long long)t >= len) continue; /* rows past the length stay untouched */
    const unsigned long long j = t / p.block_size;
    if (j >= p.max_blocks_per_seq) continue;
    const long long b = load_index(p.indices, p.index_dtype, s * p.max_blocks_per_seq + j);
    if (b < 0 || b >= (long long)p.num_blocks) continue;
    const long long off = t % p.block_size;
    move_elem(io_at(p.key, r, h, d), p.key.dtype, cache_at(p.k, b, off, h, d), p.k.dtype, nullptr);
    move_elem(io_at(p.value, r, h, d), p.value.dtype, cache_at(p.v, b, off, h, d), p.v.dtype, nullptr);
  }
}

unsigned grid_for(unsigned long long n) {
  unsigned long long g = (n + 255) / 256;
  return (unsigned)(g < 4096 ? (g ? g : 1) : 4096);
}

kvx_status_t launched() {
  return cudaGetLastError() == cudaSuccess ? KVX_STATUS_OK : KVX_STATUS_INTERNAL_ERROR;
}

#ifndef KVX_HW_OWN_STREAM_FP8
#define KVX_HW_OWN_STREAM_FP8 0
#endif

inline bool fp8(int dt) { return dt == KVX_DTYPE_F8_E4M3 || dt == KVX_DTYPE_F8_E5M2; }

}  // namespace

/* The defect of libkvx_testing_hwconv_cuda_own_stream_fp8.so (KVX_HW_OWN_STREAM_FP8=1): the
 * quantizing writes (an FP8 cache side, IO of another dtype) run on a stream of this provider's
 * own, waited for before the call returns, instead of the caller's: they do not wait for the work
 * queued before the call (R-STREAM). Every other call keeps the caller's stream. */
extern "C" kvx_status_t hw_backend_write(const hw_write_plan* p, void* stream) {
  const unsigned long long n = (unsigned long long)p->num_tokens * p->num_kv_heads * p->head_dim;
  if (n == 0) return KVX_STATUS_OK;
  cudaStream_t s = (cudaStream_t)stream;
  const bool own = KVX_HW_OWN_STREAM_FP8 && ((fp8(p->k.dtype) && p->key.dtype != p->k.dtype) ||
                                             (fp8(p->v.dtype) && p->value.dtype != p->v.dtype));
  if (own) {
    static cudaStream_t mine = [] {
      cudaStream_t x = nullptr;
      cudaStreamCreateWithFlags(&x, cudaStreamNonBlocking);
      return x;
    }();
    s = mine;
  }
  write_kernel<<<grid_for(n), 256, 0, s>>>(*p);
  kvx_status_t st = launched();
  if (own) cudaStreamSynchronize(s);
  return st;
}

extern "C" kvx_status_t hw_backend_gather(const hw_gather_plan* p, void* stream) {
  const unsigned long long n = (unsigned long long)p->seq_count * p->max_seq_len * p->num_kv_heads * p->head_dim;
  if (n == 0) return KVX_STATUS_OK;
  gather_kernel<<<grid_for(n), 256, 0, (cudaStream_t)stream>>>(*p);
  return launched();
}
