// The line plot widget: see plot_widget.h. Each frame: take input (legend, wheel, drag, double-click),
// settle the ranges (fit, follow), decimate every visible series to the pixel width, then draw.
#include "ui/plot/plot_widget.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "ui/plot/axes.h"
#include "ui/plot/plot_export.h"
#include "ui/plot/ticks.h"

namespace gantry::plot {
namespace {

constexpr float kLineThickness =
    1.0f;  // integer: ImGui draws it from its baked line texture, 2 vertices a point
constexpr double kWheelZoom = 0.85;  // view scale per wheel notch
constexpr float kFitPad = 0.05f;     // fitted y keeps this fraction of the range free above and below
constexpr float kMarkerHoverPx = 4;  // the mouse this close to a marker line shows its label

std::span<const double> xs(const PlotSeries& s) {
  return {s.x, s.x == nullptr ? 0 : s.n};
}
std::span<const double> ys(const PlotSeries& s) {
  return {s.y, s.y == nullptr ? 0 : s.n};
}
size_t length(const PlotSeries& s) {
  return s.x == nullptr || s.y == nullptr ? 0 : s.n;
}

ImU32 with_alpha(uint32_t colour, float alpha) {
  const uint32_t a = static_cast<uint32_t>(std::lround(((colour >> 24) & 0xFF) * alpha));
  return (colour & 0x00FFFFFFu) | (a << 24);
}

// A range of zero width (one point, or a constant series) still needs some room to draw in.
void widen_if_flat(double& lo, double& hi) {
  if (hi > lo) return;
  const double pad = lo == 0 ? 0.5 : std::fabs(lo) * 0.05;
  lo -= pad;
  hi += pad;
}

// Scales [lo, hi] by f around anchor: anchor keeps its place on screen.
void zoom_around(double& lo, double& hi, double anchor, double f) {
  lo = anchor - (anchor - lo) * f;
  hi = anchor + (hi - anchor) * f;
}

struct Rect {
  ImVec2 min, max;
  bool contains(ImVec2 p) const { return p.x >= min.x && p.x < max.x && p.y >= min.y && p.y < max.y; }
};

struct LegendLayout {
  std::vector<Rect> rows;  // one per series, in series order
  Rect box;
};

// Legend rows stacked in the plot's top-left corner: a swatch and the name.
LegendLayout legend_layout(std::span<const PlotSeries> series, ImVec2 pmin) {
  LegendLayout l;
  const float h = ImGui::GetTextLineHeight();
  const float swatch = h * 1.2f;
  float y = pmin.y + 4, w = 0;
  for (const PlotSeries& s : series) {
    const float row_w = swatch + 4 + ImGui::CalcTextSize(s.name.c_str()).x;
    w = std::max(w, row_w);
    l.rows.push_back({ImVec2(pmin.x + 6, y), ImVec2(pmin.x + 6 + row_w, y + h)});
    y += h + 1;
  }
  for (Rect& r : l.rows) r.max.x = r.min.x + w;  // whole-width rows are easier to click
  l.box = {ImVec2(pmin.x + 2, pmin.y + 2), ImVec2(pmin.x + 10 + w, y + 2)};
  return l;
}

// Builds polylines in pixels and draws them, one run at a time (NaN and gaps end a run).
class LineDrawer {
 public:
  LineDrawer(ImDrawList* dl, std::vector<ImVec2>& buf, ImU32 colour) : dl_(dl), buf_(buf), col_(colour) {
    buf_.clear();
  }
  void point(ImVec2 p) { buf_.push_back(p); }
  bool empty() const { return buf_.empty(); }
  // Ends the current run: a single point gets a dot so an isolated sample is still seen.
  void flush() {
    if (buf_.size() >= 2) {
      dl_->AddPolyline(buf_.data(), static_cast<int>(buf_.size()), col_, ImDrawFlags_None, kLineThickness);
    } else if (buf_.size() == 1) {
      const ImVec2 p = buf_[0];
      dl_->AddRectFilled(ImVec2(p.x - 1, p.y - 1), ImVec2(p.x + 1, p.y + 1), col_);
    }
    buf_.clear();
  }

