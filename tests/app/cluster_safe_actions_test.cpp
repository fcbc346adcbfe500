// Safe actions against a real `up` cluster (issue 21): the coordinator refuses to quarantine the last
// healthy node, over HTTP and through ctl, and changes nothing when it does.
#include "tests/app/cluster_fixture.h"

namespace gantry {
namespace {

using namespace cluster_testing;  // NOLINT: the fixture and its helpers are this suite's vocabulary

std::string node_state(const json& cluster, const std::string& id) {
  for (const json& n : cluster["nodes"])
    if (n["id"] == id) return n["state"];
  return "";
}

TEST_F(ClusterCli, TheLastHealthyNodeIsNeverQuarantined) {
  Result<json> q = api_->post_json("/v1/nodes/node-1/quarantine", json::object());
  ASSERT_TRUE(q.ok()) << q.error();
  Result<HttpReply> last = api_->post("/v1/nodes/node-0/quarantine", json::object());
  ASSERT_TRUE(last.ok()) << last.error();
  EXPECT_EQ(last->status, 409);
  EXPECT_THAT(
      last->error_message(),
      HasSubstr("node \"node-0\" is the last healthy node (others: node-1 quarantined): quarantining it "
                "would leave nothing to run on; release or add a node first"));
  EXPECT_EQ(node_state(get("/v1/cluster"), "node-0"), "healthy");
  testing_support::Outcome o =
      run_engine("ctl --url " + url_ + " --token-file " + (dir_ / "token").string() + " quarantine node-0");
  EXPECT_NE(o.code, 0);
  EXPECT_THAT(o.err, HasSubstr("last healthy node"));
  // With node-1 released, node-0 is no longer the last: it may be quarantined.
  ASSERT_TRUE(api_->post_json("/v1/nodes/node-1/release", json::object()).ok());
  Result<json> now = api_->post_json("/v1/nodes/node-0/quarantine", json::object());
  ASSERT_TRUE(now.ok()) << now.error();
  EXPECT_EQ(node_state(get("/v1/cluster"), "node-0"), "quarantined");
}

}  // namespace
}  // namespace gantry
