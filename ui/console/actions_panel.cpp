// The Actions panel: checkpoint now, pause, resume, stop, resume from a chosen checkpoint on a chosen dp.
#include <imgui.h>

#include <string>

#include "ui/console/actions.h"
#include "ui/console/panels.h"

namespace gantry::console {

void ActionsPanel::draw(const ConsoleSnapshot& s, PanelContext& ctx) {
  ctx.frame.panels.push_back("Actions");
  const std::string state = s.run.id >= 0 ? s.run.state : "";
  size_t committed = 0;
  for (const CheckpointView& c : s.checkpoints) committed += c.state == "committed";
  if (s.run.id >= 0) ImGui::Text("run %lld: %s", static_cast<long long>(s.run.id), state.c_str());
  for (RunAction a : {RunAction::kCheckpoint, RunAction::kPause, RunAction::kResume, RunAction::kStop}) {
    const ActionAvailability av = action_availability(a, state, committed, s.connected);
    if (a != RunAction::kCheckpoint) ImGui::SameLine();
    const std::string label(action_label(a));
    if (ctx.clicks.button(label.c_str(), av.enabled)) ctx.source.request_action(s.run.id, a);
    if (!av.enabled && ImGui::IsItemHovered(ImGuiHoveredFlags_AllowWhenDisabled))
      ImGui::SetTooltip("%s", av.why_not.c_str());
  }

  // Resume from: a checkpoint of the run (latest by default) and a dp (the run's by default).
  const ActionAvailability rf = action_availability(RunAction::kResumeFrom, state, committed, s.connected);
  if (checkpoint_index_ >= static_cast<int>(s.checkpoints.size())) checkpoint_index_ = -1;
  const std::string preview =
      checkpoint_index_ < 0
          ? std::string("latest")
          : "step " + std::to_string(s.checkpoints[static_cast<size_t>(checkpoint_index_)].step);
  ImGui::SetNextItemWidth(ImGui::GetFontSize() * 8);
  if (ImGui::BeginCombo("checkpoint", preview.c_str())) {
    if (ImGui::Selectable("latest", checkpoint_index_ < 0)) checkpoint_index_ = -1;
    for (size_t k = 0; k < s.checkpoints.size(); ++k) {
      const CheckpointView& c = s.checkpoints[k];
      if (c.state != "committed") continue;
      const std::string item = "step " + std::to_string(c.step);
      if (ImGui::Selectable(item.c_str(), checkpoint_index_ == static_cast<int>(k)))
        checkpoint_index_ = static_cast<int>(k);
    }
    ImGui::EndCombo();
  }
  ImGui::SameLine();
  ImGui::SetNextItemWidth(ImGui::GetFontSize() * 6);
  ImGui::InputInt("dp (0 = same)", &dp_);
  dp_ = std::max(0, std::min(dp_, 1024));
  if (ctx.clicks.button(std::string(action_label(RunAction::kResumeFrom)).c_str(), rf.enabled)) {
    const std::string which =
        checkpoint_index_ < 0 ? std::string("latest")
                              : std::to_string(s.checkpoints[static_cast<size_t>(checkpoint_index_)].step);
    ctx.source.request_resume_from(s.run.id, which, dp_);
  }
  if (!rf.enabled && ImGui::IsItemHovered(ImGuiHoveredFlags_AllowWhenDisabled))
    ImGui::SetTooltip("%s", rf.why_not.c_str());

  if (s.last_action.serial > 0) {
    const ImVec4 colour = s.last_action.ok ? ImVec4(0.5f, 0.9f, 0.5f, 1) : ImVec4(1, 0.5f, 0.4f, 1);
    ImGui::PushTextWrapPos(0);
    ImGui::TextColored(colour, "%s: %s", s.last_action.what.c_str(), s.last_action.message.c_str());
    ImGui::PopTextWrapPos();
  }
}

}  // namespace gantry::console
