// The Stragglers list: flagged ranks first, then slowest (lowest score) first, unknown scores last, ties
// in rank order; without the coordinator's scores, the latest step time against the fastest rank's.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "ui/console/stragglers.h"

namespace gantry::console {
namespace {

std::vector<int32_t> order(const std::vector<StragglerRow>& rows) {
  std::vector<int32_t> out;
  for (const StragglerRow& r : rows) out.push_back(r.rank);
  return out;
}

RankView scored(int32_t rank, const char* node, double score, bool flagged, const char* phase = "") {
  return {.rank = rank, .node = node, .step_seconds = 0.1 / score, .score = score, .individual = 1.0,
          .flagged = flagged, .slow_phase = phase};
}

TEST(StragglerRows, FlaggedFirstThenSlowestThenRank) {
  const std::vector<RankView> ranks = {scored(0, "node-0", 1.0, false),        scored(1, "node-0", 0.8, false),
                                       scored(2, "node-1", 0.95, true, "forward"), scored(3, "node-1", 0.8, false),
                                       scored(4, "node-2", 0.6, true, "comm_exposed")};
  const std::vector<StragglerRow> rows = straggler_rows(ranks);
  EXPECT_EQ(order(rows), (std::vector<int32_t>{4, 2, 1, 3, 0}));
  EXPECT_EQ(rows[0].slow_phase, "comm_exposed");
  EXPECT_TRUE(rows[0].scored_by_coordinator);
  EXPECT_EQ(straggler_nodes(rows), (std::vector<std::string>{"node-2", "node-1"}));
}

TEST(StragglerRows, UnscoredRanksFallBackToTheLatestStepAndNeverFlag) {
  std::vector<RankView> ranks(4);
  const double seconds[] = {0.10, 0.20, 0.0, 0.12};  // rank 2 has not reported a step
  for (int k = 0; k < 4; ++k) ranks[static_cast<size_t>(k)] = {.rank = k, .node = "n", .step_seconds = seconds[k]};
  const std::vector<StragglerRow> rows = straggler_rows(ranks);
  EXPECT_EQ(order(rows), (std::vector<int32_t>{1, 3, 0, 2}));
  EXPECT_DOUBLE_EQ(rows[0].score, 0.5);
  EXPECT_FALSE(rows[0].flagged);
  EXPECT_FALSE(rows[0].scored_by_coordinator);
  EXPECT_TRUE(std::isnan(rows[3].score));
  EXPECT_TRUE(straggler_nodes(rows).empty());
}

TEST(StragglerRows, MixedScoredAndUnscoredRanksAndStableTies) {
  std::vector<RankView> ranks = {scored(3, "b", 0.9, false), scored(1, "a", 0.9, false),
                                 {.rank = 0, .node = "a", .step_seconds = 0}};
  EXPECT_EQ(order(straggler_rows(ranks)), (std::vector<int32_t>{1, 3, 0}));
  EXPECT_TRUE(straggler_rows({}).empty());
}

}  // namespace
}  // namespace gantry::console
