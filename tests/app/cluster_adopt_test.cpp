// The coordinator is not a single point of failure for training (issue "Fault tolerance"), against a real
// `up` cluster on loopback: the coordinator killed with -9 mid-run, its gang trains on (its rendezvous
// store is a process of its own, so checkpoints still commit), the agents keep their records and retry;
// a coordinator started again on the same folder (the same port) re-adopts the gang when the agents
// register again, takes the records they kept, and the run ends as if nothing happened: every step from 1
// to max_steps recorded once, the checkpoints made while it was down in the catalog. A run whose agent
// died while the coordinator was down is recovered when the grace is over (a spare, else a shrink), as if
// the node had been lost live; a paused run comes back paused.
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
  // These tests start the coordinator again themselves (with their own --adopt-grace): no supervisor.
  std::string up_args() const override { return "--nodes 2 --slots 2 --no-restart"; }

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

// No spare: node-1's agent (ranks 2 and 3) dies with the coordinator away. When the grace is over the
// restarted coordinator recovers the run as if it had seen the node go: an adopt_missing event names the
// ranks and the node not reported, and the run shrinks onto node-0 at dp 2 from its newest checkpoint.
TEST_F(ClusterAdopt, RunWhoseAgentDiedWhileTheCoordinatorWasDownIsRecoveredOntoTheNodesLeft) {
  const int64_t id = submit(100000, 5);
  ASSERT_GE(id, 0);
  ASSERT_TRUE(eventually([&] { return last_step(id) >= 7; }, 120s)) << run_state(id).dump();
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
  if (events(id, "adopt_missing").empty()) {  // still within the grace
    EXPECT_EQ(early->status, 409) << early->body;
    EXPECT_THAT(early->body, HasSubstr("being re-adopted"));
  }
  ASSERT_TRUE(eventually([&] { return run_state(id)["restarts"] == 1; }, 90s)) << run_state(id).dump();
  const json state = run_state(id);
  EXPECT_EQ(state["state"], "running") << state.dump();
  EXPECT_EQ(state["layout"]["dp"], 2) << state.dump();
  for (const json& share : state["placement"]) EXPECT_EQ(share["node"], "node-0") << state.dump();
  const std::vector<json> missing = events(id, "adopt_missing");
  ASSERT_EQ(missing.size(), 1u);
  EXPECT_THAT(missing[0]["message"].get<std::string>(), HasSubstr("ranks 2,3"));
  EXPECT_THAT(missing[0]["message"].get<std::string>(), HasSubstr("node-1"));
  EXPECT_TRUE(events(id, "run_interrupted").empty());
  const std::vector<json> placed = events(id, "recovery_placed");
  ASSERT_EQ(placed.size(), 1u);
  EXPECT_THAT(placed[0]["message"].get<std::string>(), HasSubstr("not reported"));
  const int64_t from = state["last_step"].get<int64_t>();
  ASSERT_TRUE(eventually([&] { return last_step(id) > from + 3; }, 60s)) << run_state(id).dump();
  workers_ = children_of(pids_);
  ASSERT_TRUE(api_->post_json("/v1/runs/" + std::to_string(id) + "/stop", json::object()).ok());
  ASSERT_TRUE(eventually([&] { return run_state(id)["state"] == "stopped"; }, 60s)) << run_state(id).dump();
  // Left for `down` to stop: node-1's agent is gone.
  std::error_code ec;
  fs::remove(dir_ / "agent-node-1.pid", ec);
  pids_ = cluster_pids(dir_);
}

// With a spare (`up --nodes 2 --slots 1 --spares 1`): a dp-2 run across node-0 and node-1; the coordinator
// and node-1's agent are killed with -9 (node-1's worker dies with its agent), the coordinator is started
// again, and when the grace is over the run moves to spare-0 at the same dp and finishes by itself, with
// every step's loss bit for bit that of the same run never interrupted; the events and the goodput ledger
// account for the failure found at adoption.
class ClusterAdoptSpare : public ClusterAdopt {
 protected:
  std::string up_args() const override { return "--nodes 2 --slots 1 --spares 1 --no-restart"; }
  size_t daemons() const override { return 4; }

