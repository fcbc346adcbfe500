// Pipeline parallelism across real processes: every rank is a forked worker running the train loop over
// loopback Gloo, with a world communicator, one per pp group and (dp > 1) one per stage's dp group. Every
// layout must follow the single-process curve of the same config (same micro-batches: the pipeline's are
// the gradient-accumulation ones).
//
// Bitwise where the reduction order allows. At dp 1 each stage adds its micro-batches' gradients in one
// process's order, and the tied wte's too (the first stage adds the classifier's and the encoder's parts
// micro-batch by micro-batch, backend_cpu_pipeline.cpp), so the gradients and the loss have one process's
// bits. The gradient norm does not: each stage sums its own squares, in chunks that start at its own
// offset, and the stages' sums are added after, so the norm differs in its last bits (relative ~1e-16);
// the clip factor it gives is rounded to a float before use, which hides that difference, so the
// parameters, the loss and the validation loss stay bitwise (the test asserts it). The same holds
// interleaved (each chunk adds its micro-batches in order) and under ZB-H1 (the weight-gradient pass adds
// the same products as the fused backward, in micro-batch order). At dp 2 the ring
// all-reduce adds two ranks' halves of the batch where one process adds the micro-batches in turn: not
// associative, so that layout is held to the tolerance the tensor-parallel test uses (relative 1e-4 over the
// run at lr 1e-2) against one process, and to dp 2 alone (the same reduction order) bit for bit.
//
// Eight steps of 32 positions (a short warm-up, so that they reach the peak learning rate and decay): the
// curves compare from the first step, and a checkpoint halfway is resumed for the other four.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "engine/core/config.h"
#include "engine/core/gpt.h"
#include "engine/core/parallel/pipeline_schedule.h"
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

constexpr double kRelTolerance = 1e-4;    // dp > 1
constexpr double kNormTolerance = 1e-12;  // dp 1: the norm's summation order only

constexpr int64_t kSteps = 8;

// Four layers (pp 4 needs one each), micro-batches of 4: 4 per step at dp 1, 2 per rank at dp 2.
Config tiny_pipe(const std::string& schedule) {
  Config cfg = testing_support::gang_tiny_config(kSteps, kSteps / 2);
  cfg.model.n_layer = 4;
  cfg.model.seq_len = 32;
  cfg.optim.warmup_steps = 2;
  cfg.train.micro_batch = 4;
  cfg.train.pp_schedule = schedule;
  return cfg;
}

using Curve = GangCurve;

// "" when every value is within `tol` (relative) of the reference (tol 0: the same bits).
std::string compare(const std::vector<double>& got, const std::vector<double>& want, const char* what,
                    double tol) {
  return curve_compare(got, want, what, tol);
}

// One rank of a dp x pp gang (gang_train.h): its communicators on the inherited store socket, then the
// train loop.
Result<Curve> train_rank(const Config& cfg, const std::string& out, int dp, int pp, int zero, int rank,
                         int world, int fd, const std::string& resume = "", int64_t max_steps = -1) {
  return gang_train_rank(
      cfg, {.out_dir = out, .dp = dp, .pp = pp, .zero = zero, .max_steps = max_steps, .resume = resume}, rank,
      world, fd);
}

struct Layout {
  int pp, dp, zero;
  const char* schedule;
  int vp = 1;
  int layers = 4;  // pp x vp at most
};

class PipelineParallel : public ::testing::TestWithParam<Layout> {};

TEST_P(PipelineParallel, MatchesOneProcess) {
  const Layout l = GetParam();
  Config cfg = tiny_pipe(l.schedule);
  cfg.model.n_layer = l.layers;
  Curve ref;
  Result<TrainSummary> one = train_run(cfg, {.out_dir = fresh_dir("one_process")}, &ref);
  cfg.train.vp = l.vp;  // the pipeline's; one process has no virtual stages
  ASSERT_TRUE(one.ok()) << one.error();
  ASSERT_EQ(ref.loss.size(), static_cast<size_t>(kSteps));
  const std::string out = fresh_dir("gang");
  const int m = cfg.train.global_batch / l.dp / cfg.train.micro_batch;
  PipelineSchedule sched{};
  ASSERT_TRUE(pipeline_schedule_from_name(l.schedule, &sched));
  const double formula = pipeline_schedule_bubble(sched, l.pp, l.vp, m);
  comm_test::RunResult res = run_workers(
      l.pp * l.dp,
      [&](int rank, int n, int fd) -> std::string {
        Result<Curve> c = train_rank(cfg, out, l.dp, l.pp, l.zero, rank, n, fd);
        if (!c.ok()) return c.error();
        const double tol = l.dp == 1 ? 0.0 : kRelTolerance;
        std::string diff = compare(c->loss, ref.loss, "loss", tol);
        if (diff.empty()) diff = compare(c->val, ref.val, "val loss", tol);
        if (diff.empty()) diff = compare(c->norm, ref.norm, "grad norm", l.dp == 1 ? kNormTolerance : tol);
        // Every step reports its measured bubble (a fraction of the schedule) beside the formula's; none
        // without a pipeline. ZB-H1's also say how its backward divides: the weight passes are part of it.
        const size_t reported = l.pp > 1 ? kSteps : 0;
        const size_t splits = sched == PipelineSchedule::kZeroBubbleH1 ? reported : 0;
        if (diff.empty() && c->weight_share.size() != splits)
          diff = "a weight-pass time for " + std::to_string(c->weight_share.size()) + " steps, expected " +
                 std::to_string(splits);
        for (size_t i = 0; diff.empty() && i < c->weight_share.size(); ++i) {
          if (!(c->weight_share[i] > 0 && c->weight_share[i] < 1))
            diff = "weight passes " + std::to_string(c->weight_share[i]) + " of the backward";
        }
        if (diff.empty() && (c->bubble.size() != reported || c->formula.size() != reported))
          diff = "a bubble for " + std::to_string(c->bubble.size()) + " steps, expected " +
                 std::to_string(reported);
        for (size_t i = 0; diff.empty() && i < c->bubble.size(); ++i) {
          if (!(c->bubble[i] >= 0 && c->bubble[i] < 1)) diff = "bubble " + std::to_string(c->bubble[i]);
          if (c->formula[i] != formula) diff = "formula " + std::to_string(c->formula[i]);
        }
        return diff.empty() ? "" : "rank " + std::to_string(rank) + ": " + diff;
      },
      300s);
  expect_all_passed(res);
}

