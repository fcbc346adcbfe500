// One table per record (`*_fields` below) drives both directions, so the writer and the reader cannot
// disagree about a key: a field is one line, its JSON type follows from its C++ type, and a std::optional
// member is an optional key (absent or null = unknown) without saying so. Fields that may be absent but
// are not optional in the struct (an event's rank, -1 when none) are listed with `defaulted`.
#include "telemetry/record_json.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <type_traits>
#include <unordered_set>
#include <vector>

namespace gantry {
namespace {

using json = nlohmann::json;

// An error from_json throws: a nlohmann exception (so an API handler answers 400 with it, as for any body
// of the wrong shape) whose text is ours, naming the key.
class RecordJsonError : public json::exception {
 public:
  explicit RecordJsonError(const std::string& message) : json::exception(302, message.c_str()) {}
};

template <class T>
struct is_optional : std::false_type {};
template <class T>
struct is_optional<std::optional<T>> : std::true_type {};

// ---- values -----------------------------------------------------------------------------------------

void put(json& j, int64_t v) {
  j = v;
}
void put(json& j, int32_t v) {
  j = v;
}
void put(json& j, uint64_t v) {
  j = v;
}
void put(json& j, const std::string& v) {
  j = v;
}
void put(json& j, double v) {
  if (std::isfinite(v))
    j = v;  // nlohmann prints the shortest text that reads back to the same double
  else
    j = std::isnan(v) ? "NaN" : (v > 0 ? "Infinity" : "-Infinity");
}

void put(json& j, bool v) {
  j = v;
}

void put(json& j, CheckpointState v) {
  j = std::string(checkpoint_state_name(v));
}

void put(json& j, DeviceMetric v) {
  j = std::string(device_metric_name(v));
}
const char* expected(const DeviceMetric*) {
  return "a device metric name (\"gpu_utilisation\", \"node_cpu\", ...: docs/TELEMETRY.md)";
}

const char* expected(const CheckpointState*) {
  return "one of \"written\", \"committed\", \"failed\"";
}
const char* expected(const int64_t*) {
  return "an integer";
}
const char* expected(const int32_t*) {
  return "a 32-bit integer";
}
const char* expected(const uint64_t*) {
  return "a non-negative integer";
}
const char* expected(const double*) {
  return "a number (or \"NaN\", \"Infinity\", \"-Infinity\")";
}
const char* expected(const std::string*) {
  return "a string";
}
const char* expected(const bool*) {
  return "true or false";
}

// Integers must be JSON integers: 2.0, 2e0 and 2.5 are refused, as are values out of the field's range.
bool get(const json& v, int64_t* out) {
  if (v.is_number_unsigned()) {
    const uint64_t u = v.get<uint64_t>();
    if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return false;
    *out = static_cast<int64_t>(u);
    return true;
  }
  if (!v.is_number_integer()) return false;
  *out = v.get<int64_t>();
  return true;
}
bool get(const json& v, int32_t* out) {
  int64_t x;
  if (!get(v, &x) || x < std::numeric_limits<int32_t>::min() || x > std::numeric_limits<int32_t>::max())
    return false;
  *out = static_cast<int32_t>(x);
  return true;
}
bool get(const json& v, uint64_t* out) {
  if (!v.is_number_unsigned()) return false;
  *out = v.get<uint64_t>();
  return true;
}
bool get(const json& v, double* out) {
  if (v.is_number()) {
    *out = v.get<double>();
    return true;
  }
  if (!v.is_string()) return false;
  const std::string& s = v.get_ref<const std::string&>();
  if (s == "NaN")
    *out = std::numeric_limits<double>::quiet_NaN();
  else if (s == "Infinity")
    *out = std::numeric_limits<double>::infinity();
  else if (s == "-Infinity")
    *out = -std::numeric_limits<double>::infinity();
  else
    return false;
  return true;
}
bool get(const json& v, std::string* out) {
  if (!v.is_string()) return false;
  *out = v.get<std::string>();
  return true;
}
bool get(const json& v, bool* out) {
  if (!v.is_boolean()) return false;
  *out = v.get<bool>();
  return true;
}
bool get(const json& v, CheckpointState* out) {
  return v.is_string() && checkpoint_state_from_name(v.get_ref<const std::string&>(), out);
}
bool get(const json& v, DeviceMetric* out) {
  return v.is_string() && device_metric_from_name(v.get_ref<const std::string&>(), out);
}

// ---- the two directions -----------------------------------------------------------------------------

class Writer {
 public:
  explicit Writer(json& j) : j_(j) { j_ = json::object(); }
  template <class T>
  void operator()(const char* key, const T& v) {
    put(j_[key], v);
  }
  template <class T>
  void operator()(const char* key, const std::optional<T>& v) {
    if (v) put(j_[key], *v);  // unknown: not written
  }
  template <class T>
  void defaulted(const char* key, const T& v) {
    (*this)(key, v);
  }

