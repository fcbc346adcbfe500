#include "engine/cluster/agent.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <filesystem>
#include <fstream>
#include <list>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>
#include <tuple>

#include "engine/cluster/agent_beat.h"
#include "engine/cluster/agent_memory.h"
#include "engine/cluster/device_sampler.h"
#include "engine/cluster/http_client.h"
#include "engine/cluster/http_server.h"
#include "engine/cluster/http_status.h"  // http_reason_phrase: the refusal as post_json words it
#include "engine/cluster/node_health.h"
#include "engine/core/worker/gang.h"
#include "telemetry/clock.h"
#include "telemetry/host.h"
#include "telemetry/prometheus.h"

namespace gantry {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

// Per-rank series past this many go unlabelled (prometheus.h): a node holds few ranks, but --slots allows
// thousands.
constexpr size_t kMaxRankSeries = 64;

// One beat carries at most this many records (about 100 KB in the binary codec, far under the
// coordinator's 1 MiB request limit), so a backlog after an outage drains over several beats instead of being
// refused whole forever.
constexpr size_t kMaxRecordsPerBeat = 1024;
// Records held while the coordinator cannot be reached: past this, the oldest rank-step records go (and
// are counted) so that a long outage cannot take the node's memory.
constexpr size_t kMaxPendingRecords = 262144;
// Device samples held while the coordinator is away (an hour of a node with 8 GPUs at one round a second
// is ~230k): past this the oldest go.
constexpr size_t kMaxPendingDeviceSamples = 65536;

// Moves up to `max` of the oldest records of each kind off the front of `from`, checkpoints and events
// first (few, and they carry the actions' outcomes), then step records, then rank-step records.
RecordBatch take_records(RecordBatch& from, size_t max) {
  RecordBatch out;
  auto take = [&max](auto& src, auto& dst) {
    const size_t n = std::min(max, src.size());
    dst.assign(std::make_move_iterator(src.begin()),
               std::make_move_iterator(src.begin() + static_cast<ptrdiff_t>(n)));
    src.erase(src.begin(), src.begin() + static_cast<ptrdiff_t>(n));
    max -= n;
  };
  take(from.checkpoints, out.checkpoints);
  take(from.events, out.events);
  take(from.steps, out.steps);
  take(from.rank_steps, out.rank_steps);
  take(from.device_samples, out.device_samples);
  return out;
}

// Appends `from`'s records after `to`'s, kind by kind.
void append_records(RecordBatch& to, RecordBatch&& from) {
  auto add = [](auto& dst, auto& src) {
    dst.insert(dst.end(), std::make_move_iterator(src.begin()), std::make_move_iterator(src.end()));
  };
  add(to.checkpoints, from.checkpoints);
  add(to.events, from.events);
  add(to.steps, from.steps);
  add(to.rank_steps, from.rank_steps);
  add(to.device_samples, from.device_samples);
}

json collective_json(const CollectiveRecord& c) {
  return {{"seq", c.seq},
          {"op", c.op},
          {"bytes", c.bytes},
          {"entered_unix_ms", c.entered_unix_ms},
          {"left_unix_ms", c.left_unix_ms},  // 0: still inside
          {"ok", c.ok}};
}

// What a hung gang's culprit and its node's peers were doing, from their newest heartbeats: the run's
// `hang` event carries it (the culprit's flight recorder whole; each peer's step, phase and collective).
json hang_report_json(const GangResult& r) {
  json report = {{"rank", r.failed_rank},
                 {"detected_by", r.hang_by_timeout ? "hang_timeout" : "collective_timeout"},
                 {"error", r.error}};
  if (r.hang_by_timeout) {
    report["silent_ms"] = r.hang_silent_ms;
    report["process_state"] = r.hang_process_state == 0 ? "" : std::string(1, r.hang_process_state);
  }
  json peers = json::array();
  for (const GangWorker& w : r.workers) {
    const WorkerHeartbeat& h = w.heartbeat;
    json where = {{"rank", w.rank},
                  {"pid", w.pid},
                  {"heartbeat", w.has_heartbeat},
                  {"step", h.step},
                  {"phase", train_phase_name(h.phase)},
                  {"collective", h.collectives},
                  {"in_collective", h.in_collective}};
    if (w.rank != r.failed_rank) {
      peers.push_back(std::move(where));
      continue;
    }
    report.update(where);
    json fr = json::array();
    for (const CollectiveRecord& c : h.recent) fr.push_back(collective_json(c));
    report["flight_recorder"] = std::move(fr);
    if (!h.recent.empty() && h.recent.back().seq == h.collectives)
      report["last_collective"] = collective_json(h.recent.back());
  }
  report["node_peers"] = std::move(peers);
  return report;
}

// One heartbeat (agent_beat.h: the control part as JSON, the records in the binary codec) and the
// coordinator's JSON reply; a non-2xx answer is an error naming the status and the coordinator's message.
// *http is the reply's status (0 when none came).
Result<json> send_beat(HttpClient& client, const std::string& path, const json& control,
                       const RecordBatch& batch, int* http) {
  *http = 0;
  Result<std::string> body = agent_beat_encode(control, batch);
  if (!body.ok()) return body.status();
  Result<HttpReply> r = client.post_bytes(path, body.value(), kAgentBeatMediaType);
  if (!r.ok()) return r.status();
  *http = r->status;
  if (!r->ok())
    return Status::error("POST " + path + ": " + std::to_string(r->status) + ": " + r->error_message());
  return r->json();
}

}  // namespace

