// The coordinator's shared state, for its own files only (nothing outside engine/cluster includes this):
//   coordinator.cpp         start, stop, the route table, the helpers every part uses
//   coordinator_runs.cpp    the run lifecycle: submit, actions, state changes (run_lifecycle.h's rules),
//                           placement generations, a run's end, a quarantine's move, resume-from, restarts
//   coordinator_nodes.cpp   the node registry: agents' registration and heartbeats, quarantine and release,
//                           the health watch
//   coordinator_ingest.cpp  agents' records into each run's live state and the database writer, events,
//                           the checkpoint catalog and keep_last pruning
//   coordinator_views.cpp   the API's JSON replies: cluster, runs, steps, ranks, checkpoints, events, metrics
//   coordinator_goodput.cpp the goodput ledger's marks, its reply, and the young_daly checkpoint interval
//   coordinator_straggler.cpp the straggler policy changed while a run lives, and its quarantine action
//   coordinator_alerts.cpp  alert rules (their routes, their file) and their evaluation thread
// Member functions are called with `mu` held unless they say otherwise (the routes take it themselves).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "engine/cluster/alert_hook.h"
#include "engine/cluster/alert_rules.h"
#include "engine/cluster/checkpoint_policy.h"
#include "engine/cluster/coordinator.h"
#include "engine/cluster/goodput.h"
#include "engine/cluster/http_server.h"
#include "engine/cluster/ingest_writer.h"
#include "engine/cluster/memory_copies.h"
#include "engine/cluster/placement.h"
#include "engine/cluster/run_lifecycle.h"
#include "engine/cluster/run_store.h"
#include "engine/cluster/straggler_watch.h"
#include "engine/core/train.h"  // TrainAction
#include "engine/core/worker/rendezvous_server.h"
#include "storage/history_db.h"
#include "telemetry/clock.h"

namespace gantry {

class PrometheusWriter;  // telemetry/prometheus.h

struct Coordinator::Impl {
  using json = nlohmann::json;
  using Clock = std::chrono::steady_clock;

