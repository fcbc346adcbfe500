#include <algorithm>
#include <cmath>

#include "engine/core/cuda/cuda_check.h"
#include "engine/core/cuda/kernels.cuh"

namespace gantry {
namespace {

__device__ __forceinline__ float warp_sum(float v) {
  for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
  return v;
}

// Sum over the block in a fixed tree; every thread gets the result. `shared` holds 32 floats.
__device__ float block_sum(float v, float* shared) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = (blockDim.x + 31) / 32;
  v = warp_sum(v);
  __syncthreads();  // `shared` may still be read by a previous call
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  v = lane < warps ? shared[lane] : 0.0f;
  return warp_sum(v);
}

// 8 bf16 = 16 bytes: one load or store instruction per lane.
__device__ __forceinline__ void load8(float* f, const bf16* p) {
  const uint4 raw = *reinterpret_cast<const uint4*>(p);
  const bf16* b = reinterpret_cast<const bf16*>(&raw);
#pragma unroll
  for (int j = 0; j < 8; ++j) f[j] = __bfloat162float(b[j]);
}

__device__ __forceinline__ void store8(bf16* p, const float* f) {
  uint4 raw;
  bf16* b = reinterpret_cast<bf16*>(&raw);
#pragma unroll
  for (int j = 0; j < 8; ++j) b[j] = __float2bfloat16(f[j]);
  *reinterpret_cast<uint4*>(p) = raw;
}

__global__ void encoder_forward_kernel(bf16* out, const int32_t* tokens, const bf16* wte, const bf16* wpe, int N,
                                       int T, int C) {
  const size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= static_cast<size_t>(N) * C) return;
  const int n = static_cast<int>(i / C), c = static_cast<int>(i % C);
  const float e = __bfloat162float(wte[static_cast<size_t>(tokens[n]) * C + c]);
  const float p = __bfloat162float(wpe[static_cast<size_t>(n % T) * C + c]);
  out[i] = __float2bfloat16(e + p);
}

__global__ void encoder_backward_wte_kernel(float* dwte, const bf16* dout, const int32_t* bucket_token,
                                            const int32_t* bucket_start, const int32_t* positions, int C) {
  const int k = blockIdx.x;
  const int begin = bucket_start[k], end = bucket_start[k + 1];
  if (begin == end) return;  // a spare bucket: the grid is sized for the most a batch can have
  float* row = dwte + static_cast<size_t>(bucket_token[k]) * C;
  for (int c = threadIdx.x; c < C; c += blockDim.x) {
    float s = 0.0f;
    for (int j = begin; j < end; ++j) s += __bfloat162float(dout[static_cast<size_t>(positions[j]) * C + c]);
    row[c] += s;
  }
}

__global__ void encoder_backward_wpe_kernel(float* dwpe, const bf16* dout, int B, int T, int C) {
  const size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= static_cast<size_t>(T) * C) return;
  float s = 0.0f;
  for (int b = 0; b < B; ++b) s += __bfloat162float(dout[static_cast<size_t>(b) * T * C + i]);
  dwpe[i] += s;
}

// One warp per row, the row held in registers (VPL 8-wide vectors per lane, C <= 256·VPL): one read of
// the inputs, one write of each output.
template <int VPL>
__global__ void residual_layernorm_forward_kernel(bf16* residual_out, bf16* out, float* mean, float* rstd,
                                                  const bf16* a, const bf16* b, const bf16* w, const bf16* bias,
                                                  int N, int C) {
  const int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= N) return;
  const size_t base = static_cast<size_t>(row) * C;
  float x[VPL][8];
  float s = 0.0f;
#pragma unroll
  for (int k = 0; k < VPL; ++k) {
    const int c0 = (k * 32 + lane) * 8;
    if (c0 >= C) continue;
    load8(x[k], a + base + c0);
    if (b != nullptr) {
      float y[8];
      load8(y, b + base + c0);
      // The residual is stored in bf16: normalise exactly the rounded values backward will read.
#pragma unroll
      for (int j = 0; j < 8; ++j) x[k][j] = __bfloat162float(__float2bfloat16(x[k][j] + y[j]));
      store8(residual_out + base + c0, x[k]);
    }
#pragma unroll
    for (int j = 0; j < 8; ++j) s += x[k][j];
  }
  const float m = warp_sum(s) / C;
  float v = 0.0f;
