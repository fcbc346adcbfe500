#include "engine/cluster/coordinator.h"

#include <algorithm>
#include <cmath>
#include <filesystem>

#include "engine/cluster/agent_beat.h"        // kAgentBeatMediaType: the heartbeat's binary body
#include "engine/cluster/coordinator_impl.h"  // the parts: runs, nodes, ingest, views
#include "engine/cluster/token.h"             // token_check, token_equal: the agents' token

namespace gantry {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

}  // namespace

// Names: a run's (shown in every list and event) and a node's. Printable ASCII, bounded, so that neither a
// listing nor an event message can be made huge or control a terminal.
Status Coordinator::Impl::check_name(std::string_view field, const std::string& name, size_t max) {
  const bool printable = std::all_of(name.begin(), name.end(), [](char c) { return c >= 0x20 && c < 0x7f; });
  if (name.empty() || name.size() > max || !printable) {
    return Status::error(
        "field \"" + std::string(field) + "\": expected 1-" + std::to_string(max) +
        " printable ASCII characters, got " +
        (name.empty() ? std::string("an empty name") : std::to_string(name.size()) + " bytes") +
        (printable ? "" : " with control or non-ASCII characters"));
  }
  return Status();
}

Coordinator::Coordinator(CoordinatorOptions options) : impl_(std::make_unique<Impl>(std::move(options))) {}
Coordinator::~Coordinator() {
  stop();
}

Status Coordinator::start() {
  Impl& m = *impl_;
  if (!(m.opt.max_beats_per_s > 0) || !std::isfinite(m.opt.max_beats_per_s)) {
    return Status::error("max_beats_per_s must be a positive number of heartbeats a second, not " +
                         std::to_string(m.opt.max_beats_per_s));
  }
  if (!m.opt.agent_token.empty()) {
    if (Status s = token_check(m.opt.agent_token); !s.ok())
      return Status::error("the agents' token: " + s.message());
    if (token_equal(m.opt.agent_token, m.opt.token)) {
      return Status::error(
          "the agents' token is the operator's: give agents a token of their own (gantry-engine up writes "
          "one)");
    }
  }
  std::error_code ec;
  fs::create_directories(fs::path(m.opt.dir) / "runs", ec);
  if (ec) return Status::error("cannot create the coordinator's folder " + m.opt.dir + ": " + ec.message());
  std::string error;
  m.db = HistoryDb::open((fs::path(m.opt.dir) / "cluster.sqlite").string(), {}, &error);
  if (!m.db) return Status::error("cannot open the run database: " + error);
  m.writer = std::make_unique<IngestWriter>(m.db.get(), &m.db_mu, IngestWriterOptions{}, [&m] {
    // A stream that misses this (it was between its read and its wait) reads again within 250 ms.
    std::lock_guard<std::mutex> lock(m.events_mu);
    m.events_cv.notify_all();
  });
  if (Status st = m.restore_runs(); !st.ok()) return st;
  if (Status st = m.alerts_load(); !st.ok()) return st;
  m.server = std::make_unique<HttpServer>(HttpServerOptions{
      .host = m.opt.host,
      .port = m.opt.port,
      .token = m.opt.token,
      .max_body_bytes = m.opt.max_body_bytes,
      // heartbeats never wait behind the public API
      .private_lane_prefix = "/v1/agents",
      .tls_cert_file = m.opt.tls_cert_file,
      .tls_key_file = m.opt.tls_key_file,
      .also_accept = [&m](const std::string& method, const std::string& path, std::string_view token) {
        return m.agent_may(method, path, token);
      }});
  HttpServer& s = *m.server;
  s.get("/v1/cluster", [&m](const HttpRequest&) { return m.cluster(); });
  s.get("/v1/runs", [&m](const HttpRequest&) { return m.runs_list(); });
  s.post("/v1/runs", [&m](const HttpRequest& req) { return m.submit(req); });
  s.get("/v1/runs/{id}", [&m](const HttpRequest& req) { return m.run_detail(req); });
  s.get("/v1/runs/{id}/steps", [&m](const HttpRequest& req) { return m.steps(req); },
        {"after", "buckets", "limit", "metric", "ranks"});
  s.get("/v1/runs/{id}/heatmap", [&m](const HttpRequest& req) { return m.heatmap(req); },
        {"step_begin", "step_end", "buckets", "rank_buckets", "metric"});
  s.get("/v1/runs/{id}/ranks", [&m](const HttpRequest& req) { return m.ranks(req); });
  s.get("/v1/runs/{id}/checkpoints", [&m](const HttpRequest& req) { return m.checkpoints(req); });
  s.get("/v1/runs/{id}/events", [&m](const HttpRequest& req) { return m.events(req); });
  s.get("/v1/runs/{id}/goodput", [&m](const HttpRequest& req) { return m.goodput(req); });
  for (TrainAction a :
       {TrainAction::checkpoint, TrainAction::pause, TrainAction::resume, TrainAction::stop}) {
    s.post(std::string("/v1/runs/{id}/") + train_action_name(a),
           [&m, a](const HttpRequest& req) { return m.action(req, a); });
  }
  s.post("/v1/runs/{id}/resume-from", [&m](const HttpRequest& req) { return m.resume_from(req); });
  s.post("/v1/runs/{id}/inject", [&m](const HttpRequest& req) { return m.inject(req); });
  s.post("/v1/runs/{id}/straggler", [&m](const HttpRequest& req) { return m.straggler_policy(req); });
  s.post("/v1/nodes/{id}/quarantine", [&m](const HttpRequest& req) { return m.quarantine(req); });
  s.post("/v1/nodes/{id}/release", [&m](const HttpRequest& req) { return m.release(req); });
  s.del("/v1/nodes/{id}", [&m](const HttpRequest& req) { return m.forget(req); });
  s.get("/metrics", [&m](const HttpRequest&) { return m.metrics(); });
  s.get("/v1/devices", [&m](const HttpRequest& req) { return m.devices(req); },
        {"metric", "time_begin", "time_end", "buckets"});
  s.get("/v1/alerts", [&m](const HttpRequest&) { return m.alerts_list(); });
  s.post("/v1/alerts", [&m](const HttpRequest& req) { return m.alerts_add(req); });
  s.del("/v1/alerts/{name}", [&m](const HttpRequest& req) { return m.alerts_delete(req); });
  s.post("/v1/agents", [&m](const HttpRequest& req) { return m.agent_register(req); });
  s.post_bytes("/v1/agents/{node}/heartbeat", kAgentBeatMediaType,
               [&m](const HttpRequest& req) { return m.agent_heartbeat(req); });
  if (Status st = s.start(); !st.ok()) return st;
  m.watch = std::thread([&m] { m.watch_loop(); });
  m.alert_thread = std::thread([&m] { m.alert_loop(); });
  return Status();
}

void Coordinator::stop() {
  Impl& m = *impl_;
  if (m.server) m.server->stop();
  if (m.writer && !m.stopping.load()) m.interrupt_live_runs();
  m.stopping.store(true);
  if (m.watch.joinable()) m.watch.join();
  if (m.alert_thread.joinable()) m.alert_thread.join();
  if (m.alert_hooks) m.alert_hooks->stop();  // a hook still running is killed; its event is written below
  if (m.writer) m.writer->stop();            // what was accepted is written before the database closes
}

std::string Coordinator::url() const {
  return impl_->server ? impl_->server->url() : "";
}

}  // namespace gantry
