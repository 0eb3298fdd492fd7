/*
 * cuda_bench.cu -- bandwidth and latency of the CUDA backend (kvx_plan.h level).
 *
 * Figures (docs/cuda-reference.md, held against the targets of docs/benchmarks.md):
 *   1. the roofline: cudaMemcpyAsync device-to-device, 1 GiB and 256 MiB,
 *      counting bytes read plus bytes written;
 *   2. large write and gather (>= 1 GiB moved, far beyond the 50 MB L2), one
 *      call per timing, CUDA events, median of the repeats after warm-up;
 *      bandwidth counts K and V, bytes read plus bytes written;
 *   3. decode-sized calls (1..256 tokens): device time per call under CUDA
 *      graph replay (a graph of kGraphCalls dependent calls, median replay / calls),
 *      and the host-side cost of one eager call.
 * After timing, every large case is checked in full on the device against a
 * naive one-thread-per-element reference kernel (convert.h software
 * conversions) that ran on the same inputs: mismatching bytes are counted.
 *
 *   4. decode-sized calls of every layout and dtype under graph replay, warm
 *      (the same buffers) and cold (every call on other rows, slots or
 *      sequence, 512 regions).
 *   kvx_cuda_bench [--quick] [--reps N] [--no-small | --small-only] [--filter TEXT]
 * Values are random finite numbers in [-4, 4] (never zeros, never NaN).
 */
#include <cuda_runtime.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "convert.h"
#include "kvx_plan.h"

using namespace kvx_ref;

#define CK(x)                                                                                        \
  do {                                                                                               \
    cudaError_t e_ = (x);                                                                            \
    if (e_ != cudaSuccess) {                                                                         \
      fprintf(stderr, "CUDA error %s at %s:%d (%s)\n", cudaGetErrorString(e_), __FILE__, __LINE__, #x); \
      exit(2);                                                                                       \
    }                                                                                                \
  } while (0)
#define KS(x)                                                                          \
  do {                                                                                 \
    kvx_status_t s_ = (x);                                                             \
    if (s_ != KVX_STATUS_OK) {                                                         \
      fprintf(stderr, "status %d at %s:%d (%s)\n", (int)s_, __FILE__, __LINE__, #x); \
      exit(3);                                                                         \
    }                                                                                  \
  } while (0)

static int g_reps = 20;
static const char* g_filter = nullptr; /* --filter: only the cases whose name holds it */
constexpr int kWarm = 3;
constexpr int kGraphCalls = 32;

static const char* dt_name(kvx_dtype_t d) {
  switch (d) {
    case KVX_DTYPE_F16: return "F16";
    case KVX_DTYPE_BF16: return "BF16";
    case KVX_DTYPE_F32: return "F32";
    case KVX_DTYPE_F8_E4M3: return "E4M3";
    case KVX_DTYPE_F8_E5M2: return "E5M2";
    default: return "?";
  }
}

/* ------------------------------------------------------------------------ */
/* Device helpers: fill with random values, naive references, compare.       */

__device__ __forceinline__ uint32_t hash32(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  x ^= x >> 33;
  return (uint32_t)x;
}

__global__ void fill_kernel(char* p, size_t count, int dt, uint64_t seed) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < count; i += (size_t)gridDim.x * blockDim.x) {
    const uint32_t h = hash32(seed * 0x9E3779B97F4A7C15ull + i);
    const float f = ((float)(h >> 8) * (1.0f / 16777216.0f) * 8.0f - 4.0f) + 1e-3f;
    switch (dt) {
      case KVX_DTYPE_F16: {
        const uint16_t v = f32_to_f16(f);
        memcpy(p + 2 * i, &v, 2);
        break;
      }
      case KVX_DTYPE_BF16: {
        const uint16_t v = f32_to_bf16(f);
        memcpy(p + 2 * i, &v, 2);
        break;
      }
      case KVX_DTYPE_F32: memcpy(p + 4 * i, &f, 4); break;
      case KVX_DTYPE_F8_E4M3: p[i] = (char)f32_to_e4m3(f); break;
      default: p[i] = (char)f32_to_e5m2(f); break;
    }
  }
}

static void fill(void* p, size_t count, kvx_dtype_t dt, uint64_t seed) {
  fill_kernel<<<1024, 256>>>((char*)p, count, dt, seed);
  CK(cudaGetLastError());
}

__device__ __forceinline__ size_t cache_off(const CacheTensorPlan& c, uint64_t b, uint64_t t, uint64_t h, uint64_t d) {
  return (size_t)(b * c.s_block + t * c.s_token + h * c.s_head + (d / c.pack) * c.s_dim_outer +
                  (d % c.pack) * c.s_dim_inner);
}

__device__ void ref_convert(const char* src, kvx_dtype_t sdt, char* dst, kvx_dtype_t ddt, float scale) {
  if (sdt == ddt) {
    memcpy(dst, src, dtype_size(sdt));
    return;
  }
  const float f = load_as_f32(src, sdt);
  if (is_fp8(ddt))
    *(uint8_t*)dst = quantize_fp8(ddt, f, scale); /* inputs are finite: no NaN bits to argue about */
  else
    encode_from_f32(dst, ddt, f);
}

/* Naive write: one thread per (token, head, dim, K|V). */
__global__ void ref_write_kernel(WritePlan p) {
  const uint64_t total = (uint64_t)p.num_tokens * p.num_kv_heads * p.head_dim * 2;
  for (uint64_t u = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; u < total; u += (uint64_t)gridDim.x * blockDim.x) {
    uint64_t x = u;
    const uint64_t d = x % p.head_dim;
    x /= p.head_dim;
    const uint64_t h = x % p.num_kv_heads;
    x /= p.num_kv_heads;
    const uint64_t i = x % p.num_tokens;
    const int kv = (int)(x / p.num_tokens);
    const int64_t slot = load_index(p.slots, p.slot_dtype, i);
    if (slot < 0 || slot == p.invalid_slot || (uint64_t)slot >= (uint64_t)p.num_blocks * p.block_size) continue;
    const CacheTensorPlan& c = kv ? p.v_cache : p.k_cache;
    const IoTensorPlan& io = kv ? p.value : p.key;
    const ScalePlan& sp = kv ? p.v_scale : p.k_scale;
    const float scale = sp.kind == SCALE_PER_TENSOR ? sp.ptr[0] : sp.kind == SCALE_PER_HEAD ? sp.ptr[h] : 1.0f;
    const char* src = (const char*)io.data + (i * io.s_token + h * io.s_head + d * io.s_dim) * dtype_size(io.dtype);
    char* dst = (char*)c.data + cache_off(c, slot / p.block_size, slot % p.block_size, h, d) * dtype_size(c.dtype);
    ref_convert(src, io.dtype, dst, c.dtype, scale);
  }
}

