// Experiment (issue 19), not used by the engine: it beat cuBLASLt's GELU epilogue alone by up to 10 % but
// moved the training step by less than the spread (docs/PERF.md, issue 19 second session, calls P1-P3).
// Hopper product with fused epilogues, "ping-pong" schedule: D (M, N) = A (M, K) · B (N, K)ᵀ,
// bf16 in, fp32 accumulation, bf16 out. One producer warp loads k-blocks of 64 by TMA into a shared ring
// (128-byte swizzle); two consumer warpgroups each own a whole 128 × 128 output tile (two wgmma m64n128k16
// per k-step) and take the CTA's tiles in turn, so one warpgroup's epilogue (bias, GELU, stores) runs while
// the other's products keep the tensor cores busy. The ring is filled in tile order, which alone makes the
// two main loops alternate. Outputs leave through per-warpgroup staging slots (128 rows × 64 columns, TMA
// stores, two slots so that writing one overlaps the other's store). Persistent grid, one CTA per SM.
// Deterministic: every output element is one thread's fixed-order sum.
//
// Epilogues: none (timing only), bias, bias then GELU (tanh form) keeping the pre-activation, and the GELU
// derivative times the product (pre-activation loaded by TMA into the staging slots during the main loop).
//
//   hopper::Gemm g;                                   // finds cuTensorMapEncodeTiled once (Gemm g(2):
//   clusters) g.run(hopper::Epilogue::kBiasGelu, out, pre, a, b, bias, M, N, K, stream);
//
// Shapes: M % 128 == 0 (256 with clusters), N % 128 == 0, K % 64 == 0 (the GPT-2 MLP products).
#pragma once

#include <cuda.h>          // CUtensorMap
#include <cudaTypedefs.h>  // PFN_cuTensorMapEncodeTiled
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "engine/core/cuda/sm90_ptx.cuh"

