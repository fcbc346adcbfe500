// Vocabulary-parallel embedding and cross-entropy on the GPU (tensor parallelism, Megatron-style): the CUDA
// counterpart of cpu/vocab_parallel_cpu.h. tp rank r holds rows [v0, v0 + Vl) of the tied token embedding
// wte, so its classifier computes only those columns of the logits, which are never gathered. Per row, the
// maxima of every rank (an all-gather of `rows` floats) and then each rank's sum of exponentials and its
// part of the target's logit (an all-gather of 2·rows floats) cross the tp group; every rank combines them
// in rank order, so every rank computes the same loss bits. The collectives are the caller's
// (cuda/backend_cuda.cu); these kernels are the local parts between them:
//
//   vocab_parallel_row_max_cuda(mine_max, logits, rows, Vl, s);                  // then all-gather → max
//   (tp, rows) vocab_parallel_sum_exp_cuda(mine_part, logits, max, targets, v0, tp, rows, Vl, s);  // → part
//   (tp, rows, 2) vocab_parallel_loss_cuda(logits, losses, max, part, targets, v0, tp, dloss, true, rows, Vl,
//   s);
//
// At tp 1 (v0 = 0, Vl = V, the gathers are copies) this is the whole softmax cross-entropy, which is how the
// one-GPU test checks it against the CPU reference. Every sum is taken in a fixed order (no atomics).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "engine/core/cuda/kernels.cuh"  // bf16

namespace gantry {

// out (N, C) = wte[tokens[n] − v0] + wpe[n % T] for the tokens in [v0, v0 + Vl), zeros for the others:
// summed over the tp group (one all-reduce), each row is its owner's row exactly (x + 0 = x), the bits the
// one-GPU encoder_forward_cuda writes.
void vocab_parallel_encoder_forward_cuda(bf16* out, const int32_t* tokens, const bf16* wte, const bf16* wpe,
                                         int v0, int Vl, int N, int T, int C, cudaStream_t stream);

// row_max (rows) = the maximum of each row of this rank's logits (rows, Vl).
void vocab_parallel_row_max_cuda(float* row_max, const bf16* logits, int rows, int Vl, cudaStream_t stream);

// all_max (tp, rows): every rank's row maxima, rank by rank. part (rows, 2) = [Σ_v exp(l_v − M), the
// target's logit where this rank owns the target, else 0], M the maximum over the ranks.
void vocab_parallel_sum_exp_cuda(float* part, const bf16* logits, const float* all_max,
                                 const int32_t* targets, int v0, int tp, int rows, int Vl,
                                 cudaStream_t stream);

// all_part (tp, rows, 2): every rank's part. losses (rows) = log Σ_r S_r − (target logit − M); with
// write_dlogits, logits (rows, Vl) become (softmax − onehot(target)) · dloss, the one-hot only where this
// rank owns the target.
void vocab_parallel_loss_cuda(bf16* logits, float* losses, const float* all_max, const float* all_part,
                              const int32_t* targets, int v0, int tp, float dloss, bool write_dlogits,
                              int rows, int Vl, cudaStream_t stream);

}  // namespace gantry
