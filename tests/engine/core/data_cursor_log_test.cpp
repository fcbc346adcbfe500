// The data-cursor log (engine/core/data_cursor_log.h): what ranks write, how a restart's or a rollback's
// replayed steps replace the lost ones, and the exactly-once check catching a skipped or a repeated batch.
#include "engine/core/data_cursor_log.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>
#include <string>

#include "engine/core/sampler.h"
#include "engine/core/train.h"
#include "tests/engine/core/small_config.h"
#include "tests/scratch_dir.h"

namespace gantry {
namespace {

using ::testing::HasSubstr;

constexpr int kGlobalBatch = 8;

// One rank's step as the train loop logs it: the sampler's samples of `batch` for that dp rank, the
// window of each made up from its index.
void log_step(DataCursorLog& log, int64_t step, uint64_t batch, int dp, int dp_rank) {
  const SampleRange r = sampler_micro_batch(batch, kGlobalBatch, dp, dp_rank, kGlobalBatch / dp, 0);
  for (uint64_t k = 0; k < r.count; ++k) log.add(r.first + k, (r.first + k) * 7 % 13);
  log.step_done(step, batch);
}

// A 2-rank run of `steps` steps from `from` (the batch of step s is s - 1, nothing skipped).
void log_gang(const std::string& dir, int64_t from, int64_t steps) {
  DataCursorLog r0(dir, 0, 2, 0, from), r1(dir, 1, 2, 1, from);
  for (int64_t s = from + 1; s <= steps; ++s) {
    log_step(r0, s, static_cast<uint64_t>(s - 1), 2, 0);
    log_step(r1, s, static_cast<uint64_t>(s - 1), 2, 1);
  }
}

TEST(DataCursorLog, ARestartsReplayedStepsReplaceTheLostOnes) {
  const std::string dir = testing_support::scratch_dir("log").string();
  log_gang(dir, 0, 7);   // steps 1..7, then "killed"
  log_gang(dir, 5, 10);  // restarted from the checkpoint at step 5: 6..10 again
  Result<DataCursorHistory> h = data_cursor_read(dir);
  ASSERT_TRUE(h.ok()) << h.error();
  EXPECT_EQ(h->starts, 4);
  EXPECT_EQ(h->lines, 2 * (7 + 5));
  ASSERT_EQ(h->steps.size(), 10u);
  for (const auto& [step, entries] : h->steps) {
    ASSERT_EQ(entries.size(), 2u) << "step " << step;
    EXPECT_EQ(entries[0].rank, 0);
    EXPECT_EQ(entries[1].first, static_cast<uint64_t>(step - 1) * kGlobalBatch + 4);
    EXPECT_EQ(entries[1].count, 4u);
  }
  EXPECT_TRUE(data_cursor_check(h.value(), 10, kGlobalBatch, {}).ok());
  // The same steps straight through: the same history, line for line.
  const std::string straight = testing_support::scratch_dir("straight").string();
  log_gang(straight, 0, 10);
  Result<DataCursorHistory> s = data_cursor_read(straight);
  ASSERT_TRUE(s.ok()) << s.error();
  EXPECT_EQ(s->steps, h->steps);
}

// A resume whose cursor was one batch ahead (a batch never read) or one behind (a batch read twice).
TEST(DataCursorLog, TheCheckNamesASkippedAndARepeatedBatch) {
  for (const int off : {+1, -1}) {
    const std::string dir = testing_support::scratch_dir(off > 0 ? "ahead" : "behind").string();
    log_gang(dir, 0, 5);
    {
      DataCursorLog r0(dir, 0, 2, 0, 5), r1(dir, 1, 2, 1, 5);
      for (int64_t s = 6; s <= 8; ++s) {
        log_step(r0, s, static_cast<uint64_t>(s - 1 + off), 2, 0);
        log_step(r1, s, static_cast<uint64_t>(s - 1 + off), 2, 1);
      }
    }
    Result<DataCursorHistory> h = data_cursor_read(dir);
    ASSERT_TRUE(h.ok()) << h.error();
    Status st = data_cursor_check(h.value(), 8, kGlobalBatch, {});
    ASSERT_FALSE(st.ok());
    EXPECT_THAT(st.message(), HasSubstr("step 6, rank 0 read batch"));
    EXPECT_THAT(st.message(), HasSubstr(off > 0 ? "(batches skipped)" : "(a batch seen again)"));
  }
}

// One rank reading the other's samples (a dp rank off by one), a missing step, a step past the end.
TEST(DataCursorLog, TheCheckNamesOverlapsAndGaps) {
  const std::string dir = testing_support::scratch_dir("overlap").string();
  {
    DataCursorLog r0(dir, 0, 2, 0, 0), r1(dir, 1, 2, 1, 0);
    log_step(r0, 1, 0, 2, 0);
    log_step(r1, 1, 0, 2, 0);  // rank 1 read dp rank 0's samples
  }
  Result<DataCursorHistory> h = data_cursor_read(dir);
  ASSERT_TRUE(h.ok()) << h.error();
  Status st = data_cursor_check(h.value(), 1, kGlobalBatch, {});
  ASSERT_FALSE(st.ok());
  EXPECT_THAT(st.message(),
              HasSubstr("step 1, dp rank 1 read samples from 0 where 4 was next (samples seen twice)"));

  const std::string gap = testing_support::scratch_dir("gap").string();
  log_gang(gap, 0, 3);
  h = data_cursor_read(gap);
  ASSERT_TRUE(h.ok()) << h.error();
  EXPECT_THAT(data_cursor_check(h.value(), 4, kGlobalBatch, {}).message(),
              HasSubstr("step 4: no rank logged it"));
  EXPECT_THAT(data_cursor_check(h.value(), 2, kGlobalBatch, {}).message(), HasSubstr("past step 2"));
}

// The step guard's rollback: the lines past the step it went back to are forgotten, and the batches it
// passed over are not expected again.
TEST(DataCursorLog, ARollbackForgetsItsStepsAndTheSkippedBatchesAreNotDue) {
  const std::string dir = testing_support::scratch_dir("rollback").string();
  {
    DataCursorLog log(dir, 0, 1, 0, 0);
    for (int64_t s = 1; s <= 8; ++s) log_step(log, s, static_cast<uint64_t>(s - 1), 1, 0);
    log.rolled_back(4);
    // Batches 6 and 7 (steps 7 and 8's) passed over: step 5 reads 4, 6 reads 5, 7 reads 8, ...
    const std::vector<SkippedBatches> skipped = {{6, 2}};
    for (int64_t s = 5; s <= 10; ++s)
      log_step(log, s, sampler_batch(static_cast<uint64_t>(s - 1), skipped), 1, 0);
  }
  Result<DataCursorHistory> h = data_cursor_read(dir);
  ASSERT_TRUE(h.ok()) << h.error();
  EXPECT_EQ(h->rollbacks, 1);
  EXPECT_EQ(h->steps.at(7)[0].batch, 8u);
  EXPECT_TRUE(data_cursor_check(h.value(), 10, kGlobalBatch, {{6, 2}}).ok());
  EXPECT_THAT(data_cursor_check(h.value(), 10, kGlobalBatch, {}).message(),
              HasSubstr("step 7, rank 0 read batch 8"));
}

// train.data_cursor_log = false: a run writes no log (the check then has nothing to read); true, the
// default: one line per step of the one rank, after its start line.
TEST(DataCursorLog, TheConfigSwitchTurnsTheRunsLogOff) {
  Config c = testing_support::small_config();
  c.train.max_steps = 3;
  for (bool on : {true, false}) {
    c.train.data_cursor_log = on;
    const std::string dir = testing_support::scratch_dir(on ? "cursor_on" : "cursor_off").string();
    ASSERT_TRUE(train_run(c, {.out_dir = dir}, nullptr).ok());
    const std::string path = dir + "/" + kDataCursorLogFile;
    if (!on) {
      EXPECT_FALSE(std::ifstream(path).good()) << path << " written with the log off";
      continue;
    }
    Result<DataCursorHistory> h = data_cursor_read(dir);
    ASSERT_TRUE(h.ok()) << h.error();
    EXPECT_EQ(h->steps.size(), 3u);
    EXPECT_EQ(h->starts, 1);
  }
}

TEST(DataCursorLog, AnUnreadableLineIsNamed) {
  const std::string dir = testing_support::scratch_dir("bad").string();
  log_gang(dir, 0, 2);
  std::ofstream(dir + "/" + kDataCursorLogFile, std::ios::app) << "{\"kind\":\"step\",\"step\":3}\n";
  Result<DataCursorHistory> h = data_cursor_read(dir);
  ASSERT_FALSE(h.ok());
  EXPECT_THAT(h.error(), HasSubstr("data_cursor.jsonl line 7"));
  EXPECT_FALSE(data_cursor_read(dir + "/nothing_here").ok());
}

}  // namespace
}  // namespace gantry
