// Alert rules and their evaluation, pure: the coordinator (coordinator_alerts.cpp) feeds each live run's
// latest figures in every evaluation and turns the transitions into events and command hooks, so alerts
// fire with no console open. Nothing here reads a clock, a socket or a file.
//
//   Result<AlertRule> rule = alert_rule_parse(body);  // {"name": "loss_high", "kind": "threshold",
//                                                     //  "series": "loss", "above": 6.0, "clear": 5.5}
//   AlertEvaluator ev;
//   for (const AlertTransition& t : ev.evaluate(rules, samples, now_unix_s)) record(t);
//
// Once per firing: a rule fires for a run when its condition starts to hold, and clears when it ends
// (both transitions are returned once; an evaluation while the state holds returns nothing). A threshold
// rule may clear at a value short of its threshold ("clear": hysteresis), so a series hovering at the
// threshold does not fire at every step. A value that is not known (no step yet, an MFU without a peak)
// changes nothing: unknown is neither firing nor clear.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>  // nlohmann::json: rules' API form
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "telemetry/records.h"  // StepRecord: the series a threshold or NaN rule reads
#include "telemetry/status.h"

namespace gantry {

enum class AlertKind {
  kThreshold,   // a step series above or below a value
  kNan,         // a step series not finite (NaN or infinite)
  kAbsence,     // no step record for `seconds` while the run is running
  kRankExcess,  // the slowest rank's busy time over the median rank's (the straggler watch's excess_s)
  kEttr,        // the run's effective training time ratio (the goodput ledger's) below a value
};
inline constexpr int kAlertKindCount = 5;

// The step series a threshold or NaN rule reads, from the run's latest step record.
enum class AlertSeries { kLoss, kGradNorm, kStepS, kTokensPerS, kMfu, kLr, kValLoss };
inline constexpr int kAlertSeriesCount = 7;

const char* alert_kind_name(AlertKind k);      // "threshold", "nan", "absence", "rank_excess", "ettr"
const char* alert_series_name(AlertSeries s);  // "loss", "grad_norm", "step_s", ...

struct AlertRule {
  std::string name;  // 1-64 of [A-Za-z0-9_.-]: the rule's key in the API and its events
  AlertKind kind = AlertKind::kThreshold;
  AlertSeries series = AlertSeries::kLoss;  // threshold, nan
  bool above = true;                        // threshold, rank_excess: fires above; ettr: fires below
  double threshold = 0;                     // threshold, rank_excess (seconds), ettr (0..1)
  double clear = 0;            // where a firing rule clears (hysteresis); = threshold if not given
  double seconds = 0;          // absence
  int64_t run = 0;             // only this run; 0 = every live run
  std::string hook;            // a shell command run when the rule fires; "" = none
  double hook_timeout_s = 10;  // the hook is killed (its process group) past this
};

// The API's form of a rule (what POST /v1/alerts takes and GET lists). Errors name the field and what would
// be right: 'field "series": expected one of loss, grad_norm, ..., got "los"', 'rule "x" (threshold) needs
// "above" or "below", e.g. "above": 6.0'.
Result<AlertRule> alert_rule_parse(const nlohmann::json& body);
nlohmann::json alert_rule_json(const AlertRule& r);

// A file of rules (TOML, `coordinator --alerts FILE`, `up --alerts FILE`): one table per rule, named by the
// table ([alert.loss_high] kind = "threshold" ...). Errors name the file, line and field.
Result<std::vector<AlertRule>> alert_rules_parse_toml(std::string_view text, std::string_view source);

// What one live run shows the evaluator now; nullopt = not known.
struct AlertRunSample {
  int64_t run = 0;
  bool paused = false;  // a paused run takes no steps: absence does not hold
  int64_t step = -1;    // its latest step (for events)
  std::array<std::optional<double>, kAlertSeriesCount> series{};
  std::optional<double> seconds_since_step;  // since its latest step record (or its placement, before one)
  std::optional<double> max_excess_s;        // the slowest scored rank's excess over the median
  int32_t excess_rank = -1;                  // ... that rank
  std::optional<double> ettr;
};

// The series of a step record (MFU and val_loss only when the record has them).
std::array<std::optional<double>, kAlertSeriesCount> alert_series_of(const StepRecord& s);

enum class AlertChange { kFired, kCleared };

struct AlertTransition {
  AlertChange change = AlertChange::kFired;
  const AlertRule* rule = nullptr;  // points into the rules given to evaluate(); null for a deleted rule
  std::string rule_name;
  int64_t run = 0;
  int64_t step = -1;
  std::optional<double> value;  // the value that fired or cleared it (none: the run or rule went away)
  int32_t rank = -1;            // rank_excess: the slowest rank
  std::string message;          // one human line: "alert loss_high: loss 7.1 > 6 on run 3 at step 40"
};

// A rule firing for a run now, for GET /v1/alerts and the console's banner.
struct AlertFiring {
  std::string rule;
  int64_t run = 0;
  double since_unix_s = 0;
  std::optional<double> value;
  int32_t rank = -1;
  std::string message;
};

class AlertEvaluator {
 public:
  // Evaluates every rule against every sample. A firing rule whose run is no longer among the samples
  // (it ended) or that is no longer among the rules (deleted) clears, saying why.
  std::vector<AlertTransition> evaluate(const std::vector<AlertRule>& rules,
                                        const std::vector<AlertRunSample>& runs, double now_unix_s);
  std::vector<AlertFiring> firing() const;

 private:
  std::map<std::pair<std::string, int64_t>, AlertFiring> firing_;  // (rule, run)
};

}  // namespace gantry
