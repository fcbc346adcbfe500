// Tensor parallel composed with pipeline parallel (tp x pp) and with data parallel on top (3D: tp x pp x
// dp), across real processes: every rank is a forked worker running the train loop over loopback Gloo with
// a world communicator and one per tp, pp and dp group (gang_train.h). Each pipeline stage runs its blocks
// tensor-parallel over its tp group, the first stage the vocab-parallel embedding, the last the
// vocab-parallel classifier and cross-entropy; activations pass between matching tp ranks of neighbouring
// stages. Every layout must follow the single-process curve of the same config (same micro-batches).
// With sequence parallelism (train.sequence_parallel) each stage's residual stream and LayerNorms hold this
// tp rank's positions, and so do the activations and gradients passed between stages; under ZB-H1 the
// weight pass re-gathers the LayerNorm outputs it needs.
//
// Not bitwise, for tensor parallelism's reason (tensor_parallel_train_test.cpp): the row-parallel outputs
// and the column-parallel input gradients are sums of tp partial sums added by the ring all-reduce, where
// one process sums each row in one loop; with dp 2 the gradients are also the ring's sum of two halves of
// the batch. The tolerance is the tensor-parallel test's, relative 1e-4 over the run at lr 1e-2, and holds
// for the loss, the validation loss and the reported gradient norm (summed over the stages, the tp shares
// and, after the dp reduction, once per dp group), so a norm reduced over the wrong group fails it.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <ostream>
#include <string>
#include <vector>

#include "engine/core/config.h"
#include "engine/core/gpt.h"
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

constexpr double kRelTolerance = 1e-4;

// Micro-batches of 4: 4 per step at dp 1, 2 per rank at dp 2 (1F1B needs at least pp of them).
Config tiny12() {
  Config cfg = testing_support::gang_tiny_config(12, 6);
  cfg.train.micro_batch = 4;
  return cfg;
}

struct Layout {
  int tp, pp, dp, zero;
  bool sp = false;  // train.sequence_parallel
  const char* schedule = "1f1b";
};

// gtest names the parameter by this, not by its bytes (the schedule's pointer would make the name vary).
void PrintTo(const Layout& l, std::ostream* os) {
  *os << "tp" << l.tp << " pp" << l.pp << " dp" << l.dp << " zero" << l.zero << (l.sp ? " sp " : " ")
      << l.schedule;
}

class TensorPipeline : public ::testing::TestWithParam<Layout> {};

TEST_P(TensorPipeline, MatchesOneProcessWithinTolerance) {
  const Layout l = GetParam();
  Config cfg = tiny12();
  cfg.train.sequence_parallel = l.sp;
  cfg.train.pp_schedule = l.schedule;
  GangCurve ref;
  Result<TrainSummary> one = train_run(cfg, {.out_dir = fresh_dir("one_process")}, &ref);
  ASSERT_TRUE(one.ok()) << one.error();
  ASSERT_EQ(ref.loss.size(), 12u);
  const std::string out = fresh_dir("gang");
  comm_test::RunResult res = run_workers(
      l.tp * l.pp * l.dp,
      [&](int rank, int n, int fd) -> std::string {
        Result<GangCurve> c = gang_train_rank(
            cfg, {.out_dir = out, .dp = l.dp, .tp = l.tp, .pp = l.pp, .zero = l.zero}, rank, n, fd);
        if (!c.ok()) return "rank " + std::to_string(rank) + ": " + c.error();
        std::string diff = curve_compare(c->loss, ref.loss, "loss", kRelTolerance);
        if (diff.empty()) diff = curve_compare(c->val, ref.val, "val loss", kRelTolerance);
        if (diff.empty()) diff = curve_compare(c->norm, ref.norm, "grad norm", kRelTolerance);
        // Every stage reports the pipeline's measured bubble.
        if (diff.empty() && c->bubble.size() != ref.loss.size())
          diff = "a bubble for " + std::to_string(c->bubble.size()) + " steps";
        if (diff.empty() && l.sp && c->start.find("sequence parallel") == std::string::npos)
          diff = "the start summary does not say sequence parallel: " + c->start;
        return diff.empty() ? "" : "rank " + std::to_string(rank) + ": " + diff;
      },
      300s);
  expect_all_passed(res);
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, TensorPipeline,
    ::testing::Values(Layout{2, 2, 1, 0}, Layout{2, 2, 2, 1}, Layout{2, 2, 2, 3}, Layout{2, 2, 1, 0, true},
                      Layout{2, 2, 1, 0, true, "zbh1"}, Layout{2, 2, 2, 3, true}),
    [](const ::testing::TestParamInfo<Layout>& i) {
      return "tp" + std::to_string(i.param.tp) + "_pp" + std::to_string(i.param.pp) + "_dp" +
             std::to_string(i.param.dp) + "_zero" + std::to_string(i.param.zero) + (i.param.sp ? "_sp" : "") +
             (std::string(i.param.schedule) != "1f1b" ? "_" + std::string(i.param.schedule) : "");
    });

