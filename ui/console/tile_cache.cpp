#include "ui/console/tile_cache.h"

#include <algorithm>
#include <limits>

namespace gantry::console {

HeatLayout heat_layout(const HeatWant& w, int page_cols) {
  HeatLayout l;
  l.page_cols = std::max(1, page_cols);
  if (w.step_hi <= w.step_lo || w.cols < 1) return l;
  while (l.bucket_steps * w.cols < w.step_hi - w.step_lo) l.bucket_steps *= 2;
  const int64_t page_steps = l.bucket_steps * l.page_cols;
  l.first_page = std::max<int64_t>(0, w.step_lo) / page_steps;
  l.last_page = std::max<int64_t>(0, w.step_hi - 1) / page_steps;
  return l;
}

size_t HeatTile::bytes() const {
  return sizeof(HeatTile) + (min.capacity() + max.capacity() + mean.capacity()) * sizeof(float) +
         max_rank.capacity() * sizeof(int32_t);
}

Result<HeatTile> heat_tile_from_json(const nlohmann::json& j) {
  HeatTile t;
  try {
    t.first_step = j.at("first_step").get<int64_t>();
    t.bucket_steps = j.at("bucket_steps").get<int64_t>();
    t.cols = j.at("cols").get<int>();
    t.rows = j.at("rows").get<int>();
    t.ranks_per_row = j.at("ranks_per_row").get<int>();
    t.world = j.at("world").get<int>();
    t.last_step = j.at("last_step").get<int64_t>();
    const size_t cells = static_cast<size_t>(t.cols) * static_cast<size_t>(t.rows);
    const nlohmann::json &min = j.at("min"), &max = j.at("max"), &mean = j.at("mean"),
                         &max_rank = j.at("max_rank");
    if (t.cols < 0 || t.rows < 0 || t.bucket_steps < 1 || min.size() != cells || max.size() != cells ||
        mean.size() != cells || max_rank.size() != cells) {
      return Status::error("heatmap: " + std::to_string(t.rows) + " × " + std::to_string(t.cols) +
                           " cells but arrays of " + std::to_string(max.size()) + ", " +
                           std::to_string(mean.size()) + " and " + std::to_string(max_rank.size()));
    }
    constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
    t.min.resize(cells);
    t.max.resize(cells);
    t.mean.resize(cells);
    t.max_rank.resize(cells);
    for (size_t i = 0; i < cells; ++i) {
      // null = no rank reported there: NaN, drawn as "none", never as 0.
      t.min[i] = min[i].is_null() ? kNaN : min[i].get<float>();
      t.max[i] = max[i].is_null() ? kNaN : max[i].get<float>();
      t.mean[i] = mean[i].is_null() ? kNaN : mean[i].get<float>();
      t.max_rank[i] = max_rank[i].is_null() ? -1 : max_rank[i].get<int32_t>();
    }
  } catch (const nlohmann::json::exception& e) {
    return Status::error(std::string("heatmap: malformed answer: ") + e.what());
  }
  return t;
}

std::shared_ptr<const HeatTile> TileCache::find(const TileKey& key) {
  auto it = index_.find(key);
  if (it == index_.end()) return nullptr;
  lru_.splice(lru_.begin(), lru_, it->second);
  return it->second->second;
}

void TileCache::put(const TileKey& key, std::shared_ptr<const HeatTile> tile) {
  if (auto it = index_.find(key); it != index_.end()) {
    bytes_ -= it->second->second->bytes();
    lru_.erase(it->second);
    index_.erase(it);
  }
  bytes_ += tile->bytes();
  lru_.emplace_front(key, std::move(tile));
  index_[key] = lru_.begin();
  while (bytes_ > max_bytes_ && lru_.size() > 1) {
    bytes_ -= lru_.back().second->bytes();
    index_.erase(lru_.back().first);
    lru_.pop_back();
    ++evictions_;
  }
}

void TileCache::clear() {
  lru_.clear();
  index_.clear();
  bytes_ = 0;
}

}  // namespace gantry::console
