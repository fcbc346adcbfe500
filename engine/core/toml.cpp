#include "engine/core/toml.h"

#include <cerrno>
#include <charconv>  // std::from_chars for doubles: locale-independent, unlike strtod
#include <cstdio>
#include <system_error>
#include <unordered_map>

#include "engine/core/input_excerpt.h"

namespace gantry {
namespace {

constexpr std::string_view kValueHint =
    "expected a quoted string, a number, true/false or a one-line [array]";
constexpr std::string_view kNumberHint =
    "expected an integer like 42, -7 or 1_000, or a float like 1.5, -2e-3 or 1.0E+2";

bool is_space(char c) {
  return c == ' ' || c == '\t';
}
bool is_digit(char c) {
  return c >= '0' && c <= '9';
}
bool is_bare_key_char(char c) {
  return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || is_digit(c) || c == '_' || c == '-';
}
// Characters a number, boolean or date can be made of. Scanning all of them as one token makes "12abc" a
// malformed number rather than the number 12 followed by garbage.
bool is_token_char(char c) {
  return is_bare_key_char(c) || c == '+' || c == '.' || c == ':';
}

bool starts_with_digits(std::string_view s, size_t n) {
  if (s.size() < n) return false;
  for (size_t k = 0; k < n; ++k)
    if (!is_digit(s[k])) return false;
  return true;
}

// Reads one run of digits in which '_' may only sit between two digits. Appends the digits to `out`.
bool digits_read(std::string_view tok, size_t& pos, std::string& out) {
  if (pos >= tok.size() || !is_digit(tok[pos])) return false;
  while (pos < tok.size()) {
    if (is_digit(tok[pos])) {
      out += tok[pos++];
    } else if (tok[pos] == '_' && pos + 1 < tok.size() && is_digit(tok[pos + 1])) {
      ++pos;
    } else {
      break;
    }
  }
  return true;
}

class Parser {
 public:
  Parser(std::string_view text, std::string_view source)
      : text_(text), source_(source.empty() ? std::string("<toml>") : std::string(source)) {}

  Result<TomlDocument> run() {
    doc_.source = source_;
    // A UTF-8 byte order mark is invisible in editors; tolerate it rather than report garbage on line 1.
    if (text_.substr(0, 3) == "\xEF\xBB\xBF") text_.remove_prefix(3);
    size_t start = 0;
    while (start <= text_.size()) {
      size_t end = text_.find('\n', start);
      if (end == std::string_view::npos) end = text_.size();
      line_ = text_.substr(start, end - start);
      if (!line_.empty() && line_.back() == '\r') line_.remove_suffix(1);
      ++line_no_;
      pos_ = 0;
      Status st = line_parse();
      if (!st.ok()) return st;
      start = end + 1;
    }
    return std::move(doc_);
  }

 private:
  Status fail(std::string_view problem) const {
    return Status::error(source_ + ":" + std::to_string(line_no_) + ": " + std::string(problem));
  }

  bool at_end() const { return pos_ >= line_.size(); }
  char peek() const { return at_end() ? '\0' : line_[pos_]; }
  bool at_line_end_or_comment() const { return at_end() || line_[pos_] == '#'; }
  void spaces_skip() {
    while (!at_end() && is_space(line_[pos_])) ++pos_;
  }
  bool rest_starts_with(std::string_view s) const { return line_.substr(pos_).substr(0, s.size()) == s; }

  // A short quoted excerpt of the line from the cursor on, for "found '...'" in messages.
  std::string excerpt() const {
    if (at_end()) return "end of line";
    std::string_view rest = line_.substr(pos_);
    while (!rest.empty() && is_space(rest.back())) rest.remove_suffix(1);
    return "'" + input_excerpt(rest) + "'";
  }

  std::string bare_key_scan() {
    const size_t begin = pos_;
    while (!at_end() && is_bare_key_char(line_[pos_])) ++pos_;
    return std::string(line_.substr(begin, pos_ - begin));
  }

