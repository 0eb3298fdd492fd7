/*
 * move_fp4_gather.cu -- cuda_fp4_gather: KVX 1.2 FP4 gathers on CUDA (dequantize
 * into F16/BF16/F32, or raw copy). The per-block and fast gather kernels; what
 * the write shares is in move_fp4.cuh.
 */
#include "move_fp4.cuh"

#include <type_traits>

namespace kvx_fp4 {
namespace {

/* The NVFP4 gathers' pair tables (fp4_fast.h nv_pair_entry), F16 and BF16, made by the compiler */
__device__ const kvx_fp4_fast::NvPairs<false> kNvPairsF16;
__device__ const kvx_fp4_fast::NvPairs<true> kNvPairsBF16;
/* Every scale byte's FP32 bits (fp4_fast.h ScaleBits): E4M3 for NVFP4, UE8M0 for the MX formats */
__device__ const kvx_fp4_fast::ScaleBits<true> kScaleBitsNV;
__device__ const kvx_fp4_fast::ScaleBits<false> kScaleBitsMX;
/* The MX gathers' pair tables (fp4_fast.h MxPairs), F16 and BF16 */
__device__ const kvx_fp4_fast::MxPairs<false> kMxPairsF16;
__device__ const kvx_fp4_fast::MxPairs<true> kMxPairsBF16;

template <int B, int DT>
__global__ void __launch_bounds__(256, B == 16 ? 4 : 2) gather_kernel(Params P) {
  kvx_cuda::dependent_entry();
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

/* The 16 output bytes of a chunk of a NaN block: every value is the scale's
 * NaN, its bits as fp4_decode_with (F32) or through convert.h (F16, BF16: the
 * bits numpy and ml_dtypes give). Out of line: the hot path only tests sf. */
template <int DT>
__device__ __noinline__ void store_nan16(char* dst, float sf) {
  unsigned w = __float_as_uint(sf);
  if (DT != KVX_DTYPE_F32) w = (unsigned)out16<DT>(sf) * 0x10001u;
  *(uint4*)dst = make_uint4(w, w, w, w);
}

/* Two products of 16-bit values of type DT, each rounded once to nearest (subnormals kept; BF16 as
 * a fused multiply-add of -0, which sm_80 has). */
template <int DT>
__device__ __forceinline__ uint32_t mul2(uint32_t a, uint32_t b) {
  uint32_t r;
  if (DT == KVX_DTYPE_F16) {
    asm("mul.rn.f16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
  } else {
    asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(0x80008000u)); /* + -0: a x b */
  }
  return r;
}

/* A fast gather's 16-byte output chunk: a plain store, or one marked streaming (KVX_FP4_G_STORE_CS). */
__device__ __forceinline__ void st_out(char* dst, uint4 v) {
  if (KVX_FP4_G_STORE_CS)
    __stcs((uint4*)dst, v);
  else
    *(uint4*)dst = v;
}

/* Rows per warp of the fast gather into IO elements of `es` bytes. */
__host__ __device__ constexpr unsigned gather_rows_per_warp(int es) {
  return es == 4 ? KVX_FP4_G_ROWS_32 : KVX_FP4_G_ROWS_16;
}

/* NV: NVFP4 (E4M3 scales, a global scale); else an MX format (E8M0). DENSE: heads packed in the rows
 * (P.lin) and a multiple of 32 chunks a row (dense_ok), so a lane's chunks of a batch lie at constant
 * steps from one address. */
template <int B, int DT, bool NV, bool DENSE>
__global__ void KVX_FP4_G_BOUNDS gather_fast_kernel(Params P) {
  kvx_cuda::dependent_entry();
  constexpr int ES = Es<DT>::value, VPC = 16 / ES, CPB = B / VPC, NI = VPC == 4 ? KVX_FP4_G32_NI : KVX_FP4_G16_NI;
  __shared__ float e2m1[16];
  __shared__ float sdec[256];
  /* Each side's NVFP4 global scale by head (the per-tensor value in every entry), read once per CTA: a
   * per-head scale loaded from global memory beside its first use stalled the warp a round trip a chunk. */
  __shared__ float sg[2][KVX_FP4_G_SMEM_HEADS > 0 ? KVX_FP4_G_SMEM_HEADS : 1];
  /* MX formats into F16/BF16: a code byte's two E2M1 values in the output type, one word */
  constexpr bool PAIRS = KVX_FP4_G_MX_PAIRS && ES == 2 && !NV;
  constexpr bool MXT = PAIRS && !KVX_FP4_G_MX_ALU; /* the pairs' table in shared memory */
  __shared__ __align__(16) uint32_t pairs[MXT ? 256 : 1];
  /* NVFP4 into F16/BF16: per code byte its two values' signed 2^k and the byte permute that picks A
   * or B (fp4_fast.h nv_pair_entry) */
  constexpr bool NVP = KVX_FP4_G_NV_PAIRS && ES == 2 && NV;
  constexpr bool NVT = NVP && KVX_FP4_G_NV_ALU != 1; /* the table in shared memory */
  __shared__ __align__(16) uint2 nvp[NVT ? 256 : 1];
  const bool g_smem = KVX_FP4_G_SMEM_HEADS > 0 && P.H <= KVX_FP4_G_SMEM_HEADS;
  if (threadIdx.x < 16) e2m1[threadIdx.x] = kvx_ref::e2m1_to_f32(threadIdx.x);
  if (MXT) {
    const uint4* tab = (const uint4*)(DT == KVX_DTYPE_BF16 ? kMxPairsBF16.w : kMxPairsF16.w);
    for (unsigned k = threadIdx.x; k < 64; k += blockDim.x) ((uint4*)pairs)[k] = __ldg(tab + k);
  }
  for (unsigned k = threadIdx.x; k < 256; k += blockDim.x)
    sdec[k] = KVX_FP4_G_SCALE_TAB ? __uint_as_float(__ldg((NV ? kScaleBitsNV.w : kScaleBitsMX.w) + k))
                                  : kvx_ref::fp4_scale_f32(P.format, (uint8_t)k);
  if (NVT) {
    const uint4* tab = (const uint4*)(DT == KVX_DTYPE_BF16 ? kNvPairsBF16.w : kNvPairsF16.w);
    for (unsigned k = threadIdx.x; k < 128; k += blockDim.x) ((uint4*)nvp)[k] = __ldg(tab + k);
  }
  if (NV && g_smem)
    for (unsigned k = threadIdx.x; k < 2u * (unsigned)P.H; k += blockDim.x) {
      const Side& S = P.side[k >= (unsigned)P.H];
      const unsigned h = k >= (unsigned)P.H ? k - (unsigned)P.H : k;
      sg[k >= (unsigned)P.H][h] = S.g ? S.g[S.g_per_head ? h : 0u] : 1.0f;
    }
  __syncthreads();
  const unsigned lane = threadIdx.x & 31u;
  const unsigned sdec_a = saddr(sdec), pairs_a = saddr(pairs), nvp_a = saddr(nvp);
  /* R rows per warp: many short-lived warps keep more code loads in flight than
   * a warp that streams 32 rows with one batch loaded ahead (docs/fp4.md). */
  constexpr unsigned R = gather_rows_per_warp(ES);
  const unsigned long long r0 = (((unsigned long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5) * R;
  if (r0 >= P.rows) return;
  const float g0 = g_smem || !P.side[0].g ? 1.0f : P.side[0].g[0], g1 = g_smem || !P.side[1].g ? 1.0f : P.side[1].g[0];
  unsigned bl = kNoBlock, ol = 0;
  if (lane < R && r0 + lane < P.rows) {
    const unsigned long long row = P.row_begin + r0 + lane;
    const unsigned long long s = row < 0x80000000ull ? divu(P.fd_msl, (unsigned)row) : row / P.max_seq_len;
    const unsigned long long t = row - s * P.max_seq_len;
    long long L = ld_index(P.seq_lens, P.len64, s);
    if (L > (long long)P.max_seq_len) L = P.max_seq_len;
    if (L >= 0 && t < (unsigned long long)L) {
      const unsigned long long jb = t < 0x80000000ull ? divu(P.fd_bs, (unsigned)t) : t / P.block_size;
      long long b = -1;
      if (P.ragged) {
        const long long lo = ld_index(P.indptr, P.indptr64, s), hi = ld_index(P.indptr, P.indptr64, s + 1);
        if (!(lo < 0 || hi < lo || (long long)t >= hi - lo || (unsigned long long)(lo + t) >= P.indices_count))
          b = ld_index(P.indices, P.idx64, lo + t);
      } else if (jb < P.max_blocks) {
        b = ld_index(P.indices, P.idx64, s * P.max_blocks + jb);
      }
      if (b >= 0 && (unsigned long long)b < P.num_blocks) {
        bl = (unsigned)b;
        ol = (unsigned)(t - jb * P.block_size);
      }
    }
  }
  const unsigned n = P.rows - r0 < (unsigned long long)R ? (unsigned)(P.rows - r0) : R;
  const unsigned NC = (unsigned)(P.H * P.J) * CPB, NQ = (NC + 32u * NI - 1u) / (32u * NI), T = n * 2u * NQ;
  /* The warp's work is a stream of T batches (row i, side, batch q of NI
   * chunks per lane); the codes and scale bytes of batch k + 1 are loaded
   * while batch k is decoded and stored. */
  uint32_t ncw[NI];
  unsigned nsb[NI];
  bool nvalid = false;
  unsigned ni = 0, ns = 0, nq = 0; /* the batch held in ncw, nsb */
  auto load = [&](unsigned i, unsigned side, unsigned q) {
    const unsigned b = __shfl_sync(0xFFFFFFFFu, bl, i), off = __shfl_sync(0xFFFFFFFFu, ol, i);
    nvalid = b != kNoBlock;
    if (!nvalid) return;
    const Side& S = P.side[side];
    const char* code_row = S.codes + ((long long)b * S.c_block + (long long)off * S.c_token) / 2;
    const unsigned char* sc_row = (const unsigned char*)S.scales + (long long)b * S.s_block + (long long)off * S.s_token;
    if (DENSE) { /* one address per batch, each chunk's a constant step from it */
      const unsigned cq = q * 32u * NI;
      const char* cp = code_row + (cq + lane) * (unsigned)(VPC / 2);
      const unsigned char* sp = sc_row + (cq + lane) / CPB;
      auto ld = [&](int m) {
        ncw[m] = VPC == 8 ? __ldg((const unsigned*)(cp + m * 32 * (VPC / 2)))
                          : __ldg((const unsigned short*)(cp + m * 32 * (VPC / 2)));
        nsb[m] = __ldg(sp + m * (32 / CPB));
      };
      if (cq + 32u * NI <= NC) { /* a whole batch: no tests (the same for every lane) */
#pragma unroll
        for (int m = 0; m < NI; ++m) ld(m);
      } else {
#pragma unroll
        for (int m = 0; m < NI; ++m) {
          ncw[m] = 0;
          nsb[m] = 0;
          if (cq + 32u * m < NC) ld(m);
        }
      }
    }
#pragma unroll
    for (int m = 0; m < (DENSE ? 0 : NI); ++m) {
      const unsigned c = q * 32u * NI + lane + 32u * m;
      ncw[m] = 0;
      nsb[m] = 0;
      if (c < NC) {
        const char* src;
        const unsigned char* sp;
        if (P.lin) { /* chunk c: code bytes at c * VPC / 2, its block's scale at c / CPB */
          src = code_row + c * (unsigned)(VPC / 2);
          sp = sc_row + c / CPB;
        } else {
          const unsigned bi = c / CPB, p = c % CPB;
          const unsigned h = divu(P.fd_j, bi), j = bi - h * (unsigned)P.J;
          src = code_row + ((long long)h * S.c_head + (long long)j * B) / 2 + p * (VPC / 2);
          sp = sc_row + (long long)h * S.s_head + (long long)j * S.s_dim;
        }
        if (VPC == 8) {
          ncw[m] = __ldg((const unsigned*)src);
        } else {
          ncw[m] = __ldg((const unsigned short*)src);
        }
        nsb[m] = __ldg(sp);
      }
    }
  };
  load(0, 0, 0);
#pragma unroll 1
  for (unsigned k = 0; k < T; ++k) {
    uint32_t cw[NI];
    unsigned sb[NI];
#pragma unroll
    for (int m = 0; m < NI; ++m) {
      cw[m] = ncw[m];
      sb[m] = nsb[m];
    }
    const bool valid = nvalid;
    const unsigned i = ni, side = ns, q = nq;
    if (++nq == NQ) {
      nq = 0;
      if (++ns == 2) {
        ns = 0;
        ++ni;
      }
    }
    if (k + 1 < T) load(ni, ns, nq);
    if (!valid) continue;
    const Side& S = P.side[side];
    char* io_row = S.io + (long long)(P.row_begin + r0 + i) * S.io_token * ES;
    const float g_t = side ? g1 : g0;
    /* dense: the batch's chunks at a constant step from one output address, and the global scale of a
     * per-tensor g read once per batch */
    const bool per_head = NV && S.g_per_head;
    const float g_b = NV && !per_head && g_smem ? sg[side][0] : g_t;
    char* dst0 = io_row + (size_t)(q * 32u * NI + lane) * 16u;
    /* The NVFP4 global scale of chunk c: dense, found here; else that of head h, which the caller found
     * (0 for a per-tensor g, which every sg entry holds) */
    auto g_of = [&](unsigned c, unsigned h, auto PH) -> float {
      if (DENSE) {
        if (!(KVX_FP4_G_PH_SPLIT ? decltype(PH)::value : per_head)) return g_b;
        h = divu(P.fd_j, c / CPB);
        return g_smem ? sg[side][h] : S.g[h];
      }
      return g_smem ? sg[side][h] : S.g_per_head ? S.g[h] : g_t;
    };
    /* the batch's chunks; PH: a per-head global scale, WHOLE: every chunk in the row (the dense kernels
     * test both once per batch, KVX_FP4_G_PH_SPLIT and KVX_FP4_G_WHOLE_SPLIT) */
    auto chunks = [&](auto PH, auto WHOLE) {
#pragma unroll
      for (int m = 0; m < NI; ++m) {
        const unsigned c = q * 32u * NI + lane + 32u * m;
        if (DENSE ? decltype(WHOLE)::value || q * 32u * NI + 32u * m < NC : c < NC) {
          unsigned h = 0;
          char* dst;
          if (DENSE) {
            dst = dst0 + m * 512;
          } else if (P.lin) { /* chunk c: output bytes at c * 16 */
            if (S.g_per_head) h = divu(P.fd_j, c / CPB); /* else h = 0: sg[side][0] holds the per-tensor g */
            dst = io_row + (size_t)c * 16u;
          } else {
            const unsigned bi = c / CPB, p = c % CPB;
            h = divu(P.fd_j, bi);
            const unsigned j = bi - h * (unsigned)P.J;
            dst = io_row + ((long long)h * S.io_head + (long long)j * B + (long long)p * VPC) * ES;
          }
          const float sf = KVX_FP4_G_SADDR ? lds_f32(sdec_a + sb[m] * 4u) : sdec[sb[m]];
          if (!KVX_FP4_G_NAN_LATE && sf != sf) { /* a NaN block: rare, out of line */
            store_nan16<DT>(dst, sf);
            continue;
          }
          if (PAIRS && (DT == KVX_DTYPE_F16 ? sb[m] - 113u <= 29u : sb[m] - 1u <= 253u)) {
            /* E2M1 x 2^e is exact in FP32, so the FP32 path rounds it once to the output type; with
             * 2^e a normal value of that type (F16: e in [-14, 15], BF16: [-126, 127]) one packed
             * product rounds the same exact value once (docs/fp4.md, "Eleventh round") */
            const uint32_t sc = DT == KVX_DTYPE_F16 ? (sb[m] - 112u) << 10 : sb[m] << 7;
            uint32_t o[4];
            if (KVX_FP4_G_MX_ALU) { /* the code byte's two values by byte permutes, times 2^14 (2^126) exactly */
              constexpr bool BFo = DT == KVX_DTYPE_BF16;
              constexpr uint32_t K = BFo ? 0x7E807E80u : 0x74007400u;
              o[0] = mul2<DT>(mul2<DT>(kvx_fp4_fast::e2m1_word_scaled<BFo, 0>(cw[m]), K), sc * 0x10001u);
              o[1] = mul2<DT>(mul2<DT>(kvx_fp4_fast::e2m1_word_scaled<BFo, 1>(cw[m]), K), sc * 0x10001u);
              o[2] = mul2<DT>(mul2<DT>(kvx_fp4_fast::e2m1_word_scaled<BFo, 2>(cw[m]), K), sc * 0x10001u);
              o[3] = mul2<DT>(mul2<DT>(kvx_fp4_fast::e2m1_word_scaled<BFo, 3>(cw[m]), K), sc * 0x10001u);
            } else {
#pragma unroll
              for (int kk = 0; kk < 4; ++kk) {
                const unsigned x = (cw[m] >> (8 * kk)) & 0xFFu;
                o[kk] = mul2<DT>(KVX_FP4_G_SADDR ? lds_u32(pairs_a + x * 4u) : pairs[x], sc * 0x10001u);
              }
            }
            st_out(dst, make_uint4(o[0], o[1], o[2], o[3]));
            continue;
          }
          uint32_t ab;
          if (NVP && kvx_fp4_fast::nv_ab<DT == KVX_DTYPE_BF16>(sf, g_of(c, h, PH), &ab)) {
            /* 2^k A or 2^k B, one packed product per code byte, the oracle's bytes wherever nv_ab takes
             * the block (fp4_fast.h; docs/fp4.md, "Fourteenth round") */
            uint32_t o[4];
            if (KVX_FP4_G_NV_ALU) { /* words 0 .. NA - 1 by byte permutes (nv_alu_word), the rest from the table */
              constexpr int NA = KVX_FP4_G_NV_ALU == 1 ? 4 : 2;
              const uint32_t zab = ab & 0x80008000u;
              uint32_t sels[2], mul, op;
              kvx_fp4_fast::nv_alu_sels(cw[m], sels);
              constexpr bool BFo = DT == KVX_DTYPE_BF16;
              kvx_fp4_fast::nv_alu_word<BFo, 0>(cw[m], sels[0], ab, zab, &mul, &op);
              o[0] = mul2<DT>(mul, op);
              kvx_fp4_fast::nv_alu_word<BFo, 1>(cw[m], sels[0] >> 16, ab, zab, &mul, &op);
              o[1] = mul2<DT>(mul, op);
              if (NA == 4) {
                kvx_fp4_fast::nv_alu_word<BFo, 2>(cw[m], sels[1], ab, zab, &mul, &op);
                o[2] = mul2<DT>(mul, op);
                kvx_fp4_fast::nv_alu_word<BFo, 3>(cw[m], sels[1] >> 16, ab, zab, &mul, &op);
                o[3] = mul2<DT>(mul, op);
              }
            }
            if (NVT) {
#pragma unroll
              for (int kk = KVX_FP4_G_NV_ALU ? 2 : 0; kk < 4; ++kk) {
                const unsigned x = (cw[m] >> (8 * kk)) & 0xFFu;
                const uint2 e = KVX_FP4_G_SADDR ? lds_u2(nvp_a + x * 8u) : nvp[x];
                /* prmt in PTX (fp4_fast.h): __byte_perm masks its selector first, which these need not */
                o[kk] = mul2<DT>(e.x, kvx_fp4_fast::prmt(ab, 0, e.y));
              }
            }
            st_out(dst, make_uint4(o[0], o[1], o[2], o[3]));
            continue;
          }
          if (KVX_FP4_G_NAN_LATE && sf != sf) { /* a NaN block (no fast path takes one): rare, out of line */
            store_nan16<DT>(dst, sf);
            continue;
          }
          float v[VPC];
          if (NV) {
            const float g = g_of(c, h, PH);
#pragma unroll
            for (int kk = 0; kk < VPC; ++kk) v[kk] = __fmul_rn(__fmul_rn(e2m1[(cw[m] >> (4 * kk)) & 15u], sf), g);
          } else {
#pragma unroll
            for (int kk = 0; kk < VPC; ++kk) v[kk] = __fmul_rn(e2m1[(cw[m] >> (4 * kk)) & 15u], sf);
          }
          unsigned o[4];
#pragma unroll
          for (int kk = 0; kk < 4; ++kk) {
            if (ES == 4) {
              o[kk] = __float_as_uint(v[kk]);
            } else if (DT == KVX_DTYPE_F16) { /* not NaN: two RN conversions in one instruction */
              const __half2 hh = __floats2half2_rn(v[2 * kk], v[2 * kk + 1]);
              memcpy(&o[kk], &hh, 4);
            } else {
              const __nv_bfloat162 hh = __floats2bfloat162_rn(v[2 * kk], v[2 * kk + 1]);
              memcpy(&o[kk], &hh, 4);
            }
          }
          st_out(dst, make_uint4(o[0], o[1], o[2], o[3]));
        }
      }
    };
    /* WHOLE: every chunk of the batch lies in the row (dense kernels, KVX_FP4_G_WHOLE_SPLIT) */
    const bool whole = KVX_FP4_G_WHOLE_SPLIT && DENSE && q * 32u * NI + 32u * NI <= NC;
    if (KVX_FP4_G_PH_SPLIT && DENSE && per_head)
      chunks(std::true_type{}, std::false_type{});
    else if (whole)
      chunks(std::false_type{}, std::true_type{});
    else
      chunks(std::false_type{}, std::false_type{});
  }
}

/* The kernel of a gather: per-block (pick) or fast (pick_fast), by block size and IO dtype. */
template <int B>
Kernel pick_dt(int dt) {
  switch (dt) {
    case KVX_DTYPE_F16:
      return gather_kernel<B, KVX_DTYPE_F16>;
    case KVX_DTYPE_BF16:
      return gather_kernel<B, KVX_DTYPE_BF16>;
    case KVX_DTYPE_F32:
      return gather_kernel<B, KVX_DTYPE_F32>;
    default:
      return gather_kernel<B, 0>;
  }
}

Kernel pick(const Params& P) {
  const int dt = P.raw ? 0 : P.io_dtype;
  return P.B == 32 ? pick_dt<32>(dt) : pick_dt<16>(dt);
}

template <int B, bool NV, bool DENSE>
Kernel pick_fast_dt(int dt) {
  switch (dt) {
    case KVX_DTYPE_F16:
      return gather_fast_kernel<B, KVX_DTYPE_F16, NV, DENSE>;
    case KVX_DTYPE_BF16:
      return gather_fast_kernel<B, KVX_DTYPE_BF16, NV, DENSE>;
    default:
      return gather_fast_kernel<B, KVX_DTYPE_F32, NV, DENSE>;
  }
}

/* The dense kernels' condition: heads packed, and a row's 16-byte chunks of IO a multiple of 32 */
bool dense_ok(const Params& P) {
  const unsigned long long chunks = (unsigned long long)P.H * P.J * P.B * P.io_esize / 16u;
  return KVX_FP4_G_DENSE && lin_ok(P) && chunks % 32u == 0; /* P.lin is set at the launch */
}

template <bool DENSE>
Kernel pick_fast_dense(const Params& P) {
  if (P.B == 32) return pick_fast_dt<32, false, DENSE>(P.io_dtype);
  return P.format == kvx_ref::FP4_NVFP4 ? pick_fast_dt<16, true, DENSE>(P.io_dtype)
                                        : pick_fast_dt<16, false, DENSE>(P.io_dtype);
}

/* NVFP4 and the MX formats (MXFP4, and OCP MXFP4's 32-value blocks) in kernels of their own: the MX
 * gathers into F16/BF16 take the packed products, whose table NVFP4's kernel does not build */
Kernel pick_fast(const Params& P) {
  return dense_ok(P) ? pick_fast_dense<true>(P) : pick_fast_dense<false>(P);
}

}  // namespace
}  // namespace kvx_fp4

namespace kvx_ref {
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
  if (fast_ok(P))
    return launch_fast(pick_fast(P), P, rows, (cudaStream_t)stream, KVX_FP4_G_THREADS, 0,
                       KVX_FP4_G_THREADS / 32 * gather_rows_per_warp(P.io_esize));
  return launch(pick(P), P, rows, (cudaStream_t)stream);
}

}  // namespace kvx_ref
