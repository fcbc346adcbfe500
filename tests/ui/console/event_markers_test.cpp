// The Run panel's markers and the Checkpoints panel's seconds, without a display: a step-guard rollback
// and a skipped step are marked on the plots once (rank 0's report), and an unknown checkpoint stall is a
// dash, never 0.
#include "ui/console/event_markers.h"

#include <gtest/gtest.h>

#include "ui/console/checkpoint_text.h"

namespace gantry::console {
namespace {

EventView event(int64_t id, const std::string& kind, int64_t step, int32_t rank) {
  return {.id = id, .record = {.step = step, .kind = kind, .rank = rank}};
}

TEST(EventMarkers, SkippedStepsAndRollbacksAreMarkedOnce) {
  ConsoleSnapshot s;
  s.events = {event(1, "step_skipped", 7, 0),   event(2, "step_skipped", 7, 1),
              event(3, "step_skipped", 8, 0),   event(4, "guard_rollback", 8, -1),
              event(5, "guard_rollback", 8, 1), event(6, "checkpoint", 4, 0),
              event(7, "run_started", -1, -1)};
  const std::vector<plot::PlotMarker> m = event_markers(s);
  std::vector<std::pair<double, std::string>> got;
  for (const plot::PlotMarker& p : m) got.emplace_back(p.x, p.label);
  const std::vector<std::pair<double, std::string>> want = {
      {7, "skipped"}, {8, "skipped"}, {8, "rollback"}, {4, "ckpt"}};
  EXPECT_EQ(got, want);
}

TEST(CheckpointText, UnknownStallIsADashNeverZero) {
  EXPECT_EQ(checkpoint_seconds_text(std::nullopt), "\u2014");
  EXPECT_EQ(checkpoint_seconds_text(0.0), "0.000");
  EXPECT_EQ(checkpoint_seconds_text(0.0123), "0.012");
  EXPECT_EQ(checkpoint_seconds_text(1.5), "1.50");
}

}  // namespace
}  // namespace gantry::console
