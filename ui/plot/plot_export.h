// Export of a plot (issue 21): its visible data as CSV and its pixels as PNG.
//
// Every line plot and heatmap offers "Export CSV" and "Export PNG" on a right click, writing into the
// exports folder (`PlotExports::dir`, the console's STATE/exports) as NAME-YYYYMMDD-HHMMSS.csv|png; a script
// asks for one plot by name and path (`export_plot loss out.csv`). A widget is named by its ImGui id without
// the "##" (`##loss` is "loss").
//
// CSV is written while the widget is drawn, from the very arrays it draws; PNG needs the frame's pixels,
// which exist only after the frame is rendered, so the widget queues the rectangle it covers and the owner of
// the GL context (app/) reads it back after rendering and before the buffer swap:
//
//   plot::PlotExports exports(state_dir + "/exports");
//   plot::plot_exports_set_current(&exports);     // once; the widgets find it as ImGui finds its context
//   ... ImGui::NewFrame(); panels draw; render ...
//   for (const plot::PngCapture& c : exports.take_captures())
//     exports.finished(c.plot, c.path, write_png_region(c.path, c.min, c.max));   // "" when written
//
// Why a current pointer and not an argument: every panel calls the widgets, and an argument would have to
// be threaded through all of them for a menu item; ImGui's own context is found the same way.
#pragma once

#include <imgui.h>

#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "ui/plot/plot_widget.h"

namespace gantry::plot {

enum class ExportFormat { kCsv, kPng };

// A PNG waiting for the frame's pixels: the widget's rectangle in ImGui's screen coordinates.
struct PngCapture {
  std::string plot, path;
  ImVec2 min{0, 0}, max{0, 0};
};

// The end of one export: `error` empty when the file was written.
struct ExportOutcome {
  std::string plot, path, error;
};

class PlotExports {
 public:
  explicit PlotExports(std::string dir = {}) : dir_(std::move(dir)) {}

  // Asks for `plot` to be written to `path` the next time it is drawn (format from the path's extension,
  // see export_format_of). Several requests may wait; each is carried out once.
  void request(std::string plot, std::string path);

  // Called by the widgets each frame: `id` is the widget's ImGui id, [min, max] its rectangle, `csv` makes
  // the visible data's CSV (only called when a CSV of this plot is asked for).
  void on_plot(std::string_view id, ImVec2 min, ImVec2 max, const std::function<std::string()>& csv);
  // The right-click menu over the widget just submitted (call right after its item).
  void context_menu(std::string_view id);

  // PNGs to read back after this frame is rendered; the list is emptied.
  std::vector<PngCapture> take_captures();
  void finished(std::string plot, std::string path, std::string error);

  const std::vector<ExportOutcome>& outcomes() const { return outcomes_; }
  const std::string& dir() const { return dir_; }

 private:
  struct Pending {
    std::string plot, path;
    ExportFormat format;
  };
  std::string dir_;
  std::vector<Pending> pending_;
  std::vector<PngCapture> captures_;
  std::vector<ExportOutcome> outcomes_;
};

PlotExports* plot_exports_current();
void plot_exports_set_current(PlotExports* exports);

// "loss" for "##loss" (the id's text after a leading "##"; an id without one is its own name).
std::string plot_name(std::string_view id);
// kCsv for ".csv", kPng for ".png" (any case); false for anything else.
bool export_format_of(std::string_view path, ExportFormat* format);

// The visible part of a line plot: the series not hidden, their points with x in [x_min, x_max]. One row per
// distinct x (ascending) over those series; a series with no point at that x, or a NaN there, has an empty
// cell (unknown, never 0). Header: the x axis' title (else "x"), then each series' name with the view's unit
// in parentheses when it has one: `step,loss` or `time (s),max (W),mean (W),min (W)`. Values are printed with
// 17 significant digits, so they read back exactly.
std::string plot_csv(std::span<const PlotSeries> series, const PlotView& view);

// The cells a heatmap drew last frame (view.grid): one row per cell, top row first, each row's cells left to
// right: rank_lo,rank_hi,step_lo,step_hi,VALUE (ranks and steps half-open; VALUE titled by the view's
// value_label and unit); an empty cell has an empty value. `ranks` caps the last row's rank_hi.
std::string heatmap_csv(const HeatmapView& view, int ranks);

}  // namespace gantry::plot
