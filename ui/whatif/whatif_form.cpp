#include "ui/whatif/whatif_form.h"

#include <string>

namespace gantry::whatif {

namespace {

// Far past any real job, but small enough that products of degrees stay exact in an int64.
constexpr int kMaxGpus = 10000000;

void check_range(std::vector<FormIssue>& out, const char* field, long long v, long long lo, long long hi,
                 const char* what) {
  if (v >= lo && v <= hi) return;
  out.push_back({field, std::string(what) + " = " + std::to_string(v) + ": allowed " + std::to_string(lo) +
                            ".." + std::to_string(hi)});
}

// The planner's messages begin with the field they concern ("tp = 3: must divide heads (12) ...",
// "model.heads = 5: ...", "gpus = 12: must be a multiple of ..."): that word names the form field too.
std::string field_of(const std::string& message) {
  const size_t eq = message.find(" = ");
  if (eq == std::string::npos || eq == 0 || message.find(' ') < eq) return "layout";
  const std::string f = message.substr(0, eq);
  if (f == "micro-batches per step") return "global_batch";
  return f;
}

}  // namespace

Result<PlanModel> whatif_form_model(const WhatIfForm& f) {
  if (!f.custom_model) {
    Result<PlanModel> m = plan_model_preset(f.preset);
    if (!m.ok()) return Status::error("model: " + m.error());
    return m;
  }
  if (Status s = plan_model_validate(f.model); !s.ok()) return s;
  return f.model;
}

std::vector<FormIssue> whatif_form_check(const WhatIfForm& f) {
  std::vector<FormIssue> out;
  Result<PlanModel> model = whatif_form_model(f);
  if (!model.ok()) out.push_back({f.custom_model ? field_of(model.error()) : "model", model.error()});
  if (Result<GpuSpec> g = plan_gpu_preset(f.gpu); !g.ok()) out.push_back({"gpu", g.error()});
  check_range(out, "gpus", f.gpus, 1, kMaxGpus, "gpus");
  check_range(out, "gpus_per_node", f.gpus_per_node, 1, 1024, "gpus_per_node");
  check_range(out, "global_batch", f.global_batch, 0, 1000000000, "global_batch (0 = about 1M tokens)");
  const PlanLayout& l = f.layout;
  check_range(out, "tp", l.tp, 1, kMaxGpus, "tp");
  check_range(out, "pp", l.pp, 1, kMaxGpus, "pp");
  check_range(out, "vp", l.vp, 1, 1024, "vp");
  check_range(out, "cp", l.cp, 1, kMaxGpus, "cp");
  check_range(out, "dp", l.dp, 0, kMaxGpus, "dp (0 = what the GPUs leave)");
  check_range(out, "zero", l.zero, 0, 3, "zero");
  check_range(out, "hsdp", l.hsdp, 0, kMaxGpus, "hsdp (0 = all of dp)");
  check_range(out, "micro_batch", l.micro_batch, 1, 1000000, "micro_batch");
  check_range(out, "top", f.top, 1, 1000, "top");
  if (!out.empty()) return out;

  // Each degree is in range: now the combination, in the operator's terms first where the planner's
  // words would be indirect, then whatever else the planner refuses.
  const long long model_parallel = static_cast<long long>(l.tp) * l.cp * l.pp;
  if (f.gpus % model_parallel != 0) {
    out.push_back({"gpus", std::to_string(f.gpus) + " GPUs is not a multiple of tp × cp × pp = " +
                               std::to_string(l.tp) + " × " + std::to_string(l.cp) + " × " +
                               std::to_string(l.pp) + " = " + std::to_string(model_parallel)});
  } else if (l.dp != 0 && l.dp * model_parallel != f.gpus) {
    out.push_back({"dp", "dp = " + std::to_string(l.dp) + ": tp × cp × pp × dp must equal the " +
                             std::to_string(f.gpus) + " GPUs, so dp = " +
                             std::to_string(f.gpus / model_parallel) + " (or 0 to derive it)"});
  }
  if (l.tp > f.gpus_per_node) {
    out.push_back({"tp", "tp = " + std::to_string(l.tp) + " spans nodes of " +
                             std::to_string(f.gpus_per_node) +
                             " GPUs: tensor parallelism needs NVLink, keep tp <= gpus_per_node"});
  }
  if (!out.empty()) return out;
  Result<PlanInput> in = whatif_form_input(f);
  if (!in.ok()) {
    out.push_back({field_of(in.error()), in.error()});
    return out;
  }
  if (Result<Plan> p = plan_evaluate(in.value()); !p.ok()) out.push_back({field_of(p.error()), p.error()});
  return out;
}

Result<PlanInput> whatif_form_input(const WhatIfForm& f) {
  Result<PlanModel> model = whatif_form_model(f);
  if (!model.ok()) return model.status();
  Result<GpuSpec> gpu = plan_gpu_preset(f.gpu);
  if (!gpu.ok()) return gpu.status();
  if (f.gpus < 1 || f.gpus > kMaxGpus)
    return Status::error("gpus = " + std::to_string(f.gpus) + ": allowed 1..10000000");
  if (f.gpus_per_node < 1)
    return Status::error("gpus_per_node = " + std::to_string(f.gpus_per_node) + ": allowed >= 1");
  const double efficiency = plan_engine_compute_efficiency(f.engine, f.gpu);
  if (efficiency > 0) gpu.value().compute_efficiency = efficiency;
  PlanInput in;
  in.model = model.value();
  in.cluster = plan_cluster_default(gpu.value(), f.gpus, f.gpus_per_node);
  in.layout = f.layout;
  in.training.global_batch = f.global_batch;
  in.engine = f.engine;
  return in;
}

}  // namespace gantry::whatif
