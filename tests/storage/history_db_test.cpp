#include "storage/history_db.h"

#include <gtest/gtest.h>
#include <sqlite3.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <limits>
#include <map>
#include <random>

#include "storage/pack.h"  // the first tile level: the resolution left where raw rows were downsampled
#include "storage/schema.h"
#include "tests/scratch_dir.h"

namespace gantry {
namespace {

namespace fs = std::filesystem;

class ScratchFiles {
 public:
  ScratchFiles() { path_ = testing_support::scratch_dir("db" + std::to_string(counter_++)); }
  ~ScratchFiles() { fs::remove_all(path_); }
  std::string file(const std::string& name) const { return (path_ / name).string(); }

 private:
  static inline int counter_ = 0;
  fs::path path_;
};

std::unique_ptr<HistoryDb> open_db(const std::string& path, HistoryDbOptions o = {}) {
  std::string error;
  auto db = HistoryDb::open(path, o, &error);
  EXPECT_NE(db, nullptr) << error;
  return db;
}

// Values on a 1/1024 grid: exact in float32, as storage keeps them, so min and max compare exactly.
double grid(double v) {
  return std::round(v * 1024.0) / 1024.0;
}

RankStepRecord make_record(int64_t run, int64_t step, int32_t rank, std::mt19937_64& rng) {
  std::uniform_real_distribution<double> u(0.0, 1.0);
  RankStepRecord r;
  r.run_id = run;
  r.step = step;
  r.rank = rank;
  r.host = "node-" + std::to_string(rank / 8);
  r.device = rank % 8;
  r.phases.data_wait = grid(0.01 * u(rng));
  r.phases.forward = grid(0.3 + 0.05 * u(rng));
  r.phases.backward = grid(0.6 + 0.1 * u(rng));
  r.phases.optimizer = grid(0.05);
  r.phases.comm_exposed = grid(0.1 * u(rng));
  r.phases.checkpoint_stall = step % 100 == 0 ? grid(2.0 * u(rng)) : 0.0;
  r.total_s = grid(r.phases.sum() + 0.01 * u(rng));
  r.tokens = 4096 + rank;
  r.mem_allocated_bytes = (uint64_t{30} << 30) + static_cast<uint64_t>(rank) * 4096;
  r.mem_peak_bytes = (uint64_t{60} << 30) + static_cast<uint64_t>(step % 1000) * 1048576;
  if (rank % 3 == 0) r.power_watts = grid(500 + 200 * u(rng));
  return r;
}

double metric_of(const RankStepRecord& r, RankMetric m) {
  switch (m) {
    case RankMetric::total:
      return r.total_s;
    case RankMetric::data_wait:
      return r.phases.data_wait;
    case RankMetric::forward:
      return r.phases.forward;
    case RankMetric::backward:
      return r.phases.backward;
    case RankMetric::optimizer:
      return r.phases.optimizer;
    case RankMetric::comm_exposed:
      return r.phases.comm_exposed;
    case RankMetric::checkpoint_stall:
      return r.phases.checkpoint_stall;
    case RankMetric::mem_peak:
      return static_cast<double>(r.mem_peak_bytes);
    case RankMetric::busy:  // the four compute phases, summed in float32 as storage keeps them
      return static_cast<float>(r.phases.data_wait) + static_cast<float>(r.phases.forward) +
             static_cast<float>(r.phases.backward) + static_cast<float>(r.phases.optimizer);
    case RankMetric::tokens:
      return static_cast<double>(r.tokens);
    case RankMetric::mem_allocated:
      return static_cast<double>(r.mem_allocated_bytes);
    case RankMetric::temperature:
      return r.temperature_celsius.value_or(NAN);
    case RankMetric::sm_clock:
      return r.sm_clock_hertz.value_or(NAN);
    case RankMetric::power:
      return r.power_watts.value_or(NAN);
  }
  return NAN;
}

// The reference: every record kept, the later of two for the same (step, rank) winning; answered by
// brute force over a flat copy (rebuilt after changes), which is fast enough to run hundreds of queries.
struct Truth {
  std::map<std::pair<int64_t, int32_t>, RankStepRecord> records;
  struct Flat {
    int64_t step;
    int32_t rank;
    double v[kRankMetricCount];
  };
  mutable std::vector<Flat> flat;
  void add(const RankStepRecord& r) {
    records[{r.step, r.rank}] = r;
    flat.clear();
  }
  void erase_after(int64_t step) {
    for (auto it = records.begin(); it != records.end();)
      it = it->first.first > step ? records.erase(it) : std::next(it);
    flat.clear();
  }

