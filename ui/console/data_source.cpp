#include "ui/console/data_source.h"

#include <algorithm>
#include <chrono>
#include <nlohmann/json.hpp>

#include "engine/cluster/api_client.h"
#include "engine/cluster/run_lifecycle.h"
#include "telemetry/clock.h"
#include "telemetry/record_json.h"
#include "ui/console/local_cache.h"

namespace gantry::console {
namespace {

using json = nlohmann::json;

// The API's objects, read leniently: a field a newer or older coordinator lacks keeps its default.
template <class T>
T field(const json& j, const char* key, T fallback) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return fallback;
  try {
    return it->get<T>();
  } catch (const json::exception&) {
    return fallback;
  }
}

NodeView node_from_json(const json& j) {
  NodeView n{.id = field<std::string>(j, "id", ""),
             .state = field<std::string>(j, "state", ""),
             .host = field<std::string>(j, "host", ""),
             .slots = field<int>(j, "slots", 0),
             .busy_slots = field<int>(j, "busy_slots", 0),
             .last_seen_unix_s = field<double>(j, "last_seen_unix_s", 0)};
  if (auto it = j.find("runs"); it != j.end() && it->is_array())
    for (const json& r : *it)
      if (r.is_number_integer()) n.runs.push_back(r.get<int64_t>());
  n.health = "unknown";
  if (auto it = j.find("health"); it != j.end() && it->is_object()) {
    n.health = field<std::string>(*it, "state", "unknown");
    n.health_reason = field<std::string>(*it, "reason", "");
  }
  return n;
}

RunView run_from_json(const json& j) {
  RunView r{.id = field<int64_t>(j, "id", -1),
            .name = field<std::string>(j, "name", ""),
            .state = field<std::string>(j, "state", ""),
            .message = field<std::string>(j, "message", ""),
            .world = field<int>(j, "world", 0),
            .generation = field<int>(j, "generation", 0),
            .last_step = field<int64_t>(j, "last_step", -1),
            .max_steps = field<int64_t>(j, "max_steps", -1),
            .created_unix_s = field<double>(j, "created_unix_s", 0)};
  if (auto it = j.find("layout"); it != j.end() && it->is_object()) {
    r.dp = field<int>(*it, "dp", 0);
    r.zero = field<int>(*it, "zero", 0);
    r.tp = std::max(1, field<int>(*it, "tp", 1));
    r.pp = std::max(1, field<int>(*it, "pp", 1));
    r.layout = it->dump();
  }
  r.peak_name = field<std::string>(j, "peak_name", "");
  r.peak_flops = field<double>(j, "peak_flops", 0);
  r.mfu_formula = field<std::string>(j, "mfu_formula", "");
  if (auto it = j.find("straggler"); it != j.end() && it->is_object()) {
    if (auto e = it->find("enabled"); e != it->end() && e->is_boolean()) r.straggler_scoring = e->get<bool>();
    if (auto q = it->find("quarantine"); q != it->end() && q->is_boolean())
      r.straggler_quarantine = q->get<bool>();
  }
  if (auto it = j.find("memory_copies"); it != j.end() && it->is_array()) r.memory_copies = *it;
  if (r.world == 0) r.world = r.dp;
  if (auto it = j.find("placement"); it != j.end() && it->is_array()) {
    for (const json& s : *it) {
      ShareView v{.node = field<std::string>(s, "node", ""),
                  .first_rank = field<int>(s, "first_rank", 0),
                  .ranks = field<int>(s, "ranks", 0),
                  .done = field<bool>(s, "done", false)};
      v.slots = field<std::vector<int>>(s, "slots", {});
      r.placement.push_back(std::move(v));
    }
  }
  return r;
}

RankView rank_from_json(const json& j) {
  RankStepRecord latest;
  std::string error;
  if (auto it = j.find("latest"); it != j.end() && it->is_object() && !record_read_json(*it, &latest, &error))
    latest = RankStepRecord();
  RankView r{.rank = field<int32_t>(j, "rank", 0),
             .node = field<std::string>(j, "node", ""),
             .host = field<std::string>(j, "host", ""),
             .slot = field<int>(j, "slot", 0),
             .local_rank = field<int>(j, "local_rank", 0),
             .last_step = field<int64_t>(j, "last_step", 0),
             .step_seconds = field<double>(j, "step_seconds", 0),
             .busy_seconds = field<double>(j, "busy_seconds", 0),
             .done = field<bool>(j, "done", false)};
  r.latest = std::move(latest);
  if (auto it = j.find("coord"); it != j.end() && it->is_object())
    r.coord = RankView::Coord{
        .dp = field<int>(*it, "dp", 0), .pp = field<int>(*it, "pp", 0), .tp = field<int>(*it, "tp", 0)};
  // The coordinator's straggler policy, where it has one (null until the rank has been scored).
  if (auto it = j.find("straggler"); it != j.end() && it->is_object()) {
    if (auto v = it->find("relative"); v != it->end() && v->is_number()) r.score = v->get<double>();
    if (auto v = it->find("individual"); v != it->end() && v->is_number()) r.individual = v->get<double>();
    if (auto v = it->find("flagged"); v != it->end() && v->is_boolean()) r.flagged = v->get<bool>();
    r.slow_phase = field<std::string>(*it, "slow_phase", "");
    if (auto v = it->find("excess_s"); v != it->end() && v->is_number()) r.excess_s = v->get<double>();
    r.excess = field<std::string>(*it, "excess", "");
  }
  return r;
}

CheckpointView checkpoint_from_json(const json& j) {
  return {.step = field<int64_t>(j, "step", 0),
          .path = field<std::string>(j, "path", ""),
          .state = field<std::string>(j, "state", ""),
          .bytes = field<uint64_t>(j, "bytes", 0),
          .write_s = field<double>(j, "write_s", 0),
          .time_unix_s = field<double>(j, "time_unix_s", 0),
          .stall_s = j.contains("stall_s") && j.at("stall_s").is_number()
                         ? std::optional<double>(j.at("stall_s").get<double>())
                         : std::nullopt};
}

bool run_ended(const std::string& state) {
  return run_state_terminal(state);
}

}  // namespace

