#include "telemetry/record_json.h"

#include <initializer_list>
#include <optional>

namespace gantry {
namespace {

// One key of a record's JSON object: where it goes and what it must be. Reading is table-driven so the
// writer and the reader cannot disagree about a key's type.
struct Field {
  enum Kind { i64, i32, u64, f64, opt_f64, str };
  std::string_view key;
  Kind kind;
  void* target;
  bool required;
};

Field req(std::string_view key, int64_t* p) {
  return {key, Field::i64, p, true};
}
Field req(std::string_view key, int32_t* p) {
  return {key, Field::i32, p, true};
}
Field req(std::string_view key, uint64_t* p) {
  return {key, Field::u64, p, true};
}
Field req(std::string_view key, double* p) {
  return {key, Field::f64, p, true};
}
Field req(std::string_view key, std::string* p) {
  return {key, Field::str, p, true};
}
Field opt(std::string_view key, int64_t* p) {
  return {key, Field::i64, p, false};
}
Field opt(std::string_view key, int32_t* p) {
  return {key, Field::i32, p, false};
}
Field opt(std::string_view key, std::optional<double>* p) {
  return {key, Field::opt_f64, p, false};
}
Field opt(std::string_view key, std::string* p) {
  return {key, Field::str, p, false};
}

const char* expected(Field::Kind k) {
  switch (k) {
    case Field::i64:
      return "an integer";
    case Field::i32:
      return "a 32-bit integer";
    case Field::u64:
      return "a non-negative integer";
    case Field::f64:
    case Field::opt_f64:
      return "a number (or \"NaN\", \"Infinity\", \"-Infinity\")";
    case Field::str:
      return "a string";
  }
  return "";
}

bool read_field(const Field& f, const JsonValue& v) {
  switch (f.kind) {
    case Field::i64:
      return v.get_int64(static_cast<int64_t*>(f.target));
    case Field::i32: {
      int64_t x;
      if (!v.get_int64(&x) || x < INT32_MIN || x > INT32_MAX) return false;
      *static_cast<int32_t*>(f.target) = static_cast<int32_t>(x);
      return true;
    }
    case Field::u64:
      return v.get_uint64(static_cast<uint64_t*>(f.target));
    case Field::f64:
      return json_double_from(v, static_cast<double*>(f.target));
    case Field::opt_f64: {
      double x;
      if (!json_double_from(v, &x)) return false;
      *static_cast<std::optional<double>*>(f.target) = x;
      return true;
    }
    case Field::str:
      return v.get_string(static_cast<std::string*>(f.target));
  }
  return false;
}

bool read_object(const JsonValue& v, std::string_view what, std::initializer_list<Field> fields,
                 std::string* error) {
  const auto fail = [&](const std::string& why) {
    if (error) *error = std::string(what) + ": " + why;
    return false;
  };
  if (v.type() != JsonValue::Type::object) return fail("expected an object");
  uint64_t seen = 0;  // bit i: fields[i] was present
  for (const auto& [key, value] : v.members()) {
    size_t i = 0;
    const Field* f = nullptr;
    for (const Field& candidate : fields) {
      if (candidate.key == key) {
        f = &candidate;
        break;
      }
      ++i;
    }
    if (!f) return fail("unknown key \"" + key + "\"");
    seen |= uint64_t{1} << i;
    if (value.is_null() && !f->required) continue;  // absent and null mean the same for optional keys
    if (!read_field(*f, value)) return fail("\"" + key + "\": expected " + expected(f->kind));
  }
  size_t i = 0;
  for (const Field& f : fields) {
    if (f.required && !(seen & (uint64_t{1} << i))) return fail("missing key \"" + std::string(f.key) + "\"");
    ++i;
  }
  return true;
}

template <class Record>
bool parse_record(std::string_view text, Record* out, std::string* error) {
  JsonValue v;
  if (!json_parse(text, &v, error)) return false;
  return record_read_json(v, out, error);
}

template <class Record>
std::string to_json(const Record& r) {
  JsonWriter w;
  record_write_json(w, r);
  return w.take();
}

void optional_double(JsonWriter& w, std::string_view key, const std::optional<double>& v) {
  if (!v) return;
  w.key(key);
  w.value_double(*v);
}

}  // namespace

void record_write_json(JsonWriter& w, const RankStepRecord& r) {
  w.begin_object();
  w.key("run_id");
  w.value_int(r.run_id);
  w.key("step");
  w.value_int(r.step);
  w.key("rank");
  w.value_int(r.rank);
  w.key("host");
  w.value_string(r.host);
  w.key("device");
  w.value_int(r.device);
  for (int p = 0; p < kPhaseCount; ++p) {
    w.key(std::string(phase_name(static_cast<Phase>(p))) + "_s");
    w.value_double(r.phases.get(static_cast<Phase>(p)));
  }
  w.key("total_s");
  w.value_double(r.total_s);
  w.key("tokens");
  w.value_int(r.tokens);
  w.key("mem_allocated_bytes");
  w.value_uint(r.mem_allocated_bytes);
  w.key("mem_peak_bytes");
  w.value_uint(r.mem_peak_bytes);
  optional_double(w, "temperature_celsius", r.temperature_celsius);
  optional_double(w, "sm_clock_hertz", r.sm_clock_hertz);
  optional_double(w, "power_watts", r.power_watts);
  optional_double(w, "mfu", r.mfu);
  optional_double(w, "hfu", r.hfu);
  w.end_object();
}

void record_write_json(JsonWriter& w, const StepRecord& r) {
  w.begin_object();
  w.key("run_id");
  w.value_int(r.run_id);
  w.key("step");
  w.value_int(r.step);
  w.key("time_unix_s");
  w.value_double(r.time_unix_s);
  w.key("loss");
  w.value_double(r.loss);
  w.key("grad_norm");
  w.value_double(r.grad_norm);
  w.key("lr");
  w.value_double(r.lr);
  w.key("tokens_per_s");
  w.value_double(r.tokens_per_s);
  w.key("step_s");
  w.value_double(r.step_s);
  optional_double(w, "mfu", r.mfu);
  optional_double(w, "hfu", r.hfu);
  optional_double(w, "val_loss", r.val_loss);
  w.end_object();
}

void record_write_json(JsonWriter& w, const EventRecord& r) {
  w.begin_object();
  w.key("run_id");
  w.value_int(r.run_id);
  w.key("time_unix_s");
  w.value_double(r.time_unix_s);
  w.key("step");
  w.value_int(r.step);
  w.key("kind");
  w.value_string(r.kind);
  w.key("rank");
  w.value_int(r.rank);
  w.key("node");
  w.value_string(r.node);
  w.key("message");
  w.value_string(r.message);
  w.key("payload");
  w.value_string(r.payload);
  w.end_object();
}

bool record_read_json(const JsonValue& v, RankStepRecord* out, std::string* error) {
  RankStepRecord r;
  PhaseSeconds& p = r.phases;
  if (!read_object(v, "rank-step record",
                   {req("run_id", &r.run_id),
                    req("step", &r.step),
                    req("rank", &r.rank),
                    req("host", &r.host),
                    req("device", &r.device),
                    req("data_wait_s", &p.data_wait),
                    req("forward_s", &p.forward),
                    req("backward_s", &p.backward),
                    req("optimizer_s", &p.optimizer),
                    req("comm_exposed_s", &p.comm_exposed),
                    req("checkpoint_stall_s", &p.checkpoint_stall),
                    req("total_s", &r.total_s),
                    req("tokens", &r.tokens),
                    req("mem_allocated_bytes", &r.mem_allocated_bytes),
                    req("mem_peak_bytes", &r.mem_peak_bytes),
                    opt("temperature_celsius", &r.temperature_celsius),
                    opt("sm_clock_hertz", &r.sm_clock_hertz),
                    opt("power_watts", &r.power_watts),
                    opt("mfu", &r.mfu),
                    opt("hfu", &r.hfu)},
                   error)) {
    return false;
  }
  *out = std::move(r);
  return true;
}

bool record_read_json(const JsonValue& v, StepRecord* out, std::string* error) {
  StepRecord r;
  if (!read_object(v, "step record",
                   {req("run_id", &r.run_id), req("step", &r.step), req("time_unix_s", &r.time_unix_s),
                    req("loss", &r.loss), req("grad_norm", &r.grad_norm), req("lr", &r.lr),
                    req("tokens_per_s", &r.tokens_per_s), req("step_s", &r.step_s), opt("mfu", &r.mfu),
                    opt("hfu", &r.hfu), opt("val_loss", &r.val_loss)},
                   error)) {
    return false;
  }
  *out = r;
  return true;
}

bool record_read_json(const JsonValue& v, EventRecord* out, std::string* error) {
  EventRecord r;
  if (!read_object(v, "event",
                   {req("run_id", &r.run_id), req("time_unix_s", &r.time_unix_s), opt("step", &r.step),
                    req("kind", &r.kind), opt("rank", &r.rank), opt("node", &r.node),
                    opt("message", &r.message), opt("payload", &r.payload)},
                   error)) {
    return false;
  }
  *out = std::move(r);
  return true;
}

std::string record_to_json(const RankStepRecord& r) {
  return to_json(r);
}
std::string record_to_json(const StepRecord& r) {
  return to_json(r);
}
std::string record_to_json(const EventRecord& r) {
  return to_json(r);
}

std::string record_to_json(const RecordBatch& b) {
  JsonWriter w;
  w.begin_object();
  w.key("rank_steps");
  w.begin_array();
  for (const RankStepRecord& r : b.rank_steps) record_write_json(w, r);
  w.end_array();
  w.key("steps");
  w.begin_array();
  for (const StepRecord& r : b.steps) record_write_json(w, r);
  w.end_array();
  w.key("events");
  w.begin_array();
  for (const EventRecord& r : b.events) record_write_json(w, r);
  w.end_array();
  w.end_object();
  return w.take();
}

bool record_from_json(std::string_view text, RankStepRecord* out, std::string* error) {
  return parse_record(text, out, error);
}
bool record_from_json(std::string_view text, StepRecord* out, std::string* error) {
  return parse_record(text, out, error);
}
bool record_from_json(std::string_view text, EventRecord* out, std::string* error) {
  return parse_record(text, out, error);
}

bool record_from_json(std::string_view text, RecordBatch* out, std::string* error) {
  JsonValue v;
  if (!json_parse(text, &v, error)) return false;
  if (v.type() != JsonValue::Type::object) {
    if (error) *error = "batch: expected an object";
    return false;
  }
  RecordBatch b;
  // Reads one array of records; `index` names the failing element in the error.
  const auto read_array = [&](const JsonValue& arr, std::string_view key, auto* records) {
    if (arr.type() != JsonValue::Type::array) {
      if (error) *error = "batch: \"" + std::string(key) + "\": expected an array";
      return false;
    }
    records->resize(arr.items().size());
    for (size_t i = 0; i < arr.items().size(); ++i) {
      std::string why;
      if (!record_read_json(arr.items()[i], &(*records)[i], &why)) {
        if (error) *error = "batch: \"" + std::string(key) + "\"[" + std::to_string(i) + "]: " + why;
        return false;
      }
    }
    return true;
  };
  for (const auto& [key, value] : v.members()) {
    bool ok;
    if (key == "rank_steps")
      ok = read_array(value, key, &b.rank_steps);
    else if (key == "steps")
      ok = read_array(value, key, &b.steps);
    else if (key == "events")
      ok = read_array(value, key, &b.events);
    else {
      if (error) *error = "batch: unknown key \"" + key + "\"";
      return false;
    }
    if (!ok) return false;
  }
  *out = std::move(b);
  return true;
}

}  // namespace gantry