#pragma unroll
  for (int k = 0; k < VPL; ++k) {
    if ((k * 32 + lane) * 8 >= C) continue;
#pragma unroll
    for (int j = 0; j < 8; ++j) v += (x[k][j] - m) * (x[k][j] - m);
  }
  const float r = rsqrtf(warp_sum(v) / C + 1e-5f);
#pragma unroll
  for (int k = 0; k < VPL; ++k) {
    const int c0 = (k * 32 + lane) * 8;
    if (c0 >= C) continue;
    float wv[8], bv[8], o[8];
    load8(wv, w + c0);
    load8(bv, bias + c0);
#pragma unroll
    for (int j = 0; j < 8; ++j) o[j] = (x[k][j] - m) * r * wv[j] + bv[j];
    store8(out + base + c0, o);
  }
  if (lane == 0) {
    mean[row] = m;
    rstd[row] = r;
  }
}

constexpr int kNormPartials = 2048;  // warps (row groups) in the first stage of the column sums

// Warp w handles rows w, w + G, ...: dinp in place, and its own column partials of dw and db, kept in
// registers (VPL 8-wide vectors per lane, C <= 256·VPL) and written once to scratch at the end.
template <int VPL>
__global__ void layernorm_backward_kernel(bf16* dinp, float* scratch, const bf16* dout, const bf16* inp,
                                          const bf16* w, const float* mean, const float* rstd, int N, int C,
                                          int groups) {
  const int warp = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (warp >= groups) return;
  float wv[VPL][8], dw_acc[VPL][8], db_acc[VPL][8];
#pragma unroll
  for (int k = 0; k < VPL; ++k) {
    const int c0 = (k * 32 + lane) * 8;
#pragma unroll
    for (int j = 0; j < 8; ++j) dw_acc[k][j] = db_acc[k][j] = wv[k][j] = 0.0f;
    if (c0 < C) load8(wv[k], w + c0);
  }
  for (int row = warp; row < N; row += groups) {
    const size_t base = static_cast<size_t>(row) * C;
    const float m = mean[row], r = rstd[row];
    float d[VPL][8], n[VPL][8];
    float a = 0.0f, bsum = 0.0f;
#pragma unroll
    for (int k = 0; k < VPL; ++k) {
      const int c0 = (k * 32 + lane) * 8;
      if (c0 >= C) continue;
      load8(d[k], dout + base + c0);
      load8(n[k], inp + base + c0);
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        n[k][j] = (n[k][j] - m) * r;
        const float dn = wv[k][j] * d[k][j];
        a += dn;
        bsum += dn * n[k][j];
      }
    }
    a = warp_sum(a) / C;
    bsum = warp_sum(bsum) / C;
#pragma unroll
    for (int k = 0; k < VPL; ++k) {
      const int c0 = (k * 32 + lane) * 8;
      if (c0 >= C) continue;
      float dx[8];
      load8(dx, dinp + base + c0);
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        dw_acc[k][j] += n[k][j] * d[k][j];
        db_acc[k][j] += d[k][j];
        dx[j] += (wv[k][j] * d[k][j] - a - n[k][j] * bsum) * r;
      }
      store8(dinp + base + c0, dx);
    }
  }
  float* dw_part = scratch + static_cast<size_t>(warp) * 2 * C;
#pragma unroll
  for (int k = 0; k < VPL; ++k) {
    const int c0 = (k * 32 + lane) * 8;
    if (c0 >= C) continue;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      dw_part[c0 + j] = dw_acc[k][j];
      dw_part[C + c0 + j] = db_acc[k][j];
    }
  }
}

