// The console's own copy of what it has seen, in a Gantry history file (storage/HistoryDb): each remote
// run becomes a local run, found again by a key of the coordinator's URL, the run's id and its creation
// time, so a console started again adds to the same local run rather than a new one. Written from the
// network thread only (a HistoryDb is one connection, one thread).
//
//   std::unique_ptr<LocalCache> cache = LocalCache::open(state_dir + "/console.sqlite", &error);
//   int64_t local = cache->local_run(url, run);              // -1: cache->error() says why
//   cache->ingest(local, new_steps, new_rank_steps, new_events);
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "storage/history_db.h"
#include "ui/console/console_state.h"

namespace gantry::console {

class LocalCache {
 public:
  static std::unique_ptr<LocalCache> open(const std::string& path, std::string* error);

  // The local run holding remote run `run` of the coordinator at `url`; created on first use. -1 on error.
  int64_t local_run(const std::string& url, const RunView& run);
  // Records in one transaction; each record's run_id is set to `local` here.
  bool ingest(int64_t local, std::vector<StepRecord> steps, std::vector<RankStepRecord> rank_steps,
              std::vector<EventRecord> events);
  bool record_checkpoints(int64_t local, const std::vector<CheckpointView>& checkpoints);
  bool rewind(int64_t local, int64_t step);
  bool finish(int64_t local, const RunView& run);
  // Runs held locally (for a history view and for tests).
  bool list_runs(std::vector<RunRow>* out) { return db_->list_runs(out); }
  HistoryDb& db() { return *db_; }

  const std::string& error() const { return error_; }

 private:
  std::unique_ptr<HistoryDb> db_;
  std::map<std::string, int64_t> runs_;  // key -> local run id
  std::map<int64_t, int32_t> worlds_;    // local run id -> the world its rank tables were sized for
  std::string error_;
};

// The key a remote run is kept under (RunInfo::out_dir of its local run).
std::string local_cache_key(const std::string& url, const RunView& run);

}  // namespace gantry::console
