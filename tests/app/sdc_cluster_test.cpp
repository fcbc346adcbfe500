// The coordinator acts on the silent-data-corruption check (engine/core/sdc_check.h): `gantry-engine up` with
// two nodes of two slots, a dp-4 run checked every step, rank 2 (node-1) flips one bit of its parameters
// after step 3 (GANTRY_TEST_WORKER_FAULT flip_bit). The run fails with the reason, the sdc_mismatch event
// names rank 2 alone, and the coordinator quarantines node-1 (an sdc_quarantine event) and not node-0.
#include <regex>

#include "tests/app/cluster_fixture.h"

namespace gantry {
namespace {

using namespace cluster_testing;  // NOLINT: the fixture and its helpers are this suite's vocabulary

class SdcCluster : public ClusterCli {
 protected:
  std::string worker_fault() const override { return "2:flip_bit:3"; }
};

TEST_F(SdcCluster, AMismatchStopsTheRunAndQuarantinesTheNamedRanksNode) {
  const std::string config =
      std::regex_replace(tiny_config(50), std::regex("\\[train\\]"), "[train]\nsdc_check_every = 1");
  Result<json> sub = api_->post_json("/v1/runs", {{"config", config}, {"layout", {{"dp", 4}}}});
  ASSERT_TRUE(sub.ok()) << sub.error();
  const int64_t id = sub->at("id").get<int64_t>();
  workers_ = children_of(pids_);
  ASSERT_TRUE(eventually([&] { return run_state(id).value("state", "") == "failed"; }, 60s))
      << run_state(id).dump();
  EXPECT_THAT(run_state(id).value("message", ""), HasSubstr("silent data corruption"))
      << run_state(id).dump();
  EXPECT_EQ(last_step(id), 3);

  json quarantine;
  ASSERT_TRUE(eventually(
      [&] {
        const std::vector<json> q = events(id, "sdc_quarantine");
        if (q.size() == 1) quarantine = q[0];
        return q.size() == 1;
      },
      20s));
  EXPECT_EQ(quarantine["node"], "node-1");
  EXPECT_EQ(quarantine["step"], 3);
  EXPECT_THAT(quarantine["message"].get<std::string>(),
              HasSubstr("rank 2's fp32 parameters disagreed with 3 of 4"));
  const std::vector<json> mismatch = events(id, "sdc_mismatch");
  ASSERT_EQ(mismatch.size(), 1u);
  EXPECT_EQ(mismatch[0]["rank"], 2);
  EXPECT_EQ(mismatch[0]["step"], 3);

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
}

}  // namespace
}  // namespace gantry
