// The tile pyramid (storage/pack.h), the decimated queries that read it, and retention (downsampling,
// rewinding), which must keep it consistent with the rows.
//
// Building: when steps become final (the run has moved rollup_lag_steps past them), finalize() builds
// their per-step tiles (step level 0, rank levels ≥ 2) from the frames, and the tiles of every block
// that just closed: level 1 (64 steps) from the frames, level ℓ ≥ 2 from level ℓ−1's per-rank rows;
// each level's rank-aggregate rows by folding its per-rank rows 8 to 1. All in the ingest transaction.
//
// Reading: a query's bucket width w is a power of two; it reads the coarsest step level whose block
// divides w, decomposes its rank set into the largest aligned spans it fully contains (so "all 1,024
// ranks" is one row per block), and finishes the range's newest part, where blocks are not final yet,
// from finer levels and then the frames.
#include <sqlite3.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <map>

#include "storage/history_db.h"
#include "storage/history_db_impl.h"
#include "storage/pack.h"

namespace gantry {

using pack::CellMetric;
using pack::kGroupRanks;
using pack::kStepBlock;
using pack::kStepLevels;
using pack::TileRow;

namespace {

using RowMap = std::map<int64_t, TileRow>;  // rblock → row; ordered, so rows are written in key order

// Rows of rank level m−1 folded into rows of level m: cell c of parent row q aggregates child row q·8+c.
RowMap fold_ranks(const RowMap& child) {
  RowMap parent;
  for (const auto& [q, row] : child) {
    TileRow& p = parent[q >> 3];
    const int slot = static_cast<int>(q & 7);
    for (int c = 0; c < kGroupRanks; ++c) {
      if (row.mask & (1u << c)) p.cells[slot].merge(row.cells[c]);
    }
    p.mask |= static_cast<uint8_t>(1u << slot);
  }
  return parent;
}

bool write_rows(const Stmt& put, int64_t run, int level, int64_t block, const RowMap& rows,
                std::string* blob) {
  for (const auto& [q, row] : rows) {
    pack::tile_encode(row, blob);
    StmtUse st(put);
    sqlite3_bind_int64(*st, 1, pack::tile_key(run, level, block, q));
    sqlite3_bind_int64(*st, 2, run);
    sqlite3_bind_int(*st, 3, level);
    sqlite3_bind_int64(*st, 4, block);
    sqlite3_bind_int64(*st, 5, q);
    sqlite3_bind_blob(*st, 6, blob->data(), static_cast<int>(blob->size()), SQLITE_STATIC);
    if (sqlite3_step(*st) != SQLITE_DONE) return false;
  }
  return true;
}

// Groups sorted, unique values into runs of consecutive ones: [first, last + 1).
std::vector<std::pair<int64_t, int64_t>> ranges_of(std::vector<int64_t> v) {
  std::sort(v.begin(), v.end());
  v.erase(std::unique(v.begin(), v.end()), v.end());
  std::vector<std::pair<int64_t, int64_t>> out;
  for (int64_t x : v) {
    if (!out.empty() && out.back().second == x)
      out.back().second = x + 1;
    else
      out.emplace_back(x, x + 1);
  }
  return out;
}

int64_t align_up(int64_t x, int64_t b) {
  return (x + b - 1) / b * b;
}

// A read transaction for the duration of a query, so that all its SELECTs see one snapshot (a writer
// committing mid-query cannot make it count a step twice or miss one).
class ReadTxn {
 public:
  explicit ReadTxn(sqlite3* db) : db_(db), open_(sqlite3_get_autocommit(db) != 0) {
    if (open_) open_ = sqlite3_exec(db_, "BEGIN", nullptr, nullptr, nullptr) == SQLITE_OK;
  }
  ~ReadTxn() {
    if (open_) sqlite3_exec(db_, "COMMIT", nullptr, nullptr, nullptr);
  }
  ReadTxn(const ReadTxn&) = delete;
  ReadTxn& operator=(const ReadTxn&) = delete;

 private:
  sqlite3* db_;
  bool open_;
};

// Per-bucket accumulation of cells (the band), in the order they come.
struct Acc {
  int64_t count = 0;
  double min = std::numeric_limits<double>::infinity();
  double max = -std::numeric_limits<double>::infinity();
  int32_t max_rank = -1;
  double sum = 0;
  int64_t last_step = std::numeric_limits<int64_t>::min();
  int64_t last_count = 0;
  double last_sum = 0;

