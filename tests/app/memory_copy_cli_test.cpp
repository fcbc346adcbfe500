// In-memory copies in a gang of real processes (`run --nproc 2`, CPU, Gloo, GANTRY_MEMORY_DIR given as an
// agent would): each rank's copies hold the bytes a disk checkpoint of the same step holds, whether the
// copies are written before the next step (train.memory_copy_async = false) or by a writer thread while
// training goes on (true). An asynchronous copy due while the one before is still being written is
// skipped by every rank alike, so the ranks' folders always hold the same steps.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <regex>
#include <string>
#include <vector>

#include "tests/app/engine_child.h"
#include "tests/app/engine_process.h"
#include "tests/scratch_dir.h"

namespace gantry {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using testing_support::EngineChild;

constexpr int kSteps = 8;

std::string file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

// kSteps steps, a synchronous disk checkpoint after every one (to compare the copies with), a copy every
// step.
std::string write_config(const std::string& dir, bool async) {
  testing_support::Outcome d = testing_support::run_engine(
      "data synthetic --out " + dir + "/data --vocab 32 --train-tokens 8192 --val-tokens 1024");
  EXPECT_EQ(d.code, 0) << d.err;
  const std::string path = dir + "/small.toml";
  std::ofstream(path) << "[model]\nn_layer = 1\nn_head = 2\nn_embd = 16\nvocab_size = 32\nseq_len = 8\n"
                      << "[train]\nglobal_batch = 4\nmicro_batch = 2\nthreads = 1\nmax_steps = " << kSteps
                      << "\nval_every = 0\ncheckpoint_every = 1\nkeep_checkpoints = 100\n"
                      << "checkpoint_async = false\nmemory_copy_every = 1\nmemory_copy_async = "
                      << (async ? "true" : "false") << "\n"
                      << "[data]\nkind = \"shards\"\ndir = \"" << dir << "/data\"\n";
  return path;
}

struct Counts {
  int64_t written = -1, skipped = -1;
};

// Rank r's "in-memory copies: W written, S skipped" line.
Counts counts(const std::string& err, int rank) {
  const std::regex line("rank " + std::to_string(rank) +
                        R"(: in-memory copies: (\d+) written, (\d+) skipped)");
  std::smatch m;
  if (!std::regex_search(err, m, line)) return {};
  return {std::stoll(m[1]), std::stoll(m[2])};
}

// The committed copies (a manifest beside the shard) in a rank's memory folder, oldest first.
std::vector<std::string> committed(const fs::path& rank_dir) {
  std::vector<std::string> steps;
  if (!fs::exists(rank_dir)) return steps;
  for (const fs::directory_entry& d : fs::directory_iterator(rank_dir)) {
    const std::string name = d.path().filename().string();
    if (name.rfind("step_", 0) == 0 && fs::exists(d.path() / "manifest.json")) steps.push_back(name);
  }
  std::sort(steps.begin(), steps.end());
  return steps;
}

void check_copies(bool async) {
  const std::string dir = testing_support::scratch_dir(async ? "memory_async" : "memory_sync").string();
  const std::string cfg = write_config(dir, async);
  EngineChild run = EngineChild::start(
      {"run", "--nproc", "2", "--config", cfg, "--out", dir + "/run", "--json", "--collective-timeout", "10"},
      {{"GANTRY_MEMORY_DIR", dir + "/mem"}});
  EngineChild::Exit e = run.wait(120s);
  ASSERT_FALSE(e.timed_out) << run.err();
  ASSERT_EQ(e.code, 0) << run.err();

  // Steps 1..kSteps-1 are due (the last step's state is the final checkpoint's); every rank took or
  // skipped the same ones.
  const Counts c0 = counts(run.err(), 0), c1 = counts(run.err(), 1);
  ASSERT_GE(c0.written, 1) << run.err();
  EXPECT_EQ(c0.written + c0.skipped, kSteps - 1) << run.err();
  EXPECT_EQ(c1.written, c0.written) << run.err();
  EXPECT_EQ(c1.skipped, c0.skipped) << run.err();
  if (!async) {
    EXPECT_EQ(c0.skipped, 0) << "a synchronous copy is never skipped";
  }

  std::vector<std::string> steps[2];
  for (int r = 0; r < 2; ++r) {
    const fs::path rank_dir = fs::path(dir) / "mem" / ("rank-" + std::to_string(r));
    steps[r] = committed(rank_dir);
    ASSERT_FALSE(steps[r].empty()) << rank_dir;
    EXPECT_LE(steps[r].size(), 2u) << "the two newest are kept";
    char shard[32];
    std::snprintf(shard, sizeof shard, "shard_r%05d.bin", r);
    for (const std::string& step : steps[r]) {
      const std::string disk = dir + "/run/checkpoints/" + step + "/" + shard;
      ASSERT_TRUE(fs::exists(disk)) << disk;
      EXPECT_EQ(file_bytes((rank_dir / step / shard).string()), file_bytes(disk)) << step << " " << shard;
    }
  }
  EXPECT_EQ(steps[0], steps[1]) << "the ranks' folders hold the same steps";
  if (!async) {
    EXPECT_EQ(steps[0].back(), "step_00000007");
  }
}

TEST(MemoryCopyCli, SynchronousCopiesHoldTheBytesOfDiskCheckpoints) {
  check_copies(/*async=*/false);
}

TEST(MemoryCopyCli, AsynchronousCopiesHoldTheBytesOfDiskCheckpointsAndEveryRankSkipsAlike) {
  check_copies(/*async=*/true);
}

}  // namespace
}  // namespace gantry
