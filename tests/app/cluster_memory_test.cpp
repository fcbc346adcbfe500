// In-memory copies (issue 16, train.memory_copy_every) against a real `up` cluster on loopback: the ranks'
// copies land in their agents' memory and on the next node of the ring; a killed worker's gang is restored
// from them (the `restore` event says so and names the node that served each shard), bit for bit the state
// a disk checkpoint of that step holds, and the run ends as if never interrupted; a lost agent that held the
// only copy of a shard sends the recovery to the disk checkpoint, saying why.
#include <signal.h>

#include "tests/app/cluster_fixture.h"

namespace gantry {
namespace {

using namespace cluster_testing;  // NOLINT: the fixture and its helpers are this suite's vocabulary

// Rank 0's forward is slowed by 100 ms, so that kills land mid-run.
class ClusterMemory : public ClusterCli {
 protected:
  std::string up_args() const override { return "--nodes 2 --slots 1 --spares 1"; }
  size_t daemons() const override { return 4; }
  std::string worker_fault() const override { return "0:slow_forward:100"; }

  // A checkpoint_every past any step a test reaches before its kill (rank 0's 100 ms a step puts step 1000
  // 100 s away).
  static constexpr int kNoDiskCheckpointYet = 1000;
  // train.checkpoint_every (exact steps, unlike the coordinator's policy) and memory_copy_every 2.
  int64_t submit(int64_t max_steps, const json& extra, int checkpoint_every = 10, int keep = 3) {
    return submit_tiny(
        max_steps,
        {{"checkpoint_every", checkpoint_every}, {"keep_checkpoints", keep}, {"memory_copy_every", 2}},
        {{"dp", 2}}, extra);
  }
  // The newest complete in-memory set GET /v1/runs/{id} shows whose every rank is held on `nodes` nodes;
  // -1 when there is none.
  int64_t complete_copies(int64_t id, size_t nodes) {
    seen_ = run_state(id);
    for (const json& m : seen_["memory_copies"]) {
      if (!m["complete"].get<bool>()) continue;
      bool all = true;
      for (const json& r : m["ranks"]) all = all && r["nodes"].size() >= nodes;
      if (all) return m["step"].get<int64_t>();
    }
    return -1;
  }
  json seen_;  // the run's state complete_copies saw last, for a failure's message

