// The CPU reference backend: fp32 everywhere, the ops of ops_cpu.h wired into GPT-2's forward and backward.
#include <chrono>
#include <cmath>
#include <cstring>
#include <initializer_list>
#include <memory>
#include <vector>

#include "engine/core/backend.h"
#include "engine/core/comm/communicator.h"
#include "engine/core/cpu/cpu_state.h"
#include "engine/core/cpu/ops_cpu.h"
#include "engine/core/cpu/thread_pool.h"
#include "engine/core/cpu/tp_ops_cpu.h"
#include "engine/core/gpt.h"
#include "engine/core/optim.h"
#include "engine/core/parallel/tensor_parallel.h"
#include "engine/core/parallel/zero_host_state.h"

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
// Cl = C/tp, NHl = n_head/tp and Hl = 4C/tp are this tensor-parallel rank's share (C, n_head and 4C at tp 1);
// the code's locals name them Cl, NH and H. Nr = N, or N/tp under sequence parallelism (this rank's
// positions of each sequence).
struct LayerActs {
  float* ln1;       // (Nr, C)
  float* ln1_mean;  // (Nr)
  float* ln1_rstd;  // (Nr)
  float* qkv;       // (N, 3Cl)
  float* att;       // (B, NHl, T, T)
  float* atty;      // (N, Cl)
  float* res2;      // (Nr, C)
  float* ln2;       // (Nr, C)
  float* ln2_mean;  // (Nr)
  float* ln2_rstd;  // (Nr)
  float* fch;       // (N, Hl)
  float* fch_gelu;  // (N, Hl)
  float* res3;      // (Nr, C)
};

// The tensor-parallel pieces (the row-parallel all-reduce, the vocab-parallel embedding and
// cross-entropy, sequence parallelism's reduce-scatters and all-gathers) are TpOpsCpu's (cpu/tp_ops_cpu.h),
// which the pipeline stage runs too; the set-up both share is cpu/cpu_state.h's.
class CpuBackend final : public CpuStateBackend {
 public:
  CpuBackend(const ModelConfig& m, int max_batch, const BackendOptions& o)
      : m_(m),
        max_batch_(max_batch),
        tp_(cpu_tp_ops(o, &pool_, m, max_batch)),
        table_(tensor_parallel_table(m, tp_.size(), tp_.rank())),
        pool_(o.threads) {
    state_ = cpu_state_create(table_, o, tp_, &pool_);
    allocate_activations();
  }

  std::string name() const override { return "cpu"; }
  const TensorTable& params() const override { return table_; }

  void forward_backward(const int32_t* inputs, const int32_t* targets, int batch, float grad_scale) override {
    state_->begin_micro_batch();
    const auto t0 = std::chrono::steady_clock::now();
    const double exposed0 = exposed_comm_seconds();
    loss_sum_ += forward(inputs, targets, batch);
    ++loss_count_;
    const auto t1 = std::chrono::steady_clock::now();
    const double exposed1 = exposed_comm_seconds();
    backward(inputs, targets, batch, grad_scale);
    const double exposed2 = exposed_comm_seconds();
    // Waiting for a gather or a staging buffer is communication, not compute.
    phases_.forward_s += std::chrono::duration<double>(t1 - t0).count() - (exposed1 - exposed0);
    phases_.backward_s +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count() - (exposed2 - exposed1);
  }

  PhaseTimes phase_times() const override {
    PhaseTimes p = phases_;
    p.comm_exposed_s = state_->exposed_comm_seconds() + tp_.comm_s;
    return p;
  }

  float forward_loss(const int32_t* inputs, const int32_t* targets, int batch) override {
    return forward(inputs, targets, batch);
  }

  void zero_grads() override { begin_step(1); }
  void begin_step(int micro_batches) override {
    state_->begin_step(micro_batches);
    tp_.comm_s = 0;
    loss_sum_ = 0;
    loss_count_ = 0;
    phases_ = {.measured = true};
  }

