// Experiment (issue 19), not used by the engine: a Hopper product with fused epilogues, D (M, N) = A (M, K) ·
// B (N, K)ᵀ, bf16 in, fp32 accumulation, bf16 out. TMA loads into a 4-stage shared-memory ring (k-blocks of
// 64, 128-byte swizzle); one producer thread; two consumer warpgroups issuing wgmma m64n256k16 on a 128 × 256
// tile; persistent over the tiles. With kCluster 2, two CTAs (tiles m, m+1 of one column) each load half of B
// and multicast it to both (measured slower). The epilogue stages each warpgroup's rows in shared memory
// (128-byte swizzle) and writes them by TMA stores, in rounds of 64 × 128 that wait for the previous round's
// store: that wait is why the GELU epilogue still costs 17 % over the plain product (docs/PERF.md, issue 19).
// Epilogues: none (timing only), bias, bias then GELU (tanh form) keeping the pre-activation, the GELU
// derivative times the product (pre-activation read from global memory: slow). Checked and timed against
// cuBLASLt and a float64 CPU reference by gemm_bench.cu beside it. A later version (git history: "sm90
// product v3") staged the whole tile with k-blocks of 32 and lost more in the main loop than it gained.
//
//   GemmSm90 g;                                    // finds cuTensorMapEncodeTiled once
//   g.run(GemmEpilogue::kBiasGelu, out, pre, a, b, bias, M, N, K, stream);
//
// Shapes: M % 256 == 0, N % 256 == 0, K % 64 == 0 (the GPT-2 MLP's products: M = B·T, N = 4C, K = C).
#pragma once

#include <cuda.h>          // CUtensorMap
#include <cudaTypedefs.h>  // PFN_cuTensorMapEncodeTiled
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "engine/core/cuda/sm90_ptx.cuh"

namespace gantry::sm90 {

enum class GemmEpilogue { kNone, kBias, kBiasGelu, kDgelu };

constexpr int kBM = 128, kBN = 256, kBK = 64, kStages = 4, kThreads = 384;
constexpr uint32_t kSmemA = kBM * kBK * 2, kSmemB = kBN * kBK * 2, kStageBytes = kSmemA + kSmemB;
// Epilogue staging: per consumer warpgroup, 64 rows × 128 columns (two 64 × 64 boxes of 8 KB).
constexpr uint32_t kStageOut = 2 * 2 * 64 * 64 * 2;
constexpr size_t kSmemBytes = kStages * kStageBytes + kStageOut + 1024 + 2 * kStages * sizeof(uint64_t);

struct GemmArgs {
  int M, N, K;
  __nv_bfloat16* out;         // (M, N)
  __nv_bfloat16* pre;         // kBiasGelu: (M, N) written (x = A·Bᵀ + bias); kDgelu: (M, N) read
  const __nv_bfloat16* bias;  // (N) or null (kBias, kBiasGelu)
};

// wgmma m64n256k16, bf16 × bf16 → fp32, A and B from shared memory (K-major, 128-byte swizzle).
__device__ __forceinline__ void wgmma_m64n256k16(float (&d)[128], uint64_t desc_a, uint64_t desc_b,
                                                 int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 "
      "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%"
      "27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%"
      "52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63,%64,%65,%66,%67,%68,%69,%70,%71,%72,%73,%74,%75,%76,%"
      "77,%78,%79,%80,%81,%82,%83,%84,%85,%86,%87,%88,%89,%90,%91,%92,%93,%94,%95,%96,%97,%98,%99,%100,%101,%"
      "102,%103,%104,%105,%106,%107,%108,%109,%110,%111,%112,%113,%114,%115,%116,%117,%118,%119,%120,%121,%"
      "122,%123,%124,%125,%126,%127}, %128, %129, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]),
        "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]),
        "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]),
        "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]),
        "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]),
        "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]),
        "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]),
        "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]),
        "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]),
        "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]),
        "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]),
        "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]),
        "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), "+f"(d[104]), "+f"(d[105]), "+f"(d[106]),
        "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), "+f"(d[112]), "+f"(d[113]),
        "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), "+f"(d[120]),
        "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
      : "l"(desc_a), "l"(desc_b), "r"(scale_d));
}

