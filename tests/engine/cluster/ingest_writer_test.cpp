// The coordinator's database writer on a real run database (storage/HistoryDb in a temporary folder):
// many agents' batches land in fewer transactions than batches, closures run in queue order among them,
// the queue refuses agents' records past its bound but never the coordinator's own, a batch the database
// refuses loses only itself, and flush() makes everything queued before it readable.
#include "engine/cluster/ingest_writer.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <memory>
#include <thread>
#include <vector>

#include "tests/scratch_dir.h"

namespace gantry {
namespace {

namespace fs = std::filesystem;

class IngestWriterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing_support::scratch_dir("writer");
    std::string error;
    db_ = HistoryDb::open((dir_ / "cluster.sqlite").string(), {}, &error);
    ASSERT_TRUE(db_) << error;
    run_ = db_->begin_run({.name = "r", .world_size = 8});
    ASSERT_GT(run_, 0) << db_->error();
  }
  void TearDown() override {
    db_.reset();
    fs::remove_all(dir_);
  }

  // One node's beat: `ranks` rank-step records of `step` from rank `first` on.
  RecordBatch beat(int64_t step, int first, int ranks) const {
    RecordBatch b;
    for (int r = first; r < first + ranks; ++r)
      b.rank_steps.push_back({.run_id = run_,
                              .step = step,
                              .rank = r,
                              .host = "node-" + std::to_string(first / 4),
                              .total_s = 0.1});
    if (first == 0) b.steps.push_back({.run_id = run_, .step = step, .time_unix_s = 1.7e9, .loss = 3.0});
    return b;
  }
  size_t steps_in_db() {
    std::vector<StepRecord> st;
    std::lock_guard<std::mutex> lock(db_mu_);
    EXPECT_TRUE(db_->read_steps(run_, 0, kStepEnd, 100000, &st)) << db_->error();
    return st.size();
  }

  fs::path dir_;
  std::unique_ptr<HistoryDb> db_;
  std::mutex db_mu_;
  int64_t run_ = 0;
};

TEST_F(IngestWriterTest, ManyAgentsBatchesShareTransactions) {
  IngestWriter w(db_.get(), &db_mu_);
  // Hold the database while 8 agents queue 50 beats each: the writer then finds them all queued at once.
  std::unique_lock<std::mutex> hold(db_mu_);
  w.push_op([](HistoryDb&) {});  // the writer takes this first and waits for the database
  std::vector<std::thread> agents;
  for (int a = 0; a < 2; ++a) {
    agents.emplace_back([&, a] {
      for (int64_t s = 1; s <= 50; ++s) {
        RecordBatch b = beat(s, a * 4, 4);
        const size_t n = b.size();
        ASSERT_TRUE(w.reserve(n));
        w.push(std::move(b), n);
      }
    });
  }
  for (std::thread& t : agents) t.join();
  EXPECT_GT(w.stats().queued_records, 0u);
  hold.unlock();
  w.flush();
  const IngestWriterStats st = w.stats();
  EXPECT_EQ(st.records, 2u * 50u * 4u + 50u);
  EXPECT_EQ(st.queued_records, 0u);
  EXPECT_EQ(st.failed_records, 0u);
  EXPECT_LT(st.transactions, 10u) << "100 beats should not take a transaction each";
  EXPECT_EQ(steps_in_db(), 50u);
  std::vector<RankStepRecord> rs;
  std::lock_guard<std::mutex> lock(db_mu_);
  ASSERT_TRUE(db_->read_rank_steps(run_, 0, kStepEnd, {}, 100000, &rs));
  EXPECT_EQ(rs.size(), 400u);
}

TEST_F(IngestWriterTest, ClosuresRunInQueueOrderBetweenBatches) {
  IngestWriter w(db_.get(), &db_mu_);
  for (int64_t s = 1; s <= 10; ++s) {
    RecordBatch b = beat(s, 0, 4);
    const size_t n = b.size();
    ASSERT_TRUE(w.reserve(n));
    w.push(std::move(b), n);
  }
  // A rewind queued after steps 1..10 forgets 6..10; steps queued after it are kept.
  w.push_op([run = run_](HistoryDb& d) { EXPECT_TRUE(d.rewind_run(run, 5)) << d.error(); });
  for (int64_t s = 6; s <= 7; ++s) {
    RecordBatch b = beat(s, 0, 4);
    const size_t n = b.size();
    ASSERT_TRUE(w.reserve(n));
    w.push(std::move(b), n);
  }
  RecordBatch ev;
  ev.events.push_back({.run_id = run_, .time_unix_s = 1.7e9, .step = 7, .kind = "note", .message = "mine"});
  w.push_own(std::move(ev));
  w.flush();
  EXPECT_EQ(steps_in_db(), 7u);
  std::vector<EventRow> rows;
  std::lock_guard<std::mutex> lock(db_mu_);
  ASSERT_TRUE(db_->read_events(run_, 0, 100, &rows));
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_EQ(rows[0].event.kind, "note");
}

