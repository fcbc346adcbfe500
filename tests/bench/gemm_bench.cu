// Benchmark (issue 19): the experimental Hopper product with fused epilogues (gemm_sm90.cuh) against the
// engine's cuBLASLt calls (Matmul) at the GPT-2 MLP shapes, with a check: normalised error against
// cuBLASLt's output (whole matrix) and against a float64 CPU reference (sampled rows), outputs poisoned
// first (an unwritten element stays NaN). One JSON line per (shape, variant); `wrong` counts failed checks.
//
//   gemm_bench [--reps 20]
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "engine/core/cuda/matmul.cuh"
#include "tests/bench/gemm_sm90.cuh"
#include "tests/bench/gemm_sm90_pp.cuh"

namespace {

using bf16 = __nv_bfloat16;
using gantry::sm90::GemmEpilogue;

#define CK(x)                                                                                 \
  do {                                                                                        \
    cudaError_t e_ = (x);                                                                     \
    if (e_ != cudaSuccess) {                                                                  \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      std::exit(1);                                                                           \
    }                                                                                         \
  } while (0)

std::vector<bf16> random_bf16(size_t n, float scale, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd(0.f, scale);
  std::vector<bf16> v(n);
  for (auto& x : v) x = __float2bfloat16(nd(rng));
  return v;
}
bf16* upload(const std::vector<bf16>& h) {
  bf16* d = nullptr;
  CK(cudaMalloc(&d, h.size() * 2));
  CK(cudaMemcpy(d, h.data(), h.size() * 2, cudaMemcpyHostToDevice));
  return d;
}
std::vector<float> download(const bf16* d, size_t n) {
  std::vector<bf16> h(n);
  CK(cudaMemcpy(h.data(), d, n * 2, cudaMemcpyDeviceToHost));
  std::vector<float> f(n);
  for (size_t i = 0; i < n; ++i) f[i] = __bfloat162float(h[i]);
  return f;
}
size_t nans(const std::vector<float>& v) {
  return static_cast<size_t>(std::count_if(v.begin(), v.end(), [](float x) { return std::isnan(x); }));
}
double rel_err(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double d = static_cast<double>(a[i]) - b[i];
    num += d * d;
    den += static_cast<double>(b[i]) * b[i];
  }
  return std::sqrt(num / std::max(den, 1e-300));
}
double gelu_ref(double x) {
  return 0.5 * x * (1 + std::tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)));
}
double dgelu_ref(double x) {
  const double u = 0.7978845608028654 * (x + 0.044715 * x * x * x), t = std::tanh(u);
  return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * 0.7978845608028654 * (1 + 3 * 0.044715 * x * x);
}

__global__ void transpose_kernel(bf16* out, const bf16* in, int rows, int cols) {  // out (cols, rows)
  __shared__ bf16 tile[32][33];
  const int x = blockIdx.x * 32 + threadIdx.x, y = blockIdx.y * 32 + threadIdx.y;
  for (int j = 0; j < 32; j += 8) {
    if (x < cols && y + j < rows)
      tile[threadIdx.y + j][threadIdx.x] = in[static_cast<size_t>(y + j) * cols + x];
  }
  __syncthreads();
  const int tx = blockIdx.y * 32 + threadIdx.x, ty = blockIdx.x * 32 + threadIdx.y;
  for (int j = 0; j < 32; j += 8) {
    if (tx < rows && ty + j < cols)
      out[static_cast<size_t>(ty + j) * rows + tx] = tile[threadIdx.x][threadIdx.y + j];
  }
}

float time_ms(const std::function<void()>& f, int reps, cudaStream_t s) {
  for (int i = 0; i < 5; ++i) f();
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  std::vector<float> t;
  for (int i = 0; i < reps; ++i) {
    CK(cudaEventRecord(a, s));
    f();
    CK(cudaEventRecord(b, s));
    CK(cudaEventSynchronize(b));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, a, b));
    t.push_back(ms);
  }
  CK(cudaGetLastError());
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

int wrong_total = 0;
void report(const char* shape, const char* variant, int M, int N, int K, float ms, double err_cublas,
            double err_cpu, size_t unwritten, double tol) {
  const bool bad = unwritten > 0 || !(err_cublas < tol) || !(err_cpu < tol);
  wrong_total += bad;
  std::printf(
      "{\"bench\":\"gemm\",\"shape\":\"%s\",\"variant\":\"%s\",\"M\":%d,\"N\":%d,\"K\":%d,\"ms\":%.4f,"
      "\"tflops\":%.1f,"
      "\"err_vs_cublas\":%.2e,\"err_vs_cpu\":%.2e,\"unwritten\":%zu,\"wrong\":%d}\n",
      shape, variant, M, N, K, ms, 2.0 * M * N * K / (ms * 1e9), err_cublas, err_cpu, unwritten, bad ? 1 : 0);
  std::fflush(stdout);
}

