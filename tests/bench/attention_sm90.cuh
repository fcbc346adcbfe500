// Experiment (issue 19), not used by the engine: the first step towards FlashAttention-3-class attention, the
// causal forward at head size 64 on Hopper's own instructions. Both products are wgmma (m64n64k16): S = Q·Kᵀ
// with Q and K from shared memory, O += P·V with P straight from the S accumulator's registers (the
// accumulator's fragment is the A operand's register fragment, so P never goes through shared memory) and V
// as Vᵀ tiles in shared memory (K-major for the B operand). Q, K and Vᵀ tiles arrive by TMA (128-byte
// swizzle) into a two-stage ring on mbarriers, the next key tile's load issued while the current one is used.
// One warpgroup per CTA owns 64 query rows; several CTAs per SM overlap one another's softmax and products
// (the warp-specialised producer and the ping-pong of two consumer warpgroups are the next steps, not here).
// V reaches the second product either as Vᵀ, written by a transpose pass first (timed apart), or as stored in
// qkv, read by wgmma as an MN-major B operand (no pass).
//
//   AttentionSm90 a;                                         // finds cuTensorMapEncodeTiled once
//   a.transpose_v(vt, qkv, B, T, NH, stream);                // vt (B, NH, 64, T)
//   a.forward(out, lse, qkv, vt, B, T, NH, stream);          // as gantry::attention_forward at HS 64
//   a.forward(out, lse, qkv, nullptr, B, T, NH, stream);     // V read as stored (wgmma's transposed B)
//
// Layout as engine/core/cuda/attention.cuh: qkv (B, T, 3C), out (B, T, C), lse (B, NH, T) natural log,
// scale 1/8. T % 64 == 0. Checked and timed against the engine's mma.sync kernel by attention_sm90_bench.cu.
#pragma once

#include <cuda.h>          // CUtensorMap
#include <cudaTypedefs.h>  // PFN_cuTensorMapEncodeTiled
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "tests/bench/gemm_sm90.cuh"  // mbarrier, TMA and wgmma helpers, desc_sw128

