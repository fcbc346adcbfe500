#include "telemetry/flops.h"

#include <algorithm>
#include <array>
#include <cmath>
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

DevicePeak device_peak_cpu(double configured_flops) {
  return {"cpu (configured)", configured_flops > 0 && std::isfinite(configured_flops) ? configured_flops : 0};
}

std::string_view device_key_from_name(std::string_view n) {
  const auto has = [&](std::string_view s) { return n.find(s) != std::string_view::npos; };
  // Most specific first: "GH200" contains "H200", and "H100 NVL" would otherwise read as an SXM part.
  if (has("GH200")) return "gh200";
  if (has("H200")) return "h200";
  if (has("H100")) {
    if (has("NVL")) return "unknown";
    return has("PCIe") || has("PCIE") ? "h100-pcie" : "h100-sxm";
  }
  if (has("A100")) return "a100";
  if (has("B200") && !has("GB200")) return "b200";
  return "unknown";
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
  std::snprintf(buf, sizeof buf,
                "MFU = tokens/s x (6N + 6LdT = %.4g FLOP/token) / peak; peak = %.*s %.4g TFLOP/s bf16 dense",
                m.flops_per_token, static_cast<int>(m.peak.name.size()), m.peak.name.data(),
                m.peak.bf16_flops / 1e12);
  return buf;
}

double hardware_flops_per_token(double model_flops_per_token, double recompute_fraction) {
  const double r = std::isnan(recompute_fraction) ? 0 : std::clamp(recompute_fraction, 0.0, 1.0);
  return model_flops_per_token * (1.0 + r / 3.0);
}

HfuFigure hfu(double tokens_per_s, double model_flops_per_token, const DevicePeak& peak,
              double recompute_fraction) {
  HfuFigure h;
  h.recompute_fraction = std::isnan(recompute_fraction) ? 0 : std::clamp(recompute_fraction, 0.0, 1.0);
  h.model_flops_per_token = model_flops_per_token;
  h.hardware_flops_per_token = hardware_flops_per_token(model_flops_per_token, h.recompute_fraction);
  h.achieved_flops = tokens_per_s * h.hardware_flops_per_token;
  h.peak = peak;
  h.ratio = peak.bf16_flops > 0 ? h.achieved_flops / peak.bf16_flops : 0;
  return h;
}

std::string hfu_formula(const HfuFigure& h) {
  char buf[320];
  std::snprintf(buf, sizeof buf,
                "HFU = tokens/s x (6N + 6LdT = %.4g FLOP/token) x (1 + r/3), r = %.3g recomputed forward "
                "= %.4g FLOP/token / peak; peak = %.*s %.4g TFLOP/s bf16 dense",
                h.model_flops_per_token, h.recompute_fraction, h.hardware_flops_per_token,
                static_cast<int>(h.peak.name.size()), h.peak.name.data(), h.peak.bf16_flops / 1e12);
  return buf;
}

}  // namespace gantry
