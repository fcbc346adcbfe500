// The CPU reference backend: fp32 everywhere, the ops of ops_cpu.h wired into GPT-2's forward and backward.
#include <chrono>
#include <cmath>
#include <cstring>
#include <vector>

#include "engine/core/backend.h"
#include "engine/core/cpu/ops_cpu.h"
#include "engine/core/cpu/thread_pool.h"
#include "engine/core/gpt.h"
#include "engine/core/optim.h"

namespace gantry {

const char* state_buffer_name(StateBuffer b) {
  switch (b) {
    case StateBuffer::kParams:
      return "params";
    case StateBuffer::kGrads:
      return "grads";
    case StateBuffer::kAdamM:
      return "adam_m";
    case StateBuffer::kAdamV:
      return "adam_v";
  }
  return "?";
}

namespace {

// Activations of one micro-batch, kept for the backward pass; one flat allocation carved by a table.
struct LayerActs {
  float* ln1;       // (N, C)
  float* ln1_mean;  // (N)
  float* ln1_rstd;  // (N)
  float* qkv;       // (N, 3C)
  float* att;       // (B, NH, T, T)
  float* atty;      // (N, C)
  float* res2;      // (N, C)
  float* ln2;       // (N, C)
  float* ln2_mean;  // (N)
  float* ln2_rstd;  // (N)
  float* fch;       // (N, 4C)
  float* fch_gelu;  // (N, 4C)
  float* res3;      // (N, C)
};

class CpuBackend final : public Backend {
 public:
  CpuBackend(const ModelConfig& m, int max_batch, int threads)
      : m_(m), max_batch_(max_batch), table_(gpt_param_table(m)), pool_(threads) {
    params_.assign(table_.numel(), 0.0f);
    grads_.assign(table_.numel(), 0.0f);
    adam_m_.assign(table_.numel(), 0.0f);
    adam_v_.assign(table_.numel(), 0.0f);
    allocate_activations();
  }

  std::string name() const override { return "cpu"; }
  const TensorTable& params() const override { return table_; }

  void forward_backward(const int32_t* inputs, const int32_t* targets, int batch, float grad_scale) override {
    const auto t0 = std::chrono::steady_clock::now();
    loss_sum_ += forward(inputs, targets, batch);
    ++loss_count_;
    const auto t1 = std::chrono::steady_clock::now();
    backward(inputs, targets, batch, grad_scale);
    phases_.forward_s += std::chrono::duration<double>(t1 - t0).count();
    phases_.backward_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();
  }

  PhaseTimes phase_times() const override { return phases_; }

  float forward_loss(const int32_t* inputs, const int32_t* targets, int batch) override {
    return forward(inputs, targets, batch);
  }

  void zero_grads() override {
    std::memset(grads_.data(), 0, grads_.size() * sizeof(float));
    loss_sum_ = 0;
    loss_count_ = 0;
    phases_ = {.measured = true};
  }

  void optimizer_step(const AdamWStep& s) override {
    const auto t0 = std::chrono::steady_clock::now();
    struct AddElapsed {  // counts the optimizer's time on every return path
      PhaseTimes& p;
      std::chrono::steady_clock::time_point t0;
      ~AddElapsed() { p.optimizer_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); }
    } add_elapsed{phases_, t0};
    stats_.loss = loss_count_ ? loss_sum_ / loss_count_ : 0.0;
    stats_.grad_norm = grad_norm();
    stats_.updated = std::isfinite(stats_.grad_norm);
    if (!stats_.updated) return;
    adamw(s, clip_scale(stats_.grad_norm, s.grad_clip));
  }

  StepStats step_stats() override { return stats_; }

  uint64_t memory_bytes() const override {
    size_t floats = params_.size() * 4 + acts_.size() + dres_.size() + dln_.size() + datty_.size() + dqkv_.size() +
                    dfch_.size() + dfch_gelu_.size() + dlogits_.size();
    return floats * sizeof(float);
  }

  double grad_norm() override {
    // Fixed-size chunks summed in index order: the result does not depend on the thread count.
    constexpr size_t kChunk = 1 << 14;
    const size_t chunks = (grads_.size() + kChunk - 1) / kChunk;
    std::vector<double> partial(chunks, 0.0);
    pool_.parallel_for(chunks, [&](size_t begin, size_t end) {
      for (size_t c = begin; c < end; ++c) {
        const size_t lo = c * kChunk, hi = std::min(grads_.size(), lo + kChunk);
        double s = 0;
        for (size_t i = lo; i < hi; ++i) s += static_cast<double>(grads_[i]) * grads_[i];
        partial[c] = s;
      }
    });
    double total = 0;
    for (double p : partial) total += p;
    return std::sqrt(total);
  }

  void read_state(StateBuffer which, size_t offset, size_t count, float* out) override {
    std::memcpy(out, buffer(which).data() + offset, count * sizeof(float));
  }
  void write_state(StateBuffer which, size_t offset, size_t count, const float* in) override {
    std::memcpy(buffer(which).data() + offset, in, count * sizeof(float));
  }

