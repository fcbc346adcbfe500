#include "engine/core/cpu/tp_ops_cpu.h"

#include <cstring>
#include <string>

#include "engine/core/comm/communicator.h"
#include "engine/core/cpu/ops_cpu.h"
#include "engine/core/cpu/vocab_parallel_cpu.h"
#include "engine/core/fatal.h"

namespace gantry {

int TpOpsCpu::size() const {
  return comm != nullptr ? comm->size() : 1;
}

int TpOpsCpu::rank() const {
  return comm != nullptr ? comm->rank() : 0;
}

float* TpOpsCpu::sized(std::vector<float>& v, size_t n) {
  if (v.size() < n) v.resize(n, 0.0f);
  return v.data();
}

void TpOpsCpu::reserve(int B, int T, int C) {
  if (!sp()) return;
  const size_t all = static_cast<size_t>(B) * T * C;
  sized(full_, all);
  sized(stage_, all);
  sized(grad_full_, all);
  sized(grad_local_, static_cast<size_t>(rows(B * T)) * C);
  sized(ln_grads_, static_cast<size_t>(4) * C);
}

size_t TpOpsCpu::scratch_floats() const {
  return full_.size() + stage_.size() + grad_full_.size() + grad_local_.size() + ln_grads_.size();
}

void TpOpsCpu::all_reduce(float* x, size_t count) {
  if (comm == nullptr) return;
  const auto t0 = std::chrono::steady_clock::now();
  Status st = comm->all_reduce(x, count, timeout);
  comm_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!st.ok()) fatal_error(__FILE__, __LINE__, "tensor parallel: " + st.message());
}

void TpOpsCpu::reduce_scatter_positions(const float* x, float* out, int B, int T, int C) {
  const int tp = size();
  const size_t Tl = T / tp, row = Tl * C, all = static_cast<size_t>(B) * T * C;
  float* send = sized(stage_, all);
  for (int r = 0; r < tp; ++r)
    for (int b = 0; b < B; ++b)
      std::memcpy(send + (static_cast<size_t>(r) * B + b) * row,
                  x + (static_cast<size_t>(b) * T + r * Tl) * C, row * sizeof(float));
  const auto t0 = std::chrono::steady_clock::now();
  Status st = comm->reduce_scatter(send, out, all, timeout);
  comm_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!st.ok()) fatal_error(__FILE__, __LINE__, "sequence parallel: " + st.message());
}

void TpOpsCpu::gather_positions(const float* local, float* out, int B, int T, int C) {
  const int tp = size();
  const size_t Tl = T / tp, row = Tl * C, all = static_cast<size_t>(B) * T * C;
  float* recv = sized(stage_, all);
  const auto t0 = std::chrono::steady_clock::now();
  Status st = comm->all_gather(local, recv, all, timeout);
  comm_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!st.ok()) fatal_error(__FILE__, __LINE__, "sequence parallel: " + st.message());
  for (int r = 0; r < tp; ++r)
    for (int b = 0; b < B; ++b)
      std::memcpy(out + (static_cast<size_t>(b) * T + r * Tl) * C,
                  recv + (static_cast<size_t>(r) * B + b) * row, row * sizeof(float));
}

void TpOpsCpu::row_parallel_forward(float* out, const float* inp, const float* w, const float* bias, int B,
                                    int T, int K, int C) {
  const int N = B * T;
  if (comm == nullptr) {
    matmul_forward(pool, out, inp, w, bias, N, K, C);
    return;
  }
  if (sp()) {
    float* whole = sized(full_, static_cast<size_t>(N) * C);
    matmul_forward(pool, whole, inp, w, nullptr, N, K, C);
    reduce_scatter_positions(whole, out, B, T, C);
  } else {
    matmul_forward(pool, out, inp, w, nullptr, N, K, C);
    all_reduce(out, static_cast<size_t>(N) * C);
  }
  for (int n = 0; n < rows(N); ++n) {
    float* row = out + static_cast<size_t>(n) * C;
    for (int c = 0; c < C; ++c) row[c] += bias[c];
  }
}