DataSource::DataSource(DataSourceOptions options, std::function<Result<Endpoint>()> endpoint)
    : opt_(std::move(options)), endpoint_fn_(std::move(endpoint)), tiles_(opt_.tile_cache_bytes) {
  master_.embedded = opt_.embedded;
  master_.phase = opt_.embedded ? "starting the local cluster" : "connecting";
  master_.can_submit_tiny = !opt_.tiny_config.empty();
  published_ = std::make_shared<const ConsoleSnapshot>(master_);
}

DataSource::~DataSource() {
  stop();
}

void DataSource::start() {
  net_ = std::thread([this] { net_main(); });
  events_ = std::thread([this] { events_main(); });
  tiles_thread_ = std::thread([this] { tiles_main(); });
  timeline_thread_ = std::thread([this] { timeline_main(); });
  devices_thread_ = std::thread([this] { devices_main(); });
}

void DataSource::stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
    if (stream_ != nullptr) stream_->stop();
  }
  cv_.notify_all();
  if (net_.joinable()) net_.join();
  if (events_.joinable()) events_.join();
  if (tiles_thread_.joinable()) tiles_thread_.join();
  if (timeline_thread_.joinable()) timeline_thread_.join();
  if (devices_thread_.joinable()) devices_thread_.join();
}

std::shared_ptr<const ConsoleSnapshot> DataSource::snapshot() const {
  std::lock_guard<std::mutex> lock(mu_);
  return published_;
}

void DataSource::follow(int64_t run_id) {
  std::lock_guard<std::mutex> lock(mu_);
  follow_ = run_id;
  cv_.notify_all();
}

