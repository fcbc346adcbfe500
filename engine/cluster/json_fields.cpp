#include "engine/cluster/json_fields.h"

#include <algorithm>
#include <cmath>
#include <set>

namespace gantry {
namespace {

// The value as the client sent it, cut short: enough to recognise, never a whole document.
std::string preview(const nlohmann::json& v) {
  std::string s = v.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  constexpr size_t kMax = 40;
  if (s.size() > kMax) s = s.substr(0, kMax) + "...";
  return s;
}

std::string got(const nlohmann::json& v) {
  return ", got " + preview(v) + " (" + json_type_phrase(v) + ")";
}

std::string range(int64_t min, int64_t max) {
  return "[" + std::to_string(min) + ", " + std::to_string(max) + "]";
}

std::string range(double min, double max) {
  auto fmt = [](double x) { return nlohmann::json(x).dump(); };  // shortest form that reads back the same
  return "[" + fmt(min) + ", " + fmt(max) + "]";
}

struct TooDeep {};
struct DuplicateKey {
  std::string key;
};

// A key as an error names it: cut short, like a value (a 100 KB key is not echoed back whole).
std::string key_preview(std::string_view key) {
  constexpr size_t kMax = 40;
  std::string s = nlohmann::json(std::string(key.substr(0, kMax)))
                      .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  s = s.substr(1, s.size() - 2);  // without the quotes: the message puts its own
  return key.size() > kMax ? s + "..." : s;
}

}  // namespace

std::string json_error_text(const std::exception& e) {
  std::string s = e.what();
  if (!s.empty() && s.front() == '[') {
    const size_t close = s.find("] ");
    if (close != std::string::npos) s.erase(0, close + 2);
  }
  return s;
}

Result<nlohmann::json> json_parse_bounded(std::string_view text, int max_depth) {
  // The callback sees each value's depth as it opens, so the parse stops at the first level too many,
  // before anything that deep exists. It also sees each object's keys: a key given twice is refused, where
  // nlohmann would keep the last silently ({"layout": {"dp": 1}, "layout": {"dp": 99}} must not be dp 99
  // to the server and dp 1 to whoever reads the request).
  using Event = nlohmann::json::parse_event_t;
  std::vector<std::set<std::string>> keys;  // the keys of each object being read, innermost last (a set:
                                            // a 1 MiB body holds ~100,000 keys)
  auto guard = [max_depth, &keys](int depth, Event event, nlohmann::json& parsed) {
    if ((event == Event::object_start || event == Event::array_start) && depth >= max_depth) throw TooDeep{};
    if (event == Event::object_start) keys.emplace_back();
    if (event == Event::object_end && !keys.empty()) keys.pop_back();
    if (event == Event::key && !keys.empty()) {
      if (!keys.back().insert(parsed.get<std::string>()).second)
        throw DuplicateKey{parsed.get<std::string>()};
    }
    return true;
  };
  try {
    return nlohmann::json::parse(text.begin(), text.end(), guard);
  } catch (const TooDeep&) {
    return Status::error("nested deeper than " + std::to_string(max_depth) + " levels of arrays and objects");
  } catch (const DuplicateKey& d) {
    return Status::error("field \"" + key_preview(d.key) + "\" is given twice in one object: give it once");
  } catch (const nlohmann::json::exception& e) {
    return Status::error(json_error_text(e));
  }
}

std::string json_type_phrase(const nlohmann::json& v) {
  switch (v.type()) {
    case nlohmann::json::value_t::null:
      return "null";
    case nlohmann::json::value_t::object:
      return "an object";
    case nlohmann::json::value_t::array:
      return "an array";
    case nlohmann::json::value_t::string:
      return "a string";
    case nlohmann::json::value_t::boolean:
      return "a boolean";
    case nlohmann::json::value_t::number_integer:
    case nlohmann::json::value_t::number_unsigned:
      return "an integer";
    case nlohmann::json::value_t::number_float:
      return "a number";
    case nlohmann::json::value_t::binary:
      return "binary";
    case nlohmann::json::value_t::discarded:
      return "nothing";
  }
  return "a value";
}

JsonFields::JsonFields(const nlohmann::json& object, std::string prefix)
    : object_(object), prefix_(std::move(prefix)) {
  if (!object_.is_object()) {
    error_ =
        (prefix_.empty() ? std::string("request body")
                         : "field \"" + prefix_.substr(0, prefix_.size() - (prefix_.back() == '.')) + "\"") +
        ": expected a JSON object" + got(object_);
  }
}

void JsonFields::fail(std::string_view key, const std::string& message) {
  if (error_.empty()) error_ = "field \"" + prefix_ + std::string(key) + "\": " + message;
}

const nlohmann::json* JsonFields::find(std::string_view key, Need need, const char* expected) {
  known_.emplace_back(key);
  if (!error_.empty()) return nullptr;
  auto it = object_.find(key);
  if (it == object_.end()) {
    if (need == required) fail(key, std::string("missing; expected ") + expected);
    return nullptr;
  }
  return &*it;
}

std::optional<std::string> JsonFields::string(std::string_view key, Need need) {
  const nlohmann::json* v = find(key, need, "a string");
  if (!v) return std::nullopt;
  if (!v->is_string()) {
    fail(key, "expected a string" + got(*v));
    return std::nullopt;
  }
  return v->get<std::string>();
}

std::optional<int64_t> JsonFields::integer(std::string_view key, int64_t min, int64_t max, Need need) {
  const std::string expected = "an integer in " + range(min, max);
  const nlohmann::json* v = find(key, need, expected.c_str());
  if (!v) return std::nullopt;
  int64_t x = 0;
  if (v->is_number_integer()) {
    x = v->get<int64_t>();
    // An unsigned value above INT64_MAX wraps when read as int64_t: it is out of range whatever max is.
    if (v->is_number_unsigned() && v->get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) {
      fail(key, "expected " + expected + got(*v));
      return std::nullopt;
    }
  } else if (v->is_number_float() && std::nearbyint(v->get<double>()) == v->get<double>() &&
             std::fabs(v->get<double>()) < 9.0e15) {
    x = static_cast<int64_t>(v->get<double>());  // 4.0 is an integer; 4.5 is not
  } else {
    fail(key, "expected " + expected + got(*v));
    return std::nullopt;
  }
  if (x < min || x > max) {
    fail(key, "expected " + expected + got(*v));
    return std::nullopt;
  }
  return x;
}

std::optional<double> JsonFields::number(std::string_view key, double min, double max, Need need) {
  const std::string expected = "a number in " + range(min, max);
  const nlohmann::json* v = find(key, need, expected.c_str());
  if (!v) return std::nullopt;
  if (!v->is_number() || !(v->get<double>() >= min && v->get<double>() <= max)) {
    fail(key, "expected " + expected + got(*v));
    return std::nullopt;
  }
  return v->get<double>();
}

std::optional<bool> JsonFields::boolean(std::string_view key, Need need) {
  const nlohmann::json* v = find(key, need, "true or false");
  if (!v) return std::nullopt;
  if (!v->is_boolean()) {
    fail(key, "expected true or false" + got(*v));
    return std::nullopt;
  }
  return v->get<bool>();
}

const nlohmann::json* JsonFields::object(std::string_view key, Need need) {
  const nlohmann::json* v = find(key, need, "an object");
  if (!v) return nullptr;
  if (!v->is_object()) {
    fail(key, "expected an object" + got(*v));
    return nullptr;
  }
  return v;
}

const nlohmann::json* JsonFields::any(std::string_view key, Need need) {
  return find(key, need, "a value");
}

Status JsonFields::finish() const {
  if (!error_.empty()) return Status::error(error_);
  for (auto it = object_.begin(); it != object_.end(); ++it) {
    if (std::find(known_.begin(), known_.end(), it.key()) != known_.end()) continue;
    std::string known;
    std::vector<std::string> sorted = known_;
    std::sort(sorted.begin(), sorted.end());
    sorted.erase(std::unique(sorted.begin(), sorted.end()), sorted.end());
    for (const std::string& k : sorted) known += (known.empty() ? "" : ", ") + k;
    return Status::error(
        "unknown field \"" + prefix_ + key_preview(it.key()) + "\"" +
        (known.empty() ? std::string(" (this request takes no fields)") : " (known: " + known + ")"));
  }
  return Status();
}

}  // namespace gantry
