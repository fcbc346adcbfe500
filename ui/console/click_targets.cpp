#include "ui/console/click_targets.h"

namespace gantry::console {

void ClickTargets::begin_frame() {
  last_.swap(current_);
  current_.clear();
}

void ClickTargets::record(std::string_view label, ScreenPoint min, ScreenPoint max, bool enabled) {
  current_[std::string(label)] = ClickTarget{min, max, enabled};
}

const ClickTarget* ClickTargets::find(std::string_view label) const {
  auto it = last_.find(label);
  return it == last_.end() ? nullptr : &it->second;
}

}  // namespace gantry::console