void DataSource::request_action(int64_t run_id, RunAction a) {
  const std::string route(run_action_name(a));
  std::lock_guard<std::mutex> lock(mu_);
  requests_.push_back(
      {.what = route + " run " + std::to_string(run_id), .request = ApiClient::action_request(run_id, a)});
  cv_.notify_all();
}

void DataSource::request_resume_from(int64_t run_id, const std::string& checkpoint,
                                     const ResumeLayout& layout) {
  json body = {{"checkpoint", checkpoint}};
  json l = json::object();
  if (layout.dp > 0) l["dp"] = layout.dp;
  if (layout.zero) l["zero"] = *layout.zero;
  if (layout.tp) l["tp"] = *layout.tp;
  if (layout.pp) l["pp"] = *layout.pp;
  if (layout.vp) l["vp"] = *layout.vp;
  if (!l.empty()) body["layout"] = std::move(l);
  std::lock_guard<std::mutex> lock(mu_);
  requests_.push_back({.what = "resume run " + std::to_string(run_id) + " from " + checkpoint,
                       .request = ApiClient::resume_from_request(run_id, body)});
  cv_.notify_all();
}

void DataSource::request_quarantine(const std::string& node) {
  std::lock_guard<std::mutex> lock(mu_);
  requests_.push_back({.what = "quarantine node " + node, .request = ApiClient::quarantine_request(node)});
  cv_.notify_all();
}

void DataSource::request_release(const std::string& node) {
  std::lock_guard<std::mutex> lock(mu_);
  requests_.push_back({.what = "release node " + node, .request = ApiClient::release_request(node)});
  cv_.notify_all();
}

void DataSource::request_straggler_quarantine(int64_t run_id, bool on) {
  // On needs the scoring on too (the coordinator refuses quarantine without it); off leaves the scoring.
  const json policy = on ? json{{"enabled", true}, {"quarantine", true}} : json{{"quarantine", false}};
  std::lock_guard<std::mutex> lock(mu_);
  requests_.push_back({.what = std::string("straggler quarantine ") + (on ? "on" : "off") + " for run " +
                               std::to_string(run_id),
                       .request = ApiClient::straggler_request(run_id, policy)});
  cv_.notify_all();
}

void DataSource::request_submit_tiny() {
  json body = {{"config", opt_.tiny_config}, {"layout", {{"dp", opt_.tiny_dp}}}, {"name", "tiny"}};
  if (opt_.tiny_max_steps > 0) body["max_steps"] = opt_.tiny_max_steps;
  std::lock_guard<std::mutex> lock(mu_);
  requests_.push_back({.what = "submit the tiny run (dp " + std::to_string(opt_.tiny_dp) + ")",
                       .request = ApiClient::submit_request(body),
                       .submit = true});
  cv_.notify_all();
}

void DataSource::set_rank_metric(RankTimeMetric m) {
  std::lock_guard<std::mutex> lock(mu_);
  if (m == rank_metric_) return;
  rank_metric_ = m;
  heat_wanted_ = true;  // the band and the pages of the new metric, now
  cv_.notify_all();
}

void DataSource::want_heatmap(const HeatWant& want) {
  std::lock_guard<std::mutex> lock(mu_);
  if (want == heat_want_) return;
  heat_want_ = want;
  heat_wanted_ = true;
  cv_.notify_all();
}

void DataSource::reconnect() {
  std::lock_guard<std::mutex> lock(mu_);
  reconnect_ = true;
  events_restart_ = true;
  if (stream_ != nullptr) stream_->stop();
  cv_.notify_all();
}

// ---- the model (hold mu_) -------------------------------------------------------------------------------

void DataSource::publish_locked() {
  auto s = std::make_shared<ConsoleSnapshot>(master_);
  s->version = published_->version + 1;
  s->steps = steps_dirty_ ? std::make_shared<const StepLog>(steps_) : published_->steps;
  s->band = band_;  // pointers: the band and the pages are immutable once made
  s->heat = heat_;
  s->timeline = timeline_;
  s->devices = devices_;
  s->devices_error = devices_error_;
  steps_dirty_ = false;
  published_ = std::move(s);
}

