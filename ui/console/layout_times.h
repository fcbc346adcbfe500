// The run's 3D layout as the Cluster and Run panels show it (issue 17): each rank's (dp, pp, tp)
// coordinate from GET /v1/runs/{id}/ranks ("coord"), and per pipeline stage and per tensor-parallel group
// the busy time of its slowest rank's latest step, so a slow stage or a slow tp group shows. No ImGui: the
// panels draw it, --dump-state writes it, the unit tests check it.
//
//   LayoutTimes t = layout_times(snapshot.ranks);
//   for (const LayoutGroupTime& g : t.stages) ...   // "stage 1: 41.2 ms (rank 3)", g.slowest marks one
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>  // --dump-state's "layout"
#include <optional>
#include <string>
#include <vector>

#include "ui/console/console_state.h"

namespace gantry::console {

// "1,0,1" (dp, pp, tp); "" when the coordinator sent no coordinate (an older one).
std::string rank_coord_text(const RankView& r);

struct LayoutGroupTime {
  int dp = -1;  // a tp group's dp coordinate; -1 for a pipeline stage (it spans every dp replica)
  int pp = 0;
  std::vector<int32_t> ranks;  // in rank order
  // The busy time (data wait + forward + backward + optimizer) of the group's slowest rank in its latest
  // step record; none while no rank of the group has reported a step (shown as unknown, never 0).
  std::optional<double> busy_s;
  int32_t slowest_rank = -1;
  bool slowest = false;      // the slowest of its kind, where there are two or more groups with a time
  std::string name() const;  // "stage 1" or "tp group dp 1 pp 0"
};

struct LayoutTimes {
  int tp = 1, pp = 1;                      // the degrees, from the coordinates seen
  std::vector<LayoutGroupTime> stages;     // one per pipeline stage, when pp > 1
  std::vector<LayoutGroupTime> tp_groups;  // one per (dp, pp), when tp > 1
};

LayoutTimes layout_times(const std::vector<RankView>& ranks);

// For --dump-state: the run's degrees, each rank's coordinate ([dp, pp, tp] or null) and node, and the
// stages' and tp groups' times ({name, ranks, busy_s (null: unknown), slowest_rank, slowest}).
nlohmann::json layout_state_json(const ConsoleSnapshot& s);

}  // namespace gantry::console
