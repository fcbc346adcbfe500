// Keeps a training run's history in <out>/history.sqlite (storage/): the run, every step's figures, this
// rank's step record and checkpoint events. A failure to write history is reported once and never stops
// training: the history serves the operator, the checkpoints are what must not be lost.
#pragma once

#include <memory>
#include <string>

#include "engine/core/train.h"

namespace gantry {

class HistoryDb;

class HistoryWriter final : public TrainObserver {
 public:
  HistoryWriter(std::string out_dir, std::string run_name);
  ~HistoryWriter() override;

  void on_run(const RunDescription& run) override;
  void on_step(const StepReport& r) override;
  void on_checkpoint(const CheckpointReport& c) override;
  // Marks the run finished, stopped or failed, with a message for the last two.
  void finish(bool ok, bool stopped, const std::string& message);

 private:
  void warn(const std::string& what);

  std::string out_dir_, run_name_, path_;
  std::unique_ptr<HistoryDb> db_;
  int64_t run_id_ = -1;
  std::string host_;
  int device_ = -1;
  bool warned_ = false;
};

}  // namespace gantry
