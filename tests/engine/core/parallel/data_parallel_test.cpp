// Data parallelism and ZeRO across real processes: every rank is a forked worker running the train loop,
// the ranks meet through a StoreServer (the launcher's role) and reduce over loopback Gloo. Every layout
// must compute what one process computes, and a checkpoint must load into any other layout.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/resource.h>  // setrlimit: a rank that cannot write its shard
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>  // the manifest's shards
#include <string>
#include <vector>

#include "engine/core/backend.h"
#include "engine/core/comm/gloo_communicator.h"
#include "engine/core/comm/store_client.h"
#include "engine/core/config.h"
#include "engine/core/gpt.h"
#include "engine/core/parallel/shard_plan.h"
#include "engine/core/train.h"
#include "tests/engine/core/comm/worker_harness.h"
#include "tests/engine/core/parallel/gang_train.h"
#include "tests/engine/core/small_config.h"

namespace gantry {
namespace {

using namespace std::chrono_literals;
using comm_test::expect_all_passed;
using comm_test::run_workers;
using testing_support::curve_compare;
using testing_support::fresh_dir;
using testing_support::gang_train_rank;
using testing_support::GangCurve;

// The tiny config of assets/, 20 steps, one thread per rank, buckets small enough that the model's
// 120K parameters make several of them.
Config tiny20() {
  return testing_support::gang_tiny_config(20, 10);
}

// The checkpoint tests' run: 8 steps of 32 positions, saved halfway; the same comparisons as the 20 steps of
// 64 positions, saved after 10, that they ran until session 15, at a fraction of the time. The warm-up stays
// tiny.toml's 10 steps: the learning rate changes at every step on both sides of the checkpoint.
constexpr int64_t kCkptSteps = 8, kCkptHalf = kCkptSteps / 2;

Config tiny_ckpt() {
  Config cfg = testing_support::gang_tiny_config(kCkptSteps, kCkptSteps / 2);
  cfg.model.seq_len = 32;
  return cfg;
}

std::string step_dir_name(int64_t step) {
  char name[32];
  std::snprintf(name, sizeof name, "step_%08lld", static_cast<long long>(step));
  return name;
}

using Curve = GangCurve;

struct RankRun {
  Config config;
  std::string out_dir;
  int zero = 0;
  std::string resume;
  int64_t max_steps = -1;
  TrainControl* control = nullptr;
  TrainObserver* also = nullptr;  // sees every report too
};

// One rank: the dp communicator (none at dp 1: the ZeRO machinery then runs its local equivalents of the
// collectives) and the store on the inherited socket, then the train loop.
Result<Curve> train_rank(const RankRun& run, int rank, int world, int fd) {
  return gang_train_rank(run.config,
                         {.out_dir = run.out_dir,
                          .dp = world,
                          .zero = run.zero,
                          .max_steps = run.max_steps,
                          .resume = run.resume,
                          .control = run.control,
                          .also = run.also,
                          .timeout = 30s},
                         rank, world, fd);
}

// The single-process curve of `cfg` (tiny20() or tiny_ckpt(), named by `key`) every layout must reproduce.
// ctest runs each test in a process of its own, so the first to need it computes it and leaves it beside
// this executable (named by the key and the executable's build time, so a rebuilt test never reads an older
// build's curve); the rest read it.
Curve reference_curve(const Config& cfg = tiny20(), const std::string& key = "tiny20") {
  struct stat st {};
  ::stat("/proc/self/exe", &st);
  const std::string path = std::string(GANTRY_BINARY_DIR "/data_parallel_reference_") + key + "_" +
                           std::to_string(static_cast<long long>(st.st_mtime)) + ".txt";
  Curve c;
  if (FILE* f = std::fopen(path.c_str(), "r")) {
    size_t n_loss = 0, n_val = 0;
    if (std::fscanf(f, "%zu %zu", &n_loss, &n_val) == 2) {
      c.loss.resize(n_loss);
      c.val.resize(n_val);
      bool ok = true;
      for (double& v : c.loss) ok = ok && std::fscanf(f, "%lf", &v) == 1;
      for (double& v : c.val) ok = ok && std::fscanf(f, "%lf", &v) == 1;
      std::fclose(f);
      if (ok) return c;
    } else {
      std::fclose(f);
    }
    c = {};
  }
  Result<TrainSummary> s = train_run(cfg, {.out_dir = fresh_dir("dp_reference_" + key)}, &c);
  EXPECT_TRUE(s.ok()) << s.error();
  const std::string tmp = path + "." + std::to_string(::getpid());
  if (FILE* f = std::fopen(tmp.c_str(), "w")) {
    std::fprintf(f, "%zu %zu\n", c.loss.size(), c.val.size());
    for (double v : c.loss) std::fprintf(f, "%.17g\n", v);
    for (double v : c.val) std::fprintf(f, "%.17g\n", v);
    std::fclose(f);
    std::rename(tmp.c_str(), path.c_str());  // whole or absent, for the tests running beside this one
  }
  return c;
}

class DataParallel : public ::testing::TestWithParam<std::tuple<int, int>> {};

TEST_P(DataParallel, MatchesOneProcessWithinTolerance) {
  const auto [dp, zero] = GetParam();
  const Curve ref = reference_curve();
  ASSERT_EQ(ref.loss.size(), 20u);
  const RankRun run{.config = tiny20(),
                    .out_dir = fresh_dir("dp" + std::to_string(dp) + "_z" + std::to_string(zero)),
                    .zero = zero};
  comm_test::RunResult res = run_workers(
      dp,
      [&](int rank, int n, int fd) -> std::string {
        Result<Curve> c = train_rank(run, rank, n, fd);
        if (!c.ok()) return c.error();
        std::string d = curve_compare(c->loss, ref.loss, "loss", 1e-5);
        if (d.empty()) d = curve_compare(c->val, ref.val, "val loss", 1e-5);
        if (d.empty() && n > 1 &&
            c->start.find("zero " + std::to_string(zero) + " over dp") == std::string::npos) {
          d = "the start-up summary does not print the memory formula: " + c->start;
        }
        return d;
      },
      120s);
  expect_all_passed(res);
}

INSTANTIATE_TEST_SUITE_P(Layouts, DataParallel,
                         ::testing::Combine(::testing::Values(1, 2, 4), ::testing::Values(0, 1, 2, 3)),
                         [](const ::testing::TestParamInfo<std::tuple<int, int>>& i) {
                           return "dp" + std::to_string(std::get<0>(i.param)) + "_zero" +
                                  std::to_string(std::get<1>(i.param));
                         });

TEST(DataParallelCheckpoint, SavedAtDp4Zero3ResumesAtDp2Zero1) {
  // Uninterrupted dp 4 / zero 3 for 8 steps; then 4 steps at dp 4 / zero 3, checkpoint, and the rest at
  // dp 2 / zero 1 from that checkpoint: steps 5..8 must agree.
  Config c = tiny_ckpt();
  const std::string whole = fresh_dir("reshard_whole"), split = fresh_dir("reshard_split");
  std::vector<double> uninterrupted;
  {
    const RankRun run{.config = c, .out_dir = whole, .zero = 3};
    comm_test::RunResult res = run_workers(
        4,
        [&](int rank, int n, int fd) -> std::string {
          Result<Curve> curve = train_rank(run, rank, n, fd);
          if (!curve.ok()) return curve.error();
          if (rank == 0) {
            // Hand the curve to the parent through a file: the harness's report is for failures.
            FILE* f = std::fopen((whole + "/curve.txt").c_str(), "w");
            for (double l : curve->loss) std::fprintf(f, "%.17g\n", l);
            std::fclose(f);
          }
          return "";
        },
        120s);
    expect_all_passed(res);
    FILE* f = std::fopen((whole + "/curve.txt").c_str(), "r");
    ASSERT_NE(f, nullptr);
    double v;
    while (std::fscanf(f, "%lf", &v) == 1) uninterrupted.push_back(v);
    std::fclose(f);
    ASSERT_EQ(uninterrupted.size(), static_cast<size_t>(kCkptSteps));
  }
  {
    const RankRun first{.config = c, .out_dir = split, .zero = 3, .max_steps = kCkptHalf};
    expect_all_passed(run_workers(
        4,
        [&](int rank, int n, int fd) -> std::string {
          Result<Curve> curve = train_rank(first, rank, n, fd);
          return curve.ok() ? "" : curve.error();
        },
        120s));
  }
  const std::vector<double> tail(uninterrupted.begin() + kCkptHalf, uninterrupted.end());
  const RankRun second{.config = c, .out_dir = split, .zero = 1, .resume = "latest"};
  expect_all_passed(run_workers(
      2,
      [&](int rank, int n, int fd) -> std::string {
        Result<Curve> curve = train_rank(second, rank, n, fd);
        if (!curve.ok()) return curve.error();
        return curve_compare(curve->loss, tail, "resumed loss", 1e-5);
      },
      120s));
}

// ZeRO 0: every replica holds the whole state, and each of the dp ranks writes its 1/dp of it (rank 0 alone
// wrote it all before). The shards are balanced by bytes and together hold exactly the state the ranks
// held (the parameters bit for bit, read back by one process); the checkpoint resumes at dp 1, at dp 2 /
// ZeRO 3 and at dp 2 / ZeRO 1 on the single-process curve.
TEST(DataParallelCheckpoint, Zero0WriteIsSpreadOverTheRanksAndLoadsIntoOtherLayouts) {
  Config c = tiny_ckpt();
  const Curve ref = reference_curve(c, "ckpt");
  ASSERT_EQ(ref.loss.size(), static_cast<size_t>(kCkptSteps));
  const std::string out = fresh_dir("zero0_spread");
  const RankRun first{.config = c, .out_dir = out, .zero = 0, .max_steps = kCkptHalf};
  expect_all_passed(run_workers(
      4,
      [&](int rank, int n, int fd) -> std::string {
        Result<Curve> curve = train_rank(first, rank, n, fd);
        if (!curve.ok()) return curve.error();
        if (rank == 0) {
          FILE* f = std::fopen((out + "/params_xxh64.txt").c_str(), "w");
          std::fprintf(f, "%llu\n", static_cast<unsigned long long>(curve->params_xxh64));
          std::fclose(f);
        }
        return "";
      },
      120s));
  const std::string dir = out + "/checkpoints/" + step_dir_name(kCkptHalf);
  std::ifstream in(dir + "/manifest.json");
  ASSERT_TRUE(in.good()) << dir;
  const nlohmann::json m = nlohmann::json::parse(in);
  ASSERT_EQ(m.at("shards").size(), 4u);
  uint64_t total = 0, least = UINT64_MAX, most = 0;
  for (const nlohmann::json& sh : m.at("shards")) {
    const uint64_t b = sh.at("bytes").get<uint64_t>();
    total += b;
    least = std::min(least, b);
    most = std::max(most, b);
  }
  // Params, AdamW m and v of the tiny model's ~120K parameters, a quarter each, give or take the 64-float
  // cut and the per-slice headers.
  EXPECT_GT(total, 3u * 100000u * 4u);
  EXPECT_GT(least, total / 5) << "a rank wrote less than its share: " << m.at("shards").dump();
  EXPECT_LT(most, total * 3 / 10) << "a rank wrote more than its share: " << m.at("shards").dump();

  // One process reads the spread checkpoint back (no step to take): its parameters are the ranks'.
  unsigned long long held = 0;
  FILE* f = std::fopen((out + "/params_xxh64.txt").c_str(), "r");
  ASSERT_NE(f, nullptr);
  ASSERT_EQ(std::fscanf(f, "%llu", &held), 1);
  std::fclose(f);
  Result<TrainSummary> back = train_run(c, {.out_dir = out, .resume = dir, .max_steps = kCkptHalf}, nullptr);
  ASSERT_TRUE(back.ok()) << back.error();
  EXPECT_EQ(back->params_xxh64, held);

  // And it resumes on the same curve at dp 1, dp 2 / ZeRO 3 and dp 2 / ZeRO 1.
  const std::vector<double> tail(ref.loss.begin() + kCkptHalf, ref.loss.end());
  Curve one;
  Result<TrainSummary> s = train_run(c, {.out_dir = fresh_dir("zero0_spread_dp1"), .resume = dir}, &one);
  ASSERT_TRUE(s.ok()) << s.error();
  EXPECT_EQ(curve_compare(one.loss, tail, "dp 1 resumed loss", 1e-5), "");
  for (int zero : {3, 1}) {
    const std::string again = fresh_dir("zero0_spread_z" + std::to_string(zero));
    const RankRun second{.config = c, .out_dir = again, .zero = zero, .resume = dir};
    expect_all_passed(run_workers(
        2,
        [&](int rank, int n, int fd) -> std::string {
          Result<Curve> curve = train_rank(second, rank, n, fd);
          if (!curve.ok()) return curve.error();
          return curve_compare(curve->loss, tail, "resumed loss", 1e-5);
        },
        120s));
  }
}

// The other way: a ZeRO 3 checkpoint written by 2 ranks resumes at dp 4 / ZeRO 0 on the same curve.
TEST(DataParallelCheckpoint, SavedAtDp2Zero3ResumesAtDp4Zero0) {
  Config c = tiny_ckpt();
  const Curve ref = reference_curve(c, "ckpt");
  ASSERT_EQ(ref.loss.size(), static_cast<size_t>(kCkptSteps));
  const std::string out = fresh_dir("zero3_to_zero0");
  const RankRun first{.config = c, .out_dir = out, .zero = 3, .max_steps = kCkptHalf};
  expect_all_passed(run_workers(
      2,
      [&](int rank, int n, int fd) -> std::string {
        Result<Curve> curve = train_rank(first, rank, n, fd);
        return curve.ok() ? "" : curve.error();
      },
      120s));
  const std::vector<double> tail(ref.loss.begin() + kCkptHalf, ref.loss.end());
  const RankRun second{.config = c, .out_dir = out, .zero = 0, .resume = "latest"};
  expect_all_passed(run_workers(
      4,
      [&](int rank, int n, int fd) -> std::string {
        Result<Curve> curve = train_rank(second, rank, n, fd);
        if (!curve.ok()) return curve.error();
        return curve_compare(curve->loss, tail, "resumed loss", 1e-5);
      },
      120s));
}

TEST(DataParallelCheckpoint, ARankThatCannotWriteLeavesItUncommittedAndEveryRankNamesIt) {
  // Rank 1 may not grow a file past 64 bytes: its shard's header fits, its first slice does not, so
  // only rank 1's write fails. Rank 0 must not commit, and both ranks must fail with rank 1's cause.
  Config c = tiny20();
  const std::string out = fresh_dir("ckpt_rank_fails");
  const std::string step_dir = out + "/checkpoints/step_00000002";
  const RankRun run{.config = c, .out_dir = out, .zero = 1, .max_steps = 2};
  comm_test::RunResult res = run_workers(
      2,
      [&](int rank, int n, int fd) -> std::string {
        if (rank == 1) {
          std::signal(SIGXFSZ, SIG_IGN);  // the write fails with EFBIG instead of ending the process
          const rlimit limit{.rlim_cur = 64, .rlim_max = 64};
          if (::setrlimit(RLIMIT_FSIZE, &limit) != 0) return "setrlimit failed";
        }
        Result<Curve> curve = train_rank(run, rank, n, fd);
        if (curve.ok())
          return "rank " + std::to_string(rank) + ": the run succeeded although rank 1 could not write";
        if (curve.error().find("rank 1") == std::string::npos ||
            curve.error().find("shard_r00001.bin") == std::string::npos) {
          return "rank " + std::to_string(rank) + " failed without naming rank 1's cause: " + curve.error();
        }
        return "";
      },
      60s);
  expect_all_passed(res);
  EXPECT_FALSE(std::filesystem::exists(step_dir)) << "committed although a rank failed";
  EXPECT_FALSE(std::filesystem::exists(out + "/checkpoints/.step_00000002.writing"))
      << "the failed write's staging directory was left behind";
}

// Answers a fixed script, one action per poll.
struct ScriptedControl : TrainControl {
  std::vector<TrainAction> script;
  size_t polls = 0;
  TrainAction poll() override {
    return polls < script.size() ? script[polls++] : (++polls, TrainAction::none);
  }
};

struct ActionLog : TrainObserver {
  std::string text;
  void on_action(TrainAction a, int64_t step) override {
    text += std::string(train_action_name(a)) + "@" + std::to_string(step) + " ";
  }
};

TEST(DataParallelControl, ActionsTakeEffectAtTheSameStepOnEveryRank) {
  // Rank 0's control decides for the gang: checkpoint after step 3, pause after step 5 (two boundaries
  // held), resume, stop after step 7. Rank 1's own control asks to stop at once and must be ignored.
  using A = TrainAction;
  const std::string out = fresh_dir("dp_control");
  comm_test::RunResult res = run_workers(
      2,
      [&](int rank, int n, int fd) -> std::string {
        ScriptedControl control;
        if (rank == 0) {
          control.script = {A::none,  A::none, A::none,   A::checkpoint, A::none,
                            A::pause, A::none, A::resume, A::none,       A::stop};
        } else {
          control.script = {A::stop, A::stop, A::stop};
        }
        ActionLog log;
        const RankRun run{.config = tiny20(), .out_dir = out, .zero = 2, .control = &control, .also = &log};
        Result<Curve> c = train_rank(run, rank, n, fd);
        if (!c.ok()) return c.error();
        const std::string want = "checkpoint@3 pause@5 resume@5 stop@7 ";
        if (log.text != want)
          return "rank " + std::to_string(rank) + " saw \"" + log.text + "\", expected \"" + want + "\"";
        if (c->loss.size() != 7)
          return "rank " + std::to_string(rank) + " ran " + std::to_string(c->loss.size()) + " steps";
        return "";
      },
      60s);
  expect_all_passed(res);
  EXPECT_TRUE(std::filesystem::exists(out + "/checkpoints/step_00000003/manifest.json"));
  EXPECT_TRUE(std::filesystem::exists(out + "/checkpoints/step_00000007/manifest.json"));
}

TEST(DataParallelMemory, EachStageHoldsWhatTheFormulaSays) {
  // Every rank of a dp-4 gang builds the backend per stage and compares the bytes it allocated with the
  // formula the engine prints (shard_memory).
  const Config c = tiny20();
  expect_all_passed(run_workers(
      4,
      [&](int rank, int n, int fd) -> std::string {
        Result<std::unique_ptr<Communicator>> comm = gloo_communicator_create(rank, n, fd, "dp/", 30s);
        if (!comm.ok()) return comm.error();
        for (int zero = 0; zero <= 3; ++zero) {
          const size_t bucket = 100 * 1024;
          Result<std::unique_ptr<Backend>> be = backend_create(
              "cpu", c.model, 4, {.threads = 1, .dp = comm->get(), .zero = zero, .bucket_bytes = bucket});
          if (!be.ok()) return be.error();
          const ShardMemory want =
              shard_memory(shard_plan_make(gpt_param_table(c.model), n, rank, zero, bucket));
          const StateBytes got = be.value()->state_bytes();
          if (got.params != want.params * 4 || got.grads != want.grads * 4 ||
              got.optimizer != want.optimizer * 4) {
            return "zero " + std::to_string(zero) + ": holds params " + std::to_string(got.params) +
                   ", grads " + std::to_string(got.grads) + ", optimizer " + std::to_string(got.optimizer) +
                   " bytes; the formula says " + std::to_string(want.params * 4) + ", " +
                   std::to_string(want.grads * 4) + ", " + std::to_string(want.optimizer * 4);
          }
          if (zero >= 1 && got.optimizer * n > 2 * 4 * (gpt_param_table(c.model).numel() + 64)) {
            return "zero " + std::to_string(zero) + ": the optimizer state is not sharded";
          }
        }
        return "";
      },
      60s));
}

}  // namespace
}  // namespace gantry
