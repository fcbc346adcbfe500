// Which actions the console offers in which run state: the same answers the coordinator gives (a button
// is enabled exactly when the API would accept the request).
#include <gtest/gtest.h>

#include <map>
#include <string>

#include "ui/console/actions.h"

namespace gantry::console {
namespace {

std::string enabled_set(const std::string& state, size_t checkpoints = 1, bool connected = true) {
  std::string out;
  for (Action a : kActions) {
    const ActionAvailability av = action_availability(a, state, checkpoints, connected);
    if (av.enabled) {
      out += std::string(action_route(a)) + " ";
    } else {
      EXPECT_FALSE(av.why_not.empty()) << action_route(a) << " in " << state << " is disabled without a reason";
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
}

TEST(ActionAvailability, ResumeFromNeedsACommittedCheckpoint) {
  EXPECT_EQ(enabled_set("stopped", 0), "");
  const ActionAvailability a = action_availability(Action::resume_from, "stopped", 0, true);
  EXPECT_NE(a.why_not.find("no committed checkpoint"), std::string::npos) << a.why_not;
}

TEST(ActionAvailability, NothingWithoutAConnectionOrARun) {
  EXPECT_EQ(enabled_set("running", 1, false), "");
  EXPECT_EQ(action_availability(Action::pause, "running", 1, false).why_not, "not connected to the coordinator");
  EXPECT_EQ(enabled_set(""), "");
  EXPECT_EQ(action_availability(Action::checkpoint, "", 1, true).why_not, "no run selected");
}

TEST(ActionAvailability, ReasonsNameTheState) {
  EXPECT_EQ(action_availability(Action::resume, "running", 1, true).why_not, "the run is running, not paused");
  EXPECT_EQ(action_availability(Action::pause, "paused", 1, true).why_not, "the run is paused, not running");
  EXPECT_EQ(action_availability(Action::resume_from, "running", 1, true).why_not, "the run is running: stop it first");
  EXPECT_EQ(action_label(Action::checkpoint), "Checkpoint now");
}

}  // namespace
}  // namespace gantry::console
