#include "telemetry/json.h"

#include <charconv>
#include <cmath>
#include <limits>
#include <unordered_set>

namespace gantry {
namespace {

constexpr int kMaxDepth = 64;

// Length of the valid UTF-8 sequence starting at s[i], or 0 when it is not one (overlong forms,
// surrogates and code points past U+10FFFF included).
size_t utf8_sequence(std::string_view s, size_t i) {
  const auto b = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char c = b(i);
  if (c < 0x80) return 1;
  size_t n;
  uint32_t cp;
  if (c >= 0xC2 && c <= 0xDF) {
    n = 2;
    cp = c & 0x1F;
  } else if (c >= 0xE0 && c <= 0xEF) {
    n = 3;
    cp = c & 0x0F;
  } else if (c >= 0xF0 && c <= 0xF4) {
    n = 4;
    cp = c & 0x07;
  } else {
    return 0;
  }
  if (i + n > s.size()) return 0;
  for (size_t k = 1; k < n; ++k) {
    if ((b(i + k) & 0xC0) != 0x80) return 0;
    cp = (cp << 6) | (b(i + k) & 0x3F);
  }
  if ((n == 3 && cp < 0x800) || (n == 4 && cp < 0x10000) || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) {
    return 0;
  }
  return n;
}

void append_utf8(std::string* out, uint32_t cp) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

}  // namespace

class JsonParser {
 public:
  explicit JsonParser(std::string_view s) : s_(s) {}

  bool parse(JsonValue* out, std::string* error) {
    skip_space();
    if (value(out, 0)) {
      skip_space();
      if (i_ != s_.size()) fail("unexpected text after the JSON value");
    }
    if (!error_.empty()) {
      if (error) *error = error_ + " at offset " + std::to_string(i_);
      return false;
    }
    return true;
  }

 private:
  bool fail(const std::string& what) {
    if (error_.empty()) error_ = what;
    return false;
  }
  void skip_space() {
    while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\t' || s_[i_] == '\n' || s_[i_] == '\r')) ++i_;
  }
  bool literal(std::string_view word) {
    if (s_.substr(i_, word.size()) != word) return fail("invalid literal");
    i_ += word.size();
    return true;
  }

  bool value(JsonValue* v, int depth) {
    if (depth > kMaxDepth) return fail("nesting deeper than 64");
    if (i_ >= s_.size()) return fail("unexpected end of input");
    const char c = s_[i_];
    if (c == '{') return object(v, depth);
    if (c == '[') return array(v, depth);
    if (c == '"') {
      v->type_ = JsonValue::Type::string;
      return string(&v->text_);
    }
    if (c == 't' || c == 'f') {
      v->type_ = JsonValue::Type::boolean;
      v->bool_ = c == 't';
      return literal(c == 't' ? "true" : "false");
    }
    if (c == 'n') {
      v->type_ = JsonValue::Type::null;
      return literal("null");
    }
    if (c == '-' || (c >= '0' && c <= '9')) return number(v);
    return fail(std::string("unexpected character '") + c + "'");
  }

  bool object(JsonValue* v, int depth) {
    v->type_ = JsonValue::Type::object;
    std::unordered_set<std::string> seen;
    ++i_;  // {
    skip_space();
    if (i_ < s_.size() && s_[i_] == '}') {
      ++i_;
      return true;
    }
    while (true) {
      skip_space();
      if (i_ >= s_.size() || s_[i_] != '"') return fail("expected a string key");
      std::string key;
      if (!string(&key)) return false;
      // A linear scan is fastest for records' dozen keys; a set keeps a hostile object with many keys
      // from costing quadratic time.
      bool duplicate = false;
      if (v->members_.size() < 32) {
        for (const auto& m : v->members_) duplicate = duplicate || m.first == key;
      } else {
        if (seen.empty()) {
          for (const auto& m : v->members_) seen.insert(m.first);
        }
        duplicate = !seen.insert(key).second;
      }
      if (duplicate) return fail("duplicate key \"" + key + "\"");
      skip_space();
      if (i_ >= s_.size() || s_[i_] != ':') return fail("expected ':'");
      ++i_;
      skip_space();
      v->members_.emplace_back(std::move(key), JsonValue());
      if (!value(&v->members_.back().second, depth + 1)) return false;
      skip_space();
      if (i_ < s_.size() && s_[i_] == ',') {
        ++i_;
        continue;
      }
      if (i_ < s_.size() && s_[i_] == '}') {
        ++i_;
        return true;
      }
      return fail("expected ',' or '}'");
    }
  }

