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
 * writes the other side 512 contiguous bytes per instruction. The generic
 * fast path (move_kernels.cuh) moves 8 tokens x 4 dgroups per instruction
 * instead: whole lines on the cache side, 64-byte runs on the IO side.
 *
 * Every lane resolves the cache location of its own token (slot, or the
 * gather's length and table entry), so tiles whose tokens do not share a
 * block (random slots) are moved correctly, piece by piece. Rows with no
 * cache location are skipped exactly as in the generic path.
 */
#include "move_kernels.cuh"

namespace kvx_cuda {

namespace {
constexpr int kWarps = kThreads / 32;
constexpr int kTile = 16;  /* tokens and dgroups per tile */
constexpr int kPer = kTile * kTile / 32; /* pieces per lane */
}  // namespace

/* Launch: p.lg_tg = 4; p.fd_c.div (pieces per head row) a multiple of 16. */
__global__ void __launch_bounds__(kThreads) move_packed(const __grid_constant__ MoveParams p) {
  __shared__ uint4 tile[kWarps][kTile * kTile];
  const uint32_t lane = threadIdx.x & 31u, wib = threadIdx.x >> 5;
  const uint32_t H = p.fd_h.div, nb = p.fd_c.div / kTile; /* dgroup blocks per head */
  const uint32_t groups = (p.row_count + kTile - 1) / kTile;
  const uint32_t per_group = H * nb, per_job = groups * per_group;
  uint32_t t = blockIdx.x * kWarps + wib;
  if (t >= per_job * p.njobs) return; /* warp-uniform */
  /* task -> (job, token group, head, dgroup block): a block's 8 warps take the
   * heads of one token group, neighbours in both the cache and the IO */
  const uint32_t j = t >= per_job ? 1u : 0u;
  t -= j * per_job;
  const uint32_t g = t / per_group;
  const uint32_t hb = t - g * per_group;
  const uint32_t h = hb / nb, d0 = (hb - h * nb) * kTile;
  const Job& jb = p.job[j];
  const long long es = jb.cache_esize; /* == io_esize: same dtype */
  const uint32_t ti = lane & 15u, hi = lane >> 4;

  /* the cache side: lane ti's token */
  Item it;
  it.job = &jb;
  it.h = it.c = 0;
  const uint32_t r = g * kTile + ti;
  it.live = r < p.row_count;
  it.row = p.row_begin + r;
  char* crow = nullptr;
  if (it.live)
    crow = p.kind == KIND_WRITE ? write_cache_row(p, jb, write_slot_load(p, it))
                                : gather_cache_row(p, jb, gather_meta_load(p, it));
  if (crow) crow += es * ((long long)h * jb.c_head + (long long)d0 * jb.c_outer);
  const long long c_step = es * jb.c_outer; /* one dgroup further */
  /* the IO side: rows g*16 + 2k + hi, pieces d0 + ti */
  char* io0 = jb.io + es * ((long long)(p.row_begin + g * kTile + hi) * jb.io_token + (long long)h * jb.io_head +
                            (long long)(d0 + ti) * (16 / es));
  const long long io_step = es * 2 * jb.io_token; /* two rows further */
  uint4* s = tile[wib];
  uint4 v[kPer];

  if (p.kind != KIND_WRITE) {
    /* gather: rows with no cache location leave their IO rows untouched */
    const uint32_t live = __ballot_sync(0xFFFFFFFFu, crow != nullptr) & 0xFFFFu;
#pragma unroll
    for (int k = 0; k < kPer; ++k)
      if (crow) v[k] = ld_vec<uint4>(crow + (long long)(hi + 2 * k) * c_step);
#pragma unroll
    for (int k = 0; k < kPer; ++k) s[ti * kTile + ((hi + 2 * k) ^ ti)] = v[k];
    __syncwarp();
#pragma unroll
    for (int k = 0; k < kPer; ++k) {
      const uint32_t row = 2 * k + hi;
      if ((live >> row) & 1u) st_vec<uint4>(io0 + k * io_step, s[row * kTile + (ti ^ row)]);
    }
  } else {
#pragma unroll
    for (int k = 0; k < kPer; ++k)
      if (g * kTile + 2 * k + hi < p.row_count) v[k] = ld_vec<uint4>(io0 + k * io_step);
#pragma unroll
    for (int k = 0; k < kPer; ++k) {
      const uint32_t row = 2 * k + hi;
      s[row * kTile + (ti ^ row)] = v[k];
    }
    __syncwarp();
    if (crow) {
#pragma unroll
      for (int k = 0; k < kPer; ++k)
        st_vec<uint4>(crow + (long long)(hi + 2 * k) * c_step, s[ti * kTile + ((hi + 2 * k) ^ ti)]);
    }
  }
}

cudaError_t launch_packed(const MoveParams& p, cudaStream_t stream) {
  const unsigned long long groups = ((unsigned long long)p.row_count + kTile - 1) / kTile;
  const unsigned long long tasks = groups * p.fd_h.div * (p.fd_c.div / kTile) * p.njobs;
  const int grid = grid_for_warps((const void*)move_packed, tasks, false);
  move_packed<<<grid, kThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace kvx_cuda
