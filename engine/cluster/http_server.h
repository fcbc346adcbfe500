// The HTTP server under the coordinator's API (cpp-httplib underneath, kept out of this header). It owns
// the rules every route shares, so no route can forget one:
//   - binds 127.0.0.1 unless told otherwise; HTTPS when a certificate and key are given;
//   - every route but GET /healthz needs "Authorization: Bearer <token>" (401 otherwise; constant-time
//     compare), checked before anything else, body included, is looked at;
//   - request bodies: JSON only (415 otherwise), at most max_body_bytes (413), no chunked or compressed
//     uploads (411/415: their size is not known before reading them); the body must parse to a JSON
//     object (400 naming where it broke). A route added with post_bytes() takes its own media type
//     instead, handed over unparsed (HttpRequest::raw_body), under the same size and framing rules;
//   - unknown paths 404, a known path with another method 405; every error is {"error": "<message>"};
//   - a handler's nlohmann::json exception becomes 400 with its message, any other exception 500.
//
//   HttpServer server({.port = 0, .token = token});
//   server.get("/v1/runs/{id}", [&](const HttpRequest& req) {
//     std::optional<Run> run = runs.find(req.param("id"));
//     if (!run) return HttpResponse::error(404, "no run " + req.param("id"));
//     return HttpResponse::ok(run->json());
//   });
//   server.get("/v1/runs/{id}/events", [&](const HttpRequest& req) {
//     return HttpResponse::stream([cursor = req.last_event_id](SseWriter& w) mutable {
//       for (const Event& e : log.wait_after(cursor, 250ms))   // block a little: see SseProducer
//         if (!w.send({.id = e.id, .event = e.kind, .data = e.json})) return false;
//       return true;                                            // call me again
//     });
//   });
//   if (Status s = server.start(); !s.ok()) return fail(s.message());
//   std::printf("listening on %s\n", server.url().c_str());
//
// Threads: handlers run on the server's threads (HttpServerOptions::threads, plus private_lane_threads for
// the private lane), several at once; they must be thread-safe. A connection gets a thread only once its
// request header has arrived whole, so idle or slow clients cannot starve the server (connection_gate.h;
// plain HTTP only: a TLS server still gives each connection a thread from its first byte). An event
// stream holds one thread while it is open, so streams are capped (max_event_streams, 503 past it) to
// leave threads for ordinary requests.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>  // nlohmann::json
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "engine/cluster/sse.h"
#include "telemetry/status.h"

namespace gantry {

struct HttpServerOptions {
  std::string host = "127.0.0.1";  // "0.0.0.0" serves every interface: use TLS there
  int port = 0;                    // 0 = a free port, chosen at start(); port() says which
  std::string token;               // the bearer token (token.h); start() refuses to serve without one
  size_t max_body_bytes = 1u << 20;
  int threads = 16;           // requests served at once (the public lane)
  int max_event_streams = 8;  // event streams open at once; must leave threads for other requests
  // Requests under this path prefix are served by threads of their own, never behind the public lane's
  // (the coordinator's agents: heartbeats and records). "" = one lane for everything.
  std::string private_lane_prefix;
  int private_lane_threads = 4;
  // Connections waiting for a request (connected and silent, mid-header, or idle between requests) hold
  // no thread (connection_gate.h); at most this many wait, the oldest closed first past it.
  size_t max_waiting_connections = 512;
  std::chrono::milliseconds header_timeout{10000};   // a new connection's first request header, whole
  std::chrono::milliseconds request_timeout{30000};  // a request's body, whole, once its header is in
  std::chrono::milliseconds read_timeout{5000};      // per read of a request
  std::chrono::milliseconds write_timeout{5000};     // per write of a response (a stalled stream reader)
  std::chrono::seconds keep_alive_timeout{5};        // an idle kept-alive connection is closed after this
  // A comment on a stream idle this long. Its write is the only way a closed client is noticed (the second
  // write after the peer left fails), and until then the stream holds its thread and its place among
  // max_event_streams: so often that a client that polls by opening and closing streams is not refused.
  std::chrono::milliseconds sse_keepalive{1000};
  // HTTPS: both PEM files, or neither. A build whose cpp-httplib lacks OpenSSL refuses them at start().
  std::string tls_cert_file;
  std::string tls_key_file;
  // Other credentials than `token`, each good for some requests only (the coordinator's agents: a join
  // token for registering, a per-node credential for that node's heartbeats). Called, after `token` did not
  // match, with the request's method, decoded path and the bearer token presented; true lets the request
  // through. Compare in constant time (token_equal). Null: `token` alone.
  std::function<bool(const std::string& method, const std::string& path, std::string_view token)> also_accept;
};

struct HttpRequest {
  std::string method;                                           // "GET", "POST"
  std::string path;                                             // decoded, e.g. "/v1/runs/7/events"
  std::map<std::string, std::string, std::less<>> path_params;  // {"id": "7"} for "/v1/runs/{id}/events"
  std::multimap<std::string, std::string, std::less<>> query;   // decoded ?key=value pairs
  std::multimap<std::string, std::string> headers;  // as received (names as the client wrote them)
  nlohmann::json body;        // POST: the JSON object ({} when the body was empty); GET: null
  std::string raw_body;       // a post_bytes() route's body as sent; empty for every other route
  std::string last_event_id;  // the Last-Event-ID header: where a reconnecting event stream resumes
  std::string remote;         // "127.0.0.1:51234": who asked (events record it as "from where")

