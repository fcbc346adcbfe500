// What the Run panel's MFU plot says about itself, apart from ImGui so it is tested without a display: its
// title (the latest MFU in percent, or "MFU n/a" when no step has one: the device's peak is unknown, and
// the plot shows a gap, never 0) and its tooltip (the run's formula and peak, from its RunInfo).
//
//   const MfuCaption cap = mfu_caption(log.columns(), snapshot.run);
//   draw_text(top_right_of_plot, cap.title);             // "MFU 41.2%" or "MFU n/a"
//   if (mfu_view.hovered) ImGui::SetTooltip("%s", cap.tooltip.c_str());
#pragma once

#include <optional>
#include <string>

#include "ui/console/console_state.h"
#include "ui/console/step_log.h"

namespace gantry::console {

struct MfuCaption {
  std::optional<double> latest_percent;  // the newest step's MFU × 100 that is known
  std::string title;                     // "MFU 41.2%", or "MFU n/a"
  std::string tooltip;                   // formula, peak, and why n/a where it is
};

MfuCaption mfu_caption(const StepColumns& c, const RunView& run);

}  // namespace gantry::console
