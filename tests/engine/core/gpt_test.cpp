// The whole model on the CPU backend: parameter layout and a finite-difference gradient check per tensor.
#include "engine/core/gpt.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "engine/core/backend.h"
#include "engine/core/rng.h"

namespace gantry {
namespace {

TEST(Gpt, Gpt2SmallParameterCountMatchesLlmC) {
  ModelConfig m{.n_layer = 12, .n_head = 12, .n_embd = 768, .vocab_size = 50304, .seq_len = 1024};
  TensorTable t = gpt_param_table(m);
  EXPECT_EQ(t.numel(), 124475904u);  // llm.c's count for GPT-2 124M with the padded vocabulary
  EXPECT_EQ(t.size(), 2u + 12u * 12u + 2u);
}

TEST(Gpt, TableIsContiguousAndBlockOrdered) {
  ModelConfig m{.n_layer = 3, .n_head = 2, .n_embd = 8, .vocab_size = 11, .seq_len = 5};
  TensorTable t = gpt_param_table(m);
  size_t expect = 0;
  int last_layer = -1;
  for (const TensorInfo& ti : t.tensors()) {
    EXPECT_EQ(ti.offset, expect) << ti.name;
    expect += ti.numel;
    if (ti.layer >= 0) {
      EXPECT_GE(ti.layer, last_layer) << "blocks must be contiguous ranges";
      last_layer = ti.layer;
    }
    EXPECT_EQ(ti.decay, ti.shape.size() == 2) << ti.name << ": decay on matrices only";
  }
  EXPECT_EQ(expect, t.numel());
  EXPECT_EQ(t.at("h.1.attn.qkv.weight").shape, (std::vector<int64_t>{24, 8}));
  EXPECT_EQ(t.index_of_offset(t.at("h.2.mlp.fc.bias").offset + 3), 2u + 2u * 12u + 9u);
}

TEST(Gpt, InitIsDeterministicAndScaled) {
  ModelConfig m{.n_layer = 4, .n_head = 2, .n_embd = 32, .vocab_size = 50, .seq_len = 16};
  TensorTable t = gpt_param_table(m);
  std::vector<float> a(t.numel()), b(t.numel());
  gpt_init_params(m, t, 7, a.data());
  gpt_init_params(m, t, 7, b.data());
  EXPECT_EQ(a, b);
  auto stddev = [&](const std::string& name) {
    const TensorInfo& ti = t.at(name);
    double s = 0;
    for (size_t i = 0; i < ti.numel; ++i) s += a[ti.offset + i] * a[ti.offset + i];
    return std::sqrt(s / ti.numel);
  };
  EXPECT_NEAR(stddev("wte"), 0.02, 0.002);
  EXPECT_NEAR(stddev("h.0.mlp.proj.weight"), 0.02 / std::sqrt(8.0), 0.001);
  EXPECT_EQ(a[t.at("h.0.ln1.weight").offset], 1.0f);
  EXPECT_EQ(a[t.at("h.0.attn.qkv.bias").offset], 0.0f);
}

// For every tensor, along d = ĝ/2 + random/2 (unit norm, restricted to that tensor), the central
// difference of the loss must equal g·d. Step 1e-2 on a unit direction; tolerance 1e-2 relative,
// covering fp32 rounding of the loss (~3e-7 on ~3.5, divided by 2e-2).
TEST(Gpt, WholeModelGradientCheckPerTensor) {
  ModelConfig m{.n_layer = 2, .n_head = 2, .n_embd = 16, .vocab_size = 32, .seq_len = 8};
  const int B = 3;
  auto be = backend_cpu_create(m, B, 2);
  const TensorTable& table = be->params();
  std::vector<float> theta(table.numel());
  gpt_init_params(m, table, 11, theta.data());
  // Larger than GPT-2's init so every path (attention scores, norms) carries a visible gradient.
  Rng rng{12};
  for (float& x : theta) x += static_cast<float>(0.2 * rng.normal());
  be->write_state(StateBuffer::kParams, 0, theta.size(), theta.data());

  std::vector<int32_t> in(B * m.seq_len), tg(B * m.seq_len);
  for (size_t i = 0; i < in.size(); ++i) {
    in[i] = static_cast<int32_t>(rng.next_u64() % m.vocab_size);
    tg[i] = static_cast<int32_t>(rng.next_u64() % m.vocab_size);
  }
  be->zero_grads();
  be->forward_backward(in.data(), tg.data(), B, 1.0f);
  std::vector<float> grad(table.numel());
  be->read_state(StateBuffer::kGrads, 0, grad.size(), grad.data());

  const double eps = 1e-2;
  for (const TensorInfo& t : table.tensors()) {
    double gnorm = 0;
    for (size_t i = 0; i < t.numel; ++i) gnorm += grad[t.offset + i] * grad[t.offset + i];
    gnorm = std::sqrt(gnorm);
    ASSERT_GT(gnorm, 0.0) << t.name << " has no gradient";
    std::vector<double> d(t.numel);
    double dn = 0;
    for (size_t i = 0; i < t.numel; ++i) {
      d[i] = rng.normal();
      dn += d[i] * d[i];
    }
    double norm = 0;
    for (size_t i = 0; i < t.numel; ++i) {
      d[i] = 0.5 * grad[t.offset + i] / gnorm + 0.5 * d[i] / std::sqrt(dn);
      norm += d[i] * d[i];
    }
    double analytic = 0;
    for (size_t i = 0; i < t.numel; ++i) {
      d[i] /= std::sqrt(norm);
      analytic += grad[t.offset + i] * d[i];
    }
    auto loss_at = [&](double s) {
      std::vector<float> p = theta;
      for (size_t i = 0; i < t.numel; ++i)
        p[t.offset + i] = static_cast<float>(theta[t.offset + i] + s * d[i]);
      be->write_state(StateBuffer::kParams, 0, p.size(), p.data());
      return static_cast<double>(be->forward_loss(in.data(), tg.data(), B));
    };
    const double numeric = (loss_at(eps) - loss_at(-eps)) / (2 * eps);
    EXPECT_NEAR(numeric, analytic, 1e-2 * std::abs(analytic) + 1e-5) << t.name;
  }
}

TEST(Gpt, GradScaleAndAccumulation) {
  // Two half-scaled passes over the same batch accumulate to one full pass.
  ModelConfig m{.n_layer = 1, .n_head = 2, .n_embd = 8, .vocab_size = 16, .seq_len = 4};
  auto be = backend_cpu_create(m, 2, 1);
  std::vector<float> theta(be->params().numel());
  gpt_init_params(m, be->params(), 3, theta.data());
  be->write_state(StateBuffer::kParams, 0, theta.size(), theta.data());
  std::vector<int32_t> in = {1, 2, 3, 4, 5, 6, 7, 8}, tg = {2, 3, 4, 5, 6, 7, 8, 9};
  std::vector<float> full(theta.size()), halves(theta.size());
  be->zero_grads();
  be->forward_backward(in.data(), tg.data(), 2, 1.0f);
  be->read_state(StateBuffer::kGrads, 0, full.size(), full.data());
  be->zero_grads();
  be->forward_backward(in.data(), tg.data(), 2, 0.5f);
  be->forward_backward(in.data(), tg.data(), 2, 0.5f);
  be->read_state(StateBuffer::kGrads, 0, halves.size(), halves.data());
  for (size_t i = 0; i < full.size(); ++i) EXPECT_NEAR(halves[i], full[i], 1e-6f * (1 + std::abs(full[i])));
}

TEST(Gpt, AdamWDecaysMatricesOnly) {
  ModelConfig m{.n_layer = 1, .n_head = 1, .n_embd = 4, .vocab_size = 8, .seq_len = 2};
  auto be = backend_cpu_create(m, 1, 1);
  const TensorTable& t = be->params();
  std::vector<float> ones(t.numel(), 1.0f);
  be->write_state(StateBuffer::kParams, 0, ones.size(), ones.data());
  be->zero_grads();  // zero gradient: only decay moves parameters
  be->optimizer_step({.lr = 0.1, .weight_decay = 0.5, .step = 1});
  std::vector<float> p(t.numel());
  be->read_state(StateBuffer::kParams, 0, p.size(), p.data());
  EXPECT_FLOAT_EQ(p[t.at("wte").offset], 1.0f - 0.1f * 0.5f);
  EXPECT_FLOAT_EQ(p[t.at("h.0.attn.qkv.weight").offset], 0.95f);
  EXPECT_FLOAT_EQ(p[t.at("h.0.attn.qkv.bias").offset], 1.0f);
  EXPECT_FLOAT_EQ(p[t.at("lnf.weight").offset], 1.0f);
}

}  // namespace
}  // namespace gantry
