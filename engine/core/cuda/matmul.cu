#include <cstdlib>

#include "engine/core/cuda/cuda_check.h"
#include "engine/core/cuda/gemm_sm90.cuh"
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

namespace {

// out (cols, rows) = in (rows, cols)ᵀ, bf16: the weight our product takes K-major (gemm_sm90.cuh).
__global__ void transpose_bf16_kernel(__nv_bfloat16* out, const __nv_bfloat16* in, int rows, int cols) {
  __shared__ __nv_bfloat16 tile[32][33];
  const int x = blockIdx.x * 32 + threadIdx.x, y = blockIdx.y * 32 + threadIdx.y;
  for (int j = 0; j < 32; j += 8) {
    if (x < cols && y + j < rows) tile[threadIdx.y + j][threadIdx.x] = in[static_cast<size_t>(y + j) * cols + x];
  }
  __syncthreads();
  const int tx = blockIdx.y * 32 + threadIdx.x, ty = blockIdx.x * 32 + threadIdx.y;
  for (int j = 0; j < 32; j += 8) {
    if (tx < rows && ty + j < cols) out[static_cast<size_t>(ty + j) * rows + tx] = tile[threadIdx.x][threadIdx.y + j];
  }
}

}  // namespace

Matmul::Matmul(cudaStream_t stream, size_t workspace_bytes) : stream_(stream), workspace_bytes_(workspace_bytes) {
  CUBLAS_CHECK(cublasLtCreate(&handle_));
  CUDA_CHECK(cudaMalloc(&workspace_, workspace_bytes_));
  // On Hopper the GELU forward product is our own ping-pong kernel (gemm_sm90.cuh) instead of cuBLASLt's
  // GELU_AUX_BIAS epilogue (issue 19: 9-10 % faster alone). GANTRY_CUDA_SM90_GEMM: 0 cuBLASLt for all; 1
  // (default) the GELU forward; 2 also the DGELU input gradient; 3 and 4 as 1 and 2 with clusters of two
  // CTAs sharing the B tile (experiments: slower, docs/PERF.md).
  const char* e = std::getenv("GANTRY_CUDA_SM90_GEMM");
  int dev = 0, major = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
  sm90_mode_ = major == 9 ? (e != nullptr ? std::atoi(e) : 1) : 0;
  if (sm90_mode_ > 0) sm90_ = std::make_unique<hopper::Gemm>(sm90_mode_ >= 3 ? 2 : 1);
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
    const cublasOperation_t ta = g.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, tb = g.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
    CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &g.epilogue, sizeof g.epilogue));
    if (g.aux) {
      const int64_t ld = g.ld_aux;
      CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ld, sizeof ld));
    }
    CUBLAS_CHECK(
        cublasLtMatrixLayoutCreate(&p.la, CUDA_R_16BF, g.trans_a ? g.k : g.m, g.trans_a ? g.m : g.k, g.lda));
    CUBLAS_CHECK(
        cublasLtMatrixLayoutCreate(&p.lb, CUDA_R_16BF, g.trans_b ? g.n : g.k, g.trans_b ? g.k : g.n, g.ldb));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.ld, g.d_type, g.m, g.n, g.ldd));
    // The heuristic needs the pointer attributes set to judge the epilogue; any valid values do.
    if (g.bias) {
      CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &g.bias, sizeof g.bias));
    }
    if (g.aux) {
      CUBLAS_CHECK(
          cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &g.aux, sizeof g.aux));
    }
    cublasLtMatmulPreference_t pref;
    CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                      &workspace_bytes_, sizeof workspace_bytes_));
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    CUBLAS_CHECK(cublasLtMatmulAlgoGetHeuristic(handle_, p.desc, p.la, p.lb, p.ld, p.ld, pref, 1, &result, &found));
    cublasLtMatmulPreferenceDestroy(pref);
    GANTRY_CHECK(found > 0, "cuBLASLt has no algorithm for m=" + std::to_string(g.m) + " n=" + std::to_string(g.n) +
                                " k=" + std::to_string(g.k) + " epilogue " + std::to_string(int(g.epilogue)));
    p.algo = result.algo;
    it = plans_.emplace(key, p).first;
  }
  Plan& p = it->second;
  if (g.bias) {
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &g.bias, sizeof g.bias));
  }
  if (g.aux) {
    CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &g.aux, sizeof g.aux));
  }
  const float alpha = 1.0f;
  CUBLAS_CHECK(cublasLtMatmul(handle_, p.desc, &alpha, g.a, p.la, g.b, p.lb, &g.beta, g.d, p.ld, g.d, p.ld, &p.algo,
                              workspace_, workspace_bytes_, stream_));
}

