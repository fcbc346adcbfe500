// The silent-data-corruption check on GPUs: the device reduction equals the CPU's replica_hash on the same
// bytes; the CUDA backend hashes what its replicas hold identically (fp32 master weights at ZeRO 0) and its
// test fault flips one bit of it; and `gantry-engine run` on 2 GPUs (NCCL) stays quiet when clean and, with
// one replica's bit flipped, stops naming both ranks (two replicas have no majority), at ZeRO 0 and 1.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "engine/core/backend.h"
#include "engine/core/cuda/device.h"  // cuda_device_count
#include "engine/core/cuda/replica_hash.cuh"
#include "engine/core/gpt.h"
#include "engine/core/replica_hash.h"
#include "engine/core/rng.h"
#include "tests/engine/core/cuda/cuda_test_util.h"
#include "tests/file_text.h"  // slurp
#include "tests/scratch_dir.h"

namespace gantry {
namespace {

using testing_support::DeviceBuffer;

TEST(ReplicaHashCuda, EqualsTheCpuHashForEverySizeAndTail) {
  GANTRY_REQUIRE_GPU();
  Rng rng{11};
  DeviceBuffer<unsigned long long> sum(1);
  // Empty, tails of every length, one block, several blocks, more words than the grid has threads.
  for (size_t bytes : {size_t{0}, size_t{1}, size_t{7}, size_t{8}, size_t{9}, size_t{2046}, size_t{2048},
                       size_t{8 * 256 + 3}, size_t{1} << 20, (size_t{1} << 24) + 6}) {
    std::vector<unsigned char> host(bytes);
    for (unsigned char& b : host) b = static_cast<unsigned char>(rng.next_u64());
    DeviceBuffer<unsigned char> dev(host);
    const uint64_t want = replica_hash(host.data(), bytes);
    EXPECT_EQ(replica_hash_cuda(dev.get(), bytes, sum.get(), nullptr), want) << bytes << " bytes";
    // The same bits on a second call (no state left in the scratch word).
    EXPECT_EQ(replica_hash_cuda(dev.get(), bytes, sum.get(), nullptr), want) << bytes << " bytes";
  }
}

TEST(ReplicaHashCuda, BackendHashesItsMasterWeightsAndTheTestFaultFlipsOneBit) {
  GANTRY_REQUIRE_GPU();
  const ModelConfig m{.n_layer = 2, .n_head = 2, .n_embd = 64, .vocab_size = 96, .seq_len = 32};
  Result<std::unique_ptr<Backend>> be = backend_create("cuda", m, 4, {});
  ASSERT_TRUE(be.ok()) << be.error();
  Backend& gpu = *be.value();
  const size_t n = gpu.params().numel();
  std::vector<float> theta(n);
  gpt_init_params(m, gpu.params(), 5, theta.data());
  gpu.write_state(StateBuffer::kParams, 0, n, theta.data());
  EXPECT_EQ(gpu.replicated_state(), "fp32 parameters");
  EXPECT_EQ(gpu.replicated_bytes(), n * sizeof(float));
  const uint64_t h = gpu.replicated_hash();
  EXPECT_EQ(h, replica_hash(theta.data(), n * sizeof(float)));
  ASSERT_TRUE(gpu.test_flip_replicated_bit(n * 16 + 3));
  EXPECT_NE(gpu.replicated_hash(), h);
  std::vector<float> after(n);
  gpu.read_state(StateBuffer::kParams, 0, n, after.data());
  EXPECT_EQ(gpu.replicated_hash(), replica_hash(after.data(), n * sizeof(float)));
  ASSERT_TRUE(gpu.test_flip_replicated_bit(n * 16 + 3));
  EXPECT_EQ(gpu.replicated_hash(), h);
  EXPECT_FALSE(gpu.test_flip_replicated_bit(n * 32));
}

using testing_support::slurp;

struct Case {
  int zero;
  bool flip;
};

class SdcTwoGpus : public ::testing::TestWithParam<Case> {};

TEST_P(SdcTwoGpus, CleanRunsAreQuietAndAFlippedBitNamesBothRanksWithoutAMajority) {
  const Case c = GetParam();
  if (cuda_device_count() < 2) GTEST_SKIP() << "needs 2 GPUs (found " << cuda_device_count() << ")";
  const std::string root = testing_support::scratch_dir().string();
  std::string cfg = slurp(std::string(GANTRY_SOURCE_DIR "/assets/configs/tiny.toml"));
  cfg.replace(cfg.find("backend = \"cpu\""), 15,
              "backend = \"cuda\"\nsdc_check_every = 1\ndp_bucket_mb = 0.05");
  const std::string path = root + "/tiny_cuda.toml";
  std::ofstream(path) << cfg;
  const std::string env = c.flip ? "GANTRY_TEST_WORKER_FAULT=1:flip_bit:3 " : "";
  const int status = std::system((env + GANTRY_ENGINE_BIN + " run --nproc 2 --zero " +
                                  std::to_string(c.zero) + " --config " + path + " --out " + root +
                                  "/run --max-steps 6 >" + root + "/out.txt 2>" + root + "/err.txt")
                                     .c_str());
  const int code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  const std::string err = slurp(root + "/err.txt");
  const std::string state = c.zero == 0 ? "fp32 parameters" : "bf16 parameter copy";
  EXPECT_NE(err.find("sdc check: every 1 steps, the " + state), std::string::npos) << err;
  if (!c.flip) {
    EXPECT_EQ(code, 0) << err;
    EXPECT_EQ(err.find("silent data corruption"), std::string::npos) << err;
    return;
  }
  EXPECT_EQ(code, 1) << err;
  EXPECT_NE(err.find("step 3: silent data corruption: the 2 replicas' " + state + " (" /* size */),
            std::string::npos)
      << err;
  EXPECT_NE(err.find("disagree with no majority"), std::string::npos) << err;
  EXPECT_NE(err.find("sdc mismatch at step 3, rank 0"), std::string::npos) << err;
  EXPECT_NE(err.find("sdc mismatch at step 3, rank 1"), std::string::npos) << err;
}

INSTANTIATE_TEST_SUITE_P(Zero, SdcTwoGpus,
                         ::testing::Values(Case{0, false}, Case{0, true}, Case{1, false}, Case{1, true}),
                         [](const ::testing::TestParamInfo<Case>& p) {
                           return "zero" + std::to_string(p.param.zero) + (p.param.flip ? "_flip" : "_clean");
                         });

}  // namespace
}  // namespace gantry
