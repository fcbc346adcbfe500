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
  return n == 0 ? IM_COL32(90, 170, 255, 255) : IM_COL32(255, 160, 60, 255);
}

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
  ImGui::TextDisabled("%s  (click runs to overlay two)", m.is_open() ? m.path().c_str() : "no history open");
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
  std::vector<plot::PlotSeries> series;
  for (size_t i = 0; i < m.overlay().size(); ++i) {
    const OverlaySeries& s = m.overlay()[i];
    series.push_back({s.name, s.step.data(), s.loss.data(), s.step.size(), history_series_colour(i)});
  }
  if (changed) view.plot.fit();
  plot::plot_lines("##loss overlay", view.plot, series, {},
                   ImVec2(-1, std::max(160.0f, ImGui::GetContentRegionAvail().y)));
  ImGui::PopID();
  return changed;
}

}  // namespace gantry::history
