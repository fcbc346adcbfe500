// Causal flash attention kernels (see attention.cuh for the layout, docs/ATTENTION.md for the design). On a
// Hopper GPU at HS 64 the forward and the deterministic backward run on wgmma + TMA instead
// (attention_wgmma.cuh, attention_wgmma_bwd.cuh); the kernels here serve every other case and the A/B
// switches.
//
// Tensor-core building blocks, all through inline PTX:
//   cp.async 16 B global→shared (zero-filled past T), double-buffered K/V (or Q/dO) tiles;
//   ldmatrix (.trans where the operand is stored k-major) into mma.sync.m16n8k16 bf16→fp32 fragments;
//   a score tile's accumulator fragment is re-packed in registers as the A operand of the next product.
// Shared-memory rows are padded by 16 bytes (HS + 8 elements) so the eight 16-byte rows one ldmatrix phase
// reads fall in distinct banks.
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "engine/core/cuda/attention.cuh"
#include "engine/core/cuda/attention_wgmma.cuh"      // the forward on wgmma + TMA (Hopper, HS 64)
#include "engine/core/cuda/attention_wgmma_bwd.cuh"  // the deterministic backward on wgmma + TMA
#include "engine/core/cuda/cuda_check.h"             // CUDA_CHECK, CUDA_CHECK_LAUNCH
#include "engine/core/fatal.h"                       // GANTRY_CHECK

// Tuning knobs for head sizes up to 64 (HS = 128 has fixed choices, see below), kept as macros so the bench
// can build variants side by side; the defaults are the measured winners (docs/ATTENTION.md).
#ifndef GANTRY_ATTN_FWD_WARPS  // warps per forward block, 16 query rows each
#define GANTRY_ATTN_FWD_WARPS 8
#endif
#ifndef GANTRY_ATTN_BWD_KV_QTILE  // queries per step of the dK/dV kernel
#define GANTRY_ATTN_BWD_KV_QTILE 64
#endif
#ifndef GANTRY_ATTN_BWD_KV_MINBLOCKS  // resident dK/dV blocks per SM asked of the register allocator
#define GANTRY_ATTN_BWD_KV_MINBLOCKS 3
#endif
#ifndef GANTRY_ATTN_BWD_Q_MINBLOCKS  // the same for the dQ kernel (4 fits its 54 KB of shared memory)
#define GANTRY_ATTN_BWD_Q_MINBLOCKS 4
#endif
#ifndef GANTRY_ATTN_BWD_DET_GROUP_WAVES    // deterministic kernels: block groups of heads about this many
#define GANTRY_ATTN_BWD_DET_GROUP_WAVES 0  // waves big (0: one group, i.e. plain heaviest-first order)
#endif
#ifndef GANTRY_ATTN_BWD_FAST_GROUP_WAVES  // the same for the fused kernel (keeps its dQ accumulator in L2)
#define GANTRY_ATTN_BWD_FAST_GROUP_WAVES 2
#endif
#ifndef GANTRY_ATTN_BWD_ASYNC_STATS  // per-query lse, delta of dK/dV steps by cp.async (0: plain loads)
#define GANTRY_ATTN_BWD_ASYNC_STATS 1
#endif
#ifndef GANTRY_ATTN_BWD_DET_FOLD_DELTA  // deterministic path: the dQ kernel computes delta (no delta kernel)
#define GANTRY_ATTN_BWD_DET_FOLD_DELTA 1
#endif
// Fast (non-deterministic) backward: one kernel per key tile computes dK, dV and adds dQ into an fp32
// accumulator (red.global.add.v4.f32 from registers), then a small kernel converts it to bf16.
#ifndef GANTRY_ATTN_BWD_FAST_KWARPS  // warps (16 keys each) per fused block, HS = 64 only (4 or 8)
#define GANTRY_ATTN_BWD_FAST_KWARPS 4
#endif
#ifndef GANTRY_ATTN_BWD_FAST_MINBLOCKS  // resident fused blocks per SM asked of the register allocator
#define GANTRY_ATTN_BWD_FAST_MINBLOCKS 3
#endif

namespace gantry {
namespace {

using bf16 = __nv_bfloat16;

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;
constexpr int kTile = 64;  // keys per forward/dQ step, keys per dK/dV block, queries per dQ block
constexpr bool kAsyncStats = GANTRY_ATTN_BWD_ASYNC_STATS != 0;

// Per head size. HS = 128 keeps 4 forward warps, a 32-query dK/dV step (two 16×128 fp32 accumulators already
// take 128 registers) and no register cap (a cap of 168 spills hundreds of bytes there).
template <int D>
constexpr int kFwdWarps = D == 128 ? 4 : GANTRY_ATTN_FWD_WARPS;
template <int D>
constexpr int kKvQueryTile = D == 128 ? 32 : GANTRY_ATTN_BWD_KV_QTILE;
template <int D>
constexpr int kKvMinBlocks = D == 128 ? 1 : GANTRY_ATTN_BWD_KV_MINBLOCKS;
template <int D>
constexpr int kQMinBlocks = D == 128 ? 1 : GANTRY_ATTN_BWD_Q_MINBLOCKS;
template <int D>
constexpr int kFastKeyWarps = D == 64 ? GANTRY_ATTN_BWD_FAST_KWARPS : 4;
template <int D>
constexpr int kFastMinBlocks = D == 128 ? 1 : GANTRY_ATTN_BWD_FAST_MINBLOCKS;

// ---------------------------------------------------------------------------------------------------------
// PTX wrappers

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16 bytes global→shared; with valid == false the 16 bytes are zero-filled and nothing is read.
__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src, bool valid) {
  const int bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(bytes));
}
// 4 bytes global→shared (cp.async.ca: the 4-byte form), zero-filled with valid == false.
__device__ __forceinline__ void cp_async_4(uint32_t dst, const void* src, bool valid) {
  const int bytes = valid ? 4 : 0;
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src), "r"(bytes));
}
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::);
}
__device__ __forceinline__ void cp_async_wait_all() {
  asm volatile("cp.async.wait_group 0;\n" ::: "memory");
}

__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void ldsm_x4_trans(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// d (16×8 fp32) += a (16×16 bf16, row-major) · b (16×8 bf16, column-major).
__device__ __forceinline__ void mma_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Two floats → one register of two bf16, `lo` in the low half (the lower column of a fragment pair).
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}

// *g += {x, y, z, w} in four fp32 atomic adds done by L2 (one 16-byte vector reduction, sm_90).
__device__ __forceinline__ void red_add_v4(float* g, float x, float y, float z, float w) {
  asm volatile("red.global.add.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"l"(g), "f"(x), "f"(y), "f"(z), "f"(w)
               : "memory");
}

// 2^x on the special-function unit; 2^-inf = 0.
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// Block → (head, tile) of a 1-D backward grid of heads × tiles blocks, issued in groups of `group` heads,
// tile-major inside a group (every head's tile 0, then tile 1, ...): the blocks resident at once share few
// heads, so their K, V, Q, dO (and the fast path's dQ accumulator) stay in L2. group = heads is plain
// tile-major order over all heads.
__device__ __forceinline__ int2 block_head_tile(int tiles, int group) {
  const int heads = static_cast<int>(gridDim.x) / tiles, id = static_cast<int>(blockIdx.x);
  const int per_group = group * tiles, gi = id / per_group, r = id - gi * per_group;
  const int gsize = min(group, heads - gi * group);
  return make_int2(gi * group + r % gsize, r / gsize);
}

