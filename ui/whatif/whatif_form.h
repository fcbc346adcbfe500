// The what-if panel's form: everything the planner of engine/plan takes that an operator sets by hand
// (model preset or custom dimensions, GPU kind and count, global batch, the layout), its validation
// into messages that name the form's field, and the planner input it becomes. Pure C++, no ImGui.
//
//   WhatIfForm f;                        // gpt2-124m on 8 × h100, tp = pp = 1, micro-batch 1
//   f.gpus = 12; f.layout.tp = 8;
//   for (const FormIssue& i : whatif_form_check(f)) show(i.field, i.message);
//   //   "gpus": "12 GPUs is not a multiple of tp × cp × pp = 8 × 1 × 1 = 8"
//   Result<PlanInput> in = whatif_form_input(f);  // ok exactly when whatif_form_check found nothing
#pragma once

#include <string>
#include <vector>

#include "engine/plan/planner.h"
#include "engine/plan/search.h"
#include "telemetry/status.h"

namespace gantry::whatif {

struct WhatIfForm {
  // The model: one of plan_model_preset_names(), or the dimensions in `model` when custom_model is set
  // (a loaded run's model arrives as custom dimensions: Gantry's configs are GPT-2 shaped).
  bool custom_model = false;
  std::string preset = "gpt2-124m";
  PlanModel model;
  // The cluster: a GPU kind of plan_gpu_preset_names() and how many of them, gpus_per_node to a node.
  std::string gpu = "h100";
  int gpus = 8;
  int gpus_per_node = 8;
  // Sequences per optimizer step; 0 = the planner's default, about 2^20 tokens' worth.
  int global_batch = 0;
  // tp, pp, vp, dp (0 = what the GPUs leave), cp, zero, hsdp, sequence parallel, recompute, flash
  // attention, schedule, micro-batch: as engine/plan/layout.h defines them.
  PlanLayout layout;
  // Which stack's memory model (engine_profile.h); Gantry's own profiles: dp, tp and pp layouts.
  EngineKind engine = EngineKind::kGeneric;
  // How the ranked list is ordered, and how many searched layouts it keeps.
  SearchRank rank = SearchRank::kTokensPerSecond;
  int top = 8;
};

// One problem with the form: `field` is the form's name for the input ("gpus", "tp", "model.heads",
// "global_batch", ...), `message` a sentence saying what is wrong and what is allowed.
struct FormIssue {
  std::string field;
  std::string message;
};

// Every problem found, not only the first: range checks of each field, the model's dimensions, and then
// (when those pass) whatever the planner refuses about the combination, under the field it names.
std::vector<FormIssue> whatif_form_check(const WhatIfForm& f);

// The planner input of a valid form (its first issue as the error otherwise). With a GPU preset the
// engine has measured itself on (plan_engine_compute_efficiency), that efficiency is used, as
// `gantry-engine plan` does.
Result<PlanInput> whatif_form_input(const WhatIfForm& f);

// The model the form describes (its preset, or the custom dimensions).
Result<PlanModel> whatif_form_model(const WhatIfForm& f);

}  // namespace gantry::whatif
