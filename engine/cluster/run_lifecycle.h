// A run's lifecycle, in one place: its states, the changes between them the coordinator may make, and
// which operator actions each state takes, with the refusal an operator reads. The coordinator keeps every
// run's state as a RunState and asks here before each change and each action; the console enables its
// buttons from the same answers, so a button is enabled exactly when the API would accept the request.
// The standard library only (no HTTP, no engine): the console links it without the server.
//
//   running ─pause─▶ paused ─resume─▶ running          (rank 0's word that the gang paused or resumed)
//   running | paused ─stop / quarantine's move─▶ stopping
//   running | paused | stopping ─▶ finished | failed | stopped | interrupted   (the gangs ended)
//   stopping ─▶ running                                  (a move: placed again without the node)
//   failed | stopped | interrupted ─resume-from─▶ running  (finished is final)
//
//   if (Status s = run_action_check(RunAction::kPause, r.state); !s.ok())
//     return HttpResponse::error(409, "cannot pause run 3: " + s.message());   // "... it is already paused"
//   std::optional<RunState> st = run_state_from_name(json.at("state"));       // the API's words
#pragma once

#include <optional>
#include <string_view>

#include "telemetry/status.h"

namespace gantry {

// A run's state. The API, the events and the metrics spell each with run_state_name's lower-case word.
enum class RunState {
  kRunning,      // training (or being placed: its gangs are starting)
  kPaused,       // rank 0 paused the gang at a step boundary; it holds its place
  kStopping,     // a stop (the operator's or a quarantine's move) was asked for: it checkpoints and ends
  kFinished,     // reached max_steps: final
  kFailed,       // a gang failed, or it could not be placed again
  kStopped,      // stopped in order, after a checkpoint
  kInterrupted,  // was live when its coordinator or an agent went away
};
inline constexpr RunState kRunStates[] = {RunState::kRunning,    RunState::kPaused, RunState::kStopping,
                                          RunState::kFinished,   RunState::kFailed, RunState::kStopped,
                                          RunState::kInterrupted};

// "running", "paused", "stopping", "finished", "failed", "stopped", "interrupted".
std::string_view run_state_name(RunState s);
// The inverse; nullopt for a word that is not a state (e.g. a newer coordinator's).
std::optional<RunState> run_state_from_name(std::string_view name);

// Ended: finished, failed, stopped or interrupted. The others are live (they hold slots).
bool run_state_terminal(RunState s);
// The same for the API's word; an unknown word is not terminal (nothing is assumed of it).
bool run_state_terminal(std::string_view name);

// Whether the coordinator may change a run from `from` to `to` (the diagram above); the error says why
// not: "a finished run is final". Staying in the same state is not a change and is refused too.
Status run_transition_check(RunState from, RunState to);

// What an operator (or the coordinator on its behalf) asks of a run.
enum class RunAction {
  kCheckpoint,      // checkpoint now
  kPause,           // pause at the next step boundary
  kResume,          // resume a paused run
  kStop,            // checkpoint, then stop
  kResumeFrom,      // go on from one of its checkpoints (a new placement, maybe a new layout)
  kQuarantineMove,  // a node it runs on was quarantined: stop, then move
};
inline constexpr RunAction kRunActions[] = {RunAction::kCheckpoint, RunAction::kPause,
                                            RunAction::kResume,     RunAction::kStop,
                                            RunAction::kResumeFrom, RunAction::kQuarantineMove};

// The API's word, the route's last segment for the run's own actions: "checkpoint", "pause", "resume",
// "stop", "resume-from", "quarantine".
std::string_view run_action_name(RunAction a);
std::optional<RunAction> run_action_from_name(std::string_view name);

// Whether a run in state `s` takes action `a`; the error is the reason, phrased to follow "cannot <do> run
// N: ": "it is stopping", "it is already paused", "it is running, not paused", "it is running: stop it first
// (only a stopped, failed or interrupted run resumes from a checkpoint)".
Status run_action_check(RunAction a, RunState s);

// The state the coordinator puts the run in when it accepts `a` (kStopping for a stop or a move, kRunning for
// resume-from); nullopt when the state changes later, on rank 0's word (pause, resume) or never (checkpoint).
std::optional<RunState> run_action_target(RunAction a);

}  // namespace gantry
