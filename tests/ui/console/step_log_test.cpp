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

RankStepRecord cell(int64_t step, int rank, double seconds) {
  return {.step = step, .rank = rank, .total_s = seconds};
}

TEST(RankStepGrid, CompleteThroughWaitsForEveryRank) {
  RankStepGrid g(RankTimeMetric::kTotal);
  EXPECT_EQ(g.complete_through(2), 0);
  // Node 0's batch (ranks 0, 1) of steps 1..3 arrives before node 1's (ranks 2, 3).
  g.add(
      {cell(1, 0, 0.1), cell(1, 1, 0.1), cell(2, 0, 0.1), cell(2, 1, 0.1), cell(3, 0, 0.1), cell(3, 1, 0.1)});
  EXPECT_EQ(g.complete_through(2), 3);
  EXPECT_EQ(g.complete_through(4), 0);  // ranks 2 and 3 have never reported
  g.add({cell(1, 2, 0.2), cell(1, 3, 0.3), cell(2, 2, 0.2)});
  EXPECT_EQ(g.complete_through(4), 1);
  EXPECT_TRUE(std::isnan(g.at(2, 3)));
  g.add({cell(2, 3, 0.5), cell(3, 2, 0.2), cell(3, 3, 0.9)});
  EXPECT_EQ(g.complete_through(4), 3);
  EXPECT_FLOAT_EQ(g.at(3, 3), 0.9f);
  // A repeat of a cell (an overlapping answer) keeps one value, not two rows.
  g.add({cell(3, 3, 0.9)});
  EXPECT_EQ(g.rows(), 3u);
  EXPECT_EQ(g.latest()[3].step, 3);
  EXPECT_DOUBLE_EQ(g.latest()[3].total_s, 0.9);
}

TEST(RankStepGrid, RewindDropsRowsAndLatest) {
  RankStepGrid g(RankTimeMetric::kTotal);
  for (int64_t s = 1; s <= 5; ++s) g.add({cell(s, 0, 0.1 * static_cast<double>(s)), cell(s, 1, 0.1)});
  g.rewind(3);
  EXPECT_EQ(g.last_step(), 3);
  EXPECT_EQ(g.complete_through(2), 3);
  EXPECT_EQ(g.latest()[0].step, 0);  // its latest record was past the rewind
  g.add({cell(4, 0, 1.0), cell(4, 1, 1.0)});
  EXPECT_EQ(g.complete_through(2), 4);
  EXPECT_FLOAT_EQ(g.at(4, 0), 1.0f);
}

// A published snapshot is a copy of the grid: the copy shares the grid's chunks of rows (no cell is copied),
// and later writes to the grid, a new step, a late cell, a rewind, copy only the chunk they land in, leaving
// the snapshot as it was.
TEST(RankStepGrid, CopiesShareChunksAndKeepTheirCells) {
  RankStepGrid g(RankTimeMetric::kTotal);
  const int64_t steps = 3 * static_cast<int64_t>(RankStepGrid::kRowsPerChunk);
  for (int64_t s = 1; s <= steps; ++s) g.add({cell(s, 0, 1.0), cell(s, 1, 2.0)});
  ASSERT_EQ(g.chunks(), 3u);
  const RankStepGrid snapshot = g;
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(snapshot.chunk_data(i), g.chunk_data(i));

  g.add({cell(steps + 1, 0, 5.0), cell(2, 1, 7.0)});  // a new chunk, and a write into the first
  ASSERT_EQ(g.chunks(), 4u);
  EXPECT_NE(snapshot.chunk_data(0), g.chunk_data(0));  // copied on write
  EXPECT_EQ(snapshot.chunk_data(1), g.chunk_data(1));  // untouched: still shared
  EXPECT_EQ(snapshot.chunk_data(2), g.chunk_data(2));
  EXPECT_FLOAT_EQ(g.at(2, 1), 7.0f);
  EXPECT_FLOAT_EQ(snapshot.at(2, 1), 2.0f);
  EXPECT_TRUE(std::isnan(snapshot.at(steps + 1, 0)));
  EXPECT_EQ(snapshot.rows(), static_cast<size_t>(steps));

  // Writing the copied chunk again does not copy it again: nobody else holds it.
  const float* first = g.chunk_data(0);
  g.add({cell(3, 1, 8.0)});
  EXPECT_EQ(g.chunk_data(0), first);

  // A rewind into a shared chunk leaves the snapshot's rows there; the grid's come back unreported.
  const RankStepGrid before_rewind = g;
  g.rewind(300);
  EXPECT_EQ(g.last_step(), 300);
  EXPECT_EQ(g.chunks(), 2u);
  EXPECT_FLOAT_EQ(before_rewind.at(301, 0), 1.0f);
  g.add({cell(302, 0, 4.0)});
  EXPECT_TRUE(std::isnan(g.at(301, 0)));  // not reported again yet
  EXPECT_EQ(g.complete_through(2), 300);
  EXPECT_FLOAT_EQ(before_rewind.at(302, 0), 1.0f);

  // A wider grid (a rank beyond all seen) lays every chunk out again, the snapshot keeping its own.
  g.add({cell(1, 5, 3.0)});
  EXPECT_EQ(g.width(), 6);
  EXPECT_FLOAT_EQ(g.at(1, 5), 3.0f);
  EXPECT_FLOAT_EQ(g.at(2, 1), 7.0f);
  EXPECT_EQ(before_rewind.width(), 2);
}

}  // namespace
}  // namespace gantry::console
