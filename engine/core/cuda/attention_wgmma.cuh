// The causal attention forward on Hopper's own instructions (included by attention.cu only), used by
// attention_forward at head size 64 when T % 64 == 0 on a compute capability 9 device (docs/ATTENTION.md,
// "wgmma forward"). Both products are wgmma m64n64k16: S = Q·Kᵀ with Q and K from shared memory, O += P·V
// with P straight from S's accumulator registers (the accumulator's fragment is the A operand's register
// fragment, so P never goes through shared memory) and V read as stored (d contiguous) through wgmma's
// transposed B operand. Q, K and V tiles arrive by TMA (128-byte swizzle) into a two-stage ring on mbarriers;
// the next key tile's load is issued while the current one is used. One warpgroup per CTA owns 64 query rows;
// several CTAs per SM overlap one another's softmax and products. Each output element is computed by one
// thread in a fixed order: bit-identical run to run. Written from the FlashAttention-3 paper's description;
// the warp-specialised producer and the ping-pong of two consumer warpgroups are not here yet.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>

#include "engine/core/cuda/sm90_ptx.cuh"

namespace gantry::attention_wgmma {

using namespace gantry::sm90;  // NOLINT: this header is the PTX helpers' one user besides the backward's

constexpr size_t kSmemBytes = 5 * kTileBytes + 1024 + 4 * sizeof(uint64_t);  // Q, 2 × (K, V), barriers

// grid (T / 64, B·NH), 128 threads. tm_qkv: qkv as a (B·T, 3C) matrix in 64 × 64 boxes.
__global__ void __launch_bounds__(128) forward_kernel(const __grid_constant__ CUtensorMap tm_qkv,
                                                      __nv_bfloat16* out, float* lse, int T, int NH) {
#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
  __trap();  // wgmma needs the sm_90a build (GANTRY_CUDA_ARCH 90a, the project's one CUDA target)
#else
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem =
      reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t{1023});
  uint8_t* s_q = smem;
  uint8_t* s_k = smem + kTileBytes;                                     // 2 stages
  uint8_t* s_v = smem + 3 * kTileBytes;                                 // 2 stages
  uint64_t* bars = reinterpret_cast<uint64_t*>(smem + 5 * kTileBytes);  // q, full[0], full[1]
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, q4 = lane % 4;
  const int qt = gridDim.x - 1 - blockIdx.x;  // the longest rows first
  const int bh = blockIdx.y, b = bh / NH, h = bh % NH, C = NH * 64;
  const int tiles = qt + 1;  // causal: key tiles 0..qt
  if (tid == 0) {
    for (int i = 0; i < 3; ++i) mbar_init(&bars[i], 1);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  auto load_kv = [&](int j) {
    uint64_t* full = &bars[1 + (j & 1)];
    mbar_expect_tx(full, 2 * kTileBytes);
    tma_load_2d(s_k + (j & 1) * kTileBytes, &tm_qkv, full, C + h * 64, b * T + j * 64);
    tma_load_2d(s_v + (j & 1) * kTileBytes, &tm_qkv, full, 2 * C + h * 64, b * T + j * 64);
  };
  if (tid == 0) {
    mbar_expect_tx(&bars[0], kTileBytes);
    tma_load_2d(s_q, &tm_qkv, &bars[0], h * 64, b * T + qt * 64);
    load_kv(0);
  }
  mbar_wait(&bars[0], 0);
  const uint64_t dq = desc_sw128(s_q);
  constexpr float kScaleLog2 = 0.125f * 1.4426950408889634f;  // 1/sqrt(64), in base 2
  float o[32], s[32];
#pragma unroll
  for (int i = 0; i < 32; ++i) o[i] = 0.f;
  float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.f, l1 = 0.f;
  const int r0 = qt * 64 + warp * 16 + g, r1 = r0 + 8;  // this thread's two query rows
  for (int j = 0; j < tiles; ++j) {
    __syncthreads();  // every warp is done with the stage the next load overwrites (tile j - 1's)
    if (tid == 0 && j + 1 < tiles) load_kv(j + 1);
    mbar_wait(&bars[1 + (j & 1)], (j >> 1) & 1);
    const uint64_t dk = desc_sw128(s_k + (j & 1) * kTileBytes), dv = desc_sw128(s_v + (j & 1) * kTileBytes);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) mma_ss(s, dq + 2 * kk, dk + 2 * kk, kk > 0 ? 1 : 0);  // 16 dims a step
    wgmma_commit();
    wgmma_wait_all();
#pragma unroll
    for (int i = 0; i < 32; ++i) fence_operand(s[i]);
    // s[4i + {0,1}]: row r0, key 64j + 8i + 2·q4 + {0,1}; s[4i + {2,3}]: row r1, the same keys.
    float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int key = j * 64 + 8 * i + 2 * q4 + e;
        float x0 = s[4 * i + e] * kScaleLog2, x1 = s[4 * i + 2 + e] * kScaleLog2;
        if (j == qt) {
          if (key > r0) x0 = -INFINITY;
          if (key > r1) x1 = -INFINITY;
        }
        s[4 * i + e] = x0, s[4 * i + 2 + e] = x1;
        mx0 = fmaxf(mx0, x0), mx1 = fmaxf(mx1, x1);
      }
    }
