// Server-Sent Events on the wire (WHATWG HTML §9.2, "text/event-stream"): the one event type the HTTP
// server writes and the HTTP client reads, with the formatter and an incremental parser. No I/O here, so
// both halves are tested byte by byte.
//
//   std::string wire = sse_format({.id = "42", .event = "checkpoint", .data = json.dump()});
//
//   SseParser parser;                                   // client side: feed whatever the socket gave
//   parser.feed(chunk, [&](const SseEvent& e) { handle(e); return true; });
#pragma once

#include <functional>
#include <string>
#include <string_view>

namespace gantry {

struct SseEvent {
  std::string id;                 // "" = none; a reconnecting client sends the last one as Last-Event-ID
  std::string event = "message";  // the event type; "message" is the protocol's default
  std::string data;               // may hold newlines: it travels as one "data:" line per line
};

// The wire form, ending with the blank line that dispatches it. Newlines in id or event would end the
// field early and let one event forge another, so they (and NUL in id, which clients must ignore) are
// replaced by spaces; data keeps its lines. CR and CRLF in data become LF: the parser cannot tell them apart.
std::string sse_format(const SseEvent& e);

// A comment line (": text\n\n"): ignored by clients; the server sends one when idle so that a dead
// connection is noticed on both sides and proxies do not time the stream out.
std::string sse_comment(std::string_view text);

class SseParser {
 public:
  // Returns false to stop: feed() then returns false at once and the rest of the chunk is dropped.
  using Callback = std::function<bool(const SseEvent&)>;

  // Feeds bytes in any split (a chunk may end inside a line, or between the CR and LF of a CRLF).
  // Returns false when the callback asked to stop, or when a line grew past max_line_bytes (error()
  // says so): the stream must then be closed.
  bool feed(std::string_view bytes, const Callback& on_event);

  // The id of the last event dispatched (the protocol's "last event ID": it persists across events
  // that carry no id).
  const std::string& last_event_id() const { return last_event_id_; }
  const std::string& error() const { return error_; }

  size_t max_line_bytes = 16u << 20;  // one event's line; the server's events are far smaller

 private:
  bool line(std::string_view l, const Callback& on_event);

  std::string buffer_;     // the current, unfinished line
  bool after_cr_ = false;  // the last byte was CR: an LF right after it belongs to the same line end
  std::string data_;       // data lines of the event being built, each followed by LF
  std::string event_;      // its type; "" = "message"
  std::string id_;         // the spec's "last event ID buffer": set by id fields, kept across events
  std::string last_event_id_;
  std::string error_;
};

}  // namespace gantry
