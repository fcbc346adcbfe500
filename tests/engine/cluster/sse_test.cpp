// The event-stream wire format: formatting, parsing in any split, and the spec's corner cases.
#include "engine/cluster/sse.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <vector>

namespace gantry {
namespace {

std::vector<SseEvent> parse_all(std::string_view wire, SseParser* parser = nullptr) {
  SseParser local;
  SseParser& p = parser ? *parser : local;
  std::vector<SseEvent> out;
  EXPECT_TRUE(p.feed(wire, [&](const SseEvent& e) {
    out.push_back(e);
    return true;
  }));
  return out;
}

TEST(Sse, FormatsIdEventAndDataLines) {
  EXPECT_EQ(sse_format({.id = "7", .event = "checkpoint", .data = "{\"step\":100}"}),
            "id: 7\nevent: checkpoint\ndata: {\"step\":100}\n\n");
  EXPECT_EQ(sse_format({.data = "a\nb"}), "data: a\ndata: b\n\n");  // "message" is the default: not written
  EXPECT_EQ(sse_format({.data = ""}), "data: \n\n");
  EXPECT_EQ(sse_comment("keep-alive"), ": keep-alive\n\n");
}

TEST(Sse, RoundTripsMultilineData) {
  const std::vector<std::string> datas = {"",           "x",  "a\nb",         "a\n\nb",
                                          "trailing\n", "\n", "crlf\r\nline", "cr\rline"};
  for (const std::string& d : datas) {
    std::vector<SseEvent> got = parse_all(sse_format({.id = "1", .event = "e", .data = d}));
    ASSERT_EQ(got.size(), 1u) << d;
    std::string want = d;
    for (size_t i = 0; (i = want.find("\r\n", i)) != std::string::npos;) want.erase(i, 1);
    for (char& c : want) c = c == '\r' ? '\n' : c;
    EXPECT_EQ(got[0].data, want);
    EXPECT_EQ(got[0].event, "e");
    EXPECT_EQ(got[0].id, "1");
  }
}

TEST(Sse, NewlinesInIdOrEventCannotForgeAnotherEvent) {
  const std::string wire =
      sse_format({.id = "1\n\ndata: forged", .event = "x\r\ndata: forged", .data = "real"});
  std::vector<SseEvent> got = parse_all(wire);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].data, "real");
}

TEST(Sse, ParsesInEverySplitWithAnyLineEnding) {
  const std::string lf = "id: 1\nevent: a\ndata: one\n\n: comment\n\nid: 2\ndata: two\ndata: lines\n\n";
  std::string crlf, cr;
  for (char c : lf) {
    crlf += c == '\n' ? std::string("\r\n") : std::string(1, c);
    cr += c == '\n' ? '\r' : c;
  }
  for (const std::string& wire : {lf, crlf, cr}) {
    for (size_t split = 0; split <= wire.size(); ++split) {
      SseParser p;
      std::vector<SseEvent> got;
      auto take = [&](const SseEvent& e) {
        got.push_back(e);
        return true;
      };
      ASSERT_TRUE(p.feed(std::string_view(wire).substr(0, split), take));
      ASSERT_TRUE(p.feed(std::string_view(wire).substr(split), take));
      ASSERT_EQ(got.size(), 2u) << "split " << split;
      EXPECT_EQ(got[0].id, "1");
      EXPECT_EQ(got[0].event, "a");
      EXPECT_EQ(got[0].data, "one");
      EXPECT_EQ(got[1].id, "2");
      EXPECT_EQ(got[1].event, "message");
      EXPECT_EQ(got[1].data, "two\nlines");
      EXPECT_EQ(p.last_event_id(), "2");
    }
  }
  // Byte by byte.
  SseParser p;
  int n = 0;
  for (char c : crlf) {
    ASSERT_TRUE(p.feed(std::string_view(&c, 1), [&](const SseEvent&) {
      ++n;
      return true;
    }));
  }
  EXPECT_EQ(n, 2);
}

TEST(Sse, SpecCornerCases) {
  // No space after the colon; a field without a colon; unknown fields and retry ignored; an event
  // without data is not dispatched but its id still becomes the last event id; the id persists.
  std::vector<SseEvent> got =
      parse_all("data:x\nretry: 10\nfoo: bar\ndata\n\nid: 9\n\nevent: lone\n\ndata: y\n\n");
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0].data, "x\n");
  EXPECT_EQ(got[0].id, "");
  EXPECT_EQ(got[1].data, "y");
  EXPECT_EQ(got[1].event, "message");  // "lone" had no data and was reset
  EXPECT_EQ(got[1].id, "9");
  // An id holding NUL is ignored.
  std::vector<SseEvent> nul = parse_all(std::string("id: 4\ndata: a\n\nid: 5\0x\ndata: b\n\n", 32));
  ASSERT_EQ(nul.size(), 2u);
  EXPECT_EQ(nul[1].id, "4");
}

TEST(Sse, CallbackStopsTheParser) {
  SseParser p;
  int n = 0;
  EXPECT_FALSE(p.feed("data: 1\n\ndata: 2\n\n", [&](const SseEvent&) {
    ++n;
    return false;
  }));
  EXPECT_EQ(n, 1);
}

TEST(Sse, OverlongLineIsAnError) {
  SseParser p;
  p.max_line_bytes = 16;
  EXPECT_FALSE(p.feed("data: " + std::string(100, 'x'), [](const SseEvent&) { return true; }));
  EXPECT_THAT(p.error(), ::testing::HasSubstr("longer than 16 bytes"));
  EXPECT_FALSE(p.feed("\n\n", [](const SseEvent&) { return true; }));  // sticky
}

}  // namespace
}  // namespace gantry
