/*
 * move.cuh -- the CUDA backend's kernels: one "move" kernel shape serves write
 * (IO row -> cache row by slot) and gather (cache row by block table -> padded
 * IO row). docs/cuda-reference.md describes the design; kvx_plan.h is the
 * contract with the front end.
 *
 * Work decomposition (both directions, both kernels):
 *   an IO row is a token (write: token i; gather: r = (s*beam_width+beam)*max_seq_len + t);
 *   an item is (job, row, head, chunk): job 0 moves K, job 1 moves V;
 *   a chunk is VEC consecutive head_dim elements (fast path: 16 bytes on the wider
 *   side) or one element (general path).
 * Item index u -> (job, row-group, head, chunk, token-in-group) with the
 * token-in-group fastest (TG tokens, a power of two): with TG > 1 neighbouring
 * lanes move the same chunk of consecutive tokens, which is contiguous in
 * HND_PACKED (and in any layout whose token stride is smallest), so stores and
 * loads stay whole sectors there too.
 *
 * Rows whose cache location is invalid (slot < 0, == invalid_slot, >= capacity;
 * a bad block id, length or indptr range) are skipped on the device: no
 * out-of-bounds access, no host synchronization (readings R-DEVICE-STATUS).
 */
#ifndef KVX_CUDA_MOVE_CUH
#define KVX_CUDA_MOVE_CUH

#include <cuda_runtime.h>
#include <stdint.h>

#include "convert.h"
#include "kvx/kvx_abi.h"
#include "tuning.h"

namespace kvx_cuda {

constexpr int kThreads = 256;

#ifndef KVX_CUDA_GATHER_TPW
#define KVX_CUDA_GATHER_TPW 4 /* fast-path gathers: tasks per warp */
#endif
#ifndef KVX_CUDA_GATHER_TPW_MIN_GROUPS_DEEP
#define KVX_CUDA_GATHER_TPW_MIN_GROUPS_DEEP 32768 /* KVX_CUDA_GATHER_TPW_MIN_GROUPS at memory depth 2 or more */
#endif
#ifndef KVX_CUDA_DEEP_TASK_BYTES
#define KVX_CUDA_DEEP_TASK_BYTES 4096 /* ... for tasks of at most this many bytes (K and V, wider side) */
#endif
#ifndef KVX_CUDA_ROWS_MAX_TASK_BYTES
#define KVX_CUDA_ROWS_MAX_TASK_BYTES 16384 /* the lean kernel (move_rows) for tasks (K and V of the task's rows) \
                                               of at most this many bytes (0: any; 32 KB tasks lost 1.1 points \
                                               on both parts) */
#endif
#ifndef KVX_CUDA_GATHER_TPW_MIN_GROUPS
#define KVX_CUDA_GATHER_TPW_MIN_GROUPS 262144 /* ... from this many row groups on (below: one; 65536: -1 to -2 points at 65536 rows, 0: -1.5 to -6 below 262144 rows) */
#endif
#ifndef KVX_CUDA_TASK_CHUNKS
#define KVX_CUDA_TASK_CHUNKS 256 /* large fast-path calls: rows per task so that a task has this many chunks (0: one row; head_dim 64 x 8 heads F16: -6 to -11 points) */
#endif
#ifndef KVX_CUDA_INVERT_COVER
#define KVX_CUDA_INVERT_COVER 4 /* inverted writes (move_invert.cu): when the cache has at most this many slots per row \
                                   written */
#endif
#ifndef KVX_CUDA_INVERT_MAX_SLOTS
#define KVX_CUDA_INVERT_MAX_SLOTS (1u << 24) /* ... and at most this many slots (64 MB of scratch) */
#endif
#ifndef KVX_CUDA_INVERT_CLEAR
#define KVX_CUDA_INVERT_CLEAR 1 /* ... the scratch array set to -1 first (inv_row_of) */
#endif
#ifndef KVX_CUDA_ROWS_INVERT_MIN_BYTES
#define KVX_CUDA_ROWS_INVERT_MIN_BYTES (512ull << 20) /* lean-kernel writes (move_rows) of one row per task and \
      at least this many bytes of rows (K and V, wider side) may go over the cache's slots, at the memory depth \
      rows_invert_for takes (0: never; H200, 256 MiB: -0.2 to -1.3 points, 512 MiB and more: +0.7 to +6) */
#endif
#ifndef KVX_CUDA_ROWS_INVERT_FP8_COVER
#define KVX_CUDA_ROWS_INVERT_FP8_COVER 1 /* ... FP8 quantizing writes only where the cache has at most this many \
      slots per row written (a warp per slot: at 2, half of them idle; H200, F32 -> E4M3 at 65536 rows: \
      70-71 % inverted, 84-86 % in row order; at 1: inverted +1 to +6 points) */
#endif
#ifndef KVX_CUDA_ROWS_TASK_CHUNKS
#define KVX_CUDA_ROWS_TASK_CHUNKS KVX_CUDA_TASK_CHUNKS /* the same for the lean kernel over the IO rows */
#endif
#ifndef KVX_CUDA_ROWS_MAX_LG_TG
#define KVX_CUDA_ROWS_MAX_LG_TG 3 /* ... up to 2^this rows per task (at most 5; H100, one head of 64: 4 or 5 \
                                     lost 4 to 5 points) */
