// The alert banner's model: which alert rules fire now for the followed run, from its events (the
// coordinator's "alert" and "alert_cleared", docs/CLUSTER.md "Alerts"), replayed in order. Pure, so it is
// tested without ImGui; the console's toolbar draws it.
//
//   for (const FiringAlert& a : alerts_firing(snapshot.events)) draw(a.message);
#pragma once

#include <string>
#include <vector>

#include "ui/console/console_state.h"  // EventView

namespace gantry::console {

struct FiringAlert {
  std::string rule;
  int64_t run = 0;
  std::string message;  // the firing event's line: "alert slow_rank: rank 2's excess ... on run 3 at step 20"
  double since_unix_s = 0;
};

// Fired and not cleared since, oldest first: one entry per (rule, run), however many times it fired.
std::vector<FiringAlert> alerts_firing(const std::vector<EventView>& events);

}  // namespace gantry::console
