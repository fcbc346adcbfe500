#include "engine/plan/cluster.h"

#include <algorithm>
#include <cmath>

namespace gantry {

namespace {

constexpr double kMiB = 1024.0 * 1024.0;

// Calibrated compute efficiencies: the one free number per GPU generation, each fitted to one published
// run (presets() says which) and checked against the others in docs/PLANNER.md's validation table.
constexpr double kA100Efficiency = 0.60;
constexpr double kH100Efficiency = 0.47;

GpuSpec gpu(std::string name, double tflops, double mib, double hbm_tbps, double nvlink_gbps, double nic_gbps,
            double efficiency) {
  return GpuSpec{std::move(name),   tflops * 1e12,  mib * kMiB, hbm_tbps * 1e12,
                 nvlink_gbps * 1e9, nic_gbps * 1e9, efficiency};
}

std::vector<GpuSpec> presets() {
  // Peaks: dense bf16 and HBM bandwidth from NVIDIA's datasheets (SXM parts); the same peaks as
  // telemetry/flops.h uses for MFU. Memory: nvidia-smi's memory.total. NVLink: 600 GB/s (A100),
  // 900 GB/s (H100, H200), 1.8 TB/s (B200) both directions together, so half each way. Network: one
  // 200 Gb/s HDR NIC per A100 (DGX A100), one 400 Gb/s NDR NIC per H100/H200/B200 (DGX H100/H200/B200).
  // compute_efficiency: A100 calibrated on Narayanan et al. 2021 Table 2 (GPT-3 175B, PTD parallelism,
  // 384 GPUs, 153 TFLOP/s per GPU: predicted 151.7); H100 on MosaicML's llm-foundry benchmark table
  // (scripts/train/benchmarking/README.md, "H100 80GB BF16": MPT-7B, sequence 2048, 8 GPUs, FSDP,
  // 10,643 tokens/s per GPU: predicted 10,590). H200 has H100's compute, so its figure carries over;
  // B200 has no published calibration run here and reuses H100's (an assumption: say so when quoting
  // B200 predictions). See docs/PLANNER.md.
  return {
      gpu("a100-40gb", 312, 40960, 1.555, 300, 25, kA100Efficiency),
      gpu("a100-80gb", 312, 81920, 2.039, 300, 25, kA100Efficiency),
      gpu("h100", 989, 81559, 3.35, 450, 50, kH100Efficiency),
      gpu("h200", 989, 143771, 4.8, 450, 50, kH100Efficiency),
      gpu("b200", 2250, 183359, 8.0, 900, 50, kH100Efficiency),
  };
}

}  // namespace

Result<GpuSpec> plan_gpu_preset(std::string_view name) {
  for (const GpuSpec& g : presets()) {
    if (g.name == name) return g;
  }
  std::string allowed;
  for (const std::string& n : plan_gpu_preset_names()) allowed += (allowed.empty() ? "" : ", ") + n;
  return Status::error("unknown GPU kind '" + std::string(name) + "': allowed " + allowed);
}

const std::vector<std::string>& plan_gpu_preset_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> v;
    for (const GpuSpec& g : presets()) v.push_back(g.name);
    return v;
  }();
  return names;
}

ClusterSpec plan_cluster_default(const GpuSpec& g, int gpus, int gpus_per_node) {
  ClusterSpec c;
  c.gpu = g;
  c.gpus = gpus;
  c.gpus_per_node = gpus_per_node;
  c.intra_bw = kLinkEfficiency * g.nvlink_bw;
  c.inter_bw = kLinkEfficiency * g.nic_bw;
  // Per-step latencies: assumptions of the order nccl-tests shows for small messages (a few µs per hop
  // over NVLink, more through a NIC and switches). They matter only for small messages.
  c.intra_latency_s = 2e-6;
  c.inter_latency_s = 6e-6;
  c.node_mtbf_s = kDefaultNodeMtbfHours * 3600.0;
  return c;
}

int plan_nodes(const ClusterSpec& c) {
  return c.gpus_per_node > 0 ? (c.gpus + c.gpus_per_node - 1) / c.gpus_per_node : 1;
}

const char* collective_name(Collective k) {
  switch (k) {
    case Collective::kAllReduce:
      return "all-reduce";
    case Collective::kAllGather:
      return "all-gather";
    case Collective::kReduceScatter:
      return "reduce-scatter";
    case Collective::kSendRecv:
      return "send/recv";
  }
  return "?";
}

GroupLink plan_group_link(const ClusterSpec& c, int group_size, int stride) {
  GroupLink l;
  const int per_node = std::max(1, c.gpus_per_node);
  stride = std::max(1, stride);
  if (group_size <= 1 || static_cast<long long>(stride) * group_size <= per_node) {
    l.bw = c.intra_bw;
    l.latency_s = c.intra_latency_s;
    return l;
  }
  // Ranks of this group that share a node: consecutive members are `stride` apart.
  const int on_node = std::clamp(per_node / stride, 1, group_size);
  l.bw = std::min(c.intra_bw, on_node * c.inter_bw);
  l.latency_s = c.inter_latency_s;
  l.crosses_nodes = true;
  return l;
}

double plan_bus_factor(Collective k, int n) {
  if (n <= 1) return 0;
  switch (k) {
    case Collective::kAllReduce:
      return 2.0 * (n - 1) / n;
    case Collective::kAllGather:
    case Collective::kReduceScatter:
      return static_cast<double>(n - 1) / n;
    case Collective::kSendRecv:
      return 1.0;
  }
  return 0;
}

double plan_collective_seconds(Collective k, double bytes, int n, const GroupLink& link) {
  if (n <= 1 || bytes <= 0 || link.bw <= 0) return 0;
  double steps = 1;
  if (k == Collective::kAllReduce) steps = 2.0 * (n - 1);
  if (k == Collective::kAllGather || k == Collective::kReduceScatter) steps = n - 1;
  return steps * link.latency_s + bytes * plan_bus_factor(k, n) / link.bw;
}

}  // namespace gantry
