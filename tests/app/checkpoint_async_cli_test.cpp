// Asynchronous checkpoints in a gang of real processes (`run --nproc 2`, CPU, Gloo): a rank killed with
// SIGKILL at each stage of a write (before its copy ends, during its file writes, before and after rank
// 0's manifest rename) leaves the checkpoint before it valid and the one `--resume latest` takes (or,
// after the rename, the new one, whole); the resumed run continues exactly as the uninterrupted one. An
// async checkpoint has the bytes of a sync one, and a request while one is in flight waits, saying so.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>  // the --json lines
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "tests/app/engine_child.h"
#include "tests/app/engine_process.h"
#include "tests/scratch_dir.h"

namespace gantry {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using ::testing::HasSubstr;
using testing_support::EngineChild;

std::string fresh_dir(const std::string& name) {
  return testing_support::scratch_dir(name).string();
}

std::string file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

// Eight steps, checkpoints at 2, 4 and 6 (asynchronous unless async is false) and 8 (the end), on shards
// written beforehand.
std::string write_config(const std::string& dir, bool async) {
  testing_support::Outcome d = testing_support::run_engine(
      "data synthetic --out " + dir + "/data --vocab 32 --train-tokens 8192 --val-tokens 1024");
  EXPECT_EQ(d.code, 0) << d.err;
  const std::string path = dir + "/small.toml";
  std::ofstream(path) << "[model]\nn_layer = 1\nn_head = 2\nn_embd = 16\nvocab_size = 32\nseq_len = 8\n"
                      << "[train]\nglobal_batch = 4\nmicro_batch = 2\nthreads = 1\nmax_steps = 8\n"
                      << "val_every = 0\ncheckpoint_every = 2\nkeep_checkpoints = 10\ncheckpoint_async = "
                      << (async ? "true" : "false") << "\n"
                      << "[data]\nkind = \"shards\"\ndir = \"" << dir << "/data\"\n";
  return path;
}

// The losses of the --json step lines, by step.
std::vector<std::pair<int64_t, double>> losses(const std::string& out) {
  std::vector<std::pair<int64_t, double>> v;
  std::istringstream in(out);
  for (std::string line; std::getline(in, line);) {
    nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_object() && j.contains("step") && j.contains("loss") && !j.contains("event"))
      v.push_back({j["step"].get<int64_t>(), j["loss"].get<double>()});
  }
  return v;
}

std::vector<nlohmann::json> checkpoint_lines(const std::string& out) {
  std::vector<nlohmann::json> v;
  std::istringstream in(out);
  for (std::string line; std::getline(in, line);) {
    nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_object() && j.value("event", "") == "checkpoint") v.push_back(j);
  }
  return v;
}

// The workers `run` reported ("rank R pid P") have all exited: a killed rank's peer is not left behind.
void expect_no_worker_left(const std::string& err) {
  static const std::regex line(R"(^rank (\d+) pid (\d+)$)", std::regex::multiline);
  int seen = 0;
  for (auto it = std::sregex_iterator(err.begin(), err.end(), line); it != std::sregex_iterator(); ++it) {
    const pid_t pid = static_cast<pid_t>(std::stol((*it)[2]));
    errno = 0;
    EXPECT_TRUE(::kill(pid, 0) == -1 && errno == ESRCH) << "rank " << (*it)[1] << " (pid " << pid << ") left";
    ++seen;
  }
  EXPECT_EQ(seen, 2) << err;
}

EngineChild::Exit run_gang(const std::string& cfg, const std::string& out, const std::string& fault,
                           std::string* stdout_text, std::string* stderr_text,
                           const std::string& resume = "") {
  std::vector<std::string> args = {
      "run", "--nproc", "2", "--config", cfg, "--out", out, "--json", "--collective-timeout", "10"};
  if (!resume.empty()) {
    args.push_back("--resume");
    args.push_back(resume);
  }
  std::vector<std::pair<std::string, std::string>> env;
  if (!fault.empty()) env.push_back({"GANTRY_TEST_WORKER_FAULT", fault});
  EngineChild run = EngineChild::start(args, env);
  EngineChild::Exit e = run.wait(120s);
  *stdout_text = run.out();
  *stderr_text = run.err();
  return e;
}

// The uninterrupted run every interrupted one must end up equal to (once per process).
struct Reference {
  std::string dir, cfg, out, err;
  EngineChild::Exit exit;
};
const Reference& reference() {
  static Reference r = [] {
    Reference ref;
    ref.dir = fresh_dir("async_reference");
    ref.cfg = write_config(ref.dir, true);
    ref.exit = run_gang(ref.cfg, ref.dir + "/run", "", &ref.out, &ref.err);
    return ref;
  }();
  return r;
}