// out[c] += Σ_g partials[g * stride + c] for c < cols. A block takes 32 columns; its 32 rows of threads each
// sum every 32nd group, then a fixed tree over the rows adds those up: deterministic, and 32× the
// parallelism of one thread per column.
__global__ void column_partials_reduce_kernel(float* out, const float* partials, int groups, int cols,
                                              size_t stride) {
  __shared__ float sums[32][33];
  const int c = blockIdx.x * 32 + threadIdx.x;
  float s = 0.0f;
  if (c < cols) {
    for (int g = threadIdx.y; g < groups; g += 32) s += partials[static_cast<size_t>(g) * stride + c];
  }
  sums[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  for (int half = 16; half > 0; half >>= 1) {
    if (threadIdx.y < half) sums[threadIdx.y][threadIdx.x] += sums[threadIdx.y + half][threadIdx.x];
    __syncthreads();
  }
  if (threadIdx.y == 0 && c < cols) out[c] += sums[0][threadIdx.x];
}

__global__ void bias_backward_partial_kernel(float* scratch, const bf16* dout, int N, int OC, int groups) {
  const int c0 = (blockIdx.x * blockDim.x + threadIdx.x) * 8;
  const int g = blockIdx.y;
  if (c0 >= OC) return;
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  for (int row = g; row < N; row += groups) {
    float v[8];
    load8(v, dout + static_cast<size_t>(row) * OC + c0);
#pragma unroll
    for (int j = 0; j < 8; ++j) acc[j] += v[j];
  }
#pragma unroll
  for (int j = 0; j < 8; ++j) scratch[static_cast<size_t>(g) * OC + c0 + j] = acc[j];
}

// Merges two (max, sum of exp(x - max)) pairs of an online softmax.
__device__ __forceinline__ void softmax_merge(float& m, float& sum, float m2, float sum2) {
  const float mx = fmaxf(m, m2);
  if (mx == -INFINITY) return;
  sum = sum * expf(m - mx) + sum2 * expf(m2 - mx);
  m = mx;
}

// One block per row: one pass for the softmax statistics (online max and sum), one to write dlogits.
// VEC: 16-byte accesses, when V is a multiple of 8 (rows stay 16-byte aligned).
template <bool VEC>
__global__ void classifier_kernel(bf16* logits, float* losses, const int32_t* targets, float dloss,
                                  bool write_dlogits, int V) {
  __shared__ float shared_m[32], shared_s[32];
  bf16* row = logits + static_cast<size_t>(blockIdx.x) * V;
  float m = -INFINITY, sum = 0.0f;
  if (VEC) {
    for (int i = threadIdx.x * 8; i < V; i += blockDim.x * 8) {
      float f[8];
      load8(f, row + i);
      float local = f[0];
#pragma unroll
      for (int j = 1; j < 8; ++j) local = fmaxf(local, f[j]);
      float e = 0.0f;
#pragma unroll
      for (int j = 0; j < 8; ++j) e += expf(f[j] - local);
      softmax_merge(m, sum, local, e);
    }
  } else {
    for (int i = threadIdx.x; i < V; i += blockDim.x) softmax_merge(m, sum, __bfloat162float(row[i]), 1.0f);
  }
  for (int off = 16; off > 0; off >>= 1) {
    const float m2 = __shfl_xor_sync(0xffffffffu, m, off), s2 = __shfl_xor_sync(0xffffffffu, sum, off);
    softmax_merge(m, sum, m2, s2);
  }
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  if (lane == 0) {
    shared_m[warp] = m;
    shared_s[warp] = sum;
  }
  __syncthreads();
  m = lane < warps ? shared_m[lane] : -INFINITY;
  sum = lane < warps ? shared_s[lane] : 0.0f;
  for (int off = 16; off > 0; off >>= 1) {
    const float m2 = __shfl_xor_sync(0xffffffffu, m, off), s2 = __shfl_xor_sync(0xffffffffu, sum, off);
    softmax_merge(m, sum, m2, s2);
  }
  const int target = targets[blockIdx.x];
  const float target_logit = __bfloat162float(row[target]);
  __syncthreads();  // everyone has read row[target] before it is overwritten
  if (threadIdx.x == 0) losses[blockIdx.x] = logf(sum) + m - target_logit;
  if (!write_dlogits) return;
  const float inv = 1.0f / sum;
  if (VEC) {
    for (int i = threadIdx.x * 8; i < V; i += blockDim.x * 8) {
      float f[8];
      load8(f, row + i);
#pragma unroll
      for (int j = 0; j < 8; ++j) f[j] = (expf(f[j] - m) * inv - (i + j == target ? 1.0f : 0.0f)) * dloss;
      store8(row + i, f);
    }
  } else {
    for (int i = threadIdx.x; i < V; i += blockDim.x) {
      const float p = expf(__bfloat162float(row[i]) - m) * inv;
      row[i] = __float2bfloat16((p - (i == target ? 1.0f : 0.0f)) * dloss);
    }
  }
}

__global__ void sum_accumulate_kernel(float* acc, const float* values, int n) {
  __shared__ float shared[32];
  float s = 0.0f;
  for (int i = threadIdx.x; i < n; i += blockDim.x) s += values[i];
  s = block_sum(s, shared);
  if (threadIdx.x == 0) *acc += s;
}

constexpr int kNormBlocks = 1024;
constexpr int kNormThreads = 512;

__global__ void norm_partial_kernel(float* partials, const float* g, size_t n) {
  __shared__ float shared[32];
  float s = 0.0f;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    s += g[i] * g[i];
  }
  s = block_sum(s, shared);
  if (threadIdx.x == 0) partials[blockIdx.x] = s;
}

