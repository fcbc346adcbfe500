// gantry-engine run (the local launcher) and worker, as a user runs them: a 2-rank run with its JSON lines
// and every rank's history; a worker that dies in start-up, one that never joins, one killed or exiting
// mid-run, Ctrl-C; bad input; and workers started by hand as torchrun would, meeting over TCP. After
// every failure no worker pid may remain.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>  // PR_SET_CHILD_SUBREAPER
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>  // parses the --json lines
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "tests/app/engine_child.h"
#include "tests/app/engine_process.h"
#ifdef GANTRY_HAVE_STORAGE
#include "engine/core/xxhash64.h"  // the manifest's checksum, as the catalog keeps it
#include "storage/history_db.h"
#include "tests/scratch_dir.h"
#endif

namespace gantry {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using ::testing::HasSubstr;
using ::testing::Not;
using testing_support::EngineChild;

std::string fresh_dir(const std::string& name) {
  return testing_support::scratch_dir(name).string();
}

// A model that trains a step in milliseconds. The tokens come from shards written beforehand (`data
// synthetic`), so the test exercises the launcher, not who writes a run's synthetic corpus.
std::string write_config(const std::string& dir, int max_steps, bool quiet) {
  testing_support::Outcome d = testing_support::run_engine(
      "data synthetic --out " + dir + "/data --vocab 32 --train-tokens 8192 --val-tokens 1024");
  EXPECT_EQ(d.code, 0) << d.err;
  const std::string path = dir + "/small.toml";
  std::ofstream(path) << "[model]\nn_layer = 1\nn_head = 2\nn_embd = 16\nvocab_size = 32\nseq_len = 8\n"
                      << "[train]\nglobal_batch = 4\nmicro_batch = 2\nthreads = 1\nmax_steps = " << max_steps
                      << "\n"
                      << (quiet ? "val_every = 0\ncheckpoint_every = 0\n"
                                : "val_every = 2\nval_batches = 1\n")
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

std::vector<nlohmann::json> step_json_lines(const std::string& out) {
  std::vector<nlohmann::json> steps;
  std::istringstream in(out);
  for (std::string line; std::getline(in, line);) {
    nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_object() && j.contains("step") && j.contains("loss") && !j.contains("event")) steps.push_back(j);
  }
  return steps;
}

int step_lines(const std::string& err) {
  int n = 0;
  std::istringstream in(err);
  for (std::string line; std::getline(in, line);) n += line.rfind("step ", 0) == 0;
  return n;
}

TEST(RunCli, TwoRanksTrainPrintJsonLinesAndKeepEveryRanksHistory) {
  const std::string dir = fresh_dir("two_ranks");
  const std::string cfg = write_config(dir, 4, false);
  EngineChild run =
      EngineChild::start({"run", "--nproc", "2", "--config", cfg, "--out", dir + "/run", "--json"});
  EngineChild::Exit e = run.wait(60s);
  ASSERT_EQ(e.code, 0) << run.err();
  const std::vector<pid_t> pids = run.worker_pids();
  ASSERT_EQ(pids.size(), 2u) << run.err();
  expect_gone(pids);

  EXPECT_EQ(step_lines(run.err()), 4) << run.err();
  EXPECT_THAT(run.err(), HasSubstr("done: step 4"));
  std::vector<nlohmann::json> steps = step_json_lines(run.out());
  ASSERT_EQ(steps.size(), 4u) << run.out();
  for (size_t i = 0; i < steps.size(); ++i) {
    EXPECT_EQ(steps[i]["step"], static_cast<int>(i) + 1);
    EXPECT_GT(steps[i]["loss"].get<double>(), 2.0);  // ln 32 = 3.47 at the start
    EXPECT_TRUE(steps[i].contains("grad_norm"));
    EXPECT_TRUE(steps[i].contains("tokens_per_s"));
    EXPECT_TRUE(steps[i].contains("mfu") && steps[i]["mfu"].is_null()) << "a CPU without a peak: n/a, not 0";
  }
  EXPECT_THAT(run.err(), HasSubstr("| mfu n/a"));
  EXPECT_TRUE(steps[1].contains("val_loss"));
  EXPECT_TRUE(fs::exists(dir + "/run/checkpoints/step_00000004/manifest.json"));

#ifdef GANTRY_HAVE_STORAGE
  std::string error;
  auto db = HistoryDb::open(dir + "/run/history.sqlite", {}, &error);
  ASSERT_TRUE(db) << error;
  std::vector<RunRow> runs;
  ASSERT_TRUE(db->list_runs(&runs)) << db->error();
  ASSERT_EQ(runs.size(), 1u);
  EXPECT_EQ(runs[0].status, RunStatus::finished);
  EXPECT_EQ(runs[0].info.world_size, 2);
  EXPECT_EQ(runs[0].info.layout, "dp=2 tp=1 pp=1 zero=0");
  EXPECT_EQ(runs[0].last_step, 4);
  // The run's MFU basis reaches the launcher's history (from rank 0's worker_run frame): no peak here.
  EXPECT_GT(runs[0].info.flops_per_token, 0);
  EXPECT_EQ(runs[0].info.peak_flops, 0);
  EXPECT_THAT(runs[0].info.mfu_formula, HasSubstr("MFU n/a"));
  for (int32_t rank : {0, 1}) {
    std::vector<RankStepRecord> rs;
    ASSERT_TRUE(db->read_rank_steps(runs[0].id, 0, 100, {rank}, 100, &rs)) << db->error();
    ASSERT_EQ(rs.size(), 4u) << "rank " << rank;
    for (const RankStepRecord& r : rs) {
      EXPECT_EQ(r.rank, rank);
      EXPECT_GT(r.total_s, 0.0);
      EXPECT_EQ(r.tokens, 2 * 8) << "each rank trains half of the 4 x 8 tokens";
    }
  }
  std::vector<StepRecord> global;
  ASSERT_TRUE(db->read_steps(runs[0].id, 0, 100, 100, &global)) << db->error();
  ASSERT_EQ(global.size(), 4u);
  EXPECT_DOUBLE_EQ(global[0].loss, steps[0]["loss"].get<double>());
  EXPECT_FALSE(global[0].mfu.has_value());
  // The checkpoint, as rank 0's typed record reached the catalog through the ingest path: its size is the
  // shard files', its manifest checksum the committed manifest's, its stall the write (synchronous).
  std::vector<CheckpointInfo> ckpts;
  ASSERT_TRUE(db->list_checkpoints(runs[0].id, &ckpts)) << db->error();
  ASSERT_FALSE(ckpts.empty());
  const CheckpointInfo& last = ckpts.back();
  EXPECT_EQ(last.step, 4);
  EXPECT_EQ(last.state, "committed");
  const std::string ckdir = dir + "/run/checkpoints/step_00000004";
  EXPECT_EQ(fs::canonical(last.path), fs::canonical(ckdir));
  uint64_t shard_bytes = 0;
  int shard_files = 0;
  for (const fs::directory_entry& f : fs::directory_iterator(ckdir)) {
    if (f.path().filename().string().rfind("shard_", 0) != 0) continue;
    shard_bytes += f.file_size();
    ++shard_files;
  }
  EXPECT_EQ(shard_files, 2);
  EXPECT_EQ(last.bytes, shard_bytes);
  EXPECT_GT(last.write_s, 0.0);
  ASSERT_TRUE(last.stall_s.has_value());
  EXPECT_GE(*last.stall_s, last.write_s);  // the last write is synchronous: the loop waited for all of it
  EXPECT_EQ(last.shards.value_or(-1), 2);
  std::ifstream manifest_in(ckdir + "/manifest.json", std::ios::binary);
  const std::string manifest{std::istreambuf_iterator<char>(manifest_in), std::istreambuf_iterator<char>()};
  EXPECT_EQ(last.manifest_xxh64, xxhash64_hex(xxhash64(manifest.data(), manifest.size())));
  // One event for it, made from the record: the whole checkpoint (rank -1), its figures in the line.
  std::vector<EventRow> events;
  ASSERT_TRUE(db->read_events(runs[0].id, 0, 1000, &events)) << db->error();
  int checkpoint_events = 0;
  for (const EventRow& row : events) {
    if (row.event.kind != "checkpoint" || row.event.step != 4) continue;
    ++checkpoint_events;
    EXPECT_EQ(row.event.rank, -1);
    EXPECT_THAT(row.event.message, HasSubstr("checkpoint committed: "));
    EXPECT_THAT(row.event.message, HasSubstr("training stalled"));
  }
  EXPECT_EQ(checkpoint_events, 1);
#endif
  // The launcher's own line, from the same record.
  EXPECT_THAT(run.out(), HasSubstr("\"event\":\"checkpoint\""));
  EXPECT_THAT(run.err(), HasSubstr("checkpoint step 4 -> "));
}

#ifdef GANTRY_HAVE_STORAGE
// A checkpoint write that fails (the run's checkpoints folder is a file, so rank 0 cannot make the
// checkpoint's directory) is a typed record from the rank that saw it fail: the catalog holds the step as
// failed with the reason, the events name the rank, and the launcher says so; the run fails.
// --json-ranks: each rank's step record, in the telemetry codec's form, beside the global step lines (how a
// benchmark sees where a data-parallel step's time goes); without the flag, none.
TEST(RunCli, JsonRanksPrintsEveryRanksStepRecordWithItsPhases) {
  const std::string dir = fresh_dir("json_ranks");
  const std::string cfg = write_config(dir, 3, true);
  EngineChild run = EngineChild::start(
      {"run", "--nproc", "2", "--config", cfg, "--out", dir + "/run", "--json", "--json-ranks"});
  EngineChild::Exit e = run.wait(60s);
  ASSERT_EQ(e.code, 0) << run.err();
  std::set<std::pair<int, int>> seen;  // (step, rank)
  std::istringstream in(run.out());
  for (std::string line; std::getline(in, line);) {
    nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    if (!j.is_object() || !j.contains("rank_step")) continue;
    const nlohmann::json& r = j["rank_step"];
    for (const char* key :
         {"forward_s", "backward_s", "optimizer_s", "comm_exposed_s", "data_wait_s", "total_s"})
      EXPECT_TRUE(r.contains(key) && r[key].is_number()) << key << " in " << line;
    EXPECT_GT(r["total_s"].get<double>(), 0.0) << line;
    EXPECT_GE(r["total_s"].get<double>(), r["forward_s"].get<double>()) << line;
    seen.insert({r["step"].get<int>(), r["rank"].get<int>()});
  }
  std::set<std::pair<int, int>> want;
  for (int step = 1; step <= 3; ++step)
    for (int rank = 0; rank < 2; ++rank) want.insert({step, rank});
  EXPECT_EQ(seen, want) << run.out();
  EXPECT_EQ(step_json_lines(run.out()).size(), 3u) << "the global step lines stay as they were";

  const std::string dir2 = fresh_dir("json_no_ranks");
  const std::string cfg2 = write_config(dir2, 2, true);
  EngineChild plain =
      EngineChild::start({"run", "--nproc", "2", "--config", cfg2, "--out", dir2 + "/run", "--json"});
  ASSERT_EQ(plain.wait(60s).code, 0) << plain.err();
  EXPECT_THAT(plain.out(), Not(HasSubstr("rank_step")));
}

TEST(RunCli, AFailedCheckpointIsCataloguedAsFailedWithItsReason) {
  const std::string dir = fresh_dir("ckpt_fails");
  const std::string cfg = write_config(dir, 4, false);
  std::string text = testing_support::slurp(cfg);
  text.replace(text.find("max_steps = 4\n"), 14, "max_steps = 4\ncheckpoint_every = 2\n");
  std::ofstream(cfg) << text;
  fs::create_directories(dir + "/run");
  std::ofstream(dir + "/run/checkpoints") << "a file where the checkpoints folder goes\n";
  EngineChild run = EngineChild::start({"run", "--nproc", "2", "--config", cfg, "--out", dir + "/run"});
  EngineChild::Exit e = run.wait(60s);
  EXPECT_NE(e.code, 0) << run.err();
  expect_gone(run.worker_pids());
  EXPECT_THAT(run.err(), HasSubstr("checkpoint step 2 failed on rank 0: cannot create checkpoint directory"));

  std::string error;
  auto db = HistoryDb::open(dir + "/run/history.sqlite", {}, &error);
  ASSERT_TRUE(db) << error;
  std::vector<RunRow> runs;
  ASSERT_TRUE(db->list_runs(&runs)) << db->error();
  ASSERT_EQ(runs.size(), 1u);
  EXPECT_EQ(runs[0].status, RunStatus::failed);
  std::vector<CheckpointInfo> ckpts;
  ASSERT_TRUE(db->list_checkpoints(runs[0].id, &ckpts)) << db->error();
  ASSERT_EQ(ckpts.size(), 1u);
  EXPECT_EQ(ckpts[0].step, 2);
  EXPECT_EQ(ckpts[0].state, "failed");
  EXPECT_THAT(ckpts[0].message, HasSubstr("cannot create checkpoint directory"));
  EXPECT_EQ(ckpts[0].bytes, 0u);
  EXPECT_EQ(ckpts[0].manifest_xxh64, "");
  std::vector<EventRow> events;
  ASSERT_TRUE(db->read_events(runs[0].id, 0, 1000, &events)) << db->error();
  std::set<int32_t> failed_ranks;
  for (const EventRow& row : events) {
    EXPECT_NE(row.event.kind, "checkpoint") << "no checkpoint committed: " << row.event.message;
    if (row.event.kind != "checkpoint_failed") continue;
    failed_ranks.insert(row.event.rank);
    EXPECT_EQ(row.event.step, 2);
    EXPECT_THAT(row.event.message, HasSubstr("checkpoint of step 2 failed (rank "));
  }
  // Rank 0's for certain; rank 1 (told by rank 0 through the store) reports its own unless the launcher
  // stopped it first.
  EXPECT_TRUE(failed_ranks.count(0)) << "rank 0's failure is not among the events";
  EXPECT_TRUE(
      std::all_of(failed_ranks.begin(), failed_ranks.end(), [](int32_t r) { return r == 0 || r == 1; }));
}
#endif

TEST(RunCli, WorkerDyingInStartUpFailsTheGangNamingTheRank) {
  const std::string dir = fresh_dir("exit_at_start");
  const std::string cfg = write_config(dir, 4, true);
  EngineChild run = EngineChild::start(
      {"run", "--nproc", "2", "--config", cfg, "--out", dir + "/run", "--join-timeout", "3600"},
      {{"GANTRY_TEST_WORKER_FAULT", "1:exit_at_start"}});
  // A launcher that waited out the hour-long join timeout for a rank that already died would not end
  // within the wait; the message below says it was the death, not the timeout, that ended the gang.
  EngineChild::Exit e = run.wait(120s);
  EXPECT_FALSE(e.timed_out) << "the launcher waited for a rank that had already died";
  EXPECT_EQ(e.code, 1) << run.err();
  EXPECT_THAT(run.err(), Not(HasSubstr("did not join within")));
  const std::vector<pid_t> pids = run.worker_pids();
  ASSERT_EQ(pids.size(), 2u) << run.err();
  EXPECT_THAT(run.err(), HasSubstr("gantry-engine run: rank 1 (pid " + std::to_string(pids[1]) +
                                   ") exited with code 1 before joining"));
  expect_gone(pids);
}

TEST(RunCli, WorkerNeverJoiningFailsTheGangAtTheJoinTimeout) {
  const std::string dir = fresh_dir("hang_at_start");
  const std::string cfg = write_config(dir, 4, true);
  EngineChild run = EngineChild::start(
      {"run", "--nproc", "2", "--config", cfg, "--out", dir + "/run", "--join-timeout", "10"},
      {{"GANTRY_TEST_WORKER_FAULT", "1:hang_at_start"}});
  EngineChild::Exit e = run.wait(60s);
  EXPECT_EQ(e.code, 1) << run.err();
  // 10 s, not less: on a loaded 2-core machine a healthy rank can take seconds to start and say hello, and
  // must not be the one blamed. The wait's own limit (60 s) is what catches a launcher that never gives up.
  EXPECT_GE(e.seconds, 10.0);
  const std::vector<pid_t> pids = run.worker_pids();
  ASSERT_EQ(pids.size(), 2u) << run.err();
  EXPECT_THAT(run.err(), HasSubstr("rank 1 (pid " + std::to_string(pids[1]) + ") did not join within 10 s"));
  expect_gone(pids);
}

TEST(RunCli, WorkerKilledMidRunStopsTheOthersAndIsNamed) {
  const std::string dir = fresh_dir("killed");
  const std::string cfg = write_config(dir, 1000000, true);
  EngineChild run = EngineChild::start({"run", "--nproc", "2", "--config", cfg, "--out", dir + "/run"});
  ASSERT_TRUE(run.wait_for_stderr([](const std::string& err) { return step_lines(err) >= 3; }, 60s))
      << run.err();
  const std::vector<pid_t> pids = run.worker_pids();
  ASSERT_EQ(pids.size(), 2u) << run.err();
  ASSERT_EQ(::kill(pids[1], SIGKILL), 0);
  EngineChild::Exit e = run.wait(60s);
  EXPECT_EQ(e.code, 1) << run.err();
  EXPECT_THAT(run.err(),
              HasSubstr("rank 1 (pid " + std::to_string(pids[1]) + ") was killed by SIGKILL (signal 9)"));
  expect_gone(pids);
}

// The step guard in a gang: NaN gradients on one rank make the gang's norm NaN, so both ranks skip the same
// step together (no hang), report it once, and end with the same parameters, whichever rank had the NaN.
TEST(RunCli, NanGradientOnOneRankIsSkippedByEveryRank) {
  const std::string dir = fresh_dir("nan_grad");
  const std::string cfg = write_config(dir, 4, true);
  std::vector<std::string> hashes;
  for (const char* fault : {"1:nan_grad:2", "0:nan_grad:2"}) {
    const std::string out = dir + "/run_" + std::string(1, fault[0]);
    EngineChild run = EngineChild::start({"run", "--nproc", "2", "--config", cfg, "--out", out, "--json"},
                                         {{"GANTRY_TEST_WORKER_FAULT", fault}});
    EngineChild::Exit e = run.wait(60s);
    ASSERT_EQ(e.code, 0) << run.err();
    expect_gone(run.worker_pids());
    EXPECT_THAT(run.err(), HasSubstr("step      2 skipped: grad norm nan")) << run.err();
    EXPECT_THAT(run.out(), HasSubstr("{\"event\":\"step_skipped\",\"reason\":\"grad norm nan\",\"step\":2}"));
    EXPECT_EQ(step_json_lines(run.out()).size(), 4u)
        << "the skipped step still counts: its batch is consumed";
    // Each rank prints its parameters' fingerprint under this fault: the two ranks must agree.
    std::vector<std::string> mine;
    std::istringstream in(run.err());
    for (std::string line; std::getline(in, line);) {
      const size_t at = line.find("parameters xxh64 ");
      if (at == std::string::npos) continue;
      EXPECT_THAT(line, HasSubstr("after 1 skipped"));
      mine.push_back(line.substr(at + 17, 16));
    }
    ASSERT_EQ(mine.size(), 2u) << run.err();
    EXPECT_EQ(mine[0], mine[1]) << "the ranks' parameters differ: they did not skip together";
    hashes.push_back(mine[0]);
#ifdef GANTRY_HAVE_STORAGE
    std::string error;
    auto db = HistoryDb::open(out + "/history.sqlite", {}, &error);
    ASSERT_TRUE(db) << error;
    std::vector<RunRow> runs;
    ASSERT_TRUE(db->list_runs(&runs)) << db->error();
    ASSERT_EQ(runs.size(), 1u);
    std::vector<EventRow> events;
    ASSERT_TRUE(db->read_events(runs[0].id, 0, 1000, &events)) << db->error();
    int skipped = 0;
    for (const EventRow& row : events) {
      const EventRecord& ev = row.event;
      if (ev.kind != "step_skipped") continue;
      ++skipped;
      EXPECT_EQ(ev.step, 2);
      EXPECT_THAT(ev.message, HasSubstr("grad norm nan"));
    }
    EXPECT_EQ(skipped, 2) << "one event per rank";
#endif
  }
  EXPECT_EQ(hashes[0], hashes[1]) << "the NaN on rank 0 or on rank 1 must give the same run";
}

TEST(RunCli, WorkerExitingMidRunIsNamedWithItsExitCode) {
  const std::string dir = fresh_dir("exit_after_step");
  const std::string cfg = write_config(dir, 1000, true);
  EngineChild run = EngineChild::start({"run", "--nproc", "2", "--config", cfg, "--out", dir + "/run"},
                                       {{"GANTRY_TEST_WORKER_FAULT", "0:exit_after_step:3"}});
  EngineChild::Exit e = run.wait(60s);
  EXPECT_EQ(e.code, 1) << run.err();
  const std::vector<pid_t> pids = run.worker_pids();
  ASSERT_EQ(pids.size(), 2u) << run.err();
  EXPECT_THAT(run.err(), HasSubstr("rank 0 (pid " + std::to_string(pids[0]) + ") exited with code 3"));
  EXPECT_EQ(step_lines(run.err()), 3) << run.err();
  expect_gone(pids);
}

// What the launcher said about a run one of whose ranks was SIGSTOPped.
struct StoppedRank {
  std::string err;          // the launcher's stderr
  std::string who;          // the stopped rank as the launcher names it: "rank 2 (pid 1234)"
  std::vector<pid_t> pids;  // every rank's, for expect_gone
};

// A run of 4 ranks (with `flags`) whose rank `rank` is SIGSTOPped once 3 steps are printed: the launcher
// must end the run itself, with code 1, within `limit`. The stopped rank is let go again afterwards, in case
// the launcher left it (it must not), so that expect_gone sees it.
void run_and_stop_a_rank(const std::string& name, const std::vector<std::string>& flags, int rank,
                         std::chrono::seconds limit, StoppedRank* out) {
  const std::string dir = fresh_dir(name);
  const std::string cfg = write_config(dir, 1000000, true);
  std::vector<std::string> args = {"run", "--nproc", "4", "--config", cfg, "--out", dir + "/run"};
  args.insert(args.end(), flags.begin(), flags.end());
  EngineChild run = EngineChild::start(args);
  ASSERT_TRUE(run.wait_for_stderr([](const std::string& err) { return step_lines(err) >= 3; }, 120s))
      << run.err();
  out->pids = run.worker_pids();
  ASSERT_EQ(out->pids.size(), 4u) << run.err();
  const pid_t stopped = out->pids[static_cast<size_t>(rank)];
  ASSERT_EQ(::kill(stopped, SIGSTOP), 0);
  EngineChild::Exit e = run.wait(limit);
  ::kill(stopped, SIGCONT);
  out->err = run.err();
  out->who = "rank " + std::to_string(rank) + " (pid " + std::to_string(stopped) + ")";
  EXPECT_FALSE(e.timed_out) << out->err;
  EXPECT_EQ(e.code, 1) << out->err;
}

// A SIGSTOPped worker used to be found after a fixed 120 s, and the failure was blamed on a healthy peer
// ("rank 1 ... timeout sending to rank 2"). The timeout is a flag now, and the launcher names the rank
// that stopped answering, with the peer that gave up on it as the witness.
TEST(RunCli, StoppedWorkerIsNamedAsTheRankThatStoppedAnswering) {
  StoppedRank r;
  ASSERT_NO_FATAL_FAILURE(run_and_stop_a_rank("sigstop", {"--collective-timeout", "3"}, 2, 120s, &r));
  EXPECT_THAT(r.err, HasSubstr("gantry-engine run: " + r.who + " stopped answering: its process is stopped"))
      << r.err;
  EXPECT_THAT(r.err, HasSubstr("after the collective timeout of 3 s")) << r.err;
  for (int peer : {0, 1, 3}) {
    EXPECT_THAT(r.err, Not(HasSubstr("gantry-engine run: rank " + std::to_string(peer))))
        << "a peer that merely timed out waiting is not the failure\n"
        << r.err;
  }
  expect_gone(r.pids);
}

// The launcher's hang timeout finds a SIGSTOPped worker by its silence, long before the collective
// timeout (the config's 120 s): the stopped rank is named as hung, with where its last heartbeat was.
TEST(RunCli, StoppedWorkerIsFoundByTheHangTimeout) {
  StoppedRank r;
  // 100 s, under the 120 s collective timeout: only the hang timeout fits.
  ASSERT_NO_FATAL_FAILURE(run_and_stop_a_rank("hang_timeout", {"--hang-timeout", "3"}, 1, 100s, &r));
  EXPECT_THAT(r.err, HasSubstr("gantry-engine run: " + r.who + " hung: no heartbeat for")) << r.err;
  EXPECT_THAT(r.err, HasSubstr("(hang timeout 3 s)")) << r.err;
  EXPECT_THAT(r.err, HasSubstr("stopped (state T")) << r.err;
  EXPECT_THAT(r.err, HasSubstr("its last heartbeat was at step ")) << r.err;
  expect_gone(r.pids);
}

// Data that cannot be read is bad input (exit 2) in a gang too: every rank says so before its first step.
TEST(RunCli, MissingShardsExitTwo) {
  const std::string dir = fresh_dir("missing_shards");
  const std::string cfg = write_config(dir, 4, true);
  fs::remove_all(dir + "/data");
  EngineChild run = EngineChild::start({"run", "--nproc", "2", "--config", cfg, "--out", dir + "/run"});
  EngineChild::Exit e = run.wait(60s);
  EXPECT_EQ(e.code, 2) << run.err();
  EXPECT_THAT(run.err(), HasSubstr(dir + "/data"));
  expect_gone(run.worker_pids());
}

TEST(RunCli, SigintStopsEveryWorkerAndExits130) {
  const std::string dir = fresh_dir("sigint");
  const std::string cfg = write_config(dir, 1000000, true);
  EngineChild run = EngineChild::start({"run", "--nproc", "2", "--config", cfg, "--out", dir + "/run"});
  ASSERT_TRUE(run.wait_for_stderr([](const std::string& err) { return step_lines(err) >= 3; }, 60s))
      << run.err();
  const std::vector<pid_t> pids = run.worker_pids();
  ASSERT_EQ(pids.size(), 2u) << run.err();
  ASSERT_EQ(::kill(run.pid(), SIGINT), 0);
  EngineChild::Exit e = run.wait(60s);
  EXPECT_EQ(e.code, 130) << run.err();
  EXPECT_THAT(run.err(), HasSubstr("stopped by a signal at step"));
  EXPECT_THAT(run.err(), Not(HasSubstr("was killed")));  // every rank stopped within the grace period
  expect_gone(pids);
  // They stopped together at a step boundary, after a checkpoint.
  EXPECT_FALSE(fs::is_empty(dir + "/run/checkpoints")) << run.err();
}

// Even a launcher that cannot clean up (SIGKILL) leaves no worker behind: they die with it
// (PR_SET_PDEATHSIG). The test makes itself the workers' subreaper so that it can reap them, proving
// that they ended rather than merely became someone else's zombies.
TEST(RunCli, WorkersDieWithASigkilledLauncher) {
  const std::string dir = fresh_dir("launcher_killed");
  const std::string cfg = write_config(dir, 1000000, true);
  ASSERT_EQ(::prctl(PR_SET_CHILD_SUBREAPER, 1), 0);
  EngineChild run = EngineChild::start({"run", "--nproc", "2", "--config", cfg, "--out", dir + "/run"});
  ASSERT_TRUE(run.wait_for_stderr([](const std::string& err) { return step_lines(err) >= 2; }, 60s))
      << run.err();
  const std::vector<pid_t> pids = run.worker_pids();
  ASSERT_EQ(pids.size(), 2u) << run.err();
  ASSERT_EQ(::kill(run.pid(), SIGKILL), 0);
  run.wait(10s);
  for (size_t r = 0; r < pids.size(); ++r) {
    int status = 0;
    pid_t got = 0;
    const auto deadline = std::chrono::steady_clock::now() + 10s;
    while ((got = ::waitpid(pids[r], &status, WNOHANG)) == 0 && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(10ms);
    }
    if (got == 0) ::kill(pids[r], SIGKILL);  // do not leave it to the next test
    ASSERT_EQ(got, pids[r]) << "rank " << r << " outlived its launcher";
    EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << "rank " << r;
  }
  ::prctl(PR_SET_CHILD_SUBREAPER, 0);
}

TEST(RunCli, BadInputExits2) {
  const std::string dir = fresh_dir("bad_input");
  const std::string cfg = write_config(dir, 4, true);
  for (const std::string& args :
       {"run --nproc 2 --config " + cfg + " --zero 4", "run --nproc 0 --config " + cfg,
        "run --nproc 2 --config " + dir + "/missing.toml"}) {
    testing_support::Outcome r = testing_support::run_engine(args);
    EXPECT_EQ(r.code, 2) << args << "\n" << r.err;
  }
  // A worker started by hand with no launcher variables says what it needs.
  testing_support::Outcome w = testing_support::run_engine("worker --config " + cfg);
  EXPECT_EQ(w.code, 2);
  EXPECT_THAT(w.err, HasSubstr("RANK and WORLD_SIZE are not set"));
  // The batches a coordinator's rollback passes over: FIRST:COUNT pairs, named when malformed.
  for (const char* bad : {"6", "6:0", "x:1", "6:2,7", "-1:2"}) {
    w = testing_support::run_engine("worker --config " + cfg + " --skip-batches " + bad);
    EXPECT_EQ(w.code, 2) << bad;
    EXPECT_THAT(w.err, HasSubstr("--skip-batches: '")) << bad;
    EXPECT_THAT(w.err, HasSubstr("is not FIRST:COUNT")) << bad;
  }
}

// Tensor parallelism (issue 17) through the launcher: layouts that cannot split are refused before any
// worker starts, naming the numbers (a worker count that tp x pp does not divide first); tp 2 over two
// workers trains.
TEST(RunCli, TensorParallelLayoutsAreCheckedAndTp2Trains) {
  const std::string dir = fresh_dir("tp");
  const std::string cfg = write_config(dir, 3, true);  // 2 heads
  testing_support::Outcome r = testing_support::run_engine("run --nproc 4 --tp 3 --config " + cfg);
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_THAT(r.err, HasSubstr("--nproc 4 is not a multiple of tp x pp = 3 x 1 = 3"));
  // Fewer workers than tp: the launcher named "dp 0" (the quotient rounded down) instead of the cause.
  r = testing_support::run_engine("run --nproc 1 --tp 2 --config " + cfg);
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_THAT(r.err, HasSubstr("--nproc 1 is not a multiple of tp x pp = 2 x 1 = 2"));
  r = testing_support::run_engine("run --nproc 4 --tp 4 --config " + cfg);
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_THAT(r.err, HasSubstr("tp 4 does not divide model.n_head 2"));
  // tp x pp past --nproc's bound: the launcher asked for --nproc as a multiple of 16777216, which no
  // --nproc can be.
  r = testing_support::run_engine("run --nproc 4096 --tp 4096 --pp 4096 --config " + cfg);
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_THAT(r.err, HasSubstr("tp x pp = 4096 x 4096 = 16777216 ranks is more than --nproc can be (at most "
                               "4096): lower --tp or --pp"));

  EngineChild run =
      EngineChild::start({"run", "--nproc", "2", "--tp", "2", "--config", cfg, "--out", dir + "/run"});
  EngineChild::Exit e = run.wait(60s);
  ASSERT_EQ(e.code, 0) << run.err();
  EXPECT_THAT(run.err(), HasSubstr("dp 1 x tp 2 x pp 1"));
  EXPECT_THAT(run.err(), HasSubstr("done: step 3"));
}

// Recovery at tp > 1 through the engine's own path (issue 17): a tp 2 run killed by SIGKILL mid-run
// resumes from its newest committed checkpoint at one process and at tp 4 (--resume DIR), and at tp 2
// again (--resume latest, as the same command would be rerun); each starts at the checkpoint's step and the
// three end on the same loss within 1e-4 relative (tp is not bitwise against one process: the row-parallel
// sums are added in another order).
TEST(RunCli, TensorParallelRunKilledMidRunResumesAtAnyTp) {
  const std::string dir = fresh_dir("tp_killed");
  testing_support::Outcome d = testing_support::run_engine(
      "data synthetic --out " + dir + "/data --vocab 32 --train-tokens 8192 --val-tokens 1024");
  ASSERT_EQ(d.code, 0) << d.err;
  const std::string cfg = dir + "/tp.toml";
  std::ofstream(cfg) << "[model]\nn_layer = 1\nn_head = 4\nn_embd = 16\nvocab_size = 32\nseq_len = 8\n"
                     << "[train]\nglobal_batch = 4\nmicro_batch = 2\nthreads = 1\nmax_steps = 1000000\n"
                     << "val_every = 0\ncheckpoint_every = 2\nkeep_checkpoints = 5\n"
                     << "[data]\nkind = \"shards\"\ndir = \"" << dir << "/data\"\n";
  const std::string out = dir + "/run";
  EngineChild run = EngineChild::start({"run", "--nproc", "2", "--tp", "2", "--config", cfg, "--out", out});
  ASSERT_TRUE(run.wait_for_stderr(
      [](const std::string& err) { return err.find("checkpoint step 4 ->") != std::string::npos; }, 60s))
      << run.err();
  const std::vector<pid_t> pids = run.worker_pids();
  ASSERT_EQ(pids.size(), 2u) << run.err();
  ASSERT_EQ(::kill(pids[1], SIGKILL), 0);
  EXPECT_EQ(run.wait(60s).code, 1) << run.err();
  expect_gone(pids);

  // The newest committed checkpoint the kill left.
  std::string latest;
  for (const fs::directory_entry& e : fs::directory_iterator(out + "/checkpoints")) {
    const std::string name = e.path().filename().string();
    if (name.rfind("step_", 0) == 0 && fs::exists(e.path() / "manifest.json") && e.path().string() > latest)
      latest = e.path().string();
  }
  ASSERT_FALSE(latest.empty());
  const long long step = std::stoll(fs::path(latest).filename().string().substr(5));
  ASSERT_GE(step, 4);
  const std::string until = std::to_string(step + 4), from = "steps " + std::to_string(step) + "..";
  auto last_loss = [](const std::string& stdout_text) {
    const std::vector<nlohmann::json> steps = step_json_lines(stdout_text);
    return steps.empty() ? -1.0 : steps.back().at("loss").get<double>();
  };
  const std::vector<std::pair<std::string, std::string>> resumes = {
      {"--nproc 1 --tp 1", "--resume " + latest + " --out " + dir + "/tp1"},
      {"--nproc 4 --tp 4", "--resume " + latest + " --out " + dir + "/tp4"},
      {"--nproc 2 --tp 2", "--resume latest --out " + out}};
  std::vector<double> losses;
  for (const auto& [layout, where] : resumes) {
    testing_support::Outcome r = testing_support::run_engine("run " + layout + " --json --config " + cfg +
                                                             " --max-steps " + until + " " + where);
    ASSERT_EQ(r.code, 0) << layout << "\n" << r.err;
    EXPECT_THAT(r.err, HasSubstr(from)) << layout;
    EXPECT_EQ(step_json_lines(r.out).size(), 4u) << layout << "\n" << r.out;
    losses.push_back(last_loss(r.out));
  }
  ASSERT_GT(losses[0], 0);
  for (size_t i = 1; i < losses.size(); ++i) {
    EXPECT_NEAR(losses[i], losses[0], 1e-4 * losses[0]) << resumes[i].first << " against one process";
  }
}

TEST(RunCli, PipelineLayoutsAreCheckedAndPp2Trains) {
  const std::string dir = fresh_dir("pp");
  const std::string one_layer = write_config(dir, 3, true);
  testing_support::Outcome r = testing_support::run_engine("run --nproc 2 --pp 2 --config " + one_layer);
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_THAT(r.err, HasSubstr("pp 2 x vp 1 = 2 stages but model.n_layer is 1"));
  r = testing_support::run_engine("run --nproc 3 --pp 2 --config " + one_layer);
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_THAT(r.err, HasSubstr("--nproc 3 is not a multiple of tp x pp = 1 x 2 = 2"));

  std::ifstream in(one_layer);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  text.replace(text.find("n_layer = 1"), 11, "n_layer = 2");
  const std::string cfg = dir + "/two_layers.toml";
  std::ofstream(cfg) << text;
  r = testing_support::run_engine("run --nproc 2 --pp 2 --vp 2 --config " + cfg);
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_THAT(r.err, HasSubstr("pp 2 x vp 2 = 4 stages but model.n_layer is 2"));
  // --vp reaches the workers: four layers interleaved over two ranks (two chunks each) train.
  std::string four = text;
  four.replace(four.find("n_layer = 2"), 11, "n_layer = 4");
  four.replace(four.find("[train]\n"), 8, "[train]\npp_schedule = \"interleaved\"\n");
  const std::string cfg4 = dir + "/four_layers.toml";
  std::ofstream(cfg4) << four;
  r = testing_support::run_engine("run --nproc 2 --pp 2 --config " + cfg4);
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_THAT(r.err, HasSubstr("virtual stages run only under the interleaved schedule, and it needs them"));
  EngineChild interleaved = EngineChild::start(
      {"run", "--nproc", "2", "--pp", "2", "--vp", "2", "--config", cfg4, "--out", dir + "/run_vp2"});
  EngineChild::Exit ie = interleaved.wait(60s);
  ASSERT_EQ(ie.code, 0) << interleaved.err();
  EXPECT_THAT(interleaved.err(), HasSubstr("pipeline: interleaved, vp 2"));
  EXPECT_THAT(interleaved.err(), HasSubstr("rank 1 step 3: pipeline bubble"));

  EngineChild run =
      EngineChild::start({"run", "--nproc", "2", "--pp", "2", "--config", cfg, "--out", dir + "/run"});
  EngineChild::Exit e = run.wait(60s);
  ASSERT_EQ(e.code, 0) << run.err();
  EXPECT_THAT(run.err(), HasSubstr("dp 1 x tp 1 x pp 2"));
  EXPECT_THAT(run.err(), HasSubstr("rank 1 step 3: pipeline bubble"));
  EXPECT_THAT(run.err(), HasSubstr("; messages placed by units"));  // the CPU stage's, every step
  EXPECT_THAT(run.err(), HasSubstr("done: step 3"));
}

// tp x pp x dp (3D) through the launcher and the worker runtime's communicators (one per group of each
// axis, ParallelDims::comm_prefix): 8 ranks train; so does tp 2 x pp 2 with sequence parallelism inside the
// stages (refused before it existed), its start-up line saying so.
TEST(RunCli, ThreeDimensionalLayoutAndSequenceParallelUnderPpTrain) {
  const std::string dir = fresh_dir("tp_pp_dp");
  std::ifstream in(write_config(dir, 3, true));
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  text.replace(text.find("n_layer = 1"), 11, "n_layer = 2");
  text.replace(text.find("micro_batch = 2"), 15, "micro_batch = 1");  // 2 micro-batches per dp rank: 1F1B
  const std::string cfg = dir + "/3d.toml";
  std::ofstream(cfg) << text;
  std::string sp_text = text;
  sp_text.replace(sp_text.find("[train]\n"), 8, "[train]\nsequence_parallel = true\n");
  const std::string sp_cfg = dir + "/sp.toml";
  std::ofstream(sp_cfg) << sp_text;
  EngineChild sp = EngineChild::start(
      {"run", "--nproc", "4", "--tp", "2", "--pp", "2", "--config", sp_cfg, "--out", dir + "/run_sp"});
  EngineChild::Exit se = sp.wait(120s);
  ASSERT_EQ(se.code, 0) << sp.err();
  EXPECT_THAT(sp.err(), HasSubstr("sequence parallel"));
  EXPECT_THAT(sp.err(), HasSubstr("rank 3 step 3: pipeline bubble"));
  EXPECT_THAT(sp.err(), HasSubstr("done: step 3"));

  EngineChild run = EngineChild::start({"run", "--nproc", "8", "--tp", "2", "--pp", "2", "--zero", "1",
                                        "--config", cfg, "--out", dir + "/run"});
  EngineChild::Exit e = run.wait(120s);
  ASSERT_EQ(e.code, 0) << run.err();
  EXPECT_THAT(run.err(), HasSubstr("dp 2 x tp 2 x pp 2"));
  EXPECT_THAT(run.err(), HasSubstr("rank 7 step 3: pipeline bubble"));
  EXPECT_THAT(run.err(), HasSubstr("done: step 3"));
}

int free_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a = {};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    ::close(fd);
    return 0;
  }
  ::close(fd);
  return ntohs(a.sin_port);
}

