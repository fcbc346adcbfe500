// Device telemetry end to end (issue 21): a real `up` cluster's agents sample their node (/proc, statvfs)
// and GPUs (NVML, where the library is present: not on this machine or CI, where GPU readings are absent,
// never 0), the samples travel in the beats, land in the coordinator's history (SQLite) and come back from
// GET /v1/devices, and the newest of each series is in /metrics.
#include <dlfcn.h>

#include "tests/app/cluster_fixture.h"

namespace gantry {
namespace {

using namespace cluster_testing;  // NOLINT: the fixture and its helpers are this suite's vocabulary

class ClusterDevices : public ClusterCli {};

bool nvml_present() {
  void* lib = ::dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (lib != nullptr) ::dlclose(lib);
  return lib != nullptr;
}

// The rows of a device metric that have at least one sample, as "node" or "node gpu N".
std::set<std::string> rows_with_values(const json& d) {
  std::set<std::string> out;
  const size_t cols = d.value("cols", size_t{0});
  const json& rows = d["rows"];
  for (size_t r = 0; r < rows.size(); ++r) {
    for (size_t c = 0; c < cols; ++c) {
      if (!d["max"][r * cols + c].is_null()) {
        const int device = rows[r]["device"].get<int>();
        out.insert(rows[r]["node"].get<std::string>() + (device < 0 ? "" : " gpu " + std::to_string(device)));
        break;
      }
    }
  }
  return out;
}

TEST_F(ClusterDevices, NodeSeriesReachTheHistoryAndMetricsAndGpuReadingsAreUnknownWithoutNvml) {
  const std::set<std::string> both = {"node-0", "node-1"};
  // Host memory from the first round, CPU and network rates from the second (a rate needs two readings).
  for (const char* metric : {"node_memory_used", "node_disk_used", "node_cpu", "node_net_receive"}) {
    json d;
    EXPECT_TRUE(eventually(
        [&] {
          d = get(std::string("/v1/devices?metric=") + metric);
          return rows_with_values(d) == both;
        },
        30s))
        << metric << ": " << d.dump();
    EXPECT_EQ(d["metric"], metric);
  }
  const json mem = get("/v1/devices?metric=node_memory_used&buckets=10");
  ASSERT_LE(mem["cols"].get<int>(), 10);
  for (const json& v : mem["max"]) {
    if (!v.is_null()) {
      EXPECT_GT(v.get<double>(), 0) << "a node's memory in use is more than nothing";
    }
  }
  const json cpu = get("/v1/devices?metric=node_cpu");
  for (const json& v : cpu["max"]) {
    if (!v.is_null()) {
      EXPECT_GE(v.get<double>(), 0);
      EXPECT_LE(v.get<double>(), 1);
    }
  }

  // /metrics: the newest reading of each node series, labelled by node and device.
  Result<HttpReply> m = api_->get("/metrics");
  ASSERT_TRUE(m.ok()) << m.error();
  for (const char* node : {"node-0", "node-1"}) {
    EXPECT_THAT(m->body, HasSubstr(std::string("gantry_device_node_memory_used_bytes{node=\"") + node +
                                   "\",device=\"node\"}"));
    EXPECT_THAT(m->body, HasSubstr(std::string("gantry_device_node_cpu_ratio{node=\"") + node));
  }

  // GPUs: only where NVML answers. Without it no GPU row and no GPU family: unknown, never a 0.
  const json power = get("/v1/devices?metric=gpu_power");
  if (!nvml_present()) {
    EXPECT_TRUE(power["rows"].empty()) << power.dump();
    EXPECT_THAT(m->body, ::testing::Not(HasSubstr("gantry_device_gpu_")));
    EXPECT_THAT(slurp((dir_ / "agent-node-0.log").string()), HasSubstr("device telemetry: GPUs: "));
  }

  // A metric that does not exist is refused, naming the known ones.
  Result<HttpReply> bad = api_->get("/v1/devices?metric=gpu_fan");
  ASSERT_TRUE(bad.ok()) << bad.error();
  EXPECT_EQ(bad->status, 400);
  EXPECT_THAT(bad->body,
              HasSubstr("metric=\\\"gpu_fan\\\": expected one of gpu_utilisation, gpu_memory_used"));
}

}  // namespace
}  // namespace gantry
