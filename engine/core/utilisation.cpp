#include "engine/core/utilisation.h"

#include <cmath>
#include <cstdio>

namespace gantry {

std::optional<double> RunUtilisation::mfu(double tokens_per_s) const {
  if (!known() || !std::isfinite(tokens_per_s)) return std::nullopt;
  return tokens_per_s * flops_per_token / peak_flops;
}

std::optional<double> RunUtilisation::hfu(double tokens_per_s) const {
  if (!known() || !std::isfinite(tokens_per_s)) return std::nullopt;
  return tokens_per_s * hardware_flops_per_token / peak_flops;
}

RunUtilisation run_utilisation(const Config& c, uint64_t params, std::string_view cuda_device_name) {
  RunUtilisation u;
  u.flops_per_token = flops_per_token(
      {.params = params, .layers = c.model.n_layer, .width = c.model.n_embd, .seq_len = c.model.seq_len});
  u.hardware_flops_per_token = hardware_flops_per_token(u.flops_per_token, 0.0);
  DevicePeak peak;
  const double configured = c.train.peak_tflops * 1e12;
  if (configured > 0) {
    // The operator's figure: a CPU has no datasheet, and a GPU's table peak may be overridden (a power cap,
    // a part the table lacks).
    peak = cuda_device_name.empty() ? device_peak_cpu(configured) : DevicePeak{"configured", configured};
  } else if (!cuda_device_name.empty()) {
    peak = device_peak(device_key_from_name(cuda_device_name));
  } else {
    peak = {"unknown", 0};
  }
  u.peak_name = std::string(peak.name);
  u.peak_flops = peak.bf16_flops;
  if (u.known()) {
    u.formula = mfu_formula(mfu(0, u.flops_per_token, peak));
  } else {
    char buf[256];
    std::snprintf(buf, sizeof buf,
                  "MFU n/a: no dense bf16 peak for %s (6N + 6LdT = %.4g FLOP/token); set train.peak_tflops",
                  cuda_device_name.empty() ? "a CPU" : std::string(cuda_device_name).c_str(),
                  u.flops_per_token);
    u.formula = buf;
  }
  return u;
}

RunUtilisation run_utilisation_planned(const Config& c, uint64_t params) {
  if (c.train.backend != "cuda" || c.train.peak_tflops > 0) return run_utilisation(c, params, "");
  RunUtilisation u = run_utilisation(c, params, "");
  u.peak_name = "per device";
  char buf[256];
  std::snprintf(buf, sizeof buf,
                "MFU = tokens/s x (6N + 6LdT = %.4g FLOP/token) / peak; peak = each rank's GPU's dense bf16 "
                "peak, from its name (telemetry/flops.h)",
                u.flops_per_token);
  u.formula = buf;
  return u;
}

std::string mfu_text(const std::optional<double>& ratio) {
  if (!ratio) return "n/a";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f%%", 100 * *ratio);
  return buf;
}

}  // namespace gantry
