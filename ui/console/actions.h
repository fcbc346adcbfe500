// Which operator actions the console offers for a run in a given state, and why the others are greyed
// out. The state's rules are the coordinator's own (engine/cluster/run_lifecycle.h): a button is enabled
// exactly when the API would accept the request; offering one the API would answer with 409 only teaches
// the operator to distrust the buttons. What the console adds: a connection, a followed run, and a
// committed checkpoint for resume-from.
//
//   ActionAvailability a = action_availability(RunAction::kResume, run.state, committed, connected);
//   ImGui::BeginDisabled(!a.enabled); ... if (!a.enabled) tooltip(a.why_not);
#pragma once

#include <string>
#include <string_view>

#include "engine/cluster/run_lifecycle.h"

namespace gantry::console {

// The actions of the Actions panel, in its order (a quarantine's move is the Stragglers panel's, by node).
inline constexpr RunAction kActions[] = {RunAction::kCheckpoint, RunAction::kPause, RunAction::kResume,
                                         RunAction::kStop, RunAction::kResumeFrom};

// The button's label: "Checkpoint now", "Pause", ... (the API's word is run_action_name).
std::string_view action_label(RunAction a);

struct ActionAvailability {
  bool enabled = false;
  std::string why_not;  // one line when !enabled
};

// run_state: the run's state as the API says it ("" = no run followed). committed_checkpoints: how many the
// run's catalog lists (resume-from needs one). connected: the coordinator answered its last request.
ActionAvailability action_availability(RunAction a, std::string_view run_state, size_t committed_checkpoints,
                                       bool connected);

}  // namespace gantry::console
