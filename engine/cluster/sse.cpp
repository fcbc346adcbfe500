#include "engine/cluster/sse.h"

namespace gantry {
namespace {

// A field value that must stay on one line.
std::string one_line(std::string_view v, bool no_nul) {
  std::string out(v);
  for (char& c : out) {
    if (c == '\n' || c == '\r' || (no_nul && c == '\0')) c = ' ';
  }
  return out;
}

}  // namespace

std::string sse_format(const SseEvent& e) {
  std::string out;
  out.reserve(e.data.size() + e.event.size() + e.id.size() + 32);
  if (!e.id.empty()) out += "id: " + one_line(e.id, /*no_nul=*/true) + "\n";
  if (!e.event.empty() && e.event != "message") out += "event: " + one_line(e.event, false) + "\n";
  // One data line per line of data; an empty data still needs one "data:" line to be dispatched.
  size_t start = 0;
  while (true) {
    size_t end = e.data.find_first_of("\r\n", start);
    out += "data: ";
    out.append(e.data, start, end == std::string::npos ? std::string::npos : end - start);
    out += "\n";
    if (end == std::string::npos) break;
    start = end + 1;
    if (e.data[end] == '\r' && start < e.data.size() && e.data[start] == '\n') ++start;  // CRLF is one break
  }
  out += "\n";
  return out;
}

std::string sse_comment(std::string_view text) {
  return ": " + one_line(text, false) + "\n\n";
}

bool SseParser::feed(std::string_view bytes, const Callback& on_event) {
  if (!error_.empty()) return false;
  size_t start = 0;
  for (size_t i = 0; i < bytes.size(); ++i) {
    const char c = bytes[i];
    if (c != '\n' && c != '\r') continue;
    if (c == '\n' && after_cr_ && i == start && buffer_.empty()) {
      // The LF of a CRLF whose CR ended the previous line (possibly in the previous chunk).
      after_cr_ = false;
      start = i + 1;
      continue;
    }
    buffer_.append(bytes.data() + start, i - start);
    after_cr_ = c == '\r';
    start = i + 1;
    std::string l;
    l.swap(buffer_);
    if (!line(l, on_event)) return false;
  }
  if (start < bytes.size()) {
    after_cr_ = false;
    buffer_.append(bytes.data() + start, bytes.size() - start);
    if (buffer_.size() > max_line_bytes) {
      error_ = "event stream line longer than " + std::to_string(max_line_bytes) + " bytes";
      return false;
    }
  }
  return true;
}

bool SseParser::line(std::string_view l, const Callback& on_event) {
  if (l.empty()) {  // dispatch
    last_event_id_ = id_;
    if (data_.empty()) {
      event_.clear();
      return true;
    }
    SseEvent e;
    e.id = last_event_id_;
    if (!event_.empty()) e.event = event_;
    data_.pop_back();  // the LF after the last data line
    e.data.swap(data_);
    data_.clear();
    event_.clear();
    return on_event(e);
  }
  if (l.front() == ':') return true;  // a comment
  const size_t colon = l.find(':');
  std::string_view field = l.substr(0, colon);
  std::string_view value;
  if (colon != std::string_view::npos) {
    value = l.substr(colon + 1);
    if (!value.empty() && value.front() == ' ') value.remove_prefix(1);
  }
  if (field == "data") {
    data_.append(value);
    data_ += '\n';
  } else if (field == "event") {
    event_ = value;
  } else if (field == "id") {
    if (value.find('\0') == std::string_view::npos) id_ = value;
  }
  // "retry" and unknown fields are ignored, as the spec says: reconnecting is the caller's decision.
  return true;
}

}  // namespace gantry
