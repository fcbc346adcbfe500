// The what-if panel's link to a live run: reading the run as GET /v1/runs/{id} returns it (its model,
// batch and layout) into the form, deciding whether a planned layout is one the run can resume on, and
// the layout "Apply" hands to the console for POST /v1/runs/{id}/resume-from.
//
// What resume-from accepts (engine/cluster/coordinator_runs.cpp): {"checkpoint": "latest" | STEP | "step_N",
// "layout": {"dp", "zero", "tp", "pp", "vp"}} — any layout the workers run, the checkpoint resharded onto it
// (tp, pp and dp, ZeRO); the config (micro-batch, global batch, model, backend, pipeline schedule) stays
// the run's. A layout is applicable exactly when the engine runs it under that config.
//
//   Result<WhatIfRun> run = whatif_run_parse(run_json);   // the object GET /v1/runs/{id} returns
//   whatif_form_from_run(form, run.value());               // model, batch, dp and ZeRO into the form
//   std::string why = whatif_apply_blocker(plan, &run.value(), form.global_batch);  // "" = applicable
//   WhatIfApply a = whatif_apply_of(plan, run.value());
//   api.resume_from(a.run_id, a.body());                    // engine/cluster/api_client.h
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>  // nlohmann::json: the API's JSON, in and out
#include <string>
#include <string_view>

#include "engine/plan/planner.h"
#include "telemetry/status.h"
#include "ui/whatif/whatif_form.h"

namespace gantry::whatif {

// The run the form was loaded from.
struct WhatIfRun {
  int64_t id = -1;
  std::string name;
  std::string state;    // "running", "stopped", ... as the API said when loaded ("" when not given)
  std::string backend;  // train.backend: "cpu" or "cuda"
  std::string pp_schedule = "1f1b";  // train.pp_schedule: "gpipe", "1f1b", "interleaved" or "zbh1"
  PlanModel model;                   // the config's model, as the planner sees a Gantry GPT-2
  int global_batch = 0;              // train.global_batch
  int micro_batch = 0;               // train.micro_batch
  int dp = 1, tp = 1, pp = 1, vp = 1, zero = 0;  // the layout it runs on
};

// From the object GET /v1/runs/{id} returns: its id, name, state, backend and pipeline schedule (absent:
// "1f1b", the engine's default), the model's dimensions
// ("model": n_layer, n_head, n_embd, vocab_size, seq_len) and batch ("batch": global_batch, micro_batch)
// as the coordinator parsed them from the run's config, and its layout, either as the API's object
// ({"dp":4,"tp":1,"pp":1,"vp":1,"zero":1}) or as the history's text ("dp=4 tp=1 pp=1 vp=1 zero=1"). Layout
// keys other than dp, tp, pp, vp, zero are ignored, so a coordinator that reports more still loads. Errors
// name what did not parse. (The console never reads the config TOML itself: that parser is the engine's.)
Result<WhatIfRun> whatif_run_parse(const nlohmann::json& run);

// Puts the run into the form: its model as custom dimensions named after the run, its global batch and
// micro-batch, its layout (tp, pp, vp, dp, ZeRO), GPUs = tp × pp × dp, and the rest of the layout as the
// engine runs it (no recomputation, no context parallelism). GPU kind and engine profile stay.
void whatif_form_from_run(WhatIfForm& f, const WhatIfRun& run);

// Why `plan` cannot be applied to `run` (one sentence), or "" when it can: it must be for the run's model
// and global batch, fit, and differ from the run only in what resume-from changes. `form_global_batch` is the
// global batch the plan was made for (0 = the planner's default, which is not the run's).
std::string whatif_apply_blocker(const Plan& plan, const WhatIfRun* run, int form_global_batch);

// What "Apply" reports: resume run `run_id` from `checkpoint` on this layout. Exactly the fields
// resume-from's "layout" takes.
struct WhatIfApply {
  int64_t run_id = -1;
  int dp = 1;
  int zero = 0;
  int tp = 1;
  int pp = 1;
  int vp = 1;
  std::string checkpoint = "latest";

  // {"dp": .., "pp": .., "tp": .., "vp": .., "zero": ..}: resume-from's "layout".
  nlohmann::json layout() const;
  // {"checkpoint": "latest", "layout": {...}}: the whole request body.
  nlohmann::json body() const;
  // "dp=4 tp=1 pp=1 zero=1" ("... pp=2 vp=2 zero=1" with virtual stages): for a confirmation line
  std::string text() const;
};

// The Apply of an applicable plan (whatif_apply_blocker returned "").
WhatIfApply whatif_apply_of(const Plan& plan, const WhatIfRun& run);

}  // namespace gantry::whatif
