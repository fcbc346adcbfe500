// The device samples' history: written in ingest's transaction, read back as a device × time matrix whose
// cells hold each bucket's min, max and mean, with a cell no sample fell in unknown (NaN), never 0.
#include <gtest/gtest.h>

#include <cmath>

#include "storage/history_db.h"
#include "tests/scratch_dir.h"

namespace gantry {
namespace {

std::unique_ptr<HistoryDb> open_db(const std::string& what) {
  std::string error;
  auto db = HistoryDb::open((testing_support::scratch_dir(what) / "h.sqlite").string(), {}, &error);
  EXPECT_TRUE(db) << error;
  return db;
}

DeviceSampleRecord sample(const std::string& host, int device, double t, DeviceMetric m, double v) {
  return {.host = host, .device = device, .time_unix_s = t, .metric = m, .value = v};
}

TEST(DeviceSeries, IngestedSamplesComeBackPerDeviceAndBucket) {
  auto db = open_db("devices_basic");
  ASSERT_TRUE(db);
  RecordBatch b;
  // Two nodes; node-b has a GPU whose power is sampled, and node CPU on both, 1 s apart for 8 s.
  for (int i = 0; i < 8; ++i) {
    const double t = 1000 + i;
    b.device_samples.push_back(sample("node-a", kDeviceNode, t, DeviceMetric::kNodeCpu, 0.1 * i));
    if (i != 3) b.device_samples.push_back(sample("node-b", kDeviceNode, t, DeviceMetric::kNodeCpu, 0.5));
    b.device_samples.push_back(sample("node-b", 0, t, DeviceMetric::kGpuPower, 300 + i));
  }
  ASSERT_TRUE(db->ingest(b)) << db->error();
  // Again: a replayed beat replaces, never doubles.
  ASSERT_TRUE(db->ingest(b)) << db->error();

  DeviceSeriesResult r;
  ASSERT_TRUE(db->query_devices({.metric = DeviceMetric::kNodeCpu, .max_buckets = 8}, &r)) << db->error();
  ASSERT_EQ(r.rows.size(), 2u);
  EXPECT_EQ(r.rows[0].host, "node-a");
  EXPECT_EQ(r.rows[0].device, kDeviceNode);
  EXPECT_EQ(r.rows[1].host, "node-b");
  EXPECT_EQ(r.bucket_s, 1.0);
  EXPECT_EQ(r.first_time, 1000.0);
  ASSERT_EQ(r.cols, 8);
  EXPECT_EQ(r.rows_read, 15);
  for (int c = 0; c < 8; ++c) EXPECT_FLOAT_EQ(r.max[static_cast<size_t>(c)], 0.1f * c) << c;
  EXPECT_TRUE(std::isnan(r.max[8 + 3])) << "a missing sample is unknown, not 0";
  EXPECT_FLOAT_EQ(r.max[8 + 4], 0.5f);

  // Coarser: 4 columns of 2 s; min, max and mean of each.
  ASSERT_TRUE(db->query_devices({.metric = DeviceMetric::kNodeCpu, .max_buckets = 4}, &r)) << db->error();
  ASSERT_EQ(r.cols, 4);
  EXPECT_EQ(r.bucket_s, 2.0);
  EXPECT_FLOAT_EQ(r.min[1], 0.2f);
  EXPECT_FLOAT_EQ(r.max[1], 0.3f);
  EXPECT_FLOAT_EQ(r.mean[1], 0.25f);

  // The GPU metric has the GPU's row only; an unsampled metric has no rows at all.
  ASSERT_TRUE(db->query_devices({.metric = DeviceMetric::kGpuPower}, &r)) << db->error();
  ASSERT_EQ(r.rows.size(), 1u);
  EXPECT_EQ(r.rows[0].device, 0);
  ASSERT_TRUE(db->query_devices({.metric = DeviceMetric::kGpuTemperature}, &r)) << db->error();
  EXPECT_TRUE(r.rows.empty());
  EXPECT_EQ(r.cols, 0);

  // A window: [1004, 1006) at 1 s.
  ASSERT_TRUE(db->query_devices(
      {.metric = DeviceMetric::kGpuPower, .time_begin = 1004, .time_end = 1006, .max_buckets = 2}, &r))
      << db->error();
  ASSERT_EQ(r.cols, 2);
  EXPECT_FLOAT_EQ(r.max[0], 304);
  EXPECT_FLOAT_EQ(r.max[1], 305);
}

// Samples off the buckets' grid (every 1 s from 1000.5 to 1009.5). A width chosen by the span alone can
// need one column more once aligned to a multiple of itself: asked for 1, 16 s columns from 992 took 2.
// Asked for at most N, the answer has at most N, and every sample is in one.
TEST(DeviceSeries, ColumnsAlignedToTheirWidthNeverExceedTheBucketsAskedFor) {
  auto db = open_db("devices_aligned");
  ASSERT_TRUE(db);
  RecordBatch b;
  for (int i = 0; i < 10; ++i)
    b.device_samples.push_back(sample("node-a", kDeviceNode, 1000.5 + i, DeviceMetric::kNodeCpu, 1.0));
  ASSERT_TRUE(db->ingest(b)) << db->error();
  for (int32_t buckets : {1, 3, 10, 11}) {
    DeviceSeriesResult r;
    ASSERT_TRUE(db->query_devices({.metric = DeviceMetric::kNodeCpu, .max_buckets = buckets}, &r))
        << db->error();
    EXPECT_LE(r.cols, buckets);
    EXPECT_LE(r.first_time, 1000.5);
    EXPECT_GE(r.first_time + r.cols * r.bucket_s, 1009.5) << buckets;
    int known = 0;
    for (int32_t c = 0; c < r.cols; ++c) known += !std::isnan(r.max[static_cast<size_t>(c)]);
    EXPECT_GE(known, std::min(10, r.cols)) << buckets;
  }
}

TEST(DeviceSeries, RefusesBadQueriesWithTheReason) {
  auto db = open_db("devices_refuse");
  ASSERT_TRUE(db);
  DeviceSeriesResult r;
  EXPECT_FALSE(db->query_devices({.max_buckets = 0}, &r));
  EXPECT_NE(db->error().find("max_buckets 0 is not in 1..100000"), std::string::npos) << db->error();
  EXPECT_FALSE(db->query_devices({.time_begin = 10, .time_end = 5}, &r));
  EXPECT_NE(db->error().find("end must be after begin"), std::string::npos) << db->error();
  RecordBatch b;
  b.device_samples.push_back(sample("n", 0, NAN, DeviceMetric::kGpuPower, 1));
  EXPECT_FALSE(db->ingest(b));
  EXPECT_NE(db->error().find("has no finite time"), std::string::npos) << db->error();
}

}  // namespace
}  // namespace gantry
