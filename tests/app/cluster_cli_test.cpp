// The control plane end to end, as an operator uses it: `gantry-engine up` starts a coordinator and two
// agents of two slots each (real processes on loopback); a dp-4 run of assets/configs/tiny.toml is
// submitted through the API, its steps arrive through the API, and checkpoint, pause, resume and stop
// take effect at one step on every rank (the events say so); a job that cannot be placed is refused with
// 409 and starts nothing; requests without the token get 401; `down` leaves no process behind. A
// quarantined node's run moves to the other node at dp 2 from its checkpoint, on the same loss curve, and
// a stopped run resumes from its latest checkpoint; resume-from never takes a path outside the run.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/prctl.h>  // PR_SET_CHILD_SUBREAPER: the daemons `up` starts become ours to reap
#include <arpa/inet.h>   // a raw request: what HttpClient never sends (malformed JSON, a lying Content-Length)
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "engine/cluster/http_client.h"
#include "engine/cluster/token.h"
#include "tests/app/engine_process.h"

namespace gantry {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using namespace std::chrono_literals;
using ::testing::HasSubstr;
using testing_support::run_engine;
using testing_support::slurp;

// Polls `pred` every 50 ms until it holds or `limit` passes.
template <class F>
bool eventually(F pred, std::chrono::milliseconds limit) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < deadline) {
    if (pred()) return true;
    std::this_thread::sleep_for(50ms);
  }
  return pred();
}

// Gone: reaped (we are their subreaper), or no such process.
bool gone(pid_t pid) {
  int status = 0;
  if (::waitpid(pid, &status, WNOHANG) == pid) return true;
  errno = 0;
  return ::kill(pid, 0) == -1 && errno == ESRCH;
}

// Every pid under `dir`'s pid files, and the workers: children of the agents, found in /proc.
std::vector<pid_t> cluster_pids(const fs::path& dir) {
  std::vector<pid_t> out;
  for (const fs::directory_entry& e : fs::directory_iterator(dir)) {
    if (e.path().extension() == ".pid") out.push_back(static_cast<pid_t>(std::stol(slurp(e.path().string()))));
  }
  return out;
}

std::vector<pid_t> children_of(const std::vector<pid_t>& parents) {
  std::vector<pid_t> out;
  for (const fs::directory_entry& e : fs::directory_iterator("/proc")) {
    const std::string name = e.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    const std::string stat = slurp(e.path().string() + "/stat");
    const size_t close = stat.rfind(')');
    if (close == std::string::npos) continue;
    std::istringstream rest(stat.substr(close + 2));
    std::string state;
    long ppid = 0;
    rest >> state >> ppid;
    for (pid_t p : parents)
      if (ppid == p && state != "Z") out.push_back(static_cast<pid_t>(std::stol(name)));
  }
  return out;
}

// One raw HTTP/1.1 request to 127.0.0.1:port; returns the status (0 when there was no answer).
int raw_status(int port, const std::string& request) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return 0;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::string reply;
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
      ::send(fd, request.data(), request.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(request.size())) {
    char buf[4096];
    ssize_t n = 0;
    while ((n = ::recv(fd, buf, sizeof buf, 0)) > 0) reply.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  int status = 0;
  std::sscanf(reply.c_str(), "HTTP/1.%*d %d", &status);
  return status;
}