  int64_t submit_dp2(int64_t max_steps) {
    Result<json> sub = api_->post_json(
        "/v1/runs",
        {{"config", tiny_config(max_steps)}, {"layout", {{"dp", 2}}}, {"checkpoint_every_steps", 5}});
    EXPECT_TRUE(sub.ok()) << sub.error();
    return sub.ok() ? sub->at("id").get<int64_t>() : -1;
  }
};

TEST_F(ClusterAdoptSpare, AgentLostWhileTheCoordinatorWasDownMovesTheRunToTheSpareAndItFinishes) {
  small_model_ = true;  // the moved run is compared with the reference of the same config only
  constexpr int64_t kSteps = 40;
  const int64_t ref = submit_dp2(kSteps);
  ASSERT_GE(ref, 0);
  ASSERT_TRUE(eventually([&] { return run_state(ref)["state"] != "running"; }, 120s))
      << run_state(ref).dump();
  ASSERT_EQ(run_state(ref)["state"], "finished") << run_state(ref).dump();

  const int64_t id = submit_dp2(kSteps);
  ASSERT_GE(id, 0);
  ASSERT_TRUE(eventually([&] { return last_step(id) >= 7; }, 120s)) << run_state(id).dump();
  workers_ = children_of(pids_);
  ASSERT_NO_FATAL_FAILURE(kill_coordinator());
  const pid_t agent1 = static_cast<pid_t>(std::stol(slurp((dir_ / "agent-node-1.pid").string())));
  const std::vector<pid_t> node1_workers = children_of({agent1});
  ASSERT_EQ(::kill(agent1, SIGKILL), 0);
  for (pid_t w : node1_workers) ::kill(w, SIGKILL);  // -9 leaves no handler: its worker goes with it
  ASSERT_TRUE(eventually([&] { return gone(agent1); }, 5s));
  for (pid_t w : node1_workers) ASSERT_TRUE(eventually([&] { return gone(w); }, 5s));
  ASSERT_NO_FATAL_FAILURE(start_coordinator("--adopt-grace 3"));

  ASSERT_TRUE(eventually([&] { return run_state(id)["state"] != "running"; }, 180s)) << run_state(id).dump();
  workers_ = children_of(pids_);
  const json state = run_state(id);
  ASSERT_EQ(state["state"], "finished") << state.dump();
  EXPECT_EQ(state["last_step"], kSteps);
  EXPECT_EQ(state["restarts"], 1) << state.dump();
  EXPECT_EQ(state["layout"]["dp"], 2) << state.dump();
  std::set<std::string> on;
  for (const json& share : state["placement"]) on.insert(share["node"].get<std::string>());
  EXPECT_EQ(on, (std::set<std::string>{"node-0", "spare-0"})) << state.dump();

  // Bit for bit the run never interrupted: the restore and the data cursor are exact.
  const std::map<int64_t, double> want = losses(ref), got = losses(id);
  ASSERT_EQ(want.size(), static_cast<size_t>(kSteps));
  ASSERT_EQ(got.size(), want.size());
  for (const auto& [step, loss] : want) EXPECT_EQ(got.at(step), loss) << "step " << step;

  const std::vector<json> missing = events(id, "adopt_missing");
  ASSERT_EQ(missing.size(), 1u);
  EXPECT_THAT(missing[0]["message"].get<std::string>(), HasSubstr("rank 1"));
  EXPECT_THAT(missing[0]["message"].get<std::string>(), HasSubstr("node-1"));
  const std::vector<json> placed = events(id, "recovery_placed");
  ASSERT_EQ(placed.size(), 1u);
  EXPECT_THAT(placed[0]["message"].get<std::string>(), HasSubstr("spare-0"));
  EXPECT_EQ(json::parse(placed[0]["payload"].get<std::string>())["spares_used"], 1) << placed[0].dump();
  EXPECT_TRUE(events(id, "run_interrupted").empty());

  // The ledger: two generations (the submit's, the recovery's), one failure, noticed at adoption.
  const json g = get("/v1/runs/" + std::to_string(id) + "/goodput");
  ASSERT_EQ(g["generations"].size(), 2u) << g.dump();
  EXPECT_EQ(g["generations"][1]["cause"], "recovery");
  ASSERT_EQ(g["failures"].size(), 1u) << g.dump();
  EXPECT_TRUE(g["failures"][0]["recovered"].get<bool>()) << g.dump();
  EXPECT_GT(g["seconds"]["detection"].get<double>(), 0) << g.dump();

  std::error_code ec;
  fs::remove(dir_ / "agent-node-1.pid", ec);
  pids_ = cluster_pids(dir_);
}

