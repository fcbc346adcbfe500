// The CUDA backend's own kernels (everything but the matmuls, which go through cuBLASLt in matmul.cu, and
// attention, in attention.cu). Each launcher takes an explicit stream, checks its preconditions, launches,
// and checks the launch. Activations are bf16; parameters as the forward pass reads them are bf16;
// gradients, optimizer state, norms and losses are fp32. No kernel uses floating-point atomics: every sum
// is taken in a fixed order, so results are bit-identical run to run on one GPU.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace gantry {

using bf16 = __nv_bfloat16;

// out (N, C) = wte[tokens[n]] + wpe[n % T]
void encoder_forward_cuda(bf16* out, const int32_t* tokens, const bf16* wte, const bf16* wpe, int N, int T,
                          int C, cudaStream_t stream);

// Token-sorted positions, built on the host from the inputs: bucket k holds token bucket_token[k] and the
// positions positions[bucket_start[k] .. bucket_start[k+1]). One block sums one bucket in position order;
// empty buckets (start == end) are skipped, so `buckets` may be a fixed upper bound (graph capture).
// dwte (V, C) += Σ dout rows of each bucket; dwpe (T, C) += Σ_b dout[b, t]. fp32 gradients.
void encoder_backward_cuda(float* dwte, float* dwpe, const bf16* dout, const int32_t* bucket_token,
                           const int32_t* bucket_start, const int32_t* positions, int buckets, int B, int T,
                           int C, cudaStream_t stream);

// LayerNorm kernels need C % 8 == 0 and C <= 2048 (16-byte accesses, rows held in registers).
// Fused residual + LayerNorm: residual_out = a + b (when b != nullptr; otherwise residual_out is unused and
// a is normalised), out = LN(residual_out) · w + bias; mean, rstd (N) fp32 saved for backward.
void residual_layernorm_forward_cuda(bf16* residual_out, bf16* out, float* mean, float* rstd, const bf16* a,
                                     const bf16* b, const bf16* w, const bf16* bias, int N, int C,
                                     cudaStream_t stream);

// LayerNorm backward: dinp (N, C) += (accumulate) or = (overwrite) the LN input gradient, bf16; dw, db (C)
// fp32
// += the column sums. With dsum != nullptr, also dsum (C) fp32 += Σ_n dinp[n, :] after the update: the
// gradient of a bias whose output is this residual stream (the projections' biases), for free, since the row
// is in registers. Column sums are taken in two fixed-order stages through `scratch`
// (layernorm_backward_scratch_floats(N, C)): one partial per row group (as many groups as warps fit on the
// device at once, so the order is fixed per device and build), then a reduction over the groups.
size_t layernorm_backward_scratch_floats(int N, int C);
void layernorm_backward_cuda(bf16* dinp, float* dw, float* db, float* dsum, float* scratch, const bf16* dout,
                             const bf16* inp, const bf16* w, const float* mean, const float* rstd, int N,
                             int C, bool accumulate, cudaStream_t stream);

// db (OC) fp32 += Σ_n dout[n, :] (OC % 8 == 0), two fixed-order stages through scratch
// (bias_backward_scratch_floats).
size_t bias_backward_scratch_floats(int N, int OC);
void bias_backward_cuda(float* db, float* scratch, const bf16* dout, int N, int OC, cudaStream_t stream);

// Fused classifier on a chunk of rows: logits (rows, V) bf16 in place → softmax → cross-entropy. Writes
// losses (rows) fp32 and, when write_dlogits, overwrites logits with (softmax − onehot(target)) · dloss.
// When V % 8 == 0 and V <= classifier_resident_max_vocab(), each row is read once into shared memory (one
// block per row) unless `resident` is false, which forces the two-pass kernel (kept for other V, and for the
// bench).
constexpr int classifier_resident_max_vocab() {
  return 112 * 1024;
}  // 224 KB of shared memory a row
void classifier_cuda(bf16* logits, float* losses, const int32_t* targets, float dloss, bool write_dlogits,
                     int rows, int V, cudaStream_t stream, bool resident = true);

// *accumulator += Σ values[0..n) in a fixed order (one block).
void sum_accumulate_cuda(float* accumulator, const float* values, int n, cudaStream_t stream);

// Global L2 norm: *norm = sqrt(Σ g²) over n fp32 values, two fixed-order stages through scratch
// (global_norm_scratch_floats(n) floats).
size_t global_norm_scratch_floats(size_t n);
void global_norm_cuda(float* norm, float* scratch, const float* g, size_t n, cudaStream_t stream);

// AdamW in one launch over chunks of at most adamw_chunk_elements() elements each. A chunk names where its
// elements are in each buffer: the gradients, the bf16 parameter copy, and the master weights and moments
// (the same offset three times on one GPU; under ZeRO some of the buffers are the rank's packed shard).
// Reads *norm on the device: a non-finite norm skips the update; a norm above grad_clip (> 0) scales
// gradients to it. Writes the bf16 copy of every parameter it updates.
struct AdamWChunk {
  uint64_t grad_offset;
  uint64_t param_offset;
  uint64_t state_offset;
  uint32_t count;
  uint32_t decay;
};
constexpr uint32_t adamw_chunk_elements() {
  return 1u << 16;
}
void adamw_cuda(float* master, bf16* params_bf16, float* m, float* v, const float* grads, const float* norm,
                const AdamWChunk* chunks, int n_chunks, float lr, float beta1, float beta2, float eps,
                float weight_decay, float grad_clip, float bias_correction1, float bias_correction2,
                cudaStream_t stream);

// *sum_squares = Σ g² over the chunks' gradient ranges, in a fixed order (n_chunks floats of scratch): a
// rank's share of the squared global norm under ZeRO, summed over ranks by an all-reduce.
void chunk_sum_squares_cuda(float* sum_squares, float* scratch, const float* grads, const AdamWChunk* chunks,
                            int n_chunks, cudaStream_t stream);
// *x = sqrt(*x) on the device.
void sqrt_in_place_cuda(float* x, cudaStream_t stream);
// dst[0..n) += src[0..n).
void add_in_place_cuda(float* dst, const float* src, size_t n, cudaStream_t stream);

// Runs of floats copied between two buffers in one launch: dst[run.dst + i] = src[run.src + i], i < count
// (sequence parallelism packs the partial gradients' runs for one all-reduce, then unpacks them).
struct CopyRun {
  uint64_t src;
  uint64_t dst;
  uint64_t count;
};
void copy_runs_cuda(float* dst, const float* src, const CopyRun* runs, int n_runs, size_t longest,
                    cudaStream_t stream);

// fp32 → bf16 copy (after loading parameters).
void float_to_bf16_cuda(bf16* out, const float* in, size_t n, cudaStream_t stream);

}  // namespace gantry
