// Alert rules without a coordinator: the strict reading of a rule (each refusal names the field and what
// would be right), the TOML rules file, and the evaluator's transitions (once per firing, hysteresis,
// absence, NaN, a rank's excess, ETTR, clears when a run ends or a rule goes); the command hook in real
// processes (its exit status, its environment, a hanging hook and its child killed at the timeout).
#include "engine/cluster/alert_rules.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>

#include "engine/cluster/alert_hook.h"
#include "tests/scratch_dir.h"

namespace gantry {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using ::testing::HasSubstr;

AlertRule rule(const json& j) {
  Result<AlertRule> r = alert_rule_parse(j);
  EXPECT_TRUE(r.ok()) << r.error();
  return r.ok() ? r.value() : AlertRule{};
}

std::string refusal(const json& j) {
  Result<AlertRule> r = alert_rule_parse(j);
  EXPECT_FALSE(r.ok()) << j.dump();
  return r.ok() ? "" : r.error();
}

AlertRunSample sample(int64_t run, int64_t step, double loss) {
  AlertRunSample s;
  s.run = run;
  s.step = step;
  s.series[static_cast<size_t>(AlertSeries::kLoss)] = loss;
  s.seconds_since_step = 0;
  return s;
}

TEST(AlertRules, ReadsEachKindAndRefusesBadRulesNamingWhatWouldBeRight) {
  AlertRule r = rule({{"name", "loss_high"}, {"kind", "threshold"}, {"series", "loss"}, {"above", 6.0}});
  EXPECT_EQ(r.kind, AlertKind::kThreshold);
  EXPECT_TRUE(r.above);
  EXPECT_EQ(r.clear, 6.0);  // no hysteresis unless asked
  EXPECT_EQ(alert_rule_json(r)["above"], 6.0);
  EXPECT_EQ(rule({{"name", "stalled"}, {"kind", "absence"}, {"seconds", 30}}).seconds, 30);
  EXPECT_EQ(rule({{"name", "e"}, {"kind", "ettr"}, {"below", 0.9}}).threshold, 0.9);
  EXPECT_EQ(rule(alert_rule_json(rule({{"name", "h"},
                                       {"kind", "rank_excess"},
                                       {"above", 0.3},
                                       {"hook", "true"},
                                       {"hook_timeout_s", 2}})))
                .hook_timeout_s,
            2);

  EXPECT_THAT(
      refusal({{"name", "x"}, {"kind", "thresold"}}),
      HasSubstr(
          "field \"kind\": expected one of threshold, nan, absence, rank_excess, ettr, got \"thresold\""));
  EXPECT_THAT(refusal({{"name", "x"}, {"kind", "threshold"}, {"series", "los"}, {"above", 1}}),
              HasSubstr("field \"series\": expected one of loss, grad_norm, step_s"));
  EXPECT_THAT(refusal({{"name", "x"}, {"kind", "threshold"}, {"series", "loss"}}),
              HasSubstr("needs one of \"above\" or \"below\", e.g. \"above\": 6.0"));
  EXPECT_THAT(refusal({{"name", "x"}, {"kind", "threshold"}, {"series", "loss"}, {"above", 1}, {"below", 0}}),
              HasSubstr("not both"));
  EXPECT_THAT(refusal({{"name", "x"}, {"kind", "threshold"}, {"series", "loss"}, {"above", 5}, {"clear", 6}}),
              HasSubstr("give a value <= 5"));
  EXPECT_THAT(refusal({{"name", "x"}, {"kind", "ettr"}, {"below", 1.5}}), HasSubstr("field \"below\""));
  EXPECT_THAT(refusal({{"name", "x"}, {"kind", "ettr"}, {"above", 0.5}}),
              HasSubstr("needs \"below\", e.g. \"below\": 0.9"));
  EXPECT_THAT(refusal({{"name", "x"}, {"kind", "absence"}, {"seconds", "ten"}}),
              HasSubstr("field \"seconds\": expected a number"));
  EXPECT_THAT(refusal({{"name", "x"}, {"kind", "absence"}, {"seconds", 5}, {"serie", "loss"}}),
              HasSubstr("unknown field \"serie\""));
  EXPECT_THAT(refusal({{"name", "a b"}, {"kind", "nan"}, {"series", "loss"}}),
              HasSubstr("field \"name\": expected 1-64 characters of A-Z a-z 0-9 _ - ."));
  EXPECT_THAT(refusal({{"name", "x"}, {"kind", "nan"}, {"series", "loss"}, {"hook_timeout_s", 5}}),
              HasSubstr("without a \"hook\""));
  EXPECT_THAT(refusal({{"kind", "nan"}}), HasSubstr("field \"name\""));
}

TEST(AlertRules, ReadsARulesFileOfTablesAndNamesTheLineOfABadOne) {
  Result<std::vector<AlertRule>> rules = alert_rules_parse_toml(
      "[alert.loss_high]\nkind = \"threshold\"\nseries = \"loss\"\nabove = 6.0\nclear = 5.5\n\n"
      "[alert.stalled]\nkind = \"absence\"\nseconds = 30\nhook = \"page-oncall\"\n",
      "rules.toml");
  ASSERT_TRUE(rules.ok()) << rules.error();
  ASSERT_EQ(rules->size(), 2u);
  EXPECT_EQ(rules->at(0).name, "loss_high");
  EXPECT_EQ(rules->at(0).clear, 5.5);
  EXPECT_EQ(rules->at(1).hook, "page-oncall");
  Result<std::vector<AlertRule>> bad = alert_rules_parse_toml(
      "[alert.a]\nkind = \"nan\"\nseries = \"loss\"\n[alert.b]\nkind = \"absence\"\n", "r.toml");
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.error(), HasSubstr("r.toml:5: [alert.b]: field \"seconds\""));
  Result<std::vector<AlertRule>> stray = alert_rules_parse_toml("[rules.a]\nkind = \"nan\"\n", "r.toml");
  ASSERT_FALSE(stray.ok());
  EXPECT_THAT(stray.error(),
              HasSubstr("r.toml:2: unknown key 'rules.a.kind': each rule is a table [alert.NAME]"));
}

