// Layout (all little-endian; docs/TELEMETRY.md has the table):
//   header: u32 magic "GTLM", u16 version, u16 reserved = 0, u32 body bytes
//   body:   string table, then rank-step, step, event, checkpoint and device-sample records, each section a
//           varint count.
// Integers are LEB128 varints (signed ones zigzagged); run, step and rank are stored as differences to the
// previous record because a batch is nearly always one run and one step. Doubles are raw IEEE-754 so a
// record survives the trip bit for bit. Strings (hosts, event kinds, messages) are interned once per batch.
#include "telemetry/record_codec.h"

#include <cstring>
#include <optional>
#include <string_view>
#include <unordered_map>

namespace gantry {
namespace {

// Smallest encoding of each record: a count claiming more records than bytes remain is rejected before
// anything is allocated for it.
constexpr size_t kMinRankStepBytes = 3 + 1 + 1 + 7 * 8 + 1 + 1 + 1 + 1;
constexpr size_t kMinStepBytes = 2 + 6 * 8 + 1;
constexpr size_t kMinEventBytes = 1 + 8 + 1 + 1 + 1 + 1 + 1 + 1;
constexpr size_t kMinCheckpointBytes = 1 + 1 + 8 + 1 + 1 + 1 + 1 + 1 + 1 + 8 + 8 + 1 + 1;
constexpr size_t kMinDeviceSampleBytes = 1 + 1 + 8 + 1 + 8;
// Version 2 added the utilisation bits (rank-step mfu/hfu; the step's mfu/hfu moved from fixed f64s to
// flagged optionals, absent = the peak is unknown).
constexpr uint8_t kRankStepTemperature = 1, kRankStepClock = 2, kRankStepPower = 4, kRankStepMfu = 8,
                  kRankStepHfu = 16;
constexpr uint8_t kRankStepFlags =
    kRankStepTemperature | kRankStepClock | kRankStepPower | kRankStepMfu | kRankStepHfu;
constexpr uint8_t kStepValLoss = 1, kStepMfu = 2, kStepHfu = 4;
constexpr uint8_t kStepFlags = kStepValLoss | kStepMfu | kStepHfu;

class Writer {
 public:
  explicit Writer(std::vector<uint8_t>* out) : out_(out) {}
  void u8(uint8_t v) { out_->push_back(v); }
  void fixed(uint64_t v, int bytes) {
    for (int i = 0; i < bytes; ++i) out_->push_back(static_cast<uint8_t>(v >> (8 * i)));
  }
  void varint(uint64_t v) {
    while (v >= 0x80) {
      out_->push_back(static_cast<uint8_t>(v | 0x80));
      v >>= 7;
    }
    out_->push_back(static_cast<uint8_t>(v));
  }
  void svarint(int64_t v) { varint((static_cast<uint64_t>(v) << 1) ^ static_cast<uint64_t>(v >> 63)); }
  // Differences in wrapping unsigned arithmetic: defined for every pair of int64 values, and the reader
  // wraps back the same way.
  void delta(int64_t cur, int64_t prev) {
    svarint(static_cast<int64_t>(static_cast<uint64_t>(cur) - static_cast<uint64_t>(prev)));
  }
  void f64(double v) {
    uint64_t bits;
    std::memcpy(&bits, &v, sizeof bits);
    fixed(bits, 8);
  }
  void bytes(std::string_view s) { out_->insert(out_->end(), s.begin(), s.end()); }

 private:
  std::vector<uint8_t>* out_;
};

class Reader {
 public:
  Reader(const uint8_t* p, size_t n) : p_(p), end_(p + n) {}
  size_t left() const { return static_cast<size_t>(end_ - p_); }
  const std::string& error() const { return error_; }
  bool failed() const { return !error_.empty(); }
  size_t offset(const uint8_t* base) const { return static_cast<size_t>(p_ - base); }