template <GemmEpilogue E, int kCluster>
__global__ void __launch_bounds__(kThreads, 1)
    gemm_sm90_kernel(const __grid_constant__ CUtensorMap tm_a, const __grid_constant__ CUtensorMap tm_b,
                     const __grid_constant__ CUtensorMap tm_out, const __grid_constant__ CUtensorMap tm_pre,
                     GemmArgs g) {
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem =
      reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t{1023});
  __nv_bfloat16* s_a = reinterpret_cast<__nv_bfloat16*>(smem);                     // kStages × (kBM, kBK)
  __nv_bfloat16* s_b = reinterpret_cast<__nv_bfloat16*>(smem + kStages * kSmemA);  // kStages × (kBN, kBK)
  uint8_t* s_out = smem + kStages * kStageBytes;                                   // 2 × (64, 128) staging
  uint64_t* full = reinterpret_cast<uint64_t*>(s_out + kStageOut);
  uint64_t* empty = full + kStages;
  const int wg = threadIdx.x / 128, tid = threadIdx.x % 128;
  const uint32_t rank = kCluster > 1 ? cluster_rank() : 0;
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      mbar_init(&full[s], 1);
      mbar_init(&empty[s], 8 * kCluster);  // one arrival per consumer warp of every CTA that reads the stage
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  if constexpr (kCluster > 1) {
    cluster_sync();
  } else {
    __syncthreads();
  }
  const int tiles_n = g.N / kBN, kt = g.K / kBK;
  // A unit is kCluster m-tiles of one column; this CTA takes the rank-th.
  const int units = (g.M / (kBM * kCluster)) * tiles_n;
  const int first = static_cast<int>(blockIdx.x) / kCluster, stride = static_cast<int>(gridDim.x) / kCluster;
  if (wg == 0) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 40;");
    if (tid == 0) {
      int it = 0;
      for (int u = first; u < units; u += stride) {
        const int m0 = ((u / tiles_n) * kCluster + static_cast<int>(rank)) * kBM, n0 = (u % tiles_n) * kBN;
        for (int kb = 0; kb < kt; ++kb, ++it) {
          const int s = it % kStages;
          mbar_wait(&empty[s], ((it / kStages) & 1) ^ 1);
          mbar_expect_tx(&full[s], kStageBytes);
          tma_load_2d(s_a + s * kBM * kBK, &tm_a, &full[s], kb * kBK, m0);
          if constexpr (kCluster == 1) {
            tma_load_2d(s_b + s * kBN * kBK, &tm_b, &full[s], kb * kBK, n0);
          } else {
            constexpr int half = kBN / 2;
            tma_load_2d_multicast(s_b + s * kBN * kBK + rank * half * kBK, &tm_b, &full[s], kb * kBK,
                                  n0 + static_cast<int>(rank) * half, 0x3);
          }
        }
      }
    }
  } else {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 232;");
    const int c = wg - 1, warp = tid / 32, lane = tid % 32;  // c: this warpgroup's 64 rows of the tile
    uint8_t* stage_out = s_out + c * (kStageOut / 2);
    auto release = [&](int idx) {
      if (lane == 0) {
        mbar_arrive(&empty[idx % kStages]);
        if constexpr (kCluster > 1) mbar_arrive_cluster(&empty[idx % kStages], rank ^ 1);
      }
    };
    float d[128];
    int it = 0;
    for (int u = first; u < units; u += stride) {
      const int m0 = ((u / tiles_n) * kCluster + static_cast<int>(rank)) * kBM, n0 = (u % tiles_n) * kBN;
      for (int kb = 0; kb < kt; ++kb, ++it) {
        const int s = it % kStages;
        mbar_wait(&full[s], (it / kStages) & 1);
        const uint64_t da = desc_sw128(s_a + s * kBM * kBK + c * 64 * kBK),
                       db = desc_sw128(s_b + s * kBN * kBK);
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < kBK / 16; ++kk) {
          wgmma_m64n256k16(d, da + 2 * kk, db + 2 * kk, (kb > 0 || kk > 0) ? 1 : 0);
        }
        wgmma_commit();
        if (kb > 0) {
          wgmma_wait<1>();  // the previous k-block's products are done: its stage goes back to the producers
          release(it - 1);
        }
      }
      wgmma_wait<0>();
      release(it - 1);
#pragma unroll
      for (int i = 0; i < 128; ++i) fence_operand(d[i]);
      if constexpr (E == GemmEpilogue::kNone) continue;
      // Accumulator fragment: d[4i + {0,1}] at (rr, 8i + 2q + {0,1}), d[4i + {2,3}] at (rr + 8, same
      // columns).
      const int q = lane % 4, rr = warp * 16 + lane / 4;
      if constexpr (E == GemmEpilogue::kDgelu) {
        const size_t row0 = static_cast<size_t>(m0 + c * 64 + rr) * g.N,
                     row8 = row0 + 8 * static_cast<size_t>(g.N);
#pragma unroll
        for (int i = 0; i < kBN / 8; ++i) {
          const int col = n0 + 8 * i + 2 * q;
          const float2 p0 = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(g.pre + row0 + col));
          const float2 p8 = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(g.pre + row8 + col));
          d[4 * i] *= dgelu_of(p0.x), d[4 * i + 1] *= dgelu_of(p0.y);
          d[4 * i + 2] *= dgelu_of(p8.x), d[4 * i + 3] *= dgelu_of(p8.y);
        }
      } else if (g.bias != nullptr) {
#pragma unroll
        for (int i = 0; i < kBN / 8; ++i) {
          const float2 b =
              __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(g.bias + n0 + 8 * i + 2 * q));
          d[4 * i] += b.x, d[4 * i + 1] += b.y, d[4 * i + 2] += b.x, d[4 * i + 3] += b.y;
        }
      }
      // Out through the staging boxes: 64 rows × 64 columns, rows of 128 bytes whose 16-byte chunks are
      // swizzled by the row (as TMA's 128-byte swizzle expects), so a warp's 8 rows hit 32 distinct banks.
      constexpr int kPasses = E == GemmEpilogue::kBiasGelu ? 2 : 1;