  Status line_parse() {
    spaces_skip();
    if (at_line_end_or_comment()) return Status();
    if (peek() == '[') return header_parse();
    return key_value_parse();
  }

  Status header_parse() {
    ++pos_;  // '['
    if (peek() == '[')
      return fail("arrays of tables ([[...]]) are unsupported in this subset; use [table] headers");
    std::string name;
    for (;;) {
      spaces_skip();
      if (peek() == '"' || peek() == '\'')
        return fail(
            "quoted table names are unsupported in this subset; use bare names (letters, digits, '_', '-')");
      const std::string part = bare_key_scan();
      if (part.empty()) {
        if (name.empty() && peek() == ']')
          return fail("empty table header []; expected a name such as [model]");
        return fail("expected a table name part (letters, digits, '_' or '-') in the header, found " +
                    excerpt());
      }
      name += part;
      spaces_skip();
      if (peek() == '.') {
        name += '.';
        ++pos_;
        continue;
      }
      if (peek() == ']') {
        ++pos_;
        break;
      }
      if (at_end())
        return fail("unterminated table header [" + input_excerpt(name) +
                    ": expected ']' before end of line");
      return fail("expected '.' or ']' in table header [" + input_excerpt(name) + ", found " + excerpt());
    }
    spaces_skip();
    if (!at_line_end_or_comment())
      return fail("unexpected " + excerpt() + " after table header [" + input_excerpt(name) +
                  "]; expected a comment (#) or end of line");

    if (auto it = explicit_tables_.find(name); it != explicit_tables_.end())
      return fail("duplicate table [" + input_excerpt(name) + "] (first defined on line " +
                  std::to_string(it->second) + ")");
    // Every prefix of the name is a table; none of them may already hold a value.
    for (size_t dot = 0;; ++dot) {
      dot = name.find('.', dot);
      const std::string prefix = name.substr(0, dot);
      if (auto it = value_lines_.find(prefix); it != value_lines_.end())
        return fail("table [" + input_excerpt(name) + "] conflicts with key '" + input_excerpt(prefix) +
                    "' set on line " + std::to_string(it->second) +
                    "; a name cannot be both a value and a table");
      if (dot == std::string::npos) break;
      implied_tables_.emplace(prefix, line_no_);
    }
    explicit_tables_.emplace(name, line_no_);
    doc_.tables.push_back(name);
    table_ = name;
    return Status();
  }

  Status key_value_parse() {
    if (peek() == '"' || peek() == '\'')
      return fail("quoted keys are unsupported in this subset; use a bare key (letters, digits, '_', '-')");
    const size_t key_begin = pos_;
    const std::string key = bare_key_scan();
    if (key.empty())
      return fail("expected a key (letters, digits, '_' or '-') or a [table] header, found " + excerpt());
    spaces_skip();
    if (peek() == '.') {
      std::string_view dotted = line_.substr(key_begin, line_.find('=', key_begin) - key_begin);
      while (!dotted.empty() && is_space(dotted.back())) dotted.remove_suffix(1);
      return fail("dotted key '" + input_excerpt(dotted) +
                  "' is unsupported in this subset; put the key under a [" +
                  input_excerpt(table_.empty() ? key : table_ + "." + key) + "] table header");
    }
    if (peek() != '=') return fail("expected '=' after key '" + input_excerpt(key) + "', found " + excerpt());
    ++pos_;
    spaces_skip();
    if (at_line_end_or_comment())
      return fail("missing value after '" + input_excerpt(key) + " ='; " + std::string(kValueHint));

    Result<TomlValue> value = value_parse(/*in_array=*/false);
    if (!value.ok()) return value.status();
    spaces_skip();
    if (!at_line_end_or_comment())
      return fail("unexpected " + excerpt() + " after the value of '" + input_excerpt(key) +
                  "'; expected a comment (#) or end of line");

    std::string full = table_.empty() ? key : table_ + "." + key;
    if (auto it = value_lines_.find(full); it != value_lines_.end())
      return fail("duplicate key '" + input_excerpt(full) + "' (first set on line " +
                  std::to_string(it->second) + ")");
    if (const int table_line = table_line_find(full); table_line > 0)
      return fail("key '" + input_excerpt(full) + "' conflicts with table [" + input_excerpt(full) +
                  "] from the header on line " + std::to_string(table_line) +
                  "; a name cannot be both a value and a table");
    value_lines_.emplace(full, line_no_);
    doc_.entries.emplace_back(std::move(full), std::move(value).value());
    return Status();
  }

