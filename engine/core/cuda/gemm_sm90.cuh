// Experiment (issue 19): a Hopper product with fused epilogues, D (M, N) = A (M, K) · B (N, K)ᵀ, bf16 in,
// fp32 accumulation, bf16 out. TMA loads into a 4-stage shared-memory ring (k-blocks of 32, 64-byte swizzle);
// one producer thread; two consumer warpgroups issuing wgmma m64n256k16 on a 128 × 256 tile; persistent over
// the tiles. The epilogue stages the whole tile's outputs in shared memory (128 KB, 64 × 64 boxes, 128-byte
// swizzle) and writes them by TMA stores, which drain while the next tile's products run; the GELU derivative's
// pre-activation comes in the same way, loaded by TMA while the tile's products run. Epilogues: none (timing
// only), bias, bias then GELU (tanh form) keeping the pre-activation, the GELU derivative times the product.
// Checked and timed against cuBLASLt by tests/bench/gemm_bench.cu; Matmul uses it only under
// GANTRY_CUDA_SM90_GEMM=1 while it is an experiment.
//
//   GemmSm90 g;                                    // finds cuTensorMapEncodeTiled once
//   g.run(GemmEpilogue::kBiasGelu, out, pre, a, b, bias, M, N, K, stream);
//
// Shapes: M % 128 == 0, N % 256 == 0, K % 32 == 0 (the GPT-2 MLP's products: M = B·T, N = 4C, K = C).
#pragma once

#include <cuda.h>          // CUtensorMap
#include <cudaTypedefs.h>  // PFN_cuTensorMapEncodeTiled
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>

namespace gantry::sm90 {

enum class GemmEpilogue { kNone, kBias, kBiasGelu, kDgelu };

constexpr int kBM = 128, kBN = 256, kBK = 32, kStages = 4, kThreads = 384;
constexpr uint32_t kSmemA = kBM * kBK * 2, kSmemB = kBN * kBK * 2, kStageBytes = kSmemA + kSmemB;
// Epilogue staging, per consumer warpgroup: two outputs × four boxes of 64 rows × 64 columns (8 KB each).
constexpr uint32_t kBoxBytes = 64 * 64 * 2, kOutBytes = 4 * kBoxBytes, kStageOutPerWg = 2 * kOutBytes;
constexpr size_t kSmemBytes = kStages * kStageBytes + 2 * kStageOutPerWg + 1024 + (2 * kStages + 2) * sizeof(uint64_t);

struct GemmArgs {
  int M, N, K;
  __nv_bfloat16* out;          // (M, N)
  __nv_bfloat16* pre;          // kBiasGelu: (M, N) written (x = A·Bᵀ + bias); kDgelu: (M, N) read
  const __nv_bfloat16* bias;   // (N) or null (kBias, kBiasGelu)
};

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void mbar_init(uint64_t* bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_u32(bar)), "r"(count));
}
__device__ __forceinline__ void mbar_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_u32(bar)), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_u32(bar)) : "memory");
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
__device__ __forceinline__ void tma_load_2d(void* dst, const CUtensorMap* map, uint64_t* bar, int c0, int c1) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4}], [%2];" ::"r"(
          smem_u32(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(smem_u32(bar)), "r"(c0), "r"(c1)
      : "memory");
}
__device__ __forceinline__ void tma_store_2d(const CUtensorMap* map, const void* src, int c0, int c1) {
  asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%2, %3}], [%1];" ::"l"(
                   reinterpret_cast<uint64_t>(map)),
               "r"(smem_u32(src)), "r"(c0), "r"(c1)
               : "memory");
}
__device__ __forceinline__ void tma_store_commit() { asm volatile("cp.async.bulk.commit_group;" ::: "memory"); }
__device__ __forceinline__ void tma_store_wait_read() {
  asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");
}
__device__ __forceinline__ void tma_store_wait_all() { asm volatile("cp.async.bulk.wait_group 0;" ::: "memory"); }
__device__ __forceinline__ void fence_async_shared() {
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}
__device__ __forceinline__ void warpgroup_bar(int id) { asm volatile("bar.sync %0, 128;" ::"r"(id) : "memory"); }
// Shared-memory matrix descriptor: K-major, 64-byte swizzle (rows of 32 bf16), 8-row groups 512 bytes apart.
__device__ __forceinline__ uint64_t desc_sw64(const void* p) {
  const uint64_t a = smem_u32(p);
  return ((a & 0x3FFFF) >> 4) | (1ull << 16) | (32ull << 32) | (2ull << 62);
}
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
}
__device__ __forceinline__ void fence_operand(float& r) { asm volatile("" : "+f"(r)::"memory"); }