#endif
#ifndef KVX_CUDA_PACKED_SMEM
#define KVX_CUDA_PACKED_SMEM 1 /* HND_PACKED same-dtype moves through shared-memory tiles */
#endif
#ifndef KVX_CUDA_FUSE_MIN_GROUPS
#define KVX_CUDA_FUSE_MIN_GROUPS 8192 /* below: small calls, one task per warp and per K|V row */
#endif
#ifndef KVX_CUDA_SPREAD_SMALL
#define KVX_CUDA_SPREAD_SMALL 1 /* small calls: blocks of fewer warps, over every SM (launch_threads; 0: 256 threads) */
#endif
#ifndef KVX_CUDA_PACKED_LG_TG
#define KVX_CUDA_PACKED_LG_TG 3 /* HND_PACKED fast path: 2^3 tokens per task */
#endif
#ifndef KVX_CUDA_DECODE
#define KVX_CUDA_DECODE 1 /* decode-sized NHD/HND writes and gathers: the one-chunk-per-thread kernels \
                             (move_decode_*, every load issued before the first wait); 0: move_fast */
#endif
#ifndef KVX_CUDA_DECODE_LOOKUP
#define KVX_CUDA_DECODE_LOOKUP 1 /* decode-sized RAGGED and KV_OFFSETS gathers (any beam width) take the decode \
                                    kernel too (0: move_fast, one warp per K or V row group) */
#endif
#ifndef KVX_CUDA_DECODE_MAX_ROWS
#define KVX_CUDA_DECODE_MAX_ROWS 256 /* ... for calls of at most this many rows */
#endif
#ifndef KVX_CUDA_DECODE_SPREAD
#define KVX_CUDA_DECODE_SPREAD 0 /* decode kernels: 1, blocks of as few warps as spread the call over every SM \
                                    (launch_threads: 0.05-0.15 us slower below 256 rows); 0: full blocks */
#endif
#ifndef KVX_CUDA_DECODE_THREADS
#define KVX_CUDA_DECODE_THREADS 256 /* decode kernels: threads per block */
#endif
#ifndef KVX_CUDA_DECODE_PACKED_MAX_ROWS
#define KVX_CUDA_DECODE_PACKED_MAX_ROWS 64 /* HND_PACKED writes of at most this many rows take the decode kernels \
                                              too (0: the tile kernels); at 256 rows the tiles won (prefill writes \
                                              3.1 against 3.8 us) */
