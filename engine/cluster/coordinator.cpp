#include "engine/cluster/coordinator.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>
#include <vector>

#include "engine/cluster/checkpoint_policy.h"
#include "engine/cluster/http_server.h"
#include "engine/cluster/ingest_writer.h"
#include "engine/cluster/json_fields.h"
#include "engine/cluster/placement.h"
#include "engine/cluster/run_lifecycle.h"
#include "engine/cluster/straggler_watch.h"
#include "engine/cluster/token.h"  // token_generate, token_equal: the agents' credentials
#include "engine/core/checkpoint.h"  // checkpoint_list, checkpoint_latest: what a run can resume from
#include "engine/core/config.h"
#include "engine/core/train.h"  // TrainAction
#include "engine/core/worker/rendezvous_server.h"
#include "storage/history_db.h"
#include "telemetry/prometheus.h"
#include "telemetry/record_json.h"

namespace gantry {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

double now_unix_s() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// The lifecycle's action for an operator's request on the run's own route.
RunAction run_action_of(TrainAction a) {
  switch (a) {
    case TrainAction::checkpoint:
      return RunAction::kCheckpoint;
    case TrainAction::pause:
      return RunAction::kPause;
    case TrainAction::resume:
      return RunAction::kResume;
    case TrainAction::stop:
    case TrainAction::none:  // no route asks for none
      return RunAction::kStop;
  }
  return RunAction::kStop;
}

// How the run database records an ended (or live) run.
RunStatus run_status_of(RunState s) {
  switch (s) {
    case RunState::kFinished:
      return RunStatus::finished;
    case RunState::kFailed:
      return RunStatus::failed;
    case RunState::kStopped:
      return RunStatus::stopped;
    case RunState::kInterrupted:
      return RunStatus::interrupted;
    case RunState::kRunning:
    case RunState::kPaused:
    case RunState::kStopping:
      return RunStatus::running;
  }
  return RunStatus::running;
}

constexpr size_t kMaxRunName = 128;
constexpr size_t kMaxNodeName = 128;

// Names: a run's (shown in every list and event) and a node's. Printable ASCII, bounded, so that neither a
// listing nor an event message can be made huge or control a terminal.
Status check_name(std::string_view field, const std::string& name, size_t max) {
  const bool printable =
      std::all_of(name.begin(), name.end(), [](char c) { return c >= 0x20 && c < 0x7f; });
  if (name.empty() || name.size() > max || !printable) {
    return Status::error("field \"" + std::string(field) + "\": expected 1-" + std::to_string(max) +
                         " printable ASCII characters, got " +
                         (name.empty() ? std::string("an empty name") : std::to_string(name.size()) + " bytes") +
                         (printable ? "" : " with control or non-ASCII characters"));
  }
  return Status();
}

// A record as the API shows it: record_json.h's form, parsed so it nests in a larger reply.
template <class R>
json record_json(const R& r) {
  return json::parse(record_to_json(r));
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
      return Status::error("ranks: \"" + item + "\" is not a rank of this run (expected \"all\" or a list such as 0,1,3 of ranks 0.." +
                           std::to_string(world - 1) + ")");
    }
    out.push_back(static_cast<int32_t>(v));
  }
  return out;
}

Result<int64_t> parse_int_query(const HttpRequest& req, const char* key, int64_t min, int64_t max, int64_t fallback) {
  std::optional<std::string> v = req.query_value(key);
  if (!v) return fallback;
  char* end = nullptr;
  long long x = std::strtoll(v->c_str(), &end, 10);
  if (v->empty() || *end != '\0' || x < min || x > max) {
    return Status::error(std::string(key) + "=\"" + *v + "\": expected an integer in [" + std::to_string(min) + ", " +
                         std::to_string(max) + "]");
  }
  return static_cast<int64_t>(x);
}

}  // namespace

struct Coordinator::Impl {
  struct Node {
    std::string id;
    int slots = 0;
    NodeState state = NodeState::healthy;
    bool spare = false;  // registered as a spare: its state when healthy, and again when released
    Clock::time_point last_seen;
    double last_seen_unix = 0;
    int64_t pid = 0;
    std::string host;
    std::string metrics_url;  // the agent's own /metrics, for whoever scrapes the node
    std::string credential;   // issued at registration: this node's heartbeats, and nothing else
    // What the node must do, handed over in the reply to its next heartbeat.
    json start = json::array(), commands = json::array(), stop = json::array();
  };
  struct NodeShare {
    std::string node;
    int first_rank = 0;
    int ranks = 0;
    std::vector<int> slots;
    bool done = false;
    int code = 0;
    std::string error, final_message;
    int cause_rank = -1;          // gang.h: how likely this gang's failure is the run's root cause
    bool agent_stopping = false;  // it ended because its agent was told to stop (`down`), not by itself
  };
  struct Run {
    int64_t id = 0;
    std::string name;
    RunState state = RunState::kRunning;  // changed only through set_state (run_lifecycle.h's rules)
    int dp = 1, zero = 0;
    int64_t max_steps = -1;
    std::string config_toml, out_dir, backend;
    std::vector<NodeShare> shares;  // in rank order
    std::unique_ptr<RendezvousServer> store;
    int64_t last_step = -1;
    std::string message;
    double created_unix = 0;
    std::vector<RankStepRecord> latest;  // per rank, for /metrics
    StepRecord latest_step;
    int db_world = 0;  // the world the database sized this run for: a resumed layout may not exceed it
    // Each placement of the run is a generation; an agent's report of a gang's end names its generation,
    // so a late report of the previous one cannot end the shares of the next.
    int generation = 0;
    // A move in progress (a quarantine of one of its nodes): the run is stopping with a checkpoint, and
    // once every share has ended it is placed again and resumed instead of ending. "" = none.
    std::string relocate_node;
    std::string relocate_checkpoint;  // the stop's checkpoint, from rank 0's event
    // Placed again from a checkpoint at this step: the first step record past it is the "resumed" event.
    int64_t resumed_from = -1;
    std::string resume_kind;  // "quarantine" or "resume": the events' prefix
    StragglerWatch straggler;   // the straggler policy: scores of the current placement's ranks
    CheckpointPolicy checkpoint_policy;

    // The node that holds `rank` in the current placement ("" when none does).
    std::string node_of(int32_t rank) const {
      for (const NodeShare& s : shares)
        if (rank >= s.first_rank && rank < s.first_rank + s.ranks) return s.node;
      return "";
    }
  };

  explicit Impl(CoordinatorOptions o) : opt(std::move(o)) {}

  CoordinatorOptions opt;
  std::unique_ptr<HttpServer> server;
  std::unique_ptr<HistoryDb> db;
  // Lock order: mu, then db_mu. HTTP handlers that change state hold mu and never db_mu: their writes are
  // queued to `writer`, the one thread that writes; reads of the database hold db_mu only.
  std::mutex db_mu;                      // db: one connection, one thread at a time
  std::unique_ptr<IngestWriter> writer;  // every write of the database but begin_run
  std::mutex events_mu;                  // with events_cv: new events were written
  std::condition_variable events_cv;
  std::mutex mu;  // everything below
  std::map<std::string, Node> nodes;
  std::map<int64_t, Run> runs;
  uint64_t next_request = 1;
  uint64_t records_total = 0;
  std::atomic<bool> stopping{false};
  std::thread watch;

  // ---- helpers (hold mu) --------------------------------------------------------------------------------

  void event(int64_t run, const std::string& kind, const std::string& message, json payload = json::object(),
             int64_t step = -1, const std::string& node = "") {
    RecordBatch b;
    b.events.push_back({.run_id = run,
                        .time_unix_s = now_unix_s(),
                        .step = step,
                        .kind = kind,
                        .node = node,
                        .message = message,
                        .payload = payload.dump()});
    writer->push_own(std::move(b));
  }