#pragma unroll
      for (int pass = 0; pass < kPasses; ++pass) {
        const CUtensorMap* map = (E == GemmEpilogue::kBiasGelu && pass == 0) ? &tm_pre : &tm_out;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          if (tid == 0) tma_store_wait_read<0>();  // the staging boxes' last store has read them
          warpgroup_bar(1 + c);
#pragma unroll
          for (int j = 0; j < 16; ++j) {
            const int i = 16 * h + j;
            float x0 = d[4 * i], x1 = d[4 * i + 1], x2 = d[4 * i + 2], x3 = d[4 * i + 3];
            if (E == GemmEpilogue::kBiasGelu && pass == 1) {
              x0 = gelu_of(x0), x1 = gelu_of(x1), x2 = gelu_of(x2), x3 = gelu_of(x3);
            }
            uint8_t* box = stage_out + (j / 8) * 8192;
            const int chunk = (j % 8) ^ (rr % 8);
            *reinterpret_cast<__nv_bfloat162*>(box + rr * 128 + chunk * 16 + 4 * q) =
                __floats2bfloat162_rn(x0, x1);
            *reinterpret_cast<__nv_bfloat162*>(box + (rr + 8) * 128 + chunk * 16 + 4 * q) =
                __floats2bfloat162_rn(x2, x3);
          }
          fence_async_shared();
          warpgroup_bar(1 + c);
          if (tid == 0) {
            tma_store_2d(map, stage_out, n0 + 128 * h, m0 + c * 64);
            tma_store_2d(map, stage_out + 8192, n0 + 128 * h + 64, m0 + c * 64);
            tma_store_commit();
          }
        }
      }
    }
    if (tid == 0) tma_store_wait_all();  // stores drained before the CTA's shared memory goes
  }
  if constexpr (kCluster > 1)
    cluster_sync();  // no CTA leaves while its peer may still arrive on its barriers
}

