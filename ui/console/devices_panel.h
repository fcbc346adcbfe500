// The Devices panel: one device metric over time for every node and GPU (the agents' device samples, from
// the coordinator's history: ui/console/device_series.h), as a band across devices (min, mean, max) and a
// device × time heatmap with the plot widgets the Run panel uses. A metric no device reported (no GPU, no
// NVML) says so: unknown, never 0.
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>

#include "ui/console/panels.h"

namespace gantry::console {

struct DevicesPanel {
  void draw(const ConsoleSnapshot& s, PanelContext& ctx);
  // Draws `d` (the bench hands it synthetic series; draw() the snapshot's).
  void draw_series(const std::shared_ptr<const DeviceSeries>& d, PanelContext& ctx);
  nlohmann::json state_json() const;  // --dump-state: the metric, the rows, GPU rows, columns, newest values
  DeviceMetric metric() const { return metric_; }
  void set_metric(DeviceMetric m) { metric_ = m; }

 private:
  DeviceMetric metric_ = DeviceMetric::kNodeCpu;
  std::shared_ptr<const DeviceSeries> shown_;  // the series the model below was built from
  double band_now_ = 0;                        // the time the band's x is relative to
  DeviceBand band_;
  std::unique_ptr<plot::HeatmapModel> heat_;
  // For a count (Xid, ECC errors): each device's newest count, or "unknown" where its newest column has no
  // sample; made once per answer, not per frame (a scan of every row's columns).
  std::string newest_counts_;
  plot::PlotView band_view{.x_label = "seconds (0 = now)", .y_label = "value"};
  // Cells of at least 3 px wide: a third fewer rectangles than at 2 px (the rows are the devices either way).
  // Measured on 128 GPUs it did not make the frames faster (docs/PERF.md, the Devices panel): the band's
  // 3 × 100,000 points and llvmpipe dominate; 2 px would do as well.
  plot::HeatmapView heat_view{.value_label = "value", .min_cell_px = 3};
};

}  // namespace gantry::console