#pragma unroll
    for (int off = 1; off <= 2; off <<= 1) {
      mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, off));
      mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, off));
    }
    const float n0 = fmaxf(m0, mx0), n1 = fmaxf(m1, mx1);  // finite: every row sees its own key
    const float a0 = fast_exp2(m0 - n0), a1 = fast_exp2(m1 - n1);
    m0 = n0, m1 = n1;
    float sum0 = 0.f, sum1 = 0.f;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        s[4 * i + e] = fast_exp2(s[4 * i + e] - n0);
        s[4 * i + 2 + e] = fast_exp2(s[4 * i + 2 + e] - n1);
        sum0 += s[4 * i + e], sum1 += s[4 * i + 2 + e];
      }
    }
    l0 = l0 * a0 + sum0, l1 = l1 * a1 + sum1;  // this thread's part; the quad's parts are added at the end
#pragma unroll
    for (int i = 0; i < 8; ++i) o[4 * i] *= a0, o[4 * i + 1] *= a0, o[4 * i + 2] *= a1, o[4 * i + 3] *= a1;
    // P as the A operand: k-slice kk (keys 16kk..16kk+15) is S's column groups 2kk and 2kk + 1.
    uint32_t p[4][4];
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      p[kk][0] = pack_bf16(s[8 * kk + 0], s[8 * kk + 1]);
      p[kk][1] = pack_bf16(s[8 * kk + 2], s[8 * kk + 3]);
      p[kk][2] = pack_bf16(s[8 * kk + 4], s[8 * kk + 5]);
      p[kk][3] = pack_bf16(s[8 * kk + 6], s[8 * kk + 7]);
    }
    wgmma_fence();
    // V MN-major: each 8 keys are one 1,024-byte swizzle atom, a 16-key step two of them, the next step
    // 2,048 bytes on.
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) mma_rs_mn(o, p[kk], dv + 128 * kk);
    wgmma_commit();
    wgmma_wait_all();
#pragma unroll
    for (int i = 0; i < 32; ++i) fence_operand(o[i]);
  }
#pragma unroll
  for (int off = 1; off <= 2; off <<= 1) {
    l0 += __shfl_xor_sync(0xffffffffu, l0, off);
    l1 += __shfl_xor_sync(0xffffffffu, l1, off);
  }
  const float inv0 = 1.f / l0, inv1 = 1.f / l1;
  __nv_bfloat16* o0 = out + (static_cast<size_t>(b) * T + r0) * C + h * 64;
  __nv_bfloat16* o1 = o0 + 8 * static_cast<size_t>(C);
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const int col = 8 * i + 2 * q4;
    *reinterpret_cast<__nv_bfloat162*>(o0 + col) =
        __floats2bfloat162_rn(o[4 * i] * inv0, o[4 * i + 1] * inv0);
    *reinterpret_cast<__nv_bfloat162*>(o1 + col) =
        __floats2bfloat162_rn(o[4 * i + 2] * inv1, o[4 * i + 3] * inv1);
  }
  if (q4 == 0) {  // lse = log Σ exp(scale·q·k) = m·ln 2 + ln l
    constexpr float kLn2 = 0.6931471805599453f;
    lse[static_cast<size_t>(bh) * T + r0] = m0 * kLn2 + logf(l0);
    lse[static_cast<size_t>(bh) * T + r1] = m1 * kLn2 + logf(l1);
  }
#endif
}

// GANTRY_CUDA_ATTENTION_WGMMA=0 turns the wgmma paths off, forward and backward (the mma.sync kernels for
// every shape), read once.
inline bool enabled() {
  static const bool on = [] {
    const char* env = std::getenv("GANTRY_CUDA_ATTENTION_WGMMA");
    return !(env != nullptr && env[0] == '0');
  }();
  return on;
}

// Launches the forward and returns true where it applies (HS 64, T % 64 == 0, Hopper, not switched off);
// false, launching nothing, elsewhere.
inline bool forward(__nv_bfloat16* out, float* lse, const __nv_bfloat16* qkv, int B, int T, int NH, int HS,
                    cudaStream_t stream) {
  if (HS != 64 || T % 64 != 0 || !enabled()) return false;
  const Support& sup = support();
  if (!sup.hopper || sup.encode == nullptr) return false;
  static const bool smem_ok =
      cudaFuncSetAttribute(forward_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                           static_cast<int>(kSmemBytes)) == cudaSuccess;
  if (!smem_ok) return false;
  const int C = NH * 64;
  CUtensorMap map{};
  if (!tile_map(&map, qkv, static_cast<uint64_t>(B) * T, 3 * static_cast<uint64_t>(C),
                3 * static_cast<uint64_t>(C)))
    return false;
  forward_kernel<<<dim3(T / 64, B * NH), 128, kSmemBytes, stream>>>(map, out, lse, T, NH);
  return true;
}

}  // namespace gantry::attention_wgmma