  // Names: a run's (shown in every list and event) and a node's (coordinator.cpp).
  static constexpr size_t kMaxRunName = 128;
  static constexpr size_t kMaxNodeName = 128;
  static Status check_name(std::string_view field, const std::string& name, size_t max);

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
    json inject = json::array();  // injected faults for its ranks: {run, generation, rank, signal}
    // Its agent's health checks from the latest beat (node_health.h's report: state, reason, checks);
    // null until a beat carries them (an older agent never does: unknown).
    json health;
    std::vector<int64_t> unhealthy_runs;  // runs told of its node_unhealthy, told again when it clears
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
    bool node_lost = false;       // its node stopped beating: the root cause of its peers' broken collectives
  };
  static constexpr int kDefaultMaxRestarts = 3;
  // Damaged checkpoints a recovery falls back past in a row (each to the one before) before it gives up.
  static constexpr int kMaxCheckpointFallbacks = 3;
  // A rank silent this long while its process runs is hung (gang.h's hang_timeout): its agent fails the gang
  // and names it; the run's peers, healthy and waiting in their collective, keep beating and are not blamed.
  static constexpr int kDefaultHangTimeoutS = 10;
  struct Run {
    int64_t id = 0;
    std::string name;
    RunState state = RunState::kRunning;  // changed only through set_state (run_lifecycle.h's rules)
    int dp = 1, zero = 0;
    // The model-parallel degrees (submit's layout.tp/pp/vp): fixed for the run's life but for resume-from;
    // recovery and moves change dp only, so a lost node's ranks move as whole tp groups and pipelines.
    int tp = 1, pp = 1, vp = 1;
    int world() const { return dp * tp * pp; }  // ranks in ParallelDims' order: tp innermost, then pp, dp
    int64_t max_steps = -1;
    std::string config_toml, out_dir, backend;
    std::vector<NodeShare> shares;  // in rank order
    std::unique_ptr<RunStore> store;
    // Live when the last coordinator on this folder went away: its shares are the gangs the agents report
    // as they register again (agent_register), until they cover every rank (adopted) or adopt_deadline
    // passes (interrupted). Actions wait; the run's end waits.
    bool adopting = false;
    Clock::time_point adopt_deadline;
    // The placement of the generation being adopted as the last coordinator recorded it ({node, first_rank,
    // ranks}): the nodes a missing rank ran on, named when the grace is over (adopt_expired).
    json recorded_placement = json::array();
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
    std::string resume_kind;  // "quarantine", "resume" or "recovery": the events' prefix
    // Recovery (recover()): a failed gang is placed again from the newest committed checkpoint, up to
    // max_restarts times in a row without a newer checkpoint committed in between; 0 = a failure ends it.
    int max_restarts = kDefaultMaxRestarts;
    // The dp a recovery or a move may shrink to (never below min_dp), and the largest a resume-from may ask
    // for; both divide train.global_batch as dp does (submit validates them). 0 = not given: 1 and dp.
    int min_dp = 0, max_dp = 0;
    int min_dp_or_1() const { return min_dp > 0 ? min_dp : 1; }
    // A recovery from the in-memory copies (memory_copies.h): {step, shards: [{rank, url}]} for the agents
    // of the generation start_generation places next, then null again.
    nlohmann::json memory_restore;
    int restarts = 0;             // recoveries over the run's life
    int restarts_in_row = 0;      // since the newest checkpoint it restarted from
    int64_t restarted_from = -1;  // that checkpoint's step (-1: none yet, or from the start)
    // A silent-data-corruption mismatch (its sdc_mismatch event) names the last step every replica passed:
    // the next recovery takes no checkpoint past it (those may hold the corruption). -1 = none pending.
    int64_t sdc_trusted_step = -1;
    // The step guard's streak in the gang (its guard_streak event, payload as guard_rollback_payload's): the
    // next recovery is a rollback to a checkpoint at or before its to_step, passing over its batches. null =
    // none pending.
    nlohmann::json guard_streak;
    int guard_rollbacks = 0;  // rollbacks over the run's life, bounded by the config's guard_max_rollbacks
    // Every rollback's passed-over batches, [[first, count], ...] sorted and merged: each generation is told.
    nlohmann::json guard_skipped = nlohmann::json::array();
    StragglerWatch straggler;  // the straggler policy: scores of the current placement's ranks
    // submit's hang_timeout_s (1..3600): the agents' launchers fail a gang whose rank is silent this long.
    int hang_timeout_s = kDefaultHangTimeoutS;
    CheckpointPolicy checkpoint_policy;
    // The goodput ledger's marks of the current generation (coordinator_goodput.cpp): the generation_placed
    // event records its start, a generation_first_step event its first step past gen_from_step.
    double gen_placed_unix = 0;
    int64_t gen_from_step = -1;
    bool gen_stepped = false;
    // What the current generation was told to load: the disk checkpoint ("" = none: the start, or only
    // memory) and whether the agents restore in-memory copies instead (the disk one then backs them up).
    std::string gen_resume_dir;
    bool gen_from_memory = false;
    // Checkpoints a gang could not load because they are damaged (kWorkerExitCheckpointDamaged), oldest
    // first: {generation, step, source "disk"|"memory", dir, moved_to, error}. A damaged disk checkpoint is
    // moved to checkpoints_damaged/ (kept for inspection, never written over) and the recovery falls back
    // to the one before; damaged_in_row such fallbacks in a row are allowed up to kMaxCheckpointFallbacks.
    nlohmann::json damaged_checkpoints = nlohmann::json::array();
    int damaged_in_row = 0;
    int64_t memory_damaged_from = -1;  // in-memory copies at or past this step are not restored again
    // The stalls of its committed checkpoints as they arrive (this coordinator's life), for young_daly.
    std::vector<double> checkpoint_stalls;
    // How its MFU is computed (RunInfo); peak_flops 0 = each GPU's own, or unknown.
    std::string peak_name, mfu_formula;
    double peak_flops = 0, flops_per_token = 0;

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

  // The run's id and world, under mu; the database is then read without it (reads take db_mu only).
  struct RunKey {
    int64_t id = -1;
    int world = 0;  // dp·tp·pp ranks
  };

  // ---- the run lifecycle (coordinator_runs.cpp) -----------------------------------------------------------

  // The one place a run's state changes: a change the lifecycle does not allow is a defect of the
  // coordinator, reported and not made (the run keeps the state every client has seen).
  bool set_state(Run& r, RunState to);

  // Queues `a` for rank 0 (which decides for the gang at its next step boundary, train.h) and records the
  // request: `source` is "api" (an operator) or "policy" (the coordinator's own), `from` who asked.
  uint64_t queue_action(Run& r, TrainAction a, const std::string& source, const std::string& from);

  // Every share has reported: the run's end, from the worst of its gangs.
  void maybe_finish(Run& r);

  // Tells every node still running a share of the run to stop it (SIGTERM: a checkpoint, then exit).
  void stop_shares(Run& r, const std::string& except_node);

