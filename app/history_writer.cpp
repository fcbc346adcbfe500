#include "app/history_writer.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>  // checkpoint events' payload

#include "engine/core/checkpoint.h"  // checkpoint_list: which checkpoints are still on disk
#include "engine/core/step_records.h"
#include "storage/history_db.h"
#include "telemetry/records.h"

namespace gantry {
HistoryWriter::HistoryWriter(std::string out_dir, std::string run_name, int world_size, std::string layout)
    : out_dir_(std::move(out_dir)),
      run_name_(std::move(run_name)),
      path_(out_dir_ + "/history.sqlite"),
      world_size_(world_size),
      layout_(std::move(layout)) {
  char host[256] = "";
  gethostname(host, sizeof host - 1);
  host_ = host;
}

HistoryWriter::~HistoryWriter() = default;

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
  if (!db_->ingest(batch)) warn("cannot record step " + std::to_string(r.step) + ": " + db_->error());
}

bool HistoryWriter::record_checkpoint(const CheckpointInfo& c) {
  if (!db_->record_checkpoint(c)) return false;
  std::vector<int64_t> on_disk;
  for (const std::string& dir : checkpoint_list(std::filesystem::path(c.path).parent_path().string()))
    on_disk.push_back(checkpoint_dir_step(dir));
  return db_->reconcile_checkpoints(run_id_, on_disk);
}

void HistoryWriter::on_checkpoint(const CheckpointReport& c) {
  if (!db_ || run_id_ < 0) return;
  const double now = unix_now_s();
  if (!record_checkpoint({.run_id = run_id_,
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
  for (RankStepRecord r : batch.rank_steps) {
    r.run_id = run_id_;
    pending_.rank_steps.push_back(std::move(r));
  }
  for (StepRecord r : batch.steps) {
    r.run_id = run_id_;
    pending_.steps.push_back(r);
  }
  for (EventRecord e : batch.events) {
    e.run_id = run_id_;
    // Rank 0 commits a checkpoint (train.h): its event is the one the catalog keeps.
    if (e.kind == "checkpoint" && e.rank <= 0) {
      nlohmann::json p = nlohmann::json::parse(e.payload, nullptr, /*allow_exceptions=*/false);
      if (p.is_object() && p.value("dir", "") != "") {
        if (!record_checkpoint({.run_id = run_id_,
                                .step = e.step,
                                .path = p.value("dir", ""),
                                .bytes = p.value("bytes", uint64_t{0}),
                                .write_s = p.value("seconds", 0.0),
                                .time_unix_s = e.time_unix_s})) {
          warn("cannot record the checkpoint of step " + std::to_string(e.step) + ": " + db_->error());
        }
      }
    }
    pending_.events.push_back(std::move(e));
  }
  // A whole step of every rank is in when the newest step has world_size records: then one transaction.
  if (pending_.rank_steps.empty()) {
    if (!pending_.empty()) flush();  // events between steps (the final checkpoint) need not wait
    return;
  }
  const int64_t newest = pending_.rank_steps.back().step;
  const auto of_newest = std::count_if(pending_.rank_steps.begin(), pending_.rank_steps.end(),
                                       [&](const RankStepRecord& r) { return r.step == newest; });
  if (of_newest >= world_size_ || pending_.rank_steps.size() >= static_cast<size_t>(world_size_) * 4) flush();
}

void HistoryWriter::flush() {
  if (!db_ || run_id_ < 0 || pending_.empty()) return;
  if (!db_->ingest(pending_))
    warn("cannot record " + std::to_string(pending_.size()) + " records: " + db_->error());
  pending_.clear();
}

void HistoryWriter::finish(bool ok, bool stopped, const std::string& message) {
  if (!db_ || run_id_ < 0) return;
  flush();
  const RunStatus status = !ok ? RunStatus::failed : stopped ? RunStatus::stopped : RunStatus::finished;
  if (!db_->finish_run(run_id_, status, message)) warn("cannot finish the run: " + db_->error());
}

}  // namespace gantry
