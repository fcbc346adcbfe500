// The run lifecycle on its own, without HTTP: every state's name, every transition (allowed or refused, with
// a reason), every action in every state (the refusal an operator reads), and what an accepted action does
// to the state.
#include "engine/cluster/run_lifecycle.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>
#include <set>
#include <string>
#include <utility>

namespace gantry {
namespace {

using ::testing::HasSubstr;

using S = RunState;
using A = RunAction;

std::string name(S s) {
  return std::string(run_state_name(s));
}
std::string name(A a) {
  return std::string(run_action_name(a));
}

TEST(RunLifecycle, StatesKeepTheApisWords) {
  const std::map<S, std::string> want = {{S::kRunning, "running"},        {S::kPaused, "paused"},
                                         {S::kStopping, "stopping"},      {S::kFinished, "finished"},
                                         {S::kFailed, "failed"},          {S::kStopped, "stopped"},
                                         {S::kInterrupted, "interrupted"}};
  ASSERT_EQ(std::size(kRunStates), want.size());
  for (S s : kRunStates) {
    EXPECT_EQ(name(s), want.at(s));
    EXPECT_EQ(run_state_from_name(name(s)), s);
  }
  EXPECT_EQ(run_state_from_name("Running"), std::nullopt);  // one spelling
  EXPECT_EQ(run_state_from_name(""), std::nullopt);
  EXPECT_EQ(run_state_from_name("resuming"), std::nullopt);
}

TEST(RunLifecycle, TerminalStatesAreTheEndedOnes) {
  const std::set<S> ended = {S::kFinished, S::kFailed, S::kStopped, S::kInterrupted};
  for (S s : kRunStates) {
    EXPECT_EQ(run_state_terminal(s), ended.count(s) == 1) << name(s);
    EXPECT_EQ(run_state_terminal(run_state_name(s)), ended.count(s) == 1) << name(s);
  }
  EXPECT_FALSE(run_state_terminal(std::string_view("archived")));  // an unknown word is assumed of nothing
  EXPECT_FALSE(run_state_terminal(std::string_view("")));
}

TEST(RunLifecycle, EveryTransition) {
  // The diagram of run_lifecycle.h, as (from, to) pairs; every other pair is refused.
  const std::set<std::pair<S, S>> allowed = {
      {S::kRunning, S::kPaused},   {S::kRunning, S::kStopping},     {S::kRunning, S::kFinished},
      {S::kRunning, S::kFailed},   {S::kRunning, S::kStopped},      {S::kRunning, S::kInterrupted},
      {S::kPaused, S::kRunning},   {S::kPaused, S::kStopping},      {S::kPaused, S::kFinished},
      {S::kPaused, S::kFailed},    {S::kPaused, S::kStopped},       {S::kPaused, S::kInterrupted},
      {S::kStopping, S::kRunning}, {S::kStopping, S::kFinished},    {S::kStopping, S::kFailed},
      {S::kStopping, S::kStopped}, {S::kStopping, S::kInterrupted}, {S::kFailed, S::kRunning},
      {S::kStopped, S::kRunning},  {S::kInterrupted, S::kRunning},
  };
  int checked = 0;
  for (S from : kRunStates) {
    for (S to : kRunStates) {
      const Status s = run_transition_check(from, to);
      const bool want = allowed.count({from, to}) == 1;
      EXPECT_EQ(s.ok(), want) << name(from) << " -> " << name(to) << ": " << s.message();
      if (!want) {
        EXPECT_THAT(s.message(), HasSubstr(name(from) + " -> " + name(to) + ": "));
        EXPECT_GT(s.message().size(), name(from).size() + name(to).size() + 6) << "refused without a reason";
      }
      ++checked;
    }
  }
  EXPECT_EQ(checked, 49);
}

TEST(RunLifecycle, RefusedTransitionsSayWhy) {
  EXPECT_THAT(run_transition_check(S::kFinished, S::kRunning).message(),
              HasSubstr("a finished run is final"));
  EXPECT_THAT(run_transition_check(S::kStopping, S::kPaused).message(), HasSubstr("does not pause"));
  EXPECT_THAT(run_transition_check(S::kStopped, S::kPaused).message(), HasSubstr("resume-from"));
  EXPECT_THAT(run_transition_check(S::kRunning, S::kRunning).message(), HasSubstr("not a change"));
}

TEST(RunLifecycle, ActionsKeepTheApisWords) {
  const std::map<A, std::string> want = {{A::kCheckpoint, "checkpoint"},  {A::kPause, "pause"},
                                         {A::kResume, "resume"},          {A::kStop, "stop"},
                                         {A::kResumeFrom, "resume-from"}, {A::kQuarantineMove, "quarantine"}};
  ASSERT_EQ(std::size(kRunActions), want.size());
  for (A a : kRunActions) {
    EXPECT_EQ(name(a), want.at(a));
    EXPECT_EQ(run_action_from_name(name(a)), a);
  }
  EXPECT_EQ(run_action_from_name("resume_from"), std::nullopt);
}

// Every action in every state: "" when taken, else the refusal (the text after "cannot <do> run N: ").
TEST(RunLifecycle, EveryActionInEveryState) {
  const std::string resume_from_live =
      ": stop it first (only a stopped, failed or interrupted run resumes from a checkpoint)";
  const std::string resume_from_ended =
      " (only a stopped, failed or interrupted run resumes from a checkpoint)";
  const std::map<std::pair<A, S>, std::string> want = {
      {{A::kCheckpoint, S::kRunning}, ""},
      {{A::kCheckpoint, S::kPaused}, ""},
      {{A::kCheckpoint, S::kStopping}, "it is stopping"},
      {{A::kCheckpoint, S::kFinished}, "it is finished"},
      {{A::kCheckpoint, S::kFailed}, "it is failed"},
      {{A::kCheckpoint, S::kStopped}, "it is stopped"},
      {{A::kCheckpoint, S::kInterrupted}, "it is interrupted"},
      {{A::kPause, S::kRunning}, ""},
      {{A::kPause, S::kPaused}, "it is already paused"},
      {{A::kPause, S::kStopping}, "it is stopping"},
      {{A::kPause, S::kFinished}, "it is finished"},
      {{A::kPause, S::kFailed}, "it is failed"},
      {{A::kPause, S::kStopped}, "it is stopped"},
      {{A::kPause, S::kInterrupted}, "it is interrupted"},
      {{A::kResume, S::kRunning}, "it is running, not paused"},
      {{A::kResume, S::kPaused}, ""},
      {{A::kResume, S::kStopping}, "it is stopping"},
      {{A::kResume, S::kFinished}, "it is finished"},
      {{A::kResume, S::kFailed}, "it is failed"},
      {{A::kResume, S::kStopped}, "it is stopped"},
      {{A::kResume, S::kInterrupted}, "it is interrupted"},
      {{A::kStop, S::kRunning}, ""},
      {{A::kStop, S::kPaused}, ""},
      {{A::kStop, S::kStopping}, "it is stopping"},
      {{A::kStop, S::kFinished}, "it is finished"},
      {{A::kStop, S::kFailed}, "it is failed"},
      {{A::kStop, S::kStopped}, "it is stopped"},
      {{A::kStop, S::kInterrupted}, "it is interrupted"},
      {{A::kResumeFrom, S::kRunning}, "it is running" + resume_from_live},
      {{A::kResumeFrom, S::kPaused}, "it is paused" + resume_from_live},
      {{A::kResumeFrom, S::kStopping}, "it is stopping" + resume_from_live},
      {{A::kResumeFrom, S::kFinished}, "it is finished" + resume_from_ended},
      {{A::kResumeFrom, S::kFailed}, ""},
      {{A::kResumeFrom, S::kStopped}, ""},
      {{A::kResumeFrom, S::kInterrupted}, ""},
      {{A::kQuarantineMove, S::kRunning}, ""},
      {{A::kQuarantineMove, S::kPaused}, ""},
      {{A::kQuarantineMove, S::kStopping}, "it is stopping"},
      {{A::kQuarantineMove, S::kFinished}, "it is finished"},
      {{A::kQuarantineMove, S::kFailed}, "it is failed"},
      {{A::kQuarantineMove, S::kStopped}, "it is stopped"},
      {{A::kQuarantineMove, S::kInterrupted}, "it is interrupted"},
  };
  ASSERT_EQ(want.size(), std::size(kRunActions) * std::size(kRunStates));
  for (A a : kRunActions) {
    for (S s : kRunStates) {
      const Status st = run_action_check(a, s);
      const std::string& w = want.at({a, s});
      EXPECT_EQ(st.ok(), w.empty()) << name(a) << " in " << name(s);
      EXPECT_EQ(st.message(), w) << name(a) << " in " << name(s);
    }
  }
}

// An accepted action's state change is itself a change the lifecycle allows, from every state that takes it.
TEST(RunLifecycle, AcceptedActionsLeadToAllowedStates) {
  EXPECT_EQ(run_action_target(A::kStop), S::kStopping);
  EXPECT_EQ(run_action_target(A::kQuarantineMove), S::kStopping);
  EXPECT_EQ(run_action_target(A::kResumeFrom), S::kRunning);
  EXPECT_EQ(run_action_target(A::kCheckpoint), std::nullopt);
  EXPECT_EQ(run_action_target(A::kPause), std::nullopt);  // rank 0's event pauses it
  EXPECT_EQ(run_action_target(A::kResume), std::nullopt);
  for (A a : kRunActions) {
    const std::optional<S> to = run_action_target(a);
    if (!to) continue;
    for (S s : kRunStates) {
      if (!run_action_check(a, s).ok()) continue;
      EXPECT_TRUE(run_transition_check(s, *to).ok()) << name(a) << " from " << name(s);
    }
  }
  // Rank 0's word for pause and resume: the changes those actions lead to are allowed where they are taken.
  EXPECT_TRUE(run_transition_check(S::kRunning, S::kPaused).ok());
  EXPECT_TRUE(run_transition_check(S::kPaused, S::kRunning).ok());
}

}  // namespace
}  // namespace gantry
