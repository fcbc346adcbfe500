// Axis mapping and drawing for the plot widgets: see axes.h.
#include "ui/plot/axes.h"

#include <algorithm>
#include <cmath>

namespace gantry::plot {

float AxisMap::to_px(double v) const {
  if (!(d1 != d0)) return p0;
  const double p = p0 + (v - d0) / (d1 - d0) * static_cast<double>(p1 - p0);
  if (std::isnan(p)) return p0;  // an infinite range or value: a vertex at NaN would poison the draw
  // ±1e6 px is far past any screen, yet small enough that floats stay exact to a fraction of a pixel
  // near the widget, so lines to far-away points keep their slope where they are visible.
  return static_cast<float>(std::clamp(p, -1e6, 1e6));
}

double AxisMap::to_data(float px) const {
  if (p1 == p0) return d0;
  return d0 + (static_cast<double>(px) - p0) / static_cast<double>(p1 - p0) * (d1 - d0);
}

AxesItem axes_item(const char* id, ImVec2 requested) {
  const ImVec2 avail = ImGui::GetContentRegionAvail();
  AxesItem it;
  it.size = ImVec2(requested.x > 0 ? requested.x : std::max(avail.x, 64.0f),
                   requested.y > 0 ? requested.y : std::max(avail.y, 48.0f));
  it.min = ImGui::GetCursorScreenPos();
  it.max = ImVec2(it.min.x + it.size.x, it.min.y + it.size.y);
  ImGui::InvisibleButton(id, it.size, ImGuiButtonFlags_MouseButtonLeft);
  it.hovered = ImGui::IsItemHovered();
  it.active = ImGui::IsItemActive();
  return it;
}

void axes_draw_x(ImDrawList* dl, const AxisMap& x, const std::vector<Tick>& ticks, ImVec2 pmin, ImVec2 pmax,
                 bool grid) {
  const ImU32 text = ImGui::GetColorU32(ImGuiCol_Text);
  const ImU32 tick = ImGui::GetColorU32(ImGuiCol_TextDisabled);
  const ImU32 line = ImGui::GetColorU32(ImGuiCol_Border, 0.5f);
  float last_right = -1e9f;  // labels that would overlap the previous one are skipped
  for (const Tick& t : ticks) {
    const float px = std::round(x.to_px(t.value)) + 0.5f;
    if (px < pmin.x - 0.5f || px > pmax.x + 0.5f) continue;
    if (grid) dl->AddLine(ImVec2(px, pmin.y), ImVec2(px, pmax.y), line);
    dl->AddLine(ImVec2(px, pmax.y), ImVec2(px, pmax.y + kAxisTickLen), tick);
    const ImVec2 sz = ImGui::CalcTextSize(t.label.c_str());
    const float left = px - sz.x / 2;
    if (left < last_right + kAxisGap) continue;
    dl->AddText(ImVec2(left, pmax.y + kAxisTickLen + 1), text, t.label.c_str());
    last_right = left + sz.x;
  }
}

void axes_draw_y(ImDrawList* dl, const AxisMap& y, const std::vector<Tick>& ticks, ImVec2 pmin, ImVec2 pmax,
                 bool grid, double offset) {
  const ImU32 text = ImGui::GetColorU32(ImGuiCol_Text);
  const ImU32 tick = ImGui::GetColorU32(ImGuiCol_TextDisabled);
  const ImU32 line = ImGui::GetColorU32(ImGuiCol_Border, 0.5f);
  const float h = ImGui::GetTextLineHeight();
  for (const Tick& t : ticks) {
    const float py = std::round(y.to_px(t.value + offset)) + 0.5f;
    if (py < pmin.y - 0.5f || py > pmax.y + 0.5f) continue;
    if (grid) dl->AddLine(ImVec2(pmin.x, py), ImVec2(pmax.x, py), line);
    dl->AddLine(ImVec2(pmin.x - kAxisTickLen, py), ImVec2(pmin.x, py), tick);
    const ImVec2 sz = ImGui::CalcTextSize(t.label.c_str());
    dl->AddText(ImVec2(pmin.x - kAxisTickLen - kAxisGap - sz.x, py - h / 2), text, t.label.c_str());
  }
}

}  // namespace gantry::plot