TEST(AlertEvaluator, FiresOncePerFiringAndClearsPastItsHysteresis) {
  const std::vector<AlertRule> rules = {rule(
      {{"name", "loss_high"}, {"kind", "threshold"}, {"series", "loss"}, {"above", 6.0}, {"clear", 5.0}})};
  AlertEvaluator ev;
  EXPECT_TRUE(ev.evaluate(rules, {sample(1, 1, 4.0)}, 100).empty());
  std::vector<AlertTransition> t = ev.evaluate(rules, {sample(1, 2, 7.0)}, 101);
  ASSERT_EQ(t.size(), 1u);
  EXPECT_EQ(t[0].change, AlertChange::kFired);
  EXPECT_EQ(t[0].message, "alert loss_high: loss 7 > 6 on run 1 at step 2");
  // Still above, then between the threshold and the clear value: the rule keeps firing, silently.
  EXPECT_TRUE(ev.evaluate(rules, {sample(1, 3, 8.0)}, 102).empty());
  EXPECT_TRUE(ev.evaluate(rules, {sample(1, 4, 5.5)}, 103).empty());
  ASSERT_EQ(ev.firing().size(), 1u);
  EXPECT_EQ(ev.firing()[0].since_unix_s, 101);
  EXPECT_EQ(*ev.firing()[0].value, 5.5);
  t = ev.evaluate(rules, {sample(1, 5, 4.9)}, 104);
  ASSERT_EQ(t.size(), 1u);
  EXPECT_EQ(t[0].change, AlertChange::kCleared);
  EXPECT_EQ(t[0].message, "alert loss_high cleared: loss 4.9 <= 5 on run 1 at step 5");
  EXPECT_TRUE(ev.firing().empty());
  // Back between the two: below the threshold, not firing, nothing.
  EXPECT_TRUE(ev.evaluate(rules, {sample(1, 6, 5.5)}, 105).empty());
  // It fires again on the next crossing: once per firing, not once ever.
  EXPECT_EQ(ev.evaluate(rules, {sample(1, 7, 6.5)}, 106).size(), 1u);
}