struct Agent::Impl {
  // One run's share on this node: a gang on a thread of its own (gang_run blocks until the gang is gone).
  struct Share {
    int64_t run = 0;
    int generation = 0;  // which placement of the run this is: echoed when the gang ends
    int first_rank = 0;
    int ranks = 0;
    json slots = json::array();  // the devices the coordinator gave it: told again on re-registration
    std::atomic<bool> stop{false};
    std::atomic<bool> kill{false};
    GangCommands commands;
    std::thread thread;
    std::atomic<bool> done{false};
    GangResult result;
  };

  explicit Impl(AgentOptions o)
      : opt(std::move(o)),
        health({.disk_path = opt.dir,
                .min_free_disk_bytes = gib_bytes(opt.min_free_disk_gb),
                .kmsg_path = opt.kmsg_path,
                .nvml_library = opt.nvml_library}) {}

  static uint64_t gib_bytes(double gib) { return static_cast<uint64_t>(gib * 1024.0 * 1024.0 * 1024.0); }

  AgentOptions opt;
  NodeHealth health;                                // the heartbeat thread's
  HealthState health_told = HealthState::kUnknown;  // logged on each change
  std::string threshold_file_told;                  // the override file's last text, logged on each change

  // The node's health for this beat (node_health.h), the threshold from <dir>/min_free_disk_gb if there.
  json check_health() {
    std::ifstream in(fs::path(opt.dir) / "min_free_disk_gb");
    std::string text;
    if (in) std::getline(in, text);
    double gib = opt.min_free_disk_gb;
    if (!text.empty()) {
      char* end = nullptr;
      const double v = std::strtod(text.c_str(), &end);
      const bool good = end != text.c_str() && std::isfinite(v) && v >= 0 && v < 1e12;
      if (good) gib = v;
      if (text != threshold_file_told) {
        log(good ? "free-disk threshold " + text + " GiB from " + opt.dir + "/min_free_disk_gb"
                 : "ignored " + opt.dir + "/min_free_disk_gb: \"" + text +
                       "\" is not a number of GiB (0 or more); the threshold stays " +
                       std::to_string(opt.min_free_disk_gb));
      }
    }
    threshold_file_told = text;
    health.set_min_free_disk_bytes(gib_bytes(gib));
    const HealthReport r = health.check();
    if (r.state != health_told) {
      log("health " + std::string(health_state_name(r.state)) + (r.reason.empty() ? "" : ": " + r.reason));
      health_told = r.state;
    }
    return health_report_json(r);
  }

  AgentMemory* memory = nullptr;  // the runs' in-memory copies (Agent::run's, living as long as it)
  std::mutex mu;                  // pending, latest
  RecordBatch pending;            // records since the last beat, this node's batch
  // The latest step record of each local rank, by run, for /metrics; a run's entry goes when its gang ends.
  std::map<int64_t, std::map<int, RankStepRecord>> latest;
  // The agent's own counters, for /metrics.
  std::atomic<uint64_t> records_dropped{0};  // past kMaxPendingRecords during an outage
  uint64_t dropped_told = 0;                 // of those, told to a coordinator at registration
  std::atomic<uint64_t> workers_started{0}, frames_received{0}, records_relayed{0}, heartbeats_sent{0},
      heartbeats_failed{0}, records_replayed{0};
  std::list<Share> shares;  // touched by the heartbeat thread only (besides each share's own thread)
  // Batches the coordinator took but has not yet said are written (its reply's `ticket` and `written`,
  // IngestWriter's tickets), oldest first; and records a coordinator may or may not have (a beat without an
  // answer, or taken by one that went away before writing them), sent again first, as a replay that the
  // coordinator de-duplicates. Both: the heartbeat thread only.
  std::deque<std::pair<uint64_t, RecordBatch>> unwritten;
  RecordBatch replay;
  // Wakes the heartbeat loop before its interval is up: a gang that ended is told at once, whatever the
  // interval (which grows with the cluster, coordinator.h).
  std::mutex wake_mu;
  std::condition_variable wake_cv;
  bool wake = false;

