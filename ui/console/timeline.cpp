#include "ui/console/timeline.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>

namespace gantry::console {

std::string_view timeline_kind_name(uint8_t kind) {
  if (kind < kPhaseCount) return phase_name(static_cast<Phase>(kind));
  return "unattributed";
}

float TimelineCell::length() const {
  float s = 0;
  for (float x : seconds) s += x;
  return s;
}

void timeline_layout(TimelineWindow& w) {
  w.whole_steps = 0;
  while (w.ranks > 0 && w.whole_steps < w.steps) {
    bool whole = true;
    for (int r = 0; r < w.ranks && whole; ++r) whole = w.at(r, w.first_step + w.whole_steps).present;
    if (!whole) break;
    ++w.whole_steps;
  }
  w.step_begin.assign(static_cast<size_t>(std::max<int64_t>(w.steps, 0)) + 1, 0.0);
  for (int64_t i = 0; i < w.steps; ++i) {
    double longest = 0;
    for (int r = 0; r < w.ranks; ++r) longest = std::max(longest, double{w.at(r, w.first_step + i).length()});
    w.step_begin[static_cast<size_t>(i) + 1] = w.step_begin[static_cast<size_t>(i)] + longest;
  }
}

bool timeline_put(TimelineWindow& w, const RankStepRecord& r) {
  if (r.step < w.first_step || r.step >= w.first_step + w.steps || r.rank < 0 || r.rank >= w.ranks)
    return false;
  TimelineCell& c = w.cells[static_cast<size_t>(r.rank) * static_cast<size_t>(w.steps) +
                            static_cast<size_t>(r.step - w.first_step)];
  double sum = 0;
  for (int k = 0; k < kPhaseCount; ++k) {
    const double s = std::max(0.0, r.phases.get(static_cast<Phase>(k)));
    c.seconds[k] = static_cast<float>(s);
    sum += s;
  }
  // Below a nanosecond the remainder is the phase sum's rounding, not time.
  const double rest = r.total_s - sum;
  c.seconds[kTimelineUnattributed] = rest > kTimelineMinRemainderS ? static_cast<float>(rest) : 0.0f;
  c.total = static_cast<float>(r.total_s);
  c.present = true;
  return true;
}

TimelineWindow timeline_window(int64_t run, int64_t first_step, int64_t steps, int ranks,
                               std::span<const RankStepRecord> records) {
  TimelineWindow w;
  w.run = run;
  w.first_step = first_step;
  w.steps = std::max<int64_t>(steps, 0);
  w.ranks = std::max(ranks, 0);
  w.cells.assign(static_cast<size_t>(w.steps) * static_cast<size_t>(w.ranks), TimelineCell{});
  for (const RankStepRecord& r : records) timeline_put(w, r);
  timeline_layout(w);
  return w;
}

void timeline_build(const TimelineWindow& w, const TimelineViewport& view, TimelineFrame& out) {
  out.lanes.clear();
  out.items.clear();
  out.spans_visible = out.spans_folded = 0;
  if (w.empty() || view.width_px <= 0 || !(view.t1 > view.t0)) return;
  const int lane_lo = std::clamp(view.lane_first, 0, w.ranks);
  const int lane_hi =
      static_cast<int>(std::min<int64_t>(w.ranks, int64_t{lane_lo} + std::max(view.lane_count, 0)));
  const double px_per_s = view.width_px / (view.t1 - view.t0);
  const float width = static_cast<float>(view.width_px);
  // The first step that ends after t0 and the first that begins at or after t1: the steps in view, the same
  // on every lane (they are aligned at step boundaries).
  const auto sb = w.step_begin.begin();
  const int64_t s_lo =
      std::max<int64_t>(0, (std::upper_bound(sb + 1, w.step_begin.end(), view.t0) - (sb + 1)));
  const int64_t s_hi = std::min<int64_t>(w.steps, std::lower_bound(sb, w.step_begin.end() - 1, view.t1) - sb);
  for (int rank = lane_lo; rank < lane_hi; ++rank) {
    TimelineLane lane{.rank = rank, .first = out.items.size()};
    // The column being folded: sub-pixel spans falling into it update it until one falls elsewhere.
    bool have_fold = false;
    TimelineItem fold;
    const auto flush = [&] {
      if (have_fold) out.items.push_back(fold);
      have_fold = false;
    };
    for (int64_t i = s_lo; i < s_hi; ++i) {
      const TimelineCell& c = w.at(rank, w.first_step + i);
      if (!c.present) continue;
      double t = w.step_begin[static_cast<size_t>(i)];
      for (uint8_t k = 0; k < kTimelineKinds; ++k) {
        const double len = c.seconds[k];
        const double a = t, b = t + len;
        t = b;
        if (len <= 0 || b <= view.t0 || a >= view.t1) continue;  // nothing, or outside the view
        ++out.spans_visible;
        const double xa = (a - view.t0) * px_per_s, xb = (b - view.t0) * px_per_s;
        if (xb - xa >= 1.0) {
          out.items.push_back({.x0 = static_cast<float>(std::max(0.0, xa)),
                               .x1 = static_cast<float>(std::min<double>(width, xb)),
                               .kind = k,
                               .step = w.first_step + i,
                               .seconds = static_cast<float>(len)});
          continue;
        }
        ++out.spans_folded;
        const float col = std::clamp(std::floor(static_cast<float>(xa)), 0.0f, width - 1);
        if (have_fold && fold.x0 == col) {
          ++fold.count;
          if (len > fold.seconds) {  // the longest is kept: its phase, its step, its seconds
            fold.kind = k;
            fold.step = w.first_step + i;
            fold.seconds = static_cast<float>(len);
          }
          continue;
        }
        flush();
        fold = {.x0 = col,
                .x1 = col + 1,
                .kind = k,
                .folded = true,
                .count = 1,
                .step = w.first_step + i,
                .seconds = static_cast<float>(len)};
        have_fold = true;
      }
    }
    flush();
    lane.count = out.items.size() - lane.first;
    out.lanes.push_back(lane);
  }
}

TimelineViewport timeline_view_of_steps(const TimelineWindow& w, int64_t first, int64_t end, int width_px) {
  TimelineViewport v{.width_px = width_px};
  if (w.empty()) return v;
  const auto index = [&](int64_t step) {
    return static_cast<size_t>(std::clamp<int64_t>(step - w.first_step, 0, w.steps));
  };
  v.t0 = w.step_begin[index(first)];
  v.t1 = w.step_begin[index(end)];
  if (!(v.t1 > v.t0)) v.t1 = v.t0 + 1e-6;  // an empty range still has a width
  return v;
}

std::vector<TimelineRankSummary> timeline_rank_summaries(const TimelineWindow& w) {
  std::vector<TimelineRankSummary> out(static_cast<size_t>(w.ranks));
  for (int r = 0; r < w.ranks; ++r) {
    TimelineRankSummary& s = out[static_cast<size_t>(r)];
    s.rank = r;
    double forward_sum = 0;
    std::vector<double> busy;
    for (int64_t i = 0; i < w.steps; ++i) {
      const TimelineCell& c = w.at(r, w.first_step + i);
      if (!c.present) continue;
      ++s.steps;
      busy.push_back(double{c.seconds[0]} + c.seconds[1] + c.seconds[2] + c.seconds[3]);
      s.busy_s += busy.back();
      forward_sum += c.seconds[static_cast<int>(Phase::forward)];
      s.forward_max_s = std::max(s.forward_max_s, double{c.seconds[static_cast<int>(Phase::forward)]});
    }
    s.forward_mean_s = s.steps > 0 ? forward_sum / static_cast<double>(s.steps) : 0;
    if (!busy.empty()) {
      std::sort(busy.begin(), busy.end());
      const size_t m = busy.size() / 2;
      s.busy_median_s = busy.size() % 2 == 1 ? busy[m] : (busy[m - 1] + busy[m]) / 2;
    }
  }
  return out;
}

bool timeline_rank_slower(const TimelineRankSummary& a, const TimelineRankSummary& b) {
  if (a.busy_median_s != b.busy_median_s) return a.busy_median_s > b.busy_median_s;
  return a.busy_s > b.busy_s;
}

int timeline_slowest_rank(const TimelineWindow& w) {
  const TimelineRankSummary* best = nullptr;
  const std::vector<TimelineRankSummary> all = timeline_rank_summaries(w);
  for (const TimelineRankSummary& s : all)
    if (s.steps > 0 && (best == nullptr || timeline_rank_slower(s, *best))) best = &s;
  return best == nullptr ? -1 : best->rank;
}

nlohmann::json timeline_trace_json(const TimelineWindow& w) {
  using json = nlohmann::json;
  json events = json::array();
  events.push_back({{"name", "process_name"},
                    {"ph", "M"},
                    {"pid", w.run},
                    {"args", {{"name", "run " + std::to_string(w.run)}}}});
  for (int r = 0; r < w.ranks; ++r) {
    events.push_back({{"name", "thread_name"},
                      {"ph", "M"},
                      {"pid", w.run},
                      {"tid", r},
                      {"args", {{"name", "rank " + std::to_string(r)}}}});
    events.push_back({{"name", "thread_sort_index"},
                      {"ph", "M"},
                      {"pid", w.run},
                      {"tid", r},
                      {"args", {{"sort_index", r}}}});
  }
  for (int r = 0; r < w.ranks; ++r) {
    for (int64_t i = 0; i < w.steps; ++i) {
      const TimelineCell& c = w.at(r, w.first_step + i);
      if (!c.present) continue;
      double t = w.step_begin[static_cast<size_t>(i)];
      for (uint8_t k = 0; k < kTimelineKinds; ++k) {
        const double len = c.seconds[k];
        if (len > 0) {
          events.push_back({{"name", std::string(timeline_kind_name(k))},
                            {"cat", k == kTimelineUnattributed ? "unattributed" : "phase"},
                            {"ph", "X"},
                            {"ts", t * 1e6},
                            {"dur", len * 1e6},
                            {"pid", w.run},
                            {"tid", r},
                            {"args", {{"step", w.first_step + i}, {"seconds", len}}}});
        }
        t += len;
      }
    }
  }
  return {
      {"traceEvents", std::move(events)},
      {"displayTimeUnit", "ms"},
      {"otherData",
       {{"source", "gantry console timeline"},
        {"run", w.run},
        {"first_step", w.first_step},
        {"steps", w.steps},
        {"ranks", w.ranks},
        {"time_axis", "steps aligned at their boundaries: each step begins where its slowest rank ended"}}}};
}

std::string timeline_csv(const TimelineWindow& w) {
  std::string out = "rank,step";
  for (uint8_t k = 0; k < kTimelineKinds; ++k) out += "," + std::string(timeline_kind_name(k)) + " (s)";
  out += ",total (s)\n";
  char num[32];
  const auto value = [&](double v) {
    std::snprintf(num, sizeof num, ",%.17g", v);
    out += num;
  };
  for (int r = 0; r < w.ranks; ++r) {
    for (int64_t i = 0; i < w.steps; ++i) {
      const TimelineCell& c = w.at(r, w.first_step + i);
      out += std::to_string(r) + "," + std::to_string(w.first_step + i);
      if (c.present) {
        for (uint8_t k = 0; k < kTimelineKinds; ++k) value(c.seconds[k]);
        value(c.total);
      } else {
        out += std::string(kTimelineKinds + 1, ',');
      }
      out += "\n";
    }
  }
  return out;
}

Status timeline_trace_write(const TimelineWindow& w, const std::string& path) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) return Status::error("cannot write the timeline trace to " + path + ": cannot open the file");
  out << timeline_trace_json(w).dump() << "\n";
  out.close();
  if (!out) return Status::error("cannot write the timeline trace to " + path + ": the write failed");
  return Status();
}

}  // namespace gantry::console