namespace gantry::hopper {

enum class Epilogue { kNone, kBias, kBiasGelu, kDgelu };

constexpr int kTM = 128, kTN = 128, kBK = 64, kThreads = 384;
constexpr uint32_t kSmemA = kTM * kBK * 2, kSmemB = kTN * kBK * 2, kStageBytes = kSmemA + kSmemB;
constexpr uint32_t kSlotBytes = kTM * 64 * 2;  // one staging slot: 128 rows × 64 columns, bf16
template <int kStages>
constexpr size_t smem_bytes() {
  return kStages * kStageBytes + 4 * kSlotBytes + 1024 + (2 * kStages + 2) * sizeof(uint64_t);
}

struct Args {
  int M, N, K;
  const __nv_bfloat16* bias;  // (N) or null (kBias, kBiasGelu)
};

namespace detail {

// The PTX pieces shared with the attention kernels (engine/core/cuda/sm90_ptx.cuh).
using sm90::cluster_rank;
using sm90::cluster_sync;
using sm90::desc_sw128;
using sm90::dgelu_of;
using sm90::fence_async_shared;
using sm90::fence_operand;
using sm90::gelu_of;
using sm90::mbar_arrive;
using sm90::mbar_expect_tx;
using sm90::mbar_init;
using sm90::mbar_wait;
using sm90::smem_u32;
using sm90::tma_load_2d;
using sm90::tma_load_2d_multicast;
using sm90::tma_store_2d;
using sm90::tma_store_commit;
using sm90::tma_store_wait_all;
using sm90::tma_store_wait_read;
using sm90::warpgroup_bar;
using sm90::wgmma_commit;
using sm90::wgmma_fence;
using sm90::wgmma_wait;

// Arrive on the barrier at the same offset in CTA `rank` of this cluster. Default semantics (release, CTA
// scope): the stage's reads were wgmma's, finished by wgmma.wait before this. (P2-P3 used
// .release.cluster here.)
__device__ __forceinline__ void mbar_arrive_remote(uint64_t* bar, uint32_t rank) {
  asm volatile(
      "{\n.reg .b32 ra;\nmapa.shared::cluster.u32 ra, %0, %1;\n"
      "mbarrier.arrive.shared::cluster.b64 _, [ra];\n}\n" ::"r"(smem_u32(bar)),
      "r"(rank)
      : "memory");
}
// The two consumer warpgroups' hand-off (256 threads: one warpgroup waits, the other arrives).
__device__ __forceinline__ void order_wait(int id) {
  asm volatile("bar.sync %0, 256;" ::"r"(id) : "memory");
}
__device__ __forceinline__ void order_arrive(int id) {
  asm volatile("bar.arrive %0, 256;" ::"r"(id) : "memory");
}
// wgmma m64n128k16, bf16 × bf16 → fp32, A and B from shared memory (K-major, 128-byte swizzle).
__device__ __forceinline__ void wgmma_m64n128k16(float (&d)[64], uint64_t desc_a, uint64_t desc_b,
                                                 int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
      "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%"
      "27,"
      "%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%"
      "53,"
      "%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, %64, %65, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]),
        "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]),
        "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]),
        "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]),
        "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]),
        "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]),
        "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "l"(desc_a), "l"(desc_b), "r"(scale_d));
}

}  // namespace detail

// With kCluster 2, the two CTAs of a cluster take tiles m, m+1 of one column in step, and each loads half of
// the B tile and multicasts it to both (a quarter less read from L2); a stage is refilled once both CTAs'
// consumers have released it.
// tm_a: A (M, K) in 64 × 128 boxes; tm_b: B (N, K) in 64 × (128 / kCluster) boxes; tm_out, tm_pre: (M, N) in
// 64-column × 128-row boxes (kBiasGelu writes the pre-activation through tm_pre, kDgelu reads it).
template <Epilogue E, int kStages, int kCluster, bool kShareB = kCluster == 2>
__global__ void __launch_bounds__(kThreads, 1)
    gemm_pingpong_kernel(const __grid_constant__ CUtensorMap tm_a, const __grid_constant__ CUtensorMap tm_b,
                         const __grid_constant__ CUtensorMap tm_out,
                         const __grid_constant__ CUtensorMap tm_pre, Args g) {
  using namespace detail;
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem =
      reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t{1023});
  uint8_t* s_a = smem;                            // kStages × (128, 64)
  uint8_t* s_b = smem + kStages * kSmemA;         // kStages × (128, 64)
  uint8_t* s_out = smem + kStages * kStageBytes;  // 2 warpgroups × 2 slots × (128, 64)
  uint64_t* full = reinterpret_cast<uint64_t*>(s_out + 4 * kSlotBytes);
  uint64_t* empty = full + kStages;
  uint64_t* pre_bar = empty + kStages;  // kDgelu: one per consumer warpgroup
  const int wg = threadIdx.x / 128, tid = threadIdx.x % 128;
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      mbar_init(&full[s], 1);
      mbar_init(&empty[s],
                kShareB ? 4 * kCluster : 4);  // one arrival per warp of the warpgroup that read it, each CTA
    }
    mbar_init(&pre_bar[0], 1);
    mbar_init(&pre_bar[1], 1);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  if constexpr (kCluster > 1) {
    cluster_sync();
  } else {
    __syncthreads();
  }
  const uint32_t rank = kCluster > 1 ? cluster_rank() : 0;
  // A unit is kCluster m-tiles of one column; this CTA takes the rank-th. "tiles" counts units below.
  const int tiles_n = g.N / kTN, tiles = (g.M / (kTM * kCluster)) * tiles_n, kt = g.K / kBK;
  const int first = static_cast<int>(blockIdx.x) / kCluster, stride = static_cast<int>(gridDim.x) / kCluster;
  auto tile_m0 = [&](int u) { return ((u / tiles_n) * kCluster + static_cast<int>(rank)) * kTM; };
  if (wg == 0) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 40;");
    if (tid == 0) {
      int it = 0;
      for (int u = first; u < tiles; u += stride) {
        const int m0 = tile_m0(u), n0 = (u % tiles_n) * kTN;
        for (int kb = 0; kb < kt; ++kb, ++it) {
          const int s = it % kStages;
          mbar_wait(&empty[s], ((it / kStages) & 1) ^ 1);
          mbar_expect_tx(&full[s], kStageBytes);
          tma_load_2d(s_a + s * kSmemA, &tm_a, &full[s], kb * kBK, m0);
          if constexpr (!kShareB) {
            tma_load_2d(s_b + s * kSmemB, &tm_b, &full[s], kb * kBK, n0);
          } else {
            constexpr int half = kTN / 2;
            tma_load_2d_multicast(s_b + s * kSmemB + rank * half * kBK * 2, &tm_b, &full[s], kb * kBK,
                                  n0 + static_cast<int>(rank) * half, 0x3);  // both CTAs of the cluster
          }
        }
      }
    }
  } else {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 232;");
    const int c = wg - 1, warp = tid / 32, lane = tid % 32;
    uint8_t* slots = s_out + c * 2 * kSlotBytes;
    float d0[64], d1[64];                // rows 0-63 and 64-127 of the tile
    int slot = 0;                        // the staging slot written next
    int local = 0;                       // this warpgroup's tiles so far (kDgelu's barrier parity)
    auto release = [&](uint64_t* bar) {  // the stage goes back to this CTA's producer and the peer's
      mbar_arrive(bar);
      if constexpr (kShareB) mbar_arrive_remote(bar, rank ^ 1);
    };
    // The CTA's j-th tile is this warpgroup's when j % 2 == c; its k-blocks are the ring's j·kt onwards.
    // Main loops run in tile order: warpgroup c starts tile j's after the other has issued tile j-1's
    // (named barrier 3 + c). Besides the ping-pong order, this keeps each `full` wait within one phase of
    // the barrier's state (a parity wait cannot tell phases two apart).
    if (c == 1) order_arrive(3);  // tile 0 (warpgroup 0's) needs no predecessor
    for (int u = first + c * stride, j = c; u < tiles; u += 2 * stride, j += 2, ++local) {
      const int m0 = tile_m0(u), n0 = (u % tiles_n) * kTN;
      order_wait(3 + c);
      int it = j * kt;
      for (int kb = 0; kb < kt; ++kb, ++it) {
        const int s = it % kStages;
        mbar_wait(&full[s], (it / kStages) & 1);
        const uint64_t da = desc_sw128(s_a + s * kSmemA), db = desc_sw128(s_b + s * kSmemB);
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < kBK / 16; ++kk) {
          const int acc = (kb > 0 || kk > 0) ? 1 : 0;
          wgmma_m64n128k16(d0, da + 2 * kk, db + 2 * kk, acc);
          wgmma_m64n128k16(d1, da + 512 + 2 * kk, db + 2 * kk, acc);  // + 64 rows × 128 bytes
        }
        wgmma_commit();
        if (kb > 0) {
          wgmma_wait<1>();  // the previous k-block's products are done: its stage goes back
          if (lane == 0) release(&empty[(it - 1) % kStages]);
        }
        if constexpr (E == Epilogue::kDgelu) {
          // Half way through, this tile's pre-activation goes into both slots (their last stores have read).
          if (kb == kt / 2 && tid == 0) {
            tma_store_wait_read<0>();
            mbar_expect_tx(&pre_bar[c], 2 * kSlotBytes);
            tma_load_2d(slots, &tm_pre, &pre_bar[c], n0, m0);
            tma_load_2d(slots + kSlotBytes, &tm_pre, &pre_bar[c], n0 + 64, m0);
          }
        }
      }
      if (u + stride < tiles) order_arrive(3 + (c ^ 1));  // the CTA's next tile is the other warpgroup's
      wgmma_wait<0>();
      if (lane == 0) release(&empty[(it - 1) % kStages]);
#pragma unroll
      for (int i = 0; i < 64; ++i) fence_operand(d0[i]), fence_operand(d1[i]);
      if constexpr (E == Epilogue::kNone) continue;
      // Fragment: d[4i + {0,1}] at (rr, 8i + 2q + {0,1}), d[4i + {2,3}] at (rr + 8, same columns); d1 64 rows
      // on.
      const int q = lane % 4, rr = warp * 16 + lane / 4;
      if constexpr (E == Epilogue::kBias || E == Epilogue::kBiasGelu) {
        if (g.bias != nullptr) {
#pragma unroll
          for (int i = 0; i < 16; ++i) {
            const float2 b =
                __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(g.bias + n0 + 8 * i + 2 * q));
            d0[4 * i] += b.x, d0[4 * i + 1] += b.y, d0[4 * i + 2] += b.x, d0[4 * i + 3] += b.y;
            d1[4 * i] += b.x, d1[4 * i + 1] += b.y, d1[4 * i + 2] += b.x, d1[4 * i + 3] += b.y;
          }
        }
      }
      // Staging slot layout: 128 rows of 128 bytes whose 16-byte chunks are swizzled by the row (TMA's
      // 128-byte swizzle), so a warp's 8 rows × 16 bytes hit 32 distinct banks. Offset of (row, 8j + 2q) in a
      // slot:
      auto at = [&](int row, int j8) { return row * 128 + ((j8 ^ (row % 8)) * 16) + 4 * q; };
      if constexpr (E == Epilogue::kDgelu) {
        mbar_wait(&pre_bar[c], local & 1);
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          uint8_t* box = slots + h * kSlotBytes;
#pragma unroll
          for (int j8 = 0; j8 < 8; ++j8) {
            const int i = 8 * h + j8;
#pragma unroll
            for (int half = 0; half < 2; ++half) {
              float* dd = half ? d1 : d0;
              const int r = half * 64 + rr;
              auto* p0 = reinterpret_cast<__nv_bfloat162*>(box + at(r, j8));
              auto* p8 = reinterpret_cast<__nv_bfloat162*>(box + at(r + 8, j8));
              const float2 x0 = __bfloat1622float2(*p0), x8 = __bfloat1622float2(*p8);
              *p0 = __floats2bfloat162_rn(dd[4 * i] * dgelu_of(x0.x), dd[4 * i + 1] * dgelu_of(x0.y));
              *p8 = __floats2bfloat162_rn(dd[4 * i + 2] * dgelu_of(x8.x), dd[4 * i + 3] * dgelu_of(x8.y));
            }
          }
        }
        fence_async_shared();
        warpgroup_bar(1 + c);
        if (tid == 0) {
          tma_store_2d(&tm_out, slots, n0, m0);
          tma_store_2d(&tm_out, slots + kSlotBytes, n0 + 64, m0);
          tma_store_commit();
        }
      } else {
        constexpr int kPasses = E == Epilogue::kBiasGelu ? 2 : 1;
#pragma unroll
        for (int pass = 0; pass < kPasses; ++pass) {
          const CUtensorMap* map = (E == Epilogue::kBiasGelu && pass == 0) ? &tm_pre : &tm_out;
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            uint8_t* box = slots + slot * kSlotBytes;
            if (tid == 0) tma_store_wait_read<1>();  // this slot's last store (two chunks ago) has read it
            warpgroup_bar(1 + c);
#pragma unroll
            for (int j8 = 0; j8 < 8; ++j8) {
              const int i = 8 * h + j8;
#pragma unroll
              for (int half = 0; half < 2; ++half) {
                const float* dd = half ? d1 : d0;
                float x0 = dd[4 * i], x1 = dd[4 * i + 1], x2 = dd[4 * i + 2], x3 = dd[4 * i + 3];
                if (E == Epilogue::kBiasGelu && pass == 1) {
                  x0 = gelu_of(x0), x1 = gelu_of(x1), x2 = gelu_of(x2), x3 = gelu_of(x3);
                }
                const int r = half * 64 + rr;
                *reinterpret_cast<__nv_bfloat162*>(box + at(r, j8)) = __floats2bfloat162_rn(x0, x1);
                *reinterpret_cast<__nv_bfloat162*>(box + at(r + 8, j8)) = __floats2bfloat162_rn(x2, x3);
              }
            }
            fence_async_shared();
            warpgroup_bar(1 + c);
            if (tid == 0) {
              tma_store_2d(map, box, n0 + 64 * h, m0);
              tma_store_commit();
            }
            slot ^= 1;
          }
        }
      }
    }
    if (tid == 0) tma_store_wait_all();  // stores drained before the CTA's shared memory goes
  }
  if constexpr (kCluster > 1) cluster_sync();  // no CTA leaves while its peer may still write or arrive here
}

