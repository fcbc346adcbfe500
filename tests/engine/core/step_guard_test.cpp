// The step guard's decision: non-finite values, the spike factor against the window's median, and the
// count of skips in a row.
#include "engine/core/step_guard.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

namespace gantry {
namespace {

using ::testing::HasSubstr;

TEST(StepGuard, NonFiniteLossOrNormIsSkippedWithTheReason) {
  StepGuard g(0, 20, 5);  // spike check off: only non-finite values skip
  const double nan = std::numeric_limits<double>::quiet_NaN(), inf = std::numeric_limits<double>::infinity();
  EXPECT_EQ(g.judge(nan, 1.0).reason, "loss is nan");
  EXPECT_EQ(g.judge(inf, 1.0).reason, "loss is inf");
  EXPECT_EQ(g.judge(2.0, inf).reason, "grad norm inf");
  EXPECT_EQ(g.judge(2.0, nan).reason, "grad norm nan");
  EXPECT_TRUE(g.judge(2.0, nan).skip);
  EXPECT_FALSE(g.judge(1e30, 1e30).skip) << "no spike check when the factor is 0";
  EXPECT_EQ(g.loss_limit(), inf);
}

TEST(StepGuard, SpikeIsJudgedAgainstTheMedianOfAFullWindow) {
  StepGuard g(4, 4, 5);
  for (double l : {2.0, 100.0, 1.0}) {
    EXPECT_FALSE(g.judge(l, 1.0).skip) << "the window is not full yet";
    g.record(l, false);
  }
  EXPECT_EQ(g.loss_limit(), std::numeric_limits<double>::infinity());
  g.record(3.0, false);  // window {2, 100, 1, 3}: median 2.5, limit 10
  EXPECT_EQ(g.loss_limit(), 10.0);
  EXPECT_FALSE(g.judge(10.0, 1.0).skip) << "at the limit is not above it";
  const GuardVerdict v = g.judge(11.0, 1.0);
  EXPECT_TRUE(v.skip);
  EXPECT_EQ(v.reason, "loss 11 is 4.4x the median 2.5 of the last 4 steps");
  // A skipped loss stays out of the window; the oldest updated one leaves it when a new one comes.
  g.record(11.0, true);
  EXPECT_EQ(g.loss_limit(), 10.0);
  g.record(0.5, false);  // window {100, 1, 3, 0.5}: median 2
  EXPECT_EQ(g.loss_limit(), 8.0);
}

TEST(StepGuard, SkipsInARowAreCountedAndAnUpdateResetsThem) {
  StepGuard g(0, 20, 3);
  g.record(1.0, true);
  g.record(1.0, true);
  EXPECT_EQ(g.skips_in_row(), 2);
  EXPECT_FALSE(g.exhausted());
  g.record(1.0, false);
  EXPECT_EQ(g.skips_in_row(), 0);
  for (int i = 0; i < 3; ++i) g.record(1.0, true);
  EXPECT_TRUE(g.exhausted());
  EXPECT_EQ(g.skips_total(), 5);
}

}  // namespace
}  // namespace gantry
