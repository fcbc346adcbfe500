// The coordinator's per-run policies without a coordinator: StragglerWatch turns scored rank-step records
// into straggler / straggler_cleared events at window boundaries, its options are read strictly from the
// submit body, and the checkpoint policy triggers once per period and prunes only committed step_*
// directories of the run's own folder.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "engine/cluster/checkpoint_policy.h"
#include "engine/cluster/straggler_watch.h"
#include "tests/scratch_dir.h"

namespace gantry {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using ::testing::HasSubstr;

RankStepRecord rec(int32_t rank, int64_t step, double forward_s, double comm_s) {
  RankStepRecord r;
  r.run_id = 7;
  r.rank = rank;
  r.step = step;
  r.phases.forward = forward_s;
  r.phases.comm_exposed = comm_s;
  r.total_s = forward_s + comm_s;
  return r;
}

std::string node_of(int32_t rank) {
  return rank < 2 ? "node-0" : "node-1";
}

TEST(StragglerWatch, FlagsTheSlowRankOnTheBusyBasisAndClearsItWhenItRecovers) {
  json body = {{"window_steps", 4},
               {"min_samples", 2},
               {"windows_to_flag", 2},
               {"relative_threshold", 0.5},
               {"individual_threshold", 0}};
  Result<StragglerWatchOptions> o = straggler_watch_parse(&body);
  ASSERT_TRUE(o.ok()) << o.error();
  StragglerWatch w(o.value());
  std::vector<EventRecord> events;
  int64_t step = 0;
  // Rank 2 spends 0.3 s in forward; the others wait for it in their collectives (all totals equal).
  auto run_steps = [&](int n, bool slow) {
    for (int k = 0; k < n; ++k) {
      ++step;
      for (int32_t r = 0; r < 4; ++r) {
        const bool me = slow && r == 2;
        w.add(rec(r, step, me ? 0.4 : 0.1, slow ? (me ? 0.0 : 0.3) : 0.0));
      }
      for (EventRecord& e : w.maybe_evaluate(7, 1.0, node_of)) events.push_back(e);
    }
  };
  run_steps(3, true);
  EXPECT_TRUE(events.empty());  // no evaluation before step 4
  run_steps(1, true);           // evaluation 1: under the threshold once
  EXPECT_TRUE(events.empty());
  EXPECT_FALSE(w.rank_json(2).is_null());
  EXPECT_LT(w.rank_json(2)["relative"].get<double>(), 0.5);
  run_steps(4, true);  // evaluation 2: flagged
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].kind, "straggler");
  EXPECT_EQ(events[0].rank, 2);
  EXPECT_EQ(events[0].node, "node-1");
  EXPECT_EQ(events[0].step, 8);
  json p = json::parse(events[0].payload);
  EXPECT_EQ(p["slow_phase"], "forward");
  EXPECT_EQ(p["node"], "node-1");
  EXPECT_NEAR(p["slow_phase_excess_s"].get<double>(), 0.3, 1e-6);
  EXPECT_THAT(events[0].message, HasSubstr("node-1"));
  EXPECT_EQ(w.rank_json(2)["flagged"], true);
  for (int32_t r : {0, 1, 3}) EXPECT_EQ(w.rank_json(r)["flagged"], false) << r;
  EXPECT_EQ(w.summary_json()["flagged"], json::array({2}));
  EXPECT_EQ(w.flagged_count(), 1);

  run_steps(4, false);  // a whole window at full speed: cleared once
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(events[1].kind, "straggler_cleared");
  EXPECT_EQ(events[1].rank, 2);
  EXPECT_EQ(events[1].node, "node-1");
  run_steps(8, false);
  EXPECT_EQ(events.size(), 2u);
  EXPECT_EQ(w.flagged_count(), 0);
}

