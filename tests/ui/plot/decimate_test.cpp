// Decimation keeps every column's min and max exactly (so no spike is lost), joins lines where the data
// does, and breaks them at NaN.
#include "ui/plot/decimate.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

namespace gantry::plot {
namespace {

struct Column {
  double lo = INFINITY, hi = -INFINITY, first = NAN, last = NAN;
  bool any = false;
  bool joins = false;  // the point just before the column's first non-NaN point exists and is not NaN
};

// The obvious per-point reference: every point with x in [x0, x1] and y not NaN lands in its column.
std::vector<Column> brute_force(const std::vector<double>& x, const std::vector<double>& y, double x0,
                                double x1, int width) {
  std::vector<Column> cols(static_cast<size_t>(width));
  for (size_t i = 0; i < x.size(); ++i) {
    if (x[i] < x0 || x[i] > x1 || std::isnan(y[i])) continue;
    Column& c = cols[static_cast<size_t>(decimate_column(x[i], x0, x1, width))];
    c.lo = std::min(c.lo, y[i]);
    c.hi = std::max(c.hi, y[i]);
    if (!c.any) {
      c.first = y[i];
      c.joins = i > 0 && !std::isnan(y[i - 1]);
    }
    c.last = y[i];
    c.any = true;
  }
  return cols;
}

// A noisy series with rare tall spikes (the straggler case), some NaN gaps, and x steps that vary.
void random_series(std::mt19937_64& rng, size_t n, std::vector<double>& x, std::vector<double>& y) {
  std::uniform_real_distribution<double> u(0, 1);
  x.resize(n);
  y.resize(n);
  double t = 0;
  for (size_t i = 0; i < n; ++i) {
    t += 0.1 + u(rng);
    x[i] = t;
    y[i] = u(rng);
    if (u(rng) < 0.002) y[i] = 50 + 100 * u(rng);   // spike up
    if (u(rng) < 0.002) y[i] = -50 - 100 * u(rng);  // spike down
    if (u(rng) < 0.01) y[i] = NAN;
  }
}

TEST(Decimate, EveryColumnMinMaxFirstLastMatchBruteForce) {
  std::mt19937_64 rng(7);
  std::vector<double> x, y;
  for (int trial = 0; trial < 20; ++trial) {
    random_series(rng, 20000 + 1000 * trial, x, y);
    const double span = x.back() - x.front();
    const double x0 = x.front() + span * 0.05 * (trial % 5), x1 = x.back() - span * 0.03 * (trial % 7);
    const int width = 37 + 61 * trial;
    Decimation d;
    decimate(x, y, x0, x1, width, d);
    ASSERT_FALSE(d.raw);
    ASSERT_EQ(d.columns.size(), static_cast<size_t>(width));
    const std::vector<Column> ref = brute_force(x, y, x0, x1, width);
    double lo = INFINITY, hi = -INFINITY;
    for (int c = 0; c < width; ++c) {
      const DecimatedColumn& got = d.columns[static_cast<size_t>(c)];
      const Column& want = ref[static_cast<size_t>(c)];
      ASSERT_EQ(got.has_data, want.any) << "trial " << trial << " column " << c;
      if (!want.any) continue;
      EXPECT_EQ(got.y_min, want.lo) << "trial " << trial << " column " << c;
      EXPECT_EQ(got.y_max, want.hi) << "trial " << trial << " column " << c;
      EXPECT_EQ(got.y_first, want.first);
      EXPECT_EQ(got.y_last, want.last);
      EXPECT_EQ(got.joins_previous, want.joins) << "trial " << trial << " column " << c;
      lo = std::min(lo, want.lo);
      hi = std::max(hi, want.hi);
    }
    ASSERT_TRUE(d.has_y);
    EXPECT_EQ(d.y_min, lo);
    EXPECT_EQ(d.y_max, hi);
  }
}

TEST(Decimate, SparseAndNaNHeavySeriesMatchBruteForce) {
  // About one to three points per column, a third of them NaN: many short runs and NaN-broken columns.
  std::mt19937_64 rng(11);
  std::uniform_real_distribution<double> u(0, 1);
  for (int trial = 0; trial < 30; ++trial) {
    const size_t n = 500 + 97 * trial;
    std::vector<double> x(n), y(n);
    double t = 0;
    for (size_t i = 0; i < n; ++i) {
      t += u(rng) < 0.2 ? 0 : u(rng);  // some equal x values
      x[i] = t;
      y[i] = u(rng) < 0.33 ? NAN : u(rng) * 10 - 5;
    }
    const int width = static_cast<int>(n / (1 + trial % 3));
    Decimation d;
    decimate(x, y, x.front(), x.back(), width, d, /*allow_raw=*/false);
    const std::vector<Column> ref = brute_force(x, y, x.front(), x.back(), width);
    for (int c = 0; c < width; ++c) {
      const DecimatedColumn& got = d.columns[static_cast<size_t>(c)];
      const Column& want = ref[static_cast<size_t>(c)];
      ASSERT_EQ(got.has_data, want.any) << "trial " << trial << " column " << c;
      if (!want.any) continue;
      EXPECT_EQ(got.y_min, want.lo);
      EXPECT_EQ(got.y_max, want.hi);
      EXPECT_EQ(got.y_first, want.first);
      EXPECT_EQ(got.y_last, want.last);
      EXPECT_EQ(got.joins_previous, want.joins) << "trial " << trial << " column " << c;
    }
  }
}

TEST(Decimate, ASingleSpikeAmongAMillionPointsSurvives) {
  const size_t n = 1000000;
  std::vector<double> x(n), y(n, 1.0);
  for (size_t i = 0; i < n; ++i) x[i] = static_cast<double>(i);
  y[654321] = 1000;
  Decimation d;
  decimate(x, y, 0, static_cast<double>(n - 1), 500, d);
  ASSERT_FALSE(d.raw);
  const int col = decimate_column(654321, 0, static_cast<double>(n - 1), 500);
  EXPECT_EQ(d.columns[static_cast<size_t>(col)].y_max, 1000);
  EXPECT_EQ(d.y_max, 1000);
  int spikes = 0;
  for (const DecimatedColumn& c : d.columns) spikes += c.y_max == 1000;
  EXPECT_EQ(spikes, 1);
}

TEST(Decimate, NaNBreaksTheLineButKeepsTheColumnsOtherPoints) {
  // Ten columns of width 1 over x in [0, 10]; points every 0.25.
  std::vector<double> x, y;
  for (int i = 0; i <= 40; ++i) {
    x.push_back(i * 0.25);
    y.push_back(i);
  }
  y[9] = NAN;  // x = 2.25: inside column 2, between 2.0 and 2.5
  Decimation d;
  decimate(x, y, 0, 10, 10, d);
  ASSERT_FALSE(d.raw);
  const DecimatedColumn& c2 = d.columns[2];
  ASSERT_TRUE(c2.has_data);
  EXPECT_EQ(c2.y_min, 8);   // x = 2.0
  EXPECT_EQ(c2.y_max, 11);  // x = 2.75: the NaN erased neither neighbour
  EXPECT_TRUE(c2.joins_previous);
  // The gap falls on column 3's entry when the NaN is the last point of column 2.
  y[9] = 9;
  y[11] = NAN;  // x = 2.75, last of column 2
  decimate(x, y, 0, 10, 10, d);
  EXPECT_EQ(d.columns[2].y_last, 10);
  EXPECT_FALSE(d.columns[3].joins_previous);
  EXPECT_TRUE(d.columns[4].joins_previous);
  EXPECT_FALSE(d.columns[0].joins_previous);  // nothing left of x0
}

TEST(Decimate, LinesJoinAcrossEmptyColumnsAndToTheEdges) {
  const std::vector<double> x = {-5, 1, 8, 20};
  const std::vector<double> y = {1, 2, 3, 4};
  Decimation d;
  decimate(x, y, 0, 10, 100, d, /*allow_raw=*/false);
  ASSERT_EQ(d.begin, 1u);
  ASSERT_EQ(d.end, 3u);
  ASSERT_TRUE(d.left.valid);
  EXPECT_EQ(d.left.x, -5);
  ASSERT_TRUE(d.right.valid);
  EXPECT_EQ(d.right.y, 4);
  EXPECT_TRUE(d.columns[10].joins_previous);  // from the left edge point
  EXPECT_TRUE(d.columns[80].joins_previous);  // across 69 empty columns
  // A NaN just outside the range is a gap at that edge.
  const std::vector<double> y_gap = {NAN, 2, 3, NAN};
  decimate(x, y_gap, 0, 10, 100, d, false);
  EXPECT_FALSE(d.left.valid);
  EXPECT_FALSE(d.right.valid);
  EXPECT_FALSE(d.columns[10].joins_previous);
  // A NaN inside, after the last visible point, stops the line reaching the right neighbour.
  const std::vector<double> x4 = {1, 8, 9, 20}, y4 = {1, 2, NAN, 4};
  decimate(x4, y4, 0, 10, 100, d, false);
  EXPECT_FALSE(d.right.valid);
}

TEST(Decimate, FewPointsAreDrawnRaw) {
  const std::vector<double> x = {0, 1, 2, 3, 4}, y = {5, 4, NAN, 2, 1};
  Decimation d;
  decimate(x, y, 0.5, 3.5, 100, d);
  EXPECT_TRUE(d.raw);
  EXPECT_TRUE(d.columns.empty());
  EXPECT_EQ(d.begin, 1u);
  EXPECT_EQ(d.end, 4u);
  EXPECT_EQ(d.y_min, 2);
  EXPECT_EQ(d.y_max, 4);
  EXPECT_TRUE(d.left.valid);
  EXPECT_TRUE(d.right.valid);
  // More points than columns: decimated after all.
  decimate(x, y, 0, 4, 2, d);
  EXPECT_FALSE(d.raw);
  EXPECT_EQ(d.columns.size(), 2u);
}

TEST(Decimate, RangesOutsideTheDataAndDegenerateInputs) {
  const std::vector<double> x = {10, 11, 12}, y = {1, 2, 3};
  Decimation d;
  decimate(x, y, 0, 5, 50, d);  // wholly left of the data
  EXPECT_EQ(d.begin, d.end);
  EXPECT_FALSE(d.has_y);
  EXPECT_FALSE(d.left.valid);
  EXPECT_FALSE(d.right.valid);    // no line reaches x = 10 from anything
  decimate(x, y, 20, 30, 50, d);  // wholly right
  EXPECT_EQ(d.begin, 3u);
  EXPECT_EQ(d.end, 3u);
  EXPECT_TRUE(d.left.valid);
  EXPECT_FALSE(d.right.valid);
  decimate(x, y, 10.2, 10.8, 50, d);  // between two points: the line crosses the whole plot
  EXPECT_EQ(d.begin, d.end);
  EXPECT_TRUE(d.left.valid);
  EXPECT_TRUE(d.right.valid);
  decimate(x, y, 5, 5, 50, d);  // empty range
  EXPECT_TRUE(d.raw);
  EXPECT_EQ(d.begin, d.end);
  decimate(x, y, 0, 100, 0, d);  // no pixels
  EXPECT_EQ(d.begin, d.end);
  decimate(x, y, NAN, 100, 10, d);
  EXPECT_EQ(d.begin, d.end);
  decimate({}, {}, 0, 1, 10, d);
  EXPECT_FALSE(d.has_y);
  // Endpoints are inclusive; the point at x1 lands in the last column.
  decimate(x, y, 10, 12, 2, d, false);
  EXPECT_EQ(d.end - d.begin, 3u);
  EXPECT_EQ(d.columns[1].y_max, 3);
  // All-NaN visible range: no y extent, no data columns.
  const std::vector<double> nan_y = {NAN, NAN, NAN};
  decimate(x, nan_y, 10, 12, 2, d, false);
  EXPECT_FALSE(d.has_y);
  EXPECT_FALSE(d.columns[0].has_data);
}

TEST(Decimate, EqualXValuesShareAColumn) {
  const std::vector<double> x = {0, 1, 1, 1, 2}, y = {0, 5, -5, 2, 0};
  Decimation d;
  decimate(x, y, 0, 2, 4, d, false);
  const DecimatedColumn& c = d.columns[static_cast<size_t>(decimate_column(1, 0, 2, 4))];
  EXPECT_EQ(c.y_min, -5);
  EXPECT_EQ(c.y_max, 5);
  EXPECT_EQ(c.y_first, 5);
  EXPECT_EQ(c.y_last, 2);
}

}  // namespace
}  // namespace gantry::plot