// `up` supervises its coordinator: killed with -9, it is started again by itself on the same folder and
// port (a line in coordinator-supervisor.log says so), the agents and their gang are left running, and the
// run is re-adopted in the same generation and trains on. `down` then stops the supervisor with the rest.
class ClusterSupervised : public ClusterCli {
 protected:
  std::string worker_fault() const override { return "0:slow_forward:100"; }
};

TEST_F(ClusterSupervised, KilledCoordinatorIsStartedAgainByUpAndReadoptsTheRun) {
  ASSERT_TRUE(fs::exists(dir_ / "supervisor.pid"));
  Result<json> sub = api_->post_json("/v1/runs", {{"config", tiny_config(100000)}, {"layout", {{"dp", 4}}}});
  ASSERT_TRUE(sub.ok()) << sub.error();
  const int64_t id = sub->at("id").get<int64_t>();
  ASSERT_TRUE(eventually([&] { return last_step(id) >= 3; }, 120s)) << run_state(id).dump();
  workers_ = children_of(pids_);
  const std::vector<pid_t> agents_before = {
      static_cast<pid_t>(std::stol(slurp((dir_ / "agent-node-0.pid").string()))),
      static_cast<pid_t>(std::stol(slurp((dir_ / "agent-node-1.pid").string())))};

  const pid_t first = static_cast<pid_t>(std::stol(slurp((dir_ / "coordinator.pid").string())));
  api_.reset();
  ASSERT_EQ(::kill(first, SIGKILL), 0);
  ASSERT_TRUE(eventually([&] { return gone(first); }, 5s));
  // Nobody starts it but `up`'s supervisor: the same URL answers again, from another process.
  pid_t second = 0;
  ASSERT_TRUE(eventually(
      [&] {
        second = static_cast<pid_t>(std::atol(slurp((dir_ / "coordinator.pid").string()).c_str()));
        return second > 0 && second != first && ::kill(second, 0) == 0;
      },
      30s))
      << slurp((dir_ / "coordinator-supervisor.log").string());
  api_ = std::make_unique<HttpClient>(HttpClientOptions{.url = url_, .token = token_});
  ASSERT_TRUE(eventually([&] { return api_->get_json("/v1/cluster").ok(); }, 30s))
      << slurp((dir_ / "coordinator.log").string());
  ASSERT_TRUE(eventually([&] { return !events(id, "run_adopted").empty(); }, 60s)) << run_state(id).dump();
  const json state = run_state(id);
  EXPECT_EQ(state["state"], "running") << state.dump();
  EXPECT_EQ(state["generation"], 1) << "re-adopted, not placed again: " << state.dump();
  const int64_t at = last_step(id);
  ASSERT_TRUE(eventually([&] { return last_step(id) > at + 2; }, 60s)) << run_state(id).dump();
  // Only the coordinator was started again: the agents are the same processes.
  for (pid_t a : agents_before) EXPECT_EQ(::kill(a, 0), 0) << "agent " << a;
  EXPECT_EQ(std::stol(slurp((dir_ / "agent-node-0.pid").string())), agents_before[0]);
  const std::string log = slurp((dir_ / "coordinator-supervisor.log").string());
  EXPECT_THAT(log, HasSubstr("coordinator pid " + std::to_string(first) + " was killed by signal 9"));
  EXPECT_THAT(log, HasSubstr("restart 1"));
  pids_ = cluster_pids(dir_);
  workers_ = children_of(pids_);
  ASSERT_TRUE(api_->post_json("/v1/runs/" + std::to_string(id) + "/stop", json::object()).ok());
  ASSERT_TRUE(eventually([&] { return run_state(id)["state"] == "stopped"; }, 60s)) << run_state(id).dump();
}

}  // namespace
}  // namespace gantry
