#include "engine/cluster/ingest_writer.h"

#include <cstdio>

namespace gantry {

IngestWriter::IngestWriter(HistoryDb* db, std::mutex* db_mu, IngestWriterOptions options,
                           std::function<void()> on_commit)
    : db_(db), db_mu_(db_mu), o_(options), on_commit_(std::move(on_commit)) {
  thread_ = std::thread([this] { loop(); });
}

IngestWriter::~IngestWriter() {
  stop();
}

bool IngestWriter::reserve(size_t records) {
  std::lock_guard<std::mutex> lock(mu_);
  // An empty queue takes any batch, so one larger than the bound is never refused forever.
  if (stopping_ || (queued_agent_records_ > 0 && queued_agent_records_ + records > o_.max_queued_records)) {
    ++stats_.refused_batches;
    return false;
  }
  queued_agent_records_ += records;
  return true;
}

void IngestWriter::push(RecordBatch&& batch, size_t reserved) {
  std::lock_guard<std::mutex> lock(mu_);
  if (batch.empty() || stopping_) {
    queued_agent_records_ -= reserved;
    return;
  }
  queue_.push_back({.batch = std::move(batch), .op = nullptr, .agent_records = reserved});
  ++pushed_;
  cv_.notify_one();
}

void IngestWriter::push_own(RecordBatch&& batch) {
  if (batch.empty()) return;
  std::lock_guard<std::mutex> lock(mu_);
  if (stopping_) return;
  queue_.push_back({.batch = std::move(batch), .op = nullptr, .agent_records = 0});
  ++pushed_;
  cv_.notify_one();
}

void IngestWriter::push_op(std::function<void(HistoryDb&)> op) {
  std::lock_guard<std::mutex> lock(mu_);
  if (stopping_) return;
  queue_.push_back({.batch = {}, .op = std::move(op), .agent_records = 0});
  ++pushed_;
  cv_.notify_one();
}

void IngestWriter::flush() {
  std::unique_lock<std::mutex> lock(mu_);
  const uint64_t target = pushed_;
  done_cv_.wait(lock, [&] { return written_ >= target || !thread_.joinable(); });
}

uint64_t IngestWriter::queued_items() const {
  std::lock_guard<std::mutex> lock(mu_);
  return pushed_;
}

uint64_t IngestWriter::written_items() const {
  std::lock_guard<std::mutex> lock(mu_);
  return written_;
}

void IngestWriter::stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
    cv_.notify_one();
  }
  if (thread_.joinable()) thread_.join();
  done_cv_.notify_all();
}

IngestWriterStats IngestWriter::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  IngestWriterStats s = stats_;
  s.queued_records = queued_agent_records_;
  return s;
}

void IngestWriter::write_batches(std::vector<RecordBatch>& batches) {
  if (batches.empty()) return;
  // One transaction for all of them; the merge costs a copy, a transaction per batch cost far more.
  RecordBatch merged;
  if (batches.size() == 1) {
    merged = std::move(batches.front());
    batches.front() = RecordBatch();
  } else {
    for (RecordBatch& b : batches) {
      merged.rank_steps.insert(merged.rank_steps.end(), std::make_move_iterator(b.rank_steps.begin()),
                               std::make_move_iterator(b.rank_steps.end()));
      merged.steps.insert(merged.steps.end(), b.steps.begin(), b.steps.end());
      merged.events.insert(merged.events.end(), std::make_move_iterator(b.events.begin()),
                           std::make_move_iterator(b.events.end()));
      merged.checkpoints.insert(merged.checkpoints.end(), std::make_move_iterator(b.checkpoints.begin()),
                                std::make_move_iterator(b.checkpoints.end()));
      merged.device_samples.insert(merged.device_samples.end(),
                                   std::make_move_iterator(b.device_samples.begin()),
                                   std::make_move_iterator(b.device_samples.end()));
    }
  }
  uint64_t written = 0, failed = 0, transactions = 0;
  {
    std::lock_guard<std::mutex> lock(*db_mu_);
    if (db_->ingest(merged)) {
      written = merged.size();
      transactions = 1;
    } else if (batches.size() == 1) {
      failed = merged.size();
      std::fprintf(stderr, "gantry-engine coordinator: cannot record %zu records: %s\n", merged.size(),
                   db_->error().c_str());
    } else {
      // All or nothing per transaction: write the batches one by one, so that a bad one loses only itself.
      // The rank-step records were moved out of the batches; take them back from the merge in order.
      size_t rs = 0, ev = 0, st = 0, ck = 0, ds = 0;
      for (RecordBatch& b : batches) {
        RecordBatch one;
        const size_t n_rs = b.rank_steps.size(), n_ev = b.events.size(), n_st = b.steps.size(),
                     n_ck = b.checkpoints.size(), n_ds = b.device_samples.size();
        one.rank_steps.assign(merged.rank_steps.begin() + static_cast<std::ptrdiff_t>(rs),
                              merged.rank_steps.begin() + static_cast<std::ptrdiff_t>(rs + n_rs));
        one.steps.assign(merged.steps.begin() + static_cast<std::ptrdiff_t>(st),
                         merged.steps.begin() + static_cast<std::ptrdiff_t>(st + n_st));
        one.events.assign(merged.events.begin() + static_cast<std::ptrdiff_t>(ev),
                          merged.events.begin() + static_cast<std::ptrdiff_t>(ev + n_ev));
        one.checkpoints.assign(merged.checkpoints.begin() + static_cast<std::ptrdiff_t>(ck),
                               merged.checkpoints.begin() + static_cast<std::ptrdiff_t>(ck + n_ck));
        one.device_samples.assign(merged.device_samples.begin() + static_cast<std::ptrdiff_t>(ds),
                                  merged.device_samples.begin() + static_cast<std::ptrdiff_t>(ds + n_ds));
        ds += n_ds;
        rs += n_rs;
        st += n_st;
        ev += n_ev;
        ck += n_ck;
        if (db_->ingest(one)) {
          written += one.size();
          ++transactions;
        } else {
          failed += one.size();
          std::fprintf(stderr, "gantry-engine coordinator: cannot record %zu records: %s\n", one.size(),
                       db_->error().c_str());
        }
      }
    }
  }
  std::lock_guard<std::mutex> lock(mu_);
  stats_.records += written;
  stats_.failed_records += failed;
  stats_.transactions += transactions;
}

void IngestWriter::loop() {
  for (;;) {
    std::deque<Item> items;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty() && stopping_) return;
      // Everything queued, up to the per-transaction bound in records (whole items).
      size_t records = 0;
      while (!queue_.empty() &&
             (items.empty() || records + queue_.front().batch.size() <= o_.max_records_per_transaction)) {
        records += queue_.front().batch.size();
        items.push_back(std::move(queue_.front()));
        queue_.pop_front();
      }
    }
    std::vector<RecordBatch> run;  // consecutive batches: one transaction
    size_t agent_records = 0;
    for (Item& it : items) {
      agent_records += it.agent_records;
      if (!it.op) {
        // Sizes are kept in the batch for the one-by-one fallback, so move only after merging.
        run.push_back(std::move(it.batch));
        continue;
      }
      write_batches(run);
      run.clear();
      std::lock_guard<std::mutex> lock(*db_mu_);
      it.op(*db_);
    }
    write_batches(run);
    {
      std::lock_guard<std::mutex> lock(mu_);
      queued_agent_records_ -= agent_records;
      written_ += items.size();
    }
    done_cv_.notify_all();
    if (on_commit_) on_commit_();
  }
}

}  // namespace gantry
