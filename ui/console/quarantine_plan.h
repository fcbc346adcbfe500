// What quarantining a node would do, and whether the console offers it: enabled only for a node holding a
// rank the coordinator flagged (or with the operator's explicit override), never for a node quarantined
// already or for the last healthy one (the coordinator refuses that too, docs/CLUSTER.md). The dialog names
// the runs and ranks that will move. Pure, so it is tested without ImGui.
//
//   QuarantinePlan p = quarantine_plan(snapshot, "node-1", override_ticked);
//   if (button("Quarantine node...", p.enabled)) ...;  else show(p.why_not);
#pragma once

#include <string>
#include <vector>

#include "ui/console/console_state.h"

namespace gantry::console {

struct QuarantinePlan {
  std::string node;
  bool enabled = false;
  bool flagged = false;            // a flagged rank of the followed run is on the node
  std::string why_not;             // when not enabled, in the operator's words
  std::vector<std::string> moves;  // "run 3 (tiny): ranks 2-3 checkpoint, stop and resume without node-1"
};

QuarantinePlan quarantine_plan(const ConsoleSnapshot& s, const std::string& node, bool override_unflagged);

}  // namespace gantry::console
