/*
 * move_kernels.cuh -- the two kernel templates over move.cuh:
 *   move_fast<Op>:  16-byte chunks, one Op per (source dtype, destination dtype),
 *                   for tensors whose head_dim runs are contiguous and aligned;
 *   move_general:   one element per item, any strides, dtypes read at run time.
 * Both are grid-stride loops over items with kUnroll items per thread in
 * flight: stage 1 issues every metadata (and, for write, IO) load, stage 2
 * resolves rows and issues the remaining data loads, stage 3 converts and stores.
 * Included by the launch translation units only.
 */
#ifndef KVX_CUDA_MOVE_KERNELS_CUH
#define KVX_CUDA_MOVE_KERNELS_CUH

#include "move.cuh"

namespace kvx_cuda {

/* Tuning knobs (defaults measured on an H100, docs/cuda-reference.md). */
#ifndef KVX_CUDA_COPY_PREFETCH
#define KVX_CUDA_COPY_PREFETCH 1 /* same-dtype copy: load the next row's metadata early */
#endif
#ifndef KVX_CUDA_COPY_MIN_BLOCKS
#define KVX_CUDA_COPY_MIN_BLOCKS 1 /* no register cap (4 blocks, 64 registers: as fast or slower) */
#endif
#ifndef KVX_CUDA_FP8_F16_MIN_BLOCKS
#define KVX_CUDA_FP8_F16_MIN_BLOCKS 4 /* F16 -> FP8: 64 registers, a few bytes of spill around the rare call */
#endif
#ifndef KVX_CUDA_FP8_F32_MIN_BLOCKS
#define KVX_CUDA_FP8_F32_MIN_BLOCKS 4 /* F32 -> FP8 */
#endif
#ifndef KVX_CUDA_FP8_MIN_BLOCKS
#define KVX_CUDA_FP8_MIN_BLOCKS 1 /* BF16 -> FP8: capped at 64 it spills and loses ~8 points */
#endif

/* ------------------------------------------------------------------------ */
/* Vector storage of N bytes. */
template <int N> struct VecOf;
template <> struct VecOf<2> { using T = uint16_t; };
template <> struct VecOf<4> { using T = uint32_t; };
template <> struct VecOf<8> { using T = uint2; };
template <> struct VecOf<16> { using T = uint4; };

/* Dtype traits: storage, exact hardware widening where one exists, and which
 * inputs must take the software path (whose NaN bits the hardware would not keep). */
struct TF16 {
  using S = uint16_t;
  static constexpr kvx_dtype_t dt = KVX_DTYPE_F16;
  static __device__ __forceinline__ float hw_f32(S v) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(v));
    return f;
  }
  static __device__ __forceinline__ bool special(S v) { return (v & 0x7FFFu) > 0x7C00u; }
  static __device__ __forceinline__ float sw_f32(S v) { return kvx_ref::f16_to_f32(v); }
  /* finite: zero or within [2^-24, 65504], inside exact_div_range */
  static __device__ __forceinline__ bool div_ok(S v) { return (v & 0x7FFFu) < 0x7C00u; }
};
struct TBF16 {
  using S = uint16_t;
  static constexpr kvx_dtype_t dt = KVX_DTYPE_BF16;
  static __device__ __forceinline__ float hw_f32(S v) { return __uint_as_float((uint32_t)v << 16); }
  static __device__ __forceinline__ bool special(S v) { return (v & 0x7FFFu) > 0x7F80u; }
  static __device__ __forceinline__ float sw_f32(S v) { return kvx_ref::bf16_to_f32(v); }
  /* zero, or |v| in [2^-60, 2^60) (exact_div_range on the widened bits) */
  static __device__ __forceinline__ bool div_ok(S v) {
    const uint32_t a = v & 0x7FFFu;
    return a == 0 || (uint32_t)(a - 0x2180u) < 0x3C00u;
  }
};
struct TF32 {
  using S = uint32_t;
  static constexpr kvx_dtype_t dt = KVX_DTYPE_F32;
  static __device__ __forceinline__ float hw_f32(S v) { return __uint_as_float(v); }
  /* NaN, or an FP32 subnormal (kept off the hardware narrowing on principle). */
  static __device__ __forceinline__ bool special(S v) {
    const uint32_t a = v & 0x7FFFFFFFu;
    return a > 0x7F800000u || (a != 0 && a < 0x00800000u);
  }
  static __device__ __forceinline__ float sw_f32(S v) { return __uint_as_float(v); }
  static __device__ __forceinline__ bool div_ok(S v) {
    const uint32_t a = v & 0x7FFFFFFFu;
    return a == 0 || a - 0x21800000u < 0x3C000000u;
  }
};
struct TE4M3 {
  using S = uint8_t;
  static constexpr kvx_dtype_t dt = KVX_DTYPE_F8_E4M3;
};
struct TE5M2 {
  using S = uint8_t;
  static constexpr kvx_dtype_t dt = KVX_DTYPE_F8_E5M2;
};