  // The one place a run's state changes: a change the lifecycle does not allow is a defect of the
  // coordinator, reported and not made (the run keeps the state every client has seen).
  bool set_state(Run& r, RunState to) {
    if (Status s = run_transition_check(r.state, to); !s.ok()) {
      std::fprintf(stderr, "gantry-engine coordinator: run %lld: refused a state change: %s\n",
                   static_cast<long long>(r.id), s.message().c_str());
      return false;
    }
    r.state = to;
    return true;
  }

  void upsert_node(const Node& n, const char* state) {
    writer->push_op([info = NodeInfo{.host = n.id, .devices = n.slots, .device_name = "slot", .state = state,
                                     .last_seen_unix_s = n.last_seen_unix}](HistoryDb& d) { d.upsert_node(info); });
  }

  // An event built elsewhere (the straggler policy's), into the run's history.
  void record(std::vector<EventRecord> events) {
    if (events.empty()) return;
    RecordBatch b;
    b.events = std::move(events);
    writer->push_own(std::move(b));
  }

  // Queues `a` for rank 0 (which decides for the gang at its next step boundary, train.h) and records the
  // request: `source` is "api" (an operator) or "policy" (the coordinator's own), `from` who asked.
  uint64_t queue_action(Run& r, TrainAction a, const std::string& source, const std::string& from) {
    const uint64_t request = next_request++;
    const char* what = train_action_name(a);
    nodes[r.shares.front().node].commands.push_back({{"run", r.id}, {"rank", 0}, {"action", static_cast<int>(a)},
                                                     {"request", request}, {"from", source == "api" ? "api@" + from : from}});
    event(r.id, "action_requested",
          std::string(what) + " requested " + (source == "policy" ? "by the " + from : "from " + from) + " (request " +
              std::to_string(request) + ")",
          {{"action", what}, {"request", request}, {"from", from}, {"source", source}});
    return request;
  }

  std::vector<PlacementNode> placement_nodes() const {
    std::vector<PlacementNode> out;
    for (const auto& [id, n] : nodes) {
      PlacementNode p{.id = id, .slots = n.slots, .state = n.state};
      for (const auto& [rid, r] : runs) {
        if (run_state_terminal(r.state)) continue;
        for (const NodeShare& s : r.shares) {
          if (s.node == id && !s.done) p.busy.insert(p.busy.end(), s.slots.begin(), s.slots.end());
        }
      }
      std::sort(p.busy.begin(), p.busy.end());
      out.push_back(std::move(p));
    }
    return out;
  }

  json node_json(const Node& n) const {
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
    return {{"id", n.id},          {"slots", n.slots},  {"busy_slots", used},    {"state", node_state_name(n.state)},
            {"last_seen_unix_s", n.last_seen_unix}, {"pid", n.pid}, {"host", n.host}, {"runs", run_ids},
            {"metrics_url", n.metrics_url}};
  }

