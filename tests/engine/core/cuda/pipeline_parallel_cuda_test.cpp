// Pipeline parallelism on GPUs end to end: `gantry-engine run --nproc N --pp 2 [--tp 2]` (NCCL send/recv
// between the stages, each stage's blocks split over its tp group where tp is 2, each stage's dp group
// beside it where N = 4 at tp 1, 8 at tp 2) follows the loss and validation loss curves of `gantry-engine
// train` on one GPU with the same micro-batches, under GPipe, 1F1B, interleaved 1F1B (`--vp 2`: two model
// chunks per rank, the layers pp x vp) and ZB-H1 (the backward split into input and weight passes), and its
// checkpoint (each stage's
// tensors, or their tp shares, in the whole model's coordinates) loads at pp 1, tp 1 on one GPU and on the
// CPU backend and continues on that curve. Every step reports its measured bubble beside the schedule's
// formula. Skips where fewer GPUs are visible than a case needs.
//
// Tolerance (bf16): a stage's forward is the one GPU's, bit for bit (the hand-off's res3 is formed by the
// same fused kernel, sent as the same bf16), but the gradients are summed in another order: the tied wte's
// classifier part arrives from the last stage once per step and is added after the encoder's, the hand-off
// block's MLP projection bias sums d(res3) in its own pass, and the norm adds the stages' squares. Over 12
// steps of the tiny model each step's loss stays within the tensor-parallel test's bound, 2 % of the one-GPU
// run's; step 1 (the same parameters and the same forward) within 0.1 %. Under tp x pp the stages' forward
// also rounds the row-parallel partial sums to bf16 (tensor_parallel_cuda_test): step 1 within that test's
// 0.5 %. The validation loss (steps 6 and 12) within the step bound, 2 %. ZeRO 2-3 (6 layers, 3 blocks a
// stage) add only another summation order: each micro-batch's buckets reduced on their own and added into
// the shard, the tied gradient added before the last micro-batch's encoder gradient; ZeRO 3's gathered
// bf16 blocks are the same bits as the resident copy, so step 1 keeps its bound. Under ZB-H1 the reduced
// micro-batch is the weight pass (the input pass's LayerNorm and bias gradients kept per slot and added
// there), again only a summation order.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "engine/core/cuda/device.h"
#include "tests/engine/core/cuda/engine_run_losses.h"
#include "tests/scratch_dir.h"