void DataSource::fail_locked(const std::string& error) {
  master_.connected = false;
  master_.error = error;
  publish_locked();
}

bool DataSource::wait_locked(std::unique_lock<std::mutex>& lock, std::chrono::milliseconds d) {
  cv_.wait_for(lock, d, [&] { return stop_ || reconnect_ || !requests_.empty(); });
  return !stop_;
}

void DataSource::reset_run_locked(int64_t id) {
  master_.run = RunView{.id = id};
  master_.ranks.clear();
  master_.checkpoints.clear();
  master_.goodput = GoodputView{};
  goodput_polled_s_ = 0;  // the new run's ledger at the next poll
  master_.events.clear();
  steps_ = StepLog();
  band_ = std::make_shared<RankBand>();
  heat_ = std::make_shared<HeatPages>();
  timeline_ = std::make_shared<TimelineWindow>();
  steps_dirty_ = true;
  last_event_id_ = 0;
  pending_rewind_ = -1;
  pending_cache_events_.clear();
  events_restart_ = true;
  events_ended_ = false;
  if (stream_ != nullptr) stream_->stop();
  cv_.notify_all();  // the event thread follows the new run
}

// ---- the network thread ---------------------------------------------------------------------------------

void DataSource::net_main() {
  Result<Endpoint> ep = endpoint_fn_();
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!ep.ok()) {
      master_.phase = "failed";
      fail_locked(ep.error());
      return;
    }
    endpoint_ = ep.value();
    have_endpoint_ = true;
    master_.url = endpoint_.url;
    master_.phase = "connecting";
    publish_locked();
  }
  cv_.notify_all();  // the event thread waits for the endpoint
  if (!opt_.cache_path.empty()) {
    std::string error;
    cache_ = LocalCache::open(opt_.cache_path, &error);
    if (!cache_) {
      std::lock_guard<std::mutex> lock(mu_);
      master_.error = "local cache off: " + error;
      publish_locked();
    }
  }
  std::unique_ptr<ApiClient> api;
  for (;;) {
    std::deque<Request> todo;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stop_) return;
      if (reconnect_) {
        api.reset();
        reconnect_ = false;
      }
      todo.swap(requests_);
    }
    if (!api)
      api = std::make_unique<ApiClient>(HttpClientOptions{.url = endpoint_.url, .token = endpoint_.token});
    for (const Request& r : todo) carry_out(*api, r);
    const bool ok = poll_once(*api);
    std::unique_lock<std::mutex> lock(mu_);
    if (!ok) api.reset();  // a fresh connection next time
    if (unauthorized_) {
      // Refused: nothing more is asked until the operator reconnects (a script's `reconnect`).
      cv_.wait(lock, [&] { return stop_ || reconnect_; });
      if (stop_) return;
      unauthorized_ = false;
      have_endpoint_ = true;
      master_.phase = "connecting";
      publish_locked();
      continue;
    }
    if (!wait_locked(lock, ok ? opt_.poll_interval : opt_.retry_interval)) return;
  }
}

void DataSource::carry_out(ApiClient& api, const Request& r) {
  Result<HttpReply> reply = api.send(r.request);
  std::lock_guard<std::mutex> lock(mu_);
  ActionOutcome& o = master_.last_action;
  o.serial += 1;
  o.what = r.what;
  if (!reply.ok()) {
    o.ok = false;
    o.message = reply.error();
  } else if (!reply->ok()) {
    o.ok = false;
    o.message = std::to_string(reply->status) + ": " + reply->error_message();
  } else {
    o.ok = true;
    o.message = "accepted (" + std::to_string(reply->status) + ")";
    if (r.submit) {
      Result<json> j = reply->json();
      if (j.ok() && j->contains("id")) {
        follow_ = j->at("id").get<int64_t>();
        o.message = "run " + std::to_string(follow_) + " submitted";
      }
    }
  }
  publish_locked();
}

