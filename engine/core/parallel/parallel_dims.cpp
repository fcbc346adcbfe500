#include "engine/core/parallel/parallel_dims.h"

namespace gantry {

Result<ParallelDims> ParallelDims::make(const ParallelDims& d) {
  auto bad = [](const std::string& what) { return Status::error("parallel layout: " + what); };
  if (d.world < 1) return bad("world size " + std::to_string(d.world) + " must be at least 1");
  if (d.dp < 1 || d.tp < 1 || d.pp < 1) {
    return bad("dp " + std::to_string(d.dp) + ", tp " + std::to_string(d.tp) + ", pp " +
               std::to_string(d.pp) + ": every degree must be at least 1");
  }
  if (static_cast<long long>(d.dp) * d.tp * d.pp != d.world) {
    return bad("dp " + std::to_string(d.dp) + " x tp " + std::to_string(d.tp) + " x pp " +
               std::to_string(d.pp) + " = " + std::to_string(static_cast<long long>(d.dp) * d.tp * d.pp) +
               " but the world has " + std::to_string(d.world) +
               " ranks: the degrees must multiply to the world size");
  }
  if (d.rank < 0 || d.rank >= d.world) {
    return bad("rank " + std::to_string(d.rank) + " is outside [0, " + std::to_string(d.world) + ")");
  }
  if (d.zero < 0 || d.zero > 3) return bad("zero stage " + std::to_string(d.zero) + " must be 0, 1, 2 or 3");
  return d;
}

std::vector<int> ParallelDims::dp_group() const {
  std::vector<int> g;
  for (int i = 0; i < dp; ++i) g.push_back(i * tp * pp + pp_rank() * tp + tp_rank());
  return g;
}

std::vector<int> ParallelDims::tp_group() const {
  std::vector<int> g;
  for (int i = 0; i < tp; ++i) g.push_back(dp_rank() * tp * pp + pp_rank() * tp + i);
  return g;
}

std::vector<int> ParallelDims::pp_group() const {
  std::vector<int> g;
  for (int i = 0; i < pp; ++i) g.push_back(dp_rank() * tp * pp + i * tp + tp_rank());
  return g;
}

std::string ParallelDims::comm_prefix(ParallelAxis axis) const {
  const std::string d = std::to_string(dp_rank()), t = std::to_string(tp_rank()),
                    p = std::to_string(pp_rank());
  switch (axis) {
    case ParallelAxis::kWorld:
      return "world/";
    case ParallelAxis::kDp:
      return tp == 1 && pp == 1 ? "dp/" : "dp/p" + p + "/t" + t + "/";
    case ParallelAxis::kTp:
      return "tp/d" + d + "/p" + p + "/";
    case ParallelAxis::kPp:
      return "pp/d" + d + "/t" + t + "/";
  }
  return "?/";
}

std::string ParallelDims::describe() const {
  return "dp " + std::to_string(dp) + " x tp " + std::to_string(tp) + " x pp " + std::to_string(pp) +
         ", zero " + std::to_string(zero) + " (world " + std::to_string(world) + ")";
}

}  // namespace gantry
