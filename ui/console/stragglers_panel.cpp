// The Stragglers panel: ranks with the most excess time first (what `ctl ranks` prints: "forward +0.24 s"),
// and a confirmed quarantine of a node.
#include <imgui.h>

#include <cmath>

#include "engine/cluster/run_lifecycle.h"  // run_state_terminal: the policy switches only while the run lives
#include "ui/console/panels.h"
#include "ui/console/stragglers.h"

namespace gantry::console {

void StragglersPanel::draw(const ConsoleSnapshot& s, PanelContext& ctx) {
  ctx.frame.panels.push_back("Stragglers");
  // The run's policy, switchable while it lives: a flagged rank's node quarantined by the coordinator.
  if (s.run.id >= 0) {
    const bool live =
        s.connected && !run_state_terminal(run_state_from_name(s.run.state).value_or(RunState::kFinished));
    const bool known = s.run.straggler_quarantine.has_value();
    bool on = s.run.straggler_quarantine.value_or(false);
    ImGui::BeginDisabled(!live || !known);
    if (ImGui::Checkbox("Quarantine stragglers' nodes", &on))
      ctx.source.request_straggler_quarantine(s.run.id, on);
    ctx.clicks.record_last_item("Quarantine stragglers' nodes", live && known);
    ImGui::EndDisabled();
    if (ImGui::IsItemHovered(ImGuiHoveredFlags_AllowWhenDisabled)) {
      ImGui::SetTooltip("%s", !known  ? "the coordinator has not said (policy unknown)"
                              : !live ? "the run has ended, or the coordinator is not connected"
                                      : "on: a rank flagged for its windows has its node quarantined and the "
                                        "run moves off it; off: stragglers are only flagged");
    }
  }
  if (s.ranks.empty()) {
    ImGui::TextDisabled("no ranks (no run followed)");
    return;
  }
  const std::vector<StragglerRow> rows = straggler_rows(s.ranks);
  bool any_coordinator = false;
  for (const StragglerRow& r : rows) any_coordinator = any_coordinator || r.scored_by_coordinator;
  if (!any_coordinator)
    ImGui::TextDisabled("not scored by the coordinator yet: scores from each rank's latest step");
  if (ImGui::BeginTable("##stragglers", 6,
                        ImGuiTableFlags_RowBg | ImGuiTableFlags_Borders | ImGuiTableFlags_ScrollY,
                        ImVec2(0, std::max(80.0f, ImGui::GetContentRegionAvail().y -
                                                      ImGui::GetFrameHeightWithSpacing() * 2)))) {
    // Busy time rather than step time: in a synchronous job every rank's step takes as long as the slowest's.
    for (const char* h : {"rank", "node", "score", "own best", "excess", "busy ms"})
      ImGui::TableSetupColumn(h);
    ImGui::TableSetupScrollFreeze(0, 1);
    ImGui::TableHeadersRow();
    for (const StragglerRow& r : rows) {
      ImGui::TableNextRow();
      if (r.flagged) ImGui::TableSetBgColor(ImGuiTableBgTarget_RowBg0, IM_COL32(120, 70, 20, 200));
      ImGui::TableNextColumn();
      ImGui::Text("%d%s", r.rank, r.flagged ? " !" : "");
      ImGui::TableNextColumn();
      ImGui::TextUnformatted(r.node.c_str());
      ImGui::TableNextColumn();
      if (std::isnan(r.score))
        ImGui::TextDisabled("-");
      else
        ImGui::Text("%.2f%s", r.score, r.scored_by_coordinator ? "" : "*");
      ImGui::TableNextColumn();
      if (std::isnan(r.individual))
        ImGui::TextDisabled("-");
      else
        ImGui::Text("%.2f", r.individual);
      ImGui::TableNextColumn();
      ImGui::TextUnformatted(r.excess.c_str());
      ImGui::TableNextColumn();
      if (r.busy_seconds > 0)
        ImGui::Text("%.1f", r.busy_seconds * 1e3);
      else
        ImGui::TextDisabled("-");
    }
    ImGui::EndTable();
  }

  // Quarantine: offered for the node of the slowest rank (the list's first), only when a rank there is
  // flagged or the operator overrides that (quarantine_plan.h), confirmed in a modal naming what moves.
  const std::string node = rows.front().node;
  plan_ = quarantine_plan(s, node, override_);
  if (ctx.clicks.button("Quarantine node...", plan_.enabled)) {
    confirm_node_ = node;
    ImGui::OpenPopup("Quarantine?");
  }
  ImGui::SameLine();
  ImGui::TextDisabled("%s", node.c_str());
  ImGui::SameLine();
  ImGui::Checkbox("Override##quarantine", &override_);
  if (ImGui::IsItemHovered()) ImGui::SetTooltip("offer the quarantine though no rank on the node is flagged");
  if (!plan_.enabled) ImGui::TextDisabled("%s", plan_.why_not.c_str());
  if (ImGui::BeginPopupModal("Quarantine?", nullptr, ImGuiWindowFlags_AlwaysAutoResize)) {
    ImGui::Text("Quarantine node %s?", confirm_node_.c_str());
    if (plan_.moves.empty()) ImGui::TextUnformatted("No run has ranks on it: nothing moves.");
    for (const std::string& m : plan_.moves) ImGui::BulletText("%s", m.c_str());
    ImGui::TextWrapped(
        "Its runs checkpoint and stop at the next step, and are placed again without it (at a smaller dp if "
        "need be) "
        "and resumed from that checkpoint. The node takes no more work until released.");
    if (ctx.clicks.button("Quarantine")) {
      ctx.source.request_quarantine(confirm_node_);
      ImGui::CloseCurrentPopup();
    }
    ImGui::SameLine();
    if (ctx.clicks.button("Cancel##quarantine")) ImGui::CloseCurrentPopup();
    ImGui::EndPopup();
  }
}

}  // namespace gantry::console
