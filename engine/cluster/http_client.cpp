#include "engine/cluster/http_client.h"

#include <curl/curl.h>

#include <cerrno>
#include <cstring>
#include <mutex>

#include "engine/cluster/http_status.h"
#include "engine/cluster/json_fields.h"  // json_parse_bounded: replies are outside bytes too
#include "engine/cluster/token.h"

namespace gantry {
namespace {

using Clock = std::chrono::steady_clock;

void global_init() {
  // curl_global_init is not thread-safe in every libcurl: once, before any handle.
  static std::once_flag once;
  std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
}

std::string seconds(std::chrono::milliseconds d) {
  const long long ms = d.count();
  if (ms % 1000 == 0) return std::to_string(ms / 1000) + " s";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3g s", static_cast<double>(ms) / 1000.0);
  return buf;
}

Status check_options(const HttpClientOptions& o) {
  if (o.url.rfind("http://", 0) != 0 && o.url.rfind("https://", 0) != 0) {
    return Status::error(o.peer + " URL \"" + o.url +
                         "\" must start with http:// or https:// (e.g. http://127.0.0.1:7077)");
  }
  if (Status s = token_check(o.token); !s.ok())
    return Status::error("cannot use the " + o.peer + "'s token: " + s.message());
  return Status();
}

std::string base_url(const std::string& url) {
  std::string b = url;
  while (!b.empty() && b.back() == '/') b.pop_back();
  return b;
}

// Sets what every request shares: no signals (threads), no proxy (the token must not travel through one,
// and loopback must not be sent to one because http_proxy is set), http(s) only, no redirects, TLS trust.
void common_options(CURL* c, const HttpClientOptions& o, char* errbuf) {
  curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(c, CURLOPT_ERRORBUFFER, errbuf);
  curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS, static_cast<long>(o.connect_timeout.count()));
  curl_easy_setopt(c, CURLOPT_PROXY, "");
  curl_easy_setopt(c, CURLOPT_FOLLOWLOCATION, 0L);
#if LIBCURL_VERSION_NUM >= 0x075500  // 7.85: the string form; the bitmask form is deprecated there
  curl_easy_setopt(c, CURLOPT_PROTOCOLS_STR, "http,https");
#else
  curl_easy_setopt(c, CURLOPT_PROTOCOLS, static_cast<long>(CURLPROTO_HTTP | CURLPROTO_HTTPS));
#endif
  curl_easy_setopt(c, CURLOPT_SSL_VERIFYPEER, 1L);
  curl_easy_setopt(c, CURLOPT_SSL_VERIFYHOST, 2L);
  if (!o.ca_file.empty()) curl_easy_setopt(c, CURLOPT_CAINFO, o.ca_file.c_str());
}

// The words for a request that got no answer.
std::string transport_error(const HttpClientOptions& o, CURL* c, CURLcode rc, const char* errbuf,
                            std::string_view method, std::string_view path) {
  const std::string detail = errbuf && errbuf[0] ? std::string(errbuf) : std::string(curl_easy_strerror(rc));
  const std::string at = o.peer + " at " + o.url;
  const std::string what = std::string(method) + " " + std::string(path);
  switch (rc) {
    case CURLE_COULDNT_CONNECT: {
      long os_errno = 0;
      curl_easy_getinfo(c, CURLINFO_OS_ERRNO, &os_errno);
      if (os_errno == ECONNREFUSED) {
        return "cannot reach " + at + ": connection refused (is the " + o.peer +
               " running, and is this its URL? `gantry-engine up` prints it)";
      }
      return "cannot reach " + at + ": " +
             (os_errno ? std::string(std::strerror(static_cast<int>(os_errno))) : detail);
    }
    case CURLE_COULDNT_RESOLVE_HOST:
      return "cannot reach " + at + ": the host name cannot be resolved (" + detail + ")";
    case CURLE_OPERATION_TIMEDOUT:
      if (detail.find("onnect") != std::string::npos) {
        return "cannot reach " + at + ": no connection within " + seconds(o.connect_timeout) + " (" + detail +
               ")";
      }
      return at + " did not answer " + what + " within " + seconds(o.timeout);
    case CURLE_SSL_CONNECT_ERROR:
    case CURLE_PEER_FAILED_VERIFICATION:
    case CURLE_SSL_CACERT_BADFILE:
    case CURLE_SSL_CERTPROBLEM:
      return "TLS with " + at + " failed: " + detail +
             " (for a self-signed certificate, give its file as the CA file)";
    case CURLE_GOT_NOTHING:
    case CURLE_RECV_ERROR:
    case CURLE_SEND_ERROR:
    case CURLE_PARTIAL_FILE:
      return at + " broke off " + what + ": " + detail;
    case CURLE_UNSUPPORTED_PROTOCOL:
    case CURLE_URL_MALFORMAT:
      return o.peer + " URL \"" + o.url + "\" is not usable: " + detail;
    default:
      return what + " to " + at + " failed: " + detail;
  }
}

struct Headers {
  curl_slist* list = nullptr;
  void add(const std::string& h) { list = curl_slist_append(list, h.c_str()); }
  ~Headers() { curl_slist_free_all(list); }
};

struct ReplySink {
  std::string* body;
  size_t max;
  bool over = false;
};

size_t reply_write(char* p, size_t size, size_t n, void* user) {
  auto* sink = static_cast<ReplySink*>(user);
  const size_t bytes = size * n;
  if (sink->body->size() + bytes > sink->max) {
    sink->over = true;
    return 0;  // makes curl fail the transfer with CURLE_WRITE_ERROR
  }
  sink->body->append(p, bytes);
  return bytes;
}

std::string status_words(int status) {
  return std::to_string(status) + " " + http_reason_phrase(status);
}

}  // namespace