// ---------------------------------------------------------------------------------------------------------
// Tiles and fragments. A shared tile holds ROWS rows of D bf16 at a row stride of D + 8 elements.

template <int D>
constexpr int kStride = D + 8;

// Rows [0, rows_valid) of g (row stride ld elements) → shared; rows past rows_valid are zero-filled, so
// padded keys/queries contribute exact zeros (never NaN) to the products.
template <int ROWS, int D, int NT>
__device__ __forceinline__ void load_tile_async(bf16* s, const bf16* g, size_t ld, int rows_valid, int tid) {
  constexpr int kChunks = ROWS * (D / 8);
#pragma unroll
  for (int it = 0; it < (kChunks + NT - 1) / NT; ++it) {
    const int i = it * NT + tid;
    if (kChunks % NT == 0 || i < kChunks) {
      const int r = i / (D / 8), c = (i % (D / 8)) * 8;
      const bool valid = r < rows_valid;
      const bf16* src = g + static_cast<size_t>(valid ? r : 0) * ld + c;
      cp_async_16(smem_addr(s + r * kStride<D> + c), src, valid);
    }
  }
}

// A operand: the 16×16 block at (r0, c0) of a row-major tile.
template <int D>
__device__ __forceinline__ void load_a(uint32_t (&a)[4], const bf16* s, int r0, int c0, int lane) {
  const int r = r0 + (lane & 7) + ((lane >> 3) & 1) * 8;
  const int c = c0 + (lane >> 4) * 8;
  ldsm_x4(a, smem_addr(s + r * kStride<D> + c));
}

// B operands of two n8 tiles (b[0..1]: n0..n0+7, b[2..3]: n0+8..n0+15) over k0..k0+15, from a tile stored
// n-major (row = n, k contiguous), e.g. K for S = Q·Kᵀ.
template <int D>
__device__ __forceinline__ void load_b_nmajor(uint32_t (&b)[4], const bf16* s, int n0, int k0, int lane) {
  const int r = n0 + (lane & 7) + (lane >> 4) * 8;
  const int c = k0 + ((lane >> 3) & 1) * 8;
  ldsm_x4(b, smem_addr(s + r * kStride<D> + c));
}

// The same from a tile stored k-major (row = k, n contiguous), e.g. V for O = P·V.
template <int D>
__device__ __forceinline__ void load_b_kmajor(uint32_t (&b)[4], const bf16* s, int k0, int n0, int lane) {
  const int r = k0 + (lane & 7) + ((lane >> 3) & 1) * 8;
  const int c = n0 + (lane >> 4) * 8;
  ldsm_x4_trans(b, smem_addr(s + r * kStride<D> + c));
}

// A operand: the 16×16 block (rows r0.., columns c0..) of a matrix stored transposed (row = column of A,
// row stride STRIDE elements), e.g. dS from the dSᵀ tile.
template <int STRIDE>
__device__ __forceinline__ void load_a_trans(uint32_t (&a)[4], const bf16* s, int r0, int c0, int lane) {
  const int r = c0 + (lane & 7) + (lane >> 4) * 8;
  const int c = r0 + ((lane >> 3) & 1) * 8;
  ldsm_x4_trans(a, smem_addr(s + r * STRIDE + c));
}

// acc[NT8][4] (16 × 8·NT8) += A-rows (16 × D, rows r0.. of sa) · Bᵀ, B stored n-major (8·NT8 rows × D).
template <int D, int NT8>
__device__ __forceinline__ void mma_rows_nmajor(float (&acc)[NT8][4], const bf16* sa, int r0, const bf16* sb,
                                                int lane) {
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    uint32_t a[4];
    load_a<D>(a, sa, r0, kk * 16, lane);
#pragma unroll
    for (int np = 0; np < NT8 / 2; ++np) {
      uint32_t b[4];
      load_b_nmajor<D>(b, sb, np * 16, kk * 16, lane);
      mma_16816(acc[2 * np], a, b[0], b[1]);
      mma_16816(acc[2 * np + 1], a, b[2], b[3]);
    }
  }
}

// acc[D/8][4] (16 × D) += P (16 × 8·NT8, accumulator fragments in registers, rounded to bf16) · B, B stored
// k-major (8·NT8 rows × D).
template <int D, int NT8>
__device__ __forceinline__ void mma_regs_kmajor(float (&acc)[D / 8][4], const float (&p)[NT8][4],
                                                const bf16* sb, int lane) {
#pragma unroll
  for (int kk = 0; kk < NT8 / 2; ++kk) {
    const uint32_t a[4] = {pack_bf16(p[2 * kk][0], p[2 * kk][1]), pack_bf16(p[2 * kk][2], p[2 * kk][3]),
                           pack_bf16(p[2 * kk + 1][0], p[2 * kk + 1][1]),
                           pack_bf16(p[2 * kk + 1][2], p[2 * kk + 1][3])};
#pragma unroll
    for (int dp = 0; dp < D / 16; ++dp) {
      uint32_t b[4];
      load_b_kmajor<D>(b, sb, kk * 16, dp * 16, lane);
      mma_16816(acc[2 * dp], a, b[0], b[1]);
      mma_16816(acc[2 * dp + 1], a, b[2], b[3]);
    }
  }
}

template <int N>
__device__ __forceinline__ void zero(float (&x)[N][4]) {
#pragma unroll
  for (int i = 0; i < N; ++i) x[i][0] = x[i][1] = x[i][2] = x[i][3] = 0.f;
}

// Accumulator fragment → 16 rows of bf16 in global memory (this thread: rows g and g + 8, columns 2·tq +
// {0,1} of each n8 tile), multiplied by mul; rows at or past T are skipped.
template <int D>
__device__ __forceinline__ void store_rows(bf16* g, size_t ld, int row0, int T, const float (&acc)[D / 8][4],
                                           float mul0, float mul1, int lane) {
  const int tq = lane & 3;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = row0 + r * 8;
    if (row >= T) continue;
    const float mul = r == 0 ? mul0 : mul1;
    bf16* dst = g + static_cast<size_t>(row) * ld + 2 * tq;
#pragma unroll
    for (int dt = 0; dt < D / 8; ++dt)
      *reinterpret_cast<uint32_t*>(dst + dt * 8) = pack_bf16(acc[dt][2 * r] * mul, acc[dt][2 * r + 1] * mul);
  }
}

// ---------------------------------------------------------------------------------------------------------
// Forward. Grid (B·NH, query tiles), heaviest (last) query tiles first. W warps, 16 query rows each; the
// block streams 64-key tiles of K and V up to its diagonal, double-buffered.

