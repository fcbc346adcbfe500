// The band across ranks, built on the network thread as the grid fills: each step's min, median and max of
// the grid's metric and the excess view's band beside; complete steps are final, a step still missing a rank
// is computed again once its cell arrives; a rewind or another grid starts it over.
#include "ui/console/rank_band.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

namespace gantry::console {
namespace {

RankStepRecord cell(int64_t step, int rank, double seconds) {
  return {.step = step, .rank = rank, .total_s = seconds};
}

TEST(RankBand, MinMedianMaxPerStepAndTheExcessBand) {
  RankStepGrid g(RankTimeMetric::kTotal);
  g.add({cell(1, 0, 0.1), cell(1, 1, 0.3), cell(1, 2, 0.2), cell(1, 3, 0.9)});
  g.add({cell(2, 0, 0.5), cell(2, 1, 0.5)});  // ranks 2 and 3 not in yet
  RankBand b;
  b.update(g, 4);
  ASSERT_EQ(b.size(), 2u);
  EXPECT_EQ(b.final_rows, 1u);
  EXPECT_DOUBLE_EQ(b.step[0], 1);
  EXPECT_FLOAT_EQ(static_cast<float>(b.min[0]), 0.1f);
  EXPECT_FLOAT_EQ(static_cast<float>(b.median[0]), 0.25f);
  EXPECT_FLOAT_EQ(static_cast<float>(b.max[0]), 0.9f);
  EXPECT_FLOAT_EQ(static_cast<float>(b.excess_max[0]), 0.65f);
  EXPECT_FLOAT_EQ(static_cast<float>(b.excess_min[0]), -0.15f);
  EXPECT_EQ(b.zero[0], 0);
  EXPECT_FLOAT_EQ(static_cast<float>(b.max[1]), 0.5f);

  // Step 2's late cells: its band is computed again; step 1's is final.
  g.add({cell(2, 2, 0.7), cell(2, 3, 1.5), cell(3, 0, 0.4)});
  b.update(g, 4);
  ASSERT_EQ(b.size(), 3u);
  EXPECT_EQ(b.final_rows, 2u);
  EXPECT_FLOAT_EQ(static_cast<float>(b.max[1]), 1.5f);
  EXPECT_FLOAT_EQ(static_cast<float>(b.median[1]), 0.6f);
  EXPECT_FLOAT_EQ(static_cast<float>(b.median[2]), 0.4f);

  // A rewind drops rows: the band starts over and matches the grid again.
  g.rewind(1);
  b.update(g, 4);
  ASSERT_EQ(b.size(), 1u);
  EXPECT_FLOAT_EQ(static_cast<float>(b.max[0]), 0.9f);

  // Another grid (another metric: phases all 0 here) starts it over too.
  RankStepGrid busy;
  busy.add({cell(5, 0, 1.0)});
  b.update(busy, 1);
  ASSERT_EQ(b.size(), 1u);
  EXPECT_DOUBLE_EQ(b.step[0], 5);
  EXPECT_EQ(b.max[0], 0);
}

TEST(RankBand, StepsWithNoRankAreNaN) {
  RankStepGrid g(RankTimeMetric::kTotal);
  g.add({cell(1, 0, 0.2), cell(3, 0, 0.4)});  // step 2: nobody
  RankBand b;
  b.update(g, 1);
  ASSERT_EQ(b.size(), 3u);
  EXPECT_TRUE(std::isnan(b.median[1]));
  EXPECT_TRUE(std::isnan(b.excess_max[1]));
  EXPECT_EQ(b.final_rows, 1u);
}

}  // namespace
}  // namespace gantry::console
