// The heatmap's one cache: pages of the coordinator's tile answer held by shared_ptr, least recently used
// dropped past the byte bound (while a snapshot holding a dropped page keeps it alive), and the layout that
// cuts a view into pages aligned to their own width, so panning asks only for the pages that came into view.
#include "ui/console/tile_cache.h"

#include <gtest/gtest.h>

#include <cmath>

namespace gantry::console {
namespace {

std::shared_ptr<const HeatTile> tile(int64_t first, int cols, int rows) {
  auto t = std::make_shared<HeatTile>();
  t->first_step = first;
  t->cols = cols;
  t->rows = rows;
  t->max.assign(static_cast<size_t>(cols * rows), 1.0f);
  t->mean = t->max;
  t->min = t->max;
  t->max_rank.assign(static_cast<size_t>(cols * rows), 0);
  return t;
}

TEST(TileCache, PanningOverALongRunStaysUnderTheBound) {
  const size_t one = tile(0, 256, 128)->bytes();
  TileCache cache(3 * one + one / 2);  // room for three pages
  const HeatWant first{.run = 1, .step_lo = 0, .step_hi = 100000, .cols = 600, .rows = 128};
  const HeatLayout whole = heat_layout(first, 256);
  EXPECT_EQ(whole.bucket_steps, 256);  // the smallest power of two with 100,000 steps in ≤ 600 columns
  EXPECT_EQ(whole.first_page, 0);
  EXPECT_EQ(whole.last_page, 1);
  std::shared_ptr<const HeatTile> held;  // a snapshot holding a page the cache drops
  size_t fetched = 0;
  // Zoomed in to 6,000 steps (16 steps a column, pages of 4,096 steps), panned over 1,000,000 steps.
  for (int64_t lo = 0; lo < 1'000'000; lo += 1500) {
    const HeatLayout l =
        heat_layout({.run = 1, .step_lo = lo, .step_hi = lo + 6000, .cols = 600, .rows = 128}, 256);
    ASSERT_EQ(l.bucket_steps, 16);
    EXPECT_LE(l.first_page * 256 * 16, lo);
    EXPECT_GE((l.last_page + 1) * 256 * 16, lo + 6000);
    for (int64_t page = l.first_page; page <= l.last_page; ++page) {
      const TileKey key{.run = 1, .bucket_steps = l.bucket_steps, .page = page, .rank_rows = 128};
      std::shared_ptr<const HeatTile> t = cache.find(key);
      if (!t) {
        ++fetched;
        t = tile(l.page_begin(page), 256, 128);
        cache.put(key, t);
      }
      if (!held) held = t;
      ASSERT_LE(cache.bytes(), cache.max_bytes());
    }
  }
  // Each page was fetched once: a pan reuses the pages still in view.
  EXPECT_EQ(fetched, static_cast<size_t>(1'006'000 / 4096 + 1));
  EXPECT_GT(cache.evictions(), 200u);
  EXPECT_EQ(cache.size(), 3u);
  EXPECT_EQ(held->first_step, 0);  // dropped by the cache, alive while held
  EXPECT_EQ(held->max.size(), 256u * 128u);
}

TEST(TileCache, FindMakesAPageRecentAndPutReplaces) {
  const size_t one = tile(0, 10, 10)->bytes();
  TileCache cache(2 * one);
  const TileKey a{.run = 1, .page = 0}, b{.run = 1, .page = 1}, c{.run = 1, .page = 2};
  cache.put(a, tile(0, 10, 10));
  cache.put(b, tile(10, 10, 10));
  ASSERT_TRUE(cache.find(a));  // a is now the most recent: c pushes b out
  cache.put(c, tile(20, 10, 10));
  EXPECT_TRUE(cache.find(a));
  EXPECT_FALSE(cache.find(b));
  EXPECT_TRUE(cache.find(c));
  cache.put(c, tile(20, 10, 10));  // a newer answer for the same page
  EXPECT_EQ(cache.size(), 2u);
  EXPECT_EQ(cache.bytes(), 2 * one);
}

TEST(TileCache, AnAnswerWithNullCellsIsNaNNotZero) {
  Result<HeatTile> t = heat_tile_from_json({{"first_step", 0},
                                            {"bucket_steps", 1},
                                            {"cols", 2},
                                            {"rows", 1},
                                            {"ranks_per_row", 1},
                                            {"world", 1},
                                            {"last_step", 0},
                                            {"min", {0.5, nullptr}},
                                            {"max", {0.5, nullptr}},
                                            {"mean", {0.5, nullptr}},
                                            {"max_rank", {0, nullptr}}});
  ASSERT_TRUE(t.ok()) << t.error();
  EXPECT_FLOAT_EQ(t->at(0, 0), 0.5f);
  EXPECT_TRUE(std::isnan(t->at(0, 1)));
  EXPECT_EQ(t->max_rank[1], -1);
  Result<HeatTile> bad = heat_tile_from_json({{"first_step", 0},
                                              {"bucket_steps", 1},
                                              {"cols", 3},
                                              {"rows", 1},
                                              {"ranks_per_row", 1},
                                              {"world", 1},
                                              {"last_step", 0},
                                              {"min", {0.5}},
                                              {"max", {0.5}},
                                              {"mean", {0.5}},
                                              {"max_rank", {0}}});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().find("1 × 3 cells"), std::string::npos) << bad.error();
}

}  // namespace
}  // namespace gantry::console