template <int D, int W>
__global__ void __launch_bounds__(W * 32)
    attention_forward_kernel(bf16* __restrict__ out, float* __restrict__ lse, const bf16* __restrict__ qkv,
                             int T, int NH, float scale_log2) {
  constexpr int kBR = 16 * W, kBC = kTile, kS = kStride<D>, kNT = W * 32;
  extern __shared__ __align__(16) unsigned char smem[];
  bf16* sQ = reinterpret_cast<bf16*>(smem);  // (kBR, kS)
  bf16* sK = sQ + kBR * kS;                  // (2, kBC, kS)
  bf16* sV = sK + 2 * kBC * kS;              // (2, kBC, kS)

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, tq = lane & 3;
  const int bh = blockIdx.x, b = bh / NH, h = bh % NH;
  const int q0 = (gridDim.y - 1 - blockIdx.y) * kBR;
  const int C = NH * D;
  const size_t ld = 3 * static_cast<size_t>(C);
  const bf16* gQ = qkv + static_cast<size_t>(b) * T * ld + h * D;
  const bf16* gK = gQ + C;
  const bf16* gV = gQ + 2 * C;
  const int n_kv = (min(T, q0 + kBR) + kBC - 1) / kBC;

  load_tile_async<kBR, D, kNT>(sQ, gQ + q0 * ld, ld, T - q0, tid);
  load_tile_async<kBC, D, kNT>(sK, gK, ld, T, tid);
  load_tile_async<kBC, D, kNT>(sV, gV, ld, T, tid);
  cp_async_commit();

  const int row0 = q0 + warp * 16 + g;  // this thread's query rows: row0 and row0 + 8
  uint32_t qf[D / 16][4];
  float o[D / 8][4];
  zero(o);
  float m[2] = {-INFINITY, -INFINITY};  // running max of scale·log2(e)·s
  float l[2] = {0.f, 0.f};  // this thread's share of the running Σ 2^(…); the quad sums at the end

  for (int j = 0; j < n_kv; ++j) {
    cp_async_wait_all();
    __syncthreads();  // tile j landed, and every warp is done with the buffer tile j+1 overwrites
    if (j == 0) {
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) load_a<D>(qf[kk], sQ, warp * 16, kk * 16, lane);
    }
    if (j + 1 < n_kv) {
      const int k1 = (j + 1) * kBC;
      load_tile_async<kBC, D, kNT>(sK + ((j + 1) & 1) * kBC * kS, gK + k1 * ld, ld, T - k1, tid);
      load_tile_async<kBC, D, kNT>(sV + ((j + 1) & 1) * kBC * kS, gV + k1 * ld, ld, T - k1, tid);
      cp_async_commit();
    }
    const bf16* cK = sK + (j & 1) * kBC * kS;
    const bf16* cV = sV + (j & 1) * kBC * kS;

    float s[kBC / 8][4];
    zero(s);
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
#pragma unroll
      for (int np = 0; np < kBC / 16; ++np) {
        uint32_t bb[4];
        load_b_nmajor<D>(bb, cK, np * 16, kk * 16, lane);
        mma_16816(s[2 * np], qf[kk], bb[0], bb[1]);
        mma_16816(s[2 * np + 1], qf[kk], bb[2], bb[3]);
      }
    }

    const int k0 = j * kBC;
    if (k0 + kBC > q0) {  // the diagonal crosses this tile (keys past T lie above it for every real row)
#pragma unroll
      for (int nt = 0; nt < kBC / 8; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e)
          if (k0 + nt * 8 + 2 * tq + (e & 1) > row0 + (e >> 1) * 8) s[nt][e] = -INFINITY;
    }

#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float mx = -INFINITY;
#pragma unroll
      for (int nt = 0; nt < kBC / 8; ++nt) mx = fmaxf(mx, fmaxf(s[nt][2 * r], s[nt][2 * r + 1]));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      const float m_new = fmaxf(m[r], mx * scale_log2);
      const float m_use = m_new == -INFINITY ? 0.f : m_new;  // a row with nothing visible yet stays at zero
      const float corr = fast_exp2(m[r] - m_use);
      m[r] = m_new;
      l[r] *= corr;
#pragma unroll
      for (int dt = 0; dt < D / 8; ++dt) {
        o[dt][2 * r] *= corr;
        o[dt][2 * r + 1] *= corr;
      }
#pragma unroll
      for (int nt = 0; nt < kBC / 8; ++nt)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const float p = fast_exp2(fmaf(s[nt][2 * r + e], scale_log2, -m_use));
          s[nt][2 * r + e] = p;
          l[r] += p;
        }
    }

    mma_regs_kmajor<D, kBC / 8>(o, s, cV, lane);
  }

  float inv[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float lr = l[r];
    lr += __shfl_xor_sync(0xffffffffu, lr, 1);
    lr += __shfl_xor_sync(0xffffffffu, lr, 2);
    inv[r] = 1.f / lr;
    const int row = row0 + r * 8;
    if (tq == 0 && row < T) lse[static_cast<size_t>(bh) * T + row] = (m[r] + log2f(lr)) * kLn2;
  }
  store_rows<D>(out + static_cast<size_t>(b) * T * C + h * D, C, row0, T, o, inv[0], inv[1], lane);
}

// ---------------------------------------------------------------------------------------------------------
// Backward, step 1: delta (B, NH, T) = rowsum(dout ∘ out) per head. D/8 threads per row, 16 bytes each.
// With ZERO (the fast path) the threads also clear zero[0, zero_n4), the dQ accumulator.

template <int D, bool ZERO>
__global__ void attention_backward_delta_kernel(float* __restrict__ delta, const bf16* __restrict__ dout,
                                                const bf16* __restrict__ out, int B, int T, int NH,
                                                float4* __restrict__ zero, size_t zero_n4) {
  constexpr int kTPR = D / 8;
  const size_t idx = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const size_t row = idx / kTPR;  // (b, t, h) in memory order: out is (B, T, NH·D)
  const int part = static_cast<int>(idx % kTPR);
  const size_t rows = static_cast<size_t>(B) * T * NH;
  float sum = 0.f;
  if (row < rows) {
    const uint4 x = *reinterpret_cast<const uint4*>(dout + row * D + part * 8);
    const uint4 y = *reinterpret_cast<const uint4*>(out + row * D + part * 8);
    const __nv_bfloat162* xa = reinterpret_cast<const __nv_bfloat162*>(&x);
    const __nv_bfloat162* ya = reinterpret_cast<const __nv_bfloat162*>(&y);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float2 xf = __bfloat1622float2(xa[i]), yf = __bfloat1622float2(ya[i]);
      sum = fmaf(xf.x, yf.x, sum);
      sum = fmaf(xf.y, yf.y, sum);
    }
  }
#pragma unroll
  for (int off = kTPR / 2; off > 0; off >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, off);
  if (part == 0 && row < rows) {
    const size_t h = row % NH, bt = row / NH, t = bt % T, b = bt / T;
    delta[(b * NH + h) * T + t] = sum;
  }
  if constexpr (ZERO) {
    const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
    for (size_t i = idx; i < zero_n4; i += stride) zero[i] = make_float4(0.f, 0.f, 0.f, 0.f);
  }
}

