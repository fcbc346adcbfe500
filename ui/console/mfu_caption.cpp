#include "ui/console/mfu_caption.h"

#include <cmath>
#include <cstdio>

namespace gantry::console {

MfuCaption mfu_caption(const StepColumns& c, const RunView& run) {
  MfuCaption cap;
  // The newest known value: a run whose peak became known part-way (a resume with train.peak_tflops set)
  // shows its latest figure, and one that never had a peak shows n/a.
  for (size_t i = c.mfu_percent.size(); i-- > 0;) {
    if (std::isfinite(c.mfu_percent[i])) {
      cap.latest_percent = c.mfu_percent[i];
      break;
    }
  }
  char buf[64];
  if (cap.latest_percent) {
    std::snprintf(buf, sizeof buf, "MFU %.1f%%", *cap.latest_percent);
  } else {
    std::snprintf(buf, sizeof buf, "MFU n/a");
  }
  cap.title = buf;

  std::string peak;
  if (run.peak_flops > 0) {
    std::snprintf(buf, sizeof buf, "%.4g TFLOP/s", run.peak_flops / 1e12);
    peak = "peak: " + run.peak_name + " " + buf + " bf16 dense, per device";
  } else if (run.peak_name == "per device") {
    peak = "peak: each rank's GPU's dense bf16 peak, from its name";
  } else {
    peak = "peak: unknown (a CPU has no datasheet peak: set train.peak_tflops in the config)";
  }
  cap.tooltip = "MFU = achieved FLOP/s / (ranks x the device's dense bf16 peak), in percent\n";
  if (!run.mfu_formula.empty()) cap.tooltip += run.mfu_formula + "\n";
  cap.tooltip += peak;
  if (!cap.latest_percent) cap.tooltip += "\nMFU n/a: no step of this run has a known peak; nothing is drawn";
  return cap;
}

}  // namespace gantry::console
