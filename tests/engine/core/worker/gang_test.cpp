// The local launcher's gang semantics, driven with a stand-in worker (gang_fake_worker.cpp) so each path
// takes milliseconds: a clean gang, each way a rank can fail, the join timeout, a worker that ignores
// SIGTERM, a stop request. After every run no worker pid may remain.
#include "engine/core/worker/gang.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <thread>

#include "engine/core/worker/hang_blame.h"

namespace gantry {
namespace {

using namespace std::chrono_literals;
using ::testing::HasSubstr;
using ::testing::Not;
using Clock = std::chrono::steady_clock;

GangOptions fake(int n, const std::string& mode) {
  GangOptions g;
  g.nproc = n;
  g.exe = GANG_FAKE_WORKER;
  g.args = {mode};
  g.env = {{"GANG_TEST_EXTRA", "yes"}};
  for (int r = 0; r < n; ++r) g.cuda_devices.push_back("dev" + std::to_string(r));
  g.join_timeout = 5s;
  g.fail_grace = 500ms;
  g.stop_grace = 2s;
  return g;
}

void expect_all_gone(const GangResult& r) {
  for (const GangWorker& w : r.workers) {
    ASSERT_GT(w.pid, 0);
    errno = 0;
    EXPECT_EQ(::kill(static_cast<pid_t>(w.pid), 0), -1)
        << "rank " << w.rank << " pid " << w.pid << " left behind";
    EXPECT_EQ(errno, ESRCH);
  }
}

TEST(Gang, CleanGangDeliversHelloRecordsAndGoodbyes) {
  GangOptions g = fake(3, "ok");
  int hellos = 0, spawned = 0;
  std::vector<int> record_ranks;
  g.on_spawn = [&](int, int64_t) { ++spawned; };
  g.on_hello = [&](const WorkerHello& h) {
    ++hellos;
    EXPECT_EQ(h.world, 3);
    EXPECT_EQ(h.host, "fake");
  };
  g.on_records = [&](int rank, const RecordBatch& b) {
    ASSERT_EQ(b.rank_steps.size(), 1u);
    EXPECT_EQ(b.rank_steps[0].rank, rank);
    record_ranks.push_back(rank);
  };
  GangResult r = gang_run(g);
  EXPECT_EQ(r.code, 0) << r.error;
  EXPECT_EQ(r.failed_rank, -1);
  EXPECT_EQ(spawned, 3);
  EXPECT_EQ(hellos, 3);
  EXPECT_EQ(record_ranks.size(), 3u);
  EXPECT_EQ(r.final_message, "done: rank 0");
  ASSERT_EQ(r.workers.size(), 3u);
  for (const GangWorker& w : r.workers) {
    // A non-zero code here is check_environment's verdict on what the launcher handed the worker.
    EXPECT_TRUE(w.exited && w.code == 0) << "rank " << w.rank << " code " << w.code << " signal " << w.signal;
    EXPECT_TRUE(w.joined);
    EXPECT_TRUE(w.said_goodbye);
  }
  expect_all_gone(r);
}

TEST(Gang, RankFailingWithAMessageIsNamedWithIt) {
  GangResult r = gang_run(fake(3, "fail_rank1"));
  EXPECT_EQ(r.code, 1);
  EXPECT_EQ(r.failed_rank, 1);
  EXPECT_THAT(r.error, HasSubstr("rank 1 (pid " + std::to_string(r.workers[1].pid) + ")"));
  EXPECT_THAT(r.error, HasSubstr("exited with code 1: rank 1: something broke"));
  EXPECT_THAT(r.error, HasSubstr("the other 2 ranks were stopped"));
  EXPECT_EQ(r.workers[0].signal, SIGTERM);  // the others were waiting; SIGTERM ended them
  expect_all_gone(r);
}

// A running rank that stops beating is hung: the gang fails naming it (not its peers, which beat on), with
// where its last beat was, and it is killed at once rather than after the grace (it may not run at all).
TEST(Gang, SilentRankIsNamedByTheHangTimeout) {
  GangOptions g = fake(3, "beat_mute_rank1");
  g.hang_timeout = 300ms;
  g.fail_grace = 60s;  // the peers stop on SIGTERM; the hung rank must not wait for this
  GangResult r = gang_run(g);
  EXPECT_EQ(r.code, 1) << r.error;
  EXPECT_TRUE(r.hang);
  EXPECT_TRUE(r.hang_by_timeout);
  EXPECT_EQ(r.failed_rank, 1);
  EXPECT_GE(r.hang_silent_ms, 300);
  EXPECT_THAT(r.error,
              HasSubstr("rank 1 (pid " + std::to_string(r.workers[1].pid) + ") hung: no heartbeat for"));
  EXPECT_THAT(r.error, HasSubstr("its last heartbeat was at step 4 (step), after collective #4"));
  EXPECT_EQ(r.workers[1].signal, SIGKILL);
  EXPECT_TRUE(r.workers[1].killed_by_launcher);
}

// Told to stop from outside (the coordinator stops a run's other gangs when one fails) while one of its
// ranks is SIGSTOPped: that rank is what the other node's ranks timed out waiting for, so the gang reports
// it as the failure (code 1, hang) instead of a plain stop (130), and SIGKILLs it at once (a stopped process
// cannot act on SIGTERM). It used to end 130, and the run's message named the peers that timed out.
TEST(Gang, OutsideStopNamesTheRankThatStoppedAnswering) {
  GangOptions g = fake(3, "stop_on_term");
  std::atomic<bool> stop{false};
  g.stop = &stop;
  g.stop_grace = 60s;  // the stopped rank must not wait for this
  std::vector<pid_t> pids(3, -1);
  g.on_spawn = [&](int rank, int64_t pid) { pids[static_cast<size_t>(rank)] = static_cast<pid_t>(pid); };
  int hellos = 0;
  g.on_hello = [&](const WorkerHello&) {
    if (++hellos < 3) return;
    ASSERT_EQ(::kill(pids[1], SIGSTOP), 0);
    // The stop is looked at after the hello's round: by then the kernel shows rank 1 stopped or stopping.
    for (int i = 0; i < 1000 && hang_process_state(pids[1]) != 'T'; ++i) std::this_thread::sleep_for(1ms);
    stop.store(true);
  };
  GangResult r = gang_run(g);
  EXPECT_TRUE(r.interrupted);
  EXPECT_EQ(r.code, 1) << r.error;
  EXPECT_TRUE(r.hang);
  EXPECT_FALSE(r.hang_by_timeout);
  EXPECT_EQ(r.failed_rank, 1);
  EXPECT_THAT(r.error, HasSubstr("rank 1 (pid " + std::to_string(pids[1]) +
                                 ") stopped answering: its process is stopped (state T"));
  EXPECT_THAT(r.error, HasSubstr("found when the launcher was told to stop the gang"));
  EXPECT_EQ(r.workers[1].signal, SIGKILL);
  EXPECT_TRUE(r.workers[1].killed_by_launcher);
  for (int k : {0, 2})
    EXPECT_TRUE(r.workers[static_cast<size_t>(k)].exited && r.workers[static_cast<size_t>(k)].code == 130);
  expect_all_gone(r);
}

// Beats alone, doing nothing else for many hang timeouts, are a healthy rank; after its last beat
// (interval 0) a rank on its way out is not expected to beat again.
TEST(Gang, BeatingRanksAndRanksPastTheirLastBeatAreNotHung) {
  GangOptions g = fake(2, "beat_then_done");
  g.hang_timeout = 200ms;
  GangResult r = gang_run(g);
  EXPECT_EQ(r.code, 0) << r.error;
  EXPECT_FALSE(r.hang);
}

TEST(Gang, BadInputIsPassedOnAsExitCode2) {
  GangResult r = gang_run(fake(2, "bad_input"));
  EXPECT_EQ(r.code, 2);
  EXPECT_THAT(r.error, HasSubstr("bad config"));
  expect_all_gone(r);
}

TEST(Gang, WorkerKilledBySignalIsTheRootCause) {
  // The others wait forever in the fake worker: the gang ending at all shows the launcher stopped them.
  GangResult r = gang_run(fake(3, "crash_rank1"));
  EXPECT_EQ(r.code, 1);
  EXPECT_EQ(r.failed_rank, 1);
  EXPECT_THAT(r.error,
              HasSubstr("rank 1 (pid " + std::to_string(r.workers[1].pid) + ") was killed by SIGKILL"));
  EXPECT_THAT(r.error, HasSubstr("the other 2 ranks were stopped"));
  EXPECT_TRUE(r.workers[0].signalled_by_launcher);
  expect_all_gone(r);
}

// A worker killed in the middle of sending a frame closes its socket before waitpid can see it dead: the
// launcher named it as breaking the protocol ("truncated frame") instead of killed by the signal, which
// RunCli.WorkerKilledMidRunStopsTheOthersAndIsNamed hit under load.
TEST(Gang, WorkerKilledMidFrameIsNamedByItsSignalNotAsAProtocolBreak) {
  for (int round = 0; round < 5; ++round) {  // the race is the kernel's: several tries make the old code fail
    GangResult r = gang_run(fake(2, "crash_mid_frame_rank1"));
    EXPECT_EQ(r.code, 1);
    EXPECT_EQ(r.failed_rank, 1);
    EXPECT_THAT(r.error,
                HasSubstr("rank 1 (pid " + std::to_string(r.workers[1].pid) + ") was killed by SIGKILL"));
    EXPECT_THAT(r.error, Not(HasSubstr("broke the launcher protocol")));
    expect_all_gone(r);
  }
}

TEST(Gang, WorkerThatNeverJoinsFailsTheGangAtTheJoinTimeout) {
  GangOptions g = fake(2, "no_hello");
  g.join_timeout = 400ms;
  const auto t0 = Clock::now();
  GangResult r = gang_run(g);
  const auto took = Clock::now() - t0;
  EXPECT_EQ(r.code, 1);
  EXPECT_EQ(r.failed_rank, 0);
  EXPECT_THAT(r.error, HasSubstr("did not join within 0.4 s"));
  EXPECT_GE(took, 400ms);  // not before the timeout; how soon after is the scheduler's, not a behaviour
  expect_all_gone(r);
}

TEST(Gang, ExecFailureIsAFailureBeforeJoining) {
  GangOptions g = fake(2, "ok");
  g.exe = "/nonexistent/gantry-worker";
  GangResult r = gang_run(g);
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.error, HasSubstr("exited with code 127 before joining"));
  expect_all_gone(r);
}

TEST(Gang, ClosedSocketWhileRunningIsAFailure) {
  GangResult r = gang_run(fake(2, "close_socket"));
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.error, HasSubstr("closed its connection to the launcher (peer closed) but kept running"));
  expect_all_gone(r);
}

