// The coordinator is not a single point of failure for training (issue "Fault tolerance"), against a real
// `up` cluster on loopback: the coordinator killed with -9 mid-run, its gang trains on (its rendezvous
// store is a process of its own, so checkpoints still commit), the agents keep their records and retry;
// a coordinator started again on the same folder (the same port) re-adopts the gang when the agents
// register again, takes the records they kept, and the run ends as if nothing happened: every step from 1
// to max_steps recorded once, the checkpoints made while it was down in the catalog. A run whose agent
// died while the coordinator was down is interrupted when the grace is over, naming the missing ranks; a
// paused run comes back paused.
#include <fcntl.h>
#include <signal.h>

#include <regex>

#include "tests/app/cluster_fixture.h"

namespace gantry {
namespace {

using namespace cluster_testing;  // NOLINT: the fixture and its helpers are this suite's vocabulary

double unix_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// Rank 0's forward is slowed by 100 ms (the arithmetic is the same), so a tiny run lasts long enough for
// the coordinator to die and come back mid-run.
class ClusterAdopt : public ClusterCli {
 protected:
  std::string worker_fault() const override { return "0:slow_forward:100"; }

  int64_t submit(int64_t max_steps, int checkpoint_every) {
    std::string config = tiny_config(max_steps);
    config = std::regex_replace(config, std::regex("checkpoint_every = \\d+"),
                                "checkpoint_every = " + std::to_string(checkpoint_every));
    config = std::regex_replace(config, std::regex("keep_checkpoints = \\d+"), "keep_checkpoints = 100");
    Result<json> sub = api_->post_json("/v1/runs", {{"config", config}, {"layout", {{"dp", 4}}}});
    EXPECT_TRUE(sub.ok()) << sub.error();
    return sub.ok() ? sub->at("id").get<int64_t>() : -1;
  }

  pid_t coordinator_pid() {
    return static_cast<pid_t>(std::stol(slurp((dir_ / "coordinator.pid").string())));
  }

  void kill_coordinator() {
    const pid_t c = coordinator_pid();
    api_.reset();
    ASSERT_EQ(::kill(c, SIGKILL), 0);
    ASSERT_TRUE(eventually([&] { return gone(c); }, 5s));
  }

  // A coordinator on the same folder and port, as `up` started the first (its pid file replaced, so that
  // `down` stops it).
  void start_coordinator(const std::string& extra = "") {
    const std::string port = url_.substr(url_.rfind(':') + 1);
    std::vector<std::string> args = {GANTRY_ENGINE_BIN,
                                     "coordinator",
                                     "--dir",
                                     dir_.string(),
                                     "--token-file",
                                     (dir_ / "token").string(),
                                     "--agent-token-file",
                                     (dir_ / "agent_token").string(),
                                     "--port",
                                     port};
    std::istringstream more(extra);
    for (std::string w; more >> w;) args.push_back(w);
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    const std::string log = (dir_ / "coordinator.log").string();
    const pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      ::setsid();
      const int out = ::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
      ::dup2(out, 1);
      ::dup2(out, 2);
      ::execv(argv[0], argv.data());
      ::_exit(127);
    }
    std::ofstream(dir_ / "coordinator.pid") << pid << "\n";
    pids_ = cluster_pids(dir_);
    api_ = std::make_unique<HttpClient>(HttpClientOptions{.url = url_, .token = token_});
    ASSERT_TRUE(eventually([&] { return api_->get_json("/v1/cluster").ok(); }, 20s)) << slurp(log);
  }

