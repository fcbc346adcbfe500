// HistoryDb: opening and migrating, the WAL checkpointer, transactions, runs, nodes, checkpoints and
// batched ingest. Plain reads are in history_read.cpp; the tile pyramid, the decimated queries and
// retention in rollup.cpp.
#include "storage/history_db.h"

#include <sqlite3.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <limits>
#include <mutex>
#include <numeric>
#include <thread>

#include "storage/history_db_impl.h"
#include "storage/pack.h"
#include "storage/schema.h"

namespace gantry {
namespace {

constexpr std::string_view kRunStatusNames[] = {"running", "finished", "failed", "stopped", "interrupted"};
constexpr std::string_view kRankMetricNames[kRankMetricCount] = {
    "total_s",        "data_wait_s",    "forward_s",           "backward_s",
    "optimizer_s",    "comm_exposed_s", "checkpoint_stall_s",  "mem_peak_bytes",
    "busy_s",         "tokens",         "mem_allocated_bytes", "temperature_celsius",
    "sm_clock_hertz", "power_watts"};
constexpr std::string_view kStepMetricNames[] = {"loss",   "grad_norm", "lr",  "tokens_per_s",
                                                 "step_s", "mfu",       "hfu", "val_loss"};

}  // namespace

std::string_view run_status_name(RunStatus s) {
  return kRunStatusNames[static_cast<size_t>(s)];
}

std::string_view rank_metric_name(RankMetric m) {
  return kRankMetricNames[static_cast<size_t>(m)];
}

bool rank_metric_from_name(std::string_view name, RankMetric* out) {
  for (int i = 0; i < kRankMetricCount; ++i) {
    if (kRankMetricNames[i] == name) {
      *out = static_cast<RankMetric>(i);
      return true;
    }
  }
  return false;
}

std::string_view step_metric_name(StepMetric m) {
  return kStepMetricNames[static_cast<size_t>(m)];
}

bool step_metric_from_name(std::string_view name, StepMetric* out) {
  for (size_t i = 0; i < std::size(kStepMetricNames); ++i) {
    if (kStepMetricNames[i] == name) {
      *out = static_cast<StepMetric>(i);
      return true;
    }
  }
  return false;
}

// ---- WAL checkpoints ----

// Copies the WAL back into the database file from a second connection on its own thread. A commit's
// cost is then appending its pages to the WAL; the checkpoint (reading them back and writing them into
// place, about as much work again) runs on the other core. PASSIVE checkpoints never block the writer.
// Should the checkpointer fall behind, the writer checkpoints inline past a hard limit, so the WAL stays
// bounded whatever happens.
class HistoryDb::Checkpointer {
 public:
  static constexpr int kSoftPages = 4000;   // 16 MiB of 4 KiB pages: wake the thread
  static constexpr int kHardPages = 32000;  // 128 MiB: the writer checkpoints itself

  static std::unique_ptr<Checkpointer> start(sqlite3* writer, const std::string& path) {
    std::unique_ptr<Checkpointer> c(new Checkpointer());
    if (sqlite3_open_v2(path.c_str(), &c->db_, SQLITE_OPEN_READWRITE | SQLITE_OPEN_NOMUTEX, nullptr) !=
        SQLITE_OK) {
      return nullptr;
    }
    sqlite3_busy_timeout(c->db_, 1000);
    c->thread_ = std::thread([p = c.get()] { p->loop(); });
    sqlite3_wal_hook(writer, &Checkpointer::on_commit, c.get());
    return c;
  }

  ~Checkpointer() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_one();
    if (thread_.joinable()) thread_.join();
    sqlite3_close_v2(db_);
  }

 private:
  Checkpointer() = default;

  // Runs on the writer's thread after each commit, with the WAL's size in pages.
  static int on_commit(void* self, sqlite3* writer, const char* schema, int pages) {
    auto* c = static_cast<Checkpointer*>(self);
    if (pages >= kHardPages) {
      sqlite3_wal_checkpoint_v2(writer, schema, SQLITE_CHECKPOINT_PASSIVE, nullptr, nullptr);
    } else if (pages >= kSoftPages) {
      bool was_wanted;
      {
        std::lock_guard<std::mutex> lock(c->mu_);
        was_wanted = c->wanted_;
        c->wanted_ = true;
      }
      if (!was_wanted) c->cv_.notify_one();  // one wake-up per checkpoint, not one per commit
    }
    return SQLITE_OK;
  }

