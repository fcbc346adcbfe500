// 3D layouts through the control plane (issue 17, Operations): `gantry-engine up` with two nodes of two
// slots; runs submitted with tp and pp (through `ctl submit --tp/--pp` and the API) are placed in
// ParallelDims' rank order (tp innermost, a tp group or a pipeline on one node, dp across nodes), each
// rank's (dp, pp, tp) coordinate is in the ranks view, and the loss curve equals that of `gantry-engine
// run` on the same layout (same processes, same reduction order: the same numbers). Layouts that cannot
// run or cannot be placed are refused naming the numbers; a quarantine moves a tp group as a whole.
#include <signal.h>

#include <cstdio>
#include <cstring>  // strsignal
#include <fstream>
#include <map>
#include <regex>
#include <sstream>

#include "tests/app/cluster_fixture.h"

namespace gantry {
namespace {

using namespace cluster_testing;  // NOLINT: the fixture and its helpers are this suite's vocabulary

// Each step's loss from `run --json`'s lines on stdout.
std::map<int64_t, double> run_losses(const std::string& out) {
  std::map<int64_t, double> losses;
  std::istringstream in(out);
  for (std::string line; std::getline(in, line);) {
    const json j = json::parse(line, nullptr, false);
    if (j.is_object() && j.contains("step") && j.contains("loss"))
      losses[j["step"].get<int64_t>()] = j["loss"].get<double>();
  }
  return losses;
}

class Cluster3d : public ClusterCli {
 protected:
  std::string ctl() const { return "ctl --url " + url_ + " --token-file " + (dir_ / "token").string() + " "; }

  // Submits `config` through `ctl --json submit <layout>`, waits for it to finish and returns its id.
  int64_t submit_and_finish(const std::string& config, const std::string& layout) {
    testing_support::Outcome sub =
        run_engine("ctl --json --url " + url_ + " --token-file " + (dir_ / "token").string() +
                   " submit --config " + config + " " + layout);
    EXPECT_EQ(sub.code, 0) << sub.err;
    const json j = json::parse(sub.out, nullptr, false);
    EXPECT_TRUE(j.is_object()) << sub.out;
    if (!j.is_object()) return -1;
    const int64_t id = j.value("id", int64_t{-1});
    EXPECT_TRUE(eventually([&] { return run_state(id)["state"] == "finished"; }, 180s))
        << run_state(id).dump();
    return id;
  }

  // The coordinator's curve against `gantry-engine run`'s on the same layout.
  void expect_same_curve(int64_t id, const std::string& config, const std::string& run_layout, int steps) {
    const std::map<int64_t, double> cluster = losses(id);
    testing_support::Outcome local =
        run_engine("run " + run_layout + " --config " + config + " --out " +
                   (dir_ / ("local-" + std::to_string(id))).string() + " --json");
    ASSERT_EQ(local.code, 0) << local.err;
    const std::map<int64_t, double> ref = run_losses(local.out);
    ASSERT_EQ(ref.size(), static_cast<size_t>(steps)) << local.out;
    ASSERT_EQ(cluster.size(), static_cast<size_t>(steps));
    for (const auto& [step, loss] : ref) {
      ASSERT_TRUE(cluster.count(step)) << "step " << step;
      // The same layout in the same order: bitwise the same numbers (another layout of the same ranks,
      // dp 4 for tp2 x dp2, differs in the 8th digit: a lost --tp would show here).
      EXPECT_EQ(cluster.at(step), loss) << "step " << step;
    }
  }