bool DataSource::poll_once(ApiClient& api) {
  Result<HttpReply> reply = api.get("/v1/cluster");
  if (reply.ok() && (reply->status == 401 || reply->status == 403)) {
    // The token is wrong: every retry would be refused the same way (and an attacker's guesses look like
    // this). Said once, and the console stops asking until told to reconnect.
    std::lock_guard<std::mutex> lock(mu_);
    unauthorized_ = true;
    have_endpoint_ = false;  // the other threads stop asking too
    master_.phase = "unauthorized";
    master_.auth_refusals += 1;
    fail_locked("the coordinator at " + endpoint_.url + " refused the token (" +
                std::to_string(reply->status) + ": " + reply->error_message() +
                "): check --token-file (the operator's token, <cluster dir>/token); not retrying");
    return false;
  }
  Result<json> cluster =
      !reply.ok()    ? Result<json>(reply.status())
      : !reply->ok() ? Result<json>(Status::error("GET /v1/cluster: " + std::to_string(reply->status) + ": " +
                                                  reply->error_message()))
                     : reply->json();
  Result<json> runs = cluster.ok() ? api.runs() : Result<json>(cluster.status());
  if (!runs.ok()) {
    std::lock_guard<std::mutex> lock(mu_);
    master_.phase = "reconnecting";
    fail_locked(runs.error());
    return false;
  }
  std::vector<NodeView> nodes;
  for (const json& n : field<json>(cluster.value(), "nodes", json::array()))
    nodes.push_back(node_from_json(n));
  std::vector<RunView> run_list;
  for (const json& r : field<json>(runs.value(), "runs", json::array())) run_list.push_back(run_from_json(r));

  int64_t id = -1, after = 0;
  bool need_config = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    master_.nodes = std::move(nodes);
    master_.runs = run_list;
    master_.connected = true;
    master_.phase = "connected";
    master_.error.clear();
    master_.cluster_seen_unix_s = unix_now_s();
    // The run to follow: the one asked for; else the one followed while it exists; else the newest live
    // run; else the newest.
    auto exists = [&](int64_t x) {
      return std::any_of(run_list.begin(), run_list.end(), [&](const RunView& r) { return r.id == x; });
    };
    int64_t want = -1;
    if (follow_ >= 0 && exists(follow_)) {
      want = follow_;
    } else if (master_.run.id >= 0 && exists(master_.run.id)) {
      want = master_.run.id;
    } else {
      for (const RunView& r : run_list)
        if (!run_ended(r.state) && r.id > want) want = r.id;
      if (want < 0)
        for (const RunView& r : run_list) want = std::max(want, r.id);
    }
    if (want != master_.run.id) reset_run_locked(want);
    for (const RunView& r : run_list)
      if (r.id == want) master_.run = r;
    if (config_run_ == want) master_.run.detail = detail_;
    id = master_.run.id;
    need_config = id >= 0 && config_run_ != id;
    if (events_ended_ && !run_ended(master_.run.state)) {
      // Resumed from a checkpoint after it ended: the same run id has new events to follow.
      events_ended_ = false;
      events_restart_ = true;
      cv_.notify_all();
    }
    after = steps_.last_step();  // step records after the last one held
    publish_locked();
  }
  if (id < 0) return true;

  if (need_config) {
    // The list leaves the config out; the run's own route has it (the what-if panel plans from it). A
    // run's config never changes, so once a run is enough; a failure is retried on the next poll.
    if (Result<json> detail = api.run(id); detail.ok()) {
      std::lock_guard<std::mutex> lock(mu_);
      config_run_ = id;
      detail_ = std::move(detail.value());
      if (master_.run.id == id) master_.run.detail = detail_;
    }
  }
  // A page of step records at a time: a long run's catch-up in pages of 5,000 (~1 MB of JSON each) rather
  // than one answer whose parsed form alone would be hundreds of MB, and short enough that the tile
  // thread's queries, served behind it on the coordinator's database, do not wait long.
  Result<json> steps = api.steps(id, {.after = after, .limit = 5000});
  Result<json> ranks = steps.ok() ? api.ranks(id) : Result<json>(steps.status());
  Result<json> ckpts = ranks.ok() ? api.checkpoints(id) : Result<json>(ranks.status());
  if (!ckpts.ok()) {
    std::lock_guard<std::mutex> lock(mu_);
    fail_locked(ckpts.error());
    return false;
  }
  // The goodput ledger reads the run's whole event history on the coordinator: every few seconds, not every
  // poll. A coordinator without the route (or a failure) leaves it unknown, saying why; the poll goes on.
  std::optional<GoodputView> goodput;
  if (const double now = monotonic_s(); now - goodput_polled_s_ >= kGoodputPollS) {
    goodput_polled_s_ = now;
    Result<json> g = api.goodput(id);
    goodput = g.ok() ? goodput_from_json(g.value()) : GoodputView{.error = g.error()};
  }
  std::vector<StepRecord> step_records;
  std::string error;
  for (const json& s : field<json>(steps.value(), "steps", json::array())) {
    StepRecord r;
    if (record_read_json(s, &r, &error)) step_records.push_back(std::move(r));
  }
  std::vector<RankView> rank_views;
  for (const json& r : field<json>(ranks.value(), "ranks", json::array()))
    rank_views.push_back(rank_from_json(r));
  std::vector<CheckpointView> checkpoint_views;
  for (const json& c : field<json>(ckpts.value(), "checkpoints", json::array()))
    checkpoint_views.push_back(checkpoint_from_json(c));

  std::vector<StepRecord> new_steps;
  std::vector<EventRecord> new_events;
  int64_t rewind = -1;
  RunView run;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (master_.run.id != id) return true;  // the followed run changed meanwhile; the next poll starts it
    const int64_t before = steps_.last_step();
    steps_.append(step_records);
    for (const StepRecord& s : steps_.records())
      if (s.step > before) new_steps.push_back(s);
    steps_dirty_ = steps_dirty_ || !new_steps.empty();
    master_.ranks = std::move(rank_views);
    master_.checkpoints = checkpoint_views;
    if (goodput) master_.goodput = std::move(*goodput);
    new_events.swap(pending_cache_events_);
    rewind = std::exchange(pending_rewind_, -1);
    run = master_.run;
    publish_locked();
  }

  if (cache_) {
    if (cache_run_remote_ != id) {
      cache_run_ = cache_->local_run(endpoint_.url, run);
      cache_run_remote_ = id;
      cache_finished_ = false;
    }
    bool ok = cache_run_ >= 0;
    if (ok && rewind >= 0) ok = cache_->rewind(cache_run_, rewind);
    if (ok) ok = cache_->ingest(cache_run_, std::move(new_steps), {}, std::move(new_events));
    if (ok) ok = cache_->record_checkpoints(cache_run_, checkpoint_views);
    if (ok && run_ended(run.state) && !cache_finished_)
      ok = cache_finished_ = cache_->finish(cache_run_, run);
    if (!ok) {
      std::lock_guard<std::mutex> lock(mu_);
      master_.error = cache_run_ < 0 || !cache_ ? "local cache failed" : cache_->error();
      publish_locked();
    }
  }
  return true;
}