TEST(StragglerWatch, ANewPlacementClearsFlagsAndStartsOver) {
  json body = {{"window_steps", 2}, {"min_samples", 1}, {"windows_to_flag", 1}, {"individual_threshold", 0}};
  StragglerWatch w(straggler_watch_parse(&body).value());
  for (int64_t s = 1; s <= 2; ++s) {
    w.add(rec(0, s, 0.1, 0.5));
    w.add(rec(1, s, 0.6, 0.0));
  }
  ASSERT_EQ(w.maybe_evaluate(7, 1.0, node_of).size(), 1u);
  std::vector<EventRecord> cleared = w.reset(7, 2.0, node_of);
  ASSERT_EQ(cleared.size(), 1u);
  EXPECT_EQ(cleared[0].kind, "straggler_cleared");
  EXPECT_THAT(cleared[0].message, HasSubstr("placed again"));
  EXPECT_TRUE(w.rank_json(1).is_null());
  EXPECT_EQ(w.flagged_count(), 0);
  EXPECT_TRUE(w.maybe_evaluate(7, 3.0, node_of).empty());  // nothing recorded since
}

// Switched while the run lives: quarantine alone keeps the scores and the flag; new scoring options start
// over (the flag cleared, saying why); quarantine without scoring is refused naming the field.
TEST(StragglerWatch, OptionsChangedAtRunTimeKeepOrRestartTheScores) {
  json body = {{"window_steps", 2}, {"min_samples", 1}, {"windows_to_flag", 1}, {"individual_threshold", 0}};
  StragglerWatchOptions o = straggler_watch_parse(&body).value();
  EXPECT_FALSE(o.quarantine);  // off by default
  StragglerWatch w(o);
  for (int64_t s = 1; s <= 2; ++s) {
    w.add(rec(0, s, 0.1, 0.5));
    w.add(rec(1, s, 0.6, 0.0));
  }
  ASSERT_EQ(w.maybe_evaluate(7, 1.0, node_of).size(), 1u);
  EXPECT_EQ(w.flagged_ranks(), std::vector<int32_t>{1});
  o.quarantine = true;
  EXPECT_TRUE(w.set_options(o, 7, 2.0, node_of).empty());
  EXPECT_TRUE(w.options().quarantine);
  EXPECT_EQ(w.flagged_ranks(), std::vector<int32_t>{1});  // kept: the policy acts on it now
  EXPECT_EQ(straggler_watch_options_json(w.options())["quarantine"], true);
  o.scoring.windows_to_flag = 3;
  std::vector<EventRecord> cleared = w.set_options(o, 7, 3.0, node_of);
  ASSERT_EQ(cleared.size(), 1u);
  EXPECT_EQ(cleared[0].kind, "straggler_cleared");
  EXPECT_THAT(cleared[0].message, HasSubstr("scoring options changed"));
  EXPECT_TRUE(w.flagged_ranks().empty());
  EXPECT_EQ(w.options().scoring.windows_to_flag, 3);

  json bad = {{"quarantine", true}, {"enabled", false}};
  Result<StragglerWatchOptions> refused = straggler_watch_parse(&bad);
  ASSERT_FALSE(refused.ok());
  EXPECT_THAT(refused.error(), HasSubstr("straggler.quarantine"));
}

TEST(StragglerWatch, DisabledScoresNothing) {
  json body = {{"enabled", false}, {"window_steps", 1}, {"min_samples", 1}, {"windows_to_flag", 1}};
  StragglerWatch w(straggler_watch_parse(&body).value());
  w.add(rec(0, 1, 0.1, 0));
  w.add(rec(1, 1, 9.0, 0));
  EXPECT_TRUE(w.maybe_evaluate(7, 1.0, node_of).empty());
  EXPECT_TRUE(w.rank_json(1).is_null());
}

TEST(StragglerWatch, OptionsAreReadStrictlyAndNameTheField) {
  Result<StragglerWatchOptions> d = straggler_watch_parse(nullptr);
  ASSERT_TRUE(d.ok());
  EXPECT_TRUE(d->enabled);
  EXPECT_EQ(d->scoring.basis, StragglerBasis::busy);
  EXPECT_EQ(straggler_watch_options_json(d.value())["basis"], "busy");
  const std::vector<std::pair<json, std::string>> bad = {
      {{{"window_steps", "x"}}, "straggler.window_steps"},
      {{{"window_steps", 0}}, "straggler.window_steps"},
      {{{"window_steps", 10}, {"min_samples", 20}}, "straggler.min_samples"},
      {{{"relative_threshold", 1.5}}, "straggler.relative_threshold"},
      {{{"windows_to_flag", -1}}, "straggler.windows_to_flag"},
      {{{"basis", "wall"}}, "straggler.basis"},
      {{{"windw_steps", 5}}, "straggler.windw_steps"},
      {json::array(), "straggler"},
  };
  for (const auto& [body, field] : bad) {
    Result<StragglerWatchOptions> r = straggler_watch_parse(&body);
    ASSERT_FALSE(r.ok()) << body.dump();
    EXPECT_THAT(r.error(), HasSubstr(field)) << body.dump();
  }
}

