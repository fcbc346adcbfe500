// Checkpoint snapshots on the GPU (cuda/state_snapshot.cuh): the copy holds the state as it was when it
// started, even when the next step's forward, backward and update are enqueued right behind it; and
// asynchronous checkpoints on the GPU write the bytes synchronous ones do. Skips without a device.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <vector>

#include "engine/core/backend.h"
#include "engine/core/checkpoint.h"
#include "engine/core/train.h"
#include "tests/engine/core/cuda/cuda_test_util.h"
#include "tests/engine/core/small_config.h"

namespace gantry {
namespace {

using namespace testing_support;

std::string file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

TEST(StateSnapshotCuda, TheCopyIsTheStateBeforeTheNextUpdate) {
  GANTRY_REQUIRE_GPU();
  const ModelConfig m{.n_layer = 1, .n_head = 2, .n_embd = 32, .vocab_size = 40, .seq_len = 8};
  Result<std::unique_ptr<Backend>> be = backend_create("cuda", m, 2, {});
  ASSERT_TRUE(be.ok()) << be.error();
  Backend& gpu = *be.value();
  Rng rng{11};
  const size_t n = gpu.params().numel();
  std::vector<std::vector<float>> before;
  for (StateBuffer b : {StateBuffer::kParams, StateBuffer::kAdamM, StateBuffer::kAdamV}) {
    before.push_back(random_floats(rng, n));
    if (b != StateBuffer::kParams)
      for (float& x : before.back()) x = std::abs(x);  // v must not be negative
    gpu.write_state(b, 0, n, before.back().data());
  }
  CheckpointSnapshot snap = checkpoint_snapshot_pieces(gpu);
  ASSERT_EQ(snap.floats, 3 * n);
  // Both slots at once (a checkpoint's and an in-memory copy's): each copy has its own memory and stream, and
  // the update waits for both.
  float* host = gpu.snapshot_memory(SnapshotSlot::kCheckpoint, snap.floats);
  float* host2 = gpu.snapshot_memory(SnapshotSlot::kMemoryCopy, snap.floats);
  ASSERT_NE(host, host2);
  gpu.snapshot_start(SnapshotSlot::kCheckpoint, snap.pieces, host);
  gpu.snapshot_start(SnapshotSlot::kMemoryCopy, snap.pieces, host2);
  // The next step, enqueued behind the copy: its update must wait for it.
  std::vector<int32_t> tokens(2 * 8);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int32_t>(i % 40);
  gpu.begin_step(1);
  gpu.forward_backward(tokens.data(), tokens.data(), 2, 1.0f);
  gpu.optimizer_step({.lr = 0.1, .step = 1});
  ASSERT_TRUE(gpu.step_stats().updated);
  gpu.snapshot_wait(SnapshotSlot::kCheckpoint);
  gpu.snapshot_wait(SnapshotSlot::kMemoryCopy);
  for (size_t k = 0; k < 3; ++k) {
    EXPECT_EQ(std::vector<float>(host + k * n, host + (k + 1) * n), before[k]) << "buffer " << k;
    EXPECT_EQ(std::vector<float>(host2 + k * n, host2 + (k + 1) * n), before[k])
        << "memory copy, buffer " << k;
  }
  std::vector<float> after(n);
  gpu.read_state(StateBuffer::kParams, 0, n, after.data());
  EXPECT_NE(after, before[0]) << "the update ran";
}

TEST(StateSnapshotCuda, AsyncCheckpointsWriteTheBytesOfSyncOnes) {
  GANTRY_REQUIRE_GPU();
  Config c = small_config();
  c.train.backend = "cuda";
  c.train.max_steps = 6;
  c.train.checkpoint_every = 2;
  const std::string a = fresh_dir("gpu_async"), s = fresh_dir("gpu_sync");
  ASSERT_TRUE(train_run(c, {.out_dir = a}, nullptr).ok());
  c.train.checkpoint_async = false;
  ASSERT_TRUE(train_run(c, {.out_dir = s}, nullptr).ok());
  for (const char* step : {"step_00000002", "step_00000004", "step_00000006"}) {
    const std::string shard = std::string("/checkpoints/") + step + "/shard_r00000.bin";
    ASSERT_TRUE(std::filesystem::exists(a + shard)) << step;
    EXPECT_EQ(file_bytes(a + shard), file_bytes(s + shard)) << step;
  }
}

}  // namespace
}  // namespace gantry