namespace gantry::sm90 {

constexpr int kAttTile = 64;                     // query rows per CTA, keys per tile, head size
constexpr uint32_t kAttTileBytes = 64 * 64 * 2;  // one 64 × 64 bf16 tile
constexpr size_t kAttSmem = 5 * kAttTileBytes + 1024 + 4 * sizeof(uint64_t);  // Q, 2 × (K, Vᵀ), barriers

// wgmma m64n64k16, A and B from shared memory.
__device__ __forceinline__ void wgmma_m64n64k16_ss(float (&d)[32], uint64_t da, uint64_t db, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
      "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%"
      "27,%28,%29,%30,%31}, %32, %33, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]),
        "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]),
        "+f"(d[30]), "+f"(d[31])
      : "l"(da), "l"(db), "r"(scale_d));
}
// wgmma m64n64k16, A from registers (the m16n8k16 A fragment per warp), B from shared memory.
// kTransB: B is MN-major in shared memory (V as stored, d contiguous), not K-major (Vᵀ).
template <int kTransB>
__device__ __forceinline__ void wgmma_m64n64k16_rs(float (&d)[32], const uint32_t (&a)[4], uint64_t db) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
      "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%"
      "27,%28,%29,%30,%31}, {%32,%33,%34,%35}, %36, p, 1, 1, %38;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]),
        "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]),
        "+f"(d[30]), "+f"(d[31])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1), "n"(kTransB));
}
__device__ __forceinline__ float fast_exp2(float x) {  // ex2.approx: 2^-inf = 0
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

// vt (B·NH·64, T) ← the v columns of qkv, a 64 × 64 tile per block through shared memory.
__global__ void transpose_v_kernel(__nv_bfloat16* vt, const __nv_bfloat16* qkv, int T, int NH) {
  __shared__ __nv_bfloat16 tile[64][66];
  const int t0 = blockIdx.x * 64, bh = blockIdx.y, b = bh / NH, h = bh % NH, C = NH * 64;
  for (int i = threadIdx.y; i < 64; i += blockDim.y) {
    for (int d = threadIdx.x; d < 64; d += blockDim.x) {
      tile[i][d] = qkv[(static_cast<size_t>(b) * T + t0 + i) * 3 * C + 2 * C + h * 64 + d];
    }
  }
  __syncthreads();
  for (int d = threadIdx.y; d < 64; d += blockDim.y) {
    for (int i = threadIdx.x; i < 64; i += blockDim.x) {
      vt[(static_cast<size_t>(bh) * 64 + d) * T + t0 + i] = tile[i][d];
    }
  }
}

// kVt: V comes as Vᵀ tiles (K-major B operand; vt written by transpose_v first). Otherwise V tiles come
// straight from qkv (64 keys × 64 dims, dims contiguous) and wgmma reads them MN-major (its transpose bit):
// within a tile each 8 keys are one 1,024-byte swizzle atom, so a 16-key step is two atoms (SBO apart) and
// the next step starts 2,048 bytes on.
template <bool kVt>
__global__ void __launch_bounds__(128)
    attention_sm90_forward_kernel(const __grid_constant__ CUtensorMap tm_qkv,
                                  const __grid_constant__ CUtensorMap tm_vt, __nv_bfloat16* out, float* lse,
                                  int T, int NH) {
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem =
      reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t{1023});
  uint8_t* s_q = smem;
  uint8_t* s_k = smem + kAttTileBytes;                                     // 2 stages
  uint8_t* s_v = smem + 3 * kAttTileBytes;                                 // 2 stages
  uint64_t* bars = reinterpret_cast<uint64_t*>(smem + 5 * kAttTileBytes);  // q, full[0], full[1]
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, q4 = lane % 4;
  const int qt = gridDim.x - 1 - blockIdx.x;  // the longest rows first
  const int bh = blockIdx.y, b = bh / NH, h = bh % NH, C = NH * 64;
  const int row_q = b * T + qt * 64;  // this CTA's first query row in qkv
  const int tiles = qt + 1;           // causal: key tiles 0..qt
  if (tid == 0) {
    for (int i = 0; i < 3; ++i) mbar_init(&bars[i], 1);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  auto load_kv = [&](int j) {
    uint64_t* full = &bars[1 + (j & 1)];
    mbar_expect_tx(full, 2 * kAttTileBytes);
    tma_load_2d(s_k + (j & 1) * kAttTileBytes, &tm_qkv, full, C + h * 64, b * T + j * 64);
    if constexpr (kVt) {
      tma_load_2d(s_v + (j & 1) * kAttTileBytes, &tm_vt, full, j * 64, bh * 64);
    } else {
      tma_load_2d(s_v + (j & 1) * kAttTileBytes, &tm_qkv, full, 2 * C + h * 64, b * T + j * 64);
    }
  };
  if (tid == 0) {
    mbar_expect_tx(&bars[0], kAttTileBytes);
    tma_load_2d(s_q, &tm_qkv, &bars[0], h * 64, row_q);
    load_kv(0);
  }
  mbar_wait(&bars[0], 0);
  const uint64_t dq = desc_sw128(s_q);
  constexpr float kScaleLog2 = 0.125f * 1.4426950408889634f;
  float o[32], s[32];
#pragma unroll
  for (int i = 0; i < 32; ++i) o[i] = 0.f;
  float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.f, l1 = 0.f;
  const int r0 = qt * 64 + warp * 16 + g, r1 = r0 + 8;  // this thread's two query rows (in the sequence)
  for (int j = 0; j < tiles; ++j) {
    __syncthreads();  // every warp is done with the stage the next load overwrites (tile j - 1's)
    if (tid == 0 && j + 1 < tiles) load_kv(j + 1);
    mbar_wait(&bars[1 + (j & 1)], (j >> 1) & 1);
    const uint64_t dk = desc_sw128(s_k + (j & 1) * kAttTileBytes),
                   dv = desc_sw128(s_v + (j & 1) * kAttTileBytes);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) wgmma_m64n64k16_ss(s, dq + 2 * kk, dk + 2 * kk, kk > 0 ? 1 : 0);
    wgmma_commit();
    wgmma_wait<0>();
#pragma unroll
    for (int i = 0; i < 32; ++i) fence_operand(s[i]);
    // s[4i + {0,1}]: row r0, key j·64 + 8i + 2·q4 + {0,1}; s[4i + {2,3}]: row r1, the same keys.
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
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      if constexpr (kVt) {
        wgmma_m64n64k16_rs<0>(o, p[kk], dv + 2 * kk);
      } else {
        wgmma_m64n64k16_rs<1>(o, p[kk], dv + 128 * kk);
      }
    }
    wgmma_commit();
    wgmma_wait<0>();
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
  if (q4 == 0) {
    constexpr float kLn2 = 0.6931471805599453f;
    lse[static_cast<size_t>(bh) * T + r0] = m0 * kLn2 + logf(l0);
    lse[static_cast<size_t>(bh) * T + r1] = m1 * kLn2 + logf(l1);
  }
}

