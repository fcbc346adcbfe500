#include "engine/cluster/alert_rules.h"

#include <cmath>
#include <cstdio>
#include <set>

#include "engine/cluster/json_fields.h"
#include "engine/core/toml.h"  // alert rule files

namespace gantry {
namespace {

using json = nlohmann::json;

constexpr std::array<AlertKind, kAlertKindCount> kKinds = {
    AlertKind::kThreshold, AlertKind::kNan, AlertKind::kAbsence, AlertKind::kRankExcess, AlertKind::kEttr};
constexpr std::array<AlertSeries, kAlertSeriesCount> kSeries = {
    AlertSeries::kLoss, AlertSeries::kGradNorm, AlertSeries::kStepS,  AlertSeries::kTokensPerS,
    AlertSeries::kMfu,  AlertSeries::kLr,       AlertSeries::kValLoss};

std::string num(double v) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.6g", v);
  return buf;
}

template <class E, size_t N>
std::string names_of(const std::array<E, N>& all, const char* (*name)(E)) {
  std::string out;
  for (E e : all) out += (out.empty() ? "" : ", ") + std::string(name(e));
  return out;
}

bool name_ok(const std::string& n) {
  if (n.empty() || n.size() > 64) return false;
  for (char c : n) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
                    c == '-' || c == '.';
    if (!ok) return false;
  }
  return true;
}

// What a rule's condition says of one run now.
enum class Verdict { kUnknown, kHolds, kClear };

struct Reading {
  Verdict verdict = Verdict::kUnknown;
  std::optional<double> value;
  int32_t rank = -1;
  std::string what;  // the figure against its bound, in words: "loss 7.1 > 6"
};

Reading read(const AlertRule& r, const AlertRunSample& s, bool firing) {
  Reading out;
  // A threshold's test: beyond the threshold fires; a firing rule holds until it is back past `clear`.
  auto compare = [&](double v, const std::string& label) {
    out.value = v;
    const bool beyond = r.above ? v > r.threshold : v < r.threshold;
    const bool back = r.above ? v <= r.clear : v >= r.clear;
    const bool holds = firing ? !back : beyond;
    out.verdict = holds ? Verdict::kHolds : Verdict::kClear;
    const char* op = holds ? (r.above ? " > " : " < ") : (r.above ? " <= " : " >= ");
    out.what = label + " " + num(v) + op + num(holds ? r.threshold : (firing ? r.clear : r.threshold));
  };
  switch (r.kind) {
    case AlertKind::kThreshold: {
      const std::optional<double>& v = s.series[static_cast<size_t>(r.series)];
      // A value that is not finite is the nan rule's matter; here it is not known.
      if (v && std::isfinite(*v)) compare(*v, alert_series_name(r.series));
      break;
    }
    case AlertKind::kNan: {
      const std::optional<double>& v = s.series[static_cast<size_t>(r.series)];
      if (!v) break;
      out.value = *v;
      out.verdict = std::isfinite(*v) ? Verdict::kClear : Verdict::kHolds;
      out.what = std::string(alert_series_name(r.series)) + " is " + num(*v);
      break;
    }
    case AlertKind::kAbsence:
      if (s.paused) {
        out.verdict = Verdict::kClear;
        out.what = "the run is paused";
      } else if (s.seconds_since_step) {
        out.value = *s.seconds_since_step;
        out.verdict = *s.seconds_since_step > r.seconds ? Verdict::kHolds : Verdict::kClear;
        out.what = out.verdict == Verdict::kHolds
                       ? "no step for " + num(*s.seconds_since_step) + " s (> " + num(r.seconds) + " s)"
                       : "a step came " + num(*s.seconds_since_step) + " s ago";
      }
      break;
    case AlertKind::kRankExcess:
      if (s.max_excess_s) {
        compare(*s.max_excess_s,
                "rank " + std::to_string(s.excess_rank) + "'s excess over the median rank (s)");
        out.rank = s.excess_rank;
      }
      break;
    case AlertKind::kEttr:
      if (s.ettr) compare(*s.ettr, "ETTR");
      break;
  }
  return out;
}

}  // namespace

