#include <algorithm>
#include <cmath>
#include <map>
#include <mutex>
#include <utility>

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

__device__ __forceinline__ void unpack8(float* f, const uint4& raw) {
  const bf16* b = reinterpret_cast<const bf16*>(&raw);
#pragma unroll
  for (int j = 0; j < 8; ++j) f[j] = __bfloat162float(b[j]);
}

__device__ __forceinline__ uint4 pack8(const float* f) {
  uint4 raw;
  bf16* b = reinterpret_cast<bf16*>(&raw);
#pragma unroll
  for (int j = 0; j < 8; ++j) b[j] = __float2bfloat16(f[j]);
  return raw;
}

__device__ __forceinline__ uint4 ld16(const bf16* p) {
  return *reinterpret_cast<const uint4*>(p);
}
__device__ __forceinline__ void st16(bf16* p, const uint4& v) {
  *reinterpret_cast<uint4*>(p) = v;
}

__global__ void encoder_forward_kernel(bf16* out, const int32_t* tokens, const bf16* wte, const bf16* wpe,
                                       int N, int T, int C) {
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
                                                  const bf16* a, const bf16* b, const bf16* w,
                                                  const bf16* bias, int N, int C) {
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

constexpr int kNormPartials =
    2048;  // most row groups of the LayerNorm backward's first stage (sizes its scratch)
constexpr int kLnBwdThreads = 64;  // 2 warps a block: small blocks let each SM fill up to its register limit

// One row of the LayerNorm backward's inputs, as loaded (bf16, 8 to a vector), and its saved statistics.
template <int VPL>
struct LnBwdRow {
  uint4 d[VPL], x[VPL], dx[VPL];
  float mean, rstd;
};

template <int VPL>
__device__ __forceinline__ void ln_bwd_load(LnBwdRow<VPL>& r, int row, int lane, int C, const bf16* dout,
                                            const bf16* inp, const bf16* dinp, bool accumulate,
                                            const float* mean, const float* rstd) {
  const size_t base = static_cast<size_t>(row) * C;
#pragma unroll
  for (int k = 0; k < VPL; ++k) {
    const int c0 = (k * 32 + lane) * 8;
    if (c0 >= C) continue;
    r.d[k] = ld16(dout + base + c0);
    r.x[k] = ld16(inp + base + c0);
    r.dx[k] = accumulate ? ld16(dinp + base + c0) : make_uint4(0, 0, 0, 0);
  }
  r.mean = mean[row];
  r.rstd = rstd[row];
}

// Warp w handles rows w, w + G, ... (G = groups = the warps resident at once on the device): dinp in place,
// and its own column partials of dw, db (and, with SUM, of the updated dinp), kept in registers and written
// once to scratch at the end. The next row's loads are issued before the current row is computed, so every
// warp keeps a row in flight while it works (one warp a row with the loads after the reductions ran at 1.3
// TB/s).
template <int VPL, bool SUM>
__global__ void __launch_bounds__(kLnBwdThreads)
    layernorm_backward_kernel(bf16* dinp, float* scratch, const bf16* __restrict__ dout,
                              const bf16* __restrict__ inp, const bf16* __restrict__ w,
                              const float* __restrict__ mean, const float* __restrict__ rstd, int N, int C,
                              int groups, bool accumulate) {
  const int warp = blockIdx.x * (kLnBwdThreads / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (warp >= groups) return;
  uint4 wraw[VPL];
  float dw_acc[VPL][8], db_acc[VPL][8], ds_acc[SUM ? VPL : 1][8];
#pragma unroll
  for (int k = 0; k < VPL; ++k) {
    const int c0 = (k * 32 + lane) * 8;
#pragma unroll
    for (int j = 0; j < 8; ++j) dw_acc[k][j] = db_acc[k][j] = 0.0f;
    if constexpr (SUM) {
#pragma unroll
      for (int j = 0; j < 8; ++j) ds_acc[k][j] = 0.0f;
    }
    wraw[k] = c0 < C ? ld16(w + c0) : make_uint4(0, 0, 0, 0);
  }
  LnBwdRow<VPL> cur, nxt;
  ln_bwd_load(cur, warp, lane, C, dout, inp, dinp, accumulate, mean, rstd);
  for (int row = warp; row < N; row += groups) {
    if (row + groups < N) ln_bwd_load(nxt, row + groups, lane, C, dout, inp, dinp, accumulate, mean, rstd);
    const float m = cur.mean, r = cur.rstd;
    float a = 0.0f, b = 0.0f;
#pragma unroll
    for (int k = 0; k < VPL; ++k) {
      if ((k * 32 + lane) * 8 >= C) continue;
      float d[8], x[8], wv[8];
      unpack8(d, cur.d[k]);
      unpack8(x, cur.x[k]);
      unpack8(wv, wraw[k]);
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const float dn = wv[j] * d[j];
        a += dn;
        b += dn * ((x[j] - m) * r);
      }
    }
    a = warp_sum(a) / C;
    b = warp_sum(b) / C;
    const size_t base = static_cast<size_t>(row) * C;
#pragma unroll
    for (int k = 0; k < VPL; ++k) {
      const int c0 = (k * 32 + lane) * 8;
      if (c0 >= C) continue;
      float d[8], x[8], wv[8], dx[8];
      unpack8(d, cur.d[k]);
      unpack8(x, cur.x[k]);
      unpack8(wv, wraw[k]);
      unpack8(dx, cur.dx[k]);
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const float n = (x[j] - m) * r;
        dw_acc[k][j] += n * d[j];
        db_acc[k][j] += d[j];
        dx[j] += (wv[j] * d[j] - a - n * b) * r;
      }
      const uint4 out = pack8(dx);
      st16(dinp + base + c0, out);
      if constexpr (SUM) {
        unpack8(dx, out);  // the bias gradient sums the values stored, as a separate pass over dinp would
#pragma unroll
        for (int j = 0; j < 8; ++j) ds_acc[k][j] += dx[j];
      }
    }
    cur = nxt;
  }
  float* part = scratch + static_cast<size_t>(warp) * (SUM ? 3 : 2) * C;
#pragma unroll
  for (int k = 0; k < VPL; ++k) {
    const int c0 = (k * 32 + lane) * 8;
    if (c0 >= C) continue;
#pragma unroll
    for (int j = 0; j < 8; j += 4) {
      *reinterpret_cast<float4*>(part + c0 + j) =
          make_float4(dw_acc[k][j], dw_acc[k][j + 1], dw_acc[k][j + 2], dw_acc[k][j + 3]);
      *reinterpret_cast<float4*>(part + C + c0 + j) =
          make_float4(db_acc[k][j], db_acc[k][j + 1], db_acc[k][j + 2], db_acc[k][j + 3]);
      if constexpr (SUM) {
        *reinterpret_cast<float4*>(part + 2 * C + c0 + j) =
            make_float4(ds_acc[k][j], ds_acc[k][j + 1], ds_acc[k][j + 2], ds_acc[k][j + 3]);
      }
    }
  }
}

