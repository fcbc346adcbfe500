// The coordinator acts on the silent-data-corruption check (engine/core/sdc_check.h): `gantry-engine up` with
// two nodes of two slots, a dp-4 run, rank 2 (node-1) flips one bit of its parameters
// (GANTRY_TEST_WORKER_FAULT flip_bit). The sdc_mismatch event names rank 2 alone, the coordinator quarantines
// node-1 (an sdc_quarantine event) and not node-0, and recovers the run by itself on node-0 (dp 2) from a
// checkpoint no newer than the last check every replica passed: a checkpoint written after the flip but
// before the check that found it may hold the corruption, so it is moved aside, never resumed from.
#include <regex>

#include "engine/core/checkpoint.h"  // checkpoint_dir_step
#include "tests/app/cluster_fixture.h"

namespace gantry {
namespace {

using namespace cluster_testing;  // NOLINT: the fixture and its helpers are this suite's vocabulary

class SdcCluster : public ClusterCli {
 protected:
  std::string worker_fault() const override { return "2:flip_bit:5"; }

  // Submits a dp-4 run of `steps` checked every `check_every` steps, checkpointed every `checkpoint_every`,
  // waits for it to finish, and checks what every case shares: one mismatch naming rank 2 at `mismatch_step`,
  // node-1 quarantined, node-0 healthy, one recovery at dp 2. Returns the recovery event.
  json run_to_recovery(int check_every, int checkpoint_every, int64_t steps, int64_t mismatch_step,
                       int64_t* id) {
    std::string config = std::regex_replace(tiny_config(steps), std::regex("\\[train\\]"),
                                            "[train]\nsdc_check_every = " + std::to_string(check_every));
    config = std::regex_replace(config, std::regex("checkpoint_every = 0"),
                                "checkpoint_every = " + std::to_string(checkpoint_every));
    Result<json> sub = api_->post_json("/v1/runs", {{"config", config}, {"layout", {{"dp", 4}}}});
    EXPECT_TRUE(sub.ok()) << sub.error();
    if (!sub.ok()) return json();
    *id = sub->at("id").get<int64_t>();
    workers_ = children_of(pids_);
    EXPECT_TRUE(eventually([&] { return run_state(*id).value("state", "") == "finished"; }, 90s))
        << run_state(*id).dump();
    EXPECT_EQ(last_step(*id), steps);
    EXPECT_EQ(run_state(*id)["layout"]["dp"], 2);

    const std::vector<json> mismatch = events(*id, "sdc_mismatch");
    EXPECT_EQ(mismatch.size(), 1u);
    if (!mismatch.empty()) {
      EXPECT_EQ(mismatch[0]["rank"], 2);
      EXPECT_EQ(mismatch[0]["step"], mismatch_step);
    }
    const std::vector<json> q = events(*id, "sdc_quarantine");
    EXPECT_EQ(q.size(), 1u);
    if (!q.empty()) {
      EXPECT_EQ(q[0]["node"], "node-1");
      EXPECT_EQ(q[0]["step"], mismatch_step);
      EXPECT_THAT(q[0]["message"].get<std::string>(),
                  HasSubstr("rank 2's fp32 parameters disagreed with 3 of 4"));
    }
    const json cluster = get("/v1/cluster");
    int seen = 0;
    for (const json& n : cluster["nodes"]) {
      if (n["id"] == "node-1") {
        EXPECT_EQ(n["state"], "quarantined");
        ++seen;
      }
      if (n["id"] == "node-0") {
        EXPECT_EQ(n["state"], "healthy");
        ++seen;
      }
    }
    EXPECT_EQ(seen, 2) << cluster.dump();
    const std::vector<json> placed = events(*id, "recovery_placed");
    EXPECT_EQ(placed.size(), 1u);
    return placed.empty() ? json() : json::parse(placed[0]["payload"].get<std::string>());
  }
};

// Checked every step: the flip after step 5 is found at step 5; no checkpoint: the run starts over at dp 2.
TEST_F(SdcCluster, AMismatchQuarantinesTheNamedRanksNodeAndTheRunRecoversWithoutIt) {
  int64_t id = -1;
  const json placed = run_to_recovery(1, 0, 30, 5, &id);
  EXPECT_EQ(placed["sdc_trusted_step"], 4) << placed.dump();
  EXPECT_EQ(placed["checkpoint"], "") << placed.dump();
  EXPECT_EQ(placed["dp"], 2);
  EXPECT_EQ(placed["previous_dp"], 4);
}

// Checked every 4 steps, checkpoints every 3: the flip after step 5 is in the checkpoint of step 6 and found
// only at step 8. The recovery resumes from step 3 (the newest no newer than step 4, the last check passed),
// and step 6's checkpoint is moved aside, not resumed from (the old code took it: the newest committed).
TEST_F(SdcCluster, ACheckpointWrittenAfterTheLastPassedCheckIsNeverResumedFrom) {
  int64_t id = -1;
  const json placed = run_to_recovery(4, 3, 30, 8, &id);
  EXPECT_EQ(placed["sdc_trusted_step"], 4) << placed.dump();
  ASSERT_TRUE(placed["checkpoint"].is_string()) << placed.dump();
  EXPECT_EQ(checkpoint_dir_step(placed["checkpoint"].get<std::string>()), 3) << placed.dump();
  ASSERT_EQ(placed["untrusted_checkpoints"].size(), 1u) << placed.dump();
  EXPECT_EQ(checkpoint_dir_step(placed["untrusted_checkpoints"][0].get<std::string>()), 6);
  const fs::path aside = dir_ / "runs" / std::to_string(id) / "checkpoints_untrusted" / "generation_1";
  EXPECT_TRUE(fs::exists(aside / "step_00000006" / "manifest.json")) << aside;
}

}  // namespace
}  // namespace gantry
