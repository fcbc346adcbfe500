#include "engine/core/cpu/tp_ops_cpu.h"

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

void TpOpsCpu::all_reduce(float* x, size_t count) {
  if (comm == nullptr) return;
  const auto t0 = std::chrono::steady_clock::now();
  Status st = comm->all_reduce(x, count, timeout);
  comm_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!st.ok()) fatal_error(__FILE__, __LINE__, "tensor parallel: " + st.message());
}

void TpOpsCpu::row_parallel_forward(float* out, const float* inp, const float* w, const float* bias, int N,
                                    int K, int C) {
  if (comm == nullptr) {
    matmul_forward(pool, out, inp, w, bias, N, K, C);
    return;
  }
  matmul_forward(pool, out, inp, w, nullptr, N, K, C);
  all_reduce(out, static_cast<size_t>(N) * C);
  for (int n = 0; n < N; ++n) {
    float* row = out + static_cast<size_t>(n) * C;
    for (int c = 0; c < C; ++c) row[c] += bias[c];
  }
}

void TpOpsCpu::encoder_forward(float* out, const int32_t* inp, const float* wte, const float* wpe, int B,
                               int T, int C, int Vl) {
  if (comm == nullptr) {
    gantry::encoder_forward(out, inp, wte, wpe, B, T, C);
    return;
  }
  vocab_parallel_encoder_forward(out, inp, wte, vocab_first(Vl), Vl, B * T, C);
  all_reduce(out, static_cast<size_t>(B) * T * C);
  vocab_parallel_add_positions(out, wpe, B, T, C);
}

void TpOpsCpu::encoder_backward(float* dwte, float* dwpe, const float* dout, const int32_t* inp, int B, int T,
                                int C, int Vl) {
  if (comm == nullptr) {
    gantry::encoder_backward(dwte, dwpe, dout, inp, B, T, C);
    return;
  }
  vocab_parallel_encoder_backward(dwte, dwpe, dout, inp, vocab_first(Vl), Vl, B, T, C);
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
