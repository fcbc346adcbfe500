// Ingest (coordinator_impl.h): agents' records into each run's live state and the database writer's
// queue, events, the checkpoint catalog and keep_last pruning.
#include <algorithm>
#include <cstdio>

#include "engine/cluster/coordinator_impl.h"
#include "engine/core/checkpoint.h"  // checkpoint_list, checkpoint_prune: the catalog against the disk

namespace gantry {
namespace {

using json = nlohmann::json;

// A streak is at most train.guard_max_skips_in_row (<= 1e6) batches: a larger count is not our worker's.
constexpr uint64_t kMaxGuardStreakBatches = 1000000;

}  // namespace

void Coordinator::Impl::event(int64_t run, const std::string& kind, const std::string& message, json payload,
                              int64_t step, const std::string& node) {
  RecordBatch b;
  b.events.push_back({.run_id = run,
                      .time_unix_s = unix_now_s(),
                      .step = step,
                      .kind = kind,
                      .node = node,
                      .message = message,
                      .payload = payload.dump()});
  writer->push_own(std::move(b));
}

void Coordinator::Impl::record(std::vector<EventRecord> events) {
  if (events.empty()) return;
  RecordBatch b;
  b.events = std::move(events);
  writer->push_own(std::move(b));
}

void Coordinator::Impl::ingest(RecordBatch& batch, size_t reserved) {
  if (batch.empty()) return writer->push(RecordBatch(), reserved);
  records_total += batch.size();
  RecordBatch keep;
  for (RankStepRecord& rs : batch.rank_steps) {
    auto it = runs.find(rs.run_id);
    if (it == runs.end() || rs.rank < 0 || rs.rank >= it->second.world()) continue;
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
            "run " + std::to_string(r.id) + " resumed at step " + std::to_string(s.step) + " on dp " +
                std::to_string(r.dp) + " (from the checkpoint at step " + std::to_string(r.resumed_from) +
                ")",
            {{"dp", r.dp}, {"zero", r.zero}, {"from_step", r.resumed_from}}, s.step);
      r.resumed_from = -1;
    }
    goodput_step(r, s);
    it->second.last_step = std::max(it->second.last_step, s.step);
    it->second.latest_step = s;
    // The checkpoint policy: only while the run trains (a pause holds it, a stop or a move checkpoints
    // anyway).
    if (r.state == RunState::kRunning && r.relocate_node.empty() && r.checkpoint_policy.due(s.step)) {
      queue_action(r, TrainAction::checkpoint, "policy",
                   "checkpoint policy (every " + std::to_string(r.checkpoint_policy.options().every_steps) +
                       " steps)");
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
    }
    if (e.kind == "sdc_mismatch") {
      const json p = json::parse(e.payload, nullptr, false);
      // -1: no check passed in this generation; what it started from is then the newest state to trust
      // (0, the start, where that is no longer known).
      int64_t passed = p.is_object() ? p.value("last_passed_step", int64_t{-1}) : int64_t{-1};
      if (passed < 0) passed = std::max<int64_t>(r.resumed_from, 0);
      r.sdc_trusted_step = r.sdc_trusted_step < 0 ? passed : std::min(r.sdc_trusted_step, passed);
      quarantine_for_sdc(r, e);
    }
    if (e.kind == "guard_streak" && e.rank == 0) {
      // The gang stops next (kWorkerExitGuardStreak) and recover() rolls it back: only a payload it can use
      // (guard_rollback_payload's) is kept; another one leaves an ordinary recovery.
      json p = json::parse(e.payload, nullptr, false);
      bool usable = p.is_object() && p.contains("to_step") && p["to_step"].is_number_integer() &&
                    p.contains("from_step") && p["from_step"].is_number_integer() && p.contains("skips") &&
                    p["skips"].is_number_integer() && p.contains("reason") && p["reason"].is_string() &&
                    p.contains("skipped") && p["skipped"].is_array();
      for (const json& b : usable ? p["skipped"] : json::array()) {
        usable = usable && b.is_array() && b.size() == 2 && b[0].is_number_unsigned() &&
                 b[1].is_number_unsigned() && b[1].get<uint64_t>() <= kMaxGuardStreakBatches;
      }
      if (usable) r.guard_streak = std::move(p);
    }
    keep.events.push_back(std::move(e));
  }
  // Checkpoints: the records are catalogued, and become the run's events, by the database's ingest
  // (HistoryDb::ingest, with the other records); what follows a commit here is the coordinator's own.
  std::vector<Run*> committed;
  for (CheckpointRecord& c : batch.checkpoints) {
    auto it = runs.find(c.run_id);
    if (it == runs.end()) continue;
    Run& r = it->second;
    if (c.state == CheckpointState::kCommitted && c.rank == kCheckpointAllRanks) {
      committed.push_back(&r);
      r.checkpoint_stalls.push_back(c.stall_s);
      young_daly_apply(r);
      if (!r.relocate_node.empty()) {
        r.relocate_checkpoint = c.dir;
        event(r.id, "quarantine_checkpointed",
              "run " + std::to_string(r.id) + " checkpointed at step " + std::to_string(c.step) +
                  " to leave node " + r.relocate_node,
              {{"dir", r.relocate_checkpoint}, {"node", r.relocate_node}}, c.step);
      }
    }
    keep.checkpoints.push_back(std::move(c));
  }
  devices_take(batch.device_samples, keep);
  writer->push(std::move(keep), reserved);
  // After the new catalog entries (queue order): the workers keep their last train.keep_checkpoints, and
  // the catalog says which went; then the run's keep_last.
  for (Run* r : committed) {
    writer->push_op([id = r->id, root = r->out_dir + "/checkpoints"](HistoryDb& d) {
      std::vector<int64_t> on_disk, gone;
      for (const std::string& dir : checkpoint_list(root)) on_disk.push_back(checkpoint_dir_step(dir));
      if (!d.reconcile_checkpoints(id, on_disk, &gone)) return;
      // Gone before the coordinator's keep_last pruned it: the workers' own train.keep_checkpoints (an
      // asynchronous writer prunes as it commits) or a hand. Every checkpoint that goes gets its event.
      RecordBatch b;
      for (const int64_t step : gone) {
        b.events.push_back({.run_id = id,
                            .time_unix_s = unix_now_s(),
                            .step = step,
                            .kind = "checkpoint_deleted",
                            .message = "the checkpoint of step " + std::to_string(step) +
                                       " is no longer on disk (the workers keep train.keep_checkpoints)",
                            .payload = json({{"step", step}, {"source", "workers"}}).dump()});
      }
      if (!b.empty() && !d.ingest(b))
        std::fprintf(stderr, "gantry-engine coordinator: cannot record an event: %s\n", d.error().c_str());
    });
    prune_checkpoints(*r);
  }
  // The straggler policy: a run whose records reached its next evaluation step is scored now.
  for (auto& entry : runs) {
    Run& r = entry.second;  // a named reference: lambdas may not capture a structured binding (C++17)
    if (run_state_terminal(r.state)) continue;
    const int64_t before = r.straggler.evaluated_at_step();
    record(r.straggler.maybe_evaluate(r.id, unix_now_s(), [&r](int32_t rank) { return r.node_of(rank); }));
    if (r.straggler.evaluated_at_step() != before) straggler_act(r);
  }
}