class AttentionSm90 {
 public:
  AttentionSm90() {
    cudaDriverEntryPointQueryResult q{};
    void* fn = nullptr;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &q) !=
            cudaSuccess ||
        q != cudaDriverEntryPointSuccess || fn == nullptr) {
      std::fprintf(stderr, "attention_sm90: no cuTensorMapEncodeTiled\n");
      std::abort();
    }
    encode_ = reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
    cudaFuncSetAttribute(attention_sm90_forward_kernel<true>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                         static_cast<int>(kAttSmem));
    cudaFuncSetAttribute(attention_sm90_forward_kernel<false>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                         static_cast<int>(kAttSmem));
  }

  static bool supports(int T) { return T % 64 == 0; }

  bool transpose_v(__nv_bfloat16* vt, const __nv_bfloat16* qkv, int B, int T, int NH, cudaStream_t stream) {
    if (!supports(T)) return false;
    transpose_v_kernel<<<dim3(T / 64, B * NH), dim3(64, 4), 0, stream>>>(vt, qkv, T, NH);
    return cudaGetLastError() == cudaSuccess;
  }

  bool forward(__nv_bfloat16* out, float* lse, const __nv_bfloat16* qkv, const __nv_bfloat16* vt, int B,
               int T, int NH, cudaStream_t stream) {
    if (!supports(T)) return false;
    const int C = NH * 64;
    const CUtensorMap tq = map(qkv, B * T, 3 * C);
    const dim3 grid(T / 64, B * NH);
    if (vt != nullptr) {
      const CUtensorMap tv = map(vt, B * NH * 64, T);
      attention_sm90_forward_kernel<true><<<grid, 128, kAttSmem, stream>>>(tq, tv, out, lse, T, NH);
    } else {  // V read as stored, by the transposing wgmma: no Vᵀ, no pass
      attention_sm90_forward_kernel<false><<<grid, 128, kAttSmem, stream>>>(tq, tq, out, lse, T, NH);
    }
    return cudaGetLastError() == cudaSuccess;
  }

 private:
  // A row-major (rows, cols) bf16 matrix in 64 × 64 boxes with the 128-byte swizzle.
  CUtensorMap map(const __nv_bfloat16* p, int rows, int cols) const {
    CUtensorMap m{};
    const cuuint64_t dims[2] = {static_cast<cuuint64_t>(cols), static_cast<cuuint64_t>(rows)};
    const cuuint64_t strides[1] = {static_cast<cuuint64_t>(cols) * 2};
    const cuuint32_t box[2] = {64, 64};
    const cuuint32_t elem[2] = {1, 1};
    const CUresult r = encode_(&m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, const_cast<__nv_bfloat16*>(p), dims,
                               strides, box, elem, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                               CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS) {
      std::fprintf(stderr, "attention_sm90: cuTensorMapEncodeTiled failed (%d)\n", static_cast<int>(r));
      std::abort();
    }
    return m;
  }

  PFN_cuTensorMapEncodeTiled_v12000 encode_ = nullptr;
};

}  // namespace gantry::sm90