  // Buckets for the given aligned width over [first, end), from all records in the rank set.
  std::vector<Bucket> band(RankMetric m, int64_t first, int64_t end, int64_t w,
                           const std::vector<int32_t>& ranks, int64_t skip_before = 0) const {
    if (flat.empty()) {
      for (const auto& [key, r] : records) {
        Flat f{key.first, key.second, {}};
        for (int k = 0; k < kRankMetricCount; ++k) f.v[k] = metric_of(r, static_cast<RankMetric>(k));
        flat.push_back(f);
      }
    }
    std::vector<int32_t> member;
    if (!ranks.empty()) {
      member.assign(static_cast<size_t>(ranks.back()) + 1, 0);
      for (int32_t r : ranks) member[static_cast<size_t>(r)] = 1;
    }
    std::map<int64_t, Bucket> out;
    std::map<int64_t, std::pair<double, int64_t>> last_sum;
    auto it = std::lower_bound(flat.begin(), flat.end(), std::max(first, skip_before),
                               [](const Flat& f, int64_t s) { return f.step < s; });
    for (; it != flat.end() && it->step < end; ++it) {
      const int64_t step = it->step;
      const int32_t rank = it->rank;
      if (!ranks.empty() &&
          (static_cast<size_t>(rank) >= member.size() || !member[static_cast<size_t>(rank)]))
        continue;
      const double v = it->v[static_cast<int>(m)];
      if (std::isnan(v)) continue;
      const int64_t k = (step - first) / w;
      auto [bit, fresh] = out.try_emplace(k);
      Bucket& b = bit->second;
      if (fresh) {
        b.step_begin = first + k * w;
        b.step_end = b.step_begin + w;
        b.min = b.max = v;
        b.max_rank = rank;
        b.last_step = step;
      }
      ++b.count;
      b.min = std::min(b.min, v);
      if (v > b.max || (v == b.max && rank < b.max_rank)) {
        b.max = v;
        b.max_rank = rank;
      }
      b.mean += v;  // a sum until the end
      auto& [ls, lc] = last_sum[k];
      if (step > b.last_step) {
        b.last_step = step;
        ls = 0;
        lc = 0;
      }
      if (step == b.last_step) {
        ls += v;
        ++lc;
      }
    }
    std::vector<Bucket> v;
    for (auto& [k, b] : out) {
      b.mean /= static_cast<double>(b.count);
      b.last = last_sum[k].first / static_cast<double>(last_sum[k].second);
      v.push_back(b);
    }
    return v;
  }
};

void expect_same_buckets(const std::vector<Bucket>& got, const std::vector<Bucket>& want,
                         const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    const Bucket &g = got[i], &w = want[i];
    SCOPED_TRACE(what + ", bucket " + std::to_string(i) + " [" + std::to_string(w.step_begin) + ", " +
                 std::to_string(w.step_end) + ")");
    EXPECT_EQ(g.step_begin, w.step_begin);
    EXPECT_EQ(g.step_end, w.step_end);
    EXPECT_EQ(g.count, w.count);
    EXPECT_EQ(g.min, w.min);  // exact: the point of this test
    EXPECT_EQ(g.max, w.max);
    EXPECT_EQ(g.max_rank, w.max_rank);
    // Tiles keep time sums in float32 (storage/pack.h), rounded once per level of the pyramid.
    EXPECT_NEAR(g.mean, w.mean, 1e-6 * std::max(1.0, std::fabs(w.mean)));
    EXPECT_EQ(g.last_step, w.last_step);
    EXPECT_NEAR(g.last, w.last, 1e-6 * std::max(1.0, std::fabs(w.last)));
  }
}

// Runs a band query and checks it against the reference with the same bucket width.
void check_band(HistoryDb& db, const Truth& truth, int64_t run, RankMetric m, int64_t a, int64_t b,
                const std::vector<int32_t>& ranks, int32_t max_buckets, int64_t last_step,
                int64_t skip_before = 0) {
  BandResult res;
  ASSERT_TRUE(db.query_band({.run_id = run,
                             .metric = m,
                             .step_begin = a,
                             .step_end = b,
                             .ranks = ranks,
                             .max_buckets = max_buckets},
                            &res))
      << db.error();
  // Untiled (NVML) metrics live only in the raw rows, so their range starts where those do.
  const bool tiled = rank_metric_tiled(m);
  const int64_t lo = std::max<int64_t>({a, 0, tiled ? 0 : skip_before}), hi = std::min(b, last_step + 1);
  if (lo >= hi) {
    EXPECT_TRUE(res.buckets.empty());
    return;
  }
  // The width is the smallest power of two that fits, or the first tile level where raw rows are gone.
  int64_t w = 1;
  while (w * max_buckets < hi - lo) w *= 2;
  if (lo < skip_before && tiled) w = std::max<int64_t>(w, pack::kStepBlock[1]);
  ASSERT_EQ(res.bucket_steps, w);
  std::vector<int32_t> sorted = ranks;
  std::sort(sorted.begin(), sorted.end());
  const int64_t first = lo / w * w, end = std::min((hi - 1) / w * w + w, last_step + 1);
  expect_same_buckets(res.buckets, truth.band(m, first, end, w, sorted, tiled ? 0 : skip_before),
                      std::string(rank_metric_name(m)) + " [" + std::to_string(a) + ", " + std::to_string(b) +
                          ") ranks " + std::to_string(ranks.size()) + " buckets " +
                          std::to_string(max_buckets));
}

struct Battery {
  std::vector<std::vector<int32_t>> rank_sets;
  std::vector<std::pair<int64_t, int64_t>> ranges;
};

Battery battery(int32_t world, int64_t steps, std::mt19937_64& rng) {
  Battery b;
  b.rank_sets.push_back({});  // all
  b.rank_sets.push_back({world - 1});
  std::vector<int32_t> contiguous, sparse, almost_all;
  for (int32_t r = world / 4; r < std::min(world, world / 4 + 70); ++r) contiguous.push_back(r);
  for (int32_t r = 0; r < world; ++r) {
    if (rng() % 7 == 0) sparse.push_back(r);
    if (r != world / 2) almost_all.push_back(r);
  }
  b.rank_sets.push_back(contiguous);
  if (!sparse.empty()) b.rank_sets.push_back(sparse);
  if (!almost_all.empty()) b.rank_sets.push_back(almost_all);
  b.ranges = {{0, kStepEnd},
              {0, steps},
              {steps / 3, steps / 3 + 1},
              {17, steps - 5},
              {steps - 40, steps + 100},
              {-5, 31},
              {steps + 10, steps + 20}};
  return b;
}

void check_battery(HistoryDb& db, const Truth& truth, int64_t run, int32_t world, int64_t steps,
                   int64_t last_step, std::mt19937_64& rng, int64_t skip_before = 0) {
  const Battery b = battery(world, steps, rng);
  for (const auto& ranks : b.rank_sets) {
    for (const auto& [lo, hi] : b.ranges) {
      for (int32_t buckets : {1, 7, 100, 2000}) {
        check_band(db, truth, run, RankMetric::total, lo, hi, ranks, buckets, last_step, skip_before);
      }
      check_band(db, truth, run, RankMetric::comm_exposed, lo, hi, ranks, 30, last_step, skip_before);
      check_band(db, truth, run, RankMetric::busy, lo, hi, ranks, 40, last_step, skip_before);
      check_band(db, truth, run, RankMetric::mem_peak, lo, hi, ranks, 3, last_step, skip_before);
      check_band(db, truth, run, RankMetric::tokens, lo, hi, ranks, 9, last_step, skip_before);
      check_band(db, truth, run, RankMetric::power, lo, hi, ranks, 50, last_step, skip_before);
    }
  }
}

TEST(HistoryDb, OpensWithWalAndCurrentSchema) {
  ScratchFiles dir;
  auto db = open_db(dir.file("h.sqlite"));
  ASSERT_NE(db, nullptr);
  EXPECT_EQ(db->schema_version(), schema_latest_version());
  sqlite3_stmt* st = nullptr;
  ASSERT_EQ(sqlite3_prepare_v2(db->handle(), "PRAGMA journal_mode", -1, &st, nullptr), SQLITE_OK);
  ASSERT_EQ(sqlite3_step(st), SQLITE_ROW);
  EXPECT_STREQ(reinterpret_cast<const char*>(sqlite3_column_text(st, 0)), "wal");
  sqlite3_finalize(st);
}

TEST(HistoryDb, RunsLifecycle) {
  ScratchFiles dir;
  auto db = open_db(dir.file("h.sqlite"));
  const int64_t a = db->begin_run({.name = "a",
                                   .world_size = 4,
                                   .config = "[model]\nn_layer = 2\n",
                                   .layout = "dp=4",
                                   .peak_name = "h100-sxm",
                                   .peak_flops = 989e12,
                                   .mfu_formula = "MFU = ..."});
  const int64_t b = db->begin_run({.name = "b", .world_size = 1});
  ASSERT_GT(a, 0) << db->error();
  ASSERT_GT(b, a);
  EXPECT_EQ(db->begin_run({.name = "bad", .world_size = 0}), -1);
  EXPECT_NE(db->error().find("world_size"), std::string::npos);
  RunRow row;
  ASSERT_TRUE(db->get_run(a, &row)) << db->error();
  EXPECT_EQ(row.info.name, "a");
  EXPECT_EQ(row.info.config, "[model]\nn_layer = 2\n");
  EXPECT_EQ(row.info.peak_flops, 989e12);
  EXPECT_EQ(row.status, RunStatus::running);
  EXPECT_GT(row.info.created_unix_s, 1.7e9);
  EXPECT_EQ(row.last_step, -1);
  ASSERT_TRUE(db->finish_run(a, RunStatus::failed, "rank 3 died", 1800000000.0)) << db->error();
  ASSERT_TRUE(db->get_run(a, &row));
  EXPECT_EQ(row.status, RunStatus::failed);
  EXPECT_EQ(row.message, "rank 3 died");
  EXPECT_EQ(row.finished_unix_s, 1800000000.0);
  EXPECT_FALSE(db->finish_run(a, RunStatus::running, ""));
  EXPECT_FALSE(db->get_run(999, &row));
  EXPECT_NE(db->error().find("run 999 does not exist"), std::string::npos);
  std::vector<RunRow> runs;
  ASSERT_TRUE(db->list_runs(&runs));
  ASSERT_EQ(runs.size(), 2u);
  EXPECT_EQ(runs[1].info.name, "b");
}

// The central property: whatever resolution, range and rank set, every bucket's min and max are exactly
// those of the records in it, while the run is live (tails from raw rows) and after it is sealed.
void ingest_and_check(int32_t world, int64_t steps, bool node_batches, uint64_t seed) {
  ScratchFiles dir;
  auto db = open_db(dir.file("h.sqlite"));
  const int64_t run = db->begin_run({.name = "t", .world_size = world});
  std::mt19937_64 rng(seed);
  Truth truth;
  for (int64_t s = 0; s < steps; ++s) {
    RecordBatch batch;
    for (int32_t r = 0; r < world; ++r) {
      batch.rank_steps.push_back(make_record(run, s, r, rng));
      truth.add(batch.rank_steps.back());
      // Per-node batches, as agents send them: one batch per 8 ranks.
      if (node_batches && (r % 8 == 7 || r == world - 1)) {
        ASSERT_TRUE(db->ingest(batch)) << db->error();
        batch.clear();
      }
    }
    batch.steps.push_back({.run_id = run, .step = s, .loss = 3.0 - 1e-4 * static_cast<double>(s)});
    ASSERT_TRUE(db->ingest(batch)) << db->error();
  }
  check_battery(*db, truth, run, world, steps, steps - 1, rng);
  ASSERT_TRUE(db->finish_run(run, RunStatus::finished, "")) << db->error();
  check_battery(*db, truth, run, world, steps, steps - 1, rng);
}

TEST(HistoryDb, IngestThenQueryExactMinMaxOneRank) {
  ingest_and_check(1, 9000, false, 1);
}  // 3 step levels
TEST(HistoryDb, IngestThenQueryExactMinMaxTenRanksNodeBatches) {
  ingest_and_check(10, 700, true, 2);
}
TEST(HistoryDb, IngestThenQueryExactMinMaxHundredRanks) {
  ingest_and_check(100, 2100, false, 3);
}
TEST(HistoryDb, IngestThenQueryExactMinMaxBeyondOneTopRow) {
  ingest_and_check(600, 300, true, 4);
}

// Busy time is a tiled metric: where every rank's total is equal (a synchronous job, the fast ranks waiting
// in their collectives), the slow rank is the busy band's max_rank in every bucket and at every resolution,
// and the per-rank series puts its maxima above every other rank's.
TEST(HistoryDb, BusyTilesNameTheSlowRank) {
  ScratchFiles dir;
  auto db = open_db(dir.file("h.sqlite"));
  const int32_t world = 80;  // past 64 ranks: per-step tiles over rank spans too
  const int64_t run = db->begin_run({.name = "slow", .world_size = world});
  for (int64_t s = 0; s < 1500; ++s) {
    RecordBatch batch;
    for (int32_t r = 0; r < world; ++r) {
      RankStepRecord& x = batch.rank_steps.emplace_back();
      x.run_id = run;
      x.step = s;
      x.rank = r;
      x.phases.data_wait = 0.001;
      x.phases.forward = r == 37 ? 0.25 : 0.0125;
      x.phases.backward = 0.025;
      x.phases.optimizer = 0.005;
      x.phases.comm_exposed = r == 37 ? 0.0 : 0.2375;  // they wait for rank 37
      x.total_s = 0.2815;
    }
    ASSERT_TRUE(db->ingest(batch)) << db->error();
  }
  for (const bool sealed : {false, true}) {
    if (sealed) {
      ASSERT_TRUE(db->finish_run(run, RunStatus::finished, ""));
    }
    for (int32_t buckets : {1, 3, 50, 2000}) {
      BandResult busy, total;
      ASSERT_TRUE(db->query_band({.run_id = run, .metric = RankMetric::busy, .max_buckets = buckets}, &busy))
          << db->error();
      ASSERT_TRUE(
          db->query_band({.run_id = run, .metric = RankMetric::total, .max_buckets = buckets}, &total));
      ASSERT_FALSE(busy.buckets.empty());
      for (const Bucket& b : busy.buckets) {
        EXPECT_EQ(b.max_rank, 37) << "bucket at " << b.step_begin << ", " << buckets << " buckets";
        EXPECT_FLOAT_EQ(b.max, 0.281f);
        EXPECT_FLOAT_EQ(b.min, 0.0435f);
      }
      for (const Bucket& b : total.buckets) EXPECT_EQ(b.min, b.max);  // nothing to see on total
    }
    SeriesResult series;
    ASSERT_TRUE(db->query_series({.run_id = run, .metric = RankMetric::busy, .max_buckets = 20}, &series))
        << db->error();
    ASSERT_EQ(series.ranks.size(), static_cast<size_t>(world));
    for (const RankSeries& rs : series.ranks) {
      for (const Bucket& b : rs.buckets) EXPECT_FLOAT_EQ(b.max, rs.rank == 37 ? 0.281f : 0.0435f);
    }
  }
  RankMetric m;
  ASSERT_TRUE(rank_metric_from_name("busy_s", &m));
  EXPECT_EQ(m, RankMetric::busy);
  EXPECT_TRUE(rank_metric_tiled(RankMetric::busy));
}

// A file from before busy time (schema version 2, format-1 tiles) is upgraded on open: its runs' tiles are
// rebuilt from the raw rows, so busy time answers exactly, live and sealed runs alike; a run whose raw rows
// were downsampled keeps its old tiles (they cannot be rebuilt), and still answers for the old metrics.
TEST(HistoryDb, UpgradeRebuildsOldTilesWithBusyTime) {
  ScratchFiles dir;
  const std::string path = dir.file("h.sqlite");
  std::mt19937_64 rng(11);
  Truth sealed_truth, live_truth, cut_truth;
  int64_t sealed_run = 0, live_run = 0, cut_run = 0;
  {
    auto db = open_db(path, {.background_checkpoint = false});
    sealed_run = db->begin_run({.name = "sealed", .world_size = 70});
    live_run = db->begin_run({.name = "live", .world_size = 9});
    cut_run = db->begin_run({.name = "cut", .world_size = 3});
    for (int64_t s = 0; s < 600; ++s) {
      RecordBatch batch;
      for (int32_t r = 0; r < 70; ++r) {
        batch.rank_steps.push_back(make_record(sealed_run, s, r, rng));
        sealed_truth.add(batch.rank_steps.back());
      }
      for (int32_t r = 0; r < 9; ++r) {
        batch.rank_steps.push_back(make_record(live_run, s, r, rng));
        live_truth.add(batch.rank_steps.back());
      }
      for (int32_t r = 0; r < 3; ++r) {
        batch.rank_steps.push_back(make_record(cut_run, s, r, rng));
        cut_truth.add(batch.rank_steps.back());
      }
      ASSERT_TRUE(db->ingest(batch)) << db->error();
    }
    ASSERT_TRUE(db->finish_run(sealed_run, RunStatus::finished, ""));
    ASSERT_EQ(db->downsample_rank_steps(cut_run, 256), 256);
  }
  // Back to what a schema-2 build wrote: every tile in format 1 (its cells without busy), no tile_format.
  {
    sqlite3* raw = nullptr;
    ASSERT_EQ(sqlite3_open(path.c_str(), &raw), SQLITE_OK);
    std::vector<std::pair<int64_t, std::string>> tiles;
    sqlite3_stmt* st = nullptr;
    ASSERT_EQ(sqlite3_prepare_v2(raw, "SELECT id, data FROM rank_tiles", -1, &st, nullptr), SQLITE_OK);
    while (sqlite3_step(st) == SQLITE_ROW) {
      const auto* p = static_cast<const char*>(sqlite3_column_blob(st, 1));
      const std::string blob(p, static_cast<size_t>(sqlite3_column_bytes(st, 1)));
      ASSERT_EQ(blob[0], 2);
      std::string old = {char{1}, blob[1]};
      for (size_t c = 2; c < blob.size(); c += pack::kCellBytes) {
        const auto* cell = reinterpret_cast<const unsigned char*>(blob.data() + c);
        old.append(blob, c, 16);  // counts and last step
        for (int k = 0; k < pack::kTiledMetricsV1; ++k) {
          const size_t at = c + pack::metric_agg_offset(pack::kTileFormat, k);
          if (pack::metric_wide(k)) {
            old.append(blob, at, 36);
            continue;
          }
          old.append(blob, at, 12);    // min, max (float32), max_rank
          for (size_t f : {12, 16}) {  // the sums were float64
            const double v = pack::load<float>(cell + (at - c) + f);
            old.append(reinterpret_cast<const char*>(&v), sizeof v);
          }
        }
      }
      ASSERT_EQ(old.size(), 2 + (blob.size() - 2) / pack::kCellBytes * pack::kCellBytesV1);
      tiles.emplace_back(sqlite3_column_int64(st, 0), old);
    }
    sqlite3_finalize(st);
    ASSERT_FALSE(tiles.empty());
    ASSERT_EQ(sqlite3_prepare_v2(raw, "UPDATE rank_tiles SET data = ? WHERE id = ?", -1, &st, nullptr),
              SQLITE_OK);
    for (const auto& [id, blob] : tiles) {
      sqlite3_reset(st);
      sqlite3_bind_blob(st, 1, blob.data(), static_cast<int>(blob.size()), SQLITE_STATIC);
      sqlite3_bind_int64(st, 2, id);
      ASSERT_EQ(sqlite3_step(st), SQLITE_DONE);
    }
    sqlite3_finalize(st);
    // Back to version 2's tables: without what versions 4 (tile_format), 5 (the checkpoints' columns) and 6
    // (device_samples) added.
    ASSERT_EQ(
        sqlite3_exec(raw,
                     "DROP TABLE device_samples; "
                     "ALTER TABLE runs DROP COLUMN tile_format; ALTER TABLE checkpoints DROP COLUMN stall_s; "
                     "ALTER TABLE checkpoints DROP COLUMN shards; ALTER TABLE checkpoints DROP COLUMN "
                     "manifest_xxh64; ALTER TABLE checkpoints DROP COLUMN message; PRAGMA user_version = 2;",
                     nullptr, nullptr, nullptr),
        SQLITE_OK)
        << sqlite3_errmsg(raw);
    sqlite3_close(raw);
  }
  {
    // A read-only reader refuses the old version, as for any migration.
    std::string error;
    EXPECT_EQ(HistoryDb::open(path, {.read_only = true}, &error), nullptr);
  }
  auto db = open_db(path);
  ASSERT_NE(db, nullptr);
  EXPECT_EQ(db->schema_version(), schema_latest_version());
  sqlite3_stmt* st = nullptr;
  ASSERT_EQ(
      sqlite3_prepare_v2(db->handle(), "SELECT id, tile_format FROM runs ORDER BY id", -1, &st, nullptr),
      SQLITE_OK);
  std::map<int64_t, int> format;
  while (sqlite3_step(st) == SQLITE_ROW) format[sqlite3_column_int64(st, 0)] = sqlite3_column_int(st, 1);
  sqlite3_finalize(st);
  EXPECT_EQ(format[sealed_run], 2);
  EXPECT_EQ(format[live_run], 2);
  EXPECT_EQ(format[cut_run], 1);  // downsampled: its old tiles stay
  for (RankMetric m : {RankMetric::busy, RankMetric::total, RankMetric::forward}) {
    for (int32_t buckets : {1, 9, 700}) {
      check_band(*db, sealed_truth, sealed_run, m, 0, kStepEnd, {}, buckets, 599);
      check_band(*db, sealed_truth, sealed_run, m, 100, 500, {3, 64, 69}, buckets, 599);
      check_band(*db, live_truth, live_run, m, 0, kStepEnd, {}, buckets, 599);
    }
  }
  check_band(*db, cut_truth, cut_run, RankMetric::total, 0, kStepEnd, {}, 20, 599, 256);
  // The live run goes on: its tiles keep growing in the new format.
  RecordBatch batch;
  for (int32_t r = 0; r < 9; ++r) {
    batch.rank_steps.push_back(make_record(live_run, 600, r, rng));
    live_truth.add(batch.rank_steps.back());
  }
  ASSERT_TRUE(db->ingest(batch)) << db->error();
  ASSERT_TRUE(db->finish_run(live_run, RunStatus::finished, ""));
  check_band(*db, live_truth, live_run, RankMetric::busy, 0, kStepEnd, {}, 5, 600);
}

TEST(HistoryDb, AllRanksQueryReadsFewRows) {
  // 1,024 ranks × 1,024 steps into 16 buckets: one row per 64-step block, not one per rank; and with
  // 1,024 buckets, one row per step.
  ScratchFiles dir;
  auto db = open_db(dir.file("h.sqlite"));
  const int64_t run = db->begin_run({.name = "big", .world_size = 1024});
  std::mt19937_64 rng(5);
  for (int64_t s = 0; s < 1024; ++s) {
    RecordBatch batch;
    for (int32_t r = 0; r < 1024; ++r) batch.rank_steps.push_back(make_record(run, s, r, rng));
    ASSERT_TRUE(db->ingest(batch)) << db->error();
  }
  ASSERT_TRUE(db->finish_run(run, RunStatus::finished, ""));
  BandResult res;
  ASSERT_TRUE(db->query_band({.run_id = run, .max_buckets = 16}, &res)) << db->error();
  EXPECT_EQ(res.bucket_steps, 64);
  ASSERT_EQ(res.buckets.size(), 16u);
  EXPECT_EQ(res.buckets[0].count, 64 * 1024);
  EXPECT_LE(res.rows_read, 16);
  ASSERT_TRUE(db->query_band({.run_id = run, .max_buckets = 1024}, &res)) << db->error();
  EXPECT_EQ(res.bucket_steps, 1);
  ASSERT_EQ(res.buckets.size(), 1024u);
  EXPECT_EQ(res.buckets[7].count, 1024);
  EXPECT_LE(res.rows_read, 1024);
}

TEST(HistoryDb, SeriesPerRankMatchesSingleRankBands) {
  ScratchFiles dir;
  auto db = open_db(dir.file("h.sqlite"));
  const int64_t run = db->begin_run({.name = "s", .world_size = 20});
  std::mt19937_64 rng(6);
  Truth truth;
  for (int64_t s = 0; s < 900; ++s) {
    RecordBatch batch;
    for (int32_t r = 0; r < 20; ++r) {
      batch.rank_steps.push_back(make_record(run, s, r, rng));
      truth.add(batch.rank_steps.back());
    }
    ASSERT_TRUE(db->ingest(batch));
  }
  SeriesResult series;
  ASSERT_TRUE(db->query_series({.run_id = run,
                                .metric = RankMetric::forward,
                                .step_begin = 5,
                                .step_end = 880,
                                .ranks = {19, 3, 7, 3},
                                .max_buckets = 50},
                               &series))
      << db->error();
  ASSERT_EQ(series.ranks.size(), 3u);
  EXPECT_EQ(series.bucket_steps, 32);
  for (const RankSeries& rs : series.ranks) {
    const std::vector<Bucket> want = truth.band(RankMetric::forward, 0, 896, 32, {rs.rank});
    expect_same_buckets(rs.buckets, want, "rank " + std::to_string(rs.rank));
  }
  EXPECT_FALSE(db->query_series({.run_id = run, .ranks = {20}}, &series));
  EXPECT_NE(db->error().find("ranks must be in 0..19"), std::string::npos);
}

// The heatmap's cells: each is the band of its row's ranks over its column's steps (max, the rank of the max,
// mean), whether read from 64-step tiles, per-step tiles or the frames of a live run's newest steps; a page
// asked for with an explicit end keeps that page's column width where the run has not reached its end.
TEST(HistoryDb, HeatmapCellsAreTheBandsOfTheirRanksAndSteps) {
  ScratchFiles dir;
  auto db = open_db(dir.file("h.sqlite"));
  const int32_t world = 100;
  const int64_t run = db->begin_run({.name = "heat", .world_size = world});
  std::mt19937_64 rng(14);
  Truth truth;
  for (int64_t s = 0; s < 700; ++s) {
    RecordBatch batch;
    for (int32_t r = 0; r < world; ++r) {
      if (r == 37 && s % 5 == 0) continue;  // a rank that misses steps: its cells still hold the others
      batch.rank_steps.push_back(make_record(run, s, r, rng));
      truth.add(batch.rank_steps.back());
    }
    ASSERT_TRUE(db->ingest(batch)) << db->error();
  }
  struct Case {
    int64_t begin, end;
    int32_t buckets, rank_rows;
  };
  for (const Case& c : {Case{0, kStepEnd, 40, 10}, Case{0, kStepEnd, 1000, 100}, Case{128, 1152, 8, 3},
                        Case{690, 700, 10, 1}, Case{3, 300, 50, 64}}) {
    HeatmapResult h;
    ASSERT_TRUE(db->query_heatmap({.run_id = run,
                                   .metric = RankMetric::busy,
                                   .step_begin = c.begin,
                                   .step_end = c.end,
                                   .max_buckets = c.buckets,
                                   .max_rank_rows = c.rank_rows},
                                  &h))
        << db->error();
    const std::string what = "steps " + std::to_string(c.begin) + ".." + std::to_string(c.end) + " in " +
                             std::to_string(c.buckets) + " × " + std::to_string(c.rank_rows);
    const int64_t range = (c.end == kStepEnd ? 700 : c.end) - c.begin;
    EXPECT_GE(h.bucket_steps * c.buckets, range) << what;
    EXPECT_LT(h.bucket_steps / 2 * c.buckets, range) << what;
    EXPECT_LE(h.rows, c.rank_rows) << what;
    EXPECT_EQ(h.rows, (world + h.ranks_per_row - 1) / h.ranks_per_row) << what;
    EXPECT_EQ(h.first_step % h.bucket_steps, 0) << what;
    EXPECT_EQ(h.last_step, 699);
    ASSERT_EQ(h.max.size(), static_cast<size_t>(h.rows) * static_cast<size_t>(h.cols)) << what;
    for (int32_t row = 0; row < h.rows; ++row) {
      std::vector<int32_t> ranks;
      for (int32_t r = row * h.ranks_per_row; r < std::min(world, (row + 1) * h.ranks_per_row); ++r)
        ranks.push_back(r);
      const int64_t end = h.first_step + h.cols * h.bucket_steps;
      const std::vector<Bucket> want = truth.band(RankMetric::busy, h.first_step, end, h.bucket_steps, ranks);
      size_t k = 0;
      for (int32_t col = 0; col < h.cols; ++col) {
        const size_t i = static_cast<size_t>(row) * static_cast<size_t>(h.cols) + static_cast<size_t>(col);
        const int64_t step = h.first_step + col * h.bucket_steps;
        if (k < want.size() && want[k].step_begin == step) {
          EXPECT_FLOAT_EQ(h.max[i], static_cast<float>(want[k].max))
              << what << " row " << row << " col " << col;
          EXPECT_FLOAT_EQ(h.min[i], static_cast<float>(want[k].min))
              << what << " row " << row << " col " << col;
          EXPECT_EQ(h.max_rank[i], want[k].max_rank) << what << " row " << row << " col " << col;
          EXPECT_NEAR(h.mean[i], want[k].mean, 1e-5) << what << " row " << row << " col " << col;
          ++k;
        } else {
          EXPECT_TRUE(std::isnan(h.max[i])) << what << " row " << row << " col " << col;
          EXPECT_EQ(h.max_rank[i], -1);
        }
      }
      EXPECT_EQ(k, want.size()) << what << " row " << row;
    }
  }
  // A page past the run's end keeps its column width (1,024 steps in 8 columns: 128 steps each).
  HeatmapResult page;
  ASSERT_TRUE(
      db->query_heatmap({.run_id = run, .step_begin = 512, .step_end = 1536, .max_buckets = 8}, &page));
  EXPECT_EQ(page.bucket_steps, 128);
  EXPECT_EQ(page.cols, 2);  // steps 512..767: the run has reached 699
  // Refused: a metric the tiles do not keep, and sizes out of range, each named.
  HeatmapResult h;
  EXPECT_FALSE(db->query_heatmap({.run_id = run, .metric = RankMetric::tokens}, &h));
  EXPECT_NE(db->error().find("not tiled"), std::string::npos) << db->error();
  EXPECT_FALSE(db->query_heatmap({.run_id = run, .max_buckets = 0}, &h));
  EXPECT_NE(db->error().find("max_buckets must be in 1..100000"), std::string::npos) << db->error();
  EXPECT_FALSE(db->query_heatmap({.run_id = run, .max_rank_rows = 5000}, &h));
  EXPECT_NE(db->error().find("max_rank_rows must be in 1..4096"), std::string::npos) << db->error();
}

// The heatmap of a big run reads tiles, not rows: 1,024 ranks × 2,048 steps in 32 × 128 cells reads a
// few hundred tile rows (8 ranks a cell, 64 steps a column), where the frames are 262,144 rows.
TEST(HistoryDb, HeatmapCostFollowsTheCells) {
  ScratchFiles dir;
  auto db = open_db(dir.file("h.sqlite"));
  const int64_t run = db->begin_run({.name = "big", .world_size = 1024});
  std::mt19937_64 rng(15);
  for (int64_t s = 0; s < 2048; ++s) {
    RecordBatch batch;
    for (int32_t r = 0; r < 1024; ++r) batch.rank_steps.push_back(make_record(run, s, r, rng));
    ASSERT_TRUE(db->ingest(batch)) << db->error();
  }
  ASSERT_TRUE(db->finish_run(run, RunStatus::finished, ""));
  HeatmapResult h;
  ASSERT_TRUE(db->query_heatmap({.run_id = run, .max_buckets = 32, .max_rank_rows = 128}, &h)) << db->error();
  EXPECT_EQ(h.cols, 32);
  EXPECT_EQ(h.rows, 128);
  EXPECT_EQ(h.ranks_per_row, 8);
  EXPECT_LE(h.rows_read, 32 * 16);  // 32 blocks × 16 rows of 64 ranks (cells of 8)
  for (float v : h.max) EXPECT_FALSE(std::isnan(v));
}

TEST(HistoryDb, LateAndReplacedRecordsRebuildTheirTiles) {
  ScratchFiles dir;
  auto db = open_db(dir.file("h.sqlite"));
  const int64_t run = db->begin_run({.name = "late", .world_size = 70});
  std::mt19937_64 rng(7);
  Truth truth;
  std::vector<RankStepRecord> held_back;
  for (int64_t s = 0; s < 400; ++s) {
    RecordBatch batch;
    for (int32_t r = 0; r < 70; ++r) {
      RankStepRecord x = make_record(run, s, r, rng);
      truth.add(x);
      // Rank 66 of every 10th step arrives 200 steps late, long after its blocks were tiled.
      if (r == 66 && s % 10 == 0)
        held_back.push_back(x);
      else
        batch.rank_steps.push_back(x);
    }
    ASSERT_TRUE(db->ingest(batch)) << db->error();
  }
  RecordBatch late;
  late.rank_steps = held_back;
  // A replacement: step 123 of rank 5 was re-measured (say, replayed after a recovery) much slower.
  RankStepRecord slow = truth.records.at({123, 5});
  slow.total_s = 99.0;
  late.rank_steps.push_back(slow);
  truth.add(slow);
  ASSERT_TRUE(db->ingest(late)) << db->error();
  check_battery(*db, truth, run, 70, 400, 399, rng);
  BandResult res;
  ASSERT_TRUE(db->query_band({.run_id = run, .max_buckets = 1}, &res));
  ASSERT_EQ(res.buckets.size(), 1u);
  EXPECT_EQ(res.buckets[0].max, 99.0);
  EXPECT_EQ(res.buckets[0].max_rank, 5);
  EXPECT_EQ(res.buckets[0].count, 400 * 70);
}

TEST(HistoryDb, BatchIsAllOrNothing) {
  ScratchFiles dir;
  auto db = open_db(dir.file("h.sqlite"));
  const int64_t run = db->begin_run({.name = "x", .world_size = 4});
  std::mt19937_64 rng(8);
  RecordBatch batch;
  batch.rank_steps.push_back(make_record(run, 0, 0, rng));
  batch.steps.push_back({.run_id = run, .step = 0});
  batch.events.push_back({.run_id = run, .kind = "pause"});
  batch.rank_steps.push_back(make_record(run, 0, 4, rng));  // outside the world of 4
  EXPECT_FALSE(db->ingest(batch));
  EXPECT_NE(db->error().find("rank 4 is outside run"), std::string::npos) << db->error();
  std::vector<StepRecord> steps;
  std::vector<EventRow> events;
  std::vector<RankStepRecord> rs;
  ASSERT_TRUE(db->read_steps(run, 0, kStepEnd, 100, &steps));
  ASSERT_TRUE(db->read_events(run, 0, 100, &events));
  ASSERT_TRUE(db->read_rank_steps(run, 0, kStepEnd, {}, 100, &rs));
  EXPECT_TRUE(steps.empty());
  EXPECT_TRUE(events.empty());
  EXPECT_TRUE(rs.empty());
  batch.rank_steps.pop_back();
  batch.events[0].run_id = run + 100;
  EXPECT_FALSE(db->ingest(batch));
  EXPECT_NE(db->error().find("does not exist"), std::string::npos);
  batch.events[0].run_id = run;
  EXPECT_TRUE(db->ingest(batch)) << db->error();
}

TEST(HistoryDb, RecordsStepsEventsRoundTrip) {
  ScratchFiles dir;
  auto db = open_db(dir.file("h.sqlite"));
  const int64_t run = db->begin_run({.name = "rt", .world_size = 16});
  std::mt19937_64 rng(9);
  RecordBatch batch;
  for (int32_t r = 0; r < 16; r += 3) {
    RankStepRecord x = make_record(run, 5, r, rng);
    x.temperature_celsius = 64.5;
    x.sm_clock_hertz = 1.98e9;
    batch.rank_steps.push_back(x);
  }
  StepRecord s{.run_id = run,
               .step = 5,
               .time_unix_s = 1.8e9,
               .loss = NAN,
               .grad_norm = 1.5,
               .lr = 3e-4,
               .tokens_per_s = 1e6,
               .step_s = 0.5,
               .mfu = 0.4,
               .hfu = 0.5};
  batch.steps.push_back(s);
  s.step = 6;
  s.loss = 2.5;
  s.val_loss = 2.75;
  s.mfu.reset();  // no peak known: stored as NULL, read back absent (never 0)
  s.hfu.reset();
  batch.steps.push_back(s);
  batch.events.push_back({.run_id = run,
                          .time_unix_s = 1.8e9,
                          .step = 5,
                          .kind = "straggler",
                          .rank = 3,
                          .node = "node-0",
                          .message = "rank 3 slow",
                          .payload = R"({"phase":"forward"})"});
  batch.events.push_back({.run_id = run, .time_unix_s = 1.8e9 + 1, .kind = "pause"});
  ASSERT_TRUE(db->ingest(batch)) << db->error();

  std::vector<RankStepRecord> rs;
  ASSERT_TRUE(db->read_rank_steps(run, 0, 100, {}, 100, &rs)) << db->error();
  ASSERT_EQ(rs.size(), batch.rank_steps.size());
  for (size_t i = 0; i < rs.size(); ++i) EXPECT_EQ(rs[i], batch.rank_steps[i]) << "rank " << rs[i].rank;
  ASSERT_TRUE(db->read_rank_steps(run, 0, 100, {9, 10}, 100, &rs));
  ASSERT_EQ(rs.size(), 1u);
  EXPECT_EQ(rs[0].rank, 9);
  EXPECT_EQ(rs[0].host, "node-1");

  std::vector<StepRecord> steps;
  ASSERT_TRUE(db->read_steps(run, 0, kStepEnd, 10, &steps));
  ASSERT_EQ(steps.size(), 2u);
  EXPECT_EQ(steps[0], batch.steps[0]);  // NaN loss came back as NaN
  EXPECT_EQ(steps[1], batch.steps[1]);
  EXPECT_FALSE(steps[1].mfu.has_value());
  EXPECT_EQ(steps[0].mfu.value_or(-1), 0.4);

  std::vector<EventRow> events;
  ASSERT_TRUE(db->read_events(run, 0, 10, &events));
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(events[0].event, batch.events[0]);
  EXPECT_EQ(events[1].event, batch.events[1]);
  ASSERT_TRUE(db->read_events(run, events[0].id, 10, &events));
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].event.kind, "pause");

  BandResult band;
  ASSERT_TRUE(db->query_step_band(run, StepMetric::loss, 0, kStepEnd, 10, &band)) << db->error();
  ASSERT_EQ(band.buckets.size(), 1u) << "the NaN loss is left out";
  EXPECT_EQ(band.buckets[0].max, 2.5);
  ASSERT_TRUE(db->query_band({.run_id = run, .metric = RankMetric::sm_clock}, &band));
  ASSERT_EQ(band.buckets.size(), 1u);
  EXPECT_EQ(band.buckets[0].count, 6);
  EXPECT_EQ(band.buckets[0].max, 1.98e9);
}