 private:
  void adamw(const AdamWStep& s, double grad_scale) {
    const float b1 = static_cast<float>(s.beta1), b2 = static_cast<float>(s.beta2);
    const float lr = static_cast<float>(s.lr), eps = static_cast<float>(s.eps);
    const float scale = static_cast<float>(grad_scale);
    const float c1 = static_cast<float>(1.0 - std::pow(s.beta1, static_cast<double>(s.step)));
    const float c2 = static_cast<float>(1.0 - std::pow(s.beta2, static_cast<double>(s.step)));
    for (const TensorInfo& t : table_.tensors()) {
      const float wd = t.decay ? static_cast<float>(s.weight_decay) : 0.0f;
      float* p = params_.data() + t.offset;
      const float* g = grads_.data() + t.offset;
      float* mm = adam_m_.data() + t.offset;
      float* vv = adam_v_.data() + t.offset;
      pool_.parallel_for(t.numel, [&](size_t begin, size_t end) {
        for (size_t i = begin; i < end; ++i) {
          const float gi = g[i] * scale;
          mm[i] = b1 * mm[i] + (1.0f - b1) * gi;
          vv[i] = b2 * vv[i] + (1.0f - b2) * gi * gi;
          const float mhat = mm[i] / c1;
          const float vhat = vv[i] / c2;
          p[i] -= lr * (mhat / (std::sqrt(vhat) + eps) + wd * p[i]);
        }
      });
    }
  }

  std::vector<float>& buffer(StateBuffer which) {
    switch (which) {
      case StateBuffer::kParams:
        return params_;
      case StateBuffer::kGrads:
        return grads_;
      case StateBuffer::kAdamM:
        return adam_m_;
      case StateBuffer::kAdamV:
        return adam_v_;
    }
    return params_;
  }

  void allocate_activations() {
    const size_t B = max_batch_, T = m_.seq_len, C = m_.n_embd, NH = m_.n_head, V = m_.vocab_size;
    const size_t N = B * T;
    const size_t per_layer = N * C * 5 + N * 4 + N * 3 * C + B * NH * T * T + N * 4 * C * 2;
    const size_t total = N * C + per_layer * m_.n_layer + N * C + 2 * N + N * V + N;
    acts_.assign(total, 0.0f);
    float* p = acts_.data();
    auto take = [&](size_t n) {
      float* r = p;
      p += n;
      return r;
    };
    encoded_ = take(N * C);
    layers_.resize(m_.n_layer);
    for (LayerActs& l : layers_) {
      l.ln1 = take(N * C);
      l.ln1_mean = take(N);
      l.ln1_rstd = take(N);
      l.qkv = take(N * 3 * C);
      l.att = take(B * NH * T * T);
      l.atty = take(N * C);
      l.res2 = take(N * C);
      l.ln2 = take(N * C);
      l.ln2_mean = take(N);
      l.ln2_rstd = take(N);
      l.fch = take(N * 4 * C);
      l.fch_gelu = take(N * 4 * C);
      l.res3 = take(N * C);
    }
    lnf_ = take(N * C);
    lnf_mean_ = take(N);
    lnf_rstd_ = take(N);
    probs_ = take(N * V);
    losses_ = take(N);
    // Backward scratch, reused by every layer.
    dres_.assign(N * C, 0);
    dln_.assign(N * C, 0);
    datty_.assign(N * C, 0);
    dqkv_.assign(N * 3 * C, 0);
    dfch_.assign(N * 4 * C, 0);
    dfch_gelu_.assign(N * 4 * C, 0);
    dlogits_.assign(N * V, 0);
  }

  float forward(const int32_t* inputs, const int32_t* targets, int B) {
    const int T = m_.seq_len, C = m_.n_embd, NH = m_.n_head, V = m_.vocab_size;
    const int N = B * T;
    GptTensors w = gpt_tensors(m_, table_, params_.data());
    encoder_forward(encoded_, inputs, w.wte, w.wpe, B, T, C);
    const float* residual = encoded_;
    for (int l = 0; l < m_.n_layer; ++l) {
      const GptBlock& p = w.blocks[l];
      LayerActs& a = layers_[l];
      layernorm_forward(a.ln1, a.ln1_mean, a.ln1_rstd, residual, p.ln1_w, p.ln1_b, N, C);
      matmul_forward(&pool_, a.qkv, a.ln1, p.qkv_w, p.qkv_b, N, C, 3 * C);
      attention_forward(&pool_, a.atty, a.att, a.qkv, B, T, C, NH);
      matmul_forward(&pool_, a.res2, a.atty, p.proj_w, p.proj_b, N, C, C);
      residual_forward(a.res2, a.res2, residual, static_cast<size_t>(N) * C);
      layernorm_forward(a.ln2, a.ln2_mean, a.ln2_rstd, a.res2, p.ln2_w, p.ln2_b, N, C);
      matmul_forward(&pool_, a.fch, a.ln2, p.fc_w, p.fc_b, N, C, 4 * C);
      gelu_forward(a.fch_gelu, a.fch, static_cast<size_t>(N) * 4 * C);
      matmul_forward(&pool_, a.res3, a.fch_gelu, p.fcproj_w, p.fcproj_b, N, 4 * C, C);
      residual_forward(a.res3, a.res3, a.res2, static_cast<size_t>(N) * C);
      residual = a.res3;
    }
    layernorm_forward(lnf_, lnf_mean_, lnf_rstd_, residual, w.lnf_w, w.lnf_b, N, C);
    matmul_forward(&pool_, probs_, lnf_, w.wte, nullptr, N, C, V);
    softmax_crossentropy_forward(&pool_, probs_, losses_, probs_, targets, N, V);
    double sum = 0;
    for (int n = 0; n < N; ++n) sum += losses_[n];
    return static_cast<float>(sum / N);
  }

