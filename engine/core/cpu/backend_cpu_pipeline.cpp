// One pipeline stage of the CPU reference backend (parallel/pipeline_schedule.h): the stage's blocks (and
// the embeddings on the first stage, the final norm and classifier on the last), run micro-batch by
// micro-batch in the schedule's order, with activations and their gradients handed between neighbouring
// stages over the pp communicator's point-to-point pairs. Interleaved, a rank holds vp model chunks
// (virtual stages rank, pp + rank, ...), each with its own activations per micro-batch; under ZB-H1 a
// micro-batch's backward is split in two, the input gradient (sent on at once) and the weight gradient
// (run later from the output gradients the first half kept).
//
// The train loop does not change: it calls forward_backward once per micro-batch as under gradient
// accumulation; the stage keeps each micro-batch's tokens and runs the whole schedule when the step's last
// one arrives. Every stage's gradients are accumulated in micro-batch order, as one process adds them.
//
// The tied embedding: wte is owned (updated, counted in the norm) by the first stage. The last stage
// runs the classifier with a copy of it, sent at the start of each step, and sends back each micro-batch's
// final-norm output and logit gradient after its schedule; the first stage then adds the classifier's and
// the encoder's wte gradients micro-batch by micro-batch, in one process's order, so wte's gradient has the
// same bits as one process's (the price: N x (C + V) floats per micro-batch over that pair).
//
// Stage gradients are reduced over dp (ZeroHostState) after the schedule; the loss (the last stage's) and
// the squared norm (every stage's) are then shared over pp in stage order. A schedule visits the stage's
// layers micro-batch after micro-batch in no block order, so under ZeRO 2 and 3 the stage works on whole
// buffers for the step: ZeRO 3 gathers its parameters once at the step's start (and before validation),
// ZeRO 2 and 3 accumulate its gradients in a whole buffer and hand it to the dp state as one micro-batch
// after the schedule, which reduce-scatters it into the owned shard. Between steps only the shards stay
// (optimizer state, ZeRO 2's gradients, ZeRO 3's parameters); during one the stage holds ZeRO 1's memory.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <memory>
#include <vector>

#include "engine/core/backend.h"
#include "engine/core/comm/communicator.h"
#include "engine/core/cpu/cpu_state.h"
#include "engine/core/cpu/ops_cpu.h"
#include "engine/core/cpu/thread_pool.h"
#include "engine/core/cpu/tp_ops_cpu.h"
#include "engine/core/fatal.h"
#include "engine/core/gpt.h"
#include "engine/core/optim.h"
#include "engine/core/parallel/pipeline_schedule.h"
#include "engine/core/parallel/tensor_parallel.h"
#include "engine/core/parallel/zero_host_state.h"

