// The control plane end to end, as an operator uses it: `gantry-engine up` starts a coordinator and two
// agents of two slots each (real processes on loopback); a dp-4 run of assets/configs/tiny.toml is
// submitted through the API, its steps arrive through the API, and checkpoint, pause, resume and stop
// take effect at one step on every rank (the events say so); a job that cannot be placed is refused with
// 409 and starts nothing; requests without the token get 401; `down` leaves no process behind. A
// quarantined node's run moves to the other node at dp 2 from its checkpoint, on the same loss curve, and
// a stopped run resumes from its latest checkpoint; resume-from never takes a path outside the run.
#include <algorithm>
#include <fstream>
#include <map>
#include <regex>
#include <thread>

#include "engine/cluster/agent_beat.h"
#include "engine/core/xxhash64.h"  // the manifest's checksum, as the catalog keeps it
#include "tests/app/cluster_fixture.h"

namespace gantry {
namespace {

using namespace cluster_testing;  // NOLINT: the fixture and its helpers are this suite's vocabulary

// A heartbeat with nothing to say (agent_beat.h), as a probe's credential would send it.
std::string empty_beat() {
  return agent_beat_encode({{"ended", json::array()}}, RecordBatch()).value();
}

TEST_F(ClusterCli, Dp4RunStepsAndActionsThroughTheApi) {
  json c = get("/v1/cluster");
  ASSERT_EQ(c["nodes"].size(), 2u);
  EXPECT_EQ(c["slots"], 4);

  // 8 ranks on 4 slots: refused with the reason, nothing started, nothing recorded.
  Result<HttpReply> refused = api_->post("/v1/runs", {{"config", tiny_config(10)}, {"layout", {{"dp", 8}}}});
  ASSERT_TRUE(refused.ok()) << refused.error();
  EXPECT_EQ(refused->status, 409);
  EXPECT_THAT(refused->error_message(), HasSubstr("cannot place dp 8"));
  EXPECT_THAT(refused->error_message(), HasSubstr("needs 8 free slots"));
  EXPECT_EQ(get("/v1/runs")["runs"].size(), 0u);
  EXPECT_TRUE(children_of(agent_pids()).empty()) << "a refused job started workers";

  // A dp-4 run: two ranks on each node.
  Result<json> sub =
      api_->post_json("/v1/runs", {{"config", tiny_config(100000)}, {"layout", {{"dp", 4}, {"zero", 1}}}});
  ASSERT_TRUE(sub.ok()) << sub.error();
  const int64_t id = sub->at("id").get<int64_t>();
  ASSERT_EQ(sub->at("placement").size(), 2u);
  ASSERT_TRUE(eventually([&] { return last_step(id) >= 3; }, 30s)) << run_state(id).dump();
  json steps = get("/v1/runs/" + std::to_string(id) + "/steps?after=0&ranks=all");
  ASSERT_GE(steps["steps"].size(), 3u);
  EXPECT_EQ(steps["steps"][0]["step"], 1);
  EXPECT_GT(steps["steps"][0]["loss"].get<double>(), 4.0);  // ln 256 = 5.5 at the start
  std::set<int> ranks_seen;
  for (const json& r : steps["rank_steps"]) ranks_seen.insert(r["rank"].get<int>());
  EXPECT_EQ(ranks_seen, (std::set<int>{0, 1, 2, 3}));
  workers_ = children_of(agent_pids());
  EXPECT_EQ(workers_.size(), 4u);
  EXPECT_EQ(get("/v1/runs/" + std::to_string(id) + "/ranks")["ranks"].size(), 4u);
  json band = get("/v1/runs/" + std::to_string(id) + "/steps?buckets=4");
  EXPECT_FALSE(band["loss"].empty());

  // Pause: no step advances; every rank paused at the same step.
  ASSERT_TRUE(api_->post_json("/v1/runs/" + std::to_string(id) + "/pause", json::object()).ok());
  ASSERT_TRUE(eventually([&] { return run_state(id)["state"] == "paused"; }, 10s));
  const int64_t paused_at = one_step_on_every_rank(id, "action_pause", 4);
  std::this_thread::sleep_for(600ms);
  EXPECT_EQ(last_step(id), paused_at) << "a step advanced while paused";

  // Checkpoint while paused: one committed checkpoint, at that step, on every rank's event.
  ASSERT_TRUE(api_->post_json("/v1/runs/" + std::to_string(id) + "/checkpoint", json::object()).ok());
  EXPECT_EQ(one_step_on_every_rank(id, "action_checkpoint", 4), paused_at);
  json ckpts = get("/v1/runs/" + std::to_string(id) + "/checkpoints");
  ASSERT_EQ(ckpts["checkpoints"].size(), 1u);
  EXPECT_EQ(ckpts["checkpoints"][0]["step"], paused_at);
  EXPECT_TRUE(fs::exists(ckpts["checkpoints"][0]["path"].get<std::string>() + "/manifest.json") ||
              fs::is_directory(ckpts["checkpoints"][0]["path"].get<std::string>()));
  {
    // Rank 0's typed checkpoint record, worker → agent → coordinator in the binary codec: its size is the
    // four shard files', its manifest checksum the committed manifest's, its stall the write (synchronous
    // today), and the run's events hold one line for it, for the whole gang.
    const json& ck = ckpts["checkpoints"][0];
    const std::string ckdir = ck["path"].get<std::string>();
    uint64_t shard_bytes = 0;
    int shard_files = 0;
    for (const fs::directory_entry& f : fs::directory_iterator(ckdir)) {
      if (f.path().filename().string().rfind("shard_", 0) != 0) continue;
      shard_bytes += f.file_size();
      ++shard_files;
    }
    EXPECT_EQ(shard_files, 4);
    EXPECT_EQ(ck["state"], "committed") << ck.dump();
    EXPECT_EQ(ck["bytes"].get<uint64_t>(), shard_bytes) << ck.dump();
    EXPECT_GT(ck["write_s"].get<double>(), 0.0) << ck.dump();
    ASSERT_TRUE(ck["stall_s"].is_number()) << ck.dump();
    EXPECT_GT(ck["stall_s"].get<double>(), 0.0);  // async (the default) stalls for the copy only
    EXPECT_EQ(ck["shards"], 4);
    std::ifstream in(ckdir + "/manifest.json", std::ios::binary);
    const std::string manifest{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
    EXPECT_EQ(ck["manifest_xxh64"], xxhash64_hex(xxhash64(manifest.data(), manifest.size())));
    std::vector<json> lines = events(id, "checkpoint");
    // Resuming the stream from a Last-Event-ID it never sent is refused, naming it (the old server read
    // "abc" as 0 and replayed from the start: the first event would end the read).
    for (const char* bad_id : {"abc", "1e3", "-1"}) {
      HttpEventStream resumed({.url = url_, .token = token_});
      const Status st = resumed.run(
          "/v1/runs/" + std::to_string(id) + "/events", [](const SseEvent&) { return false; }, bad_id);
      EXPECT_THAT(st.message(), HasSubstr("400 Bad Request: Last-Event-ID \"" + std::string(bad_id) + "\""));
    }
    std::erase_if(lines, [](const json& e) { return e["kind"] != "checkpoint"; });
    ASSERT_EQ(lines.size(), 1u);
    EXPECT_EQ(lines[0]["rank"], -1);
    EXPECT_EQ(lines[0]["step"], paused_at);
    EXPECT_THAT(lines[0]["message"].get<std::string>(), HasSubstr("checkpoint committed: " + ckdir));
  }

  // Resume: it advances again.
  ASSERT_TRUE(api_->post_json("/v1/runs/" + std::to_string(id) + "/resume", json::object()).ok());
  EXPECT_EQ(one_step_on_every_rank(id, "action_resume", 4), paused_at);
  ASSERT_TRUE(eventually([&] { return last_step(id) > paused_at + 1; }, 10s));

  // Stop: every rank stops at one step, checkpoints, and the run ends as stopped.
  Result<HttpReply> stop = api_->post("/v1/runs/" + std::to_string(id) + "/stop", json::object());
  ASSERT_TRUE(stop.ok());
  EXPECT_EQ(stop->status, 202);
  ASSERT_TRUE(eventually([&] { return run_state(id)["state"] == "stopped"; }, 20s)) << run_state(id).dump();
  const int64_t stopped_at = one_step_on_every_rank(id, "action_stop", 4);
  EXPECT_GT(stopped_at, paused_at);
  EXPECT_THAT(run_state(id)["message"].get<std::string>(), HasSubstr("stopped by the operator"));
  EXPECT_EQ(get("/v1/runs/" + std::to_string(id) + "/checkpoints")["checkpoints"].size(), 2u);
  for (pid_t w : workers_) EXPECT_TRUE(eventually([&] { return gone(w) || ::kill(w, 0) != 0; }, 5s));

  // Each request is an event with what, and from where.
  std::vector<json> asked = events(id, "action_requested");
  ASSERT_EQ(asked.size(), 4u);
  for (const json& e : asked) {
    json p = json::parse(e["payload"].get<std::string>());
    EXPECT_THAT(p["from"].get<std::string>(), HasSubstr("127.0.0.1:"));
  }
  // An action on a run that has ended is refused.
  Result<HttpReply> late = api_->post("/v1/runs/" + std::to_string(id) + "/pause", json::object());
  ASSERT_TRUE(late.ok());
  EXPECT_EQ(late->status, 409);

  // The whole cluster is free again; /metrics and /healthz answer.
  EXPECT_EQ(get("/v1/cluster")["busy_slots"], 0);
  Result<HttpReply> m = api_->get("/metrics");
  ASSERT_TRUE(m.ok());
  EXPECT_THAT(m->body, HasSubstr("gantry_runs{state=\"stopped\"} 1"));
}

// Honest numbers through the control plane: with train.peak_tflops set, every step record the workers send
// through their agents carries the job's MFU (global tokens/s over world × peak), and the run carries the
// formula and peak the console shows beside it; without a peak the step records have no MFU at all (not 0).
TEST_F(ClusterCli, StepRecordsCarryMfuWhenAPeakIsConfigured) {
  std::string cfg = tiny_config(100000);
  cfg = std::regex_replace(cfg, std::regex("\\[train\\]"), "[train]\npeak_tflops = 0.05");
  Result<json> sub = api_->post_json("/v1/runs", {{"config", cfg}, {"layout", {{"dp", 2}}}});
  ASSERT_TRUE(sub.ok()) << sub.error();
  const int64_t id = sub->at("id").get<int64_t>();
  EXPECT_EQ(sub->at("peak_name"), "cpu (configured)");
  EXPECT_DOUBLE_EQ(sub->at("peak_flops").get<double>(), 0.05e12);
  EXPECT_THAT(sub->at("mfu_formula").get<std::string>(), HasSubstr("peak = cpu (configured) 0.05 TFLOP/s"));
  ASSERT_TRUE(eventually([&] { return last_step(id) >= 3; }, 30s)) << run_state(id).dump();
  json steps = get("/v1/runs/" + std::to_string(id) + "/steps?after=0");
  ASSERT_GE(steps["steps"].size(), 3u);
  for (const json& s : steps["steps"]) {
    ASSERT_TRUE(s.contains("mfu") && s["mfu"].is_number()) << s.dump();
    EXPECT_GT(s["mfu"].get<double>(), 0) << s.dump();
    // Job MFU = global tokens/s × FLOPs per token ÷ (2 ranks × peak).
    const double want =
        s["tokens_per_s"].get<double>() * sub->at("flops_per_token").get<double>() / (2 * 0.05e12);
    EXPECT_NEAR(s["mfu"].get<double>(), want, 1e-9 * want) << s.dump();
    EXPECT_TRUE(s["hfu"].is_number()) << s.dump();
  }
  api_->post("/v1/runs/" + std::to_string(id) + "/stop", json::object());
  ASSERT_TRUE(eventually([&] { return run_state(id)["state"] == "stopped"; }, 20s)) << run_state(id).dump();

  // The same run without a peak: the records say nothing about MFU.
  sub = api_->post_json("/v1/runs", {{"config", tiny_config(100000)}, {"layout", {{"dp", 2}}}});
  ASSERT_TRUE(sub.ok()) << sub.error();
  const int64_t id2 = sub->at("id").get<int64_t>();
  EXPECT_DOUBLE_EQ(sub->at("peak_flops").get<double>(), 0);
  EXPECT_THAT(sub->at("mfu_formula").get<std::string>(), HasSubstr("MFU n/a"));
  ASSERT_TRUE(eventually([&] { return last_step(id2) >= 2; }, 30s)) << run_state(id2).dump();
  steps = get("/v1/runs/" + std::to_string(id2) + "/steps?after=0");
  ASSERT_GE(steps["steps"].size(), 2u);
  for (const json& s : steps["steps"]) EXPECT_TRUE(!s.contains("mfu") || s["mfu"].is_null()) << s.dump();
  api_->post("/v1/runs/" + std::to_string(id2) + "/stop", json::object());
  ASSERT_TRUE(eventually([&] { return run_state(id2)["state"] == "stopped"; }, 20s));
}

// Each agent serves its node's /metrics (the URL in <up dir>/agents/<node>/metrics_url, and in
// /v1/cluster's node list; the agents' token <up dir>/agent_token opens it): during a dp-4 run, node-0's
// exposition names node-0's two ranks and no other, with steps past 0 and the agent's own counters; without
// the token it is 401, /healthz is open.
TEST_F(ClusterCli, AgentServesItsNodesMetrics) {
  Result<json> sub = api_->post_json("/v1/runs", {{"config", tiny_config(100000)}, {"layout", {{"dp", 4}}}});
  ASSERT_TRUE(sub.ok()) << sub.error();
  const int64_t id = sub->at("id").get<int64_t>();
  ASSERT_TRUE(eventually([&] { return last_step(id) >= 2; }, 30s)) << run_state(id).dump();
  workers_ = children_of(agent_pids());
  std::set<std::string> node0_ranks;
  const json placed = run_state(id);  // named: a temporary would die before the loop body
  for (const json& share : placed["placement"]) {
    if (share["node"] != "node-0") continue;
    for (int k = 0; k < share["ranks"].get<int>(); ++k)
      node0_ranks.insert(std::to_string(share["first_rank"].get<int>() + k));
  }
  ASSERT_EQ(node0_ranks.size(), 2u);

  std::string url = slurp((dir_ / "agents" / "node-0" / "metrics_url").string());
  while (!url.empty() && url.back() == '\n') url.pop_back();
  ASSERT_THAT(url, ::testing::StartsWith("http://127.0.0.1:"));
  ASSERT_THAT(url, ::testing::EndsWith("/metrics"));
  const std::string base = url.substr(0, url.size() - std::string("/metrics").size());
  // The agents hold their own token (up writes it beside the operator's), and their /metrics take it.
  Result<std::string> agent_token_read = token_file_read((dir_ / "agent_token").string());
  ASSERT_TRUE(agent_token_read.ok()) << agent_token_read.error();
  const std::string agent_token = agent_token_read.value();
  EXPECT_THAT(slurp((dir_ / "agent-node-0.log").string()), HasSubstr("serving " + url));
  // The coordinator lists each node's metrics URL, as its agent registered it.
  const json cluster = get("/v1/cluster");
  std::map<std::string, std::string> metrics_urls;
  for (const json& n : cluster["nodes"])
    metrics_urls[n["id"].get<std::string>()] = n.value("metrics_url", "");
  EXPECT_EQ(metrics_urls["node-0"], url);
  std::string url1 = slurp((dir_ / "agents" / "node-1" / "metrics_url").string());
  while (!url1.empty() && url1.back() == '\n') url1.pop_back();
  EXPECT_EQ(metrics_urls["node-1"], url1);
  EXPECT_NE(url1, url);

  std::string body;
  std::set<std::string> ranks_named;
  ASSERT_TRUE(eventually(
      [&] {
        HttpClient agent({.url = base, .token = agent_token});
        Result<HttpReply> m = agent.get("/metrics");
        if (!m.ok() || m->status != 200) return false;
        body = m->body;
        ranks_named.clear();
        static const std::regex rank_label("rank=\"(\\d+)\"");
        for (auto it = std::sregex_iterator(body.begin(), body.end(), rank_label);
             it != std::sregex_iterator(); ++it)
          ranks_named.insert((*it)[1].str());
        return ranks_named == node0_ranks;
      },
      5s))
      << body;
  // Every sample line is a gantry_ metric; each local rank's step is past 0.
  std::istringstream lines(body);
  for (std::string line; std::getline(lines, line);)
    if (!line.empty() && line[0] != '#') {
      EXPECT_EQ(line.rfind("gantry_", 0), 0u) << line;
    }
  for (const std::string& rank : node0_ranks) {
    std::smatch m;
    ASSERT_TRUE(std::regex_search(body, m,
                                  std::regex("gantry_rank_step\\{run=\"" + std::to_string(id) + "\",rank=\"" +
                                             rank + "\"[^}]*\\} (\\S+)")))
        << "rank " << rank << ":\n"
        << body;
    EXPECT_GT(std::stod(m[1].str()), 0) << "rank " << rank;
  }
  EXPECT_THAT(body, HasSubstr("gantry_rank_step_seconds{"));
  EXPECT_THAT(body, HasSubstr("gantry_agent_workers_started_total 2"));
  EXPECT_THAT(body, HasSubstr("gantry_agent_heartbeats_total "));
  EXPECT_THAT(body, HasSubstr("gantry_agent_records_relayed_total "));

  HttpClient wrong({.url = base, .token = "0123456789abcdef0123456789abcdef"});
  Result<HttpReply> denied = wrong.get("/metrics");
  ASSERT_TRUE(denied.ok()) << denied.error();
  EXPECT_EQ(denied->status, 401);
  const int port = std::stoi(base.substr(base.rfind(':') + 1));
  EXPECT_EQ(raw_status(port, "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"), 401);
  EXPECT_EQ(raw_status(port, "GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"), 200);
}

// An agent killed: its node is lost within the heartbeat timeout (5 s) and, with recovery off, its run ends
// as failed, with an event naming the node; the other node's workers do not outlive it.
// (cluster_recovery_test: with recovery on, the run shrinks onto the node left.)
TEST_F(ClusterCli, KilledAgentLosesItsNodeStopsTheRunAndTheLostNodeIsForgotten) {
  Result<json> sub = api_->post_json(
      "/v1/runs", {{"config", tiny_config(100000)}, {"layout", {{"dp", 4}}}, {"max_restarts", 0}});
  ASSERT_TRUE(sub.ok()) << sub.error();
  const int64_t id = sub->at("id").get<int64_t>();
  ASSERT_TRUE(eventually([&] { return last_step(id) >= 2; }, 30s)) << run_state(id).dump();
  workers_ = children_of(agent_pids());
  const pid_t agent1 = static_cast<pid_t>(std::stol(slurp((dir_ / "agent-node-1.pid").string())));
  ASSERT_EQ(::kill(agent1, SIGKILL), 0);
  ASSERT_TRUE(eventually(
      [&] {
        const json cluster = get("/v1/cluster");  // named: a temporary would die before the loop body
        for (const json& n : cluster["nodes"])
          if (n["id"] == "node-1") return n["state"] == "lost";
        return false;
      },
      10s));
  ASSERT_TRUE(eventually([&] { return run_state(id)["state"] == "failed"; }, 10s)) << run_state(id).dump();
  std::vector<json> lost = events(id, "node_lost");
  ASSERT_EQ(lost.size(), 1u);
  EXPECT_EQ(lost[0]["node"], "node-1");
  for (pid_t w : workers_)
    EXPECT_TRUE(eventually([&] { return gone(w); }, 10s)) << "worker " << w << " outlived the run";

  // The lost node stayed listed for ever (a decommissioned machine among the live ones). Now an operator
  // forgets it; a node that beats is refused, with what would make it forgettable.
  const std::string ctl = "ctl --url " + url_ + " --token-file " + (dir_ / "token").string() + " ";
  testing_support::Outcome healthy = run_engine(ctl + "forget node-0");
  EXPECT_NE(healthy.code, 0);
  EXPECT_THAT(healthy.err, HasSubstr("node \"node-0\" is healthy"));
  EXPECT_THAT(healthy.err, HasSubstr("only a lost node is forgotten; stop its agent"));
  testing_support::Outcome forgot = run_engine(ctl + "forget node-1");
  EXPECT_EQ(forgot.code, 0) << forgot.err;
  EXPECT_THAT(forgot.out, HasSubstr("node node-1 forgotten"));
  const json cluster = get("/v1/cluster");
  ASSERT_EQ(cluster["nodes"].size(), 1u) << cluster.dump();
  EXPECT_EQ(cluster["nodes"][0]["id"], "node-0");
  Result<HttpReply> again = api_->del("/v1/nodes/node-1");
  ASSERT_TRUE(again.ok()) << again.error();
  EXPECT_EQ(again->status, 404);
  EXPECT_EQ(again->error_message(), "no node \"node-1\" (GET /v1/cluster lists them)");
  // The run that ran there still names it.
  EXPECT_EQ(events(id, "node_lost").size(), 1u);
}

TEST_F(ClusterCli, TokenIsRequiredAndBadInputChangesNothing) {
  HttpClient none({.url = url_, .token = "0123456789abcdef0123456789abcdef"});
  for (const char* path : {"/v1/cluster", "/v1/runs", "/metrics"}) {
    Result<HttpReply> r = none.get(path);
    ASSERT_TRUE(r.ok()) << r.error();
    EXPECT_EQ(r->status, 401) << path;
  }
  Result<HttpReply> sub = none.post("/v1/runs", {{"config", tiny_config(5)}, {"layout", {{"dp", 1}}}});
  ASSERT_TRUE(sub.ok());
  EXPECT_EQ(sub->status, 401);
  Result<HttpReply> health = none.get("/healthz");
  ASSERT_TRUE(health.ok());
  EXPECT_EQ(health->status, 200);
  // A bad config or layout: 400 naming the field; nothing recorded.
  Result<HttpReply> bad =
      api_->post("/v1/runs", {{"config", "[model]\nn_head = 0\n"}, {"layout", {{"dp", 1}}}});
  ASSERT_TRUE(bad.ok());
  EXPECT_EQ(bad->status, 400);
  EXPECT_THAT(bad->error_message(), HasSubstr("config"));
  Result<HttpReply> bad_dp =
      api_->post("/v1/runs", {{"config", tiny_config(5)}, {"layout", {{"dp", "four"}}}});
  ASSERT_TRUE(bad_dp.ok());
  EXPECT_EQ(bad_dp->status, 400);
  EXPECT_THAT(bad_dp->error_message(), HasSubstr("layout.dp"));
  EXPECT_EQ(get("/v1/runs")["runs"].size(), 0u);

  // ctl: a refusal exits 3 with the reason; status prints the nodes.
  const std::string cfg = (dir_ / "tiny.toml").string();
  std::ofstream(cfg) << tiny_config(5);
  const std::string ctl = "ctl --url " + url_ + " --token-file " + (dir_ / "token").string() + " ";
  testing_support::Outcome refused = run_engine(ctl + "submit --config " + cfg + " --dp 8");
  EXPECT_EQ(refused.code, 3);
  EXPECT_THAT(refused.err, HasSubstr("409"));
  // A layout the batch cannot take is bad input: exit 2, naming both numbers.
  testing_support::Outcome unsplittable = run_engine(ctl + "submit --config " + cfg + " --dp 5");
  EXPECT_EQ(unsplittable.code, 2);
  EXPECT_THAT(unsplittable.err, HasSubstr("train.global_batch = 16 cannot be split over 5"));
  testing_support::Outcome status = run_engine(ctl + "status");
  EXPECT_EQ(status.code, 0) << status.err;
  EXPECT_THAT(status.out, HasSubstr("node-0"));
  EXPECT_THAT(status.out, HasSubstr("node-1"));
}

// Quarantine of a node that holds half of a dp-4 run: the run checkpoints and stops at one step, is
// placed again without the node (no spare: dp 2, the largest that fits node-0 and divides
// global_batch = 16) and resumes from that checkpoint, under the same run id, every stage an event. The
// loss curve goes on: the steps continue the numbering without a gap, and the losses after the move match a
// dp-2 run trained from scratch on the released node (the checkpoint reshards exactly; only the order of
// the gradient sums differs). Then stop, refusals that change nothing, and resume-from latest.
TEST_F(ClusterCli, QuarantineMovesTheRunAndResumeFromContinues) {
  Result<json> sub =
      api_->post_json("/v1/runs", {{"config", tiny_config(100000)}, {"layout", {{"dp", 4}, {"zero", 1}}}});
  ASSERT_TRUE(sub.ok()) << sub.error();
  const int64_t id = sub->at("id").get<int64_t>();
  const std::string run = "/v1/runs/" + std::to_string(id);
  ASSERT_TRUE(eventually([&] { return last_step(id) >= 3; }, 30s)) << run_state(id).dump();

  Result<HttpReply> q = api_->post("/v1/nodes/node-1/quarantine", json::object());
  ASSERT_TRUE(q.ok()) << q.error();
  ASSERT_EQ(q->status, 202) << q->body;
  EXPECT_EQ(json::parse(q->body)["moving_runs"], json::array({id}));
  EXPECT_EQ(api_->post("/v1/nodes/node-1/quarantine", json::object())->status, 409);  // already
  EXPECT_EQ(api_->post("/v1/nodes/node-9/quarantine", json::object())->status, 404);

  // Polled through the run's state, not its event stream: each stream holds one of the server's few
  // stream places until it notices the client left.
  ASSERT_TRUE(eventually(
      [&] {
        const json r = run_state(id);
        return r["generation"] == 2 && r["state"] == "running";
      },
      40s))
      << run_state(id).dump();
  const int64_t placed_at = last_step(id);
  ASSERT_TRUE(eventually([&] { return last_step(id) > placed_at; }, 30s)) << run_state(id).dump();
  const json moved = run_state(id);
  EXPECT_EQ(moved["layout"]["dp"], 2);
  ASSERT_EQ(moved["placement"].size(), 1u);
  EXPECT_EQ(moved["placement"][0]["node"], "node-0");
  const std::vector<json> all = events(id, "");
  auto of_kind = [](const std::vector<json>& evs, const std::string& kind) {
    std::vector<json> out;
    for (const json& e : evs)
      if (e.value("kind", "") == kind) out.push_back(e);
    return out;
  };
  for (const char* stage : {"quarantine_requested", "quarantine_checkpointed", "quarantine_stopped",
                            "quarantine_placed", "quarantine_resumed"}) {
    ASSERT_EQ(of_kind(all, stage).size(), 1u) << stage;
  }
  const int64_t ckpt_step = of_kind(all, "quarantine_checkpointed")[0]["step"].get<int64_t>();
  EXPECT_EQ(placed_at, ckpt_step);
  EXPECT_EQ(of_kind(all, "quarantine_resumed")[0]["step"], ckpt_step + 1);
  std::set<int> stop_ranks;
  for (const json& e : of_kind(all, "action_stop")) {
    EXPECT_EQ(e["step"], ckpt_step) << "rank " << e["rank"] << " stopped at another step";
    stop_ranks.insert(e["rank"].get<int>());
  }
  EXPECT_EQ(stop_ranks, (std::set<int>{0, 1, 2, 3}));
  EXPECT_THAT(of_kind(all, "quarantine_placed")[0]["message"].get<std::string>(), HasSubstr("dp 4 -> 2"));
  const json cluster = get("/v1/cluster");
  for (const json& n : cluster["nodes"]) {
    if (n["id"] == "node-1") {
      EXPECT_EQ(n["state"], "quarantined");
      EXPECT_EQ(n["busy_slots"], 0);
    }
  }

  // The curve: steps 1.. without a gap across the move.
  ASSERT_TRUE(eventually([&] { return last_step(id) >= ckpt_step + 3; }, 30s));
  json steps = get(run + "/steps?after=0&limit=1000")["steps"];
  std::map<int64_t, double> loss;
  for (const json& s : steps) loss[s["step"].get<int64_t>()] = s["loss"].get<double>();
  for (int64_t k = 1; k <= ckpt_step + 3; ++k) EXPECT_TRUE(loss.count(k)) << "step " << k << " missing";

  // The reference: dp 2 from scratch on the released node, to two steps past the move.
  Result<HttpReply> rel = api_->post("/v1/nodes/node-1/release", json::object());
  ASSERT_TRUE(rel.ok());
  EXPECT_EQ(rel->status, 200) << rel->body;
  Result<json> ref = api_->post_json(
      "/v1/runs", {{"config", tiny_config(100000)}, {"layout", {{"dp", 2}}}, {"max_steps", ckpt_step + 2}});
  ASSERT_TRUE(ref.ok()) << ref.error();
  const int64_t ref_id = ref->at("id").get<int64_t>();
  EXPECT_EQ(ref->at("placement")[0]["node"], "node-1");
  ASSERT_TRUE(eventually([&] { return run_state(ref_id)["state"] == "finished"; }, 60s))
      << run_state(ref_id).dump();
  json ref_steps = get("/v1/runs/" + std::to_string(ref_id) + "/steps?after=0&limit=1000")["steps"];
  std::map<int64_t, double> ref_loss;
  for (const json& s : ref_steps) ref_loss[s["step"].get<int64_t>()] = s["loss"].get<double>();
  for (int64_t k : {ckpt_step, ckpt_step + 1, ckpt_step + 2}) {
    ASSERT_TRUE(ref_loss.count(k) && loss.count(k)) << k;
    EXPECT_NEAR(loss[k], ref_loss[k], 1e-4) << "step " << k << ": the moved run left the reference curve";
  }

  // Stop, then refusals that change nothing: malformed JSON (400), an oversized body (413), a path
  // outside the run's checkpoints (400), a run that is not stopped (409).
  ASSERT_TRUE(api_->post_json(run + "/stop", json::object()).ok());
  ASSERT_TRUE(eventually([&] { return run_state(id)["state"] == "stopped"; }, 20s)) << run_state(id).dump();
  const int64_t stopped_at = last_step(id);
  const int port = std::stoi(url_.substr(url_.rfind(':') + 1));
  const std::string head = "Host: x\r\nAuthorization: Bearer " + token_ +
                           "\r\nContent-Type: application/json\r\nConnection: close\r\n";
  for (const std::string& path :
       {run + "/resume-from", std::string("/v1/nodes/node-0/quarantine"), std::string("/v1/runs")}) {
    const std::string bad = "{\"checkpoint\": ";
    EXPECT_EQ(raw_status(port, "POST " + path + " HTTP/1.1\r\n" + head +
                                   "Content-Length: " + std::to_string(bad.size()) + "\r\n\r\n" + bad),
              400)
        << path;
    EXPECT_EQ(raw_status(port, "POST " + path + " HTTP/1.1\r\n" + head +
                                   "Content-Length: " + std::to_string(64u << 20) + "\r\n\r\n{}"),
              413)
        << path;
  }
  for (const json& outside :
       {json("../../etc"), json("/etc"), json(dir_.string() + "/runs/1/checkpoints/step_00000001"),
        json(".."), json(json::array())}) {
    Result<HttpReply> r = api_->post(run + "/resume-from", {{"checkpoint", outside}});
    ASSERT_TRUE(r.ok());
    EXPECT_EQ(r->status, 400) << outside.dump() << ": " << r->body;
  }
  Result<HttpReply> no_step = api_->post(run + "/resume-from", {{"checkpoint", 99999}});
  EXPECT_EQ(no_step->status, 400);
  EXPECT_THAT(no_step->error_message(), HasSubstr("no committed checkpoint at step 99999"));
  EXPECT_EQ(api_->post(run + "/resume-from", {{"checkpoint", "latest"}, {"layout", {{"dp", 3}}}})->status,
            400);
  EXPECT_EQ(api_->post("/v1/runs/" + std::to_string(ref_id + 1) + "/resume-from", {{"checkpoint", "latest"}})
                ->status,
            404);
  EXPECT_EQ(run_state(id)["state"], "stopped");
  EXPECT_EQ(run_state(id)["generation"], 2);
  const json nodes_now =
      get("/v1/cluster");  // held: a range over get(...)["nodes"] would dangle and check nothing
  EXPECT_EQ(nodes_now["nodes"].size(), 2u) << nodes_now.dump();
  for (const json& n : nodes_now["nodes"]) EXPECT_EQ(n["state"], "healthy") << n.dump();
  EXPECT_EQ(get("/v1/runs")["runs"].size(), 2u);

  // resume-from latest, on dp 4 over both nodes again (through ctl): it continues where it stopped.
  const std::string ctl = "ctl --url " + url_ + " --token-file " + (dir_ / "token").string() + " ";
  testing_support::Outcome res = run_engine(ctl + "resume-from " + std::to_string(id) + " --dp 4");
  ASSERT_EQ(res.code, 0) << res.err;
  EXPECT_THAT(res.out, HasSubstr("step " + std::to_string(stopped_at)));
  ASSERT_TRUE(eventually([&] { return last_step(id) > stopped_at; }, 30s)) << run_state(id).dump();
  const std::vector<json> later = events(id, "resume_");
  ASSERT_EQ(of_kind(later, "resume_resumed").size(), 1u);
  EXPECT_EQ(of_kind(later, "resume_resumed")[0]["step"], stopped_at + 1);
  EXPECT_EQ(of_kind(later, "resume_requested").size(), 1u);
  EXPECT_EQ(of_kind(later, "resume_placed").size(), 1u);
  EXPECT_EQ(run_state(id)["layout"]["dp"], 4);
  EXPECT_EQ(run_state(id)["generation"], 3);
  Result<HttpReply> busy = api_->post(run + "/resume-from", {{"checkpoint", "latest"}});
  EXPECT_EQ(busy->status, 409);  // it runs
  ASSERT_TRUE(api_->post_json(run + "/stop", json::object()).ok());
  ASSERT_TRUE(eventually([&] { return run_state(id)["state"] == "stopped"; }, 20s)) << run_state(id).dump();
  EXPECT_GT(last_step(id), stopped_at);
}

// The straggler policy end to end: rank 2 (node-1) sleeps 500 ms in every forward pass (the test fault
// slow_forward), the other ranks wait for it in their collectives. Scored on the busy basis, rank 2 alone is
// flagged in /v1/runs/{id}/ranks, with forward as its slow phase, one straggler event names it and its node,
// and `ctl ranks` shows it; moved off its node by a quarantine, the flag is cleared with an event; straggler
// options that do not fit are refused naming the field.
class ClusterCliSlowRank : public ClusterCli {
 protected:
  std::string worker_fault() const override { return "2:slow_forward:500"; }
};

TEST_F(ClusterCliSlowRank, TheSlowRankIsFlaggedWithItsNodeAndPhase) {
  // Bad options: 400 naming the field, nothing recorded.
  for (const auto& [bad, field] : std::vector<std::pair<json, std::string>>{
           {{{"window_steps", 10}, {"min_samples", 20}}, "straggler.min_samples"},
           {{{"windw_steps", 4}}, "straggler.windw_steps"},
           {{{"relative_threshold", "high"}}, "straggler.relative_threshold"},
           {json::array(), "straggler"}}) {
    Result<HttpReply> r =
        api_->post("/v1/runs", {{"config", tiny_config(5)}, {"layout", {{"dp", 4}}}, {"straggler", bad}});
    ASSERT_TRUE(r.ok()) << r.error();
    EXPECT_EQ(r->status, 400) << bad.dump();
    EXPECT_THAT(r->error_message(), HasSubstr(field)) << bad.dump();
  }
  EXPECT_EQ(get("/v1/runs")["runs"].size(), 0u);

  // Windows of 5 steps, flagged after two evaluations in a row under 0.4: the slow rank's busy time is the
  // others' plus 500 ms. The individual score (against the rank's own best) is left out: it is meant for a
  // rank that slows down during the run, and rank 2 is slow from its first step.
  const json straggler = {{"window_steps", 5},
                          {"min_samples", 5},
                          {"windows_to_flag", 2},
                          {"relative_threshold", 0.4},
                          {"individual_threshold", 0}};
  Result<json> sub = api_->post_json(
      "/v1/runs", {{"config", tiny_config(100000)}, {"layout", {{"dp", 4}}}, {"straggler", straggler}});
  ASSERT_TRUE(sub.ok()) << sub.error();
  const int64_t id = sub->at("id").get<int64_t>();
  const std::string run = "/v1/runs/" + std::to_string(id);
  EXPECT_EQ(sub->at("straggler")["basis"], "busy");
  EXPECT_EQ(sub->at("straggler")["window_steps"], 5);
  workers_ = children_of(pids_);

  json ranks;
  ASSERT_TRUE(eventually(
      [&] {
        ranks = get(run + "/ranks");
        return ranks["straggler"]["flagged"] == json::array({2});
      },
      90s))
      << ranks.dump();
  workers_ = children_of(pids_);
  EXPECT_GE(ranks["straggler"]["evaluations"].get<int>(), 2);
  ASSERT_EQ(ranks["ranks"].size(), 4u);
  for (const json& k : ranks["ranks"]) {
    const int rank = k["rank"].get<int>();
    const json& s = k["straggler"];
    ASSERT_TRUE(s.is_object()) << k.dump();
    EXPECT_EQ(s["samples"], 5) << k.dump();
    if (rank == 2) {
      EXPECT_EQ(k["node"], "node-1");
      EXPECT_EQ(s["flagged"], true);
      EXPECT_LT(s["relative"].get<double>(), 0.4);
      EXPECT_EQ(s["slow_phase"], "forward");
      EXPECT_GT(s["slow_phase_excess_s"].get<double>(),
                0.25);  // 500 ms slept against the median rank's forward
      EXPECT_GT(s["median_s"].get<double>(), 0.5);
      // Its excess: busy time over the median rank's, and the words `ctl ranks` and the console print.
      EXPECT_GT(s["excess_s"].get<double>(), 0.25);
      EXPECT_THAT(s["excess"].get<std::string>(), testing::StartsWith("forward +0."));
      EXPECT_GT(k["busy_seconds"].get<double>(), 0.5);
    } else {
      EXPECT_EQ(s["flagged"], false) << k.dump();
      EXPECT_GT(s["relative"].get<double>(), 0.4) << k.dump();
    }
  }

  // One straggler event: rank 2, its node, its slow phase and scores.
  std::vector<json> flagged = events(id, "straggler");
  ASSERT_EQ(flagged.size(), 1u) << flagged.size();
  EXPECT_EQ(flagged[0]["kind"], "straggler");
  EXPECT_EQ(flagged[0]["rank"], 2);
  EXPECT_EQ(flagged[0]["node"], "node-1");
  json p = json::parse(flagged[0]["payload"].get<std::string>());
  EXPECT_EQ(p["node"], "node-1");
  EXPECT_EQ(p["slow_phase"], "forward");
  EXPECT_LT(p["relative"].get<double>(), 0.4);
  EXPECT_THAT(flagged[0]["message"].get<std::string>(), HasSubstr("slow phase forward"));

  // ctl ranks: a table with rank 2 flagged, and the API's JSON with --json.
  const std::string ctl = "ctl --url " + url_ + " --token-file " + (dir_ / "token").string() + " ";
  testing_support::Outcome table = run_engine(ctl + "ranks " + std::to_string(id));
  ASSERT_EQ(table.code, 0) << table.err;
  std::istringstream lines(table.out);
  int straggler_rows = 0;
  for (std::string line; std::getline(lines, line);) {
    if (line.find("STRAGGLER") == std::string::npos) continue;
    ++straggler_rows;
    EXPECT_EQ(line.rfind("2 ", 0), 0u) << line;
    EXPECT_THAT(line, HasSubstr("node-1"));
    EXPECT_THAT(line, HasSubstr("forward +"));
  }
  EXPECT_EQ(straggler_rows, 1) << table.out;
  testing_support::Outcome js = run_engine("ctl --json --url " + url_ + " --token-file " +
                                           (dir_ / "token").string() + " ranks " + std::to_string(id));
  ASSERT_EQ(js.code, 0) << js.err;
  EXPECT_EQ(json::parse(js.out)["ranks"][2]["straggler"]["flagged"], true);
  Result<HttpReply> m = api_->get("/metrics");
  ASSERT_TRUE(m.ok());
  EXPECT_THAT(m->body, HasSubstr("gantry_run_stragglers{run=\"" + std::to_string(id) + "\"} 1"));

  // Quarantine node-1: the run moves to node-0 at dp 2, its ranks on other devices, so the flag ends with a
  // straggler_cleared event saying why, and the scores start over.
  ASSERT_EQ(api_->post("/v1/nodes/node-1/quarantine", json::object())->status, 202);
  ASSERT_TRUE(eventually(
      [&] {
        const json r = run_state(id);
        return r["generation"] == 2 && r["state"] == "running";
      },
      40s))
      << run_state(id).dump();
  for (pid_t w : children_of(pids_)) workers_.push_back(w);
  std::vector<json> cleared = events(id, "straggler_cleared");
  ASSERT_EQ(cleared.size(), 1u);
  EXPECT_EQ(cleared[0]["rank"], 2);
  EXPECT_EQ(cleared[0]["node"], "node-1");
  EXPECT_THAT(cleared[0]["message"].get<std::string>(), HasSubstr("placed again"));
  const json after = get(run + "/ranks");
  EXPECT_EQ(after["straggler"]["flagged"], json::array());
  EXPECT_EQ(after["ranks"].size(), 2u);

  ASSERT_TRUE(api_->post_json(run + "/stop", json::object()).ok());
  ASSERT_TRUE(eventually([&] { return run_state(id)["state"] == "stopped"; }, 30s)) << run_state(id).dump();
}

// The slow rank is where an operator looks for it: rank 2's forward sleeps 2 s, the others wait for it in
// their collectives, so on total time every rank looks the same; on busy time (the default of the
// coordinator's tile queries, which the console's heatmap and band draw) rank 2 holds the maximum of every
// bucket of the band, and its own cells are above every other rank's at every step. The metric parameter
// takes the step time or any part of it, and refuses anything else naming the allowed values. (2 s, not the
// 500 ms above: on a loaded 2-core machine a rank's compute alone has been seen to take 0.94 s.)
class ClusterCliVerySlowRank : public ClusterCli {
 protected:
  std::string worker_fault() const override { return "2:slow_forward:2000"; }
};

TEST_F(ClusterCliVerySlowRank, TheSlowRankHoldsTheBusyHeatmapsMaxima) {
  Result<json> sub = api_->post_json("/v1/runs", {{"config", tiny_config(100000)}, {"layout", {{"dp", 4}}}});
  ASSERT_TRUE(sub.ok()) << sub.error();
  const int64_t id = sub->at("id").get<int64_t>();
  const std::string run = "/v1/runs/" + std::to_string(id);
  workers_ = children_of(pids_);
  ASSERT_TRUE(eventually([&] { return last_step(id) >= 6; }, 120s)) << run_state(id).dump();
  workers_ = children_of(pids_);

  for (const std::string bad : {"speed", "busy_s", "", "total,busy"}) {
    Result<HttpReply> r = api_->get(run + "/steps?buckets=8&metric=" + bad);
    ASSERT_TRUE(r.ok()) << r.error();
    EXPECT_EQ(r->status, 400) << bad;
    for (const char* allowed : {"busy", "total", "data_wait", "forward", "backward", "optimizer",
                                "comm_exposed", "checkpoint_stall"})
      EXPECT_THAT(r->error_message(), HasSubstr(allowed)) << bad;
  }

  // One step per bucket; only whole steps (all four ranks in) are compared, the newest may be partial.
  const json band = get(run + "/steps?buckets=100000");
  EXPECT_EQ(band["metric"], "busy");
  int whole = 0;
  for (const json& b : band["rank_seconds"]) {
    if (b["count"] != 4) continue;
    ++whole;
    EXPECT_EQ(b["max_rank"], 2) << b.dump();
    EXPECT_GT(b["max"].get<double>(), 2.0) << b.dump();
    EXPECT_LT(b["min"].get<double>(), 2.0) << b.dump();
  }
  EXPECT_GE(whole, 5) << band.dump();
  const json forward = get(run + "/steps?buckets=100000&metric=forward");
  EXPECT_EQ(forward["metric"], "forward");
  for (const json& b : forward["rank_seconds"])
    if (b["count"] == 4) {
      EXPECT_EQ(b["max_rank"], 2) << b.dump();
    }
  EXPECT_EQ(get(run + "/steps?buckets=100000&metric=total")["metric"], "total");

  // Each rank's own cells (the heatmap's rows): rank 2's are the column's maximum wherever all four answered.
  std::map<int64_t, std::map<int, double>> cells;  // step -> rank -> busy seconds
  std::string answers;
  for (int rank = 0; rank < 4; ++rank) {
    const json one = get(run + "/steps?buckets=100000&ranks=" + std::to_string(rank));
    answers += one.dump() + "\n";
    for (const json& b : one["rank_seconds"])
      cells[b["step_begin"].get<int64_t>()][rank] = b["max"].get<double>();
  }
  int columns = 0;
  for (const auto& [step, by_rank] : cells) {
    if (by_rank.size() != 4) continue;
    ++columns;
    for (const auto& [rank, v] : by_rank)
      if (rank != 2) {
        EXPECT_GT(by_rank.at(2), v + 0.5) << "step " << step << " rank " << rank;
      }
  }
  EXPECT_GE(columns, 5) << answers;

  // The heatmap tile query (what the console draws): one row per rank, one column per step; its cells equal
  // the per-rank answers above, and rank 2 holds the maximum of every whole column.
  const json heat = get(run + "/heatmap?metric=busy&buckets=100000&rank_buckets=4");
  ASSERT_EQ(heat["rows"], 4) << heat.dump();
  EXPECT_EQ(heat["ranks_per_row"], 1);
  EXPECT_EQ(heat["bucket_steps"], 1);
  const int64_t cols = heat["cols"].get<int64_t>(), first = heat["first_step"].get<int64_t>();
  ASSERT_EQ(heat["max"].size(), static_cast<size_t>(4 * cols));
  std::vector<int64_t> whole_steps;
  for (int64_t c = 0; c < cols; ++c) {
    const auto it = cells.find(first + c);
    if (it == cells.end() || it->second.size() != 4) continue;
    bool all_in = true;
    for (int rank = 0; rank < 4; ++rank) all_in = all_in && !heat["max"][rank * cols + c].is_null();
    if (!all_in) continue;  // the newest step may have been partial when the heatmap was read
    whole_steps.push_back(first + c);
    for (int rank = 0; rank < 4; ++rank) {
      const json& v = heat["max"][rank * cols + c];
      EXPECT_NEAR(v.get<double>(), it->second.at(rank), 1e-6 * it->second.at(rank)) << "step " << first + c;
      EXPECT_EQ(heat["max_rank"][rank * cols + c], rank);
      if (rank != 2) {
        EXPECT_GT(heat["max"][2 * cols + c].get<double>(), v.get<double>() + 0.5) << "step " << first + c;
      }
    }
  }
  EXPECT_GE(whole_steps.size(), 5u) << heat.dump();
  // All four ranks in one row: each whole column's maximum is rank 2's.
  const json one_row = get(run + "/heatmap?buckets=100000&rank_buckets=1");
  ASSERT_EQ(one_row["rows"], 1);
  EXPECT_EQ(one_row["ranks_per_row"], 4);
  for (int64_t step : whole_steps) {
    const size_t c = static_cast<size_t>(step - one_row["first_step"].get<int64_t>());
    ASSERT_LT(c, one_row["max_rank"].size());
    EXPECT_EQ(one_row["max_rank"][c], 2) << "step " << step;
  }
  // Bad parameters: 400s naming the parameter and what it takes.
  for (const auto& [query, words] : std::vector<std::pair<std::string, std::vector<std::string>>>{
           {"metric=speed", {"metric", "busy", "forward", "checkpoint_stall"}},
           {"buckets=0", {"buckets", "[1, 100000]"}},
           {"buckets=ten", {"buckets", "[1, 100000]"}},
           {"rank_buckets=5000", {"rank_buckets", "[1, 4096]"}},
           {"step_begin=-1", {"step_begin", "[0, "}},
           {"step_begin=50&step_end=50", {"step_end", "step_begin"}}}) {
    Result<HttpReply> r = api_->get(run + "/heatmap?" + query);
    ASSERT_TRUE(r.ok()) << r.error();
    EXPECT_EQ(r->status, 400) << query;
    for (const std::string& w : words) EXPECT_THAT(r->error_message(), HasSubstr(w)) << query;
  }
  Result<HttpReply> missing = api_->get("/v1/runs/999/heatmap");
  ASSERT_TRUE(missing.ok());
  EXPECT_EQ(missing->status, 404);

  ASSERT_TRUE(api_->post_json(run + "/stop", json::object()).ok());
  ASSERT_TRUE(eventually([&] { return run_state(id)["state"] == "stopped"; }, 30s)) << run_state(id).dump();
}

// The checkpoint policy: a run submitted with checkpoint_every_steps 3 and keep_last 2 is checkpointed by
// the coordinator itself (the checkpoint action, its request an event whose source is "policy") at or after
// every third step, and once a newer checkpoint commits the older ones are deleted from the run's folder
// (the catalog marks them deleted, each deletion an event), leaving the newest two. Bad values are 400s
// naming the field.
TEST_F(ClusterCli, CheckpointPolicyCheckpointsEveryNStepsAndKeepsTheLastK) {
  for (const auto& [field, value] : std::vector<std::pair<std::string, json>>{{"checkpoint_every_steps", 0},
                                                                              {"checkpoint_every_steps", "3"},
                                                                              {"keep_last", 0},
                                                                              {"keep_last", 1.5}}) {
    Result<HttpReply> r =
        api_->post("/v1/runs", {{"config", tiny_config(5)}, {"layout", {{"dp", 2}}}, {field, value}});
    ASSERT_TRUE(r.ok()) << r.error();
    EXPECT_EQ(r->status, 400) << field << " = " << value.dump();
    EXPECT_THAT(r->error_message(), HasSubstr(field));
  }
  EXPECT_EQ(get("/v1/runs")["runs"].size(), 0u);

  Result<json> sub = api_->post_json("/v1/runs", {{"config", tiny_config(100000)},
                                                  {"layout", {{"dp", 2}}},
                                                  {"checkpoint_every_steps", 3},
                                                  {"keep_last", 2}});
  ASSERT_TRUE(sub.ok()) << sub.error();
  const int64_t id = sub->at("id").get<int64_t>();
  const std::string run = "/v1/runs/" + std::to_string(id);
  EXPECT_EQ(sub->at("checkpoint_policy")["checkpoint_every_steps"], 3);
  EXPECT_EQ(sub->at("checkpoint_policy")["keep_last"], 2);
  workers_ = children_of(pids_);

  json catalog;
  ASSERT_TRUE(eventually(
      [&] {
        catalog = get(run + "/checkpoints")["checkpoints"];
        return catalog.size() >= 4;
      },
      90s))
      << catalog.dump();
  // Stopped (with the stop's own checkpoint, pruned like the others), so nothing changes while we look.
  ASSERT_TRUE(api_->post_json(run + "/stop", json::object()).ok());
  ASSERT_TRUE(eventually([&] { return run_state(id)["state"] == "stopped"; }, 30s)) << run_state(id).dump();
  const int64_t stopped_at = last_step(id);
  catalog = get(run + "/checkpoints")["checkpoints"];

  // Committed: the newest two, on disk; deleted: every older one, gone from disk.
  std::vector<int64_t> committed, deleted;
  for (const json& c : catalog) {
    const std::string path = c["path"].get<std::string>();
    EXPECT_EQ(path.rfind((dir_ / "runs" / std::to_string(id) / "checkpoints").string(), 0), 0u) << path;
    if (c["state"] == "committed") {
      committed.push_back(c["step"].get<int64_t>());
      EXPECT_TRUE(fs::exists(path + "/manifest.json")) << path;
    } else {
      EXPECT_EQ(c["state"], "deleted") << c.dump();
      deleted.push_back(c["step"].get<int64_t>());
      EXPECT_FALSE(fs::exists(path)) << path;
    }
  }
  ASSERT_EQ(committed.size(), 2u) << catalog.dump();
  ASSERT_GE(deleted.size(), 2u) << catalog.dump();
  for (int64_t d : deleted) EXPECT_LT(d, committed.front()) << "a newer checkpoint was deleted";
  int on_disk = 0;
  for (const fs::directory_entry& e :
       fs::directory_iterator(dir_ / "runs" / std::to_string(id) / "checkpoints"))
    on_disk += e.path().filename().string().rfind("step_", 0) == 0 && fs::exists(e.path() / "manifest.json");
  EXPECT_EQ(on_disk, 2);

  // The checkpoints but the stop's came from the policy: each request is an event with source "policy", at
  // most one per multiple of 3 the run reached.
  std::vector<json> asked = events(id, "action_requested");
  int from_policy = 0;
  for (const json& e : asked) {
    json p = json::parse(e["payload"].get<std::string>());
    if (p["source"] == "policy") {
      ++from_policy;
      EXPECT_EQ(p["action"], "checkpoint");
      EXPECT_THAT(p["from"].get<std::string>(), HasSubstr("every 3 steps"));
    }
  }
  EXPECT_GE(from_policy, static_cast<int>(catalog.size()) - 1);
  EXPECT_LE(from_policy, stopped_at / 3);
  for (const json& c : catalog) EXPECT_GE(c["step"].get<int64_t>(), 3);
  std::vector<json> gone = events(id, "checkpoint_deleted");
  // Every checkpoint that went has its event: pruned by keep_last ("policy"), or by the workers' own
  // train.keep_checkpoints when their asynchronous writer pruned first ("workers").
  EXPECT_EQ(gone.size(), deleted.size());
  for (const json& e : gone) {
    const std::string source = json::parse(e["payload"].get<std::string>())["source"];
    EXPECT_TRUE(source == "policy" || source == "workers") << e.dump();
  }
}

// Quarantine with a spare registered (`up --spares 1`): the run leaves node-1 for spare-0 at the same dp 4,
// resumes from the stop's checkpoint on node-0 and spare-0, and the events say so (dp 4 -> 4, one spare
// used); the spare was held back until then.
class ClusterCliSpare : public ClusterCli {
 protected:
  std::string up_args() const override { return "--nodes 2 --slots 2 --spares 1"; }
  size_t daemons() const override { return 4; }
};

TEST_F(ClusterCliSpare, QuarantineMovesTheRunOntoTheSpareAtTheSameDp) {
  Result<json> sub =
      api_->post_json("/v1/runs", {{"config", tiny_config(100000)}, {"layout", {{"dp", 4}, {"zero", 1}}}});
  ASSERT_TRUE(sub.ok()) << sub.error();
  const int64_t id = sub->at("id").get<int64_t>();
  std::set<std::string> first_nodes;
  for (const json& share : sub->at("placement")) first_nodes.insert(share["node"].get<std::string>());
  EXPECT_EQ(first_nodes, (std::set<std::string>{"node-0", "node-1"}));  // the spare held back
  ASSERT_TRUE(eventually([&] { return last_step(id) >= 3; }, 30s)) << run_state(id).dump();
  workers_ = children_of(pids_);

  Result<HttpReply> q = api_->post("/v1/nodes/node-1/quarantine", json::object());
  ASSERT_TRUE(q.ok()) << q.error();
  ASSERT_EQ(q->status, 202) << q->body;
  ASSERT_TRUE(eventually(
      [&] {
        const json r = run_state(id);
        return r["generation"] == 2 && r["state"] == "running";
      },
      40s))
      << run_state(id).dump();
  const int64_t placed_at = last_step(id);
  ASSERT_TRUE(eventually([&] { return last_step(id) > placed_at + 1; }, 30s)) << run_state(id).dump();
  for (pid_t w : children_of(pids_)) workers_.push_back(w);

  const json moved = run_state(id);
  EXPECT_EQ(moved["layout"]["dp"], 4);
  std::map<std::string, int> ranks_on;
  for (const json& share : moved["placement"])
    ranks_on[share["node"].get<std::string>()] = share["ranks"].get<int>();
  EXPECT_EQ(ranks_on, (std::map<std::string, int>{{"node-0", 2}, {"spare-0", 2}})) << moved.dump();

  const std::vector<json> all = events(id, "quarantine_");
  std::map<std::string, std::vector<json>> by_kind;
  for (const json& e : all) by_kind[e["kind"].get<std::string>()].push_back(e);
  for (const char* stage : {"quarantine_requested", "quarantine_checkpointed", "quarantine_stopped",
                            "quarantine_placed", "quarantine_resumed"}) {
    ASSERT_EQ(by_kind[stage].size(), 1u) << stage;
  }
  const json& placed = by_kind["quarantine_placed"][0];
  EXPECT_THAT(placed["message"].get<std::string>(), HasSubstr("dp 4 -> 4"));
  EXPECT_THAT(placed["message"].get<std::string>(), HasSubstr("spare-0"));
  const json pp = json::parse(placed["payload"].get<std::string>());
  EXPECT_EQ(pp["spares_used"], 1);
  EXPECT_EQ(pp["dp"], 4);
  EXPECT_EQ(pp["previous_dp"], 4);
  const int64_t ckpt_step = by_kind["quarantine_checkpointed"][0]["step"].get<int64_t>();
  EXPECT_EQ(by_kind["quarantine_resumed"][0]["step"], ckpt_step + 1);
  std::set<int> resumed_ranks;
  const json rank_steps =
      get("/v1/runs/" + std::to_string(id) + "/steps?after=" + std::to_string(ckpt_step) + "&ranks=all");
  for (const json& r : rank_steps["rank_steps"]) resumed_ranks.insert(r["rank"].get<int>());
  EXPECT_EQ(resumed_ranks, (std::set<int>{0, 1, 2, 3})) << "every rank of dp 4 trains after the move";

  const json cluster = get("/v1/cluster");
  for (const json& n : cluster["nodes"]) {
    if (n["id"] == "node-1") {
      EXPECT_EQ(n["state"], "quarantined");
      EXPECT_EQ(n["busy_slots"], 0);
    }
    if (n["id"] == "spare-0") {
      EXPECT_EQ(n["busy_slots"], 2);
    }
  }
  json steps = get("/v1/runs/" + std::to_string(id) + "/steps?after=0&limit=1000")["steps"];
  std::set<int64_t> seen;
  for (const json& st : steps) seen.insert(st["step"].get<int64_t>());
  for (int64_t k = 1; k <= ckpt_step + 2; ++k) EXPECT_TRUE(seen.count(k)) << "step " << k << " missing";

  ASSERT_TRUE(api_->post_json("/v1/runs/" + std::to_string(id) + "/stop", json::object()).ok());
  ASSERT_TRUE(eventually([&] { return run_state(id)["state"] == "stopped"; }, 30s)) << run_state(id).dump();
}

// Agents hold no operator token: `up` gives them a token of their own (0600, not the operator's), which
// registers a node and nothing else, and each registration is answered with a credential good for that
// node's heartbeats only. The agents `up` started run on those (their command lines name agent_token), and
// neither credential reads or steers anything.
TEST_F(ClusterCli, AgentsHoldOnlyTheirOwnCredentials) {
  Result<std::string> agent_token = token_file_read((dir_ / "agent_token").string());
  ASSERT_TRUE(agent_token.ok()) << agent_token.error();
  EXPECT_NE(agent_token.value(), token_);
  EXPECT_EQ(fs::status(dir_ / "agent_token").permissions() & fs::perms::all,
            fs::perms::owner_read | fs::perms::owner_write);
  for (pid_t p : pids_) {
    std::string cmdline = slurp("/proc/" + std::to_string(p) + "/cmdline");
    std::replace(cmdline.begin(), cmdline.end(), '\0', ' ');
    if (cmdline.find(" agent ") == std::string::npos) continue;
    EXPECT_THAT(cmdline, HasSubstr((dir_ / "agent_token").string())) << cmdline;
    EXPECT_THAT(cmdline, ::testing::Not(HasSubstr((dir_ / "token").string() + " "))) << cmdline;
  }

  // The agents' token: registers, and nothing else.
  HttpClient agent({.url = url_, .token = agent_token.value()});
  EXPECT_EQ(agent.get("/v1/cluster")->status, 401);
  EXPECT_EQ(agent.get("/v1/runs")->status, 401);
  EXPECT_EQ(agent.post("/v1/runs", {{"config", tiny_config(5)}, {"layout", {{"dp", 1}}}})->status, 401);
  EXPECT_EQ(agent.post("/v1/nodes/node-0/quarantine", json::object())->status, 401);
  EXPECT_EQ(agent.post_bytes("/v1/agents/node-0/heartbeat", empty_beat(), kAgentBeatMediaType)->status,
            401);  // node-0's own credential only
  Result<json> reg = agent.post_json("/v1/agents", {{"node", "probe"}, {"slots", 1}, {"pid", 1}});
  ASSERT_TRUE(reg.ok()) << reg.error();
  const std::string credential = reg->value("credential", "");
  ASSERT_EQ(credential.size(), 64u) << reg->dump();

  // The node's credential: its own heartbeats, and nothing else.
  HttpClient node({.url = url_, .token = credential});
  Result<HttpReply> beat = node.post_bytes("/v1/agents/probe/heartbeat", empty_beat(), kAgentBeatMediaType);
  ASSERT_TRUE(beat.ok()) << beat.error();
  EXPECT_EQ(beat->status, 200) << beat->body;
  EXPECT_EQ(node.post_bytes("/v1/agents/node-0/heartbeat", empty_beat(), kAgentBeatMediaType)->status, 401);
  EXPECT_EQ(node.post("/v1/agents", {{"node", "probe2"}, {"slots", 1}})->status, 401);
  EXPECT_EQ(node.get("/v1/cluster")->status, 401);
  EXPECT_EQ(node.post("/v1/runs", {{"config", tiny_config(5)}, {"layout", {{"dp", 1}}}})->status, 401);
  // Registering again voids the old credential.
  Result<json> again = agent.post_json("/v1/agents", {{"node", "probe"}, {"slots", 1}, {"pid", 1}});
  ASSERT_TRUE(again.ok()) << again.error();
  EXPECT_NE(again->value("credential", ""), credential);
  EXPECT_EQ(node.post_bytes("/v1/agents/probe/heartbeat", empty_beat(), kAgentBeatMediaType)->status, 401);

  // The real agents beat on their credentials: both nodes stay healthy and a run trains on them.
  Result<json> sub = api_->post_json("/v1/runs", {{"config", tiny_config(100000)}, {"layout", {{"dp", 4}}}});
  ASSERT_TRUE(sub.ok()) << sub.error();
  const int64_t id = sub->at("id").get<int64_t>();
  ASSERT_TRUE(eventually([&] { return last_step(id) >= 2; }, 30s)) << run_state(id).dump();
  workers_ = children_of(pids_);
  const json cluster = get("/v1/cluster");
  for (const json& n : cluster["nodes"]) {
    if (n["id"] != "probe") {
      EXPECT_EQ(n["state"], "healthy") << n.dump();
    }
  }
  ASSERT_TRUE(api_->post_json("/v1/runs/" + std::to_string(id) + "/stop", json::object()).ok());
  ASSERT_TRUE(eventually([&] { return run_state(id)["state"] == "stopped"; }, 30s)) << run_state(id).dump();
}

// The agent beats at the coordinator's interval, which grows with the cluster (coordinator.h), but a gang
// that ends is told at once. One node, a budget of one beat a second: the run starts within a second;
// 99 more nodes registered meanwhile stretch the interval to 100 s. The run (rank 0's forward slowed to
// outlast the registrations) still finishes in seconds, so its end did not wait for the interval, and the
// agent then beats at the new interval, not at its old one.
class ClusterCliLongBeats : public ClusterCli {
 protected:
  std::string up_args() const override { return "--nodes 1 --slots 2 --max-beats-per-s 1"; }
  size_t daemons() const override { return 2; }
  std::string worker_fault() const override { return "0:slow_forward:1500"; }
};

TEST_F(ClusterCliLongBeats, AGangsEndIsToldAtOnceWhateverTheInterval) {
  EXPECT_EQ(get("/v1/cluster")["heartbeat_ms"], 1000);
  Result<json> sub = api_->post_json("/v1/runs", {{"config", tiny_config(4)}, {"layout", {{"dp", 2}}}});
  ASSERT_TRUE(sub.ok()) << sub.error();
  const int64_t id = sub->at("id").get<int64_t>();
  ASSERT_TRUE(eventually([&] { return last_step(id) >= 0 || run_state(id)["state"] != "running"; }, 30s))
      << run_state(id).dump();
  workers_ = children_of(pids_);
  for (int k = 0; k < 99; ++k) {
    Result<json> r = api_->post_json("/v1/agents", {{"node", "idle-" + std::to_string(k)}, {"slots", 1}});
    ASSERT_TRUE(r.ok()) << r.error();
  }
  EXPECT_EQ(get("/v1/cluster")["heartbeat_ms"], 100000);
  ASSERT_TRUE(eventually([&] { return run_state(id)["state"] == "finished"; }, 60s)) << run_state(id).dump();
  EXPECT_EQ(last_step(id), 4);

  // The agent took the new interval: over two seconds it sends at most one beat (at 200 ms it sent ten).
  std::string url = slurp((dir_ / "agents" / "node-0" / "metrics_url").string());
  while (!url.empty() && url.back() == '\n') url.pop_back();
  Result<std::string> agent_token = token_file_read((dir_ / "agent_token").string());
  ASSERT_TRUE(agent_token.ok()) << agent_token.error();
  HttpClient agent(
      {.url = url.substr(0, url.size() - std::string("/metrics").size()), .token = agent_token.value()});
  auto beats = [&]() -> int64_t {
    Result<HttpReply> m = agent.get("/metrics");
    std::smatch n;
    if (!m.ok() || !std::regex_search(m->body, n, std::regex("gantry_agent_heartbeats_total (\\d+)")))
      return -1;
    return std::stoll(n[1].str());
  };
  const int64_t before = beats();
  ASSERT_GE(before, 1);
  std::this_thread::sleep_for(2s);
  EXPECT_LE(beats() - before, 1);
}

}  // namespace
}  // namespace gantry
