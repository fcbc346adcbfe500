// Drawing axes for the plot widgets (internal to gantry_plot): the data ↔ pixel mapping of one axis, and
// ticks, grid lines and labels along a rectangle's bottom or left edge.
#pragma once

#include <imgui.h>

#include <vector>

#include "ui/plot/ticks.h"

namespace gantry::plot {

// Linear map between data [d0, d1] and pixels [p0, p1] (p1 < p0 for a y axis that grows upward).
struct AxisMap {
  double d0 = 0, d1 = 1;
  float p0 = 0, p1 = 1;
  // Pixels, clamped far outside the widget so an off-screen spike of 1e300 stays a finite coordinate.
  float to_px(double v) const;
  double to_data(float px) const;
  double data_per_px() const { return (d1 - d0) / static_cast<double>(p1 - p0); }
};

// A plot widget's item: the rectangle it takes for `requested` (a component ≤ 0 fills the content region
// left), claimed as an invisible button so the widget gets hover and drag.
struct AxesItem {
  ImVec2 size, min, max;
  bool hovered = false, active = false;
};
AxesItem axes_item(const char* id, ImVec2 requested);

// Ticks, grid lines inside [pmin, pmax] and labels below (x) or left of (y) the rectangle.
// `offset` moves each tick within the data (0.5 centres integer ticks in their row, for ranks).
void axes_draw_x(ImDrawList* dl, const AxisMap& x, const std::vector<Tick>& ticks, ImVec2 pmin, ImVec2 pmax,
                 bool grid);
void axes_draw_y(ImDrawList* dl, const AxisMap& y, const std::vector<Tick>& ticks, ImVec2 pmin, ImVec2 pmax,
                 bool grid, double offset = 0);

// Tick length and the gap between ticks and labels, in pixels.
inline constexpr float kAxisTickLen = 4;
inline constexpr float kAxisGap = 3;

}  // namespace gantry::plot
