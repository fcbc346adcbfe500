// A gang's step-guard rollback through the coordinator (issues 15/16), against a real `up` cluster on
// loopback: a dp-2 run whose rank 0 meets a NaN batch (bad data: the fault follows the batch) with
// train.guard_max_skips_in_row = 1 stops at the streak with its own exit code and event; the coordinator
// places it again from the newest checkpoint before the streak, tells the new generation to pass over the
// streak's batch, says so in a guard_rollback event, and the run finishes having read every other batch
// exactly once (its data-cursor log). train.guard_max_rollbacks bounds it: one rollback too many fails the
// run naming the limit.
#include <regex>

#include "engine/core/data_cursor_log.h"
#include "tests/app/cluster_fixture.h"

namespace gantry {
namespace {

using namespace cluster_testing;  // NOLINT: the fixture and its helpers are this suite's vocabulary

// Rank 0's gradients of batch 8 (step 9's) are NaN; with two faults, rank 1's of batch 14 too (step 14's
// once batch 8 is passed over).
class ClusterGuard : public ClusterCli {
 protected:
  std::string worker_fault() const override { return "0:nan_grad:9,1:nan_grad:15"; }

  int64_t submit(int64_t max_steps, int max_rollbacks) {
    std::string toml = tiny_config(max_steps);
    toml = std::regex_replace(toml, std::regex("checkpoint_every = 0"), "checkpoint_every = 4");
    toml = std::regex_replace(
        toml, std::regex("\\[train\\]"),
        "[train]\nguard_max_skips_in_row = 1\nguard_max_rollbacks = " + std::to_string(max_rollbacks));
    Result<json> sub = api_->post_json("/v1/runs", {{"config", toml}, {"layout", {{"dp", 2}}}});
    EXPECT_TRUE(sub.ok()) << sub.error();
    return sub.ok() ? sub->at("id").get<int64_t>() : -1;
  }
  std::string run_dir(int64_t id) const { return (dir_ / "runs" / std::to_string(id)).string(); }
};

TEST_F(ClusterGuard, AGangsStreakIsRolledBackByTheCoordinatorPastItsBatches) {
  constexpr int64_t kSteps = 20;
  const int64_t id = submit(kSteps, 2);
  ASSERT_GE(id, 0);
  ASSERT_TRUE(eventually([&] { return run_state(id)["state"] != "running"; }, 180s)) << run_state(id).dump();
  workers_ = children_of(pids_);
  const json state = run_state(id);
  ASSERT_EQ(state["state"], "finished") << state.dump();
  EXPECT_EQ(state["last_step"], kSteps);
  EXPECT_EQ(state["generation"], 3);  // two rollbacks: batch 8, then batch 14
  EXPECT_EQ(state["restarts"], 0);    // rollbacks, not failures recovered

  // The gang's word: rank 0 says why it stops, at the streak's step.
  const std::vector<json> streaks = events(id, "guard_streak");
  ASSERT_EQ(streaks.size(), 2u) << json(streaks).dump(1);
  EXPECT_EQ(streaks[0]["step"], 9);
  EXPECT_THAT(streaks[0]["message"].get<std::string>(), HasSubstr("the last: grad norm nan"));
  EXPECT_THAT(streaks[0]["message"].get<std::string>(), HasSubstr("at or before step 8"));
  EXPECT_EQ(streaks[1]["step"], 14);

  // The coordinator's: each rollback names why, the checkpoint it went on from and the batch passed over.
  const std::vector<json> rollbacks = events(id, "guard_rollback");
  ASSERT_EQ(rollbacks.size(), 4u) << json(rollbacks).dump(1);  // two rollbacks, each resumed
  std::vector<json> placed;
  for (const json& e : rollbacks)
    if (e["kind"] == "guard_rollback") placed.push_back(e);
  ASSERT_EQ(placed.size(), 2u) << json(rollbacks).dump(1);
  EXPECT_EQ(placed[0]["step"], 9);  // where the streak ended, as the loss plot marks a rollback
  const std::string first = placed[0]["message"].get<std::string>();
  EXPECT_THAT(first, HasSubstr("rollback 1: the gang stopped at step 9 after 1 skipped steps in a row"));
  EXPECT_THAT(first, HasSubstr("(the last: grad norm nan)"));
  EXPECT_THAT(first, HasSubstr("from the checkpoint at step 8, passing over batches 8"));
  const json p0 = json::parse(placed[0]["payload"].get<std::string>());
  EXPECT_EQ(p0["to_step"], 8) << p0.dump();
  EXPECT_EQ(p0["skipped"], json::parse("[[8,1]]")) << p0.dump();
  EXPECT_EQ(p0["rollback"], 1);
  EXPECT_EQ(p0["reason"], "grad norm nan");
  const json p1 = json::parse(placed[1]["payload"].get<std::string>());
  EXPECT_EQ(p1["to_step"], 12) << p1.dump();  // the newest checkpoint before step 14
  EXPECT_EQ(p1["passed_over"], json::parse("[[8,1],[14,1]]")) << p1.dump();

  // The data: every batch but the two bad ones read exactly once in the committed history (the steps
  // after each checkpoint replayed), and the final checkpoint's cursor passes over both.
  Result<DataCursorHistory> h = data_cursor_read(run_dir(id));
  ASSERT_TRUE(h.ok()) << h.error();
  EXPECT_EQ(h->starts, 2 * 3);  // two ranks, three generations
  const std::vector<SkippedBatches> skipped = {{8, 1}, {14, 1}};
  const Status st = data_cursor_check(h.value(), kSteps, 16, skipped);
  EXPECT_TRUE(st.ok()) << st.message();
  EXPECT_FALSE(data_cursor_check(h.value(), kSteps, 16, {}).ok());
  const json m = json::parse(slurp(run_dir(id) + "/checkpoints/step_00000020/manifest.json"));
  EXPECT_EQ(m["data_cursor"]["skipped"], json::parse("[[8,1],[14,1]]")) << m["data_cursor"].dump();
}

TEST_F(ClusterGuard, RollbacksPastTheConfigsLimitFailTheRunNamingIt) {
  const int64_t id = submit(20, 1);
  ASSERT_GE(id, 0);
  ASSERT_TRUE(eventually([&] { return run_state(id)["state"] != "running"; }, 180s)) << run_state(id).dump();
  workers_ = children_of(pids_);
  const json state = run_state(id);
  ASSERT_EQ(state["state"], "failed") << state.dump();
  EXPECT_EQ(state["generation"], 2);
  const std::string message = state["message"].get<std::string>();
  EXPECT_THAT(message, HasSubstr("not recovered: the step guard's streak (grad norm nan) after 1 rollbacks "
                                 "(train.guard_max_rollbacks = 1)"));
  EXPECT_EQ(events(id, "guard_streak").size(), 2u);
}

}  // namespace
}  // namespace gantry
