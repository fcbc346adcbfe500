#include "ui/console/goodput_view.h"

#include <cstdio>

namespace gantry::console {
namespace {

using json = nlohmann::json;

std::optional<double> number(const json& j, const char* key) {
  auto it = j.find(key);
  if (it == j.end() || !it->is_number()) return std::nullopt;
  return it->get<double>();
}

std::string text(const json& j, const char* key) {
  auto it = j.find(key);
  return it != j.end() && it->is_string() ? it->get<std::string>() : std::string();
}

}  // namespace

GoodputView goodput_from_json(const json& j) {
  GoodputView g;
  if (!j.is_object()) {
    g.error = "the coordinator's goodput reply is not a JSON object";
    return g;
  }
  g.have = true;
  g.known = j.value("known", false);
  g.why_unknown = text(j, "why_unknown");
  g.live = j.value("live", false);
  g.created_unix_s = number(j, "created_unix_s").value_or(0);
  g.end_unix_s = number(j, "end_unix_s").value_or(g.created_unix_s);
  g.wall_s = number(j, "wall_s").value_or(0);
  g.ettr = number(j, "ettr");
  if (auto s = j.find("seconds"); s != j.end() && s->is_object())
    for (int k = 0; k < kGoodputParts; ++k)
      g.seconds[static_cast<size_t>(k)] = number(*s, kGoodputNames[static_cast<size_t>(k)]);
  if (auto f = j.find("failures"); f != j.end() && f->is_array()) {
    for (const json& x : *f) {
      if (!x.is_object()) continue;
      g.failures.push_back({.generation = x.value("generation", 0),
                            .time_unix_s = number(x, "time_unix_s").value_or(0),
                            .kind = text(x, "kind"),
                            .node = text(x, "node"),
                            .message = text(x, "message"),
                            .fault = text(x, "fault"),
                            .detection_s = number(x, "detection_s").value_or(0),
                            .restore_s = number(x, "restore_s").value_or(0),
                            .recomputed_s = number(x, "recomputed_s").value_or(0),
                            .cost_s = number(x, "cost_s").value_or(0),
                            .recovered = x.value("recovered", false)});
    }
  }
  if (auto y = j.find("young_daly"); y != j.end() && y->is_object()) {
    g.checkpoint_cost_s = number(*y, "checkpoint_cost_s");
    g.mtbf_s = number(*y, "mtbf_s");
    g.interval_s = number(*y, "interval_s");
    if (std::optional<double> n = number(*y, "interval_steps")) g.interval_steps = static_cast<int64_t>(*n);
    g.interval_why = text(*y, "why_unknown");
    g.policy = text(*y, "policy");
    g.checkpoint_every_steps = static_cast<int64_t>(number(*y, "checkpoint_every_steps").value_or(0));
  }
  return g;
}

std::vector<GoodputBarPart> goodput_bar(const GoodputView& g) {
  std::vector<GoodputBarPart> out;
  if (!g.known || !(g.wall_s > 0)) return out;
  for (int k = 0; k < kGoodputParts; ++k) {
    const std::optional<double>& s = g.seconds[static_cast<size_t>(k)];
    if (!s || !(*s > 0)) continue;
    out.push_back({k, *s / g.wall_s});
  }
  return out;
}

std::string goodput_seconds_text(const std::optional<double>& s) {
  if (!s) return "unknown";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f s", *s);
  return buf;
}

}  // namespace gantry::console
