// "Apply" against the real coordinator: the request the what-if panel hands the console is one that
// POST /v1/runs/{id}/resume-from accepts. The route reads and checks its whole body (strictly: an unknown
// field is a 400) before it looks the run up, so a run id that does not exist answers 404 exactly when
// the body passed; a body the route would refuse answers 400 naming the field. No agent, no run, no
// process: the coordinator runs in this test on a loopback port.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>  // getpid: a directory of this process's own

#include <filesystem>
#include <memory>
#include <string>

#include "engine/cluster/api_client.h"
#include "engine/cluster/coordinator.h"
#include "engine/cluster/token.h"
#include "tests/scratch_dir.h"
#include "ui/whatif/whatif_run.h"

namespace gantry::whatif {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using ::testing::HasSubstr;

class ApplyRoute : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = gantry::testing_support::scratch_dir("whatif_apply");
    Result<std::string> t = token_generate();
    ASSERT_TRUE(t.ok()) << t.error();
    token_ = t.value();
    coordinator_ = std::make_unique<Coordinator>(CoordinatorOptions{.dir = dir_.string(), .token = token_});
    Status s = coordinator_->start();
    ASSERT_TRUE(s.ok()) << s.message();
    api_ = std::make_unique<ApiClient>(HttpClientOptions{.url = coordinator_->url(), .token = token_});
  }
  void TearDown() override {
    api_.reset();
    if (coordinator_) coordinator_->stop();
    coordinator_.reset();
    fs::remove_all(dir_);
  }

  // The request as the console sends it (ApiClient::resume_from_request), with its status.
  HttpReply post(const WhatIfApply& a, const json& body) {
    Result<HttpReply> r = api_->send(ApiClient::resume_from_request(a.run_id, body));
    EXPECT_TRUE(r.ok()) << r.error();
    return r.ok() ? r.value() : HttpReply{};
  }

  fs::path dir_;
  std::string token_;
  std::unique_ptr<Coordinator> coordinator_;
  std::unique_ptr<ApiClient> api_;
};

TEST_F(ApplyRoute, TheAppliedLayoutPassesTheRoutesChecks) {
  for (int zero = 0; zero <= 3; ++zero) {
    const WhatIfApply a{.run_id = 41, .dp = 4, .zero = zero};
    const HttpReply r = post(a, a.body());
    EXPECT_EQ(r.status, 404) << a.body().dump() << ": " << r.body;
    EXPECT_THAT(r.error_message(), HasSubstr("no run 41"));
  }
}

TEST_F(ApplyRoute, WhatTheRouteRefusesIsRefusedBeforeTheRunIsLookedUp) {
  // The checks the 404s above passed are real: the same request with a layout the engine cannot run, or
  // a field resume-from does not take, is a 400 that names the field.
  WhatIfApply a{.run_id = 41, .dp = 4, .zero = 1};
  a.tp = 2;  // a 3D layout passes the route's checks (issue 17): the run is looked up
  HttpReply r = post(a, a.body());
  EXPECT_EQ(r.status, 404) << r.body;
  a.tp = 0;
  r = post(a, a.body());
  EXPECT_EQ(r.status, 400) << r.body;
  EXPECT_THAT(r.error_message(), HasSubstr("layout.tp"));

  a.tp = 1;
  json body = a.body();
  body["layout"]["micro_batch"] = 4;
  r = post(a, body);
  EXPECT_EQ(r.status, 400) << r.body;
  EXPECT_THAT(r.error_message(), HasSubstr("micro_batch"));

  a.zero = 4;
  r = post(a, a.body());
  EXPECT_EQ(r.status, 400) << r.body;
  EXPECT_THAT(r.error_message(), HasSubstr("layout.zero"));
}

}  // namespace
}  // namespace gantry::whatif
