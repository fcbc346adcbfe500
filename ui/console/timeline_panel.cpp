#include "ui/console/timeline_panel.h"

#include <imgui.h>

#include <algorithm>
#include <cmath>
#include <filesystem>

#include "ui/plot/plot_export.h"

namespace gantry::console {
namespace {

// One colour per span kind (Phase's order, then the remainder).
constexpr ImU32 kKindColour[kTimelineKinds] = {
    IM_COL32(130, 150, 170, 255),  // data wait
    IM_COL32(80, 150, 250, 255),   // forward
    IM_COL32(90, 200, 120, 255),   // backward
    IM_COL32(180, 120, 230, 255),  // optimizer
    IM_COL32(250, 160, 60, 255),   // exposed communication
    IM_COL32(230, 80, 80, 255),    // checkpoint stall
    IM_COL32(90, 90, 90, 255),     // unattributed
};
constexpr ImU32 kSlowLane = IM_COL32(140, 40, 40, 110);
constexpr ImU32 kSlowText = IM_COL32(255, 110, 100, 255);

std::string cell_numbers(const TimelineCell& c) {
  char buf[64];
  std::string out;
  for (uint8_t k = 0; k < kTimelineKinds; ++k) {
    std::snprintf(buf, sizeof buf, "%s%s %.4f s", k == 0 ? "" : ", ",
                  std::string(timeline_kind_name(k)).c_str(), double{c.seconds[k]});
    out += buf;
  }
  std::snprintf(buf, sizeof buf, "; step %.4f s", double{c.total});
  return out + buf;
}

}  // namespace

void TimelinePanel::summarise(const ConsoleSnapshot& s) {
  if (s.timeline != window_) {
    window_ = s.timeline;
    summaries_ = timeline_rank_summaries(*window_);
  }
  // The coordinator's flag first (its policy over its windows); else the largest median busy time a step.
  slow_rank_ = -1;
  slow_reason_.clear();
  for (const RankView& r : s.ranks)
    if (r.flagged.value_or(false) && r.rank < window_->ranks) {
      slow_rank_ = r.rank;
      slow_reason_ = "flagged by the coordinator";
      return;
    }
  const TimelineRankSummary* slowest = nullptr;
  for (const TimelineRankSummary& r : summaries_)
    if (r.steps > 0 && (slowest == nullptr || timeline_rank_slower(r, *slowest))) slowest = &r;
  if (slowest != nullptr) {
    slow_rank_ = slowest->rank;
    slow_reason_ = "largest median busy time a step in the window";
  }
}

void TimelinePanel::draw(const ConsoleSnapshot& s, PanelContext& ctx) {
  ctx.frame.panels.push_back("Timeline");
  if (s.run.id < 0) {
    ImGui::TextDisabled("no run followed");
    return;
  }
  steps_ = std::clamp(steps_, 1, 4096);
  first_step_ = std::max(first_step_, 1);
  ctx.source.want_timeline({.run = s.run.id, .first_step = follow_ ? 0 : first_step_, .steps = steps_});
  summarise(s);
  const TimelineWindow& w = *window_;

  // The steps asked for, and the export.
  if (ImGui::Checkbox("newest", &follow_) && !follow_ && !w.empty())
    first_step_ = static_cast<int>(w.first_step);
  ImGui::SameLine();
  ImGui::SetNextItemWidth(ImGui::GetFontSize() * 6);
  ImGui::DragInt("steps", &steps_, 1.0f, 1, 4096);
  if (!follow_) {
    ImGui::SameLine();
    ImGui::SetNextItemWidth(ImGui::GetFontSize() * 7);
    ImGui::InputInt("from step", &first_step_);
  }
  ImGui::SameLine();
  if (ctx.clicks.button("Export trace", !w.empty() && w.run == s.run.id)) {
    const std::string& cache = ctx.source.cache_path();
    const std::filesystem::path dir =
        cache.empty() ? std::filesystem::path(".") : std::filesystem::path(cache).parent_path();
    const std::string path =
        (dir / ("timeline-run" + std::to_string(w.run) + "-steps" + std::to_string(w.first_step) + "-" +
                std::to_string(w.first_step + w.steps - 1) + ".json"))
            .string();
    const Status st = timeline_trace_write(w, path);
    export_result_ = st.ok() ? "wrote " + path : st.message();
  }
  if (ImGui::IsItemHovered())
    ImGui::SetTooltip("the steps shown, as Chrome/Perfetto trace JSON (ui.perfetto.dev)");
  if (!export_result_.empty()) {
    ImGui::SameLine();
    ImGui::TextDisabled("%s", export_result_.c_str());
  }
  if (w.empty() || w.run != s.run.id) {
    ImGui::TextDisabled("reading the ranks' step records...");
    return;
  }
  ImGui::Text("steps %lld-%lld (%lld whole) of run %lld, %d ranks", static_cast<long long>(w.first_step),
              static_cast<long long>(w.first_step + w.steps - 1), static_cast<long long>(w.complete_steps()),
              static_cast<long long>(w.run), w.ranks);
  if (slow_rank_ >= 0) {
    ImGui::SameLine();
    ImGui::TextColored(ImColor(kSlowText), "slow: rank %d (%s)", slow_rank_, slow_reason_.c_str());
  }
  // The legend.
  for (uint8_t k = 0; k < kTimelineKinds; ++k) {
    if (k > 0) ImGui::SameLine();
    const ImVec2 p = ImGui::GetCursorScreenPos();
    const float h = ImGui::GetTextLineHeight();
    ImGui::GetWindowDrawList()->AddRectFilled(p, ImVec2(p.x + h, p.y + h), kKindColour[k]);
    ImGui::Dummy(ImVec2(h, h));
    ImGui::SameLine(0, 3);
    ImGui::TextUnformatted(std::string(timeline_kind_name(k)).c_str());
  }

  // The canvas: lane labels, the time axis (step boundaries), the lanes.
  const float lane_h = std::max(10.0f, std::round(ImGui::GetFontSize() * 0.9f));
  const float axis_h = ImGui::GetTextLineHeight() + 4;
  const float label_w = ImGui::CalcTextSize("rank 00000 slow").x + 6;
  ImVec2 avail = ImGui::GetContentRegionAvail();
  avail.y -= ImGui::GetTextLineHeightWithSpacing() + 2;  // the pinned span's line
  const int fit_lanes = std::max(1, static_cast<int>((avail.y - axis_h) / lane_h));
  const bool scroll = fit_lanes < w.ranks;
  const float slider_w = scroll ? ImGui::GetFontSize() : 0;
  const ImVec2 p0 = ImGui::GetCursorScreenPos();
  const ImVec2 size(std::max(50.0f, avail.x - slider_w - (scroll ? 4 : 0)),
                    std::max(axis_h + lane_h, avail.y));
  ImGui::InvisibleButton("##timeline", size);
  const bool hovered = ImGui::IsItemHovered();
  const ImVec2 p1(p0.x + size.x, p0.y + size.y);
  // Export CSV / PNG on a right click and `export_plot timeline PATH`, as every plot (plot_export.h); the
  // CSV is the window's data, every rank and step.
  if (plot::PlotExports* exports = plot::plot_exports_current(); exports != nullptr) {
    exports->context_menu("##timeline");
    exports->on_plot("##timeline", p0, p1, [&] { return timeline_csv(w); });
  }
  const float px0 = p0.x + label_w, px1 = p1.x, lanes_top = p0.y + axis_h;
  width_px_ = std::max(1, static_cast<int>(px1 - px0));
  const double length = std::max(w.length_s(), 1e-9);
  if (fit_) {
    t0_ = 0;
    t1_ = length;
  }
  // Input: the wheel zooms around the mouse (Shift: scrolls the lanes), a drag pans, a double-click fits.
  ImGuiIO& io = ImGui::GetIO();
  const double span = t1_ - t0_;
  if (hovered && io.MouseWheel != 0) {
    if (io.KeyShift) {
      lane_scroll_ -= static_cast<int>(io.MouseWheel * 3);
    } else {
      double shortest = length;
      for (size_t i = 0; i + 1 < w.step_begin.size(); ++i)
        if (w.step_begin[i + 1] > w.step_begin[i])
          shortest = std::min(shortest, w.step_begin[i + 1] - w.step_begin[i]);
      const double frac = std::clamp(static_cast<double>(io.MousePos.x - px0) / width_px_, 0.0, 1.0);
      const double at = t0_ + frac * span;
      const double next = std::clamp(span * std::pow(0.8, io.MouseWheel), shortest / 50, length);
      t0_ = at - frac * next;
      t1_ = t0_ + next;
      fit_ = false;
    }
  }
  if (ImGui::IsItemActive() && ImGui::IsMouseDragging(ImGuiMouseButton_Left, 2.0f)) {
    dragging_ = true;
    const double dt = -io.MouseDelta.x / width_px_ * span;
    t0_ += dt;
    t1_ += dt;
    fit_ = false;
  }
  if (hovered && ImGui::IsMouseDoubleClicked(ImGuiMouseButton_Left)) fit_ = true;
  if (!fit_) {  // the view stays over the window
    const double v = std::min(t1_ - t0_, length);
    t0_ = std::clamp(t0_, 0.0, length - v);
    t1_ = t0_ + v;
  }
  lane_scroll_ = std::clamp(lane_scroll_, 0, std::max(0, w.ranks - fit_lanes));
  if (scroll) {
    ImGui::SameLine(0, 4);
    int top = w.ranks - fit_lanes - lane_scroll_;  // the slider's top is lane 0
    if (ImGui::VSliderInt("##lanes", ImVec2(slider_w, size.y), &top, 0, w.ranks - fit_lanes, ""))
      lane_scroll_ = w.ranks - fit_lanes - top;
  }

  // Built again only when the window or the view changed: an ended run's still view costs the drawing alone.
  const TimelineViewport view{
      .t0 = t0_, .t1 = t1_, .width_px = width_px_, .lane_first = lane_scroll_, .lane_count = fit_lanes};
  if (built_for_ != window_ || view.t0 != built_view_.t0 || view.t1 != built_view_.t1 ||
      view.width_px != built_view_.width_px || view.lane_first != built_view_.lane_first ||
      view.lane_count != built_view_.lane_count) {
    timeline_build(w, view, frame_);
    built_for_ = window_;
    built_view_ = view;
    lanes_textured_ = false;
    if (plot::texture_backend() != nullptr && !frame_.lanes.empty()) {
      // Paint order as the rectangles': a later item over an earlier one; a pixel is an item's when its
      // centre lies in [x0, max(x1, x0 + 1)).
      const size_t width = static_cast<size_t>(width_px_);
      lane_texels_.assign(width * frame_.lanes.size(), 0);  // transparent: the lane's background shows
      for (size_t li = 0; li < frame_.lanes.size(); ++li) {
        uint32_t* row = &lane_texels_[li * width];
        const TimelineLane& lane = frame_.lanes[li];
        for (size_t k = lane.first; k < lane.first + lane.count; ++k) {
          const TimelineItem& it = frame_.items[k];
          const double x1 = std::max(it.x1, it.x0 + 1);
          const double b = std::clamp(std::ceil(it.x0 - 0.5), 0.0, static_cast<double>(width));
          const double e = std::clamp(std::ceil(x1 - 0.5), 0.0, static_cast<double>(width));
          std::fill(row + static_cast<size_t>(b), row + static_cast<size_t>(e), kKindColour[it.kind]);
        }
      }
      lanes_textured_ = lanes_texture_.upload(lane_texels_, width_px_, static_cast<int>(frame_.lanes.size()));
    }
  }
  ctx.frame.series.push_back({.name = "timeline",
                              .length = frame_.items.size(),
                              .x0 = px0,
                              .y0 = lanes_top,
                              .x1 = px1,
                              .y1 = lanes_top + lane_h * static_cast<float>(frame_.lanes.size())});

  ImDrawList* dl = ImGui::GetWindowDrawList();
  dl->PushClipRect(p0, p1, true);
  dl->AddRectFilled(ImVec2(px0, lanes_top), p1, IM_COL32(25, 27, 32, 255));
  // Step boundaries, and a step number where there is room for one.
  const double ppx = width_px_ / (t1_ - t0_);
  const auto first_visible =
      std::upper_bound(w.step_begin.begin() + 1, w.step_begin.end(), t0_) - (w.step_begin.begin() + 1);
  const float label_room = ImGui::CalcTextSize("000000").x + 8;
  float last_label = -1e9f;
  for (int64_t i = first_visible; i < w.steps && w.step_begin[static_cast<size_t>(i)] < t1_; ++i) {
    const float x = px0 + static_cast<float>((w.step_begin[static_cast<size_t>(i)] - t0_) * ppx);
    const float next = px0 + static_cast<float>((w.step_begin[static_cast<size_t>(i) + 1] - t0_) * ppx);
    if (next - x >= 4) dl->AddLine(ImVec2(x, lanes_top), ImVec2(x, p1.y), IM_COL32(70, 70, 80, 255));
    if (x >= px0 && x - last_label >= label_room) {
      dl->AddText(ImVec2(x + 2, p0.y + 1), IM_COL32(190, 190, 190, 255),
                  std::to_string(w.first_step + i).c_str());
      last_label = x;
    }
  }
  for (size_t li = 0; li < frame_.lanes.size(); ++li) {
    const TimelineLane& lane = frame_.lanes[li];
    const float y = lanes_top + lane_h * static_cast<float>(li);
    const bool slow = lane.rank == slow_rank_;
    if (slow) dl->AddRectFilled(ImVec2(p0.x, y), ImVec2(px1, y + lane_h), kSlowLane);
    const std::string label = "rank " + std::to_string(lane.rank) + (slow ? " slow" : "");
    dl->AddText(ImVec2(p0.x + 2, y + (lane_h - ImGui::GetFontSize()) / 2),
                slow ? kSlowText : IM_COL32(200, 200, 200, 255), label.c_str());
    if (lanes_textured_) {
      const float n = static_cast<float>(frame_.lanes.size());
      dl->AddImage(lanes_texture_.id(), ImVec2(px0, y + 1),
                   ImVec2(px0 + static_cast<float>(width_px_), y + lane_h - 1),
                   ImVec2(0, static_cast<float>(li) / n), ImVec2(1, static_cast<float>(li + 1) / n));
      continue;
    }
    // Touching items of one colour are one rectangle (zoomed out, runs of folded columns keep one phase):
    // the same pixels, a fraction of the vertices.
    float run_x0 = 0, run_x1 = -1;
    int run_kind = -1;
    const auto emit = [&] {
      if (run_kind >= 0)
        dl->AddRectFilled(ImVec2(px0 + run_x0, y + 1), ImVec2(px0 + run_x1, y + lane_h - 1),
                          kKindColour[run_kind]);
    };
    for (size_t k = lane.first; k < lane.first + lane.count; ++k) {
      const TimelineItem& it = frame_.items[k];
      const float x1 = std::max(it.x1, it.x0 + 1);
      if (it.kind == run_kind && it.x0 >= run_x0 && it.x0 <= run_x1) {
        run_x1 = std::max(run_x1, x1);
        continue;
      }
      emit();
      run_x0 = it.x0;
      run_x1 = x1;
      run_kind = it.kind;
    }
    emit();
  }
  dl->PopClipRect();

  // Hover: the span under the mouse (a whole span before a folded column); a click pins it.
  if (hovered && io.MousePos.x >= px0 && io.MousePos.y >= lanes_top) {
    const size_t li = static_cast<size_t>((io.MousePos.y - lanes_top) / lane_h);
    const float x = io.MousePos.x - px0;
    const TimelineItem* found = nullptr;
    if (li < frame_.lanes.size()) {
      const TimelineLane& lane = frame_.lanes[li];
      for (size_t k = lane.first; k < lane.first + lane.count; ++k) {
        const TimelineItem& it = frame_.items[k];
        if (x >= it.x0 && x < std::max(it.x1, it.x0 + 1) && (found == nullptr || found->folded)) found = &it;
      }
    }
    if (found != nullptr) {
      const int rank = frame_.lanes[li].rank;
      const TimelineCell& c = w.at(rank, found->step);
      ImGui::BeginTooltip();
      ImGui::Text("rank %d, step %lld", rank, static_cast<long long>(found->step));
      ImGui::Text("%s: %.4f s of the rank's %.4f s step",
                  std::string(timeline_kind_name(found->kind)).c_str(), double{found->seconds},
                  double{c.total});
      if (found->folded)
        ImGui::TextDisabled("the longest of %u spans narrower than a pixel here", found->count);
      ImGui::TextDisabled("click to pin; wheel: zoom, drag: pan, double-click: fit, Shift + wheel: lanes");
      ImGui::EndTooltip();
      if (ImGui::IsMouseReleased(ImGuiMouseButton_Left) && !dragging_) {
        have_pinned_ = true;
        pinned_rank_ = rank;
        pinned_ = *found;
      }
    }
  }
  if (!ImGui::IsMouseDown(ImGuiMouseButton_Left)) dragging_ = false;
  if (have_pinned_ && pinned_rank_ < w.ranks && pinned_.step >= w.first_step &&
      pinned_.step < w.first_step + w.steps) {
    ImGui::Text("rank %d step %lld (%s %.4f s): %s", pinned_rank_, static_cast<long long>(pinned_.step),
                std::string(timeline_kind_name(pinned_.kind)).c_str(), double{pinned_.seconds},
                cell_numbers(w.at(pinned_rank_, pinned_.step)).c_str());
  } else {
    ImGui::TextDisabled("click a span for its numbers");
  }
}

nlohmann::json TimelinePanel::state_json() const {
  using json = nlohmann::json;
  const TimelineWindow& w = *window_;
  json lanes = json::array();
  for (const TimelineRankSummary& r : summaries_)
    lanes.push_back({{"rank", r.rank},
                     {"steps", r.steps},
                     {"busy_s", r.busy_s},
                     {"busy_median_s", r.busy_median_s},
                     {"forward_max_s", r.forward_max_s},
                     {"forward_mean_s", r.forward_mean_s}});
  return {{"run", w.run},
          {"first_step", w.first_step},
          {"steps", w.steps},
          {"complete_steps", w.complete_steps()},
          {"ranks", w.ranks},
          {"slow_rank", slow_rank_},
          {"slow_reason", slow_reason_},
          {"lanes", lanes},
          {"view", {{"t0", t0_}, {"t1", t1_}, {"width_px", width_px_}, {"fit", fit_}}},
          {"lanes_drawn", frame_.lanes.size()},
          {"items", frame_.items.size()},
          {"spans_visible", frame_.spans_visible},
          {"spans_folded", frame_.spans_folded},
          {"export", export_result_}};
}

}  // namespace gantry::console
