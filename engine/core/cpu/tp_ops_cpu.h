// The tensor-parallel pieces a CPU backend runs around its matmuls (Megatron-style,
// parallel/tensor_parallel.h), for a backend whose loop is its own (the pipeline stage,
// cpu/backend_cpu_pipeline.cpp): the all-reduce of a row-parallel output or a column-parallel input
// gradient, the vocab-parallel embedding and cross-entropy (cpu/vocab_parallel_cpu.h), and under sequence
// parallelism the reduce-scatter and all-gather over positions that replace those all-reduces (between a
// row-parallel output and the next column-parallel input each tp rank holds positions [r·T/tp, (r+1)·T/tp)
// of every sequence: rows(N) = N / tp rows of the residual stream and the LayerNorms). With no communicator
// (tp 1) each piece is the one-process op and nothing is communicated.
//
//   TpOpsCpu tp{.comm = o.tp, .timeout = o.comm_timeout, .pool = &pool, .sequence_parallel = sp};
//   tp.encoder_forward(out, tokens, wte, wpe, B, T, C, V / tp.size());   // out: rows(B·T) x C
//   matmul_forward(pool, qkv, tp.column_input(ln1, B, T, C), ...);         // ln1 whole for the matmul
//   tp.row_parallel_forward(res, atty, proj_w, proj_b, B, T, C / tp.size(), C);
//   const float* dx = tp.column_input_grad(dln, B, T, C);  // whole (all-reduced) or this rank's positions
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <vector>

namespace gantry {

class Communicator;
class ThreadPool;

struct TpOpsCpu {
  Communicator* comm = nullptr;  // the tp axis; null at tp 1
  std::chrono::milliseconds timeout{std::chrono::seconds(120)};
  ThreadPool* pool = nullptr;
  bool sequence_parallel = false;  // only with a communicator; needs T a multiple of tp
  double comm_s = 0;               // seconds spent in the tp collectives (the compute waits for every one)

  int size() const;
  int rank() const;
  bool sp() const { return comm != nullptr && sequence_parallel; }
  // Rows of the residual stream and the LayerNorms for N = B·T positions: N, or N / tp under SP.
  int rows(int N) const { return sp() ? N / size() : N; }
  int vocab_first(int Vl) const { return rank() * Vl; }  // this rank's first token row of wte

  // x[0..count) summed over the tp group (the same bits on every rank). A failed collective is fatal, as
  // the other axes' are: the gang fails together.
  void all_reduce(float* x, size_t count);
  // out (rows(N), C) = inp (N, K) · w (C, K)ᵀ + bias, w split by input columns over the tp ranks (K is
  // this rank's share): the partial sums all-reduced, or under SP reduce-scattered onto this rank's
  // positions; the bias, whole on every rank, added once after the sum.
  void row_parallel_forward(float* out, const float* inp, const float* w, const float* bias, int B, int T,
                            int K, int C);
  // The input of a column-parallel layer: x (rows(N), C) whole, i.e. x itself, or under SP every rank's
  // positions gathered into a scratch buffer (valid until the next column_input, row_parallel_forward or
  // encoder_forward).
  const float* column_input(const float* x, int B, int T, int C);
  // A gradient of the residual stream (rows(N), C) whole: dx itself, or under SP gathered into a scratch
  // buffer of its own (valid until the next whole_grad or encoder_backward).
  const float* whole_grad(const float* dx, int B, int T, int C);
  // A column-parallel layer's input gradient dx (N, C), a partial sum over the tp shares: all-reduced in
  // place (returns dx), or under SP reduce-scattered onto this rank's positions in a scratch buffer
  // (rows(N), C; valid until the next column_input_grad).
  const float* column_input_grad(float* dx, int B, int T, int C);
  // SP: out (B, T, C) = every rank's positions of local (B, T/tp, C), into the caller's buffer.
  void gather_positions(const float* local, float* out, int B, int T, int C);

  // Where a LayerNorm's weight or bias gradient goes: g itself, or under SP scratch slot `slot` (0..3) of
  // this rank's positions' partial sums, which add_ln_grads sums over tp and adds to the gradients (k
  // tensors of C each, slot i to into[i]).
  float* ln_grad(float* g, int slot, int C);
  void add_ln_grads(std::initializer_list<float*> into, int C);

  // out (rows(B·T), C) = wte[token] + wpe[t]; wte holds this rank's Vl token rows (vocab-parallel).
  void encoder_forward(float* out, const int32_t* inp, const float* wte, const float* wpe, int B, int T,
                       int C, int Vl);
  // dwte (Vl, C) += dout of this rank's tokens; dwpe (T, C) += dout of every token; dout (rows(B·T), C).
  void encoder_backward(float* dwte, float* dwpe, const float* dout, const int32_t* inp, int B, int T, int C,
                        int Vl);
  // probs (N, Vl): this rank's logits in, its share of the softmax out; losses (N), the same on every rank.
  void crossentropy_forward(float* probs, float* losses, const int32_t* targets, int N, int Vl);
  void crossentropy_backward(float* dlogits, const float* probs, const int32_t* targets, float dloss, int N,
                             int Vl);

  // Sizes sequence parallelism's scratch for B sequences of T positions (nothing otherwise), so that it is
  // there, and counted, from the start; the pieces grow it on demand all the same.
  void reserve(int B, int T, int C);
  // Floats held by the scratch buffers (sequence parallelism's; none otherwise).
  size_t scratch_floats() const;

  // SP scratch (the methods' own; public only so that the struct stays an aggregate), grown to the largest
  // batch seen: a whole activation (gathered, or summed before a reduce-scatter), the collectives' staging,
  // a gathered gradient, a column-parallel input gradient's positions and the LayerNorm gradients of this
  // rank's positions (4 x C).
  std::vector<float> full_, stage_, grad_full_, grad_local_, ln_grads_;

 private:
  // SP: out (B, T/tp, C) = this rank's positions of the sum over tp of x (B, T, C). The communicator's
  // blocks are contiguous, so x is first laid out position block by position block, (tp, B, T/tp, C).
  void reduce_scatter_positions(const float* x, float* out, int B, int T, int C);
  static float* sized(std::vector<float>& v, size_t n);
};

}  // namespace gantry
