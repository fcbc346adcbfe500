// The run lifecycle (coordinator_impl.h): submit, actions, state changes, placement generations, a run's
// end, a quarantine's move, resume-from, and the runs a restarted coordinator finds in its database.
#include <signal.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <set>
#include <utility>

#include "engine/cluster/coordinator_impl.h"
#include "engine/cluster/json_fields.h"
#include "engine/cluster/run_layout.h"
#include "engine/core/checkpoint.h"  // checkpoint_list, checkpoint_latest: what a run can resume from
#include "engine/core/config.h"
#include "engine/core/gpt.h"          // gpt_param_table: N for the run's FLOPs per token
#include "engine/core/sampler.h"      // SkippedBatches: a guard rollback's batches, merged
#include "engine/core/utilisation.h"  // how the run's MFU is computed, for its runs row and the console
#include "engine/core/worker/worker_runtime.h"  // kWorkerExitCheckpointDamaged: a gang's damaged resume

namespace gantry {
namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;

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

}  // namespace

bool Coordinator::Impl::set_state(Run& r, RunState to) {
  if (Status s = run_transition_check(r.state, to); !s.ok()) {
    std::fprintf(stderr, "gantry-engine coordinator: run %lld: refused a state change: %s\n",
                 static_cast<long long>(r.id), s.message().c_str());
    return false;
  }
  r.state = to;
  return true;
}

uint64_t Coordinator::Impl::queue_action(Run& r, TrainAction a, const std::string& source,
                                         const std::string& from) {
  // Being re-adopted: rank 0's node is not known yet (the policy asks again at a later step; an operator's
  // request is refused before it gets here).
  if (r.adopting || r.shares.empty()) return 0;
  const uint64_t request = next_request++;
  const char* what = train_action_name(a);
  nodes[r.shares.front().node].commands.push_back({{"run", r.id},
                                                   {"rank", 0},
                                                   {"action", static_cast<int>(a)},
                                                   {"request", request},
                                                   {"from", source == "api" ? "api@" + from : from}});
  event(r.id, "action_requested",
        std::string(what) + " requested " + (source == "policy" ? "by the " + from : "from " + from) +
            " (request " + std::to_string(request) + ")",
        {{"action", what}, {"request", request}, {"from", from}, {"source", source}});
  return request;
}