TEST(HistoryDb, StepBandDecimatesInOnePass) {
  ScratchFiles dir;
  auto db = open_db(dir.file("h.sqlite"));
  const int64_t run = db->begin_run({.name = "steps", .world_size = 1});
  RecordBatch batch;
  for (int64_t s = 0; s < 10000; ++s) {
    batch.steps.push_back({.run_id = run,
                           .step = s,
                           .loss = 10.0 - 0.001 * static_cast<double>(s),
                           .mfu = s == 4321 ? 0.9 : 0.4});
  }
  ASSERT_TRUE(db->ingest(batch));
  BandResult band;
  ASSERT_TRUE(db->query_step_band(run, StepMetric::mfu, 0, kStepEnd, 100, &band)) << db->error();
  EXPECT_EQ(band.bucket_steps, 128);
  EXPECT_EQ(band.buckets.size(), 79u);
  const Bucket& b = band.buckets[4321 / 128];
  EXPECT_EQ(b.max, 0.9);
  EXPECT_EQ(b.min, 0.4);
  ASSERT_TRUE(db->query_step_band(run, StepMetric::loss, 1000, 1010, 100, &band));
  ASSERT_EQ(band.buckets.size(), 10u);
  EXPECT_EQ(band.buckets[3].last, 10.0 - 0.001 * 1003);
}

