/*
 * move_kernels.cuh -- the two kernel templates over move.cuh:
 *   move_fast<Op>:  16-byte chunks, one Op per (source dtype, destination dtype),
 *                   for tensors whose head_dim runs are contiguous and aligned;
 *                   one warp per task (a row group, K and V together for large
 *                   calls), Op::kUnroll chunk loads in flight per lane;
 *   move_general:   one element per item, any strides, dtypes read at run time
 *                   (a grid-stride loop, kUnroll items per thread in flight).
 * HND_PACKED same-dtype moves with 16-byte pack groups take move_packed.cu's
 * shared-memory tiles instead. Included by the launch translation units only.
 */
#ifndef KVX_CUDA_MOVE_KERNELS_CUH
#define KVX_CUDA_MOVE_KERNELS_CUH

#include <string.h>

#include "move.cuh"

namespace kvx_cuda {

/* Tuning knobs. The defaults were measured on an H100 (docs/cuda-reference.md,
 * "Performance"); every alternative named here was measured and lost. */
#ifndef KVX_CUDA_COPY_PREFETCH
#define KVX_CUDA_COPY_PREFETCH 1 /* same-dtype copy: load the next task's metadata early */
#endif
#ifndef KVX_CUDA_COPY_MIN_BLOCKS
#define KVX_CUDA_COPY_MIN_BLOCKS 2 /* at most 128 registers, two 256-thread blocks per SM (126, no spill; uncapped \
                                       the small-call split took it to 129 and one block per SM: -15 to -25 points; \
                                       capped at 80 it spills: -30 points) */
#endif
#ifndef KVX_CUDA_FUSE_KV
#define KVX_CUDA_FUSE_KV 1 /* copy: one task moves K and V of its rows (metadata resolved once) */
#endif
#ifndef KVX_CUDA_COPY_UNROLL
#define KVX_CUDA_COPY_UNROLL 8 /* copy: 16-byte loads in flight per lane (4: -13 points) */
#endif
#ifndef KVX_CUDA_SMALL_LANE_CHUNKS
#define KVX_CUDA_SMALL_LANE_CHUNKS 4 /* small calls: at most this many 16-byte chunks per lane per task */
#endif
#ifndef KVX_CUDA_CONV_FUSE
#define KVX_CUDA_CONV_FUSE 1 /* F16/BF16/F32 conversions: K and V in one task */
#endif
#ifndef KVX_CUDA_CONV_UNROLL
#define KVX_CUDA_CONV_UNROLL 4
#endif
#ifndef KVX_CUDA_CONV_PREFETCH
#define KVX_CUDA_CONV_PREFETCH 0
#endif
#ifndef KVX_CUDA_FP8_FUSE
#define KVX_CUDA_FP8_FUSE 0 /* FP8 quantization: K and V in separate tasks (fused: -6 to -25 points) */
#endif
#ifndef KVX_CUDA_FP8_UNROLL
#define KVX_CUDA_FP8_UNROLL 2 /* with 128-thread blocks, 53-55 registers (4: -1 to -3 points; 8: -8 to -20) */
#endif
#ifndef KVX_CUDA_FP8_RESIDENT
#define KVX_CUDA_FP8_RESIDENT 1 /* FP8: a resident grid (the planner's tasks per warp: -4 to -14 points) */
#endif
#ifndef KVX_CUDA_FP8_PREFETCH
#define KVX_CUDA_FP8_PREFETCH 0 /* (1: -9 to -28 points, registers) */
#endif
#ifndef KVX_CUDA_FP8_PACKED_CHECK
#define KVX_CUDA_FP8_PACKED_CHECK 1 /* range tests of F16/BF16 pairs with 16x2 max/min (off: -0.4 to -1.6 points) */
#endif
#ifndef KVX_CUDA_FP8_BF16_SCALE_BOUND
#define KVX_CUDA_FP8_BF16_SCALE_BOUND 1 /* BF16 -> FP8 with |scale| >= 2^-40: the range test's upper bound only */
#endif
#ifndef KVX_CUDA_FP8_BLOCK
#define KVX_CUDA_FP8_BLOCK 128 /* FP8 threads per block (256: BF16 -4 to -6 points, finer occupancy steps) */
#endif
#ifndef KVX_CUDA_FP8_F16_MIN_BLOCKS
#define KVX_CUDA_FP8_F16_MIN_BLOCKS 1 /* F16 -> FP8: no register cap */
#endif
#ifndef KVX_CUDA_FP8_F32_MIN_BLOCKS
#define KVX_CUDA_FP8_F32_MIN_BLOCKS 1 /* F32 -> FP8 */
#endif
#ifndef KVX_CUDA_FP8_MIN_BLOCKS
#define KVX_CUDA_FP8_MIN_BLOCKS 1 /* BF16 -> FP8 (capped at 64 with 4 loads in flight: -6 to -8 points) */
#endif

#ifndef KVX_CUDA_ROWS
#define KVX_CUDA_ROWS 1 /* large calls moving K and V with one copy (or F16 <-> BF16), NHD/HND caches: \
                           move_rows (where the planner sets p.rows, cuda_backend.cu) */
#endif
#ifndef KVX_CUDA_ROWS_UNROLL
#define KVX_CUDA_ROWS_UNROLL 8 /* move_rows: 16-byte loads in flight per lane */
#endif
#ifndef KVX_CUDA_ROWS_MIN_BLOCKS
#define KVX_CUDA_ROWS_MIN_BLOCKS 4 /* move_rows: at most 64 registers, four 256-thread blocks per SM */
#endif
#ifndef KVX_CUDA_ROWS_GATHER_CS
#define KVX_CUDA_ROWS_GATHER_CS 0 /* move_rows: a gather's output stores marked streaming (st.global.cs; \
                                     H200: -0.5 to -1.5 points) */
#endif
#ifndef KVX_CUDA_ROWS_WRITE_CS
#define KVX_CUDA_ROWS_WRITE_CS 0 /* move_rows: an unscaled write's cache stores marked streaming (H200: 0 to -1) */
#endif
#ifndef KVX_CUDA_ROWS_FP8_CS
#define KVX_CUDA_ROWS_FP8_CS 1 /* move_rows: an FP8 write's cache stores marked streaming (H200: +2.7 to +3 \
                                  points, docs/cuda-reference.md, "Twenty-fifth round") */
#endif
#ifndef KVX_CUDA_ROWS_FP8
#define KVX_CUDA_ROWS_FP8 1 /* large FP8 quantizing writes into NHD/HND caches: move_rows too (where the planner \
                               sets p.rows) */
