// Tensor parallelism on GPUs end to end: `gantry-engine run --nproc N --tp 2` (NCCL, heads, MLP and
// vocabulary split over the tp ranks, dp and ZeRO beside it where N = 4) follows the loss curve of
// `gantry-engine train` on one GPU, and its checkpoint (each rank's tensor shares in the whole model's
// coordinates) loads at tp 1 on one GPU and on the CPU backend and continues on that curve. Skips where
// fewer GPUs are visible than a case needs.
//
// Tolerance (bf16): the tp run rounds each rank's partial sums of the row-parallel products to bf16 before
// the all-reduce adds them, where one GPU rounds the whole product once, so the curves are not bitwise equal;
// over 12 steps of the tiny model each step's loss stays within 2 % of the one-GPU run's (the first, before
// any update has amplified the rounding, within 0.5 %). Sequence parallelism (the `_sp` cases) is held to
// the same bounds: its reduce-scatters round as the all-reduces do, and its LayerNorm gradients add the
// ranks' rows in another order.
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
#include "tests/engine/core/cuda/engine_run_losses.h"
#include "tests/scratch_dir.h"

namespace gantry {
namespace {

using testing_support::losses_of;
using testing_support::slurp;

// The tiny model's config on `backend`, written under `root` (`sequence_parallel`: with it on).
std::string tiny_config(const std::string& root, const std::string& backend, bool sequence_parallel = false) {
  std::string cfg = slurp(std::string(GANTRY_SOURCE_DIR "/assets/configs/tiny.toml"));
  cfg.replace(cfg.find("backend = \"cpu\""), 15,
              "backend = \"" + backend + "\"\ndp_bucket_mb = 0.05" +
                  (sequence_parallel ? "\nsequence_parallel = true" : ""));
  const std::string path = root + "/tiny_" + backend + (sequence_parallel ? "_sp" : "") + ".toml";
  std::ofstream(path) << cfg;
  return path;
}

constexpr double kStepTolerance = 0.02;    // relative, every step (bf16 partial sums; see above)
constexpr double kFirstTolerance = 0.005;  // relative, step 1

struct Layout {
  int gpus;
  int tp;
  int zero;
  bool sp = false;  // sequence parallel
};

class TensorParallelCuda : public ::testing::TestWithParam<Layout> {};

TEST_P(TensorParallelCuda, TracksOneGpuAndItsCheckpointLoadsAtTpOneOnGpuAndCpu) {
  const Layout layout = GetParam();
  if (cuda_device_count() < layout.gpus) {
    GTEST_SKIP() << "needs " << layout.gpus << " GPUs (found " << cuda_device_count() << ")";
  }
  const std::string root = testing_support::scratch_dir().string();
  for (const char* d : {"/one", "/tp", "/gpu1", "/cpu1"}) std::filesystem::create_directories(root + d);
  const std::string gpu = tiny_config(root, "cuda"), cpu = tiny_config(root, "cpu"),
                    tp_config = layout.sp ? tiny_config(root, "cuda", true) : gpu;

  int code = 0;
  std::string err;
  // One GPU, 13 steps: the curve the tp run must follow, and the step its checkpoint's resumption must give.
  std::vector<double> one_norms, tp_norms;
  const std::vector<double> one =
      losses_of("train --config " + gpu + " --out " + root + "/one --max-steps 13 --json", root + "/one",
                &code, &err, &one_norms);
  ASSERT_EQ(code, 0) << err;
  ASSERT_EQ(one.size(), 13u);
  const std::vector<double> tp =
      losses_of("run --nproc " + std::to_string(layout.gpus) + " --tp " + std::to_string(layout.tp) +
                    " --zero " + std::to_string(layout.zero) + " --config " + tp_config + " --out " + root +
                    "/tp --max-steps 12 --json",
                root + "/tp", &code, &err, &tp_norms);
  ASSERT_EQ(code, 0) << err;
  ASSERT_EQ(tp.size(), 12u);
  // The start-up summary names the layout, sequence parallelism included.
  EXPECT_EQ(err.find(", sequence parallel") != std::string::npos, layout.sp) << err.substr(0, 2000);
  EXPECT_NEAR(tp[0], one[0], kFirstTolerance * one[0]) << "step 1";
  for (size_t i = 0; i < tp.size(); ++i) {
    EXPECT_NEAR(tp[i], one[i], kStepTolerance * one[i]) << "step " << i + 1;
  }
  EXPECT_LT(tp.back(), tp.front()) << "the tp run learns";
  // The norm sums the split tensors' squares over tp and counts the whole ones once: the first step's (the
  // same parameters on both) is the one GPU's within bf16's 3 % (backend_cuda_test's GPU-vs-CPU bound).
  ASSERT_EQ(tp_norms.size(), tp.size());
  EXPECT_NEAR(tp_norms[0], one_norms[0], 0.03 * one_norms[0]) << "step 1's gradient norm";

  // The tp checkpoint holds every tensor in the whole model's coordinates: it loads at tp 1, on one GPU and
  // on the CPU backend, and step 13 continues the one-GPU curve.
  const std::string ckpt = root + "/tp/checkpoints";
  ASSERT_TRUE(std::filesystem::exists(ckpt + "/step_00000012/manifest.json"));
  for (const auto& [dir, config] : {std::pair<std::string, std::string>{"/gpu1", gpu}, {"/cpu1", cpu}}) {
    std::filesystem::copy(ckpt, root + dir + "/checkpoints", std::filesystem::copy_options::recursive);
    const std::vector<double> resumed = losses_of(
        "train --config " + config + " --out " + root + dir + " --resume latest --max-steps 13 --json",
        root + dir, &code, &err);
    ASSERT_EQ(code, 0) << dir << ": " << err;
    ASSERT_EQ(resumed.size(), 1u) << dir;
    EXPECT_NEAR(resumed[0], one[12], kStepTolerance * one[12]) << dir << ": step 13 after the tp checkpoint";
  }
}

INSTANTIATE_TEST_SUITE_P(Layouts, TensorParallelCuda,
                         ::testing::Values(Layout{2, 2, 0}, Layout{4, 2, 1}, Layout{4, 2, 3}, Layout{4, 4, 0},
                                           Layout{2, 2, 0, true}, Layout{4, 2, 1, true},
                                           Layout{4, 2, 3, true}, Layout{4, 4, 0, true}),
                         [](const ::testing::TestParamInfo<Layout>& i) {
                           return "gpus" + std::to_string(i.param.gpus) + "_tp" + std::to_string(i.param.tp) +
                                  "_zero" + std::to_string(i.param.zero) + (i.param.sp ? "_sp" : "");
                         });

}  // namespace
}  // namespace gantry