/* Naive gather (PACKED, RAGGED, KV_OFFSETS; valid tables). */
__global__ void ref_gather_kernel(GatherPlan p) {
  const uint64_t rows = (uint64_t)p.seq_count * p.beam_width * p.max_seq_len;
  const uint64_t total = rows * p.num_kv_heads * p.head_dim * 2;
  for (uint64_t u = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; u < total; u += (uint64_t)gridDim.x * blockDim.x) {
    uint64_t x = u;
    const uint64_t d = x % p.head_dim;
    x /= p.head_dim;
    const uint64_t h = x % p.num_kv_heads;
    x /= p.num_kv_heads;
    const uint64_t r = x % rows;
    const int kv = (int)(x / rows);
    const uint64_t t = r % p.max_seq_len, sb = r / p.max_seq_len, s = sb / p.beam_width;
    const int64_t L = load_index(p.seq_lens, p.seq_lens_dtype, s);
    if ((int64_t)t >= (L < (int64_t)p.max_seq_len ? L : (int64_t)p.max_seq_len)) continue;
    const CacheTensorPlan& c = kv ? p.v_cache : p.k_cache;
    const IoTensorPlan& io = kv ? p.value : p.key;
    const char* src;
    const uint64_t j = t / p.block_size, off = t % p.block_size;
    if (p.format == KVX_BLOCK_TABLE_KV_OFFSETS) {
      const uint32_t e = (uint32_t)load_index(p.indices, KVX_DTYPE_S32, (sb * 2 + kv) * p.max_blocks_per_seq + j);
      const char* base = (const char*)((e >> 31) ? p.pool_secondary : p.pool_primary);
      src = base + (e & 0x7FFFFFFFu) * p.bytes_per_block +
            ((h * p.block_size + off) * p.head_dim + d) * dtype_size(c.dtype);
    } else {
      const int64_t b = p.format == KVX_BLOCK_TABLE_PACKED
                            ? load_index(p.indices, p.index_dtype, s * p.max_blocks_per_seq + j)
                            : load_index(p.indices, p.index_dtype, (uint64_t)load_index(p.indptr, p.indptr_dtype, s) + t);
      src = (const char*)c.data + cache_off(c, (uint64_t)b, off, h, d) * dtype_size(c.dtype);
    }
    char* dst = (char*)io.data + (r * io.s_token + h * io.s_head + d * io.s_dim) * dtype_size(io.dtype);
    ref_convert(src, c.dtype, dst, io.dtype, 1.0f);
  }
}

__global__ void compare_kernel(const uint8_t* a, const uint8_t* b, size_t n, unsigned long long* bad) {
  unsigned long long local = 0;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
    local += a[i] != b[i];
  if (local) atomicAdd(bad, local);
}

static unsigned long long count_diff(const void* a, const void* b, size_t n) {
  static unsigned long long* d_bad = nullptr;
  if (!d_bad) CK(cudaMalloc(&d_bad, sizeof *d_bad));
  CK(cudaMemset(d_bad, 0, sizeof *d_bad));
  compare_kernel<<<2048, 256>>>((const uint8_t*)a, (const uint8_t*)b, n, d_bad);
  CK(cudaGetLastError());
  unsigned long long h = 0;
  CK(cudaMemcpy(&h, d_bad, sizeof h, cudaMemcpyDeviceToHost));
  return h;
}

/* A plain grid-stride 16-byte copy (the roofline's kernel-side counterpart). */
/* The store floor of a random-slot HND_PACKED write: one 16-byte store per piece to
 * precomputed addresses (no loads of data or slots), for comparison only. */
__global__ void scatter_floor_kernel(const unsigned long long* __restrict__ addr, unsigned n) {
  const unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) *(uint4*)addr[i] = make_uint4(i, i, i, i);
}

__global__ void plain_copy_kernel(const uint4* __restrict__ a, uint4* __restrict__ b, size_t n) {
  const size_t stride = (size_t)gridDim.x * blockDim.x;
  size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  for (; i + 3 * stride < n; i += 4 * stride) {
    const uint4 x0 = a[i], x1 = a[i + stride], x2 = a[i + 2 * stride], x3 = a[i + 3 * stride];
    b[i] = x0;
    b[i + stride] = x1;
    b[i + 2 * stride] = x2;
    b[i + 3 * stride] = x3;
  }
  for (; i < n; i += stride) b[i] = a[i];
}

/* ------------------------------------------------------------------------ */
/* Timing.                                                                    */

template <class F>
static double median_us(F&& call, cudaStream_t s, int reps) {
  for (int i = 0; i < kWarm; ++i) call();
  std::vector<cudaEvent_t> ev(2 * reps);
  for (auto& e : ev) CK(cudaEventCreate(&e));
  for (int i = 0; i < reps; ++i) {
    CK(cudaEventRecord(ev[2 * i], s));
    call();
    CK(cudaEventRecord(ev[2 * i + 1], s));
  }
  CK(cudaStreamSynchronize(s));
  CK(cudaGetLastError());
  std::vector<double> t(reps);
  for (int i = 0; i < reps; ++i) {
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, ev[2 * i], ev[2 * i + 1]));
    t[i] = ms * 1e3;
  }
  for (auto& e : ev) CK(cudaEventDestroy(e));
  std::sort(t.begin(), t.end());
  return t[reps / 2];
}

struct Row {
  std::string name;
  double bytes, us;
  unsigned long long bad;
};

static std::vector<Row> g_rows;
static std::vector<Row> g_sector; /* random-slot HND_PACKED writes, bytes = sector-bound bytes */
static double g_copy_gbs = 0;

static void report(const std::string& name, double bytes, double us, unsigned long long bad) {
  g_rows.push_back({name, bytes, us, bad});
  const double gbs = bytes / us * 1e-3;
  printf("  %-44s %9.1f MB %9.1f us %8.1f GB/s %6.1f%% of copy  %s\n", name.c_str(), bytes * 1e-6, us, gbs,
         g_copy_gbs > 0 ? 100.0 * gbs / g_copy_gbs : 0.0, bad ? "MISMATCH" : "verified");
  fflush(stdout);
}

