// The Checkpoints panel: the followed run's checkpoint catalog.
#include <imgui.h>

#include <ctime>
#include <string>

#include "ui/console/checkpoint_text.h"
#include "ui/console/memory_copy_view.h"
#include "ui/console/panels.h"

namespace gantry::console {

void CheckpointsPanel::draw(const ConsoleSnapshot& s, PanelContext& ctx) {
  ctx.frame.panels.push_back("Checkpoints");
  if (s.run.id >= 0) {
    // The newest complete set of in-memory copies a recovery would restore from, and where its shards are.
    const std::string mem = memory_copy_text(memory_copy_view(s.run.memory_copies, s.run.placement));
    ImGui::TextDisabled("in memory:");
    ImGui::SameLine();
    ImGui::TextWrapped("%s", mem.c_str());
  }
  if (s.checkpoints.empty()) {
    ImGui::TextDisabled(s.run.id >= 0 ? "no checkpoints yet" : "no run followed");
    return;
  }
  if (!ImGui::BeginTable("##checkpoints", 6,
                         ImGuiTableFlags_RowBg | ImGuiTableFlags_Borders | ImGuiTableFlags_ScrollY))
    return;
  for (const char* h : {"step", "state", "MiB", "write s", "stall s", "age"}) ImGui::TableSetupColumn(h);
  ImGui::TableSetupScrollFreeze(0, 1);
  ImGui::TableHeadersRow();
  for (auto it = s.checkpoints.rbegin(); it != s.checkpoints.rend(); ++it) {
    ImGui::TableNextRow();
    ImGui::TableNextColumn();
    ImGui::Text("%lld", static_cast<long long>(it->step));
    if (ImGui::IsItemHovered()) ImGui::SetTooltip("%s", it->path.c_str());
    ImGui::TableNextColumn();
    ImGui::TextUnformatted(it->state.c_str());
    ImGui::TableNextColumn();
    ImGui::Text("%.1f", static_cast<double>(it->bytes) / (1 << 20));
    ImGui::TableNextColumn();
    ImGui::Text("%.2f", it->write_s);
    ImGui::TableNextColumn();
    // What the checkpoint cost training, beside what it took to write: unknown is a dash, never 0.
    const std::string stall = checkpoint_seconds_text(it->stall_s);
    if (it->stall_s)
      ImGui::TextUnformatted(stall.c_str());
    else
      ImGui::TextDisabled("%s", stall.c_str());
    if (ImGui::IsItemHovered())
      ImGui::SetTooltip("the time the step loop was blocked for this checkpoint%s",
                        it->stall_s ? "" : ": not known (catalogued by an older build)");
    ImGui::TableNextColumn();
    if (it->time_unix_s > 0)
      ImGui::Text("%.0f s", ctx.now_unix_s - it->time_unix_s);
    else
      ImGui::TextDisabled("-");
  }
  ImGui::EndTable();
}

}  // namespace gantry::console