// Up to three column-sum outputs of one first stage; blockIdx.y picks one.
struct ColumnOutputs {
  float* out0;
  float* out1;
  float* out2;
};

// out_y[c] += Σ_g partials[g * stride + y * cols + c] for c < cols, y = blockIdx.y. A block takes 32 columns;
// its 32 rows of threads each sum every 32nd group, then a fixed tree over the rows adds those up:
// deterministic, and 32× the parallelism of one thread per column.
__global__ void column_partials_reduce_kernel(ColumnOutputs outs, const float* partials, int groups, int cols,
                                              size_t stride) {
  __shared__ float sums[32][33];
  float* out = blockIdx.y == 0 ? outs.out0 : blockIdx.y == 1 ? outs.out1 : outs.out2;
  partials += static_cast<size_t>(blockIdx.y) * cols;
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

// Column partials of dout (N, OC) over row groups: thread (column vector, group g) sums rows g, g + groups,
// ... Four rows' loads are issued before any is used, so each thread has 64 bytes in flight.
__global__ void bias_backward_partial_kernel(float* scratch, const bf16* __restrict__ dout, int N, int OC,
                                             int groups) {
  const int c0 = (blockIdx.x * blockDim.x + threadIdx.x) * 8;
  const int g = blockIdx.y;
  if (c0 >= OC) return;
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  auto consume = [&](const uint4& raw) {
    float x[8];
    unpack8(x, raw);
#pragma unroll
    for (int j = 0; j < 8; ++j) acc[j] += x[j];
  };
  constexpr int kUnroll = 4;
  int row = g;
  for (; row + (kUnroll - 1) * groups < N; row += kUnroll * groups) {
    uint4 v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) v[u] = ld16(dout + static_cast<size_t>(row + u * groups) * OC + c0);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) consume(v[u]);
  }
  for (; row < N; row += groups) consume(ld16(dout + static_cast<size_t>(row) * OC + c0));
  float* part = scratch + static_cast<size_t>(g) * OC + c0;
  *reinterpret_cast<float4*>(part) = make_float4(acc[0], acc[1], acc[2], acc[3]);
  *reinterpret_cast<float4*>(part + 4) = make_float4(acc[4], acc[5], acc[6], acc[7]);
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