  // The path parameter (empty if the route has none of that name).
  const std::string& param(std::string_view name) const;
  // The first value of a query parameter.
  std::optional<std::string> query_value(std::string_view key) const;
  // The first value of a header, its name matched regardless of case ("" when absent).
  std::string header(std::string_view name) const;
};

// Writes one event stream's events; the server makes one and hands it to the producer on each call.
class SseWriter {
 public:
  // False when the client has gone or the server is stopping: the producer should return false.
  bool send(const SseEvent& e);
  bool stopping() const;
  // Sleeps up to `d`, waking early when the server stops; for producers with nothing better to wait on.
  void sleep(std::chrono::milliseconds d);

  struct Impl;
  explicit SseWriter(Impl* impl) : impl_(impl) {}

 private:
  Impl* impl_;
};

// Called again and again on the stream's pool thread until it returns false (the stream then ends
// cleanly), the client goes away or the server stops. Each call should wait for something to send, but
// for a fraction of a second at most (250 ms is good), because the stream notices a stopping server only
// between calls; between calls the server also sends the idle keep-alive. A call that returns at once
// having sent nothing is followed by a short pause, so a producer that does not wait cannot spin.
using SseProducer = std::function<bool(SseWriter&)>;

struct HttpResponse {
  int status = 200;
  nlohmann::json json;       // sent as application/json unless `text` or `events` is set
  std::string text;          // a non-JSON body (Prometheus exposition on /metrics)
  std::string content_type;  // with `text`; default "text/plain; charset=utf-8"
  SseProducer events;        // non-null: an event stream (text/event-stream)
  std::vector<std::pair<std::string, std::string>> headers;  // extra response headers

  static HttpResponse ok(nlohmann::json body, int status = 200);
  static HttpResponse error(int status, std::string message);  // {"error": message}
  static HttpResponse plain(std::string body, std::string content_type);
  static HttpResponse stream(SseProducer producer);
};

using HttpHandler = std::function<HttpResponse(const HttpRequest&)>;

// What a served request was, for an access log (called after the response is written).
struct HttpAccess {
  std::string method;
  std::string path;
  int status = 0;
  std::string remote;
};

class HttpServer {
 public:
  explicit HttpServer(HttpServerOptions options);
  ~HttpServer();  // stop()
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Routes, before start(). A pattern is an absolute path whose segments are literals or "{name}" (one
  // whole segment, matched by any non-empty segment). Where two routes match, the one with a literal
  // at the first differing segment wins ("/v1/runs/latest" over "/v1/runs/{id}"). A bad pattern or a
  // duplicate is reported by start(). GET /healthz is built in and open.
  // `query`: the query parameters a GET route takes. Any other, or one given twice, is refused with a 400
  // naming it and the ones taken, before the handler runs; the other methods take none.
  void get(std::string pattern, HttpHandler handler, std::vector<std::string> query = {});
  void post(std::string pattern, HttpHandler handler);
  // A DELETE: no body is read (one sent is a 400); the handler's req.body is null.
  void del(std::string pattern, HttpHandler handler);
  // A POST whose body is `media_type` (e.g. "application/octet-stream"), not JSON: 415 for any other.
  void post_bytes(std::string pattern, std::string media_type, HttpHandler handler);

  void on_access(std::function<void(const HttpAccess&)> log);

  // Checks the options and routes, binds (the error names the address and the cause) and serves on a
  // thread of its own. Returns once the socket listens.
  Status start();
  // Stops accepting, ends the event streams (each within its producer's call), waits for the requests
  // in flight and joins. Idempotent.
  void stop();

  int port() const;         // the bound port, after start()
  std::string url() const;  // "http://127.0.0.1:41234" ("https://" with TLS)
  bool running() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

// Whether this build's cpp-httplib has OpenSSL (HTTPS) support.
bool http_server_tls_available();

}  // namespace gantry
