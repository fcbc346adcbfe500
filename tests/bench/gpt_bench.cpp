// GPT-2 training throughput on one GPU (benchmark, not a test): median step time after warm-up,
// tokens/s, MFU with the formula and peak printed, and memory, as one JSON line per model.
//
//   gpt_bench [--models 124m,350m,774m,1.5b] [--batch N] [--steps 30] [--warmup 10] [--peak h100-sxm]
//             [--graphs 1] [--deterministic 1] [--label TEXT]
//
// Models: GPT-2 124M (12 layers, d 768, micro-batch 32), 350M (24, d 1024, 16), 774M (36, d 1280, 20 heads,
// 32) and 1.5B (48, d 1600, 25 heads, 16); --batch replaces the micro-batch of every model run. A micro-batch
// that does not fit ends the program at the backend's creation (it allocates everything up front: CUDA's out
// of memory error, no JSON line), so a script can step down to the largest that fits.
//
// Beside the step time it prints the backend's own phase times (CUDA events: medians of forward, backward,
// optimizer) and the device's health after the last step (NVML: temperature, SM clock, power). --label is
// echoed into the JSON line, to tell apart runs of one build under different GANTRY_CUDA_* switches.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "engine/core/backend.h"
#include "engine/core/gpt.h"
#include "engine/core/rng.h"
#include "telemetry/flops.h"
#ifdef GANTRY_HAVE_CUDA
#include <cuda_runtime.h>

#include "engine/core/cuda/device.h"
#endif

