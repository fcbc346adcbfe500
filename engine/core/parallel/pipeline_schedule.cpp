#include "engine/core/parallel/pipeline_schedule.h"

#include <algorithm>
#include <cstring>
#include <limits>

#include "engine/core/fatal.h"
#include "engine/core/gpt.h"
#include "telemetry/pipeline_bubble.h"

namespace gantry {

const char* pipeline_schedule_name(PipelineSchedule s) {
  switch (s) {
    case PipelineSchedule::kGpipe:
      return "gpipe";
    case PipelineSchedule::kOneFOneB:
      return "1f1b";
    case PipelineSchedule::kInterleaved:
      return "interleaved";
    case PipelineSchedule::kZeroBubbleH1:
      return "zbh1";
  }
  return "?";
}

bool pipeline_schedule_from_name(const std::string& name, PipelineSchedule* out) {
  if (name == "gpipe") {
    *out = PipelineSchedule::kGpipe;
    return true;
  }
  if (name == "1f1b") {
    *out = PipelineSchedule::kOneFOneB;
    return true;
  }
  if (name == "interleaved") {
    *out = PipelineSchedule::kInterleaved;
    return true;
  }
  if (name == "zbh1") {
    *out = PipelineSchedule::kZeroBubbleH1;
    return true;
  }
  return false;
}

std::string PipelinePartition::describe() const {
  std::string s;
  for (size_t i = 0; i < layers.size(); ++i) {
    char buf[120];
    std::snprintf(buf, sizeof buf, "%sstage %zu: layers %d-%d (%.3g MFLOP/token)", i ? ", " : "", i,
                  first_layer[i], first_layer[i] + layers[i] - 1, cost[i] / 1e6);
    s += buf;
  }
  return s;
}

double pipeline_block_cost(const ModelConfig& m) {
  const double C = m.n_embd, T = m.seq_len;
  return 3.0 * (24.0 * C * C + 4.0 * T * C);
}

PipelinePartition pipeline_partition(const ModelConfig& m, int pp, ClassifierGradStage grad) {
  const int L = m.n_layer;
  const double block = pipeline_block_cost(m), vc = 2.0 * m.vocab_size * m.n_embd;
  // Stage-specific extras: the classifier's weight gradient where `grad` says, its forward and input
  // gradient on the last (one stage alone carries all three).
  const int grad_stage = grad == ClassifierGradStage::kFirst ? 0 : pp - 1;
  auto extra = [&](int stage) {
    double e = 0;
    if (stage == grad_stage) e += vc;
    if (stage == pp - 1) e += 2 * vc;
    return e;
  };
  // best[s][l]: the smallest possible costliest stage when stages 0..s-1 hold layers 0..l-1.
  const double inf = std::numeric_limits<double>::infinity();
  std::vector<std::vector<double>> best(pp + 1, std::vector<double>(L + 1, inf));
  std::vector<std::vector<int>> cut(pp + 1, std::vector<int>(L + 1, -1));
  best[0][0] = 0;
  for (int s = 1; s <= pp; ++s) {
    for (int l = s; l <= L; ++l) {
      for (int k = s - 1; k < l; ++k) {  // stage s-1 holds layers k..l-1
        if (best[s - 1][k] == inf) continue;
        const double c = std::max(best[s - 1][k], (l - k) * block + extra(s - 1));
        if (c < best[s][l]) best[s][l] = c, cut[s][l] = k;
      }
    }
  }
  PipelinePartition p;
  p.first_layer.assign(pp, 0);
  p.layers.assign(pp, 0);
  p.cost.assign(pp, 0);
  for (int s = pp, l = L; s >= 1; --s) {
    const int k = cut[s][l];
    p.first_layer[s - 1] = k;
    p.layers[s - 1] = l - k;
    p.cost[s - 1] = (l - k) * block + extra(s - 1);
    l = k;
  }
  return p;
}

TensorTable pipeline_stage_table(const ModelConfig& m, const PipelinePartition& p, int stage) {
  const int pp = static_cast<int>(p.layers.size());
  const int l0 = p.first_layer[stage], l1 = l0 + p.layers[stage];
  const TensorTable whole = gpt_param_table(m);
  TensorTable t;
  for (const TensorInfo& x : whole.tensors()) {
    const bool keep = x.layer >= 0 ? x.layer >= l0 && x.layer < l1
                                   : (x.name == "wte" || x.name == "wpe" ? stage == 0 : stage == pp - 1);
    if (keep) t.add(x.name, x.shape, x.decay, x.layer);
  }
  return t;
}

TensorTable pipeline_rank_table(const ModelConfig& m, const PipelinePartition& v, int pp, int rank) {
  const int stages = static_cast<int>(v.layers.size());
  auto mine = [&](int layer) {
    for (int s = rank; s < stages; s += pp)
      if (layer >= v.first_layer[s] && layer < v.first_layer[s] + v.layers[s]) return true;
    return false;
  };
  const TensorTable whole = gpt_param_table(m);
  TensorTable t;
  for (const TensorInfo& x : whole.tensors()) {
    const bool keep =
        x.layer >= 0 ? mine(x.layer) : (x.name == "wte" || x.name == "wpe" ? rank == 0 : rank == pp - 1);
    if (keep) t.add(x.name, x.shape, x.decay, x.layer);
  }
  return t;
}

std::vector<int> pipeline_chunk_bucket_starts(const PipelinePartition& v, int pp, int rank) {
  std::vector<int> starts;
  int unit = rank == 0 ? 1 : 0;  // the embeddings' unit comes first on rank 0
  for (int s = rank; s + pp < static_cast<int>(v.layers.size()); s += pp) {
    unit += v.layers[static_cast<size_t>(s)];
    starts.push_back(unit);
  }
  return starts;
}

void pipeline_slice(const TensorTable& whole, const float* all, const TensorTable& stage, float* out) {
  for (const TensorInfo& t : stage.tensors()) {
    const TensorInfo& w = whole.at(t.name);
    std::memcpy(out + t.offset, all + w.offset, t.numel * sizeof(float));
  }
}

std::vector<PipelineAction> pipeline_actions(PipelineSchedule s, int pp, int stage, int m, int vp) {
  std::vector<PipelineAction> a;
  auto add = [&](PipelineOp op, int micro, int chunk = 0) { a.push_back({op, micro, chunk}); };
  if (s == PipelineSchedule::kGpipe) {
    for (int i = 0; i < m; ++i) add(PipelineOp::kForward, i);
    for (int i = 0; i < m; ++i) add(PipelineOp::kBackward, i);
    return a;
  }
  if (s == PipelineSchedule::kInterleaved) {
    // Megatron's interleaved 1F1B: the k-th forward of a rank is chunk (k / pp) mod vp of micro-batch
    // (k / (pp·vp))·pp + k mod pp, so pp micro-batches pass through one chunk before the next chunk starts
    // (m a multiple of pp, pipeline_check); the k-th backward walks the chunks from the last. The warm-up
    // fills the pipe of pp·vp virtual stages: 2(pp − stage − 1) + (vp − 1)·pp forwards.
    const int total = m * vp;
    auto micro_of = [&](int k) { return (k / (pp * vp)) * pp + k % pp; };
    auto fwd = [&](int k) { add(PipelineOp::kForward, micro_of(k), (k / pp) % vp); };
    auto bwd = [&](int k) { add(PipelineOp::kBackward, micro_of(k), vp - 1 - (k / pp) % vp); };
    const int warmup = std::min(2 * (pp - stage - 1) + (vp - 1) * pp, total);
    int f = 0, b = 0;
    for (; f < warmup; ++f) fwd(f);
    while (f < total) {
      fwd(f++);
      bwd(b++);
    }
    while (b < total) bwd(b++);
    return a;
  }
  // 1F1B: the stage runs ahead by the forwards its successors need to fill the pipe, then alternates.
  const int warmup = std::min(pp - stage - 1, m);
  int f = 0, b = 0, w = 0;
  for (; f < warmup; ++f) add(PipelineOp::kForward, f);
  if (s == PipelineSchedule::kZeroBubbleH1) {
    // ZB-H1: the same warm-up; then F, B (input gradient) and W (weight gradient), stage i deferring its
    // first i W's, which keeps at most pp activations on every stage (1F1B's peak, on stage 0); the
    // cool-down's waits for the next B are filled with the deferred W's.
    for (int k = 0; f < m; ++k) {
      add(PipelineOp::kForward, f++);
      add(PipelineOp::kInput, b++);
      if (k >= stage) add(PipelineOp::kWeight, w++);
    }
    while (b < m) {
      add(PipelineOp::kInput, b++);
      add(PipelineOp::kWeight, w++);
    }
    while (w < m) add(PipelineOp::kWeight, w++);
    return a;
  }
  while (f < m) {
    add(PipelineOp::kForward, f++);
    add(PipelineOp::kBackward, b++);
  }
  while (b < m) add(PipelineOp::kBackward, b++);
  return a;
}

int pipeline_in_flight(const std::vector<PipelineAction>& actions) {
  int now = 0, most = 0;
  for (const PipelineAction& x : actions) {
    if (x.op == PipelineOp::kForward) ++now;
    if (x.op == PipelineOp::kBackward || x.op == PipelineOp::kWeight) --now;
    most = std::max(most, now);
  }
  return most;
}

namespace {

// The whole pipeline's step under unit costs: every rank's actions with their start times, and the
// messages with the time they can be taken (their producer's finish). Each round starts the action that
// can start earliest over all ranks (ties: the lower rank), so the result is the same on every rank.
struct Simulation {
  std::vector<std::vector<PipelineAction>> actions;  // [rank]
  std::vector<std::vector<double>> start;            // [rank][action]
  struct Message {
    double time;
    int seq;  // order of production: ties in time keep it
    int from, to;
    bool grad;
    int micro, from_chunk, to_chunk;
  };
  std::vector<Message> messages;
  double makespan = 0;
  std::vector<double> busy;
};

double unit_cost(PipelineOp op) {
  return op == PipelineOp::kBackward ? 2.0 : 1.0;
}

Simulation simulate(PipelineSchedule s, int pp, int vp, int m) {
  Simulation sim;
  const int stages = pp * vp;
  sim.actions.resize(pp);
  sim.start.resize(pp);
  sim.busy.assign(pp, 0.0);
  for (int r = 0; r < pp; ++r) sim.actions[r] = pipeline_actions(s, pp, r, m, vp);
  // done_f[stage][micro], done_b[stage][micro]: when the activation / input gradient left that stage.
  const double never = -1;
  std::vector<std::vector<double>> done_f(stages, std::vector<double>(m, never)), done_b = done_f;
  std::vector<size_t> next(pp, 0);
  std::vector<double> clock(pp, 0.0);
  for (;;) {
    int pick = -1;
    double pick_start = 0;
    bool left = false;
    for (int r = 0; r < pp; ++r) {
      if (next[r] >= sim.actions[r].size()) continue;
      left = true;
      const PipelineAction& a = sim.actions[r][next[r]];
      const int v = a.chunk * pp + r;
      double ready = clock[r];
      if (a.op == PipelineOp::kForward && v > 0) {
        if (done_f[v - 1][a.micro] == never) continue;
        ready = std::max(ready, done_f[v - 1][a.micro]);
      }
      if ((a.op == PipelineOp::kBackward || a.op == PipelineOp::kInput) && v < stages - 1) {
        if (done_b[v + 1][a.micro] == never) continue;
        ready = std::max(ready, done_b[v + 1][a.micro]);
      }
      if (pick < 0 || ready < pick_start) pick = r, pick_start = ready;
    }
    if (!left) break;
    // No rank can go on: the schedule's own orders are inconsistent (a bug here, never the input's).
    GANTRY_CHECK(pick >= 0, std::string("pipeline schedule ") + pipeline_schedule_name(s) + " (pp " +
                                std::to_string(pp) + ", vp " + std::to_string(vp) + ", m " +
                                std::to_string(m) + ") deadlocks");
    const PipelineAction& a = sim.actions[pick][next[pick]];
    const int v = a.chunk * pp + pick;
    const double end = pick_start + unit_cost(a.op);
    sim.start[pick].push_back(pick_start);
    sim.busy[pick] += unit_cost(a.op);
    clock[pick] = end;
    ++next[pick];
    const int seq = static_cast<int>(sim.messages.size());
    if (a.op == PipelineOp::kForward) {
      done_f[v][a.micro] = end;
      if (v < stages - 1)
        sim.messages.push_back({end, seq, pick, (v + 1) % pp, false, a.micro, a.chunk, (v + 1) / pp});
    } else if (a.op != PipelineOp::kWeight) {
      done_b[v][a.micro] = end;
      if (v > 0) sim.messages.push_back({end, seq, pick, (v - 1) % pp, true, a.micro, a.chunk, (v - 1) / pp});
    }
    sim.makespan = std::max(sim.makespan, end);
  }
  std::stable_sort(sim.messages.begin(), sim.messages.end(), [](const auto& x, const auto& y) {
    return x.time < y.time || (x.time == y.time && x.seq < y.seq);
  });
  return sim;
}

}  // namespace

std::vector<PipelineStep> pipeline_program(PipelineSchedule s, int pp, int vp, int stage, int m) {
  const Simulation sim = simulate(s, pp, vp, m);
  const std::vector<PipelineAction>& acts = sim.actions[stage];
  std::vector<PipelineStep> out;
  size_t k = 0;
  // Before each action, this rank's messages that can be taken by its start (its inputs among them: they
  // were produced before it started); the rest after the last action.
  auto flush = [&](double until, bool all) {
    for (; k < sim.messages.size(); ++k) {
      const Simulation::Message& x = sim.messages[k];
      if (!all && x.time > until) break;
      if (x.from == stage)
        out.push_back(
            {PipelineStep::Kind::kSend, {PipelineOp::kForward, x.micro, x.from_chunk}, x.grad, x.to});
      else if (x.to == stage)
        out.push_back(
            {PipelineStep::Kind::kRecv, {PipelineOp::kForward, x.micro, x.to_chunk}, x.grad, x.from});
    }
  };
  for (size_t i = 0; i < acts.size(); ++i) {
    flush(sim.start[stage][i], false);
    out.push_back({PipelineStep::Kind::kCompute, acts[i], false, -1});
  }
  flush(0, true);
  return out;
}

double pipeline_simulated_bubble(PipelineSchedule s, int pp, int vp, int m) {
  const Simulation sim = simulate(s, pp, vp, m);
  double idle = 0;
  for (double b : sim.busy) idle = std::max(idle, sim.makespan - b);
  return sim.makespan > 0 ? idle / sim.makespan : 0.0;
}

double pipeline_bubble_formula(int pp, int vp, int m) {
  return pipeline_bubble_fraction(pp, vp, m);
}

double pipeline_schedule_bubble(PipelineSchedule s, int pp, int vp, int m) {
  switch (s) {
    case PipelineSchedule::kGpipe:
    case PipelineSchedule::kOneFOneB:
      return pipeline_bubble_formula(pp, 1, m);
    case PipelineSchedule::kInterleaved:
      return pipeline_bubble_formula(pp, vp, m);
    case PipelineSchedule::kZeroBubbleH1:
      return pipeline_bubble_formula(pp, kZeroBubbleH1BubbleDivisor, m);  // (p − 1) / (3m + p − 1)
  }
  return pipeline_bubble_formula(pp, vp, m);
}

Status pipeline_check(const Config& c, const ParallelDims& d, int micro_batches, int vp) {
  auto bad = [](const std::string& what) { return Status::error("parallel layout: " + what); };
  const std::string pp = "pp " + std::to_string(d.pp);
  if (vp < 1) return bad("vp " + std::to_string(vp) + ": virtual stages per rank must be at least 1");
  if (vp > 1 && d.pp == 1) {
    return bad("vp " + std::to_string(vp) +
               " with pp 1: virtual stages interleave a pipeline; use vp 1, or pp > 1");
  }
  if (d.pp == 1) return {};
  if (static_cast<long long>(d.pp) * vp > c.model.n_layer) {
    return bad(
        pp + " x vp " + std::to_string(vp) + " = " + std::to_string(d.pp * vp) +
        " stages but model.n_layer is " + std::to_string(c.model.n_layer) +
        ": every stage needs at least one layer; choose pp x vp <= " + std::to_string(c.model.n_layer));
  }
  if (c.train.backend != "cpu" && c.train.backend != "cuda") {
    return bad(pp + " with train.backend = \"" + c.train.backend +
               "\": pipeline parallel runs on the \"cpu\" and \"cuda\" backends; use one of them, or pp 1");
  }
  PipelineSchedule s{};
  if (!pipeline_schedule_from_name(c.train.pp_schedule, &s)) {
    return bad("train.pp_schedule = \"" + c.train.pp_schedule +
               "\": use \"gpipe\", \"1f1b\", \"interleaved\" or \"zbh1\"");
  }
  // The GPU stage (cuda/backend_cuda.cu) runs every schedule at ZeRO 0-3: at ZeRO 2-3 it reduces each
  // micro-batch's buckets as the pass that completes them runs (a whole backward of one chunk, ZB-H1's
  // weight pass); the CPU stage reduces after its schedule.
  const std::string mb = std::to_string(micro_batches),
                    given = "global_batch " + std::to_string(c.train.global_batch) + " / (dp " +
                            std::to_string(d.dp) + " x micro_batch " + std::to_string(c.train.micro_batch) +
                            ") gives " + mb;
  if ((s == PipelineSchedule::kInterleaved) != (vp > 1)) {
    return bad(
        pp + " with vp " + std::to_string(vp) + " and train.pp_schedule = \"" + c.train.pp_schedule +
        "\": virtual stages run only under the interleaved schedule, and it needs them; use vp > 1 with "
        "\"interleaved\", or vp 1 with \"gpipe\", \"1f1b\" or \"zbh1\"");
  }
  if (s == PipelineSchedule::kInterleaved && micro_batches % d.pp != 0) {
    return bad(pp +
               " with train.pp_schedule = \"interleaved\" needs micro-batches per step a multiple of pp (" +
               std::to_string(d.pp) + "), but " + given + ": change train.micro_batch or train.global_batch");
  }
  if ((s == PipelineSchedule::kOneFOneB || s == PipelineSchedule::kZeroBubbleH1) && micro_batches < d.pp) {
    return bad(pp + " with train.pp_schedule = \"" + c.train.pp_schedule + "\" needs at least " +
               std::to_string(d.pp) + " micro-batches per step to fill the pipe, but " + given +
               ": lower train.micro_batch or raise train.global_batch");
  }
  if (c.train.memory_copy_every > 0) {
    return bad(pp + " with train.memory_copy_every = " + std::to_string(c.train.memory_copy_every) +
               ": in-memory copies of a pipeline's stages are refused (the agents' restore assembles a "
               "data-parallel set and would not reshard them); set train.memory_copy_every = 0, or use pp 1");
  }
  return {};
}

}  // namespace gantry