// lse and delta of queries qs.. qs + BQ − 1 → shared memory. kAsyncStats: raw lse by cp.async (in the tile's
// commit group), zero-filled past T: a padded query then has P = 2^0 = 1 (its Q row is zero), but its dO
// row and delta are zero too, so every product it enters adds exact zeros. Otherwise log2e·lse by plain
// loads, +inf (P = 0) past T.
template <int BQ, int NT>
__device__ __forceinline__ void load_stats(float* sl, float* sd, const float* gl, const float* gd, int qs,
                                           int T, int tid) {
  for (int x = tid; x < BQ; x += NT) {
    const int q = qs + x;
    if constexpr (kAsyncStats) {
      const int src = q < T ? q : 0;
      cp_async_4(smem_addr(sl + x), gl + src, q < T);
      cp_async_4(smem_addr(sd + x), gd + src, q < T);
    } else {
      sl[x] = q < T ? gl[q] * kLog2e : INFINITY;
      sd[x] = q < T ? gd[q] : 0.f;
    }
  }
}

// Step 2: dK, dV. Grid B·NH × key tiles of 64 (block_head_tile order), key tile 0 (the most work) first. 4
// warps, 16 keys each; the block streams BQ-query tiles of Q, dO, lse, delta from its diagonal to T,
// double-buffered:
//   Sᵀ = K·Qᵀ;  Pᵀ = 2^(scale·log2e·Sᵀ − log2e·lse);  dV += Pᵀ·dO;  dPᵀ = V·dOᵀ;  dSᵀ = Pᵀ∘(dPᵀ − delta);
//   dK += dSᵀ·Q;  finally dK ·= scale.

// One query tile of the dK/dV pass, shared by the deterministic and the fused (atomic dQ) kernels:
// recompute P = 2^(scale·log2e·Q·Kᵀ − log2e·lse) under the causal mask, dV += Pᵀ·dO, and leave
// dS = P∘(dO·Vᵀ − delta) in ds. The block's BK keys start at k0; each warp owns 16 (key0 and key0 + 8 for
// this thread).
template <int D, int BQ, int BK>
__device__ __forceinline__ void dkdv_query_tile(float (&ds)[BQ / 8][4], float (&dv)[D / 8][4], const bf16* sK,
                                                const bf16* sV, const bf16* cQ, const bf16* cO,
                                                const float* cL, const float* cD, int warp, int lane, int tq,
                                                int qs, int k0, int key0, float scale_log2) {
  float s[BQ / 8][4];
  zero(s);
  mma_rows_nmajor<D, BQ / 8>(s, sK, warp * 16, cQ, lane);
  const bool diag = qs < k0 + BK;
#pragma unroll
  for (int nt = 0; nt < BQ / 8; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int qi = nt * 8 + 2 * tq + (e & 1);
      float p = fast_exp2(fmaf(s[nt][e], scale_log2, kAsyncStats ? -(cL[qi] * kLog2e) : -cL[qi]));
      if (diag && key0 + (e >> 1) * 8 > qs + qi) p = 0.f;
      s[nt][e] = p;
    }
  mma_regs_kmajor<D, BQ / 8>(dv, s, cO, lane);

  zero(ds);
  mma_rows_nmajor<D, BQ / 8>(ds, sV, warp * 16, cO, lane);
#pragma unroll
  for (int nt = 0; nt < BQ / 8; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) ds[nt][e] = s[nt][e] * (ds[nt][e] - cD[nt * 8 + 2 * tq + (e & 1)]);
}

template <int D, int BQ>
__global__ void __launch_bounds__(128, kKvMinBlocks<D>)
    attention_backward_dkdv_kernel(bf16* __restrict__ dqkv, const bf16* __restrict__ dout,
                                   const float* __restrict__ lse, const float* __restrict__ delta,
                                   const bf16* __restrict__ qkv, int T, int NH, float scale_log2, float scale,
                                   int group) {
  constexpr int kBK = kTile, kS = kStride<D>, kNT = 128;
  extern __shared__ __align__(16) unsigned char smem[];
  bf16* sK = reinterpret_cast<bf16*>(smem);                // (kBK, kS)
  bf16* sV = sK + kBK * kS;                                // (kBK, kS)
  bf16* sQ = sV + kBK * kS;                                // (2, BQ, kS)
  bf16* sO = sQ + 2 * BQ * kS;                             // (2, BQ, kS): dout
  float* sL = reinterpret_cast<float*>(sO + 2 * BQ * kS);  // (2, BQ): lse (kAsyncStats) or log2e·lse
  float* sD = sL + 2 * BQ;                                 // (2, BQ): delta

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, tq = lane & 3;
  const int2 ht = block_head_tile((T + kBK - 1) / kBK, group);
  const int bh = ht.x, b = bh / NH, h = bh % NH;
  const int k0 = ht.y * kBK;
  const int C = NH * D;
  const size_t ld = 3 * static_cast<size_t>(C);
  const bf16* gQ = qkv + static_cast<size_t>(b) * T * ld + h * D;
  const bf16* gK = gQ + C;
  const bf16* gV = gQ + 2 * C;
  const bf16* gO = dout + static_cast<size_t>(b) * T * C + h * D;
  const float* gL = lse + static_cast<size_t>(bh) * T;
  const float* gD = delta + static_cast<size_t>(bh) * T;
  const int i_begin = k0 / BQ, n_q = (T + BQ - 1) / BQ;

  auto load_query_tile = [&](int i, int buf) {
    const int qs = i * BQ;
    load_tile_async<BQ, D, kNT>(sQ + buf * BQ * kS, gQ + qs * ld, ld, T - qs, tid);
    load_tile_async<BQ, D, kNT>(sO + buf * BQ * kS, gO + static_cast<size_t>(qs) * C, C, T - qs, tid);
    load_stats<BQ, kNT>(sL + buf * BQ, sD + buf * BQ, gL, gD, qs, T, tid);
  };

  load_tile_async<kBK, D, kNT>(sK, gK + k0 * ld, ld, T - k0, tid);
  load_tile_async<kBK, D, kNT>(sV, gV + k0 * ld, ld, T - k0, tid);
  load_query_tile(i_begin, 0);
  cp_async_commit();

  float dk[D / 8][4], dv[D / 8][4];
  zero(dk);
  zero(dv);
  const int key0 = k0 + warp * 16 + g;  // this thread's keys: key0 and key0 + 8

  for (int i = i_begin; i < n_q; ++i) {
    const int buf = (i - i_begin) & 1;
    cp_async_wait_all();
    __syncthreads();
    if (i + 1 < n_q) {
      load_query_tile(i + 1, buf ^ 1);
      cp_async_commit();
    }
    const bf16* cQ = sQ + buf * BQ * kS;
    const bf16* cO = sO + buf * BQ * kS;
    const float* cL = sL + buf * BQ;
    const float* cD = sD + buf * BQ;
    const int qs = i * BQ;

    float dp[BQ / 8][4];
    dkdv_query_tile<D, BQ, kBK>(dp, dv, sK, sV, cQ, cO, cL, cD, warp, lane, tq, qs, k0, key0, scale_log2);
    mma_regs_kmajor<D, BQ / 8>(dk, dp, cQ, lane);
  }

  bf16* dst = dqkv + static_cast<size_t>(b) * T * ld + h * D;
  store_rows<D>(dst + C, ld, key0, T, dk, scale, scale, lane);
  store_rows<D>(dst + 2 * C, ld, key0, T, dv, 1.f, 1.f, lane);
}

