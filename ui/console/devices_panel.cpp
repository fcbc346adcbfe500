// The Devices panel (devices_panel.h).
#include "ui/console/devices_panel.h"

#include <imgui.h>

#include <algorithm>
#include <cmath>
#include <string>

namespace gantry::console {
namespace {

constexpr uint32_t kRed = IM_COL32(230, 90, 80, 255);
constexpr uint32_t kBlue = IM_COL32(90, 170, 255, 255);
constexpr uint32_t kGreen = IM_COL32(110, 200, 120, 255);

}  // namespace

void DevicesPanel::draw(const ConsoleSnapshot& s, PanelContext& ctx) {
  ImGui::SetNextItemWidth(200);
  if (ImGui::BeginCombo("metric", std::string(device_metric_name(metric_)).c_str())) {
    for (int k = 0; k < kDeviceMetricCount; ++k) {
      const auto m = static_cast<DeviceMetric>(k);
      if (ImGui::Selectable(std::string(device_metric_name(m)).c_str(), m == metric_)) metric_ = m;
    }
    ImGui::EndCombo();
  }
  ctx.source.set_device_metric(metric_);
  if (!s.devices_error.empty()) {
    ImGui::SameLine();
    ImGui::TextColored(ImVec4(1, 0.6f, 0.2f, 1), "%s", s.devices_error.c_str());
  }
  // Until the metric asked for arrives, the old one is not drawn under the new name.
  draw_series(s.devices->metric == metric_ ? s.devices : std::make_shared<DeviceSeries>(), ctx);
}

void DevicesPanel::draw_series(const std::shared_ptr<const DeviceSeries>& d, PanelContext& ctx) {
  ctx.frame.panels.push_back("Devices");
  if (d != shown_) {
    // A new answer: the band and the heatmap's model are rebuilt once, not every frame.
    shown_ = d;
    band_now_ = ctx.now_unix_s;
    band_ = device_band(*d, band_now_);
    heat_.reset();
    newest_counts_.clear();
    if (d->metric == DeviceMetric::kGpuXidErrors || d->metric == DeviceMetric::kGpuEccErrors) {
      for (size_t r = 0; r < d->rows.size(); ++r) {
        float v = NAN;
        for (int32_t c = d->cols - 1; c >= 0 && std::isnan(v); --c) v = d->at_max(r, c);
        newest_counts_ += (newest_counts_.empty() ? "" : ",  ") + d->rows[r] + ": " +
                          (std::isnan(v) ? std::string("unknown") : std::to_string(std::llround(v)));
      }
    }
    if (!d->rows.empty() && d->cols > 0) {
      heat_ = std::make_unique<plot::HeatmapModel>(static_cast<int>(d->rows.size()));
      heat_->reserve(d->cols);
      std::vector<float> column(d->rows.size());
      for (int32_t c = 0; c < d->cols; ++c) {
        for (size_t r = 0; r < d->rows.size(); ++r) column[r] = d->at_max(r, c);
        heat_->append_step(c, column);
      }
    }
  }
  const std::string unit(device_metric_unit(d->metric));
  const size_t gpus = d->gpu_rows();
  ImGui::Text("%zu devices reporting %s (%zu GPUs, %zu nodes), %d columns of %.3g s", d->rows.size(),
              std::string(device_metric_name(d->metric)).c_str(), gpus, d->rows.size() - gpus, d->cols,
              d->bucket_s);
  if (d->rows.empty()) {
    ImGui::TextDisabled(
        "%s", d->metric == DeviceMetric::kGpuXidErrors
                  ? "no device reported Xid counts: unknown (they need NVML, for each GPU's PCI address, "
                    "and a kernel log the agent can read, /dev/kmsg; see the agent's log)"
                  : "no device reported this metric: unknown (GPU readings need NVML on the node; see the "
                    "agent's log)");
    return;
  }
  if (!newest_counts_.empty()) ImGui::TextWrapped("newest: %s", newest_counts_.c_str());
  const float avail = ImGui::GetContentRegionAvail().x;
  const float half = (avail - ImGui::GetStyle().ItemSpacing.x) / 2;
  const float h = std::max(100.0f, ImGui::GetContentRegionAvail().y - 4);
  band_view.y_label = unit;
  band_view.y_unit = unit;
  const plot::PlotSeries series[] = {
      {"max", band_.t.data(), band_.max.data(), band_.size(), kRed},
      {"mean", band_.t.data(), band_.mean.data(), band_.size(), kBlue},
      {"min", band_.t.data(), band_.min.data(), band_.size(), kGreen},
  };
  plot::plot_lines("##devband", band_view, series, {}, ImVec2(half, h));
  for (const plot::PlotSeries& p : series) {
    ctx.frame.series.push_back({"devices " + p.name, p.n, band_view.plot_min.x, band_view.plot_min.y,
                                band_view.plot_max.x, band_view.plot_max.y});
  }
  ImGui::SameLine();
  heat_view.value_label = std::string(device_metric_name(d->metric));
  heat_view.unit = unit == "ratio" ? "" : unit;
  if (heat_) {
    plot::heatmap_widget("##devheat", heat_view, *heat_, ImVec2(half, h));
    if (heat_view.hovered) {
      // The widget reads out rows and columns; say which device and when.
      ImGui::BeginTooltip();
      const int row = std::clamp(heat_view.hover_rank_lo, 0, static_cast<int>(d->rows.size()) - 1);
      const double t = d->first_time + static_cast<double>(heat_view.hover_step_lo) * d->bucket_s;
      ImGui::Text("%s%s, %.0f s ago", d->rows[static_cast<size_t>(row)].c_str(),
                  heat_view.hover_rank_hi - heat_view.hover_rank_lo > 1 ? " and the rows below it" : "",
                  ctx.now_unix_s - t);
      ImGui::Text("max %s", device_value_text(d->metric, heat_view.hover_value).c_str());
      ImGui::EndTooltip();
    }
    if (heat_view.grid.cols > 0) {
      ctx.frame.series.push_back({"devices heatmap", static_cast<size_t>(heat_view.grid.cols),
                                  heat_view.map_min.x, heat_view.map_min.y, heat_view.map_max.x,
                                  heat_view.map_max.y});
    }
  }
}

nlohmann::json DevicesPanel::state_json() const {
  using json = nlohmann::json;
  json rows = json::array();
  json newest = json::object();
  if (shown_) {
    for (size_t r = 0; r < shown_->rows.size(); ++r) {
      rows.push_back(shown_->rows[r]);
      // The newest column with a sample: its max; null when the row never had one (unknown, never 0).
      json v = nullptr;
      for (int32_t c = shown_->cols - 1; c >= 0; --c) {
        if (!std::isnan(shown_->at_max(r, c))) {
          v = shown_->at_max(r, c);
          break;
        }
      }
      newest[shown_->rows[r]] = v;
    }
  }
  return {{"metric", std::string(device_metric_name(metric_))},
          {"shown_metric", shown_ ? std::string(device_metric_name(shown_->metric)) : std::string()},
          {"rows", rows},
          {"gpu_rows", shown_ ? shown_->gpu_rows() : 0},
          {"cols", shown_ ? shown_->cols : 0},
          {"band_points", band_.size()},
          {"newest", newest}};
}

}  // namespace gantry::console
