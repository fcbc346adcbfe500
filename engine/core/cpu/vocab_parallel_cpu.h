// Vocabulary-parallel embedding and cross-entropy on the CPU (tensor parallelism, Megatron-style): tp rank r
// holds rows [v0, v0 + Vl) of the tied token embedding wte, so its classifier computes only those columns
// of the logits. The logits are never gathered: per row, the maximum (one all-gather of N floats) and the
// sum of exponentials (one all-gather of the (hi, lo) float pairs of each rank's double sum, added in rank
// order as doubles, so every rank gets the same bits) cross the tp group, and the target's logit comes
// from the rank that owns the target (the others contribute 0, which adds exactly).
//
//   vocab_parallel_encoder_forward(encoded, inputs, wte, v0, Vl, N, C);  // then all-reduce, then positions
//   Status s = vocab_parallel_crossentropy_forward(tp, timeout, pool, probs, losses, targets, v0, N, Vl);
//   vocab_parallel_crossentropy_backward(pool, dlogits, probs, targets, dloss, v0, N, Vl);
#pragma once

#include <chrono>
#include <cstdint>

#include "telemetry/status.h"

namespace gantry {

class Communicator;
class ThreadPool;

// out (N, C) = this rank's wte row of each token in [v0, v0 + Vl), zeros for the others: summed over the
// tp group, each row is its owner's row exactly (x + 0 = x).
void vocab_parallel_encoder_forward(float* out, const int32_t* inp, const float* wte, int v0, int Vl, int N,
                                    int C);
// out (B, T, C) += wpe[t].
void vocab_parallel_add_positions(float* out, const float* wpe, int B, int T, int C);
// dwte (Vl, C) += dout of the tokens this rank owns; dwpe (T, C) += dout of every token.
void vocab_parallel_encoder_backward(float* dwte, float* dwpe, const float* dout, const int32_t* inp, int v0,
                                     int Vl, int B, int T, int C);

// probs (N, Vl) holds this rank's logits on entry and its share of the softmax on return; losses (N) each
// row's cross-entropy, the same bits on every tp rank (and as one process computes them, the sum of
// exponentials being added in another order in double precision).
// comm_s: seconds spent in the two collectives are added to it.
Status vocab_parallel_crossentropy_forward(Communicator* tp, std::chrono::milliseconds timeout,
                                           ThreadPool* pool, float* probs, float* losses,
                                           const int32_t* targets, int v0, int N, int Vl, double* comm_s);
// dlogits (N, Vl) = (probs − onehot(target)) · dloss, the one-hot only where this rank owns the target.
void vocab_parallel_crossentropy_backward(ThreadPool* pool, float* dlogits, const float* probs,
                                          const int32_t* targets, float dloss, int v0, int N, int Vl);

}  // namespace gantry
