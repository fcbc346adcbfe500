// cluster_load_bench: the control plane under a hostile and a busy crowd at once, on loopback only, for a
// bounded time. `gantry-engine up` starts a coordinator and two agents of two slots; a dp-4 tiny run
// trains; then, for --seconds:
//   - --idle connections that connect and say nothing, and --slow ones that trickle a request header one
//     byte a second (neither sends a token);
//   - --pollers API clients, each asking for the run's newest steps every --poll-ms;
//   - one probe agent (registered with the agents' join token, as a spare of one slot) heartbeating every
//     200 ms, as a node's agent does: its round trips are the heartbeat latency.
// It reports p50/p99 of the heartbeat and of the steps query, how many authenticated requests failed, whether
// any node was lost and how far the run advanced, as one JSON line, and exits 1 if a node was lost, the
// run stopped advancing or ended, or an authenticated request went unanswered. Everything it started is
// stopped (`down`) before it exits.
//
//   cluster_load_bench [--seconds 20] [--idle 100] [--slow 100] [--pollers 50] [--poll-ms 200] [--engine
//   PATH]
//
// --engine runs another gantry-engine binary (an older build, for a before/after in one sitting).
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "engine/cluster/agent_beat.h"
#include "engine/cluster/http_client.h"
#include "engine/cluster/token.h"

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using Clock = std::chrono::steady_clock;
using namespace gantry;
using namespace std::chrono_literals;

