// The agent's device sampler: the /proc parsers on real-format text, and a sampler over a /proc of the test's
// own (two rounds: a rate needs two readings) with an NVML library that cannot be opened, so no GPU record is
// made (unknown, never 0) and the status says why.
#include "engine/cluster/device_sampler.h"

#include <gtest/gtest.h>

#include <fstream>
#include <map>

#include "tests/scratch_dir.h"

namespace gantry {
namespace {

TEST(DeviceSampler, ParsesProcText) {
  const std::optional<CpuTimes> cpu =
      parse_proc_stat("cpu  100 5 50 800 40 0 5 0 0 0\ncpu0 50 2 25 400 20 0 2 0 0 0\n");
  ASSERT_TRUE(cpu);
  EXPECT_EQ(cpu->total, 1000u);
  EXPECT_EQ(cpu->busy, 160u);  // all but idle and iowait
  EXPECT_FALSE(parse_proc_stat("intr 1 2 3\n"));

  EXPECT_EQ(parse_meminfo_used("MemTotal:       16000 kB\nMemFree:  100 kB\nMemAvailable:    6000 kB\n"),
            std::optional<uint64_t>(10000u * 1024));
  EXPECT_FALSE(parse_meminfo_used("MemTotal: 16000 kB\n")) << "no MemAvailable: unknown, not 0";

  const char* net =
      "Inter-|   Receive                                                |  Transmit\n"
      " face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo "
      "colls "
      "carrier compressed\n"
      "    lo: 9999 10 0 0 0 0 0 0 9999 10 0 0 0 0 0 0\n"
      "  eth0: 1000 10 0 0 0 0 0 0 300 3 0 0 0 0 0 0\n"
      "  eth1: 24 1 0 0 0 0 0 0 76 1 0 0 0 0 0 0\n";
  const std::optional<NetBytes> b = parse_net_dev(net);
  ASSERT_TRUE(b);
  EXPECT_EQ(b->rx, 1024u);
  EXPECT_EQ(b->tx, 376u);
}

TEST(DeviceSampler, NodeReadingsFromProcAndNoGpuRecordsWithoutNvml) {
  const std::filesystem::path root = testing_support::scratch_dir("device_sampler");
  std::filesystem::create_directories(root / "net");
  const auto write = [&](const char* name, const std::string& text) { std::ofstream(root / name) << text; };
  write("meminfo", "MemTotal: 1000 kB\nMemAvailable: 250 kB\n");
  write("stat", "cpu  100 0 0 900 0 0 0 0 0 0\n");
  write("net/dev", "h\nh\n  eth0: 1000 0 0 0 0 0 0 0 2000 0 0 0 0 0 0 0\n");
  DeviceSampler s({.host = "node-7",
                   .disk_path = root.string(),
                   .nvml_library = "libgantry-no-such-nvml.so.1",
                   .proc_root = root.string()});
  std::vector<DeviceSampleRecord> out;
  s.sample(100, &out);
  // First round: memory and disk; no CPU or network rate yet, no GPU.
  std::map<DeviceMetric, double> first;
  for (const DeviceSampleRecord& r : out) {
    EXPECT_EQ(r.host, "node-7");
    EXPECT_EQ(r.device, kDeviceNode) << "a GPU record without NVML";
    first[r.metric] = r.value;
  }
  EXPECT_EQ(first.at(DeviceMetric::kNodeMemoryUsed), 750.0 * 1024);
  EXPECT_GT(first.at(DeviceMetric::kNodeDiskUsed), 0);
  EXPECT_EQ(first.count(DeviceMetric::kNodeCpu), 0u);
  EXPECT_EQ(first.count(DeviceMetric::kNodeNetReceive), 0u);
  EXPECT_NE(s.nvml_status().find("libgantry-no-such-nvml.so.1"), std::string::npos) << s.nvml_status();

  // Second round, 2 s later: 300 of 400 jiffies busy, 4,000 bytes in and 1,000 out.
  write("stat", "cpu  400 0 0 1000 0 0 0 0 0 0\n");
  write("net/dev", "h\nh\n  eth0: 5000 0 0 0 0 0 0 0 3000 0 0 0 0 0 0 0\n");
  out.clear();
  s.sample(102, &out);
  std::map<DeviceMetric, double> second;
  for (const DeviceSampleRecord& r : out) {
    EXPECT_EQ(r.time_unix_s, 102);
    second[r.metric] = r.value;
  }
  EXPECT_DOUBLE_EQ(second.at(DeviceMetric::kNodeCpu), 0.75);
  EXPECT_DOUBLE_EQ(second.at(DeviceMetric::kNodeNetReceive), 2000);
  EXPECT_DOUBLE_EQ(second.at(DeviceMetric::kNodeNetTransmit), 500);
  for (int m = 0; m < kDeviceMetricCount; ++m) {
    const auto metric = static_cast<DeviceMetric>(m);
    if (device_metric_name(metric).substr(0, 4) == "gpu_") {
      EXPECT_EQ(second.count(metric), 0u);
    }
  }
}

}  // namespace
}  // namespace gantry
