// Prometheus text exposition (format 0.0.4) for /metrics on the agent and the coordinator. The writer
// enforces the project's rules so a bad name fails a test rather than a dashboard: every name starts with
// "gantry_", counters end in "_total", units are base units (a name ending in _ms, _percent, _mb, ... is
// refused), each family is declared once with HELP and TYPE and its samples follow it contiguously, and
// label values are escaped. Per-rank series are bounded: at 100k ranks one series per rank would swamp
// any Prometheus, so only the slowest `max_rank_series` ranks get a `rank` label and every rank counts in
// the across-rank aggregates.
//
//   PrometheusWriter w;
//   w.family("gantry_tokens_total", MetricType::counter, "Tokens trained on since the run started.");
//   w.sample({}, tokens);
//   prometheus_write_rank_steps(w, latest_records, 64);
//   if (!w.ok()) log(w.error());
//   reply(w.text(), kPrometheusContentType);
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>
#include <vector>

#include "telemetry/records.h"

namespace gantry {

inline constexpr std::string_view kPrometheusContentType = "text/plain; version=0.0.4; charset=utf-8";

enum class MetricType { counter, gauge };

struct Label {
  std::string_view name;
  std::string_view value;
};

class PrometheusWriter {
 public:
  // Starts a family. False (and ok() false, with error() saying why) for a name that breaks the rules
  // above or repeats an earlier family; its samples are then dropped.
  bool family(std::string_view name, MetricType type, std::string_view help);
  // One sample of the current family, labels in the given order.
  bool sample(std::initializer_list<Label> labels, double value);
  bool sample(const std::vector<Label>& labels, double value);

  bool ok() const { return error_.empty(); }
  const std::string& error() const { return error_; }  // the first problem
  const std::string& text() const { return out_; }

 private:
  bool sample(const Label* labels, size_t n, double value);
  bool fail(std::string why);
  std::string out_;
  std::string error_;
  std::string current_;  // family being written; "" when none is open
  std::vector<std::string> declared_;
};

// True when `name` is a valid metric name under the rules above; otherwise *why says which rule.
bool prometheus_name_ok(std::string_view name, MetricType type, std::string* why);

// Which ranks get their own labelled series: at most max_series indices into `seconds` (one value per
// rank, the latest step time), the slowest first, ties by lower index, non-finite values last.
std::vector<size_t> prometheus_bounded_ranks(const std::vector<double>& seconds, size_t max_series);

// The latest record of each rank (any order) as gauges: per-rank series for the bounded selection
// (gantry_rank_step_seconds, gantry_rank_phase_seconds{phase}, gantry_rank_memory_*_bytes and the NVML
// readings and gantry_rank_mfu_ratio / gantry_rank_hfu_ratio where present) and across all ranks
// gantry_step_seconds{stat="min|median|max"} and gantry_ranks_reporting; gantry_rank_series_omitted counts
// the ranks left without their own series.
void prometheus_write_rank_steps(PrometheusWriter& w, const std::vector<RankStepRecord>& latest,
                                 size_t max_rank_series);

// The job's latest step: gantry_step, gantry_loss, gantry_grad_norm, gantry_learning_rate,
// gantry_tokens_per_second, gantry_step_duration_seconds, and gantry_mfu_ratio / gantry_hfu_ratio with
// the peak as a label and the formula in the HELP text (flops.h's mfu_formula / hfu_formula); the two
// ratios are left out when the record has none (the peak is unknown).
void prometheus_write_step(PrometheusWriter& w, const StepRecord& s, std::string_view peak_name,
                           std::string_view mfu_formula, std::string_view hfu_formula);

}  // namespace gantry