// wgmma m64n256k16, bf16 × bf16 → fp32, A and B from shared memory (K-major, 128-byte swizzle).
__device__ __forceinline__ void wgmma_m64n256k16(float (&d)[128], uint64_t desc_a, uint64_t desc_b, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63,%64,%65,%66,%67,%68,%69,%70,%71,%72,%73,%74,%75,%76,%77,%78,%79,%80,%81,%82,%83,%84,%85,%86,%87,%88,%89,%90,%91,%92,%93,%94,%95,%96,%97,%98,%99,%100,%101,%102,%103,%104,%105,%106,%107,%108,%109,%110,%111,%112,%113,%114,%115,%116,%117,%118,%119,%120,%121,%122,%123,%124,%125,%126,%127}, %128, %129, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
      : "l"(desc_a), "l"(desc_b), "r"(scale_d));
}

__device__ __forceinline__ float tanh_approx(float x) {
  float y;
  asm("tanh.approx.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
// GELU, tanh form (as cuBLASLt's epilogue and the CPU reference), and its derivative.
__device__ __forceinline__ float gelu_of(float x) {
  const float u = 0.7978845608f * (x + 0.044715f * x * x * x);
  return 0.5f * x * (1.0f + tanh_approx(u));
}
__device__ __forceinline__ float dgelu_of(float x) {
  const float u = 0.7978845608f * (x + 0.044715f * x * x * x);
  const float t = tanh_approx(u);
  return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * 0.7978845608f * (1.0f + 3.0f * 0.044715f * x * x);
}

template <GemmEpilogue E>
__global__ void __launch_bounds__(kThreads, 1)
    gemm_sm90_kernel(const __grid_constant__ CUtensorMap tm_a, const __grid_constant__ CUtensorMap tm_b,
                     const __grid_constant__ CUtensorMap tm_out, const __grid_constant__ CUtensorMap tm_pre,
                     GemmArgs g) {
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t{1023});
  __nv_bfloat16* s_a = reinterpret_cast<__nv_bfloat16*>(smem);                      // kStages × (kBM, kBK)
  __nv_bfloat16* s_b = reinterpret_cast<__nv_bfloat16*>(smem + kStages * kSmemA);  // kStages × (kBN, kBK)
  uint8_t* s_out = smem + kStages * kStageBytes;                                    // 2 × [2][4] boxes
  uint64_t* full = reinterpret_cast<uint64_t*>(s_out + 2 * kStageOutPerWg);
  uint64_t* empty = full + kStages;
  uint64_t* epi = empty + kStages;  // per consumer warpgroup: the pre-activation boxes have landed (kDgelu)
  const int wg = threadIdx.x / 128, tid = threadIdx.x % 128;
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      mbar_init(&full[s], 1);
      mbar_init(&empty[s], 8);  // one arrival per consumer warp
    }
    mbar_init(&epi[0], 1);
    mbar_init(&epi[1], 1);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  const int tiles_n = g.N / kBN, tiles = (g.M / kBM) * tiles_n, kt = g.K / kBK;
  if (wg == 0) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 40;");
    if (tid == 0) {
      int it = 0;
      for (int t = blockIdx.x; t < tiles; t += gridDim.x) {
        const int m0 = (t / tiles_n) * kBM, n0 = (t % tiles_n) * kBN;
        for (int kb = 0; kb < kt; ++kb, ++it) {
          const int s = it % kStages;
          mbar_wait(&empty[s], ((it / kStages) & 1) ^ 1);
          mbar_expect_tx(&full[s], kStageBytes);
          tma_load_2d(s_a + s * kBM * kBK, &tm_a, &full[s], kb * kBK, m0);
          tma_load_2d(s_b + s * kBN * kBK, &tm_b, &full[s], kb * kBK, n0);
        }
      }
    }
  } else {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 232;");
    const int c = wg - 1, warp = tid / 32, lane = tid % 32;  // c: this warpgroup's 64 rows of the tile
    uint8_t* stage_out = s_out + c * kStageOutPerWg;
    float d[128];
    int it = 0, epi_phase = 0;
    for (int t = blockIdx.x; t < tiles; t += gridDim.x) {
      const int m0 = (t / tiles_n) * kBM, n0 = (t % tiles_n) * kBN;
      if constexpr (E == GemmEpilogue::kDgelu) {
        // The pre-activation boxes of this warpgroup's rows come in while the products run.
        if (tid == 0) {
          tma_store_wait_read();  // the last tile's stores have read the staging boxes
          mbar_expect_tx(&epi[c], kOutBytes);
          for (int j = 0; j < 4; ++j) {
            tma_load_2d(stage_out + j * kBoxBytes, &tm_pre, &epi[c], n0 + 64 * j, m0 + c * 64);
          }
        }
      }
      for (int kb = 0; kb < kt; ++kb, ++it) {
        const int s = it % kStages;
        mbar_wait(&full[s], (it / kStages) & 1);
        const uint64_t da = desc_sw64(s_a + s * kBM * kBK + c * 64 * kBK), db = desc_sw64(s_b + s * kBN * kBK);
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < kBK / 16; ++kk) {
          wgmma_m64n256k16(d, da + 2 * kk, db + 2 * kk, (kb > 0 || kk > 0) ? 1 : 0);
        }
        wgmma_commit();
        if (kb > 0) {
          wgmma_wait<1>();  // the previous k-block's products are done: its stage goes back to the producer
          if (lane == 0) mbar_arrive(&empty[(it - 1) % kStages]);
        }
      }
      wgmma_wait<0>();
      if (lane == 0) mbar_arrive(&empty[(it - 1) % kStages]);
#pragma unroll
      for (int i = 0; i < 128; ++i) fence_operand(d[i]);
      if constexpr (E == GemmEpilogue::kNone) continue;
      // Accumulator fragment: d[4i + {0,1}] at (rr, 8i + 2q + {0,1}), d[4i + {2,3}] at (rr + 8, same columns).
      // In the staging: box i / 8 (64 columns), row rr of 128 bytes whose 16-byte chunk (i % 8) sits at
      // (i % 8) ^ (rr % 8) (TMA's 128-byte swizzle), so a warp's 8 rows hit 32 distinct banks.
      const int q = lane % 4, rr = warp * 16 + lane / 4;
      auto at = [&](int o, int i, int row) {
        return stage_out + o * kOutBytes + (i / 8) * kBoxBytes + row * 128 + (((i % 8) ^ (row % 8)) * 16) + 4 * q;
      };
      if constexpr (E == GemmEpilogue::kDgelu) {
        mbar_wait(&epi[c], epi_phase);
        epi_phase ^= 1;
#pragma unroll
        for (int i = 0; i < kBN / 8; ++i) {
          __nv_bfloat162* p0 = reinterpret_cast<__nv_bfloat162*>(at(0, i, rr));
          __nv_bfloat162* p8 = reinterpret_cast<__nv_bfloat162*>(at(0, i, rr + 8));
          const float2 x0 = __bfloat1622float2(*p0), x8 = __bfloat1622float2(*p8);
          *p0 = __floats2bfloat162_rn(d[4 * i] * dgelu_of(x0.x), d[4 * i + 1] * dgelu_of(x0.y));
          *p8 = __floats2bfloat162_rn(d[4 * i + 2] * dgelu_of(x8.x), d[4 * i + 3] * dgelu_of(x8.y));
        }
      } else {
        if (tid == 0) tma_store_wait_read();  // the last tile's stores have read the staging boxes
        warpgroup_bar(1 + c);
#pragma unroll
        for (int i = 0; i < kBN / 8; ++i) {
          float x0 = d[4 * i], x1 = d[4 * i + 1], x2 = d[4 * i + 2], x3 = d[4 * i + 3];
          if (g.bias != nullptr) {
            const float2 b =
                __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(g.bias + n0 + 8 * i + 2 * q));
            x0 += b.x, x1 += b.y, x2 += b.x, x3 += b.y;
          }
          *reinterpret_cast<__nv_bfloat162*>(at(0, i, rr)) = __floats2bfloat162_rn(x0, x1);
          *reinterpret_cast<__nv_bfloat162*>(at(0, i, rr + 8)) = __floats2bfloat162_rn(x2, x3);
          if constexpr (E == GemmEpilogue::kBiasGelu) {
            *reinterpret_cast<__nv_bfloat162*>(at(1, i, rr)) = __floats2bfloat162_rn(gelu_of(x0), gelu_of(x1));
            *reinterpret_cast<__nv_bfloat162*>(at(1, i, rr + 8)) = __floats2bfloat162_rn(gelu_of(x2), gelu_of(x3));
          }
        }
      }
      fence_async_shared();
      warpgroup_bar(1 + c);
      if (tid == 0) {
        // kBiasGelu: box set 0 is the pre-activation, set 1 the output; otherwise set 0 is the output.
        constexpr int kSets = E == GemmEpilogue::kBiasGelu ? 2 : 1;
        for (int o = 0; o < kSets; ++o) {
          const CUtensorMap* map = (E == GemmEpilogue::kBiasGelu && o == 0) ? &tm_pre : &tm_out;
          for (int j = 0; j < 4; ++j) tma_store_2d(map, stage_out + o * kOutBytes + j * kBoxBytes, n0 + 64 * j, m0 + c * 64);
        }
        tma_store_commit();
      }
    }
    if (tid == 0) tma_store_wait_all();  // stores drained before the CTA's shared memory goes
  }
}