  void wake_beat() {
    {
      std::lock_guard<std::mutex> lock(wake_mu);
      wake = true;
    }
    wake_cv.notify_one();
  }

  // Sleeps until `until`, or until wake_beat(), or until `stop` is set (by a signal handler, which cannot
  // notify: looked at every 200 ms).
  void sleep_until(Clock::time_point until, const std::atomic<bool>* stop) {
    std::unique_lock<std::mutex> lock(wake_mu);
    while (!wake && Clock::now() < until && !(stop != nullptr && stop->load())) {
      wake_cv.wait_until(lock, std::min(until, Clock::now() + std::chrono::milliseconds(200)));
    }
    wake = false;
  }

  void log(const std::string& line) {
    std::fprintf(stderr, "gantry-engine agent %s: %s\n", opt.node.c_str(), line.c_str());
  }

  void start_share(const json& a) {
    Share& s = shares.emplace_back();
    s.run = a.at("run").get<int64_t>();
    s.first_rank = a.at("first_rank").get<int>();
    s.generation = a.value("generation", 0);
    s.ranks = a.at("ranks").get<int>();
    s.slots = a.value("slots", json::array());
    const fs::path run_dir = fs::path(opt.dir) / ("run-" + std::to_string(s.run));
    std::error_code ec;
    fs::create_directories(run_dir, ec);
    const std::string config = (run_dir / "config.toml").string();
    std::ofstream(config) << a.at("config").get<std::string>();
    GangOptions g;
    g.nproc = a.at("ranks").get<int>();
    g.first_rank = s.first_rank;
    g.world = a.at("world").get<int>();
    g.exe = opt.exe;
    g.args = {"worker", "--config", config, "--out", a.at("out_dir").get<std::string>(), "--zero",
              std::to_string(a.at("zero").get<int>()),
              // The run's model-parallel degrees (1 from a coordinator that sends none): the ranks derive
              // their (dp, pp, tp) coordinates from RANK and these, as ParallelDims orders them.
              "--tp", std::to_string(a.value("tp", 1)), "--pp", std::to_string(a.value("pp", 1)),
              "--max-steps", std::to_string(a.at("max_steps").get<int64_t>())};
    // A run placed again (a quarantine's move, resume-from) starts from the checkpoint the coordinator
    // chose inside the run's folder; the ranks reshard it to this layout.
    std::string resume = a.value("resume", "");
    // A recovery from the in-memory copies: the set assembled here from the agents holding it; one that
    // cannot be (a holder gone since) falls back to the disk checkpoint the coordinator gave beside it.
    if (const json* mem = a.contains("memory_restore") ? &a.at("memory_restore") : nullptr; mem && memory) {
      Result<std::string> dir = memory->assemble(s.run, *mem);
      if (dir.ok()) {
        resume = dir.value();
      } else {
        const std::string why = "the in-memory copies at step " +
                                std::to_string(mem->value("step", int64_t{-1})) + " could not be fetched (" +
                                dir.error() + "): restoring from " +
                                (resume.empty() ? std::string("the start") : resume) + " instead";
        log("run " + std::to_string(s.run) + ": " + why);
        std::lock_guard<std::mutex> lock(mu);
        pending.events.push_back(
            {.run_id = s.run,
             .time_unix_s = unix_now_s(),
             .step = -1,
             .kind = "restore_fallback",
             .node = opt.node,
             .message = why,
             .payload =
                 json({{"source", resume.empty() ? "start" : "disk"}, {"checkpoint", resume}}).dump()});
      }
    }
    // Virtual stages only where there are some: a worker without interleaved 1F1B has no --vp flag, and the
    // coordinator refuses vp > 1 until the engine's pipeline_check takes it.
    if (const int vp = a.value("vp", 1); vp > 1) {
      g.args.push_back("--vp");
      g.args.push_back(std::to_string(vp));
    }
    if (!resume.empty()) {
      g.args.push_back("--resume");
      g.args.push_back(resume);
    }
    // A run the coordinator rolled back past streaks of skipped steps: their batches, [[first, count], ...].
    if (const json* skip = a.contains("skip_batches") ? &a.at("skip_batches") : nullptr;
        skip && !skip->empty()) {
      std::string text;
      for (const json& b : *skip)
        text += (text.empty() ? "" : ",") + std::to_string(b.at(0).get<uint64_t>()) + ":" +
                std::to_string(b.at(1).get<uint64_t>());
      g.args.push_back("--skip-batches");
      g.args.push_back(text);
    }
    g.env = {{"GANTRY_RENDEZVOUS", a.at("rendezvous").get<std::string>()}};
    if (memory != nullptr) g.env.push_back({"GANTRY_MEMORY_DIR", memory->run_dir(s.run)});
    if (a.value("backend", "cpu") == "cuda") {
      for (int slot : a.at("slots")) g.cuda_devices.push_back(std::to_string(slot));
    }
    g.stop = &s.stop;
    // The run's hang timeout (submit's hang_timeout_s): this node's launcher watches its own ranks' beats.
    g.hang_timeout = std::chrono::milliseconds(a.value("hang_timeout_ms", int64_t{0}));
    g.kill_now = &s.kill;
    g.stop_grace = opt.stop_grace;
    g.commands = &s.commands;
    const int64_t run = s.run;
    g.on_records = [this, run](int, const RecordBatch& b) {
      frames_received.fetch_add(1);
      std::lock_guard<std::mutex> lock(mu);
      for (RankStepRecord r : b.rank_steps) {
        r.run_id = run;
        RankStepRecord& last = latest[run][r.rank];
        if (r.step >= last.step) last = r;
        pending.rank_steps.push_back(std::move(r));
      }
      for (StepRecord r : b.steps) {
        r.run_id = run;
        pending.steps.push_back(r);
      }
      for (EventRecord e : b.events) {
        e.run_id = run;
        pending.events.push_back(std::move(e));
      }
      for (CheckpointRecord c : b.checkpoints) {  // as the worker made it: only its run is the agent's word
        c.run_id = run;
        pending.checkpoints.push_back(std::move(c));
      }
      if (pending.size() > kMaxPendingRecords && !pending.rank_steps.empty()) {
        const size_t drop = std::min(pending.size() - kMaxPendingRecords, pending.rank_steps.size());
        pending.rank_steps.erase(pending.rank_steps.begin(),
                                 pending.rank_steps.begin() + static_cast<ptrdiff_t>(drop));
        records_dropped.fetch_add(drop);
      }
    };
    log("run " + std::to_string(run) + ": starting ranks " + std::to_string(g.first_rank) + ".." +
        std::to_string(g.first_rank + g.nproc - 1) + " of " + std::to_string(g.world));
    workers_started.fetch_add(static_cast<uint64_t>(g.nproc));
    s.thread = std::thread([this, &s, g = std::move(g)] {
      s.result = gang_run(g);
      s.done.store(true);
      wake_beat();
    });
  }