const char* alert_kind_name(AlertKind k) {
  switch (k) {
    case AlertKind::kThreshold:
      return "threshold";
    case AlertKind::kNan:
      return "nan";
    case AlertKind::kAbsence:
      return "absence";
    case AlertKind::kRankExcess:
      return "rank_excess";
    case AlertKind::kEttr:
      return "ettr";
  }
  return "?";
}

const char* alert_series_name(AlertSeries s) {
  switch (s) {
    case AlertSeries::kLoss:
      return "loss";
    case AlertSeries::kGradNorm:
      return "grad_norm";
    case AlertSeries::kStepS:
      return "step_s";
    case AlertSeries::kTokensPerS:
      return "tokens_per_s";
    case AlertSeries::kMfu:
      return "mfu";
    case AlertSeries::kLr:
      return "lr";
    case AlertSeries::kValLoss:
      return "val_loss";
  }
  return "?";
}

Result<AlertRule> alert_rule_parse(const json& body) {
  JsonFields f(body);
  AlertRule r;
  const std::optional<std::string> name = f.string("name");
  const std::optional<std::string> kind = f.string("kind");
  if (Status s = f.finish(); !f.ok()) return s;
  if (!name_ok(*name)) {
    return Status::error(
        "field \"name\": expected 1-64 characters of A-Z a-z 0-9 _ - . (e.g. \"loss_high\"), got \"" +
        name->substr(0, 80) + "\"");
  }
  r.name = *name;
  bool known_kind = false;
  for (AlertKind k : kKinds) {
    if (*kind == alert_kind_name(k)) r.kind = k, known_kind = true;
  }
  if (!known_kind) {
    return Status::error("field \"kind\": expected one of " + names_of(kKinds, alert_kind_name) + ", got \"" +
                         kind->substr(0, 80) + "\"");
  }
  const std::string rule_is = "rule \"" + r.name + "\" (" + alert_kind_name(r.kind) + ")";
  if (r.kind == AlertKind::kThreshold || r.kind == AlertKind::kNan) {
    const std::optional<std::string> series = f.string("series");
    if (!f.ok()) return f.finish();
    bool known = false;
    for (AlertSeries s : kSeries) {
      if (*series == alert_series_name(s)) r.series = s, known = true;
    }
    if (!known) {
      return Status::error("field \"series\": expected one of " + names_of(kSeries, alert_series_name) +
                           ", got \"" + series->substr(0, 80) + "\"");
    }
  }
  if (r.kind == AlertKind::kThreshold || r.kind == AlertKind::kRankExcess || r.kind == AlertKind::kEttr) {
    // ETTR falls: its rules fire below. The others fire on either side.
    const double lo = r.kind == AlertKind::kEttr ? 0 : -1e300, hi = r.kind == AlertKind::kEttr ? 1 : 1e300;
    std::optional<double> above, below;
    if (r.kind != AlertKind::kEttr) above = f.number("above", lo, hi, JsonFields::optional);
    if (r.kind != AlertKind::kRankExcess) below = f.number("below", lo, hi, JsonFields::optional);
    const std::optional<double> clear = f.number("clear", lo, hi, JsonFields::optional);
    if (!f.ok()) return f.finish();
    const char* example = r.kind == AlertKind::kEttr         ? "\"below\": 0.9"
                          : r.kind == AlertKind::kRankExcess ? "\"above\": 0.5 (seconds)"
                                                             : "\"above\": 6.0";
    if (above.has_value() == below.has_value()) {
      const std::string needs = r.kind == AlertKind::kEttr         ? "needs \"below\""
                                : r.kind == AlertKind::kRankExcess ? "needs \"above\""
                                                                   : "needs one of \"above\" or \"below\"";
      return Status::error(rule_is + " " + needs + (above && below ? ", not both" : "") + ", e.g. " +
                           example);
    }
    r.above = above.has_value();
    r.threshold = above ? *above : *below;
    r.clear = clear.value_or(r.threshold);
    if (r.above && r.clear > r.threshold) {
      return Status::error("field \"clear\": " + num(r.clear) + " is above \"above\" " + num(r.threshold) +
                           ": a rule firing above its threshold clears at or below it (give a value <= " +
                           num(r.threshold) + ")");
    }
    if (!r.above && r.clear < r.threshold) {
      return Status::error("field \"clear\": " + num(r.clear) + " is below \"below\" " + num(r.threshold) +
                           ": a rule firing below its threshold clears at or above it (give a value >= " +
                           num(r.threshold) + ")");
    }
  }
  if (r.kind == AlertKind::kAbsence) {
    const std::optional<double> seconds = f.number("seconds", 0.1, 7 * 86400.0);
    if (!f.ok()) return f.finish();
    r.seconds = *seconds;
  }
  const std::optional<int64_t> run = f.integer("run", 1, INT64_MAX, JsonFields::optional);
  const std::optional<std::string> hook = f.string("hook", JsonFields::optional);
  const std::optional<double> timeout = f.number("hook_timeout_s", 0.1, 3600, JsonFields::optional);
  if (Status s = f.finish(); !s.ok()) return s;
  r.run = run.value_or(0);
  if (hook) {
    if (hook->empty() || hook->size() > 4096 || hook->find('\0') != std::string::npos) {
      return Status::error(
          "field \"hook\": expected a shell command of 1-4096 characters, e.g. "
          "\"/usr/local/bin/page-oncall\", got " +
          std::to_string(hook->size()) + " characters");
    }
    r.hook = *hook;
  }
  if (timeout && !hook) {
    return Status::error(
        "field \"hook_timeout_s\" is given without a \"hook\" to time: add \"hook\": \"<command>\"");
  }
  r.hook_timeout_s = timeout.value_or(10);
  return r;
}

