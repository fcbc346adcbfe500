// The model's catch-up arithmetic: steps asked for "after N" arrive overlapping, repeated and out of
// order (retries, reconnects, a poll racing an event); the log must hold each step once, in order, and
// the rank grid must know which steps every rank has reported.
#include "ui/console/step_log.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

namespace gantry::console {
namespace {

std::vector<StepRecord> steps(int64_t first, int64_t last) {
  std::vector<StepRecord> out;
  for (int64_t s = first; s <= last; ++s)
    out.push_back({.step = s, .loss = 10.0 - static_cast<double>(s) / 10});
  return out;
}

std::vector<int64_t> held(const StepLog& log) {
  std::vector<int64_t> out;
  for (const StepRecord& r : log.records()) out.push_back(r.step);
  return out;
}

std::vector<int64_t> range(int64_t a, int64_t b) {
  std::vector<int64_t> out;
  for (int64_t s = a; s <= b; ++s) out.push_back(s);
  return out;
}

TEST(StepLog, OverlappingAnswersAppendEachStepOnceInOrder) {
  StepLog log;
  EXPECT_EQ(log.last_step(), 0);
  EXPECT_EQ(log.append(steps(1, 5)), 5u);
  // The next poll asked "after 3" (the rank grid lagged): 4 and 5 again, then new ones.
  EXPECT_EQ(log.append(steps(4, 9)), 4u);
  // A retry of an old answer changes nothing.
  EXPECT_EQ(log.append(steps(1, 9)), 0u);
  EXPECT_EQ(held(log), range(1, 9));
  EXPECT_EQ(log.gap_steps(), 0);
  EXPECT_EQ(log.columns().size(), 9u);
  EXPECT_DOUBLE_EQ(log.columns().loss[8], 10.0 - 0.9);
  EXPECT_DOUBLE_EQ(log.columns().step[8], 9.0);
}

TEST(StepLog, OutOfOrderAndRepeatedRecordsWithinOneAnswer) {
  StepLog log;
  std::vector<StepRecord> mixed = steps(1, 6);
  std::vector<StepRecord> again = steps(2, 4);
  mixed.insert(mixed.begin(), again.rbegin(), again.rend());
  EXPECT_EQ(log.append(mixed), 6u);
  EXPECT_EQ(held(log), range(1, 6));
}

TEST(StepLog, ACatchUpAfterADisconnectContinuesWithoutAGap) {
  StepLog log;
  log.append(steps(1, 20));
  // Disconnected while the run went on to step 57; the reconnect asks "after 20" and gets pages of at
  // most 16 steps.
  for (int64_t after = log.last_step(); after < 57; after = log.last_step()) {
    ASSERT_GT(log.append(steps(after + 1, std::min<int64_t>(after + 16, 57))), 0u);
  }
  EXPECT_EQ(held(log), range(1, 57));
  EXPECT_EQ(log.gap_steps(), 0);
}

TEST(StepLog, MissingStepsAreCountedAndRewindForgetsTheTail) {
  StepLog log;
  log.append(steps(1, 3));
  log.append(steps(7, 8));  // the server has nothing for 4..6
  EXPECT_EQ(held(log), (std::vector<int64_t>{1, 2, 3, 7, 8}));
  EXPECT_EQ(log.gap_steps(), 3);
  // The run resumed from a checkpoint at step 2: 3.. are trained again.
  log.rewind(2);
  EXPECT_EQ(held(log), range(1, 2));
  EXPECT_EQ(log.columns().size(), 2u);
  EXPECT_EQ(log.append(steps(1, 4)), 2u);
  EXPECT_EQ(held(log), range(1, 4));
}

}  // namespace
}  // namespace gantry::console
