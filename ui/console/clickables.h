// Buttons that a script can press. Each frame, every button drawn through Clickables::button() is recorded
// with its rectangle and whether it was enabled (click_targets.h, which holds no ImGui); a script
// (script.h) looks a button up by its label in the last frame's record and presses it with real mouse
// input (the cursor moved onto it, the left button pressed, then released), so a scripted click goes
// through the same ImGui path as an operator's.
//
//   clicks.begin_frame();
//   if (clicks.button("Checkpoint now", enabled)) source.request_action(run, RunAction::kCheckpoint);
#pragma once

#include <imgui.h>

#include <string_view>

#include "ui/console/click_targets.h"

namespace gantry::console {

class Clickables {
 public:
  void begin_frame() { targets_.begin_frame(); }
  // ImGui::Button(label), greyed out and inert when !enabled. The key is the visible part of the label
  // (before any "##").
  bool button(const char* label, bool enabled = true, ImVec2 size = ImVec2(0, 0));
  // Records the last drawn item (any widget) as clickable under `label`.
  void record_last_item(std::string_view label, bool enabled);
  // From the last complete frame; nullptr when that button was not drawn.
  const ClickTarget* find(std::string_view label) const { return targets_.find(label); }
  const ClickTargets& targets() const { return targets_; }

 private:
  ClickTargets targets_;
};

}  // namespace gantry::console
