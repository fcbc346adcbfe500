#include "engine/cluster/run_layout.h"

#include <algorithm>

#include "engine/core/parallel/parallel_dims.h"
#include "engine/core/parallel/pipeline_schedule.h"  // pipeline_check
#include "engine/core/parallel/tensor_parallel.h"    // tensor_parallel_check
#include "engine/core/train.h"                       // train_layout_check

namespace gantry {

Status run_layout_check(const Config& c, const RunLayout& l) {
  if (l.vp < 1) return Status::error("vp " + std::to_string(l.vp) + " must be at least 1");
  // The API takes each degree up to its own bound, so their product can pass int's range: counted in 64
  // bits, or dp 2^20 x tp 2^10 x pp 2^10 reads as a world of 0 ranks.
  const long long world = static_cast<long long>(l.dp) * l.tp * l.pp;
  if (world > kRunLayoutMaxWorld) {
    return Status::error("parallel layout: dp " + std::to_string(l.dp) + " x tp " + std::to_string(l.tp) +
                         " x pp " + std::to_string(l.pp) + " = " + std::to_string(world) +
                         " ranks, more than the " + std::to_string(kRunLayoutMaxWorld) +
                         " a run may have: choose degrees whose product is at most " +
                         std::to_string(kRunLayoutMaxWorld));
  }
  Result<ParallelDims> d =
      ParallelDims::make({.world = l.world(), .rank = 0, .dp = l.dp, .tp = l.tp, .pp = l.pp, .zero = l.zero});
  if (!d.ok()) return d.status();
  // With the config's sequence parallelism, as the workers check it: without it a seq_len that tp does not
  // divide passed here and the gang failed at start with exit code 2, leaving a failed run behind.
  if (Status s = tensor_parallel_check(c.model, d.value(), c.train.backend, c.train.sequence_parallel);
      !s.ok())
    return s;
  if (Status s = train_layout_check(c, l.dp); !s.ok()) return s;
  // The pipeline's micro-batches are the gradient-accumulation ones (train.cpp), as `run` counts them.
  const int share = c.train.global_batch / l.dp, B = std::min(c.train.micro_batch, share);
  return pipeline_check(c, d.value(), share / B, l.vp);
}

std::string run_layout_text(const RunLayout& l) {
  return "dp=" + std::to_string(l.dp) + " tp=" + std::to_string(l.tp) + " pp=" + std::to_string(l.pp) +
         " vp=" + std::to_string(l.vp) + " zero=" + std::to_string(l.zero);
}

}  // namespace gantry