#endif
#ifndef KVX_CUDA_ROWS_FP8_UNROLL
#define KVX_CUDA_ROWS_FP8_UNROLL 2 /* (4 loads in flight and four blocks per SM: -5 to -6 points on an H200) */
#endif
#ifndef KVX_CUDA_ROWS_FP8_MIN_BLOCKS
#define KVX_CUDA_ROWS_FP8_MIN_BLOCKS 6 /* at most 40 registers, six blocks per SM (4: -10 points; 5, no spill: \
                                          -1 to -3 from F16 / BF16, "Twenty-fifth round") */
#endif

/* ------------------------------------------------------------------------ */
/* Vector storage of N bytes. */
template <int N> struct VecOf;
template <> struct VecOf<2> { using T = uint16_t; };
template <> struct VecOf<4> { using T = uint32_t; };
template <> struct VecOf<8> { using T = uint2; };
template <> struct VecOf<16> { using T = uint4; };

/* The largest magnitude of each 16-bit half position over n words (16x2 unsigned max of
 * the words with their sign bits cleared): the range and NaN tests of 16-bit inputs below. */
__device__ __forceinline__ uint32_t max_mag16x2(const uint32_t* w, int n) {
  uint32_t mx = 0;
  for (int i = 0; i < n; ++i) mx = __vmaxu2(mx, w[i] & 0x7FFF7FFFu);
  return mx;
}

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
  /* special() of either half of any of n words: the largest magnitude is a NaN */
  static __device__ __forceinline__ bool special_words(const uint32_t* w, int n) {
    return __vmaxu2(max_mag16x2(w, n), 0x7C007C00u) != 0x7C007C00u;
  }
  static __device__ __forceinline__ float sw_f32(S v) { return kvx_ref::f16_to_f32(v); }
  /* finite: zero or within [2^-24, 65504], inside exact_div_range */
  static __device__ __forceinline__ bool div_ok(S v) { return (v & 0x7FFFu) < 0x7C00u; }
  /* div_ok of both halves of each of n words: the largest magnitude is finite */
  static __device__ __forceinline__ bool div_ok_words(const uint32_t* w, int n) {
    return __vmaxu2(max_mag16x2(w, n), 0x7BFF7BFFu) == 0x7BFF7BFFu;
  }
};
struct TBF16 {
  using S = uint16_t;
  static constexpr kvx_dtype_t dt = KVX_DTYPE_BF16;
  static __device__ __forceinline__ float hw_f32(S v) { return __uint_as_float((uint32_t)v << 16); }
  static __device__ __forceinline__ bool special(S v) { return (v & 0x7FFFu) > 0x7F80u; }
  static __device__ __forceinline__ bool special_words(const uint32_t* w, int n) {
    return __vmaxu2(max_mag16x2(w, n), 0x7F807F80u) != 0x7F807F80u;
  }
  static __device__ __forceinline__ float sw_f32(S v) { return kvx_ref::bf16_to_f32(v); }
  /* zero, or |v| in [2^-60, 2^60) (exact_div_range on the widened bits) */
  static __device__ __forceinline__ bool div_ok(S v) {
    const uint32_t a = v & 0x7FFFu;
    return a == 0 || (uint32_t)(a - 0x2180u) < 0x3C00u;
  }
  /* div_ok of both halves of each of n words: every magnitude a below 0x5D80,
   * and every nonzero one at or above 0x2180. Per half, a + 0x7FFF read as a
   * signed 16-bit value is a - 0x8001 for a >= 1 and +0x7FFF for a zero (no
   * carry crosses halves since a < 0x8000), so its signed min is at least
   * 0x2180 - 0x8001 (0xA17F) exactly when every nonzero a is at least 0x2180. */
  static __device__ __forceinline__ bool div_ok_words(const uint32_t* w, int n) {
    uint32_t mx = 0, mn = 0x7FFF7FFFu;
    for (int i = 0; i < n; ++i) {
      const uint32_t a = w[i] & 0x7FFF7FFFu;
      mx = __vmaxu2(mx, a);
      mn = __vmins2(mn, a + 0x7FFF7FFFu);
    }
    return __vmaxu2(mx, 0x5D7F5D7Fu) == 0x5D7F5D7Fu && __vmins2(mn, 0xA17FA17Fu) == 0xA17FA17Fu;
  }
  /* The upper bound alone (every magnitude below 2^60), which is enough for an FP8
   * quantization whose |scale| is at least 2^-40 (scale_big): a nonzero |x| below
   * 2^-60 then has |x / scale| < 2^-20, and the reciprocal-multiply quotient stays
   * below 2^-19 with x's sign, so both give the FP8 zero of x's sign
   * (fp_identities_check.cpp part 4, every such BF16 x). */
  static __device__ __forceinline__ bool div_hi_words(const uint32_t* w, int n) {
    return __vmaxu2(max_mag16x2(w, n), 0x5D7F5D7Fu) == 0x5D7F5D7Fu;
  }
  static __device__ __forceinline__ bool scale_big(float s) { return (__float_as_uint(s) & 0x7FFFFFFFu) >= 0x2B800000u; }
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
  static constexpr int kUnroll = KVX_CUDA_COPY_UNROLL;
  static constexpr bool kFuse = KVX_CUDA_FUSE_KV;
  static constexpr bool kResident = false;
  static constexpr int kBlock = kThreads;
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
  static constexpr bool kPrefetch = kScaled ? KVX_CUDA_FP8_PREFETCH : KVX_CUDA_CONV_PREFETCH;
  static constexpr int kUnroll = kScaled ? KVX_CUDA_FP8_UNROLL : KVX_CUDA_CONV_UNROLL;
  static constexpr bool kFuse = kScaled ? KVX_CUDA_FP8_FUSE : KVX_CUDA_CONV_FUSE;
  static constexpr bool kResident = kScaled && KVX_CUDA_FP8_RESIDENT; /* measured */
  static constexpr int kBlock = kScaled ? KVX_CUDA_FP8_BLOCK : kThreads; /* threads per block */
  static constexpr int kMinBlocks =
      !kScaled                    ? 1
      : In::dt == KVX_DTYPE_F16   ? KVX_CUDA_FP8_F16_MIN_BLOCKS
      : In::dt == KVX_DTYPE_F32   ? KVX_CUDA_FP8_F32_MIN_BLOCKS
                                  : KVX_CUDA_FP8_MIN_BLOCKS;