TEST(AlertEvaluator, UnknownValuesChangeNothingAndEachRunHasItsOwnState) {
  const std::vector<AlertRule> rules = {
      rule({{"name", "mfu_low"}, {"kind", "threshold"}, {"series", "mfu"}, {"below", 0.3}})};
  AlertEvaluator ev;
  AlertRunSample no_mfu = sample(1, 1, 3.0);  // a run whose peak is not known: no MFU
  EXPECT_TRUE(ev.evaluate(rules, {no_mfu}, 1).empty());
  AlertRunSample a = sample(1, 2, 3.0), b = sample(2, 2, 3.0);
  a.series[static_cast<size_t>(AlertSeries::kMfu)] = 0.1;
  b.series[static_cast<size_t>(AlertSeries::kMfu)] = 0.5;
  std::vector<AlertTransition> t = ev.evaluate(rules, {a, b}, 2);
  ASSERT_EQ(t.size(), 1u);
  EXPECT_EQ(t[0].run, 1);
  // Unknown again: neither fires nor clears.
  EXPECT_TRUE(ev.evaluate(rules, {no_mfu, b}, 3).empty());
  EXPECT_EQ(ev.firing().size(), 1u);
  // A rule bound to one run ignores the others.
  const std::vector<AlertRule> only2 = {
      rule({{"name", "mfu2"}, {"kind", "threshold"}, {"series", "mfu"}, {"below", 0.9}, {"run", 2}})};
  AlertEvaluator ev2;
  t = ev2.evaluate(only2, {a, b}, 1);
  ASSERT_EQ(t.size(), 1u);
  EXPECT_EQ(t[0].run, 2);
}

// A rank rule fires for the rank that first crosses its bound (a start-up hiccup on rank 0, say); while it
// holds, the listing follows the rank that is slowest now, without firing again.
TEST(AlertEvaluator, AFiringRankRuleNamesTheRankThatIsSlowestNow) {
  const std::vector<AlertRule> rules = {
      rule({{"name", "slow_rank"}, {"kind", "rank_excess"}, {"above", 0.15}})};
  auto excess = [](int64_t step, int32_t rank, double s) {
    AlertRunSample r = sample(1, step, 3.0);
    r.max_excess_s = s;
    r.excess_rank = rank;
    return r;
  };
  AlertEvaluator ev;
  std::vector<AlertTransition> t = ev.evaluate(rules, {excess(1, 0, 0.4)}, 1);
  ASSERT_EQ(t.size(), 1u);
  EXPECT_EQ(t[0].rank, 0);
  EXPECT_TRUE(ev.evaluate(rules, {excess(5, 2, 0.3)}, 2).empty());
  ASSERT_EQ(ev.firing().size(), 1u);
  EXPECT_EQ(ev.firing()[0].rank, 2);
  EXPECT_EQ(*ev.firing()[0].value, 0.3);
  EXPECT_EQ(ev.firing()[0].since_unix_s, 1);
  EXPECT_EQ(ev.firing()[0].message,
            "alert slow_rank: rank 2's excess over the median rank (s) 0.3 > 0.15 on run 1 at step 5");
}