// ---- the tile thread ----------------------------------------------------------------------------------

// The heatmap's pages and the band, apart from the step catch-up (a long run's first steps answer can take
// seconds; the heatmap must not wait for it): woken by a new want, a new metric or a rewind, and every poll
// interval while the followed run lives, when the newest page and the band are asked again. Both are for
// what the Run panel shows: nothing is asked before its first want for the run.
void DataSource::tiles_main() {
  std::unique_ptr<ApiClient> api;
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait_for(lock, opt_.poll_interval, [&] { return stop_ || (have_endpoint_ && heat_wanted_); });
    if (stop_) return;
    // Nothing before the Run panel has said what it shows of this run: its first want (a frame after the
    // run is known) is then served at once, not behind a band asked for meanwhile.
    if (!have_endpoint_ || master_.run.id < 0) continue;
    // A want for another run (the one followed before) is consumed, not kept: kept, it would wake this
    // loop at once, again and again, holding mu_ from the other threads.
    heat_wanted_ = false;
    if (heat_want_.run != master_.run.id) continue;
    const HeatWant want = heat_want_;
    const RankTimeMetric metric = rank_metric_;
    const RunView run = master_.run;
    const bool ended = run_ended(run.state);
    const bool rewound = std::exchange(tiles_rewound_, false);
    std::shared_ptr<const RankBand> band = band_;
    const Endpoint endpoint = endpoint_;
    lock.unlock();

    if (!api)
      api = std::make_unique<ApiClient>(HttpClientOptions{.url = endpoint.url, .token = endpoint.token});
    if (rewound) tiles_.clear();
    bool failed = false;
    // The pages of the want: from the cache where held and final; else asked for.
    // The pages of `want` at `rows` rank rows: from the cache where held and final; else asked for.
    const auto fetch_pages = [&](int rows) {
      auto h = std::make_shared<HeatPages>();
      h->want = want;
      h->layout = heat_layout(want, opt_.heat_page_cols);
      const HeatLayout& l = h->layout;
      for (int64_t page = l.first_page; page <= l.last_page && !failed; ++page) {
        const TileKey key{
            .run = run.id, .metric = metric, .bucket_steps = l.bucket_steps, .page = page, .rank_rows = rows};
        std::shared_ptr<const HeatTile> tile = tiles_.find(key);
        // A page the run had not finished when read is asked again once the run has moved on.
        const bool stale =
            tile && !ended && tile->last_step < l.page_end(page) - 1 && tile->last_step < run.last_step;
        if (!tile || stale) {
          Result<json> a = api->heatmap(run.id, {.metric = std::string(rank_time_metric_api_name(metric)),
                                                 .step_begin = l.page_begin(page),
                                                 .step_end = l.page_end(page),
                                                 .buckets = l.page_cols,
                                                 .rank_buckets = rows});
          Result<HeatTile> t = a.ok() ? heat_tile_from_json(a.value()) : Result<HeatTile>(a.status());
          if (!t.ok()) {
            failed = true;
            break;
          }
          tile = std::make_shared<const HeatTile>(std::move(t.value()));
          tiles_.put(key, tile);
        }
        h->pages.push_back(std::move(tile));
      }
      return h;
    };
    const auto publish_heat = [&](const std::shared_ptr<HeatPages>& h) {
      // The heatmap on its own: the frame that can draw it need not wait for the band.
      std::lock_guard<std::mutex> g(mu_);
      if (master_.run.id == run.id && (h->want != heat_->want || h->pages != heat_->pages)) {
        heat_ = h;
        master_.tile_cache_bytes = tiles_.bytes();
        publish_locked();
      }
    };
    std::shared_ptr<HeatPages> heat = std::make_shared<HeatPages>();
    if (want.run == run.id && want.metric == metric && want.cols > 0 && want.rows > 0) {
      // Nothing of this run and metric on screen yet (the run just followed, the metric just switched):
      // first the pages at a few rank rows, which read the coarse rank levels of the pyramid (a fraction
      // of the fine rows' cost at a thousand ranks), then the rows asked for. The map is never blank for
      // the seconds a fine first page of a long run can take.
      bool shown = false;
      {
        std::lock_guard<std::mutex> g(mu_);
        shown = heat_->want.run == run.id && heat_->want.metric == metric && !heat_->pages.empty();
      }
      if (!shown && want.rows > opt_.heat_coarse_rows) {
        std::shared_ptr<HeatPages> coarse = fetch_pages(opt_.heat_coarse_rows);
        if (!failed) publish_heat(coarse);
      }
      if (!failed) heat = fetch_pages(want.rows);
    }

    if (!failed && !heat->pages.empty()) publish_heat(heat);

    // Then the band over the whole run, the same query with one row for all ranks: again when the run
    // advanced past it or the metric changed. After the pages: the heatmap must not wait for it.
    if (!failed &&
        (band->run != run.id || band->metric != metric || rewound || band->last_step < run.last_step)) {
      Result<json> a = api->heatmap(run.id, {.metric = std::string(rank_time_metric_api_name(metric)),
                                             .buckets = opt_.band_buckets,
                                             .rank_buckets = 1});
      Result<HeatTile> t = a.ok() ? heat_tile_from_json(a.value()) : Result<HeatTile>(a.status());
      if (t.ok()) {
        RankBand b = rank_band_from_tile(t.value(), metric);
        b.run = run.id;
        band = std::make_shared<const RankBand>(std::move(b));
      } else {
        failed = true;
      }
    }
    lock.lock();
    if (failed) {
      api.reset();  // a fresh connection next time
      heat_wanted_ = true;
      cv_.wait_for(lock, opt_.retry_interval, [&] { return stop_; });
      continue;
    }
    if (master_.run.id != run.id) continue;  // another run meanwhile: its own pages next
    const bool new_heat = !heat->pages.empty() && (heat->want != heat_->want || heat->pages != heat_->pages);
    if (band == band_ && !new_heat) continue;  // nothing new: no publish
    band_ = std::move(band);
    if (new_heat) heat_ = std::move(heat);
    master_.tile_cache_bytes = tiles_.bytes();
    publish_locked();
  }
}