// Step 3: dQ. Grid B·NH × query tiles of 64 (block_head_tile order), heaviest first. 4 warps, 16 queries
// each; the block streams BK-key tiles of K and V up to its diagonal, double-buffered:
//   S = Q·Kᵀ;  P = 2^(scale·log2e·S − log2e·lse);  dP = dO·Vᵀ;  dS = P∘(dP − delta);  dQ += dS·K;  dQ ·=
//   scale.
// With FOLD the block first computes delta of its own 64 rows (from out in global memory and its dO tile)
// and writes it for the dK/dV kernel, which then runs after this one: no separate delta launch.

template <int D, int BK, bool FOLD>
__global__ void __launch_bounds__(128, kQMinBlocks<D>)
    attention_backward_dq_kernel(bf16* __restrict__ dqkv, const bf16* __restrict__ dout,
                                 const bf16* __restrict__ out, const float* __restrict__ lse,
                                 float* __restrict__ delta, const bf16* __restrict__ qkv, int T, int NH,
                                 float scale_log2, float scale, int group) {
  constexpr int kBQ = kTile, kS = kStride<D>, kNT = 128;
  extern __shared__ __align__(16) unsigned char smem[];
  bf16* sQ = reinterpret_cast<bf16*>(smem);                    // (kBQ, kS)
  bf16* sO = sQ + kBQ * kS;                                    // (kBQ, kS): dout
  bf16* sK = sO + kBQ * kS;                                    // (2, BK, kS)
  bf16* sV = sK + 2 * BK * kS;                                 // (2, BK, kS)
  float* sDelta = reinterpret_cast<float*>(sV + 2 * BK * kS);  // (kBQ), FOLD only

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, tq = lane & 3;
  const int tiles = (T + kBQ - 1) / kBQ;
  const int2 ht = block_head_tile(tiles, group);
  const int bh = ht.x, b = bh / NH, h = bh % NH;
  const int q0 = (tiles - 1 - ht.y) * kBQ;  // heaviest (last) query tile first
  const int C = NH * D;
  const size_t ld = 3 * static_cast<size_t>(C);
  const bf16* gQ = qkv + static_cast<size_t>(b) * T * ld + h * D;
  const bf16* gK = gQ + C;
  const bf16* gV = gQ + 2 * C;
  const bf16* gO = dout + static_cast<size_t>(b) * T * C + h * D;
  const int n_kv = (min(T, q0 + kBQ) + BK - 1) / BK;

  load_tile_async<kBQ, D, kNT>(sQ, gQ + q0 * ld, ld, T - q0, tid);
  load_tile_async<kBQ, D, kNT>(sO, gO + static_cast<size_t>(q0) * C, C, T - q0, tid);
  load_tile_async<BK, D, kNT>(sK, gK, ld, T, tid);
  load_tile_async<BK, D, kNT>(sV, gV, ld, T, tid);
  cp_async_commit();

  const int row0 = q0 + warp * 16 + g;  // this thread's query rows: row0 and row0 + 8
  float lrow[2], drow[2];
  if constexpr (FOLD) {
    // Two threads per row, D/2 columns each: out from global (16-byte loads), dO from the landed tile.
    constexpr int kChunks = D / 16;
    const int r = tid >> 1, half = tid & 1, row = q0 + r;
    uint4 o[kChunks];
    const bf16* src = out + (static_cast<size_t>(b) * T + (row < T ? row : 0)) * C + h * D + half * (D / 2);
#pragma unroll
    for (int k = 0; k < kChunks; ++k) o[k] = *reinterpret_cast<const uint4*>(src + k * 8);
    cp_async_wait_all();
    __syncthreads();
    float sum = 0.f;
#pragma unroll
    for (int k = 0; k < kChunks; ++k) {
      const uint4 x = *reinterpret_cast<const uint4*>(sO + r * kS + half * (D / 2) + k * 8);
      const __nv_bfloat162* xa = reinterpret_cast<const __nv_bfloat162*>(&x);
      const __nv_bfloat162* ya = reinterpret_cast<const __nv_bfloat162*>(&o[k]);
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float2 xf = __bfloat1622float2(xa[e]), yf = __bfloat1622float2(ya[e]);
        sum = fmaf(xf.x, yf.x, sum);
        sum = fmaf(xf.y, yf.y, sum);
      }
    }
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    if (row >= T) sum = 0.f;
    if (half == 0) {
      sDelta[r] = sum;
      if (row < T) delta[static_cast<size_t>(bh) * T + row] = sum;
    }
    __syncthreads();
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = row0 + r * 8;
    lrow[r] = row < T ? lse[static_cast<size_t>(bh) * T + row] * kLog2e : INFINITY;
    if constexpr (FOLD)
      drow[r] = sDelta[warp * 16 + g + r * 8];
    else
      drow[r] = row < T ? delta[static_cast<size_t>(bh) * T + row] : 0.f;
  }
  float dq[D / 8][4];
  zero(dq);

  for (int j = 0; j < n_kv; ++j) {
    cp_async_wait_all();
    __syncthreads();
    if (j + 1 < n_kv) {
      const int k1 = (j + 1) * BK;
      load_tile_async<BK, D, kNT>(sK + ((j + 1) & 1) * BK * kS, gK + k1 * ld, ld, T - k1, tid);
      load_tile_async<BK, D, kNT>(sV + ((j + 1) & 1) * BK * kS, gV + k1 * ld, ld, T - k1, tid);
      cp_async_commit();
    }
    const bf16* cK = sK + (j & 1) * BK * kS;
    const bf16* cV = sV + (j & 1) * BK * kS;
    const int k0 = j * BK;

    float s[BK / 8][4];
    zero(s);
    mma_rows_nmajor<D, BK / 8>(s, sQ, warp * 16, cK, lane);
    const bool diag = k0 + BK > q0;
#pragma unroll
    for (int nt = 0; nt < BK / 8; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float p = fast_exp2(fmaf(s[nt][e], scale_log2, -lrow[e >> 1]));
        if (diag && k0 + nt * 8 + 2 * tq + (e & 1) > row0 + (e >> 1) * 8) p = 0.f;
        s[nt][e] = p;
      }

    float dp[BK / 8][4];
    zero(dp);
    mma_rows_nmajor<D, BK / 8>(dp, sO, warp * 16, cV, lane);
#pragma unroll
    for (int nt = 0; nt < BK / 8; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) dp[nt][e] = s[nt][e] * (dp[nt][e] - drow[e >> 1]);
    mma_regs_kmajor<D, BK / 8>(dq, dp, cK, lane);
  }

  store_rows<D>(dqkv + static_cast<size_t>(b) * T * ld + h * D, ld, row0, T, dq, scale, scale, lane);
}

// ---------------------------------------------------------------------------------------------------------
// Fast backward (FlashAttention-2 style, not deterministic: fp32 atomics in L2 add in arrival order).
//
// The dQ accumulator holds, per (b, h), ⌈T/BQ⌉ tiles of BQ × D fp32 in "fragment order": the float4 of
// lane L for n8 tile dt of row group rg (16 rows) sits at ((rg·D/8 + dt)·32 + L)·4 and holds the m16n8
// accumulator fragment (row 16·rg + L/4: columns 8·dt + 2·(L%4) + {0,1}; row 16·rg + L/4 + 8: the same), so
// each warp adds 512 contiguous bytes per 16-byte vector reduction and a tile is one contiguous block.

