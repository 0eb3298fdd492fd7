/*
 * move_packed.cu -- same-dtype moves between an HND_PACKED cache whose pack
 * group is one 16-byte piece ([block][head][D/x][token][x], x = 16 / esize:
 * vLLM's K layout) and token-major IO rows, staged through shared memory.
 *
 * The two sides are transposes of each other at 16-byte granularity: for one
 * head and 16 consecutive tokens of a block, the cache holds dgroup-major
 * pieces (16 tokens of dgroup 0, then of dgroup 1, ...: 4 KB contiguous for
 * 16 dgroups) and the IO holds token-major rows (16 dgroups of token 0, ...).
 * One warp moves such a 16 x 16 tile: it reads one side 512 contiguous bytes
 * per instruction (2 dgroups x 16 tokens, or 2 rows x 16 dgroups), parks the
 * pieces in shared memory (XOR-swizzled: no bank conflicts either way) and
 * writes the other side 512 contiguous bytes per instruction (a call of fewer
 * than KVX_CUDA_PACKED_ND16_MIN_ROWS rows takes 16 x 8 tiles: twice the warps). The generic
 * fast path (move_kernels.cuh) moves 8 tokens x 4 dgroups per instruction
 * instead: whole lines on the cache side, 64-byte runs on the IO side.
 *
 * Every lane resolves the cache location of its own token (slot, or the
 * gather's length and table entry), so tiles whose tokens do not share a
 * block (random slots) are moved correctly, piece by piece. Rows with no
 * cache location are skipped exactly as in the generic path.
 *
 * Inverted writes (p.inv, move_invert.cu): a large write that covers a good part of the
 * cache (KVX_CUDA_INVERT_COVER) first records, for every cache slot, the IO row
 * that writes it (a 4-byte scatter into a stream-ordered scratch array set to
 * -1 first: see inv_row_of), then runs the same tiles over 16 consecutive cache slots instead
 * of 16 consecutive IO rows: the IO side gathers whole 16-byte pieces of
 * random rows and the cache side stores whole tiles. Random slots then write
 * full sectors instead of one 16-byte half-sector per token and dgroup (the
 * sector bound of docs/benchmarks.md). A slot written twice in one call keeps
 * one of its rows, whole (R-WRITE: which one is informational only).
 */
#include "move_kernels.cuh"

#ifndef KVX_CUDA_PACKED_MIN_BLOCKS
#define KVX_CUDA_PACKED_MIN_BLOCKS 4 /* same-dtype tiles: four resident 256-thread blocks per SM (64 registers, \
                                        no spill; 1: three, -11 points on an H200 for 262144 random-slot rows) */
#endif
#ifndef KVX_CUDA_PACKED_LOADS_FIRST
#define KVX_CUDA_PACKED_LOADS_FIRST 1 /* tile write: IO loads before the slot's (0: the slot first) */
#endif

namespace kvx_cuda {

namespace {
constexpr int kWarps = kThreads / 32;
constexpr int kTile = 16; /* tokens per tile (and dgroups per tile of a large call) */
}  // namespace

#ifndef KVX_CUDA_PACKED_INVERT_MIN_ROWS
#define KVX_CUDA_PACKED_INVERT_MIN_ROWS 16384 /* tile writes of at least this many rows may go over the cache's slots \
                                                 (0: never; the other conditions: invert_ok, move_invert.cu) */
#endif
/* A tile's lane ti (< 16) of an inverted write: the IO row that writes slot g * 16 + ti, or -1
 * (inv_row_of, move.cuh). */
__device__ __forceinline__ int inv_row(const MoveParams& p, uint32_t g, uint32_t ti) {
  return inv_row_of(p, (unsigned long long)g * 16u + ti);
}

#ifndef KVX_CUDA_PACKED_SMALL_ND
#define KVX_CUDA_PACKED_SMALL_ND 8 /* small calls: dgroups per tile, 2, 4 or 8 (16: as large calls) */
#endif
#ifndef KVX_CUDA_PACKED_ND16_MIN_ROWS
#define KVX_CUDA_PACKED_ND16_MIN_ROWS 4096 /* ... a call of at least this many rows takes 16 x 16 tiles (0: only \
                                              calls the fast path counts as large, p.fuse: 131072 rows and more) */