void Coordinator::Impl::maybe_finish(Run& r) {
  // Being re-adopted, the shares are those reported so far: the run's end waits for them all.
  if (run_state_terminal(r.state) || r.adopting) return;
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
  // Of several failed gangs, the root cause: a lost node (its peers fail after it on broken collectives),
  // else a rank killed by a signal (it takes its peers down, not the reverse); among equals, the first in
  // rank order.
  const NodeShare* failed = nullptr;
  for (const NodeShare& s : r.shares) {
    if (s.node_lost && failed == nullptr) failed = &s;
  }
  for (const NodeShare& s : r.shares) {
    if (failed != nullptr && failed->node_lost) break;
    if (s.code == 0 || s.code == 130) continue;
    const int rank = s.cause_rank < 0 ? 1000 : s.cause_rank;
    if (failed == nullptr || rank < (failed->cause_rank < 0 ? 1000 : failed->cause_rank)) failed = &s;
  }
  if (failed != nullptr) {
    state = RunState::kFailed;
    message = failed->node + ": " + failed->error;
  }
  bool agent_stopped = false;
  for (const NodeShare& s : r.shares) {
    if (!s.agent_stopping || s.code == 0) continue;
    state = RunState::kInterrupted;
    message = "the agent of " + s.node + " was stopped while the run was live (at step " +
              std::to_string(r.last_step) + "): resume-from continues it from its newest checkpoint";
    agent_stopped = true;
    break;
  }
  // A failure the run can get over by itself: not bad input (exit code 2: it would fail the same way
  // again), not an operator's or an agent's stop. A checkpoint the gang found damaged (exit code 5) is
  // such a failure: the recovery falls back to the one before it.
  if (failed != nullptr && !agent_stopped && failed->code != 2 && r.state != RunState::kStopping) {
    std::string why;
    // Any gang's 5 (the ranks agreed on the load, but a gang stopped as its peers failed may say 1): its
    // message names the damaged file.
    const NodeShare* damaged = nullptr;
    for (const NodeShare& s : r.shares)
      if (damaged == nullptr && s.code == kWorkerExitCheckpointDamaged) damaged = &s;
    if (damaged != nullptr) message = damaged->node + ": " + damaged->error;
    if (recover(r, message, &why, damaged != nullptr)) return;
    message += "; not recovered: " + why;
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

void Coordinator::Impl::stop_shares(Run& r, const std::string& except_node) {
  for (NodeShare& s : r.shares) {
    if (s.done || s.node == except_node) continue;
    auto it = nodes.find(s.node);
    if (it != nodes.end()) it->second.stop.push_back(r.id);
  }
}

Status Coordinator::Impl::start_generation(Run& r, const std::vector<PlacementNode>& pn, const Placement& p,
                                           const std::string& resume_dir, GoodputCause cause) {
  Result<std::unique_ptr<RunStore>> store =
      RunStore::start(opt.store_exe, opt.rendezvous_host, r.out_dir + "/rendezvous_store.log");
  if (!store.ok()) return Status::error("cannot start the run's rendezvous store: " + store.error());
  r.store = std::move(store.value());
  const std::string rendezvous = opt.rendezvous_host + ":" + std::to_string(r.store->port());
  ++r.generation;
  {
    // The ledger's mark (coordinator_goodput.cpp): not a step's event (step -1), so no rewind removes it;
    // it carries the last progress of the generation before, which the rewind below forgets.
    const int64_t from = r.memory_restore.is_object() ? r.memory_restore.value("step", int64_t{-1})
                         : resume_dir.empty()         ? -1
                                                      : checkpoint_dir_step(resume_dir);
    json payload = {{"generation", r.generation},
                    {"cause", goodput_cause_name(cause)},
                    {"from_step", from},
                    {"dp", r.dp}};
    if (r.gen_stepped) payload["previous_last_progress_unix_s"] = r.latest_step.time_unix_s;
    event(r.id, "generation_placed",
          "generation " + std::to_string(r.generation) + " placed (" +
              std::string(goodput_cause_name(cause)) + ") on dp " + std::to_string(r.dp) +
              (from >= 0 ? " from the checkpoint at step " + std::to_string(from)
                         : std::string(" from the start")),
          payload);
    r.gen_placed_unix = unix_now_s();
    r.gen_from_step = from;
    r.gen_stepped = false;
    r.gen_resume_dir = resume_dir;
    r.gen_from_memory = r.memory_restore.is_object();
  }
  // A stop meant for the last generation that its gang outran (it ended by itself first) must not reach
  // the next one: the agent would stop the new gang as soon as it started.
  for (auto& [id, n] : nodes) {
    json kept = json::array();
    for (const json& run : n.stop)
      if (run != r.id) kept.push_back(run);
    n.stop = std::move(kept);
  }
  // The ranks land on other devices: their straggler scores start over (flags of the last placement end).
  record(r.straggler.reset(r.id, unix_now_s(), [&r](int32_t rank) { return r.node_of(rank); }));
  r.shares.clear();
  r.latest.assign(static_cast<size_t>(r.world()), RankStepRecord{});
  for (const PlacedNode& pnode : p.nodes) {
    NodeShare s;
    s.node = pn[static_cast<size_t>(pnode.node)].id;
    s.first_rank = pnode.first_rank;
    s.ranks = pnode.ranks;
    for (int k = 0; k < pnode.ranks; ++k)
      s.slots.push_back(p.ranks[static_cast<size_t>(pnode.first_rank + k)].slot);
    nodes[s.node].start.push_back({{"run", r.id},
                                   {"generation", r.generation},
                                   {"first_rank", s.first_rank},
                                   {"ranks", s.ranks},
                                   {"world", r.world()},
                                   {"tp", r.tp},
                                   {"pp", r.pp},
                                   {"vp", r.vp},
                                   {"slots", s.slots},
                                   {"rendezvous", rendezvous},
                                   {"config", r.config_toml},
                                   {"out_dir", r.out_dir},
                                   {"zero", r.zero},
                                   {"max_steps", r.max_steps},
                                   {"backend", r.backend},
                                   {"resume", resume_dir},
                                   {"hang_timeout_ms", int64_t{r.hang_timeout_s} * 1000}});
    if (r.memory_restore.is_object()) nodes[s.node].start.back()["memory_restore"] = r.memory_restore;
    if (!r.guard_skipped.empty()) nodes[s.node].start.back()["skip_batches"] = r.guard_skipped;
    r.shares.push_back(std::move(s));
  }
  r.memory_restore = nullptr;
  // After the shares: the options carry the placement, which a restarted coordinator names nodes from.
  writer->push_op([id = r.id, options = run_options(r).dump()](HistoryDb& d) {
    d.update_run(id, RunStatus::running, "", options);
  });
  return Status();
}

json Coordinator::Impl::run_options(const Run& r) {
  json placement = json::array();
  for (const NodeShare& s : r.shares)
    placement.push_back({{"node", s.node}, {"first_rank", s.first_rank}, {"ranks", s.ranks}});
  return {{"dp", r.dp},
          {"tp", r.tp},
          {"pp", r.pp},
          {"vp", r.vp},
          {"zero", r.zero},
          {"max_steps", r.max_steps},
          {"db_world", r.db_world},
          {"generation", r.generation},
          {"max_restarts", r.max_restarts},
          {"min_dp", r.min_dp},
          {"max_dp", r.max_dp},
          {"hang_timeout_s", r.hang_timeout_s},
          {"restarts", r.restarts},
          {"guard_rollbacks", r.guard_rollbacks},
          {"guard_skipped", r.guard_skipped},
          {"damaged_checkpoints", r.damaged_checkpoints},
          {"straggler", straggler_watch_options_json(r.straggler.options())},
          {"checkpoint_every_steps", r.checkpoint_policy.options().every_steps},
          {"checkpoint_policy", checkpoint_policy_mode_name(r.checkpoint_policy.options().mode)},
          {"keep_last", r.checkpoint_policy.options().keep_last},
          {"placement", placement}};
}

Status Coordinator::Impl::restore_runs() {
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
    r.peak_name = row.info.peak_name;
    r.peak_flops = row.info.peak_flops;
    r.flops_per_token = row.info.flops_per_token;
    r.mfu_formula = row.info.mfu_formula;
    r.last_step = row.last_step;
    r.message = row.message;
    r.db_world = row.info.world_size;
    r.dp = row.info.world_size;
    const json o = json::parse(row.info.options, nullptr, false);
    if (o.is_object()) {
      r.dp = o.value("dp", r.dp);
      r.tp = o.value("tp", 1);
      r.pp = o.value("pp", 1);
      r.vp = o.value("vp", 1);
      r.zero = o.value("zero", 0);
      r.max_steps = o.value("max_steps", int64_t{-1});
      r.db_world = o.value("db_world", r.db_world);
      r.generation = o.value("generation", 0);
      r.max_restarts = o.value("max_restarts", kDefaultMaxRestarts);
      r.hang_timeout_s = o.value("hang_timeout_s", kDefaultHangTimeoutS);
      r.restarts = o.value("restarts", 0);
      r.guard_rollbacks = o.value("guard_rollbacks", 0);
      r.guard_skipped = o.value("guard_skipped", json::array());
      r.damaged_checkpoints = o.value("damaged_checkpoints", json::array());
      r.min_dp = o.value("min_dp", 0);
      r.max_dp = o.value("max_dp", 0);
      r.recorded_placement = o.value("placement", json::array());
      const json straggler = o.value("straggler", json::object());
      Result<StragglerWatchOptions> so = straggler_watch_parse(&straggler);
      if (so.ok()) r.straggler = StragglerWatch(so.value());
      r.checkpoint_policy =
          CheckpointPolicy({.every_steps = o.value("checkpoint_every_steps", int64_t{0}),
                            .keep_last = o.value("keep_last", 0),
                            .mode = checkpoint_policy_mode_from_name(o.value("checkpoint_policy", "fixed"))
                                        .value_or(CheckpointPolicyMode::kFixed)});
    }
    Result<Config> cfg = config_parse(r.config_toml, "config");
    r.backend = cfg.ok() ? cfg->train.backend : "cpu";
    r.latest.assign(static_cast<size_t>(std::max(r.world(), 1)), RankStepRecord{});
    if (r.last_step >= 0) {
      std::vector<StepRecord> last;
      std::lock_guard<std::mutex> db_lock(db_mu);
      if (db->read_steps(r.id, r.last_step, r.last_step + 1, 1, &last) && !last.empty())
        r.latest_step = last.front();
    }
    if (row.status != RunStatus::running) {
      // As recorded (loaded, not a change): the database's words are the lifecycle's ended states.
      r.state = run_state_from_name(run_status_name(row.status)).value_or(RunState::kInterrupted);
      continue;
    }
    // Live when the last coordinator went away (a crash, a kill -9: a clean stop interrupts its runs
    // itself): its gang may still be training. Its agents keep their records and register again; the run
    // waits for them (adopt_gangs) until the grace is over (adopt_expired).
    // Loaded, not a change. The database says only "running": rank 0's last pause or resume in the run's
    // events says whether its gang is paused.
    r.state = RunState::kRunning;
    {
      std::vector<EventRow> events;
      std::lock_guard<std::mutex> db_lock(db_mu);
      if (db->read_events(r.id, 0, SIZE_MAX, &events)) {
        for (const EventRow& e : events) {
          const std::string& kind = e.event.kind;
          if (e.event.rank == 0 && kind == "action_pause") r.state = RunState::kPaused;
          if (e.event.rank == 0 && kind == "action_resume") r.state = RunState::kRunning;
          // A new generation (placed again: recovery, resume-from, a move) starts unpaused.
          if (kind == "placed" || kind.ends_with("_placed")) r.state = RunState::kRunning;
        }
      }
    }
    r.adopting = true;
    r.adopt_deadline = Clock::now() + opt.adopt_grace;
    r.resumed_from = -1;
    r.checkpoint_policy.restart_at(std::max<int64_t>(r.last_step, 0));
    event(r.id, "adopt_waiting",
          "run " + std::to_string(r.id) + " was live (at step " + std::to_string(r.last_step) +
              ") when the last coordinator went away: waiting up to " +
              std::to_string(opt.adopt_grace.count()) + " ms for its gang (generation " +
              std::to_string(r.generation) + ", dp " + std::to_string(r.dp) + ") to come back",
          {{"generation", r.generation}, {"grace_ms", opt.adopt_grace.count()}}, r.last_step);
  }
  return Status();
}

void Coordinator::Impl::adopt_gangs(const std::string& node, const json& gangs) {
  if (!gangs.is_array()) return;
  for (const json& g : gangs) {
    if (!g.is_object()) continue;
    auto it = runs.find(g.value("run", int64_t{-1}));
    if (it == runs.end() || !it->second.adopting) continue;
    Run& r = it->second;
    if (g.value("generation", -1) != r.generation) continue;  // a gang of an earlier placement
    const int first = g.value("first_rank", -1), n = g.value("ranks", 0);
    if (first < 0 || n <= 0 || first + n > r.world()) continue;
    bool overlaps = false;
    for (const NodeShare& s : r.shares)
      overlaps = overlaps || (first < s.first_rank + s.ranks && s.first_rank < first + n);
    if (overlaps) continue;
    NodeShare s;
    s.node = node;
    s.first_rank = first;
    s.ranks = n;
    for (const json& slot : g.value("slots", json::array()))
      if (slot.is_number_integer()) s.slots.push_back(slot.get<int>());
    r.shares.push_back(std::move(s));
    std::sort(r.shares.begin(), r.shares.end(),
              [](const NodeShare& a, const NodeShare& b) { return a.first_rank < b.first_rank; });
    int covered = 0;
    for (const NodeShare& x : r.shares) covered += x.ranks;
    if (covered < r.world()) continue;
    r.adopting = false;
    std::string where;
    for (const NodeShare& x : r.shares)
      where += (where.empty() ? "" : ", ") + x.node + " ranks " + std::to_string(x.first_rank) + ".." +
               std::to_string(x.first_rank + x.ranks - 1);
    event(r.id, "run_adopted",
          "run " + std::to_string(r.id) + " re-adopted by the restarted coordinator at step " +
              std::to_string(r.last_step) + ": its gang (generation " + std::to_string(r.generation) +
              ") kept training on " + where,
          {{"generation", r.generation}, {"dp", r.dp}}, r.last_step);
  }
}

void Coordinator::Impl::adopt_expired(Clock::time_point now) {
  for (auto& entry : runs) {
    Run& r = entry.second;
    if (!r.adopting || now < r.adopt_deadline) continue;
    r.adopting = false;
    if (r.shares.empty()) {
      // No part of the gang came back: the whole cluster went away with the coordinator (`down`, a
      // reboot), not one node under a live gang. Nothing trains to be recovered around; the operator
      // continues it (resume-from), as after a clean stop.
      set_state(r, RunState::kInterrupted);
      r.message = "the coordinator went away while the run was live (at step " + std::to_string(r.last_step) +
                  "), and no part of its gang came back to the new one on " + opt.dir + " within " +
                  std::to_string(opt.adopt_grace.count()) +
                  " ms: resume-from continues it from its newest checkpoint";
      r.store.reset();
      writer->push_op(
          [id = r.id, m = r.message](HistoryDb& d) { d.finish_run(id, RunStatus::interrupted, m); });
      event(r.id, "run_interrupted", "run " + std::to_string(r.id) + " interrupted: " + r.message,
            {{"state", run_state_name(RunState::kInterrupted)}}, r.last_step);
      continue;
    }
    // Part of the gang came back; the ranks no agent reported: their node (its agent died, or its workers)
    // failed while no coordinator could see it. Each missing stretch of ranks becomes a share of the current
    // generation that ended with its node lost, as the watch marks a node that stopped beating; the shares
    // that did come back are stopped (a part of a gang cannot train without the rest), and once they have all
    // ended the run's end is decided as for a failure seen live: a spare, else a shrink, else a stop with the
    // reason.
    std::vector<bool> back(static_cast<size_t>(std::max(r.world(), 0)), false);
    for (const NodeShare& s : r.shares)
      for (int k = s.first_rank; k < s.first_rank + s.ranks && k < r.world(); ++k)
        back[static_cast<size_t>(k)] = true;
    // Where the missing ranks ran, from the placement the run's options recorded (runs.options): the nodes
    // that held them and did not come back.
    std::set<std::string> suspects;
    for (const json& p : r.recorded_placement) {
      const int first = p.value("first_rank", -1), n = p.value("ranks", 0);
      for (int k = std::max(first, 0); k < first + n && k < r.world(); ++k)
        if (!back[static_cast<size_t>(k)]) suspects.insert(p.value("node", ""));
    }
    suspects.erase("");
    std::string missing, where;
    for (const std::string& n : suspects) where += (where.empty() ? "" : ", ") + n;
    std::vector<NodeShare> lost;
    for (int k = 0; k < r.world(); ++k) {
      if (back[static_cast<size_t>(k)]) continue;
      missing += (missing.empty() ? "" : ",") + std::to_string(k);
      if (!lost.empty() && lost.back().first_rank + lost.back().ranks == k) {
        ++lost.back().ranks;
        continue;
      }
      NodeShare s;
      s.node = where.empty() ? "unknown node" : where;
      s.first_rank = k;
      s.ranks = 1;
      s.done = true;
      s.code = 1;
      s.node_lost = true;
      lost.push_back(std::move(s));
    }
    if (lost.empty()) continue;  // covered after all (adopt_gangs adopts as soon as every rank is back)
    const std::string what =
        std::string(lost.size() == 1 && lost[0].ranks == 1 ? "rank " : "ranks ") + missing;
    const std::string why = what +
                            " not reported at adoption: no agent brought them back to the restarted "
                            "coordinator within " +
                            std::to_string(opt.adopt_grace.count()) + " ms (last on " +
                            (where.empty() ? std::string("an unknown node") : where) +
                            ": its agent or its workers died while no coordinator ran)";
    for (NodeShare& s : lost) s.error = why;
    event(r.id, "adopt_missing", "run " + std::to_string(r.id) + ": " + why,
          {{"missing_ranks", missing},
           {"nodes", std::vector<std::string>(suspects.begin(), suspects.end())},
           {"generation", r.generation},
           {"grace_ms", opt.adopt_grace.count()}},
          -1, where);
    for (NodeShare& s : lost) r.shares.push_back(std::move(s));
    std::sort(r.shares.begin(), r.shares.end(),
              [](const NodeShare& a, const NodeShare& b) { return a.first_rank < b.first_rank; });
    stop_shares(r, "");
    maybe_finish(r);
  }
}

void Coordinator::Impl::interrupt_live_runs() {
  std::lock_guard<std::mutex> lock(mu);
  for (auto& [id, r] : runs) {
    if (run_state_terminal(r.state)) continue;
    set_state(r, RunState::kInterrupted);
    r.message = "the coordinator was stopped while the run was live (at step " + std::to_string(r.last_step) +
                "): resume-from continues it from its newest checkpoint";
    r.store.reset();
    writer->push_op(
        [id = r.id, m = r.message](HistoryDb& d) { d.finish_run(id, RunStatus::interrupted, m); });
    event(r.id, "run_interrupted", "run " + std::to_string(r.id) + " interrupted: " + r.message,
          {{"state", run_state_name(RunState::kInterrupted)}}, r.last_step);
  }
}

std::string Coordinator::Impl::one_line(std::string text) {
  for (size_t k; (k = text.find('\n')) != std::string::npos;) text.replace(k, 1, "; ");
  while (!text.empty() && (text.back() == ' ' || text.back() == ';')) text.pop_back();
  return text;
}

Result<std::pair<std::string, int64_t>> Coordinator::Impl::resolve_checkpoint(const Run& r,
                                                                              const json& spec) const {
  const std::string root = r.out_dir + "/checkpoints";
  const std::vector<std::string> all = checkpoint_list(root);  // committed, oldest first
  const std::string hint = "; GET /v1/runs/" + std::to_string(r.id) + "/checkpoints lists them";
  const auto step_of = checkpoint_dir_step;
  if (all.empty())
    return Status::error("run " + std::to_string(r.id) + " has no committed checkpoint to resume from");
  if (spec.is_number_integer()) {
    const int64_t want = spec.get<int64_t>();
    for (const std::string& d : all)
      if (step_of(d) == want) return std::pair{d, want};
    return Status::error("field \"checkpoint\": run " + std::to_string(r.id) +
                         " has no committed checkpoint at step " + spec.dump() + " (it has steps " +
                         std::to_string(step_of(all.front())) + ".." + std::to_string(step_of(all.back())) +
                         ")" + hint);
  }
  if (!spec.is_string()) {
    return Status::error(
        "field \"checkpoint\": expected \"latest\", a step number or a checkpoint's directory name, got " +
        json_type_phrase(spec));
  }
  const std::string name = spec.get<std::string>();
  if (name == "latest") return std::pair{all.back(), step_of(all.back())};
  if (name.empty() || name.find('/') != std::string::npos || name == "." || name == ".." ||
      name.find('\0') != std::string::npos) {
    return Status::error(
        "field \"checkpoint\": \"" + name + "\" is not a checkpoint of run " + std::to_string(r.id) +
        ": give \"latest\", a step number, or the name of a directory under the run's checkpoints "
        "(such as \"" +
        fs::path(all.back()).filename().string() + "\"), never a path" + hint);
  }
  for (const std::string& d : all)
    if (fs::path(d).filename() == name) return std::pair{d, step_of(d)};
  return Status::error("field \"checkpoint\": run " + std::to_string(r.id) +
                       " has no committed checkpoint named \"" + name + "\"" + hint);
}

void Coordinator::Impl::relocate(Run& r) {
  const std::string node = std::exchange(r.relocate_node, "");
  // "quarantined" or "unhealthy" (move_runs_off: one path for both).
  auto nit = nodes.find(node);
  const std::string what =
      nit == nodes.end() ? "quarantined" : std::string(node_state_name(nit->second.state));
  r.store.reset();
  event(r.id, "quarantine_stopped",
        "run " + std::to_string(r.id) + " stopped to leave " + what + " node " + node, {{"node", node}},
        r.last_step, node);
  auto fail = [&](const std::string& why) {
    set_state(r, RunState::kFailed);
    r.message = "could not be moved off " + what + " node " + node + ": " + why;
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
  const std::vector<PlacementNode> pn = placement_nodes();
  int dp = r.dp;
  Result<Placement> p = place_again(r, pn, &dp);
  if (!p.ok()) return fail(p.error());
  const int old_dp = r.dp;
  r.dp = dp;
  if (Status s = start_generation(r, pn, p.value(), dir, GoodputCause::kQuarantine); !s.ok())
    return fail(s.message());
  set_state(r, RunState::kRunning);
  r.message.clear();
  const int64_t step = checkpoint_dir_step(dir);
  writer->push_op([id = r.id, step](HistoryDb& d) { d.rewind_run(id, step); });
  r.last_step = step;
  r.resumed_from = step;
  r.resume_kind = "quarantine";
  r.checkpoint_policy.restart_at(step);
  event(r.id, "quarantine_placed",
        "dp " + std::to_string(old_dp) + " -> " + std::to_string(dp) + ": " +
            one_line(placement_describe(pn, p.value())),
        {{"dp", dp}, {"previous_dp", old_dp}, {"spares_used", p->spares_used()}, {"checkpoint", dir}}, step);
}

Result<Placement> Coordinator::Impl::place_again(const Run& r, const std::vector<PlacementNode>& pn,
                                                 int* dp) const {
  Result<Config> cfg = config_parse(r.config_toml, "config");
  if (!cfg.ok()) return Status::error(cfg.error());
  Result<Placement> p = placement_assign(pn, {.dp = r.dp, .tp = r.tp, .pp = r.pp});
  *dp = r.dp;
  const int floor = std::min(r.dp, r.min_dp_or_1());
  for (int d = r.dp - 1; !p.ok() && d >= floor; --d) {
    // A smaller dp keeps the tp and pp degrees (whole tp groups and pipelines move): it must be a layout
    // the workers take (the global batch over dp, a 1F1B pipe's micro-batches).
    if (!run_layout_check(cfg.value(), {.dp = d, .tp = r.tp, .pp = r.pp, .vp = r.vp, .zero = r.zero}).ok())
      continue;
    Result<Placement> q = placement_assign(pn, {.dp = d, .tp = r.tp, .pp = r.pp});
    if (q.ok()) {
      p = std::move(q);
      *dp = d;
    }
  }
  if (!p.ok() && r.min_dp > 1) {
    return Status::error("no dp from " + std::to_string(r.dp) + " down to the run's min_dp " +
                         std::to_string(r.min_dp) + " fits the live nodes (at dp " + std::to_string(r.dp) +
                         ": " + p.error() + ")");
  }
  return p;
}

bool Coordinator::Impl::recover(Run& r, const std::string& failure, std::string* why, bool damaged) {
  // The gang could not load the checkpoint it was told to (every rank agreed that a shard or the manifest
  // is broken): it is set aside, kept for inspection and out of every later resume's way (the generation
  // placed next writes that step again, which would otherwise replace it), and the newest checkpoint left
  // is used: the one before it. In-memory copies (when those were restored) at or past its step are not
  // used again.
  json set_aside;
  if (!damaged) {
    r.damaged_in_row = 0;
  } else {
    const bool disk = !r.gen_resume_dir.empty() &&
                      (!r.gen_from_memory || failure.find(r.gen_resume_dir) != std::string::npos);
    set_aside = {{"generation", r.generation},
                 {"step", r.gen_from_step},
                 {"source", disk ? "disk" : "memory"},
                 {"dir", disk ? json(r.gen_resume_dir) : json(nullptr)},
                 {"moved_to", nullptr},
                 {"error", failure}};
    if (disk) {
      const fs::path from(r.gen_resume_dir);
      // Only the run's own checkpoints are moved (a resume-from may have named one elsewhere).
      if (from.parent_path().lexically_normal() != (fs::path(r.out_dir) / "checkpoints").lexically_normal()) {
        *why = "the checkpoint " + r.gen_resume_dir +
               " it was given is damaged, and it is not one of the run's " + "own (under " + r.out_dir +
               "/checkpoints) to fall back from";
        return false;
      }
      const fs::path to = fs::path(r.out_dir) / "checkpoints_damaged" /
                          ("generation_" + std::to_string(r.generation)) / from.filename();
      std::error_code ec;
      fs::create_directories(to.parent_path(), ec);
      if (!ec) fs::rename(from, to, ec);
      if (ec) {
        *why = "the checkpoint " + r.gen_resume_dir + " is damaged, and it cannot be moved aside to " +
               to.string() + ": " + ec.message();
        return false;
      }
      set_aside["moved_to"] = to.string();
    } else if (r.gen_from_memory) {
      r.memory_damaged_from =
          r.memory_damaged_from < 0 ? r.gen_from_step : std::min(r.memory_damaged_from, r.gen_from_step);
    }
    r.damaged_checkpoints.push_back(set_aside);
    ++r.damaged_in_row;
    // Every damaged checkpoint of the run, for the message of a run that is not recovered.
    const auto every_damaged = [&r] {
      std::string all;
      for (const json& d : r.damaged_checkpoints) {
        all += "\n  step " + std::to_string(d.value("step", int64_t{-1})) + " (" +
               d.value("source", std::string("disk")) +
               (d["moved_to"].is_string() ? ", kept in " + d["moved_to"].get<std::string>() : std::string()) +
               "): " + one_line(d.value("error", std::string()));
      }
      return all;
    };
    if (r.damaged_in_row > kMaxCheckpointFallbacks) {
      *why = std::to_string(r.damaged_in_row) + " damaged checkpoints in a row (at most " +
             std::to_string(kMaxCheckpointFallbacks) +
             " fallbacks): resume-from an older checkpoint by hand:" + every_damaged();
      return false;
    }
    std::vector<std::string> left = checkpoint_list(r.out_dir + "/checkpoints");
    const bool memory_left =
        memory_copies
            .newest_complete(r.id, r.memory_damaged_from >= 0 ? r.memory_damaged_from - 1 : INT64_MAX)
            .has_value();
    if (left.empty() && !memory_left) {
      *why = "no undamaged checkpoint is left to fall back to (each damaged one is kept for inspection):" +
             every_damaged();
      return false;
    }
  }
  // The newest committed checkpoint (checkpoint_list: only those whose manifest was renamed into place, so
  // a write cut off by the failure is never used); none yet: the run starts over from its first step.
  std::vector<std::string> committed = checkpoint_list(r.out_dir + "/checkpoints");
  // After a silent-data-corruption mismatch, the checkpoints past the last check every replica passed may
  // hold the corruption: they are moved aside (kept for a post-mortem, out of every resume's way: the new
  // generation writes those steps again), and the newest one left is used.
  const int64_t sdc_trusted = std::exchange(r.sdc_trusted_step, -1);
  // The step guard's streak in the gang (its guard_streak event; the gang stopped for it): a rollback to the
  // newest state from before the streak, passing over the streak's batches, at most the config's
  // train.guard_max_rollbacks times in the run. The checkpoints past it hold the streak's history: aside.
  const json streak = std::exchange(r.guard_streak, nullptr);
  const bool guard = streak.is_object();
  int64_t trusted = sdc_trusted;
  if (guard) {
    Result<Config> cfg = config_parse(r.config_toml, "config");
    const int limit = cfg.ok() ? cfg->train.guard_max_rollbacks : 0;
    if (r.guard_rollbacks >= limit) {
      *why = "the step guard's streak (" + streak.value("reason", std::string("?")) + ") after " +
             std::to_string(r.guard_rollbacks) +
             " rollbacks (train.guard_max_rollbacks = " + std::to_string(limit) +
             "): resume from the last checkpoint, with a lower optim.lr or optim.grad_clip set";
      return false;
    }
    const int64_t before = std::max<int64_t>(streak.value("to_step", int64_t{0}), 0);
    trusted = trusted < 0 ? before : std::min(trusted, before);
  }
  std::vector<std::string> untrusted;
  while (trusted >= 0 && !committed.empty() && checkpoint_dir_step(committed.back()) > trusted) {
    untrusted.push_back(committed.back());
    committed.pop_back();
  }
  std::string moved_to;
  if (!untrusted.empty()) {
    moved_to = r.out_dir + "/checkpoints_untrusted/generation_" + std::to_string(r.generation);
    std::error_code ec;
    std::filesystem::create_directories(moved_to, ec);
    for (const std::string& u : untrusted) {
      if (!ec) std::filesystem::rename(u, moved_to + "/" + std::filesystem::path(u).filename().string(), ec);
    }
    if (ec) {
      *why = "cannot move the checkpoints past step " + std::to_string(trusted) + " (" +
             (guard ? "the step guard's streak came after it" : "silent data corruption may be in them") +
             ") out of the way: " + ec.message();
      return false;
    }
  }
  const std::string dir = committed.empty() ? std::string() : committed.back();
  // The newest complete set of in-memory copies on the live agents, if newer than that checkpoint
  // (memory_copies.h); never past the last silent-data-corruption check every replica passed.
  int64_t memory_bound = trusted >= 0 ? trusted : INT64_MAX;
  if (r.memory_damaged_from >= 0) memory_bound = std::min(memory_bound, r.memory_damaged_from - 1);
  const std::optional<MemoryCopySet> memory = memory_copies.newest_complete(r.id, memory_bound);
  int64_t memory_seen = -1;
  for (const MemoryCopySet& m : memory_copies.all(r.id))
    if (m.step <= memory_bound) memory_seen = std::max(memory_seen, m.step);
  const RestoreChoice restore =
      restore_choose(memory, dir.empty() ? -1 : checkpoint_dir_step(dir), memory_seen);
  const bool from_memory = restore.source == RestoreSource::kMemory;
  const int64_t step = from_memory ? restore.step : dir.empty() ? 0 : checkpoint_dir_step(dir);
  if (step > r.restarted_from) r.restarts_in_row = 0;  // it got further since the last recovery
  // A fallback past a damaged checkpoint is bounded by kMaxCheckpointFallbacks, not by the budget: the
  // gang never trained.
  if (!guard && !damaged && r.restarts_in_row >= r.max_restarts) {
    *why = r.max_restarts == 0
               ? "recovery is off for this run (max_restarts 0)"
               : "it failed " + std::to_string(r.restarts_in_row + 1) + " times in a row without a newer " +
                     "checkpoint (max_restarts " + std::to_string(r.max_restarts) + ")";
    return false;
  }
  r.store.reset();
  const std::vector<PlacementNode> pn = placement_nodes();
  int dp = r.dp;
  Result<Placement> p = place_again(r, pn, &dp);
  if (!p.ok()) {
    *why = "cannot place it again: " + p.error();
    return false;
  }
  const int old_dp = r.dp;
  r.dp = dp;
  // Before start_generation, which records the run's options with the counts and tells the agents the
  // batches to pass over.
  const json skipped_before = r.guard_skipped;
  if (guard) {
    ++r.guard_rollbacks;
    std::vector<SkippedBatches> all;
    // Both are [[first, count], ...], checked as the event came in (ingest) or as this coordinator wrote
    // them.
    for (const json* ranges : {static_cast<const json*>(&r.guard_skipped), &streak.at("skipped")}) {
      for (const json& b : *ranges)
        for (uint64_t k = 0; k < b.at(1).get<uint64_t>(); ++k)
          sampler_skip_batch(all, b.at(0).get<uint64_t>() + k);
    }
    r.guard_skipped = json::array();
    for (const SkippedBatches& b : all) r.guard_skipped.push_back({b.first, b.count});
  } else {
    ++r.restarts;
  }
  // Each rank's shard from the first live agent holding it (the agents fetch them; the disk checkpoint
  // stays in `resume` for an agent that cannot).
  json served = json::array();
  if (from_memory) {
    json shards = json::array();
    for (const auto& [rank, holders] : memory->holders) {
      const std::string& node = holders.front();
      shards.push_back({{"rank", rank}, {"url", agent_url(nodes[node])}});
      served.push_back({{"rank", rank}, {"node", node}});
    }
    r.memory_restore = {{"step", memory->step}, {"shards", shards}};
  }
  if (Status s = start_generation(r, pn, p.value(), dir, GoodputCause::kRecovery); !s.ok()) {
    r.memory_restore = nullptr;
    r.dp = old_dp;
    if (guard) {
      --r.guard_rollbacks;
      r.guard_skipped = skipped_before;
    } else {
      --r.restarts;
    }
    *why = s.message();
    return false;
  }
  if (!guard) {
    if (!damaged) ++r.restarts_in_row;
    r.restarted_from = step;
  }
  if (r.state != RunState::kRunning) set_state(r, RunState::kRunning);  // a paused run goes on
  r.message.clear();
  writer->push_op([id = r.id, step, dir, from_memory](HistoryDb& d) {
    d.rewind_run(id, step);
    if (from_memory) return;  // the checkpoint below is not the state the run stands on
    // The checkpoint resumed from is committed on disk, but its commit record may have died with the gang
    // (rank 0's asynchronous writer commits, then the gang is killed before the record is sent): the
    // catalog learns of it here rather than missing the state the run now stands on.
    std::vector<CheckpointInfo> catalog;
    if (dir.empty() || !d.list_checkpoints(id, &catalog)) return;
    for (const CheckpointInfo& c : catalog)
      if (c.step == step && c.state == "committed") return;
    d.record_checkpoint({.run_id = id,
                         .step = step,
                         .path = dir,
                         .time_unix_s = unix_now_s(),
                         .message = "found committed on disk at a recovery (its commit record was lost with "
                                    "the gang)"});
  });
  r.last_step = step;
  r.resumed_from = step;
  r.resume_kind = guard ? "guard_rollback" : "recovery";
  r.checkpoint_policy.restart_at(step);
  young_daly_apply(r);  // one more failure: a new failure rate
  std::string served_text;
  for (const json& sv : served)
    served_text += (served_text.empty() ? "" : ", ") + std::string("rank ") +
                   std::to_string(sv["rank"].get<int>()) + " from " + sv["node"].get<std::string>();
  event(r.id, "restore",
        "generation " + std::to_string(r.generation) + " restores from " +
            (from_memory   ? "the in-memory copies at step " + std::to_string(step) + " (" + served_text + ")"
             : dir.empty() ? std::string("the start")
                           : "the checkpoint on disk at step " + std::to_string(step)) +
            ": " + restore.why,
        {{"source", from_memory   ? "memory"
                    : dir.empty() ? "start"
                                  : "disk"},
         {"step", step},
         {"generation", r.generation},
         {"why", restore.why},
         {"checkpoint", from_memory ? json(nullptr) : json(dir)},
         {"shards", served}},
        step);
  if (guard) {
    std::string batches;
    for (const json& b : streak.value("skipped", json::array())) {
      const uint64_t first = b.at(0).get<uint64_t>(), count = b.at(1).get<uint64_t>();
      batches += (batches.empty() ? "" : ", ") + std::to_string(first) +
                 (count > 1 ? ".." + std::to_string(first + count - 1) : std::string());
    }
    json payload = streak;
    payload["to_step"] = step;
    payload["dir"] = from_memory ? json(nullptr) : json(dir);
    payload["rollback"] = r.guard_rollbacks;
    payload["generation"] = r.generation;
    payload["source"] = "coordinator";
    payload["passed_over"] = r.guard_skipped;
    event(r.id, "guard_rollback",
          "rollback " + std::to_string(r.guard_rollbacks) + ": the gang stopped at step " +
              std::to_string(streak.value("from_step", int64_t{-1})) + " after " +
              std::to_string(streak.value("skips", 0)) + " skipped steps in a row (the last: " +
              streak.value("reason", std::string("?")) + "); generation " + std::to_string(r.generation) +
              " placed at dp " + std::to_string(dp) + " from " +
              (from_memory   ? "the in-memory copies at step " + std::to_string(step)
               : dir.empty() ? std::string("the start (no committed checkpoint before the streak)")
                             : "the checkpoint at step " + std::to_string(step)) +
              ", passing over batches " + batches +
              (untrusted.empty()
                   ? std::string()
                   : "; " + std::to_string(untrusted.size()) + " newer checkpoint(s) moved to " + moved_to),
          // At the streak's last step, as a single process' guard_rollback: the loss plot marks it there.
          payload, streak.value("from_step", step));
    return true;
  }
  if (damaged) {
    const int64_t bad_step = set_aside.value("step", int64_t{-1});
    const std::string where = from_memory ? "the in-memory copies at step " + std::to_string(step)
                              : dir.empty()
                                  ? std::string("the start")
                                  : "the checkpoint at step " + std::to_string(step) + " (" + dir + ")";
    json payload = set_aside;
    payload["fallback_step"] = step;
    payload["fallback_checkpoint"] = from_memory ? json(nullptr) : json(dir);
    payload["fallback_generation"] = r.generation;
    payload["fallbacks_in_row"] = r.damaged_in_row;
    event(r.id, "checkpoint_damaged",
          (set_aside["dir"].is_string() ? "the checkpoint at step " + std::to_string(bad_step) + " (" +
                                              set_aside["dir"].get<std::string>() + ")"
                                        : "the in-memory copies at step " + std::to_string(bad_step)) +
              " could not be loaded: " + one_line(failure) +
              (set_aside["moved_to"].is_string()
                   ? "; kept for inspection in " + set_aside["moved_to"].get<std::string>()
                   : std::string()) +
              "; generation " + std::to_string(r.generation) + " falls back to " + where,
          payload, step);
  }
  event(r.id, "recovery_placed",
        "run " + std::to_string(r.id) + " failed (" + one_line(failure) + "); generation " +
            std::to_string(r.generation) + " placed at dp " + std::to_string(dp) + " from " +
            (from_memory   ? "the in-memory copies at step " + std::to_string(step)
             : dir.empty() ? std::string("the start (no committed checkpoint yet)")
                           : "the checkpoint at step " + std::to_string(step)) +
            (sdc_trusted >= 0 ? " (no newer than step " + std::to_string(sdc_trusted) +
                                    ", the last silent-data-corruption check every replica passed" +
                                    (untrusted.empty() ? std::string()
                                                       : "; " + std::to_string(untrusted.size()) +
                                                             " newer checkpoint(s) moved to " + moved_to) +
                                    ")"
                              : std::string()) +
            ": " + one_line(placement_describe(pn, p.value())),
        {{"failure", failure},
         {"generation", r.generation},
         {"dp", dp},
         {"previous_dp", old_dp},
         {"spares_used", p->spares_used()},
         {"checkpoint", dir},
         {"sdc_trusted_step", sdc_trusted >= 0 ? json(sdc_trusted) : json(nullptr)},
         {"untrusted_checkpoints", untrusted},
         {"restarts", r.restarts},
         {"restarts_in_row", r.restarts_in_row},
         {"max_restarts", r.max_restarts}},
        step);
  return true;
}

HttpResponse Coordinator::Impl::submit(const HttpRequest& req) {
  JsonFields f(req.body);
  std::optional<std::string> toml = f.string("config");
  std::optional<std::string> name = f.string("name", JsonFields::optional);
  std::optional<int64_t> max_steps = f.integer("max_steps", 0, int64_t{1} << 40, JsonFields::optional);
  const json* layout = f.object("layout");
  const json* straggler = f.object("straggler", JsonFields::optional);
  std::optional<int64_t> every =
      f.integer("checkpoint_every_steps", 1, int64_t{1} << 40, JsonFields::optional);
  std::optional<int64_t> keep_last = f.integer("keep_last", 1, 100000, JsonFields::optional);
  std::optional<int64_t> max_restarts = f.integer("max_restarts", 0, 1000, JsonFields::optional);
  std::optional<std::string> policy_name = f.string("checkpoint_policy", JsonFields::optional);
  std::optional<int64_t> min_dp = f.integer("min_dp", 1, 1 << 20, JsonFields::optional);
  std::optional<int64_t> max_dp = f.integer("max_dp", 1, 1 << 20, JsonFields::optional);
  std::optional<int64_t> hang_timeout = f.integer("hang_timeout_s", 1, 3600, JsonFields::optional);
  std::optional<int64_t> dp, zero, tp, pp, vp;
  if (layout != nullptr) {
    JsonFields l(*layout, "layout.");
    dp = l.integer("dp", 1, 1 << 20);
    zero = l.integer("zero", 0, 3, JsonFields::optional);
    tp = l.integer("tp", 1, 1 << 10, JsonFields::optional);
    pp = l.integer("pp", 1, 1 << 10, JsonFields::optional);
    vp = l.integer("vp", 1, 1 << 10, JsonFields::optional);
    if (Status s = l.finish(); !s.ok()) return HttpResponse::error(400, s.message());
  }
  if (Status s = f.finish(); !s.ok()) return HttpResponse::error(400, s.message());
  Result<StragglerWatchOptions> straggler_options = straggler_watch_parse(straggler);
  if (!straggler_options.ok()) return HttpResponse::error(400, straggler_options.error());
  const std::optional<CheckpointPolicyMode> policy =
      checkpoint_policy_mode_from_name(policy_name.value_or("fixed"));
  if (!policy) {
    return HttpResponse::error(400, "field \"checkpoint_policy\": \"" + one_line(policy_name->substr(0, 64)) +
                                        "\" is not a policy: give \"fixed\" (checkpoint_every_steps) or "
                                        "\"young_daly\" (the interval from the measured checkpoint cost and "
                                        "failure rate)");
  }
  if (*policy == CheckpointPolicyMode::kYoungDaly && !every) {
    return HttpResponse::error(400,
                               "field \"checkpoint_policy\": young_daly needs checkpoint_every_steps too: "
                               "the interval used until a failure gives the run a failure rate");
  }
  Result<Config> cfg = config_parse(*toml, "config");
  if (!cfg.ok()) return HttpResponse::error(400, "field \"config\": " + cfg.error());
  if (name) {
    if (Status s = check_name("name", *name, kMaxRunName); !s.ok())
      return HttpResponse::error(400, s.message());
  }
  const RunLayout lay{.dp = static_cast<int>(*dp),
                      .tp = static_cast<int>(tp.value_or(1)),
                      .pp = static_cast<int>(pp.value_or(1)),
                      .vp = static_cast<int>(vp.value_or(1)),
                      .zero = static_cast<int>(zero.value_or(0))};
  if (Status s = run_layout_check(cfg.value(), lay); !s.ok()) {
    return HttpResponse::error(400, "field \"layout\" (" + run_layout_text(lay) + "): " + s.message());
  }
  // The bounds a recovery shrinks within (and a resume-from stays within): around dp, and each a layout the
  // global batch splits over, as dp must be.
  if (min_dp && *min_dp > *dp) {
    return HttpResponse::error(400, "field \"min_dp\": " + std::to_string(*min_dp) + " is above layout.dp " +
                                        std::to_string(*dp) + ": give min_dp <= dp <= max_dp");
  }
  if (max_dp && *max_dp < *dp) {
    return HttpResponse::error(400, "field \"max_dp\": " + std::to_string(*max_dp) + " is below layout.dp " +
                                        std::to_string(*dp) + ": give min_dp <= dp <= max_dp");
  }
  for (const auto& [field, value] : {std::pair{"min_dp", min_dp}, std::pair{"max_dp", max_dp}}) {
    if (!value) continue;
    RunLayout at = lay;
    at.dp = static_cast<int>(*value);
    if (Status s = run_layout_check(cfg.value(), at); !s.ok())
      return HttpResponse::error(400, std::string("field \"") + field + "\": " + s.message());
  }

  std::lock_guard<std::mutex> lock(mu);
  // While a run is being re-adopted its gang's slots are not known yet: a placement now could land on
  // them.
  for (const auto& [rid, other] : runs) {
    if (!other.adopting) continue;
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(other.adopt_deadline - Clock::now());
    return HttpResponse::error(409,
                               "run " + std::to_string(rid) +
                                   " is being re-adopted after a coordinator restart (its gang's slots are "
                                   "not known yet): submit again in " +
                                   std::to_string(std::max<int64_t>(left.count(), 0) + 1) + " ms");
  }
  std::vector<PlacementNode> pn = placement_nodes();
  Result<Placement> p = placement_assign(pn, {.dp = lay.dp, .tp = lay.tp, .pp = lay.pp});
  if (!p.ok()) return HttpResponse::error(409, p.error());  // nothing started, nothing recorded

  const std::string run_name = name.value_or(std::string("run"));
  const RunUtilisation util = run_utilisation_planned(cfg.value(), gpt_param_table(cfg->model).numel());
  const std::string layout_text = run_layout_text(lay);
  int64_t id = -1;
  {
    // The one write not queued: the run's id comes from the database. Records of the run come later.
    std::lock_guard<std::mutex> db_lock(db_mu);
    Run draft;  // the options as run_options() writes them; the run itself is made once it has its id
    draft.dp = lay.dp;
    draft.tp = lay.tp;
    draft.pp = lay.pp;
    draft.vp = lay.vp;
    draft.db_world = lay.world();
    draft.zero = static_cast<int>(zero.value_or(0));
    draft.max_steps = max_steps.value_or(-1);
    draft.max_restarts = static_cast<int>(max_restarts.value_or(kDefaultMaxRestarts));
    draft.min_dp = static_cast<int>(min_dp.value_or(0));
    draft.max_dp = static_cast<int>(max_dp.value_or(0));
    draft.hang_timeout_s = static_cast<int>(hang_timeout.value_or(kDefaultHangTimeoutS));
    draft.straggler = StragglerWatch(straggler_options.value());
    draft.checkpoint_policy = CheckpointPolicy({.every_steps = every.value_or(0),
                                                .keep_last = static_cast<int>(keep_last.value_or(0)),
                                                .mode = *policy});
    id = db->begin_run({.name = run_name,
                        .world_size = static_cast<int32_t>(lay.world()),
                        .config = *toml,
                        .layout = layout_text,
                        .peak_name = util.peak_name,
                        .peak_flops = util.peak_flops,
                        .flops_per_token = util.flops_per_token,
                        .mfu_formula = util.formula,
                        .options = run_options(draft).dump()});
    if (id < 0) return HttpResponse::error(500, "cannot record the run: " + db->error());
  }
  Run& r = runs[id];
  r.id = id;
  r.name = run_name;
  r.dp = lay.dp;
  r.tp = lay.tp;
  r.pp = lay.pp;
  r.vp = lay.vp;
  r.zero = lay.zero;
  r.max_steps = max_steps.value_or(-1);
  r.max_restarts = static_cast<int>(max_restarts.value_or(kDefaultMaxRestarts));
  r.min_dp = static_cast<int>(min_dp.value_or(0));
  r.max_dp = static_cast<int>(max_dp.value_or(0));
  r.hang_timeout_s = static_cast<int>(hang_timeout.value_or(kDefaultHangTimeoutS));
  r.straggler = StragglerWatch(straggler_options.value());
  r.checkpoint_policy = CheckpointPolicy({.every_steps = every.value_or(0),
                                          .keep_last = static_cast<int>(keep_last.value_or(0)),
                                          .mode = *policy});
  r.config_toml = *toml;
  r.backend = cfg->train.backend;
  r.peak_name = util.peak_name;
  r.peak_flops = util.peak_flops;
  r.flops_per_token = util.flops_per_token;
  r.mfu_formula = util.formula;
  r.created_unix = unix_now_s();
  r.out_dir = (fs::absolute(opt.dir) / "runs" / std::to_string(id)).string();
  std::error_code ec;
  fs::create_directories(r.out_dir, ec);
  if (ec) return HttpResponse::error(500, "cannot create the run folder " + r.out_dir + ": " + ec.message());
  std::ofstream(r.out_dir + "/config.toml") << *toml;
  r.db_world = r.world();
  if (Status st = start_generation(r, pn, p.value(), "", GoodputCause::kSubmit); !st.ok()) {
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

HttpResponse Coordinator::Impl::action(const HttpRequest& req, TrainAction a) {
  // The actions take no fields: one sent ({"force": true}, {"step": 40}) asks for something they would not
  // do, and used to be dropped with a 202.
  if (Status s = JsonFields(req.body).finish(); !s.ok()) return HttpResponse::error(400, s.message());
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
  if (r->adopting) {
    return HttpResponse::error(409, std::string("cannot ") + what + " run " + std::to_string(r->id) +
                                        " yet: the restarted coordinator is waiting for its gang to come "
                                        "back (GET /v1/runs/" +
                                        std::to_string(r->id) + "/events); try again");
  }
  const uint64_t request = queue_action(*r, a, "api", req.remote);
  if (std::optional<RunState> to = run_action_target(ra)) set_state(*r, *to);
  return HttpResponse::ok({{"run", r->id}, {"action", what}, {"request", request}}, 202);
}

HttpResponse Coordinator::Impl::resume_from(const HttpRequest& req) {
  JsonFields f(req.body);
  const json* ckpt = f.any("checkpoint");
  const json* layout = f.object("layout", JsonFields::optional);
  std::optional<int64_t> dp, zero, tp, pp, vp;
  if (layout != nullptr) {
    JsonFields l(*layout, "layout.");
    dp = l.integer("dp", 1, 1 << 20, JsonFields::optional);
    zero = l.integer("zero", 0, 3, JsonFields::optional);
    tp = l.integer("tp", 1, 1 << 10, JsonFields::optional);
    pp = l.integer("pp", 1, 1 << 10, JsonFields::optional);
    vp = l.integer("vp", 1, 1 << 10, JsonFields::optional);
    if (Status s = l.finish(); !s.ok()) return HttpResponse::error(400, s.message());
  }
  if (Status s = f.finish(); !s.ok()) return HttpResponse::error(400, s.message());
  std::lock_guard<std::mutex> lock(mu);
  HttpResponse err;
  Run* r = find_run(req, &err);
  if (r == nullptr) return err;
  const int new_dp = static_cast<int>(dp.value_or(r->dp));
  Result<Config> cfg = config_parse(r->config_toml, "config");
  if (!cfg.ok()) return HttpResponse::error(500, "the run's config no longer parses: " + cfg.error());
  // Any layout the workers take, resharded from the checkpoint's global coordinates (tp, pp, dp, ZeRO);
  // unnamed degrees stay the run's.
  const RunLayout lay{.dp = new_dp,
                      .tp = static_cast<int>(tp.value_or(r->tp)),
                      .pp = static_cast<int>(pp.value_or(r->pp)),
                      .vp = static_cast<int>(vp.value_or(r->vp)),
                      .zero = static_cast<int>(zero.value_or(r->zero))};
  if (cfg->train.global_batch % new_dp != 0) {
    return HttpResponse::error(400, "field \"layout.dp\": " + std::to_string(new_dp) +
                                        " does not divide the run's train.global_batch = " +
                                        std::to_string(cfg->train.global_batch));
  }
  if (Status s = run_layout_check(cfg.value(), lay); !s.ok()) {
    return HttpResponse::error(400, "field \"layout\" (" + run_layout_text(lay) + "): " + s.message());
  }
  if ((r->min_dp > 0 && new_dp < r->min_dp) || (r->max_dp > 0 && new_dp > r->max_dp)) {
    return HttpResponse::error(400, "field \"layout.dp\": " + std::to_string(new_dp) + " is outside run " +
                                        std::to_string(r->id) +
                                        "'s min_dp..max_dp = " + std::to_string(r->min_dp_or_1()) + ".." +
                                        (r->max_dp > 0 ? std::to_string(r->max_dp) : std::string("any")));
  }
  if (lay.world() > r->db_world) {
    return HttpResponse::error(
        400, "field \"layout\": " + run_layout_text(lay) + " is " + std::to_string(lay.world()) +
                 " ranks, but run " + std::to_string(r->id) + " was recorded for at most " +
                 std::to_string(r->db_world) + " ranks; resume it on dp x tp x pp <= " +
                 std::to_string(r->db_world) + ", or submit a new run for a larger layout");
  }
  // A live run is refused below (stop it first), but a layout it could never take is refused here, while
  // it still trains: the What-if Apply's operator stops a run only for a move that can happen. Its own
  // slots count as free: the stop gives them back.
  if (!run_state_terminal(r->state)) {
    std::vector<PlacementNode> freed = placement_nodes();
    for (PlacementNode& n : freed) {
      for (const NodeShare& sh : r->shares) {
        if (sh.node != n.id || sh.done) continue;
        std::erase_if(n.busy, [&](int slot) {
          return std::find(sh.slots.begin(), sh.slots.end(), slot) != sh.slots.end();
        });
      }
    }
    Result<Placement> fits = placement_assign(freed, {.dp = lay.dp, .tp = lay.tp, .pp = lay.pp});
    if (!fits.ok()) {
      return HttpResponse::error(409, "run " + std::to_string(r->id) + " cannot be moved to " +
                                          run_layout_text(lay) +
                                          " (even with its own slots free): " + fits.error());
    }
  }
  if (Status s = run_action_check(RunAction::kResumeFrom, r->state); !s.ok()) {
    return HttpResponse::error(
        409, "cannot resume run " + std::to_string(r->id) + " from a checkpoint: " + s.message());
  }
  Result<std::pair<std::string, int64_t>> c = resolve_checkpoint(*r, *ckpt);
  if (!c.ok()) return HttpResponse::error(400, c.error());
  const std::vector<PlacementNode> pn = placement_nodes();
  Result<Placement> p = placement_assign(pn, {.dp = lay.dp, .tp = lay.tp, .pp = lay.pp});
  if (!p.ok()) return HttpResponse::error(409, p.error());  // nothing started, nothing changed
  const RunLayout old{.dp = r->dp, .tp = r->tp, .pp = r->pp, .vp = r->vp, .zero = r->zero};
  const int old_dp = r->dp;
  r->dp = lay.dp;
  r->tp = lay.tp;
  r->pp = lay.pp;
  r->vp = lay.vp;
  r->zero = lay.zero;
  if (Status s = start_generation(*r, pn, p.value(), c->first, GoodputCause::kResume); !s.ok()) {
    r->dp = old.dp;
    r->tp = old.tp;
    r->pp = old.pp;
    r->vp = old.vp;
    r->zero = old.zero;
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
  const std::string layout_text = run_layout_text(lay);
  event(r->id, "resume_requested",
        "resume from " + fs::path(c->first).filename().string() + " on " + layout_text + " requested from " +
            req.remote,
        {{"from", req.remote}, {"checkpoint", c->first}, {"step", step}, {"layout", layout_text}}, step);
  event(r->id, "resume_placed", one_line(placement_describe(pn, p.value())),
        {{"dp", r->dp},
         {"tp", r->tp},
         {"pp", r->pp},
         {"previous_dp", old_dp},
         {"previous_layout", run_layout_text(old)},
         {"spares_used", p->spares_used()}},
        step);
  json out = run_json(*r, false);
  out["checkpoint"] = c->first;
  out["from_step"] = step;
  return HttpResponse::ok(out, 202);
}

HttpResponse Coordinator::Impl::inject(const HttpRequest& req) {
  JsonFields f(req.body);
  std::optional<std::string> fault = f.string("fault");
  std::optional<int64_t> rank = f.integer("rank", 0, (int64_t{1} << 20) - 1, JsonFields::optional);
  std::optional<int64_t> ms = f.integer("ms", 1, 600000, JsonFields::optional);
  if (Status s = f.finish(); !s.ok()) return HttpResponse::error(400, s.message());
  if (!opt.allow_fault_injection) {
    return HttpResponse::error(
        403,
        "fault injection is off on this coordinator: start it with "
        "--allow-fault-injection (gantry-engine coordinator or up) for drills and tests");
  }
  int sig = 0;
  if (*fault == "kill") sig = SIGKILL;
  if (*fault == "hang") sig = SIGSTOP;
  // slow and nan reach the worker as a frame (train.h's TrainLiveFaults), not as a signal.
  const bool live = *fault == "slow" || *fault == "nan";
  if (sig == 0 && !live) {
    return HttpResponse::error(400,
                               "field \"fault\": \"" + one_line(fault->substr(0, 64)) +
                                   "\" is not a fault this coordinator injects: give \"kill\" (SIGKILL), "
                                   "\"hang\" (SIGSTOP), \"slow\" (with \"ms\") or \"nan\"");
  }
  if (*fault == "slow" && !ms)
    return HttpResponse::error(400, "field \"ms\": \"slow\" needs the forward's delay in ms (1..600000)");
  if (*fault != "slow" && ms)
    return HttpResponse::error(400, "field \"ms\": only \"slow\" takes a delay, not \"" + *fault + "\"");
  std::lock_guard<std::mutex> lock(mu);
  HttpResponse err;
  Run* r = find_run(req, &err);
  if (r == nullptr) return err;
  if (r->state != RunState::kRunning && r->state != RunState::kPaused) {
    return HttpResponse::error(409, "run " + std::to_string(r->id) + " is " +
                                        std::string(run_state_name(r->state)) +
                                        ": faults go into live runs only");
  }
  if (rank && *rank >= r->world()) {
    return HttpResponse::error(400, "field \"rank\": run " + std::to_string(r->id) + " has ranks 0.." +
                                        std::to_string(r->world() - 1) + ", not " + std::to_string(*rank));
  }
  const int target = rank ? static_cast<int>(*rank) : static_cast<int>(std::random_device{}() % r->world());
  const std::string node = r->node_of(target);
  auto it = nodes.find(node);
  if (node.empty() || it == nodes.end()) {
    return HttpResponse::error(
        409, "rank " + std::to_string(target) + " of run " + std::to_string(r->id) + " is on no node now");
  }
  json order = {{"run", r->id}, {"generation", r->generation}, {"rank", target}, {"signal", sig}};
  json payload = {{"fault", *fault}, {"rank", target}, {"from", req.remote}, {"generation", r->generation}};
  if (live) order["fault"] = *fault;
  if (ms) order["ms"] = payload["ms"] = *ms;
  it->second.inject.push_back(std::move(order));
  event(r->id, "fault_injected",
        "fault \"" + *fault + "\"" + (ms ? " (" + std::to_string(*ms) + " ms)" : std::string()) +
            " injected into rank " + std::to_string(target) + " on " + node + " by " + req.remote,
        std::move(payload),
        -1,  // an act in time, like node_failed, not a step's: a recovery's rewind keeps it
        node);
  return HttpResponse::ok({{"run", r->id}, {"fault", *fault}, {"rank", target}, {"node", node}}, 202);
}

}  // namespace gantry
