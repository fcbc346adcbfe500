// Alerts end to end (docs/CLUSTER.md, "Alerts"), against a real `up` cluster on loopback: rules from `up
// --alerts FILE` and from the API, evaluated by the coordinator with no console open; a rule on the slow
// rank's excess fires once, as an event naming the rank, its hook writes a file; a hook that hangs is killed
// at its timeout and says so; every firing clears when the run ends; bad rules are refused naming the field.
#include "tests/app/cluster_fixture.h"

namespace gantry {
namespace {

using namespace cluster_testing;  // NOLINT: the fixture and its helpers are this suite's vocabulary

// Rank 2's forward is slowed by 300 ms: the straggler watch gives it an excess over the median rank.
class ClusterAlerts : public ClusterCli {
 protected:
  void SetUp() override {
    rules_ = testing_support::scratch_path("rules.toml");
    hook_out_ = testing_support::scratch_path("hook.out");
    fs::remove(hook_out_);
    std::ofstream(rules_) << "[alert.slow_rank]\nkind = \"rank_excess\"\nabove = 0.15\nhook = \"echo "
                             "$GANTRY_ALERT_RULE $GANTRY_ALERT_RUN >> "
                          << hook_out_.string() << "\"\n";
    ClusterCli::SetUp();
  }
  void TearDown() override {
    ClusterCli::TearDown();
    fs::remove(rules_);
    fs::remove(hook_out_);
  }
  std::string up_args() const override { return "--nodes 2 --slots 2 --alerts " + rules_.string(); }
  std::string worker_fault() const override { return "2:slow_forward:300"; }

  std::string ctl(const std::string& args) {
    testing_support::Outcome o =
        run_engine("ctl --url " + url_ + " --token-file " + (dir_ / "token").string() + " " + args);
    EXPECT_EQ(o.code, 0) << o.err;
    return o.out;
  }