TEST(AlertEvaluator, NanFiresOnANonFiniteValueAndAThresholdDoesNotTakeNanForAFigure) {
  const std::vector<AlertRule> rules = {
      rule({{"name", "loss_nan"}, {"kind", "nan"}, {"series", "loss"}}),
      rule({{"name", "loss_low"}, {"kind", "threshold"}, {"series", "loss"}, {"below", 1.0}})};
  AlertEvaluator ev;
  EXPECT_TRUE(ev.evaluate(rules, {sample(1, 1, 3.0)}, 1).empty());
  std::vector<AlertTransition> t = ev.evaluate(rules, {sample(1, 2, std::nan(""))}, 2);
  ASSERT_EQ(t.size(), 1u);  // loss_low does not fire on NaN (NaN < 1 is no figure)
  EXPECT_EQ(t[0].rule_name, "loss_nan");
  EXPECT_EQ(t[0].message, "alert loss_nan: loss is nan on run 1 at step 2");
  EXPECT_TRUE(ev.evaluate(rules, {sample(1, 3, std::numeric_limits<double>::infinity())}, 3).empty());
  t = ev.evaluate(rules, {sample(1, 4, 2.0)}, 4);
  ASSERT_EQ(t.size(), 1u);
  EXPECT_EQ(t[0].change, AlertChange::kCleared);
}

TEST(AlertEvaluator, AbsenceFiresAfterItsSecondsAndNotWhilePaused) {
  const std::vector<AlertRule> rules = {rule({{"name", "stalled"}, {"kind", "absence"}, {"seconds", 10}})};
  AlertEvaluator ev;
  AlertRunSample s = sample(1, 40, 3.0);
  s.seconds_since_step = 9.5;
  EXPECT_TRUE(ev.evaluate(rules, {s}, 1).empty());
  s.seconds_since_step = 10.5;
  std::vector<AlertTransition> t = ev.evaluate(rules, {s}, 2);
  ASSERT_EQ(t.size(), 1u);
  EXPECT_EQ(t[0].message, "alert stalled: no step for 10.5 s (> 10 s) on run 1 at step 40");
  s.seconds_since_step = 30;
  EXPECT_TRUE(ev.evaluate(rules, {s}, 3).empty());
  // A step came: cleared.
  s.seconds_since_step = 0.1;
  EXPECT_EQ(ev.evaluate(rules, {s}, 4).at(0).change, AlertChange::kCleared);
  // A paused run takes no steps: no absence however long, and a firing one clears.
  s.seconds_since_step = 50;
  s.paused = true;
  EXPECT_TRUE(ev.evaluate(rules, {s}, 5).empty());
  s.paused = false;
  ASSERT_EQ(ev.evaluate(rules, {s}, 6).size(), 1u);
  s.paused = true;
  t = ev.evaluate(rules, {s}, 7);
  ASSERT_EQ(t.size(), 1u);
  EXPECT_THAT(t[0].message, HasSubstr("cleared: the run is paused"));
}

TEST(AlertEvaluator, RankExcessNamesTheRankAndEttrFiresBelow) {
  const std::vector<AlertRule> rules = {
      rule({{"name", "slow_rank"}, {"kind", "rank_excess"}, {"above", 0.2}}),
      rule({{"name", "ettr_low"}, {"kind", "ettr"}, {"below", 0.9}})};
  AlertEvaluator ev;
  AlertRunSample s = sample(3, 20, 3.0);
  EXPECT_TRUE(ev.evaluate(rules, {s}, 1).empty());  // not scored yet, no ledger: unknown
  s.max_excess_s = 0.52;
  s.excess_rank = 2;
  s.ettr = 0.81;
  std::vector<AlertTransition> t = ev.evaluate(rules, {s}, 2);
  ASSERT_EQ(t.size(), 2u);
  EXPECT_EQ(t[0].rank, 2);
  EXPECT_EQ(t[0].message,
            "alert slow_rank: rank 2's excess over the median rank (s) 0.52 > 0.2 on run 3 at step 20");
  EXPECT_EQ(t[1].message, "alert ettr_low: ETTR 0.81 < 0.9 on run 3 at step 20");
}

