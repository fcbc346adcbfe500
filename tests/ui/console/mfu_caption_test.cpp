// The MFU plot's words: percent from the records' ratio, "n/a" (and a gap, NaN) where the peak is unknown,
// never 0; the tooltip carries the run's formula and peak.
#include "ui/console/mfu_caption.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>

namespace gantry::console {
namespace {

using ::testing::HasSubstr;

TEST(MfuCaption, UnknownPeakIsAGapAndNaNeverZero) {
  StepLog log;
  log.append({{.step = 1, .loss = 5}, {.step = 2, .loss = 4}});  // no mfu: a CPU without a peak
  const StepColumns& c = log.columns();
  ASSERT_EQ(c.mfu_percent.size(), 2u);
  EXPECT_TRUE(std::isnan(c.mfu_percent[0])) << "an unknown MFU must not plot as 0";
  EXPECT_TRUE(std::isnan(c.mfu_percent[1]));
  const MfuCaption cap = mfu_caption(c, RunView{.name = "cpu run"});
  EXPECT_FALSE(cap.latest_percent.has_value());
  EXPECT_EQ(cap.title, "MFU n/a");
  EXPECT_THAT(cap.tooltip, HasSubstr("train.peak_tflops"));
}

TEST(MfuCaption, PercentAxisAndTheRunsFormulaAndPeak) {
  StepLog log;
  std::vector<StepRecord> rs = {{.step = 1, .mfu = 0.40}, {.step = 2, .mfu = 0.412}, {.step = 3}};
  log.append(rs);
  const StepColumns& c = log.columns();
  EXPECT_DOUBLE_EQ(c.mfu_percent[0], 40.0);
  EXPECT_DOUBLE_EQ(c.mfu_percent[1], 41.2);
  EXPECT_TRUE(std::isnan(c.mfu_percent[2]));
  RunView run;
  run.peak_name = "h100-sxm";
  run.peak_flops = 989e12;
  run.mfu_formula = "MFU = tokens/s x (6N + 6LdT = 8.035e+08 FLOP/token) / peak; peak = h100-sxm 989 TFLOP/s";
  const MfuCaption cap = mfu_caption(c, run);
  ASSERT_TRUE(cap.latest_percent.has_value());
  EXPECT_DOUBLE_EQ(*cap.latest_percent, 41.2);  // the newest known step, past the unknown one
  EXPECT_EQ(cap.title, "MFU 41.2%");
  EXPECT_THAT(cap.tooltip, HasSubstr(run.mfu_formula));
  EXPECT_THAT(cap.tooltip, HasSubstr("peak: h100-sxm 989 TFLOP/s"));
  log.rewind(1);
  EXPECT_EQ(mfu_caption(log.columns(), run).title, "MFU 40.0%");
}

}  // namespace
}  // namespace gantry::console
