// The data path against a real cluster (`gantry-engine up`, real processes on loopback): the DataSource
// submits the tiny run, follows its steps and events, carries out "Checkpoint now", and after its
// connections are dropped mid-run catches up from the last step it held, with no gap and no repeat; the
// local cache (a real SQLite file) holds the same steps.
#include "ui/console/data_source.h"

#include <gtest/gtest.h>
#include <signal.h>

#include <cmath>
#include <memory>
#include <set>

#include "engine/cluster/token.h"
#include "storage/history_db.h"
#include "telemetry/record_json.h"
#include "tests/ui/console/local_cluster.h"

namespace gantry::console {
namespace {

using namespace std::chrono_literals;
using namespace testing_support;

class DataSourceCluster : public ::testing::Test {
 protected:
  void SetUp() override {
    become_subreaper();
    dir_ = scratch_dir("data_source");
    cluster_ = dir_ / "cluster";
    ASSERT_EQ(
        run_shell(std::string(GANTRY_ENGINE_BIN " up --nodes 2 --slots 2 --no-restart --dir ") +
                  cluster_.string() + " >" + (dir_ / "up.out").string() + " 2>" + (dir_ / "up.err").string()),
        0)
        << slurp(dir_ / "up.err");
    pids_ = pid_files(cluster_);
    ASSERT_EQ(pids_.size(), 3u);  // --no-restart: a test below starts the coordinator again itself
    std::string url = slurp(dir_ / "up.out");
    url = url.substr(0, url.find('\n'));
    Result<std::string> token = token_file_read((cluster_ / "token").string());
    ASSERT_TRUE(token.ok()) << token.error();
    endpoint_ = {url, token.value()};
  }

  void TearDown() override {
    if (source_) source_->stop();
    EXPECT_EQ(
        run_shell(std::string(GANTRY_ENGINE_BIN " down --dir ") + cluster_.string() + " >/dev/null 2>&1"), 0);
    for (pid_t p : pids_)
      EXPECT_TRUE(eventually([&] { return gone(p); }, 10s)) << "pid " << p << " left behind";
    for (pid_t p : workers_)
      EXPECT_TRUE(eventually([&] { return gone(p); }, 10s)) << "worker " << p << " left behind";
  }

  std::shared_ptr<const ConsoleSnapshot> snap() const { return source_->snapshot(); }

  // A source following the cluster submits the tiny run (dp 4) and waits for its step `steps`; *run is its
  // id.
  void tiny_run_start(int64_t steps, int64_t* run) {
    source_ = std::make_unique<DataSource>(
        DataSourceOptions{.tiny_config = slurp(GANTRY_CONSOLE_TINY_CONFIG), .tiny_dp = 4},
        [this]() -> Result<Endpoint> { return endpoint_; });
    source_->start();
    source_->request_submit_tiny();
    ASSERT_TRUE(eventually([&] { return snap()->steps->last_step() >= steps; }, 60s))
        << snap()->last_action.message;
    *run = snap()->run.id;
    workers_ = children_of(pids_);
  }

  // One history, whatever happened to the run or the coordinator: every step from 1 on, once, in order, no
  // gap, and no event twice.
  static void expect_one_history(const ConsoleSnapshot& s) {
    const std::vector<StepRecord>& steps = s.steps->records();
    for (size_t k = 0; k < steps.size(); ++k) ASSERT_EQ(steps[k].step, static_cast<int64_t>(k) + 1);
    EXPECT_EQ(s.steps->gap_steps(), 0);
    std::set<int64_t> ids;
    for (const EventView& e : s.events) EXPECT_TRUE(ids.insert(e.id).second) << "event " << e.id << " twice";
  }