// Host side: tensor maps are made per call (cheap, host only); the driver's encoder is found once.
class GemmSm90 {
 public:
  GemmSm90() {
    cudaDriverEntryPointQueryResult q{};
    void* fn = nullptr;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess || fn == nullptr) {
      std::fprintf(stderr, "gemm_sm90: no cuTensorMapEncodeTiled\n");
      std::abort();
    }
    encode_ = reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
    int dev = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&sms_, cudaDevAttrMultiProcessorCount, dev);
    for (const void* k : {reinterpret_cast<const void*>(gemm_sm90_kernel<GemmEpilogue::kNone>),
                          reinterpret_cast<const void*>(gemm_sm90_kernel<GemmEpilogue::kBias>),
                          reinterpret_cast<const void*>(gemm_sm90_kernel<GemmEpilogue::kBiasGelu>),
                          reinterpret_cast<const void*>(gemm_sm90_kernel<GemmEpilogue::kDgelu>)}) {
      cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(kSmemBytes));
    }
  }

  static bool supports(int M, int N, int K) { return M % kBM == 0 && N % kBN == 0 && K % kBK == 0; }

  // out (M, N) = epilogue(a (M, K) · b (N, K)ᵀ). Returns false for a shape it does not take or a failed launch.
  bool run(GemmEpilogue e, __nv_bfloat16* out, __nv_bfloat16* pre, const __nv_bfloat16* a, const __nv_bfloat16* b,
           const __nv_bfloat16* bias, int M, int N, int K, cudaStream_t stream) {
    if (!supports(M, N, K)) return false;
    const bool has_pre = e == GemmEpilogue::kBiasGelu || e == GemmEpilogue::kDgelu;
    const CUtensorMap ta = map(a, M, K, kBK, kBM, CU_TENSOR_MAP_SWIZZLE_64B),
                      tb = map(b, N, K, kBK, kBN, CU_TENSOR_MAP_SWIZZLE_64B),
                      to = map(out, M, N, 64, 64, CU_TENSOR_MAP_SWIZZLE_128B),
                      tp = has_pre ? map(pre, M, N, 64, 64, CU_TENSOR_MAP_SWIZZLE_128B) : to;
    const GemmArgs g{M, N, K, out, pre, bias};
    const int tiles = (M / kBM) * (N / kBN), ctas = tiles < sms_ ? tiles : sms_;
    switch (e) {
      case GemmEpilogue::kNone:
        gemm_sm90_kernel<GemmEpilogue::kNone><<<ctas, kThreads, kSmemBytes, stream>>>(ta, tb, to, tp, g);
        break;
      case GemmEpilogue::kBias:
        gemm_sm90_kernel<GemmEpilogue::kBias><<<ctas, kThreads, kSmemBytes, stream>>>(ta, tb, to, tp, g);
        break;
      case GemmEpilogue::kBiasGelu:
        gemm_sm90_kernel<GemmEpilogue::kBiasGelu><<<ctas, kThreads, kSmemBytes, stream>>>(ta, tb, to, tp, g);
        break;
      case GemmEpilogue::kDgelu:
        gemm_sm90_kernel<GemmEpilogue::kDgelu><<<ctas, kThreads, kSmemBytes, stream>>>(ta, tb, to, tp, g);
        break;
    }
    return cudaGetLastError() == cudaSuccess;
  }

 private:
  // A row-major (rows, cols) bf16 matrix in (box_rows, box_cols) boxes.
  CUtensorMap map(const __nv_bfloat16* p, int rows, int cols, int box_cols, int box_rows,
                  CUtensorMapSwizzle swizzle) const {
    CUtensorMap m{};
    const cuuint64_t dims[2] = {static_cast<cuuint64_t>(cols), static_cast<cuuint64_t>(rows)};
    const cuuint64_t strides[1] = {static_cast<cuuint64_t>(cols) * 2};
    const cuuint32_t box[2] = {static_cast<cuuint32_t>(box_cols), static_cast<cuuint32_t>(box_rows)};
    const cuuint32_t elem[2] = {1, 1};
    const CUresult r = encode_(&m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, const_cast<__nv_bfloat16*>(p), dims, strides,
                               box, elem, CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                               CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS) {
      std::fprintf(stderr, "gemm_sm90: cuTensorMapEncodeTiled failed (%d)\n", static_cast<int>(r));
      std::abort();
    }
    return m;
  }

  PFN_cuTensorMapEncodeTiled_v12000 encode_ = nullptr;
  int sms_ = 132;
};

}  // namespace gantry::sm90
