// The planner's cluster: GPU kinds (peak, memory, links), how ranks sit on nodes, and the alpha-beta cost of
// a collective with nccl-tests' bus-bandwidth factors. Pure arithmetic; no dependencies.
//
//   Result<GpuSpec> g = plan_gpu_preset("h100");
//   ClusterSpec c = plan_cluster_default(g.value(), /*gpus=*/64);
//   GroupLink dp = plan_group_link(c, /*group_size=*/8, /*stride=*/8);  // one rank per node: the NIC
//   double s = plan_collective_seconds(Collective::kAllReduce, 1e9, 8, dp);
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "telemetry/status.h"

namespace gantry {

struct GpuSpec {
  std::string name;       // "h100", "a100-80gb", ...
  double bf16_flops = 0;  // dense bf16 tensor-core peak, FLOP/s (vendor datasheet, no sparsity)
  double hbm_bytes = 0;   // device memory, bytes (as nvidia-smi's memory.total reports it)
  double hbm_bw = 0;      // device memory bandwidth, bytes/s
  double nvlink_bw = 0;   // NVLink bandwidth per GPU per direction, bytes/s (peak)
  double nic_bw = 0;      // network bandwidth per GPU (one NIC per GPU, DGX-style), bytes/s (peak)
  // The fraction of peak the transformer layers sustain in a real training stack: one number per GPU
  // generation, calibrated on one published run each and checked on others (docs/PLANNER.md).
  double compute_efficiency = 0.5;
};

// a100-40gb, a100-80gb, h100, h200, b200.
Result<GpuSpec> plan_gpu_preset(std::string_view name);
const std::vector<std::string>& plan_gpu_preset_names();

struct ClusterSpec {
  GpuSpec gpu;
  int gpus = 8;  // all GPUs of the job
  int gpus_per_node = 8;
  double intra_bw = 0;         // achievable bus bandwidth between GPUs of one node, bytes/s
  double inter_bw = 0;         // achievable bus bandwidth per GPU between nodes, bytes/s
  double intra_latency_s = 0;  // alpha: cost of one ring step inside a node
  double inter_latency_s = 0;  // alpha: cost of one ring step across nodes
  double node_mtbf_s = 0;      // mean time between failures of one node (any cause that stops the job)
};

// Links at kLinkEfficiency of their peak, the default latencies and MTBF.
ClusterSpec plan_cluster_default(const GpuSpec& gpu, int gpus, int gpus_per_node = 8);

// What nccl-tests' bus bandwidth reaches of a link's peak on large messages. An assumption of this
// planner (not a published figure): override intra_bw / inter_bw with your own nccl-tests busbw.
inline constexpr double kLinkEfficiency = 0.8;

// Node MTBF from the Llama 3 405B pre-training run (Dubey et al. 2024 §3.3.4): 419 unexpected
// interruptions in a 54-day snapshot on 16,384 H100s (2,048 nodes of 8) = 54·24·2048/419 node-hours.
inline constexpr double kDefaultNodeMtbfHours = 54.0 * 24.0 * 2048.0 / 419.0;

int plan_nodes(const ClusterSpec& c);  // ceil(gpus / gpus_per_node)

enum class Collective { kAllReduce, kAllGather, kReduceScatter, kSendRecv };
const char* collective_name(Collective k);  // "all-reduce", "all-gather", "reduce-scatter", "send/recv"

// The link a group of `group_size` ranks, `stride` ranks apart in the global order, communicates over.
// A group inside one node uses NVLink. A group spanning nodes is limited by the network: with k of its
// ranks on each node, a ring (NCCL runs one per NIC) carries k NICs' worth of bandwidth, never more than
// NVLink's.
struct GroupLink {
  double bw = 0;         // bus bandwidth, bytes/s
  double latency_s = 0;  // per ring step
  bool crosses_nodes = false;
};
GroupLink plan_group_link(const ClusterSpec& c, int group_size, int stride);

// nccl-tests' bus-bandwidth factor (doc/PERFORMANCE.md, "Summary"): all-reduce 2(n−1)/n, all-gather and
// reduce-scatter (n−1)/n, send/receive 1. Time of a large operation on S bytes = S·factor / busbw.
double plan_bus_factor(Collective k, int n);

// Alpha-beta time of one ring collective on `bytes` (nccl-tests' S: the whole buffer, not the per-rank
// slice) over n ranks: steps·alpha + bytes·factor/bw, with 2(n−1) ring steps for all-reduce, n−1 for
// all-gather and reduce-scatter, 1 for send/receive. Zero when n <= 1 or bytes <= 0.
double plan_collective_seconds(Collective k, double bytes, int n, const GroupLink& link);

}  // namespace gantry
