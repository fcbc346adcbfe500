// The DataSource's devices thread: the Devices panel's metric for every device over time (GET /v1/devices,
// the coordinator's history of the agents' device samples), apart from the run's threads so neither waits
// for the other. Read when the metric changes and then every second: the series grow as the agents sample.
#include <utility>

#include "ui/console/data_source.h"

namespace gantry::console {
namespace {

constexpr int kDeviceBuckets = 2000;  // columns over the whole history: finer than a panel's pixels
constexpr std::chrono::milliseconds kDevicePoll{1000};

}  // namespace

void DataSource::set_device_metric(DeviceMetric m) {
  std::lock_guard<std::mutex> lock(mu_);
  if (m == device_metric_) return;
  device_metric_ = m;
  device_wanted_ = true;
  cv_.notify_all();
}

void DataSource::devices_main() {
  std::unique_ptr<ApiClient> api;
  std::unique_lock<std::mutex> lock(mu_);
  bool first = true;
  for (;;) {
    if (!first) cv_.wait_for(lock, kDevicePoll, [&] { return stop_ || device_wanted_; });
    if (stop_) return;
    if (!have_endpoint_) {
      cv_.wait_for(lock, opt_.poll_interval, [&] { return stop_ || have_endpoint_; });
      continue;
    }
    first = false;
    device_wanted_ = false;
    const DeviceMetric metric = device_metric_;
    const Endpoint endpoint = endpoint_;
    lock.unlock();
    if (!api)
      api = std::make_unique<ApiClient>(HttpClientOptions{.url = endpoint.url, .token = endpoint.token});
    Result<nlohmann::json> a = api->devices(std::string(device_metric_name(metric)), kDeviceBuckets);
    Result<DeviceSeries> d = a.ok() ? device_series_from_json(a.value()) : Result<DeviceSeries>(a.status());
    if (!d.ok()) api.reset();  // a fresh connection next time
    lock.lock();
    if (device_metric_ != metric) continue;  // switched meanwhile: read the new one
    if (d.ok()) {
      devices_ = std::make_shared<const DeviceSeries>(std::move(d.value()));
      devices_error_.clear();
    } else {
      devices_error_ = d.error();
    }
    publish_locked();
  }
}

}  // namespace gantry::console
