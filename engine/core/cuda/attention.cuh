// Causal flash attention for bf16 on tensor cores (mma.sync m16n8k16, fp32 accumulate, online softmax in
// fp32; the forward and the deterministic backward at HS 64 on Hopper by wgmma + TMA instead): forward, and a
// backward that is either deterministic (no atomics: one kernel owns dK/dV per key block, another owns dQ per
// query block) or fast (one kernel per key block also adds dQ into an fp32 accumulator with atomics). Never
// materialises a T×T matrix. Design and timings: docs/ATTENTION.md.
//
// Layout, as the qkv linear layer writes it (C = NH·HS, scale = 1/sqrt(HS), query t sees keys 0..t):
//   qkv  (B, T, 3C) bf16: q of head h at columns h·HS, k at C + h·HS, v at 2C + h·HS
//   out  (B, T, C)  bf16: head h at columns h·HS
//   lse  (B, NH, T) fp32: log Σ exp(scale · q·k) of each query row, saved for backward
//   dout (B, T, C)  bf16;  dqkv (B, T, 3C) bf16, fully WRITTEN (not accumulated) by backward
//
//   gantry::attention_forward(out, lse, qkv, B, T, NH, HS, stream);
//   // scratch: device fp32 buffer of attention_backward_scratch_floats(B, T, NH, HS) floats
//   gantry::attention_backward(dqkv, dout, out, lse, qkv, scratch, B, T, NH, HS, stream);  // deterministic
//   gantry::attention_backward(dqkv, dout, out, lse, qkv, scratch, B, T, NH, HS, stream, false);  // fast
//
// HS ∈ {16, 32, 64, 128}; T ≥ 1 (any length: the last tile is ragged); every bf16 pointer 16-byte aligned.
// Launchers check their preconditions (FatalError), launch on `stream` and never synchronise the host.
#pragma once

#include <cuda_bf16.h>     // __nv_bfloat16
#include <cuda_runtime.h>  // cudaStream_t

#include <cstddef>

namespace gantry {

// On a Hopper GPU at HS 64 with T % 64 == 0 the forward runs on wgmma + TMA (attention_wgmma.cuh; off with
// GANTRY_CUDA_ATTENTION_WGMMA=0); elsewhere, and always through attention_forward_mma, on mma.sync. Both give
// the same function (normalised difference ~3e-5: the bf16 rounding of P) and are bit-identical run to run.
void attention_forward(__nv_bfloat16* out, float* lse, const __nv_bfloat16* qkv, int B, int T, int NH, int HS,
                       cudaStream_t stream);
void attention_forward_mma(__nv_bfloat16* out, float* lse, const __nv_bfloat16* qkv, int B, int T, int NH,
                           int HS, cudaStream_t stream);

// fp32 workspace the backward needs for every head size up to HS (the default, 128, covers all), both
// variants: deterministic, D = rowsum(dout ∘ out), one float per (b, h, t); fast, D plus an fp32 dQ
// accumulator of about B·T·NH·HS floats. Pass the real HS for a tight bound.
size_t attention_backward_scratch_floats(int B, int T, int NH, int HS = 128);

// deterministic = true: bit-identical results run to run (no atomics; dQ recomputes S and P in its own
// kernel). deterministic = false: FlashAttention-2 style, one kernel per key tile also adds dQ into an fp32
// accumulator with atomics (faster; the last bits of dq vary run to run); scratch must be 16-byte aligned.
void attention_backward(__nv_bfloat16* dqkv, const __nv_bfloat16* dout, const __nv_bfloat16* out,
                        const float* lse, const __nv_bfloat16* qkv, float* scratch, int B, int T, int NH,
                        int HS, cudaStream_t stream, bool deterministic = true);
// The same on the mma.sync kernels whatever the device and shape. attention_backward's deterministic variant
// takes the wgmma + TMA kernels instead on a Hopper GPU at HS 64 with T % 64 == 0 (attention_wgmma_bwd.cuh;
// off with GANTRY_CUDA_ATTENTION_WGMMA_BWD=0, or with GANTRY_CUDA_ATTENTION_WGMMA=0 together with the
// forward); the fast variant always runs here.
void attention_backward_mma(__nv_bfloat16* dqkv, const __nv_bfloat16* dout, const __nv_bfloat16* out,
                            const float* lse, const __nv_bfloat16* qkv, float* scratch, int B, int T, int NH,
                            int HS, cudaStream_t stream, bool deterministic = true);

}  // namespace gantry