namespace gantry {
namespace {

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// One block's activations of one micro-batch (as the one-process backend keeps them, at tp 1), and under
// ZB-H1 the output gradients of its four matmuls, kept from the input-gradient pass for the weight pass.
// Cl = C/tp is this tp rank's share of the width; Nr = N, or N/tp under sequence parallelism (this rank's
// positions of each sequence).
struct BlockActs {
  float* ln1;                 // (Nr, C)
  float* ln1_mean;            // (Nr)
  float* ln1_rstd;            // (Nr)
  float* qkv;                 // (N, 3Cl)
  float* att;                 // (B, NH/tp, T, T)
  float* atty;                // (N, Cl)
  float* res2;                // (Nr, C)
  float* ln2;                 // (Nr, C)
  float* ln2_mean;            // (Nr)
  float* ln2_rstd;            // (Nr)
  float* fch;                 // (N, 4Cl)
  float* fch_gelu;            // (N, 4Cl)
  float* res3;                // (Nr, C)
  float* d_fcproj = nullptr;  // (N, C)
  float* d_fc = nullptr;      // (N, 4Cl)
  float* d_proj = nullptr;    // (N, C)
  float* d_qkv = nullptr;     // (N, 3Cl)
};

// A micro-batch in flight in one chunk of this stage: its input, its blocks' activations, (last virtual
// stage) the head's, and the gradient of its output (received, or the head's), which the backward turns
// into the gradient of its input in place.
struct Slot {
  std::vector<float> mem;
  int chunk = 0, first_layer = 0, layers = 0;
  bool embed = false, head = false;  // virtual stage 0 / the last one
  bool split = false;                // ZB-H1: the backward leaves the matmuls' weight gradients for later
  bool release_after_send = false;   // its input gradient is still to be sent
  float* in = nullptr;               // (Nr, C): the encoder's output (stage 0) or the previous stage's
  float* dout = nullptr;             // (Nr, C): d(output), then d(input)
  std::vector<BlockActs> blocks;
  float* lnf = nullptr;       // (Nr, C)
  float* lnf_mean = nullptr;  // (Nr)
  float* lnf_rstd = nullptr;  // (Nr)
  float* head_in = nullptr;   // (N, C): the classifier's input, lnf (or under SP lnf gathered over tp)
  float* probs = nullptr;     // (N, V)
  float* losses = nullptr;    // (N)
};

struct Micro {
  std::vector<int32_t> inputs, targets;
  int batch = 0;
  float grad_scale = 0;
};

class PipelineCpuBackend final : public CpuStateBackend {
 public:
  PipelineCpuBackend(const ModelConfig& m, int max_batch, const BackendOptions& o)
      : m_(m),
        max_batch_(max_batch),
        pp_(o.pp),
        stage_(o.pp->rank()),
        stages_(o.pp->size()),
        timeout_(o.comm_timeout),
        vp_(std::max(1, o.vp)),
        part_(pipeline_partition(m, stages_ * vp_)),
        table_(rank_table(m, part_, stages_, stage_, o.tp)),
        pool_(o.threads) {
    GANTRY_CHECK(pipeline_schedule_from_name(o.pp_schedule, &schedule_),
                 "unknown pipeline schedule '" + o.pp_schedule + "'");
    zero_ = o.zero;
    slots_.resize(vp_);
    busy_.resize(vp_);
    slot_of_.resize(vp_);
    // tp x pp: the stage's blocks run tensor-parallel over its tp group (tp_ops_cpu.h), the embedding and
    // the classifier vocab-parallel; the pp communicator links matching tp ranks of the stages.
    // Sequence parallel: the stage's residual stream and LayerNorms hold this tp rank's positions only, and
    // so do the activations and gradients passed between stages (matching tp ranks hold the same ones).
    // The tp pieces and the dp state are set up as the one-process backend's (cpu_state.h).
    tp_ = cpu_tp_ops(o, &pool_, m, max_batch);
    state_ = cpu_state_create(table_, o, tp_, &pool_);
    const size_t N = static_cast<size_t>(max_batch) * m.seq_len, C = m.n_embd, V = vocab();
    const size_t Cl = C / tp_.size();  // this tp rank's share of the heads' width
    if (last()) wte_copy_.assign(V * C, 0.0f);
    if (zero_ >= 2) work_grads_.assign(table_.numel(), 0.0f);
    if (zero_ >= 3) work_params_.assign(table_.numel(), 0.0f);
    dln_.assign(N * C, 0.0f);
    datty_.assign(N * Cl, 0.0f);
    dqkv_.assign(N * 3 * Cl, 0.0f);
    dfch_.assign(N * 4 * Cl, 0.0f);
    dfch_gelu_.assign(N * 4 * Cl, 0.0f);
  }

  std::string name() const override { return "cpu"; }
  const TensorTable& params() const override { return table_; }

  void zero_grads() override { begin_step(1); }
  void begin_step(int micro_batches) override {
    // The stage accumulates every micro-batch into its gradients itself, so the dp state sees one.
    state_->begin_step(1);
    if (zero_ >= 2) std::fill(work_grads_.begin(), work_grads_.end(), 0.0f);
    expected_micros_ = std::max(1, micro_batches);
    micros_.clear();
    loss_sum_ = 0;
    loss_count_ = 0;
    p2p_s_ = 0;
    tp_.comm_s = 0;
    phases_ = {.measured = true};
  }

  void forward_backward(const int32_t* inputs, const int32_t* targets, int batch, float grad_scale) override {
    const size_t n = static_cast<size_t>(batch) * m_.seq_len;
    micros_.push_back({std::vector<int32_t>(inputs, inputs + n), std::vector<int32_t>(targets, targets + n),
                       batch, grad_scale});
    if (static_cast<int>(micros_.size()) == expected_micros_) run_step();
  }

  float forward_loss(const int32_t* inputs, const int32_t* targets, int batch) override {
    gather_work_params();
    sync_wte();
    const size_t NC = static_cast<size_t>(tp_.rows(batch * m_.seq_len)) * m_.n_embd;  // a stage's output
    float loss = 0;
    // Down the virtual stages in order: each owner takes its input from the previous one's and hands on.
    for (int v = stage_; v < virtual_stages(); v += stages_) {
      Slot& s = acquire(v / stages_, -1);
      if (v == 0) {
        tp_.encoder_forward(s.in, inputs, param("wte"), param("wpe"), batch, m_.seq_len, m_.n_embd, vocab());
      } else {
        exchange({}, s.in, NC, owner(v - 1));
      }
      const float l = stage_forward(s, batch, targets);
      if (s.head) loss = l;
      if (v + 1 < virtual_stages()) exchange({output_of(s), NC, owner(v + 1)}, nullptr, 0, -1);
      release(s);
    }
    // Only the last stage computed it; the others add zero, which leaves its bits as they are.
    check(pp_->all_reduce_host(&loss, 1, timeout_), "validation loss");
    return loss;
  }

