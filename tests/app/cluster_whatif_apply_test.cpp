// What-if's Apply moving a live run to a pipeline (issue 17), end to end: `gantry-engine up` with two
// nodes of two slots runs a dp 2 job; the what-if model loads the run as the console does (its object from
// GET /v1/runs/{id}), offers the planner's dp 1 x pp 2 layout for it, and the request Apply hands the
// console (WhatIfApply::body() through ApiClient::resume_from_request) moves the stopped run onto that
// pipeline from its checkpoint: the run's layout and ranks say pp 2 and its steps go on from the checkpoint
// on the curve (within 0.5 of the step before, where the loss falls by up to about 0.2 a step; a model drawn
// afresh would start near ln 256 = 5.55).
#include "engine/cluster/api_client.h"
#include "tests/app/cluster_fixture.h"
#include "ui/whatif/whatif_model.h"

namespace gantry {
namespace {

using namespace cluster_testing;  // NOLINT: the fixture and its helpers are this suite's vocabulary

class ClusterWhatIfApply : public ClusterCli {};

TEST_F(ClusterWhatIfApply, ApplyMovesALiveRunOntoAPipeline) {
  Result<json> sub =
      api_->post_json("/v1/runs", {{"config", tiny_config(100000)}, {"layout", {{"dp", 2}}}, {"min_dp", 1}});
  ASSERT_TRUE(sub.ok()) << sub.error();
  const int64_t id = sub->at("id").get<int64_t>();
  const std::string run = "/v1/runs/" + std::to_string(id);
  ASSERT_TRUE(eventually([&] { return last_step(id) >= 12; }, 120s)) << run_state(id).dump();

  // The panel loads the live run and plans it on 2 ranks as a 2-stage pipeline.
  whatif::WhatIfModel m;
  const json live = run_state(id);
  EXPECT_EQ(live.value("pp_schedule", ""), "1f1b");
  ASSERT_TRUE(m.load_run(live).ok());
  EXPECT_EQ(m.run()->state, "running");
  m.form.gpus = 2;
  m.form.layout.pp = 2;
  m.evaluate();
  ASSERT_TRUE(m.issues().empty()) << m.issues()[0].message;
  int row = -1;
  for (int i = 0; i < static_cast<int>(m.candidates().size()); ++i) {
    if (m.candidates()[i].sources & whatif::kFromForm) row = i;
  }
  ASSERT_GE(row, 0) << "the form's pipeline is not a candidate";
  EXPECT_EQ(m.candidates()[row].apply_blocker, "");
  const std::optional<whatif::WhatIfApply> a = m.apply(row);
  ASSERT_TRUE(a.has_value());
  EXPECT_EQ(a->layout(), json({{"dp", 1}, {"tp", 1}, {"pp", 2}, {"vp", 1}, {"zero", 0}}));

  // Resume-from takes a stopped run (the console's Stop first), then the Apply.
  ASSERT_TRUE(api_->post_json(run + "/stop", json::object()).ok());
  ASSERT_TRUE(eventually([&] { return run_state(id)["state"] == "stopped"; }, 60s)) << run_state(id).dump();
  ApiClient client({.url = url_, .token = token_});
  Result<HttpReply> r = client.send(ApiClient::resume_from_request(a->run_id, a->body()));
  ASSERT_TRUE(r.ok()) << r.error();
  ASSERT_EQ(r->status, 202) << r->body;
  const int64_t from = json::parse(r->body)["from_step"].get<int64_t>();
  ASSERT_TRUE(eventually([&] { return last_step(id) > from + 2; }, 120s)) << run_state(id).dump();

  const json moved = run_state(id);
  EXPECT_EQ(moved["layout"], json({{"dp", 1}, {"tp", 1}, {"pp", 2}, {"vp", 1}, {"zero", 0}}));
  const json ranks = get(run + "/ranks")["ranks"];
  ASSERT_EQ(ranks.size(), 2u);
  for (const json& k : ranks) {
    EXPECT_EQ(k["coord"], json({{"dp", 0}, {"pp", k["rank"].get<int>()}, {"tp", 0}})) << k.dump();
  }
  const std::map<int64_t, double> l = losses(id);
  ASSERT_TRUE(l.count(from) && l.count(from + 1)) << "step " << from;
  EXPECT_LT(l.at(from), 4.8) << "the run had not learned before the move";
  EXPECT_NEAR(l.at(from + 1), l.at(from), 0.5);
  ASSERT_TRUE(api_->post_json(run + "/stop", json::object()).ok());
  ASSERT_TRUE(eventually([&] { return run_state(id)["state"] == "stopped"; }, 60s)) << run_state(id).dump();
}

}  // namespace
}  // namespace gantry
