// The coordinator's HTTP client (libcurl underneath, kept out of this header), shared by the console and
// `gantry-engine ctl`: JSON requests with the bearer token, timeouts, and an event-stream reader. Errors
// say what could not be reached and why, in the operator's words:
//   "cannot reach coordinator at http://127.0.0.1:7077: connection refused (is it running? ...)"
//   "coordinator at http://127.0.0.1:7077 did not answer GET /v1/runs within 30 s"
//   "POST /v1/runs: 409 Conflict: cannot place dp 3 x tp 2 x pp 1 (6 ranks): needs 6 free slots, ..."
//
//   HttpClient api({.url = "http://127.0.0.1:7077", .token = token_file_read(path).value()});
//   Result<nlohmann::json> runs = api.get_json("/v1/runs");          // non-2xx is an error
//   Result<HttpReply> r = api.post("/v1/runs", job);                  // the status is the caller's
//
//   HttpEventStream events({.url = url, .token = token});
//   std::thread t([&] { Status s = events.run("/v1/runs/7/events", [&](const SseEvent& e) {
//     show(e); return true; }); });
//   ...
//   events.stop();  // from any thread: run() returns promptly with ok
//   t.join();
//
// An HttpClient keeps one connection alive between calls; use it from one thread at a time (make one per
// thread). An HttpEventStream runs one stream at a time.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>  // nlohmann::json
#include <string>
#include <string_view>

#include "engine/cluster/sse.h"
#include "telemetry/status.h"

namespace gantry {

struct HttpClientOptions {
  std::string url;    // the server's base: "http://127.0.0.1:7077" or "https://host:7077" (no path)
  std::string token;  // the bearer token (token_file_read)
  std::chrono::milliseconds connect_timeout{5000};
  std::chrono::milliseconds timeout{30000};  // a whole request and its reply (not an event stream)
  // HTTPS: a PEM file of the certificate authority to trust, e.g. a self-signed coordinator's own
  // certificate. Empty: the system's store. Peers are always verified; there is no "insecure" switch.
  std::string ca_file;
  std::string peer = "coordinator";  // what errors call the server
  size_t max_reply_bytes = 64u << 20;
  // An event stream with no bytes (events or the server's keep-alive comments) for this long is
  // presumed dead and run() fails; 0 = never. The server sends a keep-alive every 15 s by default.
  std::chrono::milliseconds stream_idle_timeout{60000};
};

struct HttpReply {
  int status = 0;
  std::string content_type;
  std::string body;

  bool ok() const { return status >= 200 && status < 300; }
  // Parses the body; an error names the request's status and what failed.
  Result<nlohmann::json> json() const;
  // The server's message: "error" of a JSON error body, else the body's first line, else the reason
  // phrase ("Not Found").
  std::string error_message() const;
};

class HttpClient {
 public:
  explicit HttpClient(HttpClientOptions options);
  ~HttpClient();
  HttpClient(const HttpClient&) = delete;
  HttpClient& operator=(const HttpClient&) = delete;

  // Any status the server answered is a reply; an error means no answer (unreachable, timed out, TLS,
  // a reply over max_reply_bytes) or bad options.
  Result<HttpReply> get(std::string_view path);
  Result<HttpReply> post(std::string_view path, const nlohmann::json& body);
  // A body that is not JSON (an agent's binary heartbeat, agent_beat.h), sent as `content_type`.
  Result<HttpReply> post_bytes(std::string_view path, std::string_view body, std::string_view content_type);

  // As above, but a non-2xx reply is an error too: "GET /v1/runs/9: 404 Not Found: no run 9".
  Result<nlohmann::json> get_json(std::string_view path);
  Result<nlohmann::json> post_json(std::string_view path, const nlohmann::json& body);
  Result<HttpReply> del(std::string_view path);  // DELETE, without a body
  Result<nlohmann::json> del_json(std::string_view path);

  const HttpClientOptions& options() const { return opt_; }

 private:
  Result<HttpReply> request(const char* method, std::string_view path, const std::string_view* body,
                            std::string_view content_type = "application/json");

  HttpClientOptions opt_;
  void* curl_ = nullptr;  // CURL*, reused so the connection stays open between requests
};

class HttpEventStream {
 public:
  explicit HttpEventStream(HttpClientOptions options);
  ~HttpEventStream();
  HttpEventStream(const HttpEventStream&) = delete;
  HttpEventStream& operator=(const HttpEventStream&) = delete;

  // Opens the stream (sending Last-Event-ID when last_event_id is not empty) and calls on_event, on this
  // thread, for each event in order. Returns ok when the server ends the stream, on_event returns false,
  // or stop() is called; an error when the stream cannot be opened (the server's status and message),
  // breaks, or falls idle past stream_idle_timeout. To resume after an error, run again with
  // last_event_id().
  Status run(std::string_view path, const std::function<bool(const SseEvent&)>& on_event,
             std::string last_event_id = "");

  // From any thread: makes run() return (within milliseconds), now or as soon as it starts. Sticky.
  void stop();

  // The id of the last event received (the protocol's "last event ID"), for resuming.
  std::string last_event_id() const;

 private:
  HttpClientOptions opt_;
  std::atomic<bool> stop_{false};
  mutable std::mutex mu_;
  void* multi_ = nullptr;  // CURLM* while run() is running, under mu_ (stop() wakes it)
  std::string last_event_id_;
};

}  // namespace gantry
