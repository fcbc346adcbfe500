// The agent's heartbeat on the wire (agent_beat.h): the codec on its own (round trip, every truncation,
// every header field wrong), and a real coordinator over loopback HTTP refusing malformed beats with a 400
// that says what was wrong, taking none of their records, and still taking the next good beat.
#include "engine/cluster/agent_beat.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>

#include "engine/cluster/coordinator.h"
#include "engine/cluster/http_client.h"
#include "engine/cluster/token.h"
#include "telemetry/record_codec.h"
#include "tests/file_text.h"  // slurp
#include "tests/scratch_dir.h"

namespace gantry {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using ::testing::HasSubstr;

RecordBatch node_batch(int64_t run, int64_t step, int ranks) {
  RecordBatch b;
  for (int r = 0; r < ranks; ++r) {
    b.rank_steps.push_back({.run_id = run,
                            .step = step,
                            .rank = r,
                            .host = "n0",
                            .device = r,
                            .total_s = 0.25 + 0.001 * r,
                            .tokens = 4096,
                            .power_watts = 650.5});
  }
  b.steps.push_back({.run_id = run, .step = step, .time_unix_s = 1.7e9, .loss = 3.25, .step_s = 0.25});
  b.events.push_back({.run_id = run, .time_unix_s = 1.7e9, .step = step, .kind = "note", .message = "hello"});
  return b;
}

TEST(AgentBeat, RoundTripsControlAndRecords) {
  const json control = {{"ended", json::array({{{"run", 3}, {"code", 0}, {"error", "é\n\"q\""}}})}};
  const RecordBatch records = node_batch(3, 12, 8);
  Result<std::string> wire = agent_beat_encode(control, records);
  ASSERT_TRUE(wire.ok()) << wire.error();
  AgentBeat back;
  ASSERT_TRUE(agent_beat_decode(wire.value(), &back).ok());
  EXPECT_EQ(back.control, control);
  EXPECT_TRUE(back.records == records);

  // No records: no codec frame at all, only the header and the control part.
  Result<std::string> empty = agent_beat_encode({{"ended", json::array()}}, RecordBatch());
  ASSERT_TRUE(empty.ok());
  EXPECT_EQ(empty->size(), kAgentBeatHeaderBytes + std::string(R"({"ended":[]})").size());
  ASSERT_TRUE(agent_beat_decode(empty.value(), &back).ok());
  EXPECT_TRUE(back.records.empty());
}

TEST(AgentBeat, EveryTruncationIsAnErrorAndLeavesNothing) {
  const std::string wire = agent_beat_encode({{"ended", json::array()}}, node_batch(1, 5, 8)).value();
  for (size_t n = 0; n < wire.size(); ++n) {
    AgentBeat out;
    out.records = node_batch(9, 9, 1);  // must be cleared
    const Status s = agent_beat_decode(std::string_view(wire).substr(0, n), &out);
    EXPECT_FALSE(s.ok()) << "a beat cut to " << n << " of " << wire.size() << " bytes was taken";
    EXPECT_TRUE(out.records.empty()) << n;
    EXPECT_THAT(s.message(), HasSubstr("beat: ")) << n;
  }
}

TEST(AgentBeat, HeaderFieldsAreChecked) {
  const std::string good = agent_beat_encode({{"ended", json::array()}}, node_batch(1, 5, 2)).value();
  AgentBeat out;
  auto error_of = [&](std::string wire) { return agent_beat_decode(wire, &out).message(); };
  std::string w = good;
  w[0] = 'X';
  EXPECT_THAT(error_of(w), HasSubstr("bad magic"));
  w = good;
  w[4] = 2;
  EXPECT_THAT(error_of(w), HasSubstr("version 2"));
  w = good;
  w[6] = 1;
  EXPECT_THAT(error_of(w), HasSubstr("reserved"));
  w = good;
  w[11] = 0x7f;  // a control length far past the end
  EXPECT_THAT(error_of(w), HasSubstr("follow it"));
  w = good;
  w[kAgentBeatHeaderBytes] = '[';  // "[ended..." : not JSON
  EXPECT_THAT(error_of(w), HasSubstr("beat: control: "));
  w = good + "x";  // a byte past the records' frame
  EXPECT_THAT(error_of(w), HasSubstr("follow it"));
  w = good;
  w[kAgentBeatHeaderBytes + 14] ^= 0x01;  // inside the GTLM frame's header: its magic
  EXPECT_THAT(error_of(w), HasSubstr("beat: records"));
}

// A coordinator on loopback with one registered node and a run of 8 ranks on it.
class BeatAgainstCoordinator : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing_support::scratch_dir("coordinator");
    token_ = token_generate().value();
    coordinator_ = std::make_unique<Coordinator>(
        CoordinatorOptions{.dir = dir_.string(), .token = token_, .node_timeout = std::chrono::seconds(600)});
    ASSERT_TRUE(coordinator_->start().ok());
    api_ = std::make_unique<HttpClient>(HttpClientOptions{.url = coordinator_->url(), .token = token_});
    ASSERT_TRUE(api_->post_json("/v1/agents", {{"node", "n0"}, {"slots", 8}, {"pid", 1}}).ok());
    Result<json> run = api_->post_json(
        "/v1/runs", {{"config", testing_support::slurp(GANTRY_TINY_CONFIG)}, {"layout", {{"dp", 8}}}});
    ASSERT_TRUE(run.ok()) << run.error();
    run_ = run->at("id").get<int64_t>();
  }
  void TearDown() override {
    api_.reset();
    if (coordinator_) coordinator_->stop();
    coordinator_.reset();
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }

  Result<HttpReply> beat(std::string_view body, std::string_view type = kAgentBeatMediaType) {
    return api_->post_bytes("/v1/agents/n0/heartbeat", body, type);
  }
  json run_json() { return api_->get_json("/v1/runs/" + std::to_string(run_)).value(); }

  fs::path dir_;
  std::string token_;
  std::unique_ptr<Coordinator> coordinator_;
  std::unique_ptr<HttpClient> api_;
  int64_t run_ = -1;
};

