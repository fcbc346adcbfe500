// Gang placement: where each rank of a job runs, decided all at once or not at all. A pure function of
// the cluster's nodes and the job's layout (no I/O, no clock), so the coordinator can call it under its
// lock, the tests can enumerate it, and a refusal can be shown to the operator before anything starts.
//
//   std::vector<PlacementNode> nodes = {{.id = "gpu-01", .slots = 8},
//                                       {.id = "gpu-02", .slots = 8, .state = NodeState::quarantined},
//                                       {.id = "gpu-03", .slots = 8, .state = NodeState::spare}};
//   Result<Placement> p = placement_assign(nodes, {.dp = 2, .tp = 4});
//   if (!p.ok()) return conflict(p.error());   // "cannot place dp 2 x tp 4 x pp 1 (8 ranks): ..."
//   p->ranks[5];                                 // {.node = 0, .slot = 5, .local_rank = 5}
//   placement_describe(nodes, p.value());       // "gpu-01: ranks 0-7 on slots 0-7"
//
// The rules (issue 6; docs/CLUSTER.md):
//   - all or nothing: every rank gets a slot, or the job is refused with the reason;
//   - rank order is ParallelDims' (tp innermost, then pp, then dp), and ranks fill nodes in that order, so
//     each tensor-parallel group sits inside one node (NVLink), a node holds consecutive pipeline stages,
//     and the data-parallel axis is the one that spreads across nodes;
//   - quarantined, lost and unhealthy nodes are never used; spare nodes only when the healthy ones cannot
//   hold the
//     job (the result says which spares it took);
//   - as few nodes as possible, and the last one chosen is the smallest that fits what remains, so whole
//     free nodes stay free for the next job.
// Cost: O(nodes · log nodes + ranks): about 2 ms for 12,500 nodes of 8 slots (98k ranks) on the 2-core
// development machine.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "telemetry/status.h"

namespace gantry {

enum class NodeState {
  healthy,      // registered, heartbeating, usable
  quarantined,  // excluded by an operator (or a policy) until released
  lost,         // missed its heartbeats; may come back
  spare,        // healthy but held back for recovery: used only when the job does not fit without it
  unhealthy,    // its agent's health checks failed (a full disk, GPU errors): no new work until they pass
};
std::string_view node_state_name(NodeState s);  // "healthy", "quarantined", "lost", "spare", "unhealthy"
// Inverse of node_state_name; also accepts "ok" (storage/'s word for a healthy node).
Result<NodeState> node_state_parse(std::string_view s);

struct PlacementNode {
  std::string id;  // unique: the agent's host name as it registered
  int slots = 0;   // devices on the node (GPUs, or CPU slots)
  NodeState state = NodeState::healthy;
  std::vector<int> busy;  // slots held by other runs: distinct indices in [0, slots)
};

// The job's shape: the degrees of ParallelDims (engine/core/parallel/parallel_dims.h).
struct GangLayout {
  int dp = 1;
  int tp = 1;
  int pp = 1;
  int world = 0;  // 0 = dp·tp·pp; otherwise it must equal that
};

struct PlacedRank {
  int node = 0;        // index into the nodes given
  int slot = 0;        // device index on that node (what CUDA_VISIBLE_DEVICES names)
  int local_rank = 0;  // this rank's index among the job's ranks on that node (LOCAL_RANK)
};

struct PlacedNode {
  int node = 0;        // index into the nodes given
  int first_rank = 0;  // ranks on a node are consecutive: first_rank .. first_rank + ranks - 1
  int ranks = 0;
  bool spare = false;  // a spare node this job brought into use
};

struct Placement {
  std::vector<PlacedRank> ranks;  // indexed by global rank
  std::vector<PlacedNode> nodes;  // the nodes used, in rank order
  int spares_used() const;
};

// Places the whole job or refuses it. The refusal names the layout, what it needs, what the usable nodes
// have and why it does not fit (too few free slots, or no node with room for a whole tp group), and which
// nodes were left out for being quarantined or lost. Invalid input (a bad layout, duplicate node ids,
// busy slots out of range) is refused the same way, naming the field.
Result<Placement> placement_assign(const std::vector<PlacementNode>& nodes, const GangLayout& layout);

// One line per node used: "gpu-01: ranks 0-7 on slots 0-7", "gpu-03 (spare): ranks 8-11 on slots 0-1,4-5".
std::string placement_describe(const std::vector<PlacementNode>& nodes, const Placement& p);

}  // namespace gantry