  // Places run `r` (its shares all ended or none yet) on `p`, on a fresh rendezvous store, and queues each
  // node's share; `resume_dir` is the checkpoint the workers start from ("" = a fresh run). Records the
  // generation_placed event (why: `cause`) that the goodput ledger counts from.
  Status start_generation(Run& r, const std::vector<PlacementNode>& pn, const Placement& p,
                          const std::string& resume_dir, GoodputCause cause);

  // What a restarted coordinator needs to know of the run beyond its config (runs.options).
  static json run_options(const Run& r);

  // The runs of the database, as they were when the last coordinator on this folder ended. A run that was
  // live then (running, paused or stopping: a crash, a kill -9) is interrupted now, with why; its steps,
  // events and checkpoints are all there, and resume-from continues it. Called by start(), before serving.
  Status restore_runs();

  // An agent registering again reports the gangs it runs (or that ended while no coordinator heard): each
  // of a run being adopted, of its current generation, becomes one of its shares; once they cover every
  // rank the run is adopted (an event) and goes on as if nothing happened. Called with mu held.
  void adopt_gangs(const std::string& node, const json& gangs);
  // Runs whose gangs did not all come back within the grace. None of it back (the whole cluster went away):
  // interrupted, for resume-from. Part of it back: the missing ranks are a failure found at
  // adoption (an adopt_missing event naming them and their node), recovered as a node lost live would be
  // (maybe_finish, recover): the shares that did come back are stopped first. Called by the watch, with mu
  // held.
  void adopt_expired(Clock::time_point now);

  // A coordinator told to stop (SIGTERM, `down`): its live runs are interrupted, so that the next one on
  // this folder shows them so at once; their agents stop them.
  void interrupt_live_runs();

  static std::string one_line(std::string text);

  // The checkpoint a caller names, resolved inside the run's own checkpoints folder and nowhere else:
  // "latest", a step number, or the name of one committed step_* directory there. A path, "..", or anything
  // not among the run's committed checkpoints is refused (the API never reads a path the caller names).
  Result<std::pair<std::string, int64_t>> resolve_checkpoint(const Run& r, const json& spec) const;

  // After every share of a moving run has ended: place it again without the quarantined node (a spare if
  // one is registered, else the largest dp that fits and divides train.global_batch) and resume it from
  // the stop's checkpoint. A run that cannot be placed fails, saying why.
  void relocate(Run& r);

  // A gang of the run failed (a worker died, a node was lost) and every share has ended: place it again
  // (the same dp on the live nodes, a spare standing in for a lost node, else the largest dp that fits and
  // divides train.global_batch) from its newest committed checkpoint, or from the start without one, as the
  // next generation of the same run. False when the restart budget is spent or it cannot be placed: the
  // caller fails the run, with the reason in *why.
  // `damaged`: the gang could not load the checkpoint it was given (exit code 5): it is set aside and the
  // recovery falls back to the checkpoint before it.
  bool recover(Run& r, const std::string& failure, std::string* why, bool damaged = false);

  // Placement for a run placed again: its dp if that fits the live nodes, else the largest dp below it, and
  // not below its min_dp, that fits and divides train.global_batch (the global batch is kept by
  // accumulation). When none fits, the error names the range tried.
  Result<Placement> place_again(const Run& r, const std::vector<PlacementNode>& pn, int* dp) const;

  HttpResponse submit(const HttpRequest& req);

  HttpResponse action(const HttpRequest& req, TrainAction a);

  // A stopped or failed run goes on from one of its own checkpoints, under the same run id (its steps
  // continue the same curve; steps past the checkpoint are forgotten and trained again), on the same
  // layout or another one: the checkpoint reshards to any dp and ZeRO stage.
  HttpResponse resume_from(const HttpRequest& req);

  // A fault injected into one rank of a live run ({"fault": "kill"|"hang", "rank": N}; no rank: one at
  // random): its node's agent signals the worker (SIGKILL, SIGSTOP), so the failure is the real one from
  // there on. 403 unless CoordinatorOptions::allow_fault_injection; recorded as a fault_injected event.
  HttpResponse inject(const HttpRequest& req);

