// Keeps a training run's history in <out>/history.sqlite (storage/): the run, every step's figures, this
// rank's step record and checkpoint events. A failure to write history is reported once and never stops
// training: the history serves the operator, the checkpoints are what must not be lost.
//
// Two ways to feed it: as the TrainObserver of a one-process run (`train`), or, in the launcher of a gang
// (`run`), with the RecordBatches the workers send (ingest()): every rank's rank-step records, rank 0's
// step records and checkpoint records. Those go through the coordinator's own ingest path
// (engine/cluster/ingest_writer.h): a writer thread that merges whatever is queued into one transaction
// and catalogues checkpoints in queue order, so `run` and a cluster write history the same way.
#pragma once

#include <memory>
#include <mutex>
#include <string>

#include "engine/core/train.h"
#include "telemetry/records.h"

namespace gantry {

class HistoryDb;
class IngestWriter;

class HistoryWriter final : public TrainObserver {
 public:
  // `world_size` and `layout` describe the run's ranks ("dp=4 tp=1 pp=1 zero=1"); one process by default.
  HistoryWriter(std::string out_dir, std::string run_name, int world_size = 1,
                std::string layout = "dp=1 tp=1 pp=1 zero=0");
  ~HistoryWriter() override;

  void on_run(const RunDescription& run) override;
  void on_step(const StepReport& r) override;
  void on_checkpoint(const CheckpointReport& c) override;
  void on_checkpoint_failed(const CheckpointReport& c, const std::string& error) override;
  void on_step_skipped(int64_t step, const std::string& reason) override;
  void on_guard_rollback(const GuardRollback& r) override;
  // Records received from workers (their run_id is replaced by this run's). Checkpoint records enter the
  // catalog and the run's events through the database's ingest, as at the coordinator. Queued for the
  // writer thread, never waited for; flush() waits. Ignored before on_run.
  void ingest(const RecordBatch& batch);
  void flush();
  // Marks the run finished, stopped or failed, with a message for the last two (flushes first).
  void finish(bool ok, bool stopped, const std::string& message);

 private:
  // Marks the run's catalogued checkpoints that are gone from disk (pruned to train.keep_checkpoints) as
  // deleted; `dir` is one checkpoint's directory, its parent the run's checkpoints folder.
  static bool reconcile_checkpoints(HistoryDb& db, int64_t run_id, const std::string& dir);
  void warn(const std::string& what);

  std::string out_dir_, run_name_, path_;
  int world_size_ = 1;
  std::string layout_;
  std::unique_ptr<HistoryDb> db_;
  int64_t run_id_ = -1;
  std::string host_;
  int device_ = -1;
  bool warned_ = false;
  std::mutex db_mu_;                      // db_, between this thread and the writer's
  std::unique_ptr<IngestWriter> writer_;  // ingest()'s path, started by its first batch
};

}  // namespace gantry
