#include "engine/core/parallel/pipeline_schedule.h"

#include <algorithm>
#include <cstring>
#include <limits>

#include "engine/core/gpt.h"
#include "telemetry/pipeline_bubble.h"

namespace gantry {

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