TEST(HistoryDb, DownsamplingKeepsCoarseAnswers) {
  ScratchFiles dir;
  auto db = open_db(dir.file("h.sqlite"));
  const int64_t run = db->begin_run({.name = "ds", .world_size = 90});
  std::mt19937_64 rng(10);
  Truth truth;
  for (int64_t s = 0; s < 1000; ++s) {
    RecordBatch batch;
    for (int32_t r = 0; r < 90; ++r) {
      batch.rank_steps.push_back(make_record(run, s, r, rng));
      truth.add(batch.rank_steps.back());
    }
    ASSERT_TRUE(db->ingest(batch));
  }
  EXPECT_EQ(db->downsample_rank_steps(run, 700), 640) << db->error();  // rounded down to 64 steps
  RunRow row;
  ASSERT_TRUE(db->get_run(run, &row));
  EXPECT_EQ(row.raw_from_step, 640);
  std::vector<RankStepRecord> rs;
  ASSERT_TRUE(db->read_rank_steps(run, 0, 640, {}, 10, &rs));
  EXPECT_TRUE(rs.empty());
  ASSERT_TRUE(db->read_rank_steps(run, 640, 641, {}, 1000, &rs));
  EXPECT_EQ(rs.size(), 90u);
  // Tiled metrics still answer everywhere (at ≥ 64 steps where raw rows are gone); NVML ones only where
  // raw rows remain.
  check_battery(*db, truth, run, 90, 1000, 999, rng, 640);
  RecordBatch late;
  late.rank_steps.push_back(make_record(run, 100, 1, rng));
  EXPECT_FALSE(db->ingest(late));
  EXPECT_NE(db->error().find("downsampled"), std::string::npos);
  EXPECT_EQ(db->downsample_rank_steps(run, 10000), 960) << "never past what is tiled";
  EXPECT_FALSE(db->rewind_run(run, 500));
}