  void optimizer_step(const AdamWStep& s) override {
    const auto t0 = std::chrono::steady_clock::now();
    const double exposed0 = state_->exposed_comm_seconds();
    const ZeroHostState::Reduced r = state_->reduce_stats(loss_count_ ? loss_sum_ / loss_count_ : 0.0);
    stats_.loss = r.loss;
    stats_.grad_norm = r.grad_norm;
    // max_loss is the step guard's: the loss is the gang's reduced one, so every rank skips together.
    stats_.updated = std::isfinite(r.grad_norm) && std::isfinite(r.loss) && !(r.loss > s.max_loss);
    if (stats_.updated) state_->adamw(s, clip_scale(r.grad_norm, s.grad_clip));
    phases_.optimizer_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() -
                           (state_->exposed_comm_seconds() - exposed0);
  }

  bool honours_max_loss() const override { return true; }
  StepStats step_stats() override { return stats_; }

  uint64_t memory_bytes() const override {
    size_t floats = state_->allocated().total() + acts_.size() + dres_.size() + dln_.size() + datty_.size() +
                    dqkv_.size() + dfch_.size() + dfch_gelu_.size() + dlogits_.size() + tp_.scratch_floats() +
                    sp_lnf_.size();
    return floats * sizeof(float);
  }

  // ZeRO 0-2 keep every parameter on every rank (ZeRO 1-2 all-gather the updated shards at the end of the
  // update): those fp32 values are what the replicas must hold identically. ZeRO 3 keeps only the shard.
  std::string replicated_state() const override { return state_->plan().zero < 3 ? "fp32 parameters" : ""; }
  uint64_t replicated_bytes() const override {
    return state_->plan().zero < 3 ? table_.numel() * sizeof(float) : 0;
  }
  bool test_flip_replicated_bit(uint64_t bit) override {
    if (state_->plan().zero >= 3 || bit >= replicated_bytes() * 8) return false;
    const size_t element = static_cast<size_t>(bit / 32);
    float v = 0;
    state_->read(StateBuffer::kParams, element, 1, &v);
    uint32_t u = 0;
    std::memcpy(&u, &v, sizeof u);
    u ^= uint32_t{1} << (bit % 32);
    std::memcpy(&v, &u, sizeof v);
    state_->write(StateBuffer::kParams, element, 1, &v);
    return true;
  }

 private:
  // Pointers to the tensors of one unit (embeddings, a block, the final norm) inside that unit's buffer;
  // the other tensors' pointers are null. Under ZeRO 3 a unit's buffer is valid between params(unit) and
  // release(unit).
  GptTensors unit_view(int unit, float* base) const {
    const FlatRange& u = state_->plan().units[unit];
    return gpt_tensors(m_, table_, [&](const TensorInfo& t) -> float* {
      return t.offset >= u.offset && t.offset < u.end() ? base + (t.offset - u.offset) : nullptr;
    });
  }
  int block_unit(int layer) const { return 1 + layer; }
  double exposed_comm_seconds() const { return state_->exposed_comm_seconds() + tp_.comm_s; }

  void allocate_activations() {
    const size_t tp = tp_.size(), B = max_batch_, T = m_.seq_len, C = m_.n_embd,
                 V = m_.vocab_size / tp;  // this rank's vocab
    const size_t N = B * T;
    const size_t Nr = tp_.rows(static_cast<int>(N));  // rows of the LayerNorm and residual regions
    const size_t Cl = m_.n_embd / tp, NH = m_.n_head / tp, H = 4 * C / tp;  // this tp rank's share
    const size_t per_layer = Nr * C * 4 + N * Cl + Nr * 4 + N * 3 * Cl + B * NH * T * T + N * H * 2;
    const size_t total = Nr * C + per_layer * m_.n_layer + Nr * C + 2 * Nr + N * V + N;
    acts_.assign(total, 0.0f);
    float* p = acts_.data();
    auto take = [&](size_t n) {
      float* r = p;
      p += n;
      return r;
    };
    encoded_ = take(Nr * C);
    layers_.resize(m_.n_layer);
    for (LayerActs& l : layers_) {
      l.ln1 = take(Nr * C);
      l.ln1_mean = take(Nr);
      l.ln1_rstd = take(Nr);
      l.qkv = take(N * 3 * Cl);
      l.att = take(B * NH * T * T);
      l.atty = take(N * Cl);
      l.res2 = take(Nr * C);
      l.ln2 = take(Nr * C);
      l.ln2_mean = take(Nr);
      l.ln2_rstd = take(Nr);
      l.fch = take(N * H);
      l.fch_gelu = take(N * H);
      l.res3 = take(Nr * C);
    }
    lnf_ = take(Nr * C);
    lnf_mean_ = take(Nr);
    lnf_rstd_ = take(Nr);
    probs_ = take(N * V);
    losses_ = take(N);
    // Backward scratch, reused by every layer.
    dres_.assign(Nr * C, 0);
    dln_.assign(N * C, 0);
    datty_.assign(N * Cl, 0);
    dqkv_.assign(N * 3 * Cl, 0);
    dfch_.assign(N * H, 0);
    dfch_gelu_.assign(N * H, 0);
    dlogits_.assign(N * V, 0);
    if (tp_.sp()) sp_lnf_.assign(N * C, 0);
  }

