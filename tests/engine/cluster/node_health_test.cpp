// The agent's health checks (node_health.h): the disk decision and its reason, a real statvfs of a
// scratch folder, the Xid parser on lines as the driver prints them, the kernel-log check on a file of
// such lines, and NVML saying "not present" (unknown) where its library cannot be loaded.
#include "engine/cluster/node_health.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/statvfs.h>

#include <fstream>

#include "tests/scratch_dir.h"

namespace gantry {
namespace {

using ::testing::HasSubstr;
constexpr uint64_t kGiB = uint64_t{1} << 30;

TEST(NodeHealth, DiskBelowTheThresholdIsUnhealthyAndTheReasonNamesPathFreeAndThreshold) {
  const HealthCheck low = disk_verdict("/data/ckpt", kGiB / 2, 2 * kGiB);
  EXPECT_EQ(low.state, HealthState::kUnhealthy);
  EXPECT_THAT(low.detail, HasSubstr("/data/ckpt has 0.50 GiB free"));
  EXPECT_THAT(low.detail, HasSubstr("below the threshold of 2.00 GiB"));
  const HealthCheck at = disk_verdict("/data/ckpt", 2 * kGiB, 2 * kGiB);  // at the threshold: enough
  EXPECT_EQ(at.state, HealthState::kOk);
  EXPECT_EQ(disk_verdict("/d", 0, 1).state, HealthState::kUnhealthy);
}

TEST(NodeHealth, DiskCheckUsesTheFolderRealFreeSpace) {
  const auto dir = testing_support::scratch_dir("disk");
  struct statvfs st {};
  ASSERT_EQ(::statvfs(dir.c_str(), &st), 0);
  const uint64_t free_now = static_cast<uint64_t>(st.f_bavail) * st.f_frsize;
  EXPECT_EQ(disk_check(dir.string(), 1).state, HealthState::kOk);
  // A threshold far above what the disk has: the real free space decides, and it is too little.
  const HealthCheck c = disk_check(dir.string(), free_now + (uint64_t{1} << 50));
  EXPECT_EQ(c.state, HealthState::kUnhealthy);
  EXPECT_THAT(c.detail, HasSubstr(dir.string()));
  const HealthCheck missing = disk_check((dir / "no-such-folder").string(), 1);
  EXPECT_EQ(missing.state, HealthState::kUnknown);
  EXPECT_THAT(missing.detail, HasSubstr("No such file"));
}

TEST(NodeHealth, XidLinesParseAsTheDriverPrintsThem) {
  std::optional<XidEvent> x =
      parse_xid_line("NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python3, GPU has fallen off the bus.");
  ASSERT_TRUE(x.has_value());
  EXPECT_EQ(x->pci, "0000:3b:00");
  EXPECT_EQ(x->code, 79);
  EXPECT_EQ(x->text, "pid=1234, name=python3, GPU has fallen off the bus.");
  // As /dev/kmsg gives it: "prio,seq,usec,flags;" first.
  x = parse_xid_line(
      "4,1872,93847562,-;NVRM: Xid (PCI:0000:b1:00): 48, pid='<unknown>', name=<unknown>, "
      "An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer at "
      "partition 6, subpartition 0.\n");
  ASSERT_TRUE(x.has_value());
  EXPECT_EQ(x->code, 48);
  EXPECT_EQ(x->pci, "0000:b1:00");
  EXPECT_THAT(x->text, HasSubstr("double bit error"));
  x = parse_xid_line("[ 1234.5678] NVRM: Xid (PCI:0000:07:00): 13, Graphics SM Warp Exception on (GPC 0)");
  ASSERT_TRUE(x.has_value());
  EXPECT_EQ(x->code, 13);
  EXPECT_FALSE(parse_xid_line("NVRM: loading NVIDIA UNIX x86_64 Kernel Module  535.104.05").has_value());
  EXPECT_FALSE(parse_xid_line("6,100,5,-;usb 1-1: new high-speed USB device").has_value());
  EXPECT_FALSE(parse_xid_line("NVRM: Xid (PCI:0000:07:00): abc, garbage").has_value());
  EXPECT_FALSE(parse_xid_line("NVRM: Xid (PCI:0000:07:00").has_value());
  EXPECT_FALSE(parse_xid_line("NVRM: Xid (PCI:0000:07:00): 1234567890123, too long").has_value());
}

TEST(NodeHealth, FatalXidsAreTheListedOnes) {
  for (int code : {48, 63, 64, 74, 79, 92, 94, 95}) EXPECT_TRUE(xid_is_fatal(code)) << code;
  for (int code : {13, 31, 43, 45, 0, 1000}) EXPECT_FALSE(xid_is_fatal(code)) << code;
}

TEST(NodeHealth, AFatalXidInTheKernelLogMarksTheNodeUnhealthy) {
  const auto dir = testing_support::scratch_dir("kmsg");
  const auto log = dir / "kmsg";
  std::ofstream(log) << "6,1,10,-;NVRM: Xid (PCI:0000:3b:00): 13, pid=7, Graphics Exception\n";
  NodeHealth h({.kmsg_path = log.string(), .nvml_library = ""});
  HealthReport r = h.check();
  EXPECT_EQ(r.state, HealthState::kOk) << r.reason;  // Xid 13 is an application's fault, not the node's
  std::ofstream(log, std::ios::app)
      << "4,2,20,-;NVRM: Xid (PCI:0000:3b:00): 79, pid=7, GPU has fallen off the bus.\n";
  r = h.check();
  EXPECT_EQ(r.state, HealthState::kUnhealthy);
  EXPECT_THAT(r.reason, HasSubstr("xid: fatal Xid 79 on 0000:3b:00"));
  EXPECT_EQ(h.check().state, HealthState::kUnhealthy);  // stays: the GPU needs a reset
}

TEST(NodeHealth, WhatCannotBeCheckedIsUnknownNotHealthy) {
  const auto dir = testing_support::scratch_dir("unknown");
  NodeHealth h({.kmsg_path = (dir / "no-kmsg").string(), .nvml_library = "libgantry-no-such-nvml.so.1"});
  const HealthReport r = h.check();
  EXPECT_EQ(r.state, HealthState::kUnknown);
  ASSERT_EQ(r.checks.size(), 2u);
  EXPECT_EQ(r.checks[0].name, "nvml");
  EXPECT_EQ(r.checks[0].state, HealthState::kUnknown);
  EXPECT_THAT(r.checks[0].detail, HasSubstr("not present"));
  EXPECT_EQ(r.checks[1].state, HealthState::kUnknown);
  EXPECT_THAT(r.checks[1].detail, HasSubstr("not readable"));
  const nlohmann::json j = health_report_json(r);
  EXPECT_EQ(j["state"], "unknown");
  EXPECT_EQ(j["checks"][0]["state"], "unknown");
}

TEST(NodeHealth, OneUnhealthyCheckMakesTheNodeUnhealthyWithEveryReason) {
  const HealthReport r = health_combine({{.name = "disk", .state = HealthState::kUnhealthy, .detail = "full"},
                                         {.name = "nvml", .state = HealthState::kUnknown, .detail = "n/a"},
                                         {.name = "xid", .state = HealthState::kUnhealthy, .detail = "79"}});
  EXPECT_EQ(r.state, HealthState::kUnhealthy);
  EXPECT_EQ(r.reason, "disk: full; xid: 79");
  EXPECT_EQ(health_combine({{.name = "a", .state = HealthState::kOk}}).state, HealthState::kOk);
  EXPECT_EQ(health_combine({}).state, HealthState::kUnknown);
}

}  // namespace
}  // namespace gantry
