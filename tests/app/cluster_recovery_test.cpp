// The cluster heals itself (issue "Fault tolerance"), against a real `up` cluster on loopback: a gang
// that fails (a worker killed with -9, a node lost with its agent) is placed again by the coordinator from
// the run's newest committed checkpoint, as the next generation of the same run, without a person; a run
// recovered three times ends with the losses of a run never interrupted, bit for bit; a lost node's ranks
// move to a spare at the same dp, or the run shrinks onto what is left; the restart budget ends a run that
// keeps failing without progress, saying so.
#include <signal.h>

#include <algorithm>
#include <random>
#include <regex>

#include "engine/core/data_cursor_log.h"
#include "tests/app/cluster_fixture.h"

namespace gantry {
namespace {

using namespace cluster_testing;  // NOLINT: the fixture and its helpers are this suite's vocabulary

// Rank 0's forward is slowed by 100 ms (the arithmetic is the same), so a tiny run lasts long enough for
// kills to land mid-run.
class ClusterRecovery : public ClusterCli {
 protected:
  std::string worker_fault() const override { return "0:slow_forward:100"; }

  int64_t submit(int64_t max_steps, const json& extra) {
    json body = {{"config", tiny_config(max_steps)}, {"layout", {{"dp", 4}}}, {"checkpoint_every_steps", 5}};
    body.update(extra);
    Result<json> sub = api_->post_json("/v1/runs", body);
    EXPECT_TRUE(sub.ok()) << sub.error();
    return sub.ok() ? sub->at("id").get<int64_t>() : -1;
  }

  // submit() a run that does not end by itself, wait (60 s) for its step `step` and note its workers (the
  // TearDown checks that none is left behind); *id is the run's.
  void submit_and_reach(int64_t step, int64_t* id, const json& extra) {
    *id = submit(100000, extra);
    ASSERT_GE(*id, 0);
    ASSERT_TRUE(eventually([&] { return last_step(*id) >= step; }, 60s)) << run_state(*id).dump();
    workers_ = children_of(pids_);
  }

  // node-1 lost: its agent killed with -9 (the workers it started are noted first).
  void agent1_kill() {
    workers_ = children_of(pids_);
    const pid_t agent1 = static_cast<pid_t>(std::stol(slurp((dir_ / "agent-node-1.pid").string())));
    ASSERT_EQ(::kill(agent1, SIGKILL), 0);
  }