  float forward(const int32_t* inputs, const int32_t* targets, int B) {
    const int tp = tp_.size(), T = m_.seq_len, C = m_.n_embd, V = m_.vocab_size / tp;  // V: this tp rank's
    const int Cl = C / tp, NH = m_.n_head / tp, H = 4 * C / tp;  // this tp rank's heads and MLP width
    const int N = B * T;
    const int Nr = tp_.rows(N);  // rows of the LayerNorm and residual regions
    const int emb = state_->plan().embedding_unit(), fin = state_->plan().final_unit();
    // Parameters are only read here; the views share GptTensors' (mutable) pointer type with gradients.
    GptTensors e = unit_view(emb, const_cast<float*>(state_->params(emb)));
    state_->prefetch(block_unit(0));
    // Vocab-parallel at tp > 1: each token's row comes from the rank that owns it (vocab_parallel_cpu.h),
    // under sequence parallelism reduce-scattered onto this rank's positions.
    tp_.encoder_forward(encoded_, inputs, e.wte, e.wpe, B, T, C, V);
    const float* residual = encoded_;
    for (int l = 0; l < m_.n_layer; ++l) {
      const int u = block_unit(l);
      GptTensors w = unit_view(u, const_cast<float*>(state_->params(u)));
      state_->prefetch(u + 1);
      const GptBlock& p = w.blocks[l];
      LayerActs& a = layers_[l];
      layernorm_forward(a.ln1, a.ln1_mean, a.ln1_rstd, residual, p.ln1_w, p.ln1_b, Nr, C);
      matmul_forward(&pool_, a.qkv, tp_.column_input(a.ln1, B, T, C), p.qkv_w, p.qkv_b, N, C,
                     3 * Cl);  // column-parallel
      attention_forward(&pool_, a.atty, a.att, a.qkv, B, T, Cl, NH);
      tp_.row_parallel_forward(a.res2, a.atty, p.proj_w, p.proj_b, B, T, Cl, C);
      residual_forward(a.res2, a.res2, residual, static_cast<size_t>(Nr) * C);
      layernorm_forward(a.ln2, a.ln2_mean, a.ln2_rstd, a.res2, p.ln2_w, p.ln2_b, Nr, C);
      matmul_forward(&pool_, a.fch, tp_.column_input(a.ln2, B, T, C), p.fc_w, p.fc_b, N, C,
                     H);  // column-parallel
      gelu_forward(a.fch_gelu, a.fch, static_cast<size_t>(N) * H);
      tp_.row_parallel_forward(a.res3, a.fch_gelu, p.fcproj_w, p.fcproj_b, B, T, H, C);
      residual_forward(a.res3, a.res3, a.res2, static_cast<size_t>(Nr) * C);
      residual = a.res3;
      state_->release(u);
    }
    GptTensors f = unit_view(fin, const_cast<float*>(state_->params(fin)));
    layernorm_forward(lnf_, lnf_mean_, lnf_rstd_, residual, f.lnf_w, f.lnf_b, Nr, C);
    // The classifier sees every position (kept for its weight gradient).
    if (tp_.sp()) tp_.gather_positions(lnf_, sp_lnf_.data(), B, T, C);
    const float* head_in = tp_.sp() ? sp_lnf_.data() : lnf_;
    matmul_forward(&pool_, probs_, head_in, e.wte, nullptr, N, C, V);  // tp: this rank's vocabulary's logits
    tp_.crossentropy_forward(probs_, losses_, targets, N, V);
    double sum = 0;
    for (int n = 0; n < N; ++n) sum += losses_[n];
    return static_cast<float>(sum / N);
  }