json alert_rule_json(const AlertRule& r) {
  json j = {{"name", r.name}, {"kind", alert_kind_name(r.kind)}};
  if (r.kind == AlertKind::kThreshold || r.kind == AlertKind::kNan) j["series"] = alert_series_name(r.series);
  if (r.kind == AlertKind::kThreshold || r.kind == AlertKind::kRankExcess || r.kind == AlertKind::kEttr) {
    j[r.above ? "above" : "below"] = r.threshold;
    j["clear"] = r.clear;
  }
  if (r.kind == AlertKind::kAbsence) j["seconds"] = r.seconds;
  if (r.run > 0) j["run"] = r.run;
  if (!r.hook.empty()) {
    j["hook"] = r.hook;
    j["hook_timeout_s"] = r.hook_timeout_s;
  }
  return j;
}

Result<std::vector<AlertRule>> alert_rules_parse_toml(std::string_view text, std::string_view source) {
  Result<TomlDocument> doc = toml_parse(text, source);
  if (!doc.ok()) return doc.status();
  // [alert.NAME] tables, in file order; each becomes the API's JSON form with its name.
  std::vector<std::pair<std::string, json>> tables;
  std::map<std::string, int> first_line;
  for (const auto& [key, value] : doc->entries) {
    const size_t dot = key.find('.', 6);
    if (key.rfind("alert.", 0) != 0 || dot == std::string::npos) {
      return Status::error(
          doc->location(value) + ": unknown key '" + key +
          "': each rule is a table [alert.NAME] with its fields (kind = \"threshold\", ...)");
    }
    const std::string name = key.substr(6, dot - 6), field = key.substr(dot + 1);
    auto it = std::find_if(tables.begin(), tables.end(), [&](const auto& t) { return t.first == name; });
    if (it == tables.end()) {
      tables.push_back({name, json{{"name", name}}});
      first_line[name] = value.line;
      it = tables.end() - 1;
    }
    if (field == "name") {
      return Status::error(doc->location(value) + ": 'alert." + name +
                           ".name': a rule's name is its table's ([alert." + name + "])");
    }
    json v;
    switch (value.kind) {
      case TomlValue::Kind::kString:
        v = value.s;
        break;
      case TomlValue::Kind::kInt:
        v = value.i;
        break;
      case TomlValue::Kind::kFloat:
        v = value.f;
        break;
      case TomlValue::Kind::kBool:
        v = value.b;
        break;
      case TomlValue::Kind::kArray:
        return Status::error(doc->location(value) + ": 'alert." + name + "." + field +
                             "': no rule field takes an array");
    }
    it->second[field] = v;
  }
  std::vector<AlertRule> rules;
  for (const auto& [name, body] : tables) {
    Result<AlertRule> r = alert_rule_parse(body);
    if (!r.ok()) {
      return Status::error(std::string(source) + ":" + std::to_string(first_line[name]) + ": [alert." + name +
                           "]: " + r.error());
    }
    rules.push_back(std::move(r.value()));
  }
  return rules;
}