 private:
  json& j_;
};

class Reader {
 public:
  Reader(const json& j, const char* what) : j_(j), what_(what) {}

  template <class T>
  void operator()(const char* key, T& v) {
    read(key, v, !is_optional<T>::value);
  }
  template <class T>
  void defaulted(const char* key, T& v) {
    read(key, v, false);
  }

  // After the fields: the first error, or an unknown key.
  bool finish(std::string* error) {
    if (error_.empty() && j_.is_object()) {
      for (auto it = j_.begin(); it != j_.end(); ++it) {
        bool known = false;
        for (const char* k : known_) known = known || it.key() == k;
        if (!known) {
          error_ = "unknown key \"" + it.key() + "\"";
          break;
        }
      }
    }
    if (error_.empty()) return true;
    if (error) *error = std::string(what_) + ": " + error_;
    return false;
  }

 private:
  template <class T>
  void read(const char* key, T& v, bool required) {
    known_.push_back(key);
    if (!error_.empty()) return;
    if (!j_.is_object()) {
      error_ = "expected an object";
      return;
    }
    const auto it = j_.find(key);
    if (it == j_.end() || it->is_null()) {
      if (required) error_ = "missing key \"" + std::string(key) + "\"";
      return;  // absent and null mean the same for optional keys
    }
    if constexpr (is_optional<T>::value) {
      typename T::value_type x;
      if (!get(*it, &x)) return fail(key, &x);
      v = x;
    } else {
      if (!get(*it, &v)) return fail(key, &v);
    }
  }
  template <class T>
  void fail(const char* key, const T* type) {
    error_ = "\"" + std::string(key) + "\": expected " + expected(type);
  }

