// FLOP and MFU arithmetic, one convention for the whole project (DESIGN.md, after llm.c):
// FLOPs per token = 6·N + 6·L·d·T, N = all parameters with the tied embedding counted once.
// MFU = achieved FLOP/s ÷ the device's dense bf16 peak. HFU counts the FLOPs the hardware really ran,
// recomputed forward passes included. Every printed figure carries its formula and peak:
//
//   double f = flops_per_token({.params = n, .layers = 12, .width = 768, .seq_len = 1024});
//   MfuFigure m = mfu(tokens_per_s, f, device_peak("h100-sxm"));
//   std::printf("MFU %.1f%% (%s)\n", 100 * m.ratio, mfu_formula(m).c_str());
//   HfuFigure h = hfu(tokens_per_s, f, device_peak("h100-sxm"), /*recompute_fraction=*/1.0);
//
// On CPU there is no datasheet: the peak is configured (device_peak_cpu), and says so in the formula.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace gantry {

struct FlopsModel {
  uint64_t params = 0;  // N, tied embedding counted once
  int layers = 0;       // L
  int width = 0;        // d
  int seq_len = 0;      // T
};

// 6·N + 6·L·d·T: forward and backward of every parameter plus the attention score/value products.
double flops_per_token(const FlopsModel& m);

struct DevicePeak {
  std::string_view name;  // "h100-sxm", "h200", ...; "unknown" when not in the table
  double bf16_flops = 0;  // dense bf16 FLOP/s; 0 when unknown
};

// The peak table: "h100-sxm", "h100-pcie", "h200", "gh200", "a100", "b200". Unknown names give
// bf16_flops == 0, and mfu() then reports no ratio.
DevicePeak device_peak(std::string_view name);

// A CPU's peak, which no table knows: the operator configures it (FLOP/s, > 0), e.g. from cores × clock
// × FLOPs per cycle, or from a measured GEMM. The name is "cpu (configured)".
DevicePeak device_peak_cpu(double configured_flops);

// The table key for a CUDA device name as cudaGetDeviceProperties or NVML report it ("NVIDIA H100 80GB
// HBM3" → "h100-sxm", "NVIDIA H100 PCIe" → "h100-pcie", "NVIDIA A100-SXM4-80GB" → "a100"); "unknown"
// for anything else (H100 NVL included: its peak differs and guessing would mislead).
std::string_view device_key_from_name(std::string_view cuda_device_name);

struct MfuFigure {
  double ratio = 0;           // 0..1; 0 when the peak is unknown
  double achieved_flops = 0;  // FLOP/s
  double flops_per_token = 0;
  DevicePeak peak;
};

MfuFigure mfu(double tokens_per_s, double flops_per_token, const DevicePeak& peak);

// "MFU = tokens/s × (6·N + 6·L·d·T) ÷ peak; peak = h100-sxm 989 TFLOP/s bf16 dense".
std::string mfu_formula(const MfuFigure& m);

// Hardware FLOPs per token when a fraction of the forward pass is recomputed in the backward pass
// (activation checkpointing): forward is a third of the 6·N + 6·L·d·T, so the hardware runs
// (1 + recompute_fraction / 3) times the model FLOPs. 0 = no recomputation (HFU = MFU), 1 = full.
double hardware_flops_per_token(double model_flops_per_token, double recompute_fraction);

struct HfuFigure {
  double ratio = 0;           // 0..1; 0 when the peak is unknown
  double achieved_flops = 0;  // hardware FLOP/s
  double hardware_flops_per_token = 0;
  double model_flops_per_token = 0;
  double recompute_fraction = 0;  // 0..1, clamped
  DevicePeak peak;
};

HfuFigure hfu(double tokens_per_s, double model_flops_per_token, const DevicePeak& peak,
              double recompute_fraction);

// "HFU = tokens/s × (6N + 6LdT) × (1 + r/3) / peak; r = 1 ...; peak = ...".
std::string hfu_formula(const HfuFigure& h);

}  // namespace gantry
