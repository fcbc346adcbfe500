#include "storage/schema.h"

#include <sqlite3.h>

namespace gantry {
namespace {

// Version 1. Column notes:
//   runs.last_step, rollup_frontier, rollup_sealed, raw_from_step: storage's own bookkeeping. Rank-step
//     aggregate tiles exist for every block that ends at or before rollup_frontier (and, once the run is
//     sealed by finish_run, for its partial last blocks too); rank_steps rows before raw_from_step were
//     downsampled away.
//   rank_steps: one row per (run, step, group of 8 ranks: grp = rank / 8); `data` packs the group's
//     records (storage/pack.h). Keyed step-first because records arrive step by step: inserts append.
//   rank_tiles: the aggregate pyramid. level = 8 × step level + rank level; `block` counts blocks of the
//     step level's size, `rblock` rows of 8 cells at the rank level. The rowid is those four packed into
//     one integer (storage/pack.h: tile_key), so one level's rows of a run lie together, in block order,
//     and a query reads them as one sequential range. A rowid table, unlike rank_steps: its ~2 KB rows
//     would overflow a WITHOUT ROWID (index) B-tree page, whose cells keep only ~1 KB in the page, while
//     a table B-tree holds two per 4 KiB page. run_id, level, block and rblock are kept as columns too,
//     for people reading the file with sqlite3.
//   Doubles that were NaN are stored as NULL (SQLite has no NaN) and read back as NaN where a value is
//   required.
constexpr const char* kSchemaV1 = R"sql(
CREATE TABLE runs (
  id INTEGER PRIMARY KEY,
  name TEXT NOT NULL,
  status TEXT NOT NULL DEFAULT 'running',
  world_size INTEGER NOT NULL CHECK (world_size >= 1),
  config TEXT NOT NULL DEFAULT '',
  code_version TEXT NOT NULL DEFAULT '',
  data_version TEXT NOT NULL DEFAULT '',
  layout TEXT NOT NULL DEFAULT '',
  out_dir TEXT NOT NULL DEFAULT '',
  peak_name TEXT NOT NULL DEFAULT '',
  peak_flops REAL NOT NULL DEFAULT 0,
  flops_per_token REAL NOT NULL DEFAULT 0,
  mfu_formula TEXT NOT NULL DEFAULT '',
  created_unix_s REAL NOT NULL,
  finished_unix_s REAL,
  message TEXT NOT NULL DEFAULT '',
  last_step INTEGER NOT NULL DEFAULT -1,
  rollup_frontier INTEGER NOT NULL DEFAULT 0,
  rollup_sealed INTEGER NOT NULL DEFAULT 0,
  raw_from_step INTEGER NOT NULL DEFAULT 0
);

CREATE TABLE nodes (
  id INTEGER PRIMARY KEY,
  host TEXT NOT NULL UNIQUE,
  devices INTEGER NOT NULL DEFAULT 0,
  device_name TEXT NOT NULL DEFAULT '',
  state TEXT NOT NULL DEFAULT 'ok',
  first_seen_unix_s REAL,
  last_seen_unix_s REAL
);

CREATE TABLE steps (
  run_id INTEGER NOT NULL,
  step INTEGER NOT NULL,
  time_unix_s REAL,
  loss REAL,
  grad_norm REAL,
  lr REAL,
  tokens_per_s REAL,
  step_s REAL,
  mfu REAL,
  hfu REAL,
  val_loss REAL,
  PRIMARY KEY (run_id, step)
) WITHOUT ROWID;

CREATE TABLE rank_steps (
  run_id INTEGER NOT NULL,
  step INTEGER NOT NULL,
  grp INTEGER NOT NULL,
  data BLOB NOT NULL,
  PRIMARY KEY (run_id, step, grp)
) WITHOUT ROWID;

CREATE TABLE rank_tiles (
  id INTEGER PRIMARY KEY,
  run_id INTEGER NOT NULL,
  level INTEGER NOT NULL,
  block INTEGER NOT NULL,
  rblock INTEGER NOT NULL,
  data BLOB NOT NULL
);

CREATE TABLE events (
  id INTEGER PRIMARY KEY,
  run_id INTEGER NOT NULL,
  time_unix_s REAL NOT NULL,
  step INTEGER NOT NULL DEFAULT -1,
  kind TEXT NOT NULL,
  rank INTEGER NOT NULL DEFAULT -1,
  node TEXT NOT NULL DEFAULT '',
  message TEXT NOT NULL DEFAULT '',
  payload TEXT NOT NULL DEFAULT ''
);
CREATE INDEX events_by_run ON events (run_id, id);

CREATE TABLE checkpoints (
  run_id INTEGER NOT NULL,
  step INTEGER NOT NULL,
  path TEXT NOT NULL,
  bytes INTEGER NOT NULL DEFAULT 0,
  write_s REAL NOT NULL DEFAULT 0,
  state TEXT NOT NULL,
  time_unix_s REAL,
  PRIMARY KEY (run_id, step)
);
)sql";

// Version 2: runs.options, what a coordinator needs to place a run again after a restart (its layout, step
// limit and policies, as JSON).
constexpr const char* kSchemaV2 = R"sql(
ALTER TABLE runs ADD COLUMN options TEXT NOT NULL DEFAULT '';
)sql";

// Version 3: a step's mfu and hfu are NULL when unknown (no peak). Before, no run computed them and every
// row holds 0 for both; that 0 meant "unknown", so it becomes NULL rather than a plotted 0% utilisation.
constexpr const char* kSchemaV3 = R"sql(
UPDATE steps SET mfu = NULL, hfu = NULL WHERE mfu = 0 AND hfu = 0;
)sql";

