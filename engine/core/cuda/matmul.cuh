// Linear layers through cuBLASLt, row-major PyTorch convention (weights (OC, C)), bf16 inputs, fp32
// accumulation, fused epilogues: bias, GELU (keeping the pre-activation as the epilogue's aux output) and
// its derivative in the input-gradient product. Descriptors and the algorithm of each shape are made once.
//
//   Matmul mm(stream);
//   mm.forward(out, inp, w, bias, N, C, OC, nullptr);               // out = inp·wᵀ + bias
//   mm.forward(gelu_out, inp, w, bias, N, C, OC, pre_gelu);          // gelu_out = gelu(pre_gelu = inp·wᵀ +
//   bias) mm.backward_input(dinp, dout, w, N, C, OC, nullptr);             // dinp = dout·w
//   mm.backward_weight(dw, dout, inp, N, C, OC);                     // dw (fp32) += doutᵀ·inp
#pragma once

#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <map>
#include <tuple>

namespace gantry {

class Matmul {
 public:
  explicit Matmul(cudaStream_t stream, size_t workspace_bytes = 32u << 20);
  ~Matmul();
  Matmul(const Matmul&) = delete;
  Matmul& operator=(const Matmul&) = delete;

  // out (N, OC) = inp (N, C) · w (OC, C)ᵀ + bias (OC, may be null). With gelu_pre (N, OC): out = gelu(x) and
  // gelu_pre = x, where x = inp·wᵀ + bias.
  void forward(__nv_bfloat16* out, const __nv_bfloat16* inp, const __nv_bfloat16* w,
               const __nv_bfloat16* bias, int N, int C, int OC, __nv_bfloat16* gelu_pre);
  // dinp (N, C) = dout (N, OC) · w (OC, C), written. With gelu_pre (N, C): dinp = (dout·w) ⊙ gelu'(gelu_pre).
  void backward_input(__nv_bfloat16* dinp, const __nv_bfloat16* dout, const __nv_bfloat16* w, int N, int C,
                      int OC, const __nv_bfloat16* gelu_pre);
  // dw (OC, C) fp32 += dout (N, OC)ᵀ · inp (N, C).
  void backward_weight(float* dw, const __nv_bfloat16* dout, const __nv_bfloat16* inp, int N, int C, int OC);

  size_t workspace_bytes() const { return workspace_bytes_; }

 private:
  struct Gemm;
  void run(const Gemm& g);

  cudaStream_t stream_;
  cublasLtHandle_t handle_ = nullptr;
  void* workspace_ = nullptr;
  size_t workspace_bytes_;
  struct Plan {
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t la = nullptr, lb = nullptr, ld = nullptr;
    cublasLtMatmulAlgo_t algo{};
  };
  // (kind, m, n, k, epilogue) → descriptors and algorithm, made on first use.
  std::map<std::tuple<int, int, int, int, int>, Plan> plans_;
};

}  // namespace gantry