  void loop() {
    std::unique_lock<std::mutex> lock(mu_);
    while (true) {
      cv_.wait(lock, [&] { return stop_ || wanted_; });
      if (stop_) return;
      wanted_ = false;
      lock.unlock();
      sqlite3_wal_checkpoint_v2(db_, "main", SQLITE_CHECKPOINT_PASSIVE, nullptr, nullptr);
      lock.lock();
    }
  }

  sqlite3* db_ = nullptr;
  std::thread thread_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool wanted_ = false;
  bool stop_ = false;
};

// ---- opening ----

std::unique_ptr<HistoryDb> HistoryDb::open(const std::string& path, const HistoryDbOptions& options,
                                           std::string* error) {
  std::unique_ptr<HistoryDb> h(new HistoryDb());
  h->options_ = options;
  const auto fail = [&](const std::string& why) -> std::unique_ptr<HistoryDb> {
    if (error) *error = path + ": " + why;
    return nullptr;
  };
  const int flags = options.read_only ? SQLITE_OPEN_READONLY : (SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE);
  if (sqlite3_open_v2(path.c_str(), &h->db_, flags | SQLITE_OPEN_NOMUTEX, nullptr) != SQLITE_OK) {
    return fail(h->db_ ? sqlite3_errmsg(h->db_) : "cannot open");
  }
  sqlite3_busy_timeout(h->db_, options.busy_timeout_ms);
  sqlite3_extended_result_codes(h->db_, 1);
  // WAL: readers do not block the writer nor the writer them, and a commit is one append. NORMAL
  // syncs at checkpoints, not every commit: a killed process loses nothing it committed, a power cut
  // may lose the last commits but never corrupts the file.
  // Reads through a memory map (up to 2 GiB, SQLite's default ceiling) rather than a pread per page:
  // a range query touches thousands of pages, and in a VM every system call is dear.
  const char* pragmas =
      options.read_only
          ? "PRAGMA cache_size = -65536; PRAGMA temp_store = MEMORY; PRAGMA mmap_size = 2147418112;"
          : "PRAGMA journal_mode = WAL; PRAGMA synchronous = NORMAL;"
            "PRAGMA cache_size = -65536;"
            "PRAGMA temp_store = MEMORY; PRAGMA wal_autocheckpoint = 4000;"
            "PRAGMA journal_size_limit = 67108864; PRAGMA mmap_size = 2147418112;";
  if (!h->exec(pragmas)) return fail(h->error_);
  std::string why;
  if (options.read_only) {
    const int v = gantry::schema_version(h->db_);
    if (v != schema_latest_version()) {
      return fail("schema version " + std::to_string(v) + ", this build reads " +
                  std::to_string(schema_latest_version()) + " (open it once read-write to migrate)");
    }
  } else if (!schema_migrate(h->db_, schema_migrations(), schema_latest_version(), &why)) {
    return fail(why);
  }

  h->st_ = std::make_unique<Statements>();
  Statements& s = *h->st_;
  const std::pair<Stmt*, const char*> statements[] = {
      {&s.run_load,
       "SELECT world_size, last_step, rollup_frontier, rollup_sealed, raw_from_step FROM runs WHERE id = ?"},
      {&s.run_progress,
       "UPDATE runs SET last_step = ?, rollup_frontier = ?, rollup_sealed = ?, raw_from_step = ? WHERE id = "
       "?"},
      {&s.frame_insert,
       "INSERT INTO rank_steps (run_id, step, grp, data) VALUES (?, ?, ?, ?) ON CONFLICT DO NOTHING"},
      {&s.frame_get, "SELECT data FROM rank_steps WHERE run_id = ? AND step = ? AND grp = ?"},
      {&s.frame_update, "UPDATE rank_steps SET data = ? WHERE run_id = ? AND step = ? AND grp = ?"},
      {&s.frames_range,
       "SELECT step, grp, data FROM rank_steps WHERE run_id = ? AND step >= ? AND step < ? ORDER BY step, "
       "grp"},
      {&s.step_put,
       "INSERT OR REPLACE INTO steps (run_id, step, time_unix_s, loss, grad_norm, lr, tokens_per_s, step_s, "
       "mfu, "
       "hfu, val_loss) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"},
      {&s.event_put,
       "INSERT INTO events (run_id, time_unix_s, step, kind, rank, node, message, payload) "
       "VALUES (?, ?, ?, ?, ?, ?, ?, ?)"},
      {&s.tile_put,
       "INSERT OR REPLACE INTO rank_tiles (id, run_id, level, block, rblock, data) VALUES (?, ?, ?, ?, ?, "
       "?)"},
      {&s.tile_get, "SELECT data FROM rank_tiles WHERE id = ?"},
      {&s.tiles_range, "SELECT block, rblock, data FROM rank_tiles WHERE id >= ? AND id < ? ORDER BY id"},
      {&s.tiles_delete, "DELETE FROM rank_tiles WHERE id >= ? AND id < ?"},
      {&s.node_insert,
       "INSERT INTO nodes (host, first_seen_unix_s, last_seen_unix_s) VALUES (?, ?, ?) ON CONFLICT (host) DO "
       "NOTHING"},
      {&s.node_id, "SELECT id FROM nodes WHERE host = ?"},
      {&s.node_host, "SELECT host FROM nodes WHERE id = ?"},
      {&s.device_put,
       "INSERT OR REPLACE INTO device_samples (metric, node_id, device, time_unix_s, value) VALUES (?, ?, ?, "
       "?, "
       "?)"},
  };
  for (const auto& [stmt, sql] : statements) {
    if (!stmt->prepare(h->db_, sql))
      return fail(std::string("preparing a statement: ") + sqlite3_errmsg(h->db_));
  }
  if (!options.read_only && !h->upgrade_tiles()) return fail(h->error_);
  if (!options.read_only && options.background_checkpoint) {
    // Replaces SQLite's inline autocheckpoint (sqlite3_wal_hook takes its place); without the thread,
    // the autocheckpoint set above stays.
    h->checkpointer_ = Checkpointer::start(h->db_, path);
    if (!h->checkpointer_) return fail("cannot open the checkpointer's connection");
  }
  return h;
}

