// Timing sweep of the CUDA backend's pieces at GPT-2 shapes (benchmark, not a test): each op's median
// time over repeated launches, its rate (TFLOP/s or GB/s), and how many times one training step runs it,
// so the table adds up to a step-time budget. Rows with 0 per step are alternatives the step does not use
// (the old way of a fused pass), timed for comparison.
//
//   kernels_bench [--model 124m|350m] [--tp T] [--micro B]
// --micro B: sequences per micro-batch (default the model's, 32 at 124M, 16 at 350M).
// --tp T: one tensor-parallel rank's share (heads, the QKV and MLP-up columns, the attention-out and MLP-down
// rows and the vocabulary split T ways; the LayerNorms whole), without the tp all-reduces themselves: where
// a tp rank's step time goes against one GPU's (the classifier's softmax is timed as the one-GPU kernel's
// over V/T columns, not the vocab-parallel one).
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "engine/core/cuda/attention.cuh"
#include "engine/core/cuda/cuda_check.h"
#include "engine/core/cuda/device.h"
#include "engine/core/cuda/kernels.cuh"
#include "engine/core/cuda/matmul.cuh"
#include "engine/core/rng.h"

namespace gantry {
namespace {

template <class T>
T* dev(size_t n, Rng& rng) {
  std::vector<T> host(n);
  for (auto& x : host) {
    if constexpr (std::is_same_v<T, bf16>) {
      x = __float2bfloat16(static_cast<float>(0.5 * rng.normal()));
    } else if constexpr (std::is_same_v<T, float>) {
      x = static_cast<float>(0.5 * rng.normal());
    } else {
      x = static_cast<T>(rng.next_u64() % 1000);
    }
  }
  T* p = nullptr;
  CUDA_CHECK(cudaMalloc(&p, n * sizeof(T)));
  CUDA_CHECK(cudaMemcpy(p, host.data(), n * sizeof(T), cudaMemcpyHostToDevice));
  return p;
}

struct Row {
  std::string op;
  double ms;
  double per_step;
  std::string rate;
};

double time_ms(cudaStream_t s, const std::function<void()>& fn) {
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  for (int i = 0; i < 3; ++i) fn();
  std::vector<float> t;
  for (int i = 0; i < 15; ++i) {
    cudaEventRecord(a, s);
    fn();
    cudaEventRecord(b, s);
    cudaEventSynchronize(b);
    float ms = 0;
    cudaEventElapsedTime(&ms, a, b);
    t.push_back(ms);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

std::string tflops(double flops, double ms) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.0f TFLOP/s", flops / (ms * 1e-3) / 1e12);
  return buf;
}
std::string gbps(double bytes, double ms) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.0f GB/s", bytes / (ms * 1e-3) / 1e9);
  return buf;
}

// The classifier's dwte product of one chunk (dwᵀ (C×V) += xᵀ (C×rows) · dlogits, fp32 out, beta 1: Matmul's
// backward_weight) under each algorithm cuBLASLt's heuristic offers, best first: does another one hide the
// fp32 accumulator's read and write better than the first, which Matmul takes?
void sweep_dwte(cudaStream_t s, float* dwte, const bf16* dlogits, const bf16* x, int rows, int C, int V) {
  cublasLtHandle_t h;
  CUBLAS_CHECK(cublasLtCreate(&h));
  const size_t ws_bytes = 32u << 20;
  void* ws = nullptr;
  CUDA_CHECK(cudaMalloc(&ws, ws_bytes));
  cublasLtMatmulDesc_t desc;
  CUBLAS_CHECK(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t tn = CUBLAS_OP_N, tt = CUBLAS_OP_T;
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &tn, sizeof tn));
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &tt, sizeof tt));
  cublasLtMatrixLayout_t la, lb, ld;
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, C, rows, C));
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, V, rows, V));
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&ld, CUDA_R_32F, C, V, C));
  cublasLtMatmulPreference_t pref;
  CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes,
                                                    sizeof ws_bytes));
  cublasLtMatmulHeuristicResult_t found[16];
  int n = 0;
  CUBLAS_CHECK(cublasLtMatmulAlgoGetHeuristic(h, desc, la, lb, ld, ld, pref, 16, found, &n));
  const float alpha = 1.0f, beta = 1.0f;
  const double flops = 2.0 * rows * C * V;
  for (int i = 0; i < n; ++i) {
    const double ms = time_ms(s, [&] {
      CUBLAS_CHECK(cublasLtMatmul(h, desc, &alpha, x, la, dlogits, lb, &beta, dwte, ld, dwte, ld,
                                  &found[i].algo, ws, ws_bytes, s));
    });
    std::printf("dwte chunk (%d rows) heuristic #%d: %.3f ms, %.0f TFLOP/s, workspace %zu\n", rows, i, ms,
                flops / (ms * 1e-3) / 1e12, found[i].workspaceSize);
  }
  cublasLtMatmulPreferenceDestroy(pref);
  cublasLtMatrixLayoutDestroy(la);
  cublasLtMatrixLayoutDestroy(lb);
  cublasLtMatrixLayoutDestroy(ld);
  cublasLtMatmulDescDestroy(desc);
  cudaFree(ws);
  cublasLtDestroy(h);
}