template <int D, int BQ>
__device__ __forceinline__ size_t frag_offset(int rg, int dt, int lane) {
  return (static_cast<size_t>(rg * (D / 8) + dt) * 32 + lane) * 4;
}

// Fused dK, dV, dQ. Grid B·NH × key tiles of 16·KW (block_head_tile order), key tile 0 first. KW warps, 16
// keys each; the block streams BQ-query tiles of Q, dO, lse, delta from its diagonal to T, double-buffered.
// Per step, as in the dK/dV kernel, Sᵀ, Pᵀ, dV += Pᵀ·dO, dPᵀ, dSᵀ, dK += dSᵀ·Q; then dSᵀ (bf16) goes to
// shared memory and the warps compute dQ_partial = dS·K (BQ × D, warp (rg, cg) owns rows 16·rg.., columns
// cg·D/CG..) and add it to the fp32 accumulator with one 16-byte vector reduction per n8 tile.
template <int D, int BQ, int KW>
__global__ void __launch_bounds__(KW * 32, kFastMinBlocks<D>)
    attention_backward_fused_kernel(bf16* __restrict__ dqkv, float* __restrict__ dq_acc,
                                    const bf16* __restrict__ dout, const float* __restrict__ lse,
                                    const float* __restrict__ delta, const bf16* __restrict__ qkv, int T,
                                    int NH, float scale_log2, float scale, int group) {
  constexpr int kBK = 16 * KW, kS = kStride<D>, kNT = KW * 32, kSS = BQ + 8;
  constexpr int kRG = BQ / 16, kCG = KW / kRG, kDW = D / kCG;
  static_assert(KW % kRG == 0 && kDW % 16 == 0, "dQ warp split");
  extern __shared__ __align__(16) unsigned char smem[];
  bf16* sK = reinterpret_cast<bf16*>(smem);               // (kBK, kS)
  bf16* sV = sK + kBK * kS;                               // (kBK, kS)
  bf16* sQO = sV + kBK * kS;                              // (2 buffers, Q then dO, BQ, kS)
  bf16* sdS = sQO + 4 * BQ * kS;                          // (kBK, kSS): dSᵀ, key rows
  float* sL = reinterpret_cast<float*>(sdS + kBK * kSS);  // (2, BQ): lse (kAsyncStats) or log2e·lse
  float* sD = sL + 2 * BQ;                                // (2, BQ): delta

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, tq = lane & 3;
  const int n_k = (T + kBK - 1) / kBK;
  const int2 ht = block_head_tile(n_k, group);
  const int bh = ht.x, b = bh / NH, h = bh % NH;
  const int k0 = ht.y * kBK;
  const int C = NH * D;
  const size_t ld = 3 * static_cast<size_t>(C);
  const bf16* gQ = qkv + static_cast<size_t>(b) * T * ld + h * D;
  const bf16* gK = gQ + C;
  const bf16* gV = gQ + 2 * C;
  const bf16* gO = dout + static_cast<size_t>(b) * T * C + h * D;
  const float* gL = lse + static_cast<size_t>(bh) * T;
  const float* gD = delta + static_cast<size_t>(bh) * T;
  const int i_begin = k0 / BQ, n_q = (T + BQ - 1) / BQ;
  float* acc_bh = dq_acc + static_cast<size_t>(bh) * n_q * BQ * D;
  bf16* dq_out = dqkv + static_cast<size_t>(b) * T * ld + h * D;
  const int rg = warp % kRG, cg = warp / kRG;  // this warp's dQ block

  auto load_query_tile = [&](int i, int buf) {
    const int qs = i * BQ;
    bf16* q = sQO + buf * 2 * BQ * kS;
    load_tile_async<BQ, D, kNT>(q, gQ + qs * ld, ld, T - qs, tid);
    load_tile_async<BQ, D, kNT>(q + BQ * kS, gO + static_cast<size_t>(qs) * C, C, T - qs, tid);
    load_stats<BQ, kNT>(sL + buf * BQ, sD + buf * BQ, gL, gD, qs, T, tid);
  };

  load_tile_async<kBK, D, kNT>(sK, gK + k0 * ld, ld, T - k0, tid);
  load_tile_async<kBK, D, kNT>(sV, gV + k0 * ld, ld, T - k0, tid);
  load_query_tile(i_begin, 0);
  cp_async_commit();

  float dk[D / 8][4], dv[D / 8][4];
  zero(dk);
  zero(dv);
  const int key0 = k0 + warp * 16 + g;  // this thread's keys: key0 and key0 + 8

  for (int i = i_begin; i < n_q; ++i) {
    const int buf = (i - i_begin) & 1;
    cp_async_wait_all();
    __syncthreads();
    if (i + 1 < n_q) {
      load_query_tile(i + 1, buf ^ 1);
      cp_async_commit();
    }
    const bf16* cQ = sQO + buf * 2 * BQ * kS;
    const bf16* cO = cQ + BQ * kS;
    const float* cL = sL + buf * BQ;
    const float* cD = sD + buf * BQ;
    const int qs = i * BQ;

    float dp[BQ / 8][4];
    dkdv_query_tile<D, BQ, kBK>(dp, dv, sK, sV, cQ, cO, cL, cD, warp, lane, tq, qs, k0, key0, scale_log2);
#pragma unroll
    for (int nt = 0; nt < BQ / 8; ++nt) {
      bf16* dst = sdS + (warp * 16 + g) * kSS + nt * 8 + 2 * tq;
      *reinterpret_cast<uint32_t*>(dst) = pack_bf16(dp[nt][0], dp[nt][1]);
      *reinterpret_cast<uint32_t*>(dst + 8 * kSS) = pack_bf16(dp[nt][2], dp[nt][3]);
    }
    mma_regs_kmajor<D, BQ / 8>(dk, dp, cQ, lane);
    __syncthreads();  // dSᵀ complete; every warp is done with this step's Q and dO

    float dq[kDW / 8][4];
    zero(dq);
#pragma unroll
    for (int kk = 0; kk < kBK / 16; ++kk) {
      uint32_t a[4];
      load_a_trans<kSS>(a, sdS, rg * 16, kk * 16, lane);
#pragma unroll
      for (int dp2 = 0; dp2 < kDW / 16; ++dp2) {
        uint32_t bb[4];
        load_b_kmajor<D>(bb, sK, kk * 16, cg * kDW + dp2 * 16, lane);
        mma_16816(dq[2 * dp2], a, bb[0], bb[1]);
        mma_16816(dq[2 * dp2 + 1], a, bb[2], bb[3]);
      }
    }
    float* acc_tile = acc_bh + static_cast<size_t>(i) * BQ * D;
#pragma unroll
    for (int dt = 0; dt < kDW / 8; ++dt)
      red_add_v4(acc_tile + frag_offset<D, BQ>(rg, cg * (kDW / 8) + dt, lane), dq[dt][0], dq[dt][1],
                 dq[dt][2], dq[dt][3]);
  }

  store_rows<D>(dq_out + C, ld, key0, T, dk, scale, scale, lane);
  store_rows<D>(dq_out + 2 * C, ld, key0, T, dv, 1.f, 1.f, lane);
}

