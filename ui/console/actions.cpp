#include "ui/console/actions.h"

namespace gantry::console {

std::string_view action_label(Action a) {
  switch (a) {
    case Action::checkpoint:
      return "Checkpoint now";
    case Action::pause:
      return "Pause";
    case Action::resume:
      return "Resume";
    case Action::stop:
      return "Stop";
    case Action::resume_from:
      return "Resume from checkpoint";
  }
  return "?";
}

std::string_view action_route(Action a) {
  switch (a) {
    case Action::checkpoint:
      return "checkpoint";
    case Action::pause:
      return "pause";
    case Action::resume:
      return "resume";
    case Action::stop:
      return "stop";
    case Action::resume_from:
      return "resume-from";
  }
  return "?";
}

ActionAvailability action_availability(Action a, std::string_view state, size_t committed_checkpoints,
                                       bool connected) {
  auto no = [](std::string why) { return ActionAvailability{.enabled = false, .why_not = std::move(why)}; };
  if (!connected) return no("not connected to the coordinator");
  if (state.empty()) return no("no run selected");
  const bool live = state == "running" || state == "paused";
  const bool ended = state == "finished" || state == "stopped" || state == "failed" || state == "interrupted";
  const std::string is = "the run is " + std::string(state);
  switch (a) {
    case Action::checkpoint:
    case Action::stop:
      return live ? ActionAvailability{true, ""} : no(is);
    case Action::pause:
      return state == "running" ? ActionAvailability{true, ""} : no(is + ", not running");
    case Action::resume:
      return state == "paused" ? ActionAvailability{true, ""} : no(is + ", not paused");
    case Action::resume_from:
      if (state != "stopped" && state != "failed" && state != "interrupted") {
        return no(ended ? is + ": only a stopped, failed or interrupted run resumes" : is + ": stop it first");
      }
      if (committed_checkpoints == 0) return no("the run has no committed checkpoint");
      return {true, ""};
  }
  return no("unknown action");
}

}  // namespace gantry::console