#endif
#ifndef KVX_CUDA_DECODE_PACKED_GATHER_MAX_ROWS
#define KVX_CUDA_DECODE_PACKED_GATHER_MAX_ROWS 256 /* the same for HND_PACKED gathers, whose decode kernel pairs \
                                                     rows (KVX_CUDA_DECODE_PAIR; H200, 256 rows: F32 3.85 against \
                                                     the tiles' 4.03-4.11 us cold, 2.63-2.67 against 3.44 warm) */
#endif
#ifndef KVX_CUDA_DECODE_PAIR
#define KVX_CUDA_DECODE_PAIR 1 /* decode gathers from HND_PACKED caches: lanes alternate two rows (decode_item; \
                                  0: unpaired, 0.1-0.2 us slower at 16 and 64 rows, 0.4 us warm at 256 rows) */
#endif
#ifndef KVX_CUDA_PDL
#define KVX_CUDA_PDL 1 /* programmatic dependent launch (compute capability 9.0 or more): each kernel's \
                          launch overlaps the end of the kernel before it in the stream (launch_kernel) */
#endif
constexpr int kUnroll = 4;

/* Division by a run-time constant (Granlund-Montgomery): q = (hi(n*mul) + n) >> shr,
 * exact for every 32-bit n (the sum is formed in 64 bits). */
struct FastDiv {
  uint32_t div, mul, shr;
};

inline FastDiv make_fastdiv(uint32_t d) {
  FastDiv f;
  f.div = d ? d : 1;
  uint32_t shr = 0;
  while ((1ull << shr) < f.div) ++shr;
  f.shr = shr;
  f.mul = (uint32_t)(((1ull << 32) * ((1ull << shr) - f.div)) / f.div + 1);
  return f;
}

__device__ __forceinline__ uint32_t fdiv(uint32_t n, const FastDiv& f) {
  const uint32_t t = __umulhi(n, f.mul);
  return (uint32_t)(((uint64_t)t + n) >> f.shr);
}

/* What a launch does. */
enum Kind : int { KIND_WRITE = 0, KIND_PACKED = 1, KIND_RAGGED = 2, KIND_KV_OFFSETS = 3 };
enum ScaleKindDev : int { SCALE_ONE = 0, SCALE_TENSOR = 1, SCALE_HEAD = 2 };

/* One tensor pair (K or V). Strides in elements of the tensor's own dtype. */
struct Job {
  char* cache;   /* cache base (unused for KV_OFFSETS: the pools) */
  char* io;      /* IO base */
  long long c_block, c_token, c_head, c_outer, c_inner;
  long long io_token, io_head, io_dim;
  FastDiv grp;   /* fast: chunks per contiguous group of head_dim; general: pack */
  int cache_dtype, io_dtype;
  int cache_esize, io_esize;
  int scale_kind;
  const float* scale;
  int kv;        /* KV_OFFSETS: 0 = K half of the table, 1 = V half */
};