/* Hardware narrowing of two FP32 values (RNE, IEEE overflow to inf; the same
 * bits as convert.h for every non-NaN input). Returns lo in the low half. */
__device__ __forceinline__ uint32_t hw_f16x2(float lo, float hi) {
  uint32_t r;
  asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}
__device__ __forceinline__ uint32_t hw_bf16x2(float lo, float hi) {
  uint32_t r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}

/* Same-dtype move: raw bytes (R-CONVERT: same-dtype moves copy the bits). */
template <int ESIZE>
struct CopyOp {
  static constexpr int V = 16 / ESIZE;
  static constexpr int kIn = ESIZE, kOut = ESIZE;
  using InVec = uint4;
  using OutVec = uint4;
  static constexpr bool kScaled = false;
  /* measured (docs/cuda-reference.md): prefetching the next row's metadata and
   * 4 resident blocks per SM help the copy; the conversions lose from both */
  static constexpr bool kPrefetch = KVX_CUDA_COPY_PREFETCH;
  static constexpr int kMinBlocks = KVX_CUDA_COPY_MIN_BLOCKS;
  static __device__ __forceinline__ OutVec run(InVec v, float, float, uint32_t) { return v; }
};

/* In -> FP32 -> Out (F16/BF16/F32 destinations round RNE; FP8 destinations
 * quantize x/scale with saturation). NaN-carrying vectors (and FP8 on GPUs
 * without the FP8 convert instruction) take convert.h's exact software path. */
template <class In, class Out>
struct ConvOp {
  static constexpr int kIn = sizeof(typename In::S), kOut = sizeof(typename Out::S);
  static constexpr int V = 16 / (kIn > kOut ? kIn : kOut);
  using InVec = typename VecOf<V * kIn>::T;
  using OutVec = typename VecOf<V * kOut>::T;
  static constexpr bool kScaled = Out::dt == KVX_DTYPE_F8_E4M3 || Out::dt == KVX_DTYPE_F8_E5M2;
  static constexpr bool kPrefetch = false;
  static constexpr int kMinBlocks =
      !kScaled                    ? 1
      : In::dt == KVX_DTYPE_F16   ? KVX_CUDA_FP8_F16_MIN_BLOCKS
      : In::dt == KVX_DTYPE_F32   ? KVX_CUDA_FP8_F32_MIN_BLOCKS
                                  : KVX_CUDA_FP8_MIN_BLOCKS;