/* ------------------------------------------------------------------------ */
/* Layouts for H heads, D dims, bs tokens per block, nb blocks.              */

enum LayoutKind { NHD = 0, HND = 1, HND_PACKED = 2 };
static const char* layout_name(LayoutKind l) { return l == NHD ? "NHD" : l == HND ? "HND" : "HND_PACKED"; }

static CacheTensorPlan make_cache(void* data, kvx_dtype_t dt, LayoutKind l, uint32_t nb, uint32_t bs, uint32_t H,
                                  uint32_t D) {
  CacheTensorPlan c;
  memset(&c, 0, sizeof c);
  c.data = data;
  c.dtype = dt;
  c.pack = 1;
  const int64_t blk = (int64_t)bs * H * D;
  c.s_block = blk;
  if (l == NHD) {
    c.s_token = (int64_t)H * D;
    c.s_head = D;
    c.s_dim_outer = 1;
  } else if (l == HND) {
    c.s_head = (int64_t)bs * D;
    c.s_token = D;
    c.s_dim_outer = 1;
  } else {
    const int64_t pack = 16 / (int64_t)dtype_size(dt);
    c.pack = pack;
    c.s_head = (int64_t)D * bs;
    c.s_dim_outer = (int64_t)bs * pack;
    c.s_token = pack;
    c.s_dim_inner = 1;
  }
  (void)nb;
  return c;
}

static IoTensorPlan make_io(void* data, kvx_dtype_t dt, uint32_t H, uint32_t D) {
  return IoTensorPlan{data, dt, (int64_t)H * D, (int64_t)D, 1};
}

/* A DEVICE write of n tokens through S64 slots (invalid slot -1); caches, IO and scales left to the caller. */
static WritePlan write_plan(uint32_t n, uint32_t H, uint32_t D, uint32_t bs, uint32_t nb, const void* slots) {
  WritePlan w;
  memset(&w, 0, sizeof w);
  w.memory = KVX_MEMORY_DEVICE;
  w.num_tokens = n;
  w.num_kv_heads = H;
  w.head_dim = D;
  w.block_size = bs;
  w.num_blocks = nb;
  w.slots = slots;
  w.slot_dtype = KVX_DTYPE_S64;
  w.invalid_slot = -1;
  return w;
}

/* A DEVICE gather of `seqs` sequences (beam 1) of at most msl tokens, S32 lengths and
 * indices; the table, caches and outputs left to the caller. */
static GatherPlan gather_plan(uint32_t seqs, uint32_t msl, uint32_t mbps, kvx_block_table_format_t fmt,
                              const void* lens, uint32_t H, uint32_t D, uint32_t bs, uint32_t nb) {
  GatherPlan g;
  memset(&g, 0, sizeof g);
  g.memory = KVX_MEMORY_DEVICE;
  g.num_kv_heads = H;
  g.head_dim = D;
  g.block_size = bs;
  g.num_blocks = nb;
  g.seq_count = seqs;
  g.beam_width = 1;
  g.max_seq_len = msl;
  g.max_blocks_per_seq = mbps;
  g.format = fmt;
  g.seq_lens = lens;
  g.seq_lens_dtype = KVX_DTYPE_S32;
  g.index_dtype = KVX_DTYPE_S32;
  return g;
}

/* ------------------------------------------------------------------------ */

struct Pools {
  void* a[2];  /* write: IO K/V; gather: cache K/V */
  void* b[2];  /* write: cache K/V; gather: output K/V */
  void* ref[2];
  size_t bytes;
};

static void bench_write(Pools& P, cudaStream_t s, kvx_dtype_t io_dt, kvx_dtype_t cache_dt, LayoutKind l,
                        bool prefill, uint32_t N, void* d_slots_rand, void* d_slots_prefill, const float* d_scales,
                        ScaleKind sk) {
  const uint32_t H = 8, D = 128, bs = 16, nb = N / bs;
  char name[128];
  snprintf(name, sizeof name, "write %s->%s %s %s%s", dt_name(io_dt), dt_name(cache_dt), layout_name(l),
           prefill ? "prefill" : "random", sk == SCALE_PER_HEAD ? " per-head" : sk == SCALE_PER_TENSOR ? " per-tensor" : "");
  if (g_filter && !strstr(name, g_filter)) return;
  const size_t io_elems = (size_t)N * H * D, cache_elems = (size_t)nb * bs * H * D;
  WritePlan w = write_plan(N, H, D, bs, nb, prefill ? d_slots_prefill : d_slots_rand);
  w.k_scale = ScalePlan{sk, d_scales};
  w.v_scale = ScalePlan{sk, d_scales + 8};
  for (int kv = 0; kv < 2; ++kv) {
    fill(P.a[kv], io_elems, io_dt, 11 + kv);
    fill(P.b[kv], cache_elems, cache_dt, 21 + kv);
  }
  w.key = make_io(P.a[0], io_dt, H, D);
  w.value = make_io(P.a[1], io_dt, H, D);
  const size_t cache_bytes = cache_elems * dtype_size(cache_dt);
  /* Reference first, on a copy of the initial caches. */
  for (int kv = 0; kv < 2; ++kv) CK(cudaMemcpy(P.ref[kv], P.b[kv], cache_bytes, cudaMemcpyDeviceToDevice));
  WritePlan r = w;
  r.k_cache = make_cache(P.ref[0], cache_dt, l, nb, bs, H, D);
  r.v_cache = make_cache(P.ref[1], cache_dt, l, nb, bs, H, D);
  ref_write_kernel<<<4096, 256>>>(r);
  CK(cudaGetLastError());
  CK(cudaDeviceSynchronize());
  w.k_cache = make_cache(P.b[0], cache_dt, l, nb, bs, H, D);
  w.v_cache = make_cache(P.b[1], cache_dt, l, nb, bs, H, D);
  const double us = median_us([&] { KS(cuda_write(w, s)); }, s, g_reps);
  const unsigned long long bad = count_diff(P.b[0], P.ref[0], cache_bytes) + count_diff(P.b[1], P.ref[1], cache_bytes);
  const double bytes = 2.0 * io_elems * (dtype_size(io_dt) + dtype_size(cache_dt));
  report(name, bytes, us, bad);
  if (l == HND_PACKED && !prefill) {
    /* Random slots scatter one 16-byte piece per (token, head, pack group): below
     * DRAM's 32-byte sector each store costs a whole sector (partial-sector
     * write: sector read + write back). Bound: IO read + 2 x 32 B per piece. */
    const double pieces = 2.0 * io_elems * dtype_size(cache_dt) / 16.0;
    const double sector_bytes = 2.0 * io_elems * dtype_size(io_dt) + pieces * 64.0;
    const double bound_us = g_copy_gbs > 0 ? sector_bytes / (g_copy_gbs * 1e3) : 0;
    printf("  %-44s sector bound %.1f us (%.0f MB of sectors at copy rate): %.1f%% of the bound\n", "",
           bound_us, sector_bytes * 1e-6, bound_us > 0 ? 100.0 * bound_us / us : 0.0);
    char n2[160];
    snprintf(n2, sizeof n2, "%s [vs 32-byte sector bound]", name);
    g_sector.push_back({n2, sector_bytes, us, bad});
  }
}

