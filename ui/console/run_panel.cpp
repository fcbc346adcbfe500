// The Run panel: the followed run's curves against step, the step-time band across ranks, the rank × step
// heatmap and the per-rank timing breakdown.
#include <imgui.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <span>

#include "ui/console/event_markers.h"
#include "ui/console/layout_times.h"  // (dp, pp, tp) per rank, per-stage and per-tp-group times
#include "ui/console/mfu_caption.h"
#include "ui/console/panels.h"

namespace gantry::console {
namespace {

constexpr uint32_t kBlue = IM_COL32(90, 170, 255, 255);
constexpr uint32_t kOrange = IM_COL32(255, 160, 60, 255);
constexpr uint32_t kGreen = IM_COL32(120, 220, 120, 255);
constexpr uint32_t kRed = IM_COL32(240, 90, 90, 255);
constexpr uint32_t kViolet = IM_COL32(190, 140, 255, 255);

}  // namespace

void TileHeatmap::set(std::shared_ptr<const HeatPages> pages, int ranks, int64_t first_step, int64_t step_end,
                      bool excess) {
  pages_ = std::move(pages);
  ranks_ = std::max(1, ranks);
  first_step_ = first_step;
  step_end_ = std::max(first_step + 1, step_end);
  excess_ = excess;
}

void TileHeatmap::grid(int64_t step_lo, int64_t step_hi, int max_cols, int max_rows,
                       plot::HeatmapGrid& out) const {
  asked_lo_ = step_lo;
  asked_hi_ = step_hi;
  asked_cols_ = max_cols;
  asked_rows_ = max_rows;
  out.cells.clear();
  out.cols = out.rows = 0;
  out.value_min = out.value_max = NAN;
  const HeatPages& p = *pages_;
  const HeatTile* any = nullptr;
  for (const auto& t : p.pages)
    if (t && t->rows > 0) any = t.get();
  if (any == nullptr || step_hi <= step_lo) return;
  // The pages' own columns, whatever the view asks now: until the pages of a new want arrive, the last
  // ones stand in (stretched or squeezed), rather than a blank map.
  const int64_t w = p.layout.bucket_steps;
  const int64_t page_steps = w * p.layout.page_cols;
  out.steps_per_col = w;
  out.step_origin = step_lo / w * w;
  const int64_t cols = (step_hi - out.step_origin + w - 1) / w;
  if (cols > 4 * static_cast<int64_t>(std::max(1, max_cols))) return;  // far finer than the view: wait
  out.cols = static_cast<int>(cols);
  out.rows = any->rows;
  out.ranks_per_row = any->ranks_per_row;
  out.cells.assign(static_cast<size_t>(out.rows) * static_cast<size_t>(out.cols), NAN);
  std::vector<float> column(static_cast<size_t>(out.rows));
  for (int c = 0; c < out.cols; ++c) {
    const int64_t step = out.step_origin + c * w;
    const int64_t page = step >= 0 ? step / page_steps : -1;
    if (page < p.layout.first_page || page > p.layout.last_page) continue;
    const HeatTile* t = p.pages[static_cast<size_t>(page - p.layout.first_page)].get();
    if (t == nullptr || t->rows != out.rows || t->bucket_steps != w) continue;
    const int64_t tc = (step - t->first_step) / w;
    if (step < t->first_step || tc >= t->cols) continue;
    for (int r = 0; r < out.rows; ++r) column[static_cast<size_t>(r)] = t->at(r, static_cast<int>(tc));
    if (excess_) excess_over_median(column);  // each cell over the median cell of its column
    for (int r = 0; r < out.rows; ++r) {
      const float v = column[static_cast<size_t>(r)];
      out.cells[static_cast<size_t>(r) * static_cast<size_t>(out.cols) + static_cast<size_t>(c)] = v;
      if (std::isnan(v)) continue;
      if (std::isnan(out.value_min) || v < out.value_min) out.value_min = v;
      if (std::isnan(out.value_max) || v > out.value_max) out.value_max = v;
    }
  }
}

void RunPanel::draw(const ConsoleSnapshot& s, PanelContext& ctx) {
  ctx.frame.panels.push_back("Run");
  if (s.run.id < 0) {
    ImGui::TextDisabled(s.connected ? "no run yet: submit one (toolbar, or gantry-engine ctl submit)"
                                    : "not connected");
    return;
  }
  const StepLog& log = *s.steps;
  ImGui::Text("run %lld \"%s\"  %s  step %lld  dp %d  tp %d  pp %d  zero %d  generation %d",
              static_cast<long long>(s.run.id), s.run.name.c_str(), s.run.state.c_str(),
              static_cast<long long>(log.last_step()), s.run.dp, s.run.tp, s.run.pp, s.run.zero,
              s.run.generation);
  if (!s.run.message.empty()) ImGui::TextWrapped("%s", s.run.message.c_str());
  if (log.gap_steps() > 0)
    ImGui::TextColored(ImVec4(1, 0.6f, 0.2f, 1), "%lld steps the coordinator does not have",
                       static_cast<long long>(log.gap_steps()));
  draw_goodput(s.goodput, ctx);

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
  // same (the fast ranks wait for the slow one in their collectives); the band and the heatmap are asked
  // of the coordinator in the chosen metric.
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
  ImGui::Checkbox("excess over the step's middle", &excess_);
  if (ImGui::IsItemHovered())
    ImGui::SetTooltip(
        "band: each bucket's min and max minus its mean across ranks\n"
        "heatmap: each cell minus the median cell of its column");
  const RankBand& band = *s.band;
  const HeatPages& pages = *s.heat;
  const bool band_current = band.run == s.run.id && band.metric == metric_;
  const bool heat_current = pages.want.run == s.run.id && pages.want.metric == metric_;
  if (!band_current || !heat_current) {
    ImGui::SameLine();
    ImGui::TextDisabled("(fetching)");
  }
  const std::string shown = std::string(rank_time_metric_label(metric_)) + (excess_ ? " excess" : " time");
  band_view.y_label = shown + " (s)";
  band_view.y_unit = "s";
  heat_view.value_label = shown;

  // The chosen time across ranks: the band (min, mean, max per bucket, from the coordinator's tiles) and
  // the heatmap (its pages of the tile query, at the map's own resolution).
  const size_t nb = band_current ? band.size() : 0;
  line("##band", band_view,
       {{"max", band.step.data(), excess_ ? band.excess_max.data() : band.max.data(), nb, kRed},
        {"mean", band.step.data(), excess_ ? band.zero.data() : band.mean.data(), nb, kBlue},
        {"min", band.step.data(), excess_ ? band.excess_min.data() : band.min.data(), nb, kGreen}},
       half);
  ImGui::SameLine();
  const int64_t first = log.size() > 0 ? log.records().front().step : 0;  // before the steps arrive: 0
  heat_.set(heat_current ? s.heat : std::make_shared<HeatPages>(), s.run.world, first,
            std::max(s.run.last_step, log.last_step()) + 1, excess_);
  plot::heatmap_widget("##heat", heat_view, heat_, ImVec2(half, plot_h));
  // Ask for what the map shows now; the DataSource ignores a want it already has.
  ctx.source.want_heatmap({.run = s.run.id,
                           .metric = metric_,
                           .step_lo = heat_.asked_lo(),
                           .step_hi = heat_.asked_hi(),
                           .cols = heat_.asked_cols(),
                           .rows = heat_.asked_rows()});
  if (heat_view.grid.cols > 0 && !std::isnan(heat_view.grid.value_min)) {
    // One name whatever the selector shows, for --dump-state's readers (scripts, tests).
    ctx.frame.series.push_back({"rank time heatmap", static_cast<size_t>(heat_view.grid.cols),
                                heat_view.map_min.x, heat_view.map_min.y, heat_view.map_max.x,
                                heat_view.map_max.y});
  }

  // A 3D run: each pipeline stage's and tp group's busy time (its slowest rank's), the slowest marked.
  const LayoutTimes lt = layout_times(s.ranks);
  for (const std::vector<LayoutGroupTime>* groups : {&lt.stages, &lt.tp_groups}) {
    if (groups->empty()) continue;
    ImGui::TextUnformatted(groups == &lt.stages ? "stages (busy ms):" : "tp groups (busy ms):");
    for (const LayoutGroupTime& g : *groups) {
      ImGui::SameLine();
      char text[96];
      if (g.busy_s)
        std::snprintf(text, sizeof text, "%s %.1f (rank %d)%s", g.name().c_str(), *g.busy_s * 1e3,
                      g.slowest_rank, g.slowest ? " slowest" : "");
      else
        std::snprintf(text, sizeof text, "%s unknown", g.name().c_str());
      if (g.slowest)
        ImGui::TextColored(ImVec4(1, 0.6f, 0.2f, 1), "%s", text);
      else
        ImGui::TextUnformatted(text);
    }
  }

  // The timing breakdown per rank, from each rank's latest step record, the most excess time (of the chosen
  // metric, over the median rank's) first.
  std::vector<RankStepRecord> latest;
  latest.reserve(s.ranks.size());
  for (const RankView& r : s.ranks)
    if (r.latest.step > 0) latest.push_back(r.latest);
  const std::vector<BreakdownRow> order = breakdown_rows(latest, s.run.world, metric_);
  if (!order.empty() &&
      ImGui::BeginTable("##breakdown", 12,
                        ImGuiTableFlags_RowBg | ImGuiTableFlags_Borders | ImGuiTableFlags_ScrollY,
                        ImVec2(0, std::max(60.0f, ImGui::GetContentRegionAvail().y)))) {
    const std::string excess_head = std::string(rank_time_metric_label(metric_)) + " excess ms";
    for (const char* h : {"rank", "dp,pp,tp", "step", excess_head.c_str(), "busy ms", "total ms", "data",
                          "forward", "backward", "optimizer", "comm", "ckpt"})
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
        const auto view = std::find_if(s.ranks.begin(), s.ranks.end(),
                                       [&](const RankView& x) { return x.rank == r->rank; });
        ImGui::TextUnformatted(view != s.ranks.end() && view->coord ? rank_coord_text(*view).c_str() : "-");
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
