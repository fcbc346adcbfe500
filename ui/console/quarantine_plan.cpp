#include "ui/console/quarantine_plan.h"

#include <algorithm>

#include "ui/console/stragglers.h"

namespace gantry::console {

QuarantinePlan quarantine_plan(const ConsoleSnapshot& s, const std::string& node, bool override_unflagged) {
  QuarantinePlan p;
  p.node = node;
  const auto it =
      std::find_if(s.nodes.begin(), s.nodes.end(), [&](const NodeView& n) { return n.id == node; });
  // The followed run's ranks on the node (its live shares), and whether the coordinator flagged one.
  std::vector<int> ranks;
  for (const ShareView& sh : s.run.placement) {
    if (sh.node != node || sh.done) continue;
    for (int k = 0; k < sh.ranks; ++k) ranks.push_back(sh.first_rank + k);
  }
  for (const StragglerRow& r : straggler_rows(s.ranks))
    p.flagged = p.flagged || (r.flagged && r.node == node);
  if (!ranks.empty()) {
    const std::string span =
        ranks.size() == 1 ? "rank " + std::to_string(ranks.front())
                          : "ranks " + std::to_string(ranks.front()) + "-" + std::to_string(ranks.back());
    p.moves.push_back("run " + std::to_string(s.run.id) +
                      (s.run.name.empty() ? "" : " (" + s.run.name + ")") + ": " + span +
                      " checkpoint, stop and resume without " + node);
  }
  if (it != s.nodes.end()) {
    for (int64_t run : it->runs) {
      if (run == s.run.id) continue;
      p.moves.push_back("run " + std::to_string(run) + ": its ranks on " + node +
                        " checkpoint, stop and resume without it");
    }
  }
  auto usable = [](const NodeView& n) { return n.state == "healthy" || n.state == "spare"; };
  const bool other_usable = std::any_of(s.nodes.begin(), s.nodes.end(),
                                        [&](const NodeView& n) { return n.id != node && usable(n); });
  if (!s.connected) {
    p.why_not = "not connected";
  } else if (node.empty() || it == s.nodes.end()) {
    p.why_not = "no node chosen";
  } else if (it->state == "quarantined") {
    p.why_not = node + " is quarantined already (Release it in the Cluster panel)";
  } else if (usable(*it) && !other_usable) {
    p.why_not = node + " is the last healthy node: nothing could run without it";
  } else if (!p.flagged && !override_unflagged) {
    p.why_not = "no rank on " + node + " is flagged as a straggler (tick Override to quarantine it anyway)";
  } else {
    p.enabled = true;
  }
  return p;
}

}  // namespace gantry::console
