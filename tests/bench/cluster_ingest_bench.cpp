// cluster_ingest_bench: how many records per second the coordinator takes in from its agents' heartbeats,
// over real HTTP on loopback (engine/cluster/coordinator.h: each beat is one request; its records go to the
// database writer's queue, engine/cluster/ingest_writer.h, which commits many beats per transaction).
//
//   cluster_ingest_bench [--agents 64,256] [--ranks-per-node 8] [--steps-per-beat 4] [--seconds 4]
//
// For each agent count: a fresh coordinator in a temporary folder, that many simulated agents registered
// (one node of --ranks-per-node slots each) and one run placed over all their slots. Each agent is a
// thread with its own kept-alive HTTP client posting heartbeats back to back (no 200 ms pause: this is
// the ceiling, not the load of a real cluster), each beat carrying its node's rank-step records for
// --steps-per-beat steps, and node 0's beats the step records too. Records are built before the clock
// starts, encoded as the agent encodes them (agent_beat.h: binary records); on a 2-core machine the clients
// still take CPU from the coordinator, so the figure is a lower bound. The first second is warm-up; records/s
// counts the beats answered 200 after it, over the time from the start of counting until the writer's queue
// has drained (gantry_ingest_queued_records reaches 0 in /metrics; a coordinator without that gauge writes
// before it answers), so records accepted but not yet written never count; `refused` counts beats answered
// 503 (the writer behind: the agent would send them again), #wrong any other failure. One JSON line per agent
// count.
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
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "engine/cluster/agent_beat.h"
#include "engine/cluster/coordinator.h"
#include "engine/cluster/http_client.h"
#include "engine/cluster/token.h"

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using Clock = std::chrono::steady_clock;
using namespace gantry;

std::vector<int> parse_list(const char* s) {
  std::vector<int> out;
  std::stringstream in(s);
  for (std::string item; std::getline(in, item, ',');) out.push_back(std::atoi(item.c_str()));
  return out;
}

struct Totals {
  double seconds = 0;
  uint64_t records = 0, beats = 0, wrong = 0, refused = 0;
  double p50_ms = 0, p99_ms = 0;
  double drain_ms = 0;                  // after the clients stopped, until the writer's queue was empty
  double records_per_transaction = -1;  // from /metrics; -1 = the coordinator does not say
};

// A sample's value from a Prometheus text body; -1 when absent.
double metric(const std::string& body, const std::string& name) {
  const size_t at = body.find("\n" + name + " ");
  return at == std::string::npos ? -1 : std::atof(body.c_str() + at + name.size() + 2);
}

