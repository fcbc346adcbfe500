// The per-rank timeline (Tracy-style) without ImGui: a window of steps × ranks of the ranks' step phases,
// the spans one frame draws for a viewport (culled to the visible time and lanes, and folded per pixel
// column), and the window as a Chrome/Perfetto trace.
//
// Time axis. Ranks of a synchronous job meet at every step's end, so the lanes are aligned at step
// boundaries: step s begins, on every lane, where the slowest rank's step s-1 ended (each rank's length of a
// step being the larger of its wall time and the sum of its phases). Within a step a rank's spans follow the
// order of a step (telemetry/records.h Phase): data wait, forward, backward, optimizer, exposed
// communication, checkpoint stall, then the unattributed remainder (wall time the phases do not cover).
//
// Culling and folding (timeline_build). A span whose width on screen is at least one pixel is drawn as it
// is (clipped to the view). Spans narrower than a pixel are folded per pixel column: the column becomes one
// item that keeps the longest of the spans folded into it (its phase, its step and its seconds) and counts
// them, so a straggler's long forward is never hidden behind its neighbours' short ones. Steps and lanes
// outside the view are never visited (binary search over the step starts; the lanes asked for only). A
// lane therefore yields at most 2·width + 3 items, whatever the number of steps in view.
//
//   TimelineWindow w = timeline_window(run, first_step, steps, ranks, records);
//   TimelineFrame f;
//   timeline_build(w, {.t0 = 0, .t1 = w.length_s(), .width_px = 800, .lane_first = 0, .lane_count = 40}, f);
//   for (const TimelineLane& l : f.lanes) for (size_t i = l.first; i < l.first + l.count; ++i)
//   draw(f.items[i]); std::string trace = timeline_trace_json(w).dump();   // chrome://tracing,
//   ui.perfetto.dev
#pragma once

#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "telemetry/records.h"
#include "telemetry/status.h"

namespace gantry::console {

// The span kinds: the six phases (Phase's values), then the unattributed remainder.
inline constexpr int kTimelineKinds = kPhaseCount + 1;
inline constexpr uint8_t kTimelineUnattributed = kPhaseCount;
// A remainder below this is the phase sum's rounding, not time: no span.
inline constexpr double kTimelineMinRemainderS = 1e-9;
// "data_wait", ..., "checkpoint_stall" (phase_name), "unattributed".
std::string_view timeline_kind_name(uint8_t kind);

// One rank's step.
struct TimelineCell {
  float seconds[kTimelineKinds] = {};  // each phase; the last: wall time the phases do not cover (≥ 0)
  float total = 0;                     // the step's wall time on this rank (RankStepRecord::total_s)
  bool present = false;                // the rank reported the step
  float length() const;                // the lane's length of the step: the sum of the spans
};

// Steps [first_step, first_step + steps) × ranks [0, ranks).
struct TimelineWindow {
  int64_t run = -1;
  int64_t first_step = 0;
  int64_t steps = 0;
  int ranks = 0;
  std::vector<TimelineCell> cells;  // [rank · steps + (step − first_step)]
  // steps + 1 entries: where each step begins, in seconds from the window's start; the last is its length.
  std::vector<double> step_begin;

  const TimelineCell& at(int rank, int64_t step) const {
    return cells[static_cast<size_t>(rank) * static_cast<size_t>(steps) +
                 static_cast<size_t>(step - first_step)];
  }
  double length_s() const { return step_begin.empty() ? 0 : step_begin.back(); }
  bool empty() const { return steps <= 0 || ranks <= 0; }
  // Steps every rank reported, counted from the first: the part of the window that is whole. Counted by
  // timeline_layout (a pass over every cell: not per frame).
  int64_t complete_steps() const { return whole_steps; }
  int64_t whole_steps = 0;
};

// The window from rank-step records (any order; records outside the window are ignored; a step a rank did
// not report stays absent and takes no time on its lane).
TimelineWindow timeline_window(int64_t run, int64_t first_step, int64_t steps, int ranks,
                               std::span<const RankStepRecord> records);
// Puts one record into its cell (false when it lies outside the window); timeline_layout afterwards.
bool timeline_put(TimelineWindow& w, const RankStepRecord& r);
// Recomputes step_begin from the cells (after cells were filled by hand or by timeline_put).
void timeline_layout(TimelineWindow& w);

// What one frame shows: the time [t0, t1) (seconds from the window's start) across width_px pixels, and the
// lanes [lane_first, lane_first + lane_count) (ranks; clipped to the window's).
struct TimelineViewport {
  double t0 = 0, t1 = 1;
  int width_px = 1;
  int lane_first = 0;
  int lane_count = 1 << 30;
};

// One thing to draw on a lane.
struct TimelineItem {
  float x0 = 0, x1 = 0;  // pixels from the view's left edge, within [0, width_px]
  uint8_t kind = 0;      // a Phase's value or kTimelineUnattributed
  bool folded = false;   // a pixel column standing for `count` spans narrower than a pixel
  uint32_t count = 1;    // spans it stands for (1 when drawn as it is)
  int64_t step = 0;      // the span's step (folded: the longest span's)
  float seconds = 0;     // the span's length (folded: the longest span's)
};

struct TimelineLane {
  int rank = 0;
  size_t first = 0, count = 0;  // its items in TimelineFrame::items
};

struct TimelineFrame {
  std::vector<TimelineLane> lanes;
  std::vector<TimelineItem> items;
  size_t spans_visible = 0;  // spans in view (drawn as they are plus folded)
  size_t spans_folded = 0;
};

// Fills `out` (its buffers are reused from frame to frame).
void timeline_build(const TimelineWindow& w, const TimelineViewport& view, TimelineFrame& out);

// The steps [first, end) of the window in seconds: the viewport that shows exactly them.
TimelineViewport timeline_view_of_steps(const TimelineWindow& w, int64_t first, int64_t end, int width_px);

// Per rank over the window: the sum of its busy phases (data wait, forward, backward, optimizer), and the
// longest and the mean of its forward spans.
struct TimelineRankSummary {
  int rank = 0;
  int64_t steps = 0;         // steps it reported
  double busy_s = 0;         // over the window
  double busy_median_s = 0;  // the median step's: one slow step (a warm-up, a page-in) does not move it
  double forward_max_s = 0;
  double forward_mean_s = 0;
};
std::vector<TimelineRankSummary> timeline_rank_summaries(const TimelineWindow& w);
// The rank with the largest median busy time a step over the window (the lane that stands out when the
// coordinator has flagged none; a straggler is slow at every step, while a sum lets one long step of another
// rank outweigh it), ties by the sum; -1 for an empty window.
bool timeline_rank_slower(const TimelineRankSummary& a, const TimelineRankSummary& b);
int timeline_slowest_rank(const TimelineWindow& w);

// The window as a Chrome/Perfetto trace (the JSON Object Format): one complete event ("ph": "X") per span
// with seconds > 0 (ts and dur in microseconds, pid the run, tid the rank, args the step and seconds), and
// metadata events naming the process ("run N") and each thread ("rank R").
nlohmann::json timeline_trace_json(const TimelineWindow& w);
// Writes it to `path`; the error names the file.
Status timeline_trace_write(const TimelineWindow& w, const std::string& path);

// The window's data as CSV (the panel's Export CSV, plot_export.h): a row per rank and step, "rank,step,"
// then each span kind's seconds ("forward (s)", ..., "unattributed (s)") and the step's wall time on that
// rank ("total (s)"); a step the rank did not report has its values empty (unknown, not 0). 17 digits.
std::string timeline_csv(const TimelineWindow& w);

}  // namespace gantry::console
