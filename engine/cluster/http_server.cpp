#include "engine/cluster/http_server.h"

#include <arpa/inet.h>  // inet_ntop: the client's address for the access log
#include <httplib.h>    // cpp-httplib, compiled with the definitions its pkg-config file gives (OpenSSL, ...)
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <thread>

#include "engine/cluster/connection_gate.h"
#include "engine/cluster/http_status.h"
#include "engine/cluster/json_fields.h"
#include "engine/cluster/token.h"

namespace gantry {
namespace {

using Clock = std::chrono::steady_clock;

// The routes' path segments: a literal, or a parameter that matches any non-empty segment.
struct Segment {
  std::string literal;
  std::string param;  // non-empty: a parameter
};

struct Route {
  std::string method;
  std::string pattern;
  std::vector<Segment> segments;
  HttpHandler handler;
  std::string body_type;           // "" = a JSON object; else the one media type taken, passed on unparsed
  std::vector<std::string> query;  // the query parameters it takes; any other is refused before it runs
};

// "/v1/runs/7/" -> {"v1", "runs", "7"}; false for an empty segment ("//"), which no route has.
bool split_path(std::string_view path, std::vector<std::string_view>* out) {
  out->clear();
  if (path.empty() || path.front() != '/') return false;
  path.remove_prefix(1);
  if (!path.empty() && path.back() == '/') path.remove_suffix(1);  // "/v1/runs/" is "/v1/runs"
  if (path.empty()) return true;
  size_t start = 0;
  while (true) {
    const size_t slash = path.find('/', start);
    std::string_view seg =
        path.substr(start, slash == std::string_view::npos ? std::string_view::npos : slash - start);
    if (seg.empty()) return false;
    out->push_back(seg);
    if (slash == std::string_view::npos) return true;
    start = slash + 1;
  }
}

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

std::string dump(const nlohmann::json& j) {
  // Error messages may quote what a client sent, which need not be UTF-8: replace, never throw.
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

void write_json(httplib::Response& res, int status, const nlohmann::json& body) {
  res.status = status;
  res.set_content(dump(body), "application/json");
}

void write_error(httplib::Response& res, int status, const std::string& message) {
  write_json(res, status, nlohmann::json{{"error", message}});
}

// Strips HTTP parameters and case: "Application/JSON; charset=utf-8" -> "application/json".
std::string media_type(const std::string& content_type) {
  std::string t = lower(content_type.substr(0, content_type.find(';')));
  while (!t.empty() && (t.back() == ' ' || t.back() == '\t')) t.pop_back();
  while (!t.empty() && (t.front() == ' ' || t.front() == '\t')) t.erase(0, 1);
  return t;
}

// One request's connection, handed over by the gate with its header waiting whole on the socket. The header
// is taken off in one read (the gate saw exactly how long it is), so httplib's byte-at-a-time header
// parsing costs no system calls; the body is read as httplib asks, each read within read_timeout and all
// of them within the request's deadline. Nothing past this request is ever read: the next one stays on
// the socket for the gate.
class GatedStream final : public httplib::Stream {
 public:
  GatedStream(int fd, size_t header_bytes, const HttpServerOptions& o)
      : fd_(fd),
        read_timeout_(o.read_timeout),
        write_timeout_(o.write_timeout),
        deadline_(Clock::now() + o.request_timeout) {
    head_.resize(header_bytes);
    size_t got = 0;
    while (got < header_bytes) {
      const ssize_t n = ::recv(fd, head_.data() + got, header_bytes - got, MSG_DONTWAIT);
      if (n <= 0) break;
      got += static_cast<size_t>(n);
    }
    head_.resize(got);
  }

  bool is_readable() const override { return pos_ < head_.size() || wait(POLLIN, read_timeout_); }
  bool is_writable() const override { return wait(POLLOUT, write_timeout_); }

  ssize_t read(char* ptr, size_t size) override {
    if (pos_ < head_.size()) {
      const size_t n = std::min(size, head_.size() - pos_);
      std::memcpy(ptr, head_.data() + pos_, n);
      pos_ += n;
      return static_cast<ssize_t>(n);
    }
    if (!wait(POLLIN, read_timeout_)) return -1;
    const ssize_t n = ::recv(fd_, ptr, size, 0);
    if (n > 0) body_read_ += static_cast<size_t>(n);
    return n;
  }

  // After the response: whether the connection is fit for the next request. A request answered before its
  // body was read (a 401, a 413) leaves the body on the socket, where it would be taken for the next
  // request: a small one that has arrived is read off and dropped, anything else ends the connection,
  // with linger_close() so the answer is not lost.
  bool finish_request() {
    size_t left = unread_body();
    if (left == 0) return true;
    constexpr size_t kMaxDrain = 64 * 1024;
    if (left > kMaxDrain) return false;
    char sink[4096];
    while (left > 0) {
      const ssize_t n = ::recv(fd_, sink, std::min(left, sizeof sink), MSG_DONTWAIT);
      if (n <= 0) return false;
      left -= static_cast<size_t>(n);
      body_read_ += static_cast<size_t>(n);
    }
    return true;
  }

  // Ends a connection whose request body was not read whole. Closing a socket with unread bytes makes the
  // kernel send a reset, and a client still sending its body (or not yet reading) then loses the answer
  // already written (the 413 saying how large a body may be). So: end our side (FIN after the answer),
  // read off what the client still sends, within bounds, and only then close (nginx's lingering close).
  void linger_close() {
    ::shutdown(fd_, SHUT_WR);
    constexpr size_t kMaxLingerBytes = 64u << 20;
    constexpr auto kMaxLinger = std::chrono::seconds(2);
    const Clock::time_point until = Clock::now() + kMaxLinger;
    size_t drained = 0;
    char sink[16384];
    while (drained < kMaxLingerBytes) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - Clock::now());
      if (left.count() <= 0) return;
      pollfd p{.fd = fd_, .events = POLLIN, .revents = 0};
      if (::poll(&p, 1, static_cast<int>(left.count())) <= 0) return;
      const ssize_t n = ::recv(fd_, sink, sizeof sink, MSG_DONTWAIT);
      if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) return;  // the client is done
      if (n > 0) drained += static_cast<size_t>(n);
    }
  }