namespace gantry {
namespace {

using testing_support::losses_of;
using testing_support::slurp;

// The tiny model's config (`layers` blocks) on `backend` with micro-batches of 4 (4 per step at dp 1, 2 per
// dp rank at dp 2: 1F1B needs at least pp, interleaving a multiple of pp) under `schedule`, validated every
// 6 steps, written under `root`. vp is run's flag: one process has no virtual stages. `bucket_mb`: the
// dp bucket cap (train.dp_bucket_mb).
std::string tiny_config(const std::string& root, const std::string& backend, const std::string& schedule,
                        int layers = 2, double bucket_mb = 0.05) {
  std::string cfg = slurp(std::string(GANTRY_SOURCE_DIR "/assets/configs/tiny.toml"));
  cfg.replace(cfg.find("n_layer = 2"), 11, "n_layer = " + std::to_string(layers));
  cfg.replace(cfg.find("backend = \"cpu\""), 15,
              "backend = \"" + backend + "\"\ndp_bucket_mb = " + std::to_string(bucket_mb) +
                  "\npp_schedule = \"" + schedule + "\"");
  cfg.replace(cfg.find("micro_batch = 8"), 15, "micro_batch = 4");
  cfg.replace(cfg.find("val_every = 25"), 14, "val_every = 6");
  const std::string path = root + "/tiny_" + backend + "_" + schedule + ".toml";
  std::ofstream(path) << cfg;
  return path;
}

constexpr double kStepTolerance = 0.02;      // relative, every step and validation (bf16; see above)
constexpr double kFirstTolerance = 0.001;    // relative, step 1
constexpr double kFirstTolerance3d = 0.005;  // relative, step 1 under tp x pp (bf16 partial sums)

struct Layout {
  int gpus;
  int tp;
  int pp;
  int zero;
  const char* schedule;
  int vp = 1;  // model chunks per rank (> 1: "interleaved")
  // The tiny model's blocks: at least pp x vp; 6 for the ZeRO 2-3 cases: 3 blocks a stage, so ZeRO 3's two
  // block slots cycle and a block is gathered again before its backward, and ZeRO 2's two gradient slots
  // take turns.
  int layers = 2;
  // train.dp_bucket_mb: 0.05 puts each of the tiny model's blocks (49,984 floats) in a bucket alone; 1.0
  // would group four, so the interleaved ZeRO 2 case's buckets hold a whole chunk's blocks only because
  // each chunk's first block begins a bucket (shard_plan_make's bucket_starts).
  double bucket_mb = 0.05;
};

class PipelineParallelCuda : public ::testing::TestWithParam<Layout> {};

TEST_P(PipelineParallelCuda, TracksOneGpuAndItsCheckpointLoadsAtPpOneOnGpuAndCpu) {
  const Layout layout = GetParam();
  if (cuda_device_count() < layout.gpus) {
    GTEST_SKIP() << "needs " << layout.gpus << " GPUs (found " << cuda_device_count() << ")";
  }
  const std::string root = testing_support::scratch_dir().string();
  for (const char* d : {"/one", "/pp", "/gpu1", "/cpu1"}) std::filesystem::create_directories(root + d);
  const std::string gpu = tiny_config(root, "cuda", layout.schedule, layout.layers, layout.bucket_mb),
                    cpu = tiny_config(root, "cpu", layout.schedule, layout.layers, layout.bucket_mb);

  int code = 0;
  std::string err;
  // One GPU, 13 steps: the curve the pipeline must follow, and the step its checkpoint's resumption gives.
  std::vector<double> one_norms, pp_norms;
  std::vector<std::pair<int, double>> one_val, pp_val;
  const std::vector<double> one =
      losses_of("train --config " + gpu + " --out " + root + "/one --max-steps 13 --json", root + "/one",
                &code, &err, &one_norms, &one_val);
  ASSERT_EQ(code, 0) << err;
  ASSERT_EQ(one.size(), 13u);
  const std::vector<double> pp = losses_of(
      "run --nproc " + std::to_string(layout.gpus) + " --tp " + std::to_string(layout.tp) + " --pp " +
          std::to_string(layout.pp) + (layout.vp > 1 ? " --vp " + std::to_string(layout.vp) : std::string()) +
          " --zero " + std::to_string(layout.zero) + " --config " + gpu + " --out " + root +
          "/pp --max-steps 12 --json",
      root + "/pp", &code, &err, &pp_norms, &pp_val);
  ASSERT_EQ(code, 0) << err;
  ASSERT_EQ(pp.size(), 12u);
  const double first = layout.tp > 1 ? kFirstTolerance3d : kFirstTolerance;
  EXPECT_NEAR(pp[0], one[0], first * one[0]) << "step 1";
  for (size_t i = 0; i < pp.size(); ++i) {
    EXPECT_NEAR(pp[i], one[i], kStepTolerance * one[i]) << "step " << i + 1;
  }
  EXPECT_LT(pp.back(), pp.front()) << "the pipeline learns";
  // Validation runs down the stages (the last stage's loss shared over pp): steps 6 and 12, as on one GPU.
  ASSERT_EQ(one_val.size(), 2u);
  ASSERT_EQ(pp_val.size(), 2u);
  for (size_t i = 0; i < pp_val.size(); ++i) {
    EXPECT_EQ(pp_val[i].first, one_val[i].first);
    EXPECT_NEAR(pp_val[i].second, one_val[i].second, kStepTolerance * one_val[i].second)
        << "validation at step " << pp_val[i].first;
  }
  // The norm sums every stage's squares over pp (the tied wte counted once, on stage 0): step 1's is the
  // one GPU's within bf16's 3 % (backend_cuda_test's GPU-vs-CPU bound).
  ASSERT_EQ(pp_norms.size(), pp.size());
  EXPECT_NEAR(pp_norms[0], one_norms[0], 0.03 * one_norms[0]) << "step 1's gradient norm";
  // Each rank reports its measured bubble beside the schedule's formula, (p - 1) / (v·m + p - 1) (v = 1 for
  // GPipe and 1F1B; ZB-H1's (p - 1) / (3m + p - 1)): m = 4 micro-batches per dp rank at dp 1 (pp 2: 20.0 %,
  // 11.1 % at vp 2, 7.7 % under ZB-H1; pp 4 vp 2: 27.3 %; pp 4 ZB-H1: 20.0 %), 2 at dp 2 (33.3 %).
  const int m = 16 / 4 / (layout.gpus / (layout.tp * layout.pp));
  const int v = std::string(layout.schedule) == "zbh1" ? 3 : layout.vp;
  char formula[64];
  std::snprintf(formula, sizeof formula, "formula %.1f %%",
                100.0 * (layout.pp - 1) / (v * m + layout.pp - 1));
  EXPECT_NE(err.find("step 12: pipeline bubble"), std::string::npos) << err;
  EXPECT_NE(err.find(formula), std::string::npos) << formula << " in\n" << err;
  // Rank 0 (stage 0) names what it holds of its stage: under ZeRO 1-3 its 1/dp share of the AdamW moments
  // (8 bytes per parameter of the stage in all), so the stage's dp state is sharded, not replicated.
  const int dp = layout.gpus / (layout.tp * layout.pp);
  if (dp > 1) {
    std::smatch sm;
    ASSERT_TRUE(std::regex_search(err, sm, std::regex(R"(\| (\d+) parameters \|)"))) << err;
    const double stage_params = std::stod(sm[1]);
    ASSERT_TRUE(std::regex_search(err, sm, std::regex(R"(AdamW ([0-9.]+) MB)"))) << err;
    const double full = 8 * stage_params, share = layout.zero == 0 ? 1.0 : 1.0 / dp;
    EXPECT_NEAR(std::stod(sm[1]) * 1e6, full * share, 0.02 * full) << sm[0];
    // Under ZeRO 2-3 the start-up shard-plan line (train.cpp) is the plan the backend holds: its gradient
    // bytes S + E + 2B are stage 0's held gradients (the shard, the embeddings' bucket, two slots of the
    // largest other), to the MB figure's last digit. Interleaved at 1 MB buckets: B is one chunk's blocks
    // only because each chunk's first block begins a bucket (before, it printed vp 1's plan: B all its
    // blocks).
    if (layout.zero >= 2) {
      ASSERT_TRUE(std::regex_search(
          err, sm,
          std::regex(
              R"(grads S\+E\+2B = (\d+)[\s\S]*?\w+ state on this rank: params [0-9.]+ MB, grads ([0-9.]+) MB)")))
          << err;
      EXPECT_NEAR(std::stod(sm[1]), std::stod(sm[2]) * 1e6, 500) << sm[0];
    }
  }

  // The checkpoint holds every stage's tensors (their tp shares under tp x pp) in the whole model's
  // coordinates: it loads at pp 1 and tp 1, on one GPU and on the CPU backend, and step 13 continues the
  // one-GPU curve.
  const std::string ckpt = root + "/pp/checkpoints";
  ASSERT_TRUE(std::filesystem::exists(ckpt + "/step_00000012/manifest.json"));
  for (const auto& [dir, config] : {std::pair<std::string, std::string>{"/gpu1", gpu}, {"/cpu1", cpu}}) {
    std::filesystem::copy(ckpt, root + dir + "/checkpoints", std::filesystem::copy_options::recursive);
    const std::vector<double> resumed = losses_of(
        "train --config " + config + " --out " + root + dir + " --resume latest --max-steps 13 --json",
        root + dir, &code, &err);
    ASSERT_EQ(code, 0) << dir << ": " << err;
    ASSERT_EQ(resumed.size(), 1u) << dir;
    EXPECT_NEAR(resumed[0], one[12], kStepTolerance * one[12]) << dir << ": step 13 after the pp checkpoint";
  }
}

INSTANTIATE_TEST_SUITE_P(Layouts, PipelineParallelCuda,
                         ::testing::Values(Layout{2, 1, 2, 0, "gpipe"}, Layout{2, 1, 2, 0, "1f1b"},
                                           Layout{4, 1, 2, 0, "1f1b"}, Layout{4, 1, 2, 1, "1f1b"},
                                           // ZeRO 2-3 on each stage's dp axis: every backward's buckets
                                           // reduce-scattered as it completes them, ZeRO 3's blocks
                                           // gathered before each forward and backward.
                                           Layout{4, 1, 2, 2, "1f1b", 1, 6}, Layout{4, 1, 2, 3, "1f1b", 1, 6},
                                           Layout{4, 1, 2, 3, "gpipe", 1, 6},
                                           // tp x pp (x dp): each stage's blocks split over 2 GPUs.
                                           Layout{4, 2, 2, 0, "gpipe"}, Layout{4, 2, 2, 0, "1f1b"},
                                           Layout{8, 2, 2, 1, "1f1b"}, Layout{8, 2, 2, 3, "1f1b", 1, 6},
                                           // Interleaved: vp 2 chunks per rank, pp x vp layers.
                                           Layout{2, 1, 2, 0, "interleaved", 2, 4},
                                           Layout{4, 1, 4, 0, "interleaved", 2, 8},
                                           Layout{4, 2, 2, 1, "interleaved", 2, 4},
                                           // ZB-H1: the backward split into input and weight passes.
                                           Layout{2, 1, 2, 0, "zbh1"}, Layout{4, 1, 4, 0, "zbh1", 1, 4},
                                           Layout{4, 2, 2, 1, "zbh1"},
                                           // ZB-H1 at ZeRO 2-3: each weight pass completes its micro-batch's
                                           // buckets (2 micro-batches a dp rank: stage 1 runs B1 before W0).
                                           Layout{4, 1, 2, 2, "zbh1", 1, 6}, Layout{4, 1, 2, 3, "zbh1", 1, 6},
                                           Layout{8, 2, 2, 3, "zbh1", 1, 6},
                                           // Interleaved at ZeRO 2-3 (2 blocks a chunk): each chunk's
                                           // backward completes its own buckets.
                                           Layout{4, 1, 2, 2, "interleaved", 2, 8, 1.0},
                                           Layout{4, 1, 2, 3, "interleaved", 2, 8}),
                         [](const ::testing::TestParamInfo<Layout>& i) {
                           return "gpus" + std::to_string(i.param.gpus) +
                                  (i.param.tp > 1 ? "_tp" + std::to_string(i.param.tp) : std::string()) +
                                  "_pp" + std::to_string(i.param.pp) +
                                  (i.param.vp > 1 ? "_vp" + std::to_string(i.param.vp) : std::string()) +
                                  "_zero" + std::to_string(i.param.zero) + "_" + i.param.schedule;
                         });

}  // namespace
}  // namespace gantry
