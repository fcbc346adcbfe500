#include "engine/cluster/straggler_watch.h"

#include <algorithm>
#include <cstdio>

#include "engine/cluster/json_fields.h"

namespace gantry {
namespace {

using json = nlohmann::json;

const char* basis_name(StragglerBasis b) {
  return b == StragglerBasis::busy ? "busy" : "total";
}

json score_json(const StragglerScore& s) {
  return {{"samples", s.samples},
          {"median_s", s.median_s},
          {"relative", s.relative},
          {"individual", s.individual},
          {"relative_windows", s.relative_windows},
          {"individual_windows", s.individual_windows},
          {"flagged", s.flagged},
          {"slow_phase", std::string(phase_name(s.slow_phase))},
          {"slow_phase_excess_s", s.slow_phase_excess_s},
          {"excess_s", s.excess_s},
          {"excess", straggler_excess_text(phase_name(s.slow_phase), s.slow_phase_excess_s)},
          {"slow_phase_reference", s.slow_phase_vs_self ? "self" : "ranks"}};
}

}  // namespace

Result<StragglerWatchOptions> straggler_watch_parse(const json* object) {
  StragglerWatchOptions o;
  if (object == nullptr) return o;
  JsonFields f(*object, "straggler.");
  StragglerOptions& s = o.scoring;
  o.enabled = f.boolean("enabled", JsonFields::optional).value_or(o.enabled);
  o.quarantine = f.boolean("quarantine", JsonFields::optional).value_or(o.quarantine);
  s.window_steps =
      static_cast<int>(f.integer("window_steps", 1, 100000, JsonFields::optional).value_or(s.window_steps));
  s.min_samples =
      static_cast<int>(f.integer("min_samples", 1, 100000, JsonFields::optional).value_or(s.min_samples));
  s.relative_threshold =
      f.number("relative_threshold", 0, 1, JsonFields::optional).value_or(s.relative_threshold);
  s.individual_threshold =
      f.number("individual_threshold", 0, 1, JsonFields::optional).value_or(s.individual_threshold);
  s.windows_to_flag = static_cast<int>(
      f.integer("windows_to_flag", 1, 100000, JsonFields::optional).value_or(s.windows_to_flag));
  if (std::optional<std::string> b = f.string("basis", JsonFields::optional)) {
    if (*b == "busy") {
      s.basis = StragglerBasis::busy;
    } else if (*b == "total") {
      s.basis = StragglerBasis::total;
    } else {
      return Status::error(
          "field \"straggler.basis\": expected \"busy\" (step time minus exposed communication) or "
          "\"total\", got \"" +
          *b + "\"");
    }
  }
  if (Status st = f.finish(); !st.ok()) return st;
  // Ranges that depend on each other (min_samples <= window_steps): the scorer's own check, which names the
  // field.
  if (std::string why = straggler_options_check(s); !why.empty()) return Status::error(why);
  if (o.quarantine && !o.enabled) {
    return Status::error(
        "field \"straggler.quarantine\": true needs \"straggler.enabled\": true (a rank is quarantined when "
        "the "
        "scoring flags it; with scoring off nothing is ever flagged)");
  }
  return o;
}

json straggler_watch_options_json(const StragglerWatchOptions& o) {
  const StragglerOptions& s = o.scoring;
  return {{"enabled", o.enabled},
          {"quarantine", o.quarantine},
          {"window_steps", s.window_steps},
          {"min_samples", s.min_samples},
          {"relative_threshold", s.relative_threshold},
          {"individual_threshold", s.individual_threshold},
          {"windows_to_flag", s.windows_to_flag},
          {"basis", basis_name(s.basis)}};
}

StragglerWatch::StragglerWatch(StragglerWatchOptions options)
    : o_(options), scorer_(options.scoring), next_evaluation_(options.scoring.window_steps) {}

void StragglerWatch::add(const RankStepRecord& r) {
  if (!o_.enabled) return;
  if (scorer_.add(r)) last_step_seen_ = std::max(last_step_seen_, r.step);
}

std::vector<EventRecord> StragglerWatch::maybe_evaluate(int64_t run_id, double time_unix_s,
                                                        const std::function<std::string(int32_t)>& node_of) {
  std::vector<EventRecord> out;
  if (!o_.enabled || last_step_seen_ < next_evaluation_) return out;
  const int64_t w = o_.scoring.window_steps;
  // The next multiple of the window past the records seen: a burst of steps in one beat is one evaluation.
  next_evaluation_ = (last_step_seen_ / w + 1) * w;
  evaluated_at_step_ = last_step_seen_;
  last_ = scorer_.evaluate();
  for (const StragglerScore& s : last_.scores) {
    const size_t k = static_cast<size_t>(s.rank);
    if (k >= flagged_.size()) flagged_.resize(k + 1, false);
    if (s.flagged == flagged_[k]) continue;
    flagged_[k] = s.flagged;
    if (s.flagged) {
      EventRecord e = straggler_event(last_, s.rank, run_id, time_unix_s, evaluated_at_step_);
      e.node = node_of(s.rank);
      json p = json::parse(e.payload, nullptr, false);
      if (p.is_object()) {
        p["node"] = e.node;
        p["rank"] = s.rank;
        e.payload = p.dump();
      }
      e.message += " on node " + e.node;
      out.push_back(std::move(e));
    } else {
      char buf[160];
      std::snprintf(buf, sizeof buf, "relative %.3f, individual %.3f, median %.4f s", s.relative,
                    s.individual, s.median_s);
      out.push_back(cleared(run_id, time_unix_s, s.rank, node_of(s.rank), buf));
    }
  }
  return out;
}

std::vector<EventRecord> StragglerWatch::set_options(const StragglerWatchOptions& o, int64_t run_id,
                                                     double time_unix_s,
                                                     const std::function<std::string(int32_t)>& node_of) {
  const bool rescore = straggler_watch_options_json({.enabled = o.enabled, .scoring = o.scoring}) !=
                       straggler_watch_options_json({.enabled = o_.enabled, .scoring = o_.scoring});
  o_ = o;
  if (!rescore) return {};
  return reset(run_id, time_unix_s, node_of, "the straggler policy's scoring options changed");
}

std::vector<int32_t> StragglerWatch::flagged_ranks() const {
  std::vector<int32_t> out;
  for (size_t k = 0; k < flagged_.size(); ++k)
    if (flagged_[k]) out.push_back(static_cast<int32_t>(k));
  return out;
}

std::vector<EventRecord> StragglerWatch::reset(int64_t run_id, double time_unix_s,
                                               const std::function<std::string(int32_t)>& node_of,
                                               const std::string& why) {
  std::vector<EventRecord> out;
  for (size_t k = 0; k < flagged_.size(); ++k) {
    if (!flagged_[k]) continue;
    const int32_t rank = static_cast<int32_t>(k);
    out.push_back(cleared(run_id, time_unix_s, rank, node_of(rank), why));
  }
  scorer_ = StragglerScorer(o_.scoring);
  last_ = StragglerReport();
  flagged_.clear();
  last_step_seen_ = -1;
  evaluated_at_step_ = -1;
  next_evaluation_ = o_.scoring.window_steps;
  return out;
}

EventRecord StragglerWatch::cleared(int64_t run_id, double time_unix_s, int32_t rank, const std::string& node,
                                    const std::string& why) const {
  EventRecord e;
  e.run_id = run_id;
  e.time_unix_s = time_unix_s;
  e.step = evaluated_at_step_;
  e.kind = "straggler_cleared";
  e.rank = rank;
  e.node = node;
  e.message = "rank " + std::to_string(rank) + " on node " + node + " is no longer a straggler: " + why;
  json p = {{"rank", rank}, {"node", node}, {"reason", why}};
  if (const StragglerScore* s = last_.find(rank)) p.update(score_json(*s));
  e.payload = p.dump();
  return e;
}

json StragglerWatch::rank_json(int32_t rank) const {
  const StragglerScore* s = last_.find(rank);
  return s == nullptr ? json(nullptr) : score_json(*s);
}

json StragglerWatch::summary_json() const {
  json flagged = json::array();
  for (size_t k = 0; k < flagged_.size(); ++k)
    if (flagged_[k]) flagged.push_back(k);
  return {{"options", straggler_watch_options_json(o_)},
          {"evaluations", last_.evaluation},
          {"evaluated_at_step", evaluated_at_step_},
          {"next_evaluation_step", o_.enabled ? json(next_evaluation_) : json(nullptr)},
          {"fastest_rank", last_.fastest_rank},
          {"fastest_median_s", last_.fastest_median_s},
          {"flagged", flagged}};
}

int StragglerWatch::flagged_count() const {
  return static_cast<int>(std::count(flagged_.begin(), flagged_.end(), true));
}

}  // namespace gantry
