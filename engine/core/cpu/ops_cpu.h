// The CPU reference ops (fp32), forward and backward written out by hand. This is the oracle every GPU
// kernel is tested against. Shapes use B (batch), T (time), C (channels), NH (heads), V (vocab),
// N = B*T rows. Linear weights are (OC, C) row-major. Backward ops ADD into their gradient outputs
// (parameters accumulate over micro-batches; activations over branches), except where noted.
// Loops that parallelise take a ThreadPool (nullptr = serial); each output element is summed by one thread
// in a fixed order, so results do not depend on the thread count.
#pragma once

#include <cstddef>
#include <cstdint>

namespace gantry {

class ThreadPool;

// out (B,T,C) = wte[inp] + wpe[t]
void encoder_forward(float* out, const int32_t* inp, const float* wte, const float* wpe, int B, int T, int C);
void encoder_backward(float* dwte, float* dwpe, const float* dout, const int32_t* inp, int B, int T, int C);

// out (N,C) = (inp - mean) * rstd * w + b; mean, rstd (N) saved for backward. eps = 1e-5.
void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* w, const float* b,
                       int N, int C);
void layernorm_backward(float* dinp, float* dw, float* db, const float* dout, const float* inp,
                        const float* w, const float* mean, const float* rstd, int N, int C);

// out (N,OC) = inp (N,C) · w (OC,C)ᵀ + bias (OC); bias may be nullptr.
void matmul_forward(ThreadPool* pool, float* out, const float* inp, const float* w, const float* bias, int N,
                    int C, int OC);
// dinp (N,C) += dout·w; dw (OC,C) += doutᵀ·inp; db (OC) += Σ dout. dinp or dw nullptr: that half is
// skipped (db is summed with dw, so it may be nullptr, and is skipped with dw).
void matmul_backward(ThreadPool* pool, float* dinp, float* dw, float* db, const float* dout, const float* inp,
                     const float* w, int N, int C, int OC);

// Causal multi-head attention. qkv (B,T,3C) holds q, k, v side by side; out (B,T,C);
// att (B,NH,T,T) keeps the softmax probabilities for backward (zero above the diagonal).
void attention_forward(ThreadPool* pool, float* out, float* att, const float* qkv, int B, int T, int C,
                       int NH);
void attention_backward(ThreadPool* pool, float* dqkv, const float* dout, const float* qkv, const float* att,
                        int B, int T, int C, int NH);

// GELU, tanh approximation. gelu_backward WRITES dinp (it is never accumulated).
void gelu_forward(float* out, const float* inp, size_t n);
void gelu_backward(float* dinp, const float* inp, const float* dout, size_t n);

void residual_forward(float* out, const float* a, const float* b, size_t n);

// probs (N,V) = softmax(logits) (logits may alias probs); losses (N) = -log probs[target].
void softmax_crossentropy_forward(ThreadPool* pool, float* probs, float* losses, const float* logits,
                                  const int32_t* targets, int N, int V);
// dlogits (N,V) WRITTEN = (probs - onehot(target)) * dloss, the same dloss for every row.
void softmax_crossentropy_backward(ThreadPool* pool, float* dlogits, const float* probs,
                                   const int32_t* targets, float dloss, int N, int V);

}  // namespace gantry
