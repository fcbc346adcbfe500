// The run's events as markers on every plot of the Run panel, apart from ImGui so they are tested without a
// display: checkpoints, moves and resumes, skipped steps, step-guard rollbacks, SDC mismatches, stragglers.
//
//   const std::vector<plot::PlotMarker> markers = event_markers(snapshot);
//   plot_lines("loss", view, series, markers, size);
#pragma once

#include <vector>

#include "ui/console/console_state.h"
#include "ui/plot/plot_widget.h"  // PlotMarker

namespace gantry::console {

std::vector<plot::PlotMarker> event_markers(const ConsoleSnapshot& s);

}  // namespace gantry::console
