// Keeps a training run's history in <out>/history.sqlite (storage/): the run, every step's figures, this
// rank's step record and checkpoint events. A failure to write history is reported once and never stops
// training: the history serves the operator, the checkpoints are what must not be lost.
//
// Two ways to feed it: as the TrainObserver of a one-process run (`train`), or, in the launcher of a gang
// (`run`), with the RecordBatches the workers send (ingest()): every rank's rank-step records, rank 0's
// step records and checkpoint events. Those are buffered until a whole step of every rank is there, so a
// step costs one transaction, not one per rank.
#pragma once

#include <memory>
#include <string>

#include "engine/core/train.h"
#include "telemetry/records.h"

namespace gantry {

class HistoryDb;
struct CheckpointInfo;

class HistoryWriter final : public TrainObserver {
 public:
  // `world_size` and `layout` describe the run's ranks ("dp=4 tp=1 pp=1 zero=1"); one process by default.
  HistoryWriter(std::string out_dir, std::string run_name, int world_size = 1,
                std::string layout = "dp=1 tp=1 pp=1 zero=0");
  ~HistoryWriter() override;

  void on_run(const RunDescription& run) override;
  void on_step(const StepReport& r) override;
  void on_checkpoint(const CheckpointReport& c) override;
  void on_step_skipped(int64_t step, const std::string& reason) override;
  // Records received from workers (their run_id is replaced by this run's). Checkpoint events also enter
  // the checkpoint catalog (their payload carries dir, bytes and seconds). Written once every rank's
  // record of the newest step is in, or at flush()/finish(). Ignored before on_run.
  void ingest(const RecordBatch& batch);
  void flush();
  // Marks the run finished, stopped or failed, with a message for the last two (flushes first).
  void finish(bool ok, bool stopped, const std::string& message);

 private:
  // Catalogues a committed checkpoint, and marks the run's earlier ones that are gone from disk (pruned to
  // train.keep_checkpoints) as deleted.
  bool record_checkpoint(const CheckpointInfo& c);
  void warn(const std::string& what);

  std::string out_dir_, run_name_, path_;
  int world_size_ = 1;
  std::string layout_;
  std::unique_ptr<HistoryDb> db_;
  int64_t run_id_ = -1;
  std::string host_;
  int device_ = -1;
  bool warned_ = false;
  RecordBatch pending_;  // ingest()ed, not yet written
};

}  // namespace gantry