// One block per row, the row staged in shared memory (V·2 bytes: 98 KB at V = 50304, two rows per SM): one
// read of the logits from device memory, by cp.async (every load of a thread in flight at once), and one
// write of dlogits. The two-pass kernel above reads each row twice, and with four 512-thread blocks per SM
// the rows in flight (~53 MB) overflow L2, so much of the second read comes from DRAM. Each thread reads back
// only the vectors it copied, so no barrier is needed before it does.
constexpr int kClassifierStagedThreads = 512;

__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
  const uint32_t s = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(gmem));
}

__global__ void __launch_bounds__(kClassifierStagedThreads)
    classifier_staged_kernel(bf16* logits, float* losses, const int32_t* targets, float dloss,
                             bool write_dlogits, int V) {
  extern __shared__ uint4 staged[];  // (V / 8) vectors of 8 logits
  __shared__ float shared_m[32], shared_s[32];
  bf16* row = logits + static_cast<size_t>(blockIdx.x) * V;
  const int target = targets[blockIdx.x];
  const float target_logit = __bfloat162float(row[target]);
  const int vectors = V / 8;
  for (int i = threadIdx.x; i < vectors; i += kClassifierStagedThreads) cp_async16(&staged[i], row + i * 8);
  asm volatile("cp.async.wait_all;\n" ::: "memory");
  float m = -INFINITY, sum = 0.0f;
  for (int i = threadIdx.x; i < vectors; i += kClassifierStagedThreads) {
    float f[8];
    unpack8(f, staged[i]);
    float local = f[0];
#pragma unroll
    for (int j = 1; j < 8; ++j) local = fmaxf(local, f[j]);
    float e = 0.0f;
#pragma unroll
    for (int j = 0; j < 8; ++j) e += __expf(f[j] - local);
    softmax_merge(m, sum, local, e);
  }
  for (int off = 16; off > 0; off >>= 1) {
    const float m2 = __shfl_xor_sync(0xffffffffu, m, off), s2 = __shfl_xor_sync(0xffffffffu, sum, off);
    softmax_merge(m, sum, m2, s2);
  }
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = kClassifierStagedThreads / 32;
  if (lane == 0) {
    shared_m[warp] = m;
    shared_s[warp] = sum;
  }
  __syncthreads();  // also orders every thread's read of row[target] before the first write below
  m = lane < warps ? shared_m[lane] : -INFINITY;
  sum = lane < warps ? shared_s[lane] : 0.0f;
  for (int off = 16; off > 0; off >>= 1) {
    const float m2 = __shfl_xor_sync(0xffffffffu, m, off), s2 = __shfl_xor_sync(0xffffffffu, sum, off);
    softmax_merge(m, sum, m2, s2);
  }
  if (threadIdx.x == 0) losses[blockIdx.x] = logf(sum) + m - target_logit;
  if (!write_dlogits) return;
  const float inv = 1.0f / sum;
  for (int i = threadIdx.x; i < vectors; i += kClassifierStagedThreads) {
    float f[8];
    unpack8(f, staged[i]);
#pragma unroll
    for (int j = 0; j < 8; ++j) f[j] = (__expf(f[j] - m) * inv - (i * 8 + j == target ? 1.0f : 0.0f)) * dloss;
    st16(row + i * 8, pack8(f));
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

// *out = Σ partials (with kRoot, its square root: the norm), in a fixed order.
template <bool kRoot>
__global__ void partials_sum_kernel(float* out, const float* partials, int n) {
  __shared__ float shared[32];
  float s = 0.0f;
  for (int i = threadIdx.x; i < n; i += blockDim.x) s += partials[i];
  s = block_sum(s, shared);
  if (threadIdx.x == 0) *out = kRoot ? sqrtf(s) : s;
}

__global__ void chunk_squares_kernel(float* partials, const float* g, const AdamWChunk* chunks) {
  __shared__ float shared[32];
  const AdamWChunk ch = chunks[blockIdx.x];
  float s = 0.0f;
  for (uint32_t j = threadIdx.x; j < ch.count; j += blockDim.x) {
    const float x = g[ch.grad_offset + j];
    s += x * x;
  }
  s = block_sum(s, shared);
  if (threadIdx.x == 0) partials[blockIdx.x] = s;
}

__global__ void sqrt_kernel(float* x) {
  *x = sqrtf(*x);
}

__global__ void add_kernel(float* dst, const float* src, size_t n) {
  const size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) dst[i] += src[i];
}

// One run per blockIdx.y; the x blocks stride through it.
__global__ void copy_runs_kernel(float* dst, const float* src, const CopyRun* runs) {
  const CopyRun r = runs[blockIdx.y];
  for (uint64_t i = static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < r.count;
       i += static_cast<uint64_t>(gridDim.x) * blockDim.x)
    dst[r.dst + i] = src[r.src + i];
}

__global__ void adamw_kernel(float* master, bf16* params_bf16, float* m, float* v, const float* grads,
                             const float* norm, const AdamWChunk* chunks, float lr, float beta1, float beta2,
                             float eps, float weight_decay, float grad_clip, float c1, float c2) {
  const float nrm = *norm;
  if (!isfinite(nrm)) return;  // a diverged step changes nothing; the host sees it in step_stats
  const float scale = grad_clip > 0.0f && nrm > grad_clip ? grad_clip / nrm : 1.0f;
  const AdamWChunk ch = chunks[blockIdx.x];
  const float wd = ch.decay ? weight_decay : 0.0f;
  auto update = [&](float g, float& mi, float& vi, float& p) {
    g *= scale;
    mi = beta1 * mi + (1.0f - beta1) * g;
    vi = beta2 * vi + (1.0f - beta2) * g * g;
    p -= lr * ((mi / c1) / (sqrtf(vi / c2) + eps) + wd * p);
  };
  float* const mc = m + ch.state_offset;
  float* const vc = v + ch.state_offset;
  float* const pc = master + ch.state_offset;
  const float* const gc = grads + ch.grad_offset;
  bf16* const bc = params_bf16 + ch.param_offset;
  if ((ch.grad_offset | ch.param_offset | ch.state_offset | ch.count) % 4 == 0) {
    // 16-byte accesses (the model's tensors all have C, a multiple of 8, as a factor): the same arithmetic
    // per element as below, ~30 bytes moved per parameter at a higher fraction of the bandwidth.
#pragma unroll 2
    for (uint32_t j = threadIdx.x * 4; j < ch.count; j += blockDim.x * 4) {
      const float4 g = *reinterpret_cast<const float4*>(gc + j);
      float4 mi = *reinterpret_cast<float4*>(mc + j), vi = *reinterpret_cast<float4*>(vc + j);
      float4 p = *reinterpret_cast<float4*>(pc + j);
      update(g.x, mi.x, vi.x, p.x);
      update(g.y, mi.y, vi.y, p.y);
      update(g.z, mi.z, vi.z, p.z);
      update(g.w, mi.w, vi.w, p.w);
      *reinterpret_cast<float4*>(mc + j) = mi;
      *reinterpret_cast<float4*>(vc + j) = vi;
      *reinterpret_cast<float4*>(pc + j) = p;
      __nv_bfloat162 lo = __floats2bfloat162_rn(p.x, p.y), hi = __floats2bfloat162_rn(p.z, p.w);
      uint2 packed;
      packed.x = *reinterpret_cast<uint32_t*>(&lo);
      packed.y = *reinterpret_cast<uint32_t*>(&hi);
      *reinterpret_cast<uint2*>(bc + j) = packed;
    }
    return;
  }
  for (uint32_t j = threadIdx.x; j < ch.count; j += blockDim.x) {
    float mi = mc[j], vi = vc[j], p = pc[j];
    update(gc[j], mi, vi, p);
    mc[j] = mi;
    vc[j] = vi;
    pc[j] = p;
    bc[j] = __float2bfloat16(p);
  }
}

__global__ void float_to_bf16_kernel(bf16* out, const float* in, size_t n) {
  const size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) out[i] = __float2bfloat16(in[i]);
}

