#include <cmath>

#include "engine/core/cuda/cuda_check.h"
#include "engine/core/cuda/vocab_parallel.cuh"

namespace gantry {
namespace {

constexpr int kThreads = 256;  // one block per row; the reductions' tree is fixed by it

// Reduce over the block in a fixed tree (max or sum); every thread gets the result. `shared` holds 32 floats.
template <bool kMax>
__device__ float block_reduce(float v, float* shared) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = (blockDim.x + 31) / 32;
  for (int off = 16; off > 0; off >>= 1) {
    const float o = __shfl_xor_sync(0xffffffffu, v, off);
    v = kMax ? fmaxf(v, o) : v + o;
  }
  __syncthreads();  // `shared` may still be read by a previous call
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  v = lane < warps ? shared[lane] : (kMax ? -INFINITY : 0.0f);
  for (int off = 16; off > 0; off >>= 1) {
    const float o = __shfl_xor_sync(0xffffffffu, v, off);
    v = kMax ? fmaxf(v, o) : v + o;
  }
  return v;
}

__device__ __forceinline__ bool owned(int32_t token, int v0, int Vl) {
  return token >= v0 && token < v0 + Vl;
}

// The maximum over the ranks' row maxima, in rank order.
__device__ __forceinline__ float global_max(const float* all_max, int tp, int rows, int row) {
  float m = -INFINITY;
  for (int r = 0; r < tp; ++r) m = fmaxf(m, all_max[static_cast<size_t>(r) * rows + row]);
  return m;
}

__global__ void vocab_parallel_encoder_forward_kernel(bf16* out, const int32_t* tokens, const bf16* wte,
                                                      const bf16* wpe, int v0, int Vl, int N, int T, int C) {
  const size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= static_cast<size_t>(N) * C) return;
  const int n = static_cast<int>(i / C), c = static_cast<int>(i % C);
  const int32_t token = tokens[n];
  if (!owned(token, v0, Vl)) {
    out[i] = __float2bfloat16(0.0f);
    return;
  }
  // As encoder_forward_kernel: the sum in fp32, rounded once.
  const float e = __bfloat162float(wte[static_cast<size_t>(token - v0) * C + c]);
  const float p = __bfloat162float(wpe[static_cast<size_t>(n % T) * C + c]);
  out[i] = __float2bfloat16(e + p);
}

__global__ void vocab_parallel_row_max_kernel(float* row_max, const bf16* logits, int Vl) {
  __shared__ float shared[32];
  const bf16* l = logits + static_cast<size_t>(blockIdx.x) * Vl;
  float m = -INFINITY;
  for (int v = threadIdx.x; v < Vl; v += blockDim.x) m = fmaxf(m, __bfloat162float(l[v]));
  m = block_reduce<true>(m, shared);
  if (threadIdx.x == 0) row_max[blockIdx.x] = m;
}

__global__ void vocab_parallel_sum_exp_kernel(float* part, const bf16* logits, const float* all_max,
                                              const int32_t* targets, int v0, int tp, int rows, int Vl) {
  __shared__ float shared[32];
  const int row = blockIdx.x;
  const bf16* l = logits + static_cast<size_t>(row) * Vl;
  const float M = global_max(all_max, tp, rows, row);
  float s = 0.0f;
  for (int v = threadIdx.x; v < Vl; v += blockDim.x) s += expf(__bfloat162float(l[v]) - M);
  s = block_reduce<false>(s, shared);
  if (threadIdx.x == 0) {
    const int32_t t = targets[row];
    part[2 * row] = s;
    part[2 * row + 1] = owned(t, v0, Vl) ? __bfloat162float(l[t - v0]) : 0.0f;
  }
}

__global__ void vocab_parallel_loss_kernel(bf16* logits, float* losses, const float* all_max,
                                           const float* all_part, const int32_t* targets, int v0, int tp,
                                           float dloss, bool write_dlogits, int rows, int Vl) {
  const int row = blockIdx.x;
  const float M = global_max(all_max, tp, rows, row);
  // The ranks' sums and target logits in rank order (the non-owners' 0 adds exactly): the same bits on
  // every rank.
  float S = 0.0f, target_logit = 0.0f;
  for (int r = 0; r < tp; ++r) {
    const float* p = all_part + (static_cast<size_t>(r) * rows + row) * 2;
    S += p[0];
    target_logit += p[1];
  }
  if (threadIdx.x == 0) losses[row] = logf(S) - (target_logit - M);
  if (!write_dlogits) return;
  const float inv = 1.0f / S;
  const int32_t t = targets[row];
  bf16* l = logits + static_cast<size_t>(row) * Vl;
  for (int v = threadIdx.x; v < Vl; v += blockDim.x) {
    const float p = expf(__bfloat162float(l[v]) - M) * inv;
    const float onehot = v0 + v == t ? 1.0f : 0.0f;
    l[v] = __float2bfloat16((p - onehot) * dloss);
  }
}

unsigned blocks_for(size_t n, int threads) {
  return static_cast<unsigned>((n + threads - 1) / threads);
}

}  // namespace

void vocab_parallel_encoder_forward_cuda(bf16* out, const int32_t* tokens, const bf16* wte, const bf16* wpe,
                                         int v0, int Vl, int N, int T, int C, cudaStream_t stream) {
  GANTRY_CHECK(out && tokens && wte && wpe && v0 >= 0 && Vl > 0 && N > 0 && T > 0 && C > 0,
               "vocab_parallel_encoder_forward_cuda arguments");
  vocab_parallel_encoder_forward_kernel<<<blocks_for(static_cast<size_t>(N) * C, kThreads), kThreads, 0,
                                          stream>>>(out, tokens, wte, wpe, v0, Vl, N, T, C);
  CUDA_CHECK_LAUNCH();
}

void vocab_parallel_row_max_cuda(float* row_max, const bf16* logits, int rows, int Vl, cudaStream_t stream) {
  GANTRY_CHECK(row_max && logits && rows > 0 && Vl > 0, "vocab_parallel_row_max_cuda arguments");
  vocab_parallel_row_max_kernel<<<rows, kThreads, 0, stream>>>(row_max, logits, Vl);
  CUDA_CHECK_LAUNCH();
}

void vocab_parallel_sum_exp_cuda(float* part, const bf16* logits, const float* all_max,
                                 const int32_t* targets, int v0, int tp, int rows, int Vl,
                                 cudaStream_t stream) {
  GANTRY_CHECK(part && logits && all_max && targets && v0 >= 0 && tp > 0 && rows > 0 && Vl > 0,
               "vocab_parallel_sum_exp_cuda arguments");
  vocab_parallel_sum_exp_kernel<<<rows, kThreads, 0, stream>>>(part, logits, all_max, targets, v0, tp, rows,
                                                               Vl);
  CUDA_CHECK_LAUNCH();
}

void vocab_parallel_loss_cuda(bf16* logits, float* losses, const float* all_max, const float* all_part,
                              const int32_t* targets, int v0, int tp, float dloss, bool write_dlogits,
                              int rows, int Vl, cudaStream_t stream) {
  GANTRY_CHECK(logits && losses && all_max && all_part && targets && v0 >= 0 && tp > 0 && rows > 0 && Vl > 0,
               "vocab_parallel_loss_cuda arguments");
  vocab_parallel_loss_kernel<<<rows, kThreads, 0, stream>>>(logits, losses, all_max, all_part, targets, v0,
                                                            tp, dloss, write_dlogits, rows, Vl);
  CUDA_CHECK_LAUNCH();
}

}  // namespace gantry