  void optimizer_step(const AdamWStep& s) override {
    const auto t0 = Clock::now();
    const double exposed0 = state_->exposed_comm_seconds();
    const double local = last() && loss_count_ > 0 ? loss_sum_ / loss_count_ : 0.0;
    const ZeroHostState::Reduced r = state_->reduce_stats(local);
    // Every stage's (loss, squared norm) in stage order: the last stage's loss, the squares summed.
    const auto g0 = Clock::now();
    std::vector<float> mine(4), all(static_cast<size_t>(4) * stages_);
    const double vals[2] = {r.loss, r.grad_norm * r.grad_norm};
    for (int i = 0; i < 2; ++i) {
      mine[2 * i] = static_cast<float>(vals[i]);
      mine[2 * i + 1] = static_cast<float>(vals[i] - static_cast<double>(mine[2 * i]));
    }
    check(pp_->all_gather(mine.data(), all.data(), all.size(), timeout_), "loss and gradient norm");
    stats_comm_s_ = since(g0);
    double sq = 0;
    for (int k = 0; k < stages_; ++k) sq += static_cast<double>(all[4 * k + 2]) + all[4 * k + 3];
    const float* tail = all.data() + 4 * (stages_ - 1);
    stats_.loss = static_cast<double>(tail[0]) + static_cast<double>(tail[1]);
    stats_.grad_norm = std::sqrt(sq);
    stats_.updated =
        std::isfinite(stats_.grad_norm) && std::isfinite(stats_.loss) && !(stats_.loss > s.max_loss);
    if (stats_.updated) state_->adamw(s, clip_scale(stats_.grad_norm, s.grad_clip));
    work_params_fresh_ = false;
    phases_.optimizer_s += since(t0) - (state_->exposed_comm_seconds() - exposed0) - stats_comm_s_;
  }

  bool honours_max_loss() const override { return true; }
  StepStats step_stats() override { return stats_; }

  PhaseTimes phase_times() const override {
    PhaseTimes p = phases_;
    p.comm_exposed_s = state_->exposed_comm_seconds() + p2p_s_ + stats_comm_s_ + tp_.comm_s;
    return p;
  }

  uint64_t memory_bytes() const override {
    size_t floats = state_->allocated().total() + wte_copy_.size() + work_params_.size() +
                    work_grads_.size() + dln_.size() + datty_.size() + dqkv_.size() + dfch_.size() +
                    dfch_gelu_.size() + tp_.scratch_floats();
    for (const std::vector<Slot>& chunk : slots_)
      for (const Slot& s : chunk) floats += s.mem.size();
    for (const std::vector<float>& v : tie_) floats += v.size();
    floats += tie_in_.size();  // first stage: the tie data received (allocated in the first step)
    for (const std::vector<float>& v : dres0_) floats += v.size();
    return floats * sizeof(float);
  }
  void write_state(StateBuffer which, size_t offset, size_t count, const float* in) override {
    CpuStateBackend::write_state(which, offset, count, in);
    if (which == StateBuffer::kParams) work_params_fresh_ = false;  // ZeRO 3: gather them again
  }

  std::string replicated_state() const override { return "fp32 parameters"; }
  uint64_t replicated_bytes() const override { return table_.numel() * sizeof(float); }

 private:
  // The rank's tensors (its virtual stages'), each a share of the whole model's at tp > 1.
  static TensorTable rank_table(const ModelConfig& m, const PipelinePartition& part, int stages, int stage,
                                Communicator* tp) {
    const TensorTable t = pipeline_rank_table(m, part, stages, stage);
    return tp != nullptr && tp->size() > 1 ? tensor_parallel_stage_table(m, tp->size(), tp->rank(), t) : t;
  }
  int vocab() const { return m_.vocab_size / tp_.size(); }  // this tp rank's token rows of wte
  bool first() const { return stage_ == 0; }
  bool last() const { return stage_ == stages_ - 1; }
  // Chunk c of this rank is virtual stage c·pp + stage.
  int virtual_stage(int chunk) const { return chunk * stages_ + stage_; }
  int owner(int virtual_stage) const { return virtual_stage % stages_; }
  int virtual_stages() const { return stages_ * vp_; }