  fs::path rules_, hook_out_;
};

TEST_F(ClusterAlerts, ARuleOnTheSlowRanksExcessFiresOnceRunsItsHookAndClearsWhenTheRunEnds) {
  // Bad rules: refused, naming what is wrong and what would be right; nothing added.
  Result<HttpReply> bad = api_->post("/v1/alerts", {{"name", "x"}, {"kind", "threshold"}, {"series", "los"}});
  ASSERT_TRUE(bad.ok()) << bad.error();
  EXPECT_EQ(bad->status, 400);
  EXPECT_THAT(bad->error_message(), HasSubstr("field \"series\": expected one of loss, grad_norm"));
  bad = api_->post("/v1/alerts", {{"name", "x"}, {"kind", "threshold"}, {"series", "loss"}});
  EXPECT_EQ(bad->status, 400);
  EXPECT_THAT(bad->error_message(), HasSubstr("needs one of \"above\" or \"below\", e.g. \"above\": 6.0"));
  // A rule from the API: loss above 0 holds from the first step on; its hook hangs and is killed after 1 s.
  Result<json> added = api_->post_json("/v1/alerts", {{"name", "loss_seen"},
                                                      {"kind", "threshold"},
                                                      {"series", "loss"},
                                                      {"above", 0.0},
                                                      {"hook", "sleep 300"},
                                                      {"hook_timeout_s", 1}});
  ASSERT_TRUE(added.ok()) << added.error();
  Result<HttpReply> again =
      api_->post("/v1/alerts", {{"name", "loss_seen"}, {"kind", "nan"}, {"series", "loss"}});
  EXPECT_EQ(again->status, 409);
  EXPECT_EQ(api_->del("/v1/alerts/nope")->status, 404);
  json listed = get("/v1/alerts");
  ASSERT_EQ(listed["rules"].size(), 2u) << listed.dump();  // the file's and the API's
  EXPECT_EQ(listed["rules"][0]["name"], "slow_rank");

  Result<json> sub = api_->post_json("/v1/runs", {{"config", tiny_config(40)},
                                                  {"layout", {{"dp", 4}}},
                                                  {"straggler", {{"window_steps", 5}, {"min_samples", 2}}}});
  ASSERT_TRUE(sub.ok()) << sub.error();
  const int64_t id = sub->at("id").get<int64_t>();
  // The slow rank's rule fires: an event naming rank 2 and its node, and it is listed as firing.
  std::vector<json> fired;
  ASSERT_TRUE(eventually(
      [&] {
        fired = events(id, "alert");
        return std::count_if(fired.begin(), fired.end(), [](const json& e) {
                 return e["kind"] == "alert" &&
                        e["message"].get<std::string>().find("slow_rank") != std::string::npos;
               }) > 0;
      },
      120s))
      << run_state(id).dump();
  // Listed as firing for rank 2: the rule may have fired on another rank's start-up hiccup, and the listing
  // follows the rank that is slowest now.
  json firing;
  EXPECT_TRUE(eventually(
      [&] {
        firing = get("/v1/alerts")["firing"];
        return std::any_of(firing.begin(), firing.end(),
                           [](const json& f) { return f["rule"] == "slow_rank" && f["rank"] == 2; });
      },
      60s))
      << firing.dump();
  EXPECT_THAT(ctl("alerts"), HasSubstr("FIRING  alert slow_rank: rank 2"));
  // Its hook ran with the alert in its environment, once per firing; the hanging hook was killed at its
  // timeout.
  const std::string hook_line = "slow_rank " + std::to_string(id) + "\n";
  EXPECT_TRUE(eventually(
      [&] {
        const std::string out = slurp(hook_out_.string());
        if (out.empty() || out.size() % hook_line.size() != 0) return false;
        for (size_t at = 0; at < out.size(); at += hook_line.size()) {
          if (out.compare(at, hook_line.size(), hook_line) != 0) return false;
        }
        return true;
      },
      20s))
      << slurp(hook_out_.string());
  std::vector<json> hooks;
  ASSERT_TRUE(eventually(
      [&] {
        // One read of the stream for both: "alert" is also the prefix of "alert_hook".
        const std::vector<json> seen = events(id, "alert");
        hooks.clear();
        int64_t firings = 0;
        for (const json& e : seen) {
          if (e["kind"] == "alert_hook") hooks.push_back(e);
          firings += e["kind"] == "alert";
        }
        return hooks.size() >= 2 && static_cast<int64_t>(hooks.size()) == firings;
      },
      30s));
  int loss_hooks = 0;
  for (const json& h : hooks) {
    const json p = json::parse(h["payload"].get<std::string>());
    if (p["rule"] == "loss_seen") {
      ++loss_hooks;
      EXPECT_TRUE(p["timed_out"].get<bool>()) << h.dump();
      EXPECT_THAT(h["message"].get<std::string>(), HasSubstr("killed after its 1 s timeout"));
    } else {
      EXPECT_EQ(p["exit_code"], 0) << h.dump();
    }
  }
  EXPECT_EQ(loss_hooks, 1);

  ASSERT_TRUE(eventually([&] { return run_state(id)["state"] != "running"; }, 180s)) << run_state(id).dump();
  // Once per firing: each rule fired exactly once over the run (evaluated hundreds of times), and each
  // firing cleared when the run ended, once.
  std::vector<json> all;
  ASSERT_TRUE(eventually(
      [&] {
        all = events(id, "alert");
        return std::count_if(all.begin(), all.end(),
                             [](const json& e) { return e["kind"] == "alert_cleared"; }) >= 2;
      },
      10s));
  std::map<std::string, int> fired_by_rule, cleared_by_rule;
  for (const json& e : all) {
    const json p = json::parse(e["payload"].get<std::string>());
    if (e["kind"] == "alert") ++fired_by_rule[p["rule"]];
    if (e["kind"] == "alert_cleared") ++cleared_by_rule[p["rule"]];
  }
  EXPECT_EQ(fired_by_rule["loss_seen"], 1);
  EXPECT_EQ(cleared_by_rule["loss_seen"], 1);
  EXPECT_GE(fired_by_rule["slow_rank"], 1);
  EXPECT_EQ(fired_by_rule["slow_rank"], cleared_by_rule["slow_rank"]);
  EXPECT_TRUE(get("/v1/alerts")["firing"].empty());
  // Deleted through ctl; the rules kept in the folder follow.
  EXPECT_THAT(ctl("alerts delete loss_seen"), HasSubstr("deleted"));
  EXPECT_EQ(get("/v1/alerts")["rules"].size(), 1u);
  EXPECT_THAT(slurp((dir_ / "alerts.json").string()), ::testing::Not(HasSubstr("loss_seen")));
}

}  // namespace
}  // namespace gantry