unsigned blocks_for(size_t n, unsigned threads) {
  return static_cast<unsigned>((n + threads - 1) / threads);
}

}  // namespace

void encoder_forward_cuda(bf16* out, const int32_t* tokens, const bf16* wte, const bf16* wpe, int N, int T,
                          int C, cudaStream_t stream) {
  GANTRY_CHECK(out && tokens && wte && wpe && N > 0 && T > 0 && C > 0, "encoder_forward_cuda arguments");
  encoder_forward_kernel<<<blocks_for(static_cast<size_t>(N) * C, 256), 256, 0, stream>>>(out, tokens, wte,
                                                                                          wpe, N, T, C);
  CUDA_CHECK_LAUNCH();
}

void encoder_backward_cuda(float* dwte, float* dwpe, const bf16* dout, const int32_t* bucket_token,
                           const int32_t* bucket_start, const int32_t* positions, int buckets, int B, int T,
                           int C, cudaStream_t stream) {
  GANTRY_CHECK(dwte && dwpe && dout && buckets > 0, "encoder_backward_cuda arguments");
  encoder_backward_wte_kernel<<<buckets, 256, 0, stream>>>(dwte, dout, bucket_token, bucket_start, positions,
                                                           C);
  CUDA_CHECK_LAUNCH();
  encoder_backward_wpe_kernel<<<blocks_for(static_cast<size_t>(T) * C, 256), 256, 0, stream>>>(dwpe, dout, B,
                                                                                               T, C);
  CUDA_CHECK_LAUNCH();
}