struct KillCase {
  const char* fault;
  int64_t resumed_from;  // the checkpoint --resume latest must take afterwards
};

void kill_and_resume(const KillCase& k) {
  const Reference& ref = reference();
  ASSERT_EQ(ref.exit.code, 0) << ref.err;
  const std::string dir = fresh_dir("async_kill");
  const std::string cfg = write_config(dir, true);
  std::string out, err;
  EngineChild::Exit e = run_gang(cfg, dir + "/run", k.fault, &out, &err);
  ASSERT_FALSE(e.timed_out) << err;
  EXPECT_NE(e.code, 0) << err;
  EXPECT_THAT(err, HasSubstr("kill -9 at stage")) << "the fault never fired";
  expect_no_worker_left(err);

  // What is on disk: the checkpoint --resume latest takes, whole, and nothing newer committed.
  const std::string root = dir + "/run/checkpoints";
  std::vector<std::string> committed;
  for (const fs::directory_entry& d : fs::directory_iterator(root)) {
    const std::string name = d.path().filename().string();
    if (name.rfind("step_", 0) == 0 && fs::exists(d.path() / "manifest.json")) committed.push_back(name);
  }
  std::sort(committed.begin(), committed.end());
  ASSERT_FALSE(committed.empty()) << err;
  char want[32];
  std::snprintf(want, sizeof want, "step_%08lld", static_cast<long long>(k.resumed_from));
  EXPECT_EQ(committed.back(), want) << err;
  // Its shard is the uninterrupted run's checkpoint of that step, byte for byte.
  EXPECT_EQ(file_bytes(root + "/" + want + "/shard_r00000.bin"),
            file_bytes(ref.dir + "/run/checkpoints/" + want + "/shard_r00000.bin"));

  // Resumed, the run ends as the uninterrupted one: the same losses after the checkpoint, the same final
  // parameters and AdamW state.
  std::string rout, rerr;
  EngineChild::Exit r = run_gang(cfg, dir + "/run", "", &rout, &rerr, "latest");
  ASSERT_EQ(r.code, 0) << rerr;
  if (k.resumed_from == 2 && k.fault[0] == '0' && std::string(k.fault).find(":copy:") == std::string::npos) {
    // Rank 0, killed, had made step 4's staging directory: latest passes over it, saying why. (When
    // another rank dies, rank 0's writer gives up and removes it: nothing is left to pass over.)
    EXPECT_THAT(rerr, HasSubstr("a write of step 4 that never finished"));
    EXPECT_THAT(rerr, HasSubstr("resuming from " + root + "/" + want));
  }
  std::vector<std::pair<int64_t, double>> got = losses(rout), all = losses(ref.out);
  ASSERT_FALSE(got.empty()) << rout;
  EXPECT_EQ(got.front().first, k.resumed_from + 1) << "resumed from another step";
  std::vector<std::pair<int64_t, double>> tail(all.begin() + k.resumed_from, all.end());
  EXPECT_EQ(got, tail);
  EXPECT_EQ(file_bytes(root + "/step_00000008/shard_r00000.bin"),
            file_bytes(ref.dir + "/run/checkpoints/step_00000008/shard_r00000.bin"));
}

TEST(CheckpointAsyncCli, KilledBeforeItsCopyEndsTheCheckpointBeforeIsUsed) {
  kill_and_resume({"1:kill_in_checkpoint:copy:4", 2});
}

TEST(CheckpointAsyncCli, KilledDuringItsFileWritesTheCheckpointBeforeIsUsed) {
  kill_and_resume({"0:kill_in_checkpoint:write:4", 2});
}

// A rank other than the committer: rank 0's writer is left waiting for a report that never comes.
TEST(CheckpointAsyncCli, ANonCommittingRankKilledDuringItsFileWritesTheCheckpointBeforeIsUsed) {
  kill_and_resume({"1:kill_in_checkpoint:write:4", 2});
}

TEST(CheckpointAsyncCli, KilledBeforeTheManifestRenameTheCheckpointBeforeIsUsed) {
  kill_and_resume({"0:kill_in_checkpoint:before_commit:4", 2});
}

TEST(CheckpointAsyncCli, KilledAfterTheManifestRenameTheNewCheckpointIsWholeAndUsed) {
  kill_and_resume({"0:kill_in_checkpoint:after_commit:4", 4});
}

