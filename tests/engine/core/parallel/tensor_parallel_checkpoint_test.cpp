// Checkpoints under tensor parallelism (issue 17): every rank writes its share of each split tensor with
// where the share lies in the whole tensor, so a checkpoint written at one (dp, tp, zero) loads at any
// other. Real processes over loopback Gloo (forked ranks, the train loop in each).
//
// Tolerances: a resumed run is compared with the uninterrupted one-process curve within 1e-4 relative
// (tensor_parallel_train_test.cpp says why tp is not bitwise against one process: the row-parallel sums
// are added in another order). What is bitwise: the state itself. The whole model one process reads back
// from a tp checkpoint, cut into each writer's share, has the writer's parameters bit for bit, and cut
// for a tp4 reader it has what the tp4 ranks loaded bit for bit.
//
// Eight steps of 32 positions, saved halfway: the same comparisons as the 20 steps of 64 positions, saved
// after 10, that this test ran until session 15. The warm-up stays tiny.toml's 10 steps, so the learning
// rate changes at every step on both sides of the checkpoint (a resume at the wrong step would show), and the
// rounding grows as slowly as tensor_parallel_train_test.cpp needs.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "engine/core/backend.h"
#include "engine/core/checkpoint.h"
#include "engine/core/gpt.h"
#include "engine/core/parallel/tensor_parallel.h"
#include "engine/core/train.h"
#include "engine/core/xxhash64.h"
#include "tests/engine/core/comm/worker_harness.h"
#include "tests/engine/core/parallel/gang_train.h"
#include "tests/engine/core/small_config.h"