  // The line of the header that made `name` a table, explicitly or as a parent; 0 if it is not one.
  int table_line_find(const std::string& name) const {
    if (auto it = explicit_tables_.find(name); it != explicit_tables_.end()) return it->second;
    if (auto it = implied_tables_.find(name); it != implied_tables_.end()) return it->second;
    return 0;
  }

  Result<TomlValue> value_parse(bool in_array) {
    const char c = peek();
    if (c == '"') {
      if (rest_starts_with("\"\"\""))
        return fail("multi-line strings (\"\"\") are unsupported in this subset");
      return string_parse('"');
    }
    if (c == '\'') {
      if (rest_starts_with("'''"))
        return fail("multi-line literal strings (''') are unsupported in this subset");
      return string_parse('\'');
    }
    if (c == '[') {
      if (in_array) return fail("nested arrays are unsupported in this subset; arrays hold scalars only");
      return array_parse();
    }
    if (c == '{') return fail("inline tables ({...}) are unsupported in this subset; use a [table] header");

    const size_t begin = pos_;
    while (!at_end() && is_token_char(line_[pos_])) ++pos_;
    const std::string_view tok = line_.substr(begin, pos_ - begin);
    if (tok.empty()) return fail("unknown value syntax " + excerpt() + "; " + std::string(kValueHint));
    return scalar_classify(tok);
  }

  Result<TomlValue> scalar_classify(std::string_view tok) {
    TomlValue v;
    v.line = line_no_;
    if (tok == "true" || tok == "false") {
      v.kind = TomlValue::Kind::kBool;
      v.b = tok == "true";
      return v;
    }
    if ((starts_with_digits(tok, 4) && tok.size() > 4 && tok[4] == '-') ||
        (starts_with_digits(tok, 2) && tok.size() > 2 && tok[2] == ':'))
      return fail("dates and times (found '" + input_excerpt(tok) +
                  "') are unsupported in this subset; quote it if a string will do");
    // Anything shaped like a number goes to the number grammar, so its mistakes read "malformed number".
    const char c = tok[0];
    if (is_digit(c) || c == '+' || c == '-' || c == '.' || c == '_' || tok == "inf" || tok == "nan")
      return number_parse(tok);
    return fail("unknown value '" + input_excerpt(tok) + "'; " + std::string(kValueHint) +
                " (strings need quotes; booleans are lowercase)");
  }