  bool fail(std::string what) {
    if (error_.empty()) error_ = std::move(what);
    return false;
  }
  bool u8(uint8_t* v) {
    if (left() < 1) return fail("truncated: expected 1 more byte");
    *v = *p_++;
    return true;
  }
  bool fixed(uint64_t* v, int bytes) {
    if (left() < static_cast<size_t>(bytes))
      return fail("truncated: expected " + std::to_string(bytes) + " more bytes");
    uint64_t x = 0;
    for (int i = 0; i < bytes; ++i) x |= static_cast<uint64_t>(p_[i]) << (8 * i);
    p_ += bytes;
    *v = x;
    return true;
  }
  bool varint(uint64_t* v) {
    uint64_t x = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (left() < 1) return fail("truncated inside a varint");
      const uint8_t b = *p_++;
      // The tenth byte may carry only the top bit of a 64-bit value.
      if (shift == 63 && b > 1) return fail("varint overflows 64 bits");
      x |= static_cast<uint64_t>(b & 0x7F) << shift;
      if (!(b & 0x80)) {
        *v = x;
        return true;
      }
    }
    return fail("varint longer than 10 bytes");
  }
  bool svarint(int64_t* v) {
    uint64_t z;
    if (!varint(&z)) return false;
    *v = static_cast<int64_t>((z >> 1) ^ (~(z & 1) + 1));
    return true;
  }
  bool delta(int64_t* cur, int64_t prev) {
    int64_t d;
    if (!svarint(&d)) return false;
    *cur = static_cast<int64_t>(static_cast<uint64_t>(prev) + static_cast<uint64_t>(d));
    return true;
  }
  bool i32(int32_t* v, const char* what) {
    int64_t x;
    if (!svarint(&x)) return false;
    if (x < INT32_MIN || x > INT32_MAX) return fail(std::string(what) + " out of 32-bit range");
    *v = static_cast<int32_t>(x);
    return true;
  }
  bool f64(double* v) {
    uint64_t bits;
    if (!fixed(&bits, 8)) return false;
    std::memcpy(v, &bits, sizeof bits);
    return true;
  }
  bool count(size_t min_each, const char* what, size_t* n) {
    uint64_t x;
    if (!varint(&x)) return false;
    if (x > left() / min_each) {
      return fail(std::string(what) + " count " + std::to_string(x) + " exceeds what " +
                  std::to_string(left()) + " remaining bytes can hold");
    }
    *n = static_cast<size_t>(x);
    return true;
  }
  bool bytes(size_t n, std::string* out) {
    if (left() < n) return fail("truncated inside a string");
    out->assign(reinterpret_cast<const char*>(p_), n);
    p_ += n;
    return true;
  }

 private:
  const uint8_t* p_;
  const uint8_t* end_;
  std::string error_;
};

// Interns strings for the encoder. Views point into the batch being encoded, which outlives the table.
class StringTable {
 public:
  uint32_t index(std::string_view s) {
    auto [it, inserted] = ids_.try_emplace(s, static_cast<uint32_t>(order_.size()));
    if (inserted) order_.push_back(s);
    return it->second;
  }
  const std::vector<std::string_view>& order() const { return order_; }