void Coordinator::Impl::prune_checkpoints(Run& r) {
  const int keep = r.checkpoint_policy.options().keep_last;
  if (keep <= 0) return;
  writer->push_op([id = r.id, root = r.out_dir + "/checkpoints", keep](HistoryDb& d) {
    RecordBatch b;
    auto ev = [&](const std::string& kind, const std::string& message, const json& payload, int64_t step) {
      b.events.push_back({.run_id = id,
                          .time_unix_s = unix_now_s(),
                          .step = step,
                          .kind = kind,
                          .message = message,
                          .payload = payload.dump()});
    };
    Result<std::vector<std::string>> gone = checkpoint_prune(root, keep);
    if (!gone.ok()) {
      ev("checkpoint_delete_failed", gone.error(), {{"source", "policy"}}, -1);
    } else {
      std::vector<int64_t> on_disk;
      for (const std::string& dir : checkpoint_list(root)) on_disk.push_back(checkpoint_dir_step(dir));
      std::vector<int64_t> marked;
      d.reconcile_checkpoints(id, on_disk, &marked);
      for (const std::string& dir : gone.value()) {
        const int64_t step = checkpoint_dir_step(dir);
        ev("checkpoint_deleted",
           "deleted " + dir + " (keep_last " + std::to_string(keep) + ": newer checkpoints have committed)",
           {{"dir", dir}, {"step", step}, {"keep_last", keep}, {"source", "policy"}}, step);
        marked.erase(std::remove(marked.begin(), marked.end(), step), marked.end());
      }
      for (const int64_t step : marked) {  // gone meanwhile, not by this pruning
        ev("checkpoint_deleted",
           "the checkpoint of step " + std::to_string(step) +
               " is no longer on disk (the workers keep train.keep_checkpoints)",
           {{"step", step}, {"source", "workers"}}, step);
      }
    }
    if (!b.empty() && !d.ingest(b))
      std::fprintf(stderr, "gantry-engine coordinator: cannot record an event: %s\n", d.error().c_str());
  });
}

}  // namespace gantry