  // The operator's stop, after noting the workers of the run's latest placement; waits until it is stopped.
  void stop_and_wait(int64_t id, std::chrono::seconds limit) {
    workers_ = children_of(pids_);
    ASSERT_TRUE(api_->post_json("/v1/runs/" + std::to_string(id) + "/stop", json::object()).ok());
    ASSERT_TRUE(eventually([&] { return run_state(id)["state"] == "stopped"; }, limit))
        << run_state(id).dump();
  }
};

TEST_F(ClusterRecovery, KilledWorkersAreRecoveredAndTheRunEndsAsIfNeverInterrupted) {
  small_model_ = true;  // the recovered run is compared with the reference of the same config only
  constexpr int64_t kSteps = 40;
  const int64_t ref = submit(kSteps, {{"max_restarts", 0}});
  ASSERT_GE(ref, 0);
  ASSERT_TRUE(eventually([&] { return run_state(ref)["state"] != "running"; }, 120s))
      << run_state(ref).dump();
  ASSERT_EQ(run_state(ref)["state"], "finished") << run_state(ref).dump();

  const int64_t id = submit(kSteps, json::object());
  ASSERT_GE(id, 0);
  EXPECT_EQ(run_state(id)["max_restarts"], 3);  // on by default
  std::mt19937 rng(20261126);
  for (int kill = 0; kill < 3; ++kill) {
    // Past a checkpoint of this generation (every 5 steps), then one rank at random, -9.
    const int64_t past = 7 + 10 * kill;
    ASSERT_TRUE(eventually([&] { return last_step(id) >= past; }, 120s)) << run_state(id).dump();
    workers_ = children_of(pids_);
    const int rank = static_cast<int>(rng() % 4);
    const pid_t victim = pid_of_rank(workers_, rank);
    ASSERT_GT(victim, 0) << "kill " << kill << ": no worker with RANK=" << rank;
    ASSERT_EQ(::kill(victim, SIGKILL), 0);
    ASSERT_TRUE(eventually([&] { return run_state(id)["restarts"] == kill + 1; }, 60s))
        << "kill " << kill << " (rank " << rank << "): " << run_state(id).dump();
  }
  ASSERT_TRUE(eventually([&] { return run_state(id)["state"] != "running"; }, 180s)) << run_state(id).dump();
  workers_ = children_of(pids_);
  const json state = run_state(id);
  ASSERT_EQ(state["state"], "finished") << state.dump();
  EXPECT_EQ(state["last_step"], kSteps);
  EXPECT_EQ(state["generation"], 4);
  EXPECT_EQ(state["layout"]["dp"], 4);

  // Every step's loss, bit for bit, as the run that was never interrupted: the restored parameters,
  // optimizer state and data cursor are exact, and no sample was skipped or seen twice.
  const std::map<int64_t, double> want = losses(ref), got = losses(id);
  ASSERT_EQ(want.size(), static_cast<size_t>(kSteps));
  ASSERT_EQ(got.size(), want.size());
  for (const auto& [step, loss] : want) EXPECT_EQ(got.at(step), loss) << "step " << step;

  // The final state, bit for bit: the last checkpoint's parameters and AdamW moments (each slice's xxh64)
  // and its data cursor are the uninterrupted run's.
  const auto final_state = [&](int64_t run) {
    const std::string dir = (dir_ / "runs" / std::to_string(run) / "checkpoints" / "step_00000040").string();
    const json m = json::parse(slurp(dir + "/manifest.json"));
    json slices = json::array();
    for (const json& shard : m["shards"]) {
      for (const json& sl : shard["slices"]) {
        slices.push_back({sl["buffer"], sl["tensor"], sl["start"], sl["count"], sl["xxh64"]});
      }
    }
    return json{{"slices", slices}, {"data_cursor", m["data_cursor"]}, {"rng_state", m["rng_state"]}};
  };
  const json want_final = final_state(ref), got_final = final_state(id);
  ASSERT_FALSE(want_final["slices"].empty());
  EXPECT_EQ(got_final, want_final);

  // The data-cursor log (engine/core/data_cursor_log.h): every rank of every generation said where it went
  // on from, and the steps each generation replayed from its checkpoint replace those lost with the gang.
  // The committed history: each step read its own batch, the four ranks' samples tile it, and the whole
  // run read every sample of batches 0..39 exactly once, the same samples and windows, step by step and
  // rank by rank, as the run never interrupted.
  const auto history = [&](int64_t run) {
    Result<DataCursorHistory> h = data_cursor_read((dir_ / "runs" / std::to_string(run)).string());
    EXPECT_TRUE(h.ok()) << h.error();
    return h.ok() ? h.value() : DataCursorHistory{};
  };
  const DataCursorHistory want_cursor = history(ref), got_cursor = history(id);
  EXPECT_EQ(want_cursor.starts, 4);
  EXPECT_EQ(got_cursor.starts, 4 * 4);  // four ranks in each of four generations
  EXPECT_GE(got_cursor.lines, want_cursor.lines);
  ASSERT_EQ(want_cursor.steps.size(), static_cast<size_t>(kSteps));
  const int global_batch = 16;  // tiny.toml's train.global_batch
  for (const DataCursorHistory* h : {&want_cursor, &got_cursor}) {
    const Status st = data_cursor_check(*h, kSteps, global_batch, {});
    EXPECT_TRUE(st.ok()) << (h == &want_cursor ? "reference: " : "recovered: ") << st.message();
  }
  std::vector<uint64_t> samples;
  for (const auto& [step, entries] : got_cursor.steps) {
    EXPECT_EQ(entries.size(), 4u) << "step " << step;
    for (const DataCursorEntry& e : entries)
      for (uint64_t k = 0; k < e.count; ++k) samples.push_back(e.first + k);
  }
  std::sort(samples.begin(), samples.end());
  ASSERT_EQ(samples.size(), static_cast<size_t>(kSteps * global_batch));
  for (size_t k = 0; k < samples.size(); ++k)
    ASSERT_EQ(samples[k], k) << "sample " << k << " skipped or repeated";
  EXPECT_EQ(got_cursor.steps, want_cursor.steps);

  // Each recovery is an event naming the failure and the checkpoint it went on from.
  const std::vector<json> placed = events(id, "recovery_placed");
  ASSERT_EQ(placed.size(), 3u) << json(placed).dump(1);
  for (const json& e : placed) {
    EXPECT_THAT(e["message"].get<std::string>(), HasSubstr("SIGKILL")) << e.dump();
    EXPECT_THAT(e["message"].get<std::string>(), HasSubstr("from the checkpoint at step")) << e.dump();
  }
  EXPECT_EQ(events(id, "recovery_resumed").size(), 3u);
}

// A lost node (its agent killed): the run cannot stay at dp 4 on the one node left (2 slots), so it
// shrinks to dp 2, which divides the global batch, and trains on.
TEST_F(ClusterRecovery, ALostNodesRunShrinksOntoTheNodesLeft) {
  small_model_ = true;  // steps only: the loss lands at step 7 of a run without end
  int64_t id = -1;
  ASSERT_NO_FATAL_FAILURE(submit_and_reach(7, &id, json::object()));
  ASSERT_NO_FATAL_FAILURE(agent1_kill());
  ASSERT_TRUE(eventually([&] { return run_state(id)["restarts"] == 1; }, 30s)) << run_state(id).dump();
  const json state = run_state(id);
  EXPECT_EQ(state["layout"]["dp"], 2) << state.dump();
  EXPECT_EQ(state["state"], "running");
  for (const json& share : state["placement"]) EXPECT_EQ(share["node"], "node-0") << state.dump();
  const int64_t from = state["last_step"].get<int64_t>();
  EXPECT_GE(from, 5);  // the checkpoint it went on from
  ASSERT_TRUE(eventually([&] { return last_step(id) > from + 3; }, 60s)) << run_state(id).dump();
  const std::vector<json> placed = events(id, "recovery_placed");
  ASSERT_EQ(placed.size(), 1u);
  EXPECT_THAT(placed[0]["message"].get<std::string>(), HasSubstr("node lost"));
  EXPECT_EQ(json::parse(placed[0]["payload"].get<std::string>())["previous_dp"], 4) << placed[0].dump();
  ASSERT_NO_FATAL_FAILURE(stop_and_wait(id, 30s));
}

// A node killed with its workers breaks its peers' collectives at once: the peers' gang fails, and the
// silent node is lost after kMissedBeatsSuspect beats instead of the node timeout (here 120 s, so only
// that path can recover the run before the wait below gives up). Before, the run waited the whole timeout.
class ClusterLostNodeSuspect : public ClusterRecovery {
 protected:
  std::string up_args() const override { return "--nodes 2 --slots 2 --node-timeout 120"; }
};

TEST_F(ClusterLostNodeSuspect, ASilentNodeWhosePeersFailedIsLostWithoutWaitingTheNodeTimeout) {
  small_model_ = true;  // steps only: the loss lands at step 7 of a run without end
  int64_t id = -1;
  ASSERT_NO_FATAL_FAILURE(submit_and_reach(7, &id, json::object()));
  ASSERT_NO_FATAL_FAILURE(agent1_kill());
  ASSERT_TRUE(eventually([&] { return run_state(id)["restarts"] == 1; }, 60s)) << run_state(id).dump();
  const std::vector<json> lost = events(id, "node_lost");
  ASSERT_EQ(lost.size(), 1u);
  EXPECT_THAT(lost[0]["message"].get<std::string>(), HasSubstr("after its gang's peer on node-0 failed"))
      << lost[0].dump();
  EXPECT_EQ(run_state(id)["layout"]["dp"], 2);
  ASSERT_NO_FATAL_FAILURE(stop_and_wait(id, 30s));
}

// min_dp bounds the shrink: the same lost node with min_dp 4 cannot go on at dp 2, so the run stops saying
// why, and its goodput ledger shows the failure as not recovered. Bounds that do not hold dp, or that the
// global batch does not split over, are refused naming the field.
TEST_F(ClusterRecovery, MinDpStopsTheShrinkAndBadBoundsAreRefused) {
  for (const auto& [extra, want] : std::vector<std::pair<json, std::string>>{
           {{{"min_dp", 5}}, "field \"min_dp\": 5 is above layout.dp 4"},
           {{{"max_dp", 2}}, "field \"max_dp\": 2 is below layout.dp 4"},
           {{{"min_dp", 3}}, "field \"min_dp\": train.global_batch = 16 cannot be split over 3"},
           {{{"max_dp", 0}}, "max_dp"}}) {
    json body = {{"config", tiny_config(10)}, {"layout", {{"dp", 4}}}};
    body.update(extra);
    Result<HttpReply> r = api_->post("/v1/runs", body);
    ASSERT_TRUE(r.ok()) << r.error();
    EXPECT_EQ(r->status, 400) << extra.dump();
    EXPECT_THAT(r->error_message(), HasSubstr(want)) << extra.dump();
  }
  const int64_t id = submit(100000, {{"min_dp", 4}, {"max_dp", 4}});
  ASSERT_GE(id, 0);
  EXPECT_EQ(run_state(id)["min_dp"], 4);
  EXPECT_EQ(run_state(id)["max_dp"], 4);
  ASSERT_TRUE(eventually([&] { return last_step(id) >= 3; }, 60s)) << run_state(id).dump();
  ASSERT_NO_FATAL_FAILURE(agent1_kill());
  ASSERT_TRUE(eventually([&] { return run_state(id)["state"] == "failed"; }, 60s)) << run_state(id).dump();
  const json state = run_state(id);
  EXPECT_EQ(state["restarts"], 0);
  EXPECT_THAT(state["message"].get<std::string>(), HasSubstr("not recovered: cannot place it again"));
  EXPECT_THAT(state["message"].get<std::string>(), HasSubstr("min_dp 4"));
  const json g = get("/v1/runs/" + std::to_string(id) + "/goodput");
  ASSERT_EQ(g["failures"].size(), 1u) << g.dump();
  // The first notice: node-0's gang failing on its broken collective, or node-1 lost, whichever came first.
  EXPECT_THAT(g["failures"][0]["kind"].get<std::string>(), ::testing::AnyOf("node_failed", "node_lost"));
  EXPECT_FALSE(g["failures"][0]["recovered"].get<bool>());
  EXPECT_GT(g["seconds"]["detection"].get<double>(), 0) << g.dump();
}

// With recovery off (max_restarts 0) a failure ends the run, and the message says why it was not
// recovered; a bad max_restarts is refused naming the field and its range.
TEST_F(ClusterRecovery, RecoveryOffFailsTheRunSayingSo) {
  Result<HttpReply> bad =
      api_->post("/v1/runs", {{"config", tiny_config(10)}, {"layout", {{"dp", 4}}}, {"max_restarts", -1}});
  ASSERT_TRUE(bad.ok()) << bad.error();
  EXPECT_EQ(bad->status, 400);
  EXPECT_THAT(bad->error_message(), HasSubstr("max_restarts"));
  int64_t id = -1;
  ASSERT_NO_FATAL_FAILURE(submit_and_reach(2, &id, {{"max_restarts", 0}}));
  const pid_t victim = pid_of_rank(workers_, 1);
  ASSERT_GT(victim, 0);
  ASSERT_EQ(::kill(victim, SIGKILL), 0);
  ASSERT_TRUE(eventually([&] { return run_state(id)["state"] == "failed"; }, 60s)) << run_state(id).dump();
  const json state = run_state(id);
  EXPECT_THAT(state["message"].get<std::string>(), HasSubstr("rank 1"));
  EXPECT_THAT(state["message"].get<std::string>(), HasSubstr("not recovered: recovery is off"));
  EXPECT_EQ(state["restarts"], 0);
}

// Fault injection is refused unless the coordinator was started with it allowed, and bad requests are
// refused naming what is wrong.
TEST_F(ClusterRecovery, InjectionIsRefusedUnlessAllowed) {
  int64_t id = -1;
  ASSERT_NO_FATAL_FAILURE(submit_and_reach(1, &id, json::object()));
  Result<HttpReply> r = api_->post("/v1/runs/" + std::to_string(id) + "/inject", {{"fault", "kill"}});
  ASSERT_TRUE(r.ok()) << r.error();
  EXPECT_EQ(r->status, 403);
  EXPECT_THAT(r->error_message(), HasSubstr("--allow-fault-injection"));
  testing_support::Outcome ctl =
      run_engine("ctl --url " + url_ + " --token-file " + (dir_ / "token").string() + " inject " +
                 std::to_string(id) + " kill --rank 1");
  EXPECT_EQ(ctl.code, 2) << ctl.out << ctl.err;
  EXPECT_THAT(ctl.err, HasSubstr("fault injection is off"));
  EXPECT_EQ(run_state(id)["restarts"], 0);
  EXPECT_EQ(run_state(id)["state"], "running");
}

class ClusterDrills : public ClusterRecovery {
 protected:
  std::string up_args() const override { return "--nodes 2 --slots 2 --allow-fault-injection"; }
};

// `ctl inject RUN kill`: the agent of the rank's node kills it with SIGKILL; the event names the rank and
// node; the run recovers by itself.
TEST_F(ClusterDrills, AnInjectedKillIsRecovered) {
  small_model_ = true;  // steps only: the kill lands at step 7 of a run without end
  int64_t id = -1;
  ASSERT_NO_FATAL_FAILURE(submit_and_reach(7, &id, json::object()));
  const std::string run = "/v1/runs/" + std::to_string(id);
  for (const auto& [body, want] :
       std::vector<std::pair<json, std::string>>{{{{"fault", "melt"}}, "give \"kill\""},
                                                 {{{"fault", "kill"}, {"rank", 4}}, "has ranks 0..3"},
                                                 {{{"rank", 1}}, "fault"}}) {
    Result<HttpReply> bad = api_->post(run + "/inject", body);
    ASSERT_TRUE(bad.ok()) << bad.error();
    EXPECT_EQ(bad->status, 400) << body.dump();
    EXPECT_THAT(bad->error_message(), HasSubstr(want)) << body.dump();
  }
  testing_support::Outcome ctl =
      run_engine("ctl --url " + url_ + " --token-file " + (dir_ / "token").string() + " inject " +
                 std::to_string(id) + " kill --rank 2");
  ASSERT_EQ(ctl.code, 0) << ctl.err;
  EXPECT_THAT(ctl.out, HasSubstr("kill injected into rank 2 on node-1"));
  ASSERT_TRUE(eventually([&] { return run_state(id)["restarts"] == 1; }, 60s)) << run_state(id).dump();
  const std::vector<json> injected = events(id, "fault_injected");
  ASSERT_EQ(injected.size(), 1u);
  EXPECT_EQ(injected[0]["node"], "node-1");
  const std::vector<json> placed = events(id, "recovery_placed");
  ASSERT_EQ(placed.size(), 1u);
  EXPECT_THAT(placed[0]["message"].get<std::string>(), HasSubstr("rank 2"));
  EXPECT_THAT(placed[0]["message"].get<std::string>(), HasSubstr("SIGKILL"));
  const int64_t from = run_state(id)["last_step"].get<int64_t>();
  ASSERT_TRUE(eventually([&] { return last_step(id) > from + 2; }, 60s)) << run_state(id).dump();
  ASSERT_NO_FATAL_FAILURE(stop_and_wait(id, 30s));
}

// The `hang` event of a run: exactly one, its payload parsed.
json hang_payload(const std::vector<json>& hangs) {
  EXPECT_EQ(hangs.size(), 1u);
  return hangs.empty() ? json::object() : json::parse(hangs[0]["payload"].get<std::string>());
}

// What every hang report must say of its culprit: rank, node, stopped process, its phase and its last
// collective, and its flight recorder (numbered in order, ending at that collective).
void expect_hang_names(const json& p, int rank, const std::string& node) {
  EXPECT_EQ(p.value("rank", -1), rank) << p.dump();
  EXPECT_EQ(p.value("node", ""), node) << p.dump();
  EXPECT_EQ(p.value("detected_by", ""), "hang_timeout") << p.dump();
  EXPECT_EQ(p.value("process_state", ""), "T") << p.dump();
  EXPECT_FALSE(p.value("phase", "").empty()) << p.dump();
  ASSERT_TRUE(p.contains("flight_recorder") && p["flight_recorder"].is_array()) << p.dump();
  const json& fr = p["flight_recorder"];
  ASSERT_FALSE(fr.empty()) << p.dump();
  EXPECT_LE(fr.size(), 32u);
  for (size_t k = 1; k < fr.size(); ++k) EXPECT_EQ(fr[k]["seq"], fr[k - 1]["seq"].get<uint64_t>() + 1);
  EXPECT_EQ(fr.back()["seq"], p["collective"]) << p.dump();
  EXPECT_FALSE(fr.back()["op"].get<std::string>().empty());
  ASSERT_TRUE(p.contains("last_collective")) << p.dump();
  // The peers on its node were healthy: their heartbeats came up to the end, so none is the one named.
  for (const json& peer : p.value("node_peers", json::array())) EXPECT_NE(peer["rank"], rank);
}

// `inject RUN hang` (SIGSTOP) uses the same path as a real stop: the rank's own node sees its heartbeats
// stop and names it within the run's hang timeout (4 s here), long before any collective times out
// (train.collective_timeout_s keeps its 120 s); the run recovers.
TEST_F(ClusterDrills, AnInjectedHangIsFoundNamedAndRecovered) {
  small_model_ = true;  // steps only: the hang lands at step 7 of a run without end
  Result<json> sub = api_->post_json("/v1/runs", {{"config", tiny_config(100000)},
                                                  {"layout", {{"dp", 4}}},
                                                  {"checkpoint_every_steps", 5},
                                                  {"hang_timeout_s", 4}});
  ASSERT_TRUE(sub.ok()) << sub.error();
  const int64_t id = sub->at("id").get<int64_t>();
  EXPECT_EQ(run_state(id)["hang_timeout_s"], 4);
  ASSERT_TRUE(eventually([&] { return last_step(id) >= 7; }, 60s)) << run_state(id).dump();
  workers_ = children_of(pids_);
  Result<HttpReply> r =
      api_->post("/v1/runs/" + std::to_string(id) + "/inject", {{"fault", "hang"}, {"rank", 3}});
  ASSERT_TRUE(r.ok()) << r.error();
  ASSERT_EQ(r->status, 202) << r->body;
  // Well under the 120 s collective timeout, the only way the old code found a hang.
  ASSERT_TRUE(eventually([&] { return run_state(id)["restarts"] == 1; }, 60s)) << run_state(id).dump();
  const json hang = hang_payload(events(id, "hang"));
  expect_hang_names(hang, 3, "node-1");
  const std::vector<json> placed = events(id, "recovery_placed");
  ASSERT_EQ(placed.size(), 1u);
  EXPECT_THAT(placed[0]["message"].get<std::string>(), HasSubstr("node-1: rank 3"));
  EXPECT_THAT(placed[0]["message"].get<std::string>(), HasSubstr("hung: no heartbeat"));
  const int64_t from = run_state(id)["last_step"].get<int64_t>();
  ASSERT_TRUE(eventually([&] { return last_step(id) > from + 2; }, 60s)) << run_state(id).dump();
  ASSERT_NO_FATAL_FAILURE(stop_and_wait(id, 30s));
}

// A worker SIGSTOPped from outside (no injection): with the default hang timeout (10 s) its node names
// it in a `hang` event with its flight recorder, not its peers waiting in the collective; the run is
// placed again from its checkpoint and finishes by itself.
TEST_F(ClusterRecovery, AStoppedWorkerIsNamedAndTheRunFinishes) {
  small_model_ = true;  // steps, not what the model learns: the stop lands at step 7 of 30
  const int64_t id = submit(30, json::object());
  ASSERT_GE(id, 0);
  EXPECT_EQ(run_state(id)["hang_timeout_s"], 10);
  ASSERT_TRUE(eventually([&] { return last_step(id) >= 7; }, 60s)) << run_state(id).dump();
  workers_ = children_of(pids_);
  const pid_t victim = pid_of_rank(workers_, 1);
  ASSERT_GT(victim, 0);
  ASSERT_EQ(::kill(victim, SIGSTOP), 0);
  ASSERT_TRUE(eventually([&] { return run_state(id)["restarts"] == 1; }, 90s)) << run_state(id).dump();
  expect_hang_names(hang_payload(events(id, "hang")), 1, "node-0");
  ASSERT_TRUE(eventually([&] { return run_state(id)["state"] != "running"; }, 120s)) << run_state(id).dump();
  EXPECT_EQ(run_state(id)["state"], "finished") << run_state(id).dump();
  EXPECT_EQ(run_state(id)["last_step"], 30);
  EXPECT_EQ(events(id, "hang").size(), 1u);
}

// hang_timeout_s is validated at submit, naming the field; nothing is recorded for a refused run.
TEST_F(ClusterRecovery, HangTimeoutIsValidated) {
  for (const json& bad : {json(0), json(3601), json("10"), json(2.5)}) {
    Result<HttpReply> r = api_->post(
        "/v1/runs", {{"config", tiny_config(10)}, {"layout", {{"dp", 2}}}, {"hang_timeout_s", bad}});
    ASSERT_TRUE(r.ok()) << r.error();
    EXPECT_EQ(r->status, 400) << bad.dump();
    EXPECT_THAT(r->error_message(), HasSubstr("hang_timeout_s")) << bad.dump();
  }
  EXPECT_TRUE(get("/v1/runs")["runs"].empty()) << get("/v1/runs").dump();
}

// `inject RUN slow|nan` reach the rank's train loop through its agent and launcher as a frame: no worker
// fault at start here, so the slowness and the skipped step are the injection's alone.
class ClusterLiveDrills : public ClusterDrills {
 protected:
  std::string worker_fault() const override { return ""; }
};

// slow: rank 2's forward is slowed by 500 ms from its next step on; the straggler policy flags it with the
// forward as the slow phase, the injection is an event, and a slow rank is not called hung.
TEST_F(ClusterLiveDrills, AnInjectedSlowRankIsFlaggedNotHung) {
  const int64_t id = submit(100000, {{"straggler",
                                      {{"window_steps", 5},
                                       {"min_samples", 5},
                                       {"windows_to_flag", 2},
                                       {"relative_threshold", 0.4},
                                       {"individual_threshold", 0}}}});
  ASSERT_GE(id, 0);
  const std::string run = "/v1/runs/" + std::to_string(id);
  ASSERT_TRUE(eventually([&] { return last_step(id) >= 3; }, 60s)) << run_state(id).dump();
  workers_ = children_of(pids_);
  for (const auto& [body, want] : std::vector<std::pair<json, std::string>>{
           {{{"fault", "slow"}, {"rank", 2}}, "needs the forward's delay"},
           {{{"fault", "slow"}, {"rank", 2}, {"ms", 0}}, "ms"},
           {{{"fault", "nan"}, {"rank", 2}, {"ms", 5}}, "only \"slow\" takes a delay"}}) {
    Result<HttpReply> bad = api_->post(run + "/inject", body);
    ASSERT_TRUE(bad.ok()) << bad.error();
    EXPECT_EQ(bad->status, 400) << body.dump();
    EXPECT_THAT(bad->error_message(), HasSubstr(want)) << body.dump();
  }
  testing_support::Outcome ctl =
      run_engine("ctl --url " + url_ + " --token-file " + (dir_ / "token").string() + " inject " +
                 std::to_string(id) + " slow --rank 2 --ms 500");
  ASSERT_EQ(ctl.code, 0) << ctl.err;
  EXPECT_THAT(ctl.out, HasSubstr("slow injected into rank 2 on node-1"));
  json ranks;
  ASSERT_TRUE(eventually(
      [&] {
        ranks = get(run + "/ranks");
        return ranks["straggler"]["flagged"] == json::array({2});
      },
      90s))
      << ranks.dump();
  for (const json& k : ranks["ranks"]) {
    if (k["rank"] != 2) continue;
    EXPECT_EQ(k["straggler"]["slow_phase"], "forward") << k.dump();
    EXPECT_GT(k["straggler"]["slow_phase_excess_s"].get<double>(), 0.25) << k.dump();
  }
  const std::vector<json> injected = events(id, "fault_injected");
  ASSERT_EQ(injected.size(), 1u);
  const json p = json::parse(injected[0]["payload"].get<std::string>());
  EXPECT_EQ(p["fault"], "slow");
  EXPECT_EQ(p["ms"], 500);
  EXPECT_EQ(p["rank"], 2);
  EXPECT_TRUE(events(id, "hang").empty());
  EXPECT_EQ(run_state(id)["restarts"], 0);
  ASSERT_NO_FATAL_FAILURE(stop_and_wait(id, 60s));
}

// The straggler policy switched at run time: submitted with its quarantine off (the default), a rank slowed
// by 500 ms is flagged and nothing more, evaluation after evaluation; bad changes are refused naming the
// field; `ctl straggler RUN --on` turns it on (a straggler_policy event says who changed what), and the
// slow rank's node is quarantined (a straggler_quarantine event) and the run goes on without it, at dp 2 on
// node-0.
TEST_F(ClusterLiveDrills, TheStragglerPolicyTurnedOnAtRunTimeQuarantinesTheSlowRanksNode) {
  const int64_t id = submit(100000, {{"straggler",
                                      {{"window_steps", 5},
                                       {"min_samples", 5},
                                       {"windows_to_flag", 2},
                                       {"relative_threshold", 0.4},
                                       {"individual_threshold", 0}}}});
  ASSERT_GE(id, 0);
  const std::string run = "/v1/runs/" + std::to_string(id);
  EXPECT_EQ(run_state(id)["straggler"]["quarantine"], false) << run_state(id).dump();
  ASSERT_TRUE(eventually([&] { return last_step(id) >= 3; }, 60s)) << run_state(id).dump();
  workers_ = children_of(pids_);
  ASSERT_TRUE(api_->post_json(run + "/inject", {{"fault", "slow"}, {"rank", 2}, {"ms", 500}}).ok());
  json ranks;
  ASSERT_TRUE(eventually(
      [&] {
        ranks = get(run + "/ranks");
        return ranks["straggler"]["flagged"] == json::array({2});
      },
      90s))
      << ranks.dump();
  // Policy off: two more evaluations with rank 2 flagged, and nobody is moved.
  const int64_t flagged_at = ranks["straggler"]["evaluated_at_step"].get<int64_t>();
  ASSERT_TRUE(eventually(
      [&] { return get(run + "/ranks")["straggler"]["evaluated_at_step"] >= flagged_at + 10; }, 90s));
  EXPECT_TRUE(events(id, "straggler_quarantine").empty());
  EXPECT_EQ(run_state(id)["state"], "running");
  EXPECT_EQ(run_state(id)["layout"]["dp"], 4);
  const json before =
      get("/v1/cluster");  // held: a range over get(...)["nodes"] would dangle and check nothing
  EXPECT_EQ(before["nodes"].size(), 2u) << before.dump();
  for (const json& n : before["nodes"]) EXPECT_EQ(n["state"], "healthy") << n.dump();

  for (const auto& [body, want] : std::vector<std::pair<json, std::string>>{
           {{{"windows_to_flag", 0}}, "straggler.windows_to_flag"},
           {{{"quarntine", true}}, "straggler.quarntine"},
           {{{"quarantine", "yes"}}, "straggler.quarantine"},
           {{{"quarantine", true}, {"enabled", false}}, "needs \"straggler.enabled\": true"}}) {
    Result<HttpReply> bad = api_->post(run + "/straggler", body);
    ASSERT_TRUE(bad.ok()) << bad.error();
    EXPECT_EQ(bad->status, 400) << body.dump();
    EXPECT_THAT(bad->error_message(), HasSubstr(want)) << body.dump();
  }
  Result<HttpReply> missing = api_->post("/v1/runs/999/straggler", {{"quarantine", true}});
  ASSERT_TRUE(missing.ok());
  EXPECT_EQ(missing->status, 404);
  EXPECT_TRUE(events(id, "straggler_policy").empty()) << "a refused change was recorded";

  testing_support::Outcome ctl =
      run_engine("ctl --url " + url_ + " --token-file " + (dir_ / "token").string() + " straggler " +
                 std::to_string(id) + " --on");
  ASSERT_EQ(ctl.code, 0) << ctl.err;
  EXPECT_THAT(ctl.out, HasSubstr("quarantine off -> on"));
  const std::vector<json> changed = events(id, "straggler_policy");
  ASSERT_EQ(changed.size(), 1u);
  const json cp = json::parse(changed[0]["payload"].get<std::string>());
  EXPECT_EQ(cp["before"]["quarantine"], false);
  EXPECT_EQ(cp["after"]["quarantine"], true);
  EXPECT_THAT(cp["from"].get<std::string>(), HasSubstr("127.0.0.1"));

  ASSERT_TRUE(eventually([&] { return !events(id, "quarantine_placed").empty(); }, 90s))
      << run_state(id).dump();
  const std::vector<json> q = events(id, "straggler_quarantine");
  ASSERT_EQ(q.size(), 1u);
  EXPECT_EQ(q[0]["node"], "node-1");
  EXPECT_THAT(q[0]["message"].get<std::string>(), HasSubstr("rank 2"));
  const json after = get("/v1/cluster");
  EXPECT_EQ(after["nodes"].size(), 2u) << after.dump();
  for (const json& n : after["nodes"])
    EXPECT_EQ(n["state"], n["id"] == "node-1" ? "quarantined" : "healthy") << n.dump();
  const json state = run_state(id);
  EXPECT_EQ(state["layout"]["dp"], 2) << state.dump();
  for (const json& share : state["placement"]) EXPECT_EQ(share["node"], "node-0") << state.dump();
  const int64_t from = state["last_step"].get<int64_t>();
  ASSERT_TRUE(eventually([&] { return last_step(id) > from + 3; }, 60s)) << run_state(id).dump();
  EXPECT_EQ(run_state(id)["state"], "running");
  // Off again through ctl: recorded too.
  ctl = run_engine("ctl --url " + url_ + " --token-file " + (dir_ / "token").string() + " straggler " +
                   std::to_string(id) + " --off");
  ASSERT_EQ(ctl.code, 0) << ctl.err;
  EXPECT_EQ(events(id, "straggler_policy").size(), 2u);
  EXPECT_EQ(run_state(id)["straggler"]["quarantine"], false);
  ASSERT_NO_FATAL_FAILURE(stop_and_wait(id, 60s));
}

// nan: rank 1's gradients of its next step are NaN; the gang's norm is NaN, the step guard skips that
// step (a step_skipped event) and the run trains on without a restart.
TEST_F(ClusterLiveDrills, AnInjectedNanStepIsSkipped) {
  const int64_t id = submit(100000, json::object());
  ASSERT_GE(id, 0);
  const std::string run = "/v1/runs/" + std::to_string(id);
  ASSERT_TRUE(eventually([&] { return last_step(id) >= 3; }, 60s)) << run_state(id).dump();
  workers_ = children_of(pids_);
  EXPECT_TRUE(events(id, "step_skipped").empty());
  testing_support::Outcome ctl =
      run_engine("ctl --url " + url_ + " --token-file " + (dir_ / "token").string() + " inject " +
                 std::to_string(id) + " nan --rank 1");
  ASSERT_EQ(ctl.code, 0) << ctl.err;
  EXPECT_THAT(ctl.out, HasSubstr("nan injected into rank 1 on node-0"));
  ASSERT_TRUE(eventually([&] { return !events(id, "step_skipped").empty(); }, 60s));
  const std::vector<json> skipped = events(id, "step_skipped");
  EXPECT_THAT(skipped[0]["message"].get<std::string>(), HasSubstr("skipped"));
  const int64_t at = skipped[0].value("step", int64_t{-1});
  ASSERT_TRUE(eventually([&] { return last_step(id) > at + 2; }, 60s)) << run_state(id).dump();
  EXPECT_EQ(run_state(id)["restarts"], 0);
  EXPECT_EQ(run_state(id)["state"], "running");
  EXPECT_EQ(events(id, "fault_injected").size(), 1u);
  ASSERT_NO_FATAL_FAILURE(stop_and_wait(id, 60s));
}

// A slow rank is not a hung one: rank 2's forward takes 4 s a step, twice the run's hang timeout, and its
// peers wait that long in their collective every step; all keep beating, so no rank is called hung and
// the run finishes without a restart.
class ClusterSlowNotHung : public ClusterRecovery {
 protected:
  std::string worker_fault() const override { return "2:slow_forward:4000"; }
};

TEST_F(ClusterSlowNotHung, ASlowRankIsNotCalledHung) {
  const int64_t id = submit(3, {{"hang_timeout_s", 2}});
  ASSERT_GE(id, 0);
  ASSERT_TRUE(eventually([&] { return run_state(id)["state"] != "running"; }, 120s)) << run_state(id).dump();
  EXPECT_EQ(run_state(id)["state"], "finished") << run_state(id).dump();
  EXPECT_EQ(run_state(id)["restarts"], 0);
  EXPECT_TRUE(events(id, "hang").empty());
}

}  // namespace
}  // namespace gantry
