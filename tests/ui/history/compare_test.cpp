// Run comparison's view model (issue 21): TensorBoard's debiased EMA, the log transform, and curves of any
// step metric aligned by step or by time, from a real history file.
#include "ui/history/compare.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "tests/scratch_dir.h"
#include "ui/history/history_model.h"
#include "ui/plot/plot_widget.h"

namespace gantry::history {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

TEST(Compare, EmaIsTensorBoardsDebiasedAverage) {
  const std::vector<double> y = {1, 2, 3};
  const std::vector<double> s = ema_smooth(y, 0.5);
  ASSERT_EQ(s.size(), 3u);
  // last: 0.5, 1.25, 2.125; debias: 0.5, 0.75, 0.875.
  EXPECT_DOUBLE_EQ(s[0], 1.0) << "debiased: the first value is itself, not pulled towards 0";
  EXPECT_DOUBLE_EQ(s[1], 1.25 / 0.75);
  EXPECT_DOUBLE_EQ(s[2], 2.125 / 0.875);
  EXPECT_EQ(ema_smooth(y, 0), y) << "weight 0: no smoothing";
  // A constant stays constant at any weight.
  for (double v : ema_smooth(std::vector<double>(50, 3.5), 0.99)) EXPECT_NEAR(v, 3.5, 1e-12);
}

TEST(Compare, EmaPassesGapsThroughWithoutMovingTheAverage) {
  const std::vector<double> s = ema_smooth(std::vector<double>{1, kNaN, 3}, 0.5);
  EXPECT_DOUBLE_EQ(s[0], 1);
  EXPECT_TRUE(std::isnan(s[1]));
  EXPECT_DOUBLE_EQ(s[2], (0.5 * 0.5 + 0.5 * 3) / 0.75) << "the NaN did not count as a value";
  const std::vector<double> inf = ema_smooth(std::vector<double>{2, INFINITY, 2}, 0.9);
  EXPECT_TRUE(std::isinf(inf[1]));
  EXPECT_NEAR(inf[2], 2, 1e-12);
}

TEST(Compare, LogScaleLeavesGapsForWhatHasNoLogarithm) {
  const std::vector<double> l = log10_values(std::vector<double>{100, 0, -1, kNaN, 0.01});
  EXPECT_DOUBLE_EQ(l[0], 2);
  EXPECT_TRUE(std::isnan(l[1]));
  EXPECT_TRUE(std::isnan(l[2]));
  EXPECT_TRUE(std::isnan(l[3]));
  EXPECT_DOUBLE_EQ(l[4], -2);
}

TEST(Compare, LinkedZoomCopiesTheXRange) {
  plot::PlotView a, b;
  a.x_min = 10;
  a.x_max = 20;
  a.fit_x = false;
  link_x(a, b);
  EXPECT_EQ(b.x_min, 10);
  EXPECT_EQ(b.x_max, 20);
  EXPECT_FALSE(b.fit_x);
}

TEST(Compare, RunsAlignByStepOrByTimeOnAnyMetric) {
  const std::string path = (testing_support::scratch_dir("compare_align") / "h.sqlite").string();
  std::string error;
  std::unique_ptr<HistoryDb> db = HistoryDb::open(path, {}, &error);
  ASSERT_TRUE(db) << error;
  // Run a: 2 s a step from t = 1000; run b: 1 s a step from t = 5000 (started later, twice as fast).
  int64_t runs[2];
  for (int k = 0; k < 2; ++k) {
    RunInfo info;
    info.name = k == 0 ? "slow" : "fast";
    info.world_size = 1;
    info.created_unix_s = k == 0 ? 1000 : 5000;
    runs[k] = db->begin_run(info);
    ASSERT_GE(runs[k], 0) << db->error();
    RecordBatch b;
    for (int64_t s = 0; s < 10; ++s) {
      StepRecord r;
      r.run_id = runs[k];
      r.step = s;
      r.time_unix_s = (k == 0 ? 1000 + 2.0 * s : 5000 + 1.0 * s);
      r.loss = 5 - 0.1 * s;
      r.grad_norm = 1 + s + 10 * k;
      b.steps.push_back(r);
    }
    ASSERT_TRUE(db->ingest(b)) << db->error();
  }
  db.reset();

  HistoryModel m;
  ASSERT_TRUE(m.open(path).ok()) << m.error();
  ASSERT_TRUE(m.select(runs[0]));
  ASSERT_TRUE(m.select(runs[1]));
  m.set_metrics(StepMetric::grad_norm, StepMetric::loss);
  EXPECT_TRUE(m.overlay(0)[0].time_s.empty()) << "by step, no times are read";
  m.set_axis(CompareAxis::kTime);
  ASSERT_EQ(m.overlay(0).size(), 2u);
  ASSERT_EQ(m.overlay(1).size(), 2u);
  const OverlaySeries& a = m.overlay(0)[0];
  const OverlaySeries& b = m.overlay(0)[1];
  ASSERT_EQ(a.step.size(), 10u);
  ASSERT_EQ(b.step.size(), 10u);
  for (size_t i = 0; i < 10; ++i) {
    // By step: the same x for both runs.
    EXPECT_EQ(a.x(CompareAxis::kStep)[i], static_cast<double>(i));
    EXPECT_EQ(b.x(CompareAxis::kStep)[i], static_cast<double>(i));
    // By time: seconds since each run's first step record.
    EXPECT_DOUBLE_EQ(a.x(CompareAxis::kTime)[i], 2.0 * static_cast<double>(i));
    EXPECT_DOUBLE_EQ(b.x(CompareAxis::kTime)[i], static_cast<double>(i));
    // The metric asked for: grad norm; the second metric: loss.
    EXPECT_DOUBLE_EQ(a.loss[i], 1.0 + static_cast<double>(i));
    EXPECT_DOUBLE_EQ(b.loss[i], 11.0 + static_cast<double>(i));
    EXPECT_DOUBLE_EQ(m.overlay(1)[0].loss[i], 5 - 0.1 * static_cast<double>(i));
  }
  // More than two runs are compared (the old overlay dropped the earliest at a third).
  EXPECT_GE(kMaxSelected, 3u);
}

}  // namespace
}  // namespace gantry::history
