#include "ui/console/device_series.h"

#include <cmath>
#include <cstdio>
#include <limits>

namespace gantry::console {

using json = nlohmann::json;

size_t DeviceSeries::gpu_rows() const {
  size_t n = 0;
  for (bool g : row_is_gpu) n += g;
  return n;
}

Result<DeviceSeries> device_series_from_json(const json& j) {
  try {
    DeviceSeries d;
    const std::string name = j.at("metric").get<std::string>();
    if (!device_metric_from_name(name, &d.metric))
      return Status::error("devices: unknown metric \"" + name + "\"");
    d.unit = j.value("unit", std::string(device_metric_unit(d.metric)));
    d.first_time = j.at("first_time").get<double>();
    d.bucket_s = j.at("bucket_s").get<double>();
    d.cols = j.at("cols").get<int32_t>();
    if (d.cols < 0 || !(d.bucket_s > 0)) return Status::error("devices: cols or bucket_s out of range");
    for (const json& r : j.at("rows")) {
      const std::string node = r.at("node").get<std::string>();
      const int device = r.at("device").get<int>();
      d.rows.push_back(device == kDeviceNode ? node : node + " gpu " + std::to_string(device));
      d.row_is_gpu.push_back(device != kDeviceNode);
    }
    const size_t n = d.rows.size() * static_cast<size_t>(d.cols);
    const auto cells = [&](const char* key, std::vector<float>* out) -> Status {
      const json& a = j.at(key);
      if (!a.is_array() || a.size() != n)
        return Status::error(std::string("devices: \"") + key + "\" has " + std::to_string(a.size()) +
                             " cells, expected rows × cols = " + std::to_string(n));
      out->reserve(n);
      for (const json& v : a)
        out->push_back(v.is_null() ? std::numeric_limits<float>::quiet_NaN() : v.get<float>());
      return Status();
    };
    for (auto [key, out] : {std::pair{"min", &d.min}, std::pair{"max", &d.max}, std::pair{"mean", &d.mean}}) {
      if (Status s = cells(key, out); !s.ok()) return s;
    }
    return d;
  } catch (const json::exception& e) {
    return Status::error(std::string("devices: malformed answer: ") + e.what());
  }
}

DeviceBand device_band(const DeviceSeries& d, double now_unix_s) {
  DeviceBand b;
  const size_t rows = d.rows.size();
  for (int32_t c = 0; c < d.cols; ++c) {
    double lo = INFINITY, hi = -INFINITY, sum = 0;
    size_t count = 0;
    for (size_t r = 0; r < rows; ++r) {
      const size_t i = r * static_cast<size_t>(d.cols) + static_cast<size_t>(c);
      if (std::isnan(d.max[i])) continue;
      lo = std::min(lo, static_cast<double>(d.min[i]));
      hi = std::max(hi, static_cast<double>(d.max[i]));
      sum += d.mean[i];
      ++count;
    }
    if (count == 0) continue;  // no device had a sample here: a gap, not 0
    b.t.push_back(d.first_time + c * d.bucket_s - now_unix_s);
    b.min.push_back(lo);
    b.max.push_back(hi);
    b.mean.push_back(sum / static_cast<double>(count));
  }
  return b;
}

std::string device_value_text(DeviceMetric m, double v) {
  if (std::isnan(v)) return "unknown";
  char buf[64];
  const std::string_view unit = device_metric_unit(m);
  const auto scaled = [&](const char* suffix) {
    const char* prefixes[] = {"", "k", "M", "G", "T", "P"};
    int p = 0;
    double x = v;
    while (std::fabs(x) >= 1000 && p < 5) {
      x /= 1000;
      ++p;
    }
    std::snprintf(buf, sizeof buf, "%.3g %s%s", x, prefixes[p], suffix);
  };
  if (unit == "ratio") {
    std::snprintf(buf, sizeof buf, "%.1f %%", v * 100);
  } else if (unit == "bytes") {
    scaled("B");
  } else if (unit == "bytes_per_second") {
    scaled("B/s");
  } else if (unit == "hertz") {
    scaled("Hz");
  } else if (unit == "watts") {
    std::snprintf(buf, sizeof buf, "%.1f W", v);
  } else if (unit == "celsius") {
    std::snprintf(buf, sizeof buf, "%.0f °C", v);
  } else if (unit == "mask") {
    std::snprintf(buf, sizeof buf, "0x%llx", static_cast<unsigned long long>(v));
  } else {
    std::snprintf(buf, sizeof buf, "%.0f", v);
  }
  return buf;
}

}  // namespace gantry::console
