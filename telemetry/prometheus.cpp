#include "telemetry/prometheus.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <numeric>

namespace gantry {
namespace {

bool name_char(char c, bool first, bool colon_ok) {
  const bool alpha = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || (colon_ok && c == ':');
  return alpha || (!first && c >= '0' && c <= '9');
}

bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

// Suffixes that name a scaled unit: Prometheus wants base units (seconds, bytes, ratios 0–1, hertz).
constexpr std::string_view kScaledUnits[] = {
    "_ms",      "_us",    "_ns",      "_millis", "_milliseconds", "_micros",    "_microseconds",
    "_minutes", "_hours", "_percent", "_pct",    "_kb",           "_mb",        "_gb",
    "_tb",      "_kib",   "_mib",     "_gib",    "_megabytes",    "_gigabytes", "_mhz",
    "_ghz",     "_kw",    "_mw",      "_tflops"};

void append_value(std::string* out, double v) {
  if (std::isnan(v)) {
    *out += "NaN";
  } else if (std::isinf(v)) {
    *out += v > 0 ? "+Inf" : "-Inf";
  } else {
    char buf[32];
    // Whole numbers as integers ("500000", not the shorter "5e+05"): people read this page too.
    const bool whole = std::fabs(v) < 1e15 && v == std::trunc(v) && !(v == 0 && std::signbit(v));
    auto [p, ec] = whole ? std::to_chars(buf, buf + sizeof buf, static_cast<int64_t>(v))
                         : std::to_chars(buf, buf + sizeof buf, v);
    out->append(buf, p);
  }
}

void append_escaped(std::string* out, std::string_view s, bool quote_too) {
  for (char c : s) {
    if (c == '\\')
      *out += "\\\\";
    else if (c == '\n')
      *out += "\\n";
    else if (c == '"' && quote_too)
      *out += "\\\"";
    else
      out->push_back(c);
  }
}

}  // namespace

bool prometheus_name_ok(std::string_view name, MetricType type, std::string* why) {
  const auto no = [&](std::string s) {
    if (why) *why = "metric \"" + std::string(name) + "\": " + s;
    return false;
  };
  if (name.substr(0, 7) != "gantry_" || name.size() == 7) return no("must start with \"gantry_\"");
  for (size_t i = 0; i < name.size(); ++i) {
    if (!name_char(name[i], i == 0, true)) return no("invalid character");
  }
  if (type == MetricType::counter && !ends_with(name, "_total"))
    return no("a counter's name must end in \"_total\"");
  if (type == MetricType::gauge && ends_with(name, "_total")) return no("only counters end in \"_total\"");
  std::string_view stem = type == MetricType::counter ? name.substr(0, name.size() - 6) : name;
  for (std::string_view unit : kScaledUnits) {
    if (ends_with(stem, unit))
      return no("use base units (seconds, bytes, ratio, hertz, watts), not \"" + std::string(unit.substr(1)) +
                "\"");
  }
  return true;
}

bool PrometheusWriter::fail(std::string why) {
  if (error_.empty()) error_ = std::move(why);
  return false;
}

bool PrometheusWriter::family(std::string_view name, MetricType type, std::string_view help) {
  current_.clear();
  std::string why;
  if (!prometheus_name_ok(name, type, &why)) return fail(why);
  if (std::find(declared_.begin(), declared_.end(), name) != declared_.end()) {
    return fail("metric \"" + std::string(name) + "\" declared twice: a family's samples must be contiguous");
  }
  declared_.emplace_back(name);
  current_ = name;
  out_ += "# HELP ";
  out_ += name;
  out_ += ' ';
  append_escaped(&out_, help, false);
  out_ += "\n# TYPE ";
  out_ += name;
  out_ += type == MetricType::counter ? " counter\n" : " gauge\n";
  return true;
}

bool PrometheusWriter::sample(std::initializer_list<Label> labels, double value) {
  return sample(labels.begin(), labels.size(), value);
}

bool PrometheusWriter::sample(const std::vector<Label>& labels, double value) {
  return sample(labels.data(), labels.size(), value);
}

bool PrometheusWriter::sample(const Label* labels, size_t n, double value) {
  if (current_.empty()) return fail("sample without a valid family before it");
  for (size_t i = 0; i < n; ++i) {
    const std::string_view l = labels[i].name;
    bool valid = !l.empty() && l.substr(0, 2) != "__";
    for (size_t k = 0; valid && k < l.size(); ++k) valid = name_char(l[k], k == 0, false);
    if (!valid) return fail("metric \"" + current_ + "\": invalid label name \"" + std::string(l) + "\"");
    for (size_t k = 0; k < i; ++k) {
      if (labels[k].name == l)
        return fail("metric \"" + current_ + "\": label \"" + std::string(l) + "\" twice");
    }
  }
  out_ += current_;
  if (n > 0) {
    out_ += '{';
    for (size_t i = 0; i < n; ++i) {
      if (i) out_ += ',';
      out_ += labels[i].name;
      out_ += "=\"";
      append_escaped(&out_, labels[i].value, true);
      out_ += '"';
    }
    out_ += '}';
  }
  out_ += ' ';
  append_value(&out_, value);
  out_ += '\n';
  return true;
}

std::vector<size_t> prometheus_bounded_ranks(const std::vector<double>& seconds, size_t max_series) {
  std::vector<size_t> idx(seconds.size());
  std::iota(idx.begin(), idx.end(), size_t{0});
  const auto slower = [&](size_t a, size_t b) {
    const bool fa = std::isfinite(seconds[a]), fb = std::isfinite(seconds[b]);
    if (fa != fb) return fa;
    if (fa && seconds[a] != seconds[b]) return seconds[a] > seconds[b];
    return a < b;
  };
  const size_t k = std::min(max_series, idx.size());
  // O(ranks) selection, then sort only the k chosen: this runs on every scrape.
  std::nth_element(idx.begin(), idx.begin() + static_cast<std::ptrdiff_t>(k), idx.end(), slower);
  idx.resize(k);
  std::sort(idx.begin(), idx.end(), slower);
  return idx;
}

void prometheus_write_rank_steps(PrometheusWriter& w, const std::vector<RankStepRecord>& latest,
                                 size_t max_rank_series) {
  std::vector<double> totals(latest.size());
  for (size_t i = 0; i < latest.size(); ++i) totals[i] = latest[i].total_s;
  std::vector<size_t> chosen = prometheus_bounded_ranks(totals, max_rank_series);
  std::sort(chosen.begin(), chosen.end(),
            [&](size_t a, size_t b) { return latest[a].rank < latest[b].rank; });

  std::vector<std::string> rank_text(chosen.size());
  for (size_t i = 0; i < chosen.size(); ++i) rank_text[i] = std::to_string(latest[chosen[i]].rank);
  const auto per_rank = [&](std::string_view name, std::string_view help, auto value_of) {
    bool declared = false;
    for (size_t i = 0; i < chosen.size(); ++i) {
      const RankStepRecord& r = latest[chosen[i]];
      const std::optional<double> v = value_of(r);
      if (!v) continue;
      if (!declared) declared = w.family(name, MetricType::gauge, help);
      w.sample({{"rank", rank_text[i]}, {"host", r.host}}, *v);
    }
  };

  per_rank("gantry_rank_step_seconds", "Wall time of the latest step on this rank.",
           [](const RankStepRecord& r) { return std::optional<double>(r.total_s); });
  if (!chosen.empty()) {
    w.family("gantry_rank_phase_seconds", MetricType::gauge,
             "Time of the latest step on this rank spent in each phase (exposed communication only).");
    for (size_t i = 0; i < chosen.size(); ++i) {
      const RankStepRecord& r = latest[chosen[i]];
      for (int p = 0; p < kPhaseCount; ++p) {
        w.sample({{"rank", rank_text[i]}, {"host", r.host}, {"phase", phase_name(static_cast<Phase>(p))}},
                 r.phases.get(static_cast<Phase>(p)));
      }
    }
  }
  per_rank("gantry_rank_memory_allocated_bytes", "Memory held by this rank at the end of its latest step.",
           [](const RankStepRecord& r) {
             return std::optional<double>(static_cast<double>(r.mem_allocated_bytes));
           });
  per_rank(
      "gantry_rank_memory_peak_bytes", "Peak memory of this rank during its latest step.",
      [](const RankStepRecord& r) { return std::optional<double>(static_cast<double>(r.mem_peak_bytes)); });
  per_rank("gantry_rank_temperature_celsius", "GPU temperature (NVML).",
           [](const RankStepRecord& r) { return r.temperature_celsius; });
  per_rank("gantry_rank_sm_clock_hertz", "GPU SM clock (NVML).",
           [](const RankStepRecord& r) { return r.sm_clock_hertz; });
  per_rank("gantry_rank_power_watts", "GPU power draw (NVML).",
           [](const RankStepRecord& r) { return r.power_watts; });
  // Absent where the device's peak is unknown: no sample rather than a 0 that reads as idle hardware.
  per_rank("gantry_rank_mfu_ratio",
           "Model FLOP utilisation 0-1 of this rank's latest step (telemetry/flops.h).",
           [](const RankStepRecord& r) { return r.mfu; });
  per_rank("gantry_rank_hfu_ratio",
           "Hardware FLOP utilisation 0-1 of this rank's latest step, recomputation counted.",
           [](const RankStepRecord& r) { return r.hfu; });

  std::vector<double> finite;
  for (double t : totals) {
    if (std::isfinite(t)) finite.push_back(t);
  }
  w.family("gantry_ranks_reporting", MetricType::gauge, "Ranks whose latest step record is exposed here.");
  w.sample({}, static_cast<double>(latest.size()));
  w.family("gantry_rank_series_omitted", MetricType::gauge,
           "Ranks without their own labelled series (only the slowest are labelled, to bound cardinality).");
  w.sample({}, static_cast<double>(latest.size() - chosen.size()));
  if (!finite.empty()) {
    std::sort(finite.begin(), finite.end());
    const size_t n = finite.size();
    const double median = n % 2 ? finite[n / 2] : 0.5 * (finite[n / 2 - 1] + finite[n / 2]);
    w.family("gantry_step_seconds", MetricType::gauge, "Latest step wall time across all ranks.");
    w.sample({{"stat", "min"}}, finite.front());
    w.sample({{"stat", "median"}}, median);
    w.sample({{"stat", "max"}}, finite.back());
  }
}

void prometheus_write_step(PrometheusWriter& w, const StepRecord& s, std::string_view peak_name,
                           std::string_view mfu_formula, std::string_view hfu_formula) {
  const auto gauge = [&](std::string_view name, std::string_view help, double v) {
    w.family(name, MetricType::gauge, help);
    w.sample({}, v);
  };
  gauge("gantry_step", "Optimizer steps done.", static_cast<double>(s.step));
  gauge("gantry_loss", "Training loss of the latest step (mean over the global batch).", s.loss);
  gauge("gantry_grad_norm", "Global gradient L2 norm of the latest step, before clipping.", s.grad_norm);
  gauge("gantry_learning_rate", "Learning rate of the latest step.", s.lr);
  gauge("gantry_tokens_per_second", "Global training throughput of the latest step.", s.tokens_per_s);
  gauge("gantry_step_duration_seconds", "Wall time of the latest step.", s.step_s);
  if (s.val_loss) gauge("gantry_validation_loss", "Latest validation loss.", *s.val_loss);
  // An unknown utilisation (no peak) is left out, never exported as 0.
  if (s.mfu) {
    w.family("gantry_mfu_ratio", MetricType::gauge,
             "Model FLOP utilisation 0-1: " + std::string(mfu_formula));
    w.sample({{"peak", peak_name}}, *s.mfu);
  }
  if (s.hfu) {
    w.family("gantry_hfu_ratio", MetricType::gauge,
             "Hardware FLOP utilisation 0-1: " + std::string(hfu_formula));
    w.sample({{"peak", peak_name}}, *s.hfu);
  }
}

}  // namespace gantry