  // Gradients are asked for unit by unit in the order the pass completes them (classifier and final norm,
  // the blocks from the top, the embeddings last), so each bucket can be reduced as soon as it is full.
  void backward(const int32_t* inputs, const int32_t* targets, int B, float grad_scale) {
    const int tp = tp_.size(), T = m_.seq_len, C = m_.n_embd, V = m_.vocab_size / tp;  // V: this tp rank's
    const int Cl = C / tp, NH = m_.n_head / tp, H = 4 * C / tp;                        // this tp rank's share
    const int N = B * T;
    const int Nr = tp_.rows(N);  // rows of the LayerNorm and residual regions
    const size_t NC = static_cast<size_t>(N) * C, NCl = static_cast<size_t>(N) * Cl,
                 NH4 = static_cast<size_t>(N) * H, NrC = static_cast<size_t>(Nr) * C;
    auto zero = [](std::vector<float>& v, size_t n) { std::memset(v.data(), 0, n * sizeof(float)); };
    // d(residual) over every position: under sequence parallelism gathered from the ranks' positions.
    auto whole = [&](const float* local) { return tp_.whole_grad(local, B, T, C); };
    const int emb = state_->plan().embedding_unit(), fin = state_->plan().final_unit();
    GptTensors we = unit_view(emb, const_cast<float*>(state_->params(emb)));
    GptTensors wf = unit_view(fin, const_cast<float*>(state_->params(fin)));
    GptTensors ge = unit_view(emb, state_->grads(emb));
    GptTensors gf = unit_view(fin, state_->grads(fin));

    tp_.crossentropy_backward(dlogits_.data(), probs_, targets, grad_scale / static_cast<float>(N), N, V);
    zero(dln_, NC);
    matmul_backward(&pool_, dln_.data(), ge.wte, nullptr, dlogits_.data(), tp_.sp() ? sp_lnf_.data() : lnf_,
                    we.wte, N, C, V);
    // Vocab-parallel classifier: each rank's d(lnf) is the part of the sum over its vocabulary.
    const float* dlnf = tp_.column_input_grad(dln_.data(), B, T, C);
    zero(dres_, NrC);
    const float* top = m_.n_layer > 0 ? layers_.back().res3 : encoded_;
    layernorm_backward(dres_.data(), tp_.ln_grad(gf.lnf_w, 0, C), tp_.ln_grad(gf.lnf_b, 1, C), dlnf, top,
                       wf.lnf_w, lnf_mean_, lnf_rstd_, Nr, C);
    tp_.add_ln_grads({gf.lnf_w, gf.lnf_b}, C);
    state_->grads_done(fin);
    if (m_.n_layer > 0) state_->prefetch(block_unit(m_.n_layer - 1));

    for (int l = m_.n_layer - 1; l >= 0; --l) {
      const int u = block_unit(l);
      GptTensors wu = unit_view(u, const_cast<float*>(state_->params(u)));
      state_->prefetch(u - 1);
      GptTensors gu = unit_view(u, state_->grads(u));
      const GptBlock& p = wu.blocks[l];
      const GptBlock& gp = gu.blocks[l];
      LayerActs& a = layers_[l];
      const float* residual = l == 0 ? encoded_ : layers_[l - 1].res3;
      // dres_ holds d(res3); the MLP branch reads it before the norm's contribution turns it into d(res2).
      // Tensor parallel: d(res3) is whole on every tp rank, so the row-parallel layer's input gradient is
      // this rank's share without communication and its (whole) bias gets the same bits everywhere; the
      // column-parallel layer's input gradient is a partial sum over the shares, all-reduced.
      // Sequence parallel: d(res3) is gathered first (this rank holds its positions), the column-parallel
      // input gradient reduce-scattered back onto them, and the LayerNorm inputs re-gathered for the
      // column-parallel weight gradients.
      zero(dfch_gelu_, NH4);
      matmul_backward(&pool_, dfch_gelu_.data(), gp.fcproj_w, gp.fcproj_b, whole(dres_.data()), a.fch_gelu,
                      p.fcproj_w, N, H, C);
      gelu_backward(dfch_.data(), a.fch, dfch_gelu_.data(), NH4);
      zero(dln_, NC);
      matmul_backward(&pool_, dln_.data(), gp.fc_w, gp.fc_b, dfch_.data(), tp_.column_input(a.ln2, B, T, C),
                      p.fc_w, N, C, H);
      layernorm_backward(dres_.data(), tp_.ln_grad(gp.ln2_w, 2, C), tp_.ln_grad(gp.ln2_b, 3, C),
                         tp_.column_input_grad(dln_.data(), B, T, C), a.res2, p.ln2_w, a.ln2_mean, a.ln2_rstd,
                         Nr, C);
      // Now d(res2): the attention branch, then the first norm turns it into d(residual in).
      zero(datty_, NCl);
      matmul_backward(&pool_, datty_.data(), gp.proj_w, gp.proj_b, whole(dres_.data()), a.atty, p.proj_w, N,
                      Cl, C);
      zero(dqkv_, NCl * 3);
      attention_backward(&pool_, dqkv_.data(), datty_.data(), a.qkv, a.att, B, T, Cl, NH);
      zero(dln_, NC);
      matmul_backward(&pool_, dln_.data(), gp.qkv_w, gp.qkv_b, dqkv_.data(), tp_.column_input(a.ln1, B, T, C),
                      p.qkv_w, N, C, 3 * Cl);
      layernorm_backward(dres_.data(), tp_.ln_grad(gp.ln1_w, 0, C), tp_.ln_grad(gp.ln1_b, 1, C),
                         tp_.column_input_grad(dln_.data(), B, T, C), residual, p.ln1_w, a.ln1_mean,
                         a.ln1_rstd, Nr, C);
      tp_.add_ln_grads({gp.ln1_w, gp.ln1_b, gp.ln2_w, gp.ln2_b}, C);
      state_->grads_done(u);
      state_->release(u);
    }
    // At tp > 1 every position's gradient (gathered under sequence parallelism): wpe's gradient is then
    // whole, the same bits on every tp rank.
    tp_.encoder_backward(ge.wte, ge.wpe, dres_.data(), inputs, B, T, C, V);
    state_->grads_done(emb);
  }