std::string read_all(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

int connect_loopback(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

struct Latencies {
  std::mutex mu;
  std::vector<double> ms;
  uint64_t failed = 0;
  void add(double v) {
    std::lock_guard<std::mutex> lock(mu);
    ms.push_back(v);
  }
  void fail() {
    std::lock_guard<std::mutex> lock(mu);
    ++failed;
  }
  double quantile(double q) {
    std::lock_guard<std::mutex> lock(mu);
    if (ms.empty()) return -1;
    std::vector<double> s = ms;
    std::sort(s.begin(), s.end());
    return s[std::min(s.size() - 1, static_cast<size_t>(q * static_cast<double>(s.size())))];
  }
};

double elapsed_ms(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

int arg_int(int argc, char** argv, const char* name, int fallback) {
  for (int i = 1; i + 1 < argc; ++i)
    if (std::strcmp(argv[i], name) == 0) return std::atoi(argv[i + 1]);
  return fallback;
}

}  // namespace

int main(int argc, char** argv) {
  const int seconds = arg_int(argc, argv, "--seconds", 20);
  const int idle = arg_int(argc, argv, "--idle", 100);
  const int slow = arg_int(argc, argv, "--slow", 100);
  const int pollers = arg_int(argc, argv, "--pollers", 50);
  const int poll_ms = arg_int(argc, argv, "--poll-ms", 200);
  const fs::path dir = fs::temp_directory_path() / ("gantry_load_bench_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  std::string engine = GANTRY_ENGINE_BIN;
  for (int i = 1; i + 1 < argc; ++i)
    if (std::strcmp(argv[i], "--engine") == 0) engine = argv[i + 1];
  const std::string out_file = (dir / "up.out").string();
  if (std::system(
          (engine + " up --nodes 2 --slots 2 --dir " + dir.string() + " >" + out_file + " 2>/dev/null")
              .c_str()) != 0) {
    std::fprintf(stderr, "cluster_load_bench: gantry-engine up failed\n");
    return 1;
  }
  int code = 0;
  {
    std::string url = read_all(out_file);
    url = url.substr(0, url.find('\n'));
    const int port = std::stoi(url.substr(url.rfind(':') + 1));
    const std::string token = token_file_read((dir / "token").string()).value();
    const std::string agent_token = token_file_read((dir / "agent_token").string()).value();
    HttpClient api({.url = url, .token = token});

    std::string config = read_all(GANTRY_TINY_CONFIG);
    config = std::regex_replace(config, std::regex("max_steps = \\d+"), "max_steps = 1000000");
    config = std::regex_replace(config, std::regex("checkpoint_every = \\d+"), "checkpoint_every = 0");
    config = std::regex_replace(config, std::regex("val_every = \\d+"), "val_every = 0");
    config = std::regex_replace(config, std::regex("\\[train\\]"), "[train]\nthreads = 1");
    Result<json> sub = api.post_json("/v1/runs", {{"config", config}, {"layout", {{"dp", 4}}}});
    const int64_t id = sub.ok() ? sub->at("id").get<int64_t>() : -1;
    auto last_step = [&] {
      Result<json> r = api.get_json("/v1/runs/" + std::to_string(id));
      return r.ok() ? r->value("last_step", int64_t{-1}) : int64_t{-1};
    };
    const auto started = Clock::now();
    while (id >= 0 && last_step() < 2 && Clock::now() - started < 60s) std::this_thread::sleep_for(100ms);

    // The probe agent: registered as a spare of one slot, so placement never gives it work.
    HttpClient joiner({.url = url, .token = agent_token});
    Result<json> reg = joiner.post_json("/v1/agents", {{"node", "probe"}, {"slots", 1}, {"spare", true}});
    const std::string credential = reg.ok() ? reg->value("credential", "") : "";
    if (id < 0 || credential.empty()) {
      std::fprintf(stderr, "cluster_load_bench: could not start the run or register the probe: %s %s\n",
                   sub.ok() ? "" : sub.error().c_str(), reg.ok() ? "" : reg.error().c_str());
      code = 1;
    } else {
      const int64_t step_before = last_step();
      std::vector<int> held;
      for (int i = 0; i < idle + slow; ++i) held.push_back(connect_loopback(port));
      std::atomic<bool> done{false};
      Latencies beat, steps;
      std::vector<std::thread> threads;
      threads.reserve(static_cast<size_t>(pollers) + 2);
      threads.emplace_back([&] {  // the slow ones: one more header byte each second
        const std::string header = "GET /v1/cluster HTTP/1.1\r\nHost: 127.0.0.1\r\n";
        for (size_t k = 0; !done.load(); ++k) {
          for (int i = idle; i < idle + slow; ++i)
            if (held[static_cast<size_t>(i)] >= 0)
              ::send(held[static_cast<size_t>(i)], &header[k % header.size()], 1, MSG_NOSIGNAL);
          std::this_thread::sleep_for(1s);
        }
      });
      threads.emplace_back([&] {
        HttpClient agent({.url = url, .token = credential});
        const std::string empty_beat = agent_beat_encode({{"ended", json::array()}}, RecordBatch()).value();
        while (!done.load()) {
          const auto t0 = Clock::now();
          Result<HttpReply> r =
              agent.post_bytes("/v1/agents/probe/heartbeat", empty_beat, kAgentBeatMediaType);
          if (r.ok() && r->status == 200)
            beat.add(elapsed_ms(t0));
          else
            beat.fail();
          std::this_thread::sleep_until(t0 + 200ms);
        }
      });
      for (int p = 0; p < pollers; ++p) {
        threads.emplace_back([&] {
          HttpClient client({.url = url, .token = token});
          while (!done.load()) {
            const auto t0 = Clock::now();
            Result<HttpReply> r = client.get("/v1/runs/" + std::to_string(id) + "/steps?after=0&limit=100");
            if (r.ok() && r->status == 200)
              steps.add(elapsed_ms(t0));
            else
              steps.fail();
            std::this_thread::sleep_until(t0 + std::chrono::milliseconds(poll_ms));
          }
        });
      }
      std::this_thread::sleep_for(std::chrono::seconds(seconds));
      done = true;
      for (std::thread& t : threads) t.join();
      int opened = 0;
      for (int fd : held) opened += fd >= 0, ::close(fd);

      Result<json> cluster = api.get_json("/v1/cluster");
      int lost = 0;
      if (cluster.ok()) {
        for (const json& n : cluster->at("nodes")) lost += n["id"] != "probe" && n["state"] != "healthy";
      }
      Result<json> run = api.get_json("/v1/runs/" + std::to_string(id));
      const std::string state = run.ok() ? run->value("state", "") : "unknown";
      const int64_t advanced = (run.ok() ? run->value("last_step", int64_t{-1}) : -1) - step_before;
      json line = {{"bench", "cluster_load"},
                   {"engine", engine},
                   {"seconds", seconds},
                   {"idle_connections", idle},
                   {"slow_connections", slow},
                   {"connections_opened", opened},
                   {"pollers", pollers},
                   {"poll_ms", poll_ms},
                   {"heartbeat_p50_ms", beat.quantile(0.5)},
                   {"heartbeat_p99_ms", beat.quantile(0.99)},
                   {"heartbeats", beat.ms.size()},
                   {"heartbeats_failed", beat.failed},
                   {"steps_query_p50_ms", steps.quantile(0.5)},
                   {"steps_query_p99_ms", steps.quantile(0.99)},
                   {"steps_queries", steps.ms.size()},
                   {"steps_queries_failed", steps.failed},
                   {"nodes_lost", lost},
                   {"run_state", state},
                   {"run_advanced_steps", advanced}};
      std::printf("%s\n", line.dump().c_str());
      if (lost > 0 || state != "running" || advanced <= 0 || beat.failed > 0 || steps.failed > 0 ||
          !cluster.ok())
        code = 1;
      api.post("/v1/runs/" + std::to_string(id) + "/stop", json::object());
    }
  }
  std::system((engine + " down --dir " + dir.string() + " >/dev/null 2>&1").c_str());
  fs::remove_all(dir);
  return code;
}
