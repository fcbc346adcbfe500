// The Timeline panel (Tracy-style): one lane per rank of the followed run, each step's phases as coloured
// spans, laid out and folded by the view model (timeline.h). The wheel zooms around the mouse (from the
// whole window of steps down to part of one step), a drag pans, a double-click fits; Shift + wheel or the
// slider scrolls the lanes. Hover shows a span's numbers, a click pins them under the lanes. The slow
// rank's lane is tinted and labelled: the ranks the coordinator flagged, else the largest busy time in the
// window. "Export trace" writes the window as Chrome/Perfetto trace JSON beside the console's cache.
//
// Its data is the DataSource's timeline (want_timeline: the newest N steps, or N steps from a chosen one),
// read from the rank records the coordinator serves; nothing is asked before the panel is drawn.
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "ui/console/panels.h"
#include "ui/console/timeline.h"

namespace gantry::console {

struct TimelinePanel {
  TimelinePanel() = default;
  explicit TimelinePanel(int steps) : steps_(steps) {}  // the newest `steps` (1..4,096)
  void draw(const ConsoleSnapshot& s, PanelContext& ctx);
  // For --dump-state: the window, the slow lane and why, each lane's forward and busy figures, and what
  // the last frame drew.
  nlohmann::json state_json() const;

 private:
  void summarise(const ConsoleSnapshot& s);

  // The steps asked for.
  bool follow_ = true;  // the newest steps; else from first_step_
  int steps_ = 64;
  int first_step_ = 1;
  // The view, seconds from the window's start; fit_ = the whole window (kept while steps arrive).
  bool fit_ = true;
  double t0_ = 0, t1_ = 1;
  int lane_scroll_ = 0;
  bool dragging_ = false;

  std::shared_ptr<const TimelineWindow> window_ = std::make_shared<TimelineWindow>();
  std::vector<TimelineRankSummary> summaries_;  // of window_
  int slow_rank_ = -1;
  std::string slow_reason_;  // "flagged by the coordinator", "largest median busy time a step in the window"
  TimelineFrame frame_;
  std::shared_ptr<const TimelineWindow> built_for_;  // frame_ was built for this window and view
  TimelineViewport built_view_;
  // With a texture backend (ui/plot/texture.h) each lane is a row of texels, one a pixel, drawn as one quad a
  // lane; rasterised when frame_ is built, not every frame.
  plot::PlotTexture lanes_texture_;
  std::vector<uint32_t> lane_texels_;
  bool lanes_textured_ = false;
  int width_px_ = 0;

  bool have_pinned_ = false;
  int pinned_rank_ = 0;
  TimelineItem pinned_;
  std::string export_result_;
};

}  // namespace gantry::console