__global__ void norm_final_kernel(float* norm, const float* partials, int n) {
  __shared__ float shared[32];
  float s = 0.0f;
  for (int i = threadIdx.x; i < n; i += blockDim.x) s += partials[i];
  s = block_sum(s, shared);
  if (threadIdx.x == 0) *norm = sqrtf(s);
}

__global__ void adamw_kernel(float* master, bf16* params_bf16, float* m, float* v, const float* grads,
                             const float* norm, const AdamWChunk* chunks, float lr, float beta1, float beta2,
                             float eps, float weight_decay, float grad_clip, float c1, float c2) {
  const float nrm = *norm;
  if (!isfinite(nrm)) return;  // a diverged step changes nothing; the host sees it in step_stats
  const float scale = grad_clip > 0.0f && nrm > grad_clip ? grad_clip / nrm : 1.0f;
  const AdamWChunk ch = chunks[blockIdx.x];
  const float wd = ch.decay ? weight_decay : 0.0f;
  for (uint32_t j = threadIdx.x; j < ch.count; j += blockDim.x) {
    const size_t i = ch.offset + j;
    const float g = grads[i] * scale;
    const float mi = beta1 * m[i] + (1.0f - beta1) * g;
    const float vi = beta2 * v[i] + (1.0f - beta2) * g * g;
    m[i] = mi;
    v[i] = vi;
    float p = master[i];
    p -= lr * ((mi / c1) / (sqrtf(vi / c2) + eps) + wd * p);
    master[i] = p;
    params_bf16[i] = __float2bfloat16(p);
  }
}

__global__ void float_to_bf16_kernel(bf16* out, const float* in, size_t n) {
  const size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) out[i] = __float2bfloat16(in[i]);
}

unsigned blocks_for(size_t n, unsigned threads) { return static_cast<unsigned>((n + threads - 1) / threads); }

}  // namespace

void encoder_forward_cuda(bf16* out, const int32_t* tokens, const bf16* wte, const bf16* wpe, int N, int T, int C,
                          cudaStream_t stream) {
  GANTRY_CHECK(out && tokens && wte && wpe && N > 0 && T > 0 && C > 0, "encoder_forward_cuda arguments");
  encoder_forward_kernel<<<blocks_for(static_cast<size_t>(N) * C, 256), 256, 0, stream>>>(out, tokens, wte, wpe, N,
                                                                                         T, C);
  CUDA_CHECK_LAUNCH();
}