  void backward(const int32_t* inputs, const int32_t* targets, int B, float grad_scale) {
    const int T = m_.seq_len, C = m_.n_embd, NH = m_.n_head, V = m_.vocab_size;
    const int N = B * T;
    const size_t NC = static_cast<size_t>(N) * C;
    GptTensors w = gpt_tensors(m_, table_, params_.data());
    GptTensors g = gpt_tensors(m_, table_, grads_.data());
    auto zero = [](std::vector<float>& v, size_t n) { std::memset(v.data(), 0, n * sizeof(float)); };

    softmax_crossentropy_backward(&pool_, dlogits_.data(), probs_, targets, grad_scale / static_cast<float>(N), N, V);
    zero(dln_, NC);
    matmul_backward(&pool_, dln_.data(), g.wte, nullptr, dlogits_.data(), lnf_, w.wte, N, C, V);
    zero(dres_, NC);
    const float* top = m_.n_layer > 0 ? layers_.back().res3 : encoded_;
    layernorm_backward(dres_.data(), g.lnf_w, g.lnf_b, dln_.data(), top, w.lnf_w, lnf_mean_, lnf_rstd_, N, C);

    for (int l = m_.n_layer - 1; l >= 0; --l) {
      const GptBlock& p = w.blocks[l];
      const GptBlock& gp = g.blocks[l];
      LayerActs& a = layers_[l];
      const float* residual = l == 0 ? encoded_ : layers_[l - 1].res3;
      // dres_ holds d(res3); the MLP branch reads it before the norm's contribution turns it into d(res2).
      zero(dfch_gelu_, NC * 4);
      matmul_backward(&pool_, dfch_gelu_.data(), gp.fcproj_w, gp.fcproj_b, dres_.data(), a.fch_gelu, p.fcproj_w, N,
                      4 * C, C);
      gelu_backward(dfch_.data(), a.fch, dfch_gelu_.data(), NC * 4);
      zero(dln_, NC);
      matmul_backward(&pool_, dln_.data(), gp.fc_w, gp.fc_b, dfch_.data(), a.ln2, p.fc_w, N, C, 4 * C);
      layernorm_backward(dres_.data(), gp.ln2_w, gp.ln2_b, dln_.data(), a.res2, p.ln2_w, a.ln2_mean, a.ln2_rstd, N, C);
      // Now d(res2): the attention branch, then the first norm turns it into d(residual in).
      zero(datty_, NC);
      matmul_backward(&pool_, datty_.data(), gp.proj_w, gp.proj_b, dres_.data(), a.atty, p.proj_w, N, C, C);
      zero(dqkv_, NC * 3);
      attention_backward(&pool_, dqkv_.data(), datty_.data(), a.qkv, a.att, B, T, C, NH);
      zero(dln_, NC);
      matmul_backward(&pool_, dln_.data(), gp.qkv_w, gp.qkv_b, dqkv_.data(), a.ln1, p.qkv_w, N, C, 3 * C);
      layernorm_backward(dres_.data(), gp.ln1_w, gp.ln1_b, dln_.data(), residual, p.ln1_w, a.ln1_mean, a.ln1_rstd, N,
                         C);
    }
    encoder_backward(g.wte, g.wpe, dres_.data(), inputs, B, T, C);
  }

  ModelConfig m_;
  int max_batch_;
  TensorTable table_;
  ThreadPool pool_;
  std::vector<float> params_, grads_, adam_m_, adam_v_;
  std::vector<float> acts_;
  float* encoded_ = nullptr;
  std::vector<LayerActs> layers_;
  float* lnf_ = nullptr;
  float* lnf_mean_ = nullptr;
  float* lnf_rstd_ = nullptr;
  float* probs_ = nullptr;
  float* losses_ = nullptr;
  std::vector<float> dres_, dln_, datty_, dqkv_, dfch_, dfch_gelu_, dlogits_;
  double loss_sum_ = 0;
  int loss_count_ = 0;
  StepStats stats_;
  PhaseTimes phases_{.measured = true};
};

}  // namespace

std::unique_ptr<Backend> backend_cpu_create(const ModelConfig& m, int max_batch, int threads) {
  return std::make_unique<CpuBackend>(m, max_batch, threads);
}

}  // namespace gantry