  bool array(JsonValue* v, int depth) {
    v->type_ = JsonValue::Type::array;
    ++i_;  // [
    skip_space();
    if (i_ < s_.size() && s_[i_] == ']') {
      ++i_;
      return true;
    }
    while (true) {
      skip_space();
      v->items_.emplace_back();
      if (!value(&v->items_.back(), depth + 1)) return false;
      skip_space();
      if (i_ < s_.size() && s_[i_] == ',') {
        ++i_;
        continue;
      }
      if (i_ < s_.size() && s_[i_] == ']') {
        ++i_;
        return true;
      }
      return fail("expected ',' or ']'");
    }
  }

  bool hex4(uint32_t* out) {
    if (i_ + 4 > s_.size()) return fail("truncated \\u escape");
    uint32_t x = 0;
    for (int k = 0; k < 4; ++k) {
      const char c = s_[i_++];
      x <<= 4;
      if (c >= '0' && c <= '9')
        x |= static_cast<uint32_t>(c - '0');
      else if (c >= 'a' && c <= 'f')
        x |= static_cast<uint32_t>(c - 'a' + 10);
      else if (c >= 'A' && c <= 'F')
        x |= static_cast<uint32_t>(c - 'A' + 10);
      else
        return fail("bad hex digit in \\u escape");
    }
    *out = x;
    return true;
  }

  bool string(std::string* out) {
    ++i_;  // opening quote
    out->clear();
    while (true) {
      if (i_ >= s_.size()) return fail("unterminated string");
      const char c = s_[i_];
      if (c == '"') {
        ++i_;
        return true;
      }
      if (static_cast<unsigned char>(c) < 0x20) return fail("control character in string");
      if (c != '\\') {
        const size_t n = utf8_sequence(s_, i_);
        if (n == 0) return fail("invalid UTF-8 in string");
        out->append(s_.substr(i_, n));
        i_ += n;
        continue;
      }
      if (++i_ >= s_.size()) return fail("unterminated escape");
      const char e = s_[i_++];
      switch (e) {
        case '"':
          out->push_back('"');
          break;
        case '\\':
          out->push_back('\\');
          break;
        case '/':
          out->push_back('/');
          break;
        case 'b':
          out->push_back('\b');
          break;
        case 'f':
          out->push_back('\f');
          break;
        case 'n':
          out->push_back('\n');
          break;
        case 'r':
          out->push_back('\r');
          break;
        case 't':
          out->push_back('\t');
          break;
        case 'u': {
          uint32_t cp;
          if (!hex4(&cp)) return false;
          if (cp >= 0xDC00 && cp <= 0xDFFF) return fail("lone low surrogate");
          if (cp >= 0xD800 && cp <= 0xDBFF) {
            uint32_t lo;
            if (s_.substr(i_, 2) != "\\u") return fail("high surrogate without its low half");
            i_ += 2;
            if (!hex4(&lo)) return false;
            if (lo < 0xDC00 || lo > 0xDFFF) return fail("high surrogate without its low half");
            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
          }
          append_utf8(out, cp);
          break;
        }
        default:
          return fail(std::string("unknown escape '\\") + e + "'");
      }
    }
  }

  bool number(JsonValue* v) {
    const size_t start = i_;
    const auto digit = [&] { return i_ < s_.size() && s_[i_] >= '0' && s_[i_] <= '9'; };
    if (s_[i_] == '-') ++i_;
    if (!digit()) return fail("expected a digit");
    if (s_[i_] == '0') {
      ++i_;
      if (digit()) return fail("leading zero in a number");
    } else {
      while (digit()) ++i_;
    }
    if (i_ < s_.size() && s_[i_] == '.') {
      ++i_;
      if (!digit()) return fail("expected a digit after '.'");
      while (digit()) ++i_;
    }
    if (i_ < s_.size() && (s_[i_] == 'e' || s_[i_] == 'E')) {
      ++i_;
      if (i_ < s_.size() && (s_[i_] == '+' || s_[i_] == '-')) ++i_;
      if (!digit()) return fail("expected a digit in the exponent");
      while (digit()) ++i_;
    }
    v->type_ = JsonValue::Type::number;
    v->text_.assign(s_.substr(start, i_ - start));
    return true;
  }