void encoder_backward_cuda(float* dwte, float* dwpe, const bf16* dout, const int32_t* bucket_token,
                           const int32_t* bucket_start, const int32_t* positions, int buckets, int B, int T, int C,
                           cudaStream_t stream) {
  GANTRY_CHECK(dwte && dwpe && dout && buckets > 0, "encoder_backward_cuda arguments");
  encoder_backward_wte_kernel<<<buckets, 256, 0, stream>>>(dwte, dout, bucket_token, bucket_start, positions, C);
  CUDA_CHECK_LAUNCH();
  encoder_backward_wpe_kernel<<<blocks_for(static_cast<size_t>(T) * C, 256), 256, 0, stream>>>(dwpe, dout, B, T, C);
  CUDA_CHECK_LAUNCH();
}

void residual_layernorm_forward_cuda(bf16* residual_out, bf16* out, float* mean, float* rstd, const bf16* a,
                                     const bf16* b, const bf16* w, const bf16* bias, int N, int C,
                                     cudaStream_t stream) {
  GANTRY_CHECK(out && mean && rstd && a && w && bias && (b == nullptr || residual_out), "layernorm arguments");
  GANTRY_CHECK(C % 8 == 0 && C <= 2048, "residual_layernorm_forward_cuda needs C % 8 == 0 and C <= 2048, got " +
                                            std::to_string(C));
  constexpr int kWarps = 8;
  const unsigned blocks = blocks_for(N, kWarps);
  auto launch = [&](auto kernel) {
    kernel<<<blocks, kWarps * 32, 0, stream>>>(residual_out, out, mean, rstd, a, b, w, bias, N, C);
  };
  switch ((C / 8 + 31) / 32) {
    case 1: launch(residual_layernorm_forward_kernel<1>); break;
    case 2: launch(residual_layernorm_forward_kernel<2>); break;
    case 3: launch(residual_layernorm_forward_kernel<3>); break;
    case 4: launch(residual_layernorm_forward_kernel<4>); break;
    case 5: launch(residual_layernorm_forward_kernel<5>); break;
    case 6: launch(residual_layernorm_forward_kernel<6>); break;
    case 7: launch(residual_layernorm_forward_kernel<7>); break;
    default: launch(residual_layernorm_forward_kernel<8>); break;
  }
  CUDA_CHECK_LAUNCH();
}

size_t layernorm_backward_scratch_floats(int N, int C) {
  return static_cast<size_t>(std::min(N, kNormPartials)) * 2 * C;
}

void layernorm_backward_cuda(bf16* dinp, float* dw, float* db, float* scratch, const bf16* dout, const bf16* inp,
                             const bf16* w, const float* mean, const float* rstd, int N, int C,
                             cudaStream_t stream) {
  GANTRY_CHECK(dinp && dw && db && scratch && dout && inp && w && mean && rstd, "layernorm_backward arguments");
  GANTRY_CHECK(C % 8 == 0 && C <= 2048, "layernorm_backward_cuda needs C % 8 == 0 and C <= 2048, got " +
                                            std::to_string(C));
  const int groups = std::min(N, kNormPartials);
  constexpr int kWarps = 8;
  const unsigned blocks = blocks_for(groups, kWarps);
  const int vpl = (C / 8 + 31) / 32;
  auto launch = [&](auto kernel) {
    kernel<<<blocks, kWarps * 32, 0, stream>>>(dinp, scratch, dout, inp, w, mean, rstd, N, C, groups);
  };
  switch (vpl) {
    case 1: launch(layernorm_backward_kernel<1>); break;
    case 2: launch(layernorm_backward_kernel<2>); break;
    case 3: launch(layernorm_backward_kernel<3>); break;
    case 4: launch(layernorm_backward_kernel<4>); break;
    case 5: launch(layernorm_backward_kernel<5>); break;
    case 6: launch(layernorm_backward_kernel<6>); break;
    case 7: launch(layernorm_backward_kernel<7>); break;
    default: launch(layernorm_backward_kernel<8>); break;
  }
  CUDA_CHECK_LAUNCH();
  column_partials_reduce_kernel<<<blocks_for(C, 32), dim3(32, 32), 0, stream>>>(dw, scratch, groups, C, 2 * C);
  CUDA_CHECK_LAUNCH();
  column_partials_reduce_kernel<<<blocks_for(C, 32), dim3(32, 32), 0, stream>>>(db, scratch + C, groups, C, 2 * C);
  CUDA_CHECK_LAUNCH();
}

