// The vocab-parallel embedding and cross-entropy kernels (cuda/vocab_parallel.cuh) on one GPU: at tp 1 they
// are the whole softmax cross-entropy (against the CPU reference), and a row's vocabulary split over tp
// "ranks" (blocks of columns run one after another on this GPU, the gathers being copies into place) gives
// every rank the same loss bits and, put together, the whole gradient. The NCCL gathers between them are the
// 2-GPU test's (tensor_parallel_cuda_test).
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <vector>

#include "engine/core/cpu/ops_cpu.h"
#include "engine/core/cuda/kernels.cuh"
#include "engine/core/cuda/vocab_parallel.cuh"
#include "tests/engine/core/cuda/cuda_test_util.h"

namespace gantry {
namespace {

using namespace testing_support;
constexpr double kBf16Bound = 1e-2;
constexpr double kFp32Bound = 1e-5;

struct Case {
  int rows, V, tp;
};

class VocabParallelCuda : public ::testing::TestWithParam<Case> {};

TEST_P(VocabParallelCuda, CrossEntropyOverTheRanksIsTheWholeOne) {
  GANTRY_REQUIRE_GPU();
  const auto [rows, V, tp] = GetParam();
  const int Vl = V / tp;
  ASSERT_EQ(Vl * tp, V);
  Rng rng{static_cast<uint64_t>(11 + V + tp)};
  auto logits = round_bf16(random_floats(rng, static_cast<size_t>(rows) * V, 4.0));
  std::vector<int32_t> targets(rows);
  for (int32_t& t : targets) t = static_cast<int32_t>(rng.next_u64() % V);
  targets[0] = V - 1;          // the last rank's last column
  targets[rows - 1] = Vl % V;  // the first column of the second rank (of the only one at tp 1)
  const float dloss = 1.0f / rows;
  std::vector<float> probs(logits.size()), ref_losses(rows), ref_dlogits(logits.size());
  softmax_crossentropy_forward(nullptr, probs.data(), ref_losses.data(), logits.data(), targets.data(), rows,
                               V);
  softmax_crossentropy_backward(nullptr, ref_dlogits.data(), probs.data(), targets.data(), dloss, rows, V);

  for (bool write : {false, true}) {
    // Each rank's columns of the logits, (rows, Vl), as its classifier leaves them.
    std::vector<std::unique_ptr<DeviceBuffer<bf16>>> shard;
    for (int r = 0; r < tp; ++r) {
      std::vector<float> mine(static_cast<size_t>(rows) * Vl);
      for (int n = 0; n < rows; ++n)
        std::memcpy(&mine[static_cast<size_t>(n) * Vl], &logits[static_cast<size_t>(n) * V + r * Vl],
                    Vl * sizeof(float));
      shard.push_back(std::make_unique<DeviceBuffer<bf16>>(to_bf16(mine)));
    }
    DeviceBuffer<int32_t> d_targets(targets);
    // What the all-gathers leave on every rank: (tp, rows) maxima, (tp, rows, 2) sums and target logits.
    DeviceBuffer<float> all_max(static_cast<size_t>(tp) * rows), all_part(static_cast<size_t>(tp) * rows * 2);
    for (int r = 0; r < tp; ++r)
      vocab_parallel_row_max_cuda(all_max.get() + static_cast<size_t>(r) * rows, shard[r]->get(), rows, Vl,
                                  nullptr);
    for (int r = 0; r < tp; ++r)
      vocab_parallel_sum_exp_cuda(all_part.get() + static_cast<size_t>(r) * rows * 2, shard[r]->get(),
                                  all_max.get(), d_targets.get(), r * Vl, tp, rows, Vl, nullptr);
    std::vector<std::vector<float>> losses;
    std::vector<float> dlogits(logits.size());
    for (int r = 0; r < tp; ++r) {
      DeviceBuffer<float> d_losses(rows);
      vocab_parallel_loss_cuda(shard[r]->get(), d_losses.get(), all_max.get(), all_part.get(),
                               d_targets.get(), r * Vl, tp, dloss, write, rows, Vl, nullptr);
      losses.push_back(d_losses.download());
      const std::vector<float> got = to_float(shard[r]->download());
      for (int n = 0; n < rows; ++n)
        std::memcpy(&dlogits[static_cast<size_t>(n) * V + r * Vl], &got[static_cast<size_t>(n) * Vl],
                    Vl * sizeof(float));
    }
    for (int r = 0; r < tp; ++r) EXPECT_EQ(losses[r], losses[0]) << "rank " << r << ": the same loss bits";
    EXPECT_LT(rel_error(losses[0], ref_losses), kFp32Bound);
    if (write) {
      EXPECT_LT(rel_error(dlogits, ref_dlogits), kBf16Bound);
    } else {
      EXPECT_EQ(dlogits, logits) << "logits untouched without write_dlogits";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, VocabParallelCuda,
                         ::testing::Values(Case{33, 1000, 1}, Case{33, 1000, 2}, Case{17, 4096, 4},
                                           Case{5, 50304, 1}, Case{5, 50304, 8}, Case{3, 256, 2}),
                         [](const ::testing::TestParamInfo<Case>& i) {
                           return "R" + std::to_string(i.param.rows) + "_V" + std::to_string(i.param.V) +
                                  "_tp" + std::to_string(i.param.tp);
                         });

TEST(VocabParallelCuda, EmbeddingSummedOverTheRanksIsTheWholeOneExactly) {
  GANTRY_REQUIRE_GPU();
  Rng rng{3};
  const int B = 3, T = 17, C = 40, V = 60, N = B * T, tp = 3, Vl = V / tp;
  auto wte = round_bf16(random_floats(rng, V * C)), wpe = round_bf16(random_floats(rng, T * C));
  std::vector<int32_t> tok(N);
  for (int32_t& t : tok) t = static_cast<int32_t>(rng.next_u64() % V);
  DeviceBuffer<bf16> d_wte(to_bf16(wte)), d_wpe(to_bf16(wpe)), d_whole(N * C);
  DeviceBuffer<int32_t> d_tok(tok);
  encoder_forward_cuda(d_whole.get(), d_tok.get(), d_wte.get(), d_wpe.get(), N, T, C, nullptr);
  std::vector<float> sum(static_cast<size_t>(N) * C, 0.0f);
  for (int r = 0; r < tp; ++r) {
    // Rank r's rows of wte only.
    DeviceBuffer<bf16> d_mine(
        to_bf16(std::vector<float>(wte.begin() + r * Vl * C, wte.begin() + (r + 1) * Vl * C)));
    DeviceBuffer<bf16> d_out(N * C);
    vocab_parallel_encoder_forward_cuda(d_out.get(), d_tok.get(), d_mine.get(), d_wpe.get(), r * Vl, Vl, N, T,
                                        C, nullptr);
    const std::vector<float> out = to_float(d_out.download());
    for (size_t i = 0; i < sum.size(); ++i) sum[i] += out[i];
  }
  // Each row comes from its one owner, the others add exact zeros: the all-reduce gives the one-GPU bits.
  EXPECT_EQ(sum, to_float(d_whole.download()));
}

}  // namespace
}  // namespace gantry