  std::string config_file(const std::string& name, const std::string& text) {
    const std::string path = (dir_ / name).string();
    std::ofstream(path) << text;
    return path;
  }
};

TEST_F(Cluster3d, Tp2Dp2IsPlacedByTpGroupAndMatchesTheLocalLauncher) {
  const std::string cfg = config_file("tiny.toml", tiny_config(4));
  const int64_t id = submit_and_finish(cfg, "--dp 2 --tp 2");
  ASSERT_GE(id, 0);
  const json r = run_state(id);
  EXPECT_EQ(r["layout"]["tp"], 2);
  EXPECT_EQ(r["layout"]["pp"], 1);
  EXPECT_EQ(r["layout"]["dp"], 2);
  EXPECT_EQ(r["world"], 4);
  // Each tp group on one node: ranks 0-1 (dp 0) on one, 2-3 (dp 1) on the other.
  const json ranks = get("/v1/runs/" + std::to_string(id) + "/ranks")["ranks"];
  ASSERT_EQ(ranks.size(), 4u);
  for (const json& k : ranks) {
    const int rank = k["rank"].get<int>();
    EXPECT_EQ(k["coord"], json({{"dp", rank / 2}, {"pp", 0}, {"tp", rank % 2}})) << k.dump();
  }
  EXPECT_EQ(ranks[0]["node"], ranks[1]["node"]);
  EXPECT_EQ(ranks[2]["node"], ranks[3]["node"]);
  EXPECT_NE(ranks[0]["node"], ranks[2]["node"]);
  // ctl ranks prints the coordinate column.
  testing_support::Outcome table = run_engine(ctl() + "ranks " + std::to_string(id));
  EXPECT_EQ(table.code, 0) << table.err;
  EXPECT_THAT(table.out, HasSubstr("DP,PP,TP"));
  EXPECT_THAT(table.out, HasSubstr("(1,0,1)"));
  testing_support::Outcome runs = run_engine(ctl() + "runs");
  EXPECT_THAT(runs.out, HasSubstr("dp=2 tp=2 pp=1"));
  expect_same_curve(id, cfg, "--nproc 4 --tp 2", 4);
}

TEST_F(Cluster3d, Pp2Dp2IsPlacedByPipelineAndMatchesTheLocalLauncher) {
  // Two micro-batches per rank (16 / dp 2 / micro_batch 4): 1F1B fills a 2-stage pipe.
  std::string text = std::regex_replace(tiny_config(4), std::regex("micro_batch = \\d+"), "micro_batch = 4");
  text = std::regex_replace(text, std::regex("\\[train\\]"), "[train]\npp_schedule = \"1f1b\"");
  const std::string cfg = config_file("tiny-pp.toml", text);
  const int64_t id = submit_and_finish(cfg, "--dp 2 --pp 2");
  ASSERT_GE(id, 0);
  const json ranks = get("/v1/runs/" + std::to_string(id) + "/ranks")["ranks"];
  ASSERT_EQ(ranks.size(), 4u);
  for (const json& k : ranks) {
    const int rank = k["rank"].get<int>();
    EXPECT_EQ(k["coord"], json({{"dp", rank / 2}, {"pp", rank % 2}, {"tp", 0}})) << k.dump();
  }
  EXPECT_EQ(ranks[0]["node"], ranks[1]["node"]);  // a pipeline's stages on one node
  expect_same_curve(id, cfg, "--nproc 4 --pp 2", 4);
}

TEST_F(Cluster3d, LayoutsThatCannotRunOrBePlacedAreRefusedNamingTheNumbers) {
  const std::string cfg = config_file("tiny.toml", tiny_config(4));
  struct Case {
    std::string layout;
    int code;  // ctl: 2 bad input (400), 3 cannot be placed (409)
    std::string says;
  };
  for (const Case& c : std::vector<Case>{
           {"--dp 1 --tp 3", 2, "tp 3 does not divide model.n_head 4"},
           {"--dp 1 --pp 4", 2, "pp 4 x vp 1 = 4 stages but model.n_layer is 2"},
           {"--dp 2 --pp 2 --vp 2", 2, "vp 2"},
           // 4 ranks fit the 4 slots, but a tp group of 4 fits no node of 2.
           {"--dp 1 --tp 4", 3, "tp 4 needs 4 free slots on one node"},
           {"--dp 4 --tp 2", 3, "cannot place dp 4 x tp 2 x pp 1 (8 ranks)"},
       }) {
    testing_support::Outcome r = run_engine(ctl() + "submit --config " + cfg + " " + c.layout);
    EXPECT_EQ(r.code, c.code) << c.layout << ": " << r.err;
    EXPECT_THAT(r.err, HasSubstr(c.says)) << c.layout;
  }
  // Defects: the degrees' product overflowed int and was refused as "world size 0"; and the coordinator
  // checked tp without the config's sequence parallelism, so a seq_len that tp does not divide was
  // accepted (201), placed, and left a failed run behind when its workers refused it with exit code 2.
  testing_support::Outcome huge =
      run_engine(ctl() + "submit --config " + cfg + " --dp 1048576 --tp 1024 --pp 1024");
  EXPECT_EQ(huge.code, 2) << huge.err;
  EXPECT_THAT(huge.err,
              HasSubstr("dp 1048576 x tp 1024 x pp 1024 = 1099511627776 ranks, more than the 1048576"));
  std::string sp = std::regex_replace(tiny_config(4), std::regex("seq_len = \\d+"), "seq_len = 65");
  sp = std::regex_replace(sp, std::regex("\\[train\\]"), "[train]\nsequence_parallel = true");
  testing_support::Outcome seq =
      run_engine(ctl() + "submit --config " + config_file("tiny-sp.toml", sp) + " --dp 1 --tp 2");
  EXPECT_EQ(seq.code, 2) << seq.out << seq.err;
  EXPECT_THAT(seq.err, HasSubstr("tp 2 with train.sequence_parallel does not divide model.seq_len 65"));
  EXPECT_EQ(get("/v1/runs")["runs"].size(), 0u);
  EXPECT_TRUE(children_of(agent_pids()).empty()) << "a refused job started workers";
}

// A quarantine of the node under one tp group of a tp2 x dp2 run: the run checkpoints, stops and is placed
// again at dp 1 with its tp group whole on the other node (tp and pp are kept; dp is what shrinks), and
// trains on from the checkpoint.
TEST_F(Cluster3d, AQuarantineMovesATpGroupAsAWhole) {
  Result<json> sub = api_->post_json(
      "/v1/runs", {{"config", tiny_config(100000)}, {"layout", {{"dp", 2}, {"tp", 2}}}, {"min_dp", 1}});
  ASSERT_TRUE(sub.ok()) << sub.error();
  const int64_t id = sub->at("id").get<int64_t>();
  ASSERT_TRUE(eventually([&] { return last_step(id) >= 2; }, 60s)) << run_state(id).dump();
  Result<HttpReply> q = api_->post("/v1/nodes/node-1/quarantine", json::object());
  ASSERT_TRUE(q.ok()) << q.error();
  ASSERT_EQ(q->status, 202) << q->body;
  ASSERT_TRUE(eventually(
      [&] {
        const json r = run_state(id);
        return r["generation"] == 2 && r["state"] == "running";
      },
      60s))
      << run_state(id).dump();
  const int64_t placed_at = last_step(id);
  ASSERT_TRUE(eventually([&] { return last_step(id) > placed_at; }, 60s)) << run_state(id).dump();
  const json moved = run_state(id);
  EXPECT_EQ(moved["layout"], json({{"dp", 1}, {"tp", 2}, {"pp", 1}, {"vp", 1}, {"zero", 0}}));
  EXPECT_EQ(moved["world"], 2);
  const json ranks = get("/v1/runs/" + std::to_string(id) + "/ranks")["ranks"];
  ASSERT_EQ(ranks.size(), 2u);
  for (const json& k : ranks) {
    EXPECT_EQ(k["node"], "node-0");
    EXPECT_EQ(k["coord"]["dp"], 0);
  }
  ASSERT_TRUE(api_->post_json("/v1/runs/" + std::to_string(id) + "/stop", json::object()).ok());
  ASSERT_TRUE(eventually([&] { return run_state(id)["state"] == "stopped"; }, 60s)) << run_state(id).dump();
}

// Kill and starve a tp2 x pp2 gang (issue 17: a failure's recovery at pp > 1 had no test): its four ranks
// span both nodes (a tp group on each, the pipeline across them). Rank 2 killed with -9, then rank 1
// stopped with SIGSTOP (a hung stage: its peers block in a send/recv): each time the coordinator finds it
// (the exit; the hang timeout, naming rank 1), places the run again from its newest checkpoint on the same
// layout, and the run trains on; no worker of an old generation is left.
TEST_F(Cluster3d, AKilledAndAStoppedRankOfATp2Pp2RunAreRecoveredOnTheSameLayout) {
  const std::string text =
      std::regex_replace(tiny_config(100000), std::regex("micro_batch = \\d+"), "micro_batch = 4");
  Result<json> sub = api_->post_json("/v1/runs", {{"config", text},
                                                  {"layout", {{"dp", 1}, {"tp", 2}, {"pp", 2}}},
                                                  {"checkpoint_every_steps", 3},
                                                  {"hang_timeout_s", 3}});
  ASSERT_TRUE(sub.ok()) << sub.error();
  const int64_t id = sub->at("id").get<int64_t>();
  const std::string run = "/v1/runs/" + std::to_string(id);
  for (const int signal : {SIGKILL, SIGSTOP}) {
    const int restarts = run_state(id)["restarts"].get<int>();
    const int64_t from = last_step(id);
    ASSERT_TRUE(eventually([&] { return last_step(id) >= from + 4; }, 120s)) << run_state(id).dump();
    const std::vector<pid_t> before = children_of(agent_pids());
    workers_.insert(workers_.end(), before.begin(), before.end());
    const int rank = signal == SIGKILL ? 2 : 1;
    const pid_t victim = pid_of_rank(before, rank);
    ASSERT_GT(victim, 0) << "no worker with RANK=" << rank;
    ASSERT_EQ(::kill(victim, signal), 0);
    ASSERT_TRUE(eventually(
        [&] {
          const json r = run_state(id);
          return r["restarts"] == restarts + 1 && r["state"] == "running";
        },
        120s))
        << strsignal(signal) << ": " << run_state(id).dump();
    const int64_t placed_at = last_step(id);
    ASSERT_TRUE(eventually([&] { return last_step(id) > placed_at + 1; }, 120s)) << run_state(id).dump();
    const json r = run_state(id);
    EXPECT_EQ(r["layout"], json({{"dp", 1}, {"tp", 2}, {"pp", 2}, {"vp", 1}, {"zero", 0}}));
    EXPECT_EQ(r["world"], 4);
    // The failed generation's workers are gone, the stopped one included (the launcher kills it).
    for (pid_t p : before) EXPECT_TRUE(eventually([&] { return gone(p); }, 30s)) << "worker " << p << " left";
  }
  const std::vector<json> hangs = events(id, "hang");
  ASSERT_EQ(hangs.size(), 1u);
  const json hang = json::parse(hangs[0]["payload"].get<std::string>());
  EXPECT_EQ(hang.value("rank", -1), 1) << hang.dump();
  EXPECT_EQ(hang.value("process_state", ""), "T") << hang.dump();
  ASSERT_TRUE(api_->post_json(run + "/stop", json::object()).ok());
  ASSERT_TRUE(eventually([&] { return run_state(id)["state"] == "stopped"; }, 60s)) << run_state(id).dump();
  workers_ = children_of(agent_pids());
}

// What-if's Apply (issue 17) is resume-from on another layout: a stopped dp 2 run goes on at dp 1 x tp 2
// from its checkpoint (the checkpoint reshards to tp), the run's layout and ranks say so, and its steps
// continue past the checkpoint; a larger world than the run was recorded for names both numbers.
TEST_F(Cluster3d, ResumeFromMovesAStoppedRunToAnotherTp) {
  Result<json> sub =
      api_->post_json("/v1/runs", {{"config", tiny_config(100000)}, {"layout", {{"dp", 2}}}, {"min_dp", 1}});
  ASSERT_TRUE(sub.ok()) << sub.error();
  const int64_t id = sub->at("id").get<int64_t>();
  const std::string run = "/v1/runs/" + std::to_string(id);
  ASSERT_TRUE(eventually([&] { return last_step(id) >= 2; }, 60s)) << run_state(id).dump();
  ASSERT_TRUE(api_->post_json(run + "/stop", json::object()).ok());
  ASSERT_TRUE(eventually([&] { return run_state(id)["state"] == "stopped"; }, 60s)) << run_state(id).dump();
  const int64_t stopped_at = last_step(id);

  Result<HttpReply> big =
      api_->post(run + "/resume-from", {{"checkpoint", "latest"}, {"layout", {{"dp", 2}, {"tp", 2}}}});
  ASSERT_TRUE(big.ok());
  EXPECT_EQ(big->status, 400) << big->body;
  EXPECT_THAT(big->error_message(),
              HasSubstr("is 4 ranks, but run " + std::to_string(id) + " was recorded for at most 2 ranks"));

  Result<HttpReply> moved =
      api_->post(run + "/resume-from", {{"checkpoint", "latest"}, {"layout", {{"dp", 1}, {"tp", 2}}}});
  ASSERT_TRUE(moved.ok());
  ASSERT_EQ(moved->status, 202) << moved->body;
  ASSERT_TRUE(eventually([&] { return last_step(id) > stopped_at + 1; }, 60s)) << run_state(id).dump();
  const json r = run_state(id);
  EXPECT_EQ(r["layout"]["tp"], 2);
  EXPECT_EQ(r["layout"]["dp"], 1);
  const json ranks = get(run + "/ranks")["ranks"];
  ASSERT_EQ(ranks.size(), 2u);
  EXPECT_EQ(ranks[1]["coord"], json({{"dp", 0}, {"pp", 0}, {"tp", 1}}));
  EXPECT_EQ(ranks[0]["node"], ranks[1]["node"]);
  ASSERT_TRUE(api_->post_json(run + "/stop", json::object()).ok());
  ASSERT_TRUE(eventually([&] { return run_state(id)["state"] == "stopped"; }, 60s)) << run_state(id).dump();
}

// What-if's Apply on a live run: the operator stops it, then resumes it on the new layout. Defect: a live
// run's resume-from was refused for its state (409) before its layout was looked at, so a layout the model
// cannot take (tp 3 of 4 heads), or one no node can hold (a tp group of 4 on nodes of 2 slots), was found
// only after the stop, and the run stood stopped for nothing. Now those are refused while it trains
// (400 naming the numbers; 409 naming the placement, its own slots counted free), a layout that can be
// placed gets the state's 409 (stop it first), and the run trains on throughout.
TEST_F(Cluster3d, ResumeFromRefusesALayoutALiveRunCannotTakeBeforeItIsStopped) {
  Result<json> sub =
      api_->post_json("/v1/runs", {{"config", tiny_config(100000)}, {"layout", {{"dp", 4}}}, {"min_dp", 1}});
  ASSERT_TRUE(sub.ok()) << sub.error();
  const int64_t id = sub->at("id").get<int64_t>();
  const std::string run = "/v1/runs/" + std::to_string(id);
  ASSERT_TRUE(eventually([&] { return last_step(id) >= 2; }, 60s)) << run_state(id).dump();
  struct Case {
    json layout;
    int status;
    std::string says;
  };
  for (const Case& c : std::vector<Case>{
           {{{"dp", 1}, {"tp", 3}}, 400, "tp 3 does not divide model.n_head 4"},
           {{{"dp", 1}, {"tp", 4}}, 409, "tp 4 needs 4 free slots on one node"},
           // Placeable on the run's own slots: refused for the state only.
           {{{"dp", 2}, {"tp", 2}}, 409, "only a stopped, failed or interrupted run resumes"},
       }) {
    Result<HttpReply> r = api_->post(run + "/resume-from", {{"checkpoint", "latest"}, {"layout", c.layout}});
    ASSERT_TRUE(r.ok()) << r.error();
    EXPECT_EQ(r->status, c.status) << c.layout.dump() << ": " << r->body;
    EXPECT_THAT(r->error_message(), HasSubstr(c.says)) << c.layout.dump();
  }
  const int64_t at = last_step(id);
  ASSERT_TRUE(eventually([&] { return last_step(id) > at; }, 60s)) << "the run stopped training";
  const json r = run_state(id);
  EXPECT_EQ(r["state"], "running");
  EXPECT_EQ(r["generation"], 1);
  EXPECT_EQ(r["layout"]["dp"], 4);
  ASSERT_TRUE(api_->post_json(run + "/stop", json::object()).ok());
  ASSERT_TRUE(eventually([&] { return run_state(id)["state"] == "stopped"; }, 60s)) << run_state(id).dump();
}

// Pipeline checkpoints reshard (issue 17), so resume-from moves a run into a pipeline and out of it: a dp 2
// run stopped after a few steps goes on at pp 2 (its two stages on one node, each rank's coordinate
// saying so) from its checkpoint, then, stopped again, at dp 2 from the pipeline's checkpoint. Each move
// continues the curve: the first step after a resume is within 0.5 of the step before it (the loss falls by
// up to about 0.2 a step there; a model drawn afresh would start again near ln 256 = 5.55), and the steps go
// on past the checkpoint.
TEST_F(Cluster3d, ResumeFromMovesARunIntoAPipelineAndOutOfIt) {
  Result<json> sub =
      api_->post_json("/v1/runs", {{"config", tiny_config(100000)}, {"layout", {{"dp", 2}}}, {"min_dp", 1}});
  ASSERT_TRUE(sub.ok()) << sub.error();
  const int64_t id = sub->at("id").get<int64_t>();
  const std::string run = "/v1/runs/" + std::to_string(id);
  auto stop_after = [&](int64_t steps) {
    const int64_t from = last_step(id);
    EXPECT_TRUE(eventually([&] { return last_step(id) >= from + steps; }, 120s)) << run_state(id).dump();
    ASSERT_TRUE(api_->post_json(run + "/stop", json::object()).ok());
    ASSERT_TRUE(eventually([&] { return run_state(id)["state"] == "stopped"; }, 60s)) << run_state(id).dump();
  };
  // Resumes on `layout` from the latest checkpoint and checks the curve goes on from it.
  auto move_to = [&](const json& layout) {
    Result<HttpReply> r = api_->post(run + "/resume-from", {{"checkpoint", "latest"}, {"layout", layout}});
    ASSERT_TRUE(r.ok()) << r.error();
    ASSERT_EQ(r->status, 202) << r->body;
    const int64_t from = json::parse(r->body)["from_step"].get<int64_t>();
    ASSERT_TRUE(eventually([&] { return last_step(id) > from + 2; }, 120s)) << run_state(id).dump();
    const std::map<int64_t, double> l = losses(id);
    ASSERT_TRUE(l.count(from) && l.count(from + 1)) << "step " << from;
    std::fprintf(stderr, "moved to %s at step %lld: loss %.4f, then %.4f\n", layout.dump().c_str(),
                 static_cast<long long>(from), l.at(from), l.at(from + 1));
    EXPECT_LT(l.at(from), 4.8) << "the run had not learned before the move";
    EXPECT_NEAR(l.at(from + 1), l.at(from), 0.5) << "the curve jumped at the move to " << layout.dump();
  };
  stop_after(12);
  move_to({{"dp", 1}, {"pp", 2}});
  json r = run_state(id);
  EXPECT_EQ(r["layout"]["pp"], 2);
  EXPECT_EQ(r["layout"]["dp"], 1);
  EXPECT_EQ(r["world"], 2);
  const json ranks = get(run + "/ranks")["ranks"];
  ASSERT_EQ(ranks.size(), 2u);
  for (const json& k : ranks) {
    const int rank = k["rank"].get<int>();
    EXPECT_EQ(k["coord"], json({{"dp", 0}, {"pp", rank}, {"tp", 0}})) << k.dump();
  }
  EXPECT_EQ(ranks[0]["node"], ranks[1]["node"]);  // a pipeline's stages on one node

  stop_after(3);
  move_to({{"dp", 2}, {"pp", 1}});
  r = run_state(id);
  EXPECT_EQ(r["layout"]["pp"], 1);
  EXPECT_EQ(r["layout"]["dp"], 2);
  ASSERT_TRUE(api_->post_json(run + "/stop", json::object()).ok());
  ASSERT_TRUE(eventually([&] { return run_state(id)["state"] == "stopped"; }, 60s)) << run_state(id).dump();
}

}  // namespace
}  // namespace gantry
