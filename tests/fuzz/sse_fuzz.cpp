// The event stream the HTTP client reads (SseParser): the same bytes fed whole and fed in pieces must
// give the same events and last event id, since a socket may cut the stream anywhere (inside a line or
// a CRLF). Every event read must survive sse_format and a second parse unchanged.
//
// Input: byte 0 sets the piece size; the rest is the stream.
#include <algorithm>
#include <cstdint>
#include <string_view>
#include <vector>

#include "engine/cluster/sse.h"
#include "tests/fuzz/fuzz_support.h"

namespace {

bool same(const gantry::SseEvent& a, const gantry::SseEvent& b) {
  return a.id == b.id && a.event == b.event && a.data == b.data;
}

std::vector<gantry::SseEvent> parse(std::string_view stream, size_t piece, std::string* last_id) {
  gantry::SseParser parser;
  std::vector<gantry::SseEvent> events;
  for (size_t at = 0; at < stream.size(); at += piece) {
    const bool more = parser.feed(stream.substr(at, piece), [&](const gantry::SseEvent& e) {
      events.push_back(e);
      return true;
    });
    FUZZ_CHECK(more, "the parser stopped on a stream far below its line limit");
  }
  *last_id = parser.last_event_id();
  return events;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const size_t piece = data[0] % 16 + 1;
  const std::string_view stream(reinterpret_cast<const char*>(data) + 1, size - 1);

  std::string whole_id, pieces_id;
  const std::vector<gantry::SseEvent> whole = parse(stream, std::max<size_t>(stream.size(), 1), &whole_id);
  const std::vector<gantry::SseEvent> pieces = parse(stream, piece, &pieces_id);
  FUZZ_CHECK(whole.size() == pieces.size(), "a split stream gives a different number of events");
  for (size_t i = 0; i < whole.size(); ++i) FUZZ_CHECK(same(whole[i], pieces[i]), "a split changed an event");
  FUZZ_CHECK(whole_id == pieces_id, "a split changed the last event id");

  for (const gantry::SseEvent& e : whole) {
    std::string id;
    const std::vector<gantry::SseEvent> again = parse(gantry::sse_format(e), 7, &id);
    FUZZ_CHECK(again.size() == 1 && same(again[0], e), "an event does not survive sse_format and parse");
  }
  return 0;
}