  // ZeRO 0-1 keep every parameter and gradient of the stage in one buffer, in the table's coordinates; under
  // ZeRO 2-3 the step's whole buffers are the backend's (work_grads_, and ZeRO 3's work_params_).
  float* param(const std::string& name) const {
    float* base =
        zero_ >= 3 ? const_cast<float*>(work_params_.data()) : const_cast<float*>(state_->params(0));
    return base + table_.at(name).offset;
  }
  float* grad(const std::string& name) const {
    float* base = zero_ >= 2 ? const_cast<float*>(work_grads_.data()) : state_->grads(0);
    return base + table_.at(name).offset;
  }
  // ZeRO 3: the stage's parameters, gathered over dp once after each update (a collective of the dp group,
  // whose ranks run the same calls).
  void gather_work_params() {
    if (zero_ < 3 || work_params_fresh_) return;
    state_->gather_params(work_params_.data());
    work_params_fresh_ = true;
  }
  GptBlock block(int layer, bool grads) const {
    const std::string p = "h." + std::to_string(layer) + ".";
    auto at = [&](const char* n) { return grads ? grad(p + n) : param(p + n); };
    return {at("ln1.weight"),       at("ln1.bias"),       at("attn.qkv.weight"), at("attn.qkv.bias"),
            at("attn.proj.weight"), at("attn.proj.bias"), at("ln2.weight"),      at("ln2.bias"),
            at("mlp.fc.weight"),    at("mlp.fc.bias"),    at("mlp.proj.weight"), at("mlp.proj.bias")};
  }

  void check(const Status& st, const char* what) const {
    if (!st.ok())
      fatal_error(__FILE__, __LINE__, std::string("pipeline stage: ") + what + ": " + st.message());
  }
  // A send to the next or previous stage and a receive, posted together (either may be empty). The peer
  // is implied by the direction: activations go down (to stage + 1), gradients up (to stage - 1).
  struct Half {
    const float* data = nullptr;
    size_t count = 0;
    int peer = -1;
  };
  void exchange(Half out, float* in, size_t in_count, int in_peer) {
    if (out.count == 0 && in_count == 0) return;
    const auto t0 = Clock::now();
    Status st = pp_->send_recv(out.data, out.count, out.peer, in, in_count, in_peer, timeout_);
    p2p_s_ += since(t0);
    check(st, "point-to-point");
  }

  // Stage 0 sends its wte to the last stage, which runs the classifier with the copy.
  void sync_wte() {
    const size_t n = static_cast<size_t>(vocab()) * m_.n_embd;
    if (first()) exchange({param("wte"), n, stages_ - 1}, nullptr, 0, -1);
    if (last()) exchange({}, wte_copy_.data(), n, 0);
  }

  // A free slot of `chunk` for micro-batch `micro` (-1: validation), allocated on first use; a chunk keeps
  // as many as its schedule holds at once.
  Slot& acquire(int chunk, int micro) {
    const size_t B = max_batch_, T = m_.seq_len, C = m_.n_embd, V = vocab(), NH = m_.n_head / tp_.size();
    const size_t N = B * T, Cl = C / tp_.size(), Nr = tp_.rows(static_cast<int>(N));
    std::vector<Slot>& pool = slots_[chunk];
    for (size_t i = 0; i < pool.size(); ++i) {
      if (!busy_[chunk][i]) {
        busy_[chunk][i] = true;
        if (micro >= 0) slot_of_[chunk][micro] = static_cast<int>(i);
        return pool[i];
      }
    }
    const int v = virtual_stage(chunk);
    Slot s;
    s.chunk = chunk;
    s.first_layer = part_.first_layer[v];
    s.layers = part_.layers[v];
    s.embed = v == 0;
    s.head = v == virtual_stages() - 1;
    s.split = schedule_ == PipelineSchedule::kZeroBubbleH1;
    const size_t per_block = Nr * C * 4 + N * Cl + Nr * 4 + N * 3 * Cl + B * NH * T * T + N * 4 * Cl * 2 +
                             (s.split ? N * C * 2 + N * 4 * Cl + N * 3 * Cl : 0);
    const size_t head = s.head ? Nr * C + 2 * Nr + (tp_.sp() ? N * C : 0) + N * V + N : 0;
    s.mem.assign(2 * Nr * C + per_block * s.layers + head, 0.0f);
    float* p = s.mem.data();
    auto take = [&](size_t k) {
      float* r = p;
      p += k;
      return r;
    };
    s.in = take(Nr * C);
    s.dout = take(Nr * C);
    s.blocks.resize(s.layers);
    for (BlockActs& a : s.blocks) {
      a.ln1 = take(Nr * C);
      a.ln1_mean = take(Nr);
      a.ln1_rstd = take(Nr);
      a.qkv = take(N * 3 * Cl);
      a.att = take(B * NH * T * T);
      a.atty = take(N * Cl);
      a.res2 = take(Nr * C);
      a.ln2 = take(Nr * C);
      a.ln2_mean = take(Nr);
      a.ln2_rstd = take(Nr);
      a.fch = take(N * 4 * Cl);
      a.fch_gelu = take(N * 4 * Cl);
      a.res3 = take(Nr * C);
      if (s.split) {
        a.d_fcproj = take(N * C);
        a.d_fc = take(N * 4 * Cl);
        a.d_proj = take(N * C);
        a.d_qkv = take(N * 3 * Cl);
      }
    }
    if (s.head) {
      s.lnf = take(Nr * C);
      s.lnf_mean = take(Nr);
      s.lnf_rstd = take(Nr);
      s.head_in = tp_.sp() ? take(N * C) : s.lnf;
      s.probs = take(N * V);
      s.losses = take(N);
    }
    pool.push_back(std::move(s));
    busy_[chunk].push_back(true);
    if (micro >= 0) slot_of_[chunk][micro] = static_cast<int>(pool.size() - 1);
    return pool.back();
  }
  Slot& slot(int chunk, int micro) { return slots_[chunk][slot_of_[chunk][micro]]; }
  void release(const Slot& s) {
    std::vector<Slot>& pool = slots_[s.chunk];
    busy_[s.chunk][&s - pool.data()] = false;
  }
  float* output_of(Slot& s) const { return s.layers > 0 ? s.blocks.back().res3 : s.in; }