  // How much of the request's declared body is still on the socket: 0 when all of it was read or none
  // was declared; SIZE_MAX for a chunked body, whose length is not known.
  size_t unread_body() const {
    std::string lower_head(head_);
    for (char& ch : lower_head) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    if (lower_head.find("\r\ntransfer-encoding:") != std::string::npos) return SIZE_MAX;
    const size_t at = lower_head.find("\r\ncontent-length:");
    if (at == std::string::npos) return 0;
    const size_t length = std::strtoull(head_.c_str() + at + 17, nullptr, 10);
    return length <= body_read_ ? 0 : length - body_read_;
  }

  ssize_t write(const char* ptr, size_t size) override {
    if (!is_writable()) return -1;
    return ::send(fd_, ptr, size, MSG_NOSIGNAL);
  }

  void get_remote_ip_and_port(std::string& ip, int& port) const override { address(::getpeername, ip, port); }
  void get_local_ip_and_port(std::string& ip, int& port) const override { address(::getsockname, ip, port); }
  socket_t socket() const override { return fd_; }

 private:
  // Waits up to `limit` for the socket to be ready; reads also stop at the request's deadline.
  bool wait(short events, std::chrono::milliseconds limit) const {
    if (events == POLLIN) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline_ - Clock::now());
      limit = std::min(limit, std::max(left, std::chrono::milliseconds(0)));
    }
    pollfd p{.fd = fd_, .events = events, .revents = 0};
    int n;
    do {
      n = ::poll(&p, 1, static_cast<int>(limit.count()));
    } while (n < 0 && errno == EINTR);
    return n > 0 && (p.revents & (events | POLLHUP)) != 0;
  }

  template <class Get>
  void address(Get get, std::string& ip, int& port) const {
    sockaddr_storage a{};
    socklen_t len = sizeof a;
    ip.clear();
    port = 0;
    if (get(fd_, reinterpret_cast<sockaddr*>(&a), &len) != 0) return;
    char text[INET6_ADDRSTRLEN] = {};
    if (a.ss_family == AF_INET) {
      const auto* v4 = reinterpret_cast<const sockaddr_in*>(&a);
      ::inet_ntop(AF_INET, &v4->sin_addr, text, sizeof text);
      port = ntohs(v4->sin_port);
    } else if (a.ss_family == AF_INET6) {
      const auto* v6 = reinterpret_cast<const sockaddr_in6*>(&a);
      ::inet_ntop(AF_INET6, &v6->sin6_addr, text, sizeof text);
      port = ntohs(v6->sin6_port);
    }
    ip = text;
  }

  int fd_;
  std::string head_;
  size_t pos_ = 0;
  size_t body_read_ = 0;
  std::chrono::milliseconds read_timeout_, write_timeout_;
  Clock::time_point deadline_;
};