// The fp32 accumulator (fragment order) · scale → the dq columns of dqkv. Grid (B·NH, query tiles of BQ),
// 128 threads: the tile goes through shared memory so that the global stores are 16-byte row chunks.
template <int D, int BQ>
__global__ void __launch_bounds__(128)
    attention_backward_dq_convert_kernel(bf16* __restrict__ dqkv, const float* __restrict__ dq_acc, int T,
                                         int NH, float scale) {
  constexpr int kSF = D + 8;  // padded fp32 row: the eight rows of one fragment store hit distinct banks
  __shared__ __align__(16) float tile[BQ * kSF];
  const int tid = threadIdx.x, bh = blockIdx.x, b = bh / NH, h = bh % NH, n_q = gridDim.y;
  const int q0 = blockIdx.y * BQ;
  const float4* acc =
      reinterpret_cast<const float4*>(dq_acc + (static_cast<size_t>(bh) * n_q + blockIdx.y) * BQ * D);
#pragma unroll 4
  for (int f = tid; f < BQ * D / 4; f += 128) {
    const float4 v = acc[f];
    const int lane = f & 31, rest = f >> 5, dt = rest % (D / 8), rg = rest / (D / 8);
    float* dst = tile + (rg * 16 + (lane >> 2)) * kSF + dt * 8 + 2 * (lane & 3);
    *reinterpret_cast<float2*>(dst) = make_float2(v.x, v.y);
    *reinterpret_cast<float2*>(dst + 8 * kSF) = make_float2(v.z, v.w);
  }
  __syncthreads();
  const int C = NH * D;
  const size_t ld = 3 * static_cast<size_t>(C);
  bf16* dq = dqkv + static_cast<size_t>(b) * T * ld + h * D;
#pragma unroll 4
  for (int c = tid; c < BQ * D / 8; c += 128) {
    const int r = c / (D / 8), col = (c % (D / 8)) * 8;
    if (q0 + r >= T) continue;
    const float4 x = *reinterpret_cast<const float4*>(tile + r * kSF + col);
    const float4 y = *reinterpret_cast<const float4*>(tile + r * kSF + col + 4);
    uint4 o;
    o.x = pack_bf16(x.x * scale, x.y * scale);
    o.y = pack_bf16(x.z * scale, x.w * scale);
    o.z = pack_bf16(y.x * scale, y.y * scale);
    o.w = pack_bf16(y.z * scale, y.w * scale);
    *reinterpret_cast<uint4*>(dq + static_cast<size_t>(q0 + r) * ld + col) = o;
  }
}

// ---------------------------------------------------------------------------------------------------------
// Launchers

bool aligned16(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

void check_shape(int B, int T, int NH, int HS) {
  GANTRY_CHECK(B > 0 && T > 0 && NH > 0, "attention: B, T, NH must be positive");
  GANTRY_CHECK(HS == 16 || HS == 32 || HS == 64 || HS == 128,
               "attention: head size must be 16, 32, 64 or 128");
  GANTRY_CHECK((T + kTile - 1) / kTile <= 65535, "attention: T too long for the grid's y dimension");
  GANTRY_CHECK(static_cast<long long>(B) * NH * ((T + kTile - 1) / kTile) <= 0x7FFFFFFFLL,
               "attention: B·NH·⌈T/64⌉ too large for a 1-D grid");
}

template <typename Kernel>
void set_smem(Kernel kernel, size_t bytes) {
  CUDA_CHECK(
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
}

// Heads per block group (block_head_tile) for a backward kernel: enough heads that one group fills the
// device about `waves` times with resident blocks; all heads (one group) when waves is 0.
template <typename Kernel>
int head_group(Kernel kernel, int threads, size_t smem, int heads, int tiles, int waves) {
  if (waves <= 0) return heads;
  int dev = 0, sms = 0, per_sm = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, smem));
  const int resident = std::max(1, sms * per_sm);
  return std::clamp((waves * resident + tiles - 1) / tiles, 1, heads);
}

template <int D>
void forward_launch(bf16* out, float* lse, const bf16* qkv, int B, int T, int NH, cudaStream_t stream) {
  constexpr int W = kFwdWarps<D>, kBR = 16 * W;
  const size_t smem = static_cast<size_t>(kBR + 4 * kTile) * kStride<D> * sizeof(bf16);
  auto kernel = attention_forward_kernel<D, W>;
  set_smem(kernel, smem);
  const dim3 grid(B * NH, (T + kBR - 1) / kBR);
  const float scale_log2 = kLog2e / std::sqrt(static_cast<float>(D));
  kernel<<<grid, W * 32, smem, stream>>>(out, lse, qkv, T, NH, scale_log2);
  CUDA_CHECK_LAUNCH();
}

// Fast-path scratch, in floats: delta (B·NH·T, rounded up to 64), then the dQ accumulator (B·NH tiles of
// ⌈T/BQ⌉·BQ × D fp32).
struct FastScratch {
  size_t acc, total;
};

FastScratch fast_scratch(int B, int T, int NH, int D) {
  const size_t bq = D == 128 ? kKvQueryTile<128> : kKvQueryTile<64>;
  const size_t heads = static_cast<size_t>(B) * static_cast<size_t>(NH);
  const size_t n_q = (static_cast<size_t>(T) + bq - 1) / bq;
  FastScratch f;
  f.acc = (heads * static_cast<size_t>(T) + 63) / 64 * 64;
  f.total = f.acc + heads * n_q * bq * static_cast<size_t>(D);
  return f;
}

