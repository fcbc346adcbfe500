// Test support for tensor-parallel gangs of real processes: one rank of a dp x tp gang (the world, tp and
// dp communicators on the inherited store socket, then the train loop), and the curve it trained.
//
//   Result<TpCurve> c = tp_train_rank(cfg, {.out_dir = out, .dp = 2, .tp = 2, .zero = 1}, rank, n, fd);
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "engine/core/comm/gloo_communicator.h"
#include "engine/core/comm/store_client.h"
#include "engine/core/config.h"
#include "engine/core/train.h"

namespace gantry::testing_support {

struct TpCurve : TrainObserver {
  std::vector<double> loss, norm, val;
  uint64_t params_xxh64 = 0;  // the rank's parameters (its tp share) at the end
  void on_step(const StepReport& r) override {
    loss.push_back(r.loss);
    norm.push_back(r.grad_norm);
    if (r.val_loss) val.push_back(*r.val_loss);
  }
};

struct TpRankRun {
  std::string out_dir;
  int dp = 1, tp = 1, zero = 0;
  int64_t max_steps = -1;
  std::string resume;
};

// Communicators are created in the same order on every rank; each group rendezvouses under a store
// prefix of its own. As the worker runtime: at tp 1 the dp communicator is the whole gang, with no world
// communicator beside it.
inline Result<TpCurve> tp_train_rank(const Config& cfg, const TpRankRun& run, int rank, int world, int fd) {
  using namespace std::chrono_literals;
  Result<ParallelDims> dims =
      ParallelDims::make({.world = world, .rank = rank, .dp = run.dp, .tp = run.tp, .zero = run.zero});
  if (!dims.ok()) return dims.status();
  const ParallelDims& d = dims.value();
  std::unique_ptr<Communicator> world_comm, tp_comm, dp_comm;
  if (run.tp > 1) {
    Result<std::unique_ptr<Communicator>> w = gloo_communicator_create(rank, world, fd, "world/", 60s);
    if (!w.ok()) return w.status();
    world_comm = std::move(w.value());
  }
  if (run.tp > 1) {
    Result<std::unique_ptr<Communicator>> t =
        gloo_communicator_create(d.tp_rank(), run.tp, fd, "tp/" + std::to_string(d.dp_rank()) + "/", 60s);
    if (!t.ok()) return t.status();
    tp_comm = std::move(t.value());
  }
  if (run.dp > 1) {
    Result<std::unique_ptr<Communicator>> p =
        gloo_communicator_create(d.dp_rank(), run.dp, fd, "dp/" + std::to_string(d.tp_rank()) + "/", 60s);
    if (!p.ok()) return p.status();
    dp_comm = std::move(p.value());
  }
  StoreClient store(fd);
  DistContext ctx{.dims = d,
                  .dp = dp_comm.get(),
                  .tp = tp_comm.get(),
                  .world = world_comm.get(),
                  .store = &store,
                  .timeout = 60s};
  TpCurve curve;
  Result<TrainSummary> s = train_run(
      cfg, {.out_dir = run.out_dir, .resume = run.resume, .max_steps = run.max_steps, .dist = &ctx}, &curve);
  if (!s.ok()) return s.status();
  curve.params_xxh64 = s->params_xxh64;
  return curve;
}

}  // namespace gantry::testing_support