TEST(AlertEvaluator, AFiringClearsWhenItsRunEndsOrItsRuleIsDeleted) {
  std::vector<AlertRule> rules = {
      rule({{"name", "a"}, {"kind", "threshold"}, {"series", "loss"}, {"above", 1.0}}),
      rule({{"name", "b"}, {"kind", "threshold"}, {"series", "loss"}, {"above", 1.0}})};
  AlertEvaluator ev;
  ASSERT_EQ(ev.evaluate(rules, {sample(1, 1, 3.0), sample(2, 1, 3.0)}, 1).size(), 4u);
  // Run 2 ended: its two firings clear, saying why.
  std::vector<AlertTransition> t = ev.evaluate(rules, {sample(1, 2, 3.0)}, 2);
  ASSERT_EQ(t.size(), 2u);
  EXPECT_THAT(t[0].message, HasSubstr("on run 2: the run is no longer live"));
  // Rule b deleted: its firing on run 1 clears.
  rules.pop_back();
  t = ev.evaluate(rules, {sample(1, 3, 3.0)}, 3);
  ASSERT_EQ(t.size(), 1u);
  EXPECT_EQ(t[0].rule_name, "b");
  EXPECT_EQ(t[0].rule, nullptr);
  EXPECT_THAT(t[0].message, HasSubstr("the rule was deleted"));
  EXPECT_EQ(ev.firing().size(), 1u);
}

TEST(AlertHooks, RecordsTheExitStatusAndPassesTheAlertInItsEnvironment) {
  const fs::path dir = testing_support::scratch_dir("hook");
  const std::string out = (dir / "out").string();
  AlertHookResult r = AlertHooks::run(
      "printf '%s %s' \"$GANTRY_ALERT_RULE\" \"$GANTRY_ALERT_RUN\" > " + out + "; exit 3", 10,
      {{"GANTRY_ALERT_RULE", "loss_high"}, {"GANTRY_ALERT_RUN", "7"}}, (dir / "log").string());
  EXPECT_EQ(r.end, AlertHookResult::End::kExited);
  EXPECT_EQ(r.code, 3);
  std::ifstream in(out);
  std::string text((std::istreambuf_iterator<char>(in)), {});
  EXPECT_EQ(text, "loss_high 7");
  EXPECT_THAT(r.text(10), HasSubstr("exited with status 3"));
}

TEST(AlertHooks, AHangingHookAndItsChildAreKilledAtTheTimeout) {
  const fs::path dir = testing_support::scratch_dir("hook");
  const std::string pid_file = (dir / "child.pid").string();
  // The hook starts a child that would outlive it, then hangs itself.
  AlertHookResult r =
      AlertHooks::run("sleep 300 & echo $! > " + pid_file + "; sleep 300", 0.5, {}, (dir / "log").string());
  EXPECT_EQ(r.end, AlertHookResult::End::kTimedOut);
  EXPECT_THAT(r.text(0.5), HasSubstr("killed after its 0.5 s timeout"));
  std::ifstream in(pid_file);
  pid_t child = 0;
  ASSERT_TRUE(in >> child);
  // The child was in the hook's group: killed with it (it is reparented to init, which reaps it).
  // (a zombie not yet reaped by whoever adopted it counts as gone: it runs no more).
  auto dead = [](pid_t p) {
    std::ifstream stat("/proc/" + std::to_string(p) + "/stat");
    std::string pid_s, comm, state;
    if (!(stat >> pid_s >> comm >> state)) return true;
    return state == "Z" || state == "X";
  };
  bool gone = false;
  for (int k = 0; k < 500 && !gone; ++k) {
    gone = dead(child);
    if (!gone) ::usleep(10000);
  }
  EXPECT_TRUE(gone) << "the hook's child " << child << " outlived the timeout";
}

}  // namespace
}  // namespace gantry
