// The Devices panel's model: one device metric over time for every device that reported it (GET
// /v1/devices: per node and GPU, columns of aligned time buckets with min, max and mean), read from the
// coordinator's history of the agents' device samples (engine/cluster/device_sampler.h), and the band
// across devices the panel plots beside the heatmap. A cell no sample fell in is NaN: unknown, never 0.
//
//   Result<DeviceSeries> d = device_series_from_json(api.devices("gpu_power", 2000).value());
//   DeviceBand band = device_band(*d);   // per column with a sample: min, mean, max across devices
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "telemetry/records.h"
#include "telemetry/status.h"

namespace gantry::console {

struct DeviceSeries {
  DeviceMetric metric = DeviceMetric::kNodeCpu;
  std::string unit;  // "ratio", "bytes", "hertz", "watts", "celsius", "mask", "count", "bytes_per_second"
  double first_time = 0;  // unix seconds of column 0's start
  double bucket_s = 1;
  int32_t cols = 0;
  std::vector<std::string> rows;  // "node-0" (the node itself) or "node-0 gpu 3"
  std::vector<bool> row_is_gpu;
  std::vector<float> min, max, mean;  // [row · cols + col]; NaN = no sample
  size_t gpu_rows() const;
  float at_max(size_t row, int32_t col) const { return max[row * static_cast<size_t>(cols) + col]; }
};

// The API's answer; an error names what is malformed.
Result<DeviceSeries> device_series_from_json(const nlohmann::json& j);

// Across devices per column, for the line plot: x is the column's start in seconds relative to `now`
// (negative: the past), columns where no device has a sample are left out. `gpus_only` / `nodes_only`
// pick the rows (a node metric has only node rows, a GPU metric only GPU rows: both false takes all).
struct DeviceBand {
  std::vector<double> t, min, mean, max;
  size_t size() const { return t.size(); }
};
DeviceBand device_band(const DeviceSeries& d, double now_unix_s);

// A metric's value as the panel writes it, with its unit: "0.73" ratios as "73 %", bytes as "1.2 GB", ...
std::string device_value_text(DeviceMetric m, double v);

}  // namespace gantry::console
