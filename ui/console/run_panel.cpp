// The Run panel: the followed run's curves against step, the step-time band across ranks, the rank × step
// heatmap and the per-rank timing breakdown.
#include <imgui.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <span>

#include "ui/console/mfu_caption.h"
#include "ui/console/panels.h"

namespace gantry::console {
namespace {

constexpr uint32_t kBlue = IM_COL32(90, 170, 255, 255);
constexpr uint32_t kOrange = IM_COL32(255, 160, 60, 255);
constexpr uint32_t kGreen = IM_COL32(120, 220, 120, 255);
constexpr uint32_t kRed = IM_COL32(240, 90, 90, 255);
constexpr uint32_t kViolet = IM_COL32(190, 140, 255, 255);

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

}  // namespace

void RunPanel::sync(const ConsoleSnapshot& s) {
  const RankStepGrid& g = *s.grid;
  if (s.run.id != run_id_ || g.rows() < synced_rows_ || (heat_ && heat_->ranks() < g.width()) ||
      (heat_ && g.rows() > 0 && heat_->first_step() != g.first_step()) || g.metric() != synced_metric_ ||
      excess_ != synced_excess_) {
    // Another run, a rewind, a wider grid or another view: start over.
    synced_metric_ = g.metric();
    synced_excess_ = excess_;
    run_id_ = s.run.id;
    final_rows_ = 0;
    heat_.reset();
  }
  if (g.width() > 0 && !heat_) heat_ = std::make_unique<plot::HeatmapModel>(g.width(), g.first_step());
  grid_hold_ = s.grid;
  synced_grid_ = grid_hold_.get();
  synced_rows_ = g.rows();
  if (heat_ && g.rows() > final_rows_) heat_->reserve(static_cast<int64_t>(g.rows()));
  // The band, computed with the grid on the network thread, has each step's median for the excess view.
  const RankBand& band = *s.band;
  const bool band_fits =
      band.size() == g.rows() && (band.size() == 0 || band.step[0] == static_cast<double>(g.first_step()));
  std::vector<float> excess_row;
  const int want = std::min(std::max(1, s.run.world), g.width());
  size_t final_rows = final_rows_;
  bool still_final = true;
  // Rows from the first that was incomplete last time: a late rank's cell may have filled in since.
  for (size_t row = final_rows_; row < g.rows(); ++row) {
    const int64_t step = g.first_step() + static_cast<int64_t>(row);
    const float* cells = g.row(row);
    int reported = 0;
    for (int k = 0; k < g.width(); ++k) reported += !std::isnan(cells[k]);
    if (excess_) {
      // Each rank's excess over the step's median rank: the step's own pace taken out.
      excess_row.assign(cells, cells + g.width());
      if (band_fits) {
        for (float& v : excess_row) v = static_cast<float>(v - band.median[row]);
      } else {
        excess_over_median(excess_row);
      }
      cells = excess_row.data();
    }
    // A whole row at once: one contiguous pass per pyramid level, where a cell at a time walks every level
    // per cell (catching up 100,000 steps × 1,024 ranks took 18 s in one frame that way).
    if (heat_ && !heat_->append_step(step, std::span<const float>(cells, static_cast<size_t>(g.width())))) {
      for (int k = 0; k < g.width(); ++k) heat_->set(k, step, cells[k]);
    }
    if (still_final && reported >= want) final_rows = row + 1;
    still_final = still_final && reported >= want;
  }
  final_rows_ = final_rows;
}

void RunPanel::draw(const ConsoleSnapshot& s, PanelContext& ctx) {
  ctx.frame.panels.push_back("Run");
  if (s.run.id < 0) {
    ImGui::TextDisabled(s.connected ? "no run yet: submit one (toolbar, or gantry-engine ctl submit)"
                                    : "not connected");
    return;
  }
  const StepLog& log = *s.steps;
  ImGui::Text("run %lld \"%s\"  %s  step %lld  dp %d  zero %d  generation %d",
              static_cast<long long>(s.run.id), s.run.name.c_str(), s.run.state.c_str(),
              static_cast<long long>(log.last_step()), s.run.dp, s.run.zero, s.run.generation);
  if (!s.run.message.empty()) ImGui::TextWrapped("%s", s.run.message.c_str());
  if (log.gap_steps() > 0)
    ImGui::TextColored(ImVec4(1, 0.6f, 0.2f, 1), "%lld steps the coordinator does not have",
                       static_cast<long long>(log.gap_steps()));
  if (s.grid.get() != synced_grid_ || s.run.id != run_id_ || excess_ != synced_excess_) sync(s);

  const std::vector<plot::PlotMarker> markers = event_markers(s);
  const StepColumns& c = log.columns();
  const float avail = ImGui::GetContentRegionAvail().x;
  const float plot_h = std::max(120.0f, ImGui::GetContentRegionAvail().y / 4.2f);
  auto line = [&](const char* id, plot::PlotView& view, std::vector<plot::PlotSeries> series, float w) {
    plot::plot_lines(id, view, series, markers, ImVec2(w, plot_h));
    for (const plot::PlotSeries& p : series)
      ctx.frame.series.push_back(
          {p.name, p.n, view.plot_min.x, view.plot_min.y, view.plot_max.x, view.plot_max.y});
  };
  const float half = (avail - ImGui::GetStyle().ItemSpacing.x) / 2;
  line("##loss", loss_view, {{"loss", c.step.data(), c.loss.data(), c.size(), kBlue}}, half);
  ImGui::SameLine();
  line("##grad", grad_view, {{"grad norm", c.step.data(), c.grad_norm.data(), c.size(), kOrange}}, half);
  line("##tokens", tokens_view, {{"tokens/s", c.step.data(), c.tokens_per_s.data(), c.size(), kGreen}}, half);
  ImGui::SameLine();
  // Percent on the axis; an unknown MFU (no peak) is NaN, a gap, and the title says "MFU n/a".
  const MfuCaption mfu = mfu_caption(c, s.run);
  line("##mfu", mfu_view, {{"MFU", c.step.data(), c.mfu_percent.data(), c.size(), kViolet}}, half);
  {
    // The latest figure (or "MFU n/a") at the plot's top right, where a flat line cannot hide it.
    const float w = ImGui::CalcTextSize(mfu.title.c_str()).x;
    ImGui::GetWindowDrawList()->AddText(
        ImVec2(mfu_view.plot_max.x - w - 4, mfu_view.plot_min.y + 2),
        mfu.latest_percent ? kViolet : ImGui::GetColorU32(ImGuiCol_TextDisabled), mfu.title.c_str());
  }
  if (mfu_view.hovered) {
    // After the widget's own readout (plot_widget.h): add lines to its tooltip rather than replace it.
    ImGui::BeginTooltip();
    ImGui::TextUnformatted(mfu.tooltip.c_str());
    ImGui::EndTooltip();
  }

  // The selector: busy time by default, since in synchronous data parallelism every rank's total is the
  // same (the fast ranks wait for the slow one in their collectives); the grid is the DataSource's, kept in
  // the chosen metric, so another one is fetched again.
  ImGui::SetNextItemWidth(180);
  if (ImGui::BeginCombo("rank time", std::string(rank_time_metric_label(metric_)).c_str())) {
    for (int k = 0; k < kRankTimeMetricCount; ++k) {
      const auto m = static_cast<RankTimeMetric>(k);
      if (ImGui::Selectable(std::string(rank_time_metric_label(m)).c_str(), m == metric_)) {
        metric_ = m;
        ctx.source.set_rank_metric(m);
      }
    }
    ImGui::EndCombo();
  }
  ImGui::SameLine();
  ImGui::Checkbox("excess over the step's median", &excess_);
  if (s.grid->metric() != metric_) {
    ImGui::SameLine();
    ImGui::TextDisabled("(fetching)");
  }
  const std::string shown =
      std::string(rank_time_metric_label(s.grid->metric())) + (excess_ ? " excess" : " time");
  band_view.y_label = shown + " (s)";
  heat_view.value_label = shown;

  // The chosen time across ranks: the band (min, median, max) and the heatmap.
  // The band comes computed with the snapshot (rank_band.h): drawing it is decimation only.
  const RankBand& band = *s.band;
  const size_t nb = band.size();
  line("##band", band_view,
       {{"max", band.step.data(), excess_ ? band.excess_max.data() : band.max.data(), nb, kRed},
        {"median", band.step.data(), excess_ ? band.zero.data() : band.median.data(), nb, kBlue},
        {"min", band.step.data(), excess_ ? band.excess_min.data() : band.min.data(), nb, kGreen}},
       half);
  ImGui::SameLine();
  if (heat_) {
    plot::heatmap_widget("##heat", heat_view, *heat_, ImVec2(half, plot_h));
    // One name whatever the selector shows, for --dump-state's readers (scripts, tests).
    ctx.frame.series.push_back(
        {"rank time heatmap", static_cast<size_t>(heat_->step_end() - heat_->first_step()),
         heat_view.map_min.x, heat_view.map_min.y, heat_view.map_max.x, heat_view.map_max.y});
  } else {
    ImGui::Dummy(ImVec2(half, plot_h));
  }

  // The timing breakdown per rank, from each rank's latest step record, the most excess time (of the chosen
  // metric, over the median rank's) first.
  const std::vector<BreakdownRow> order = breakdown_rows(s.grid->latest(), s.run.world, s.grid->metric());
  if (!order.empty() &&
      ImGui::BeginTable("##breakdown", 11,
                        ImGuiTableFlags_RowBg | ImGuiTableFlags_Borders | ImGuiTableFlags_ScrollY,
                        ImVec2(0, std::max(60.0f, ImGui::GetContentRegionAvail().y)))) {
    const std::string excess_head = std::string(rank_time_metric_label(s.grid->metric())) + " excess ms";
    for (const char* h : {"rank", "step", excess_head.c_str(), "busy ms", "total ms", "data", "forward",
                          "backward", "optimizer", "comm", "ckpt"})
      ImGui::TableSetupColumn(h);
    ImGui::TableSetupScrollFreeze(0, 1);
    ImGui::TableHeadersRow();
    // Only the rows in view are laid out: at 1,024 ranks the rest would cost more than the plots.
    ImGuiListClipper clipper;
    clipper.Begin(static_cast<int>(order.size()));
    while (clipper.Step()) {
      for (int i = clipper.DisplayStart; i < clipper.DisplayEnd; ++i) {
        const RankStepRecord* r = order[static_cast<size_t>(i)].record;
        ImGui::TableNextRow();
        ImGui::TableNextColumn();
        ImGui::Text("%d", r->rank);
        ImGui::TableNextColumn();
        ImGui::Text("%lld", static_cast<long long>(r->step));
        ImGui::TableNextColumn();
        ImGui::Text("%+.1f", order[static_cast<size_t>(i)].excess * 1e3);
        for (double v :
             {rank_time_value(*r, RankTimeMetric::kBusy), r->total_s, r->phases.data_wait, r->phases.forward,
              r->phases.backward, r->phases.optimizer, r->phases.comm_exposed, r->phases.checkpoint_stall}) {
          ImGui::TableNextColumn();
          ImGui::Text("%.1f", v * 1e3);
        }
      }
    }
    ImGui::EndTable();
  }
}

}  // namespace gantry::console
