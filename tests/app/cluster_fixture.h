// The control plane's test fixture: `gantry-engine up` on loopback in a folder of this process's own, the
// API's client with the token `up` wrote, and `down` at the end with a check that no process is left.
// Shared by the cluster's end-to-end suites (cluster_cli_test, cluster_hardening_test).
#pragma once

#include <arpa/inet.h>  // a raw request: what HttpClient never sends (malformed JSON, a lying Content-Length)
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>  // PR_SET_CHILD_SUBREAPER: the daemons `up` starts become ours to reap
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
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
#include <utility>
#include <vector>

#include "engine/cluster/http_client.h"
#include "engine/cluster/token.h"
#include "tests/app/engine_process.h"
#include "tests/scratch_dir.h"

namespace gantry::cluster_testing {

namespace fs = std::filesystem;
using json = nlohmann::json;
using namespace std::chrono_literals;
using ::testing::HasSubstr;
using testing_support::children_of;
using testing_support::run_engine;
using testing_support::slurp;

// Polls `pred` every 50 ms until it holds or `limit` passes.
template <class F>
inline bool eventually(F pred, std::chrono::milliseconds limit) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < deadline) {
    if (pred()) return true;
    std::this_thread::sleep_for(50ms);
  }
  return pred();
}

// The pid whose environment says RANK=<rank>, among `pids`; 0 if none.
inline pid_t pid_of_rank(const std::vector<pid_t>& pids, int rank) {
  for (pid_t p : pids) {
    std::string env = slurp("/proc/" + std::to_string(p) + "/environ");
    std::replace(env.begin(), env.end(), '\0', '\n');
    if (("\n" + env).find("\nRANK=" + std::to_string(rank) + "\n") != std::string::npos) return p;
  }
  return 0;
}

// Gone: reaped (we are their subreaper), or no such process.
inline bool gone(pid_t pid) {
  int status = 0;
  if (::waitpid(pid, &status, WNOHANG) == pid) return true;
  errno = 0;
  return ::kill(pid, 0) == -1 && errno == ESRCH;
}

// Every pid under `dir`'s pid files, and the workers: children of the agents, found in /proc.
inline std::vector<pid_t> cluster_pids(const fs::path& dir) {
  std::vector<pid_t> out;
  for (const fs::directory_entry& e : fs::directory_iterator(dir)) {
    if (e.path().extension() == ".pid")
      out.push_back(static_cast<pid_t>(std::stol(slurp(e.path().string()))));
  }
  return out;
}

