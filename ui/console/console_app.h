// One frame of the console: the toolbar and the panels, laid out in three columns the first time (the
// operator's own arrangement is kept in the ImGui ini file after that). The window, the GL context and
// the ImGui context belong to app/console_main.cpp; this draws between NewFrame() and Render().
//
//   ConsoleApp app(source);
//   per frame: app.clicks().begin_frame(); ImGui::NewFrame(); app.draw(*snapshot); ImGui::Render(); ...
//   nlohmann::json state = app.state_json(*snapshot);   // --dump-state
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "ui/console/clickables.h"
#include "ui/console/data_source.h"
#include "ui/console/devices_panel.h"
#include "ui/console/panels.h"
#include "ui/console/timeline_panel.h"

namespace gantry::console {

class ConsoleApp {
 public:
  explicit ConsoleApp(DataSource& source) : source_(source) {}

  void draw(const ConsoleSnapshot& s);
  Clickables& clicks() { return clicks_; }
  // What the last frame drew, and the model it drew from: the panels, each plotted series' name and
  // length, the last step seen, the run's state, the connection.
  nlohmann::json state_json(const ConsoleSnapshot& s) const;
  const FrameRecord& last_frame() const { return frame_; }
  // The History panel's compared runs with points in their curves (a script's wait_compared).
  int64_t compared_runs() const;

  // The embedded cluster's close question: set by the main loop when the window is asked to close.
  bool confirm_close = false;
  bool close_confirmed = false;  // answered "stop it and quit"
  bool close_keep_cluster = false;

 private:
  void toolbar(const ConsoleSnapshot& s);
  void shortcuts(const ConsoleSnapshot& s);  // Ctrl+1..9 panels, Ctrl+0 reset layout, Ctrl+L theme, Ctrl+K
  void toggle_theme();
  void reset_layout();
  void close_dialog(const ConsoleSnapshot& s);

  DataSource& source_;
  Clickables clicks_;
  FrameRecord frame_;
  ClusterPanel cluster_;
  RunPanel run_;
  StragglersPanel stragglers_;
  ActionsPanel actions_;
  CheckpointsPanel checkpoints_;
  EventsPanel events_;
  WhatIfPanel whatif_;
  HistoryPanel history_;
  TimelinePanel timeline_;
  DevicesPanel devices_;
  bool light_ = false;     // the light theme (dark by default)
  int layout_resets_ = 0;  // "Reset layout" pressed (or Ctrl+0), for --dump-state
};

}  // namespace gantry::console