  ModelConfig m_;
  int max_batch_;
  TpOpsCpu tp_;  // the tp axis' pieces (no communicator at tp 1); comm_s: its seconds since begin_step
  TensorTable table_;
  ThreadPool pool_;
  std::vector<float> acts_;
  float* encoded_ = nullptr;
  std::vector<LayerActs> layers_;
  float* lnf_ = nullptr;
  float* lnf_mean_ = nullptr;
  float* lnf_rstd_ = nullptr;
  float* probs_ = nullptr;
  float* losses_ = nullptr;
  std::vector<float> dres_, dln_, datty_, dqkv_, dfch_, dfch_gelu_, dlogits_;
  // Sequence parallel: the gathered final norm (the classifier's input, kept for wte's gradient).
  std::vector<float> sp_lnf_;
  double loss_sum_ = 0;
  int loss_count_ = 0;
  StepStats stats_;
  PhaseTimes phases_{.measured = true};
};

}  // namespace

std::unique_ptr<Backend> backend_cpu_create(const ModelConfig& m, int max_batch,
                                            const BackendOptions& options) {
  return std::make_unique<CpuBackend>(m, max_batch, options);
}

std::unique_ptr<Backend> backend_cpu_create(const ModelConfig& m, int max_batch, int threads) {
  return backend_cpu_create(m, max_batch, BackendOptions{.threads = threads});
}

}  // namespace gantry