  // The stage's blocks (and on the last stage the head) over slot s's input; the loss on the last stage.
  float stage_forward(Slot& s, int B, const int32_t* targets) {
    // At tp > 1: this tp rank's vocabulary, heads, width and MLP share (column-parallel QKV and MLP-up,
    // row-parallel projections, as cpu/backend_cpu.cpp).
    const int T = m_.seq_len, C = m_.n_embd, V = vocab(), NH = m_.n_head / tp_.size(), Cl = C / tp_.size(),
              H = 4 * Cl;
    const int N = B * T, Nr = tp_.rows(N);  // Nr: rows of the residual stream and the LayerNorms
    const float* residual = s.in;
    for (int i = 0; i < s.layers; ++i) {
      const GptBlock p = block(s.first_layer + i, false);
      BlockActs& a = s.blocks[i];
      layernorm_forward(a.ln1, a.ln1_mean, a.ln1_rstd, residual, p.ln1_w, p.ln1_b, Nr, C);
      matmul_forward(&pool_, a.qkv, tp_.column_input(a.ln1, B, T, C), p.qkv_w, p.qkv_b, N, C, 3 * Cl);
      attention_forward(&pool_, a.atty, a.att, a.qkv, B, T, Cl, NH);
      tp_.row_parallel_forward(a.res2, a.atty, p.proj_w, p.proj_b, B, T, Cl, C);
      residual_forward(a.res2, a.res2, residual, static_cast<size_t>(Nr) * C);
      layernorm_forward(a.ln2, a.ln2_mean, a.ln2_rstd, a.res2, p.ln2_w, p.ln2_b, Nr, C);
      matmul_forward(&pool_, a.fch, tp_.column_input(a.ln2, B, T, C), p.fc_w, p.fc_b, N, C, H);
      gelu_forward(a.fch_gelu, a.fch, static_cast<size_t>(N) * H);
      tp_.row_parallel_forward(a.res3, a.fch_gelu, p.fcproj_w, p.fcproj_b, B, T, H, C);
      residual_forward(a.res3, a.res3, a.res2, static_cast<size_t>(Nr) * C);
      residual = a.res3;
    }
    if (!s.head) return 0;
    layernorm_forward(s.lnf, s.lnf_mean, s.lnf_rstd, residual, param("lnf.weight"), param("lnf.bias"), Nr, C);
    // The classifier sees every position (kept for the tied wte's gradient on the first stage).
    if (tp_.sp()) tp_.gather_positions(s.lnf, s.head_in, B, T, C);
    matmul_forward(&pool_, s.probs, s.head_in, wte_copy_.data(), nullptr, N, C, V);
    tp_.crossentropy_forward(s.probs, s.losses, targets, N, V);
    double sum = 0;
    for (int n = 0; n < N; ++n) sum += s.losses[n];
    return static_cast<float>(sum / N);
  }

