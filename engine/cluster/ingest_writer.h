// The coordinator's database writer: one thread that owns the writes to the run database, so that no HTTP
// handler waits on SQLite. Handlers queue what must be written (agents' record batches, the coordinator's
// own events, and other writes as closures) and return; the thread takes everything queued, merges the
// consecutive record batches into one transaction (a transaction costs ~100 µs whatever it holds,
// storage/history_db.h, so one per beat of each agent was the ceiling) and runs the closures in their
// place, so writes land in the order they were queued.
//
//   IngestWriter w(db.get(), &db_mu, {.max_queued_records = 1 << 18});
//   if (!w.reserve(batch.size())) return HttpResponse::error(503, ...);  // full: the agent sends it again
//   ... the coordinator's state from the batch ...
//   w.push(std::move(batch), reserved);                                   // never waits
//   w.push_op([](HistoryDb& db) { db.finish_run(...); });                // never refused
//   ...
//   w.stop();  // writes what is queued, then ends the thread
//
// The queue is bounded in records for agents' batches only (push refuses past the bound, and the agent
// keeps its records for its next beat); the coordinator's own events and closures are always taken, since
// losing them would lose the run's history. Readers take `db_mu` for their reads (the writer holds it for
// one transaction at a time). If a merged transaction fails, its batches are written again one by one, so a
// bad batch loses only its own records.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "storage/history_db.h"
#include "telemetry/records.h"

namespace gantry {

struct IngestWriterOptions {
  size_t max_queued_records = size_t{1} << 18;           // agents' records waiting; past it reserve() refuses
  size_t max_records_per_transaction = size_t{1} << 16;  // a long queue is written in several transactions
};

struct IngestWriterStats {
  uint64_t transactions = 0;     // record transactions committed
  uint64_t records = 0;          // records written
  uint64_t refused_batches = 0;  // push() refused: the queue was full
  uint64_t failed_records = 0;   // records the database refused
  size_t queued_records = 0;     // now
};

class IngestWriter {
 public:
  // `db` and `db_mu` must outlive the writer; `on_commit` is called (without db_mu) after each round of
  // writes, to wake readers of new events.
  IngestWriter(HistoryDb* db, std::mutex* db_mu, IngestWriterOptions options = {},
               std::function<void()> on_commit = nullptr);
  ~IngestWriter();  // stop()
  IngestWriter(const IngestWriter&) = delete;
  IngestWriter& operator=(const IngestWriter&) = delete;

  // Room for an agent's batch of `records`: false when the queue is full (an empty queue takes any size).
  // A true reservation must be followed by push(batch, records), whatever the batch has become.
  bool reserve(size_t records);
  void push(RecordBatch&& batch, size_t reserved);
  // The coordinator's own records (events): always taken.
  void push_own(RecordBatch&& batch);
  // Any other write, run on the writer thread in queue order with db_mu held: always taken.
  void push_op(std::function<void(HistoryDb&)> op);
  // Returns once everything queued before the call is written.
  void flush();
  // Tickets, in queue order: what was queued up to queued_items() (read right after a push: that push's
  // ticket) is in the database once written_items() reaches it. The coordinator tells agents both, so
  // that an agent keeps a batch until it is written, not merely taken (a coordinator killed with it still
  // queued would lose it).
  uint64_t queued_items() const;
  uint64_t written_items() const;
  // Writes what is queued and ends the thread; later pushes are refused (ops and own records dropped).
  void stop();

  IngestWriterStats stats() const;

 private:
  struct Item {
    RecordBatch batch;                   // records, or
    std::function<void(HistoryDb&)> op;  // a write of another kind
    size_t agent_records = 0;            // counted against max_queued_records
  };
  void loop();
  void write_batches(std::vector<RecordBatch>& batches);

  HistoryDb* db_;
  std::mutex* db_mu_;
  IngestWriterOptions o_;
  std::function<void()> on_commit_;
  mutable std::mutex mu_;
  std::condition_variable cv_, done_cv_;
  std::deque<Item> queue_;
  size_t queued_agent_records_ = 0;
  uint64_t pushed_ = 0, written_ = 0;  // items, for flush()
  bool stopping_ = false;
  IngestWriterStats stats_;
  std::thread thread_;
};

}  // namespace gantry
