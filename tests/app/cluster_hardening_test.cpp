// The control plane under attack and bad luck (issue "Hardening"), each against a real `up` cluster on
// loopback: a deeply nested JSON body is a 400 and the coordinator and its live run carry on; 200 idle
// and trickling connections hold no thread, so heartbeats go on and no node is lost; a coordinator killed
// with -9, or stopped with `down`, comes back with its runs (interrupted, with why), their events and
// checkpoints, and resume-from continues them; a failed run names the rank that died, not a peer that
// fell with it; bad submissions (a dp that does not divide the batch, an oversized name or body) are
// refused with the numbers, changing nothing; garbage fields (a key given twice, a field an action does not
// take, a node name its routes cannot carry) are 400s naming them; an agent restarted at once takes its
// node back; registrations that trickle their bodies do not stall the heartbeats.
#include <fcntl.h>
#include <netinet/tcp.h>

#include <algorithm>

#include "tests/app/cluster_fixture.h"
#include "tests/app/engine_child.h"  // the agent started again by hand

namespace gantry {
namespace {

using namespace cluster_testing;  // NOLINT: the fixture and its helpers are this suite's vocabulary
using testing_support::EngineChild;

int port_of(const std::string& url) {
  return std::stoi(url.substr(url.rfind(':') + 1));
}

// A raw POST with the given bearer token and body; the status and the reply's body.
std::pair<int, std::string> raw_post(int port, const std::string& path, const std::string& token,
                                     const std::string& body) {
  return raw_request(port, "POST " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer " + token +
                               "\r\nContent-Type: application/json\r\nContent-Length: " +
                               std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n" + body);
}

class ClusterHardening : public ClusterCli {
 protected:
  // The crash test kills the coordinator and brings the cluster back itself (`down`, `up`): no supervisor
  // may start the coordinator again in between.
  std::string up_args() const override { return "--nodes 2 --slots 2 --no-restart"; }

  int64_t submit_dp4(const json& extra = json::object()) {
    json body = {{"config", tiny_config(100000)}, {"layout", {{"dp", 4}}}};
    body.update(extra);
    Result<json> sub = api_->post_json("/v1/runs", body);
    EXPECT_TRUE(sub.ok()) << sub.error();
    if (!sub.ok()) return -1;
    const int64_t id = sub->at("id").get<int64_t>();
    EXPECT_TRUE(eventually([&] { return last_step(id) >= 2; }, 60s)) << run_state(id).dump();
    workers_ = children_of({pids_[0], pids_[1], pids_[2]});
    return id;
  }

  void expect_nodes_healthy() {
    // Held in a variable: a range-for over get(...)["nodes"] iterates a member of a destroyed temporary,
    // and saw no node at all, so this passed with both nodes lost.
    const json cluster = get("/v1/cluster");
    EXPECT_EQ(cluster["nodes"].size(), 2u) << cluster.dump();
    for (const json& n : cluster["nodes"]) EXPECT_EQ(n["state"], "healthy") << n.dump();
  }
};

// ~80,000 nested '[' in a field (160 KB, under the body limit) used to overflow the coordinator's stack
// when an error message quoted the value; the agents' join token reached the same code through
// POST /v1/agents. Now each is a 400 naming the nesting, and the live run goes on.
TEST_F(ClusterHardening, DeeplyNestedJsonIsRefusedAndTheRunGoesOn) {
  const int64_t id = submit_dp4();
  ASSERT_GE(id, 0);
  const std::string deep = "{\"config\": " + std::string(80000, '[') + std::string(80000, ']') + "}";
  const int port = port_of(url_);
  auto [status, body] = raw_post(port, "/v1/runs", token_, deep);
  EXPECT_EQ(status, 400) << body;
  EXPECT_THAT(body, HasSubstr("nested deeper than 64"));
  Result<std::string> agent_token = token_file_read((dir_ / "agent_token").string());
  ASSERT_TRUE(agent_token.ok()) << agent_token.error();
  const std::string deep_node =
      "{\"node\": " + std::string(80000, '[') + std::string(80000, ']') + ", \"slots\": 1}";
  auto [status2, body2] = raw_post(port, "/v1/agents", agent_token.value(), deep_node);
  EXPECT_EQ(status2, 400) << body2;
  EXPECT_THAT(body2, HasSubstr("nested deeper than 64"));

  // Nothing changed: the coordinator is the same process, the run trains on, both nodes are healthy.
  EXPECT_EQ(::kill(static_cast<pid_t>(std::stol(slurp((dir_ / "coordinator.pid").string()))), 0), 0);
  const int64_t before = last_step(id);
  ASSERT_TRUE(eventually([&] { return last_step(id) > before + 2; }, 30s)) << run_state(id).dump();
  EXPECT_EQ(run_state(id)["state"], "running");
  expect_nodes_healthy();
  EXPECT_EQ(get("/v1/runs")["runs"].size(), 1u);
  ASSERT_TRUE(api_->post_json("/v1/runs/" + std::to_string(id) + "/stop", json::object()).ok());
  ASSERT_TRUE(eventually([&] { return run_state(id)["state"] == "stopped"; }, 30s)) << run_state(id).dump();
}

// 200 connections that say nothing, and 20 that trickle half a header, held for longer than the node
// timeout (5 s): they used to take every server thread, so heartbeats queued behind them and both nodes
// were lost with the run. Now they wait at the gate holding no thread.
TEST_F(ClusterHardening, IdleConnectionsNeitherLoseNodesNorStallTheApi) {
  const int64_t id = submit_dp4();
  ASSERT_GE(id, 0);
  const int port = port_of(url_);
  std::vector<int> held;
  for (int i = 0; i < 200; ++i) held.push_back(raw_connect(port));
  for (int i = 0; i < 20; ++i) held.push_back(raw_connect(port, "GET /v1/cluster HTTP/1.1\r\nHost: x\r\n"));
  ASSERT_EQ(std::count(held.begin(), held.end(), -1), 0) << "could not open the connections";
  const int64_t before = last_step(id);
  const auto hold_until = std::chrono::steady_clock::now() + 8s;
  int answered = 0;
  while (std::chrono::steady_clock::now() < hold_until) {
    // An authenticated caller is answered while the strangers hold on.
    Result<HttpReply> r = api_->get("/v1/cluster");
    answered += r.ok() && r->status == 200;
    std::this_thread::sleep_for(500ms);
  }
  EXPECT_GE(answered, 10);
  expect_nodes_healthy();
  json state = run_state(id);
  EXPECT_EQ(state["state"], "running") << state.dump();
  EXPECT_GT(state["last_step"].get<int64_t>(), before)
      << "the run did not advance while the connections were held";
  for (int fd : held) ::close(fd);
  EXPECT_TRUE(events(id, "node_lost").empty());
  ASSERT_TRUE(api_->post_json("/v1/runs/" + std::to_string(id) + "/stop", json::object()).ok());
  ASSERT_TRUE(eventually([&] { return run_state(id)["state"] == "stopped"; }, 30s)) << run_state(id).dump();
}

// A coordinator killed with -9 mid-run, and one stopped cleanly by `down`: `up` on the same folder comes
// back with the run (interrupted, saying why), its events and its checkpoint catalog (the ones the workers
// pruned marked deleted), and resume-from continues it each time.
TEST_F(ClusterHardening, RestartedCoordinatorKeepsItsRunsAndResumesThem) {
  const int64_t id = submit_dp4({{"checkpoint_every_steps", 2}, {"name", "survivor"}});
  ASSERT_GE(id, 0);
  const std::string run = "/v1/runs/" + std::to_string(id);
  // tiny.toml keeps 3 checkpoints on disk: wait for more than that to have committed.
  ASSERT_TRUE(eventually([&] { return get(run + "/checkpoints")["checkpoints"].size() >= 5; }, 60s))
      << get(run + "/checkpoints").dump();
  json catalog = get(run + "/checkpoints")["checkpoints"];
  int deleted = 0, committed = 0;
  for (const json& c : catalog) {
    const bool on_disk = fs::exists(c["path"].get<std::string>() + "/manifest.json");
    if (c["state"] == "committed") {
      ++committed;
      EXPECT_TRUE(on_disk) << "catalogued as committed but gone: " << c.dump();
    } else {
      EXPECT_EQ(c["state"], "deleted") << c.dump();
      ++deleted;
    }
  }
  EXPECT_GE(deleted, 1) << catalog.dump();
  EXPECT_LE(committed, 3) << catalog.dump();

  // The crash: kill -9 of the coordinator, then the rest of the cluster goes down and comes back up.
  const pid_t coordinator = static_cast<pid_t>(std::stol(slurp((dir_ / "coordinator.pid").string())));
  ASSERT_EQ(::kill(coordinator, SIGKILL), 0);
  ASSERT_TRUE(eventually([&] { return gone(coordinator); }, 5s));
  ASSERT_NO_FATAL_FAILURE(restart_cluster());
  json runs = get("/v1/runs")["runs"];
  ASSERT_EQ(runs.size(), 1u) << runs.dump();
  // Its gang was stopped with the agents (`down`), so it never comes back: interrupted once the new
  // coordinator's re-adoption grace is over.
  ASSERT_TRUE(eventually([&] { return run_state(id)["state"] != "running"; }, 30s)) << run_state(id).dump();
  json state = run_state(id);
  EXPECT_EQ(state["state"], "interrupted") << state.dump();
  EXPECT_EQ(state["name"], "survivor");
  EXPECT_EQ(state["layout"]["dp"], 4);
  EXPECT_THAT(state["message"].get<std::string>(), HasSubstr("coordinator went away while the run was live"));
  EXPECT_FALSE(events(id, "submitted").empty()) << "the run's events were not kept";
  EXPECT_FALSE(events(id, "run_interrupted").empty());
  EXPECT_GE(get(run + "/checkpoints")["checkpoints"].size(), 5u);
  EXPECT_GT(get(run + "/steps?after=0")["steps"].size(), 2u);

  Result<HttpReply> resumed = api_->post(run + "/resume-from", {{"checkpoint", "latest"}});
  ASSERT_TRUE(resumed.ok()) << resumed.error();
  ASSERT_EQ(resumed->status, 202) << resumed->body;
  const int64_t from = json::parse(resumed->body)["from_step"].get<int64_t>();
  ASSERT_TRUE(eventually([&] { return last_step(id) > from + 2; }, 60s)) << run_state(id).dump();
  EXPECT_EQ(run_state(id)["state"], "running");
  workers_ = children_of({pids_[0], pids_[1], pids_[2]});

  // A clean `down` while it trains: interrupted again (not failed), and resumable again.
  ASSERT_NO_FATAL_FAILURE(restart_cluster());
  state = run_state(id);
  EXPECT_EQ(state["state"], "interrupted") << state.dump();
  Result<HttpReply> again = api_->post(run + "/resume-from", {{"checkpoint", "latest"}});
  ASSERT_TRUE(again.ok()) << again.error();
  EXPECT_EQ(again->status, 202) << again->body;
  const int64_t from2 = json::parse(again->body)["from_step"].get<int64_t>();
  EXPECT_GT(from2, from);
  ASSERT_TRUE(eventually([&] { return last_step(id) > from2; }, 60s)) << run_state(id).dump();
  workers_ = children_of({pids_[0], pids_[1], pids_[2]});
  ASSERT_TRUE(api_->post_json(run + "/stop", json::object()).ok());
  ASSERT_TRUE(eventually([&] { return run_state(id)["state"] == "stopped"; }, 30s)) << run_state(id).dump();
}

// kill -9 of rank 2 (on node-1): its node's gang fails by a signal, node-0's ranks fail after it on broken
// collectives; the run's message names the one that died.
TEST_F(ClusterHardening, FailedRunNamesTheRankThatDied) {
  const int64_t id = submit_dp4({{"max_restarts", 0}});  // the failure itself, not its recovery
  ASSERT_GE(id, 0);
  const pid_t victim = pid_of_rank(workers_, 2);
  ASSERT_GT(victim, 0) << "no worker with RANK=2 among " << workers_.size();
  ASSERT_EQ(::kill(victim, SIGKILL), 0);
  ASSERT_TRUE(eventually([&] { return run_state(id)["state"] == "failed"; }, 60s)) << run_state(id).dump();
  const std::string message = run_state(id)["message"].get<std::string>();
  EXPECT_THAT(message, HasSubstr("node-1"));
  EXPECT_THAT(message, HasSubstr("rank 2"));
  EXPECT_THAT(message, HasSubstr("SIGKILL"));
}

// Node-1's ranks (2 and 3) SIGSTOPped, a frozen node, with a collective timeout of 3 s and a hang timeout
// far past it: node-0's ranks time out waiting for them, their gang fails first, and the coordinator stops
// node-1's gang. That gang used to end as a plain stop (130) and the run's message named node-0's rank 0
// ("timeout after 3000 ms waiting for data from rank 3"); the one-rank version of this test failed so when
// node-0 reported before node-1's own rank timed out. Told to stop, node-1's launcher now finds its ranks
// stopped and reports them, and the coordinator prefers that to peers that timed out.
TEST_F(ClusterHardening, HungRankIsNamedNotThePeersThatTimedOut) {
  std::string config = tiny_config(100000);
  config = std::regex_replace(config, std::regex("\\[train\\]"), "[train]\ncollective_timeout_s = 3");
  Result<json> sub = api_->post_json(
      "/v1/runs",
      {{"config", config}, {"layout", {{"dp", 4}}}, {"max_restarts", 0}, {"hang_timeout_s", 3600}});
  ASSERT_TRUE(sub.ok()) << sub.error();
  const int64_t id = sub->at("id").get<int64_t>();
  ASSERT_TRUE(eventually([&] { return last_step(id) >= 2; }, 60s)) << run_state(id).dump();
  workers_ = children_of({pids_[0], pids_[1], pids_[2]});
  const pid_t rank2 = pid_of_rank(workers_, 2), rank3 = pid_of_rank(workers_, 3);
  ASSERT_GT(rank2, 0);
  ASSERT_GT(rank3, 0);
  ASSERT_EQ(::kill(rank2, SIGSTOP), 0);
  ASSERT_EQ(::kill(rank3, SIGSTOP), 0);
  const bool failed = eventually([&] { return run_state(id)["state"] == "failed"; }, 60s);
  ::kill(rank2, SIGCONT);  // whatever happened, leave nothing stopped behind
  ::kill(rank3, SIGCONT);
  ASSERT_TRUE(failed) << run_state(id).dump();
  const std::string message = run_state(id)["message"].get<std::string>();
  EXPECT_THAT(message, HasSubstr("node-1: rank 2"));
  EXPECT_THAT(message, HasSubstr("stopped answering"));
  EXPECT_THAT(message, HasSubstr("also rank 3"));
}

// Refused with the numbers, and nothing recorded or started: a dp that does not divide the global batch
// (it used to be accepted and then fail), a 900 KB name, a body past the documented 1 MiB.
TEST_F(ClusterHardening, BadSubmissionsAreRefusedWithTheNumbers) {
  Result<HttpReply> dp3 = api_->post("/v1/runs", {{"config", tiny_config(10)}, {"layout", {{"dp", 3}}}});
  ASSERT_TRUE(dp3.ok()) << dp3.error();
  EXPECT_EQ(dp3->status, 400);
  EXPECT_THAT(dp3->error_message(), HasSubstr("train.global_batch = 16"));
  EXPECT_THAT(dp3->error_message(), HasSubstr("3 data-parallel ranks"));

  Result<HttpReply> named = api_->post(
      "/v1/runs",
      {{"config", tiny_config(10)}, {"layout", {{"dp", 2}}}, {"name", std::string(900 * 1024, 'n')}});
  ASSERT_TRUE(named.ok()) << named.error();
  EXPECT_EQ(named->status, 400);
  EXPECT_THAT(named->error_message(), HasSubstr("field \"name\": expected 1-128 printable ASCII characters"));
  EXPECT_LT(named->body.size(), 1000u) << "the refusal echoed the name";

  auto [status, body] =
      raw_post(port_of(url_), "/v1/runs", token_, "{\"config\": \"" + std::string(1536 * 1024, 'x') + "\"}");
  EXPECT_EQ(status, 413) << body;
  EXPECT_THAT(body, HasSubstr("over the limit of 1048576 bytes"));

  EXPECT_EQ(get("/v1/runs")["runs"].size(), 0u);
  EXPECT_TRUE(children_of({pids_[0], pids_[1], pids_[2]}).empty()) << "a refused job started workers";
  EXPECT_FALSE(fs::exists(dir_ / "runs" / "1"));
}

// Garbage that used to get through, each refused with a 400 naming the field and what would be right, and
// nothing changed: a key given twice (nlohmann kept the last: the server trained dp 3 where a reader of the
// request saw dp 1); a field an action does not take (dropped with a 202); a node name its routes cannot
// carry (registered, then lost, every heartbeat a 404); a re-registration's gang whose run is not a number
// (a 400 that left the node registered); a 100 KB unknown key (echoed back whole); a step past int64
// (named as a negative step).
TEST_F(ClusterHardening, GarbageFieldsAreRefusedNamingThemAndChangeNothing) {
  const int port = port_of(url_);
  const std::string config = json(tiny_config(100000)).dump();
  auto [twice, twice_body] =
      raw_post(port, "/v1/runs", token_,
               "{\"config\": " + config + ", \"layout\": {\"dp\": 1}, \"layout\": {\"dp\": 3}}");
  EXPECT_EQ(twice, 400) << twice_body;
  EXPECT_THAT(twice_body, HasSubstr("field \\\"layout\\\" is given twice"));
  Result<HttpReply> long_key = api_->post(
      "/v1/runs", {{"config", tiny_config(10)}, {"layout", {{"dp", 1}}}, {std::string(100000, 'k'), 1}});
  ASSERT_TRUE(long_key.ok()) << long_key.error();
  EXPECT_EQ(long_key->status, 400);
  EXPECT_THAT(long_key->error_message(), HasSubstr("unknown field \"kkkk"));
  EXPECT_LT(long_key->body.size(), 1000u) << "the refusal echoed the key";
  EXPECT_EQ(get("/v1/runs")["runs"].size(), 0u);

  Result<std::string> agent_token = token_file_read((dir_ / "agent_token").string());
  ASSERT_TRUE(agent_token.ok()) << agent_token.error();
  for (const std::string node : {"rack/a", "node 2", ".."}) {
    auto [status, body] =
        raw_post(port, "/v1/agents", agent_token.value(), json({{"node", node}, {"slots", 1}}).dump());
    EXPECT_EQ(status, 400) << node << ": " << body;
    EXPECT_THAT(body, HasSubstr("cannot name a node: use 1-128 letters, digits, '.', '_' and '-'")) << node;
  }
  // The agent itself refuses such a name before it makes anything: its memory folder is
  // /dev/shm/gantry-agent-NAME-PID, and "t<pid>/x" made /dev/shm/gantry-agent-t<pid>/ (".." in it, a folder
  // anywhere) before the coordinator's refusal.
  const std::string nested = "t" + std::to_string(::getpid()) + "/x";
  testing_support::Outcome agent =
      run_engine("agent --coordinator " + url_ + " --token-file " + (dir_ / "agent_token").string() +
                 " --node " + nested + " --dir " + (dir_ / "nested-agent").string());
  EXPECT_EQ(agent.code, 1) << agent.err;
  EXPECT_THAT(agent.err, HasSubstr("--node: \"" + nested + "\" cannot name a node"));
  const fs::path escaped = "/dev/shm/gantry-agent-t" + std::to_string(::getpid());
  EXPECT_FALSE(fs::exists(escaped)) << "the agent made a folder from its bad name";
  fs::remove_all(escaped);
  auto [adopt, adopt_body] = raw_post(port, "/v1/agents", agent_token.value(),
                                      R"({"node": "node-9", "slots": 1, "gangs": [{"run": "x"}]})");
  EXPECT_EQ(adopt, 400) << adopt_body;
  EXPECT_EQ(json::parse(adopt_body).value("error", ""),
            "field \"gangs[0].run\": expected an integer, got a string");
  EXPECT_EQ(get("/v1/cluster")["nodes"].size(), 2u) << "a refused registration registered its node";

  Result<json> sub = api_->post_json("/v1/runs", {{"config", tiny_config(100000)}, {"layout", {{"dp", 1}}}});
  ASSERT_TRUE(sub.ok()) << sub.error();
  const int64_t id = sub->at("id").get<int64_t>();
  const std::string run = "/v1/runs/" + std::to_string(id);
  ASSERT_TRUE(eventually([&] { return last_step(id) >= 2; }, 60s)) << run_state(id).dump();
  Result<HttpReply> paws = api_->post(run + "/pause", {{"paws", true}});
  ASSERT_TRUE(paws.ok()) << paws.error();
  EXPECT_EQ(paws->status, 400);
  EXPECT_THAT(paws->error_message(), HasSubstr("unknown field \"paws\" (this request takes no fields)"));
  const int64_t before = last_step(id);
  ASSERT_TRUE(eventually([&] { return last_step(id) > before + 1; }, 30s)) << run_state(id).dump();
  EXPECT_EQ(run_state(id)["state"], "running");

  ASSERT_TRUE(api_->post_json(run + "/stop", json::object()).ok());
  ASSERT_TRUE(eventually([&] { return run_state(id)["state"] == "stopped"; }, 30s)) << run_state(id).dump();
  ASSERT_TRUE(eventually([&] { return !get(run + "/checkpoints")["checkpoints"].empty(); }, 10s))
      << "the stop wrote no checkpoint";
  Result<HttpReply> far = api_->post(run + "/resume-from", {{"checkpoint", uint64_t{1} << 63}});
  ASSERT_TRUE(far.ok()) << far.error();
  EXPECT_EQ(far->status, 400);
  EXPECT_THAT(far->error_message(), HasSubstr("no committed checkpoint at step 9223372036854775808"));
  EXPECT_EQ(run_state(id)["state"], "stopped");
}

// An agent killed with -9 and started again at once (a crash under a supervisor, a quick restart): its
// predecessor still held the node's name until the coordinator found it silent, and the new agent exited
// with that 409. Now it waits that out and registers; the node is healthy under the new pid and takes a
// run. A second live agent of the same name is still refused, after the same wait.
TEST_F(ClusterHardening, AnAgentRestartedAtOnceTakesItsNodeBack) {
  const pid_t old = static_cast<pid_t>(std::stol(slurp((dir_ / "agent-node-1.pid").string())));
  std::string cmdline = slurp("/proc/" + std::to_string(old) + "/cmdline");
  std::vector<std::string> args;
  for (size_t at = 0; at < cmdline.size();) {
    const size_t end = cmdline.find('\0', at);
    args.push_back(cmdline.substr(at, end - at));
    at = end == std::string::npos ? cmdline.size() : end + 1;
  }
  ASSERT_GE(args.size(), 2u);
  ASSERT_EQ(args[1], "agent") << cmdline;
  args.erase(args.begin());  // the binary: EngineChild puts its own
  ASSERT_EQ(::kill(old, SIGKILL), 0);
  ASSERT_TRUE(eventually([&] { return gone(old); }, 5s));

  EngineChild again = EngineChild::start(args);
  ASSERT_TRUE(again.wait_for_stderr(
      [](const std::string& e) { return e.find("registered 2 slots") != std::string::npos; }, 30s))
      << again.err();
  EXPECT_THAT(again.err(), HasSubstr("already registered by another agent"));
  auto node_1 = [&] {
    const json cluster = get("/v1/cluster");
    for (const json& n : cluster["nodes"])
      if (n["id"] == "node-1") return n;
    return json::object();
  };
  ASSERT_TRUE(eventually([&] { return node_1().value("pid", 0) == again.pid(); }, 10s)) << node_1().dump();
  EXPECT_EQ(node_1()["state"], "healthy");

  std::vector<std::string> dup_args = args;
  const auto dir_flag = std::find(dup_args.begin(), dup_args.end(), "--dir");
  ASSERT_NE(dir_flag, dup_args.end());
  *(dir_flag + 1) = (dir_ / "duplicate-agent").string();
  EngineChild dup = EngineChild::start(dup_args);
  const EngineChild::Exit dup_exit = dup.wait(60s);
  EXPECT_EQ(dup_exit.code, 1) << dup.err();
  EXPECT_THAT(dup.err(),
              HasSubstr("cannot register with the coordinator: POST /v1/agents: 409 Conflict: node "
                        "\"node-1\" is already registered by another agent (pid " +
                        std::to_string(again.pid())));

  Result<json> sub = api_->post_json("/v1/runs", {{"config", tiny_config(100000)}, {"layout", {{"dp", 4}}}});
  ASSERT_TRUE(sub.ok()) << sub.error();
  const int64_t id = sub->at("id").get<int64_t>();
  ASSERT_TRUE(eventually([&] { return last_step(id) >= 1; }, 60s)) << run_state(id).dump();
  EXPECT_EQ(node_1()["busy_slots"], 2) << node_1().dump();
  ASSERT_TRUE(api_->post_json("/v1/runs/" + std::to_string(id) + "/stop", json::object()).ok());
  ASSERT_TRUE(eventually([&] { return run_state(id)["state"] == "stopped"; }, 30s)) << run_state(id).dump();
  ::kill(again.pid(), SIGTERM);
  EXPECT_EQ(again.wait(30s).code, 0) << again.err();
}

// Six registrations that send their header and then trickle the body a byte a second, for longer than the
// node timeout (5 s), from a holder of the agents' join token (every node has it): each took one of the
// agents' lane's four threads as its body came in, so the heartbeats queued behind them and both nodes
// were lost. Now one request per target is served at a time and the rest wait at the gate holding no
// thread; the heartbeats, each on its own node's path, go on.
TEST_F(ClusterHardening, TricklingRegistrationsDoNotStallHeartbeats) {
  Result<std::string> agent_token = token_file_read((dir_ / "agent_token").string());
  ASSERT_TRUE(agent_token.ok()) << agent_token.error();
  const int port = port_of(url_);
  const std::vector<std::string> targets = {"/v1/agents",     "/v1/agents/", "/v1/agents%2F",
                                            "/v1/agents?a=1", "/v1/agents",  "/v1/agents"};
  std::vector<int> held;
  for (const std::string& target : targets) {
    held.push_back(raw_connect(
        port, "POST " + target + " HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + agent_token.value() +
                  "\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{"));
  }
  ASSERT_EQ(std::count(held.begin(), held.end(), -1), 0) << "could not open the connections";
  const auto hold_until = std::chrono::steady_clock::now() + 8s;
  while (std::chrono::steady_clock::now() < hold_until) {
    for (int fd : held) ::send(fd, " ", 1, MSG_NOSIGNAL);  // within the server's 5 s read timeout
    std::this_thread::sleep_for(1s);
  }
  expect_nodes_healthy();
  for (int fd : held) ::close(fd);
  // The agents' lane still takes a registration.
  auto [status, body] =
      raw_post(port, "/v1/agents", agent_token.value(), json({{"node", "node-7"}, {"slots", 1}}).dump());
  EXPECT_EQ(status, 200) << body;
}

}  // namespace
}  // namespace gantry
