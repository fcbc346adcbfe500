// The agent's device sampler: the /proc parsers and the kernel log's Xid counts (xid_counts.h) on real-format
// text, and a sampler over a /proc of the test's own (two rounds: a rate needs two readings) with an NVML
// library that cannot be opened, so no GPU record is made (unknown, never 0) and the status says why.
#include "engine/cluster/device_sampler.h"

#include <gtest/gtest.h>

#include <fstream>
#include <map>

#include "engine/cluster/xid_counts.h"
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

// The kernel log's Xid lines, from a fixture of /dev/kmsg records as the driver prints them (continuation
// lines, other drivers' messages, an upper-case bus): every Xid counted for its GPU's PCI address, only
// those logged after the counter opened the log.
TEST(XidCounter, CountsEachGpusXidsFromTheKernelLog) {
  const std::filesystem::path dir = testing_support::scratch_dir("xid");
  const std::filesystem::path log = dir / "kmsg";
  std::ofstream(log) << "4,1,10,-;NVRM: Xid (PCI:0000:3b:00): 79, pid=1, before the agent started\n";
  XidCounter x(log.string());
  ASSERT_TRUE(x.poll()) << x.error();
  const PciAddress gpu0 = *parse_pci_address("0000:3b:00");
  const PciAddress gpu1 = *parse_pci_address("00000000:86:00.0");  // NVML's busId spelling
  const PciAddress gpu2 = *parse_pci_address("0000:b1:00");
  const PciAddress quiet = *parse_pci_address("0000:af:00");
  EXPECT_EQ(x.count(gpu0), std::optional<uint64_t>(0)) << "an Xid from before the log was opened";
  const std::string fixture_path =
      std::string(GANTRY_SOURCE_DIR "/tests/engine/cluster/fixtures/kmsg_xid.txt");
  std::ifstream fixture(fixture_path);
  ASSERT_TRUE(fixture) << fixture_path;
  std::ofstream(log, std::ios::app) << fixture.rdbuf();
  ASSERT_TRUE(x.poll()) << x.error();
  EXPECT_EQ(x.count(gpu0), std::optional<uint64_t>(2));  // 79, then 48 (its bus written 3B)
  EXPECT_EQ(x.count(gpu1), std::optional<uint64_t>(3));  // 13, 13, 31
  EXPECT_EQ(x.count(gpu2), std::optional<uint64_t>(1));  // 94
  EXPECT_EQ(x.count(quiet), std::optional<uint64_t>(0)) << "read, and no Xid for it: a real 0";
  // A line still being written is counted once it ends.
  std::ofstream(log, std::ios::app) << "4,9,99,-;NVRM: Xid (PCI:0000:b1:00): 9";
  ASSERT_TRUE(x.poll());
  EXPECT_EQ(x.count(gpu2), std::optional<uint64_t>(1));
  std::ofstream(log, std::ios::app) << "5, pid=3, half a line\n";
  ASSERT_TRUE(x.poll());
  EXPECT_EQ(x.count(gpu2), std::optional<uint64_t>(2));
}

TEST(XidCounter, AnUnreadableLogIsUnknownNotZero) {
  XidCounter x((testing_support::scratch_dir("xid_none") / "no-such-kmsg").string());
  EXPECT_FALSE(x.poll());
  EXPECT_FALSE(x.count(*parse_pci_address("0000:3b:00")).has_value());
  EXPECT_NE(x.error().find("no-such-kmsg is not readable here"), std::string::npos) << x.error();
  EXPECT_FALSE(parse_pci_address("PCI:0000:3b:00").has_value());
  EXPECT_FALSE(parse_pci_address("0000:3b").has_value());
}

}  // namespace
}  // namespace gantry