namespace gantry {
namespace {

using namespace std::chrono_literals;
using comm_test::expect_all_passed;
using comm_test::run_workers;
using testing_support::fresh_dir;
using testing_support::gang_train_rank;
using testing_support::GangCurve;
using testing_support::GangRun;

constexpr double kRelTolerance = 1e-4;

constexpr int64_t kSteps = 8, kHalf = kSteps / 2;

Config tiny_tp() {
  Config cfg = testing_support::gang_tiny_config(kSteps, 0);
  cfg.model.seq_len = 32;
  return cfg;
}

std::string compare(const std::vector<double>& got, const std::vector<double>& want,
                    const std::string& what) {
  if (got.size() != want.size()) {
    return what + ": " + std::to_string(got.size()) + " values, expected " + std::to_string(want.size());
  }
  double worst = 0;
  for (size_t i = 0; i < got.size(); ++i)
    worst = std::max(worst, std::fabs(got[i] - want[i]) / std::fabs(want[i]));
  std::fprintf(stderr, "%s: largest relative difference from one process %.3g\n", what.c_str(), worst);
  for (size_t i = 0; i < got.size(); ++i) {
    if (!(std::fabs(got[i] - want[i]) <= kRelTolerance * std::fabs(want[i]))) {
      char buf[300];
      std::snprintf(buf, sizeof buf, "%s[%zu] = %.9g, one process gave %.9g (relative difference %.3g)",
                    what.c_str(), i, got[i], want[i], std::fabs(got[i] - want[i]) / std::fabs(want[i]));
      return buf;
    }
  }
  return "";
}

struct Layout {
  int dp = 1, tp = 1, zero = 0;
  std::string name() const {
    return "dp" + std::to_string(dp) + "_tp" + std::to_string(tp) + "_zero" + std::to_string(zero);
  }
};

// Runs `run` over a gang of the layout's ranks (one process in-line at dp 1 x tp 1); each rank's
// parameter hash goes to <out_dir>/hash_r<rank>.txt, and `check` (rank 0's curve) decides pass or fail.
void run_layout(const Config& cfg, const Layout& l, GangRun run,
                const std::function<std::string(const GangCurve&)>& check) {
  run.dp = l.dp, run.tp = l.tp, run.zero = l.zero;
  auto record = [&](int rank, const GangCurve& c) {
    FILE* f = std::fopen((run.out_dir + "/hash_r" + std::to_string(rank) + ".txt").c_str(), "w");
    std::fprintf(f, "%llu\n", static_cast<unsigned long long>(c.params_xxh64));
    std::fclose(f);
  };
  if (l.dp * l.tp == 1) {
    GangCurve c;
    Result<TrainSummary> s =
        train_run(cfg, {.out_dir = run.out_dir, .resume = run.resume, .max_steps = run.max_steps}, &c);
    ASSERT_TRUE(s.ok()) << s.error();
    c.params_xxh64 = s->params_xxh64;
    record(0, c);
    EXPECT_EQ(check(c), "") << l.name();
    return;
  }
  expect_all_passed(run_workers(
      l.dp * l.tp,
      [&](int rank, int n, int fd) -> std::string {
        Result<GangCurve> c = gang_train_rank(cfg, run, rank, n, fd);
        if (!c.ok()) return "rank " + std::to_string(rank) + ": " + c.error();
        record(rank, c.value());
        const std::string bad = rank == 0 ? check(c.value()) : "";
        return bad.empty() ? "" : l.name() + " rank 0: " + bad;
      },
      300s));
}

uint64_t recorded_hash(const std::string& out_dir, int rank) {
  unsigned long long h = 0;
  FILE* f = std::fopen((out_dir + "/hash_r" + std::to_string(rank) + ".txt").c_str(), "r");
  EXPECT_NE(f, nullptr) << out_dir << " rank " << rank;
  if (f == nullptr) return 0;
  EXPECT_EQ(std::fscanf(f, "%llu", &h), 1);
  std::fclose(f);
  return h;
}

// The whole model's parameters as one process reads them from the checkpoint `dir`.
std::vector<float> whole_params(const Config& cfg, const std::string& dir) {
  std::ifstream in(dir + "/manifest.json");
  const nlohmann::json m = nlohmann::json::parse(in);
  uint64_t data_version = 0;
  EXPECT_TRUE(xxhash64_parse_hex(m.at("data_version").get<std::string>(), &data_version));
  std::unique_ptr<Backend> be = backend_cpu_create(cfg.model, cfg.train.micro_batch, 1);
  Result<CheckpointMeta> meta = checkpoint_load(dir, *be, cfg, data_version);
  EXPECT_TRUE(meta.ok()) << meta.error();
  std::vector<float> p(be->params().numel());
  be->read_state(StateBuffer::kParams, 0, p.size(), p.data());
  return p;
}

uint64_t share_hash(const Config& cfg, const std::vector<float>& whole, int tp, int tp_rank) {
  std::vector<float> mine(gpt_param_table(cfg.model, tp).numel());
  tensor_parallel_slice(cfg.model, tp, tp_rank, whole.data(), mine.data());
  return xxhash64(mine.data(), mine.size() * sizeof(float));
}

// Saved at the parameter's layout after 4 of 8 steps; resumed at one process, tp 4, dp 4 and dp 2 x tp 2
// with another ZeRO stage: each resumed run's steps 5-8 follow the uninterrupted one-process curve.
class TensorParallelCheckpoint : public ::testing::TestWithParam<Layout> {};

TEST_P(TensorParallelCheckpoint, ResumesAtOtherLayoutsOnTheOneProcessCurve) {
  const Layout saved = GetParam();
  const Config cfg = tiny_tp();
  GangCurve ref;
  Result<TrainSummary> one = train_run(cfg, {.out_dir = fresh_dir("one_process")}, &ref);
  ASSERT_TRUE(one.ok()) << one.error();
  ASSERT_EQ(ref.loss.size(), static_cast<size_t>(kSteps));
  const std::vector<double> head(ref.loss.begin(), ref.loss.begin() + kHalf);
  const std::vector<double> tail(ref.loss.begin() + kHalf, ref.loss.end());

  const std::string out = fresh_dir("saved_" + saved.name());
  run_layout(cfg, saved, {.out_dir = out, .max_steps = kHalf},
             [&](const GangCurve& c) { return compare(c.loss, head, "saved " + saved.name() + " loss"); });
  if (HasFatalFailure() || HasFailure()) return;
  char step_name[32];
  std::snprintf(step_name, sizeof step_name, "step_%08lld", static_cast<long long>(kHalf));
  const std::string dir = out + "/checkpoints/" + step_name;
  {
    std::ifstream in(dir + "/manifest.json");
    ASSERT_TRUE(in.good()) << dir;
    const nlohmann::json m = nlohmann::json::parse(in);
    EXPECT_EQ(m.at("format_version"), 2);  // shares of tensors: version 2
    EXPECT_EQ(m.at("layout").at("tp"), saved.tp);
    EXPECT_EQ(m.at("shards").size(), static_cast<size_t>(saved.dp * saved.tp));
    // The manifest's table is the whole model's, whatever the writer's split.
    const TensorTable whole = gpt_param_table(cfg.model);
    ASSERT_EQ(m.at("tensors").size(), whole.size());
    for (size_t i = 0; i < whole.size(); ++i) {
      EXPECT_EQ(m.at("tensors")[i].at("shape").get<std::vector<int64_t>>(), whole[i].shape) << whole[i].name;
      EXPECT_EQ(m.at("tensors")[i].at("offset").get<size_t>(), whole[i].offset) << whole[i].name;
    }
  }

  // Bitwise: one process reads the whole model back; each writer's share of it is what the writer held.
  const std::vector<float> whole = whole_params(cfg, dir);
  for (int rank = 0; rank < saved.dp * saved.tp; ++rank) {
    EXPECT_EQ(share_hash(cfg, whole, saved.tp, rank % saved.tp), recorded_hash(out, rank))
        << "rank " << rank << " of " << saved.name() << ": its share of the checkpoint is not what it held";
  }

  const int other_zero = saved.zero == 1 ? 3 : 1;
  for (const Layout& to : {Layout{1, 1, 0}, Layout{1, 4, 0}, Layout{4, 1, 1}, Layout{2, 2, other_zero}}) {
    SCOPED_TRACE("resumed at " + to.name());
    const std::string again = fresh_dir("resumed_" + saved.name() + "_at_" + to.name());
    run_layout(cfg, to, {.out_dir = again, .resume = dir}, [&](const GangCurve& c) {
      return compare(c.loss, tail, "resumed at " + to.name() + " loss");
    });
  }

  // Bitwise the other way: tp 4 ranks that load it (and take no step) hold their share of the same model.
  const std::string loaded = fresh_dir("loaded_" + saved.name() + "_at_tp4");
  run_layout(cfg, {1, 4, 0}, {.out_dir = loaded, .max_steps = kHalf, .resume = dir},
             [](const GangCurve& c) { return c.loss.empty() ? "" : "took a step"; });
  for (int rank = 0; rank < 4; ++rank) {
    EXPECT_EQ(share_hash(cfg, whole, 4, rank), recorded_hash(loaded, rank))
        << "tp 4 rank " << rank << " loaded other parameters than its share of the checkpoint";
  }
}

INSTANTIATE_TEST_SUITE_P(SavedAt, TensorParallelCheckpoint,
                         ::testing::Values(Layout{1, 2, 0}, Layout{2, 2, 0}, Layout{2, 2, 1},
                                           Layout{2, 2, 3}),
                         [](const ::testing::TestParamInfo<Layout>& i) { return i.param.name(); });

}  // namespace
}  // namespace gantry
