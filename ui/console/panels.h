// The console's panels. Each is a struct with draw(), one per .cpp file; everything a panel keeps between
// frames (plot views, a filter, a confirmation in progress) lives in its struct, and everything it shows
// comes from the frame's snapshot. Requests go to the DataSource, which carries them out on its thread.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "ui/console/clickables.h"
#include "ui/console/console_state.h"
#include "ui/console/data_source.h"
#include "ui/console/quarantine_plan.h"
#include "ui/history/history_model.h"
#include "ui/history/history_panel.h"
#include "ui/plot/heatmap.h"
#include "ui/plot/plot_widget.h"
#include "ui/whatif/whatif_model.h"
#include "ui/whatif/whatif_panel.h"

namespace gantry::console {

// One plotted series as drawn: its name, its points and the plot's data area in window pixels.
struct SeriesRecord {
  std::string name;
  size_t length = 0;
  float x0 = 0, y0 = 0, x1 = 0, y1 = 0;
};

// What one frame drew, for --dump-state and for tests: the panels shown and each plotted series.
struct FrameRecord {
  std::vector<std::string> panels;
  std::vector<SeriesRecord> series;
};

struct PanelContext {
  DataSource& source;
  Clickables& clicks;
  FrameRecord& frame;
  double now_unix_s = 0;
};

// The Run panel's Goodput section (goodput_section.cpp): ETTR, the ledger as a stacked bar, the failures on a
// timeline of the run, the Young/Daly interval. Unknown figures are drawn as "unknown".
void draw_goodput(const GoodputView& g, PanelContext& ctx);

// Nodes × devices, coloured by state (healthy, straggler, quarantined, lost, spare), heartbeat age, and
// per device the rank it holds with its temperature and clock where the device reports them.
struct ClusterPanel {
  void draw(const ConsoleSnapshot& s, PanelContext& ctx);
};

// The heatmap's cells for the widget, from the snapshot's pages of the coordinator's tile answers (no
// values of its own): each frame's grid() is composed from the pages and remembered as the want the Run
// panel hands to the DataSource. The excess view subtracts from each cell the median of its column's cells.
class TileHeatmap final : public plot::HeatmapSource {
 public:
  void set(std::shared_ptr<const HeatPages> pages, int ranks, int64_t first_step, int64_t step_end,
           bool excess);
  int ranks() const override { return ranks_; }
  int64_t first_step() const override { return first_step_; }
  int64_t step_end() const override { return step_end_; }
  void grid(int64_t step_lo, int64_t step_hi, int max_cols, int max_rows,
            plot::HeatmapGrid& out) const override;
  // The range and resolution the last grid() was asked for.
  int64_t asked_lo() const { return asked_lo_; }
  int64_t asked_hi() const { return asked_hi_; }
  int asked_cols() const { return asked_cols_; }
  int asked_rows() const { return asked_rows_; }

 private:
  std::shared_ptr<const HeatPages> pages_ = std::make_shared<HeatPages>();
  int ranks_ = 1;
  int64_t first_step_ = 0, step_end_ = 1;
  bool excess_ = false;
  mutable int64_t asked_lo_ = 0, asked_hi_ = 0;
  mutable int asked_cols_ = 0, asked_rows_ = 0;
};

// The followed run: loss, grad norm, tokens/s and MFU against step; the band across ranks (min, mean,
// max) and the rank × step heatmap of busy time (or of the total, a phase, or the excess over each
// step's middle: a selector), both from the coordinator's tile queries; the timing breakdown per rank from
// each rank's latest record, the most excess first.
struct RunPanel {
  void draw(const ConsoleSnapshot& s, PanelContext& ctx);

 private:
  // The selector: which time the heatmap and band show (asked of the coordinator), and whether as the
  // excess over each step's middle (the band's mean; the heatmap column's median cell).
  RankTimeMetric metric_ = RankTimeMetric::kBusy;
  bool excess_ = false;

  plot::PlotView loss_view{.follow_latest = false, .x_label = "step", .y_label = "loss", .x_integer = true};
  plot::PlotView grad_view{.x_label = "step", .y_label = "grad norm", .x_integer = true};
  plot::PlotView tokens_view{.x_label = "step", .y_label = "tokens/s", .x_integer = true};
  plot::PlotView mfu_view{.x_label = "step", .y_label = "MFU (%)", .y_unit = "%", .x_integer = true};
  plot::PlotView band_view{.x_label = "step", .y_label = "busy time (s)", .x_integer = true};
  plot::HeatmapView heat_view{.value_label = "busy time", .unit = "s"};
  TileHeatmap heat_;
};

// Ranks ordered slowest first (stragglers.h), and "Quarantine node…" with a confirmation.
struct StragglersPanel {
  void draw(const ConsoleSnapshot& s, PanelContext& ctx);
  const QuarantinePlan& plan() const { return plan_; }  // the last frame's, for --dump-state

 private:
  std::string confirm_node_;  // the node a confirmation is open for
  bool override_ = false;     // quarantine a node with no flagged rank: the operator said so
  QuarantinePlan plan_;
};

// Checkpoint now, pause, resume, stop, and resume from a chosen checkpoint on a chosen dp.
struct ActionsPanel {
  void draw(const ConsoleSnapshot& s, PanelContext& ctx);

 private:
  int checkpoint_index_ = -1;  // into the snapshot's checkpoints; -1 = latest
  int dp_ = 0;                 // 0 = the run's
};

struct CheckpointsPanel {
  void draw(const ConsoleSnapshot& s, PanelContext& ctx);
};

// The followed run's events, newest last, filtered by a substring of kind or message.
struct EventsPanel {
  void draw(const ConsoleSnapshot& s, PanelContext& ctx);

 private:
  char filter_[128] = "";
  size_t seen_ = 0;  // events drawn last frame: scroll to the bottom when new ones arrive
};

// The planner (ui/whatif) on the followed run: its config and layout go into the form once per run, and
// Apply becomes a resume-from request (latest checkpoint, the chosen dp and ZeRO) on the DataSource.
struct WhatIfPanel {
  void draw(const ConsoleSnapshot& s, PanelContext& ctx);
  // The run Apply would resume; -1 = none.
  int64_t loaded_run() const { return model_.run() ? model_.run()->id : -1; }
  const whatif::WhatIfModel& model() const { return model_; }
  bool apply_enabled() const { return view_.apply_enabled; }

 private:
  whatif::WhatIfModel model_;
  whatif::WhatIfPanelView view_;
  bool evaluated_ = false;
  int64_t loaded_run_ = -1;  // the run whose config was loaded into the form (or failed to load)
  std::string load_error_;
};

// The local cache's runs (ui/history) compared: any number of them on two step metrics (history_panel.h). The
// cache file is opened read-only once it exists (the network thread creates it with the first run), and
// re-read when the followed run ends or on Refresh.
struct HistoryPanel {
  void draw(const ConsoleSnapshot& s, PanelContext& ctx);
  const history::HistoryModel& model() const { return model_; }
  const history::HistoryPanelView& view() const { return view_; }

 private:
  history::HistoryModel model_;
  history::HistoryPanelView view_;
  double next_open_unix_s_ = 0;        // when to try opening the cache again
  double refresh_at_unix_s_ = 0;       // a second read after a run ended; 0 = none due
  double live_refresh_at_unix_s_ = 0;  // the next read while the followed run lives
  bool operator_chose_ = false;        // the operator changed the selection: no more automatic choice
  std::string open_error_;
  int64_t seen_run_ = -1;  // the followed run and whether it had ended, last frame
  bool seen_ended_ = false;
};

}  // namespace gantry::console
