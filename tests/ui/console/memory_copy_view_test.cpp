// The Checkpoints panel's in-memory copies line (ui/console/memory_copy_view.h): the newest complete set,
// each rank's own node and its peers from the run's placement, and "—" when there is none.
#include "ui/console/memory_copy_view.h"

#include <gtest/gtest.h>

namespace gantry::console {
namespace {

using json = nlohmann::json;

const std::vector<ShareView> kPlacement = {{.node = "node-0", .first_rank = 0, .ranks = 2},
                                           {.node = "node-1", .first_rank = 2, .ranks = 2}};

TEST(MemoryCopyView, NoCompleteSetIsADash) {
  EXPECT_EQ(memory_copy_text(memory_copy_view(json::array(), kPlacement)), "\u2014");
  EXPECT_EQ(memory_copy_text(memory_copy_view(json(nullptr), kPlacement)), "\u2014");
  // A set some rank lacks is not one a recovery could restore from.
  const json partial =
      json::parse(R"([{"step":8,"world":4,"complete":false,"ranks":[{"rank":0,"nodes":["node-0"]}]}])");
  const MemoryCopyView v = memory_copy_view(partial, kPlacement);
  EXPECT_FALSE(v.step.has_value());
  EXPECT_EQ(memory_copy_text(v), "\u2014");
}

TEST(MemoryCopyView, TheNewestCompleteSetWithEachShardsNodeAndPeer) {
  const json copies = json::parse(R"([
    {"step":10,"world":4,"complete":false,"ranks":[{"rank":0,"nodes":["node-0"]}]},
    {"step":6,"world":4,"complete":true,"ranks":[{"rank":0,"nodes":["node-0"]}]},
    {"step":8,"world":4,"complete":true,"ranks":[
      {"rank":2,"nodes":["node-0","node-1"]},{"rank":0,"nodes":["node-0","node-1"]},
      {"rank":1,"nodes":["node-0"]},{"rank":3,"nodes":["node-0"]}]}])");
  const MemoryCopyView v = memory_copy_view(copies, kPlacement);
  ASSERT_TRUE(v.step.has_value());
  EXPECT_EQ(*v.step, 8);
  ASSERT_EQ(v.shards.size(), 4u);
  EXPECT_EQ(v.shards[0].node, "node-0");
  EXPECT_EQ(v.shards[0].peers, std::vector<std::string>{"node-1"});
  EXPECT_EQ(v.shards[2].node, "node-1");
  EXPECT_EQ(v.shards[2].peers, std::vector<std::string>{"node-0"});
  EXPECT_TRUE(v.shards[1].peers.empty());
  EXPECT_EQ(v.shards[3].node, "");  // rank 3's own node (node-1) no longer holds it
  EXPECT_EQ(
      memory_copy_text(v),
      "step 8: rank 0 node-0 + peer node-1, rank 1 node-0 (no peer copy yet), rank 2 node-1 + peer node-0, "
      "rank 3 not on its node + peer node-0");
}

}  // namespace
}  // namespace gantry::console
