// Asynchronous checkpoints in one process (train.checkpoint_async): they write the same bytes as the
// synchronous ones and resume alike; a second request waits for the one in flight and says so; a write
// that fails on the writer thread fails the run; the option's bad values are refused.
#include "engine/core/checkpoint_async.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <mutex>
#include <string>
#include <vector>

#include "engine/core/checkpoint.h"
#include "engine/core/train.h"
#include "engine/core/train_checkpoints.h"  // checkpoint_cost_text
#include "tests/engine/core/small_config.h"

namespace gantry {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using testing_support::fresh_dir;
using testing_support::small_config;

struct Recorder : TrainObserver {
  std::vector<double> losses;
  std::vector<CheckpointReport> checkpoints;
  void on_step(const StepReport& r) override { losses.push_back(r.loss); }
  void on_checkpoint(const CheckpointReport& c) override { checkpoints.push_back(c); }
};

std::string file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

Config every_two(bool async) {
  Config c = small_config();
  c.train.max_steps = 8;
  c.train.checkpoint_every = 2;
  c.train.keep_checkpoints = 10;
  c.train.checkpoint_async = async;
  return c;
}

TEST(CheckpointAsync, WritesTheSameBytesAsSyncAndResumesAlike) {
  const std::string a_dir = fresh_dir("async_run"), s_dir = fresh_dir("sync_run");
  Recorder a_rec, s_rec;
  Result<TrainSummary> a = train_run(every_two(true), {.out_dir = a_dir}, &a_rec);
  ASSERT_TRUE(a.ok()) << a.error();
  Result<TrainSummary> s = train_run(every_two(false), {.out_dir = s_dir}, &s_rec);
  ASSERT_TRUE(s.ok()) << s.error();
  ASSERT_EQ(a_rec.checkpoints.size(), 4u);
  for (size_t i = 0; i < a_rec.checkpoints.size(); ++i) {
    EXPECT_EQ(a_rec.checkpoints[i].step, s_rec.checkpoints[i].step);
    // The last one of a run is written to the end (nothing left to overlap it with).
    EXPECT_EQ(a_rec.checkpoints[i].async, i + 1 < a_rec.checkpoints.size()) << i;
    EXPECT_FALSE(s_rec.checkpoints[i].async);
  }
  for (const char* step : {"step_00000002", "step_00000004", "step_00000006"}) {
    const std::string a_shard = a_dir + "/checkpoints/" + step + "/shard_r00000.bin";
    ASSERT_TRUE(fs::exists(a_shard)) << a_shard;
    EXPECT_EQ(file_bytes(a_shard), file_bytes(s_dir + "/checkpoints/" + step + "/shard_r00000.bin")) << step;
  }
  // Resumed from step 4, each continues as the other: the same losses and final parameters.
  Recorder a_more, s_more;
  const Config a_cfg = every_two(true), s_cfg = every_two(false);
  Result<TrainSummary> ar =
      train_run(a_cfg, {.out_dir = a_dir, .resume = a_dir + "/checkpoints/step_00000004"}, &a_more);
  ASSERT_TRUE(ar.ok()) << ar.error();
  Result<TrainSummary> sr =
      train_run(s_cfg, {.out_dir = s_dir, .resume = s_dir + "/checkpoints/step_00000004"}, &s_more);
  ASSERT_TRUE(sr.ok()) << sr.error();
  ASSERT_EQ(a_more.losses.size(), 4u);
  EXPECT_EQ(a_more.losses, s_more.losses);
  EXPECT_EQ(ar->params_xxh64, sr->params_xxh64);
  // And both equal the uninterrupted run.
  EXPECT_EQ(a_more.losses, std::vector<double>(a_rec.losses.begin() + 4, a_rec.losses.end()));
  EXPECT_EQ(ar->params_xxh64, a->params_xxh64);
}

// The writer of step 1 holds after its first slice until the loop asks for step 2's checkpoint: that
// request must wait, and its report says so.
TEST(CheckpointAsync, ASecondRequestWaitsForTheOneInFlightAndSaysSo) {
  Config c = small_config();
  c.train.max_steps = 3;
  c.train.checkpoint_every = 1;
  c.train.val_every = 0;
  std::mutex mu;
  std::condition_variable cv;
  bool asked = false;
  std::vector<std::string> stages;
  CheckpointHook hook = [&](CheckpointStage stage, int64_t step) {
    std::unique_lock<std::mutex> lock(mu);
    stages.push_back(std::string(checkpoint_stage_name(stage)) + " " + std::to_string(step));
    if (stage == CheckpointStage::kWaitPrevious) {
      asked = true;
      cv.notify_all();
    } else if (stage == CheckpointStage::kWrite && step == 1) {
      // A loop that never waits leaves this to run out, and the checks below fail.
      cv.wait_for(lock, std::chrono::seconds(20), [&] { return asked; });
    }
  };
  Recorder rec;
  Result<TrainSummary> s =
      train_run(c, {.out_dir = fresh_dir("async_wait"), .test_checkpoint_hook = hook}, &rec);
  ASSERT_TRUE(s.ok()) << s.error();
  ASSERT_EQ(rec.checkpoints.size(), 3u);
  EXPECT_EQ(rec.checkpoints[0].step, 1);
  EXPECT_EQ(rec.checkpoints[0].waited_s, 0.0);
  EXPECT_EQ(rec.checkpoints[1].step, 2);
  EXPECT_TRUE(rec.checkpoints[1].async);
  EXPECT_GT(rec.checkpoints[1].waited_s, 0.0) << "step 2's request did not wait for step 1's write";
  EXPECT_GE(rec.checkpoints[1].stall_s, rec.checkpoints[1].waited_s);
  EXPECT_THAT(stages, ::testing::Contains("wait_previous 2"));
  // The report's words for the log line and the event.
  EXPECT_THAT(checkpoint_cost_text(rec.checkpoints[1]), HasSubstr("waited"));
}

// With train.checkpoint_defer_when_busy, the loop never waits for a write in flight: the writer of step 1
// holds until step 3 has been trained, so the checkpoints due at 2 and 3 are deferred, and the next one
// taken (at 4 or later, when that write has ended, or the run's last) says it was due at 2. The losses are
// those of a run that never deferred.
TEST(CheckpointAsync, DeferredWhenBusyTheLoopNeverWaitsAndTheLateCheckpointSaysWhenItWasDue) {
  struct Observer : Recorder {
    std::mutex* mu = nullptr;
    std::condition_variable* cv = nullptr;
    int64_t* trained = nullptr;
    void on_step(const StepReport& r) override {
      Recorder::on_step(r);
      std::lock_guard<std::mutex> lock(*mu);
      *trained = r.step;
      cv->notify_all();
    }
  };
  Config c = small_config();
  c.train.max_steps = 8;
  c.train.checkpoint_every = 1;
  c.train.keep_checkpoints = 10;
  c.train.val_every = 0;
  c.train.checkpoint_defer_when_busy = true;
  std::mutex mu;
  std::condition_variable cv;
  int64_t trained = 0;
  std::vector<std::string> stages;
  CheckpointHook hook = [&](CheckpointStage stage, int64_t step) {
    std::unique_lock<std::mutex> lock(mu);
    stages.push_back(std::string(checkpoint_stage_name(stage)) + " " + std::to_string(step));
    // A loop that waited for this write would never train step 3: the wait runs out and the checks fail.
    if (stage == CheckpointStage::kWrite && step == 1) {
      cv.wait_for(lock, std::chrono::seconds(20), [&] { return trained >= 3; });
    }
  };
  Observer rec;
  rec.mu = &mu;
  rec.cv = &cv;
  rec.trained = &trained;
  Result<TrainSummary> s =
      train_run(c, {.out_dir = fresh_dir("async_defer"), .test_checkpoint_hook = hook}, &rec);
  ASSERT_TRUE(s.ok()) << s.error();
  ASSERT_GE(rec.checkpoints.size(), 2u);
  EXPECT_EQ(rec.checkpoints[0].step, 1);
  EXPECT_EQ(rec.checkpoints[0].deferred_from, -1);
  EXPECT_GE(rec.checkpoints[1].step, 4) << "a checkpoint was taken while step 1's write was held";
  EXPECT_EQ(rec.checkpoints[1].deferred_from, 2);
  EXPECT_THAT(checkpoint_cost_text(rec.checkpoints[1]), HasSubstr("deferred from step 2"));
  for (size_t i = 0; i + 1 < rec.checkpoints.size(); ++i) {  // the last one, at the end, may wait
    EXPECT_EQ(rec.checkpoints[i].waited_s, 0.0) << "step " << rec.checkpoints[i].step;
  }
  EXPECT_EQ(rec.checkpoints.back().step, 8);
  for (const std::string& st : stages)
    EXPECT_FALSE(st.rfind("wait_previous", 0) == 0 && st != "wait_previous 8") << st;

  Config plain = c;
  plain.train.checkpoint_defer_when_busy = false;
  plain.train.checkpoint_every = 0;
  Recorder ref;
  ASSERT_TRUE(train_run(plain, {.out_dir = fresh_dir("async_defer_ref")}, &ref).ok());
  EXPECT_EQ(rec.losses, ref.losses);
}

// The writer thread's failure (here: the checkpoints folder is a file) is the run's failure, as a
// synchronous write's is, naming what went wrong.
TEST(CheckpointAsync, AFailedWriteFailsTheRunNamingTheCause) {
  Config c = small_config();
  c.train.max_steps = 6;
  c.train.checkpoint_every = 2;
  const std::string out = fresh_dir("async_fail");
  std::ofstream(out + "/checkpoints") << "not a folder";
  Recorder rec;
  Result<TrainSummary> s = train_run(c, {.out_dir = out}, &rec);
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.error(), HasSubstr("cannot create checkpoint directory"));
  EXPECT_TRUE(rec.checkpoints.empty());
}

TEST(CheckpointAsync, TheOptionTakesTrueOrFalseOnly) {
  const std::string text =
      "[model]\nn_layer = 1\n[train]\ncheckpoint_async = \"yes\"\n[data]\nkind = \"synthetic\"\n";
  Result<Config> bad = config_parse(text, "async.toml");
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.error(), HasSubstr("train.checkpoint_async"));
  EXPECT_THAT(bad.error(), HasSubstr("true or false"));
  Result<Config> off =
      config_parse("[model]\nn_layer = 1\n[train]\ncheckpoint_async = false\n[data]\nkind = \"synthetic\"\n",
                   "async.toml");
  ASSERT_TRUE(off.ok()) << off.error();
  EXPECT_FALSE(off->train.checkpoint_async);
  EXPECT_TRUE(Config{}.train.checkpoint_async) << "the default";
}

}  // namespace
}  // namespace gantry
