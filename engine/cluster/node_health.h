// The node agent's health checks (issue 15): what the agent can see going wrong with its node before it
// kills a run. Each check gives a verdict: ok, unhealthy (with a reason an operator can act on), or unknown
// (the check cannot be made here, said why; never taken as healthy-by-default nor shown as 0).
//
//   disk  free space (statvfs) of the agent's folder below a threshold;
//   nvml  NVIDIA's management library, opened at run time (dlopen "libnvidia-ml.so.1": no link dependency),
//         per GPU: volatile uncorrectable ECC errors (a count that rises marks the node), pending retired
//         pages and pending remapped rows (the GPU needs a reset);
//   xid   the kernel log (/dev/kmsg, where readable): "NVRM: Xid" lines with a fatal code (48 double-bit ECC,
//         63/64 row remapping, 74 NVLink, 79 fallen off the bus, 92 high single-bit ECC rate, 94/95
//         contained/uncontained ECC).
//
//   NodeHealth h(NodeHealthOptions{.disk_path = dir, .min_free_disk_bytes = 1ull << 30});
//   HealthReport r = h.check();        // every beat or so; cheap (a statvfs, a few NVML calls, a kmsg read)
//   if (r.state == HealthState::kUnhealthy) log(r.reason);   // "disk: /data has 0.4 GiB free, below 1 GiB"
//   control["health"] = health_report_json(r);                // the agent's beat (agent_beat.h)
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace gantry {

enum class HealthState { kUnknown, kOk, kUnhealthy };
std::string_view health_state_name(HealthState s);  // "unknown", "ok", "unhealthy"

struct HealthCheck {
  std::string name;  // "disk", "nvml", "xid"
  HealthState state = HealthState::kUnknown;
  std::string detail;  // the reason when unhealthy, why unknown, or what was seen when ok
};

struct HealthReport {
  HealthState state = HealthState::kUnknown;  // unhealthy if any check is; else ok if any is; else unknown
  std::string reason;                         // the unhealthy checks' details, joined with "; "
  std::vector<HealthCheck> checks;
};
HealthReport health_combine(std::vector<HealthCheck> checks);
nlohmann::json health_report_json(
    const HealthReport& r);  // {"state", "reason", "checks": [{name, state, detail}]}

// The disk decision, apart from statvfs so it can be tested: free bytes below the threshold is unhealthy.
HealthCheck disk_verdict(const std::string& path, uint64_t free_bytes, uint64_t min_free_bytes);
// statvfs(path) (f_bavail: what an unprivileged writer such as a checkpoint gets) then disk_verdict; unknown
// when statvfs fails, with its error.
HealthCheck disk_check(const std::string& path, uint64_t min_free_bytes);

// One "NVRM: Xid" kernel line, e.g.
//   "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, GPU has fallen off the bus."
// as printed by the driver (a /dev/kmsg record's "prio,seq,usec,flags;" prefix may come before it).
struct XidEvent {
  std::string pci;  // "0000:3b:00"
  int code = 0;
  std::string text;  // the rest of the line after the code
};
std::optional<XidEvent> parse_xid_line(std::string_view line);
bool xid_is_fatal(int code);  // 48, 63, 64, 74, 79, 92, 94, 95

struct NodeHealthOptions {
  std::string disk_path;                           // the agent's folder ("" = no disk check)
  uint64_t min_free_disk_bytes = 0;                // 0 = no disk check
  std::string kmsg_path = "/dev/kmsg";             // "" = no Xid check
  std::string nvml_library = "libnvidia-ml.so.1";  // "" = no NVML check
};

// The checks with their state between calls: NVML's library handle and each GPU's last uncorrectable ECC
// count (a rise between checks, or any pending retirement, is unhealthy), the kernel log's read position
// and the fatal Xids seen (a fatal Xid stays until the agent restarts: the GPU needs a reset).
class NodeHealth {
 public:
  explicit NodeHealth(NodeHealthOptions options);
  ~NodeHealth();
  NodeHealth(const NodeHealth&) = delete;
  NodeHealth& operator=(const NodeHealth&) = delete;

  void set_min_free_disk_bytes(uint64_t bytes) { opt_.min_free_disk_bytes = bytes; }
  uint64_t min_free_disk_bytes() const { return opt_.min_free_disk_bytes; }
  HealthReport check();

  struct Nvml;

 private:
  HealthCheck nvml_check();
  HealthCheck xid_check();

  NodeHealthOptions opt_;
  std::unique_ptr<Nvml> nvml_;
  int kmsg_fd_ = -1;
  std::string kmsg_error_;  // why /dev/kmsg cannot be read ("" = it can, or not tried yet)
  bool kmsg_tried_ = false;
  std::vector<XidEvent> fatal_xids_;  // seen since start, newest last (bounded)
};

}  // namespace gantry