HistoryDb::~HistoryDb() {
  // The checkpointer's connection first, so that ours is the last to close: SQLite then checkpoints
  // what is left and removes the WAL.
  if (checkpointer_) sqlite3_wal_hook(db_, nullptr, nullptr);
  checkpointer_.reset();
  st_.reset();  // statements before their connection
  sqlite3_close_v2(db_);
}

int HistoryDb::schema_version() const {
  return gantry::schema_version(db_);
}

bool HistoryDb::fail(std::string_view what) {
  error_ = what;
  return false;
}

bool HistoryDb::fail_sqlite(std::string_view what) {
  error_ = std::string(what) + ": " + sqlite3_errmsg(db_);
  return false;
}

bool HistoryDb::exec(const char* sql) {
  char* msg = nullptr;
  if (sqlite3_exec(db_, sql, nullptr, nullptr, &msg) == SQLITE_OK) return true;
  error_ = msg ? msg : sqlite3_errmsg(db_);
  sqlite3_free(msg);
  return false;
}

bool HistoryDb::begin_write() {
  if (options_.read_only) return fail("the history database is open read-only");
  return exec("BEGIN IMMEDIATE");
}

bool HistoryDb::commit() {
  if (exec("COMMIT")) return true;
  rollback();
  return false;
}

void HistoryDb::rollback() {
  const std::string keep = error_;
  exec("ROLLBACK");
  error_ = keep;
  // Node ids handed out inside the transaction are gone with it.
  node_ids_.clear();
  node_hosts_.clear();
}

bool HistoryDb::load_run(int64_t run_id, RunState* out) {
  StmtUse st(st_->run_load);
  sqlite3_bind_int64(*st, 1, run_id);
  const int rc = sqlite3_step(*st);
  if (rc == SQLITE_DONE) return fail("run " + std::to_string(run_id) + " does not exist");
  if (rc != SQLITE_ROW) return fail_sqlite("reading run " + std::to_string(run_id));
  out->id = run_id;
  out->world = sqlite3_column_int(*st, 0);
  out->top_m = pack::top_rank_level(out->world);
  out->last_step = sqlite3_column_int64(*st, 1);
  out->frontier = sqlite3_column_int64(*st, 2);
  out->sealed = sqlite3_column_int(*st, 3) != 0;
  out->raw_from = sqlite3_column_int64(*st, 4);
  return true;
}