void run_shape(const char* name, int M, int N, int K, int reps) {
  cudaStream_t s;
  CK(cudaStreamCreate(&s));
  gantry::Matmul mm(s);
  const size_t MN = static_cast<size_t>(M) * N, MK = static_cast<size_t>(M) * K,
               NK = static_cast<size_t>(N) * K;
  // Forward: x (M, N) = a (M, K) · w (N, K)ᵀ + bias, out = gelu(x).
  const std::vector<bf16> ha = random_bf16(MK, 1.0f, 1), hw = random_bf16(NK, 1.0f / std::sqrt(K), 2),
                          hbias = random_bf16(N, 0.5f, 3);
  bf16 *a = upload(ha), *w = upload(hw), *bias = upload(hbias);
  bf16 *out_ref, *pre_ref, *out, *pre;
  CK(cudaMalloc(&out_ref, MN * 2));
  CK(cudaMalloc(&pre_ref, MN * 2));
  CK(cudaMalloc(&out, MN * 2));
  CK(cudaMalloc(&pre, MN * 2));
  auto poison = [&](bf16* p) { CK(cudaMemsetAsync(p, 0xFF, MN * 2, s)); };
  // Sampled rows for the CPU reference.
  std::vector<int> rows;
  for (int i = 0; i < 48; ++i)
    rows.push_back(static_cast<int>((static_cast<int64_t>(i) * 7919 * 131 + 17) % M));
  auto cpu_rows = [&](const std::vector<bf16>& A, const std::vector<bf16>& B, auto&& f) {
    std::vector<float> ref;
    for (int r : rows) {
      for (int n = 0; n < N; ++n) {
        double acc = 0;
        for (int k = 0; k < K; ++k) {
          acc += static_cast<double>(__bfloat162float(A[static_cast<size_t>(r) * K + k])) *
                 __bfloat162float(B[static_cast<size_t>(n) * K + k]);
        }
        ref.push_back(static_cast<float>(f(r, n, acc)));
      }
    }
    return ref;
  };
  auto pick = [&](const std::vector<float>& full) {
    std::vector<float> v;
    for (int r : rows)
      v.insert(v.end(), full.begin() + static_cast<size_t>(r) * N, full.begin() + (r + 1) * size_t(N));
    return v;
  };

  // cuBLASLt: plain (bias epilogue) and GELU_AUX_BIAS, as the engine calls them.
  poison(out_ref);
  mm.forward(out_ref, a, w, bias, M, K, N, nullptr);
  const float t_plain = time_ms([&] { mm.forward(out_ref, a, w, bias, M, K, N, nullptr); }, reps, s);
  const std::vector<float> plain_ref = download(out_ref, MN);
  const std::vector<float> cpu_pre =
      cpu_rows(ha, hw, [&](int, int n, double acc) { return acc + __bfloat162float(hbias[n]); });
  std::vector<float> cpu_gelu(cpu_pre.size());
  for (size_t i = 0; i < cpu_pre.size(); ++i) cpu_gelu[i] = static_cast<float>(gelu_ref(cpu_pre[i]));
  report(name, "cublaslt_bias", M, N, K, t_plain, 0, rel_err(pick(plain_ref), cpu_pre), nans(plain_ref),
         1e-2);

  poison(out_ref);
  poison(pre_ref);
  mm.forward(out_ref, a, w, bias, M, K, N, pre_ref);
  const float t_gelu = time_ms([&] { mm.forward(out_ref, a, w, bias, M, K, N, pre_ref); }, reps, s);
  const std::vector<float> gelu_cublas = download(out_ref, MN), pre_cublas = download(pre_ref, MN);
  report(name, "cublaslt_gelu_aux_bias", M, N, K, t_gelu, 0, rel_err(pick(gelu_cublas), cpu_gelu),
         nans(gelu_cublas) + nans(pre_cublas), 1e-2);

  // Ping-pong (tests/bench/gemm_sm90_pp.cuh): no clusters (1), clusters of two sharing B by multicast (2),
  // clusters of two each loading its own B (3: the cluster launch alone).
  for (int cl : {1, 2, 3}) {
    gantry::hopper::Gemm g(cl);
    using gantry::hopper::Epilogue;
    const std::string tag = "pp_c" + std::to_string(cl) + "_";
    std::printf("# %s %s: %d CTAs\n", name, tag.c_str(), g.ctas());
    {
      const float t = time_ms([&] { g.run(Epilogue::kNone, out, nullptr, a, w, bias, M, N, K, s); }, reps, s);
      report(name, (tag + "mainloop_only").c_str(), M, N, K, t, 0, 0, 0, 1e-2);
    }
    poison(out);
    if (!g.run(Epilogue::kBias, out, nullptr, a, w, bias, M, N, K, s)) std::printf("# pp kBias refused\n");
    CK(cudaStreamSynchronize(s));
    CK(cudaGetLastError());
    {
      const std::vector<float> o = download(out, MN);
      const float t = time_ms([&] { g.run(Epilogue::kBias, out, nullptr, a, w, bias, M, N, K, s); }, reps, s);
      report(name, (tag + "bias").c_str(), M, N, K, t, rel_err(o, plain_ref), rel_err(pick(o), cpu_pre),
             nans(o), 1e-2);
    }
    poison(out);
    poison(pre);
    g.run(Epilogue::kBiasGelu, out, pre, a, w, bias, M, N, K, s);
    CK(cudaStreamSynchronize(s));
    CK(cudaGetLastError());
    {
      const std::vector<float> o = download(out, MN), p = download(pre, MN);
      const float t = time_ms([&] { g.run(Epilogue::kBiasGelu, out, pre, a, w, bias, M, N, K, s); }, reps, s);
      // Bitwise repeatable: a second run gives the same bits.
      g.run(Epilogue::kBiasGelu, out, pre, a, w, bias, M, N, K, s);
      CK(cudaStreamSynchronize(s));
      const std::vector<float> o2 = download(out, MN);
      const size_t differ = std::memcmp(o.data(), o2.data(), o.size() * sizeof(float)) != 0 ? 1 : 0;
      report(name, (tag + "bias_gelu").c_str(), M, N, K, t,
             std::max(rel_err(o, gelu_cublas), rel_err(p, pre_cublas)),
             std::max(rel_err(pick(o), cpu_gelu), rel_err(pick(p), cpu_pre)), nans(o) + nans(p) + differ,
             1e-2);
    }
  }

  // The cooperative version (tests/bench/gemm_sm90.cuh), no clusters.
  for (int cl : {1}) {
    gantry::sm90::GemmSm90 g(cl);
    const std::string tag = "sm90_c" + std::to_string(cl) + "_";
    {
      const float t =
          time_ms([&] { g.run(GemmEpilogue::kNone, out, nullptr, a, w, bias, M, N, K, s); }, reps, s);
      report(name, (tag + "mainloop_only").c_str(), M, N, K, t, 0, 0, 0, 1e-2);
    }
    poison(out);
    if (!g.run(GemmEpilogue::kBias, out, nullptr, a, w, bias, M, N, K, s)) std::printf("# kBias refused\n");
    CK(cudaStreamSynchronize(s));
    CK(cudaGetLastError());
    {
      const std::vector<float> o = download(out, MN);
      const float t =
          time_ms([&] { g.run(GemmEpilogue::kBias, out, nullptr, a, w, bias, M, N, K, s); }, reps, s);
      report(name, (tag + "bias").c_str(), M, N, K, t, rel_err(o, plain_ref), rel_err(pick(o), cpu_pre),
             nans(o), 1e-2);
    }
    poison(out);
    poison(pre);
    g.run(GemmEpilogue::kBiasGelu, out, pre, a, w, bias, M, N, K, s);
    CK(cudaStreamSynchronize(s));
    {
      const std::vector<float> o = download(out, MN), p = download(pre, MN);
      const float t =
          time_ms([&] { g.run(GemmEpilogue::kBiasGelu, out, pre, a, w, bias, M, N, K, s); }, reps, s);
      report(name, (tag + "bias_gelu").c_str(), M, N, K, t,
             std::max(rel_err(o, gelu_cublas), rel_err(p, pre_cublas)),
             std::max(rel_err(pick(o), cpu_gelu), rel_err(pick(p), cpu_pre)), nans(o) + nans(p), 1e-2);
    }
  }

  // Backward through the GELU: dfch (M, N) = dres (M, K) · wp (K, N), times gelu'(pre). cuBLASLt takes wp as
  // stored (the MLP projection's weight, (C, 4C)); ours takes it transposed, (N, K), made by one small pass.
  const std::vector<bf16> hd = random_bf16(MK, 1.0f, 4), hwp = random_bf16(NK, 1.0f / std::sqrt(K), 5);
  bf16 *dres = upload(hd), *wp = upload(hwp), *wpt = nullptr;
  CK(cudaMalloc(&wpt, NK * 2));
  const dim3 tb(32, 8), tg((N + 31) / 32, (K + 31) / 32);
  transpose_kernel<<<tg, tb, 0, s>>>(wpt, wp, K, N);
  CK(cudaGetLastError());
  const float t_tr = time_ms([&] { transpose_kernel<<<tg, tb, 0, s>>>(wpt, wp, K, N); }, reps, s);
  std::vector<bf16> hwpt(NK);
  CK(cudaMemcpy(hwpt.data(), wpt, NK * 2, cudaMemcpyDeviceToHost));
  size_t tr_bad = 0;
  for (int k = 0; k < K; ++k)
    for (int n = 0; n < N; ++n)
      tr_bad +=
          std::memcmp(&hwpt[static_cast<size_t>(n) * K + k], &hwp[static_cast<size_t>(k) * N + n], 2) != 0;
  report(name, "transpose_wp", K, N, 1, t_tr, 0, 0, tr_bad, 1e-2);

  poison(out_ref);
  mm.backward_input(out_ref, dres, wp, M, N, K, nullptr);
  const float t_bplain = time_ms([&] { mm.backward_input(out_ref, dres, wp, M, N, K, nullptr); }, reps, s);
  report(name, "cublaslt_bwd_plain", M, N, K, t_bplain, 0, 0, nans(download(out_ref, MN)), 1e-2);
  poison(out_ref);
  mm.backward_input(out_ref, dres, wp, M, N, K, pre_cublas.empty() ? nullptr : pre_ref);
  const float t_dgelu = time_ms([&] { mm.backward_input(out_ref, dres, wp, M, N, K, pre_ref); }, reps, s);
  const std::vector<float> dg_cublas = download(out_ref, MN);
  // CPU: rows of dres · wp, times gelu'(pre as cuBLASLt stored it).
  const std::vector<float> cpu_dg = cpu_rows(hd, hwpt, [&](int r, int n, double acc) {
    return acc * dgelu_ref(pre_cublas[static_cast<size_t>(r) * N + n]);
  });
  report(name, "cublaslt_dgelu", M, N, K, t_dgelu, 0, rel_err(pick(dg_cublas), cpu_dg), nans(dg_cublas),
         1e-2);
  for (int cl : {1, 2}) {
    gantry::hopper::Gemm g(cl);
    const std::string tag = "pp_c" + std::to_string(cl) + "_dgelu";
    poison(out);
    g.run(gantry::hopper::Epilogue::kDgelu, out, pre_ref, dres, wpt, nullptr, M, N, K, s);
    CK(cudaStreamSynchronize(s));
    CK(cudaGetLastError());
    const std::vector<float> o = download(out, MN);
    const float t = time_ms(
        [&] { g.run(gantry::hopper::Epilogue::kDgelu, out, pre_ref, dres, wpt, nullptr, M, N, K, s); }, reps,
        s);
    report(name, tag.c_str(), M, N, K, t, rel_err(o, dg_cublas), rel_err(pick(o), cpu_dg), nans(o), 1e-2);
  }
  for (int cl : {1}) {
    gantry::sm90::GemmSm90 g(cl);
    const std::string tag = "sm90_c" + std::to_string(cl) + "_dgelu";
    poison(out);
    g.run(GemmEpilogue::kDgelu, out, pre_ref, dres, wpt, nullptr, M, N, K, s);
    CK(cudaStreamSynchronize(s));
    CK(cudaGetLastError());
    const std::vector<float> o = download(out, MN);
    const float t =
        time_ms([&] { g.run(GemmEpilogue::kDgelu, out, pre_ref, dres, wpt, nullptr, M, N, K, s); }, reps, s);
    report(name, tag.c_str(), M, N, K, t, rel_err(o, dg_cublas), rel_err(pick(o), cpu_dg), nans(o), 1e-2);
  }
  for (bf16* p : {a, w, bias, out_ref, pre_ref, out, pre, dres, wp, wpt}) cudaFree(p);
  cudaStreamDestroy(s);
}

}  // namespace

int main(int argc, char** argv) {
  int reps = 20;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--reps")) reps = std::atoi(argv[i + 1]);
  }
  cudaDeviceProp prop{};
  CK(cudaGetDeviceProperties(&prop, 0));
  std::printf("# device %s, %d SMs; TFLOP/s = 2MNK / median of %d\n", prop.name, prop.multiProcessorCount,
              reps);
  run_shape("124m_fc", 32768, 3072, 768, reps);
  run_shape("350m_fc", 16384, 4096, 1024, reps);
  std::printf("# wrong %d\n", wrong_total);
  return wrong_total ? 1 : 0;
}