 private:
  std::unordered_map<std::string_view, uint32_t> ids_;
  std::vector<std::string_view> order_;
};

bool string_ref(Reader& r, const std::vector<std::string>& table, std::string* out) {
  uint64_t i;
  if (!r.varint(&i)) return false;
  if (i >= table.size()) {
    return r.fail("string index " + std::to_string(i) + " outside a table of " +
                  std::to_string(table.size()));
  }
  *out = table[static_cast<size_t>(i)];
  return true;
}

bool optional_f64(Reader& r, uint8_t flags, uint8_t bit, std::optional<double>* out) {
  if (!(flags & bit)) {
    out->reset();
    return true;
  }
  double v;
  if (!r.f64(&v)) return false;
  *out = v;
  return true;
}

bool decode_body(Reader& r, RecordBatch* out) {
  size_t n_strings;
  if (!r.count(1, "string", &n_strings)) return false;
  std::vector<std::string> strings(n_strings);
  for (std::string& s : strings) {
    uint64_t len;
    if (!r.varint(&len)) return false;
    if (len > r.left()) return r.fail("string length " + std::to_string(len) + " runs past the end");
    if (!r.bytes(static_cast<size_t>(len), &s)) return false;
  }

  size_t n;
  if (!r.count(kMinRankStepBytes, "rank-step", &n)) return false;
  out->rank_steps.resize(n);
  int64_t run = 0, step = 0, rank = 0;
  for (RankStepRecord& x : out->rank_steps) {
    int64_t rank64;
    if (!r.delta(&run, run) || !r.delta(&step, step) || !r.delta(&rank64, rank)) return false;
    if (rank64 < INT32_MIN || rank64 > INT32_MAX) return r.fail("rank out of 32-bit range");
    rank = rank64;
    x.run_id = run;
    x.step = step;
    x.rank = static_cast<int32_t>(rank64);
    if (!string_ref(r, strings, &x.host) || !r.i32(&x.device, "device")) return false;
    for (int p = 0; p < kPhaseCount; ++p) {
      if (!r.f64(&x.phases.at(static_cast<Phase>(p)))) return false;
    }
    int64_t tokens;
    uint8_t flags = 0;
    if (!r.f64(&x.total_s) || !r.svarint(&tokens) || !r.varint(&x.mem_allocated_bytes) ||
        !r.varint(&x.mem_peak_bytes) || !r.u8(&flags)) {
      return false;
    }
    x.tokens = tokens;
    if (flags & ~kRankStepFlags) {
      return r.fail("rank-step record has unknown flag bits");
    }
    if (!optional_f64(r, flags, kRankStepTemperature, &x.temperature_celsius) ||
        !optional_f64(r, flags, kRankStepClock, &x.sm_clock_hertz) ||
        !optional_f64(r, flags, kRankStepPower, &x.power_watts) ||
        !optional_f64(r, flags, kRankStepMfu, &x.mfu) || !optional_f64(r, flags, kRankStepHfu, &x.hfu)) {
      return false;
    }
  }

  if (!r.count(kMinStepBytes, "step", &n)) return false;
  out->steps.resize(n);
  run = 0;
  step = 0;
  for (StepRecord& x : out->steps) {
    uint8_t flags = 0;
    if (!r.delta(&run, run) || !r.delta(&step, step) || !r.f64(&x.time_unix_s) || !r.f64(&x.loss) ||
        !r.f64(&x.grad_norm) || !r.f64(&x.lr) || !r.f64(&x.tokens_per_s) || !r.f64(&x.step_s) ||
        !r.u8(&flags)) {
      return false;
    }
    x.run_id = run;
    x.step = step;
    if (flags & ~kStepFlags) return r.fail("step record has unknown flag bits");
    if (!optional_f64(r, flags, kStepValLoss, &x.val_loss) || !optional_f64(r, flags, kStepMfu, &x.mfu) ||
        !optional_f64(r, flags, kStepHfu, &x.hfu)) {
      return false;
    }
  }

  if (!r.count(kMinEventBytes, "event", &n)) return false;
  out->events.resize(n);
  run = 0;
  for (EventRecord& x : out->events) {
    if (!r.delta(&run, run) || !r.f64(&x.time_unix_s) || !r.svarint(&x.step) ||
        !string_ref(r, strings, &x.kind) || !r.i32(&x.rank, "event rank") ||
        !string_ref(r, strings, &x.node) || !string_ref(r, strings, &x.message) ||
        !string_ref(r, strings, &x.payload)) {
      return false;
    }
    x.run_id = run;
  }

  if (!r.count(kMinCheckpointBytes, "checkpoint", &n)) return false;
  out->checkpoints.resize(n);
  run = 0;
  step = 0;
  for (CheckpointRecord& x : out->checkpoints) {
    uint8_t state = 0, async = 0;
    if (!r.delta(&run, run) || !r.delta(&step, step) || !r.f64(&x.time_unix_s) ||
        !r.i32(&x.rank, "checkpoint rank") || !string_ref(r, strings, &x.host) ||
        !string_ref(r, strings, &x.dir) || !r.u8(&state)) {
      return false;
    }
    if (state >= kCheckpointStateCount) {
      return r.fail("checkpoint state " + std::to_string(state) + " is not one of 0.." +
                    std::to_string(kCheckpointStateCount - 1));
    }
    x.run_id = run;
    x.step = step;
    x.state = static_cast<CheckpointState>(state);
    if (!r.varint(&x.bytes) || !r.i32(&x.shards, "checkpoint shards") || !r.f64(&x.write_s) ||
        !r.f64(&x.stall_s) || !r.f64(&x.waited_s) || !r.u8(&async) ||
        !string_ref(r, strings, &x.manifest_xxh64) || !string_ref(r, strings, &x.message)) {
      return false;
    }
    if (async > 1) return r.fail("checkpoint async flag " + std::to_string(async) + " is not 0 or 1");
    x.async = async == 1;
  }

  if (!r.count(kMinDeviceSampleBytes, "device sample", &n)) return false;
  out->device_samples.resize(n);
  for (DeviceSampleRecord& x : out->device_samples) {
    uint8_t metric = 0;
    if (!string_ref(r, strings, &x.host) || !r.i32(&x.device, "device sample device") ||
        !r.f64(&x.time_unix_s) || !r.u8(&metric)) {
      return false;
    }
    if (metric >= kDeviceMetricCount) {
      return r.fail("device sample metric " + std::to_string(metric) + " is not one of 0.." +
                    std::to_string(kDeviceMetricCount - 1));
    }
    x.metric = static_cast<DeviceMetric>(metric);
    if (!r.f64(&x.value)) return false;
  }
  return true;
}

}  // namespace

