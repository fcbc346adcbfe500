#include "storage/schema.h"

#include <gtest/gtest.h>
#include <sqlite3.h>
#include <unistd.h>

#include <filesystem>
#include <set>
#include <string>

#include "storage/history_db.h"
#include "tests/scratch_dir.h"

namespace gantry {
namespace {

namespace fs = std::filesystem;

fs::path temp_dir() {
  return testing_support::scratch_path("schema");
}

// Removes this process's files when the tests are done.
class TempDirCleanup : public ::testing::Environment {
 public:
  void TearDown() override { fs::remove_all(temp_dir()); }
};
const auto* const kCleanup = ::testing::AddGlobalTestEnvironment(new TempDirCleanup);

std::string temp_file(const std::string& name) {
  const fs::path dir = temp_dir();
  fs::create_directories(dir);
  const fs::path p = dir / name;
  for (const char* suffix : {"", "-wal", "-shm"}) fs::remove(p.string() + suffix);
  return p.string();
}

struct Db {
  sqlite3* db = nullptr;
  explicit Db(const std::string& path) { EXPECT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK); }
  ~Db() { sqlite3_close(db); }
  int count(const std::string& sql) const {
    sqlite3_stmt* st = nullptr;
    int n = -1;
    if (sqlite3_prepare_v2(db, sql.c_str(), -1, &st, nullptr) == SQLITE_OK &&
        sqlite3_step(st) == SQLITE_ROW) {
      n = sqlite3_column_int(st, 0);
    }
    sqlite3_finalize(st);
    return n;
  }
  bool exec(const std::string& sql) const {
    return sqlite3_exec(db, sql.c_str(), nullptr, nullptr, nullptr) == SQLITE_OK;
  }
  std::set<std::string> tables() const {
    std::set<std::string> out;
    sqlite3_stmt* st = nullptr;
    sqlite3_prepare_v2(db, "SELECT name FROM sqlite_schema WHERE type = 'table'", -1, &st, nullptr);
    while (sqlite3_step(st) == SQLITE_ROW)
      out.insert(reinterpret_cast<const char*>(sqlite3_column_text(st, 0)));
    sqlite3_finalize(st);
    return out;
  }
};

TEST(Schema, MigratesAnEmptyFileToTheLatestVersion) {
  const std::string path = temp_file("empty.sqlite");
  {
    std::string error;
    auto db = HistoryDb::open(path, {}, &error);
    ASSERT_NE(db, nullptr) << error;
  }
  Db db(path);
  EXPECT_EQ(schema_version(db.db), schema_latest_version());
  EXPECT_EQ(db.count("PRAGMA application_id"), kHistoryApplicationId);
  const std::set<std::string> want = {"runs",   "steps",       "rank_steps", "rank_tiles",
                                      "events", "checkpoints", "nodes"};
  for (const std::string& t : want) EXPECT_TRUE(db.tables().count(t)) << t;
}

// Data written at each earlier version is there, readable, after opening with this build. The fixture
// for version v writes what v's schema holds; a new migration adds a case here and keeps the old ones.
void write_fixture(sqlite3* db, int version) {
  if (version >= 1) {
    ASSERT_EQ(sqlite3_exec(
                  db,
                  "INSERT INTO runs (id, name, world_size, created_unix_s) VALUES (7, 'old run', 2, 1.7e9);"
                  "INSERT INTO steps (run_id, step, loss) VALUES (7, 0, 4.5), (7, 1, 4.25);"
                  "INSERT INTO events (run_id, time_unix_s, kind) VALUES (7, 1.7e9, 'pause');"
                  "INSERT INTO checkpoints (run_id, step, path, state) VALUES (7, 1, 'ck/1', 'committed');",
                  nullptr, nullptr, nullptr),
              SQLITE_OK)
        << sqlite3_errmsg(db);
  }
}

void check_fixture(HistoryDb& db, int version) {
  if (version < 1) return;
  RunRow run;
  ASSERT_TRUE(db.get_run(7, &run)) << db.error();
  EXPECT_EQ(run.info.name, "old run");
  std::vector<StepRecord> steps;
  ASSERT_TRUE(db.read_steps(7, 0, kStepEnd, 10, &steps));
  ASSERT_EQ(steps.size(), 2u);
  EXPECT_EQ(steps[1].loss, 4.25);
  std::vector<CheckpointInfo> cks;
  ASSERT_TRUE(db.list_checkpoints(7, &cks));
  ASSERT_EQ(cks.size(), 1u);
  // Catalogued before version 5: its stall and shard count are unknown (NULL), never 0.
  EXPECT_FALSE(cks[0].stall_s.has_value());
  EXPECT_FALSE(cks[0].shards.has_value());
  EXPECT_EQ(cks[0].message, "");
  // And the upgraded file takes new data.
  RecordBatch b;
  RankStepRecord r;
  r.run_id = 7;
  r.step = 2;
  r.rank = 1;
  r.total_s = 0.5;
  b.rank_steps.push_back(r);
  EXPECT_TRUE(db.ingest(b)) << db.error();
}

TEST(Schema, MigratesFromEveryEarlierVersion) {
  for (int v = 0; v < schema_latest_version(); ++v) {
    SCOPED_TRACE("from version " + std::to_string(v));
    const std::string path = temp_file("from_v" + std::to_string(v) + ".sqlite");
    {
      Db raw(path);
      std::string error;
      ASSERT_TRUE(schema_migrate(raw.db, schema_migrations(), v, &error)) << error;
      ASSERT_EQ(schema_version(raw.db), v);
      write_fixture(raw.db, v);
    }
    std::string error;
    auto db = HistoryDb::open(path, {}, &error);
    ASSERT_NE(db, nullptr) << error;
    EXPECT_EQ(db->schema_version(), schema_latest_version());
    check_fixture(*db, v);
  }
}

// Before version 3 no run computed MFU, so every step row held mfu = hfu = 0 for "unknown": the migration
// makes those NULL (read back as absent, shown as n/a) and keeps a real figure.
TEST(Schema, Version3MakesTheOldZeroUtilisationUnknown) {
  const std::string path = temp_file("v3_mfu.sqlite");
  {
    Db raw(path);
    std::string error;
    ASSERT_TRUE(schema_migrate(raw.db, schema_migrations(), 2, &error)) << error;
    ASSERT_TRUE(
        raw.exec("INSERT INTO runs (id, name, world_size, created_unix_s) VALUES (3, 'r', 1, 1.7e9);"
                 "INSERT INTO steps (run_id, step, loss, mfu, hfu) VALUES (3, 0, 4.5, 0, 0),"
                 " (3, 1, 4.25, 0.4, 0.5);"));
  }
  std::string error;
  auto db = HistoryDb::open(path, {}, &error);
  ASSERT_NE(db, nullptr) << error;
  ASSERT_GE(db->schema_version(), 3);
  std::vector<StepRecord> steps;
  ASSERT_TRUE(db->read_steps(3, 0, kStepEnd, 10, &steps)) << db->error();
  ASSERT_EQ(steps.size(), 2u);
  EXPECT_FALSE(steps[0].mfu.has_value());
  EXPECT_FALSE(steps[0].hfu.has_value());
  ASSERT_TRUE(steps[1].mfu.has_value());
  EXPECT_EQ(*steps[1].mfu, 0.4);
  EXPECT_EQ(steps[1].hfu.value_or(-1), 0.5);
}

TEST(Schema, ReopeningIsANoOp) {
  const std::string path = temp_file("reopen.sqlite");
  for (int i = 0; i < 3; ++i) {
    std::string error;
    auto db = HistoryDb::open(path, {}, &error);
    ASSERT_NE(db, nullptr) << error;
    EXPECT_GT(db->begin_run({.name = "r" + std::to_string(i)}), 0);
  }
  std::string error;
  auto db = HistoryDb::open(path, {.read_only = true}, &error);
  ASSERT_NE(db, nullptr) << error;
  std::vector<RunRow> runs;
  ASSERT_TRUE(db->list_runs(&runs));
  EXPECT_EQ(runs.size(), 3u);
  Db raw(path);
  sqlite3_stmt* st = nullptr;
  ASSERT_EQ(sqlite3_prepare_v2(raw.db, "PRAGMA integrity_check", -1, &st, nullptr), SQLITE_OK);
  ASSERT_EQ(sqlite3_step(st), SQLITE_ROW);
  EXPECT_STREQ(reinterpret_cast<const char*>(sqlite3_column_text(st, 0)), "ok");
  sqlite3_finalize(st);
}

// The migration runner itself, on a made-up history of three versions.
const std::vector<Migration> kToy = {
    {1, "CREATE TABLE a (x INTEGER)"},
    {2, "ALTER TABLE a ADD COLUMN y TEXT NOT NULL DEFAULT 'none'; CREATE TABLE b (z)"},
    {3, "INSERT INTO a (x) VALUES (3); CREATE INDEX b_z ON b (z)"},
};

TEST(Schema, RunnerAppliesStepByStepAndKeepsData) {
  const std::string path = temp_file("toy.sqlite");
  Db db(path);
  std::string error;
  ASSERT_TRUE(schema_migrate(db.db, kToy, 1, &error)) << error;
  EXPECT_EQ(schema_version(db.db), 1);
  ASSERT_TRUE(db.exec("INSERT INTO a (x) VALUES (1)"));
  ASSERT_TRUE(schema_migrate(db.db, kToy, 2, &error)) << error;
  EXPECT_EQ(db.count("SELECT count(*) FROM a WHERE y = 'none'"), 1);
  ASSERT_TRUE(schema_migrate(db.db, kToy, 3, &error)) << error;
  EXPECT_EQ(schema_version(db.db), 3);
  EXPECT_EQ(db.count("SELECT count(*) FROM a"), 2);
  ASSERT_TRUE(schema_migrate(db.db, kToy, 3, &error)) << "at the target already: nothing to do";
  EXPECT_FALSE(schema_migrate(db.db, kToy, 2, &error));
  EXPECT_NE(error.find("downgrades are not supported"), std::string::npos) << error;
}

TEST(Schema, FailedMigrationLeavesThePreviousVersionIntact) {
  const std::string path = temp_file("toy_fail.sqlite");
  Db db(path);
  std::string error;
  const std::vector<Migration> broken = {kToy[0], {2, "CREATE TABLE c (q); INSERT INTO nowhere VALUES (1)"}};
  ASSERT_TRUE(schema_migrate(db.db, broken, 1, &error)) << error;
  EXPECT_FALSE(schema_migrate(db.db, broken, 2, &error));
  EXPECT_NE(error.find("migration to schema version 2 failed"), std::string::npos) << error;
  EXPECT_NE(error.find("nowhere"), std::string::npos) << error;
  EXPECT_EQ(schema_version(db.db), 1);
  EXPECT_EQ(db.tables().count("c"), 0u) << "the half-applied migration was rolled back";
  EXPECT_TRUE(sqlite3_get_autocommit(db.db)) << "no transaction left open";
}

TEST(Schema, RunnerRefusesBadListsAndNewerFiles) {
  const std::string path = temp_file("toy_refuse.sqlite");
  Db db(path);
  std::string error;
  EXPECT_FALSE(schema_migrate(db.db, {{1, "CREATE TABLE a (x)"}, {3, "CREATE TABLE b (x)"}}, 2, &error));
  EXPECT_NE(error.find("not numbered"), std::string::npos) << error;
  EXPECT_FALSE(schema_migrate(db.db, kToy, 4, &error));
  ASSERT_TRUE(schema_migrate(db.db, kToy, 3, &error)) << error;
  EXPECT_FALSE(schema_migrate(db.db, {kToy[0], kToy[1]}, 2, &error));
  EXPECT_NE(error.find("newer than this build"), std::string::npos) << error;
}

}  // namespace
}  // namespace gantry
