// The Quarantine button's guard: offered only for a node with a flagged rank or with the override, never
// for the last healthy node or one quarantined already; the runs and ranks that would move are named.
#include "ui/console/quarantine_plan.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace gantry::console {
namespace {

using ::testing::HasSubstr;

ConsoleSnapshot two_nodes() {
  ConsoleSnapshot s;
  s.connected = true;
  s.nodes = {{.id = "node-0", .state = "healthy", .slots = 2, .runs = {3}},
             {.id = "node-1", .state = "healthy", .slots = 2, .runs = {3, 5}}};
  s.run.id = 3;
  s.run.name = "tiny";
  s.run.placement = {{.node = "node-0", .first_rank = 0, .ranks = 2, .slots = {0, 1}},
                     {.node = "node-1", .first_rank = 2, .ranks = 2, .slots = {0, 1}}};
  for (int r = 0; r < 4; ++r) {
    RankView v;
    v.rank = r;
    v.node = r < 2 ? "node-0" : "node-1";
    s.ranks.push_back(v);
  }
  return s;
}

TEST(QuarantinePlan, DisabledWithNothingFlaggedUnlessOverriddenAndNamesWhatMoves) {
  ConsoleSnapshot s = two_nodes();
  QuarantinePlan p = quarantine_plan(s, "node-1", false);
  EXPECT_FALSE(p.enabled);
  EXPECT_THAT(p.why_not, HasSubstr("no rank on node-1 is flagged"));
  ASSERT_EQ(p.moves.size(), 2u);
  EXPECT_EQ(p.moves[0], "run 3 (tiny): ranks 2-3 checkpoint, stop and resume without node-1");
  EXPECT_THAT(p.moves[1], HasSubstr("run 5: its ranks on node-1"));
  EXPECT_TRUE(quarantine_plan(s, "node-1", true).enabled);
}

TEST(QuarantinePlan, EnabledForAFlaggedRanksNodeOnly) {
  ConsoleSnapshot s = two_nodes();
  s.ranks[2].score = 0.3;
  s.ranks[2].flagged = true;
  EXPECT_TRUE(quarantine_plan(s, "node-1", false).enabled);
  EXPECT_TRUE(quarantine_plan(s, "node-1", false).flagged);
  EXPECT_FALSE(quarantine_plan(s, "node-0", false).enabled);
}

TEST(QuarantinePlan, NeverTheLastHealthyNodeNorOneQuarantinedAlready) {
  ConsoleSnapshot s = two_nodes();
  s.nodes[1].state = "quarantined";
  QuarantinePlan p = quarantine_plan(s, "node-0", true);
  EXPECT_FALSE(p.enabled);
  EXPECT_THAT(p.why_not, HasSubstr("node-0 is the last healthy node"));
  p = quarantine_plan(s, "node-1", true);
  EXPECT_FALSE(p.enabled);
  EXPECT_THAT(p.why_not, HasSubstr("quarantined already"));
  s.connected = false;
  EXPECT_EQ(quarantine_plan(s, "node-0", true).why_not, "not connected");
}

}  // namespace
}  // namespace gantry::console
