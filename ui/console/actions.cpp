#include "ui/console/actions.h"

namespace gantry::console {

std::string_view action_label(RunAction a) {
  switch (a) {
    case RunAction::kCheckpoint:
      return "Checkpoint now";
    case RunAction::kPause:
      return "Pause";
    case RunAction::kResume:
      return "Resume";
    case RunAction::kStop:
      return "Stop";
    case RunAction::kResumeFrom:
      return "Resume from checkpoint";
    case RunAction::kQuarantineMove:
      return "Quarantine";
  }
  return "?";
}

ActionAvailability action_availability(RunAction a, std::string_view state, size_t committed_checkpoints,
                                       bool connected) {
  auto no = [](std::string why) { return ActionAvailability{.enabled = false, .why_not = std::move(why)}; };
  if (!connected) return no("not connected to the coordinator");
  if (state.empty()) return no("no run selected");
  const std::optional<RunState> s = run_state_from_name(state);
  if (!s) return no("the run's state \"" + std::string(state) + "\" is not one this console knows");
  if (Status check = run_action_check(a, *s); !check.ok()) {
    return no("cannot " + std::string(run_action_name(a)) + ": " + check.message());
  }
  if (a == RunAction::kResumeFrom && committed_checkpoints == 0)
    return no("the run has no committed checkpoint");
  return {true, ""};
}

}  // namespace gantry::console