  // The node's exposition. Every local rank of every run here is one of this node's ranks, so the rank
  // labels are bounded by its slots (and by kMaxRankSeries besides). The shared per-rank gauges
  // (prometheus_write_rank_steps) carry no run label, so they describe the newest run with records; the
  // step and tokens gauges carry the run and cover every run on the node.
  HttpResponse metrics() {
    PrometheusWriter w;
    std::vector<RankStepRecord> all, newest;
    size_t runs = 0;
    {
      std::lock_guard<std::mutex> lock(mu);
      runs = latest.size();
      for (const auto& [run, ranks] : latest)
        for (const auto& [rank, r] : ranks) all.push_back(r);
      if (!latest.empty())
        for (const auto& [rank, r] : latest.rbegin()->second) newest.push_back(r);
    }
    const auto counter = [&](std::string_view name, std::string_view help, uint64_t v) {
      w.family(name, MetricType::counter, help);
      w.sample({}, static_cast<double>(v));
    };
    counter("gantry_agent_workers_started_total", "Worker processes this agent started.",
            workers_started.load());
    counter("gantry_agent_worker_frames_total", "Record frames received from this node's workers.",
            frames_received.load());
    counter("gantry_agent_records_relayed_total", "Records delivered to the coordinator in heartbeats.",
            records_relayed.load());
    counter("gantry_agent_heartbeats_total", "Heartbeats sent to the coordinator (answered or not).",
            heartbeats_sent.load());
    counter("gantry_agent_records_dropped_total",
            "Rank-step records dropped while the coordinator could not be reached (the oldest first).",
            records_dropped.load());
    counter("gantry_agent_heartbeat_failures_total", "Heartbeats the coordinator did not answer.",
            heartbeats_failed.load());
    counter("gantry_agent_records_replayed_total",
            "Records sent again after an outage (the coordinator may have had them; it drops repeats).",
            records_replayed.load());
    w.family("gantry_agent_runs", MetricType::gauge, "Runs with ranks reporting on this node.");
    w.sample({}, static_cast<double>(runs));

    std::vector<double> seconds(all.size());
    for (size_t i = 0; i < all.size(); ++i) seconds[i] = all[i].total_s;
    std::vector<size_t> chosen = prometheus_bounded_ranks(seconds, kMaxRankSeries);
    std::sort(chosen.begin(), chosen.end(), [&](size_t a, size_t b) {
      return std::tie(all[a].run_id, all[a].rank) < std::tie(all[b].run_id, all[b].rank);
    });
    if (!chosen.empty()) {
      std::vector<std::string> run_text, rank_text;
      for (size_t i : chosen) {
        run_text.push_back(std::to_string(all[i].run_id));
        rank_text.push_back(std::to_string(all[i].rank));
      }
      w.family("gantry_rank_step", MetricType::gauge,
               "Optimizer steps done by this rank (its latest step record).");
      for (size_t k = 0; k < chosen.size(); ++k)
        w.sample({{"run", run_text[k]}, {"rank", rank_text[k]}, {"host", all[chosen[k]].host}},
                 static_cast<double>(all[chosen[k]].step));
      w.family("gantry_rank_step_tokens", MetricType::gauge,
               "Tokens this rank processed in its latest step.");
      for (size_t k = 0; k < chosen.size(); ++k)
        w.sample({{"run", run_text[k]}, {"rank", rank_text[k]}, {"host", all[chosen[k]].host}},
                 static_cast<double>(all[chosen[k]].tokens));
    }
    prometheus_write_rank_steps(w, newest, kMaxRankSeries);
    if (!w.ok()) return HttpResponse::error(500, "metrics: " + w.error());
    return HttpResponse::plain(w.text(), std::string(kPrometheusContentType));
  }