TEST(Gang, GarbageOnTheSocketIsAProtocolFailure) {
  GangResult r = gang_run(fake(2, "garbage"));
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.error, HasSubstr("broke the launcher protocol: frame decode: bad magic"));
  expect_all_gone(r);
}

TEST(Gang, HelloWithTheWrongRankIsAProtocolFailure) {
  GangResult r = gang_run(fake(2, "wrong_rank"));
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.error,
              HasSubstr("rank 1 (pid " + std::to_string(r.workers[1].pid) +
                        ") broke the launcher protocol: its hello says rank 101 of 2, but it was started as "
                        "rank 1 of 2"));
  expect_all_gone(r);
}

TEST(Gang, WorkerIgnoringSigtermIsKilledAfterTheGrace) {
  GangOptions g = fake(2, "ignore_term");
  g.join_timeout = 10s;
  std::atomic<bool> stop{false};
  g.stop = &stop;
  g.stop_grace = 300ms;
  // Stopped once both have said hello: they ignore SIGTERM from before it (a stop sent earlier, on a slow
  // machine, reached a worker still starting, which SIGTERM ended by itself).
  std::atomic<int> hellos{0};
  g.on_hello = [&](const WorkerHello&) { ++hellos; };
  std::thread stopper([&] {
    for (int i = 0; i < 3000 && hellos.load() < 2; ++i) std::this_thread::sleep_for(10ms);
    stop.store(true);
  });
  GangResult r = gang_run(g);
  stopper.join();
  EXPECT_TRUE(r.interrupted);
  EXPECT_EQ(r.code, 130);
  for (const GangWorker& w : r.workers) {
    EXPECT_TRUE(w.killed_by_launcher) << "rank " << w.rank;
    EXPECT_EQ(w.signal, SIGKILL);
  }
  expect_all_gone(r);
}

