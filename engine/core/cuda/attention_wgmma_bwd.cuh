// The causal attention backward on Hopper's own instructions (included by attention.cu only), the
// deterministic backward at head size 64 when T % 64 == 0 on a compute capability 9 device
// (docs/ATTENTION.md, "wgmma backward"). Two kernels, no atomics, every output element computed by one thread
// in a fixed order (bit-identical run to run), written from the FlashAttention-3 paper's description:
//
//   dQ kernel, one CTA (one warpgroup) per 64 query rows, streaming key tiles 0..diagonal:
//     delta = rowsum(dO ∘ O) of its rows first (written out for the dK/dV kernel, which runs after it);
//     S = Q·Kᵀ, dP = dO·Vᵀ (wgmma, both operands from shared memory); P = 2^(scale·log2e·S − log2e·lse);
//     dS = P ∘ (dP − delta); dQ += dS·K (dS straight from registers, K through the transposed B operand).
//   dK/dV kernel, one CTA per 64 keys, streaming query tiles diagonal..end:
//     Sᵀ = K·Qᵀ, dPᵀ = V·dOᵀ; Pᵀ from lse; dV += Pᵀ·dO; dSᵀ = Pᵀ ∘ (dPᵀ − delta); dK += dSᵀ·Q.
//
// Every product is m64n64k16 with the shapes of the forward's (attention_wgmma.cuh): A·Bᵀ from two K-major
// tiles, or registers · a tile read as stored through the transposed B operand. The streamed tiles (and the
// dK/dV kernel's lse and delta rows, by the bulk copy engine) arrive in a two-stage mbarrier ring; the next
// tile's load is issued while the current one is used. The products of one step are issued back to back and
// waited for only where their results are needed, so the exponentials overlap the tensor cores' work.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>

#include "engine/core/cuda/attention_wgmma.cuh"  // enabled(): the shared off switch
#include "engine/core/cuda/sm90_ptx.cuh"

namespace gantry::attention_wgmma_bwd {

using namespace gantry::sm90;  // NOLINT: the PTX helpers' own user

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kScale = 0.125f;  // 1/sqrt(64)
constexpr float kScaleLog2 = kScale * kLog2e;
// Stages of the streamed tiles' ring. Two measured best (B6): three, with each step's last product left
// running into the next step (its Sᵀ/dPᵀ queued behind it), cost registers or CTAs an SM and ran 2-9 % slower
// (commit 204633c has that variant).
constexpr int kStages = 2;
// dQ: Q, dO, kStages × (K, V), delta rows and 1 + kStages barriers; dK/dV: K, V, kStages × (Q, dO), kStages ×
// (lse, delta) rows and 1 + kStages barriers.
constexpr size_t kDqSmem =
    (2 + 2 * kStages) * kTileBytes + 1024 + 64 * sizeof(float) + (1 + kStages) * sizeof(uint64_t);
constexpr size_t kDkvSmem =
    (2 + 2 * kStages) * kTileBytes + 1024 + kStages * 128 * sizeof(float) + (1 + kStages) * sizeof(uint64_t);

__device__ __forceinline__ uint8_t* align1024(uint8_t* p) {
  return reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(p) + 1023) & ~uintptr_t{1023});
}

// A 64 × 64 accumulator (this thread: rows r and r + 8, columns 8i + 2·q4 + {0,1}) · mul → bf16 rows of g
// (row stride ld elements, row r at g + r·ld).
__device__ __forceinline__ void store_tile(__nv_bfloat16* g, size_t ld, const float (&acc)[32], float mul,
                                           int q4) {
  __nv_bfloat16* g1 = g + 8 * ld;
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const int col = 8 * i + 2 * q4;
    *reinterpret_cast<__nv_bfloat162*>(g + col) =
        __floats2bfloat162_rn(acc[4 * i] * mul, acc[4 * i + 1] * mul);
    *reinterpret_cast<__nv_bfloat162*>(g1 + col) =
        __floats2bfloat162_rn(acc[4 * i + 2] * mul, acc[4 * i + 3] * mul);
  }
}