#endif

/* Launch: p.lg_tg = 4; p.fd_c.div (pieces per head row) a multiple of 16. A tile is
 * 16 tokens x ND dgroups (ND 16, or 8 for small calls: twice the warps, half
 * the pieces each). IO side: lane L moves piece L % ND of rows L / ND + (32 / ND) k;
 * cache side: lane L moves token L % 16, dgroups L / 16 + 2 k (k < ND / 2). Shared
 * memory holds the tile as [token][dgroup], dgroup XOR (token mod ND). */
template <int ND>
__global__ void __launch_bounds__(kThreads, KVX_CUDA_PACKED_MIN_BLOCKS) move_packed(const __grid_constant__ MoveParams p) {
  dependent_entry();
  constexpr int kPer = kTile * ND / 32; /* pieces per lane */
  constexpr uint32_t kRows = 32 / ND;   /* IO rows per instruction */
  __shared__ uint4 tile[kWarps][kTile * ND];
  const uint32_t lane = threadIdx.x & 31u, wib = threadIdx.x >> 5;
  const uint32_t H = p.fd_h.div, nb = p.fd_c.div / ND; /* dgroup blocks per head */
  const bool inverted = p.inv != nullptr; /* tiles over cache slots (write) */
  const uint32_t groups =
      inverted ? (uint32_t)((p.num_slots + kTile - 1) / kTile) : (p.row_count + kTile - 1) / kTile;
  const uint32_t per_group = H * nb, per_job = groups * per_group;
  uint32_t t = blockIdx.x * (blockDim.x >> 5) + wib; /* kWarps per block, or fewer (a small call) */
  if (t >= per_job * p.njobs) return; /* warp-uniform */
  /* task -> (job, token group, head, dgroup block): a block's 8 warps take the
   * heads of one token group, neighbours in both the cache and the IO */
  const uint32_t j = t >= per_job ? 1u : 0u;
  t -= j * per_job;
  const uint32_t g = t / per_group;
  const uint32_t hb = t - g * per_group;
  const uint32_t h = hb / nb, d0 = (hb - h * nb) * ND;
  const Job& jb = p.job[j];
  const long long es = jb.cache_esize; /* == io_esize: same dtype */
  const uint32_t ti = lane & 15u, hi = lane >> 4;          /* cache side: token, first dgroup */
  const uint32_t pc = lane % ND, r0 = lane / ND;           /* IO side: piece, first row */

  /* the cache side: lane ti's token */
  Item it;
  it.job = &jb;
  it.h = it.c = 0;
  const uint32_t r = g * kTile + ti;
  it.live = r < p.row_count;
  it.row = p.row_begin + r;
  /* the cache row of lane ti's token, this head and dgroup block (nullptr: no location) */
  auto cache_row = [&]() -> char* {
    char* c = nullptr;
    if (it.live)
      c = p.kind == KIND_WRITE ? write_cache_row(p, jb, write_slot_load(p, it))
                               : gather_cache_row(p, jb, gather_meta_load(p, it));
    return c ? c + es * ((long long)h * jb.c_head + (long long)d0 * jb.c_outer) : nullptr;
  };
  const long long c_step = es * jb.c_outer; /* one dgroup further */
  /* the IO side: rows g*16 + r0 + kRows k, piece d0 + pc */
  char* io0 = jb.io + es * ((long long)(p.row_begin + g * kTile + r0) * jb.io_token + (long long)h * jb.io_head +
                            (long long)(d0 + pc) * (16 / es));
  const long long io_step = es * kRows * jb.io_token;
  uint4* s = tile[wib];
  auto at = [](uint32_t tok, uint32_t dg) { return tok * ND + (dg ^ (tok % ND)); };
  uint4 v[kPer];

  if (p.kind != KIND_WRITE) {
    /* gather: rows with no cache location leave their IO rows untouched */
    char* const crow = cache_row();
    const uint32_t live = __ballot_sync(0xFFFFFFFFu, crow != nullptr) & 0xFFFFu;
#pragma unroll
    for (int k = 0; k < kPer; ++k)
      if (crow) v[k] = ld_vec<uint4>(crow + (long long)(hi + 2 * k) * c_step);
#pragma unroll
    for (int k = 0; k < kPer; ++k) s[at(ti, hi + 2 * k)] = v[k];
    __syncwarp();
#pragma unroll
    for (int k = 0; k < kPer; ++k) {
      const uint32_t row = r0 + kRows * k;
      if ((live >> row) & 1u) st_vec<uint4>(io0 + k * io_step, s[at(row, pc)]);
    }
  } else if (inverted) {
    /* write over the cache's slots: lane ti's slot is g * 16 + ti, its IO row inv[slot] */
    const int row = inv_row(p, g, ti);
    if (__ballot_sync(0xFFFFFFFFu, row >= 0) == 0u) return; /* no row writes these slots */
    char* const io_h = jb.io + es * ((long long)h * jb.io_head + (long long)(d0 + pc) * (16 / es));
#pragma unroll
    for (int k = 0; k < kPer; ++k) {
      const int rk = __shfl_sync(0xFFFFFFFFu, row, r0 + kRows * k);
      if (rk >= 0) v[k] = ld_vec<uint4>(io_h + es * (long long)rk * jb.io_token);
    }
#pragma unroll
    for (int k = 0; k < kPer; ++k) s[at(r0 + kRows * k, pc)] = v[k];
    __syncwarp();
    if (row >= 0) {
      char* crow = write_cache_row(p, jb, (long long)g * kTile + ti);
      crow += es * ((long long)h * jb.c_head + (long long)d0 * jb.c_outer);
#pragma unroll
      for (int k = 0; k < kPer; ++k) st_vec<uint4>(crow + (long long)(hi + 2 * k) * c_step, s[at(ti, hi + 2 * k)]);
    }
  } else {
    /* write: the IO loads go out before the slot is resolved (they do not depend on
     * it), so a decode-sized call waits for one round trip, not two */
    char* crow = KVX_CUDA_PACKED_LOADS_FIRST ? nullptr : cache_row();
#pragma unroll
    for (int k = 0; k < kPer; ++k)
      if (g * kTile + r0 + kRows * k < p.row_count) v[k] = ld_vec<uint4>(io0 + k * io_step);
    if (KVX_CUDA_PACKED_LOADS_FIRST) crow = cache_row();
#pragma unroll
    for (int k = 0; k < kPer; ++k) s[at(r0 + kRows * k, pc)] = v[k];
    __syncwarp();
    if (crow) {
#pragma unroll
      for (int k = 0; k < kPer; ++k) st_vec<uint4>(crow + (long long)(hi + 2 * k) * c_step, s[at(ti, hi + 2 * k)]);
    }
  }
}