  // POST /v1/runs/{id}/straggler: the run's straggler policy changed while it lives. The body is the submit
  // body's "straggler" object, or part of it: the fields given replace those of the run's options, and the
  // whole is validated by the submit's parser (400 naming the field). A straggler_policy event records the
  // change, who asked and what changed; the run's options in the database follow. 409 for an ended run.
  HttpResponse straggler_policy(const HttpRequest& req);
  // The policy's action: with quarantine on, a flagged rank's node is quarantined and the run moves off it
  // (a straggler_quarantine event says which rank, node and why). One move at a time; nothing while the run
  // is moving, stopping, paused or being re-adopted. Called with mu held, after an evaluation or a change.
  void straggler_act(Run& r);

  // ---- the node registry (coordinator_nodes.cpp) ----------------------------------------------------------

  void upsert_node(const Node& n, const char* state);

  std::vector<PlacementNode> placement_nodes() const;

  // The node a POST /v1/nodes/{id}/... names (its body must be empty JSON); null with the answer in *fail.
  // Called with mu held.
  // force: where given, the body's optional "force" (quarantine's); any other field is a 400.
  Node* requested_node(const HttpRequest& req, HttpResponse* fail, bool* force = nullptr);

  // Quarantine: the node takes no new work, and each live run on it moves: a stop at the next step
  // boundary (whose checkpoint every rank writes), then, once every gang has ended, placement without the
  // node and a resume from that checkpoint (relocate()). 202: the move is under way; its stages are events.
  HttpResponse quarantine(const HttpRequest& req);
  // Every live run with a share on node `id` checkpoints, stops and moves off it (relocate(): onto a spare,
  // or shrunk within min_dp..max_dp, else stopped with the reason): an operator's quarantine and an
  // unhealthy node take this one path. `why` ends the quarantine_requested event's first words, e.g.
  // "quarantined from 127.0.0.1". Returns the runs moving.
  json move_runs_off(const std::string& id, const std::string& why, const json& payload);
  // The health a beat reported (agent_beat.h's control "health"): a node whose checks fail becomes
  // unhealthy (no new work, node_unhealthy events, its runs moved off); when they pass again it is usable
  // again (node_healthy). An operator's quarantine and a lost node keep their state.
  void apply_health(Node& n, const json& health);

  // The quarantine itself (the node's state, each live run on it set moving); `by` completes the events'
  // sentence ("from 127.0.0.1:5000", "by the straggler policy of run 3"), `from` is their payload's. The
  // ids of the runs that move. Called with mu held.
  json quarantine_node(Node& n, const std::string& by, const std::string& from);

  HttpResponse release(const HttpRequest& req);
  // DELETE /v1/nodes/{id}: a lost node leaves the registry (its history stays); 409 for any other state.
  HttpResponse forget(const HttpRequest& req);

  // A worker's sdc_mismatch event (engine/core/sdc_check.h): when a majority of the dp replicas agreed, the
  // node of the rank that differed is quarantined (no new work) with an sdc_quarantine event. The run itself
  // is stopping already (every rank stops on a mismatch); other runs on the node are not moved (the
  // operator's quarantine does that). Without a majority nothing is quarantined: no node can be blamed.
  // Called with mu held.
  void quarantine_for_sdc(Run& r, const EventRecord& e);

  // The server's second chance for a request the operator's token did not open (HttpServerOptions::
  // also_accept): the join token registers a node; a node's credential sends that node's heartbeats.
  bool agent_may(const std::string& method, const std::string& path, std::string_view token);

  HttpResponse agent_register(const HttpRequest& req);

  HttpResponse agent_heartbeat(const HttpRequest& req);
  // Drops from a replayed beat's batch the events and checkpoint records the database already has.
  // Called without mu.
  void drop_recorded(RecordBatch& batch);
  // The beat's work under mu (its records ingested, its gangs' ends, the reply); the caller then waits
  // for the records to be written before answering.
  HttpResponse agent_beat_locked(const std::string& id, const json* ended, const json* health,
                                 RecordBatch& batch, const json* memory = nullptr);
  // The beat's in-memory copies (agent_memory.h): what the node holds into the ledger, and the reply's
  // copies it should take from its ring peer and runs whose copies it may drop. Called with mu held.
  void memory_copies_beat(const std::string& id, const json* memory, json& reply);
  // A node's agent base URL ("http://host:port"), from its registered metrics URL.
  static std::string agent_url(const Node& n);
  MemoryCopyTable memory_copies;  // which agents hold which runs' in-memory copies

  // The interval agents are told to beat at now, and how long a silent node is given before it is lost
  // (CoordinatorOptions::max_beats_per_s). Called with mu held.
  std::chrono::milliseconds beat_interval() const;
  std::chrono::milliseconds node_timeout() const;
  // Another node whose gang of a live run failed while `node` still holds a running share of that run; ""
  // if none. Such a node, silent for kMissedBeatsSuspect beats, is lost before node_timeout.
  std::string failed_peer_of(const std::string& node) const;