namespace {
// Row groups of the first stage: enough threads in flight (~64K, 8 columns each) whatever the width.
int bias_groups(int N, int OC) { return std::min(N, std::clamp(65536 / (OC / 8), 64, 2048)); }
}  // namespace

size_t bias_backward_scratch_floats(int N, int OC) { return static_cast<size_t>(bias_groups(N, OC)) * OC; }

void bias_backward_cuda(float* db, float* scratch, const bf16* dout, int N, int OC, cudaStream_t stream) {
  GANTRY_CHECK(db && scratch && dout && N > 0 && OC > 0 && OC % 8 == 0, "bias_backward_cuda needs OC % 8 == 0");
  const int groups = bias_groups(N, OC);
  bias_backward_partial_kernel<<<dim3(blocks_for(OC / 8, 128), groups), 128, 0, stream>>>(scratch, dout, N, OC,
                                                                                         groups);
  CUDA_CHECK_LAUNCH();
  column_partials_reduce_kernel<<<blocks_for(OC, 32), dim3(32, 32), 0, stream>>>(db, scratch, groups, OC, OC);
  CUDA_CHECK_LAUNCH();
}

void classifier_cuda(bf16* logits, float* losses, const int32_t* targets, float dloss, bool write_dlogits, int rows,
                     int V, cudaStream_t stream) {
  GANTRY_CHECK(logits && losses && targets && rows > 0 && V > 0, "classifier_cuda arguments");
  if (V % 8 == 0) {
    classifier_kernel<true><<<rows, 512, 0, stream>>>(logits, losses, targets, dloss, write_dlogits, V);
  } else {
    classifier_kernel<false><<<rows, 512, 0, stream>>>(logits, losses, targets, dloss, write_dlogits, V);
  }
  CUDA_CHECK_LAUNCH();
}

void sum_accumulate_cuda(float* accumulator, const float* values, int n, cudaStream_t stream) {
  GANTRY_CHECK(accumulator && values && n > 0, "sum_accumulate_cuda arguments");
  sum_accumulate_kernel<<<1, 1024, 0, stream>>>(accumulator, values, n);
  CUDA_CHECK_LAUNCH();
}

size_t global_norm_scratch_floats(size_t) { return kNormBlocks; }

void global_norm_cuda(float* norm, float* scratch, const float* g, size_t n, cudaStream_t stream) {
  GANTRY_CHECK(norm && scratch && g, "global_norm_cuda arguments");
  norm_partial_kernel<<<kNormBlocks, kNormThreads, 0, stream>>>(scratch, g, n);
  CUDA_CHECK_LAUNCH();
  norm_final_kernel<<<1, 1024, 0, stream>>>(norm, scratch, kNormBlocks);
  CUDA_CHECK_LAUNCH();
}

void adamw_cuda(float* master, bf16* params_bf16, float* m, float* v, const float* grads, const float* norm,
                const AdamWChunk* chunks, int n_chunks, float lr, float beta1, float beta2, float eps,
                float weight_decay, float grad_clip, float bias_correction1, float bias_correction2,
                cudaStream_t stream) {
  GANTRY_CHECK(master && params_bf16 && m && v && grads && norm && chunks && n_chunks > 0, "adamw_cuda arguments");
  adamw_kernel<<<n_chunks, 512, 0, stream>>>(master, params_bf16, m, v, grads, norm, chunks, lr, beta1, beta2, eps,
                                             weight_decay, grad_clip, bias_correction1, bias_correction2);
  CUDA_CHECK_LAUNCH();
}

void float_to_bf16_cuda(bf16* out, const float* in, size_t n, cudaStream_t stream) {
  GANTRY_CHECK(out && in, "float_to_bf16_cuda arguments");
  float_to_bf16_kernel<<<blocks_for(n, 256), 256, 0, stream>>>(out, in, n);
  CUDA_CHECK_LAUNCH();
}

}  // namespace gantry
