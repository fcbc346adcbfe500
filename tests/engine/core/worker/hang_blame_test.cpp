// Naming the rank a hung gang waited for: each kind of evidence, in its order of strength, and the state
// of a real stopped process read from /proc.
#include "engine/core/worker/hang_blame.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

namespace gantry {
namespace {

using namespace std::chrono_literals;
using ::testing::HasSubstr;

// Four ranks of a gang that was stepping normally: beating every 750 ms, in collective #40.
std::vector<RankWatch> healthy_gang() {
  std::vector<RankWatch> w;
  for (int r = 0; r < 4; ++r) {
    w.push_back({.rank = r,
                 .pid = 1000 + r,
                 .running = true,
                 .process_state = 'S',
                 .has_heartbeat = true,
                 .last = {.step = 5,
                          .phase = TrainPhase::kStep,
                          .collectives = 40,
                          .in_collective = true,
                          .interval_ms = 750,
                          .timeout_ms = 3000},
                 .silent_for = 200ms});
  }
  return w;
}

TEST(HangBlame, NobodyStandsOutInAHealthyGang) {
  EXPECT_TRUE(hang_blame(healthy_gang()).empty());
}

TEST(HangBlame, AStoppedProcessIsTheCulprit) {
  std::vector<RankWatch> w = healthy_gang();
  w[1].running = false;  // the rank that timed out and exited
  w[1].last.timed_out = true;
  w[2].process_state = 'T';
  w[2].silent_for = 3400ms;
  w[2].last.collectives = 39;
  w[2].last.in_collective = false;
  std::vector<HangCulprit> c = hang_blame(w);
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].rank, 2);
  EXPECT_THAT(c[0].reason, HasSubstr("its process is stopped (state T in /proc/1002/stat"));
  EXPECT_THAT(c[0].reason,
              HasSubstr("3.4 s before the gang failed, was at step 5 (step), after collective #39"));
}

TEST(HangBlame, SilentHeartbeatsNameTheRankWhenItsStateIsUnknown) {
  std::vector<RankWatch> w = healthy_gang();
  w[3].process_state = 0;    // on another node
  w[3].silent_for = 2600ms;  // more than 3 intervals (2.25 s) and half the timeout (1.5 s)
  std::vector<HangCulprit> c = hang_blame(w);
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].rank, 3);
  EXPECT_THAT(c[0].reason, HasSubstr("its heartbeats stopped"));
  w[3].silent_for = 2000ms;  // late, but not past three intervals: not evidence
  EXPECT_TRUE(hang_blame(w).empty());
}

TEST(HangBlame, ARankThatNeverEnteredTheCollectiveIsNamedOnlyWhenOneTimedOut) {
  std::vector<RankWatch> w = healthy_gang();
  w[0].last.collectives = 37;  // still beating, stuck before collective #38 (its forward pass, its data)
  w[0].last.in_collective = false;
  EXPECT_TRUE(hang_blame(w).empty()) << "a rank a collective behind is only stepping; no one gave up on it";
  w[2].last.timed_out = true;
  std::vector<HangCulprit> c = hang_blame(w);
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].rank, 0);
  EXPECT_THAT(c[0].reason, HasSubstr("never entered collective #40"));
}

TEST(HangBlame, ProcessStateOfARealStoppedChild) {
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    for (;;) ::pause();
  }
  ASSERT_EQ(::kill(child, SIGSTOP), 0);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, WUNTRACED), child);  // returns once it has stopped
  ASSERT_TRUE(WIFSTOPPED(status));
  EXPECT_EQ(hang_process_state(child), 'T');
  ::kill(child, SIGKILL);
  ::waitpid(child, &status, 0);
  EXPECT_EQ(hang_process_state(child), 0) << "a reaped process has no /proc entry";
}

}  // namespace
}  // namespace gantry