INSTANTIATE_TEST_SUITE_P(Layouts, PipelineParallel,
                         ::testing::Values(Layout{2, 1, 0, "gpipe"}, Layout{2, 1, 0, "1f1b"},
                                           Layout{4, 1, 0, "1f1b"}, Layout{2, 2, 1, "1f1b"},
                                           Layout{2, 1, 0, "interleaved", 2, 4},
                                           Layout{4, 1, 0, "interleaved", 2, 8}, Layout{2, 1, 0, "zbh1"},
                                           Layout{4, 1, 0, "zbh1"}, Layout{2, 2, 2, "1f1b"},
                                           Layout{2, 2, 3, "1f1b"}, Layout{2, 2, 3, "zbh1"}),
                         [](const ::testing::TestParamInfo<Layout>& i) {
                           return "pp" + std::to_string(i.param.pp) + "_vp" + std::to_string(i.param.vp) +
                                  "_dp" + std::to_string(i.param.dp) + "_zero" +
                                  std::to_string(i.param.zero) + "_" + i.param.schedule;
                         });

// The whole of pp2_dp2's difference from one process is dp's: against dp 2 alone on the same config (the
// same reduction order over dp), the pipeline's loss and validation loss are the same bits, its norm within
// kNormTolerance.
TEST(PipelineParallelBitwise, Pp2Dp2FollowsDp2AloneBitForBit) {
  const Config cfg = tiny_pipe("1f1b");
  const std::string dp_out = fresh_dir("dp2"), pp_out = fresh_dir("pp2_dp2");
  const std::string ref_file = dp_out + "/curve.txt";
  comm_test::RunResult dp_res = run_workers(
      2,
      [&](int rank, int n, int fd) -> std::string {
        Result<Curve> c = train_rank(cfg, dp_out, 2, 1, 1, rank, n, fd);
        if (!c.ok()) return c.error();
        if (rank == 0) {
          FILE* f = std::fopen(ref_file.c_str(), "w");
          if (f == nullptr) return "cannot write " + ref_file;
          for (const std::vector<double>* v : {&c->loss, &c->val, &c->norm}) {
            std::fprintf(f, "%zu", v->size());
            for (double x : *v) std::fprintf(f, " %a", x);
            std::fprintf(f, "\n");
          }
          std::fclose(f);
        }
        return "";
      },
      300s);
  expect_all_passed(dp_res);
  Curve ref;
  FILE* f = std::fopen(ref_file.c_str(), "r");
  ASSERT_NE(f, nullptr) << ref_file;
  for (std::vector<double>* v : {&ref.loss, &ref.val, &ref.norm}) {
    size_t k = 0;
    ASSERT_EQ(std::fscanf(f, "%zu", &k), 1);
    v->resize(k);
    for (double& x : *v) ASSERT_EQ(std::fscanf(f, "%la", &x), 1);
  }
  std::fclose(f);
  ASSERT_EQ(ref.loss.size(), static_cast<size_t>(kSteps));
  comm_test::RunResult pp_res = run_workers(
      4,
      [&](int rank, int n, int fd) -> std::string {
        Result<Curve> c = train_rank(cfg, pp_out, 2, 2, 1, rank, n, fd);
        if (!c.ok()) return c.error();
        std::string diff = compare(c->loss, ref.loss, "loss vs dp 2", 0.0);
        if (diff.empty()) diff = compare(c->val, ref.val, "val loss vs dp 2", 0.0);
        if (diff.empty()) diff = compare(c->norm, ref.norm, "grad norm vs dp 2", kNormTolerance);
        return diff.empty() ? "" : "rank " + std::to_string(rank) + ": " + diff;
      },
      300s);
  expect_all_passed(pp_res);
}