  /* rcp: RN(1/scale) when exact_div_range(scale) (exact_div_rcp), else 0: IEEE division. */
  static __device__ __forceinline__ OutVec run(InVec iv, float scale, float rcp, uint32_t dnan) {
    union {
      InVec v;
      typename In::S e[V];
    } a;
    union {
      OutVec v;
      typename Out::S e[V];
      uint16_t h[(V * kOut) / 2 > 0 ? (V * kOut) / 2 : 1];
      uint32_t w[(V * kOut) / 4 > 0 ? (V * kOut) / 4 : 1];
    } b;
    a.v = iv;
    float x[V];
    bool special = false;
#pragma unroll
    for (int i = 0; i < V; ++i) x[i] = In::hw_f32(a.e[i]);
    if constexpr (!kScaled) {
#pragma unroll
      for (int i = 0; i < V; ++i) special |= In::special(a.e[i]);
    }
    if constexpr (kScaled) {
      if (scale != 1.0f && rcp != 0.0f) {
        /* Reciprocal-multiply division (exact_div_rcp). Every input finite, and
         * zero or within [2^-60, 2^60) (div_ok), gives a finite quotient, so
         * that one test per input also excludes NaN; anything else takes the
         * software path (IEEE division). */
#pragma unroll
        for (int i = 0; i < V; ++i) {
          special |= !In::div_ok(a.e[i]);
          x[i] = exact_div_rcp(x[i], scale, rcp);
        }
      } else {
#pragma unroll
        for (int i = 0; i < V; ++i) special |= In::special(a.e[i]);
        if (scale != 1.0f) { /* x / 1 is x: no division for unscaled caches */
#pragma unroll
          for (int i = 0; i < V; ++i) {
            x[i] = __fdiv_rn(x[i], scale);
            special |= x[i] != x[i];
          }
        }
      }
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
#pragma unroll
      for (int i = 0; i < V; i += 2) {
        uint16_t r;
        if constexpr (Out::dt == KVX_DTYPE_F8_E4M3)
          asm("{cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;}" : "=h"(r) : "f"(x[i + 1]), "f"(x[i]));
        else
          asm("{cvt.rn.satfinite.e5m2x2.f32 %0, %1, %2;}" : "=h"(r) : "f"(x[i + 1]), "f"(x[i]));
        b.h[i / 2] = r;
      }
#else
      special = true;
#endif
    } else if constexpr (Out::dt == KVX_DTYPE_F32) {
#pragma unroll
      for (int i = 0; i < V; ++i) b.e[i] = __float_as_uint(x[i]);
    } else if constexpr (Out::dt == KVX_DTYPE_F16) {
#pragma unroll
      for (int i = 0; i < V; i += 2) b.w[i / 2] = hw_f16x2(x[i], x[i + 1]);
    } else {
#pragma unroll
      for (int i = 0; i < V; i += 2) b.w[i / 2] = hw_bf16x2(x[i], x[i + 1]);
    }
    if (special) b.v = sw_run(iv, scale, dnan);
    return b.v;
  }

  /* The exact software path of a whole chunk, out of line: rare, and kept off
   * the fast loop's registers. */
  static __device__ __noinline__ OutVec sw_run(InVec iv, float scale, uint32_t dnan) {
    union {
      InVec v;
      typename In::S e[V];
    } a;
    union {
      OutVec v;
      typename Out::S e[V];
    } b;
    a.v = iv;
#pragma unroll
    for (int i = 0; i < V; ++i) sw_encode(&b.e[i], Out::dt, In::sw_f32(a.e[i]), scale, dnan);
    return b.v;
  }
};

template <class T>
__device__ __forceinline__ T ld_vec(const char* p) {
  return *reinterpret_cast<const T*>(p);
}
template <class T>
__device__ __forceinline__ void st_vec(char* p, const T& v) {
  *reinterpret_cast<T*>(p) = v;
}

/* ------------------------------------------------------------------------ */
/* Fast path. Per job: IO head_dim contiguous, cache head_dim runs contiguous
 * in groups of grp.div chunks (HND_PACKED: pack / VEC; otherwise one group of
 * C chunks, c_outer unused), every chunk VEC-aligned (launch-time checks). */

template <class Op>
__device__ __forceinline__ long long chunk_cache_off(const Job& jb, uint32_t h, uint32_t c) {
  const uint32_t g = fdiv(c, jb.grp);
  const uint32_t w = c - g * jb.grp.div;
  return (long long)jb.cache_esize *
         ((long long)h * jb.c_head + (long long)g * jb.c_outer + (long long)w * Op::V);
}
template <class Op>
__device__ __forceinline__ long long chunk_io_off(const Job& jb, uint32_t row, uint32_t h, uint32_t c) {
  return (long long)jb.io_esize *
         ((long long)row * jb.io_token + (long long)h * jb.io_head + (long long)c * Op::V);
}

/* One warp per (job, group of TG rows): the row's cache location (slot, or the
 * gather metadata) is resolved once per lane, then the lanes sweep the row's
 * H * C chunks, kUnroll independent 16-byte loads in flight per lane. Lane l
 * takes row (l mod TG) of the group and chunks l / TG, + 32 / TG, ...: with
 * TG > 1 (HND_PACKED) neighbouring lanes move the same chunk of consecutive
 * tokens, contiguous in the cache when the tokens share a block. */
template <class Op>
__device__ __forceinline__ char* fast_row(const MoveParams& p, uint32_t task, uint32_t tasks, uint32_t groups,
                                          uint32_t ti, const Job** jbp, char** iorow) {
  if (task >= tasks) return nullptr;
  const uint32_t j = task >= groups ? 1u : 0u;
  const Job& jb = p.job[j];
  *jbp = &jb;
  const uint32_t r = ((task - j * groups) << p.lg_tg) + ti;
  Item it;
  it.job = &jb;
  it.live = r < p.row_count;
  it.row = p.row_begin + r;
  it.h = it.c = 0;
  if (!it.live) return nullptr;
  *iorow = jb.io + (long long)jb.io_esize * ((long long)it.row * jb.io_token);
  if (p.kind == KIND_WRITE) return write_cache_row(p, jb, write_slot_load(p, it));
  return gather_cache_row(p, jb, gather_meta_load(p, it));
}