  json run_json(const Run& r, bool full) const {
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
              {"layout", {{"dp", r.dp}, {"tp", 1}, {"pp", 1}, {"zero", r.zero}}},
              {"world", r.dp},
              {"last_step", r.last_step},
              {"max_steps", r.max_steps},
              {"message", r.message},
              {"created_unix_s", r.created_unix},
              {"generation", r.generation},
              {"placement", shares},
              {"straggler", straggler_watch_options_json(r.straggler.options())},
              {"checkpoint_policy",
               {{"checkpoint_every_steps", r.checkpoint_policy.options().every_steps},
                {"keep_last", r.checkpoint_policy.options().keep_last}}}};
    if (full) {
      j["config"] = r.config_toml;
      j["out_dir"] = r.out_dir;
      if (r.last_step >= 0) j["latest_step"] = record_json(r.latest_step);
    }
    return j;
  }

  Run* find_run(const HttpRequest& req, HttpResponse* err) {
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

  // Every share has reported: the run's end, from the worst of its gangs.
  void maybe_finish(Run& r) {
    if (run_state_terminal(r.state)) return;
    for (const NodeShare& s : r.shares)
      if (!s.done) return;
    if (!r.relocate_node.empty()) {
      // A move: every gang stopped in order (130 after its checkpoint) and the run goes on elsewhere. A gang
      // that finished (0: max_steps came first) or failed ends the run as usual.
      bool all_stopped = !r.shares.empty();
      for (const NodeShare& s : r.shares) all_stopped = all_stopped && s.code == 130;
      if (all_stopped) return relocate(r);
      r.relocate_node.clear();
    }
    RunState state = RunState::kFinished;
    std::string message;
    for (const NodeShare& s : r.shares) {
      if (s.code == 130 && state == RunState::kFinished) {
        state = RunState::kStopped;
        message = s.final_message;
      }
    }
    // Of several failed gangs, the root cause (a rank killed by a signal takes its peers down, not the
    // reverse); among equals, the first in rank order.
    const NodeShare* failed = nullptr;
    for (const NodeShare& s : r.shares) {
      if (s.code == 0 || s.code == 130) continue;
      const int rank = s.cause_rank < 0 ? 1000 : s.cause_rank;
      if (failed == nullptr || rank < (failed->cause_rank < 0 ? 1000 : failed->cause_rank)) failed = &s;
    }
    if (failed != nullptr) {
      state = RunState::kFailed;
      message = failed->node + ": " + failed->error;
    }
    for (const NodeShare& s : r.shares) {
      if (!s.agent_stopping || s.code == 0) continue;
      state = RunState::kInterrupted;
      message = "the agent of " + s.node + " was stopped while the run was live (at step " + std::to_string(r.last_step) +
                "): resume-from continues it from its newest checkpoint";
      break;
    }
    if (state == RunState::kFinished) message = r.shares.empty() ? "" : r.shares.front().final_message;
    if (!set_state(r, state)) return;
    r.message = message;
    r.store.reset();  // nobody will meet there again
    const RunStatus st = run_status_of(state);
    const std::string name(run_state_name(state));
    writer->push_op([id = r.id, st, message](HistoryDb& d) { d.finish_run(id, st, message); });
    event(r.id, "run_" + name,
          "run " + std::to_string(r.id) + " " + name + (message.empty() ? "" : ": " + message),
          {{"state", name}});
  }

  // Tells every node still running a share of the run to stop it (SIGTERM: a checkpoint, then exit).
  void stop_shares(Run& r, const std::string& except_node) {
    for (NodeShare& s : r.shares) {
      if (s.done || s.node == except_node) continue;
      auto it = nodes.find(s.node);
      if (it != nodes.end()) it->second.stop.push_back(r.id);
    }
  }

  // Places run `r` (its shares all ended or none yet) on `p`, on a fresh rendezvous store, and queues each
  // node's share; `resume_dir` is the checkpoint the workers start from ("" = a fresh run).
  Status start_generation(Run& r, const std::vector<PlacementNode>& pn, const Placement& p, const std::string& resume_dir) {
    Result<std::unique_ptr<RendezvousServer>> store = RendezvousServer::start({opt.rendezvous_host, 0});
    if (!store.ok()) return Status::error("cannot start the run's rendezvous store: " + store.error());
    r.store = std::move(store.value());
    const std::string rendezvous = opt.rendezvous_host + ":" + std::to_string(r.store->port());
    ++r.generation;
    writer->push_op([id = r.id, options = run_options(r).dump()](HistoryDb& d) {
      d.update_run(id, RunStatus::running, "", options);
    });
    // The ranks land on other devices: their straggler scores start over (flags of the last placement end).
    record(r.straggler.reset(r.id, now_unix_s(), [&r](int32_t rank) { return r.node_of(rank); }));
    r.shares.clear();
    r.latest.assign(static_cast<size_t>(r.dp), RankStepRecord{});
    for (const PlacedNode& pnode : p.nodes) {
      NodeShare s;
      s.node = pn[static_cast<size_t>(pnode.node)].id;
      s.first_rank = pnode.first_rank;
      s.ranks = pnode.ranks;
      for (int k = 0; k < pnode.ranks; ++k) s.slots.push_back(p.ranks[static_cast<size_t>(pnode.first_rank + k)].slot);
      nodes[s.node].start.push_back({{"run", r.id},
                                     {"generation", r.generation},
                                     {"first_rank", s.first_rank},
                                     {"ranks", s.ranks},
                                     {"world", r.dp},
                                     {"slots", s.slots},
                                     {"rendezvous", rendezvous},
                                     {"config", r.config_toml},
                                     {"out_dir", r.out_dir},
                                     {"zero", r.zero},
                                     {"max_steps", r.max_steps},
                                     {"backend", r.backend},
                                     {"resume", resume_dir}});
      r.shares.push_back(std::move(s));
    }
    return Status();
  }

  // What a restarted coordinator needs to know of the run beyond its config (runs.options).
  static json run_options(const Run& r) {
    return {{"dp", r.dp},
            {"zero", r.zero},
            {"max_steps", r.max_steps},
            {"db_world", r.db_world},
            {"generation", r.generation},
            {"straggler", straggler_watch_options_json(r.straggler.options())},
            {"checkpoint_every_steps", r.checkpoint_policy.options().every_steps},
            {"keep_last", r.checkpoint_policy.options().keep_last}};
  }

  // The runs of the database, as they were when the last coordinator on this folder ended. A run that was
  // live then (running, paused or stopping: a crash, a kill -9) is interrupted now, with why; its steps,
  // events and checkpoints are all there, and resume-from continues it. Called by start(), before serving.
  Status restore_runs() {
    std::vector<RunRow> rows;
    {
      std::lock_guard<std::mutex> db_lock(db_mu);
      if (!db->list_runs(&rows)) return Status::error("cannot read the runs of the database: " + db->error());
    }
    std::lock_guard<std::mutex> lock(mu);
    for (const RunRow& row : rows) {
      Run& r = runs[row.id];
      r.id = row.id;
      r.name = row.info.name;
      r.config_toml = row.info.config;
      r.out_dir = row.info.out_dir.empty() ? (fs::absolute(opt.dir) / "runs" / std::to_string(row.id)).string()
                                            : row.info.out_dir;
      r.created_unix = row.info.created_unix_s;
      r.last_step = row.last_step;
      r.message = row.message;
      r.db_world = row.info.world_size;
      r.dp = row.info.world_size;
      const json o = json::parse(row.info.options, nullptr, false);
      if (o.is_object()) {
        r.dp = o.value("dp", r.dp);
        r.zero = o.value("zero", 0);
        r.max_steps = o.value("max_steps", int64_t{-1});
        r.db_world = o.value("db_world", r.db_world);
        r.generation = o.value("generation", 0);
        const json straggler = o.value("straggler", json::object());
        Result<StragglerWatchOptions> so = straggler_watch_parse(&straggler);
        if (so.ok()) r.straggler = StragglerWatch(so.value());
        r.checkpoint_policy = CheckpointPolicy({.every_steps = o.value("checkpoint_every_steps", int64_t{0}),
                                                .keep_last = o.value("keep_last", 0)});
      }
      Result<Config> cfg = config_parse(r.config_toml, "config");
      r.backend = cfg.ok() ? cfg->train.backend : "cpu";
      r.latest.assign(static_cast<size_t>(std::max(r.dp, 1)), RankStepRecord{});
      if (r.last_step >= 0) {
        std::vector<StepRecord> last;
        std::lock_guard<std::mutex> db_lock(db_mu);
        if (db->read_steps(r.id, r.last_step, r.last_step + 1, 1, &last) && !last.empty()) r.latest_step = last.front();
      }
      if (row.status != RunStatus::running) {
        // As recorded (loaded, not a change): the database's words are the lifecycle's ended states.
        r.state = run_state_from_name(run_status_name(row.status)).value_or(RunState::kInterrupted);
        continue;
      }
      set_state(r, RunState::kInterrupted);
      r.message = "the coordinator went away while the run was live (at step " + std::to_string(r.last_step) +
                  "), and a new one started on " + opt.dir + ": resume-from continues it from its newest checkpoint";
      writer->push_op([id = r.id, m = r.message](HistoryDb& d) { d.finish_run(id, RunStatus::interrupted, m); });
      event(r.id, "run_interrupted", "run " + std::to_string(r.id) + " interrupted: " + r.message,
            {{"state", run_state_name(RunState::kInterrupted)}}, r.last_step);
    }
    return Status();
  }

  // A coordinator told to stop (SIGTERM, `down`): its live runs are interrupted, so that the next one on
  // this folder shows them so at once; their agents stop them.
  void interrupt_live_runs() {
    std::lock_guard<std::mutex> lock(mu);
    for (auto& [id, r] : runs) {
      if (run_state_terminal(r.state)) continue;
      set_state(r, RunState::kInterrupted);
      r.message = "the coordinator was stopped while the run was live (at step " + std::to_string(r.last_step) +
                  "): resume-from continues it from its newest checkpoint";
      r.store.reset();
      writer->push_op([id = r.id, m = r.message](HistoryDb& d) { d.finish_run(id, RunStatus::interrupted, m); });
      event(r.id, "run_interrupted", "run " + std::to_string(r.id) + " interrupted: " + r.message,
            {{"state", run_state_name(RunState::kInterrupted)}}, r.last_step);
    }
  }

  static std::string one_line(std::string text) {
    for (size_t k; (k = text.find('\n')) != std::string::npos;) text.replace(k, 1, "; ");
    while (!text.empty() && (text.back() == ' ' || text.back() == ';')) text.pop_back();
    return text;
  }

  // The checkpoint a caller names, resolved inside the run's own checkpoints folder and nowhere else: "latest",
  // a step number, or the name of one committed step_* directory there. A path, "..", or anything not among
  // the run's committed checkpoints is refused (the API never reads a path the caller names).
  Result<std::pair<std::string, int64_t>> resolve_checkpoint(const Run& r, const json& spec) const {
    const std::string root = r.out_dir + "/checkpoints";
    const std::vector<std::string> all = checkpoint_list(root);  // committed, oldest first
    const std::string hint = "; GET /v1/runs/" + std::to_string(r.id) + "/checkpoints lists them";
    const auto step_of = checkpoint_dir_step;
    if (all.empty()) return Status::error("run " + std::to_string(r.id) + " has no committed checkpoint to resume from");
    if (spec.is_number_integer()) {
      const int64_t want = spec.get<int64_t>();
      for (const std::string& d : all)
        if (step_of(d) == want) return std::pair{d, want};
      return Status::error("field \"checkpoint\": run " + std::to_string(r.id) + " has no committed checkpoint at step " +
                           std::to_string(want) + " (it has steps " + std::to_string(step_of(all.front())) + ".." +
                           std::to_string(step_of(all.back())) + ")" + hint);
    }
    if (!spec.is_string()) {
      return Status::error("field \"checkpoint\": expected \"latest\", a step number or a checkpoint's directory name, got " +
                           json_type_phrase(spec));
    }
    const std::string name = spec.get<std::string>();
    if (name == "latest") return std::pair{all.back(), step_of(all.back())};
    if (name.empty() || name.find('/') != std::string::npos || name == "." || name == ".." ||
        name.find('\0') != std::string::npos) {
      return Status::error("field \"checkpoint\": \"" + name + "\" is not a checkpoint of run " + std::to_string(r.id) +
                           ": give \"latest\", a step number, or the name of a directory under the run's checkpoints "
                           "(such as \"" + fs::path(all.back()).filename().string() + "\"), never a path" + hint);
    }
    for (const std::string& d : all)
      if (fs::path(d).filename() == name) return std::pair{d, step_of(d)};
    return Status::error("field \"checkpoint\": run " + std::to_string(r.id) + " has no committed checkpoint named \"" +
                         name + "\"" + hint);
  }

  // After every share of a moving run has ended: place it again without the quarantined node (a spare if
  // one is registered, else the largest dp that fits and divides train.global_batch) and resume it from
  // the stop's checkpoint. A run that cannot be placed fails, saying why.
  void relocate(Run& r) {
    const std::string node = std::exchange(r.relocate_node, "");
    r.store.reset();
    event(r.id, "quarantine_stopped", "run " + std::to_string(r.id) + " stopped to leave quarantined node " + node,
          {{"node", node}}, r.last_step, node);
    auto fail = [&](const std::string& why) {
      set_state(r, RunState::kFailed);
      r.message = "could not be moved off quarantined node " + node + ": " + why;
      writer->push_op([id = r.id, m = r.message](HistoryDb& d) { d.finish_run(id, RunStatus::failed, m); });
      event(r.id, "run_failed", "run " + std::to_string(r.id) + " failed: " + r.message,
            {{"state", run_state_name(RunState::kFailed)}});
    };
    std::string dir = std::exchange(r.relocate_checkpoint, "");
    if (dir.empty()) {
      Result<std::string> latest = checkpoint_latest(r.out_dir + "/checkpoints");
      if (!latest.ok()) return fail(latest.error());
      dir = latest.value();
    }
    Result<Config> cfg = config_parse(r.config_toml, "config");
    if (!cfg.ok()) return fail(cfg.error());
    const std::vector<PlacementNode> pn = placement_nodes();
    Result<Placement> p = placement_assign(pn, {.dp = r.dp});
    int dp = r.dp;
    for (int d = r.dp - 1; !p.ok() && d >= 1; --d) {
      if (cfg->train.global_batch % d != 0) continue;
      Result<Placement> q = placement_assign(pn, {.dp = d});
      if (q.ok()) {
        p = std::move(q);
        dp = d;
      }
    }
    if (!p.ok()) return fail(p.error());
    const int old_dp = r.dp;
    r.dp = dp;
    if (Status s = start_generation(r, pn, p.value(), dir); !s.ok()) return fail(s.message());
    set_state(r, RunState::kRunning);
    r.message.clear();
    const int64_t step = checkpoint_dir_step(dir);
    writer->push_op([id = r.id, step](HistoryDb& d) { d.rewind_run(id, step); });
    r.last_step = step;
    r.resumed_from = step;
    r.resume_kind = "quarantine";
    r.checkpoint_policy.restart_at(step);
    event(r.id, "quarantine_placed",
          "dp " + std::to_string(old_dp) + " -> " + std::to_string(dp) + ": " + one_line(placement_describe(pn, p.value())),
          {{"dp", dp}, {"previous_dp", old_dp}, {"spares_used", p->spares_used()}, {"checkpoint", dir}}, step);
  }

  // ---- routes -------------------------------------------------------------------------------------------

  HttpResponse cluster() {
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
    return HttpResponse::ok({{"nodes", ns}, {"slots", slots}, {"busy_slots", busy}, {"runs_live", live},
                             {"runs", runs.size()}, {"url", server->url()}});
  }

  HttpResponse submit(const HttpRequest& req) {
    JsonFields f(req.body);
    std::optional<std::string> toml = f.string("config");
    std::optional<std::string> name = f.string("name", JsonFields::optional);
    std::optional<int64_t> max_steps = f.integer("max_steps", 0, int64_t{1} << 40, JsonFields::optional);
    const json* layout = f.object("layout");
    const json* straggler = f.object("straggler", JsonFields::optional);
    std::optional<int64_t> every = f.integer("checkpoint_every_steps", 1, int64_t{1} << 40, JsonFields::optional);
    std::optional<int64_t> keep_last = f.integer("keep_last", 1, 100000, JsonFields::optional);
    std::optional<int64_t> dp, zero, tp, pp;
    if (layout != nullptr) {
      JsonFields l(*layout, "layout.");
      dp = l.integer("dp", 1, 1 << 20);
      zero = l.integer("zero", 0, 3, JsonFields::optional);
      tp = l.integer("tp", 1, 1, JsonFields::optional);  // tp and pp are not trained yet: only 1 is accepted
      pp = l.integer("pp", 1, 1, JsonFields::optional);
      if (Status s = l.finish(); !s.ok()) return HttpResponse::error(400, s.message());
    }
    if (Status s = f.finish(); !s.ok()) return HttpResponse::error(400, s.message());
    Result<StragglerWatchOptions> straggler_options = straggler_watch_parse(straggler);
    if (!straggler_options.ok()) return HttpResponse::error(400, straggler_options.error());
    Result<Config> cfg = config_parse(*toml, "config");
    if (!cfg.ok()) return HttpResponse::error(400, "field \"config\": " + cfg.error());
    if (name) {
      if (Status s = check_name("name", *name, kMaxRunName); !s.ok()) return HttpResponse::error(400, s.message());
    }
    if (Status s = train_layout_check(cfg.value(), static_cast<int>(*dp)); !s.ok()) {
      return HttpResponse::error(400, "field \"layout.dp\": " + s.message());
    }

    std::lock_guard<std::mutex> lock(mu);
    std::vector<PlacementNode> pn = placement_nodes();
    Result<Placement> p = placement_assign(pn, {.dp = static_cast<int>(*dp)});
    if (!p.ok()) return HttpResponse::error(409, p.error());  // nothing started, nothing recorded

    const std::string run_name = name.value_or(std::string("run"));
    const std::string layout_text = "dp=" + std::to_string(*dp) + " tp=1 pp=1 zero=" + std::to_string(zero.value_or(0));
    int64_t id = -1;
    {
      // The one write not queued: the run's id comes from the database. Records of the run come later.
      std::lock_guard<std::mutex> db_lock(db_mu);
      Run draft;  // the options as run_options() writes them; the run itself is made once it has its id
      draft.dp = draft.db_world = static_cast<int>(*dp);
      draft.zero = static_cast<int>(zero.value_or(0));
      draft.max_steps = max_steps.value_or(-1);
      draft.straggler = StragglerWatch(straggler_options.value());
      draft.checkpoint_policy =
          CheckpointPolicy({.every_steps = every.value_or(0), .keep_last = static_cast<int>(keep_last.value_or(0))});
      id = db->begin_run({.name = run_name,
                          .world_size = static_cast<int32_t>(*dp),
                          .config = *toml,
                          .layout = layout_text,
                          .options = run_options(draft).dump()});
      if (id < 0) return HttpResponse::error(500, "cannot record the run: " + db->error());
    }
    Run& r = runs[id];
    r.id = id;
    r.name = run_name;
    r.dp = static_cast<int>(*dp);
    r.zero = static_cast<int>(zero.value_or(0));
    r.max_steps = max_steps.value_or(-1);
    r.straggler = StragglerWatch(straggler_options.value());
    r.checkpoint_policy = CheckpointPolicy({.every_steps = every.value_or(0), .keep_last = static_cast<int>(keep_last.value_or(0))});
    r.config_toml = *toml;
    r.backend = cfg->train.backend;
    r.created_unix = now_unix_s();
    r.out_dir = (fs::absolute(opt.dir) / "runs" / std::to_string(id)).string();
    std::error_code ec;
    fs::create_directories(r.out_dir, ec);
    if (ec) return HttpResponse::error(500, "cannot create the run folder " + r.out_dir + ": " + ec.message());
    std::ofstream(r.out_dir + "/config.toml") << *toml;
    r.db_world = r.dp;
    if (Status st = start_generation(r, pn, p.value(), ""); !st.ok()) {
      set_state(r, RunState::kFailed);
      r.message = st.message();
      writer->push_op([id, m = r.message](HistoryDb& d) { d.finish_run(id, RunStatus::failed, m); });
      return HttpResponse::error(500, st.message());
    }
    event(id, "submitted", "run " + std::to_string(id) + " submitted by " + req.remote + ": " + layout_text,
          {{"from", req.remote}, {"layout", layout_text}});
    // placement_describe gives a line per node; an event message is one line.
    event(id, "placed", one_line(placement_describe(pn, p.value())), {{"spares_used", p->spares_used()}});
    return HttpResponse::ok(run_json(r, false), 201);
  }

  HttpResponse action(const HttpRequest& req, TrainAction a) {
    std::lock_guard<std::mutex> lock(mu);
    HttpResponse err;
    Run* r = find_run(req, &err);
    if (r == nullptr) return err;
    const char* what = train_action_name(a);
    const RunAction ra = run_action_of(a);
    if (Status s = run_action_check(ra, r->state); !s.ok()) {
      return HttpResponse::error(
          409, std::string("cannot ") + what + " run " + std::to_string(r->id) + ": " + s.message());
    }
    const uint64_t request = queue_action(*r, a, "api", req.remote);
    if (std::optional<RunState> to = run_action_target(ra)) set_state(*r, *to);
    return HttpResponse::ok({{"run", r->id}, {"action", what}, {"request", request}}, 202);
  }

  // The run's id and world, under mu; the database is then read without it (reads take db_mu only).
  struct RunKey {
    int64_t id = -1;
    int dp = 0;
  };
  RunKey run_key(const HttpRequest& req, HttpResponse* err) {
    std::lock_guard<std::mutex> lock(mu);
    Run* r = find_run(req, err);
    return r == nullptr ? RunKey{} : RunKey{r->id, r->dp};
  }

  // A read sees every write the coordinator accepted before it (the writer's queue is drained up to now).
  std::unique_lock<std::mutex> read_lock() {
    writer->flush();
    return std::unique_lock<std::mutex>(db_mu);
  }

  HttpResponse steps(const HttpRequest& req) {
    HttpResponse err;
    const RunKey key = run_key(req, &err);
    if (key.id < 0) return err;
    const RunKey* r = &key;
    Result<int64_t> after = parse_int_query(req, "after", -1, kStepEnd - 1, 0);
    Result<int64_t> buckets = parse_int_query(req, "buckets", 1, 100000, 0);
    Result<int64_t> limit = parse_int_query(req, "limit", 1, 100000, 1000);
    for (const auto* x : {&after, &buckets, &limit})
      if (!x->ok()) return HttpResponse::error(400, x->error());
    std::vector<int32_t> ranks;
    const std::optional<std::string> ranks_text = req.query_value("ranks");
    if (ranks_text) {
      Result<std::vector<int32_t>> rk = parse_ranks(*ranks_text, r->dp);
      if (!rk.ok()) return HttpResponse::error(400, rk.error());
      ranks = rk.value();
    }
    const int64_t begin = after.value() + 1;  // steps after `after`
    json out = {{"run", r->id}, {"after", after.value()}};
    std::unique_lock<std::mutex> db_lock = read_lock();
    if (buckets.value() > 0) {
      BandResult loss, total;
      if (!db->query_step_band(r->id, StepMetric::loss, begin, kStepEnd, static_cast<int32_t>(buckets.value()), &loss) ||
          !db->query_band({.run_id = r->id, .metric = RankMetric::total, .step_begin = begin, .ranks = ranks,
                           .max_buckets = static_cast<int32_t>(buckets.value())},
                          &total)) {
        return HttpResponse::error(500, "cannot read the run's steps: " + db->error());
      }
      auto buckets_json = [](const BandResult& b) {
        json a = json::array();
        for (const Bucket& k : b.buckets) {
          a.push_back({{"step_begin", k.step_begin}, {"step_end", k.step_end}, {"count", k.count}, {"min", k.min},
                       {"max", k.max}, {"max_rank", k.max_rank}, {"mean", k.mean}, {"last", k.last}});
        }
        return a;
      };
      out["bucket_steps"] = loss.bucket_steps;
      out["loss"] = buckets_json(loss);
      out["step_seconds"] = buckets_json(total);
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

  HttpResponse ranks(const HttpRequest& req) {
    std::lock_guard<std::mutex> lock(mu);
    HttpResponse err;
    Run* r = find_run(req, &err);
    if (r == nullptr) return err;
    json out = json::array();
    for (const NodeShare& s : r->shares) {
      for (int k = 0; k < s.ranks; ++k) {
        const int rank = s.first_rank + k;
        const RankStepRecord& last = r->latest[static_cast<size_t>(rank)];
        out.push_back({{"rank", rank}, {"node", s.node}, {"slot", s.slots[static_cast<size_t>(k)]}, {"local_rank", k},
                       {"last_step", last.step}, {"host", last.host}, {"step_seconds", last.total_s},
                       {"done", s.done}, {"straggler", r->straggler.rank_json(rank)}});
      }
    }
    return HttpResponse::ok({{"run", r->id}, {"generation", r->generation}, {"ranks", out},
                             {"straggler", r->straggler.summary_json()}});
  }

  HttpResponse checkpoints(const HttpRequest& req) {
    HttpResponse err;
    const RunKey r = run_key(req, &err);
    if (r.id < 0) return err;
    std::vector<CheckpointInfo> cs;
    {
      std::unique_lock<std::mutex> db_lock = read_lock();
      if (!db->list_checkpoints(r.id, &cs)) return HttpResponse::error(500, "cannot list checkpoints: " + db->error());
    }
    json out = json::array();
    for (const CheckpointInfo& c : cs) {
      out.push_back({{"step", c.step}, {"path", c.path}, {"bytes", c.bytes}, {"write_s", c.write_s},
                     {"state", c.state}, {"time_unix_s", c.time_unix_s}});
    }
    return HttpResponse::ok({{"run", r.id}, {"checkpoints", out}});
  }

  HttpResponse events(const HttpRequest& req) {
    int64_t run_id = 0;
    {
      std::lock_guard<std::mutex> lock(mu);
      HttpResponse err;
      Run* r = find_run(req, &err);
      if (r == nullptr) return err;
      run_id = r->id;
    }
    int64_t cursor = 0;
    if (!req.last_event_id.empty()) cursor = std::strtoll(req.last_event_id.c_str(), nullptr, 10);
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
        if (!w.send({.id = std::to_string(e.id), .event = e.event.kind, .data = record_to_json(e.event)})) return false;
        cursor = e.id;
      }
      // A finished run's stream ends once it has sent everything, so `ctl events` returns.
      return !ended;
    });
  }

  HttpResponse metrics() {
    std::lock_guard<std::mutex> lock(mu);
    PrometheusWriter w;
    w.family("gantry_cluster_nodes", MetricType::gauge, "Registered nodes by state.");
    for (NodeState s : {NodeState::healthy, NodeState::quarantined, NodeState::lost, NodeState::spare}) {
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
    w.family("gantry_ingest_queued_records", MetricType::gauge, "Agents' records waiting for the database writer.");
    w.sample({}, static_cast<double>(ws.queued_records));
    w.family("gantry_ingest_transactions_total", MetricType::counter, "Database transactions of records committed.");
    w.sample({}, static_cast<double>(ws.transactions));
    w.family("gantry_ingest_written_records_total", MetricType::counter, "Records written to the run database.");
    w.sample({}, static_cast<double>(ws.records));
    w.family("gantry_ingest_refused_beats_total", MetricType::counter, "Heartbeats refused (503) while the writer was behind.");
    w.sample({}, static_cast<double>(ws.refused_batches));
    w.family("gantry_ingest_failed_records_total", MetricType::counter, "Records the database refused.");
    w.sample({}, static_cast<double>(ws.failed_records));
    w.family("gantry_run_step", MetricType::gauge, "Latest optimizer step of each live run.");
    for (const auto& [id, r] : runs)
      if (!run_state_terminal(r.state)) w.sample({{"run", std::to_string(id)}}, static_cast<double>(r.last_step));
    w.family("gantry_run_loss", MetricType::gauge, "Training loss at the latest step of each live run.");
    for (const auto& [id, r] : runs)
      if (!run_state_terminal(r.state) && r.last_step >= 0) w.sample({{"run", std::to_string(id)}}, r.latest_step.loss);
    w.family("gantry_run_stragglers", MetricType::gauge, "Ranks of each live run flagged as stragglers.");
    for (const auto& [id, r] : runs)
      if (!run_state_terminal(r.state)) w.sample({{"run", std::to_string(id)}}, r.straggler.flagged_count());
    if (!w.ok()) return HttpResponse::error(500, "metrics: " + w.error());
    return HttpResponse::plain(w.text(), std::string(kPrometheusContentType));
  }

  // ---- nodes and resumes ---------------------------------------------------------------------------------

  // The node a POST /v1/nodes/{id}/... names (its body must be empty JSON); null with the answer in *fail.
  // Called with mu held.
  Node* requested_node(const HttpRequest& req, HttpResponse* fail) {
    JsonFields f(req.body);
    if (Status s = f.finish(); !s.ok()) {
      *fail = HttpResponse::error(400, s.message());
      return nullptr;
    }
    const std::string& id = req.param("id");
    auto it = nodes.find(id);
    if (it == nodes.end()) {
      *fail = HttpResponse::error(404, "no node \"" + id + "\" (GET /v1/cluster lists them)");
      return nullptr;
    }
    return &it->second;
  }

  // Quarantine: the node takes no new work, and each live run on it moves: a stop at the next step
  // boundary (whose checkpoint every rank writes), then, once every gang has ended, placement without the
  // node and a resume from that checkpoint (relocate()). 202: the move is under way; its stages are events.
  HttpResponse quarantine(const HttpRequest& req) {
    std::lock_guard<std::mutex> lock(mu);
    HttpResponse fail;
    Node* node = requested_node(req, &fail);
    if (node == nullptr) return fail;
    Node& n = *node;
    const std::string& id = req.param("id");
    if (n.state == NodeState::quarantined) return HttpResponse::error(409, "node \"" + id + "\" is already quarantined");
    n.state = NodeState::quarantined;
    upsert_node(n, "quarantined");
    json moving = json::array();
    for (auto& [rid, r] : runs) {
      if (!run_action_check(RunAction::kQuarantineMove, r.state).ok()) continue;  // ending anyway: no move
      bool here = false;
      for (const NodeShare& s : r.shares) here = here || (s.node == id && !s.done);
      if (!here) continue;
      const uint64_t request = next_request++;
      nodes[r.shares.front().node].commands.push_back({{"run", r.id}, {"rank", 0}, {"action", static_cast<int>(TrainAction::stop)},
                                                       {"request", request}, {"from", "quarantine of " + id}});
      set_state(r, *run_action_target(RunAction::kQuarantineMove));
      r.relocate_node = id;
      r.relocate_checkpoint.clear();
      event(r.id, "quarantine_requested",
            "node " + id + " quarantined from " + req.remote + ": run " + std::to_string(r.id) +
                " checkpoints and stops at the next step boundary, then moves",
            {{"node", id}, {"from", req.remote}, {"request", request}}, r.last_step, id);
      moving.push_back(r.id);
    }
    return HttpResponse::ok({{"node", id}, {"state", "quarantined"}, {"moving_runs", moving}}, 202);
  }

  HttpResponse release(const HttpRequest& req) {
    std::lock_guard<std::mutex> lock(mu);
    HttpResponse fail;
    Node* node = requested_node(req, &fail);
    if (node == nullptr) return fail;
    Node& n = *node;
    const std::string& id = req.param("id");
    if (n.state != NodeState::quarantined) {
      return HttpResponse::error(409, "node \"" + id + "\" is " + std::string(node_state_name(n.state)) + ", not quarantined");
    }
    n.state = n.spare ? NodeState::spare : NodeState::healthy;
    upsert_node(n, "ok");
    return HttpResponse::ok({{"node", id}, {"state", node_state_name(n.state)}});
  }

  // A stopped or failed run goes on from one of its own checkpoints, under the same run id (its steps
  // continue the same curve; steps past the checkpoint are forgotten and trained again), on the same
  // layout or another one: the checkpoint reshards to any dp and ZeRO stage.
  HttpResponse resume_from(const HttpRequest& req) {
    JsonFields f(req.body);
    const json* ckpt = f.any("checkpoint");
    const json* layout = f.object("layout", JsonFields::optional);
    std::optional<int64_t> dp, zero;
    if (layout != nullptr) {
      JsonFields l(*layout, "layout.");
      dp = l.integer("dp", 1, 1 << 20, JsonFields::optional);
      zero = l.integer("zero", 0, 3, JsonFields::optional);
      l.integer("tp", 1, 1, JsonFields::optional);  // tp and pp are not trained yet: only 1 is accepted
      l.integer("pp", 1, 1, JsonFields::optional);
      if (Status s = l.finish(); !s.ok()) return HttpResponse::error(400, s.message());
    }
    if (Status s = f.finish(); !s.ok()) return HttpResponse::error(400, s.message());
    std::lock_guard<std::mutex> lock(mu);
    HttpResponse err;
    Run* r = find_run(req, &err);
    if (r == nullptr) return err;
    if (Status s = run_action_check(RunAction::kResumeFrom, r->state); !s.ok()) {
      return HttpResponse::error(
          409, "cannot resume run " + std::to_string(r->id) + " from a checkpoint: " + s.message());
    }
    Result<std::pair<std::string, int64_t>> c = resolve_checkpoint(*r, *ckpt);
    if (!c.ok()) return HttpResponse::error(400, c.error());
    const int new_dp = static_cast<int>(dp.value_or(r->dp));
    Result<Config> cfg = config_parse(r->config_toml, "config");
    if (!cfg.ok()) return HttpResponse::error(500, "the run's config no longer parses: " + cfg.error());
    if (cfg->train.global_batch % new_dp != 0) {
      return HttpResponse::error(400, "field \"layout.dp\": " + std::to_string(new_dp) + " does not divide the run's train.global_batch = " +
                                          std::to_string(cfg->train.global_batch));
    }
    if (new_dp > r->db_world) {
      return HttpResponse::error(400, "field \"layout.dp\": run " + std::to_string(r->id) + " was recorded for at most " +
                                          std::to_string(r->db_world) + " ranks; resume it on dp <= " + std::to_string(r->db_world) +
                                          ", or submit a new run for a larger layout");
    }
    const std::vector<PlacementNode> pn = placement_nodes();
    Result<Placement> p = placement_assign(pn, {.dp = new_dp});
    if (!p.ok()) return HttpResponse::error(409, p.error());  // nothing started, nothing changed
    const int old_dp = r->dp, old_zero = r->zero;
    r->dp = new_dp;
    r->zero = static_cast<int>(zero.value_or(r->zero));
    if (Status s = start_generation(*r, pn, p.value(), c->first); !s.ok()) {
      r->dp = old_dp;
      r->zero = old_zero;
      return HttpResponse::error(500, s.message());
    }
    const int64_t step = c->second;
    writer->push_op([id = r->id, step](HistoryDb& d) { d.rewind_run(id, step); });
    set_state(*r, *run_action_target(RunAction::kResumeFrom));
    r->message.clear();
    r->last_step = step;
    r->resumed_from = step;
    r->resume_kind = "resume";
    r->checkpoint_policy.restart_at(step);
    const std::string layout_text = "dp=" + std::to_string(r->dp) + " zero=" + std::to_string(r->zero);
    event(r->id, "resume_requested",
          "resume from " + fs::path(c->first).filename().string() + " on " + layout_text + " requested from " + req.remote,
          {{"from", req.remote}, {"checkpoint", c->first}, {"step", step}, {"layout", layout_text}}, step);
    event(r->id, "resume_placed", one_line(placement_describe(pn, p.value())),
          {{"dp", r->dp}, {"previous_dp", old_dp}, {"spares_used", p->spares_used()}}, step);
    json out = run_json(*r, false);
    out["checkpoint"] = c->first;
    out["from_step"] = step;
    return HttpResponse::ok(out, 202);
  }

  // ---- the agents' side ---------------------------------------------------------------------------------

  // The server's second chance for a request the operator's token did not open (HttpServerOptions::
  // also_accept): the join token registers a node; a node's credential sends that node's heartbeats.
  bool agent_may(const std::string& method, const std::string& path, std::string_view token) {
    if (method != "POST") return false;
    if (path == "/v1/agents") return !opt.agent_token.empty() && token_equal(token, opt.agent_token);
    static const std::string prefix = "/v1/agents/", suffix = "/heartbeat";
    if (path.size() <= prefix.size() + suffix.size() || path.rfind(prefix, 0) != 0 ||
        path.compare(path.size() - suffix.size(), suffix.size(), suffix) != 0) {
      return false;
    }
    const std::string node = path.substr(prefix.size(), path.size() - prefix.size() - suffix.size());
    std::lock_guard<std::mutex> lock(mu);
    auto it = nodes.find(node);
    return it != nodes.end() && !it->second.credential.empty() && token_equal(token, it->second.credential);
  }

  HttpResponse agent_register(const HttpRequest& req) {
    JsonFields f(req.body);
    std::optional<std::string> id = f.string("node");
    std::optional<int64_t> slots = f.integer("slots", 1, 4096);
    std::optional<int64_t> pid = f.integer("pid", 0, INT64_MAX, JsonFields::optional);
    std::optional<std::string> host = f.string("host", JsonFields::optional);
    std::optional<bool> spare = f.boolean("spare", JsonFields::optional);
    std::optional<std::string> metrics_url = f.string("metrics_url", JsonFields::optional);
    if (Status s = f.finish(); !s.ok()) return HttpResponse::error(400, s.message());
    if (Status s = check_name("node", *id, kMaxNodeName); !s.ok()) return HttpResponse::error(400, s.message());
    if (metrics_url && (metrics_url->size() > 2048 || (metrics_url->rfind("http://", 0) != 0 && metrics_url->rfind("https://", 0) != 0))) {
      return HttpResponse::error(400, "field \"metrics_url\": expected an http:// or https:// URL of at most 2048 characters");
    }
    std::lock_guard<std::mutex> lock(mu);
    Node& n = nodes[*id];
    const bool back = n.id == *id;
    if (back && n.state != NodeState::lost && pid.value_or(0) != n.pid) {
      return HttpResponse::error(409, "node \"" + *id + "\" is already registered by another agent (pid " +
                                          std::to_string(n.pid) + "): give each agent its own --node");
    }
    n.id = *id;
    n.slots = static_cast<int>(*slots);
    n.pid = pid.value_or(0);
    n.host = host.value_or("");
    n.metrics_url = metrics_url.value_or("");
    // A fresh credential each registration: a restarted agent's predecessor's is void.
    Result<std::string> credential = token_generate();
    if (!credential.ok()) return HttpResponse::error(500, "cannot make the node's credential: " + credential.error());
    n.credential = credential.value();
    n.spare = spare.value_or(false);
    if (!back) n.state = n.spare ? NodeState::spare : NodeState::healthy;
    if (n.state == NodeState::lost) n.state = n.spare ? NodeState::spare : NodeState::healthy;  // a quarantine stays
    n.last_seen = Clock::now();
    n.last_seen_unix = now_unix_s();
    upsert_node(n, "ok");
    return HttpResponse::ok({{"node", n.id}, {"heartbeat_ms", opt.heartbeat.count()}, {"credential", n.credential}});
  }

  HttpResponse agent_heartbeat(const HttpRequest& req) {
    const std::string& id = req.param("node");
    JsonFields f(req.body);
    const json* records = f.object("records", JsonFields::optional);
    const json* ended = f.any("ended", JsonFields::optional);
    if (Status s = f.finish(); !s.ok()) return HttpResponse::error(400, s.message());
    RecordBatch batch;
    if (records != nullptr) {
      std::string error;
      if (!record_from_json(records->dump(), &batch, &error)) return HttpResponse::error(400, "field \"records\": " + error);
    }
    std::lock_guard<std::mutex> lock(mu);
    auto it = nodes.find(id);
    if (it == nodes.end()) return HttpResponse::error(404, "node \"" + id + "\" is not registered (register first)");
    Node& n = it->second;
    n.last_seen = Clock::now();
    n.last_seen_unix = now_unix_s();
    if (n.state == NodeState::lost) n.state = n.spare ? NodeState::spare : NodeState::healthy;
    // Backpressure: with the database writer this far behind, the beat is refused whole (its records and
    // its gangs' ends; the agent keeps both for its next beat) rather than queued without bound.
    const size_t reserved = batch.size();
    if (!writer->reserve(reserved)) {
      return HttpResponse::error(503, "the coordinator's database writer is behind (" +
                                          std::to_string(writer->stats().queued_records) +
                                          " records queued): this beat was not taken; send it again");
    }
    ingest(batch, reserved);
    if (ended != nullptr && ended->is_array()) {
      for (const json& e : *ended) {
        const int64_t run_id = e.value("run", int64_t{-1});
        auto rit = runs.find(run_id);
        if (rit == runs.end()) continue;
        Run& r = rit->second;
        if (e.value("generation", 0) != r.generation) continue;  // a late word of an earlier placement
        for (NodeShare& s : r.shares) {
          if (s.node != id || s.done) continue;
          s.done = true;
          s.code = e.value("code", 1);
          s.error = e.value("error", "");
          s.final_message = e.value("final_message", "");
          s.cause_rank = e.value("cause_rank", -1);
          s.agent_stopping = e.value("agent_stopping", false);
          if (s.code != 0 && s.code != 130) {
            // One node's gang failed: the others cannot finish a collective without it.
            event(r.id, "node_failed", id + ": " + s.error, {{"code", s.code}}, -1, id);
            stop_shares(r, id);
          }
        }
        maybe_finish(r);
      }
    }
    json reply = {{"start", std::exchange(n.start, json::array())},
                  {"commands", std::exchange(n.commands, json::array())},
                  {"stop", std::exchange(n.stop, json::array())}};
    return HttpResponse::ok(reply);
  }

  // Records from an agent (hold mu): the run's live state from them, then to the database writer's queue
  // (`reserved` records were reserved there for them).
  void ingest(RecordBatch& batch, size_t reserved) {
    if (batch.empty()) return writer->push(RecordBatch(), reserved);
    records_total += batch.size();
    RecordBatch keep;
    for (RankStepRecord& rs : batch.rank_steps) {
      auto it = runs.find(rs.run_id);
      if (it == runs.end() || rs.rank < 0 || rs.rank >= it->second.dp) continue;
      it->second.latest[static_cast<size_t>(rs.rank)] = rs;
      it->second.straggler.add(rs);
      keep.rank_steps.push_back(std::move(rs));
    }
    for (StepRecord& s : batch.steps) {
      auto it = runs.find(s.run_id);
      if (it == runs.end()) continue;
      Run& r = it->second;
      if (r.resumed_from >= 0 && s.step > r.resumed_from && r.state != RunState::kStopping) {
        event(r.id, r.resume_kind + "_resumed",
              "run " + std::to_string(r.id) + " resumed at step " + std::to_string(s.step) + " on dp " + std::to_string(r.dp) +
                  " (from the checkpoint at step " + std::to_string(r.resumed_from) + ")",
              {{"dp", r.dp}, {"zero", r.zero}, {"from_step", r.resumed_from}}, s.step);
        r.resumed_from = -1;
      }
      it->second.last_step = std::max(it->second.last_step, s.step);
      it->second.latest_step = s;
      // The checkpoint policy: only while the run trains (a pause holds it, a stop or a move checkpoints anyway).
      if (r.state == RunState::kRunning && r.relocate_node.empty() && r.checkpoint_policy.due(s.step)) {
        queue_action(r, TrainAction::checkpoint, "policy",
                     "checkpoint policy (every " + std::to_string(r.checkpoint_policy.options().every_steps) + " steps)");
      }
      keep.steps.push_back(s);
    }
    for (EventRecord& e : batch.events) {
      auto it = runs.find(e.run_id);
      if (it == runs.end()) continue;
      Run& r = it->second;
      if (e.rank == 0) {
        if (e.kind == "action_pause" && r.state == RunState::kRunning) set_state(r, RunState::kPaused);
        if (e.kind == "action_resume" && r.state == RunState::kPaused) set_state(r, RunState::kRunning);
        if (e.kind == "checkpoint") {
          json p = json::parse(e.payload, nullptr, false);
          if (p.is_object() && p.value("dir", "") != "") {
            writer->push_op([c = CheckpointInfo{.run_id = r.id, .step = e.step, .path = p.value("dir", ""),
                                                .bytes = p.value("bytes", uint64_t{0}), .write_s = p.value("seconds", 0.0),
                                                .time_unix_s = e.time_unix_s},
                             root = r.out_dir + "/checkpoints"](HistoryDb& d) {
              // The workers keep their last train.keep_checkpoints: the catalog says which went.
              std::vector<int64_t> on_disk;
              for (const std::string& dir : checkpoint_list(root)) on_disk.push_back(checkpoint_dir_step(dir));
              d.record_checkpoint(c);
              d.reconcile_checkpoints(c.run_id, on_disk);
            });
            prune_checkpoints(r);
            if (!r.relocate_node.empty()) {
              r.relocate_checkpoint = p.value("dir", "");
              event(r.id, "quarantine_checkpointed",
                    "run " + std::to_string(r.id) + " checkpointed at step " + std::to_string(e.step) + " to leave node " +
                        r.relocate_node,
                    {{"dir", r.relocate_checkpoint}, {"node", r.relocate_node}}, e.step);
            }
          }
        }
      }
      keep.events.push_back(std::move(e));
    }
    writer->push(std::move(keep), reserved);
    // The straggler policy: a run whose records reached its next evaluation step is scored now.
    for (auto& entry : runs) {
      Run& r = entry.second;  // a named reference: lambdas may not capture a structured binding (C++17)
      if (run_state_terminal(r.state)) continue;
      record(r.straggler.maybe_evaluate(r.id, now_unix_s(), [&r](int32_t rank) { return r.node_of(rank); }));
    }
  }

  // keep_last: once a newer checkpoint has committed, the run's older ones go, from its own folder only;
  // the catalog marks them deleted and each is an event. On the writer thread, after the new checkpoint's
  // catalog entry (queued just before): deleting files is no work for a heartbeat's handler.
  void prune_checkpoints(Run& r) {
    const int keep = r.checkpoint_policy.options().keep_last;
    if (keep <= 0) return;
    writer->push_op([id = r.id, root = r.out_dir + "/checkpoints", keep](HistoryDb& d) {
      RecordBatch b;
      auto ev = [&](const std::string& kind, const std::string& message, const json& payload, int64_t step) {
        b.events.push_back({.run_id = id, .time_unix_s = now_unix_s(), .step = step, .kind = kind, .message = message,
                            .payload = payload.dump()});
      };
      Result<std::vector<std::string>> gone = checkpoint_prune(root, keep);
      if (!gone.ok()) {
        ev("checkpoint_delete_failed", gone.error(), {{"source", "policy"}}, -1);
      } else {
        std::vector<int64_t> on_disk;
        for (const std::string& dir : checkpoint_list(root)) on_disk.push_back(checkpoint_dir_step(dir));
        d.reconcile_checkpoints(id, on_disk);
        for (const std::string& dir : gone.value()) {
          const int64_t step = checkpoint_dir_step(dir);
          ev("checkpoint_deleted", "deleted " + dir + " (keep_last " + std::to_string(keep) + ": newer checkpoints have committed)",
             {{"dir", dir}, {"step", step}, {"keep_last", keep}, {"source", "policy"}}, step);
        }
      }
      if (!b.empty() && !d.ingest(b)) std::fprintf(stderr, "gantry-engine coordinator: cannot record an event: %s\n", d.error().c_str());
    });
  }

  // Marks nodes lost whose heartbeats stopped, and stops their runs (automatic recovery is a later issue).
  void watch_loop() {
    while (!stopping.load()) {
      std::this_thread::sleep_for(100ms);
      std::lock_guard<std::mutex> lock(mu);
      const auto now = Clock::now();
      for (auto& [id, n] : nodes) {
        if (n.state == NodeState::lost || now - n.last_seen < opt.node_timeout) continue;
        n.state = NodeState::lost;
        upsert_node(n, "lost");
        for (auto& [rid, r] : runs) {
          if (run_state_terminal(r.state)) continue;
          for (NodeShare& s : r.shares) {
            if (s.node != id || s.done) continue;
            s.done = true;
            s.code = 1;
            s.error = "node lost (no heartbeat for " + std::to_string(opt.node_timeout.count()) + " ms)";
            event(rid, "node_lost", id + ": " + s.error, json::object(), -1, id);
            stop_shares(r, id);
          }
          maybe_finish(r);
        }
      }
    }
  }
};

