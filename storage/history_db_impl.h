// Internal to storage/: what history_db.cpp (runs, ingest), history_read.cpp (reads) and rollup.cpp (the
// tile pyramid, the decimated queries) share: SQLite helpers, prepared statements and a run's rollup
// bookkeeping.
#pragma once

#include <sqlite3.h>

#include <chrono>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>

#include "storage/history_db.h"
#include "telemetry/clock.h"

namespace gantry {

// SQLite stores NaN as NULL; reading NULL back where a number is required gives NaN again.
inline double column_double(sqlite3_stmt* st, int i) {
  return sqlite3_column_type(st, i) == SQLITE_NULL ? std::numeric_limits<double>::quiet_NaN()
                                                   : sqlite3_column_double(st, i);
}

inline std::string column_text(sqlite3_stmt* st, int i) {
  const auto* p = reinterpret_cast<const char*>(sqlite3_column_text(st, i));
  return p ? std::string(p, static_cast<size_t>(sqlite3_column_bytes(st, i))) : std::string();
}

inline void bind_text(sqlite3_stmt* st, int i, std::string_view s) {
  sqlite3_bind_text(st, i, s.data(), static_cast<int>(s.size()), SQLITE_STATIC);
}

// A prepared statement, finalized on destruction.
class Stmt {
 public:
  Stmt() = default;
  ~Stmt() { sqlite3_finalize(s_); }
  Stmt(const Stmt&) = delete;
  Stmt& operator=(const Stmt&) = delete;
  bool prepare(sqlite3* db, const char* sql) {
    return sqlite3_prepare_v3(db, sql, -1, SQLITE_PREPARE_PERSISTENT, &s_, nullptr) == SQLITE_OK;
  }
  sqlite3_stmt* get() const { return s_; }

 private:
  sqlite3_stmt* s_ = nullptr;
};

// Resets a statement when the scope ends, whatever path leaves it, so no statement keeps a read
// transaction open.
class StmtUse {
 public:
  explicit StmtUse(const Stmt& s) : s_(s.get()) {}
  ~StmtUse() {
    sqlite3_reset(s_);
    sqlite3_clear_bindings(s_);
  }
  StmtUse(const StmtUse&) = delete;
  StmtUse& operator=(const StmtUse&) = delete;
  sqlite3_stmt* operator*() const { return s_; }

 private:
  sqlite3_stmt* s_;
};

struct HistoryDb::Statements {
  Stmt run_load, run_progress;
  Stmt frame_insert, frame_get, frame_update, frames_range;
  Stmt tile_put, tile_get, tiles_range, tiles_delete;
  Stmt step_put, event_put;
  Stmt node_insert, node_id, node_host;
  Stmt device_put;
};

// A run's rollup bookkeeping, read from its runs row at the start of every transaction or query (another
// connection may have moved it), written back by ingest.
struct HistoryDb::RunState {
  int64_t id = 0;
  int32_t world = 1;
  int top_m = 0;           // pack::top_rank_level(world)
  int64_t last_step = -1;  // H: the highest step with a rank-step record
  int64_t frontier = 0;  // F: steps below it have their per-step tiles; blocks ending at or before it, theirs
  bool sealed = false;   // finish_run tiled the partial blocks up to H too
  int64_t raw_from = 0;  // rank_steps rows below it were downsampled away
};

}  // namespace gantry
