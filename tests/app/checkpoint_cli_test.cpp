// Checkpoints and their data as an operator meets them through `train` and `run --nproc 2`: a damaged
// checkpoint is rewritten, not kept, when training passes its step again; a resume on other data of the
// same names and sizes is refused; `--resume latest` says what it passed over; a damaged checkpoint is
// refused naming the earlier one.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/types.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>  // reads the manifest
#include <regex>
#include <set>
#include <string>
#include <vector>

#include "tests/app/engine_process.h"
#include "tests/scratch_dir.h"

namespace gantry {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using ::testing::Not;
using testing_support::Outcome;

std::string fresh_dir() {
  return testing_support::scratch_dir("ckpt").string();
}

// Six steps with checkpoints at 3 and 6, on the synthetic corpus the run writes into <out>/data.
std::string write_config(const std::string& dir) {
  const std::string path = dir + "/small.toml";
  std::ofstream(path)
      << "[model]\nn_layer = 1\nn_head = 2\nn_embd = 16\nvocab_size = 32\nseq_len = 8\n"
         "[train]\nglobal_batch = 4\nmicro_batch = 2\nthreads = 1\nmax_steps = 6\nval_every = 0\n"
         "checkpoint_every = 3\n"
         "[data]\nsynthetic_train_tokens = 8192\nsynthetic_val_tokens = 1024\n";
  return path;
}

// `train` in this process's sight, or `run --nproc 2` when `ranks` is 2.
Outcome engine(int ranks, const std::string& cfg, const std::string& out, const std::string& more = "") {
  if (ranks == 1) return testing_support::run_engine("train --config " + cfg + " --out " + out + " " + more);
  return testing_support::run_engine("run --nproc 2 --config " + cfg + " --out " + out + " " + more);
}

void flip_byte(const std::string& path, uint64_t at) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(static_cast<std::streamoff>(at));
  const char c = static_cast<char>(f.get() ^ 0x5a);
  f.seekp(static_cast<std::streamoff>(at));
  f.put(c);
}