bool record_batch_encode(const RecordBatch& batch, std::vector<uint8_t>* out, std::string* error) {
  StringTable strings;
  for (const RankStepRecord& x : batch.rank_steps) strings.index(x.host);
  for (const EventRecord& x : batch.events) {
    strings.index(x.kind);
    strings.index(x.node);
    strings.index(x.message);
    strings.index(x.payload);
  }
  for (const CheckpointRecord& x : batch.checkpoints) {
    strings.index(x.host);
    strings.index(x.dir);
    strings.index(x.manifest_xxh64);
    strings.index(x.message);
  }
  for (const DeviceSampleRecord& x : batch.device_samples) strings.index(x.host);

  out->clear();
  out->reserve(kRecordCodecHeaderBytes + 16 + batch.rank_steps.size() * 80 + batch.steps.size() * 80 +
               batch.events.size() * 32 + batch.checkpoints.size() * 48 + batch.device_samples.size() * 20);
  Writer w(out);
  w.fixed(kRecordCodecMagic, 4);
  w.fixed(kRecordCodecVersion, 2);
  w.fixed(0, 2);
  w.fixed(0, 4);  // body length, patched below

  w.varint(strings.order().size());
  for (std::string_view s : strings.order()) {
    w.varint(s.size());
    w.bytes(s);
  }

  w.varint(batch.rank_steps.size());
  int64_t run = 0, step = 0, rank = 0;
  for (const RankStepRecord& x : batch.rank_steps) {
    w.delta(x.run_id, run);
    w.delta(x.step, step);
    w.delta(x.rank, rank);
    run = x.run_id;
    step = x.step;
    rank = x.rank;
    w.varint(strings.index(x.host));
    w.svarint(x.device);
    for (int p = 0; p < kPhaseCount; ++p) w.f64(x.phases.get(static_cast<Phase>(p)));
    w.f64(x.total_s);
    w.svarint(x.tokens);
    w.varint(x.mem_allocated_bytes);
    w.varint(x.mem_peak_bytes);
    const uint8_t flags = (x.temperature_celsius ? kRankStepTemperature : 0) |
                          (x.sm_clock_hertz ? kRankStepClock : 0) | (x.power_watts ? kRankStepPower : 0) |
                          (x.mfu ? kRankStepMfu : 0) | (x.hfu ? kRankStepHfu : 0);
    w.u8(flags);
    for (const std::optional<double>* v :
         {&x.temperature_celsius, &x.sm_clock_hertz, &x.power_watts, &x.mfu, &x.hfu}) {
      if (*v) w.f64(**v);
    }
  }

  w.varint(batch.steps.size());
  run = 0;
  step = 0;
  for (const StepRecord& x : batch.steps) {
    w.delta(x.run_id, run);
    w.delta(x.step, step);
    run = x.run_id;
    step = x.step;
    for (double v : {x.time_unix_s, x.loss, x.grad_norm, x.lr, x.tokens_per_s, x.step_s}) w.f64(v);
    w.u8((x.val_loss ? kStepValLoss : 0) | (x.mfu ? kStepMfu : 0) | (x.hfu ? kStepHfu : 0));
    for (const std::optional<double>* v : {&x.val_loss, &x.mfu, &x.hfu}) {
      if (*v) w.f64(**v);
    }
  }

  w.varint(batch.events.size());
  run = 0;
  for (const EventRecord& x : batch.events) {
    w.delta(x.run_id, run);
    run = x.run_id;
    w.f64(x.time_unix_s);
    w.svarint(x.step);
    w.varint(strings.index(x.kind));
    w.svarint(x.rank);
    w.varint(strings.index(x.node));
    w.varint(strings.index(x.message));
    w.varint(strings.index(x.payload));
  }

  w.varint(batch.checkpoints.size());
  run = 0;
  step = 0;
  for (const CheckpointRecord& x : batch.checkpoints) {
    w.delta(x.run_id, run);
    w.delta(x.step, step);
    run = x.run_id;
    step = x.step;
    w.f64(x.time_unix_s);
    w.svarint(x.rank);
    w.varint(strings.index(x.host));
    w.varint(strings.index(x.dir));
    w.u8(static_cast<uint8_t>(x.state));
    w.varint(x.bytes);
    w.svarint(x.shards);
    w.f64(x.write_s);
    w.f64(x.stall_s);
    w.f64(x.waited_s);
    w.u8(x.async ? 1 : 0);
    w.varint(strings.index(x.manifest_xxh64));
    w.varint(strings.index(x.message));
  }

  w.varint(batch.device_samples.size());
  for (const DeviceSampleRecord& x : batch.device_samples) {
    w.varint(strings.index(x.host));
    w.svarint(x.device);
    w.f64(x.time_unix_s);
    w.u8(static_cast<uint8_t>(x.metric));
    w.f64(x.value);
  }

  const size_t body = out->size() - kRecordCodecHeaderBytes;
  if (body > kRecordCodecMaxBodyBytes) {
    out->clear();
    if (error)
      *error = "batch of " + std::to_string(body) + " bytes exceeds the 1 GiB limit; send it in parts";
    return false;
  }
  for (int i = 0; i < 4; ++i) (*out)[8 + i] = static_cast<uint8_t>(body >> (8 * i));
  return true;
}