namespace {

struct Shape {
  const char* name;
  gantry::ModelConfig model;
  int batch;
};

int run(int argc, char** argv) {
  std::string models = "124m,350m", peak_name, label;
  int steps = 30, warmup = 10, graphs = 1, deterministic = 1, batch = 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--models"))
      models = argv[i + 1];
    else if (!std::strcmp(argv[i], "--batch"))
      batch = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--steps"))
      steps = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--warmup"))
      warmup = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--peak"))
      peak_name = argv[i + 1];
    else if (!std::strcmp(argv[i], "--graphs"))
      graphs = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--deterministic"))
      deterministic = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--label"))
      label = argv[i + 1];
    else {
      std::fprintf(
          stderr,
          "unknown flag %s (use --models --batch --steps --warmup --peak --graphs --deterministic --label)\n",
          argv[i]);
      return 2;
    }
  }
#ifndef GANTRY_HAVE_CUDA
  // Parsed, so bad flags still get the usage line.
  (void)steps, (void)warmup, (void)graphs, (void)deterministic, (void)batch;
  std::fprintf(stderr, "gpt_bench: this build has no CUDA backend\n");
  return 1;
#else
  if (gantry::cuda_device_count() == 0) {
    std::fprintf(stderr, "gpt_bench: no CUDA device\n");
    return 1;
  }
  const std::string device = gantry::cuda_device_name(0);
  if (peak_name.empty()) peak_name = device.find("H200") != std::string::npos ? "h200" : "h100-sxm";
  const gantry::DevicePeak peak = gantry::device_peak(peak_name);
  const std::vector<Shape> shapes = {
      {"124m", {.n_layer = 12, .n_head = 12, .n_embd = 768, .vocab_size = 50304, .seq_len = 1024}, 32},
      {"350m", {.n_layer = 24, .n_head = 16, .n_embd = 1024, .vocab_size = 50304, .seq_len = 1024}, 16},
      {"774m", {.n_layer = 36, .n_head = 20, .n_embd = 1280, .vocab_size = 50304, .seq_len = 1024}, 32},
      {"1.5b", {.n_layer = 48, .n_head = 25, .n_embd = 1600, .vocab_size = 50304, .seq_len = 1024}, 16},
  };
  for (const Shape& s : shapes) {
    if (models.find(s.name) == std::string::npos) continue;
    const int T = s.model.seq_len, B = batch > 0 ? batch : s.batch;
    size_t free0 = 0, total = 0;
    cudaMemGetInfo(&free0, &total);
    auto created = gantry::backend_create("cuda", s.model, B,
                                          {.cuda_graphs = graphs != 0, .deterministic = deterministic != 0});
    if (!created.ok()) {
      std::fprintf(stderr, "%s\n", created.error().c_str());
      return 1;
    }
    auto& be = created.value();
    const gantry::TensorTable& table = be->params();
    std::vector<float> theta(table.numel());
    gantry::gpt_init_params(s.model, table, 1, theta.data());
    be->write_state(gantry::StateBuffer::kParams, 0, theta.size(), theta.data());
    gantry::Rng rng{2};
    std::vector<int32_t> in(static_cast<size_t>(B) * T), tg(in.size());
    for (size_t i = 0; i < in.size(); ++i) {
      in[i] = static_cast<int32_t>(rng.next_u64() % s.model.vocab_size);
      tg[i] = static_cast<int32_t>(rng.next_u64() % s.model.vocab_size);
    }
    std::vector<double> ms, fwd_ms, bwd_ms, opt_ms;
    double loss = 0;
    for (int step = 0; step < warmup + steps; ++step) {
      const auto t0 = std::chrono::steady_clock::now();
      be->zero_grads();
      be->forward_backward(in.data(), tg.data(), B, 1.0f);
      be->optimizer_step({.lr = 1e-4, .weight_decay = 0.1, .grad_clip = 1.0, .step = step + 1});
      loss = be->step_stats().loss;  // waits for the step
      const double dt =
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      if (step >= warmup) {
        ms.push_back(dt);
        const gantry::PhaseTimes p = be->phase_times();
        fwd_ms.push_back(p.forward_s * 1e3);
        bwd_ms.push_back(p.backward_s * 1e3);
        opt_ms.push_back(p.optimizer_s * 1e3);
      }
    }
    const gantry::DeviceHealth health = be->device_health();
    auto median_of = [](std::vector<double> v) {
      std::sort(v.begin(), v.end());
      return v[v.size() / 2];
    };
    size_t free1 = 0;
    cudaMemGetInfo(&free1, &total);
    std::sort(ms.begin(), ms.end());
    const double median = ms[ms.size() / 2];
    const double tokens_per_s = B * T / (median / 1e3);
    const double fpt = gantry::flops_per_token(
        {.params = table.numel(), .layers = s.model.n_layer, .width = s.model.n_embd, .seq_len = T});
    const gantry::MfuFigure mfu = gantry::mfu(tokens_per_s, fpt, peak);
    std::printf("# %s\n", gantry::mfu_formula(mfu).c_str());
    std::printf(
        "{\"bench\":\"gpt\",\"model\":\"%s\",\"device\":\"%s\",\"batch\":%d,\"seq\":%d,\"params\":%zu,"
        "\"cuda_graphs\":%s,\"deterministic\":%s,\"step_ms_median\":%.2f,\"step_ms_min\":%.2f,\"tokens_per_"
        "s\":%.0f,\"mfu\":%.4f,\"peak\":\"%s\","
        "\"backend_bytes\":%llu,\"device_used_bytes\":%llu,\"loss\":%.4f,\"fwd_ms\":%.2f,\"bwd_ms\":%.2f,"
        "\"opt_ms\":%.2f,\"temp_c\":%.0f,\"sm_mhz\":%.0f,\"power_w\":%.0f,\"label\":\"%s\"}\n",
        s.name, device.c_str(), B, T, table.numel(), graphs ? "true" : "false",
        deterministic ? "true" : "false", median, ms.front(), tokens_per_s, mfu.ratio, peak_name.c_str(),
        static_cast<unsigned long long>(be->memory_bytes()), static_cast<unsigned long long>(free0 - free1),
        loss, median_of(fwd_ms), median_of(bwd_ms), median_of(opt_ms),
        health.temperature_celsius.value_or(-1), health.sm_clock_hertz.value_or(-1e6) / 1e6,
        health.power_watts.value_or(-1), label.c_str());
    std::fflush(stdout);
  }
  return 0;
#endif
}

}  // namespace

int main(int argc, char** argv) {
  return run(argc, argv);
}
