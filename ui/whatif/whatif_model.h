// The what-if panel's view model: the form, the planner run over it, and what the panel shows — the
// candidate layouts ranked (the form's own layout, the best the layout search finds, and, with a run
// loaded, the layouts the engine can resume that run on), each with step time, tokens/s, MFU and whether
// it fits and why not; and for the selected one, memory by bucket against HBM, communication per axis and
// the step's time split (compute, pipeline bubble, exposed communication, optimizer). Pure C++, no ImGui:
// whatif_panel.h draws it.
//
//   WhatIfModel m;
//   m.load_run(run_json);          // optional: GET /v1/runs/{id}'s object; the form takes its model/layout
//   m.form.gpus = 16;              // ...edits...
//   m.evaluate();                  // validate, plan, search, rank (2-11 ms: docs/WHATIF_PANEL.md)
//   if (!m.issues().empty()) show(m.issues());
//   for (const Candidate& c : m.candidates()) row(c.plan.step_s, c.plan.tokens_per_s, c.plan.mfu,
//   c.fit_note); std::optional<WhatIfApply> a = m.apply(m.selected());  // engaged when the run can resume on
//   it
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "engine/plan/planner.h"
#include "engine/plan/search.h"
#include "ui/whatif/whatif_form.h"
#include "ui/whatif/whatif_run.h"

namespace gantry::whatif {

// Where a candidate came from (one layout can be several; the row shows all).
enum CandidateSource : unsigned {
  kFromForm = 1,    // the layout typed in the form
  kFromSearch = 2,  // among the search's best (plan_search)
  kFromEngine = 4,  // a layout the engine can resume the loaded run on (dp = the form's GPUs, ZeRO 0..3)
};

struct Candidate {
  Plan plan;                  // plan_evaluate of the model's input() with plan.layout
  unsigned sources = 0;       // CandidateSource bits
  double score = 0;           // what the ranking orders by: tokens/s, or tokens/s × goodput
  std::string fit_note;       // "fits: 61.2 of 80.0 GiB" / "does not fit: needs 92.1 GiB of 80.0 GiB
                              // (activations 60.3 GiB)"
  std::string apply_blocker;  // why Apply cannot resume the run on it; "" = it can
  std::string label() const;  // "tp2 pp4 dp8 z1 mb2 sel" — the layout in a few characters
};

// One bar of the memory chart: a bucket's bytes on the heaviest stage's GPU.
struct MemoryBar {
  std::string name;  // "weights", "gradients", "optimizer", "activations", "buffers"
  double bytes = 0;
};

// One part of the step's time.
struct TimePart {
  std::string name;  // "compute", "pipeline bubble", "exposed communication", "optimizer"
  double seconds = 0;
};

class WhatIfModel {
 public:
  WhatIfForm form;

  // Validates the form, evaluates its layout, runs the layout search and ranks the candidates. The
  // selection follows the previously selected layout when it is still a candidate, and is otherwise the
  // first. A layout the planner refuses is an issue and no candidate, but the search still runs over the
  // form's model and cluster; a form without a valid model, GPU kind or GPU count has no candidates.
  void evaluate();

  const std::vector<FormIssue>& issues() const { return issues_; }
  // Best first: the layouts that fit, by score (ties: less memory first), then those that do not, by score.
  const std::vector<Candidate>& candidates() const { return candidates_; }
  const PlanInput& input() const { return input_; }  // as last evaluated
  int search_evaluated() const { return search_evaluated_; }
  int search_fitting() const { return search_fitting_; }

  int selected() const { return selected_; }  // -1: none
  void select(int index);                     // out of range: none
  const Candidate* selection() const;

  // The run Apply resumes. Loading puts its model, batch and layout into the form (whatif_form_from_run)
  // and evaluates; an error leaves everything as it was.
  Status load_run(const nlohmann::json& run);
  void forget_run() { run_.reset(); }
  // The run's state as the API last reported it ("running", "stopped", ...), without reloading the form.
  // Apply stays the caller's to carry out: resume-from takes only a stopped, failed or interrupted run, so
  // the panel says so beside an enabled Apply while the run is live (a console may stop it first).
  void set_run_state(std::string_view state) {
    if (run_) run_->state = std::string(state);
  }
  const std::optional<WhatIfRun>& run() const { return run_; }

  // The resume-from layout of candidate `index`, when the loaded run can resume on it.
  std::optional<WhatIfApply> apply(int index) const;

 private:
  void add(Plan plan, unsigned source);

  std::vector<FormIssue> issues_;
  std::vector<Candidate> candidates_;
  PlanInput input_;
  int search_evaluated_ = 0, search_fitting_ = 0;
  int selected_ = -1;
  std::optional<WhatIfRun> run_;
};

// The selected plan's memory by bucket, in MemoryBuckets' order; plan.hbm_bytes is the limit they stack to.
std::vector<MemoryBar> whatif_memory_bars(const Plan& p);
// The step's time: compute, pipeline bubble, exposed communication, optimizer (they sum to step_s).
std::vector<TimePart> whatif_time_parts(const Plan& p);

// Human figures for the table: "61.2 GiB", "412 ms" / "1.83 s", "1.25M".
std::string whatif_format_bytes(double bytes);
std::string whatif_format_seconds(double s);
std::string whatif_format_count(double v);

}  // namespace gantry::whatif