// A 64 × 64 fp32 accumulator as the register A operand of four k16 steps (bf16): step kk covers columns
// 16kk..16kk + 15, i.e. column groups 2kk and 2kk + 1.
__device__ __forceinline__ void to_a_operand(uint32_t (&a)[4][4], const float (&x)[32]) {
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) {
    a[kk][0] = pack_bf16(x[8 * kk + 0], x[8 * kk + 1]);
    a[kk][1] = pack_bf16(x[8 * kk + 2], x[8 * kk + 3]);
    a[kk][2] = pack_bf16(x[8 * kk + 4], x[8 * kk + 5]);
    a[kk][3] = pack_bf16(x[8 * kk + 6], x[8 * kk + 7]);
  }
}

// Block → (head, heavy-first tile index) of a 1-D grid of heads × tiles CTAs, issued in groups of `group`
// heads, tile-major inside a group (every head's heaviest tile, then the next ...): the CTAs resident at once
// share few heads, so the tiles they all stream (a head's Q and dO, or K and V) are read from L2, not DRAM.
__device__ __forceinline__ int2 head_and_tile(int tiles, int group) {
  const int heads = static_cast<int>(gridDim.x) / tiles, id = static_cast<int>(blockIdx.x);
  const int per_group = group * tiles, gi = id / per_group, r = id - gi * per_group;
  const int gsize = min(group, heads - gi * group);
  return make_int2(gi * group + r % gsize, r / gsize);
}

template <int N>
__device__ __forceinline__ void fence_all(float (&x)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) fence_operand(x[i]);
}

