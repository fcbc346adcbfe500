#include "app/history_writer.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>  // checkpoint events' payload

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

bool HistoryWriter::record_checkpoint(HistoryDb& db, const CheckpointInfo& c) {
  if (!db.record_checkpoint(c)) return false;
  std::vector<int64_t> on_disk;
  for (const std::string& dir : checkpoint_list(std::filesystem::path(c.path).parent_path().string()))
    on_disk.push_back(checkpoint_dir_step(dir));
  return db.reconcile_checkpoints(c.run_id, on_disk);
}

void HistoryWriter::on_checkpoint(const CheckpointReport& c) {
  if (!db_ || run_id_ < 0) return;
  const double now = unix_now_s();
  std::lock_guard<std::mutex> lock(db_mu_);
  if (!record_checkpoint(*db_, {.run_id = run_id_,
                                .step = c.step,
                                .path = c.dir,
                                .bytes = c.bytes,
                                .write_s = c.seconds,
                                .time_unix_s = now})) {
    return warn("cannot record the checkpoint of step " + std::to_string(c.step) + ": " + db_->error());
  }
  RecordBatch batch;
  EventRecord e;
  e.run_id = run_id_;
  e.time_unix_s = now;
  e.step = c.step;
  e.kind = "checkpoint";
  e.message = "checkpoint committed: " + c.dir;
  batch.events.push_back(e);
  if (!db_->ingest(batch)) warn("cannot record an event: " + db_->error());
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

void HistoryWriter::ingest(const RecordBatch& batch) {
  if (!db_ || run_id_ < 0) return;
  if (!writer_) writer_ = std::make_unique<IngestWriter>(db_.get(), &db_mu_);
  RecordBatch b = batch;
  for (RankStepRecord& r : b.rank_steps) r.run_id = run_id_;
  for (StepRecord& r : b.steps) r.run_id = run_id_;
  for (EventRecord& e : b.events) {
    e.run_id = run_id_;
    // Rank 0 commits a checkpoint (train.h): its event is the one the catalog keeps.
    if (e.kind != "checkpoint" || e.rank > 0) continue;
    nlohmann::json p = nlohmann::json::parse(e.payload, nullptr, /*allow_exceptions=*/false);
    if (!p.is_object() || p.value("dir", "") == "") continue;
    const CheckpointInfo c{.run_id = run_id_,
                           .step = e.step,
                           .path = p.value("dir", ""),
                           .bytes = p.value("bytes", uint64_t{0}),
                           .write_s = p.value("seconds", 0.0),
                           .time_unix_s = e.time_unix_s};
    // On the writer thread, in queue order with the records (as the coordinator does).
    writer_->push_op([c](HistoryDb& db) {
      if (!record_checkpoint(db, c))
        std::fprintf(stderr, "warning: run history: cannot record the checkpoint of step %lld: %s\n",
                     static_cast<long long>(c.step), db.error().c_str());
    });
  }
  writer_->push_own(std::move(b));
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
