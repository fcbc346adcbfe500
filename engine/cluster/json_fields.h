// Strict reading of a JSON object's fields, for the HTTP API's request bodies: each error names the field
// and says what would be right, and a field the route does not know is an error too (a misspelt "dp"
// must not silently become the default). The first error wins; later reads return nothing.
//
//   JsonFields f(req.body);                                   // the request's JSON object
//   std::optional<std::string> ckpt = f.string("checkpoint", JsonFields::optional);
//   std::optional<int64_t> dp = f.integer("dp", 1, 65536);
//   if (Status s = f.finish(); !s.ok()) return HttpResponse::error(400, s.message());
//   // 'field "dp": expected an integer in [1, 65536], got "four" (a string)'
//
// Nested objects read with a prefix, so the message names the path: JsonFields layout(*obj, "layout.").
#pragma once

#include <cstdint>
#include <exception>
#include <nlohmann/json.hpp>  // nlohmann::json
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "telemetry/status.h"

namespace gantry {

class JsonFields {
 public:
  enum Need { required, optional };

  // `object` must outlive this reader (a temporary cannot be passed). A value that is not an object is
  // the first error.
  explicit JsonFields(const nlohmann::json& object, std::string prefix = "");
  JsonFields(nlohmann::json&&, std::string = "") = delete;

  std::optional<std::string> string(std::string_view key, Need need = required);
  std::optional<int64_t> integer(std::string_view key, int64_t min, int64_t max, Need need = required);
  std::optional<double> number(std::string_view key, double min, double max, Need need = required);
  std::optional<bool> boolean(std::string_view key, Need need = required);
  // A nested object (read it with its own JsonFields and prefix "key."), or nullptr.
  const nlohmann::json* object(std::string_view key, Need need = required);
  // Any JSON value, unchecked (for payloads passed through as they are).
  const nlohmann::json* any(std::string_view key, Need need = required);

  // The first error, or a field present but never read ('unknown field "dpp" (known: checkpoint, dp)').
  Status finish() const;
  bool ok() const { return error_.empty(); }

 private:
  const nlohmann::json* find(std::string_view key, Need need, const char* expected);
  void fail(std::string_view key, const std::string& message);

  const nlohmann::json& object_;
  std::string prefix_;
  std::vector<std::string> known_;
  std::string error_;
};

// "a string", "an integer", "an object", ... : how an error names what it got.
std::string json_type_phrase(const nlohmann::json& v);

// nlohmann's what() starts with "[json.exception.parse_error.101] ": the reader wants what follows.
std::string json_error_text(const std::exception& e);

// Nesting deeper than this is refused when a document is read. nlohmann parses deep documents
// iteratively, but copying, comparing and dumping them recurse: an 80,000-deep array would overflow the
// stack long after the parse succeeded. No request or reply of ours nests deeper than 8.
inline constexpr int kJsonMaxDepth = 64;

// Parses JSON that came from outside (a request body, a reply, a manifest): at most `max_depth` levels
// of arrays and objects. The error says where it broke ("at byte 17: ...") or that it nests too deep.
Result<nlohmann::json> json_parse_bounded(std::string_view text, int max_depth = kJsonMaxDepth);

}  // namespace gantry
