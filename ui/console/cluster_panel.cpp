// The Cluster panel: one row per node, one cell per device (slot), coloured by state.
#include <imgui.h>

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "ui/console/layout_times.h"  // each rank's (dp, pp, tp) coordinate
#include "ui/console/panels.h"
#include "ui/console/stragglers.h"

namespace gantry::console {
namespace {

ImU32 state_colour(const std::string& state) {
  if (state == "healthy") return IM_COL32(60, 150, 90, 255);
  if (state == "straggler") return IM_COL32(230, 150, 40, 255);
  if (state == "quarantined") return IM_COL32(150, 90, 200, 255);
  if (state == "lost") return IM_COL32(200, 60, 60, 255);
  if (state == "spare") return IM_COL32(80, 120, 180, 255);
  if (state == "unhealthy") return IM_COL32(200, 110, 60, 255);
  return IM_COL32(110, 110, 110, 255);
}

void legend_chip(const char* state) {
  const ImVec2 p = ImGui::GetCursorScreenPos();
  const float h = ImGui::GetTextLineHeight();
  ImGui::GetWindowDrawList()->AddRectFilled(p, ImVec2(p.x + h, p.y + h), state_colour(state), 2.0f);
  ImGui::Dummy(ImVec2(h, h));
  ImGui::SameLine();
  ImGui::TextUnformatted(state);
  ImGui::SameLine();
}

}  // namespace

void ClusterPanel::draw(const ConsoleSnapshot& s, PanelContext& ctx) {
  ctx.frame.panels.push_back("Cluster");
  if (s.nodes.empty()) {
    ImGui::TextDisabled(s.connected ? "no nodes have registered" : "not connected");
    return;
  }
  for (const char* st : {"healthy", "straggler", "quarantined", "lost", "spare", "unhealthy"})
    legend_chip(st);
  ImGui::NewLine();

  // Which rank of the followed run each (node, slot) holds, and which ranks are flagged stragglers.
  std::vector<StragglerRow> rows = straggler_rows(s.ranks);
  auto rank_at = [&](const std::string& node, int slot) -> int {
    for (const ShareView& sh : s.run.placement) {
      if (sh.node != node || sh.done) continue;
      for (size_t k = 0; k < sh.slots.size(); ++k)
        if (sh.slots[k] == slot) return sh.first_rank + static_cast<int>(k);
    }
    return -1;
  };
  auto flagged = [&](int rank) {
    for (const StragglerRow& r : rows)
      if (r.rank == rank) return r.flagged;
    return false;
  };

  // A 3D run's cells are wide enough for the rank's coordinate under its number.
  const auto view_of = [&](int rank) {
    return std::find_if(s.ranks.begin(), s.ranks.end(), [&](const RankView& v) { return v.rank == rank; });
  };
  const bool coords =
      std::any_of(s.ranks.begin(), s.ranks.end(), [](const RankView& v) { return v.coord.has_value(); });
  const float cell_h = ImGui::GetTextLineHeight() * 2.2f;
  const float cell = coords ? std::max(cell_h, ImGui::CalcTextSize("00,0,0").x + 8) : cell_h;
  ImDrawList* dl = ImGui::GetWindowDrawList();
  for (const NodeView& n : s.nodes) {
    const double age = s.cluster_seen_unix_s > 0 && n.last_seen_unix_s > 0
                           ? s.cluster_seen_unix_s - n.last_seen_unix_s
                           : NAN;
    char age_text[32] = "-";
    if (std::isfinite(age)) std::snprintf(age_text, sizeof age_text, "%.1f s", std::max(0.0, age));
    // Release first on the line: after the node's long status line it sat past a narrow panel's right edge,
    // out of sight and out of a scripted click's reach (the Quarantine/Release window test hung on it).
    if (n.state == "quarantined") {
      if (ctx.clicks.button(("Release " + n.id).c_str(), s.connected)) ctx.source.request_release(n.id);
      ImGui::SameLine();
    }
    ImGui::Text("%s  %s  %d/%d busy  heartbeat %s ago  health %s", n.id.c_str(), n.state.c_str(),
                n.busy_slots, n.slots, age_text, n.health.c_str());
    if (!n.health_reason.empty()) ImGui::TextWrapped("  %s", n.health_reason.c_str());
    for (int slot = 0; slot < n.slots; ++slot) {
      if (slot > 0) ImGui::SameLine();
      const int rank = rank_at(n.id, slot);
      std::string state = n.state;
      if (state == "healthy" && rank >= 0 && flagged(rank)) state = "straggler";
      const ImVec2 p = ImGui::GetCursorScreenPos();
      ImU32 fill = state_colour(state);
      if (rank < 0 && state == "healthy") fill = IM_COL32(45, 85, 60, 255);  // healthy but idle: dimmer
      dl->AddRectFilled(p, ImVec2(p.x + cell, p.y + cell_h), fill, 3.0f);
      char label[16];
      std::snprintf(label, sizeof label, rank >= 0 ? "r%d" : "-", rank);
      dl->AddText(ImVec2(p.x + 4, p.y + 4), IM_COL32(255, 255, 255, 255), label);
      const auto rv = rank >= 0 ? view_of(rank) : s.ranks.end();
      if (rv != s.ranks.end() && rv->coord) {
        dl->AddText(ImVec2(p.x + 4, p.y + 4 + ImGui::GetTextLineHeight()), IM_COL32(220, 220, 220, 255),
                    rank_coord_text(*rv).c_str());
      }
      ImGui::PushID(n.id.c_str());
      ImGui::PushID(slot);
      ImGui::InvisibleButton("##device", ImVec2(cell, cell_h));
      ImGui::PopID();
      ImGui::PopID();
      if (ImGui::IsItemHovered()) {
        ImGui::BeginTooltip();
        ImGui::Text("%s device %d: %s", n.id.c_str(), slot, state.c_str());
        if (rank >= 0) {
          ImGui::Text("rank %d of run %lld", rank, static_cast<long long>(s.run.id));
          const auto view = view_of(rank);
          if (view != s.ranks.end() && view->coord) {
            ImGui::Text("coordinate dp %d, pp %d, tp %d", view->coord->dp, view->coord->pp, view->coord->tp);
          }
          if (view != s.ranks.end() && view->latest.step > 0) {
            const RankStepRecord& r = view->latest;
            ImGui::Text("step %lld: %.3f s", static_cast<long long>(r.step), r.total_s);
            if (r.temperature_celsius) ImGui::Text("temperature %.0f C", *r.temperature_celsius);
            if (r.sm_clock_hertz) ImGui::Text("SM clock %.0f MHz", *r.sm_clock_hertz / 1e6);
            if (r.power_watts) ImGui::Text("power %.0f W", *r.power_watts);
            if (!r.temperature_celsius && !r.sm_clock_hertz)
              ImGui::TextDisabled("no sensor readings (CPU or no NVML)");
          }
        } else {
          ImGui::TextDisabled("idle, or held by another run");
        }
        ImGui::EndTooltip();
      }
    }
  }
}

}  // namespace gantry::console
