// The Timeline panel in the real window: `gantry` under Xvfb against a real cluster whose rank 2 has a slowed
// forward (GANTRY_TEST_WORKER_FAULT, as tests/app's straggler tests do). Through --script and --dump-state:
// the timeline holds the run's steps for every rank, rank 2's forward spans are the longest and its lane is
// the one marked slow; the "Export trace" button writes a trace beside the cache; the exported
// Chrome/Perfetto trace parses and holds one event per span of the rank records the coordinator serves for
// those steps. No process may outlive the test.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "engine/cluster/http_client.h"
#include "engine/cluster/token.h"
#include "telemetry/record_json.h"
#include "tests/ui/console/xvfb_console.h"

namespace gantry::console {
namespace {

using json = nlohmann::json;
using namespace std::chrono_literals;
using namespace testing_support;

TEST(ConsoleTimeline, TheSlowRanksForwardSpansAreTheLongestAndTheTraceHoldsEverySpan) {
  if (!have_xvfb_run()) GTEST_SKIP() << "xvfb-run is not installed (Debian: xvfb)";
  become_subreaper();
  const fs::path dir = scratch_dir("console_timeline");
  // Every worker of this cluster reads the fault: rank 2's forward takes 300 ms longer.
  ::setenv("GANTRY_TEST_WORKER_FAULT", "2:slow_forward:300", 1);
  const UpCluster up = up_cluster(dir, "--nodes 2 --slots 2");
  ::unsetenv("GANTRY_TEST_WORKER_FAULT");
  ASSERT_EQ(up.error, "");
  const fs::path& cluster = up.dir;
  const std::vector<pid_t>& daemons = up.daemons;
  const std::string& url = up.url;
  HttpClient api({.url = url, .token = up.token});
  Result<json> sub = api.post_json(
      "/v1/runs",
      {{"config", slurp(GANTRY_CONSOLE_TINY_CONFIG)}, {"layout", {{"dp", 4}}}, {"name", "timeline-test"}});
  ASSERT_TRUE(sub.ok()) << sub.error();
  const int64_t run = sub->at("id").get<int64_t>();

  const fs::path trace = dir / "trace.json";
  std::ofstream(dir / "script") << "wait_connected\n"
                                   "wait_steps 6\n"
                                   "wait_timeline 5\n"
                                   "export_timeline \""
                                << trace.string() << "\"\nclick \"Export trace\"\nwait_frames 3\n";
  const int code = run_gantry_script(dir, url, cluster / "token", 10);
  EXPECT_EQ(code, 0) << slurp(dir / "gantry.err");
  const std::vector<pid_t> workers = children_of(daemons);

  const json state = json::parse(slurp(dir / "state.json"), nullptr, false);
  ASSERT_FALSE(state.is_discarded()) << slurp(dir / "state.json");
  EXPECT_THAT(state["panels"].get<std::vector<std::string>>(), ::testing::Contains("Timeline"));
  const json& tl = state["timeline"];
  EXPECT_EQ(tl["run"], run);
  EXPECT_EQ(tl["ranks"], 4);
  EXPECT_GE(tl["complete_steps"].get<int64_t>(), 5) << tl.dump();
  EXPECT_GT(tl["items"].get<size_t>(), 0u) << "the lanes drew nothing";
  EXPECT_EQ(tl["lanes_drawn"], 4);
  ASSERT_EQ(tl["lanes"].size(), 4u);
  // The slow rank's forward spans: the longest of all, and the longest on average.
  const json& slow = tl["lanes"][2];
  for (int r : {0, 1, 3}) {
    const json& other = tl["lanes"][static_cast<size_t>(r)];
    EXPECT_GT(slow["forward_max_s"].get<double>(), other["forward_max_s"].get<double>()) << "rank " << r;
    EXPECT_GT(slow["forward_mean_s"].get<double>(), other["forward_mean_s"].get<double>() + 0.2)
        << "rank " << r;
  }
  EXPECT_EQ(tl["slow_rank"], 2) << tl["slow_reason"];
  // The panel's button wrote its own trace beside the console's cache, and said where.
  const std::string said = tl["export"].get<std::string>();
  EXPECT_THAT(said, ::testing::HasSubstr("wrote " + (dir / "state").string() + "/timeline-run" +
                                         std::to_string(run)));
  const std::string button_trace = said.substr(std::string("wrote ").size());
  EXPECT_FALSE(json::parse(slurp(button_trace), nullptr, false).is_discarded()) << button_trace;

  // The trace: one complete event per span of the rank records it covers, as the coordinator serves them.
  const json t = json::parse(slurp(trace), nullptr, false);
  ASSERT_FALSE(t.is_discarded()) << slurp(trace).substr(0, 200);
  std::map<std::pair<int, int64_t>, size_t> events;  // (rank, step) → complete events
  for (const json& e : t["traceEvents"])
    if (e["ph"] == "X") ++events[{e["tid"].get<int>(), e["args"]["step"].get<int64_t>()}];
  ASSERT_FALSE(events.empty());
  const int64_t first = t["otherData"]["first_step"].get<int64_t>();
  Result<json> rows = api.get_json("/v1/runs/" + std::to_string(run) +
                                   "/steps?after=" + std::to_string(first - 1) + "&ranks=all&limit=100000");
  ASSERT_TRUE(rows.ok()) << rows.error();
  size_t checked = 0;
  std::set<int> ranks_seen;
  for (const json& row : rows->at("rank_steps")) {
    RankStepRecord r;
    std::string error;
    ASSERT_TRUE(record_read_json(row, &r, &error)) << error;
    auto it = events.find({r.rank, r.step});
    if (it == events.end()) continue;  // a step the window did not hold yet
    size_t spans = 0;
    for (int k = 0; k < kPhaseCount; ++k) spans += r.phases.get(static_cast<Phase>(k)) > 0;
    spans += r.total_s - r.phases.sum() > 1e-9;
    EXPECT_EQ(it->second, spans) << "rank " << r.rank << " step " << r.step;
    ranks_seen.insert(r.rank);
    ++checked;
  }
  EXPECT_EQ(checked, events.size()) << "the trace holds a span the coordinator has no record of";
  EXPECT_GE(checked, 4u * 5);
  EXPECT_EQ(ranks_seen.size(), 4u);

  down_and_expect_gone(cluster, daemons, workers);
}

}  // namespace
}  // namespace gantry::console