  fs::path dir_, cluster_;
  Endpoint endpoint_;
  std::vector<pid_t> pids_, workers_;
  std::unique_ptr<DataSource> source_;
};

TEST_F(DataSourceCluster, FollowsTheTinyRunActsAndCatchesUpWithoutAGap) {
  source_ = std::make_unique<DataSource>(DataSourceOptions{.cache_path = (dir_ / "console.sqlite").string(),
                                                           .tiny_config = slurp(GANTRY_CONSOLE_TINY_CONFIG),
                                                           .tiny_dp = 4},
                                         [this]() -> Result<Endpoint> { return endpoint_; });
  source_->start();
  ASSERT_TRUE(eventually([&] { return snap()->connected; }, 20s)) << snap()->error;
  EXPECT_EQ(snap()->nodes.size(), 2u);
  EXPECT_EQ(snap()->run.id, -1);
  // The agents' health checks reach the Cluster panel's model: their disk check passes.
  EXPECT_TRUE(eventually(
      [&] {
        auto s = snap();
        return s->nodes.size() == 2 && s->nodes[0].health == "ok" && s->nodes[1].health == "ok";
      },
      20s))
      << (snap()->nodes.empty() ? "" : snap()->nodes[0].health);

  source_->request_submit_tiny();
  ASSERT_TRUE(eventually([&] { return snap()->steps->last_step() >= 4; }, 60s))
      << snap()->last_action.message;
  EXPECT_TRUE(snap()->last_action.ok) << snap()->last_action.message;
  const int64_t run = snap()->run.id;
  EXPECT_GE(run, 0);
  EXPECT_EQ(snap()->run.dp, 4);
  workers_ = children_of(pids_);
  EXPECT_EQ(workers_.size(), 4u);

  // Drop both connections while the run goes on; the model continues from where it was.
  const int64_t before = snap()->steps->last_step();
  source_->reconnect();
  ASSERT_TRUE(eventually([&] { return snap()->steps->last_step() >= before + 6; }, 60s));

  // "Checkpoint now": accepted, and rank 0's checkpoint event arrives on the event stream.
  source_->request_action(run, RunAction::kCheckpoint);
  ASSERT_TRUE(eventually(
      [&] {
        for (const EventView& e : snap()->events)
          if (e.record.kind == "checkpoint") return true;
        return false;
      },
      60s));
  EXPECT_TRUE(snap()->last_action.ok) << snap()->last_action.message;
  ASSERT_TRUE(eventually([&] { return !snap()->checkpoints.empty(); }, 20s));
  // This build's checkpoints carry their training stall through the catalog (the panel's stall column).
  for (const CheckpointView& c : snap()->checkpoints) {
    EXPECT_TRUE(c.stall_s.has_value()) << "step " << c.step << ": the stall did not reach the console";
    EXPECT_GE(c.stall_s.value_or(0.0), 0.0);
  }

  // Every step from 1 on, once, in order.
  std::shared_ptr<const ConsoleSnapshot> s = snap();
  const std::vector<StepRecord>& steps = s->steps->records();
  ASSERT_GE(steps.size(), 10u);
  ASSERT_NO_FATAL_FAILURE(expect_one_history(*s));
  EXPECT_GT(steps.front().loss, 4.0);  // ln 256 = 5.5 at the start
  EXPECT_EQ(s->ranks.size(), 4u);
  for (const RankView& r : s->ranks) EXPECT_GT(r.latest.step, 0) << "rank " << r.rank << ": no latest record";

  // The heatmap: asked for as the Run panel asks (a step range at its pixels), fetched from the coordinator's
  // tile query into the cache; one row per rank, one column per step, each cell the coordinator's own value
  // for that rank and step (its per-rank band at one step a bucket).
  const int64_t upto = s->steps->last_step();
  source_->want_heatmap({.run = run, .step_lo = 1, .step_hi = upto + 1, .cols = 600, .rows = 100});
  ASSERT_TRUE(eventually(
      [&] { return snap()->heat->want.step_hi == upto + 1 && !snap()->heat->pages.empty(); }, 30s));
  std::shared_ptr<const ConsoleSnapshot> h = snap();
  ASSERT_TRUE(h->heat->pages[0]);
  const HeatTile& page = *h->heat->pages[0];
  EXPECT_EQ(page.bucket_steps, 1);
  EXPECT_EQ(page.rows, 4);
  EXPECT_EQ(page.ranks_per_row, 1);
  EXPECT_GT(h->tile_cache_bytes, 0u);
  EXPECT_EQ(h->band->metric, RankTimeMetric::kBusy);
  EXPECT_GE(h->band->size(), 5u);
  ApiClient api({.url = endpoint_.url, .token = endpoint_.token});
  int compared = 0;
  for (int rank = 0; rank < 4; ++rank) {
    Result<nlohmann::json> per_rank = api.steps(run, {.ranks = std::to_string(rank), .buckets = 100000});
    ASSERT_TRUE(per_rank.ok()) << per_rank.error();
    for (const nlohmann::json& b : per_rank->at("rank_seconds")) {
      const int64_t step = b["step_begin"].get<int64_t>();
      const int64_t col = step - page.first_step;
      if (col < 0 || col >= page.cols || step > page.last_step - 2) continue;  // the newest may be partial
      EXPECT_NEAR(page.at(rank, static_cast<int>(col)), b["max"].get<double>(), 1e-6 * b["max"].get<double>())
          << "rank " << rank << " step " << step;
      ++compared;
    }
  }
  EXPECT_GE(compared, 4 * 5);

  // The selector: another metric asks for the band and the pages again, in that metric; forward is part of
  // busy, cell by cell.
  source_->set_rank_metric(RankTimeMetric::kForward);
  source_->want_heatmap({.run = run,
                         .metric = RankTimeMetric::kForward,
                         .step_lo = 1,
                         .step_hi = upto + 1,
                         .cols = 600,
                         .rows = 100});
  ASSERT_TRUE(eventually(
      [&] {
        std::shared_ptr<const ConsoleSnapshot> f = snap();
        return f->band->metric == RankTimeMetric::kForward &&
               f->heat->want.metric == RankTimeMetric::kForward && !f->heat->pages.empty() &&
               f->heat->pages[0];
      },
      30s));
  const HeatTile& forward = *snap()->heat->pages[0];
  int parts = 0;
  for (int rank = 0; rank < 4; ++rank) {
    for (int c = 0; c < std::min(forward.cols, page.cols); ++c) {
      if (std::isnan(page.at(rank, c)) || std::isnan(forward.at(rank, c))) continue;
      EXPECT_GT(forward.at(rank, c), 0.0f);
      EXPECT_LT(forward.at(rank, c), page.at(rank, c))
          << "forward is part of busy: rank " << rank << " col " << c;
      ++parts;
    }
  }
  EXPECT_GE(parts, 4 * 5);

  // Stop the run through the same path; then the local cache holds what the model held.
  source_->request_action(run, RunAction::kStop);
  ASSERT_TRUE(eventually([&] { return snap()->run.state == "stopped"; }, 60s)) << snap()->run.state;
  const int64_t last = snap()->run.last_step;
  ASSERT_TRUE(eventually([&] { return snap()->steps->last_step() == last; }, 20s));
  source_->stop();
  std::string error;
  std::unique_ptr<HistoryDb> db =
      HistoryDb::open((dir_ / "console.sqlite").string(), {.read_only = true}, &error);
  ASSERT_TRUE(db) << error;
  std::vector<RunRow> runs;
  ASSERT_TRUE(db->list_runs(&runs));
  ASSERT_EQ(runs.size(), 1u);
  std::vector<StepRecord> cached;
  ASSERT_TRUE(db->read_steps(runs[0].id, 0, kStepEnd, 100000, &cached));
  ASSERT_EQ(cached.size(), static_cast<size_t>(last));
  for (size_t k = 0; k < cached.size(); ++k) EXPECT_EQ(cached[k].step, static_cast<int64_t>(k) + 1);
  EXPECT_EQ(runs[0].status, RunStatus::stopped);
  std::vector<CheckpointInfo> ckpts;
  ASSERT_TRUE(db->list_checkpoints(runs[0].id, &ckpts));
  EXPECT_GE(ckpts.size(), 1u);
}

bool saw(const ConsoleSnapshot& s, const std::string& kind) {
  for (const EventView& e : s.events)
    if (e.record.kind == kind) return true;
  return false;
}

// A quarantine moves the run to dp 2 on the other node, a stop ends it, a resume-from brings it back:
// one run id, one step history with no gap and no repeat, and the event stream reopened after the run
// had ended and lived again.
TEST_F(DataSourceCluster, QuarantineStopAndResumeFromKeepOneHistoryWithoutAGap) {
  int64_t run = -1;
  ASSERT_NO_FATAL_FAILURE(tiny_run_start(4, &run));

  source_->request_quarantine("node-1");
  ASSERT_TRUE(eventually([&] { return saw(*snap(), "quarantine_resumed"); }, 60s))
      << snap()->last_action.message;
  EXPECT_TRUE(eventually([&] { return snap()->run.dp == 2; }, 20s))
      << snap()->run.dp;  // the next poll's view
  const int64_t moved = snap()->steps->last_step();
  ASSERT_TRUE(eventually([&] { return snap()->steps->last_step() >= moved + 3; }, 60s));

  source_->request_action(run, RunAction::kStop);
  ASSERT_TRUE(eventually([&] { return snap()->run.state == "stopped"; }, 60s));
  ASSERT_TRUE(eventually([&] { return saw(*snap(), "run_stopped"); }, 20s));
  source_->request_resume_from(run, "latest", 0);
  ASSERT_TRUE(eventually([&] { return saw(*snap(), "resume_resumed"); }, 60s)) << snap()->last_action.message;
  EXPECT_TRUE(snap()->last_action.ok) << snap()->last_action.message;
  const int64_t resumed = snap()->steps->last_step();
  ASSERT_TRUE(eventually([&] { return snap()->steps->last_step() >= resumed + 3; }, 60s));
  for (pid_t p : children_of(pids_)) workers_.push_back(p);

  std::shared_ptr<const ConsoleSnapshot> s = snap();
  EXPECT_EQ(s->run.id, run);
  ASSERT_NO_FATAL_FAILURE(expect_one_history(*s));
  bool quarantined = false;
  for (const NodeView& n : s->nodes)
    quarantined = quarantined || (n.id == "node-1" && n.state == "quarantined");
  EXPECT_TRUE(quarantined);
  source_->request_action(run, RunAction::kStop);
  ASSERT_TRUE(eventually([&] { return snap()->run.state == "stopped"; }, 60s));
}

// The coordinator killed with -9 mid-run and started again on the same folder and port (issue "Fault
// tolerance"): the console shows it unreachable, then catches up: the steps trained while it was down
// arrive, every step once from 1 on, the event stream resumes (the re-adoption's event included), no
// event twice.
TEST_F(DataSourceCluster, CatchesUpWithoutAGapAfterTheCoordinatorIsKilledAndRestarted) {
  int64_t run = -1;
  ASSERT_NO_FATAL_FAILURE(tiny_run_start(4, &run));

  const pid_t coordinator = static_cast<pid_t>(std::stol(slurp(cluster_ / "coordinator.pid")));
  ASSERT_EQ(::kill(coordinator, SIGKILL), 0);
  ASSERT_TRUE(eventually([&] { return gone(coordinator); }, 5s));
  ASSERT_TRUE(eventually([&] { return !snap()->connected; }, 20s));
  const int64_t held = snap()->steps->last_step();
  const std::string port = endpoint_.url.substr(endpoint_.url.rfind(':') + 1);
  ASSERT_EQ(run_shell("setsid " + std::string(GANTRY_ENGINE_BIN " coordinator --dir ") + cluster_.string() +
                      " --token-file " + (cluster_ / "token").string() + " --agent-token-file " +
                      (cluster_ / "agent_token").string() + " --port " + port + " >>" +
                      (cluster_ / "coordinator.log").string() + " 2>&1 </dev/null & echo $! >" +
                      (cluster_ / "coordinator.pid").string()),
            0);
  pids_ = pid_files(cluster_);
  ASSERT_TRUE(eventually([&] { return saw(*snap(), "run_adopted"); }, 60s)) << snap()->error;
  ASSERT_TRUE(eventually([&] { return snap()->steps->last_step() >= held + 10; }, 60s));
  EXPECT_TRUE(snap()->connected) << snap()->error;
  EXPECT_EQ(snap()->run.id, run);
  EXPECT_EQ(snap()->run.state, "running");

  std::shared_ptr<const ConsoleSnapshot> s = snap();
  ASSERT_NO_FATAL_FAILURE(expect_one_history(*s));
  source_->request_action(run, RunAction::kStop);
  ASSERT_TRUE(eventually([&] { return snap()->run.state == "stopped"; }, 60s));
}

// The Stragglers panel's toggle goes through the feed library: request_straggler_quarantine reaches the
// coordinator (the run's options say so when asked directly), the change comes back as a straggler_policy
// event on the console's stream, and the snapshot shows the policy as the coordinator holds it; off again
// likewise.
TEST_F(DataSourceCluster, TheStragglerToggleReachesTheCoordinator) {
  int64_t run = -1;
  ASSERT_NO_FATAL_FAILURE(tiny_run_start(2, &run));
  ASSERT_TRUE(eventually([&] { return snap()->run.straggler_quarantine.has_value(); }, 20s));
  EXPECT_FALSE(*snap()->run.straggler_quarantine);  // off by default

  ApiClient api({.url = endpoint_.url, .token = endpoint_.token});
  auto policy_events = [&] {
    int n = 0;
    for (const EventView& e : snap()->events) n += e.record.kind == "straggler_policy";
    return n;
  };
  source_->request_straggler_quarantine(run, true);
  ASSERT_TRUE(eventually([&] { return snap()->run.straggler_quarantine == std::optional<bool>(true); }, 20s))
      << snap()->last_action.message;
  EXPECT_TRUE(snap()->last_action.ok) << snap()->last_action.message;
  Result<nlohmann::json> held = api.run(run);
  ASSERT_TRUE(held.ok()) << held.error();
  EXPECT_EQ(held->at("straggler")["quarantine"], true) << held->dump();
  EXPECT_EQ(held->at("straggler")["enabled"], true) << held->dump();
  ASSERT_TRUE(eventually([&] { return policy_events() == 1; }, 20s));

  source_->request_straggler_quarantine(run, false);
  ASSERT_TRUE(eventually([&] { return snap()->run.straggler_quarantine == std::optional<bool>(false); }, 20s))
      << snap()->last_action.message;
  held = api.run(run);
  ASSERT_TRUE(held.ok()) << held.error();
  EXPECT_EQ(held->at("straggler")["quarantine"], false) << held->dump();
  ASSERT_TRUE(eventually([&] { return policy_events() == 2; }, 20s));

  source_->request_action(run, RunAction::kStop);
  ASSERT_TRUE(eventually([&] { return snap()->run.state == "stopped"; }, 60s));
  // An ended run's policy is not changed: the coordinator's 409 is the request's outcome.
  source_->request_straggler_quarantine(run, true);
  ASSERT_TRUE(eventually([&] { return snap()->last_action.message.find("409") != std::string::npos; }, 20s))
      << snap()->last_action.message;
  EXPECT_FALSE(snap()->last_action.ok);
}

// The Timeline panel's feed: nothing is read before the panel asks; a fixed range holds every rank's
// record of those steps, as the coordinator serves them; the newest steps follow the live run.
TEST_F(DataSourceCluster, TheTimelineHoldsTheWantedStepsOfEveryRank) {
  int64_t run = -1;
  ASSERT_NO_FATAL_FAILURE(tiny_run_start(8, &run));
  EXPECT_TRUE(snap()->timeline->empty()) << "read before the panel asked";

  source_->want_timeline({.run = run, .first_step = 3, .steps = 4});
  ASSERT_TRUE(eventually(
      [&] {
        auto t = snap()->timeline;
        return t->run == run && t->first_step == 3 && t->steps == 4 && t->complete_steps() == 4;
      },
      20s));
  const std::shared_ptr<const TimelineWindow> t = snap()->timeline;
  EXPECT_EQ(t->ranks, 4);
  ApiClient api({.url = endpoint_.url, .token = endpoint_.token});
  Result<nlohmann::json> rows = api.steps(run, {.after = 2, .ranks = "all", .limit = 16});
  ASSERT_TRUE(rows.ok()) << rows.error();
  size_t compared = 0;
  for (const nlohmann::json& row : rows->at("rank_steps")) {
    RankStepRecord r;
    std::string error;
    ASSERT_TRUE(record_read_json(row, &r, &error)) << error;
    if (r.step > 6) continue;
    const TimelineCell& c = t->at(r.rank, r.step);
    EXPECT_TRUE(c.present);
    EXPECT_EQ(c.total, static_cast<float>(r.total_s)) << "rank " << r.rank << " step " << r.step;
    EXPECT_EQ(c.seconds[static_cast<int>(Phase::forward)], static_cast<float>(r.phases.forward));
    ++compared;
  }
  EXPECT_EQ(compared, 16u);

  // The newest 5 steps, moving with the run.
  source_->want_timeline({.run = run, .steps = 5});
  ASSERT_TRUE(
      eventually([&] { return snap()->timeline->steps == 5 && snap()->timeline->first_step > 3; }, 20s));
  const int64_t first = snap()->timeline->first_step;
  ASSERT_TRUE(eventually([&] { return snap()->timeline->first_step > first; }, 30s))
      << "the window stayed at step " << first;
  source_->request_action(run, RunAction::kStop);
  ASSERT_TRUE(eventually([&] { return snap()->run.state == "stopped"; }, 60s));
}

TEST(DataSource, AnUnreachableCoordinatorIsShownNotWaitedOn) {
  // Port 9 (discard) on loopback: nothing listens there in a test environment.
  DataSource source({.poll_interval = 50ms, .retry_interval = 50ms}, []() -> Result<Endpoint> {
    return Endpoint{"http://127.0.0.1:9", std::string(64, 'a')};
  });
  source.start();
  ASSERT_TRUE(eventually([&] { return !source.snapshot()->error.empty(); }, 20s));
  EXPECT_FALSE(source.snapshot()->connected);
  EXPECT_NE(source.snapshot()->error.find("cannot reach coordinator at http://127.0.0.1:9"),
            std::string::npos)
      << source.snapshot()->error;
  source.stop();
}

TEST(DataSource, AFailedStartIsShownAndEndsTheNetworkThread) {
  DataSource source({},
                    []() -> Result<Endpoint> { return Status::error("gantry-engine up failed: no slots"); });
  source.start();
  ASSERT_TRUE(eventually([&] { return source.snapshot()->phase == "failed"; }, 20s));
  EXPECT_EQ(source.snapshot()->error, "gantry-engine up failed: no slots");
  source.stop();
}

}  // namespace
}  // namespace gantry::console
