// The Run panel's view model of a rank's time: busy time by default, the selector's metrics, the excess over
// a step's median rank, and the breakdown table's order (the most excess first), for a synchronous job whose
// step totals are all the same.
#include "ui/console/rank_metric.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "ui/console/step_log.h"

namespace gantry::console {
namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// A dp-4 step where rank `slow` spends 0.25 s in forward and the others wait for it in their collectives.
RankStepRecord synchronous(int32_t rank, int64_t step, int32_t slow) {
  RankStepRecord r;
  r.step = step;
  r.rank = rank;
  r.phases.data_wait = 0.001;
  r.phases.forward = rank == slow ? 0.25 : 0.0125;
  r.phases.backward = 0.025;
  r.phases.optimizer = 0.005;
  r.phases.comm_exposed = rank == slow ? 0.0 : 0.2375;
  r.total_s = 0.2815;
  return r;
}

TEST(RankTimeMetric, BusyIsTheComputePhasesAndEveryMetricHasItsApiName) {
  const RankStepRecord r = synchronous(2, 1, 2);
  EXPECT_DOUBLE_EQ(rank_time_value(r, RankTimeMetric::kBusy), 0.001 + 0.25 + 0.025 + 0.005);
  EXPECT_DOUBLE_EQ(rank_time_value(r, RankTimeMetric::kTotal), 0.2815);
  EXPECT_DOUBLE_EQ(rank_time_value(r, RankTimeMetric::kForward), 0.25);
  EXPECT_DOUBLE_EQ(rank_time_value(r, RankTimeMetric::kCommExposed), 0.0);
  const char* api[] = {"busy",     "total",     "data_wait",    "forward",
                       "backward", "optimizer", "comm_exposed", "checkpoint_stall"};
  for (int k = 0; k < kRankTimeMetricCount; ++k) {
    EXPECT_EQ(rank_time_metric_api_name(static_cast<RankTimeMetric>(k)), api[k]);
    EXPECT_FALSE(rank_time_metric_label(static_cast<RankTimeMetric>(k)).empty());
  }
}

TEST(RankTimeMetric, ExcessOverTheStepsMedianKeepsMissingCells) {
  std::vector<float> row = {0.05f, kNaN, 0.29f, 0.05f, 0.07f};
  EXPECT_NEAR(excess_over_median(row), 0.06, 1e-7);
  EXPECT_NEAR(row[0], -0.01, 1e-6);
  EXPECT_TRUE(std::isnan(row[1]));
  EXPECT_NEAR(row[2], 0.23, 1e-6);
  EXPECT_NEAR(row[4], 0.01, 1e-6);
  std::vector<float> none = {kNaN, kNaN};
  EXPECT_TRUE(std::isnan(excess_over_median(none)));
  EXPECT_TRUE(std::isnan(none[0]));
}

TEST(RankTimeMetric, TheChosenMetricShowsTheSlowRank) {
  for (int64_t s = 1; s <= 3; ++s) {
    std::vector<RankStepRecord> records;
    for (int32_t k = 0; k < 4; ++k) records.push_back(synchronous(k, s, 2));
    for (int32_t k = 0; k < 4; ++k) {
      EXPECT_FLOAT_EQ(static_cast<float>(rank_time_value(records[k], RankTimeMetric::kTotal)),
                      0.2815f);  // nothing to see on total
      EXPECT_FLOAT_EQ(static_cast<float>(rank_time_value(records[k], RankTimeMetric::kForward)),
                      k == 2 ? 0.25f : 0.0125f);
      if (k != 2) {
        EXPECT_GT(rank_time_value(records[2], RankTimeMetric::kBusy),
                  rank_time_value(records[k], RankTimeMetric::kBusy) + 0.2);
      }
    }
  }
}

TEST(RankTimeMetric, BreakdownSortsByExcessNotByTotal) {
  std::vector<RankStepRecord> latest;
  for (int32_t k = 0; k < 6; ++k) latest.push_back(synchronous(k, 9, 3));
  latest[1].phases.backward = 0.035;  // a little slower than the median
  latest[4].step = 0;                 // has not reported: left out
  latest[5].total_s = 9.0;            // rank 5 is no longer placed (world 5): left out
  const std::vector<BreakdownRow> rows = breakdown_rows(latest, 5, RankTimeMetric::kBusy);
  ASSERT_EQ(rows.size(), 4u);
  EXPECT_EQ(rows[0].record->rank, 3);
  // Busy times 0.0435 (ranks 0, 2), 0.0535 (rank 1), 0.281 (rank 3): their median is 0.0485.
  EXPECT_NEAR(rows[0].excess, 0.281 - 0.0485, 1e-6);
  EXPECT_EQ(rows[1].record->rank, 1);
  EXPECT_NEAR(rows[1].excess, 0.005, 1e-6);
  EXPECT_EQ(rows[2].record->rank, 0);  // ties in rank order
  EXPECT_EQ(rows[3].record->rank, 2);
  EXPECT_NEAR(rows[3].excess, -0.005, 1e-6);
  // On comm_exposed the slow rank is the one that waits least.
  EXPECT_EQ(breakdown_rows(latest, 5, RankTimeMetric::kCommExposed).back().record->rank, 3);
}

}  // namespace
}  // namespace gantry::console
