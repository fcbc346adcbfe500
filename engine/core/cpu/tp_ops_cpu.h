// The tensor-parallel pieces a CPU backend runs around its matmuls (Megatron-style,
// parallel/tensor_parallel.h), for a backend whose loop is its own (the pipeline stage,
// cpu/backend_cpu_pipeline.cpp): the all-reduce of a row-parallel output or a column-parallel input
// gradient, the vocab-parallel embedding and cross-entropy (cpu/vocab_parallel_cpu.h). With no
// communicator (tp 1) each piece is the one-process op and nothing is communicated.
//
//   TpOpsCpu tp{.comm = o.tp, .timeout = o.comm_timeout, .pool = &pool};
//   tp.encoder_forward(out, tokens, wte, wpe, B, T, C, V / tp.size());
//   tp.row_parallel_forward(res, atty, proj_w, proj_b, N, C / tp.size(), C);
//   tp.all_reduce(dln, N * C);   // after a column-parallel layer's input gradient
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>

namespace gantry {

class Communicator;
class ThreadPool;

struct TpOpsCpu {
  Communicator* comm = nullptr;  // the tp axis; null at tp 1
  std::chrono::milliseconds timeout{std::chrono::seconds(120)};
  ThreadPool* pool = nullptr;
  double comm_s = 0;  // seconds spent in the tp collectives (the compute waits for every one)

  int size() const;
  int rank() const;
  int vocab_first(int Vl) const { return rank() * Vl; }  // this rank's first token row of wte

  // x[0..count) summed over the tp group (the same bits on every rank). A failed collective is fatal, as
  // the other axes' are: the gang fails together.
  void all_reduce(float* x, size_t count);
  // out (N, C) = inp (N, K) · w (C, K)ᵀ + bias, w split by input columns over the tp ranks (K is this
  // rank's share); the bias, whole on every rank, added once after the sum.
  void row_parallel_forward(float* out, const float* inp, const float* w, const float* bias, int N, int K,
                            int C);
  // out (B, T, C) = wte[token] + wpe[t]; wte holds this rank's Vl token rows (vocab-parallel).
  void encoder_forward(float* out, const int32_t* inp, const float* wte, const float* wpe, int B, int T,
                       int C, int Vl);
  // dwte (Vl, C) += dout of this rank's tokens; dwpe (T, C) += dout of every token.
  void encoder_backward(float* dwte, float* dwpe, const float* dout, const int32_t* inp, int B, int T, int C,
                        int Vl);
  // probs (N, Vl): this rank's logits in, its share of the softmax out; losses (N), the same on every rank.
  void crossentropy_forward(float* probs, float* losses, const int32_t* targets, int N, int Vl);
  void crossentropy_backward(float* dlogits, const float* probs, const int32_t* targets, float dloss, int N,
                             int Vl);
};

}  // namespace gantry