const float* TpOpsCpu::column_input(const float* x, int B, int T, int C) {
  if (!sp()) return x;
  float* whole = sized(full_, static_cast<size_t>(B) * T * C);
  gather_positions(x, whole, B, T, C);
  return whole;
}

const float* TpOpsCpu::whole_grad(const float* dx, int B, int T, int C) {
  if (!sp()) return dx;
  float* whole = sized(grad_full_, static_cast<size_t>(B) * T * C);
  gather_positions(dx, whole, B, T, C);
  return whole;
}

const float* TpOpsCpu::column_input_grad(float* dx, int B, int T, int C) {
  if (!sp()) {
    all_reduce(dx, static_cast<size_t>(B) * T * C);
    return dx;
  }
  float* mine = sized(grad_local_, static_cast<size_t>(rows(B * T)) * C);
  reduce_scatter_positions(dx, mine, B, T, C);
  return mine;
}

float* TpOpsCpu::ln_grad(float* g, int slot, int C) {
  if (!sp()) return g;
  return sized(ln_grads_, static_cast<size_t>(4) * C) + static_cast<size_t>(slot) * C;
}

void TpOpsCpu::add_ln_grads(std::initializer_list<float*> into, int C) {
  if (!sp()) return;
  float* s = sized(ln_grads_, static_cast<size_t>(4) * C);
  all_reduce(s, into.size() * C);
  size_t i = 0;
  for (float* g : into) {
    const float* part = s + i++ * C;
    for (int c = 0; c < C; ++c) g[c] += part[c];
  }
  std::memset(s, 0, ln_grads_.size() * sizeof(float));
}

void TpOpsCpu::encoder_forward(float* out, const int32_t* inp, const float* wte, const float* wpe, int B,
                               int T, int C, int Vl) {
  if (comm == nullptr) {
    gantry::encoder_forward(out, inp, wte, wpe, B, T, C);
    return;
  }
  const int N = B * T;
  if (!sp()) {
    vocab_parallel_encoder_forward(out, inp, wte, vocab_first(Vl), Vl, N, C);
    all_reduce(out, static_cast<size_t>(N) * C);
    vocab_parallel_add_positions(out, wpe, B, T, C);
    return;
  }
  // Each token's row from the rank that owns it, reduce-scattered onto this rank's positions, which then
  // get their position rows.
  float* whole = sized(full_, static_cast<size_t>(N) * C);
  vocab_parallel_encoder_forward(whole, inp, wte, vocab_first(Vl), Vl, N, C);
  reduce_scatter_positions(whole, out, B, T, C);
  const int Tl = T / size();
  vocab_parallel_add_positions(out, wpe + static_cast<size_t>(rank()) * Tl * C, B, Tl, C);
}

void TpOpsCpu::encoder_backward(float* dwte, float* dwpe, const float* dout, const int32_t* inp, int B, int T,
                                int C, int Vl) {
  if (comm == nullptr) {
    gantry::encoder_backward(dwte, dwpe, dout, inp, B, T, C);
    return;
  }
  // Every position's gradient (gathered under SP): wpe's gradient is then whole, the same bits on every
  // tp rank.
  vocab_parallel_encoder_backward(dwte, dwpe, whole_grad(dout, B, T, C), inp, vocab_first(Vl), Vl, B, T, C);
}

void TpOpsCpu::crossentropy_forward(float* probs, float* losses, const int32_t* targets, int N, int Vl) {
  if (comm == nullptr) {
    softmax_crossentropy_forward(pool, probs, losses, probs, targets, N, Vl);
    return;
  }
  Status st = vocab_parallel_crossentropy_forward(comm, timeout, pool, probs, losses, targets,
                                                  vocab_first(Vl), N, Vl, &comm_s);
  if (!st.ok()) fatal_error(__FILE__, __LINE__, "tensor parallel: " + st.message());
}

void TpOpsCpu::crossentropy_backward(float* dlogits, const float* probs, const int32_t* targets, float dloss,
                                     int N, int Vl) {
  if (comm == nullptr) {
    softmax_crossentropy_backward(pool, dlogits, probs, targets, dloss, N, Vl);
    return;
  }
  vocab_parallel_crossentropy_backward(pool, dlogits, probs, targets, dloss, vocab_first(Vl), N, Vl);
}

}  // namespace gantry
