// The followed run's goodput ledger as the console shows it (GET /v1/runs/{id}/goodput, docs/CLUSTER.md
// "Goodput"): the seconds of each category, ETTR, the failures with their cost, and the Young/Daly
// interval. A figure the coordinator does not know stays unknown here (an empty optional), never 0, and the
// bar is drawn only from known figures.
//
//   GoodputView g = goodput_from_json(reply);
//   for (const GoodputBarPart& p : goodput_bar(g)) draw a rect p.fraction wide in p's colour
#pragma once

#include <array>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

namespace gantry::console {

inline constexpr int kGoodputParts = 7;
// In the coordinator's order (engine/cluster/goodput.h): productive first, so the bar starts with it.
inline constexpr std::array<const char*, kGoodputParts> kGoodputNames = {
    "productive", "checkpoint_stall", "detection", "restore", "recomputed", "paused", "waiting"};

struct GoodputFailureView {
  int generation = 0;
  double time_unix_s = 0;
  std::string kind, node, message, fault;  // fault: the injected one, "" = none known
  double detection_s = 0, restore_s = 0, recomputed_s = 0, cost_s = 0;
  bool recovered = false;
};

struct GoodputView {
  bool have = false;  // a reply arrived for the followed run
  std::string error;  // why there is none ("" when have)
  bool known = false;
  std::string why_unknown;
  bool live = false;
  double created_unix_s = 0, end_unix_s = 0, wall_s = 0;
  std::optional<double> ettr;
  std::array<std::optional<double>, kGoodputParts> seconds;
  std::vector<GoodputFailureView> failures;
  // Young/Daly
  std::optional<double> checkpoint_cost_s, mtbf_s, interval_s;
  std::optional<int64_t> interval_steps;
  std::string interval_why;  // why interval_s is unknown
  std::string policy;        // "fixed" or "young_daly"
  int64_t checkpoint_every_steps = 0;
};

GoodputView goodput_from_json(const nlohmann::json& j);

struct GoodputBarPart {
  int category = 0;  // index into kGoodputNames
  double fraction = 0;
};
// The bar's parts, each category's share of the wall, in kGoodputNames' order, zero-width ones left out;
// empty when the ledger or the wall is unknown.
std::vector<GoodputBarPart> goodput_bar(const GoodputView& g);

// "12.34 s", or "unknown".
std::string goodput_seconds_text(const std::optional<double>& s);

}  // namespace gantry::console