TEST_F(BeatAgainstCoordinator, MalformedBeatsAre400WithAMessageAndTakeNothing) {
  const std::string good = agent_beat_encode({{"ended", json::array()}}, node_batch(run_, 7, 8)).value();
  std::string flipped = good;
  flipped[flipped.size() - 3] = static_cast<char>(0xff);  // inside the records' last event
  std::string truncated = good.substr(0, good.size() - 5);
  std::string bad_frame = good;
  bad_frame[kAgentBeatHeaderBytes + std::string(R"({"ended":[]})").size() + 8] ^= 0x40;  // GTLM's body length
  std::string bad_magic = good;
  bad_magic[1] = 'Z';
  const std::string array_control =
      agent_beat_encode(json::array({1, 2}), RecordBatch()).value();  // a control part that is no object
  const std::string unknown_field = agent_beat_encode({{"records", json::object()}}, RecordBatch()).value();
  const std::vector<std::pair<std::string, std::string>> cases = {
      {std::string(), "shorter than its 16-byte header"},
      {std::string("GBEA"), "shorter than its 16-byte header"},
      {bad_magic, "bad magic"},
      {truncated, "follow it"},
      {bad_frame, "beat: records"},
      {array_control, "expected a JSON object"},
      {unknown_field, "unknown field \"records\""},
  };
  for (const auto& [body, want] : cases) {
    Result<HttpReply> r = beat(body);
    ASSERT_TRUE(r.ok()) << r.error();
    EXPECT_EQ(r->status, 400) << want << ": " << r->body;
    EXPECT_THAT(r->error_message(), HasSubstr(want)) << r->body;
  }
  // A flipped byte is either refused or decodes to other values; either way the coordinator answers.
  Result<HttpReply> f = beat(flipped);
  ASSERT_TRUE(f.ok()) << f.error();
  EXPECT_TRUE(f->status == 200 || f->status == 400) << f->body;
  // The old form (JSON records) is refused by its media type, before the body is read.
  Result<HttpReply> old = api_->post("/v1/agents/n0/heartbeat", {{"ended", json::array()}});
  ASSERT_TRUE(old.ok()) << old.error();
  EXPECT_EQ(old->status, 415) << old->body;
  EXPECT_THAT(old->error_message(), HasSubstr(kAgentBeatMediaType));
  if (f->status == 400) {
    EXPECT_EQ(run_json()["last_step"], -1) << "a refused beat's records were taken";
  }

  // The coordinator carries on: the next good beat is taken whole.
  Result<HttpReply> ok = beat(agent_beat_encode({{"ended", json::array()}}, node_batch(run_, 9, 8)).value());
  ASSERT_TRUE(ok.ok()) << ok.error();
  EXPECT_EQ(ok->status, 200) << ok->body;
  const json run = run_json();
  EXPECT_EQ(run["last_step"], 9) << run.dump();
  EXPECT_EQ(run["latest_step"]["loss"], 3.25) << run.dump();
}