  // d(output) in dres (the last stage makes it from the loss, keeping the head's tie data) back to
  // d(input) in dres, the blocks' gradients added to the stage's; under ZB-H1 (s.split) the matmuls'
  // weight gradients are left to stage_weights, their output gradients kept for it.
  void stage_backward(Slot& s, const Micro& mb, int micro, float* dres) {
    const int T = m_.seq_len, C = m_.n_embd, V = vocab(), NH = m_.n_head / tp_.size(), Cl = C / tp_.size(),
              H = 4 * Cl;
    const int B = mb.batch, N = B * T, Nr = tp_.rows(N);
    const size_t NC = static_cast<size_t>(N) * C, NCl = static_cast<size_t>(N) * Cl,
                 NH4 = static_cast<size_t>(N) * H, NrC = static_cast<size_t>(Nr) * C;
    auto zero = [](float* v, size_t n) { std::memset(v, 0, n * sizeof(float)); };
    if (s.head) {
      float* tie = tie_[micro].data();  // [lnf (N, C) | dlogits (N, V)]
      std::memcpy(tie, s.head_in, NC * sizeof(float));
      float* dlogits = tie + NC;
      tp_.crossentropy_backward(dlogits, s.probs, mb.targets.data(), mb.grad_scale / static_cast<float>(N), N,
                                V);
      zero(dln_.data(), NC);
      // The input gradient only: the weight gradient is the first stage's (it owns wte).
      matmul_backward(&pool_, dln_.data(), nullptr, nullptr, dlogits, s.head_in, wte_copy_.data(), N, C, V);
      // Vocab-parallel: each tp rank's part of the sum over the vocabulary (under SP, its positions of it).
      const float* dlnf = tp_.column_input_grad(dln_.data(), B, T, C);
      zero(dres, NrC);
      layernorm_backward(dres, tp_.ln_grad(grad("lnf.weight"), 0, C), tp_.ln_grad(grad("lnf.bias"), 1, C),
                         dlnf, output_of(s), param("lnf.weight"), s.lnf_mean, s.lnf_rstd, Nr, C);
      tp_.add_ln_grads({grad("lnf.weight"), grad("lnf.bias")}, C);
    }
    const bool split = s.split;
    auto keep = [&](float* to, const float* from, size_t n) {
      if (split) std::memcpy(to, from, n * sizeof(float));
    };
    for (int i = s.layers - 1; i >= 0; --i) {
      const GptBlock p = block(s.first_layer + i, false), g = block(s.first_layer + i, true);
      // Under ZB-H1 the matmuls take no weight gradient here (null: matmul_backward skips that half).
      const GptBlock gp = split ? GptBlock{g.ln1_w, g.ln1_b, nullptr, nullptr, nullptr, nullptr,
                                           g.ln2_w, g.ln2_b, nullptr, nullptr, nullptr, nullptr}
                                : g;
      BlockActs& a = s.blocks[i];
      const float* residual = i == 0 ? s.in : s.blocks[i - 1].res3;
      // dres holds d(res3); the MLP branch reads it (whole: gathered under SP) before the norm's
      // contribution turns it into d(res2). The column-parallel layers' input gradients are partial sums
      // over the tp shares: all-reduced, or under SP reduce-scattered onto this rank's positions, the
      // LayerNorm inputs re-gathered for the column-parallel weight gradients.
      const float* d_res3 = tp_.whole_grad(dres, B, T, C);
      keep(a.d_fcproj, d_res3, NC);
      zero(dfch_gelu_.data(), NH4);
      matmul_backward(&pool_, dfch_gelu_.data(), gp.fcproj_w, gp.fcproj_b, d_res3, a.fch_gelu, p.fcproj_w, N,
                      H, C);
      gelu_backward(dfch_.data(), a.fch, dfch_gelu_.data(), NH4);
      keep(a.d_fc, dfch_.data(), NH4);
      zero(dln_.data(), NC);
      matmul_backward(&pool_, dln_.data(), gp.fc_w, gp.fc_b, dfch_.data(), tp_.column_input(a.ln2, B, T, C),
                      p.fc_w, N, C, H);
      layernorm_backward(dres, tp_.ln_grad(gp.ln2_w, 2, C), tp_.ln_grad(gp.ln2_b, 3, C),
                         tp_.column_input_grad(dln_.data(), B, T, C), a.res2, p.ln2_w, a.ln2_mean, a.ln2_rstd,
                         Nr, C);
      const float* d_res2 = tp_.whole_grad(dres, B, T, C);
      keep(a.d_proj, d_res2, NC);
      zero(datty_.data(), NCl);
      matmul_backward(&pool_, datty_.data(), gp.proj_w, gp.proj_b, d_res2, a.atty, p.proj_w, N, Cl, C);
      zero(dqkv_.data(), NCl * 3);
      attention_backward(&pool_, dqkv_.data(), datty_.data(), a.qkv, a.att, B, T, Cl, NH);
      keep(a.d_qkv, dqkv_.data(), NCl * 3);
      zero(dln_.data(), NC);
      matmul_backward(&pool_, dln_.data(), gp.qkv_w, gp.qkv_b, dqkv_.data(), tp_.column_input(a.ln1, B, T, C),
                      p.qkv_w, N, C, 3 * Cl);
      layernorm_backward(dres, tp_.ln_grad(gp.ln1_w, 0, C), tp_.ln_grad(gp.ln1_b, 1, C),
                         tp_.column_input_grad(dln_.data(), B, T, C), residual, p.ln1_w, a.ln1_mean,
                         a.ln1_rstd, Nr, C);
      tp_.add_ln_grads({gp.ln1_w, gp.ln1_b, gp.ln2_w, gp.ln2_b}, C);
    }
  }

