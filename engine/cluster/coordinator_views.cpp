// The API's views (coordinator_impl.h): the JSON replies of the reads (cluster, runs, steps, ranks,
// checkpoints, events) and the coordinator's /metrics.
#include <charconv>  // from_chars: Last-Event-ID
#include <cmath>
#include <cstdio>
#include <sstream>

#include "engine/cluster/coordinator_impl.h"
#include "engine/core/config.h"                  // config_parse: the run's model and batch in its API object
#include "engine/core/parallel/parallel_dims.h"  // each rank's (dp, pp, tp) coordinate
#include "telemetry/prometheus.h"
#include "telemetry/record_json.h"

namespace gantry {
namespace {

using json = nlohmann::json;
using namespace std::chrono_literals;

// A record as the API shows it: record_json.h's serializers.
template <class R>
json record_json(const R& r) {
  return json(r);
}

// "0,2,5" or "all" -> ranks; an error names the bad entry.
Result<std::vector<int32_t>> parse_ranks(const std::string& text, int world) {
  std::vector<int32_t> out;
  if (text == "all") {
    for (int r = 0; r < world; ++r) out.push_back(r);
    return out;
  }
  std::stringstream in(text);
  for (std::string item; std::getline(in, item, ',');) {
    char* end = nullptr;
    long v = std::strtol(item.c_str(), &end, 10);
    if (item.empty() || *end != '\0' || v < 0 || v >= world) {
      return Status::error(
          "ranks: \"" + item +
          "\" is not a rank of this run (expected \"all\" or a list such as 0,1,3 of ranks 0.." +
          std::to_string(world - 1) + ")");
    }
    out.push_back(static_cast<int32_t>(v));
  }
  return out;
}

Result<int64_t> parse_int_query(const HttpRequest& req, const char* key, int64_t min, int64_t max,
                                int64_t fallback) {
  std::optional<std::string> v = req.query_value(key);
  if (!v) return fallback;
  char* end = nullptr;
  long long x = std::strtoll(v->c_str(), &end, 10);
  if (v->empty() || *end != '\0' || x < min || x > max) {
    return Status::error(std::string(key) + "=\"" + *v + "\": expected an integer in [" +
                         std::to_string(min) + ", " + std::to_string(max) + "]");
  }
  return static_cast<int64_t>(x);
}

// The rank metric of the bucketed steps form ("metric=busy"): the step time or one of its parts, all kept in
// the tile pyramid. Busy (compute: data wait, forward, backward, optimizer) is the default: in synchronous
// data parallelism every rank's total is the same, the fast ranks waiting in their collectives.
constexpr std::pair<const char*, RankMetric> kStepsRankMetrics[] = {
    {"busy", RankMetric::busy},
    {"total", RankMetric::total},
    {"data_wait", RankMetric::data_wait},
    {"forward", RankMetric::forward},
    {"backward", RankMetric::backward},
    {"optimizer", RankMetric::optimizer},
    {"comm_exposed", RankMetric::comm_exposed},
    {"checkpoint_stall", RankMetric::checkpoint_stall},
};

Result<std::pair<std::string, RankMetric>> parse_rank_metric_query(const HttpRequest& req) {
  const std::optional<std::string> v = req.query_value("metric");
  if (!v) return std::pair<std::string, RankMetric>("busy", RankMetric::busy);
  std::string allowed;
  for (const auto& [name, m] : kStepsRankMetrics) {
    if (*v == name) return std::pair<std::string, RankMetric>(name, m);
    allowed += std::string(allowed.empty() ? "" : ", ") + name;
  }
  return Status::error("metric=\"" + v->substr(0, 64) + "\": expected one of " + allowed);
}

// A float cell as the API writes it: null for "no record" (never 0), else the float's value with its own
// 7 significant digits (a float widened to double would print 17: 0.5199999809265137 for 0.52).
json cell_json(float v) {
  if (std::isnan(v)) return nullptr;
  char text[32];
  std::snprintf(text, sizeof text, "%.7g", static_cast<double>(v));
  return std::strtod(text, nullptr);
}

}  // namespace

json Coordinator::Impl::node_json(const Node& n) const {
  int used = 0;
  json run_ids = json::array();
  for (const auto& [rid, r] : runs) {
    if (run_state_terminal(r.state)) continue;
    for (const NodeShare& s : r.shares) {
      if (s.node == n.id && !s.done) {
        used += static_cast<int>(s.slots.size());
        run_ids.push_back(rid);
      }
    }
  }
  return {{"id", n.id},
          {"slots", n.slots},
          {"busy_slots", used},
          {"state", node_state_name(n.state)},
          {"last_seen_unix_s", n.last_seen_unix},
          {"pid", n.pid},
          {"host", n.host},
          {"runs", run_ids},
          {"metrics_url", n.metrics_url},
          {"health", n.health}};
}

json Coordinator::Impl::run_json(const Run& r, bool full) const {
  json shares = json::array();
  for (const NodeShare& s : r.shares) {
    shares.push_back({{"node", s.node},
                      {"first_rank", s.first_rank},
                      {"ranks", s.ranks},
                      {"slots", s.slots},
                      {"done", s.done},
                      {"code", s.code}});
  }
  json j = {{"id", r.id},
            {"name", r.name},
            {"state", run_state_name(r.state)},
            {"layout", {{"dp", r.dp}, {"tp", r.tp}, {"pp", r.pp}, {"vp", r.vp}, {"zero", r.zero}}},
            {"world", r.world()},
            {"last_step", r.last_step},
            {"max_steps", r.max_steps},
            {"message", r.message},
            {"created_unix_s", r.created_unix},
            {"generation", r.generation},
            {"restarts", r.restarts},
            {"max_restarts", r.max_restarts},
            {"damaged_checkpoints", r.damaged_checkpoints},
            {"min_dp", r.min_dp_or_1()},
            {"max_dp", r.max_dp > 0 ? json(r.max_dp) : json(nullptr)},
            {"hang_timeout_s", r.hang_timeout_s},
            {"peak_name", r.peak_name},
            {"peak_flops", r.peak_flops},
            {"flops_per_token", r.flops_per_token},
            {"mfu_formula", r.mfu_formula},
            {"placement", shares},
            {"straggler", straggler_watch_options_json(r.straggler.options())},
            {"checkpoint_policy",
             {{"checkpoint_every_steps", r.checkpoint_policy.options().every_steps},
              {"policy", checkpoint_policy_mode_name(r.checkpoint_policy.options().mode)},
              {"keep_last", r.checkpoint_policy.options().keep_last}}}};
  {
    // The in-memory copies the agents hold (memory_copies.h), newest step first: which nodes hold each rank.
    json copies = json::array();
    for (const MemoryCopySet& m : memory_copies.all(r.id)) {
      json ranks = json::array();
      for (const auto& [rank, held_on] : m.holders) ranks.push_back({{"rank", rank}, {"nodes", held_on}});
      copies.push_back({{"step", m.step},
                        {"world", m.world},
                        {"complete", static_cast<int>(m.holders.size()) == m.world},
                        {"ranks", ranks}});
    }
    j["memory_copies"] = std::move(copies);
  }
  if (full) {
    j["config"] = r.config_toml;
    // The config as the engine reads it, so a client (the console's what-if panel) needs no TOML parser of
    // its own: the model's dimensions and the batch.
    if (Result<Config> cfg = config_parse(r.config_toml, "config"); cfg.ok()) {
      j["backend"] = cfg->train.backend;
      j["pp_schedule"] =
          cfg->train.pp_schedule;  // what a move to a pipeline runs (What-if's Apply checks it)
      j["model"] = {{"n_layer", cfg->model.n_layer},
                    {"n_head", cfg->model.n_head},
                    {"n_embd", cfg->model.n_embd},
                    {"vocab_size", cfg->model.vocab_size},
                    {"seq_len", cfg->model.seq_len}};
      j["batch"] = {{"global_batch", cfg->train.global_batch}, {"micro_batch", cfg->train.micro_batch}};
    }
    j["out_dir"] = r.out_dir;
    if (r.last_step >= 0) j["latest_step"] = record_json(r.latest_step);
  }
  return j;
}

Coordinator::Impl::Run* Coordinator::Impl::find_run(const HttpRequest& req, HttpResponse* err) {
  const std::string& text = req.param("id");
  char* end = nullptr;
  long long id = std::strtoll(text.c_str(), &end, 10);
  auto it = *end == '\0' ? runs.find(id) : runs.end();
  if (it == runs.end()) {
    *err = HttpResponse::error(404, "no run " + text + " (GET /v1/runs lists them)");
    return nullptr;
  }
  return &it->second;
}

HttpResponse Coordinator::Impl::cluster() {
  std::lock_guard<std::mutex> lock(mu);
  json ns = json::array();
  int slots = 0, busy = 0;
  for (const auto& [id, n] : nodes) {
    json j = node_json(n);
    slots += n.slots;
    busy += j["busy_slots"].get<int>();
    ns.push_back(std::move(j));
  }
  int live = 0;
  for (const auto& [id, r] : runs) live += !run_state_terminal(r.state);
  return HttpResponse::ok({{"nodes", ns},
                           {"slots", slots},
                           {"busy_slots", busy},
                           {"runs_live", live},
                           {"runs", runs.size()},
                           {"heartbeat_ms", beat_interval().count()},
                           {"node_timeout_ms", node_timeout().count()},
                           {"url", server->url()}});
}

Coordinator::Impl::RunKey Coordinator::Impl::run_key(const HttpRequest& req, HttpResponse* err) {
  std::lock_guard<std::mutex> lock(mu);
  Run* r = find_run(req, err);
  return r == nullptr ? RunKey{} : RunKey{r->id, r->world()};
}

std::unique_lock<std::mutex> Coordinator::Impl::read_lock() {
  writer->flush();
  return std::unique_lock<std::mutex>(db_mu);
}

HttpResponse Coordinator::Impl::runs_list() {
  std::lock_guard<std::mutex> lock(mu);
  json out = json::array();
  for (const auto& [id, r] : runs) out.push_back(run_json(r, false));
  return HttpResponse::ok({{"runs", out}});
}

HttpResponse Coordinator::Impl::run_detail(const HttpRequest& req) {
  json j;
  {
    std::lock_guard<std::mutex> lock(mu);
    HttpResponse err;
    Run* r = find_run(req, &err);
    if (r == nullptr) return err;
    j = run_json(*r, true);
  }
  // ETTR from the goodput ledger (coordinator_goodput.cpp), read without mu; null when not known.
  Result<json> g = goodput_json(j["id"].get<int64_t>());
  j["ettr"] = g.ok() ? g->at("ettr") : json(nullptr);
  return HttpResponse::ok(j);
}

HttpResponse Coordinator::Impl::steps(const HttpRequest& req) {
  HttpResponse err;
  const RunKey key = run_key(req, &err);
  if (key.id < 0) return err;
  const RunKey* r = &key;
  Result<int64_t> after = parse_int_query(req, "after", -1, kStepEnd - 1, 0);
  Result<int64_t> buckets = parse_int_query(req, "buckets", 1, 100000, 0);
  Result<int64_t> limit = parse_int_query(req, "limit", 1, 100000, 1000);
  Result<std::pair<std::string, RankMetric>> metric = parse_rank_metric_query(req);
  for (const auto* x : {&after, &buckets, &limit})
    if (!x->ok()) return HttpResponse::error(400, x->error());
  if (!metric.ok()) return HttpResponse::error(400, metric.error());
  std::vector<int32_t> ranks;
  const std::optional<std::string> ranks_text = req.query_value("ranks");
  if (ranks_text) {
    Result<std::vector<int32_t>> rk = parse_ranks(*ranks_text, r->world);
    if (!rk.ok()) return HttpResponse::error(400, rk.error());
    ranks = rk.value();
  }
  const int64_t begin = after.value() + 1;  // steps after `after`
  json out = {{"run", r->id}, {"after", after.value()}};
  std::unique_lock<std::mutex> db_lock = read_lock();
  if (buckets.value() > 0) {
    BandResult loss, band;
    if (!db->query_step_band(r->id, StepMetric::loss, begin, kStepEnd, static_cast<int32_t>(buckets.value()),
                             &loss) ||
        !db->query_band({.run_id = r->id,
                         .metric = metric->second,
                         .step_begin = begin,
                         .ranks = ranks,
                         .max_buckets = static_cast<int32_t>(buckets.value())},
                        &band)) {
      return HttpResponse::error(500, "cannot read the run's steps: " + db->error());
    }
    auto buckets_json = [](const BandResult& b) {
      json a = json::array();
      for (const Bucket& k : b.buckets) {
        a.push_back({{"step_begin", k.step_begin},
                     {"step_end", k.step_end},
                     {"count", k.count},
                     {"min", k.min},
                     {"max", k.max},
                     {"max_rank", k.max_rank},
                     {"mean", k.mean},
                     {"last", k.last}});
      }
      return a;
    };
    out["bucket_steps"] = loss.bucket_steps;
    out["loss"] = buckets_json(loss);
    out["metric"] = metric->first;
    out["rank_seconds"] = buckets_json(band);  // the metric over the ranks: min, max and its rank, mean
    return HttpResponse::ok(out);
  }
  std::vector<StepRecord> st;
  if (!db->read_steps(r->id, begin, kStepEnd, static_cast<size_t>(limit.value()), &st))
    return HttpResponse::error(500, "cannot read the run's steps: " + db->error());
  out["steps"] = json::array();
  for (const StepRecord& s : st) out["steps"].push_back(record_json(s));
  if (ranks_text) {
    std::vector<RankStepRecord> rs;
    if (!db->read_rank_steps(r->id, begin, kStepEnd, ranks, static_cast<size_t>(limit.value()), &rs))
      return HttpResponse::error(500, "cannot read the run's rank steps: " + db->error());
    out["rank_steps"] = json::array();
    for (const RankStepRecord& s : rs) out["rank_steps"].push_back(record_json(s));
  }
  return HttpResponse::ok(out);
}

HttpResponse Coordinator::Impl::heatmap(const HttpRequest& req) {
  HttpResponse err;
  const RunKey key = run_key(req, &err);
  if (key.id < 0) return err;
  Result<int64_t> step_begin = parse_int_query(req, "step_begin", 0, kStepEnd - 1, 0);
  Result<int64_t> step_end = parse_int_query(req, "step_end", 1, kStepEnd, kStepEnd);
  Result<int64_t> buckets = parse_int_query(req, "buckets", 1, 100000, 1000);
  Result<int64_t> rank_buckets =
      parse_int_query(req, "rank_buckets", 1, static_cast<int64_t>(kMaxSeriesRanks), 256);
  Result<std::pair<std::string, RankMetric>> metric = parse_rank_metric_query(req);
  for (const auto* x : {&step_begin, &step_end, &buckets, &rank_buckets})
    if (!x->ok()) return HttpResponse::error(400, x->error());
  if (!metric.ok()) return HttpResponse::error(400, metric.error());
  if (step_end.value() <= step_begin.value()) {
    return HttpResponse::error(400,
                               "step_end=" + std::to_string(step_end.value()) +
                                   ": expected more than step_begin=" + std::to_string(step_begin.value()));
  }
  // Rows are at most the world, columns at most `buckets`: refuse a matrix too big before reading it.
  if (static_cast<size_t>(buckets.value()) *
          static_cast<size_t>(std::min<int64_t>(rank_buckets.value(), key.world)) >
      kMaxHeatmapCells) {
    return HttpResponse::error(400, "buckets=" + std::to_string(buckets.value()) +
                                        " × rank_buckets=" + std::to_string(rank_buckets.value()) +
                                        " is over the " + std::to_string(kMaxHeatmapCells) +
                                        " cells a heatmap returns; ask for fewer");
  }
  HeatmapResult h;
  {
    std::unique_lock<std::mutex> db_lock = read_lock();
    if (!db->query_heatmap({.run_id = key.id,
                            .metric = metric->second,
                            .step_begin = step_begin.value(),
                            .step_end = step_end.value(),
                            .max_buckets = static_cast<int32_t>(buckets.value()),
                            .max_rank_rows = static_cast<int32_t>(rank_buckets.value())},
                           &h)) {
      return HttpResponse::error(500, "cannot read the run's heatmap: " + db->error());
    }
  }
  // Flat row-major arrays, [row · cols + col]: one number a cell, null where no rank reported.
  json min = json::array(), max = json::array(), mean = json::array(), max_rank = json::array();
  for (size_t i = 0; i < h.max.size(); ++i) {
    min.push_back(cell_json(h.min[i]));
    max.push_back(cell_json(h.max[i]));
    mean.push_back(cell_json(h.mean[i]));
    max_rank.push_back(h.max_rank[i] < 0 ? json(nullptr) : json(h.max_rank[i]));
  }
  return HttpResponse::ok({{"run", key.id},
                           {"metric", metric->first},
                           {"world", h.world},
                           {"last_step", h.last_step},
                           {"first_step", h.first_step},
                           {"bucket_steps", h.bucket_steps},
                           {"cols", h.cols},
                           {"ranks_per_row", h.ranks_per_row},
                           {"rows", h.rows},
                           {"min", std::move(min)},
                           {"max", std::move(max)},
                           {"max_rank", std::move(max_rank)},
                           {"mean", std::move(mean)}});
}

HttpResponse Coordinator::Impl::ranks(const HttpRequest& req) {
  std::lock_guard<std::mutex> lock(mu);
  HttpResponse err;
  Run* r = find_run(req, &err);
  if (r == nullptr) return err;
  json out = json::array();
  for (const NodeShare& s : r->shares) {
    for (int k = 0; k < s.ranks; ++k) {
      const int rank = s.first_rank + k;
      const RankStepRecord& last = r->latest[static_cast<size_t>(rank)];
      // The rank's coordinate in the layout, as ParallelDims orders ranks (tp innermost, then pp, then dp).
      const ParallelDims d{.world = r->world(), .rank = rank, .dp = r->dp, .tp = r->tp, .pp = r->pp};
      out.push_back({{"rank", rank},
                     {"coord", {{"dp", d.dp_rank()}, {"pp", d.pp_rank()}, {"tp", d.tp_rank()}}},
                     {"node", s.node},
                     {"slot", s.slots[static_cast<size_t>(k)]},
                     {"local_rank", k},
                     {"last_step", last.step},
                     {"host", last.host},
                     {"step_seconds", last.total_s},
                     {"busy_seconds", last.phases.data_wait + last.phases.forward + last.phases.backward +
                                          last.phases.optimizer},
                     {"latest", record_json(last)},  // phases and sensors: the console's breakdown
                     {"done", s.done},
                     {"straggler", r->straggler.rank_json(rank)}});
    }
  }
  return HttpResponse::ok({{"run", r->id},
                           {"generation", r->generation},
                           {"ranks", out},
                           {"straggler", r->straggler.summary_json()}});
}

HttpResponse Coordinator::Impl::checkpoints(const HttpRequest& req) {
  HttpResponse err;
  const RunKey r = run_key(req, &err);
  if (r.id < 0) return err;
  std::vector<CheckpointInfo> cs;
  {
    std::unique_lock<std::mutex> db_lock = read_lock();
    if (!db->list_checkpoints(r.id, &cs))
      return HttpResponse::error(500, "cannot list checkpoints: " + db->error());
  }
  json out = json::array();
  for (const CheckpointInfo& c : cs) {
    // stall_s and shards are null where the catalog does not know them (entries of older builds).
    out.push_back({{"step", c.step},
                   {"path", c.path},
                   {"bytes", c.bytes},
                   {"write_s", c.write_s},
                   {"stall_s", c.stall_s ? json(*c.stall_s) : json(nullptr)},
                   {"shards", c.shards ? json(*c.shards) : json(nullptr)},
                   {"manifest_xxh64", c.manifest_xxh64},
                   {"state", c.state},
                   {"message", c.message},
                   {"time_unix_s", c.time_unix_s}});
  }
  return HttpResponse::ok({{"run", r.id}, {"checkpoints", out}});
}

HttpResponse Coordinator::Impl::events(const HttpRequest& req) {
  int64_t run_id = 0;
  {
    std::lock_guard<std::mutex> lock(mu);
    HttpResponse err;
    Run* r = find_run(req, &err);
    if (r == nullptr) return err;
    run_id = r->id;
  }
  // Resuming: after the event with this id. Anything but an id this stream sent is refused, never read as
  // far as it parses ("abc" replayed everything, "1e3" resumed after event 1).
  int64_t cursor = 0;
  if (const std::string& id = req.last_event_id; !id.empty()) {
    const auto [end, ec] = std::from_chars(id.data(), id.data() + id.size(), cursor);
    if (ec != std::errc() || end != id.data() + id.size() || cursor < 0) {
      return HttpResponse::error(400, "Last-Event-ID \"" + id.substr(0, 40) +
                                          "\": expected the id of an event this stream sent (an integer >= "
                                          "0), or no Last-Event-ID to start at the first event");
    }
  }
  return HttpResponse::stream([this, run_id, cursor](SseWriter& w) mutable {
    std::vector<EventRow> rows;
    bool ended = false;
    auto read = [&] {
      std::lock_guard<std::mutex> db_lock(db_mu);
      db->read_events(run_id, cursor, 256, &rows);
    };
    read();
    if (rows.empty()) {
      {
        std::lock_guard<std::mutex> lock(mu);
        ended = run_state_terminal(runs[run_id].state);
      }
      if (ended) {
        // Its last events may still be queued: the stream ends only once they are written and sent.
        writer->flush();
        read();
        ended = rows.empty();
      } else {
        std::unique_lock<std::mutex> lock(events_mu);
        events_cv.wait_for(lock, 250ms);
        lock.unlock();
        read();
      }
    }
    for (const EventRow& e : rows) {
      if (!w.send({.id = std::to_string(e.id), .event = e.event.kind, .data = record_to_json(e.event)}))
        return false;
      cursor = e.id;
    }
    // A finished run's stream ends once it has sent everything, so `ctl events` returns.
    return !ended;
  });
}

HttpResponse Coordinator::Impl::metrics() {
  std::lock_guard<std::mutex> lock(mu);
  PrometheusWriter w;
  w.family("gantry_cluster_nodes", MetricType::gauge, "Registered nodes by state.");
  for (NodeState s : {NodeState::healthy, NodeState::quarantined, NodeState::lost, NodeState::spare,
                      NodeState::unhealthy}) {
    int n = 0;
    for (const auto& [id, node] : nodes) n += node.state == s;
    w.sample({{"state", node_state_name(s)}}, n);
  }
  w.family("gantry_cluster_slots", MetricType::gauge, "Device slots on registered nodes.");
  int slots = 0;
  for (const auto& [id, node] : nodes) slots += node.slots;
  w.sample({}, slots);
  w.family("gantry_runs", MetricType::gauge, "Runs by state.");
  for (RunState s : kRunStates) {
    int n = 0;
    for (const auto& [id, r] : runs) n += r.state == s;
    w.sample({{"state", std::string(run_state_name(s))}}, n);
  }
  w.family("gantry_ingest_records_total", MetricType::counter, "Records received from agents.");
  w.sample({}, static_cast<double>(records_total));
  const IngestWriterStats ws = writer->stats();
  w.family("gantry_ingest_queued_records", MetricType::gauge,
           "Agents' records waiting for the database writer.");
  w.sample({}, static_cast<double>(ws.queued_records));
  w.family("gantry_ingest_transactions_total", MetricType::counter,
           "Database transactions of records committed.");
  w.sample({}, static_cast<double>(ws.transactions));
  w.family("gantry_ingest_written_records_total", MetricType::counter,
           "Records written to the run database.");
  w.sample({}, static_cast<double>(ws.records));
  w.family("gantry_ingest_refused_beats_total", MetricType::counter,
           "Heartbeats refused (503) while the writer was behind.");
  w.sample({}, static_cast<double>(ws.refused_batches));
  w.family("gantry_ingest_failed_records_total", MetricType::counter, "Records the database refused.");
  w.sample({}, static_cast<double>(ws.failed_records));
  w.family("gantry_run_step", MetricType::gauge, "Latest optimizer step of each live run.");
  for (const auto& [id, r] : runs)
    if (!run_state_terminal(r.state))
      w.sample({{"run", std::to_string(id)}}, static_cast<double>(r.last_step));
  w.family("gantry_run_loss", MetricType::gauge, "Training loss at the latest step of each live run.");
  for (const auto& [id, r] : runs)
    if (!run_state_terminal(r.state) && r.last_step >= 0)
      w.sample({{"run", std::to_string(id)}}, r.latest_step.loss);
  w.family("gantry_run_stragglers", MetricType::gauge, "Ranks of each live run flagged as stragglers.");
  for (const auto& [id, r] : runs)
    if (!run_state_terminal(r.state)) w.sample({{"run", std::to_string(id)}}, r.straggler.flagged_count());
  devices_metrics(w);
  if (!w.ok()) return HttpResponse::error(500, "metrics: " + w.error());
  return HttpResponse::plain(w.text(), std::string(kPrometheusContentType));
}

}  // namespace gantry
