#include "telemetry/records.h"

#include <cmath>
#include <cstdio>

#include "telemetry/record_json.h"  // a checkpoint event's payload is the record's JSON

namespace gantry {
namespace {

constexpr std::string_view kPhaseNames[kPhaseCount] = {"data_wait", "forward",      "backward",
                                                       "optimizer", "comm_exposed", "checkpoint_stall"};
constexpr std::string_view kCheckpointStateNames[kCheckpointStateCount] = {"written", "committed", "failed"};

// Bitwise-minded equality: NaN == NaN, so a record holding a diverged loss compares equal to its copy.
bool same(double a, double b) {
  return a == b || (std::isnan(a) && std::isnan(b));
}
bool same(const std::optional<double>& a, const std::optional<double>& b) {
  if (a.has_value() != b.has_value()) return false;
  return !a || same(*a, *b);
}

}  // namespace

std::string_view phase_name(Phase p) {
  const auto i = static_cast<size_t>(p);
  return i < static_cast<size_t>(kPhaseCount) ? kPhaseNames[i] : std::string_view("unknown");
}

bool phase_from_name(std::string_view name, Phase* out) {
  for (int i = 0; i < kPhaseCount; ++i) {
    if (kPhaseNames[i] == name) {
      *out = static_cast<Phase>(i);
      return true;
    }
  }
  return false;
}

std::string_view checkpoint_state_name(CheckpointState s) {
  const auto i = static_cast<size_t>(s);
  return i < static_cast<size_t>(kCheckpointStateCount) ? kCheckpointStateNames[i]
                                                        : std::string_view("unknown");
}

bool checkpoint_state_from_name(std::string_view name, CheckpointState* out) {
  for (int i = 0; i < kCheckpointStateCount; ++i) {
    if (kCheckpointStateNames[i] == name) {
      *out = static_cast<CheckpointState>(i);
      return true;
    }
  }
  return false;
}

namespace {
struct DeviceMetricInfo {
  std::string_view name, unit;
};
// In DeviceMetric's order.
constexpr DeviceMetricInfo kDeviceMetrics[kDeviceMetricCount] = {
    {"gpu_utilisation", "ratio"},
    {"gpu_memory_used", "bytes"},
    {"gpu_sm_clock", "hertz"},
    {"gpu_power", "watts"},
    {"gpu_temperature", "celsius"},
    {"gpu_throttle_reasons", "mask"},
    {"gpu_ecc_errors", "count"},
    {"gpu_xid_errors", "count"},
    {"node_cpu", "ratio"},
    {"node_memory_used", "bytes"},
    {"node_disk_used", "bytes"},
    {"node_net_receive", "bytes_per_second"},
    {"node_net_transmit", "bytes_per_second"},
};
}  // namespace

std::string_view device_metric_name(DeviceMetric m) {
  const auto i = static_cast<size_t>(m);
  return i < static_cast<size_t>(kDeviceMetricCount) ? kDeviceMetrics[i].name : std::string_view("unknown");
}

std::string_view device_metric_unit(DeviceMetric m) {
  const auto i = static_cast<size_t>(m);
  return i < static_cast<size_t>(kDeviceMetricCount) ? kDeviceMetrics[i].unit : std::string_view("");
}

bool device_metric_from_name(std::string_view name, DeviceMetric* out) {
  for (int i = 0; i < kDeviceMetricCount; ++i) {
    if (kDeviceMetrics[i].name == name) {
      *out = static_cast<DeviceMetric>(i);
      return true;
    }
  }
  return false;
}

EventRecord checkpoint_event(const CheckpointRecord& c) {
  EventRecord e;
  e.run_id = c.run_id;
  e.time_unix_s = c.time_unix_s;
  e.step = c.step;
  e.rank = c.rank;
  e.node = c.host;
  e.payload = record_to_json(c);
  char waited[96] = "";
  if (c.waited_s > 0)
    std::snprintf(waited, sizeof waited, ", of which %.2f s waiting for the checkpoint before", c.waited_s);
  char figures[224];
  std::snprintf(figures, sizeof figures, " (%.1f MB, %s write %.2f s, training stalled %.2f s%s)",
                static_cast<double>(c.bytes) / 1e6, c.async ? "async" : "sync", c.write_s, c.stall_s, waited);
  const std::string who = c.rank == kCheckpointAllRanks ? "" : " (rank " + std::to_string(c.rank) + ")";
  switch (c.state) {
    case CheckpointState::kCommitted:
      e.kind = "checkpoint";
      e.message = "checkpoint committed: " + c.dir + figures;
      break;
    case CheckpointState::kWritten:
      e.kind = "checkpoint_written";
      e.message = "checkpoint shard written" + who + ": " + c.dir + figures;
      break;
    case CheckpointState::kFailed:
    default:
      e.kind = "checkpoint_failed";
      e.message = "checkpoint of step " + std::to_string(c.step) + " failed" + who + ": " + c.message;
      break;
  }
  return e;
}

namespace {
// One switch for both constnesses.
template <class Self>
auto& phase_field(Self& s, Phase p) {
  switch (p) {
    case Phase::data_wait:
      return s.data_wait;
    case Phase::forward:
      return s.forward;
    case Phase::backward:
      return s.backward;
    case Phase::optimizer:
      return s.optimizer;
    case Phase::comm_exposed:
      return s.comm_exposed;
    case Phase::checkpoint_stall:
      return s.checkpoint_stall;
  }
  return s.data_wait;  // unreachable for valid enumerators; keeps -Wreturn-type quiet
}
}  // namespace

double PhaseSeconds::get(Phase p) const {
  return phase_field(*this, p);
}
double& PhaseSeconds::at(Phase p) {
  return phase_field(*this, p);
}

double PhaseSeconds::sum() const {
  return data_wait + forward + backward + optimizer + comm_exposed + checkpoint_stall;
}

bool operator==(const PhaseSeconds& a, const PhaseSeconds& b) {
  for (int i = 0; i < kPhaseCount; ++i) {
    if (!same(a.get(static_cast<Phase>(i)), b.get(static_cast<Phase>(i)))) return false;
  }
  return true;
}

bool operator==(const RankStepRecord& a, const RankStepRecord& b) {
  return a.run_id == b.run_id && a.step == b.step && a.rank == b.rank && a.host == b.host &&
         a.device == b.device && a.phases == b.phases && same(a.total_s, b.total_s) && a.tokens == b.tokens &&
         a.mem_allocated_bytes == b.mem_allocated_bytes && a.mem_peak_bytes == b.mem_peak_bytes &&
         same(a.temperature_celsius, b.temperature_celsius) && same(a.sm_clock_hertz, b.sm_clock_hertz) &&
         same(a.power_watts, b.power_watts) && same(a.mfu, b.mfu) && same(a.hfu, b.hfu);
}

bool operator==(const StepRecord& a, const StepRecord& b) {
  return a.run_id == b.run_id && a.step == b.step && same(a.time_unix_s, b.time_unix_s) &&
         same(a.loss, b.loss) && same(a.grad_norm, b.grad_norm) && same(a.lr, b.lr) &&
         same(a.tokens_per_s, b.tokens_per_s) && same(a.step_s, b.step_s) && same(a.mfu, b.mfu) &&
         same(a.hfu, b.hfu) && same(a.val_loss, b.val_loss);
}

bool operator==(const EventRecord& a, const EventRecord& b) {
  return a.run_id == b.run_id && same(a.time_unix_s, b.time_unix_s) && a.step == b.step && a.kind == b.kind &&
         a.rank == b.rank && a.node == b.node && a.message == b.message && a.payload == b.payload;
}

bool operator==(const CheckpointRecord& a, const CheckpointRecord& b) {
  return a.run_id == b.run_id && a.step == b.step && same(a.time_unix_s, b.time_unix_s) && a.rank == b.rank &&
         a.host == b.host && a.dir == b.dir && a.state == b.state && a.bytes == b.bytes &&
         a.shards == b.shards && same(a.write_s, b.write_s) && same(a.stall_s, b.stall_s) &&
         same(a.waited_s, b.waited_s) && a.async == b.async && a.manifest_xxh64 == b.manifest_xxh64 &&
         a.message == b.message;
}

bool operator==(const DeviceSampleRecord& a, const DeviceSampleRecord& b) {
  return a.host == b.host && a.device == b.device && same(a.time_unix_s, b.time_unix_s) &&
         a.metric == b.metric && same(a.value, b.value);
}

bool operator==(const RecordBatch& a, const RecordBatch& b) {
  return a.rank_steps == b.rank_steps && a.steps == b.steps && a.events == b.events &&
         a.checkpoints == b.checkpoints && a.device_samples == b.device_samples;
}

}  // namespace gantry
