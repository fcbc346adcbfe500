// The goodput ledger end to end (docs/CLUSTER.md, "Goodput"), against a real `up` cluster on loopback: a
// run with an injected kill has detection, restore and recomputed time, its categories sum to its wall, and
// the ledger reads the same after the coordinator is restarted on its database; a clean run's ETTR is its
// productive time over its wall with no failure time; checkpoint_policy young_daly moves the interval after
// a failure; `ctl goodput` prints the ledger.
#include "tests/app/cluster_fixture.h"

namespace gantry {
namespace {

using namespace cluster_testing;  // NOLINT: the fixture and its helpers are this suite's vocabulary

const char* const kCategories[] = {"productive", "checkpoint_stall", "detection", "restore",
                                   "recomputed", "paused",           "waiting"};

// Rank 0's forward is slowed by 100 ms (the arithmetic is the same), so the run lasts long enough for a
// kill to land mid-run; faults may be injected.
class ClusterGoodput : public ClusterCli {
 protected:
  std::string up_args() const override { return "--nodes 2 --slots 2 --allow-fault-injection"; }
  std::string worker_fault() const override { return "0:slow_forward:100"; }

  json goodput(int64_t id) { return get("/v1/runs/" + std::to_string(id) + "/goodput"); }

  std::string ctl(const std::string& args) {
    testing_support::Outcome o =
        run_engine("ctl --url " + url_ + " --token-file " + (dir_ / "token").string() + " " + args);
    EXPECT_EQ(o.code, 0) << o.err;
    return o.out;
  }

