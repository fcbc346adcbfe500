// The console's plot widgets, drawn with Dear ImGui's ImDrawList: a line plot and a rank × step heatmap.
// Immediate mode: call once per frame inside an ImGui window; everything a plot remembers between frames
// (its ranges, fit and follow modes, hidden series, scratch buffers) lives in the caller's view struct.
//
// Line plot: axes with nice ticks, several series, NaN gaps, event markers, a legend whose entries toggle
// their series, a hover readout (nearest x, each visible series' value there), mouse-wheel zoom in x
// (Ctrl + wheel: y; Shift + wheel: both), drag to pan, double-click to fit, and "follow latest" for live
// data. Series are decimated to the plot's pixel width every frame (min/max per pixel, so no spike is lost).
//
//   #include <imgui.h>                 // ImGui's include directory is on the path (pkg-config imgui)
//   #include "ui/plot/plot_widget.h"
//
//   gantry::plot::PlotView loss_view{.follow_latest = true};  // caller-owned, lives across frames
//   const gantry::plot::PlotSeries series[] = {
//       {"loss", steps.data(), loss.data(), steps.size(), IM_COL32(90, 170, 255, 255)},
//       {"val loss", vsteps.data(), vloss.data(), vsteps.size(), IM_COL32(255, 160, 60, 255)}};
//   const gantry::plot::PlotMarker markers[] = {{1200, "checkpoint", IM_COL32(120, 220, 120, 255)}};
//   gantry::plot::plot_lines("loss", loss_view, series, markers, ImVec2(-1, 240));  // -1: fill the width
//
//   gantry::plot::HeatmapView heat_view{.value_label = "step time", .unit = "s"};
//   gantry::plot::heatmap_widget("step times", heat_view, model, ImVec2(-1, 300));
//
// Size: a component ≤ 0 takes the remaining content region in that direction (as ImGui's own widgets do).
// id: as for any ImGui widget, non-empty and unique within its window ("##loss" works; no label is drawn).
// Windows holding plots should pass ImGuiWindowFlags_NoScrollWithMouse so the wheel zooms and not scrolls.
// While hovered, both widgets open ImGui's tooltip with their readout: to add lines to it, call
// ImGui::BeginTooltip() … EndTooltip() after the widget (ImGui::SetTooltip would replace the readout).
#pragma once

#include <imgui.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "ui/plot/decimate.h"
#include "ui/plot/heatmap.h"
#include "ui/plot/texture.h"

namespace gantry::plot {

// One line. x ascending; y NaN = gap. The arrays are read during the call only (not kept).
struct PlotSeries {
  std::string name;  // legend text and the key of PlotView::hidden; unique within one plot
  const double* x = nullptr;
  const double* y = nullptr;
  size_t n = 0;
  uint32_t colour = 0xFFFFFFFF;  // IM_COL32
};

// A vertical line at x across the plot (a checkpoint, a restart, a quarantine), labelled at its top.
struct PlotMarker {
  double x = 0;
  std::string label;
  uint32_t colour = 0xFFFFFFFF;  // IM_COL32
};

// Everything one line plot keeps between frames. Aggregate: set the fields you need with designated
// initialisers; the rest default.
struct PlotView {
  // The visible data ranges. The widget rewrites them each frame while a fit or follow mode holds;
  // setting them yourself (and clearing fit_x / fit_y / follow_latest) moves the view.
  double x_min = 0, x_max = 1;
  double y_min = 0, y_max = 1;
  bool fit_x = true;  // x spans all data of the visible series; x zoom or pan turns it off
  bool fit_y = true;  // y spans the visible series within the x range; y zoom or pan turns it off
  // x ends at the newest x of the visible series, follow_width wide, while fit_x is off (with fit_x on,
  // everything shows, the newest included). Wheel zoom keeps following and sets follow_width; panning in
  // x turns following off. For "the last 500 steps, live": {.fit_x = false, .follow_latest = true,
  // .follow_width = 500}.
  bool follow_latest = false;
  double follow_width = 0;          // ≤ 0: the width at the moment following takes over
  std::vector<std::string> hidden;  // names of hidden series; clicking a legend entry toggles its name
  std::string x_label, y_label;     // axis titles; empty: none
  std::string y_unit;               // the series' unit, for the CSV export's header (plot_export.h)
  bool x_integer = false;           // x is a whole number (steps): integer ticks only (ticks_integer)
  bool show_legend = true;