struct MoveParams {
  Job job[2];
  uint32_t njobs;
  uint32_t items_per_job; /* ceil(row_count / TG) * TG * H * C */
  uint32_t row_begin, row_count;
  uint32_t lg_tg;
  uint32_t tpw;           /* fast path: tasks per warp, 0 = resident grid (grid-stride) */
  uint32_t fuse;          /* fast path: one task moves K and V (when the Op allows it) */
  uint32_t lg_split;      /* fast path: each task's chunks split over 2^lg_split warps (small calls) */
  uint32_t decode;        /* fast path: a decode-sized call for the move_decode_* kernels (launch_decode) */
  uint32_t rows;          /* fast path: a large call for move_rows where its Op serves it (rows_ok) */
  uint32_t early;         /* move_rows over the IO rows of a write: IO loads before the slot (rows_write_early_for) */
  FastDiv fd_c, fd_h;     /* chunks per row (C), heads (H) */
  uint32_t vec;           /* elements per chunk */
  int kind;
  uint32_t block_size;
  FastDiv fd_bs;
  uint32_t default_nan;   /* the host's FP32 default NaN (what 0.0f/0.0f gives there) */
  int bytewise;           /* some pointer is not aligned to its element: byte loads/stores (general path) */
  /* write */
  const void* slots;
  int slot64;
  long long invalid_slot;
  unsigned long long num_slots; /* num_blocks * block_size */
  /* gather */
  uint32_t max_seq_len;
  FastDiv fd_msl, fd_bw;
  uint32_t max_blocks;
  uint32_t num_blocks;
  const void* indices;
  int idx64;
  uint32_t indices_count;
  const void* indptr;
  int indptr64;
  const void* seq_lens;
  int len64;
  const char* pool[2];    /* KV_OFFSETS primary, secondary (may be NULL) */
  unsigned long long bytes_per_block;
  /* writes over the cache's slots (launch_inverted, move_invert.cu): slot -> IO row, -1 none */
  const int* inv;
};

/* Little-endian assembly of an n-byte value at any address. */
__device__ __forceinline__ unsigned long long ld_bytes(const void* p, int n) {
  const unsigned char* b = (const unsigned char*)p;
  unsigned long long v = 0;
  for (int i = n - 1; i >= 0; --i) v = (v << 8) | b[i];
  return v;
}

/* S32 (sign-extended) or S64 element i of a metadata array. */
__device__ __forceinline__ long long ld_index(const MoveParams& p, const void* base, int is64, unsigned long long i) {
  if (p.bytewise) {
    if (is64) return (long long)ld_bytes((const char*)base + 8 * i, 8);
    return (long long)(int)(unsigned)ld_bytes((const char*)base + 4 * i, 4);
  }
  if (is64) return __ldg((const long long*)base + i);
  return (long long)__ldg((const int*)base + i);
}

/* One item, decomposed. */
struct Item {
  const Job* job;
  uint32_t row; /* absolute IO row */
  uint32_t h, c;
  bool live;
};

__device__ __forceinline__ Item decompose(const MoveParams& p, uint32_t u) {
  Item it;
  uint32_t j = 0;
  if (u >= p.items_per_job) {
    u -= p.items_per_job;
    j = 1;
  }
  it.job = &p.job[j];
  const uint32_t ti = u & ((1u << p.lg_tg) - 1u);
  const uint32_t v = u >> p.lg_tg;
  const uint32_t q = fdiv(v, p.fd_c);
  it.c = v - q * p.fd_c.div;
  const uint32_t rg = fdiv(q, p.fd_h);
  it.h = q - rg * p.fd_h.div;
  const uint32_t r = (rg << p.lg_tg) + ti;
  it.live = r < p.row_count;
  it.row = p.row_begin + r;
  return it;
}

/* Gather metadata of one row, loaded in a first stage (all independent loads). */
struct GatherMeta {
  long long len;   /* seq_lens[s] */
  long long a, b;  /* RAGGED indptr[s], indptr[s+1]; PACKED/KV_OFFSETS: table entry in a */
  uint32_t t, j, off;
  bool ok;
};

__device__ __forceinline__ GatherMeta gather_meta_load(const MoveParams& p, const Item& it) {
  GatherMeta m;
  m.ok = it.live;
  m.len = 0;
  m.a = m.b = 0;
  m.t = m.j = m.off = 0;
  if (!m.ok) return m;
  const uint32_t sb = fdiv(it.row, p.fd_msl);
  m.t = it.row - sb * p.max_seq_len;
  const uint32_t s = fdiv(sb, p.fd_bw);
  m.j = fdiv(m.t, p.fd_bs);
  m.off = m.t - m.j * p.block_size;
  m.len = ld_index(p, p.seq_lens, p.len64, s);
  if (p.kind == KIND_RAGGED) {
    m.a = ld_index(p, p.indptr, p.indptr64, s);
    m.b = ld_index(p, p.indptr, p.indptr64, (unsigned long long)s + 1);
  } else if (m.j < p.max_blocks) {
    const unsigned long long row_of_table =
        p.kind == KIND_KV_OFFSETS ? (unsigned long long)sb * 2 + it.job->kv : s;
    m.a = ld_index(p, p.indices, p.idx64, row_of_table * p.max_blocks + m.j);
  } else {
    m.ok = false;
  }
  return m;
}