class ClusterCli : public ::testing::Test {
 protected:
  void SetUp() override {
    ::prctl(PR_SET_CHILD_SUBREAPER, 1);
    dir_ = fs::path(::testing::TempDir()) / ("gantry_cluster_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    testing_support::Outcome up = run_engine("up --nodes 2 --slots 2 --dir " + dir_.string());
    ASSERT_EQ(up.code, 0) << up.err;
    url_ = up.out.substr(0, up.out.find('\n'));
    ASSERT_THAT(url_, HasSubstr("http://127.0.0.1:"));
    Result<std::string> token = token_file_read((dir_ / "token").string());
    ASSERT_TRUE(token.ok()) << token.error();
    EXPECT_EQ(fs::status(dir_ / "token").permissions() & fs::perms::all, fs::perms::owner_read | fs::perms::owner_write);
    token_ = token.value();
    api_ = std::make_unique<HttpClient>(HttpClientOptions{.url = url_, .token = token_});
    pids_ = cluster_pids(dir_);
    ASSERT_EQ(pids_.size(), 3u);  // the coordinator and two agents
  }

  void TearDown() override {
    api_.reset();  // an idle kept-alive connection would hold the coordinator's stop for its keep-alive
    testing_support::Outcome down = run_engine("down --dir " + dir_.string());
    EXPECT_EQ(down.code, 0) << down.err;
    for (pid_t p : pids_) EXPECT_TRUE(eventually([&] { return gone(p); }, 5s)) << "pid " << p << " left behind";
    for (pid_t p : workers_) EXPECT_TRUE(eventually([&] { return gone(p); }, 5s)) << "worker " << p << " left behind";
    if (HasFailure()) {
      for (const char* log : {"coordinator.log", "agent-node-0.log", "agent-node-1.log"})
        std::fprintf(stderr, "---- %s\n%s\n", log, slurp((dir_ / log).string()).c_str());
    }
  }

  json get(const std::string& path) {
    Result<json> r = api_->get_json(path);
    EXPECT_TRUE(r.ok()) << r.error();
    return r.ok() ? r.value() : json::object();
  }
  json run_state(int64_t id) { return get("/v1/runs/" + std::to_string(id)); }
  int64_t last_step(int64_t id) { return run_state(id).value("last_step", int64_t{-1}); }

  std::string tiny_config(int64_t max_steps) {
    // tiny.toml as it is, but one thread a rank and no periodic validation or checkpoints: four ranks share
    // two cores, and the checkpoints under test are the operator's.
    std::ifstream in(GANTRY_TINY_CONFIG);
    std::stringstream ss;
    ss << in.rdbuf();
    std::string t = ss.str();
    t = std::regex_replace(t, std::regex("max_steps = \\d+"), "max_steps = " + std::to_string(max_steps));
    t = std::regex_replace(t, std::regex("checkpoint_every = \\d+"), "checkpoint_every = 0");
    t = std::regex_replace(t, std::regex("val_every = \\d+"), "val_every = 0");
    t = std::regex_replace(t, std::regex("\\[train\\]"), "[train]\nthreads = 1");
    return t;
  }

  // The events of a run so far, read through the event stream until it has nothing more for a moment.
  std::vector<json> events(int64_t id, const std::string& kind_prefix) {
    Result<json> all = Status::error("");
    std::vector<json> out;
    HttpEventStream s({.url = url_, .token = token_});
    std::thread stopper([&] {
      std::this_thread::sleep_for(400ms);
      s.stop();
    });
    Status st = s.run("/v1/runs/" + std::to_string(id) + "/events", [&](const SseEvent& e) {
      json j = json::parse(e.data);
      if (j.value("kind", "").rfind(kind_prefix, 0) == 0) out.push_back(j);
      return true;
    });
    stopper.join();
    EXPECT_TRUE(st.ok()) << st.message();
    return out;
  }

  // Every rank reported `kind` at one and the same step; returns it.
  int64_t one_step_on_every_rank(int64_t id, const std::string& kind, int world) {
    std::map<int, int64_t> step_of_rank;
    EXPECT_TRUE(eventually(
        [&] {
          step_of_rank.clear();
          for (const json& e : events(id, kind)) step_of_rank[e.value("rank", -1)] = e.value("step", int64_t{-1});
          return static_cast<int>(step_of_rank.size()) == world;
        },
        10s))
        << kind << " reached " << step_of_rank.size() << " of " << world << " ranks";
    std::set<int64_t> steps;
    for (const auto& [rank, step] : step_of_rank) steps.insert(step);
    EXPECT_EQ(steps.size(), 1u) << kind << " took effect at different steps on different ranks";
    return steps.empty() ? -1 : *steps.begin();
  }

  fs::path dir_;
  std::string url_, token_;
  std::unique_ptr<HttpClient> api_;
  std::vector<pid_t> pids_, workers_;
};

TEST_F(ClusterCli, Dp4RunStepsAndActionsThroughTheApi) {
  json c = get("/v1/cluster");
  ASSERT_EQ(c["nodes"].size(), 2u);
  EXPECT_EQ(c["slots"], 4);

  // 6 ranks on 4 slots: refused with the reason, nothing started, nothing recorded.
  Result<HttpReply> refused = api_->post("/v1/runs", {{"config", tiny_config(10)}, {"layout", {{"dp", 6}}}});
  ASSERT_TRUE(refused.ok()) << refused.error();
  EXPECT_EQ(refused->status, 409);
  EXPECT_THAT(refused->error_message(), HasSubstr("cannot place dp 6"));
  EXPECT_THAT(refused->error_message(), HasSubstr("needs 6 free slots"));
  EXPECT_EQ(get("/v1/runs")["runs"].size(), 0u);
  EXPECT_TRUE(children_of({pids_[0], pids_[1], pids_[2]}).empty()) << "a refused job started workers";

  // A dp-4 run: two ranks on each node.
  Result<json> sub = api_->post_json("/v1/runs", {{"config", tiny_config(100000)}, {"layout", {{"dp", 4}, {"zero", 1}}}});
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
  workers_ = children_of({pids_[0], pids_[1], pids_[2]});
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

// Each agent serves its node's /metrics (the URL in <up dir>/agents/<node>/metrics_url): during a dp-4
// run, node-0's exposition names node-0's two ranks and no other, with steps past 0 and the agent's own
// counters; without the token it is 401, /healthz is open.
TEST_F(ClusterCli, AgentServesItsNodesMetrics) {
  Result<json> sub = api_->post_json("/v1/runs", {{"config", tiny_config(100000)}, {"layout", {{"dp", 4}}}});
  ASSERT_TRUE(sub.ok()) << sub.error();
  const int64_t id = sub->at("id").get<int64_t>();
  ASSERT_TRUE(eventually([&] { return last_step(id) >= 2; }, 30s)) << run_state(id).dump();
  workers_ = children_of({pids_[0], pids_[1], pids_[2]});
  std::set<std::string> node0_ranks;
  const json placed = run_state(id);  // named: a temporary would die before the loop body
  for (const json& share : placed["placement"]) {
    if (share["node"] != "node-0") continue;
    for (int k = 0; k < share["ranks"].get<int>(); ++k) node0_ranks.insert(std::to_string(share["first_rank"].get<int>() + k));
  }
  ASSERT_EQ(node0_ranks.size(), 2u);

  std::string url = slurp((dir_ / "agents" / "node-0" / "metrics_url").string());
  while (!url.empty() && url.back() == '\n') url.pop_back();
  ASSERT_THAT(url, ::testing::StartsWith("http://127.0.0.1:"));
  ASSERT_THAT(url, ::testing::EndsWith("/metrics"));
  const std::string base = url.substr(0, url.size() - std::string("/metrics").size());
  EXPECT_THAT(slurp((dir_ / "agent-node-0.log").string()), HasSubstr("serving " + url));

  std::string body;
  std::set<std::string> ranks_named;
  ASSERT_TRUE(eventually(
      [&] {
        HttpClient agent({.url = base, .token = token_});
        Result<HttpReply> m = agent.get("/metrics");
        if (!m.ok() || m->status != 200) return false;
        body = m->body;
        ranks_named.clear();
        static const std::regex rank_label("rank=\"(\\d+)\"");
        for (auto it = std::sregex_iterator(body.begin(), body.end(), rank_label); it != std::sregex_iterator(); ++it)
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
    ASSERT_TRUE(std::regex_search(body, m, std::regex("gantry_rank_step\\{run=\"" + std::to_string(id) + "\",rank=\"" + rank + "\"[^}]*\\} (\\S+)")))
        << "rank " << rank << ":\n" << body;
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

// An agent killed: its node is lost within the heartbeat timeout (5 s) and its run ends as failed, with
// an event naming the node; the other node's workers do not outlive it.
TEST_F(ClusterCli, KilledAgentLosesItsNodeAndStopsTheRun) {
  Result<json> sub = api_->post_json("/v1/runs", {{"config", tiny_config(100000)}, {"layout", {{"dp", 4}}}});
  ASSERT_TRUE(sub.ok()) << sub.error();
  const int64_t id = sub->at("id").get<int64_t>();
  ASSERT_TRUE(eventually([&] { return last_step(id) >= 2; }, 30s)) << run_state(id).dump();
  workers_ = children_of({pids_[0], pids_[1], pids_[2]});
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
  for (pid_t w : workers_) EXPECT_TRUE(eventually([&] { return gone(w); }, 10s)) << "worker " << w << " outlived the run";
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
  Result<HttpReply> bad = api_->post("/v1/runs", {{"config", "[model]\nn_head = 0\n"}, {"layout", {{"dp", 1}}}});
  ASSERT_TRUE(bad.ok());
  EXPECT_EQ(bad->status, 400);
  EXPECT_THAT(bad->error_message(), HasSubstr("config"));
  Result<HttpReply> bad_dp = api_->post("/v1/runs", {{"config", tiny_config(5)}, {"layout", {{"dp", "four"}}}});
  ASSERT_TRUE(bad_dp.ok());
  EXPECT_EQ(bad_dp->status, 400);
  EXPECT_THAT(bad_dp->error_message(), HasSubstr("layout.dp"));
  EXPECT_EQ(get("/v1/runs")["runs"].size(), 0u);

  // ctl: a refusal exits 3 with the reason; status prints the nodes.
  const std::string cfg = (dir_ / "tiny.toml").string();
  std::ofstream(cfg) << tiny_config(5);
  const std::string ctl = "ctl --url " + url_ + " --token-file " + (dir_ / "token").string() + " ";
  testing_support::Outcome refused = run_engine(ctl + "submit --config " + cfg + " --dp 5");
  EXPECT_EQ(refused.code, 3);
  EXPECT_THAT(refused.err, HasSubstr("409"));
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
  Result<json> sub = api_->post_json("/v1/runs", {{"config", tiny_config(100000)}, {"layout", {{"dp", 4}, {"zero", 1}}}});
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
  ASSERT_TRUE(eventually([&] { const json r = run_state(id); return r["generation"] == 2 && r["state"] == "running"; }, 40s))
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
  for (const char* stage : {"quarantine_requested", "quarantine_checkpointed", "quarantine_stopped", "quarantine_placed",
                            "quarantine_resumed"}) {
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
  Result<json> ref = api_->post_json("/v1/runs", {{"config", tiny_config(100000)}, {"layout", {{"dp", 2}}},
                                                 {"max_steps", ckpt_step + 2}});
  ASSERT_TRUE(ref.ok()) << ref.error();
  const int64_t ref_id = ref->at("id").get<int64_t>();
  EXPECT_EQ(ref->at("placement")[0]["node"], "node-1");
  ASSERT_TRUE(eventually([&] { return run_state(ref_id)["state"] == "finished"; }, 60s)) << run_state(ref_id).dump();
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
  const std::string head = "Host: x\r\nAuthorization: Bearer " + token_ + "\r\nContent-Type: application/json\r\nConnection: close\r\n";
  for (const std::string& path : {run + "/resume-from", std::string("/v1/nodes/node-0/quarantine"), std::string("/v1/runs")}) {
    const std::string bad = "{\"checkpoint\": ";
    EXPECT_EQ(raw_status(port, "POST " + path + " HTTP/1.1\r\n" + head + "Content-Length: " + std::to_string(bad.size()) +
                                   "\r\n\r\n" + bad),
              400)
        << path;
    EXPECT_EQ(raw_status(port, "POST " + path + " HTTP/1.1\r\n" + head + "Content-Length: " + std::to_string(64u << 20) +
                                   "\r\n\r\n{}"),
              413)
        << path;
  }
  for (const json& outside : {json("../../etc"), json("/etc"), json(dir_.string() + "/runs/1/checkpoints/step_00000001"),
                              json(".."), json(json::array())}) {
    Result<HttpReply> r = api_->post(run + "/resume-from", {{"checkpoint", outside}});
    ASSERT_TRUE(r.ok());
    EXPECT_EQ(r->status, 400) << outside.dump() << ": " << r->body;
  }
  Result<HttpReply> no_step = api_->post(run + "/resume-from", {{"checkpoint", 99999}});
  EXPECT_EQ(no_step->status, 400);
  EXPECT_THAT(no_step->error_message(), HasSubstr("no committed checkpoint at step 99999"));
  EXPECT_EQ(api_->post(run + "/resume-from", {{"checkpoint", "latest"}, {"layout", {{"dp", 3}}}})->status, 400);
  EXPECT_EQ(api_->post("/v1/runs/" + std::to_string(ref_id + 1) + "/resume-from", {{"checkpoint", "latest"}})->status, 404);
  EXPECT_EQ(run_state(id)["state"], "stopped");
  EXPECT_EQ(run_state(id)["generation"], 2);
  for (const json& n : get("/v1/cluster")["nodes"]) EXPECT_EQ(n["state"], "healthy") << n.dump();
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

}  // namespace
}  // namespace gantry