template <int ND>
static cudaError_t launch_packed_nd(const MoveParams& p, cudaStream_t stream) {
  const unsigned long long groups = ((p.inv ? p.num_slots : (unsigned long long)p.row_count) + kTile - 1) / kTile;
  const unsigned long long tasks = groups * p.fd_h.div * (p.fd_c.div / ND) * p.njobs;
  const int threads = launch_threads(p, tasks, kThreads);
  const int grid = grid_for_warps((const void*)move_packed<ND>, tasks, false, threads);
  return launch_kernel(move_packed<ND>, (unsigned)grid, (unsigned)threads, 0, stream, p);
}

cudaError_t launch_packed(const MoveParams& p, cudaStream_t stream) {
  const bool wide = KVX_CUDA_PACKED_ND16_MIN_ROWS > 0 && p.row_count >= (uint32_t)KVX_CUDA_PACKED_ND16_MIN_ROWS;
  static_assert(KVX_CUDA_PACKED_SMALL_ND == 2 || KVX_CUDA_PACKED_SMALL_ND == 4 || KVX_CUDA_PACKED_SMALL_ND == 8 ||
                    KVX_CUDA_PACKED_SMALL_ND == 16,
                "KVX_CUDA_PACKED_SMALL_ND: 2, 4, 8 or 16 dgroups per tile");
  if (!p.fuse && !wide && KVX_CUDA_PACKED_SMALL_ND != 16) return launch_packed_nd<KVX_CUDA_PACKED_SMALL_ND>(p, stream);
  return launch_packed_nd<16>(p, stream);
}

}  // namespace kvx_cuda

