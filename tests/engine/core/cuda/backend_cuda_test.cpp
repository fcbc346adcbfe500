// The CUDA backend as a whole against the CPU reference: gradients of one batch, a 50-step loss curve,
// bit-identical repeat runs; and what it reports of itself: phase times, device health.
#include <dlfcn.h>  // to tell whether this machine has NVML, independently of the backend
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <vector>

#include "engine/core/backend.h"
#include "engine/core/cuda/device.h"
#include "engine/core/gpt.h"
#include "engine/core/train.h"
#include "tests/engine/core/cuda/cuda_test_util.h"
#include "tests/engine/core/small_config.h"

namespace gantry {
namespace {

using namespace testing_support;

std::unique_ptr<Backend> make(const std::string& kind, const ModelConfig& m, int B, bool graphs = true) {
  Result<std::unique_ptr<Backend>> be = backend_create(kind, m, B, {.threads = 2, .cuda_graphs = graphs});
  EXPECT_TRUE(be.ok()) << be.error();
  return std::move(be.value());
}

TEST(BackendCuda, GradientsOfOneBatchMatchTheCpuReference) {
  GANTRY_REQUIRE_GPU();
  const ModelConfig m{.n_layer = 2, .n_head = 2, .n_embd = 64, .vocab_size = 96, .seq_len = 32};
  const int B = 4;
  auto cpu = make("cpu", m, B), gpu = make("cuda", m, B);
  std::vector<float> theta(cpu->params().numel());
  gpt_init_params(m, cpu->params(), 5, theta.data());
  cpu->write_state(StateBuffer::kParams, 0, theta.size(), theta.data());
  // The GPU computes with bf16 weights: give the CPU the same rounded values.
  std::vector<float> rounded = round_bf16(theta);
  cpu->write_state(StateBuffer::kParams, 0, rounded.size(), rounded.data());
  gpu->write_state(StateBuffer::kParams, 0, theta.size(), theta.data());
  Rng rng{6};
  std::vector<int32_t> in(B * m.seq_len), tg(B * m.seq_len);
  for (size_t i = 0; i < in.size(); ++i) {
    in[i] = static_cast<int32_t>(rng.next_u64() % m.vocab_size);
    tg[i] = static_cast<int32_t>(rng.next_u64() % m.vocab_size);
  }
  for (Backend* be : {cpu.get(), gpu.get()}) {
    be->zero_grads();
    be->forward_backward(in.data(), tg.data(), B, 1.0f);
    be->optimizer_step({.lr = 0.0, .step = 1});  // lr 0: only to finish the step and get its stats
  }
  const StepStats sc = cpu->step_stats(), sg = gpu->step_stats();
  EXPECT_NEAR(sg.loss, sc.loss, 1e-2 * sc.loss);
  EXPECT_NEAR(sg.grad_norm, sc.grad_norm, 3e-2 * sc.grad_norm);
  std::vector<float> gc(theta.size()), gg(theta.size());
  cpu->read_state(StateBuffer::kGrads, 0, gc.size(), gc.data());
  gpu->read_state(StateBuffer::kGrads, 0, gg.size(), gg.data());
  // bf16 activations through two blocks: each tensor's gradient within 5% normalised error.
  for (const TensorInfo& t : cpu->params().tensors()) {
    std::vector<float> a(gg.begin() + t.offset, gg.begin() + t.offset + t.numel);
    std::vector<float> b(gc.begin() + t.offset, gc.begin() + t.offset + t.numel);
    EXPECT_LT(rel_error(a, b), 5e-2) << t.name;
  }
}

// A vocabulary large enough that the classifier works in two chunks of rows (its logits chunk holds
// ~256 MB of rows, 2,668 at V 50,304; here 3,000 rows in chunks of 1,536 and 1,464): the loss and every
// gradient, dwte's accumulation over the chunks included, against the CPU reference.
TEST(BackendCuda, ClassifierInChunksMatchesTheCpuReference) {
  GANTRY_REQUIRE_GPU();
  const ModelConfig m{.n_layer = 1, .n_head = 2, .n_embd = 64, .vocab_size = 50304, .seq_len = 1000};
  const int B = 3;
  Result<std::unique_ptr<Backend>> c = backend_create("cpu", m, B, {});
  Result<std::unique_ptr<Backend>> g = backend_create("cuda", m, B, {});
  ASSERT_TRUE(c.ok() && g.ok());
  Backend &cpu = *c.value(), &gpu = *g.value();
  std::vector<float> theta(cpu.params().numel());
  gpt_init_params(m, cpu.params(), 7, theta.data());
  std::vector<float> rounded = round_bf16(theta);
  cpu.write_state(StateBuffer::kParams, 0, rounded.size(), rounded.data());
  gpu.write_state(StateBuffer::kParams, 0, theta.size(), theta.data());
  Rng rng{8};
  std::vector<int32_t> in(B * m.seq_len), tg(B * m.seq_len);
  for (size_t i = 0; i < in.size(); ++i) {
    in[i] = static_cast<int32_t>(rng.next_u64() % m.vocab_size);
    tg[i] = static_cast<int32_t>(rng.next_u64() % m.vocab_size);
  }
  for (Backend* be : {&cpu, &gpu}) {
    be->zero_grads();
    be->forward_backward(in.data(), tg.data(), B, 1.0f);
    be->optimizer_step({.lr = 0.0, .step = 1});
  }
  const StepStats sc = cpu.step_stats(), sg = gpu.step_stats();
  EXPECT_NEAR(sg.loss, sc.loss, 1e-2 * sc.loss);
  std::vector<float> gc(theta.size()), gg(theta.size());
  cpu.read_state(StateBuffer::kGrads, 0, gc.size(), gc.data());
  gpu.read_state(StateBuffer::kGrads, 0, gg.size(), gg.data());
  for (const TensorInfo& t : cpu.params().tensors()) {
    std::vector<float> a(gg.begin() + t.offset, gg.begin() + t.offset + t.numel);
    std::vector<float> b(gc.begin() + t.offset, gc.begin() + t.offset + t.numel);
    EXPECT_LT(rel_error(a, b), 5e-2) << t.name;
  }
}

TEST(BackendCuda, StateRoundTripsThroughTheHost) {
  GANTRY_REQUIRE_GPU();
  const ModelConfig m{.n_layer = 1, .n_head = 2, .n_embd = 32, .vocab_size = 40, .seq_len = 8};
  auto gpu = make("cuda", m, 2);
  Rng rng{7};
  for (StateBuffer b : {StateBuffer::kParams, StateBuffer::kAdamM, StateBuffer::kAdamV}) {
    std::vector<float> x = random_floats(rng, gpu->params().numel()), back(x.size());
    gpu->write_state(b, 0, x.size(), x.data());
    gpu->read_state(b, 0, back.size(), back.data());
    EXPECT_EQ(x, back) << state_buffer_name(b);
  }
}

struct Recorder : TrainObserver {
  std::vector<double> losses;
  void on_step(const StepReport& r) override { losses.push_back(r.loss); }
};

TEST(BackendCuda, TinyConfigTracksTheCpuLossCurveFor50Steps) {
  GANTRY_REQUIRE_GPU();
  Result<Config> c = config_load(std::string(GANTRY_SOURCE_DIR "/assets/configs/tiny.toml"));
  ASSERT_TRUE(c.ok()) << c.error();
  Recorder cpu, gpu;
  c->train.backend = "cpu";
  ASSERT_TRUE(train_run(c.value(), {.out_dir = fresh_dir("curve_cpu"), .max_steps = 50}, &cpu).ok());
  c->train.backend = "cuda";
  Result<TrainSummary> s = train_run(c.value(), {.out_dir = fresh_dir("curve_gpu"), .max_steps = 50}, &gpu);
  ASSERT_TRUE(s.ok()) << s.error();
  ASSERT_EQ(gpu.losses.size(), 50u);
  // bf16 compute drifts from the fp32 curve but must follow it: every step within 3%.
  double worst = 0;
  for (size_t i = 0; i < 50; ++i)
    worst = std::max(worst, std::abs(gpu.losses[i] - cpu.losses[i]) / cpu.losses[i]);
  EXPECT_LT(worst, 0.03);
  std::printf("tiny config, 50 steps: worst relative loss gap GPU vs CPU %.4f; final %.4f vs %.4f\n", worst,
              gpu.losses.back(), cpu.losses.back());
}

TEST(BackendCuda, TwoRunsAreBitIdentical) {
  GANTRY_REQUIRE_GPU();
  Config c = small_config();
  c.train.backend = "cuda";
  Recorder a, b;
  Result<TrainSummary> sa = train_run(c, {.out_dir = fresh_dir("det_gpu_a"), .max_steps = 15}, &a);
  Result<TrainSummary> sb = train_run(c, {.out_dir = fresh_dir("det_gpu_b"), .max_steps = 15}, &b);
  ASSERT_TRUE(sa.ok() && sb.ok());
  EXPECT_EQ(a.losses, b.losses);
  EXPECT_EQ(sa->params_xxh64, sb->params_xxh64);
}

TEST(BackendCuda, GraphReplayMatchesPlainLaunches) {
  GANTRY_REQUIRE_GPU();
  Config c = small_config();
  c.train.backend = "cuda";
  Recorder graphs, plain;
  c.train.cuda_graphs = true;
  Result<TrainSummary> sg = train_run(c, {.out_dir = fresh_dir("graphs_on"), .max_steps = 8}, &graphs);
  c.train.cuda_graphs = false;
  Result<TrainSummary> sp = train_run(c, {.out_dir = fresh_dir("graphs_off"), .max_steps = 8}, &plain);
  ASSERT_TRUE(sg.ok() && sp.ok());
  EXPECT_EQ(graphs.losses, plain.losses);
  EXPECT_EQ(sg->params_xxh64, sp->params_xxh64);
}

TEST(BackendCuda, FastModeTracksDeterministicMode) {
  GANTRY_REQUIRE_GPU();
  Config c = small_config();
  c.train.backend = "cuda";
  Recorder det, fast;
  ASSERT_TRUE(train_run(c, {.out_dir = fresh_dir("mode_det"), .max_steps = 10}, &det).ok());
  c.train.deterministic = false;
  ASSERT_TRUE(train_run(c, {.out_dir = fresh_dir("mode_fast"), .max_steps = 10}, &fast).ok());
  ASSERT_EQ(fast.losses.size(), det.losses.size());
  // Only the order of dQ's additions differs: the curves agree to float rounding, amplified over 10 steps.
  for (size_t i = 0; i < det.losses.size(); ++i)
    EXPECT_NEAR(fast.losses[i], det.losses[i], 1e-3 * det.losses[i]);
}

TEST(BackendCuda, ResumeOnGpuIsBitExact) {
  GANTRY_REQUIRE_GPU();
  Config c = small_config();
  c.train.backend = "cuda";
  Recorder straight, first, second;
  const std::string ds = fresh_dir("gpu_resume_s"), dr = fresh_dir("gpu_resume_r");
  Result<TrainSummary> s = train_run(c, {.out_dir = ds}, &straight);
  ASSERT_TRUE(s.ok()) << s.error();
  ASSERT_TRUE(train_run(c, {.out_dir = dr, .max_steps = 10}, &first).ok());
  Result<TrainSummary> r = train_run(c, {.out_dir = dr, .resume = "latest"}, &second);
  ASSERT_TRUE(r.ok()) << r.error();
  first.losses.insert(first.losses.end(), second.losses.begin(), second.losses.end());
  EXPECT_EQ(first.losses, straight.losses);
  EXPECT_EQ(r->params_xxh64, s->params_xxh64);
}

// The GPU's phase times, from events on the stream (inside the captured graph with graphs on), against the
// host's clock around the whole step, for one and two micro-batches a step. The model is large enough that
// the GPU, not the host, sets the step time, so the phases must cover most of it.
TEST(BackendCuda, PhaseTimesCoverTheStep) {
  GANTRY_REQUIRE_GPU();
  const ModelConfig m{.n_layer = 4, .n_head = 8, .n_embd = 512, .vocab_size = 4096, .seq_len = 512};
  const int B = 16;
  Rng rng{12};
  std::vector<int32_t> in(static_cast<size_t>(B) * m.seq_len), tg(in.size());
  for (size_t i = 0; i < in.size(); ++i) {
    in[i] = static_cast<int32_t>(rng.next_u64() % m.vocab_size);
    tg[i] = static_cast<int32_t>(rng.next_u64() % m.vocab_size);
  }
  for (bool graphs : {false, true}) {
    for (int micro : {1, 2}) {
      auto gpu = make("cuda", m, B, graphs);
      std::vector<float> theta(gpu->params().numel());
      gpt_init_params(m, gpu->params(), 5, theta.data());
      gpu->write_state(StateBuffer::kParams, 0, theta.size(), theta.data());
      std::vector<double> coverage;
      for (int step = 0; step < 8; ++step) {
        const auto t0 = std::chrono::steady_clock::now();
        gpu->zero_grads();
        for (int k = 0; k < micro; ++k) gpu->forward_backward(in.data(), tg.data(), B, 1.0f / micro);
        gpu->optimizer_step({.lr = 1e-4, .grad_clip = 1.0, .step = step + 1});
        gpu->step_stats();
        const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        const PhaseTimes p = gpu->phase_times();
        const std::string what = std::string(graphs ? "graphs" : "no graphs") + ", " + std::to_string(micro) +
                                 " micro-batches, step " + std::to_string(step);
        ASSERT_TRUE(p.measured) << what;
        EXPECT_GT(p.forward_s, 0) << what;
        EXPECT_GT(p.backward_s, 0) << what;
        EXPECT_GT(p.optimizer_s, 0) << what;
        // Two products for every forward one, and the classifier; not in the first step, whose forward also
        // waits for the host to plan each product (seen: 86 ms forward, 70 ms backward).
        if (step >= 1) {
          EXPECT_GT(p.backward_s, p.forward_s) << what;
        }
        EXPECT_EQ(p.comm_exposed_s, 0) << what;
        const double sum = p.forward_s + p.backward_s + p.optimizer_s;
        EXPECT_LE(sum, wall * 1.001 + 20e-6) << what << ": phases " << sum << " s, step " << wall << " s";
        if (step >= 2)
          coverage.push_back(sum / wall);  // steps 0 and 1 plan the products and capture the graph
      }
      std::sort(coverage.begin(), coverage.end());
      const double median = coverage[coverage.size() / 2];
      std::printf("%s, %d micro-batch(es): phases cover %.1f%% of the step (median of %zu steps)\n",
                  graphs ? "graphs" : "no graphs", micro, 100 * median, coverage.size());
      EXPECT_GT(median, 0.5);
    }
  }
}

TEST(BackendCuda, DeviceHealthIsPlausible) {
  GANTRY_REQUIRE_GPU();
  const ModelConfig m{.n_layer = 1, .n_head = 2, .n_embd = 64, .vocab_size = 96, .seq_len = 32};
  auto gpu = make("cuda", m, 2);
  const auto t0 = std::chrono::steady_clock::now();
  const DeviceHealth h = gpu->device_health();
  const double first_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_GE(h.device, 0);
  EXPECT_LT(h.device, cuda_device_count());
  EXPECT_GT(h.mem_allocated_bytes, gpu->memory_bytes());  // the cuBLASLt workspace is held too
  EXPECT_EQ(h.mem_peak_bytes, h.mem_allocated_bytes);     // everything is allocated up front
  size_t free_bytes = 0, total_bytes = 0;
  ASSERT_EQ(cudaMemGetInfo(&free_bytes, &total_bytes), cudaSuccess);
  EXPECT_LE(h.mem_allocated_bytes, total_bytes - free_bytes);  // the device counts at least what we hold
  // Where the driver's NVML library is here, every sensor must read, and plausibly.
  void* nvml = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (nvml != nullptr) {
    dlclose(nvml);
    ASSERT_TRUE(h.temperature_celsius && h.sm_clock_hertz && h.power_watts)
        << "NVML is here but gave no readings";
    EXPECT_GT(*h.temperature_celsius, 5);
    EXPECT_LT(*h.temperature_celsius, 120);
    EXPECT_GT(*h.sm_clock_hertz, 100e6);
    EXPECT_LT(*h.sm_clock_hertz, 4e9);
    EXPECT_GT(*h.power_watts, 5);
    EXPECT_LT(*h.power_watts, 2000);
    std::printf("device %d: %.0f °C, SM clock %.0f MHz, %.1f W; %.2f GB held\n", h.device,
                *h.temperature_celsius, *h.sm_clock_hertz / 1e6, *h.power_watts, h.mem_allocated_bytes / 1e9);
  } else {
    EXPECT_FALSE(h.temperature_celsius || h.sm_clock_hertz || h.power_watts);
    std::printf("no NVML here: sensors absent, as they should be\n");
  }
  // Once open, a call is cheap enough for every step: it copies the background thread's last reading.
  const auto t1 = std::chrono::steady_clock::now();
  for (int i = 0; i < 1000; ++i) gpu->device_health();
  const double per_call = std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count() / 1000;
  std::printf("device_health(): first call %.1f ms (opens NVML), then %.2f µs a call\n", first_s * 1e3,
              per_call * 1e6);
  EXPECT_LT(per_call, 100e-6);
}

}  // namespace
}  // namespace gantry
