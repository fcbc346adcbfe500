#include "ui/console/clickables.h"

namespace gantry::console {
namespace {

std::string_view visible_part(std::string_view label) {
  const size_t k = label.find("##");
  return k == std::string_view::npos ? label : label.substr(0, k);
}

}  // namespace

bool Clickables::button(const char* label, bool enabled, ImVec2 size) {
  ImGui::BeginDisabled(!enabled);
  const bool pressed = ImGui::Button(label, size);
  ImGui::EndDisabled();
  record_last_item(visible_part(label), enabled);
  return pressed && enabled;
}

void Clickables::record_last_item(std::string_view label, bool enabled) {
  const ImVec2 min = ImGui::GetItemRectMin(), max = ImGui::GetItemRectMax();
  targets_.record(label, {min.x, min.y}, {max.x, max.y}, enabled);
}

}  // namespace gantry::console