  // The categories cover the wall exactly (goodput.h paints each second once), none negative.
  void expect_whole(const json& g) {
    ASSERT_TRUE(g.value("known", false)) << g.dump();
    double sum = 0;
    for (const char* c : kCategories) {
      ASSERT_TRUE(g["seconds"][c].is_number()) << c << " " << g.dump();
      EXPECT_GE(g["seconds"][c].get<double>(), 0) << c;
      sum += g["seconds"][c].get<double>();
    }
    EXPECT_NEAR(sum, g["wall_s"].get<double>(), 1e-6 * g["wall_s"].get<double>()) << g.dump();
    EXPECT_DOUBLE_EQ(g["ettr"].get<double>(),
                     g["seconds"]["productive"].get<double>() / g["wall_s"].get<double>());
  }
};

TEST_F(ClusterGoodput, AnInjectedKillCostsDetectionRestoreAndRecomputedTimeThatSumToTheWall) {
  // young_daly: every 100,000 steps (none) until the failure; the operator's checkpoint is the one measured.
  Result<json> sub = api_->post_json("/v1/runs", {{"config", tiny_config(100000)},
                                                  {"layout", {{"dp", 4}}},
                                                  {"checkpoint_every_steps", 100000},
                                                  {"checkpoint_policy", "young_daly"}});
  ASSERT_TRUE(sub.ok()) << sub.error();
  const int64_t id = sub->at("id").get<int64_t>();
  EXPECT_EQ(run_state(id)["checkpoint_policy"]["policy"], "young_daly");
  const std::string run = "/v1/runs/" + std::to_string(id);
  ASSERT_TRUE(eventually([&] { return last_step(id) >= 3; }, 60s)) << run_state(id).dump();
  ASSERT_TRUE(api_->post_json(run + "/checkpoint", json::object()).ok());
  int64_t ckpt = -1;
  ASSERT_TRUE(eventually(
      [&] {
        const json catalog =
            get(run + "/checkpoints");  // kept: a range-for over a temporary's member dangles
        for (const json& c : catalog["checkpoints"])
          if (c["state"] == "committed") ckpt = c["step"].get<int64_t>();
        return ckpt >= 0;
      },
      60s))
      << get(run + "/checkpoints").dump() << run_state(id).dump();
  // Steps past the checkpoint: the kill rolls them back, and they are trained again.
  ASSERT_TRUE(eventually([&] { return last_step(id) >= ckpt + 4; }, 60s)) << run_state(id).dump();
  workers_ = children_of(pids_);
  ASSERT_TRUE(api_->post_json(run + "/inject", {{"fault", "kill"}, {"rank", 2}}).ok());
  ASSERT_TRUE(eventually([&] { return run_state(id)["restarts"] == 1; }, 60s)) << run_state(id).dump();
  ASSERT_TRUE(eventually([&] { return last_step(id) > ckpt + 3; }, 60s)) << run_state(id).dump();
  workers_ = children_of(pids_);

  // While live: the wall runs to now, and is still whole.
  expect_whole(goodput(id));

  ASSERT_TRUE(api_->post_json(run + "/stop", json::object()).ok());
  ASSERT_TRUE(eventually([&] { return run_state(id)["state"] == "stopped"; }, 30s)) << run_state(id).dump();

  const json g = goodput(id);
  expect_whole(g);
  EXPECT_FALSE(g["live"].get<bool>());
  for (const char* c : {"productive", "detection", "restore", "recomputed", "waiting"})
    EXPECT_GT(g["seconds"][c].get<double>(), 0) << c << " " << g.dump();
  EXPECT_EQ(g["seconds"]["paused"].get<double>(), 0);
  ASSERT_EQ(g["generations"].size(), 2u) << g.dump();
  EXPECT_EQ(g["generations"][0]["cause"], "submit");
  EXPECT_EQ(g["generations"][1]["cause"], "recovery");
  EXPECT_EQ(g["generations"][1]["from_step"], ckpt);
  ASSERT_EQ(g["failures"].size(), 1u) << g.dump();
  const json& f = g["failures"][0];
  EXPECT_EQ(f["fault"], "kill");
  EXPECT_EQ(f["fault_rank"], 2);
  EXPECT_EQ(f["kind"], "node_failed");
  EXPECT_EQ(f["fault_node"], "node-1");
  // The first notice: the killed rank's node, or its peers' when their broken collective was reported first.
  EXPECT_THAT(f["node"].get<std::string>(), ::testing::AnyOf("node-0", "node-1"));
  EXPECT_TRUE(f["recovered"].get<bool>());
  EXPECT_DOUBLE_EQ(f["detection_s"].get<double>(), g["seconds"]["detection"].get<double>());
  EXPECT_DOUBLE_EQ(f["recomputed_s"].get<double>(), g["seconds"]["recomputed"].get<double>());
  EXPECT_DOUBLE_EQ(f["restore_s"].get<double>(), g["seconds"]["restore"].get<double>());
  // The run's own JSON carries the same ETTR.
  EXPECT_DOUBLE_EQ(run_state(id)["ettr"].get<double>(), g["ettr"].get<double>());

  // Young/Daly from what the run measured: one failure over its wall, the median stall of its checkpoints.
  const json& y = g["young_daly"];
  EXPECT_EQ(y["failures"], 1);
  ASSERT_TRUE(y["checkpoint_cost_s"].is_number()) << y.dump();
  EXPECT_DOUBLE_EQ(y["mtbf_s"].get<double>(), g["wall_s"].get<double>());
  ASSERT_TRUE(y["interval_s"].is_number()) << y.dump();
  EXPECT_NEAR(y["interval_s"].get<double>(),
              std::sqrt(2 * y["checkpoint_cost_s"].get<double>() * y["mtbf_s"].get<double>()), 1e-9);
  EXPECT_TRUE(y["interval_steps"].is_number()) << y.dump();
  // ... and the policy moved the run's interval off its submitted 100,000 steps, saying so.
  const std::vector<json> moved = events(id, "checkpoint_interval");
  ASSERT_FALSE(moved.empty());
  const json payload = json::parse(moved.back()["payload"].get<std::string>());
  EXPECT_EQ(payload["previous_every_steps"], 100000);
  EXPECT_EQ(run_state(id)["checkpoint_policy"]["checkpoint_every_steps"], payload["every_steps"]);
  EXPECT_NE(payload["every_steps"], 100000);

  const std::string table = ctl("goodput " + std::to_string(id));
  EXPECT_THAT(table, HasSubstr("ETTR"));
  EXPECT_THAT(table, HasSubstr("recomputed"));
  EXPECT_THAT(table, HasSubstr("node_failed (injected kill)"));
  EXPECT_THAT(table, HasSubstr("Young/Daly"));
  const json as_json = json::parse(ctl("--json goodput " + std::to_string(id)));
  EXPECT_DOUBLE_EQ(as_json["wall_s"].get<double>(), g["wall_s"].get<double>());

  // Derived from the stored history: a new coordinator on the same database gives the same ledger.
  ASSERT_NO_FATAL_FAILURE(restart_cluster());
  const json again = goodput(id);
  for (const char* c : kCategories)
    EXPECT_NEAR(again["seconds"][c].get<double>(), g["seconds"][c].get<double>(), 1e-9) << c;
  EXPECT_EQ(again["failures"].size(), 1u);
  EXPECT_DOUBLE_EQ(again["ettr"].get<double>(), g["ettr"].get<double>());
}

TEST_F(ClusterGoodput, ACleanRunsEttrIsProductiveOverWallWithNoFailureTime) {
  Result<json> sub = api_->post_json(
      "/v1/runs", {{"config", tiny_config(12)}, {"layout", {{"dp", 4}}}, {"checkpoint_every_steps", 5}});
  ASSERT_TRUE(sub.ok()) << sub.error();
  const int64_t id = sub->at("id").get<int64_t>();
  ASSERT_TRUE(eventually([&] { return run_state(id)["state"] != "running"; }, 120s)) << run_state(id).dump();
  ASSERT_EQ(run_state(id)["state"], "finished") << run_state(id).dump();
  const json g = goodput(id);
  expect_whole(g);
  for (const char* c : {"detection", "restore", "recomputed", "paused"})
    EXPECT_EQ(g["seconds"][c].get<double>(), 0) << c << " " << g.dump();
  EXPECT_GT(g["seconds"]["productive"].get<double>(), 0);
  EXPECT_GT(g["seconds"]["waiting"].get<double>(), 0);  // placing and starting before the first step
  EXPECT_GT(g["seconds"]["checkpoint_stall"].get<double>(), 0) << g.dump();
  EXPECT_TRUE(g["failures"].empty());
  EXPECT_EQ(g["generations"].size(), 1u);
  // No failure: no failure rate, so no recommendation (no prior is assumed), and it says why.
  const json& y = g["young_daly"];
  EXPECT_TRUE(y["interval_s"].is_null()) << y.dump();
  EXPECT_TRUE(y["mtbf_s"].is_null()) << y.dump();
  EXPECT_THAT(y["why_unknown"].get<std::string>(), HasSubstr("no failure"));
  EXPECT_EQ(y["policy"], "fixed");
  EXPECT_THAT(ctl("goodput " + std::to_string(id)), HasSubstr("recommended interval: unknown (no failure"));
}

TEST_F(ClusterGoodput, ABadCheckpointPolicyIsRefusedNamingTheField) {
  for (const auto& [extra, want] : std::vector<std::pair<json, std::string>>{
           {{{"checkpoint_policy", "often"}}, "give \"fixed\""},
           {{{"checkpoint_policy", "young_daly"}}, "young_daly needs checkpoint_every_steps"},
           {{{"checkpoint_policy", 3}}, "checkpoint_policy"}}) {
    json body = {{"config", tiny_config(10)}, {"layout", {{"dp", 2}}}};
    body.update(extra);
    Result<HttpReply> r = api_->post("/v1/runs", body);
    ASSERT_TRUE(r.ok()) << r.error();
    EXPECT_EQ(r->status, 400) << extra.dump();
    EXPECT_THAT(r->error_message(), HasSubstr(want)) << extra.dump();
  }
  Result<HttpReply> none = api_->get("/v1/runs/99/goodput");
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(none->status, 404);
}

}  // namespace
}  // namespace gantry