TEST(CheckpointAsyncCli, AsyncCheckpointsHaveTheBytesOfSyncOnes) {
  const Reference& ref = reference();
  ASSERT_EQ(ref.exit.code, 0) << ref.err;
  const std::string dir = fresh_dir("sync_reference");
  const std::string cfg = write_config(dir, false);
  std::string out, err;
  ASSERT_EQ(run_gang(cfg, dir + "/run", "", &out, &err).code, 0) << err;
  for (const char* step : {"step_00000002", "step_00000004", "step_00000006", "step_00000008"}) {
    for (const char* shard : {"shard_r00000.bin", "shard_r00001.bin"}) {
      const std::string a = ref.dir + "/run/checkpoints/" + step + "/" + shard;
      ASSERT_TRUE(fs::exists(a)) << a;
      EXPECT_EQ(file_bytes(a), file_bytes(dir + "/run/checkpoints/" + step + "/" + shard)) << a;
    }
  }
  EXPECT_EQ(losses(out), losses(ref.out));
  // Each reports its kind and what it cost; the async ones (2, 4, 6) stalled less than they took.
  std::vector<nlohmann::json> a = checkpoint_lines(ref.out), s = checkpoint_lines(out);
  ASSERT_EQ(a.size(), 4u) << ref.out;
  ASSERT_EQ(s.size(), 4u) << out;
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_TRUE(a[i]["async"].get<bool>()) << a[i];
    EXPECT_FALSE(s[i]["async"].get<bool>()) << s[i];
    EXPECT_TRUE(a[i].contains("stall_s") && a[i].contains("write_s") && a[i].contains("waited_s")) << a[i];
  }
  EXPECT_THAT(ref.err, HasSubstr("async: stall "));
  EXPECT_THAT(err, HasSubstr("sync: stall "));
}

// One process (`train`) knows how long its async copy into host memory took by itself (copy_s: the copy's
// bandwidth is its bytes over it); a sync write has no such copy, and `run`'s launcher does not carry it:
// both say unknown (null), never 0.
TEST(CheckpointAsyncCli, OneProcessReportsTheCopysOwnTimeAndOthersSayItIsUnknown) {
  const std::string dir = fresh_dir("copy_seconds");
  for (const bool async : {true, false}) {
    const std::string cfg = write_config(dir, async);
    testing_support::Outcome t = testing_support::run_engine("train --config " + cfg + " --out " + dir +
                                                             (async ? "/async" : "/sync") + " --json");
    ASSERT_EQ(t.code, 0) << t.err;
    const std::vector<nlohmann::json> ck = checkpoint_lines(t.out);
    ASSERT_EQ(ck.size(), 4u) << t.out;
    for (const nlohmann::json& c : ck) {
      ASSERT_TRUE(c.contains("copy_s")) << c;
      if (async && c["async"].get<bool>()) {
        ASSERT_TRUE(c["copy_s"].is_number()) << c;
        EXPECT_GE(c["copy_s"].get<double>(), 0.0) << c;
        EXPECT_LE(c["copy_s"].get<double>(), c["stall_s"].get<double>() + c["write_s"].get<double>()) << c;
      } else {
        EXPECT_TRUE(c["copy_s"].is_null()) << c;
      }
    }
  }
  const Reference& ref = reference();  // two ranks under `run`
  for (const nlohmann::json& c : checkpoint_lines(ref.out)) EXPECT_TRUE(c["copy_s"].is_null()) << c;
}

// Rank 0's writer of step 2 holds until the loop asks for step 4's checkpoint, which must wait for it: the
// event of step 4 says it waited and how long, step 2's that it did not.
TEST(CheckpointAsyncCli, ARequestWhileOneIsInFlightWaitsAndTheEventSaysSo) {
  const std::string dir = fresh_dir("async_hold");
  const std::string cfg = write_config(dir, true);
  std::string out, err;
  EngineChild::Exit e = run_gang(cfg, dir + "/run", "0:hold_checkpoint:2", &out, &err);
  ASSERT_EQ(e.code, 0) << err;
  std::vector<nlohmann::json> ck = checkpoint_lines(out);
  ASSERT_EQ(ck.size(), 4u) << out;
  EXPECT_EQ(ck[0]["step"], 2);
  EXPECT_EQ(ck[0]["waited_s"].get<double>(), 0.0);
  EXPECT_EQ(ck[1]["step"], 4);
  EXPECT_GT(ck[1]["waited_s"].get<double>(), 0.0) << ck[1];
  EXPECT_GE(ck[1]["stall_s"].get<double>(), ck[1]["waited_s"].get<double>()) << ck[1];
  EXPECT_THAT(err, HasSubstr("for the checkpoint before"));
  // The checkpoint that waited is whole.
  EXPECT_TRUE(fs::exists(dir + "/run/checkpoints/step_00000004/manifest.json"));
}

}  // namespace
}  // namespace gantry