// httplib's own accept loop, with every accepted connection passed to the gate instead of to a thread
// that would wait on it. The accept loop hands each connection to its task queue; an inline queue makes
// that hand-over (process_and_close_socket, overridden here) run on the accept thread and return at once.
class GatedServer final : public httplib::Server {
 public:
  void set_gate(ConnectionGate* gate) { gate_ = gate; }

  // One request on a connection the gate found ready; true keeps the connection for its next request.
  bool serve(int fd, size_t header_bytes, const HttpServerOptions& o, bool stopping) {
    GatedStream stream(fd, header_bytes, o);
    bool closed = false;
    const bool ok = process_request(stream, /*close_connection=*/stopping, closed, nullptr);
    if (ok && !closed && stream.finish_request()) return true;
    if (stream.unread_body() > 0) stream.linger_close();
    return false;
  }

 private:
  bool process_and_close_socket(socket_t sock) override {
    gate_->admit(sock);
    return true;
  }

  ConnectionGate* gate_ = nullptr;
};

class InlineTaskQueue final : public httplib::TaskQueue {
 public:
  void enqueue(std::function<void()> fn) override { fn(); }
  void shutdown() override {}
};

}  // namespace

// ---------------------------------------------------------------------------------------------------------
// Requests and responses

const std::string& HttpRequest::param(std::string_view name) const {
  static const std::string kEmpty;
  auto it = path_params.find(name);
  return it == path_params.end() ? kEmpty : it->second;
}

std::optional<std::string> HttpRequest::query_value(std::string_view key) const {
  auto it = query.find(key);
  if (it == query.end()) return std::nullopt;
  return it->second;
}

std::string HttpRequest::header(std::string_view name) const {
  const std::string want = lower(name);
  for (const auto& [k, v] : headers) {
    if (lower(k) == want) return v;
  }
  return "";
}

HttpResponse HttpResponse::ok(nlohmann::json body, int status) {
  HttpResponse r;
  r.status = status;
  r.json = std::move(body);
  return r;
}

HttpResponse HttpResponse::error(int status, std::string message) {
  HttpResponse r;
  r.status = status;
  r.json = nlohmann::json{{"error", std::move(message)}};
  return r;
}

HttpResponse HttpResponse::plain(std::string body, std::string content_type) {
  HttpResponse r;
  r.text = std::move(body);
  r.content_type = std::move(content_type);
  return r;
}

HttpResponse HttpResponse::stream(SseProducer producer) {
  HttpResponse r;
  r.events = std::move(producer);
  return r;
}

// ---------------------------------------------------------------------------------------------------------
// The server

struct HttpServer::Impl {
  HttpServerOptions opt;
  std::vector<Route> routes;
  std::string route_error;  // the first bad route; start() reports it
  std::function<void(const HttpAccess&)> access;

  std::unique_ptr<httplib::Server> server;
  std::unique_ptr<ConnectionGate> connections;  // plain HTTP: where connections wait for their requests
  std::thread thread;
  int port = 0;
  bool tls = false;
  std::atomic<bool> running{false};
  std::atomic<bool> stopping{false};
  std::mutex stop_mu;
  std::condition_variable stop_cv;
  std::atomic<int> streams{0};

  void add(std::string method, std::string pattern, HttpHandler handler, std::string body_type = "",
           std::vector<std::string> query = {});
  // The route for method and path; else nullptr with *allow naming the methods the path has (for 405).
  const Route* match(std::string_view method, std::string_view path,
                     std::map<std::string, std::string, std::less<>>* params, std::string* allow) const;
  // The checks every request passes before its body is read: auth, route, body framing and size. A
  // value means "answer this now".
  std::optional<HttpResponse> gate(const httplib::Request& req) const;
  void dispatch(const httplib::Request& req, httplib::Response& res);
  void respond(const HttpResponse& out, httplib::Response& res);
  void sleep(std::chrono::milliseconds d);
};