void Matmul::forward(__nv_bfloat16* out, const __nv_bfloat16* inp, const __nv_bfloat16* w, const __nv_bfloat16* bias,
                     int N, int C, int OC, __nv_bfloat16* gelu_pre) {
  GANTRY_CHECK(out && inp && w && N > 0 && C > 0 && OC > 0, "Matmul::forward arguments");
  GANTRY_CHECK(gelu_pre == nullptr || bias != nullptr, "the GELU epilogue is used with a bias");
  if (gelu_pre != nullptr && sm90_ != nullptr &&
      sm90_->run(hopper::Epilogue::kBiasGelu, out, gelu_pre, inp, w, bias, N, OC, C, stream_)) {
    return;
  }
  // Column-major view: outᵀ (OC×N) = W (stored C×OC, transposed) · inpᵀ (C×N).
  cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_DEFAULT;
  if (gelu_pre) {
    epi = CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
  } else if (bias) {
    epi = CUBLASLT_EPILOGUE_BIAS;
  }
  run({0, true, false, OC, N, C, w, C, inp, C, out, OC, CUDA_R_16BF, 0.0f, epi, bias, gelu_pre, OC});
}

void Matmul::backward_input(__nv_bfloat16* dinp, const __nv_bfloat16* dout, const __nv_bfloat16* w, int N, int C,
                            int OC, const __nv_bfloat16* gelu_pre) {
  GANTRY_CHECK(dinp && dout && w && N > 0 && C > 0 && OC > 0, "Matmul::backward_input arguments");
  // Ours takes W transposed, (C, OC), made in the cuBLASLt workspace (idle while ours runs; one stream).
  if (gelu_pre != nullptr && sm90_ != nullptr && sm90_mode_ % 2 == 0 && sm90_->supports(N, C, OC) &&
      static_cast<size_t>(C) * OC * sizeof(__nv_bfloat16) <= workspace_bytes_) {
    auto* wt = static_cast<__nv_bfloat16*>(workspace_);
    transpose_bf16_kernel<<<dim3((C + 31) / 32, (OC + 31) / 32), dim3(32, 8), 0, stream_>>>(wt, w, OC, C);
    CUDA_CHECK(cudaGetLastError());
    GANTRY_CHECK(sm90_->run(hopper::Epilogue::kDgelu, dinp, const_cast<__nv_bfloat16*>(gelu_pre), dout, wt, nullptr,
                            N, C, OC, stream_),
                 "hopper::Gemm DGELU launch");
    return;
  }
  // dinpᵀ (C×N) = W (stored C×OC) · doutᵀ (OC×N).
  const cublasLtEpilogue_t epi = gelu_pre ? CUBLASLT_EPILOGUE_DGELU : CUBLASLT_EPILOGUE_DEFAULT;
  run({1, false, false, C, N, OC, w, C, dout, OC, dinp, C, CUDA_R_16BF, 0.0f, epi, nullptr,
       const_cast<__nv_bfloat16*>(gelu_pre), C});
}

void Matmul::backward_weight(float* dw, const __nv_bfloat16* dout, const __nv_bfloat16* inp, int N, int C, int OC) {
  GANTRY_CHECK(dw && dout && inp && N > 0 && C > 0 && OC > 0, "Matmul::backward_weight arguments");
  // dwᵀ (C×OC) += inpᵀ (C×N) · dout (N×OC, stored OC×N and transposed); fp32 output accumulates.
  run({2, false, true, C, OC, N, inp, C, dout, OC, dw, C, CUDA_R_32F, 1.0f, CUBLASLT_EPILOGUE_DEFAULT, nullptr,
       nullptr, 0});
}

}  // namespace gantry