// Host side: tensor maps are made per call (host only, a few µs; captured by value in CUDA graphs); the
// driver's encoder is found once. cluster 2: pairs of CTAs sharing the B tile (M % 256 == 0 then).
class Gemm {
 public:
  static constexpr int kStages = 4;

  // mode 1: no clusters; 2: clusters of two sharing B by multicast; 3: clusters of two, each CTA loading its
  // own B (a diagnostic: the cluster launch without the sharing).
  explicit Gemm(int mode = 1) : cluster_(mode >= 2 ? 2 : 1), share_(mode == 2) {
    encode_ = sm90::support().encode;
    if (encode_ == nullptr) {
      std::fprintf(stderr, "hopper::Gemm: no cuTensorMapEncodeTiled\n");
      std::abort();
    }
    int dev = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&sms_, cudaDevAttrMultiProcessorCount, dev);
    prepare<1, false>();
    prepare<2, true>();
    prepare<2, false>();
    max_ctas_ = sms_;
    if (cluster_ == 2) {
      cudaLaunchConfig_t cfg{};
      cudaLaunchAttribute attr{};
      attr.id = cudaLaunchAttributeClusterDimension;
      attr.val.clusterDim.x = 2, attr.val.clusterDim.y = 1, attr.val.clusterDim.z = 1;
      cfg.gridDim = dim3(2 * sms_), cfg.blockDim = dim3(kThreads),
      cfg.dynamicSmemBytes = smem_bytes<kStages>();
      cfg.attrs = &attr, cfg.numAttrs = 1;
      int clusters = 0;
      max_ctas_ =
          (cudaOccupancyMaxActiveClusters(&clusters, gemm_pingpong_kernel<Epilogue::kBiasGelu, kStages, 2>,
                                          &cfg) == cudaSuccess &&
           clusters > 0)
              ? 2 * clusters
              : sms_ / 2 * 2;
    }
  }

  int cluster() const { return cluster_; }
  int ctas() const { return max_ctas_; }
  bool supports(int M, int N, int K) const {
    return M > 0 && N > 0 && K > 0 && M % (kTM * cluster_) == 0 && N % kTN == 0 && K % kBK == 0;
  }

  // out (M, N) = epilogue(a (M, K) · b (N, K)ᵀ); kBiasGelu also writes pre, kDgelu reads it. Returns false
  // for a shape it does not take or a failed launch.
  bool run(Epilogue e, __nv_bfloat16* out, __nv_bfloat16* pre, const __nv_bfloat16* a, const __nv_bfloat16* b,
           const __nv_bfloat16* bias, int M, int N, int K, cudaStream_t stream) const {
    if (!supports(M, N, K)) return false;
    const CUtensorMap ta = map(a, M, K, kBK, kTM), tb = map(b, N, K, kBK, share_ ? kTN / 2 : kTN),
                      to = map(out, M, N, 64, kTM),
                      tp = (e == Epilogue::kBiasGelu || e == Epilogue::kDgelu) ? map(pre, M, N, 64, kTM) : to;
    const Args g{M, N, K, bias};
    const int tiles = (M / kTM) * (N / kTN);
    const int ctas = tiles < max_ctas_ ? tiles : max_ctas_;
    switch (e) {
      case Epilogue::kNone:
        return launch<Epilogue::kNone>(ta, tb, to, tp, g, ctas, stream);
      case Epilogue::kBias:
        return launch<Epilogue::kBias>(ta, tb, to, tp, g, ctas, stream);
      case Epilogue::kBiasGelu:
        return launch<Epilogue::kBiasGelu>(ta, tb, to, tp, g, ctas, stream);
      case Epilogue::kDgelu:
        return launch<Epilogue::kDgelu>(ta, tb, to, tp, g, ctas, stream);
    }
    return false;
  }

 private:
  template <int C, bool S>
  static void prepare() {
    for (auto* f : {gemm_pingpong_kernel<Epilogue::kNone, kStages, C, S>,
                    gemm_pingpong_kernel<Epilogue::kBias, kStages, C, S>,
                    gemm_pingpong_kernel<Epilogue::kBiasGelu, kStages, C, S>,
                    gemm_pingpong_kernel<Epilogue::kDgelu, kStages, C, S>}) {
      cudaFuncSetAttribute(f, cudaFuncAttributeMaxDynamicSharedMemorySize,
                           static_cast<int>(smem_bytes<kStages>()));
    }
  }

  template <Epilogue E>
  bool launch(const CUtensorMap& ta, const CUtensorMap& tb, const CUtensorMap& to, const CUtensorMap& tp,
              const Args& g, int ctas, cudaStream_t stream) const {
    if (cluster_ == 1) {
      gemm_pingpong_kernel<E, kStages, 1>
          <<<ctas, kThreads, smem_bytes<kStages>(), stream>>>(ta, tb, to, tp, g);
      return cudaGetLastError() == cudaSuccess;
    }
    cudaLaunchConfig_t cfg{};
    cudaLaunchAttribute attr{};
    attr.id = cudaLaunchAttributeClusterDimension;
    attr.val.clusterDim.x = 2, attr.val.clusterDim.y = 1, attr.val.clusterDim.z = 1;
    cfg.gridDim = dim3(ctas / 2 * 2), cfg.blockDim = dim3(kThreads),
    cfg.dynamicSmemBytes = smem_bytes<kStages>();
    cfg.stream = stream, cfg.attrs = &attr, cfg.numAttrs = 1;
    return share_ ? cudaLaunchKernelEx(&cfg, gemm_pingpong_kernel<E, kStages, 2, true>, ta, tb, to, tp, g) ==
                        cudaSuccess
                  : cudaLaunchKernelEx(&cfg, gemm_pingpong_kernel<E, kStages, 2, false>, ta, tb, to, tp, g) ==
                        cudaSuccess;
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
      std::fprintf(stderr, "hopper::Gemm: cuTensorMapEncodeTiled failed (%d)\n", static_cast<int>(r));
      std::abort();
    }
    return m;
  }

  PFN_cuTensorMapEncodeTiled_v12000 encode_ = nullptr;
  int cluster_ = 1;
  bool share_ = false;
  int sms_ = 132;
  int max_ctas_ = 132;
};

}  // namespace gantry::hopper
