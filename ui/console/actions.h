// Which operator actions the console offers for a run in a given state, and why the others are greyed
// out. The rules mirror the coordinator's (docs/CLUSTER.md, "Actions"): offering a button the API would
// answer with 409 only teaches the operator to distrust the buttons.
//
//   ActionAvailability a = action_availability(Action::resume, run.state, snapshot.checkpoints.size(), connected);
//   ImGui::BeginDisabled(!a.enabled); ... if (!a.enabled) tooltip(a.why_not);
#pragma once

#include <string>
#include <string_view>

namespace gantry::console {

enum class Action { checkpoint, pause, resume, stop, resume_from };
inline constexpr Action kActions[] = {Action::checkpoint, Action::pause, Action::resume, Action::stop,
                                      Action::resume_from};

// The button's label ("Checkpoint now", "Pause", ...) and the API's word ("checkpoint", ...,
// "resume-from": the route's last segment).
std::string_view action_label(Action a);
std::string_view action_route(Action a);

struct ActionAvailability {
  bool enabled = false;
  std::string why_not;  // one line when !enabled
};

// run_state: the run's state from the API ("" = no run followed). committed_checkpoints: how many the
// run's catalog lists (resume-from needs one). connected: the coordinator answered its last request.
ActionAvailability action_availability(Action a, std::string_view run_state, size_t committed_checkpoints,
                                       bool connected);

}  // namespace gantry::console