// Checkpoints at pp > 1: every stage writes its tensors (by name, whole) and the manifest lists the whole
// model, so a checkpoint saved halfway (after 4 of 8 steps) under one (pp, dp, zero) resumes under another
// and continues on the one-process curve (data cursor included). Bitwise where neither side has dp > 1 (a
// pipeline at dp 1 follows one process bit for bit, above, and the state is restored exactly); else within
// kRelTolerance.
struct CkptLayout {
  int pp, dp, zero;
  std::string name() const {
    return "pp" + std::to_string(pp) + "_dp" + std::to_string(dp) + "_zero" + std::to_string(zero);
  }
};

// Trains `l` from `resume` (or fresh) up to `max_steps` in out; each rank's loss curve is held to `want`.
void train_layout(const Config& cfg, const CkptLayout& l, const std::string& out, const std::string& resume,
                  int64_t max_steps, const std::vector<double>& want, double tol) {
  if (l.pp * l.dp == 1) {
    Curve c;
    Result<TrainSummary> s = train_run(cfg, {.out_dir = out, .resume = resume, .max_steps = max_steps}, &c);
    ASSERT_TRUE(s.ok()) << s.error();
    EXPECT_EQ(compare(c.loss, want, ("loss at " + l.name()).c_str(), tol), "");
    return;
  }
  expect_all_passed(run_workers(
      l.pp * l.dp,
      [&](int rank, int n, int fd) -> std::string {
        Result<Curve> c = train_rank(cfg, out, l.dp, l.pp, l.zero, rank, n, fd, resume, max_steps);
        if (!c.ok()) return "rank " + std::to_string(rank) + ": " + c.error();
        const std::string diff = compare(c->loss, want, ("loss at " + l.name()).c_str(), tol);
        return diff.empty() ? "" : l.name() + " rank " + std::to_string(rank) + ": " + diff;
      },
      300s));
}

class PipelineCheckpoint : public ::testing::TestWithParam<CkptLayout> {};

TEST_P(PipelineCheckpoint, ResumesAtOtherLayoutsOnTheOneProcessCurve) {
  const CkptLayout saved = GetParam();
  Config cfg = tiny_pipe("1f1b");
  constexpr int64_t kHalf = kSteps / 2;
  cfg.train.checkpoint_every = kHalf;
  Curve ref;
  Result<TrainSummary> one = train_run(cfg, {.out_dir = fresh_dir("one_process")}, &ref);
  ASSERT_TRUE(one.ok()) << one.error();
  ASSERT_EQ(ref.loss.size(), static_cast<size_t>(kSteps));
  const std::vector<double> head(ref.loss.begin(), ref.loss.begin() + kHalf);
  const std::vector<double> tail(ref.loss.begin() + kHalf, ref.loss.end());

  const std::string out = fresh_dir("saved_" + saved.name());
  train_layout(cfg, saved, out, "", kHalf, head, saved.dp == 1 ? 0.0 : kRelTolerance);
  if (HasFailure()) return;
  char step_name[32];
  std::snprintf(step_name, sizeof step_name, "step_%08lld", static_cast<long long>(kHalf));
  const std::string dir = out + "/checkpoints/" + step_name;
  {
    std::ifstream in(dir + "/manifest.json");
    ASSERT_TRUE(in.good()) << dir;
    const nlohmann::json m = nlohmann::json::parse(in);
    EXPECT_EQ(m.at("layout").at("pp"), saved.pp);
    EXPECT_EQ(m.at("shards").size(), static_cast<size_t>(saved.pp * saved.dp));
    // The whole model's table, though rank 0 (the manifest's writer) holds the first stage only.
    const TensorTable whole = gpt_param_table(cfg.model);
    ASSERT_EQ(m.at("tensors").size(), whole.size());
    for (size_t i = 0; i < whole.size(); ++i) {
      EXPECT_EQ(m.at("tensors")[i].at("name").get<std::string>(), whole[i].name);
      EXPECT_EQ(m.at("tensors")[i].at("offset").get<size_t>(), whole[i].offset) << whole[i].name;
    }
  }
  for (const CkptLayout& to : {CkptLayout{1, 1, 0}, CkptLayout{4, 1, 0}, CkptLayout{1, 4, 1},
                               CkptLayout{2, 2, saved.zero == 3 ? 1 : 3}}) {
    SCOPED_TRACE("resumed at " + to.name());
    const double tol = saved.dp == 1 && to.dp == 1 ? 0.0 : kRelTolerance;
    train_layout(cfg, to, fresh_dir("resumed_" + saved.name() + "_at_" + to.name()), dir, -1, tail, tol);
  }
}

INSTANTIATE_TEST_SUITE_P(Saved, PipelineCheckpoint,
                         ::testing::Values(CkptLayout{2, 1, 0}, CkptLayout{2, 2, 3}, CkptLayout{1, 1, 0}),
                         [](const ::testing::TestParamInfo<CkptLayout>& i) { return i.param.name(); });

}  // namespace
}  // namespace gantry