// The health a beat reports (node_health.h's report): unhealthy makes the node unhealthy (no new work, the
// run on it told and moving off), a malformed report is a 400 naming the field, ok makes it usable again.
TEST_F(BeatAgainstCoordinator, AnUnhealthyReportMarksTheNodeAndOkClearsIt) {
  auto node = [&] { return api_->get_json("/v1/cluster").value()["nodes"][0]; };
  auto health_beat = [&](const json& health) {
    return beat(agent_beat_encode({{"ended", json::array()}, {"health", health}}, RecordBatch()).value());
  };
  EXPECT_TRUE(node()["health"].is_null()) << "no report yet: unknown, not ok";
  Result<HttpReply> bad = health_beat("sick");
  ASSERT_TRUE(bad.ok()) << bad.error();
  EXPECT_EQ(bad->status, 400);
  EXPECT_THAT(bad->error_message(), HasSubstr("field \"health\""));
  bad = health_beat({{"state", 3}});
  ASSERT_TRUE(bad.ok()) << bad.error();
  EXPECT_EQ(bad->status, 400);

  const json unhealthy = {{"state", "unhealthy"},
                          {"reason", "disk: /a has 0.10 GiB free, below the threshold of 1.00 GiB"},
                          {"checks", json::array()}};
  Result<HttpReply> r = health_beat(unhealthy);
  ASSERT_TRUE(r.ok()) << r.error();
  ASSERT_EQ(r->status, 200) << r->body;
  EXPECT_EQ(node()["state"], "unhealthy");
  EXPECT_EQ(node()["health"]["reason"], unhealthy["reason"]);
  EXPECT_EQ(run_json()["state"], "stopping") << "the run on it moves off (the quarantine's path)";
  r = health_beat(unhealthy);  // still unhealthy: nothing changes, nothing said twice
  ASSERT_EQ(r->status, 200) << r->body;
  EXPECT_EQ(node()["state"], "unhealthy");

  r = health_beat({{"state", "ok"}, {"reason", ""}, {"checks", json::array()}});
  ASSERT_EQ(r->status, 200) << r->body;
  EXPECT_EQ(node()["state"], "healthy");
  EXPECT_EQ(node()["health"]["state"], "ok");
}