  const json& j_;
  const char* what_;
  std::vector<const char*> known_;
  std::string error_;
};

// ---- the records' keys ------------------------------------------------------------------------------

template <class R, class M>  // R: the record, const for writing
void rank_step_fields(R& r, M& m) {
  m("run_id", r.run_id);
  m("step", r.step);
  m("rank", r.rank);
  m("host", r.host);
  m("device", r.device);
  m("data_wait_s", r.phases.data_wait);
  m("forward_s", r.phases.forward);
  m("backward_s", r.phases.backward);
  m("optimizer_s", r.phases.optimizer);
  m("comm_exposed_s", r.phases.comm_exposed);
  m("checkpoint_stall_s", r.phases.checkpoint_stall);
  m("total_s", r.total_s);
  m("tokens", r.tokens);
  m("mem_allocated_bytes", r.mem_allocated_bytes);
  m("mem_peak_bytes", r.mem_peak_bytes);
  m("temperature_celsius", r.temperature_celsius);
  m("sm_clock_hertz", r.sm_clock_hertz);
  m("power_watts", r.power_watts);
  m("mfu", r.mfu);
  m("hfu", r.hfu);
}

template <class R, class M>
void step_fields(R& r, M& m) {
  m("run_id", r.run_id);
  m("step", r.step);
  m("time_unix_s", r.time_unix_s);
  m("loss", r.loss);
  m("grad_norm", r.grad_norm);
  m("lr", r.lr);
  m("tokens_per_s", r.tokens_per_s);
  m("step_s", r.step_s);
  m("mfu", r.mfu);
  m("hfu", r.hfu);
  m("val_loss", r.val_loss);
}

template <class R, class M>
void event_fields(R& r, M& m) {
  m("run_id", r.run_id);
  m("time_unix_s", r.time_unix_s);
  m.defaulted("step", r.step);
  m("kind", r.kind);
  m.defaulted("rank", r.rank);
  m.defaulted("node", r.node);
  m.defaulted("message", r.message);
  m.defaulted("payload", r.payload);
}

template <class R, class M>
void checkpoint_fields(R& r, M& m) {
  m("run_id", r.run_id);
  m("step", r.step);
  m("time_unix_s", r.time_unix_s);
  m("rank", r.rank);
  m("host", r.host);
  m("dir", r.dir);
  m("state", r.state);
  m("bytes", r.bytes);
  m("shards", r.shards);
  m("write_s", r.write_s);
  m("stall_s", r.stall_s);
  m.defaulted("waited_s", r.waited_s);
  m.defaulted("async", r.async);
  m.defaulted("manifest_xxh64", r.manifest_xxh64);
  m.defaulted("message", r.message);
}

template <class R, class M>
void device_sample_fields(R& r, M& m) {
  m("host", r.host);
  m("device", r.device);
  m("time_unix_s", r.time_unix_s);
  m("metric", r.metric);
  m("value", r.value);
}

template <class R, class Fields>
bool read_record(const json& v, R* out, const char* what, Fields fields, std::string* error) {
  R r;
  Reader m(v, what);
  fields(r, m);
  if (!m.finish(error)) return false;
  *out = std::move(r);
  return true;
}

// ---- text ---------------------------------------------------------------------------------------------

constexpr int kMaxDepth = 64;

struct TooDeep {};
struct DuplicateKey {
  std::string key;
};

// RFC 8259 and no more (nlohmann's parser: no comments, no trailing commas, valid UTF-8, surrogates
// checked), plus what it lets through: a duplicate key (nlohmann keeps the last) and unbounded nesting.
bool parse(std::string_view text, json* out, std::string* error) {
  std::vector<std::unordered_set<std::string>> keys;  // one set per open object
  auto check = [&keys](int depth, json::parse_event_t event, json& parsed) {
    switch (event) {
      case json::parse_event_t::object_start:
        if (depth >= kMaxDepth) throw TooDeep{};
        keys.emplace_back();
        break;
      case json::parse_event_t::array_start:
        if (depth >= kMaxDepth) throw TooDeep{};
        break;
      case json::parse_event_t::object_end:
        keys.pop_back();
        break;
      case json::parse_event_t::key:
        if (!keys.empty() && !keys.back().insert(parsed.get<std::string>()).second)
          throw DuplicateKey{parsed.get<std::string>()};
        break;
      default:
        break;
    }
    return true;
  };
  // nlohmann's wording for an empty text differs between its releases (the GPU machines have another one):
  // say it in ours.
  if (text.find_first_not_of(" \t\r\n") == std::string_view::npos) {
    if (error) *error = "unexpected end of input: the text is empty, expected a JSON value";
    return false;
  }
  try {
    *out = json::parse(text.begin(), text.end(), check);
    return true;
  } catch (const TooDeep&) {
    if (error) *error = "nested deeper than " + std::to_string(kMaxDepth) + " levels of arrays and objects";
  } catch (const DuplicateKey& d) {
    if (error) *error = "duplicate key \"" + d.key + "\"";
  } catch (const json::exception& e) {
    std::string s = e.what();  // "[json.exception.parse_error.101] parse error at ...": the id is noise here
    if (!s.empty() && s.front() == '[' && s.find("] ") != std::string::npos) s.erase(0, s.find("] ") + 2);
    if (error) *error = s;
  }
  return false;
}

template <class R>
bool from_text(std::string_view text, R* out, std::string* error) {
  json v;
  return parse(text, &v, error) && record_read_json(v, out, error);
}

template <class R>
std::string to_text(const R& r) {
  return json(r).dump(-1, ' ', false, json::error_handler_t::replace);
}

template <class R>
void throwing_from_json(const json& j, R& r) {
  std::string error;
  if (!record_read_json(j, &r, &error)) throw RecordJsonError(error);
}

}  // namespace

void to_json(json& j, const RankStepRecord& r) {
  Writer m(j);
  rank_step_fields(r, m);
}
void to_json(json& j, const StepRecord& r) {
  Writer m(j);
  step_fields(r, m);
}
void to_json(json& j, const EventRecord& r) {
  Writer m(j);
  event_fields(r, m);
}
void to_json(json& j, const CheckpointRecord& r) {
  Writer m(j);
  checkpoint_fields(r, m);
}
void to_json(json& j, const DeviceSampleRecord& r) {
  Writer m(j);
  device_sample_fields(r, m);
}
void to_json(json& j, const RecordBatch& b) {
  j = {
      {"rank_steps", b.rank_steps}, {"steps", b.steps}, {"events", b.events}, {"checkpoints", b.checkpoints}};
  if (!b.device_samples.empty()) j["device_samples"] = b.device_samples;
}

void from_json(const json& j, RankStepRecord& r) {
  throwing_from_json(j, r);
}
void from_json(const json& j, StepRecord& r) {
  throwing_from_json(j, r);
}
void from_json(const json& j, EventRecord& r) {
  throwing_from_json(j, r);
}
void from_json(const json& j, CheckpointRecord& r) {
  throwing_from_json(j, r);
}
void from_json(const json& j, DeviceSampleRecord& r) {
  throwing_from_json(j, r);
}
void from_json(const json& j, RecordBatch& b) {
  throwing_from_json(j, b);
}

bool record_read_json(const json& v, RankStepRecord* out, std::string* error) {
  return read_record(
      v, out, "rank-step record", [](auto& r, auto& m) { rank_step_fields(r, m); }, error);
}
bool record_read_json(const json& v, StepRecord* out, std::string* error) {
  return read_record(
      v, out, "step record", [](auto& r, auto& m) { step_fields(r, m); }, error);
}
bool record_read_json(const json& v, EventRecord* out, std::string* error) {
  return read_record(
      v, out, "event", [](auto& r, auto& m) { event_fields(r, m); }, error);
}
bool record_read_json(const json& v, CheckpointRecord* out, std::string* error) {
  return read_record(
      v, out, "checkpoint record", [](auto& r, auto& m) { checkpoint_fields(r, m); }, error);
}

bool record_read_json(const json& v, DeviceSampleRecord* out, std::string* error) {
  return read_record(
      v, out, "device sample", [](auto& r, auto& m) { device_sample_fields(r, m); }, error);
}

bool record_read_json(const json& v, RecordBatch* out, std::string* error) {
  if (!v.is_object()) {
    if (error) *error = "batch: expected an object";
    return false;
  }
  RecordBatch b;
  // One array of records; the failing element is named in the error.
  const auto read_array = [&](const json& arr, const std::string& key, auto* records) {
    if (!arr.is_array()) {
      if (error) *error = "batch: \"" + key + "\": expected an array";
      return false;
    }
    records->resize(arr.size());
    for (size_t i = 0; i < arr.size(); ++i) {
      std::string why;
      if (!record_read_json(arr[i], &(*records)[i], &why)) {
        if (error) *error = "batch: \"" + key + "\"[" + std::to_string(i) + "]: " + why;
        return false;
      }
    }
    return true;
  };
  for (auto it = v.begin(); it != v.end(); ++it) {
    bool ok;
    if (it.key() == "rank_steps")
      ok = read_array(it.value(), it.key(), &b.rank_steps);
    else if (it.key() == "steps")
      ok = read_array(it.value(), it.key(), &b.steps);
    else if (it.key() == "events")
      ok = read_array(it.value(), it.key(), &b.events);
    else if (it.key() == "checkpoints")
      ok = read_array(it.value(), it.key(), &b.checkpoints);
    else if (it.key() == "device_samples")
      ok = read_array(it.value(), it.key(), &b.device_samples);
    else {
      if (error) *error = "batch: unknown key \"" + it.key() + "\"";
      return false;
    }
    if (!ok) return false;
  }
  *out = std::move(b);
  return true;
}

std::string record_to_json(const RankStepRecord& r) {
  return to_text(r);
}
std::string record_to_json(const StepRecord& r) {
  return to_text(r);
}
std::string record_to_json(const EventRecord& r) {
  return to_text(r);
}
std::string record_to_json(const CheckpointRecord& r) {
  return to_text(r);
}
std::string record_to_json(const RecordBatch& b) {
  return to_text(b);
}

bool record_from_json(std::string_view text, RankStepRecord* out, std::string* error) {
  return from_text(text, out, error);
}
bool record_from_json(std::string_view text, StepRecord* out, std::string* error) {
  return from_text(text, out, error);
}
bool record_from_json(std::string_view text, EventRecord* out, std::string* error) {
  return from_text(text, out, error);
}
bool record_from_json(std::string_view text, CheckpointRecord* out, std::string* error) {
  return from_text(text, out, error);
}
bool record_from_json(std::string_view text, RecordBatch* out, std::string* error) {
  return from_text(text, out, error);
}

}  // namespace gantry