  // ZB-H1's W pass: the matmuls' weight gradients of slot s from the output gradients stage_backward kept,
  // in the order it would have added them (each tensor's sum over micro-batches keeps one process's order).
  void stage_weights(Slot& s, const Micro& mb) {
    const int T = m_.seq_len, C = m_.n_embd, Cl = C / tp_.size(), H = 4 * Cl, B = mb.batch, N = B * T;
    for (int i = s.layers - 1; i >= 0; --i) {
      const GptBlock p = block(s.first_layer + i, false), gp = block(s.first_layer + i, true);
      BlockActs& a = s.blocks[i];
      matmul_backward(&pool_, nullptr, gp.fcproj_w, gp.fcproj_b, a.d_fcproj, a.fch_gelu, p.fcproj_w, N, H, C);
      matmul_backward(&pool_, nullptr, gp.fc_w, gp.fc_b, a.d_fc, tp_.column_input(a.ln2, B, T, C), p.fc_w, N,
                      C, H);
      matmul_backward(&pool_, nullptr, gp.proj_w, gp.proj_b, a.d_proj, a.atty, p.proj_w, N, Cl, C);
      matmul_backward(&pool_, nullptr, gp.qkv_w, gp.qkv_b, a.d_qkv, tp_.column_input(a.ln1, B, T, C), p.qkv_w,
                      N, C, 3 * Cl);
    }
  }

  void run_step() {
    const int m = static_cast<int>(micros_.size());
    const int T = m_.seq_len, C = m_.n_embd, V = vocab();
    gather_work_params();
    state_->begin_micro_batch();
    sync_wte();
    for (std::vector<int>& v : slot_of_) v.assign(m, -1);
    const size_t NCmax = static_cast<size_t>(max_batch_) * T * C;
    if (last()) {
      tie_.resize(m);
      for (std::vector<float>& v : tie_) v.resize(NCmax + static_cast<size_t>(max_batch_) * T * V);
    }
    if (first()) {
      dres0_.resize(m);
      for (std::vector<float>& v : dres0_) v.resize(NCmax);
    }

    // The program: this rank's actions with its messages between them, in the one global order.
    const auto s0 = Clock::now();
    const double p2p0 = p2p_s_;
    for (const PipelineStep& step : pipeline_program(schedule_, stages_, vp_, stage_, m)) {
      const PipelineAction& a = step.action;
      const Micro& mb = micros_[a.micro];
      const size_t NC = static_cast<size_t>(tp_.rows(mb.batch * T)) * C;  // a stage's output (its positions)
      if (step.kind == PipelineStep::Kind::kRecv) {
        if (!step.grad) {
          exchange({}, acquire(a.chunk, a.micro).in, NC, step.peer);
        } else {
          exchange({}, slot(a.chunk, a.micro).dout, NC, step.peer);
        }
        continue;
      }
      if (step.kind == PipelineStep::Kind::kSend) {
        Slot& s = slot(a.chunk, a.micro);
        exchange({step.grad ? s.dout : output_of(s), NC, step.peer}, nullptr, 0, -1);
        if (step.grad && s.release_after_send) release(s);
        continue;
      }
      const auto t0 = Clock::now();
      if (a.op == PipelineOp::kForward) {
        Slot& s = s_forward(a);
        if (s.embed)
          tp_.encoder_forward(s.in, mb.inputs.data(), param("wte"), param("wpe"), mb.batch, T, C, V);
        const float loss = stage_forward(s, mb.batch, mb.targets.data());
        if (s.head) loss_sum_ += loss, ++loss_count_;
        phases_.forward_s += since(t0);
        continue;
      }
      Slot& s = slot(a.chunk, a.micro);
      if (a.op == PipelineOp::kWeight) {
        stage_weights(s, mb);
        release(s);
        phases_.weight_pass_s = phases_.weight_pass_s.value_or(0) + since(t0);
      } else {
        stage_backward(s, mb, a.micro, s.dout);
        if (s.embed) std::memcpy(dres0_[a.micro].data(), s.dout, NC * sizeof(float));
        // A whole backward frees the slot once its input gradient has gone (at once on virtual stage 0);
        // an input-gradient pass leaves it to the weight pass, which comes after the send.
        s.release_after_send = a.op == PipelineOp::kBackward && !s.embed;
        if (a.op == PipelineOp::kBackward && s.embed) release(s);
      }
      phases_.backward_s += since(t0);
    }
    const double schedule_s = since(s0), waited_s = p2p_s_ - p2p0;
    phases_.bubble = schedule_s > 0 ? waited_s / schedule_s : 0.0;
    phases_.bubble_formula = pipeline_schedule_bubble(schedule_, stages_, vp_, m);
    phases_.message_placement = "units";

    // The tied classifier's weight gradient and the encoder's, on the first stage, micro-batch by
    // micro-batch (one process's order).
    for (int k = 0; k < m; ++k) {
      const Micro& mb = micros_[k];
      const int N = mb.batch * T;
      const size_t count = static_cast<size_t>(N) * C + static_cast<size_t>(N) * V;
      if (last() && !first()) exchange({tie_[k].data(), count, 0}, nullptr, 0, -1);
      if (first()) {
        float* tie = tie_buffer(NCmax + static_cast<size_t>(max_batch_) * T * V);
        if (!last()) exchange({}, tie, count, stages_ - 1);
        const auto t0 = Clock::now();
        matmul_backward(&pool_, nullptr, grad("wte"), nullptr, tie + static_cast<size_t>(N) * C, tie,
                        param("wte"), N, C, V);
        tp_.encoder_backward(grad("wte"), grad("wpe"), dres0_[k].data(), mb.inputs.data(), mb.batch, T, C, V);
        phases_.backward_s += since(t0);
      }
    }
    // Every unit's gradients are complete: the dp reductions, top unit first.
    // (ZeRO 2-3: each unit's whole gradient handed to the dp state, which stages and reduce-scatters it.)
    for (int u = static_cast<int>(state_->plan().units.size()) - 1; u >= 0; --u) {
      if (zero_ >= 2) {
        const FlatRange& r = state_->plan().units[u];
        std::memcpy(state_->grads(u), work_grads_.data() + r.offset, r.count * sizeof(float));
      }
      state_->grads_done(u);
    }
  }
  // The slot a forward runs in: the one its input was received into, or (virtual stage 0) a fresh one.
  Slot& s_forward(const PipelineAction& a) {
    if (slot_of_[a.chunk][a.micro] >= 0) return slot(a.chunk, a.micro);
    return acquire(a.chunk, a.micro);
  }
  float* tie_buffer(size_t n) {
    if (tie_in_.size() < n) tie_in_.resize(n);
    return tie_in_.data();
  }

