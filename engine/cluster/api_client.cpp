#include "engine/cluster/api_client.h"

#include <cctype>
#include <cstdio>
#include <utility>

namespace gantry {
namespace {

using nlohmann::json;

std::string node_path(const std::string& node) {
  return "/v1/nodes/" + node;
}

}  // namespace

ApiClient::ApiClient(HttpClientOptions options) : http_(std::move(options)) {}

std::string ApiClient::run_path(int64_t id) {
  return "/v1/runs/" + std::to_string(id);
}

Result<json> ApiClient::cluster() {
  return http_.get_json("/v1/cluster");
}
Result<json> ApiClient::runs() {
  return http_.get_json("/v1/runs");
}
Result<json> ApiClient::run(int64_t id) {
  return http_.get_json(run_path(id));
}

Result<json> ApiClient::steps(int64_t id, const StepsQuery& q) {
  std::string path = run_path(id) + "/steps?after=" + std::to_string(q.after);
  if (!q.ranks.empty()) path += "&ranks=" + q.ranks;
  if (q.limit > 0) path += "&limit=" + std::to_string(q.limit);
  if (q.buckets > 0) path += "&buckets=" + std::to_string(q.buckets);
  if (!q.metric.empty()) path += "&metric=" + q.metric;
  return http_.get_json(path);
}

Result<json> ApiClient::heatmap(int64_t id, const HeatmapTilesQuery& q) {
  std::string path = run_path(id) + "/heatmap?metric=" + q.metric +
                     "&step_begin=" + std::to_string(q.step_begin) + "&buckets=" + std::to_string(q.buckets) +
                     "&rank_buckets=" + std::to_string(q.rank_buckets);
  if (q.step_end > 0) path += "&step_end=" + std::to_string(q.step_end);
  return http_.get_json(path);
}

Result<json> ApiClient::ranks(int64_t id) {
  return http_.get_json(run_path(id) + "/ranks");
}

Result<json> ApiClient::goodput(int64_t id) {
  return http_.get_json(run_path(id) + "/goodput");
}
Result<json> ApiClient::checkpoints(int64_t id) {
  return http_.get_json(run_path(id) + "/checkpoints");
}

Result<HttpReply> ApiClient::get(std::string_view path) {
  return http_.get(path);
}

Result<json> ApiClient::devices(const std::string& metric, int buckets) {
  return http_.get_json("/v1/devices?metric=" + metric + "&buckets=" + std::to_string(buckets));
}

Result<json> ApiClient::alerts() {
  return http_.get_json("/v1/alerts");
}

Result<json> ApiClient::alert_add(const json& rule) {
  return http_.post_json("/v1/alerts", rule);
}

Result<json> ApiClient::alert_delete(const std::string& name) {
  // Percent-encoded: a name the coordinator would refuse must reach it whole, to be refused by name.
  std::string path = "/v1/alerts/";
  for (unsigned char c : name) {
    const bool plain = std::isalnum(c) || c == '_' || c == '-' || c == '.';
    char buf[4];
    std::snprintf(buf, sizeof buf, "%%%02X", c);
    path += plain ? std::string(1, static_cast<char>(c)) : std::string(buf);
  }
  return http_.del_json(path);
}

Result<json> ApiClient::forget(const std::string& node) {
  return http_.del_json(node_path(node));
}

ApiRequest ApiClient::submit_request(const json& job) {
  return {.path = "/v1/runs", .body = job};
}

ApiRequest ApiClient::action_request(int64_t run, RunAction a) {
  return {.path = run_path(run) + "/" + std::string(run_action_name(a)), .body = json::object()};
}

ApiRequest ApiClient::resume_from_request(int64_t run, const json& body) {
  return {.path = run_path(run) + "/" + std::string(run_action_name(RunAction::kResumeFrom)), .body = body};
}

ApiRequest ApiClient::quarantine_request(const std::string& node) {
  return {.path = node_path(node) + "/quarantine", .body = json::object()};
}

ApiRequest ApiClient::inject_request(int64_t run, const std::string& fault, int rank, int64_t ms) {
  json body = {{"fault", fault}};
  if (rank >= 0) body["rank"] = rank;
  if (ms > 0) body["ms"] = ms;
  return {.path = run_path(run) + "/inject", .body = body};
}

ApiRequest ApiClient::straggler_request(int64_t run, const json& policy) {
  return {.path = run_path(run) + "/straggler", .body = policy};
}

ApiRequest ApiClient::release_request(const std::string& node) {
  return {.path = node_path(node) + "/release", .body = json::object()};
}

Result<HttpReply> ApiClient::send(const ApiRequest& r) {
  return http_.post(r.path, r.body);
}
Result<json> ApiClient::send_json(const ApiRequest& r) {
  return http_.post_json(r.path, r.body);
}

Status ApiClient::follow_events(HttpEventStream& stream, int64_t run,
                                const std::function<bool(const SseEvent&)>& on_event,
                                std::string last_event_id) {
  return stream.run(run_path(run) + "/events", on_event, std::move(last_event_id));
}

}  // namespace gantry
