#include "ui/whatif/whatif_model.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <tuple>

namespace gantry::whatif {

namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

// Two plans are one candidate when every layout field the planner reads is equal.
auto layout_key(const PlanLayout& l) {
  return std::make_tuple(l.tp, l.pp, l.vp, l.dp, l.cp, l.zero, l.hsdp, l.sequence_parallel, l.recompute,
                         l.flash_attention, l.schedule, l.micro_batch);
}

double score_of(const Plan& p, SearchRank rank) {
  // As plan_search ranks, so the search's own order survives the merge.
  return rank == SearchRank::kGoodput ? p.tokens_per_s * p.goodput : p.tokens_per_s;
}

std::string fit_note(const Plan& p) {
  char buf[160];
  if (p.fits) {
    std::snprintf(buf, sizeof buf, "fits: %.1f of %.1f GiB", p.memory.total() / kGiB, p.hbm_bytes / kGiB);
    return buf;
  }
  // Name the largest bucket: it is where a change of layout (ZeRO, recompute, more pp) helps most.
  const std::vector<MemoryBar> bars = whatif_memory_bars(p);
  const MemoryBar& top = *std::max_element(
      bars.begin(), bars.end(), [](const MemoryBar& a, const MemoryBar& b) { return a.bytes < b.bytes; });
  std::snprintf(buf, sizeof buf, "does not fit: needs %.1f GiB of %.1f GiB (%s %.1f GiB)",
                p.memory.total() / kGiB, p.hbm_bytes / kGiB, top.name.c_str(), top.bytes / kGiB);
  return buf;
}

}  // namespace

std::string Candidate::label() const {
  const PlanLayout& l = plan.layout;
  std::string s = "tp" + std::to_string(l.tp) + " pp" + std::to_string(l.pp);
  if (l.vp > 1) s += " vp" + std::to_string(l.vp);
  if (l.cp > 1) s += " cp" + std::to_string(l.cp);
  s += " dp" + std::to_string(l.dp) + " z" + std::to_string(l.zero);
  if (l.hsdp > 0) s += " hsdp" + std::to_string(l.hsdp);
  s += " mb" + std::to_string(l.micro_batch);
  if (l.recompute != Recompute::kNone) s += l.recompute == Recompute::kFull ? " full" : " sel";
  return s;
}

void WhatIfModel::add(Plan plan, unsigned source) {
  for (Candidate& c : candidates_) {
    if (layout_key(c.plan.layout) == layout_key(plan.layout)) {
      c.sources |= source;
      return;
    }
  }
  Candidate c;
  c.score = score_of(plan, form.rank);
  c.fit_note = fit_note(plan);
  c.apply_blocker = whatif_apply_blocker(plan, run_ ? &*run_ : nullptr, form.global_batch);
  c.plan = std::move(plan);
  c.sources = source;
  candidates_.push_back(std::move(c));
}

void WhatIfModel::evaluate() {
  const bool had_selection = selection() != nullptr;
  const PlanLayout was = had_selection ? selection()->plan.layout : PlanLayout{};
  candidates_.clear();
  selected_ = -1;
  search_evaluated_ = search_fitting_ = 0;
  issues_ = whatif_form_check(form);
  // A layout the planner refuses still leaves a model and a cluster to search over: only a form that
  // does not describe those (an unknown GPU, a bad model, no GPUs) stops here.
  Result<PlanInput> in = whatif_form_input(form);
  if (!in.ok()) return;
  input_ = in.value();

  if (Result<Plan> own = plan_evaluate(input_); own.ok()) add(std::move(own.value()), kFromForm);
  Result<SearchResult> found = plan_search(input_, SearchOptions{.top = form.top, .rank = form.rank});
  if (found.ok()) {
    search_evaluated_ = found->evaluated;
    search_fitting_ = found->fitting;
    for (Plan& p : found->plans) add(std::move(p), kFromSearch);
  } else {
    issues_.push_back({"search", found.error()});
  }
  if (run_) {
    // What the engine can resume the run on with the form's GPUs: data parallel over all of them, each ZeRO
    // stage, micro-batches as the engine would cut them from the run's config.
    const int dp = form.gpus;
    if (run_->global_batch % dp == 0) {
      const int micro = std::max(1, std::min(run_->micro_batch, run_->global_batch / dp));
      for (int zero = 0; zero <= 3; ++zero) {
        PlanInput e = input_;
        e.layout = PlanLayout{.tp = 1,
                              .pp = 1,
                              .vp = 1,
                              .dp = dp,
                              .cp = 1,
                              .zero = zero,
                              .hsdp = 0,
                              .sequence_parallel = false,
                              .recompute = Recompute::kNone,
                              .flash_attention = input_.layout.flash_attention,
                              .schedule = Schedule::k1F1B,
                              .micro_batch = micro};
        if (Result<Plan> p = plan_evaluate(e); p.ok()) add(std::move(p.value()), kFromEngine);
      }
    }
  }

  std::stable_sort(candidates_.begin(), candidates_.end(), [](const Candidate& a, const Candidate& b) {
    if (a.plan.fits != b.plan.fits) return a.plan.fits;
    if (a.score != b.score) return a.score > b.score;
    return a.plan.memory.total() < b.plan.memory.total();
  });
  if (!candidates_.empty()) selected_ = 0;
  if (had_selection) {
    for (size_t i = 0; i < candidates_.size(); ++i) {
      if (layout_key(candidates_[i].plan.layout) == layout_key(was)) selected_ = static_cast<int>(i);
    }
  }
}