TEST(Gang, SecondStopRequestKillsWithoutWaitingOutTheGrace) {
  GangOptions g = fake(2, "ignore_term");
  std::atomic<bool> stop{false}, kill_now{false};
  g.stop = &stop;
  g.kill_now = &kill_now;
  g.stop_grace = 60s;
  std::atomic<int> hellos{0};  // stopped once both ignore SIGTERM (above)
  g.on_hello = [&](const WorkerHello&) { ++hellos; };
  std::thread stopper([&] {
    for (int i = 0; i < 3000 && hellos.load() < 2; ++i) std::this_thread::sleep_for(10ms);
    stop.store(true);
    std::this_thread::sleep_for(200ms);
    kill_now.store(true);
  });
  const auto t0 = Clock::now();
  GangResult r = gang_run(g);
  stopper.join();
  EXPECT_LT(Clock::now() - t0, g.stop_grace) << "the second request must not wait out the 60 s grace";
  EXPECT_EQ(r.code, 130);
  for (const GangWorker& w : r.workers) EXPECT_TRUE(w.killed_by_launcher) << "rank " << w.rank;
  expect_all_gone(r);
}

TEST(Gang, StopRequestForwardsSigtermAndCollectsTheGoodbyes) {
  GangOptions g = fake(3, "stop_on_term");
  std::atomic<bool> stop{false};
  g.stop = &stop;
  int hellos = 0;
  g.on_hello = [&](const WorkerHello&) {
    if (++hellos == 3) stop.store(true);  // as if Ctrl-C came once everyone was training
  };
  GangResult r = gang_run(g);
  EXPECT_TRUE(r.interrupted);
  EXPECT_EQ(r.code, 130);
  EXPECT_EQ(r.final_message, "stopped at step 7");
  for (const GangWorker& w : r.workers) {
    EXPECT_TRUE(w.exited && w.code == 130) << "rank " << w.rank;
    EXPECT_FALSE(w.killed_by_launcher);
  }
  expect_all_gone(r);
}

TEST(Gang, TooFewCudaDevicesIsRefusedBeforeStarting) {
  GangOptions g = fake(3, "ok");
  g.cuda_devices = {"0", "1"};
  GangResult r = gang_run(g);
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.error, HasSubstr("3 workers but only 2 CUDA devices"));
  for (const GangWorker& w : r.workers) EXPECT_EQ(w.pid, -1);
}

}  // namespace
}  // namespace gantry
