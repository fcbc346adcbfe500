// Timing sweep for the causal flash attention (engine/core/cuda/attention.cu): per shape, the median of 30
// event-timed runs of forward, of the deterministic backward and of the fast backward, each after 5
// warm-ups, on random bf16 data (never zeros). Prints one JSON line per shape, then a short table. Checks
// only what is cheap and says so: non-finite outputs ("nonfinite", both variants), whether a second
// deterministic backward gives the same bytes ("bwd_repeat_identical"), and ‖dqkv_fast − dqkv_det‖ /
// ‖dqkv_det‖ ("fast_vs_det"); correctness against the reference is the test's job
// (tests/engine/core/cuda/attention_test.cpp).
//
//   attention_bench [label]     label (e.g. the build variant) is echoed into every JSON line
//
// FLOPs, the FlashAttention convention: causal forward = 2 products · 2·B·NH·T²·HS / 2; backward = 2.5 ×
// forward.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "engine/core/cuda/attention.cuh"
#include "engine/core/cuda/cuda_check.h"  // CUDA_CHECK
#include "engine/core/fatal.h"            // FatalError

namespace {

constexpr double kPeakTflops = 989.0;  // dense bf16, H100 SXM and H200 (datasheet)
constexpr int kWarmup = 5, kRuns = 30;

// Roughly uniform on [-1.7, 1.7) (unit variance), from a hash of the index and a seed.
__global__ void fill_random_kernel(__nv_bfloat16* x, size_t n, uint32_t seed) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    uint32_t h = static_cast<uint32_t>(i) * 0x9E3779B1u ^ seed ^ static_cast<uint32_t>(i >> 32) * 0x85EBCA77u;
    h ^= h >> 16;
    h *= 0x7FEB352Du;
    h ^= h >> 15;
    h *= 0x846CA68Bu;
    h ^= h >> 16;
    x[i] = __float2bfloat16((static_cast<float>(h >> 8) * (1.0f / 16777216.0f) - 0.5f) * 3.464f);
  }
}

struct Case {
  int B, T, NH, HS;
};