static void bench_gather(Pools& P, cudaStream_t s, kvx_dtype_t cache_dt, kvx_dtype_t io_dt, LayoutKind l,
                         kvx_block_table_format_t fmt, uint32_t S, uint32_t msl, const void* d_table,
                         const void* d_lens, const void* d_indptr, const void* d_ragged, bool ragged_lengths) {
  const uint32_t H = 8, D = 128, bs = 16, mbps = msl / bs, nb = S * mbps;
  const size_t rows = (size_t)S * msl, elems = rows * H * D;
  char name[128];
  snprintf(name, sizeof name, "gather %s %s->%s %s%s", fmt == KVX_BLOCK_TABLE_PACKED ? "PACKED" : fmt == KVX_BLOCK_TABLE_RAGGED ? "RAGGED" : "KV_OFFSETS",
           dt_name(cache_dt), dt_name(io_dt), fmt == KVX_BLOCK_TABLE_KV_OFFSETS ? "pool(HND)" : layout_name(l),
           ragged_lengths ? " mixed lengths" : "");
  if (g_filter && !strstr(name, g_filter)) return;
  GatherPlan g = gather_plan(S, msl, mbps, fmt, d_lens, H, D, bs, nb);
  if (fmt == KVX_BLOCK_TABLE_PACKED) {
    g.indices = d_table;
    g.indices_count = S * mbps;
  } else if (fmt == KVX_BLOCK_TABLE_RAGGED) {
    g.indices = d_ragged;
    g.indices_count = (uint32_t)rows;
    g.indptr = d_indptr;
    g.indptr_dtype = KVX_DTYPE_S32;
  } else {
    /* KV_OFFSETS: pool = the K cache buffer as HND blocks, K and V of a block
     * in consecutive pool blocks (TRT-LLM style: V index = K index + 1). */
    g.indices = d_table;
    g.indices_count = S * 2 * mbps;
    g.pool_primary = P.a[0];
    g.bytes_per_block = (uint64_t)H * bs * D * dtype_size(cache_dt);
  }
  for (int kv = 0; kv < 2; ++kv) {
    fill(P.a[kv], elems, cache_dt, 31 + kv);
    fill(P.b[kv], elems, io_dt, 41 + kv);
    CK(cudaMemcpy(P.ref[kv], P.b[kv], elems * dtype_size(io_dt), cudaMemcpyDeviceToDevice));
  }
  g.k_cache = make_cache(P.a[0], cache_dt, l, nb, bs, H, D);
  g.v_cache = make_cache(P.a[1], cache_dt, l, nb, bs, H, D);
  GatherPlan r = g;
  r.key = make_io(P.ref[0], io_dt, H, D);
  r.value = make_io(P.ref[1], io_dt, H, D);
  ref_gather_kernel<<<4096, 256>>>(r);
  CK(cudaGetLastError());
  CK(cudaDeviceSynchronize());
  g.key = make_io(P.b[0], io_dt, H, D);
  g.value = make_io(P.b[1], io_dt, H, D);
  const double us = median_us([&] { KS(cuda_gather(g, s)); }, s, g_reps);
  const size_t out_bytes = elems * dtype_size(io_dt);
  const unsigned long long bad = count_diff(P.b[0], P.ref[0], out_bytes) + count_diff(P.b[1], P.ref[1], out_bytes);
  /* Bytes moved: only gathered rows count (ragged lengths gather fewer). */
  std::vector<int32_t> lens(S);
  CK(cudaMemcpy(lens.data(), d_lens, S * 4, cudaMemcpyDeviceToHost));
  double gathered = 0;
  for (uint32_t i = 0; i < S; ++i) gathered += std::min<int64_t>(lens[i], msl);
  const double bytes = 2.0 * gathered * H * D * (dtype_size(io_dt) + dtype_size(cache_dt));
  report(name, bytes, us, bad);
}

/* Decode-sized calls: device time per call under graph replay. */
static double graph_us_per_call(cudaStream_t s, const std::function<void()>& call) {
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  for (int i = 0; i < kGraphCalls; ++i) call();
  CK(cudaStreamEndCapture(s, &graph));
  CK(cudaGraphInstantiate(&exec, graph, 0));
  const double us = median_us([&] { CK(cudaGraphLaunch(exec, s)); }, s, g_reps);
  CK(cudaGraphExecDestroy(exec));
  CK(cudaGraphDestroy(graph));
  return us / kGraphCalls;
}

static double eager_host_us(cudaStream_t s, const std::function<void()>& call) {
  for (int i = 0; i < 10; ++i) call();
  CK(cudaStreamSynchronize(s));
  const int n = 200;
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < n; ++i) call();
  const auto t1 = std::chrono::steady_clock::now();
  CK(cudaStreamSynchronize(s));
  return std::chrono::duration<double, std::micro>(t1 - t0).count() / n;
}

/* Decode-sized calls of every layout and dtype under graph replay, two ways:
 * "warm", a graph of kGraphCalls calls on the same buffers (what a replayed
 * decode step costs when its data is in L2), and "cold", kRotGraphs graphs of
 * kGraphCalls calls each, every call on its own IO rows, slots or sequence
 * (kRotGraphs x kGraphCalls regions, far more than L2 holds), replayed in turn:
 * device time per call = the rotation's time / its calls. */
constexpr int kRotGraphs = 16;

