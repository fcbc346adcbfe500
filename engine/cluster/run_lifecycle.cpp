#include "engine/cluster/run_lifecycle.h"

#include <string>

namespace gantry {
namespace {

constexpr std::string_view kStateNames[] = {"running", "paused",  "stopping",   "finished",
                                            "failed",  "stopped", "interrupted"};
constexpr std::string_view kActionNames[] = {"checkpoint", "pause",       "resume",
                                             "stop",       "resume-from", "quarantine"};
static_assert(std::size(kStateNames) == std::size(kRunStates));
static_assert(std::size(kActionNames) == std::size(kRunActions));

std::string it_is(RunState s) {
  return "it is " + std::string(run_state_name(s));
}

}  // namespace

std::string_view run_state_name(RunState s) {
  return kStateNames[static_cast<size_t>(s)];
}

std::optional<RunState> run_state_from_name(std::string_view name) {
  for (RunState s : kRunStates)
    if (run_state_name(s) == name) return s;
  return std::nullopt;
}

bool run_state_terminal(RunState s) {
  return s == RunState::kFinished || s == RunState::kFailed || s == RunState::kStopped ||
         s == RunState::kInterrupted;
}

bool run_state_terminal(std::string_view name) {
  const std::optional<RunState> s = run_state_from_name(name);
  return s && run_state_terminal(*s);
}

Status run_transition_check(RunState from, RunState to) {
  const std::string change =
      std::string(run_state_name(from)) + " -> " + std::string(run_state_name(to)) + ": ";
  if (from == to) return Status::error(change + "not a change of state");
  switch (from) {
    case RunState::kRunning:
    case RunState::kPaused:
      // A live run pauses or resumes (rank 0's word), is stopped, or ends in any way its gangs end.
      if (to == RunState::kRunning || to == RunState::kPaused || to == RunState::kStopping ||
          run_state_terminal(to))
        return Status();
      break;
    case RunState::kStopping:
      // A stop is not taken back: the run ends, or, when the stop was a quarantine's move, it runs elsewhere.
      if (to == RunState::kRunning || run_state_terminal(to)) return Status();
      return Status::error(change + "a stopping run checkpoints and ends (or moves); it does not pause");
    case RunState::kFinished:
      return Status::error(change + "a finished run is final");
    case RunState::kFailed:
    case RunState::kStopped:
    case RunState::kInterrupted:
      if (to == RunState::kRunning) return Status();  // resume-from
      return Status::error(change + "an ended run only runs again, from a checkpoint (resume-from)");
  }
  return Status::error(change + "not a change the lifecycle has");
}

std::string_view run_action_name(RunAction a) {
  return kActionNames[static_cast<size_t>(a)];
}

std::optional<RunAction> run_action_from_name(std::string_view name) {
  for (RunAction a : kRunActions)
    if (run_action_name(a) == name) return a;
  return std::nullopt;
}

Status run_action_check(RunAction a, RunState s) {
  if (a == RunAction::kResumeFrom) {
    if (s == RunState::kStopped || s == RunState::kFailed || s == RunState::kInterrupted) return Status();
    const char* only = "only a stopped, failed or interrupted run resumes from a checkpoint";
    if (run_state_terminal(s)) return Status::error(it_is(s) + " (" + only + ")");
    return Status::error(it_is(s) + ": stop it first (" + only + ")");
  }
  // Every other action is for a live run that is not already on its way out.
  if (run_state_terminal(s) || s == RunState::kStopping) return Status::error(it_is(s));
  if (a == RunAction::kPause && s == RunState::kPaused) return Status::error("it is already paused");
  if (a == RunAction::kResume && s != RunState::kPaused) return Status::error(it_is(s) + ", not paused");
  return Status();
}

std::optional<RunState> run_action_target(RunAction a) {
  switch (a) {
    case RunAction::kStop:
    case RunAction::kQuarantineMove:
      return RunState::kStopping;
    case RunAction::kResumeFrom:
      return RunState::kRunning;
    case RunAction::kCheckpoint:
    case RunAction::kPause:
    case RunAction::kResume:
      return std::nullopt;
  }
  return std::nullopt;
}

}  // namespace gantry
