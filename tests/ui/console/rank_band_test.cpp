// The band from the coordinator's bucketed answer (GET /v1/runs/{id}/steps?buckets=N&metric=M): min, mean and
// max per bucket and the excess view's band (min and max minus the mean); a malformed answer is an error.
#include "ui/console/rank_band.h"

#include <gtest/gtest.h>

namespace gantry::console {
namespace {

TEST(RankBand, MinMeanMaxPerBucketAndTheExcessBand) {
  const nlohmann::json answer = {{"bucket_steps", 4},
                                 {"metric", "forward"},
                                 {"rank_seconds",
                                  {{{"step_begin", 0},
                                    {"step_end", 4},
                                    {"count", 12},
                                    {"min", 0.1},
                                    {"max", 0.9},
                                    {"max_rank", 3},
                                    {"mean", 0.3},
                                    {"last", 0.2}},
                                   {{"step_begin", 8},
                                    {"step_end", 12},
                                    {"count", 4},
                                    {"min", 0.2},
                                    {"max", 0.25},
                                    {"max_rank", 1},
                                    {"mean", 0.22},
                                    {"last", 0.2}}}}};
  Result<RankBand> b = rank_band_from_json(answer, RankTimeMetric::kForward);
  ASSERT_TRUE(b.ok()) << b.error();
  EXPECT_EQ(b->metric, RankTimeMetric::kForward);
  EXPECT_EQ(b->bucket_steps, 4);
  ASSERT_EQ(b->size(), 2u);  // the empty bucket 4..7 is left out, not drawn as 0
  EXPECT_EQ(b->step[1], 8);
  EXPECT_DOUBLE_EQ(b->min[0], 0.1);
  EXPECT_DOUBLE_EQ(b->mean[0], 0.3);
  EXPECT_DOUBLE_EQ(b->max[0], 0.9);
  EXPECT_DOUBLE_EQ(b->excess_max[0], 0.6);
  EXPECT_NEAR(b->excess_min[0], -0.2, 1e-12);
  EXPECT_EQ(b->zero[1], 0);
}

TEST(RankBand, AMalformedAnswerIsAnError) {
  Result<RankBand> b =
      rank_band_from_json({{"bucket_steps", 1}, {"rank_seconds", {{{"min", 1}}}}}, RankTimeMetric::kBusy);
  ASSERT_FALSE(b.ok());
  EXPECT_NE(b.error().find("band"), std::string::npos) << b.error();
}

}  // namespace
}  // namespace gantry::console