static void small_all(Pools& P, cudaStream_t s, uint32_t N, uint32_t S, uint32_t msl, void* d_slots_rand,
                      const float* d_scales, void* d_table, void* d_kvtable, void* d_full, void* d_indptr,
                      void* d_ragged) {
  const uint32_t H = 8, D = 128, bs = 16, mbps = msl / bs, regions = kRotGraphs * kGraphCalls;
  printf("\n[small calls, every layout] 8 KV heads x 128, block 16; device us per call under graph replay: warm (the "
         "same buffers, %d calls per graph) / cold (%d graphs x %d calls, each call on other rows, slots or "
         "sequence)\n", kGraphCalls, kRotGraphs, kGraphCalls);
  const uint32_t toks[] = {1u, 16u, 64u, 256u};
  printf("  %-40s", "case");
  for (uint32_t n : toks) printf(" %13u", n);
  printf("\n");
  struct Case {
    bool write;
    kvx_dtype_t io, cache;
    LayoutKind l;
    ScaleKind sk;
    kvx_block_table_format_t fmt;
  };
  std::vector<Case> cases;
  for (kvx_dtype_t dt : {KVX_DTYPE_F16, KVX_DTYPE_BF16, KVX_DTYPE_F32})
    for (LayoutKind l : {NHD, HND, HND_PACKED}) cases.push_back({true, dt, dt, l, SCALE_ONE, KVX_BLOCK_TABLE_PACKED});
  cases.push_back({true, KVX_DTYPE_BF16, KVX_DTYPE_F8_E4M3, HND, SCALE_PER_HEAD, KVX_BLOCK_TABLE_PACKED});
  cases.push_back({true, KVX_DTYPE_F16, KVX_DTYPE_F8_E4M3, NHD, SCALE_PER_TENSOR, KVX_BLOCK_TABLE_PACKED});
  for (kvx_dtype_t dt : {KVX_DTYPE_F16, KVX_DTYPE_BF16, KVX_DTYPE_F32})
    for (LayoutKind l : {NHD, HND, HND_PACKED}) cases.push_back({false, dt, dt, l, SCALE_ONE, KVX_BLOCK_TABLE_PACKED});
  cases.push_back({false, KVX_DTYPE_F8_E4M3, KVX_DTYPE_F8_E4M3, NHD, SCALE_ONE, KVX_BLOCK_TABLE_PACKED});
  cases.push_back({false, KVX_DTYPE_F16, KVX_DTYPE_F16, NHD, SCALE_ONE, KVX_BLOCK_TABLE_RAGGED});
  cases.push_back({false, KVX_DTYPE_F16, KVX_DTYPE_F16, HND, SCALE_ONE, KVX_BLOCK_TABLE_KV_OFFSETS});
  double worst_warm = 0, worst_cold = 0;
  for (const Case& c : cases) {
    char name[96];
    if (c.write)
      snprintf(name, sizeof name, "write %s->%s %s%s", dt_name(c.io), dt_name(c.cache), layout_name(c.l),
               c.sk == SCALE_PER_HEAD ? " per-head" : c.sk == SCALE_PER_TENSOR ? " per-tensor" : "");
    else
      snprintf(name, sizeof name, "gather %s %s->%s %s",
               c.fmt == KVX_BLOCK_TABLE_PACKED ? "PACKED" : c.fmt == KVX_BLOCK_TABLE_RAGGED ? "RAGGED" : "KV_OFFSETS",
               dt_name(c.cache), dt_name(c.io), layout_name(c.l));
    if (g_filter && !strstr(name, g_filter)) continue;
    /* write: IO in a[], caches in b[]; gather: caches in a[], outputs in b[] */
    for (int kv = 0; kv < 2; ++kv) {
      fill(P.a[kv], P.bytes / 4, c.write ? c.io : c.cache, 71 + kv);
      fill(P.b[kv], P.bytes / 4, c.write ? c.cache : c.io, 81 + kv);
    }
    CK(cudaDeviceSynchronize()); /* the fills run on the legacy stream, which `s` does not wait for */
    printf("  %-40s", name);
    for (uint32_t n : toks) {
      /* the call on region i (0 <= i < regions) */
      auto call_of = [&](uint32_t i) -> std::function<void()> {
        const size_t io_row = (size_t)(i % (N / 256u)) * n; /* distinct rows for every region (N >= 256 x 256) */
        if (c.write) {
          const uint32_t nb = N / bs;
          WritePlan w = write_plan(n, H, D, bs, nb, (int64_t*)d_slots_rand + io_row); /* distinct random slots */
          w.k_cache = make_cache(P.b[0], c.cache, c.l, nb, bs, H, D);
          w.v_cache = make_cache(P.b[1], c.cache, c.l, nb, bs, H, D);
          w.key = make_io((char*)P.a[0] + io_row * H * D * dtype_size(c.io), c.io, H, D);
          w.value = make_io((char*)P.a[1] + io_row * H * D * dtype_size(c.io), c.io, H, D);
          w.k_scale = ScalePlan{c.sk, d_scales};
          w.v_scale = ScalePlan{c.sk, d_scales + 8};
          return [w, s] { KS(cuda_write(w, s)); };
        }
        const uint32_t sq = i % S, nb = S * mbps;
        GatherPlan g = gather_plan(1, n, mbps, c.fmt, d_full /* msl >= n */, H, D, bs, nb);
        if (c.fmt == KVX_BLOCK_TABLE_PACKED) {
          g.indices = (int32_t*)d_table + (size_t)sq * mbps;
          g.indices_count = mbps;
        } else if (c.fmt == KVX_BLOCK_TABLE_RAGGED) {
          g.indices = d_ragged;
          g.indices_count = S * msl;
          g.indptr = (int32_t*)d_indptr + sq;
          g.indptr_dtype = KVX_DTYPE_S32;
        } else {
          g.indices = (int32_t*)d_kvtable + (size_t)sq * 2 * mbps;
          g.indices_count = 2 * mbps;
          g.pool_primary = P.a[0];
          g.bytes_per_block = (uint64_t)H * bs * D * dtype_size(c.cache);
        }
        g.k_cache = make_cache(P.a[0], c.cache, c.l, nb, bs, H, D);
        g.v_cache = make_cache(P.a[1], c.cache, c.l, nb, bs, H, D);
        g.key = make_io((char*)P.b[0] + io_row * H * D * dtype_size(c.io), c.io, H, D);
        g.value = make_io((char*)P.b[1] + io_row * H * D * dtype_size(c.io), c.io, H, D);
        return [g, s] { KS(cuda_gather(g, s)); };
      };
      const double warm = graph_us_per_call(s, call_of(0));
      std::vector<cudaGraphExec_t> execs(kRotGraphs);
      for (int gi = 0; gi < kRotGraphs; ++gi) {
        cudaGraph_t graph;
        CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
        for (int k = 0; k < kGraphCalls; ++k) call_of((uint32_t)(gi * kGraphCalls + k))();
        CK(cudaStreamEndCapture(s, &graph));
        CK(cudaGraphInstantiate(&execs[gi], graph, 0));
        CK(cudaGraphDestroy(graph));
      }
      const double cold = median_us([&] { for (auto& e : execs) CK(cudaGraphLaunch(e, s)); }, s, g_reps) / regions;
      for (auto& e : execs) CK(cudaGraphExecDestroy(e));
      worst_warm = std::max(worst_warm, warm);
      worst_cold = std::max(worst_cold, cold);
      printf(" %5.2f / %5.2f", warm, cold);
    }
    printf("\n");
    fflush(stdout);
  }
  printf("  worst over every case and size: warm %.2f us, cold %.2f us per call\n", worst_warm, worst_cold);
  if (!g_filter || strstr("scatter floor", g_filter)) {
    /* The 256-token random-slot HND_PACKED writes store one 16-byte piece per (token, head,
     * pack group) and side: time the stores alone, warm, in the kernel's order (a warp's
     * 32 stores go to 32 tokens' random blocks). */
    const uint32_t n = 256, nb = N / bs;
    std::vector<int64_t> slots(n);
    CK(cudaMemcpy(slots.data(), d_slots_rand, n * 8, cudaMemcpyDeviceToHost));
    for (int es : {2, 4}) {
      const uint32_t x = 16 / es, G = D / x; /* pack groups per head */
      std::vector<unsigned long long> addr;
      for (int kv = 0; kv < 2; ++kv)
        for (uint32_t h = 0; h < H; ++h)
          for (uint32_t g = 0; g < G; ++g)
            for (uint32_t i = 0; i < n; ++i) {
              const uint64_t b = (uint64_t)slots[i] / bs, t = (uint64_t)slots[i] % bs;
              addr.push_back((unsigned long long)(uintptr_t)P.b[kv] + (((b * H + h) * G + g) * bs + t) * 16ull);
            }
      (void)nb;
      unsigned long long* d_addr = nullptr;
      CK(cudaMalloc(&d_addr, addr.size() * 8));
      CK(cudaMemcpy(d_addr, addr.data(), addr.size() * 8, cudaMemcpyHostToDevice));
      const unsigned cnt = (unsigned)addr.size();
      const double us = graph_us_per_call(s, [&] { scatter_floor_kernel<<<(cnt + 255) / 256, 256, 0, s>>>(d_addr, cnt); });
      printf("  scatter floor, %s HND_PACKED random write of %u tokens: %u stores of 16 bytes alone, warm %.2f us per call\n",
             es == 2 ? "F16/BF16" : "F32", n, cnt, us);
      CK(cudaFree(d_addr));
    }
  }
}

