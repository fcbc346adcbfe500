// Data parallelism on GPUs end to end: `gantry-engine run --nproc 2` (one GPU per worker, NCCL, buckets
// reduced during the backward pass) computes what `gantry-engine train` computes on one GPU. Skips where
// fewer than two GPUs are visible.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "engine/core/cuda/device.h"

namespace gantry {
namespace {

std::string slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Runs gantry-engine with `args`; the losses of its --json step lines, in step order.
std::vector<double> losses_of(const std::string& args, const std::string& dir, int* code, std::string* err) {
  const std::string out = dir + "/stdout.txt", errf = dir + "/stderr.txt";
  const int status = std::system((std::string(GANTRY_ENGINE_BIN) + " " + args + " >" + out + " 2>" + errf).c_str());
  *code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  *err = slurp(errf);
  std::vector<double> losses;
  std::istringstream lines(slurp(out));
  for (std::string line; std::getline(lines, line);) {
    nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_object() && j.contains("loss") && !j.contains("event")) losses.push_back(j["loss"].get<double>());
  }
  return losses;
}

TEST(DataParallelCuda, TwoGpusTrackOneGpu) {
  if (cuda_device_count() < 2) GTEST_SKIP() << "needs two GPUs (found " << cuda_device_count() << ")";
  const std::string root = ::testing::TempDir() + "/gantry_dp_cuda";
  std::filesystem::remove_all(root);
  std::filesystem::create_directories(root + "/one");
  std::filesystem::create_directories(root + "/two");
  // The tiny model on the GPU with small buckets (several per step); global batch 16 = 2 micro-batches of
  // 8 on one GPU, one of 8 on each of two.
  std::string cfg = slurp(std::string(GANTRY_SOURCE_DIR) + "/assets/configs/tiny.toml");
  cfg.replace(cfg.find("backend = \"cpu\""), 15, "backend = \"cuda\"\ndp_bucket_mb = 0.05");
  const std::string path = root + "/tiny_cuda.toml";
  std::ofstream(path) << cfg;

  int code = 0;
  std::string err;
  const std::vector<double> one =
      losses_of("train --config " + path + " --out " + root + "/one --max-steps 12 --json", root + "/one", &code, &err);
  ASSERT_EQ(code, 0) << err;
  const std::vector<double> two = losses_of(
      "run --nproc 2 --config " + path + " --out " + root + "/two --max-steps 12 --json", root + "/two", &code, &err);
  ASSERT_EQ(code, 0) << err;
  ASSERT_EQ(one.size(), 12u);
  ASSERT_EQ(two.size(), 12u);
  for (size_t i = 0; i < one.size(); ++i) {
    // The same samples in the same micro-batches: only the order of the two halves' gradient sum differs.
    EXPECT_NEAR(two[i], one[i], 1e-3 * std::fabs(one[i])) << "step " << i + 1;
  }
  // Rank 0 wrote the whole state; the checkpoint loads on one GPU.
  EXPECT_TRUE(std::filesystem::exists(root + "/two/checkpoints/step_00000012/manifest.json"));
  const std::vector<double> resumed = losses_of(
      "train --config " + path + " --out " + root + "/two --resume latest --max-steps 13 --json", root + "/two", &code,
      &err);
  ASSERT_EQ(code, 0) << err;
  EXPECT_EQ(resumed.size(), 1u);
}

}  // namespace
}  // namespace gantry
