// The silent-data-corruption check end to end (engine/core/sdc_check.h): gangs of 4 real worker processes
// over Gloo. A bit flipped in one replica's parameters (GANTRY_TEST_WORKER_FAULT <rank>:flip_bit:<k>) is
// found at the next check, the sdc_mismatch event names that rank and no other, and every rank stops with the
// reason; clean runs checked every step raise no alarm at ZeRO 0 and ZeRO 1.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <cerrno>
#include <fstream>
#include <nlohmann/json.hpp>  // parses the --json lines
#include <sstream>
#include <string>
#include <vector>

#include "tests/app/engine_child.h"
#include "tests/app/engine_process.h"
#include "tests/scratch_dir.h"
#ifdef GANTRY_HAVE_STORAGE
#include "storage/history_db.h"
#endif

namespace gantry {
namespace {

using namespace std::chrono_literals;
using ::testing::HasSubstr;
using ::testing::Not;
using testing_support::EngineChild;

// A model that trains a step in milliseconds, over shards written beforehand; global batch 8 so that 4
// ranks each take 2 sequences.
std::string write_config(const std::string& dir, int max_steps, int sdc_every) {
  testing_support::Outcome d = testing_support::run_engine(
      "data synthetic --out " + dir + "/data --vocab 32 --train-tokens 8192 --val-tokens 1024");
  EXPECT_EQ(d.code, 0) << d.err;
  const std::string path = dir + "/small.toml";
  std::ofstream(path) << "[model]\nn_layer = 1\nn_head = 2\nn_embd = 16\nvocab_size = 32\nseq_len = 8\n"
                      << "[train]\nglobal_batch = 8\nmicro_batch = 2\nthreads = 1\nmax_steps = " << max_steps
                      << "\nval_every = 0\ncheckpoint_every = 0\nsdc_check_every = " << sdc_every << "\n"
                      << "[data]\nkind = \"shards\"\ndir = \"" << dir << "/data\"\n";
  return path;
}

void expect_gone(const std::vector<pid_t>& pids) {
  for (size_t r = 0; r < pids.size(); ++r) {
    errno = 0;
    EXPECT_EQ(::kill(pids[r], 0), -1) << "rank " << r << " (pid " << pids[r] << ") left behind";
    EXPECT_EQ(errno, ESRCH) << "rank " << r << " (pid " << pids[r] << ") left behind";
  }
}

std::vector<nlohmann::json> json_lines(const std::string& out, const std::string& event) {
  std::vector<nlohmann::json> found;
  std::istringstream in(out);
  for (std::string line; std::getline(in, line);) {
    nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    if (!j.is_object()) continue;
    if (event.empty() ? !j.contains("event") && j.contains("loss") : j.value("event", "") == event)
      found.push_back(j);
  }
  return found;
}

#ifdef GANTRY_HAVE_STORAGE
std::vector<EventRecord> history_events(const std::string& run_dir, const std::string& kind) {
  std::vector<EventRecord> out;
  std::string error;
  auto db = HistoryDb::open(run_dir + "/history.sqlite", {}, &error);
  EXPECT_TRUE(db) << error;
  if (!db) return out;
  std::vector<RunRow> runs;
  EXPECT_TRUE(db->list_runs(&runs)) << db->error();
  if (runs.size() != 1) return out;
  std::vector<EventRow> events;
  EXPECT_TRUE(db->read_events(runs[0].id, 0, 1000, &events)) << db->error();
  for (const EventRow& row : events)
    if (row.event.kind == kind) out.push_back(row.event);
  return out;
}
#endif

struct FlipCase {
  int zero;
  int every;      // train.sdc_check_every
  int flip_step;  // the bit flips after this step's update
  int found_at;   // the next check
};

class SdcFlip : public ::testing::TestWithParam<FlipCase> {};

// ZeRO 0 keeps a flipped bit until the next check (every 2 steps: flipped after step 3, found at 4). ZeRO 1's
// next update would overwrite it from the owner's shard (or spread it to every replica), so only a check
// right after the flip can see it: every step.
TEST_P(SdcFlip, AFlippedBitInOneReplicaIsFoundAtTheNextCheckNamingThatRankOnly) {
  const FlipCase c = GetParam();
  const std::string dir = testing_support::scratch_dir("flip").string();
  const std::string cfg = write_config(dir, 8, c.every);
  EngineChild run =
      EngineChild::start({"run", "--nproc", "4", "--zero", std::to_string(c.zero), "--config", cfg, "--out",
                          dir + "/run", "--json"},
                         {{"GANTRY_TEST_WORKER_FAULT", "2:flip_bit:" + std::to_string(c.flip_step)}});
  EngineChild::Exit e = run.wait(120s);
  EXPECT_EQ(e.code, 1) << run.err();
  expect_gone(run.worker_pids());
  const std::string at = "step " + std::to_string(c.found_at) + ": silent data corruption";
  EXPECT_THAT(run.err(), HasSubstr("test fault: flipped bit")) << run.err();
  // The stop's reason: which rank, what was compared, and where to resume from.
  EXPECT_THAT(run.err(), HasSubstr(at + ": the fp32 parameters")) << run.err();
  EXPECT_THAT(run.err(), HasSubstr("of rank 2 (host ")) << run.err();
  EXPECT_THAT(run.err(), HasSubstr("differ from the 3 of 4 replicas that agree")) << run.err();
  EXPECT_THAT(run.err(), HasSubstr("stopping the run: resume from a checkpoint of step"));
  for (int other : {0, 1, 3}) {
    EXPECT_THAT(run.err(), Not(HasSubstr("of rank " + std::to_string(other) + " (host")));
    EXPECT_THAT(run.err(), Not(HasSubstr("rank " + std::to_string(other) + " (host "))) << "rank " << other;
  }
  // The event, once, from the named rank; no step after the mismatch ran.
  const std::vector<nlohmann::json> ev = json_lines(run.out(), "sdc_mismatch");
  ASSERT_EQ(ev.size(), 1u) << run.out();
  EXPECT_EQ(ev[0]["rank"], 2);
  EXPECT_EQ(ev[0]["step"], c.found_at);
  EXPECT_EQ(json_lines(run.out(), "").size(), static_cast<size_t>(c.found_at)) << run.out();
#ifdef GANTRY_HAVE_STORAGE
  const std::vector<EventRecord> stored = history_events(dir + "/run", "sdc_mismatch");
  ASSERT_EQ(stored.size(), 1u);
  EXPECT_EQ(stored[0].rank, 2);
  EXPECT_EQ(stored[0].step, c.found_at);
  EXPECT_FALSE(stored[0].node.empty());
  nlohmann::json p = nlohmann::json::parse(stored[0].payload, nullptr, false);
  ASSERT_TRUE(p.is_object()) << stored[0].payload;
  EXPECT_EQ(p["suspects"], nlohmann::json::array({2}));
  EXPECT_EQ(p["majority"], true);
  EXPECT_EQ(p["agreeing"], 3);
  EXPECT_EQ(p["replicas"], 4);
  EXPECT_EQ(p["last_passed_step"], c.found_at - c.every);
#endif
}

INSTANTIATE_TEST_SUITE_P(Zero, SdcFlip,
                         ::testing::Values(FlipCase{.zero = 0, .every = 2, .flip_step = 3, .found_at = 4},
                                           FlipCase{.zero = 1, .every = 1, .flip_step = 3, .found_at = 3}),
                         [](const ::testing::TestParamInfo<FlipCase>& p) {
                           return "zero" + std::to_string(p.param.zero) + "_every" +
                                  std::to_string(p.param.every);
                         });

class SdcClean : public ::testing::TestWithParam<int> {};

// Every step checked over a whole run: the replicas agree bit for bit, so no alarm and a normal end.
TEST_P(SdcClean, ACleanFourRankRunCheckedEveryStepRaisesNoAlarm) {
  const int zero = GetParam();
  const std::string dir = testing_support::scratch_dir("clean").string();
  const std::string cfg = write_config(dir, 6, 1);
  EngineChild run = EngineChild::start({"run", "--nproc", "4", "--zero", std::to_string(zero), "--config",
                                        cfg, "--out", dir + "/run", "--json"});
  EngineChild::Exit e = run.wait(120s);
  ASSERT_EQ(e.code, 0) << run.err();
  expect_gone(run.worker_pids());
  EXPECT_THAT(run.err(), HasSubstr("sdc check: every 1 steps, the fp32 parameters")) << run.err();
  EXPECT_THAT(run.err(), Not(HasSubstr("silent data corruption")));
  EXPECT_THAT(run.err(), HasSubstr("done: step 6")) << run.err();
  EXPECT_THAT(run.err(), HasSubstr("6 sdc checks (")) << run.err();
  EXPECT_THAT(run.err(), HasSubstr(" ms each, hashing ")) << run.err();
  EXPECT_TRUE(json_lines(run.out(), "sdc_mismatch").empty()) << run.out();
  EXPECT_EQ(json_lines(run.out(), "").size(), 6u) << run.out();
#ifdef GANTRY_HAVE_STORAGE
  EXPECT_TRUE(history_events(dir + "/run", "sdc_mismatch").empty());
#endif
}

INSTANTIATE_TEST_SUITE_P(Zero, SdcClean, ::testing::Values(0, 1), [](const ::testing::TestParamInfo<int>& p) {
  return "zero" + std::to_string(p.param);
});

// ZeRO 3 keeps no replicated state: the check says it is off rather than comparing shards.
TEST(SdcCli, ZeroThreeSaysTheCheckIsOff) {
  const std::string dir = testing_support::scratch_dir("zero3").string();
  const std::string cfg = write_config(dir, 2, 1);
  EngineChild run =
      EngineChild::start({"run", "--nproc", "2", "--zero", "3", "--config", cfg, "--out", dir + "/run"});
  EngineChild::Exit e = run.wait(120s);
  ASSERT_EQ(e.code, 0) << run.err();
  EXPECT_THAT(run.err(), HasSubstr("sdc check: off (ZeRO 3 shards the parameters: no state is replicated)"));
}

}  // namespace
}  // namespace gantry
