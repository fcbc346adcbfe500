// Device telemetry at the coordinator (coordinator_impl.h): the agents' device samples (per GPU and per
// node, engine/cluster/device_sampler.h) arrive in their beats with the other records, go to the history
// with them (storage: device_samples), keep each series' newest reading for /metrics, and are read back as
// a device × time matrix for the console's Devices panel (GET /v1/devices).
#include <cmath>
#include <cstdlib>

#include "engine/cluster/coordinator_impl.h"
#include "telemetry/prometheus.h"

namespace gantry {
namespace {

using json = nlohmann::json;

// A float cell as the API writes it: null for no sample (unknown, never 0).
json device_cell(float v) {
  if (std::isnan(v)) return nullptr;
  return static_cast<double>(v);
}

Result<double> parse_time_query(const HttpRequest& req, const char* key) {
  const std::optional<std::string> v = req.query_value(key);
  if (!v) return 0.0;
  char* end = nullptr;
  const double x = std::strtod(v->c_str(), &end);
  if (v->empty() || *end != '\0' || !std::isfinite(x) || x < 0)
    return Status::error(std::string(key) + "=\"" + v->substr(0, 64) +
                         "\": expected unix seconds (a number, 0 or more; 0 = the series' own end)");
  return x;
}

}  // namespace

void Coordinator::Impl::devices_take(std::vector<DeviceSampleRecord>& samples, RecordBatch& keep) {
  for (DeviceSampleRecord& s : samples) {
    DeviceSampleRecord& newest = device_latest[{s.host, s.device, s.metric}];
    if (s.time_unix_s >= newest.time_unix_s) newest = s;
    keep.device_samples.push_back(std::move(s));
  }
}

void Coordinator::Impl::devices_metrics(PrometheusWriter& w) const {
  // One family per metric, contiguous (the map is ordered by host first: gather per metric).
  for (int m = 0; m < kDeviceMetricCount; ++m) {
    const auto metric = static_cast<DeviceMetric>(m);
    const std::string_view unit = device_metric_unit(metric);
    const bool counter = unit == "count";
    const std::string name = "gantry_device_" + std::string(device_metric_name(metric)) +
                             (counter          ? "_total"
                              : unit == "mask" ? ""
                                               : "_" + std::string(unit));
    bool declared = false;
    for (const auto& [key, s] : device_latest) {
      if (std::get<2>(key) != metric) continue;
      if (!declared) {
        w.family(name, counter ? MetricType::counter : MetricType::gauge,
                 "The newest device sample from the node's agent (docs/TELEMETRY.md, device samples); "
                 "device=\"node\" is the node itself.");
        declared = true;
      }
      const std::string device = s.device == kDeviceNode ? "node" : std::to_string(s.device);
      w.sample({{"node", s.host}, {"device", device}}, s.value);
    }
  }
}

HttpResponse Coordinator::Impl::devices(const HttpRequest& req) {
  DeviceMetric metric = DeviceMetric::kNodeCpu;
  if (const std::optional<std::string> v = req.query_value("metric");
      v && !device_metric_from_name(*v, &metric)) {
    std::string allowed;
    for (int m = 0; m < kDeviceMetricCount; ++m)
      allowed += std::string(allowed.empty() ? "" : ", ") +
                 std::string(device_metric_name(static_cast<DeviceMetric>(m)));
    return HttpResponse::error(400, "metric=\"" + v->substr(0, 64) + "\": expected one of " + allowed);
  }
  Result<double> begin = parse_time_query(req, "time_begin");
  Result<double> end = parse_time_query(req, "time_end");
  if (!begin.ok()) return HttpResponse::error(400, begin.error());
  if (!end.ok()) return HttpResponse::error(400, end.error());
  const std::optional<std::string> b = req.query_value("buckets");
  char* stop = nullptr;
  const long buckets = b ? std::strtol(b->c_str(), &stop, 10) : 1000;
  if (b && (b->empty() || *stop != '\0' || buckets < 1 || buckets > 100000))
    return HttpResponse::error(400,
                               "buckets=\"" + b->substr(0, 64) + "\": expected an integer in [1, 100000]");
  DeviceSeriesResult r;
  {
    std::unique_lock<std::mutex> db_lock = read_lock();
    if (!db->query_devices({.metric = metric,
                            .time_begin = begin.value(),
                            .time_end = end.value(),
                            .max_buckets = static_cast<int32_t>(buckets)},
                           &r)) {
      return HttpResponse::error(400, "cannot read the device samples: " + db->error());
    }
  }
  json rows = json::array(), min = json::array(), max = json::array(), mean = json::array();
  for (const DeviceRow& d : r.rows) rows.push_back({{"node", d.host}, {"device", d.device}});
  for (size_t i = 0; i < r.max.size(); ++i) {
    min.push_back(device_cell(r.min[i]));
    max.push_back(device_cell(r.max[i]));
    mean.push_back(device_cell(r.mean[i]));
  }
  return HttpResponse::ok({{"metric", std::string(device_metric_name(metric))},
                           {"unit", std::string(device_metric_unit(metric))},
                           {"first_time", r.first_time},
                           {"bucket_s", r.bucket_s},
                           {"cols", r.cols},
                           {"rows", std::move(rows)},
                           {"min", std::move(min)},
                           {"max", std::move(max)},
                           {"mean", std::move(mean)}});
}

}  // namespace gantry
