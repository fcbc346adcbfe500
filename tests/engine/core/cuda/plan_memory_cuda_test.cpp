// The planner's gantry-cuda memory per rank against real GPU ranks (issue 17: "the planner's predicted memory
// next to the measured ones, within 3 %"). `gantry-engine run --nproc N --tp --pp --json-ranks` prints every
// rank's step record, whose mem_allocated_bytes is the CUDA backend's own count (every device<T>() it made
// and the cuBLASLt workspace: device_health(), no CUDA context, no NCCL buffers); `gantry-engine plan
// --engine gantry-cuda` with the same config and layout predicts each pipeline stage's rank
// (memory.stages[s].total, the same for every tp rank of the stage). Global rank r is stage (r / tp) % pp
// (ParallelDims); ZB-H1 and interleaved layouts too (a config's zbh1, and interleaved with its train.vp,
// are planner schedules; an interleaved rank holds vp chunks with their own slots). Each dp rank is checked
// against plan_cuda_rank_memory for its own dp rank (the plan command's stage figure is dp rank 0's).
// A stage's activation slots and token buffer are allocated during its first step, so the
// records of steps 1 and 2 (both after it) must hold the prediction, byte for byte, and within the issue's
// 3 % without the cuBLASLt workspace (which alone is most of the tiny model's bytes). Skips where fewer
// GPUs are visible than a layout needs.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "engine/core/config.h"
#include "engine/core/cuda/device.h"
#include "engine/plan/engine_profile.h"
#include "tests/file_text.h"  // slurp
#include "tests/scratch_dir.h"

