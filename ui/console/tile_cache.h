// The console's one store of the rank × step heatmap: pages of the coordinator's tile query
// (GET /v1/runs/{id}/heatmap, answered from its tile pyramid), each an immutable HeatTile held by
// shared_ptr, so a published snapshot shares the pages it shows with the cache and with every other
// snapshot (a publish copies pointers, never cells). The cache is bounded in bytes and drops the least
// recently used pages past its bound; a page a snapshot still holds lives until that snapshot goes.
//
// A page is kHeatPageCols columns (DataSourceOptions::heat_page_cols) of bucket_steps steps each, aligned
// to its own width, so panning reuses the pages already held and asks only for the ones that came into
// view; rows are ranks_per_row ranks (a power of two: the coordinator's choice for the rows asked for).
//
//   TileCache cache(64 << 20);
//   TileKey key = heat_page_key(run, metric, bucket_steps, page, rank_rows);
//   if (std::shared_ptr<const HeatTile> t = cache.find(key)) ... else cache.put(key, fetched);
#pragma once

#include <compare>
#include <cstddef>
#include <cstdint>
#include <list>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "telemetry/status.h"
#include "ui/console/rank_metric.h"

namespace gantry::console {

// One page as the coordinator answered it: [row · cols + col], NaN / −1 where no rank reported.
struct HeatTile {
  int64_t first_step = 0;  // column c: [first_step + c·bucket_steps, + bucket_steps)
  int64_t bucket_steps = 1;
  int cols = 0, rows = 0;
  int ranks_per_row = 1;
  int world = 0;
  int64_t last_step = -1;  // the run's newest step when the coordinator read it
  std::vector<float> min, max, mean;
  std::vector<int32_t> max_rank;
  float at(int row, int col) const { return max[static_cast<size_t>(row) * static_cast<size_t>(cols) + col]; }
  size_t bytes() const;
};

// The page's cells from the API's answer; an error names what is missing or malformed.
Result<HeatTile> heat_tile_from_json(const nlohmann::json& j);

struct TileKey {
  int64_t run = -1;
  RankTimeMetric metric = RankTimeMetric::kBusy;
  int64_t bucket_steps = 1;
  int64_t page = 0;   // steps [page · cols · bucket_steps, (page + 1) · cols · bucket_steps)
  int rank_rows = 1;  // the rows asked for
  auto operator<=>(const TileKey&) const = default;
};

// What the Run panel shows of the heatmap: a step range at a number of columns and rows (its pixels).
struct HeatWant {
  int64_t run = -1;
  RankTimeMetric metric = RankTimeMetric::kBusy;
  int64_t step_lo = 0, step_hi = 0;  // [lo, hi)
  int cols = 0, rows = 0;
  bool operator==(const HeatWant&) const = default;
};

// The pages covering a want: columns of bucket_steps steps (the smallest power of two that puts the range
// in at most `cols` columns), pages first_page..last_page of page_cols columns each.
struct HeatLayout {
  int64_t bucket_steps = 1;
  int page_cols = 256;
  int64_t first_page = 0, last_page = -1;
  int64_t page_begin(int64_t page) const { return page * page_cols * bucket_steps; }
  int64_t page_end(int64_t page) const { return page_begin(page + 1); }
};
HeatLayout heat_layout(const HeatWant& w, int page_cols);

// A snapshot's heatmap: the want it answers and its pages (null where not fetched yet), shared with the
// cache.
struct HeatPages {
  HeatWant want;
  HeatLayout layout;
  std::vector<std::shared_ptr<const HeatTile>> pages;  // [page − layout.first_page]
};

class TileCache {
 public:
  explicit TileCache(size_t max_bytes) : max_bytes_(max_bytes) {}
  // The page held under `key` (now the most recently used), or null.
  std::shared_ptr<const HeatTile> find(const TileKey& key);
  // Holds `tile` under `key` (replacing an older answer for the same page), then drops the least recently
  // used pages until the cache is within its bound; the page just put stays even if it alone is over.
  void put(const TileKey& key, std::shared_ptr<const HeatTile> tile);
  void clear();
  size_t bytes() const { return bytes_; }
  size_t size() const { return index_.size(); }
  size_t max_bytes() const { return max_bytes_; }
  uint64_t evictions() const { return evictions_; }

 private:
  using Lru = std::list<std::pair<TileKey, std::shared_ptr<const HeatTile>>>;  // most recent first
  size_t max_bytes_;
  size_t bytes_ = 0;
  uint64_t evictions_ = 0;
  Lru lru_;
  std::map<TileKey, Lru::iterator> index_;
};

}  // namespace gantry::console
