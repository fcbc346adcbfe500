#include "ui/console/local_cache.h"

#include <cstdio>

#include "engine/cluster/api_client.h"     // ApiClient::run_path: the run's name in the key
#include "engine/cluster/run_lifecycle.h"  // the API's run states

namespace gantry::console {

std::string local_cache_key(const std::string& url, const RunView& run) {
  char created[32];
  std::snprintf(created, sizeof created, "%.3f", run.created_unix_s);
  return "gantry-console " + url + ApiClient::run_path(run.id) + " created " + created;
}

std::unique_ptr<LocalCache> LocalCache::open(const std::string& path, std::string* error) {
  std::unique_ptr<HistoryDb> db = HistoryDb::open(path, {}, error);
  if (!db) return nullptr;
  auto cache = std::unique_ptr<LocalCache>(new LocalCache());
  cache->db_ = std::move(db);
  std::vector<RunRow> rows;
  if (!cache->db_->list_runs(&rows)) {
    *error = "cannot list the runs of " + path + ": " + cache->db_->error();
    return nullptr;
  }
  for (const RunRow& r : rows) {
    cache->runs_[r.info.out_dir] = r.id;
    cache->worlds_[r.id] = r.info.world_size;
  }
  return cache;
}

int64_t LocalCache::local_run(const std::string& url, const RunView& run) {
  const std::string key = local_cache_key(url, run);
  if (auto it = runs_.find(key); it != runs_.end()) return it->second;
  const int32_t world = std::max(1, std::max(run.world, run.dp));
  const int64_t id =
      db_->begin_run({.name = run.name,
                      .world_size = world,
                      .layout = "dp=" + std::to_string(run.dp) + " tp=" + std::to_string(run.tp) +
                                " pp=" + std::to_string(run.pp) + " zero=" + std::to_string(run.zero),
                      .out_dir = key,
                      .created_unix_s = run.created_unix_s,
                      .peak_name = run.peak_name,
                      .peak_flops = run.peak_flops,
                      .mfu_formula = run.mfu_formula});
  if (id < 0) {
    error_ = "cannot add run " + std::to_string(run.id) + " to the local cache: " + db_->error();
    return -1;
  }
  runs_[key] = id;
  worlds_[id] = world;
  return id;
}

bool LocalCache::ingest(int64_t local, std::vector<StepRecord> steps, std::vector<RankStepRecord> rank_steps,
                        std::vector<EventRecord> events) {
  RecordBatch b;
  const int32_t world = worlds_.count(local) ? worlds_[local] : 0;
  for (StepRecord& s : steps) {
    s.run_id = local;
    b.steps.push_back(std::move(s));
  }
  for (RankStepRecord& r : rank_steps) {
    if (r.rank >= world) continue;  // the local run's rank tables were sized for its first world
    r.run_id = local;
    b.rank_steps.push_back(std::move(r));
  }
  for (EventRecord& e : events) {
    e.run_id = local;
    b.events.push_back(std::move(e));
  }
  if (b.empty()) return true;
  if (!db_->ingest(b)) {
    error_ = "local cache: " + db_->error();
    return false;
  }
  return true;
}

bool LocalCache::record_checkpoints(int64_t local, const std::vector<CheckpointView>& checkpoints) {
  for (const CheckpointView& c : checkpoints) {
    if (!db_->record_checkpoint({.run_id = local,
                                 .step = c.step,
                                 .path = c.path,
                                 .bytes = c.bytes,
                                 .write_s = c.write_s,
                                 .state = c.state,
                                 .time_unix_s = c.time_unix_s,
                                 .stall_s = c.stall_s})) {
      error_ = "local cache: " + db_->error();
      return false;
    }
  }
  return true;
}

bool LocalCache::rewind(int64_t local, int64_t step) {
  if (db_->rewind_run(local, step)) return true;
  error_ = "local cache: " + db_->error();
  return false;
}

bool LocalCache::finish(int64_t local, const RunView& run) {
  const std::optional<RunState> rs = run_state_from_name(run.state);
  const RunStatus st = rs == RunState::kFailed        ? RunStatus::failed
                       : rs == RunState::kStopped     ? RunStatus::stopped
                       : rs == RunState::kInterrupted ? RunStatus::interrupted
                                                      : RunStatus::finished;
  if (db_->finish_run(local, st, run.message)) return true;
  error_ = "local cache: " + db_->error();
  return false;
}

}  // namespace gantry::console
