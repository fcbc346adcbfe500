#include "ui/console/layout_times.h"

#include <algorithm>
#include <map>
#include <utility>

namespace gantry::console {

std::string rank_coord_text(const RankView& r) {
  if (!r.coord) return "";
  return std::to_string(r.coord->dp) + "," + std::to_string(r.coord->pp) + "," + std::to_string(r.coord->tp);
}

std::string LayoutGroupTime::name() const {
  return dp < 0 ? "stage " + std::to_string(pp)
                : "tp group dp " + std::to_string(dp) + " pp " + std::to_string(pp);
}

namespace {

// The busy time the coordinator computed for the rank's latest record, where the rank has stepped.
std::optional<double> busy_of(const RankView& r) {
  if (r.latest.step <= 0 && r.last_step <= 0) return std::nullopt;
  return r.busy_seconds;
}

void add(LayoutGroupTime& g, const RankView& r) {
  g.ranks.push_back(r.rank);
  const std::optional<double> b = busy_of(r);
  if (b && (!g.busy_s || *b > *g.busy_s)) {
    g.busy_s = b;
    g.slowest_rank = r.rank;
  }
}

void mark_slowest(std::vector<LayoutGroupTime>& groups) {
  LayoutGroupTime* worst = nullptr;
  int timed = 0;
  for (LayoutGroupTime& g : groups) {
    std::sort(g.ranks.begin(), g.ranks.end());
    if (!g.busy_s) continue;
    ++timed;
    if (worst == nullptr || *g.busy_s > *worst->busy_s) worst = &g;
  }
  if (worst != nullptr && timed >= 2) worst->slowest = true;
}

}  // namespace

LayoutTimes layout_times(const std::vector<RankView>& ranks) {
  LayoutTimes t;
  for (const RankView& r : ranks) {
    if (!r.coord) continue;
    t.tp = std::max(t.tp, r.coord->tp + 1);
    t.pp = std::max(t.pp, r.coord->pp + 1);
  }
  std::map<int, LayoutGroupTime> stages;
  std::map<std::pair<int, int>, LayoutGroupTime> groups;
  for (const RankView& r : ranks) {
    if (!r.coord) continue;
    if (t.pp > 1) {
      LayoutGroupTime& s = stages[r.coord->pp];
      s.pp = r.coord->pp;
      add(s, r);
    }
    if (t.tp > 1) {
      LayoutGroupTime& g = groups[{r.coord->dp, r.coord->pp}];
      g.dp = r.coord->dp;
      g.pp = r.coord->pp;
      add(g, r);
    }
  }
  for (auto& [k, s] : stages) t.stages.push_back(std::move(s));
  for (auto& [k, g] : groups) t.tp_groups.push_back(std::move(g));
  mark_slowest(t.stages);
  mark_slowest(t.tp_groups);
  return t;
}

nlohmann::json layout_state_json(const ConsoleSnapshot& s) {
  using json = nlohmann::json;
  json ranks = json::array();
  for (const RankView& r : s.ranks) {
    ranks.push_back(
        {{"rank", r.rank},
         {"node", r.node},
         {"coord", r.coord ? json::array({r.coord->dp, r.coord->pp, r.coord->tp}) : json(nullptr)}});
  }
  const LayoutTimes t = layout_times(s.ranks);
  auto groups = [](const std::vector<LayoutGroupTime>& gs) {
    json out = json::array();
    for (const LayoutGroupTime& g : gs) {
      out.push_back({{"name", g.name()},
                     {"ranks", g.ranks},
                     {"busy_s", g.busy_s ? json(*g.busy_s) : json(nullptr)},
                     {"slowest_rank", g.slowest_rank},
                     {"slowest", g.slowest}});
    }
    return out;
  };
  return {{"dp", s.run.dp},
          {"tp", s.run.tp},
          {"pp", s.run.pp},
          {"zero", s.run.zero},
          {"ranks", ranks},
          {"stages", groups(t.stages)},
          {"tp_groups", groups(t.tp_groups)}};
}

}  // namespace gantry::console
