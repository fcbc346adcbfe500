// The measurements every part of Gantry speaks about: one record per rank per step, one per step for the
// whole job, and events. Plain structs with no behaviour, so the worker can fill them on the hot path and
// the codecs (record_codec.h binary, record_json.h JSON), the straggler scorer, the Prometheus writer
// and storage/ all read the same thing.
//
//   RankStepRecord r{.run_id = run, .step = s, .rank = rank, .host = host, .device = local_device};
//   r.phases.forward = fwd_s;             // seconds; each phase is time this rank spent, not overlapped
//   r.phases.comm_exposed = wait_s;       // communication the compute did not hide
//   r.total_s = step_s;                   // the whole step; phases need not add up to it exactly
//   batch.rank_steps.push_back(std::move(r));
//
// Units are base units throughout (seconds, bytes, hertz, watts, degrees Celsius, ratios 0..1), the same
// as the Prometheus exposition. This header stays C++17 so that CUDA translation units may include it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace gantry {

// Where a rank's step time went. The order is the order of a step, and the wire and storage formats
// depend on it: append new phases at the end only.
enum class Phase : uint8_t {
  data_wait = 0,  // waiting for the next batch
  forward = 1,
  backward = 2,
  optimizer = 3,         // clipping, the update, ZeRO gathers of the update
  comm_exposed = 4,      // communication not hidden behind compute (waiting in a collective counts)
  checkpoint_stall = 5,  // the step waited for a checkpoint write
};
inline constexpr int kPhaseCount = 6;

// "data_wait", "forward", ...: the names used in JSON keys, Prometheus labels and events.
std::string_view phase_name(Phase p);
// Inverse of phase_name; false for an unknown name.
bool phase_from_name(std::string_view name, Phase* out);

struct PhaseSeconds {
  double data_wait = 0;
  double forward = 0;
  double backward = 0;
  double optimizer = 0;
  double comm_exposed = 0;
  double checkpoint_stall = 0;

  // Indexed access for code that loops over phases (scoring, codecs).
  double get(Phase p) const;
  double& at(Phase p);
  double sum() const;
};

bool operator==(const PhaseSeconds& a, const PhaseSeconds& b);

// One rank, one optimizer step.
struct RankStepRecord {
  int64_t run_id = 0;
  int64_t step = 0;  // optimizer steps done, counting this one
  int32_t rank = 0;  // global rank
  std::string host;
  int32_t device = -1;  // local device index; -1 = CPU
  PhaseSeconds phases;
  double total_s = 0;  // wall time of the step on this rank; what the phases do not cover is unattributed
  int64_t tokens = 0;  // tokens this rank processed in the step
  uint64_t mem_allocated_bytes = 0;  // device (or host, on CPU) memory held at the end of the step
  uint64_t mem_peak_bytes = 0;       // high-water mark during the step
  // From NVML where present; absent on CPU and where NVML is not available.
  std::optional<double> temperature_celsius;
  std::optional<double> sm_clock_hertz;
  std::optional<double> power_watts;
  // Model and hardware FLOP utilisation of this rank's step, 0..1 (telemetry/flops.h); absent when the
  // device's peak is not known (a CPU without a configured peak), shown as "n/a".
  std::optional<double> mfu;
  std::optional<double> hfu;
};

// The job as a whole, one optimizer step. Written by rank 0 (or the coordinator).
struct StepRecord {
  int64_t run_id = 0;
  int64_t step = 0;
  double time_unix_s = 0;  // when the step ended
  double loss = 0;         // mean training loss over the global batch; NaN when it diverged
  double grad_norm = 0;    // global L2 norm before clipping
  double lr = 0;
  double tokens_per_s = 0;  // global
  double step_s = 0;        // wall time of the step
  // Model and hardware (recomputation counted) FLOP utilisation of the job, 0..1: global tokens/s over
  // world × peak (flops.h; the formula and peak live with the run). Absent when the peak is not known.
  std::optional<double> mfu;
  std::optional<double> hfu;
  std::optional<double> val_loss;
};

// Something that happened: a straggler flag, a control action, a failure.
struct EventRecord {
  int64_t run_id = 0;
  double time_unix_s = 0;
  int64_t step = -1;    // the step it belongs to; -1 = none
  std::string kind;     // short lower_snake word: "straggler", "action_pause", "rank_failed", ...
  int32_t rank = -1;    // the rank it concerns; -1 = none
  std::string node;     // the host it concerns; "" = none
  std::string message;  // one human line
  std::string payload;  // free text, by convention a JSON document; opaque to the codecs
};

// Where a checkpoint write is. The wire and storage formats depend on the values: append only.
enum class CheckpointState : uint8_t {
  kWritten = 0,    // a rank's shard is on disk; the checkpoint is not committed yet (rank 0 commits it)
  kCommitted = 1,  // the manifest was renamed into place: the checkpoint is whole and can be resumed from
  kFailed = 2,     // the write failed; the message says why, and the step's earlier checkpoint (if any) stays
};
inline constexpr int kCheckpointStateCount = 3;
// "written", "committed", "failed": the JSON values and the catalog's state column.
std::string_view checkpoint_state_name(CheckpointState s);
bool checkpoint_state_from_name(std::string_view name, CheckpointState* out);

// A checkpoint record's rank when it speaks for the whole checkpoint (rank 0's commit, every shard).
inline constexpr int32_t kCheckpointAllRanks = -1;