// grid B·NH·T/64 (head_and_tile order), 128 threads; heavy-first index 0 is the last query tile (the most key
// tiles). tm_qkv: qkv as a (B·T, 3C) matrix, tm_dout: dout as (B·T, C), 64 × 64 boxes.
// 122 registers: 4 CTAs an SM.
__global__ void __launch_bounds__(128, 4)
    dq_kernel(const __grid_constant__ CUtensorMap tm_qkv, const __grid_constant__ CUtensorMap tm_dout,
              const __nv_bfloat16* __restrict__ out, const __nv_bfloat16* __restrict__ dout,
              const float* __restrict__ lse, float* __restrict__ delta, __nv_bfloat16* __restrict__ dqkv,
              int T, int NH, int group) {
#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
  __trap();  // wgmma needs the sm_90a build (GANTRY_CUDA_ARCH 90a, the project's one CUDA target)
#else
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = align1024(smem_raw);
  uint8_t* s_q = smem;
  uint8_t* s_do = smem + kTileBytes;
  uint8_t* s_k = smem + 2 * kTileBytes;              // kStages stages
  uint8_t* s_v = smem + (2 + kStages) * kTileBytes;  // kStages stages
  float* s_delta = reinterpret_cast<float*>(smem + (2 + 2 * kStages) * kTileBytes);
  uint64_t* bars = reinterpret_cast<uint64_t*>(s_delta + 64);  // q/dO, full[kStages]
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, q4 = lane % 4;
  const int n = T / 64;
  const int2 ht = head_and_tile(n, group);
  const int bh = ht.x, b = bh / NH, h = bh % NH, C = NH * 64;
  const int qt = n - 1 - ht.y;
  const int tiles = qt + 1;  // causal: key tiles 0..qt
  const size_t row_base = static_cast<size_t>(b) * T + qt * 64;
  if (tid == 0) {
    for (int i = 0; i < 1 + kStages; ++i) mbar_init(&bars[i], 1);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  auto load_kv = [&](int j) {
    const int st = j % kStages;
    uint64_t* full = &bars[1 + st];
    mbar_expect_tx(full, 2 * kTileBytes);
    tma_load_2d(s_k + st * kTileBytes, &tm_qkv, full, C + h * 64, b * T + j * 64);
    tma_load_2d(s_v + st * kTileBytes, &tm_qkv, full, 2 * C + h * 64, b * T + j * 64);
  };
  if (tid == 0) {
    mbar_expect_tx(&bars[0], 2 * kTileBytes);
    tma_load_2d(s_q, &tm_qkv, &bars[0], h * 64, b * T + qt * 64);
    tma_load_2d(s_do, &tm_dout, &bars[0], h * 64, b * T + qt * 64);
    for (int j = 0; j < kStages - 1 && j < tiles; ++j) load_kv(j);
  }
  {  // delta of the 64 rows while the tiles land: two threads a row, 32 columns each, from global memory
    const int r = tid / 2, half = tid % 2;
    const size_t off = (row_base + r) * C + h * 64 + half * 32;
    const uint4* po = reinterpret_cast<const uint4*>(out + off);
    const uint4* pd = reinterpret_cast<const uint4*>(dout + off);
    float acc = 0.f;
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      const uint4 vo = po[c], vd = pd[c];
      const __nv_bfloat162* o2 = reinterpret_cast<const __nv_bfloat162*>(&vo);
      const __nv_bfloat162* d2 = reinterpret_cast<const __nv_bfloat162*>(&vd);
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float2 fo = __bfloat1622float2(o2[e]), fd = __bfloat1622float2(d2[e]);
        acc = fmaf(fo.x, fd.x, acc);
        acc = fmaf(fo.y, fd.y, acc);
      }
    }
    acc += __shfl_xor_sync(0xffffffffu, acc, 1);
    if (half == 0) {
      s_delta[r] = acc;
      delta[static_cast<size_t>(bh) * T + qt * 64 + r] = acc;
    }
  }
  __syncthreads();
  const int lr0 = warp * 16 + g, lr1 = lr0 + 8;  // this thread's two query rows, in the tile
  const float lse0 = lse[static_cast<size_t>(bh) * T + qt * 64 + lr0] * kLog2e;
  const float lse1 = lse[static_cast<size_t>(bh) * T + qt * 64 + lr1] * kLog2e;
  const float d0 = s_delta[lr0], d1 = s_delta[lr1];
  mbar_wait(&bars[0], 0);
  const uint64_t desc_q = desc_sw128(s_q), desc_do = desc_sw128(s_do);
  float dq[32], s[32], dp[32];  // dQ starts at the first product (scale_d 0)
  for (int j = 0; j < tiles; ++j) {
    const int st = j % kStages;
    __syncthreads();  // every warp is done with the stage the next load overwrites (tile j - 1's)
    if (tid == 0 && j + kStages - 1 < tiles) load_kv(j + kStages - 1);

    mbar_wait(&bars[1 + st], (j / kStages) & 1);
    const uint64_t dk = desc_sw128(s_k + st * kTileBytes), dv = desc_sw128(s_v + st * kTileBytes);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) mma_ss(s, desc_q + 2 * kk, dk + 2 * kk, kk > 0 ? 1 : 0);
    wgmma_commit();
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) mma_ss(dp, desc_do + 2 * kk, dv + 2 * kk, kk > 0 ? 1 : 0);
    wgmma_commit();
    wgmma_wait<1>();  // S is in; dP may still be running
    fence_all(s);
    // s[4i + {0,1}]: row lr0, key 64j + 8i + 2·q4 + {0,1}; s[4i + {2,3}]: row lr1, the same keys. P and dS go
    // to fresh registers (never written into an accumulator: the pipelined products stay asynchronous).
    float p[32];
#pragma unroll
    for (int i = 0; i < 8; ++i) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int key = 8 * i + 2 * q4 + e;  // in the tile
        float p0 = fast_exp2(s[4 * i + e] * kScaleLog2 - lse0);
        float p1 = fast_exp2(s[4 * i + 2 + e] * kScaleLog2 - lse1);
        if (j == qt) {
          if (key > lr0) p0 = 0.f;
          if (key > lr1) p1 = 0.f;
        }
        p[4 * i + e] = p0, p[4 * i + 2 + e] = p1;
      }
    }
    wgmma_wait<0>();
    fence_all(dp);
    float ds[32];
#pragma unroll
    for (int i = 0; i < 8; ++i) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        ds[4 * i + e] = p[4 * i + e] * (dp[4 * i + e] - d0);
        ds[4 * i + 2 + e] = p[4 * i + 2 + e] * (dp[4 * i + 2 + e] - d1);
      }
    }
    uint32_t a_ds[4][4];
    to_a_operand(a_ds, ds);
    wgmma_fence();
    // K read as stored (d contiguous) through the transposed B operand: 8 keys per 1,024-byte swizzle atom,
    // a 16-key step 2,048 bytes on.
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) mma_rs_mn(dq, a_ds[kk], dk + 128 * kk, j > 0 || kk > 0 ? 1 : 0);
    wgmma_commit();
    wgmma_wait<0>();
    fence_all(dq);
  }
  store_tile(dqkv + (row_base + lr0) * 3 * C + h * 64, 3 * static_cast<size_t>(C), dq, kScale, q4);