  /* rcp: fp8_rcp(scale) (move.cuh), 0: IEEE division. kNanWords: an unscaled FP8
   * quantization of 16-bit inputs tests them for NaN two at a time (special_words);
   * false: one at a time (the FP8 tile kernel, whose register allocation the word test
   * changes: 64 registers to 71, a block per SM fewer). */
  template <bool kNanWords = true>
  static __device__ __forceinline__ OutVec run(InVec iv, float scale, float rcp, uint32_t dnan) {
    union {
      InVec v;
      typename In::S e[V];
      uint32_t w[(V * kIn) / 4 > 0 ? (V * kIn) / 4 : 1];
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
        /* Reciprocal-multiply division (fp8_div). Every input finite, and
         * zero or within [2^-60, 2^60) (div_ok), gives a finite quotient, so
         * that one test per input also excludes NaN; anything else takes the
         * software path (IEEE division). */
        if constexpr (KVX_CUDA_FP8_PACKED_CHECK && kIn == 2 && (V * kIn) % 4 == 0) {
          if constexpr (In::dt == KVX_DTYPE_BF16 && KVX_CUDA_FP8_BF16_SCALE_BOUND)
            special = In::scale_big(scale) ? !In::div_hi_words(a.w, (V * kIn) / 4) : !In::div_ok_words(a.w, (V * kIn) / 4);
          else
            special = !In::div_ok_words(a.w, (V * kIn) / 4);
        } else {
#pragma unroll
          for (int i = 0; i < V; ++i) special |= !In::div_ok(a.e[i]);
        }
#pragma unroll
        for (int i = 0; i < V; ++i) x[i] = fp8_div(x[i], scale, rcp);
      } else {
        if constexpr (kNanWords && KVX_CUDA_FP8_PACKED_CHECK && kIn == 2 && (V * kIn) % 4 == 0) {
          special = In::special_words(a.w, (V * kIn) / 4);
        } else {
#pragma unroll
          for (int i = 0; i < V; ++i) special |= In::special(a.e[i]);
        }
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
/* The same store marked streaming (st.global.cs: evict first from L1 and L2). */
template <class T>
__device__ __forceinline__ void st_vec_cs(char* p, const T& v) {
  __stcs(reinterpret_cast<T*>(p), v);
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

/* Row metadata of one task (first stage, independent loads): the write's slot,
 * or the gather's sequence length and table entry (m[1]: the V half of a
 * KV_OFFSETS table when the task moves K and V). A dead row resolves to no
 * cache row (slot -1, m.ok false). */
struct FastPre {
  GatherMeta m[2];
  long long slot;
  uint32_t j, row;
};
__device__ __forceinline__ FastPre fast_pre(const MoveParams& p, uint32_t task, uint32_t tasks, uint32_t groups,
                                            uint32_t ti, bool fused, bool gather) {
  FastPre f;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    f.m[i].ok = false;
    f.m[i].len = f.m[i].a = f.m[i].b = 0;
    f.m[i].t = f.m[i].j = f.m[i].off = 0;
  }
  f.slot = -1;
  f.j = 0;
  f.row = p.row_begin;
  if (task >= tasks) return f;
  f.j = !fused && task >= groups ? 1u : 0u;
  const uint32_t r = ((task - f.j * groups) << p.lg_tg) + ti;
  Item it;
  it.job = &p.job[f.j];
  it.live = r < p.row_count;
  it.row = p.row_begin + r;
  it.h = it.c = 0;
  f.row = it.row;
  if (!it.live) return f;
  if (!gather) {
    f.slot = write_slot_load(p, it);
  } else {
    f.m[0] = gather_meta_load(p, it);
    f.m[1] = f.m[0];
    if (fused && p.kind == KIND_KV_OFFSETS) {
      it.job = &p.job[1];
      f.m[1] = gather_meta_load(p, it);
    }
  }
  return f;
}

/* Per-head FP8 scales and their reciprocals, computed once per block into
 * shared memory (up to kScaleTable heads per job). */
constexpr int kScaleTable = 128;

/* One warp per task. A task is a group of TG rows (TG = 2^lg_tg: 1, or the
 * HND_PACKED token group) and, when the launch moves K and V with one Op that
 * fuses them (Op::kFuse) and the call is large (p.fuse), both of them: the
 * rows' cache locations (slot, or the gather metadata) are resolved once per
 * lane, then the lanes sweep the task's chunks (2 x H x C when fused),
 * Op::kUnroll independent 16-byte loads in flight per lane, then convert and
 * store. Lane l takes row (l mod TG) of
 * the group and chunks l / TG, + 32 / TG, ...: with TG > 1 (HND_PACKED)
 * neighbouring lanes move the same chunk of consecutive tokens, contiguous in
 * the cache when the tokens share a block. Op::kPrefetch loads the next task's
 * metadata while the current task moves its data. A warp takes p.tpw tasks
 * (whole grid: one or a few tasks per warp) or, p.tpw 0 (FP8, 1-byte rows),
 * strides over all tasks from a resident grid. */
template <class Op>
__global__ void __launch_bounds__(Op::kBlock, Op::kMinBlocks) move_fast(const __grid_constant__ MoveParams p) {
  dependent_entry();
  constexpr int U = Op::kUnroll;
  const uint32_t C = p.fd_c.div;
  const uint32_t HC = p.fd_h.div * C;
  const uint32_t groups = (p.row_count + (1u << p.lg_tg) - 1) >> p.lg_tg;
  const bool fused = Op::kFuse && p.njobs == 2 && p.fuse;
  /* 2^lgs warps share a task's chunks (small calls; FP8 kernels never split, so they
   * carry none of it: 2-8 more registers cost them occupancy) */
  const uint32_t lgs = Op::kScaled ? 0u : p.lg_split;
  const uint32_t rtasks = fused ? groups : groups * p.njobs;
  const uint32_t tasks = rtasks << lgs;
  const uint32_t span_all = fused ? 2 * HC : HC; /* chunks per row of one task */
  const uint32_t slice = (span_all + (1u << lgs) - 1) >> lgs;
  const uint32_t lane = threadIdx.x & 31u;
  const uint32_t ti = lane & ((1u << p.lg_tg) - 1u);
  const uint32_t q_first = lane >> p.lg_tg;
  const uint32_t q_step = 32u >> p.lg_tg;
  /* FP8 destinations exist on write only (R-CONVERT): those kernels carry no gather code */
  const bool gather = !Op::kScaled && p.kind != KIND_WRITE;

  /* Which tasks this warp takes: p.tpw tasks (block b takes tasks
   * [8 T b, 8 T (b + 1)), warp w of it w, w + 8, ...), or with p.tpw 0 a
   * grid-stride sweep of a resident grid (launch_fast_op). */
  const uint32_t wib = threadIdx.x >> 5, wpb = blockDim.x >> 5; /* warps per block: Op::kBlock / 32, or fewer
                                                                    for a small call (launch_threads) */
  uint32_t task, step, limit;
  if (p.tpw == 0) {
    task = blockIdx.x * wpb + wib;
    step = gridDim.x * wpb;
    limit = tasks;
  } else {
    const uint32_t base = blockIdx.x * wpb * p.tpw;
    task = base + wib;
    step = wpb;
    limit = min(tasks, base + wpb * p.tpw);
  }

  /* FP8 (always a resident grid): every (job, head) scale and its reciprocal
   * once per block, in shared memory (up to kScaleTable heads; beyond, per
   * chunk), so no chunk computes a reciprocal. */
  bool table = false;
  __shared__ float2 sh_scale[Op::kScaled ? 2 * kScaleTable : 1];
  if constexpr (Op::kScaled) {
    table = p.tpw == 0 && p.fd_h.div <= (uint32_t)kScaleTable;
    if (table) { /* uniform over the block */
      for (uint32_t i = threadIdx.x; i < 2 * p.fd_h.div; i += blockDim.x) {
        const uint32_t j = i >= p.fd_h.div ? 1u : 0u, h = i - j * p.fd_h.div;
        const float sc = load_scale(p, p.job[j], h);
        sh_scale[j * kScaleTable + h] = make_float2(sc, fp8_rcp(sc));
      }
      __syncthreads();
    }
  }

  /* the row task of warp task t (rtasks: none) */
  auto rtask = [&](uint32_t t) { return t < limit ? t >> lgs : rtasks; };
  FastPre pre;
  if constexpr (Op::kPrefetch) pre = fast_pre(p, rtask(task), rtasks, groups, ti, fused, gather);
  for (; task < limit; task += step) {
    FastPre cur;
    if constexpr (Op::kPrefetch) {
      cur = pre;
      pre = fast_pre(p, rtask(task + step), rtasks, groups, ti, fused, gather);
    } else {
      cur = fast_pre(p, rtask(task), rtasks, groups, ti, fused, gather);
    }
    /* this warp's chunks of the task: [q_lo, span) */
    const uint32_t q_lo = (task & ((1u << lgs) - 1u)) * slice;
    const uint32_t span = min(span_all, q_lo + slice);
    /* the task's rows: job cur.j, or jobs 0 and 1 when fused */
    const uint32_t j0 = cur.j; /* uniform over the warp */
    char* crow[2] = {nullptr, nullptr};
    char* iorow[2];
    {
      const Job& jb = p.job[j0];
      iorow[0] = jb.io + (long long)jb.io_esize * ((long long)cur.row * jb.io_token);
      crow[0] = gather ? gather_cache_row(p, jb, cur.m[0]) : write_cache_row(p, jb, cur.slot);
    }
    if (fused) {
      const Job& jb = p.job[1];
      iorow[1] = jb.io + (long long)jb.io_esize * ((long long)cur.row * jb.io_token);
      crow[1] = gather ? gather_cache_row(p, jb, cur.m[1]) : write_cache_row(p, jb, cur.slot);
    }
    if (!crow[0] && !crow[1]) continue; /* no barrier or shuffle below */
    for (uint32_t base = q_lo; base < span; base += q_step * U) {
      typename Op::InVec v[U];
      char* dst[U];
      uint32_t hj[U]; /* head + kScaleTable * job */
#pragma unroll
      for (int k = 0; k < U; ++k) {
        uint32_t q = base + q_first + k * q_step;
        dst[k] = nullptr;
        hj[k] = 0;
        if (q < span) {
          const uint32_t jj = q >= HC ? 1u : 0u; /* fused: the V half */
          q -= jj * HC;
          const uint32_t j = fused ? jj : j0;
          const Job& jb = p.job[j];
          const uint32_t h = fdiv(q, p.fd_c);
          const uint32_t c = q - h * C;
          hj[k] = h + j * kScaleTable;
          char* row = jj ? crow[1] : crow[0];
          if (row) {
            char* cp = row + chunk_cache_off<Op>(jb, h, c);
            char* ip = (jj ? iorow[1] : iorow[0]) +
                       (long long)jb.io_esize * ((long long)h * jb.io_head + (long long)c * Op::V);
            if (gather) {
              v[k] = ld_vec<typename Op::InVec>(cp);
            } else {
              v[k] = ld_vec<typename Op::InVec>(ip);
            }
            dst[k] = gather ? ip : cp;
          }
        }
      }
#pragma unroll
      for (int k = 0; k < U; ++k) {
        float s = 1.0f, r = 0.0f;
        if constexpr (Op::kScaled) {
          if (table) {
            if (dst[k]) {
              const float2 sr = sh_scale[hj[k]];
              s = sr.x;
              r = sr.y;
            }
          } else if (dst[k]) {
            const uint32_t j = hj[k] >= (uint32_t)kScaleTable ? 1u : 0u;
            s = load_scale(p, p.job[j], hj[k] - j * kScaleTable);
            r = fp8_rcp(s);
          }
        }
        if (dst[k]) st_vec<typename Op::OutVec>(dst[k], Op::run(v[k], s, r, p.default_nan));
      }
    }
  }
}

/* ------------------------------------------------------------------------ */
/* Large calls that move K and V with one Op into or out of NHD/HND caches (one
 * contiguous run of head_dim per head, no pack groups): the lean form of
 * move_fast. One task per warp (TG rows, K and V), the whole grid launched; each
 * lane resolves its row's two cache rows once, then sweeps the task's chunks U
 * loads at a time. No per-chunk pointer is kept across the loads (the store
 * recomputes its address from the chunk index) and no next task is prefetched,
 * so the kernel fits MINB blocks of 256 threads per SM: on a device with more
 * DRAM bandwidth per SM the bytes in flight come from more warps, not from more
 * tasks per warp (docs/cuda-reference.md, "Ninth round"). FP8 destinations (write
 * only): per-head scales and reciprocals in a per-block table. EARLY (unscaled writes over
 * the IO rows, p.early: rows_write_early_for): the IO loads are issued before the slot
 * arrives and the cache rows resolved between the loads and the stores ("Twentieth round"). */
template <class Op, int U, int MINB, bool EARLY = false, bool AFFINE = false>
__global__ void __launch_bounds__(kThreads, MINB) move_rows(const __grid_constant__ MoveParams p) {
  dependent_entry();
  __shared__ float2 sh_scale[Op::kScaled ? 2 * kScaleTable : 1];
  const uint32_t H = p.fd_h.div;
  if constexpr (Op::kScaled) {
    if (H <= (uint32_t)kScaleTable) { /* uniform over the block, before any thread leaves */
      for (uint32_t i = threadIdx.x; i < 2 * H; i += blockDim.x) {
        const uint32_t j = i >= H ? 1u : 0u, h = i - j * H;
        const float sc = load_scale(p, p.job[j], h);
        sh_scale[j * kScaleTable + h] = make_float2(sc, fp8_rcp(sc));
      }
      __syncthreads();
    }
  }
  const uint32_t lane = threadIdx.x & 31u;
  const uint32_t task = blockIdx.x * (kThreads / 32u) + (threadIdx.x >> 5);
  /* lane's row, or (an inverted write, p.inv: move_invert.cu) lane's cache slot */
  const uint32_t r = (task << p.lg_tg) + (lane & ((1u << p.lg_tg) - 1u));
  const bool inverted = !EARLY && p.inv != nullptr;
  if (inverted ? r >= p.num_slots : r >= p.row_count) return; /* no barrier or shuffle below */
  const bool gather = !EARLY && !Op::kScaled && p.kind != KIND_WRITE;
  Item it;
  it.job = &p.job[0];
  it.live = true;
  it.row = p.row_begin + r;
  it.h = it.c = 0;
  char* crow0;
  char* crow1;
  if (gather) {
    const GatherMeta m0 = gather_meta_load(p, it);
    GatherMeta m1 = m0;
    if (p.kind == KIND_KV_OFFSETS) {
      it.job = &p.job[1];
      m1 = gather_meta_load(p, it);
    }
    crow0 = gather_cache_row(p, p.job[0], m0);
    crow1 = gather_cache_row(p, p.job[1], m1);
  } else if (inverted) {
    /* slot r, written by IO row inv[r] (row_begin 0), or by none */
    const int row = inv_row_of(p, r);
    if (row < 0) return;
    it.row = (uint32_t)row;
    crow0 = write_cache_row(p, p.job[0], (long long)r);
    crow1 = write_cache_row(p, p.job[1], (long long)r);
  } else if (EARLY) {
    /* a write over the IO rows (p.early): its IO loads do not wait for the slot, which is
     * resolved after they are issued; a row whose slot is invalid has been read for nothing */
    crow0 = crow1 = nullptr;
  } else {
    const long long slot = write_slot_load(p, it);
    crow0 = write_cache_row(p, p.job[0], slot);
    crow1 = write_cache_row(p, p.job[1], slot);
  }
  const long long early_slot = EARLY ? write_slot_load(p, it) : 0;
  if (!EARLY && !crow0 && !crow1) return;
  char* const io0 = p.job[0].io + (long long)p.job[0].io_esize * ((long long)it.row * p.job[0].io_token);
  char* const io1 = p.job[1].io + (long long)p.job[1].io_esize * ((long long)it.row * p.job[1].io_token);
  const uint32_t C = p.fd_c.div, HC = H * C, span = 2 * HC;
  const uint32_t q_step = 32u >> p.lg_tg;
  /* chunk q of the task: its job (the V half from HC on), head and chunk; the byte offsets
   * of its cache and IO vectors within their rows (rows_ok: they fit 32 bits,
   * row_offsets_fit32). The load loop and the store loop below each call it: recomputing
   * is what keeps no per-chunk offset alive across the loads (folding both loops' checks
   * into one helper that returns pointers compiled to 40 more instructions: not taken). */
  auto where = [&](uint32_t q, uint32_t& jj, uint32_t& h, uint32_t& coff, uint32_t& ioff) {
    jj = q >= HC ? 1u : 0u;
    q -= jj * HC;
    h = fdiv(q, p.fd_c);
    const uint32_t c = q - h * C;
    const Job& jb = jj ? p.job[1] : p.job[0];
    coff = h * (uint32_t)(jb.c_head * jb.cache_esize) + c * (uint32_t)(Op::V * Op::kOut);
    ioff = h * (uint32_t)(jb.io_head * jb.io_esize) + c * (uint32_t)(Op::V * Op::kIn);
  };
  if constexpr (Op::kScaled && AFFINE) {
    /* FP8 writes of one row per task whose heads' chunk count C divides the warp (32 % C == 0) and
     * whose K and V halves are whole multiples of 32 chunks (HC % 32 == 0; the launch checked
     * rows_fp8_affine_for, cuda/tuning.h): a lane's chunk q = lane + 32 k of a half stays at chunk
     * lane % C of its heads, its head steps by 32 / C, so the offsets step by constants and the
     * per-tensor scales are read once, not per chunk through a division (`where`). Instruction
     * issue bounds these writes on an H200 ("Twenty-sixth round"); the chunks, values and stores
     * are those of the loop below. */
    const uint32_t hl = lane / C, cl = lane - hl * C, hstep = 32u / C, steps = HC / 32u;
#pragma unroll
    for (int jj = 0; jj < 2; ++jj) { /* unrolled: no dynamic index into the two rows */
      char* cp = jj ? crow1 : crow0;
      if (!cp) continue;
      const Job& jb = p.job[jj];
      const float s = load_scale(p, jb, 0); /* per tensor, or 1 (rows_fp8_affine_for: no per-head scales) */
      const float rc = fp8_rcp(s);
      const uint32_t chb = (uint32_t)(jb.c_head * jb.cache_esize), ihb = (uint32_t)(jb.io_head * jb.io_esize);
      cp += hl * chb + cl * (uint32_t)(Op::V * Op::kOut);
      const char* ip = (jj ? io1 : io0) + hl * ihb + cl * (uint32_t)(Op::V * Op::kIn);
      const uint32_t cstep = hstep * chb, istep = hstep * ihb;
#pragma unroll 1
      for (uint32_t k = 0; k < steps; k += U) {
        typename Op::InVec v[U];
#pragma unroll
        for (int u = 0; u < U; ++u)
          if (k + u < steps) v[u] = ld_vec<typename Op::InVec>(ip + u * istep);
#pragma unroll
        for (int u = 0; u < U; ++u) {
          if (k + u < steps) {
            const typename Op::OutVec out = Op::run(v[u], s, rc, p.default_nan);
            if (KVX_CUDA_ROWS_FP8_CS)
              st_vec_cs<typename Op::OutVec>(cp + u * cstep, out);
            else
              st_vec<typename Op::OutVec>(cp + u * cstep, out);
          }
        }
        cp += U * cstep;
        ip += U * istep;
      }
    }
  } else { /* the general loop */
    for (uint32_t base = lane >> p.lg_tg; base < span; base += q_step * U) {
      typename Op::InVec v[U];
#pragma unroll
      for (int k = 0; k < U; ++k) {
        const uint32_t q = base + k * q_step;
        if (q < span) {
          uint32_t jj, h, coff, ioff;
          where(q, jj, h, coff, ioff);
          const char* crow = jj ? crow1 : crow0;
          if (EARLY || crow) v[k] = ld_vec<typename Op::InVec>(gather ? crow + coff : (jj ? io1 : io0) + ioff);
        }
      }
      if (EARLY) {
        crow0 = write_cache_row(p, p.job[0], early_slot);
        crow1 = write_cache_row(p, p.job[1], early_slot);
        if (!crow0 && !crow1) return;
      }
#pragma unroll
      for (int k = 0; k < U; ++k) {
        const uint32_t q = base + k * q_step;
        if (q < span) {
          uint32_t jj, h, coff, ioff;
          where(q, jj, h, coff, ioff);
          char* crow = jj ? crow1 : crow0;
          if (crow) {
            float s = 1.0f, rc = 0.0f;
            if constexpr (Op::kScaled) {
              if (H <= (uint32_t)kScaleTable) {
                const float2 sr = sh_scale[jj * kScaleTable + h];
                s = sr.x;
                rc = sr.y;
              } else {
                s = load_scale(p, p.job[jj], h);
                rc = fp8_rcp(s);
              }
            }
            char* const dst = gather ? (jj ? io1 : io0) + ioff : crow + coff;
            const typename Op::OutVec out = Op::run(v[k], s, rc, p.default_nan);
            if (gather ? KVX_CUDA_ROWS_GATHER_CS : Op::kScaled ? KVX_CUDA_ROWS_FP8_CS : KVX_CUDA_ROWS_WRITE_CS)
              st_vec_cs<typename Op::OutVec>(dst, out);
            else
              st_vec<typename Op::OutVec>(dst, out);
          }
        }
      }
    }
  }
}

/* Whether launch_fast_op takes move_rows for `p`: the planner chose it (p.rows, cuda_backend.cu:
 * a large call moving K and V in one launch, NHD/HND, rows its 32-bit offsets reach) and the
 * kernel serves the Op: same-width input and output (copies, F16 <-> BF16) with KVX_CUDA_ROWS,
 * FP8 quantization with KVX_CUDA_ROWS_FP8. */
template <class Op>
__host__ bool rows_ok(const MoveParams& p) {
  return p.rows && (Op::kScaled ? KVX_CUDA_ROWS_FP8 : KVX_CUDA_ROWS && Op::kIn == Op::kOut);
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

/* ------------------------------------------------------------------------ */
/* Decode-sized calls (p.decode: at most KVX_CUDA_DECODE_MAX_ROWS rows, NHD/HND caches, writes
 * and gathers): one 16-byte chunk per thread, K and V in one launch, and a plan of byte
 * strides only (DecodeParams, a few cache lines of kernel parameters). Every load whose
 * address is known at entry is issued at once: a write's slot, IO chunk and FP8 scale
 * together, so the call waits for one memory round trip before its store; a gather's length
 * and table entry (RAGGED: its indptr pair, then the token's entry) together, then the cache
 * chunk. Latency, not bandwidth, is what such a call costs (docs/cuda-reference.md,
 * "Decode-sized calls", "Twenty-seventh round"). */
struct DecodeJob {
  char* cache;
  char* io;
  long long c_block, c_token, c_head; /* bytes */
  long long c_group;                  /* bytes between HND_PACKED pack groups (0: one group) */
  long long io_token, io_head;        /* bytes */
  FastDiv grp;                        /* chunks per contiguous group of head_dim */
  const float* scale;
  int scale_kind;
  int kv;                             /* KV_OFFSETS: the table's half (0 K, 1 V) */
};
struct DecodeParams {
  DecodeJob job[2];
  const void* meta;    /* write: slots; gather: sequence lengths */
  const void* indices; /* gather: the PACKED or KV_OFFSETS table, RAGGED indices */
  const void* indptr;  /* RAGGED */
  const char* pool[2]; /* KV_OFFSETS primary, secondary (may be NULL) */
  unsigned long long bytes_per_block; /* KV_OFFSETS */
  long long invalid_slot;
  unsigned long long num_slots;
  FastDiv fd_row;      /* chunks per IO row: njobs x H x C */
  FastDiv fd_hc, fd_c; /* chunks per job row (H x C), per head (C) */
  FastDiv fd_bs, fd_msl, fd_bw;
  uint32_t total;      /* rows x njobs x H x C (pair: rows rounded up to even) */
  uint32_t rows;       /* the call's rows */
  uint32_t row_begin;
  uint32_t c_chunk, io_chunk; /* bytes per chunk on each side (within a group on the cache side) */
  uint32_t max_seq_len, max_blocks, num_blocks;
  uint32_t indices_count; /* RAGGED */
  uint32_t default_nan;
  int wide;            /* write: S64 slots; gather: S64 indices */
  int len64, indptr64;
  int kind;            /* gather: KIND_PACKED, KIND_RAGGED or KIND_KV_OFFSETS */
};

/* the job of chunk u: (io row, job, head, chunk); false for the phantom row after an odd count of
 * paired rows. PAIR (gathers from HND_PACKED caches, whose pack group of consecutive tokens is one
 * run): fd_row counts the chunks of two rows and lanes alternate the two, so that two lanes read
 * one 32-byte sector of the cache (the same chunk of two neighbouring tokens of a block) and 16
 * write one 256-byte run of an IO row; unpaired, 32 lanes read 32 half sectors. */
template <bool PAIR>
__device__ __forceinline__ bool decode_item(const DecodeParams& p, uint32_t u, uint32_t& row, uint32_t& j, uint32_t& h,
                                            uint32_t& c) {
  uint32_t r = fdiv(u, p.fd_row);
  uint32_t q = u - r * p.fd_row.div;
  if constexpr (PAIR) {
    r = 2 * r + (q & 1u);
    q >>= 1;
    if (r >= p.rows) return false;
  }
  j = q >= p.fd_hc.div ? 1u : 0u;
  q -= j * p.fd_hc.div;
  h = fdiv(q, p.fd_c);
  c = q - h * p.fd_c.div;
  row = p.row_begin + r;
  return true;
}

__device__ __forceinline__ long long decode_cache_off(const DecodeParams& p, const DecodeJob& jb, uint32_t h, uint32_t c) {
  const uint32_t g = fdiv(c, jb.grp);
  return (long long)h * jb.c_head + (long long)g * jb.c_group + (long long)(c - g * jb.grp.div) * p.c_chunk;
}

template <class Op>
__global__ void __launch_bounds__(KVX_CUDA_DECODE_THREADS) move_decode_write(const __grid_constant__ DecodeParams p) {
  dependent_entry();
  const uint32_t u = blockIdx.x * blockDim.x + threadIdx.x;
  if (u >= p.total) return;
  uint32_t row, j, h, c;
  if (!decode_item<false>(p, u, row, j, h, c)) return;
  const DecodeJob jb = j ? p.job[1] : p.job[0];
  /* three independent loads, then one wait */
  const long long slot = p.wide ? __ldg((const long long*)p.meta + row) : (long long)__ldg((const int*)p.meta + row);
  const typename Op::InVec v =
      ld_vec<typename Op::InVec>(jb.io + (long long)row * jb.io_token + (long long)h * jb.io_head + (long long)c * p.io_chunk);
  float s = 1.0f;
  if constexpr (Op::kScaled)
    if (jb.scale_kind != SCALE_ONE) s = __ldg(jb.scale_kind == SCALE_HEAD ? jb.scale + h : jb.scale);
  if (slot < 0 || slot == p.invalid_slot || (unsigned long long)slot >= p.num_slots) return;
  long long b, off;
  if (p.num_slots <= 0xFFFFFFFFull) {
    const uint32_t q = fdiv((uint32_t)slot, p.fd_bs);
    b = q;
    off = (uint32_t)slot - q * p.fd_bs.div;
  } else {
    b = slot / p.fd_bs.div;
    off = slot - b * p.fd_bs.div;
  }
  char* dst = jb.cache + b * jb.c_block + off * jb.c_token + decode_cache_off(p, jb, h, c);
  const float r = Op::kScaled ? fp8_rcp(s) : 0.0f;
  st_vec<typename Op::OutVec>(dst, Op::run(v, s, r, p.default_nan));
}

/* S32 (sign-extended) or S64 element i of a gather's metadata array (aligned: p.decode excludes
 * bytewise calls). */
__device__ __forceinline__ long long decode_index(const void* base, int is64, unsigned long long i) {
  return is64 ? __ldg((const long long*)base + i) : (long long)__ldg((const int*)base + i);
}

/* The reading of gather_meta_load and gather_cache_row (move.cuh), one chunk per thread. */
template <class Op, bool PAIR>
__global__ void __launch_bounds__(KVX_CUDA_DECODE_THREADS) move_decode_gather(const __grid_constant__ DecodeParams p) {
  dependent_entry();
  const uint32_t u = blockIdx.x * blockDim.x + threadIdx.x;
  if (u >= p.total) return;
  uint32_t row, j, h, c;
  if (!decode_item<PAIR>(p, u, row, j, h, c)) return;
  const DecodeJob jb = j ? p.job[1] : p.job[0];
  const uint32_t sb = fdiv(row, p.fd_msl); /* sequence x beam */
  const uint32_t t = row - sb * p.max_seq_len;
  const uint32_t s = fdiv(sb, p.fd_bw);
  const uint32_t blk = fdiv(t, p.fd_bs);
  const uint32_t off = t - blk * p.fd_bs.div;
  /* independent loads (length, and the table entry or RAGGED's indptr pair), then RAGGED's entry,
   * then the cache chunk */
  const long long len = decode_index(p.meta, p.len64, s);
  long long a = -1, b = 0;
  if (p.kind == KIND_RAGGED) {
    a = decode_index(p.indptr, p.indptr64, s);
    b = decode_index(p.indptr, p.indptr64, (unsigned long long)s + 1);
  } else if (blk < p.max_blocks) {
    const unsigned long long tr = p.kind == KIND_KV_OFFSETS ? (unsigned long long)sb * 2 + jb.kv : s;
    a = decode_index(p.indices, p.wide, tr * p.max_blocks + blk);
  } else {
    return;
  }
  if (len < 0) return;
  const long long n = len < (long long)p.max_seq_len ? len : (long long)p.max_seq_len;
  if ((long long)t >= n || n > (long long)p.max_blocks * (long long)p.fd_bs.div) return;
  const char* base;
  if (p.kind == KIND_KV_OFFSETS) {
    const uint32_t e = (uint32_t)a;
    if (e == 0xFFFFFFFFu) return;
    base = p.pool[e >> 31];
    if (!base) return;
    base += (unsigned long long)(e & 0x7FFFFFFFu) * p.bytes_per_block;
  } else {
    long long id = a;
    if (p.kind == KIND_RAGGED) {
      if (a < 0 || b < a || b > (long long)p.indices_count || n > b - a) return;
      id = decode_index(p.indices, p.wide, (unsigned long long)(a + t));
    }
    if (id < 0 || id >= (long long)p.num_blocks) return;
    base = jb.cache + id * jb.c_block;
  }
  const typename Op::InVec v = ld_vec<typename Op::InVec>(base + (long long)off * jb.c_token + decode_cache_off(p, jb, h, c));
  char* dst = jb.io + (long long)row * jb.io_token + (long long)h * jb.io_head + (long long)c * p.io_chunk;
  st_vec<typename Op::OutVec>(dst, Op::run(v, 1.0f, 0.0f, p.default_nan));
}

template <class Op>
cudaError_t launch_decode(const MoveParams& p, cudaStream_t stream) {
  DecodeParams d;
  memset(&d, 0, sizeof d);
  const uint32_t C = p.fd_c.div, H = p.fd_h.div;
  const bool gather = p.kind != KIND_WRITE;
  for (uint32_t i = 0; i < 2; ++i) {
    const Job& jb = p.job[i < p.njobs ? i : 0];
    DecodeJob& o = d.job[i];
    o.cache = jb.cache;
    o.io = jb.io;
    o.c_block = jb.c_block * jb.cache_esize;
    o.c_token = jb.c_token * jb.cache_esize;
    o.c_head = jb.c_head * jb.cache_esize;
    o.c_group = jb.c_outer * jb.cache_esize; /* 0 unless HND_PACKED (choose_path) */
    o.grp = jb.grp;
    o.io_token = jb.io_token * jb.io_esize;
    o.io_head = jb.io_head * jb.io_esize;
    o.scale = jb.scale;
    o.scale_kind = jb.scale_kind;
    o.kv = jb.kv;
  }
  d.c_chunk = p.vec * (uint32_t)p.job[0].cache_esize;
  d.io_chunk = p.vec * (uint32_t)p.job[0].io_esize;
  const unsigned long long per_row = (unsigned long long)p.njobs * H * C;
  /* gathers from HND_PACKED (more than one pack group per head row: choose_path) whose sequences have an
   * even max_seq_len, so that a pair of rows is two tokens of one sequence (with sequences of one token,
   * pairs only cost: +0.05 us at 4 rows). Writes stay unpaired (paired: prefill writes of 16 rows 0.1 us
   * faster cold, random-slot and FP8 writes 0.02-0.03 us slower warm; docs/cuda-reference.md,
   * "Twenty-second round") */
  const bool pair = KVX_CUDA_DECODE_PAIR && gather && p.job[0].grp.div < C && p.row_count > 1 && p.max_seq_len % 2 == 0;
  const unsigned long long total = pair ? 2 * per_row * ((p.row_count + 1) / 2) : per_row * p.row_count;
  d.fd_row = make_fastdiv((uint32_t)(pair ? 2 * per_row : per_row));
  d.rows = p.row_count;
  d.fd_hc = make_fastdiv(H * C);
  d.fd_c = p.fd_c;
  d.fd_bs = p.fd_bs;
  d.fd_msl = p.fd_msl;
  d.fd_bw = p.fd_bw;
  d.total = (uint32_t)total;
  d.row_begin = p.row_begin;
  d.default_nan = p.default_nan;
  if (gather) {
    d.meta = p.seq_lens;
    d.indices = p.indices;
    d.wide = p.idx64;
    d.len64 = p.len64;
    d.max_seq_len = p.max_seq_len;
    d.max_blocks = p.max_blocks;
    d.num_blocks = p.num_blocks;
    d.kind = p.kind;
    d.indptr = p.indptr;
    d.indptr64 = p.indptr64;
    d.indices_count = p.indices_count;
    d.pool[0] = p.pool[0];
    d.pool[1] = p.pool[1];
    d.bytes_per_block = p.bytes_per_block;
  } else {
    d.meta = p.slots;
    d.wide = p.slot64;
    d.invalid_slot = p.invalid_slot;
    d.num_slots = p.num_slots;
  }
  const unsigned long long warps = (total + 31) / 32;
  const int threads = KVX_CUDA_DECODE_SPREAD ? launch_threads(p, warps, KVX_CUDA_DECODE_THREADS) : KVX_CUDA_DECODE_THREADS;
  const unsigned long long grid = (total + threads - 1) / threads;
  if (gather) {
    if constexpr (Op::kScaled) return cudaErrorInvalidValue; /* FP8 destinations exist on write only */
    else if (pair) return launch_kernel(move_decode_gather<Op, true>, (unsigned)grid, (unsigned)threads, 0, stream, d);
    else return launch_kernel(move_decode_gather<Op, false>, (unsigned)grid, (unsigned)threads, 0, stream, d);
  }
  return launch_kernel(move_decode_write<Op>, (unsigned)grid, (unsigned)threads, 0, stream, d);
}

template <class Op>
cudaError_t launch_fast_op(const MoveParams& p, cudaStream_t stream) {
  if (p.decode) return launch_decode<Op>(p, stream);
  if (p.inv && !rows_ok<Op>(p)) return cudaErrorInvalidValue; /* only move_rows goes over the slots (rows_serve) */
  if (rows_ok<Op>(p)) {
    constexpr int U = Op::kScaled ? KVX_CUDA_ROWS_FP8_UNROLL : KVX_CUDA_ROWS_UNROLL;
    constexpr int MINB = Op::kScaled ? KVX_CUDA_ROWS_FP8_MIN_BLOCKS : KVX_CUDA_ROWS_MIN_BLOCKS;
    const unsigned long long lanes = p.inv ? p.num_slots : (unsigned long long)p.row_count; /* rows, or slots */
    const unsigned long long tasks = (lanes + (1u << p.lg_tg) - 1) >> p.lg_tg;
    const unsigned long long grid = (tasks + kThreads / 32 - 1) / (kThreads / 32);
    if constexpr (!Op::kScaled) { /* copies and F16 <-> BF16: rows_write_early_for (cuda/tuning.h) */
      if (p.early && p.kind == KIND_WRITE && !p.inv) {
        return launch_kernel(move_rows<Op, U, MINB, true>, (unsigned)grid, kThreads, 0, stream, p);
      }
    }
    if constexpr (Op::kScaled) { /* FP8 writes whose chunks step by constants (cuda/tuning.h) */
      const bool per_head = p.job[0].scale_kind == SCALE_HEAD || (p.njobs > 1 && p.job[1].scale_kind == SCALE_HEAD);
      if (rows_fp8_affine_for(p.lg_tg, p.fd_c.div, p.fd_h.div, per_head))
        return launch_kernel(move_rows<Op, U, MINB, false, true>, (unsigned)grid, kThreads, 0, stream, p);
    }
    return launch_kernel(move_rows<Op, U, MINB>, (unsigned)grid, kThreads, 0, stream, p);
  }
  /* one warp per (job, row group) task, or per row group when K and V are fused */
  const unsigned long long groups = ((unsigned long long)p.row_count + (1u << p.lg_tg) - 1) >> p.lg_tg;
  const bool fused = Op::kFuse && p.njobs == 2 && p.fuse;
  MoveParams q = p;
  /* A small call (no fusing) whose lanes would each take more than KVX_CUDA_SMALL_LANE_CHUNKS chunks of
   * a task splits the task over 2, 4, ... warps: a decode step's latency is one warp's chain */
  q.lg_split = 0;
  if (!p.fuse && !Op::kScaled) {
    const unsigned long long per_lane = (((unsigned long long)p.fd_h.div * p.fd_c.div) << p.lg_tg) / 32;
    while ((per_lane >> q.lg_split) > (unsigned long long)KVX_CUDA_SMALL_LANE_CHUNKS && q.lg_split < 4) ++q.lg_split;
  }
  const unsigned long long tasks = (fused ? groups : groups * p.njobs) << q.lg_split;
  if (Op::kResident) q.tpw = 0;
  const unsigned long long warps = q.tpw == 0 ? tasks : (tasks + q.tpw - 1) / q.tpw;
  const int threads = launch_threads(p, warps, Op::kBlock);
  const int grid = grid_for_warps((const void*)move_fast<Op>, warps, q.tpw == 0, threads);
  return launch_kernel(move_fast<Op>, (unsigned)grid, (unsigned)threads, 0, stream, q);
}

}  // namespace kvx_cuda

#endif /* KVX_CUDA_MOVE_KERNELS_CUH */