  // Marks nodes lost whose heartbeats stopped, and stops their runs (automatic recovery is a later issue).
  void watch_loop();

  // ---- ingest (coordinator_ingest.cpp) --------------------------------------------------------------------

  void event(int64_t run, const std::string& kind, const std::string& message, json payload = json::object(),
             int64_t step = -1, const std::string& node = "");

  // An event built elsewhere (the straggler policy's), into the run's history.
  void record(std::vector<EventRecord> events);

  // Records from an agent (hold mu): the run's live state from them, then to the database writer's queue
  // (`reserved` records were reserved there for them).
  void ingest(RecordBatch& batch, size_t reserved);

  // keep_last: once a newer checkpoint has committed, the run's older ones go, from its own folder only;
  // the catalog marks them deleted and each is an event. On the writer thread, after the new checkpoint's
  // catalog entry (queued just before): deleting files is no work for a heartbeat's handler.
  void prune_checkpoints(Run& r);

  // ---- the API's views (coordinator_views.cpp) ------------------------------------------------------------

  json node_json(const Node& n) const;

  json run_json(const Run& r, bool full) const;

  Run* find_run(const HttpRequest& req, HttpResponse* err);

  HttpResponse cluster();

  RunKey run_key(const HttpRequest& req, HttpResponse* err);

  // A read sees every write the coordinator accepted before it (the writer's queue is drained up to now).
  std::unique_lock<std::mutex> read_lock();

  HttpResponse runs_list();                         // GET /v1/runs
  HttpResponse run_detail(const HttpRequest& req);  // GET /v1/runs/{id}: the config and the latest step too

  HttpResponse steps(const HttpRequest& req);
  HttpResponse heatmap(const HttpRequest& req);  // the rank × step tile matrix at display resolution

  HttpResponse ranks(const HttpRequest& req);

  HttpResponse checkpoints(const HttpRequest& req);

  HttpResponse events(const HttpRequest& req);

  // ---- the goodput ledger (coordinator_goodput.cpp) -------------------------------------------------------

  // A step record of the run's current generation: its first one is the generation_first_step event.
  void goodput_step(Run& r, const StepRecord& s);

  // The run's ledger and Young/Daly recommendation, derived from its stored history (GET
  // /v1/runs/{id}/goodput). Takes mu, then reads the database without it.
  Result<json> goodput_json(int64_t run_id);
  HttpResponse goodput(const HttpRequest& req);

  // checkpoint_policy young_daly: after a failure or a new checkpoint's stall, the run's interval becomes the
  // Young/Daly one from what this coordinator measured (its recoveries over its wall time, the median
  // stall), recorded as a checkpoint_interval event when it changes. Nothing while either is unknown.
  void young_daly_apply(Run& r);

  HttpResponse metrics();

  // ---- device telemetry (coordinator_devices.cpp) -------------------------------------------------------

  // Each (node, device, metric)'s newest sample, for /metrics; under mu.
  std::map<std::tuple<std::string, int32_t, DeviceMetric>, DeviceSampleRecord> device_latest;
  void devices_take(std::vector<DeviceSampleRecord>& samples, RecordBatch& keep);  // ingest, under mu
  void devices_metrics(PrometheusWriter& w) const;                                 // under mu
  HttpResponse devices(const HttpRequest& req);  // GET /v1/devices?metric=&time_begin=&time_end=&buckets=

  // ---- alerts (coordinator_alerts.cpp) --------------------------------------------------------------------

  std::vector<AlertRule> alert_rules;  // under mu
  AlertEvaluator alert_eval;           // under mu
  std::unique_ptr<AlertHooks> alert_hooks;
  std::thread alert_thread;
  // <dir>/alerts.json (the rules as the API left them), then CoordinatorOptions::alerts_file over them.
  // Called by start(), before serving.
  Status alerts_load();
  void alerts_save();          // <dir>/alerts.json, renamed into place; called with mu held
  HttpResponse alerts_list();  // GET /v1/alerts: rules and what fires now
  HttpResponse alerts_add(const HttpRequest& req);     // POST /v1/alerts
  HttpResponse alerts_delete(const HttpRequest& req);  // DELETE /v1/alerts/{name}
  // Every kAlertPeriod until stopping: each live run's figures against the rules; events and hooks.
  void alert_loop();
};

}  // namespace gantry
