// A small strict JSON reader and writer for telemetry's API forms. telemetry/ may use nothing but the
// standard library (the GPU machines build it alone), and the records need exact numbers: integers are
// kept as their text until asked for as int64, and doubles are printed in their shortest round-trip form.
//
//   JsonValue v;
//   std::string error;
//   if (!json_parse(text, &v, &error)) return fail(error);   // RFC 8259, nothing more
//   const JsonValue* step = v.find("step");
//   int64_t s;
//   if (!step || !step->get_int64(&s)) return fail("step: expected an integer");
//
//   JsonWriter w;
//   w.begin_object();
//   w.key("step"); w.value_int(s);
//   w.end_object();
//   send(w.text());
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace gantry {

class JsonValue {
 public:
  enum class Type { null, boolean, number, string, array, object };

  Type type() const { return type_; }
  bool is_null() const { return type_ == Type::null; }
  // Numbers: get_int64 refuses fractions, exponents and out-of-range values; get_double takes any
  // number. Both return false (leaving *out alone) when the value is of another type.
  bool get_bool(bool* out) const;
  bool get_int64(int64_t* out) const;
  bool get_uint64(uint64_t* out) const;
  bool get_double(double* out) const;
  bool get_string(std::string* out) const;

  const std::vector<JsonValue>& items() const { return items_; }                              // arrays
  const std::vector<std::pair<std::string, JsonValue>>& members() const { return members_; }  // objects
  const JsonValue* find(std::string_view key) const;  // objects; nullptr when absent

 private:
  friend class JsonParser;
  Type type_ = Type::null;
  bool bool_ = false;
  std::string text_;  // a string's value, or a number's lexeme
  std::vector<JsonValue> items_;
  std::vector<std::pair<std::string, JsonValue>> members_;
};

// Parses one JSON text: whitespace around one value, nothing after. Duplicate object keys, lone
// surrogates, invalid UTF-8, control characters in strings and nesting deeper than 64 are errors.
bool json_parse(std::string_view text, JsonValue* out, std::string* error);

// Appends JSON to a string. The caller keeps the structure balanced; commas are placed for it.
class JsonWriter {
 public:
  void begin_object();
  void end_object();
  void begin_array();
  void end_array();
  void key(std::string_view k);
  void value_null();
  void value_bool(bool v);
  void value_int(int64_t v);
  void value_uint(uint64_t v);
  // Finite doubles in shortest round-trip form; NaN and the infinities as the strings "NaN",
  // "Infinity" and "-Infinity" (protobuf's JSON mapping), which json_double_from() reads back.
  void value_double(double v);
  // Invalid UTF-8 is replaced by U+FFFD so the output is always valid JSON.
  void value_string(std::string_view v);

  const std::string& text() const { return out_; }
  std::string take() { return std::move(out_); }

 private:
  void separate();
  std::string out_;
  bool need_comma_ = false;
};

// A double field as JsonWriter::value_double writes it: a number, or one of the three strings.
bool json_double_from(const JsonValue& v, double* out);

}  // namespace gantry