bool HistoryDb::save_run(const RunState& run) {
  StmtUse st(st_->run_progress);
  sqlite3_bind_int64(*st, 1, run.last_step);
  sqlite3_bind_int64(*st, 2, run.frontier);
  sqlite3_bind_int(*st, 3, run.sealed ? 1 : 0);
  sqlite3_bind_int64(*st, 4, run.raw_from);
  sqlite3_bind_int64(*st, 5, run.id);
  return sqlite3_step(*st) == SQLITE_DONE || fail_sqlite("updating run progress");
}

bool HistoryDb::delete_tiles(int64_t key_begin, int64_t key_end) {
  StmtUse st(st_->tiles_delete);
  sqlite3_bind_int64(*st, 1, key_begin);
  sqlite3_bind_int64(*st, 2, key_end);
  return sqlite3_step(*st) == SQLITE_DONE;
}

// ---- runs ----

int64_t HistoryDb::begin_run(const RunInfo& info) {
  if (info.world_size < 1 || info.world_size > (1 << 18)) {
    fail("world_size must be in 1..262144, got " + std::to_string(info.world_size));
    return -1;
  }
  if (!begin_write()) return -1;
  sqlite3_stmt* st = nullptr;
  const char* sql =
      "INSERT INTO runs (name, world_size, config, code_version, data_version, layout, out_dir, peak_name, "
      "peak_flops, flops_per_token, mfu_formula, created_unix_s, options) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, "
      "?, ?, ?, "
      "?)";
  int64_t id = -1;
  if (sqlite3_prepare_v2(db_, sql, -1, &st, nullptr) == SQLITE_OK) {
    bind_text(st, 1, info.name);
    sqlite3_bind_int(st, 2, info.world_size);
    bind_text(st, 3, info.config);
    bind_text(st, 4, info.code_version);
    bind_text(st, 5, info.data_version);
    bind_text(st, 6, info.layout);
    bind_text(st, 7, info.out_dir);
    bind_text(st, 8, info.peak_name);
    sqlite3_bind_double(st, 9, info.peak_flops);
    sqlite3_bind_double(st, 10, info.flops_per_token);
    bind_text(st, 11, info.mfu_formula);
    sqlite3_bind_double(st, 12, info.created_unix_s > 0 ? info.created_unix_s : unix_now_s());
    bind_text(st, 13, info.options);
    if (sqlite3_step(st) == SQLITE_DONE) id = sqlite3_last_insert_rowid(db_);
  }
  if (id < 0) fail_sqlite("creating a run");
  sqlite3_finalize(st);
  if (id > pack::kMaxRunId) {
    fail("this history file holds its limit of " + std::to_string(pack::kMaxRunId) +
         " runs; start a new one");
    id = -1;
  }
  if (id < 0 || !commit()) {
    rollback();
    return -1;
  }
  return id;
}

bool HistoryDb::update_run(int64_t run_id, RunStatus status, std::string_view message,
                           std::string_view options) {
  sqlite3_stmt* st = nullptr;
  bool ok = sqlite3_prepare_v2(db_,
                               "UPDATE runs SET status = ?, finished_unix_s = CASE WHEN ? THEN NULL ELSE "
                               "finished_unix_s END, message = ?, options = ? WHERE id = ?",
                               -1, &st, nullptr) == SQLITE_OK;
  if (ok) {
    bind_text(st, 1, run_status_name(status));
    sqlite3_bind_int(st, 2, status == RunStatus::running ? 1 : 0);
    bind_text(st, 3, message);
    bind_text(st, 4, options);
    sqlite3_bind_int64(st, 5, run_id);
    ok = sqlite3_step(st) == SQLITE_DONE && sqlite3_changes(db_) == 1;
  }
  sqlite3_finalize(st);
  return ok || fail_sqlite("updating run " + std::to_string(run_id));
}

