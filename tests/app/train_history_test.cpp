// `gantry-engine train` leaves the run's history in <out>/history.sqlite: the run, every step, the rank's
// step records and the checkpoints, readable with storage/ while or after it runs.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <vector>

#include "storage/history_db.h"
#include "tests/app/engine_process.h"
#include "tests/scratch_dir.h"

namespace gantry {
namespace {

TEST(TrainHistory, TrainWritesTheRunsHistory) {
  const std::filesystem::path dir = testing_support::scratch_dir();
  const std::string cfg = (dir / "small.toml").string();
  std::ofstream(cfg) << "[model]\nn_layer = 1\nn_head = 2\nn_embd = 16\nvocab_size = 32\nseq_len = 8\n"
                        "[train]\nglobal_batch = 4\nmicro_batch = 2\nmax_steps = 5\nval_every = 5\nval_batches = 1\n"
                        "[data]\nsynthetic_train_tokens = 8192\nsynthetic_val_tokens = 1024\n";
  testing_support::Outcome r =
      testing_support::run_engine("train --config " + cfg + " --out " + (dir / "run").string());
  ASSERT_EQ(r.code, 0) << r.err;

  std::string error;
  auto db = HistoryDb::open((dir / "run" / "history.sqlite").string(), {}, &error);
  ASSERT_TRUE(db) << error;
  std::vector<RunRow> runs;
  ASSERT_TRUE(db->list_runs(&runs)) << db->error();
  ASSERT_EQ(runs.size(), 1u);
  EXPECT_EQ(runs[0].status, RunStatus::finished);
  EXPECT_EQ(runs[0].last_step, 5);
  EXPECT_NE(runs[0].info.config.find("n_embd = 16"), std::string::npos);

  std::vector<StepRecord> steps;
  ASSERT_TRUE(db->read_steps(runs[0].id, 0, 100, 100, &steps)) << db->error();
  ASSERT_EQ(steps.size(), 5u);
  EXPECT_EQ(steps.front().step, 1);
  EXPECT_GT(steps.front().loss, 2.0);
  ASSERT_TRUE(steps.back().val_loss.has_value());

  std::vector<RankStepRecord> rank_steps;
  ASSERT_TRUE(db->read_rank_steps(runs[0].id, 0, 100, {0}, 100, &rank_steps)) << db->error();
  ASSERT_EQ(rank_steps.size(), 5u);
  EXPECT_GT(rank_steps[0].total_s, 0.0);
  // The CPU backend times its phases; together with the data wait they fit inside the step.
  EXPECT_GT(rank_steps[0].phases.forward, 0.0);
  EXPECT_GT(rank_steps[0].phases.backward, 0.0);
  EXPECT_GT(rank_steps[0].phases.optimizer, 0.0);
  EXPECT_LE(rank_steps[0].phases.sum(), rank_steps[0].total_s);
  EXPECT_EQ(rank_steps[0].tokens, 4 * 8);

  std::vector<CheckpointInfo> ckpts;
  ASSERT_TRUE(db->list_checkpoints(runs[0].id, &ckpts)) << db->error();
  ASSERT_EQ(ckpts.size(), 1u);
  EXPECT_EQ(ckpts[0].step, 5);
}

}  // namespace
}  // namespace gantry