TEST(HistoryDb, RewindForgetsTheFutureAndRebuilds) {
  ScratchFiles dir;
  auto db = open_db(dir.file("h.sqlite"));
  const int64_t run = db->begin_run({.name = "rw", .world_size = 72});
  std::mt19937_64 rng(11);
  Truth truth;
  const auto step = [&](int64_t s) {
    RecordBatch batch;
    for (int32_t r = 0; r < 72; ++r) {
      batch.rank_steps.push_back(make_record(run, s, r, rng));
      truth.add(batch.rank_steps.back());
    }
    batch.steps.push_back({.run_id = run, .step = s});
    batch.events.push_back({.run_id = run, .step = s, .kind = "tick"});
    ASSERT_TRUE(db->ingest(batch)) << db->error();
  };
  for (int64_t s = 0; s < 600; ++s) step(s);
  ASSERT_TRUE(db->finish_run(run, RunStatus::failed, "node lost"));
  // Resume from the checkpoint at step 300: forget 301.., then train on with different numbers.
  ASSERT_TRUE(db->rewind_run(run, 300)) << db->error();
  truth.erase_after(300);
  std::vector<EventRow> events;
  ASSERT_TRUE(db->read_events(run, 0, 10000, &events));
  EXPECT_EQ(events.size(), 600u);  // the log of what happened is kept (the old code forgot steps 301..599's)
  for (int64_t s = 301; s < 500; ++s) step(s);
  check_battery(*db, truth, run, 72, 500, 499, rng);
  RunRow row;
  ASSERT_TRUE(db->get_run(run, &row));
  EXPECT_EQ(row.last_step, 499);
}