  // Outputs of the last call.
  bool hovered = false;                   // the mouse is over the data area
  double hover_x = NAN, hover_y = NAN;    // the mouse in data coordinates (NaN when not hovered)
  ImVec2 plot_min{0, 0}, plot_max{0, 0};  // the data area in screen pixels (inside the axes)

  bool is_hidden(std::string_view name) const;
  void set_hidden(std::string_view name, bool hide);
  // Fit both axes to all data on the next frame (as a double-click does; following, if on, continues).
  void fit() {
    fit_x = fit_y = true;
    follow_width = 0;
  }

  // Per-series decimation and vertex buffers, reused from frame to frame; not part of the API.
  std::vector<Decimation> scratch;
  std::vector<ImVec2> scratch_points;
  bool dragging = false;  // a pan that began inside the data area is under way
};

// Where each marker's label goes so that none overprints another: markers in x order, `x_px` where each
// label starts and `width_px` its width; the result holds per marker the row (0 = the top line of the plot,
// 1 the line under it, ... below `rows`) or −1 when no row has room there (its line is still drawn and its
// label still shows on hover). Greedy, left to right: the first row whose last label ends before this one.
std::vector<int> marker_label_rows(std::span<const float> x_px, std::span<const float> width_px, int rows);

// Draws a line plot of `series` with `markers` into a rectangle of `size` at the cursor, handles its
// mouse input and advances the cursor. Returns true when the user changed the view this frame (zoom,
// pan, fit, legend toggle), so a caller that sleeps when nothing changes knows to redraw.
bool plot_lines(const char* id, PlotView& view, std::span<const PlotSeries> series,
                std::span<const PlotMarker> markers, ImVec2 size);

// Everything one heatmap keeps between frames.
struct HeatmapView {
  // The visible step range [step_lo, step_hi). fit: all steps stored; follow_latest: the newest
  // follow_steps steps (≤ 0: the current width when following starts). Wheel zoom and drag pan move it
  // and turn fit (and, for a pan, follow_latest) off; double-click turns fit back on.
  int64_t step_lo = 0, step_hi = 1;
  bool fit = true;
  bool follow_latest = false;
  int64_t follow_steps = 0;
  ColourScale scale;                  // auto: min/max of the visible cells, written back each frame
  std::string value_label = "value";  // hover readout and scale bar title, e.g. "step time"
  std::string unit;                   // appended to values, e.g. "s"
  // Cells are at least this many pixels wide and tall. Where the renderer lacks
  // ImGuiBackendFlags_RendererHasVtxOffset (16-bit indices, one draw list under 65,536 vertices) cells
  // are coarsened further, to at most 6,000 per map; ImGui's OpenGL 3 backend has the flag.
  float min_cell_px = 2;

  // Outputs of the last call.
  bool hovered = false;                          // the mouse is over a cell
  int hover_rank_lo = 0, hover_rank_hi = 0;      // ranks [lo, hi) of the hovered cell
  int64_t hover_step_lo = 0, hover_step_hi = 0;  // steps [lo, hi) of the hovered cell
  float hover_value = NAN;                       // its maximum; NaN when missing
  ImVec2 map_min{0, 0}, map_max{0, 0};           // the cell area in screen pixels

  HeatmapGrid grid;  // the cells drawn last frame (also the scratch buffer); rows = rank buckets
  // With a texture backend (texture.h) the cells are one texture of a texel each, uploaded when they change.
  PlotTexture texture;
  std::vector<uint32_t> texels;
  bool dragging = false;
  double drag_steps = 0;  // the fraction of a step a pan has moved but not yet applied
};

// Draws `model` as rank (rows, rank 0 at the top) × step (columns) cells with a colour scale bar at the
// right and a hover readout (ranks, steps, bucket maximum). Returns true when the user changed the view.
bool heatmap_widget(const char* id, HeatmapView& view, const HeatmapSource& model, ImVec2 size);

}  // namespace gantry::plot