bool HistoryDb::reconcile_checkpoints(int64_t run_id, const std::vector<int64_t>& committed_steps,
                                      std::vector<int64_t>* marked) {
  std::vector<CheckpointInfo> catalog;
  if (!list_checkpoints(run_id, &catalog)) return false;
  for (CheckpointInfo c : catalog) {
    if (c.state != "committed" ||
        std::find(committed_steps.begin(), committed_steps.end(), c.step) != committed_steps.end()) {
      continue;
    }
    c.state = "deleted";
    if (!record_checkpoint(c)) return false;
    if (marked != nullptr) marked->push_back(c.step);
  }
  return true;
}

bool HistoryDb::finish_run(int64_t run_id, RunStatus status, std::string_view message,
                           double finished_unix_s) {
  if (status == RunStatus::running) return fail("finish_run: the final status cannot be \"running\"");
  if (!begin_write()) return false;
  RunState run;
  bool ok = load_run(run_id, &run) && finalize(run, {}, /*seal=*/true) && save_run(run);
  if (ok) {
    sqlite3_stmt* st = nullptr;
    ok = sqlite3_prepare_v2(db_, "UPDATE runs SET status = ?, finished_unix_s = ?, message = ? WHERE id = ?",
                            -1, &st, nullptr) == SQLITE_OK;
    if (ok) {
      bind_text(st, 1, run_status_name(status));
      sqlite3_bind_double(st, 2, finished_unix_s > 0 ? finished_unix_s : unix_now_s());
      bind_text(st, 3, message);
      sqlite3_bind_int64(st, 4, run_id);
      ok = sqlite3_step(st) == SQLITE_DONE;
    }
    if (!ok) fail_sqlite("finishing run " + std::to_string(run_id));
    sqlite3_finalize(st);
  }
  if (!ok || !commit()) {
    rollback();
    return false;
  }
  return true;
}

// ---- nodes ----

int64_t HistoryDb::node_id(const std::string& host) {
  if (auto it = node_ids_.find(host); it != node_ids_.end()) return it->second;
  {
    StmtUse ins(st_->node_insert);
    bind_text(*ins, 1, host);
    const double now = unix_now_s();
    sqlite3_bind_double(*ins, 2, now);
    sqlite3_bind_double(*ins, 3, now);
    if (sqlite3_step(*ins) != SQLITE_DONE) {
      fail_sqlite("registering node " + host);
      return -1;
    }
  }
  StmtUse sel(st_->node_id);
  bind_text(*sel, 1, host);
  if (sqlite3_step(*sel) != SQLITE_ROW) {
    fail_sqlite("reading node " + host);
    return -1;
  }
  const int64_t id = sqlite3_column_int64(*sel, 0);
  node_ids_.emplace(host, id);
  return id;
}

std::string HistoryDb::host_of(int64_t id) {
  if (auto it = node_hosts_.find(id); it != node_hosts_.end()) return it->second;
  StmtUse st(st_->node_host);
  sqlite3_bind_int64(*st, 1, id);
  std::string host = sqlite3_step(*st) == SQLITE_ROW ? column_text(*st, 0) : std::string();
  node_hosts_.emplace(id, host);
  return host;
}

bool HistoryDb::upsert_node(const NodeInfo& n) {
  if (!begin_write()) return false;
  sqlite3_stmt* st = nullptr;
  const char* sql =
      "INSERT INTO nodes (host, devices, device_name, state, first_seen_unix_s, last_seen_unix_s) "
      "VALUES (?1, ?2, ?3, ?4, ?5, ?5) ON CONFLICT (host) DO UPDATE SET devices = ?2, device_name = ?3, "
      "state = ?4, last_seen_unix_s = ?5";
  bool ok = sqlite3_prepare_v2(db_, sql, -1, &st, nullptr) == SQLITE_OK;
  if (ok) {
    bind_text(st, 1, n.host);
    sqlite3_bind_int(st, 2, n.devices);
    bind_text(st, 3, n.device_name);
    bind_text(st, 4, n.state);
    sqlite3_bind_double(st, 5, n.last_seen_unix_s > 0 ? n.last_seen_unix_s : unix_now_s());
    ok = sqlite3_step(st) == SQLITE_DONE;
  }
  if (!ok) fail_sqlite("recording node " + n.host);
  sqlite3_finalize(st);
  if (!ok || !commit()) {
    rollback();
    return false;
  }
  return true;
}