template <int D>
void backward_launch(bf16* dqkv, const bf16* dout, const bf16* out, const float* lse, const bf16* qkv,
                     float* scratch, int B, int T, int NH, bool deterministic, cudaStream_t stream) {
  const float scale = 1.f / std::sqrt(static_cast<float>(D));
  const float scale_log2 = scale * kLog2e;
  float* delta = scratch;
  const size_t threads = static_cast<size_t>(B) * T * NH * (D / 8);
  const unsigned delta_blocks = static_cast<unsigned>((threads + 255) / 256);
  constexpr int kBQ = kKvQueryTile<D>, kBK = kTile;
  const int tiles = (T + kTile - 1) / kTile, heads = B * NH;

  if (!deterministic) {
    constexpr int KW = kFastKeyWarps<D>, kKeys = 16 * KW;
    const FastScratch f = fast_scratch(B, T, NH, D);
    float* acc = scratch + f.acc;
    attention_backward_delta_kernel<D, true><<<delta_blocks, 256, 0, stream>>>(
        delta, dout, out, B, T, NH, reinterpret_cast<float4*>(acc), (f.total - f.acc) / 4);
    CUDA_CHECK_LAUNCH();
    const size_t smem = (2 * kKeys + 4 * kBQ) * kStride<D> * sizeof(bf16) + kKeys * (kBQ + 8) * sizeof(bf16) +
                        4 * kBQ * sizeof(float);
    auto kernel = attention_backward_fused_kernel<D, kBQ, KW>;
    set_smem(kernel, smem);
    const int key_tiles = (T + kKeys - 1) / kKeys;
    const int group = head_group(kernel, KW * 32, smem, heads, key_tiles, GANTRY_ATTN_BWD_FAST_GROUP_WAVES);
    kernel<<<heads * key_tiles, KW * 32, smem, stream>>>(dqkv, acc, dout, lse, delta, qkv, T, NH, scale_log2,
                                                         scale, group);
    CUDA_CHECK_LAUNCH();
    attention_backward_dq_convert_kernel<D, kBQ>
        <<<dim3(heads, (T + kBQ - 1) / kBQ), 128, 0, stream>>>(dqkv, acc, T, NH, scale);
    CUDA_CHECK_LAUNCH();
    return;
  }

  constexpr bool kFold = GANTRY_ATTN_BWD_DET_FOLD_DELTA != 0;
  const size_t smem_kv = (2 * kTile + 4 * kBQ) * kStride<D> * sizeof(bf16) + 4 * kBQ * sizeof(float);
  const size_t smem_q =
      (2 * kTile + 4 * kBK) * kStride<D> * sizeof(bf16) + (kFold ? kTile * sizeof(float) : 0);
  auto kv_kernel = attention_backward_dkdv_kernel<D, kBQ>;
  set_smem(kv_kernel, smem_kv);
  auto q_kernel = attention_backward_dq_kernel<D, kBK, kFold>;
  set_smem(q_kernel, smem_q);
  const int kv_group = head_group(kv_kernel, 128, smem_kv, heads, tiles, GANTRY_ATTN_BWD_DET_GROUP_WAVES);
  const int q_group = head_group(q_kernel, 128, smem_q, heads, tiles, GANTRY_ATTN_BWD_DET_GROUP_WAVES);
  auto launch_kv = [&] {
    kv_kernel<<<heads * tiles, 128, smem_kv, stream>>>(dqkv, dout, lse, delta, qkv, T, NH, scale_log2, scale,
                                                       kv_group);
    CUDA_CHECK_LAUNCH();
  };
  auto launch_q = [&] {
    q_kernel<<<heads * tiles, 128, smem_q, stream>>>(dqkv, dout, out, lse, delta, qkv, T, NH, scale_log2,
                                                     scale, q_group);
    CUDA_CHECK_LAUNCH();
  };
  if constexpr (kFold) {  // dQ first: it writes delta, which dK/dV reads
    launch_q();
    launch_kv();
  } else {
    attention_backward_delta_kernel<D, false>
        <<<delta_blocks, 256, 0, stream>>>(delta, dout, out, B, T, NH, nullptr, 0);
    CUDA_CHECK_LAUNCH();
    launch_kv();
    launch_q();
  }
}

}  // namespace

void attention_forward(bf16* out, float* lse, const bf16* qkv, int B, int T, int NH, int HS,
                       cudaStream_t stream) {
  check_shape(B, T, NH, HS);
  GANTRY_CHECK(out != nullptr && lse != nullptr && qkv != nullptr, "attention_forward: null pointer");
  GANTRY_CHECK(aligned16(out) && aligned16(qkv), "attention_forward: bf16 buffers must be 16-byte aligned");
  if (attention_wgmma::forward(out, lse, qkv, B, T, NH, HS, stream)) {
    CUDA_CHECK_LAUNCH();
    return;
  }
  attention_forward_mma(out, lse, qkv, B, T, NH, HS, stream);
}

void attention_forward_mma(bf16* out, float* lse, const bf16* qkv, int B, int T, int NH, int HS,
                           cudaStream_t stream) {
  check_shape(B, T, NH, HS);
  GANTRY_CHECK(out != nullptr && lse != nullptr && qkv != nullptr, "attention_forward: null pointer");
  GANTRY_CHECK(aligned16(out) && aligned16(qkv), "attention_forward: bf16 buffers must be 16-byte aligned");
  switch (HS) {
    case 16:
      forward_launch<16>(out, lse, qkv, B, T, NH, stream);
      break;
    case 32:
      forward_launch<32>(out, lse, qkv, B, T, NH, stream);
      break;
    case 64:
      forward_launch<64>(out, lse, qkv, B, T, NH, stream);
      break;
    default:
      forward_launch<128>(out, lse, qkv, B, T, NH, stream);
      break;
  }
}

size_t attention_backward_scratch_floats(int B, int T, int NH, int HS) {
  GANTRY_CHECK(B > 0 && T > 0 && NH > 0, "attention_backward_scratch_floats: B, T, NH must be positive");
  size_t n = static_cast<size_t>(B) * static_cast<size_t>(T) * static_cast<size_t>(NH);  // deterministic
  for (int d : {16, 32, 64, 128})
    if (d <= HS) n = std::max(n, fast_scratch(B, T, NH, d).total);
  return n;
}

void attention_backward(bf16* dqkv, const bf16* dout, const bf16* out, const float* lse, const bf16* qkv,
                        float* scratch, int B, int T, int NH, int HS, cudaStream_t stream,
                        bool deterministic) {
  check_shape(B, T, NH, HS);
  GANTRY_CHECK(dqkv != nullptr && dout != nullptr && out != nullptr && lse != nullptr && qkv != nullptr &&
                   scratch != nullptr,
               "attention_backward: null pointer");
  GANTRY_CHECK(aligned16(dqkv) && aligned16(dout) && aligned16(out) && aligned16(qkv),
               "attention_backward: bf16 buffers must be 16-byte aligned");
  if (deterministic &&
      attention_wgmma_bwd::backward(dqkv, dout, out, lse, qkv, scratch, B, T, NH, HS, stream)) {
    CUDA_CHECK_LAUNCH();
    return;
  }
  attention_backward_mma(dqkv, dout, out, lse, qkv, scratch, B, T, NH, HS, stream, deterministic);
}

void attention_backward_mma(bf16* dqkv, const bf16* dout, const bf16* out, const float* lse, const bf16* qkv,
                            float* scratch, int B, int T, int NH, int HS, cudaStream_t stream,
                            bool deterministic) {
  check_shape(B, T, NH, HS);
  GANTRY_CHECK(dqkv != nullptr && dout != nullptr && out != nullptr && lse != nullptr && qkv != nullptr &&
                   scratch != nullptr,
               "attention_backward: null pointer");
  GANTRY_CHECK(aligned16(dqkv) && aligned16(dout) && aligned16(out) && aligned16(qkv),
               "attention_backward: bf16 buffers must be 16-byte aligned");
  GANTRY_CHECK(deterministic || aligned16(scratch), "attention_backward: scratch must be 16-byte aligned");
  switch (HS) {
    case 16:
      backward_launch<16>(dqkv, dout, out, lse, qkv, scratch, B, T, NH, deterministic, stream);
      break;
    case 32:
      backward_launch<32>(dqkv, dout, out, lse, qkv, scratch, B, T, NH, deterministic, stream);
      break;
    case 64:
      backward_launch<64>(dqkv, dout, out, lse, qkv, scratch, B, T, NH, deterministic, stream);
      break;
    default:
      backward_launch<128>(dqkv, dout, out, lse, qkv, scratch, B, T, NH, deterministic, stream);
      break;
  }
}

}  // namespace gantry