void residual_layernorm_forward_cuda(bf16* residual_out, bf16* out, float* mean, float* rstd, const bf16* a,
                                     const bf16* b, const bf16* w, const bf16* bias, int N, int C,
                                     cudaStream_t stream) {
  GANTRY_CHECK(out && mean && rstd && a && w && bias && (b == nullptr || residual_out),
               "layernorm arguments");
  GANTRY_CHECK(C % 8 == 0 && C <= 2048,
               "residual_layernorm_forward_cuda needs C % 8 == 0 and C <= 2048, got " + std::to_string(C));
  constexpr int kWarps = 8;
  const unsigned blocks = blocks_for(N, kWarps);
  auto launch = [&](auto kernel) {
    kernel<<<blocks, kWarps * 32, 0, stream>>>(residual_out, out, mean, rstd, a, b, w, bias, N, C);
  };
  switch ((C / 8 + 31) / 32) {
    case 1:
      launch(residual_layernorm_forward_kernel<1>);
      break;
    case 2:
      launch(residual_layernorm_forward_kernel<2>);
      break;
    case 3:
      launch(residual_layernorm_forward_kernel<3>);
      break;
    case 4:
      launch(residual_layernorm_forward_kernel<4>);
      break;
    case 5:
      launch(residual_layernorm_forward_kernel<5>);
      break;
    case 6:
      launch(residual_layernorm_forward_kernel<6>);
      break;
    case 7:
      launch(residual_layernorm_forward_kernel<7>);
      break;
    default:
      launch(residual_layernorm_forward_kernel<8>);
      break;
  }
  CUDA_CHECK_LAUNCH();
}

namespace {
// Warps of `kernel` (launched with `threads` threads a block) resident on the current device at once; cached.
int resident_warps(const void* kernel, int threads) {
  static std::mutex mu;
  static std::map<std::pair<int, const void*>, int> cache;
  int dev = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  std::lock_guard<std::mutex> lock(mu);
  auto it = cache.find({dev, kernel});
  if (it != cache.end()) return it->second;
  int sms = 0, blocks = 0;
  CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, threads, 0));
  const int warps = std::max(1, blocks) * sms * (threads / 32);
  cache.emplace(std::make_pair(dev, kernel), warps);
  return warps;
}

}  // namespace

size_t layernorm_backward_scratch_floats(int N, int C) {
  return static_cast<size_t>(std::min(N, kNormPartials)) * 3 * C;
}