/* Second stage: validate, (RAGGED: load the token's block id), and return the
 * address of (block, token) row start in the cache (head 0, dim 0) or NULL. */
__device__ __forceinline__ char* gather_cache_row(const MoveParams& p, const Job& jb, GatherMeta m) {
  if (!m.ok || m.len < 0) return nullptr;
  const long long n = m.len < (long long)p.max_seq_len ? m.len : (long long)p.max_seq_len;
  if ((long long)m.t >= n) return nullptr;
  if (n > (long long)p.max_blocks * (long long)p.block_size) return nullptr;
  long long id;
  if (p.kind == KIND_RAGGED) {
    if (m.a < 0 || m.b < m.a || m.b > (long long)p.indices_count || n > m.b - m.a) return nullptr;
    id = ld_index(p, p.indices, p.idx64, (unsigned long long)(m.a + m.t));
  } else {
    id = m.a;
  }
  if (p.kind == KIND_KV_OFFSETS) {
    const uint32_t e = (uint32_t)id;
    if (e == 0xFFFFFFFFu) return nullptr;
    const char* base = p.pool[e >> 31];
    if (!base) return nullptr;
    return (char*)base + (unsigned long long)(e & 0x7FFFFFFFu) * p.bytes_per_block +
           (long long)jb.cache_esize * ((long long)m.off * jb.c_token);
  }
  if (id < 0 || id >= (long long)p.num_blocks) return nullptr;
  return jb.cache + (long long)jb.cache_esize * (id * jb.c_block + (long long)m.off * jb.c_token);
}

__device__ __forceinline__ long long write_slot_load(const MoveParams& p, const Item& it) {
  return it.live ? ld_index(p, p.slots, p.slot64, it.row) : -1;
}

/* Whether a write stores the row mapped to `slot` (R-INVALID-SLOT: negative, the invalid value
 * and slots past the cache are skipped). */
__device__ __forceinline__ bool slot_valid(const MoveParams& p, long long slot) {
  return slot >= 0 && slot != p.invalid_slot && (unsigned long long)slot < p.num_slots;
}

__device__ __forceinline__ char* write_cache_row(const MoveParams& p, const Job& jb, long long slot) {
  if (!slot_valid(p, slot)) return nullptr;
  long long b, off;
  if (p.num_slots <= 0xFFFFFFFFull) {
    const uint32_t s32 = (uint32_t)slot;
    const uint32_t q = fdiv(s32, p.fd_bs);
    b = q;
    off = s32 - q * p.block_size;
  } else {
    b = slot / p.block_size;
    off = slot - b * p.block_size;
  }
  return jb.cache + (long long)jb.cache_esize * (b * jb.c_block + off * jb.c_token);
}

/* Inverted writes (move_invert.cu): the IO row that writes cache slot `sl`, or -1. The call's rows
 * were recorded by slot in p.inv (row_begin 0). KVX_CUDA_INVERT_CLEAR 1: the scratch array was set
 * to -1 (a stream-ordered memset) before, so an entry is the row. 0: it is never cleared, and an
 * entry counts only if it names a row of the call whose own slot is this one (the sparse-set
 * check): one dependent load more, with which the inverted HND_PACKED writes of 262144 rows read
 * 1 to 9 points lower on an H200 (docs/cuda-reference.md, "Twelfth round"). */
