// The Gloo communicator across real processes: the test forks N workers, each holding one end of a
// socketpair whose other end the parent serves with a StoreServer (the launcher's role). Workers check
// every collective against values computed locally from every rank's seed, bit for bit in the ring's
// documented sum order; failure tests kill, stall or abort a rank and check that the others fail naming
// the cause within the timeout, and that the parent reaps every child (no process left behind).
#include "engine/core/comm/gloo_communicator.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <string>
#include <thread>
#include <vector>

#include "engine/core/comm/communicator.h"
#include "tests/engine/core/comm/worker_harness.h"

namespace gantry {
namespace {

using namespace comm_test;

// ---- data and checks ------------------------------------------------------------------------------

// The documented order: block c is ((x[c+1] + x[c+2]) + ...) + x[c], ranks mod n.
std::vector<float> ring_sum(const std::vector<std::vector<float>>& x, int n, size_t count) {
  std::vector<float> out(count);
  for (int c = 0; c < n; ++c) {
    CommBlock b = comm_block(count, n, c);
    for (size_t i = b.offset; i < b.offset + b.count; ++i) {
      float acc = x[static_cast<size_t>((c + 1) % n)][i];
      for (int k = 2; k <= n; ++k) acc = acc + x[static_cast<size_t>((c + k) % n)][i];
      out[i] = acc;
    }
  }
  return out;
}

std::string collectives_body(int rank, int n, int fd) {
  auto made = gloo_communicator_create(rank, n, fd, "test/", 10s);
  if (!made.ok()) return made.error();
  Communicator& comm = *made.value();
  if (comm.rank() != rank || comm.size() != n) return "wrong rank/size";
  std::string errors;
  const std::vector<size_t> counts = {1, static_cast<size_t>(n - 1), 7, 1000, 65537};
  for (size_t count : counts) {
    if (count == 0) continue;
    std::vector<std::vector<float>> x;
    for (int r = 0; r < n; ++r) x.push_back(rank_data(r, count, 1));
    const std::vector<float> want = ring_sum(x, n, count);
    const std::string at = " (count " + std::to_string(count) + ")";
    const CommBlock mine = comm_block(count, n, rank);

    // all_reduce, twice: the same bits both times (determinism), and the documented order.
    std::vector<float> a = x[static_cast<size_t>(rank)], b = x[static_cast<size_t>(rank)];
    WORKER_CHECK_OK(comm.all_reduce(a.data(), count, 10s));
    WORKER_CHECK_OK(comm.all_reduce(b.data(), count, 10s));
    errors += diff_bits(a.data(), want.data(), count, "all_reduce" + at);
    errors += diff_bits(b.data(), a.data(), count, "second all_reduce of the same data" + at);
    // Loose sanity against a double-precision sum, in case the expected order itself were wrong.
    for (size_t i = 0; i < count; ++i) {
      double s = 0;
      for (int r = 0; r < n; ++r) s += x[static_cast<size_t>(r)][i];
      if (std::fabs(a[i] - s) > 1e-5) {
        errors += "all_reduce far from the exact sum at " + std::to_string(i) + at + "\n";
        break;
      }
    }

    // reduce_scatter: out of place (input untouched), then in place.
    std::vector<float> in = x[static_cast<size_t>(rank)];
    std::vector<float> shard(mine.count, NAN);
    WORKER_CHECK_OK(comm.reduce_scatter(in.data(), shard.data(), count, 10s));
    errors += diff_bits(shard.data(), want.data() + mine.offset, mine.count, "reduce_scatter" + at);
    errors += diff_bits(in.data(), x[static_cast<size_t>(rank)].data(), count, "reduce_scatter input" + at);
    WORKER_CHECK_OK(comm.reduce_scatter(in.data(), in.data() + mine.offset, count, 10s));
    errors += diff_bits(in.data() + mine.offset, want.data() + mine.offset, mine.count,
                        "in-place reduce_scatter" + at);

    // all_gather of the reduced shards gives back all_reduce's result, bit for bit (ZeRO == DP).
    std::vector<float> gathered(count, NAN);
    WORKER_CHECK_OK(comm.all_gather(shard.data(), gathered.data(), count, 10s));
    errors += diff_bits(gathered.data(), a.data(), count, "reduce_scatter + all_gather vs all_reduce" + at);
    std::vector<float> inplace(count, NAN);
    std::copy(want.begin() + static_cast<std::ptrdiff_t>(mine.offset),
              want.begin() + static_cast<std::ptrdiff_t>(mine.offset + mine.count),
              inplace.begin() + static_cast<std::ptrdiff_t>(mine.offset));
    WORKER_CHECK_OK(comm.all_gather(inplace.data() + mine.offset, inplace.data(), count, 10s));
    errors += diff_bits(inplace.data(), want.data(), count, "in-place all_gather" + at);

    // broadcast from every root.
    for (int root = 0; root < n; ++root) {
      std::vector<float> buf = rank == root ? x[static_cast<size_t>(root)] : std::vector<float>(count, 0.0f);
      WORKER_CHECK_OK(comm.broadcast(buf.data(), count, root, 10s));
      errors += diff_bits(buf.data(), x[static_cast<size_t>(root)].data(), count,
                          "broadcast from " + std::to_string(root) + at);
    }
  }

  // send/recv around the ring, two messages each way in order. Even ranks send first, odd ranks receive
  // first: a send completes only once its peer receives, so all sending first would deadlock.
  const int right = (rank + 1) % n, left = (rank + n - 1) % n;
  auto msg = [](int from, size_t count, uint64_t k) { return rank_data(from, count, 100 + k); };
  std::vector<float> r1(5), r2(1000);
  auto do_send = [&]() -> std::string {
    auto m1 = msg(rank, 5, 1), m2 = msg(rank, 1000, 2);
    WORKER_CHECK_OK(comm.send(m1.data(), 5, right, 10s));
    WORKER_CHECK_OK(comm.send(m2.data(), 1000, right, 10s));
    return "";
  };
  auto do_recv = [&]() -> std::string {
    WORKER_CHECK_OK(comm.recv(r1.data(), 5, left, 10s));
    WORKER_CHECK_OK(comm.recv(r2.data(), 1000, left, 10s));
    return "";
  };
  std::string e1 = rank % 2 == 0 ? do_send() : do_recv();
  std::string e2 = rank % 2 == 0 ? do_recv() : do_send();
  if (!e1.empty() || !e2.empty()) return errors + e1 + e2;
  errors += diff_bits(r1.data(), msg(left, 5, 1).data(), 5, "recv 1");
  errors += diff_bits(r2.data(), msg(left, 1000, 2).data(), 1000, "recv 2");

  // send_recv around the ring: every rank sends right and receives from left in one call, all at once,
  // which separate blocking sends would deadlock on (a pipeline stage handing on an activation while taking
  // a gradient). Then both ways between neighbours 0 and 1 in one call each, and a half-empty one.
  {
    auto m = msg(rank, 700, 5);
    std::vector<float> got(700, NAN);
    WORKER_CHECK_OK(comm.send_recv(m.data(), 700, right, got.data(), 700, left, 10s));
    errors += diff_bits(got.data(), msg(left, 700, 5).data(), 700, "send_recv around the ring");
    if (rank < 2) {
      const int other = 1 - rank;
      auto mine = msg(rank, 64, 6);
      std::vector<float> theirs(64, NAN);
      WORKER_CHECK_OK(comm.send_recv(mine.data(), 64, other, theirs.data(), 64, other, 10s));
      errors += diff_bits(theirs.data(), msg(other, 64, 6).data(), 64, "send_recv both ways");
      if (rank == 0) {
        WORKER_CHECK_OK(comm.send_recv(mine.data(), 64, 1, nullptr, 0, -1, 10s));
      } else {
        WORKER_CHECK_OK(comm.send_recv(nullptr, 0, -1, theirs.data(), 64, 0, 10s));
        errors += diff_bits(theirs.data(), msg(0, 64, 6).data(), 64, "send_recv with one half");
      }
    }
  }

  // Point to point between ranks 0 and 1 only: the other ranks sit it out, and the collectives after
  // it must still line up on every rank.
  if (rank < 2) {
    std::vector<float> m = msg(rank, 300, 3), got(300);
    if (rank == 0) {
      WORKER_CHECK_OK(comm.send(m.data(), 300, 1, 10s));
    } else {
      WORKER_CHECK_OK(comm.recv(got.data(), 300, 0, 10s));
      errors += diff_bits(got.data(), msg(0, 300, 3).data(), 300, "recv from rank 0 only");
    }
  }
  {
    std::vector<std::vector<float>> x;
    for (int r = 0; r < n; ++r) x.push_back(rank_data(r, 33, 4));
    std::vector<float> a = x[static_cast<size_t>(rank)];
    WORKER_CHECK_OK(comm.all_reduce(a.data(), 33, 10s));
    errors += diff_bits(a.data(), ring_sum(x, n, 33).data(), 33, "all_reduce after a point-to-point pair");
  }

  // barrier: nobody leaves before the last rank arrives.
  if (rank == 0) std::this_thread::sleep_for(200ms);
  auto t0 = Clock::now();
  WORKER_CHECK_OK(comm.barrier(10s));
  if (rank != 0 && Clock::now() - t0 < 150ms) errors += "barrier returned before rank 0 arrived\n";

  WORKER_CHECK_OK(comm.all_reduce(nullptr, 0, 1s));  // empty: trivially fine, and still in step
  WORKER_CHECK_OK(comm.barrier(10s));
  return errors;
}

class GlooCollectives : public ::testing::TestWithParam<int> {};

TEST_P(GlooCollectives, MatchLocallyComputedValuesBitForBit) {
  RunResult res = run_workers(GetParam(), collectives_body);
  expect_all_passed(res);
  for (const auto& g : res.gone) EXPECT_TRUE(g.clean) << g.name << ": " << g.reason;
}

INSTANTIATE_TEST_SUITE_P(Ranks, GlooCollectives, ::testing::Values(2, 3, 4));

// ---- failures ---------------------------------------------------------------------------------------

TEST(GlooFailures, WorkerExitingEarlyFailsTheOthersNextOperation) {
  constexpr int n = 3;
  constexpr int victim = 1;  // a middle rank: one survivor is its left, the other its right neighbour
  RunResult res = run_workers(n, [](int rank, int size, int fd) -> std::string {
    auto made = gloo_communicator_create(rank, size, fd, "dp/", 10s);
    if (!made.ok()) return made.error();
    Communicator& comm = *made.value();
    WORKER_CHECK_OK(comm.barrier(10s));
    if (rank == victim) ::_exit(0);  // gone without a word, as a crashed worker would be
    std::this_thread::sleep_for(100ms);
    std::vector<float> data(1000, 1.0f);
    auto t0 = Clock::now();
    Status st = comm.all_reduce(data.data(), data.size(), 5s);
    auto took = Clock::now() - t0;
    std::string errors;
    if (st.ok()) return "all_reduce succeeded without rank 1";
    const std::string& m = st.message();
    const std::string who = "rank " + std::to_string(rank) + " of 3";
    if (m.find("all_reduce") == std::string::npos || m.find(who) == std::string::npos) {
      errors += "message does not name the operation and rank: " + m + "\n";
    }
    if (m.find("peer closed") == std::string::npos) errors += "message does not say peer closed: " + m + "\n";
    if (took > 3s) errors += "took " + std::to_string(took.count() / 1000000) + " ms\n";
    Status again = comm.barrier(5s);
    if (again.ok() || again.message().find("unusable after an earlier error") == std::string::npos) {
      errors += "later operation: " + (again.ok() ? std::string("ok") : again.message()) + "\n";
    }
    if (comm.health().ok()) errors += "health() ok after a failure\n";
    return errors;
  });
  expect_all_passed(res);
}

TEST(GlooFailures, KilledWorkerFailsTheOthersWithinTheTimeout) {
  constexpr int n = 4;
  RunResult res = run_workers(n, [](int rank, int size, int fd) -> std::string {
    auto made = gloo_communicator_create(rank, size, fd, "dp/", 10s);
    if (!made.ok()) return made.error();
    Communicator& comm = *made.value();
    std::vector<float> data(4096, 1.0f);
    WORKER_CHECK_OK(comm.all_reduce(data.data(), data.size(), 10s));
    if (rank == 3) ::raise(SIGKILL);
    auto t0 = Clock::now();
    // Several operations in a row: the first to notice fails; none may hang past the timeout.
    Status st;
    for (int i = 0; i < 100 && st.ok(); ++i) st = comm.all_reduce(data.data(), data.size(), 5s);
    if (st.ok()) return "100 all_reduces succeeded without rank 3";
    if (Clock::now() - t0 > 3s) return "failure took longer than 3 s: " + st.message();
    if (st.message().find("peer closed") == std::string::npos) return "cause: " + st.message();
    return "";
  });
  for (int r = 0; r < 3; ++r) {
    EXPECT_TRUE(res.workers[static_cast<size_t>(r)].exited && res.workers[static_cast<size_t>(r)].code == 0)
        << "rank " << r << ": " << res.workers[static_cast<size_t>(r)].report;
  }
  EXPECT_EQ(res.workers[3].signal, SIGKILL);
  EXPECT_FALSE(res.workers[3].killed_by_harness);
}

TEST(GlooFailures, StalledPeerTimesOutAndThePeerLearnsPromptly) {
  RunResult res = run_workers(2, [](int rank, int size, int fd) -> std::string {
    auto made = gloo_communicator_create(rank, size, fd, "dp/", 10s);
    if (!made.ok()) return made.error();
    Communicator& comm = *made.value();
    std::vector<float> data(100, 1.0f);
    if (rank == 0) {
      auto t0 = Clock::now();
      Status st = comm.all_reduce(data.data(), data.size(), 300ms);
      auto took = Clock::now() - t0;
      if (st.ok()) return "all_reduce succeeded with a stalled peer";
      if (st.message().find("timeout after 300 ms") == std::string::npos) return "cause: " + st.message();
      if (took < 250ms || took > 2s)
        return "timed out after " + std::to_string(took.count() / 1000000) + " ms";
      return "";
    }
    std::this_thread::sleep_for(1000ms);  // stalled: never joins the all_reduce
    auto t0 = Clock::now();
    Status st = comm.barrier(5s);
    if (st.ok()) return "barrier succeeded after the peer gave up";
    if (st.message().find("peer closed") == std::string::npos) return "cause: " + st.message();
    if (Clock::now() - t0 > 1s) return "took more than 1 s to notice: " + st.message();
    return "";
  });
  expect_all_passed(res);
}

// What the worker's heartbeat reports: the number of collectives entered, and which rank's collective
// timed out (the one that waited) as opposed to the peer that merely lost its connection after.
TEST(GlooFailures, ProgressCountsCollectivesAndMarksATimedOutOne) {
  RunResult res = run_workers(2, [](int rank, int size, int fd) -> std::string {
    auto made = gloo_communicator_create(rank, size, fd, "dp/", 10s);
    if (!made.ok()) return made.error();
    Communicator& comm = *made.value();
    if (comm.progress().entered != 0) return "entered before any collective";
    if (Status st = comm.barrier(10s); !st.ok()) return st.message();
    CommProgress p = comm.progress();
    if (p.entered != 1 || p.inside || p.timed_out) return "after one barrier: unexpected progress";
    std::vector<float> data(100, 1.0f);
    if (rank == 0) {
      if (comm.all_reduce(data.data(), data.size(), 300ms).ok()) return "all_reduce succeeded alone";
      p = comm.progress();
      if (p.entered != 2 || p.inside || !p.timed_out) return "the timed-out all_reduce is not marked";
      return "";
    }
    std::this_thread::sleep_for(1000ms);  // stalled: never joins the all_reduce
    if (comm.barrier(5s).ok()) return "barrier succeeded after the peer gave up";
    p = comm.progress();
    if (p.entered != 2 || p.timed_out) return "the peer that lost its connection is marked as timed out";
    return "";
  });
  expect_all_passed(res);
}

TEST(GlooFailures, AbortFromAnotherThreadStopsTheOperation) {
  RunResult res = run_workers(2, [](int rank, int size, int fd) -> std::string {
    auto made = gloo_communicator_create(rank, size, fd, "dp/", 10s);
    if (!made.ok()) return made.error();
    Communicator& comm = *made.value();
    std::vector<float> data(100, 1.0f);
    if (rank == 0) {
      std::thread aborter([&] {
        std::this_thread::sleep_for(200ms);
        comm.abort();
      });
      auto t0 = Clock::now();
      Status st = comm.all_reduce(data.data(), data.size(), 10s);
      auto took = Clock::now() - t0;
      aborter.join();
      if (st.ok()) return "all_reduce succeeded although aborted";
      if (st.message().find("aborted") == std::string::npos) return "cause: " + st.message();
      if (took > 2s) return "abort took " + std::to_string(took.count() / 1000000) + " ms";
      Status again = comm.barrier(1s);
      if (again.ok() || again.message().find("aborted") == std::string::npos)
        return "after abort: " + again.message();
      comm.abort();  // idempotent
      return "";
    }
    std::this_thread::sleep_for(600ms);
    auto t0 = Clock::now();
    Status st = comm.barrier(5s);
    if (st.ok()) return "barrier succeeded with an aborted peer";
    if (st.message().find("peer closed") == std::string::npos) return "cause: " + st.message();
    if (Clock::now() - t0 > 1s) return "took more than 1 s to notice the abort";
    return "";
  });
  expect_all_passed(res);
}

TEST(GlooFailures, RankThatNeverJoinsFailsTheRendezvousNamingIt) {
  RunResult res = run_workers(3, [](int rank, int size, int fd) -> std::string {
    if (rank == 2) return "";  // exits without ever creating its communicator
    auto t0 = Clock::now();
    auto made = gloo_communicator_create(rank, size, fd, "dp/", 1s);
    auto took = Clock::now() - t0;
    if (made.ok()) return "rendezvous succeeded without rank 2";
    const std::string& m = made.error();
    if (m.find("rendezvous failed") == std::string::npos || m.find("timeout") == std::string::npos ||
        m.find("\"dp/2\"") == std::string::npos) {
      return "message: " + m;
    }
    if (took > 3s) return "took " + std::to_string(took.count() / 1000000) + " ms";
    return "";
  });
  expect_all_passed(res);
  ASSERT_FALSE(res.gone.empty());
  bool saw_rank2 = false;
  for (const auto& g : res.gone) saw_rank2 |= g.name == "rank 2";
  EXPECT_TRUE(saw_rank2);
}

TEST(GlooFailures, RanksDisagreeingOnTheCountFailInsteadOfCorruptingMemory) {
  RunResult res = run_workers(2, [](int rank, int size, int fd) -> std::string {
    auto made = gloo_communicator_create(rank, size, fd, "dp/", 10s);
    if (!made.ok()) return made.error();
    Communicator& comm = *made.value();
    const size_t count = rank == 0 ? 1000 : 999;
    std::vector<float> data(count, 1.0f);
    Status st = comm.all_reduce(data.data(), count, 500ms);
    if (st.ok()) return "mismatched all_reduce succeeded";
    const std::string& m = st.message();
    if (m.find("timeout") == std::string::npos && m.find("peer closed") == std::string::npos)
      return "cause: " + m;
    return "";
  });
  expect_all_passed(res);
}

}  // namespace
}  // namespace gantry