/* ------------------------------------------------------------------------ */
/* Quantizing writes into an FP8 HND_PACKED cache with 16-element (16-byte)
 * pack groups (vLLM's FP8 K layout): the same tile transpose with the
 * conversion on the way. A warp moves 16 tokens x 8 dgroups (128 elements of
 * one head): it reads the IO rows 512 contiguous bytes per instruction,
 * quantizes each 16-byte chunk (ConvOp, R-FP8), parks the FP8 bytes in shared
 * memory and stores the cache side 512 contiguous bytes (2 dgroups x 16
 * tokens) per instruction. */

namespace kvx_cuda {

template <class Op>
__global__ void __launch_bounds__(kThreads) move_packed_fp8(const __grid_constant__ MoveParams p) {
  dependent_entry();
  constexpr int kIn = Op::kIn;                    /* IO element bytes */
  constexpr int kEl = 16 / kIn;                   /* elements per 16-byte IO chunk */
  constexpr int kRowChunks = 128 / kEl;           /* IO chunks per tile row (128 elements) */
  constexpr int kLoads = kTile * kRowChunks / 32; /* per lane: 8 (16-bit IO) or 16 (F32) */
  constexpr int kBatch = 8;
  static_assert(kLoads % kBatch == 0, "tile geometry");
  __shared__ uint4 tile[kWarps][kTile * 8];
  const uint32_t lane = threadIdx.x & 31u, wib = threadIdx.x >> 5;
  const uint32_t H = p.fd_h.div, nt = (p.fd_c.div * p.vec) / 128; /* tiles per head */
  const bool inverted = p.inv != nullptr; /* tiles over cache slots */
  const uint32_t groups =
      inverted ? (uint32_t)((p.num_slots + kTile - 1) / kTile) : (p.row_count + kTile - 1) / kTile;
  const uint32_t per_group = H * nt, per_job = groups * per_group;
  uint32_t t = blockIdx.x * (blockDim.x >> 5) + wib; /* kWarps per block, or fewer (a small call) */
  if (t >= per_job * p.njobs) return; /* warp-uniform */
  const uint32_t j = t >= per_job ? 1u : 0u;
  t -= j * per_job;
  const uint32_t g = t / per_group;
  const uint32_t hb = t - g * per_group;
  const uint32_t h = hb / nt, t0 = hb - h * nt;
  const Job& jb = p.job[j];
  const uint32_t ti = lane & 15u, hi = lane >> 4;

  /* the cache side: lane ti's token, its slot */
  Item it;
  it.job = &jb;
  it.h = it.c = 0;
  const uint32_t r = g * kTile + ti;
  it.live = r < p.row_count;
  it.row = p.row_begin + r;
  /* inverted: lane ti's slot is g * 16 + ti, written by IO row inv[slot] (or by none) */
  const int irow = inverted ? inv_row(p, g, ti) : -1;
  if (inverted && __ballot_sync(0xFFFFFFFFu, irow >= 0) == 0u) return;
  const long long slot = inverted ? (irow >= 0 ? (long long)g * kTile + ti : -1) : write_slot_load(p, it);
  /* this head's scale and its reciprocal (fp8_rcp) */
  const float s = load_scale(p, jb, h);
  const float rc = fp8_rcp(s);
  char* crow = nullptr;
  auto resolve = [&] { /* the slot is waited for here: before the IO loads, or after them */
    crow = write_cache_row(p, jb, slot);
    if (crow) crow += (long long)h * jb.c_head + (long long)t0 * 8 * jb.c_outer; /* FP8: elements are bytes */
  };
  if (!KVX_CUDA_PACKED_LOADS_FIRST) resolve();

  /* the IO side: chunk L = k * 32 + lane of the tile is row L / kRowChunks, chunk L % kRowChunks */
  const char* io = jb.io + (long long)kIn * ((long long)(inverted ? 0u : p.row_begin + g * kTile) * jb.io_token +
                                            (long long)h * jb.io_head + (long long)t0 * 128);
  char* sb = reinterpret_cast<char*>(tile[wib]);
#pragma unroll
  for (int b0 = 0; b0 < kLoads; b0 += kBatch) {
    typename Op::InVec v[kBatch];
    bool ok[kBatch];
#pragma unroll
    for (int k = 0; k < kBatch; ++k) {
      const uint32_t L = (uint32_t)(b0 + k) * 32u + lane, row = L / kRowChunks, c = L % kRowChunks;
      long long rr = row;
      if (inverted) {
        rr = __shfl_sync(0xFFFFFFFFu, irow, (int)row);
        ok[k] = rr >= 0;
      } else {
        ok[k] = g * kTile + row < p.row_count;
      }
      if (ok[k]) v[k] = ld_vec<typename Op::InVec>(io + (long long)kIn * (rr * jb.io_token + (long long)c * kEl));
    }
#pragma unroll
    for (int k = 0; k < kBatch; ++k) {
      const uint32_t L = (uint32_t)(b0 + k) * 32u + lane, row = L / kRowChunks, c = L % kRowChunks;
      const uint32_t e0 = c * kEl, d = e0 / 16u;
      if (ok[k])
        st_vec<typename Op::OutVec>(sb + (row * 8u + (d ^ (row & 7u))) * 16u + (e0 % 16u), Op::template run<false>(v[k], s, rc, p.default_nan));
    }
  }
  if (KVX_CUDA_PACKED_LOADS_FIRST) resolve();
  __syncwarp();
  if (crow) {
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const uint32_t d = hi + 2u * k;
      st_vec<uint4>(crow + (long long)d * jb.c_outer, tile[wib][ti * 8u + (d ^ (ti & 7u))]);
    }
  }
}