std::vector<std::string> names_in(const std::string& dir) {
  std::vector<std::string> out;
  for (const fs::directory_entry& e : fs::directory_iterator(dir))
    out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

// The workers `run` reported ("rank R pid P") have all exited.
void expect_no_worker_left(const std::string& err) {
  static const std::regex line(R"(^rank (\d+) pid (\d+)$)", std::regex::multiline);
  for (auto it = std::sregex_iterator(err.begin(), err.end(), line); it != std::sregex_iterator(); ++it) {
    const pid_t pid = static_cast<pid_t>(std::stol((*it)[2]));
    errno = 0;
    EXPECT_TRUE(::kill(pid, 0) == -1 && errno == ESRCH)
        << "rank " << (*it)[1] << " (pid " << pid << ") left behind";
  }
}

// Defect: passing step 6 again kept the damaged step_00000006 (it printed "0.0 MB, 0.00 s" and wrote
// nothing), so the next resume failed on the same shard.
void replaces_a_damaged_checkpoint(int ranks) {
  const std::string dir = fresh_dir(), cfg = write_config(dir), run = dir + "/run";
  Outcome first = engine(ranks, cfg, run);
  ASSERT_EQ(first.code, 0) << first.err;
  const std::string root = run + "/checkpoints", damaged = root + "/step_00000006";
  flip_byte(damaged + "/shard_r00000.bin", 100);
  std::ofstream(damaged + "/left_by_someone") << "not part of a checkpoint\n";
  // What a writer killed in the middle of step 6 leaves: its staging directory, never committed.
  fs::create_directories(root + "/.step_00000006.writing");
  std::ofstream(root + "/.step_00000006.writing/shard_r00000.bin") << "half a shard";

  Outcome again = engine(ranks, cfg, run, "--resume " + root + "/step_00000003");
  ASSERT_EQ(again.code, 0) << again.err;

  // One fresh directory holds every rank's shard and rank 0's manifest, and nothing else.
  std::vector<std::string> want = {"manifest.json", "shard_r00000.bin"};
  if (ranks == 2) want.push_back("shard_r00001.bin");
  EXPECT_EQ(names_in(damaged), want);
  const nlohmann::json manifest = nlohmann::json::parse(testing_support::slurp(damaged + "/manifest.json"));
  EXPECT_EQ(manifest["shards"].size(), static_cast<size_t>(ranks));
  EXPECT_EQ(names_in(root), (std::vector<std::string>{"step_00000003", "step_00000006"}));  // no staging left

  Outcome resumed = engine(ranks, cfg, run, "--resume latest");
  EXPECT_EQ(resumed.code, 0) << resumed.err;
  EXPECT_THAT(resumed.err, HasSubstr("steps 6..6"));
}

// Defect: the data version saw only names and sizes, so other data of the same sizes resumed silently.
void refuses_other_data(int ranks) {
  const std::string dir = fresh_dir(), cfg = write_config(dir), run = dir + "/run";
  Outcome first = engine(ranks, cfg, run, "--max-steps 3");
  ASSERT_EQ(first.code, 0) << first.err;
  Outcome other = testing_support::run_engine(
      "data synthetic --out " + dir + "/other --vocab 32 --seed 2 --train-tokens 8192 --val-tokens 1024");
  ASSERT_EQ(other.code, 0) << other.err;
  const std::string ours = run + "/data/train_000000.bin", theirs = dir + "/other/train_000000.bin";
  ASSERT_EQ(fs::file_size(ours), fs::file_size(theirs));
  ASSERT_NE(testing_support::slurp(ours), testing_support::slurp(theirs));
  fs::copy_file(theirs, ours, fs::copy_options::overwrite_existing);

  Outcome r = engine(ranks, cfg, run, "--resume latest");
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_THAT(r.err, HasSubstr("written for other training data"));
  EXPECT_THAT(r.err, HasSubstr("resume with the shards it was trained on"));
  // Both versions: the checkpoint's and the one the shards have now.
  const nlohmann::json manifest =
      nlohmann::json::parse(testing_support::slurp(run + "/checkpoints/step_00000003/manifest.json"));
  const std::string recorded = manifest["data_version"].get<std::string>();
  EXPECT_THAT(r.err, HasSubstr("data version " + recorded + ", the configured shards have "));
}

// Defect: with the newest manifest missing, `--resume latest` went back to the step before in silence.
void latest_says_what_it_passed_over(int ranks) {
  const std::string dir = fresh_dir(), cfg = write_config(dir), run = dir + "/run";
  Outcome first = engine(ranks, cfg, run);
  ASSERT_EQ(first.code, 0) << first.err;
  const std::string root = run + "/checkpoints";
  fs::remove(root + "/step_00000006/manifest.json");

  Outcome r = engine(ranks, cfg, run, "--resume latest --max-steps 4");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.err, HasSubstr("--resume latest: passing over " + root +
                               "/step_00000006: it has no manifest.json: it "
                               "was never committed"));
  EXPECT_THAT(r.err, HasSubstr("--resume latest: resuming from " + root + "/step_00000003 instead"));
  EXPECT_THAT(r.err, HasSubstr("steps 3..4"));
}

// Defect: `run` refused a damaged checkpoint without naming the earlier one, as `train` does.
void refuses_a_damaged_checkpoint(int ranks) {
  const std::string dir = fresh_dir(), cfg = write_config(dir), run = dir + "/run";
  Outcome first = engine(ranks, cfg, run);
  ASSERT_EQ(first.code, 0) << first.err;
  const std::string root = run + "/checkpoints", shard = root + "/step_00000006/shard_r00000.bin";
  flip_byte(shard, 100);
  for (const std::string& resume : {std::string("latest"), root + "/step_00000006"}) {
    Outcome r = engine(ranks, cfg, run, "--resume " + resume);
    EXPECT_EQ(r.code, 5) << "5: damaged, not bad input (2): " << resume << "\n" << r.err;
    EXPECT_THAT(r.err, HasSubstr("checkpoint shard '" + shard + "' is corrupt")) << resume;
    EXPECT_THAT(r.err, HasSubstr("an earlier checkpoint is still there: --resume " + root + "/step_00000003"))
        << resume;
    expect_no_worker_left(r.err);
  }
}

