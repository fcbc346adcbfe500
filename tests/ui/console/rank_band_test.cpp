// The band from the coordinator's one-row heatmap answer: min, mean and max per bucket and the excess view's
// band (min and max minus the mean); a bucket no rank reported is left out, never drawn as 0.
#include "ui/console/rank_band.h"

#include <gtest/gtest.h>

namespace gantry::console {
namespace {

TEST(RankBand, MinMeanMaxPerBucketAndTheExcessBand) {
  Result<HeatTile> t = heat_tile_from_json({{"first_step", 0},
                                            {"bucket_steps", 4},
                                            {"cols", 3},
                                            {"rows", 1},
                                            {"ranks_per_row", 4},
                                            {"world", 4},
                                            {"last_step", 11},
                                            {"min", {0.1, nullptr, 0.2}},
                                            {"max", {0.9, nullptr, 0.25}},
                                            {"mean", {0.3, nullptr, 0.22}},
                                            {"max_rank", {3, nullptr, 1}}});
  ASSERT_TRUE(t.ok()) << t.error();
  const RankBand b = rank_band_from_tile(t.value(), RankTimeMetric::kForward);
  EXPECT_EQ(b.metric, RankTimeMetric::kForward);
  EXPECT_EQ(b.bucket_steps, 4);
  EXPECT_EQ(b.last_step, 11);
  ASSERT_EQ(b.size(), 2u);  // the empty bucket 4..7 is left out
  EXPECT_EQ(b.step[1], 8);
  EXPECT_FLOAT_EQ(static_cast<float>(b.min[0]), 0.1f);
  EXPECT_FLOAT_EQ(static_cast<float>(b.mean[0]), 0.3f);
  EXPECT_FLOAT_EQ(static_cast<float>(b.max[0]), 0.9f);
  EXPECT_FLOAT_EQ(static_cast<float>(b.excess_max[0]), 0.6f);
  EXPECT_NEAR(b.excess_min[0], -0.2, 1e-6);
  EXPECT_EQ(b.zero[1], 0);
}

}  // namespace
}  // namespace gantry::console
