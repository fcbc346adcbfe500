#include "telemetry/record_codec.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>

#include "telemetry/record_json.h"

namespace gantry {
namespace {

RankStepRecord sample_rank_step(int rank, int64_t step) {
  RankStepRecord r;
  r.run_id = 7;
  r.step = step;
  r.rank = rank;
  r.host = "node-" + std::to_string(rank / 8);
  r.device = rank % 8;
  r.phases.data_wait = 0.001 * rank;
  r.phases.forward = 0.1 + 1e-9 * step;
  r.phases.backward = 0.2;
  r.phases.optimizer = 0.01;
  r.phases.comm_exposed = 0.03;
  r.phases.checkpoint_stall = 0;
  r.total_s = 0.35;
  r.tokens = 8192;
  r.mem_allocated_bytes = 40'000'000'000ULL;
  r.mem_peak_bytes = 79'999'999'999ULL;
  if (rank % 2) {
    r.temperature_celsius = 71.5;
    r.sm_clock_hertz = 1.98e9;
    r.power_watts = 651.25;
  }
  if (rank < 4) {  // a peak known for some ranks only: both present and absent utilisation travel
    r.mfu = 0.4 + 0.01 * rank;
    r.hfu = 0.5 + 0.01 * rank;
  }
  return r;
}

// Checkpoint records in every state: rank 0's commit for the whole gang, a rank's failure, a rank's
// written shard, and extremes.
std::vector<CheckpointRecord> sample_checkpoints() {
  std::vector<CheckpointRecord> out;
  CheckpointRecord c;
  c.run_id = 7;
  c.step = 1000;
  c.time_unix_s = 1795651201.25;
  c.rank = kCheckpointAllRanks;
  c.host = "node-0";
  c.dir = "/runs/7/checkpoints/step_00001000";
  c.state = CheckpointState::kCommitted;
  c.bytes = 1'234'567'890'123ULL;
  c.shards = 8;
  c.write_s = 4.5;
  c.stall_s = 0.75;  // an asynchronous write: the stall is less than the write
  c.waited_s = 0.5;  // most of it waiting for the checkpoint before
  c.async = true;
  c.manifest_xxh64 = "0123456789abcdef";
  out.push_back(c);
  CheckpointRecord failed = c;
  failed.rank = 5;
  failed.host = "node-0";
  failed.state = CheckpointState::kFailed;
  failed.bytes = 0;
  failed.manifest_xxh64.clear();
  failed.message = "rank 5: cannot write shard_r5.bin: \"No space left on device\"\n日本";
  out.push_back(failed);
  CheckpointRecord written = c;
  written.step = 999;  // backwards: a negative delta
  written.rank = 3;
  written.state = CheckpointState::kWritten;
  written.stall_s = std::numeric_limits<double>::quiet_NaN();
  out.push_back(written);
  CheckpointRecord extreme;
  extreme.run_id = std::numeric_limits<int64_t>::max();
  extreme.step = std::numeric_limits<int64_t>::min();
  extreme.rank = std::numeric_limits<int32_t>::min();
  extreme.bytes = std::numeric_limits<uint64_t>::max();
  extreme.shards = std::numeric_limits<int32_t>::max();
  out.push_back(extreme);
  return out;
}

// A batch that exercises every field, both signs, extremes, NaN and infinities, and strings that need
// care (empty, repeated, non-ASCII, with quotes and newlines).
RecordBatch sample_batch() {
  RecordBatch b;
  for (int r = 0; r < 8; ++r) b.rank_steps.push_back(sample_rank_step(r, 1000));
  b.rank_steps.push_back(sample_rank_step(3, 999));  // step goes backwards: negative delta
  RankStepRecord extreme;
  extreme.run_id = std::numeric_limits<int64_t>::min();
  extreme.step = std::numeric_limits<int64_t>::max();
  extreme.rank = std::numeric_limits<int32_t>::max();
  extreme.device = std::numeric_limits<int32_t>::min();
  extreme.tokens = std::numeric_limits<int64_t>::min();
  extreme.mem_peak_bytes = std::numeric_limits<uint64_t>::max();
  extreme.total_s = std::numeric_limits<double>::denorm_min();
  extreme.phases.forward = -0.0;
  extreme.power_watts = std::numeric_limits<double>::infinity();
  b.rank_steps.push_back(extreme);

  StepRecord s;
  s.run_id = 7;
  s.step = 1000;
  s.time_unix_s = 1795651200.123456;
  s.loss = std::numeric_limits<double>::quiet_NaN();  // diverged
  s.grad_norm = std::numeric_limits<double>::infinity();
  s.lr = 3e-4;
  s.tokens_per_s = 1.25e6;
  s.step_s = 0.35;
  s.mfu = 0.41;
  s.hfu = 0.52;
  b.steps.push_back(s);
  s.step = 1001;
  s.loss = 2.5;
  s.grad_norm = 1.0;
  s.val_loss = 2.75;
  s.mfu.reset();  // the peak is unknown: absent, not 0
  s.hfu.reset();
  b.steps.push_back(s);

  EventRecord e;
  e.run_id = 7;
  e.time_unix_s = 1795651200.5;
  e.step = 1000;
  e.kind = "straggler";
  e.rank = 5;
  e.node = "node-0";
  e.message = "rank 5 slow: \"forward\"\nsecond line, µs and 日本";
  e.payload = R"({"phase":"forward","relative":0.93})";
  b.events.push_back(e);
  EventRecord bare;  // all defaults: empty strings, step and rank -1
  bare.kind = "pause";
  b.events.push_back(bare);
  b.checkpoints = sample_checkpoints();
  // Device samples: a node's own readings and a GPU's, a NaN and an extreme value.
  b.device_samples.push_back({.host = "node-0",
                              .device = kDeviceNode,
                              .time_unix_s = 1795651200.25,
                              .metric = DeviceMetric::kNodeCpu,
                              .value = 0.73});
  b.device_samples.push_back({.host = "node-1",
                              .device = 7,
                              .time_unix_s = 1795651200.5,
                              .metric = DeviceMetric::kGpuPower,
                              .value = 651.25});
  b.device_samples.push_back({.host = "node-1",
                              .device = 0,
                              .time_unix_s = 1795651200.5,
                              .metric = DeviceMetric::kGpuEccErrors,
                              .value = std::numeric_limits<double>::quiet_NaN()});
  b.device_samples.push_back({.host = "node-0",
                              .device = kDeviceNode,
                              .time_unix_s = 1795651201,
                              .metric = DeviceMetric::kNodeNetTransmit,
                              .value = 1e300});
  return b;
}

TEST(RecordCodec, BinaryRoundTripIsExact) {
  const RecordBatch b = sample_batch();
  std::vector<uint8_t> wire;
  ASSERT_TRUE(record_batch_encode(b, &wire));
  RecordBatch back;
  std::string error;
  ASSERT_TRUE(record_batch_decode(wire.data(), wire.size(), &back, &error)) << error;
  EXPECT_EQ(back, b);
  EXPECT_TRUE(std::signbit(back.rank_steps.back().phases.forward));  // -0.0 kept bit for bit
  EXPECT_EQ(record_batch_frame_size(wire.data(), wire.size(), &error), wire.size());
}

TEST(RecordCodec, EmptyBatchRoundTrips) {
  std::vector<uint8_t> wire;
  ASSERT_TRUE(record_batch_encode(RecordBatch(), &wire));
  RecordBatch back;
  back.steps.emplace_back();  // decode must replace what was there
  std::string error;
  ASSERT_TRUE(record_batch_decode(wire.data(), wire.size(), &back, &error)) << error;
  EXPECT_TRUE(back.empty());
}

TEST(RecordCodec, CompactForANodeBatch) {
  // One node's eight ranks at one step: the size budget of the worker → agent → coordinator path.
  RecordBatch b;
  // Each with its MFU and HFU (a known peak), without NVML readings.
  for (int r = 0; r < 8; ++r) {
    RankStepRecord x = sample_rank_step(r, 123456);
    x.temperature_celsius.reset();
    x.sm_clock_hertz.reset();
    x.power_watts.reset();
    x.mfu = 0.41;
    x.hfu = 0.47;
    b.rank_steps.push_back(x);
  }
  std::vector<uint8_t> wire;
  ASSERT_TRUE(record_batch_encode(b, &wire));
  EXPECT_LT(wire.size(), 8u * 100u) << "bytes per rank-step record grew past 100";
}

TEST(RecordCodec, RejectsBadHeaders) {
  std::vector<uint8_t> wire;
  ASSERT_TRUE(record_batch_encode(sample_batch(), &wire));
  RecordBatch out;
  std::string error;

  auto bad = wire;
  bad[0] ^= 0xFF;
  EXPECT_FALSE(record_batch_decode(bad.data(), bad.size(), &out, &error));
  EXPECT_NE(error.find("magic"), std::string::npos) << error;

  bad = wire;
  bad[4] = 5;  // a version from the future
  EXPECT_FALSE(record_batch_decode(bad.data(), bad.size(), &out, &error));
  EXPECT_NE(error.find("version 5"), std::string::npos) << error;

  // Version 1 (step mfu/hfu as fixed doubles, none on rank steps) comes only from an older build: refused
  // by name rather than misread.
  bad = wire;
  bad[4] = 1;
  EXPECT_FALSE(record_batch_decode(bad.data(), bad.size(), &out, &error));
  EXPECT_NE(error.find("version 1 is not supported (this build reads 4"), std::string::npos) << error;
  bad = wire;
  bad[6] = 1;  // reserved
  EXPECT_FALSE(record_batch_decode(bad.data(), bad.size(), &out, &error));
  EXPECT_NE(error.find("reserved"), std::string::npos) << error;

  bad = wire;
  bad.push_back(0);
  EXPECT_FALSE(record_batch_decode(bad.data(), bad.size(), &out, &error));
  EXPECT_NE(error.find("trailing"), std::string::npos) << error;
}

// Version 2 had no checkpoint section (a checkpoint was an event with a JSON payload): a v2 sender is an
// older build, refused by name, and nothing of its batch is taken.
TEST(RecordCodec, RefusesVersion2ByName) {
  RecordBatch b;
  b.events.push_back({.run_id = 1, .kind = "checkpoint", .payload = R"({"dir":"d","bytes":1,"seconds":2})"});
  std::vector<uint8_t> wire;
  ASSERT_TRUE(record_batch_encode(b, &wire));
  wire[4] = 2;
  wire[5] = 0;
  RecordBatch out;
  out.steps.emplace_back();
  std::string error;
  EXPECT_FALSE(record_batch_decode(wire.data(), wire.size(), &out, &error));
  EXPECT_NE(error.find("telemetry batch version 2 is not supported (this build reads 4"), std::string::npos)
      << error;
  EXPECT_NE(error.find("checkpoint records"), std::string::npos) << error;
  EXPECT_TRUE(out.empty());
  EXPECT_EQ(record_batch_frame_size(wire.data(), wire.size(), &error), 0u);
  EXPECT_NE(error.find("version 2"), std::string::npos) << error;
}

TEST(RecordCodec, RejectsAnUnknownCheckpointState) {
  RecordBatch b;
  b.checkpoints.push_back(sample_checkpoints()[0]);
  std::vector<uint8_t> wire;
  ASSERT_TRUE(record_batch_encode(b, &wire));
  // The state byte follows the dir's string index; find it by re-encoding with another state.
  b.checkpoints[0].state = CheckpointState::kFailed;
  std::vector<uint8_t> other;
  ASSERT_TRUE(record_batch_encode(b, &other));
  ASSERT_EQ(wire.size(), other.size());
  size_t at = 0;
  for (size_t i = 0; i < wire.size(); ++i) {
    if (wire[i] != other[i]) at = i;
  }
  ASSERT_EQ(wire[at], static_cast<uint8_t>(CheckpointState::kCommitted));
  wire[at] = 3;
  RecordBatch out;
  std::string error;
  EXPECT_FALSE(record_batch_decode(wire.data(), wire.size(), &out, &error));
  EXPECT_NE(error.find("checkpoint state 3 is not one of 0..2"), std::string::npos) << error;
  EXPECT_TRUE(out.empty());
}

// Version 3 had no device-sample section: refused by name.
TEST(RecordCodec, RefusesVersion3ByName) {
  std::vector<uint8_t> wire;
  ASSERT_TRUE(record_batch_encode(RecordBatch(), &wire));
  wire[4] = 3;
  RecordBatch out;
  std::string error;
  EXPECT_FALSE(record_batch_decode(wire.data(), wire.size(), &out, &error));
  EXPECT_NE(error.find("version 3 is not supported (this build reads 4"), std::string::npos) << error;
  EXPECT_NE(error.find("no device samples"), std::string::npos) << error;
}

TEST(RecordCodec, RejectsAnUnknownDeviceMetric) {
  RecordBatch b;
  b.device_samples.push_back(
      {.host = "n", .device = 0, .time_unix_s = 1, .metric = DeviceMetric::kGpuPower, .value = 2});
  std::vector<uint8_t> wire;
  ASSERT_TRUE(record_batch_encode(b, &wire));
  // The metric byte comes right before the value's 8 bytes, the last of the frame.
  const size_t at = wire.size() - 9;
  ASSERT_EQ(wire[at], static_cast<uint8_t>(DeviceMetric::kGpuPower));
  wire[at] = kDeviceMetricCount;
  RecordBatch out;
  std::string error;
  EXPECT_FALSE(record_batch_decode(wire.data(), wire.size(), &out, &error));
  EXPECT_NE(error.find("device sample metric 13 is not one of 0..12"), std::string::npos) << error;
  EXPECT_TRUE(out.empty());
}

TEST(RecordJson, DeviceSamplesRoundTripAndUnknownMetricIsNamed) {
  RecordBatch b;
  b.device_samples.push_back({.host = "node-0",
                              .device = kDeviceNode,
                              .time_unix_s = 1795651200.25,
                              .metric = DeviceMetric::kNodeMemoryUsed,
                              .value = 1.5e10});
  const std::string text = record_to_json(b);
  EXPECT_NE(text.find(R"("metric":"node_memory_used")"), std::string::npos) << text;
  RecordBatch back;
  std::string error;
  ASSERT_TRUE(record_from_json(text, &back, &error)) << error;
  EXPECT_EQ(back, b);
  std::string bad = text;
  bad.replace(bad.find("node_memory_used"), 16, "node_memory_uzed");
  EXPECT_FALSE(record_from_json(bad, &back, &error));
  EXPECT_NE(error.find("\"metric\": expected a device metric name"), std::string::npos) << error;
  // A batch without device samples writes no such key (older readers' JSON stays as it was).
  EXPECT_EQ(record_to_json(RecordBatch()).find("device_samples"), std::string::npos);
}

TEST(RecordCodec, EveryTruncationIsAnErrorAndLeavesNothing) {
  std::vector<uint8_t> wire;
  ASSERT_TRUE(record_batch_encode(sample_batch(), &wire));
  for (size_t n = 0; n < wire.size(); ++n) {
    RecordBatch out;
    std::string error;
    EXPECT_FALSE(record_batch_decode(wire.data(), n, &out, &error)) << "prefix of " << n << " bytes";
    EXPECT_FALSE(error.empty());
    EXPECT_TRUE(out.empty());
  }
}

TEST(RecordCodec, TruncatedBodyWithPatchedLengthIsAnError) {
  // The header agrees with the size, but the body itself ends early: the body parser must catch it.
  std::vector<uint8_t> wire;
  ASSERT_TRUE(record_batch_encode(sample_batch(), &wire));
  for (size_t n = kRecordCodecHeaderBytes; n < wire.size(); ++n) {
    std::vector<uint8_t> cut(wire.begin(), wire.begin() + static_cast<std::ptrdiff_t>(n));
    const size_t body = n - kRecordCodecHeaderBytes;
    for (int i = 0; i < 4; ++i) cut[8 + i] = static_cast<uint8_t>(body >> (8 * i));
    RecordBatch out;
    std::string error;
    EXPECT_FALSE(record_batch_decode(cut.data(), cut.size(), &out, &error)) << "body of " << body << " bytes";
  }
}

TEST(RecordCodec, FuzzRandomBytesAndMutationsNeverCrash) {
  std::vector<uint8_t> wire;
  ASSERT_TRUE(record_batch_encode(sample_batch(), &wire));
  std::mt19937_64 rng(20261126);
  RecordBatch out;
  std::string error;
  int accepted = 0;
  for (int iter = 0; iter < 20000; ++iter) {
    std::vector<uint8_t> buf;
    if (iter % 2 == 0) {
      // Pure noise behind a valid header, so the body parser is what gets exercised.
      buf.resize(kRecordCodecHeaderBytes + rng() % 300);
      for (auto& x : buf) x = static_cast<uint8_t>(rng());
      std::copy(wire.begin(), wire.begin() + 8, buf.begin());
      const size_t body = buf.size() - kRecordCodecHeaderBytes;
      for (int i = 0; i < 4; ++i) buf[8 + i] = static_cast<uint8_t>(body >> (8 * i));
    } else {
      // A valid batch with a few bytes flipped: counts, indices and lengths turn hostile.
      buf = wire;
      const int flips = 1 + static_cast<int>(rng() % 4);
      for (int f = 0; f < flips; ++f) {
        buf[kRecordCodecHeaderBytes + rng() % (buf.size() - kRecordCodecHeaderBytes)] =
            static_cast<uint8_t>(rng());
      }
    }
    if (record_batch_decode(buf.data(), buf.size(), &out, &error)) {
      ++accepted;  // a flip inside a double is still a valid batch; then it must re-encode
      std::vector<uint8_t> again;
      ASSERT_TRUE(record_batch_encode(out, &again));
    } else {
      EXPECT_TRUE(out.empty());
    }
  }
  EXPECT_GT(accepted, 0);  // the mutations did reach past the validation, sometimes
}

TEST(RecordCodec, HostileCountIsRefusedBeforeAllocating) {
  // Header + body "0 strings, 2^60 rank steps": must fail on the count, not try to allocate.
  std::vector<uint8_t> buf = {0x47, 0x54, 0x4C, 0x4D, kRecordCodecVersion, 0, 0, 0, 0, 0, 0, 0, 0};
  const uint64_t huge = uint64_t{1} << 60;
  for (uint64_t v = huge; v >= 0x80; v >>= 7) buf.push_back(static_cast<uint8_t>(v | 0x80));
  buf.push_back(static_cast<uint8_t>(huge >> 56));
  const size_t body = buf.size() - kRecordCodecHeaderBytes;
  buf[8] = static_cast<uint8_t>(body);
  RecordBatch out;
  std::string error;
  EXPECT_FALSE(record_batch_decode(buf.data(), buf.size(), &out, &error));
  EXPECT_NE(error.find("count"), std::string::npos) << error;
}

TEST(RecordJson, RoundTripsEveryRecordExactly) {
  const RecordBatch b = sample_batch();
  for (const RankStepRecord& r : b.rank_steps) {
    RankStepRecord back;
    std::string error;
    ASSERT_TRUE(record_from_json(record_to_json(r), &back, &error)) << error << "\n" << record_to_json(r);
    EXPECT_EQ(back, r) << record_to_json(r);
  }
  for (const StepRecord& s : b.steps) {
    StepRecord back;
    std::string error;
    ASSERT_TRUE(record_from_json(record_to_json(s), &back, &error)) << error;
    EXPECT_EQ(back, s) << record_to_json(s);
  }
  for (const CheckpointRecord& c : b.checkpoints) {
    CheckpointRecord back;
    std::string error;
    ASSERT_TRUE(record_from_json(record_to_json(c), &back, &error)) << error << "\n" << record_to_json(c);
    EXPECT_EQ(back, c) << record_to_json(c);
  }
  ASSERT_FALSE(b.checkpoints.empty());
  EXPECT_NE(record_to_json(b).find("\"checkpoints\":[{"), std::string::npos);
  RecordBatch back;
  std::string error;
  ASSERT_TRUE(record_from_json(record_to_json(b), &back, &error)) << error;
  EXPECT_EQ(back, b);
}

TEST(RecordJson, WritesUnitsInKeysAndNaNAsString) {
  StepRecord s;
  s.loss = std::numeric_limits<double>::quiet_NaN();
  const std::string j = record_to_json(s);
  EXPECT_NE(j.find("\"loss\":\"NaN\""), std::string::npos) << j;
  EXPECT_EQ(j.find("val_loss"), std::string::npos) << "absent optionals are not written";
  EXPECT_EQ(j.find("mfu"), std::string::npos) << "an unknown MFU is absent, never 0: " << j;
  s.mfu = 0.25;
  EXPECT_NE(record_to_json(s).find("\"mfu\":0.25"), std::string::npos) << record_to_json(s);
  const std::string r = record_to_json(sample_rank_step(1, 5));
  EXPECT_NE(r.find("\"forward_s\":0.100000005"), std::string::npos) << r;
  EXPECT_NE(r.find("\"mem_peak_bytes\":79999999999"), std::string::npos) << r;
}

TEST(RecordJson, StrictReader) {
  const std::string good = record_to_json(sample_rank_step(2, 9));
  RankStepRecord r;
  std::string error;
  ASSERT_TRUE(record_from_json(good, &r, &error)) << error;

  const auto rejects = [&](const std::string& text, const std::string& needle) {
    RankStepRecord x;
    std::string why;
    EXPECT_FALSE(record_from_json(text, &x, &why)) << text;
    EXPECT_NE(why.find(needle), std::string::npos) << "error \"" << why << "\" lacks \"" << needle << "\"";
  };
  std::string t = good;
  rejects(t.insert(1, "\"colour\":\"red\","), "unknown key \"colour\"");
  t = good;
  rejects(t.replace(t.find("\"rank\":2"), 8, "\"rank\":2.5"), "\"rank\": expected a 32-bit integer");
  t = good;
  rejects(t.replace(t.find("\"rank\":2"), 8, "\"rank\":9999999999"), "\"rank\"");
  t = good;
  rejects(t.replace(t.find("\"step\":9,"), 9, ""), "missing key \"step\"");
  t = good;
  rejects(t.insert(1, "\"step\":9,"), "duplicate key \"step\"");
  t = good;
  rejects(t.replace(t.find("\"host\":\"node-0\""), 15, "\"host\":7"), "\"host\": expected a string");
  t = good;
  rejects(t.replace(t.find("\"mem_peak_bytes\":"), 17, "\"mem_peak_bytes\":-"), "mem_peak_bytes");
  rejects("[1,2]", "expected an object");
  rejects(good + " x", "expected end of input");
  rejects(good.substr(0, good.size() - 1), "expected");
  rejects("", "unexpected end of input");

  // Optional keys may be null or absent.
  t = good;
  ASSERT_TRUE(record_from_json(t.insert(t.size() - 1, ",\"power_watts\":null"), &r, &error)) << error;
  EXPECT_FALSE(r.power_watts.has_value());
  t = record_to_json(sample_rank_step(5, 9));
  ASSERT_EQ(t.find("\"mfu\""), std::string::npos) << t;
  ASSERT_TRUE(record_from_json(t.insert(t.size() - 1, ",\"mfu\":null,\"hfu\":0.5"), &r, &error)) << error;
  EXPECT_FALSE(r.mfu.has_value());
  EXPECT_EQ(r.hfu.value_or(-1), 0.5);
}

TEST(RecordJson, StrictCheckpointReader) {
  const std::string good = record_to_json(sample_checkpoints()[0]);
  EXPECT_NE(good.find("\"state\":\"committed\""), std::string::npos) << good;
  EXPECT_NE(good.find("\"rank\":-1"), std::string::npos) << good;
  CheckpointRecord c;
  std::string error;
  ASSERT_TRUE(record_from_json(good, &c, &error)) << error;
  EXPECT_EQ(c, sample_checkpoints()[0]);

  const auto rejects = [&](const std::string& text, const std::string& needle) {
    CheckpointRecord x;
    std::string why;
    EXPECT_FALSE(record_from_json(text, &x, &why)) << text;
    EXPECT_NE(why.find(needle), std::string::npos) << "error \"" << why << "\" lacks \"" << needle << "\"";
  };
  const auto replaced = [&](const std::string& from, const std::string& to) {
    std::string t = good;
    const size_t at = t.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    return at == std::string::npos ? t : t.replace(at, from.size(), to);
  };
  std::string t = good;
  rejects(t.insert(1, "\"checksum\":\"x\","), "checkpoint record: unknown key \"checksum\"");
  t = good;
  rejects(t.insert(1, "\"bytes\":1,"), "duplicate key \"bytes\"");
  rejects(replaced("\"state\":\"committed\"", "\"state\":\"done\""),
          "\"state\": expected one of \"written\", \"committed\", \"failed\"");
  rejects(replaced("\"state\":\"committed\"", "\"state\":1"), "\"state\": expected one of");
  rejects(replaced("\"bytes\":1234567890123", "\"bytes\":-1"), "\"bytes\": expected a non-negative integer");
  rejects(replaced("\"shards\":8", "\"shards\":8.5"), "\"shards\": expected a 32-bit integer");
  rejects(replaced("\"write_s\":4.5", "\"write_s\":\"4.5\""), "\"write_s\": expected a number");
  rejects(replaced("\"stall_s\":0.75,", ""), "missing key \"stall_s\"");
  rejects(replaced("\"dir\":", "\"path\":"), "missing key \"dir\"");  // the required key first
  rejects("{}", "missing key \"run_id\"");
  // The batch names the element.
  RecordBatch b;
  EXPECT_FALSE(record_from_json(R"({"checkpoints":[)" + good + R"(,{"run_id":1}]})", &b, &error));
  EXPECT_NE(error.find("batch: \"checkpoints\"[1]: checkpoint record: missing key"), std::string::npos)
      << error;
  EXPECT_FALSE(record_from_json(R"({"checkpoints":{}})", &b, &error));
  EXPECT_NE(error.find("\"checkpoints\": expected an array"), std::string::npos) << error;
  // The manifest checksum and the message may be absent (a failed write has no manifest).
  t = replaced("\"manifest_xxh64\":\"0123456789abcdef\",", "");
  ASSERT_TRUE(record_from_json(t, &c, &error)) << error << ": " << t;
  EXPECT_EQ(c.manifest_xxh64, "");
}

// The run's event is made from the typed record, in one place.
TEST(RecordJson, CheckpointEventComesFromTheRecord) {
  const std::vector<CheckpointRecord> cs = sample_checkpoints();
  const EventRecord e = checkpoint_event(cs[0]);
  EXPECT_EQ(e.kind, "checkpoint");
  EXPECT_EQ(e.step, 1000);
  EXPECT_EQ(e.rank, -1);
  EXPECT_EQ(e.node, "node-0");
  EXPECT_EQ(e.message.rfind("checkpoint committed: /runs/7/checkpoints/step_00001000 (", 0), 0u) << e.message;
  EXPECT_NE(e.message.find("write 4.50 s, training stalled 0.75 s"), std::string::npos) << e.message;
  CheckpointRecord back;
  std::string error;
  ASSERT_TRUE(record_from_json(e.payload, &back, &error)) << error;
  EXPECT_EQ(back, cs[0]);
  const EventRecord f = checkpoint_event(cs[1]);
  EXPECT_EQ(f.kind, "checkpoint_failed");
  EXPECT_EQ(f.rank, 5);
  EXPECT_NE(f.message.find("checkpoint of step 1000 failed (rank 5): rank 5: cannot write"),
            std::string::npos)
      << f.message;
  EXPECT_EQ(checkpoint_event(cs[2]).kind, "checkpoint_written");
}

// The text parser: RFC 8259 and no more (nlohmann's), with what nlohmann lets through refused on top.
TEST(RecordJson, ParserEdgeCases) {
  EventRecord e;
  std::string error;
  ASSERT_TRUE(record_from_json(
      R"({"run_id":1,"time_unix_s":-0.5e-3,"kind":"x","message":"\u00e9\ud83d\ude00\n"})", &e, &error))
      << error;
  EXPECT_EQ(e.message, "\xC3\xA9\xF0\x9F\x98\x80\n");
  for (const char* bad :
       {"01", "1.", ".5", "+1", "\"\\ud800\"", "\"\\udc00\"", "\"a\x01\"", "\"\xC0\xAF\"", "\"\xED\xA0\x80\"",
        "[1,]", "{\"a\":1,}", "{\"a\" 1}", "nul", "\"\\x\"", "1e", "{\"kind\":\"x\"} // comment"}) {
    EXPECT_FALSE(record_from_json(bad, &e, &error)) << bad;
    EXPECT_FALSE(error.empty()) << bad;
  }
  std::string deep =
      R"({"run_id":1,"time_unix_s":0,"kind":)" + std::string(100, '[') + std::string(100, ']') + "}";
  EXPECT_FALSE(record_from_json(deep, &e, &error));
  EXPECT_NE(error.find("deeper than 64"), std::string::npos) << error;

  // Duplicate keys are refused at any depth, also among many keys (nlohmann alone keeps the last one).
  EXPECT_FALSE(record_from_json(R"({"run_id":1,"time_unix_s":0,"kind":"x","kind":"y"})", &e, &error));
  EXPECT_NE(error.find("duplicate key \"kind\""), std::string::npos) << error;
  std::string many = R"({"events":[],"x":{)";
  for (int i = 0; i < 5000; ++i) many += "\"k" + std::to_string(i) + "\":" + std::to_string(i) + ",";
  RecordBatch b;
  EXPECT_FALSE(record_from_json(many + "\"k17\":0}}", &b, &error));
  EXPECT_NE(error.find("duplicate key \"k17\""), std::string::npos) << error;
  // The same key in sibling objects is no duplicate.
  ASSERT_TRUE(record_from_json(
      R"({"events":[{"run_id":1,"time_unix_s":0,"kind":"a"},{"run_id":2,"time_unix_s":0,"kind":"b"}]})", &b,
      &error))
      << error;
  EXPECT_EQ(b.events.size(), 2u);
}

TEST(RecordJson, WriterKeepsOutputValidForInvalidUtf8) {
  EventRecord e;
  e.kind = "x";
  e.message = std::string("ok \xFF\xC3 end\x01", 10);
  const std::string text = record_to_json(e);
  EventRecord back;
  std::string error;
  ASSERT_TRUE(record_from_json(text, &back, &error)) << error << ": " << text;
  EXPECT_EQ(back.message, "ok \xEF\xBF\xBD\xEF\xBF\xBD end\x01");
}

// The serializers nest records in a larger document, and from_json throws nlohmann's exception type (an
// API handler's 400) naming the key.
TEST(RecordJson, NlohmannSerializersNestAndThrowNamingTheKey) {
  const RecordBatch b = sample_batch();
  const nlohmann::json doc = {{"latest", b.steps[0]}, {"ranks", b.rank_steps}};
  EXPECT_EQ(doc["latest"]["step"], b.steps[0].step);
  EXPECT_EQ(doc["latest"].dump(), record_to_json(b.steps[0]));
  EXPECT_EQ(doc["ranks"].get<std::vector<RankStepRecord>>(), b.rank_steps);
  nlohmann::json bad = doc["latest"];
  bad.erase("loss");
  try {
    (void)bad.get<StepRecord>();
    ADD_FAILURE() << "a step record without its loss was read";
  } catch (const nlohmann::json::exception& e) {
    EXPECT_NE(std::string(e.what()).find("missing key \"loss\""), std::string::npos) << e.what();
  }
  // Whole doubles stay exact and integers stay integers; 2.0 is no integer.
  StepRecord s;
  std::string error;
  EXPECT_FALSE(record_from_json(
      R"({"run_id":1,"step":2.0,"time_unix_s":0,"loss":0,"grad_norm":0,"lr":0,"tokens_per_s":0,"step_s":0,"mfu":0,"hfu":0})",
      &s, &error));
  EXPECT_NE(error.find("\"step\": expected an integer"), std::string::npos) << error;
  ASSERT_TRUE(record_from_json(
      R"({"run_id":1,"step":2,"time_unix_s":1e300,"loss":"Infinity","grad_norm":3,"lr":0,"tokens_per_s":0,"step_s":0,"mfu":0,"hfu":0})",
      &s, &error))
      << error;
  EXPECT_EQ(s.time_unix_s, 1e300);
  EXPECT_EQ(s.loss, std::numeric_limits<double>::infinity());
  EXPECT_EQ(s.grad_norm, 3.0);
}

TEST(RecordJson, BatchRejectsUnknownSectionAndNamesTheElement) {
  RecordBatch b;
  std::string error;
  EXPECT_FALSE(record_from_json(R"({"rank_steps":[],"extra":[]})", &b, &error));
  EXPECT_NE(error.find("unknown key \"extra\""), std::string::npos) << error;
  EXPECT_FALSE(
      record_from_json(R"({"events":[{"run_id":1,"time_unix_s":0,"kind":"x"},{"run_id":1}]})", &b, &error));
  EXPECT_NE(error.find("\"events\"[1]"), std::string::npos) << error;
  ASSERT_TRUE(record_from_json(R"({"events":[{"run_id":1,"time_unix_s":2.5,"kind":"pause"}]})", &b, &error))
      << error;
  ASSERT_EQ(b.events.size(), 1u);
  EXPECT_EQ(b.events[0].step, -1);
  EXPECT_EQ(b.events[0].rank, -1);
}

}  // namespace
}  // namespace gantry