__device__ __forceinline__ int inv_row_of(const MoveParams& p, unsigned long long sl) {
  if (sl >= p.num_slots) return -1;
  const int r = __ldg(p.inv + sl);
  if ((unsigned)r >= p.row_count) return -1;
  if (KVX_CUDA_INVERT_CLEAR) return r;
  return ld_index(p, p.slots, p.slot64, (unsigned)r) == (long long)sl ? r : -1;
}

__device__ __forceinline__ float load_scale(const MoveParams& p, const Job& jb, uint32_t h) {
  if (jb.scale_kind == SCALE_ONE) return 1.0f;
  const float* q = jb.scale_kind == SCALE_HEAD ? jb.scale + h : jb.scale;
  if (p.bytewise) return __uint_as_float((uint32_t)ld_bytes(q, 4));
  return __ldg(q);
}

/* x / scale with the host's FP32 division result bit for bit: the device's
 * division is IEEE (correctly rounded); only NaN results differ between
 * machines (propagated operand or the default NaN), so they are rebuilt the
 * way x86 SSE / AArch64 build them (first NaN operand quieted, else the
 * host's default NaN). Only the sign of a NaN survives an FP8 cast. */
__device__ __forceinline__ float host_div(float x, float s, uint32_t default_nan) {
  float q = __fdiv_rn(x, s);
  if (q != q) {
    if (x != x)
      q = __uint_as_float(__float_as_uint(x) | 0x400000u);
    else if (s != s)
      q = __uint_as_float(__float_as_uint(s) | 0x400000u);
    else
      q = __uint_as_float(default_nan);
  }
  return q;
}

/* x / s, correctly rounded, without a division per element: r = RN(1/s)
 * (__frcp_rn, once per scale), q0 = RN(x r), e = x - q0 s (exact: one fma, q0
 * is within one ulp of x/s), q = RN(q0 + e r). Markstein's theorem (Handbook of
 * Floating-Point Arithmetic, "Markstein's division") gives q == RN(x/s) when r
 * is within half an ulp of 1/s and nothing underflows or overflows, which holds
 * for |s| and |x| in [2^-60, 2^60): |x/s| in (2^-121, 2^121), the residual's
 * grid at or above 2^-107. x = +-0 gives a zero of x r's sign (that of x/s). Callers take
 * __fdiv_rn for everything else (NaN, Inf, huge or tiny operands). Checked
 * bit for bit against IEEE division on every FP32 significand of x against
 * thousands of scale significands (docs/cuda-reference.md). */
__device__ __forceinline__ bool exact_div_range(float v) {
  return (__float_as_uint(v) & 0x7FFFFFFFu) - 0x21800000u < 0x3C000000u; /* |v| in [2^-60, 2^60) */
}
__device__ __forceinline__ float exact_div_rcp(float x, float s, float r) {
  const float q0 = __fmul_rn(x, r);
  const float e = __fmaf_rn(-q0, s, x);
  /* the quotient has q0's sign (x = +-0: q0 = x r is the signed zero, q a zero) */
  return copysignf(__fmaf_rn(e, r, q0), q0);
}
#ifndef KVX_CUDA_FP8_POS_DIV
#define KVX_CUDA_FP8_POS_DIV 1 /* FP8 quantization: reciprocal division only for positive scales, in the form \
                                  without the sign fix-up (one instruction less per value); a negative scale \
                                  takes IEEE division. 0: both signs, with the fix-up */
#endif
/* The reciprocal the FP8 quantization divides by: RN(1 / s) when the fast
 * division applies to s (in [2^-60, 2^60), not 1, and positive with
 * KVX_CUDA_FP8_POS_DIV), else 0 (IEEE division). */