void HttpServer::Impl::add(std::string method, std::string pattern, HttpHandler handler,
                           std::string body_type, std::vector<std::string> query) {
  auto bad = [&](const std::string& why) {
    if (route_error.empty()) route_error = "route " + method + " " + pattern + ": " + why;
  };
  Route r{.method = method,
          .pattern = pattern,
          .handler = std::move(handler),
          .body_type = std::move(body_type),
          .query = std::move(query)};
  std::vector<std::string_view> segs;
  if (!split_path(pattern, &segs))
    return bad("must be an absolute path without empty segments, e.g. /v1/runs/{id}");
  if (!r.handler) return bad("has no handler");
  for (std::string_view s : segs) {
    Segment seg;
    if (s.front() == '{' || s.back() == '}' || s.find_first_of("{}") != std::string_view::npos) {
      if (s.size() < 3 || s.front() != '{' || s.back() != '}' ||
          s.substr(1, s.size() - 2).find_first_of("{}") != std::string_view::npos) {
        return bad("segment \"" + std::string(s) + "\": a parameter is a whole segment, {name}");
      }
      seg.param = std::string(s.substr(1, s.size() - 2));
      for (const Segment& other : r.segments) {
        if (other.param == seg.param) return bad("parameter {" + seg.param + "} appears twice");
      }
    } else {
      seg.literal = std::string(s);
    }
    r.segments.push_back(std::move(seg));
  }
  if (r.segments.size() == 1 && r.segments[0].literal == "healthz") return bad("/healthz is built in");
  for (const Route& other : routes) {
    if (other.method != r.method || other.segments.size() != r.segments.size()) continue;
    bool same = true;
    for (size_t i = 0; i < r.segments.size() && same; ++i) {
      same = r.segments[i].param.empty() == other.segments[i].param.empty() &&
             r.segments[i].literal == other.segments[i].literal;
    }
    if (same) return bad("duplicates " + other.method + " " + other.pattern);
  }
  routes.push_back(std::move(r));
}

const Route* HttpServer::Impl::match(std::string_view method, std::string_view path,
                                     std::map<std::string, std::string, std::less<>>* params,
                                     std::string* allow) const {
  std::vector<std::string_view> segs;
  if (!split_path(path, &segs)) return nullptr;
  const Route* best = nullptr;
  std::vector<std::string> methods;
  for (const Route& r : routes) {
    if (r.segments.size() != segs.size()) continue;
    bool hit = true;
    for (size_t i = 0; i < segs.size() && hit; ++i) {
      hit = r.segments[i].param.empty() ? r.segments[i].literal == segs[i] : true;
    }
    if (!hit) continue;
    if (r.method != method) {
      if (std::find(methods.begin(), methods.end(), r.method) == methods.end()) methods.push_back(r.method);
      continue;
    }
    if (best) {
      // The first segment where one has a literal and the other a parameter decides.
      for (size_t i = 0; i < segs.size(); ++i) {
        const bool lit_best = best->segments[i].param.empty(), lit_r = r.segments[i].param.empty();
        if (lit_best != lit_r) {
          if (lit_r) best = &r;
          break;
        }
      }
    } else {
      best = &r;
    }
  }
  if (best && params) {
    params->clear();
    for (size_t i = 0; i < segs.size(); ++i) {
      if (!best->segments[i].param.empty()) (*params)[best->segments[i].param] = std::string(segs[i]);
    }
  }
  if (!best && allow) {
    std::sort(methods.begin(), methods.end());
    allow->clear();
    for (const std::string& m : methods) *allow += (allow->empty() ? "" : ", ") + m;
  }
  return best;
}