// ---- checkpoints ----

bool HistoryDb::record_checkpoint(const CheckpointInfo& c) {
  if (!begin_write()) return false;
  RunState run;
  bool ok = load_run(c.run_id, &run);
  sqlite3_stmt* st = nullptr;
  if (ok) {
    ok =
        sqlite3_prepare_v2(db_,
                           "INSERT OR REPLACE INTO checkpoints (run_id, step, path, bytes, write_s, state, "
                           "time_unix_s, stall_s, shards, manifest_xxh64, message) VALUES (?, ?, ?, ?, ?, ?, "
                           "?, ?, ?, ?, ?)",
                           -1, &st, nullptr) == SQLITE_OK;
    if (ok) {
      sqlite3_bind_int64(st, 1, c.run_id);
      sqlite3_bind_int64(st, 2, c.step);
      bind_text(st, 3, c.path);
      sqlite3_bind_int64(st, 4, static_cast<int64_t>(c.bytes));
      sqlite3_bind_double(st, 5, c.write_s);
      bind_text(st, 6, c.state);
      sqlite3_bind_double(st, 7, c.time_unix_s > 0 ? c.time_unix_s : unix_now_s());
      if (c.stall_s) sqlite3_bind_double(st, 8, *c.stall_s);  // unbound: NULL, not known
      if (c.shards) sqlite3_bind_int(st, 9, *c.shards);
      bind_text(st, 10, c.manifest_xxh64);
      bind_text(st, 11, c.message);
      ok = sqlite3_step(st) == SQLITE_DONE;
    }
    if (!ok) fail_sqlite("recording a checkpoint");
    sqlite3_finalize(st);
  }
  if (!ok || !commit()) {
    rollback();
    return false;
  }
  return true;
}

// ---- ingest ----

bool HistoryDb::catalog_checkpoint(const CheckpointRecord& c) {
  // A failed write of a step whose checkpoint already committed leaves that one in place (checkpoint_write
  // replaces a directory only by a whole new one), so a failure never overwrites a committed entry.
  sqlite3_stmt* st = nullptr;
  if (sqlite3_prepare_v2(
          db_,
          "INSERT INTO checkpoints (run_id, step, path, bytes, write_s, state, time_unix_s, stall_s, shards, "
          "manifest_xxh64, message) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (run_id, step) DO "
          "UPDATE SET path = excluded.path, bytes = excluded.bytes, write_s = excluded.write_s, state = "
          "excluded.state, time_unix_s = excluded.time_unix_s, stall_s = excluded.stall_s, shards = "
          "excluded.shards, manifest_xxh64 = excluded.manifest_xxh64, message = excluded.message WHERE "
          "excluded.state = 'committed' OR checkpoints.state <> 'committed'",
          -1, &st, nullptr) != SQLITE_OK) {
    return fail_sqlite("cataloguing a checkpoint");
  }
  sqlite3_bind_int64(st, 1, c.run_id);
  sqlite3_bind_int64(st, 2, c.step);
  bind_text(st, 3, c.dir);
  sqlite3_bind_int64(st, 4, static_cast<int64_t>(c.bytes));
  sqlite3_bind_double(st, 5, c.write_s);
  bind_text(st, 6, checkpoint_state_name(c.state));
  sqlite3_bind_double(st, 7, c.time_unix_s > 0 ? c.time_unix_s : unix_now_s());
  sqlite3_bind_double(st, 8, c.stall_s);
  if (c.shards > 0) sqlite3_bind_int(st, 9, c.shards);  // 0: not known, NULL
  bind_text(st, 10, c.manifest_xxh64);
  bind_text(st, 11, c.message);
  const bool ok = sqlite3_step(st) == SQLITE_DONE ||
                  fail_sqlite("cataloguing the checkpoint of step " + std::to_string(c.step));
  sqlite3_finalize(st);
  return ok;
}

