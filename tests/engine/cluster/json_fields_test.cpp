// Strict JSON field reading: every message names the field, what was expected and what came.
#include "engine/cluster/json_fields.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace gantry {
namespace {

using ::testing::HasSubstr;
using json = nlohmann::json;

TEST(JsonFields, ReadsWhatIsThere) {
  const json body = {{"name", "tiny"}, {"dp", 4}, {"lr", 0.5}, {"resume", true}, {"layout", {{"tp", 2}}}};
  JsonFields f(body);
  EXPECT_EQ(f.string("name").value(), "tiny");
  EXPECT_EQ(f.integer("dp", 1, 64).value(), 4);
  EXPECT_DOUBLE_EQ(f.number("lr", 0, 1).value(), 0.5);
  EXPECT_TRUE(f.boolean("resume").value());
  const json* layout = f.object("layout");
  ASSERT_NE(layout, nullptr);
  EXPECT_FALSE(f.string("comment", JsonFields::optional).has_value());
  EXPECT_TRUE(f.finish().ok()) << f.finish().message();

  JsonFields l(*layout, "layout.");
  EXPECT_EQ(l.integer("tp", 1, 8).value(), 2);
  EXPECT_TRUE(l.finish().ok());
}

TEST(JsonFields, MessagesNameTheField) {
  {
    const json body{{"dp", "four"}};
    JsonFields f(body);
    EXPECT_FALSE(f.integer("dp", 1, 65536).has_value());
    EXPECT_EQ(f.finish().message(),
              "field \"dp\": expected an integer in [1, 65536], got \"four\" (a string)");
  }
  {
    const json body{{"dp", 0}};
    JsonFields f(body);
    f.integer("dp", 1, 8);
    EXPECT_EQ(f.finish().message(), "field \"dp\": expected an integer in [1, 8], got 0 (an integer)");
  }
  {
    const json body{{"dp", 2.5}};
    JsonFields f(body);
    f.integer("dp", 1, 8);
    EXPECT_THAT(f.finish().message(), HasSubstr("got 2.5 (a number)"));
  }
  {
    const json body = json::object();
    JsonFields f(body);
    f.string("checkpoint");
    EXPECT_EQ(f.finish().message(), "field \"checkpoint\": missing; expected a string");
  }
  {
    const json body{{"layout", {{"tp", true}}}};
    JsonFields f(body);
    const json* l = f.object("layout");
    ASSERT_NE(l, nullptr);
    JsonFields lf(*l, "layout.");
    lf.integer("tp", 1, 8);
    EXPECT_EQ(lf.finish().message(),
              "field \"layout.tp\": expected an integer in [1, 8], got true (a boolean)");
  }
  {
    const json body{{"layout", 3}};
    JsonFields f(body);
    f.object("layout");
    EXPECT_EQ(f.finish().message(), "field \"layout\": expected an object, got 3 (an integer)");
  }
  {
    const json body{{"name", std::string(100, 'x')}};
    JsonFields f(body);
    f.integer("name", 0, 1);
    EXPECT_THAT(f.finish().message(), HasSubstr("xxx... (a string)"));  // long values are cut short
  }
}

TEST(JsonFields, FirstErrorWins) {
  const json body{{"a", "x"}, {"b", "y"}};
  JsonFields f(body);
  f.integer("a", 0, 1);
  f.integer("b", 0, 1);
  EXPECT_THAT(f.finish().message(), HasSubstr("field \"a\""));
}

TEST(JsonFields, UnknownFieldsAreErrors) {
  const json body{{"dp", 2}, {"dpp", 3}};
  JsonFields f(body);
  f.integer("dp", 1, 8);
  f.string("checkpoint", JsonFields::optional);
  EXPECT_EQ(f.finish().message(), "unknown field \"dpp\" (known: checkpoint, dp)");

  const json other{{"x", 1}};
  JsonFields none(other);
  EXPECT_EQ(none.finish().message(), "unknown field \"x\" (this request takes no fields)");
}

// nlohmann keeps the last of a key given twice; what the server read and what a reader of the request sees
// would differ. The same key in two objects is fine.
TEST(JsonFields, AKeyGivenTwiceInOneObjectIsRefused) {
  Result<json> twice = json_parse_bounded(R"({"layout": {"dp": 1}, "name": "a", "layout": {"dp": 3}})");
  ASSERT_FALSE(twice.ok());
  EXPECT_EQ(twice.error(), "field \"layout\" is given twice in one object: give it once");
  Result<json> inner = json_parse_bounded(R"({"layout": {"dp": 1, "dp": 3}})");
  ASSERT_FALSE(inner.ok());
  EXPECT_THAT(inner.error(), HasSubstr("field \"dp\" is given twice"));
  Result<json> apart = json_parse_bounded(R"({"a": {"dp": 1}, "b": {"dp": 2}, "c": [{"dp": 3}, {"dp": 4}]})");
  ASSERT_TRUE(apart.ok()) << apart.error();
  EXPECT_EQ(apart.value()["c"][1]["dp"], 4);
}

// An unknown key is named cut short, like a value: a 100 KB key is not echoed back whole.
TEST(JsonFields, ALongUnknownKeyIsNamedCutShort) {
  const json body{{std::string(100000, 'k'), 1}};
  JsonFields f(body);
  const std::string message = f.finish().message();
  EXPECT_THAT(message, HasSubstr("unknown field \"kkkk"));
  EXPECT_LT(message.size(), 200u);
}

TEST(JsonFields, IntegralFloatsAreIntegers) {
  const json body{{"steps", 100.0}, {"big", 18446744073709551615ull}};
  JsonFields f(body);
  EXPECT_EQ(f.integer("steps", 0, 1000).value(), 100);
  EXPECT_FALSE(f.integer("big", 0, INT64_MAX).has_value());  // above int64: out of range, not wrapped
  EXPECT_THAT(f.finish().message(), HasSubstr("field \"big\""));
}

TEST(JsonFields, NotAnObject) {
  const json body = json::array({1, 2});
  JsonFields f(body);
  EXPECT_EQ(f.finish().message(), "request body: expected a JSON object, got [1,2] (an array)");
}

}  // namespace
}  // namespace gantry
