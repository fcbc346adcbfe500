// Which actions the console offers in which run state: the same answers the coordinator gives (a button
// is enabled exactly when the API would accept the request).
#include "ui/console/actions.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>
#include <string>

namespace gantry::console {
namespace {

std::string enabled_set(const std::string& state, size_t checkpoints = 1, bool connected = true) {
  std::string out;
  for (RunAction a : kActions) {
    const ActionAvailability av = action_availability(a, state, checkpoints, connected);
    if (av.enabled) {
      out += std::string(run_action_name(a)) + " ";
    } else {
      EXPECT_FALSE(av.why_not.empty())
          << run_action_name(a) << " in " << state << " is disabled without a reason";
    }
  }
  return out;
}

TEST(ActionAvailability, FollowsTheRunState) {
  EXPECT_EQ(enabled_set("running"), "checkpoint pause stop ");
  EXPECT_EQ(enabled_set("paused"), "checkpoint resume stop ");
  EXPECT_EQ(enabled_set("stopping"), "");
  EXPECT_EQ(enabled_set("finished"), "");
  EXPECT_EQ(enabled_set("stopped"), "resume-from ");
  EXPECT_EQ(enabled_set("failed"), "resume-from ");
  EXPECT_EQ(enabled_set("interrupted"), "resume-from ");
  EXPECT_EQ(enabled_set("archived"), "");  // a state this console does not know: nothing is offered
}

TEST(ActionAvailability, ResumeFromNeedsACommittedCheckpoint) {
  EXPECT_EQ(enabled_set("stopped", 0), "");
  const ActionAvailability a = action_availability(RunAction::kResumeFrom, "stopped", 0, true);
  EXPECT_NE(a.why_not.find("no committed checkpoint"), std::string::npos) << a.why_not;
}

TEST(ActionAvailability, NothingWithoutAConnectionOrARun) {
  EXPECT_EQ(enabled_set("running", 1, false), "");
  EXPECT_EQ(action_availability(RunAction::kPause, "running", 1, false).why_not,
            "not connected to the coordinator");
  EXPECT_EQ(enabled_set(""), "");
  EXPECT_EQ(action_availability(RunAction::kCheckpoint, "", 1, true).why_not, "no run selected");
}

// The reasons are the coordinator's own refusals (run_lifecycle.h), after the action's name.
TEST(ActionAvailability, ReasonsAreTheCoordinators) {
  EXPECT_EQ(action_availability(RunAction::kResume, "running", 1, true).why_not,
            "cannot resume: it is running, not paused");
  EXPECT_EQ(action_availability(RunAction::kPause, "paused", 1, true).why_not,
            "cannot pause: it is already paused");
  EXPECT_THAT(action_availability(RunAction::kResumeFrom, "running", 1, true).why_not,
              ::testing::StartsWith("cannot resume-from: it is running: stop it first"));
  for (RunAction a : kActions) {
    for (RunState st : kRunStates) {
      const Status api = run_action_check(a, st);
      const ActionAvailability av = action_availability(a, run_state_name(st), 1, true);
      EXPECT_EQ(av.enabled, api.ok()) << run_action_name(a) << " in " << run_state_name(st);
      if (!api.ok()) {
        EXPECT_THAT(av.why_not, ::testing::EndsWith(api.message()));
      }
    }
  }
  EXPECT_EQ(action_label(RunAction::kCheckpoint), "Checkpoint now");
}

}  // namespace
}  // namespace gantry::console