int run(int argc, char** argv) {
  std::string model = "124m";
  int tp = 1, micro = 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--model")) model = argv[i + 1];
    if (!std::strcmp(argv[i], "--tp")) tp = std::atoi(argv[i + 1]);
    if (!std::strcmp(argv[i], "--micro")) micro = std::atoi(argv[i + 1]);
  }
  if (cuda_device_count() == 0) {
    std::fprintf(stderr, "kernels_bench: no CUDA device\n");
    return 1;
  }
  const bool big = model == "350m";
  const int B = micro > 0 ? micro
                : big     ? 16
                          : 32,
            T = 1024, C = big ? 1024 : 768, NH_all = big ? 16 : 12, L = big ? 24 : 12, V_all = 50304;
  const int N = B * T, HS = C / NH_all;
  if (tp < 1 || NH_all % tp != 0 || V_all % tp != 0) {
    std::fprintf(stderr, "kernels_bench: --tp %d must divide the heads (%d) and the vocabulary (%d)\n", tp,
                 NH_all, V_all);
    return 2;
  }
  // One tp rank's widths: heads, QKV columns (Q3), the attention-out input (Cl), the MLP's width (H4).
  const int NH = NH_all / tp, V = V_all / tp, Q3 = 3 * C / tp, Cl = C / tp, H4 = 4 * C / tp;
  const size_t NC = static_cast<size_t>(N) * C;
  Rng rng{1};
  cudaStream_t s;
  CUDA_CHECK(cudaStreamCreate(&s));
  Matmul mm(s);
  bf16 *x = dev<bf16>(NC, rng), *y = dev<bf16>(NC, rng), *z = dev<bf16>(NC, rng);
  bf16 *big4 = dev<bf16>(NC * 4, rng), *big4b = dev<bf16>(NC * 4, rng), *qkv = dev<bf16>(NC * 3, rng);
  bf16* w = dev<bf16>(static_cast<size_t>(4) * C * C, rng);
  bf16* bias = dev<bf16>(4 * C, rng);
  float *dw = dev<float>(static_cast<size_t>(4) * C * C, rng), *db = dev<float>(4 * C, rng);
  float *mean = dev<float>(N, rng), *rstd = dev<float>(N, rng),
        *lse = dev<float>(static_cast<size_t>(B) * NH * T, rng);
  // The classifier's chunk as the backend sizes it (backend_cuda.cu classifier_region): the backward buffers'
  // shared allocation (10·N·C bf16) or ~256 MB of rows, whichever is more, in chunks of even size.
  const size_t region = std::max<size_t>(10 * NC, static_cast<size_t>((256u << 20) / (V * 2)) * V);
  const int max_rows = static_cast<int>(std::min<size_t>(region / V, N));
  const int n_chunks = (N + max_rows - 1) / max_rows;
  const int chunk = std::min(max_rows, ((N + n_chunks - 1) / n_chunks + 127) / 128 * 128);
  // All N rows of logits at once: only for the one-pass rows below (what fewer dwte passes would save).
  bf16* all_logits = dev<bf16>(static_cast<size_t>(N) * V, rng);
  bf16 *logits = all_logits, *wte = dev<bf16>(static_cast<size_t>(V) * C, rng);
  float *dwte = dev<float>(static_cast<size_t>(V) * C, rng), *losses = dev<float>(N, rng);
  int32_t* targets = dev<int32_t>(N, rng);
  float* scratch =
      dev<float>(std::max({layernorm_backward_scratch_floats(N, C), bias_backward_scratch_floats(N, 4 * C),
                           bias_backward_scratch_floats(N, C), bias_backward_scratch_floats(N, 3 * C),
                           attention_backward_scratch_floats(B, T, NH, HS), size_t{1 << 20}}),
                 rng);
  std::vector<Row> rows;
  auto add = [&](const std::string& op, double per_step, const std::function<void()>& fn) {
    rows.push_back({op, time_ms(s, fn), per_step, ""});
  };
  const double mmf = 2.0 * N * C * C / tp;  // one C×C linear's share
  add("matmul fwd qkv (C→3C)", L, [&] { mm.forward(qkv, x, w, bias, N, C, Q3, nullptr); });
  rows.back().rate = tflops(3 * mmf, rows.back().ms);
  add("matmul fwd proj (C→C)", L, [&] { mm.forward(y, x, w, bias, N, Cl, C, nullptr); });
  rows.back().rate = tflops(mmf, rows.back().ms);
  add("matmul fwd fc+gelu (C→4C)", L, [&] { mm.forward(big4, x, w, bias, N, C, H4, big4b); });
  rows.back().rate = tflops(4 * mmf, rows.back().ms);
  add("matmul fwd fcproj (4C→C)", L, [&] { mm.forward(y, big4, w, bias, N, H4, C, nullptr); });
  rows.back().rate = tflops(4 * mmf, rows.back().ms);
  add("matmul dinp qkv", L, [&] { mm.backward_input(x, qkv, w, N, C, Q3, nullptr); });
  rows.back().rate = tflops(3 * mmf, rows.back().ms);
  add("matmul dinp proj", L, [&] { mm.backward_input(x, y, w, N, Cl, C, nullptr); });
  rows.back().rate = tflops(mmf, rows.back().ms);
  add("matmul dinp fc", L, [&] { mm.backward_input(x, big4, w, N, C, H4, nullptr); });
  rows.back().rate = tflops(4 * mmf, rows.back().ms);
  add("matmul dinp fcproj+dgelu", L, [&] { mm.backward_input(big4b, y, w, N, H4, C, big4); });
  rows.back().rate = tflops(4 * mmf, rows.back().ms);
  add("matmul dw qkv", L, [&] { mm.backward_weight(dw, qkv, x, N, C, Q3); });
  rows.back().rate = tflops(3 * mmf, rows.back().ms);
  add("matmul dw proj", L, [&] { mm.backward_weight(dw, y, x, N, Cl, C); });
  rows.back().rate = tflops(mmf, rows.back().ms);
  add("matmul dw fc", L, [&] { mm.backward_weight(dw, big4, x, N, C, H4); });
  rows.back().rate = tflops(4 * mmf, rows.back().ms);
  add("matmul dw fcproj", L, [&] { mm.backward_weight(dw, y, big4, N, H4, C); });
  rows.back().rate = tflops(4 * mmf, rows.back().ms);
  const double chunks = static_cast<double>(N) / chunk;
  const double cf = 2.0 * chunk * C * V;
  add("classifier matmul fwd (chunk)", chunks,
      [&] { mm.forward(logits, x, wte, nullptr, chunk, C, V, nullptr); });
  rows.back().rate = tflops(cf, rows.back().ms);
  add("classifier staged softmax+xent", chunks,
      [&] { classifier_cuda(logits, losses, targets, 1e-5f, true, chunk, V, s); });
  rows.back().rate = gbps(2.0 * chunk * V * 2, rows.back().ms);
  add("classifier two-pass (chunk)", 0,
      [&] { classifier_cuda(logits, losses, targets, 1e-5f, true, chunk, V, s, false); });
  rows.back().rate = gbps(2.0 * chunk * V * 2, rows.back().ms);
  add("classifier matmul dinp (chunk)", chunks,
      [&] { mm.backward_input(x, logits, wte, chunk, C, V, nullptr); });
  rows.back().rate = tflops(cf, rows.back().ms);
  add("classifier matmul dwte (chunk)", chunks, [&] { mm.backward_weight(dwte, logits, x, chunk, C, V); });
  rows.back().rate = tflops(cf, rows.back().ms);
  // The same products over all N rows in one pass each (not what the step runs: it would hold N × V logits).
  // Against the chunked rows' ms/step: what the chunking costs, dwte's fp32 re-reads included.
  const double nf = 2.0 * N * C * V;
  add("classifier matmul fwd, one pass", 0,
      [&] { mm.forward(all_logits, x, wte, nullptr, N, C, V, nullptr); });
  rows.back().rate = tflops(nf, rows.back().ms);
  add("classifier matmul dinp, one pass", 0,
      [&] { mm.backward_input(x, all_logits, wte, N, C, V, nullptr); });
  rows.back().rate = tflops(nf, rows.back().ms);
  add("classifier matmul dwte, one pass", 0, [&] { mm.backward_weight(dwte, all_logits, x, N, C, V); });
  rows.back().rate = tflops(nf, rows.back().ms);
  const double af = 2.0 * 2.0 * B * NH * static_cast<double>(T) * T * HS / 2;
  add("attention fwd", L, [&] { attention_forward(x, lse, qkv, B, T, NH, HS, s); });
  rows.back().rate = tflops(af, rows.back().ms);
  add("attention bwd", L, [&] { attention_backward(qkv, y, x, lse, qkv, scratch, B, T, NH, HS, s); });
  rows.back().rate = tflops(2.5 * af, rows.back().ms);
  add("residual+layernorm fwd", 2 * L + 1,
      [&] { residual_layernorm_forward_cuda(z, y, mean, rstd, x, y, bias, bias, N, C, s); });
  rows.back().rate = gbps(4.0 * NC * 2, rows.back().ms);
  add("layernorm bwd", 0, [&] {
    layernorm_backward_cuda(z, db, db + C, nullptr, scratch, x, y, bias, mean, rstd, N, C, true, s);
  });
  rows.back().rate = gbps(4.0 * NC * 2, rows.back().ms);
  add("layernorm bwd + bias sum", 2 * L + 1, [&] {
    layernorm_backward_cuda(z, db, db + C, db + 2 * C, scratch, x, y, bias, mean, rstd, N, C, true, s);
  });
  rows.back().rate = gbps(4.0 * NC * 2, rows.back().ms);
  add("bias bwd (4C)", L, [&] { bias_backward_cuda(db, scratch, big4, N, H4, s); });
  rows.back().rate = gbps(4.0 * NC * 2, rows.back().ms);
  add("bias bwd (C)", 0, [&] { bias_backward_cuda(db, scratch, x, N, C, s); });
  rows.back().rate = gbps(1.0 * NC * 2, rows.back().ms);
  add("bias bwd (3C)", L, [&] { bias_backward_cuda(db, scratch, qkv, N, Q3, s); });
  rows.back().rate = gbps(3.0 * NC * 2, rows.back().ms);

  sweep_dwte(s, dwte, logits, x, chunk, C, V);
  std::printf("%-34s %9s %8s %10s  %s\n", "op", "ms", "x/step", "ms/step", "rate");
  double total = 0;
  for (const Row& r : rows) {
    std::printf("%-34s %9.3f %8.1f %10.2f  %s\n", r.op.c_str(), r.ms, r.per_step, r.ms * r.per_step,
                r.rate.c_str());
    total += r.ms * r.per_step;
  }
  std::printf("%-34s %9s %8s %10.2f  (%s, B %d, tp %d, %s; classifier chunks of %d rows, %d a step)\n",
              "sum of the above", "", "", total, model.c_str(), B, tp, cuda_device_name(0).c_str(), chunk,
              n_chunks);
  return 0;
}

}  // namespace
}  // namespace gantry

int main(int argc, char** argv) {
  return gantry::run(argc, argv);
}
