// The coordinator's API as typed calls, in one place: every route the console and `gantry-engine ctl` use,
// so that no caller spells a "/v1/..." path. Over http_client.h (libcurl); no server code. Reads and the
// typed writes answer the reply's JSON, and a non-2xx reply is an error that names the request, its status
// and the coordinator's message ("POST /v1/runs/9/pause: 409 Conflict: cannot pause run 9: it is stopped").
// A caller that reports the status itself (the console's request queue) builds an ApiRequest and send()s it.
//
//   ApiClient api({.url = url, .token = token});
//   Result<nlohmann::json> runs = api.runs();                     // {"runs": [...]}
//   Result<nlohmann::json> r = api.action(7, RunAction::kPause);  // 202 {"run": 7, "action": "pause", ...}
//   // the status is the caller's:
//   Result<HttpReply> reply = api.send(ApiClient::quarantine_request("node-1"));
//
//   HttpEventStream events({.url = url, .token = token});
//   Status s = ApiClient::follow_events(events, 7, [&](const SseEvent& e) { show(e); return true; });
//
// One ApiClient per thread, as for HttpClient (it keeps one connection alive between calls).
#pragma once

#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>  // nlohmann::json: the API's bodies and replies
#include <string>

#include "engine/cluster/http_client.h"
#include "engine/cluster/run_lifecycle.h"  // RunAction: the run's action routes
#include "telemetry/status.h"

namespace gantry {

// GET /v1/runs/{id}/steps: the steps after `after`; with `ranks` ("all" or "0,2,5") the ranks' rows too;
// with `buckets` > 0 a decimated band instead of rows. Zero (or "") leaves a parameter out: the server's
// default.
struct StepsQuery {
  int64_t after = 0;
  std::string ranks;
  int64_t limit = 0;
  int64_t buckets = 0;
  std::string metric;  // the band's rank metric ("busy", "forward", ...); "" = the server's (busy)
};

// GET /v1/runs/{id}/heatmap: the rank × step matrix of `metric` over [step_begin, step_end) in at most
// `buckets` columns and `rank_buckets` rows, read from the coordinator's tile pyramid (docs/CLUSTER.md).
// step_end 0 = the run's end.
struct HeatmapTilesQuery {
  std::string metric = "busy";
  int64_t step_begin = 0;
  int64_t step_end = 0;
  int64_t buckets = 1000;
  int64_t rank_buckets = 256;
};

// A write as it goes on the wire: POST `path` with `body`, and what the operator reads of it.
struct ApiRequest {
  std::string path;
  nlohmann::json body = nlohmann::json::object();
};

class ApiClient {
 public:
  explicit ApiClient(HttpClientOptions options);

  // Reads.
  Result<nlohmann::json> cluster();              // GET /v1/cluster
  Result<HttpReply> get(std::string_view path);  // any GET; any status the coordinator answered is a reply
  Result<nlohmann::json> runs();                 // GET /v1/runs
  Result<nlohmann::json> run(int64_t id);        // GET /v1/runs/{id} (config included)
  Result<nlohmann::json> steps(int64_t id, const StepsQuery& query);           // GET /v1/runs/{id}/steps?...
  Result<nlohmann::json> heatmap(int64_t id, const HeatmapTilesQuery& query);  // GET /v1/runs/{id}/heatmap
  Result<nlohmann::json> ranks(int64_t id);                                    // GET /v1/runs/{id}/ranks
  Result<nlohmann::json> goodput(int64_t id);  // GET /v1/runs/{id}/goodput: the goodput ledger, Young/Daly
  Result<nlohmann::json> checkpoints(int64_t id);  // GET /v1/runs/{id}/checkpoints
  // Alert rules: GET /v1/alerts (rules, firing), POST /v1/alerts (a rule), DELETE /v1/alerts/{name}.
  // GET /v1/devices: one device metric ("node_cpu", "gpu_power", ...) over time for every device, at most
  // `buckets` columns of time.
  Result<nlohmann::json> devices(const std::string& metric, int buckets);
  Result<nlohmann::json> alerts();
  Result<nlohmann::json> alert_add(const nlohmann::json& rule);
  Result<nlohmann::json> alert_delete(const std::string& name);

  // Writes (non-2xx is an error).
  Result<nlohmann::json> submit(const nlohmann::json& job) { return send_json(submit_request(job)); }
  Result<nlohmann::json> action(int64_t run, RunAction a) { return send_json(action_request(run, a)); }
  Result<nlohmann::json> resume_from(int64_t run, const nlohmann::json& body) {
    return send_json(resume_from_request(run, body));
  }
  Result<nlohmann::json> quarantine(const std::string& node) { return send_json(quarantine_request(node)); }
  Result<nlohmann::json> release(const std::string& node) { return send_json(release_request(node)); }
  // DELETE /v1/nodes/{id}: a lost node leaves the cluster's list (its history stays).
  Result<nlohmann::json> forget(const std::string& node);
  // A drill: "kill" or "hang" one rank (rank < 0: one at random); 403 unless the coordinator allows it.
  // "slow" takes the forward's delay in ms (ms > 0); the others send none.
  Result<nlohmann::json> inject(int64_t run, const std::string& fault, int rank, int64_t ms = 0) {
    return send_json(inject_request(run, fault, rank, ms));
  }

  // The run's straggler policy while it lives: `policy` is the submit body's "straggler" object or part of
  // it (e.g. {"quarantine": true}); the fields given replace the run's. 200 {"run", "straggler", "change"}.
  Result<nlohmann::json> straggler(int64_t run, const nlohmann::json& policy) {
    return send_json(straggler_request(run, policy));
  }
  // The writes as requests, to queue or to send with the status left to the caller.
  static ApiRequest submit_request(const nlohmann::json& job);  // POST /v1/runs
  // POST /v1/runs/{id}/{checkpoint,pause,resume,stop}; resume-from and a quarantine's move have their own.
  static ApiRequest action_request(int64_t run, RunAction a);
  static ApiRequest resume_from_request(int64_t run,
                                        const nlohmann::json& body);  // POST /v1/runs/{id}/resume-from
  static ApiRequest quarantine_request(const std::string& node);      // POST /v1/nodes/{id}/quarantine
  static ApiRequest release_request(const std::string& node);         // POST /v1/nodes/{id}/release
  static ApiRequest straggler_request(int64_t run,
                                      const nlohmann::json& policy);  // POST /v1/runs/{id}/straggler
  static ApiRequest inject_request(int64_t run, const std::string& fault, int rank,
                                   int64_t ms = 0);  // POST .../inject
  Result<HttpReply> send(const ApiRequest& r);       // any status the coordinator answered is a reply
  Result<nlohmann::json> send_json(const ApiRequest& r);

  // GET /v1/runs/{id}/events on `stream` (http_client.h's HttpEventStream::run: resumes after
  // `last_event_id`, returns when the run's stream ends, on_event says stop, or stream.stop()).
  static Status follow_events(HttpEventStream& stream, int64_t run,
                              const std::function<bool(const SseEvent&)>& on_event,
                              std::string last_event_id = "");

  HttpClient& http() { return http_; }

  // A run's resource, "/v1/runs/{id}": the routes above are under it; the console's cache also names a run
  // by it (with the coordinator's URL).
  static std::string run_path(int64_t id);

 private:
  HttpClient http_;
};

}  // namespace gantry