template <class Op>
static cudaError_t launch_packed_fp8_op(const MoveParams& p, cudaStream_t stream) {
  const unsigned long long groups = ((p.inv ? p.num_slots : (unsigned long long)p.row_count) + kTile - 1) / kTile;
  const unsigned long long tasks = groups * p.fd_h.div * ((p.fd_c.div * p.vec) / 128) * p.njobs;
  const int threads = launch_threads(p, tasks, kThreads);
  const int grid = grid_for_warps((const void*)move_packed_fp8<Op>, tasks, false, threads);
  return launch_kernel(move_packed_fp8<Op>, (unsigned)grid, (unsigned)threads, 0, stream, p);
}

template <class In>
static cudaError_t packed_fp8_from(kvx_dtype_t dst, const MoveParams& p, cudaStream_t stream) {
  switch (dst) {
    case KVX_DTYPE_F8_E4M3: return launch_packed_fp8_op<ConvOp<In, TE4M3>>(p, stream);
    case KVX_DTYPE_F8_E5M2: return launch_packed_fp8_op<ConvOp<In, TE5M2>>(p, stream);
    default: return cudaErrorInvalidValue;
  }
}

cudaError_t launch_packed_fp8(kvx_dtype_t src, kvx_dtype_t dst, const MoveParams& p, cudaStream_t stream) {
  switch (src) {
    case KVX_DTYPE_F16: return packed_fp8_from<TF16>(dst, p, stream);
    case KVX_DTYPE_BF16: return packed_fp8_from<TBF16>(dst, p, stream);
    case KVX_DTYPE_F32: return packed_fp8_from<TF32>(dst, p, stream);
    default: return cudaErrorInvalidValue;
  }
}

/* Whether a tile write goes over the cache's slots (launch_inverted, move_invert.cu). */
bool packed_invert_ok(const MoveParams& p, unsigned long long rows, uint32_t H, uint32_t pieces_per_head) {
  if (!invert_ok(p, rows, (unsigned long long)KVX_CUDA_PACKED_INVERT_MIN_ROWS)) return false;
  /* the kernels' 32-bit warp index: tiles x heads x pieces per head / 8 x 2 jobs */
  return (p.num_slots / 16 + 1) * H * (pieces_per_head / 8 + 1) * 2 < 0x7F000000ull;
}

}  // namespace kvx_cuda
