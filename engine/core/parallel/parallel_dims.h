// The layout of a job over its ranks: data, tensor and pipeline parallel degrees and the ZeRO stage.
// Rank order (DESIGN.md): tp innermost (neighbours share a node and NVLink), then pp, then dp outermost.
//
//   Result<ParallelDims> d = ParallelDims::make({.world = 8, .rank = 5, .dp = 4, .tp = 2, .zero = 1});
//   d->dp_rank();   // 2          d->tp_rank();   // 1
//   d->dp_group();  // {1, 3, 5, 7}: the global ranks that share this rank's tp and pp coordinates
//
#pragma once

#include <string>
#include <vector>

#include "telemetry/status.h"

namespace gantry {

enum class ParallelAxis { kWorld, kDp, kTp, kPp };

struct ParallelDims {
  int world = 1;
  int rank = 0;  // global rank in [0, world)
  int dp = 1;
  int tp = 1;
  int pp = 1;
  int zero =
      0;  // ZeRO stage 0..3 over the dp axis: 1 shards AdamW state, 2 also gradients, 3 also parameters

  // Checks that dp * tp * pp == world, every degree >= 1, 0 <= rank < world and 0 <= zero <= 3; the error
  // names the first field that is wrong and what would be right.
  static Result<ParallelDims> make(const ParallelDims& d);

  int tp_rank() const { return rank % tp; }
  int pp_rank() const { return (rank / tp) % pp; }
  int dp_rank() const { return rank / (tp * pp); }

  // Global ranks of this rank's group along each axis, in the axis' rank order (this rank's index in the
  // list is its rank on that axis).
  std::vector<int> dp_group() const;
  std::vector<int> tp_group() const;
  std::vector<int> pp_group() const;

  // The store prefix under which this rank's group along `axis` rendezvouses when its communicator is
  // made: one per group, naming the coordinates its ranks share ("tp/d1/p0/": dp rank 1, pp rank 0).
  // At tp 1 and pp 1 the dp group is the whole gang, "dp/" (no world communicator beside it).
  std::string comm_prefix(ParallelAxis axis) const;

  // "dp 4 x tp 1 x pp 1, zero 1 (world 4)"
  std::string describe() const;
};

}  // namespace gantry