__device__ __forceinline__ float fp8_rcp(float s) {
  const bool ok = s != 1.0f && exact_div_range(s) && (!KVX_CUDA_FP8_POS_DIV || s > 0.0f);
  return ok ? __frcp_rn(s) : 0.0f;
}
/* The same quotient for s > 0 with no sign fix-up: the residual is formed
 * negated, e' = RN(q0 s - x) = -e, and q = RN(-e' r + q0) (both negations are
 * free FMA operands). Zeros keep x's sign (r > 0): x = -0 gives e' = -0 + +0 =
 * +0 and q = -0 + -0 = -0; x = +0 gives e' = +0 + -0 = +0 and q = -0 + +0 = +0
 * (fp_identities_check.cpp part 1 checks both forms, by the divisor's sign). */
__device__ __forceinline__ float exact_div_rcp_pos(float x, float s, float r) {
  const float q0 = __fmul_rn(x, r);
  const float e = __fmaf_rn(q0, s, -x);
  return __fmaf_rn(-e, r, q0);
}
/* The quotient of the FP8 fast path (r = fp8_rcp(s) != 0). */
__device__ __forceinline__ float fp8_div(float x, float s, float r) {
  return KVX_CUDA_FP8_POS_DIV ? exact_div_rcp_pos(x, s, r) : exact_div_rcp(x, s, r);
}

/* Exact software encode of one element to the cache/IO dtype (convert.h), with
 * the FP8 quantization done as the host does it. */
__device__ __forceinline__ void sw_encode(void* out, int dst, float x, float scale, uint32_t default_nan) {
  const kvx_dtype_t dt = (kvx_dtype_t)dst;
  if (kvx_ref::is_fp8(dt)) {
    const float q = host_div(x, scale, default_nan);
    const uint8_t b = dt == KVX_DTYPE_F8_E4M3 ? kvx_ref::f32_to_e4m3(kvx_ref::fp8_clamp(q, kvx_ref::kE4M3Max))
                                              : kvx_ref::f32_to_e5m2(kvx_ref::fp8_clamp(q, kvx_ref::kE5M2Max));
    *(uint8_t*)out = b;
  } else {
    kvx_ref::encode_from_f32(out, dt, x);
  }
}

/* Launchers (move_copy.cu, move_convert.cu, move_fp8.cu): one launch over
 * p.njobs * p.items_per_job items on `stream`; they return the launch error.
 * launch_fast picks the Op for (src, dst) dtypes: the same dtype copies bytes. */
cudaError_t launch_fast(kvx_dtype_t src, kvx_dtype_t dst, const MoveParams& p, cudaStream_t stream);
cudaError_t launch_general(const MoveParams& p, cudaStream_t stream);
cudaError_t launch_copy(int esize, const MoveParams& p, cudaStream_t stream);
cudaError_t launch_convert_float(kvx_dtype_t src, kvx_dtype_t dst, const MoveParams& p, cudaStream_t stream);
cudaError_t launch_convert_fp8(kvx_dtype_t src, kvx_dtype_t dst, const MoveParams& p, cudaStream_t stream);
/* move_packed.cu: same-dtype HND_PACKED moves with 16-byte pack groups, tiles of
 * 16 tokens x 16 dgroups through shared memory (p.lg_tg = 4, fd_c.div % 16 == 0). */
cudaError_t launch_packed(const MoveParams& p, cudaStream_t stream);
/* ... and quantizing writes into FP8 HND_PACKED with 16-element pack groups
 * (p.lg_tg = 4, head_dim a multiple of 128). */
cudaError_t launch_packed_fp8(kvx_dtype_t src, kvx_dtype_t dst, const MoveParams& p, cudaStream_t stream);

/* Whether launch_fast takes the lean kernel (move_rows) for a (src, dst) pair of a call the
 * planner gave it (p.rows): rows_ok (move_kernels.cuh) asked of the dtypes (move_copy.cu). */
bool rows_serve(kvx_dtype_t src, kvx_dtype_t dst);