std::optional<HttpResponse> HttpServer::Impl::gate(const httplib::Request& req) const {
  if (req.path == "/healthz") {
    if (req.method == "GET") return HttpResponse::ok({{"status", "ok"}});
    HttpResponse r = HttpResponse::error(405, req.method + " /healthz: only GET is served here");
    r.headers.emplace_back("Allow", "GET");
    return r;
  }

  // Authentication first: nothing about the routes is told to a client without the token.
  const std::string auth = req.get_header_value("Authorization");
  std::string_view presented;
  std::optional<std::string> refusal;
  if (!req.has_header("Authorization")) {
    refusal =
        "missing Authorization header: send 'Authorization: Bearer <token>' with the token from the "
        "coordinator's token file";
  } else if (auth.size() < 7 || lower(auth.substr(0, 7)) != "bearer ") {
    refusal = "Authorization header must be 'Bearer <token>'";
  } else {
    presented = std::string_view(auth).substr(7);
    while (!presented.empty() && presented.front() == ' ') presented.remove_prefix(1);
    if (!token_equal(presented, opt.token) &&
        !(opt.also_accept && opt.also_accept(req.method, req.path, presented))) {
      refusal = "invalid bearer token";
    }
  }
  if (refusal) {
    HttpResponse r = HttpResponse::error(401, *refusal);
    r.headers.emplace_back("WWW-Authenticate", "Bearer realm=\"gantry\"");
    return r;
  }

  std::string allow;
  const Route* route = match(req.method, req.path, nullptr, &allow);
  if (!route) {
    if (allow.empty()) return HttpResponse::error(404, "no route " + req.method + " " + req.path);
    HttpResponse r = HttpResponse::error(405, req.method + " " + req.path + " is not served; " + allow +
                                                  (allow.find(',') == std::string::npos ? " is" : " are"));
    r.headers.emplace_back("Allow", allow);
    return r;
  }

  // A parameter the route does not read would be ignored, and the client would take an answer to another
  // question for its own ("?bucket=10" for "?buckets=10"); one given twice has no one meaning.
  for (auto it = req.params.begin(); it != req.params.end(); it = req.params.upper_bound(it->first)) {
    const std::string& key = it->first;
    if (std::find(route->query.begin(), route->query.end(), key) == route->query.end()) {
      std::string takes;
      for (const std::string& k : route->query) takes += (takes.empty() ? "" : ", ") + k;
      return HttpResponse::error(400, "unknown query parameter \"" + key.substr(0, 64) + "\" on " +
                                          req.method + " " + route->pattern +
                                          (takes.empty() ? ": it takes none" : ": it takes " + takes));
    }
    if (const size_t n = req.params.count(key); n > 1) {
      return HttpResponse::error(400, "query parameter \"" + key + "\" given " + std::to_string(n) +
                                          " times on " + req.method + " " + route->pattern +
                                          ": give it once");
    }
  }

  if (req.method == "DELETE" &&
      (req.has_header("Transfer-Encoding") ||
       (req.has_header("Content-Length") && req.get_header_value("Content-Length") != "0"))) {
    // No DELETE route reads a body: one sent is refused before it is read, so none is held to no limit.
    return HttpResponse::error(400, "DELETE " + req.path + " takes no request body: send it without one");
  }
  if (req.method == "POST") {
    // The size of a chunked or compressed body is known only after reading (or inflating) it, past the
    // limit: refuse them, so that Content-Length is the whole truth.
    if (req.has_header("Transfer-Encoding")) {
      return HttpResponse::error(
          411, "chunked request bodies are not accepted: send the body with a Content-Length");
    }
    if (req.has_header("Content-Encoding") && lower(req.get_header_value("Content-Encoding")) != "identity") {
      return HttpResponse::error(415, "compressed request bodies (Content-Encoding: " +
                                          req.get_header_value("Content-Encoding") + ") are not accepted");
    }
    if (!req.has_header("Content-Length")) {
      return HttpResponse::error(411, "POST needs a Content-Length header (0 for an empty body)");
    }
    const std::string cl = req.get_header_value("Content-Length");
    uint64_t length = 0;
    bool digits = !cl.empty() && cl.size() <= 19;
    for (char c : cl) {
      digits = digits && c >= '0' && c <= '9';
      if (digits) length = length * 10 + static_cast<uint64_t>(c - '0');
    }
    if (!digits) return HttpResponse::error(400, "Content-Length \"" + cl + "\" is not a byte count");
    if (length > opt.max_body_bytes) {
      return HttpResponse::error(413, "request body of " + std::to_string(length) +
                                          " bytes is over the limit of " +
                                          std::to_string(opt.max_body_bytes) + " bytes");
    }
    if (length > 0) {
      const std::string type = media_type(req.get_header_value("Content-Type"));
      if (!route->body_type.empty() && type != route->body_type) {
        return HttpResponse::error(415, "request body must be " + route->body_type +
                                            ": send Content-Type: " + route->body_type +
                                            (type.empty() ? std::string() : " (got " + type + ")"));
      }
      if (route->body_type.empty() && type != "application/json") {
        return HttpResponse::error(415, "request body must be JSON: send Content-Type: application/json" +
                                            (type.empty() ? std::string() : " (got " + type + ")"));
      }
    }
  }
  return std::nullopt;
}

struct SseWriter::Impl {
  httplib::DataSink* sink = nullptr;
  HttpServer::Impl* server = nullptr;
  bool wrote = false;
  bool failed = false;
};