#endif
}

// grid B·NH·T/64 (head_and_tile order), 128 threads; heavy-first index 0 is key tile 0 (the most query
// tiles). delta: the dQ kernel's, (B, NH, T); lse and delta 16-byte aligned.
// dS takes P from its bf16 copy (the dV product's A operand) rather than from fp32, so the fp32 P is dead
// once packed: fewer live registers (3 CTAs an SM without serialised products; with fp32 P, 172 registers
// and 2 CTAs, B4: 2-4 % slower), P rounded to bf16 in dS as it already is in dV.
// 154 registers: 3 CTAs an SM.
__global__ void __launch_bounds__(128, 3)
    dkdv_kernel(const __grid_constant__ CUtensorMap tm_qkv, const __grid_constant__ CUtensorMap tm_dout,
                const float* __restrict__ lse, const float* __restrict__ delta,
                __nv_bfloat16* __restrict__ dqkv, int T, int NH, int group) {
#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
  __trap();
#else
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = align1024(smem_raw);
  uint8_t* s_k = smem;
  uint8_t* s_v = smem + kTileBytes;
  uint8_t* s_q = smem + 2 * kTileBytes;               // kStages stages
  uint8_t* s_do = smem + (2 + kStages) * kTileBytes;  // kStages stages
  // stage st: lse at 128·st, delta 64 further
  float* s_stats = reinterpret_cast<float*>(smem + (2 + 2 * kStages) * kTileBytes);
  uint64_t* bars = reinterpret_cast<uint64_t*>(s_stats + kStages * 128);  // k/v, full[kStages]
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, q4 = lane % 4;
  const int n = T / 64;
  const int2 ht = head_and_tile(n, group);
  const int bh = ht.x, b = bh / NH, h = bh % NH, C = NH * 64;
  const int kt = ht.y;
  const int tiles = n - kt;  // causal: query tiles kt..n-1
  const float* lse_bh = lse + static_cast<size_t>(bh) * T;
  const float* delta_bh = delta + static_cast<size_t>(bh) * T;
  if (tid == 0) {
    for (int i = 0; i < 1 + kStages; ++i) mbar_init(&bars[i], 1);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  auto load_q = [&](int i, int st) {
    uint64_t* full = &bars[1 + st];
    mbar_expect_tx(full, 2 * kTileBytes + 2 * 64 * sizeof(float));
    tma_load_2d(s_q + st * kTileBytes, &tm_qkv, full, h * 64, b * T + i * 64);
    tma_load_2d(s_do + st * kTileBytes, &tm_dout, full, h * 64, b * T + i * 64);
    bulk_load(s_stats + 128 * st, lse_bh + i * 64, 64 * sizeof(float), full);
    bulk_load(s_stats + 128 * st + 64, delta_bh + i * 64, 64 * sizeof(float), full);
  };
  if (tid == 0) {
    mbar_expect_tx(&bars[0], 2 * kTileBytes);
    tma_load_2d(s_k, &tm_qkv, &bars[0], C + h * 64, b * T + kt * 64);
    tma_load_2d(s_v, &tm_qkv, &bars[0], 2 * C + h * 64, b * T + kt * 64);
    for (int t = 0; t < kStages - 1 && t < tiles; ++t) load_q(kt + t, t);
  }
  const int lk0 = warp * 16 + g, lk1 = lk0 + 8;  // this thread's two keys, in the tile
  mbar_wait(&bars[0], 0);
  const uint64_t desc_k = desc_sw128(s_k), desc_v = desc_sw128(s_v);
  float dk[32], dv[32], s[32], dp[32];  // dK and dV start at the first products (scale_d 0)
  for (int it = 0; it < tiles; ++it) {
    const int st = it % kStages;
    const int next = it + kStages - 1;  // the tile whose load this step issues
    __syncthreads();                    // every warp is done with the stage the next load overwrites
    if (tid == 0 && next < tiles) load_q(kt + next, next % kStages);

    mbar_wait(&bars[1 + st], (it / kStages) & 1);
    const uint64_t dq = desc_sw128(s_q + st * kTileBytes), ddo = desc_sw128(s_do + st * kTileBytes);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) mma_ss(s, desc_k + 2 * kk, dq + 2 * kk, kk > 0 ? 1 : 0);
    wgmma_commit();
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) mma_ss(dp, desc_v + 2 * kk, ddo + 2 * kk, kk > 0 ? 1 : 0);
    wgmma_commit();
    wgmma_wait<1>();  // Sᵀ is in; dPᵀ may still be running
    const float* s_lse = s_stats + 128 * st;
    const float* s_dl = s_lse + 64;
    fence_all(s);
    // s[4i + {0,1}]: key lk0, query 64·(kt + it) + 8i + 2·q4 + {0,1}; s[4i + {2,3}]: key lk1. P and dS go to
    // fresh registers (never written into an accumulator: the pipelined products then stay asynchronous).
    float p[32];
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const float2 l2 = *reinterpret_cast<const float2*>(s_lse + 8 * i + 2 * q4);
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int q = 8 * i + 2 * q4 + e;  // in the tile
        const float l = (e == 0 ? l2.x : l2.y) * kLog2e;
        float p0 = fast_exp2(s[4 * i + e] * kScaleLog2 - l);
        float p1 = fast_exp2(s[4 * i + 2 + e] * kScaleLog2 - l);
        if (it == 0) {  // the diagonal tile: query q sees key k only where q ≥ k
          if (q < lk0) p0 = 0.f;
          if (q < lk1) p1 = 0.f;
        }
        p[4 * i + e] = p0, p[4 * i + 2 + e] = p1;
      }
    }
    uint32_t a_p[4][4];
    to_a_operand(a_p, p);
    wgmma_fence();
    // dO read as stored through the transposed B operand (the queries are the k dimension).
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) mma_rs_mn(dv, a_p[kk], ddo + 128 * kk, it > 0 || kk > 0 ? 1 : 0);
    wgmma_commit();
    wgmma_wait<1>();  // dPᵀ is in; dV may still be running
    fence_all(dp);
    float ds[32];
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const float2 d2 = *reinterpret_cast<const float2*>(s_dl + 8 * i + 2 * q4);
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const float d = e == 0 ? d2.x : d2.y;
        // P at p[4i + e] and p[4i + 2 + e], from its bf16 copy: p[x] is half x % 2 of a_p[x / 8][(x / 2) % 4]
        const uint32_t u0 = a_p[i / 2][(2 * i) % 4], u1 = a_p[i / 2][(2 * i + 1) % 4];
        const float p0 = __uint_as_float(e == 0 ? u0 << 16 : u0 & 0xFFFF0000u);
        const float p1 = __uint_as_float(e == 0 ? u1 << 16 : u1 & 0xFFFF0000u);
        ds[4 * i + e] = p0 * (dp[4 * i + e] - d);
        ds[4 * i + 2 + e] = p1 * (dp[4 * i + 2 + e] - d);
      }
    }
    uint32_t a_ds[4][4];
    to_a_operand(a_ds, ds);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) mma_rs_mn(dk, a_ds[kk], dq + 128 * kk, it > 0 || kk > 0 ? 1 : 0);
    wgmma_commit();
    wgmma_wait<0>();
    fence_all(dk);
    fence_all(dv);
  }
  const size_t ld = 3 * static_cast<size_t>(C);
  __nv_bfloat16* row = dqkv + (static_cast<size_t>(b) * T + kt * 64 + lk0) * ld + h * 64;
  store_tile(row + C, ld, dk, kScale, q4);
  store_tile(row + 2 * C, ld, dv, 1.f, q4);