Coordinator::Coordinator(CoordinatorOptions options) : impl_(std::make_unique<Impl>(std::move(options))) {}
Coordinator::~Coordinator() { stop(); }

Status Coordinator::start() {
  Impl& m = *impl_;
  if (!m.opt.agent_token.empty()) {
    if (Status s = token_check(m.opt.agent_token); !s.ok()) return Status::error("the agents' token: " + s.message());
    if (token_equal(m.opt.agent_token, m.opt.token)) {
      return Status::error("the agents' token is the operator's: give agents a token of their own (gantry-engine up writes one)");
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
  m.server = std::make_unique<HttpServer>(HttpServerOptions{.host = m.opt.host,
                                                            .port = m.opt.port,
                                                            .token = m.opt.token,
                                                            .max_body_bytes = m.opt.max_body_bytes,
                                                            // heartbeats never wait behind the public API
                                                            .private_lane_prefix = "/v1/agents",
                                                            .tls_cert_file = m.opt.tls_cert_file,
                                                            .tls_key_file = m.opt.tls_key_file,
                                                            .also_accept = [&m](const std::string& method, const std::string& path,
                                                                                std::string_view token) {
                                                              return m.agent_may(method, path, token);
                                                            }});
  HttpServer& s = *m.server;
  s.get("/v1/cluster", [&m](const HttpRequest&) { return m.cluster(); });
  s.get("/v1/runs", [&m](const HttpRequest&) {
    std::lock_guard<std::mutex> lock(m.mu);
    json out = json::array();
    for (const auto& [id, r] : m.runs) out.push_back(m.run_json(r, false));
    return HttpResponse::ok({{"runs", out}});
  });
  s.post("/v1/runs", [&m](const HttpRequest& req) { return m.submit(req); });
  s.get("/v1/runs/{id}", [&m](const HttpRequest& req) {
    std::lock_guard<std::mutex> lock(m.mu);
    HttpResponse err;
    Impl::Run* r = m.find_run(req, &err);
    return r == nullptr ? err : HttpResponse::ok(m.run_json(*r, true));
  });
  s.get("/v1/runs/{id}/steps", [&m](const HttpRequest& req) { return m.steps(req); });
  s.get("/v1/runs/{id}/ranks", [&m](const HttpRequest& req) { return m.ranks(req); });
  s.get("/v1/runs/{id}/checkpoints", [&m](const HttpRequest& req) { return m.checkpoints(req); });
  s.get("/v1/runs/{id}/events", [&m](const HttpRequest& req) { return m.events(req); });
  for (TrainAction a : {TrainAction::checkpoint, TrainAction::pause, TrainAction::resume, TrainAction::stop}) {
    s.post(std::string("/v1/runs/{id}/") + train_action_name(a), [&m, a](const HttpRequest& req) { return m.action(req, a); });
  }
  s.post("/v1/runs/{id}/resume-from", [&m](const HttpRequest& req) { return m.resume_from(req); });
  s.post("/v1/nodes/{id}/quarantine", [&m](const HttpRequest& req) { return m.quarantine(req); });
  s.post("/v1/nodes/{id}/release", [&m](const HttpRequest& req) { return m.release(req); });
  s.get("/metrics", [&m](const HttpRequest&) { return m.metrics(); });
  s.post("/v1/agents", [&m](const HttpRequest& req) { return m.agent_register(req); });
  s.post("/v1/agents/{node}/heartbeat", [&m](const HttpRequest& req) { return m.agent_heartbeat(req); });
  if (Status st = s.start(); !st.ok()) return st;
  m.watch = std::thread([&m] { m.watch_loop(); });
  return Status();
}

void Coordinator::stop() {
  Impl& m = *impl_;
  if (m.server) m.server->stop();
  if (m.writer && !m.stopping.load()) m.interrupt_live_runs();
  m.stopping.store(true);
  if (m.watch.joinable()) m.watch.join();
  if (m.writer) m.writer->stop();  // what was accepted is written before the database closes
}

std::string Coordinator::url() const { return impl_->server ? impl_->server->url() : ""; }

}  // namespace gantry
