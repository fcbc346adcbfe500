// Gang placement: the rules of issue 6 (all or nothing, tp groups inside a node, rank order as
// ParallelDims, quarantined and lost nodes never, spares last), the refusal messages, and a randomised
// check of every invariant against a brute-force count of what fits.
#include "engine/cluster/placement.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <map>
#include <random>
#include <set>

namespace gantry {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

std::vector<PlacementNode> uniform(int count, int slots, const std::string& prefix = "node-") {
  std::vector<PlacementNode> nodes;
  for (int i = 0; i < count; ++i) nodes.push_back({.id = prefix + std::to_string(i), .slots = slots});
  return nodes;
}

// Every invariant a placement must hold, whatever the input; returns "" or the first violation.
std::string check_invariants(const std::vector<PlacementNode>& nodes, const GangLayout& l,
                             const Placement& p) {
  const int world = l.dp * l.tp * l.pp;
  if (static_cast<int>(p.ranks.size()) != world) return "rank count " + std::to_string(p.ranks.size());
  std::map<int, std::set<int>> used;  // node -> slots
  for (int r = 0; r < world; ++r) {
    const PlacedRank& pr = p.ranks[r];
    if (pr.node < 0 || pr.node >= static_cast<int>(nodes.size()))
      return "rank " + std::to_string(r) + ": bad node";
    const PlacementNode& n = nodes[pr.node];
    if (n.state == NodeState::quarantined || n.state == NodeState::lost || n.state == NodeState::unhealthy)
      return "rank on a " + n.id + " excluded node";
    if (pr.slot < 0 || pr.slot >= n.slots) return "slot out of range";
    for (int b : n.busy) {
      if (b == pr.slot) return "rank " + std::to_string(r) + " on a busy slot";
    }
    if (!used[pr.node].insert(pr.slot).second) return "slot used twice";
    // tp group = ranks sharing r / tp: all on one node.
    const int first_of_group = r - r % l.tp;
    if (p.ranks[first_of_group].node != pr.node) return "tp group of rank " + std::to_string(r) + " split";
  }
  // Ranks are consecutive per node, local ranks count from 0, and nodes lists them in rank order.
  int next = 0;
  for (const PlacedNode& pn : p.nodes) {
    if (pn.first_rank != next) return "nodes not in rank order";
    for (int i = 0; i < pn.ranks; ++i) {
      if (p.ranks[pn.first_rank + i].node != pn.node) return "node's ranks not consecutive";
      if (p.ranks[pn.first_rank + i].local_rank != i) return "local rank out of order";
    }
    if (pn.spare != (nodes[pn.node].state == NodeState::spare)) return "spare flag wrong";
    next += pn.ranks;
  }
  if (next != world) return "nodes do not cover the world";
  return "";
}

TEST(Placement, DataParallelFillsNodesInRankOrder) {
  std::vector<PlacementNode> nodes = uniform(2, 2);
  Result<Placement> p = placement_assign(nodes, {.dp = 4});
  ASSERT_TRUE(p.ok()) << p.error();
  ASSERT_EQ(p->ranks.size(), 4u);
  EXPECT_EQ(p->ranks[0].node, 0);
  EXPECT_EQ(p->ranks[1].node, 0);
  EXPECT_EQ(p->ranks[2].node, 1);
  EXPECT_EQ(p->ranks[3].node, 1);
  EXPECT_EQ(p->ranks[3].slot, 1);
  EXPECT_EQ(p->ranks[3].local_rank, 1);
  EXPECT_EQ(placement_describe(nodes, p.value()),
            "node-0: ranks 0-1 on slots 0-1\nnode-1: ranks 2-3 on slots 0-1");
  EXPECT_EQ(check_invariants(nodes, {.dp = 4}, p.value()), "");
}

TEST(Placement, TensorParallelGroupsNeverStraddleNodes) {
  // Three free slots a node: one tp-2 group each, the third slot left idle rather than split a group.
  std::vector<PlacementNode> nodes = uniform(2, 3);
  Result<Placement> p = placement_assign(nodes, {.dp = 2, .tp = 2});
  ASSERT_TRUE(p.ok()) << p.error();
  EXPECT_EQ(p->ranks[0].node, 0);
  EXPECT_EQ(p->ranks[1].node, 0);
  EXPECT_EQ(p->ranks[2].node, 1);
  EXPECT_EQ(p->ranks[3].node, 1);
  EXPECT_EQ(check_invariants(nodes, {.dp = 2, .tp = 2}, p.value()), "");
}

TEST(Placement, PipelineStagesStayTogetherAndDataParallelSpansNodes) {
  // dp 2 x pp 2 x tp 2 on two nodes of four: one model replica (tp x pp = 4 ranks) per node, so the dp
  // group of every (tp, pp) coordinate is {r, r + 4}: one rank on each node.
  std::vector<PlacementNode> nodes = uniform(2, 4);
  const GangLayout l{.dp = 2, .tp = 2, .pp = 2};
  Result<Placement> p = placement_assign(nodes, l);
  ASSERT_TRUE(p.ok()) << p.error();
  for (int r = 0; r < 8; ++r) EXPECT_EQ(p->ranks[r].node, r / 4) << "rank " << r;
  EXPECT_EQ(check_invariants(nodes, l, p.value()), "");
}

TEST(Placement, RefusesTooFewSlotsNamingNeedAndHave) {
  // The gang test: 6 ranks asked of 2 nodes x 2 slots.
  Result<Placement> p = placement_assign(uniform(2, 2), {.dp = 6});
  ASSERT_FALSE(p.ok());
  EXPECT_THAT(p.error(), HasSubstr("cannot place dp 6 x tp 1 x pp 1 (6 ranks)"));
  EXPECT_THAT(p.error(), HasSubstr("needs 6 free slots, the usable nodes have 4"));
  EXPECT_THAT(p.error(), HasSubstr("4 free slots on 2 nodes (2 healthy, 0 spare)"));
}

TEST(Placement, RefusesWhenNoNodeHoldsATensorParallelGroup) {
  // Ten free slots, but no node has four of them.
  Result<Placement> p = placement_assign(uniform(5, 2), {.dp = 2, .tp = 4});
  ASSERT_FALSE(p.ok());
  EXPECT_THAT(p.error(),
              HasSubstr("tp 4 needs 4 free slots on one node for each tensor-parallel group, the largest "
                        "free node has 2"));
}

TEST(Placement, RefusesWhenTheGroupsDoNotFitEvenThoughTheSlotsDo) {
  std::vector<PlacementNode> nodes = {
      {.id = "a", .slots = 4}, {.id = "b", .slots = 2}, {.id = "c", .slots = 2}};
  Result<Placement> p = placement_assign(nodes, {.dp = 2, .tp = 4});
  ASSERT_FALSE(p.ok());
  EXPECT_THAT(p.error(),
              HasSubstr("tp 4 keeps each group of 4 ranks on one node: 2 groups needed, the usable nodes "
                        "hold 1"));
  EXPECT_THAT(p.error(), HasSubstr("a 4 free, b 2 free, c 2 free"));
}

TEST(Placement, BriefsExampleSixHealthySlotsForEight) {
  Result<Placement> p = placement_assign(uniform(3, 2), {.dp = 2, .tp = 4});
  ASSERT_FALSE(p.ok());
  EXPECT_THAT(p.error(), HasSubstr("needs 8 free slots, the usable nodes have 6"));
  EXPECT_THAT(p.error(), HasSubstr("6 free slots on 3 nodes (3 healthy, 0 spare)"));
}

TEST(Placement, QuarantinedAndLostNodesAreNeverUsed) {
  std::vector<PlacementNode> nodes = {{.id = "q", .slots = 8, .state = NodeState::quarantined},
                                      {.id = "h", .slots = 2},
                                      {.id = "l", .slots = 8, .state = NodeState::lost}};
  Result<Placement> ok = placement_assign(nodes, {.dp = 2});
  ASSERT_TRUE(ok.ok()) << ok.error();
  EXPECT_EQ(ok->ranks[0].node, 1);
  EXPECT_EQ(ok->ranks[1].node, 1);

  // Even when only they could hold the job: refused, and the refusal says they were left out.
  Result<Placement> no = placement_assign(nodes, {.dp = 4});
  ASSERT_FALSE(no.ok());
  EXPECT_THAT(no.error(), HasSubstr("needs 4 free slots, the usable nodes have 2"));
  EXPECT_THAT(no.error(), HasSubstr("not used: q (quarantined, 8 slots), l (lost, 8 slots)"));
}

// A node whose agent's health checks fail (a full disk, GPU errors) is left out like a quarantined one.
TEST(Placement, UnhealthyNodesAreNeverUsed) {
  std::vector<PlacementNode> nodes = {{.id = "u", .slots = 8, .state = NodeState::unhealthy},
                                      {.id = "h", .slots = 2},
                                      {.id = "s", .slots = 2, .state = NodeState::spare}};
  Result<Placement> ok = placement_assign(nodes, {.dp = 4});
  ASSERT_TRUE(ok.ok()) << ok.error();
  for (const PlacedRank& r : ok->ranks) EXPECT_NE(r.node, 0);
  EXPECT_EQ(ok->spares_used(), 1);
  Result<Placement> no = placement_assign(nodes, {.dp = 6});
  ASSERT_FALSE(no.ok());
  EXPECT_THAT(no.error(), HasSubstr("not used: u (unhealthy, 8 slots)"));
}

TEST(Placement, SparesAreHeldBackWhileHealthyNodesSuffice) {
  std::vector<PlacementNode> nodes = {
      {.id = "s", .slots = 4, .state = NodeState::spare}, {.id = "a", .slots = 4}, {.id = "b", .slots = 4}};
  Result<Placement> p = placement_assign(nodes, {.dp = 8});
  ASSERT_TRUE(p.ok()) << p.error();
  EXPECT_EQ(p->spares_used(), 0);
  for (const PlacedRank& r : p->ranks) EXPECT_NE(r.node, 0);
}

TEST(Placement, SparesFillWhatTheHealthyNodesCannotAndComeLast) {
  std::vector<PlacementNode> nodes = {{.id = "s1", .slots = 4, .state = NodeState::spare},
                                      {.id = "a", .slots = 4},
                                      {.id = "s2", .slots = 4, .state = NodeState::spare},
                                      {.id = "b", .slots = 4, .state = NodeState::quarantined}};
  const GangLayout l{.dp = 6};
  Result<Placement> p = placement_assign(nodes, l);
  ASSERT_TRUE(p.ok()) << p.error();
  EXPECT_EQ(p->spares_used(), 1);  // one spare is enough: the other stays held back
  ASSERT_EQ(p->nodes.size(), 2u);
  EXPECT_EQ(p->nodes[0].node, 1);  // the healthy node takes ranks 0-3
  EXPECT_FALSE(p->nodes[0].spare);
  EXPECT_EQ(p->nodes[1].node, 0);  // then the first spare, ranks 4-5
  EXPECT_TRUE(p->nodes[1].spare);
  EXPECT_EQ(p->nodes[1].first_rank, 4);
  EXPECT_EQ(placement_describe(nodes, p.value()),
            "a: ranks 0-3 on slots 0-3\ns1 (spare): ranks 4-5 on slots 0-1");
  EXPECT_EQ(check_invariants(nodes, l, p.value()), "");
}

TEST(Placement, FewestNodesAndTheSmallestThatFitsLast) {
  std::vector<PlacementNode> nodes = {{.id = "big1", .slots = 8},
                                      {.id = "big2", .slots = 8},
                                      {.id = "half", .slots = 8, .busy = {0, 1, 2, 3}}};
  // 4 ranks: the half-busy node fits exactly, so both whole nodes stay free.
  Result<Placement> four = placement_assign(nodes, {.dp = 4});
  ASSERT_TRUE(four.ok()) << four.error();
  ASSERT_EQ(four->nodes.size(), 1u);
  EXPECT_EQ(four->nodes[0].node, 2);
  EXPECT_EQ(four->ranks[0].slot, 4);  // past the busy slots

  // 12 ranks: one whole node and the half one (two nodes, not big1 + big2).
  Result<Placement> twelve = placement_assign(nodes, {.dp = 12});
  ASSERT_TRUE(twelve.ok()) << twelve.error();
  ASSERT_EQ(twelve->nodes.size(), 2u);
  EXPECT_EQ(twelve->nodes[0].node, 0);
  EXPECT_EQ(twelve->nodes[0].ranks, 8);
  EXPECT_EQ(twelve->nodes[1].node, 2);
  EXPECT_EQ(twelve->nodes[1].ranks, 4);

  // 16 ranks: the two whole nodes.
  Result<Placement> sixteen = placement_assign(nodes, {.dp = 16});
  ASSERT_TRUE(sixteen.ok()) << sixteen.error();
  ASSERT_EQ(sixteen->nodes.size(), 2u);
  EXPECT_EQ(sixteen->nodes[0].node, 0);
  EXPECT_EQ(sixteen->nodes[1].node, 1);
}

TEST(Placement, BusySlotsAreSkippedAndNamedInTheRefusal) {
  std::vector<PlacementNode> nodes = {{.id = "n", .slots = 4, .busy = {0, 2}}};
  Result<Placement> p = placement_assign(nodes, {.dp = 2});
  ASSERT_TRUE(p.ok()) << p.error();
  EXPECT_EQ(p->ranks[0].slot, 1);
  EXPECT_EQ(p->ranks[1].slot, 3);
  EXPECT_EQ(p->ranks[1].local_rank, 1);
  EXPECT_EQ(placement_describe(nodes, p.value()), "n: ranks 0-1 on slots 1,3");

  Result<Placement> no = placement_assign(nodes, {.dp = 3});
  ASSERT_FALSE(no.ok());
  EXPECT_THAT(no.error(), HasSubstr("2 slots busy with other runs"));
}

TEST(Placement, InvalidInputIsRefusedNamingTheField) {
  EXPECT_THAT(placement_assign(uniform(1, 8), {.dp = 0}).error(),
              HasSubstr("every degree must be at least 1"));
  EXPECT_THAT(placement_assign(uniform(1, 8), {.dp = 2, .tp = 2, .world = 6}).error(),
              HasSubstr("dp 2 x tp 2 x pp 1 = 4 but world is 6"));
  EXPECT_THAT(placement_assign(uniform(1, 8), {.dp = 1 << 13, .tp = 1 << 13}).error(),
              HasSubstr("more than the"));
  std::vector<PlacementNode> dup = {{.id = "x", .slots = 1}, {.id = "x", .slots = 1}};
  EXPECT_THAT(placement_assign(dup, {}).error(), HasSubstr("node 1 (\"x\"): id is used by an earlier node"));
  EXPECT_THAT(placement_assign({{.id = "", .slots = 1}}, {}).error(), HasSubstr("id is empty"));
  EXPECT_THAT(placement_assign({{.id = "n", .slots = -1}}, {}).error(),
              HasSubstr("slots -1 must be at least 0"));
  EXPECT_THAT(placement_assign({{.id = "n", .slots = 2, .busy = {2}}}, {}).error(),
              HasSubstr("busy slot 2 is outside [0, 2)"));
  EXPECT_THAT(placement_assign({{.id = "n", .slots = 2, .busy = {1, 1}}}, {}).error(),
              HasSubstr("busy slot 1 is listed twice"));
  // A matching world is fine.
  EXPECT_TRUE(placement_assign(uniform(1, 8), {.dp = 2, .tp = 2, .world = 4}).ok());
}

TEST(Placement, NoNodesAtAll) {
  Result<Placement> p = placement_assign({}, {.dp = 1});
  ASSERT_FALSE(p.ok());
  EXPECT_THAT(p.error(), HasSubstr("needs 1 free slots, the usable nodes have 0"));
  EXPECT_THAT(p.error(), HasSubstr("0 free slots on 0 nodes"));
}

TEST(Placement, NodeStateNames) {
  for (NodeState s : {NodeState::healthy, NodeState::quarantined, NodeState::lost, NodeState::spare,
                      NodeState::unhealthy}) {
    Result<NodeState> back = node_state_parse(node_state_name(s));
    ASSERT_TRUE(back.ok());
    EXPECT_EQ(back.value(), s);
  }
  ASSERT_TRUE(node_state_parse("ok").ok());  // storage/'s word
  EXPECT_EQ(node_state_parse("ok").value(), NodeState::healthy);
  EXPECT_THAT(node_state_parse("sick").error(),
              HasSubstr("not one of healthy, quarantined, lost, spare, unhealthy"));
}

TEST(Placement, RefusalOnAHugeClusterNamesAFewNodesOnly) {
  std::vector<PlacementNode> nodes = uniform(12500, 8, "gpu-");
  for (PlacementNode& n : nodes) n.busy = {0, 1, 2, 3, 4};  // three free slots everywhere: no tp-4 group fits
  Result<Placement> p = placement_assign(nodes, {.dp = 2, .tp = 4});
  ASSERT_FALSE(p.ok());
  EXPECT_THAT(p.error(), HasSubstr("... and 12492 more"));
  EXPECT_LT(p.error().size(), 1000u);
}

TEST(Placement, TwelveThousandFiveHundredNodes) {
  // The benchmark size: 100k GPUs, 8 a node, a few nodes quarantined or lost, a few spares.
  std::vector<PlacementNode> nodes = uniform(12500, 8, "gpu-");
  for (int i = 0; i < 12500; i += 97) nodes[i].state = NodeState::quarantined;
  for (int i = 5; i < 12500; i += 101) nodes[i].state = NodeState::lost;
  for (int i = 11; i < 12500; i += 211) nodes[i].state = NodeState::spare;
  // 12,191 nodes stay healthy and 60 are spares: 12,221 nodes' worth of tp-8 groups takes every healthy
  // node and 30 spares.
  const GangLayout l{.dp = 12221, .tp = 8};
  Result<Placement> p = placement_assign(nodes, l);
  ASSERT_TRUE(p.ok()) << p.error();
  EXPECT_EQ(check_invariants(nodes, l, p.value()), "");
  EXPECT_EQ(p->nodes.size(), 12221u);
  EXPECT_EQ(p->spares_used(), 30);
}

TEST(Placement, RandomClustersHoldEveryInvariant) {
  // Against an independent count of what fits: placement succeeds exactly when the usable nodes hold
  // enough whole tp groups, uses spares exactly when the healthy ones do not, and then holds every
  // invariant.
  std::mt19937 rng(20240520);
  int placed = 0, refused = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    std::vector<PlacementNode> nodes;
    const int count = std::uniform_int_distribution<int>(0, 7)(rng);
    for (int i = 0; i < count; ++i) {
      PlacementNode n{.id = "n" + std::to_string(i), .slots = std::uniform_int_distribution<int>(0, 8)(rng)};
      n.state = static_cast<NodeState>(std::discrete_distribution<int>({6, 1, 1, 2})(rng));
      for (int s = 0; s < n.slots; ++s) {
        if (std::uniform_int_distribution<int>(0, 4)(rng) == 0) n.busy.push_back(s);
      }
      std::shuffle(n.busy.begin(), n.busy.end(), rng);
      nodes.push_back(n);
    }
    const int degrees[] = {1, 1, 2, 3, 4};
    GangLayout l{.dp = std::uniform_int_distribution<int>(1, 6)(rng),
                 .tp = degrees[rng() % 5],
                 .pp = degrees[rng() % 5]};
    int healthy_groups = 0, spare_groups = 0;
    for (const PlacementNode& n : nodes) {
      const int groups = (n.slots - static_cast<int>(n.busy.size())) / l.tp;
      if (n.state == NodeState::healthy) healthy_groups += groups;
      if (n.state == NodeState::spare) spare_groups += groups;
    }
    const int needed = l.dp * l.pp;  // world / tp
    Result<Placement> p = placement_assign(nodes, l);
    ASSERT_EQ(p.ok(), healthy_groups + spare_groups >= needed) << "trial " << trial << ": " << p.error();
    if (!p.ok()) {
      ++refused;
      EXPECT_THAT(p.error(), HasSubstr("cannot place"));
      continue;
    }
    ++placed;
    ASSERT_EQ(check_invariants(nodes, l, p.value()), "") << "trial " << trial;
    EXPECT_EQ(p->spares_used() > 0, healthy_groups < needed) << "trial " << trial;
  }
  // Both outcomes were exercised.
  EXPECT_GT(placed, 300);
  EXPECT_GT(refused, 300);
}

}  // namespace
}  // namespace gantry