int main(int argc, char** argv) {
  bool quick = false, small = true, large = true;
  for (int i = 1; i < argc; ++i) {
    if (!strcmp(argv[i], "--quick")) quick = true;
    else if (!strcmp(argv[i], "--no-small")) small = false;
    else if (!strcmp(argv[i], "--small-only")) large = false;
    else if (!strcmp(argv[i], "--reps") && i + 1 < argc) g_reps = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--filter") && i + 1 < argc) g_filter = argv[++i];
  }
  if (!cuda_available()) {
    fprintf(stderr, "kvx_cuda_bench: no usable CUDA device\n");
    return 77;
  }
  int dev = 0;
  CK(cudaGetDevice(&dev));
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, dev));
  int mem_clock_khz = 0, bus_width = 0;
  cudaDeviceGetAttribute(&mem_clock_khz, cudaDevAttrMemoryClockRate, dev);
  cudaDeviceGetAttribute(&bus_width, cudaDevAttrGlobalMemoryBusWidth, dev);
  printf("device: %s, %d SMs, L2 %d MB, %.1f GiB, memory bus %d bit\n", prop.name, prop.multiProcessorCount,
         prop.l2CacheSize >> 20, prop.totalGlobalMem / 1073741824.0, bus_width);
  printf("method: CUDA events around each call, median of %d after %d warm-up; bytes = read + written (K and V)\n",
         g_reps, kWarm);

  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));

  Pools P;
  const uint32_t N = quick ? 65536 : 262144;        /* write tokens */
  const uint32_t S = quick ? 64 : 256, msl = 2048;  /* gather: S sequences x msl tokens */
  const size_t max_rows = std::max<size_t>(N, (size_t)S * msl);
  P.bytes = max_rows * 8 * 128 * 4;
  for (int kv = 0; kv < 2; ++kv) {
    CK(cudaMalloc(&P.a[kv], P.bytes));
    CK(cudaMalloc(&P.b[kv], P.bytes));
    CK(cudaMalloc(&P.ref[kv], P.bytes));
  }

  /* 1. roofline */
  printf("\n[roofline] cudaMemcpyAsync device to device\n");
  for (size_t mb : {1024, 256}) {
    const size_t bytes = mb << 20;
    const double us = median_us([&] { CK(cudaMemcpyAsync(P.b[0], P.a[0], bytes, cudaMemcpyDeviceToDevice, s)); }, s, g_reps);
    const double gbs = 2.0 * bytes / us * 1e-3;
    if (mb == 1024) g_copy_gbs = gbs;
    printf("  copy %4zu MiB: %9.1f us %8.1f GB/s (read + write)\n", mb, us, gbs);
  }
  {
    /* a plain streaming kernel over the same 1 GiB, for comparison only */
    const size_t n16 = (1024ull << 20) / 16;
    const double us = median_us([&] { plain_copy_kernel<<<132 * 8, 256, 0, s>>>((const uint4*)P.a[0], (uint4*)P.b[0], n16); }, s, g_reps);
    printf("  plain kernel copy 1024 MiB: %9.1f us %8.1f GB/s (%.1f%% of cudaMemcpyAsync)\n", us, 2.0 * n16 * 16 / us * 1e-3,
           100.0 * 2.0 * n16 * 16 / us * 1e-3 / g_copy_gbs);
  }

  /* Slots and tables. */
  std::mt19937_64 rng(12345);
  std::vector<int64_t> slots_rand(N), slots_prefill(N);
  {
    std::vector<int64_t> perm(N);
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    slots_rand = perm;
    std::vector<int64_t> blocks(N / 16);
    std::iota(blocks.begin(), blocks.end(), 0);
    std::shuffle(blocks.begin(), blocks.end(), rng);
    for (uint32_t i = 0; i < N; ++i) slots_prefill[i] = blocks[i / 16] * 16 + i % 16;
  }
  void *d_slots_rand, *d_slots_prefill;
  CK(cudaMalloc(&d_slots_rand, N * 8));
  CK(cudaMalloc(&d_slots_prefill, N * 8));
  CK(cudaMemcpy(d_slots_rand, slots_rand.data(), N * 8, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(d_slots_prefill, slots_prefill.data(), N * 8, cudaMemcpyHostToDevice));
  float scales[16];
  for (int i = 0; i < 16; ++i) scales[i] = 0.01f + 0.003f * i;
  float* d_scales;
  CK(cudaMalloc(&d_scales, sizeof scales));
  CK(cudaMemcpy(d_scales, scales, sizeof scales, cudaMemcpyHostToDevice));

  const uint32_t mbps = msl / 16, nblk = S * mbps;
  std::vector<int32_t> table(nblk), kvtable((size_t)S * 2 * mbps), full_lens(S, (int32_t)msl), mixed_lens(S);
  std::vector<int32_t> indptr(S + 1), ragged((size_t)S * msl);
  {
    std::vector<int32_t> perm(nblk);
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    for (uint32_t i = 0; i < nblk; ++i) table[i] = perm[i];
    /* KV_OFFSETS: pool blocks 2p (K) and 2p+1 (V) over the first half of the buffer pairs */
    std::vector<int32_t> pp(nblk / 2);
    std::iota(pp.begin(), pp.end(), 0);
    std::shuffle(pp.begin(), pp.end(), rng);
    for (uint32_t sq = 0; sq < S; ++sq)
      for (uint32_t j = 0; j < mbps; ++j) {
        const int32_t p = pp[(sq * mbps + j) % pp.size()];
        kvtable[((size_t)sq * 2 + 0) * mbps + j] = 2 * p;
        kvtable[((size_t)sq * 2 + 1) * mbps + j] = 2 * p + 1;
      }
    for (uint32_t sq = 0; sq < S; ++sq) mixed_lens[sq] = (int32_t)(1 + rng() % msl);
    for (uint32_t sq = 0; sq <= S; ++sq) indptr[sq] = (int32_t)(sq * msl);
    for (uint32_t sq = 0; sq < S; ++sq)
      for (uint32_t t = 0; t < msl; ++t) ragged[(size_t)sq * msl + t] = table[sq * mbps + t / 16];
  }
  auto up = [](const void* h, size_t n) {
    void* d;
    CK(cudaMalloc(&d, n));
    CK(cudaMemcpy(d, h, n, cudaMemcpyHostToDevice));
    return d;
  };
  void* d_table = up(table.data(), table.size() * 4);
  void* d_kvtable = up(kvtable.data(), kvtable.size() * 4);
  void* d_full = up(full_lens.data(), S * 4);
  void* d_mixed = up(mixed_lens.data(), S * 4);
  void* d_indptr = up(indptr.data(), indptr.size() * 4);
  void* d_ragged = up(ragged.data(), ragged.size() * 4);

  /* 2. large calls */
  if (large) {
  printf("\n[write] %u tokens, 8 KV heads x 128, block 16, S64 slots (random unique, or prefill = whole blocks)\n", N);
  for (kvx_dtype_t dt : {KVX_DTYPE_F16, KVX_DTYPE_BF16, KVX_DTYPE_F32}) {
    bench_write(P, s, dt, dt, NHD, false, N, d_slots_rand, d_slots_prefill, d_scales, SCALE_ONE);
    bench_write(P, s, dt, dt, HND, false, N, d_slots_rand, d_slots_prefill, d_scales, SCALE_ONE);
    bench_write(P, s, dt, dt, HND_PACKED, true, N, d_slots_rand, d_slots_prefill, d_scales, SCALE_ONE);
    bench_write(P, s, dt, dt, HND_PACKED, false, N, d_slots_rand, d_slots_prefill, d_scales, SCALE_ONE);
  }
  bench_write(P, s, KVX_DTYPE_F16, KVX_DTYPE_F8_E4M3, HND, false, N, d_slots_rand, d_slots_prefill, d_scales, SCALE_ONE);
  bench_write(P, s, KVX_DTYPE_BF16, KVX_DTYPE_F8_E5M2, NHD, false, N, d_slots_rand, d_slots_prefill, d_scales, SCALE_PER_TENSOR);
  bench_write(P, s, KVX_DTYPE_F16, KVX_DTYPE_F8_E4M3, NHD, false, N, d_slots_rand, d_slots_prefill, d_scales, SCALE_PER_TENSOR);
  bench_write(P, s, KVX_DTYPE_BF16, KVX_DTYPE_F8_E4M3, NHD, false, N, d_slots_rand, d_slots_prefill, d_scales, SCALE_PER_TENSOR);
  bench_write(P, s, KVX_DTYPE_F16, KVX_DTYPE_F8_E5M2, NHD, false, N, d_slots_rand, d_slots_prefill, d_scales, SCALE_PER_TENSOR);
  bench_write(P, s, KVX_DTYPE_BF16, KVX_DTYPE_F8_E4M3, HND, false, N, d_slots_rand, d_slots_prefill, d_scales, SCALE_PER_HEAD);
  bench_write(P, s, KVX_DTYPE_F16, KVX_DTYPE_F8_E5M2, HND_PACKED, true, N, d_slots_rand, d_slots_prefill, d_scales, SCALE_PER_TENSOR);
  bench_write(P, s, KVX_DTYPE_F32, KVX_DTYPE_F8_E4M3, HND_PACKED, true, N, d_slots_rand, d_slots_prefill, d_scales, SCALE_PER_HEAD);
  bench_write(P, s, KVX_DTYPE_BF16, KVX_DTYPE_F8_E4M3, HND_PACKED, false, N, d_slots_rand, d_slots_prefill, d_scales, SCALE_PER_HEAD);
  bench_write(P, s, KVX_DTYPE_F32, KVX_DTYPE_F8_E4M3, NHD, false, N, d_slots_rand, d_slots_prefill, d_scales, SCALE_PER_HEAD);
  bench_write(P, s, KVX_DTYPE_F32, KVX_DTYPE_F16, NHD, false, N, d_slots_rand, d_slots_prefill, d_scales, SCALE_ONE);

  printf("\n[gather] %u sequences x %u tokens, 8 KV heads x 128, block 16, random block permutation, padded output\n", S, msl);
  for (kvx_dtype_t dt : {KVX_DTYPE_F16, KVX_DTYPE_BF16, KVX_DTYPE_F32})
    for (LayoutKind l : {NHD, HND, HND_PACKED})
      bench_gather(P, s, dt, dt, l, KVX_BLOCK_TABLE_PACKED, S, msl, d_table, d_full, nullptr, nullptr, false);
  bench_gather(P, s, KVX_DTYPE_F8_E4M3, KVX_DTYPE_F8_E4M3, NHD, KVX_BLOCK_TABLE_PACKED, S, msl, d_table, d_full, nullptr, nullptr, false);
  bench_gather(P, s, KVX_DTYPE_F16, KVX_DTYPE_F16, NHD, KVX_BLOCK_TABLE_RAGGED, S, msl, nullptr, d_full, d_indptr, d_ragged, false);
  bench_gather(P, s, KVX_DTYPE_F16, KVX_DTYPE_F16, HND, KVX_BLOCK_TABLE_KV_OFFSETS, S, msl, d_kvtable, d_full, nullptr, nullptr, false);
  bench_gather(P, s, KVX_DTYPE_F16, KVX_DTYPE_F16, NHD, KVX_BLOCK_TABLE_PACKED, S, msl, d_table, d_mixed, nullptr, nullptr, true);
  bench_gather(P, s, KVX_DTYPE_BF16, KVX_DTYPE_F32, NHD, KVX_BLOCK_TABLE_PACKED, S, msl, d_table, d_full, nullptr, nullptr, false);
  }

  /* 3. decode-sized calls */
  if (small && !g_filter) {
  printf("\n[small calls] F16 NHD, 8 KV heads x 128, block 16; device us per call under graph replay (%d calls per graph)\n",
         kGraphCalls);
  printf("  %6s %14s %14s %16s %16s\n", "tokens", "write graph", "gather graph", "write eager host", "gather eager host");
  {
    const uint32_t H = 8, D = 128, bs = 16, nb = N / bs;
    for (int kv = 0; kv < 2; ++kv) {
      fill(P.a[kv], (size_t)N * H * D, KVX_DTYPE_F16, 51 + kv);
      fill(P.b[kv], (size_t)N * H * D, KVX_DTYPE_F16, 61 + kv);
    }
    CK(cudaDeviceSynchronize());
    for (uint32_t n : {1u, 2u, 4u, 8u, 16u, 32u, 64u, 128u, 256u}) {
      WritePlan w = write_plan(n, H, D, bs, nb, d_slots_rand);
      w.k_cache = make_cache(P.b[0], KVX_DTYPE_F16, NHD, nb, bs, H, D);
      w.v_cache = make_cache(P.b[1], KVX_DTYPE_F16, NHD, nb, bs, H, D);
      w.key = make_io(P.a[0], KVX_DTYPE_F16, H, D);
      w.value = make_io(P.a[1], KVX_DTYPE_F16, H, D);
      /* gather: one sequence of n tokens (the decode step's context read) */
      /* d_table's entries address S x msl / 16 blocks (the buffers hold them all); msl >= n: min(L, n) = n */
      GatherPlan g = gather_plan(1, n, mbps, KVX_BLOCK_TABLE_PACKED, d_full, H, D, bs, nblk);
      g.indices = d_table;
      g.indices_count = mbps;
      g.k_cache = w.k_cache;
      g.v_cache = w.v_cache;
      g.key = make_io(P.ref[0], KVX_DTYPE_F16, H, D);
      g.value = make_io(P.ref[1], KVX_DTYPE_F16, H, D);
      auto wcall = [&] { KS(cuda_write(w, s)); };
      auto gcall = [&] { KS(cuda_gather(g, s)); };
      const double wg = graph_us_per_call(s, wcall), gg = graph_us_per_call(s, gcall);
      const double we = eager_host_us(s, wcall), ge = eager_host_us(s, gcall);
      printf("  %6u %11.2f us %11.2f us %13.2f us %13.2f us\n", n, wg, gg, we, ge);
      g_rows.push_back({"small write " + std::to_string(n), 0, wg, 0});
      g_rows.push_back({"small gather " + std::to_string(n), 0, gg, 0});
    }
  }
  }

  /* 4. decode-sized calls of every layout and dtype */
  if (small) small_all(P, s, N, S, msl, d_slots_rand, d_scales, d_table, d_kvtable, d_full, d_indptr, d_ragged);

  /* Markdown table for docs/cuda-reference.md. */
  printf("\n| case | MB moved | us | GB/s | %% of copy (%.0f GB/s) |\n| --- | ---: | ---: | ---: | ---: |\n", g_copy_gbs);
  for (const Row& r : g_rows) {
    if (r.bytes <= 0) continue;
    const double gbs = r.bytes / r.us * 1e-3;
    printf("| %s%s | %.0f | %.1f | %.0f | %.1f%% |\n", r.name.c_str(), r.bad ? " MISMATCH" : "", r.bytes * 1e-6, r.us,
           gbs, 100.0 * gbs / g_copy_gbs);
  }
  for (const Row& r : g_sector) {
    const double gbs = r.bytes / r.us * 1e-3;
    printf("| %s | %.0f (sector bytes) | %.1f | %.0f | %.1f%% |\n", r.name.c_str(), r.bytes * 1e-6, r.us, gbs,
           100.0 * gbs / g_copy_gbs);
  }
  unsigned long long bad = 0;
  for (const Row& r : g_rows) bad += r.bad;
  printf("\nsummary: copy roofline %.1f GB/s; %s\n", g_copy_gbs, bad ? "SOME RESULTS MISMATCH THE REFERENCE" : "every large result verified");
  CK(cudaStreamDestroy(s));
  return bad ? 1 : 0;
}