// One checkpoint write, as the worker saw it: rank 0 reports the gang's commit (rank kCheckpointAllRanks),
// any rank reports its own failure. The coordinator catalogues it (storage's checkpoints table) and shows
// it in the run's events as one human line (checkpoint_event below).
struct CheckpointRecord {
  int64_t run_id = 0;
  int64_t step = 0;                    // the optimizer steps the checkpoint holds
  double time_unix_s = 0;              // when the write ended (committed or failed)
  int32_t rank = kCheckpointAllRanks;  // the rank it concerns, or kCheckpointAllRanks
  std::string host;                    // the node that reported it
  std::string dir;                     // the checkpoint's directory (its final name, step_NNNNNNNN)
  CheckpointState state = CheckpointState::kCommitted;
  uint64_t bytes = 0;  // every shard together (0 when failed before any was written)
  int32_t shards = 0;  // shard files the manifest lists (the world that wrote it); 0 = not known
  double write_s = 0;  // from the start of the write to its commit (or failure)
  // The time training was stopped for it. Equal to write_s while writes are synchronous; an asynchronous
  // write stalls only for the copy into host memory.
  double stall_s = 0;
  double waited_s = 0;  // of stall_s, the wait for the checkpoint before it, still in flight (0: none was)
  bool async = false;   // written by a writer thread while training went on (train.checkpoint_async)
  std::string manifest_xxh64;  // xxHash64 of manifest.json's bytes, 16 hex digits; "" when not committed
  std::string message;         // failed: why; otherwise ""
};

// What a device sample measures. A GPU's readings come from NVML, a node's (device kDeviceNode) from /proc
// and statvfs. The wire and storage formats depend on the values: append only.
enum class DeviceMetric : uint8_t {
  kGpuUtilisation = 0,      // ratio 0..1 of the sample period a kernel ran (NVML utilization.gpu)
  kGpuMemoryUsed = 1,       // bytes
  kGpuSmClock = 2,          // hertz
  kGpuPower = 3,            // watts
  kGpuTemperature = 4,      // degrees Celsius
  kGpuThrottleReasons = 5,  // NVML's clocks-event bit mask (0: not throttled)
  kGpuEccErrors = 6,        // volatile uncorrected ECC errors, a count since the driver loaded
  kGpuXidErrors = 7,        // Xids the kernel logged for the GPU since the agent started (xid_counts.h)
  kNodeCpu = 8,             // ratio 0..1 of all cores busy over the sample period (/proc/stat)
  kNodeMemoryUsed = 9,      // bytes of host memory in use (MemTotal - MemAvailable)
  kNodeDiskUsed = 10,       // bytes used on the agent's folder's file system (statvfs)
  kNodeNetReceive = 11,     // bytes received per second on every interface but loopback (/proc/net/dev)
  kNodeNetTransmit = 12,    // bytes sent per second, the same way
};
inline constexpr int kDeviceMetricCount = 13;
// "gpu_utilisation", "gpu_memory_used", ...: JSON values, API parameters, the console's selector.
std::string_view device_metric_name(DeviceMetric m);
bool device_metric_from_name(std::string_view name, DeviceMetric* out);
// The Prometheus base unit suffix of the metric's family ("ratio", "bytes", "hertz", ...).
std::string_view device_metric_unit(DeviceMetric m);

// The device field of a sample about the node as a whole (CPU, host memory, disk, network).
inline constexpr int32_t kDeviceNode = -1;

// One reading of one device of one node at one time. A reading that cannot be made (no NVML, no GPU, a
// counter not supported) is no record at all: absent means unknown, never 0.
struct DeviceSampleRecord {
  std::string host;
  int32_t device = kDeviceNode;  // local GPU index, or kDeviceNode
  double time_unix_s = 0;
  DeviceMetric metric = DeviceMetric::kNodeCpu;
  double value = 0;
};

// What travels together: a worker's step, an agent's per-node batch, an API upload.
struct RecordBatch {
  std::vector<RankStepRecord> rank_steps;
  std::vector<StepRecord> steps;
  std::vector<EventRecord> events;
  std::vector<CheckpointRecord> checkpoints;
  std::vector<DeviceSampleRecord> device_samples;

  bool empty() const {
    return rank_steps.empty() && steps.empty() && events.empty() && checkpoints.empty() &&
           device_samples.empty();
  }
  size_t size() const {
    return rank_steps.size() + steps.size() + events.size() + checkpoints.size() + device_samples.size();
  }
  void clear() {
    rank_steps.clear();
    steps.clear();
    events.clear();
    checkpoints.clear();
    device_samples.clear();
  }
};

// The run's event for a checkpoint record, for the operator's Events panel and event stream: kind
// "checkpoint" (committed), "checkpoint_written" or "checkpoint_failed", one human line naming the
// directory, size and times (or the failure), and the record's JSON as payload. Made here only, from
// the typed record, wherever the record is stored (storage's ingest).
EventRecord checkpoint_event(const CheckpointRecord& c);

// Field-by-field equality, NaN equal to NaN (a diverged loss must survive a round trip).
bool operator==(const RankStepRecord& a, const RankStepRecord& b);
bool operator==(const StepRecord& a, const StepRecord& b);
bool operator==(const EventRecord& a, const EventRecord& b);
bool operator==(const CheckpointRecord& a, const CheckpointRecord& b);
bool operator==(const DeviceSampleRecord& a, const DeviceSampleRecord& b);
bool operator==(const RecordBatch& a, const RecordBatch& b);

}  // namespace gantry
