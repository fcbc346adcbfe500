// The Stragglers list: flagged ranks first, then the most excess time (over the median rank's) first,
// unknown last, ties in rank order; without the coordinator's scores, the latest busy time (else step time)
// against the fastest and the median rank's.
#include "ui/console/stragglers.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

namespace gantry::console {
namespace {

std::vector<int32_t> order(const std::vector<StragglerRow>& rows) {
  std::vector<int32_t> out;
  for (const StragglerRow& r : rows) out.push_back(r.rank);
  return out;
}

RankView scored(int32_t rank, const char* node, double score, bool flagged, const char* phase = "") {
  return {.rank = rank,
          .node = node,
          .step_seconds = 0.1 / score,
          .score = score,
          .individual = 1.0,
          .flagged = flagged,
          .slow_phase = phase};
}

TEST(StragglerRows, FlaggedFirstThenSlowestThenRank) {
  const std::vector<RankView> ranks = {scored(0, "node-0", 1.0, false), scored(1, "node-0", 0.8, false),
                                       scored(2, "node-1", 0.95, true, "forward"),
                                       scored(3, "node-1", 0.8, false),
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
  for (int k = 0; k < 4; ++k)
    ranks[static_cast<size_t>(k)] = {.rank = k, .node = "n", .step_seconds = seconds[k]};
  const std::vector<StragglerRow> rows = straggler_rows(ranks);
  EXPECT_EQ(order(rows), (std::vector<int32_t>{1, 3, 0, 2}));
  EXPECT_DOUBLE_EQ(rows[0].score, 0.5);
  EXPECT_FALSE(rows[0].flagged);
  EXPECT_FALSE(rows[0].scored_by_coordinator);
  EXPECT_TRUE(std::isnan(rows[3].score));
  EXPECT_TRUE(straggler_nodes(rows).empty());
}

TEST(StragglerRows, MixedScoredAndUnscoredRanksAndStableTies) {
  std::vector<RankView> ranks = {
      scored(3, "b", 0.9, false), scored(1, "a", 0.9, false), {.rank = 0, .node = "a", .step_seconds = 0}};
  EXPECT_EQ(order(straggler_rows(ranks)), (std::vector<int32_t>{1, 3, 0}));
  EXPECT_TRUE(straggler_rows({}).empty());
}

// The straggler of a synchronous job: every rank's step time is the same, so the list goes by busy time: the
// coordinator's excess (over its scoring window) where it gives one, the latest busy time's otherwise, and
// the row shows the coordinator's words ("forward +0.24 s"), the same `ctl ranks` prints.
TEST(StragglerRows, SortsByExcessTimeNotStepTime) {
  std::vector<RankView> ranks;
  for (int k = 0; k < 4; ++k) {
    ranks.push_back(
        {.rank = k, .node = "n" + std::to_string(k / 2), .step_seconds = 0.30, .busy_seconds = 0.05});
  }
  ranks[1].busy_seconds = 0.07;
  ranks[2].busy_seconds = 0.29;  // rank 2: the others wait 0.24 s for it in their collectives
  ranks[2].step_seconds = 0.29;  // and its step is even a little shorter
  std::vector<StragglerRow> rows = straggler_rows(ranks);
  EXPECT_EQ(order(rows), (std::vector<int32_t>{2, 1, 0, 3}));
  EXPECT_NEAR(rows[0].excess_s, 0.23, 1e-9);  // over the median of 0.05, 0.05, 0.07, 0.29
  EXPECT_EQ(rows[0].excess, "busy +0.23 s");
  EXPECT_FALSE(rows[0].flagged);
  EXPECT_NEAR(rows[0].score, 0.05 / 0.29, 1e-9);  // scored on busy time: the slow rank scores lowest

  // The coordinator's scores: its excess and words win over the latest step's.
  for (RankView& r : ranks) {
    r.score = 1.0;
    r.excess_s = 0.0;
    r.excess = "-";
  }
  ranks[1].excess_s = 0.30;
  ranks[1].excess = "backward +0.30 s";
  ranks[2].excess_s = 0.24;
  ranks[2].excess = "forward +0.24 s";
  ranks[2].flagged = true;
  ranks[2].slow_phase = "forward";
  rows = straggler_rows(ranks);
  EXPECT_EQ(order(rows), (std::vector<int32_t>{2, 1, 0, 3}));  // flagged first, then by excess
  EXPECT_EQ(rows[0].excess, "forward +0.24 s");
  EXPECT_DOUBLE_EQ(rows[0].excess_s, 0.24);
  EXPECT_EQ(rows[1].excess, "backward +0.30 s");
  EXPECT_EQ(rows[2].excess, "-");
}

}  // namespace
}  // namespace gantry::console