void layernorm_backward_cuda(bf16* dinp, float* dw, float* db, float* dsum, float* scratch, const bf16* dout,
                             const bf16* inp, const bf16* w, const float* mean, const float* rstd, int N,
                             int C, bool accumulate, cudaStream_t stream) {
  GANTRY_CHECK(dinp && dw && db && scratch && dout && inp && w && mean && rstd && N > 0,
               "layernorm_backward arguments");
  GANTRY_CHECK(C % 8 == 0 && C <= 2048,
               "layernorm_backward_cuda needs C % 8 == 0 and C <= 2048, got " + std::to_string(C));
  const int outputs = dsum ? 3 : 2;
  auto launch = [&](auto kernel) {
    // One wave: as many row groups as warps fit at once (fixed per device and build, so the sums' order is
    // too).
    const int groups =
        std::min({N, kNormPartials, resident_warps(reinterpret_cast<const void*>(kernel), kLnBwdThreads)});
    kernel<<<blocks_for(groups, kLnBwdThreads / 32), kLnBwdThreads, 0, stream>>>(
        dinp, scratch, dout, inp, w, mean, rstd, N, C, groups, accumulate);
    CUDA_CHECK_LAUNCH();
    column_partials_reduce_kernel<<<dim3(blocks_for(C, 32), outputs), dim3(32, 32), 0, stream>>>(
        {dw, db, dsum}, scratch, groups, C, static_cast<size_t>(outputs) * C);
    CUDA_CHECK_LAUNCH();
  };
  const int vpl = (C / 8 + 31) / 32;
  if (dsum) {
    switch (vpl) {
      case 1:
        launch(layernorm_backward_kernel<1, true>);
        break;
      case 2:
        launch(layernorm_backward_kernel<2, true>);
        break;
      case 3:
        launch(layernorm_backward_kernel<3, true>);
        break;
      case 4:
        launch(layernorm_backward_kernel<4, true>);
        break;
      case 5:
        launch(layernorm_backward_kernel<5, true>);
        break;
      case 6:
        launch(layernorm_backward_kernel<6, true>);
        break;
      case 7:
        launch(layernorm_backward_kernel<7, true>);
        break;
      default:
        launch(layernorm_backward_kernel<8, true>);
        break;
    }
  } else {
    switch (vpl) {
      case 1:
        launch(layernorm_backward_kernel<1, false>);
        break;
      case 2:
        launch(layernorm_backward_kernel<2, false>);
        break;
      case 3:
        launch(layernorm_backward_kernel<3, false>);
        break;
      case 4:
        launch(layernorm_backward_kernel<4, false>);
        break;
      case 5:
        launch(layernorm_backward_kernel<5, false>);
        break;
      case 6:
        launch(layernorm_backward_kernel<6, false>);
        break;
      case 7:
        launch(layernorm_backward_kernel<7, false>);
        break;
      default:
        launch(layernorm_backward_kernel<8, false>);
        break;
    }
  }
}

namespace {
// Row groups of the first stage: enough threads in flight (~64K, 8 columns each) whatever the width.
int bias_groups(int N, int OC) {
  return std::min(N, std::clamp(65536 / (OC / 8), 64, 2048));
}

}  // namespace

size_t bias_backward_scratch_floats(int N, int OC) {
  return static_cast<size_t>(bias_groups(N, OC)) * OC;
}

void bias_backward_cuda(float* db, float* scratch, const bf16* dout, int N, int OC, cudaStream_t stream) {
  GANTRY_CHECK(db && scratch && dout && N > 0 && OC > 0 && OC % 8 == 0,
               "bias_backward_cuda needs OC % 8 == 0");
  const int groups = bias_groups(N, OC);
  bias_backward_partial_kernel<<<dim3(blocks_for(OC / 8, 128), groups), 128, 0, stream>>>(scratch, dout, N,
                                                                                          OC, groups);
  CUDA_CHECK_LAUNCH();
  column_partials_reduce_kernel<<<blocks_for(OC, 32), dim3(32, 32), 0, stream>>>({db, nullptr, nullptr},
                                                                                 scratch, groups, OC, OC);
  CUDA_CHECK_LAUNCH();
}

