#include "engine/core/toml.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <string>

#include "tests/scratch_dir.h"

namespace gantry {
namespace {

using Kind = TomlValue::Kind;

TomlDocument parse_ok(std::string_view text) {
  Result<TomlDocument> doc = toml_parse(text, "t.toml");
  EXPECT_TRUE(doc.ok()) << doc.error();
  if (!doc.ok()) return TomlDocument{};
  return std::move(doc).value();
}

// Checks the message starts "t.toml:<line>: " and contains `fragment`.
void expect_error(std::string_view text, int line, std::string_view fragment) {
  Result<TomlDocument> doc = toml_parse(text, "t.toml");
  ASSERT_FALSE(doc.ok()) << "parsed without error:\n" << text;
  const std::string prefix = "t.toml:" + std::to_string(line) + ": ";
  EXPECT_EQ(doc.error().substr(0, prefix.size()), prefix) << doc.error();
  EXPECT_NE(doc.error().find(fragment), std::string::npos)
      << "message: " << doc.error() << "\nexpected to contain: " << fragment;
}

const TomlValue& get(const TomlDocument& doc, std::string_view key) {
  const TomlValue* v = doc.find(key);
  static const TomlValue missing;
  EXPECT_NE(v, nullptr) << "missing key " << key;
  return v ? *v : missing;
}

// ---- accepted syntax ----

TEST(Toml, Strings) {
  const TomlDocument doc = parse_ok(
      "basic = \"hello world\"\n"
      "escapes = \"q\\\"b\\\\n\\nt\\t.\"\n"
      "literal = 'C:\\path\\n \"as is\"'\n"
      "empty = \"\"\n"
      "empty_literal = ''\n"
      "hash = \"a # not a comment\"\n"
      "utf8 = \"h\xC3\xA9llo\"\n"
      "tab_inside = \"a\tb\"\n");
  ASSERT_EQ(doc.entries.size(), 8u);
  for (const auto& [key, value] : doc.entries) EXPECT_EQ(value.kind, Kind::kString) << key;
  EXPECT_EQ(get(doc, "basic").s, "hello world");
  EXPECT_EQ(get(doc, "escapes").s, "q\"b\\n\nt\t.");
  EXPECT_EQ(get(doc, "literal").s, "C:\\path\\n \"as is\"");
  EXPECT_EQ(get(doc, "empty").s, "");
  EXPECT_EQ(get(doc, "empty_literal").s, "");
  EXPECT_EQ(get(doc, "hash").s, "a # not a comment");
  EXPECT_EQ(get(doc, "utf8").s, "h\xC3\xA9llo");
  EXPECT_EQ(get(doc, "tab_inside").s, "a\tb");
}

TEST(Toml, Integers) {
  const TomlDocument doc = parse_ok(
      "zero = 0\n"
      "plus = +7\n"
      "minus = -3\n"
      "neg_zero = -0\n"
      "sep = 1_000_000\n"
      "sep_neg = -12_3\n"
      "max = 9223372036854775807\n"
      "min = -9223372036854775808\n");
  for (const auto& [key, value] : doc.entries) EXPECT_EQ(value.kind, Kind::kInt) << key;
  EXPECT_EQ(get(doc, "zero").i, 0);
  EXPECT_EQ(get(doc, "plus").i, 7);
  EXPECT_EQ(get(doc, "minus").i, -3);
  EXPECT_EQ(get(doc, "neg_zero").i, 0);
  EXPECT_EQ(get(doc, "sep").i, 1000000);
  EXPECT_EQ(get(doc, "sep_neg").i, -123);
  EXPECT_EQ(get(doc, "max").i, std::numeric_limits<int64_t>::max());
  EXPECT_EQ(get(doc, "min").i, std::numeric_limits<int64_t>::min());
}

TEST(Toml, Floats) {
  const TomlDocument doc = parse_ok(
      "a = 1.5\n"
      "b = -2e-3\n"
      "c = 3e-4\n"
      "d = 1.0E+2\n"
      "e = +0.25\n"
      "f = 1_000.5\n"
      "g = 6.02e23\n"
      "h = 0.1\n"
      "i = 1e0_1\n"
      "j = 0e0\n");
  for (const auto& [key, value] : doc.entries) EXPECT_EQ(value.kind, Kind::kFloat) << key;
  EXPECT_EQ(get(doc, "a").f, 1.5);
  EXPECT_EQ(get(doc, "b").f, -2e-3);
  EXPECT_EQ(get(doc, "c").f, 3e-4);
  EXPECT_EQ(get(doc, "d").f, 100.0);
  EXPECT_EQ(get(doc, "e").f, 0.25);
  EXPECT_EQ(get(doc, "f").f, 1000.5);
  EXPECT_EQ(get(doc, "g").f, 6.02e23);
  EXPECT_EQ(get(doc, "h").f, 0.1);  // correctly rounded, the same double as the literal
  EXPECT_EQ(get(doc, "i").f, 10.0);
  EXPECT_EQ(get(doc, "j").f, 0.0);
}

TEST(Toml, Booleans) {
  const TomlDocument doc = parse_ok("yes = true\nno = false\n");
  EXPECT_EQ(get(doc, "yes").kind, Kind::kBool);
  EXPECT_TRUE(get(doc, "yes").b);
  EXPECT_EQ(get(doc, "no").kind, Kind::kBool);
  EXPECT_FALSE(get(doc, "no").b);
}

TEST(Toml, Arrays) {
  const TomlDocument doc = parse_ok(
      "ints = [1, 2, 3]\n"
      "strs = [\"a\", 'b', \"c,]\"]\n"
      "floats = [0.9,0.95 ,1e-8]\n"
      "bools = [ true, false ]\n"
      "empty = []\n"
      "empty_spaced = [  ]\n"
      "trailing = [4, 5,]\n"
      "seps = [1_000, -2]\n");
  const TomlValue& ints = get(doc, "ints");
  ASSERT_EQ(ints.kind, Kind::kArray);
  ASSERT_EQ(ints.array.size(), 3u);
  for (size_t k = 0; k < 3; ++k) {
    EXPECT_EQ(ints.array[k].kind, Kind::kInt);
    EXPECT_EQ(ints.array[k].i, static_cast<int64_t>(k + 1));
    EXPECT_EQ(ints.array[k].line, 1);
  }
  const TomlValue& strs = get(doc, "strs");
  ASSERT_EQ(strs.array.size(), 3u);
  EXPECT_EQ(strs.array[0].s, "a");
  EXPECT_EQ(strs.array[1].s, "b");
  EXPECT_EQ(strs.array[2].s, "c,]");
  const TomlValue& floats = get(doc, "floats");
  ASSERT_EQ(floats.array.size(), 3u);
  EXPECT_EQ(floats.array[0].f, 0.9);
  EXPECT_EQ(floats.array[1].f, 0.95);
  EXPECT_EQ(floats.array[2].f, 1e-8);
  const TomlValue& bools = get(doc, "bools");
  ASSERT_EQ(bools.array.size(), 2u);
  EXPECT_TRUE(bools.array[0].b);
  EXPECT_FALSE(bools.array[1].b);
  EXPECT_EQ(get(doc, "empty").kind, Kind::kArray);
  EXPECT_TRUE(get(doc, "empty").array.empty());
  EXPECT_TRUE(get(doc, "empty_spaced").array.empty());
  ASSERT_EQ(get(doc, "trailing").array.size(), 2u);
  EXPECT_EQ(get(doc, "trailing").array[1].i, 5);
  ASSERT_EQ(get(doc, "seps").array.size(), 2u);
  EXPECT_EQ(get(doc, "seps").array[0].i, 1000);
  EXPECT_EQ(get(doc, "seps").array[1].i, -2);
}

TEST(Toml, TablesQualifyKeysAndOrderIsKept) {
  const TomlDocument doc = parse_ok(
      "name = \"tiny\"\n"
      "[model]\n"
      "n_layer = 4\n"
      "n_head = 2\n"
      "[optim.adamw]\n"
      "beta1 = 0.9\n"
      "[ data . train ]\n"
      "path = 'x.bin'\n"
      "[other]\n"
      "n_layer = 8\n");
  ASSERT_EQ(doc.entries.size(), 6u);
  const char* expected[] = {
      "name", "model.n_layer", "model.n_head", "optim.adamw.beta1", "data.train.path", "other.n_layer"};
  for (size_t k = 0; k < 6; ++k) EXPECT_EQ(doc.entries[k].first, expected[k]);
  EXPECT_EQ(get(doc, "model.n_layer").i, 4);
  EXPECT_EQ(get(doc, "other.n_layer").i, 8);
  EXPECT_EQ(get(doc, "optim.adamw.beta1").f, 0.9);
  EXPECT_EQ(get(doc, "data.train.path").s, "x.bin");
  EXPECT_EQ(doc.find("n_layer"), nullptr);
  EXPECT_EQ(doc.find("model"), nullptr);
  EXPECT_EQ(doc.find("missing.key"), nullptr);
}

TEST(Toml, ParentTableMayFollowChild) {
  const TomlDocument doc = parse_ok("[a.b]\nx = 1\n[a]\ny = 2\n");
  EXPECT_EQ(get(doc, "a.b.x").i, 1);
  EXPECT_EQ(get(doc, "a.y").i, 2);
}

TEST(Toml, CommentsBlankLinesAndWhitespace) {
  const TomlDocument doc = parse_ok(
      "# leading comment\n"
      "\n"
      "   \t\n"
      "a = 1 # trailing comment\n"
      "b=2#tight\n"
      "  \tc\t=\t\"x\"   \n"
      "[t] # header comment\n"
      "    # indented comment\n"
      "d = [1, 2] # after array\n"
      "e = 'y'# no space\n");
  ASSERT_EQ(doc.entries.size(), 5u);
  EXPECT_EQ(get(doc, "a").i, 1);
  EXPECT_EQ(get(doc, "a").line, 4);
  EXPECT_EQ(get(doc, "b").i, 2);
  EXPECT_EQ(get(doc, "c").s, "x");
  EXPECT_EQ(get(doc, "t.d").array.size(), 2u);
  EXPECT_EQ(get(doc, "t.d").line, 9);
  EXPECT_EQ(get(doc, "t.e").s, "y");
}

TEST(Toml, CrlfLineEndingsByteOrderMarkAndNoFinalNewline) {
  const TomlDocument doc = parse_ok(
      "\xEF\xBB\xBF"
      "a = 1\r\n[t]\r\nb = \"x\"\r\nc = true");
  EXPECT_EQ(get(doc, "a").i, 1);
  EXPECT_EQ(get(doc, "t.b").s, "x");
  EXPECT_EQ(get(doc, "t.c").line, 4);
}

TEST(Toml, EmptyDocument) {
  EXPECT_TRUE(parse_ok("").entries.empty());
  EXPECT_TRUE(parse_ok("# only a comment\n\n").entries.empty());
}

TEST(Toml, LocationAndKindNames) {
  const TomlDocument doc = parse_ok("\n\n[model]\nn_layer = 4\n");
  EXPECT_EQ(doc.source, "t.toml");
  EXPECT_EQ(doc.location(get(doc, "model.n_layer")), "t.toml:4");
  EXPECT_EQ(toml_kind_name(Kind::kString), "string");
  EXPECT_EQ(toml_kind_name(Kind::kInt), "integer");
  EXPECT_EQ(toml_kind_name(Kind::kFloat), "float");
  EXPECT_EQ(toml_kind_name(Kind::kBool), "boolean");
  EXPECT_EQ(toml_kind_name(Kind::kArray), "array");
}

// ---- refused syntax: each message names the line and what was expected ----

TEST(TomlErrors, DuplicateKey) {
  Result<TomlDocument> doc = toml_parse(
      "[model]\n"
      "# the depth\n"
      "n_layer = 4\n"
      "n_head = 2\n"
      "\n"
      "# again\n"
      "n_layer = 6\n",
      "tiny.toml");
  ASSERT_FALSE(doc.ok());
  EXPECT_EQ(doc.error(), "tiny.toml:7: duplicate key 'model.n_layer' (first set on line 3)");
  expect_error("a = 1\nb = 2\na = 3\n", 3, "duplicate key 'a' (first set on line 1)");
  // Reopening a table through a different header spelling still collides.
  expect_error("[a.b]\nx = 1\n[c]\n[a . b]\n", 4, "duplicate table [a.b] (first defined on line 1)");
}

TEST(TomlErrors, SameKeyInDifferentTablesIsFine) {
  const TomlDocument doc = parse_ok("x = 0\n[a]\nx = 1\n[b]\nx = 2\n");
  EXPECT_EQ(doc.entries.size(), 3u);
}

TEST(TomlErrors, DuplicateTable) {
  expect_error("[model]\nn_layer = 4\n\n[model]\n", 4, "duplicate table [model] (first defined on line 1)");
}

TEST(TomlErrors, KeyAndTableConflicts) {
  expect_error("[a]\nb = 1\n[a.b]\n", 3, "table [a.b] conflicts with key 'a.b' set on line 2");
  expect_error("a = 1\n[a.b]\n", 2, "table [a.b] conflicts with key 'a' set on line 1");
  expect_error("[a.b]\nx = 1\n[a]\nb = 2\n", 4, "key 'a.b' conflicts with table [a.b]");
  expect_error("[t]\n[t.sub]\n[t]\n", 3, "duplicate table [t]");
}

TEST(TomlErrors, UnterminatedString) {
  expect_error("a = 1\nb = \"abc\n", 2, "unterminated string");
  expect_error("\n\nc = 'abc\n", 3, "unterminated string");
  expect_error("d = \"abc\\\"\n", 1, "unterminated string");  // the escaped quote does not close it
  expect_error("e = \"abc\\\n", 1, "unterminated string");
  expect_error("f = [\"a\", \"b]\n", 1, "unterminated string");
  // The message names the quote that would close the string it is in (a basic and a literal string share
  // one parser).
  expect_error("g = \"abc'\n", 1, "unterminated string: expected a closing '\"' on the same line");
  expect_error("h = 'abc\"\n", 1, "unterminated string: expected a closing \"'\" on the same line");
  expect_error("i = 'abc\\\n", 1, "unterminated string: expected a closing \"'\"");
}

// A literal string has no escapes: a backslash in it is text, even just before its closing quote.
TEST(Toml, LiteralStringBackslashBeforeItsQuote) {
  const TomlDocument doc = parse_ok("a = 'ends\\'\nb = 'x\\\"'\n");
  EXPECT_EQ(get(doc, "a").s, "ends\\");
  EXPECT_EQ(get(doc, "b").s, "x\\\"");
}

TEST(TomlErrors, MalformedNumbers) {
  const char* bad[] = {"1__0",  "_1", "1_", "01",   "-01",  "00",   "1.",  ".5",  "1e",   "1e+",  "1.5.3",
                       "12abc", "-",  "+",  "1._5", "1_.5", "1e_5", "--1", "+-1", "1.e5", "0.5e", "3-4"};
  for (const char* b : bad) {
    SCOPED_TRACE(b);
    expect_error(std::string("x = 1\n\ny = ") + b + "\n", 3, std::string("malformed number '") + b + "'");
  }
  expect_error("y = 1__0\n", 1, "expected an integer like 42");
}

TEST(TomlErrors, NumbersOutOfRange) {
  expect_error("a = 9223372036854775808\n", 1, "does not fit in 64 bits");
  expect_error("a = -9223372036854775809\n", 1, "does not fit in 64 bits");
  expect_error("a = 99999999999999999999999\n", 1, "does not fit in 64 bits");
  expect_error("a = 1e400\n", 1, "out of range");
}

TEST(TomlErrors, UnsupportedNumberForms) {
  expect_error("a = 0xff\n", 1, "hexadecimal, octal and binary integers");
  expect_error("a = 0o17\n", 1, "unsupported in this subset");
  expect_error("a = 0b101\n", 1, "unsupported in this subset");
  expect_error("a = inf\n", 1, "'inf' is unsupported in this subset");
  expect_error("a = -nan\n", 1, "'-nan' is unsupported in this subset");
}

TEST(TomlErrors, DatesAndTimes) {
  expect_error("when = 1979-05-27\n", 1, "dates and times");
  expect_error("when = 1979-05-27T07:32:00Z\n", 1, "unsupported in this subset");
  expect_error("when = 1979-05-27 07:32:00\n", 1, "dates and times");
  expect_error("at = 07:32:00\n", 1, "dates and times");
}

TEST(TomlErrors, InlineTablesMultiLineStringsAndArrays) {
  expect_error("a = 1\np = { x = 1 }\n", 2, "inline tables ({...}) are unsupported in this subset");
  expect_error("s = \"\"\"text\"\"\"\n", 1, "multi-line strings (\"\"\") are unsupported in this subset");
  expect_error("s = '''text'''\n", 1, "multi-line literal strings (''') are unsupported in this subset");
  expect_error("a = [\n  1,\n]\n", 1, "multi-line arrays are unsupported in this subset");
  expect_error("a = [1, 2\n", 1, "unterminated array");
  expect_error("a = [1, # comment\n 2]\n", 1, "multi-line arrays are unsupported");
  expect_error("a = [[1], [2]]\n", 1, "nested arrays are unsupported");
  expect_error("a = [{x = 1}]\n", 1, "inline tables");
  expect_error("[[layers]]\n", 1, "arrays of tables ([[...]]) are unsupported");
}

TEST(TomlErrors, MixedArrays) {
  expect_error("a = [1, 2.0]\n", 1, "array mixes integer and float (element 2)");
  expect_error("a = [\"x\", 1]\n", 1, "array mixes string and integer");
  expect_error("a = [true, 'x', false]\n", 1, "array mixes boolean and string");
}

TEST(TomlErrors, KeyWithoutEquals) {
  expect_error("a = 1\nlonely\n", 2, "expected '=' after key 'lonely', found end of line");
  expect_error("two words = 1\n", 1, "expected '=' after key 'two'");
  expect_error("key: 1\n", 1, "expected '=' after key 'key', found ': 1'");
  expect_error("k == 1\n", 1, "unknown value syntax '= 1'");
  expect_error("= 5\n", 1, "expected a key");
  expect_error("a =\n", 1, "missing value after 'a ='");
  expect_error("a = # nothing\n", 1, "missing value");
}

TEST(TomlErrors, TrailingGarbage) {
  expect_error("a = 1 2\n", 1,
               "unexpected '2' after the value of 'a'; expected a comment (#) or end of line");
  expect_error("a = \"x\" y\n", 1, "unexpected 'y' after the value of 'a'");
  expect_error("a = \"x\"\"y\"\n", 1, "unexpected '\"y\"' after the value");
  expect_error("a = true false\n", 1, "unexpected 'false'");
  expect_error("a = [1] 2\n", 1, "unexpected '2'");
  expect_error("a = 1,\n", 1, "unexpected ','");
  expect_error("a = [1 2]\n", 1, "expected ',' or ']' after array element, found '2]'");
  expect_error("[t] x\n", 1, "unexpected 'x' after table header [t]");
}

TEST(TomlErrors, UnknownValues) {
  expect_error("a = hello\n", 1, "unknown value 'hello'; expected a quoted string");
  expect_error("a = True\n", 1, "unknown value 'True'");
  expect_error("a = truex\n", 1, "unknown value 'truex'");
  expect_error("a = $x\n", 1, "unknown value syntax '$x'");
}

TEST(TomlErrors, KeysAndHeaders) {
  expect_error("\"quoted key\" = 1\n", 1, "quoted keys are unsupported in this subset");
  expect_error("[t]\na.b = 1\n", 2,
               "dotted key 'a.b' is unsupported in this subset; put the key under a [t.a]");
  expect_error("x . y\n", 1, "dotted key 'x . y' is unsupported");
  expect_error("[]\n", 1, "empty table header []");
  expect_error("[a.]\n", 1, "expected a table name part");
  expect_error("[.a]\n", 1, "expected a table name part");
  expect_error("[a b]\n", 1, "expected '.' or ']' in table header");
  expect_error("[model\n", 1, "unterminated table header [model: expected ']'");
  expect_error("[\"a\"]\n", 1, "quoted table names are unsupported");
}

TEST(TomlErrors, EscapesAndControlCharacters) {
  expect_error("a = \"\\u00e9\"\n", 1, "unsupported escape '\\u'");
  expect_error("a = \"\\r\"\n", 1, "supports \\\" \\\\ \\n and \\t");
  expect_error(std::string("a = \"x\x01y\"\n"), 1, "control character 0x01 inside a string");
  expect_error(std::string("a = 'x\x7Fy'\n"), 1, "control character 0x7F");
}

TEST(TomlErrors, FirstErrorWinsAndEmptySourceNameIsNamed) {
  expect_error("a = 1\nb = bad\nc = 'unterminated\n", 2, "unknown value 'bad'");
  Result<TomlDocument> doc = toml_parse("x = ?\n", "");
  ASSERT_FALSE(doc.ok());
  EXPECT_EQ(doc.error().rfind("<toml>:1: ", 0), 0u) << doc.error();
}

// ---- files ----

TEST(TomlFile, ParsesAndNamesThePath) {
  const std::filesystem::path path = testing_support::scratch_dir() / "test.toml";
  {
    std::FILE* f = std::fopen(path.c_str(), "wb");
    ASSERT_NE(f, nullptr);
    const std::string text = "[model]\nn_layer = 4\nn_embd = 128\n";
    ASSERT_EQ(std::fwrite(text.data(), 1, text.size(), f), text.size());
    std::fclose(f);
  }
  Result<TomlDocument> doc = toml_parse_file(path.string());
  ASSERT_TRUE(doc.ok()) << doc.error();
  EXPECT_EQ(doc->source, path.string());
  const TomlValue* v = doc->find("model.n_embd");
  ASSERT_NE(v, nullptr);
  EXPECT_EQ(v->i, 128);
  EXPECT_EQ(doc->location(*v), path.string() + ":3");

  {
    std::FILE* f = std::fopen(path.c_str(), "wb");
    ASSERT_NE(f, nullptr);
    const std::string text = "[model]\nn_layer = 4\nn_layer = 5\n";
    ASSERT_EQ(std::fwrite(text.data(), 1, text.size(), f), text.size());
    std::fclose(f);
  }
  Result<TomlDocument> dup = toml_parse_file(path.string());
  ASSERT_FALSE(dup.ok());
  EXPECT_EQ(dup.error(), path.string() + ":3: duplicate key 'model.n_layer' (first set on line 2)");
  std::filesystem::remove(path);
}

TEST(TomlFile, MissingFileNamesThePath) {
  const std::string path = "/nonexistent/gantry/configs/tiny.toml";
  Result<TomlDocument> doc = toml_parse_file(path);
  ASSERT_FALSE(doc.ok());
  EXPECT_NE(doc.error().find("'" + path + "'"), std::string::npos) << doc.error();
  EXPECT_NE(doc.error().find("No such file or directory"), std::string::npos) << doc.error();
}

TEST(TomlFile, DirectoryIsRefusedNamingThePath) {
  const std::string path = testing_support::scratch_dir().string();
  Result<TomlDocument> doc = toml_parse_file(path);
  ASSERT_FALSE(doc.ok());
  EXPECT_NE(doc.error().find(path), std::string::npos) << doc.error();
}

}  // namespace
}  // namespace gantry
