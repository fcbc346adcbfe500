#include "ui/console/alert_banner.h"

#include <algorithm>
#include <nlohmann/json.hpp>

namespace gantry::console {

std::vector<FiringAlert> alerts_firing(const std::vector<EventView>& events) {
  std::vector<FiringAlert> out;
  for (const EventView& e : events) {
    const EventRecord& r = e.record;
    if (r.kind != "alert" && r.kind != "alert_cleared") continue;
    // The rule's name is in the payload; an event without one (not the coordinator's) is not an alert.
    const nlohmann::json p = nlohmann::json::parse(r.payload, nullptr, false);
    if (!p.is_object() || !p.contains("rule") || !p.at("rule").is_string()) continue;
    const std::string rule = p.at("rule").get<std::string>();
    auto same = [&](const FiringAlert& a) { return a.rule == rule && a.run == r.run_id; };
    std::erase_if(out, same);
    if (r.kind == "alert")
      out.push_back({.rule = rule, .run = r.run_id, .message = r.message, .since_unix_s = r.time_unix_s});
  }
  return out;
}

}  // namespace gantry::console