/* One warp per (job, group of TG rows) task: each lane resolves its row's cache
 * location once (slot, or the gather metadata), then the lanes sweep the row's
 * H * C chunks with kUnroll independent 16-byte loads in flight per lane. Lane l
 * takes row (l mod TG) of the group and chunks l / TG, + 32 / TG, ...: with
 * TG > 1 (HND_PACKED) neighbouring lanes move the same chunk of consecutive
 * tokens, contiguous in the cache when the tokens share a block.
 * (Measured on an H100, docs/cuda-reference.md: two tasks per iteration and
 * evict-first hints were slower, FP8 and HND_PACKED most.) */
/* The first stage of fast_row alone: the metadata loads of a task's row (a
 * dead row: slot -1 / m.ok false, which resolve to no cache row). */
struct FastPre {
  GatherMeta m;
  long long slot;
  uint32_t j, row;
};
__device__ __forceinline__ FastPre fast_pre(const MoveParams& p, uint32_t task, uint32_t tasks, uint32_t groups,
                                            uint32_t ti) {
  FastPre f;
  f.m.ok = false;
  f.m.len = f.m.a = f.m.b = 0;
  f.m.t = f.m.j = f.m.off = 0;
  f.slot = -1;
  f.j = 0;
  f.row = p.row_begin;
  if (task >= tasks) return f;
  f.j = task >= groups ? 1u : 0u;
  const uint32_t r = ((task - f.j * groups) << p.lg_tg) + ti;
  Item it;
  it.job = &p.job[f.j];
  it.live = r < p.row_count;
  it.row = p.row_begin + r;
  it.h = it.c = 0;
  f.row = it.row;
  if (!it.live) return f;
  if (p.kind == KIND_WRITE)
    f.slot = write_slot_load(p, it);
  else
    f.m = gather_meta_load(p, it);
  return f;
}

template <class Op>
__global__ void __launch_bounds__(kThreads, Op::kMinBlocks) move_fast(const __grid_constant__ MoveParams p) {
  const uint32_t C = p.fd_c.div;
  const uint32_t HC = p.fd_h.div * C;
  const uint32_t groups = (p.row_count + (1u << p.lg_tg) - 1) >> p.lg_tg;
  const uint32_t tasks = groups * p.njobs;
  const uint32_t lane = threadIdx.x & 31u;
  const uint32_t ti = lane & ((1u << p.lg_tg) - 1u);
  const uint32_t q_first = lane >> p.lg_tg;
  const uint32_t q_step = 32u >> p.lg_tg;
  const uint32_t warps = gridDim.x * (kThreads / 32);
  const bool gather = p.kind != KIND_WRITE;
  /* Op::kPrefetch: the row metadata of the warp's next task (slot, or sequence
   * length and table entry) is loaded while the current task moves its data. */
  uint32_t task = blockIdx.x * (kThreads / 32) + (threadIdx.x >> 5);
  FastPre pre;
  if constexpr (Op::kPrefetch) pre = fast_pre(p, task, tasks, groups, ti);
  for (; task < tasks; task += warps) {
    const Job* jb = &p.job[0];
    char* iorow = nullptr;
    char* crow;
    if constexpr (Op::kPrefetch) {
      const FastPre cur = pre;
      pre = fast_pre(p, task + warps, tasks, groups, ti);
      jb = &p.job[cur.j];
      iorow = jb->io + (long long)jb->io_esize * ((long long)cur.row * jb->io_token);
      crow = gather ? gather_cache_row(p, *jb, cur.m) : write_cache_row(p, *jb, cur.slot);
    } else {
      crow = fast_row<Op>(p, task, tasks, groups, ti, &jb, &iorow);
    }
    if (!crow) continue; /* no barrier or shuffle below */
    /* FP8: a per-tensor scale and its reciprocal once per task */
    float s_task = 1.0f, r_task = 0.0f;
    if constexpr (Op::kScaled) {
      if (jb->scale_kind != SCALE_HEAD) {
        s_task = load_scale(p, *jb, 0);
        r_task = s_task != 1.0f && exact_div_range(s_task) ? __frcp_rn(s_task) : 0.0f;
      }
    }
    for (uint32_t q0 = q_first; q0 < HC; q0 += q_step * kUnroll) {
      typename Op::InVec v[kUnroll];
      char* dst[kUnroll];
      uint32_t hh[kUnroll];
#pragma unroll
      for (int k = 0; k < kUnroll; ++k) {
        const uint32_t q = q0 + k * q_step;
        dst[k] = nullptr;
        if (q < HC) {
          const uint32_t h = fdiv(q, p.fd_c);
          const uint32_t c = q - h * C;
          hh[k] = h;
          char* cp = crow + chunk_cache_off<Op>(*jb, h, c);
          char* ip = iorow + (long long)jb->io_esize * ((long long)h * jb->io_head + (long long)c * Op::V);
          if (gather) {
            v[k] = ld_vec<typename Op::InVec>(cp);
            dst[k] = ip;
          } else {
            v[k] = ld_vec<typename Op::InVec>(ip);
            dst[k] = cp;
          }
        }
      }
#pragma unroll
      for (int k = 0; k < kUnroll; ++k) {
        if (dst[k]) {
          float s = s_task, r = r_task;
          if (Op::kScaled && jb->scale_kind == SCALE_HEAD) {
            s = load_scale(p, *jb, hh[k]);
            r = s != 1.0f && exact_div_range(s) ? __frcp_rn(s) : 0.0f;
          }
          st_vec<typename Op::OutVec>(dst[k], Op::run(v[k], s, r, p.default_nan));
        }
      }
    }
  }
}

