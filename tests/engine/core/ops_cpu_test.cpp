// Finite-difference gradient checks for every CPU reference op. For an op y = f(x) and a fixed random
// projection r, the scalar L = Σ y·r has dL/dx = backward(dout = r). Central differences with step 1e-2
// in fp32 (rounding of the unchanged outputs cancels exactly, so the error is truncation, O(eps²)).
// Tolerance: ‖numeric − analytic‖ / ‖analytic‖ < 2e-3 per gradient.
#include "engine/core/cpu/ops_cpu.h"

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <vector>

#include "engine/core/cpu/thread_pool.h"
#include "engine/core/rng.h"

namespace gantry {
namespace {

constexpr float kEps = 1e-2f;
constexpr double kTolerance = 2e-3;

std::vector<float> random_vec(Rng& rng, size_t n, double scale = 1.0) {
  std::vector<float> v(n);
  for (float& x : v) x = static_cast<float>(scale * rng.normal());
  return v;
}

double dot(const std::vector<float>& a, const std::vector<float>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += static_cast<double>(a[i]) * b[i];
  return s;
}

// ‖numeric − analytic‖ / ‖analytic‖ for dL/dx, where loss() reads x.
double fd_error(std::vector<float>& x, const std::function<double()>& loss,
                const std::vector<float>& analytic) {
  double num2 = 0, den2 = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    const float keep = x[i];
    x[i] = keep + kEps;
    const double up = loss();
    x[i] = keep - kEps;
    const double down = loss();
    x[i] = keep;
    const double numeric = (up - down) / (2.0 * kEps);
    num2 += (numeric - analytic[i]) * (numeric - analytic[i]);
    den2 += static_cast<double>(analytic[i]) * analytic[i];
  }
  EXPECT_GT(den2, 0.0) << "a zero gradient checks nothing";
  return std::sqrt(num2 / den2);
}

TEST(OpsCpu, MatmulGradients) {
  Rng rng{1};
  const int N = 6, C = 10, OC = 7;
  auto inp = random_vec(rng, N * C), w = random_vec(rng, OC * C), bias = random_vec(rng, OC);
  auto r = random_vec(rng, N * OC);
  ThreadPool pool(2);
  std::vector<float> out(N * OC);
  auto loss = [&] {
    matmul_forward(&pool, out.data(), inp.data(), w.data(), bias.data(), N, C, OC);
    return dot(out, r);
  };
  std::vector<float> dinp(N * C, 0), dw(OC * C, 0), db(OC, 0);
  matmul_backward(&pool, dinp.data(), dw.data(), db.data(), r.data(), inp.data(), w.data(), N, C, OC);
  EXPECT_LT(fd_error(inp, loss, dinp), kTolerance);
  EXPECT_LT(fd_error(w, loss, dw), kTolerance);
  EXPECT_LT(fd_error(bias, loss, db), kTolerance);
}

TEST(OpsCpu, MatmulBackwardAccumulates) {
  Rng rng{2};
  const int N = 3, C = 9, OC = 4;
  auto inp = random_vec(rng, N * C), w = random_vec(rng, OC * C), r = random_vec(rng, N * OC);
  std::vector<float> dinp(N * C, 0), dw(OC * C, 0), db(OC, 0);
  matmul_backward(nullptr, dinp.data(), dw.data(), db.data(), r.data(), inp.data(), w.data(), N, C, OC);
  auto once = dw;
  matmul_backward(nullptr, dinp.data(), dw.data(), db.data(), r.data(), inp.data(), w.data(), N, C, OC);
  for (size_t i = 0; i < dw.size(); ++i) EXPECT_FLOAT_EQ(dw[i], 2 * once[i]);
}

TEST(OpsCpu, MatmulSameBitsForAnyThreadCount) {
  Rng rng{3};
  const int N = 37, C = 29, OC = 23;
  auto inp = random_vec(rng, N * C), w = random_vec(rng, OC * C), r = random_vec(rng, N * OC);
  std::vector<float> out1(N * OC), out2(N * OC), dw1(OC * C, 0), dw2(OC * C, 0), dx1(N * C, 0), dx2(N * C, 0);
  ThreadPool one(1), two(2);
  matmul_forward(&one, out1.data(), inp.data(), w.data(), nullptr, N, C, OC);
  matmul_forward(&two, out2.data(), inp.data(), w.data(), nullptr, N, C, OC);
  matmul_backward(&one, dx1.data(), dw1.data(), nullptr, r.data(), inp.data(), w.data(), N, C, OC);
  matmul_backward(&two, dx2.data(), dw2.data(), nullptr, r.data(), inp.data(), w.data(), N, C, OC);
  EXPECT_EQ(out1, out2);
  EXPECT_EQ(dw1, dw2);
  EXPECT_EQ(dx1, dx2);
}

TEST(OpsCpu, LayernormGradients) {
  Rng rng{4};
  const int N = 5, C = 12;
  auto inp = random_vec(rng, N * C, 2.0), w = random_vec(rng, C), b = random_vec(rng, C);
  auto r = random_vec(rng, N * C);
  std::vector<float> out(N * C), mean(N), rstd(N);
  auto loss = [&] {
    layernorm_forward(out.data(), mean.data(), rstd.data(), inp.data(), w.data(), b.data(), N, C);
    return dot(out, r);
  };
  loss();
  std::vector<float> dinp(N * C, 0), dw(C, 0), db(C, 0);
  layernorm_backward(dinp.data(), dw.data(), db.data(), r.data(), inp.data(), w.data(), mean.data(),
                     rstd.data(), N, C);
  EXPECT_LT(fd_error(inp, loss, dinp), kTolerance);
  EXPECT_LT(fd_error(w, loss, dw), kTolerance);
  EXPECT_LT(fd_error(b, loss, db), kTolerance);
}

TEST(OpsCpu, LayernormOutputIsNormalised) {
  Rng rng{5};
  const int N = 3, C = 64;
  auto inp = random_vec(rng, N * C, 5.0);
  std::vector<float> w(C, 1.0f), b(C, 0.0f), out(N * C), mean(N), rstd(N);
  layernorm_forward(out.data(), mean.data(), rstd.data(), inp.data(), w.data(), b.data(), N, C);
  for (int n = 0; n < N; ++n) {
    double m = 0, v = 0;
    for (int c = 0; c < C; ++c) m += out[n * C + c];
    m /= C;
    for (int c = 0; c < C; ++c) v += (out[n * C + c] - m) * (out[n * C + c] - m);
    EXPECT_NEAR(m, 0.0, 1e-5);
    EXPECT_NEAR(v / C, 1.0, 1e-3);
  }
}

TEST(OpsCpu, AttentionGradients) {
  Rng rng{6};
  const int B = 2, T = 5, C = 8, NH = 2;
  auto qkv = random_vec(rng, B * T * 3 * C);
  auto r = random_vec(rng, B * T * C);
  ThreadPool pool(2);
  std::vector<float> out(B * T * C), att(B * NH * T * T);
  auto loss = [&] {
    attention_forward(&pool, out.data(), att.data(), qkv.data(), B, T, C, NH);
    return dot(out, r);
  };
  loss();
  std::vector<float> dqkv(qkv.size(), 0);
  attention_backward(&pool, dqkv.data(), r.data(), qkv.data(), att.data(), B, T, C, NH);
  EXPECT_LT(fd_error(qkv, loss, dqkv), kTolerance);
}

TEST(OpsCpu, AttentionIsCausal) {
  // Changing the last position's k and v must not change any earlier output.
  Rng rng{7};
  const int B = 1, T = 6, C = 8, NH = 2;
  auto qkv = random_vec(rng, B * T * 3 * C);
  std::vector<float> out1(B * T * C), out2(B * T * C), att(B * NH * T * T);
  attention_forward(nullptr, out1.data(), att.data(), qkv.data(), B, T, C, NH);
  for (int c = C; c < 3 * C; ++c) qkv[(T - 1) * 3 * C + c] += 1.0f;
  attention_forward(nullptr, out2.data(), att.data(), qkv.data(), B, T, C, NH);
  for (int i = 0; i < (T - 1) * C; ++i) EXPECT_EQ(out1[i], out2[i]) << i;
  bool last_changed = false;
  for (int i = (T - 1) * C; i < T * C; ++i) last_changed |= out1[i] != out2[i];
  EXPECT_TRUE(last_changed);
}

TEST(OpsCpu, GeluGradientAndValues) {
  Rng rng{8};
  auto inp = random_vec(rng, 40, 2.0), r = random_vec(rng, 40);
  std::vector<float> out(40);
  auto loss = [&] {
    gelu_forward(out.data(), inp.data(), inp.size());
    return dot(out, r);
  };
  std::vector<float> dinp(40);
  gelu_backward(dinp.data(), inp.data(), r.data(), inp.size());
  EXPECT_LT(fd_error(inp, loss, dinp), kTolerance);
  float x = 1.0f, y;
  gelu_forward(&y, &x, 1);
  EXPECT_NEAR(y, 0.8411920, 1e-6);  // 0.5·(1 + tanh(√(2/π)·1.044715))
}

TEST(OpsCpu, EncoderGradients) {
  Rng rng{9};
  const int B = 2, T = 3, C = 4, V = 5;
  std::vector<int32_t> tok = {0, 3, 3, 4, 1, 0};
  auto wte = random_vec(rng, V * C), wpe = random_vec(rng, T * C), r = random_vec(rng, B * T * C);
  std::vector<float> out(B * T * C);
  auto loss = [&] {
    encoder_forward(out.data(), tok.data(), wte.data(), wpe.data(), B, T, C);
    return dot(out, r);
  };
  std::vector<float> dwte(V * C, 0), dwpe(T * C, 0);
  encoder_backward(dwte.data(), dwpe.data(), r.data(), tok.data(), B, T, C);
  // Token 2 never appears: its rows get no gradient, which fd_error's norm comparison also covers.
  EXPECT_LT(fd_error(wte, loss, dwte), kTolerance);
  EXPECT_LT(fd_error(wpe, loss, dwpe), kTolerance);
}

TEST(OpsCpu, SoftmaxCrossEntropyGradientAndValue) {
  Rng rng{10};
  const int N = 4, V = 9;
  auto logits = random_vec(rng, N * V, 3.0);
  std::vector<int32_t> targets = {0, 8, 3, 3};
  std::vector<float> probs(N * V), losses(N);
  auto loss = [&] {
    softmax_crossentropy_forward(nullptr, probs.data(), losses.data(), logits.data(), targets.data(), N, V);
    double s = 0;
    for (float l : losses) s += l;
    return s / N;
  };
  const double base = loss();
  std::vector<float> dlogits(N * V);
  softmax_crossentropy_backward(nullptr, dlogits.data(), probs.data(), targets.data(), 1.0f / N, N, V);
  EXPECT_LT(fd_error(logits, loss, dlogits), kTolerance);
  // Uniform logits give exactly ln V.
  std::vector<float> flat(V, 0.5f), p(V), l(1);
  softmax_crossentropy_forward(nullptr, p.data(), l.data(), flat.data(), targets.data(), 1, V);
  EXPECT_NEAR(l[0], std::log(static_cast<double>(V)), 1e-6);
  EXPECT_GT(base, 0.0);
}

TEST(OpsCpu, SoftmaxCrossEntropyIsFiniteForHugeLogits) {
  std::vector<float> logits = {1000.0f, -1000.0f, 0.0f}, probs(3), losses(1);
  std::vector<int32_t> target = {1};
  softmax_crossentropy_forward(nullptr, probs.data(), losses.data(), logits.data(), target.data(), 1, 3);
  EXPECT_NEAR(losses[0], 2000.0f, 1e-3);
}

}  // namespace
}  // namespace gantry