void HttpServer::Impl::respond(const HttpResponse& out, httplib::Response& res) {
  for (const auto& [k, v] : out.headers) res.set_header(k, v);
  if (!out.events) {
    res.status = out.status;
    if (!out.text.empty() || !out.content_type.empty()) {
      res.set_content(out.text, out.content_type.empty() ? "text/plain; charset=utf-8" : out.content_type);
    } else {
      res.set_content(dump(out.json.is_null() ? nlohmann::json::object() : out.json), "application/json");
    }
    return;
  }
  if (streams.fetch_add(1) >= opt.max_event_streams) {
    streams.fetch_sub(1);
    write_error(res, 503,
                "too many event streams open (" + std::to_string(opt.max_event_streams) +
                    "): close one, or start the server with a larger max_event_streams");
    return;
  }
  // The stream's state lives as long as the content provider does; its destructor gives the stream's
  // place back however the response ends.
  struct Stream {
    Impl* server = nullptr;
    SseProducer producer;
    Clock::time_point last_write = Clock::now();
    ~Stream() {
      if (server) server->streams.fetch_sub(1);
    }
  };
  auto stream = std::make_shared<Stream>();
  stream->server = this;
  stream->producer = out.events;
  res.status = out.status;
  res.set_header("Cache-Control", "no-cache");
  res.set_header("X-Accel-Buffering", "no");  // proxies (nginx) must pass events on at once
  res.set_chunked_content_provider("text/event-stream", [stream](size_t, httplib::DataSink& sink) {
    Impl& s = *stream->server;
    if (s.stopping.load()) {
      sink.done();
      return true;
    }
    SseWriter::Impl w{.sink = &sink, .server = &s};
    SseWriter writer(&w);
    const Clock::time_point t0 = Clock::now();
    const bool more = stream->producer(writer);
    if (w.failed) return false;  // the client went away: abandon the response
    if (!more || s.stopping.load()) {
      sink.done();
      return true;
    }
    const Clock::time_point now = Clock::now();
    if (w.wrote) {
      stream->last_write = now;
    } else if (now - stream->last_write >= s.opt.sse_keepalive) {
      const std::string c = sse_comment("keep-alive");
      if (!sink.write(c.data(), c.size())) return false;
      stream->last_write = now;
    } else if (now - t0 < std::chrono::milliseconds(1)) {
      s.sleep(std::chrono::milliseconds(20));  // a producer that does not wait must not spin
    }
    return true;
  });
}

bool SseWriter::send(const SseEvent& e) {
  if (impl_->failed || impl_->server->stopping.load()) return false;
  const std::string wire = sse_format(e);
  if (!impl_->sink->write(wire.data(), wire.size())) {
    impl_->failed = true;
    return false;
  }
  impl_->wrote = true;
  return true;
}

bool SseWriter::stopping() const {
  return impl_->server->stopping.load();
}

void SseWriter::sleep(std::chrono::milliseconds d) {
  impl_->server->sleep(d);
}

void HttpServer::Impl::sleep(std::chrono::milliseconds d) {
  std::unique_lock<std::mutex> lock(stop_mu);
  stop_cv.wait_for(lock, d, [this] { return stopping.load(); });
}

void HttpServer::Impl::dispatch(const httplib::Request& req, httplib::Response& res) {
  HttpRequest r;
  std::string allow;
  const Route* route = match(req.method, req.path, &r.path_params, &allow);
  if (!route) {  // the gate matched it already; only a changed request could get here
    write_error(res, 404, "no route " + req.method + " " + req.path);
    return;
  }
  r.method = req.method;
  r.path = req.path;
  for (const auto& [k, v] : req.params) r.query.emplace(k, v);
  for (const auto& [k, v] : req.headers) r.headers.emplace(k, v);
  r.last_event_id = req.get_header_value("Last-Event-ID");
  r.remote = req.remote_addr + ":" + std::to_string(req.remote_port);
  if (req.method == "POST" && !route->body_type.empty()) {
    r.raw_body = req.body;  // the route reads its own format
  } else if (req.method == "POST") {
    if (req.body.empty()) {
      r.body = nlohmann::json::object();
    } else {
      Result<nlohmann::json> body = json_parse_bounded(req.body);
      if (!body.ok()) {
        write_error(res, 400, "request body is not valid JSON: " + body.error());
        return;
      }
      r.body = std::move(body.value());
      if (!r.body.is_object()) {
        write_error(res, 400, "request body must be a JSON object, got " + json_type_phrase(r.body));
        return;
      }
    }
  }
  HttpResponse out;
  try {
    out = route->handler(r);
  } catch (const nlohmann::json::exception& e) {
    // A handler reading the body with nlohmann's own accessors: the client sent the wrong shape.
    out = HttpResponse::error(400, "bad request body: " + json_error_text(e));
  } catch (const std::exception& e) {
    out = HttpResponse::error(
        500, std::string("internal error in ") + route->method + " " + route->pattern + ": " + e.what());
  }
  respond(out, res);
}

HttpServer::HttpServer(HttpServerOptions options) : impl_(std::make_unique<Impl>()) {
  impl_->opt = std::move(options);
}

HttpServer::~HttpServer() {
  stop();
}

void HttpServer::get(std::string pattern, HttpHandler handler, std::vector<std::string> query) {
  impl_->add("GET", std::move(pattern), std::move(handler), "", std::move(query));
}