// As torchrun would start them: one `worker` per rank with RANK/WORLD_SIZE/LOCAL_* and a rendezvous
// address; rank 0 serves the store over TCP and prints the steps.
TEST(RunCli, WorkersStartedByAnExternalLauncherMeetOverTcp) {
  const std::string dir = fresh_dir("external");
  const std::string cfg = write_config(dir, 3, true);
  const int port = free_port();
  ASSERT_GT(port, 0);
  std::vector<EngineChild> ranks;
  for (int r = 1; r >= 0; --r) {  // rank 1 first: it must wait for rank 0's store to appear
    ranks.push_back(
        EngineChild::start({"worker", "--config", cfg, "--out", dir + "/run", "--rendezvous",
                            "127.0.0.1:" + std::to_string(port), "--join-timeout", "30", "--json"},
                           {{"RANK", std::to_string(r)},
                            {"WORLD_SIZE", "2"},
                            {"LOCAL_RANK", std::to_string(r)},
                            {"LOCAL_WORLD_SIZE", "2"}}));
    if (r == 1) std::this_thread::sleep_for(200ms);
  }
  EngineChild::Exit e1 = ranks[0].wait(60s), e0 = ranks[1].wait(60s);
  EXPECT_EQ(e0.code, 0) << ranks[1].err();
  EXPECT_EQ(e1.code, 0) << ranks[0].err();
  EXPECT_EQ(step_lines(ranks[1].err()), 3) << ranks[1].err();
  EXPECT_EQ(step_json_lines(ranks[1].out()).size(), 3u);
  EXPECT_EQ(step_lines(ranks[0].err()), 0) << "only rank 0 prints";
  EXPECT_THAT(ranks[1].err(), HasSubstr("done: step 3"));
}

}  // namespace
}  // namespace gantry