// Version 4: rank tiles gain busy time (storage/pack.h, tile format 2). runs.tile_format says which format a
// run's tiles are in: the runs of an older file are marked 1, and HistoryDb::open rebuilds their tiles from
// the rank_steps rows (where those were downsampled away, the format-1 tiles stay, without busy time).
constexpr const char* kSchemaV4 = R"sql(
ALTER TABLE runs ADD COLUMN tile_format INTEGER NOT NULL DEFAULT 2;
UPDATE runs SET tile_format = 1;
)sql";

// Version 5: the checkpoint catalog keeps what the typed checkpoint record carries (telemetry/records.h):
// the time training stalled for it (NULL = not known: rows from before), the shard count (NULL = not known),
// the manifest's xxHash64, and a failed write's message. state gains "failed".
constexpr const char* kSchemaV5 = R"sql(
ALTER TABLE checkpoints ADD COLUMN stall_s REAL;
ALTER TABLE checkpoints ADD COLUMN shards INTEGER;
ALTER TABLE checkpoints ADD COLUMN manifest_xxh64 TEXT NOT NULL DEFAULT '';
ALTER TABLE checkpoints ADD COLUMN message TEXT NOT NULL DEFAULT '';
)sql";

// Version 6: the agents' device samples (telemetry/records.h DeviceSampleRecord): per node and GPU, one row
// per reading. node_id is nodes.id; device −1 is the node itself. Keyed metric-first, so one metric's series
// (what a panel or a query asks for) lie together; a reading not made is no row (unknown, never 0).
constexpr const char* kSchemaV6 = R"sql(
CREATE TABLE device_samples (
  metric INTEGER NOT NULL,
  node_id INTEGER NOT NULL,
  device INTEGER NOT NULL,
  time_unix_s REAL NOT NULL,
  value REAL,
  PRIMARY KEY (metric, node_id, device, time_unix_s)
) WITHOUT ROWID;
)sql";

int pragma_int(sqlite3* db, const char* sql) {
  sqlite3_stmt* st = nullptr;
  int v = -1;
  if (sqlite3_prepare_v2(db, sql, -1, &st, nullptr) == SQLITE_OK && sqlite3_step(st) == SQLITE_ROW) {
    v = sqlite3_column_int(st, 0);
  }
  sqlite3_finalize(st);
  return v;
}

bool exec(sqlite3* db, const std::string& sql, std::string* error) {
  char* msg = nullptr;
  if (sqlite3_exec(db, sql.c_str(), nullptr, nullptr, &msg) == SQLITE_OK) return true;
  if (error) *error = msg ? msg : sqlite3_errmsg(db);
  sqlite3_free(msg);
  return false;
}

}  // namespace

const std::vector<Migration>& schema_migrations() {
  static const std::vector<Migration> kMigrations = {
      {1, kSchemaV1}, {2, kSchemaV2}, {3, kSchemaV3}, {4, kSchemaV4}, {5, kSchemaV5}, {6, kSchemaV6},
  };
  return kMigrations;
}

int schema_latest_version() {
  return schema_migrations().back().version;
}

int schema_version(sqlite3* db) {
  return pragma_int(db, "PRAGMA user_version");
}

bool schema_migrate(sqlite3* db, const std::vector<Migration>& migrations, int target, std::string* error) {
  const auto fail = [&](const std::string& why) {
    if (error) *error = why;
    return false;
  };
  for (size_t i = 0; i < migrations.size(); ++i) {
    if (migrations[i].version != static_cast<int>(i) + 1) {
      return fail("schema migrations are not numbered 1, 2, ...: entry " + std::to_string(i) +
                  " has version " + std::to_string(migrations[i].version));
    }
  }
  const int newest = static_cast<int>(migrations.size());
  if (target < 0 || target > newest) {
    return fail("schema version " + std::to_string(target) + " is not one of 0.." + std::to_string(newest));
  }
  const int current = schema_version(db);
  if (current < 0) return fail(std::string("cannot read the schema version: ") + sqlite3_errmsg(db));
  const int app = pragma_int(db, "PRAGMA application_id");
  if (app != 0 && app != kHistoryApplicationId)
    return fail("not a Gantry history database (application_id differs)");
  if (app == 0 && pragma_int(db, "SELECT count(*) FROM sqlite_schema") > 0) {
    return fail("not a Gantry history database (it has tables but no Gantry application_id)");
  }
  if (current > newest) {
    return fail("history database schema version " + std::to_string(current) +
                " is newer than this build's " + std::to_string(newest) + "; use a newer gantry");
  }
  if (current > target) {
    return fail("history database is at schema version " + std::to_string(current) + ", past the requested " +
                std::to_string(target) + " (downgrades are not supported)");
  }
  for (int v = current + 1; v <= target; ++v) {
    std::string why;
    // IMMEDIATE: take the write lock before reading anything, so two processes opening a fresh file
    // cannot both decide to migrate it.
    if (!exec(db, "BEGIN IMMEDIATE", &why))
      return fail("migration to schema version " + std::to_string(v) + ": " + why);
    if (schema_version(db) >= v) {  // another process migrated while we waited for the lock
      exec(db, "COMMIT", nullptr);
      continue;
    }
    const std::string sql = std::string(migrations[static_cast<size_t>(v - 1)].sql) +
                            ";\nPRAGMA application_id = " + std::to_string(kHistoryApplicationId) +
                            ";\nPRAGMA user_version = " + std::to_string(v) + ";";
    if (!exec(db, sql, &why) || !exec(db, "COMMIT", &why)) {
      exec(db, "ROLLBACK", nullptr);
      return fail("migration to schema version " + std::to_string(v) + " failed: " + why);
    }
  }
  return true;
}

}  // namespace gantry