void WhatIfModel::select(int index) {
  selected_ = index >= 0 && index < static_cast<int>(candidates_.size()) ? index : -1;
}

const Candidate* WhatIfModel::selection() const {
  return selected_ >= 0 && selected_ < static_cast<int>(candidates_.size()) ? &candidates_[selected_]
                                                                            : nullptr;
}

Status WhatIfModel::load_run(const nlohmann::json& run) {
  Result<WhatIfRun> r = whatif_run_parse(run);
  if (!r.ok()) return r.status();
  run_ = std::move(r.value());
  whatif_form_from_run(form, *run_);
  evaluate();
  return {};
}

std::optional<WhatIfApply> WhatIfModel::apply(int index) const {
  if (index < 0 || index >= static_cast<int>(candidates_.size()) || !run_) return std::nullopt;
  const Candidate& c = candidates_[index];
  if (!c.apply_blocker.empty()) return std::nullopt;
  return whatif_apply_of(c.plan, *run_);
}

std::vector<MemoryBar> whatif_memory_bars(const Plan& p) {
  return {{"weights", p.memory.weights},
          {"gradients", p.memory.gradients},
          {"optimizer", p.memory.optimizer},
          {"activations", p.memory.activations},
          {"buffers", p.memory.buffers}};
}

std::vector<TimePart> whatif_time_parts(const Plan& p) {
  // Every profile's parts add up to its step (gantry-cpu's too: its stages, Gloo collectives and cores).
  return {{"compute", p.compute_s},
          {"pipeline bubble", p.bubble_s},
          {"exposed communication", p.exposed_comm_s},
          {"optimizer", p.optimizer_s}};
}

std::string whatif_format_bytes(double bytes) {
  char buf[32];
  if (bytes >= kGiB) {
    std::snprintf(buf, sizeof buf, "%.1f GiB", bytes / kGiB);
  } else {
    std::snprintf(buf, sizeof buf, "%.1f MiB", bytes / (1024.0 * 1024.0));
  }
  return buf;
}

std::string whatif_format_seconds(double s) {
  char buf[32];
  if (!std::isfinite(s)) return "-";
  if (s >= 1) {
    std::snprintf(buf, sizeof buf, "%.2f s", s);
  } else if (s >= 1e-3) {
    std::snprintf(buf, sizeof buf, "%.1f ms", s * 1e3);
  } else {
    std::snprintf(buf, sizeof buf, "%.0f us", s * 1e6);
  }
  return buf;
}

std::string whatif_format_count(double v) {
  char buf[32];
  if (!std::isfinite(v)) return "-";
  if (v >= 1e9) {
    std::snprintf(buf, sizeof buf, "%.2fG", v / 1e9);
  } else if (v >= 1e6) {
    std::snprintf(buf, sizeof buf, "%.2fM", v / 1e6);
  } else if (v >= 1e3) {
    std::snprintf(buf, sizeof buf, "%.1fk", v / 1e3);
  } else {
    std::snprintf(buf, sizeof buf, "%.0f", v);
  }
  return buf;
}

}  // namespace gantry::whatif