size_t record_batch_frame_size(const uint8_t* data, size_t size, std::string* error) {
  if (size < kRecordCodecHeaderBytes) return 0;
  Reader r(data, size);
  uint64_t magic = 0, version = 0, reserved = 0, body = 0;  // size was checked: the reads succeed
  r.fixed(&magic, 4);
  r.fixed(&version, 2);
  r.fixed(&reserved, 2);
  r.fixed(&body, 4);
  std::string why;
  if (magic != kRecordCodecMagic) {
    why = "not a telemetry batch (bad magic)";
  } else if (version != kRecordCodecVersion) {
    // Batches live only between processes of one build (nothing stores them), so an older version is a
    // mixed deployment: refused, never guessed at. The versions this build knows of are named.
    const char* known = version == 1   ? ": version 1 has no rank-step mfu/hfu"
                        : version == 2 ? ": version 2 carries checkpoints as events, not checkpoint records"
                        : version == 3 ? ": version 3 has no device samples"
                                       : "";
    why = "telemetry batch version " + std::to_string(version) + " is not supported (this build reads " +
          std::to_string(kRecordCodecVersion) + "; the sender is a different Gantry build" + known + ")";
  } else if (reserved != 0) {
    why = "reserved header field is " + std::to_string(reserved) + ", expected 0";
  } else if (body > kRecordCodecMaxBodyBytes) {
    why = "body length " + std::to_string(body) + " exceeds the 1 GiB limit";
  }
  if (!why.empty()) {
    if (error) *error = why;
    return 0;
  }
  return kRecordCodecHeaderBytes + static_cast<size_t>(body);
}

bool record_batch_decode(const uint8_t* data, size_t size, RecordBatch* out, std::string* error) {
  out->clear();
  std::string why;
  if (size < kRecordCodecHeaderBytes) {
    why = "truncated: " + std::to_string(size) + " bytes is less than the " +
          std::to_string(kRecordCodecHeaderBytes) + "-byte header";
  } else if (const size_t frame = record_batch_frame_size(data, size, &why); frame != 0 && frame != size) {
    why = frame > size ? "truncated: header says " + std::to_string(frame) + " bytes, " +
                             std::to_string(size) + " present"
                       : std::to_string(size - frame) + " trailing bytes after the batch";
  } else if (frame == size) {
    Reader r(data + kRecordCodecHeaderBytes, size - kRecordCodecHeaderBytes);
    if (decode_body(r, out) && r.left() != 0) {
      r.fail(std::to_string(r.left()) + " unused bytes at the end of the body");
    }
    if (r.failed()) {
      why = r.error() + " (at body offset " + std::to_string(size - kRecordCodecHeaderBytes - r.left()) + ")";
    }
  }
  if (!why.empty()) {
    out->clear();
    if (error) *error = why;
    return false;
  }
  return true;
}

}  // namespace gantry