TEST(HistoryDb, NodesAndCheckpoints) {
  ScratchFiles dir;
  auto db = open_db(dir.file("h.sqlite"));
  const int64_t run = db->begin_run({.name = "c", .world_size = 8});
  ASSERT_TRUE(db->upsert_node({.host = "gpu-001", .devices = 8, .device_name = "NVIDIA H100 80GB HBM3"}));
  ASSERT_TRUE(db->upsert_node({.host = "gpu-001", .devices = 8, .state = "quarantined"}));
  std::vector<NodeInfo> nodes;
  ASSERT_TRUE(db->list_nodes(&nodes));
  ASSERT_EQ(nodes.size(), 1u);
  EXPECT_EQ(nodes[0].state, "quarantined");
  ASSERT_TRUE(
      db->record_checkpoint({.run_id = run, .step = 100, .path = "ckpt/step_100", .state = "writing"}));
  ASSERT_TRUE(db->record_checkpoint(
      {.run_id = run, .step = 100, .path = "ckpt/step_100", .bytes = 1500000000, .write_s = 3.5}));
  ASSERT_TRUE(
      db->record_checkpoint({.run_id = run, .step = 200, .path = "ckpt/step_200", .state = "corrupt"}));
  EXPECT_FALSE(db->record_checkpoint({.run_id = run + 1, .step = 1, .path = "x"}));
  std::vector<CheckpointInfo> cks;
  ASSERT_TRUE(db->list_checkpoints(run, &cks));
  ASSERT_EQ(cks.size(), 2u);
  EXPECT_EQ(cks[0].state, "committed");
  EXPECT_EQ(cks[0].bytes, 1500000000u);
  EXPECT_EQ(cks[0].write_s, 3.5);
  EXPECT_EQ(cks[1].state, "corrupt");
}