// Defect: under tp x pp each rank reads only its part of a checkpoint, so a damaged shard of the second
// stage failed ranks 2-3 alone; ranks 0-1 had loaded, went on training and failed on "peer closed", and
// the launcher named rank 1's "gloo all_reduce ... peer closed" as the cause. Now the gang agrees on the
// load first: every rank's message names the damaged file, no rank reports a broken connection, and the
// checkpoint is left as it was.
TEST(CheckpointCli, RunTp2Pp2RefusesAStagesDamagedShardOnEveryRankNamingTheFile) {
  const std::string dir = fresh_dir(), cfg = dir + "/tp-pp.toml", run = dir + "/run";
  // Two heads and two layers, so tp 2 x pp 2 fits; 4 / micro_batch 2 = 2 micro-batches fill 1F1B's pipe.
  std::ofstream(cfg)
      << "[model]\nn_layer = 2\nn_head = 2\nn_embd = 16\nvocab_size = 32\nseq_len = 8\n"
         "[train]\nglobal_batch = 4\nmicro_batch = 2\nthreads = 1\nmax_steps = 3\nval_every = 0\n"
         "checkpoint_every = 3\n"
         "[data]\nsynthetic_train_tokens = 8192\nsynthetic_val_tokens = 1024\n";
  const std::string layout = "run --nproc 4 --tp 2 --pp 2 --config " + cfg + " --out " + run;
  Outcome first = testing_support::run_engine(layout);
  ASSERT_EQ(first.code, 0) << first.err;
  const std::string ckpt = run + "/checkpoints/step_00000003", shard = ckpt + "/shard_r00003.bin";
  flip_byte(shard, fs::file_size(shard) / 2);
  std::vector<std::string> before;
  for (const std::string& name : names_in(ckpt)) before.push_back(testing_support::slurp(ckpt + "/" + name));

  Outcome r = testing_support::run_engine(layout + " --resume latest");
  EXPECT_EQ(r.code, 5) << r.err;  // damaged: every rank agreed, though only ranks 2-3 read the shard
  // The headline, then each rank's line: "rank R (pid P) exited with code 5: rank R of 4: <its message>".
  EXPECT_THAT(r.err.substr(r.err.find("gantry-engine run: rank ")), HasSubstr(shard));
  static const std::regex line(R"(rank (\d) \(pid \d+\) exited with code 5: rank \d of 4: ([^\n]*))");
  std::set<int> named;
  for (auto it = std::sregex_iterator(r.err.begin(), r.err.end(), line); it != std::sregex_iterator(); ++it) {
    EXPECT_THAT((*it)[2].str(), HasSubstr("checkpoint shard '" + shard + "' is corrupt")) << (*it)[0];
    named.insert(std::stoi((*it)[1]));
  }
  EXPECT_EQ(named, (std::set<int>{0, 1, 2, 3})) << r.err;
  EXPECT_THAT(r.err, Not(HasSubstr("peer closed")));
  expect_no_worker_left(r.err);
  std::vector<std::string> after;
  for (const std::string& name : names_in(ckpt)) after.push_back(testing_support::slurp(ckpt + "/" + name));
  EXPECT_EQ(after, before) << "the refused checkpoint was changed";
}

TEST(CheckpointCli, TrainPassingADamagedCheckpointsStepAgainReplacesIt) {
  replaces_a_damaged_checkpoint(1);
}
TEST(CheckpointCli, RunPassingADamagedCheckpointsStepAgainReplacesIt) {
  replaces_a_damaged_checkpoint(2);
}
TEST(CheckpointCli, TrainResumeOnOtherDataOfTheSameNamesAndSizesIsRefused) {
  refuses_other_data(1);
}
TEST(CheckpointCli, RunResumeOnOtherDataOfTheSameNamesAndSizesIsRefused) {
  refuses_other_data(2);
}
TEST(CheckpointCli, TrainLatestSaysWhichDirectoryItPassedOverAndWhy) {
  latest_says_what_it_passed_over(1);
}
TEST(CheckpointCli, RunLatestSaysWhichDirectoryItPassedOverAndWhy) {
  latest_says_what_it_passed_over(2);
}
TEST(CheckpointCli, TrainDamagedCheckpointIsRefusedNamingTheFileAndTheEarlierOne) {
  refuses_a_damaged_checkpoint(1);
}
TEST(CheckpointCli, RunDamagedCheckpointIsRefusedNamingTheFileAndTheEarlierOne) {
  refuses_a_damaged_checkpoint(2);
}

}  // namespace
}  // namespace gantry