TEST_F(IngestWriterTest, TheBoundRefusesAgentsButNeverTheCoordinator) {
  IngestWriter w(db_.get(), &db_mu_, {.max_queued_records = 10});
  std::unique_lock<std::mutex> hold(db_mu_);  // nothing is written while we fill the queue
  w.push_op([](HistoryDb&) {});
  EXPECT_TRUE(w.reserve(25));  // an empty queue takes any size, so a large beat is never refused forever
  w.push(beat(1, 0, 8), 25);
  EXPECT_FALSE(w.reserve(1));
  EXPECT_EQ(w.stats().refused_batches, 1u);
  RecordBatch ev;
  ev.events.push_back({.run_id = run_, .time_unix_s = 1.7e9, .kind = "own"});
  w.push_own(std::move(ev));  // always taken
  hold.unlock();
  w.flush();
  EXPECT_EQ(w.stats().queued_records, 0u);
  EXPECT_TRUE(w.reserve(10));  // room again
  w.push(RecordBatch(), 10);   // an empty batch gives its reservation back
  EXPECT_EQ(w.stats().queued_records, 0u);
  std::vector<EventRow> rows;
  std::lock_guard<std::mutex> lock(db_mu_);
  ASSERT_TRUE(db_->read_events(run_, 0, 100, &rows));
  EXPECT_EQ(rows.size(), 1u);
}

TEST_F(IngestWriterTest, ABadBatchLosesOnlyItself) {
  IngestWriter w(db_.get(), &db_mu_);
  std::unique_lock<std::mutex> hold(db_mu_);
  w.push_op([](HistoryDb&) {});
  RecordBatch good1 = beat(1, 0, 4), bad = beat(1, 4, 4), good2 = beat(2, 0, 4);
  bad.rank_steps.back().rank = 99;  // outside the run's world of 8: the database refuses the batch
  for (RecordBatch* b : {&good1, &bad, &good2}) {
    const size_t n = b->size();
    ASSERT_TRUE(w.reserve(n));
    w.push(std::move(*b), n);
  }
  hold.unlock();
  w.flush();
  const IngestWriterStats st = w.stats();
  EXPECT_EQ(st.failed_records, 4u);
  EXPECT_EQ(st.records, 10u);  // two good beats of 4 rank-steps and a step each
  EXPECT_EQ(steps_in_db(), 2u);
  std::vector<RankStepRecord> rs;
  std::lock_guard<std::mutex> lock(db_mu_);
  ASSERT_TRUE(db_->read_rank_steps(run_, 0, kStepEnd, {}, 100, &rs));
  EXPECT_EQ(rs.size(), 8u);
}

// Defect: the merge of queued batches into one transaction dropped their checkpoint records (and so the
// catalog entry and the event of a checkpoint that arrived beside other records); on the one-by-one retry
// too.
TEST_F(IngestWriterTest, MergedBatchesKeepTheirCheckpointRecords) {
  for (const bool with_a_bad_batch : {false, true}) {
    IngestWriter w(db_.get(), &db_mu_);
    std::unique_lock<std::mutex> hold(db_mu_);  // everything below queues up and is merged
    w.push_op([](HistoryDb&) {});
    const int64_t base = with_a_bad_batch ? 100 : 10;
    RecordBatch first = beat(base, 0, 4), second = beat(base, 4, 4), third = beat(base + 1, 0, 4);
    for (int64_t k : {int64_t{0}, int64_t{1}}) {
      (k == 0 ? second : third)
          .checkpoints.push_back({.run_id = run_,
                                  .step = base + k,
                                  .rank = kCheckpointAllRanks,
                                  .dir = "ckpt/step_" + std::to_string(base + k),
                                  .state = CheckpointState::kCommitted,
                                  .bytes = 1000,
                                  .write_s = 0.5,
                                  .stall_s = 0.5});
    }
    if (with_a_bad_batch) first.rank_steps.back().rank = 99;  // the merge fails; each batch alone then
    for (RecordBatch* b : {&first, &second, &third}) {
      const size_t n = b->size();
      ASSERT_TRUE(w.reserve(n));
      w.push(std::move(*b), n);
    }
    hold.unlock();
    w.flush();
    std::vector<CheckpointInfo> cks;
    std::lock_guard<std::mutex> lock(db_mu_);
    ASSERT_TRUE(db_->list_checkpoints(run_, &cks)) << db_->error();
    std::vector<int64_t> steps;
    for (const CheckpointInfo& c : cks) steps.push_back(c.step);
    EXPECT_THAT(steps, ::testing::IsSupersetOf({base, base + 1})) << "bad batch: " << with_a_bad_batch;
  }
}

TEST_F(IngestWriterTest, StopWritesWhatIsQueued) {
  auto w = std::make_unique<IngestWriter>(db_.get(), &db_mu_);
  for (int64_t s = 1; s <= 20; ++s) {
    RecordBatch b = beat(s, 0, 4);
    const size_t n = b.size();
    ASSERT_TRUE(w->reserve(n));
    w->push(std::move(b), n);
  }
  w->stop();
  EXPECT_FALSE(w->reserve(1));  // stopped: nothing more is taken
  w.reset();
  EXPECT_EQ(steps_in_db(), 20u);
}

}  // namespace
}  // namespace gantry
