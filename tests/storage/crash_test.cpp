// A writer killed with SIGKILL in the middle of ingesting: the file must pass PRAGMA integrity_check, every
// batch the writer saw committed must be there in full, nothing half-written may be (a batch is all or
// nothing), the aggregate tiles must agree with the rows, and a new writer must carry on from there.
#include <gtest/gtest.h>
#include <signal.h>
#include <sqlite3.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <map>
#include <random>
#include <string>

#include "storage/history_db.h"
#include "tests/scratch_dir.h"

namespace gantry {
namespace {

namespace fs = std::filesystem;

constexpr int kRanks = 72;  // past 64, so per-step aggregate tiles are built too

// Every value is a function of (step, rank), so a reader can tell a record is the one that was written.
double value_of(int64_t step, int32_t rank) {
  return std::round(((step * 7 + rank * 13) % 1000) * 1.024) / 1024.0 + 0.25;
}

RecordBatch batch_for(int64_t run, int64_t step) {
  RecordBatch b;
  for (int32_t r = 0; r < kRanks; ++r) {
    RankStepRecord x;
    x.run_id = run;
    x.step = step;
    x.rank = r;
    x.host = "node-" + std::to_string(r / 8);
    x.total_s = value_of(step, r);
    x.phases.forward = x.total_s / 2;
    b.rank_steps.push_back(x);
  }
  b.steps.push_back({.run_id = run, .step = step, .loss = 1.0 + static_cast<double>(step)});
  b.events.push_back({.run_id = run, .step = step, .kind = "tick"});
  return b;
}

// The writer: opens (or reopens) the history and ingests one step per batch, telling the parent the
// step number after each commit. Never returns.
[[noreturn]] void writer(const std::string& path, int ack_fd) {
  std::string error;
  auto db = HistoryDb::open(path, {}, &error);
  if (!db) _exit(3);
  std::vector<RunRow> runs;
  if (!db->list_runs(&runs)) _exit(4);
  const int64_t run = runs.empty() ? db->begin_run({.name = "crash", .world_size = kRanks}) : runs[0].id;
  int64_t step = runs.empty() ? 0 : runs[0].last_step + 1;
  for (;; ++step) {
    if (!db->ingest(batch_for(run, step))) _exit(5);
    if (write(ack_fd, &step, sizeof step) != static_cast<ssize_t>(sizeof step)) _exit(6);
  }
}

std::string integrity(const std::string& path) {
  sqlite3* db = nullptr;
  sqlite3_open(path.c_str(), &db);
  sqlite3_stmt* st = nullptr;
  std::string out = "no answer";
  if (sqlite3_prepare_v2(db, "PRAGMA integrity_check", -1, &st, nullptr) == SQLITE_OK &&
      sqlite3_step(st) == SQLITE_ROW) {
    out = reinterpret_cast<const char*>(sqlite3_column_text(st, 0));
  }
  sqlite3_finalize(st);
  sqlite3_close(db);
  return out;
}

// Starts a writer, lets it commit at least `min_acks` batches and then a random while longer, kills it.
// Returns the last step it acknowledged.
int64_t run_and_kill(const std::string& path, int min_acks, std::mt19937_64& rng) {
  int fds[2];
  EXPECT_EQ(pipe(fds), 0);
  const pid_t pid = fork();
  if (pid == 0) {
    close(fds[0]);
    writer(path, fds[1]);
  }
  close(fds[1]);
  int64_t last = -1, step;
  for (int n = 0; n < min_acks && read(fds[0], &step, sizeof step) == static_cast<ssize_t>(sizeof step); ++n)
    last = step;
  usleep(static_cast<useconds_t>(rng() % 20000));  // land somewhere inside a transaction, or a checkpoint
  kill(pid, SIGKILL);
  int status = 0;
  waitpid(pid, &status, 0);
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL)
      << "the writer failed on its own: " << status;
  while (read(fds[0], &step, sizeof step) == static_cast<ssize_t>(sizeof step))
    last = step;  // acks in flight
  close(fds[0]);
  return last;
}

void check_history(const std::string& path, int64_t acked) {
  ASSERT_EQ(integrity(path), "ok");
  std::string error;
  auto db = HistoryDb::open(path, {.read_only = true}, &error);
  ASSERT_NE(db, nullptr) << error;
  std::vector<RunRow> runs;
  ASSERT_TRUE(db->list_runs(&runs));
  ASSERT_EQ(runs.size(), 1u);
  const int64_t run = runs[0].id, last = runs[0].last_step;
  // Every acknowledged batch; perhaps one more that committed before its ack was written; no more.
  ASSERT_GE(last, acked);
  ASSERT_LE(last, acked + 1);

  std::vector<RankStepRecord> rs;
  ASSERT_TRUE(db->read_rank_steps(run, 0, kStepEnd, {}, SIZE_MAX, &rs)) << db->error();
  ASSERT_EQ(rs.size(), static_cast<size_t>((last + 1) * kRanks)) << "a batch is all or nothing";
  std::map<int64_t, int> per_step;
  for (const RankStepRecord& r : rs) {
    ++per_step[r.step];
    ASSERT_EQ(r.total_s, value_of(r.step, r.rank)) << "step " << r.step << " rank " << r.rank;
  }
  for (const auto& [s, n] : per_step) ASSERT_EQ(n, kRanks) << "step " << s;
  std::vector<StepRecord> steps;
  ASSERT_TRUE(db->read_steps(run, 0, kStepEnd, SIZE_MAX, &steps));
  ASSERT_EQ(steps.size(), static_cast<size_t>(last + 1));
  std::vector<EventRow> events;
  ASSERT_TRUE(db->read_events(run, 0, SIZE_MAX, &events));
  ASSERT_EQ(events.size(), static_cast<size_t>(last + 1));

  // The tiles written with those batches agree with the rows, at every resolution.
  for (int32_t buckets : {1, 3, 40, 5000}) {
    BandResult band;
    ASSERT_TRUE(db->query_band({.run_id = run, .max_buckets = buckets}, &band)) << db->error();
    int64_t count = 0;
    for (const Bucket& b : band.buckets) {
      count += b.count;
      double lo = INFINITY, hi = -INFINITY;
      for (const RankStepRecord& r : rs) {
        if (r.step >= b.step_begin && r.step < b.step_end) {
          lo = std::min(lo, r.total_s);
          hi = std::max(hi, r.total_s);
        }
      }
      ASSERT_EQ(b.min, lo) << "bucket at " << b.step_begin << " of " << buckets;
      ASSERT_EQ(b.max, hi) << "bucket at " << b.step_begin << " of " << buckets;
    }
    ASSERT_EQ(count, static_cast<int64_t>(rs.size()));
  }
}

TEST(HistoryCrash, SigkilledWriterLosesNothingItCommitted) {
  const fs::path dir = testing_support::scratch_dir();
  const std::string path = (dir / "history.sqlite").string();
  std::mt19937_64 rng(20261126);
  // Kill the writer several times; each new writer reopens the same file and carries on.
  for (int round = 0; round < 4; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    const int64_t acked = run_and_kill(path, 150 + static_cast<int>(rng() % 200), rng);
    ASSERT_GE(acked, 0);
    check_history(path, acked);
  }
  fs::remove_all(dir);
}

}  // namespace
}  // namespace gantry