  // The committed checkpoints on disk, by step.
  std::set<int64_t> on_disk(int64_t id) {
    std::set<int64_t> out;
    const fs::path root = dir_ / "runs" / std::to_string(id) / "checkpoints";
    std::error_code ec;
    for (const fs::directory_entry& e : fs::directory_iterator(root, ec)) {
      const std::string name = e.path().filename().string();
      if (name.rfind("step_", 0) == 0 && fs::exists(e.path() / "manifest.json"))
        out.insert(std::stoll(name.substr(5)));
    }
    return out;
  }
};

TEST_F(ClusterAdopt, KilledCoordinatorRestartedOnTheSameFolderReadoptsTheRunWithNoGap) {
  constexpr int64_t kSteps = 60;
  const int64_t id = submit(kSteps, 5);
  ASSERT_GE(id, 0);
  const std::string run = "/v1/runs/" + std::to_string(id);
  ASSERT_TRUE(eventually([&] { return last_step(id) >= 3; }, 120s)) << run_state(id).dump();
  workers_ = children_of(pids_);

  ASSERT_NO_FATAL_FAILURE(kill_coordinator());
  const double down_at = unix_now();
  const std::set<int64_t> before = on_disk(id);
  // Training goes on without it: checkpoints commit (the workers meet in the run's store, which is not the
  // coordinator's process), at least one past those made before it died.
  ASSERT_TRUE(eventually(
      [&] {
        const std::set<int64_t> now = on_disk(id);
        return !now.empty() && (before.empty() || *now.rbegin() > *before.rbegin());
      },
      120s))
      << "no checkpoint committed while the coordinator was down";
  const double up_at = unix_now();
  ASSERT_NO_FATAL_FAILURE(start_coordinator());

  ASSERT_TRUE(eventually([&] { return run_state(id)["state"] != "running"; }, 180s)) << run_state(id).dump();
  workers_ = children_of(pids_);
  const json state = run_state(id);
  EXPECT_EQ(state["state"], "finished") << state.dump();
  EXPECT_EQ(state["generation"], 1) << "re-adopted, not placed again: " << state.dump();
  EXPECT_FALSE(events(id, "run_adopted").empty());
  EXPECT_TRUE(events(id, "run_interrupted").empty());
  EXPECT_TRUE(events(id, "records_dropped").empty());
  EXPECT_FALSE(events(id, "submitted").empty());
  // The agents' kept records were sent again (a replay) where a coordinator had taken them: none twice.
  std::set<std::string> seen;
  for (const json& e : events(id, "")) {
    json key = e;
    key.erase("id");
    EXPECT_TRUE(seen.insert(key.dump()).second) << "event twice: " << e.dump();
  }

  // Every step once, 1..max_steps; some stamped while no coordinator ran (kept by the agents, sent after).
  const json steps = get(run + "/steps?after=-1&limit=100000")["steps"];
  std::vector<int64_t> got;
  int while_down = 0;
  for (const json& s : steps) {
    got.push_back(s["step"].get<int64_t>());
    const double t = s.value("time_unix_s", 0.0);
    while_down += t > down_at && t < up_at;
  }
  std::vector<int64_t> want;
  for (int64_t k = 1; k <= kSteps; ++k) want.push_back(k);
  EXPECT_EQ(got, want);
  EXPECT_GT(while_down, 0) << "no step was stamped while the coordinator was down";

  // The catalog has every checkpoint on disk, the ones committed while it was down too.
  std::set<int64_t> catalogued;
  const json catalog = get(run + "/checkpoints")["checkpoints"];
  for (const json& c : catalog)
    if (c["state"] == "committed") catalogued.insert(c["step"].get<int64_t>());
  const std::set<int64_t> disk = on_disk(id);
  EXPECT_EQ(catalogued, disk) << catalog.dump();
  EXPECT_GT(disk.size(), before.size());
}

// A run paused when the coordinator died comes back paused (not running: resume would be refused), and
// resume goes on from there.
TEST_F(ClusterAdopt, PausedRunIsReadoptedPausedAndResumes) {
  const int64_t id = submit(100000, 0);
  ASSERT_GE(id, 0);
  const std::string run = "/v1/runs/" + std::to_string(id);
  ASSERT_TRUE(eventually([&] { return last_step(id) >= 3; }, 120s)) << run_state(id).dump();
  workers_ = children_of(pids_);
  ASSERT_TRUE(api_->post_json(run + "/pause", json::object()).ok());
  ASSERT_TRUE(eventually([&] { return !events(id, "action_pause").empty(); }, 60s));
  ASSERT_NO_FATAL_FAILURE(kill_coordinator());
  ASSERT_NO_FATAL_FAILURE(start_coordinator());
  ASSERT_TRUE(eventually([&] { return !events(id, "run_adopted").empty(); }, 60s)) << run_state(id).dump();
  EXPECT_EQ(run_state(id)["state"], "paused") << run_state(id).dump();
  const int64_t at = last_step(id);
  Result<HttpReply> resumed = api_->post(run + "/resume", json::object());
  ASSERT_TRUE(resumed.ok()) << resumed.error();
  EXPECT_EQ(resumed->status, 202) << resumed->body;
  ASSERT_TRUE(eventually([&] { return last_step(id) > at + 2; }, 60s)) << run_state(id).dump();
  EXPECT_EQ(run_state(id)["state"], "running");
  ASSERT_TRUE(api_->post_json(run + "/stop", json::object()).ok());
  ASSERT_TRUE(eventually([&] { return run_state(id)["state"] == "stopped"; }, 60s)) << run_state(id).dump();
}

TEST_F(ClusterAdopt, RunWhoseAgentDiedWhileTheCoordinatorWasDownIsInterruptedSayingWhichRanks) {
  const int64_t id = submit(100000, 0);
  ASSERT_GE(id, 0);
  ASSERT_TRUE(eventually([&] { return last_step(id) >= 3; }, 120s)) << run_state(id).dump();
  workers_ = children_of(pids_);
  ASSERT_NO_FATAL_FAILURE(kill_coordinator());
  // node-1's agent (ranks 2 and 3) dies too; its workers die with it.
  const pid_t agent1 = static_cast<pid_t>(std::stol(slurp((dir_ / "agent-node-1.pid").string())));
  ASSERT_EQ(::kill(agent1, SIGKILL), 0);
  ASSERT_TRUE(eventually([&] { return gone(agent1); }, 5s));
  ASSERT_NO_FATAL_FAILURE(start_coordinator("--adopt-grace 5"));
  // Its gang's slots are not known while it waits: a submission now is refused, not placed onto them.
  Result<HttpReply> early = api_->post("/v1/runs", {{"config", tiny_config(10)}, {"layout", {{"dp", 2}}}});
  ASSERT_TRUE(early.ok()) << early.error();
  if (run_state(id)["state"] == "running") {  // still within the grace
    EXPECT_EQ(early->status, 409) << early->body;
    EXPECT_THAT(early->body, HasSubstr("being re-adopted"));
  }
  ASSERT_TRUE(eventually([&] { return run_state(id)["state"] != "running"; }, 60s)) << run_state(id).dump();
  const json state = run_state(id);
  EXPECT_EQ(state["state"], "interrupted") << state.dump();
  EXPECT_THAT(state["message"].get<std::string>(), HasSubstr("ranks 2,3 missing")) << state.dump();
  const std::vector<json> interrupted = events(id, "run_interrupted");
  ASSERT_EQ(interrupted.size(), 1u);
  EXPECT_THAT(interrupted[0]["message"].get<std::string>(), HasSubstr("did not come back"));
  // node-0's part of the gang is stopped, not left training alone.
  const pid_t agent0 = static_cast<pid_t>(std::stol(slurp((dir_ / "agent-node-0.pid").string())));
  ASSERT_TRUE(eventually([&] { return children_of({agent0}).empty(); }, 60s));
  // Left for `down` to stop: node-1's agent is gone.
  std::error_code ec;
  fs::remove(dir_ / "agent-node-1.pid", ec);
  pids_ = cluster_pids(dir_);
}

}  // namespace
}  // namespace gantry
