// The Devices panel's model: the API's answer read strictly, the band across devices with gaps where no
// device had a sample (never 0), and values written with their units.
#include "ui/console/device_series.h"

#include <gtest/gtest.h>

#include <cmath>

namespace gantry::console {
namespace {

using json = nlohmann::json;

json answer() {
  // Two devices, three columns; the middle column has no sample at all, the last only on the GPU.
  return {{"metric", "gpu_power"},
          {"unit", "watts"},
          {"first_time", 1000.0},
          {"bucket_s", 2.0},
          {"cols", 3},
          {"rows", {{{"node", "n0"}, {"device", -1}}, {{"node", "n0"}, {"device", 1}}}},
          {"min", {1.0, nullptr, nullptr, 3.0, nullptr, 5.0}},
          {"max", {2.0, nullptr, nullptr, 4.0, nullptr, 6.0}},
          {"mean", {1.5, nullptr, nullptr, 3.5, nullptr, 5.5}}};
}

TEST(DeviceSeries, ReadsTheAnswerAndBandsAcrossDevicesWithGaps) {
  Result<DeviceSeries> d = device_series_from_json(answer());
  ASSERT_TRUE(d.ok()) << d.error();
  EXPECT_EQ(d->metric, DeviceMetric::kGpuPower);
  ASSERT_EQ(d->rows.size(), 2u);
  EXPECT_EQ(d->rows[0], "n0");
  EXPECT_EQ(d->rows[1], "n0 gpu 1");
  EXPECT_EQ(d->gpu_rows(), 1u);
  EXPECT_TRUE(std::isnan(d->at_max(0, 1)));
  const DeviceBand b = device_band(d.value(), 1010);
  ASSERT_EQ(b.size(), 2u) << "the empty column is a gap, not a 0";
  EXPECT_DOUBLE_EQ(b.t[0], -10);
  EXPECT_DOUBLE_EQ(b.t[1], -6);
  EXPECT_DOUBLE_EQ(b.min[0], 1);
  EXPECT_DOUBLE_EQ(b.max[0], 4);
  EXPECT_DOUBLE_EQ(b.mean[0], 2.5);
  EXPECT_DOUBLE_EQ(b.max[1], 6);
}

TEST(DeviceSeries, RefusesAMalformedAnswerNamingWhat) {
  json j = answer();
  j["max"].erase(0);
  Result<DeviceSeries> d = device_series_from_json(j);
  ASSERT_FALSE(d.ok());
  EXPECT_NE(d.error().find("\"max\" has 5 cells, expected rows × cols = 6"), std::string::npos) << d.error();
  j = answer();
  j["metric"] = "gpu_fan";
  d = device_series_from_json(j);
  ASSERT_FALSE(d.ok());
  EXPECT_NE(d.error().find("unknown metric \"gpu_fan\""), std::string::npos) << d.error();
}

TEST(DeviceSeries, ValuesCarryTheirUnitsAndUnknownIsSaid) {
  EXPECT_EQ(device_value_text(DeviceMetric::kNodeCpu, 0.734), "73.4 %");
  EXPECT_EQ(device_value_text(DeviceMetric::kGpuMemoryUsed, 1.5e9), "1.5 GB");
  EXPECT_EQ(device_value_text(DeviceMetric::kGpuPower, 651.25), "651.2 W");
  EXPECT_EQ(device_value_text(DeviceMetric::kGpuPower, NAN), "unknown");
}

}  // namespace
}  // namespace gantry::console