/* ------------------------------------------------------------------------ */
/* General path: one element per item, any strides and dtypes. */

__device__ __forceinline__ long long elem_cache_off(const Job& jb, uint32_t h, uint32_t d) {
  const uint32_t g = fdiv(d, jb.grp); /* grp = pack */
  const uint32_t w = d - g * jb.grp.div;
  return (long long)jb.cache_esize * ((long long)h * jb.c_head + (long long)g * jb.c_outer + (long long)w * jb.c_inner);
}
__device__ __forceinline__ long long elem_io_off(const Job& jb, uint32_t row, uint32_t h, uint32_t d) {
  return (long long)jb.io_esize * ((long long)row * jb.io_token + (long long)h * jb.io_head + (long long)d * jb.io_dim);
}

__device__ __forceinline__ uint32_t ld_raw(const char* p, int esize, int bytewise) {
  if (bytewise) return (uint32_t)ld_bytes(p, esize);
  if (esize == 4) return *(const uint32_t*)p;
  if (esize == 2) return *(const uint16_t*)p;
  return *(const uint8_t*)p;
}
__device__ __forceinline__ void st_raw(char* p, int esize, uint32_t v, int bytewise) {
  if (bytewise) {
    for (int i = 0; i < esize; ++i) p[i] = (char)(v >> (8 * i));
  } else if (esize == 4) {
    *(uint32_t*)p = v;
  } else if (esize == 2) {
    *(uint16_t*)p = (uint16_t)v;
  } else {
    *(uint8_t*)p = (uint8_t)v;
  }
}

/* src dtype -> dst dtype of one element (raw bits in and out), R-CONVERT / R-FP8. */
__device__ __forceinline__ uint32_t convert_elem(uint32_t bits, int src, int dst, float scale, uint32_t dnan) {
  if (src == dst) return bits;
  float x;
  switch (src) {
    case KVX_DTYPE_F16: x = kvx_ref::f16_to_f32((uint16_t)bits); break;
    case KVX_DTYPE_BF16: x = kvx_ref::bf16_to_f32((uint16_t)bits); break;
    default: x = __uint_as_float(bits); break;
  }
  uint32_t out = 0;
  sw_encode(&out, dst, x, scale, dnan);
  return out; /* little-endian: the low bytes hold the element */
}

template <class Op>
cudaError_t launch_fast_op(const MoveParams& p, cudaStream_t stream) {
  /* one warp per (job, row group) task */
  const unsigned long long tasks = ((unsigned long long)p.row_count + (1u << p.lg_tg) - 1) >> p.lg_tg;
  const int grid = grid_for_warps((const void*)move_fast<Op>, tasks * p.njobs);
  move_fast<Op><<<grid, kThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace kvx_cuda

#endif /* KVX_CUDA_MOVE_KERNELS_CUH */