bool HistoryDb::ingest(const RecordBatch& batch) {
  if (batch.empty()) return true;
  if (!begin_write()) return false;
  bool ok = true;

  // Every run the batch names must exist; rank-step records must fit its world and not land where the
  // raw rows were downsampled away (the tiles there could no longer be rebuilt).
  std::vector<RunState> runs;
  const auto run_of = [&](int64_t id) -> RunState* {
    for (RunState& r : runs) {
      if (r.id == id) return &r;
    }
    RunState r;
    if (!load_run(id, &r)) return nullptr;
    runs.push_back(r);
    return &runs.back();
  };
  for (const StepRecord& s : batch.steps) ok = ok && run_of(s.run_id);
  for (const EventRecord& e : batch.events) ok = ok && run_of(e.run_id);
  for (const CheckpointRecord& c : batch.checkpoints) ok = ok && run_of(c.run_id);
  for (const RankStepRecord& r : batch.rank_steps) {
    if (!ok) break;
    const RunState* run = run_of(r.run_id);
    if (!run) {
      ok = false;
    } else if (r.rank < 0 || r.rank >= run->world) {
      ok = fail("rank " + std::to_string(r.rank) + " is outside run " + std::to_string(r.run_id) +
                "'s world of " + std::to_string(run->world));
    } else if (r.step < 0 || r.step > pack::kMaxStep) {
      ok = fail("step " + std::to_string(r.step) + " is outside 0.." + std::to_string(pack::kMaxStep));
    } else if (r.step < run->raw_from) {
      ok = fail("step " + std::to_string(r.step) + " of run " + std::to_string(r.run_id) +
                " was downsampled (raw rank-steps before step " + std::to_string(run->raw_from) +
                " are gone); a late record there is refused");
    }
  }

  // Rank steps: grouped into frames of one run, one step and eight ranks. A stable sort keeps the later
  // of two records for the same rank in one batch last, so it wins.
  std::vector<uint32_t> order(batch.rank_steps.size());
  std::iota(order.begin(), order.end(), 0u);
  std::stable_sort(order.begin(), order.end(), [&](uint32_t a, uint32_t b) {
    const RankStepRecord &x = batch.rank_steps[a], &y = batch.rank_steps[b];
    if (x.run_id != y.run_id) return x.run_id < y.run_id;
    if (x.step != y.step) return x.step < y.step;
    return x.rank < y.rank;
  });
  std::vector<std::pair<int64_t, int64_t>> touched;  // (run, step), sorted
  pack::Frame frame;
  std::string blob;
  for (size_t i = 0; ok && i < order.size();) {
    const RankStepRecord& first = batch.rank_steps[order[i]];
    const int64_t grp = first.rank / pack::kGroupRanks;
    frame.mask = 0;
    size_t j = i;
    for (; j < order.size(); ++j) {
      const RankStepRecord& r = batch.rank_steps[order[j]];
      if (r.run_id != first.run_id || r.step != first.step || r.rank / pack::kGroupRanks != grp) break;
      const int64_t node = node_id(r.host);
      if (node < 0) {
        ok = false;
        break;
      }
      const int slot = r.rank % pack::kGroupRanks;
      frame.ranks[slot] = pack::raw_from_record(r, static_cast<uint32_t>(node));
      frame.mask |= static_cast<uint8_t>(1u << slot);
    }
    if (!ok) break;
    pack::frame_encode(frame, &blob);
    bool inserted;
    {
      StmtUse st(st_->frame_insert);
      sqlite3_bind_int64(*st, 1, first.run_id);
      sqlite3_bind_int64(*st, 2, first.step);
      sqlite3_bind_int64(*st, 3, grp);
      sqlite3_bind_blob(*st, 4, blob.data(), static_cast<int>(blob.size()), SQLITE_STATIC);
      ok = sqlite3_step(*st) == SQLITE_DONE || fail_sqlite("writing rank steps");
      inserted = sqlite3_changes(db_) > 0;
    }
    if (ok && !inserted) {
      // Another batch already wrote ranks of this group at this step: merge, ours replacing theirs.
      pack::Frame old;
      {
        StmtUse get(st_->frame_get);
        sqlite3_bind_int64(*get, 1, first.run_id);
        sqlite3_bind_int64(*get, 2, first.step);
        sqlite3_bind_int64(*get, 3, grp);
        ok = sqlite3_step(*get) == SQLITE_ROW || fail_sqlite("reading rank steps to merge");
        if (ok && !pack::frame_decode(sqlite3_column_blob(*get, 0),
                                      static_cast<size_t>(sqlite3_column_bytes(*get, 0)), &old)) {
          ok = fail("corrupt rank_steps row (run " + std::to_string(first.run_id) + ", step " +
                    std::to_string(first.step) + ", group " + std::to_string(grp) + ")");
        }
      }
      if (ok) {
        for (int s = 0; s < pack::kGroupRanks; ++s) {
          if (frame.mask & (1u << s)) old.ranks[s] = frame.ranks[s];
        }
        old.mask |= frame.mask;
        pack::frame_encode(old, &blob);
        StmtUse up(st_->frame_update);
        sqlite3_bind_blob(*up, 1, blob.data(), static_cast<int>(blob.size()), SQLITE_STATIC);
        sqlite3_bind_int64(*up, 2, first.run_id);
        sqlite3_bind_int64(*up, 3, first.step);
        sqlite3_bind_int64(*up, 4, grp);
        ok = sqlite3_step(*up) == SQLITE_DONE || fail_sqlite("merging rank steps");
      }
    }
    if (touched.empty() || touched.back() != std::make_pair(first.run_id, first.step)) {
      touched.emplace_back(first.run_id, first.step);
    }
    i = j;
  }

  for (size_t i = 0; ok && i < batch.steps.size(); ++i) {
    const StepRecord& s = batch.steps[i];
    StmtUse st(st_->step_put);
    sqlite3_bind_int64(*st, 1, s.run_id);
    sqlite3_bind_int64(*st, 2, s.step);
    const double values[] = {s.time_unix_s, s.loss, s.grad_norm, s.lr, s.tokens_per_s, s.step_s};
    for (size_t k = 0; k < std::size(values); ++k)
      sqlite3_bind_double(*st, static_cast<int>(k) + 3, values[k]);
    // Unbound parameters are NULL: an unknown utilisation (no peak) or no validation at this step.
    if (s.mfu) sqlite3_bind_double(*st, 9, *s.mfu);
    if (s.hfu) sqlite3_bind_double(*st, 10, *s.hfu);
    if (s.val_loss) sqlite3_bind_double(*st, 11, *s.val_loss);
    ok = sqlite3_step(*st) == SQLITE_DONE || fail_sqlite("writing steps");
  }
  const auto put_event = [&](const EventRecord& e, const char* what) {
    StmtUse st(st_->event_put);
    sqlite3_bind_int64(*st, 1, e.run_id);
    sqlite3_bind_double(*st, 2, e.time_unix_s);
    sqlite3_bind_int64(*st, 3, e.step);
    bind_text(*st, 4, e.kind);
    sqlite3_bind_int(*st, 5, e.rank);
    bind_text(*st, 6, e.node);
    bind_text(*st, 7, e.message);
    bind_text(*st, 8, e.payload);
    return sqlite3_step(*st) == SQLITE_DONE || fail_sqlite(what);
  };
  for (size_t i = 0; ok && i < batch.events.size(); ++i) ok = put_event(batch.events[i], "writing events");
  for (size_t i = 0; ok && i < batch.checkpoints.size(); ++i) {
    const CheckpointRecord& c = batch.checkpoints[i];
    if (c.state != CheckpointState::kWritten) ok = catalog_checkpoint(c);
    // The operator's line, from the record (so the Events panel and the event stream show it).
    ok = ok && put_event(checkpoint_event(c), "writing a checkpoint's event");
  }
  ok = ok && put_device_samples(batch.device_samples);

  // Each run whose rank steps moved: what became final gets its tiles, what arrived late gets them rebuilt.
  for (size_t i = 0; ok && i < touched.size();) {
    RunState* run = run_of(touched[i].first);
    std::vector<int64_t> late;
    int64_t max_step = -1;
    for (; i < touched.size() && touched[i].first == run->id; ++i) {
      const int64_t s = touched[i].second;
      max_step = std::max(max_step, s);
      if (s < run->frontier) late.push_back(s);
    }
    if (max_step > run->last_step) {
      run->sealed = false;  // the run goes on past its sealed end; its partial tail tiles are stale
      run->last_step = max_step;
    }
    ok = finalize(*run, std::move(late), /*seal=*/false) && save_run(*run);
  }

  if (!ok || !commit()) {
    rollback();
    return false;
  }
  return true;
}

}  // namespace gantry
