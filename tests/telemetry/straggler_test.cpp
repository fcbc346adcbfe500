#include "telemetry/straggler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <random>

namespace gantry {
namespace {

// A synthetic job: every rank's phases are a base profile times (1 + noise), with per-rank slowdowns.
struct Job {
  int ranks = 8;
  double noise = 0.01;  // relative standard deviation of each phase, each step
  PhaseSeconds base{
      .data_wait = 0.01, .forward = 0.5, .backward = 0.3, .optimizer = 0.05, .comm_exposed = 0.1};
  std::mt19937_64 rng{12345};

  RankStepRecord step(int rank, int64_t s, Phase slow = Phase::forward, double factor = 1.0) {
    std::normal_distribution<double> n(0.0, noise);
    RankStepRecord r;
    r.step = s;
    r.rank = rank;
    for (int p = 0; p < kPhaseCount; ++p) {
      const Phase ph = static_cast<Phase>(p);
      double v = base.get(ph) * (1.0 + n(rng));
      if (ph == slow) v *= factor;
      r.phases.at(ph) = v;
    }
    r.total_s = r.phases.sum();
    return r;
  }
};

StragglerOptions test_options() {
  return {.window_steps = 20,
          .min_samples = 10,
          .relative_threshold = 0.97,
          .individual_threshold = 0.97,
          .windows_to_flag = 3};
}

// Runs `windows` windows of `window_steps` steps, evaluating after each; returns the last report.
template <class MakeStep>
StragglerReport run(StragglerScorer& scorer, int ranks, int windows, MakeStep make,
                    std::vector<int>* flagged_at = nullptr) {
  StragglerReport rep;
  int64_t s = 0;
  for (int w = 0; w < windows; ++w) {
    for (int i = 0; i < scorer.options().window_steps; ++i, ++s) {
      for (int r = 0; r < ranks; ++r) EXPECT_TRUE(scorer.add(make(r, s)));
    }
    rep = scorer.evaluate();
    if (flagged_at) flagged_at->push_back(static_cast<int>(rep.flagged.size()));
  }
  return rep;
}

TEST(Straggler, RankTenPercentSlowerInForwardIsFlaggedWithForward) {
  Job job;
  StragglerScorer scorer(test_options());
  std::vector<int> flagged_count;
  const StragglerReport rep = run(
      scorer, job.ranks, 5,
      [&](int r, int64_t s) { return job.step(r, s, Phase::forward, r == 5 ? 1.10 : 1.0); }, &flagged_count);
  // Flagged only once the score stayed low for windows_to_flag windows.
  EXPECT_EQ(flagged_count[0], 0);
  EXPECT_EQ(flagged_count[1], 0);
  EXPECT_EQ(flagged_count[2], 1);
  ASSERT_EQ(rep.flagged, std::vector<int32_t>{5});
  const StragglerScore* sc = rep.find(5);
  ASSERT_NE(sc, nullptr);
  EXPECT_EQ(sc->slow_phase, Phase::forward);
  EXPECT_FALSE(sc->slow_phase_vs_self);
  EXPECT_NEAR(sc->slow_phase_excess_s, 0.05, 0.01);  // 10% of a 0.5 s forward
  // 0.96 s against 1.01 s: relative ≈ 0.95.
  EXPECT_NEAR(sc->relative, 0.96 / 1.01, 0.01);
  EXPECT_GE(sc->relative_windows, 5);
  EXPECT_NE(rep.fastest_rank, 5);
  // Its excess over the median rank: the 50 ms it spends more in forward; a typical rank's is about 0.
  EXPECT_NEAR(rep.reference_median_s, 0.96, 0.02);
  EXPECT_NEAR(sc->excess_s, 0.05, 0.015);
  EXPECT_NEAR(rep.find(1)->excess_s, 0.0, 0.015);
}

// The words `ctl ranks` and the console's Stragglers panel both print.
TEST(Straggler, ExcessTextNamesThePhaseAndTheTimeOver) {
  EXPECT_EQ(straggler_excess_text("forward", 0.2437), "forward +0.24 s");
  EXPECT_EQ(straggler_excess_text("backward", 1.5), "backward +1.50 s");
  EXPECT_EQ(straggler_excess_text("comm_exposed", 0.0125), "comm_exposed +12.5 ms");
  EXPECT_EQ(straggler_excess_text("forward", 0), "-");
  EXPECT_EQ(straggler_excess_text("forward", -0.3), "-");
  EXPECT_EQ(straggler_excess_text("", 0.3), "-");
}

TEST(Straggler, NoiseAloneIsNotFlagged) {
  Job job;
  job.noise = 0.02;
  StragglerScorer scorer(test_options());
  std::mt19937_64 spikes(7);
  // 2% noise on every phase plus an occasional 3x spike (a GC pause, a page fault storm): medians over
  // the window ignore both.
  const StragglerReport rep = run(scorer, 64, 20, [&](int r, int64_t s) {
    RankStepRecord x = job.step(r, s);
    if (spikes() % 40 == 0) {
      x.phases.forward *= 3;
      x.total_s = x.phases.sum();
    }
    return x;
  });
  EXPECT_TRUE(rep.flagged.empty());
  for (const StragglerScore& sc : rep.scores) {
    EXPECT_GT(sc.relative, 0.97) << "rank " << sc.rank;
    EXPECT_EQ(sc.relative_windows, 0) << "rank " << sc.rank;
  }
  EXPECT_EQ(rep.scores.size(), 64u);
}

TEST(Straggler, RankSlowOnlyInExposedCommunicationIsFlaggedWithThatPhase) {
  Job job;
  StragglerScorer scorer(test_options());
  const StragglerReport rep = run(scorer, job.ranks, 4, [&](int r, int64_t s) {
    return job.step(r, s, Phase::comm_exposed, r == 2 ? 1.6 : 1.0);  // a slow link: +60 ms of waiting
  });
  ASSERT_EQ(rep.flagged, std::vector<int32_t>{2});
  EXPECT_EQ(rep.find(2)->slow_phase, Phase::comm_exposed);
  EXPECT_NEAR(rep.find(2)->slow_phase_excess_s, 0.06, 0.01);
}

TEST(Straggler, SynchronousJobNeedsTheBusyBasis) {
  // Ranks meet at a barrier each step: everyone's total is the slowest rank's busy time plus the
  // collective, and the fast ranks wait inside their exposed communication.
  Job job;
  const auto coupled = [&](std::vector<RankStepRecord>& step_records) {
    double slowest = 0;
    for (const auto& r : step_records) slowest = std::max(slowest, r.total_s - r.phases.comm_exposed);
    for (auto& r : step_records) {
      r.phases.comm_exposed += slowest - (r.total_s - r.phases.comm_exposed);
      r.total_s = r.phases.sum();
    }
  };
  for (StragglerBasis basis : {StragglerBasis::total, StragglerBasis::busy}) {
    StragglerOptions o = test_options();
    o.basis = basis;
    StragglerScorer scorer(o);
    StragglerReport rep;
    for (int64_t s = 0; s < 100; ++s) {
      std::vector<RankStepRecord> recs;
      for (int r = 0; r < job.ranks; ++r) recs.push_back(job.step(r, s, Phase::forward, r == 3 ? 1.10 : 1.0));
      coupled(recs);
      for (const auto& r : recs) scorer.add(r);
      if (s % 20 == 19) rep = scorer.evaluate();
    }
    if (basis == StragglerBasis::total) {
      EXPECT_TRUE(rep.flagged.empty()) << "totals are equalised by the barrier";
    } else {
      ASSERT_EQ(rep.flagged, std::vector<int32_t>{3});
      EXPECT_EQ(rep.find(3)->slow_phase, Phase::forward);
    }
  }
}

TEST(Straggler, IndividualScoreCatchesARankSlowerThanItsPastSelf) {
  // One rank alone: the relative score is always 1, so only the individual score can see the slowdown.
  Job job;
  StragglerScorer scorer(test_options());
  run(scorer, 1, 3, [&](int r, int64_t s) { return job.step(r, s); });
  std::vector<int> flagged_count;
  const StragglerReport rep = run(
      scorer, 1, 4, [&](int r, int64_t s) { return job.step(r, s, Phase::data_wait, 20.0); }, &flagged_count);
  EXPECT_EQ(flagged_count, (std::vector<int>{0, 0, 1, 1}));
  const StragglerScore* sc = rep.find(0);
  ASSERT_NE(sc, nullptr);
  EXPECT_DOUBLE_EQ(sc->relative, 1.0);
  EXPECT_NEAR(sc->individual, 0.96 / 1.15, 0.01);
  EXPECT_EQ(sc->slow_phase, Phase::data_wait);
  EXPECT_TRUE(sc->slow_phase_vs_self);
}

TEST(Straggler, FlagClearsWhenTheRankRecovers) {
  Job job;
  StragglerScorer scorer(test_options());
  StragglerReport rep = run(scorer, job.ranks, 4, [&](int r, int64_t s) {
    return job.step(r, s, Phase::backward, r == 1 ? 1.3 : 1.0);
  });
  ASSERT_EQ(rep.flagged, std::vector<int32_t>{1});
  EXPECT_EQ(rep.find(1)->slow_phase, Phase::backward);
  rep = run(scorer, job.ranks, 1, [&](int r, int64_t s) { return job.step(r, s); });
  EXPECT_TRUE(rep.flagged.empty());
  EXPECT_EQ(rep.find(1)->relative_windows, 0);
}

TEST(Straggler, RanksWithTooFewSamplesAreNotScoredAndSparseRanksWork) {
  Job job;
  StragglerScorer scorer(test_options());
  for (int s = 0; s < 20; ++s) scorer.add(job.step(100000, s));
  for (int s = 0; s < 5; ++s) scorer.add(job.step(7, s));
  RankStepRecord bad = job.step(3, 0);
  bad.rank = -1;
  EXPECT_FALSE(scorer.add(bad));
  const StragglerReport rep = scorer.evaluate();
  ASSERT_EQ(rep.scores.size(), 1u);
  EXPECT_EQ(rep.scores[0].rank, 100000);
  EXPECT_EQ(rep.find(7), nullptr);
  scorer.reset_rank(100000);
  EXPECT_TRUE(scorer.evaluate().scores.empty());
}

TEST(Straggler, OptionsCheckNamesTheField) {
  EXPECT_EQ(straggler_options_check({}), "");
  StragglerOptions o;
  o.window_steps = 0;
  EXPECT_NE(straggler_options_check(o).find("window_steps"), std::string::npos);
  o = {};
  o.min_samples = 50;
  EXPECT_NE(straggler_options_check(o).find("min_samples must be in 1..20"), std::string::npos);
  o = {};
  o.relative_threshold = 1.5;
  EXPECT_NE(straggler_options_check(o).find("relative_threshold must be in 0..1"), std::string::npos);
  o = {};
  o.windows_to_flag = 0;
  EXPECT_NE(straggler_options_check(o).find("windows_to_flag"), std::string::npos);
}

TEST(Straggler, EventNamesRankScoresAndPhase) {
  Job job;
  StragglerScorer scorer(test_options());
  const StragglerReport rep = run(scorer, job.ranks, 3, [&](int r, int64_t s) {
    return job.step(r, s, Phase::comm_exposed, r == 4 ? 2.0 : 1.0);
  });
  ASSERT_EQ(rep.flagged, std::vector<int32_t>{4});
  const EventRecord e = straggler_event(rep, 4, 9, 1795651200.0, 60);
  EXPECT_EQ(e.kind, "straggler");
  EXPECT_EQ(e.rank, 4);
  EXPECT_EQ(e.step, 60);
  EXPECT_NE(e.message.find("slow phase comm_exposed"), std::string::npos) << e.message;
  const nlohmann::json v = nlohmann::json::parse(e.payload);
  EXPECT_EQ(v.at("slow_phase"), "comm_exposed");
  const double rel = v.at("relative").get<double>();
  EXPECT_LT(rel, 0.97);
}

}  // namespace
}  // namespace gantry