// ---- the event thread -----------------------------------------------------------------------------------

void DataSource::events_main() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return stop_ || (have_endpoint_ && master_.run.id >= 0 && events_restart_); });
    if (stop_) return;
    events_restart_ = false;
    const int64_t id = master_.run.id;
    const std::string resume = last_event_id_ > 0 ? std::to_string(last_event_id_) : "";
    HttpEventStream stream({.url = endpoint_.url, .token = endpoint_.token});
    stream_ = &stream;
    lock.unlock();
    Status st = ApiClient::follow_events(
        stream, id,
        [&](const SseEvent& e) {
          EventView v;
          v.id = std::strtoll(e.id.c_str(), nullptr, 10);
          std::string error;
          if (!record_from_json(e.data, &v.record, &error))
            return true;  // not a record: skip it, keep reading
          std::lock_guard<std::mutex> g(mu_);
          if (stop_ || master_.run.id != id) return false;
          if (v.id <= last_event_id_) return true;  // seen before a reconnect
          last_event_id_ = v.id;
          const std::string& kind = v.record.kind;
          if ((kind == "quarantine_placed" || kind == "resume_placed") && v.record.step >= 0) {
            // The server forgot the steps after the checkpoint the run resumed from; they will be trained
            // again.
            steps_.rewind(v.record.step);
            steps_dirty_ = true;
            heat_wanted_ = true;  // the band and the pages after the step are asked again
            tiles_rewound_ = true;
            timeline_rewound_ = timeline_wanted_ = true;
            pending_rewind_ = v.record.step;
          }
          pending_cache_events_.push_back(v.record);
          master_.events.push_back(std::move(v));
          publish_locked();
          return true;
        },
        resume);
    lock.lock();
    stream_ = nullptr;
    if (stop_) return;
    if (!st.ok()) {
      // Broken or refused: try again after a pause, from the last event seen.
      cv_.wait_for(lock, opt_.retry_interval, [&] { return stop_; });
      events_restart_ = true;
    } else if (!events_restart_ && master_.run.id == id) {
      events_ended_ = true;  // the server ended it: everything of an ended run was sent
    }
    // Ended cleanly (the run ended and everything was sent, or stopped for a new run): wait for a restart.
  }
}

}  // namespace gantry::console