// ---------------------------------------------------------------------------------------------------------
// Replies

Result<nlohmann::json> HttpReply::json() const {
  Result<nlohmann::json> j = json_parse_bounded(body);
  if (!j.ok()) return Status::error("reply (" + status_words(status) + ") is not JSON: " + j.error());
  return j;
}

std::string HttpReply::error_message() const {
  Result<nlohmann::json> j = json_parse_bounded(body);
  if (j.ok() && j->is_object() && j->contains("error") && j->at("error").is_string()) {
    return j->at("error").get<std::string>();
  }
  std::string line = body.substr(0, body.find('\n'));
  while (!line.empty() && (line.back() == '\r' || line.back() == ' ')) line.pop_back();
  if (line.size() > 200) line = line.substr(0, 200) + "...";
  return line.empty() ? http_reason_phrase(status) : line;
}

// ---------------------------------------------------------------------------------------------------------
// Requests

HttpClient::HttpClient(HttpClientOptions options) : opt_(std::move(options)) {
  global_init();
  opt_.url = base_url(opt_.url);
}

HttpClient::~HttpClient() {
  if (curl_) curl_easy_cleanup(static_cast<CURL*>(curl_));
}

Result<HttpReply> HttpClient::request(const char* method, std::string_view path, const std::string_view* body,
                                      std::string_view content_type) {
  if (Status s = check_options(opt_); !s.ok()) return s;
  if (path.empty() || path.front() != '/') {
    return Status::error(std::string(method) + " \"" + std::string(path) + "\": the path must start with /");
  }
  if (!curl_) curl_ = curl_easy_init();
  CURL* c = static_cast<CURL*>(curl_);
  if (!c) return Status::error("libcurl could not make a handle (out of memory?)");

  char errbuf[CURL_ERROR_SIZE] = {0};
  const std::string url = opt_.url + std::string(path);
  HttpReply reply;
  ReplySink sink{.body = &reply.body, .max = opt_.max_reply_bytes};
  Headers headers;
  headers.add("Authorization: Bearer " + opt_.token);
  headers.add("Accept: application/json");

  common_options(c, opt_, errbuf);
  curl_easy_setopt(c, CURLOPT_URL, url.c_str());
  curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, static_cast<long>(opt_.timeout.count()));
  curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, reply_write);
  curl_easy_setopt(c, CURLOPT_WRITEDATA, &sink);
  if (body) {
    headers.add("Content-Type: " + std::string(content_type));
    curl_easy_setopt(c, CURLOPT_POST, 1L);
    curl_easy_setopt(c, CURLOPT_POSTFIELDS, body->data());
    curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(body->size()));
  } else {
    curl_easy_setopt(c, CURLOPT_HTTPGET, 1L);
  }
  // DELETE: a GET's request line with its method replaced (no body); reset below, the handle is reused.
  if (std::string_view(method) == "DELETE") curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, method);
  curl_easy_setopt(c, CURLOPT_HTTPHEADER, headers.list);

  const CURLcode rc = curl_easy_perform(c);
  curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, nullptr);
  curl_easy_setopt(c, CURLOPT_HTTPHEADER, nullptr);  // the list dies with `headers`
  curl_easy_setopt(c, CURLOPT_ERRORBUFFER, nullptr);
  if (sink.over) {
    return Status::error("the reply to " + std::string(method) + " " + std::string(path) + " from " +
                         opt_.peer + " at " + opt_.url + " is over " + std::to_string(opt_.max_reply_bytes) +
                         " bytes");
  }
  if (rc != CURLE_OK) return Status::error(transport_error(opt_, c, rc, errbuf, method, path));
  long status = 0;
  curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
  reply.status = static_cast<int>(status);
  const char* type = nullptr;
  curl_easy_getinfo(c, CURLINFO_CONTENT_TYPE, &type);
  if (type) reply.content_type = type;
  return reply;
}