void HttpServer::post(std::string pattern, HttpHandler handler) {
  impl_->add("POST", std::move(pattern), std::move(handler));
}

void HttpServer::del(std::string pattern, HttpHandler handler) {
  impl_->add("DELETE", std::move(pattern), std::move(handler));
}

void HttpServer::post_bytes(std::string pattern, std::string media_type, HttpHandler handler) {
  impl_->add("POST", std::move(pattern), std::move(handler), std::move(media_type));
}

void HttpServer::on_access(std::function<void(const HttpAccess&)> log) {
  impl_->access = std::move(log);
}

bool http_server_tls_available() {
#ifdef CPPHTTPLIB_OPENSSL_SUPPORT
  return true;
#else
  return false;
#endif
}

Status HttpServer::start() {
  Impl& s = *impl_;
  const HttpServerOptions& o = s.opt;
  auto fail = [](const std::string& why) { return Status::error("HTTP server: " + why); };
  if (s.server) return fail("already started");
  if (!s.route_error.empty()) return fail(s.route_error);
  if (Status t = token_check(o.token); !t.ok()) {
    return fail("refusing to serve without a usable bearer token: " + t.message());
  }
  if (o.threads < 2) return fail("threads " + std::to_string(o.threads) + " must be at least 2");
  if (o.max_event_streams < 0 || o.max_event_streams >= o.threads) {
    return fail("max_event_streams " + std::to_string(o.max_event_streams) +
                " must be in [0, threads - 1 = " + std::to_string(o.threads - 1) +
                "]: each open stream holds a thread");
  }
  if (o.port < 0 || o.port > 65535) return fail("port " + std::to_string(o.port) + " must be in [0, 65535]");

  if (o.tls_cert_file.empty() != o.tls_key_file.empty()) {
    return fail("TLS needs both a certificate and a key file (got only the " +
                std::string(o.tls_cert_file.empty() ? "key" : "certificate") + ")");
  }
  if (!o.tls_cert_file.empty()) {
#ifdef CPPHTTPLIB_OPENSSL_SUPPORT
    for (const std::string* f : {&o.tls_cert_file, &o.tls_key_file}) {
      if (::access(f->c_str(), R_OK) != 0)
        return fail("cannot read TLS file " + *f + ": " + std::strerror(errno));
    }
    auto ssl = std::make_unique<httplib::SSLServer>(o.tls_cert_file.c_str(), o.tls_key_file.c_str());
    if (!ssl->is_valid()) {
      return fail("cannot load TLS certificate " + o.tls_cert_file + " with key " + o.tls_key_file +
                  ": both must be PEM files and the key must match the certificate");
    }
    s.server = std::move(ssl);
    s.tls = true;
#else
    return fail("TLS was asked for, but this build's cpp-httplib has no OpenSSL support");
#endif
  } else {
    auto gated = std::make_unique<GatedServer>();
    GatedServer* g = gated.get();
    const std::string prefix = o.private_lane_prefix;
    ConnectionGateOptions gate_options{.max_waiting = o.max_waiting_connections,
                                       .header_timeout = o.header_timeout,
                                       .keep_alive_timeout = o.keep_alive_timeout,
                                       .threads = {o.threads, std::max(1, o.private_lane_threads)},
                                       .lane_of =
                                           [prefix](std::string_view head) {
                                             // "POST /v1/agents/n1/heartbeat HTTP/1.1": the target after the
                                             // method
                                             const size_t space = head.find(' ');
                                             if (prefix.empty() || space == std::string_view::npos) return 0;
                                             return head.substr(space + 1).starts_with(prefix) ? 1 : 0;
                                           },
                                       .one_per_target = {false, !prefix.empty()}};
    s.connections =
        std::make_unique<ConnectionGate>(std::move(gate_options), [&s, g](int fd, size_t header_bytes) {
          return g->serve(fd, header_bytes, s.opt, s.stopping.load());
        });
    if (Status st = s.connections->start(); !st.ok()) return fail(st.message());
    g->set_gate(s.connections.get());
    s.server = std::move(gated);
  }
  httplib::Server& h = *s.server;

  // httplib's default also sets SO_REUSEPORT, which lets a second server bind the same port and take
  // half the connections: a stale coordinator must make the new one fail to start instead.
  h.set_socket_options([](socket_t sock) {
    int yes = 1;
    ::setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
  });
  h.set_tcp_nodelay(true);  // events and small replies go out at once
  h.set_read_timeout(std::chrono::duration_cast<std::chrono::microseconds>(o.read_timeout));
  h.set_write_timeout(std::chrono::duration_cast<std::chrono::microseconds>(o.write_timeout));
  h.set_keep_alive_timeout(o.keep_alive_timeout.count());
  // The gate refuses an oversized Content-Length before reading; this is httplib's own backstop.
  h.set_payload_max_length(o.max_body_bytes);
  const size_t threads = static_cast<size_t>(o.threads);
  if (s.connections) {
    h.new_task_queue = [] { return new InlineTaskQueue(); };
  } else {
    h.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  }

  // A request answered here has its body (if any) still unread on the socket, where httplib would take
  // it for the next request; "Connection: close" makes the client open a new connection instead.
  auto answer_early = [](Impl& server, const httplib::Request& req, const HttpResponse& early,
                         httplib::Response& res) {
    server.respond(early, res);
    const std::string length = req.get_header_value("Content-Length");
    if (req.has_header("Transfer-Encoding") || (!length.empty() && length != "0"))
      res.set_header("Connection", "close");
  };
  h.set_pre_routing_handler([&s, answer_early](const httplib::Request& req, httplib::Response& res) {
    std::optional<HttpResponse> early = s.gate(req);
    if (!early) return httplib::Server::HandlerResponse::Unhandled;
    answer_early(s, req, *early, res);
    return httplib::Server::HandlerResponse::Handled;
  });
  auto handler = [&s](const httplib::Request& req, httplib::Response& res) { s.dispatch(req, res); };
  h.Get(".*", handler);
  h.Post(".*", handler);
  h.Delete(".*", handler);
  // What httplib answers itself (a malformed request, a body past the limit) gets the same error body.
  h.set_error_handler(
      httplib::Server::HandlerWithResponse([&s](const httplib::Request& req, httplib::Response& res) {
        if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
        std::string message = std::string(http_reason_phrase(res.status));
        if (res.status == 413) {
          message = "request body of " + req.get_header_value("Content-Length") +
                    " bytes is over the limit of " + std::to_string(s.opt.max_body_bytes) + " bytes";
        }
        write_error(res, res.status, message);
        return httplib::Server::HandlerResponse::Handled;
      }));
  h.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
    std::string what = "unknown exception";
    try {
      if (ep) std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      what = e.what();
    } catch (...) {
    }
    write_error(res, 500, "internal error: " + what);
  });
  h.set_logger([&s](const httplib::Request& req, const httplib::Response& res) {
    if (s.access)
      s.access({req.method, req.path, res.status, req.remote_addr + ":" + std::to_string(req.remote_port)});
  });

  errno = 0;
  int port = o.port;
  bool bound = false;
  if (port == 0) {
    port = h.bind_to_any_port(o.host);
    bound = port > 0;
  } else {
    bound = h.bind_to_port(o.host, port);
  }
  if (!bound) {
    const int e = errno;
    s.server.reset();
    s.connections.reset();
    const std::string where = o.host + ":" + std::to_string(o.port);
    if (e == EADDRINUSE) {
      return fail("cannot listen on " + where +
                  ": the port is in use (another coordinator?); choose another port");
    }
    if (e != 0) return fail("cannot listen on " + where + ": " + std::strerror(e));
    return fail("cannot listen on " + where + ": " + o.host +
                " cannot be resolved to an address of this machine");
  }
  s.port = port;
  s.stopping = false;
  s.thread = std::thread([&s] { s.server->listen_after_bind(); });
  // stop() can only end a server that has begun listening; wait for it so that start(); stop(); works.
  for (int i = 0; i < 5000 && !s.server->is_running(); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  s.running = true;
  return Status();
}

void HttpServer::stop() {
  Impl& s = *impl_;
  if (!s.server) return;
  {
    std::lock_guard<std::mutex> lock(s.stop_mu);
    s.stopping = true;
  }
  s.stop_cv.notify_all();
  s.server->stop();
  if (s.thread.joinable()) s.thread.join();
  if (s.connections) s.connections->stop();  // after the accept loop: nothing is admitted behind its back
  s.server.reset();
  s.connections.reset();
  s.running = false;
}

int HttpServer::port() const {
  return impl_->port;
}

std::string HttpServer::url() const {
  std::string host = impl_->opt.host;
  if (host == "0.0.0.0" || host.empty()) host = "127.0.0.1";
  if (host.find(':') != std::string::npos && host.front() != '[') host = "[" + host + "]";  // IPv6 literal
  return std::string(impl_->tls ? "https://" : "http://") + host + ":" + std::to_string(impl_->port);
}

bool HttpServer::running() const {
  return impl_->running.load();
}

}  // namespace gantry
