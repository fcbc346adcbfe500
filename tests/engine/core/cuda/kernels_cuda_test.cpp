// Every CUDA kernel and matmul against the fp32 CPU reference on fresh random inputs, outputs poisoned
// (NaN) before each run. Bounds: ‖out − ref‖/‖ref‖ < 1e-2 for bf16 outputs, < 1e-5 for fp32 outputs
// (fp32 sums of the same bf16-rounded inputs, in another order).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <map>
#include <vector>

#include "engine/core/cpu/ops_cpu.h"
#include "engine/core/cuda/kernels.cuh"
#include "engine/core/cuda/matmul.cuh"
#include "tests/engine/core/cuda/cuda_test_util.h"

namespace gantry {
namespace {

using namespace testing_support;
constexpr double kBf16Bound = 1e-2;
constexpr double kFp32Bound = 1e-5;

TEST(KernelsCuda, EncoderForward) {
  GANTRY_REQUIRE_GPU();
  Rng rng{1};
  const int B = 3, T = 17, C = 40, V = 50, N = B * T;
  auto wte = round_bf16(random_floats(rng, V * C)), wpe = round_bf16(random_floats(rng, T * C));
  std::vector<int32_t> tok(N);
  for (int32_t& t : tok) t = static_cast<int32_t>(rng.next_u64() % V);
  DeviceBuffer<bf16> d_wte(to_bf16(wte)), d_wpe(to_bf16(wpe)), d_out(N * C);
  DeviceBuffer<int32_t> d_tok(tok);
  encoder_forward_cuda(d_out.get(), d_tok.get(), d_wte.get(), d_wpe.get(), N, T, C, nullptr);
  std::vector<float> ref(N * C);
  encoder_forward(ref.data(), tok.data(), wte.data(), wpe.data(), B, T, C);
  EXPECT_LT(rel_error(to_float(d_out.download()), ref), kBf16Bound);
}

TEST(KernelsCuda, EncoderBackwardIsExactSumInPositionOrder) {
  GANTRY_REQUIRE_GPU();
  Rng rng{2};
  const int B = 4, T = 9, C = 24, V = 7, N = B * T;
  std::vector<int32_t> tok(N);
  for (int32_t& t : tok) t = static_cast<int32_t>(rng.next_u64() % V);
  auto dout = round_bf16(random_floats(rng, N * C));
  auto dwte0 = random_floats(rng, V * C), dwpe0 = random_floats(rng, T * C);
  std::map<int, std::vector<int>> buckets;
  for (int i = 0; i < N; ++i) buckets[tok[i]].push_back(i);
  std::vector<int32_t> btok, bstart, pos;
  for (auto& [token, ps] : buckets) {
    btok.push_back(token);
    bstart.push_back(static_cast<int32_t>(pos.size()));
    pos.insert(pos.end(), ps.begin(), ps.end());
  }
  bstart.push_back(static_cast<int32_t>(pos.size()));
  DeviceBuffer<float> d_dwte(dwte0), d_dwpe(dwpe0);
  DeviceBuffer<bf16> d_dout(to_bf16(dout));
  DeviceBuffer<int32_t> d_btok(btok), d_bstart(bstart), d_pos(pos);
  encoder_backward_cuda(d_dwte.get(), d_dwpe.get(), d_dout.get(), d_btok.get(), d_bstart.get(), d_pos.get(),
                        static_cast<int>(btok.size()), B, T, C, nullptr);
  std::vector<float> dwte = dwte0, dwpe = dwpe0;
  encoder_backward(dwte.data(), dwpe.data(), dout.data(), tok.data(), B, T, C);
  EXPECT_LT(rel_error(d_dwte.download(), dwte), kFp32Bound);
  EXPECT_LT(rel_error(d_dwpe.download(), dwpe), kFp32Bound);
}

TEST(KernelsCuda, ResidualLayernormForward) {
  GANTRY_REQUIRE_GPU();
  Rng rng{3};
  const int N = 37, C = 96;
  auto a = round_bf16(random_floats(rng, N * C)), b = round_bf16(random_floats(rng, N * C));
  auto w = round_bf16(random_floats(rng, C)), bias = round_bf16(random_floats(rng, C));
  DeviceBuffer<bf16> d_a(to_bf16(a)), d_b(to_bf16(b)), d_w(to_bf16(w)), d_bias(to_bf16(bias)), d_res(N * C),
      d_out(N * C);
  DeviceBuffer<float> d_mean(N), d_rstd(N);
  residual_layernorm_forward_cuda(d_res.get(), d_out.get(), d_mean.get(), d_rstd.get(), d_a.get(), d_b.get(),
                                  d_w.get(), d_bias.get(), N, C, nullptr);
  std::vector<float> res(N * C);
  residual_forward(res.data(), a.data(), b.data(), res.size());
  res = round_bf16(res);
  std::vector<float> out(N * C), mean(N), rstd(N);
  layernorm_forward(out.data(), mean.data(), rstd.data(), res.data(), w.data(), bias.data(), N, C);
  EXPECT_LT(rel_error(to_float(d_res.download()), res), kBf16Bound);
  EXPECT_LT(rel_error(to_float(d_out.download()), out), kBf16Bound);
  EXPECT_LT(rel_error(d_mean.download(), mean), kFp32Bound);
  EXPECT_LT(rel_error(d_rstd.download(), rstd), kFp32Bound);
}

struct LnBackwardCase {
  int N, C;
  bool accumulate, dsum;
};

class LayernormBackwardCuda : public ::testing::TestWithParam<LnBackwardCase> {};

// More rows than any device's row groups, so warps loop; widths where some lanes hold no columns; dinp
// accumulated or written; with and without the bias sum of the updated dinp.
TEST_P(LayernormBackwardCuda, AgainstCpu) {
  GANTRY_REQUIRE_GPU();
  const auto [N, C, accumulate, with_dsum] = GetParam();
  Rng rng{static_cast<uint64_t>(4 + N + C)};
  auto inp = round_bf16(random_floats(rng, static_cast<size_t>(N) * C, 2.0)),
       w = round_bf16(random_floats(rng, C));
  auto b = random_floats(rng, C), dout = round_bf16(random_floats(rng, static_cast<size_t>(N) * C));
  auto dinp0 = round_bf16(random_floats(rng, static_cast<size_t>(N) * C));
  auto dw0 = random_floats(rng, C), db0 = random_floats(rng, C), ds0 = random_floats(rng, C);
  std::vector<float> out(static_cast<size_t>(N) * C), mean(N), rstd(N);
  layernorm_forward(out.data(), mean.data(), rstd.data(), inp.data(), w.data(), b.data(), N, C);
  DeviceBuffer<bf16> d_dinp(to_bf16(dinp0)), d_dout(to_bf16(dout)), d_inp(to_bf16(inp)), d_w(to_bf16(w));
  DeviceBuffer<float> d_dw(dw0), d_db(db0), d_ds(ds0), d_mean(mean), d_rstd(rstd),
      d_scratch(layernorm_backward_scratch_floats(N, C));
  if (!accumulate) d_dinp.poison();
  layernorm_backward_cuda(d_dinp.get(), d_dw.get(), d_db.get(), with_dsum ? d_ds.get() : nullptr,
                          d_scratch.get(), d_dout.get(), d_inp.get(), d_w.get(), d_mean.get(), d_rstd.get(),
                          N, C, accumulate, nullptr);
  std::vector<float> dinp(dinp0.size(), 0.0f), dw = dw0, db = db0;
  if (accumulate) dinp = dinp0;
  layernorm_backward(dinp.data(), dw.data(), db.data(), dout.data(), inp.data(), w.data(), mean.data(),
                     rstd.data(), N, C);
  const std::vector<float> got = to_float(d_dinp.download());
  EXPECT_LT(rel_error(got, dinp), kBf16Bound);
  EXPECT_LT(rel_error(d_dw.download(), dw), kFp32Bound);
  EXPECT_LT(rel_error(d_db.download(), db), kFp32Bound);
  std::vector<float> ds = ds0;  // Σ of the stored (bf16) dinp: the GPU's own output is the reference's input
  for (int n = 0; n < N; ++n)
    for (int c = 0; c < C; ++c) ds[c] += got[static_cast<size_t>(n) * C + c];
  if (with_dsum) {
    EXPECT_LT(rel_error(d_ds.download(), ds), kFp32Bound);
  } else {
    EXPECT_EQ(d_ds.download(), ds0) << "dsum untouched without a pointer";
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, LayernormBackwardCuda,
                         ::testing::Values(LnBackwardCase{5000, 64, true, false},
                                           LnBackwardCase{5000, 264, true, true},
                                           LnBackwardCase{3000, 768, false, true},
                                           LnBackwardCase{700, 1024, true, true},
                                           LnBackwardCase{37, 96, false, false}),
                         [](const ::testing::TestParamInfo<LnBackwardCase>& i) {
                           return "N" + std::to_string(i.param.N) + "_C" + std::to_string(i.param.C) +
                                  (i.param.accumulate ? "_acc" : "_write") + (i.param.dsum ? "_dsum" : "");
                         });

struct MatmulCase {
  int N, C, OC;
};

class MatmulCuda : public ::testing::TestWithParam<MatmulCase> {};

TEST_P(MatmulCuda, ForwardBackwardAgainstCpu) {
  GANTRY_REQUIRE_GPU();
  const auto [N, C, OC] = GetParam();
  Rng rng{static_cast<uint64_t>(N * 7 + C)};
  auto inp = round_bf16(random_floats(rng, static_cast<size_t>(N) * C));
  auto w = round_bf16(random_floats(rng, static_cast<size_t>(OC) * C, 0.1));
  auto bias = round_bf16(random_floats(rng, OC));
  auto dout = round_bf16(random_floats(rng, static_cast<size_t>(N) * OC));
  auto dw0 = random_floats(rng, static_cast<size_t>(OC) * C);
  DeviceBuffer<bf16> d_inp(to_bf16(inp)), d_w(to_bf16(w)), d_bias(to_bf16(bias)), d_dout(to_bf16(dout));
  DeviceBuffer<bf16> d_out(static_cast<size_t>(N) * OC), d_pre(static_cast<size_t>(N) * OC),
      d_dinp(static_cast<size_t>(N) * C);
  DeviceBuffer<float> d_dw(dw0);
  Matmul mm(nullptr);

  std::vector<float> ref(static_cast<size_t>(N) * OC);
  matmul_forward(nullptr, ref.data(), inp.data(), w.data(), bias.data(), N, C, OC);
  mm.forward(d_out.get(), d_inp.get(), d_w.get(), d_bias.get(), N, C, OC, nullptr);
  EXPECT_LT(rel_error(to_float(d_out.download()), ref), kBf16Bound) << "bias epilogue";

  d_out.poison();
  mm.forward(d_out.get(), d_inp.get(), d_w.get(), d_bias.get(), N, C, OC, d_pre.get());
  std::vector<float> gelu_ref(ref.size());
  gelu_forward(gelu_ref.data(), ref.data(), ref.size());
  EXPECT_LT(rel_error(to_float(d_pre.download()), ref), kBf16Bound) << "GELU epilogue's pre-activation";
  EXPECT_LT(rel_error(to_float(d_out.download()), gelu_ref), kBf16Bound)
      << "GELU epilogue (tanh approximation)";
  {  // bitwise repeatable
    const auto first = d_out.download(), first_pre = d_pre.download();
    d_out.poison();
    mm.forward(d_out.get(), d_inp.get(), d_w.get(), d_bias.get(), N, C, OC, d_pre.get());
    const auto again = d_out.download(), again_pre = d_pre.download();
    EXPECT_EQ(std::memcmp(first.data(), again.data(), first.size() * sizeof(first[0])), 0)
        << "GELU output repeats";
    EXPECT_EQ(std::memcmp(first_pre.data(), again_pre.data(), first_pre.size() * sizeof(first_pre[0])), 0);
  }

  std::vector<float> dinp(static_cast<size_t>(N) * C, 0.0f), dw = dw0;
  matmul_backward(nullptr, dinp.data(), dw.data(), nullptr, dout.data(), inp.data(), w.data(), N, C, OC);
  mm.backward_input(d_dinp.get(), d_dout.get(), d_w.get(), N, C, OC, nullptr);
  EXPECT_LT(rel_error(to_float(d_dinp.download()), dinp), kBf16Bound);
  mm.backward_weight(d_dw.get(), d_dout.get(), d_inp.get(), N, C, OC);
  EXPECT_LT(rel_error(d_dw.download(), dw), kFp32Bound) << "fp32 accumulation into the gradient";

  // DGELU epilogue: d(pre) = (dout·w) ⊙ gelu'(pre), with pre of shape (N, C).
  auto pre = round_bf16(random_floats(rng, static_cast<size_t>(N) * C));
  DeviceBuffer<bf16> d_pre_in(to_bf16(pre));
  d_dinp.poison();
  mm.backward_input(d_dinp.get(), d_dout.get(), d_w.get(), N, C, OC, d_pre_in.get());
  std::vector<float> dgelu(dinp.size());
  gelu_backward(dgelu.data(), pre.data(), dinp.data(), dinp.size());
  EXPECT_LT(rel_error(to_float(d_dinp.download()), dgelu), kBf16Bound) << "DGELU epilogue";
}

INSTANTIATE_TEST_SUITE_P(Shapes, MatmulCuda,
                         ::testing::Values(MatmulCase{64, 64, 192}, MatmulCase{512, 128, 512},
                                           MatmulCase{1024, 256, 64}, MatmulCase{200, 96, 160},
                                           MatmulCase{768, 256, 640}),
                         [](const ::testing::TestParamInfo<MatmulCase>& i) {
                           return "N" + std::to_string(i.param.N) + "_C" + std::to_string(i.param.C) + "_OC" +
                                  std::to_string(i.param.OC);
                         });

TEST(KernelsCuda, BiasBackward) {
  GANTRY_REQUIRE_GPU();
  Rng rng{6};
  const int N = 1000, OC = 304;
  auto dout = round_bf16(random_floats(rng, N * OC));
  auto db0 = random_floats(rng, OC);
  DeviceBuffer<bf16> d_dout(to_bf16(dout));
  DeviceBuffer<float> d_db(db0), d_scratch(bias_backward_scratch_floats(N, OC));
  bias_backward_cuda(d_db.get(), d_scratch.get(), d_dout.get(), N, OC, nullptr);
  std::vector<float> ref = db0;
  for (int n = 0; n < N; ++n)
    for (int o = 0; o < OC; ++o) ref[o] += dout[n * OC + o];
  EXPECT_LT(rel_error(d_db.download(), ref), kFp32Bound);
}

struct ClassifierCase {
  int rows, V;
  bool resident;
};

class ClassifierCuda : public ::testing::TestWithParam<ClassifierCase> {};

TEST_P(ClassifierCuda, LossAndGradient) {
  GANTRY_REQUIRE_GPU();
  const auto [rows, V, resident] = GetParam();
  Rng rng{static_cast<uint64_t>(7 + V)};
  auto logits = round_bf16(random_floats(rng, static_cast<size_t>(rows) * V, 4.0));
  std::vector<int32_t> targets(rows);
  for (int32_t& t : targets) t = static_cast<int32_t>(rng.next_u64() % V);
  targets[0] = V - 1;  // the last column, in the last (partial) vector of a thread
  const float dloss = 1.0f / rows;
  for (bool write : {false, true}) {
    DeviceBuffer<bf16> d_logits(to_bf16(logits));
    DeviceBuffer<float> d_losses(rows);
    DeviceBuffer<int32_t> d_targets(targets);
    classifier_cuda(d_logits.get(), d_losses.get(), d_targets.get(), dloss, write, rows, V, nullptr,
                    resident);
    std::vector<float> probs(logits.size()), losses(rows), dlogits(logits.size());
    softmax_crossentropy_forward(nullptr, probs.data(), losses.data(), logits.data(), targets.data(), rows,
                                 V);
    softmax_crossentropy_backward(nullptr, dlogits.data(), probs.data(), targets.data(), dloss, rows, V);
    EXPECT_LT(rel_error(d_losses.download(), losses), kFp32Bound);
    const std::vector<float> got = to_float(d_logits.download());
    if (write) {
      EXPECT_LT(rel_error(got, dlogits), kBf16Bound);
    } else {
      EXPECT_EQ(got, logits) << "logits untouched without write_dlogits";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, ClassifierCuda,
                         ::testing::Values(ClassifierCase{33, 1003, true}, ClassifierCase{17, 4000, true},
                                           ClassifierCase{17, 4000, false}, ClassifierCase{5, 50304, true},
                                           ClassifierCase{5, 50304, false}, ClassifierCase{3, 65536, true}),
                         [](const ::testing::TestParamInfo<ClassifierCase>& i) {
                           return "R" + std::to_string(i.param.rows) + "_V" + std::to_string(i.param.V) +
                                  (i.param.resident ? "_resident" : "_twopass");
                         });

TEST(KernelsCuda, GlobalNormAndSum) {
  GANTRY_REQUIRE_GPU();
  Rng rng{8};
  const size_t n = 3'000'001;
  auto g = random_floats(rng, n);
  DeviceBuffer<float> d_g(g), d_norm(1), d_scratch(global_norm_scratch_floats(n));
  global_norm_cuda(d_norm.get(), d_scratch.get(), d_g.get(), n, nullptr);
  double ref = 0;
  for (float x : g) ref += static_cast<double>(x) * x;
  EXPECT_LT(rel_error(d_norm.download(), {static_cast<float>(std::sqrt(ref))}), kFp32Bound);
  std::vector<float> small(1000);
  for (size_t i = 0; i < small.size(); ++i) small[i] = static_cast<float>(i % 7);
  DeviceBuffer<float> d_small(small), d_acc(std::vector<float>{5.0f});
  sum_accumulate_cuda(d_acc.get(), d_small.get(), 1000, nullptr);
  float expect = 5.0f;
  for (float x : small) expect += x;  // small integers: every order of summation is exact
  EXPECT_EQ(d_acc.download()[0], expect);
}

// Sequence parallelism's packing: runs of several lengths (one longer than the launch's stride) copied in
// one launch, each element exactly; what no run names is left alone.
TEST(KernelsCuda, CopyRunsMovesEachRunAndNothingElse) {
  GANTRY_REQUIRE_GPU();
  const std::vector<CopyRun> runs = {{.src = 5, .dst = 0, .count = 3},
                                     {.src = 100, .dst = 3, .count = 20000},
                                     {.src = 30000, .dst = 20003, .count = 1}};
  std::vector<float> src(40000);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<float>(i);
  DeviceBuffer<float> d_src(src), d_dst(20010);
  DeviceBuffer<CopyRun> d_runs(runs);
  copy_runs_cuda(d_dst.get(), d_src.get(), d_runs.get(), 3, 20000, nullptr);
  const std::vector<float> got = d_dst.download();
  for (const CopyRun& r : runs) {
    for (uint64_t i = 0; i < r.count; ++i) ASSERT_EQ(got[r.dst + i], src[r.src + i]) << "run at " << r.dst;
  }
  for (size_t i = 20004; i < got.size(); ++i) EXPECT_TRUE(std::isnan(got[i])) << i;  // still poisoned
}

TEST(KernelsCuda, AdamWWithClippingAndDecay) {
  GANTRY_REQUIRE_GPU();
  Rng rng{9};
  const size_t n = 200'000;
  auto p = random_floats(rng, n), g = random_floats(rng, n), m0 = random_floats(rng, n, 0.1);
  auto v0 = random_floats(rng, n, 0.1);
  for (float& x : v0) x = x * x;
  // Two chunks: the first decays, the second does not; the first is split at the chunk limit.
  std::vector<AdamWChunk> chunks;
  const size_t split = 150'000;
  for (size_t off = 0; off < split; off += adamw_chunk_elements())
    chunks.push_back(
        {off, off, off, static_cast<uint32_t>(std::min<size_t>(adamw_chunk_elements(), split - off)), 1});
  chunks.push_back({split, split, split, static_cast<uint32_t>(n - split), 0});
  const float norm = 10.0f, clip = 1.0f, lr = 1e-3f, b1 = 0.9f, b2 = 0.95f, eps = 1e-8f, wd = 0.1f;
  const float c1 = 1 - std::pow(b1, 3.0f), c2 = 1 - std::pow(b2, 3.0f);
  DeviceBuffer<float> d_p(p), d_m(m0), d_v(v0), d_g(g), d_norm(std::vector<float>{norm});
  DeviceBuffer<bf16> d_pb(n);
  DeviceBuffer<AdamWChunk> d_chunks(chunks);
  adamw_cuda(d_p.get(), d_pb.get(), d_m.get(), d_v.get(), d_g.get(), d_norm.get(), d_chunks.get(),
             static_cast<int>(chunks.size()), lr, b1, b2, eps, wd, clip, c1, c2, nullptr);
  std::vector<float> ref = p;
  for (size_t i = 0; i < n; ++i) {
    const float gi = g[i] * (clip / norm);
    const float mi = b1 * m0[i] + (1 - b1) * gi, vi = b2 * v0[i] + (1 - b2) * gi * gi;
    ref[i] -= lr * ((mi / c1) / (std::sqrt(vi / c2) + eps) + (i < split ? wd : 0.0f) * ref[i]);
  }
  EXPECT_LT(rel_error(d_p.download(), ref), kFp32Bound);
  EXPECT_LT(rel_error(to_float(d_pb.download()), ref), kBf16Bound);

  // A non-finite norm leaves everything untouched.
  DeviceBuffer<float> d_p2(p), d_nan(std::vector<float>{NAN});
  adamw_cuda(d_p2.get(), d_pb.get(), d_m.get(), d_v.get(), d_g.get(), d_nan.get(), d_chunks.get(),
             static_cast<int>(chunks.size()), lr, b1, b2, eps, wd, clip, c1, c2, nullptr);
  EXPECT_EQ(d_p2.download(), p);
}

// ZeRO's layout: the chunks update two owned ranges of a full gradient buffer and bf16 copy, with the
// master weights and moments packed in a shard. One range starts at an odd offset (the scalar path).
TEST(KernelsCuda, AdamWOnAShardAndItsSumOfSquares) {
  GANTRY_REQUIRE_GPU();
  Rng rng{11};
  const size_t n = 300'000;
  const std::vector<std::pair<size_t, size_t>> owned = {{1'001, 90'000},
                                                        {200'000, 70'000}};  // (offset, count)
  const size_t shard_n = 160'000;
  auto g = random_floats(rng, n), p = random_floats(rng, shard_n), m0 = random_floats(rng, shard_n, 0.1);
  auto v0 = random_floats(rng, shard_n, 0.1);
  for (float& x : v0) x = x * x;
  std::vector<AdamWChunk> chunks;
  size_t shard_at = 0;
  for (const auto& [offset, count] : owned) {
    for (size_t off = 0; off < count; off += adamw_chunk_elements()) {
      chunks.push_back({offset + off, offset + off, shard_at + off,
                        static_cast<uint32_t>(std::min<size_t>(adamw_chunk_elements(), count - off)), 1});
    }
    shard_at += count;
  }
  const float lr = 1e-3f, b1 = 0.9f, b2 = 0.95f, eps = 1e-8f, wd = 0.1f;
  DeviceBuffer<float> d_p(p), d_m(m0), d_v(v0), d_g(g), d_sum(1), d_scratch(chunks.size());
  DeviceBuffer<bf16> d_pb(n);
  CUDA_CHECK(cudaMemset(d_pb.get(), 0, n * sizeof(bf16)));
  DeviceBuffer<AdamWChunk> d_chunks(chunks);
  const int n_chunks = static_cast<int>(chunks.size());
  chunk_sum_squares_cuda(d_sum.get(), d_scratch.get(), d_g.get(), d_chunks.get(), n_chunks, nullptr);
  double expect_sq = 0;
  for (const auto& [offset, count] : owned) {
    for (size_t i = offset; i < offset + count; ++i) expect_sq += static_cast<double>(g[i]) * g[i];
  }
  EXPECT_NEAR(d_sum.download()[0], expect_sq, 1e-5 * expect_sq);
  sqrt_in_place_cuda(d_sum.get(), nullptr);
  const float norm = d_sum.download()[0];
  adamw_cuda(d_p.get(), d_pb.get(), d_m.get(), d_v.get(), d_g.get(), d_sum.get(), d_chunks.get(), n_chunks,
             lr, b1, b2, eps, wd, /*grad_clip=*/1.0f, 1 - b1, 1 - b2, nullptr);
  std::vector<float> ref = p;
  std::vector<float> ref_bf16(n, 0.0f);
  shard_at = 0;
  for (const auto& [offset, count] : owned) {
    for (size_t k = 0; k < count; ++k) {
      const size_t i = offset + k, j = shard_at + k;
      const float gi = g[i] * (1.0f / norm);
      const float mi = b1 * m0[j] + (1 - b1) * gi, vi = b2 * v0[j] + (1 - b2) * gi * gi;
      ref[j] -= lr * ((mi / (1 - b1)) / (std::sqrt(vi / (1 - b2)) + eps) + wd * ref[j]);
      ref_bf16[i] = ref[j];
    }
    shard_at += count;
  }
  EXPECT_LT(rel_error(d_p.download(), ref), kFp32Bound);
  EXPECT_LT(rel_error(to_float(d_pb.download()), ref_bf16), kBf16Bound)
      << "owned places updated, others untouched";
}

}  // namespace
}  // namespace gantry