namespace gantry {
namespace {

using testing_support::slurp;

struct Layout {
  int gpus, tp, pp;
  const char* schedule;
  int zero = 0;     // over dp = gpus / (tp x pp)
  int layers = 4;   // model.n_layer
  int vp = 1;       // train.vp: model chunks per rank ("interleaved" at vp > 1)
  bool sp = false;  // train.sequence_parallel (tp > 1 at pp 1): against plan_cuda_rank_memory's, below
};

// `gantry-engine args`: exit code, stdout and stderr (files in `dir`).
int engine(const std::string& args, const std::string& dir, std::string* out, std::string* err) {
  const std::string o = dir + "/stdout.txt", e = dir + "/stderr.txt";
  const int status = std::system((std::string(GANTRY_ENGINE_BIN " ") + args + " >" + o + " 2>" + e).c_str());
  *out = slurp(o);
  *err = slurp(e);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// The tiny model at `layers` layers (4: 2 blocks a stage at pp 2, one a chunk at pp 2 x vp 2) on the CUDA
// backend, micro-batches of 4 (4 a step at dp 1: 1F1B holds 2 per stage at pp 2, GPipe all 4), no
// validation or checkpoint.
std::string config(const std::string& root, const std::string& schedule, int layers, int vp, bool sp) {
  std::string cfg = slurp(std::string(GANTRY_SOURCE_DIR "/assets/configs/tiny.toml"));
  cfg.replace(cfg.find("n_layer = 2"), 11, "n_layer = " + std::to_string(layers));
  cfg.replace(cfg.find("backend = \"cpu\""), 15,
              "backend = \"cuda\"\npp_schedule = \"" + schedule + "\"\nvp = " + std::to_string(vp) +
                  (sp ? "\nsequence_parallel = true" : ""));
  cfg.replace(cfg.find("micro_batch = 8"), 15, "micro_batch = 4");
  cfg.replace(cfg.find("val_every = 25"), 14, "val_every = 0");
  cfg.replace(cfg.find("checkpoint_every = 50"), 21, "checkpoint_every = 0");
  const std::string path = root + "/tiny_cuda_" + schedule + ".toml";
  std::ofstream(path) << cfg;
  return path;
}

class PlanMemoryCuda : public ::testing::TestWithParam<Layout> {};

TEST_P(PlanMemoryCuda, EveryRanksMemoryIsThePlannersPredictionForItsStage) {
  const Layout l = GetParam();
  if (cuda_device_count() < l.gpus)
    GTEST_SKIP() << "needs " << l.gpus << " GPUs (found " << cuda_device_count() << ")";
  const std::string root = testing_support::scratch_dir().string();
  for (const char* d : {"/run", "/plan"}) std::filesystem::create_directories(root + d);
  const std::string cfg = config(root, l.schedule, l.layers, l.vp, l.sp);
  const std::string layout =
      " --tp " + std::to_string(l.tp) + " --pp " + std::to_string(l.pp) + " --zero " + std::to_string(l.zero);

  std::string out, err;
  Result<Config> c = config_load(cfg);
  ASSERT_TRUE(c.ok()) << c.error();
  const ModelConfig& mc = c->model;
  const PlanModel m{.name = "tiny",
                    .layers = mc.n_layer,
                    .hidden = mc.n_embd,
                    .heads = mc.n_head,
                    .vocab = mc.vocab_size,
                    .seq = mc.seq_len};
  const int dp = l.gpus / (l.tp * l.pp);
  const int micro_batches = c->train.global_batch / (c->train.micro_batch * dp);
  const std::string sched = l.schedule;
  const CudaPipeSchedule schedule = sched == "zbh1"          ? CudaPipeSchedule::kZeroBubbleH1
                                    : sched == "gpipe"       ? CudaPipeSchedule::kGpipe
                                    : sched == "interleaved" ? CudaPipeSchedule::kInterleaved
                                                             : CudaPipeSchedule::kOneFOneB;
  // What plan_cuda_rank_memory predicts for `stage` at dp rank `dp_rank` (the plan command shows dp rank
  // 0's).
  auto rank_memory = [&](int stage, int dp_rank, bool sp) -> EngineMemory {
    Result<EngineMemory> e = plan_cuda_rank_memory(
        m, c->train.micro_batch, l.tp, l.pp, stage, micro_batches, schedule,
        {.dp = dp,
         .rank = dp_rank,
         .zero = l.zero,
         .bucket_bytes = static_cast<uint64_t>(c->train.dp_bucket_mb * 1024.0 * 1024.0)},
        l.vp, sp);
    EXPECT_TRUE(e.ok()) << e.error();
    return e.ok() ? e.value() : EngineMemory{};
  };
  auto rank_total = [&](int stage, int dp_rank) {
    return static_cast<double>(rank_memory(stage, dp_rank, l.sp).total);
  };
  // The plan command's figure per stage (dp rank 0's), every schedule (ZB-H1 included: a config's zbh1 is a
  // planner schedule).
  ASSERT_EQ(engine("plan --engine gantry-cuda --config " + cfg + " --gpus " + std::to_string(l.gpus) +
                       layout + " --json",
                   root + "/plan", &out, &err),
            0)
      << err;
  const nlohmann::json plan = nlohmann::json::parse(out);
  if (l.pp > 1) {
    EXPECT_EQ(plan.at("layout").at("schedule"), std::string(l.schedule));
    EXPECT_EQ(plan.at("layout").at("vp").get<int>(), l.vp);
  }
  const nlohmann::json stages = plan.at("memory").at("stages");
  ASSERT_EQ(stages.size(), static_cast<size_t>(l.pp)) << out;
  // The plan command's figure is plan_cuda_rank_memory's (dp rank 0's) for every stage. It plans the engine
  // without sequence parallelism: an SP layout is held to plan_cuda_rank_memory's SP table instead.
  for (int stage = 0; stage < l.pp; ++stage) {
    EXPECT_EQ(stages[static_cast<size_t>(stage)].at("total").get<double>(),
              static_cast<double>(rank_memory(stage, 0, false).total))
        << stage;
  }

  ASSERT_EQ(engine("run --nproc " + std::to_string(l.gpus) + layout + " --config " + cfg + " --out " + root +
                       "/run --max-steps 2 --json-ranks",
                   root + "/run", &out, &err),
            0)
      << err;
  std::map<int, std::vector<uint64_t>> measured;  // global rank -> each step's mem_allocated_bytes
  std::istringstream lines(out);
  for (std::string line; std::getline(lines, line);) {
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_object() && j.contains("rank_step")) {
      measured[j["rank_step"]["rank"].get<int>()].push_back(
          j["rank_step"]["mem_allocated_bytes"].get<uint64_t>());
    }
  }
  ASSERT_EQ(measured.size(), static_cast<size_t>(l.gpus)) << out;
  for (const auto& [rank, bytes] : measured) {
    const int stage = (rank / l.tp) % l.pp;
    const EngineMemory want = rank_memory(stage, 0, l.sp);
    const double predicted = static_cast<double>(want.total);
    // The 32 MiB cuBLASLt workspace is most of the tiny model's total: the 3 % goal is checked on the rest,
    // what memory_bytes() counts (the record's bytes less the workspace).
    const double predicted_backend = static_cast<double>(want.backend_bytes);
    const double workspace = predicted - predicted_backend;
    ASSERT_EQ(bytes.size(), 2u) << "rank " << rank;
    for (size_t s = 0; s < bytes.size(); ++s) {
      const double got = static_cast<double>(bytes[s]);
      // Printed for the table: the prediction beside the measurement.
      std::printf(
          "rank %d (stage %d) step %zu: measured %.0f, predicted %.0f; without the workspace %.0f vs %.0f "
          "(%+.4f %%)\n",
          rank, stage, s + 1, got, predicted, got - workspace, predicted_backend,
          100 * (predicted_backend / (got - workspace) - 1));
      EXPECT_LE(std::fabs(predicted_backend / (got - workspace) - 1), 0.03)
          << "rank " << rank << " step " << s + 1;
      // The plan shows dp rank 0's figure. Under ZeRO another dp rank's shard differs a little (one element
      // less of a bucket that does not divide evenly, an AdamW chunk more where its owned range crosses
      // one more tensor boundary: 36 bytes on dp rank 1 of the tiny model, call Z3): each rank is checked
      // byte for byte against the planner's figure for its own dp rank.
      const int dp_rank = rank / (l.tp * l.pp);
      if (dp_rank == 0 || l.zero == 0) {
        EXPECT_EQ(predicted, got) << "rank " << rank << " (stage " << stage << ") step " << s + 1;
      } else {
        EXPECT_EQ(rank_total(stage, dp_rank), got)
            << "rank " << rank << " (dp rank " << dp_rank << ", stage " << stage << ") step " << s + 1;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, PlanMemoryCuda,
    ::testing::Values(Layout{2, 2, 1, "1f1b"}, Layout{2, 1, 2, "1f1b"}, Layout{2, 1, 2, "gpipe"},
                      Layout{4, 2, 2, "1f1b"}, Layout{4, 2, 2, "gpipe"},
                      // ZeRO over dp 2: the shards, the staging of 2 and 3.
                      Layout{2, 1, 1, "1f1b", 1}, Layout{2, 1, 1, "1f1b", 3}, Layout{4, 1, 2, "1f1b", 1},
                      // ZeRO 2-3 on a stage's dp axis (6 layers: ZeRO 3's two block slots cycle over a
                      // stage's 3 blocks); ZB-H1's slots and kept gradients, at ZeRO 2-3 with each slot's
                      // early buffer (the input pass's parameter gradients).
                      Layout{4, 1, 2, "1f1b", 2, 6}, Layout{4, 1, 2, "1f1b", 3, 6}, Layout{2, 1, 2, "zbh1"},
                      Layout{4, 2, 2, "zbh1"}, Layout{4, 1, 2, "zbh1", 2, 6}, Layout{4, 1, 2, "zbh1", 3, 6},
                      // Interleaved: 2 chunks a rank (one block each), m 4, each chunk's slots its own; at
                      // ZeRO 2 over dp 2 with 6 layers (a rank's chunks of different sizes, each chunk's
                      // first block beginning a gradient bucket; 4 GPUs).
                      Layout{2, 1, 2, "interleaved", 0, 4, 2}, Layout{4, 1, 2, "interleaved", 2, 6, 2},
                      // Sequence parallelism: the residual stream at N/tp rows and the packed partial
                      // gradients, at ZeRO 0 and over dp 2 at ZeRO 2 (4 GPUs).
                      Layout{2, 2, 1, "1f1b", 0, 4, 1, true}, Layout{4, 2, 1, "1f1b", 2, 4, 1, true}),
    [](const ::testing::TestParamInfo<Layout>& i) {
      return "gpus" + std::to_string(i.param.gpus) + "_tp" + std::to_string(i.param.tp) + "_pp" +
             std::to_string(i.param.pp) + "_" + i.param.schedule + "_zero" + std::to_string(i.param.zero) +
             (i.param.layers != 4 ? "_l" + std::to_string(i.param.layers) : "") +
             (i.param.vp != 1 ? "_vp" + std::to_string(i.param.vp) : "") + (i.param.sp ? "_sp" : "");
    });

}  // namespace
}  // namespace gantry
