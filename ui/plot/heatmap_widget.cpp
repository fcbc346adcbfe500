// The rank × step heatmap widget: see plot_widget.h. Each frame: take input, settle the step range, ask
// the model for a grid of bucket maxima no finer than min_cell_px, and draw it as runs of equal colour.
#include <algorithm>
#include <cmath>
#include <string>

#include "ui/plot/axes.h"
#include "ui/plot/plot_export.h"
#include "ui/plot/plot_widget.h"
#include "ui/plot/texture.h"
#include "ui/plot/ticks.h"

namespace gantry::plot {
namespace {

constexpr double kWheelZoom = 0.85;  // view scale per wheel notch
constexpr float kBarWidth = 12;      // the colour scale bar
constexpr int kBarSegments = 64;
constexpr int kCellBudget = 6000;  // cells drawn when the renderer lacks VtxOffset: 24,000 vertices at most

std::string span_text(const char* one, const char* many, int64_t lo, int64_t hi) {
  // [lo, hi) as people say it: "rank 7", "ranks 8–15" (ASCII dash: the default font has no en dash).
  if (hi - lo <= 1) return std::string(one) + " " + std::to_string(lo);
  return std::string(many) + " " + std::to_string(lo) + "-" + std::to_string(hi - 1);
}

void draw_scale_bar(ImDrawList* dl, const HeatmapView& view, ImVec2 bmin, ImVec2 bmax) {
  const float h = bmax.y - bmin.y;
  for (int i = 0; i < kBarSegments; ++i) {
    // Bottom = min, top = max, as on the value axis of any chart.
    const float y1 = bmax.y - h * i / kBarSegments, y0 = bmax.y - h * (i + 1) / kBarSegments;
    dl->AddRectFilled(ImVec2(bmin.x, std::floor(y0)), ImVec2(bmax.x, std::ceil(y1)),
                      colour_ramp((i + 0.5) / kBarSegments));
  }
  dl->AddRect(bmin, bmax, ImGui::GetColorU32(ImGuiCol_Border));
  // Under the bar, the colour of cells with no value at all, so grey is never read as a value.
  const float line_h = ImGui::GetTextLineHeight();
  const ImVec2 m0(bmin.x, bmax.y + kAxisTickLen + 1 + line_h * 0.2f);
  dl->AddRectFilled(m0, ImVec2(bmax.x, m0.y + line_h * 0.6f), colour_missing());
  dl->AddText(ImVec2(bmax.x + kAxisGap, bmax.y + kAxisTickLen + 1), ImGui::GetColorU32(ImGuiCol_TextDisabled),
              "none");
  const AxisMap vm{view.scale.min, view.scale.max, bmax.y, bmin.y};
  const ImU32 text = ImGui::GetColorU32(ImGuiCol_Text);
  std::vector<Tick> ticks;
  if (view.scale.max > view.scale.min) {
    ticks = ticks_nice(view.scale.min, view.scale.max, std::max(2, static_cast<int>(h / 40)));
  } else {
    ticks = ticks_nice(view.scale.min, view.scale.min, 1);
  }
  for (const Tick& t : ticks) {
    const float y = std::round(vm.to_px(t.value)) + 0.5f;
    dl->AddLine(ImVec2(bmax.x, y), ImVec2(bmax.x + kAxisTickLen, y), text);
    dl->AddText(ImVec2(bmax.x + kAxisTickLen + kAxisGap, y - line_h / 2), text, t.label.c_str());
  }
}

}  // namespace

bool heatmap_widget(const char* id, HeatmapView& view, const HeatmapSource& model, ImVec2 size) {
  const ImGuiIO& io = ImGui::GetIO();
  const AxesItem item = axes_item(id, size);
  const ImVec2 wmin = item.min, wmax = item.max;
  const bool item_hovered = item.hovered, item_active = item.active;
  PlotExports* exports = plot_exports_current();
  if (exports != nullptr) exports->context_menu(id);

  const float line_h = ImGui::GetTextLineHeight();
  const float left = ImGui::CalcTextSize("00000").x + kAxisTickLen + 2 * kAxisGap;
  const float right = kBarWidth + 3 * kAxisGap + kAxisTickLen + ImGui::CalcTextSize("-888.8k").x;
  const float top = line_h + 2;  // the title
  const float bottom = line_h + kAxisTickLen + 2;
  const ImVec2 pmin(std::floor(wmin.x + left), std::floor(wmin.y + top));
  const ImVec2 pmax(std::max(pmin.x + 1, std::floor(wmax.x - right)),
                    std::max(pmin.y + 1, std::floor(wmax.y - bottom)));
  view.map_min = pmin;
  view.map_max = pmax;
  const float width = pmax.x - pmin.x, height = pmax.y - pmin.y;
  const ImVec2 mouse = io.MousePos;
  const bool in_map =
      item_hovered && mouse.x >= pmin.x && mouse.x < pmax.x && mouse.y >= pmin.y && mouse.y < pmax.y;
  bool changed = false;

  // ---- input -----------------------------------------------------------------------------------------
  const double steps_per_px = static_cast<double>(view.step_hi - view.step_lo) / width;
  if (ImGui::IsMouseClicked(ImGuiMouseButton_Left)) view.dragging = in_map;
  if (!item_active) view.dragging = false;
  if (!view.dragging) view.drag_steps = 0;
  if (view.dragging && io.MouseDelta.x != 0) {
    // Steps are integers: move by whole steps and carry the fraction, or a slow drag zoomed in (a tenth
    // of a step per pixel) would never move at all.
    view.drag_steps -= io.MouseDelta.x * steps_per_px;
    const int64_t d = static_cast<int64_t>(std::trunc(view.drag_steps));
    view.drag_steps -= static_cast<double>(d);
    if (d != 0) {
      view.step_lo += d;
      view.step_hi += d;
      view.fit = false;
      view.follow_latest = false;
      changed = true;
    }
  }
  const float wheel = io.MouseWheel != 0 ? io.MouseWheel : io.MouseWheelH;
  if (in_map && wheel != 0) {
    const double f = std::pow(kWheelZoom, wheel);
    const double span = static_cast<double>(view.step_hi - view.step_lo);
    const double new_span = std::max(2.0, span * f);
    if (view.follow_latest) {
      view.follow_steps = static_cast<int64_t>(std::llround(new_span));
    } else {
      const double anchor = view.step_lo + (mouse.x - pmin.x) * steps_per_px;
      const double lo = anchor - (anchor - view.step_lo) * (new_span / span);
      view.step_lo = std::llround(lo);
      view.step_hi = view.step_lo + std::llround(new_span);
    }
    view.fit = false;
    changed = true;
  }
  if (in_map && ImGui::IsMouseDoubleClicked(ImGuiMouseButton_Left)) {
    view.fit = true;
    view.follow_steps = 0;
    changed = true;
  }

  // ---- range and grid --------------------------------------------------------------------------------
  const int64_t first = model.first_step(), end = model.step_end();
  if (view.fit && end > first) {
    view.step_lo = first;
    view.step_hi = end;
  } else if (view.follow_latest && end > first) {
    if (view.follow_steps <= 0) view.follow_steps = view.step_hi - view.step_lo;
    view.step_hi = end;
    view.step_lo = end - view.follow_steps;
  }
  if (view.step_hi <= view.step_lo) view.step_hi = view.step_lo + 1;
  const float cell = std::max(view.min_cell_px, 1.0f);
  int max_cols = std::max(1, static_cast<int>(width / cell));
  int max_rows = std::max(1, static_cast<int>(height / cell));
  if (!(io.BackendFlags & ImGuiBackendFlags_RendererHasVtxOffset)) {
    // Without VtxOffset a window's draw list must stay under 65,536 vertices (16-bit indices) or ImGui
    // aborts; coarser cells keep the map within kCellBudget rectangles, leaving room for the rest.
    const double over = static_cast<double>(max_cols) * max_rows / kCellBudget;
    if (over > 1) {
      const double shrink = std::sqrt(over);
      max_cols = std::max(1, static_cast<int>(max_cols / shrink));
      max_rows = std::max(1, static_cast<int>(max_rows / shrink));
    }
  }
  model.grid(view.step_lo, view.step_hi, max_cols, max_rows, view.grid);
  const HeatmapGrid& g = view.grid;
  if (view.scale.auto_range && !std::isnan(g.value_min)) {
    view.scale.min = g.value_min;
    view.scale.max = g.value_max;
  }

  // ---- drawing ---------------------------------------------------------------------------------------
  ImDrawList* dl = ImGui::GetWindowDrawList();
  const int ranks = model.ranks();
  const AxisMap xm{static_cast<double>(view.step_lo), static_cast<double>(view.step_hi), pmin.x, pmax.x};
  const AxisMap ym{0.0, static_cast<double>(ranks), pmin.y, pmax.y};  // rank 0 at the top
  dl->AddRectFilled(pmin, pmax, ImGui::GetColorU32(ImGuiCol_FrameBg));
  dl->PushClipRect(pmin, pmax, true);
  bool as_texture = false;
  if (texture_backend() != nullptr && g.cols > 0 && g.rows > 0) {
    // One texel a cell: the same picture as the rectangles below in 4 vertices (texture.h says why).
    view.texels.resize(static_cast<size_t>(g.cols) * static_cast<size_t>(g.rows));
    for (int r = 0; r < g.rows; ++r)
      for (int c = 0; c < g.cols; ++c)
        view.texels[static_cast<size_t>(r) * g.cols + c] =
            colour_scale_map(view.scale.min, view.scale.max, g.at(r, c));
    if (view.texture.upload(view.texels, g.cols, g.rows)) {
      // Rows are ranks_per_row ranks each; the last may hold fewer ranks and reach past the map (clipped).
      const ImVec2 a(std::round(xm.to_px(static_cast<double>(g.col_step_begin(0)))), std::round(ym.to_px(0)));
      const ImVec2 b(std::round(xm.to_px(static_cast<double>(g.col_step_begin(g.cols)))),
                     std::round(ym.to_px(static_cast<double>(g.rows) * g.ranks_per_row)));
      dl->AddImage(view.texture.id(), a, b);
      as_texture = true;
    }
  }
  for (int r = 0; r < g.rows && !as_texture; ++r) {
    const int r0 = g.row_rank_begin(r), r1 = std::min(ranks, r0 + g.ranks_per_row);
    const float y0 = std::round(ym.to_px(r0)), y1 = std::round(ym.to_px(r1));
    // Neighbouring cells of one colour become one rectangle: flat stretches cost 4 vertices, not 4 a cell.
    int c = 0;
    while (c < g.cols) {
      const ImU32 col = colour_scale_map(view.scale.min, view.scale.max, g.at(r, c));
      int c1 = c + 1;
      while (c1 < g.cols && colour_scale_map(view.scale.min, view.scale.max, g.at(r, c1)) == col) ++c1;
      const float x0 = std::round(xm.to_px(static_cast<double>(g.col_step_begin(c))));
      const float x1 = std::round(xm.to_px(static_cast<double>(g.col_step_begin(c1))));
      dl->AddRectFilled(ImVec2(x0, y0), ImVec2(std::max(x1, x0 + 1), std::max(y1, y0 + 1)), col);
      c = c1;
    }
  }

  view.hovered = false;
  view.hover_value = NAN;
  if (in_map && g.cols > 0 && !view.dragging) {
    const double step = xm.to_data(mouse.x);
    const int c = static_cast<int>(
        std::floor((step - static_cast<double>(g.step_origin)) / static_cast<double>(g.steps_per_col)));
    const int rank = static_cast<int>(std::floor(ym.to_data(mouse.y)));
    const int r = rank / g.ranks_per_row;
    if (c >= 0 && c < g.cols && r >= 0 && r < g.rows) {
      view.hovered = true;
      view.hover_rank_lo = g.row_rank_begin(r);
      view.hover_rank_hi = std::min(ranks, view.hover_rank_lo + g.ranks_per_row);
      view.hover_step_lo = std::max(g.col_step_begin(c), first);
      view.hover_step_hi = std::min(g.col_step_begin(c + 1), end);
      view.hover_value = g.at(r, c);
      const ImVec2 a(std::round(xm.to_px(static_cast<double>(g.col_step_begin(c)))),
                     std::round(ym.to_px(view.hover_rank_lo)));
      const ImVec2 b(std::round(xm.to_px(static_cast<double>(g.col_step_begin(c + 1)))),
                     std::round(ym.to_px(view.hover_rank_hi)));
      dl->AddRect(a, ImVec2(std::max(b.x, a.x + 1), std::max(b.y, a.y + 1)),
                  ImGui::GetColorU32(ImGuiCol_Text));
      ImGui::BeginTooltip();
      ImGui::Text("%s", span_text("rank", "ranks", view.hover_rank_lo, view.hover_rank_hi).c_str());
      ImGui::Text("%s", span_text("step", "steps", view.hover_step_lo, view.hover_step_hi).c_str());
      const bool bucket =
          view.hover_rank_hi - view.hover_rank_lo > 1 || view.hover_step_hi - view.hover_step_lo > 1;
      ImGui::Text("%s%s: %s%s", view.value_label.c_str(), bucket ? " (max)" : "",
                  format_value(view.hover_value).c_str(),
                  std::isnan(view.hover_value) || view.unit.empty() ? "" : (" " + view.unit).c_str());
      ImGui::EndTooltip();
    }
  }
  dl->PopClipRect();
  dl->AddRect(pmin, pmax, ImGui::GetColorU32(ImGuiCol_Border));

  // Axes: steps below, ranks at the left (whole ranks only, centred in their rows).
  axes_draw_x(dl, xm,
              ticks_integer(static_cast<double>(view.step_lo), static_cast<double>(view.step_hi),
                            std::max(2, static_cast<int>(width / 90))),
              pmin, pmax, false);
  const std::vector<Tick> rank_ticks =
      ticks_integer(0, std::max(0, ranks - 1), std::max(2, static_cast<int>(height / 30)));
  axes_draw_y(dl, ym, rank_ticks, pmin, pmax, false, 0.5);

  const ImVec2 bmin(pmax.x + 2 * kAxisGap, pmin.y), bmax(pmax.x + 2 * kAxisGap + kBarWidth, pmax.y);
  // The title goes over the map's left corner: over the narrow scale bar it would run off the widget.
  dl->AddText(ImVec2(pmin.x, wmin.y), ImGui::GetColorU32(ImGuiCol_Text),
              (view.value_label + (view.unit.empty() ? "" : " (" + view.unit + ")")).c_str());
  draw_scale_bar(dl, view, bmin, bmax);
  if (exports != nullptr) exports->on_plot(id, wmin, wmax, [&] { return heatmap_csv(view, ranks); });
  return changed;
}

}  // namespace gantry::plot