// An operator's quarantine outranks the health report: the node stays quarantined while unhealthy, and once
// released an unhealthy report makes it unhealthy again.
TEST_F(BeatAgainstCoordinator, AQuarantineStaysWhateverTheHealthSays) {
  auto state = [&] { return api_->get_json("/v1/cluster").value()["nodes"][0]["state"]; };
  const std::string unhealthy =
      agent_beat_encode(
          {{"ended", json::array()}, {"health", {{"state", "unhealthy"}, {"reason", "xid: 79"}}}},
          RecordBatch())
          .value();
  // n0 is the cluster's only node: fencing it takes the operator's force.
  ASSERT_EQ(api_->post("/v1/nodes/n0/quarantine", json::object())->status, 409);
  ASSERT_EQ(api_->post("/v1/nodes/n0/quarantine", json{{"force", "yes"}})->status, 400);
  Result<HttpReply> forced = api_->post("/v1/nodes/n0/quarantine", json{{"force", true}});
  ASSERT_EQ(forced->status, 202) << forced->body;
  ASSERT_EQ(beat(unhealthy)->status, 200);
  EXPECT_EQ(state(), "quarantined");
  ASSERT_EQ(api_->post("/v1/nodes/n0/release", json::object())->status, 200);
  EXPECT_EQ(state(), "healthy");
  ASSERT_EQ(beat(unhealthy)->status, 200);
  EXPECT_EQ(state(), "unhealthy");
  EXPECT_EQ(api_->post("/v1/nodes/n0/release", json::object())->status, 409) << "not quarantined";
}

// The beat interval the coordinator asks for keeps the cluster's beats within max_beats_per_s: more nodes,
// each beating less often (and so carrying more steps a beat). Registration and heartbeat replies and
// GET /v1/cluster carry it; a node is lost only after several intervals once they are long.
TEST(BeatInterval, GrowsWithTheNodesSoTheBeatsStayWithinTheirBudget) {
  const fs::path dir = testing_support::scratch_dir("coordinator");
  const std::string token = token_generate().value();
  Coordinator c({.dir = dir.string(),
                 .token = token,
                 .heartbeat = std::chrono::milliseconds(200),
                 .max_beats_per_s = 1,
                 .node_timeout = std::chrono::seconds(600)});
  ASSERT_TRUE(c.start().ok());
  HttpClient api({.url = c.url(), .token = token});
  auto register_node = [&](int k) {
    Result<json> r =
        api.post_json("/v1/agents", {{"node", "n" + std::to_string(k)}, {"slots", 1}, {"pid", k + 1}});
    EXPECT_TRUE(r.ok()) << r.error();
    return r.ok() ? r->value("heartbeat_ms", int64_t{-1}) : int64_t{-1};
  };
  EXPECT_EQ(register_node(0), 1000);  // one node at one beat a second
  for (int k = 1; k < 4; ++k) register_node(k);
  EXPECT_EQ(register_node(4), 5000);  // five nodes: each every 5 s
  json cluster = api.get_json("/v1/cluster").value();
  EXPECT_EQ(cluster["heartbeat_ms"], 5000);
  EXPECT_EQ(cluster["node_timeout_ms"], 600000);  // the configured timeout is still the longer
  Result<HttpReply> beat = api.post_bytes(
      "/v1/agents/n0/heartbeat", agent_beat_encode({{"ended", json::array()}}, RecordBatch()).value(),
      kAgentBeatMediaType);
  ASSERT_TRUE(beat.ok()) << beat.error();
  EXPECT_EQ(json::parse(beat->body)["heartbeat_ms"], 5000);
  for (int k = 5; k < 200; ++k) register_node(k);
  cluster = api.get_json("/v1/cluster").value();
  EXPECT_EQ(cluster["heartbeat_ms"], 200000);
  EXPECT_EQ(cluster["node_timeout_ms"], kMissedBeatsLost * 200000);
  c.stop();
  std::error_code ec;
  fs::remove_all(dir, ec);
}

TEST(BeatInterval, ABudgetThatIsNotPositiveIsRefusedAtStart) {
  const fs::path dir = testing_support::scratch_dir("coordinator");
  for (double bad : {0.0, -1.0, std::nan("")}) {
    Coordinator c({.dir = dir.string(), .token = token_generate().value(), .max_beats_per_s = bad});
    Status s = c.start();
    EXPECT_FALSE(s.ok()) << bad;
    EXPECT_THAT(s.message(), HasSubstr("max_beats_per_s")) << bad;
  }
  std::error_code ec;
  fs::remove_all(dir, ec);
}

}  // namespace
}  // namespace gantry