  Result<TomlValue> number_parse(std::string_view tok) {
    const auto malformed = [&](std::string_view why) {
      return fail("malformed number '" + input_excerpt(tok) + "'" + std::string(why) + "; " +
                  std::string(kNumberHint));
    };
    size_t pos = 0;
    std::string digits;  // the number without '+' and '_', as from_chars wants it
    bool negative = false;
    if (tok[pos] == '+' || tok[pos] == '-') {
      negative = tok[pos] == '-';
      if (negative) digits += '-';
      ++pos;
    }
    const std::string_view body = tok.substr(pos);
    if (body == "inf" || body == "nan")
      return fail("'" + input_excerpt(tok) + "' is unsupported in this subset; configs take finite numbers");
    if (body.size() >= 2 && body[0] == '0' && (body[1] == 'x' || body[1] == 'o' || body[1] == 'b'))
      return fail("hexadecimal, octal and binary integers ('" + input_excerpt(tok) +
                  "') are unsupported in this subset; write it in decimal");

    const size_t int_begin = digits.size();
    if (!digits_read(tok, pos, digits)) return malformed("");
    if (digits.size() - int_begin > 1 && digits[int_begin] == '0')
      return malformed(" (leading zeros are not allowed)");
    bool is_float = false;
    if (pos < tok.size() && tok[pos] == '.') {
      digits += tok[pos++];
      if (!digits_read(tok, pos, digits)) return malformed(" (expected digits after '.')");
      is_float = true;
    }
    if (pos < tok.size() && (tok[pos] == 'e' || tok[pos] == 'E')) {
      digits += tok[pos++];
      if (pos < tok.size() && (tok[pos] == '+' || tok[pos] == '-')) digits += tok[pos++];
      if (!digits_read(tok, pos, digits)) return malformed(" (expected digits in the exponent)");
      is_float = true;
    }
    if (pos != tok.size()) return malformed("");

    TomlValue v;
    v.line = line_no_;
    if (is_float) {
      v.kind = TomlValue::Kind::kFloat;
      const char* first = digits.data();
      const char* last = digits.data() + digits.size();
      const auto [end, ec] = std::from_chars(first, last, v.f);
      if (ec == std::errc::result_out_of_range)
        return fail("float '" + input_excerpt(tok) + "' is out of range for a 64-bit double");
      if (ec != std::errc() || end != last) return malformed("");
      return v;
    }
    // Accumulate the magnitude unsigned so that INT64_MIN, whose magnitude exceeds INT64_MAX, still parses.
    const uint64_t limit = negative ? uint64_t{1} << 63 : (uint64_t{1} << 63) - 1;
    uint64_t magnitude = 0;
    for (size_t k = negative ? 1 : 0; k < digits.size(); ++k) {
      const uint64_t d = static_cast<uint64_t>(digits[k] - '0');
      if (magnitude > (limit - d) / 10)
        return fail("integer '" + input_excerpt(tok) +
                    "' does not fit in 64 bits; expected -9223372036854775808 to 9223372036854775807");
      magnitude = magnitude * 10 + d;
    }
    v.kind = TomlValue::Kind::kInt;
    // Two's-complement negation of the magnitude; well defined because it is done in uint64_t.
    v.i = negative ? static_cast<int64_t>(~magnitude + 1) : static_cast<int64_t>(magnitude);
    return v;
  }

  Status control_char_check(char c) const {
    const auto u = static_cast<unsigned char>(c);
    if ((u < 0x20 && c != '\t') || u == 0x7F) {
      char hex[8];
      std::snprintf(hex, sizeof hex, "0x%02X", u);
      return fail(std::string("control character ") + hex + " inside a string; expected printable text");
    }
    return Status();
  }

  // A basic string ("...": backslash escapes) or a literal one ('...': none), on one line; `quote` says
  // which.
  Result<TomlValue> string_parse(char quote) {
    const bool escapes = quote == '"';
    TomlValue v;
    v.kind = TomlValue::Kind::kString;
    v.line = line_no_;
    ++pos_;  // opening quote
    for (;;) {
      if (at_end())
        return fail(std::string("unterminated string: expected a closing ") + (escapes ? "'\"'" : "\"'\"") +
                    " on the same line (multi-line strings are unsupported in this subset)");
      const char c = line_[pos_++];
      if (c == quote) return v;
      if (!escapes || c != '\\') {
        if (Status st = control_char_check(c); !st.ok()) return st;
        v.s += c;
        continue;
      }
      if (at_end())
        return fail(
            "unterminated string: a '\\' ends the line (multi-line strings are unsupported in this subset)");
      const char e = line_[pos_++];
      switch (e) {
        case '"':
          v.s += '"';
          break;
        case '\\':
          v.s += '\\';
          break;
        case 'n':
          v.s += '\n';
          break;
        case 't':
          v.s += '\t';
          break;
        default:
          return fail(std::string("unsupported escape '\\") + e +
                      "' in string; this subset supports \\\" \\\\ \\n and \\t (or use a 'literal string')");
      }
    }
  }