  pid_t agent_pid(const std::string& node) {
    return static_cast<pid_t>(std::stol(slurp((dir_ / ("agent-" + node + ".pid")).string())));
  }
  void finish(int64_t id) {
    ASSERT_TRUE(eventually([&] { return run_state(id)["state"] != "running"; }, 180s))
        << run_state(id).dump();
    ASSERT_EQ(run_state(id)["state"], "finished") << run_state(id).dump();
  }
};

TEST_F(ClusterMemory, AKilledWorkerIsRestoredFromMemoryBitForBitAsFromDisk) {
  small_model_ = true;  // the restored run is compared with the reference of the same config only
  constexpr int64_t kSteps = 30;
  // The reference: never interrupted, with a disk checkpoint every 2 steps to compare the copies with.
  const int64_t ref = submit(kSteps, {{"max_restarts", 0}}, /*checkpoint_every=*/2, /*keep=*/100);
  ASSERT_GE(ref, 0);
  finish(ref);

  const int64_t id = submit(kSteps, json::object());
  ASSERT_GE(id, 0);
  // Past the disk checkpoint at step 10, with a newer copy of every rank on both nodes (its own and the
  // ring peer's).
  ASSERT_TRUE(eventually([&] { return last_step(id) >= 13 && complete_copies(id, 2) > 10; }, 120s))
      << seen_.dump();
  workers_ = children_of(pids_);
  const pid_t victim = pid_of_rank(workers_, 1);
  ASSERT_GT(victim, 0);
  ASSERT_EQ(::kill(victim, SIGKILL), 0);
  ASSERT_TRUE(eventually([&] { return run_state(id)["restarts"] == 1; }, 60s)) << run_state(id).dump();

  const std::vector<json> restores = events(id, "restore");
  ASSERT_EQ(restores.size(), 1u) << json(restores).dump(1);
  const json payload = json::parse(restores[0]["payload"].get<std::string>());
  EXPECT_EQ(payload["source"], "memory") << restores[0].dump();
  const int64_t step = payload["step"].get<int64_t>();
  EXPECT_GT(step, 10) << "newer than the disk checkpoint";
  EXPECT_EQ(step % 2, 0);
  ASSERT_EQ(payload["shards"].size(), 2u) << payload.dump();
  for (const json& s : payload["shards"]) EXPECT_THAT(s["node"].get<std::string>(), HasSubstr("node-"));
  EXPECT_THAT(restores[0]["message"].get<std::string>(), HasSubstr("in-memory copies at step"));

  // What the agents assembled for the new gang is the reference's disk checkpoint of that step, byte for
  // byte.
  char name[32];
  std::snprintf(name, sizeof name, "step_%08lld", static_cast<long long>(step));
  const fs::path disk = fs::path(run_state(ref).value("out_dir", "")) / "checkpoints" / name;
  std::vector<fs::path> assembled;
  for (const std::string node : {"node-0", "node-1", "spare-0"}) {
    const fs::path p = "/dev/shm/gantry-agent-" + node + "-" + std::to_string(agent_pid(node)) +
                       "/restore/run-" + std::to_string(id) + "/" + name;
    if (fs::exists(p)) assembled.push_back(p);
  }
  ASSERT_FALSE(assembled.empty()) << "no agent assembled step " << step;
  for (const fs::path& a : assembled) {
    for (const char* file : {"shard_r00000.bin", "shard_r00001.bin"}) {
      const std::string got = slurp((a / file).string()), want = slurp((disk / file).string());
      ASSERT_FALSE(want.empty()) << (disk / file);
      EXPECT_TRUE(got == want) << a / file << " differs from " << disk / file;
    }
  }

  finish(id);
  workers_ = children_of(pids_);
  const std::map<int64_t, double> want = losses(ref), got = losses(id);
  ASSERT_EQ(got.size(), want.size());
  for (const auto& [s, loss] : want) EXPECT_EQ(got.at(s), loss) << "step " << s;
  // The final state, bit for bit: the last checkpoints' shards.
  std::snprintf(name, sizeof name, "step_%08lld", static_cast<long long>(kSteps));
  const std::string out = run_state(id).value("out_dir", "");
  for (const char* file : {"shard_r00000.bin", "shard_r00001.bin"})
    EXPECT_TRUE(slurp(out + "/checkpoints/" + name + "/" + file) ==
                slurp((disk.parent_path() / name / file).string()))
        << file;
}

// A lost node (its agent killed): its rank's copy survives on the ring peer, which serves it to the spare.
TEST_F(ClusterMemory, ALostNodesShardIsServedByItsRingPeer) {
  small_model_ = true;  // steps only: the loss lands at step 13 of a run without end
  // No disk checkpoint before the kill: with one every 10 steps, a kill that landed just after step 20 found
  // the newest copies no newer than the disk's (both step 20) and rightly restored from disk (CI, session
  // 21).
  const int64_t id = submit(100000, json::object(), kNoDiskCheckpointYet);
  ASSERT_GE(id, 0);
  ASSERT_TRUE(eventually([&] { return last_step(id) >= 13 && complete_copies(id, 2) > 10; }, 120s))
      << seen_.dump();
  workers_ = children_of(pids_);
  ASSERT_EQ(::kill(agent_pid("node-1"), SIGKILL), 0);
  ASSERT_TRUE(eventually([&] { return run_state(id)["restarts"] == 1; }, 60s)) << run_state(id).dump();
  const std::vector<json> restores = events(id, "restore");
  ASSERT_EQ(restores.size(), 1u) << json(restores).dump(1);
  const json payload = json::parse(restores[0]["payload"].get<std::string>());
  EXPECT_EQ(payload["source"], "memory") << restores[0].dump();
  for (const json& s : payload["shards"]) EXPECT_EQ(s["node"], "node-0") << payload.dump();
  const int64_t from = payload["step"].get<int64_t>();
  ASSERT_TRUE(eventually([&] { return last_step(id) > from + 3; }, 60s)) << run_state(id).dump();
  EXPECT_TRUE(events(id, "restore_fallback").empty());
  workers_ = children_of(pids_);
  ASSERT_TRUE(api_->post_json("/v1/runs/" + std::to_string(id) + "/stop", json::object()).ok());
  ASSERT_TRUE(eventually([&] { return run_state(id)["state"] == "stopped"; }, 30s)) << run_state(id).dump();
}

// A damaged copy (a bit flipped in every copy of the newest step, on every node): the gang restored from it
// exits 5, and the coordinator falls back past it (source "memory": nothing on disk to move, the copies at
// and past that step are not restored again) to an older state, and the run trains on.
TEST_F(ClusterMemory, ADamagedCopyFallsBackToAnOlderState) {
  small_model_ = true;  // steps only: the pause lands at step 13 of a run without end
  // As above: a pause at a disk checkpoint's step would restore from disk, never reading the damaged copy.
  const int64_t id = submit(100000, json::object(), kNoDiskCheckpointYet);
  ASSERT_GE(id, 0);
  ASSERT_TRUE(eventually([&] { return last_step(id) >= 13 && complete_copies(id, 2) > 10; }, 120s))
      << seen_.dump();
  ASSERT_TRUE(api_->post_json("/v1/runs/" + std::to_string(id) + "/pause", json::object()).ok());
  ASSERT_TRUE(eventually([&] { return run_state(id)["state"] == "paused"; }, 30s)) << run_state(id).dump();
  workers_ = children_of(pids_);
  // The newest copy: of the last even step before the pause, on both nodes.
  int64_t step = -1;
  ASSERT_TRUE(eventually(
      [&] {
        step = complete_copies(id, 2);
        const int64_t at = last_step(id);
        return step == at - at % 2;
      },
      30s))
      << seen_.dump();
  char name[32];
  std::snprintf(name, sizeof name, "step_%08lld", static_cast<long long>(step));
  size_t flipped = 0;
  for (const std::string node : {"node-0", "node-1", "spare-0"}) {
    const fs::path run = "/dev/shm/gantry-agent-" + node + "-" + std::to_string(agent_pid(node)) + "/run-" +
                         std::to_string(id);
    if (!fs::exists(run)) continue;
    for (const fs::directory_entry& rank : fs::directory_iterator(run)) {
      if (!fs::exists(rank.path() / name)) continue;
      for (const fs::directory_entry& f : fs::directory_iterator(rank.path() / name)) {
        if (f.path().extension() != ".bin") continue;
        std::fstream io(f.path(), std::ios::in | std::ios::out | std::ios::binary);
        ASSERT_TRUE(io) << f.path();
        const auto middle = static_cast<std::streamoff>(fs::file_size(f.path()) / 2);
        char c = 0;
        io.seekg(middle);
        io.get(c);
        io.seekp(middle);
        io.put(static_cast<char>(c ^ 0x10));
        ++flipped;
      }
    }
  }
  ASSERT_GE(flipped, 4u) << "each of the two ranks' copies on its own node and its ring peer's";
  const pid_t victim = pid_of_rank(workers_, 1);
  ASSERT_GT(victim, 0);
  ASSERT_EQ(::kill(victim, SIGKILL), 0);

  std::vector<json> damaged;
  ASSERT_TRUE(eventually([&] { return !(damaged = events(id, "checkpoint_damaged")).empty(); }, 60s))
      << run_state(id).dump();
  ASSERT_EQ(damaged.size(), 1u) << json(damaged).dump(1);
  const json payload = json::parse(damaged[0]["payload"].get<std::string>());
  EXPECT_EQ(payload["source"], "memory") << payload.dump();
  EXPECT_EQ(payload["step"], step) << payload.dump();
  EXPECT_TRUE(payload["moved_to"].is_null()) << payload.dump();
  EXPECT_LT(payload["fallback_step"].get<int64_t>(), step) << payload.dump();
  // Restored first from the damaged copy, then from an older state; the run trains past the damaged step.
  ASSERT_TRUE(eventually([&] { return last_step(id) > step + 2; }, 60s)) << run_state(id).dump();
  const std::vector<json> restores = events(id, "restore");
  ASSERT_EQ(restores.size(), 2u) << json(restores).dump(1);
  EXPECT_EQ(json::parse(restores[0]["payload"].get<std::string>())["step"], step) << restores[0].dump();
  EXPECT_LT(json::parse(restores[1]["payload"].get<std::string>())["step"].get<int64_t>(), step)
      << restores[1].dump();
  workers_ = children_of(pids_);
  ASSERT_TRUE(api_->post_json("/v1/runs/" + std::to_string(id) + "/stop", json::object()).ok());
  ASSERT_TRUE(eventually([&] { return run_state(id)["state"] == "stopped"; }, 30s)) << run_state(id).dump();
}

// An agent's copies route serves copies only: a bad name is refused naming what is allowed, a copy it does
// not hold is 404, and it needs the agents' token like /metrics.
TEST_F(ClusterMemory, TheAgentsCopiesRouteServesCopiesOnly) {
  std::string base;
  const json cluster = get("/v1/cluster");
  for (const json& n : cluster["nodes"])
    if (n["id"] == "node-0") base = n["metrics_url"].get<std::string>();
  ASSERT_FALSE(base.empty()) << cluster.dump();
  base = base.substr(0, base.size() - std::string("/metrics").size());
  // The agents' own token (`up` writes it beside the operator's): it opens /metrics and the copies.
  Result<std::string> agent_token = token_file_read((dir_ / "agent_token").string());
  ASSERT_TRUE(agent_token.ok()) << agent_token.error();
  HttpClient agent({.url = base, .token = agent_token.value()});
  Result<HttpReply> bad = agent.get("/v1/memory/1/0/2/token");
  ASSERT_TRUE(bad.ok()) << bad.error();
  EXPECT_EQ(bad->status, 400);
  EXPECT_THAT(bad->body, HasSubstr("manifest.json or shard_rNNNNN.bin"));
  Result<HttpReply> missing = agent.get("/v1/memory/1/0/2/manifest.json");
  ASSERT_TRUE(missing.ok()) << missing.error();
  EXPECT_EQ(missing->status, 404);
  HttpClient stranger({.url = base, .token = token_});  // the operator's steers runs, reads no copy
  Result<HttpReply> refused = stranger.get("/v1/memory/1/0/2/manifest.json");
  ASSERT_TRUE(refused.ok()) << refused.error();
  EXPECT_EQ(refused->status, 401);
}

// Both ranks on one node: the ring has no other node, so each shard's only copy is in that node's agent.
class ClusterMemoryOneNode : public ClusterMemory {
 protected:
  std::string up_args() const override { return "--nodes 1 --slots 2 --spares 1"; }
  size_t daemons() const override { return 3; }
};

TEST_F(ClusterMemoryOneNode, TheOnlyCopysAgentLostSendsTheRestoreToDisk) {
  small_model_ = true;  // steps only: the loss lands at step 13 of a run without end
  const int64_t id = submit(100000, json::object());
  ASSERT_GE(id, 0);
  ASSERT_TRUE(eventually([&] { return last_step(id) >= 13 && complete_copies(id, 1) > 10; }, 120s))
      << seen_.dump();
  workers_ = children_of(pids_);
  ASSERT_EQ(::kill(agent_pid("node-0"), SIGKILL), 0);
  ASSERT_TRUE(eventually([&] { return run_state(id)["restarts"] == 1; }, 60s)) << run_state(id).dump();
  const std::vector<json> restores = events(id, "restore");
  ASSERT_EQ(restores.size(), 1u) << json(restores).dump(1);
  const json payload = json::parse(restores[0]["payload"].get<std::string>());
  EXPECT_EQ(payload["source"], "disk") << restores[0].dump();
  const int64_t from = payload["step"].get<int64_t>();
  EXPECT_TRUE(from >= 10 && from % 10 == 0) << "a disk checkpoint's step: " << restores[0].dump();
  EXPECT_THAT(payload["why"].get<std::string>(), HasSubstr("no complete in-memory copies")) << payload.dump();
  ASSERT_TRUE(eventually([&] { return last_step(id) > from + 3; }, 60s)) << run_state(id).dump();
  workers_ = children_of(pids_);
  ASSERT_TRUE(api_->post_json("/v1/runs/" + std::to_string(id) + "/stop", json::object()).ok());
  ASSERT_TRUE(eventually([&] { return run_state(id)["state"] == "stopped"; }, 30s)) << run_state(id).dump();
}

}  // namespace
}  // namespace gantry
