// The typed API client against a real HTTP server on a loopback port: each call reaches the coordinator's
// route with the method, path, query and body the coordinator serves (the routes as coordinator.cpp
// registers them), and a refusal comes back as an error naming the request, its status and the message.
#include "engine/cluster/api_client.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <mutex>
#include <string>
#include <vector>

#include "engine/cluster/http_server.h"
#include "engine/cluster/token.h"

namespace gantry {
namespace {

using nlohmann::json;
using ::testing::HasSubstr;

class ApiClientTest : public ::testing::Test {
 protected:
  void SetUp() override {
    Result<std::string> t = token_generate();
    ASSERT_TRUE(t.ok()) << t.error();
    token_ = t.value();
    server_ = std::make_unique<HttpServer>(HttpServerOptions{.token = token_});
    // Every route answers what it received: method, route, path parameters, query, body.
    auto echo = [this](const char* route) {
      return [this, route](const HttpRequest& req) {
        json q = json::object();
        for (const auto& [k, v] : req.query) q[k] = v;
        json p = json::object();
        for (const auto& [k, v] : req.path_params) p[k] = v;
        json got = {
            {"method", req.method}, {"route", route}, {"params", p}, {"query", q}, {"body", req.body}};
        if (req.path_params.count("id") && req.param("id") == "409") {
          return HttpResponse::error(409, "cannot pause run 409: it is already paused");
        }
        return HttpResponse::ok(got);
      };
    };
    HttpServer& s = *server_;
    for (const char* r : {"/v1/cluster", "/v1/runs", "/v1/runs/{id}", "/v1/runs/{id}/steps",
                          "/v1/runs/{id}/ranks", "/v1/runs/{id}/checkpoints"})
      s.get(r, echo(r),
            std::string_view(r) == "/v1/runs/{id}/steps"
                ? std::vector<std::string>{"after", "buckets", "limit", "metric", "ranks"}
                : std::vector<std::string>{});
    for (const char* r : {"/v1/runs", "/v1/runs/{id}/checkpoint", "/v1/runs/{id}/pause",
                          "/v1/runs/{id}/resume", "/v1/runs/{id}/stop", "/v1/runs/{id}/resume-from",
                          "/v1/nodes/{id}/quarantine", "/v1/nodes/{id}/release"})
      s.post(r, echo(r));
    s.get("/v1/runs/{id}/events", [](const HttpRequest& req) {
      const std::string id = req.param("id");
      return HttpResponse::stream([id, sent = false](SseWriter& w) mutable {
        if (!sent) w.send({.id = "1", .event = "run", .data = id});
        sent = true;
        return false;  // the stream ends: the run has nothing more
      });
    });
    Status st = s.start();
    ASSERT_TRUE(st.ok()) << st.message();
    api_ = std::make_unique<ApiClient>(HttpClientOptions{.url = s.url(), .token = token_});
  }
  void TearDown() override {
    api_.reset();
    if (server_) server_->stop();
  }

  static json ok(const Result<json>& r) {
    EXPECT_TRUE(r.ok()) << r.error();
    return r.ok() ? r.value() : json();
  }

  std::string token_;
  std::unique_ptr<HttpServer> server_;
  std::unique_ptr<ApiClient> api_;
};

TEST_F(ApiClientTest, ReadsReachTheirRoutes) {
  EXPECT_EQ(ok(api_->cluster())["route"], "/v1/cluster");
  EXPECT_EQ(ok(api_->runs())["route"], "/v1/runs");
  json r = ok(api_->run(7));
  EXPECT_EQ(r["route"], "/v1/runs/{id}");
  EXPECT_EQ(r["params"]["id"], "7");
  EXPECT_EQ(ok(api_->ranks(7))["route"], "/v1/runs/{id}/ranks");
  EXPECT_EQ(ok(api_->checkpoints(7))["route"], "/v1/runs/{id}/checkpoints");
}

TEST_F(ApiClientTest, StepsSendOnlyTheParametersGiven) {
  json r = ok(api_->steps(7, {.after = 41, .ranks = "all", .limit = 1024}));
  EXPECT_EQ(r["route"], "/v1/runs/{id}/steps");
  EXPECT_EQ(r["query"], (json{{"after", "41"}, {"ranks", "all"}, {"limit", "1024"}}));
  r = ok(api_->steps(7, {.after = -1, .buckets = 300}));
  EXPECT_EQ(r["query"], (json{{"after", "-1"}, {"buckets", "300"}}));
}

TEST_F(ApiClientTest, WritesReachTheirRoutesWithTheirBodies) {
  const json job = {{"config", "x"}, {"layout", {{"dp", 2}}}};
  json r = ok(api_->submit(job));
  EXPECT_EQ(r["method"], "POST");
  EXPECT_EQ(r["route"], "/v1/runs");
  EXPECT_EQ(r["body"], job);
  for (RunAction a : {RunAction::kCheckpoint, RunAction::kPause, RunAction::kResume, RunAction::kStop}) {
    r = ok(api_->action(3, a));
    EXPECT_EQ(r["route"], "/v1/runs/{id}/" + std::string(run_action_name(a)));
    EXPECT_EQ(r["params"]["id"], "3");
    EXPECT_EQ(r["body"], json::object());
  }
  const json resume = {{"checkpoint", 40}, {"layout", {{"dp", 1}}}};
  r = ok(api_->resume_from(3, resume));
  EXPECT_EQ(r["route"], "/v1/runs/{id}/resume-from");
  EXPECT_EQ(r["body"], resume);
  r = ok(api_->quarantine("node-1"));
  EXPECT_EQ(r["route"], "/v1/nodes/{id}/quarantine");
  EXPECT_EQ(r["params"]["id"], "node-1");
  EXPECT_EQ(ok(api_->release("node-1"))["route"], "/v1/nodes/{id}/release");
}

TEST_F(ApiClientTest, RefusalsNameTheRequestAndKeepTheStatus) {
  Result<json> r = api_->action(409, RunAction::kPause);
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.error(), HasSubstr("POST /v1/runs/409/pause: 409"));
  EXPECT_THAT(r.error(), HasSubstr("it is already paused"));
  // The same request sent with its status left to the caller (the console's queue).
  Result<HttpReply> reply = api_->send(ApiClient::action_request(409, RunAction::kPause));
  ASSERT_TRUE(reply.ok()) << reply.error();
  EXPECT_EQ(reply->status, 409);
  EXPECT_EQ(reply->error_message(), "cannot pause run 409: it is already paused");
}

TEST_F(ApiClientTest, EventsFollowTheRunsStream) {
  HttpEventStream stream({.url = server_->url(), .token = token_});
  std::vector<std::string> got;
  Status st = ApiClient::follow_events(stream, 12, [&](const SseEvent& e) {
    got.push_back(e.data);
    return true;
  });
  ASSERT_TRUE(st.ok()) << st.message();
  EXPECT_EQ(got, std::vector<std::string>{"12"});
  EXPECT_EQ(ApiClient::run_path(12), "/v1/runs/12");
}

}  // namespace
}  // namespace gantry