std::array<std::optional<double>, kAlertSeriesCount> alert_series_of(const StepRecord& s) {
  std::array<std::optional<double>, kAlertSeriesCount> out{};
  out[static_cast<size_t>(AlertSeries::kLoss)] = s.loss;
  out[static_cast<size_t>(AlertSeries::kGradNorm)] = s.grad_norm;
  out[static_cast<size_t>(AlertSeries::kStepS)] = s.step_s;
  out[static_cast<size_t>(AlertSeries::kTokensPerS)] = s.tokens_per_s;
  out[static_cast<size_t>(AlertSeries::kMfu)] = s.mfu;
  out[static_cast<size_t>(AlertSeries::kLr)] = s.lr;
  out[static_cast<size_t>(AlertSeries::kValLoss)] = s.val_loss;
  return out;
}

std::vector<AlertTransition> AlertEvaluator::evaluate(const std::vector<AlertRule>& rules,
                                                      const std::vector<AlertRunSample>& runs,
                                                      double now_unix_s) {
  std::vector<AlertTransition> out;
  std::set<std::pair<std::string, int64_t>> seen;
  for (const AlertRule& rule : rules) {
    for (const AlertRunSample& s : runs) {
      if (rule.run > 0 && rule.run != s.run) continue;
      const auto key = std::make_pair(rule.name, s.run);
      seen.insert(key);
      auto it = firing_.find(key);
      const Reading rd = read(rule, s, it != firing_.end());
      if (rd.verdict == Verdict::kUnknown) continue;
      const bool holds = rd.verdict == Verdict::kHolds;
      const std::string where =
          " on run " + std::to_string(s.run) + (s.step >= 0 ? " at step " + std::to_string(s.step) : "");
      const std::string message = "alert " + rule.name + (holds ? ": " : " cleared: ") + rd.what + where;
      if (holds == (it != firing_.end())) {
        if (holds) {
          // The banner shows the latest figure, and for a rank rule the rank that is slowest now: the
          // rank that first crossed the bound (a start-up hiccup, say) may no longer be the one behind.
          it->second.value = rd.value;
          it->second.rank = rd.rank;
          it->second.message = message;
        }
        continue;
      }
      AlertTransition t{.change = holds ? AlertChange::kFired : AlertChange::kCleared,
                        .rule = &rule,
                        .rule_name = rule.name,
                        .run = s.run,
                        .step = s.step,
                        .value = rd.value,
                        .rank = rd.rank};
      t.message = message;
      if (holds) {
        firing_[key] = AlertFiring{.rule = rule.name,
                                   .run = s.run,
                                   .since_unix_s = now_unix_s,
                                   .value = rd.value,
                                   .rank = rd.rank,
                                   .message = t.message};
      } else {
        firing_.erase(it);
      }
      out.push_back(std::move(t));
    }
  }
  // Firings whose run ended or whose rule was deleted clear too: nothing is left firing for ever.
  for (auto it = firing_.begin(); it != firing_.end();) {
    if (seen.count(it->first)) {
      ++it;
      continue;
    }
    const bool rule_gone = std::none_of(rules.begin(), rules.end(),
                                        [&](const AlertRule& r) { return r.name == it->first.first; });
    AlertTransition t{.change = AlertChange::kCleared, .rule_name = it->first.first, .run = it->first.second};
    for (const AlertRule& r : rules) {
      if (r.name == t.rule_name) t.rule = &r;
    }
    t.message = "alert " + t.rule_name + " cleared on run " + std::to_string(t.run) + ": " +
                (rule_gone ? "the rule was deleted" : "the run is no longer live");
    out.push_back(std::move(t));
    it = firing_.erase(it);
  }
  return out;
}

std::vector<AlertFiring> AlertEvaluator::firing() const {
  std::vector<AlertFiring> out;
  for (const auto& [key, f] : firing_) out.push_back(f);
  return out;
}

}  // namespace gantry