  void add(const CellMetric& c) {
    if (c.count == 0) return;
    count += c.count;
    min = std::min(min, c.agg.min);
    if (c.agg.max > max || (c.agg.max == max && c.agg.max_rank < max_rank)) {
      max = c.agg.max;
      max_rank = c.agg.max_rank;
    }
    sum += c.agg.sum;
    if (c.last_step > last_step) {
      last_step = c.last_step;
      last_count = c.last_count;
      last_sum = c.agg.last_sum;
    } else if (c.last_step == last_step) {
      last_count += c.last_count;
      last_sum += c.agg.last_sum;
    }
  }
};

void emit(const std::vector<Acc>& acc, int64_t first, int64_t w, std::vector<Bucket>* out) {
  out->clear();
  for (size_t k = 0; k < acc.size(); ++k) {
    const Acc& a = acc[k];
    if (a.count == 0) continue;
    Bucket& b = out->emplace_back();
    b.step_begin = first + static_cast<int64_t>(k) * w;
    b.step_end = b.step_begin + w;
    b.count = a.count;
    b.min = a.min;
    b.max = a.max;
    b.max_rank = a.max_rank;
    b.mean = a.sum / static_cast<double>(a.count);
    b.last = a.last_count ? a.last_sum / static_cast<double>(a.last_count) : 0;
    b.last_step = a.last_step;
  }
}

struct PlanRow {
  int m;
  int64_t q;
  uint8_t mask;
};

// The rank set as aligned cells: a cell of 8^m ranks is taken whole when the set contains all of it (and
// level m is readable: m = 0 always, else m ≥ min_tile_m), otherwise split into its 8 children.
// No cell above level max_m is taken (the heatmap's rows: a cell must not straddle two of them).
void decompose(int m, int64_t q, int32_t world, const std::vector<int32_t>& ranks, int min_tile_m,
               std::vector<PlanRow>* out, int max_m = std::numeric_limits<int>::max()) {
  uint8_t take = 0;
  const int64_t span = pack::rank_span(m);
  for (int c = 0; c < kGroupRanks; ++c) {
    const int64_t lo = (q * kGroupRanks + c) * span;
    if (lo >= world) break;
    const int64_t hi = std::min<int64_t>(lo + span, world);
    const int64_t in = ranks.empty() ? hi - lo
                                     : std::lower_bound(ranks.begin(), ranks.end(), hi) -
                                           std::lower_bound(ranks.begin(), ranks.end(), lo);
    if (in == 0) continue;
    if (in == hi - lo && (m == 0 || m >= min_tile_m) && m <= max_m) {
      take |= static_cast<uint8_t>(1u << c);
    } else {
      decompose(m - 1, q * kGroupRanks + c, world, ranks, min_tile_m, out, max_m);
    }
  }
  if (take) out->push_back({m, q, take});
}

}  // namespace

// ---- building ----

bool HistoryDb::build_steps(const RunState& run, int64_t step_begin, int64_t step_end) {
  if (run.top_m < 2 || step_begin >= step_end) return true;  // no per-step tiles below 64 ranks
  StmtUse st(st_->frames_range);
  sqlite3_bind_int64(*st, 1, run.id);
  sqlite3_bind_int64(*st, 2, step_begin);
  sqlite3_bind_int64(*st, 3, step_end);
  RowMap rows;  // rank level 1: cell = one frame
  int64_t step = -1;
  std::string blob;
  const auto flush = [&]() {
    RowMap cur = std::move(rows);
    rows.clear();
    for (int m = 2; m <= run.top_m; ++m) {
      cur = fold_ranks(cur);
      if (!write_rows(st_->tile_put, run.id, pack::tile_level(0, m), step, cur, &blob)) return false;
    }
    return true;
  };
  pack::Frame f;
  int rc = SQLITE_DONE;
  while ((rc = sqlite3_step(*st)) == SQLITE_ROW) {
    const int64_t s = sqlite3_column_int64(*st, 0);
    if (s != step && !rows.empty() && !flush()) return fail_sqlite("writing per-step tiles");
    step = s;
    const int64_t grp = sqlite3_column_int64(*st, 1);
    if (!pack::frame_decode(sqlite3_column_blob(*st, 2), static_cast<size_t>(sqlite3_column_bytes(*st, 2)),
                            &f)) {
      return fail("corrupt rank_steps row (run " + std::to_string(run.id) + ", step " + std::to_string(s) +
                  ")");
    }
    TileRow& row = rows[grp >> 3];
    pack::Cell& cell = row.cells[grp & 7];
    row.mask |= static_cast<uint8_t>(1u << (grp & 7));
    for (int k = 0; k < kGroupRanks; ++k) {
      if (f.mask & (1u << k)) cell.add(f.ranks[k], static_cast<int32_t>(grp * kGroupRanks + k), s);
    }
  }
  if (rc != SQLITE_DONE) return fail_sqlite("reading rank steps for tiles");
  if (!rows.empty() && !flush()) return fail_sqlite("writing per-step tiles");
  return true;
}

bool HistoryDb::build_blocks(const RunState& run, int step_level, int64_t block_begin, int64_t block_end) {
  if (block_begin >= block_end) return true;
  const int64_t size = kStepBlock[step_level];
  const int64_t ratio = size / kStepBlock[step_level - 1];  // children per block
  RowMap rows;                                              // rank level 0 of the block being built
  int64_t block = -1;
  std::string blob;
  const auto flush = [&]() {
    RowMap cur = std::move(rows);
    rows.clear();
    for (int m = 0; m <= run.top_m; ++m) {
      if (m > 0) cur = fold_ranks(cur);
      if (!write_rows(st_->tile_put, run.id, pack::tile_level(step_level, m), block, cur, &blob))
        return false;
    }
    return true;
  };
  // Children: the frames for level 1, else the per-rank rows (m = 0) of the level below.
  const bool from_frames = step_level == 1;
  StmtUse st(from_frames ? st_->frames_range : st_->tiles_range);
  if (from_frames) {
    sqlite3_bind_int64(*st, 1, run.id);
    sqlite3_bind_int64(*st, 2, block_begin * ratio);
    sqlite3_bind_int64(*st, 3, block_end * ratio);
  } else {
    const int child = pack::tile_level(step_level - 1, 0);
    sqlite3_bind_int64(*st, 1, pack::tile_key(run.id, child, block_begin * ratio, 0));
    sqlite3_bind_int64(*st, 2, pack::tile_key(run.id, child, block_end * ratio, 0));
  }
  pack::Frame f;
  TileRow child;
  int rc = SQLITE_DONE;
  while ((rc = sqlite3_step(*st)) == SQLITE_ROW) {
    const int64_t pos = sqlite3_column_int64(*st, 0);  // a step, or a child block
    const int64_t b = pos / ratio;
    if (b != block && !rows.empty() && !flush()) return fail_sqlite("writing tiles");
    block = b;
    const int64_t q = sqlite3_column_int64(*st, 1);  // a group of 8 ranks either way
    const void* data = sqlite3_column_blob(*st, 2);
    const auto bytes = static_cast<size_t>(sqlite3_column_bytes(*st, 2));
    TileRow& row = rows[q];
    if (from_frames) {
      if (!pack::frame_decode(data, bytes, &f)) {
        return fail("corrupt rank_steps row (run " + std::to_string(run.id) + ", step " +
                    std::to_string(pos) + ")");
      }
      for (int k = 0; k < kGroupRanks; ++k) {
        if (!(f.mask & (1u << k))) continue;
        row.cells[k].add(f.ranks[k], static_cast<int32_t>(q * kGroupRanks + k), pos);
        row.mask |= static_cast<uint8_t>(1u << k);
      }
    } else {
      if (!pack::tile_decode(data, bytes, &child))
        return fail("corrupt tile row (run " + std::to_string(run.id) + ")");
      for (int k = 0; k < kGroupRanks; ++k) {
        if (child.mask & (1u << k)) row.cells[k].merge(child.cells[k]);
      }
      row.mask |= child.mask;
    }
  }
  if (rc != SQLITE_DONE) return fail_sqlite("reading for tiles");
  if (!rows.empty() && !flush()) return fail_sqlite("writing tiles");
  return true;
}

bool HistoryDb::finalize(RunState& run, std::vector<int64_t> late_steps, bool seal) {
  const int64_t last = run.last_step;
  if (last < 0) {
    run.sealed = run.sealed || seal;
    return true;
  }
  const int64_t lag = seal ? 0 : std::max<int64_t>(0, options_.rollup_lag_steps);
  const int64_t old_frontier = run.frontier;
  const int64_t frontier = std::max(old_frontier, last - lag + 1);
  const auto late = ranges_of(std::move(late_steps));

  if (!build_steps(run, old_frontier, frontier)) return false;
  for (const auto& [a, b] : late) {
    if (!build_steps(run, a, std::min(b, old_frontier))) return false;
  }
  // Level by level, so that a block's children are current before it is built from them.
  for (int l = 1; l < kStepLevels; ++l) {
    const int64_t size = kStepBlock[l];
    const int64_t built_before = old_frontier / size;
    const int64_t final_now = seal ? align_up(last + 1, size) / size : frontier / size;
    if (!build_blocks(run, l, built_before, final_now)) return false;
    std::vector<int64_t> late_blocks;
    for (const auto& [a, b] : late) {
      for (int64_t blk = a / size; blk <= (b - 1) / size; ++blk) {
        if (blk < std::min(built_before, final_now)) late_blocks.push_back(blk);
      }
    }
    for (const auto& [a, b] : ranges_of(std::move(late_blocks))) {
      if (!build_blocks(run, l, a, b)) return false;
    }
  }
  run.frontier = frontier;
  run.sealed = run.sealed || seal;
  return true;
}

// ---- reading ----

struct HistoryDb::ScanPlan {
  RankMetric metric = RankMetric::total;
  int64_t first_step = 0;  // bucket-aligned
  int64_t end_step = 0;    // exclusive
  int64_t bucket_steps = 1;
  std::vector<int32_t> ranks;                        // sorted, unique; empty = all
  bool per_rank = false;                             // only single-rank cells (the series query)
  int max_cell_m = std::numeric_limits<int>::max();  // cells of at most 8^max_cell_m ranks (the heatmap)
  // (block's first step, the cell's first rank, the cell's aggregate of the metric)
  std::function<void(int64_t, int32_t, const CellMetric&)> visit;
};

bool HistoryDb::scan(const RunState& run, const ScanPlan& p, int64_t* rows_read) {
  const bool tiled = rank_metric_tiled(p.metric);
  const int metric = static_cast<int>(p.metric);
  const int32_t world = run.world;

  // Visits the rows of one plan at one step level over [step_begin, step_end): each rank level's rows
  // either by one range scan (when the plan wants most rows of that level) or by point lookups.
  const auto read_level = [&](int step_level, const std::vector<PlanRow>& plan, int64_t step_begin,
                              int64_t step_end) -> bool {
    const int64_t size = kStepBlock[step_level];
    const int64_t b0 = step_begin / size, b1 = step_end / size;
    for (int m = 0; m <= run.top_m; ++m) {
      std::vector<std::pair<int64_t, uint8_t>> rows;
      for (const PlanRow& r : plan) {
        if (r.m == m) rows.emplace_back(r.q, r.mask);
      }
      if (rows.empty()) continue;
      std::sort(rows.begin(), rows.end());
      const bool frames = step_level == 0 && m == 0;
      const int level = pack::tile_level(step_level, m);
      const int64_t rows_per_block = (world + pack::rank_span(m + 1) - 1) / pack::rank_span(m + 1);
      const auto visit_blob = [&](int64_t block, int64_t q, uint8_t mask, const void* data, size_t bytes) {
        const int64_t step = block * size;
        if (frames) {
          pack::Frame f;
          if (!pack::frame_decode(data, bytes, &f)) return false;
          for (int k = 0; k < kGroupRanks; ++k) {
            if (!(f.mask & mask & (1u << k))) continue;
            const double v = pack::raw_metric(f.ranks[k], p.metric);
            if (std::isnan(v)) continue;  // an NVML reading not taken
            const int32_t rank = static_cast<int32_t>(q * kGroupRanks + k);
            p.visit(step, rank, CellMetric{1, 1, step, {v, v, v, v, rank}});
          }
          return true;
        }
        return pack::tile_visit(data, bytes, mask, metric, [&](int slot, const CellMetric& c) {
          p.visit(step, static_cast<int32_t>((q * kGroupRanks + slot) * pack::rank_span(m)), c);
        });
      };
      const auto corrupt = [&] {
        return fail("corrupt row in run " + std::to_string(run.id) + "'s history");
      };
      // A seek costs about two steps of a scan: scan when that is cheaper than seeking each wanted row.
      if (rows.size() * 2 >= static_cast<size_t>(rows_per_block)) {
        // Much of the table's rows are wanted: one range scan, skipping the others.
        StmtUse st(frames ? st_->frames_range : st_->tiles_range);
        if (frames) {
          sqlite3_bind_int64(*st, 1, run.id);
          sqlite3_bind_int64(*st, 2, b0);
          sqlite3_bind_int64(*st, 3, b1);
        } else {
          sqlite3_bind_int64(*st, 1, pack::tile_key(run.id, level, b0, 0));
          sqlite3_bind_int64(*st, 2, pack::tile_key(run.id, level, b1, 0));
        }
        int rc = SQLITE_DONE;
        while ((rc = sqlite3_step(*st)) == SQLITE_ROW) {
          ++*rows_read;
          const int64_t q = sqlite3_column_int64(*st, 1);
          auto it = std::lower_bound(rows.begin(), rows.end(), std::make_pair(q, uint8_t{0}));
          if (it == rows.end() || it->first != q) continue;
          if (!visit_blob(sqlite3_column_int64(*st, 0), q, it->second, sqlite3_column_blob(*st, 2),
                          static_cast<size_t>(sqlite3_column_bytes(*st, 2)))) {
            return corrupt();
          }
        }
        if (rc != SQLITE_DONE) return fail_sqlite("querying");
      } else {
        // A few rows per block: point lookups.
        StmtUse st(frames ? st_->frame_get : st_->tile_get);
        for (int64_t block = b0; block < b1; ++block) {
          for (const auto& [q, mask] : rows) {
            sqlite3_reset(*st);
            if (frames) {
              sqlite3_bind_int64(*st, 1, run.id);
              sqlite3_bind_int64(*st, 2, block);
              sqlite3_bind_int64(*st, 3, q);
            } else {
              sqlite3_bind_int64(*st, 1, pack::tile_key(run.id, level, block, q));
            }
            const int rc = sqlite3_step(*st);
            ++*rows_read;
            if (rc == SQLITE_DONE) continue;
            if (rc != SQLITE_ROW) return fail_sqlite("querying");
            if (!visit_blob(block, q, mask, sqlite3_column_blob(*st, 0),
                            static_cast<size_t>(sqlite3_column_bytes(*st, 0)))) {
              return corrupt();
            }
          }
        }
      }
    }
    return true;
  };
  const auto plan_for = [&](int min_tile_m) {
    std::vector<PlanRow> plan;
    decompose(run.top_m, 0, world, p.ranks, p.per_rank ? std::numeric_limits<int>::max() : min_tile_m, &plan,
              p.max_cell_m);
    return plan;
  };

  const int64_t last = run.last_step;
  int64_t x = p.first_step;
  if (tiled) {
    int level = 0;
    while (level + 1 < kStepLevels && kStepBlock[level + 1] <= p.bucket_steps) ++level;
    const std::vector<PlanRow> plan = plan_for(1);
    // Coarsest first; where a level's blocks are not final yet, the next finer level takes over.
    for (int l = level; l >= 1 && x < p.end_step; --l) {
      const int64_t size = kStepBlock[l];
      const int64_t tiled_end = run.sealed ? align_up(last + 1, size) : run.frontier / size * size;
      const int64_t seg_end = std::min(align_up(p.end_step, size), tiled_end);
      if (seg_end > x) {
        if (!read_level(l, plan, x, seg_end)) return false;
        x = seg_end;
      }
    }
    const int64_t per_step_end = std::min(p.end_step, run.sealed ? last + 1 : run.frontier);
    if (x < per_step_end) {
      if (!read_level(0, plan_for(2), x, per_step_end)) return false;
      x = per_step_end;
    }
  }
  if (x < p.end_step) {
    std::vector<PlanRow> frames_only;
    decompose(run.top_m, 0, world, p.ranks, std::numeric_limits<int>::max(), &frames_only);
    if (!read_level(0, frames_only, std::max(x, run.raw_from), p.end_step)) return false;
  }
  return true;
}

bool HistoryDb::prepare_query(const BandQuery& q, bool per_rank, RunState* run, std::vector<int32_t>* ranks,
                              int64_t* first_step, int64_t* end_step, int64_t* bucket_steps) {
  if (q.max_buckets < 1 || q.max_buckets > 1'000'000) {
    return fail("max_buckets must be in 1..1000000, got " + std::to_string(q.max_buckets));
  }
  if (!load_run(q.run_id, run)) return false;
  *ranks = q.ranks;
  std::sort(ranks->begin(), ranks->end());
  ranks->erase(std::unique(ranks->begin(), ranks->end()), ranks->end());
  if (!ranks->empty() && (ranks->front() < 0 || ranks->back() >= run->world)) {
    return fail("ranks must be in 0.." + std::to_string(run->world - 1) + " for run " +
                std::to_string(q.run_id));
  }
  if (per_rank) {
    if (ranks->empty()) {
      if (static_cast<size_t>(run->world) > kMaxSeriesRanks) {
        return fail("a per-rank series query takes at most " + std::to_string(kMaxSeriesRanks) +
                    " ranks; name them");
      }
      for (int32_t r = 0; r < run->world; ++r) ranks->push_back(r);
    } else if (ranks->size() > kMaxSeriesRanks) {
      return fail("a per-rank series query takes at most " + std::to_string(kMaxSeriesRanks) + " ranks");
    }
  }
  int64_t a = std::max<int64_t>(q.step_begin, 0);
  const int64_t b = std::min(q.step_end, run->last_step + 1);
  const bool tiled = rank_metric_tiled(q.metric);
  if (!tiled) a = std::max(a, run->raw_from);  // only the frames have these, and they are gone below raw_from
  *bucket_steps = 1;
  if (a >= b) {
    *first_step = *end_step = 0;
    return true;
  }
  const int64_t n = b - a;
  int64_t w = 1;
  while (w * q.max_buckets < n) w *= 2;
  // Downsampled range: the finest resolution left there is one block of the first tile level.
  if (tiled && a < run->raw_from) w = std::max(w, kStepBlock[1]);
  *bucket_steps = w;
  *first_step = a / w * w;
  *end_step = std::min((b - 1) / w * w + w, run->last_step + 1);
  return true;
}

bool HistoryDb::query_band(const BandQuery& q, BandResult* out) {
  *out = BandResult();
  ReadTxn txn(db_);
  RunState run;
  ScanPlan p;
  p.metric = q.metric;
  if (!prepare_query(q, false, &run, &p.ranks, &p.first_step, &p.end_step, &p.bucket_steps)) return false;
  out->bucket_steps = p.bucket_steps;
  if (p.first_step >= p.end_step) return true;
  std::vector<Acc> acc(
      static_cast<size_t>((p.end_step - p.first_step + p.bucket_steps - 1) / p.bucket_steps));
  p.visit = [&](int64_t step, int32_t, const CellMetric& c) {
    acc[static_cast<size_t>((step - p.first_step) / p.bucket_steps)].add(c);
  };
  if (!scan(run, p, &out->rows_read)) return false;
  emit(acc, p.first_step, p.bucket_steps, &out->buckets);
  return true;
}

bool HistoryDb::query_series(const BandQuery& q, SeriesResult* out) {
  *out = SeriesResult();
  ReadTxn txn(db_);
  RunState run;
  ScanPlan p;
  p.metric = q.metric;
  p.per_rank = true;
  if (!prepare_query(q, true, &run, &p.ranks, &p.first_step, &p.end_step, &p.bucket_steps)) return false;
  out->bucket_steps = p.bucket_steps;
  if (p.first_step >= p.end_step) return true;
  const size_t n_buckets =
      static_cast<size_t>((p.end_step - p.first_step + p.bucket_steps - 1) / p.bucket_steps);
  if (n_buckets * p.ranks.size() > (size_t{1} << 22)) {
    return fail("ranks × buckets = " + std::to_string(n_buckets * p.ranks.size()) +
                " is over the 4,194,304 a series query returns; ask for fewer ranks or buckets");
  }
  std::vector<Acc> acc(n_buckets * p.ranks.size());
  p.visit = [&](int64_t step, int32_t rank, const CellMetric& c) {
    const auto r = std::lower_bound(p.ranks.begin(), p.ranks.end(), rank) - p.ranks.begin();
    acc[static_cast<size_t>(r) * n_buckets + static_cast<size_t>((step - p.first_step) / p.bucket_steps)].add(
        c);
  };
  if (!scan(run, p, &out->rows_read)) return false;
  out->ranks.resize(p.ranks.size());
  std::vector<Acc> one(n_buckets);
  for (size_t r = 0; r < p.ranks.size(); ++r) {
    out->ranks[r].rank = p.ranks[r];
    std::copy_n(acc.begin() + static_cast<std::ptrdiff_t>(r * n_buckets), n_buckets, one.begin());
    emit(one, p.first_step, p.bucket_steps, &out->ranks[r].buckets);
  }
  return true;
}

bool HistoryDb::query_heatmap(const HeatmapQuery& q, HeatmapResult* out) {
  *out = HeatmapResult();
  if (!rank_metric_tiled(q.metric)) {
    return fail("a heatmap reads the tile pyramid: " + std::string(rank_metric_name(q.metric)) +
                " is not tiled");
  }
  if (q.max_buckets < 1 || q.max_buckets > 100'000)
    return fail("max_buckets must be in 1..100000, got " + std::to_string(q.max_buckets));
  if (q.max_rank_rows < 1 || static_cast<size_t>(q.max_rank_rows) > kMaxSeriesRanks) {
    return fail("max_rank_rows must be in 1.." + std::to_string(kMaxSeriesRanks) + ", got " +
                std::to_string(q.max_rank_rows));
  }
  ReadTxn txn(db_);
  RunState run;
  if (!load_run(q.run_id, &run)) return false;
  out->world = run.world;
  out->last_step = run.last_step;
  int32_t span = 1;
  while ((run.world + span - 1) / span > q.max_rank_rows) span *= 2;
  out->ranks_per_row = span;
  out->rows = (run.world + span - 1) / span;
  const int64_t a = std::max<int64_t>(q.step_begin, 0);
  const int64_t b = std::min(q.step_end, run.last_step + 1);
  // The columns follow the range asked for (not the part of it the run has reached), so pages of one
  // width keep one column width while a live run grows into the last of them.
  const int64_t asked_end = q.step_end == kStepEnd ? b : q.step_end;
  int64_t w = 1;
  while (w * q.max_buckets < asked_end - a) w *= 2;
  if (a < run.raw_from) w = std::max(w, kStepBlock[1]);  // downsampled: 64 steps is the finest left
  out->bucket_steps = w;
  out->first_step = a / w * w;
  if (a >= b) return true;
  const int64_t end = std::min((b - 1) / w * w + w, run.last_step + 1);
  out->cols = static_cast<int32_t>((end - out->first_step + w - 1) / w);
  const size_t cells = static_cast<size_t>(out->cols) * static_cast<size_t>(out->rows);
  if (cells > kMaxHeatmapCells) {
    return fail("rows × columns = " + std::to_string(cells) + " is over the " +
                std::to_string(kMaxHeatmapCells) + " cells a heatmap returns; ask for fewer");
  }
  ScanPlan p;
  p.metric = q.metric;
  p.first_step = out->first_step;
  p.end_step = end;
  p.bucket_steps = w;
  p.max_cell_m = 0;
  while (pack::rank_span(p.max_cell_m + 1) <= span) ++p.max_cell_m;
  std::vector<Acc> acc(cells);
  const int64_t cols = out->cols;
  p.visit = [&](int64_t step, int32_t rank, const CellMetric& c) {
    acc[static_cast<size_t>(rank / span * cols + (step - p.first_step) / w)].add(c);
  };
  if (!scan(run, p, &out->rows_read)) return false;
  out->min.resize(cells);
  out->max.resize(cells);
  out->mean.resize(cells);
  out->max_rank.resize(cells);
  for (size_t i = 0; i < cells; ++i) {
    const Acc& x = acc[i];
    const bool any = x.count > 0;
    out->min[i] = any ? static_cast<float>(x.min) : std::numeric_limits<float>::quiet_NaN();
    out->max[i] = any ? static_cast<float>(x.max) : std::numeric_limits<float>::quiet_NaN();
    out->mean[i] = any ? static_cast<float>(x.sum / static_cast<double>(x.count))
                       : std::numeric_limits<float>::quiet_NaN();
    out->max_rank[i] = any ? x.max_rank : -1;
  }
  return true;
}

bool HistoryDb::query_step_band(int64_t run_id, StepMetric metric, int64_t step_begin, int64_t step_end,
                                int32_t max_buckets, BandResult* out) {
  *out = BandResult();
  if (max_buckets < 1 || max_buckets > 1'000'000) {
    return fail("max_buckets must be in 1..1000000, got " + std::to_string(max_buckets));
  }
  ReadTxn txn(db_);
  // One pass over the steps table in step order: a step row is small and there is one per step.
  static constexpr const char* kColumns[] = {"loss",   "grad_norm", "lr",  "tokens_per_s",
                                             "step_s", "mfu",       "hfu", "val_loss"};
  sqlite3_stmt* st = nullptr;
  std::string sql = "SELECT min(step), max(step) FROM steps WHERE run_id = ? AND step >= ? AND step < ?";
  if (sqlite3_prepare_v2(db_, sql.c_str(), -1, &st, nullptr) != SQLITE_OK)
    return fail_sqlite("querying steps");
  sqlite3_bind_int64(st, 1, run_id);
  sqlite3_bind_int64(st, 2, step_begin);
  sqlite3_bind_int64(st, 3, step_end);
  const bool any = sqlite3_step(st) == SQLITE_ROW && sqlite3_column_type(st, 0) != SQLITE_NULL;
  const int64_t a = any ? sqlite3_column_int64(st, 0) : 0, b = any ? sqlite3_column_int64(st, 1) + 1 : 0;
  sqlite3_finalize(st);
  out->bucket_steps = 1;
  if (!any) return true;
  int64_t w = 1;
  while (w * max_buckets < b - a) w *= 2;
  out->bucket_steps = w;
  const int64_t first = a / w * w;
  std::vector<Acc> acc(static_cast<size_t>((b - first + w - 1) / w));
  sql = std::string("SELECT step, ") + kColumns[static_cast<int>(metric)] +
        " FROM steps WHERE run_id = ? AND step >= ? AND step < ? ORDER BY step";
  if (sqlite3_prepare_v2(db_, sql.c_str(), -1, &st, nullptr) != SQLITE_OK)
    return fail_sqlite("querying steps");
  sqlite3_bind_int64(st, 1, run_id);
  sqlite3_bind_int64(st, 2, a);
  sqlite3_bind_int64(st, 3, b);
  int rc = SQLITE_DONE;
  while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
    ++out->rows_read;
    if (sqlite3_column_type(st, 1) == SQLITE_NULL) continue;  // NaN, or no validation at this step
    const int64_t s = sqlite3_column_int64(st, 0);
    const double v = sqlite3_column_double(st, 1);
    acc[static_cast<size_t>((s - first) / w)].add(CellMetric{1, 1, s, {v, v, v, v, -1}});
  }
  sqlite3_finalize(st);
  if (rc != SQLITE_DONE) return fail_sqlite("querying steps");
  emit(acc, first, w, &out->buckets);
  return true;
}

// ---- upgrading: tiles of an older format, built again from the rows ----

bool HistoryDb::upgrade_tiles() {
  std::vector<int64_t> runs;
  {
    sqlite3_stmt* st = nullptr;
    if (sqlite3_prepare_v2(db_, "SELECT id FROM runs WHERE tile_format < 2 AND raw_from_step = 0", -1, &st,
                           nullptr) != SQLITE_OK) {
      return fail_sqlite("finding runs with old tiles");
    }
    while (sqlite3_step(st) == SQLITE_ROW) runs.push_back(sqlite3_column_int64(st, 0));
    sqlite3_finalize(st);
  }
  // One transaction per run: an interrupted upgrade leaves every run either done or as it was, and the next
  // open carries on.
  for (const int64_t id : runs) {
    if (!begin_write()) return false;
    RunState run;
    bool ok = load_run(id, &run);
    if (ok) {
      const bool sealed = run.sealed;
      ok = delete_tiles(pack::tile_key(id, 0, 0, 0), pack::tile_key(id + 1, 0, 0, 0)) ||
           fail_sqlite("dropping old tiles");
      run.frontier = 0;
      run.sealed = false;
      ok = ok && finalize(run, {}, sealed) && save_run(run);
    }
    if (ok) {
      sqlite3_stmt* st = nullptr;
      ok = sqlite3_prepare_v2(db_, "UPDATE runs SET tile_format = 2 WHERE id = ?", -1, &st, nullptr) ==
           SQLITE_OK;
      if (ok) {
        sqlite3_bind_int64(st, 1, id);
        ok = sqlite3_step(st) == SQLITE_DONE;
      }
      sqlite3_finalize(st);
      if (!ok) fail_sqlite("marking run " + std::to_string(id) + "'s tiles");
    }
    if (!ok || !commit()) {
      rollback();
      return false;
    }
  }
  return true;
}

// ---- retention: it must leave the pyramid consistent with the rows ----

int64_t HistoryDb::downsample_rank_steps(int64_t run_id, int64_t before_step) {
  if (!begin_write()) return -1;
  RunState run;
  if (!load_run(run_id, &run)) {
    rollback();
    return -1;
  }
  // Only what the first tile level already covers may go: blocks below the frontier (or, sealed, all).
  const int64_t tiled = run.sealed ? run.last_step + 1 : run.frontier;
  int64_t cut = std::min(before_step, tiled);
  cut -= cut % pack::kStepBlock[1];
  if (cut <= run.raw_from) {
    rollback();
    return run.raw_from;
  }
  // The frames, and the per-step tiles (step level 0) that only they could rebuild.
  sqlite3_stmt* st = nullptr;
  bool ok = sqlite3_prepare_v2(db_, "DELETE FROM rank_steps WHERE run_id = ? AND step < ?", -1, &st,
                               nullptr) == SQLITE_OK;
  if (ok) {
    sqlite3_bind_int64(st, 1, run_id);
    sqlite3_bind_int64(st, 2, cut);
    ok = sqlite3_step(st) == SQLITE_DONE;
  }
  sqlite3_finalize(st);
  for (int m = 2; ok && m < 8; ++m) {
    ok = delete_tiles(pack::tile_key(run_id, pack::tile_level(0, m), 0, 0),
                      pack::tile_key(run_id, pack::tile_level(0, m), cut, 0));
  }
  if (!ok) fail_sqlite("downsampling run " + std::to_string(run_id));
  run.raw_from = cut;
  if (!ok || !save_run(run) || !commit()) {
    rollback();
    return -1;
  }
  return cut;
}

bool HistoryDb::rewind_run(int64_t run_id, int64_t step) {
  if (!begin_write()) return false;
  RunState run;
  bool ok = load_run(run_id, &run);
  if (ok && step + 1 < run.raw_from) {
    ok = fail("cannot rewind run " + std::to_string(run_id) + " to step " + std::to_string(step) +
              ": its rank steps before " + std::to_string(run.raw_from) + " were downsampled");
  }
  const auto run_delete = [&](const char* sql, int64_t from) {
    sqlite3_stmt* st = nullptr;
    bool good = sqlite3_prepare_v2(db_, sql, -1, &st, nullptr) == SQLITE_OK;
    if (good) {
      sqlite3_bind_int64(st, 1, run_id);
      sqlite3_bind_int64(st, 2, from);
      good = sqlite3_step(st) == SQLITE_DONE;
    }
    sqlite3_finalize(st);
    return good || fail_sqlite("rewinding run " + std::to_string(run_id));
  };
  ok = ok && run_delete("DELETE FROM rank_steps WHERE run_id = ? AND step > ?", step);
  ok = ok && run_delete("DELETE FROM steps WHERE run_id = ? AND step > ?", step);
  // Events stay: they are the run's log of what happened (a failure at step 8, the quarantine it caused,
  // the recovery from step 3), which the steps trained again do not undo.
  // Tiles of every block that reaches past `step`: they will be built again when their blocks are final.
  for (int level = 0; ok && level < pack::tile_level(pack::kStepLevels, 0); ++level) {
    const int64_t first_block = (step + 1) / pack::kStepBlock[level / 8];
    ok = delete_tiles(pack::tile_key(run_id, level, first_block, 0),
                      pack::tile_key(run_id, level + 1, 0, 0)) ||
         fail_sqlite("rewinding tiles");
  }
  if (ok) {
    run.last_step = std::min(run.last_step, step);
    run.frontier = std::min(run.frontier, step + 1);
    run.sealed = false;
    ok = save_run(run);
  }
  if (!ok || !commit()) {
    rollback();
    return false;
  }
  return true;
}

}  // namespace gantry
