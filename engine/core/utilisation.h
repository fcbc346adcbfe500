// How a run's MFU and HFU are computed from its config and device (telemetry/flops.h does the arithmetic):
// the FLOPs per token from the model, and the dense bf16 peak from the device's name (CUDA), from
// train.peak_tflops (a CPU, or an override of the table), or unknown. Unknown is not 0: every figure is then
// absent and prints as "n/a".
//
//   const RunUtilisation u = run_utilisation(cfg, table.numel(), backend->device_name());
//   rep.mfu = u.mfu(global_tokens_per_s / world);  // per device: std::nullopt when the peak is unknown
//   std::fprintf(stderr, "%s\n", u.formula.c_str());
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "engine/core/config.h"
#include "telemetry/flops.h"

namespace gantry {

struct RunUtilisation {
  double flops_per_token = 0;           // model FLOPs, 6·N + 6·L·d·T
  double hardware_flops_per_token = 0;  // what the hardware runs: the engine recomputes nothing, so the same
  std::string peak_name;                // "h100-sxm", "cpu (configured)", "configured", "unknown"
  double peak_flops = 0;                // dense bf16 FLOP/s of one device; 0 = unknown
  std::string formula;                  // mfu_formula(), or why there is no figure

  bool known() const { return peak_flops > 0; }
  // Of one device processing `tokens_per_s`: 0..1 (more if the peak is understated), nullopt when unknown.
  std::optional<double> mfu(double tokens_per_s) const;
  std::optional<double> hfu(double tokens_per_s) const;
};

// `params` is N (all parameters, the tied embedding once); `cuda_device_name` is the driver's name of the
// device ("NVIDIA H100 80GB HBM3"), "" on CPU. train.peak_tflops > 0 wins over the table; a CUDA device the
// table does not know, or a CPU without the key, leaves the peak unknown.
RunUtilisation run_utilisation(const Config& c, uint64_t params, std::string_view cuda_device_name);

// Before any device is known (the coordinator, at submit): the config's peak where it sets one; for a CUDA
// run without one, each rank's GPU gives its own peak, so peak_flops stays 0 and the formula says so.
RunUtilisation run_utilisation_planned(const Config& c, uint64_t params);

// "41.2%" or "n/a": the one way a step line or a table prints an MFU.
std::string mfu_text(const std::optional<double>& ratio);

}  // namespace gantry
