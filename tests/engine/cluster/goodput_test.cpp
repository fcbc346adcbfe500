// The goodput ledger's arithmetic (engine/cluster/goodput.h): each category from hand-built timelines, the
// categories summing to the wall in every case, the failure list, and the Young/Daly interval.
#include "engine/cluster/goodput.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <random>

namespace gantry {
namespace {

using C = GoodputCategory;

double total(const GoodputLedger& l) {
  double s = 0;
  for (double v : l.seconds) s += v;
  return s;
}

TEST(Goodput, ACleanRunIsWaitingThenProductiveLessItsStallsAndWindDown) {
  GoodputInput in{.created_unix = 100, .end_unix = 200};
  in.generations.push_back(
      {.generation = 1, .placed_unix = 100, .first_step_start = 104, .last_progress = 196});
  in.checkpoints.push_back({.step = 10, .time_unix = 150, .write_s = 3, .stall_s = 0.5});
  in.checkpoints.push_back({.step = 20, .time_unix = 198, .write_s = 1, .stall_s = 1});  // the final one
  in.ended_unix = {200};
  const GoodputLedger l = goodput_ledger(in);
  ASSERT_TRUE(l.known);
  EXPECT_DOUBLE_EQ(l.wall_s, 100);
  EXPECT_DOUBLE_EQ(l.of(C::kWaiting), 4 + 4 - 1);  // placing; the tail after the last step less its stall
  EXPECT_DOUBLE_EQ(l.of(C::kCheckpointStall), 1.5);
  EXPECT_DOUBLE_EQ(l.of(C::kProductive), 92 - 0.5);
  for (C c : {C::kDetection, C::kRestore, C::kRecomputed, C::kPaused})
    EXPECT_EQ(l.of(c), 0) << goodput_category_name(c);
  EXPECT_TRUE(l.failures.empty());
  EXPECT_DOUBLE_EQ(*l.ettr(), 91.5 / 100);
  EXPECT_DOUBLE_EQ(total(l), l.wall_s);
}

TEST(Goodput, AFailureSplitsIntoRecomputedDetectionAndRestore) {
  GoodputInput in{.created_unix = 0, .end_unix = 100, .live = true};
  // Generation 1 trains from 2; its checkpoint at step 10 captured at 20 (write ended at 21 after 1 s);
  // its last step ended at 30; the kill was noticed at 31; generation 2 placed at 32 from step 10, first
  // step at 35; live until 100.
  in.generations.push_back({.generation = 1, .placed_unix = 0, .first_step_start = 2, .last_progress = 30});
  in.generations.push_back({.generation = 2,
                            .cause = GoodputCause::kRecovery,
                            .placed_unix = 32,
                            .from_step = 10,
                            .first_step_start = 35,
                            .last_progress = 99});
  in.checkpoints.push_back({.step = 10, .time_unix = 21, .write_s = 1, .stall_s = 0.25});
  in.notices.push_back(
      {.time_unix = 31, .kind = "node_failed", .node = "node-1", .message = "rank 2 SIGKILL"});
  in.faults.push_back({.time_unix = 29.5, .fault = "kill", .rank = 2, .node = "node-1"});
  const GoodputLedger l = goodput_ledger(in);
  EXPECT_DOUBLE_EQ(l.of(C::kWaiting), 2);
  EXPECT_DOUBLE_EQ(l.of(C::kRecomputed), 9.75);  // after the checkpoint and its stall (20.25) .. 30
  EXPECT_DOUBLE_EQ(l.of(C::kDetection), 1);      // 30..31
  EXPECT_DOUBLE_EQ(l.of(C::kRestore), 4);        // 31..35
  EXPECT_DOUBLE_EQ(l.of(C::kCheckpointStall), 0.25);
  EXPECT_DOUBLE_EQ(l.of(C::kProductive), 18 + 65);  // 2..20 and 35..100 (live: the step in flight)
  EXPECT_DOUBLE_EQ(total(l), 100);
  ASSERT_EQ(l.failures.size(), 1u);
  const GoodputFailure& f = l.failures[0];
  EXPECT_EQ(f.generation, 1);
  EXPECT_DOUBLE_EQ(f.time_unix, 31);
  EXPECT_EQ(f.kind, "node_failed");
  EXPECT_EQ(f.fault, "kill");
  EXPECT_EQ(f.fault_rank, 2);
  EXPECT_EQ(f.fault_node, "node-1");
  EXPECT_DOUBLE_EQ(f.detection_s, 1);
  EXPECT_DOUBLE_EQ(f.restore_s, 4);
  EXPECT_DOUBLE_EQ(f.recomputed_s, 9.75);
  EXPECT_DOUBLE_EQ(f.cost_s(), 14.75);
  EXPECT_TRUE(f.recovered);
}

TEST(Goodput, ARestoreFromACheckpointOfAnEarlierGenerationLosesTheWholeGeneration) {
  GoodputInput in{.created_unix = 0, .end_unix = 60};
  in.generations.push_back({.generation = 1, .placed_unix = 0, .first_step_start = 1, .last_progress = 20});
  in.generations.push_back({.generation = 2,
                            .cause = GoodputCause::kRecovery,
                            .placed_unix = 22,
                            .from_step = 5,
                            .first_step_start = 24,
                            .last_progress = 30});
  in.generations.push_back({.generation = 3,
                            .cause = GoodputCause::kRecovery,
                            .placed_unix = 33,
                            .from_step = 5,
                            .first_step_start = 34,
                            .last_progress = 59});
  in.checkpoints.push_back({.step = 5, .time_unix = 10, .write_s = 0, .stall_s = 0});
  in.notices.push_back({.time_unix = 21, .kind = "node_failed"});
  in.notices.push_back({.time_unix = 31, .kind = "node_lost"});
  in.ended_unix = {60};
  const GoodputLedger l = goodput_ledger(in);
  EXPECT_DOUBLE_EQ(l.of(C::kRecomputed), 10 + 6);  // gen 1: 10..20; gen 2 made no checkpoint: 24..30, all
  ASSERT_EQ(l.failures.size(), 2u);
  EXPECT_DOUBLE_EQ(l.failures[1].recomputed_s, 6);
  EXPECT_EQ(l.failures[1].kind, "node_lost");
  EXPECT_DOUBLE_EQ(l.failures[1].restore_s, 3);  // 31..34
  EXPECT_DOUBLE_EQ(total(l), 60);
}

// The restored checkpoint's commit never reached the catalog (its gang died first): the lost work starts
// at the end of the step it holds, not at the generation's first step.
TEST(Goodput, AnUncataloguedCheckpointLosesFromTheEndOfItsStep) {
  GoodputInput in{.created_unix = 0, .end_unix = 60};
  in.generations.push_back({.generation = 1, .placed_unix = 0, .first_step_start = 1, .last_progress = 40});
  in.generations.push_back({.generation = 2,
                            .cause = GoodputCause::kRecovery,
                            .placed_unix = 42,
                            .from_step = 43,
                            .first_step_start = 44,
                            .last_progress = 60});
  in.notices.push_back({.time_unix = 41, .kind = "node_failed"});
  in.step_end_unix[43] = 38.5;
  const GoodputLedger l = goodput_ledger(in);
  EXPECT_DOUBLE_EQ(l.of(C::kRecomputed), 1.5);
  in.step_end_unix.clear();  // nothing known of step 43: the whole generation is lost
  EXPECT_DOUBLE_EQ(goodput_ledger(in).of(C::kRecomputed), 39);
}

TEST(Goodput, PausesAndAStopUntilAResumeFromArePaused) {
  GoodputInput in{.created_unix = 0, .end_unix = 100};
  in.generations.push_back({.generation = 1, .placed_unix = 0, .first_step_start = 1, .last_progress = 40});
  in.generations.push_back({.generation = 2,
                            .cause = GoodputCause::kResume,
                            .placed_unix = 70,
                            .from_step = 3,
                            .first_step_start = 72,
                            .last_progress = 99});
  in.checkpoints.push_back({.step = 3, .time_unix = 40.5, .write_s = 0.5, .stall_s = 0.5});  // the stop's
  in.pauses = {{.time_unix = 10, .paused = true}, {.time_unix = 15, .paused = false}};
  in.ended_unix = {41, 100};  // stopped at 41; resumed from at 70; finished at 100
  const GoodputLedger l = goodput_ledger(in);
  EXPECT_DOUBLE_EQ(l.of(C::kPaused), 5 + 29);
  EXPECT_DOUBLE_EQ(l.of(C::kRecomputed), 0);  // the stop's checkpoint was its last step
  EXPECT_DOUBLE_EQ(l.of(C::kRestore), 2);     // 70..72
  EXPECT_DOUBLE_EQ(l.of(C::kDetection), 0);
  EXPECT_TRUE(l.failures.empty());
  EXPECT_DOUBLE_EQ(total(l), 100);
}

TEST(Goodput, ALiveRunWhoseRecoveryIsUnderWayIsRestoringNow) {
  GoodputInput in{.created_unix = 0, .end_unix = 50, .live = true};
  in.generations.push_back({.generation = 1, .placed_unix = 0, .first_step_start = 1, .last_progress = 40});
  in.notices.push_back({.time_unix = 42, .kind = "node_lost"});
  const GoodputLedger l = goodput_ledger(in);
  EXPECT_DOUBLE_EQ(l.of(C::kDetection), 2);
  EXPECT_DOUBLE_EQ(l.of(C::kRestore), 8);
  EXPECT_DOUBLE_EQ(l.of(C::kProductive), 39);
  ASSERT_EQ(l.failures.size(), 1u);
  EXPECT_FALSE(l.failures[0].recovered);
}

TEST(Goodput, WithoutGenerationsTheLedgerIsUnknownNotZero) {
  const GoodputLedger l = goodput_ledger({.created_unix = 0, .end_unix = 10});
  EXPECT_FALSE(l.known);
  EXPECT_FALSE(l.ettr().has_value());
  EXPECT_THAT(l.why_unknown, ::testing::HasSubstr("predates"));
}

// Whatever the order and overlap of the facts, the categories cover the wall exactly, none is negative,
// and the spans are contiguous.
TEST(Goodput, CategoriesAlwaysSumToTheWall) {
  std::mt19937 rng(15);
  std::uniform_real_distribution<double> u(0, 1000);
  for (int trial = 0; trial < 500; ++trial) {
    GoodputInput in{.created_unix = 0, .end_unix = 1000, .live = trial % 2 == 0};
    const int gens = 1 + static_cast<int>(rng() % 4);
    std::vector<double> placed;
    for (int g = 0; g < gens; ++g) placed.push_back(g == 0 ? 0 : u(rng));
    std::sort(placed.begin(), placed.end());
    for (int g = 0; g < gens; ++g) {
      GoodputGeneration gen{.generation = g + 1,
                            .cause = g == 0 ? GoodputCause::kSubmit : GoodputCause::kRecovery,
                            .placed_unix = placed[static_cast<size_t>(g)],
                            .from_step = static_cast<int64_t>(rng() % 5)};
      if (rng() % 4 != 0) gen.first_step_start = u(rng);
      if (rng() % 4 != 0) gen.last_progress = u(rng);
      in.generations.push_back(gen);
    }
    for (int k = 0; k < 3; ++k) in.notices.push_back({.time_unix = u(rng), .kind = "node_failed"});
    for (int k = 0; k < 4; ++k)
      in.checkpoints.push_back(
          {.step = k, .time_unix = u(rng), .write_s = u(rng) / 100, .stall_s = u(rng) / 50});
    for (int k = 0; k < 4; ++k) in.pauses.push_back({.time_unix = u(rng), .paused = k % 2 == 0});
    if (rng() % 2) in.ended_unix.push_back(u(rng));
    const GoodputLedger l = goodput_ledger(in);
    EXPECT_NEAR(total(l), 1000, 1e-6) << trial;
    for (double v : l.seconds) EXPECT_GE(v, 0) << trial;
    for (size_t k = 1; k < l.spans.size(); ++k)
      EXPECT_DOUBLE_EQ(l.spans[k].begin, l.spans[k - 1].end) << trial;
  }
}

TEST(YoungDaly, IsTheSquareRootOfTwiceCostTimesMtbf) {
  // Median stall 2 s (of 1, 2, 9), 3 failures in 6,000 s: MTBF 2,000 s, interval sqrt(2·2·2000) = 89.44 s.
  const YoungDaly y = young_daly({9, 1, 2}, 3, 6000, 0.5);
  ASSERT_TRUE(y.interval_s.has_value()) << y.why_unknown;
  EXPECT_DOUBLE_EQ(*y.checkpoint_cost_s, 2);
  EXPECT_DOUBLE_EQ(*y.mtbf_s, 2000);
  EXPECT_NEAR(*y.interval_s, std::sqrt(8000.0), 1e-9);
  EXPECT_EQ(*y.interval_steps, 179);  // 89.44 s / 0.5 s
  EXPECT_TRUE(y.why_unknown.empty());
  EXPECT_DOUBLE_EQ(*young_daly({1, 3}, 1, 100, std::nullopt).checkpoint_cost_s,
                   2);  // even count: the mean of the middle two
}

TEST(YoungDaly, IsUnknownWithoutAFailureOrACheckpointAndSaysWhy) {
  const YoungDaly none = young_daly({1.0}, 0, 1000, 0.1);
  EXPECT_FALSE(none.interval_s.has_value());
  EXPECT_FALSE(none.mtbf_s.has_value());
  EXPECT_THAT(none.why_unknown, ::testing::HasSubstr("no failure"));
  const YoungDaly no_ckpt = young_daly({}, 2, 1000, 0.1);
  EXPECT_FALSE(no_ckpt.interval_s.has_value());
  EXPECT_THAT(no_ckpt.why_unknown, ::testing::HasSubstr("checkpoint"));
  EXPECT_FALSE(young_daly({1.0}, 1, 100, std::nullopt).interval_steps.has_value());  // no step time yet
}

}  // namespace
}  // namespace gantry
