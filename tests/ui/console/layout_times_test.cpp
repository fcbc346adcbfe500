// The 3D layout view (layout_times.h): coordinates as text, a stage's and a tp group's time is its slowest
// rank's, the slowest group is marked (only where two or more have a time), and a group with no step yet is
// unknown rather than 0.
#include "ui/console/layout_times.h"

#include <gtest/gtest.h>

namespace gantry::console {
namespace {

// A rank of tp 2 x pp 2 x dp 1 with a latest busy time (none: not stepped yet).
RankView rank_of(int32_t rank, std::optional<double> busy) {
  RankView r;
  r.rank = rank;
  r.coord = RankView::Coord{.dp = rank / 4, .pp = (rank / 2) % 2, .tp = rank % 2};
  if (busy) {
    r.last_step = 5;
    r.latest.step = 5;
    r.busy_seconds = *busy;
  }
  return r;
}

TEST(LayoutTimes, StagesAndTpGroupsTakeTheirSlowestRank) {
  const std::vector<RankView> ranks = {rank_of(0, 0.10), rank_of(1, 0.12), rank_of(2, 0.30),
                                       rank_of(3, 0.20)};
  EXPECT_EQ(rank_coord_text(ranks[3]), "0,1,1");
  const LayoutTimes t = layout_times(ranks);
  EXPECT_EQ(t.tp, 2);
  EXPECT_EQ(t.pp, 2);
  ASSERT_EQ(t.stages.size(), 2u);
  EXPECT_EQ(t.stages[0].name(), "stage 0");
  EXPECT_EQ(t.stages[0].ranks, (std::vector<int32_t>{0, 1}));
  EXPECT_DOUBLE_EQ(*t.stages[0].busy_s, 0.12);
  EXPECT_EQ(t.stages[0].slowest_rank, 1);
  EXPECT_FALSE(t.stages[0].slowest);
  EXPECT_DOUBLE_EQ(*t.stages[1].busy_s, 0.30);
  EXPECT_EQ(t.stages[1].slowest_rank, 2);
  EXPECT_TRUE(t.stages[1].slowest);
  // dp 1: one tp group per stage, the same ranks.
  ASSERT_EQ(t.tp_groups.size(), 2u);
  EXPECT_EQ(t.tp_groups[1].name(), "tp group dp 0 pp 1");
  EXPECT_TRUE(t.tp_groups[1].slowest);
}

TEST(LayoutTimes, AGroupWithoutAStepIsUnknownAndNoneIsSlowestAlone) {
  const LayoutTimes t =
      layout_times({rank_of(0, 0.1), rank_of(1, 0.1), rank_of(2, std::nullopt), rank_of(3, std::nullopt)});
  ASSERT_EQ(t.stages.size(), 2u);
  EXPECT_FALSE(t.stages[1].busy_s.has_value());
  EXPECT_EQ(t.stages[1].slowest_rank, -1);
  EXPECT_FALSE(t.stages[0].slowest) << "one timed stage is not 'the slowest'";
}

TEST(LayoutTimes, ADataParallelRunHasNoGroupsAndNoCoordinatesMeansNone) {
  std::vector<RankView> dp(4);
  for (int k = 0; k < 4; ++k) {
    dp[static_cast<size_t>(k)].rank = k;
    dp[static_cast<size_t>(k)].coord = RankView::Coord{.dp = k};
  }
  const LayoutTimes t = layout_times(dp);
  EXPECT_TRUE(t.stages.empty());
  EXPECT_TRUE(t.tp_groups.empty());
  RankView old;  // from a coordinator that sends no "coord"
  EXPECT_EQ(rank_coord_text(old), "");
  EXPECT_TRUE(layout_times({old}).stages.empty());
}

}  // namespace
}  // namespace gantry::console
