// The history panel, drawn with Dear ImGui: the runs of a local history (history_model.h) as a table —
// id, name, start, state, last step, last loss, layout — where clicking a row selects it for the overlay
// (kMaxSelected at most; one more replaces the earliest), and the selected runs compared on two step
// metrics (loss and grad norm by default; any of them), aligned by step or by time, smoothed by TensorBoard's
// EMA (a slider), on a log scale if asked, the two plots' x zoom linked and a crosshair across both.
//
//   // once:  history::HistoryModel model; model.open(cache_path); history::HistoryPanelView view;
//   if (ImGui::Begin("History", nullptr, ImGuiWindowFlags_NoScrollWithMouse))  // the wheel zooms the plot
//     history::history_panel(model, view);
//   ImGui::End();
//
// The panel reads the database only when the selection changes, the plot's width changes the number of
// points it asks for, or Refresh is pressed (or the caller calls model.refresh(), say on a run's end).
#pragma once

#include <imgui.h>

#include <functional>

#include "ui/history/compare.h"
#include "ui/history/history_model.h"
#include "ui/plot/plot_widget.h"

namespace gantry::history {

// As in the what-if panel: a caller that records clickable buttons passes its own; empty = ImGui::Button.
using PanelButton = std::function<bool(const char* label, bool enabled)>;

struct HistoryPanelView {
  plot::PlotView plot{.x_label = "step", .y_label = "loss", .x_integer = true};
  // The second metric's plot under the first: x zoom and pan are linked, and a crosshair follows the mouse
  // across both (compare.h).
  plot::PlotView plot2{.x_label = "step", .y_label = "grad norm", .x_integer = true};
  CompareAxis axis = CompareAxis::kStep;
  float smoothing = 0;  // TensorBoard's EMA weight, 0..0.99 (0 = raw)
  bool log_scale = false;
  int metric[2] = {0, 1};  // StepMetric of each plot
  // Outputs of the last call, for tests and scripted input: each run row's rectangle (table order).
  struct Row {
    int64_t run_id = 0;
    ImVec2 min{0, 0}, max{0, 0};
  };
  std::vector<Row> rows;
};

// The colour of the n-th selected run's curve (and its row marker).
uint32_t history_series_colour(size_t n);

// Draws the panel. Returns true when the selection changed this frame.
bool history_panel(HistoryModel& m, HistoryPanelView& view, const PanelButton& button = {});

}  // namespace gantry::history
