// How the Checkpoints panel writes a checkpoint's seconds (its write time, and the training stall it cost),
// apart from ImGui so it is tested without a display. A stall the catalog does not know (entries of older
// builds) is "—", never 0: a 0 would claim the checkpoint cost training nothing.
//
//   ImGui::TextUnformatted(checkpoint_seconds_text(view.stall_s).c_str());   // "0.012" or "—"
#pragma once

#include <cstdio>
#include <optional>
#include <string>

namespace gantry::console {

inline std::string checkpoint_seconds_text(std::optional<double> seconds) {
  if (!seconds) return "\u2014";
  char buf[32];
  std::snprintf(buf, sizeof buf, *seconds < 0.1 ? "%.3f" : "%.2f", *seconds);
  return buf;
}

}  // namespace gantry::console