  ModelConfig m_;
  int max_batch_;
  Communicator* pp_;
  int stage_, stages_;
  std::chrono::milliseconds timeout_;
  PipelineSchedule schedule_ = PipelineSchedule::kOneFOneB;
  int vp_;
  PipelinePartition part_;  // pp x vp virtual stages
  TensorTable table_;
  ThreadPool pool_;
  TpOpsCpu tp_;  // the stage's tp group (tp x pp); no communicator at tp 1
  int zero_ = 0;
  std::vector<float> work_params_, work_grads_;  // ZeRO 3 / ZeRO 2-3: the stage's whole buffers for a step
  bool work_params_fresh_ = false;
  std::vector<float> wte_copy_;  // last stage: the first stage's wte, as of this step
  // Per chunk: its slots, which are in use, and the slot of each micro-batch of this step (-1: none yet).
  std::vector<std::vector<Slot>> slots_;
  std::vector<std::vector<bool>> busy_;
  std::vector<std::vector<int>> slot_of_;
  std::vector<std::vector<float>> tie_;    // last stage, per micro-batch: [lnf (N, C) | dlogits (N, V)]
  std::vector<float> tie_in_;              // first stage: one micro-batch's tie data, received
  std::vector<std::vector<float>> dres0_;  // first stage, per micro-batch: d(encoder output) (N, C)
  std::vector<float> dln_, datty_, dqkv_, dfch_, dfch_gelu_;
  std::vector<Micro> micros_;
  int expected_micros_ = 1;
  double loss_sum_ = 0;
  int loss_count_ = 0;
  double p2p_s_ = 0;         // seconds in point-to-point waits since begin_step
  double stats_comm_s_ = 0;  // the loss and norm's exchange over pp
  StepStats stats_;
  PhaseTimes phases_{.measured = true};
};

}  // namespace

std::unique_ptr<Backend> backend_cpu_pipeline_create(const ModelConfig& m, int max_batch,
                                                     const BackendOptions& options) {
  return std::make_unique<PipelineCpuBackend>(m, max_batch, options);
}

}  // namespace gantry