// Host side: tensor maps are made per call (cheap, host only); the driver's encoder is found once.
class GemmSm90 {
 public:
  explicit GemmSm90(int cluster = 1) : cluster_(cluster == 2 ? 2 : 1) {
    encode_ = sm90::support().encode;
    if (encode_ == nullptr) {
      std::fprintf(stderr, "gemm_sm90: no cuTensorMapEncodeTiled\n");
      std::abort();
    }
    int dev = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&sms_, cudaDevAttrMultiProcessorCount, dev);
    prepare<GemmEpilogue::kNone>();
    prepare<GemmEpilogue::kBias>();
    prepare<GemmEpilogue::kBiasGelu>();
    prepare<GemmEpilogue::kDgelu>();
    if (cluster_ == 2) {
      cudaLaunchConfig_t cfg{};
      cudaLaunchAttribute attr{};
      attr.id = cudaLaunchAttributeClusterDimension;
      attr.val.clusterDim.x = 2, attr.val.clusterDim.y = 1, attr.val.clusterDim.z = 1;
      cfg.gridDim = dim3(2 * sms_), cfg.blockDim = dim3(kThreads), cfg.dynamicSmemBytes = kSmemBytes;
      cfg.attrs = &attr, cfg.numAttrs = 1;
      int clusters = 0;
      if (cudaOccupancyMaxActiveClusters(&clusters, gemm_sm90_kernel<GemmEpilogue::kBiasGelu, 2>, &cfg) ==
              cudaSuccess &&
          clusters > 0) {
        max_ctas_ = 2 * clusters;
      } else {
        max_ctas_ = sms_ / 2 * 2;
      }
    } else {
      max_ctas_ = sms_;
    }
  }

  int cluster() const { return cluster_; }
  int ctas() const { return max_ctas_; }
  static bool supports(int M, int N, int K) { return M % (2 * kBM) == 0 && N % kBN == 0 && K % kBK == 0; }

  // out (M, N) = epilogue(a (M, K) · b (N, K)ᵀ). Returns false for a shape it does not take or a failed
  // launch.
  bool run(GemmEpilogue e, __nv_bfloat16* out, __nv_bfloat16* pre, const __nv_bfloat16* a,
           const __nv_bfloat16* b, const __nv_bfloat16* bias, int M, int N, int K, cudaStream_t stream) {
    if (!supports(M, N, K)) return false;
    const CUtensorMap ta = map(a, M, K, kBK, kBM), tb = map(b, N, K, kBK, kBN / cluster_),
                      to = map(out, M, N, 64, 64),
                      tp = e == GemmEpilogue::kBiasGelu ? map(pre, M, N, 64, 64) : to;
    const GemmArgs g{M, N, K, out, pre, bias};
    switch (e) {
      case GemmEpilogue::kNone:
        return launch<GemmEpilogue::kNone>(ta, tb, to, tp, g, stream);
      case GemmEpilogue::kBias:
        return launch<GemmEpilogue::kBias>(ta, tb, to, tp, g, stream);
      case GemmEpilogue::kBiasGelu:
        return launch<GemmEpilogue::kBiasGelu>(ta, tb, to, tp, g, stream);
      case GemmEpilogue::kDgelu:
        return launch<GemmEpilogue::kDgelu>(ta, tb, to, tp, g, stream);
    }
    return false;
  }

 private:
  template <GemmEpilogue E>
  void prepare() {
    cudaFuncSetAttribute(gemm_sm90_kernel<E, 1>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                         static_cast<int>(kSmemBytes));
    cudaFuncSetAttribute(gemm_sm90_kernel<E, 2>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                         static_cast<int>(kSmemBytes));
  }

  template <GemmEpilogue E>
  bool launch(const CUtensorMap& ta, const CUtensorMap& tb, const CUtensorMap& to, const CUtensorMap& tp,
              const GemmArgs& g, cudaStream_t stream) {
    const int units = (g.M / (kBM * cluster_)) * (g.N / kBN);
    int ctas = units * cluster_;
    if (ctas > max_ctas_) ctas = max_ctas_;
    if (cluster_ == 1) {
      gemm_sm90_kernel<E, 1><<<ctas, kThreads, kSmemBytes, stream>>>(ta, tb, to, tp, g);
      return cudaGetLastError() == cudaSuccess;
    }
    cudaLaunchConfig_t cfg{};
    cudaLaunchAttribute attr{};
    attr.id = cudaLaunchAttributeClusterDimension;
    attr.val.clusterDim.x = 2, attr.val.clusterDim.y = 1, attr.val.clusterDim.z = 1;
    cfg.gridDim = dim3(ctas), cfg.blockDim = dim3(kThreads), cfg.dynamicSmemBytes = kSmemBytes,
    cfg.stream = stream;
    cfg.attrs = &attr, cfg.numAttrs = 1;
    return cudaLaunchKernelEx(&cfg, gemm_sm90_kernel<E, 2>, ta, tb, to, tp, g) == cudaSuccess;
  }

  // A row-major (rows, cols) bf16 matrix in (box_rows, box_cols) boxes with the 128-byte swizzle.
  CUtensorMap map(const __nv_bfloat16* p, int rows, int cols, int box_cols, int box_rows) const {
    CUtensorMap m{};
    const cuuint64_t dims[2] = {static_cast<cuuint64_t>(cols), static_cast<cuuint64_t>(rows)};
    const cuuint64_t strides[1] = {static_cast<cuuint64_t>(cols) * 2};
    const cuuint32_t box[2] = {static_cast<cuuint32_t>(box_cols), static_cast<cuuint32_t>(box_rows)};
    const cuuint32_t elem[2] = {1, 1};
    const CUresult r = encode_(&m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, const_cast<__nv_bfloat16*>(p), dims,
                               strides, box, elem, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                               CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS) {
      std::fprintf(stderr, "gemm_sm90: cuTensorMapEncodeTiled failed (%d)\n", static_cast<int>(r));
      std::abort();
    }
    return m;
  }

  PFN_cuTensorMapEncodeTiled_v12000 encode_ = nullptr;
  int cluster_ = 1;
  int sms_ = 132;
  int max_ctas_ = 132;
};

}  // namespace gantry::sm90
