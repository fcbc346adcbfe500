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

#include <cuda.h>          // CUtensorMap
#include <cudaTypedefs.h>  // PFN_cuTensorMapEncodeTiled
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdlib>

namespace gantry::attention_wgmma {

constexpr uint32_t kTileBytes = 64 * 64 * 2;  // one 64 × 64 bf16 tile: Q, K or V
constexpr size_t kSmemBytes = 5 * kTileBytes + 1024 + 4 * sizeof(uint64_t);  // Q, 2 × (K, V), barriers

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void mbar_init(uint64_t* bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_u32(bar)), "r"(count));
}
__device__ __forceinline__ void mbar_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_u32(bar)), "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void mbar_wait(uint64_t* bar, int parity) {
  uint32_t done = 0;
  do {
    asm volatile(
        "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(smem_u32(bar)), "r"(parity)
        : "memory");
  } while (!done);
}
__device__ __forceinline__ void tma_load_2d(void* dst, const CUtensorMap* map, uint64_t* bar, int c0,
                                            int c1) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4}], "
      "[%2];" ::"r"(smem_u32(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(smem_u32(bar)), "r"(c0), "r"(c1)
      : "memory");
}
// Shared-memory matrix descriptor, 128-byte swizzle: 8-row groups (K-major) or 8-key groups (MN-major)
// 1,024 bytes apart.
__device__ __forceinline__ uint64_t desc_sw128(const void* p) {
  const uint64_t a = smem_u32(p);
  return ((a & 0x3FFFF) >> 4) | (1ull << 16) | (64ull << 32) | (1ull << 62);
}
__device__ __forceinline__ void wgmma_fence() {
  asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
}
__device__ __forceinline__ void wgmma_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
}
__device__ __forceinline__ void wgmma_wait_all() {
  asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
}
__device__ __forceinline__ void fence_operand(float& r) {
  asm volatile("" : "+f"(r)::"memory");
}

// S (64 × 64, fp32) = A·Bᵀ (+ S if scale_d): A and B K-major in shared memory.
__device__ __forceinline__ void mma_ss(float (&d)[32], uint64_t da, uint64_t db, int scale_d) {
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
// O (64 × 64, fp32) += A·B: A from registers (each warp's m16n8k16 A fragment), B MN-major in shared memory.
__device__ __forceinline__ void mma_rs_mn(float (&d)[32], const uint32_t (&a)[4], uint64_t db) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
      "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%"
      "27,%28,%29,%30,%31}, {%32,%33,%34,%35}, %36, p, 1, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]),
        "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]),
        "+f"(d[30]), "+f"(d[31])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1));
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

// The driver's tensor-map encoder and the device's compute capability, found once. Null encoder: no wgmma
// path.
struct Support {
  PFN_cuTensorMapEncodeTiled_v12000 encode = nullptr;
  bool hopper = false;
};
inline const Support& support() {
  static const Support s = [] {
    Support r;
    int dev = 0, major = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess) {
      return r;
    }
    r.hopper = major == 9;
    cudaDriverEntryPointQueryResult q{};
    void* fn = nullptr;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &q) ==
            cudaSuccess &&
        q == cudaDriverEntryPointSuccess) {
      r.encode = reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
    }
    if (r.hopper && r.encode != nullptr &&
        cudaFuncSetAttribute(forward_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             static_cast<int>(kSmemBytes)) != cudaSuccess) {
      r.encode = nullptr;
    }
    return r;
  }();
  return s;
}

// GANTRY_CUDA_ATTENTION_WGMMA=0 turns this path off (the mma.sync kernel for every shape), read once.
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
  const int C = NH * 64;
  CUtensorMap map{};
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(3 * C), static_cast<cuuint64_t>(B) * T};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(3 * C) * 2};
  const cuuint32_t box[2] = {64, 64};
  const cuuint32_t elem[2] = {1, 1};
  if (sup.encode(&map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, const_cast<__nv_bfloat16*>(qkv), dims, strides,
                 box, elem, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                 CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) != CUDA_SUCCESS) {
    return false;
  }
  forward_kernel<<<dim3(T / 64, B * NH), 128, kSmemBytes, stream>>>(map, out, lse, T, NH);
  return true;
}

}  // namespace gantry::attention_wgmma