// The 3D checkpoint: saved halfway (after 4 of 8 steps of 32 positions) at tp2 x pp2 x dp2 with ZeRO
// 3 (every rank writes its tp share of its stage's tensors, ZeRO-sharded over dp, with their global
// coordinates), it resumes at dp 4 (ZeRO 3), at pp 4, at tp 4 and at one process, and each resumed run's
// steps 5-8 follow the uninterrupted one-process curve within kRelTolerance (not bitwise: tp's partial sums
// and dp's ring sum are added in other orders). Four layers and four heads, so that pp 4 and tp 4 divide the
// model.
struct Layout3d {
  int tp = 1, pp = 1, dp = 1, zero = 0;
  int world() const { return tp * pp * dp; }
  std::string name() const {
    return "tp" + std::to_string(tp) + "_pp" + std::to_string(pp) + "_dp" + std::to_string(dp) + "_zero" +
           std::to_string(zero);
  }
};

// Trains `l` (in-line at one process, else a gang of forked ranks) from `resume` up to `max_steps`; every
// rank's loss curve is held to `want`.
void train_3d(const Config& cfg, const Layout3d& l, const std::string& out, const std::string& resume,
              int64_t max_steps, const std::vector<double>& want) {
  if (l.world() == 1) {
    GangCurve c;
    Result<TrainSummary> s = train_run(cfg, {.out_dir = out, .resume = resume, .max_steps = max_steps}, &c);
    ASSERT_TRUE(s.ok()) << s.error();
    EXPECT_EQ(curve_compare(c.loss, want, "loss", kRelTolerance), "") << l.name();
    return;
  }
  expect_all_passed(run_workers(
      l.world(),
      [&](int rank, int n, int fd) -> std::string {
        Result<GangCurve> c = gang_train_rank(cfg,
                                              {.out_dir = out,
                                               .dp = l.dp,
                                               .tp = l.tp,
                                               .pp = l.pp,
                                               .zero = l.zero,
                                               .max_steps = max_steps,
                                               .resume = resume},
                                              rank, n, fd);
        if (!c.ok()) return l.name() + " rank " + std::to_string(rank) + ": " + c.error();
        const std::string diff = curve_compare(c->loss, want, "loss", kRelTolerance);
        return diff.empty() ? "" : l.name() + " rank " + std::to_string(rank) + ": " + diff;
      },
      300s));
}

TEST(TensorPipelineCheckpoint, Tp2Pp2Dp2Zero3ResumesAtDp4Pp4Tp4AndOneProcess) {
  Config cfg = tiny12();
  cfg.model.n_layer = 4;
  constexpr int64_t kSteps = 8, kHalf = kSteps / 2;
  cfg.model.seq_len = 32;
  cfg.optim.warmup_steps = 2;  // the steps reach the peak learning rate and decay, on both sides
  cfg.train.max_steps = kSteps;
  cfg.train.val_every = 0;
  cfg.train.checkpoint_every = kHalf;
  GangCurve ref;
  Result<TrainSummary> one = train_run(cfg, {.out_dir = fresh_dir("one_process")}, &ref);
  ASSERT_TRUE(one.ok()) << one.error();
  ASSERT_EQ(ref.loss.size(), static_cast<size_t>(kSteps));
  const std::vector<double> head(ref.loss.begin(), ref.loss.begin() + kHalf);
  const std::vector<double> tail(ref.loss.begin() + kHalf, ref.loss.end());

  const Layout3d saved{.tp = 2, .pp = 2, .dp = 2, .zero = 3};
  const std::string out = fresh_dir("saved_" + saved.name());
  train_3d(cfg, saved, out, "", kHalf, head);
  if (HasFailure()) return;
  char step_name[32];
  std::snprintf(step_name, sizeof step_name, "step_%08lld", static_cast<long long>(kHalf));
  const std::string dir = out + "/checkpoints/" + step_name;
  {
    std::ifstream in(dir + "/manifest.json");
    ASSERT_TRUE(in.good()) << dir;
    const nlohmann::json m = nlohmann::json::parse(in);
    EXPECT_EQ(m.at("layout").at("tp"), 2);
    EXPECT_EQ(m.at("layout").at("pp"), 2);
    EXPECT_EQ(m.at("shards").size(), 8u);
    // The whole model's table, whatever the writers' split.
    const TensorTable whole = gpt_param_table(cfg.model);
    ASSERT_EQ(m.at("tensors").size(), whole.size());
    for (size_t i = 0; i < whole.size(); ++i) {
      EXPECT_EQ(m.at("tensors")[i].at("name").get<std::string>(), whole[i].name);
      EXPECT_EQ(m.at("tensors")[i].at("shape").get<std::vector<int64_t>>(), whole[i].shape) << whole[i].name;
    }
  }
  for (const Layout3d& to :
       {Layout3d{.dp = 4, .zero = 3}, Layout3d{.pp = 4}, Layout3d{.tp = 4}, Layout3d{}}) {
    SCOPED_TRACE("resumed at " + to.name());
    train_3d(cfg, to, fresh_dir("resumed_at_" + to.name()), dir, -1, tail);
  }
}

}  // namespace
}  // namespace gantry