Result<HttpReply> HttpClient::get(std::string_view path) {
  return request("GET", path, nullptr);
}

Result<HttpReply> HttpClient::post(std::string_view path, const nlohmann::json& body) {
  const std::string text = body.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  const std::string_view view = text;
  return request("POST", path, &view);
}

Result<HttpReply> HttpClient::del(std::string_view path) {
  return request("DELETE", path, nullptr);
}

Result<HttpReply> HttpClient::post_bytes(std::string_view path, std::string_view body,
                                         std::string_view content_type) {
  return request("POST", path, &body, content_type);
}

namespace {

Result<nlohmann::json> json_or_error(const Result<HttpReply>& r, std::string_view method,
                                     std::string_view path) {
  if (!r.ok()) return r.status();
  const std::string what = std::string(method) + " " + std::string(path);
  if (!r->ok()) return Status::error(what + ": " + status_words(r->status) + ": " + r->error_message());
  Result<nlohmann::json> j = r->json();
  if (!j.ok()) return Status::error(what + ": " + j.error());
  return j;
}

}  // namespace

Result<nlohmann::json> HttpClient::get_json(std::string_view path) {
  return json_or_error(get(path), "GET", path);
}

Result<nlohmann::json> HttpClient::post_json(std::string_view path, const nlohmann::json& body) {
  return json_or_error(post(path, body), "POST", path);
}

Result<nlohmann::json> HttpClient::del_json(std::string_view path) {
  return json_or_error(del(path), "DELETE", path);
}

// ---------------------------------------------------------------------------------------------------------
// Event streams

namespace {

struct StreamState {
  CURL* curl = nullptr;
  const std::function<bool(const SseEvent&)>* on_event = nullptr;
  const std::atomic<bool>* stop = nullptr;
  std::function<void(const std::string&)> on_id;  // records the last event id as events arrive
  long status = 0;                                // 0 until the first body bytes
  std::string error_body;                         // the body of a non-200 reply
  std::string failure;                            // why the stream was abandoned
  bool callback_stopped = false;
  SseParser parser;
  Clock::time_point last_bytes = Clock::now();
};

size_t stream_write(char* p, size_t size, size_t n, void* user) {
  auto* s = static_cast<StreamState*>(user);
  const size_t bytes = size * n;
  s->last_bytes = Clock::now();
  if (s->status == 0) {
    curl_easy_getinfo(s->curl, CURLINFO_RESPONSE_CODE, &s->status);
    if (s->status == 200) {
      const char* type = nullptr;
      curl_easy_getinfo(s->curl, CURLINFO_CONTENT_TYPE, &type);
      if (!type || std::string_view(type).rfind("text/event-stream", 0) != 0) {
        s->failure = std::string("the reply is ") + (type ? type : "of no content type") +
                     ", not an event stream (text/event-stream)";
        return 0;
      }
    }
  }
  if (s->status != 200) {
    if (s->error_body.size() < 65536)
      s->error_body.append(p, std::min<size_t>(bytes, 65536 - s->error_body.size()));
    return bytes;
  }
  const bool go_on = s->parser.feed(std::string_view(p, bytes), [s](const SseEvent& e) {
    if (s->stop->load()) return false;
    s->on_id(s->parser.last_event_id());
    if (!(*s->on_event)(e)) {
      s->callback_stopped = true;
      return false;
    }
    return true;
  });
  if (!go_on) {
    if (!s->parser.error().empty()) s->failure = s->parser.error();
    return 0;
  }
  return bytes;
}

}  // namespace

HttpEventStream::HttpEventStream(HttpClientOptions options) : opt_(std::move(options)) {
  global_init();
  opt_.url = base_url(opt_.url);
}

HttpEventStream::~HttpEventStream() {
  stop();
}

void HttpEventStream::stop() {
  stop_ = true;
  std::lock_guard<std::mutex> lock(mu_);
  if (multi_) curl_multi_wakeup(static_cast<CURLM*>(multi_));
}

std::string HttpEventStream::last_event_id() const {
  std::lock_guard<std::mutex> lock(mu_);
  return last_event_id_;
}

