#include "telemetry/flops.h"

#include <array>
#include <cstdio>

namespace gantry {

double flops_per_token(const FlopsModel& m) {
  return 6.0 * static_cast<double>(m.params) +
         6.0 * static_cast<double>(m.layers) * static_cast<double>(m.width) * static_cast<double>(m.seq_len);
}

DevicePeak device_peak(std::string_view name) {
  // Dense bf16 tensor-core peaks from the vendors' datasheets (sparsity excluded).
  static constexpr std::array<DevicePeak, 6> kTable = {{
      {"h100-sxm", 989e12},
      {"h100-pcie", 756e12},
      {"h200", 989e12},
      {"a100", 312e12},
      {"b200", 2250e12},
      {"gh200", 989e12},
  }};
  for (const DevicePeak& p : kTable) {
    if (p.name == name) return p;
  }
  return {"unknown", 0};
}

MfuFigure mfu(double tokens_per_s, double flops_per_token_value, const DevicePeak& peak) {
  MfuFigure m;
  m.flops_per_token = flops_per_token_value;
  m.achieved_flops = tokens_per_s * flops_per_token_value;
  m.peak = peak;
  m.ratio = peak.bf16_flops > 0 ? m.achieved_flops / peak.bf16_flops : 0;
  return m;
}

std::string mfu_formula(const MfuFigure& m) {
  char buf[256];
  std::snprintf(buf, sizeof buf, "MFU = tokens/s x (6N + 6LdT = %.4g FLOP/token) / peak; peak = %.*s %.0f TFLOP/s bf16 dense",
                m.flops_per_token, static_cast<int>(m.peak.name.size()), m.peak.name.data(),
                m.peak.bf16_flops / 1e12);
  return buf;
}

}  // namespace gantry
