// The agent's device telemetry (issue 21): per GPU from NVML (utilisation, memory used, SM clock, power,
// temperature, throttle reasons, uncorrected ECC errors; Xid errors from the kernel log, xid_counts.h), per
// node from /proc and statvfs (CPU busy, host memory used, disk used, network bytes per second), as
// DeviceSampleRecords that travel in the node's heartbeat like its rank-step records (one record path:
// telemetry/records.h, record_codec.h).
//
// NVML is opened at run time (dlopen of libnvidia-ml.so.1: no link dependency). Where it is missing, or a
// GPU does not support a reading, that reading is not made: no record, so the coordinator, /metrics and the
// console show it as unknown, never as 0. nvml_status() says why.
//
//   DeviceSampler s({.host = "node-0", .disk_path = dir});
//   std::vector<DeviceSampleRecord> out;
//   s.sample(unix_now_s(), &out);   // every second or so; rates (CPU, network) from the second call on
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "engine/cluster/xid_counts.h"
#include "telemetry/records.h"

namespace gantry {

struct DeviceSamplerOptions {
  std::string host;                                // the node's id, the samples' host
  std::string disk_path;                           // statvfs of this folder gives disk used ("" = none)
  std::string nvml_library = "libnvidia-ml.so.1";  // "" = no GPU readings
  std::string proc_root = "/proc";                 // stat, meminfo, net/dev (another root in tests)
  std::string kmsg_path = "/dev/kmsg";             // the kernel log for Xid counts ("" = none)
};

// /proc/stat's first line: the jiffies spent busy and in total, over all cores.
struct CpuTimes {
  uint64_t busy = 0, total = 0;
};
std::optional<CpuTimes> parse_proc_stat(std::string_view text);
// /proc/meminfo: MemTotal − MemAvailable in bytes; nullopt when either line is missing.
std::optional<uint64_t> parse_meminfo_used(std::string_view text);
// /proc/net/dev: bytes received and sent, summed over every interface but "lo".
struct NetBytes {
  uint64_t rx = 0, tx = 0;
};
std::optional<NetBytes> parse_net_dev(std::string_view text);

class DeviceSampler {
 public:
  explicit DeviceSampler(DeviceSamplerOptions options);
  ~DeviceSampler();
  DeviceSampler(const DeviceSampler&) = delete;
  DeviceSampler& operator=(const DeviceSampler&) = delete;

  // One round of readings stamped `now_unix_s`, appended to *out.
  void sample(double now_unix_s, std::vector<DeviceSampleRecord>* out);
  // "3 GPUs" once NVML answered, else why there are no GPU readings ("libnvidia-ml.so.1: cannot open ...").
  const std::string& nvml_status() const { return nvml_status_; }

 private:
  struct Nvml;
  void sample_gpus(double now, std::vector<DeviceSampleRecord>* out);

  DeviceSamplerOptions opt_;
  std::unique_ptr<Nvml> nvml_;
  std::unique_ptr<XidCounter> xids_;  // opened with NVML's first answer: Xids from then on
  std::string nvml_status_ = "not sampled yet";
  std::optional<CpuTimes> last_cpu_;
  std::optional<NetBytes> last_net_;
  double last_net_time_ = 0;
};

}  // namespace gantry