Status HttpEventStream::run(std::string_view path, const std::function<bool(const SseEvent&)>& on_event,
                            std::string last_event_id) {
  if (Status s = check_options(opt_); !s.ok()) return s;
  if (path.empty() || path.front() != '/') {
    return Status::error("GET \"" + std::string(path) + "\": the path must start with /");
  }
  CURL* c = curl_easy_init();
  CURLM* m = curl_multi_init();
  if (!c || !m) {
    if (c) curl_easy_cleanup(c);
    if (m) curl_multi_cleanup(m);
    return Status::error("libcurl could not make a handle (out of memory?)");
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    multi_ = m;
    if (!last_event_id.empty()) last_event_id_ = last_event_id;
  }

  char errbuf[CURL_ERROR_SIZE] = {0};
  const std::string url = opt_.url + std::string(path);
  Headers headers;
  headers.add("Authorization: Bearer " + opt_.token);
  headers.add("Accept: text/event-stream");
  headers.add("Cache-Control: no-cache");
  if (!last_event_id.empty()) {
    for (char& ch : last_event_id) {
      if (ch == '\r' || ch == '\n') ch = ' ';  // a header value is one line
    }
    headers.add("Last-Event-ID: " + last_event_id);
  }
  StreamState state;
  state.curl = c;
  state.on_event = &on_event;
  state.stop = &stop_;
  state.on_id = [this](const std::string& id) {
    std::lock_guard<std::mutex> lock(mu_);
    last_event_id_ = id;
  };
  common_options(c, opt_, errbuf);
  curl_easy_setopt(c, CURLOPT_URL, url.c_str());
  curl_easy_setopt(c, CURLOPT_HTTPGET, 1L);
  curl_easy_setopt(c, CURLOPT_HTTPHEADER, headers.list);
  curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, stream_write);
  curl_easy_setopt(c, CURLOPT_WRITEDATA, &state);
  curl_easy_setopt(c, CURLOPT_TCP_KEEPALIVE, 1L);
  curl_multi_add_handle(m, c);

  bool done = false, stopped = false, idle = false;
  CURLcode rc = CURLE_OK;
  std::string multi_error;
  while (true) {
    int running = 0;
    const CURLMcode mc = curl_multi_perform(m, &running);
    if (mc != CURLM_OK) {
      multi_error = curl_multi_strerror(mc);
      break;
    }
    int queued = 0;
    while (CURLMsg* msg = curl_multi_info_read(m, &queued)) {
      if (msg->msg == CURLMSG_DONE) {
        done = true;
        rc = msg->data.result;
      }
    }
    if (done || stop_.load()) {
      stopped = !done || stop_.load();
      break;
    }
    const Clock::time_point now = Clock::now();
    int wait_ms = 1000;
    if (opt_.stream_idle_timeout.count() > 0) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(state.last_bytes +
                                                                              opt_.stream_idle_timeout - now);
      if (left.count() <= 0) {
        idle = true;
        break;
      }
      wait_ms = static_cast<int>(std::min<long long>(wait_ms, left.count() + 1));
    }
    curl_multi_poll(m, nullptr, 0, wait_ms, nullptr);
  }

  curl_multi_remove_handle(m, c);
  {
    std::lock_guard<std::mutex> lock(mu_);
    multi_ = nullptr;
  }
  curl_multi_cleanup(m);
  const std::string what = "GET " + std::string(path);
  Status result;
  if (stopped || state.callback_stopped) {
    result = Status();
  } else if (!multi_error.empty()) {
    result = Status::error(what + ": libcurl: " + multi_error);
  } else if (idle) {
    result = Status::error(opt_.peer + " at " + opt_.url + " sent nothing on " + what + " for " +
                           seconds(opt_.stream_idle_timeout) +
                           " (it sends a keep-alive when idle): the stream is presumed lost");
  } else if (!state.failure.empty()) {
    result = Status::error(what + " from " + opt_.peer + " at " + opt_.url + ": " + state.failure);
  } else if (state.status != 0 && state.status != 200) {
    HttpReply r{.status = static_cast<int>(state.status), .body = state.error_body};
    result = Status::error(what + ": " + status_words(r.status) + ": " + r.error_message());
  } else if (rc != CURLE_OK) {
    result = Status::error(transport_error(opt_, c, rc, errbuf, "GET", path));
  } else if (state.status == 0) {
    // A reply without a body: the status is known only now.
    long status = 0;
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
    if (status != 200) {
      result = Status::error(what + ": " + status_words(static_cast<int>(status)) + ": " +
                             http_reason_phrase(static_cast<int>(status)));
    }
  }
  curl_easy_setopt(c, CURLOPT_ERRORBUFFER, nullptr);
  curl_easy_cleanup(c);
  return result;
}

}  // namespace gantry