  Result<TomlValue> array_parse() {
    TomlValue arr;
    arr.kind = TomlValue::Kind::kArray;
    arr.line = line_no_;
    const auto unterminated = [&] {
      return fail(
          "unterminated array: expected ']' on the same line (multi-line arrays are unsupported in this "
          "subset)");
    };
    ++pos_;  // '['
    spaces_skip();
    if (peek() == ']') {
      ++pos_;
      return arr;
    }
    for (;;) {
      if (at_line_end_or_comment()) return unterminated();
      Result<TomlValue> element = value_parse(/*in_array=*/true);
      if (!element.ok()) return element.status();
      if (!arr.array.empty() && element->kind != arr.array.front().kind)
        return fail("array mixes " + toml_kind_name(arr.array.front().kind) + " and " +
                    toml_kind_name(element->kind) + " (element " + std::to_string(arr.array.size() + 1) +
                    "); arrays in this subset hold one kind (write 2.0, not 2, in a float array)");
      arr.array.push_back(std::move(element).value());
      spaces_skip();
      if (peek() == ',') {
        ++pos_;
        spaces_skip();
        if (peek() == ']') {  // a trailing comma is allowed
          ++pos_;
          return arr;
        }
        continue;
      }
      if (peek() == ']') {
        ++pos_;
        return arr;
      }
      if (at_line_end_or_comment()) return unterminated();
      return fail("expected ',' or ']' after array element, found " + excerpt());
    }
  }

  std::string_view text_;
  std::string source_;
  TomlDocument doc_;

  std::string_view line_;
  size_t pos_ = 0;
  int line_no_ = 0;

  std::string table_;  // current [table], empty at the top
  std::unordered_map<std::string, int> value_lines_;
  std::unordered_map<std::string, int> explicit_tables_;
  std::unordered_map<std::string, int> implied_tables_;  // parents named by a dotted header, e.g. a for [a.b]
};

}  // namespace

const TomlValue* TomlDocument::find(std::string_view key) const {
  for (const auto& [name, value] : entries)
    if (name == key) return &value;
  return nullptr;
}

std::string TomlDocument::location(const TomlValue& value) const {
  return source + ":" + std::to_string(value.line);
}

Result<TomlDocument> toml_parse(std::string_view text, std::string_view source_name) {
  return Parser(text, source_name).run();
}

Result<TomlDocument> toml_parse_file(const std::string& path) {
  std::FILE* file = std::fopen(path.c_str(), "rb");
  if (file == nullptr) {
    const std::string why = std::error_code(errno, std::generic_category()).message();
    return Status::error("cannot open TOML file '" + path + "': " + why +
                         "; expected a readable config file");
  }
  std::string text;
  char buf[1 << 14];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, file)) > 0) text.append(buf, n);
  // fread reports a directory (EISDIR) or an I/O error only through ferror.
  const bool failed = std::ferror(file) != 0;
  const int read_errno = errno;
  std::fclose(file);
  if (failed) {
    const std::string why = std::error_code(read_errno, std::generic_category()).message();
    return Status::error("cannot read TOML file '" + path + "': " + why +
                         "; expected a readable config file");
  }
  return toml_parse(text, path);
}

std::string toml_kind_name(TomlValue::Kind kind) {
  switch (kind) {
    case TomlValue::Kind::kString:
      return "string";
    case TomlValue::Kind::kInt:
      return "integer";
    case TomlValue::Kind::kFloat:
      return "float";
    case TomlValue::Kind::kBool:
      return "boolean";
    case TomlValue::Kind::kArray:
      return "array";
  }
  return "unknown";
}

}  // namespace gantry