  std::string_view s_;
  size_t i_ = 0;
  std::string error_;
};

bool json_parse(std::string_view text, JsonValue* out, std::string* error) {
  *out = JsonValue();
  JsonParser p(text);
  if (p.parse(out, error)) return true;
  *out = JsonValue();
  return false;
}

bool JsonValue::get_bool(bool* out) const {
  if (type_ != Type::boolean) return false;
  *out = bool_;
  return true;
}

bool JsonValue::get_int64(int64_t* out) const {
  if (type_ != Type::number) return false;
  int64_t x;
  const char* end = text_.data() + text_.size();
  auto [p, ec] = std::from_chars(text_.data(), end, x);
  if (ec != std::errc() || p != end) return false;  // fraction, exponent, or out of range
  *out = x;
  return true;
}

bool JsonValue::get_uint64(uint64_t* out) const {
  if (type_ != Type::number || text_.empty() || text_[0] == '-') return false;
  uint64_t x;
  const char* end = text_.data() + text_.size();
  auto [p, ec] = std::from_chars(text_.data(), end, x);
  if (ec != std::errc() || p != end) return false;
  *out = x;
  return true;
}

bool JsonValue::get_double(double* out) const {
  if (type_ != Type::number) return false;
  double x;
  const char* end = text_.data() + text_.size();
  auto [p, ec] = std::from_chars(text_.data(), end, x);  // locale-independent, unlike strtod
  if (ec != std::errc() || p != end) return false;       // out of double range
  *out = x;
  return true;
}

bool JsonValue::get_string(std::string* out) const {
  if (type_ != Type::string) return false;
  *out = text_;
  return true;
}

const JsonValue* JsonValue::find(std::string_view key) const {
  for (const auto& m : members_) {
    if (m.first == key) return &m.second;
  }
  return nullptr;
}

bool json_double_from(const JsonValue& v, double* out) {
  if (v.get_double(out)) return true;
  std::string s;
  if (!v.get_string(&s)) return false;
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

void JsonWriter::separate() {
  if (need_comma_) out_.push_back(',');
  need_comma_ = true;
}

void JsonWriter::begin_object() {
  separate();
  out_.push_back('{');
  need_comma_ = false;
}

void JsonWriter::end_object() {
  out_.push_back('}');
  need_comma_ = true;
}

void JsonWriter::begin_array() {
  separate();
  out_.push_back('[');
  need_comma_ = false;
}

void JsonWriter::end_array() {
  out_.push_back(']');
  need_comma_ = true;
}

void JsonWriter::key(std::string_view k) {
  value_string(k);
  out_.push_back(':');
  need_comma_ = false;
}

void JsonWriter::value_null() {
  separate();
  out_ += "null";
}

void JsonWriter::value_bool(bool v) {
  separate();
  out_ += v ? "true" : "false";
}

void JsonWriter::value_int(int64_t v) {
  separate();
  char buf[24];
  auto [p, ec] = std::to_chars(buf, buf + sizeof buf, v);
  out_.append(buf, p);
}

void JsonWriter::value_uint(uint64_t v) {
  separate();
  char buf[24];
  auto [p, ec] = std::to_chars(buf, buf + sizeof buf, v);
  out_.append(buf, p);
}

void JsonWriter::value_double(double v) {
  if (std::isnan(v)) return value_string("NaN");
  if (std::isinf(v)) return value_string(v > 0 ? "Infinity" : "-Infinity");
  separate();
  char buf[32];
  // Whole numbers as integers ("500000", not the shorter "5e+05"), the rest in the shortest form that
  // reads back exactly. -0 keeps its sign.
  const bool whole = std::fabs(v) < 1e15 && v == std::trunc(v) && !(v == 0 && std::signbit(v));
  auto [p, ec] = whole ? std::to_chars(buf, buf + sizeof buf, static_cast<int64_t>(v))
                       : std::to_chars(buf, buf + sizeof buf, v);
  out_.append(buf, p);
}

void JsonWriter::value_string(std::string_view v) {
  separate();
  out_.push_back('"');
  static constexpr char kHex[] = "0123456789abcdef";
  for (size_t i = 0; i < v.size();) {
    const unsigned char c = static_cast<unsigned char>(v[i]);
    if (c == '"' || c == '\\') {
      out_.push_back('\\');
      out_.push_back(static_cast<char>(c));
    } else if (c == '\n') {
      out_ += "\\n";
    } else if (c == '\t') {
      out_ += "\\t";
    } else if (c == '\r') {
      out_ += "\\r";
    } else if (c < 0x20) {
      out_ += "\\u00";
      out_.push_back(kHex[c >> 4]);
      out_.push_back(kHex[c & 0xF]);
    } else if (c >= 0x80) {
      const size_t n = utf8_sequence(v, i);
      if (n == 0) {
        out_ += "\xEF\xBF\xBD";  // U+FFFD for a byte that starts no valid sequence
        ++i;
      } else {
        out_.append(v.substr(i, n));
        i += n;
      }
      continue;
    } else {
      out_.push_back(static_cast<char>(c));
    }
    ++i;
  }
  out_.push_back('"');
}

}  // namespace gantry
