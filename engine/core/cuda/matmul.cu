#include "engine/core/cuda/cuda_check.h"
#include "engine/core/cuda/matmul.cuh"

namespace gantry {

// One column-major GEMM D (m×n) = op(A)·op(B) (+ beta·D), as cuBLASLt sees the row-major problem.
struct Matmul::Gemm {
  int kind;  // 0 forward, 1 input gradient, 2 weight gradient: part of the cache key
  bool trans_a, trans_b;
  int m, n, k;
  const void* a;
  int lda;
  const void* b;
  int ldb;
  void* d;
  int ldd;
  cudaDataType_t d_type;
  float beta;
  cublasLtEpilogue_t epilogue;
  const void* bias;
  void* aux;
  int ld_aux;
};

Matmul::Matmul(cudaStream_t stream, size_t workspace_bytes)
    : stream_(stream), workspace_bytes_(workspace_bytes) {
  CUBLAS_CHECK(cublasLtCreate(&handle_));
  CUDA_CHECK(cudaMalloc(&workspace_, workspace_bytes_));
}

Matmul::~Matmul() {
  for (auto& [key, p] : plans_) {
    cublasLtMatrixLayoutDestroy(p.la);
    cublasLtMatrixLayoutDestroy(p.lb);
    cublasLtMatrixLayoutDestroy(p.ld);
    cublasLtMatmulDescDestroy(p.desc);
  }
  if (workspace_) cudaFree(workspace_);
  if (handle_) cublasLtDestroy(handle_);
}

void Matmul::run(const Gemm& g) {
  // Descriptors, layouts and the algorithm depend only on the shape and epilogue: made once per shape,
  // so a step's hundreds of products cost the host one attribute update and one launch each.
  const auto key = std::make_tuple(g.kind, g.m, g.n, g.k, static_cast<int>(g.epilogue));
  auto it = plans_.find(key);
  if (it == plans_.end()) {
    Plan p;
    CUBLAS_CHECK(cublasLtMatmulDescCreate(&p.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const cublasOperation_t ta = g.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N,
                            tb = g.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &g.epilogue,
                                                sizeof g.epilogue));
    if (g.aux) {
      const int64_t ld = g.ld_aux;
      CUBLAS_CHECK(
          cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ld, sizeof ld));
    }
    CUBLAS_CHECK(
        cublasLtMatrixLayoutCreate(&p.la, CUDA_R_16BF, g.trans_a ? g.k : g.m, g.trans_a ? g.m : g.k, g.lda));
    CUBLAS_CHECK(
        cublasLtMatrixLayoutCreate(&p.lb, CUDA_R_16BF, g.trans_b ? g.n : g.k, g.trans_b ? g.k : g.n, g.ldb));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.ld, g.d_type, g.m, g.n, g.ldd));
    // The heuristic needs the pointer attributes set to judge the epilogue; any valid values do.
    if (g.bias) {
      CUBLAS_CHECK(
          cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &g.bias, sizeof g.bias));
    }
    if (g.aux) {
      CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &g.aux,
                                                  sizeof g.aux));
    }
    cublasLtMatmulPreference_t pref;
    CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                      &workspace_bytes_, sizeof workspace_bytes_));
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    CUBLAS_CHECK(
        cublasLtMatmulAlgoGetHeuristic(handle_, p.desc, p.la, p.lb, p.ld, p.ld, pref, 1, &result, &found));
    cublasLtMatmulPreferenceDestroy(pref);
    GANTRY_CHECK(found > 0, "cuBLASLt has no algorithm for m=" + std::to_string(g.m) +
                                " n=" + std::to_string(g.n) + " k=" + std::to_string(g.k) + " epilogue " +
                                std::to_string(int(g.epilogue)));
    p.algo = result.algo;
    it = plans_.emplace(key, p).first;
  }
  Plan& p = it->second;
  if (g.bias) {
    CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &g.bias, sizeof g.bias));
  }
  if (g.aux) {
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &g.aux,
                                                sizeof g.aux));
  }
  const float alpha = 1.0f;
  CUBLAS_CHECK(cublasLtMatmul(handle_, p.desc, &alpha, g.a, p.la, g.b, p.lb, &g.beta, g.d, p.ld, g.d, p.ld,
                              &p.algo, workspace_, workspace_bytes_, stream_));
}

void Matmul::forward(__nv_bfloat16* out, const __nv_bfloat16* inp, const __nv_bfloat16* w,
                     const __nv_bfloat16* bias, int N, int C, int OC, __nv_bfloat16* gelu_pre) {
  GANTRY_CHECK(out && inp && w && N > 0 && C > 0 && OC > 0, "Matmul::forward arguments");
  GANTRY_CHECK(gelu_pre == nullptr || bias != nullptr, "the GELU epilogue is used with a bias");
  // Column-major view: outᵀ (OC×N) = W (stored C×OC, transposed) · inpᵀ (C×N).
  cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_DEFAULT;
  if (gelu_pre) {
    epi = CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
  } else if (bias) {
    epi = CUBLASLT_EPILOGUE_BIAS;
  }
  run({0, true, false, OC, N, C, w, C, inp, C, out, OC, CUDA_R_16BF, 0.0f, epi, bias, gelu_pre, OC});
}

void Matmul::backward_input(__nv_bfloat16* dinp, const __nv_bfloat16* dout, const __nv_bfloat16* w, int N,
                            int C, int OC, const __nv_bfloat16* gelu_pre) {
  GANTRY_CHECK(dinp && dout && w && N > 0 && C > 0 && OC > 0, "Matmul::backward_input arguments");
  // dinpᵀ (C×N) = W (stored C×OC) · doutᵀ (OC×N).
  const cublasLtEpilogue_t epi = gelu_pre ? CUBLASLT_EPILOGUE_DGELU : CUBLASLT_EPILOGUE_DEFAULT;
  run({1, false, false, C, N, OC, w, C, dout, OC, dinp, C, CUDA_R_16BF, 0.0f, epi, nullptr,
       const_cast<__nv_bfloat16*>(gelu_pre), C});
}

void Matmul::backward_weight(float* dw, const __nv_bfloat16* dout, const __nv_bfloat16* inp, int N, int C,
                             int OC) {
  GANTRY_CHECK(dw && dout && inp && N > 0 && C > 0 && OC > 0, "Matmul::backward_weight arguments");
  // dwᵀ (C×OC) += inpᵀ (C×N) · dout (N×OC, stored OC×N and transposed); fp32 output accumulates.
  run({2, false, true, C, OC, N, inp, C, dout, OC, dw, C, CUDA_R_32F, 1.0f, CUBLASLT_EPILOGUE_DEFAULT,
       nullptr, nullptr, 0});
}

}  // namespace gantry