/* move_invert.cu: writes over the cache's slots instead of the IO rows. invert_ok: whether a
 * write of `rows` rows (at least `min_rows`) may go that way: it covers a good part of the cache
 * (KVX_CUDA_INVERT_COVER), whose slots fit the scratch array (KVX_CUDA_INVERT_MAX_SLOTS);
 * packed_invert_ok (move_packed.cu) adds the tile kernels' conditions. launch_inverted records
 * the rows by slot in a stream-ordered scratch array, then runs `kernel` over the slots: the
 * same-dtype tiles (move_packed), the FP8 tiles (move_packed_fp8) or the lean kernel (move_rows,
 * through launch_fast); without stream-ordered allocation, over the IO rows as usual. */
enum InvKernel : int { INV_TILES = 0, INV_QTILES = 1, INV_ROWS = 2 };
bool invert_ok(const MoveParams& p, unsigned long long rows, unsigned long long min_rows);
bool packed_invert_ok(const MoveParams& p, unsigned long long rows, uint32_t H, uint32_t pieces_per_head);
cudaError_t launch_inverted(InvKernel kernel, kvx_dtype_t src, kvx_dtype_t dst, MoveParams p, unsigned long long rows,
                            cudaStream_t stream);

/* Elements per fast-path chunk: 16 bytes on the wider side. */
inline int fast_vec(kvx_dtype_t src, kvx_dtype_t dst) {
  const int a = (int)kvx_ref::dtype_size(src), b = (int)kvx_ref::dtype_size(dst);
  return 16 / (a > b ? a : b);
}

/* Occupancy-sized grid for `kernel` over `total_items` items (cached per kernel and device). */
int grid_for(const void* kernel, unsigned long long total_items);
/* The same for a kernel with one warp per task: the resident grid (warps
 * stride over tasks) when `persistent`, else one task per warp. */
int grid_for_warps(const void* kernel, unsigned long long tasks, bool persistent, int threads = kThreads);
/* Programmatic dependent launch. Every kernel of this backend starts with dependent_entry(): it lets
 * the next kernel in the stream be launched (its blocks become resident as this grid's last blocks
 * finish) and then waits until the kernel before it in the stream has completed and its writes are
 * visible, before any global memory access. launch_kernel() launches with the attribute that allows
 * that overlap on devices of compute capability 9.0 or more (dependent_launch()); elsewhere, and
 * after a predecessor that is not such a kernel (a memset, a copy, another library's kernel), the
 * launch waits as in plain stream order. Stream order is unchanged: a kernel reads or writes global
 * memory only after its predecessor is complete. */
__device__ __forceinline__ void dependent_entry() {
#if KVX_CUDA_PDL && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
/* Whether launches on the current device carry the programmatic-serialization attribute. */
bool dependent_launch();
/* A kernel launch on `stream` (the attribute where dependent_launch()): the launch's error, else the
 * last error. */
template <typename... Params, typename... Args>
cudaError_t launch_kernel(void (*kernel)(Params...), unsigned grid, unsigned threads, size_t smem, cudaStream_t stream,
                          Args&&... args) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(grid);
  cfg.blockDim = dim3(threads);
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = dependent_launch() ? 1 : 0;
  const cudaError_t e = cudaLaunchKernelEx(&cfg, kernel, static_cast<Args&&>(args)...);
  const cudaError_t last = cudaGetLastError();
  return e != cudaSuccess ? e : last;
}
/* memory_depth_for (tuning.h) of the current device, cached per device: H100 SXM
 * 25 GB/s of DRAM bandwidth per SM (depth 1), H200 36.5 (depth 2). */
int memory_depth();
/* Threads per block for a launch of `warps` one-warp tasks: `threads` for a
 * large call; for a small (decode-sized) one (!p.fuse), as few warps per block
 * as spread them over every SM (at most `threads` / 32), so that no SM's
 * load/store unit serializes the call. */
int launch_threads(const MoveParams& p, unsigned long long warps, int threads);

}  // namespace kvx_cuda

#endif /* KVX_CUDA_MOVE_CUH */
