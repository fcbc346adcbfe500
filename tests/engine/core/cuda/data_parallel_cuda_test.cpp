// Data parallelism on GPUs end to end: `gantry-engine run --nproc N --zero S` (one GPU per worker, NCCL,
// buckets reduced during the backward pass, ZeRO 0-3) computes what `gantry-engine train` computes on one
// GPU, and its sharded checkpoint loads on one GPU. Skips where fewer GPUs are visible than a case needs.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "engine/core/cuda/device.h"
#include "tests/engine/core/cuda/engine_run_losses.h"
#include "tests/scratch_dir.h"

namespace gantry {
namespace {

using testing_support::losses_of;
using testing_support::slurp;

struct Layout {
  int gpus;
  int zero;
  int micro_batch = 8;  // tiny.toml's; 4 gives each rank two micro-batches a step at 2 GPUs (accumulation)
};

class DataParallelCuda : public ::testing::TestWithParam<Layout> {};

TEST_P(DataParallelCuda, TracksOneGpuAndItsCheckpointLoadsOnOne) {
  const Layout layout = GetParam();
  if (cuda_device_count() < layout.gpus) {
    GTEST_SKIP() << "needs " << layout.gpus << " GPUs (found " << cuda_device_count() << ")";
  }
  const std::string root = testing_support::scratch_dir().string();
  std::filesystem::create_directories(root + "/one");
  std::filesystem::create_directories(root + "/many");
  // The tiny model on the GPU with small buckets (several per step); global batch 16 = 2 micro-batches of
  // 8 on one GPU, one of 8 on each of two, one of 4 on each of four.
  std::string cfg = slurp(std::string(GANTRY_SOURCE_DIR "/assets/configs/tiny.toml"));
  cfg.replace(cfg.find("backend = \"cpu\""), 15, "backend = \"cuda\"\ndp_bucket_mb = 0.05");
  cfg.replace(cfg.find("micro_batch = 8"), 15, "micro_batch = " + std::to_string(layout.micro_batch));
  const std::string path = root + "/tiny_cuda.toml";
  std::ofstream(path) << cfg;

  int code = 0;
  std::string err;
  const std::vector<double> one = losses_of(
      "train --config " + path + " --out " + root + "/one --max-steps 12 --json", root + "/one", &code, &err);
  ASSERT_EQ(code, 0) << err;
  const std::vector<double> many =
      losses_of("run --nproc " + std::to_string(layout.gpus) + " --zero " + std::to_string(layout.zero) +
                    " --config " + path + " --out " + root + "/many --max-steps 12 --json",
                root + "/many", &code, &err);
  ASSERT_EQ(code, 0) << err;
  ASSERT_EQ(one.size(), 12u);
  ASSERT_EQ(many.size(), 12u);
  for (size_t i = 0; i < one.size(); ++i) {
    // The same samples: only the order in which the ranks' gradient shares are summed differs.
    EXPECT_NEAR(many[i], one[i], 1e-3 * std::fabs(one[i])) << "step " << i + 1;
  }

  // Rank 0's start-up summary names what it holds: under ZeRO 1-3 about half (two ranks) or a quarter of
  // the AdamW moments, 8 bytes per parameter in all.
  std::smatch m;
  ASSERT_TRUE(std::regex_search(err, m, std::regex(R"(\| (\d+) parameters \|)"))) << err;
  const double params = std::stod(m[1]);
  ASSERT_TRUE(
      std::regex_search(err, m, std::regex(R"(params ([0-9.]+) MB, grads ([0-9.]+) MB, AdamW ([0-9.]+) MB)")))
      << err;
  const double adamw_bytes = std::stod(m[3]) * 1e6, full = 8 * params;
  const double share = layout.zero == 0 ? 1.0 : 1.0 / layout.gpus;
  EXPECT_NEAR(adamw_bytes, full * share, 0.02 * full) << m[0];
  if (layout.zero == 3) {
    EXPECT_LT(std::stod(m[1]) * 1e6, 6 * params) << "ZeRO 3 keeps less than a full bf16 copy";
  }

  // Every rank wrote its share; the checkpoint loads on one GPU and continues.
  EXPECT_TRUE(std::filesystem::exists(root + "/many/checkpoints/step_00000012/manifest.json"));
  const std::vector<double> resumed =
      losses_of("train --config " + path + " --out " + root + "/many --resume latest --max-steps 13 --json",
                root + "/many", &code, &err);
  ASSERT_EQ(code, 0) << err;
  EXPECT_EQ(resumed.size(), 1u);
}

INSTANTIATE_TEST_SUITE_P(Layouts, DataParallelCuda,
                         ::testing::Values(Layout{2, 0}, Layout{2, 1}, Layout{2, 2}, Layout{2, 3},
                                           Layout{2, 1, 4}, Layout{2, 2, 4}, Layout{2, 3, 4}, Layout{4, 1},
                                           Layout{4, 3}),
                         [](const ::testing::TestParamInfo<Layout>& i) {
                           return "gpus" + std::to_string(i.param.gpus) + "_zero" +
                                  std::to_string(i.param.zero) + "_micro" +
                                  std::to_string(i.param.micro_batch);
                         });

}  // namespace
}  // namespace gantry
