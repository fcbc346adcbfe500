// ParallelDims: validation messages and the rank arithmetic (tp innermost, then pp, then dp).
#include "engine/core/parallel/parallel_dims.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <set>
#include <string>
#include <vector>

namespace gantry {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(ParallelDims, DegreesMustMultiplyToTheWorld) {
  Result<ParallelDims> d = ParallelDims::make({.world = 8, .rank = 0, .dp = 3, .tp = 2, .pp = 1});
  ASSERT_FALSE(d.ok());
  EXPECT_THAT(d.error(), HasSubstr("dp 3 x tp 2 x pp 1 = 6 but the world has 8 ranks"));
}

TEST(ParallelDims, RejectsBadRankZeroAndDegrees) {
  EXPECT_THAT(ParallelDims::make({.world = 4, .rank = 4, .dp = 4}).error(),
              HasSubstr("rank 4 is outside [0, 4)"));
  EXPECT_THAT(ParallelDims::make({.world = 4, .rank = 0, .dp = 4, .zero = 4}).error(),
              HasSubstr("zero stage 4 must be 0, 1, 2 or 3"));
  EXPECT_THAT(ParallelDims::make({.world = 0}).error(), HasSubstr("world size 0"));
  EXPECT_THAT(ParallelDims::make({.world = 2, .dp = 2, .tp = 0}).error(), HasSubstr("at least 1"));
}

TEST(ParallelDims, GroupsFollowTheRankOrder) {
  // world 8 = dp 2 x pp 2 x tp 2; rank 5 = dp 1, pp 0, tp 1.
  Result<ParallelDims> d = ParallelDims::make({.world = 8, .rank = 5, .dp = 2, .tp = 2, .pp = 2, .zero = 1});
  ASSERT_TRUE(d.ok()) << d.error();
  EXPECT_EQ(d->tp_rank(), 1);
  EXPECT_EQ(d->pp_rank(), 0);
  EXPECT_EQ(d->dp_rank(), 1);
  EXPECT_THAT(d->tp_group(), ElementsAre(4, 5));
  EXPECT_THAT(d->pp_group(), ElementsAre(5, 7));
  EXPECT_THAT(d->dp_group(), ElementsAre(1, 5));
  EXPECT_EQ(d->describe(), "dp 2 x tp 2 x pp 2, zero 1 (world 8)");
}

// Every group of every axis rendezvouses under a prefix of its own, the same for all of its ranks.
TEST(ParallelDims, EachGroupHasItsOwnStorePrefix) {
  std::set<std::string> prefixes[4];
  for (int rank = 0; rank < 8; ++rank) {
    Result<ParallelDims> d = ParallelDims::make({.world = 8, .rank = rank, .dp = 2, .tp = 2, .pp = 2});
    ASSERT_TRUE(d.ok()) << d.error();
    for (ParallelAxis a : {ParallelAxis::kDp, ParallelAxis::kTp, ParallelAxis::kPp}) {
      const std::vector<int> group = a == ParallelAxis::kDp   ? d->dp_group()
                                     : a == ParallelAxis::kTp ? d->tp_group()
                                                              : d->pp_group();
      for (int peer : group) {
        ParallelDims p = d.value();
        p.rank = peer;
        EXPECT_EQ(p.comm_prefix(a), d->comm_prefix(a)) << "rank " << rank << " and its peer " << peer;
      }
      prefixes[static_cast<int>(a)].insert(d->comm_prefix(a));
    }
  }
  // 8 ranks in groups of 2: 4 groups per axis.
  for (ParallelAxis a : {ParallelAxis::kDp, ParallelAxis::kTp, ParallelAxis::kPp})
    EXPECT_EQ(prefixes[static_cast<int>(a)].size(), 4u);
  EXPECT_EQ(
      ParallelDims::make({.world = 8, .rank = 5, .dp = 2, .tp = 2, .pp = 2})->comm_prefix(ParallelAxis::kTp),
      "tp/d1/p0/");
  // Data parallel alone: the dp group is the gang, under the prefix it always had.
  EXPECT_EQ(ParallelDims::make({.world = 4, .rank = 3, .dp = 4})->comm_prefix(ParallelAxis::kDp), "dp/");
}

TEST(ParallelDims, PureDataParallelGroupIsEveryRank) {
  Result<ParallelDims> d = ParallelDims::make({.world = 4, .rank = 2, .dp = 4});
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->dp_rank(), 2);
  EXPECT_THAT(d->dp_group(), ElementsAre(0, 1, 2, 3));
  EXPECT_THAT(d->tp_group(), ElementsAre(2));
}

}  // namespace
}  // namespace gantry