float median(std::vector<float> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

template <typename F>
float time_median_ms(F&& launch) {
  cudaEvent_t start, stop;
  CUDA_CHECK(cudaEventCreate(&start));
  CUDA_CHECK(cudaEventCreate(&stop));
  for (int i = 0; i < kWarmup; ++i) launch();
  std::vector<float> ms(kRuns);
  for (int i = 0; i < kRuns; ++i) {
    CUDA_CHECK(cudaEventRecord(start));
    launch();
    CUDA_CHECK(cudaEventRecord(stop));
    CUDA_CHECK(cudaEventSynchronize(stop));
    CUDA_CHECK(cudaEventElapsedTime(&ms[i], start, stop));
  }
  CUDA_CHECK(cudaEventDestroy(start));
  CUDA_CHECK(cudaEventDestroy(stop));
  return median(ms);
}

std::vector<uint16_t> to_host(const __nv_bfloat16* d, size_t n) {
  std::vector<uint16_t> h(n);
  CUDA_CHECK(cudaMemcpy(h.data(), d, n * 2, cudaMemcpyDeviceToHost));
  return h;
}

float bf16_bits_to_float(uint16_t x) {
  const uint32_t u = static_cast<uint32_t>(x) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// ‖a − b‖ / ‖b‖ of two bf16 vectors.
double rel_diff(const std::vector<uint16_t>& a, const std::vector<uint16_t>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double x = bf16_bits_to_float(a[i]), y = bf16_bits_to_float(b[i]);
    num += (x - y) * (x - y);
    den += y * y;
  }
  return std::sqrt(num / den);
}

size_t count_nonfinite(const std::vector<uint16_t>& v) {
  size_t n = 0;
  for (uint16_t x : v) n += (x & 0x7F80u) == 0x7F80u;  // exponent all ones: inf or NaN
  return n;
}

int run(int argc, char** argv) {
  const std::string label = argc > 1 ? argv[1] : "default";
  int device = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  cudaDeviceProp prop{};
  CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  std::printf("# device: %s, %d SMs\n", prop.name, prop.multiProcessorCount);
  std::printf("# flops: fwd = 4*B*NH*T^2*HS/2 (causal), bwd = 2.5*fwd; peak %.0f TFLOP/s dense bf16\n",
              kPeakTflops);

  const std::vector<Case> cases = {{32, 1024, 12, 64}, {16, 1024, 12, 64}, {32, 1024, 16, 64},
                                   {16, 1024, 16, 64}, {8, 1024, 16, 128}, {4, 4096, 12, 64}};
  struct Row {
    Case c;
    float fwd_ms, bwd_ms, fast_ms;
    double fwd_tf, bwd_tf, fast_tf;
  };
  std::vector<Row> rows;
  for (const Case& c : cases) {
    const int C = c.NH * c.HS;
    const size_t n_qkv = static_cast<size_t>(c.B) * c.T * 3 * C, n_out = static_cast<size_t>(c.B) * c.T * C;
    __nv_bfloat16 *qkv, *out, *dout, *dqkv;
    float *lse, *scratch;
    CUDA_CHECK(cudaMalloc(&qkv, n_qkv * 2));
    CUDA_CHECK(cudaMalloc(&dqkv, n_qkv * 2));
    CUDA_CHECK(cudaMalloc(&out, n_out * 2));
    CUDA_CHECK(cudaMalloc(&dout, n_out * 2));
    CUDA_CHECK(cudaMalloc(&lse, static_cast<size_t>(c.B) * c.NH * c.T * 4));
    CUDA_CHECK(cudaMalloc(&scratch, gantry::attention_backward_scratch_floats(c.B, c.T, c.NH, c.HS) * 4));
    fill_random_kernel<<<1024, 256>>>(qkv, n_qkv, 1234u);
    CUDA_CHECK_LAUNCH();
    fill_random_kernel<<<1024, 256>>>(dout, n_out, 5678u);
    CUDA_CHECK_LAUNCH();

    const float fwd_ms =
        time_median_ms([&] { gantry::attention_forward(out, lse, qkv, c.B, c.T, c.NH, c.HS, nullptr); });
    const float bwd_ms = time_median_ms([&] {
      gantry::attention_backward(dqkv, dout, out, lse, qkv, scratch, c.B, c.T, c.NH, c.HS, nullptr);
    });
    CUDA_CHECK(cudaDeviceSynchronize());
    const std::vector<uint16_t> out_h = to_host(out, n_out), dqkv_h = to_host(dqkv, n_qkv);
    CUDA_CHECK(cudaMemset(dqkv, 0xFF, n_qkv * 2));
    gantry::attention_backward(dqkv, dout, out, lse, qkv, scratch, c.B, c.T, c.NH, c.HS, nullptr);
    CUDA_CHECK(cudaDeviceSynchronize());
    const bool repeat_identical = to_host(dqkv, n_qkv) == dqkv_h;
    size_t nonfinite = count_nonfinite(out_h) + count_nonfinite(dqkv_h);

    const float fast_ms = time_median_ms([&] {
      gantry::attention_backward(dqkv, dout, out, lse, qkv, scratch, c.B, c.T, c.NH, c.HS, nullptr, false);
    });
    CUDA_CHECK(cudaMemset(dqkv, 0xFF, n_qkv * 2));
    gantry::attention_backward(dqkv, dout, out, lse, qkv, scratch, c.B, c.T, c.NH, c.HS, nullptr, false);
    CUDA_CHECK(cudaDeviceSynchronize());
    const std::vector<uint16_t> fast_h = to_host(dqkv, n_qkv);
    nonfinite += count_nonfinite(fast_h);
    const double fast_vs_det = rel_diff(fast_h, dqkv_h);

    const double fwd_flops = 4.0 * c.B * c.NH * static_cast<double>(c.T) * c.T * c.HS / 2.0;
    const double bwd_flops = 2.5 * fwd_flops;
    const double fwd_tf = fwd_flops / (fwd_ms * 1e-3) / 1e12, bwd_tf = bwd_flops / (bwd_ms * 1e-3) / 1e12;
    const double fast_tf = bwd_flops / (fast_ms * 1e-3) / 1e12;
    std::printf(
        "{\"bench\":\"attention\",\"label\":\"%s\",\"device\":\"%s\",\"B\":%d,\"T\":%d,\"NH\":%d,\"HS\":%d,"
        "\"fwd_ms\":%.4f,\"bwd_ms\":%.4f,\"bwd_fast_ms\":%.4f,\"fwd_tflops\":%.1f,\"bwd_tflops\":%.1f,"
        "\"bwd_fast_tflops\":%.1f,\"fwd_frac_peak\":%.3f,\"bwd_frac_peak\":%.3f,\"bwd_fast_frac_peak\":%.3f,"
        "\"fwd_gflop\":%.2f,\"bwd_gflop\":%.2f,"
        "\"flop_formula\":\"fwd=4*B*NH*T^2*HS/2, bwd=2.5*fwd\",\"peak_tflops\":%.0f,\"nonfinite\":%zu,"
        "\"bwd_repeat_identical\":%s,\"fast_vs_det\":%.2e}\n",
        label.c_str(), prop.name, c.B, c.T, c.NH, c.HS, fwd_ms, bwd_ms, fast_ms, fwd_tf, bwd_tf, fast_tf,
        fwd_tf / kPeakTflops, bwd_tf / kPeakTflops, fast_tf / kPeakTflops, fwd_flops / 1e9, bwd_flops / 1e9,
        kPeakTflops, nonfinite, repeat_identical ? "true" : "false", fast_vs_det);
    rows.push_back({c, fwd_ms, bwd_ms, fast_ms, fwd_tf, bwd_tf, fast_tf});

    CUDA_CHECK(cudaFree(qkv));
    CUDA_CHECK(cudaFree(dqkv));
    CUDA_CHECK(cudaFree(out));
    CUDA_CHECK(cudaFree(dout));
    CUDA_CHECK(cudaFree(lse));
    CUDA_CHECK(cudaFree(scratch));
  }

  std::printf("\n%-8s %4s %5s %3s %4s | %8s %8s | %8s %8s | %8s %8s\n", "label", "B", "T", "NH", "HS",
              "fwd ms", "TFLOP/s", "bwd det", "TFLOP/s", "bwd fast", "TFLOP/s");
  for (const Row& r : rows)
    std::printf("%-8s %4d %5d %3d %4d | %8.3f %8.1f | %8.3f %8.1f | %8.3f %8.1f\n", label.c_str(), r.c.B,
                r.c.T, r.c.NH, r.c.HS, r.fwd_ms, r.fwd_tf, r.bwd_ms, r.bwd_tf, r.fast_ms, r.fast_tf);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const gantry::FatalError& e) {
    std::fprintf(stderr, "attention_bench: %s\n", e.what());
    return 1;
  }
}