void classifier_cuda(bf16* logits, float* losses, const int32_t* targets, float dloss, bool write_dlogits,
                     int rows, int V, cudaStream_t stream, bool resident) {
  GANTRY_CHECK(logits && losses && targets && rows > 0 && V > 0, "classifier_cuda arguments");
  if (resident && V % 8 == 0 && V <= classifier_resident_max_vocab()) {
    const int smem = V * static_cast<int>(sizeof(bf16));
    CUDA_CHECK(
        cudaFuncSetAttribute(classifier_staged_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    classifier_staged_kernel<<<rows, kClassifierStagedThreads, smem, stream>>>(logits, losses, targets, dloss,
                                                                               write_dlogits, V);
  } else if (V % 8 == 0) {
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

size_t global_norm_scratch_floats(size_t) {
  return kNormBlocks;
}

void global_norm_cuda(float* norm, float* scratch, const float* g, size_t n, cudaStream_t stream) {
  GANTRY_CHECK(norm && scratch && g, "global_norm_cuda arguments");
  norm_partial_kernel<<<kNormBlocks, kNormThreads, 0, stream>>>(scratch, g, n);
  CUDA_CHECK_LAUNCH();
  partials_sum_kernel<true><<<1, 1024, 0, stream>>>(norm, scratch, kNormBlocks);
  CUDA_CHECK_LAUNCH();
}

void adamw_cuda(float* master, bf16* params_bf16, float* m, float* v, const float* grads, const float* norm,
                const AdamWChunk* chunks, int n_chunks, float lr, float beta1, float beta2, float eps,
                float weight_decay, float grad_clip, float bias_correction1, float bias_correction2,
                cudaStream_t stream) {
  GANTRY_CHECK(master && params_bf16 && m && v && grads && norm && chunks && n_chunks > 0,
               "adamw_cuda arguments");
  adamw_kernel<<<n_chunks, 512, 0, stream>>>(master, params_bf16, m, v, grads, norm, chunks, lr, beta1, beta2,
                                             eps, weight_decay, grad_clip, bias_correction1,
                                             bias_correction2);
  CUDA_CHECK_LAUNCH();
}

void chunk_sum_squares_cuda(float* sum_squares, float* scratch, const float* grads, const AdamWChunk* chunks,
                            int n_chunks, cudaStream_t stream) {
  GANTRY_CHECK(sum_squares && scratch && grads && chunks && n_chunks > 0, "chunk_sum_squares_cuda arguments");
  chunk_squares_kernel<<<n_chunks, kNormThreads, 0, stream>>>(scratch, grads, chunks);
  CUDA_CHECK_LAUNCH();
  partials_sum_kernel<false><<<1, 1024, 0, stream>>>(sum_squares, scratch, n_chunks);
  CUDA_CHECK_LAUNCH();
}

void sqrt_in_place_cuda(float* x, cudaStream_t stream) {
  sqrt_kernel<<<1, 1, 0, stream>>>(x);
  CUDA_CHECK_LAUNCH();
}

void add_in_place_cuda(float* dst, const float* src, size_t n, cudaStream_t stream) {
  GANTRY_CHECK(dst && src, "add_in_place_cuda arguments");
  if (n == 0) return;
  add_kernel<<<blocks_for(n, 256), 256, 0, stream>>>(dst, src, n);
  CUDA_CHECK_LAUNCH();
}

void copy_runs_cuda(float* dst, const float* src, const CopyRun* runs, int n_runs, size_t longest,
                    cudaStream_t stream) {
  GANTRY_CHECK(dst && src && runs && n_runs <= 65535, "copy_runs_cuda arguments");
  if (n_runs <= 0 || longest == 0) return;
  const dim3 grid(std::min(blocks_for(longest, 256), 32u), static_cast<unsigned>(n_runs));
  copy_runs_kernel<<<grid, 256, 0, stream>>>(dst, src, runs);
  CUDA_CHECK_LAUNCH();
}

void float_to_bf16_cuda(bf16* out, const float* in, size_t n, cudaStream_t stream) {
  GANTRY_CHECK(out && in, "float_to_bf16_cuda arguments");
  if (n == 0) return;
  float_to_bf16_kernel<<<blocks_for(n, 256), 256, 0, stream>>>(out, in, n);
  CUDA_CHECK_LAUNCH();
}

}  // namespace gantry