// The tiny config with a global batch that `dp` ranks can split (the coordinator refuses a dp that does not
// divide it): one micro-batch of 8 sequences per rank. Nothing trains here; the run only has to be placed.
std::string config_for_dp(std::string toml, int dp) {
  const std::string key = "global_batch = ";
  const size_t at = toml.find(key);
  if (at != std::string::npos) {
    const size_t end = toml.find('\n', at);
    toml.replace(at, end - at, key + std::to_string(dp * 8));
  }
  return toml;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int> agent_counts = {64, 256};
  int per_node = 8, steps_per_beat = 4;
  double seconds = 4;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--agents"))
      agent_counts = parse_list(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--ranks-per-node"))
      per_node = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--steps-per-beat"))
      steps_per_beat = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--seconds"))
      seconds = std::atof(argv[i + 1]);
    else {
      std::fprintf(stderr,
                   "cluster_ingest_bench: unknown option %s (known: --agents, --ranks-per-node, "
                   "--steps-per-beat, --seconds)\n",
                   argv[i]);
      return 2;
    }
  }
  std::ifstream cfg_in(GANTRY_TINY_CONFIG);
  std::stringstream cfg;
  cfg << cfg_in.rdbuf();
  std::printf(
      "cluster_ingest_bench: loopback HTTP, %d ranks per node, %d steps per beat, %.1f s per point, %u "
      "CPUs\n",
      per_node, steps_per_beat, seconds, std::thread::hardware_concurrency());

  for (int agents : agent_counts) {
    const fs::path dir = fs::temp_directory_path() /
                         ("gantry_ingest_bench_" + std::to_string(::getpid()) + "_" + std::to_string(agents));
    fs::remove_all(dir);
    Result<std::string> token = token_generate();
    if (!token.ok()) return std::fprintf(stderr, "cluster_ingest_bench: %s\n", token.error().c_str()), 1;
    Coordinator c({.dir = dir.string(), .token = token.value(), .node_timeout = std::chrono::seconds(600)});
    if (Status s = c.start(); !s.ok())
      return std::fprintf(stderr, "cluster_ingest_bench: %s\n", s.message().c_str()), 1;
    HttpClient api({.url = c.url(), .token = token.value()});
    for (int a = 0; a < agents; ++a) {
      Result<json> r = api.post_json(
          "/v1/agents", {{"node", "sim-" + std::to_string(a)}, {"slots", per_node}, {"pid", a + 1}});
      if (!r.ok()) return std::fprintf(stderr, "cluster_ingest_bench: register: %s\n", r.error().c_str()), 1;
    }
    Result<json> run = api.post_json("/v1/runs", {{"config", config_for_dp(cfg.str(), agents * per_node)},
                                                  {"layout", {{"dp", agents * per_node}}}});
    if (!run.ok()) return std::fprintf(stderr, "cluster_ingest_bench: submit: %s\n", run.error().c_str()), 1;
    const int64_t run_id = run->at("id").get<int64_t>();
    // Which node holds which ranks: the placement's answer.
    std::vector<std::pair<std::string, int>> share;  // node, first rank
    for (const json& s : run->at("placement"))
      share.push_back({s.at("node").get<std::string>(), s.at("first_rank").get<int>()});

    std::atomic<bool> go{false}, counting{false}, done{false};
    std::mutex mu;
    Totals res;
    std::vector<double> lat_ms;
    std::vector<std::thread> threads;
    for (size_t a = 0; a < share.size(); ++a) {
      threads.emplace_back([&, a] {
        // Records built before the clock: a batch per beat, steps advancing beat by beat.
        const int beats_prebuilt = 64;
        std::vector<std::string> bodies;  // agent_beat.h's form, as the agent sends it
        for (int b = 0; b < beats_prebuilt; ++b) {
          RecordBatch batch;
          for (int k = 0; k < steps_per_beat; ++k) {
            const int64_t step = 1 + static_cast<int64_t>(b) * steps_per_beat + k;
            for (int r = 0; r < per_node; ++r) {
              batch.rank_steps.push_back({.run_id = run_id,
                                          .step = step,
                                          .rank = share[a].second + r,
                                          .host = share[a].first,
                                          .total_s = 0.1 + 1e-4 * r,
                                          .tokens = 4096});
            }
            if (a == 0)
              batch.steps.push_back({.run_id = run_id,
                                     .step = step,
                                     .time_unix_s = 1.7e9 + static_cast<double>(step),
                                     .loss = 3.0});
          }
          bodies.push_back(agent_beat_encode({{"ended", json::array()}}, batch).value());
        }
        HttpClient client({.url = c.url(), .token = token.value()});
        const std::string path = "/v1/agents/" + share[a].first + "/heartbeat";
        std::vector<double> mine;
        uint64_t records = 0, beats = 0, wrong = 0, refused = 0;
        const uint64_t per_beat =
            static_cast<uint64_t>(per_node * steps_per_beat + (a == 0 ? steps_per_beat : 0));
        while (!go.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
        for (size_t b = 0; !done.load(); ++b) {
          const std::string& body = bodies[b % bodies.size()];
          const auto t0 = Clock::now();
          Result<HttpReply> r = client.post_bytes(path, body, kAgentBeatMediaType);
          const double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
          if (!counting.load() || done.load()) continue;
          if (r.ok() && r->status == 503) {
            ++refused;
            continue;
          }
          if (!r.ok() || r->status != 200) {
            ++wrong;
            continue;
          }
          records += per_beat;
          ++beats;
          mine.push_back(ms);
        }
        std::lock_guard<std::mutex> lock(mu);
        res.records += records;
        res.beats += beats;
        res.wrong += wrong;
        res.refused += refused;
        lat_ms.insert(lat_ms.end(), mine.begin(), mine.end());
      });
    }
    go.store(true);
    std::this_thread::sleep_for(std::chrono::seconds(1));  // warm-up
    counting.store(true);
    const auto t0 = Clock::now();
    std::this_thread::sleep_for(std::chrono::milliseconds(static_cast<int64_t>(seconds * 1e3)));
    done.store(true);
    // Accepted is not written: the window ends when the writer has caught up (the beats still in flight
    // at the stop are not counted but are waited for: the figure errs low). Polled before the clients are
    // joined, so that waiting for 256 threads' last replies does not count.
    const auto t_stop = Clock::now();
    bool queue = false;  // the coordinator has a writer queue to wait for
    HttpClient probe({.url = c.url(), .token = token.value()});
    for (;;) {
      Result<HttpReply> m = probe.get("/metrics");
      if (!m.ok()) break;
      const double queued = metric(m->body, "gantry_ingest_queued_records");
      queue = queue || queued >= 0;
      if (queued <= 0) {
        const double tx = metric(m->body, "gantry_ingest_transactions_total");
        const double written = metric(m->body, "gantry_ingest_written_records_total");
        if (tx > 0 && written > 0) res.records_per_transaction = written / tx;
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    res.drain_ms = queue ? std::chrono::duration<double, std::milli>(Clock::now() - t_stop).count() : 0;
    res.seconds = std::chrono::duration<double>(t_stop - t0).count() + res.drain_ms / 1e3;
    for (std::thread& t : threads) t.join();
    std::sort(lat_ms.begin(), lat_ms.end());
    if (!lat_ms.empty()) {
      res.p50_ms = lat_ms[lat_ms.size() / 2];
      res.p99_ms = lat_ms[std::min(lat_ms.size() - 1, lat_ms.size() * 99 / 100)];
    }
    std::printf(
        "{\"bench\":\"coordinator_ingest\",\"agents\":%d,\"ranks_per_node\":%d,\"steps_per_beat\":%d,"
        "\"seconds\":%.2f,"
        "\"beats\":%llu,\"records\":%llu,\"records_per_s\":%.0f,\"beats_per_s\":%.0f,\"beat_ms_p50\":%.2f,"
        "\"beat_ms_p99\":%.2f,\"drain_ms\":%.1f,\"records_per_transaction\":%.1f,\"refused\":%llu,\"wrong\":%"
        "llu,"
        "\"device\":\"cpu\"}\n",
        agents, per_node, steps_per_beat, res.seconds, static_cast<unsigned long long>(res.beats),
        static_cast<unsigned long long>(res.records), static_cast<double>(res.records) / res.seconds,
        static_cast<double>(res.beats) / res.seconds, res.p50_ms, res.p99_ms, res.drain_ms,
        res.records_per_transaction, static_cast<unsigned long long>(res.refused),
        static_cast<unsigned long long>(res.wrong));
    std::fflush(stdout);
    std::error_code ec;
    fs::remove_all(dir, ec);
  }
  return 0;
}
