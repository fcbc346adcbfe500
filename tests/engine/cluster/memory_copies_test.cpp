// The coordinator's ledger of in-memory copies on hand-built reports: complete sets, lost nodes, the
// ring's pulls, and the memory-or-disk choice at a recovery.
#include "engine/cluster/memory_copies.h"

#include <gtest/gtest.h>

#include <climits>

namespace gantry {
namespace {

MemoryCopyHeld held(int rank, int64_t step, int world = 2, int64_t run = 7) {
  return {.run = run, .rank = rank, .step = step, .world = world};
}

TEST(MemoryCopies, TheNewestSetEveryRankHoldsIsComplete) {
  MemoryCopyTable t;
  // node-0 holds rank 0 at steps 10 and 20 (a write at 20 done), node-1 rank 1 only at 10 (cut off).
  t.report("node-0", {held(0, 10), held(0, 20)});
  t.report("node-1", {held(1, 10)});
  std::optional<MemoryCopySet> s = t.newest_complete(7, INT64_MAX);
  ASSERT_TRUE(s.has_value());
  EXPECT_EQ(s->step, 10);
  EXPECT_EQ(s->world, 2);
  EXPECT_EQ(s->holders.at(0), std::vector<std::string>{"node-0"});
  EXPECT_EQ(s->holders.at(1), std::vector<std::string>{"node-1"});
  EXPECT_FALSE(t.newest_complete(7, 9).has_value());          // bounded: nothing at or before 9
  EXPECT_FALSE(t.newest_complete(8, INT64_MAX).has_value());  // another run
  const std::vector<MemoryCopySet> all = t.all(7);
  ASSERT_EQ(all.size(), 2u);
  EXPECT_EQ(all[0].step, 20);  // newest first, incomplete included
  EXPECT_EQ(all[0].holders.count(1), 0u);
}

TEST(MemoryCopies, ALostNodesCopiesAreGoneButItsPeersCopySurvives) {
  MemoryCopyTable t;
  t.report("node-0", {held(0, 20), held(1, 20)});  // its own rank 0 and node-1's rank 1, pulled
  t.report("node-1", {held(1, 20), held(0, 20)});
  t.forget_node("node-1");
  std::optional<MemoryCopySet> s = t.newest_complete(7, INT64_MAX);
  ASSERT_TRUE(s.has_value());
  EXPECT_EQ(s->step, 20);
  EXPECT_EQ(s->holders.at(1), std::vector<std::string>{"node-0"});
  t.forget_node("node-0");
  EXPECT_FALSE(t.newest_complete(7, INT64_MAX).has_value());
  // A report replaces the node's last one whole: an empty one forgets it.
  t.report("node-2", {held(0, 5, 1)});
  EXPECT_EQ(t.runs_on("node-2"), std::vector<int64_t>{7});
  t.report("node-2", {});
  EXPECT_TRUE(t.runs_on("node-2").empty());
}

TEST(MemoryCopies, EachRanksNewestCopyIsWantedOnTheNextNodeOfTheRing) {
  MemoryCopyTable t;
  t.report("node-0", {held(0, 10, 3), held(0, 20, 3), held(1, 20, 3)});
  t.report("node-1", {held(2, 20, 3), held(1, 10, 3)});
  const std::vector<std::string> ring = {"node-0", "node-1"};
  const std::map<int, std::string> placed = {{0, "node-0"}, {1, "node-0"}, {2, "node-1"}};
  const std::vector<MemoryCopyPull> want = {
      {.to = "node-1", .from = "node-0", .run = 7, .rank = 0, .step = 20},
      {.to = "node-1", .from = "node-0", .run = 7, .rank = 1, .step = 20},
      {.to = "node-0", .from = "node-1", .run = 7, .rank = 2, .step = 20},
  };
  EXPECT_EQ(t.pulls(7, ring, placed), want);
  // Once taken, nothing more; a ring of one node has no peer to take them.
  t.report("node-1", {held(2, 20, 3), held(0, 20, 3), held(1, 20, 3)});
  t.report("node-0", {held(0, 20, 3), held(1, 20, 3), held(2, 20, 3)});
  EXPECT_TRUE(t.pulls(7, ring, placed).empty());
  EXPECT_TRUE(t.pulls(7, {"node-0"}, placed).empty());
}

TEST(MemoryCopies, MemoryWinsOnlyWhenCompleteAndNewerThanDisk) {
  MemoryCopySet set{.step = 20, .world = 2, .holders = {{0, {"node-0"}}, {1, {"node-0"}}}};
  RestoreChoice c = restore_choose(set, 10, 20);
  EXPECT_EQ(c.source, RestoreSource::kMemory);
  EXPECT_EQ(c.step, 20);
  c = restore_choose(set, 20, 20);  // as new as disk: the durable one
  EXPECT_EQ(c.source, RestoreSource::kDisk);
  EXPECT_EQ(c.step, 20);
  c = restore_choose(std::nullopt, 10, 25);  // newer copies, but a rank's were all lost
  EXPECT_EQ(c.source, RestoreSource::kDisk);
  EXPECT_EQ(c.step, 10);
  EXPECT_NE(c.why.find("incomplete"), std::string::npos) << c.why;
  c = restore_choose(std::nullopt, -1, -1);
  EXPECT_EQ(c.source, RestoreSource::kStart);
  EXPECT_STREQ(restore_source_name(RestoreSource::kMemory), "memory");
  EXPECT_STREQ(restore_source_name(RestoreSource::kDisk), "disk");
}

}  // namespace
}  // namespace gantry
