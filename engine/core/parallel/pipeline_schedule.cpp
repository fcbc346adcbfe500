#include "engine/core/parallel/pipeline_schedule.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <limits>

#include "engine/core/gpt.h"

namespace gantry {

const char* pipeline_schedule_name(PipelineSchedule s) {
  switch (s) {
    case PipelineSchedule::kGpipe:
      return "gpipe";
    case PipelineSchedule::kOneFOneB:
      return "1f1b";
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

PipelinePartition pipeline_partition(const ModelConfig& m, int pp) {
  const int L = m.n_layer;
  const double block = pipeline_block_cost(m), vc = 2.0 * m.vocab_size * m.n_embd;
  // Stage-specific extras: the classifier's weight gradient on the first stage, its forward and input
  // gradient on the last (one stage alone carries both).
  auto extra = [&](int stage) {
    double e = 0;
    if (stage == 0) e += vc;
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

void pipeline_slice(const TensorTable& whole, const float* all, const TensorTable& stage, float* out) {
  for (const TensorInfo& t : stage.tensors()) {
    const TensorInfo& w = whole.at(t.name);
    std::memcpy(out + t.offset, all + w.offset, t.numel * sizeof(float));
  }
}

std::vector<PipelineAction> pipeline_actions(PipelineSchedule s, int pp, int stage, int m) {
  std::vector<PipelineAction> a;
  if (s == PipelineSchedule::kGpipe) {
    for (int i = 0; i < m; ++i) a.push_back({PipelineOp::kForward, i});
    for (int i = 0; i < m; ++i) a.push_back({PipelineOp::kBackward, i});
    return a;
  }
  // 1F1B: the stage runs ahead by the forwards its successors need to fill the pipe, then alternates.
  const int warmup = std::min(pp - stage - 1, m);
  int f = 0, b = 0;
  for (; f < warmup; ++f) a.push_back({PipelineOp::kForward, f});
  while (f < m) {
    a.push_back({PipelineOp::kForward, f++});
    a.push_back({PipelineOp::kBackward, b++});
  }
  while (b < m) a.push_back({PipelineOp::kBackward, b++});
  return a;
}

int pipeline_in_flight(const std::vector<PipelineAction>& actions) {
  int now = 0, most = 0;
  for (const PipelineAction& x : actions) {
    now += x.op == PipelineOp::kForward ? 1 : -1;
    most = std::max(most, now);
  }
  return most;
}

double pipeline_bubble_formula(int pp, int vp, int m) {
  return static_cast<double>(pp - 1) / (static_cast<double>(vp) * m + pp - 1);
}

Status pipeline_check(const Config& c, const ParallelDims& d, int micro_batches, int vp) {
  auto bad = [](const std::string& what) { return Status::error("parallel layout: " + what); };
  const std::string pp = "pp " + std::to_string(d.pp);
  if (vp != 1) {
    return bad("vp " + std::to_string(vp) +
               ": interleaved 1F1B (virtual stages) is not implemented; use vp 1 with train.pp_schedule = "
               "\"gpipe\" or \"1f1b\"");
  }
  if (d.pp == 1) return {};
  if (static_cast<long long>(d.pp) * vp > c.model.n_layer) {
    return bad(
        pp + " x vp " + std::to_string(vp) + " = " + std::to_string(d.pp * vp) +
        " stages but model.n_layer is " + std::to_string(c.model.n_layer) +
        ": every stage needs at least one layer; choose pp x vp <= " + std::to_string(c.model.n_layer));
  }
  if (c.train.backend != "cpu") {
    return bad(pp + " with train.backend = \"" + c.train.backend +
               "\": pipeline parallel is CPU-only for now; use pp 1 on this backend, or train.backend = "
               "\"cpu\"");
  }
  if (d.zero > 1) {
    return bad(pp + " with zero " + std::to_string(d.zero) +
               ": a pipeline stage keeps its whole gradient buffer for the step; use zero 0 or 1");
  }
  PipelineSchedule s{};
  if (!pipeline_schedule_from_name(c.train.pp_schedule, &s)) {
    return bad("train.pp_schedule = \"" + c.train.pp_schedule + "\": use \"gpipe\" or \"1f1b\"");
  }
  if (s == PipelineSchedule::kOneFOneB && micro_batches < d.pp) {
    return bad(pp + " with train.pp_schedule = \"1f1b\" needs at least " + std::to_string(d.pp) +
               " micro-batches per step to fill the pipe, but global_batch " +
               std::to_string(c.train.global_batch) + " / (dp " + std::to_string(d.dp) + " x micro_batch " +
               std::to_string(c.train.micro_batch) + ") gives " + std::to_string(micro_batches) +
               ": lower train.micro_batch or raise train.global_batch");
  }
  if (c.train.checkpoint_every > 0) {
    return bad(pp +
               ": checkpoints of a pipeline are not implemented yet (they would not reshard); set "
               "train.checkpoint_every = 0, or use pp 1");
  }
  if (c.train.memory_copy_every > 0) {
    return bad(pp +
               ": in-memory copies of a pipeline are not implemented yet (a restore would not "
               "reshard them); set train.memory_copy_every = 0, or use pp 1");
  }
  return {};
}

}  // namespace gantry