#endif
}

// GANTRY_CUDA_ATTENTION_WGMMA_BWD=0 keeps the deterministic backward on its mma.sync kernels (the forward
// stays on wgmma); GANTRY_CUDA_ATTENTION_WGMMA=0 turns both off. Read once.
inline bool enabled() {
  static const bool on = [] {
    const char* env = std::getenv("GANTRY_CUDA_ATTENTION_WGMMA_BWD");
    return attention_wgmma::enabled() && !(env != nullptr && env[0] == '0');
  }();
  return on;
}

// CTAs of `kernel` resident on the whole device at once (at least 1).
template <typename Kernel>
int resident_ctas(Kernel kernel, size_t smem) {
  int dev = 0, sms = 0, per_sm = 0;
  if (cudaGetDevice(&dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess ||
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, 128, smem) != cudaSuccess) {
    return 1;
  }
  return sms > 0 && per_sm > 0 ? sms * per_sm : 1;
}

// Heads per CTA group (head_and_tile): enough that a group fills the device's resident CTAs about `waves`
// times. Measured on an H100 (calls B2, B8): with 16 tiles a head (T 1,024) one wave is best (32 × 12: 0.475
// ms against 0.499 at two waves, 0.517 at three; 5–7 % at 32 × 16, 16 × 12, 16 × 16 too); with 64 (T 4,096)
// two or three (0.670 / 0.654 ms against 0.720 at one). So one wave up to 16 tiles, two beyond; all heads in
// one group (plain tile-major order) was 1.35–1.55× slower at T 1,024. GANTRY_ATTN_WGMMA_BWD_WAVES (read
// once) overrides it for the bench, 0 meaning one group of all heads.
inline int head_group(int resident, int heads, int tiles) {
  static const int forced = [] {
    const char* env = std::getenv("GANTRY_ATTN_WGMMA_BWD_WAVES");
    return env != nullptr ? std::atoi(env) : -1;
  }();
  const int waves = forced >= 0 ? forced : (tiles <= 16 ? 1 : 2);
  if (waves == 0) return heads;
  const int g = (waves * resident + tiles - 1) / tiles;
  return g < 1 ? 1 : (g > heads ? heads : g);
}

