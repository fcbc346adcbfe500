// Where the console's buttons were drawn in the last frame, by label, with no ImGui in sight: the panels
// record into it through Clickables (clickables.h, ImGui's side), and a script (script.h) looks a button
// up here to press it with real mouse input. Window pixels, the same coordinates ImGui's io uses.
//
//   targets.begin_frame();
//   targets.record("Checkpoint now", {10, 20}, {110, 40}, /*enabled=*/true);
//   if (const ClickTarget* t = targets.find("Checkpoint now")) press_at(centre(*t));
#pragma once

#include <map>
#include <string>
#include <string_view>

namespace gantry::console {

struct ScreenPoint {
  float x = 0, y = 0;
};

struct ClickTarget {
  ScreenPoint min, max;
  bool enabled = false;
};

class ClickTargets {
 public:
  void begin_frame();  // the record of the frame that ended becomes what find() answers from
  void record(std::string_view label, ScreenPoint min, ScreenPoint max, bool enabled);
  // From the last complete frame; nullptr when that button was not drawn.
  const ClickTarget* find(std::string_view label) const;

 private:
  std::map<std::string, ClickTarget, std::less<>> current_, last_;
};

}  // namespace gantry::console