TEST(CheckpointPolicy, DueOncePerPeriodAndAgainAfterARestart) {
  CheckpointPolicy off;
  EXPECT_FALSE(off.due(100));
  CheckpointPolicy p({.every_steps = 5});
  std::vector<int64_t> due;
  for (int64_t s : {1, 2, 4, 5, 6, 9, 12, 13, 14, 15, 16}) {
    if (p.due(s)) due.push_back(s);
  }
  EXPECT_EQ(due, (std::vector<int64_t>{5, 12, 15}));  // 12: the first reported past 10
  p.restart_at(7);                                    // resumed from a checkpoint at step 7
  EXPECT_FALSE(p.due(9));
  EXPECT_TRUE(p.due(10));
}

// young_daly changes a live run's interval: the next checkpoint is due the new interval after the last one
// that was due (at once when that is past), and the mode's names round-trip.
TEST(CheckpointPolicy, ANewIntervalCountsFromTheLastDueStep) {
  CheckpointPolicy p({.every_steps = 100, .mode = CheckpointPolicyMode::kYoungDaly});
  EXPECT_TRUE(p.due(100));
  p.set_every_steps(7);  // from 100: due at 107
  EXPECT_EQ(p.options().every_steps, 7);
  EXPECT_FALSE(p.due(106));
  EXPECT_TRUE(p.due(107));
  EXPECT_TRUE(p.due(114));
  p.set_every_steps(0);  // refused: the interval stays
  EXPECT_EQ(p.options().every_steps, 7);
  for (CheckpointPolicyMode m : {CheckpointPolicyMode::kFixed, CheckpointPolicyMode::kYoungDaly})
    EXPECT_EQ(checkpoint_policy_mode_from_name(checkpoint_policy_mode_name(m)), m);
  EXPECT_FALSE(checkpoint_policy_mode_from_name("often").has_value());
}

TEST(CheckpointPolicy, PruneKeepsTheNewestCommittedAndTouchesNothingElse) {
  const fs::path root = testing_support::scratch_dir("prune");
  const fs::path ck = root / "checkpoints";
  auto commit = [&](const std::string& name) {
    fs::create_directories(ck / name);
    std::ofstream(ck / name / "manifest.json") << "{}";
  };
  for (const char* n : {"step_00000002", "step_00000004", "step_00000006", "step_00000008"}) commit(n);
  fs::create_directories(ck / "step_00000009");  // being written: no manifest, not committed
  fs::create_directories(root / "elsewhere" / "step_00000001");
  std::ofstream(root / "elsewhere" / "step_00000001" / "manifest.json") << "{}";
  fs::create_directory_symlink(root / "elsewhere" / "step_00000001", ck / "step_00000000");

  Result<std::vector<std::string>> gone = checkpoint_prune(ck.string(), 2);
  ASSERT_TRUE(gone.ok()) << gone.error();
  ASSERT_EQ(gone->size(), 2u);
  EXPECT_EQ(fs::path(gone->at(0)).filename(), "step_00000002");
  EXPECT_EQ(fs::path(gone->at(1)).filename(), "step_00000004");
  EXPECT_FALSE(fs::exists(ck / "step_00000002"));
  EXPECT_FALSE(fs::exists(ck / "step_00000004"));
  EXPECT_TRUE(fs::exists(ck / "step_00000006/manifest.json"));
  EXPECT_TRUE(fs::exists(ck / "step_00000008/manifest.json"));
  EXPECT_TRUE(fs::exists(ck / "step_00000009"));  // uncommitted: not the policy's to delete
  EXPECT_TRUE(
      fs::exists(root / "elsewhere" / "step_00000001" / "manifest.json"));  // a link is never followed
  EXPECT_TRUE(fs::is_symlink(ck / "step_00000000"));

  Result<std::vector<std::string>> again = checkpoint_prune(ck.string(), 2);
  ASSERT_TRUE(again.ok());
  EXPECT_TRUE(again->empty());
  fs::remove_all(root);
}

}  // namespace
}  // namespace gantry