// A connection to 127.0.0.1:port that has sent `prefix` (maybe nothing); -1 on failure.
inline int raw_connect(int port, const std::string& prefix = "") {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
      (!prefix.empty() &&
       ::send(fd, prefix.data(), prefix.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(prefix.size()))) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// One raw HTTP/1.1 request to 127.0.0.1:port: the reply's status (0 when there was no answer) and body.
inline std::pair<int, std::string> raw_request(int port, const std::string& request) {
  std::string reply;
  if (const int fd = raw_connect(port, request); fd >= 0) {
    char buf[4096];
    ssize_t n = 0;
    while ((n = ::recv(fd, buf, sizeof buf, 0)) > 0) reply.append(buf, static_cast<size_t>(n));
    ::close(fd);
  }
  int status = 0;
  std::sscanf(reply.c_str(), "HTTP/1.%*d %d", &status);
  const size_t body_at = reply.find("\r\n\r\n");
  return {status, body_at == std::string::npos ? "" : reply.substr(body_at + 4)};
}

inline int raw_status(int port, const std::string& request) {
  return raw_request(port, request).first;
}

class ClusterCli : public ::testing::Test {
 protected:
  // What `up` starts: two nodes of two slots; a derived fixture adds spares or a worker fault.
  virtual std::string up_args() const { return "--nodes 2 --slots 2"; }
  virtual size_t daemons() const { return 3; }  // the coordinator and the agents
  // `up` supervises its coordinator (a pid file of its own) unless told --no-restart.
  size_t supervisors() const { return up_args().find("--no-restart") == std::string::npos ? 1 : 0; }
  // GANTRY_TEST_WORKER_FAULT for every worker of the cluster ("" = none): `up`'s agents inherit it, and
  // their workers from them.
  virtual std::string worker_fault() const { return ""; }

  void SetUp() override {
    ::prctl(PR_SET_CHILD_SUBREAPER, 1);
    dir_ = testing_support::scratch_dir("cluster");
    if (!worker_fault().empty()) ::setenv("GANTRY_TEST_WORKER_FAULT", worker_fault().c_str(), 1);
    testing_support::Outcome up = run_engine("up " + up_args() + " --dir " + dir_.string());
    ::unsetenv("GANTRY_TEST_WORKER_FAULT");
    ASSERT_EQ(up.code, 0) << up.err;
    url_ = up.out.substr(0, up.out.find('\n'));
    ASSERT_THAT(url_, HasSubstr("http://127.0.0.1:"));
    Result<std::string> token = token_file_read((dir_ / "token").string());
    ASSERT_TRUE(token.ok()) << token.error();
    EXPECT_EQ(fs::status(dir_ / "token").permissions() & fs::perms::all,
              fs::perms::owner_read | fs::perms::owner_write);
    token_ = token.value();
    api_ = std::make_unique<HttpClient>(HttpClientOptions{.url = url_, .token = token_});
    pids_ = cluster_pids(dir_);
    ASSERT_EQ(pids_.size(), daemons() + supervisors());
  }

  void TearDown() override {
    api_.reset();  // an idle kept-alive connection would hold the coordinator's stop for its keep-alive
    testing_support::Outcome down = run_engine("down --dir " + dir_.string());
    EXPECT_EQ(down.code, 0) << down.err;
    for (pid_t p : pids_)
      EXPECT_TRUE(eventually([&] { return gone(p); }, 5s)) << "pid " << p << " left behind";
    for (pid_t p : workers_)
      EXPECT_TRUE(eventually([&] { return gone(p); }, 5s)) << "worker " << p << " left behind";
    if (HasFailure()) {
      for (const char* log : {"coordinator.log", "agent-node-0.log", "agent-node-1.log", "agent-spare-0.log"})
        std::fprintf(stderr, "---- %s\n%s\n", log, slurp((dir_ / log).string()).c_str());
    }
  }

  // `down`, then `up` on the same folder: a new coordinator (and new agents) on the old database.
  void restart_cluster() {
    api_.reset();
    testing_support::Outcome down = run_engine("down --dir " + dir_.string());
    ASSERT_EQ(down.code, 0) << down.err;
    for (pid_t p : pids_)
      ASSERT_TRUE(eventually([&] { return gone(p); }, 10s)) << "pid " << p << " survived down";
    for (pid_t p : workers_)
      ASSERT_TRUE(eventually([&] { return gone(p); }, 10s)) << "worker " << p << " survived down";
    testing_support::Outcome up = run_engine("up " + up_args() + " --dir " + dir_.string());
    ASSERT_EQ(up.code, 0) << up.err;
    url_ = up.out.substr(0, up.out.find('\n'));
    Result<std::string> token = token_file_read((dir_ / "token").string());
    ASSERT_TRUE(token.ok()) << token.error();
    token_ = token.value();
    api_ = std::make_unique<HttpClient>(HttpClientOptions{.url = url_, .token = token_});
    pids_ = cluster_pids(dir_);
    workers_.clear();
  }

  // The agents' pids (D/agent-*.pid): the workers' parents. Not pids_[0..2]: `up`'s supervisor is a pid
  // file too, and its child is the coordinator.
  std::vector<pid_t> agent_pids() const {
    std::vector<pid_t> out;
    for (const fs::directory_entry& e : fs::directory_iterator(dir_)) {
      const std::string name = e.path().filename().string();
      if (name.rfind("agent-", 0) == 0 && e.path().extension() == ".pid")
        out.push_back(static_cast<pid_t>(std::stol(slurp(e.path().string()))));
    }
    return out;
  }

  json get(const std::string& path) {
    Result<json> r = api_->get_json(path);
    EXPECT_TRUE(r.ok()) << r.error();
    return r.ok() ? r.value() : json::object();
  }

  // Each step's loss, by step (the records as they stand: a recovered run's steps past its checkpoint
  // are the ones trained again).
  std::map<int64_t, double> losses(int64_t id) {
    std::map<int64_t, double> out;
    const json page = get("/v1/runs/" + std::to_string(id) + "/steps?after=-1&limit=100000");
    for (const json& step : page["steps"]) out[step["step"].get<int64_t>()] = step["loss"].get<double>();
    return out;
  }
  json run_state(int64_t id) { return get("/v1/runs/" + std::to_string(id)); }
  int64_t last_step(int64_t id) { return run_state(id).value("last_step", int64_t{-1}); }

  // Set by a test before it submits: every tiny_config() of the test is testing_support::small_model()'s
  // cheaper shape (engine_process.h), for tests whose runs are compared only with each other.
  bool small_model_ = false;

  std::string tiny_config(int64_t max_steps) {
    // tiny.toml as it is, but one thread a rank and no periodic validation or checkpoints: four ranks share
    // two cores, and the checkpoints under test are the operator's.
    std::string t = slurp(GANTRY_TINY_CONFIG);
    t = std::regex_replace(t, std::regex("max_steps = \\d+"), "max_steps = " + std::to_string(max_steps));
    t = std::regex_replace(t, std::regex("checkpoint_every = \\d+"), "checkpoint_every = 0");
    t = std::regex_replace(t, std::regex("val_every = \\d+"), "val_every = 0");
    t = std::regex_replace(t, std::regex("\\[train\\]"), "[train]\nthreads = 1");
    return small_model_ ? testing_support::small_model(t) : t;
  }

  // POST /v1/runs: tiny_config(max_steps) with each of `train`'s settings (its line's number replaced, or the
  // line added to [train] when tiny.toml has none), at `layout`, with `extra`'s fields (max_restarts, ...);
  // the run's id, or -1 (and a failure) when the coordinator refused it.
  int64_t submit_tiny(int64_t max_steps, const std::map<std::string, int64_t>& train, const json& layout,
                      const json& extra = json::object()) {
    std::string config = tiny_config(max_steps);
    for (const auto& [key, value] : train) {
      const std::string line = key + " = " + std::to_string(value);
      const std::regex has("(^|\n)" + key + " = \\d+");
      config = std::regex_search(config, has)
                   ? std::regex_replace(config, has, "$1" + line)
                   : std::regex_replace(config, std::regex("\\[train\\]"), "[train]\n" + line);
    }
    json body = {{"config", config}, {"layout", layout}};
    body.update(extra);
    Result<json> sub = api_->post_json("/v1/runs", body);
    EXPECT_TRUE(sub.ok()) << sub.error();
    return sub.ok() ? sub->at("id").get<int64_t>() : -1;
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
          for (const json& e : events(id, kind))
            step_of_rank[e.value("rank", -1)] = e.value("step", int64_t{-1});
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

}  // namespace gantry::cluster_testing