// The typed checkpoint record enters the catalog through ingest, with the run's event made from it; a
// failure of a step never replaces that step's committed checkpoint.
TEST(HistoryDb, IngestCataloguesCheckpointRecords) {
  ScratchFiles dir;
  auto db = open_db(dir.file("h.sqlite"));
  const int64_t run = db->begin_run({.name = "c", .world_size = 4});
  CheckpointRecord c{.run_id = run,
                     .step = 100,
                     .time_unix_s = 1.8e9,
                     .rank = kCheckpointAllRanks,
                     .host = "gpu-001",
                     .dir = "ckpt/step_00000100",
                     .state = CheckpointState::kCommitted,
                     .bytes = 1500000000,
                     .shards = 4,
                     .write_s = 3.5,
                     .stall_s = 0.5,
                     .manifest_xxh64 = "0123456789abcdef"};
  RecordBatch b;
  b.checkpoints.push_back(c);
  CheckpointRecord failed{.run_id = run,
                          .step = 100,
                          .time_unix_s = 1.8e9 + 5,
                          .rank = 2,
                          .host = "gpu-001",
                          .dir = "ckpt/step_00000100",
                          .state = CheckpointState::kFailed,
                          .write_s = 0.25,
                          .stall_s = 0.25,
                          .message = "rank 2: disk full"};
  b.checkpoints.push_back(failed);  // a second write of step 100 failed: the first one is still whole
  failed.step = 200;
  failed.dir = "ckpt/step_00000200";
  b.checkpoints.push_back(failed);
  CheckpointRecord written = c;  // a rank's shard: an event, not a catalog entry
  written.step = 300;
  written.rank = 1;
  written.state = CheckpointState::kWritten;
  b.checkpoints.push_back(written);
  ASSERT_TRUE(db->ingest(b)) << db->error();

  std::vector<CheckpointInfo> cks;
  ASSERT_TRUE(db->list_checkpoints(run, &cks));
  ASSERT_EQ(cks.size(), 2u);
  EXPECT_EQ(cks[0].step, 100);
  EXPECT_EQ(cks[0].state, "committed");
  EXPECT_EQ(cks[0].path, "ckpt/step_00000100");
  EXPECT_EQ(cks[0].bytes, 1500000000u);
  EXPECT_EQ(cks[0].write_s, 3.5);
  EXPECT_EQ(cks[0].stall_s.value_or(-1), 0.5);
  EXPECT_EQ(cks[0].shards.value_or(-1), 4);
  EXPECT_EQ(cks[0].manifest_xxh64, "0123456789abcdef");
  EXPECT_EQ(cks[0].time_unix_s, 1.8e9);
  EXPECT_EQ(cks[1].step, 200);
  EXPECT_EQ(cks[1].state, "failed");
  EXPECT_EQ(cks[1].message, "rank 2: disk full");
  EXPECT_FALSE(cks[1].shards.has_value());  // 0 in the record: not known

  std::vector<EventRow> events;
  ASSERT_TRUE(db->read_events(run, 0, 100, &events));
  ASSERT_EQ(events.size(), 4u);
  EXPECT_EQ(events[0].event.kind, "checkpoint");
  EXPECT_EQ(events[0].event, checkpoint_event(c));
  EXPECT_EQ(events[1].event.kind, "checkpoint_failed");
  EXPECT_EQ(events[3].event.kind, "checkpoint_written");

  // A checkpoint of a run that does not exist makes the batch fail whole.
  RecordBatch stray;
  stray.checkpoints.push_back(c);
  stray.checkpoints.back().run_id = run + 1;
  EXPECT_FALSE(db->ingest(stray));
  // A later commit of the failed step replaces the failure.
  RecordBatch again;
  again.checkpoints.push_back(c);
  again.checkpoints.back().step = 200;
  ASSERT_TRUE(db->ingest(again)) << db->error();
  ASSERT_TRUE(db->list_checkpoints(run, &cks));
  EXPECT_EQ(cks[1].state, "committed");
  EXPECT_EQ(cks[1].message, "");
}

