// A small TOML reader for Gantry's config files (the GPU machines lack tomlplusplus). It accepts the subset
// our configs use and refuses everything else with "<source>:<line>: <problem>", so a config never loads
// with a value it did not mean.
//
// Accepted: `#` comments, blank lines, `[table]` and `[dotted.table]` headers, `key = value` with bare keys
// (A-Za-z0-9_-). Values: "basic" strings (escapes \" \\ \n \t), 'literal' strings, integers (+7, -3,
// 1_000_000), floats (1.5, -2e-3, 1.0E+2), true/false, and one-line arrays of one kind of those scalars.
// Refused: dates and times, inline tables, multi-line strings and arrays, arrays of tables, quoted and
// dotted keys, hex/octal/binary integers, inf and nan, other escapes.
//
//   Result<TomlDocument> doc = toml_parse_file("configs/tiny.toml");
//   if (!doc.ok()) return doc.status();  // "configs/tiny.toml:7: duplicate key 'model.n_layer' (...)"
//   const TomlValue* v = doc->find("model.n_layer");
//   if (v && v->kind != TomlValue::Kind::kInt)
//     return Status::error(doc->location(*v) + ": model.n_layer must be an integer, not " +
//                          toml_kind_name(v->kind));
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "telemetry/status.h"

namespace gantry {

struct TomlValue {
  enum class Kind { kString, kInt, kFloat, kBool, kArray };
  Kind kind = Kind::kString;
  // Only the field matching `kind` is meaningful.
  std::string s;
  int64_t i = 0;
  double f = 0.0;
  bool b = false;
  std::vector<TomlValue> array;  // elements all share one scalar kind
  int line = 0;                  // 1-based line in the source, for messages
};

struct TomlDocument {
  std::string source;  // the name messages use, e.g. the file path
  // Fully qualified keys ("model.n_layer"), in file order, each exactly once.
  std::vector<std::pair<std::string, TomlValue>> entries;
  // The [table] headers, in file order ("model", "a.b"), including those with no key under them.
  std::vector<std::string> tables;

  // The value for a fully qualified key, or null. A linear scan: config files hold tens of keys.
  const TomlValue* find(std::string_view key) const;
  // "<source>:<line>" of a value, so callers' messages point at the line they complain about.
  std::string location(const TomlValue& value) const;
};

// Parses `text`; `source_name` starts every error message ("tiny.toml:12: ...").
Result<TomlDocument> toml_parse(std::string_view text, std::string_view source_name);
// Reads and parses a file; the file path is the source name. Fails naming the path if it cannot be read.
Result<TomlDocument> toml_parse_file(const std::string& path);
// "string", "integer", "float", "boolean" or "array".
std::string toml_kind_name(TomlValue::Kind kind);

}  // namespace gantry
