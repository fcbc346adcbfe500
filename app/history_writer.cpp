#include "app/history_writer.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>  // step_skipped events' payload

#include "engine/cluster/ingest_writer.h"
#include "engine/core/checkpoint.h"  // checkpoint_list: which checkpoints are still on disk
#include "engine/core/step_records.h"
#include "storage/history_db.h"
#include "telemetry/host.h"
#include "telemetry/records.h"

namespace gantry {
HistoryWriter::HistoryWriter(std::string out_dir, std::string run_name, int world_size, std::string layout)
    : out_dir_(std::move(out_dir)),
      run_name_(std::move(run_name)),
      path_(out_dir_ + "/history.sqlite"),
      world_size_(world_size),
      layout_(std::move(layout)) {
  host_ = host_name();
}

HistoryWriter::~HistoryWriter() {
  if (writer_) writer_->stop();  // what is queued is written before the database closes
}

void HistoryWriter::warn(const std::string& what) {
  if (warned_) return;
  warned_ = true;
  std::fprintf(stderr, "warning: run history %s: %s (training goes on; checkpoints are unaffected)\n",
               path_.c_str(), what.c_str());
}

void HistoryWriter::on_run(const RunDescription& run) {
  std::string error;
  db_ = HistoryDb::open(path_, {}, &error);
  if (!db_) return warn("cannot open: " + error);
  device_ = run.backend == "cuda" ? 0 : -1;
  run_id_ = db_->begin_run({.name = run_name_,
                            .world_size = world_size_,
                            .config = run.config_toml,
                            .code_version = run.code_version,
                            .data_version = run.data_version,
                            .layout = layout_,
                            .out_dir = out_dir_,
                            .peak_name = run.peak_name,
                            .peak_flops = run.peak_flops,
                            .flops_per_token = run.flops_per_token,
                            .mfu_formula = run.mfu_formula});
  if (run_id_ < 0) warn("cannot begin the run: " + db_->error());
}

void HistoryWriter::on_step(const StepReport& r) {
  if (!db_ || run_id_ < 0) return;
  RecordBatch batch;
  batch.rank_steps.push_back(rank_step_record(r, host_, device_, 1));
  batch.steps.push_back(step_record(r, unix_now_s()));
  batch.rank_steps.back().run_id = run_id_;
  batch.steps.back().run_id = run_id_;
  std::lock_guard<std::mutex> lock(db_mu_);
  if (!db_->ingest(batch)) warn("cannot record step " + std::to_string(r.step) + ": " + db_->error());
}

bool HistoryWriter::reconcile_checkpoints(HistoryDb& db, int64_t run_id, const std::string& dir) {
  std::vector<int64_t> on_disk;
  for (const std::string& d : checkpoint_list(std::filesystem::path(dir).parent_path().string()))
    on_disk.push_back(checkpoint_dir_step(d));
  return db.reconcile_checkpoints(run_id, on_disk);
}

void HistoryWriter::on_checkpoint(const CheckpointReport& c) {
  if (!db_ || run_id_ < 0) return;
  RecordBatch batch;
  batch.checkpoints.push_back(checkpoint_committed_record(c, host_, 1, unix_now_s()));
  batch.checkpoints.back().run_id = run_id_;
  // The same ingest as a worker's record: the catalog entry and the run's event, then what left the disk.
  std::lock_guard<std::mutex> lock(db_mu_);
  if (!db_->ingest(batch) || !reconcile_checkpoints(*db_, run_id_, c.dir)) {
    return warn("cannot record the checkpoint of step " + std::to_string(c.step) + ": " + db_->error());
  }
}

void HistoryWriter::on_checkpoint_failed(const CheckpointReport& c, const std::string& error) {
  if (!db_ || run_id_ < 0) return;
  RecordBatch batch;
  batch.checkpoints.push_back(checkpoint_failed_record(c, error, 0, host_, unix_now_s()));
  batch.checkpoints.back().run_id = run_id_;
  std::lock_guard<std::mutex> lock(db_mu_);
  if (!db_->ingest(batch)) warn("cannot record the failed checkpoint: " + db_->error());
}

void HistoryWriter::on_step_skipped(int64_t step, const std::string& reason) {
  if (!db_ || run_id_ < 0) return;
  RecordBatch batch;
  EventRecord e;
  e.run_id = run_id_;
  e.time_unix_s = unix_now_s();
  e.step = step;
  e.kind = "step_skipped";
  e.message = "step " + std::to_string(step) + " skipped: " + reason;
  e.payload = nlohmann::json{{"reason", reason}}.dump();
  batch.events.push_back(e);
  if (!db_->ingest(batch)) warn("cannot record an event: " + db_->error());
}

void HistoryWriter::on_guard_rollback(const GuardRollback& r) {
  if (!db_ || run_id_ < 0) return;
  RecordBatch batch;
  EventRecord e;
  e.run_id = run_id_;
  e.time_unix_s = unix_now_s();
  e.step = r.from_step;
  e.kind = "guard_rollback";
  e.message = guard_rollback_message(r);
  e.payload = guard_rollback_payload(r);
  batch.events.push_back(e);
  if (!db_->ingest(batch)) warn("cannot record an event: " + db_->error());
}

void HistoryWriter::ingest(const RecordBatch& batch) {
  if (!db_ || run_id_ < 0) return;
  if (!writer_) writer_ = std::make_unique<IngestWriter>(db_.get(), &db_mu_);
  RecordBatch b = batch;
  for (RankStepRecord& r : b.rank_steps) r.run_id = run_id_;
  for (StepRecord& r : b.steps) r.run_id = run_id_;
  for (EventRecord& e : b.events) e.run_id = run_id_;
  std::vector<std::string> committed;  // rank 0's commits (train.h): the catalog's entries
  for (CheckpointRecord& c : b.checkpoints) {
    c.run_id = run_id_;
    if (c.state == CheckpointState::kCommitted && c.rank == kCheckpointAllRanks) committed.push_back(c.dir);
  }
  writer_->push_own(std::move(b));  // the catalog entries and their events, with the other records
  for (const std::string& dir : committed) {
    // Then, in queue order (as the coordinator does), the earlier checkpoints the workers pruned to
    // train.keep_checkpoints are marked deleted.
    writer_->push_op([id = run_id_, dir](HistoryDb& db) {
      if (!reconcile_checkpoints(db, id, dir))
        std::fprintf(stderr, "warning: run history: cannot reconcile the checkpoint catalog: %s\n",
                     db.error().c_str());
    });
  }
}

void HistoryWriter::flush() {
  if (writer_) writer_->flush();
}

void HistoryWriter::finish(bool ok, bool stopped, const std::string& message) {
  if (!db_ || run_id_ < 0) return;
  if (writer_) writer_->stop();  // everything queued is written
  const RunStatus status = !ok ? RunStatus::failed : stopped ? RunStatus::stopped : RunStatus::finished;
  std::lock_guard<std::mutex> lock(db_mu_);
  if (!db_->finish_run(run_id_, status, message)) warn("cannot finish the run: " + db_->error());
}

}  // namespace gantry
