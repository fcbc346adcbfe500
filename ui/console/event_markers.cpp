#include "ui/console/event_markers.h"

#include <imgui.h>  // IM_COL32

#include <string>

namespace gantry::console {
namespace {

constexpr uint32_t kOrange = IM_COL32(255, 160, 60, 255);
constexpr uint32_t kGreen = IM_COL32(120, 220, 120, 255);
constexpr uint32_t kRed = IM_COL32(240, 90, 90, 255);
constexpr uint32_t kViolet = IM_COL32(190, 140, 255, 255);

}  // namespace

// Checkpoints, moves, stragglers, skipped steps and SDC mismatches as markers on every plot of the run.
std::vector<plot::PlotMarker> event_markers(const ConsoleSnapshot& s) {
  std::vector<plot::PlotMarker> out;
  for (const EventView& e : s.events) {
    const std::string& k = e.record.kind;
    if (e.record.step < 0) continue;
    if (k == "checkpoint" && e.record.rank <= 0) {
      out.push_back({static_cast<double>(e.record.step), "ckpt", kGreen});
    } else if (k == "quarantine_placed" || k == "resume_placed") {
      out.push_back(
          {static_cast<double>(e.record.step), k == "resume_placed" ? "resumed" : "moved", kViolet});
    } else if (k == "step_skipped" && e.record.rank <= 0) {
      // The step guard skipped the update; every rank reports it, rank 0's marks it once.
      out.push_back({static_cast<double>(e.record.step), "skipped", kRed});
    } else if (k == "guard_rollback" && e.record.rank <= 0) {
      // The step guard rolled back after a streak of skips: marked where the streak ended (the plot then
      // shows the replayed steps from the checkpoint's step on).
      out.push_back({static_cast<double>(e.record.step), "rollback", kOrange});
    } else if (k == "sdc_mismatch") {
      // Silent data corruption: each rank the check named reports itself, and each is marked.
      out.push_back({static_cast<double>(e.record.step), "sdc r" + std::to_string(e.record.rank), kRed});
    } else if (k == "straggler") {
      out.push_back(
          {static_cast<double>(e.record.step), "straggler r" + std::to_string(e.record.rank), kRed});
    }
  }
  return out;
}

}  // namespace gantry::console
