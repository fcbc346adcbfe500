// A run's 3D layout as the coordinator takes it (submit's and resume-from's "layout"): the degrees, the
// checks `gantry-engine run` makes before it spawns a gang (so a layout the workers would refuse is refused
// at the API, naming the numbers), and the text the run's history and events carry.
//
//   RunLayout l{.dp = 2, .tp = 2, .zero = 1};
//   if (Status s = run_layout_check(cfg, l); !s.ok()) return bad_request(s.message());
//   run_layout_text(l);  // "dp=2 tp=2 pp=1 vp=1 zero=1"
#pragma once

#include <string>

#include "engine/core/config.h"
#include "telemetry/status.h"

namespace gantry {

// The most ranks a run may have (dp's own bound, 2^20): the degrees' product is checked against it before
// anything multiplies them in int.
inline constexpr long long kRunLayoutMaxWorld = 1LL << 20;

struct RunLayout {
  int dp = 1;
  int tp = 1;  // tensor parallel: a group of tp consecutive ranks, always on one node
  int pp = 1;  // pipeline stages
  int vp = 1;  // virtual stages per rank (interleaved 1F1B); 1 until the engine has that schedule
  int zero = 0;
  int world() const { return dp * tp * pp; }
};

// The layout as `gantry-engine run` checks it: ParallelDims, tensor_parallel_check, train_layout_check
// (the global batch over dp) and pipeline_check (stages, schedule, micro-batches, vp).
Status run_layout_check(const Config& c, const RunLayout& l);

std::string run_layout_text(const RunLayout& l);

}  // namespace gantry
