// FLOP and MFU arithmetic, one convention for the whole project (DESIGN.md, after llm.c):
// FLOPs per token = 6·N + 6·L·d·T, N = all parameters with the tied embedding counted once.
// MFU = achieved FLOP/s ÷ the device's dense bf16 peak. Every printed MFU carries its formula and peak:
//
//   double f = flops_per_token({.params = n, .layers = 12, .width = 768, .seq_len = 1024});
//   MfuFigure m = mfu(tokens_per_s, f, device_peak("h100-sxm"));
//   std::printf("MFU %.1f%% (%s)\n", 100 * m.ratio, mfu_formula(m).c_str());
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
  std::string_view name;   // "h100-sxm", "h200", ...; "unknown" when not in the table
  double bf16_flops = 0;   // dense bf16 FLOP/s; 0 when unknown
};

// The peak table. Unknown names give bf16_flops == 0, and mfu() then reports no ratio.
DevicePeak device_peak(std::string_view name);

struct MfuFigure {
  double ratio = 0;           // 0..1; 0 when the peak is unknown
  double achieved_flops = 0;  // FLOP/s
  double flops_per_token = 0;
  DevicePeak peak;
};

MfuFigure mfu(double tokens_per_s, double flops_per_token, const DevicePeak& peak);

// "MFU = tokens/s × (6·N + 6·L·d·T) ÷ peak; peak = h100-sxm 989 TFLOP/s bf16 dense".
std::string mfu_formula(const MfuFigure& m);

}  // namespace gantry
