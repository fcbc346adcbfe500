// Buttons that a script can press. Each frame, every button drawn through Clickables::button() is recorded
// with its rectangle and whether it was enabled; a script (script.h) looks a button up by its label in
// the last frame's record and presses it with real mouse input (the cursor moved onto it, the left
// button pressed, then released), so a scripted click goes through the same ImGui path as an operator's.
//
//   clicks.begin_frame();
//   if (clicks.button("Checkpoint now", enabled)) source.request_action(run, RunAction::kCheckpoint);
#pragma once

#include <imgui.h>

#include <map>
#include <string>
#include <string_view>

namespace gantry::console {

struct ClickTarget {
  ImVec2 min{0, 0}, max{0, 0};
  bool enabled = false;
};

class Clickables {
 public:
  void begin_frame();  // the record of the frame that ended becomes what find() answers from
  // ImGui::Button(label), greyed out and inert when !enabled. The key is the visible part of the label
  // (before any "##").
  bool button(const char* label, bool enabled = true, ImVec2 size = ImVec2(0, 0));
  // Records the last drawn item (any widget) as clickable under `label`.
  void record_last_item(std::string_view label, bool enabled);
  // From the last complete frame; nullptr when that button was not drawn.
  const ClickTarget* find(std::string_view label) const;

 private:
  std::map<std::string, ClickTarget, std::less<>> current_, last_;
};

}  // namespace gantry::console