TEST(HistoryDb, ReadOnlyReaderSeesTheWritersCommits) {
  ScratchFiles dir;
  auto writer = open_db(dir.file("h.sqlite"));
  const int64_t run = writer->begin_run({.name = "shared", .world_size = 2});
  auto reader = open_db(dir.file("h.sqlite"), {.read_only = true});
  ASSERT_NE(reader, nullptr);
  std::mt19937_64 rng(12);
  for (int64_t s = 0; s < 50; ++s) {
    RecordBatch b;
    b.rank_steps = {make_record(run, s, 0, rng), make_record(run, s, 1, rng)};
    ASSERT_TRUE(writer->ingest(b));
    BandResult band;
    ASSERT_TRUE(reader->query_band({.run_id = run, .max_buckets = 1000}, &band)) << reader->error();
    ASSERT_EQ(band.buckets.size(), static_cast<size_t>(s + 1));
  }
  EXPECT_EQ(reader->begin_run({.name = "no"}), -1);
  EXPECT_NE(reader->error().find("read-only"), std::string::npos);
}

TEST(HistoryDb, RefusesForeignAndNewerFiles) {
  ScratchFiles dir;
  std::string error;
  sqlite3* raw = nullptr;
  ASSERT_EQ(sqlite3_open(dir.file("other.sqlite").c_str(), &raw), SQLITE_OK);
  sqlite3_exec(raw, "CREATE TABLE t (x)", nullptr, nullptr, nullptr);
  sqlite3_close(raw);
  EXPECT_EQ(HistoryDb::open(dir.file("other.sqlite"), {}, &error), nullptr);
  EXPECT_NE(error.find("not a Gantry history database"), std::string::npos) << error;

  { auto db = open_db(dir.file("h.sqlite")); }
  ASSERT_EQ(sqlite3_open(dir.file("h.sqlite").c_str(), &raw), SQLITE_OK);
  sqlite3_exec(raw, ("PRAGMA user_version = " + std::to_string(schema_latest_version() + 1)).c_str(), nullptr,
               nullptr, nullptr);
  sqlite3_close(raw);
  EXPECT_EQ(HistoryDb::open(dir.file("h.sqlite"), {}, &error), nullptr);
  EXPECT_NE(error.find("newer than this build"), std::string::npos) << error;

  EXPECT_EQ(HistoryDb::open(dir.file("missing/nowhere.sqlite"), {}, &error), nullptr);
  EXPECT_EQ(HistoryDb::open(dir.file("absent.sqlite"), {.read_only = true}, &error), nullptr);
}

TEST(HistoryDb, QueryArgumentErrors) {
  ScratchFiles dir;
  auto db = open_db(dir.file("h.sqlite"));
  const int64_t run = db->begin_run({.name = "q", .world_size = 4});
  BandResult band;
  EXPECT_FALSE(db->query_band({.run_id = run, .max_buckets = 0}, &band));
  EXPECT_NE(db->error().find("max_buckets"), std::string::npos);
  EXPECT_FALSE(db->query_band({.run_id = run, .ranks = {-1}}, &band));
  EXPECT_FALSE(db->query_band({.run_id = run + 1}, &band));
  ASSERT_TRUE(db->query_band({.run_id = run}, &band)) << "an empty run has an empty band";
  EXPECT_TRUE(band.buckets.empty());
  RankMetric m;
  ASSERT_TRUE(rank_metric_from_name("comm_exposed_s", &m));
  EXPECT_EQ(m, RankMetric::comm_exposed);
  EXPECT_FALSE(rank_metric_from_name("comm", &m));
}

}  // namespace
}  // namespace gantry
