// The heatmap keeps each cell's maximum (so a straggler's one slow step shows at any zoom), buckets ranks
// when there are more than rows, tells missing cells apart, and its colour ramp is monotonic.
#include "ui/plot/heatmap.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

namespace gantry::plot {
namespace {

// Reference: the maximum of the stored values of ranks [r0, r1) × steps [s0, s1), NaN when none.
float brute_max(const std::vector<std::vector<float>>& v, int r0, int r1, int64_t s0, int64_t s1) {
  float m = NAN;
  for (int r = r0; r < r1; ++r) {
    for (int64_t s = s0; s < s1; ++s) {
      if (s < 0 || s >= static_cast<int64_t>(v[static_cast<size_t>(r)].size())) continue;
      const float x = v[static_cast<size_t>(r)][static_cast<size_t>(s)];
      if (!std::isnan(x) && (std::isnan(m) || x > m)) m = x;
    }
  }
  return m;
}

TEST(Heatmap, EveryCellIsTheMaximumOfItsBucket) {
  const int ranks = 37;
  const int64_t steps = 3001;
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> u(0.9f, 1.1f);
  std::vector<std::vector<float>> ref(ranks, std::vector<float>(steps));
  HeatmapModel m(ranks);
  std::vector<float> row(ranks);
  for (int64_t s = 0; s < steps; ++s) {
    for (int r = 0; r < ranks; ++r) {
      float v = u(rng);
      if (rng() % 997 == 0) v = 5.0f + static_cast<float>(rng() % 100);  // a straggler's spike
      if (rng() % 101 == 0) v = NAN;                                     // a rank that did not report
      row[static_cast<size_t>(r)] = ref[static_cast<size_t>(r)][static_cast<size_t>(s)] = v;
    }
    ASSERT_TRUE(m.append_step(s, row));
  }
  EXPECT_EQ(m.step_end(), steps);

  const struct {
    int64_t lo, hi;
    int cols, rows;
  } views[] = {{0, steps, 100, 10},  {0, steps, 3001, 37}, {123, 2000, 64, 5},
               {1000, 1010, 3, 100}, {0, steps, 1, 1},     {2990, 5000, 7, 4}};
  HeatmapGrid g;
  for (const auto& v : views) {
    heatmap_grid(m, v.lo, v.hi, v.cols, v.rows, g);
    ASSERT_GT(g.cols, 0);
    ASSERT_LE(g.cols, v.cols);
    ASSERT_LE(g.rows, v.rows);
    EXPECT_EQ(g.steps_per_col & (g.steps_per_col - 1), 0) << "not a power of two";
    EXPECT_EQ(g.step_origin % g.steps_per_col, 0) << "columns not aligned";
    EXPECT_LE(g.col_step_begin(0), v.lo);
    EXPECT_GE(g.col_step_begin(g.cols), std::min(v.hi, steps));
    EXPECT_EQ(g.rows, (ranks + g.ranks_per_row - 1) / g.ranks_per_row);
    float vmin = INFINITY, vmax = -INFINITY;
    for (int r = 0; r < g.rows; ++r) {
      for (int c = 0; c < g.cols; ++c) {
        const int r0 = g.row_rank_begin(r), r1 = std::min(ranks, r0 + g.ranks_per_row);
        const float want = brute_max(ref, r0, r1, g.col_step_begin(c), g.col_step_begin(c + 1));
        const float got = g.at(r, c);
        if (std::isnan(want)) {
          EXPECT_TRUE(std::isnan(got)) << "row " << r << " col " << c;
        } else {
          EXPECT_EQ(got, want) << "view " << v.lo << ".." << v.hi << " row " << r << " col " << c;
          vmin = std::min(vmin, want);
          vmax = std::max(vmax, want);
        }
      }
    }
    EXPECT_EQ(g.value_min, vmin);
    EXPECT_EQ(g.value_max, vmax);
  }
}

TEST(Heatmap, OneSlowStepOfOneRankShowsAtEveryZoom) {
  HeatmapModel m(1024);
  std::vector<float> row(1024, 0.1f);
  for (int64_t s = 0; s < 5000; ++s) {
    row[700] = s == 4321 ? 9.0f : 0.1f;
    m.append_step(s, row);
  }
  HeatmapGrid g;
  for (int cols : {1, 10, 300, 5000}) {
    for (int rows : {1, 7, 300, 1024}) {
      heatmap_grid(m, 0, m.step_end(), cols, rows, g);
      int hot = 0;
      for (float v : g.cells) hot += v == 9.0f;
      EXPECT_EQ(hot, 1) << cols << " x " << rows;
      EXPECT_EQ(g.value_max, 9.0f);
    }
  }
}

TEST(Heatmap, RanksAreBucketedWhenThereAreMoreThanRows) {
  HeatmapModel m(10);
  for (int r = 0; r < 10; ++r) m.set(r, 0, static_cast<float>(r));
  HeatmapGrid g;
  heatmap_grid(m, 0, 1, 10, 4, g);
  EXPECT_EQ(g.ranks_per_row, 3);  // ceil(10 / 4)
  ASSERT_EQ(g.rows, 4);
  EXPECT_EQ(g.at(0, 0), 2);  // ranks 0..2
  EXPECT_EQ(g.at(1, 0), 5);
  EXPECT_EQ(g.at(2, 0), 8);
  EXPECT_EQ(g.at(3, 0), 9);  // rank 9 alone
  heatmap_grid(m, 0, 1, 10, 10, g);
  EXPECT_EQ(g.ranks_per_row, 1);
  EXPECT_EQ(g.at(7, 0), 7);
}

TEST(Heatmap, SetsOutOfOrderOverwritesAndMissingCells) {
  HeatmapModel m(2, 100);  // a run resumed at step 100
  EXPECT_FALSE(m.set(0, 99, 1));
  EXPECT_FALSE(m.set(2, 100, 1));
  EXPECT_EQ(m.step_end(), 100);
  EXPECT_TRUE(m.set(1, 163, 4));  // rank 1 ahead; steps 100..162 are missing so far
  EXPECT_EQ(m.step_end(), 164);
  EXPECT_TRUE(std::isnan(m.value(0, 130)));
  EXPECT_TRUE(m.set(0, 130, 2));
  EXPECT_EQ(m.value(0, 130), 2);
  HeatmapGrid g;
  heatmap_grid(m, 100, 164, 1, 2, g);
  EXPECT_EQ(g.at(0, 0), 2);
  EXPECT_EQ(g.at(1, 0), 4);
  // Overwriting with a smaller value lowers the bucket maximum too: maxima are recomputed, not max-ed in.
  EXPECT_TRUE(m.set(1, 163, 1));
  heatmap_grid(m, 100, 164, 1, 2, g);
  EXPECT_EQ(g.at(1, 0), 1);
  // NaN clears a cell back to missing.
  EXPECT_TRUE(m.set(1, 163, NAN));
  heatmap_grid(m, 100, 164, 1, 2, g);
  EXPECT_TRUE(std::isnan(g.at(1, 0)));
  EXPECT_EQ(g.at(0, 0), 2);
  // A missing cell among present ones stays missing at full resolution.
  heatmap_grid(m, 100, 164, 64, 2, g);
  EXPECT_EQ(g.steps_per_col, 1);
  EXPECT_TRUE(std::isnan(g.at(0, 0)));
  EXPECT_EQ(g.at(0, 30), 2);
  // Wrong row length is refused.
  const std::vector<float> short_row(1, 1.0f);
  EXPECT_FALSE(m.append_step(170, short_row));
  m.clear();
  EXPECT_EQ(m.step_end(), 100);
  heatmap_grid(m, 0, 1000, 10, 10, g);
  EXPECT_EQ(g.cols, 0);
}

TEST(Heatmap, AppendsGrowThePyramidAsStepsDouble) {
  HeatmapModel m(4);
  std::vector<float> row(4, 1.0f);
  for (int64_t s = 0; s < 1025; ++s) m.append_step(s, row);
  EXPECT_EQ(m.levels(), 12);  // 1025 steps: buckets of 1, 2, ..., 2048 (the top one holds all)
  EXPECT_EQ(m.bucket_max(11, 0, 0), 1.0f);
  EXPECT_TRUE(std::isnan(m.bucket_max(11, 0, 1)));
  EXPECT_EQ(m.bucket_row(12, 0), nullptr);
}

TEST(Heatmap, ReservingFirstChangesNothingButTheAllocations) {
  HeatmapModel grown(3), reserved(3);
  reserved.reserve(1000);
  EXPECT_EQ(reserved.step_end(), 0);  // reserving stores no steps
  std::vector<float> row(3);
  for (int64_t s = 0; s < 1000; ++s) {
    for (int r = 0; r < 3; ++r) row[static_cast<size_t>(r)] = static_cast<float>((s * 7 + r * 13) % 101);
    grown.append_step(s, row);
    reserved.append_step(s, row);
  }
  ASSERT_EQ(grown.levels(), reserved.levels());
  for (int k = 0; k < grown.levels(); ++k) {
    for (int64_t b = 0; grown.bucket_row(k, b) != nullptr; ++b) {
      for (int r = 0; r < 3; ++r) ASSERT_EQ(grown.bucket_max(k, r, b), reserved.bucket_max(k, r, b));
    }
  }
}

// WCAG relative luminance of a packed IM_COL32 colour.
double luminance(uint32_t c) {
  auto lin = [](uint32_t v) {
    const double e = v / 255.0;
    return e <= 0.04045 ? e / 12.92 : std::pow((e + 0.055) / 1.055, 2.4);
  };
  return 0.2126 * lin(c & 0xFF) + 0.7152 * lin((c >> 8) & 0xFF) + 0.0722 * lin((c >> 16) & 0xFF);
}

TEST(ColourScale, RampIsMonotonicInLuminanceWithDistinctEnds) {
  double prev = -1;
  for (int i = 0; i <= 1000; ++i) {
    const uint32_t c = colour_ramp(i / 1000.0);
    EXPECT_EQ(c >> 24, 0xFFu) << "opaque";
    const double y = luminance(c);
    EXPECT_GE(y, prev) << "t = " << i / 1000.0;
    prev = y;
  }
  EXPECT_GT(luminance(colour_ramp(1)), 10 * luminance(colour_ramp(0)));
  EXPECT_EQ(colour_ramp(-3), colour_ramp(0));
  EXPECT_EQ(colour_ramp(7), colour_ramp(1));
}

TEST(ColourScale, MapsTheRangeEndsAndMissing) {
  EXPECT_EQ(colour_scale_map(2, 4, 2), colour_ramp(0));
  EXPECT_EQ(colour_scale_map(2, 4, 4), colour_ramp(1));
  EXPECT_EQ(colour_scale_map(2, 4, 3), colour_ramp(0.5));
  EXPECT_EQ(colour_scale_map(2, 4, 100), colour_ramp(1));
  EXPECT_EQ(colour_scale_map(2, 4, -100), colour_ramp(0));
  EXPECT_EQ(colour_scale_map(3, 3, 3), colour_ramp(0.5));
  EXPECT_EQ(colour_scale_map(2, 4, NAN), colour_missing());
  // Missing has no hue and is no ramp colour.
  const uint32_t miss = colour_missing();
  EXPECT_EQ(miss & 0xFF, (miss >> 8) & 0xFF);
  EXPECT_EQ(miss & 0xFF, (miss >> 16) & 0xFF);
  for (int i = 0; i <= 255; ++i) EXPECT_NE(colour_ramp(i / 255.0), miss);
}

}  // namespace
}  // namespace gantry::plot