  Share* find(int64_t run) {
    for (Share& s : shares)
      if (s.run == run && !s.done.load()) return &s;
    return nullptr;
  }
};

Agent::Agent(AgentOptions options) : impl_(std::make_unique<Impl>(std::move(options))) {}
Agent::~Agent() = default;

Status Agent::run(const std::atomic<bool>* stop) {
  Impl& m = *impl_;
  // Before anything is made: the name is part of paths here too (the memory folder under /dev/shm), and
  // "x/../../y" made folders outside it before the coordinator refused the name.
  if (Status s = agent_node_name_check(m.opt.node); !s.ok()) return Status::error("--node: " + s.message());
  HttpClient api({.url = m.opt.url, .token = m.opt.token, .ca_file = m.opt.ca_file});
  std::error_code ec;
  fs::create_directories(m.opt.dir, ec);
  if (ec) return Status::error("cannot create the agent's folder " + m.opt.dir + ": " + ec.message());

  // Before the server that serves it, so that it outlives the server's threads.
  AgentMemory memory(m.opt.memory_dir, m.opt.node, m.opt.dir, m.opt.token);
  m.memory = &memory;
  // /metrics first: a port that cannot be bound is a bad option, reported before the node registers.
  HttpServer metrics({.host = m.opt.metrics_host,
                      .port = m.opt.metrics_port,
                      .token = m.opt.token,
                      .threads = 4,
                      .max_event_streams = 0,
                      .keep_alive_timeout = std::chrono::seconds(2)});
  metrics.get("/metrics", [&m](const HttpRequest&) { return m.metrics(); });
  // The other agents take this node's in-memory copies here (a ring peer's, a recovery's assembly).
  metrics.get("/v1/memory/{run}/{rank}/{step}/{file}",
              [&memory](const HttpRequest& r) { return memory.serve(r); });
  if (Status s = metrics.start(); !s.ok()) return Status::error("cannot serve /metrics: " + s.message());
  {
    // Written whole and renamed, so a reader never sees half a URL.
    const fs::path file = fs::path(m.opt.dir) / "metrics_url";
    const fs::path tmp = fs::path(m.opt.dir) / "metrics_url.tmp";
    std::ofstream(tmp) << metrics.url() << "/metrics\n";
    fs::rename(tmp, file, ec);
    if (ec) m.log("cannot write " + file.string() + ": " + ec.message());
  }
  m.log("serving " + metrics.url() + "/metrics");

  const std::string host = host_name();
  json ended = json::array();  // gangs that ended, until a coordinator has heard so
  // Registering again (a restarted coordinator knows no credential of ours) reports the gangs this node
  // runs, and those that ended unheard, so that it re-adopts them; and the records dropped meanwhile.
  // `lost_in_ms`, when given, is set from a 409 that says the name is held by an agent the coordinator has
  // not found silent yet: how long until it would (0 otherwise).
  auto register_node = [&](bool again, int64_t* lost_in_ms = nullptr) -> Result<json> {
    json body = {{"node", m.opt.node}, {"slots", m.opt.slots}, {"pid", ::getpid()},
                 {"host", host},       {"spare", m.opt.spare}, {"metrics_url", metrics.url() + "/metrics"}};
    if (again) {
      json gangs = json::array();
      for (const Impl::Share& s : m.shares) {
        gangs.push_back({{"run", s.run},
                         {"generation", s.generation},
                         {"first_rank", s.first_rank},
                         {"ranks", s.ranks},
                         {"slots", s.slots}});
      }
      for (const json& e : ended) gangs.push_back(e);
      body["gangs"] = gangs;
      body["records_dropped"] = m.records_dropped.load() - m.dropped_told;
    }
    Result<HttpReply> reply = api.post("/v1/agents", body);
    if (!reply.ok()) return reply.status();
    if (!reply->ok()) {
      if (Result<json> j = reply->json(); lost_in_ms != nullptr && reply->status == 409 && j.ok() &&
                                          j->is_object() && j->contains("lost_in_ms") &&
                                          j->at("lost_in_ms").is_number_integer()) {
        *lost_in_ms = j->at("lost_in_ms").get<int64_t>();
      }
      return Status::error("POST /v1/agents: " + std::to_string(reply->status) + " " +
                           http_reason_phrase(reply->status) + ": " + reply->error_message());
    }
    Result<json> r = reply->json();
    if (r.ok() && again) m.dropped_told = m.records_dropped.load();
    return r;
  };
  int64_t lost_in_ms = 0;
  Result<json> reg = register_node(false, &lost_in_ms);
  // This agent restarted quicker than the node timeout (killed, crashed, `systemctl restart`): its
  // predecessor still holds the name until the coordinator finds it silent, and the restart used to fail
  // with that 409. Waited out once; a holder that beat meanwhile is a live agent of that name, and the
  // second 409 stands.
  if (!reg.ok() && lost_in_ms > 0 && lost_in_ms <= 3600 * 1000) {
    m.log(reg.error() + ": waiting " + std::to_string(lost_in_ms) +
          " ms for the coordinator to find that agent silent, then registering again");
    m.sleep_until(Clock::now() + std::chrono::milliseconds(lost_in_ms + 500), stop);
    if (stop != nullptr && stop->load()) return Status::error("stopped while waiting to register");
    reg = register_node(false);
  }
  if (!reg.ok()) return Status::error("cannot register with the coordinator: " + reg.error());
  // The coordinator's interval, from every reply (it grows with the cluster); bounded so that a bad value
  // can neither make the agent spin nor look dead.
  auto interval_of = [](const json& reply, std::chrono::milliseconds current) {
    const json* ms = reply.contains("heartbeat_ms") ? &reply.at("heartbeat_ms") : nullptr;
    if (ms == nullptr || !ms->is_number_integer()) return current;
    return std::chrono::milliseconds(std::clamp<int64_t>(ms->get<int64_t>(), 10, 600000));
  };
  auto beat = interval_of(reg.value(), std::chrono::milliseconds(200));
  // Heartbeats carry the node's own credential from the reply (a coordinator without one takes our token).
  auto beats_client = [&](const json& r) {
    const std::string credential = r.value("credential", "");
    return std::make_unique<HttpClient>(HttpClientOptions{
        .url = m.opt.url, .token = credential.empty() ? m.opt.token : credential, .ca_file = m.opt.ca_file});
  };
  std::unique_ptr<HttpClient> beats = beats_client(reg.value());
  m.log("registered " + std::to_string(m.opt.slots) + " slots with " + m.opt.url);

  // Device telemetry (device_sampler.h): sampled on its own interval, sent with the records in the beats.
  DeviceSampler sampler({.host = m.opt.node, .disk_path = m.opt.dir, .nvml_library = m.opt.nvml_library});
  auto next_sample = Clock::now();
  std::string nvml_told;
  auto last_ok = Clock::now();
  Status result;
  bool stopping = false;
  int failures = 0;        // beats unanswered in a row: the retry interval backs off with them
  bool told_lost = false;  // logged once per outage
  for (;;) {
    const auto t0 = Clock::now();
    if (!stopping && stop != nullptr && stop->load()) {
      stopping = true;
      for (Impl::Share& s : m.shares) s.stop.store(true);  // SIGTERM: a checkpoint at the next boundary
    }
    for (auto it = m.shares.begin(); it != m.shares.end();) {
      if (!it->done.load()) {
        ++it;
        continue;
      }
      it->thread.join();
      const GangResult& r = it->result;
      // agent_stopping: the gang ended because this agent was told to stop (`down`, SIGTERM), not by itself.
      ended.push_back({{"run", it->run},
                       {"generation", it->generation},
                       {"first_rank", it->first_rank},
                       {"ranks", it->ranks},
                       {"slots", it->slots},
                       {"code", r.code},
                       {"error", r.error},
                       {"final_message", r.final_message},
                       {"failed_rank", r.failed_rank},
                       {"cause_rank", r.failed_cause_rank},
                       {"agent_stopping", stopping}});
      if (r.hang) ended.back()["hang"] = hang_report_json(r);
      m.log("run " + std::to_string(it->run) + ": gang ended with code " + std::to_string(r.code) +
            (r.error.empty() ? "" : ": " + r.error));
      const int64_t ended_run = it->run;
      it = m.shares.erase(it);
      if (m.find(ended_run) == nullptr) {
        std::lock_guard<std::mutex> lock(m.mu);
        m.latest.erase(ended_run);  // its ranks are no longer this node's
      }
    }
    if (m.opt.device_sample_interval.count() > 0 && t0 >= next_sample) {
      std::vector<DeviceSampleRecord> samples;
      sampler.sample(unix_now_s(), &samples);
      if (sampler.nvml_status() != nvml_told) {
        nvml_told = sampler.nvml_status();
        m.log("device telemetry: GPUs: " + nvml_told);
      }
      std::lock_guard<std::mutex> lock(m.mu);
      auto& held = m.pending.device_samples;
      held.insert(held.end(), std::make_move_iterator(samples.begin()),
                  std::make_move_iterator(samples.end()));
      // Bounded like the rank steps while the coordinator is away: the oldest samples go first.
      if (held.size() > kMaxPendingDeviceSamples)
        held.erase(held.begin(),
                   held.begin() + static_cast<ptrdiff_t>(held.size() - kMaxPendingDeviceSamples));
      next_sample = t0 + m.opt.device_sample_interval;
    }
    RecordBatch batch;
    const bool replaying = !m.replay.empty();
    if (replaying) {
      batch = take_records(m.replay, kMaxRecordsPerBeat);
    } else {
      std::lock_guard<std::mutex> lock(m.mu);
      batch = take_records(m.pending, kMaxRecordsPerBeat);
    }
    json control = {{"ended", ended}, {"health", m.check_health()}, {"memory", memory.held()}};
    if (replaying) {
      control["replay"] = true;
      m.records_replayed.fetch_add(batch.size());
    }
    int http = 0;
    Result<json> reply = send_beat(*beats, "/v1/agents/" + m.opt.node + "/heartbeat", control, batch, &http);
    m.heartbeats_sent.fetch_add(1);
    if (reply.ok()) {
      m.records_relayed.fetch_add(batch.size());
      // Kept until written (a coordinator without tickets: taken is written).
      if (!batch.empty() && reply->contains("ticket"))
        m.unwritten.emplace_back(reply->value("ticket", uint64_t{0}), std::move(batch));
      const uint64_t written = reply->value("written", UINT64_MAX);
      while (!m.unwritten.empty() && m.unwritten.front().first <= written) m.unwritten.pop_front();
      last_ok = Clock::now();
      if (failures > 0) m.log("the coordinator answers again after " + std::to_string(failures) + " beats");
      failures = 0;
      told_lost = false;
      ended = json::array();
      beat = interval_of(reply.value(), beat);
      for (const json& a : reply->value("start", json::array())) {
        if (stopping) continue;
        try {
          m.start_share(a);
        } catch (const json::exception& e) {
          m.log(std::string("ignored a malformed assignment: ") + e.what());
        }
      }
      for (const json& c : reply->value("commands", json::array())) {
        Impl::Share* s = m.find(c.value("run", int64_t{-1}));
        if (s == nullptr) continue;  // the run ended here meanwhile
        s->commands.send(c.value("rank", 0), {.action = static_cast<TrainAction>(c.value("action", 0)),
                                              .id = c.value("request", uint64_t{0}),
                                              .from = c.value("from", "")});
      }
      // Fault injection (the coordinator sends it only when started with it allowed): a signal for one
      // rank of a share of the current generation.
      for (const json& f : reply->value("inject", json::array())) {
        Impl::Share* s = m.find(f.value("run", int64_t{-1}));
        if (s == nullptr || s->generation != f.value("generation", -1)) continue;
        if (const std::string kind = f.value("fault", ""); kind == "slow" || kind == "nan") {
          s->commands.inject(f.value("rank", -1),
                             {.kind = kind == "slow" ? WorkerInject::Kind::kSlow : WorkerInject::Kind::kNan,
                              .delay_ms = f.value("ms", 0u)});
          continue;
        }
        const int sig = f.value("signal", 0);
        if (sig == SIGKILL || sig == SIGSTOP) s->commands.signal(f.value("rank", -1), sig);
      }
      // The ring's copies to take from a peer, and the copies of runs that are over.
      for (const json& p : reply->value("memory_pull", json::array())) {
        Status ps;
        try {
          ps = memory.pull(p);
        } catch (const json::exception& e) {
          ps = Status::error(std::string("a malformed memory_pull: ") + e.what());
        }
        if (!ps.ok()) m.log("cannot take an in-memory copy: " + ps.message());
      }
      for (const json& r : reply->value("memory_drop", json::array()))
        if (r.is_number_integer()) memory.drop(r.get<int64_t>());
      for (const json& r : reply->value("stop", json::array())) {
        if (Impl::Share* s = m.find(r.get<int64_t>())) s->stop.store(true);
      }
    } else {
      m.heartbeats_failed.fetch_add(1);
      if (http == 503) {
        // Refused whole (the writer behind): nothing of it was taken; it goes back where it came from.
        if (replaying) {
          append_records(batch, std::move(m.replay));
          std::swap(batch, m.replay);
        } else {
          std::lock_guard<std::mutex> lock(m.mu);
          append_records(batch, std::move(m.pending));
          std::swap(batch, m.pending);
        }
      } else {
        // No answer: the coordinator may have taken this beat, and may die before writing what it took
        // (or has). All of it is sent again, oldest first, as a replay: a short outage loses nothing and
        // repeats nothing.
        RecordBatch again;
        for (auto& [ticket, b] : m.unwritten) append_records(again, std::move(b));
        m.unwritten.clear();
        append_records(again, std::move(batch));
        append_records(again, std::move(m.replay));
        m.replay = std::move(again);
      }
      ++failures;
      // The coordinator is gone (killed, restarting): the gangs go on training and their records wait
      // here (bounded: kMaxPendingRecords); the beats go on, less often, until one is answered.
      if (!told_lost && Clock::now() - last_ok > m.opt.coordinator_timeout) {
        m.log(
            "no coordinator for " +
            std::to_string(std::chrono::duration_cast<std::chrono::seconds>(Clock::now() - last_ok).count()) +
            " s (" + reply.error() + "): this node's gangs keep training; their records wait here");
        told_lost = true;
      }
      // Refused as a stranger: a coordinator started since (on the same folder) knows neither this node nor
      // its credential. Registering again hands it the gangs to re-adopt.
      if (http == 401 || http == 404) {
        Result<json> again = register_node(true);
        if (again.ok()) {
          beats = beats_client(again.value());
          beat = interval_of(again.value(), beat);
          failures = 0;
          m.log("registered again with " + m.opt.url + ", reporting " + std::to_string(m.shares.size()) +
                " running gangs and " + std::to_string(ended.size()) + " ended ones");
          continue;  // its records go at once
        }
        m.log("cannot register again: " + again.error());
      }
    }
    // Stopping: once every gang has ended and the coordinator has heard so (or cannot), leave.
    if (stopping && m.shares.empty() && (ended.empty() || !reply.ok())) break;
    // Unanswered beats back off (twice the wait each time, up to 2 s or the interval if longer), so a
    // restarted coordinator is found within about 2 s without being hammered meanwhile.
    auto wait = beat;
    if (failures > 0) {
      wait = std::min(std::max(beat, std::chrono::milliseconds(2000)),
                      beat * (int64_t{1} << std::min(failures, 6)));
    }
    m.sleep_until(t0 + wait, stopping ? nullptr : stop);
  }
  metrics.stop();
  return result;
}

}  // namespace gantry
