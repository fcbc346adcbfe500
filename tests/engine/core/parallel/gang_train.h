// Test support shared by the parallel-training tests: one rank of a dp x pp x tp gang of real processes
// (its communicators on the inherited store socket, then the train loop), the curve it trained, and the
// comparison of a curve with the single-process one.
//
//   Result<GangCurve> c = gang_train_rank(cfg, {.out_dir = out, .dp = 2, .tp = 2, .pp = 2, .zero = 1},
//                                         rank, world, fd);
//   std::string bad = curve_compare(c->loss, ref.loss, "loss", 1e-4);   // "" when within tolerance
//
// The communicators follow the worker runtime (engine/core/worker/worker_runtime.cpp): at tp 1 and pp 1
// the dp communicator is the whole gang under the prefix "dp/", with no world communicator; otherwise a
// world communicator, then one per tp group, one per pp group and one per dp group, created in the same
// order on every rank, each group under a store prefix naming its fixed coordinates
// (ParallelDims::comm_prefix).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "engine/core/comm/gloo_communicator.h"
#include "engine/core/comm/store_client.h"
#include "engine/core/config.h"
#include "engine/core/train.h"

namespace gantry::testing_support {

// assets/configs/tiny.toml for a gang test: `steps` steps, validation every `val_every` (0: none), no
// checkpoints, one thread a rank (the gang's ranks share the cores) and small gradient buckets (several a
// step). Each test changes what its layouts need on top.
inline Config gang_tiny_config(int64_t steps, int64_t val_every) {
  Result<Config> c = config_load(std::string(GANTRY_SOURCE_DIR "/assets/configs/tiny.toml"));
  EXPECT_TRUE(c.ok()) << c.error();
  if (!c.ok()) return Config{};
  Config cfg = c.value();
  cfg.train.max_steps = steps;
  cfg.train.val_every = val_every;
  cfg.train.checkpoint_every = 0;
  cfg.train.threads = 1;
  cfg.train.dp_bucket_mb = 0.1;
  return cfg;
}

struct GangCurve : TrainObserver {
  std::vector<double> loss, norm, val, bubble, formula;
  std::vector<double> weight_share;  // ZB-H1: the weight passes' share of the step's backward
  std::string start;
  uint64_t params_xxh64 = 0;      // the rank's parameters (its share) at the end
  TrainObserver* also = nullptr;  // sees every report too
  void on_start(const std::string& s) override {
    start = s;
    if (also != nullptr) also->on_start(s);
  }
  void on_step(const StepReport& r) override {
    loss.push_back(r.loss);
    norm.push_back(r.grad_norm);
    if (r.val_loss) val.push_back(*r.val_loss);
    if (r.phases.bubble) bubble.push_back(*r.phases.bubble);
    if (r.phases.bubble_formula) formula.push_back(*r.phases.bubble_formula);
    if (r.phases.weight_pass_s) weight_share.push_back(*r.phases.weight_pass_s / r.phases.backward_s);
    if (also != nullptr) also->on_step(r);
  }
  // The rest only pass on.
  void on_run(const RunDescription& r) override {
    if (also != nullptr) also->on_run(r);
  }
  void on_checkpoint(const CheckpointReport& c) override {
    if (also != nullptr) also->on_checkpoint(c);
  }
  void on_checkpoint_failed(const CheckpointReport& c, const std::string& e) override {
    if (also != nullptr) also->on_checkpoint_failed(c, e);
  }
  void on_action(TrainAction x, int64_t s) override {
    if (also != nullptr) also->on_action(x, s);
  }
  void on_step_skipped(int64_t s, const std::string& why) override {
    if (also != nullptr) also->on_step_skipped(s, why);
  }
  void on_guard_rollback(const GuardRollback& g) override {
    if (also != nullptr) also->on_guard_rollback(g);
  }
  void on_guard_streak(const GuardRollback& g) override {
    if (also != nullptr) also->on_guard_streak(g);
  }
  void on_sdc_mismatch(const SdcMismatch& m) override {
    if (also != nullptr) also->on_sdc_mismatch(m);
  }
};

struct GangRun {
  std::string out_dir;
  int dp = 1, tp = 1, pp = 1, zero = 0;
  int64_t max_steps = -1;
  std::string resume;
  TrainControl* control = nullptr;
  TrainObserver* also = nullptr;  // sees every report too
  std::chrono::milliseconds timeout{std::chrono::seconds(60)};
};

inline Result<GangCurve> gang_train_rank(const Config& cfg, const GangRun& run, int rank, int world, int fd) {
  Result<ParallelDims> dims = ParallelDims::make(
      {.world = world, .rank = rank, .dp = run.dp, .tp = run.tp, .pp = run.pp, .zero = run.zero});
  if (!dims.ok()) return dims.status();
  const ParallelDims& d = dims.value();
  std::unique_ptr<Communicator> world_comm, tp_comm, pp_comm, dp_comm;
  auto make = [&](ParallelAxis axis, int axis_rank, int size, std::unique_ptr<Communicator>* out) -> Status {
    Result<std::unique_ptr<Communicator>> c =
        gloo_communicator_create(axis_rank, size, fd, d.comm_prefix(axis), run.timeout);
    if (!c.ok()) return c.status();
    *out = std::move(c.value());
    return {};
  };
  const bool axes = run.tp > 1 || run.pp > 1;
  if (axes) {
    if (Status s = make(ParallelAxis::kWorld, rank, world, &world_comm); !s.ok()) return s;
    if (run.tp > 1) {
      if (Status s = make(ParallelAxis::kTp, d.tp_rank(), run.tp, &tp_comm); !s.ok()) return s;
    }
    if (run.pp > 1) {
      if (Status s = make(ParallelAxis::kPp, d.pp_rank(), run.pp, &pp_comm); !s.ok()) return s;
    }
  }
  if (run.dp > 1) {
    if (Status s = make(ParallelAxis::kDp, d.dp_rank(), run.dp, &dp_comm); !s.ok()) return s;
  }
  StoreClient store(fd);
  DistContext ctx{.dims = d,
                  .dp = dp_comm.get(),
                  .tp = tp_comm.get(),
                  .world = world_comm.get(),
                  .pp = pp_comm.get(),
                  .store = &store,
                  .timeout = run.timeout};
  GangCurve curve;
  curve.also = run.also;
  Result<TrainSummary> s = train_run(cfg,
                                     {.out_dir = run.out_dir,
                                      .resume = run.resume,
                                      .max_steps = run.max_steps,
                                      .dist = &ctx,
                                      .control = run.control},
                                     &curve);
  if (!s.ok()) return s.status();
  curve.params_xxh64 = s->params_xxh64;
  return curve;
}

// "" when every value is within `rel` (relative) of the reference (rel 0: the same bits), else the first
// that is not; the largest relative difference goes to stderr (what the tolerance leaves to spare shows in
// the test's log).
inline std::string curve_compare(const std::vector<double>& got, const std::vector<double>& want,
                                 const char* what, double rel) {
  if (got.size() != want.size()) {
    return std::string(what) + ": " + std::to_string(got.size()) + " values, expected " +
           std::to_string(want.size());
  }
  double worst = 0;
  for (size_t i = 0; i < got.size(); ++i)
    worst = std::max(worst, std::fabs(got[i] - want[i]) / std::fabs(want[i]));
  std::fprintf(stderr, "%s: largest relative difference from the reference %.3g\n", what, worst);
  for (size_t i = 0; i < got.size(); ++i) {
    const bool ok = rel == 0 ? got[i] == want[i] : std::fabs(got[i] - want[i]) <= rel * std::fabs(want[i]);
    if (!ok) {
      char buf[200];
      std::snprintf(buf, sizeof buf, "%s[%zu] = %.17g, the reference gave %.17g (relative difference %.3g)",
                    what, i, got[i], want[i], std::fabs(got[i] - want[i]) / std::fabs(want[i]));
      return buf;
    }
  }
  return "";
}

}  // namespace gantry::testing_support
