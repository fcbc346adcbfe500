#include "ui/history/history_panel.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <string>

namespace gantry::history {

namespace {

std::string start_text(double unix_s) {
  if (!(unix_s > 0)) return "-";
  const std::time_t t = static_cast<std::time_t>(unix_s);
  std::tm tm{};
  localtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M", &tm);
  return buf;
}

bool draw_button(const PanelButton& button, const char* label, bool enabled) {
  if (button) return button(label, enabled);
  ImGui::BeginDisabled(!enabled);
  const bool pressed = ImGui::Button(label);
  ImGui::EndDisabled();
  return pressed && enabled;
}

}  // namespace

uint32_t history_series_colour(size_t n) {
  static const uint32_t kColours[] = {IM_COL32(90, 170, 255, 255),  IM_COL32(255, 160, 60, 255),
                                      IM_COL32(110, 200, 120, 255), IM_COL32(230, 90, 80, 255),
                                      IM_COL32(180, 130, 255, 255), IM_COL32(240, 220, 80, 255),
                                      IM_COL32(80, 210, 210, 255),  IM_COL32(230, 130, 200, 255)};
  return kColours[n % (sizeof kColours / sizeof kColours[0])];
}

namespace {

constexpr StepMetric kStepMetrics[] = {StepMetric::loss,         StepMetric::grad_norm, StepMetric::lr,
                                       StepMetric::tokens_per_s, StepMetric::step_s,    StepMetric::mfu,
                                       StepMetric::hfu,          StepMetric::val_loss};

// The compared curves of one metric as drawn: x by the chosen axis, y smoothed and on the chosen scale.
struct Drawn {
  std::vector<std::vector<double>> y;
  std::vector<plot::PlotSeries> series;
};
void prepare(const std::vector<OverlaySeries>& curves, const HistoryPanelView& view, Drawn* d) {
  d->y.clear();
  d->series.clear();
  d->y.reserve(curves.size());
  for (size_t i = 0; i < curves.size(); ++i) {
    const OverlaySeries& s = curves[i];
    std::vector<double> y = ema_smooth(s.loss, view.smoothing);
    if (view.log_scale) y = log10_values(y);
    d->y.push_back(std::move(y));
    const std::vector<double>& x = s.x(view.axis);
    d->series.push_back({s.name, x.data(), d->y.back().data(), std::min(x.size(), d->y.back().size()),
                         history_series_colour(i)});
  }
}

// The other plot's hovered x as a vertical line across this one: the crosshair.
void crosshair(const plot::PlotView& at, double x) {
  if (std::isnan(x) || !(at.x_max > at.x_min)) return;
  const float px = at.plot_min.x + static_cast<float>((x - at.x_min) / (at.x_max - at.x_min)) *
                                       (at.plot_max.x - at.plot_min.x);
  if (px < at.plot_min.x || px > at.plot_max.x) return;
  ImGui::GetWindowDrawList()->AddLine(ImVec2(px, at.plot_min.y), ImVec2(px, at.plot_max.y),
                                      IM_COL32(255, 255, 255, 140));
}

}  // namespace

bool history_panel(HistoryModel& m, HistoryPanelView& view, const PanelButton& button) {
  bool changed = false;
  view.rows.clear();
  ImGui::PushID("history");
  if (draw_button(button, "Refresh", m.is_open())) m.refresh();
  ImGui::SameLine();
  if (draw_button(button, "Clear selection", !m.selected().empty())) {
    m.clear_selection();
    changed = true;
  }
  ImGui::SameLine();
  ImGui::TextDisabled("%s  (click runs to compare them)", m.is_open() ? m.path().c_str() : "no history open");
  if (!m.error().empty()) ImGui::TextColored(ImVec4(1.0f, 0.45f, 0.35f, 1.0f), "%s", m.error().c_str());

  const ImGuiTableFlags flags = ImGuiTableFlags_RowBg | ImGuiTableFlags_BordersInnerV |
                                ImGuiTableFlags_ScrollY | ImGuiTableFlags_SizingFixedFit;
  const float rows_shown = static_cast<float>(std::clamp<size_t>(m.runs().size(), 1, 8)) + 1.5f;
  if (ImGui::BeginTable("##runs", 7, flags, ImVec2(0, ImGui::GetTextLineHeightWithSpacing() * rows_shown))) {
    ImGui::TableSetupScrollFreeze(0, 1);
    for (const char* h : {"run", "name", "start", "state", "last step", "last loss", "layout"})
      ImGui::TableSetupColumn(h);
    ImGui::TableHeadersRow();
    ImGuiListClipper clipper;  // draw only the visible rows: a cache can hold thousands of runs
    clipper.Begin(static_cast<int>(m.runs().size()));
    int64_t clicked = -1;
    while (clipper.Step()) {
      for (int i = clipper.DisplayStart; i < clipper.DisplayEnd; ++i) {
        const HistoryRun& r = m.runs()[static_cast<size_t>(i)];
        ImGui::TableNextRow();
        ImGui::TableNextColumn();
        const auto sel = std::find(m.selected().begin(), m.selected().end(), r.id);
        const bool selected = sel != m.selected().end();
        if (selected) {
          const size_t n = static_cast<size_t>(sel - m.selected().begin());
          ImGui::PushStyleColor(ImGuiCol_Header, history_series_colour(n) & IM_COL32(255, 255, 255, 110));
        }
        char id[48];
        std::snprintf(id, sizeof id, "%lld##run%lld", static_cast<long long>(r.id),
                      static_cast<long long>(r.id));
        if (ImGui::Selectable(id, selected, ImGuiSelectableFlags_SpanAllColumns)) clicked = r.id;
        view.rows.push_back({r.id, ImGui::GetItemRectMin(), ImGui::GetItemRectMax()});
        if (selected) ImGui::PopStyleColor();
        ImGui::TableNextColumn();
        ImGui::TextUnformatted(r.name.c_str());
        ImGui::TableNextColumn();
        ImGui::TextUnformatted(start_text(r.start_unix_s).c_str());
        ImGui::TableNextColumn();
        ImGui::TextUnformatted(r.state.c_str());
        ImGui::TableNextColumn();
        if (r.last_step >= 0) {
          ImGui::Text("%lld", static_cast<long long>(r.last_step));
        } else {
          ImGui::TextUnformatted("-");
        }
        ImGui::TableNextColumn();
        if (r.last_step < 0) {
          ImGui::TextUnformatted("-");
        } else if (std::isnan(r.last_loss)) {
          ImGui::TextUnformatted("NaN");
        } else {
          ImGui::Text("%.4f", r.last_loss);
        }
        ImGui::TableNextColumn();
        ImGui::TextUnformatted(r.layout.c_str());
      }
    }
    ImGui::EndTable();
    if (clicked >= 0) {
      m.toggle(clicked);
      changed = true;
    }
  }

  // One point per pixel column or so: storage decimates to that, and the plot's own min/max decimation
  // then has nothing left to fold. Powers of two keep it from re-querying on every small resize.
  const float width = std::max(64.0f, ImGui::GetContentRegionAvail().x);
  int32_t points = 64;
  while (points < static_cast<int32_t>(width) && points < (1 << 20)) points *= 2;
  m.set_max_points(points);
  // The comparison's controls: the two metrics, the x axis, smoothing, the scale.
  bool refit = changed;
  for (int k = 0; k < 2; ++k) {
    ImGui::SetNextItemWidth(110);
    const char* label = k == 0 ? "##metric0" : "##metric1";
    if (ImGui::BeginCombo(label, std::string(step_metric_name(kStepMetrics[view.metric[k]])).c_str())) {
      for (int i = 0; i < static_cast<int>(std::size(kStepMetrics)); ++i) {
        if (ImGui::Selectable(std::string(step_metric_name(kStepMetrics[i])).c_str(), i == view.metric[k])) {
          view.metric[k] = i;
          refit = true;
        }
      }
      ImGui::EndCombo();
    }
    ImGui::SameLine();
  }
  m.set_metrics(kStepMetrics[view.metric[0]], kStepMetrics[view.metric[1]]);
  int axis = view.axis == CompareAxis::kTime ? 1 : 0;
  refit |= ImGui::RadioButton("step", &axis, 0);
  ImGui::SameLine();
  refit |= ImGui::RadioButton("time", &axis, 1);
  view.axis = axis == 1 ? CompareAxis::kTime : CompareAxis::kStep;
  m.set_axis(view.axis);
  ImGui::SameLine();
  ImGui::SetNextItemWidth(100);
  ImGui::SliderFloat("smoothing", &view.smoothing, 0.0f, 0.99f, "%.2f");
  ImGui::SameLine();
  refit |= ImGui::Checkbox("log", &view.log_scale);

  Drawn d[2];
  plot::PlotView* plots[2] = {&view.plot, &view.plot2};
  for (int k = 0; k < 2; ++k) {
    prepare(m.overlay(static_cast<size_t>(k)), view, &d[k]);
    const std::string name(step_metric_name(kStepMetrics[view.metric[k]]));
    plots[k]->y_label = view.log_scale ? "log10 " + name : name;
    plots[k]->x_label = view.axis == CompareAxis::kTime ? "seconds since the run's first step" : "step";
    plots[k]->x_integer = view.axis == CompareAxis::kStep;
    if (refit) plots[k]->fit();
  }
  const float h = std::max(80.0f, (ImGui::GetContentRegionAvail().y - ImGui::GetStyle().ItemSpacing.y) / 2);
  const bool moved0 = plot::plot_lines("##loss overlay", view.plot, d[0].series, {}, ImVec2(-1, h));
  const bool moved1 = plot::plot_lines("##second overlay", view.plot2, d[1].series, {}, ImVec2(-1, h));
  // Linked zoom: whichever the operator moved, the other follows (from the next frame on).
  if (moved0) link_x(view.plot, view.plot2);
  if (moved1 && !moved0) link_x(view.plot2, view.plot);
  if (view.plot.hovered) crosshair(view.plot2, view.plot.hover_x);
  if (view.plot2.hovered) crosshair(view.plot, view.plot2.hover_x);
  ImGui::PopID();
  return changed;
}

}  // namespace gantry::history