// Launches the deterministic backward and returns true where it applies (HS 64, T % 64 == 0, Hopper, lse
// and delta 16-byte aligned, not switched off); false, launching nothing, elsewhere. delta: B·NH·T floats of
// scratch.
inline bool backward(__nv_bfloat16* dqkv, const __nv_bfloat16* dout, const __nv_bfloat16* out,
                     const float* lse, const __nv_bfloat16* qkv, float* delta, int B, int T, int NH, int HS,
                     cudaStream_t stream) {
  if (HS != 64 || T % 64 != 0 || !enabled()) return false;
  if (reinterpret_cast<uintptr_t>(lse) % 16 != 0 || reinterpret_cast<uintptr_t>(delta) % 16 != 0)
    return false;
  const Support& sup = support();
  if (!sup.hopper || sup.encode == nullptr) return false;
  static const bool smem_ok = cudaFuncSetAttribute(dq_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                   static_cast<int>(kDqSmem)) == cudaSuccess &&
                              cudaFuncSetAttribute(dkdv_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                   static_cast<int>(kDkvSmem)) == cudaSuccess;
  if (!smem_ok) return false;
  static const int resident_dq = resident_ctas(dq_kernel, kDqSmem);
  static const int resident_dkdv = resident_ctas(dkdv_kernel, kDkvSmem);
  const int C = NH * 64;
  const uint64_t rows = static_cast<uint64_t>(B) * T;
  CUtensorMap tm_qkv{}, tm_dout{};
  if (!tile_map(&tm_qkv, qkv, rows, 3 * static_cast<uint64_t>(C), 3 * static_cast<uint64_t>(C)) ||
      !tile_map(&tm_dout, dout, rows, static_cast<uint64_t>(C), static_cast<uint64_t>(C))) {
    return false;
  }
  const int tiles = T / 64, heads = B * NH;
  if (static_cast<long long>(heads) * tiles > 0x7FFFFFFFLL) return false;
  dq_kernel<<<heads * tiles, 128, kDqSmem, stream>>>(tm_qkv, tm_dout, out, dout, lse, delta, dqkv, T, NH,
                                                     head_group(resident_dq, heads, tiles));
  dkdv_kernel<<<heads * tiles, 128, kDkvSmem, stream>>>(tm_qkv, tm_dout, lse, delta, dqkv, T, NH,
                                                        head_group(resident_dkdv, heads, tiles));
  return true;
}

}  // namespace gantry::attention_wgmma_bwd