 private:
  ImDrawList* dl_;
  std::vector<ImVec2>& buf_;
  ImU32 col_;
};

void draw_series(ImDrawList* dl, const PlotSeries& s, const Decimation& d, const AxisMap& xm,
                 const AxisMap& ym, std::vector<ImVec2>& buf) {
  LineDrawer line(dl, buf, s.colour);
  auto px = [&](double x, double y) { return ImVec2(xm.to_px(x), ym.to_px(y)); };
  if (d.raw) {
    bool first = true;
    for (size_t i = d.begin; i < d.end; ++i) {
      const double y = s.y[i];
      if (std::isnan(y)) {
        line.flush();
        first = false;
        continue;
      }
      if (first && d.left.valid) line.point(px(d.left.x, d.left.y));
      first = false;
      line.point(px(s.x[i], y));
    }
    if (first && d.left.valid) line.point(px(d.left.x, d.left.y));  // nothing visible: edge to edge
    if (d.right.valid) line.point(px(d.right.x, d.right.y));
    line.flush();
    return;
  }
  // Decimated: each column is a 1-pixel bar from its min to its max (every spike, exactly), and the line
  // enters at its first value and leaves at its last, so the shape between columns is the data's.
  bool any = false;
  for (size_t c = 0; c < d.columns.size(); ++c) {
    const DecimatedColumn& col = d.columns[c];
    if (!col.has_data) continue;
    const float x = xm.p0 + static_cast<float>(c) + 0.5f;
    if (!col.joins_previous) {
      line.flush();
    } else if (line.empty() && d.left.valid) {
      line.point(px(d.left.x, d.left.y));
    }
    line.point(ImVec2(x, ym.to_px(col.y_first)));
    if (col.y_last != col.y_first) line.point(ImVec2(x, ym.to_px(col.y_last)));
    if (col.y_max > col.y_min) {
      dl->AddRectFilled(ImVec2(x - 0.5f, ym.to_px(col.y_max)), ImVec2(x + 0.5f, ym.to_px(col.y_min) + 1),
                        s.colour);
    }
    any = true;
  }
  if (!any && d.left.valid) line.point(px(d.left.x, d.left.y));
  if (d.right.valid) line.point(px(d.right.x, d.right.y));
  line.flush();
}

// An x for the readout: steps are whole numbers and read best in full ("78442", not "78.44k").
std::string format_x(double x) {
  if (x == std::floor(x) && std::fabs(x) < 1e15) return std::to_string(static_cast<long long>(x));
  return format_value(x, 6);
}

// Index of the point of x nearest to v (x ascending, n ≥ 1).
size_t nearest_index(std::span<const double> x, double v) {
  const size_t i = decimate_lower_bound(x, v);
  if (i == 0) return 0;
  if (i >= x.size()) return x.size() - 1;
  return (v - x[i - 1] <= x[i] - v) ? i - 1 : i;
}

void draw_hover(ImDrawList* dl, const PlotView& view, std::span<const PlotSeries> series,
                std::span<const PlotMarker> markers, const AxisMap& xm, const AxisMap& ym, float mouse_x) {
  // The readout's x: the data point nearest the mouse across the visible series.
  double best_x = NAN, best_dist = INFINITY;
  for (const PlotSeries& s : series) {
    if (length(s) == 0 || view.is_hidden(s.name)) continue;
    const double x = s.x[nearest_index(xs(s), view.hover_x)];
    if (std::fabs(x - view.hover_x) < best_dist) {
      best_dist = std::fabs(x - view.hover_x);
      best_x = x;
    }
  }
  const PlotMarker* marker = nullptr;
  for (const PlotMarker& m : markers) {
    if (std::fabs(xm.to_px(m.x) - mouse_x) <= kMarkerHoverPx) marker = &m;
  }
  if (std::isnan(best_x) && marker == nullptr) return;

  ImGui::BeginTooltip();
  if (marker != nullptr) {
    ImGui::TextColored(ImColor(marker->colour), "%s", marker->label.c_str());
    ImGui::TextDisabled("at %s", format_x(marker->x).c_str());
  }
  if (!std::isnan(best_x)) {
    const float cx = std::round(xm.to_px(best_x)) + 0.5f;
    dl->AddLine(ImVec2(cx, ym.p1), ImVec2(cx, ym.p0), ImGui::GetColorU32(ImGuiCol_Text, 0.35f));
    ImGui::Text("%s", format_x(best_x).c_str());
    for (const PlotSeries& s : series) {
      if (length(s) == 0 || view.is_hidden(s.name)) continue;
      const size_t i = nearest_index(xs(s), best_x);
      const double y = s.y[i];
      // A series with no point at this x (sampled elsewhere) reads as absent, not as a neighbour's value.
      const bool here = s.x[i] == best_x;
      if (here && !std::isnan(y)) dl->AddCircleFilled(ImVec2(cx, ym.to_px(y)), 3.0f, s.colour);
      ImGui::TextColored(ImColor(s.colour), "%s", s.name.c_str());
      ImGui::SameLine();
      ImGui::Text("%s", here ? format_value(y).c_str() : "n/a");
    }
  }
  ImGui::EndTooltip();
}

}  // namespace

bool PlotView::is_hidden(std::string_view name) const {
  return std::find(hidden.begin(), hidden.end(), name) != hidden.end();
}

void PlotView::set_hidden(std::string_view name, bool hide) {
  auto it = std::find(hidden.begin(), hidden.end(), name);
  if (hide && it == hidden.end()) hidden.emplace_back(name);
  if (!hide && it != hidden.end()) hidden.erase(it);
}

std::vector<int> marker_label_rows(std::span<const float> x_px, std::span<const float> width_px, int rows) {
  constexpr float kGapPx = 4;
  std::vector<float> row_end(static_cast<size_t>(std::max(rows, 0)), -INFINITY);
  std::vector<int> out(x_px.size(), -1);
  for (size_t i = 0; i < x_px.size() && i < width_px.size(); ++i) {
    for (size_t r = 0; r < row_end.size(); ++r) {
      if (row_end[r] + kGapPx <= x_px[i]) {
        out[i] = static_cast<int>(r);
        row_end[r] = x_px[i] + width_px[i];
        break;
      }
    }
  }
  return out;
}

bool plot_lines(const char* id, PlotView& view, std::span<const PlotSeries> series,
                std::span<const PlotMarker> markers, ImVec2 size) {
  const ImGuiIO& io = ImGui::GetIO();
  const AxesItem item = axes_item(id, size);
  const ImVec2 wmin = item.min, wmax = item.max;
  const bool item_hovered = item.hovered, item_active = item.active;
  PlotExports* exports = plot_exports_current();
  if (exports != nullptr) exports->context_menu(id);

  // Layout: fixed margins sized for compact labels ("-888.8k"), so the plot does not shift as values do.
  const float line_h = ImGui::GetTextLineHeight();
  const float left = ImGui::CalcTextSize("-888.8k").x + kAxisTickLen + 2 * kAxisGap;
  const float bottom = line_h + kAxisTickLen + 2 + (view.x_label.empty() ? 0 : line_h + 2);
  const float top = view.y_label.empty() ? line_h / 2 : line_h + 4;
  const float right = ImGui::CalcTextSize("888.8k").x / 2;
  const ImVec2 pmin(std::floor(wmin.x + left), std::floor(wmin.y + top));
  const ImVec2 pmax(std::max(pmin.x + 1, std::floor(wmax.x - right)),
                    std::max(pmin.y + 1, std::floor(wmax.y - bottom)));
  view.plot_min = pmin;
  view.plot_max = pmax;
  const int width_px = static_cast<int>(pmax.x - pmin.x);
  const float height_px = pmax.y - pmin.y;
  const ImVec2 mouse = io.MousePos;
  const bool in_plot =
      item_hovered && mouse.x >= pmin.x && mouse.x < pmax.x && mouse.y >= pmin.y && mouse.y < pmax.y;
  bool changed = false;

  // ---- input, applied to last frame's ranges so the view responds this frame -------------------------
  const LegendLayout legend = view.show_legend ? legend_layout(series, pmin) : LegendLayout{};
  if (ImGui::IsMouseClicked(ImGuiMouseButton_Left) && item_hovered) {
    view.dragging = in_plot;
    for (size_t i = 0; i < legend.rows.size(); ++i) {
      if (legend.rows[i].contains(mouse)) {
        view.set_hidden(series[i].name, !view.is_hidden(series[i].name));
        view.dragging = false;  // a legend click is not the start of a pan
        changed = true;
      }
    }
  }
  if (!item_active) view.dragging = false;
  const double x_per_px = (view.x_max - view.x_min) / std::max(width_px, 1);
  const double y_per_px = (view.y_max - view.y_min) / std::max(height_px, 1.0f);
  if (view.dragging && (io.MouseDelta.x != 0 || io.MouseDelta.y != 0)) {
    if (io.MouseDelta.x != 0) {
      const double dx = -io.MouseDelta.x * x_per_px;
      view.x_min += dx;
      view.x_max += dx;
      view.fit_x = false;
      view.follow_latest = false;  // dragging back in time means the operator wants to look there
    }
    if (io.MouseDelta.y != 0) {
      const double dy = io.MouseDelta.y * y_per_px;
      view.y_min += dy;
      view.y_max += dy;
      view.fit_y = false;
    }
    changed = true;
  }
  const float wheel = io.MouseWheel != 0 ? io.MouseWheel : io.MouseWheelH;
  if (in_plot && wheel != 0) {
    const double f = std::pow(kWheelZoom, wheel);
    const bool zoom_x = !io.KeyCtrl || io.KeyShift;
    const bool zoom_y = io.KeyCtrl || io.KeyShift;
    if (zoom_x) {
      if (view.follow_latest) {
        // Following: the right edge stays on the newest point; only the width changes.
        view.follow_width = (view.x_max - view.x_min) * f;
        view.x_min = view.x_max - view.follow_width;
      } else {
        zoom_around(view.x_min, view.x_max, view.x_min + (mouse.x - pmin.x) * x_per_px, f);
      }
      view.fit_x = false;
    }
    if (zoom_y) {
      zoom_around(view.y_min, view.y_max, view.y_max - (mouse.y - pmin.y) * y_per_px, f);
      view.fit_y = false;
    }
    changed = true;
  }
  const bool over_legend =
      std::any_of(legend.rows.begin(), legend.rows.end(), [&](const Rect& r) { return r.contains(mouse); });
  if (in_plot && !over_legend && ImGui::IsMouseDoubleClicked(ImGuiMouseButton_Left)) {
    view.fit();
    changed = true;
  }

  // ---- ranges ---------------------------------------------------------------------------------------
  double data_x0 = INFINITY, data_x1 = -INFINITY;
  for (const PlotSeries& s : series) {
    if (length(s) == 0 || view.is_hidden(s.name)) continue;
    data_x0 = std::min(data_x0, s.x[0]);
    data_x1 = std::max(data_x1, s.x[s.n - 1]);
  }
  const bool have_data = data_x0 <= data_x1;
  if (have_data && view.fit_x) {
    view.x_min = data_x0;
    view.x_max = data_x1;
  } else if (have_data && view.follow_latest) {
    if (!(view.follow_width > 0)) view.follow_width = view.x_max - view.x_min;
    view.x_max = data_x1;
    view.x_min = data_x1 - view.follow_width;
  }
  widen_if_flat(view.x_min, view.x_max);

  view.scratch.resize(series.size());
  double lo = INFINITY, hi = -INFINITY;
  for (size_t i = 0; i < series.size(); ++i) {
    const PlotSeries& s = series[i];
    Decimation& d = view.scratch[i];
    if (view.is_hidden(s.name)) {
      d = Decimation{};
      continue;
    }
    decimate(xs(s).first(length(s)), ys(s).first(length(s)), view.x_min, view.x_max, width_px, d);
    if (d.has_y) {
      lo = std::min(lo, d.y_min);
      hi = std::max(hi, d.y_max);
    }
  }
  // An infinite sample cannot be fitted; the axis keeps its last finite range instead.
  if (view.fit_y && lo <= hi && std::isfinite(lo) && std::isfinite(hi)) {
    widen_if_flat(lo, hi);
    const double pad = (hi - lo) * kFitPad;
    view.y_min = lo - pad;
    view.y_max = hi + pad;
  }
  widen_if_flat(view.y_min, view.y_max);

  // ---- drawing --------------------------------------------------------------------------------------
  ImDrawList* dl = ImGui::GetWindowDrawList();
  const AxisMap xm{view.x_min, view.x_max, pmin.x, pmin.x + static_cast<float>(width_px)};
  const AxisMap ym{view.y_min, view.y_max, pmax.y, pmin.y};
  dl->AddRectFilled(pmin, pmax, ImGui::GetColorU32(ImGuiCol_FrameBg));
  const int x_target = std::max(2, width_px / 90);
  axes_draw_x(dl, xm,
              view.x_integer ? ticks_integer(view.x_min, view.x_max, x_target)
                             : ticks_nice(view.x_min, view.x_max, x_target),
              pmin, pmax, true);
  axes_draw_y(dl, ym, ticks_nice(view.y_min, view.y_max, std::max(2, static_cast<int>(height_px / 40))), pmin,
              pmax, true);
  const ImU32 text = ImGui::GetColorU32(ImGuiCol_Text);
  if (!view.y_label.empty()) dl->AddText(ImVec2(wmin.x, wmin.y), text, view.y_label.c_str());
  if (!view.x_label.empty()) {
    const float w = ImGui::CalcTextSize(view.x_label.c_str()).x;
    dl->AddText(ImVec2((pmin.x + pmax.x - w) / 2, wmax.y - line_h), text, view.x_label.c_str());
  }

  dl->PushClipRect(pmin, pmax, true);
  {
    // Labels in rows so that none overprints another (marker_label_rows); what has no room shows on hover.
    std::vector<const PlotMarker*> shown;
    std::vector<float> xs, widths;
    for (const PlotMarker& m : markers) {
      if (m.x < view.x_min || m.x > view.x_max) continue;
      shown.push_back(&m);
    }
    std::stable_sort(shown.begin(), shown.end(),
                     [](const PlotMarker* a, const PlotMarker* b) { return a->x < b->x; });
    for (const PlotMarker* m : shown) {
      xs.push_back(std::round(xm.to_px(m->x)) + 3.5f);
      widths.push_back(ImGui::CalcTextSize(m->label.c_str()).x);
    }
    const int rows = std::max(1, std::min(3, static_cast<int>((pmax.y - pmin.y) / (3 * line_h))));
    const std::vector<int> row = marker_label_rows(xs, widths, rows);
    for (size_t i = 0; i < shown.size(); ++i) {
      const float x = xs[i] - 3;
      dl->AddLine(ImVec2(x, pmin.y), ImVec2(x, pmax.y), with_alpha(shown[i]->colour, 0.7f));
      if (row[i] >= 0)
        dl->AddText(ImVec2(xs[i], pmin.y + 2 + static_cast<float>(row[i]) * line_h), shown[i]->colour,
                    shown[i]->label.c_str());
    }
  }
  for (size_t i = 0; i < series.size(); ++i) {
    if (view.is_hidden(series[i].name) || length(series[i]) == 0) continue;
    draw_series(dl, series[i], view.scratch[i], xm, ym, view.scratch_points);
  }
  view.hovered = in_plot;
  view.hover_x = in_plot ? xm.to_data(mouse.x) : NAN;
  view.hover_y = in_plot ? ym.to_data(mouse.y) : NAN;
  if (in_plot && !view.dragging) draw_hover(dl, view, series, markers, xm, ym, mouse.x);
  if (view.show_legend && !series.empty()) {
    dl->AddRectFilled(legend.box.min, legend.box.max, ImGui::GetColorU32(ImGuiCol_PopupBg, 0.8f));
    for (size_t i = 0; i < series.size(); ++i) {
      const Rect& r = legend.rows[i];
      const bool hidden = view.is_hidden(series[i].name);
      // Hidden entries are dimmed (never in the series' own colour: a hidden series draws nothing of it).
      const ImU32 swatch = hidden ? with_alpha(series[i].colour, 0.25f) : series[i].colour;
      const float h = r.max.y - r.min.y, sw = h * 1.2f;
      const ImVec2 a(r.min.x, r.min.y + h * 0.3f), b(r.min.x + sw, r.min.y + h * 0.7f);
      if (hidden) {
        dl->AddRect(a, b, swatch);
      } else {
        dl->AddRectFilled(a, b, swatch);
      }
      if (r.contains(mouse) && item_hovered) dl->AddRect(r.min, r.max, ImGui::GetColorU32(ImGuiCol_Border));
      dl->AddText(ImVec2(r.min.x + sw + 4, r.min.y),
                  hidden ? ImGui::GetColorU32(ImGuiCol_TextDisabled) : text, series[i].name.c_str());
    }
  }
  dl->PopClipRect();
  dl->AddRect(pmin, pmax, ImGui::GetColorU32(ImGuiCol_Border));
  if (exports != nullptr) exports->on_plot(id, wmin, wmax, [&] { return plot_csv(series, view); });
  return changed;
}

}  // namespace gantry::plot
